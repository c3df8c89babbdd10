"""One code version per study, and GPUs under Ray.

The code version: a digest of the package's sources (and the git commit), recorded on every run,
compared by every Ray task with the driver's. GPUs: ``training.num_gpus`` per task, ``device =
"auto"`` on the GPU a task was given. The Ray tests share one private head on loopback that offers
one (pretend) GPU, started once in a subprocess; CUDA availability is mocked inside the task.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prerequisites import require

from attnstudy.runtime.code_version import (
    CodeVersion,
    CodeVersionError,
    check_same_code,
    code_digest,
    digest_of,
    package_folders,
)

ROOT = Path(__file__).parents[2]


def _package(root: Path) -> dict[str, Path]:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("x = 1\n")
    (root / "pkg" / "sub" / "b.py").write_text("y = 2\n")
    (root / "pkg" / "report.md.j2").write_text("{{ x }}\n")
    return {"": root / "pkg"}


def test_the_code_digest_changes_with_any_source_byte_and_name_only(tmp_path):
    folders = _package(tmp_path)
    pkg = folders[""]
    first = digest_of(folders)
    assert first == digest_of(folders)  # stable
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0compiled")
    (pkg / "notes.txt").write_text("not code")
    assert digest_of(folders) == first  # bytecode and other files are not the code
    (pkg / "a.py").write_text("x = 2\n")
    changed = digest_of(folders)
    assert changed != first
    (pkg / "a.py").write_text("x = 1\n")
    assert digest_of(folders) == first
    (pkg / "report.md.j2").write_text("{{ y }}\n")  # a template is code too
    assert digest_of(folders) != first
    (pkg / "report.md.j2").write_text("{{ x }}\n")
    (pkg / "sub" / "b.py").rename(pkg / "b.py")  # same bytes, another module
    assert digest_of(folders) != first


def test_a_nested_package_folder_counts_once_wherever_it_is_installed(tmp_path):
    """An editable install maps attnstudy.analysis to the checkout's analysis/ folder, a wheel
    keeps it inside attnstudy/: the same sources give the same digest."""
    editable = tmp_path / "editable"
    (editable / "src" / "pkg").mkdir(parents=True)
    (editable / "analysis").mkdir()
    (editable / "src" / "pkg" / "a.py").write_text("x = 1\n")
    (editable / "analysis" / "c.py").write_text("z = 3\n")
    wheel = tmp_path / "wheel" / "pkg"
    (wheel / "analysis").mkdir(parents=True)
    (wheel / "a.py").write_text("x = 1\n")
    (wheel / "analysis" / "c.py").write_text("z = 3\n")
    a = digest_of({"": editable / "src" / "pkg", "analysis/": editable / "analysis"})
    b = digest_of({"": wheel, "analysis/": wheel / "analysis"})
    assert a == b


def test_the_running_package_digest_covers_the_analysis_package():
    folders = package_folders()
    assert set(folders) == {"", "analysis/"}
    assert (folders["analysis/"] / "catalogue.py").is_file()
    assert code_digest() == digest_of(folders)
    assert len(code_digest()) == 64


def test_a_node_with_other_code_is_refused_in_one_line_naming_both_versions():
    driver = CodeVersion("a" * 64, "0123456789abcdef0123")
    check_same_code(driver, CodeVersion("a" * 64, "fedcba9876543210"), "node-1")  # same sources
    with pytest.raises(CodeVersionError) as err:
        check_same_code(driver, CodeVersion("b" * 64, "unknown"), "node-1")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(
        f"the attnstudy code on node node-1 (code {'b' * 12}, no git commit) differs from the "
        f"driver's (code {'a' * 12}, commit 0123456789ab); install the same attnstudy"
    )
    assert "--resume" in text


def test_every_run_records_the_code_version(tiny_config):
    from attnstudy.runtime.code_version import code_commit
    from attnstudy.study.model_runs import run_tags
    from attnstudy.tracking import Kind, Tag

    tags = run_tags(tiny_config.runs()[0], study_id=None, kind=Kind.MODEL, key="k", digest="d")
    assert tags[Tag.CODE_DIGEST] == code_digest()
    assert tags[Tag.CODE_COMMIT] == code_commit()
    assert tags[Tag.CODE_COMMIT] != ""


def test_a_model_reused_across_code_changes_is_noted_not_refused():
    from attnstudy.study.model_runs import _other_code_note
    from attnstudy.tracking import Tag
    from attnstudy.tracking.schema import RunRecord

    same = RunRecord("r1", "0", "n", "FINISHED", {Tag.CODE_DIGEST: code_digest()})
    assert _other_code_note(same) == ""
    older = RunRecord("r2", "0", "n", "FINISHED")  # recorded before the tag existed
    assert _other_code_note(older) == ""
    other = RunRecord(
        "r3", "0", "n", "FINISHED", {Tag.CODE_DIGEST: "c" * 64, Tag.CODE_COMMIT: "1" * 40}
    )
    note = _other_code_note(other)
    assert note.startswith(
        f"; note: it was trained by other attnstudy code (code {'c' * 12}, commit {'1' * 12}; "
        f"this is code {code_digest()[:12]}"
    )
    assert note.endswith("--retrain trains it again with this code")


# ----------------------------------------------------------------------------- GPUs per task


def test_num_gpus_is_a_training_setting_each_task_asks_for():
    from attnstudy.executors.distributed import check_placeable, task_requests
    from attnstudy.experiment import parse_experiment

    raw = {
        "models": [
            {"name": "cpu", "model": {"attention": "additive"}},
            {"name": "gpu", "model": {"attention": "dot"}, "training": {"num_gpus": 1}},
            {"name": "half", "model": {"attention": "none"}, "training": {"num_gpus": 0.5}},
            {"name": "cuda", "model": {"attention": "uniform"}, "training": {"device": "cuda"}},
        ]
    }
    cfg = parse_experiment(raw)
    req = task_requests(cfg)
    assert req["train copy/cpu/seed1"] == (1.0, 0.0)
    assert req["train copy/gpu/seed1"] == (1.0, 1.0)
    assert req["train copy/half/seed1"] == (1.0, 0.5)
    assert req["train copy/cuda/seed1"] == (1.0, 1.0)  # an explicit cuda asks one, as before
    assert req["ablate copy/gpu/seed1"] == (1.0, 0.0)  # ablation.device stays auto: no GPU
    # a CPU-only node and a GPU node: every task has a node
    check_placeable(req, [{"CPU": 2.0}, {"CPU": 2.0, "GPU": 1.0}])
    # num_gpus is not part of the model key (like threads and the device)
    specs = {s.variant: s for s in cfg.runs()}
    plain = parse_experiment({"models": [{"name": "gpu", "model": {"attention": "dot"}}]})
    assert specs["gpu"].model_key("d") == plain.runs()[0].model_key("d")


@pytest.mark.parametrize(
    "training, expect",
    [
        ({"num_gpus": 1.5}, "more than one GPU must be a whole number"),
        ({"device": "cpu", "num_gpus": 1}, "would hold GPUs it never uses"),
        ({"device": "cuda", "num_gpus": 0}, "a Ray task given no GPU sees none"),
        ({"num_gpus": -1}, "num_gpus"),
    ],
)
def test_num_gpus_that_contradicts_the_device_is_refused_in_one_line(training, expect):
    from attnstudy.config import ConfigError
    from attnstudy.experiment import parse_experiment

    with pytest.raises(ConfigError) as err:
        parse_experiment({"training": training}).runs()
    assert expect in str(err.value)
    assert "\n" not in str(err.value)


_RAY_PROBE = """
import json, os, sys
from unittest import mock

from attnstudy.executors import distributed
from attnstudy.executors.distributed import LocalRayHead, train_task

head = LocalRayHead(num_cpus=1, num_gpus=1)  # a CPU machine offering one (pretend) GPU
head.start()
try:
    os.environ.update(head.driver_env())
    ray = distributed._ray(loopback=True)
    # the job ships a staged copy of the code, as the executor does; a module only the copy has
    import tempfile
    from pathlib import Path

    from attnstudy.runtime.code_version import digest_of, stage_code, staged_folders

    staged = stage_code(Path(tempfile.mkdtemp()))
    (staged / "only_in_the_shipped_copy.py").write_text("HERE = True\\n")
    env = {"py_modules": [str(staged)]}
    ray.init(address=head.address, logging_level="ERROR", log_to_driver=False, runtime_env=env)

    def probe():
        import torch

        from attnstudy.models.devices import resolve_device

        # CUDA mocked inside the task: the placement decides; no tensor is moved
        with mock.patch.object(torch.cuda, "is_available", return_value=True):
            with distributed.placed_here():
                return {"gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                        "auto": str(resolve_device("auto"))}

    from attnstudy.experiment import parse_experiment

    spec = parse_experiment({"training": {"num_gpus": 1}}).runs()[0]
    remote = ray.remote(probe)
    given = remote.options(num_cpus=1, num_gpus=spec.training.gpus_per_task())
    none = remote.options(num_cpus=1, num_gpus=0)
    out = {"given": ray.get(given.remote()), "none": ray.get(none.remote())}
    # the driver's code version as the payload carries it, but from other sources
    job = {"code": {"digest": "0" * 64, "commit": "unknown"}, "spec": "not reached"}
    out["other_code"] = ray.get(ray.remote(train_task).options(num_cpus=1).remote(job))
    out["other_code_shipped"] = ray.get(
        ray.remote(train_task).options(num_cpus=1).remote({**job, "shipped": True})
    )

    def where():
        import attnstudy
        import attnstudy.analysis
        import attnstudy.only_in_the_shipped_copy
        from attnstudy.runtime.code_version import this_code

        return {"package": attnstudy.__file__, "analysis": attnstudy.analysis.__file__,
                "code": this_code().digest, "commit": this_code().commit}

    out["shipped"] = ray.get(ray.remote(where).options(num_cpus=1).remote())
    out["staged"] = {"dir": str(staged), "code": digest_of(staged_folders(staged))}
    print("RESULT " + json.dumps(out), flush=True)
    ray.shutdown()
finally:
    head.stop()
"""


@pytest.fixture(scope="module")
def ray_probe(tmp_path_factory):
    """What the Ray tasks of :data:`_RAY_PROBE` saw (one private head for this module)."""
    missing = [m for m in ("ray", "psutil") if importlib.util.find_spec(m) is None]
    require(not missing, f"the [distributed] extra is not installed (no {', '.join(missing)})")
    res = subprocess.run(
        [sys.executable, "-c", _RAY_PROBE],
        cwd=tmp_path_factory.mktemp("ray"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, res.stderr[-2000:]
    return json.loads(line[len("RESULT ") :])


@pytest.mark.slow
def test_auto_trains_on_the_gpu_a_ray_task_was_given_and_on_the_cpu_otherwise(ray_probe):
    assert ray_probe["given"] == {"gpu_ids": ["0"], "auto": "cuda:0"}
    assert ray_probe["none"] == {"gpu_ids": [], "auto": "cpu"}


@pytest.mark.slow
def test_the_code_shipped_by_ray_wins_over_the_nodes_own_install(ray_probe):
    """A task given the driver's staged copy through ``runtime_env`` imports attnstudy (and
    attnstudy.analysis inside it) from that copy, not from this checkout's editable install, and
    its code version is the copy's, commit included (time bound: the module's one private head,
    300 s in all)."""
    from attnstudy.runtime.code_version import code_commit

    got, staged = ray_probe["shipped"], ray_probe["staged"]
    assert not got["package"].startswith(str(ROOT)), got
    assert Path(got["analysis"]).parent.parent == Path(got["package"]).parent
    assert got["code"] == staged["code"] and got["commit"] == code_commit()


@pytest.mark.slow
def test_a_worker_that_did_not_take_the_shipped_code_says_so(ray_probe):
    error = ray_probe["other_code_shipped"]["error"]
    assert "\n" not in error
    assert re.search(
        r"differs from the driver's \(code 000000000000, no git commit\): the code the driver "
        r"ships through Ray's runtime_env did not reach this worker, which imported attnstudy "
        r"from /\S+; check that the node's Ray version takes runtime_env py_modules",
        error,
    ), error


def test_the_shipped_copy_is_the_package_as_one_folder_taken_once(tmp_path):
    """stage_code: attnstudy.analysis inside the copy, no bytecode, the commit named, the same
    digest as the running package's; a source edited afterwards does not reach the copy."""
    from attnstudy.runtime.code_version import (
        SHIPPED_COMMIT,
        code_commit,
        stage_code,
        staged_folders,
    )

    (tmp_path / "a").mkdir()
    staged = stage_code(tmp_path / "a")
    assert staged == tmp_path / "a" / "attnstudy"
    assert (staged / "analysis" / "catalogue.py").is_file()
    assert not list(staged.rglob("__pycache__")) and not list(staged.rglob("*.pyc"))
    assert (staged / SHIPPED_COMMIT).read_text().strip() == code_commit()
    assert digest_of(staged_folders(staged)) == code_digest()
    with pytest.raises(FileExistsError, match="stage the code into an empty folder"):
        stage_code(tmp_path / "a")
    # a package of our own, edited after its copy was taken
    src = _package(tmp_path / "src")
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "c.py").write_text("z = 3\n")
    folders = {**src, "analysis/": tmp_path / "analysis"}
    (tmp_path / "b").mkdir()
    copy = stage_code(tmp_path / "b", folders)
    before = digest_of(folders)
    (src[""] / "a.py").write_text("x = 99\n")
    assert digest_of(staged_folders(copy)) == before != digest_of(folders)
    assert (copy / "analysis" / "c.py").read_text() == "z = 3\n"
    assert (copy / SHIPPED_COMMIT).read_text().strip() == "unknown"  # not the running package


@pytest.mark.slow
def test_a_ray_task_on_a_node_with_other_code_refuses_before_any_run(ray_probe):
    out = ray_probe["other_code"]
    assert out["ok"] is False and out["failed_run_id"] is None
    error = out["error"]
    assert "\n" not in error
    # this node's version (not compared with this process's: others may edit the checkout meanwhile)
    assert re.match(
        r"the attnstudy code on node \S+ \(code [0-9a-f]{12}, (commit [0-9a-f]{12}|no git commit)\) "
        r"differs from the driver's \(code 000000000000, no git commit\); install the same ",
        error,
    ), error


def test_sources_edited_since_the_driver_started_are_refused_before_any_task(monkeypatch):
    """The driver ships a copy of the sources on disk; when they differ from the code the driver
    itself runs (edited since it started), the study is refused in one line, and the copy's
    folder (the executor's own) is removed on close."""
    from attnstudy.config import ConfigError
    from attnstudy.executors import distributed
    from attnstudy.runtime import code_version

    ex = distributed.RayExecutor(address="127.0.0.1:1")
    runtime_env, code = ex._ship_code()
    staged = Path(runtime_env["py_modules"][0])
    assert code == {"digest": code_digest(), "commit": code_version.code_commit()}
    assert staged.name == "attnstudy" and staged.is_dir()
    ex.close()
    assert not staged.parent.exists()
    running = CodeVersion("e" * 64, "unknown")
    monkeypatch.setattr(code_version, "this_code", lambda: running)
    ex = distributed.RayExecutor(address="127.0.0.1:1")
    with pytest.raises(ConfigError) as err:
        ex._ship_code()
    ex.close()
    assert str(err.value).startswith(
        "the attnstudy sources changed since this command started (code eeeeeeeeeeee, no git "
        "commit running, code "
    )
    assert str(err.value).endswith("so that every task runs the code the study records")


def test_closing_removes_only_the_folder_the_executor_made_for_the_copy(tmp_path, monkeypatch):
    """The shipped copy lives in a temporary folder the executor created (``mkdtemp``); closing
    removes that folder and nothing beside it (sentinel files and a folder of the same prefix)."""
    import tempfile

    from attnstudy.executors import distributed

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "sentinel.txt").write_text("keep")
    other = tmp_path / "attnstudy-shipped-code-not-ours"
    other.mkdir()
    (other / "sentinel.py").write_text("keep = True\n")
    ex = distributed.RayExecutor(address="127.0.0.1:1")
    runtime_env, _ = ex._ship_code()
    staged = Path(runtime_env["py_modules"][0])
    assert staged.parent.parent == tmp_path
    ex.close()
    ex.close()  # twice: nothing more goes
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name, "sentinel.txt"]
    assert (other / "sentinel.py").read_text() == "keep = True\n"
    assert (tmp_path / "sentinel.txt").read_text() == "keep"
