"""Sphinx settings of the HTML docs (`.ci/docs.py html`): the notebooks of nbs/ with their saved outputs (myst-nb,
nothing executed), protocol.md, the guide pages of nbs/guide/, and after each notebook the API of the module it exports (autodoc) with nbdev's
parameter table built from the docments comments beside the parameters.

Why Sphinx + myst-nb rather than mkdocs + mkdocs-jupyter: myst-nb parses the notebooks' Markdown cells itself, so a link
from a notebook to another page, a heading or an image is resolved, rewritten and checked by the builder (a broken
one is a warning, and `-W` makes it an error), while mkdocs-jupyter hands the notebook to nbconvert and mkdocs never
sees its links. autodoc imports the module, so fastcore's `docments` can read the comments beside the parameters.
"""
import json
from inspect import Parameter
from itertools import accumulate
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT/'.ci')]
from fastcore.docments import docments   # noqa: E402
from docs import PLACEHOLDER, fill   # noqa: E402  the README's {{...}} numbers, filled on the front page as in README.md
from sphinx.util import logging   # noqa: E402

project, author = 'mlmclm', 'mlmclm developers'
extensions = ['myst_nb', 'sphinx.ext.autodoc']
exclude_patterns = ['configs', '**/.ipynb_checkpoints']
root_doc = 'index'
nb_execution_mode = 'off'                     # the saved outputs are the docs (.ci/outputs.py says which cells keep them)
myst_heading_anchors = 3                      # [text](page.ipynb#a-heading) resolves (and is checked) like a page link
myst_enable_extensions = ['strikethrough']
suppress_warnings = ['myst.strikethrough']    # html is the only builder used
autodoc_member_order = 'bysource'
autodoc_default_options = {'members': True, 'undoc-members': True}
html_theme = 'alabaster'
html_theme_options = {'page_width': '1240px', 'sidebar_width': '260px'}
html_title = 'mlmclm'
# the wings in the order the layers go up (.ci/layers.ini); `package` holds the public face and the command line
WINGS = ['package', 'base', 'protocol', 'data', 'model', 'tasks', 'results', 'pretraining', 'finetuning', 'study', 'report', 'bench']
html_copy_source = html_show_sourcelink = html_domain_indices = False   # the API is on the notebooks' pages
# the guide pages (nbs/guide/<page>.md), first in the sidebar, in the order a newcomer reads them (the README links each)
GUIDE = ['demo', 'running', 'cluster', 'gpu', 'paper-scale', 'checkpoints', 'security', 'measurements', 'developing']
logger = logging.getLogger(__name__)


def _notebook(docname: str, nb: dict, srcdir: Path = ROOT/'nbs') -> dict:
    """A notebook as the site shows it: nbdev's `#| hide` cells and `#|` lines dropped; the front page's numbers
    filled, its links to the repository's files made relative to nbs/, and a table of contents added; any other
    notebook followed by the API of the module it exports."""
    cells, module = [], None
    for cell in nb['cells']:
        src = ''.join(cell['source'])
        if cell['cell_type'] == 'code':
            lines = src.split('\n')
            directives = [l[2:].strip() for l in lines if l.startswith('#|')]
            module = module or next((d.split()[1] for d in directives if d.startswith('default_exp')), None)
            if any(d == 'hide' or d.startswith('default_exp') for d in directives): continue
            src = '\n'.join(l for l in lines if not l.startswith('#|')).strip('\n')
        elif docname == 'index':
            src = re.sub(r'\]\((?!https?:|#)', '](../', fill(src))   # README.md's links start at the repository's root
        cells.append({**cell, 'source': src})
    nb['metadata']['language_info'] = {'name': 'python'}   # nbdev_clean drops it; the highlighter needs it
    if docname == 'index':   # the sidebar: the guide, the notebooks a user launches, then each wing's chapter in reading order
        guide = '\n'.join(f'guide/{p}' for p in GUIDE if (Path(srcdir)/'guide'/f'{p}.md').is_file())
        if guide: cells.append(_markdown('docs-toc-Guide', f'```{{toctree}}\n:hidden:\n:caption: Guide\n\n{guide}\n```'))
        for caption, pattern in [('Launch', '*')] + [(w, f'{w}/*') for w in WINGS if (Path(srcdir)/w).is_dir()]:
            cells.append(_markdown(f'docs-toc-{caption}', f'```{{toctree}}\n:hidden:\n:glob:\n:caption: {caption}\n\n{pattern}\n```'))
    elif module == '__init__':   # the public face documents its own machinery; each public name is documented in its room
        cells.append(_markdown('docs-api', '## API: `mlmclm`\n\n```{eval-rst}\n.. automodule:: mlmclm\n   :members: moved_name\n```'))
    elif module: cells.append(_markdown('docs-api', f'## API: `mlmclm.{module}`\n\n```{{eval-rst}}\n.. automodule:: mlmclm.{module}\n```'))
    # Without a source map myst-nb numbers cell i's lines from (i+1)*10000, and MyST pads an {eval-rst} block with that
    # many blank lines for docutils to read: the API parse alone took 40 s a build. Lines counted through the cells instead.
    nb['metadata']['source_map'] = list(accumulate((''.join(c['source']).count('\n') + 1 for c in cells[:-1]), initial=0))
    return {**nb, 'cells': cells}


def _markdown(id: str, text: str) -> dict: return {'cell_type': 'markdown', 'id': id, 'metadata': {}, 'source': text}


def _pipes_in_code(text: str) -> str:
    "Table rows with `|` inside code (`<|mask|>`): escaped, so that GFM (and MyST) keep it as content, not a border."
    code = lambda m: m.group(0).replace('|', r'\|')
    return '\n'.join(re.sub(r'`[^`\n]+`', code, l) if l.lstrip().startswith('|') else l for l in text.split('\n'))


def source_read(app, docname: str, source: list) -> None:
    path = Path(app.env.doc2path(docname))
    if path.suffix == '.ipynb': source[0] = json.dumps(_notebook(docname, json.loads(source[0]), app.srcdir))
    else:
        left = PLACEHOLDER.search(source[0])   # a page's numbers are filled by `.ci/docs.py readme`, from its template
        if left: logger.warning(f'{left.group(0)} is not filled in: write the page as {path.name}.in and run '
                                f'`.venv/bin/python .ci/docs.py readme`', location=docname)
        source[0] = _pipes_in_code(source[0])


empty = Parameter.empty


def _rest(text: str) -> str:
    "A line of a Markdown docstring in reST: `code` as ``code``, and a bare | as text (reST's |substitution|)."
    parts = re.split(r'(?<!`)`([^`]+)`(?!`)', text)   # text, code, text, code, ...
    return ''.join(f'``{p}``' if i % 2 else p.replace('|', r'\|') for i, p in enumerate(parts))


def parameter_table(app, what: str, name: str, obj, options, lines: list) -> None:
    """A docstring as nbdev shows it: `code` as code (the docstrings are Markdown, autodoc reads reST), then under a
    function's, method's or dataclass's docstring nbdev's parameter table (Type, Default, Details) from the docments
    comments beside its parameters (`x: int, # what x is`), which autodoc alone does not read."""
    lines[:] = [_rest(l) for l in lines]
    if what not in ('function', 'method', 'class'): return
    try: params = docments(obj, full=True, returns=False)
    except (TypeError, ValueError, OSError, SyntaxError): return   # no Python source (a builtin, a C extension type)
    if not params: return
    code = lambda v: f'``{v}``' if v != '' else ''
    lines += ['', '.. list-table::', '   :header-rows: 1', '   :class: params', '',
              '   * - Parameter', '     - Type', '     - Default', '     - Details']
    for param, p in params.items():
        anno = '' if p['anno'] is empty else getattr(p['anno'], '__name__', str(p['anno']).replace('typing.', ''))
        default = '' if p['default'] is empty else repr(p['default'])
        details = _rest(' '.join((p['docment'] or '').split()))
        lines += [f'   * - ``{param}``', f'     - {code(anno)}', f'     - {code(default)}', f'     - {details}']


def setup(app):
    app.connect('source-read', source_read)
    app.connect('autodoc-process-docstring', parameter_table)
