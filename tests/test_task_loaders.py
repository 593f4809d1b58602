"""The hub loaders of the task registry on in-memory datasets with the hub's configs, splits and columns."""
import pytest

import mlmclm.tasks as tasks
from mlmclm.core import ConfigError
from fake_hub import fake_hub, fake_hub_tables


@pytest.fixture
def hub(monkeypatch):
    monkeypatch.setattr(tasks, '_hub', fake_hub(fake_hub_tables()))


def test_every_loader_follows_the_split_protocol(hub):
    T = tasks.TASKS
    sst = T['sst2'].load()
    assert (len(sst['train']), len(sst['validation']), len(sst['test'])) == (38, 2, 6)   # 95/5 of train; validation = test
    assert T['mnli_m'].load()['test'] == [dict(text='Premise: p\nHypothesis: h', label=1)]
    conll = T['conll2003_en'].load()
    assert conll['labels'] == tasks.CONLL_TAGS and conll['test'][0]['tags'] == [3, 0, 7]
    v2 = T['squad_v2'].load()
    assert sorted(len(e['answers']['text']) for e in v2['test']) == [0, 1]             # the unanswerable question is kept
    assert T['record'].load()['test'][0]['answers']['answer_start'] == [10, 15]
    nq = T['nq'].load()
    assert (nq['validation']['qrels'], nq['test']['qrels']) == ({'q1': {'d1': 1}, 'q3': {'d3': 1}}, {'q2': {'d2': 1}, 'q4': {'d4': 1}})
    assert nq['test']['corpus'] == {'d2': 'B. b', 'd4': 'D. d'}                         # only the judged documents, "title. text"
    assert not set(nq['validation']['queries']) & set(nq['test']['queries'])            # NQ halves do not overlap
    ms = T['msmarco'].load()
    assert (ms['validation']['qrels'], ms['test']['corpus']) == ({'q7': {'d7': 1}}, {'d8': '8'})   # validation from train queries
    mldr = T['mldr_en'].load()
    assert (mldr['validation']['queries'], mldr['test']['corpus']) == ({'q5': 'query q5'}, {'d6': 'long 6'})
    assert list(mldr['test']['queries']) == ['q6']
    assert T['msmarco_pairs'].load()['train'] == [dict(query='q', positive='p')]


@pytest.mark.parametrize('key, column, task, message', [
    (('nyu-mll/glue', 'sst2', 'train'), 'label', 'sst2', "column 'label' is missing"),
    (('eriktks/conll2003', None, 'train'), 'ner_tags', 'conll2003_en', "column 'ner_tags' is missing"),
    (('rajpurkar/squad_v2', None, 'train'), 'answers', 'squad_v2', "column 'answers' is missing"),
    (('mteb/nq', 'default', 'test'), 'corpus-id', 'nq', "column 'corpus-id' is missing"),
    (('mteb/nq', 'corpus', 'corpus'), '_id', 'nq', "column '_id' is missing"),
])
def test_schema_drift_names_the_missing_column(monkeypatch, key, column, task, message):
    tables = fake_hub_tables()
    drop = [k for k in tables if k[:2] == key[:2]] if key[0] == 'eriktks/conll2003' else [key]   # CoNLL loads all splits
    for k in drop: tables[k] = tables[k].remove_columns(column)
    monkeypatch.setattr(tasks, '_hub', fake_hub(tables))
    with pytest.raises(ConfigError, match=message): tasks.TASKS[task].load()
