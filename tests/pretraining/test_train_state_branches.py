"""Issue 49, N4: a branch (`resume_from` another run's checkpoint) must agree with the schedule its state trained, up
to the state's step. Before, a child `clm:4,mlm40:4` resumed from a pure-MLM parent's step 4 and recorded "clm for 4
steps, then mlm40" in its run.json, checkpoints and model card: a pure-MLM model drawn as a biphasic one."""
import json
import warnings

import pytest

from mlmclm.base.configs import build_config
from mlmclm.pretraining.loop import pretrain
from mlmclm.pretraining.train_state import StateError
from mlmclm.protocol.runs import PretrainConfig

TINY = dict(size='tiny', total_steps=8, seq_len=32, batch_size=4, warmup_steps=1, decay_steps=1, data='embedded',
            progress=False, prefetch=0, log_every=1, save_every=4, heldout_rows=0)


def _cfg(out, run_id, **kw):
    return build_config(PretrainConfig, {**TINY, 'out_dir': str(out), 'run_id': run_id, **kw})


@pytest.fixture(scope='module')
def parents(tmp_path_factory):
    "A pure-MLM parent and a moving-ratio parent, each with a checkpoint (and its state) at step 4."
    out = tmp_path_factory.mktemp('branches')
    mlm = pretrain(_cfg(out, 'mlm', schedule='mlm', checkpoint_steps='4', stop_at_step=4))
    moving = pretrain(_cfg(out, 'moving', schedule='mlm30to10:8', checkpoint_steps='4', stop_at_step=4))
    return out, mlm/'checkpoints'/'step-4', moving/'checkpoints'/'step-4'


def test_n4_a_branch_whose_first_steps_trained_another_objective_is_refused(parents, tmp_path):
    out, mlm, _ = parents
    with pytest.raises(StateError) as e:
        pretrain(_cfg(tmp_path, 'child', schedule='clm:4,mlm40:4', resume_from=str(mlm)))
    assert (f"the training state {mlm/'state'} trained mlm40 for 4 steps, but the schedule of this run ('clm:4,mlm40:4') "
            f"says its first 4 steps trained clm for 4 steps") in str(e.value)
    assert "on_config_change='resume_anyway'" in str(e.value)
    assert not (tmp_path/'child'/'checkpoints').exists()                # nothing recorded as trained


def test_n4_a_moving_ratio_branched_at_another_phase_length_is_refused(parents, tmp_path):
    "Its ratio at step 3 of a 4-step phase is not that at step 3 of an 8-step one."
    _, _, moving = parents
    with pytest.raises(StateError, match=r'trained mlm30to10 for 4 steps of a phase of 8, but .* says its first 4 steps '
                                         r'trained mlm30to10 for 4 steps of a phase of 4'):
        pretrain(_cfg(tmp_path, 'child', schedule='mlm30to10:4,clm:4', resume_from=str(moving)))


def test_n4_a_branch_that_agrees_resumes_and_records_what_was_trained(parents, tmp_path):
    out, mlm, _ = parents
    folder = pretrain(_cfg(tmp_path, 'child', schedule='mlm40:4,clm:4', resume_from=str(mlm)))
    card = (folder/'checkpoints'/'step-8'/'README.md').read_text()
    assert '`mlm40:4,clm:4`: mlm40 for 4 steps, then clm for 4 steps' in card
    assert json.loads((folder/'run.json').read_text())['resumed_at'] == 4


def test_n4_resume_anyway_accepts_the_difference_aloud(parents, tmp_path):
    out, mlm, _ = parents
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter('always')
        folder = pretrain(_cfg(tmp_path, 'child', schedule='clm:4,mlm40:4', resume_from=str(mlm),
                               on_config_change='resume_anyway', stop_at_step=5))
    assert any("trained mlm40 for 4 steps" in str(w.message) and 'resumed anyway' in str(w.message) for w in said)
    assert json.loads((folder/'run.json').read_text())['resumed_at'] == 4
