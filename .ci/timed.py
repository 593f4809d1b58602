"""Run a command and record how long it took and the machine's load meanwhile: what the README's times are made of.

    python3 .ci/timed.py NAME -- COMMAND [ARGS ...]   # runs COMMAND; its exit status is this one's

Writes `runs/timings/NAME.json` (or under `$MLMCLM_TIMINGS_DIR`): minutes, the lowest and highest 1-minute load
average sampled every 10 s, the CPU count and the date, in the entry format of `figures/demo/timings.json`, from which
`.ci/docs.py` writes the README's times. After committing a new demo run, put the entry first in that file's list.
Standard library only: it runs before the set-up has made `.venv`."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_average() -> float | None:
    try: return float(Path('/proc/loadavg').read_text().split()[0])
    except (OSError, ValueError, IndexError): return None   # not Linux: no load recorded


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != '--':
        print(__doc__, file=sys.stderr); return 2
    name, command = argv[0], argv[2:]
    loads, done = [], threading.Event()
    def sample():
        while True:
            if (l := load_average()) is not None: loads.append(l)
            if done.wait(10): return
    threading.Thread(target=sample, daemon=True).start()
    start = time.monotonic()
    status = subprocess.call(command)
    minutes = round((time.monotonic() - start) / 60, 1)
    done.set()
    if (l := load_average()) is not None: loads.append(l)
    entry = dict(minutes=minutes, load=[round(min(loads), 1), round(max(loads), 1)] if loads else None,
                 cores=os.cpu_count(), date=time.strftime('%Y-%m-%d', time.gmtime()), exit_status=status,
                 what=f'`{" ".join(command)}`')
    folder = Path(os.environ.get('MLMCLM_TIMINGS_DIR') or ROOT/'runs'/'timings')
    folder.mkdir(parents=True, exist_ok=True)
    (folder/f'{name}.json').write_text(json.dumps(entry, indent=2) + '\n')
    load = f'at a load of {entry["load"][0]:g} to {entry["load"][1]:g}' if entry['load'] else '(load not recorded)'
    print(f'{name}: {minutes:g} minutes {load} on {entry["cores"]} CPUs (exit status {status}); {folder/name}.json')
    return status


if __name__ == '__main__': sys.exit(main(sys.argv[1:]))
