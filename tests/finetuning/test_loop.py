"""The fine-tuning loop (`mlmclm.finetuning.loop`): its guard refuses non-finite or fractional sweep values and grids
that would overflow later; a row names the dataset revision it trained and tested on; training reads its losses in
bulk instead of waiting on the device each step; blocks are compiled where asked or on CUDA."""
import dataclasses

import pytest
import torch

import mlmclm.finetuning.evaluation as ev
import mlmclm.finetuning.loop as ft
import mlmclm.tasks.registry as tasks
from mlmclm.base.configs import ConfigError
from mlmclm.protocol.runs import FinetuneConfig, finetune_config
from mlmclm.model.transformer import HostSyncs
from mlmclm.tasks.registry import TASKS

from tiny import tiny_cfg


# ---------------------------------------------------------------- the guard
# Issue 27 item 21: numbers that would overflow far from where they were given.
@pytest.mark.parametrize('values, message', [
    (dict(seeds='1e30'), "seeds='1e30' holds 1e+30; seeds are whole numbers in [0, 4294967295]"),
    (dict(lrs='1e300'), "lrs='1e300' holds 1e+300; learning rates are numbers in (0, 1]"),
    (dict(lrs='1e-4,nan'), "lrs='1e-4,nan' holds nan"),
], ids=['seeds 1e30', 'lrs 1e300', 'lrs nan'])
def test_finetuning_grids_that_would_overflow_later_are_refused_by_the_guard(values, message):
    from mlmclm.finetuning.loop import check_finetune_config
    with pytest.raises(ConfigError) as e: check_finetune_config(finetune_config(**values))
    assert message in str(e.value)


# Issue 17 item 5: non-finite inputs passed fine-tuning.
@pytest.mark.parametrize('field, value', [('lrs', 'inf'), ('lrs', 'nan'), ('lrs', '1e-4,Infinity'), ('seeds', '0.7')])
def test_item5_non_finite_or_fractional_sweep_values_are_refused(tmp_path, field, value):
    with pytest.raises(ConfigError, match=f"{field}='{value}'"):
        ft.check_finetune_config(tiny_cfg(tmp_path, **{field: value}))


# ---------------------------------------------------------------- the dataset revision of a row (issue 33 item 13)
def test_the_rows_revision_names_the_training_task_when_it_trains_on_another():
    data = dict(msmarco=dict(revision='r1'), msmarco_pairs=dict(revision='r2'), rt_sentiment={})
    T = tasks.TASKS
    assert ft.dataset_revision(data, T['msmarco_pairs'], T['msmarco']) == 'r1;train msmarco_pairs=r2'
    assert ft.dataset_revision(data, T['msmarco_pairs'], T['msmarco_pairs']) == 'r2'
    assert ft.dataset_revision(data, T['rt_sentiment'], T['rt_sentiment']) is None


# ----------------------------------------------------- the training loop does not wait on the device (issue 33 item 11)
@pytest.fixture(scope='module')
def tiny():
    base, tok = ft._load_base(FinetuneConfig())
    return base, tok, {'rt_sentiment': TASKS['rt_sentiment'].load()}


def _train_syncs(tiny, steps, monkeypatch=None, **options):
    base, tok, data = tiny
    task = TASKS['rt_sentiment']
    cfg = FinetuneConfig(**{**dict(max_steps=steps, batch_size=8, micro_batch_size=4, micro_batch_tokens=160, device='cpu',
                                      feature_cache='off', eval_every=50), **options})
    run = ft._run_context(task, tok, cfg)
    kind = ev.KINDS['sequence']
    model = ft.run_model(base, kind, task, run)
    feats = kind.features(data['rt_sentiment']['train'], run)
    opt, sched = ft.optimizer(model, 1e-3, steps, 1, run.device)
    if monkeypatch:   # the loop alone: the CPU's own waits (AdamW's step count, the reference attention) left out
        monkeypatch.setattr(ft, 'batch_backward', lambda *a, **k: torch.ones(()) * sched.last_epoch)
        monkeypatch.setattr(ft, 'optimizer_step', lambda model, opt, sched: (opt.step(), sched.step()))
    losses = []
    with HostSyncs() as syncs:
        ft._train(model, kind, feats, steps, opt, sched, 0, run, [task], data, losses)
    return syncs, losses


def test_training_steps_read_their_losses_in_bulk_not_each_step(tiny, monkeypatch):
    "Before: `loss.item()` after every step, a host wait per step; now one read per `eval_every` steps and at the end."
    syncs, losses = _train_syncs(tiny, 12, monkeypatch)
    assert losses == [float(s) for s in range(12)]
    assert syncs.count == 0, dict(syncs.ops)   # before: 12 (`.item()`); the bulk reads (`.cpu().tolist()`) wait once each on a GPU


def test_a_diverged_step_is_still_named_with_its_learning_rate(tiny, monkeypatch):
    real = ft.batch_backward
    calls = []
    def nan_at_3(*a, **k):
        calls.append(1)
        out = real(*a, **k)
        return out * float('nan') if len(calls) == 3 else out
    monkeypatch.setattr(ft, 'batch_backward', nan_at_3)
    with pytest.raises(FloatingPointError, match=r'fine-tuning loss is nan at step 3 of 12 \(learning rate '):
        _train_syncs(tiny, 12, eval_every=4)
    assert len(calls) == 4   # found at the first read after it (step 4), not at the end


def test_blocks_are_compiled_only_where_asked_or_on_cuda(tiny, monkeypatch):
    base, tok, _ = tiny
    task, kind = TASKS['rt_sentiment'], ev.KINDS['sequence']
    compiled = []
    monkeypatch.setattr(ft, 'compile_blocks', lambda model, **kw: compiled.append(model) or model)
    for option, device, want in ((None, 'cpu', False), (True, 'cpu', True), (False, 'cpu', False)):
        run = ft._run_context(task, tok, FinetuneConfig(compile=option, device=device, feature_cache='off'))
        ft.run_model(base, kind, task, run)
        assert (len(compiled) == 1) == want, (option, device); compiled.clear()
    run = ft._run_context(task, tok, FinetuneConfig(device='cpu', feature_cache='off'))
    assert ft.compiled(dataclasses.replace(run, device=torch.device('cuda'))) is True
