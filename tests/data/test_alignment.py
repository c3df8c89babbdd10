import pytest

from attnstudy.data.alignment import Alignment, format_pharaoh, parse_pharaoh


def test_parse_sure_and_possible():
    a = parse_pharaoh("0-0 1-2 2p3")
    assert a.sure == {(0, 0), (1, 2)}
    assert a.possible == {(0, 0), (1, 2), (2, 3)}


def test_format_sorts_by_target_then_source_and_round_trips():
    a = parse_pharaoh("2-1 0p1 1-0 3-2")
    assert format_pharaoh(a) == "1-0 0p1 2-1 3-2"
    assert parse_pharaoh(format_pharaoh(a)) == a


def test_empty_and_sure_implies_possible():
    assert parse_pharaoh("  ") == Alignment(frozenset(), frozenset())
    a = Alignment(sure=frozenset({(0, 1)}), possible=frozenset())
    assert a.possible == {(0, 1)}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("0-0 1x2", "'1x2' is not"),
        ("0-0 1-", "'1-' is not"),
        ("1-2-3", "'1-2-3' is not"),
        ("-1-2", "'-1-2' has a negative index"),
        ("1p-2", "'1p-2' has a negative index"),
        ("0-0 3-1", "'3-1': source index 3 is past the source (3 tokens)"),
        ("0-0 1-2", "'1-2': target index 2 is past the target (2 tokens)"),
    ],
)
def test_errors_name_the_link(text, fragment):
    with pytest.raises(ValueError) as err:
        parse_pharaoh(text, src_len=3, tgt_len=2)
    assert fragment in str(err.value)
