"""The public face (issue 43 item 7): the names a user calls are importable from `mlmclm` itself and stay there; every
name a module of release 0.1 exported still works at its old path, with a DeprecationWarning naming the new one."""
import importlib
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import mlmclm

ROOT = Path(__file__).resolve().parents[2]
OLD_NAMES = json.loads((ROOT/'tests'/'fixtures'/'public_0.1.json').read_text())   # each 0.1 module's __all__

# the public face, pinned: a change here is a change of the package's interface, made on purpose
FACE = ['FAMILIES', 'FIGURES', 'FINETUNE_OPTIONS', 'FigureSpec', 'FinetuneConfig', 'ModelConfig', 'OBJECTIVES', 'Objective',
        'PAPER_TASKS', 'Phase', 'PretrainConfig', 'TASKS', 'Task', 'TaskModel', 'Transformer', 'aggregate',
        'bootstrap_intervals', 'build_model', 'build_store', 'compact', 'demo_plan', 'describe', 'estimate',
        'family_scores', 'finetune_config', 'finetune_preset', 'finetune_run', 'finetune_sweep', 'get_plan', 'import_tree',
        'launch', 'load', 'load_results', 'load_task', 'load_tokenizer', 'memory_estimate', 'merge_checkpoints',
        'missing', 'model_config', 'open_store', 'paper_plan', 'parse_run_name', 'parse_schedule', 'pretrain',
        'pretrain_config', 'pretrain_preset', 'protocol_cell', 'rank_store', 'read_examples', 'read_results', 'read_rows',
        'register_with_transformers', 'render_all', 'reported_scores', 'results_tables', 'run_name', 'save', 'select_lr']


def test_the_public_face_is_pinned():
    assert sorted(mlmclm.PUBLIC) == FACE and mlmclm.__all__ == FACE


@pytest.mark.parametrize('name', FACE)
def test_each_public_name_is_its_rooms_own(name):
    "`mlmclm.<name>` is the object its room defines (not a copy), and that room defines it (not re-exports it)."
    room = importlib.import_module(f'mlmclm.{mlmclm.PUBLIC[name]}')
    assert getattr(mlmclm, name) is getattr(room, name)
    assert name in room.__all__


def test_importing_the_face_loads_no_torch():
    code = ('import sys, mlmclm; from mlmclm import PretrainConfig, FinetuneConfig, get_plan, load_results, family_scores; '
            'print(sorted(m for m in ("torch", "transformers") if m in sys.modules))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '[]'


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'mlmclm' has no attribute 'pretrian'"): mlmclm.pretrian
    with pytest.raises(ImportError): exec('from mlmclm import pretrian', {})


@pytest.mark.parametrize('old', sorted(set(OLD_NAMES) - {'cli'}))   # mlmclm.cli did not move
def test_every_name_of_0_1_works_at_its_old_path_with_a_warning(old):
    "Each name resolves where it went, with a warning naming that place (the lookup itself: an old module caches a "
    "name once warned, so a test run that imported it earlier would see no second warning at the import)."
    module = importlib.import_module(f'mlmclm.{old}')
    for name in OLD_NAMES[old]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            value = mlmclm.moved_name(old, name)
        moved = [w for w in caught if issubclass(w.category, DeprecationWarning)]
        assert moved, f'mlmclm.{old}.{name}: no DeprecationWarning'
        new = str(moved[0].message).split(' moved to ')[1].split(';')[0]
        home, _, attr = new.rpartition('.')
        assert value is getattr(importlib.import_module(home), attr) is getattr(module, name), (old, name, new)


def test_an_old_import_warns_once_then_reads_the_name_where_it_was_put():
    code = ('import warnings; warnings.simplefilter("always")\n'
            'with warnings.catch_warnings(record=True) as w:\n'
            '    from mlmclm.store import open_store\n    from mlmclm.store import open_store as again\n'
            'print(len([x for x in w if issubclass(x.category, DeprecationWarning)]), open_store is again)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.split() == ['1', 'True'], out.stderr


def test_the_old_paths_cover_every_module_of_0_1():
    assert set(OLD_NAMES) <= set(mlmclm.MOVED) | {'cli'}


def test_an_old_command_module_still_runs_its_command():
    "`python -m mlmclm.store verify ...` of 0.1 runs the token store's command, and says where it went."
    out = subprocess.run([sys.executable, '-m', 'mlmclm.store', '--help'], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert 'build-store' in out.stdout
    assert 'python -m mlmclm.store is now python -m mlmclm.data.token_store' in out.stderr


def test_a_public_function_that_was_a_module_stays_callable():
    "0.1 had a module `mlmclm.pretrain`; 0.2's `mlmclm.pretrain` is the function. Old code importing the module first "
    "must not turn `mlmclm.pretrain(...)` into a module call error."
    code = ('import warnings; warnings.simplefilter("ignore"); import mlmclm.pretrain, mlmclm; '
            'from mlmclm.pretraining.loop import pretrain; '
            'print(callable(mlmclm.pretrain), mlmclm.pretrain.pretrain is pretrain)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.split() == ['True', 'True'], out.stderr
