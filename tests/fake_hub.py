"""A stand-in for the Hugging Face hub: one tiny in-memory table per dataset the task registry reads, with the hub's
configs, split names, column names and types, so the real loaders of `mlmclm.tasks` run without a network."""
from typing import Callable

from mlmclm.tasks import CONLL_TAGS, SPLITS


def fake_hub(tables: dict) -> Callable:
    "A stand-in for `_hub`: `tables[(path, config, split)]` is a `datasets.Dataset`; `split=None` returns a dict of splits."
    def hub(path, name=None, split=None):
        if split is None: return {s: d for (p, n, s), d in tables.items() if (p, n) == (path, name)}
        if (path, name, split) not in tables: raise FileNotFoundError(f'no table {(path, name, split)} in the fake hub')
        return tables[(path, name, split)]
    return hub


def fake_hub_tables() -> dict:
    "One tiny table per hub dataset the registry reads, with the hub's column names and types."
    from datasets import ClassLabel, Dataset, Features, Value
    try: from datasets import List          # datasets >= 4
    except ImportError: from datasets import Sequence as List
    D = Dataset.from_dict
    t = {}
    for sp, n in (('train', 40), ('validation', 6)):
        t[('nyu-mll/glue', 'sst2', sp)] = D(dict(sentence=[f'film {i}' for i in range(n)], label=[i % 2 for i in range(n)], idx=list(range(n))))
    t[('nyu-mll/glue', 'mnli', 'train')] = D(dict(premise=['p'] * 20, hypothesis=['h'] * 20, label=[0, 1, 2, 0] * 5, idx=list(range(20))))
    t[('nyu-mll/glue', 'mnli', 'validation_matched')] = D(dict(premise=['p'], hypothesis=['h'], label=[1], idx=[0]))
    conll = Features(id=Value('string'), tokens=List(Value('string')), pos_tags=List(Value('int32')),
                     chunk_tags=List(Value('int32')), ner_tags=List(ClassLabel(names=list(CONLL_TAGS))))
    for sp in SPLITS:
        t[('eriktks/conll2003', None, sp)] = D(dict(id=['0'], tokens=[['EU', 'rejects', 'German']], pos_tags=[[1, 2, 3]],
                                                   chunk_tags=[[1, 2, 3]], ner_tags=[[3, 0, 7]]), features=conll)
    t[('rajpurkar/squad_v2', None, 'train')] = D(dict(id=['a', 'b'], title=['t', 't'], context=['Paris is big.'] * 2,
                                                      question=['What is big?', 'What is small?'],
                                                      answers=[dict(text=['Paris'], answer_start=[0]), dict(text=[], answer_start=[])]))
    t[('rajpurkar/squad_v2', None, 'validation')] = t[('rajpurkar/squad_v2', None, 'train')]
    for sp in ('train', 'validation'):
        t[('super_glue', 'record', sp)] = D(dict(passage=['Alice met Bob. Bob left.'], query=['@placeholder left.'],
                                                 entities=[['Alice', 'Bob']], entity_spans=[dict(text=['Alice', 'Bob'], start=[0, 10], end=[5, 13])],
                                                 answers=[['Bob']], idx=[dict(passage=0, query=0)]))
    # BEIR layout (mteb/nq, mteb/msmarco): qrels in config 'default'; queries and corpus are configs and split names
    t[('mteb/nq', 'default', 'test')] = D({'query-id': ['q1', 'q2', 'q3', 'q4'], 'corpus-id': ['d1', 'd2', 'd3', 'd4'], 'score': [1] * 4})
    t[('mteb/nq', 'queries', 'queries')] = D(dict(_id=['q1', 'q2', 'q3', 'q4', 'q9'], text=['a?', 'b?', 'c?', 'd?', 'unjudged?']))
    t[('mteb/nq', 'corpus', 'corpus')] = D(dict(_id=['d1', 'd2', 'd3', 'd4', 'd9'], title=['A', 'B', 'C', 'D', 'Z'], text=['a', 'b', 'c', 'd', 'z']))
    for sp, q in (('train', 'q7'), ('dev', 'q8')):
        t[('mteb/msmarco', 'default', sp)] = D({'query-id': [q], 'corpus-id': ['d' + q[1]], 'score': [1]})
    t[('mteb/msmarco', 'queries', 'queries')] = D(dict(_id=['q7', 'q8'], text=['seven?', 'eight?']))
    t[('mteb/msmarco', 'corpus', 'corpus')] = D(dict(_id=['d7', 'd8', 'd9'], title=['', '', ''], text=['7', '8', '9']))
    # MLDR (mteb/MultiLongDocRetrieval): '{lang}-qrels/queries/corpus' configs, split per evaluation split, column 'id'
    for sp, q in (('dev', 'q5'), ('test', 'q6')):
        t[('mteb/MultiLongDocRetrieval', 'en-qrels', sp)] = D({'query-id': [q], 'corpus-id': ['d' + q[1]], 'score': [1]})
        t[('mteb/MultiLongDocRetrieval', 'en-queries', sp)] = D(dict(id=[q], text=[f'query {q}']))
        t[('mteb/MultiLongDocRetrieval', 'en-corpus', sp)] = D(dict(id=['d5', 'd6', 'd7'], text=['long 5', 'long 6', 'long 7']))
    t[('sentence-transformers/msmarco-co-condenser-margin-mse-sym-mnrl-mean-v1', 'triplet', 'train')] = D(
        dict(query=['q'], positive=['p'], negative=['n']))
    return t
