"""The report's tables (`mlmclm.report.tables`): a direction is judged by its size as well as its sign, and the
intervals of a difference of percentages stay within 100 points (issue 39 item 3)."""
import numpy as np
import pandas as pd

from mlmclm.report.tables import difference_range, direction_verdict, directions
from mlmclm.results.paper_runs import reported_scores


def test_a_difference_75_times_the_papers_is_not_as_the_paper():
    assert direction_verdict(-36.06, -38.70, -33.41, -0.48) == 'same sign, 75x larger'
    assert direction_verdict(37.05, 33.09, 41.02, 0.50) == 'same sign, 74x larger'
    assert direction_verdict(-0.9, -1.2, -0.6, -0.48) == 'as the paper'          # 1.9x: within the factor
    assert direction_verdict(4.0, 0.5, 7.5, 0.85) == 'as the paper'              # 4.7x, but the paper's value is inside


def test_directions_keep_intervals_of_a_difference_of_percentages_within_100_points():
    per_seed = pd.DataFrame([dict(checkpoint=ck, family='QA', seed=sd, test_score=v)
                             for ck, vs in (('tiny-clm-42k', (0.05, 0.95, 0.77)), ('tiny-mlm40-42k', (0.0, 0.0, 0.0)))
                             for sd, v in enumerate(vs)])
    row = directions(per_seed, reported_scores(), 'tiny').iloc[0]
    assert row.ci_low == -100.0 and -100 <= row.ci_high <= 100
    assert difference_range(-103.14, 111.11) == (-100.0, 100.0)
    assert np.isnan(difference_range(np.nan, np.nan)[0])
