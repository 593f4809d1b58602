"""Issue 47 item 2, the trainer's side: `unique_tokens` repeats a budget of unique store tokens for epochs, reshuffled
each epoch, recorded in run.json; the held-out rows lie outside every budget; a run resumed mid-epoch is bit-identical."""
import json

import pytest
import torch

from mlmclm.base.configs import ConfigError, build_config
from mlmclm.base.files import read_jsonl
from mlmclm.data.token_store import EpochRows
from mlmclm.model.checkpoints import load
from mlmclm.pretraining.loop import pretrain
from mlmclm.pretraining.setup import heldout_first_token, setup, training_rows
from mlmclm.protocol.runs import PretrainConfig

from tiny import TINY_PRETRAIN

BUDGET = 12 * 32   # 12 rows of 32 tokens; 8 steps x 8 rows = 64 rows: 5.33 epochs


def _cfg(tmp, **kw):
    return build_config(PretrainConfig, {**TINY_PRETRAIN, 'schedule': 'mdlm', 'total_steps': 8, 'global_batch': 8,
                                         'unique_tokens': BUDGET + 5, 'heldout_rows': 8, 'heldout_every': 3,
                                         'heldout_measures': 'mdlm,mlm15',
                                         'out_dir': str(tmp), 'run_id': 'ep', **kw})


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
    return pretrain(_cfg(tmp_path_factory.mktemp('straight')))


def test_run_json_records_the_budget_and_its_epochs(straight):
    data = json.loads((straight/'run.json').read_text())['data']
    assert (data['unique_tokens'], data['epochs'], data['repeats'], data['end_token']) == (BUDGET, round(64 / 12, 4), True, BUDGET)
    assert data['shuffle'] == 'rows reshuffled each epoch (seed 42)' and data['heldout']['read_in_training'] is False
    assert json.loads((straight/'run.json').read_text())['config']['unique_tokens'] == BUDGET + 5


def test_the_common_measures_are_logged_at_every_heldout_point(straight):
    "An mdlm run's own held-out loss is its 'mdlm' measure (the same rows, masked alike); MLM at 15% beside it."
    held = [r for r in read_jsonl(straight/'metrics.jsonl') if r['heldout_loss'] is not None]
    assert [r['step'] for r in held] == [3, 6, 8]
    for r in held:
        assert set(r['heldout_measures']) == {'mdlm', 'mlm15'} and r['heldout_measures']['mdlm'] == r['heldout_loss']
    with pytest.raises(ConfigError, match="heldout_measures='mdlm,clm30': phase 'clm30:1': clm takes no mask ratio"):
        pretrain(_cfg(straight.parent/'bad', heldout_measures='mdlm,clm30'))
    assert not (straight.parent/'bad').exists()                                   # refused before any work


def test_the_run_reads_only_its_budget_each_epoch_reshuffled(tmp_path):
    run, _ = setup(_cfg(tmp_path))
    try:
        read = training_rows(run)
        assert isinstance(read, EpochRows)
        budget = run.store.rows(0, 0, 12, 32)['input_ids']
        got = read(0, 36)['input_ids']                                           # three epochs
        index = [next(i for i in range(12) if torch.equal(budget[i], row)) for row in got]
        assert [sorted(index[e * 12:(e + 1) * 12]) for e in range(3)] == [list(range(12))] * 3
        assert index[:12] != index[12:24] != index[24:]
        assert heldout_first_token(len(run.store), 8, 32) >= BUDGET
    finally: run.release()


def test_a_run_resumed_mid_epoch_is_bit_identical(straight, tmp_path):
    pretrain(_cfg(tmp_path, stop_at_step=2))                                      # 16 rows: mid second epoch
    resumed = pretrain(_cfg(tmp_path))
    a, b = read_jsonl(straight/'metrics.jsonl'), read_jsonl(resumed/'metrics.jsonl')
    assert [(r['step'], r['loss']) for r in a] == [(r['step'], r['loss']) for r in b]
    held = lambda rows: [(r['step'], r['heldout_loss']) for r in rows if r['step'] in (3, 6, 8)]
    assert held(a) == held(b)          # (the stopped session also measured the held-out rows at its last step, 2)
    wa, wb = load(straight/'checkpoints'/'step-8').state_dict(), load(resumed/'checkpoints'/'step-8').state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_budget_reaching_the_heldout_rows_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r'unique_tokens=10,000,000 from data_offset=0 ends at store token 10,000,000, '
                                          r'past [\d,]+ where the held-out rows begin; give at most'):
        pretrain(_cfg(tmp_path, unique_tokens=10_000_000))
