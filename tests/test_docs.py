"""The HTML docs (`.ci/docs.py html`, Sphinx + myst-nb from `.ci/sphinx/conf.py`): `_docs/` is a site that stands on
its own. Its front page is the rendered README, every notebook is a page with its saved outputs and, after it, the API
of the module it exports with nbdev's parameter tables from the docments comments; a link, anchor or image that does
not resolve fails the build. The same site in headless Chromium: `.ci/docs.py browser` (a slow test here, run where
Chromium is installed)."""
import base64
import html
import importlib.util
import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location('docs', ROOT/'.ci'/'docs.py')
docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(docs)

PNG = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==')


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    "The real site, as `.ci/docs.py html` builds it (about 30 s of CPU: torch and every module are imported)."
    out = tmp_path_factory.mktemp('docs')/'_docs'
    assert docs.write_html(out) == []
    return out


def _saved_stream(nb: str) -> str:
    "The first line of the first saved stream output of `nbs/nb.ipynb`."
    cells = nbformat.read(docs.NBS/f'{nb}.ipynb', as_version=4).cells
    return next(o.text for c in cells if c.cell_type == 'code' for o in c.outputs if o.output_type == 'stream').split('\n')[0]


def test_every_notebook_is_a_page_with_its_saved_outputs(site):
    pages = {p.relative_to(site).as_posix() for p in site.rglob('*.html') if '_static' not in p.parts}
    notebooks = {p.relative_to(docs.NBS).with_suffix('.html').as_posix() for p in docs.NBS.rglob('*.ipynb')
                 if '.ipynb_checkpoints' not in p.parts}
    guide = {f'guide/{p.stem}.html' for p in (docs.NBS/'guide').glob('*.md')}
    assert guide and {'index.html', 'protocol.html'} | notebooks | guide <= pages
    index = (site/'index.html').read_text()
    assert '{{' not in index and html.escape(docs.fill('{{timing demo}}')) in index   # the README's numbers, filled
    assert all(f'href="{p}"' in index for p in pages - {'index.html', 'genindex.html', 'search.html'})   # the sidebar
    line = _saved_stream('protocol/02_paper')
    assert html.escape(line, quote=False) in (site/'protocol/02_paper.html').read_text()   # Sphinx leaves quotes as they are
    figures = (site/'report'/'00_figures.html').read_text()
    shown = re.findall(r'<img[^>]* src="\.\./(_images/fig[^"]+)"', figures)   # the demo's figures, copied into the site
    assert len(shown) >= 11 and all((site/s).is_file() for s in shown)
    assert not any('#|' in (site/p).read_text() for p in pages)            # nbdev's directives and hidden cells left out
    assert 'default_exp' not in (site/'base/00_files.html').read_text()


def test_every_notebook_page_ends_with_its_api_and_nbdevs_parameter_tables(site):
    from fastcore.docments import docments
    from mlmclm.pretraining.objectives import clm_labels
    exporting = [nb for nb in docs.NBS.rglob('[0-9]*.ipynb') if '#| default_exp' in nb.read_text(encoding='utf-8')]
    assert len(exporting) >= 50   # every notebook but the ones that export nothing (08_extending)
    for nb in exporting:
        assert 'class="params' in (site/nb.relative_to(docs.NBS).with_suffix('.html')).read_text(), nb.name
    assert 'docs-api' not in (site/'08_extending.html').read_text() and 'API:' not in (site/'08_extending.html').read_text()
    page = (site/'pretraining/00_objectives.html').read_text()
    table = re.search(r'id="mlmclm.pretraining.objectives.clm_labels".*?(<table class="[^"]*params.*?</table>)', page, re.S).group(1)
    cells = [re.sub(r'<[^>]+>|\s+', ' ', c).strip() for c in re.findall(r'<t[hd][^>]*>(.*?)</t[hd]>', table, re.S)]
    assert cells[:4] == ['Parameter', 'Type', 'Default', 'Details']
    assert cells[8:12] == ['document_ids', 'torch.Tensor', '', docments(clm_labels)['document_ids']]   # the docment


def test_the_protocols_tables_render_with_pipes_inside_code(site):
    protocol, text = (site/'protocol.html').read_text(), (docs.NBS/'protocol.md').read_text(encoding='utf-8')
    assert protocol.count('<table') == len(re.findall(r'^\|(\s*:?-{3,}:?\s*\|)+\s*$', text, re.M)) > 0
    assert re.search(r'&lt;\|mask\|&gt;</span></code>[^<]*</p></td>', protocol)   # one cell, not split at its pipes


def _project(root: Path) -> Path:
    "A small project: an index whose links start at the repository's root (it is also README.md), and a protocol."
    nbs = root/'nbs'
    nbs.mkdir(parents=True)
    (root/'figures').mkdir()
    (root/'figures'/'a.png').write_bytes(PNG)
    nbformat.write(new_notebook(cells=[new_markdown_cell('# proj\n\nSee [the protocol](nbs/protocol.md#rules).\n\n'
                                                         '![a figure](figures/a.png)')]), nbs/'index.ipynb')
    (nbs/'protocol.md').write_text('# The protocol\n\n## Rules\n\nBack [home](index.ipynb).\n')
    return nbs


def test_a_broken_link_anchor_or_image_fails_the_build_and_keeps_the_previous_site(tmp_path):
    nbs, site = _project(tmp_path/'proj'), tmp_path/'site'
    assert docs.write_html(site, nbs) == []
    index = (site/'index.html').read_text()
    assert 'href="protocol.html#rules"' in index and (site/'_images'/'a.png').read_bytes() == PNG
    before = sorted(p.relative_to(site) for p in site.rglob('*'))
    (nbs/'protocol.md').write_text('# The protocol\n\nSee [gone](gone.md), [no such heading](index.ipynb#nowhere) '
                                   'and ![x](../missing.png).\n')
    problems = docs.write_html(site, nbs)
    for what in ('gone.md', 'nowhere', 'missing.png'): assert any(what in p for p in problems), (what, problems)
    assert sorted(p.relative_to(site) for p in site.rglob('*')) == before   # not replaced, and no debris beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ['proj', 'site']
    other = tmp_path/'mine'
    other.mkdir(); (other/'notes.txt').write_text('keep')
    with pytest.raises(SystemExit, match='was not built by this script'): docs.write_html(other, nbs)


def test_the_demo_page_and_the_figures_notebook_name_the_figures_that_exist():
    numbers = {int(m) for m in re.findall(r'^fig(\d+)_', '\n'.join(p.name for p in (ROOT/'figures'/'demo').glob('fig*.png')), re.M)}
    last = max(numbers)
    assert numbers == set(range(1, last + 1))
    intro = '\n'.join(''.join(c['source']) for c in json.loads((ROOT/'nbs'/'report'/'00_figures.ipynb').read_text())['cells'][:3])
    assert f'Figures 1–{last}' in intro, intro
    page = (docs.GUIDE/'demo.md').read_text()
    assert re.findall(r'[Ff]igures? \(?1[–-](\d+)', page) == [str(last)], re.findall(r'[Ff]igures? \(?1[–-](\d+)', page)


def test_the_readme_says_where_the_docs_are_and_the_developing_page_how_to_check_them():
    readme = (ROOT/'README.md').read_text()
    assert '_docs/index.html' in readme and '.ci/docs.py html' in readme and '(nbs/guide/developing.md)' in readme
    assert '.ci/docs.py browser' in (docs.GUIDE/'developing.md').read_text()


# ---- issue 44 item 3: a README read in minutes, the rest in guide pages the site builds and the README links

def test_the_readme_is_short_and_links_every_guide_page():
    readme = (ROOT/'README.md').read_text(encoding='utf-8')
    assert len(readme.encode('utf-8')) <= 12 * 1024, len(readme.encode('utf-8'))
    linked = set(re.findall(r'\]\(nbs/guide/([\w-]+)\.md(?:#[\w-]+)?\)', readme))
    assert linked == {p.stem for p in docs.GUIDE.glob('*.md')}, linked
    assert '](nbs/protocol.md)' in readme and readme.count('![') == 1   # one figure
    for heading in ('## Quickstart', '## What the demo shows', '**What it can and cannot show.**', '## What is where'):
        assert heading in readme, heading
    assert 'bash .ci/demo' in readme and 'bash .ci/test' in readme


def test_the_readmes_anchors_into_guide_pages_exist():
    readme = (ROOT/'README.md').read_text(encoding='utf-8')
    for page, anchor in re.findall(r'\]\(nbs/guide/([\w-]+)\.md#([\w-]+)\)', readme):
        headings = re.findall(r'^#+ (.+)$', (docs.GUIDE/f'{page}.md').read_text(encoding='utf-8'), re.M)
        assert anchor in {re.sub(r'[^\w\- ]', '', h).strip().lower().replace(' ', '-') for h in headings}, (page, anchor)


def test_a_page_with_a_number_left_unfilled_fails_the_build(tmp_path):
    "A guide page's numbers are filled by `docs.py readme` from its template; one written into the page itself is refused."
    nbs, site = _project(tmp_path/'proj'), tmp_path/'site'
    (nbs/'protocol.md').write_text('# The protocol\n\n## Rules\n\nThe demo took {{timing demo}}.\n')
    problems = docs.write_html(site, nbs)
    assert any('{{timing demo}} is not filled in' in p and 'protocol.md.in' in p for p in problems), problems


def test_every_guide_template_renders_to_its_page():
    pages = docs.generated_pages()
    templates = sorted(docs.GUIDE.glob('*.md.in'))
    assert templates and all(t.with_suffix('') in pages for t in templates)
    for t in templates:
        page = pages[t.with_suffix('')]
        assert not docs.PLACEHOLDER.search(page) and page.startswith('<!-- Written by `.ci/docs.py readme`'), t.name


@pytest.mark.slow
@pytest.mark.skipif(not any(shutil.which(n) for n in ('chromium', 'chromium-browser', 'google-chrome')),
                    reason='no Chromium (Debian: apt-get install chromium)')
def test_chromium_opens_every_page_and_loads_every_image(site, tmp_path, capsys):
    assert docs.browser_check(site, tmp_path/'shots') == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    opened = int(re.search(r'Chromium opened (\d+) pages', out).group(1))
    assert opened == len([p for p in site.rglob('*.html') if '_static' not in p.parts]) and int(re.search(r'(\d+) parameter tables', out).group(1)) > 100
    assert all((tmp_path/'shots'/n).stat().st_size > 10_000 for n in ('index.png', 'figures-figure.png', 'figures-params.png'))
