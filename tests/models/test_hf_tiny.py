"""The shipped example's tiny model is one model: :func:`attnstudy.models.hf_tiny.build_tiny` gives
byte-identical files on every build (``tokenizers``' trainer numbered its ``##`` subwords in a
hash map's order, so every build had another tokenizer and other weights)."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prerequisites import require  # noqa: E402

require(
    importlib.util.find_spec("transformers") is not None,
    "transformers is not installed (pip install -e '.[hf]')",
    module_level=True,
)

from attnstudy.models.hf_tiny import (  # noqa: E402
    BPE_VOCAB_SIZE,
    SPECIALS,
    bpe_merges,
    build_tiny,
    copy_pairs,
)


def test_two_builds_give_byte_identical_files(tmp_path):
    first = build_tiny(tmp_path / "a", tokenizer="bpe", steps=2)
    second = build_tiny(tmp_path / "b", tokenizer="bpe", steps=2)
    names = sorted(p.name for p in first.iterdir())
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= set(names)
    assert names == sorted(p.name for p in second.iterdir())
    changed = [n for n in names if (first / n).read_bytes() != (second / n).read_bytes()]
    assert changed == []


def test_bpe_merges_by_hand():
    """ "aab", "ab": pairs (a, ##a), (##a, ##b), (a, ##b) once each; the tie goes to the lowest ids
    (a 3, ##a 5): "aa"; then (aa, ##b) and (a, ##b) once each, the tie to (a 3, ##b 6): "ab"."""
    vocab, merges = bpe_merges(["aab ab"], 9)
    assert merges == [("a", "##a"), ("a", "##b")]
    assert vocab == {"<pad>": 0, "</s>": 1, "<unk>": 2, "a": 3, "b": 4, "##a": 5, "##b": 6} | {
        "aa": 7,
        "ab": 8,
    }
    assert bpe_merges(["aab ab"], 100)[1] == [("a", "##a"), ("a", "##b"), ("aa", "##b")]


def test_bpe_merges_are_the_tokenizers_trainers_in_a_fixed_order():
    """On the example's corpus the merges and the vocabulary's tokens are those of ``tokenizers``'
    ``BpeTrainer``; only the ids differ (sorted characters, then sorted ``##`` characters)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    texts = copy_pairs(400, 0)
    vocab, merges = bpe_merges(texts, BPE_VOCAB_SIZE)
    tok = Tokenizer(models.BPE(unk_token="<unk>", continuing_subword_prefix="##"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE, special_tokens=list(SPECIALS), continuing_subword_prefix="##"
    )
    tok.train_from_iterator(texts, trainer)
    trained = tok.get_vocab()
    assert set(vocab) == set(trained) and len(vocab) == BPE_VOCAB_SIZE
    assert merges == [("##r", "##e"), ("##a", "##r"), ("##re", "##e"), ("f", "##i")] + [
        ("##i", "##n"),
        ("t", "##ree"),
        ("n", "##e"),  # a tie with (##e, ##w), 88 each
        ("ne", "##w"),
    ]
    by_id = sorted(vocab, key=vocab.get)
    assert by_id[3:6] == ["a", "b", "c"] and by_id[23:26] == ["##a", "##d", "##e"]
    assert by_id[40:] == ["##re", "##ar", "##ree", "fi", "##in", "tree", "ne", "new"]
    ours = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", continuing_subword_prefix="##"))
    ours.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    for text in ["new dog stone", "fire tree green", "large river"]:
        assert ours.encode(text).tokens == tok.encode(text).tokens


def test_the_built_tokenizer_splits_words_into_subwords(tmp_path):
    from attnstudy.models.hf import load_pretrained

    model = load_pretrained(build_tiny(tmp_path / "m", tokenizer="bpe", steps=0))
    assert model.source_tokens("new dog stone") == (
        "new",
        "d",
        "##o",
        "##g",
        "s",
        "##t",
        "##o",
        "##n",
        "##e",
        "<eos>",
    )


def test_the_docs_name_the_tokenizer_this_code_builds(tmp_path):
    """docs/own-model.md records the shipped example's tokenizer by its SHA-256; the tokenizer
    does not depend on the fine-tuning (one step sets its padding as 600 do)."""
    docs = (Path(__file__).parents[2] / "docs" / "own-model.md").read_text(encoding="utf-8")
    (recorded,) = re.findall(r"`tokenizer\.json` of\s+SHA-256\s+`([0-9a-f]{64})`", docs)
    folder = build_tiny(tmp_path / "m", tokenizer="bpe", steps=1)
    assert hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest() == recorded
