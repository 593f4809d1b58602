"""The HTML docs (`.ci/docs.py html`): `_docs/` is a site that stands on its own. Its front page is the rendered
README, every page has a sidebar to every other, links between notebooks and to the protocol point to their pages,
and every image is copied in; a pure-Python checker finds any link, image or anchor that does not resolve inside it.
The same in headless Chromium: `.ci/docs.py browser` (a slow test here, run where Chromium is installed)."""
import base64
import importlib.util
import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location('docs', ROOT/'.ci'/'docs.py')
docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(docs)

PNG = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==')


def _markdown_of(src: Path) -> list[str]:
    if src.suffix == '.md': return [src.read_text(encoding='utf-8')]
    return [c.source for c in nbformat.read(src, as_version=4).cells if c.cell_type == 'markdown']


def test_every_link_of_the_notebooks_and_the_protocol_resolves_inside_the_site():
    "Source level, for every page of the real docs (fast: Markdown only); the protocol.md links became pages."
    copies, seen = {}, 0
    for src in docs._sources(docs.NBS):
        for text in _markdown_of(src):
            for _, link in docs.LINK.findall(docs.markdown_html(text)):
                new, copy = docs.site_target(link, src, docs.ROOT, docs.NBS)
                assert new is not None, f'{src.name}: {link} points to nothing'
                assert not new.startswith('../') and not new.partition('#')[0].endswith(('.md', '.ipynb')), (src.name, new)
                if copy is not None: copies[new] = copy
                seen += 1
    assert seen > 20 and 'figures/demo/fig2_mlm_vs_clm.png' in copies and 'protocol.html' not in copies
    assert all(f.is_relative_to(docs.ROOT) for f in copies.values())


def _project(root: Path) -> Path:
    "A small project with each kind of link the real one has: protocol.md, ../figures from a notebook, figures/ from index."
    nbs = root/'nbs'
    nbs.mkdir(parents=True)
    (root/'figures'/'demo').mkdir(parents=True)
    (root/'figures'/'demo'/'a.png').write_bytes(PNG)
    nbformat.write(new_notebook(cells=[
        new_markdown_cell('# proj\n\n> A project.\n\n## Quickstart\n\nSee [the protocol](protocol.md), '
                          '[a section](01_x.ipynb#Section-one) and <https://example.org>.\n\n![fig](figures/demo/a.png)'),
    ]), nbs/'index.ipynb')
    code = new_code_cell('#| export\ndef f(): return 1', outputs=[new_output('stream', name='stdout', text='hello <b>\n')])
    nbformat.write(new_notebook(cells=[
        new_markdown_cell('# x\n\n## Section one\n\n![a figure](../figures/demo/a.png) and [home](index.ipynb)'),
        new_code_cell('#| default_exp x'), new_code_cell('#| hide\nSECRET = 1'), code,
        new_code_cell('f()', outputs=[new_output('display_data', data={'image/png': base64.b64encode(PNG).decode(),
                                                                        'text/plain': '<Figure>'})]),
    ]), nbs/'01_x.ipynb')
    (nbs/'protocol.md').write_text('# The protocol\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nBack to [x](01_x.ipynb).\n')
    return nbs


def test_a_built_site_stands_on_its_own(tmp_path):
    nbs = _project(tmp_path/'proj')
    site = tmp_path/'site'
    assert docs.write_html(site, nbs, tmp_path/'proj') == []
    assert sorted(p.name for p in site.glob('*.html')) == ['01_x.html', 'index.html', 'protocol.html']
    index = (site/'index.html').read_text()
    assert '<h1 id="proj">proj' in index                                # the front page is the rendered index
    for page in ('index.html', '01_x.html', 'protocol.html'):           # a sidebar to every page, on every page
        text = (site/page).read_text()
        assert all(f'href="{p}"' in text for p in ('index.html', '01_x.html', 'protocol.html')), page
        assert f'href="{page}" aria-current="page"' in text
    assert 'href="protocol.html"' in index and 'protocol.md' not in index and 'href="01_x.html#Section-one"' in index
    x = (site/'01_x.html').read_text()
    assert 'src="figures/demo/a.png"' in x and 'src="figures/demo/a.png"' in index and '../figures' not in x
    assert (site/'figures'/'demo'/'a.png').read_bytes() == PNG          # copied in: the site can be published alone
    assert 'SECRET' not in x and '#|' not in x and 'def' in x          # hidden cells and directives left out
    assert 'hello &lt;b&gt;' in x and 'src="data:image/png;base64,' in x
    assert '<table>' in (site/'protocol.html').read_text()
    assert docs.write_html(site, nbs, tmp_path/'proj') == []             # a rebuild replaces the previous one
    old = tmp_path/'old'                                                 # a build of the script before this one
    old.mkdir(); (old/'index.html').write_text('<ul><li><a href="index.html">index</a></li></ul>')
    assert docs.write_html(old, nbs, tmp_path/'proj') == [] and (old/'01_x.html').is_file()
    other = tmp_path/'mine'
    other.mkdir(); (other/'notes.txt').write_text('keep')
    with pytest.raises(SystemExit, match='was not built by this script'): docs.write_html(other, nbs, tmp_path/'proj')


def test_a_link_to_nothing_fails_the_build(tmp_path):
    nbs = _project(tmp_path/'proj')
    (nbs/'protocol.md').write_text('# The protocol\n\nSee [gone](gone.md) and ![x](../../outside.png).\n')
    (tmp_path/'outside.png').write_bytes(PNG)                            # exists, but outside the project
    problems = docs.write_html(tmp_path/'site', nbs, tmp_path/'proj')
    assert problems == ['protocol.html: a href="gone.md": no such file in the site',
                        'protocol.html: img src="../../outside.png" leaves the site'], problems


def test_a_failed_build_leaves_the_previous_site_and_no_debris(tmp_path):
    nbs = _project(tmp_path/'proj')
    site = tmp_path/'site'
    assert docs.write_html(site, nbs, tmp_path/'proj') == []
    before = sorted(p.relative_to(site) for p in site.rglob('*'))
    (nbs/'02_bad.ipynb').write_text('{not json')
    with pytest.raises(Exception): docs.write_html(site, nbs, tmp_path/'proj')
    assert sorted(p.relative_to(site) for p in site.rglob('*')) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ['proj', 'site']


def test_the_checker_finds_every_kind_of_broken_reference(tmp_path):
    site = tmp_path/'site'
    site.mkdir()
    page = lambda body: f'<!DOCTYPE html><html><head><link rel="stylesheet" href="style.css"></head><body>{body}</body></html>'
    (site/'index.html').write_text(page('<a href="a.html#top">a</a> <a href="a.html#nope">x</a> <a href="missing.html">m</a>'
                                        '<img src="../up.png" alt="u"> <img src="pic.png"> <a href="https://x.org">web</a>'
                                        '<img alt="inline" src="data:image/png;base64,AAAA">'))
    (site/'a.html').write_text(page('<h1 id="top">a</h1>'))
    (site/'orphan.html').write_text(page('<p>no one links here</p>'))
    (site/'pic.png').write_bytes(PNG)
    problems = docs.check_site(site)
    expected = ['a.html has no id \'nope\'', 'missing.html": no such file', '../up.png" leaves the site',
                'style.css": no such file', 'orphan.html: no link from the front page', 'an image without alt text']
    for e in expected: assert any(e in p for p in problems), (e, problems)
    assert not any('https://x.org' in p or 'data:' in p or 'a.html#top' in p for p in problems), problems


def test_markdown_renders_as_in_the_notebook():
    "Tables whose code holds a pipe (the protocol's `<|mask|>`) stay tables; a <placeholder> in prose shows."
    html = docs.markdown_html('## A b\n\n| a | b |\n|---|---|\n| `<|mask|>` | 2 |\n\nSay `x|y` and "Who says: <line>".')
    assert '<td><code>&lt;|mask|&gt;</code></td>' in html and '<code>x|y</code>' in html
    assert '&lt;line&gt;' in html and '<h2 id="A-b">' in html
    protocol = (docs.NBS/'protocol.md').read_text(encoding='utf-8')
    assert docs.markdown_html(protocol).count('<table>') == len(re.findall(r'^\|(\s*:?-{3,}:?\s*\|)+\s*$', protocol, re.M)) > 0


def test_the_real_site_builds_with_no_problem(tmp_path):
    "Every notebook and the protocol, as `.ci/docs.py html` builds them (about 6 s of CPU)."
    site = tmp_path/'_docs'
    assert docs.write_html(site) == []
    pages = {p.name for p in site.glob('*.html')}
    assert pages == {'index.html', 'protocol.html'} | {f'{p.stem}.html' for p in docs.NBS.glob('*.ipynb') if p.stem != 'index'}
    index = (site/'index.html').read_text()
    assert re.search(r'<h1 id="mlmclm">mlmclm', index) and index.count('<li><a href=') >= len(pages)
    shown = re.findall(r'src="(figures/demo/[^"]+)"', (site/'05_figures.html').read_text())
    assert len(shown) >= 11 and all((site/s).is_file() for s in shown)


def test_the_readme_and_the_figures_notebook_name_the_figures_that_exist():
    numbers = {int(m) for m in re.findall(r'^fig(\d+)_', '\n'.join(p.name for p in (ROOT/'figures'/'demo').glob('fig*.png')), re.M)}
    last = max(numbers)
    assert numbers == set(range(1, last + 1))
    intro = ''.join(json.loads((ROOT/'nbs'/'05_figures.ipynb').read_text())['cells'][0]['source'])
    assert f'Figures 1–{last}' in intro, intro
    readme = (ROOT/'README.md').read_text()
    assert re.findall(r'[Ff]igures? \(?1[–-](\d+)', readme) == [str(last)], re.findall(r'[Ff]igures? \(?1[–-](\d+)', readme)


def test_the_readme_says_where_the_docs_are_and_how_to_check_them():
    readme = (ROOT/'README.md').read_text()
    assert '_docs/index.html' in readme and '.ci/docs.py html' in readme and '.ci/docs.py browser' in readme


@pytest.mark.slow
@pytest.mark.skipif(not any(shutil.which(n) for n in ('chromium', 'chromium-browser', 'google-chrome')),
                    reason='no Chromium (Debian: apt-get install chromium)')
def test_chromium_opens_every_page_and_loads_every_image(tmp_path, capsys):
    site = tmp_path/'_docs'
    assert docs.write_html(site) == []
    assert docs.browser_check(site, tmp_path/'shots') == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert re.search(r'Chromium opened (\d+) pages', out) and int(re.search(r'opened (\d+) pages', out).group(1)) == len(list(site.glob('*.html')))
    assert all((tmp_path/'shots'/n).stat().st_size > 10_000 for n in ('index.png', '05_figures.png', '05_figures-figure.png'))
