"""The docs without Quarto: README.md from nbs/index.ipynb, the guide pages that carry numbers from their templates, and
the HTML site of every notebook and page in _docs/ (Sphinx).

All come from the committed notebooks, pages and their saved outputs (`.ci/outputs.py`): nothing is executed here.

    .venv/bin/python .ci/docs.py readme         # rewrite README.md from nbs/index.ipynb, nbs/guide/*.md from *.md.in
    .venv/bin/python .ci/docs.py check-readme   # fail if one of them is not what its source renders to (the test command)
    .venv/bin/python .ci/docs.py html [DIR]     # the site in DIR (default _docs/); fails on a broken link or anchor
    .venv/bin/python .ci/docs.py browser [DIR] [SHOTS]   # open it in headless Chromium, with screenshots in SHOTS
                                                         # (default runs/docs-check/); Debian: apt-get install chromium

The README's measured numbers are not typed in: `index.ipynb` writes `{{name args}}` where one belongs, and both the
README and the site fill it in from the committed demo results (`NUMBERS` below): `results.csv` and `pretrain_loss.csv`
as committed in `figures/demo/`, read from their copy in `tests/fixtures/demo/` (which the tests keep equal to the
committed files, and which no demo run rewrites: a rerun on another CPU changes `figures/demo/`, not the README's
source), and the measured times of `figures/demo/timings.json`. So the README cannot drift from them, and
`check-readme` fails when they change until `docs.py readme` is run. A guide page that carries numbers
(`nbs/guide/<page>.md`) is written the same way from its template `nbs/guide/<page>.md.in`, and committed filled, so
that it reads right on a forge as in the site; the site refuses a page with a `{{name args}}` left in it.

The site is built by Sphinx with myst-nb from `.ci/sphinx/conf.py` (which says why that builder): `index.html` is the
rendered `index.ipynb` (the README), every notebook, `protocol.md` and each guide page is a page with the saved
outputs, each notebook is followed by the API of the module it exports with nbdev's parameter tables, and Sphinx
resolves, copies and checks every link and image (`-W`: a warning fails the build). Cells tagged `#| hide` and nbdev's
`#|` lines are left out.
"""
import base64
import fcntl
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT/'nbs'
CONF = ROOT/'.ci'/'sphinx'   # conf.py: the builder's settings and its two hooks (the notebooks as shown, parameter tables)
GUIDE = NBS/'guide'          # the guide pages (Markdown); <page>.md.in: the template of a page that carries numbers


def readme_text() -> str:
    "README.md as `index.ipynb` renders to Markdown (code fences marked as Python, outputs as indented text)."
    import nbformat
    from nbconvert import MarkdownExporter
    nb = nbformat.read(NBS/'index.ipynb', as_version=4)
    nb.metadata['language_info'] = {'name': 'python'}   # nbdev_clean drops it; the exporter needs it for ```python
    for cell in nb.cells:
        if cell.cell_type == 'markdown': cell.source = fill(cell.source)
    body, _ = MarkdownExporter().from_notebook_node(nb)
    body = re.sub(r'\n{3,}', '\n\n', body).strip() + '\n'
    return body


def generated_pages() -> dict[Path, str]:
    "Every generated page, path -> text: README.md, and each guide page that has a template (`<page>.md.in`)."
    note = '<!-- Written by `.ci/docs.py readme` from {}: edit that, then run it. -->\n\n'
    pages = {ROOT/'README.md': readme_text()}
    for template in sorted(GUIDE.glob('*.md.in')):
        pages[template.with_suffix('')] = note.format(template.name) + fill(template.read_text(encoding='utf-8'))
    return pages


# ---------------------------------------------------------------- numbers from the committed results

DEMO = ROOT/'tests'/'fixtures'/'demo'                 # the committed demo tables (a copy no demo run rewrites)
TIMINGS = ROOT/'figures'/'demo'/'timings.json'     # the measured times of the README's commands
PLACEHOLDER = re.compile(r'\{\{([a-z_]+)((?: [^{}\s]+)*)\}\}')
# the demo's final models in the README's words, in its order (the control first)
DEMO_MODELS = {'tiny-random': '`tiny-random` (control)', 'tiny-clm-42k': 'CLM', 'tiny-mlm40-42k': 'MLM-40',
               'tiny-mlm20-42k': 'MLM-20', 'tiny-clm-10k-mlm40-42k': '25% CLM then MLM-40',
               'tiny-clm-dec42k-mlm40-54k': 'CPT: decayed CLM + MLM-40',
               'tiny-mlm40-dec42k-mlm40-54k': 'CPT: decayed MLM-40 + MLM-40'}


def _demo_results():
    from mlmclm.results.store import read_results
    return read_results(DEMO/'results.csv')


def _measurement(entry: dict, detail: bool) -> str:
    "'65 minutes at a load of 4 to 7', with its stages and what was measured when `detail`."
    load = entry.get('load')
    text = f"{entry['minutes']:g} minutes " + (f'at a load of {load[0]:g} to {load[1]:g}' if load else ', load not recorded')
    text = text.replace(' ,', ',')
    if not detail: return text
    stages = ', '.join(f'{k} {v:g}' for k, v in entry.get('stages', {}).items())
    return text + ' (' + '; '.join(x for x in (stages, entry.get('what', '')) if x) + ')'


def timing(command: str, which: str = 'latest') -> str:
    """How long `command` ('demo', 'test') took, from `timings.json`: its newest measurement ('latest': minutes and
    load) or every one ('all', newest first, with its stages and what was measured)."""
    entries = json.loads(TIMINGS.read_text(encoding='utf-8'))[command]
    if which == 'latest': return _measurement(entries[0], False)
    return '; '.join(_measurement(e, True) for e in entries)


def timing_range(command: str) -> str:
    "'16.5 to 65 minutes': the fastest and the slowest measurement of `command`."
    minutes = [e['minutes'] for e in json.loads(TIMINGS.read_text(encoding='utf-8'))[command]]
    return f'{min(minutes):g} to {max(minutes):g} minutes'


def pretrain_loss(run: str, column: str) -> str:
    "One number of `pretrain_loss.csv` (`final_loss`, `heldout_loss`, `unigram_entropy`), two decimals."
    import pandas as pd
    table = pd.read_csv(DEMO/'pretrain_loss.csv').set_index('run')
    return f'{table.loc[run, column]:.2f}'


def scores_table() -> str:
    "The demo's family scores (percent, mean ± half its 95% interval over seeds), one row per final model."
    from mlmclm.report.render import control_scores, split_control, study_scores
    from mlmclm.protocol.paper import FAMILIES
    ours, control = split_control(_demo_results())
    scores = {**{(r.checkpoint, r.family): r for r in study_scores(ours).itertuples()},
              **{('tiny-random', r.family): r for r in control_scores(control).itertuples()}}
    cell = lambda r: f'{r.score:.1f} ± {(r.ci_high - r.ci_low) / 2:.1f}'
    rows = [f'| {label} | ' + ' | '.join(cell(scores[(ck, f)]) for f in FAMILIES) + ' |'
            for ck, label in DEMO_MODELS.items() if all((ck, f) in scores for f in FAMILIES)]
    return '\n'.join(['| model | ' + ' | '.join(FAMILIES) + ' |', '|---' * (len(FAMILIES) + 1) + '|'] + rows)


def intermediate_tasks() -> str:
    "The tasks the demo's intermediate checkpoints were fine-tuned on, from `results.csv`: 'two tasks (TC, QA)'."
    from mlmclm.protocol.run_names import describe_checkpoint
    res = _demo_results()
    inter = res[[n != 'tiny-random' and describe_checkpoint(n)['intermediate'] for n in res.checkpoint_name]]
    tasks = inter.drop_duplicates('dataset').sort_values('family')
    words = {1: 'one', 2: 'two', 3: 'three', 4: 'four'}
    return (f"{words.get(len(tasks), len(tasks))} task{'s' if len(tasks) != 1 else ''} "
            f"({', '.join(f'{r.family}: `{r.dataset}`' for r in tasks.itertuples())})")


COUNTS = {'finetune_runs': len, 'checkpoints': lambda r: r.checkpoint_name.nunique(), 'seeds': lambda r: r.seed.nunique()}


def count(what: str) -> str:
    "How many of `what` `results.csv` holds: 'finetune_runs' (rows), 'checkpoints' (the control's included), 'seeds'."
    if what not in COUNTS: raise KeyError(f'{{{{count {what}}}}}: no such count; known: {sorted(COUNTS)}')
    return f'{COUNTS[what](_demo_results()):,}'


def directions_summary() -> str:
    "The directions table of the demo in words: per comparison, each family's verdict."
    from mlmclm.report.render import split_control
    from mlmclm.report.tables import directions
    from mlmclm.results.paper_runs import paper_rows, reported_scores
    from mlmclm.results.aggregation import protocol_cell, seed_family_scores
    table = directions(seed_family_scores(protocol_cell(paper_rows(split_control(_demo_results())[0]))), reported_scores(), 'tiny')
    return '. '.join(f'{name}: ' + '; '.join(f'{r.family} {r.verdict}' for r in g.itertuples())
                     for name, g in table.groupby('comparison', sort=False))


NUMERICS = ROOT/'figures'/'demo'/'compare'/'numerics'   # the demo under two numerics (tests/results/test_compare_demo.py)


def numerics(what: str) -> str:
    """The demo under two numerics of one machine, from `figures/demo/compare/numerics/`: 'claims' (how many of the
    README's verdicts hold under both, and which do not), 'scores' (the largest per-cell difference and how many cells
    agree), 'losses' (the largest pretraining loss difference)."""
    import pandas as pd
    if what == 'claims':
        c = pd.read_csv(NUMERICS/'claims.csv')
        fragile = '; '.join(f'"{r.claim}" (pinned: {r.value_a}; generic: {r.value_b})' for r in c[~c.robust].itertuples())
        return f'{int(c.robust.sum())} of {len(c)} hold under both' + (f'; fragile: {fragile}' if fragile else '')
    t = pd.read_csv(NUMERICS/'compare.csv')
    if what == 'scores':
        cells = t[t.kind == 'dataset']
        worst = cells.loc[cells['diff'].abs().idxmax()]
        return (f"{int((cells.verdict == 'agree').sum())} of {len(cells)} checkpoint x dataset cells agree within 2 points "
                f"({int(cells.identical.sum())} identical), {int((cells.verdict == 'differ').sum())} differ; the largest "
                f"difference is {worst.checkpoint} on {worst.what}, {worst.mean_a:.1f} against {worst.mean_b:.1f}")
    if what == 'losses':
        runs = t[t.kind.str.startswith('pretraining')]
        worst = runs.loc[runs['diff'].abs().idxmax()]
        return f"at most {abs(worst['diff']):.3f} nats ({worst.checkpoint}, {worst.what.replace('_', ' ')})"
    raise KeyError(f'{{{{numerics {what}}}}}: no such number; known: claims, scores, losses')


DIFFUSION = ROOT/'figures'/'diffusion'   # the data-constrained experiment of issue 47 (mlmclm.study.diffusion)
DIFFUSION_LABELS = {'clm': 'CLM', 'mlm40': 'MLM-40', 'vmlm': 'variable-rate MLM', 'mdlm': 'MDLM'}


def diffusion(what: str) -> str:
    """The data-constrained experiment in words, from `figures/diffusion/` (the NLL per token on held-out rows, `nll`:
    exact for CLM, the MDLM bound for the others): 'setup', 'best' (each objective's best epoch and value with the seeds'
    range) or 'last' (the values at the last epoch)."""
    import pandas as pd
    s = json.loads((DIFFUSION/'experiment.json').read_text(encoding='utf-8'))['settings']
    if what == 'setup':
        timing = json.loads((DIFFUSION/'experiment.json').read_text(encoding='utf-8'))['timing']
        return (f"{s['unique_rows'] * s['seq_len']:,} unique tokens read {s['epochs']} times by a `{s['size']}` model, "
                f"{len(s['seeds'])} seeds; {timing['wall_s'] / 60:.0f} minutes with {timing['workers']} workers")
    if what in ('finetune', 'finetune_lead', 'finetune_control'): return _diffusion_finetune(what)
    t = pd.read_csv(DIFFUSION/'summary.csv').query("measure == 'nll'").set_index('objective')
    if what not in ('best', 'last'):
        raise KeyError(f'{{{{diffusion {what}}}}}: no such number; known: setup, best, last, finetune, finetune_lead, finetune_control')
    cell = lambda o: (f"{t.loc[o, what]:.2f} [{t.loc[o, what + '_low']:.2f}, {t.loc[o, what + '_high']:.2f}]"
                      + (f" at epoch {int(t.loc[o, 'best_epoch'])}" if what == 'best' else ''))
    return ', '.join(f'{DIFFUSION_LABELS.get(o, o)} {cell(o)}' for o in t.index)


def _diffusion_finetune(what: str) -> str:
    """The fine-tuning of the experiment's final models (`figures/diffusion/finetune/summary.csv`): 'finetune', per
    family each objective's score with its 95% interval, best first; 'finetune_lead', which objective leads each family;
    'finetune_control', how many of those intervals hold the demo's random-weight control score."""
    import pandas as pd
    t = pd.read_csv(DIFFUSION/'finetune'/'summary.csv').sort_values(['family', 'score'], ascending=[True, False])
    if what == 'finetune_control':   # how many (objective, family) intervals hold the demo's random-weight control
        from mlmclm.report.render import control_scores, split_control
        control = t.family.map(control_scores(split_control(_demo_results())[1]).set_index('family').score)
        inside = ((t.ci_low <= control) & (control <= t.ci_high)).sum()
        return f'{inside} of {len(t)}'
    if what == 'finetune_lead':
        lead = t.groupby('family').head(1)
        return '; '.join(f"{DIFFUSION_LABELS.get(o, o)} on {', '.join(g.family)}" for o, g in lead.groupby('objective'))
    cell = lambda r: f'{DIFFUSION_LABELS.get(r.objective, r.objective)} {r.score:.1f} [{r.ci_low:.1f}, {r.ci_high:.1f}]'
    return '; '.join(f"{f}: {', '.join(cell(r) for r in g.itertuples())}" for f, g in t.groupby('family', sort=False))


NUMBERS = {'numerics': numerics, 'diffusion': diffusion, 'timing': timing, 'timing_range': timing_range, 'pretrain_loss': pretrain_loss, 'scores_table': scores_table,
           'intermediate_tasks': intermediate_tasks, 'count': count, 'directions': directions_summary}


def fill(text: str) -> str:
    "`text` with every `{{name args}}` replaced by `NUMBERS[name](*args)`; an unknown name is an error naming it."
    def one(m):
        name, args = m.group(1), m.group(2).split()
        if name not in NUMBERS: raise KeyError(f'{{{{{name}}}}} in nbs/index.ipynb: no such number; known: {sorted(NUMBERS)}')
        return NUMBERS[name](*args)
    return PLACEHOLDER.sub(one, text)

# ---------------------------------------------------------------- the site (Sphinx + myst-nb, .ci/sphinx/conf.py)

def write_html(out: Path, nbs: Path = NBS) -> list[str]:
    """Build the site of `nbs` into `out`; returns the builder's warnings (a broken link, anchor or image, a docstring
    it cannot parse), [] when none. Only a build without any replaces `out`, and only a folder Sphinx built."""
    out = Path(out)
    if out.exists() and not any((out/m).exists() for m in ('.buildinfo', '.mlmclm-docs')):   # Sphinx's mark, the old one's
        raise SystemExit(f'{out} exists and was not built by this script; give an empty or new folder')
    out.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f'.{out.name}.', dir=out.parent))   # beside `out`: the swap is a rename
    try:
        run = subprocess.run([sys.executable, '-m', 'sphinx', '-b', 'html', '-E', '-q', '-W', '--keep-going', '-c', CONF,
                              '-d', build/'doctrees', nbs, build/'site'], capture_output=True, text=True)
        problems = [l for l in run.stderr.splitlines() if re.search(r'\b(WARNING|ERROR)\b', l)]
        if run.returncode and not problems: problems = [run.stderr.strip() or f'sphinx exited with {run.returncode}']
        if not problems:
            if out.exists(): shutil.rmtree(out)
            (build/'site').rename(out)
    finally: shutil.rmtree(build)
    return problems


# ---------------------------------------------------------------- the browser check

class Chromium:
    "Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: it reads fd 3, writes fd 4)."
    def __init__(self, exe: str, profile: str):
        to_browser, self._out = os.pipe()
        self._in, from_browser = os.pipe()
        def fds():   # in the child: the pipe ends at the descriptors Chromium expects (via copies above 9: no clash)
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser, from_browser)]
            os.dup2(high[0], 3); os.dup2(high[1], 4)
        self.proc = subprocess.Popen([exe, '--headless', '--no-sandbox', '--disable-gpu', '--remote-debugging-pipe',
                                      '--no-first-run', '--hide-scrollbars', f'--user-data-dir={profile}', 'about:blank'],
                                     preexec_fn=fds, pass_fds=(3, 4),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser); os.close(from_browser)
        self._buffer, self._id, self.events = b'', 0, []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        "Call a DevTools method; returns its result (events that arrive meanwhile are kept in `events`)."
        self._id += 1
        message = {'id': self._id, 'method': method, 'params': params or {}}
        if session: message['sessionId'] = session
        os.write(self._out, json.dumps(message).encode() + b'\0')
        while True:
            reply = self._next(timeout)
            if reply.get('id') == self._id:
                if 'error' in reply: raise RuntimeError(f"{method}: {reply['error']}")
                return reply['result']
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        "The next event `method` (kept events first)."
        for e in self.events:
            if e.get('method') == method: self.events.remove(e); return e
        while True:
            e = self._next(timeout)
            if e.get('method') == method: return e
            self.events.append(e)

    def _next(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b'\0' not in self._buffer:
            if not select.select([self._in], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError(f'Chromium sent nothing for {timeout:.0f} s')
            chunk = os.read(self._in, 1 << 20)
            if not chunk: raise RuntimeError('Chromium closed the DevTools pipe (did it start?)')
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b'\0', 1)
        return json.loads(message)

    def close(self):
        try: self.send('Browser.close', timeout=10)
        except (OSError, RuntimeError, TimeoutError): pass
        try: self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired: self.proc.kill(); self.proc.wait()
        os.close(self._in); os.close(self._out)


PROBE = """(() => ({
  images: document.images.length,
  broken: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => (i.getAttribute('src') || '').slice(0, 80)),
  links: [...document.querySelectorAll('a[href], link[href]')].map(a => a.href.split('#')[0]).filter(h => h.startsWith('file:') && h.endsWith('.html')),
  params: document.querySelectorAll('table.params').length,
  styled: getComputedStyle(document.body).fontFamily !== '' && document.styleSheets.length > 0,
}))()"""


def _visit(browser: Chromium, session: str, url: str) -> dict:
    "Load `url` in the tab, wait for its load event; what PROBE sees, and the resources and scripts that failed."
    browser.events.clear()
    nav = browser.send('Page.navigate', {'url': url}, session)
    if nav.get('errorText'): return dict(error=nav['errorText'])
    browser.wait_for('Page.loadEventFired')
    seen = browser.send('Runtime.evaluate', {'expression': PROBE, 'returnByValue': True}, session)['result']['value']
    seen['failed'] = [f"{e['params'].get('errorText')} ({e['params'].get('type')})" for e in browser.events
                      if e.get('method') == 'Network.loadingFailed']
    seen['exceptions'] = [e['params']['exceptionDetails'].get('text', '') for e in browser.events
                          if e.get('method') == 'Runtime.exceptionThrown']
    return seen


def _screenshot(browser: Chromium, session: str, path: Path, scroll: str = '') -> Path:
    "The tab's viewport as a PNG at `path`, after running the JavaScript `scroll`."
    if scroll: browser.send('Runtime.evaluate', {'expression': scroll}, session); time.sleep(0.3)
    path.write_bytes(base64.b64decode(browser.send('Page.captureScreenshot', {'format': 'png'}, session)['data']))
    return path


def _crawl(browser: Chromium, session: str, site: Path) -> tuple[dict, list[str]]:
    "Every page reachable from the front page, as the browser saw it, and the problems found on the way."
    pages, problems, todo = {}, [], [(site/'index.html').as_uri()]
    while todo:
        url = todo.pop()
        if url in pages: continue
        seen = pages[url] = _visit(browser, session, url)
        name = url.rsplit('/', 1)[-1]
        if 'error' in seen: problems.append(f'{name}: did not load ({seen["error"]})'); continue
        problems += [f'{name}: image did not load: {b}' for b in seen['broken']]
        problems += [f'{name}: failed to load a resource: {f}' for f in seen['failed']]
        problems += [f'{name}: script error: {e}' for e in seen['exceptions']]
        if not seen['styled']: problems.append(f'{name}: no stylesheet applied')
        if re.search(r'/\d\d[a-z]?_\w+\.html$', url) and not seen['params']: problems.append(f'{name}: no parameter table')
        todo += [l for l in seen['links'] if l not in pages]
    problems += [f'{p.relative_to(site)}: not reached from the front page' for p in sorted(site.rglob('*.html'))
                 if p.as_uri() not in pages and '_static' not in p.parts]
    return pages, problems


def browser_check(site: Path, shots: Path) -> int:
    """Open every page reachable from the site's front page in headless Chromium: each must load with its stylesheet,
    its images and resources, without a script error, and the notebook pages must show parameter tables; screenshots
    of the front page, a figure of report/00_figures and a parameter table go to `shots`."""
    exe = next((shutil.which(n) for n in ('chromium', 'chromium-browser', 'google-chrome') if shutil.which(n)), None)
    if exe is None: print('no Chromium found: install it (Debian/Ubuntu: apt-get install chromium)'); return 2
    site, shots = Path(site).resolve(), Path(shots)
    if not (site/'index.html').is_file(): print(f'{site}/index.html is missing: build the site first (docs.py html)'); return 2
    shots.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        browser = Chromium(exe, profile)
        try:
            target = browser.send('Target.createTarget', {'url': 'about:blank'})['targetId']
            session = browser.send('Target.attachToTarget', {'targetId': target, 'flatten': True})['sessionId']
            for domain in ('Page', 'Network', 'Runtime'): browser.send(f'{domain}.enable', session=session)
            browser.send('Emulation.setDeviceMetricsOverride', {'width': 1280, 'height': 1000, 'deviceScaleFactor': 1,
                                                                'mobile': False}, session)
            pages, problems = _crawl(browser, session, site)
            _visit(browser, session, (site/'index.html').as_uri())
            written = [_screenshot(browser, session, shots/'index.png')]
            _visit(browser, session, (site/'report'/'00_figures.html').as_uri())
            written += [_screenshot(browser, session, shots/'figures-figure.png', 'document.images[0].scrollIntoView()'),
                        _screenshot(browser, session, shots/'figures-params.png', "document.querySelector('table.params').scrollIntoView()")]
        finally: browser.close()
    print(f"Chromium opened {len(pages)} pages from {site}/index.html, {sum(p.get('images', 0) for p in pages.values())} "
          f"images, {sum(p.get('params', 0) for p in pages.values())} parameter tables; screenshots: " + ', '.join(map(str, written)))
    for p in problems: print('FAIL:', p)
    return 1 if problems else 0


# ---------------------------------------------------------------- command line

def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ('readme', 'check-readme', 'html', 'browser'):
        print(__doc__); return 2
    if argv[0] == 'readme':
        for path, text in generated_pages().items(): path.write_text(text, encoding='utf-8')
        return 0
    if argv[0] == 'check-readme':
        pages = generated_pages()
        stale = [p for p, text in pages.items() if not p.is_file() or p.read_text(encoding='utf-8') != text]
        for p in stale:
            source = 'nbs/index.ipynb' if p.name == 'README.md' else f'{p.name}.in'
            print(f'FAIL: {p.relative_to(ROOT)} is not what {source} renders to; run `.venv/bin/python .ci/docs.py readme`')
        if not stale: print(f'README.md matches nbs/index.ipynb; {len(pages) - 1} guide page(s) match their templates')
        return 1 if stale else 0
    site = Path(argv[1]) if len(argv) > 1 else ROOT/'_docs'
    if argv[0] == 'browser': return browser_check(site, Path(argv[2]) if len(argv) > 2 else ROOT/'runs'/'docs-check')
    problems = write_html(site)
    for p in problems: print('FAIL:', p)
    print(f'{site}/: {len(list(site.rglob("*.html")))} pages' + (f', not replaced: {len(problems)} problems' if problems
                                                                else f' (open {site}/index.html)'))
    return 1 if problems else 0


if __name__ == '__main__': sys.exit(main(sys.argv[1:]))
