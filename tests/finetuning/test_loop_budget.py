"""A fine-tuning run's token budget on a GPU (`mlmclm.finetuning.loop.token_budget`, issue 33 item 1): it follows the
model, its precision and its state, read from the sizes tables, instead of a fixed number of tokens per GiB; a card too
small for one input is refused with the numbers."""
from types import SimpleNamespace

import pytest
import torch

import mlmclm.finetuning.loop as ft
from mlmclm.base.configs import ConfigError
from mlmclm.model.sizes import GIB, model_config


GPU = torch.device('cuda')   # never used to compute: only its type is read, and the card's memory is mocked


@pytest.fixture
def card(monkeypatch):
    "Pretend the GPU has `gib` GiB of memory."
    def set_card(gib):
        monkeypatch.setattr(torch.cuda, 'get_device_properties', lambda d: SimpleNamespace(total_memory=int(gib * GIB)))
    return set_card


def _estimate(size, precision, tokens, backend='sdpa'):
    m = ft.finetune_memory(model_config(size), precision, backend)
    return m['state'] + tokens * m['per_token']


def test_1b_fp32_budget_fits_an_80gb_card_where_the_per_gib_rule_did_not(card):
    card(79.1)
    usable = 79.1 * (1 - ft.MEMORY_MARGIN)
    # the fixed 256 tokens per GiB overflowed the card: about 94 GiB for the 28-layer shape issue 33 measured (now
    # '1.2b'), 79 GiB for the authors' 26-layer 1b, against 67 usable
    assert _estimate('1.2b', 'fp32', 19_456) > 90 and _estimate('1b', 'fp32', 19_456) > usable
    tokens = ft.token_budget(GPU, 2028, model_config('1b'), 'fp32', 'sdpa')
    assert 2028 <= tokens < 19_456 and tokens % 1024 == 0
    assert _estimate('1b', 'fp32', tokens) <= usable < _estimate('1b', 'fp32', tokens + 1024)


def test_budget_follows_size_and_precision(card):
    card(79.1)
    b = {(s, p): ft.token_budget(GPU, 2028, model_config(s), p, 'sdpa')
         for s in ('210m', '610m', '1b') for p in ('pure_bf16', 'amp_bf16', 'fp32')}
    for p in ('pure_bf16', 'amp_bf16', 'fp32'): assert b['210m', p] > b['610m', p] > b['1b', p]
    for s in ('210m', '610m', '1b'): assert b[s, 'pure_bf16'] > b[s, 'amp_bf16'] > b[s, 'fp32']


def test_budget_reads_the_sizes_tables_by_name(card, monkeypatch):
    "A re-measured activation table changes the budget: nothing is copied."
    card(79.1)
    before = ft.token_budget(GPU, 2028, model_config('610m'), 'pure_bf16', 'flash')
    monkeypatch.setattr(ft, 'stored_activation_bytes', lambda cfg, bf16, checkpointed=False, compiled=False: 2 * 72032.0)
    after = ft.token_budget(GPU, 2028, model_config('610m'), 'pure_bf16', 'flash')
    assert after < 0.6 * before


def test_a_card_too_small_for_one_input_is_refused_with_the_numbers(card):
    card(16)
    with pytest.raises(ConfigError) as e: ft.token_budget(GPU, 2028, model_config('1b'), 'fp32', 'sdpa')
    msg = str(e.value)
    for part in ("precision='fp32'", 'max_length=2028', '0.98B-parameter', 'GiB usable', '16.0 GiB less 15%'):
        assert part in msg, (part, msg)


def test_cpu_budget_is_unchanged():
    assert ft.token_budget(torch.device('cpu'), 128) == 1024
    assert ft.token_budget(torch.device('cpu'), 2028, model_config('1b'), 'fp32') == 2028


def test_an_unmeasured_shape_is_measured(card):
    card(79.1)
    odd = model_config('tiny', hidden_size=96, num_attention_heads=3, num_key_value_heads=3, head_dim=32)
    assert ft.token_budget(GPU, 512, odd, 'fp32', 'sdpa') > 100_000
