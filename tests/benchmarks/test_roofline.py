"""The roofline arithmetic of ``bench_flops``: known answers, no timing."""

from __future__ import annotations

import pytest
import torch

from benchmarks import roofline

PEAKS = roofline.Peaks(flops=100e9, bytes=10e9, transcendentals=1e9)


def test_a_pure_copy_is_bound_by_bandwidth():
    n = 2**20
    src, dst = torch.ones(n), torch.empty(n)
    ops, _ = roofline.count_ops(lambda: dst.copy_(src))
    nbytes = roofline.compulsory_bytes(src, dst)
    assert nbytes == 2 * 4 * n and ops.bytes["copy_"] == 2 * 4 * n
    assert ops.total_transcendentals == 0
    b = roofline.bound(0.0, nbytes, ops.total_transcendentals, PEAKS)
    assert b.limit == "bytes" and b.seconds == pytest.approx(8 * n / 10e9)


def test_a_matmul_is_bound_by_flops_and_tanh_by_transcendentals():
    assert roofline.bound(2 * 512**3, 3 * 512 * 512 * 4, 0, PEAKS) == (
        "FLOPs",
        pytest.approx(2 * 512**3 / 100e9),
    )
    x = torch.rand(1000, 100)
    ops, _ = roofline.count_ops(lambda: torch.softmax(torch.tanh(x), -1))
    assert ops.transcendentals == {"tanh": 100_000, "_softmax": 100_000}
    b = roofline.bound(0.0, 8e5, ops.total_transcendentals, PEAKS)
    assert b.limit == "transcendentals" and b.seconds == pytest.approx(2e5 / 1e9)


def test_compulsory_bytes_counts_a_shared_storage_once_and_views_move_nothing():
    x = torch.zeros(10, 10)
    assert roofline.compulsory_bytes(x, x[2:], [x.t()], {"a": x}) == 400
    ops, _ = roofline.count_ops(lambda: x.view(100).t())
    assert sum(ops.bytes.values()) == 0
