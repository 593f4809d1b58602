"""The fine-tuning benchmark (`mlmclm.bench.finetune_speed`): it times the step a fine-tuning run takes, not a copy of
it (issue 26 item 5)."""
import mlmclm.finetuning.loop as ft


def test_the_benchmark_times_the_step_finetune_run_takes():
    import mlmclm.bench.finetune_speed as bench
    assert (bench.train_step, bench.run_model, bench.optimizer) == (ft.train_step, ft.run_model, ft.optimizer)
