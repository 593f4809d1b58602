"""Issue 49, N27: a mask ratio under 10% got a label neither grammar read. `mlm05` was accepted, labelled `mlm5`, and
`run_name` then wrote `tiny-mlm5-8k`, which `parse_run_name` refused; the preset `tiny-mlm05-8k`, a name the grammar
accepted, was refused with "schedule='mlm5:8000': cannot read phase". Both grammars now read one digit or two."""
import pytest

from mlmclm.pretraining.checks import check_pretrain_config
from mlmclm.protocol.run_names import RunName, parse_run_name, run_name
from mlmclm.protocol.runs import pretrain_config
from mlmclm.protocol.schedules import Phase, parse_schedule


@pytest.mark.parametrize('written', ['mlm05:8000', 'mlm5:8000'])
def test_n27_a_ratio_under_10_percent_reads_back_from_its_label_and_its_name(written):
    phases = parse_schedule(written)
    assert phases == [Phase('mlm', 8000, 0.05)] and phases[0].label == 'mlm5'
    name = run_name(RunName('tiny', tuple(phases)))
    assert name == 'tiny-mlm5-8k' and parse_run_name(name).phases == tuple(phases)
    assert parse_schedule(parse_run_name(name).schedule) == phases


@pytest.mark.parametrize('preset', ['tiny-mlm05-8k', 'tiny-mlm5-8k', 'tiny-clm-4k-mntp5-8k'])
def test_n27_the_preset_of_such_a_name_is_a_run(preset, tmp_path):
    cfg = pretrain_config(preset, seq_len=32, batch_size=64, global_batch=64, data='embedded', tokenizer='embedded',
                          init_from=None, out_dir=str(tmp_path))
    assert [p.mask_ratio for p in check_pretrain_config(cfg) if p.masked] == [0.05]


def test_three_digits_are_still_no_ratio():
    with pytest.raises(Exception, match="cannot read phase 'mlm405:10'"):
        parse_schedule('mlm405:10')
