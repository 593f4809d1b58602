"""Issue 46 item 3: rows of models outside the paper's grid (`outside_grid`) are drawn beside the paper's models, as
named lines in each family panel, and marked in the rank clusters; without the mark they would be left out."""
from pathlib import Path

import pandas as pd

import mlmclm.report.render as render
from mlmclm.results.ranking import OUTSIDE_MARK, describe_ranks, family_ranks
from mlmclm.results.store import read_results

REFERENCE = Path(__file__).parents[1]/'fixtures'/'demo'   # the committed demo results


def _with_outside():
    "The committed demo results, plus the rows of one of their models again under a hub id, marked outside the grid."
    results = read_results(REFERENCE/'results.csv')
    one = results[results.checkpoint_name == results.checkpoint_name.iloc[0]].copy()
    one['checkpoint_name'], one['outside_grid'] = 'jhu-clsp/ettin-encoder-17m', True
    return pd.concat([results, one], ignore_index=True), one


def test_outside_models_are_drawn_as_named_lines(tmp_path, monkeypatch):
    results, one = _with_outside()
    kept, skipped = render.drawable(results)
    assert not skipped and 'jhu-clsp/ettin-encoder-17m' in set(kept.checkpoint_name)   # placed, not left out
    drawn, draw = [], render.draw_outside
    def counted(fig, outside):
        drawn.append(draw(fig, outside))
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        if drawn[-1]: assert f'jhu-clsp/ettin-encoder-17m{OUTSIDE_MARK}' in texts
        return drawn[-1]
    monkeypatch.setattr(render, 'draw_outside', counted)
    render.render_all(results, tmp_path, scale='demo', flops_per_step=None)
    families = one.family.nunique()
    assert max(drawn) == families and sum(d > 0 for d in drawn) >= 1   # each score figure: a line per family panel


def test_the_rank_clusters_mark_them():
    ranks = pd.DataFrame(dict(source='ours', attention='bidirectional', pooling='mean', precision='auto', family='SC',
                              dataset='sst2', checkpoint=['610m-clm-42k', 'jhu-clsp/ettin-encoder-150m'], rank=[1.0, 1.0],
                              score=[0.9, 0.91], note='', outside_grid=[False, True], cell=''))
    text = describe_ranks(ranks, family_ranks(ranks))
    assert f'jhu-clsp/ettin-encoder-150m{OUTSIDE_MARK} 91.00' in text and f"{OUTSIDE_MARK.strip()} outside the paper's grid" in text
    assert f'610m-clm-42k{OUTSIDE_MARK}' not in text
