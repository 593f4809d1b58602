"""A stand-in for the Hugging Face hub: one tiny in-memory table per dataset the task registry reads, with the hub's
configs, split names, column names and types, so the real loaders of `mlmclm.tasks.registry` run without a network.

Two families of tables: the authors' sources (`data_source='encodeval'`: the `hgissbkh/*` copies and BEIR, as
hgissbkh/EncodEval's `encodeval/datasets.py` reads them) and the canonical ones (`data_source='canonical'`). For the
authors' copies only the columns their code reads (or renames) are known; anything beyond that is marked unverified.

Also `write_hub_layout`: a dataset repo on disk laid out like FineWeb-Edu on the hub, for the token-store builder
(`tests/data/test_token_store.py`, `nbs/data/02_sources.ipynb`)."""
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mlmclm.tasks.registry import CONLL_TAGS, UNER_TAGS
from mlmclm.tasks.examples import TASK_SPLITS


def fake_hub(tables: dict) -> Callable:
    "A stand-in for `_hub`: `tables[(path, config, split)]` is a `datasets.Dataset`; `split=None` returns a dict of splits."
    def hub(path, name=None, split=None):
        if split is None: return {s: d for (p, n, s), d in tables.items() if (p, n) == (path, name)}
        if (path, name, split) not in tables: raise FileNotFoundError(f'no table {(path, name, split)} in the fake hub')
        return tables[(path, name, split)]
    return hub


def _types():
    from datasets import ClassLabel, Dataset, Features, Value
    try: from datasets import List          # datasets >= 4
    except ImportError: from datasets import Sequence as List
    return Dataset.from_dict, ClassLabel, Features, Value, List


def _shared_tables(t: dict) -> None:
    "Datasets both sources read: GLUE and SQuAD."
    D = _types()[0]
    for sp, n in (('train', 40), ('validation', 6)):
        t[('nyu-mll/glue', 'sst2', sp)] = D(dict(sentence=[f'film {i}' for i in range(n)], label=[i % 2 for i in range(n)], idx=list(range(n))))
    t[('nyu-mll/glue', 'mnli', 'train')] = D(dict(premise=['p'] * 20, hypothesis=['h'] * 20, label=[0, 1, 2, 0] * 5, idx=list(range(20))))
    t[('nyu-mll/glue', 'mnli', 'validation_matched')] = D(dict(premise=['p'], hypothesis=['h'], label=[1], idx=[0]))
    t[('rajpurkar/squad_v2', None, 'train')] = D(dict(id=['a', 'b'], title=['t', 't'], context=['Paris is big.'] * 2,
                                                      question=['What is big?', 'What is small?'],
                                                      answers=[dict(text=['Paris'], answer_start=[0]), dict(text=[], answer_start=[])]))
    t[('rajpurkar/squad_v2', None, 'validation')] = t[('rajpurkar/squad_v2', None, 'train')]


def _encodeval_tables(t: dict) -> None:
    "The authors' sources (encodeval/datasets.py)."
    D, ClassLabel, Features, Value, List = _types()
    for sp in TASK_SPLITS:
        # hgissbkh/conll2003-en: `words` and `ner` are the columns their code renames (verified); that `ner` holds plain
        # integers (no ClassLabel names) and that there are no other columns is unverified
        t[('hgissbkh/conll2003-en', None, sp)] = D(dict(words=[['EU', 'rejects', 'German']], ner=[[3, 0, 7]]))
        # hgissbkh/ontonotes5: their code reads `tokens` and `tags` unrenamed (verified); integer tags unverified
        t[('hgissbkh/ontonotes5', None, sp)] = D(dict(tokens=[['Phil', 'Rosen']], tags=[[4, 5]]))
        # hgissbkh/uner_en: idx, text, annotator dropped and ner_tags renamed by their code (verified); the ClassLabel
        # names (universal_ner's) are unverified
        uner = Features(idx=Value('string'), text=Value('string'), tokens=List(Value('string')),
                        ner_tags=List(ClassLabel(names=list(UNER_TAGS))), annotator=List(Value('string')))
        t[('hgissbkh/uner_en', None, sp)] = D(dict(idx=['0'], text=['Ann in Rome'], tokens=[['Ann', 'in', 'Rome']],
                                                   ner_tags=[[1, 0, 5]], annotator=[['a']]), features=uner)
    for sp in ('train', 'validation'):
        # hgissbkh/record: SQuAD columns, because their QA code reads question/context/answers (how ReCoRD's entities
        # became spans is unverified)
        t[('hgissbkh/record', None, sp)] = D(dict(question=['@placeholder left.'] * 3, context=['Alice met Bob. Bob left.'] * 3,
                                                  answers=[dict(text=['Bob'], answer_start=[10])] * 3))
    # hgissbkh/msmarco-pairs: `query` and `positive` verified (renamed/mapped by their code); other columns unverified
    t[('hgissbkh/msmarco-pairs', None, 'train')] = D(dict(query=['q'], positive=['p']))
    # BEIR: `{name}` has configs 'queries' and 'corpus' (split names = config names, columns _id/title/text);
    # `{name}-qrels` has the splits; MS MARCO's test is TREC-DL-19 (graded 0-3)
    t[('BeIR/msmarco', 'queries', 'queries')] = D(dict(_id=['7', '8', '10', '11'], title=[''] * 4, text=['seven?', 'eight?', 'ten?', 'eleven?']))
    t[('BeIR/msmarco', 'corpus', 'corpus')] = D(dict(_id=['7', '8', '9', '10', '12'], title=[''] * 5, text=['p7', 'p8', 'p9', 'p10', 'p12']))
    t[('BeIR/msmarco-qrels', None, 'validation')] = D({'query-id': [7], 'corpus-id': [7], 'score': [1]})
    t[('BeIR/msmarco-qrels', None, 'test')] = D({'query-id': [8, 8, 10], 'corpus-id': [8, 9, 10], 'score': [2, 0, 0]})
    t[('BeIR/nq', 'queries', 'queries')] = D(dict(_id=['q1', 'q2', 'q3', 'q4', 'q9'], title=[''] * 5, text=['a?', 'b?', 'c?', 'd?', 'unjudged?']))
    t[('BeIR/nq', 'corpus', 'corpus')] = D(dict(_id=['d1', 'd2', 'd3', 'd4', 'd9'], title=['A', 'B', 'C', 'D', 'Z'], text=['a', 'b', 'c', 'd', 'z']))
    t[('BeIR/nq-qrels', None, 'test')] = D({'query-id': ['q1', 'q2', 'q3', 'q4'], 'corpus-id': ['d1', 'd2', 'd3', 'd4'], 'score': [1] * 4})
    # hgissbkh/mldr-en: query_id, query, positive_passages[].docid and the corpus' docid/text are what their code reads
    # (verified); the passages' other fields and negative_passages are unverified
    for sp, q in (('dev', '5'), ('test', '6')):
        t[('hgissbkh/mldr-en', 'default', sp)] = D(dict(query_id=[f'q{q}'], query=[f'query {q}'],
                                                        positive_passages=[[dict(docid=f'd{q}', text=f'long {q}')]],
                                                        negative_passages=[[dict(docid='d7', text='long 7')]]))
    t[('hgissbkh/mldr-en', 'corpus', 'corpus')] = D(dict(docid=['d5', 'd6', 'd7'], text=['long 5', 'long 6', 'long 7']))


def _canonical_tables(t: dict) -> None:
    "The canonical sources (earlier mlmclm)."
    D, ClassLabel, Features, Value, List = _types()
    conll = Features(id=Value('string'), tokens=List(Value('string')), pos_tags=List(Value('int32')),
                     chunk_tags=List(Value('int32')), ner_tags=List(ClassLabel(names=list(CONLL_TAGS))))
    for sp in TASK_SPLITS:
        t[('eriktks/conll2003', None, sp)] = D(dict(id=['0'], tokens=[['EU', 'rejects', 'German']], pos_tags=[[1, 2, 3]],
                                                   chunk_tags=[[1, 2, 3]], ner_tags=[[3, 0, 7]]), features=conll)
    for sp in ('train', 'validation'):
        t[('super_glue', 'record', sp)] = D(dict(passage=['Alice met Bob. Bob left.'] * 3, query=['@placeholder left.'] * 3,
                                                 entities=[['Alice', 'Bob']] * 3,
                                                 entity_spans=[dict(text=['Alice', 'Bob'], start=[0, 10], end=[5, 13])] * 3,
                                                 answers=[['Bob']] * 3, idx=[dict(passage=0, query=i) for i in range(3)]))
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


def fake_hub_tables() -> dict:
    "One tiny table per hub dataset the registry reads (both sources), with the hub's column names and types."
    t = {}
    for add in (_shared_tables, _encodeval_tables, _canonical_tables): add(t)
    return t


def write_hub_layout(folder: str | Path,        # the repo folder to write
                     documents: list[str],      # the texts, spread over the files in order
                     subset: str = 'sample-10BT',  # the config name; files go to sample/10BT/
                     files: int = 2,            # Parquet files
                     row_group_size: int = 64,  # rows per Parquet row group (a builder unit)
                    ) -> Path:
    "Write `documents` as a dataset repo laid out like FineWeb-Edu on the hub (README configs, Parquet with its columns): an offline `repo=`."
    folder, part = Path(folder), subset.replace('sample-', 'sample/')
    (folder/part).mkdir(parents=True, exist_ok=True)
    for f, chunk in enumerate(np.array_split(np.arange(len(documents)), files)):
        texts = [documents[i] for i in chunk]
        table = pa.table(dict(text=texts, id=[f'<urn:uuid:{i}>' for i in chunk], dump=['CC-MAIN-2024-10'] * len(texts),
                              url=[f'https://example.org/{i}' for i in chunk], language=['en'] * len(texts),
                              language_score=[0.9] * len(texts), token_count=[len(t.split()) for t in texts],
                              score=[3.0] * len(texts), int_score=[3] * len(texts)))
        pq.write_table(table, folder/part/f'{f:03d}_00000.parquet', row_group_size=row_group_size)
    (folder/'README.md').write_text(f'---\nconfigs:\n- config_name: {subset}\n  data_files:\n  - split: train\n'
                                    f'    path: {part}/*\n---\n# a stand-in for HuggingFaceFW/fineweb-edu (tests/fake_hub.py: write_hub_layout)\n')
    return folder
