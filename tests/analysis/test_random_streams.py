"""The counter-based random streams (``rng = "counter-1"``, analysis/random_streams.py): Philox4x32-10
against the published Random123 known answers; a stream's draws are a function of its key and
index alone (batch size, batch-mates, order and worker processes change nothing); 10⁶ keys give
distinct streams; the permutations are uniform."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
from attnstudy.analysis import random_streams as rs
from scipy import stats

# Random123 kat_vectors, philox4x32 10 rounds: counter (4 words), key (2 words), output
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("counter, key, want", KAT)
def test_philox4x32_10_gives_the_random123_known_answers(counter, key, want):
    got = rs.philox4x32(np.array([counter], np.uint64), np.array(key, np.uint64))
    assert got.dtype == np.uint32 and got[0].tolist() == list(want)


def test_philox_known_answers_in_one_vectorised_call_across_passes(monkeypatch):
    """All three vectors in one call, each repeated, with passes of 2 counters (a known answer
    split across the pass boundary and next to other keys)."""
    monkeypatch.setattr(rs, "_BLOCK", 2)
    counters = np.array([c for c, _, _ in KAT] * 3, np.uint64)
    keys = np.array([k for _, k, _ in KAT] * 3, np.uint64)
    got = rs.philox4x32(counters, keys)
    assert got.tolist() == [list(w) for _, _, w in KAT] * 3


def test_words_are_the_philox_blocks_of_counters_0_1_2_in_order():
    key = 0x299F31D0A4093822  # the third vector's key: low word first
    w = rs.words(np.array([key], np.uint64), 10)[0]
    blocks = rs.philox4x32(
        np.array([[0, 0, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0]], np.uint64),
        np.array([0xA4093822, 0x299F31D0], np.uint64),
    )
    assert w.tolist() == blocks.reshape(-1)[:10].tolist()


def test_the_key_is_sha256_of_the_stream_name_and_keeps_64_bits():
    import hashlib

    digest = hashlib.sha256(b"3|copy/test/7|5|permutation").digest()
    assert rs.stream_key(3, "copy/test/7", 5, "permutation") == int.from_bytes(digest[:8], "little")
    keys = rs.stream_keys(0, [f"e{i}" for i in range(2000)], [0] * 2000, "p")
    assert keys.dtype == np.uint64 and int(keys.max()) >= 1 << 63  # the top bit is drawn too
    assert (keys >> np.uint64(32)).min() != (keys >> np.uint64(32)).max()  # so is the high word


def test_one_key_drawn_alone_equals_it_drawn_with_others_in_any_order():
    keys = rs.stream_keys(1, [f"e{i}" for i in range(50)], list(range(50)), "permutation")
    counts = np.arange(50) % 13 * 7 + 1
    flat = rs.words(keys, counts)
    ends = np.cumsum(counts)
    for i in (0, 7, 49):
        alone = rs.words(keys[i : i + 1], int(counts[i]))[0]
        assert np.array_equal(flat[ends[i] - counts[i] : ends[i]], alone)
    # reversed order, other batch-mates, the same count for all: the same words
    rev = rs.words(keys[::-1], counts[::-1])
    assert np.array_equal(rev[: counts[-1]], flat[-counts[-1] :])
    same = rs.words(keys, 91)
    for i in (3, 30):
        assert np.array_equal(same[i, : counts[i]], flat[ends[i] - counts[i] : ends[i]])
    # a prefix of a stream does not depend on how many words are drawn
    assert np.array_equal(rs.words(keys, 5), same[:, :5])


def _permutations_of(keys: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    return rs.permutations(keys, 6, lengths, 12)


def test_permutations_do_not_depend_on_batch_size_mates_order_or_worker_processes():
    keys = rs.stream_keys(2, [f"e{i}" for i in range(40)], [i % 5 for i in range(40)], "p")
    lengths = np.arange(40) % 12 + 1
    whole = rs.permutations(keys, 6, lengths, 12)
    assert np.array_equal(whole, rs.permutations_loop(keys, 6, lengths, 12))
    order = np.random.default_rng(0).permutation(40)
    assert np.array_equal(rs.permutations(keys[order], 6, lengths[order], 12), whole[order])
    for size in (1, 3, 17):
        parts = [
            rs.permutations(keys[i : i + size], 6, lengths[i : i + size], 12)
            for i in range(0, 40, size)
        ]
        assert np.array_equal(np.concatenate(parts), whole)
    # wider buffers (other batch-mates' longer sources) add padding columns only
    assert np.array_equal(rs.permutations(keys, 6, lengths, 20)[..., :12], whole)
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
        parts = list(
            pool.map(_permutations_of, np.array_split(keys, 3), np.array_split(lengths, 3))
        )
    assert np.array_equal(np.concatenate(parts), whole)


def _distinct(values: np.ndarray) -> bool:
    ordered = np.sort(values)
    return bool((ordered[1:] != ordered[:-1]).all())


@pytest.mark.slow  # 10⁶ SHA-256 keys: about 3 s on an idle machine
def test_a_million_keys_give_distinct_streams():
    """10⁶ stream names (one per example id and step), as hashed for a study: distinct 64-bit
    keys and distinct first 64 bits of their streams (a collision of either among 10⁶ has
    probability ≈ 2.7e-8; the legacy scheme's 32 bits collide with probability ≈ 1 − e^-116)."""
    n = 1_000_000
    keys = rs.stream_keys(0, [f"ex{i // 50}" for i in range(n)], [i % 50 for i in range(n)], "p")
    assert _distinct(keys)
    first = rs.words(keys, 2).astype(np.uint64)
    assert _distinct(first[:, 0] << np.uint64(32) | first[:, 1])
    assert not _distinct(keys & np.uint64(0xFFFFFFFF))  # what 32 bits of seed would give


def test_permutations_are_uniform():
    """Chi-square goodness of fit (seeded keys, so a fixed p-value): where each item lands among
    5 positions, and which of the 4! orders of 4 items is drawn."""
    keys = rs.stream_keys(0, [f"e{i}" for i in range(2000)], [0] * 2000, "permutation")
    perm5 = rs.permutations(keys, 10, np.full(2000, 5), 5).reshape(-1, 5)  # 20,000 rows
    counts = np.zeros((5, 5), np.int64)  # [item, position]
    np.add.at(counts, (perm5, np.broadcast_to(np.arange(5), perm5.shape)), 1)
    for item in range(5):
        assert counts[item].sum() == 20_000
        assert stats.chisquare(counts[item]).pvalue > 1e-3
    perm4 = rs.permutations(keys, 12, np.full(2000, 4), 4).reshape(-1, 4)  # 24,000 rows
    code = perm4 @ np.array([64, 16, 4, 1])
    observed = np.unique(code, return_counts=True)[1]
    assert len(observed) == 24
    assert stats.chisquare(observed).pvalue > 1e-3


def test_permutation_rows_are_stable_argsorts_of_consecutive_words():
    keys = rs.stream_keys(4, ["a", "b"], [0, 3], "erase_random")
    got = rs.permutations(keys, 3, np.array([4, 2]), 6)
    w = rs.words(keys[:1], 12)[0].reshape(3, 4)
    assert got[0, :, :4].tolist() == np.argsort(w, axis=-1, kind="stable").tolist()
    assert got[0, :, 4:].tolist() == [[4, 5]] * 3 and got[1, :, 2:].tolist() == [[2, 3, 4, 5]] * 3


def test_uniforms_take_53_bits_from_two_words_and_normals_are_their_quantiles():
    from scipy.special import ndtri

    keys = rs.stream_keys(0, ["a", "b", "c"], [0, 0, 0], "adversarial")
    w = rs.words(keys, 8).astype(np.float64)
    want = (np.floor(w[:, 0::2] / 32) * 2.0**26 + np.floor(w[:, 1::2] / 64)) / 2.0**53
    u = rs.uniforms(keys, 4)
    assert u.dtype == np.float64 and np.array_equal(u, want)
    assert np.array_equal(rs.normals(keys, 4), ndtri(want + 2.0**-54))
    ragged = rs.uniforms(keys, np.array([1, 4, 2]))
    assert np.array_equal(ragged, np.concatenate([u[0, :1], u[1], u[2, :2]]))
    z = rs.normals(rs.stream_keys(0, [f"e{i}" for i in range(1000)], [0] * 1000, "x"), 50)
    assert stats.kstest(z.reshape(-1), "norm").pvalue > 1e-3
    assert np.isfinite(z).all()


# ----------------------------------------------------------------------------- the setting


def test_rng_is_a_logged_ablation_setting_and_legacy_keeps_the_earlier_key():
    """``ablation.rng``: "counter-1" by default, logged and part of the ablation key; "legacy"
    is left out of the resolved settings, so its key and params are those of the runs stored
    before the setting existed (a stored run without ``ablation.rng`` is a legacy run)."""
    from attnstudy.analysis.batch import AblationContext
    from attnstudy.analysis.catalogue import AblationConfig

    from attnstudy.study.ablation_runs import ablation_key

    new, legacy = AblationConfig(seed=4), AblationConfig(seed=4, rng="legacy")
    assert new.rng == "counter-1" and new.flat()["ablation.rng"] == "counter-1"
    assert "rng" not in legacy.resolved() and "ablation.rng" not in legacy.flat()
    assert new.resolved() == legacy.resolved() | {"rng": "counter-1"}
    assert ablation_key(new) != ablation_key(legacy)
    assert AblationContext.of(new).rng == "counter-1" and AblationContext.of(legacy).rng == "legacy"
    assert AblationConfig.model_validate({"rng": "legacy"}).rng == "legacy"


def test_an_unknown_rng_is_refused():
    from attnstudy.analysis.batch import AblationContext
    from attnstudy.analysis.catalogue import AblationConfig
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="counter-1"):
        AblationConfig(rng="philox")
    with pytest.raises(ValueError, match="unknown rng 'philox'; valid: counter-1, legacy"):
        AblationContext(rng="philox")


def test_the_schemes_draw_different_permutations_and_legacy_is_unchanged():
    """The same seed, two schemes: other permutations; the legacy scheme's are still those of a
    torch generator seeded with ``step_seed`` (stored runs were made with them)."""
    import torch
    from attnstudy.analysis.batch import AblationContext, step_permutations, step_seed

    new = step_permutations(
        AblationContext(seed=1), "e", 3, "permutation", n=50, heads=2, n_valid=6
    )
    old = step_permutations(
        AblationContext(seed=1, rng="legacy"), "e", 3, "permutation", n=50, heads=2, n_valid=6
    )
    g = torch.Generator().manual_seed(step_seed(1, "e", 3, "permutation"))
    assert torch.equal(old, torch.rand(50, 2, 6, generator=g).argsort(-1))
    assert not torch.equal(new, old)
    assert sorted(new[7, 1].tolist()) == list(range(6))
