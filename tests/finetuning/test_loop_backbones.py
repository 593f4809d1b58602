"""Issue 46 item 1: a checkpoint of any architecture fine-tunes and evaluates through the same sweep, heads, packing,
pooling and result rows as ours, the rows naming its architecture, revision and packing, and the guard's verdict."""
import pytest
import torch

from tiny import tiny_cfg
from mlmclm.data.tokenizers import load_tokenizer
from mlmclm.finetuning import loop as ft
from mlmclm.finetuning.sweep import finetune_sweep
from mlmclm.model.backbones import TINY_ARCHITECTURES, BackboneSpec, save_tiny_backbone
from mlmclm.results.store import read_rows

pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture(scope='module')
def folders(tmp_path_factory):
    tok, root = load_tokenizer('embedded'), tmp_path_factory.mktemp('zoo')
    return {mt: save_tiny_backbone(mt, root/mt, tok) for mt in TINY_ARCHITECTURES}


@pytest.mark.parametrize('model_type', [m for m in TINY_ARCHITECTURES if m != 'llama'])
def test_every_architecture_fine_tunes_through_the_sweep(model_type, folders, tmp_path):
    cfg = tiny_cfg(tmp_path, checkpoint=str(folders[model_type]), feature_cache='off', pooling='last')
    finetune_sweep(cfg)
    rows = read_rows(cfg.results)
    assert len(rows) == 1
    r = rows[0]
    assert (r['backbone_type'], r['outside_grid'], r['packing'], r['packing_used'], r['attention_observed']) == \
        (model_type, True, True, True, 'bidirectional')
    assert r['backbone'].endswith('Model') and r['backbone_revision'].startswith('sha256:')
    assert r['attention_kernel'] == 'transformers sdpa' and r['pooling'] == 'last' and 0 <= r['test_score'] <= 1
    assert r['checkpoint_name'] == model_type


def test_our_own_checkpoints_stay_on_the_fast_path(folders, tmp_path):
    finetune_sweep(cfg := tiny_cfg(tmp_path, checkpoint=str(folders['llama']), feature_cache='off'))
    rows = read_rows(cfg.results)
    assert (rows[0]['backbone'], rows[0]['attention_kernel']) == ('mlmclm.Transformer', 'mlmclm.model.transformer.reference_varlen (CPU)')
    assert rows[0]['outside_grid']   # a Llama from outside the study: our path, but not the paper's grid
    finetune_sweep(cfg := tiny_cfg(tmp_path/'c', feature_cache='off'))
    control = read_rows(cfg.results)[0]
    assert (control['backbone'], control['outside_grid']) == ('mlmclm.Transformer', False)


def test_packed_and_padded_fine_tuning_agree(folders, tmp_path):
    "The same run packed and padded (a backbone that packs): the same losses and scores, up to float rounding."
    base, tok = ft._load_base(tiny_cfg(tmp_path, checkpoint=str(folders['qwen3'])))
    from mlmclm.tasks.registry import TASKS
    task = TASKS['rt_sentiment']
    data = {task.name: task.load()}
    out = []
    for packing in (True, False):
        losses = []
        cfg = tiny_cfg(tmp_path, checkpoint=str(folders['qwen3']), packing=packing, max_steps=3, feature_cache='off')
        row, = ft.finetune_run(task, [task], data, base, tok, 1e-3, 0, cfg, losses)
        out.append((losses, row['test_score'], row['packing_used']))
    (l1, s1, p1), (l2, s2, p2) = out
    assert (p1, p2) == (True, False) and s1 == s2
    assert max(abs(a - b) for a, b in zip(l1, l2)) < 1e-4, (l1, l2)


def test_a_backbone_that_cannot_pack_pads_and_says_why(folders, tmp_path, monkeypatch):
    base, tok = ft._load_base(tiny_cfg(tmp_path, checkpoint=str(folders['bert'])))
    base.spec = BackboneSpec(**{**base.spec.__dict__, 'packs': False, 'packing_note': 'padded: BertModel says no'})
    monkeypatch.setattr(ft, '_load_base', lambda cfg: (base, tok))
    finetune_sweep(cfg := tiny_cfg(tmp_path, checkpoint=str(folders['bert']), feature_cache='off'))
    r = read_rows(cfg.results)[0]
    assert (r['packing'], r['packing_used'], r['packing_note'], r['micro_batch_tokens']) == (True, False, 'padded: BertModel says no', None)


def test_a_retriever_from_outside_trains_and_exports(folders, tmp_path):
    "Retrieval (in-batch negatives) on a Gemma-3 decoder run bidirectionally, saved as a sentence-transformers folder."
    cfg = tiny_cfg(tmp_path, checkpoint=str(folders['gemma3_text']), tasks='corpus_retrieval', feature_cache='off',
                   save_retriever=str(tmp_path/'st'))
    finetune_sweep(cfg)
    r = read_rows(cfg.results)[0]
    assert r['family'] == 'IR' and r['attention_observed'] == 'bidirectional'
    folder, = (tmp_path/'st').iterdir()
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(str(folder), device='cpu')
    assert st.encode(['a query'], prompt_name='query').shape == (1, 64)
