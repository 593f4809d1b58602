"""One table per head kind (issue 26 item 5): every kind has every part, and works end to end through them; nothing
outside the tables compares kinds; each earlier-mlmclm option branches in one function."""
import ast
import functools
import math
from pathlib import Path

import pytest
import torch

import mlmclm
import mlmclm.finetuning.loop as ft
from mlmclm.protocol.runs import FinetuneConfig
import mlmclm.finetuning.evaluation as ev
from mlmclm.model.heads import HEADS
from mlmclm.finetuning.batches import HEAD_LOSSES, batch_backward
from mlmclm.tasks.registry import TASKS
from mlmclm.protocol.finetuning import FINETUNE_OPTIONS

PACKAGE = Path(mlmclm.__file__).parent
TABLES = {('model.py', 'HEADS'), ('packing.py', 'HEAD_LOSSES'), ('evaluation.py', 'KINDS'), ('tasks.py', 'EXAMPLE_TEXTS')}   # where kinds are keys
# each earlier-mlmclm option -> the one function allowed to branch on it
OPTION_HOMES = {'select_step': '_train', 'ndcg_mode': '_eval_embedding', 'special_tokens': '_bos',
                'warmup': 'warmup_steps', 'data_source': 'load_task', 'tc_mode': 'head_kind', 'qa_mode': 'head_kind'}
# untimed benchmark steps; pretraining's LR warmup
OTHER_MEANINGS = {'warmup': {'bench.py', 'bench_finetune.py', 'pretrain.py', 'study.py'}}
EMBEDDED = {'sequence': 'rt_sentiment', 'token': 'tweet_ner', 'answer_tokens': 'corpus_cloze',
            'embedding': 'corpus_retrieval'}   # an embedded task of each task kind


pytestmark = pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)


def _strings(node) -> list[str]:
    "The string constants of `node`, looking into tuple, list and set literals."
    if isinstance(node, ast.Constant) and isinstance(node.value, str): return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)): return [s for e in node.elts for s in _strings(e)]
    return []


def _table_dicts(tree) -> set[int]:
    "ids of the dict literals assigned to a table name (`HEADS = {...}`)."
    return {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict)
            for t in n.targets if isinstance(t, ast.Name) and t.id in {name for _, name in TABLES}}


@functools.lru_cache(maxsize=None)
def _modules(folder: Path) -> tuple:
    "(file name, syntax tree) of each module of `folder`, parsed once."
    return tuple((p.name, ast.parse(p.read_text())) for p in sorted(folder.glob('*.py')) if p.name != '_modidx.py')


def kind_dispatch(folder: Path, kinds: set[str]) -> list[str]:
    "Where a module of `folder` compares a kind name or keys a dict by kind names outside the tables: 'file:line ...'."
    found = []
    for name, tree in _modules(folder):
        tables = _table_dicts(tree) if any(name == f for f, _ in TABLES) else set()
        for n in ast.walk(tree):
            if isinstance(n, ast.Compare) and set(_strings(n.left) + [s for c in n.comparators for s in _strings(c)]) & kinds:
                found.append((name, n.lineno, 'compares a head kind'))
            keys = ([s for k in n.keys if k is not None for s in _strings(k)] if isinstance(n, ast.Dict) else
                    [k.arg for k in n.keywords] if isinstance(n, ast.Call) and getattr(n.func, 'id', '') == 'dict' else [])
            if len(set(keys) & kinds) >= 2 and id(n) not in tables:
                found.append((name, n.lineno, 'a table keyed by head kinds'))
    return [f'{name}:{line} {what}' for name, line, what in sorted(found)]


@functools.lru_cache(maxsize=None)
def _compared_names(folder: Path) -> tuple:
    "(file, function, names read in one of its comparisons: attributes `x.name` and variables `name`) for every function."
    out = []
    for file, tree in _modules(folder):
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)): continue
            names = {m.attr if isinstance(m, ast.Attribute) else m.id for n in ast.walk(fn) if isinstance(n, ast.Compare)
                     for m in ast.walk(n) if isinstance(m, (ast.Attribute, ast.Name))}
            out.append((file, fn.name, frozenset(names)))
    return tuple(out)


def option_branches(folder: Path, option: str) -> set[str]:
    "The functions of `folder`'s modules with a comparison that reads `option` (as `cfg.option` or a parameter `option`)."
    return {fn for file, fn, names in _compared_names(folder)
            if option in names and file not in OTHER_MEANINGS.get(option, ())}


def test_every_kind_has_every_part():
    assert list(HEADS) == list(HEAD_LOSSES)                                   # one loss per head, one head per loss
    assert {t.kind for t in TASKS.values()} == set(EMBEDDED) and set(EMBEDDED) <= set(ev.KINDS)
    swapped = set()
    for name, kind in ev.KINDS.items():
        assert kind.module is HEADS[kind.head] and kind.training is HEAD_LOSSES[kind.head], name
        assert callable(kind.features) and callable(kind.evaluate) and callable(kind.training.loss), name
        if kind.earlier:
            option, value, earlier = kind.earlier
            assert value in FINETUNE_OPTIONS[option].choices and value != FINETUNE_OPTIONS[option].default, name
            assert earlier in ev.KINDS and earlier not in EMBEDDED, name      # an earlier row no task names itself
            swapped.add(earlier)
    assert set(ev.KINDS) == set(EMBEDDED) | swapped                           # every row is reachable


def _reaching(name: str) -> tuple:
    "A task and a config that train as the `KINDS` row `name`."
    for task_kind, task in EMBEDDED.items():
        options = {}
        earlier = ev.KINDS[task_kind].earlier
        if earlier and earlier[2] == name: options = {earlier[0]: earlier[1]}
        cfg = FinetuneConfig(feature_cache='off', **options)
        if ev.head_kind(TASKS[task], cfg) == name: return TASKS[task], cfg
    raise AssertionError(f'no task trains as {name!r}')


@pytest.mark.parametrize('name', list(ev.KINDS))
def test_every_kind_trains_and_scores_through_its_parts(name):
    "features -> collate -> head -> loss -> gradient, then evaluate, for each row on a tiny model."
    task, cfg = _reaching(name)
    kind, tok = ev.KINDS[name], ft.load_tokenizer('embedded')
    torch.manual_seed(0)
    base = ft.build_model('tiny', vocab_size=len(tok))
    run = ev.RunContext(tok, 64, torch.device('cpu'), 'fp32', cfg, tokens=256)
    data = task.load()
    model = ft.task_model(base, kind, task, cfg)
    feats = kind.features(data['train'][:6], run)
    loss = batch_backward(model, kind.head, feats, tok.pad_token_id, max_tokens=256, max_examples=4)
    assert math.isfinite(loss.item()) and any(p.grad is not None for p in model.parameters())
    scores = ev.evaluate(task, model, ft.cap_eval(data['test'], 4), run)
    assert 0 <= scores['score'] <= 1 and len(scores['scores_i']) == 4


def test_no_kind_is_compared_outside_the_tables():
    "Before: TaskModel.forward, head_loss, batch_backward, head_kind, task_model and finetune_run compared kind strings."
    assert kind_dispatch(PACKAGE, set(ev.KINDS) | set(HEADS)) == []


def test_the_check_sees_a_comparison_and_a_stray_table(tmp_path):
    (tmp_path/'m.py').write_text("def f(k):\n    if k in ('token', 'span'): return 1\n"
                                 "OUT = {'sequence': 2, 'token': 3}\nX = dict(sequence=1, embedding=2)\n")
    assert kind_dispatch(tmp_path, {'sequence', 'token', 'span', 'embedding'}) == [
        'm.py:2 compares a head kind', 'm.py:3 a table keyed by head kinds', 'm.py:4 a table keyed by head kinds']


@pytest.mark.parametrize('option', list(OPTION_HOMES))
def test_each_earlier_option_branches_in_one_place(option):
    "Before: select_step in `_train` and `finetune_run`, tc_mode in `_eval_token` and the KINDS row's lambda."
    assert option_branches(PACKAGE, option) <= {OPTION_HOMES[option]}
