"""A study submitted to a Ray cluster as a job: ``attnstudy run EXPERIMENT --executor ray --submit
--ray-address http://HEAD:8265``, followed with ``attnstudy job logs ID --follow``.

With ``--executor ray`` alone the driver (the process that submits the tasks, collects them and
writes the report) runs where the command was typed: a laptop that sleeps or disconnects takes
the study's driver with it. With ``--submit`` the command hands the study to the head's job
server (Ray's Job Submission API) and returns: the driver is ``attnstudy run … --executor ray``
run by Ray on the head, in a job whose ``runtime_env`` carries

* ``py_modules``: a copy of the submitting checkout's attnstudy package
  (:func:`attnstudy.runtime.code_version.stage_code`, ``attnstudy.analysis`` inside it), so the
  job's driver and every task it starts run the submitter's code, whatever a node has installed
  (the job's tasks inherit the job's ``runtime_env``; the driver does not ship a copy of its own);
* ``working_dir``: the experiment file's folder (its ``.gitignore`` is *not* honoured — a data
  file or model folder the experiment names is often git-ignored, and must travel — its
  ``.rayignore`` is; ``mlruns/``, ``reports/``, ``.git/`` and virtualenvs are left out), so
  relative data paths resolve as
  they do here. A file the experiment names outside that folder is refused before anything is
  sent (an absolute path on this machine means nothing on the head).

Ray needs the dashboard on the head for the job server (``ray start --head
--include-dashboard=true --dashboard-host HOST``, port 8265 by default), and the dashboard needs
``ray[default]`` on the head (the ``[distributed]`` extra installs it: about 38 MB more than
``ray``). The submitting machine needs only ``ray``. The job's driver writes to the tracking server
the command names (``--tracking-uri``, an ``http(s)://`` server the head reaches); its report is
logged to the study run, where ``attnstudy report --study ID`` and the MLflow UI read it.

The requests the Ray client makes have no time limit of their own; every one made here has one
(:data:`TIMEOUT`), and the job server is asked for its version first, within
:data:`CONNECT_TIMEOUT` s, so an address where nothing answers is one line, not a hang.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from attnstudy.config import ConfigError
from attnstudy.executors.distributed import ClusterNotFoundError
from attnstudy.executors.ray_head import RAY_EXTRA, ClusterError

JOB_SERVER_HINT = (
    "give --ray-address http://HEAD:8265, the head's job server (its dashboard: 'ray start --head "
    "--include-dashboard=true --dashboard-host HOST', which needs ray[default] on the head)"
)
CONNECT_TIMEOUT = 10.0
"""Seconds the job server has to answer its version (connecting included)."""
TIMEOUT = (CONNECT_TIMEOUT, 300.0)
"""(connect, read) seconds of every other request (an upload of the code copy included)."""
POLL_SECONDS = 2.0
"""How often :func:`follow_job` asks for the job's status and new log lines."""
LEFT_OUT = [".git", "mlruns", "reports", "__pycache__", "*.pyc", ".venv*"]
"""What of the experiment's folder never travels (Ray's ``runtime_env`` ``excludes``): the store,
the reports, bytecode, virtualenvs — never a folder an experiment may name (a model folder in
``build/`` travels)."""
FORWARDED_ENV = (
    "ATTNSTUDY_CHECKPOINT_URI",
    "MLFLOW_S3_ENDPOINT_URL",
    "ATTNSTUDY_PROGRESS_SECONDS",
    "ATTNSTUDY_DEBUG",
)
"""Settings of this environment the job's driver gets (never credentials: a job's
``runtime_env`` is shown on the dashboard; put those in the head's environment)."""
STOP_GRACE_SECONDS = 60
"""How long ``attnstudy job stop`` lets the job's driver end its runs KILLED after SIGTERM before
Ray kills it (Ray's ``RAY_JOB_STOP_WAIT_TIME_S``, 3 s by default: too short to close a study's
runs, which then stayed RUNNING until a lease or ``--resume`` closed them)."""
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
NO_AGENT = "No available agent to submit job"
"""What the job server answers (HTTP 500) while the head's job agent is not up yet: a head that
just started; the submission is tried again for :data:`AGENT_WAIT_SECONDS`."""
AGENT_WAIT_SECONDS = 60.0
IGNORE_GITIGNORE = "RAY_RUNTIME_ENV_IGNORE_GITIGNORE"
"""Set to 1 while the job is sent: Ray packs the experiment's folder without its .gitignore."""
_ADDRESS = re.compile(r"^https?://[^\s/:]+(:\d{1,5})?/?$")


class JobServerError(ClusterError):
    """The job server refused or failed a request; the message is the whole line to show (what
    happened and what to do), not a cause to guess from its words."""


class JobServerNotFoundError(JobServerError, ClusterNotFoundError):
    """Nothing that is a Ray job server answers at the address (exit code 2)."""


class JobNotFoundError(JobServerNotFoundError):
    """The job server has no job by that id (exit code 2: what was named is missing)."""


def check_job_address(address: str | None) -> str:
    """The job server's address for ``--submit`` and ``attnstudy job`` (``--ray-address``, else
    ``$RAY_ADDRESS``); standard library only.

    Raises:
        ConfigError: no address, or not ``http(s)://HOST[:PORT]`` (one line saying what to give).
    """
    where = "--ray-address" if address else "$RAY_ADDRESS"
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        raise ConfigError(f"the job server is not named: {JOB_SERVER_HINT}")
    if not _ADDRESS.match(address):
        raise ConfigError(f"{where} {address!r} is not a job server's URL: {JOB_SERVER_HINT}")
    return address.rstrip("/")


def check_files_travel(cfg, experiment: Path) -> None:
    """Refuse an experiment that names a file outside its own folder: the job gets that folder
    only (its ``working_dir``), so such a path would not exist on the head.

    Args:
        cfg: the experiment as loaded here (its paths absolute).
        experiment: the experiment file.

    Raises:
        ConfigError: the first such file, and what to do.
    """
    folder = experiment.resolve().parent
    for where, value in _named_files(cfg):
        path = Path(value).resolve()
        if path != folder and folder not in path.parents:
            raise ConfigError(
                f"{where} = {path}: --submit sends the experiment's folder ({folder}) as the "
                "job's working directory, and this file is outside it: move it into that folder "
                "and name it relative to the experiment file"
            )


def _named_files(cfg) -> list[tuple[str, str]]:
    """Every (setting, path) of the experiment that names a file or folder: the data paths of
    ``[data]`` and of every variant, ``hf:`` model folders, the contrastive ablation's file."""
    out = []
    for spec in cfg.runs():
        data = spec.data.model_dump()
        for key in ("train_path", "dev_path", "test_path"):
            if isinstance(data.get(key), str):
                out.append((f"{spec.name}: data.{key}", data[key]))
        source = getattr(spec.model, "source", None)
        if isinstance(source, str) and source.startswith("hf:"):
            out.append((f"{spec.name}: model.source", source[3:]))
    contrast = (cfg.ablation.model_dump().get("contrastive") or {}).get("contrast")
    if isinstance(contrast, str) and contrast:
        out.append(("ablation.contrastive.contrast", contrast))
    return out


@dataclass(frozen=True)
class StudyJob:
    """What ``run --submit`` sends: the driver's command line and the job's ``runtime_env``."""

    entrypoint: str
    runtime_env: dict
    submission_id: str


def study_job(
    experiment: Path,
    overrides: list[str],
    *,
    tracking_uri: str,
    flags: list[str],
    code: Path,
) -> StudyJob:
    """The job that runs ``attnstudy run EXPERIMENT --executor ray`` on the head.

    Args:
        experiment: the experiment file (its folder becomes the job's working directory).
        overrides: the ``--set`` items, passed on as given.
        tracking_uri: the tracking server the job's driver records to.
        flags: ``--retrain``, ``--resume``, ``--no-report`` as given.
        code: the staged copy of the attnstudy package (:func:`stage_code`'s folder).
    """
    import secrets

    cmd = ["python", "-m", "attnstudy.cli", "run", experiment.name, "--executor", "ray"]
    cmd += ["--tracking-uri", tracking_uri, *flags]
    for item in overrides:
        cmd += ["--set", item]
    env = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
    env["RAY_JOB_STOP_WAIT_TIME_S"] = str(STOP_GRACE_SECONDS)  # read by the job's supervisor
    runtime_env = {
        "py_modules": [str(code)],
        "working_dir": str(experiment.resolve().parent),
        "excludes": LEFT_OUT,
        "env_vars": env,
    }
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", experiment.stem)[:40]
    return StudyJob(shlex.join(cmd), runtime_env, f"attnstudy-{name}-{secrets.token_hex(4)}")


def client(address: str):
    """A Ray job client for ``address`` whose every request has a time limit.

    Raises:
        ConfigError: Ray is not installed. ClusterNotFoundError: nothing answers within
            :data:`CONNECT_TIMEOUT` s, or what answers is not a job server.
    """
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ConfigError(RAY_EXTRA)
    _answers(address)
    from ray.job_submission import JobSubmissionClient

    class _Bounded(JobSubmissionClient):
        # Ray 2.60's requests carry no timeout: every one gets ours (its keyword arguments go
        # to requests.request)
        def _do_request(self, method, endpoint, **kwargs):
            kwargs.setdefault("timeout", TIMEOUT)
            return super()._do_request(method, endpoint, **kwargs)

    try:
        return _Bounded(address)
    except Exception as err:  # the version check: refused, or not Ray's job server
        raise JobServerNotFoundError(
            f"no Ray job server at {address} ({_first_line(err)}); {JOB_SERVER_HINT}"
        ) from None


def _answers(address: str) -> None:
    """Ask the job server for its version within :data:`CONNECT_TIMEOUT` s (the token, if this
    environment has one, sent as Ray sends it)."""
    import http.client
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{address}/api/version")
    token = os.environ.get("RAY_AUTH_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT) as r:
            json.loads(r.read(65536))["ray_version"]
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            said = (
                "the RAY_AUTH_TOKEN of this environment is not the cluster's: give the token the "
                "head was started with"
                if token
                else "a cluster with token authentication needs its RAY_AUTH_TOKEN in this "
                "environment"
            )
            raise JobServerError(
                f"the job server at {address} refused this client ({err.code}): {said}"
            ) from None
        raise JobServerNotFoundError(
            f"no Ray job server at {address} (HTTP {err.code}); {JOB_SERVER_HINT}"
        ) from None
    except http.client.HTTPException as err:  # something answers, not in HTTP (its bytes unsaid)
        raise JobServerNotFoundError(
            f"what answers at {address} does not speak HTTP ({type(err).__name__}): it is not "
            f"a Ray job server (the head's GCS port?); {JOB_SERVER_HINT}"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise JobServerNotFoundError(
            f"no Ray job server answers at {address} within {CONNECT_TIMEOUT:g} s "
            f"({_first_line(err)}); {JOB_SERVER_HINT}"
        ) from None


def submit(job_client, job: StudyJob) -> str:
    """Send ``job`` (Ray uploads the code copy and the experiment's folder); returns its id.

    Raises:
        JobServerError: the job server refused it (its first line).
    """
    import logging

    logging.disable(logging.INFO)  # Ray's "Uploading package …" lines: its loggers, not ours
    # Ray leaves out what a .gitignore lists: often the very data or model folder named
    gitignore = os.environ.get(IGNORE_GITIGNORE)
    os.environ[IGNORE_GITIGNORE] = "1"
    try:
        deadline = time.monotonic() + AGENT_WAIT_SECONDS
        while True:
            try:
                return job_client.submit_job(
                    entrypoint=job.entrypoint,
                    runtime_env=job.runtime_env,
                    submission_id=job.submission_id,
                    metadata={"attnstudy": "study"},
                )
            except Exception as err:
                said = _first_line(err)
                if NO_AGENT not in said or time.monotonic() > deadline:
                    raise JobServerError(f"the job server refused the study: {said}") from None
                time.sleep(1.0)  # a head just started: its job agent is not up yet
    finally:
        logging.disable(logging.NOTSET)
        if gitignore is None:
            os.environ.pop(IGNORE_GITIGNORE, None)
        else:
            os.environ[IGNORE_GITIGNORE] = gitignore


def status(job_client, job_id: str):
    """The job's :class:`ray.job_submission.JobDetails` (status, message, times).

    Raises:
        JobNotFoundError: no job ``job_id``. JobServerError: the request failed.
    """
    return _ask(job_id, job_client.get_job_info)


def follow_job(job_client, job_id: str, *, out=None, poll: float = POLL_SECONDS) -> str:
    """Print the job's log as it grows until the job ends; returns its final status
    (``SUCCEEDED``, ``FAILED`` or ``STOPPED``). Stopping the follower (Ctrl-C) leaves the job
    running.

    Raises:
        JobNotFoundError: no job ``job_id``. JobServerError: the job server stopped answering.
    """
    out = out or sys.stdout
    shown = 0
    while True:
        state = str(status(job_client, job_id).status.value)
        text = logs(job_client, job_id)  # after the status: a job that ended has its whole log
        if len(text) > shown:
            out.write(text[shown:])
            out.flush()
            shown = len(text)
        if state in TERMINAL:
            return state
        time.sleep(poll)


def stop(job_client, job_id: str) -> bool:
    """Ask the job server to stop the job (its driver gets SIGTERM: the study's runs end KILLED,
    and ``--resume`` continues it). Returns whether a running job was stopped.

    Raises:
        JobNotFoundError: no job ``job_id``. JobServerError: the request failed.
    """
    return bool(_ask(job_id, job_client.stop_job))


def _ask(job_id: str, request):
    """``request(job_id)`` of the Ray job client, its failure as one of this module's errors."""
    try:
        return request(job_id)
    except Exception as err:
        raise _job_error(job_id, err) from None


def _job_error(job_id: str, err: BaseException) -> JobServerError:
    text = _first_line(err)
    if "404" in text or "does not exist" in text:
        return JobNotFoundError(f"no job {job_id!r} on this job server ('ray job list' lists them)")
    return JobServerError(f"job {job_id}: {text}")


def _first_line(err: BaseException) -> str:
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else type(err).__name__


def logs(job_client, job_id: str) -> str:
    """The job's log so far (its driver's output).

    Raises:
        JobNotFoundError: no job ``job_id``. JobServerError: the request failed.
    """
    return _ask(job_id, job_client.get_job_logs)
