"""Issue 47 item 1: masked diffusion (`mdlm`: a ratio t ~ U(ε, 1) per row, each predicted token weighing 1/t) and its
control without the weight (`vmlm`), as rows of the objective table: the statistics of the draws, the weight, a
known-answer loss, phases, mixtures and continued pretraining, resume bit-identical mid-phase, and the price."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from mlmclm.base.configs import build_config
from mlmclm.base.files import read_jsonl
from mlmclm.model.checkpoints import load
from mlmclm.model.heads import IGNORE
from mlmclm.model.sizes import flops_per_token, model_config, param_counts
from mlmclm.pretraining.loop import pretrain, step_batches
from mlmclm.pretraining.objectives import lm_loss, make_batch
from mlmclm.protocol.run_names import RunName, parse_run_name, run_name
from mlmclm.protocol.runs import PretrainConfig
from mlmclm.protocol.schedules import OBJECTIVES, RATE_FLOOR, Phase, drawn_phase, parse_schedule
from mlmclm.study.plan import Costs, cpt_objectives_plan, run_flops
from tiny import TINY_PRETRAIN

IDS = dict(mask_token_id=2, vocab_size=1000, special_ids=[0, 1, 2])
DRAWN = [o.name for o in OBJECTIVES.values() if o.rate]


def _rows(n=512, T=256, seed=0):
    ids = torch.randint(3, 1000, (n, T), generator=torch.Generator().manual_seed(seed)); ids[:, ::64] = 1   # some EOS
    return dict(input_ids=ids, document_ids=(ids == 1).long().cumsum(1))


@pytest.mark.parametrize('name', DRAWN)
def test_each_rows_realised_ratio_follows_its_drawn_t(name):
    "Per row, the predicted tokens are Binomial(maskable tokens, t): standardised residuals of mean 0 and spread 1."
    rows = _rows()
    b = make_batch(rows, Phase(name, 1), IDS, (1.0, 0.0, 0.0), seed=3, first_row=0)
    t = b['row_rates'].double()
    n = (rows['input_ids'] != 1).sum(1).double()
    k = (b['labels'] != IGNORE).sum(1).double()
    z = (k - n * t) / (n * t * (1 - t)).sqrt()
    assert abs(z.mean()) < 5 / len(z) ** 0.5 and 0.85 < z.std() < 1.15, (z.mean(), z.std())
    assert torch.corrcoef(torch.stack([k / n, t]))[0, 1] > 0.99


def test_t_is_uniform_on_its_interval_and_reproducible():
    ts = torch.cat([make_batch(_rows(64, 8, s), Phase('mdlm', 1), IDS, (1.0, 0.0, 0.0), 0, s * 64)['row_rates']
                    for s in range(40)]).sort().values                                   # 2,560 draws
    assert RATE_FLOOR <= ts[0] and ts[-1] < 1
    cdf = (ts - RATE_FLOOR) / (1 - RATE_FLOOR)
    ks = (cdf - torch.arange(1, len(ts) + 1) / len(ts)).abs().max().item()
    assert ks < 1.63 / len(ts) ** 0.5                                                     # Kolmogorov-Smirnov at 1%
    again = lambda: make_batch(_rows(64, 8, 0), Phase('mdlm', 1), IDS, (1.0, 0.0, 0.0), 0, 0)
    assert torch.equal(again()['row_rates'], again()['row_rates']) and torch.equal(again()['labels'], again()['labels'])


def test_the_weight_is_one_over_t_and_only_mdlm_has_it():
    rows = _rows(32, 64)
    m = make_batch(rows, Phase('mdlm', 1), IDS, (1.0, 0.0, 0.0), 5, 0)
    v = make_batch(rows, Phase('vmlm', 1), IDS, (1.0, 0.0, 0.0), 5, 0)
    assert torch.equal(m['row_weights'], 1 / m['row_rates'])
    assert int(m['loss_tokens']) == int((rows['input_ids'] != 1).sum())
    assert 'row_weights' not in v and torch.equal(v['row_rates'], m['row_rates']) and torch.equal(v['labels'], m['labels'])
    assert m['row_ends'] == torch.bincount(m['masked_positions'] // 64, minlength=32).cumsum(0).tolist()


class _Known(torch.nn.Module):
    "Logits with `a` at the target token and 0 elsewhere: every predicted token's cross-entropy is log(e^a + V - 1) - a."
    def __init__(self, labels, a=2.0, V=1000):
        super().__init__(); self.labels, self.a, self.V = labels, a, V
    def forward(self, ids, logits_index=None, **kw):
        logits = torch.zeros(len(logits_index), self.V)
        logits[torch.arange(len(logits_index)), self.labels.flatten()[logits_index]] = self.a
        return type('Out', (), dict(logits=logits))()


def test_a_known_answer_weighted_loss():
    rows = _rows(4, 64)
    b = make_batch(rows, Phase('mdlm', 1), IDS, (1.0, 0.0, 0.0), 11, 0)
    ce = math.log(math.exp(2.0) + 999) - 2.0
    per_row, t = (b['labels'] != IGNORE).sum(1), b['row_rates']
    maskable = int((rows['input_ids'] != 1).sum())                                     # EOS tokens are not maskable
    loss, n = lm_loss(_Known(b['labels']), b)
    assert int(n) == maskable < 4 * 64
    assert loss.item() == pytest.approx(ce * (per_row / t).sum().item() / maskable, rel=1e-6)
    v = make_batch(rows, Phase('vmlm', 1), IDS, (1.0, 0.0, 0.0), 11, 0)
    assert lm_loss(_Known(v['labels']), v)[0].item() == pytest.approx(ce, rel=1e-6)   # VMLM: the plain mean


@pytest.mark.parametrize('ce_chunk', [0, 7])
def test_the_weighted_loss_and_its_gradients_equal_the_sum_written_out(ce_chunk):
    from mlmclm.model.transformer import build_model
    torch.manual_seed(0)
    model = build_model('tiny', vocab_size=50, bos_token_id=0, eos_token_id=1, pad_token_id=1, mask_token_id=2)
    ids = torch.randint(3, 50, (3, 24)); ids[0, 10] = 1
    rows = dict(input_ids=ids, document_ids=(ids == 1).long().cumsum(1))
    b = make_batch(rows, Phase('mdlm', 1), dict(IDS, vocab_size=50), (0.8, 0.1, 0.1), 2, 0)
    loss, n = lm_loss(model, b, ce_chunk=ce_chunk)
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    logits = model(b['input_ids'], document_ids=b['document_ids'], is_causal=False).logits
    ce = F.cross_entropy(logits.flatten(0, 1), b['labels'].flatten(), ignore_index=IGNORE, reduction='none').view(3, 24)
    want = (ce.sum(1) / b['row_rates']).sum() / int(n)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    for g, w in zip(grads, torch.autograd.grad(want, list(model.parameters()), allow_unused=True)):
        assert (g is None) == (w is None) and (g is None or torch.allclose(g, w, atol=1e-6))


def test_drawn_objectives_are_phases_mixture_parts_and_run_names():
    for o in OBJECTIVES.values():   # every row of the table: written and read back
        spec = RunName('610m', (Phase(o.name, 2000, 0.4 if o.masked else None),))
        assert parse_run_name(run_name(spec)) == spec
    phases = parse_schedule('clm:2,50mdlm+50vmlm:6')
    got = [b for micro in step_batches(lambda f, n: {k: v[:n] for k, v in _rows(n, 16, f).items()}, phases, range(8),
                                       2, 2, 1, 0, IDS, (1.0, 0.0, 0.0), 9) for b in micro]
    assert {('row_weights' in b, 'row_rates' in b) for b in got[4:]} == {(True, True), (False, True)}
    assert {drawn_phase(phases, 2 + s, 9, (2 + s) * 4 + m * 2).label for s in range(6) for m in range(2)} == {'mdlm', 'vmlm'}


def test_the_planner_and_the_flop_count_price_mdlm_at_its_mean_ratio():
    cfg = model_config('610m')
    n = param_counts(cfg)
    attn = flops_per_token(cfg, 1024, 'clm') - 6 * (n['body'] + n['head'])
    for name in DRAWN:
        assert flops_per_token(cfg, 1024, name) == pytest.approx(6 * (n['body'] + (1 + RATE_FLOOR) / 2 * n['head']) + attn)
        assert flops_per_token(cfg, 1024, name, sparse_head=False) == flops_per_token(cfg, 1024, 'clm')
    plan = cpt_objectives_plan(objectives=('mlm', 'mdlm'), lrs=(1e-4,), seeds=(0,))
    run = next(r for r in plan.runs.values() if r.spec.phases[-1].objective == 'mdlm')
    costs = Costs()
    assert run_flops(plan, run, costs) == pytest.approx(2000 * costs.tokens_per_step * flops_per_token(cfg, costs.seq_len, 'mdlm'))


# ---------------------------------------------------------------- the trainer
SCHEDULE = 'clm:2,mdlm:2,50mdlm+50vmlm:2'


def _cfg(tmp, **kw):
    return build_config(PretrainConfig, {**TINY_PRETRAIN, 'schedule': SCHEDULE, 'total_steps': 6, 'global_batch': 8,
                                         'heldout_every': 3, 'out_dir': str(tmp), 'run_id': 'diff', **kw})


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
    return pretrain(_cfg(tmp_path_factory.mktemp('straight')))


def test_an_mdlm_run_resumed_mid_phase_is_bit_identical(straight, tmp_path):
    pretrain(_cfg(tmp_path, stop_at_step=3))                                             # one step into mdlm
    resumed = pretrain(_cfg(tmp_path))
    keep = ('step', 'objective', 'loss', 'lr', 'drawn', 'heldout_loss', 'heldout_parts')
    a, b = read_jsonl(straight/'metrics.jsonl'), read_jsonl(resumed/'metrics.jsonl')
    assert [{k: r.get(k) for k in keep} for r in a] == [{k: r.get(k) for k in keep} for r in b]
    wa, wb = load(straight/'checkpoints'/'step-6').state_dict(), load(resumed/'checkpoints'/'step-6').state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    rows = {r['step']: r for r in a}
    assert set(rows[6]['heldout_parts']) == {'mdlm', 'vmlm'} and all(map(math.isfinite, rows[6]['heldout_parts'].values()))
    record = json.loads((straight/'run.json').read_text())
    assert record['phases'][1]['flops_per_token'] == pytest.approx(flops_per_token(model_config('tiny'), 32, 'mdlm'))


def test_mdlm_continues_a_clm_checkpoint(straight, tmp_path):
    "Continued pretraining from the CLM phase's switch checkpoint, as from an off-the-shelf decoder."
    out = pretrain(_cfg(tmp_path, schedule='mdlm', total_steps=2, init_from=str(straight/'checkpoints'/'step-2'),
                        run_id='cpt'))
    rows = read_jsonl(out/'metrics.jsonl')
    assert rows[-1]['objective'] == 'mdlm' and math.isfinite(rows[-1]['heldout_loss'])
    assert json.loads((out/'checkpoints'/'step-2'/'config.json').read_text()).get('is_causal') is False


@pytest.mark.parametrize('ce_chunk', [0, 4])
def test_a_batch_with_nothing_to_predict_has_loss_zero_and_a_graph(ce_chunk):
    "MDLM's sum over no token is 0 (not 0/0 as MLM's mean would be), and backward still runs."
    from mlmclm.model.transformer import build_model
    model = build_model('tiny', vocab_size=50, bos_token_id=0, eos_token_id=1, pad_token_id=1, mask_token_id=2)
    ids = torch.ones(2, 8, dtype=torch.long)                                      # only special tokens
    b = make_batch(dict(input_ids=ids, document_ids=torch.zeros_like(ids)), Phase('mdlm', 1), dict(IDS, vocab_size=50),
                   (1.0, 0.0, 0.0), 0, 0)
    loss, n = lm_loss(model, b, ce_chunk=ce_chunk)
    loss.backward()
    assert (loss.item(), int(n)) == (0.0, 0)
