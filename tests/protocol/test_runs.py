"""The run configs and run identities (`mlmclm.protocol.runs`): numbers that would overflow far from where they were
given are refused in the config (issue 27 item 21); the committed paper configs are the presets of the code, and each
preset fits an 80 GB card with margin."""
import json

import pytest

from mlmclm.base.configs import ConfigError
from mlmclm.protocol.runs import grad_accum, paper_preset, pretrain_config
from mlmclm.base.files import project_root
from mlmclm.protocol.paper import paper_run_names

ROOT = project_root()


@pytest.mark.parametrize('make, message', [
    (lambda: pretrain_config(seed=2**70), 'seed=1180591620717411303424 is out of range; allowed: >= 0 and <= 4294967295'),
    (lambda: pretrain_config(lr=1e300), 'lr=1e+300 is out of range; allowed: > 0.0 and <= 1.0'),
    (lambda: pretrain_config(mask_ratio=float('inf')), 'mask_ratio=inf is not a finite number'),
], ids=['seed 2**70', 'lr 1e300', 'mask ratio inf'])
def test_pretraining_numbers_that_would_overflow_later_are_refused_in_the_config(make, message):
    with pytest.raises(ConfigError) as e: make()
    assert message in str(e.value)


# ---------------------------------------------------------------- the paper's presets
def test_committed_paper_configs_match_the_code():
    folder = ROOT/'nbs'/'configs'
    names = paper_run_names(appendix=True)
    assert sorted(p.stem for p in folder.glob('*.yaml')) == sorted(names)
    for name in names:
        text = (folder/f'{name}.yaml').read_text()
        values = {k: json.loads(v) for k, v in (line.split(': ', 1) for line in text.splitlines()[1:])}
        assert values == paper_preset(name), name


def test_every_paper_preset_fits_an_80_gb_card_with_margin():
    "Issue 25 item 7: the measured memory estimate of each released model's run, on the paper's 8 GPUs, as its preset sets it."
    from mlmclm.model.sizes import memory_estimate
    from mlmclm.protocol.runs import paper_preset
    from mlmclm.protocol.schedules import parse_schedule
    for name in paper_run_names(appendix=True):
        cfg = pretrain_config(name)
        accum = grad_accum(cfg.global_batch, cfg.batch_size, 8)
        for phase in parse_schedule(cfg.schedule, cfg.total_steps, mask_ratio=cfg.mask_ratio):
            e = memory_estimate(cfg.size, 'fsdp2' if cfg.fsdp else 'ddp', 8, cfg.batch_size, cfg.seq_len, phase.objective,
                                phase.mask_ratio or 0.4, cfg.sparse_head, cfg.ce_chunk, cfg.gradient_checkpointing, accum,
                                bf16=True, attn_backend='flash', bucket_view=True)
            assert e['peak_gib'] < 0.85 * 79.1, (name, phase, e['peak_gib'])
    assert not pretrain_config('1b-clm-42k').fsdp and not pretrain_config('610m-clm-42k').fsdp   # none shards (issue 33)
