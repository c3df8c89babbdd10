import re

import pytest

from attnstudy.data.types import Example
from attnstudy.scoring.metrics import edit_distance, evaluate, per_example


def ex(src, *refs):
    refs = tuple(tuple(r.split()) for r in refs)
    return Example(id=src, src=tuple(src), tgt=refs[0], refs=refs if len(refs) > 1 else ())


def test_edit_distance():
    assert edit_distance(["K", "AE", "T"], ["K", "AH", "T", "S"]) == 2
    assert edit_distance([], ["A"]) == 1 and edit_distance("abc", "abc") == 0


def test_multi_reference_per_wer_token_accuracy():
    examples = [
        ex("either", "IY DH ER", "AY DH ER"),  # hyp matches the second reference
        # 1 substitution from either reference (equal length): the first is the closest
        ex("tomato", "T AH M EY T OW", "T AH M AA T OW"),
        ex("cat", "K AE T"),  # 1 deletion
    ]
    hyps = [["AY", "DH", "ER"], ["T", "AH", "M", "AE", "T", "OW"], ["K", "AE"]]
    m = evaluate(hyps, examples)
    assert m["exact_match"] == pytest.approx(1 / 3)
    assert m["wer"] == pytest.approx(2 / 3)
    assert m["per"] == pytest.approx((0 + 1 + 1) / (3 + 6 + 3))
    assert m["token_accuracy"] == pytest.approx((3 + 5 + 2) / (3 + 6 + 3))
    assert m["n"] == 3.0


def test_closest_reference_ties_prefer_shorter():
    # hyp "A B" is at distance 1 from both "A" and "A B C": PER uses the shorter one
    examples = [ex("ab", "A B C", "A")]
    m = evaluate([["A", "B"]], examples)
    assert m["per"] == pytest.approx(1 / 1)
    assert m["token_accuracy"] == pytest.approx(1.0)
    row = per_example([["A", "B"]], examples)[0]
    assert row == {
        "id": "ab",
        "source": "a b",
        "reference": "A",
        "hypothesis": "A B",
        "correct": False,
        "edit_distance": 1,
        "reference_length": 1,  # the closest reference's tokens (Σ distance / Σ length = PER)
    }


def test_closest_reference_beats_first_reference():
    examples = [ex("x", "A A A A", "B C")]
    m = evaluate([["B", "D"]], examples)
    assert m["per"] == pytest.approx(1 / 2)  # not 4/4 against the first reference


def test_length_buckets():
    examples = [ex("ab", "A"), ex("abcdef", "A"), ex("abcdefg", "A"), ex("a" * 12, "A")]
    hyps = [["A"], ["A"], ["B"], ["A"]]
    m = evaluate(hyps, examples, length_buckets=(5, 10))
    assert m["exact_match_len_0_5"] == 1.0
    assert m["exact_match_len_5_10"] == 0.5
    assert m["exact_match_len_10_inf"] == 1.0
    one = evaluate([["A"]], examples[:1], (5, 10))
    assert [k for k in one if k.startswith("exact_match_len")] == ["exact_match_len_0_5"]
    assert all(re.fullmatch(r"[A-Za-z0-9_./-]+", k) for k in m)


def test_errors():
    with pytest.raises(ValueError, match="2 hypotheses for 1 examples"):
        evaluate([["A"], ["B"]], [ex("a", "A")])
    with pytest.raises(ValueError, match="zero examples"):
        evaluate([], [])
