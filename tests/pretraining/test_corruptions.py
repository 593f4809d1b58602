"""The corruption table (issue 43 item 4): which positions a corrupting objective predicts is a row of
`mlmclm.pretraining.objectives.CORRUPTIONS` (`iid`, today's MLM draw for draw; `span` as the proof). The tests compute
from the table: every row is checked for its realised ratio, with a fixed ratio and with one ratio per row."""
import pytest
import torch

from mlmclm.base.configs import ConfigError
from mlmclm.model.heads import IGNORE
from mlmclm.pretraining.objectives import (CORRUPTIONS, SPAN_MAX, SPAN_MEAN, make_batch, mask_tokens, span_start_rate)
from mlmclm.protocol.schedules import OBJECTIVES, Phase

IDS = dict(mask_token_id=2, vocab_size=1000, special_ids=[0, 1, 2])


def _mask_tokens_before(input_ids, mask_ratio, mask_token_id, vocab_size, special_ids, replace=(1.0, 0.0, 0.0),
                        generator=None):
    "`mask_tokens` as it was before the corruption table (c5f8195), kept here to prove `iid` draws the same."
    special = torch.isin(input_ids, torch.tensor(special_ids))
    u = torch.rand(input_ids.shape, generator=generator)
    selected = (u < mask_ratio) & ~special
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE))
    v = torch.rand(input_ids.shape, generator=generator)
    to_mask = selected & (v < replace[0])
    to_random = selected & (v >= replace[0]) & (v < replace[0] + replace[1])
    random_ids = torch.randint(0, vocab_size, input_ids.shape, generator=generator)
    inputs = torch.where(to_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    return torch.where(to_random, random_ids, inputs), labels


@pytest.mark.parametrize('ratio, replace, seed', [(0.4, (1.0, 0.0, 0.0), 0), (0.15, (0.8, 0.1, 0.1), 7), (0.3, (0.5, 0.5, 0.0), 3)])
def test_iid_is_todays_mlm_draw_for_draw(ratio, replace, seed):
    ids = torch.randint(3, 1000, (8, 256), generator=torch.Generator().manual_seed(seed)); ids[:, ::37] = 1
    new = mask_tokens(ids, ratio, 2, 1000, [0, 1, 2], replace, generator=torch.Generator().manual_seed(seed))
    old = _mask_tokens_before(ids, ratio, 2, 1000, [0, 1, 2], replace, generator=torch.Generator().manual_seed(seed))
    assert all(torch.equal(a, b) for a, b in zip(new, old))


def _z(selected: torch.Tensor, ratio: torch.Tensor) -> float:
    "The mean realised share's distance from the mean ratio asked, in standard errors of the rows' own spread."
    per_row = selected.float().mean(1)
    diff = per_row - ratio.flatten().expand_as(per_row)
    return (diff.mean() / (diff.std() / len(diff) ** 0.5)).item()


@pytest.mark.parametrize('name', list(CORRUPTIONS))
@pytest.mark.parametrize('ratio', [0.05, 0.15, 0.4, 0.8, 'per row'])
def test_every_row_realises_the_ratio_asked(name, ratio):
    ratio = torch.linspace(0.02, 0.98, 512).unsqueeze(1) if ratio == 'per row' else torch.tensor(ratio)
    selected = CORRUPTIONS[name].select((512, 2048), ratio, torch.Generator().manual_seed(1))
    assert selected.shape == (512, 2048) and selected.dtype == torch.bool
    assert abs(_z(selected, ratio)) < 5


@pytest.mark.parametrize('ratio', [0.05, 0.3, 0.6])
def test_span_start_rate_solves_the_coverage(ratio):
    p = span_start_rate(ratio)
    survive = (1 - 1 / SPAN_MEAN) ** torch.arange(SPAN_MAX, dtype=torch.float64)
    assert 1 - torch.prod(1 - p * survive) == pytest.approx(ratio, abs=1e-12)
    assert p < ratio / SPAN_MEAN * 1.5 and p > ratio / SPAN_MEAN   # overlapping spans need more starts than ratio / mean


def test_spans_are_runs_and_iid_is_not():
    "At 15%, iid's chosen positions come alone (runs of about 1 / (1 - 0.15)); spans in runs near their mean length."
    def mean_run(sel):
        edges = torch.diff(torch.nn.functional.pad(sel.int(), (1, 1)), dim=1)
        return ((edges == -1).nonzero()[:, 1] - (edges == 1).nonzero()[:, 1]).float().mean().item()
    g = lambda: torch.Generator().manual_seed(0)
    assert mean_run(CORRUPTIONS['iid'].select((64, 1024), 0.15, g())) == pytest.approx(1 / 0.85, abs=0.05)
    assert 2.8 < mean_run(CORRUPTIONS['span'].select((64, 1024), 0.15, g())) < 4.0


def test_every_corrupting_objective_names_a_row_and_its_batch_keeps_special_tokens():
    ids = torch.randint(3, 1000, (16, 512), generator=torch.Generator().manual_seed(0)); ids[:, ::50] = 1
    rows = dict(input_ids=ids, document_ids=(ids == 1).long().cumsum(1))
    for o in (o for o in OBJECTIVES.values() if o.corrupts):
        assert o.corruption in CORRUPTIONS, o
        b = make_batch(rows, Phase(o.name, 1, 0.3 if o.masked else None), IDS, (1.0, 0.0, 0.0), 0, 0)
        assert (b['input_ids'][ids == 1] == 1).all() and b['masked_positions'].numel() > 0


def test_span_phase_masks_in_spans_and_an_unknown_kind_is_refused():
    ids = torch.randint(3, 1000, (8, 512), generator=torch.Generator().manual_seed(0))
    rows = dict(input_ids=ids, document_ids=torch.zeros_like(ids))
    b = make_batch(rows, Phase('span', 1, 0.3), IDS, (1.0, 0.0, 0.0), 0, 0)
    chosen = b['labels'] != IGNORE
    assert abs(chosen.float().mean().item() - 0.3) < 0.03
    assert (chosen[:, 1:] & chosen[:, :-1]).sum() > 0.5 * chosen.sum()   # most chosen tokens have a chosen neighbour
    with pytest.raises(ConfigError, match="corruption='blocks'; choose from 'iid', 'span'"):
        mask_tokens(ids, 0.3, 2, 1000, [0], corruption='blocks')
