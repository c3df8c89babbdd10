"""``attnstudy ablate hf:FOLDER --tsv FILE`` logs what every other ablation run logs and says what
it analysed: the example browser it prints exists, and its header counts the file's examples."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cli_in_process import run_cli  # noqa: E402
from prerequisites import require  # noqa: E402

require(
    importlib.util.find_spec("transformers") is not None,
    "transformers is not installed (pip install -e '.[hf]')",
    module_level=True,
)

from attnstudy.models.hf_tiny import build_tiny  # noqa: E402

LINES = "cat dog\tcat dog\t0-0 1-1\nsnow rain fire\tsnow rain fire\nblue fish\tblue fish\n"
"""Three examples (the default cap, ``ablation.n_examples``, is 200)."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("hf") / "tiny", steps=0)


def _ablate(capfd, fresh_root, folder):
    tsv = fresh_root / "three.tsv"
    tsv.write_text(LINES, encoding="utf-8")
    argv = ["ablate", f"hf:{folder}", "--tsv", str(tsv), "--prefix", "reference", "--quiet"]
    argv += ["--record"]
    res = run_cli(capfd, [*argv, "--ablations", "saliency"], cwd=fresh_root, env={})
    assert res.returncode == 0, res.stderr
    return res


def test_the_printed_example_browser_exists(capfd, fresh_root, folder):
    res = _ablate(capfd, fresh_root, folder)
    (line,) = [x for x in res.stdout.splitlines() if x.startswith("example browser: ")]
    browser = Path(line.removeprefix("example browser: "))
    assert browser.is_file(), f"printed but not written: {browser}"
    page = browser.read_text(encoding="utf-8")
    assert "three/1" in page and "three/3" in page  # the examples of the file
    for name in ("examples.csv", "steps.csv", "summary.csv", "heatmaps.json"):
        assert (browser.parent / name).is_file(), name


def test_the_header_counts_the_files_examples_not_the_cap(capfd, fresh_root, folder):
    import mlflow

    res = _ablate(capfd, fresh_root, folder)
    assert "\ntsv hf-tiny: 3 test examples, prefix reference;" in res.stdout, res.stdout
    run_id = res.stdout.strip().splitlines()[-1].removeprefix("ablation run: runs:/")
    client = mlflow.MlflowClient(f"sqlite:///{fresh_root / 'mlruns' / 'mlflow.db'}")
    assert client.get_run(run_id).data.metrics["ablation/n_examples"] == 3


def test_the_ablation_run_logs_system_metrics_and_progress(capfd, fresh_root, folder):
    """CPU and memory (``system/*``) and ``progress/fraction`` on a pretrained model's ablation
    run, as on a trained model's (they were missing there)."""
    import mlflow

    tsv = fresh_root / "three.tsv"
    tsv.write_text(LINES, encoding="utf-8")
    argv = ["ablate", f"hf:{folder}", "--tsv", str(tsv), "--prefix", "reference", "--quiet"]
    env = {"ATTNSTUDY_SYSTEM_METRICS": "1", "ATTNSTUDY_SYSTEM_METRICS_SECONDS": "0.2"}
    res = run_cli(capfd, [*argv, "--ablations", "saliency", "--record"], cwd=fresh_root, env=env)
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.strip().splitlines()[-1].removeprefix("ablation run: runs:/")
    client = mlflow.MlflowClient(f"sqlite:///{fresh_root / 'mlruns' / 'mlflow.db'}")
    metrics = client.get_run(run_id).data.metrics
    assert metrics["system/process_memory_rss_megabytes"] > 50  # torch and transformers loaded
    assert "system/process_cpu_utilization_percentage" in metrics
    assert [m.value for m in client.get_metric_history(run_id, "progress/fraction")][-1] == 1.0


def test_without_record_it_prints_what_the_recorded_ablate_prints_and_records_nothing(
    capfd, fresh_root, folder
):
    """Without ``--record`` (a quick look, as inseq's ``attribute`` command gives one): the same
    statistics and verdict as the recorded ``ablate`` of the same model and examples, without
    the lines naming the runs and the browser, and a last line saying nothing was recorded; no
    store created, and MLflow never imported (a process of its own: the process boundary is what
    is tested)."""
    import os
    import subprocess

    from attnstudy.cli.main import NOTHING_RECORDED

    tsv = fresh_root / "three.tsv"
    tsv.write_text(LINES, encoding="utf-8")
    argv = ["ablate", f"hf:{folder}", "--tsv", str(tsv), "--prefix", "reference", "--quiet"]
    argv += ["--ablations", "permutation,saliency"]
    recorded = run_cli(capfd, [*argv, "--record"], cwd=fresh_root, env={})
    assert recorded.returncode == 0, recorded.stderr
    quick_root = fresh_root / "quick"
    quick_root.mkdir()
    wrapper = (
        "import sys; from attnstudy.cli.main import main; rc = main(sys.argv[1:]); "
        "print('MLFLOW' if 'mlflow' in sys.modules else 'NO MLFLOW'); sys.exit(rc)"
    )
    env = dict(os.environ, ATTNSTUDY_ROOT=str(quick_root))
    env.pop("MLFLOW_TRACKING_URI", None)
    quick = subprocess.run(
        [sys.executable, "-c", wrapper, *argv],
        cwd=quick_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert quick.returncode == 0, quick.stderr[-3000:]
    *lines, imported = quick.stdout.splitlines()
    assert imported == "NO MLFLOW"
    shown = recorded.stdout.splitlines()
    assert shown[0].startswith("model run: runs:/")
    assert shown[-2].startswith("example browser: ") and shown[-1].startswith("ablation run: ")
    assert lines == [*shown[1:-2], NOTHING_RECORDED]
    assert "permutation flip rate" in quick.stdout and "τ attention–saliency" in quick.stdout
    assert list(quick_root.iterdir()) == []  # no store, no run folder, no browser


def test_record_is_for_a_pretrained_model_with_its_examples(capfd, fresh_root, folder):
    res = run_cli(capfd, ["ablate", "runs:/0123abcd", "--record"], cwd=fresh_root, env={})
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "attnstudy: error: --record applies to ablate hf:FOLDER --tsv FILE (a stored model's "
        "ablation, and one with --data, is always recorded): drop --record"
    )


def test_a_tracking_uri_asks_for_a_store(capfd, fresh_root, folder):
    """``--tracking-uri`` names where to record: the battery is recorded there without
    ``--record``."""
    tsv = fresh_root / "three.tsv"
    tsv.write_text(LINES, encoding="utf-8")
    uri = f"sqlite:///{fresh_root / 'elsewhere.db'}"
    argv = ["ablate", f"hf:{folder}", "--tsv", str(tsv), "--quiet", "--ablations", "saliency"]
    res = run_cli(capfd, [*argv, "--tracking-uri", uri], cwd=fresh_root, env={})
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1].startswith("ablation run: runs:/")
    assert (fresh_root / "elsewhere.db").is_file()
    assert not (fresh_root / "mlruns" / "mlflow.db").exists()  # not the default store
