"""Issue 49 (fourth fault attack) N8: a sweep run again after its dataset changed counted the old revision's rows as
done beside new rows of the new revision, one grid of two datasets. Once it has loaded a dataset, a sweep compares
the revision it loaded with the revision of the done rows it would reuse, and refuses, naming both and `force=`."""
import pytest

import mlmclm.finetuning.sweep as sweep
from mlmclm.base.configs import ConfigError
from mlmclm.protocol.runs import FinetuneConfig
from mlmclm.results.store import load_results


@pytest.fixture
def revision(monkeypatch):
    "The revision the next load of a task reports (a local dataset's content hash, as `load_task_revision` gives it)."
    now, real = {'rev': 'content-sha256:aaaa'}, sweep.load_task_revision
    monkeypatch.setattr(sweep, 'load_task_revision', lambda task, source: (real(task, source)[0], now['rev']))
    return now


def test_rows_of_another_revision_are_not_counted_as_done(tmp_path, revision):
    cfg = lambda seeds: FinetuneConfig(tasks='rt_sentiment', lrs='1e-3', seeds=seeds, max_steps=1, batch_size=4,
                                       micro_batch_size=4, max_eval_examples=8, results=str(tmp_path/'d1.jsonl'),
                                       feature_cache='off', progress=False)
    sweep.finetune_sweep(cfg('0'))
    revision['rev'] = 'content-sha256:bbbb'                    # the dataset changed
    with pytest.raises(ConfigError, match=r"rt_sentiment\|0\.001\|0: dataset_revision 'content-sha256:aaaa' "
                                          r"\(asked 'content-sha256:bbbb'\).*force='<reason>'"):
        sweep.finetune_sweep(cfg('0,1'))
    assert load_results(tmp_path/'d1.jsonl').seed.tolist() == [0]   # nothing trained at the new revision beside it
    sweep.finetune_sweep(cfg('0,1'), force='the dataset changed')  # the way on: both seeds at the new revision
    rows = load_results(tmp_path/'d1.jsonl')
    assert sorted(rows.seed) == [0, 1] and set(rows.dataset_revision) == {'content-sha256:bbbb'}
    revision['rev'] = 'content-sha256:bbbb'
    sweep.finetune_sweep(cfg('0,1,2'))                          # the same revision: the done rows count, seed 2 runs
    assert sorted(load_results(tmp_path/'d1.jsonl').seed) == [0, 1, 2]
