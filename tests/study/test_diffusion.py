"""Issue 47 items 3 and 4: the data-constrained experiment's room (`mlmclm.study.diffusion`) run end to end at a toy
size, its summaries, its committed results (figures/diffusion) read back, and the paper-scale presets priced."""
import json
from pathlib import Path

import pandas as pd
import pytest

from mlmclm.base.configs import ConfigError
from mlmclm.base.files import project_root, read_jsonl
from mlmclm.model.sizes import flops_per_token, model_config
from mlmclm.pretraining.loop import pretrain
from mlmclm.results.store import read_results
from mlmclm.study.diffusion import (DataConstrained, best_epochs, collect, final_checkpoints, finetune_final_models,
                                    finetune_scores, finetune_summary, pretrain_configs, save_finetune, save_results, summarise)
from mlmclm.study.plan import Costs, DIFFUSION_EPOCHS, estimate, get_plan, pretrain_params

COMMITTED = project_root()/'figures'/'diffusion'


@pytest.fixture(scope='module')
def toy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('diffusion')
    exp = DataConstrained(objectives=('clm', 'vmlm', 'mdlm'), seeds=(0,), unique_rows=8, seq_len=32, epochs=2,
                          global_batch=4, eval_every=1, heldout_rows=8)
    for cfg in pretrain_configs(exp, tmp/'runs'): pretrain(cfg)
    return exp, tmp, save_results(exp, tmp/'runs', tmp/'dest')


def test_every_run_reads_the_same_budget_for_its_epochs(toy):
    exp, tmp, df = toy
    for cfg in pretrain_configs(exp, tmp/'runs'):
        data = json.loads((tmp/'runs'/cfg.run_id/'run.json').read_text())['data']
        assert (data['unique_tokens'], data['epochs'], data['heldout']['read_in_training']) == (256, 2.0, False)
    assert sorted(df.epoch.unique()) == [1.0, 2.0] and len(df) == 3 * 2


def test_the_common_measures_and_their_summaries(toy):
    exp, tmp, df = toy
    clm, mdlm = df[df.objective == 'clm'], df[df.objective == 'mdlm']
    assert (clm.nll == clm.own).all() and clm.mlm40.isna().all()          # CLM: its own loss is its NLL, no masked loss
    assert (mdlm.nll == mdlm.own).all() and mdlm.mlm15.notna().all()       # MDLM: its own loss is the bound
    vmlm = df[df.objective == 'vmlm']
    assert (vmlm.nll != vmlm.own).all()                                    # VMLM is scored on MDLM's bound too
    s = summarise(df, 'nll')
    row = s[(s.objective == 'vmlm') & (s.epoch == 2.0)].iloc[0]
    seeds = vmlm[vmlm.epoch == 2.0].nll
    assert (row['mean'], row.low, row.high, row.seeds) == (pytest.approx(seeds.mean()), seeds.min(), seeds.max(), 1)
    best = best_epochs(df)
    assert list(best.index) == ['clm', 'vmlm', 'mdlm'] and (best.best <= best['last']).all()
    summary = pd.read_csv(tmp/'dest'/'summary.csv')
    assert set(summary.measure) == {'own', 'nll', 'mlm40'}
    assert len(list((tmp/'dest'/'runs').glob('*/run.json'))) == 3


def test_bad_experiments_are_refused_before_any_run():
    with pytest.raises(ConfigError, match='unique_rows=100 is not a whole number of steps of global_batch=16'):
        DataConstrained(unique_rows=100)
    with pytest.raises(ConfigError, match="'mlm30to5' is not one plain phase"): DataConstrained(objectives=('mlm30to5',))
    with pytest.raises(ConfigError, match='epochs=0 and eval_every=2 must be >= 1'): DataConstrained(epochs=0)


@pytest.mark.skipif(not (COMMITTED/'results.csv').is_file(), reason='the experiment has not been committed')
def test_the_committed_results_are_what_their_runs_logged():
    "figures/diffusion: every result row is a held-out point of a committed run's metrics, with its run.json beside it."
    df = pd.read_csv(COMMITTED/'results.csv')
    record = json.loads((COMMITTED/'experiment.json').read_text())
    exp = DataConstrained(**{k: tuple(v) if isinstance(v, list) else v for k, v in record['settings'].items()})
    for (label, seed), g in df.groupby(['objective', 'seed']):
        folder = COMMITTED/'runs'/f'{label}-s{seed}'
        held = [m for m in read_jsonl(folder/'metrics.jsonl') if m.get('heldout_loss') is not None]
        assert [m['heldout_loss'] for m in held] == pytest.approx(g.own.tolist(), rel=1e-12)
        data = json.loads((folder/'run.json').read_text())['data']
        assert data['unique_tokens'] == exp.unique_rows * exp.seq_len and data['epochs'] == exp.epochs
    assert (COMMITTED/'heldout_by_epoch.png').is_file()


def test_the_final_models_are_fine_tuned_once_each_and_summarised(toy):
    "Every run's last checkpoint goes through the sweep under its own name; a second call trains nothing more."
    exp, tmp, _ = toy
    with pytest.raises(ConfigError, match='no final checkpoint at .*clm-s0/checkpoints/step-4.*pretrain the experiment first'):
        final_checkpoints(exp, tmp/'elsewhere')
    settings = dict(tasks='rt_sentiment', seeds='0', max_steps=1, max_eval_examples=8)
    rows = finetune_final_models(exp, tmp/'runs', tmp/'ft.jsonl', **settings)
    assert sorted(rows.checkpoint_name) == ['diffusion-clm-s0', 'diffusion-mdlm-s0', 'diffusion-vmlm-s0']
    assert rows.checkpoint.map(lambda c: Path(c).name).eq('step-4').all()
    written = sorted(p.name for p in (tmp/'ft.d').glob('*.scores.jsonl'))
    assert len(finetune_final_models(exp, tmp/'runs', tmp/'ft.jsonl', **settings)) == 3
    assert sorted(p.name for p in (tmp/'ft.d').glob('*.scores.jsonl')) == written   # nothing run, nothing written
    summary = save_finetune(rows, tmp/'dest')
    assert list(summary.columns) == ['objective', 'family', 'score', 'ci_low', 'ci_high', 'n'] and (summary.n == 1).all()


def test_the_summary_pools_both_seeds_with_a_t_interval():
    "Known answer: scores 0.5, 0.6, 0.7, 0.8 give 65 points, half-width t(0.975, 3) * sd / 2 = 3.182 * 12.91 / 2."
    scores = pd.DataFrame(dict(objective='mdlm', pretrain_seed=[0, 0, 1, 1], family='SC', seed=[0, 1, 0, 1],
                               test_score=[0.5, 0.6, 0.7, 0.8], n_datasets=1))
    row = finetune_summary(scores).iloc[0]
    assert (row.objective, row.family, row.n) == ('mdlm', 'SC', 4)
    assert (row.score, row.ci_high - row.score) == (pytest.approx(65.0), pytest.approx(20.54, abs=0.01))


@pytest.mark.skipif(not (COMMITTED/'finetune'/'summary.csv').is_file(), reason='the fine-tuning has not been committed')
def test_the_committed_fine_tuning_tables_are_what_its_store_holds(tmp_path):
    "figures/diffusion/finetune: 8 final models x 4 tasks x 3 seeds in the store, and both CSVs recomputed from it."
    rows = read_results(COMMITTED/'finetune'/'results.jsonl')
    assert rows.groupby(['checkpoint_name', 'dataset']).size().eq(3).all() and len(rows) == 96
    assert rows.checkpoint.str.endswith('step-192').all()
    save_finetune(rows, tmp_path)
    for name in ('scores.csv', 'summary.csv'):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path/'finetune'/name), pd.read_csv(COMMITTED/'finetune'/name))


def test_the_presets_form_the_budget_by_epochs_grid_and_are_priced():
    plans = {e: get_plan(f'diffusion-{e}ep') for e in DIFFUSION_EPOCHS}
    tokens = 42000 * 2304 * 1024
    for e, plan in plans.items():
        run = plan.runs['610m-mdlm-42k']
        assert pretrain_params(plan, run, Path('/s')).get('unique_tokens') == (None if e == 1 else tokens // e)
    costs = Costs()
    flops = estimate(plans[25], costs).set_index('run').flops
    assert flops['610m-vmlm-42k'] == pytest.approx(42000 * costs.tokens_per_step *
                                                   flops_per_token(model_config('610m'), costs.seq_len, 'vmlm'))
    assert '610m-clm-dec42k-mdlm-44k' in plans[1].runs and not any('dec42k' in r for r in plans[25].runs)
