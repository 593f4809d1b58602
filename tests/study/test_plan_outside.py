"""Issue 46 item 3: the `outside` preset plans Ettin's encoders and decoders and ModernBERT under the paper's protocol,
priced from their shapes; the planner's parameter count is transformers' own for models of those shapes."""
from pathlib import Path

import pytest
import torch

from mlmclm.protocol.finetuning import PROTOCOL_AXES
from mlmclm.protocol.paper import PAPER_LRS, PAPER_SEEDS, PAPER_TASKS
from mlmclm.study.launchers import finetune_params
from mlmclm.model.sizes import OUTSIDE_MODELS
from mlmclm.study.plan import body_params, finetune_flops_by_size, get_plan, point_runs


@pytest.mark.parametrize('name', sorted(OUTSIDE_MODELS))
def test_body_params_are_transformers_own(name):
    "Everything but the token embedding of a ModernBERT (decoder) of the recorded shape, built on the meta device."
    from transformers import AutoConfig, AutoModel
    m = OUTSIDE_MODELS[name]
    config = AutoConfig.for_model('modernbert' if m.kind == 'encoder' else 'modernbert-decoder', num_hidden_layers=m.layers,
                                  hidden_size=m.hidden, intermediate_size=m.intermediate, num_attention_heads=m.heads,
                                  vocab_size=m.vocab)
    with torch.device('meta'): hf = AutoModel.from_config(config)
    assert sum(p.numel() for p in hf.parameters()) - hf.get_input_embeddings().weight.numel() == body_params(name)


def test_the_preset_plans_every_model_on_the_papers_grid():
    plan = get_plan('outside')
    assert [e.name for e in plan.evals] == list(OUTSIDE_MODELS)
    assert all(e.source == e.name and e.datasets == tuple(PAPER_TASKS) for e in plan.evals)
    assert (plan.lrs, plan.seeds) == (tuple(PAPER_LRS), tuple(PAPER_SEEDS))
    assert {x for e in plan.evals for x in plan.experiments_of(e)} == {'outside'}
    runs = [r for e in plan.evals for r in point_runs(plan, e)]   # the paper's protocol: bidirectional, mean pooling, auto
    assert {(r.attention, r.pooling, r.precision) for r in runs} == {tuple(PROTOCOL_AXES[a][0] for a in ('attention', 'pooling', 'precision'))}
    assert len(runs) == len(OUTSIDE_MODELS) * 10 * 6 * 5   # MS MARCO, NQ and MLDR share one retriever: 10 trainings
    sizes = finetune_flops_by_size(plan)
    assert set(sizes) == set(OUTSIDE_MODELS) and all(v > 0 for v in sizes.values())
    assert sizes['jhu-clsp/ettin-encoder-1b'] == sizes['jhu-clsp/ettin-decoder-1b']   # paired: same shape, same price


def test_a_job_fine_tunes_the_hub_id_under_its_own_name(tmp_path):
    plan = get_plan('outside')
    p = finetune_params(plan, plan.evals[0], tmp_path)
    assert (p['checkpoint'], p['checkpoint_name'], p['preset']) == ('jhu-clsp/ettin-encoder-17m',) * 2 + ('paper',)
    assert p['tasks'] == ','.join(PAPER_TASKS) and Path(p['results']) == tmp_path/'results.jsonl'
