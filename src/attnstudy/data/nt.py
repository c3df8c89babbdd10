"""The Greek New Testament (SBLGNT) and the Berean Standard Bible with Biblica's manual word
alignments, as a translation task with human gold links (``nt-greek-english``).

The data come from the ``bible-alignments`` package (0.4.2, read from its files; installed with
``make test-deps``): ``sources/SBLGNT.tsv`` (the Greek words, id ``nBBCCCVVVWWW``),
``eng/targets/BSB/nt_BSB.tsv`` (the English tokens, each with the Greek verse it translates,
``skip_space_after`` and ``exclude`` for punctuation) and ``eng/alignments/BSB/SBLGNT-BSB-manual.json``
(Scripture Burrito 0.3 records, each a set of Greek words linked to a set of English words; every
Greek × English pair of a record is one sure link). Licences: SBLGNT CC BY 4.0, BSB public domain,
the alignments CC BY 4.0 (:data:`ATTRIBUTION`; docs/nt-greek-english.md).

One example per Greek verse. A record whose words lie in two verses joins them: the verses it
touches become one example (``40001001+40001002``), counted as merged; a verse with no record
(after merging) or with no Greek or no English words is dropped and counted. A record whose
``process`` is not ``manual`` is refused. The split is by chapter, by the salted SHA-256 of the
chapter (:func:`split_chapters`). English punctuation (``exclude``) stays in the English text but
is no word of the alignments: its tokens map to word −1, so the alignment statistics ignore it.
The gold has only sure links (S = P), so AER = 1 − F1 (:data:`GOLD_SURE_ONLY`).

The parsed corpus and each data section's splits are cached on disk (:func:`corpus_cache_path`,
:func:`splits_cache_path`; :mod:`attnstudy.data.disk_cache`), keyed by the files' bytes, the
package's version, the loader's code (:func:`loader_digest`) and the settings.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, files, version
from pathlib import Path

from attnstudy.config import DataConfig
from attnstudy.data.alignment import Alignment
from attnstudy.data.disk_cache import file_digest, load_or_build, sources_digest
from attnstudy.data.g2p_align import cache_dir
from attnstudy.data.nt_groups import VerseUnion, group_examples, verse_groups
from attnstudy.data.subwords import SubwordTokenizer, merge_subwords, train_tokenizer
from attnstudy.data.types import SPLITS, DataError, Example, Splits
from attnstudy.runtime.notices import notice

TASK = "nt-greek-english"
PACKAGE = "bible-alignments"
PACKAGE_VERSION = "0.4.2"
INSTALL = f"run: make test-deps (or: pip install --no-deps {PACKAGE}=={PACKAGE_VERSION})"
"""What to do when the package is missing, of another version or its files do not parse."""
PACKAGE_FILES = {
    "source": "data/sources/SBLGNT.tsv",
    "target": "data/eng/targets/BSB/nt_BSB.tsv",
    "alignment": "data/eng/alignments/BSB/SBLGNT-BSB-manual.json",
}
GOLD_SURE_ONLY = True
"""Every gold link is sure (no possible-only links): AER = 1 − F1 of the predicted links against
the gold (Och & Ney 2003, eq. 7 with S = P)."""
ATTRIBUTION = (
    "Greek: SBL Greek New Testament (SBLGNT), copyright 2010 by the Society of Biblical "
    "Literature and Logos Bible Software, CC BY 4.0 (https://sblgnt.com/). English: the Berean "
    "Standard Bible (BSB), public domain (https://www.bereanbible.com/). Word alignments: "
    "SBLGNT-BSB-manual by Biblica, CC BY 4.0. All three as packaged by bible-alignments 0.4.2 "
    "(BiblioNexus)."
)
DATA_CARD = (
    "**Data card.** Sources and licences: Greek, the SBL Greek New Testament (SBLGNT), CC BY "
    "4.0; English, the Berean Standard Bible (BSB), public domain; word alignments, "
    "SBLGNT-BSB-manual by Biblica, CC BY 4.0 (every record `manual`); read from the "
    f"`{PACKAGE}` {PACKAGE_VERSION} package's data files. Attribution: {ATTRIBUTION} "
    "(docs/nt-greek-english.md)."
)
"""The data card of every model run of the task (its description; :attr:`TaskSpec.data_card`)."""
POS_GROUPS = {"det": "article", "num": "other", "intj": "other"}
"""SBLGNT's ``pos`` tags reported under another name: the article (SBLGNT ``det``), and the two
rare tags (``num`` 477, ``intj`` 18 words) as "other"; every other tag (noun, verb, conj, pron,
prep, adj, adv, ptcl) is its own group (:attr:`attnstudy.data.tasks.TaskSpec.word_tags`)."""
SOURCE_COLUMNS = ("id", "text", "pos")
TARGET_COLUMNS = ("id", "source_verse", "text", "skip_space_after", "exclude")


@dataclass(frozen=True)
class NTFiles:
    """The three data files (the package's, or a fixture's)."""

    source: Path
    target: Path
    alignment: Path


@dataclass(frozen=True)
class Verse:
    """One example before tokenization: a Greek verse (or verses merged by a crossing record).

    Attributes:
        id: the verse id ``BBCCCVVV`` (book 40 = Matthew … 66 = Revelation), merged ones joined
            with ``+``.
        chapter: ``BBCCC`` of its first verse (the split's unit).
        greek: the Greek words.
        english: the English tokens, punctuation included.
        exclude: per English token, whether it is punctuation (no word of the alignments).
        skip_space_after: per English token, whether no space follows it in the text.
        links: sure links ``(Greek word index, English token index)``.
        greek_pos: per Greek word, its part of speech as SBLGNT's ``pos`` column gives it
            (``noun``, ``verb``, ``det`` …; :data:`POS_GROUPS` names the groups reported). Not
            part of an example's tokens or links, so of no data digest or model key.
    """

    id: str
    chapter: str
    greek: tuple[str, ...]
    english: tuple[str, ...]
    exclude: tuple[bool, ...]
    skip_space_after: tuple[bool, ...]
    links: frozenset[tuple[int, int]]
    greek_pos: tuple[str, ...] = ()

    @property
    def english_text(self) -> str:
        """The English as text (:func:`detokenize_english` with the data's own spacing)."""
        return detokenize_english(self.english, self.skip_space_after)


@dataclass(frozen=True)
class Corpus:
    """The parsed files: the examples in canon order, and what was counted on the way.

    ``stats`` keys: ``greek_verses``, ``greek_tokens``, ``english_tokens``,
    ``english_punctuation``, ``records``, ``links``, ``crossing_records``, ``merged_examples``,
    ``merged_verses``, ``verses_without_record`` (Greek verses no record's id names),
    ``verses_without_linked_word`` (Greek verses none of whose words is in a record),
    ``dropped_verses`` (Greek verses in no example), ``dropped_english_tokens``, ``examples``,
    ``chapters``, ``examples_across_chapters``.
    """

    verses: tuple[Verse, ...]
    stats: dict[str, int]


def package_files() -> NTFiles:
    """The files of the installed ``bible-alignments`` package (found by
    :func:`importlib.metadata.files`).

    Raises:
        DataError: the package missing, of another version than :data:`PACKAGE_VERSION`, or
            without one of the files (the message says what to install).
    """
    try:
        found = version(PACKAGE)
    except PackageNotFoundError:
        raise DataError(f"task {TASK!r} needs the {PACKAGE!r} package; {INSTALL}") from None
    if found != PACKAGE_VERSION:
        raise DataError(
            f"task {TASK!r} reads {PACKAGE} {PACKAGE_VERSION}, but {found} is installed; {INSTALL}"
        )
    located = {str(f).replace("\\", "/"): f for f in files(PACKAGE) or ()}
    paths = {}
    for role, rel in PACKAGE_FILES.items():
        f = located.get(rel)
        path = Path(f.locate()) if f is not None else None
        if path is None or not path.is_file():
            raise DataError(f"{PACKAGE} {found} has no file {rel}; reinstall it: {INSTALL}")
        paths[role] = path
    return NTFiles(**paths)


def _bad(path: Path, problem: str) -> DataError:
    return DataError(f"{path}: {problem}; the data cannot be read: {INSTALL}")


def _read_tsv(path: Path, columns: Sequence[str]) -> list[dict[str, str]]:
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise _bad(path, f"unreadable ({err})") from None
    if not rows or any(c not in rows[0] for c in columns):
        raise _bad(path, f"not a TSV file with the columns {', '.join(columns)}")
    return rows


def _verse_of(token_id: str, path: Path, greek: bool) -> str:
    digits = token_id[1:] if greek else token_id
    if len(digits) != 11 or not digits.isdigit() or (greek and not token_id.startswith("n")):
        raise _bad(path, f"token id {token_id!r} is not {'n' if greek else ''}BBCCCVVVWWW")
    return digits[:8]


def _read_records(path: Path) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        records = doc["records"]
        if not isinstance(records, list):
            raise TypeError("records is not a list")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise _bad(path, f"not Scripture Burrito alignment JSON ({err})") from None
    return records


@functools.lru_cache(maxsize=2)
def read_corpus(nt_files: NTFiles) -> Corpus:
    """The three files parsed into examples (:func:`parse_corpus`), cached in-process and on disk
    (:func:`corpus_cache_path`: a process that finds the cache reads it in about a second instead
    of parsing the files for several).

    Raises:
        DataError: as :func:`parse_corpus` (a cache miss parses the files).
    """
    try:
        path = corpus_cache_path(nt_files)
    except OSError:  # a file that cannot be read: parsing says which, and what to do
        return parse_corpus(nt_files)
    return load_or_build(
        path,
        "Greek–English corpus",
        decode=_corpus_from_json,
        build=lambda: parse_corpus(nt_files),
        encode=_corpus_to_json,
    )


def parse_corpus(nt_files: NTFiles) -> Corpus:
    """Parse the three files into examples (no cache).

    Raises:
        DataError: a file that does not parse (the message names it and says what to install),
            a record naming a token the files do not have, or a record whose ``meta.process`` is
            not ``manual`` (only human alignments are gold here).
    """
    src_rows = _read_tsv(nt_files.source, SOURCE_COLUMNS)
    tgt_rows = _read_tsv(nt_files.target, TARGET_COLUMNS)
    records = _read_records(nt_files.alignment)
    greek, greek_pos, english = _tokens(nt_files, src_rows, tgt_rows)
    # union-find over verse ids: a record joins the verses of all its words
    union = VerseUnion()
    for verse, _ in greek.values():
        union.find(verse)
    for verse, _ in english.values():
        union.find(verse)
    parsed, record_stats = _records(nt_files.alignment, records, greek, english, union)
    groups = verse_groups(greek, english, parsed, union)
    out, index, group_stats = group_examples(groups, greek_pos)
    n_links = 0
    for src_ids, tgt_ids in parsed:
        for s in src_ids:
            for t in tgt_ids:
                n_links += 1
                (es, i), (et, j) = index[s], index[t]
                assert es == et, "a record's words lie in one example by construction"
                out[es]["links"].add((i, j))
    verses_out = tuple(
        Verse(
            d["id"],
            d["chapter"],
            d["greek"],
            d["english"],
            d["exclude"],
            d["skip"],
            frozenset(d["links"]),
            d["pos"],
        )
        for d in out
    )
    greek_verses = {v for v, _ in greek.values()}
    stats = {
        "greek_verses": len(greek_verses),
        "greek_tokens": len(greek),
        "english_tokens": len(english),
        "english_punctuation": sum(r["exclude"] == "y" for _, r in english.values()),
        "records": len(records),
        "links": n_links,
        "crossing_records": record_stats["crossing"],
        "merged_examples": group_stats["merged_examples"],
        "merged_verses": group_stats["merged_verses"],
        "verses_without_record": len(greek_verses - record_stats["started"]),
        "verses_without_linked_word": len(greek_verses - record_stats["named"]),
        "dropped_verses": group_stats["dropped_verses"],
        "dropped_english_tokens": group_stats["dropped_english"],
        "examples": len(verses_out),
        "chapters": len({v.chapter for v in verses_out}),
        "examples_across_chapters": group_stats["across"],
    }
    return Corpus(verses_out, stats)


def _tokens(nt_files: NTFiles, src_rows: list[dict], tgt_rows: list[dict]):
    """The word files' tokens, checked: (Greek token id → (verse, text), Greek token id → part
    of speech, English token id → (Greek verse, row)).

    Raises:
        DataError: a token id that is not a verse's, a ``source_verse`` that is not BBCCCVVV, an
            empty token.
    """
    greek: dict[str, tuple[str, str]] = {}
    greek_pos: dict[str, str] = {}
    for r in src_rows:
        greek[r["id"]] = (_verse_of(r["id"], nt_files.source, True), r["text"])
        greek_pos[r["id"]] = r["pos"]
    english: dict[str, tuple[str, dict[str, str]]] = {}
    for r in tgt_rows:
        _verse_of(r["id"], nt_files.target, False)
        sv = r["source_verse"]
        if len(sv) != 8 or not sv.isdigit():
            raise _bad(nt_files.target, f"token {r['id']}: source_verse {sv!r} is not BBCCCVVV")
        english[r["id"]] = (sv, r)
    empty = next((t for t, (_, text) in greek.items() if not text.strip()), None)
    if empty is not None:
        raise _bad(nt_files.source, f"token {empty} is empty")
    empty = next((t for t, (_, row) in english.items() if not row["text"].strip()), None)
    if empty is not None:
        raise _bad(nt_files.target, f"token {empty} is empty")
    return greek, greek_pos, english


def _records(path: Path, records: list, greek: dict, english: dict, union: VerseUnion):
    """Check each alignment record and join the verses it spans. Returns ([(source token ids,
    target token ids)] per record, {"crossing": records spanning verses, "started": verses of
    a record's id, "named": Greek verses a record names a word of}).

    Raises:
        DataError: a record without ``meta.process``, source or target; a process other than
            ``manual``; a token id the word files lack.
    """
    crossing = 0
    started: set[str] = set()  # verses of a record's id (BBCCCVVV.NNN)
    named: set[str] = set()  # Greek verses a record names a word of
    parsed = []
    for k, rec in enumerate(records):
        try:
            process = rec["meta"]["process"]
            src_ids, tgt_ids = list(rec["source"]), list(rec["target"])
        except (KeyError, TypeError):
            raise _bad(path, f"record {k} has no meta.process, source or target") from None
        if process != "manual":
            raise DataError(
                f"{path}: record {rec['meta'].get('id', k)} has process {process!r}; "
                f"only 'manual' (human) alignments are gold for task {TASK!r}: give the manual "
                f"alignment file of {PACKAGE} {PACKAGE_VERSION} ({INSTALL})"
            )
        missing = next((t for t in src_ids if t not in greek), None) or next(
            (t for t in tgt_ids if t not in english), None
        )
        if missing is not None:
            raise _bad(
                path,
                f"record {rec['meta'].get('id', k)} names token {missing!r}, which the word files lack",
            )
        verses = {greek[t][0] for t in src_ids} | {english[t][0] for t in tgt_ids}
        if len(verses) > 1:
            crossing += 1
        started.add(str(rec["meta"].get("id", ""))[:8])
        named.update(greek[t][0] for t in src_ids)
        union.join(verses)
        parsed.append((src_ids, tgt_ids))
    return parsed, {"crossing": crossing, "started": started, "named": named}


@functools.lru_cache(maxsize=8)
def split_chapters(
    chapters: tuple[tuple[str, int], ...],
    salt: str,
    test_fraction: float,
    dev_fraction: float,
    min_test_verses: int,
) -> dict[str, tuple[str, ...]]:
    """Split chapters by the salted SHA-256 of their id: test first, then dev, train the rest.

    Chapters are ordered by ``sha256(salt + chapter)``; test takes chapters in that order until it
    holds at least ``ceil(test_fraction × n_chapters)`` chapters and ``min_test_verses``
    examples, dev the next ``round(dev_fraction × n_chapters)`` (at least one), train the rest.

    Args:
        chapters: ``(chapter id, number of examples)`` pairs.

    Returns:
        split → chapter ids in hash order.
    """
    order = sorted(chapters, key=lambda c: (hashlib.sha256((salt + c[0]).encode()).digest(), c[0]))
    want = math.ceil(test_fraction * len(order))
    n_test = verses = 0
    while n_test < len(order) and (n_test < want or verses < min_test_verses):
        verses += order[n_test][1]
        n_test += 1
    n_dev = max(1, round(dev_fraction * len(order)))
    ids = [c for c, _ in order]
    return {
        "test": tuple(ids[:n_test]),
        "dev": tuple(ids[n_test : n_test + n_dev]),
        "train": tuple(ids[n_test + n_dev :]),
    }


def split_verses(corpus: Corpus, cfg: DataConfig) -> dict[str, list[Verse]]:
    """The examples of each split, chapters in hash order, verses in canon order inside a
    chapter; ``n_train``/``n_dev``/``n_test`` take a prefix (whole chapters stay apart from the
    other splits whatever the prefix)."""
    per_chapter: dict[str, list[Verse]] = {}
    for v in corpus.verses:
        per_chapter.setdefault(v.chapter, []).append(v)
    parts = split_chapters(
        tuple((c, len(vs)) for c, vs in per_chapter.items()),
        cfg.split_salt,
        cfg.nt_test_fraction,
        cfg.nt_dev_fraction,
        cfg.nt_min_test_verses,
    )
    out = {}
    for split in SPLITS:
        chosen = [v for c in parts[split] for v in per_chapter[c]]
        n = getattr(cfg, f"n_{split}")
        out[split] = chosen[:n] if n is not None else chosen
    return out


def _word_maps(
    words: Sequence[int], exclude: Sequence[bool]
) -> tuple[tuple[int, ...], dict[int, int]]:
    """Token → alignment word map: excluded (punctuation) words become −1, the others are
    numbered 0, 1, … in order; also the old index → new index of the kept words."""
    renumber, k = {}, 0
    for i, ex in enumerate(exclude):
        if not ex:
            renumber[i] = k
            k += 1
    return tuple(renumber.get(w, -1) if w >= 0 else -1 for w in words), renumber


def verse_example(
    verse: Verse,
    split: str,
    greek_tok: SubwordTokenizer,
    english_tok: SubwordTokenizer,
    direction: str,
) -> Example:
    """One :class:`~attnstudy.data.types.Example` of a verse: subword tokens, their word maps
    (English punctuation → −1) and the word-level sure links.

    Args:
        direction: ``"grc-en"`` (Greek source) or ``"en-grc"``.
    """
    g_tokens, g_words = greek_tok.encode(verse.greek)
    e_tokens, e_words = english_tok.encode(verse.english)
    e_map, renumber = _word_maps(e_words, verse.exclude)
    if direction == "grc-en":
        links = {(i, renumber[j]) for i, j in verse.links}
        src, src_words, tgt, tgt_words = g_tokens, g_words, e_tokens, e_map
    else:
        links = {(renumber[j], i) for i, j in verse.links}
        src, src_words, tgt, tgt_words = e_tokens, e_map, g_tokens, g_words
    return Example(
        id=f"nt/{split}/{verse.id}",
        src=src,
        tgt=tgt,
        alignment=Alignment.from_links(links),
        src_words=src_words,
        tgt_words=tgt_words,
    )


@functools.lru_cache(maxsize=4)
def _tokenizers(
    train_ids: tuple[str, ...], nt_files: NTFiles, kind: str, vocab_size: int
) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    by_id = {v.id: v for v in read_corpus(nt_files).verses}
    train = [by_id[i] for i in train_ids]
    return (
        train_tokenizer((v.greek for v in train), kind, vocab_size),
        train_tokenizer((v.english for v in train), kind, vocab_size),
    )


def tokenizers(nt_files: NTFiles, cfg: DataConfig) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    """The Greek and the English tokenizer of the task's training examples (after ``n_train``),
    as :func:`build_splits` uses them (cached in-process)."""
    train = split_verses(read_corpus(nt_files), cfg)["train"]
    return _tokenizers(tuple(v.id for v in train), nt_files, cfg.nt_tokenization, cfg.nt_vocab_size)


def build_splits(nt_files: NTFiles, cfg: DataConfig) -> Splits:
    """The task's splits from the files ``nt_files`` (the package's or a fixture's), cached on
    disk (:func:`splits_cache_path`; :func:`make_splits` on a miss).

    Raises:
        DataError: as :func:`read_corpus`.
    """
    try:
        path = splits_cache_path(nt_files, cfg)
    except OSError:  # a file that cannot be read: parsing says which, and what to do
        return make_splits(nt_files, cfg)
    return load_or_build(
        path,
        "Greek–English splits",
        decode=_splits_from_json,
        build=lambda: make_splits(nt_files, cfg),
        encode=_splits_to_json,
    )


def make_splits(nt_files: NTFiles, cfg: DataConfig) -> Splits:
    """The task's splits from the files ``nt_files`` (no disk cache).

    Greek and English tokenizers are trained on the training examples (after ``n_train``) only.

    Raises:
        DataError: as :func:`read_corpus`.
    """
    corpus = read_corpus(nt_files)
    parts = split_verses(corpus, cfg)
    greek_tok, english_tok = tokenizers(nt_files, cfg)
    return Splits(
        **{
            split: [
                verse_example(v, split, greek_tok, english_tok, cfg.direction) for v in parts[split]
            ]
            for split in SPLITS
        }
    )


def load_nt(cfg: DataConfig) -> Splits:
    """Task ``nt-greek-english`` from the installed ``bible-alignments`` package (see the module
    docstring); a notice counts the merged and dropped verses.

    Raises:
        DataError: the package missing or of another version, or files that do not parse (one
            line with what to install); a record that is not ``manual``.
    """
    nt_files = package_files()
    splits = build_splits(nt_files, cfg)
    s = read_corpus(nt_files).stats
    _notice_counts(s)
    return splits


@functools.lru_cache(maxsize=2)
def _notice_counts_once(items: tuple[tuple[str, int], ...]) -> None:
    s = dict(items)
    notice(
        f"task {TASK!r}: {s['examples']:,} examples from {s['greek_verses']:,} Greek verses; "
        f"{s['crossing_records']} records cross a verse boundary and merge {s['merged_verses']} "
        f"verses into {s['merged_examples']} examples; {s['dropped_verses']} verses without a "
        "record are dropped"
    )


def _notice_counts(stats: dict[str, int]) -> None:
    _notice_counts_once(tuple(sorted(stats.items())))


def detokenize_english(words: Sequence[str], skip_space_after: Sequence[bool] | None = None) -> str:
    """English tokens as text, for BLEU and chrF (sacrebleu).

    With ``skip_space_after`` (the BSB's own flags, one per token) no space follows a flagged
    token. Without (a model's output), the BSB's spacing conventions: no space before
    ``, . ? ! : ; ” ’ ) ... —`` and after ``“ ‘ ( —``, one space elsewhere.
    """
    if skip_space_after is None:
        skip_space_after = [
            w in _NO_SPACE_AFTER or (k + 1 < len(words) and words[k + 1] in _NO_SPACE_BEFORE)
            for k, w in enumerate(words)
        ]
    parts = []
    for k, w in enumerate(words):
        parts.append(w)
        if k + 1 < len(words) and not skip_space_after[k]:
            parts.append(" ")
    return "".join(parts)


def translation_texts(
    cfg: DataConfig, examples: Sequence[Example], hypotheses: Sequence[Sequence[str]]
) -> tuple[list[str], list[str]]:
    """Hypothesis and reference texts for BLEU and chrF (:mod:`attnstudy.scoring.translation`).

    A hypothesis's subwords are joined into words (:func:`~attnstudy.data.subwords.
    merge_subwords`; ``words`` tokenization: the tokens are the words), English detokenised with
    the BSB's spacing conventions (:func:`detokenize_english` without flags), Greek joined by
    spaces. A reference is the example's verse(s) from the data files: English with the BSB's
    own ``skip_space_after`` flags (:attr:`Verse.english_text`, punctuation kept), Greek words
    joined by spaces.

    Args:
        cfg: the data section (``direction``, ``nt_tokenization``).
        examples: examples of this task (id ``nt/<split>/<verse id>``).
        hypotheses: decoded target tokens, one sequence per example.

    Raises:
        DataError: an example id that names no verse of the data files, or the files as
            :func:`package_files` / :func:`read_corpus`.
    """
    by_id = {v.id: v for v in read_corpus(package_files()).verses}
    hyps, refs = [], []
    for ex, tokens in zip(examples, hypotheses, strict=True):
        verse = by_id.get(ex.id.split("/", 2)[-1])
        if verse is None:
            raise DataError(f"example {ex.id!r} names no verse of the {PACKAGE} data files")
        words = list(tokens) if cfg.nt_tokenization == "words" else merge_subwords(tokens)
        if cfg.direction == "grc-en":
            hyps.append(detokenize_english(words))
            refs.append(verse.english_text)
        else:
            hyps.append(" ".join(words))
            refs.append(" ".join(verse.greek))
    return hyps, refs


_NO_SPACE_BEFORE = frozenset({",", ".", "?", "!", ":", ";", "”", "’", ")", "...", "—"})
_NO_SPACE_AFTER = frozenset({"“", "‘", "(", "—"})


def source_word_tags(
    cfg: DataConfig, nt_files: NTFiles | None = None
) -> dict[str, tuple[str, ...]]:
    """The part of speech of every source word of the task's examples, by example id
    (``nt/<split>/<verse id>`` → one SBLGNT ``pos`` per Greek word), for the breakdowns
    (:attr:`attnstudy.data.tasks.TaskSpec.word_tags`). Read from the parsed corpus, not from the
    examples: the tags are in no data digest and no model key.

    Args:
        cfg: the task's data section (its split and ``n_*``; ``direction``).
        nt_files: the data files (default: the installed package's).

    Returns:
        Example id → tags, one per source word, in every split; empty for ``direction =
        "en-grc"`` (the source is English, which has no tags here).

    Raises:
        DataError: as :func:`read_corpus`.
    """
    if cfg.direction != "grc-en":
        return {}
    parts = split_verses(read_corpus(nt_files or package_files()), cfg)
    return {f"nt/{split}/{v.id}": v.greek_pos for split in SPLITS for v in parts[split]}


def corpus_table(nt_files: NTFiles, cfg: DataConfig) -> dict[str, int]:
    """The counts of the data card: the corpus (:attr:`Corpus.stats`), per split its chapters,
    examples, source and target tokens (words and subwords) and links."""
    corpus = read_corpus(nt_files)
    out = dict(corpus.stats)
    parts = split_verses(corpus, cfg)
    splits = build_splits(nt_files, cfg)
    for split in SPLITS:
        vs = parts[split]
        exs = getattr(splits, split)
        out[f"{split}_chapters"] = len({v.chapter for v in vs})
        out[f"{split}_examples"] = len(vs)
        out[f"{split}_greek_words"] = sum(len(v.greek) for v in vs)
        out[f"{split}_english_tokens"] = sum(len(v.english) for v in vs)
        out[f"{split}_links"] = sum(len(v.links) for v in vs)
        out[f"{split}_source_subwords"] = sum(len(e.src) for e in exs)
        out[f"{split}_target_subwords"] = sum(len(e.tgt) for e in exs)
    return out


# ----------------------------------------------------------------------------- disk cache

CACHE_FORMAT = 2
"""The layout of the cache files (part of their keys)."""
LOADER_MODULES = (
    "nt.py",
    "nt_groups.py",
    "subwords.py",
    "alignment.py",
    "types.py",
    "disk_cache.py",
)
"""The modules whose sources make what is cached: their digest is part of every key, so a change
of the loader's code never reads a cache the old code wrote."""


@functools.cache
def loader_digest() -> str:
    """SHA-256 (hex) of the sources of :data:`LOADER_MODULES` (the code version of the loader)."""
    here = Path(__file__).resolve().parent
    return sources_digest(here / name for name in LOADER_MODULES)


def _installed_version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=4)
def corpus_key(nt_files: NTFiles) -> str:
    """The corpus cache's key (24 hex digits): SHA-256 of the cache format, the loader's code
    version (:func:`loader_digest`), the installed ``bible-alignments`` version and the SHA-256 of
    each of the three files' bytes (so a fixture or an edited file has its own key).

    Raises:
        OSError: a file that cannot be read.
    """
    files_ = {role: file_digest(getattr(nt_files, role)) for role in PACKAGE_FILES}
    blob = json.dumps(
        [CACHE_FORMAT, loader_digest(), _installed_version(PACKAGE), sorted(files_.items())]
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def corpus_cache_path(nt_files: NTFiles) -> Path:
    """``<cache dir>/nt-greek-english/corpus-<corpus_key>.json.gz`` (cache dir:
    :func:`attnstudy.data.g2p_align.cache_dir`, ``$ATTNSTUDY_CACHE``)."""
    return cache_dir() / TASK / f"corpus-{corpus_key(nt_files)}.json.gz"


def splits_cache_path(nt_files: NTFiles, cfg: DataConfig) -> Path:
    """``<cache dir>/nt-greek-english/splits-<key>.json.gz``; the key is SHA-256 of the corpus
    key (files, package and loader versions), every field of the data section (direction,
    tokenization, vocabulary size, split settings and sizes) and the ``tokenizers`` library's
    version (it trains the BPE)."""
    blob = json.dumps(
        [corpus_key(nt_files), cfg.model_dump(mode="json"), _installed_version("tokenizers")],
        sort_keys=True,
    )
    return cache_dir() / TASK / f"splits-{hashlib.sha256(blob.encode()).hexdigest()[:24]}.json.gz"


def _strs(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(type(v) is str for v in value):
        raise ValueError("a token list is not a list of strings")
    return tuple(value)


def _ints(value: object) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        raise ValueError("an index list is not a list of integers")
    return tuple(value)


def _flags(value: object) -> tuple[bool, ...]:
    if not isinstance(value, str) or not set(value) <= {"0", "1"}:
        raise ValueError("flags are not a string of 0 and 1")
    return tuple(c == "1" for c in value)


def _pairs(value: object) -> frozenset[tuple[int, int]]:
    flat = _ints(value)
    if len(flat) % 2:
        raise ValueError("a link list has an odd length")
    return frozenset(zip(flat[::2], flat[1::2], strict=True))


def _flat(links: frozenset[tuple[int, int]]) -> list[int]:
    return [k for link in sorted(links) for k in link]


def _header(value: object, kind: str) -> dict:
    if not isinstance(value, dict) or value.get("format") != CACHE_FORMAT:
        raise ValueError(f"not a {kind} cache of format {CACHE_FORMAT}")
    stats = value.get("stats")
    if not isinstance(stats, dict) or not all(type(v) is int for v in stats.values()):
        raise ValueError("no counts")
    return value


def _corpus_to_json(corpus: Corpus) -> dict:
    return {
        "format": CACHE_FORMAT,
        "stats": corpus.stats,
        "verses": [
            [
                v.id,
                v.chapter,
                list(v.greek),
                list(v.english),
                "".join("1" if x else "0" for x in v.exclude),
                "".join("1" if x else "0" for x in v.skip_space_after),
                _flat(v.links),
                list(v.greek_pos),
            ]
            for v in corpus.verses
        ],
    }


def _corpus_from_json(value: object) -> Corpus:
    doc = _header(value, "corpus")
    verses = []
    for row in doc["verses"]:
        vid, chapter, greek, english, exclude, skip, links, pos = row
        if type(vid) is not str or type(chapter) is not str:
            raise ValueError("a verse id is not a string")
        v = Verse(
            vid,
            chapter,
            _strs(greek),
            _strs(english),
            _flags(exclude),
            _flags(skip),
            _pairs(links),
            _strs(pos),
        )
        if not len(v.english) == len(v.exclude) == len(v.skip_space_after):
            raise ValueError(f"verse {vid}: flags and tokens differ in number")
        if len(v.greek_pos) != len(v.greek):
            raise ValueError(f"verse {vid}: parts of speech and Greek words differ in number")
        verses.append(v)
    return Corpus(tuple(verses), dict(doc["stats"]))


def _splits_to_json(splits: Splits) -> dict:
    def row(ex: Example) -> list:
        al = ex.alignment
        return [
            ex.id,
            list(ex.src),
            list(ex.tgt),
            None if al is None else _flat(al.sure),
            None if al is None else _flat(al.possible),
            [list(r) for r in ex.refs],
            list(ex.src_words),
            list(ex.tgt_words),
        ]

    return {
        "format": CACHE_FORMAT,
        "stats": {},
        "splits": {split: [row(ex) for ex in getattr(splits, split)] for split in SPLITS},
    }


def _splits_from_json(value: object) -> Splits:
    doc = _header(value, "splits")

    def example(row: list) -> Example:
        eid, src, tgt, sure, possible, refs, src_words, tgt_words = row
        if type(eid) is not str or not isinstance(refs, list):
            raise ValueError("an example id is not a string")
        alignment = None
        if sure is not None or possible is not None:
            alignment = Alignment(sure=_pairs(sure), possible=_pairs(possible))
        return Example(
            id=eid,
            src=_strs(src),
            tgt=_strs(tgt),
            alignment=alignment,
            refs=tuple(_strs(r) for r in refs),
            src_words=_ints(src_words),
            tgt_words=_ints(tgt_words),
        )

    return Splits(**{split: [example(r) for r in doc["splits"][split]] for split in SPLITS})
