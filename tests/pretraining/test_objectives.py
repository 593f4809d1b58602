"""An objective is a row of `mlmclm.protocol.schedules.OBJECTIVES` (issue 36 item 1): outside `vocab`, no module compares anything
with an objective's name; it reads the row (causal, masked, next token, head share, label). The one thing allowed is
selecting runs by the results table's `kind` column (`df.kind == 'mlm'`): the paper's figures draw the paper's arms, and
a run's kind is data, not a branch of the trainer. And the grammar is the table's: a row added at run time is a phase,
a run name and a batch without another edit. The batches and the loss (`mlmclm.pretraining.objectives`): a batch
carries its documents' layout, MLM's masked positions come as indices, and the loss makes no host sync."""
import ast
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mlmclm import vocab
from mlmclm.model.heads import IGNORE
from mlmclm.pretraining.objectives import attention_span, clm_labels, lm_loss, make_batch
from mlmclm.protocol.schedules import OBJECTIVES, Objective, Phase, parse_schedule
from mlmclm.protocol.run_names import parse_run_name, run_name
from mlmclm.model.sizes import flops_per_token, model_config
from mlmclm.model.transformer import HostSyncs, build_model

ROOT = Path(__file__).resolve().parents[2]
TABLE_MODULE = ROOT/'mlmclm'/'protocol'/'schedules.py'   # the objective table's own module (was vocab before the wings)
# every module of every wing (a flat glob found only the package's top level once the library moved into wings)
MODULES = sorted(p for p in (ROOT/'mlmclm').rglob('*.py') if p.stem not in ('__init__', '_modidx') and p != TABLE_MODULE)


def _names_in(node) -> bool:
    "Whether `node` is an objective's name as a literal, or a tuple/list/set holding one."
    if isinstance(node, ast.Constant): return node.value in OBJECTIVES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)): return any(_names_in(e) for e in node.elts)
    return False


def _is_kind(node) -> bool:
    "A run's kind: `kind`, `df.kind`, `df.kind.isin`."
    while isinstance(node, ast.Attribute) and node.attr != 'kind': node = node.value
    return (isinstance(node, ast.Attribute) and node.attr == 'kind') or (isinstance(node, ast.Name) and node.id == 'kind')


def name_comparisons(source: str) -> list[tuple[int, str]]:
    "(line, code) of each comparison with an objective's name: `==`/`in`/`!=`, `x if o == .. else ..`, `.startswith`, `.isin`."
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            hit = any(map(_names_in, sides)) and not any(_is_kind(s) for s in sides if not _names_in(s))
        elif isinstance(node, ast.IfExp): hit = _names_in(node.body) or _names_in(node.orelse)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ('startswith', 'isin'):
            hit = any(map(_names_in, node.args)) and not _is_kind(node.func.value)
        else: hit = False
        if hit: found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_but_the_table_compares_an_objective_name():
    assert len(MODULES) > 40                                     # the wings' modules, not only the top level
    found = {p.stem: hits for p in MODULES if (hits := name_comparisons(p.read_text(encoding='utf-8')))}
    assert not found, f'compare with the objective table (mlmclm.protocol.schedules.OBJECTIVES), not with a name: {found}'


@pytest.mark.parametrize('code', [
    "if phase.objective == 'mlm': pass",
    "causal = objective in ('clm',)",
    "x = 'mlm' if masked else 'clm'",
    "ok = start.startswith('clm')",
    "rows = df[df.objective.isin(['mntp'])]",
])
def test_the_check_catches_each_form(code):
    assert name_comparisons(code), code


def test_the_check_allows_the_kind_column_and_the_table():
    assert not name_comparisons("a = df[df.kind == 'mlm']; b = m.kind.isin(['clm', 'mlm']); c = OBJECTIVES['mlm'].masked")


@pytest.fixture
def toy_objective(monkeypatch):
    "A fourth row, added as a researcher would: bidirectional next-token prediction without masking."
    toy = Objective('toy', 'Toy', causal=False, masked=False, next_token=True, source='a test')
    monkeypatch.setitem(OBJECTIVES, 'toy', toy)
    return toy


def test_a_new_row_is_a_phase_a_run_name_and_a_batch(toy_objective):
    assert parse_schedule('clm:5,toy:3,mntp20:2') == [Phase('clm', 5), Phase('toy', 3), Phase('mntp', 2, 0.2)]
    assert parse_schedule('toy', 4) == [Phase('toy', 4)]
    r = parse_run_name('610m-clm-2k-toy-5k')
    assert r.phases == (Phase('clm', 2000), Phase('toy', 3000)) and run_name(r) == '610m-clm-2k-toy-5k'
    assert vocab.describe_checkpoint('610m-toy-5k')['kind'] == 'toy'
    ids, docs = torch.arange(3, 19).reshape(2, 8), torch.tensor([[0] * 4 + [1] * 4] * 2)
    b = make_batch(dict(input_ids=ids, document_ids=docs), Phase('toy', 1), dict(mask_token_id=2, vocab_size=50,
                   special_ids=[0, 1, 2]), (1.0, 0.0, 0.0), seed=0, first_row=0)
    assert b['is_causal'] is False and 'masked_positions' not in b
    assert torch.equal(b['input_ids'], ids) and torch.equal(b['labels'], clm_labels(ids, docs))


def test_an_unknown_objective_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=f"objective='toy'; choose from {', '.join(map(repr, OBJECTIVES))}$"): Phase('toy', 3)
    with pytest.raises(ValueError, match="cannot read phase 'toy:3'"): parse_schedule('toy:3')
    with pytest.raises(ValueError, match="cannot parse run name '610m-toy-5k'"): parse_run_name('610m-toy-5k')


def test_mntp_labels_are_mlm_labels_one_position_earlier():
    ids = torch.randint(10, 1000, (4, 64), generator=torch.Generator().manual_seed(1))
    docs = torch.tensor([[0] * 30 + [1] * 34] * 4)
    info = dict(mask_token_id=2, vocab_size=1000, special_ids=[0, 1, 2])
    mlm, mntp = (make_batch(dict(input_ids=ids, document_ids=docs), Phase(o, 1, 0.3), info, (1.0, 0.0, 0.0), 7, 0)
                 for o in ('mlm', 'mntp'))
    assert torch.equal(mlm['input_ids'], mntp['input_ids']) and mntp['is_causal'] is False
    at = mlm['labels'] != IGNORE
    assert torch.equal(mntp['labels'][:, :-1][at[:, 1:] & (docs[:, 1:] == docs[:, :-1])], ids[:, 1:][at[:, 1:] & (docs[:, 1:] == docs[:, :-1])])
    assert (mntp['labels'][:, 29] == IGNORE).all()   # a document's last token has no next token of its own


# -------------------------------------------- the GPU path, checked on a CPU (issue 25): attention FLOPs, batch layouts
@pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)
def test_attention_flops_from_the_real_document_lengths():
    cfg = model_config('610m')
    docs = torch.tensor([[0] * 1000 + [1] * 24, [2] * 100 + [3] * 924])
    span = attention_span(docs)
    assert span == pytest.approx((1000**2 + 24**2 + 100**2 + 924**2) / 2048)
    conv, real = flops_per_token(cfg, 1024), flops_per_token(cfg, 1024, attn_len=span)
    assert real < conv and conv - real == pytest.approx(12 * 26 * (1024 - span) * 18 * 64)


@pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)
def test_pretraining_batches_carry_their_layout():
    "`make_batch` ships the documents' offsets and longest length: the flash path needs no sync to find them."
    from mlmclm.pretraining.objectives import make_batch
    from mlmclm.protocol.schedules import Phase
    docs = torch.tensor([[0] * 40 + [1] * 24, [2] * 10 + [3] * 54])
    rows = dict(input_ids=torch.randint(3, 97, (2, 64)), document_ids=docs)
    ids = dict(mask_token_id=2, vocab_size=97, special_ids=[0, 1, 2])
    batch = make_batch(rows, Phase('clm', 1), ids, (1.0, 0.0, 0.0), seed=0, first_row=0)
    assert batch['cu_seqlens'].tolist() == [0, 40, 64, 74, 128] and batch['max_seqlen'] == 54
    model = build_model('tiny', vocab_size=97, attn_backend='flash', num_hidden_layers=2)
    seen = []
    def kernel(q, k, v, cu, max_len, causal): seen.append((cu.tolist(), max_len)); return q
    for block in model.model.layers: block.self_attn.varlen_impl = kernel
    with HostSyncs() as s: lm_loss(model.to(torch.bfloat16), batch)
    assert seen == [([0, 40, 64, 74, 128], 54)] * 2 and s.count == 0, dict(s.ops)


# -------------------------------------------- issue 33 item 9: MLM's masked positions as indices from the CPU data path
def _mlm_batch(B=2, T=16, V=50):
    rows = dict(input_ids=torch.randint(3, V, (B, T), generator=torch.Generator().manual_seed(0)),
                document_ids=torch.tensor([[0] * (T // 2) + [1] * (T - T // 2)] * B))
    info = dict(mask_token_id=2, vocab_size=V, special_ids=[0, 1, 2])
    return make_batch(rows, Phase('mlm', 1, 0.4), info, (1.0, 0.0, 0.0), seed=0, first_row=0)


def _boolean_loss(model, batch, ce_chunk=0):
    "The sparse MLM loss as it was: boolean indexing of the masked positions (forward and backward)."
    labels = batch['labels']; sel = labels != IGNORE
    kw = dict(is_causal=False, document_ids=batch['document_ids'])
    if ce_chunk:
        from mlmclm.model.heads import chunked_cross_entropy
        h = model(batch['input_ids'], head=False, **kw).hidden_states
        return chunked_cross_entropy(h[sel], model.lm_head.weight, labels[sel], ce_chunk)
    return F.cross_entropy(model(batch['input_ids'], logits_mask=sel, **kw).logits.float(), labels[sel])


@pytest.mark.parametrize('ce_chunk', [0, 5])
def test_mlm_makes_no_host_sync_and_is_bit_identical(ce_chunk):
    "Before: 3 host syncs a micro-batch (the boolean gather of the hidden states and the labels, its scatter in backward)."
    batch = _mlm_batch()
    assert batch['masked_positions'].dtype == torch.long
    assert torch.equal(batch['masked_positions'], (batch['labels'].flatten() != IGNORE).nonzero().flatten())
    model = build_model('tiny', vocab_size=50)
    def run(loss_fn):
        model.zero_grad(set_to_none=True)
        loss = loss_fn(); loss.backward()
        return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}
    with HostSyncs() as s:
        loss, grads = run(lambda: lm_loss(model, batch, ce_chunk=ce_chunk)[0])
    with HostSyncs() as old:
        ref_loss, ref_grads = run(lambda: _boolean_loss(model, batch, ce_chunk))
    assert s.count == 0, dict(s.ops)
    assert old.count == 3, dict(old.ops)                                    # what it was
    assert torch.equal(loss, ref_loss) and all(torch.equal(grads[k], ref_grads[k]) for k in grads)


def test_a_hand_made_mlm_batch_still_works_with_one_sync():
    batch = {k: v for k, v in _mlm_batch().items() if k != 'masked_positions'}
    model = build_model('tiny', vocab_size=50)
    with HostSyncs() as s: loss, n = lm_loss(model, batch)
    assert s.count == 1 and torch.equal(loss, _boolean_loss(model, batch)) and int(n) == int((batch['labels'] != IGNORE).sum())
