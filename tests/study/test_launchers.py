"""One launcher path (issue 26): the launcher notebooks' parameters are their configs' fields, every parameter reaches
the config whatever the notebook's other cells assign, papermill runs only the Run section, run keys agree between
the sweep, the local launcher, the Slurm array and `study status`, and one pretraining run has one trainer: a child
run whose parent another worker trains is skipped for now, its notebook parameters computed once; a study resumes
without redoing work, each fine-tuning worker sees its own GPU, and a pretraining job's sbatch file says its nodes,
GPUs, time, partition, requeue and signal."""
import ast
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mlmclm.finetuning.loop as ft

import mlmclm.finetuning.sweep as sw
import mlmclm.study.launchers as launchers
import mlmclm.study.plan as study
from mlmclm.base.configs import ConfigError, notebook_config
from mlmclm.base.files import project_root, read_json, read_jsonl
from mlmclm.results.store import StoreWriter, read_rows
from mlmclm.protocol.runs import (FinetuneConfig, PretrainConfig, finetune_config, finetune_grid, finetune_preset,
                                  finetune_runs, grad_accum, pretrain_config, pretrain_preset)
from mlmclm.protocol.finetuning import PROTOCOL_AXES
from mlmclm.protocol.runs import PretrainRun
from mlmclm.study.launchers import _parent_in_other_hands, launch, pretrain_job_specs
from mlmclm.study.plan import build_plan, paper_plan, pretrain_params, select

ROOT = project_root()
PY = sys.executable
PAPERMILL = str(Path(PY).with_name('papermill'))
LAUNCHERS = {'02_pretrain.ipynb': (PretrainConfig, pretrain_preset), '03b_finetune.ipynb': (FinetuneConfig, finetune_preset)}


def _run_section(notebook):
    "The code cells of the notebook's Run section, and the tags of every code cell above it."
    cells = json.loads((ROOT/'nbs'/notebook).read_text())['cells']
    start = next(i for i, c in enumerate(cells) if c['cell_type'] == 'markdown' and ''.join(c['source']).startswith('## Run'))
    above = [c['metadata'].get('tags', []) for c in cells[:start] if c['cell_type'] == 'code']
    return [c for c in cells[start:] if c['cell_type'] == 'code'], above


@pytest.mark.parametrize('notebook', LAUNCHERS)
def test_the_parameters_cell_is_every_field_of_the_config_at_its_default(notebook):
    cls, _ = LAUNCHERS[notebook]
    run, _ = _run_section(notebook)
    params = next(c for c in run if 'parameters' in c['metadata'].get('tags', []))
    assigned = {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(''.join(params['source'])).body}
    fields = {f.name: f.default for f in cls.__dataclass_fields__.values()}
    assert assigned.pop('preset') is None
    assert assigned == fields


@pytest.mark.parametrize('notebook', [*LAUNCHERS, '04_study.ipynb', '05_figures.ipynb'])
def test_a_launcher_is_its_run_section(notebook):
    "A launcher holds no library code (that is in the wings' chapters): above its Run section only prose, nothing skipped."
    run, above = _run_section(notebook)
    assert above == [] and any('parameters' in c['metadata'].get('tags', []) for c in run)
    assert not any('skip-execution' in c['metadata'].get('tags', []) for c in run)


def _other_value(f):
    "A value of field `f` that is allowed and differs from its default."
    m, d = f.metadata, f.default
    if m.get('choices'): return next(c for c in m['choices'] if c != d)
    if f.name == 'log_with': return 'mlflow'   # a tracker's name (checked against accelerate's, and installed: a dev requirement)
    if isinstance(d, bool): return not d
    if f.type == 'bool | None': return True
    if f.type in ('int', 'int | None'): return (m.get('low') or 0) + 3 if d is None else d + 1
    if f.type in ('float', 'float | None'): return 0.5 if d != 0.5 else 0.25
    return 'elsewhere/x' if d is None else f'{d},x'


@pytest.mark.parametrize('notebook', LAUNCHERS)
def test_every_parameter_passed_reaches_the_config_whatever_other_cells_assigned(notebook):
    """The notebook's own cells in the order papermill runs them: the imports, the parameters cell, papermill's injected
    cell, and the guard's `notebook_config`, in a namespace where earlier cells left every field name at another
    value (what the test cells above the Run section once did to `size` and `lr`)."""
    cls, _ = LAUNCHERS[notebook]
    run, _ = _run_section(notebook)
    imports, params, guard = (''.join(c['source']) for c in run[:3])
    assert guard.startswith(f'cfg = notebook_config({cls.__name__}, globals(), ')
    for f in cls.__dataclass_fields__.values():
        ns = {k.name: _other_value(k) for k in cls.__dataclass_fields__.values()}   # stale values of earlier cells
        exec(imports + '\n' + params, ns)
        value = _other_value(f)
        injected = f'# Parameters\n{f.name} = {value!r}\n'
        ns['In'] = ['', imports, params, injected]
        exec(injected, ns)
        exec(guard.splitlines()[0], ns)
        assert vars(ns['cfg']) == vars(cls(**{f.name: value})), f.name    # that value, and nothing else changed


def test_a_preset_and_a_passed_default_value_both_count(tmp_path):
    "`-p preset 610m-clm-42k -p schedule mlm`: the passed value wins although it equals the config's default."
    ns = {}
    exec("from mlmclm.base.configs import notebook_config\nfrom mlmclm.protocol.runs import PretrainConfig, pretrain_preset\n"
         "preset = None\nschedule = 'mlm'\n", ns)
    ns.update(preset='610m-clm-42k', schedule='mlm', In=['# Parameters\npreset = "610m-clm-42k"\nschedule = "mlm"\n'])
    cfg = notebook_config(PretrainConfig, ns, pretrain_preset)
    assert (cfg.schedule, cfg.total_steps, cfg.global_batch) == ('mlm', 42000, 2304)


# ---------------------------------------------------------------- the design card's line, for real
PRETRAIN_VALUES = dict(schedule='biphasic', clm_steps=3, total_steps=6, mask_ratio=0.3, replace_mask=0.8,
                       replace_random=0.1, replace_keep=0.1, tokenizer='embedded', data='embedded',
                       data_subset='sample-10BT', data_offset=64, unique_tokens=320, data_workers=2, seq_len=32, global_batch=4, batch_size=2,
                       lr=1e-3, warmup_steps=1, decay_steps=2, weight_decay=0.05, adam_beta1=0.8, adam_beta2=0.9,
                       adam_eps=1e-6, grad_clip=0.5, seed=7, run_id='pm', checkpoint_steps='2', save_every=5,
                       log_every=1, heldout_rows=8, heldout_every=2, heldout_measures='mdlm,mlm15', stop_at_step=5, device='cpu', attn_backend='eager', sparse_head=False, ce_chunk=16,
                       prefetch=0, gradient_checkpointing=True, progress=False, on_config_change='force_new',
                       trust_state_from='any')
# left at their defaults here, each for a reason (the test above passes every one of them): a larger model or
# sharding is minutes of CPU, init_from/resume_from need a run first, clm_fraction excludes clm_steps, compile is
# slow on a CPU, log_with has its own test (tests/base/test_trackers.py), store_dir would tokenize the corpus again, and
# save=False would leave no checkpoint for the fine-tuning test below
NOT_PASSED = {'size', 'init_from', 'resume_from', 'clm_fraction', 'fsdp', 'compile', 'log_with', 'store_dir', 'out_dir',
              'save'}


def _papermill(notebook, out, values):
    args = [a for k, v in values.items() for a in ('-p', k, str(v))]
    return subprocess.run([PAPERMILL, f'nbs/{notebook}', str(out), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=900)


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('pm')
    t0 = time.perf_counter()
    out = _papermill('02_pretrain.ipynb', tmp/'out.ipynb', dict(PRETRAIN_VALUES, out_dir=tmp))
    return tmp, out, time.perf_counter() - t0


def test_papermill_passes_every_pretraining_parameter_to_the_run(pretrained):
    tmp, out, seconds = pretrained
    assert out.returncode == 0, out.stderr[-3000:]
    assert set(PRETRAIN_VALUES) | NOT_PASSED == set(PretrainConfig.__dataclass_fields__)
    recorded = read_json(tmp/'pm'/'run.json')
    assert {k: recorded['config'][k] for k in PRETRAIN_VALUES} == PRETRAIN_VALUES
    assert recorded['batch'] == dict(global_batch=4, micro_batch=2, grad_accum=2, processes=1)
    metrics = read_jsonl(tmp/'pm'/'metrics.jsonl')
    assert [m['objective'] for m in metrics] == ['clm'] * 3 + ['mlm'] * 2
    assert [m['heldout_loss'] is not None for m in metrics] == [False, True, False, True, True]   # every 2, and the last
    executed = json.loads((tmp/'out.ipynb').read_text())['cells']
    start = next(i for i, c in enumerate(executed) if ''.join(c['source']).startswith('## Run'))
    assert all(c.get('execution_count') is None for c in executed[:start] if c['cell_type'] == 'code')   # no test ran
    print(f'papermill line: {seconds:.1f} s')


def test_papermill_refuses_a_misspelled_parameter_before_any_work(tmp_path):
    bad = _papermill('02_pretrain.ipynb', tmp_path/'bad.ipynb', dict(mask_ration=0.3, out_dir=tmp_path))
    assert bad.returncode != 0
    assert "unknown parameter 'mask_ration' (did you mean 'mask_ratio'?)" in bad.stderr + bad.stdout
    assert not any(tmp_path.iterdir()) or sorted(p.name for p in tmp_path.iterdir()) == ['bad.ipynb']


def test_papermill_passes_every_finetuning_parameter_to_the_sweep(pretrained, tmp_path, monkeypatch):
    tmp, out, _ = pretrained
    monkeypatch.setenv('MLFLOW_TRACKING_URI', (tmp_path/'mlruns').as_uri())   # log_with='mlflow': a local file store
    monkeypatch.setenv('MLFLOW_ALLOW_FILE_STORE', 'true')
    assert out.returncode == 0, out.stderr[-3000:]
    values = dict(checkpoint=str(tmp/'pm'/'checkpoints'/'step-2'), checkpoint_name='pm-2', tasks='rt_sentiment',
                  lrs='0.001', seeds='1', max_steps=2, batch_size=4, micro_batch_size=2, packing=False,
                  micro_batch_tokens=256, feature_cache=str(tmp_path/'features'), select_step='best', eval_every=1,
                  max_eval_examples=8, max_length=64, precision='fp32', attention='causal', pooling='last',
                  data_source='canonical', special_tokens='bos_eos', tc_mode='seqeval', qa_mode='squad',
                  ndcg_mode='standard', warmup='round', results=str(tmp_path/'results.jsonl'),
                  save_retriever=str(tmp_path/'retrievers'), device='cpu', compile=False, progress=False, log_with='mlflow')
    assert set(values) == set(FinetuneConfig.__dataclass_fields__)
    res = _papermill('03b_finetune.ipynb', tmp_path/'ft.ipynb', values)
    assert res.returncode == 0, res.stderr[-3000:]
    record, = (tmp_path/'results.d'/'configs').glob('*/run.json')
    assert {k: read_json(record)['config'][k] for k in values} == values
    rows = [r for s in (tmp_path/'results.d').glob('*.jsonl') for r in read_jsonl(s) if 'dataset' in r]
    assert [(r['checkpoint_name'], r['attention'], r['pooling'], r['seed']) for r in rows] == [('pm-2', 'causal', 'last', 1)]
    assert (tmp_path/'mlruns').is_dir()   # the tracker ran


# ---------------------------------------------------------------- one key per run, whichever launcher asks
ABLATIONS = {'protocol': dict(attention=('bidirectional', 'causal'), pooling=('mean', 'last')),   # 4 cells
             'precision': dict(precision=('pure_bf16', 'amp_bf16', 'auto', 'fp32'))}               # 4 cells


def _ablation(kind='protocol'):
    return study.protocol_ablation_plan(('hub/610m-clm-42k',), datasets=('sst2', 'msmarco', 'nq'), lrs=(1e-4,), seeds=(0,),
                                        **ABLATIONS[kind])


def _store_every_run(plan, store):
    "The rows the sweep would write for every run of `plan` (scores made up)."
    from mlmclm.protocol.runs import sweep_settings
    from mlmclm.tasks.registry import TASKS
    with StoreWriter(store) as w:
        for e, run in study.finetune_jobs(plan):
            cfg = finetune_config(**launchers.finetune_params(plan, e, Path(store).parent))   # the settings rows record
            w.append([dict(checkpoint_name=run.checkpoint_name, dataset=d, family='IR' if d != 'sst2' else 'SC',
                           lr=run.lr, seed=run.seed, attention=run.attention, pooling=run.pooling,
                           precision=run.precision, precision_used=run.precision.replace('auto', 'fp32'), source='ours',
                           val_score=.5, test_score=.5, **sweep_settings(cfg, TASKS[run.train_task].max_length))
                       for d in run.datasets])


class _NoSlurm:
    def __init__(self, folder): pass
    def update_parameters(self, **kw): pass
    def map_array(self, fn, *args): return list(zip(*args))


def test_each_slurm_task_runs_the_keys_the_plan_counted(tmp_path, monkeypatch):
    "An array task carries its point (its cell, the plan's overrides); the sweep it starts asks for the keys the plan counted."
    monkeypatch.setattr('submitit.AutoExecutor', _NoSlurm)
    custom = study.protocol_ablation_plan(('hub/610m-clm-42k',), datasets=('sst2',), lrs=(1e-4,), seeds=(0,), pooling=('last',))
    fp32 = dataclasses.replace(_ablation('protocol'), finetune_overrides=dict(precision='fp32'))
    for plan in (_ablation('precision'), custom, fp32):   # custom: a plan no preset builds
        tasks = launchers.submit_finetune_array(plan, tmp_path, tmp_path/'slurm')
        assert len(tasks) == len(study.finetune_jobs(plan))
        for point, run, root, overrides in tasks:
            cfg = finetune_config(**launchers._job_params(point, run, root, overrides))
            lrs, seeds = finetune_grid(cfg)
            asked = finetune_runs(cfg.checkpoint_name, cfg.tasks.split(','), lrs, seeds, **{a: getattr(cfg, a) for a in PROTOCOL_AXES})
            assert [r.keys for r in asked] == [run.keys], (plan.preset, run)
    assert all(k.endswith('|precision=fp32') for _, r in study.finetune_jobs(fp32) for k in r.keys)
    with pytest.raises(ConfigError, match=r"\['precision'\] in the overrides of one job"):
        launchers.submit_finetune_array(custom, tmp_path, tmp_path/'slurm', overrides=dict(precision='fp32'))


@pytest.mark.parametrize('kind', list(ABLATIONS))
def test_a_finished_protocol_ablation_is_finished_for_every_launcher(tmp_path, monkeypatch, kind):
    plan, store = _ablation(kind), tmp_path/'results.jsonl'
    assert len(study.finetune_jobs(plan)) == 2 * 4              # (sst2, the IR group) x 4 protocol cells
    monkeypatch.setattr('submitit.AutoExecutor', _NoSlurm)
    before = launchers.submit_finetune_array(plan, tmp_path, tmp_path/'slurm')
    assert len(before) == len(study.finetune_jobs(plan))
    _store_every_run(plan, store)
    assert launchers.submit_finetune_array(plan, tmp_path, tmp_path/'slurm') == []                 # the Slurm array
    st = launchers.study_status(plan, tmp_path)
    assert st.query("stage == 'finetune'")[['done', 'to_do']].values.tolist() == [[len(before), 0]]   # study status
    launched = []
    monkeypatch.setattr(launchers, 'run_notebook', lambda *a: launched.append(a))
    for e in plan.evals: launchers._run_item(plan, tmp_path, 'finetune', e)                         # local workers
    assert launched == []
    monkeypatch.setattr(ft, 'check_checkpoint', lambda *a: None)
    monkeypatch.setattr(sw, 'base_model', lambda cfg: pytest.fail('the sweep trained a finished run'))
    for e in plan.evals:                                                                        # the sweep itself
        sw.finetune_sweep(finetune_config(**launchers.finetune_params(plan, e, tmp_path), progress=False))


# ---------------------------------------------------------------- a child run whose parent another worker trains
# Issue 34 item 10 (attack 3, N13): a second launcher on one study root, while a parent run trains in another worker,
# skips the child whose start checkpoint does not exist yet instead of dying in its notebook.
def _branching_plan():
    # tiny-clm-10k-mlm40-42k branches from tiny-clm-42k's full state at (scaled) step 10k
    return build_plan('unit', {'E1': ['tiny-clm-42k'], 'E3': ['tiny-clm-10k-mlm40-42k']}, ('rt_sentiment',), ('rt_sentiment',),
                      lrs=(1e-3,), seeds=(0,), step_scale=1 / 2000, pretrain_preset='demo', finetune_preset='demo',
                      pretrain_overrides=dict(seq_len=32, batch_size=4, lr=2e-3, data='embedded', log_every=5))


def test_a_child_whose_parent_another_worker_trains_is_skipped_not_crashed(tmp_path):
    plan = _branching_plan()
    child = plan.runs['tiny-clm-10k-mlm40-42k']
    assert child.parent == 'tiny-clm-42k' and child.branch_from
    assert _parent_in_other_hands(child, tmp_path, pretrain_params(plan, child, tmp_path)) is None          # nobody holds the parent: nothing to wait for
    held = PretrainRun('tiny-clm-42k', tmp_path).try_claim()             # a live worker trains the parent, no checkpoint yet
    assert held is not None
    try:
        assert _parent_in_other_hands(child, tmp_path, pretrain_params(plan, child, tmp_path)) == 'tiny-clm-42k'
        with pytest.warns(UserWarning, match='tiny-clm-10k-mlm40-42k: skipped for now: it starts from a checkpoint of tiny-clm-42k'):
            launch(plan, tmp_path, stages=('pretrain',), progress=False)   # before the fix: PapermillExecutionError
        assert not (tmp_path/'tiny-clm-10k-mlm40-42k').exists()            # the child did not start
        assert not list((tmp_path/'notebooks').glob('pretrain-tiny-clm-10k-*')) if (tmp_path/'notebooks').exists() else True
    finally:
        held.release()


# Issue 36 (item 3 of the review): the launcher computes a pretraining run's notebook parameters once.
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


# ---------------------------------------------------------------- a study resumed; one GPU a worker
def _tiny_plan():
    return build_plan('unit', {'E1': ['tiny-clm-42k', 'tiny-mlm40-42k']}, ('rt_sentiment',), ('rt_sentiment',),
                      lrs=(1e-3,), seeds=(0,), step_scale=1 / 2000,   # 42k steps -> 21, warmup/decay -> 1
                      pretrain_preset='demo', finetune_preset='demo',
                      pretrain_overrides=dict(seq_len=32, batch_size=4, lr=2e-3, data='embedded', save_every=10, log_every=5),
                      finetune_overrides=dict(max_steps=3, eval_every=3, max_eval_examples=20))


def test_launcher_skips_finished_runs_and_resumes_the_rest(tmp_path):
    plan = _tiny_plan()
    first = select(plan, pattern='tiny-clm-*')              # an "interrupted" study: only one branch got done
    launch(first, tmp_path, progress=False)
    done_nb, = (tmp_path/'notebooks').glob('pretrain-tiny-clm-42k-*.ipynb')      # named after its launcher (host, pid)
    stamp = done_nb.stat().st_mtime_ns
    assert (tmp_path/'tiny-clm-42k'/'done.json').is_file()
    assert not (tmp_path/'tiny-mlm40-42k').exists()
    launch(plan, tmp_path, progress=False)                   # the whole study: the rest runs, nothing is redone
    assert done_nb.stat().st_mtime_ns == stamp
    assert (tmp_path/'tiny-mlm40-42k'/'done.json').is_file()
    rows = read_rows(tmp_path/'results.jsonl')
    assert sorted(r['checkpoint_name'] for r in rows) == ['tiny-clm-42k', 'tiny-mlm40-42k']
    assert rows[0]['pretrain_run_id'] in ('tiny-clm-42k', 'tiny-mlm40-42k')   # pretraining metadata travels


def test_each_finetuning_worker_sees_its_own_gpu(tmp_path, monkeypatch):
    "Issue 25 item 13: one worker per GPU by default, each with its own CUDA_VISIBLE_DEVICES; more workers than GPUs refused."
    import mlmclm.study.launchers as launchers
    seen = []
    monkeypatch.setattr(launchers, '_walk', lambda *a, **k: seen.append(os.environ.get('CUDA_VISIBLE_DEVICES')))
    monkeypatch.setattr(launchers, 'visible_gpus', lambda: ['0', '1'])
    plan, before = _tiny_plan(), os.environ.get('CUDA_VISIBLE_DEVICES')
    launchers._finetune_helper(plan, tmp_path, None, '1')                  # what a spawned worker runs
    launchers._finetune_stage(plan, tmp_path, False, ['0'])                # the launcher itself: the first GPU
    assert seen == ['1', '0'] and os.environ.get('CUDA_VISIBLE_DEVICES') == before   # restored after each
    assert launchers.finetune_workers(None, launchers.visible_gpus()) == ['0', '1']
    with pytest.raises(ConfigError, match='workers=4 but this machine shows 2 GPU'):
        launch(plan, tmp_path, stages=('finetune',), workers=4)


# --------------------- pretraining on Slurm: what a single-node Slurm cannot show (tests/study/test_launchers_slurm.py)
def test_the_sbatch_files_say_nodes_gpus_time_partition_requeue_and_the_signal(tmp_path):
    from submitit.slurm.slurm import _make_sbatch_string
    spec = pretrain_job_specs(paper_plan(), tmp_path, nodes=4, gpus_per_node=8, timeout_min=2880, partition='gpu')[0]
    text = _make_sbatch_string(command='python -u -m submitit.core._submit /x', folder=tmp_path, **spec['slurm'])
    for line in ('--nodes=4', '--gpus-per-node=8', '--ntasks-per-node=8', '--time=2880', '--partition=gpu',
                 '--requeue', '--signal=USR2@180', f"--job-name=pretrain-{spec['run']}"):
        assert f'#SBATCH {line}\n' in text, line
    cfg = pretrain_config(**spec['params'])
    assert (cfg.global_batch, grad_accum(cfg.global_batch, cfg.batch_size, 32), cfg.run_id) == (2304, 6, spec['run'])
    assert cfg.out_dir == str(tmp_path) and cfg.data_subset == 'sample-350BT'
