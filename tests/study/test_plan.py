"""The study's planner (`mlmclm.study.plan`) prices fine-tuning from what it trains: the demo's examples, tokens and
steps as fine-tuning encodes them (issue 36, item 1's leftover), each dataset's family from the task table, an error
for a dataset the table lacks, and the paper's plan to the last bit as before; runs of mixed and moving phases are
priced at their expected cost."""
import re

import pytest

from mlmclm import study
from mlmclm.study.plan import Costs, build_plan, demo_plan, run_flops
from mlmclm.base.configs import ConfigError
from mlmclm.protocol.paper import EMBEDDED_TASKS
from mlmclm.model.sizes import flops_per_token, memory_estimate, model_config, phase_flops_per_token
from mlmclm.protocol.run_names import parse_run_name
from mlmclm.protocol.schedules import Phase
from mlmclm.study.commands import describe


# ------------------------------------------------------------- what the demo fine-tunes (issue 36, item 1's leftover)

def test_the_planner_counts_the_demos_examples_as_fine_tuning_encodes_them():
    "The planner's count (no torch) against the features the fine-tuning loop trains on: examples, tokens and steps."
    import statistics
    from mlmclm.data.tokenizers import load_tokenizer
    from mlmclm.finetuning.loop import _run_context
    from mlmclm.protocol.runs import train_steps
    from mlmclm.finetuning.evaluation import KINDS, head_kind
    from mlmclm.finetuning.batches import example_tokens
    from mlmclm.protocol.runs import finetune_config
    from mlmclm.tasks.registry import TASKS
    from mlmclm.protocol.paper import EMBEDDED_TASKS
    demo, cfg, tok = demo_plan(), finetune_config('demo', feature_cache='off', device='cpu'), load_tokenizer('embedded')
    for name in EMBEDDED_TASKS:
        task = TASKS[name]
        feats = KINDS[head_kind(task, cfg)].features(task.load()['train'], _run_context(task, tok, cfg))
        n, per_example = study.shipped_examples(name, task.max_length)
        assert n == len(feats), name
        assert per_example == pytest.approx(statistics.mean(example_tokens(f) for f in feats), rel=0.05), name
        assert study.finetune_steps(demo, name, n) == train_steps(name, n, cfg), name


# ---------------------------------------------------------------- a dataset's family (issue 36 item 1)
# A dataset's family comes from the task table (`mlmclm.tasks.registry.TASKS`) only.
def test_the_demo_datasets_are_priced_as_their_own_families():
    "`study._family` called corpus_names and corpus_speaker SC (64 tokens an example) and priced 1,000 steps of 32."
    assert [study.dataset_family(d) for d in EMBEDDED_TASKS] == ['SC', 'TC', 'QA', 'IR']
    one = study.demo_plan(datasets=('corpus_speaker',), control=False)
    n, per_example = study.shipped_examples('corpus_speaker', 192)   # its real examples, tokens cut at the task's 192
    per_run = 6 * study.body_params('tiny') * (n // 8) * 8 * per_example   # one epoch of 8 a step (issue 36: as it ships)
    assert study.finetune_flops(one) == pytest.approx(len(one.evals) * len(one.lrs) * len(one.seeds) * per_run, rel=1e-12)


def test_a_dataset_the_task_table_lacks_is_an_error_not_an_sc_guess():
    with pytest.raises(ConfigError, match="dataset 'my_sc' is not in the task table; choose from"):
        study.finetune_flops(study.demo_plan(datasets=('rt_sentiment', 'my_sc')))


def test_the_papers_plan_prices_fine_tuning_as_before():
    """Nothing was asked to change for the paper: the same FLOPs to the last bit (values from before the registry, with
    the authors' 26-layer 1b; the 28-layer shape gave 2.391058735792128e+20)."""
    assert study.finetune_flops(study.paper_plan()) == 2.287070783963136e+20
    assert study.finetune_flops(study.get_plan('protocol-ablation')) == 5.546574941257728e+19


# ---------------------------------------------------------------- mixed and moving phases (issue 37 item 2)
def test_the_planner_prices_mixed_and_moving_runs():
    plan = build_plan('unit', {'X': ['610m-clm-10k-50clm+50mlm40-42k', '610m-mlm30to10-42k']}, ('sst2',), ('sst2',),
                      lrs=(1e-4,), seeds=(0,))
    costs = Costs()
    clm, mlm40, mlm20 = (flops_per_token(model_config('610m'), costs.seq_len, o, r)
                         for o, r in (('clm', 0.4), ('mlm', 0.4), ('mlm', 0.2)))
    mixed, moving = plan.runs['610m-clm-10k-50clm+50mlm40-42k'], plan.runs['610m-mlm30to10-42k']
    assert run_flops(plan, mixed, costs) == pytest.approx(costs.tokens_per_step * (10000 * clm + 32000 * (clm + mlm40) / 2))
    assert run_flops(plan, moving, costs) == pytest.approx(costs.tokens_per_step * 42000 * mlm20)
    assert phase_flops_per_token('610m', costs.seq_len, Phase('mlm30to10', 42000)) == pytest.approx(mlm20)
    text = describe(plan, costs, memory=True)
    assert re.search(r'pretraining runs +2\n', text) and '610m  estimated peak' in text
    worst = memory_estimate('610m', 'ddp', 8, objective='50clm+50mlm40', grad_accum=24)
    assert worst['peak_gib'] == memory_estimate('610m', 'ddp', 8, objective='clm', grad_accum=24)['peak_gib']


def test_the_planner_shares_no_steps_between_moving_ratios_of_different_lengths():
    from mlmclm.study.plan import branch_step
    assert branch_step(parse_run_name('610m-50clm+50mlm40-22k'), parse_run_name('610m-50clm+50mlm40-42k'), 2000, 2000) == 20000
    assert branch_step(parse_run_name('610m-mlm30to5-22k'), parse_run_name('610m-mlm30to5-42k'), 2000, 2000) == 0
