"""The fine-tuning sweep without papermill (`mlmclm.finetuning.sweep`): resumable results, the SentenceTransformer
export of a trained retriever, and what it stores: after a store lost its last newline, two checkpoints of one run
apart, nothing for a checkpoint or a loss that is not finite, nothing at a CSV path, no rows of other settings, and
the revision of each dataset it loaded."""
import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import mlmclm.finetuning.loop as ft

import mlmclm.finetuning.sweep as sw
from mlmclm.protocol.runs import FinetuneConfig, shard_dir
import mlmclm.finetuning.features as enc
import mlmclm.results.store as res
import mlmclm.tasks.registry as tasks
from mlmclm.results.store import load_results, read_rows
from mlmclm.data.tokenizers import load_tokenizer
from mlmclm.model.heads import TaskModel
from mlmclm.model.checkpoints import load
from mlmclm.tasks.registry import TASKS
from mlmclm.base.configs import ConfigError, build_config

from result_rows import row
from tiny import tiny_cfg, tiny_checkpoint


pytestmark = pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)


def test_a_failed_run_leaves_no_row_and_the_sweep_resumes(monkeypatch, tmp_path):
    cfg = FinetuneConfig(tasks='rt_sentiment', lrs='1e-3', seeds='0,1', max_steps=2, eval_every=1, batch_size=4,
                            micro_batch_size=4, max_eval_examples=8, results=str(tmp_path/'r.jsonl'), progress=False)
    real, calls = ft.finetune_run, []
    def dies_on_second(*a, **k):
        calls.append(1)
        if len(calls) == 2: raise KeyboardInterrupt('killed')
        return real(*a, **k)
    monkeypatch.setattr(sw, 'finetune_run', dies_on_second)
    with pytest.raises(KeyboardInterrupt): sw.finetune_sweep(cfg)
    assert [r['seed'] for r in read_rows(cfg.results)] == [0]
    monkeypatch.setattr(sw, 'finetune_run', real)
    sw.finetune_sweep(cfg)
    assert sorted(r['seed'] for r in read_rows(cfg.results)) == [0, 1]


def test_trained_retriever_loads_in_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer
    cfg = FinetuneConfig(tasks='corpus_retrieval', lrs='1e-3', seeds='0', max_steps=2, eval_every=2, batch_size=8,
                            micro_batch_size=8, max_eval_examples=8, results=str(tmp_path/'r.jsonl'),
                            save_retriever=str(tmp_path/'st'), progress=False)
    sw.finetune_sweep(cfg)
    folder = tmp_path/'st'/'corpus_retrieval-lr0.001-sd0'
    st = SentenceTransformer(str(folder), device='cpu')
    model = load(folder)   # the same folder is also a plain mlmclm / Llama checkpoint (bidirectional)
    tok = load_tokenizer('embedded')
    emb = TaskModel(model, 'embedding').eval()
    texts = ['Query: what light through yonder window breaks', 'Document: It is the east, and Juliet is the sun.']
    with torch.no_grad():
        ours = torch.cat([emb(torch.tensor([f['input_ids']])) for f in enc.encode_texts(texts, tok, 128, '')])
    theirs = st.encode(texts, convert_to_tensor=True)            # plain sentence-transformers, padded batch
    assert F.cosine_similarity(ours, theirs, dim=-1).min().item() > 1 - 1e-5
    assert st.max_seq_length == TASKS['corpus_retrieval'].max_length


# ----------------------------------------------------- issue 17 (data loss, silent wrong answers), items 1, 4, 5 and 14
def test_item1_finetuning_after_a_store_lost_its_last_newline(tmp_path):
    cfg = tiny_cfg(tmp_path)
    store = Path(cfg.results)
    store.write_text(json.dumps(row()))                         # a complete row, its newline truncated away
    sw.finetune_sweep(cfg)
    res = load_results(store)
    assert sorted(res.dataset) == ['rt_sentiment', 'sst2']


def test_item4_two_checkpoints_of_one_run_are_both_fine_tuned(tmp_path):
    s20 = tiny_checkpoint(tmp_path/'run'/'checkpoints'/'step-20', step=20, seed=1)
    s40 = tiny_checkpoint(tmp_path/'run'/'checkpoints'/'step-40', step=40, seed=2)
    for ck in (s20, s40): sw.finetune_sweep(tiny_cfg(tmp_path, checkpoint=str(ck)))
    res = load_results(tmp_path/'results.jsonl')
    assert len(res) == 2 and res.checkpoint_name.nunique() == 2
    assert sw.recorded_name(tiny_cfg(tmp_path, checkpoint=str(s20))) != sw.recorded_name(tiny_cfg(tmp_path, checkpoint=str(s40)))


def test_item5_an_all_nan_checkpoint_does_not_score(tmp_path):
    ck = tiny_checkpoint(tmp_path/'nan', fill=float('nan'))
    with pytest.raises((ConfigError, FloatingPointError), match='not finite'):
        sw.finetune_sweep(tiny_cfg(tmp_path, checkpoint=str(ck)))
    assert load_results(tmp_path/'results.jsonl').empty


def test_a_csv_results_path_is_refused_before_anything_is_written(tmp_path):
    "Issue 14: a results path ending in .csv used to receive JSON lines; it is refused, and nothing lands on disk."
    from mlmclm.base.configs import build_config
    from mlmclm.results.store import StoreWriter
    for path in (tmp_path/'r.csv', tmp_path/'sub'/'results.csv'):
        cfg = build_config(FinetuneConfig, results=str(path), tasks='rt_sentiment', max_steps=1, progress=False)
        with pytest.raises(ConfigError, match=r"names a CSV table; a results store is JSON lines: give a path ending in \.jsonl"):
            sw.finetune_sweep(cfg)
        with pytest.raises(ConfigError, match='names a CSV table'):
            StoreWriter(path)
    assert list(tmp_path.iterdir()) == []


def test_item5_a_fine_tuning_run_whose_loss_is_not_finite_stops_and_stores_nothing(tmp_path, monkeypatch):
    ck = tiny_checkpoint(tmp_path/'ck')
    monkeypatch.setattr(ft, 'batch_backward', lambda *a, **k: torch.tensor(float('nan')))   # a diverged step
    with pytest.raises(FloatingPointError, match='fine-tuning loss is nan at step 1 of 1'):
        sw.finetune_sweep(tiny_cfg(tmp_path, checkpoint=str(ck)))
    assert load_results(tmp_path/'results.jsonl').empty


# N4: a sweep under other settings never reuses rows; aggregations never mix them ----------------------------------
def _sweep_cfg(store, **kw) -> FinetuneConfig:
    return build_config(FinetuneConfig, dict(tasks='rt_sentiment', lrs='1e-3', seeds='0', max_steps=1, eval_every=1,
                                             batch_size=4, micro_batch_size=4, max_eval_examples=4, results=str(store),
                                             progress=False), **kw)


# --------------------------------------------- third fault attack (issue 34), the cases of ../shared/faults/attack-3.md
def test_sweep_with_other_settings_is_refused_naming_them(tmp_path):
    store = tmp_path/'r.jsonl'
    cfg = _sweep_cfg(store)
    sw.finetune_sweep(cfg)
    (row,) = res.read_rows(store)
    assert (row['max_steps'], row['batch_size'], row['max_eval_examples'], row['special_tokens']) == (1, 4, 4, 'eos')
    sw.finetune_sweep(cfg)                                          # the same settings: done, nothing trained
    assert len(res.read_rows(store)) == 1
    other = dataclasses.replace(cfg, special_tokens='bos_eos', select_step='best', warmup='round', max_steps=30,
                                batch_size=8, micro_batch_size=8)
    with pytest.raises(ConfigError) as e: sw.finetune_sweep(other)
    msg = str(e.value)
    for said in ("select_step 'final' (asked 'best')", "special_tokens 'eos' (asked 'bos_eos')", "warmup 'ceil' (asked 'round')",
                 'max_steps 1 (asked 30)', 'batch_size 4 (asked 8)', "force='<reason>'"):
        assert said in msg, (said, msg)
    assert len(res.read_rows(store)) == 1                           # refused before anything ran
    for kw in (dict(max_length=64), dict(packing=False), dict(max_eval_examples=2), dict(data_source='canonical'),
               dict(tc_mode='seqeval'), dict(qa_mode='squad'), dict(ndcg_mode='standard')):
        with pytest.raises(ConfigError, match=f'{next(iter(kw))} '): sw.finetune_sweep(dataclasses.replace(cfg, **kw))
    sw.finetune_sweep(dataclasses.replace(cfg, max_steps=2), force='two steps')   # a deliberate re-run supersedes
    (now,) = res.load_results(store).to_dict('records')
    assert (now['max_steps'], now['steps'], now['supersedes']) == (2, 2, 'two steps')


# -------------------------------------------------------------- the dataset revision a sweep records (issue 33 item 13)
@pytest.fixture
def local_sc(tmp_path, monkeypatch):
    "A sentiment dataset in the hub's layout in a local folder (as `datasets` reads a repo), registered as a task."
    import datasets
    monkeypatch.setattr(datasets.config, 'HF_DATASETS_CACHE', str(tmp_path/'hf-cache'))
    root = tmp_path/'local_sc'; (root/'data').mkdir(parents=True)
    for split, n in (('train', 16), ('validation', 4), ('test', 4)):
        datasets.Dataset.from_dict(dict(sentence=[f'film {i} was {"good" if i % 2 else "bad"}' for i in range(n)],
                                        label=[i % 2 for i in range(n)])).to_parquet(root/'data'/f'{split}-00000-of-00001.parquet')
    def load_():
        return {s: [dict(text=r['sentence'], label=r['label']) for r in tasks._hub(str(root), None, s)]
                for s in ('train', 'validation', 'test')}
    monkeypatch.setitem(tasks.TASKS, 'local_sc', tasks.Task('local_sc', 'SC', 'sequence', load_, ('bad', 'good'), max_length=64))
    return root


def _sweep(results, task):
    sw.finetune_sweep(FinetuneConfig(tasks=task, lrs='1e-3', seeds='0', max_steps=1, eval_every=1, batch_size=4,
                                     micro_batch_size=4, max_eval_examples=4, results=str(results),
                                     feature_cache='off', progress=False))
    return results


def test_a_local_dataset_is_recorded_by_its_content_in_rows_and_the_config(tmp_path, local_sc):
    data, rev = tasks.load_task_revision(tasks.TASKS['local_sc'])
    assert rev.startswith('content-sha256:') and len(data['train']) == 16
    store = _sweep(tmp_path/'r.jsonl', 'local_sc')
    rows = load_results(store)
    assert rows['dataset_revision'].tolist() == [rev]
    record = next((shard_dir(store)/'configs').glob('*/run.json'))
    assert json.loads(record.read_text())['dataset_revisions'] == {'local_sc': rev}
    (local_sc/'data'/'test-00000-of-00001.parquet').write_bytes(
        (local_sc/'data'/'train-00000-of-00001.parquet').read_bytes())   # the data moved
    assert tasks.load_task_revision(tasks.TASKS['local_sc'])[1] not in (None, rev)


def test_embedded_rows_say_no_revision_is_known(tmp_path):
    rows = load_results(_sweep(tmp_path/'r.jsonl', 'rt_sentiment'))
    assert 'dataset_revision' in rows and rows['dataset_revision'].isna().all()
