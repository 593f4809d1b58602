"""Issue 37 item 2: phases that mix objectives per micro-batch (GPT-BERT, arXiv 2410.24159) and mask ratios that move
through a phase (mmBERT, arXiv 2509.06888): the spelling, the draws and their statistics, and the trainer (resumed
mid-phase bit-identically); the planner's pricing of them is tested in tests/study/test_plan.py."""
import json
from pathlib import Path

import pytest
import torch

from mlmclm.base.configs import ConfigError, build_config
from mlmclm.base.files import read_jsonl
from mlmclm.model.checkpoints import load
from mlmclm.model.heads import IGNORE
from mlmclm.pretraining.objectives import make_batch
from mlmclm.protocol.runs import PretrainConfig
from mlmclm.pretraining.loop import pretrain, step_batches
from mlmclm.pretraining.checks import check_pretrain_config
from mlmclm.model.sizes import flops_per_token, model_config
from mlmclm.protocol.schedules import OBJECTIVES, Component, Phase, drawn_phase, parse_schedule
from mlmclm.protocol.run_names import RunName, describe_checkpoint, parse_run_name, run_name

IDS = dict(mask_token_id=2, vocab_size=50, special_ids=[0, 1, 2])
TINY = dict(size='tiny', seq_len=32, batch_size=4, global_batch=8, warmup_steps=1, decay_steps=1, data='embedded',
            progress=False, prefetch=0, log_every=1, heldout_every=3)
MIXED = 'clm:2,40clm+60mlm30to10:4'   # a plain phase, then a mixture whose MLM part moves from 30% to 10%


def _within(k: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    "A binomial count `k` of `n` trials within `sigmas` standard deviations of its mean."
    return abs(k - n * p) <= sigmas * (n * p * (1 - p)) ** 0.5


# ---------------------------------------------------------------- spelling
@pytest.mark.parametrize('schedule, labels', [
    ('clm:1000,50clm+50mlm40:500', ['clm', '50clm+50mlm40']),
    ('50clm+50mlm:500', ['50clm+50mlm40']),                                  # a part without a ratio takes mask_ratio
    ('mlm30to15to05:300,mlm5:10', ['mlm30to15to5', 'mlm5']),                 # under 10%: one digit or two (N27)
    ('mlm30to15to05:300', ['mlm30to15to5']),
    ('20clm+30mntp30+50mlm30to5:900', ['20clm+30mntp30+50mlm30to5'])])
def test_schedules_read_compound_phases_beside_plain_ones(schedule, labels):
    if labels is None:
        with pytest.raises(ConfigError, match="cannot read phase 'mlm5:10'"): parse_schedule(schedule)
        return
    phases = parse_schedule(schedule)
    assert [p.label for p in phases] == labels
    assert parse_schedule(','.join(f'{p.label}:{p.steps}' for p in phases)) == phases   # written as read


def test_run_names_round_trip_with_the_schedule():
    phases = tuple(parse_schedule('clm:1000,50clm+50mlm40:1000,mlm30to5:2000'))
    name = run_name(RunName('610m', phases))
    assert name == '610m-clm-1k-50clm+50mlm40-2k-mlm30to5-4k'
    back = parse_run_name(name)
    assert back.phases == phases and back.schedule == 'clm:1000,50clm+50mlm40:1000,mlm30to5:2000'
    assert run_name(parse_run_name(name + '-1500')) == name + '-1500'           # an intermediate checkpoint
    assert describe_checkpoint(name)['kind'] == 'mixed' and back.mask_ratio is None
    assert [p.is_causal for p in phases] == [True, False, False]                  # a mixture is causal only if all parts are


@pytest.mark.parametrize('schedule, message', [
    ('clm+mlm40:5', "phase 'clm+mlm40': a mixture gives every part its percent of the micro-batches"),
    ('60clm+50mlm40:5', 'the weights 60 + 50 must each be in [1, 99] and sum to 100'),
    ('50clm+50bert40:5', "phase '50clm+50bert40': objective='bert'; choose from " + ', '.join(map(repr, OBJECTIVES))),
    ('50clm20+50mlm40:5', "phase '50clm20+50mlm40': clm takes no mask ratio"),
    ('clm30to5:5', "phase 'clm30to5': clm takes no mask ratio"),
    ('50mlm40:5', 'a weight belongs to a part of a mixture'),
    ('mlm40to40:5', 'a moving mask ratio needs stops that differ; a fixed one is written mlm40'),
    ('mlm30to0:5', 'mask_ratio=0.0 must be in [0.01, 1)'),
    ('mlm130to5:5', 'mask_ratio=1.3 must be in [0.01, 1)'),
    ('50mlm40+50mlm40:5', 'two parts train the same objective at the same ratio'),
    ('50clm+50mlm40:0', "phase '50clm+50mlm40:0' has no steps")])
def test_bad_spellings_fail_naming_the_value_and_what_is_allowed(schedule, message):
    with pytest.raises(ConfigError) as e: parse_schedule(schedule)
    assert message in str(e.value)


def test_a_compound_phase_is_refused_where_a_plain_one_is_needed():
    rows = dict(input_ids=torch.randint(3, 50, (2, 8)), document_ids=torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(ConfigError, match='draw it with mlmclm.protocol.schedules.drawn_phase'):
        make_batch(rows, Phase('50clm+50mlm40', 4), IDS, (1.0, 0.0, 0.0), 0, 0)
    with pytest.raises(ConfigError, match="is written '50clm\\+50mlm40'"): Phase('050clm+50mlm40', 4)


# ---------------------------------------------------------------- statistics of the draws
def test_the_realised_share_of_each_part_is_binomial_around_its_weight():
    "40,000 micro-batches (8 a step) of a three-part mixture: each share within 5 sigma of its weight, seeds differ."
    phases = parse_schedule('clm:7,15clm+25mntp30+60mlm40:5000')
    draws = {seed: [drawn_phase(phases, s, seed, s * 64 + m * 8).objective for s in range(7, 5007) for m in range(8)]
             for seed in (0, 42)}
    for seed, drawn in draws.items():
        for part in phases[1].parts:
            assert _within(drawn.count(part.objective), len(drawn), part.weight / 100), (seed, part)
    same = sum(a == b for a, b in zip(*draws.values())) / len(draws[0])
    assert _within(round(same * 40000), 40000, 0.15 ** 2 + 0.25 ** 2 + 0.6 ** 2)   # two seeds draw independently
    # consecutive micro-batches are independent too: CLM after CLM as often as CLM overall
    pairs = [(a, b) for a, b in zip(draws[0], draws[0][1:]) if a == 'clm']
    assert _within(sum(b == 'clm' for _, b in pairs), len(pairs), 0.15)


def test_the_realised_mask_ratio_follows_a_moving_schedule():
    "`mlm30to5` over 101 steps: the share of masked tokens at nine points within 5 sigma of the line (16,384 tokens each)."
    phases = parse_schedule('mlm30to5:101')
    rows = dict(input_ids=torch.randint(3, 50, (64, 256)), document_ids=torch.zeros(64, 256, dtype=torch.long))
    n, total = rows['input_ids'].numel(), 0
    for step in range(0, 101, 12):
        expected = 0.30 + (0.05 - 0.30) * step / 100
        phase = drawn_phase(phases, step, 7, step * 64)
        assert phase == Phase('mlm', 101, phase.mask_ratio) and abs(phase.mask_ratio - expected) < 1e-12
        k = int((make_batch(rows, phase, IDS, (1.0, 0.0, 0.0), 7, step * 64)['labels'] != IGNORE).sum())
        assert _within(k, n, expected), (step, k / n, expected)
        total += k
    assert _within(total, 9 * n, (0.30 + 0.05) / 2)      # points symmetric about the middle: the mean ratio
    # the stepped spelling of mmBERT is three plain phases; `to` through three stops interpolates between them
    assert [drawn_phase(parse_schedule('mlm30to15to5:5'), s, 0, 0).mask_ratio for s in range(5)] == \
           pytest.approx([0.3, 0.225, 0.15, 0.1, 0.05], abs=1e-15)


def test_plain_schedules_make_the_same_batches_as_before():
    "A plain phase is its own draw: `step_batches` hands `make_batch` the phase itself, as before mixtures."
    phases = parse_schedule('clm:2,mlm40:2')
    rows = lambda first, n: dict(input_ids=torch.arange(first, first + n * 16).reshape(n, 16) % 47 + 3,
                                 document_ids=torch.zeros(n, 16, dtype=torch.long))
    got = list(step_batches(rows, phases, range(4), 2, 2, 1, 0, IDS, (0.8, 0.1, 0.1), 5))
    for step, micro in enumerate(got):
        for m, batch in enumerate(micro):
            first = step * 4 + m * 2
            assert drawn_phase(phases, step, 5, first) is phases[step // 2]
            want = make_batch(rows(first, 2), phases[step // 2], IDS, (0.8, 0.1, 0.1), 5, first)
            assert all(torch.equal(batch[k], want[k]) if torch.is_tensor(want[k]) else batch[k] == want[k] for k in want)


# ---------------------------------------------------------------- the trainer
def _cfg(tmp, **kw):
    return build_config(PretrainConfig, {**TINY, 'schedule': MIXED, 'total_steps': 6, 'out_dir': str(tmp),
                                         'run_id': 'mix', **kw})


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
    return pretrain(_cfg(tmp_path_factory.mktemp('straight')))


def test_a_mixed_run_resumed_mid_phase_is_bit_identical(straight, tmp_path):
    "Stopped after step 4 (two steps into the mixture), then resumed: the same draws, losses and final weights."
    pretrain(_cfg(tmp_path, stop_at_step=4))
    resumed = pretrain(_cfg(tmp_path))
    a, b = read_jsonl(straight/'metrics.jsonl'), read_jsonl(resumed/'metrics.jsonl')
    keep = ('step', 'objective', 'loss', 'lr', 'drawn')
    assert [{k: r.get(k) for k in keep} for r in a] == [{k: r.get(k) for k in keep} for r in b]
    held = lambda rows: [(r['heldout_loss'], r['heldout_parts']) for r in rows if r['step'] in (3, 6)]
    assert held(a) == held(b)          # (the stopped session also measured held-out rows at its last step, 4)
    wa, wb = load(straight/'checkpoints'/'step-6').state_dict(), load(resumed/'checkpoints'/'step-6').state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_the_metrics_say_what_each_step_drew_and_each_parts_heldout_loss(straight):
    rows = {r['step']: r for r in read_jsonl(straight/'metrics.jsonl')}
    phases = parse_schedule(MIXED)
    for step in range(3, 7):   # the mixture's steps: 2 micro-batches of 4 rows each, the seed's draws
        drawn = [drawn_phase(phases, step - 1, 42, (step - 1) * 8 + r).label for r in (0, 4)]
        assert rows[step]['drawn'] == {d: drawn.count(d) for d in set(drawn)} and rows[step]['objective'] == phases[1].label
    assert set().union(*(rows[s]['drawn'] for s in range(3, 7))) >= {'clm', 'mlm30'}   # both parts were trained
    assert 'drawn' not in rows[2] and rows[2]['objective'] == 'clm'                     # plain rows are as before
    parts = rows[6]['heldout_parts']
    assert set(parts) == {'clm', 'mlm10'}                                               # the MLM part at its last ratio
    assert rows[6]['heldout_loss'] == pytest.approx(0.4 * parts['clm'] + 0.6 * parts['mlm10'], rel=1e-12)


def test_the_run_record_prices_the_mixture_at_its_expected_cost(straight):
    record = json.loads((straight/'run.json').read_text())
    cfg = model_config('tiny')
    clm, mlm = flops_per_token(cfg, 32, 'clm'), flops_per_token(cfg, 32, 'mlm', 0.2)   # 30% to 10%: mean 20%
    assert record['phases'][1]['objective'] == '40clm+60mlm30to10' and record['phases'][1]['mask_ratio'] is None
    assert record['phases'][1]['flops_per_token'] == pytest.approx(0.4 * clm + 0.6 * mlm, rel=1e-12)
    assert record['flops_per_token'] == pytest.approx((2 * clm + 4 * (0.4 * clm + 0.6 * mlm)) / 6, rel=1e-12)
    card = (straight/'checkpoints'/'step-6'/'README.md').read_text()
    assert 'clm for 2 steps, then 40clm+60mlm30to10 for 4 steps' in card                 # the model card spells it
    assert json.loads((straight/'checkpoints'/'step-6'/'config.json').read_text()).get('is_causal') is False


def test_a_moving_ratio_too_low_for_the_batch_is_refused_before_training(tmp_path):
    "4 rows x 8 tokens at 1% leave about 72% of micro-batches empty near the phase's end: refused, naming the phase."
    cfg = _cfg(tmp_path, schedule='clm:2,50clm+50mlm30to1:40', total_steps=42, seq_len=8, global_batch=4)
    with pytest.raises(ConfigError, match=r'mask_ratio=0.01 \(50clm\+50mlm30to1, 40 steps\)'): check_pretrain_config(cfg)
    check_pretrain_config(_cfg(tmp_path, schedule='clm:2,50clm+50mlm30to10:40', total_steps=42, seq_len=32))
