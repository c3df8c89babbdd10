"""Counter-based random streams of the battery (``rng = "counter-1"``, docs/design.md §4).

Every random draw of an ablation belongs to a stream named by (ablation seed, example id, decoder
step, purpose): the purpose is the ablation's name or a part of it (``"permutation"``,
``"erase_random"``, ``"faithfulness"``, ``"adversarial"``, ``"permutation_global"``; contrastive
draws from the ``"permutation"`` streams on purpose, so its permutations are the permutation
ablation's first ones). The stream's 64-bit **key** is the first 8 bytes (little-endian) of
SHA-256("seed|example id|step|purpose"); its j-th 32-bit **word** is word j mod 4 of

    Philox4x32-10(counter = (⌊j/4⌋ mod 2³², ⌊j/4⌋ div 2³², 0, 0), key = (key mod 2³², key div 2³²))

(Salmon, Moraes, Dror & Shaw 2011, "Parallel random numbers: as easy as 1, 2, 3", SC'11; the
Random123 constants). A word is a function of its key and its index alone, so the draws of many
streams are computed in one vectorised call (:func:`words`) and do not depend on which other
streams are drawn with them, in which order, in which batch, worker or process. The 64-bit key
keeps the hash's first 64 bits (the legacy scheme's ``torch.Generator`` keeps only the low 32 bits
of its seed, so two of n streams collide with probability ≈ n²/2³³; here ≈ n²/2⁶⁵).

What is made of the words:

* a **permutation** of k items (:func:`permutations`): the stable argsort of k words; row r of a
  step's R permutations uses words r·k … r·k + k − 1 (a permutation ablation's replacement p and
  head h is row p·H + h; erasure's and faithfulness' random order i is row i), so the first R'
  rows of a stream do not depend on R;
* a **uniform** in [0, 1) (:func:`uniforms`): uniform j from words 2j and 2j + 1, 53 bits
  (⌊w₂ⱼ / 2⁵⌋ · 2²⁶ + ⌊w₂ⱼ₊₁ / 2⁶⌋) / 2⁵³, as numpy's ``random()`` builds a double;
* a **standard normal** (:func:`normals`): the inverse normal CDF of uniform j moved to the
  middle of its 2⁻⁵³ cell (``scipy.special.ndtri``), float64.

The legacy scheme (``rng = "legacy"``: one ``torch.Generator`` reseeded per step and purpose,
:func:`attnstudy.analysis.batch.step_generator`) is kept unchanged: it is how the runs stored
before the setting existed were made, and a stored run without ``ablation.rng`` is one of them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

COUNTER_1 = "counter-1"
"""The counter-based scheme of this module (the default of new runs)."""
LEGACY = "legacy"
"""One ``torch.Generator`` reseeded per (seed, example, step, purpose): runs stored before
``ablation.rng`` existed."""
RNG_SCHEMES = (COUNTER_1, LEGACY)

PHILOX_M = (0xD2511F53, 0xCD9E8D57)
"""Philox4x32 round multipliers (Salmon et al. 2011, Table 2; Random123 ``PHILOX_M4x32_0/1``)."""
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
"""Philox4x32 key increments (Weyl sequence; Random123 ``PHILOX_W32_0/1``)."""
PHILOX_ROUNDS = 10

_MASK = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)
_BLOCK = 1 << 14
"""Counters per pass of :func:`philox4x32` (the round's temporaries stay in the cache)."""


def philox4x32(counter: np.ndarray, key: np.ndarray, rounds: int = PHILOX_ROUNDS) -> np.ndarray:
    """The Philox4x32 bijection (Salmon et al. 2011, §4.3): ``rounds`` rounds of two 32 × 32 → 64
    bit multiplies, the key bumped by :data:`PHILOX_W` between rounds.

    Args:
        counter: integers in [0, 2³²), shape (N, 4). key: integers in [0, 2³²), shape (N, 2)
            (or (2,), one key for every counter).
        rounds: 10 for Philox4x32-10 (the Random123 default, whose known answers the tests
            check).

    Returns:
        uint32 (N, 4).

    Raises:
        ValueError: a bad shape.
    """
    counter = np.asarray(counter)
    if counter.ndim != 2 or counter.shape[1] != 4:
        raise ValueError(f"counter must be (N, 4), got {counter.shape}")
    key = np.broadcast_to(np.asarray(key), (counter.shape[0], 2))
    c = [counter[:, i].astype(np.uint64) for i in range(4)]
    return _philox(c, key[:, 0].astype(np.uint64), key[:, 1].astype(np.uint64), rounds)


def _philox(
    counter: list[np.ndarray], k0: np.ndarray, k1: np.ndarray, rounds: int = PHILOX_ROUNDS
) -> np.ndarray:
    """:func:`philox4x32` on its words: counter words c0…c3 and key words k0, k1, each uint64
    (N,) below 2³² (a c1…c3 of shape () is a constant word). Passes of :data:`_BLOCK` counters,
    in place. Returns uint32 (N, 4)."""
    n = len(k0)
    out = np.empty((n, 4), np.uint32)
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    w0, w1 = np.uint64(PHILOX_W[0]), np.uint64(PHILOX_W[1])
    for lo in range(0, n, _BLOCK):
        hi = min(n, lo + _BLOCK)
        c0, c1, c2, c3 = (
            np.array(np.broadcast_to(w if w.ndim == 0 else w[lo:hi], (hi - lo,)), np.uint64)
            for w in counter
        )
        x0, x1 = k0[lo:hi].copy(), k1[lo:hi].copy()
        p0, p1 = np.empty_like(c0), np.empty_like(c0)
        for r in range(rounds):
            if r:
                x0 += w0
                x0 &= _MASK
                x1 += w1
                x1 &= _MASK
            # (hi0, lo0) = M0 · c0, (hi1, lo1) = M1 · c2; c ← (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
            np.multiply(c0, m0, out=p0)
            np.multiply(c2, m1, out=p1)
            np.right_shift(p1, _32, out=c0)
            c0 ^= c1
            c0 ^= x0
            np.right_shift(p0, _32, out=c2)
            c2 ^= c3
            c2 ^= x1
            np.bitwise_and(p1, _MASK, out=c1)
            np.bitwise_and(p0, _MASK, out=c3)
        block = out[lo:hi]
        block[:, 0], block[:, 1], block[:, 2], block[:, 3] = c0, c1, c2, c3
    return out


def _blocks(keys: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """Philox blocks 0 … ``blocks[n]`` − 1 of every stream n, concatenated in stream order: uint32
    (4 · blocks.sum(),), stream n's words 0 … 4 · blocks[n] − 1 in order."""
    total = int(blocks.sum())
    starts = np.cumsum(blocks) - blocks
    index = np.arange(total, dtype=np.uint64) - np.repeat(starts, blocks).astype(np.uint64)
    owner = np.repeat(keys, blocks)
    zero = np.zeros((), np.uint64)
    counter = [index & _MASK, index >> _32, zero, zero]
    return _philox(counter, owner & _MASK, owner >> _32).reshape(-1)


def stream_key(seed: int, example_id: str, step: int, purpose: str) -> int:
    """The 64-bit key of one stream: the first 8 bytes of SHA-256("seed|example id|step|purpose"),
    little-endian (the legacy seed, :func:`attnstudy.analysis.batch.step_seed`, is the same
    hash with its top bit cleared)."""
    digest = hashlib.sha256(f"{seed}|{example_id}|{step}|{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def stream_keys(
    seed: int, example_ids: Sequence[str], steps: Sequence[int], purpose: str
) -> np.ndarray:
    """:func:`stream_key` of each (example id, step) pair: uint64 (N,)."""
    return np.fromiter(
        (stream_key(seed, e, int(t), purpose) for e, t in zip(example_ids, steps, strict=True)),
        dtype=np.uint64,
        count=len(example_ids),
    )


def words(keys: np.ndarray, counts: int | np.ndarray) -> np.ndarray:
    """The first words of every stream, in one Philox call.

    Args:
        keys: uint64 (N,), the streams' keys (:func:`stream_keys`).
        counts: how many words of each stream: an int (the same for all) or int (N,).

    Returns:
        uint32 (N, counts) for an int; for an array, the streams' words concatenated in stream
        order (``counts.sum()`` words), as a flat array.

    Raises:
        ValueError: a negative count.
    """
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    counts_arr = np.broadcast_to(np.asarray(counts, dtype=np.int64), keys.shape)
    if bool((counts_arr < 0).any()):
        raise ValueError("word counts must be non-negative")
    blocks = (counts_arr + 3) // 4  # (N,) Philox blocks per stream
    drawn = _blocks(keys, blocks)  # (4 · total,), each stream's words in order
    if np.ndim(counts) == 0:
        m = int(np.asarray(counts))
        return drawn.reshape(len(keys), 4 * ((m + 3) // 4))[:, :m]
    starts = np.cumsum(blocks) - blocks
    within = np.arange(len(drawn)) - np.repeat(4 * starts, 4 * blocks)
    return drawn[within < np.repeat(counts_arr, 4 * blocks)]


def _doubles(w: np.ndarray) -> np.ndarray:
    """53-bit integers from word pairs: (..., 2m) uint32 → (..., m) float64 in [0, 2⁵³)."""
    a = (w[..., 0::2] >> np.uint32(5)).astype(np.float64)
    b = (w[..., 1::2] >> np.uint32(6)).astype(np.float64)
    return a * 67108864.0 + b


def uniforms(keys: np.ndarray, counts: int | np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1) with 53 random bits: uniform j of a stream from its words 2j, 2j + 1.

    Args:
        keys: uint64 (N,). counts: uniforms per stream, an int or int (N,).

    Returns:
        float64 (N, counts), or the concatenation for an array of counts (as :func:`words`).
    """
    return _doubles(words(keys, 2 * np.asarray(counts, dtype=np.int64))) * 2.0**-53


def normals(keys: np.ndarray, counts: int | np.ndarray) -> np.ndarray:
    """Standard normals, normal j of a stream the inverse normal CDF of its uniform j (taken at
    the middle of its 2⁻⁵³ cell, so in (0, 1) and never infinite); float64, shaped as
    :func:`uniforms`."""
    from scipy.special import ndtri

    return ndtri((_doubles(words(keys, 2 * np.asarray(counts, dtype=np.int64))) + 0.5) * 2.0**-53)


def permutations(keys: np.ndarray, rows: int, lengths: np.ndarray, width: int) -> np.ndarray:
    """``rows`` random permutations of each stream's first ``lengths[n]`` items, in one call.

    Row r of stream n is the stable argsort of the stream's words r·k … r·k + k − 1 (k =
    ``lengths[n]``; equal words keep their order), followed by k, …, ``width`` − 1. The streams
    are drawn in one Philox call, grouped by k (a stream's words do not depend on the others),
    and each group's rows are sorted at once as 64-bit keys (word · 2³² + column, one
    ``np.sort`` of k-wide rows per k).

    Args:
        keys: uint64 (N,). rows: permutations per stream (R). lengths: int (N,), 0 ≤ k ≤ width.
        width: the columns of the result (T_x).

    Returns:
        int64 (N, R, width): ``out[n, r, i]`` is the item placed at position i.

    Raises:
        ValueError: a length outside [0, width].
    """
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if bool((lengths > width).any()) or bool((lengths < 0).any()):
        raise ValueError(f"lengths must lie in [0, {width}]")
    out = np.empty((len(lengths), rows, width), np.int64)
    out[...] = np.arange(width)
    by_length = np.argsort(lengths, kind="stable")
    ks = lengths[by_length]
    blocks = (rows * ks + 3) // 4
    drawn = _blocks(keys[by_length], blocks)  # grouped by k: each group's words contiguous
    firsts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]]) if len(ks) else []
    ends = np.r_[firsts[1:], len(ks)] if len(ks) else []
    offset = 0
    for lo, hi in zip(firsts, ends):
        k, m, nb = int(ks[lo]), int(hi - lo), int(blocks[lo])
        group = drawn[offset : offset + 4 * nb * m].reshape(m, 4 * nb)
        offset += 4 * nb * m
        if k < 2:  # one item or none: the identity
            continue
        sort_keys = group[:, : rows * k].reshape(m, rows, k).astype(np.uint64) << _32
        sort_keys |= np.arange(k, dtype=np.uint64)
        sort_keys.sort(axis=-1)
        sort_keys &= _MASK
        out[by_length[lo:hi], :, :k] = sort_keys
    return out


def permutations_loop(keys: np.ndarray, rows: int, lengths: np.ndarray, width: int) -> np.ndarray:
    """Plain per-stream reference of :func:`permutations` (one :func:`words` call and one
    ``np.argsort(kind="stable")`` per stream), the test oracle of the batched version."""
    out = np.broadcast_to(np.arange(width), (len(lengths), rows, width)).copy()
    for i, (key, k) in enumerate(zip(np.asarray(keys, np.uint64), np.asarray(lengths))):
        w = words(np.array([key], np.uint64), rows * int(k))[0].reshape(rows, int(k))
        out[i, :, : int(k)] = np.argsort(w, axis=-1, kind="stable")
    return out


@dataclass(frozen=True)
class CounterStreams:
    """The counter-based streams of some batch rows' steps for one purpose (the ``counter-1``
    counterpart of :class:`attnstudy.analysis.batch.StepStreams`).

    Row ``b`` of the slice is example ``example_ids[b]``; its step ``t`` is decoder step
    ``start + t``.

    Attributes:
        seed: the ablation seed. example_ids: the example id of each row. purpose: the streams'
        name (``"permutation"``). start: the slice's first decoder step.
    """

    seed: int
    example_ids: Sequence[str]
    purpose: str
    start: int = 0

    def keys(self, b: Sequence[int], t: Sequence[int]) -> np.ndarray:
        """The keys of streams (b[i], t[i]): uint64 (N,)."""
        ids = [self.example_ids[int(i)] for i in b]
        return stream_keys(self.seed, ids, [self.start + int(x) for x in t], self.purpose)
