import pytest

from attnstudy.config import data_config
from attnstudy.data.tasks import load_task
from attnstudy.data.tsv import load_tsv, read_tsv
from attnstudy.data.types import DataError, detokenize, tokenize


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


def test_happy_path_with_alignments(tmp_path, caplog):
    train = write(tmp_path, "train.tsv", "das haus\tthe house\t0-0 1-1\nein buch\ta book\r\n")
    dev = write(tmp_path, "dev.tsv", "ja\tyes\t0p0\n")
    test = write(tmp_path, "test.tsv", "nein danke\tno thanks you\t0-0 1-1 1p2")
    cfg = data_config(
        task="tsv",
        train_path=str(train),
        dev_path=str(dev),
        test_path=str(test),
    )  # spaces on both fields: the default
    s = load_task(cfg)
    assert [e.src for e in s.train] == [("das", "haus"), ("ein", "buch")]
    assert s.train[1].tgt == ("a", "book") and s.train[1].alignment is None
    assert s.train[0].alignment.sure == {(0, 0), (1, 1)}
    assert s.dev[0].alignment.sure == frozenset() and s.dev[0].alignment.possible == {(0, 0)}
    assert s.test[0].alignment.possible == {(0, 0), (1, 1), (1, 2)}
    assert s.train[1].id == "tsv/train/2"
    chars = read_tsv(train, "chars", "chars", "train")
    assert chars[0].src == tuple("das haus")
    assert (
        "the source contains spaces, which are tokens under data.source_tokenization = 'chars'"
        in caplog.text
    )


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
    cfg = data_config(
        task="tsv", train_path=str(ok), dev_path=str(ok), test_path=str(tmp_path / "missing.tsv")
    )
    with pytest.raises(DataError, match=r"missing\.tsv: file not found; check data\.test_path"):
        load_task(cfg)


# --- tokenization per field, refused only on certain evidence -----------------------------------


def test_space_separated_pharaoh_data_reads_right_by_default(tmp_path):
    """The old single default (characters) made every space a token: the Pharaoh links then pointed
    at the wrong tokens and the report said AER 1.0 without a word. Spaces are the default now."""
    p = write(tmp_path, "d.tsv", "das haus ist klein\tthe house is small\t0-0 1-1 2-2 3-3\n")
    (ex,) = read_tsv(p)
    assert ex.src == ("das", "haus", "ist", "klein") and ex.tgt == ("the", "house", "is", "small")
    assert ex.alignment.sure == {(0, 0), (1, 1), (2, 2), (3, 3)}


def test_letters_to_phones_per_field(tmp_path):
    p = write(tmp_path, "g2p.tsv", "hello\tHH AH L OW\t0-0 1-1 2-2 3-2 4-3\n")
    (ex,) = read_tsv(p, "chars", "spaces")
    assert (
        ex.src == tuple("hello")
        and ex.tgt == ("HH", "AH", "L", "OW")
        and (4, 3) in ex.alignment.sure
    )


def test_link_on_a_space_character_is_refused_naming_the_setting(tmp_path):
    # written for words: link 3-3 lands on the space of "das haus" read as characters
    p = write(tmp_path, "d.tsv", "das haus\tthe house\t0-0 3-3\n")
    with pytest.raises(DataError) as err:
        read_tsv(p, "chars", "chars")
    msg = str(err.value)
    assert msg.startswith(f"{p}:1: ") and "points at a space of the source" in msg
    assert "set data.source_tokenization = 'spaces'" in msg and "\n" not in msg


def test_doubtful_tokenizations_get_a_hint_not_a_refusal(tmp_path, caplog):
    words = write(tmp_path, "words.tsv", "hello\tHH AH L OW\nworld\tW ER L D\n")
    read_tsv(words)  # spaces: each source is one token
    assert f"{words}:1: every source is a single space-separated token ('hello')" in caplog.text
    assert "set data.source_tokenization = 'chars'" in caplog.text
    caplog.clear()
    spaced = write(tmp_path, "spaced.tsv", "a b\tab\n")
    read_tsv(spaced, "chars", "chars")
    assert f"{spaced}:1: the source contains spaces" in caplog.text and "'spaces'" in caplog.text
    caplog.clear()
    read_tsv(write(tmp_path, "fine.tsv", "a b\tx y\nc\tz\n"))
    assert caplog.text == ""


@pytest.mark.parametrize("special", ["<eos>", "<pad>", "<unk>", "<bos>"])
def test_special_tokens_in_the_data_are_refused_not_merged(tmp_path, special):
    p = write(tmp_path, "s.tsv", f"a b\tx y\nc {special}\tz\n")
    with pytest.raises(DataError) as err:
        read_tsv(p)
    assert str(err.value).startswith(f"{p}:2: the source holds the token '{special}'")
    q = write(tmp_path, "t.tsv", f"a\t{special}\n")
    with pytest.raises(DataError, match=rf"{q}:1: the target holds the token '{special}'"):
        read_tsv(q)
    (ok,) = read_tsv(
        write(tmp_path, "c.tsv", f"{special}\tx\n"), "chars", "chars"
    )  # characters: no clash
    assert ok.src == tuple(special)


def test_vocabulary_refuses_special_tokens():
    from attnstudy.data.vocab import Vocab

    with pytest.raises(ValueError, match="special token"):
        Vocab.build([["a", "<unk>"]])


def test_empty_alignment_fields_are_counted_or_refused(tmp_path, caplog):
    all_empty = write(tmp_path, "e.tsv", "a b\tx y\t\nc\tz\t  \n")
    exs = read_tsv(all_empty)
    assert [e.alignment.possible for e in exs] == [frozenset(), frozenset()]
    assert (
        f"{all_empty}: 2 example(s) have an empty alignment field, read as 'no gold links'"
        in caplog.text
    )
    mixed = write(tmp_path, "m.tsv", "a b\tx y\t0-0\nc\tz\t\n")
    with pytest.raises(
        DataError, match=rf"{mixed}:2: empty alignment field, while 1 other line\(s\) have links"
    ):
        read_tsv(mixed)
    unannotated = write(tmp_path, "u.tsv", "a b\tx y\t0-0\nc\tz\n")  # two fields: no gold alignment
    assert read_tsv(unannotated)[1].alignment is None


def test_byte_order_mark_is_not_part_of_the_first_token(tmp_path):
    p = write(tmp_path, "bom.tsv", b"\xef\xbb\xbfhallo welt\thello world\t0-0 1-1\n")
    (ex,) = read_tsv(p)
    assert ex.src == ("hallo", "welt")


def test_one_based_links_get_a_hint_and_alignment_base_1(tmp_path, caplog):
    p = write(tmp_path, "one.tsv", "a b c\tx y z\t1-1 2-2 3-3\nd e\tu v\t1-2 2-1\n")
    with pytest.raises(DataError) as err:
        read_tsv(p)
    assert "source index 3 is past the source (3 tokens)" in str(err.value)
    assert "look 1-based" in str(err.value) and "data.alignment_base = 1" in str(err.value)
    exs = read_tsv(p, alignment_base=1)
    assert exs[0].alignment.sure == {(0, 0), (1, 1), (2, 2)} and exs[1].alignment.sure == {
        (0, 1),
        (1, 0),
    }
    zero = write(tmp_path, "zero.tsv", "a b\tx y\t0-0 1-1\n")
    with pytest.raises(DataError, match="index 0, but data.alignment_base = 1"):
        read_tsv(zero, alignment_base=1)


def test_examples_over_the_length_bounds_are_filtered_and_counted(tmp_path, caplog):
    long = " ".join(["w"] * 5000)
    p = write(tmp_path, "long.tsv", f"a b\tx y\n{long}\tz\nc\t{long}\n")
    exs = read_tsv(p, max_source_len=1000, max_target_len=1000)
    assert [e.id for e in exs] == ["tsv/data/1"]
    assert f"{p}: left out 2 example(s) longer than data.max_source_len = 1000" in caplog.text
    assert "first: line 2, 5000 source" in caplog.text
    with pytest.raises(DataError, match="no examples left"):
        read_tsv(write(tmp_path, "only.tsv", f"{long}\tz\n"), max_source_len=10)


def test_shipped_tsv_example_loads_from_any_working_directory(tmp_path, monkeypatch):
    """experiments/tsv-example.toml names its data relative to its own folder."""
    from pathlib import Path

    from attnstudy import api
    from attnstudy.experiment import load_experiment

    monkeypatch.chdir(tmp_path)
    exp = Path(__file__).parents[2] / "experiments" / "tsv-example.toml"
    spec = load_experiment(exp).runs()[0]
    splits, src, tgt = api.load_data(spec)
    assert (len(splits.train), len(splits.dev), len(splits.test)) == (800, 100, 100)
    ex = next(e for e in splits.train if e.src == ("three", "hundred", "forty", "nine"))
    assert ex.tgt == ("3", "4", "9")
    assert ex.alignment.sure == {(0, 0), (2, 1), (3, 2)}
    assert ex.alignment.possible == {(0, 0), (1, 0), (2, 1), (3, 2)}  # "hundred" 1p0
    assert all(e.alignment is not None for e in splits.test)


@pytest.mark.parametrize(
    ("char", "name"),
    [
        ("\u00a0", "NO-BREAK SPACE (U+00A0)"),
        ("\u3000", "IDEOGRAPHIC SPACE (U+3000)"),
        ("\r", "the control character '\\r' (U+000D)"),
        ("\x0b", "the control character '\\x0b' (U+000B)"),
    ],
)
def test_whitespace_other_than_an_ascii_space_is_refused_not_split_at(tmp_path, char, name):
    """str.split() split 'a<NBSP>b c' into three tokens, so link 1-1 silently tied 'b' (meant:
    'c') to 'C'; only ASCII spaces separate tokens under 'spaces'."""
    p = write(tmp_path, "ws.tsv", f"x y\tX Y\t0-0 1-1\na{char}b c\tA C\t0-0 1-1\n")
    with pytest.raises(DataError) as err:
        read_tsv(p)
    assert str(err.value) == (
        f"{p}:2: the source holds {name} at character 2; under data.source_tokenization = "
        "'spaces' only ASCII spaces separate tokens: replace it with a space or remove it"
    )
    q = write(tmp_path, "wt.tsv", f"a b\tA{char}C\n")
    with pytest.raises(DataError, match=rf"{q}:1: the target holds .* data.target_tokenization"):
        read_tsv(q)
    (ok,) = read_tsv(write(tmp_path, "c.tsv", f"a{char}b\tA\n"), "chars", "spaces")
    assert ok.src == ("a", char, "b")  # characters: every character is a token, nothing to guess
    (runs,) = read_tsv(write(tmp_path, "r.tsv", "  a   b \tA  C\t0-0 1-1\n"))
    assert runs.src == ("a", "b") and runs.alignment.sure == {(0, 0), (1, 1)}


def test_links_that_never_use_index_0_are_refused_unless_the_base_is_set(tmp_path):
    """1-based links none of which reaches the last token were read 0-based without a word: every
    link shifted by one. No link using index 0 in a whole file is certain under 1-based links."""
    text = "g a e h\tG A E H\t1-1 2-2 3-3\nb c d\tB C D\t1-1 2-2\n"
    p = write(tmp_path, "ones.tsv", text)
    with pytest.raises(DataError) as err:
        read_tsv(p)
    assert str(err.value) == (
        f"{p}:1: not one of the file's 5 alignment links uses index 0 (source or target), as "
        "1-based links would not: set data.alignment_base = 1 if they count from 1, or "
        "data.alignment_base = 0 if they are 0-based and no first token is ever linked"
    )
    one = read_tsv(p, alignment_base=1)
    assert one[0].alignment.sure == {(0, 0), (1, 1), (2, 2)}
    zero = read_tsv(p, alignment_base=0)  # set explicitly: taken as written
    assert zero[0].alignment.sure == {(1, 1), (2, 2), (3, 3)}
    assert read_tsv(write(tmp_path, "z.tsv", "a b\tA B\t1-0\n"))[0].alignment.sure == {(1, 0)}


def test_an_unset_alignment_base_reaches_the_reader_as_unset(tmp_path):
    p = write(tmp_path, "ones.tsv", "a b c\tA B C\t1-1 2-2\n")
    paths = {f"{s}_path": str(p) for s in ("train", "dev", "test")}
    with pytest.raises(DataError, match="uses index 0"):
        load_tsv(data_config(task="tsv", **paths))
    splits = load_tsv(data_config(task="tsv", alignment_base=0, **paths))
    assert splits.test[0].alignment.sure == {(1, 1), (2, 2)}


def test_a_prefix_longer_than_the_file_is_noted(tmp_path, caplog):
    """data.n_train = 100000 on a 2-line file used both lines without a word."""
    p = write(tmp_path, "two.tsv", "a b\tA B\nc\tC\n")
    paths = {f"{s}_path": str(p) for s in ("train", "dev", "test")}
    splits = load_tsv(data_config(task="tsv", n_train=100000, n_dev=1, **paths))
    assert len(splits.train) == 2 and len(splits.dev) == 1
    assert (
        f"{p}: data.n_train = 100000 but the file has 2 example(s); all 2 are used (leave "
        "data.n_train unset for the whole file)"
    ) in caplog.text
    assert "data.n_dev" not in caplog.text and "data.n_test" not in caplog.text


def test_links_written_target_first_are_refused_or_read_with_the_setting(tmp_path):
    """``a b<TAB>x y z<TAB>2-0 0-1`` said only "source index 2 is past the source"; links that fit
    only target-first name the setting, and with it they are read right."""
    p = tmp_path / "rev.tsv"
    p.write_text("a b\tx y z\t2-0 0-1\nc d\tu v w\t1-1 2-0\n", encoding="utf-8")
    with pytest.raises(
        DataError,
        match=r"rev.tsv:1: alignment link 2-0 \(read source-target\) "
        r"is past the source, .* set data.alignment_order = 'target-source'",
    ):
        read_tsv(p, alignment_base=0)
    first, second = read_tsv(p, alignment_base=0, alignment_order="target-source")
    assert first.alignment.sure == {(0, 2), (1, 0)}
    assert second.alignment.sure == {(1, 1), (0, 2)}
    # source-first links read target-first: refused the other way round
    q = tmp_path / "fwd.tsv"
    q.write_text("a b c\tx y\t2-0 0-1\n", encoding="utf-8")
    with pytest.raises(DataError, match="set data.alignment_order = 'source-target'"):
        read_tsv(q, alignment_base=0, alignment_order="target-source")


def test_alignment_order_is_a_tsv_setting_that_keeps_every_key():
    from attnstudy.config import RunSpec

    paths = {"train_path": "a", "dev_path": "b", "test_path": "c"}
    plain = RunSpec(experiment="e", seed=1, data={"task": "tsv", **paths}, model={}, training={})
    same = RunSpec(
        experiment="e",
        seed=1,
        data={"task": "tsv", "alignment_order": "source-target", **paths},
        model={},
        training={},
    )
    other = RunSpec(
        experiment="e",
        seed=1,
        data={"task": "tsv", "alignment_order": "target-source", **paths},
        model={},
        training={},
    )
    assert plain.model_key("d") == same.model_key("d") != other.model_key("d")
