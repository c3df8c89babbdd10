"""Roofline arithmetic for ``bench_flops``: the machine's three peaks, a kernel's
compulsory bytes and transcendental calls, its bound and the fraction of that bound achieved.

A kernel doing F FLOPs, moving at least M bytes (each input read once, each output written once)
and calling T transcendental functions (tanh, sigmoid, exp, log, erf per element) cannot finish
faster than

    bound = max(F / peak_FLOP/s, M / peak_bytes/s, T / peak_transcendentals/s)

seconds; the fraction achieved is ``bound / measured time`` (1 = at the limit). The peaks are
measured in the same run: ``torch.mm`` for FLOP/s, a large ``dst.copy_(src)`` for bytes/s
(read + write counted) and a large ``torch.tanh`` / ``torch.exp`` for transcendentals/s (the
faster of the two, so the bound is never overstated).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import common

TRANSCENDENTAL_OPS = {
    "tanh": 1,
    "tanh_": 1,
    "sigmoid": 1,
    "sigmoid_": 1,
    "exp": 1,
    "exp_": 1,
    "log": 1,
    "log_": 1,
    "log1p": 1,
    "erf": 1,
    "gelu": 1,
    "_softmax": 1,  # one exp per element
    "_log_softmax": 1,  # one exp per element (and one log per row, not counted)
    "_log_softmax_backward_data": 1,  # exp of the saved output
}
"""aten operators (overload packet names) and transcendental calls per output element."""
WRITE_ONLY = {"copy_", "fill_", "zero_"}
"""In-place operators that write their first argument without reading it."""


class Peaks(NamedTuple):
    """The machine's peaks, per second: FLOPs, bytes (read + written), transcendental calls."""

    flops: float
    bytes: float
    transcendentals: float


class Bound(NamedTuple):
    """A kernel's roofline bound: which resource limits it and the time it needs at least."""

    limit: str  # "FLOPs", "bytes" or "transcendentals"
    seconds: float


def bound(flops: float, nbytes: float, transcendentals: float, peaks: Peaks) -> Bound:
    """The roofline bound: the largest of F/peak_F, M/peak_M and T/peak_T (seconds)."""
    times = {
        "FLOPs": flops / peaks.flops,
        "bytes": nbytes / peaks.bytes,
        "transcendentals": transcendentals / peaks.transcendentals,
    }
    limit = max(times, key=times.get)
    return Bound(limit, times[limit])


def _best(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def copy_rate(mib: int = 256, repeats: int = 3) -> float:
    """Bytes/s of ``dst.copy_(src)`` on two float32 tensors of ``mib`` MiB (read + write)."""
    n = mib * 2**20 // 4
    src, dst = torch.ones(n), torch.empty(n)
    return 2.0 * src.nbytes / _best(lambda: dst.copy_(src), repeats)


def transcendental_rate(n: int = 2**24, repeats: int = 3) -> dict[str, float]:
    """Calls/s of ``torch.tanh`` and ``torch.exp`` on ``n`` float32 elements (into ``out``)."""
    x, y = torch.rand(n), torch.empty(n)
    return {
        "tanh": n / _best(lambda: torch.tanh(x, out=y), repeats),
        "exp": n / _best(lambda: torch.exp(x, out=y), repeats),
    }


def measure_peaks(
    *, mm_n: int, copy_mib: int, trans_n: int, threads: int, repeats: int = 3
) -> tuple[Peaks, dict[str, float]]:
    """The three peaks on ``threads`` threads, and the measured rates by name (for the table)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        flops = common.mm_rate(mm_n, threads, repeats=repeats)
        bw = copy_rate(copy_mib, repeats)
        trans = transcendental_rate(trans_n, repeats)
    finally:
        torch.set_num_threads(before)
    rates = {"mm GFLOP/s": flops / 1e9, "copy GB/s": bw / 1e9}
    rates |= {f"{k} G/s": v / 1e9 for k, v in trans.items()}
    return Peaks(flops, bw, max(trans.values())), rates


def compulsory_bytes(*objs: object) -> int:
    """Bytes of the distinct tensor storages reachable from ``objs`` (tensors, modules'
    parameters and buffers, lists/tuples/dicts, dataclasses and plain objects, DataFrames):
    each counted once, however often it is referenced."""
    seen: set[int] = set()
    total = 0
    stack = list(objs)
    visited: set[int] = set()
    while stack:
        o = stack.pop()
        if o is None or isinstance(o, str | int | float | bool):
            continue
        if isinstance(o, torch.Tensor):
            key = o.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += o.untyped_storage().nbytes()
            continue
        if id(o) in visited:
            continue
        visited.add(id(o))
        if isinstance(o, torch.nn.Module):
            stack.extend(o.parameters())
            stack.extend(o.buffers())
        elif hasattr(o, "memory_usage") and hasattr(o, "columns"):  # a DataFrame
            total += int(o.memory_usage(index=False, deep=False).sum())
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, list | tuple | set):
            stack.extend(o)
        elif dataclasses.is_dataclass(o):
            stack.extend(getattr(o, f.name) for f in dataclasses.fields(o))
        elif hasattr(o, "__dict__"):
            stack.extend(vars(o).values())
    return total


class OpCounter(TorchDispatchMode):
    """Counts, per aten operator, its calls, the bytes of its tensor inputs and outputs (the
    traffic it would move if nothing stayed in cache; views move nothing and are left out) and
    its transcendental calls."""

    def __init__(self):
        super().__init__()
        self.calls: Counter = Counter()
        self.bytes: Counter = Counter()
        self.transcendentals: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        returns = func._schema.returns
        if any(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            return out  # a view: moves no data
        read = args[1:] if name in WRITE_ONLY else args  # copy_/fill_/zero_ do not read self
        tensors = [
            t
            for t in torch.utils._pytree.tree_leaves((read, kwargs, out))
            if isinstance(t, torch.Tensor)
        ]
        self.calls[name] += 1
        self.bytes[name] += sum(t.numel() * t.element_size() for t in tensors)
        per = TRANSCENDENTAL_OPS.get(name)
        if per:
            outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
            self.transcendentals[name] += per * sum(t.numel() for t in outs[:1])
        return out

    @property
    def total_transcendentals(self) -> int:
        return sum(self.transcendentals.values())

    def table(self, n: int = 8) -> str:
        """The top ``n`` operators by traffic: calls, MB moved, transcendentals (M)."""
        total = sum(self.bytes.values()) or 1
        rows = [
            {
                "operator": f"aten::{k}",
                "calls": self.calls[k],
                "MB moved": v / 1e6,
                "traffic share": f"{100.0 * v / total:.1f} %",
                "transcendentals (M)": self.transcendentals[k] / 1e6,
            }
            for k, v in self.bytes.most_common(n)
        ]
        return common.table(rows)


def count_ops(fn: Callable[[], object]) -> tuple[OpCounter, object]:
    """Run ``fn`` once under :class:`OpCounter`; the counter and ``fn``'s result."""
    with OpCounter() as c:
        res = fn()
    return c, res
