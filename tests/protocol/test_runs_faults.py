"""Faults of run identity (issue 27 items 7, 16, 19, 21): our runs and imported ones in one store, two launchers of one
pretraining run, `study status` on a plan with a control, and numbers that overflow far from where they were given."""
import subprocess
import sys

import pytest

from mlmclm.base.configs import ConfigError
from mlmclm.base.files import project_root, read_jsonl
from mlmclm.base.claims import ClaimHeld
from mlmclm.pretraining.loop import pretrain
from mlmclm.results.store import StoreWriter, missing, read_rows
from mlmclm.protocol.runs import PretrainRun, finetune_config, finetune_runs, pretrain_config

ROOT = project_root()
PY = sys.executable


def test_our_run_of_a_checkpoint_the_authors_also_published_is_not_theirs(tmp_path):
    "Imported rows (source 'authors') never make our own run of the same name look done (issue 27 item 7)."
    store = tmp_path/'results.jsonl'
    ours = finetune_runs('610m-clm-42k', ['sst2'], [1e-5], [0])
    with StoreWriter(store) as w:
        w.append([dict(checkpoint_name='610m-clm-42k', dataset='sst2', family='SC', lr=1e-5, seed=0, source='authors',
                       val_score=.9, test_score=.9)])
    assert missing(store, ours) == ours
    assert missing(store, finetune_runs('610m-clm-42k', ['sst2'], [1e-5], [0], source='authors')) == []


def test_precision_is_keyed_as_asked_and_older_rows_keep_their_keys(tmp_path):
    "A row of an older store holds the format that ran in `precision`: it counts for the paper's cell (`auto`, the only "
    "identity it ever had), never for a run asked for that format; rows written now key what was asked."
    store, row = tmp_path/'results.jsonl', dict(checkpoint_name='610m-clm-42k', family='SC', lr=1e-5, seed=0, val_score=.9,
                                                test_score=.9)
    with StoreWriter(store) as w:
        w.append([dict(row, dataset='sst2', precision='pure_bf16'),                                  # older: as it ran
                  dict(row, dataset='mnli', precision='amp_bf16'),                                   # older: only asked
                  dict(row, dataset='qqp', precision='auto', precision_used='fp32')])                # now: as asked
    runs = lambda ds, **cell: finetune_runs('610m-clm-42k', ds, [1e-5], [0], **cell)
    assert missing(store, runs(['sst2'])) == []
    assert missing(store, runs(['sst2'], precision='pure_bf16')) == runs(['sst2'], precision='pure_bf16')
    assert missing(store, runs(['mnli'])) == runs(['mnli'])           # auto never gives amp_bf16: it was asked by name
    assert missing(store, runs(['mnli'], precision='amp_bf16')) == []
    assert missing(store, runs(['qqp'])) == [] and missing(store, runs(['qqp'], precision='fp32')) == runs(['qqp'], precision='fp32')
    assert [r['precision_used'] for r in read_rows(store)] == ['pure_bf16', 'amp_bf16', 'fp32']


# ---------------------------------------------------------------- one trainer per pretraining run
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


def test_study_status_of_a_plan_with_a_control_counts_it(tmp_path, capsys):
    "`python -m mlmclm.study.commands status --preset demo` failed with KeyError: None (the control has no pretraining run)."
    from mlmclm.study.commands import main
    main(['status', '--preset', 'demo', '--root', str(tmp_path)])
    lines = [l.split() for l in capsys.readouterr().out.splitlines()]
    assert ['control', 'finetune', '0', '0', '0', '12'] in lines     # 4 tasks x 1 LR x 3 seeds of tiny-random


@pytest.mark.parametrize('make, message', [
    (lambda: pretrain_config(seed=2**70), 'seed=1180591620717411303424 is out of range; allowed: >= 0 and <= 4294967295'),
    (lambda: pretrain_config(lr=1e300), 'lr=1e+300 is out of range; allowed: > 0.0 and <= 1.0'),
    (lambda: pretrain_config(mask_ratio=float('inf')), 'mask_ratio=inf is not a finite number'),
], ids=['seed 2**70', 'lr 1e300', 'mask ratio inf'])
def test_pretraining_numbers_that_would_overflow_later_are_refused_in_the_config(make, message):
    with pytest.raises(ConfigError) as e: make()
    assert message in str(e.value)


@pytest.mark.parametrize('values, message', [
    (dict(seeds='1e30'), "seeds='1e30' holds 1e+30; seeds are whole numbers in [0, 4294967295]"),
    (dict(lrs='1e300'), "lrs='1e300' holds 1e+300; learning rates are numbers in (0, 1]"),
    (dict(lrs='1e-4,nan'), "lrs='1e-4,nan' holds nan"),
], ids=['seeds 1e30', 'lrs 1e300', 'lrs nan'])
def test_finetuning_grids_that_would_overflow_later_are_refused_by_the_guard(values, message):
    from mlmclm.finetuning.loop import check_finetune_config
    with pytest.raises(ConfigError) as e: check_finetune_config(finetune_config(**values))
    assert message in str(e.value)
