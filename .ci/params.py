"""The `parameters` cells of the launcher notebooks are the configs' fields at their defaults (mlmclm.base.configs.parameters_source).
`python .ci/params.py check` fails when one drifted from its config; `python .ci/params.py sync` rewrites them (then nbdev_clean)."""
import json
import sys
from pathlib import Path

from mlmclm.base.configs import parameters_source
from mlmclm.protocol.runs import FinetuneConfig, PretrainConfig

ROOT = Path(__file__).resolve().parents[1]
LAUNCHERS = {  # notebook -> (config, the preset line)
    'nbs/02_pretrain.ipynb': (PretrainConfig, "preset = None  # None or 'demo': the defaults below; a released model's "
                                              "name, e.g. '610m-clm-10k-mlm40-42k': the paper's run"),
    'nbs/03b_finetune.ipynb': (FinetuneConfig, "preset = None  # None or 'demo': the defaults below (CPU minutes); "
                                               "'paper': the paper's grid and budget"),
}


def parameters_cell(nb: dict) -> dict:
    cells = [c for c in nb['cells'] if 'parameters' in c['metadata'].get('tags', [])]
    if len(cells) != 1: raise SystemExit(f'expected one cell tagged parameters, found {len(cells)}')
    return cells[0]


def expected(path: str) -> str: return parameters_source(*LAUNCHERS[path])


def main(command: str) -> int:
    stale = []
    for path in LAUNCHERS:
        nb = json.loads((ROOT/path).read_text(encoding='utf-8'))
        cell, want = parameters_cell(nb), expected(path)
        if ''.join(cell['source']) == want: continue
        stale.append(path)
        if command == 'sync':
            lines = want.split('\n')
            cell['source'] = [l + '\n' for l in lines[:-1]] + [lines[-1]]
            (ROOT/path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n', encoding='utf-8')
    if stale and command == 'check':
        print(f'FAIL: the parameters cell of {", ".join(stale)} is not its config\'s fields at their defaults; '
              f'run `python .ci/params.py sync` then `nbdev_clean`')
        return 1
    print(f"parameters cells: {'rewrote ' + ', '.join(stale) if stale else 'in sync with their configs'}")
    return 0


if __name__ == '__main__': sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else 'check'))
