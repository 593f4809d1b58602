"""Issue 37 item 3: checkpoint merging as a baseline (`mlmclm.model.checkpoints.merge_checkpoints`, `mlmclm merge`, the `merging`
preset of `mlmclm.study.plan`)."""
import dataclasses
import json
import os
import shutil

import pytest
import torch

from mlmclm.cli import main as cli_main
from mlmclm.base.configs import ConfigError, build_config
from mlmclm.base.files import read_json
from mlmclm.model.transformer import build_model
from mlmclm.model.checkpoints import load, merge_checkpoints, merge_record, parity_error, save
from mlmclm.protocol.runs import finetune_config
from mlmclm.study.launchers import finetune_params, launch, make_merges
from mlmclm.study.plan import PRESETS, finetune_jobs, get_plan, merge_dir, merging_plan, select
from mlmclm.study.commands import describe

TINY = dict(vocab_size=97, bos_token_id=None, eos_token_id=None, pad_token_id=None, mask_token_id=None)


def _model(seed, **kw):
    torch.manual_seed(seed)
    return build_model('tiny', **{**TINY, **kw}).eval()


@pytest.fixture
def parents(tmp_path):
    "Two tiny checkpoints of one shape with different weights, folders named like released models."
    a, b = _model(0), _model(1)
    return (a, save(a, tmp_path/'tiny-clm-42k', is_causal=True)), (b, save(b, tmp_path/'tiny-mlm40-42k', is_causal=False))


def _equal(x: dict, y: dict) -> bool:
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize('weights', [(0.5, 0.5), (0.3, 0.7), (0.2, 0.3, 0.5), (1 / 3, 1 / 3, 1 / 3)])
def test_a_checkpoint_merged_with_itself_comes_back_bit_identically(parents, tmp_path, weights):
    (a, ck), _ = parents
    out = merge_checkpoints(tmp_path/'m', [(ck, w) for w in weights])
    assert _equal(load(out).state_dict(), a.state_dict())
    assert json.loads((out/'config.json').read_text()) == json.loads((ck/'config.json').read_text())


def test_weights_one_and_zero_give_the_first(parents, tmp_path):
    (a, ca), (b, cb) = parents
    assert _equal(load(merge_checkpoints(tmp_path/'m1', [(ca, 1), (cb, 0)])).state_dict(), a.state_dict())
    assert _equal(load(merge_checkpoints(tmp_path/'m2', [(ca, 0), (cb, 1)])).state_dict(), b.state_dict())


def test_an_even_merge_is_the_average_of_the_tensors(parents, tmp_path):
    (a, ca), (b, cb) = parents
    merged = load(merge_checkpoints(tmp_path/'m', [(ca, 0.5), (cb, 0.5)])).state_dict()
    sa, sb = a.state_dict(), b.state_dict()
    assert not torch.equal(sa['model.norm.weight'], sb['model.norm.weight']) or not torch.equal(
        sa['model.layers.0.mlp.up_proj.weight'], sb['model.layers.0.mlp.up_proj.weight'])
    for k in sa: torch.testing.assert_close(merged[k], (sa[k] + sb[k]) / 2, rtol=0, atol=1e-7)
    rec = merge_record(tmp_path/'m')
    assert [(p['checkpoint'], p['weight']) for p in rec['parents']] == [(str(ca), 0.5), (str(cb), 0.5)]
    assert rec['weights_sum'] == 1.0 and rec['is_causal'] is True   # equal weights: the first parent's mode


def test_the_heaviest_parent_gives_the_attention_mode_unless_it_is_asked(parents, tmp_path):
    (_, ca), (_, cb) = parents
    assert load(merge_checkpoints(tmp_path/'m1', [(ca, 0.25), (cb, 0.75)])).config.is_causal is False
    assert load(merge_checkpoints(tmp_path/'m2', [(ca, 0.25), (cb, 0.75)], is_causal=True)).config.is_causal is True


@pytest.mark.parametrize('field, change', [('num_hidden_layers', 3), ('vocab_size', 101), ('rope_theta', 500000.0),
                                           ('mask_token_id', 5)])
def test_checkpoints_of_different_shapes_are_refused_naming_the_field(parents, tmp_path, field, change):
    (_, ca), _ = parents
    other = save(_model(2, **{field: change}), tmp_path/'other')
    with pytest.raises(ConfigError, match=f'different shapes or tokenizers; they differ in\n  {field}: '):
        merge_checkpoints(tmp_path/'m', [(ca, 0.5), (other, 0.5)])
    assert not (tmp_path/'m').exists() and not list(tmp_path.glob('.m.tmp-*'))


def test_checkpoints_of_different_tokenizers_are_refused_naming_the_file(tmp_path):
    from mlmclm.data.tokenizers import load_tokenizer
    tok = load_tokenizer()
    a = save(build_model('tiny', vocab_size=len(tok)), tmp_path/'a', tokenizer=tok)
    b = save(build_model('tiny', vocab_size=len(tok)), tmp_path/'b', tokenizer=tok)
    vocab = json.loads((b/'tokenizer.json').read_text())
    vocab['model']['vocab'] = {(k + 'x' if i == 100 else k): v for i, (k, v) in enumerate(vocab['model']['vocab'].items())}
    (b/'tokenizer.json').write_text(json.dumps(vocab))
    with pytest.raises(ConfigError, match='tokenizer file tokenizer.json: '):
        merge_checkpoints(tmp_path/'m', [(a, 0.5), (b, 0.5)])
    out = merge_checkpoints(tmp_path/'ok', [(a, 0.5), (a, 0.5)])   # one tokenizer: the merge carries it
    assert (out/'tokenizer.json').read_bytes() == (a/'tokenizer.json').read_bytes()
    assert len(load_tokenizer(str(out))) == len(tok)


def test_weights_must_sum_to_one_unless_any_sum(parents, tmp_path):
    (a, ca), (b, cb) = parents
    with pytest.raises(ConfigError, match=r'merge weights \[1.0, 1.0\] sum to 2, not 1'):
        merge_checkpoints(tmp_path/'m', [(ca, 1), (cb, 1)])
    out = merge_checkpoints(tmp_path/'m', [(ca, 1), (cb, 1)], any_sum=True)    # task arithmetic: as given, recorded
    sa, sb, merged = a.state_dict(), b.state_dict(), load(out).state_dict()
    for k in sa: torch.testing.assert_close(merged[k], sa[k] + sb[k], rtol=0, atol=1e-6)
    assert merge_record(out)['weights_sum'] == 2.0
    with pytest.raises(ConfigError, match='must be finite'):
        merge_checkpoints(tmp_path/'n', [(ca, float('nan')), (cb, 1)])
    with pytest.raises(ConfigError, match='exists already'):
        merge_checkpoints(out, [(ca, 0.5), (cb, 0.5)])


def test_the_merge_loads_in_plain_transformers(parents, tmp_path):
    from transformers import AutoModelForCausalLM
    (_, ca), (_, cb) = parents
    out = merge_checkpoints(tmp_path/'m', [(ca, 0.6), (cb, 0.4)])
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    x = torch.randint(0, 97, (2, 12))
    assert type(hf).__name__ == 'LlamaForCausalLM'
    assert parity_error(load(out).eval(), hf, x, is_causal=True) < 1e-4


def test_the_merge_is_the_init_from_of_a_pretraining_run(tmp_path):
    "A 2-step tiny run starts from the merge: it records it, and ends nearer the merge than either parent."
    from mlmclm.data.tokenizers import load_tokenizer
    from mlmclm.protocol.runs import PretrainConfig
    from mlmclm.pretraining.loop import pretrain
    tok = load_tokenizer()
    torch.manual_seed(0); a = save(build_model('tiny', vocab_size=len(tok)), tmp_path/'a', tokenizer=tok)
    torch.manual_seed(1); b = save(build_model('tiny', vocab_size=len(tok)), tmp_path/'b', tokenizer=tok)
    merged = merge_checkpoints(tmp_path/'merged', [(a, 0.5), (b, 0.5)])
    cfg = build_config(PretrainConfig, dict(size='tiny', schedule='clm', total_steps=2, seq_len=32, batch_size=4,
                                            warmup_steps=1, decay_steps=1, data='embedded', progress=False, prefetch=0,
                                            log_every=1, out_dir=str(tmp_path/'runs'), run_id='cpt', init_from=str(merged)))
    run = pretrain(cfg)
    final = run/'checkpoints'/'step-2'
    assert read_json(final/'mlmclm.json')['init_from'] == str(merged)
    trained, sm, sa, sb = (load(f).state_dict() for f in (final, merged, a, b))
    dist = lambda x, y: sum((x[k] - y[k]).pow(2).sum().item() for k in x) ** 0.5
    assert dist(trained, sm) < min(dist(trained, sa), dist(trained, sb)) / 5


def test_the_merge_command(parents, tmp_path, capsys):
    (a, ca), (b, cb) = parents
    assert cli_main(['merge', str(tmp_path/'m'), f'{ca}:0.25', f'{cb}:0.75']) == 0
    assert f'0.25 x {ca} + 0.75 x {cb} (bidirectional)' in capsys.readouterr().out
    assert [p['weight'] for p in merge_record(tmp_path/'m')['parents']] == [0.25, 0.75]
    assert cli_main(['merge', str(tmp_path/'even'), str(ca), str(cb)]) == 0               # no weights: equal ones
    assert [p['weight'] for p in merge_record(tmp_path/'even')['parents']] == [0.5, 0.5]
    with pytest.raises(SystemExit) as e: cli_main(['merge', str(tmp_path/'x'), f'{ca}:0.5', f'{cb}:0.6'])
    assert e.value.code == 2 and 'sum to 1.1, not 1' in capsys.readouterr().err


def test_the_merging_preset_plans_and_prices(tmp_path):
    plan = get_plan('merging')
    assert 'merging' in PRESETS and plan.runs == {} and len(plan.merges) == 3
    text = describe(plan)
    assert 'fine-tuning runs            360' in text and 'merged checkpoints            3' in text, text
    assert 'pretraining   0.000e+00 FLOPs' in text and 'fine-tuning   0.000e+00' not in text
    for e in plan.evals:
        p = finetune_params(plan, e, tmp_path)
        assert p['checkpoint'] == str(tmp_path/'merges'/e.name) and p['checkpoint_name'] == e.name
        cfg = finetune_config(**p)
        assert cfg.max_steps is None and cfg.tasks == ','.join(e.datasets)
    assert len({k for _, r in finetune_jobs(plan) for k in r.keys}) == 360
    assert select(plan, experiments=['merging']).merges == plan.merges


def test_the_plan_makes_its_merges_first_once_and_whole(parents, tmp_path, monkeypatch):
    import mlmclm.study.launchers as launchers
    (_, ca), (_, cb) = parents
    plan = merging_plan((ca, cb), weights=(0.25, 0.5), datasets=('rt_sentiment',), lrs=(1e-3,), seeds=(0,))
    seen = []
    monkeypatch.setattr(launchers, '_finetune_stage', lambda plan, root, *a: seen.append(sorted(p.name for p in (root/'merges').iterdir())))
    root = launch(plan, tmp_path/'study', stages=('finetune',), progress=False)
    assert seen == [sorted(plan.merges)]                      # made before any fine-tuning
    m = plan.merges[plan.evals[0].name]
    folder = merge_dir(root, m.name)
    assert [(p['checkpoint'], p['weight']) for p in merge_record(folder)['parents']] == [(str(ca), 0.25), (str(cb), 0.75)]
    stamp = (folder/'model.safetensors').stat().st_mtime_ns
    make_merges(plan, root)                                   # found, not redone
    assert (folder/'model.safetensors').stat().st_mtime_ns == stamp
    # a merge killed while writing leaves no folder: the next call makes it whole
    shutil.rmtree(folder)
    monkeypatch.setattr('mlmclm.model.checkpoints.save', lambda *a, **k: (_ for _ in ()).throw(OSError('disk gone')))
    with pytest.raises(OSError, match='disk gone'): make_merges(plan, root)
    assert not folder.exists() and not list(folder.parent.glob('.*'))
    monkeypatch.undo()
    make_merges(plan, root)
    assert load(folder) is not None
    # a folder holding another merge is not taken for the plan's
    other = dataclasses.replace(plan, merges={m.name: dataclasses.replace(m, parents=((str(ca), 0.5), (str(cb), 0.5)))})
    with pytest.raises(ConfigError, match='holds another merge than the plan'):
        make_merges(other, root)


def test_a_merge_is_fine_tuned_as_an_evaluation_point_of_the_plan(tmp_path):
    "End to end through `launch` and the fine-tuning notebook: the plan merges, then fine-tunes the merge by its name."
    from mlmclm.data.tokenizers import load_tokenizer
    from mlmclm.results.store import read_rows
    tok = load_tokenizer()
    folders = []
    for seed, name in enumerate(('tiny-clm-42k', 'tiny-mlm40-42k')):
        torch.manual_seed(seed)
        folders.append(save(build_model('tiny', vocab_size=len(tok)), tmp_path/name, tokenizer=tok))
    plan = dataclasses.replace(merging_plan(tuple(folders), weights=(0.5,), datasets=('rt_sentiment',), lrs=(1e-3,), seeds=(0,)),
                               finetune_preset='demo', finetune_overrides=dict(max_steps=3, eval_every=3, max_eval_examples=20))
    root = launch(plan, tmp_path/'study', progress=False)
    name = 'merge-tiny-clm-42k-x0.5-tiny-mlm40-42k-x0.5'
    rows = read_rows(root/'results.jsonl')
    assert [(r['checkpoint_name'], r['dataset'], r['checkpoint']) for r in rows] == [(name, 'rt_sentiment', str(root/'merges'/name))]
    assert merge_record(root/'merges'/name)['parents'][1]['checkpoint'] == str(folders[1])


def test_a_run_of_the_plan_continues_pretraining_from_a_merge(tmp_path):
    "A planned run with `init_merge`: the plan makes the merge, then pretrains from it (the run records it as init_from)."
    from mlmclm.data.tokenizers import load_tokenizer
    from mlmclm.study.plan import EvalPoint, Merge, PlannedRun, StudyPlan, pretrain_params
    from mlmclm.protocol.run_names import parse_run_name
    tok = load_tokenizer()
    folders = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        folders.append(save(build_model('tiny', vocab_size=len(tok)), tmp_path/f'p{seed}', tokenizer=tok))
    m = Merge('merge-p0-p1', ((str(folders[0]), 0.5), (str(folders[1]), 0.5)), 'tiny')
    run = PlannedRun('tiny-mlm40-2k', parse_run_name('tiny-mlm40-2k'), {'cpt'}, init_merge=m.name)
    point = EvalPoint(run.name, run.name, run.total_steps, ('rt_sentiment',))
    plan = StudyPlan('unit', {run.name: run}, [point], (1e-3,), (0,), step_scale=1 / 1000, pretrain_preset='demo',
                     pretrain_overrides=dict(seq_len=32, batch_size=4, data='embedded', log_every=1), merges={m.name: m})
    root = tmp_path/'study'
    p = pretrain_params(plan, run, root)
    assert (p['init_from'], p['total_steps'], p['warmup_steps'], p['decay_steps']) == (str(root/'merges'/m.name), 2, 1, 1)
    assert select(plan, pattern='tiny-*').merges == {m.name: m}   # a selection keeps the merges its runs start from
    launch(plan, root, stages=('pretrain',), progress=False)
    meta = read_json(root/run.name/'checkpoints'/'step-2'/'mlmclm.json')
    assert meta['init_from'] == str(root/'merges'/m.name) and merge_record(root/'merges'/m.name) is not None


def test_a_slurm_array_of_merges_makes_them_before_it_submits(parents, tmp_path, monkeypatch):
    "The array's tasks fine-tune the merged folders, which exist when the array is submitted."
    import mlmclm.study.launchers as launchers

    class NoSlurm:
        def __init__(self, folder): pass
        def update_parameters(self, **kw): pass
        def map_array(self, fn, *args): return list(zip(*args))

    monkeypatch.setattr('submitit.AutoExecutor', NoSlurm)
    (_, ca), (_, cb) = parents
    plan = merging_plan((ca, cb), weights=(0.25,), datasets=('sst2',), lrs=(1e-4,), seeds=(0,))
    tasks = launchers.submit_finetune_array(plan, tmp_path/'study', tmp_path/'slurm')
    assert len(tasks) == 1
    point, run, root, overrides = tasks[0]
    cfg = finetune_config(**launchers._job_params(point, run, root, overrides))
    assert cfg.checkpoint == str(tmp_path/'study'/'merges'/plan.evals[0].name)
    assert [p['weight'] for p in merge_record(cfg.checkpoint)['parents']] == [0.25, 0.75]


def test_a_run_from_an_unknown_merge_is_refused_naming_it(tmp_path):
    from mlmclm.study.plan import PlannedRun, StudyPlan
    from mlmclm.protocol.run_names import parse_run_name
    run = PlannedRun('tiny-mlm40-2k', parse_run_name('tiny-mlm40-2k'), {'cpt'}, init_merge='merge-nowhere')
    plan = StudyPlan('unit', {run.name: run}, [], (1e-3,), (0,))
    with pytest.raises(ConfigError, match=r"init_merge='merge-nowhere' names no merge of the plan; its merges: \[\]"):
        make_merges(plan, tmp_path)
