"""Loading Hugging Face Llama-family decoders through `mlmclm.model.checkpoints.load`: logits must match transformers itself."""
import json

import pytest
import torch
import transformers
from safetensors.torch import save_file

from mlmclm.base.configs import ConfigError
from mlmclm.model.transformer import build_model
from mlmclm.model.checkpoints import load, parity_error, save

SMALL = dict(vocab_size=103, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)


def _roundtrip_parity(hf_model, tmp_path, is_causal=True):
    hf_model.eval().save_pretrained(tmp_path)
    ours = load(tmp_path).eval()
    ids = torch.randint(0, SMALL['vocab_size'], (2, 17), generator=torch.Generator().manual_seed(0))
    return ours, parity_error(ours, hf_model, ids, is_causal=is_causal)


@pytest.mark.parametrize('family', ['llama', 'mistral', 'qwen2'])
def test_decoder_families_match_transformers(family, tmp_path):
    torch.manual_seed(0)
    if family == 'llama':
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL))
    elif family == 'mistral':
        hf = transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL, sliding_window=None))
    else:  # Qwen2 has q/k/v biases and tied embeddings by default in small configs
        hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SMALL, tie_word_embeddings=True))
        with torch.no_grad():
            for layer in hf.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)   # non-zero biases, so a dropped bias would show
    ours, err = _roundtrip_parity(hf, tmp_path)
    assert err < 1e-4, (family, err)
    assert ours.config.is_causal


def test_llama3_rope_scaling_matches_transformers(tmp_path):
    rope = dict(rope_type='llama3', factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=64, rope_theta=500000.0)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, rope_parameters=rope,
                                                               max_position_embeddings=512))
    ours, err = _roundtrip_parity(hf, tmp_path)
    assert ours.config.rope_parameters['rope_type'] == 'llama3'
    assert err < 1e-4


def test_released_sl_model_layout_loads_bidirectional(tmp_path):
    """The paper's releases: model_type sl_model, Llama weight names; they are encoders (bidirectional)."""
    torch.manual_seed(0)
    ref = build_model('tiny', vocab_size=103).eval()
    state = {k.removeprefix('model.'): v for k, v in ref.state_dict().items()}   # a body stored without 'model.'
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path/'model.safetensors'))
    c = ref.config
    (tmp_path/'config.json').write_text(json.dumps(dict(
        model_type='sl_model', architectures=['SLModel'], vocab_size=103, hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim, rope_theta=10000.0, rms_norm_eps=1e-5, mask_token_id=2)))
    loaded = load(tmp_path).eval()
    assert loaded.config.is_causal is False and loaded.config.mask_token_id == 2
    ids = torch.randint(0, 103, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, ref(ids).logits)


def test_refuses_what_it_cannot_represent(tmp_path):
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path/'config.json').read_text())
    (tmp_path/'config.json').write_text(json.dumps(dict(cfg, hidden_act='gelu')))
    with pytest.raises(ConfigError, match="hidden_act='gelu' is not supported"):
        load(tmp_path)
    (tmp_path/'config.json').write_text(json.dumps(dict(cfg, model_type='mistral', sliding_window=4096)))
    with pytest.raises(ConfigError, match='sliding_window=4096'):
        load(tmp_path)
    for f in tmp_path.glob('*.safetensors'): f.unlink()
    (tmp_path/'config.json').write_text(json.dumps(cfg))
    with pytest.raises(FileNotFoundError, match='pickled .bin checkpoints are refused'):
        load(tmp_path)


def test_missing_checkpoint_names_the_path():
    with pytest.raises(FileNotFoundError, match="'./no/such/run'"):
        load('./no/such/run')


def test_meta_device_builds_every_size_instantly():
    with torch.device('meta'):
        m = build_model('1b')
    assert next(m.parameters()).is_meta
    assert m.config.num_hidden_layers == 26   # the authors' 1b preset (issue 33)


def test_checkpoint_records_attention_mode_and_metadata(tmp_path):
    m = build_model('tiny')
    save(m, tmp_path, is_causal=True, metadata={'step': 3})
    cfg = json.loads((tmp_path/'config.json').read_text())
    assert cfg['model_type'] == 'llama' and cfg['is_causal'] is True
    assert json.loads((tmp_path/'mlmclm.json').read_text()) == {'step': 3}
    # plain transformers, no custom code
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(hf).__name__ == 'LlamaForCausalLM'
