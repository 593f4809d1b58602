"""Issue 46 item 3: `mlmclm evaluate CHECKPOINT` fine-tunes any checkpoint under a preset of the paper's protocol and
ends with its place in the rank clusters of the store."""
import pytest

from mlmclm.cli import COMMANDS, main
from mlmclm.data.tokenizers import load_tokenizer
from mlmclm.model.backbones import save_tiny_backbone
from mlmclm.results.store import read_rows
from mlmclm.study.evaluate import EVALUATE_PRESETS, evaluate_config

pytestmark = pytest.mark.usefixtures('one_thread')
SMALL = ['--preset', 'demo', '--tasks', 'rt_sentiment', '--lrs', '1e-3', '--seeds', '0,1', '--max-steps', '1',
         '--max-eval-examples', '16']


def test_evaluate_places_a_model_from_outside_among_the_stores(tmp_path, capsys):
    assert COMMANDS['evaluate'][0] == 'mlmclm.study.evaluate'
    store = tmp_path/'results.jsonl'
    main(['evaluate', 'tiny-random', '--results', str(store), *SMALL])             # the store's other system
    folder = save_tiny_backbone('modernbert', tmp_path/'my-modernbert', load_tokenizer('embedded'))
    capsys.readouterr()
    main(['evaluate', str(folder), '--results', str(store), *SMALL])
    out = capsys.readouterr().out
    assert 'my-modernbert †: its place in the rank clusters' in out, out
    assert 'SC rt_sentiment: cluster ' in out and '(2 systems)' in out and 'SC family: #' in out
    rows = [r for r in read_rows(store) if r['checkpoint_name'] == 'my-modernbert']
    assert len(rows) == 2 and {r['backbone_type'] for r in rows} == {'modernbert'} and all(r['outside_grid'] for r in rows)


def test_the_paper_tasks_preset_is_the_papers_protocol(tmp_path):
    cfg = evaluate_config('answerdotai/ModernBERT-base', results=tmp_path/'r.jsonl')
    assert (cfg.tasks, cfg.lrs, cfg.seeds, cfg.max_steps, cfg.batch_size, cfg.attention, cfg.pooling) == \
        ('all', '1e-05,2e-05,5e-05,0.0001,0.0002,0.0005', '0,1,2,3,4', None, 32, 'bidirectional', 'mean')
    assert cfg.checkpoint_name == 'answerdotai/ModernBERT-base' and set(EVALUATE_PRESETS) == {'paper-tasks', 'demo'}


def test_bad_input_exits_with_a_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as e: main(['evaluate', str(tmp_path/'nothing-here'), '--preset', 'demo'])
    assert e.value.code == 2 and 'does not exist' in capsys.readouterr().err
