"""Nothing of the user's is ever deleted or overwritten (attnstudy.runtime.outputs).

Every verb that writes a folder is pointed at a folder full of sentinel files, and at the store, the
current directory, the project root and ``$HOME``: it refuses (exit 2, one line) and every sentinel
survives byte for byte. The verbs covered: ``report --out``, ``report --results``, ``run``
(``reports/<experiment>/``), ``server --artifacts`` and ``python -m attnstudy.models.hf_tiny DIR``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_in_process import run_cli

from attnstudy.cli.main import main
from attnstudy.runtime import outputs
from attnstudy.runtime.outputs import MARKER, OutputError


@pytest.fixture(autouse=True)
def _undrawn(figures_not_drawn):
    """Files kept or replaced, not pixels: figures here are saved as blank PNGs of their sizes
    (the report and figure tests draw the same figures in full)."""


def sentinels(folder: Path) -> dict[str, bytes]:
    """Fill ``folder`` with a user's files (one in a subfolder, one hidden); return a snapshot."""
    (folder / "sub").mkdir(parents=True, exist_ok=True)
    (folder / "precious.txt").write_text("important\n")
    (folder / "sub" / "thesis.tex").write_text("\\section{x}\n")
    (folder / ".hidden").write_bytes(b"\x00\x01")
    return snapshot(folder)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def survives(folder: Path, before: dict[str, bytes]) -> None:
    after = snapshot(folder)
    for name, content in before.items():
        assert after.get(name) == content, f"{name} was changed or removed"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# --- the module itself -------------------------------------------------------------------------


def test_replace_folder_builds_then_replaces_only_its_own_folder(tmp_path):
    out = tmp_path / "rep"
    outputs.replace_folder(out, lambda d: (d / "a.txt").write_text("1"), kind="report", option="-o")
    marker = json.loads((out / MARKER).read_text())
    assert marker["kind"] == "report" and set(marker["files"]) == {"a.txt"}
    outputs.replace_folder(out, lambda d: (d / "b.txt").write_text("2"), kind="report", option="-o")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]  # no leftover beside it

    (out / "notes.txt").write_text("mine")  # a file the tool did not write, inside its folder
    with pytest.raises(OutputError, match=r"holds notes\.txt, which attnstudy did not write"):
        outputs.replace_folder(out, lambda d: None, kind="report", option="-o")
    assert (out / "notes.txt").read_text() == "mine" and (out / "b.txt").read_text() == "2"
    with pytest.raises(OutputError, match="holds attnstudy's report output, not a hf-model"):
        outputs.replace_folder(out, lambda d: None, kind="hf-model", option="-o")


def test_a_failed_build_leaves_the_old_folder_and_no_leftover(tmp_path):
    out = tmp_path / "rep"
    outputs.replace_folder(out, lambda d: (d / "a.txt").write_text("1"), kind="report", option="-o")

    def boom(d):
        (d / "half.txt").write_text("x")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        outputs.replace_folder(out, boom, kind="report", option="-o")
    assert (out / "a.txt").read_text() == "1" and not (out / "half.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]


def test_a_foreign_or_old_folder_is_refused_before_anything_is_written(tmp_path):
    user = tmp_path / "user"
    before = sentinels(user)
    called = []
    with pytest.raises(OutputError, match=r"is not empty and was not made by attnstudy"):
        outputs.replace_folder(user, called.append, kind="report", option="--out")
    assert not called
    survives(user, before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["user"]

    old = tmp_path / "old-report"  # a report folder written before the marker existed
    old.mkdir()
    (old / "report.html").write_text("<html>")
    (old / "report.md").write_text("# r")
    with pytest.raises(OutputError, match=rf"older attnstudy .* remove it with `rm -r {old}`"):
        outputs.replace_folder(old, called.append, kind="report", option="--out")
    assert (old / "report.html").read_text() == "<html>"

    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(OutputError, match="exists and is not a folder"):
        outputs.replace_folder(a_file, called.append, kind="report", option="--out")
    assert a_file.read_text() == "x"

    fake = tmp_path / "fake"  # a marker that is not the tool's JSON does not make a folder ours
    fake.mkdir()
    (fake / MARKER).write_text("not json")
    (fake / "data.csv").write_text("1")
    with pytest.raises(OutputError, match="was not made by attnstudy"):
        outputs.replace_folder(fake, called.append, kind="report", option="--out")
    assert (fake / "data.csv").read_text() == "1"


def test_leftovers_are_removed_only_when_their_process_is_gone_and_they_are_ours(tmp_path):
    out = tmp_path / "rep"
    gone, me = dead_pid(), os.getpid()

    def leftover(name, marker=True, files=("x",), listed=None, digest=None):
        d = tmp_path / name
        d.mkdir()
        for f in files:
            (d / f).write_text(f)
        if marker:
            listed = files if listed is None else listed
            digests = {f: digest or outputs._digest(d / f) for f in listed}
            outputs.write_marker(d, "report", digests, folders=())
        return d

    building = tmp_path / f".rep.tmp-{gone}-bld"  # a build interrupted after its first file
    building.mkdir()
    outputs.write_marker(building, "report", {}, folders=(), building=True)
    (building / "x").write_text("x")
    removed = {
        leftover(f".rep.tmp-{gone}-abc"),
        leftover(f".rep.old-{gone}-def"),
        leftover(f".rep.tmp-{gone}-empty", marker=False, files=()),
        building,
    }
    kept = {
        leftover(f".rep.old-{me}-ghi"),  # its process may still be swapping it in
        leftover(f".rep.tmp-{gone}-jkl", marker=False),  # not provably ours
        leftover(f".rep.old-{gone}"),  # the old naming without a random part: never guessed
        leftover(f".other.tmp-{gone}-mno"),  # another folder's
        # a marker copied in: it does not list the file, or lists it with another digest
        leftover(f".rep.old-{gone}-cop", listed=()),
        leftover(f".rep.old-{gone}-dig", digest="0" * 64),
    }
    outputs.replace_folder(out, lambda d: None, kind="report", option="-o")
    for d in removed:
        assert not d.exists(), d.name
    for d in kept:
        assert (d / "x").read_text() == "x", d.name


def test_write_files_overwrites_only_files_it_can_show_it_wrote(tmp_path):
    folder = tmp_path / "results"
    before = sentinels(folder)
    (folder / "study.csv").write_text("the user's own table\n")
    with pytest.raises(OutputError, match=r"study\.csv was not written by attnstudy"):
        outputs.write_files(folder, {"new.csv": b"a\n", "study.csv": b"b\n"}, option="--results")
    assert not (folder / "new.csv").exists()  # every file is checked before the first is written
    assert (folder / "study.csv").read_text() == "the user's own table\n"

    (folder / "study.csv").unlink()
    outputs.write_files(folder, {"new.csv": b"a\n", "study.csv": b"b\n"}, option="--results")
    outputs.write_files(folder, {"study.csv": b"c\n"}, option="--results")  # ours: overwritten
    assert (folder / "study.csv").read_text() == "c\n" and (folder / "new.csv").read_text() == "a\n"
    survives(folder, before)

    (folder / "new.csv").write_text("edited by hand\n")
    with pytest.raises(OutputError, match=r"new\.csv was changed after attnstudy wrote it"):
        outputs.write_files(folder, {"new.csv": b"z\n"}, option="--results")
    assert (folder / "new.csv").read_text() == "edited by hand\n"


def test_an_interrupted_write_leaves_every_file_old_or_new_and_still_ours(tmp_path, monkeypatch):
    folder = tmp_path / "results"
    outputs.write_files(folder, {"a.csv": b"old a\n", "b.csv": b"old b\n"}, option="--results")
    real = os.replace
    calls = []

    def interrupted(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # after a.csv is written, before b.csv
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(outputs.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        outputs.write_files(folder, {"a.csv": b"new a\n", "b.csv": b"new b\n"}, option="--results")
    monkeypatch.setattr(outputs.os, "replace", real)
    assert (folder / "a.csv").read_text() == "new a\n" and (
        folder / "b.csv"
    ).read_text() == "old b\n"
    assert sorted(p.name for p in folder.iterdir()) == [MARKER, "a.csv", "b.csv"]
    outputs.write_files(folder, {"a.csv": b"A\n", "b.csv": b"B\n"}, option="--results")  # rerun
    assert (folder / "b.csv").read_text() == "B\n"


@pytest.mark.parametrize(
    "place", ["cwd", "root", "home", "store", "checkpoints", "inside", "above"]
)
def test_protected_places_are_refused(place, fresh_root, tmp_path, monkeypatch):
    cwd, home = tmp_path / "work", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))
    path = {
        "cwd": cwd,
        "root": fresh_root,
        "home": home,
        "store": fresh_root / "mlruns",
        "checkpoints": fresh_root / "mlruns" / "checkpoints",
        "inside": fresh_root / "mlruns" / "artifacts" / "rep",
        "above": tmp_path,
    }[place]
    with pytest.raises(OutputError, match=r"(is|contains|lies inside) .*attnstudy never writes"):
        outputs.check_output(path, "--out")


def test_a_sqlite_store_elsewhere_is_protected_but_its_neighbours_are_not(fresh_root, tmp_path):
    db = tmp_path / "a" / "elsewhere" / "mlflow.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"")
    stores = outputs.store_folders_of(f"sqlite:///{db}")
    assert stores == [db]
    for path, relation in ((db, "is"), (db.parent, "contains"), (db.parent.parent, "contains")):
        with pytest.raises(OutputError, match=f"{relation} the tracking store's database"):
            outputs.check_output(path, "--out", stores)
    assert outputs.check_output(db.parent / "report", "--out", stores) == db.parent / "report"
    assert outputs.store_folders_of("http://127.0.0.1:5000") == []


# --- every verb that writes, through the command line --------------------------------------------


@pytest.fixture
def study(tiny_study, store_root, monkeypatch, tmp_path):
    """The session's tiny study; the working directory is a folder of this test."""
    monkeypatch.chdir(tmp_path)
    return tiny_study.study_run_id


@pytest.mark.slow
def test_report_out_never_deletes_a_users_folder(study, store_root, tmp_path, capsys):
    user = tmp_path / "userdir"
    before = sentinels(user)
    assert main(["report", "--study", study, "--out", str(user)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnstudy: error: --out") and "was not made by attnstudy" in err
    assert len(err.splitlines()) == 1
    survives(user, before)

    # the same check guards the API (the CLI's early check aside)
    from attnstudy import api

    with pytest.raises(OutputError):
        api.report(study_id=study, out_dir=str(user))
    survives(user, before)


@pytest.mark.slow
@pytest.mark.parametrize("where", [".", "ROOT", "ROOT/mlruns", "ROOT/mlruns/checkpoints", "HOME"])
def test_report_out_refuses_the_store_cwd_root_and_home(
    where, study, store_root, tmp_path, monkeypatch, capsys
):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "notes.txt").write_text("keep")
    (home / "notes.txt").write_text("keep")
    root_before = snapshot(store_root / "mlruns")
    out = where.replace("ROOT", str(store_root)).replace("HOME", str(home))
    for option in ("--out", "--results"):
        assert main(["report", "--study", study, option, out]) == 2
        assert "attnstudy never writes its output there" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "keep" and (home / "notes.txt").exists()
    survives(store_root / "mlruns", root_before)


@pytest.mark.slow
def test_report_results_writes_beside_the_users_files_and_never_over_them(
    study, store_root, tmp_path, capsys
):
    res, rep = tmp_path / "results", tmp_path / "rep"
    before = sentinels(res)
    (res / "tiny.csv").write_text("a table of the user's\n")
    assert main(["report", "--study", study, "--out", str(rep), "--results", str(res)]) == 2
    assert "tiny.csv was not written by attnstudy" in capsys.readouterr().err
    assert (res / "tiny.csv").read_text() == "a table of the user's\n"
    assert not rep.exists()  # checked before the report was written
    survives(res, before)

    (res / "tiny.csv").unlink()
    for _ in range(2):  # the second run overwrites what the first wrote
        assert main(["report", "--study", study, "--out", str(rep), "--results", str(res)]) == 0
    assert (res / "tiny.csv").read_text().startswith("model,")
    assert (rep / "report.html").is_file() and (rep / MARKER).is_file()
    survives(res, before)


@pytest.mark.slow
def test_run_refuses_a_report_folder_it_did_not_make_before_training(
    fresh_root, tiny_config, capsys
):
    from attnstudy import api

    user = fresh_root / "reports" / "tiny"
    before = sentinels(user)
    with pytest.raises(OutputError, match=r"the report folder .*reports/tiny is not empty"):
        api.run(tiny_config, progress=False)
    survives(user, before)
    assert not (fresh_root / "mlruns" / "checkpoints").exists()  # nothing was trained


def test_server_artifacts_refuses_protected_places_and_keeps_a_users_files(
    fresh_root, tmp_path, monkeypatch, capsys
):
    from attnstudy.serving import server

    monkeypatch.chdir(tmp_path)
    for where in (".", str(fresh_root), str(fresh_root / "mlruns"), os.environ["HOME"]):
        with pytest.raises(ValueError, match="attnstudy never writes its output there"):
            server.check_args("sqlite:///x.db", where, "127.0.0.1", 5000)
    user = tmp_path / "art"
    before = sentinels(user)
    server.check_args("sqlite:///x.db", str(user), "127.0.0.1", 5000)
    assert server.artifacts_destination(str(user)) == user.resolve().as_uri()
    survives(user, before)


@pytest.mark.slow
def test_server_on_a_folder_of_the_users_keeps_every_file(fresh_root, tmp_path):
    """A real tracking server logs an artifact into a folder holding the user's files."""
    import socket
    import time
    import urllib.request

    from attnstudy.serving import server, ui

    user = tmp_path / "art"
    before = sentinels(user)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = server.start(f"sqlite:///{tmp_path / 'srv.db'}", str(user), host="127.0.0.1", port=port)
    try:
        ui.wait_healthy(f"http://127.0.0.1:{port}", 120, proc)
        import mlflow

        client = mlflow.MlflowClient(f"http://127.0.0.1:{port}")
        run = client.create_run(client.create_experiment("sentinels"))
        (tmp_path / "logged.txt").write_text("logged")
        client.log_artifact(run.info.run_id, str(tmp_path / "logged.txt"))
        client.set_terminated(run.info.run_id)
        time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert r.status == 200
    finally:
        ui.stop_server(proc)
    survives(user, before)
    assert [p.read_text() for p in user.rglob("logged.txt")] == ["logged"]


def test_hf_tiny_refuses_a_users_folder_and_protected_places(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    from attnstudy.models import hf_tiny

    user = tmp_path / "user"
    before = sentinels(user)
    monkeypatch.chdir(user)
    for where in (str(user), "."):
        assert hf_tiny.main([where, "--steps", "0"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error:" in err
    survives(user, before)


@pytest.mark.slow
def test_hf_tiny_replaces_only_its_own_folder(tmp_path):
    pytest.importorskip("transformers")
    from attnstudy.models import hf_tiny

    folder = tmp_path / "tiny"
    assert hf_tiny.main([str(folder), "--steps", "0"]) == 0
    first = snapshot(folder)
    assert "config.json" in first and MARKER in first
    assert hf_tiny.main([str(folder), "--steps", "0", "--seed", "1"]) == 0  # its own: replaced
    (folder / "README.md").write_text("my notes")
    assert hf_tiny.main([str(folder), "--steps", "0"]) == 2
    assert (folder / "README.md").read_text() == "my notes"


# --- a changed file is never replaced: the marker's digests are compared ---------------------------


def made_by_the_tool(folder: Path, kind: str, files: dict[str, str]) -> Path:
    """``folder`` written by :func:`outputs.replace_folder` with ``files`` (name → text)."""

    def build(d: Path) -> None:
        for name, text in files.items():
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_text(text)

    return outputs.replace_folder(folder, build, kind=kind, option="-o")


def test_a_changed_listed_file_is_never_replaced(tmp_path):
    """A user's notes added to a listed file, a marker copied into a user's folder, a hand-written
    marker with a wrong digest: refused, every byte kept (only the names were compared)."""
    out = made_by_the_tool(tmp_path / "rep", "report", {"report.md": "# r\n", "figures/a.png": "p"})
    with open(out / "report.md", "a") as f:
        f.write("MY ANNOTATIONS\n")
    before = snapshot(out)
    called = []
    with pytest.raises(OutputError) as err:
        outputs.replace_folder(out, called.append, kind="report", option="--out")
    assert str(err.value) == (
        f"--out {out}: report.md was changed after attnstudy wrote it, so the folder is not "
        "replaced; to keep it, move it out of the folder (or rename the folder) and run again, "
        "or give another folder (nothing was written)"
    )
    assert not called and snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]

    user = tmp_path / "user"  # the marker copied into a folder holding the user's own report.md
    user.mkdir()
    (user / "report.md").write_text("the user's own report\n")
    (user / "figures").mkdir()
    (user / "figures" / "a.png").write_text("p")  # identical to the tool's: nothing to lose
    (user / MARKER).write_bytes((out / MARKER).read_bytes())
    with pytest.raises(OutputError, match=r"report\.md was changed after attnstudy wrote it"):
        outputs.replace_folder(user, called.append, kind="report", option="--out")
    assert (user / "report.md").read_text() == "the user's own report\n"

    handmade = tmp_path / "handmade"  # a marker written by hand with a wrong digest
    handmade.mkdir()
    (handmade / "notes.txt").write_text("mine")
    outputs.write_marker(handmade, "report", {"notes.txt": "0" * 64})
    with pytest.raises(OutputError, match=r"notes\.txt was changed after attnstudy wrote it"):
        outputs.replace_folder(handmade, called.append, kind="report", option="--out")
    outputs.write_marker(handmade, "report", {"notes.txt": 5})  # not a digest at all
    with pytest.raises(OutputError, match=r"notes\.txt was changed after attnstudy wrote it"):
        outputs.replace_folder(handmade, called.append, kind="report", option="--out")
    assert (handmade / "notes.txt").read_text() == "mine" and not called


def test_a_folder_the_marker_does_not_list_is_never_removed(tmp_path):
    """A user's empty sub-folder inside a report folder is refused, not removed; a folder the tool
    made (an empty ``examples/``) is its own."""
    out = tmp_path / "rep"
    outputs.replace_folder(out, lambda d: (d / "examples").mkdir(), kind="report", option="-o")
    outputs.replace_folder(out, lambda d: (d / "examples").mkdir(), kind="report", option="-o")
    assert (out / "examples").is_dir()
    (out / "drafts" / "later").mkdir(parents=True)
    with pytest.raises(OutputError) as err:
        outputs.replace_folder(out, lambda d: None, kind="report", option="--out")
    assert str(err.value) == (
        f"--out {out} holds the folder drafts/, which attnstudy did not make; move it out of the "
        "folder (the folder is replaced whole) or give another folder"
    )
    assert (out / "drafts" / "later").is_dir()

    legacy = tmp_path / "legacy"  # a marker of before folders were listed: those holding files
    legacy.mkdir()
    (legacy / "figures").mkdir()
    (legacy / "figures" / "a.png").write_text("p")
    (legacy / "empty").mkdir()
    digest = outputs._digest(legacy / "figures" / "a.png")
    doc = {"tool": "attnstudy", "kind": "report", "files": {"figures/a.png": digest}}
    (legacy / MARKER).write_text(json.dumps(doc))
    with pytest.raises(OutputError, match="holds the folder empty/, which attnstudy did not make"):
        outputs.replace_folder(legacy, lambda d: None, kind="report", option="--out")
    (legacy / "empty").rmdir()
    outputs.replace_folder(legacy, lambda d: None, kind="report", option="--out")
    assert sorted(p.name for p in legacy.iterdir()) == [MARKER]


def test_a_file_caught_in_an_interrupted_write_stays_replaceable(tmp_path):
    """While ``write_files`` writes, the marker accepts the old and the new digest: either is ours."""
    out = made_by_the_tool(tmp_path / "rep", "report", {"a.txt": "old"})
    old = outputs._digest(out / "a.txt")
    (out / "a.txt").write_text("new")
    outputs.write_marker(out, "report", {"a.txt": [old, outputs._digest(out / "a.txt")]})
    outputs.replace_folder(out, lambda d: (d / "b.txt").write_text("b"), kind="report", option="-o")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "b.txt"]


def edited_report_line(err: str, path: Path) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"{path.name} was changed after attnstudy wrote it" in lines[0], lines[0]
    assert "to keep it, move it out of the folder" in lines[0]


def test_report_out_keeps_a_users_edit_of_a_report_file(fresh_root, tmp_path, capfd):
    rep = made_by_the_tool(tmp_path / "rep", "report", {"report.md": "# r\n", "report.html": "h"})
    with open(rep / "report.md", "a") as f:
        f.write("MY ANNOTATIONS\n")
    before = snapshot(rep)
    res = run_cli(capfd, ["report", "--study", "0" * 32, "--out", str(rep)], cwd=tmp_path, env={})
    assert res.returncode == 2
    assert res.stderr.startswith(f"attnstudy: error: --out {rep}: report.md was changed")
    edited_report_line(res.stderr, rep / "report.md")
    assert snapshot(rep) == before


def test_run_keeps_a_users_edit_of_its_report_folder(fresh_root, tmp_path, capfd):
    rep = made_by_the_tool(fresh_root / "reports" / "tiny", "report", {"report.md": "# r\n"})
    with open(rep / "report.md", "a") as f:
        f.write("MY ANNOTATIONS\n")
    before = snapshot(rep)
    config = Path(__file__).parents[2] / "experiments" / "tiny.toml"
    res = run_cli(capfd, ["run", str(config), "--quiet"], cwd=tmp_path, env={})
    assert res.returncode == 2
    edited_report_line(res.stderr, rep / "report.md")
    assert snapshot(rep) == before
    assert not (fresh_root / "mlruns" / "checkpoints").exists()  # refused before training


def test_hf_tiny_keeps_a_users_edit_of_a_model_file(tmp_path, capsys):
    pytest.importorskip("transformers")
    from attnstudy.models import hf_tiny

    folder = made_by_the_tool(tmp_path / "tiny", "hf-model", {"config.json": "{}\n"})
    (folder / "config.json").write_text('{"my": "edit"}\n')
    before = snapshot(folder)
    assert hf_tiny.main([str(folder), "--steps", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.json was changed after attnstudy wrote it" in err
    assert snapshot(folder) == before


@pytest.mark.slow
def test_report_out_and_results_keep_a_users_edits(study, store_root, tmp_path, capfd):
    """The review's reproduction through the command line: a report and its result tables
    written, then annotated by hand; the next ``report`` refuses and every edit survives."""
    rep, res_dir = tmp_path / "rep", tmp_path / "results"
    argv = ["report", "--study", study]
    res = run_cli(
        capfd, [*argv, "--out", str(rep), "--results", str(res_dir)], cwd=tmp_path, env={}
    )
    assert res.returncode == 0, res.stderr
    with open(rep / "report.md", "a") as f:
        f.write("MY ANNOTATIONS\n")
    with open(res_dir / "tiny.csv", "a") as f:
        f.write("my,row\n")
    before_rep, before_res = snapshot(rep), snapshot(res_dir)
    res = run_cli(capfd, [*argv, "--out", str(rep)], cwd=tmp_path, env={})
    assert res.returncode == 2
    edited_report_line(res.stderr, rep / "report.md")
    res = run_cli(capfd, [*argv, "--results", str(res_dir)], cwd=tmp_path, env={})
    assert res.returncode == 2 and "tiny.csv was changed after attnstudy wrote it" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert snapshot(rep) == before_rep and snapshot(res_dir) == before_res


# --- several writers of one folder at once -------------------------------------------------------


def test_writers_racing_for_one_folder_succeed_or_say_so_in_one_line(tmp_path):
    """Six processes replacing one folder at once, three times each: a raw ENOTEMPTY/ENOENT from
    the swap and empty ``.NAME.old-PID-…`` folders were left; now each replace succeeds or says in
    one line that another process replaced the folder, and nothing hidden is left beside it."""
    import multiprocessing
    import queue

    import outputs_race

    out = tmp_path / "racedir"
    outputs.replace_folder(
        out, lambda d: outputs_race.build("first", d), kind="report", option="-o"
    )
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(6), ctx.Queue()
    procs = [
        ctx.Process(target=outputs_race.writer, args=(str(out), start, results, 3))
        for _ in range(6)
    ]
    for p in procs:
        p.start()
    outcomes = []
    for _ in range(18):
        try:
            outcomes.append(results.get(timeout=60))
        except queue.Empty:
            break
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * 6
    assert len(outcomes) == 18
    line = f"another attnstudy process replaced {out} meanwhile; run again"
    for outcome, text in outcomes:
        assert outcome == "ok" or (outcome == "raced" and text.startswith(line)), text
        assert "\n" not in text
    assert any(outcome == "ok" for outcome, _ in outcomes)
    assert [p.name for p in tmp_path.iterdir()] == ["racedir"]  # no .racedir.tmp-/old- left
    held = snapshot(out)
    writers = {content for name, content in held.items() if name != MARKER}
    assert len(writers) == 1 and len(held) == outputs_race.FILES + 2  # one writer's, whole
    outputs.check_replaceable(out, "-o", "report")  # and still provably the tool's


def test_a_writer_that_lost_the_race_exits_1_in_one_line(fresh_root, tmp_path, monkeypatch, capfd):
    """``report --out`` and ``hf_tiny``: another process's replace is not bad input (exit 1)."""
    from attnstudy import api
    from attnstudy.cli import main as cli

    rep = tmp_path / "rep"

    def raced(**kwargs):
        raise outputs.ReplacedMeanwhileError(Path(kwargs["out_dir"]).resolve())

    monkeypatch.setattr(api, "report", raced)
    monkeypatch.setattr(cli, "_store", lambda args: None)
    monkeypatch.setattr(cli, "_check_store", lambda args, cfg: None)  # no store in fresh_root
    res = run_cli(capfd, ["report", "--study", "0" * 32, "--out", str(rep)], cwd=tmp_path, env={})
    assert res.returncode == 1
    assert res.stderr == (
        f"attnstudy: error: another attnstudy process replaced {rep} meanwhile; run again once it "
        "is done\n"
    )

    pytest.importorskip("transformers")
    from attnstudy.models import hf_tiny

    def raced_folder(folder, build, **kwargs):
        raise outputs.ReplacedMeanwhileError(Path(folder).resolve())

    monkeypatch.setattr(hf_tiny, "replace_folder", raced_folder)
    assert hf_tiny.main([str(tmp_path / "tiny"), "--steps", "0"]) == 1
    err = capfd.readouterr().err
    assert err.endswith(
        f"error: another attnstudy process replaced {tmp_path / 'tiny'} meanwhile; "
        "run again once it is done\n"
    )
    assert err.count("\n") == 1, err


def test_an_interrupt_between_the_two_renames_puts_the_old_folder_back(tmp_path, monkeypatch):
    out = made_by_the_tool(tmp_path / "rep", "report", {"a.txt": "old"})
    real, calls = os.replace, []

    def interrupted(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the old folder is out of the way, the new one not yet in
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(outputs.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        outputs.replace_folder(
            out, lambda d: (d / "a.txt").write_text("new"), kind="report", option="-o"
        )
    monkeypatch.setattr(outputs.os, "replace", real)
    assert (out / "a.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]
