"""The ``dates`` task: human-written dates in many locales → ISO 8601 ``YYYY-MM-DD``.

Each source is one date rendered with the CLDR data that ``babel`` ships, in one locale's own
formats (``short``, ``medium``, ``long``, ``full``) or through a skeleton (``yMMMd`` …, matched
with :func:`babel.dates.match_skeleton` as :func:`babel.dates.format_skeleton` does). The
pattern is walked field by field (:func:`babel.dates.tokenize_pattern`), so the character span
of every field in the rendered string is known, and the gold alignment is exact:

* every ISO character links to the source characters of its field (year digits to the year,
  month digits to the month number or name, day digits to the day); ``-`` links to nothing;
* a numeric source field is aligned digit by digit, right-aligned (``5`` → the ``5`` of ``05``,
  ``19`` → the ``19`` of ``2019``): those links are sure; the other links of the field
  (the padding ``0`` of ``05``, every link of a month name) are possible only;
* the century digits of a two-digit year have no link at all; the weekday and any other
  field (era …) align to nothing: they are distractors.

The week-based year ``Y`` is replaced by the calendar year ``y`` (``Y`` gives the wrong year
around New Year: 2019-12-30 is in week-year 2020). Babel does not apply a locale's own digits
to dates; with ``dates_native_digits`` the digits of numeric fields are transliterated to the
locale's default numbering system (CLDR, as ICU does: ``٣٠‏/١٢‏/٢٠١٩`` in ``ar_EG``). Direction
marks (U+200F in Arabic short formats) and every other character are kept as tokens.

Dates are split by a salted hash of the date (10 % test, 10 % dev, the rest train), so a
test date never occurs in training in any format. Held-out locales and patterns appear only
in test, with ids ``dates/test/heldout/<locale>/<pattern>/<k>``; the other ids are
``dates/<split>/<locale>/<pattern>/<k>``.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import random
from dataclasses import dataclass

from attnstudy.config import DataConfig
from attnstudy.data.alignment import Alignment
from attnstudy.data.types import DEFAULT_SIZES, SPLITS, DataError, Example, Splits, seeded_rng

FORMATS = ("short", "medium", "long", "full")
_SALT = "attnstudy-dates-v1"
_YEAR, _MONTH, _DAY = "y", "M", "d"
# pattern letter -> ISO field; every other letter (E, c, e, G, …) is a distractor
_FIELD_OF = {"y": _YEAR, "Y": _YEAR, "u": _YEAR, "r": _YEAR, "M": _MONTH, "L": _MONTH, "d": _DAY}
# ISO target positions of each field in "YYYY-MM-DD"
_ISO_POS = {_YEAR: range(0, 4), _MONTH: range(5, 7), _DAY: range(8, 10)}
# code point of digit zero of CLDR numbering systems with contiguous decimal digits
_ZERO = {
    "arab": 0x0660,
    "arabext": 0x06F0,
    "beng": 0x09E6,
    "deva": 0x0966,
    "gujr": 0x0AE6,
    "guru": 0x0A66,
    "knda": 0x0CE6,
    "khmr": 0x17E0,
    "laoo": 0x0ED0,
    "mlym": 0x0D66,
    "mymr": 0x1040,
    "orya": 0x0B66,
    "tamldec": 0x0BE6,
    "telu": 0x0C66,
    "thai": 0x0E50,
    "tibt": 0x0F20,
    "fullwide": 0xFF10,
    "nkoo": 0x07C0,
    "olck": 0x1C50,
    "limb": 0x1946,
    "adlm": 0x1E950,
    "hmnp": 0x1E140,
    "cakm": 0x11136,
    "mtei": 0xABF0,
}


class DatesError(ValueError):
    """A configuration problem of the dates task (unknown locale, bad skeleton, bad range)."""


@dataclass(frozen=True)
class Rendered:
    """One rendered date: the text and the span ``[start, end)`` of every field in it.

    Attributes:
        text: the date as the locale writes it.
        fields: ``(letter, width, start, end)`` per pattern field, in text order; ``letter``
            is the pattern letter after ``Y`` → ``y``.
    """

    text: str
    fields: tuple[tuple[str, int, int, int], ...]

    def span(self, iso_field: str) -> tuple[int, int] | None:
        """The span of the (first) field of ``iso_field`` (``"y"``, ``"M"``, ``"d"``)."""
        for letter, _, start, end in self.fields:
            if _FIELD_OF.get(letter) == iso_field:
                return start, end
        return None


def _babel():
    try:
        import babel.dates
        from babel import Locale, UnknownLocaleError
    except ImportError:
        raise DatesError(
            "task 'dates' needs the 'babel' package; run: pip install babel==2.18.0"
        ) from None
    return babel.dates, Locale, UnknownLocaleError


@functools.lru_cache(maxsize=256)
def _locale(name: str):
    _, Locale, UnknownLocaleError = _babel()
    try:
        return Locale.parse(name)
    except (UnknownLocaleError, ValueError) as err:
        raise DatesError(f"unknown locale {name!r} in data.dates_*locales ({err})") from None


@functools.lru_cache(maxsize=4096)
def pattern_tokens(locale: str, pattern_name: str) -> tuple[tuple[str, object], ...]:
    """The tokenized CLDR pattern of a named format or a skeleton, with ``Y`` → ``y``.

    Args:
        locale: e.g. ``"de_DE"``.
        pattern_name: ``short``/``medium``/``long``/``full`` or a skeleton such as ``yMMMd``.

    Raises:
        DatesError: for an unknown locale, a skeleton without a match, or a pattern that
            lacks a year, a month or a day.
    """
    bd, _, _ = _babel()
    loc = _locale(locale)
    if pattern_name in FORMATS:
        pattern = loc.date_formats[pattern_name].pattern
    else:
        key = bd.match_skeleton(pattern_name, loc.datetime_skeletons)
        if key is None:
            raise DatesError(f"skeleton {pattern_name!r} has no match in locale {locale!r}")
        pattern = loc.datetime_skeletons[key].pattern
    tokens = []
    for kind, value in bd.tokenize_pattern(pattern):
        if kind == "field" and value[0] == "Y":  # week-based year -> calendar year
            value = ("y", value[1])
        tokens.append((kind, value))
    have = {_FIELD_OF.get(v[0]) for k, v in tokens if k == "field"}
    missing = [f for f in (_YEAR, _MONTH, _DAY) if f not in have]
    if missing:
        raise DatesError(
            f"pattern {pattern_name!r} of locale {locale!r} ({pattern!r}) has no "
            f"{'/'.join(missing)} field; pick a skeleton with y, M and d (e.g. 'yMMMd')"
        )
    return tuple(tokens)


def _digits(locale: str) -> int | None:
    """Code point of the digit zero of the locale's default numbering system (None = Latin)."""
    return _ZERO.get(_locale(locale).default_numbering_system)


def render(date: dt.date, locale: str, pattern_name: str, native_digits: bool = True) -> Rendered:
    """Render ``date`` field by field and record each field's span.

    Args:
        date: the date.
        locale: a CLDR locale known to babel.
        pattern_name: a format name or a skeleton (see :func:`pattern_tokens`).
        native_digits: write numeric fields in the locale's default digits.

    Raises:
        DatesError: as :func:`pattern_tokens`.
    """
    bd, _, _ = _babel()
    fmt = bd.DateTimeFormat(date, _locale(locale))
    zero = _digits(locale) if native_digits else None
    parts: list[str] = []
    fields = []
    pos = 0
    for kind, value in pattern_tokens(locale, pattern_name):
        if kind == "chars":
            piece = value
        else:
            letter, width = value
            piece = fmt[letter * width]
            if zero is not None and piece.isascii() and piece.isdigit():
                piece = "".join(chr(zero + int(c)) for c in piece)
            fields.append((letter, width, pos, pos + len(piece)))
        parts.append(piece)
        pos += len(piece)
    return Rendered("".join(parts), tuple(fields))


def iso(date: dt.date) -> str:
    """``YYYY-MM-DD``."""
    return f"{date.year:04d}-{date.month:02d}-{date.day:02d}"


def gold_alignment(rendered: Rendered) -> Alignment:
    """Links between the source characters and the ``YYYY-MM-DD`` target (module docstring)."""
    sure: set[tuple[int, int]] = set()
    possible: set[tuple[int, int]] = set()
    for iso_field, targets in _ISO_POS.items():
        span = rendered.span(iso_field)
        assert span is not None
        start, end = span
        text = rendered.text[start:end]
        if text.isdecimal():
            # right-aligned digit links; a two-digit year leaves the century unlinked
            width = len(targets)
            for k in range(len(text)):
                j = targets[0] + width - len(text) + k
                if j >= targets[0]:
                    sure.add((start + k, j))
            padded = len(text) < width and iso_field != _YEAR
            for j in targets[: width - len(text)] if padded else ():
                possible.update((i, j) for i in range(start, end))
            # the rest of the field is a possible link for every linked target character
            linked = {j for _, j in sure if j in targets}
            for j in linked:
                possible.update((i, j) for i in range(start, end))
        else:
            possible.update((i, j) for i in range(start, end) for j in targets)
    return Alignment(sure=frozenset(sure), possible=frozenset(possible | sure))


def make_example(
    date: dt.date, locale: str, pattern_name: str, id: str, native_digits: bool = True
):
    """The :class:`~attnstudy.data.types.Example` of one date in one locale and pattern."""
    r = render(date, locale, pattern_name, native_digits)
    return Example(id=id, src=tuple(r.text), tgt=tuple(iso(date)), alignment=gold_alignment(r))


def _parse_day(text: str, key: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise DatesError(f"data.{key} = {text!r} is not a date; write YYYY-MM-DD") from None


def _bucket(ordinal: int, salt: str) -> str:
    h = hashlib.sha256(f"{salt}/{ordinal}".encode()).digest()[0] % 10
    return "test" if h == 0 else "dev" if h == 1 else "train"


@functools.lru_cache(maxsize=8)
def _pools(start: int, end: int, salt: str) -> dict[str, tuple[int, ...]]:
    pools: dict[str, list[int]] = {s: [] for s in SPLITS}
    for o in range(start, end + 1):
        pools[_bucket(o, salt)].append(o)
    return {s: tuple(v) for s, v in pools.items()}


def combos(cfg: DataConfig) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(seen, held-out) ``(locale, pattern)`` pairs; every pattern is validated.

    Locales are ``dates_locales`` plus any held-out locale not listed there; a pair is held
    out if its locale is in ``dates_heldout_locales`` or its pattern in ``dates_heldout_patterns``.

    Raises:
        DatesError: for an unknown locale, a held-out pattern that is not a configured
            format or skeleton, or a pattern without year, month or day.
    """
    locales = list(dict.fromkeys([*cfg.dates_locales, *cfg.dates_heldout_locales]))
    patterns = list(dict.fromkeys([*cfg.dates_formats, *cfg.dates_skeletons]))
    unknown = [p for p in cfg.dates_heldout_patterns if p not in patterns]
    if unknown:
        raise DatesError(
            f"data.dates_heldout_patterns {unknown} are not in data.dates_formats or "
            f"data.dates_skeletons ({', '.join(patterns)})"
        )
    seen, held = [], []
    for loc in locales:
        for pat in patterns:
            pattern_tokens(loc, pat)  # validates
            out = (
                held
                if (loc in cfg.dates_heldout_locales or pat in cfg.dates_heldout_patterns)
                else seen
            )
            out.append((loc, pat))
    if not seen:
        raise DatesError("every (locale, pattern) pair is held out; nothing is left to train on")
    return seen, held


def load_dates(cfg: DataConfig):
    """Train/dev/test examples of the ``dates`` task (module docstring).

    Each split draws ``n_<split>`` examples (default 5000/500/500): a (locale, pattern)
    pair uniformly from the seen pairs and a date uniformly from the split's dates, seeded
    by ``(data_seed, split)``. Test then gets ``dates_n_heldout`` (default ``n_test``)
    examples from the held-out pairs, if any.

    Raises:
        DataError: for a configuration problem (unknown locale, bad skeleton, bad range).
    """
    try:
        start = _parse_day(cfg.dates_start, "dates_start").toordinal()
        end = _parse_day(cfg.dates_end, "dates_end").toordinal()
        if start > end:
            raise DatesError(
                f"data.dates_start ({cfg.dates_start}) is after data.dates_end ({cfg.dates_end})"
            )
        pools = _pools(start, end, _SALT)
        empty = [s for s in SPLITS if not pools[s]]
        if empty:
            raise DatesError(
                f"the range {cfg.dates_start}…{cfg.dates_end} leaves no dates for {empty}; "
                f"widen data.dates_start/dates_end (≥ a few weeks)"
            )
        seen, held = combos(cfg)
        out: dict[str, list] = {}
        for split in SPLITS:
            n = getattr(cfg, f"n_{split}") or DEFAULT_SIZES[split]
            groups = [(f"dates/{split}", seen, n)]
            if split == "test" and held:
                groups.append(("dates/test/heldout", held, cfg.dates_n_heldout or n))
            examples = []
            for prefix, pairs, count in groups:
                rng: random.Random = seeded_rng(cfg.data_seed, prefix)
                for k in range(count):
                    loc, pat = pairs[rng.randrange(len(pairs))]
                    date = dt.date.fromordinal(pools[split][rng.randrange(len(pools[split]))])
                    examples.append(
                        make_example(
                            date, loc, pat, f"{prefix}/{loc}/{pat}/{k}", cfg.dates_native_digits
                        )
                    )
            out[split] = examples
        return Splits(**out)
    except DatesError as err:
        raise DataError(str(err)) from None


def is_heldout(example_id: str) -> bool:
    """Whether an example id is from the held-out (locale, pattern) test set."""
    return example_id.startswith("dates/test/heldout/")
