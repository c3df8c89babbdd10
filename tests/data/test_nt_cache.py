"""The Greek–English data cached on disk: a cached load equals the parse exactly (same data
digest), every key part gives another file, a damaged file is rebuilt with a note."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from attnstudy.config import data_config
from attnstudy.data import nt
from attnstudy.data.types import splits_digest

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nt"
FILES = nt.NTFiles(
    FIXTURE / "SBLGNT.tsv", FIXTURE / "nt_BSB.tsv", FIXTURE / "SBLGNT-BSB-manual.json"
)


def cfg(**kw):
    return data_config(**{"task": nt.TASK, "nt_min_test_verses": 0, "nt_vocab_size": 120, **kw})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder and no in-process cache of the corpus."""
    monkeypatch.setenv("ATTNSTUDY_CACHE", str(tmp_path / "cache"))
    nt.read_corpus.cache_clear()
    nt.corpus_key.cache_clear()
    yield tmp_path / "cache" / nt.TASK
    nt.read_corpus.cache_clear()
    nt.corpus_key.cache_clear()


def _forbid_parsing(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("parsed although the cache holds the data")

    monkeypatch.setattr(nt, "parse_corpus", boom)
    monkeypatch.setattr(nt, "make_splits", boom)


@pytest.mark.parametrize("kind", ["bpe", "words"])
def test_cached_load_equals_the_parse(cache, monkeypatch, kind):
    c = cfg(nt_tokenization=kind, direction="en-grc" if kind == "words" else "grc-en")
    parsed_corpus, parsed = nt.parse_corpus(FILES), nt.make_splits(FILES, c)
    first = nt.build_splits(FILES, c)  # writes both files
    assert sorted(p.name.split("-")[0] for p in cache.iterdir()) == ["corpus", "splits"]
    nt.read_corpus.cache_clear()
    _forbid_parsing(monkeypatch)
    again = nt.build_splits(FILES, c)
    corpus = nt.read_corpus(FILES)
    assert first == parsed and again == parsed  # every example, field by field
    assert splits_digest(again) == splits_digest(parsed)
    assert corpus == parsed_corpus and corpus.stats["examples"] == 12
    assert next(e for e in again.dev if e.id == "nt/dev/43001002").alignment.sure  # links kept


def test_every_key_part_names_another_file(cache, monkeypatch, tmp_path):
    base = nt.splits_cache_path(FILES, cfg())
    assert base == nt.splits_cache_path(FILES, cfg(split_salt="attnstudy-nt-v1"))  # equal settings
    others = {
        nt.splits_cache_path(FILES, cfg(nt_vocab_size=121)),
        nt.splits_cache_path(FILES, cfg(nt_tokenization="words")),
        nt.splits_cache_path(FILES, cfg(direction="en-grc")),
        nt.splits_cache_path(FILES, cfg(n_test=1)),
    }
    assert base not in others and len(others) == 4
    corpus = nt.corpus_cache_path(FILES)
    edited = tmp_path / "SBLGNT.tsv"  # one byte more in one file
    edited.write_bytes(FILES.source.read_bytes() + b"\n")
    assert nt.corpus_cache_path(nt.NTFiles(edited, FILES.target, FILES.alignment)) != corpus
    for part, value in (("loader_digest", lambda: "0" * 64), ("_installed_version", str)):
        with monkeypatch.context() as m:  # the loader's code, the package's version
            m.setattr(nt, part, value)
            nt.corpus_key.cache_clear()
            assert nt.corpus_cache_path(FILES) != corpus
            assert nt.splits_cache_path(FILES, cfg()) != base
        nt.corpus_key.cache_clear()
    assert nt.corpus_cache_path(FILES) == corpus


@pytest.mark.parametrize(
    "damage",
    [
        b"not gzip",
        gzip.compress(b'{"format": 1, "stats": {}', mtime=0),  # cut JSON
        gzip.compress(json.dumps({"format": 99, "stats": {}}).encode(), mtime=0),  # another layout
        "tokens",  # the right layout with a number where a token belongs
    ],
    ids=["not gzip", "cut JSON", "another layout", "tokens"],  # one id on every xdist worker
)
def test_damaged_cache_is_rebuilt_with_a_note(cache, caplog, damage):
    c = cfg()
    want = nt.make_splits(FILES, c)
    path = nt.splits_cache_path(FILES, c)
    if damage == "tokens":
        nt.build_splits(FILES, c)
        doc = json.loads(gzip.decompress(path.read_bytes()))
        doc["splits"]["test"][0][1][0] = 7
        damage = gzip.compress(json.dumps(doc).encode())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(damage)
    got = nt.build_splits(FILES, c)
    assert got == want
    notes = [r.getMessage() for r in caplog.records if "is unreadable" in r.getMessage()]
    assert len(notes) == 1 and str(path) in notes[0] and notes[0].endswith("; rebuilding it")
    doc = json.loads(gzip.decompress(path.read_bytes()))  # written again, whole
    assert doc["format"] == nt.CACHE_FORMAT and len(doc["splits"]["dev"]) == len(want.dev)


def test_unwritable_cache_folder_still_loads(cache, caplog):
    cache.parent.mkdir(parents=True)
    cache.write_text("a file where the folder belongs")  # not ours: left as it is
    got = nt.build_splits(FILES, cfg())
    assert got == nt.make_splits(FILES, cfg())
    assert cache.read_text() == "a file where the folder belongs"
    assert "cannot be written" in caplog.text


@pytest.mark.slow
def test_full_corpus_cached_keeps_the_digest(cache, monkeypatch):
    """The package's data (about 10 s of parsing): the default settings' digest is the one every
    stored Greek–English model was trained on, parsed and read back from the cache."""
    try:
        files = nt.package_files()
    except nt.DataError:
        pytest.skip("bible-alignments is not installed")
    c = data_config(task=nt.TASK)
    digest = "1180c06251993a92314fad0699bfef281842ef1b10a21978a14903935d0ebf3f"
    assert splits_digest(nt.make_splits(files, c)) == digest
    assert splits_digest(nt.build_splits(files, c)) == digest
    nt.read_corpus.cache_clear()
    _forbid_parsing(monkeypatch)
    assert splits_digest(nt.build_splits(files, c)) == digest


def test_every_data_module_the_loader_imports_is_part_of_the_code_version():
    """The cache key's code version covers every ``attnstudy.data`` module that nt.py imports
    (a module left out could change what is parsed without changing the key: a stale cache);
    ``g2p_align`` gives only the cache folder's location."""
    import ast

    from attnstudy.data import nt

    tree = ast.parse(Path(nt.__file__).read_text(encoding="utf-8"))
    imported = {
        node.module.rsplit(".", 1)[-1] + ".py"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.startswith("attnstudy.data.")
    }
    assert imported - {"g2p_align.py"} <= set(nt.LOADER_MODULES), imported
    assert "nt_groups.py" in imported
