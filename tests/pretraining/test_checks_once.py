"""A pretraining config is checked once on every path (issue 43 item 2): the papermill launcher checks it in its own
cell, so that bad input stops there, and hands the checked config to `pretrain`, which no longer checks it again;
`mlmclm pretrain run` (and each process of `accelerate launch`, which runs the same `main`) and `pretrain(cfg)` in
Python check it in `setup`. Counted here by wrapping `check_pretrain_config`, in this process and in the kernel.
Also the config checks of issue 49: N11 (a run id with control characters) and N28 (a huge moving-ratio phase)."""
import json
import re

import nbformat
import pytest

import mlmclm.pretraining.checks as checks
from mlmclm.base.configs import ConfigError
from mlmclm.base.files import project_root
from mlmclm.pretraining.loop import main, pretrain
from mlmclm.protocol.runs import pretrain_config
from mlmclm.protocol.schedules import Component

ROOT = project_root()
TINY = dict(size='tiny', schedule='clm', total_steps=2, seq_len=32, batch_size=4, warmup_steps=0, decay_steps=1,
            data='embedded', progress=False, prefetch=0, checkpoint_steps='', heldout_rows=0)


@pytest.fixture
def counted(monkeypatch):
    "The number of `check_pretrain_config` calls in this process."
    calls, real = [], checks.check_pretrain_config
    monkeypatch.setattr(checks, 'check_pretrain_config', lambda cfg: calls.append(cfg) or real(cfg))
    return calls


def test_pretrain_in_python_checks_once(tmp_path, counted):
    pretrain(pretrain_config(**TINY, out_dir=str(tmp_path), run_id='py'))
    assert len(counted) == 1


def test_the_command_line_checks_once(tmp_path, counted, capsys):
    "`mlmclm pretrain run` and `accelerate launch -m mlmclm.pretraining.loop run` (each process) go through `main`."
    main(['run', *(f'{k}={v}' for k, v in TINY.items()), f'out_dir={tmp_path}', 'run_id=cli'])
    assert len(counted) == 1


def test_a_checked_config_is_not_checked_again(tmp_path, counted):
    checked = checks.checked_pretrain(pretrain_config(**TINY, out_dir=str(tmp_path), run_id='checked'))
    pretrain(checked)
    assert len(counted) == 1


_COUNT = """import mlmclm.pretraining.checks as _checks
_calls, _real = [], _checks.check_pretrain_config
_checks.check_pretrain_config = lambda cfg: _calls.append(1) or _real(cfg)"""


def test_the_papermill_launcher_checks_once_and_early(tmp_path):
    """The launcher as the study runs it (papermill, a kernel of its own), with a first cell that counts the checks and
    a last that prints the count. It used to check twice: its own cell, then `setup`."""
    import papermill
    nb = nbformat.read(ROOT/'nbs'/'02_pretrain.ipynb', as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(_COUNT))
    nb.cells.append(nbformat.v4.new_code_cell("print('checks:', len(_calls))"))
    nbformat.write(nb, tmp_path/'counted.ipynb')
    out = papermill.execute_notebook(str(tmp_path/'counted.ipynb'), str(tmp_path/'out.ipynb'), progress_bar=False,
                                     parameters=dict(TINY, out_dir=str(tmp_path), run_id='pm'), cwd=str(ROOT))
    printed = ''.join(o.get('text', '') for o in out.cells[-1].outputs)
    assert printed == 'checks: 1\n', printed
    assert (tmp_path/'pm'/'done.json').is_file()
    with pytest.raises(papermill.PapermillExecutionError) as e:         # bad input stops in the check, before the Run cell
        papermill.execute_notebook(str(tmp_path/'counted.ipynb'), str(tmp_path/'bad.ipynb'), progress_bar=False,
                                   parameters=dict(TINY, schedule='clm:1,mlm40:2', out_dir=str(tmp_path), run_id='bad'),
                                   cwd=str(ROOT))
    assert 'has 3 steps but total_steps=2' in str(e.value)
    executed = json.loads((tmp_path/'bad.ipynb').read_text())['cells']
    failed = next(c for c in executed if any(o.get('output_type') == 'error' for o in c.get('outputs', [])))
    assert 'notebook_config' in ''.join(failed['source']) and not (tmp_path/'bad').exists()


def test_n11_a_run_id_with_control_characters_is_refused_before_any_work(tmp_path):
    "Its newlines and Markdown went raw into the model card `push` publishes (a fake '## Evaluation' section)."
    with pytest.raises(ConfigError, match=re.escape("run_id='base | 610m\\n\\n## Evaluation\\n\\n**GLUE 99.9**' holds "
                                                    "the control character '\\n'")):
        pretrain(pretrain_config(**TINY, out_dir=str(tmp_path), run_id='base | 610m\n\n## Evaluation\n\n**GLUE 99.9**'))
    assert list(tmp_path.iterdir()) == []


def test_n28_a_huge_moving_ratio_phase_is_checked_without_visiting_its_steps(monkeypatch):
    "The empty-micro-batch check visited every step: `mlm30to5:1000000000` spent 9 to 48 minutes before anything ran."
    visits = []
    real = Component.ratio_at
    monkeypatch.setattr(Component, 'ratio_at', lambda self, t: visits.append(t) or real(self, t))
    cfg = pretrain_config(schedule='mlm30to5:1000000', total_steps=10**6, data='embedded')
    assert [p.label for p in checks.check_pretrain_config(cfg)] == ['mlm30to5']
    assert len(visits) <= 10_000, len(visits)
    with pytest.raises(ConfigError, match=r'mask_ratio=0.01 \(mlm30to1, 1000000 steps\)'):   # and still refuses what it should
        checks.check_pretrain_config(pretrain_config(schedule='mlm30to1:1000000', total_steps=10**6, data='embedded',
                                                     batch_size=2, seq_len=16))
