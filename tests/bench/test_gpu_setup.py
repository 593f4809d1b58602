"""`.ci/gpu`'s set-up on a machine like the lent one (issue 48 item 1), driven against a `python3` whose torch lives in
another environment (`gpu_machine.py`), with no PYTHONPATH supplied by the test: the script finds the interpreter,
puts the repository on PYTHONPATH itself, installs the wheels it brings with `--no-index`, and says clearly when no
interpreter imports torch. (The control flow of the parts that follow: `test_gpu_script.py`.)"""
import importlib.util, json, os, subprocess
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location('gpu_machine', Path(__file__).parent/'gpu_machine.py')
gpu_machine = importlib.util.module_from_spec(spec); spec.loader.exec_module(gpu_machine)


def _call(bin_: Path, tmp: Path, *args, **env) -> subprocess.CompletedProcess:
    "`bash .ci/gpu --cpu-tiny ...` as the run tool calls it: the machine's python3 first on PATH, no PYTHONPATH."
    environ = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH' and not k.startswith('MLMCLM_GPU')}
    environ.update(PATH=f'{bin_}{os.pathsep}/usr/bin{os.pathsep}/bin', OUT=str(tmp/'out'), MLMCLM_GPU_WORK=str(tmp/'work'),
                   OMP_NUM_THREADS='1', **env)
    return subprocess.run(['bash', str(ROOT/'.ci'/'gpu'), '--cpu-tiny', *args], env=environ, capture_output=True,
                          text=True, timeout=300, cwd=tmp)


def test_the_set_up_uses_the_machines_python_and_brings_its_wheels(tmp_path):
    bin_ = gpu_machine.gpu_like_python(tmp_path/'machine')
    # the machine's python3 alone does not import the package: the script must put the repository on PYTHONPATH
    alone = subprocess.run([str(bin_/'python3'), '-c', 'import mlmclm'], capture_output=True, text=True, cwd=tmp_path,
                           env={k: v for k, v in os.environ.items() if k != 'PYTHONPATH'})
    assert alone.returncode != 0 and "No module named 'mlmclm'" in alone.stderr
    wheels = tmp_path/'wheels'; wheels.mkdir(); gpu_machine.wheel(wheels)
    p = _call(bin_, tmp_path, '--parts', 'machine', MLMCLM_GPU_WHEELS=str(wheels))
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    work = tmp_path/'work'
    setup = (work/'setup.log').read_text()
    assert f'python: {bin_/"python3"}' in setup and 'wheels: mlmclm_gpu_probe-1.0-py3-none-any.whl' in setup
    imports = json.loads((work/'machine.json').read_text())['imports']
    assert imports['mlmclm'] == str(ROOT/'mlmclm'/'__init__.py')
    assert imports['mlmclm_gpu_probe'] == str(work/'site'/'mlmclm_gpu_probe.py')     # installed with --no-index
    assert 'machine-site' in imports['torch']
    assert sorted(q.name for q in (tmp_path/'out').iterdir()) == ['parts.tar.gz', 'report.json', 'status.json', 'summary.md']


def test_no_python_with_torch_is_a_clear_failure(tmp_path):
    bin_ = gpu_machine.gpu_like_python(tmp_path/'machine', with_torch=False)
    p = _call(bin_, tmp_path, PYTHON=str(bin_/'python3'))
    assert p.returncode == 1 and 'setup failed: no python3 imports torch; see setup.log' in p.stderr
    log = (tmp_path/'out'/'setup.log').read_text()                                # it comes back with $OUT
    assert f"{bin_/'python3'}: no torch" in log and "No module named 'torch'" in log


def test_a_venv_made_from_the_machines_python_would_not_see_torch(tmp_path):
    "Why the script makes no venv: one made with --system-site-packages from a venv sees the base interpreter's packages."
    bin_ = gpu_machine.gpu_like_python(tmp_path/'machine')
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    assert subprocess.run([str(bin_/'python3'), '-c', 'import torch'], env=env, capture_output=True).returncode == 0
    subprocess.run([str(bin_/'python3'), '-m', 'venv', '--without-pip', '--system-site-packages', str(tmp_path/'v')],
                   check=True, env=env, capture_output=True, timeout=120)
    p = subprocess.run([str(tmp_path/'v'/'bin'/'python'), '-c', 'import torch'], env=env, capture_output=True, text=True)
    assert p.returncode != 0 and "No module named 'torch'" in p.stderr


def test_the_script_installs_nothing_from_an_index():
    script = (ROOT/'.ci'/'gpu').read_text()
    pip_lines = [l for l in script.splitlines() if 'pip install' in l and not l.lstrip().startswith('#')]
    assert pip_lines and all('--no-index' in l for l in pip_lines)
    assert '-m venv' not in ''.join(l for l in script.splitlines() if not l.lstrip().startswith('#'))   # no venv made
