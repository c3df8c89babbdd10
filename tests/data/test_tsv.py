import pytest

from attnstudy.config import DataConfig
from attnstudy.data.tasks import DataError, detokenize, load_task, read_tsv, tokenize


def write(tmp_path, name, content: bytes | str):
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return p


def test_tokenize_round_trip():
    assert tokenize(" ab c\n", "chars") == ["a", "b", " ", "c"]
    assert tokenize("  the  cat ", "spaces") == ["the", "cat"]
    assert (
        detokenize(["a", "b"], "chars") == "ab"
        and detokenize(["the", "cat"], "spaces") == "the cat"
    )
    with pytest.raises(DataError, match="unknown tokenization"):
        tokenize("x", "bpe")


def test_happy_path_with_alignments(tmp_path):
    train = write(tmp_path, "train.tsv", "das haus\tthe house\t0-0 1-1\nein buch\ta book\r\n")
    dev = write(tmp_path, "dev.tsv", "ja\tyes\t0p0\n")
    test = write(tmp_path, "test.tsv", "nein danke\tno thanks you\t0-0 1-1 1p2")
    cfg = DataConfig(
        task="tsv",
        train_path=str(train),
        dev_path=str(dev),
        test_path=str(test),
        tokenization="spaces",
    )
    s = load_task(cfg)
    assert [e.src for e in s.train] == [("das", "haus"), ("ein", "buch")]
    assert s.train[1].tgt == ("a", "book") and s.train[1].alignment is None
    assert s.train[0].alignment.sure == {(0, 0), (1, 1)}
    assert s.dev[0].alignment.sure == frozenset() and s.dev[0].alignment.possible == {(0, 0)}
    assert s.test[0].alignment.possible == {(0, 0), (1, 1), (1, 2)}
    assert s.train[1].id == "tsv/train/2"
    chars = load_task(cfg.model_copy(update={"tokenization": "chars", "n_train": 1}))
    assert len(chars.train) == 1 and chars.train[0].src == tuple("das haus")


@pytest.mark.parametrize(
    ("content", "line", "fragment"),
    [
        (b"a\tb\n\xff\xfe\tc\n", 2, "not UTF-8"),
        ("a\tb\n\nc\td\n", 2, "blank line"),
        ("a\tb\nc d\n", 2, "expected 2 or 3 tab-separated fields"),
        ("a\tb\tc\td\n", 1, "got 4"),
        ("a\tb\n \tb\n", 2, "empty source"),
        ("a\tb\nc\t\n", 2, "empty target"),
        ("ab\txy\t0-0 1=1\n", 1, "'1=1' is not"),
        ("ab\txy\t0-0 2-1\n", 1, "source index 2 is past the source (2 tokens)"),
        ("ab\txy\t0-5\n", 1, "target index 5 is past the target"),
        ("ab\txy\t-1-0\n", 1, "negative index"),
    ],
)
def test_errors_name_file_and_line(tmp_path, content, line, fragment):
    p = write(tmp_path, "bad.tsv", content)
    with pytest.raises(DataError) as err:
        read_tsv(p, "chars")
    msg = str(err.value)
    assert msg.startswith(f"{p}:{line}: ") and fragment in msg and "\n" not in msg
    assert ";" in msg  # says what to do


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        read_tsv(tmp_path / "nope.tsv", "chars", "dev")
    with pytest.raises(DataError, match="no examples"):
        read_tsv(write(tmp_path, "empty.tsv", ""), "chars")
    ok = write(tmp_path, "ok.tsv", "a\tb\n")
    cfg = DataConfig(
        task="tsv", train_path=str(ok), dev_path=str(ok), test_path=str(tmp_path / "missing.tsv")
    )
    with pytest.raises(DataError, match=r"missing\.tsv: file not found; check data\.test_path"):
        load_task(cfg)
