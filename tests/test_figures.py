"""The committed demo results re-render into every figure and table; rendering is byte-stable."""
from pathlib import Path

import pandas as pd
import pytest

from mlmclm.core import project_root
from mlmclm.figures import read_results, render_all

DEMO = project_root()/'figures'/'demo'


@pytest.mark.skipif(not (DEMO/'results.csv').is_file(), reason='no committed demo results yet')
def test_committed_demo_results_render_every_figure(tmp_path):
    results = read_results(DEMO/'results.csv')
    loss = pd.read_csv(DEMO/'cpt_loss.csv') if (DEMO/'cpt_loss.csv').is_file() else None
    files = render_all(results, tmp_path, 'demo', cpt_loss=loss)
    names = {Path(f).name for f in files}
    for n in ['fig1_overview', 'fig2_mlm_vs_clm', 'fig3_mask_ratio', 'fig4_data_efficiency', 'fig5_lr_stability',
              'fig6_biphasic', 'fig7_ratio_after_clm', 'fig8_cpt', 'fig9_cpt_loss', 'figA1_biphasic_largest']:
        assert f'{n}.png' in names and f'{n}.pdf' in names
    assert len([n for n in names if n.startswith('T') and n.endswith('.tex')]) == 17
    again = render_all(results, tmp_path/'again', 'demo', cpt_loss=loss)
    for a, b in zip(files, again):
        assert Path(a).read_bytes() == Path(b).read_bytes(), a
    # the committed figures are the ones these results give
    for f in files:
        committed = DEMO/Path(f).relative_to(tmp_path)
        assert committed.is_file(), committed
