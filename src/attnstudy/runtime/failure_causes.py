"""What failed, said first: the causes a study's error line names, and text cut between words.

A study on a cluster fails for reasons outside attnstudy: the tracking server's database stops
answering, its artifact store does, the tracking server itself stops or fails, the S3 store of
the shared checkpoints stops answering, or a Ray worker dies. MLflow's own message puts the cause last (``API request to … failed with exception
HTTPConnectionPool(…): Max retries exceeded … (Caused by NewConnectionError(…))``), and the error
line used to be cut at a fixed length exactly there (``…NewConnectionErro``). Here each cause is
recognised from the text once (:data:`CAUSES`), named first, with what to do, and long text is cut
at a word boundary with "…".

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

RESUME = "attnstudy run … --resume"
"""The command that continues a study after a failure (the user's own experiment file)."""


@dataclass(frozen=True)
class Cause:
    """A failure's cause as the user must act on it.

    Attributes:
        label: what failed, first in the error line ("database down", …).
        signs: substrings of an error's text that show it (any one).
        advice: what to do, ending in :data:`RESUME`.
        named_by: how a line that already names the cause first begins (no label is added).
        advised_by: text that shows a line already says what to do (no advice is added).
    """

    label: str
    signs: tuple[str, ...]
    advice: str
    named_by: tuple[str, ...] = ()
    advised_by: tuple[str, ...] = ()


CAUSES: tuple[Cause, ...] = (
    # first: the checkpoint store's errors quote botocore's ReadTimeoutError / connection errors,
    # text the tracking server's cause would claim; their line names the S3 object and endpoint
    Cause(
        "checkpoint store",
        ("CheckpointStoreError", "upload checkpoint s3://", "download checkpoint s3://"),
        "check that the S3 endpoint named (MLFLOW_S3_ENDPOINT_URL) answers and holds the bucket, "
        "and the credentials (AWS_ACCESS_KEY_ID …), or unset ATTNSTUDY_CHECKPOINT_URI to keep "
        f"checkpoints on the node that trains; then {RESUME}",
        advised_by=("unset ATTNSTUDY_CHECKPOINT_URI",),  # CheckpointStoreError's own advice
    ),
    # before the server's causes: a database that is down makes MLflow's server answer 503
    # (TEMPORARILY_UNAVAILABLE), which MLflow's client retries until "too many 503 error
    # responses"; the Tracker tells a 500 apart by the server's /health (tracking.client)
    Cause(
        "database down",
        (
            "database down",
            "too many 503 error responses",
            "psycopg.OperationalError",  # a server's answer quotes its driver
            "psycopg2.OperationalError",
            "pymysql.err.OperationalError",
            "MySQLdb.OperationalError",
            "does not answer: connection",
            "could not connect to server",
            "the database system is shutting down",
            "the database system is starting up",
            "terminating connection due to administrator command",
        ),
        f"start the tracking server's database (the server needs no restart), then {RESUME}",
    ),
    # the server's artifact store (its --artifacts: a bucket or folder), or an experiment's own
    # s3:// artifact location that a node writes to directly (botocore's connection error)
    Cause(
        "artifact store down",
        ("artifact store down", "Could not connect to the endpoint URL"),
        "start the artifact store or correct access to it (the tracking server's --artifacts "
        "bucket or folder, MLFLOW_S3_ENDPOINT_URL, the credentials; the server needs no "
        f"restart), then {RESUME}",
    ),
    # an HTTP 500 that /health does not explain (a server bug, an error of its own): no part of
    # it is reported down, so its log says what failed
    Cause(
        "tracking server failed",
        ("tracking server failed", "too many 500 error responses"),
        "check the tracking server's log for the error (its /health says whether its database "
        f"and artifact store answer), then {RESUME}",
    ),
    Cause(
        "tracking server down",
        (
            "NewConnectionError",
            "Connection refused",
            "RemoteDisconnected",
            "ConnectionResetError",
            "stopped answering",
            "ReadTimeout",
            "ConnectTimeout",
            "did not answer within",
        ),
        f"restart the tracking server (attnstudy server …), then {RESUME}",
        ("tracking server ",),  # the Tracker's own lines: "tracking server URI stopped answering"
    ),
    Cause(
        "worker died",
        (
            "the Ray worker running it died",
            "WorkerCrashedError",
            "NodeDiedError",
            "OwnerDiedError",
            "ActorDiedError",
            "OutOfMemoryError: Task was killed",
        ),
        "see the Ray logs of its node (out of memory? the node stopped?), then " + RESUME,
    ),
)


def classify(text: str) -> Cause | None:
    """The first of :data:`CAUSES` whose signs (or its label, as :func:`error_line` writes it
    first) appear in ``text``, or None."""
    for cause in CAUSES:
        if f"{cause.label}: " in text or any(sign in text for sign in cause.signs):
            return cause
    return None


def clip(text: str, limit: int = 300) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary, with "…" when cut.

    A word longer than the whole limit (a URL) is the only thing cut inside a word.
    """
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:(") + "…"


def error_line(err: BaseException, limit: int = 300) -> str:
    """One line for an error: its cause first when it is one of :data:`CAUSES`
    (``tracking server down: MlflowException: …``), else ``Type: first line``; cut between words.
    """
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    body = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    cause = classify(str(err))
    if cause is not None and not _names(body, cause):
        body = f"{cause.label}: {body}"
    return clip(body, limit)


def study_failed_line(parts: list[str], limit_each: int = 300) -> str:
    """The driver's error line for a study whose ``parts`` (``name (phase: error)``) failed: the
    causes first, with what to do, then the parts, each cut between words.

    Example: ``tracking server down (restart the tracking server (attnstudy server …), then
    attnstudy run … --resume): 2 part(s) of the study failed: a (training: …); b (…)``.
    """
    causes: list[Cause] = []
    for part in parts:
        cause = classify(part)
        if cause is not None and cause not in causes:
            causes.append(cause)
    head = "; ".join(f"{c.label} ({c.advice})" for c in causes)
    listed = "; ".join(clip(p, limit_each) for p in parts)
    tail = f"{len(parts)} part(s) of the study failed: {listed}"
    return f"{head}: {tail}" if head else tail


def command_line(err: BaseException, limit: int = 600) -> str:
    """The CLI's one line for an error that ended a command: its first line, cut between words;
    for one of :data:`CAUSES`, the cause first and its advice last (unless the text gives one)."""
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    line = clip(lines[0], limit) if lines else type(err).__name__
    cause = classify(str(err))
    if cause is None:
        return line
    if not _names(line, cause):
        line = f"{cause.label}: {line}"
    advised = ("--resume", "run the command again", *cause.advised_by)
    return line if any(a in line for a in advised) else f"{line}; {cause.advice}"


def _names(line: str, cause: Cause) -> bool:
    """Whether ``line`` already begins by naming ``cause`` (past a ``Type: `` prefix)."""
    rest = line.split(": ", 1)[1] if line.split(": ", 1)[0].isidentifier() else line
    return any(t.startswith((cause.label, *cause.named_by)) for t in (line, rest))
