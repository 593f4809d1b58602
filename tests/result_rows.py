"""Rows of a results store as a fine-tuning sweep writes them, for the tests that build stores by hand."""


def row(ck='m', ds='sst2', lr=1e-4, seed=0, val=.8, test=.7, family='SC', **kw):
    return dict(checkpoint_name=ck, dataset=ds, family=family, lr=lr, seed=seed, val_score=val, test_score=test, **kw)
