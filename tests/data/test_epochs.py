"""Issue 47 item 2, the store's side: a unique-token budget read for many epochs (`EpochRows`): every epoch reads every
budget row exactly once, reshuffled per epoch and seed, as a function of the row index alone (resumes and processes
read alike); budgets under one row are refused."""
import numpy as np
import pytest
import torch

from mlmclm.base.configs import ConfigError
from mlmclm.data.token_store import EpochRows, budget_rows, epoch_order


class _Rows:
    "A store whose row r (from token 0) holds the tokens r * seq_len ... : a row's content names it."
    def rows(self, first_token, first_row, n, seq_len):
        start = first_token + first_row * seq_len
        ids = torch.arange(start, start + n * seq_len).reshape(n, seq_len)
        return dict(input_ids=ids, document_ids=torch.zeros_like(ids))


@pytest.mark.parametrize('unique_rows, epochs', [(1, 3), (7, 5), (64, 12)])
def test_every_epoch_reads_every_budget_row_once(unique_rows, epochs):
    reader = EpochRows(_Rows(), 32, unique_rows, 4, seed=3)
    got = reader(0, unique_rows * epochs)['input_ids'][:, 0]
    rows = ((got - 32) // 4).reshape(epochs, unique_rows)                      # the budget row each run row read
    assert all(sorted(e.tolist()) == list(range(unique_rows)) for e in rows)
    if unique_rows > 5: assert len({tuple(e.tolist()) for e in rows}) == epochs   # a new order every epoch


def test_orders_depend_on_the_seed_and_epoch_only_and_chunks_read_alike():
    assert np.array_equal(epoch_order(50, 3, 1), epoch_order(50, 3, 1))
    assert not np.array_equal(epoch_order(50, 3, 1), epoch_order(50, 3, 2))
    assert not np.array_equal(epoch_order(50, 3, 1), epoch_order(50, 4, 1))
    whole = EpochRows(_Rows(), 0, 13, 4, seed=0)(0, 100)['input_ids']
    fresh = EpochRows(_Rows(), 0, 13, 4, seed=0)                                # a resumed reader, other chunks
    parts = torch.cat([fresh(a, b - a)['input_ids'] for a, b in [(0, 9), (9, 40), (40, 41), (41, 100)]])
    assert torch.equal(whole, parts)


def test_positions_are_uniform_over_epochs():
    "Over 2,000 epochs of 10 rows, each budget row lands at run position 0 of an epoch about 200 times (chi-square)."
    firsts = np.bincount([epoch_order(10, e, 5)[0] for e in range(2000)], minlength=10)
    chi2 = ((firsts - 200) ** 2 / 200).sum()
    assert chi2 < 27.9                                                          # 9 degrees of freedom, p = 0.001


def test_bad_budgets_are_refused_naming_the_value():
    assert budget_rows(1000, 128) == 7
    with pytest.raises(ConfigError, match='unique_tokens=100 holds no row of seq_len=128 tokens; give at least 128'):
        budget_rows(100, 128)
    with pytest.raises(ConfigError, match='unique_rows=0 must be >= 1'): EpochRows(_Rows(), 0, 0, 4, 0)
