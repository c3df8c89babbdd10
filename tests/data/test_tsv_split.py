"""One TSV file split into train/dev/test (``[data] split = {dev = …, test = …}``): sizes,
determinism, no source in two splits, and the refusals (the own-data how-to
needed three pre-split files)."""

import hashlib
import json

import pytest

from attnstudy.config import ConfigError
from attnstudy.config.data import data_config
from attnstudy.data.tsv import load_tsv, read_tsv, split_examples
from attnstudy.data.types import DataError
from attnstudy.experiment import parse_experiment

WORDS = "zero one two three four five six seven eight nine".split()


def _write(path, n_sources, repeats=1):
    """``n_sources`` number words → digits, each source on ``repeats`` lines (targets differ)."""
    lines = []
    for k in range(n_sources):
        src = " ".join(WORDS[int(d)] for d in str(k))
        for r in range(repeats):
            lines.append(f"{src}\t{' '.join(str(k))}{' ' + str(r) if r else ''}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _splits(path, **split):
    return load_tsv(data_config(task="tsv", train_path=str(path), split=split))


def test_split_sizes_ids_and_the_hash_order(tmp_path):
    path = _write(tmp_path / "all.tsv", 200)
    s = _splits(path, dev=0.1, test=0.2, salt="s1")
    assert (len(s.train), len(s.dev), len(s.test)) == (140, 20, 40)
    # the test split is the 40 sources of smallest sha256(salt + source), in file order
    lines = path.read_text(encoding="utf-8").splitlines()

    def digest(line):
        src = line.split("\t")[0].split(" ")
        return hashlib.sha256(("s1" + json.dumps(src)).encode()).digest()

    first = sorted(range(len(lines)), key=lambda i: digest(lines[i]))[:40]
    assert [ex.id for ex in s.test] == [f"tsv/test/{i + 1}" for i in sorted(first)]
    assert all(
        ex.id.startswith(f"tsv/{name}/") for name in ("train", "dev") for ex in getattr(s, name)
    )
    every = sorted(
        int(ex.id.rsplit("/", 1)[1]) for name in ("train", "dev", "test") for ex in getattr(s, name)
    )
    assert every == list(range(1, 201))  # each line once


def test_split_is_deterministic_and_the_salt_changes_it(tmp_path):
    path = _write(tmp_path / "all.tsv", 100)
    a = _splits(path, dev=0.1, test=0.1, salt="s1")
    b = _splits(path, dev=0.1, test=0.1, salt="s1")
    c = _splits(path, dev=0.1, test=0.1, salt="s2")
    assert [ex.id for ex in a.test] == [ex.id for ex in b.test]
    assert [ex.id for ex in a.dev] == [ex.id for ex in b.dev]
    assert [ex.id for ex in a.test] != [ex.id for ex in c.test]


def test_no_source_is_in_two_splits(tmp_path):
    path = _write(tmp_path / "all.tsv", 60, repeats=3)  # each source three times
    s = _splits(path, dev=0.1, test=0.2)
    sources = {name: {ex.src for ex in getattr(s, name)} for name in ("train", "dev", "test")}
    assert not sources["train"] & sources["dev"]
    assert not sources["train"] & sources["test"]
    assert not sources["dev"] & sources["test"]
    # whole groups: 0.2 × 180 = 36 examples are 12 sources, 0.1 × 180 = 18 are 6
    assert (len(s.test), len(s.dev), len(s.train)) == (36, 18, 126)


def test_too_few_sources_is_refused_in_one_line(tmp_path):
    path = _write(tmp_path / "all.tsv", 2, repeats=5)
    with pytest.raises(DataError, match="2 distinct source") as err:
        split_examples(read_tsv(path, split="train"), dev=0.1, test=0.1, salt="x")
    assert "\n" not in str(err.value) and "train empty" in str(err.value)


@pytest.mark.parametrize(
    "data,needle",
    [
        (
            {"split": {"dev": 0.1, "test": 0.1}, "dev_path": "b.tsv"},
            "data.dev_path: data.split splits data.train_path into train, dev and test: give "
            "either data.split or data.dev_path and data.test_path, not both",
        ),
        (
            {"dev_path": "b.tsv"},
            "data.test_path: missing; task 'tsv' needs it, or data.split = {dev = 0.05, "
            "test = 0.1} to split data.train_path",
        ),
        ({"split": {"dev": 0.6, "test": 0.4}}, "data.split: dev (0.6) + test (0.4) leave nothing"),
    ],
)
def test_ambiguous_or_incomplete_settings_are_refused(data, needle):
    raw = {
        "experiment": {"name": "t"},
        "data": {"task": "tsv", "train_path": "a.tsv", **data},
        "models": [{"model": {"attention": "additive"}}],
    }
    with pytest.raises(ConfigError) as err:
        parse_experiment(raw)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_three_files_keep_their_params(tmp_path):
    """``split`` unset is no param and no part of the key (the shipped keys test holds the rest)."""
    raw = {
        "experiment": {"name": "t"},
        "data": {"task": "tsv", "train_path": "a", "dev_path": "b", "test_path": "c"},
        "models": [{"model": {"attention": "additive"}}],
    }
    params, _ = parse_experiment(raw).runs()[0].flat_params()
    assert not any(k.startswith("data.split") for k in params)
    raw["data"] = {"task": "tsv", "train_path": "a", "split": {"dev": 0.1, "test": 0.2}}
    params, _ = parse_experiment(raw).runs()[0].flat_params()
    assert params["data.split.test"] == "0.2" and "data.dev_path" not in params
