"""The protocol document, the code's constants and Table 1 say the same thing."""
import dataclasses
import json
import re

from mlmclm.base.files import project_root
from mlmclm.protocol.runs import FinetuneConfig, finetune_config, finetune_grid
from mlmclm.protocol.paper import PAPER_LRS, PAPER_SEEDS
from mlmclm.protocol.finetuning import FINETUNE, FINETUNE_OPTIONS, PROTOCOL

DOC = (project_root()/'nbs'/'protocol.md').read_text()


def option_rows() -> dict:
    "Option -> its row in the options table of protocol.md."
    return {m.group(1): m.group(0) for m in re.finditer(r'^\| `(\w+)` \|.*$', DOC, flags=re.M)}


def test_the_document_names_every_option_with_its_default_and_alternatives():
    rows = option_rows()
    for name, option in FINETUNE_OPTIONS.items():
        assert name in rows, f'protocol.md has no row for option {name!r}'
        cells = rows[name].split('|')
        assert f'`{option.default}`' in cells[2], (name, cells[2])
        for choice in option.choices: assert f'`{choice}`' in rows[name], (name, choice)


def test_finetune_config_takes_its_defaults_from_the_protocol_constants():
    "The protocol options default to the paper's; the `paper` preset's budget is the protocol's (the defaults: the demo's)."
    fields = {f.name: f for f in dataclasses.fields(FinetuneConfig)}
    for name, option in FINETUNE_OPTIONS.items():
        assert fields[name].default == option.default and fields[name].metadata['choices'] == option.choices
    paper = finetune_config('paper')
    assert (paper.batch_size, paper.eval_every, paper.max_steps, paper.max_eval_examples) == (FINETUNE.batch_size, FINETUNE.eval_every, None, None)
    assert finetune_grid(paper) == (list(PAPER_LRS), list(PAPER_SEEDS))


def test_table_1_is_written_from_the_same_constants():
    from mlmclm.report.tables import hyperparameter_table
    table = hyperparameter_table()
    finetuning = dict(zip(table[table.stage == 'fine-tuning'].setting, table[table.stage == 'fine-tuning'].value))
    from mlmclm.results.aggregation import SELECTIONS, DEFAULT_SELECTION
    # the selection row is the aggregation's own default rule, so the table and the numbers cannot disagree
    assert finetuning == {**PROTOCOL, 'selection': SELECTIONS[DEFAULT_SELECTION]}
    assert PROTOCOL['weights tested'] == str(FINETUNE_OPTIONS['select_step'])
    assert f'{FINETUNE.max_length:,}' in PROTOCOL['max length'] and FINETUNE.max_length == round(0.99 * 2048)
    assert all(t in PROTOCOL['steps'] for t in FINETUNE.epoch_tasks)


def test_the_fine_tuning_notebooks_cite_the_protocol_not_a_spec_users_lack():
    for nb in ('tasks/00_examples.ipynb', 'tasks/02_registry.ipynb', 'finetuning/03_loop.ipynb'):
        text = ''.join(''.join(c['source']) for c in json.loads((project_root()/'nbs'/nb).read_text())['cells'])
        assert not re.search(r'SPEC\b', text), nb
        assert 'protocol.md' in text, nb
