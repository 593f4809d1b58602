"""The hub loaders of the task registry (`mlmclm.tasks.registry`) on in-memory datasets with the hub's configs, splits
and columns: the authors' sources (the default) and the canonical ones; datasets loaded at a pinned revision, and the
revision loaded recorded (issue 33 item 13)."""
import math
from types import SimpleNamespace

import pytest

import mlmclm.tasks.registry as tasks
import mlmclm.tasks.examples as task_data
from mlmclm.base.configs import ConfigError
from fake_hub import fake_hub, fake_hub_tables


@pytest.fixture
def hub(monkeypatch):
    monkeypatch.setattr(tasks, '_hub', fake_hub(fake_hub_tables()))


def load(name, source='encodeval'): return tasks.load_task(tasks.TASKS[name], source)


def test_the_95_5_split_is_datasets_own_train_test_split(hub):
    "The validation rows are exactly those of `train_test_split(train_size=0.95, seed=42)` on the hub table (EncodEval)."
    table = fake_hub_tables()[('nyu-mll/glue', 'sst2', 'train')]
    ref = table.train_test_split(train_size=0.95, seed=42)
    sst = load('sst2')
    assert sst['validation'] == task_data.convert_glue(ref['test'], 'sst2')
    assert sst['train'] == task_data.convert_glue(ref['train'], 'sst2')
    assert len(sst['validation']) == 40 - math.floor(0.95 * 40) and len(sst['test']) == 6   # validation = test


def test_authors_sources_follow_their_split_protocol(hub):
    assert load('mnli_m')['test'] == [dict(text='Premise: p\nHypothesis: h', label=1)]
    conll = load('conll2003_en')
    assert conll['test'][0] == dict(tokens=['EU', 'rejects', 'German'], tags=[3, 0, 7]) and 'labels' not in conll
    assert load('ontonotes')['validation'][0]['tags'] == [4, 5]
    uner = load('uner_en')
    assert uner['labels'] == tasks.UNER_TAGS and uner['train'][0]['tags'] == [1, 0, 5]
    v2 = load('squad_v2')
    assert sorted(len(e['answers']['text']) for e in v2['test']) == [0, 1]             # the unanswerable question is kept
    assert load('record')['test'][0]['answers'] == dict(text=['Bob'], answer_start=[10])
    assert load('msmarco_pairs')['train'] == [dict(query='q', positive='p')]


def test_retrieval_sets_share_one_corpus_of_judged_documents(hub):
    ms = load('msmarco')
    assert ms['validation']['qrels'] == {'7': {'7': 1}}                                  # dev
    assert ms['test']['qrels'] == {'8': {'8': 2, '9': 0}}                                 # TREC-DL-19; '10' has no relevant doc
    assert ms['test']['corpus'] is ms['validation']['corpus']
    assert ms['test']['corpus'] == {'10': 'p10', '7': 'p7', '8': 'p8', '9': 'p9'}          # score-0 judgements included
    nq = load('nq')
    assert (nq['validation']['qrels'], nq['test']['qrels']) == ({'q1': {'d1': 1}, 'q3': {'d3': 1}}, {'q2': {'d2': 1}, 'q4': {'d4': 1}})
    assert nq['test']['corpus'] == {'d1': 'A. a', 'd2': 'B. b', 'd3': 'C. c', 'd4': 'D. d'}   # "title. text", both halves
    mldr = load('mldr_en')
    assert (mldr['validation']['queries'], mldr['test']['qrels']) == ({'q5': 'query 5'}, {'q6': {'d6': 1}})
    assert mldr['test']['corpus'] == {'d5': 'long 5', 'd6': 'long 6'}                      # positive passages only


def test_canonical_sources_are_the_earlier_ones(hub):
    conll = load('conll2003_en', 'canonical')
    assert conll['labels'] == tasks.CONLL_TAGS and conll['test'][0]['tags'] == [3, 0, 7]
    assert load('record', 'canonical')['test'][0]['answers']['answer_start'] == [10, 15]
    nq = load('nq', 'canonical')
    assert nq['test']['corpus'] == {'d2': 'B. b', 'd4': 'D. d'}                          # a corpus per split
    ms = load('msmarco', 'canonical')
    assert (ms['validation']['qrels'], ms['test']['corpus']) == ({'q7': {'d7': 1}}, {'d8': '8'})   # validation from train
    mldr = load('mldr_en', 'canonical')
    assert (mldr['validation']['queries'], mldr['test']['corpus']) == ({'q5': 'query q5'}, {'d6': 'long 6'})
    assert load('msmarco_pairs', 'canonical')['train'] == [dict(query='q', positive='p')]


@pytest.mark.parametrize('key, column, task, source, message', [
    (('nyu-mll/glue', 'sst2', 'train'), 'label', 'sst2', 'encodeval', "column 'label' is missing"),
    (('hgissbkh/conll2003-en', None, 'train'), 'ner', 'conll2003_en', 'encodeval', "column 'ner' is missing"),
    (('eriktks/conll2003', None, 'train'), 'ner_tags', 'conll2003_en', 'canonical', "column 'ner_tags' is missing"),
    (('rajpurkar/squad_v2', None, 'train'), 'answers', 'squad_v2', 'encodeval', "column 'answers' is missing"),
    (('BeIR/nq-qrels', None, 'test'), 'corpus-id', 'nq', 'encodeval', "column 'corpus-id' is missing"),
    (('BeIR/nq', 'corpus', 'corpus'), '_id', 'nq', 'encodeval', "column '_id' is missing"),
    (('hgissbkh/mldr-en', 'default', 'dev'), 'positive_passages', 'mldr_en', 'encodeval', "column 'positive_passages' is missing"),
    (('mteb/nq', 'default', 'test'), 'corpus-id', 'nq', 'canonical', "column 'corpus-id' is missing"),
])
def test_schema_drift_names_the_missing_column(monkeypatch, key, column, task, source, message):
    tables = fake_hub_tables()
    drop = [k for k in tables if k[:2] == key[:2]] if tasks.TASKS[task].family == 'TC' else [key]   # tagging loads all splits
    for k in drop: tables[k] = tables[k].remove_columns(column)
    monkeypatch.setattr(tasks, '_hub', fake_hub(tables))
    with pytest.raises(ConfigError, match=message): load(task, source)


# --------------------------------------- datasets at a pinned revision, the revision loaded recorded (issue 33 item 13)
COMMIT, OTHER = 'a' * 40, 'b' * 40


@pytest.fixture
def hub_calls(monkeypatch, tmp_path):
    "`datasets.load_dataset` as the hub answers: the data cached in a folder named by the commit loaded."
    import datasets
    calls = []
    def load_dataset(path, name=None, split=None, revision=None):
        calls.append(dict(path=path, name=name, split=split, revision=revision))
        commit = revision if revision and len(revision) == 40 else COMMIT
        return SimpleNamespace(cache_files=[dict(filename=str(tmp_path/'cache'/path/'default'/'0.0.0'/commit/'x.arrow'))])
    monkeypatch.setattr(datasets, 'load_dataset', load_dataset)
    return calls


def _hub_task(revisions=()):
    def load_():
        tasks._hub('org/a', None, 'train'); tasks._hub('org/a', None, 'test')
        return dict(train=[], validation=[], test=[])
    return tasks.Task('pinned', 'SC', 'sequence', load_, revisions=revisions)


def test_a_pinned_revision_is_passed_to_load_dataset_and_recorded(hub_calls):
    assert tasks.load_task_revision(_hub_task())[1] == COMMIT                   # unpinned: the commit the hub gave
    assert [c['revision'] for c in hub_calls] == [None, None]
    hub_calls.clear()
    assert tasks.load_task_revision(_hub_task((('org/a', OTHER),)))[1] == OTHER
    assert [c['revision'] for c in hub_calls] == [OTHER, OTHER]


def test_a_task_reading_two_repos_records_both(hub_calls):
    def load_():
        tasks._hub('org/corpus', 'corpus', 'corpus'); tasks._hub('org/qrels', None, 'test')
        return dict(train=[], validation=[], test=[])
    task = tasks.Task('two', 'IR', 'embedding', load_, revisions=(('org/qrels', OTHER),))
    assert tasks.load_task_revision(task)[1] == f'org/corpus@{COMMIT};org/qrels@{OTHER}'


def test_a_pinned_commit_that_is_not_the_one_loaded_is_an_error(monkeypatch, tmp_path):
    import datasets
    monkeypatch.setattr(datasets, 'load_dataset', lambda path, name=None, split=None, revision=None: SimpleNamespace(
        cache_files=[dict(filename=str(tmp_path/path/'default'/'0.0.0'/COMMIT/'x.arrow'))]))
    with pytest.raises(ConfigError, match=f'org/a was pinned to revision {OTHER} but {COMMIT} was loaded'):
        tasks.load_task_revision(_hub_task((('org/a', OTHER),)))
