"""Packed fine-tuning computes what padded fine-tuning computes: per-example outputs and gradients for every head kind
and pooling, attention confined to each example, token-budget micro-batches that accumulate the whole batch's
gradient, and a gradient-cached retrieval loss equal to sentence-transformers' `CachedMultipleNegativesRankingLoss`;
batches are collated one ahead of the step that takes them."""
import dataclasses

import pytest
import torch

from mlmclm.model.heads import POOLINGS, TaskModel
from mlmclm.model.transformer import HostSyncs, Transformer, build_model, layout_of, reference_varlen
from mlmclm.model.checkpoints import load, save
from mlmclm.model.heads import IGNORE
from mlmclm.finetuning.batches import (batch_backward, cached_infonce, collate_packed, collate_padded, head_loss,
                                       unpack_examples, unpack_tokens)

LENGTHS = (5, 9, 3, 7, 2, 8, 6, 4)
HEADS = [('sequence', p) for p in POOLINGS] + [('embedding', p) for p in POOLINGS] + [('token', 'mean'), ('span', 'mean')]


pytestmark = pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)


def _features(kind: str, lengths=LENGTHS, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    feats = []
    for n in lengths:
        f = dict(input_ids=torch.randint(3, 97, (n,), generator=g).tolist())
        if kind == 'sequence': f['label'] = int(torch.randint(0, 3, (), generator=g))
        if kind == 'token':   # some positions unlabelled, as sub-word pieces and special tokens are
            f['labels'] = [IGNORE if l < 0 else l for l in torch.randint(-1, 3, (n,), generator=g).tolist()]
        if kind == 'span':
            s = int(torch.randint(0, n, (), generator=g)); f.update(start=s, end=min(n - 1, s + 1))
        feats.append(f)
    return feats


def _task_model(kind: str, pooling: str, backend: str = 'sdpa', seed: int = 0) -> TaskModel:
    torch.manual_seed(seed)
    base = build_model('tiny', vocab_size=97, attn_backend=backend)
    return TaskModel(base, kind, 3, pooling=pooling)


def _twin(model: TaskModel, backend: str) -> TaskModel:
    "The same weights with another attention backend."
    twin = TaskModel(Transformer(dataclasses.replace(model.config, attn_backend=backend)), model.kind, 3,
                     pooling=model.pooling)
    twin.load_state_dict(model.state_dict())
    return twin


def _per_example(model: TaskModel, feats: list[dict], packed: bool) -> list[torch.Tensor]:
    "Each example's outputs, in example order: one vector (pooled heads) or its tokens' outputs (token, span)."
    if packed:
        b = collate_packed(feats, 0, budget=12, strategy='first-fit')   # several rows, examples reordered
        out = model(b['input_ids'], b['attention_mask'], b['document_ids'], layout=layout_of(b))   # the data path's layout
        if model.kind in ('sequence', 'embedding'): return list(unpack_examples(out, b['order']))
        if model.kind == 'span': out = torch.stack(out, -1)                                     # (n_tokens, 2)
        return unpack_tokens(out, b['cu_seqlens'], b['order'])
    b = collate_padded(feats, 0)
    out = model(b['input_ids'], b['attention_mask'])
    if model.kind in ('sequence', 'embedding'): return list(out)
    if model.kind == 'span': out = torch.stack(out, -1)                                         # (B, T, 2)
    return [o[:len(f['input_ids'])] for o, f in zip(out, feats)]


def _grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize('backend', ['flash', 'sdpa'])   # 'flash' runs the variable-length path (reference kernel on CPU)
@pytest.mark.parametrize('kind,pooling', HEADS)
def test_packed_forward_and_gradients_match_padded(kind, pooling, backend):
    padded_model = _task_model(kind, pooling)
    packed_model = _twin(padded_model, backend)
    feats = _features(kind)
    ours, ref = _per_example(packed_model, feats, True), _per_example(padded_model, feats, False)
    assert len(ours) == len(ref) == len(feats)
    assert max((a - b).abs().max().item() for a, b in zip(ours, ref)) <= 1e-5
    # gradients: the head's loss, or for embeddings a fixed random projection of every vector
    for model, packed in ((packed_model, True), (padded_model, False)):
        model.zero_grad()
        if kind == 'embedding':
            proj = torch.randn(len(feats), model.config.hidden_size, generator=torch.Generator().manual_seed(1))
            (torch.stack(_per_example(model, feats, packed)) * proj).sum().backward()
        else:
            batch = collate_packed(feats, 0, budget=12, strategy='first-fit') if packed else collate_padded(feats, 0)
            head_loss(kind, model, batch).backward()
    assert _rel(_grads(packed_model), _grads(padded_model)) <= 1e-5


@pytest.mark.parametrize('backend', ['flash', 'sdpa'])
@pytest.mark.parametrize('kind', ['token', 'embedding'])
def test_an_example_never_attends_across_a_boundary(kind, backend):
    "Change the middle example of a packed row: its neighbours' outputs stay exactly as they were."
    model = _task_model(kind, 'mean', backend).eval()
    feats = _features(kind, lengths=(6, 5, 7))
    changed = [dict(f) for f in feats]
    changed[1]['input_ids'] = [(t + 1) % 97 for t in feats[1]['input_ids']]
    outs = []
    with torch.no_grad():
        for fs in (feats, changed):
            b = collate_packed(fs, 0)                       # one row of 18 tokens
            assert b['input_ids'].shape == (1, 18)
            out = model(b['input_ids'], b['attention_mask'], b['document_ids'])
            outs.append(unpack_tokens(out, b['cu_seqlens'], b['order']) if kind == 'token' else list(out))
    for i in (0, 2): assert (outs[0][i] - outs[1][i]).abs().max().item() <= 1e-6
    assert (outs[0][1] - outs[1][1]).abs().max().item() > 1e-3       # the change itself is seen


@pytest.mark.parametrize('kind', ['sequence', 'token', 'span', 'embedding'])
def test_token_budget_micro_batches_accumulate_the_padded_batch_gradient(kind):
    "Micro-batches of at most 16 tokens, packed or padded, weighted: the gradient of one padded batch."
    model = _task_model(kind, 'mean')
    feats = _features(kind, seed=3)
    if kind == 'embedding': feats = [dict(q=q, d=d) for q, d in zip(feats, _features(kind, LENGTHS[::-1], seed=4))]
    model.zero_grad()
    if kind == 'embedding':   # the whole batch at once: its in-batch negatives are all 8 passages
        loss = cached_infonce(model, [f['q'] for f in feats], [f['d'] for f in feats], 0, packing=False)
    else:
        loss = head_loss(kind, model, collate_padded(feats, 0)); loss.backward()
    reference = _grads(model)
    for packing in (True, False):
        model.zero_grad()
        got = batch_backward(model, kind, feats, 0, max_tokens=16, packing=packing)
        assert abs(got.item() - loss.item()) <= 1e-5 * abs(loss.item())
        assert _rel(_grads(model), reference) <= 1e-5, packing


def test_cached_infonce_matches_sentence_transformers(tmp_path):
    "The authors' loss (CachedMultipleNegativesRankingLoss, scale 20, cosine, mini-batches of 2) on the same weights."
    from sentence_transformers import SentenceTransformer, models
    from sentence_transformers.losses import CachedMultipleNegativesRankingLoss
    from mlmclm.data.tokenizers import load_tokenizer
    tok = load_tokenizer('embedded')
    torch.manual_seed(0)
    save(build_model('tiny', vocab_size=len(tok)), tmp_path/'m', tokenizer=tok, is_causal=False)
    body = models.Transformer(str(tmp_path/'m'))
    body.tokenizer.padding_side = 'right'
    st = SentenceTransformer(modules=[body, models.Pooling(body.auto_model.config.hidden_size, 'mean')], device='cpu')
    queries = ['Query: what is packing', 'Query: why pad', 'Query: the loss', 'Query: a longer question with more words']
    passages = ['Document: rows of examples', 'Document: padding wastes compute on short examples',
                'Document: cross-entropy', 'Document: yes']
    features = [st.tokenize(t) for t in (queries, passages)]
    st.train()
    their_loss = CachedMultipleNegativesRankingLoss(st, scale=20.0, mini_batch_size=2)(features, None)
    their_loss.backward()
    theirs = dict(st[0].auto_model.named_parameters())
    ours = TaskModel(load(tmp_path/'m'), 'embedding')
    to_feats = lambda f: [dict(input_ids=ids[m.bool()].tolist()) for ids, m in zip(f['input_ids'], f['attention_mask'])]
    loss = cached_infonce(ours, *(to_feats(f) for f in features), pad_id=tok.pad_token_id, max_examples=2)
    assert abs(loss.item() - their_loss.item()) <= 1e-5
    for name, p in ours.model.named_parameters():
        assert _rel(p.grad, theirs[name].grad) <= 1e-4, name


# Issue 33 item 11: the training loop does not wait on the host.
def test_staged_batches_are_the_collated_batches_one_ahead():
    from mlmclm.finetuning.batches import staged
    feats = [dict(input_ids=list(range(3, 3 + n)), label=n % 2) for n in (5, 9, 3, 7, 4)]
    made = []
    def batches():
        for i in range(0, 5, 2):
            made.append(i); yield collate_packed(feats[i:i + 2], 0)
    got = []
    for b in staged(batches(), 'cpu'):
        got.append((len(made), b)) 
    assert [n for n, _ in got] == [2, 3, 3]   # when batch k is handed out, batch k + 1 is already collated
    for (_, b), i in zip(got, range(0, 5, 2)):
        want = collate_packed(feats[i:i + 2], 0)
        assert b.keys() == want.keys() and all(torch.equal(b[k], want[k]) if torch.is_tensor(want[k]) else b[k] == want[k]
                                               for k in want)
    assert list(staged(iter([]), 'cpu')) == []


# ------------------------------------- the GPU path, checked on a CPU (issue 25): packed fine-tuning without host syncs
def _packed(layers: int, lengths=(5, 9, 3, 7)):
    torch.manual_seed(0)
    model = TaskModel(build_model('tiny', vocab_size=97, attn_backend='flash', num_hidden_layers=layers), 'embedding')
    feats = [dict(input_ids=torch.randint(3, 97, (n,)).tolist()) for n in lengths]
    return model, collate_packed(feats, 0, budget=12, strategy='first-fit')   # rows of up to 12 tokens, padded


def test_packed_fine_tuning_makes_no_host_sync():
    "Before: a boolean gather and scatter in every layer (213 host syncs a forward + backward at 26 layers)."
    for layers in (2, 8):
        model, b = _packed(layers)
        assert b['indices'] is not None                       # the rows are padded: there is something to unpad
        with HostSyncs() as shipped:
            model(b['input_ids'], b['attention_mask'], b['document_ids'], layout=layout_of(b)).sum().backward()
        with HostSyncs() as on_device:
            model(b['input_ids'], b['attention_mask'], b['document_ids']).sum().backward()
        assert shipped.count == 0, dict(shipped.ops)
        assert on_device.count <= 2, dict(on_device.ops)      # the layout worked out once per pass, not per layer


def test_max_seqlen_is_the_longest_document_not_the_row():
    model, b = _packed(2, lengths=(3, 3, 2, 3, 3))          # rows of 11 and 3 tokens
    seen = []
    def kernel(q, k, v, cu, max_len, causal): seen.append(max_len); return reference_varlen(q, k, v, cu, max_len, causal)
    for block in model.model.layers: block.self_attn.varlen_impl = kernel
    model.to(torch.bfloat16)(b['input_ids'], b['attention_mask'], b['document_ids'], layout=layout_of(b))   # kernels' dtype
    assert b['input_ids'].shape[1] == 11 and seen == [3, 3] and all(isinstance(m, int) for m in seen)   # an int (symbolic when compiled)
