"""eflomal (Östling & Tiedemann 2016, "Efficient Word Alignment with Markov Chain Monte Carlo",
PBML 106) as the reference aligner of task ``nt-greek-english``, and its AER, precision and recall
on the test verses against Biblica's manual gold.

eflomal is GPL-3.0: it is run as the ``eflomal-align`` command in a subprocess (with a timeout),
never imported. One call aligns both directions (``-f`` forward, ``-r`` reverse, both written
``source-target``); the heuristics of :data:`attnstudy.data.symmetrise.SYMMETRISATIONS` join them
(grow-diag-final-and the reference row beside attention; every one a row of its own). As statistical
aligners are run, it learns unsupervised on the text of the training verses *and* of the test
verses (no gold links are seen), then its links of the test verses are scored.

Words, not subwords: Greek words and English tokens with punctuation, as the files give them; links
to English punctuation (``exclude``, never aligned in the gold) are removed and the English words
renumbered as the task numbers them, so eflomal and attention are scored against the same gold.

eflomal samples (MCMC) and ``eflomal-align`` takes no seed: its links, and the scores, change a
little from run to run (docs/nt-greek-english.md gives three runs).

``python -m attnstudy.data.eflomal [--out table.csv]`` prints the table (and writes it).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnstudy.data.ratios import Estimate, cell, ratio_estimate
from attnstudy.data.symmetrise import DEFAULT, SYMMETRISATIONS
from attnstudy.data.types import DataError

COMMAND = "eflomal-align"
INSTALL = "pip install eflomal==2.0.0 (make test-deps; it compiles: a C compiler is needed)"
DEFAULT_TIMEOUT_S = 1800.0


class EflomalError(RuntimeError):
    """``eflomal-align`` missing, failing or past its timeout, as one line naming the command."""


class EflomalMissing(EflomalError):
    """``eflomal-align`` is not installed."""


@dataclass(frozen=True)
class Directional:
    """eflomal's links of one sentence pair, each ``(source_index, target_index)``."""

    forward: frozenset[tuple[int, int]]
    reverse: frozenset[tuple[int, int]]

    @property
    def symmetrised(self) -> set[tuple[int, int]]:
        """grow-diag-final-and of the two directions."""
        return self.links(DEFAULT)

    def links(self, heuristic: str) -> set[tuple[int, int]]:
        """The links of one row of :data:`~attnstudy.data.symmetrise.SYMMETRISATIONS`
        (``forward``, ``backward``, ``intersection`` … ``grow-diag-final-and``).

        Raises:
            KeyError: an unknown heuristic.
        """
        return SYMMETRISATIONS[heuristic](self.forward, self.reverse)


def find_command() -> str:
    """The ``eflomal-align`` executable: beside this Python (a virtual environment's ``bin``)
    first, then on ``PATH``.

    Raises:
        EflomalError: not installed (the message says what to install).
    """
    beside = Path(sys.executable).parent / COMMAND
    if beside.is_file():
        return str(beside)
    found = shutil.which(COMMAND)
    if found is None:
        raise EflomalMissing(f"the command {COMMAND!r} is not installed; run: {INSTALL}")
    return found


def _parse_links(line: str, n_src: int, n_tgt: int, path: Path, k: int) -> frozenset:
    links = set()
    for tok in line.split():
        i, sep, j = tok.partition("-")
        if not sep or not i.isdigit() or not j.isdigit() or int(i) >= n_src or int(j) >= n_tgt:
            raise EflomalError(
                f"{COMMAND} wrote {tok!r} on line {k + 1} of {path.name}, not a link"
            )
        links.add((int(i), int(j)))
    return frozenset(links)


def align(
    pairs: Sequence[tuple[Sequence[str], Sequence[str]]],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    options: Sequence[str] = (),
    command: str | None = None,
) -> list[Directional]:
    """Align sentence pairs with ``eflomal-align`` in a subprocess, both directions in one run.

    Args:
        pairs: ``(source words, target words)``; no word may contain whitespace.
        timeout_s: wall-clock limit of the subprocess in seconds.
        options: more command-line options (e.g. ``("-m", "3")``).
        command: the executable (default :func:`find_command`).

    Returns:
        Forward and reverse links per pair, in order.

    Raises:
        EflomalError: the command missing, failing (its last error line), past ``timeout_s``, or
            writing output that is not one Pharaoh line per pair.
        DataError: a word with whitespace, or an empty side (eflomal cannot align it).
    """
    exe = command or find_command()
    for k, (src, tgt) in enumerate(pairs):
        if not src or not tgt:
            raise DataError(f"pair {k}: an empty side cannot be aligned")
        if any(not w or any(c.isspace() for c in w) for w in (*src, *tgt)):
            raise DataError(f"pair {k}: a word is empty or contains whitespace")
    with tempfile.TemporaryDirectory(prefix="attnstudy-eflomal-") as tmp:
        d = Path(tmp)
        (d / "source.txt").write_text("".join(" ".join(s) + "\n" for s, _ in pairs), "utf-8")
        (d / "target.txt").write_text("".join(" ".join(t) + "\n" for _, t in pairs), "utf-8")
        cmd = [
            exe,
            "-s",
            str(d / "source.txt"),
            "-t",
            str(d / "target.txt"),
            "-f",
            str(d / "forward.txt"),
            "-r",
            str(d / "reverse.txt"),
            *options,
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise EflomalError(
                f"{COMMAND} ran past its timeout of {timeout_s:g} s on {len(pairs):,} sentence "
                "pairs; give it more time (--timeout) or fewer pairs"
            ) from None
        except OSError as err:
            raise EflomalMissing(
                f"{COMMAND} could not be started ({err}); run: {INSTALL}"
            ) from None
        if proc.returncode != 0:
            last = next(
                (ln for ln in reversed(proc.stderr.splitlines()) if ln.strip()), "no message"
            )
            raise EflomalError(f"{COMMAND} failed (exit code {proc.returncode}): {last.strip()}")
        out = []
        files = [d / "forward.txt", d / "reverse.txt"]
        try:
            lines = [f.read_text("utf-8").splitlines() for f in files]
        except OSError:
            raise EflomalError(f"{COMMAND} exited 0 but wrote no alignment files") from None
        for f, ls in zip(files, lines):
            if len(ls) != len(pairs):
                raise EflomalError(
                    f"{COMMAND} wrote {len(ls)} lines to {f.name} for {len(pairs)} sentence pairs"
                )
        for k, (src, tgt) in enumerate(pairs):
            out.append(
                Directional(
                    _parse_links(lines[0][k], len(src), len(tgt), files[0], k),
                    _parse_links(lines[1][k], len(src), len(tgt), files[1], k),
                )
            )
    return out


def score(
    hypotheses: Sequence[set[tuple[int, int]]],
    gold: Sequence[set[tuple[int, int]]],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Estimate]:
    """AER, precision and recall of predicted links against sure-only gold, over a corpus.

    With sure links only (S = P) AER (Och & Ney 2003, eq. 7) is
    1 − 2|A∩S| / (|A| + |S|) = 1 − F1; precision = |A∩S| / |A|, recall = |A∩S| / |S|, each a
    ratio of corpus sums, with a 95 % percentile bootstrap interval resampling sentences
    (:func:`attnstudy.scoring.estimates.ratio_ci`, seeded by ``seed``, as the battery's statistics).
    Sentences with a zero denominator are left out of that statistic; with fewer than two the
    interval is NaN.

    Args:
        hypotheses, gold: links per sentence, in the same order.

    Returns:
        ``{"aer", "precision", "recall"}`` → :class:`Estimate` (NaN where undefined).

    Raises:
        ValueError: lists of different lengths.
    """
    import numpy as np

    if len(hypotheses) != len(gold):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(gold)} gold sentences")
    hit = np.array([len(set(a) & set(s)) for a, s in zip(hypotheses, gold)], float)
    n_hyp = np.array([len(a) for a in hypotheses], float)
    n_sure = np.array([len(s) for s in gold], float)
    return score_counts(hit, n_hyp, n_sure, resamples=resamples, seed=seed)


def score_counts(
    hit, n_hyp, n_sure, *, resamples: int = 1000, seed: int = 0
) -> dict[str, Estimate]:
    """AER, precision and recall (Och & Ney 2003, eq. 7 with S = P) from per-sentence counts, as
    :func:`score` (which calls it); the counts may be weighted (the breakdowns'
    :mod:`attnstudy.data.breakdowns`).

    Args:
        hit, n_hyp, n_sure: per sentence |A∩S|, |A| and |S|, shape (n_sentences,).
        resamples, seed: of the bootstrap.

    Returns:
        ``{"aer", "precision", "recall"}`` → :class:`Estimate` (NaN where undefined).
    """
    import numpy as np

    hit, n_hyp, n_sure = (np.asarray(a, float) for a in (hit, n_hyp, n_sure))
    return {
        "aer": ratio_estimate(
            2 * hit, n_hyp + n_sure, complement=True, resamples=resamples, seed=seed
        ),
        "precision": ratio_estimate(hit, n_hyp, resamples=resamples, seed=seed),
        "recall": ratio_estimate(hit, n_sure, resamples=resamples, seed=seed),
    }


def nt_pairs(verses) -> tuple[list[tuple[tuple[str, ...], tuple[str, ...]]], list[dict[int, int]]]:
    """eflomal's input of verses (:class:`attnstudy.data.nt.Verse`): (Greek words, English tokens
    with punctuation), and per verse the English token → alignment word renumbering (punctuation
    left out)."""
    pairs, renumber = [], []
    for v in verses:
        pairs.append((v.greek, v.english))
        keep = [j for j, ex in enumerate(v.exclude) if not ex]
        renumber.append({j: k for k, j in enumerate(keep)})
    return pairs, renumber


@dataclass(frozen=True)
class NTAlignment:
    """One eflomal run on task ``nt-greek-english``: its links of every test verse, both
    directions (:func:`nt_align`), from which every symmetrisation is scored.

    Attributes:
        train_verses: the training verses it also learned on.
        test: the test verses, in split order.
        links: eflomal's links of each test verse (Greek word, English token with punctuation).
        renumber: per test verse, English token → alignment word (punctuation left out).
        cfg: the data section it ran on (its split, for the task's word tags).
    """

    train_verses: int
    test: tuple
    links: tuple[Directional, ...]
    renumber: tuple[dict[int, int], ...]
    cfg: object = None

    def scored(
        self, heuristic: str = DEFAULT, n_scored: int | None = None
    ) -> tuple[list[set[tuple[int, int]]], list[set[tuple[int, int]]]]:
        """The links of ``heuristic`` and the gold of the first ``n_scored`` test verses (all with
        None), both ``(Greek word, English word)`` with English punctuation left out.

        Raises:
            KeyError: an unknown heuristic.
        """
        hyps, golds = [], []
        for v, d, ren in list(zip(self.test, self.links, self.renumber))[:n_scored]:
            hyps.append({(i, ren[j]) for i, j in d.links(heuristic) if j in ren})
            golds.append({(i, ren[j]) for i, j in v.links})
        return hyps, golds


def nt_align(
    nt_files=None,
    cfg=None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    options: Sequence[str] = (),
) -> NTAlignment:
    """eflomal on task ``nt-greek-english``: trained on the training verses plus the test verses'
    text (never a gold link), both directions of every test verse kept.

    Args:
        nt_files: the data files (default: the installed package's).
        cfg: the task's data section (default: its defaults; its split and ``n_*`` apply).
        timeout_s, options: as :func:`align`.

    Raises:
        DataError: the data (as :func:`attnstudy.data.nt.load_nt`).
        EflomalError: as :func:`align`.
    """
    from attnstudy.config import data_config
    from attnstudy.data import nt

    nt_files = nt_files or nt.package_files()
    cfg = cfg or data_config(task=nt.TASK)
    parts = nt.split_verses(nt.read_corpus(nt_files), cfg)
    train, test = parts["train"], parts["test"]
    pairs, renumber = nt_pairs([*train, *test])
    links = align(pairs, timeout_s=timeout_s, options=options)[len(train) :]
    return NTAlignment(len(train), tuple(test), tuple(links), tuple(renumber[len(train) :]), cfg)


def nt_scores(
    aligned: NTAlignment,
    heuristic: str = DEFAULT,
    *,
    n_scored: int | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> tuple[dict[str, Estimate], dict[str, int]]:
    """One row: the scores of :func:`score` of ``heuristic``'s links on the first ``n_scored``
    test verses (all with None), and its counts: ``train_verses``, ``test_verses`` (those
    scored), ``gold_links``, ``eflomal_links``.

    Raises:
        KeyError: an unknown heuristic.
    """
    hyps, golds = aligned.scored(heuristic, n_scored)
    counts = {
        "train_verses": aligned.train_verses,
        "test_verses": len(golds),
        "gold_links": sum(map(len, golds)),
        "eflomal_links": sum(map(len, hyps)),
    }
    return score(hyps, golds, resamples=resamples, seed=seed), counts


def nt_reference(
    nt_files=None,
    cfg=None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    resamples: int = 1000,
    seed: int = 0,
    options: Sequence[str] = (),
    n_scored: int | None = None,
) -> tuple[dict[str, Estimate], dict[str, int]]:
    """eflomal on task ``nt-greek-english`` (:func:`nt_align`), symmetrised with
    grow-diag-final-and, scored on the test verses against the gold (:func:`nt_scores`).

    Args:
        nt_files: the data files (default: the installed package's).
        cfg: the task's data section (default: its defaults; its split and ``n_*`` apply).
        timeout_s, options: as :func:`align`.
        resamples, seed: of the bootstrap.
        n_scored: score only the first ``n_scored`` test verses (the examples a battery with
            ``ablation.n_examples`` analyses: the test examples in split order); eflomal still
            learns on every test verse's text. None: every test verse.

    Returns:
        (the scores of :func:`score`, counts: ``train_verses``, ``test_verses`` (those scored),
        ``gold_links``, ``eflomal_links``).

    Raises:
        DataError: the data (as :func:`attnstudy.data.nt.load_nt`).
        EflomalError: as :func:`align`.
    """
    aligned = nt_align(nt_files, cfg, timeout_s=timeout_s, options=options)
    return nt_scores(aligned, n_scored=n_scored, resamples=resamples, seed=seed)


TABLE_COLUMNS = ("aligner", "test verses", "gold links", "links", "AER", "precision", "recall")
"""The columns of :func:`nt_rows` (``AER`` = 1 − F1 here: the gold has sure links only)."""


def nt_rows(
    aligned: NTAlignment,
    *,
    n_scored: Sequence[int | None] = (None,),
    resamples: int = 1000,
    seed: int = 0,
) -> list[dict[str, str]]:
    """Every aligner row of one eflomal run: each heuristic of
    :data:`~attnstudy.data.symmetrise.SYMMETRISATIONS` scored on the same test verses, for each
    number of verses in ``n_scored`` (None: every test verse), as cell text (:data:`TABLE_COLUMNS`;
    ``value [low, high]``, the report's three significant digits)."""
    rows = []
    for n in n_scored:
        for name in SYMMETRISATIONS:
            scores, counts = nt_scores(aligned, name, n_scored=n, resamples=resamples, seed=seed)
            rows.append(
                {
                    "aligner": f"eflomal, {name}",
                    "test verses": f"{counts['test_verses']:,}",
                    "gold links": f"{counts['gold_links']:,}",
                    "links": f"{counts['eflomal_links']:,}",
                    "AER": cell(scores["aer"]),
                    "precision": cell(scores["precision"]),
                    "recall": cell(scores["recall"]),
                }
            )
    return rows


def format_table(rows: Sequence[dict[str, str]]) -> str:
    """Rows (:func:`nt_rows`, or any dicts of cell text) as a Markdown table."""
    header = list(rows[0]) if rows else list(TABLE_COLUMNS)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r[h] for h in header) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, rows: Sequence[dict[str, str]]) -> None:
    """Rows of cell text as a CSV file (header from the first row), as ``attnstudy report
    --results`` writes its tables (read back by :func:`attnstudy.report.results.read_rows`)."""
    import csv

    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


OUT_FILES = {
    "rows": "nt-greek-english-eflomal.csv",
    "pos": "nt-greek-english-eflomal-pos.csv",
    "shape": "nt-greek-english-eflomal-shape.csv",
}
"""The tables ``--out-dir`` writes: every aligner row, and grow-diag-final-and's breakdowns by
the Greek word's part of speech and by the gold link's shape (:mod:`attnstudy.data.breakdowns`)."""


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m attnstudy.data.eflomal``: every aligner row of eflomal (forward, backward and
    each symmetrisation) on the test verses of ``nt-greek-english`` (default split): AER,
    precision and recall with intervals, printed as Markdown; with ``--out-dir`` written as the
    CSV files of :data:`OUT_FILES` with the breakdowns. Returns the exit code: 0 done, 2 data or
    command missing (or an output file exists), 1 eflomal failed."""
    p = argparse.ArgumentParser(prog="python -m attnstudy.data.eflomal", description=main.__doc__)
    p.add_argument(
        "--out-dir", type=Path, help="write the tables here (refused if one of them exists)"
    )
    p.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds (default %(default)s)"
    )
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--n-scored",
        type=int,
        action="append",
        help="also score only the first N test verses (a battery's ablation.n_examples); repeatable",
    )
    args = p.parse_args(argv)
    if args.out_dir is not None:
        there = [f for f in OUT_FILES.values() if (args.out_dir / f).exists()]
        if there:
            print(
                f"attnstudy: error: {args.out_dir / there[0]} exists; name a new folder",
                file=sys.stderr,
            )
            return 2
    try:
        aligned = nt_align(timeout_s=args.timeout)
    except DataError as err:
        print(f"attnstudy: error: {err}", file=sys.stderr)
        return 2
    except EflomalError as err:
        print(f"attnstudy: error: {err}", file=sys.stderr)
        return 2 if isinstance(err, EflomalMissing) else 1
    n_scored = [None, *(args.n_scored or [])]
    rows = nt_rows(aligned, n_scored=n_scored, resamples=args.resamples, seed=args.seed)
    print(format_table(rows), end="")
    print(f"train verses {aligned.train_verses:,}, test verses {len(aligned.test):,}")
    if args.out_dir is not None:
        from attnstudy.data import breakdowns

        args.out_dir.mkdir(parents=True, exist_ok=True)
        write_csv(args.out_dir / OUT_FILES["rows"], rows)
        pos, shape = breakdowns.eflomal_breakdowns(
            aligned, n_scored=n_scored, resamples=args.resamples, seed=args.seed
        )
        write_csv(args.out_dir / OUT_FILES["pos"], pos)
        write_csv(args.out_dir / OUT_FILES["shape"], shape)
        print(format_table(pos), end="")
        print(format_table(shape), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
