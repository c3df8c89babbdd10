"""eflomal (Östling & Tiedemann 2016, "Efficient Word Alignment with Markov Chain Monte Carlo",
PBML 106) as the reference aligner of task ``nt-greek-english``, and its AER, precision and recall
on the test verses against Biblica's manual gold.

eflomal is GPL-3.0: it is run as the ``eflomal-align`` command in a subprocess (with a timeout),
never imported. One call aligns both directions (``-f`` forward, ``-r`` reverse, both written
``source-target``); :func:`attnstudy.data.symmetrise.grow_diag_final_and` joins them. As statistical
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
import math
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnstudy.data.symmetrise import grow_diag_final_and
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
        return grow_diag_final_and(self.forward, self.reverse)


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


@dataclass(frozen=True)
class Estimate:
    """A corpus statistic with its 95 % percentile bootstrap interval (verses resampled)."""

    value: float
    low: float
    high: float


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
    (:func:`attnstudy.estimates.ratio_ci`, seeded by ``seed``, as the battery's statistics).
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

    from attnstudy.estimates import ratio_ci

    if len(hypotheses) != len(gold):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(gold)} gold sentences")
    hit = np.array([len(set(a) & set(s)) for a, s in zip(hypotheses, gold)], float)
    n_hyp = np.array([len(a) for a in hypotheses], float)
    n_sure = np.array([len(s) for s in gold], float)
    out = {}
    for name, num, den, transform in (
        ("aer", 2 * hit, n_hyp + n_sure, lambda r: 1.0 - r),
        ("precision", hit, n_hyp, None),
        ("recall", hit, n_sure, None),
    ):
        r = ratio_ci(num, den, resamples=resamples, seed=seed, transform=transform)
        out[name] = Estimate(math.nan, math.nan, math.nan) if r is None else Estimate(*r)
    return out


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
    """eflomal on task ``nt-greek-english``: trained on the training verses plus the test verses'
    text, symmetrised (grow-diag-final-and), scored on the test verses against the gold.

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
    from attnstudy.config import data_config
    from attnstudy.data import nt

    nt_files = nt_files or nt.package_files()
    cfg = cfg or data_config(task=nt.TASK)
    parts = nt.split_verses(nt.read_corpus(nt_files), cfg)
    train, test = parts["train"], parts["test"]
    pairs, renumber = nt_pairs([*train, *test])
    links = align(pairs, timeout_s=timeout_s, options=options)[len(train) :]
    if n_scored is not None:
        test = test[:n_scored]
    hyps, golds = [], []
    for v, d, ren in zip(test, links, renumber[len(train) :]):
        hyps.append({(i, ren[j]) for i, j in d.symmetrised if j in ren})
        golds.append({(i, ren[j]) for i, j in v.links})
    counts = {
        "train_verses": len(train),
        "test_verses": len(test),
        "gold_links": sum(map(len, golds)),
        "eflomal_links": sum(map(len, hyps)),
    }
    return score(hyps, golds, resamples=resamples, seed=seed), counts


def format_table(scores: dict[str, Estimate], counts: dict[str, int]) -> str:
    """The scores as a Markdown table (one row: eflomal, grow-diag-final-and)."""
    cells = [f"{e.value:.3f} [{e.low:.3f}, {e.high:.3f}]" for e in scores.values()]
    return (
        "| aligner | test verses | AER (= 1 − F1) | precision | recall |\n"
        "|---|---|---|---|---|\n"
        f"| eflomal, grow-diag-final-and | {counts['test_verses']:,} | "
        + " | ".join(cells)
        + " |\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m attnstudy.data.eflomal``: eflomal's AER, precision and recall on the test
    verses of ``nt-greek-english`` (default split), printed as Markdown and, with ``--out``,
    written as CSV. Returns the exit code: 0 done, 2 data or command missing, 1 eflomal failed."""
    p = argparse.ArgumentParser(prog="python -m attnstudy.data.eflomal", description=main.__doc__)
    p.add_argument("--out", type=Path, help="write the table as CSV here (refused if it exists)")
    p.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds (default %(default)s)"
    )
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.out is not None and args.out.exists():
        print(f"attnstudy: error: {args.out} exists; name a new file", file=sys.stderr)
        return 2
    try:
        scores, counts = nt_reference(
            timeout_s=args.timeout, resamples=args.resamples, seed=args.seed
        )
    except DataError as err:
        print(f"attnstudy: error: {err}", file=sys.stderr)
        return 2
    except EflomalError as err:
        print(f"attnstudy: error: {err}", file=sys.stderr)
        return 2 if isinstance(err, EflomalMissing) else 1
    print(format_table(scores, counts), end="")
    print(", ".join(f"{k} {v:,}" for k, v in counts.items()))
    if args.out is not None:
        rows = ["statistic,value,ci_low,ci_high"] + [
            f"{k},{e.value!r},{e.low!r},{e.high!r}" for k, e in scores.items()
        ]
        rows += [f"{k},{v},," for k, v in counts.items()]
        args.out.write_text("\n".join(rows) + "\n", "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
