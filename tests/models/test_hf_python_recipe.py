"""The documented Python recipe for a pretrained model (docs/attribution.md "From Python",
docs/own-model.md): examples made with ``subword_examples`` are the model's subwords; words given
instead read as ``<unk>``, and ``prepare_batches`` says how many."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prerequisites import require  # noqa: E402

require(
    importlib.util.find_spec("transformers") is not None,
    "transformers is not installed (pip install -e '.[hf]')",
    module_level=True,
)

from attnstudy.analysis.batch import prepare_batches  # noqa: E402

from attnstudy.data.types import Example  # noqa: E402
from attnstudy.data.vocab import UNK_ID  # noqa: E402
from attnstudy.models.hf import load_pretrained, subword_examples  # noqa: E402
from attnstudy.models.hf_tiny import build_tiny  # noqa: E402

WORDS = tuple("new dog stone".split())


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_pretrained(
        build_tiny(tmp_path_factory.mktemp("hf") / "bpe", tokenizer="bpe", steps=0)
    )


def _notes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "attnstudy"]


def test_words_given_to_a_subword_model_get_a_notice_with_the_count(model, caplog):
    """The review's reproduction: "dog" and "stone" are no tokens of the BPE vocabulary (it
    splits them), so they read as <unk> (id 3) — said once, with the count."""
    ex = Example("mine/0", WORDS, WORDS)
    batch = next(prepare_batches(model, [ex], model.vocab, model.vocab, "reference", 32))
    assert batch.trace.src.tolist() == [[model.vocab.stoi["new"], UNK_ID, UNK_ID]]
    (note,) = _notes(caplog)
    assert note.startswith(
        "2 of 3 source tokens and 2 of 3 target tokens of 1 example(s) are not in the model's "
        "vocabulary and read as <unk> ('dog', 'stone'…)"
    )
    assert "attnstudy.models.hf.subword_examples(model, examples)" in note
    caplog.clear()
    next(prepare_batches(model, [ex], model.vocab, model.vocab, "greedy", 32))
    assert _notes(caplog)[0].startswith("2 of 3 source tokens of 1 example(s)")  # no target read


def test_the_documented_recipe_reads_subwords_without_a_notice(model, caplog):
    from attnstudy.analysis.attribution import attribute

    examples = subword_examples(model, [Example("mine/0", WORDS, WORDS)])
    batch = next(prepare_batches(model, examples, model.vocab, model.vocab, "reference", 32))
    assert _notes(caplog) == []
    subwords = ("new", "d", "##o", "##g", "s", "##t", "##o", "##n", "##e", "<eos>")
    assert batch.examples[0].src == subwords
    assert UNK_ID not in batch.trace.src.tolist()[0]
    t_y = len(examples[0].tgt) + 1  # the reference's subwords and <eos>
    assert batch.trace.attention.shape == (1, model.heads, t_y, 10)  # per step, over the source
    ig = attribute(model, batch, "integrated_gradients", n_steps=4, baseline="zero")
    assert ig.shape == (1, t_y, 10) and torch.isfinite(ig).all()


def test_the_notice_counts_each_side_by_hand(caplog):
    """Source "new dog stone" against a vocabulary of "new", "dog": 1 of 3 unknown; the targets
    ("new", "cat") against one of "new": 1 of 2; nothing unknown: no notice."""
    from attnstudy.analysis.batch import unknown_token_notice

    from attnstudy.data.vocab import Vocab

    src, tgt = Vocab.build([("new", "dog")]), Vocab.build([("new",)])
    examples = [Example("x/0", WORDS, ("new", "cat"))]
    assert unknown_token_notice(examples, src, tgt) == 2
    assert _notes(caplog) == [
        "1 of 3 source tokens and 1 of 2 target tokens of 1 example(s) are not in the model's "
        "vocabulary and read as <unk> ('stone', 'cat'…): a pretrained model reads its "
        "tokenizer's subwords; make the examples with "
        "attnstudy.models.hf.subword_examples(model, examples)"
    ]
    caplog.clear()
    assert unknown_token_notice(examples, Vocab.build([WORDS])) == 0 and _notes(caplog) == []


def test_a_tsv_files_examples_as_ablate_reads_them(model, tmp_path, caplog):
    from attnstudy.study.pretrained import tsv_examples

    tsv = tmp_path / "mine.tsv"
    tsv.write_text("new dog stone\tnew dog stone\t0-0 1-1 2-2\nfire tree\tfire tree\n")
    first, second = tsv_examples(model, tsv)
    assert (first.id, second.id) == ("mine/1", "mine/2")
    assert first.src == ("new", "d", "##o", "##g", "s", "##t", "##o", "##n", "##e", "<eos>")
    assert first.src_words == (0, 1, 1, 1, 2, 2, 2, 2, 2, -1)  # gold links stay between words
    assert second.src == ("fi", "##re", "tree", "<eos>") and second.alignment is None
    next(prepare_batches(model, [first, second], model.vocab, model.vocab, "reference", 32))
    assert _notes(caplog) == []


def test_api_text_examples_are_the_tsv_files_examples(model, tmp_path):
    """``attnstudy.api.text_examples`` (public, for a notebook) makes of texts the examples
    ``tsv_examples`` makes of the same lines in a file: the model's subwords, the links between
    words kept; a row that is no (source, target[, links]) or links past the words say which."""
    from attnstudy import api
    from attnstudy.data.types import DataError

    rows = [("new dog stone", "new dog stone", "0-0 1-1 2-2"), ("cat dog", "cat dog")]
    mine = api.text_examples(model, rows, name="mine")
    tsv = tmp_path / "mine.tsv"
    tsv.write_text(
        "new dog stone\tnew dog stone\t0-0 1-1 2-2\ncat dog\tcat dog\n", encoding="utf-8"
    )
    filed = api.tsv_examples(model, tsv)
    assert [e.id for e in mine] == [e.id for e in filed] == ["mine/1", "mine/2"]
    assert [(e.src, e.tgt, e.alignment) for e in mine] == [
        (e.src, e.tgt, e.alignment) for e in filed
    ]
    assert mine[0].src == ("new", "d", "##o", "##g", "s", "##t", "##o", "##n", "##e", "<eos>")
    assert mine[0].alignment is not None and mine[1].alignment is None
    with pytest.raises(DataError, match=r"mine row 1: expected \(source, target\[, links\]\)"):
        api.text_examples(model, [("new dog",)], name="mine")
    with pytest.raises(DataError, match=r"mine row 1: "):
        api.text_examples(model, [("new dog", "new dog", "0-5")], name="mine")
