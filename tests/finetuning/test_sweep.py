"""Fine-tuning pieces without papermill: resumable results and the SentenceTransformer export of a trained retriever."""
import pytest
import torch
import torch.nn.functional as F

import mlmclm.finetuning.loop as ft

import mlmclm.finetuning.sweep as sw
from mlmclm.protocol.runs import FinetuneConfig
import mlmclm.finetuning.features as enc
from mlmclm.results.store import read_rows
from mlmclm.data.tokenizers import load_tokenizer
from mlmclm.model.heads import TaskModel
from mlmclm.model.checkpoints import load
from mlmclm.tasks.registry import TASKS


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
