"""``attnstudy ui`` as a user runs it: a subprocess that prints the runs-view URL and stops on Ctrl-C."""

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from attnstudy.serving import ui
from attnstudy.serving.ui_guard import proc_table

ROOT = Path(__file__).parents[2]
# the training views, sorted by run name: every run a row (MLflow nests them only when sorted by time)
SUFFIX = "runs?workflowType=machine_learning&orderByKey=tags.%60mlflow.runName%60&orderByAsc=true"


def _cli() -> list[str]:
    script = Path(sys.executable).with_name(
        "attnstudy"
    )  # the installed entry point, as a user runs it
    if script.is_file():
        return [str(script)]
    return [
        sys.executable,
        "-c",
        "import sys; from attnstudy.cli.main import main; sys.exit(main())",
    ]


def _sigint_default():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_ui(
    args: list[str], root: Path, stderr_path: Path
) -> tuple[subprocess.Popen, "queue.Queue[str]"]:
    """Start ``attnstudy ui ARGS`` against the store under ``root``; stdout lines arrive in the queue."""
    env = dict(os.environ, ATTNSTUDY_ROOT=str(root), PYTHONUNBUFFERED="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    # like a terminal's foreground job, SIGINT at its default even if pytest runs with it ignored
    # (a background job of a non-interactive shell)
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(
            [*_cli(), "ui", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            preexec_fn=_sigint_default if ignored else None,
        )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    return proc, lines


def wait_url(
    proc: subprocess.Popen, lines: "queue.Queue[str]", stderr_path: Path, timeout: float = 120
) -> str:
    """The URL from the ``MLflow UI: <url>`` line, once the ``MLflow UI: ready`` line says the
    server answers (the URL is printed before)."""
    deadline = time.monotonic() + timeout
    url = None
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5).strip()
        except queue.Empty:
            if proc.poll() is not None:
                pytest.fail(f"attnstudy ui exited ({proc.returncode}): {stderr_path.read_text()}")
            continue
        if line == ui.READY and url is not None:
            return url
        if line.startswith("MLflow UI: "):
            url = line.removeprefix("MLflow UI: ")
    pytest.fail(f"no URL, or not ready, within {timeout:.0f} s: {stderr_path.read_text()}")


def descendants(pid: int) -> set[int]:
    procs, found, todo = proc_table(), set(), [pid]
    while todo:
        parent = todo.pop()
        kids = {p for p, st in procs.items() if st.ppid == parent} - found
        found |= kids
        todo.extend(kids)
    return found


def cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def survivors(pids: set[int], pgids: set[int], port: int | None) -> list[str]:
    """Live (non-zombie) processes among ``pids``, in the groups ``pgids``, or serving ``port``."""

    def server_on_port(p):
        cmd = cmdline(p)
        return (
            port is not None
            and f"--port {port}" in cmd
            and any(s in cmd for s in ("mlflow", "uvicorn", "gunicorn"))
        )

    return [
        f"{p}: {cmdline(p)}"
        for p, st in proc_table().items()
        if st.state != "Z" and (p in pids or st.pgid in pgids or server_on_port(p))
    ]


def interrupt_and_check_gone(
    proc: subprocess.Popen, port: int | None, timeout: float = 30
) -> float:
    """SIGINT (Ctrl-C) the CLI; assert it exits 0 and leaves no process behind. Returns the seconds it took.

    ``timeout`` tells a hang from a slow stop, not a speed target: a Ctrl-C during start-up waits
    for the store check in flight (signals are held during store calls) and then for the
    interpreter's shutdown, 0.1–5 s on an idle machine with two busy cores beside it, more on a
    loaded CI runner (one took over 10 s).
    """
    children = descendants(proc.pid)
    procs = proc_table()
    groups = {procs[c].pgid for c in children if c in procs} - {os.getpgrp()}
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        for g in groups:  # clean up before failing
            os.killpg(g, signal.SIGKILL)
        proc.kill()
        pytest.fail(f"attnstudy ui did not exit within {timeout} s of SIGINT")
    took = time.monotonic() - t0
    assert proc.returncode == 0
    left = survivors(children, groups, port)
    deadline = time.monotonic() + 5  # init reaps orphans asynchronously
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = survivors(children, groups, port)
    assert not left, f"processes survived Ctrl-C: {left}"
    if port is not None:
        assert not ui.port_in_use("127.0.0.1", port), f"port {port} still answers after Ctrl-C"
    return took


@pytest.fixture
def project(fresh_root):
    """A private project root whose store holds one experiment, ``uitest``: (root, experiment id)."""
    from attnstudy.tracking import Tracker

    return fresh_root, Tracker().experiment_id("uitest")


@pytest.mark.slow
def test_ui_prints_runs_view_url_serves_and_stops_on_ctrl_c(project, tmp_path):
    root, exp_id = project
    port = ui.free_port()
    err = tmp_path / "stderr.txt"
    proc, lines = start_ui(["--port", str(port), "--experiment", "uitest"], root, err)
    try:
        t0 = time.monotonic()
        url = wait_url(proc, lines, err)
        print(f"attnstudy ui answered after {time.monotonic() - t0:.1f} s", file=sys.stderr)
        assert url == f"http://127.0.0.1:{port}/#/experiments/{exp_id}/{SUFFIX}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert r.status == 200 and r.read().strip() == b"OK"
        with urllib.request.urlopen(url.split("#")[0], timeout=10) as r:  # the UI's page itself
            assert r.status == 200 and b"<html" in r.read(4096).lower()
        children = descendants(proc.pid)
        assert any("mlflow" in cmdline(c) for c in children), "no mlflow server among the children"
        assert ui.port_in_use("127.0.0.1", port)
        took = interrupt_and_check_gone(proc, port)
        print(f"stopped {took:.1f} s after SIGINT", file=sys.stderr)
        stderr = err.read_text()
        assert "stopping the MLflow UI" in stderr and "Traceback" not in stderr
    finally:
        if proc.poll() is None:
            proc.kill()


def _browser():
    """A headless Chromium through Playwright, or None where either is missing."""
    import shutil

    try:
        from playwright.sync_api import sync_playwright  # noqa: F401
    except ImportError:
        return None
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(_browser() is None, reason="needs Playwright and Chromium")
def test_the_printed_url_shows_nested_runs_as_rows_of_their_own(project, tmp_path):
    """The runs view opened on one collapsed study row; the model and ablation runs under it
    needed expanding by hand (MLflow nests child runs while sorted by time)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    from attnstudy.tracking import Tracker

    root, exp_id = project
    tracker = Tracker()
    study = tracker.start_run(exp_id, "uitest/study")
    model = tracker.start_run(exp_id, "copy/additive-bahdanau/seed1", parent_run_id=study)
    tracker.start_run(exp_id, "copy/additive-bahdanau/seed1/ablations", parent_run_id=model)
    port = ui.free_port()
    err = tmp_path / "stderr.txt"
    proc, lines = start_ui(["--port", str(port), "--experiment", "uitest"], root, err)
    try:
        url = wait_url(proc, lines, err)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_browser(), args=["--no-sandbox"])
            rows = {}
            before = url.split("?")[0] + "?workflowType=machine_learning"  # the URL printed before
            for name, link in (("printed", url), ("by time", before)):
                page = browser.new_context().new_page()  # the UI keeps its sort in local storage
                page.goto(link)
                page.wait_for_selector("text=uitest/study", timeout=90_000)
                if name == "printed":  # the rows render after the first one: until the last
                    with contextlib.suppress(PlaywrightTimeout):  # (if never, counted below)
                        page.wait_for_selector(
                            "text=copy/additive-bahdanau/seed1/ablations", timeout=10_000
                        )
                else:  # rows that must not render: as long as they took before
                    page.wait_for_timeout(2000)
                rows[name] = page.inner_text("body").count("copy/additive-bahdanau/seed1")
            browser.close()
        assert rows == {"printed": 2, "by time": 0}  # the model run and its ablation run
        interrupt_and_check_gone(proc, port)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_ui_warns_when_binding_all_interfaces(project, tmp_path):
    root, _ = project
    err = tmp_path / "stderr.txt"
    port = ui.free_port()
    proc, _ = start_ui(
        ["--port", str(port), "--host", "0.0.0.0", "--experiment", "uitest"], root, err
    )
    try:
        deadline = time.monotonic() + 60
        while (
            "warning" not in err.read_text() and proc.poll() is None and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        warning = [line for line in err.read_text().splitlines() if "warning" in line]
        assert warning and "0.0.0.0" in warning[0] and "other machines" in warning[0], (
            err.read_text()
        )
        interrupt_and_check_gone(proc, port)  # a quick stop, wherever start-up had got to
        assert "Traceback" not in err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ui_prints_its_url_and_how_to_stop_it_before_the_server_answers(
    project, monkeypatch, capsys
):
    """The URL came only once MLflow answered: nothing for up to 45 s on a busy machine."""
    from attnstudy.cli import main as cli

    root, exp_id = project
    port = ui.free_port()
    printed = []

    class Starting:  # a server that has not answered yet
        pid = returncode = None

    def wait_healthy(base_url, timeout, proc):
        printed.append(capsys.readouterr().out)
        raise KeyboardInterrupt  # the user stops it while it starts

    monkeypatch.setattr(ui, "start_server", lambda *args, **kwargs: Starting())
    monkeypatch.setattr(ui, "wait_healthy", wait_healthy)
    monkeypatch.setattr(ui, "stop_server", lambda proc: None)
    capsys.readouterr()
    assert cli.main(["ui", "--port", str(port), "--experiment", "uitest"]) == 0
    assert printed == [
        f"MLflow UI: http://127.0.0.1:{port}/#/experiments/{exp_id}/{SUFFIX}\n"
        f"press Ctrl-C to stop; {ui.STARTING}\n"
    ]
    assert capsys.readouterr().err == "stopping the MLflow UI\n"


def test_ui_names_a_missing_or_deleted_experiment_and_opens_the_list(project, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from attnstudy.cli import main as cli
    from attnstudy.runtime.paths import default_tracking_uri

    root, exp_id = project
    MlflowClient(default_tracking_uri()).delete_experiment(exp_id)
    monkeypatch.setattr(ui, "start_server", lambda *args, **kwargs: object())
    monkeypatch.setattr(ui, "wait_healthy", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
    monkeypatch.setattr(ui, "stop_server", lambda proc: None)
    for name, note in (
        ("uitest", "experiment 'uitest' is deleted (in the store's trash); restore it"),
        ("nope", "no experiment 'nope' in the store;"),
    ):
        port = ui.free_port()
        capsys.readouterr()
        assert cli.main(["ui", "--port", str(port), "--experiment", name]) == 0
        out = capsys.readouterr()
        assert out.out.splitlines()[0] == (
            f"MLflow UI: http://127.0.0.1:{port}/#/experiments?workflowType=machine_learning"
        )
        assert out.err.startswith(f"attnstudy: note: {note}"), out.err
        assert "the UI opens on the list of experiments" in out.err.splitlines()[0]


def test_ui_without_experiment_opens_the_list_in_the_training_views(project, monkeypatch, capsys):
    """``attnstudy ui`` (no ``--experiment``, no experiment 'quickstart') printed
    ``…/#/experiments`` without ``?workflowType=machine_learning``: MLflow opened in GenAI mode."""
    from attnstudy.cli import main as cli

    monkeypatch.setattr(ui, "start_server", lambda *args, **kwargs: object())
    monkeypatch.setattr(ui, "wait_healthy", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
    monkeypatch.setattr(ui, "stop_server", lambda proc: None)
    port = ui.free_port()
    capsys.readouterr()
    assert cli.main(["ui", "--port", str(port)]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines()[0] == (
        f"MLflow UI: http://127.0.0.1:{port}/#/experiments?workflowType=machine_learning"
    )
    assert out.err.startswith("attnstudy: note: no experiment 'quickstart' in the store;")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_proc_table_matches_the_kernel_for_this_process():
    me = proc_table()[os.getpid()]
    assert (me.ppid, me.pgid, me.sid) == (os.getppid(), os.getpgrp(), os.getsid(0))
    assert me.state in "RS"
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    child.wait()  # reaped: gone from the table, as from the session's members
    assert child.pid not in proc_table()
