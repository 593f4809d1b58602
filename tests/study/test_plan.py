"""Issue 36 (studysplit): the launcher computes a pretraining run's notebook parameters once (item 3 of the review);
the planner prices the demo's fine-tuning from what the demo fine-tunes (item 1's leftover)."""
import time

import pytest

import mlmclm.study.launchers as launchers
from mlmclm import study, study_cli
from mlmclm.base.files import atomic_write_json, project_root, read_json
from mlmclm.protocol.runs import PretrainRun
from mlmclm.study.plan import build_plan, demo_plan, pretrain_params


def _branching_plan():
    # tiny-clm-10k-mlm40-42k branches from tiny-clm-42k's full state at (scaled) step 10k
    return build_plan('unit', {'E1': ['tiny-clm-42k'], 'E3': ['tiny-clm-10k-mlm40-42k']}, ('rt_sentiment',), ('rt_sentiment',),
                      lrs=(1e-3,), seeds=(0,), step_scale=1 / 2000, pretrain_preset='demo', finetune_preset='demo',
                      pretrain_overrides=dict(seq_len=32, batch_size=4, lr=2e-3, data='embedded', log_every=5))


def test_a_pretraining_run_gets_its_parameters_computed_once(tmp_path, monkeypatch):
    plan = _branching_plan()
    child = plan.runs['tiny-clm-10k-mlm40-42k']
    computed, executed = [], []
    def counted(*args, **kwargs):
        computed.append(args[1].name)
        return pretrain_params(*args, **kwargs)
    monkeypatch.setattr(launchers, 'pretrain_params', counted)
    monkeypatch.setattr(launchers, 'run_notebook', lambda notebook, params, out: executed.append((notebook, params)))
    launchers._run_pretraining(plan, tmp_path, child)       # nobody trains the parent: the child's notebook runs
    assert computed == [child.name]                      # before: twice (once more to look for the parent's worker)
    assert executed == [('02_pretrain.ipynb', dict(pretrain_params(plan, child, tmp_path), progress=False))]


def test_a_child_waits_for_a_parent_another_worker_trains_given_its_parameters(tmp_path):
    plan = _branching_plan()
    child = plan.runs['tiny-clm-10k-mlm40-42k']
    params = pretrain_params(plan, child, tmp_path)
    assert launchers._parent_in_other_hands(child, tmp_path, params) is None
    held = PretrainRun('tiny-clm-42k', tmp_path).try_claim()
    try:
        assert launchers._parent_in_other_hands(child, tmp_path, params) == 'tiny-clm-42k'
        with pytest.warns(UserWarning, match='skipped for now'): launchers._run_pretraining(plan, tmp_path, child)
    finally:
        held.release()


# ------------------------------------------------------------- item 1 leftover: the demo's fine-tuning price

def test_the_planner_counts_the_demos_examples_as_fine_tuning_encodes_them():
    "The planner's count (no torch) against the features the fine-tuning loop trains on: examples, tokens and steps."
    import statistics
    from mlmclm.data.tokenizers import load_tokenizer
    from mlmclm.finetuning.loop import _run_context
    from mlmclm.protocol.runs import train_steps
    from mlmclm.finetuning.evaluation import KINDS, head_kind
    from mlmclm.finetuning.batches import example_tokens
    from mlmclm.protocol.runs import finetune_config
    from mlmclm.tasks.registry import TASKS
    from mlmclm.protocol.paper import EMBEDDED_TASKS
    demo, cfg, tok = demo_plan(), finetune_config('demo', feature_cache='off', device='cpu'), load_tokenizer('embedded')
    for name in EMBEDDED_TASKS:
        task = TASKS[name]
        feats = KINDS[head_kind(task, cfg)].features(task.load()['train'], _run_context(task, tok, cfg))
        n, per_example = study.shipped_examples(name, task.max_length)
        assert n == len(feats), name
        assert per_example == pytest.approx(statistics.mean(example_tokens(f) for f in feats), rel=0.05), name
        assert study.finetune_steps(demo, name, n) == train_steps(name, n, cfg), name


def _timings():
    "The demo's recorded fine-tuning stages (minutes, figures/demo/timings.json), on this project's 2-core machine."
    return [e['stages']['fine-tuning'] for e in read_json(project_root()/'figures'/'demo'/'timings.json')['demo']
            if 'fine-tuning' in e.get('stages', {})]


def test_the_demos_fine_tuning_is_priced_near_what_the_demo_takes(tmp_path, one_thread):
    """After `mlmclm bench --finetune` on the demo's tiny model on a CPU, the plan prices the demo's fine-tuning within
    a factor 2 of what the demo takes (before: paper-scale lengths and 1,600 examples a run priced ~3x the work), and
    a speed measured on another model size prices nothing."""
    import statistics
    from mlmclm.bench.finetune_speed import finetune_benchmark, finetune_sides
    recorded = _timings()
    assert recorded, 'figures/demo/timings.json records no fine-tuning stage'
    minutes = statistics.median(recorded)
    r = finetune_benchmark('rt_sentiment', size='tiny', steps=8, warmup=2, reps=3, device='cpu', sides=finetune_sides()[-1:])
    ours = r['sides'][-1]
    # one thread with a core to itself, as each of the demo's two workers had: the fastest run's CPU seconds per step,
    # which the load of other processes on this shared machine inflates far less than wall seconds (5x at load 10)
    ours['examples_per_s'] = r['batch_size'] / ours['cpu_step_s_min']
    atomic_write_json(tmp_path/'finetune-rt_sentiment-tiny.json', r)
    demo = demo_plan()
    price = study_cli.measured_finetune_price(demo, folder=tmp_path)
    assert (price['sizes'], price['others']) == (['tiny'], [])
    assert minutes / 2 < price['hours'] * 60 < minutes * 2, (price['hours'] * 60, recorded)
    assert '  fine-tuning examples of corpus_excerpt, corpus_names, corpus_speaker, rt_sentiment: as they ship' in \
        study_cli.describe(demo)                                           # the plan says what priced its examples
    assert 'fine-tuning at the measured speed for tiny' in study_cli.measured_finetune_line(demo, folder=tmp_path)
    other = dict(r, model='610m', body_params=study.body_params('610m'))   # newer, of another size: not applied
    time.sleep(0.01); atomic_write_json(tmp_path/'finetune-rt_sentiment-610m.json', other)
    price = study_cli.measured_finetune_price(demo, folder=tmp_path)
    assert (price['sizes'], price['others'], price['hours']) == ([], ['tiny'], None)
    assert study_cli.measured_finetune_line(demo, folder=tmp_path).startswith('  fine-tuning at the assumed MFU above for tiny')
