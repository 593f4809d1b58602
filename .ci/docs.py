"""The docs without Quarto: README.md from nbs/index.ipynb, and static HTML of every notebook into _docs/.

Both come from the committed notebooks and their saved outputs (`.ci/outputs.py`): nothing is executed here.

    .venv/bin/python .ci/docs.py readme         # rewrite README.md from nbs/index.ipynb
    .venv/bin/python .ci/docs.py check-readme   # fail if README.md is not what index.ipynb renders to (the test command)
    .venv/bin/python .ci/docs.py html [DIR]     # every notebook (and the protocol) as HTML in DIR (default _docs/)
"""
import html
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT/'nbs'


def readme_text() -> str:
    "README.md as `index.ipynb` renders to Markdown (code fences marked as Python, outputs as indented text)."
    import nbformat
    from nbconvert import MarkdownExporter
    nb = nbformat.read(NBS/'index.ipynb', as_version=4)
    nb.metadata['language_info'] = {'name': 'python'}   # nbdev_clean drops it; the exporter needs it for ```python
    body, _ = MarkdownExporter().from_notebook_node(nb)
    body = re.sub(r'\n{3,}', '\n\n', body).strip() + '\n'
    return body


def write_html(out: Path) -> list[Path]:
    import nbformat
    from nbconvert import HTMLExporter
    out.mkdir(parents=True, exist_ok=True)
    exporter, written = HTMLExporter(), []
    for nb_path in sorted(NBS.glob('*.ipynb')):
        nb = nbformat.read(nb_path, as_version=4)
        nb.metadata['language_info'] = {'name': 'python'}
        body, _ = exporter.from_notebook_node(nb)
        target = out/f'{nb_path.stem}.html'
        target.write_text(body, encoding='utf-8')
        written.append(target)
    for md in sorted(NBS.glob('*.md')):   # prose documents (the protocol) as preformatted pages
        page = f'<html><head><meta charset="utf-8"><title>{md.stem}</title></head><body><pre style="white-space: pre-wrap">' \
               f'{html.escape(md.read_text(encoding="utf-8"))}</pre></body></html>'
        (out/f'{md.stem}.html').write_text(page, encoding='utf-8')
        written.append(out/f'{md.stem}.html')
    links = '\n'.join(f'<li><a href="{p.name}">{p.stem}</a></li>' for p in written)
    (out/'index.html').write_text(f'<html><head><meta charset="utf-8"><title>mlmclm</title></head><body><h1>mlmclm</h1>'
                                  f'<p>The notebooks of mlmclm with their saved outputs.</p><ul>{links}</ul></body></html>',
                                  encoding='utf-8')
    return written


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ('readme', 'check-readme', 'html'):
        print(__doc__); return 2
    if argv[0] == 'readme':
        (ROOT/'README.md').write_text(readme_text(), encoding='utf-8'); return 0
    if argv[0] == 'check-readme':
        if (ROOT/'README.md').read_text(encoding='utf-8') != readme_text():
            print('FAIL: README.md is not what nbs/index.ipynb renders to; run `.venv/bin/python .ci/docs.py readme`')
            return 1
        print('README.md matches nbs/index.ipynb'); return 0
    out = Path(argv[1]) if len(argv) > 1 else ROOT/'_docs'
    written = write_html(out)
    print(f'wrote {len(written)} pages to {out}/ (open {out}/index.html)')
    return 0


if __name__ == '__main__': sys.exit(main(sys.argv[1:]))
