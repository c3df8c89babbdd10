import pytest

from attnstudy.config import SyntheticData, data_config
from attnstudy.data.synthetic import symbols, synthetic_example
from attnstudy.data.tasks import TASKS, load_task
from attnstudy.data.types import DataError

SYNTHETIC = ["copy", "reverse", "sort", "bigram_flip"]


def small(task, **kw):
    base = {
        "task": task,
        "n_train": 50,
        "n_dev": 20,
        "n_test": 20,
        "min_len": 3,
        "max_len": 9,
        "vocab_size": 6,
    }
    return data_config(**(base | kw))


@pytest.mark.parametrize("task", SYNTHETIC)
def test_gold_links_join_equal_tokens_and_cover_every_position(task):
    splits = load_task(small(task))
    assert (len(splits.train), len(splits.dev), len(splits.test)) == (50, 20, 20)
    for ex in splits.train + splits.dev + splits.test:
        assert 3 <= len(ex.src) <= 9 and len(ex.tgt) == len(ex.src)
        assert set(ex.src) <= set("abcdef")
        links = ex.alignment.sure
        assert links == ex.alignment.possible
        assert sorted(j for _, j in links) == list(range(len(ex.tgt)))  # one link per target token
        assert sorted(i for i, _ in links) == list(range(len(ex.src)))  # a permutation
        assert all(ex.src[i] == ex.tgt[j] for i, j in links)


def test_hand_examples():
    names = symbols(26)
    ids = [names.index(c) for c in "abcde"]
    assert synthetic_example("copy", ids, names, "x").tgt == tuple("abcde")
    assert synthetic_example("reverse", ids, names, "x").alignment.sure == {
        (4, 0),
        (3, 1),
        (2, 2),
        (1, 3),
        (0, 4),
    }
    flip = synthetic_example("bigram_flip", ids, names, "x")
    assert flip.tgt == tuple("badce")
    assert flip.alignment.sure == {(1, 0), (0, 1), (3, 2), (2, 3), (4, 4)}


def test_sort_is_stable():
    names = symbols(26)
    ids = [names.index(c) for c in "cabab"]
    ex = synthetic_example("sort", ids, names, "x")
    assert ex.tgt == tuple("aabbc")
    # the two a's (source 1, 3) and two b's (source 2, 4) keep their source order
    assert ex.alignment.sure == {(1, 0), (3, 1), (2, 2), (4, 3), (0, 4)}


def test_sort_uses_symbol_order_not_string_order():
    names = symbols(60)  # t0 … t59
    ex = synthetic_example("sort", [10, 2, 1], names, "x")
    assert ex.tgt == ("t1", "t2", "t10")


def test_symbol_names():
    assert symbols(3) == ["a", "b", "c"]
    assert symbols(52)[26:28] == ["A", "B"] and len(symbols(52)) == 52
    assert symbols(53)[:2] == ["t0", "t1"] and symbols(53)[-1] == "t52"


def test_deterministic_seeded_and_splits_differ():
    a, b = load_task(small("copy")), load_task(small("copy"))
    assert a.train == b.train and a.test == b.test
    c = load_task(small("copy", data_seed=1))
    assert [e.src for e in a.train] != [e.src for e in c.train]
    assert [e.src for e in a.dev] != [e.src for e in a.test[: len(a.dev)]]
    # a split does not depend on the size of another
    assert load_task(small("copy", n_train=7)).test == a.test
    # tasks draw different sources
    assert [e.src for e in load_task(small("reverse")).train] != [e.src for e in a.train]


def test_ids_and_default_sizes():
    s = load_task(data_config(task="copy", min_len=1, max_len=2))
    assert (len(s.train), len(s.dev), len(s.test)) == (5000, 500, 500)
    assert s.test[17].id == "copy/test/17"
    assert len({e.id for e in s.train}) == 5000


def test_registry_and_unknown_task():
    assert set(TASKS) == {
        "copy",
        "reverse",
        "sort",
        "bigram_flip",
        "g2p",
        "tsv",
        "dates",
        "nt-greek-english",
    }
    bad = SyntheticData.model_construct(**(SyntheticData().model_dump() | {"task": "nope"}))
    with pytest.raises(DataError, match="unknown task 'nope'"):
        load_task(bad)
