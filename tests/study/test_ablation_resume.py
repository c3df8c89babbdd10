"""An ablation run interrupted after batch k continues on ``resume`` from its last finished batch,
in the same run: its artifacts (tables, records, browser, figures), metrics and verdict are the
uninterrupted run's, bit for bit, timings excepted by name; the batch files are artifacts of the
run while it is unfinished and gone once it finished; a run of other settings or other code is
never continued; a real SIGKILL of the worker process is resumed as well."""

from __future__ import annotations

import difflib
import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from attnstudy.analysis.suite_state import StateError, batch_meta

from attnstudy.study import ablation_resume
from attnstudy.study.ablation_resume import PARTIAL, ArtifactJournal, is_timing_metric

BATCH = 4  # 10 examples: 3 batches of the greedy prefix, 3 of the reference (alignment)
ROOT = Path(__file__).parents[2]


class Stop(KeyboardInterrupt):
    """Ctrl-C, raised inside the batch hook once batch ``k`` is kept."""


@pytest.fixture
def small_batches(monkeypatch):
    import attnstudy.analysis.suite as suite

    monkeypatch.setattr(suite, "run_suite", functools.partial(suite.run_suite, batch_size=BATCH))


def _cfg(tiny_config, **kw):
    return tiny_config.ablation.model_copy(update={"n_examples": 10, **kw})


def _ablate(tracker, model_run_id, cfg, **kw):
    from attnstudy.study.ablation_runs import ablate_run
    from attnstudy.study.model_runs import load_model

    _, loaded = load_model(f"runs:/{model_run_id}", tracker)
    return ablate_run(model_run_id, loaded, cfg, tracker, progress=False, **kw)[0]


def _interrupted(monkeypatch, tracker, model_run_id, cfg, k: int) -> str:
    real = ArtifactJournal.finished
    seen = {}

    def finished(self, state):
        real(self, state)
        seen["run"] = self.run_id
        if state.index == k:
            raise Stop

    with monkeypatch.context() as m:
        m.setattr(ArtifactJournal, "finished", finished)
        with pytest.raises(Stop):
            _ablate(tracker, model_run_id, cfg)
    return seen["run"]


def _artifacts(tracker, run_id, tmp: Path) -> dict[str, bytes]:
    """Every artifact's bytes, the run's own id written RUN, and in summary.csv the rows of a
    timing metric (``ablation/seconds``: wall-clock time of the run) left out."""
    local = Path(tracker.download_artifact(run_id, "", tmp / run_id))
    out = {}
    for p in sorted(local.rglob("*")):
        if p.is_file():
            data = p.read_bytes().replace(run_id.encode(), b"RUN")
            if p.name == "summary.csv":
                lines = data.decode().splitlines(keepends=True)
                data = "".join(x for x in lines if not is_timing_metric(x.split(",")[0])).encode()
            out[str(p.relative_to(local))] = data
    return out


def _same_as(tracker, run_id, want_id, tmp: Path) -> None:
    got, want = tracker.get_run(run_id), tracker.get_run(want_id)
    assert got.status == "FINISHED"
    files, want_files = _artifacts(tracker, run_id, tmp), _artifacts(tracker, want_id, tmp)
    assert sorted(files) == sorted(want_files) and not any(f.startswith(PARTIAL) for f in files)
    for name in files:  # tables, records, browser, figures: byte for byte
        assert files[name] == want_files[name], name
    results = {k: v for k, v in got.metrics.items() if not is_timing_metric(k)}
    assert results == {k: v for k, v in want.metrics.items() if not is_timing_metric(k)}
    assert len(results) > 20 and "ablation/seconds" in got.metrics
    assert got.params == want.params
    verdict = {k: v for k, v in got.tags.items() if k.startswith("verdict.")}
    assert verdict and verdict == {k: v for k, v in want.tags.items() if k.startswith("verdict.")}


@pytest.fixture
def uninterrupted(tiny_study_root, tiny_models, tiny_config, small_batches, figures_not_drawn):
    from attnstudy.tracking import Tracker

    tracker = Tracker(create=False)
    model = tiny_models[0].run_id  # additive
    return tracker, model, _ablate(tracker, model, _cfg(tiny_config))


@pytest.mark.parametrize("k", [0, pytest.param(4, marks=pytest.mark.slow)])
def test_interrupted_after_batch_k_resumes_in_the_same_run(
    uninterrupted, tiny_config, monkeypatch, tmp_path, k
):
    tracker, model, want = uninterrupted
    cfg = _cfg(tiny_config)
    killed = _interrupted(monkeypatch, tracker, model, cfg, k)
    run = tracker.get_run(killed)
    assert run.status == "KILLED"
    partial = [f.path for f in tracker.client.list_artifacts(killed, PARTIAL)]
    assert partial == [f"{PARTIAL}/batch-{i:06d}.zip" for i in range(k + 1)]
    computed = []
    real = ArtifactJournal.finished
    monkeypatch.setattr(
        ArtifactJournal, "finished", lambda self, s: (computed.append(s.index), real(self, s))
    )
    assert _ablate(tracker, model, cfg, resume=True) == killed
    assert computed == list(range(k + 1, 6))  # batches 0…k put back, not computed
    _same_as(tracker, killed, want, tmp_path)


@pytest.mark.slow
def test_other_settings_or_code_start_a_new_run(uninterrupted, tiny_config, monkeypatch, tmp_path):
    from attnstudy.tracking import Tag

    tracker, model, _ = uninterrupted
    cfg = _cfg(tiny_config)
    killed = _interrupted(monkeypatch, tracker, model, cfg, 1)
    other = _ablate(tracker, model, _cfg(tiny_config, seed=1), resume=True)  # another ablation key
    assert other != killed and tracker.get_run(killed).status == "KILLED"
    tracker.set_tags(killed, {Tag.CODE_DIGEST: "0" * 64})  # written by other code
    again = _ablate(tracker, model, cfg, resume=True)
    assert again not in (killed, other) and tracker.get_run(killed).status == "KILLED"
    # the batch files themselves carry the key: the other code's files are never read
    local = Path(tracker.download_artifact(killed, f"{PARTIAL}/batch-000000.zip", tmp_path))
    key = ablation_resume.resume_key(model, tracker.get_run(again).tags[Tag.ABLATION_KEY], "1" * 64)
    with pytest.raises(StateError, match="its key differs"):
        batch_meta(local, key, 0, [("greedy", ())])


WORKER = textwrap.dedent(
    """
    import functools, sys, time
    import torch
    import attnstudy.analysis.suite as suite
    import attnstudy.runtime.code_version as code_version
    from attnstudy.study.ablation_resume import ArtifactJournal
    from attnstudy.study.ablation_runs import ablate_run
    from attnstudy.experiment import load_experiment
    from attnstudy.study.model_runs import load_model
    from attnstudy.tracking import Tracker

    suite.run_suite = functools.partial(suite.run_suite, batch_size={batch})
    code_version.code_digest = lambda: sys.argv[3]  # the test's (see the test)
    torch.set_num_threads(1)  # as the test process and the CLI (float sums depend on threads)
    real = ArtifactJournal.finished

    def finished(self, state):
        real(self, state)
        print("batch", state.index, flush=True)
        if state.index == {k}:
            time.sleep(600)  # killed here, its batch {k} kept

    ArtifactJournal.finished = finished
    cfg = load_experiment(sys.argv[1]).ablation.model_copy(update={{"n_examples": 10}})
    tracker = Tracker(create=False)
    _, loaded = load_model("runs:/" + sys.argv[2], tracker)
    ablate_run(sys.argv[2], loaded, cfg, tracker, progress=False)
    """
)


@pytest.mark.slow
def test_a_sigkilled_worker_is_resumed(uninterrupted, tiny_config, tmp_path):
    """A real process killed with SIGKILL after its batch 2 (no handler runs, its run stays
    RUNNING): the resume closes the orphan and continues it."""
    tracker, model, want = uninterrupted
    script = tmp_path / "worker.py"
    from attnstudy.runtime.code_version import code_digest

    script.write_text(WORKER.format(batch=BATCH, k=2))
    # the worker runs under this process's code digest: files of a working tree being edited
    # may change between the two digests, and another digest is rightly never resumed (tested
    # above); this test is about the kill
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    proc = subprocess.Popen(
        [
            sys.executable,
            str(script),
            str(ROOT / "experiments" / "tiny.toml"),
            model,
            code_digest(),
        ],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        for line in proc.stdout:
            if line.strip() == "batch 2" or time.monotonic() > deadline:
                break
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    (orphan,) = [
        r
        for r in tracker.search_runs(
            [tracker.get_run(model).experiment_id], "tags.kind = 'ablation'"
        )
        if r.status == "RUNNING"
    ]
    resumed = _ablate(tracker, model, _cfg(tiny_config), resume=True)
    assert resumed == orphan.run_id
    _same_as(tracker, resumed, want, tmp_path)


def _report(root: Path) -> dict[str, str]:
    """The study's report files with every run id and date written alike."""
    import re

    out = {}
    for name in ("report.md", "report.html"):
        text = (root / "reports" / "tiny" / name).read_text(encoding="utf-8")
        text = re.sub(r"\b[0-9a-f]{32}\b", "RUN", text)
        text = re.sub(r"<code>[0-9a-f]{12}</code>", "<code>RUN</code>", text)  # short run ids
        out[name] = re.sub(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d)?[^ <|]*", "DATE", text)
    return out


@pytest.mark.slow
def test_a_study_interrupted_in_an_ablation_resumes_to_the_same_report(
    tmp_path, monkeypatch, small_batches, figures_not_drawn
):
    """`run` interrupted (Ctrl-C) after batch 3 of a model's ablations, then `run --resume`: the
    report is the uninterrupted study's (run ids and dates aside)."""
    from attnstudy import api
    from attnstudy.experiment import load_experiment

    cfg = load_experiment(ROOT / "experiments" / "tiny.toml", ["ablation.n_examples=10"])
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    reports = {}
    for name in ("whole", "resumed"):
        root = tmp_path / name
        (root / "mlruns").mkdir(parents=True)
        monkeypatch.setenv("ATTNSTUDY_ROOT", str(root))
        if name == "resumed":
            real = ArtifactJournal.finished

            def finished(self, state, real=real):
                real(self, state)
                if state.index == 3:
                    raise Stop

            with monkeypatch.context() as m:
                m.setattr(ArtifactJournal, "finished", finished)
                with pytest.raises(KeyboardInterrupt):
                    api.run(cfg, progress=False)
            out = api.run(cfg, progress=False, resume=True)
            assert out.resumed
        else:
            api.run(cfg, progress=False)
        reports[name] = _report(root)
    for name, text in reports["whole"].items():
        diff = difflib.unified_diff(
            text.splitlines(), reports["resumed"][name].splitlines(), lineterm="", n=0
        )
        assert reports["resumed"][name] == text, name + "\n" + "\n".join(list(diff)[:20])[:3000]
