"""What every benchmark shares: arguments, machine description, interleaved timing, models,
tables and the ``RESULTS.md`` log.

Every figure a benchmark reports is a ratio between two things run in the same process on the
same inputs, timed interleaved (A, B, A, B, …) and compared by their best time, so it holds on
a noisy machine; absolute times are printed beside them for information only.

Models: the quickstart G2P sizes (embedding 32, bidirectional GRU encoder 64, decoder 128,
attention 64) for both decoder flows (``additive``/``bahdanau`` and ``general``/``luong``, the
quickstart variants). Full mode trains a small model (5 epochs on the quickstart's 8000 CMUdict
words, about a minute per flow) once
and caches it under ``benchmarks/.cache/`` (keyed by the run spec's config hash), so the
benchmarks of one ``run_all`` share it; ``--model-uri`` loads one from the store instead. Smoke
mode uses randomly initialised weights of the same sizes (seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import fcntl
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
CACHE = HERE / ".cache"

QUICKSTART_MODEL = dict(
    cell="gru",
    bidirectional=True,
    embedding_dim=32,
    encoder_hidden=64,
    decoder_hidden=128,
    attention_dim=64,
    dropout=0.1,
)
"""Model sizes of ``experiments/quickstart.toml`` (never inflated to look efficient)."""

FLOWS = {"bahdanau": "additive", "luong": "general"}
"""Decoder flow → the attention score it is paired with in the quickstart experiment."""
QUICKSTART_TRANSFORMER = dict(layers=2, heads=4, d_model=64, d_ff=256, dropout=0.1)
"""The quickstart's Transformer (its G2P variant)."""
KERNELS = {**FLOWS, "transformer": "multihead"}
"""The model families the permutation and FLOP-rate benchmarks time: both recurrent flows and
the Transformer (key ``transformer``, its last layer analysed)."""


# ----------------------------------------------------------------------------- arguments


@contextlib.contextmanager
def project_root(path: Path):
    """Point the project root (artifact store of a SQLite URI) at ``path`` for the duration."""
    old = os.environ.get("ATTNSTUDY_ROOT")
    os.environ["ATTNSTUDY_ROOT"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ATTNSTUDY_ROOT", None)
        else:
            os.environ["ATTNSTUDY_ROOT"] = old


def parser(description: str) -> argparse.ArgumentParser:
    """The options every benchmark takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--smoke", action="store_true", help="tiny sizes (seconds); used by the test suite"
    )
    p.add_argument(
        "--results",
        default=None,
        help=f"Markdown file to append to (default: {RESULTS} in full mode, nothing in smoke mode)",
    )
    p.add_argument("--no-results", action="store_true", help="do not append to a results file")
    p.add_argument(
        "--model-uri",
        default=None,
        help="a G2P model to use instead of training one (runs:/…, models:/… or a model "
        "directory); used for the flow it was trained with",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: $ATTNSTUDY_THREADS, else 1, as the project runs)",
    )
    p.add_argument("--repeats", type=int, default=None, help="timing repeats (interleaved)")
    p.add_argument(
        "--kernels",
        default=None,
        help=f"comma-separated model families to time (default: all of {', '.join(KERNELS)}; "
        "the permutation and FLOP-rate benchmarks)",
    )
    p.add_argument(
        "--idle-load",
        type=float,
        default=None,
        help="highest 1-minute load average during the run at which the machine counts as idle "
        "(default: the benchmark's threads + 0.3); above it FLOP fractions are flagged, not judged",
    )
    return p


def kernels(args: argparse.Namespace) -> list[str]:
    """The model families of :data:`KERNELS` selected by ``--kernels`` (all by default).

    Raises:
        SystemExit: (argparse-style, exit code 2) for an unknown family.
    """
    names = args.kernels.split(",") if getattr(args, "kernels", None) else list(KERNELS)
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        raise SystemExit(f"unknown kernel(s) {', '.join(unknown)}; valid: {', '.join(KERNELS)}")
    return names


def default_threads() -> int:
    """The project's intra-op thread count: ``$ATTNSTUDY_THREADS``, else 1 (as the CLI and
    ``training.threads`` use)."""
    return int(os.environ.get("ATTNSTUDY_THREADS", "1"))


def setup(args: argparse.Namespace) -> None:
    """Fix the thread count for the whole benchmark (``--threads``, else the project's default)
    and start watching the machine's load (:data:`LOAD`)."""
    args.threads = args.threads or default_threads()
    torch.set_num_threads(args.threads)
    if getattr(args, "idle_load", None) is None:
        args.idle_load = args.threads + 0.3
    if not getattr(args, "smoke", False):
        # the benchmark's own threads add to the load once it runs: wait for the rest to settle
        waited = LOAD.settle(max(args.idle_load - args.threads, 0.3))
        if waited >= 1:
            print(f"waited {waited:.0f} s for the load average to settle", flush=True)
    LOAD.start()


def results_path(args: argparse.Namespace) -> Path | None:
    if args.no_results:
        return None
    if args.results:
        return Path(args.results)
    return None if args.smoke else RESULTS


# ----------------------------------------------------------------------------- machine


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> dict[str, str]:
    """Machine description for the results log."""
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    try:
        mem_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        mem = f"{mem_kb / 2**20:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        mem = "n/a"
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": f"{cpu_model()} ({os.cpu_count()} logical CPUs)",
        "memory": mem,
        "load average (1/5/15 min)": load,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch threads": str(torch.get_num_threads()),
    }


class LoadWatch:
    """The highest 1-minute load average seen while a benchmark runs, sampled every
    ``interval`` seconds in a daemon thread (``os.getloadavg``; the benchmark's own threads count).

    A ratio of two things timed in one process survives a busy neighbour better than a FLOP rate
    against ``torch.mm`` does (a neighbour slows the memory-bound kernels and the compute-bound
    mm differently), so the FLOP benchmark flags its fractions when :attr:`peak` exceeds the
    idle threshold (``--idle-load``).
    """

    def __init__(self, interval: float = 2.0):
        self.interval = interval
        self.samples: list[float] = []
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        try:
            self.samples.append(os.getloadavg()[0])
        except OSError:
            pass

    def settle(self, threshold: float, timeout: float = 150.0, poll: float = 5.0) -> float:
        """Wait (at most ``timeout`` s) for the 1-minute load average to come down to
        ``threshold``: it trails the load by about a minute, so a benchmark started right after
        another job would read that job's load. Returns the seconds waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                if os.getloadavg()[0] <= threshold:
                    break
            except OSError:
                break
            time.sleep(poll)
        return time.monotonic() - t0

    def start(self) -> None:
        if self._thread is not None:
            return
        self.sample()

        def loop() -> None:
            while True:
                time.sleep(self.interval)
                self.sample()

        self._thread = threading.Thread(target=loop, daemon=True, name="load-watch")
        self._thread.start()

    @property
    def peak(self) -> float:
        """Highest 1-minute load average sampled so far (NaN when unavailable)."""
        self.sample()
        return max(self.samples) if self.samples else float("nan")

    def idle(self, threshold: float) -> bool:
        """Whether the load stayed at or below ``threshold`` during the run."""
        return self.peak <= threshold


LOAD = LoadWatch()
"""The running benchmark's load watch (started by :func:`setup`)."""


def load_note(args: argparse.Namespace) -> str:
    """One line for a report: the peak load during the run against the idle threshold."""
    peak = LOAD.peak
    state = "idle" if peak <= args.idle_load else "NOT idle"
    return (
        f"load average (1 min) peaked at {peak:.2f} during the run (idle threshold "
        f"{args.idle_load:.2f}: {state})"
    )


# ----------------------------------------------------------------------------- timing


@dataclass
class Timing:
    """Times of one callable, seconds."""

    times: list[float]
    result: object = None

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def interleaved(
    fns: dict[str, Callable[[], object]], repeats: int = 3, once: Sequence[str] = ()
) -> dict[str, Timing]:
    """Time callables interleaved (round r runs every fn once), so drifts in machine load hit
    all of them alike; ratios of the best times are the reported figures. Names in ``once``
    (slow references, whose single long run already averages the noise out) run in the first
    round only. The first round's result of every fn is kept (for the equality checks)."""
    out = {name: Timing([]) for name in fns}
    for r in range(repeats):
        for name, fn in fns.items():
            if r > 0 and name in once:
                continue
            t0 = time.perf_counter()
            res = fn()
            out[name].times.append(time.perf_counter() - t0)
            if r == 0:
                out[name].result = res
    return out


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    res = fn()
    return time.perf_counter() - t0, res


def mm_rate(n: int, threads: int | None = None, repeats: int = 3) -> float:
    """FLOP/s that ``torch.mm`` reaches on an n × n × n float32 product (best of ``repeats``)."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=g)
        b = torch.randn(n, n, generator=g)
        torch.mm(a, b)  # warm-up
        best = min(timed(lambda: torch.mm(a, b))[0] for _ in range(repeats))
        return 2.0 * n**3 / best
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- tables


def fmt(v: object) -> str:
    if isinstance(v, float):
        if v != v:
            return "n/a"
        if v == 0:
            return "0"
        a = abs(v)
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 0.01:
            return f"{v:.3f}"
        return f"{v:.2e}"
    return str(v)


def table(rows: Sequence[dict[str, object]], columns: Sequence[str] | None = None) -> str:
    """A Markdown table (also readable as plain text)."""
    if not rows:
        return "(no rows)"
    cols = list(columns or rows[0].keys())
    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    out = [line(cols), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells]
    return "\n".join(out)


def verdict(value: float, target: float, higher_is_better: bool = True) -> str:
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "NOT met"


def report(
    title: str,
    args: argparse.Namespace,
    settings: dict[str, object],
    sections: Sequence[tuple[str, str]],
    notes: Sequence[str] = (),
) -> str:
    """Print a benchmark's tables and append them (with the machine description) to the
    results file. ``sections``: (heading, Markdown table) pairs."""
    mode = "smoke" if args.smoke else "full"
    lines = [f"## {title} ({mode})", ""]
    info = machine()
    lines.append("Machine: " + "; ".join(f"{k}: {v}" for k, v in info.items()))
    lines.append("")
    lines.append("Settings: " + "; ".join(f"{k} = {fmt(v)}" for k, v in settings.items()))
    lines.append("")
    for heading, body in sections:
        if heading:
            lines += [f"**{heading}**", ""]
        lines += [body, ""]
    for note in notes:
        lines.append(f"- {note}")
    if notes:
        lines.append("")
    text = "\n".join(lines)
    print(text, flush=True)
    path = results_path(args)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # benchmarks may run in parallel lanes (run_all --jobs)
            if f.tell() == 0:
                f.write(
                    "# Benchmark results\n\nAppended by the scripts in `benchmarks/`; "
                    "newest last. Every figure is a ratio of two things run in the same process "
                    "on the same inputs; absolute times are for information only.\n\n"
                )
            f.write(text + "\n")
    return text


# ----------------------------------------------------------------------------- data and models


def run_spec(
    flow: str,
    task: str = "g2p",
    n_train: int | None = 8000,
    n_dev: int = 200,
    n_test: int | None = 1000,
    epochs: int = 5,
    seed: int = 1,
    bucket: bool = True,
    **data_overrides,
):
    """A RunSpec with the quickstart sizes for ``flow`` (its quickstart attention score), or the
    quickstart's Transformer for ``flow="transformer"``."""
    from attnstudy.config import (
        ModelConfig,
        RunSpec,
        TrainingConfig,
        TransformerConfig,
        data_config,
    )

    data = data_config(task=task, n_train=n_train, n_dev=n_dev, n_test=n_test, **data_overrides)
    if flow == "transformer":
        model = TransformerConfig(architecture="transformer", **QUICKSTART_TRANSFORMER)
    else:
        model = ModelConfig(attention=FLOWS[flow], flow=flow, **QUICKSTART_MODEL)
    training = TrainingConfig(
        epochs=epochs, batch_size=64, lr=0.003, patience=3, bucket_batches=bucket
    )
    return RunSpec(experiment="bench", seed=seed, data=data, model=model, training=training)


@dataclass
class BenchModel:
    """A model with its data."""

    model: torch.nn.Module
    spec: object
    splits: object
    src_vocab: object
    tgt_vocab: object
    origin: str  # "random init", "trained here (…)", "cache …", or the URI


def get_model(
    args: argparse.Namespace, flow: str, trained: bool | None = None, **spec_kw
) -> BenchModel:
    """The benchmark model for ``flow``.

    ``--model-uri`` wins when its flow matches; else, in full mode (or ``trained=True``), a small
    model is trained once and cached; in smoke mode (or ``trained=False``) the weights are random.
    """
    from attnstudy.api import load_data
    from attnstudy.models import build_model

    if args.model_uri:
        from attnstudy.api import load_model

        _, loaded = load_model(args.model_uri)
        if getattr(loaded.spec.model, "flow", loaded.spec.model.architecture) == flow:
            splits, _, _ = load_data(loaded.spec)
            loaded.model.eval()
            return BenchModel(
                loaded.model,
                loaded.spec,
                splits,
                loaded.src_vocab,
                loaded.tgt_vocab,
                args.model_uri,
            )
    trained = (not args.smoke) if trained is None else trained
    if args.smoke:
        spec_kw = {"n_train": 300, "n_dev": 20, "n_test": 100, "epochs": 1} | spec_kw
    spec = run_spec(flow, **spec_kw)
    splits, src_vocab, tgt_vocab = load_data(spec)
    if not trained:
        torch.manual_seed(spec.seed)
        model = build_model(spec.model, len(src_vocab), len(tgt_vocab)).eval()
        return BenchModel(model, spec, splits, src_vocab, tgt_vocab, "random init")
    from attnstudy.data.types import splits_digest
    from attnstudy.models.io import load_model_dir, save_model_dir

    cache = CACHE / spec.model_key(splits_digest(splits))
    if (cache / "weights.pt").is_file():
        loaded = load_model_dir(cache)
        return BenchModel(
            loaded.model, spec, splits, src_vocab, tgt_vocab, f"cached ({cache.name})"
        )
    from attnstudy.models.training import train

    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as ckpt:
        t0 = time.perf_counter()
        try:
            result = train(spec, splits, src_vocab, tgt_vocab, ckpt, progress=False)
        finally:
            torch.set_num_threads(threads)  # train() sets training.threads
        secs = time.perf_counter() - t0
    save_model_dir(cache, result.model, spec, src_vocab, tgt_vocab)
    dev = result.history[result.best_epoch - 1] if result.history else {}
    per = dev.get("dev/per", float("nan"))
    return BenchModel(
        result.model.eval(),
        spec,
        splits,
        src_vocab,
        tgt_vocab,
        f"trained here ({spec.data.n_train} words, {len(result.history)} epochs, "
        f"{secs:.0f} s, dev PER {per:.3f})",
    )


def ablation_cfg(**kw):
    from attnstudy.analysis.catalogue import AblationConfig

    return AblationConfig(**kw)


def prepared(
    bm: BenchModel, n: int, prefix: str = "greedy", batch_size: int = 32, examples=None
) -> list:
    """Prepared batches (traces) over the first ``n`` test examples."""
    from attnstudy.analysis.batch import prepare_batches

    exs = list(examples if examples is not None else bm.splits.test)[:n]
    return list(prepare_batches(bm.model, exs, bm.src_vocab, bm.tgt_vocab, prefix, batch_size))


def real_steps(batches: Sequence) -> int:
    return sum(int(b.trace.step_mask.sum()) for b in batches)
