"""Every benchmark in smoke mode (tiny sizes), so the scripts never rot.

Asserts that the scripts run, print and append their tables, and that their equality checks hold;
never a timing assertion (the machine may be busy).
"""

from __future__ import annotations

import math
import os
import sys

import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture
def results(tmp_path):
    return tmp_path / "RESULTS.md"


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def smoke(results, *extra) -> list[str]:
    return ["--smoke", "--results", str(results), *extra]


def test_permutation_paths_agree(results):
    from benchmarks import bench_permutation

    out = bench_permutation.main(smoke(results))
    assert set(out["checks"]) == {"bahdanau", "luong", "transformer"}
    for d_step, d_naive in out["checks"].values():
        assert d_step <= 1e-6 and d_naive <= 1e-6
    assert all(r["permuted steps"] > 0 for r in out["rows"])
    assert "Local permutation" in results.read_text()


def test_memory_curve_runs_each_size_in_a_fresh_worker(results):
    from benchmarks import bench_memory

    root_before = os.environ.get("ATTNSTUDY_ROOT")
    out = bench_memory.main(smoke(results))
    # it trained in this process: the project root is this process's again (it pointed every
    # later test in the worker at the benchmark's deleted store)
    assert os.environ.get("ATTNSTUDY_ROOT") == root_before
    sizes = [(r["examples"], r["adversarial"]) for r in out["rows"]]
    assert sizes == [(4, True), (8, True)]
    assert all(r["peak MiB"] >= r["peak at the suite's end MiB"] > 0 for r in out["rows"])
    assert "Memory: an ablation worker's peak" in results.read_text()


def test_records_bulk_reads_the_same_runs(results):
    from benchmarks import bench_records

    out = bench_records.main(smoke(results, "--models", "30"))
    assert out["same"] and out["rows"][0]["runs read"] == 60
    assert "Study records" in results.read_text()


def test_adversarial_batched_equals_loop(results):
    from benchmarks import bench_adversarial

    out = bench_adversarial.main(smoke(results))
    for check in out["checks"].values():
        # the same trajectories up to float rounding of batched vs single-row products
        assert check["objective_abs"] <= 1e-4 and check["jsd_abs"] <= 1e-4
    assert all(r["searched steps"] > 0 for r in out["rows"])
    assert "Adversarial search" in results.read_text()


def test_adversarial_against_an_earlier_commit(results):
    """``--before`` runs an earlier commit's search module beside today's and tabulates each
    result with that module's own table (today's table read a field the earlier result lacks:
    AttributeError, fixed)."""
    import subprocess

    from prerequisites import require

    from benchmarks import bench_adversarial

    commit = "fcebe30"  # the "before" of the adversarial search
    here = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True, timeout=30
    )
    require(here.returncode == 0, f"commit {commit} is not in this clone's history")
    out = bench_adversarial.main(smoke(results, "--before", commit, "--kernels", "bahdanau"))
    searches = {r["search"] for r in out["quality"]}
    assert {f"{commit}: plain objective", f"{commit}: default search", "fast path"} <= searches
    for r in out["quality"]:
        assert r["s"] > 0 and 0.0 <= float(r["found rate"].split()[0]) <= 1.0
    assert f"the {commit}: plain objective search" in results.read_text()


def test_loo_batched_equals_loop(results):
    from benchmarks import bench_loo

    out = bench_loo.main(smoke(results))
    assert all(d <= 1e-6 for d in out["checks"].values())
    assert all(r["max abs diff float64"] <= 1e-9 for r in out["rows"])
    assert "Leave-one-out" in results.read_text()


def test_flops_fractions_are_finite(results):
    from benchmarks import bench_flops

    out = bench_flops.main(smoke(results))
    assert out["mm_rate"] > 0
    assert all(math.isfinite(f) and f > 0 for f in out["fractions"].values())
    text = results.read_text()
    assert "top operators" in text and "µs per row" in text
    assert "load average (1 min) peaked at" in text
    # the roofline table: fraction = bound / best time from its own columns
    assert "Roofline: bound = max(" in text and "traffic per operator" in text
    cols = ["flow", "kernel", "rows", "GFLOP", "MB", "transcendentals (M)", "bound", "bound s"]
    cols += ["best s", "fraction of bound"]
    assert len(out["roofline"]) == 3 * len(out["e2e_ratios"]) == 9
    for row in out["roofline"]:
        assert list(row) == cols
        assert row["bound"] in {"FLOPs", "bytes", "transcendentals"}
        assert row["MB"] > 0 and row["GFLOP"] > 0
        assert row["fraction of bound"] == pytest.approx(row["bound s"] / row["best s"], rel=1e-12)
        peak = {"FLOPs": out["peaks"].flops, "bytes": out["peaks"].bytes}
        peak["transcendentals"] = out["peaks"].transcendentals
        need = {"FLOPs": 1e9 * row["GFLOP"], "bytes": 1e6 * row["MB"]}
        need["transcendentals"] = 1e6 * row["transcendentals (M)"]
        assert row["bound s"] == pytest.approx(max(need[k] / peak[k] for k in peak), rel=1e-9)
    # every flow's bahdanau-like recurrent kernel calls tanh/sigmoid; the ablation adds softmax
    by = {(r["flow"], r["kernel"]): r for r in out["roofline"]}
    assert by[("bahdanau", "permutation kernel")]["transcendentals (M)"] > 0
    assert all(
        by[(f, "permutation, whole ablation")]["transcendentals (M)"] > 0 for f in out["e2e_ratios"]
    )


def test_run_all_only_flops_writes_the_roofline(results):
    from benchmarks import run_all

    assert run_all.main(["--smoke", "--only", "flops", "--results", str(results)]) == 0
    text = results.read_text()
    assert "Roofline: bound = max(" in text and "fraction of bound" in text
    assert "whole permutation ablation / kernel" in text


def test_flop_fractions_are_not_judged_on_a_busy_machine(results):
    from benchmarks import bench_flops

    out = bench_flops.main(smoke(results, "--idle-load", "-1"))  # every load counts as busy
    assert out["idle"] is False
    text = results.read_text()
    assert "not judged: the machine was not idle" in text and " met)" not in text


def test_load_watch_keeps_the_peak():
    from benchmarks.common import LoadWatch

    watch = LoadWatch(interval=60)
    watch.samples = [0.4, 2.5, 1.0]
    assert watch.peak >= 2.5
    assert not watch.idle(2.0) and watch.idle(1e9)


def test_flop_count_of_the_layers():
    from attnstudy.config import ModelConfig, TransformerConfig
    from attnstudy.models import build_model
    from benchmarks.bench_flops import layer_flops

    kw = dict(embedding_dim=32, encoder_hidden=64, decoder_hidden=128, attention_dim=64)
    bah = layer_flops(build_model(ModelConfig(attention="additive", flow="bahdanau", **kw), 30, 43))
    # GRU: 2·3·128·(32 + 128 + 128); readout: 2·128·(128 + 128 + 32); output: 2·43·128
    assert bah["forward"] == 2 * 384 * 288 + 2 * 128 * 288 + 2 * 43 * 128
    assert bah["backward"] == 2 * 384 * 160 + 2 * 128 * 288 + 2 * 43 * 128
    assert bah["context"] == 2 * 128
    lu = layer_flops(build_model(ModelConfig(attention="general", flow="luong", **kw), 30, 43))
    # W_c folded into the values: per row only the output layer, and 2·hidden per valid position
    assert lu["forward"] == lu["backward"] == 2 * 43 * 128
    assert lu["context"] == 2 * 128
    tf = TransformerConfig(architecture="transformer", layers=2, heads=4, d_model=64, d_ff=256)
    fl = layer_flops(build_model(tf, 30, 43))
    # W^O folded into the values; feed-forward: 2·(64·256 + 256·64); output: 2·43·64
    assert fl["forward"] == fl["backward"] == 2 * 2 * 64 * 256 + 2 * 43 * 64
    assert fl["context"] == 2 * 4 * 64  # 2·d per head and valid position


def test_long_example_battery(results):
    from benchmarks import bench_long

    out = bench_long.main(smoke(results))
    lengths = [r["length"] for r in out["rows"]]
    assert lengths == [6, 12]
    for r in out["rows"]:
        # the reference prefix fixes the steps: L tokens and <eos>
        assert r["steps"] == r["length"] + 1 and r["peak_rss_kb"] > 0
    from attnstudy.analysis.catalogue import list_ablations

    assert set(out["rows"][0]["ablations"]) == set(list_ablations(default_only=True))
    assert "µs per replacement" in results.read_text()


def test_time_per_decoder_step_as_the_source_grows(results):
    from benchmarks import bench_steps

    out = bench_steps.main(smoke(results))
    assert [r["L"] for r in out["per_step"]] == [4, 8]
    # the reference prefix fixes the steps: L tokens and <eos> per example, two examples
    assert [r["steps"] for r in out["per_step"]] == [10, 18]
    for r in out["rows"]:
        length, steps = r["length"], r["steps"]
        # erasure evaluates every prefix of 9 orders (4 rankings, 5 random) at every step; its
        # reference forward computes exactly the rows the ablation computed
        assert r["reference"]["orders"] == 9
        assert r["counted"]["erase_until_flip"] == 9 * (length - 1) * steps
        assert r["reference"]["erase_until_flip"] == r["counted"]["erase_until_flip"]
        assert r["reference"]["erase_calls"] == 1
        # one deleted source per run of equal tokens, the same ones in the reference
        assert 0 < r["counted"]["loo"] == r["reference"]["loo"] <= 2 * length
        # the references compute what the ablations compute
        assert r["checks"]["loo"] <= 1e-5 and r["checks"]["gradient"] <= 1e-5
        assert r["peak_rss_kb"] > 0
    assert len(out["ratios"]) == 2 * 3
    for row in out["ratios"]:
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0
        assert row["ratio"] == row["ablation s"] / row["reference s"]
        assert row["verdict"] == ("met" if row["ratio"] <= 2 else "NOT met")
    from attnstudy.analysis.catalogue import list_ablations

    assert set(list_ablations(default_only=True)) | {"loo", "gradient"} == set(out["slopes"])
    text = results.read_text()
    assert "Time per decoder step" in text and "one batched forward" in text


def test_training_throughput(results):
    from benchmarks import bench_training

    out = bench_training.main(smoke(results))
    for flow in out["flows"].values():
        assert flow["bucketed"] > 0 and flow["padded"] > 0 and flow["full_epoch_s"] > 0
    # bucketing never pads more than a random batch
    by = {(r["flow"], r["batching"]): r for r in out["rows"]}
    for flow in {f for f, _ in by}:
        assert by[(flow, "bucketed")]["padding share"] <= by[(flow, "padded")]["padding share"]


def test_tracking_overhead(results):
    from benchmarks import bench_tracking

    out = bench_tracking.main(smoke(results))
    assert set(out["results"]) == {"SQLite store", "mlflow server"}
    for r in out["results"].values():
        assert 0 < r["share"] < 1
        assert {"log_metrics", "log_table", "log_params"} <= set(r["calls"])


def test_run_all_rejects_unknown_names(capsys):
    from benchmarks import run_all

    with pytest.raises(SystemExit):
        run_all.main(["--smoke", "--only", "nonsense"])


def test_run_all_in_two_lanes_appends_whole_sections(results):
    """run_all's two lanes (bench_scaling alone in one, the rest in the other) append whole
    sections; bench_scaling's children (one per size and ablation) each report their steps and
    peak memory (the benchmark's only smoke run in the suite)."""
    import re

    from benchmarks import bench_scaling, run_all

    assert (
        run_all.main(["--smoke", "--only", "loo,scaling", "--jobs", "2", "--results", str(results)])
        == 0
    )
    text = results.read_text()
    assert text.count("# Benchmark results") == 1
    for heading in ("## Leave-one-out", "## Scaling of the ablation suite"):
        assert text.count(heading) == 1
    # each section is written in one locked append: the leave-one-out table is not cut by the other
    loo = text[text.index("## Leave-one-out") :]
    assert "## Scaling" not in loo.split("\n## ")[0]
    scaling = text[text.index("## Scaling of the ablation suite") :]
    assert "Log-log slopes" in scaling
    # one child per size: its steps, suite time and peak memory positive
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in scaling.split("**Log-log slopes**")[0].splitlines()
        if re.match(r"\| \d", line)
    ]
    assert [r[0] for r in rows] == ["6", "12", "5", "10"], scaling
    assert all(int(r[1]) > 0 and float(r[2]) > 0 and float(r[-2]) > 0 for r in rows)
    header = next(line for line in scaling.splitlines() if line.startswith("| examples"))
    assert {f"{name} s" for name in bench_scaling.SUITE} <= {
        c.strip() for c in header.strip("|").split("|")
    }
    adversarial = scaling.split("**Adversarial search")[1]
    assert re.search(r"^\| 3 +\| [1-9]\d* +\| 3 ", adversarial, re.M), adversarial


def test_hf_fast_path_equals_naive_re_decode(results):
    import importlib.util

    from prerequisites import require

    require(importlib.util.find_spec("transformers") is not None, "the [hf] extra is missing")
    from benchmarks import bench_hf

    out = bench_hf.main(smoke(results))
    assert out["diff"] <= 1e-5 and out["rows"][0]["steps"] > 0
    assert "Hugging Face model" in results.read_text()


def test_the_gpu_benchmark_runs_without_mlflow_as_a_dry_run(tmp_path):
    """``benchmarks/gpu.sh --dry-run``: the tracking-free entry point runs end to end with mlflow
    unimportable, writes ``$OUT``, the second device computes the same permutation numbers and
    the same whole-battery table, and the mixed-precision training keeps float32 weights."""
    import json
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).parents[2]
    block = tmp_path / "block" / "mlflow"
    block.mkdir(parents=True)
    (block / "__init__.py").write_text("raise ImportError('mlflow is not on the GPU machine')\n")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable, PYTHONPATH=str(block.parent))
    res = subprocess.run(
        # one thread for the CPU standing in for the device: beside the other xdist worker, two
        # threads made every small operator wait (the dry run took 144 s instead of 35 s)
        [str(root / "benchmarks" / "gpu.sh"), "--dry-run", "--device-threads", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads((out / "gpu.json").read_text())
    assert got["dry_run"] and [r["workload"] for r in got["rows"]] == [
        "permutation fast path",
        "adversarial search",
        "training epoch",
        "whole battery (CPU: 1 thread)",
    ]
    assert all(r["cpu 1 thread s"] > 0 and r["device s"] > 0 for r in got["rows"])
    checks = got["checks"]
    assert checks["permutation max abs diff (cpu vs device)"] <= 1e-5
    assert checks["permutation NaN pattern equal"]
    assert checks["training tokens equal"]
    # the whole battery on the two "devices" (here both the CPU): the same table
    battery = checks["battery (cpu vs device)"]
    assert battery["steps"] > 0 and battery["decisions differing"] == "none"
    assert max(battery["worst numeric columns"].values()) <= 1e-5
    assert battery["summary max rel diff"][1] <= 1e-5
    # training.amp (bfloat16 autocast on the CPU): float32 weights, a loss close to float32's
    amp = checks["training.amp on the device"]
    assert amp["amp weights all float32"]
    assert 0 < amp["amp"]["train loss"] < 10 and 0 < amp["float32"]["train loss"] < 10
    assert abs(amp["amp"]["train loss"] - amp["float32"]["train loss"]) < 0.1
    assert "dry run" in (out / "gpu.md").read_text()


def test_trained_benchmark_models_are_cached_under_their_model_key(tmp_path, monkeypatch):
    """Full mode trains each benchmark model once and finds it again (the path ``make bench``
    takes; smoke mode uses random weights and never reaches it)."""
    import argparse

    from benchmarks import common

    monkeypatch.setattr(common, "CACHE", tmp_path / "cache")
    args = argparse.Namespace(smoke=False, model_uri=None)
    small = dict(n_train=200, n_dev=20, n_test=20, epochs=1)
    first = common.get_model(args, "luong", **small)
    assert first.origin.startswith("trained here")
    again = common.get_model(args, "luong", **small)
    assert again.origin.startswith("cached")
    state, cached = first.model.state_dict(), again.model.state_dict()
    assert all(torch.equal(state[k], cached[k]) for k in state)


def test_load_watch_waits_for_the_load_to_settle(monkeypatch):
    from benchmarks import common

    loads = iter([3.0, 2.0, 0.2])
    monkeypatch.setattr(common.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(common.time, "sleep", lambda s: None)
    assert common.LoadWatch().settle(0.3, timeout=60, poll=1) >= 0
    with pytest.raises(StopIteration):  # it stopped asking once the load was low: 3 reads
        next(loads)


def test_adversarial_solver_benchmark_reads_jw_at_every_budget(results, tmp_path):
    """The solver benchmark: J&W read from one long run equals J&W's final evaluation at its
    last checkpoint (the reference passes against itself on every step), rprop-1 at its budgets,
    the CSVs and the figure written."""
    from benchmarks import bench_adversarial_solver as b

    out = b.main(
        smoke(
            results,
            "--kernels",
            "luong",
            "--csv",
            str(tmp_path),
            "--figure",
            str(tmp_path / "f.png"),
        )
    )
    by = {(r["solver"], r["iterations"]): r for r in out["rows"]}
    assert {k for k in by if k[0] == "rprop-1"} == {("rprop-1", 2), ("rprop-1", 4)}
    assert by["jw", 8]["pass rate"] == 1.0 and by["jw", 8]["steps"] > 0
    assert all(0 <= r["pass rate"] <= 1 and r["CPU s"] > 0 for r in out["rows"])
    steps = pd.read_csv(tmp_path / "adversarial-solver-steps.csv")
    assert set(steps["iterations"]) == {2, 4, 8}
    assert (tmp_path / "f.png").stat().st_size > 1000
    assert "long J&W reference" in results.read_text()


def test_cluster_scale_records_every_stub_run_through_ray_and_postgres(results):
    """bench_cluster_scale in smoke mode (6 stub models through a loopback Ray head and
    ``attnstudy server --workers 2`` on a throwaway PostgreSQL), in a process of its own: Ray's
    driver and its variables stay out of this one. Time bound: 10 min (about 80 s at a load of
    9 on this 2-core machine). Not skipped under ``CI=true``: a missing PostgreSQL or extra fails
    there (tests/prerequisites.py)."""
    import importlib.util
    import re
    import subprocess

    from prerequisites import require

    from benchmarks.cluster_kit import initdb_path

    missing = [m for m in ("ray", "psycopg", "psutil") if importlib.util.find_spec(m) is None]
    require(not missing, f"the [distributed] extra is not installed (no {', '.join(missing)})")
    require(initdb_path() is not None, "Debian's postgresql (/usr/lib/postgresql/*/bin/initdb)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_cluster_scale", *smoke(results)],
        cwd=root,
        env=os.environ | {"PYTHONPATH": os.pathsep.join([f"{root}/src", root])},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    text = results.read_text()
    assert "Cluster scale: a 6-model study of stub tasks" in text
    row = re.search(r"^\| 6 +\| (\d+) +\| (\d+) +\| [\d.]+ +\| (\d+) ", text, re.M)
    assert row is not None, text
    runs, finished, requests = map(int, row.groups())
    assert runs == finished == 13  # 6 models, their 6 ablations and the study run
    # each stub model costs at least its two runs' create, log-batch and update requests
    assert requests >= 6 * 2 * 3, text
