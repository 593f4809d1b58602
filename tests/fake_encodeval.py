"""A stand-in for a clone of hgissbkh/EncodEval: a small `results/` tree in the authors' layout, with known scores and
three files the importer must skip (`mlmclm.results.paper_runs.import_tree`). Used by the tests and by `nbs/results/03_paper_runs.ipynb`."""
import json
from pathlib import Path

import numpy as np


def write_fixture_tree(root: str | Path, models=('610m-mlm40-42k', '610m-clm-42k'), lrs=(1e-5, 1e-4), seeds=(0, 1, 2),
                       n_examples: int = 50) -> Path:
    "A small tree in the EncodEval layout with known scores (used by the tests and `results/03_paper_runs`)."
    root = Path(root)/'results'
    rng = np.random.default_rng(0)
    datasets = [('SC', 'sst2', ''), ('SC', 'qqp', ''), ('QA', 'squad', ''), ('IR', 'nq', 'msmarco_pairs_')]
    for i, model in enumerate(models):
        for family, ds, prefix in datasets:
            for lr in lrs:
                for s in seeds:
                    # score = 0.5 + 0.08 * model index + 0.05 at the larger LR, plus seed noise (< 1 for 5 models)
                    p = 0.5 + 0.08 * i + (0.05 if lr == max(lrs) else 0) + 0.01 * s
                    scores = (rng.random(n_examples) < p).astype(float)
                    run = root/model/family/ds/f'{prefix}lr{lr:.0e}_sd{s}'
                    run.mkdir(parents=True, exist_ok=True)
                    (run/'results.json').write_text(json.dumps({
                        'validation': {'score': p, 'scores_i': [p] * 3},
                        'test': {'score': float(scores.mean()), 'scores_i': scores.tolist()}}))
    bad = root/models[0]/'SC'/'sst2'/'lr5e-04_sd0'; bad.mkdir(parents=True, exist_ok=True)
    (bad/'results.json').write_text('{"validation": {"score": 0.5}')                      # truncated JSON
    odd = root/'610m-bert-42k'/'SC'/'sst2'/'lr1e-04_sd0'; odd.mkdir(parents=True, exist_ok=True)
    (odd/'results.json').write_text('{"validation": {"score": 0.5}, "test": {"score": 0.5}}')   # unknown name
    weird = root/models[0]/'SC'/'sst2'/'best'; weird.mkdir(parents=True, exist_ok=True)
    (weird/'results.json').write_text('{"validation": {"score": 0.5}, "test": {"score": 0.5}}')  # odd run folder
    return root
