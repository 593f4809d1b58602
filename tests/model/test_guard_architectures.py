"""Issue 46 item 2: the bidirectionality guard, for every architecture of the generic path and every kernel we ship
(our sdpa, eager and variable-length 'flash' path; transformers' sdpa, eager and flex; flash-attn on a GPU only)."""
import pytest
import torch
import torch.nn as nn

from mlmclm.data.tokenizers import load_tokenizer
from mlmclm.model.backbones import TINY_ARCHITECTURES, open_checkpoint, save_tiny_backbone
from mlmclm.model.guard import AttentionModeError, attention_probe, check_attention
from mlmclm.model.transformer import build_model, varlen_kernel

pytestmark = pytest.mark.usefixtures('one_thread')
ENCODERS = ('bert', 'roberta', 'modernbert')
CUDA = torch.cuda.is_available()


@pytest.fixture(scope='module')
def folders(tmp_path_factory):
    tok, root = load_tokenizer('embedded'), tmp_path_factory.mktemp('zoo')
    return {mt: save_tiny_backbone(mt, root/mt, tok) for mt in TINY_ARCHITECTURES}


FLEX = pytest.param('flex', marks=pytest.mark.slow)   # flex compiles its masks: 30-60 s an architecture on a CPU


@pytest.mark.parametrize('kernel', ['sdpa', 'eager', FLEX])
@pytest.mark.parametrize('model_type', list(TINY_ARCHITECTURES))
def test_the_guard_passes_the_mode_asked_and_refuses_the_other(model_type, kernel, folders):
    m = open_checkpoint(folders[model_type], path='transformers')
    m.config.attn_backend = kernel
    layouts = (True, False) if kernel != 'flex' else (True,)
    for packed in layouts:
        try: facts = check_attention(m.model, False, packed, 8192, model_type)
        except AttentionModeError as e:   # torch 2.13's CPU inductor fails to compile Gemma-3's flex masks: refused, as it must be
            if kernel == 'flex' and 'could not run' in str(e): pytest.xfail(f'{model_type} with flex on a CPU: {str(e)[:200]}')
            raise
        assert facts['attention_observed'] == 'bidirectional' and facts['attention_kernel'].startswith('transformers ')
        if model_type in ENCODERS:   # an encoder asked for causal attention: refused, naming what it runs
            with pytest.raises(AttentionModeError, match=f'{model_type} with the transformers .* kernel .* was asked for '
                                                         'causal attention but runs bidirectional attention'):
                check_attention(m.model, True, packed, 8192, model_type)
        else: assert check_attention(m.model, True, packed, 8192, model_type)['attention_observed'] == 'causal'


@pytest.mark.parametrize('backend', ['sdpa', 'eager', 'flash'])
def test_our_kernels_give_the_mode_asked(backend):
    "Ours on a CPU; 'flash' runs the variable-length path with the reference kernel there."
    model = build_model('tiny', vocab_size=8192, attn_backend=backend)
    for packed in (True, False):
        for causal in (False, True):
            r = attention_probe(model.model, causal, packed, 8192)
            assert r['observed'] == ('causal' if causal else 'bidirectional') and r['leak'] == 0.0, (backend, packed, causal, r)


class DroppedFlag(nn.Module):
    "A kernel that drops the flag: causal whatever it is asked (transformers issue 46077's Llama)."
    def __init__(self, body): super().__init__(); self.body, self.config = body, body.config
    def forward(self, ids, mask=None, is_causal=False, docs=None, **kw): return self.body(ids, mask, True, docs, **kw)


class Leaky(nn.Module):
    "A kernel that lets packed examples see each other (document boundaries dropped)."
    def __init__(self, body): super().__init__(); self.body, self.config = body, body.config
    def forward(self, ids, mask=None, is_causal=False, docs=None, **kw): return self.body(ids, None, is_causal, None)


def test_the_guard_refuses_a_dropped_flag_and_leaking_examples():
    body = build_model('tiny', vocab_size=8192).model
    with pytest.raises(AttentionModeError, match='was asked for bidirectional attention but runs causal attention') as e:
        check_attention(DroppedFlag(body), False, True, 8192, 'm')
    assert e.value.observed == 'causal'
    with pytest.raises(AttentionModeError, match='examples see each other'):
        check_attention(Leaky(body), False, True, 8192, 'm')


def test_a_fine_tuning_run_is_refused_before_training(folders, tmp_path):
    "An encoder fine-tuned with attention='causal' never trains: the sweep stops at the guard, naming the mode."
    from tiny import tiny_cfg
    from mlmclm.finetuning.sweep import finetune_sweep
    from mlmclm.results.store import read_rows
    cfg = tiny_cfg(tmp_path, checkpoint=str(folders['bert']), attention='causal', feature_cache='off')
    with pytest.raises(AttentionModeError, match='was asked for causal attention but runs bidirectional'):
        finetune_sweep(cfg)
    assert not read_rows(tmp_path/'results.jsonl')


@pytest.mark.skipif(not CUDA or varlen_kernel() is None, reason='GPU only: the flash-attn / torch varlen kernels need CUDA')
def test_our_flash_kernel_on_a_gpu():
    model = build_model('tiny', vocab_size=8192, attn_backend='flash').cuda().to(torch.bfloat16)
    for packed in (True, False):
        for causal in (False, True):
            assert attention_probe(model.model, causal, packed, 8192)['observed'] == ('causal' if causal else 'bidirectional')


@pytest.mark.skipif(not CUDA, reason="GPU only: transformers' flash_attention_2 and sdpa on CUDA")
@pytest.mark.parametrize('model_type', list(TINY_ARCHITECTURES))
def test_transformers_kernels_on_a_gpu(model_type, folders):
    import importlib.util
    kernels = ['sdpa'] + (['flash'] if importlib.util.find_spec('flash_attn') else [])
    m = open_checkpoint(folders[model_type], path='transformers', dtype=torch.bfloat16).cuda()
    for kernel in kernels:
        m.config.attn_backend = kernel
        for packed in (True, False):
            try: observed = check_attention(m.model, False, packed, 8192, model_type)['attention_observed']
            except AttentionModeError as e: observed = f'refused: {e}'
            assert observed == 'bidirectional', (model_type, kernel, packed, observed)
