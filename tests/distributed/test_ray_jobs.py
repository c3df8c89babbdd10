"""``attnstudy run --executor ray --submit`` and ``attnstudy job``, without a cluster: what is
refused before anything is sent (one line, exit 2), and the job a submission builds. The
submission itself, on a loopback head with its job server, is
tests/distributed/test_cluster.py::test_a_study_submitted_as_a_ray_job_finishes_without_its_submitter.
"""

from __future__ import annotations

import os
import shlex
import socket
import time
from pathlib import Path

import pytest
from cli_in_process import run_cli

ROOT = Path(__file__).parents[2]
TINY = ROOT / "experiments" / "tiny.toml"
SERVER = "http://127.0.0.1:1"  # a tracking server's URL (never contacted: refused before)


LOOPBACK_RAY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Set while a test's command may import ray in this process (the job client does): ray reads it
once, at import, and the Ray tests that share the worker need it 0 (loopback)."""


def _cli(capfd, tmp_path, *argv: str, cwd: Path | None = None):
    env = {"ATTNSTUDY_ROOT": str(tmp_path), "MLFLOW_TRACKING_URI": None, "RAY_ADDRESS": None}
    return run_cli(capfd, list(argv), cwd=cwd or tmp_path, env=env | LOOPBACK_RAY)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the socket is


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--submit"], "attnstudy: error: --submit is for --executor ray: add --executor ray"),
        (
            ["--executor", "ray", "--submit", "--ray-address", "127.0.0.1:6380"],
            "attnstudy: error: --ray-address '127.0.0.1:6380' is not a job server's URL: give "
            "--ray-address http://HEAD:8265, the head's job server (its dashboard: 'ray start "
            "--head --include-dashboard=true --dashboard-host HOST', which needs ray[default] on "
            "the head)",
        ),
        (
            ["--executor", "ray", "--submit"],
            "attnstudy: error: the job server is not named: give --ray-address http://HEAD:8265, "
            "the head's job server (its dashboard: 'ray start --head --include-dashboard=true "
            "--dashboard-host HOST', which needs ray[default] on the head)",
        ),
    ],
)
def test_a_submission_without_a_job_server_is_refused_in_one_line(capfd, tmp_path, args, said):
    res = _cli(capfd, tmp_path, "run", str(TINY), "--tracking-uri", SERVER, *args)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == said
    assert not (tmp_path / "mlruns").exists()


def test_a_job_server_that_does_not_answer_is_one_line_within_the_bound(capfd, tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    res = _cli(capfd, tmp_path, "job", "status", "attnstudy-x-1", "--ray-address", url)
    assert time.monotonic() - start < 15  # CONNECT_TIMEOUT (10 s) at most; refused at once here
    assert res.returncode == 2, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"attnstudy: error: no Ray job server answers at {url} within 10 s (")
    assert line.endswith(
        "give --ray-address http://HEAD:8265, the head's job server (its "
        "dashboard: 'ray start --head --include-dashboard=true --dashboard-host "
        "HOST', which needs ray[default] on the head)"
    )


def test_follow_is_for_the_log_only(capfd, tmp_path):
    res = _cli(capfd, tmp_path, "job", "stop", "x", "--follow", "--ray-address", SERVER)
    assert res.returncode == 2
    assert res.stderr.strip() == "attnstudy: error: --follow is for 'attnstudy job logs'"


def test_a_file_outside_the_experiments_folder_is_refused(capfd, tmp_path):
    """The job gets the experiment's folder only: a data file elsewhere would not exist on the
    head."""
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "dev", "test"):
        (data / f"{split}.tsv").write_text("a b\ta b\nb c\tb c\n", encoding="utf-8")
    exp = tmp_path / "exps" / "own.toml"
    exp.parent.mkdir()
    exp.write_text(
        '[experiment]\nname = "own"\n[data]\ntask = "tsv"\ntrain_path = "../data/train.tsv"\n'
        'dev_path = "../data/dev.tsv"\ntest_path = "../data/test.tsv"\n'
        '[[models]]\nmodel = { attention = "additive", flow = "bahdanau" }\n',
        encoding="utf-8",
    )
    res = _cli(
        capfd, tmp_path, "run", str(exp), "--executor", "ray", "--submit",
        "--ray-address", SERVER, "--tracking-uri", SERVER,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (
        f"attnstudy: error: tsv/additive-bahdanau/seed1: data.train_path = {data / 'train.tsv'}: "
        f"--submit sends the experiment's folder ({exp.parent}) as the job's working directory, "
        "and this file is outside it: move it into that folder and name it relative to the "
        "experiment file"
    )


def test_a_set_path_relative_to_another_folder_is_refused(capfd, tmp_path):
    """A ``--set`` path resolves against the working directory here, against the experiment's
    folder in the job: where the two differ it is refused, not guessed."""
    folder = tmp_path / "exps"
    (folder / "data").mkdir(parents=True)
    for split in ("train", "dev", "test"):
        (folder / "data" / f"{split}.tsv").write_text("a b\ta b\nb c\tb c\n", encoding="utf-8")
    here = folder / "sub"  # the working directory: inside the folder, not the folder
    (here / "more").mkdir(parents=True)
    (here / "more" / "test.tsv").write_text("c d\tc d\n", encoding="utf-8")
    exp = folder / "own.toml"
    exp.write_text(
        '[experiment]\nname = "own"\n[data]\ntask = "tsv"\ntrain_path = "data/train.tsv"\n'
        'dev_path = "data/dev.tsv"\ntest_path = "data/test.tsv"\n'
        '[[models]]\nmodel = { attention = "additive", flow = "bahdanau" }\n',
        encoding="utf-8",
    )
    args = ["run", str(exp), "--executor", "ray", "--submit", "--ray-address", SERVER]
    args += ["--tracking-uri", SERVER, "--set", 'data.test_path="more/test.tsv"']
    res = _cli(capfd, tmp_path, *args, cwd=here)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (
        "attnstudy: error: a --set path is relative to this working directory, but the submitted "
        f"job runs in the experiment's folder ({folder}): give it relative to that folder"
    )


def test_the_job_runs_the_study_in_the_experiments_folder_with_the_shipped_code(
    tmp_path, monkeypatch
):
    from attnstudy.executors.ray_jobs import LEFT_OUT, study_job

    monkeypatch.setenv("ATTNSTUDY_CHECKPOINT_URI", "s3://bucket/checkpoints")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not for the dashboard")
    job = study_job(
        TINY,
        ["experiment.seeds=[1,2]", 'models.0.model.attention="dot"'],
        tracking_uri="http://tracking:5000",
        flags=["--resume"],
        code=tmp_path / "attnstudy",
    )
    assert shlex.split(job.entrypoint) == [
        "python", "-m", "attnstudy.cli", "run", "tiny.toml", "--executor", "ray",
        "--tracking-uri", "http://tracking:5000", "--resume",
        "--set", "experiment.seeds=[1,2]", "--set", 'models.0.model.attention="dot"',
    ]  # fmt: skip
    assert job.runtime_env == {
        "py_modules": [str(tmp_path / "attnstudy")],
        "working_dir": str(TINY.parent),
        "excludes": LEFT_OUT,
        "env_vars": {  # no credentials; the driver's time to end its runs KILLED on job stop
            "ATTNSTUDY_CHECKPOINT_URI": "s3://bucket/checkpoints",
            "RAY_JOB_STOP_WAIT_TIME_S": "60",
        },
    }
    assert job.submission_id.startswith("attnstudy-tiny-") and len(job.submission_id) == 23


def test_inside_a_submitted_job_the_driver_ships_nothing_of_its_own(monkeypatch):
    """The job's ``runtime_env`` carries the code; a second one given to ``ray.init`` would clash
    with it (Ray refuses to merge two ``py_modules``)."""
    import json

    from attnstudy.executors.distributed import JOB_CONFIG_VAR, submitted_job_env

    monkeypatch.delenv(JOB_CONFIG_VAR, raising=False)
    assert submitted_job_env() is None
    env = {"py_modules": ["gcs://_ray_pkg_1.zip"], "working_dir": "gcs://_ray_pkg_2.zip"}
    monkeypatch.setenv(JOB_CONFIG_VAR, json.dumps({"runtime_env": env, "metadata": {}}))
    assert submitted_job_env() == env
    # a job submitted some other way (no code shipped) is not ours to trust
    monkeypatch.setenv(JOB_CONFIG_VAR, json.dumps({"runtime_env": {"pip": ["x"]}}))
    assert submitted_job_env() is None
    monkeypatch.setenv(JOB_CONFIG_VAR, "not json")
    assert submitted_job_env() is None


class _FakeJobServer:
    """A stand-in for Ray's job server on loopback: its version, one job whose status steps
    through ``states`` (one per status request) with a log that grows with it, and HTTP 500 for
    ``broken``."""

    def __init__(self, states: list[str], broken: str = "broken", deny: bool = False):
        import http.server
        import json
        import threading

        self.states, self.asked = list(states), 0
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: dict | str) -> None:
                data = (json.dumps(body) if isinstance(body, dict) else body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/api/version" and deny:
                    return self._send(403, "Forbidden")
                if self.path == "/api/version":
                    return self._send(200, {"version": "4", "ray_version": "2.60.0",
                                            "ray_commit": "x", "session_name": "s"})  # fmt: skip
                if self.path.startswith(f"/api/jobs/{broken}"):
                    return self._send(500, "the job table is unreadable")
                if self.path == "/api/jobs/job-1":
                    state = fake.states[min(fake.asked, len(fake.states) - 1)]
                    fake.asked += 1
                    return self._send(200, {"type": "SUBMISSION", "submission_id": "job-1",
                                            "entrypoint": "python -m attnstudy.cli run x.toml",
                                            "status": state, "message": f"it is {state}"})  # fmt: skip
                if self.path == "/api/jobs/job-1/logs":
                    return self._send(
                        200, {"logs": "".join(f"line {i}\n" for i in range(fake.asked))}
                    )
                return self._send(404, f"Job {self.path} does not exist")

            def do_POST(self):  # stop: no job but job-1
                return self._send(404, f"Job {self.path} does not exist")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(("last", "code"), [("SUCCEEDED", 0), ("FAILED", 1), ("STOPPED", 1)])
def test_following_prints_the_log_as_it_grows_and_exits_with_the_jobs_outcome(
    capfd, tmp_path, monkeypatch, last, code
):
    import attnstudy.executors.ray_jobs as ray_jobs

    monkeypatch.setattr(ray_jobs, "POLL_SECONDS", 0.01)
    server = _FakeJobServer(["PENDING", "RUNNING", "RUNNING", last])
    try:
        res = _cli(capfd, tmp_path, "job", "logs", "job-1", "--follow", "--ray-address", server.url)
        status = _cli(capfd, tmp_path, "job", "status", "job-1", "--ray-address", server.url)
    finally:
        server.close()
    assert res.returncode == code, res.stderr
    assert res.stdout == "line 0\nline 1\nline 2\nline 3\n"  # each line once, in order
    assert res.stderr.strip() == f"job job-1: {last}"
    assert status.returncode == 0 and status.stdout == f"job-1: {last} (it is {last})\n"


def test_a_job_server_error_exits_1_and_a_missing_job_2(capfd, tmp_path):
    server = _FakeJobServer(["RUNNING"])
    try:
        broken = _cli(capfd, tmp_path, "job", "status", "broken", "--ray-address", server.url)
        missing = _cli(capfd, tmp_path, "job", "stop", "nope", "--ray-address", server.url)
    finally:
        server.close()
    assert broken.returncode == 1
    assert broken.stderr.strip() == (
        "attnstudy: error: job broken: Request failed with status code 500: the job table is "
        "unreadable."
    )
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        "attnstudy: error: no job 'nope' on this job server ('ray job list' lists them)"
    )


def test_a_relative_experiment_path_is_read_as_given(capfd, tmp_path):
    """``run exps/tiny.toml --submit`` from the folder above: the path is resolved before the check
    of ``--set`` paths changes into the experiment's folder (it was resolved inside it, read as
    exps/exps/tiny.toml, and refused as a --set path although none was given)."""
    (tmp_path / "exps").mkdir()
    (tmp_path / "exps" / "tiny.toml").write_text(TINY.read_text(encoding="utf-8"), encoding="utf-8")
    url = f"http://127.0.0.1:{_closed_port()}"
    args = ["run", "exps/tiny.toml", "--executor", "ray", "--submit", "--ray-address", url]
    res = _cli(capfd, tmp_path, *args, "--tracking-uri", SERVER)
    assert res.returncode == 2, res.stderr
    assert f"no Ray job server answers at {url}" in res.stderr, res.stderr


def test_something_that_is_not_http_is_one_clear_line(capfd, tmp_path):
    """The head's GCS port given as the job server: it answers in gRPC; the line said its bytes."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def answer() -> None:
        conn, _ = listener.accept()
        conn.recv(1024)
        conn.sendall(b"\x00\x00\x18\x04\x00\x00\x00\x00\x00garbage")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        res = _cli(capfd, tmp_path, "job", "status", "x", "--ray-address", url)
    finally:
        listener.close()
    assert res.returncode == 2
    assert res.stderr.startswith(
        f"attnstudy: error: what answers at {url} does not speak HTTP (BadStatusLine): it is not "
        "a Ray job server (the head's GCS port?); give --ray-address http://HEAD:8265"
    ), res.stderr
    assert "\x00" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("token", [None, "not-the-clusters"])
def test_a_refused_token_is_told_from_a_missing_one(capfd, tmp_path, token):
    server = _FakeJobServer(["RUNNING"], deny=True)
    env = {"ATTNSTUDY_ROOT": str(tmp_path), "RAY_ADDRESS": None, "RAY_AUTH_TOKEN": token}
    env |= LOOPBACK_RAY
    try:
        res = run_cli(
            capfd, ["job", "status", "x", "--ray-address", server.url], cwd=tmp_path, env=env
        )
    finally:
        server.close()
    assert res.returncode == 1
    said = (
        "the RAY_AUTH_TOKEN of this environment is not the cluster's: give the token the head "
        "was started with"
        if token
        else "a cluster with token authentication needs its RAY_AUTH_TOKEN in this environment"
    )
    assert res.stderr.strip() == (
        f"attnstudy: error: the job server at {server.url} refused this client (403): {said}"
    )


def test_a_job_servers_url_in_ray_address_is_named_where_it_came_from(capfd, tmp_path):
    """``$RAY_ADDRESS=http://…:8265`` (what Ray's own job CLI reads) with plain ``--executor ray``:
    the line names the variable, not an option the user never passed, and says what to do."""
    env = {"ATTNSTUDY_ROOT": str(tmp_path), "RAY_ADDRESS": "http://127.0.0.1:8265"}
    args = ["run", str(TINY), "--executor", "ray", "--tracking-uri", SERVER]
    res = run_cli(capfd, args, cwd=tmp_path, env=env | {"MLFLOW_TRACKING_URI": None})
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "attnstudy: error: $RAY_ADDRESS 'http://127.0.0.1:8265' is a job server's URL (for "
        "--submit and attnstudy job); --executor ray without --submit joins the cluster at the "
        "head's GCS address: pass --ray-address HOST:PORT, or add --submit"
    )


def test_forwarded_lines_carry_no_colour_codes_outside_a_terminal(monkeypatch):
    """A submitted job's log (a file) had Ray's ``\\x1b[36m(train … pid=…)\\x1b[0m`` prefixes."""
    import io

    from attnstudy.executors.distributed import plain_log_prefixes

    class _Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    plain_log_prefixes(_Terminal())
    assert "RAY_COLOR_PREFIX" not in os.environ  # a terminal keeps Ray's colours
    plain_log_prefixes(io.StringIO())
    assert os.environ["RAY_COLOR_PREFIX"] == "0"
    monkeypatch.setenv("RAY_COLOR_PREFIX", "1")  # the user's choice stays
    plain_log_prefixes(io.StringIO())
    assert os.environ["RAY_COLOR_PREFIX"] == "1"


def test_the_experiments_folder_travels_without_its_gitignore(monkeypatch):
    """Ray packs a ``working_dir`` without what its ``.gitignore`` lists — often the very data or
    model folder the experiment names (``build/``, ``data/``): the job would not find it on the
    head. The folder is sent with ``RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1``, put back afterwards."""
    from attnstudy.executors.ray_jobs import IGNORE_GITIGNORE, StudyJob, submit

    seen = {}

    class _Client:
        def submit_job(self, **kwargs):
            seen["env"] = os.environ.get(IGNORE_GITIGNORE)
            seen["kwargs"] = kwargs
            return kwargs["submission_id"]

    monkeypatch.delenv(IGNORE_GITIGNORE, raising=False)
    job = StudyJob("python -m attnstudy.cli run x.toml", {"working_dir": "/x"}, "attnstudy-x-1")
    assert submit(_Client(), job) == "attnstudy-x-1"
    assert seen["env"] == "1" and IGNORE_GITIGNORE not in os.environ
    assert seen["kwargs"]["runtime_env"] == {"working_dir": "/x"}


def test_a_head_whose_job_agent_is_not_up_yet_is_asked_again_within_a_bound(monkeypatch):
    """Right after a head starts its job server answers HTTP 500 "No available agent to submit
    job" (measured: seconds; for ever when another recipe on the machine held Ray's fixed agent
    port): the submission is tried again until ``AGENT_WAIT_SECONDS``, then refused in one line."""
    import attnstudy.executors.ray_jobs as ray_jobs

    monkeypatch.setattr(ray_jobs.time, "sleep", lambda s: None)
    busy = RuntimeError(
        "Request failed with status code 500: No available agent to submit job, please try again "
        "later.."
    )

    class _Client:
        def __init__(self, refusals: int):
            self.refusals, self.tries = refusals, 0

        def submit_job(self, **kwargs):
            self.tries += 1
            if self.tries <= self.refusals:
                raise busy
            return kwargs["submission_id"]

    job = ray_jobs.StudyJob("python -m attnstudy.cli run x.toml", {}, "attnstudy-x-2")
    late = _Client(refusals=3)
    assert ray_jobs.submit(late, job) == "attnstudy-x-2" and late.tries == 4
    monkeypatch.setattr(ray_jobs, "AGENT_WAIT_SECONDS", 0.0)
    with pytest.raises(ray_jobs.JobServerError) as err:
        ray_jobs.submit(_Client(refusals=10**6), job)
    assert str(err.value) == (
        "the job server refused the study: Request failed with status code 500: No available "
        "agent to submit job, please try again later.."
    )


def test_submitting_removes_only_the_folder_it_made_for_the_code_copy(capfd, tmp_path, monkeypatch):
    """``run --submit`` stages the code copy in a ``mkdtemp`` folder of its own, which Ray uploads
    while the job is sent; afterwards that folder goes and nothing beside it (sentinel files and a
    folder of the same prefix), also when the job server refuses the study."""
    import tempfile

    import attnstudy.executors.ray_jobs as ray_jobs

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    (temp / "sentinel.txt").write_text("keep")
    other = temp / "attnstudy-submitted-code-not-ours"
    other.mkdir()
    (other / "sentinel.py").write_text("keep = True\n")
    staged: list[Path] = []

    class _Client:
        def __init__(self, refuse: bool):
            self.refuse = refuse

        def submit_job(self, **kwargs):
            copy = Path(kwargs["runtime_env"]["py_modules"][0])
            assert (copy / "__init__.py").is_file()  # the copy is there while the job is sent
            staged.append(copy)
            if self.refuse:
                raise RuntimeError("Request failed with status code 500: the disk is full")
            return kwargs["submission_id"]

    args = ["run", str(TINY), "--executor", "ray", "--submit", "--ray-address", SERVER]
    args += ["--tracking-uri", SERVER]
    for refuse, code in ((False, 0), (True, 1)):
        monkeypatch.setattr(ray_jobs, "client", lambda address, r=refuse: _Client(r))
        res = _cli(capfd, tmp_path, *args)
        assert res.returncode == code, res.stderr
        assert staged[-1].parent.parent == temp and not staged[-1].parent.exists()
        assert sorted(p.name for p in temp.iterdir()) == [other.name, "sentinel.txt"]
    assert (other / "sentinel.py").read_text() == "keep = True\n"
    assert (temp / "sentinel.txt").read_text() == "keep"
