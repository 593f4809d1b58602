"""Rows of a results store as a fine-tuning sweep writes them, for the tests that build stores by hand: a row, a
released checkpoint's row (`BASE`), a store of two runs, and our own fine-tuned checkpoint with its pretraining
record."""
from pathlib import Path

import mlmclm.results.store as res
from mlmclm.protocol.paper import FAMILIES

DEMO_TASKS = {'SC': 'rt_sentiment', 'TC': 'corpus_names', 'QA': 'corpus_speaker', 'IR': 'corpus_excerpt'}
BIPHASIC = [dict(objective='clm', steps=84, mask_ratio=None), dict(objective='mlm', steps=252, mask_ratio=0.4)]
OWN = 'tiny-clm0.25-mlm-336-1a2b3c-step-336'   # what `recorded_name` gives the README's papermill biphasic run
# a released checkpoint's row, without its seed and scores
BASE = dict(checkpoint_name='610m-clm-42k', dataset='sst2', family='SC', lr=1e-5, best_step=None, steps=1)


def row(ck='m', ds='sst2', lr=1e-4, seed=0, val=.8, test=.7, family='SC', **kw):
    return dict(checkpoint_name=ck, dataset=ds, family=family, lr=lr, seed=seed, val_score=val, test_score=test, **kw)


def write_rows(store, rows):
    "`rows` appended to the store `store` by a writer of its own."
    with res.StoreWriter(store) as w: w.append(rows)


def store_with_rows(tmp_path) -> Path:
    "A store of two runs (seeds 0 and 1 of `BASE`)."
    store = tmp_path/'results.jsonl'
    write_rows(store, [dict(BASE, seed=k, val_score=.5, test_score=.5) for k in range(2)])
    return store


def own_rows(name=OWN, run_id='tiny-clm0.25-mlm-336-1a2b3c', phases=BIPHASIC, step=336, base=0.40, record=True):
    "A fine-tuned checkpoint of ours as `finetune_sweep` stores it: 3 seeds on each demo task, its pretraining record."
    rows = []
    for f, fam in enumerate(FAMILIES):
        for seed in range(3):
            row = dict(checkpoint_name=name, dataset=DEMO_TASKS[fam], family=fam, lr=1e-3, seed=seed, val_score=0.5,
                       test_score=round(base + 0.05 * f + 0.01 * (seed - 1), 4), best_step=None, steps=None, source='ours')
            if record: row.update(pretrain_run_id=run_id, pretrain_step=step, pretrain_phases=phases, pretrain_init_from=None)
            rows.append(row)
    return rows


BUDGET = dict(batch_size=8, max_length=128, packing=True, max_eval_examples=None)   # the fourth attack's fine-tuning budget


def attack_store(store, systems, seeds=(0, 1, 2), n=200, p=None, **extra):
    "The fourth attack's `mk`: rows of `systems` on sst2 at one LR, with per-example test scores of mean p[system]."
    import numpy as np
    rng = np.random.default_rng(len(systems) + n)
    rows = [dict(checkpoint_name=s, dataset='sst2', family='SC', lr=1e-4, seed=k, val_score=m, test_score=m,
                 test_scores_i=a.tolist(), **extra)
            for i, s in enumerate(systems) for k in seeds
            for a in [(rng.random(n) < (p or {}).get(s, .5 + .02 * i)).astype(float)] for m in [float(a.mean())]]
    with res.StoreWriter(store) as w: w.append(rows)
    return store
