"""Issue 46 item 4: retrieval on MTEB's terms (`mteb` itself scores exported retrievers and base encoders, offline, on a
tiny task in MTEB's own format). Skipped where the optional extra `mteb` is not installed."""
import importlib.util
import json

import pytest

from mlmclm.base.configs import ConfigError
from mlmclm.data.tokenizers import load_tokenizer
from mlmclm.finetuning import mteb_eval
from mlmclm.model.backbones import open_checkpoint, save_tiny_backbone
from mlmclm.model.guard import AttentionModeError
from mlmclm.model.heads import TaskModel
from mlmclm.tasks.registry import TASKS

HAS_MTEB = importlib.util.find_spec('mteb') is not None
needs_mteb = pytest.mark.skipif(not HAS_MTEB, reason='the optional extra mteb is not installed (pip install "mlmclm[mteb]")')


@pytest.mark.skipif(HAS_MTEB, reason='mteb is installed')
def test_without_the_extra_a_score_says_what_to_install():
    with pytest.raises(ConfigError, match=r'needs the optional extra mteb, which is not installed: pip install "mlmclm\[mteb\]"'):
        mteb_eval.mteb_scores('any', {})


@needs_mteb
def test_a_base_encoder_and_its_export_score_alike(tmp_path):
    from mlmclm.finetuning.loop import save_sentence_transformer
    tok = load_tokenizer('embedded')
    folder = save_tiny_backbone('qwen3', tmp_path/'qwen3', tok)
    tasks = {'MlmclmCorpusRetrieval': TASKS['corpus_retrieval'].load()['test']}
    base = mteb_eval.mteb_scores(mteb_eval.base_encoder(folder, max_length=128), tasks)
    export = save_sentence_transformer(TaskModel(open_checkpoint(folder), 'embedding'), tok, tmp_path/'st', max_length=128)
    exported = mteb_eval.mteb_scores(export, tasks)        # a path: loaded as sentence-transformers loads it
    assert 0 <= base.main_score[0] <= 1 and abs(base.main_score[0] - exported.main_score[0]) < 1e-3


@needs_mteb
def test_an_export_that_runs_causal_is_refused(tmp_path):
    "A decoder exported with its config saying causal: sentence-transformers would run it causal; the guard says no."
    from mlmclm.finetuning.loop import save_sentence_transformer
    tok = load_tokenizer('embedded')
    folder = save_sentence_transformer(TaskModel(open_checkpoint(save_tiny_backbone('llama', tmp_path/'l', tok), path='transformers'),
                                                 'embedding'), tok, tmp_path/'st', max_length=128)
    config = json.loads((folder/'config.json').read_text()); config['is_causal'] = True
    (folder/'config.json').write_text(json.dumps(config))
    with pytest.raises(AttentionModeError, match='was asked for bidirectional attention but runs causal attention'):
        mteb_eval.exported_encoder(folder)
