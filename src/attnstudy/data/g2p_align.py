"""Letter↔phone reference alignments for CMUdict: a many-to-many EM aligner.

The method of m2m-aligner and Phonetisaurus (Jiampojamarn, Kondrak & Sherif 2007,
"Applying Many-to-Many Alignments and Hidden Markov Models to Letter-to-Phoneme Conversion",
NAACL): a word and its pronunciation are segmented into aligned chunks of 1–2 letters and
0–2 phones — ``1-0`` (a silent letter), ``1-1``, ``1-2`` (``x}K|S``) and ``2-1`` (``p|h}F``);
no chunk without letters and, as Phonetisaurus' ``--restrict``, no ``2-2`` chunk. The joint
chunk probabilities are learnt by EM with forward-backward expected counts over the
training pairs, and each pair is then segmented by Viterbi.

Links: a chunk of ``a`` letters and ``b`` phones gives all ``a × b`` links; a one-to-one
chunk gives a sure link, a larger chunk possible links (an argmax alignment cannot express
``e|r}ER`` and should not be penalised for it); a silent letter gives none. A pair that no
segmentation can explain (more than two phones per letter) gets one chunk of everything, all
links possible.

The dynamic programmes run vectorised over all pairs of the same (letters, phones) length
with numpy, so EM on the whole CMUdict training split takes seconds. Results are cached on
disk per split version (salt, sizes, stress, dictionary text) and aligner parameters, in
``$ATTNSTUDY_CACHE`` or ``~/.cache/attnstudy`` (``$XDG_CACHE_HOME`` respected), written
atomically. ``phonetisaurus-align`` (the optional ``align`` extra) is a second backend.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from attnstudy.data.alignment import Alignment
from attnstudy.runtime.notices import notice

VERSION = 1
OPS: tuple[tuple[int, int], ...] = ((1, 0), (1, 1), (1, 2), (2, 1))
ITERATIONS = 5
CHUNK_PENALTY = 1.0  # Viterbi log-score penalty per extra symbol in a chunk

Pair = tuple[str, tuple[str, ...]]
Chunks = tuple[tuple[int, int], ...]  # (letters, phones) per chunk, in order


class AlignerError(RuntimeError):
    """The aligner cannot run (e.g. ``phonetisaurus-align`` is not installed)."""


# ----------------------------------------------------------------------------- EM aligner


class M2MAligner:
    """Many-to-many EM aligner over (letters, phones) pairs.

    Attributes:
        ops: allowed chunk shapes ``(letters, phones)``.
        prob: joint chunk probabilities, a dense array indexed by :meth:`_key` codes.
    """

    def __init__(self, ops: Sequence[tuple[int, int]] = OPS) -> None:
        if any(a < 1 or a > 2 or b < 0 or b > 2 for a, b in ops):
            raise ValueError(f"chunk shapes must have 1–2 letters and 0–2 phones, got {ops}")
        self.ops = tuple(ops)
        self.letters: dict[str, int] = {}
        self.phones: dict[str, int] = {}
        self.prob: np.ndarray | None = None
        self.chunk_penalty = CHUNK_PENALTY

    # symbol codes: 0 = nothing, 1..n single symbols, (n+1)·s1 + s2 ≥ n+2 for two symbols
    def _index(self, pairs: Iterable[Pair], grow: bool) -> None:
        for word, pron in pairs:
            for c in word:
                if c not in self.letters and grow:
                    self.letters[c] = len(self.letters) + 1
            for p in pron:
                if p not in self.phones and grow:
                    self.phones[p] = len(self.phones) + 1

    @property
    def _bases(self) -> tuple[int, int]:
        return len(self.letters) + 1, len(self.phones) + 1

    def _groups(self, pairs: Sequence[Pair]):
        """Pairs grouped by (letters, phones) length: (indices, X, Y) with 1-based codes."""
        by_shape: dict[tuple[int, int], list[int]] = defaultdict(list)
        for k, (word, pron) in enumerate(pairs):
            by_shape[len(word), len(pron)].append(k)
        for (n, m), idx in by_shape.items():
            X = np.array(
                [[self.letters.get(c, 0) for c in pairs[k][0]] for k in idx], dtype=np.int64
            ).reshape(len(idx), n)
            Y = np.array(
                [[self.phones.get(p, 0) for p in pairs[k][1]] for k in idx], dtype=np.int64
            ).reshape(len(idx), m)
            yield np.array(idx), X, Y

    def _codes(self, X: np.ndarray, Y: np.ndarray) -> dict[tuple[int, int, int, int], np.ndarray]:
        """Chunk codes per (i, j, a, b): the chunk X[i-a:i] ↔ Y[j-b:j] of every pair."""
        bx, by = self._bases
        n, m = X.shape[1], Y.shape[1]
        out = {}
        for i in range(n + 1):
            for j in range(m + 1):
                for a, b in self.ops:
                    if a > i or b > j:
                        continue
                    xc = X[:, i - 1] if a == 1 else (bx * X[:, i - 2] + X[:, i - 1])
                    yc = (
                        np.zeros_like(xc)
                        if b == 0
                        else Y[:, j - 1]
                        if b == 1
                        else (by * Y[:, j - 2] + Y[:, j - 1])
                    )
                    out[i, j, a, b] = xc * (by * by) + yc
        return out

    def _size(self) -> int:
        bx, by = self._bases
        return bx * bx * by * by

    def _forward_backward(self, codes, n, m, rows, prob):
        alpha = np.zeros((rows, n + 1, m + 1))
        alpha[:, 0, 0] = 1.0
        for i in range(1, n + 1):
            for j in range(m + 1):
                acc = alpha[:, i, j]
                for a, b in self.ops:
                    if a <= i and b <= j:
                        acc += alpha[:, i - a, j - b] * prob[codes[i, j, a, b]]
        beta = np.zeros((rows, n + 1, m + 1))
        beta[:, n, m] = 1.0
        for i in range(n - 1, -1, -1):
            for j in range(m, -1, -1):
                acc = beta[:, i, j]
                for a, b in self.ops:
                    if i + a <= n and j + b <= m:
                        acc += beta[:, i + a, j + b] * prob[codes[i + a, j + b, a, b]]
        return alpha, beta

    def fit(self, pairs: Sequence[Pair], iterations: int = ITERATIONS) -> M2MAligner:
        """Learn the chunk probabilities by EM (uniform start, joint normalisation)."""
        self._index(pairs, grow=True)
        prob = np.ones(self._size())
        groups = [
            (idx, X.shape[1], Y.shape[1], self._codes(X, Y)) for idx, X, Y in self._groups(pairs)
        ]
        for _ in range(iterations):
            counts = np.zeros_like(prob)
            for idx, n, m, codes in groups:
                alpha, beta = self._forward_backward(codes, n, m, len(idx), prob)
                z = alpha[:, n, m]
                ok = z > 0
                if not ok.any():
                    continue
                inv = np.where(ok, 1.0 / np.where(ok, z, 1.0), 0.0)
                for (i, j, a, b), c in codes.items():
                    w = alpha[:, i - a, j - b] * prob[c] * beta[:, i, j] * inv
                    np.add.at(counts, c, w)
            prob = counts / counts.sum()
        self.prob = prob
        return self

    def align(self, pairs: Sequence[Pair]) -> list[Chunks | None]:
        """Viterbi segmentation of each pair (``None`` if no segmentation explains it)."""
        if self.prob is None:
            raise AlignerError("M2MAligner.align before fit")
        logp = np.log(np.where(self.prob > 0, self.prob, 1e-300))
        # a multi-symbol chunk replaces several chunks, each a factor < 1: without a penalty
        # Viterbi prefers long chunks (``m|a}M n}AH|N``); Phonetisaurus penalises them too
        penalty = [self.chunk_penalty * max(a + b - 2, 0) for a, b in self.ops]
        out: list[Chunks | None] = [None] * len(pairs)
        for idx, X, Y in self._groups(pairs):
            n, m = X.shape[1], Y.shape[1]
            rows = len(idx)
            codes = self._codes(X, Y)
            # unknown symbols (code 0 inside a chunk) get the floor probability
            delta = np.full((rows, n + 1, m + 1), -np.inf)
            delta[:, 0, 0] = 0.0
            back = np.full((rows, n + 1, m + 1), -1, dtype=np.int8)
            for i in range(1, n + 1):
                for j in range(m + 1):
                    for k, (a, b) in enumerate(self.ops):
                        if a <= i and b <= j:
                            s = delta[:, i - a, j - b] + logp[codes[i, j, a, b]] - penalty[k]
                            better = s > delta[:, i, j]
                            delta[better, i, j] = s[better]
                            back[better, i, j] = k
            for r, k in enumerate(idx):
                if not np.isfinite(delta[r, n, m]):
                    continue
                chunks = []
                i, j = n, m
                while i or j:
                    a, b = self.ops[back[r, i, j]]
                    chunks.append((a, b))
                    i, j = i - a, j - b
                out[k] = tuple(reversed(chunks))
        return out


# ----------------------------------------------------------------------------- links


@functools.lru_cache(maxsize=65536)
def chunks_to_alignment(chunks: Chunks | None, n_letters: int, n_phones: int) -> Alignment:
    """Links of a segmentation: 1–1 chunks sure, larger chunks possible, ``a``–0 none.

    ``None`` (no segmentation) gives every letter–phone link as possible.
    """
    if chunks is None:
        every = frozenset((i, j) for i in range(n_letters) for j in range(n_phones))
        return Alignment(sure=frozenset(), possible=every)
    sure, possible = set(), set()
    i = j = 0
    for a, b in chunks:
        links = {(i + s, j + t) for s in range(a) for t in range(b)}
        possible |= links
        if a == 1 and b == 1:
            sure |= links
        i, j = i + a, j + b
    if (i, j) != (n_letters, n_phones):
        raise ValueError(f"segmentation covers ({i}, {j}), not ({n_letters}, {n_phones})")
    return Alignment(sure=frozenset(sure), possible=frozenset(possible))


def format_chunks(word: str, pron: Sequence[str], chunks: Chunks | None) -> str:
    """Phonetisaurus notation, e.g. ``p|h}F o}OW n}N e}_``."""
    if chunks is None:
        return "|".join(word) + "}" + "|".join(pron)
    parts, i, j = [], 0, 0
    for a, b in chunks:
        parts.append("|".join(word[i : i + a]) + "}" + ("|".join(pron[j : j + b]) or "_"))
        i, j = i + a, j + b
    return " ".join(parts)


# ----------------------------------------------------------------------------- phonetisaurus


def phonetisaurus_binary() -> str | None:
    """Path of ``phonetisaurus-align`` (the ``align`` extra), or ``None``."""
    found = shutil.which("phonetisaurus-align")
    if found:
        return found
    try:
        import phonetisaurus  # noqa: F401  (the bindings ship the binary inside the package)
    except ImportError:
        return None
    path = Path(phonetisaurus.__file__).parent / "bin" / "phonetisaurus-align"
    return str(path) if path.is_file() else None


def _parse_chunk_line(line: str) -> tuple[str, tuple[str, ...], Chunks]:
    word, pron, chunks = [], [], []
    for tok in line.split():
        left, right = tok.rsplit("}", 1)
        ls = [] if left == "_" else left.split("|")
        ps = [] if right == "_" else right.split("|")
        word += ls
        pron += ps
        chunks.append((len(ls), len(ps)))
    return "".join(word), tuple(pron), tuple(chunks)


def phonetisaurus_align(pairs: Sequence[Pair], iterations: int = 11) -> list[Chunks | None]:
    """Align with ``phonetisaurus-align`` (1–2 letters to 0–2 phones, no phone insertions).

    Raises:
        AlignerError: if the binary is missing or fails.
    """
    binary = phonetisaurus_binary()
    if binary is None:
        raise AlignerError(
            "data.g2p_aligner = 'phonetisaurus' needs phonetisaurus-align; "
            "run: pip install 'attnstudy[align]' (x86-64 Linux wheels only)"
        )
    with tempfile.TemporaryDirectory(prefix="attnstudy-ps-") as tmp:
        src, dst = Path(tmp) / "in.tsv", Path(tmp) / "out.txt"
        src.write_text("".join(f"{w}\t{' '.join(p)}\n" for w, p in pairs), encoding="utf-8")
        cmd = [
            binary,
            f"--input={src}",
            f"--ofile={dst}",
            "--seq1_max=2",
            "--seq2_max=2",
            "--seq1_del=true",
            "--seq2_del=false",
            f"--iter={iterations}",
            f"--tmpdir={tmp}",
        ]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0 or not dst.is_file():
            raise AlignerError(
                f"phonetisaurus-align failed ({run.returncode}): {run.stderr.strip()[-300:]}"
            )
        found: dict[Pair, Chunks] = {}
        for line in dst.read_text(encoding="utf-8").splitlines():
            if line.strip():
                w, p, c = _parse_chunk_line(line)
                found.setdefault((w, p), c)
    return [found.get((w, tuple(p))) for w, p in pairs]


# ----------------------------------------------------------------------------- cache


def cache_dir() -> Path:
    """``$ATTNSTUDY_CACHE``, else ``$XDG_CACHE_HOME/attnstudy``, else ``~/.cache/attnstudy``."""
    env = os.environ.get("ATTNSTUDY_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnstudy"


def cache_key(split_version: str, aligner: str, **params: object) -> str:
    """SHA-256 (24 hex digits) of the split version, the aligner and its parameters."""
    blob = repr((VERSION, split_version, aligner, sorted(params.items()))).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cached_alignments(
    train: Sequence[Pair],
    others: Sequence[Pair],
    split_version: str,
    aligner: str = "em",
    directory: Path | None = None,
) -> dict[Pair, Chunks | None]:
    """Segmentations of every pair, learnt on ``train`` and applied to ``train + others``.

    The result is cached in ``directory`` (default :func:`cache_dir`) under a key of the
    split version (which must name everything the pairs depend on) and the aligner; a
    corrupt or unreadable cache file (one nested too deeply for ``json``, or decompressing to more
    than :data:`MAX_CACHE_BYTES`, too) is recomputed with a note naming it.

    Raises:
        AlignerError: for an unknown aligner, or if phonetisaurus is asked for and missing.
    """
    if aligner == "em":
        params = {"ops": OPS, "iterations": ITERATIONS, "penalty": CHUNK_PENALTY}
    elif aligner == "phonetisaurus":
        params = {"iterations": 11, "seq1_max": 2, "seq2_max": 2}
    else:
        raise AlignerError(f"unknown g2p aligner {aligner!r}; use 'em' or 'phonetisaurus'")
    path = (
        directory or cache_dir() / "g2p_align"
    ) / f"{cache_key(split_version, aligner, **params)}.json.gz"
    if path.exists():
        try:
            return _read_cache(path)
        except (OSError, EOFError, ValueError, TypeError, zlib.error, RecursionError) as err:
            # RecursionError: json.loads of arrays nested deeper than Python's recursion limit
            reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
            reason = " ".join(reason.split())[:120]
            notice(
                f"the G2P alignment cache {path} is unreadable ({type(err).__name__}"
                f"{': ' + reason if reason else ''}); rebuilding it"
            )
    everything = list(dict.fromkeys([*train, *others]))
    if aligner == "em":
        model = M2MAligner(OPS).fit(list(dict.fromkeys(train)), ITERATIONS)
        chunks = model.align(everything)
    else:
        # phonetisaurus learns on the file it aligns: give it train + others, like a corpus
        chunks = phonetisaurus_align(everything)
    result = dict(zip(everything, chunks))
    rows = [
        [w, list(p), None if c is None else [list(ab) for ab in c]] for (w, p), c in result.items()
    ]
    _atomic_write(path, gzip.compress(json.dumps(rows, separators=(",", ":")).encode(), mtime=0))
    return result


MAX_CACHE_BYTES = 128 * 2**20
"""The most a cache file may decompress to: ten times the cache of all of CMUdict (12 MB of
JSON); a file that decompresses to more (a gzip bomb) is rebuilt, never read whole."""


def _read_cache(path: Path) -> dict[Pair, Chunks | None]:
    """Parse a cache file written by :func:`cached_alignments`: gzip'd JSON data, never code.

    Raises:
        ValueError: the content is not ``[[word, [phone, …], [[a, b], …] | null], …]``, or it
            decompresses to more than :data:`MAX_CACHE_BYTES`.
        RecursionError: JSON nested deeper than Python's recursion limit.
        OSError, EOFError, zlib.error: not a whole gzip file.
    """
    with gzip.open(path, "rb") as f:
        data = f.read(MAX_CACHE_BYTES + 1)
    if len(data) > MAX_CACHE_BYTES:
        raise ValueError(f"it decompresses to more than {MAX_CACHE_BYTES // 2**20} MiB")
    rows = json.loads(data.decode("utf-8"))
    if not isinstance(rows, list):
        raise ValueError("not a list")
    out: dict[Pair, Chunks | None] = {}
    for row in rows:
        if not (
            isinstance(row, list)
            and len(row) == 3
            and isinstance(row[0], str)
            and isinstance(row[1], list)
            and all(isinstance(x, str) for x in row[1])
        ):
            raise ValueError("bad row")
        chunks = row[2]
        if chunks is not None:
            if not (
                isinstance(chunks, list)
                and all(
                    isinstance(c, list)
                    and len(c) == 2
                    and all(type(v) is int and 0 <= v <= 8 for v in c)
                    for c in chunks
                )
            ):
                raise ValueError("bad segmentation")
            chunks = tuple((a, b) for a, b in chunks)
        out[(row[0], tuple(row[1]))] = chunks
    return out


def link_agreement(a: Sequence[Alignment], b: Sequence[Alignment]) -> dict[str, float]:
    """Link-level agreement of two aligners: F1 of all links, F1 of sure links, exact rate."""

    def f1(x: set, y: set) -> float:
        return 2 * len(x & y) / (len(x) + len(y)) if (x or y) else 1.0

    pa = set().union(*({(k, i, j) for i, j in al.possible} for k, al in enumerate(a)))
    pb = set().union(*({(k, i, j) for i, j in al.possible} for k, al in enumerate(b)))
    sa = set().union(*({(k, i, j) for i, j in al.sure} for k, al in enumerate(a)))
    sb = set().union(*({(k, i, j) for i, j in al.sure} for k, al in enumerate(b)))
    exact = sum(x == y for x, y in zip(a, b)) / max(len(a), 1)
    return {"f1_links": f1(pa, pb), "f1_sure": f1(sa, sb), "exact": exact, "n": len(a)}
