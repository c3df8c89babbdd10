"""Benchmark 7 — tracking overhead.

The share of the ablation suite's wall time spent in MLflow calls: :func:`attnstudy.api.ablate_run`
(the suite plus everything it logs: params, the per-step and per-example Parquet tables, heatmap
data, summary metrics, tags, run start/end) runs with a :class:`Tracker` subclass that times every
call it makes, against

* the SQLite store (``sqlite:///…/mlflow.db`` in a temporary project root), and
* a local ``mlflow server`` (one worker, 127.0.0.1, free port) in front of a SQLite store,
  started with :func:`attnstudy.serving.ui.start_server` and stopped afterwards.

Metrics and params go through ``MlflowClient.log_batch`` (``MLFLOW_ENABLE_ASYNC_LOGGING`` as set
in the environment; the project does not turn it on). Target: ≤ 5 % of the wall time.

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_tracking [--smoke] [--no-server]``.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from attnstudy.models.io import LoadedModel
from attnstudy.tracking import Tracker

from . import common

TARGET = 0.05
TIMED = (
    "get_run",
    "start_run",
    "end_run",
    "set_tags",
    "log_params",
    "log_metrics",
    "log_artifact",
    "log_artifacts",
    "log_text",
    "log_table",
    "log_figure",
)


class TimingTracker(Tracker):
    """A Tracker that adds up the wall time of its public calls (nested calls counted once)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._depth = 0

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def _timed(name: str):
    base = getattr(Tracker, name)

    def method(self, *a, **kw):
        self._depth += 1
        t0 = time.perf_counter()
        try:
            return base(self, *a, **kw)
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
                self.calls[name] = self.calls.get(name, 0) + 1

    method.__name__ = name
    return method


for _name in TIMED:
    setattr(TimingTracker, _name, _timed(_name))


def measure(tracker: TimingTracker, bm, cfg) -> dict:
    from attnstudy.api import ablate_run

    exp = tracker.experiment_id("bench-tracking")
    model_run = tracker.start_run(exp, "model", {"kind": "model"})
    tracker.reset()
    loaded = LoadedModel(bm.model, bm.spec, bm.src_vocab, bm.tgt_vocab)
    t0 = time.perf_counter()
    ablate_run(model_run, loaded, cfg, tracker, progress=False)
    wall = time.perf_counter() - t0
    seconds, calls = dict(tracker.seconds), dict(tracker.calls)
    tracker.end_run(model_run)
    track = sum(seconds.values())
    return {
        "wall": wall,
        "tracking": track,
        "share": track / wall,
        "seconds": seconds,
        "calls": calls,
    }


def warm_up(bm) -> None:
    """One tiny suite first, so the lazy imports of the analysis modules count in neither store."""
    from attnstudy.analysis.suite import run_suite

    cfg = common.ablation_cfg(
        n_examples=2,
        n_permutations=2,
        n_random_orders=1,
        bootstrap_resamples=10,
        adversarial={"steps": 1},
    )
    run_suite(bm.model, bm.splits.test[:2], bm.src_vocab, bm.tgt_vocab, cfg, progress=False)


def run(args) -> dict:
    from attnstudy.serving import ui

    if args.smoke:
        cfg = common.ablation_cfg(
            n_examples=3,
            n_permutations=3,
            n_random_orders=2,
            bootstrap_resamples=20,
            adversarial={"steps": 3},
        )
    else:
        cfg = common.ablation_cfg(n_examples=100, n_permutations=100)  # the quickstart [ablation]
    bm = common.get_model(args, "bahdanau")
    warm_up(bm)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "mlruns").mkdir()
        with common.project_root(root):
            tracker = TimingTracker(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
            results["SQLite store"] = measure(tracker, bm, cfg)
            if not args.no_server:
                port = ui.free_port()
                base = f"http://127.0.0.1:{port}"
                t0 = time.perf_counter()
                proc = ui.start_server(
                    f"sqlite:///{root / 'server.db'}",
                    root / "server-artifacts",
                    port=port,
                    log_path=root / "server.log",
                )
                try:
                    ui.wait_healthy(base, timeout=180, proc=proc)
                    startup = time.perf_counter() - t0
                    results["mlflow server"] = measure(TimingTracker(base, timeout=60), bm, cfg)
                    results["mlflow server"]["startup"] = startup
                finally:
                    ui.stop_server(proc)
    rows, call_rows = [], []
    for store, r in results.items():
        rows.append(
            {
                "store": store,
                "suite wall s": r["wall"],
                "tracking s": r["tracking"],
                "tracking share": f"{100 * r['share']:.2f} %",
                "verdict (≤ 5 %)": common.verdict(r["share"], TARGET, higher_is_better=False),
            }
        )
        for name in sorted(r["seconds"], key=lambda n: -r["seconds"][n]):
            call_rows.append(
                {
                    "store": store,
                    "call": name,
                    "calls": r["calls"][name],
                    "seconds": r["seconds"][name],
                }
            )
    notes = [
        f"model: {bm.origin}",
        f"MLFLOW_ENABLE_ASYNC_LOGGING = {os.environ.get('MLFLOW_ENABLE_ASYNC_LOGGING', 'unset (false)')}",
    ]
    if "mlflow server" in results:
        notes.append(f"server start-up (not counted): {results['mlflow server']['startup']:.1f} s")
    if args.smoke:
        notes.append("smoke mode: a tiny suite, so the tracking share is far above a real run's")
    common.report(
        "Tracking overhead: MLflow calls vs suite wall time",
        args,
        {
            "examples": cfg.n_examples,
            "P": cfg.params_for("permutation").n,
            "ablations": "all",
            "adversarial iterations": cfg.params_for("adversarial").steps,
        },
        [("", common.table(rows)), ("Calls", common.table(call_rows))],
        notes,
    )
    return {"results": results}


def main(argv=None) -> dict:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--no-server", action="store_true", help="skip the mlflow server measurement")
    args = p.parse_args(argv)
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
