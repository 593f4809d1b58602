"""The public loader for a sentence-classification dataset of one's own (`hub_sentence_classification`, issue 43 item
6), on small repos written in the hub's own layouts and read by `datasets` as it reads a hub repo: Parquet files under
`data/`, CSV files at the root, a config named in the README; then each kind of bad input, refused naming the bad
value and what is allowed."""
import dataclasses

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mlmclm.tasks.registry as tasks
from mlmclm.base.configs import ConfigError
from mlmclm.tasks.examples import convert_glue, split_train
from mlmclm.tasks.registry import TASKS, Task, hub_sentence_classification, load_task, load_task_revision, resolve_tasks

LABELS = ('bad', 'good')
NLI = ('entailment', 'neutral', 'contradiction')


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    "`datasets` caches what it builds from a repo in a folder of this test's own."
    import datasets
    monkeypatch.setattr(datasets.config, 'HF_DATASETS_CACHE', str(tmp_path/'hf-cache'))


def reviews(n: int, label=lambda i: i % 2) -> dict:
    "`n` reviews in columns (`sentence`, `label`), alternating bad and good."
    return dict(sentence=[f'a {("dull", "fine")[i % 2]} play, night {i}' for i in range(n)], label=[label(i) for i in range(n)])


def write_repo(folder, splits: dict, fmt: str = 'parquet', under: str = 'data') -> str:
    "A dataset repo as the hub lays one out: a file per split, `{under}/{split}-00000-of-00001.parquet` or `{split}.csv`."
    (folder/under).mkdir(parents=True, exist_ok=True)
    for split, columns in splits.items():
        if fmt == 'csv': pd.DataFrame(columns).to_csv(folder/under/f'{split}.csv', index=False)
        else: pd.DataFrame(columns).to_parquet(folder/under/f'{split}-00000-of-00001.parquet', index=False)
    return str(folder)


def sc_task(path, labels=LABELS, **options) -> Task:
    "One row of the task table, as a user writes it."
    return Task('my_sc', 'SC', 'sequence', hub_sentence_classification(path, labels, **options), labels, max_length=64)


def test_a_parquet_repo_is_one_row_of_the_table(tmp_path, monkeypatch):
    path = write_repo(tmp_path/'repo', dict(train=reviews(16), validation=reviews(4), test=reviews(2)), under='data')
    monkeypatch.setitem(TASKS, 'my_sc', sc_task(path, text='sentence'))
    assert resolve_tasks('my_sc') == ['my_sc']
    data, revision = load_task_revision(TASKS['my_sc'])
    assert {s: len(data[s]) for s in ('train', 'validation', 'test')} == dict(train=16, validation=4, test=2)
    assert data['test'] == [dict(text='a dull play, night 0', label=0), dict(text='a fine play, night 1', label=1)]
    assert data['labels'] == LABELS and revision == tasks.loaded_revision(path, None) and revision.startswith('content-sha256:')
    write_repo(tmp_path/'repo', dict(test=reviews(3)))                             # the data changed: so does its revision
    assert load_task_revision(TASKS['my_sc'])[1] not in (None, revision)


def test_a_csv_repo_with_a_dev_split_names_and_a_text_pair(tmp_path):
    "CSV files at the root, `dev` for validation (as `datasets` reads it), labels written as class names, a text pair."
    pairs = lambda n: dict(premise=[f'p{i}' for i in range(n)], hypothesis=['h'] * n, label=[NLI[i % 3] for i in range(n)])
    path = write_repo(tmp_path/'nli', dict(train=pairs(9), dev=pairs(3), test=pairs(3)), fmt='csv', under='.')
    data = load_task(sc_task(path, NLI, text=('premise', 'hypothesis')))
    assert [len(data[s]) for s in ('train', 'validation', 'test')] == [9, 3, 3]
    glue = convert_glue(pd.DataFrame(pairs(3)).assign(label=[0, 1, 2]).to_dict('records'), 'mnli')
    assert data['test'] == glue                                                    # GLUE's MNLI examples, from any pair


def test_a_config_named_in_the_readme(tmp_path):
    "A repo of several configs (as nyu-mll/glue): the README lists each config's files; `name` picks one."
    folder = tmp_path/'multi'
    write_repo(folder, dict(train=reviews(8), validation=reviews(2), test=reviews(2)), under='polarity')
    write_repo(folder, dict(train=reviews(8, lambda i: 5), test=reviews(2, lambda i: 5)), under='stars')
    configs = ''.join(f'- config_name: {c}\n  data_files:\n' + ''.join(f'  - split: {s}\n    path: {c}/{s}-*\n' for s in splits)
                      for c, splits in (('polarity', ('train', 'validation', 'test')), ('stars', ('train', 'test'))))
    (folder/'README.md').write_text(f'---\nconfigs:\n{configs}---\n')
    data = load_task(sc_task(str(folder), text='sentence', name='polarity'))
    assert [len(data[s]) for s in ('train', 'validation', 'test')] == [8, 2, 2]
    with pytest.raises(ConfigError, match=f"{folder} stars train, row 0: label 5 is not one of the declared labels"):
        load_task(sc_task(str(folder), text='sentence', name='stars'))


def test_without_a_validation_split_it_holds_out_5_percent_of_train(tmp_path):
    path = write_repo(tmp_path/'repo', dict(train=reviews(40), test=reviews(2)))
    data = load_task(sc_task(path, text='sentence'))
    train = [dict(text=t, label=l) for t, l in zip(*reviews(40).values())]
    assert (data['train'], data['validation']) == split_train(train) and len(data['validation']) == 2   # as the GLUE tasks
    assert list(data) == ['train', 'validation', 'test', 'labels']


def test_a_labelled_column_must_name_the_declared_classes_in_order(tmp_path):
    "A `ClassLabel` column: the ids mean its names, so the declared labels must be those names, in that order."
    import datasets
    feats = datasets.Features(sentence=datasets.Value('string'), label=datasets.ClassLabel(names=['neg', 'pos']))
    (tmp_path/'repo'/'data').mkdir(parents=True)
    for split in ('train', 'test'):
        datasets.Dataset.from_dict(reviews(4), features=feats).to_parquet(tmp_path/'repo'/'data'/f'{split}-00000-of-00001.parquet')
    path = str(tmp_path/'repo')
    assert load_task(sc_task(path, ('neg', 'pos'), text='sentence'))['test'][1]['label'] == 1
    with pytest.raises(ConfigError, match=r"its 'label' column names the classes \('neg', 'pos'\); declare those labels, "
                                          r"in that order, not \('pos', 'neg'\)"):
        load_task(sc_task(path, ('pos', 'neg'), text='sentence'))


def test_a_pinned_revision_is_the_one_loaded(tmp_path):
    "As every loader: a commit pinned in `Task.revisions` that is not what was loaded is an error."
    path = write_repo(tmp_path/'repo', dict(train=reviews(4), test=reviews(2)))
    pinned = dataclasses.replace(sc_task(path, text='sentence'), revisions=((path, 'a' * 40),))
    with pytest.raises(ConfigError, match=f'{path} was pinned to revision {"a" * 40} but content-sha256:'):
        load_task(pinned)


GOOD = dict(train=reviews(4), validation=reviews(2), test=reviews(2))
BAD_ROWS = [   # (what is wrong, the splits written, the loader's options, the error's words)
    ('text column missing', GOOD, dict(), "{path} train: column 'text' is missing; the dataset has ['sentence', 'label']"),
    ('label column missing', GOOD, dict(text='sentence', label='stars'),
     "{path} train: column 'stars' is missing; the dataset has ['sentence', 'label']"),
    ('an id past the classes', dict(GOOD, validation=reviews(2, lambda i: 2)), dict(text='sentence'),
     "{path} validation, row 0: label 2 is not one of the declared labels ['bad', 'good'] (a class name, or its id 0..1)"),
    ('a hidden test label', dict(GOOD, test=reviews(2, lambda i: -1)), dict(text='sentence'),
     "{path} test, row 0: label -1 is not one of the declared labels ['bad', 'good']"),
    ('an undeclared class name', dict(GOOD, train=reviews(4, lambda i: ('bad', 'meh')[i % 2])), dict(text='sentence'),
     "{path} train, row 1: label 'meh' is not one of the declared labels ['bad', 'good']"),
    ('a text that is not one', dict(GOOD, test=dict(sentence=['fine', None], label=[1, 0])), dict(text='sentence'),
     "{path} test, row 1: text None is not a string (text columns ['sentence'])"),
    ('no test split', dict(train=reviews(4), validation=reviews(2)), dict(text='sentence'),
     "{path}: no 'test' split; it has ['train', 'validation'] (needed: 'train' and 'test'"),
    ('no train split', dict(validation=reviews(2), test=reviews(2)), dict(text='sentence'), "{path}: no 'train' split"),
]


@pytest.mark.parametrize('what, splits, options, message', BAD_ROWS, ids=[b[0] for b in BAD_ROWS])
def test_bad_data_is_refused_naming_the_value_and_what_is_allowed(tmp_path, what, splits, options, message):
    path = write_repo(tmp_path/'repo', splits)
    with pytest.raises(ConfigError) as e: load_task(sc_task(path, **options))
    assert message.format(path=path) in str(e.value)


def _pyarrow_empty(folder):   # a Parquet file with one row group of no rows (as pyarrow and pandas write one)
    pq.write_table(pa.table(dict(sentence=pa.array([], pa.string()), label=pa.array([], pa.int64()))),
                   folder/'data'/'test-00000-of-00001.parquet')


def _datasets_empty(folder):   # a Parquet file with no row group (as datasets writes one)
    import datasets
    feats = datasets.Features(sentence=datasets.Value('string'), label=datasets.Value('int64'))
    datasets.Dataset.from_dict(dict(sentence=[], label=[]), features=feats).to_parquet(folder/'data'/'test-00000-of-00001.parquet')


def _csv_empty(folder): (folder/'data'/'test.csv').write_text('sentence,label\n')   # a header, no row


@pytest.mark.parametrize('fmt, empty, message', [
    ('parquet', _pyarrow_empty, "{path}: a split is empty (['data/test-00000-of-00001.parquet']); every split needs rows"),
    ('parquet', _datasets_empty, "{path}: split 'test' is empty; every split needs rows"),
    ('csv', _csv_empty, "{path}: split 'test' is empty; every split needs rows")])
def test_an_empty_split_is_refused_naming_it(tmp_path, fmt, empty, message):
    "`datasets` fails on a split without rows in ways that do not say which; the loader says which."
    path = write_repo(tmp_path/'repo', GOOD, fmt=fmt)
    empty(tmp_path/'repo')
    with pytest.raises(ConfigError) as e: load_task(sc_task(path, text='sentence'))
    assert message.format(path=path) in str(e.value)


@pytest.mark.parametrize('labels, text, message', [
    (('good',), 'text', "labels=('good',): declare two or more distinct class names, in the order of their ids"),
    (('good', 'good'), 'text', "labels=('good', 'good'): declare two or more distinct"),
    ((0, 1), 'text', 'labels=(0, 1): declare two or more distinct class names'),
    (LABELS, ('a', 'b', 'c'), "text=('a', 'b', 'c'): give a text column, or the two columns of a text pair")])
def test_a_bad_row_fails_where_it_is_written(labels, text, message):
    "The declaration is checked when the row is written (at import), before any data is read."
    with pytest.raises(ConfigError) as e: hub_sentence_classification('me/nowhere', labels, text=text)
    assert message in str(e.value)
