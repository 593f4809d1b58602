"""Issue 49, N11: whatever a checkpoint's records hold is written into its model card as plain text. A run id such as
`base | 610m\\n\\n## Evaluation\\n\\n**GLUE 99.9**` broke the card's table and added a heading with a claimed score to
the card that `mlmclm push` publishes (a run id with control characters is now also refused when the run starts:
tests/pretraining/test_checks_once.py)."""
from huggingface_hub import ModelCard

from mlmclm.model.checkpoints import model_card

HOSTILE = 'base | 610m\n\n## Evaluation\n\n**GLUE 99.9** <script>x</script> [link](http://x)'
META = dict(run_id=HOSTILE, step=2, schedule='clm:1,mlm40:1', tokens_seen=256, seed=0, init_from='runs/a|b/step-1',
            phases=[dict(objective='clm', steps=1), dict(objective='mlm', steps=1, mask_ratio=0.4)])


def _table(card: str) -> list[str]:
    body = card[card.index('## Training'):card.index('## How to load it')]
    return [line for line in body.splitlines() if line.startswith('|')]


def test_n11_a_run_ids_markup_is_plain_text_in_the_card():
    card = model_card(META)
    rows = _table(card)
    assert len(rows) == 2 + 11                                              # the header, its rule, and every row
    assert all(len(r.replace('\\|', '').split('|')) == 4 for r in rows), rows   # two cells each: none broken by a `|`
    prose = card.split('```')[::2]                                          # outside the loading snippets
    assert [line for part in prose for line in part.splitlines() if line.startswith('#')] == [
        '# base \\| 610m \\#\\# Evaluation \\*\\*GLUE 99.9\\*\\* \\<script\\>x\\</script\\> \\[link\\](http://x) at step 2',
        '## Training', '## How to load it']                               # no heading of the run id's
    assert rows[2] == ('| run | base \\| 610m \\#\\# Evaluation \\*\\*GLUE 99.9\\*\\* \\<script\\>x\\</script\\> '
                       '\\[link\\](http://x) |')
    assert '| initialised from | runs/a\\|b/step-1 |' in rows
    assert ModelCard(card).data.pipeline_tag == 'fill-mask'                  # the header still reads


def test_a_plain_run_reads_as_before():
    card = model_card(dict(META, run_id='610m-clm-10k-mlm40-42k', init_from=None))
    assert '# 610m-clm-10k-mlm40-42k at step 2' in card
    assert '| objective schedule | `clm:1,mlm40:1`: clm for 1 steps, then mlm40 for 1 steps |' in card
