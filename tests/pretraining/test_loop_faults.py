"""Pretraining under attack: crashes between renames, reused run ids, missing devices, bad inputs, SIGKILL at random
points (issue 17 items 3, 5, 7-10 for pretraining; issue 15's pretraining fault cases), two launchers of one run.
Each item's test is named after it and failed before its fix."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mlmclm.base.configs import ConfigError, build_config
from mlmclm.protocol.paper import ADAMW
from mlmclm.base.files import project_root, read_json, read_jsonl
from mlmclm.model.transformer import build_model
from mlmclm.model.checkpoints import check_checkpoint, load, save
from mlmclm.protocol.runs import PretrainConfig, PretrainRun, pretrain_config
from mlmclm.pretraining.loop import pretrain
from mlmclm.pretraining.checks import check_pretrain_config
from mlmclm.base.claims import ClaimHeld

from tiny import SMALL_BATCH_MLM, tiny_run_cfg

ROOT = project_root()
PY = sys.executable
TINY = dict(size='tiny', schedule='mlm', total_steps=8, seq_len=32, batch_size=4, warmup_steps=1, decay_steps=2,
            save_every=2, log_every=1, progress=False, prefetch=0)


def _cfg(tmp, **kw):
    return build_config(PretrainConfig, {**TINY, 'out_dir': str(tmp), 'run_id': 'r', **kw})


def _weights(folder):
    return load(folder).state_dict()


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
    "The uninterrupted tiny run every interrupted one must end at."
    tmp = tmp_path_factory.mktemp('straight')
    return _weights(pretrain(_cfg(tmp, run_id='straight'))/'checkpoints'/'step-8')


# ---------------------------------------------------------------- issue 17, item 3
def test_item3_crash_between_the_two_renames_recovers_the_newest_complete_copy(tmp_path, straight, capsys):
    run = pretrain(_cfg(tmp_path, stop_at_step=2))
    older = tmp_path/'older'
    shutil.copytree(run/'state', older)                       # the complete state of step 2
    pretrain(_cfg(tmp_path, stop_at_step=4))                   # state/ now holds step 4
    # what a kill between `rename(state, .state.old)` and `rename(.state.tmp, state)` leaves behind
    os.replace(run/'state', run/'.state.tmp-4242')
    os.replace(older, run/'.state.old-4242')
    capsys.readouterr()
    pretrain(_cfg(tmp_path))
    out = capsys.readouterr()
    text = out.out + out.err
    assert 'recovered' in text and '.state.tmp-4242' in text, text[-2000:]
    assert 'resumed from' in text and 'at step 4' in text, text[-2000:]
    assert _same(straight, _weights(run/'checkpoints'/'step-8'))
    assert not list(run.glob('.state.*'))


# ---------------------------------------------------------------- issue 17, item 5
@pytest.mark.parametrize('field, value', [('lr', float('nan')), ('lr', float('inf')), ('mask_ratio', float('nan')),
                                          ('adam_eps', float('inf')), ('grad_clip', float('nan'))])
def test_item5_non_finite_numbers_are_refused_by_the_pretraining_guard(tmp_path, field, value):
    with pytest.raises(ConfigError, match=f'{field}={value} is not a finite number'):
        check_pretrain_config(_cfg(tmp_path, **{field: value}))


# ---------------------------------------------------------------- issue 13, item 6
def test_item6_the_state_folder_does_not_look_like_a_model_and_says_so(tmp_path):
    run = pretrain(_cfg(tmp_path, total_steps=2, warmup_steps=0, decay_steps=0))
    state = run/'state'
    assert not (state/'config.json').exists() and not list(state.glob('*.safetensors'))
    for key in ('checkpoint', 'init_from'):
        with pytest.raises(ConfigError, match=f"{key}=.*state' is a training-state folder .*not a model"):
            check_checkpoint(state, key)
    with pytest.raises(ConfigError, match='not a model'):
        load(state)
    ck = run/'checkpoints'/'step-2'                   # every folder that looks like a model carries its tokenizer
    check_checkpoint(ck)
    assert (ck/'tokenizer_config.json').is_file() and (ck/'state'/'trainer.pt').is_file()


def test_a_state_written_by_the_earlier_format_still_resumes_exactly(tmp_path, straight):
    "Before the DCP state, `state/` held model.safetensors and state.pt (index-keyed optimizer state); such runs resume."
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from mlmclm.base.optim import adamw
    run = pretrain(_cfg(tmp_path, stop_at_step=4))
    model = build_model('tiny'); opt = adamw(model, TINY.get('lr', PretrainConfig.lr), ADAMW)
    msd, osd = get_state_dict(model, opt)
    dcp.load(dict(model=msd, optim=osd), checkpoint_id=str(run/'state'))
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    trainer = torch.load(run/'state'/'trainer.pt', weights_only=True)
    legacy = tmp_path/'legacy'
    save(model, legacy)
    extra = json.loads(trainer['extra'])
    torch.save(dict(optimizer=opt.state_dict(), scheduler=trainer['scheduler'], step=4, torch_rng=trainer['torch_rng'],
                    extra=json.dumps(dict(tokens_seen=extra['tokens_seen'], run_id='r'))), legacy/'state.pt')
    shutil.rmtree(run/'state'); os.replace(legacy, run/'state')
    assert _same(straight, _weights(pretrain(_cfg(tmp_path))/'checkpoints'/'step-8'))


# ---------------------------------------------------------------- issue 17, item 7
def test_item7_reusing_a_run_id_with_another_config_is_refused_unless_asked(tmp_path):
    run = pretrain(_cfg(tmp_path, stop_at_step=2, lr=1e-3))
    with pytest.raises(ConfigError, match=r"run_id='r' already holds a run trained with other settings: lr 0.001 -> 0.002"):
        pretrain(_cfg(tmp_path, lr=2e-3))
    assert read_json(run/'run.json')['config']['lr'] == 1e-3            # untouched by the refused attempt
    pretrain(_cfg(tmp_path, lr=2e-3, on_config_change='resume_anyway', stop_at_step=4))
    record = read_json(run/'run.json')
    assert record['config']['lr'] == 2e-3
    assert [(h['config']['lr'], h['until_step']) for h in record['config_history']] == [(1e-3, 2)]
    pretrain(_cfg(tmp_path, lr=3e-3, on_config_change='force_new', stop_at_step=1))
    record = read_json(run/'run.json')
    assert record['config']['lr'] == 3e-3 and record['resumed_at'] == 0 and 'config_history' not in record
    aside = [p for p in tmp_path.iterdir() if p.name.startswith('r.superseded-')]
    assert len(aside) == 1 and read_json(aside[0]/'run.json')['config']['lr'] == 2e-3   # nothing deleted


def test_item7_a_matching_config_resumes_and_session_fields_may_change(tmp_path, straight):
    pretrain(_cfg(tmp_path, stop_at_step=3))
    run = pretrain(_cfg(tmp_path, log_every=4, save_every=3, prefetch=2))   # how it runs, not what it computes
    assert _same(straight, _weights(run/'checkpoints'/'step-8'))


# ---------------------------------------------------------------- issue 17, item 8
@pytest.mark.skipif(torch.cuda.is_available(), reason='needs a machine without CUDA')
def test_item8_device_cuda_without_cuda_fails_before_training(tmp_path):
    with pytest.raises(ConfigError, match="device='cuda' but this machine has no CUDA device"):
        pretrain(_cfg(tmp_path, device='cuda'))
    assert not (tmp_path/'r').exists()


def test_item8_the_run_record_says_what_ran(tmp_path):
    run = pretrain(_cfg(tmp_path, total_steps=2, warmup_steps=0, decay_steps=0))
    record = read_json(run/'run.json')
    assert record['ran_on'] == dict(device='cpu', processes=1, sharding='none', mixed_precision='no')


# ---------------------------------------------------------------- issue 17, item 9
def test_item9_seq_len_beyond_the_position_limit_fails_before_allocating(tmp_path):
    with pytest.raises(ConfigError, match=r'seq_len=100000 exceeds max_position_embeddings=1024 of size=tiny'):
        check_pretrain_config(_cfg(tmp_path, seq_len=100_000))


@pytest.mark.parametrize('name, content, message', [
    ('empty.txt', b'', 'every document is empty or whitespace only'),
    ('blank.txt', b' \n\t \n', 'every document is empty or whitespace only'),
    ('latin1.txt', b'caf\xe9 cr\xe8me', "latin1.txt' is not UTF-8 text (byte 3"),
    ('rows.jsonl', b'{"text": "a fine row"}\n{"body": "no text"}\n', "rows.jsonl:2 has no text in field 'text'"),
])
def test_item9_bad_data_files_fail_before_the_run_folder_exists(tmp_path, name, content, message):
    (tmp_path/name).write_bytes(content)
    with pytest.raises(ConfigError, match=message.replace('(', r'\(').replace('[', r'\[')):
        pretrain(_cfg(tmp_path/'runs', data=str(tmp_path/name), store_dir=str(tmp_path/'stores')))
    assert not (tmp_path/'runs'/'r').exists()


def _checkpoint(folder):
    return save(build_model('tiny'), folder)


def test_item9_a_truncated_or_empty_safetensors_is_named(tmp_path):
    for size in ('empty', 'truncated'):
        ck = _checkpoint(tmp_path/size)
        data = (ck/'model.safetensors').read_bytes()
        (ck/'model.safetensors').write_bytes(b'' if size == 'empty' else data[:len(data) // 2])
        with pytest.raises(ConfigError, match=f"{size}/model.safetensors is not a readable safetensors file"):
            check_pretrain_config(_cfg(tmp_path, init_from=str(ck)))
        with pytest.raises(ConfigError, match=f"{size}/model.safetensors is not a readable safetensors file"):
            load(ck)


def test_item9_a_folder_without_config_json_fails_in_the_guard(tmp_path):
    ck = _checkpoint(tmp_path/'ck')
    (ck/'config.json').unlink()
    with pytest.raises(ConfigError, match=r"init_from='.*ck' has no config.json"):
        check_pretrain_config(_cfg(tmp_path, init_from=str(ck)))


# ---------------------------------------------------------------- issue 17, item 10
def test_item10_metrics_are_truncated_to_the_resumed_step(tmp_path):
    run = pretrain(_cfg(tmp_path, stop_at_step=4))
    shutil.copytree(run/'state', tmp_path/'state-4')
    pretrain(_cfg(tmp_path, stop_at_step=6))                  # metrics hold steps 1..6
    shutil.rmtree(run/'state'); shutil.copytree(tmp_path/'state-4', run/'state')   # as a kill before step 6's save
    pretrain(_cfg(tmp_path))
    steps = [m['step'] for m in read_jsonl(run/'metrics.jsonl')]
    assert steps == list(range(1, 9)), steps


@pytest.mark.parametrize('run_id', ['/tmp/elsewhere', '../escape', 'a/b', '.hidden'])
def test_item10_a_run_id_that_is_not_a_plain_folder_name_is_rejected(tmp_path, run_id):
    with pytest.raises(ConfigError, match='must be a plain folder name'):
        check_pretrain_config(_cfg(tmp_path, run_id=run_id))


# ---------------------------------------------------------------- issue 15: SIGKILL at 5 random points
def _whole(folder):
    "A folder `atomic_dir` put in place: marked complete, and (for a checkpoint) loadable."
    return (folder/'.complete').is_file() and (folder.name == 'state' or load(folder) is not None)


@pytest.mark.slow
def test_sigkill_at_five_random_points_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path, straight):
    rng = random.Random()
    seed = rng.randrange(10**6); rng.seed(seed)
    cmd = [PY, '-m', 'mlmclm.pretraining.loop', 'run', *(f'{k}={v}' for k, v in TINY.items()), f'out_dir={tmp_path}',
           'run_id=killed', 'save_every=1', 'checkpoint_steps=3,5']
    run, kills = tmp_path/'killed', []
    writing = lambda: list(run.glob('.state.tmp-*')) + list(run.glob('checkpoints/.step-*.tmp-*'))
    for k in range(5):
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        done = len(read_jsonl(run/'metrics.jsonl'))
        target, during_write = done + rng.randint(0, 2), k % 2 == 1        # every other kill waits for a write
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if len(read_jsonl(run/'metrics.jsonl')) >= target and (not during_write or writing()): break
            time.sleep(0.001)
        in_write = bool(writing())
        proc.send_signal(signal.SIGKILL); proc.wait()
        kills.append((len(read_jsonl(run/'metrics.jsonl')), in_write))
        for folder in [run/'state', *run.glob('checkpoints/step-*')]:
            assert not folder.exists() or _whole(folder), (seed, kills, folder)   # nothing half-written in place
    assert sum(w for _, w in kills) >= 2, (seed, kills)
    assert kills[-1][0] < 8, (seed, kills)
    final = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-3000:]
    print(f'seed {seed}: killed at (steps logged, inside a write) {kills}')
    assert _same(straight, _weights(run/'checkpoints'/'step-8')), (seed, kills)
    assert [m['step'] for m in read_jsonl(run/'metrics.jsonl')] == list(range(1, 9))
    assert not list(run.glob('.*.tmp-*')) and not list(run.glob('.*.old-*'))


# ---------------------------------------------------------------- issue 15: bad pretraining inputs, as a table
def _model_folder(tmp, name, **config):
    ck = save(build_model('tiny'), tmp/name)
    if config: (ck/'config.json').write_text(json.dumps({**json.loads((ck/'config.json').read_text()), **config}))
    return ck


def _state_only(tmp):
    (tmp/'state').mkdir(); (tmp/'state'/'trainer.pt').write_bytes(b'')
    return tmp/'state'


BAD_PRETRAINING_INPUTS = [   # (values, or a function of the test folder giving them; what the message must say)
    (dict(lr=float('nan')), 'lr=nan is not a finite number'),
    (dict(lr='fast'), "lr='fast' has type str; expected float"),
    (dict(batch_size=2.5), 'batch_size=2.5 has type float; expected int'),
    (dict(total_steps=0), 'total_steps=0 is out of range; allowed: >= 1'),
    (dict(schedule='clm:10,mlm40:x'), "cannot read phase 'mlm40:x'"),
    (dict(schedule='clm:3,mlm40:3', total_steps=8), "schedule='clm:3,mlm40:3' has 6 steps but total_steps=8"),
    (dict(checkpoint_steps='4,eight'), "checkpoint_steps='4,eight' must be a comma list of integers"),
    (dict(warmup_steps=6, decay_steps=6), 'warmup_steps + decay_steps = 12 exceeds total_steps=8'),
    (dict(seq_len=5000), 'seq_len=5000 exceeds max_position_embeddings=1024'),
    (dict(run_id='/etc/run'), "run_id='/etc/run' must be a plain folder name"),
    (dict(data_offset=-1), 'data_offset=-1 is out of range'),
    (dict(on_config_change='overwrite'), "on_config_change='overwrite' is not allowed"),
    (lambda t: dict(init_from=str(_model_folder(t, 'bert', model_type='bert'))), "model_type='bert' is not supported"),
    (lambda t: dict(init_from=str(_state_only(t))), 'is a training-state folder'),
    (lambda t: dict(resume_from=str(_model_folder(t, 'model'))), 'holds no training state'),
    (lambda t: dict(data=str(t/'missing.jsonl')), "is neither 'embedded', 'fineweb-edu', a token store nor an existing"),
]
if not torch.cuda.is_available():
    BAD_PRETRAINING_INPUTS.append((dict(device='cuda:0'), "device='cuda:0' but this machine has no CUDA device"))


@pytest.mark.parametrize('values, message', BAD_PRETRAINING_INPUTS, ids=[m[:40] for _, m in BAD_PRETRAINING_INPUTS])
def test_bad_pretraining_inputs_fail_before_any_work_with_the_value_named(tmp_path, values, message):
    values = values(tmp_path) if callable(values) else values
    with pytest.raises(ConfigError) as err:
        pretrain(build_config(PretrainConfig, {**TINY, 'out_dir': str(tmp_path/'runs'), 'run_id': 'r', **values}))
    assert message in str(err.value), str(err.value)
    assert not (tmp_path/'runs'/'r').exists()             # failed before the run folder (or any training) existed


# ---------------------------------------------------------------- issue 27, items 6 and 20: the state folder is checked
class _Planted:
    "A pickle that writes a file when it is loaded: what an attacker who can write `state/` would plant."
    def __init__(self, marker): self.marker = str(marker)
    def __reduce__(self): return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


@pytest.fixture(scope='module')
def stopped(tmp_path_factory):
    "A run stopped at step 4 with a checkpoint (and its state) at step 2; each test damages a copy."
    tmp = tmp_path_factory.mktemp('stopped')
    pretrain(_cfg(tmp, stop_at_step=4, checkpoint_steps='2'))
    return tmp


def _copy_run(stopped, tmp_path):
    shutil.copytree(stopped, tmp_path, dirs_exist_ok=True)
    return tmp_path/'r'


def _refused(tmp_path, *names):
    "Resuming the run refuses, naming `names` and the checkpoint to resume from; returns the message."
    with pytest.raises(ConfigError) as err:
        pretrain(_cfg(tmp_path, checkpoint_steps='2'))
    text = str(err.value)
    assert all(n in text for n in names) and 'checkpoints/step-2/state' in text, text
    return text


def test_item6_a_planted_metadata_pickle_is_refused_before_anything_is_unpickled(stopped, tmp_path):
    import pickle
    run, marker = _copy_run(stopped, tmp_path), tmp_path/'pwned'
    (run/'state'/'.metadata').write_bytes(pickle.dumps(_Planted(marker)))
    _refused(tmp_path, 'state/.metadata', 'fails its checksum')
    assert not marker.exists()


def _flip(path):
    raw = bytearray(path.read_bytes()); raw[len(raw) // 2] ^= 1; path.write_bytes(bytes(raw))


DAMAGED_STATES = {   # id: (what is done to state/, what the refusal names)
    'a flipped byte in the weights': (lambda s: _flip(next(s.glob('*.distcp'))), 'fails its checksum'),
    'trainer.pt truncated': (lambda s: (s/'trainer.pt').write_bytes((s/'trainer.pt').read_bytes()[:100]),
                             'trainer.pt fails its checksum (it is 100 bytes'),
    'trainer.pt missing': (lambda s: (s/'trainer.pt').unlink(), 'trainer.pt is missing'),
    '.metadata missing': (lambda s: (s/'.metadata').unlink(), '.metadata is missing'),
    'a file added': (lambda s: (s/'extra.pt').write_bytes(b'x'), 'extra.pt is not in'),
    'the manifest torn': (lambda s: (s/'checksums.json').write_text('{"files": {'), 'checksums.json is not'),
    'the manifest gone (as a state of the previous version)': (lambda s: (s/'checksums.json').unlink(), 'seal-state'),
}


@pytest.mark.parametrize('case', list(DAMAGED_STATES))
def test_item20_a_damaged_state_is_refused_naming_the_file_and_the_checkpoints(stopped, tmp_path, case):
    damage, message = DAMAGED_STATES[case]
    run = _copy_run(stopped, tmp_path)
    damage(run/'state')
    _refused(tmp_path, message)


def test_item20_the_refusal_says_how_to_resume_from_a_checkpoint_and_that_resumes_exactly(stopped, straight, tmp_path):
    run = _copy_run(stopped, tmp_path)
    _flip(run/'state'/'trainer.pt')
    text = _refused(tmp_path, 'trainer.pt')
    assert f"rm -r {run/'state'} && cp -r {run/'checkpoints'/'step-2'/'state'} {run/'state'}" in text, text
    shutil.rmtree(run/'state'); shutil.copytree(run/'checkpoints'/'step-2'/'state', run/'state')
    assert _same(straight, _weights(pretrain(_cfg(tmp_path, checkpoint_steps='2'))/'checkpoints'/'step-8'))


def test_item6_a_state_without_checksums_resumes_once_sealed(stopped, straight, tmp_path):
    from mlmclm.pretraining.train_state import seal_state
    run = _copy_run(stopped, tmp_path)
    (run/'state'/'checksums.json').unlink()                  # what the previous version wrote
    _refused(tmp_path, 'seal-state')
    seal_state(run/'state')                                  # the owner vouches for it
    assert _same(straight, _weights(pretrain(_cfg(tmp_path, checkpoint_steps='2'))/'checkpoints'/'step-8'))


# ---------------------------------------------------------------- one trainer per pretraining run (issue 27 item 16)
SMALL = dict(size='tiny', schedule='clm', seq_len=32, batch_size=4, warmup_steps=1, decay_steps=2, progress=False,
             prefetch=0, log_every=1)


def test_a_run_another_launcher_holds_is_refused_before_any_work(tmp_path):
    cfg = pretrain_config(**SMALL, total_steps=4, out_dir=str(tmp_path), run_id='r')
    held = PretrainRun('r', tmp_path).try_claim()
    with pytest.raises(ClaimHeld, match="run 'r' .* is being trained by"):
        pretrain(cfg)
    assert not (tmp_path/'r').exists()                                    # nothing was made
    held.release()
    pretrain(cfg)
    assert PretrainRun('r', tmp_path).status() == 'done' and not PretrainRun('r', tmp_path).claim_path.exists()


def test_two_launchers_of_one_run_train_it_once(tmp_path):
    args = [f'{k}={v}' for k, v in dict(SMALL, total_steps=40, out_dir=tmp_path, run_id='same').items()]
    procs = [subprocess.Popen([PY, '-m', 'mlmclm.pretraining.loop', 'run', *args], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) + (p.returncode,) for p in procs]
    refused = [o for o in outs if o[2] != 0]
    assert all('is being trained by' in o[1] for o in refused), [o[1][-2000:] for o in refused]
    assert [m['step'] for m in read_jsonl(tmp_path/'same'/'metrics.jsonl')] == list(range(1, 41))   # each step once
    assert PretrainRun('same', tmp_path).status() == 'done'


# ------------------------------------ third fault attack (issue 34 item 10, N18): an empty micro-batch, a diverged step
def test_n18_an_empty_micro_batch_is_named_and_no_state_is_promised(tmp_path, monkeypatch):
    import mlmclm.pretraining.checks as session
    monkeypatch.setattr(session, 'EMPTY_BATCHES_ALLOWED', float('inf'))         # past the config check, as before it
    with pytest.raises(FloatingPointError) as err:
        pretrain(tiny_run_cfg(tmp_path, mask_ratio=0.02, **SMALL_BATCH_MLM))
    text = str(err.value)
    assert 'has no masked token (2 rows x 16 tokens, mask_ratio=0.02), so its loss is 0/0' in text, text
    assert 'no state was saved yet' in text and 'state is kept' not in text and 'fix lr/data' not in text, text
    assert state_missing(tmp_path/'a')


def state_missing(run: Path) -> bool:
    return not (run/'state').exists()


def test_n18_a_diverged_step_names_the_state_that_exists(tmp_path, monkeypatch):
    import mlmclm.pretraining.loop as pt
    calls, real = [], pt.lm_loss
    def diverging(*args, **kw):
        loss, n = real(*args, **kw); calls.append(1)
        return (loss * float('nan') if len(calls) == 3 else loss), n
    monkeypatch.setattr(pt, 'lm_loss', diverging)
    with pytest.raises(FloatingPointError) as err:
        pretrain(tiny_run_cfg(tmp_path, save_every=1, checkpoint_steps=''))
    text = str(err.value)
    assert 'non-finite loss nan at step 3 (clm): no micro-batch of this process was empty, so the training diverged' in text
    assert f"the last good state is kept in {tmp_path/'a'/'state'}" in text and (tmp_path/'a'/'state').is_dir(), text
    assert "on_config_change='resume_anyway' it goes on under the changed settings" in text, text
    monkeypatch.undo()                                                       # the advice holds: it goes on at a lower lr
    run = pretrain(tiny_run_cfg(tmp_path, save_every=1, checkpoint_steps='', lr=1e-3, on_config_change='resume_anyway'))
    assert [(r['step'], r['lr']) for r in read_jsonl(run/'metrics.jsonl')][2:] == [(3, 1e-3), (4, 1e-3)]
