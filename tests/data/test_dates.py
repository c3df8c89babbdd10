import datetime as dt
import unicodedata

import pytest

from attnstudy.config import data_config
from attnstudy.data.dates import FORMATS, gold_alignment, is_heldout, iso, make_example, render
from attnstudy.data.tasks import load_task
from attnstudy.data.types import DataError

pytest.importorskip("babel")

CFG = data_config(task="dates")
LOCALES = (*CFG.dates_locales, "ar_EG", "fa_IR", "ja_JP", "hi_IN", "sv_SE")
PATTERNS = (*FORMATS, *CFG.dates_skeletons)


def value(text):
    return int("".join(str(unicodedata.decimal(c)) for c in text))


@pytest.mark.parametrize("locale", LOCALES)
def test_calendar_year_around_new_year(locale):
    # 2019-12-30 is in week-year 2020: a 'Y' pattern would say 2020
    d = dt.date(2019, 12, 30)
    for pat in PATTERNS:
        r = render(d, locale, pat)
        y = r.text[slice(*r.span("y"))]
        assert value(y) in (2019, 19), (locale, pat, r.text)
        assert value(r.text[slice(*r.span("d"))]) == 30
        ex = make_example(d, locale, pat, "x")
        assert "".join(ex.tgt) == "2019-12-30"


def test_spans_reconstruct_fields():
    from babel.dates import DateTimeFormat

    d = dt.date(2001, 3, 5)
    for locale in LOCALES:
        fmt = DateTimeFormat(d, locale)
        for pat in PATTERNS:
            r = render(d, locale, pat, native_digits=False)
            for letter, width, start, end in r.fields:
                assert r.text[start:end] == fmt[letter * width]
            assert [f[2] for f in r.fields] == sorted(f[2] for f in r.fields)


def test_arabic_marks_and_digits():
    r = render(dt.date(2019, 12, 30), "ar_EG", "short")
    assert "\u200f" in r.text
    assert r.text == "٣٠\u200f/١٢\u200f/٢٠١٩"
    ex = make_example(dt.date(2019, 12, 30), "ar_EG", "short", "x")
    assert ex.src == tuple(r.text) and "\u200f" in ex.src
    sure = dict((j, i) for i, j in ex.alignment.sure)
    # year digits 8..11, month 4..5, day 0..1; the marks (2, 6) and "/" align to nothing
    assert [sure[j] for j in range(4)] == [8, 9, 10, 11]
    assert [sure[j] for j in (5, 6)] == [4, 5] and [sure[j] for j in (8, 9)] == [0, 1]
    assert not {i for i, _ in ex.alignment.possible} & {2, 3, 6, 7}
    latin = render(dt.date(2019, 12, 30), "ar_EG", "short", native_digits=False)
    assert latin.text == "30\u200f/12\u200f/2019"


def test_alignment_rules():
    # en_US short "M/d/yy": two-digit year leaves the century unlinked; "3" -> "03"
    r = render(dt.date(2019, 3, 5), "en_US", "short")
    assert r.text == "3/5/19"
    al = gold_alignment(r)
    assert not any(j in (0, 1) for _, j in al.possible)  # century digits: no link
    assert (4, 2) in al.sure and (5, 3) in al.sure
    assert (0, 6) in al.sure and (0, 5) in al.possible and (0, 5) not in al.sure
    assert not any(j in (4, 7) for _, j in al.possible)  # the "-" separators
    # month name: possible links only; weekday: no link
    r = render(dt.date(2019, 12, 30), "en_US", "full")
    al = gold_alignment(r)
    name = range(*r.span("M"))
    assert {(i, j) for i in name for j in (5, 6)} <= al.possible
    assert not any(i in name for i, _ in al.sure)
    assert not any(i < 6 for i, _ in al.possible)  # "Monday"


def test_deterministic_and_heldout_only_in_test():
    cfg = data_config(
        task="dates",
        n_train=300,
        n_dev=50,
        n_test=50,
        dates_heldout_locales=("ar_EG",),
        dates_heldout_patterns=("yMEd",),
        dates_n_heldout=40,
    )
    a, b = load_task(cfg), load_task(cfg)
    assert a.train == b.train and a.test == b.test
    for ex in a.train + a.dev + [e for e in a.test if not is_heldout(e.id)]:
        assert "/ar_EG/" not in ex.id and "/yMEd/" not in ex.id
    held = [e for e in a.test if is_heldout(e.id)]
    assert len(held) == 40 and len(a.test) == 90
    assert all("/ar_EG/" in e.id or "/yMEd/" in e.id for e in held)

    # dates never cross splits
    def dates(xs):
        return {"".join(e.tgt) for e in xs}

    assert not dates(a.train) & dates(a.test) and not dates(a.train) & dates(a.dev)
    other = load_task(cfg.model_copy(update={"data_seed": 1}))
    assert other.train != a.train
    for ex in a.train[:50]:
        assert "".join(ex.tgt) == iso(dt.date.fromisoformat("".join(ex.tgt)))
        assert all(i < len(ex.src) and j < len(ex.tgt) for i, j in ex.alignment.possible)


def test_config_errors():
    with pytest.raises(DataError, match="unknown locale"):
        load_task(data_config(task="dates", dates_locales=("xx_YY",), n_train=1))
    with pytest.raises(DataError, match="no d field"):
        load_task(data_config(task="dates", dates_skeletons=("yMMMM",), n_train=1))
    with pytest.raises(DataError, match="dates_heldout_patterns"):
        load_task(data_config(task="dates", dates_heldout_patterns=("nope",), n_train=1))


def test_heldout_metrics_split_the_test_set_by_id():
    from attnstudy.data.dates import is_heldout
    from attnstudy.data.types import Example
    from attnstudy.scoring.metrics import heldout_metrics

    test = [
        Example("dates/test/en_US/yMd/0", ("a",), ("x",)),
        Example("dates/test/en_US/yMd/1", ("b",), ("y",)),
        Example("dates/test/heldout/fr_FR/yMd/0", ("c",), ("z",)),
        Example("dates/test/heldout/fr_FR/yMd/1", ("d",), ("w",)),
    ]
    hyps = [["x"], ["wrong"], ["z"], ["z"]]
    m = heldout_metrics(hyps, test, is_heldout)
    assert m["test_heldin/exact_match"] == 0.5 and m["test_heldin/n"] == 2
    assert m["test_heldout/exact_match"] == 0.5 and m["test_heldout/n"] == 2
    assert heldout_metrics(hyps[:2], test[:2], is_heldout) == {}  # nothing held out: no extra keys
    assert heldout_metrics(hyps, test, None) == {}  # a task without a held-out part
