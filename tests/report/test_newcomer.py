"""Issue 39, the newcomer's path, the README's part: the README's numbers are those of the committed results
(`.ci/docs.py` fills them in and fails when one changes), and its JupyterLab line starts as root and as a user. The
other tests of issue 39 are in their rooms (report/test_tables.py, report/test_render.py, report/test_figures.py,
package/test_cli.py) and in test_ci.py."""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from mlmclm.base.files import project_root
from mlmclm.results.store import read_results

ROOT = project_root()


# ---------------------------------------------------------------- item 4: the README's numbers come from the results

_spec = importlib.util.spec_from_file_location('docs', ROOT/'.ci'/'docs.py')
docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs)
REFERENCE = ROOT/'tests'/'fixtures'/'demo'   # the committed demo tables (never what a demo run writes)


def _page(name: str) -> str:
    "A guide page as committed (generated from its template by `.ci/docs.py readme`)."
    return (ROOT/'nbs'/'guide'/f'{name}.md').read_text(encoding='utf-8')


def test_the_readmes_numbers_are_those_of_the_committed_results():
    readme, demo, measured = (ROOT/'README.md').read_text(encoding='utf-8'), _page('demo'), _page('measurements')
    from mlmclm.report.render import split_control, study_scores
    scores = study_scores(split_control(read_results(REFERENCE/'results.csv'))[0]).set_index(['checkpoint', 'family'])
    clm = scores.loc[('tiny-clm-42k', 'TC')]
    for text in (readme, demo):
        assert f'| CLM | ' in text and f'{clm.score:.1f} ± {(clm.ci_high - clm.ci_low) / 2:.1f}' in text
    loss = pd.read_csv(REFERENCE/'pretrain_loss.csv').set_index('run')
    assert f"CLM reaches {loss.loc['tiny-clm-42k', 'final_loss']:.2f}" in readme             # the verdict's numbers
    assert f"MLM-40 at {loss.loc['tiny-mlm40-42k', 'final_loss']:.2f} nats/token" in readme
    assert f"CLM {loss.loc['tiny-clm-42k', 'final_loss']:.2f} training" in demo
    assert f"MLM-40 {loss.loc['tiny-mlm40-42k', 'final_loss']:.2f};" in measured      # the measured table: 7.09, not 7.10
    timings = json.loads((ROOT/'figures'/'demo'/'timings.json').read_text())
    demo_t, test_t = timings['demo'][0], timings['test'][0]
    assert f"the demo took {demo_t['minutes']:g} minutes at a load of {demo_t['load'][0]:g} to {demo_t['load'][1]:g}" in readme
    assert f"the tests {test_t['minutes']:g} minutes" in readme
    assert all(f"{e['minutes']:g} minutes" in demo for e in timings['demo'] + timings['test'])   # every measurement
    assert '20 to 45 minutes' not in readme and '16.5 min:' not in readme
    inter = read_results(REFERENCE/'results.csv')
    inter = inter[inter.checkpoint_name.str.fullmatch(r'tiny-.+-\d{3,}')]
    assert 'two intermediate ones on two tasks' in demo and inter.dataset.nunique() == 2
    assert "TC same sign, 75x larger" in demo
    assert f"over {read_results(REFERENCE/'results.csv').seed.nunique()} seeds" in readme


def test_check_readme_fails_when_a_committed_number_changes(tmp_path, monkeypatch, capsys):
    copy = tmp_path/'demo'; shutil.copytree(REFERENCE, copy)
    table = pd.read_csv(copy/'pretrain_loss.csv')
    table.loc[table.run == 'tiny-clm-42k', 'final_loss'] += 0.5
    table.to_csv(copy/'pretrain_loss.csv', index=False)
    monkeypatch.setattr(docs, 'DEMO', copy)
    assert docs.main(['check-readme']) == 1
    out = capsys.readouterr().out
    assert 'README.md is not what nbs/index.ipynb renders to' in out
    assert 'nbs/guide/demo.md is not what demo.md.in renders to' in out   # the guide page that carries the losses too
    monkeypatch.setattr(docs, 'DEMO', REFERENCE)
    assert docs.main(['check-readme']) == 0


def test_an_unknown_number_in_the_readme_is_an_error_naming_it():
    with pytest.raises(KeyError, match=r"\{\{nonsense\}\} in nbs/index.ipynb: no such number"):
        docs.fill('took {{nonsense}} minutes')
    newest = json.loads((ROOT/'figures'/'demo'/'timings.json').read_text())['demo'][0]
    assert docs.fill('{{timing demo}}') == f"{newest['minutes']:g} minutes at a load of {newest['load'][0]:g} to {newest['load'][1]:g}"
    with pytest.raises(KeyError, match=r"\{\{count lrs\}\}: no such count"): docs.fill('{{count lrs}}')


def test_the_developing_pages_jupyterlab_line_starts_as_root_and_as_a_user(tmp_path):
    line = re.search(r'`\.venv/bin/(jupyter lab [^`]*)`', _page('developing')).group(1).split()
    assert line[:2] == ['jupyter', 'lab'] and '--allow-root' in line
    jupyter = Path(sys.executable).parent/'jupyter'
    if not jupyter.is_file(): pytest.skip('JupyterLab is not installed beside this Python')
    args = [str(jupyter)] + line[1:-1] + [str(ROOT/'nbs'), '--no-browser', '--ServerApp.port=0',
                                          f'--ServerApp.root_dir={ROOT}', '--ServerApp.token=x']
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path/'rt'), JUPYTER_CONFIG_DIR=str(tmp_path/'cfg'), HOME=str(tmp_path))
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    seen, deadline = [], time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            out = p.stdout.readline()
            if not out and p.poll() is not None: break
            seen.append(out)
            if 'is running at' in out or 'http://127.0.0.1:' in out: break
    finally:
        p.terminate()
        try: p.wait(timeout=30)
        except subprocess.TimeoutExpired: p.kill(); p.wait()
    assert any('http://127.0.0.1:' in s or 'is running at' in s for s in seen), ''.join(seen)[-2000:]


def test_the_verdicts_stated_are_those_that_hold_under_both_numerics():
    "Issue 45 item 2: the README states no verdict `claims.csv` marks fragile; the demo page names each fragile one."
    import pandas as pd
    claims = pd.read_csv(ROOT/'figures'/'demo'/'compare'/'numerics'/'claims.csv')
    readme, demo = (ROOT/'README.md').read_text(encoding='utf-8'), _page('demo')
    assert 'the best pretrained model beats the control' not in readme and 'a pretrained model beats the control' in readme
    assert claims.loc[claims.claim.str.contains('some pretrained model beats'), 'robust'].all()
    assert f'{int(claims.robust.sum())} of {len(claims)} hold under both' in demo
    for claim in claims[~claims.robust].claim: assert f'"{claim}"' in demo, claim
    with pytest.raises(KeyError, match='numerics nonsense'): docs.numerics('nonsense')


def test_the_readmes_diffusion_numbers_are_those_of_the_committed_experiment():
    "Issue 47: the README's held-out NLLs are figures/diffusion/summary.csv's, each objective with its seeds' range."
    summary = pd.read_csv(ROOT/'figures'/'diffusion'/'summary.csv').query("measure == 'nll'").set_index('objective')
    readme = (ROOT/'README.md').read_text(encoding='utf-8')
    for what in ('setup', 'best', 'last'): assert docs.diffusion(what) in readme, what
    clm, mdlm = summary.loc['clm'], summary.loc['mdlm']
    assert f"CLM {clm['last']:.2f} [{clm.last_low:.2f}, {clm.last_high:.2f}]" in readme
    assert f"MDLM {mdlm.best:.2f} [{mdlm.best_low:.2f}, {mdlm.best_high:.2f}] at epoch {int(mdlm.best_epoch)}" in readme
    with pytest.raises(KeyError, match='diffusion nonsense'): docs.diffusion('nonsense')
