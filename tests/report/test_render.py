"""Issue 36 item 1 (the figure registry, the dataset family, the planner's fine-tuning price).

Figures are rows of `mlmclm.report.render.FIGURES` that `render_all`, the tests and the docs read; a dataset's family and
whether it counts in a family mean come from the task table (`mlmclm.tasks.registry.TASKS`) only; a measured fine-tuning speed
prices only the model size it was measured on, and the plan says which figure priced what."""
import dataclasses
import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

import mlmclm.report.render as render
from mlmclm import study, study_cli, task_data, tasks
from mlmclm.base.configs import ConfigError
from mlmclm.base.files import atomic_write_json, project_root
from mlmclm.report.render import FIGURES, FigureSpec, render_all
from mlmclm.results.paper_runs import in_paper, paper_rows
from mlmclm.results.aggregation import family_scores
from mlmclm.results.store import read_results
from mlmclm.protocol.paper import EMBEDDED_TASKS

DEMO = project_root()/'figures'/'demo'
REFERENCE = Path(__file__).parents[1]/'fixtures'/'demo'   # the committed demo results (the demo rewrites figures/demo/*.csv)
SMOLLM2_BODY = 106_203_456   # SmolLM2-135M: 30 blocks of d=576, 1536-wide MLP, 9 heads / 3 KV heads, and the final norm


# ------------------------------------------------------------------------------------------- the dataset family

def test_the_demo_datasets_are_priced_as_their_own_families():
    "`study._family` called corpus_names and corpus_speaker SC (64 tokens an example) and priced 1,000 steps of 32."
    assert [study.dataset_family(d) for d in EMBEDDED_TASKS] == ['SC', 'TC', 'QA', 'IR']
    one = study.demo_plan(datasets=('corpus_speaker',), control=False)
    n, per_example = study.shipped_examples('corpus_speaker', 192)   # its real examples, tokens cut at the task's 192
    per_run = 6 * study.body_params('tiny') * (n // 8) * 8 * per_example   # one epoch of 8 a step (issue 36: as it ships)
    assert study.finetune_flops(one) == pytest.approx(len(one.evals) * len(one.lrs) * len(one.seeds) * per_run, rel=1e-12)


def test_a_dataset_the_task_table_lacks_is_an_error_not_an_sc_guess():
    with pytest.raises(ConfigError, match="dataset 'my_sc' is not in the task table; choose from"):
        study.finetune_flops(study.demo_plan(datasets=('rt_sentiment', 'my_sc')))


def test_the_papers_plan_prices_fine_tuning_as_before():
    """Nothing was asked to change for the paper: the same FLOPs to the last bit (values from before the registry, with
    the authors' 26-layer 1b; the 28-layer shape gave 2.391058735792128e+20)."""
    assert study.finetune_flops(study.paper_plan()) == 2.287070783963136e+20
    assert study.finetune_flops(study.get_plan('protocol-ablation')) == 5.546574941257728e+19


def _rows(datasets):
    return pd.DataFrame([dict(checkpoint_name='610m-mlm40-42k', dataset=d, family='SC', lr=1e-4, seed=s, val_score=.5,
                              test_score=score) for d, score in datasets for s in range(3)])


def test_a_new_sc_dataset_joins_the_sc_mean_only_when_the_task_table_says_so(monkeypatch):
    rows = _rows([('sst2', .8), ('my_sc', .2)])
    monkeypatch.setitem(tasks.TASKS, 'my_sc', tasks.Task('my_sc', 'SC', 'sequence', task_data.embedded_sentiment))
    assert family_scores(paper_rows(rows)).score.tolist() == pytest.approx([.8])       # registered, not in_paper
    monkeypatch.setitem(tasks.TASKS, 'my_sc', dataclasses.replace(tasks.TASKS['my_sc'], in_paper=True))
    assert family_scores(paper_rows(rows)).score.tolist() == pytest.approx([.5])       # now it counts
    assert not in_paper('qed') and in_paper('squad') and in_paper('rt_sentiment')       # the importer's flag


# --------------------------------------------------------------------------------- the planner's fine-tuning price

def _bench(folder: Path, model: str, body_params: int, examples_per_s: float = 8.0):
    atomic_write_json(folder/f'finetune-rt_sentiment-{Path(model).name}.json', dict(
        device='cpu (1 threads)', model=model, steps=1, batch_size=32, body_params=body_params,
        sides=[dict(side='ours packed', examples_per_s=examples_per_s, real_tokens=800)]))


def test_a_speed_measured_on_smollm2_does_not_price_the_demos_tiny_models(tmp_path):
    _bench(tmp_path, 'runs/smollm2/SmolLM2-135M', SMOLLM2_BODY)
    line = study_cli.measured_finetune_line(study.demo_plan(), folder=tmp_path)
    assert line.startswith('  fine-tuning at the assumed MFU above for tiny: the benchmark measured another model size '
                           '(8.0 examples/s of SmolLM2-135M (106,203,456 body parameters)'), line
    assert 'hours' not in line and 'minutes' not in line and '--size tiny' in line


def test_a_speed_measured_on_the_plans_size_prices_it_and_the_line_says_so(tmp_path):
    _bench(tmp_path, 'tiny', study.body_params('tiny'))
    demo = study.demo_plan()
    hours = study.finetune_flops(demo) / (6 * study.body_params('tiny') * 25 * 8.0) / 3600
    line = study_cli.measured_finetune_line(demo, folder=tmp_path)
    assert line.startswith(f'  fine-tuning at the measured speed for tiny: {hours:,.0f} hours on cpu (1 threads) '
                           '(8.0 examples/s of tiny (787,584 body parameters), ours packed;'), line
    assert 'assumed MFU' in study_cli.measured_finetune_line(study.paper_plan(), folder=tmp_path)   # tiny prices no paper size


# ------------------------------------------------------------------------------------------- the figure registry

def test_render_all_draws_the_rows_of_the_registry(monkeypatch, tmp_path):
    "A figure added to the registry is drawn and saved by `render_all`; nothing else is drawn."
    def toy(scores, scale):
        fig, ax = plt.subplots()
        ax.set_title(f'{len(scores)} scores at {scale} scale')
        return fig
    saved = []
    monkeypatch.setattr(render, 'FIGURES', {'figT_toy': FigureSpec('figT_toy', toy, ('scores', 'scale'), None)})
    monkeypatch.setattr(render, 'save_figure', lambda fig, folder, name, close=True: saved.append(
        (name, fig.axes[0].get_title())) or [])
    render_all(read_results(REFERENCE/'results.csv'), tmp_path, 'demo')
    assert len(saved) == 1 and saved[0][0] == 'figT_toy' and re.fullmatch(r'\d+ scores at demo scale', saved[0][1])
    plt.close('all')


def test_the_docs_show_the_registrys_demo_figures():
    "The figures notebook lists every figure the demo carries, in the registry's order; the README's are among them."
    nb = json.loads((project_root()/'nbs'/'report'/'00_figures.ipynb').read_text(encoding='utf-8'))
    listed = [m for c in nb['cells'] if c['cell_type'] == 'markdown' and 'Every figure of the committed demo' in ''.join(c['source'])
              for m in re.findall(r'\]\(\.\./\.\./figures/demo/(\w+)\.png\)', ''.join(c['source']))]
    assert listed == [n for n, f in FIGURES.items() if f.demo]
    assert all((DEMO/f'{n}.png').is_file() and (DEMO/f'{n}.pdf').is_file() for n in listed)
    index = json.loads((project_root()/'nbs'/'index.ipynb').read_text(encoding='utf-8'))
    shown = [m for c in index['cells'] for m in re.findall(r'!\[([^\]]*)\]\(figures/demo/(\w+)\.png\)', ''.join(c['source']))]
    assert shown and all(FIGURES[name].demo and FIGURES[name].paper == alt for alt, name in shown), shown
