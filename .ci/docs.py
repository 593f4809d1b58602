"""The docs without Quarto: README.md from nbs/index.ipynb, and a static HTML site of every notebook in _docs/.

Both come from the committed notebooks and their saved outputs (`.ci/outputs.py`): nothing is executed here.

    .venv/bin/python .ci/docs.py readme         # rewrite README.md from nbs/index.ipynb
    .venv/bin/python .ci/docs.py check-readme   # fail if README.md is not what index.ipynb renders to (the test command)
    .venv/bin/python .ci/docs.py html [DIR]     # the site in DIR (default _docs/), then `check`: fails on a broken link
    .venv/bin/python .ci/docs.py check [DIR]    # every link, image and anchor of the site resolves inside DIR
    .venv/bin/python .ci/docs.py browser [DIR] [SHOTS]   # the same in headless Chromium, with screenshots in SHOTS
                                                         # (default runs/docs-check/); Debian: apt-get install chromium

The README's measured numbers are not typed in: `index.ipynb` writes `{{name args}}` where one belongs, and both the
README and the site fill it in from the committed demo results (`NUMBERS` below): `results.csv` and `pretrain_loss.csv`
as committed in `figures/demo/`, read from their copy in `tests/data/demo/` (which the tests keep equal to the
committed files, and which no demo run rewrites: a rerun on another CPU changes `figures/demo/`, not the README's
source), and the measured times of `figures/demo/timings.json`. So the README cannot drift from them, and
`check-readme` fails when they change until `docs.py readme` is run.

The site: `index.html` is the rendered `index.ipynb` (the README); every notebook and `protocol.md` is a page; a
sidebar on every page links to all of them. Links between notebooks and to `protocol.md` point to their pages, and
every other file a page links to or shows (the demo's figures) is copied into the site, so DIR can be published or
opened on its own. Cells tagged `#| hide` and nbdev's `#|` directive lines are left out, as nbdev's own docs do.
"""
import base64
import fcntl
import html
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT/'nbs'
MARKER = '.mlmclm-docs'   # marks a folder this script built, which a rebuild may replace
EXTERNAL = re.compile(r'^[a-zA-Z][a-zA-Z0-9+.-]*:')   # http:, https:, mailto:, data:, file:, ...
ANSI = re.compile(r'\x1b\[[0-9;]*m')                    # colours in saved tracebacks and progress output


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


# ---------------------------------------------------------------- numbers from the committed results

DEMO = ROOT/'tests'/'data'/'demo'                 # the committed demo tables (a copy no demo run rewrites)
TIMINGS = ROOT/'figures'/'demo'/'timings.json'     # the measured times of the README's commands
PLACEHOLDER = re.compile(r'\{\{([a-z_]+)((?: [^{}\s]+)*)\}\}')
# the demo's final models in the README's words, in its order (the control first)
DEMO_MODELS = {'tiny-random': '`tiny-random` (control)', 'tiny-clm-42k': 'CLM', 'tiny-mlm40-42k': 'MLM-40',
               'tiny-mlm20-42k': 'MLM-20', 'tiny-clm-10k-mlm40-42k': '25% CLM then MLM-40',
               'tiny-clm-dec42k-mlm40-54k': 'CPT: decayed CLM + MLM-40',
               'tiny-mlm40-dec42k-mlm40-54k': 'CPT: decayed MLM-40 + MLM-40'}


def _demo_results():
    from mlmclm.results import read_results
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
    from mlmclm.figures import control_scores, split_control, study_scores
    from mlmclm.vocab import FAMILIES
    ours, control = split_control(_demo_results())
    scores = {**{(r.checkpoint, r.family): r for r in study_scores(ours).itertuples()},
              **{('tiny-random', r.family): r for r in control_scores(control).itertuples()}}
    cell = lambda r: f'{r.score:.1f} ± {(r.ci_high - r.ci_low) / 2:.1f}'
    rows = [f'| {label} | ' + ' | '.join(cell(scores[(ck, f)]) for f in FAMILIES) + ' |'
            for ck, label in DEMO_MODELS.items() if all((ck, f) in scores for f in FAMILIES)]
    return '\n'.join(['| model | ' + ' | '.join(FAMILIES) + ' |', '|---' * (len(FAMILIES) + 1) + '|'] + rows)


def intermediate_tasks() -> str:
    "The tasks the demo's intermediate checkpoints were fine-tuned on, from `results.csv`: 'two tasks (TC, QA)'."
    from mlmclm.vocab import describe_checkpoint
    res = _demo_results()
    inter = res[[n != 'tiny-random' and describe_checkpoint(n)['intermediate'] for n in res.checkpoint_name]]
    tasks = inter.drop_duplicates('dataset').sort_values('family')
    words = {1: 'one', 2: 'two', 3: 'three', 4: 'four'}
    return (f"{words.get(len(tasks), len(tasks))} task{'s' if len(tasks) != 1 else ''} "
            f"({', '.join(f'{r.family}: `{r.dataset}`' for r in tasks.itertuples())})")


def count(what: str) -> str:
    "How many of `what` `results.csv` holds: 'finetune_runs' (rows), 'checkpoints' (the control's included)."
    res = _demo_results()
    n = len(res) if what == 'finetune_runs' else res.checkpoint_name.nunique()
    return f'{n:,}'


def directions_summary() -> str:
    "The directions table of the demo in words: per comparison, each family's verdict."
    from mlmclm.figures import directions, split_control
    from mlmclm.paper_runs import paper_rows, reported_scores
    from mlmclm.results import protocol_cell, seed_family_scores
    table = directions(seed_family_scores(protocol_cell(paper_rows(split_control(_demo_results())[0]))), reported_scores(), 'tiny')
    return '. '.join(f'{name}: ' + '; '.join(f'{r.family} {r.verdict}' for r in g.itertuples())
                     for name, g in table.groupby('comparison', sort=False))


NUMBERS = {'timing': timing, 'timing_range': timing_range, 'pretrain_loss': pretrain_loss, 'scores_table': scores_table,
           'intermediate_tasks': intermediate_tasks, 'count': count, 'directions': directions_summary}


def fill(text: str) -> str:
    "`text` with every `{{name args}}` replaced by `NUMBERS[name](*args)`; an unknown name is an error naming it."
    def one(m):
        name, args = m.group(1), m.group(2).split()
        if name not in NUMBERS: raise KeyError(f'{{{{{name}}}}} in nbs/index.ipynb: no such number; known: {sorted(NUMBERS)}')
        return NUMBERS[name](*args)
    return PLACEHOLDER.sub(one, text)


# ---------------------------------------------------------------- rendering

def _slug(text: str) -> str:
    "A heading's id, as nbconvert and JupyterLab make them: tags dropped, spaces to '-'."
    text = html.unescape(re.sub(r'<[^>]+>', '', text)).strip()
    return re.sub(r'\s+', '-', re.sub(r'[^\w\s:.,()\-]', '', text)) or 'section'


def markdown_html(text: str, toc: list | None = None) -> str:
    "HTML of Markdown `text`; headings get ids (unique within one `toc`) and ## headings are appended to `toc`."
    import mistune
    toc = [] if toc is None else toc
    class Renderer(mistune.HTMLRenderer):
        def heading(self, text, level, **attrs):
            taken, slug = {s for _, s, _ in toc}, _slug(text)
            slug = next(c for c in [slug] + [f'{slug}-{i}' for i in range(1, len(taken) + 2)] if c not in taken)
            toc.append((level, slug, re.sub(r'<[^>]+>', '', text)))
            return f'<h{level} id="{slug}">{text}<a class="anchor" href="#{slug}">¶</a></h{level}>\n'
    # raw HTML is escaped: the notebooks write none, and a placeholder like <line> in prose must show, not vanish
    render = mistune.create_markdown(escape=True, renderer=Renderer(escape=True), plugins=['table', 'strikethrough', 'url'])
    return render(_shield_pipes(text)).replace(PIPE, '|')


PIPE = '\ue000'   # stands in for a '|' inside code in a table row while the table is parsed


def _shield_pipes(text: str) -> str:
    "Table rows with `|` inside code (`<|mask|>`): the pipe is content, not a cell border (mistune would drop the table)."
    code = lambda m: m.group(0).replace('|', PIPE)
    return '\n'.join(re.sub(r'`[^`\n]+`', code, line) if line.lstrip().startswith('|') else line for line in text.split('\n'))


def _directives(source: str) -> tuple[list[str], str]:
    "(nbdev's `#|` directives of a code cell, its code without them)."
    lines = source.splitlines()
    found = [l[2:].strip() for l in lines if l.startswith('#|')]
    return found, '\n'.join(l for l in lines if not l.startswith('#|')).strip('\n')


def _output_html(out: dict) -> str:
    "One saved output: a stream or error as text, else the richest of image, HTML, Markdown and plain text."
    plain = lambda text: f'<pre class="output">{html.escape(ANSI.sub("", text))}</pre>'
    if out['output_type'] == 'stream': return plain(''.join(out['text']))
    if out['output_type'] == 'error': return plain('\n'.join(out.get('traceback', [])))
    data, meta = out.get('data', {}), out.get('metadata', {})
    join = lambda v: ''.join(v) if isinstance(v, list) else v
    if 'image/png' in data:
        size = meta.get('image/png', {})
        dims = ''.join(f' {k}="{size[k]}"' for k in ('width', 'height') if k in size)
        return f'<img class="output" alt="figure drawn by the cell above" src="data:image/png;base64,{join(data["image/png"]).strip()}"{dims}>'
    if 'text/html' in data: return f'<div class="output">{join(data["text/html"])}</div>'
    if 'text/markdown' in data: return f'<div class="output">{markdown_html(join(data["text/markdown"]))}</div>'
    return plain(join(data.get('text/plain', '')))


def notebook_html(path: Path, toc: list) -> str:
    "The body of a notebook's page: Markdown cells rendered, code highlighted with its saved outputs below."
    import nbformat
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer
    parts = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == 'markdown':
            parts.append(markdown_html(fill(cell.source) if path.stem == 'index' else cell.source, toc)); continue
        if cell.cell_type != 'code': continue
        directives, code = _directives(cell.source)
        if any(d == 'hide' or d.startswith('default_exp') for d in directives): continue
        if code.strip(): parts.append(highlight(code, PythonLexer(), HtmlFormatter(cssclass='highlight')))
        parts += [_output_html(o) for o in cell.get('outputs', [])]
    return '\n'.join(parts)


def _title(path: Path) -> str:
    "The page title of a source: the notebook's or document's first `# ` heading, else its file name."
    if path.suffix == '.md': text = path.read_text(encoding='utf-8')
    else: text = '\n'.join(''.join(c['source']) for c in json.loads(path.read_text(encoding='utf-8'))['cells']
                           if c['cell_type'] == 'markdown')
    m = re.search(r'^# (.+)$', text, re.M)
    return m.group(1).strip() if m else path.stem


def page_name(src: Path) -> str: return f'{src.stem}.html'


def _sources(nbs: Path) -> list[Path]:
    "Every page's source in the sidebar's order: index (the README), the notebooks by number, the documents."
    notebooks = sorted(p for p in nbs.glob('*.ipynb') if p.stem != 'index')
    return [nbs/'index.ipynb'] + notebooks + sorted(nbs.glob('*.md'))


def _nav(sources: list[Path], current: Path, toc: list) -> str:
    items = []
    for src in sources:
        label = 'mlmclm' if src.stem == 'index' else src.stem if src.suffix == '.md' else \
                f'<span class="num">{src.stem.split("_")[0]}</span> {html.escape(_title(src))}'
        here = ' aria-current="page"' if src == current else ''
        items.append(f'<li><a href="{page_name(src)}"{here}>{label}</a>')
        if src == current and toc:
            items.append('<ul class="toc">' + ''.join(f'<li><a href="#{slug}">{text}</a></li>'
                                                      for level, slug, text in toc if level == 2) + '</ul>')
        items.append('</li>')
    return f'<nav class="sidebar"><p class="site">mlmclm docs</p><ul>{"".join(items)}</ul></nav>'


def _page(title: str, nav: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{html.escape(title)} · mlmclm</title><link rel="stylesheet" href="style.css"></head>\n'
            f'<body>{nav}\n<main>\n{body}\n</main></body></html>\n')


# ---------------------------------------------------------------- links

LINK = re.compile(r'(?<=\s)(href|src)="([^"]*)"')


def site_target(link: str, src: Path, root: Path, nbs: Path) -> tuple[str | None, Path | None]:
    """Where a link of the page made from `src` points in the site: (new link, file to copy there or None).
    External links and anchors stay; a notebook or a document of `nbs` becomes its page; any other file under
    `root` is copied to the same relative path in the site. (None, None): it points to nothing that exists."""
    if EXTERNAL.match(link) or link.startswith('#') or not link: return link, None
    path, _, fragment = link.partition('#')
    for base in (src.parent, root):   # relative to the notebook, then to the root (index.ipynb is also README.md)
        target = (base/unquote(path)).resolve()
        if target.is_file() and target.is_relative_to(root.resolve()): break
    else: return None, None
    fragment = f'#{fragment}' if fragment else ''
    if target.parent == nbs.resolve() and target.suffix in ('.ipynb', '.md'): return page_name(target) + fragment, None
    return target.relative_to(root.resolve()).as_posix() + fragment, target


def _rewrite_links(body: str, src: Path, root: Path, nbs: Path, copies: dict) -> str:
    "`body` with its links pointing inside the site, files to copy added to `copies`; a link to nothing stays (`check_site`)."
    def one(m):
        new, copy = site_target(html.unescape(m.group(2)), src, root, nbs)
        if new is None: return m.group(0)
        if copy is not None: copies[new.partition('#')[0]] = copy
        return f'{m.group(1)}="{html.escape(new)}"'
    return LINK.sub(one, body)


def _stylesheet() -> str:
    from pygments.formatters import HtmlFormatter
    return STYLE + HtmlFormatter(style='default').get_style_defs('.highlight') + '\n'


def _build(build: Path, nbs: Path, root: Path) -> None:
    "Every page, the files they link to, the stylesheet and the marker, into the empty folder `build`."
    sources, copies = _sources(nbs), {}
    for src in sources:
        toc = []
        body = markdown_html(src.read_text(encoding='utf-8'), toc) if src.suffix == '.md' else notebook_html(src, toc)
        body = _rewrite_links(body, src, root, nbs, copies)
        title = 'mlmclm' if src.stem == 'index' else _title(src)
        (build/page_name(src)).write_text(_page(title, _nav(sources, src, toc), body), encoding='utf-8')
    for rel, file in copies.items():
        (build/rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(file, build/rel)
    (build/'style.css').write_text(_stylesheet(), encoding='utf-8')
    (build/MARKER).write_text('built by .ci/docs.py html; a rebuild replaces this folder\n', encoding='utf-8')


def write_html(out: Path, nbs: Path = NBS, root: Path = ROOT) -> list[str]:
    "Build the site into `out` (replacing an earlier build); returns its problems (`check_site`)."
    out = Path(out)
    earlier = (out/MARKER).is_file() or all(p.suffix == '.html' for p in out.glob('*')) if out.exists() else True
    if not earlier:   # an earlier build has the marker (or, from before it, only .html files): anything else is kept
        raise SystemExit(f'{out} exists and was not built by this script; give an empty or new folder')
    out.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f'.{out.name}.', dir=out.parent))   # beside `out`: the swap is a rename
    try:
        _build(build, nbs, root)
        build.chmod(0o755)
        if out.exists(): shutil.rmtree(out)
        build.rename(out)
    finally:
        if build.exists(): shutil.rmtree(build)   # a failed build leaves the previous site as it was
    return check_site(out)


# ---------------------------------------------------------------- the checker (pure Python)

class _Refs(HTMLParser):
    "The ids of a page and its references: (tag, attribute, value) of every a/link href and img/script/iframe src."
    def __init__(self):
        super().__init__(); self.ids, self.refs = set(), []
    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get('id'): self.ids.add(attrs['id'])
        for name in ('href', 'src'):
            if name in attrs and (tag, name) in {('a', 'href'), ('link', 'href'), ('img', 'src'), ('script', 'src'),
                                                 ('iframe', 'src'), ('source', 'src')}:
                self.refs.append((tag, name, attrs[name] or ''))


def _parse(page: Path) -> _Refs:
    p = _Refs(); p.feed(page.read_text(encoding='utf-8')); return p


def check_site(site: Path) -> list[str]:
    """Every problem of the site in `site`: a link, image or script that points outside it or to a file it does not
    hold, an anchor its page lacks, a page the front page's links do not reach, an image without alt text."""
    site = Path(site).resolve()
    pages = {p: _parse(p) for p in sorted(site.rglob('*.html'))}
    problems, links = [], {p: set() for p in pages}
    if site/'index.html' not in pages: return [f'{site}: no index.html']
    for page, parsed in pages.items():
        where = page.relative_to(site)
        for tag, attr, value in parsed.refs:
            if tag == 'img' and value.startswith('data:'): continue
            if EXTERNAL.match(value): continue   # the web: a browser check's business, not this one's
            path, _, fragment = value.partition('#')
            target = (page.parent/unquote(path)).resolve() if path else page
            if not target.is_relative_to(site): problems.append(f'{where}: {tag} {attr}="{value}" leaves the site'); continue
            if not target.is_file(): problems.append(f'{where}: {tag} {attr}="{value}": no such file in the site'); continue
            if fragment and target in pages and fragment not in pages[target].ids:
                problems.append(f'{where}: {tag} {attr}="{value}": {target.name} has no id {fragment!r}')
            if tag == 'a' and target in pages: links[page].add(target)
    reached, todo = {site/'index.html'}, [site/'index.html']
    while todo:
        for t in links[todo.pop()] - reached: reached.add(t); todo.append(t)
    problems += [f'{p.relative_to(site)}: no link from the front page reaches it' for p in pages if p not in reached]
    problems += [f'{page.relative_to(site)}: an image without alt text' for page in pages
                 if re.search(r'<img(?![^>]*\balt=)[^>]*>', page.read_text(encoding='utf-8'))]
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
  title: document.title,
  images: document.images.length,
  broken: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => (i.getAttribute('src') || '').slice(0, 80)),
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id),
  sidebar: !!document.querySelector('nav.sidebar a[aria-current=page]'),
  styled: getComputedStyle(document.body).fontFamily !== '' && document.styleSheets.length > 0,
}))()"""


def _visit(browser: Chromium, session: str, url: str) -> dict:
    "Load `url` in the tab, wait for its load event; what PROBE sees, and the resources and scripts that failed."
    browser.events.clear()
    nav = browser.send('Page.navigate', {'url': url}, session)
    if nav.get('errorText'): return dict(error=nav['errorText'])
    browser.wait_for('Page.loadEventFired')
    seen = browser.send('Runtime.evaluate', {'expression': PROBE, 'returnByValue': True}, session)['result']['value']
    failed = [e['params'] for e in browser.events if e.get('method') == 'Network.loadingFailed']
    seen['failed'] = [f"{f.get('errorText')} ({f.get('type')})" for f in failed]
    seen['exceptions'] = [e['params']['exceptionDetails'].get('text', '') for e in browser.events
                          if e.get('method') == 'Runtime.exceptionThrown']
    return seen


def _screenshot(browser: Chromium, session: str, path: Path, scroll: str = '') -> Path:
    "The tab's viewport as a PNG at `path`, after running the JavaScript `scroll`."
    if scroll: browser.send('Runtime.evaluate', {'expression': scroll}, session); time.sleep(0.3)
    shot = browser.send('Page.captureScreenshot', {'format': 'png'}, session)
    path.write_bytes(base64.b64decode(shot['data']))
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
        if not seen['sidebar']: problems.append(f'{name}: no sidebar marking the current page')
        if not seen['styled']: problems.append(f'{name}: no stylesheet applied')
        for link in seen['links']:
            target, _, _ = link.partition('#')
            if target.startswith('file:') and target.endswith('.html') and target not in pages: todo.append(target)
    for url, seen in pages.items():   # anchors, now that every page's ids are known
        for link in seen.get('links', []):
            target, _, fragment = link.partition('#')
            if target.startswith('file:') and fragment and fragment not in pages.get(target, {}).get('ids', [fragment]):
                problems.append(f"{url.rsplit('/', 1)[-1]}: link {link.rsplit('/', 1)[-1]}: no such anchor")
    return pages, problems


def browser_check(site: Path, shots: Path) -> int:
    "Open the site in headless Chromium: every page from the front page on, its images, links and anchors; screenshots."
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
            notebook = site/'05_figures.html'   # a notebook page with code, outputs and the demo's figures
            if notebook.is_file():
                _visit(browser, session, notebook.as_uri())
                written += [_screenshot(browser, session, shots/'05_figures.png'),
                            _screenshot(browser, session, shots/'05_figures-figure.png', 'document.images[0].scrollIntoView()')]
        finally: browser.close()
    html_files = {p.as_uri() for p in site.rglob('*.html')}
    problems += [f'{Path(u).name}: not reached from the front page' for u in sorted(html_files - set(pages))]
    images = sum(p.get('images', 0) for p in pages.values())
    print(f'Chromium opened {len(pages)} pages from {site}/index.html, {images} images; screenshots: '
          + ', '.join(map(str, written)))
    for p in problems: print('FAIL:', p)
    return 1 if problems else 0


# ---------------------------------------------------------------- command line

def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ('readme', 'check-readme', 'html', 'check', 'browser'):
        print(__doc__); return 2
    if argv[0] == 'readme':
        (ROOT/'README.md').write_text(readme_text(), encoding='utf-8'); return 0
    if argv[0] == 'check-readme':
        if (ROOT/'README.md').read_text(encoding='utf-8') != readme_text():
            print('FAIL: README.md is not what nbs/index.ipynb renders to; run `.venv/bin/python .ci/docs.py readme`')
            return 1
        print('README.md matches nbs/index.ipynb'); return 0
    site = Path(argv[1]) if len(argv) > 1 else ROOT/'_docs'
    if argv[0] == 'browser': return browser_check(site, Path(argv[2]) if len(argv) > 2 else ROOT/'runs'/'docs-check')
    problems = write_html(site) if argv[0] == 'html' else check_site(site)
    for p in problems: print('FAIL:', p)
    pages = len(list(site.glob('*.html')))
    print(f'{site}/: {pages} pages, {len(problems)} problems' + ('' if problems else f' (open {site}/index.html)'))
    return 1 if problems else 0


STYLE = """
:root { --text: #1f2328; --muted: #59636e; --line: #d1d9e0; --code: #f6f8fa; --accent: #0969da; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--text); font: 16px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
nav.sidebar { position: fixed; top: 0; bottom: 0; left: 0; width: 250px; overflow-y: auto; padding: 16px 12px;
  border-right: 1px solid var(--line); background: #fafbfc; font-size: 14px; }
nav.sidebar .site { font-weight: 700; margin: 0 0 8px 6px; }
nav.sidebar ul { list-style: none; margin: 0; padding: 0; }
nav.sidebar a { display: block; padding: 3px 6px; border-radius: 4px; color: var(--text); text-decoration: none; }
nav.sidebar a:hover { background: #eef1f4; }
nav.sidebar a[aria-current=page] { background: #ddf4ff; font-weight: 600; }
nav.sidebar .num { color: var(--muted); font-family: ui-monospace, monospace; font-size: 12px; }
nav.sidebar ul.toc { margin: 2px 0 6px 14px; font-size: 13px; }
nav.sidebar ul.toc a { color: var(--muted); }
main { margin-left: 250px; padding: 24px 40px 80px; max-width: 1100px; }
h1, h2, h3 { line-height: 1.25; } h2 { border-bottom: 1px solid var(--line); padding-bottom: 4px; margin-top: 36px; }
a { color: var(--accent); } a.anchor { margin-left: 6px; font-size: 0.8em; color: var(--line); text-decoration: none; }
h1:hover a.anchor, h2:hover a.anchor, h3:hover a.anchor { color: var(--muted); }
code { font: 0.88em ui-monospace, SFMono-Regular, Menlo, monospace; background: var(--code); padding: 1px 4px; border-radius: 4px; }
pre code { padding: 0; background: none; }
.highlight, pre { background: var(--code); border-radius: 6px; overflow-x: auto; }
.highlight pre, pre { margin: 10px 0; padding: 10px 14px; font: 13px/1.45 ui-monospace, SFMono-Regular, Menlo, monospace; }
pre.output { background: #fff; border-left: 3px solid var(--line); border-radius: 0; }
div.output { overflow-x: auto; margin: 10px 0; }
img { max-width: 100%; height: auto; }
table { border-collapse: collapse; margin: 12px 0; font-size: 14px; display: block; overflow-x: auto; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--code); }
blockquote { margin: 12px 0; padding: 0 14px; color: var(--muted); border-left: 4px solid var(--line); }
@media (max-width: 800px) { nav.sidebar { position: static; width: auto; border-right: none; } main { margin-left: 0; padding: 16px; } }
"""


if __name__ == '__main__': sys.exit(main(sys.argv[1:]))
