"""Training checkpoints shared through an S3-compatible store, so that an interrupted training
resumes on whichever node its task lands on.

A training writes ``last.pt`` into its model's checkpoint folder on the node that trains
(:func:`attnstudy.runtime.paths.checkpoint_dir`) after every epoch. With
``$ATTNSTUDY_CHECKPOINT_URI`` set
to ``s3://BUCKET/PREFIX``, each of those files is also uploaded, to
``s3://BUCKET/PREFIX/<experiment folder>/<model key>/last.pt``
(:func:`attnstudy.runtime.paths.experiment_folder`: the experiment's name, encoded one-to-one; the
model
key alone is shared by every experiment that trains the same model), and ``--resume`` on a node
without the local file downloads it first. A checkpoint stored before the experiment was part of
the key (``PREFIX/<model key>/last.pt``) is never resumed: nothing in it says which experiment
wrote it; :meth:`CheckpointStore.holds` finds it for a note. The setting is an environment variable, not an experiment setting, because
where checkpoints go belongs to the machines (a laptop, a cluster), not to the experiment, like
the tracking URI; the Ray driver passes its value to every task.

The store is reached with boto3 (the ``[distributed]`` extra) with bounded waits: connect and read
timeouts (:data:`CONNECT_TIMEOUT_S`, :data:`READ_TIMEOUT_S`) and at most :data:`MAX_ATTEMPTS`
tries a request in all (botocore's ``total_max_attempts``; its ``max_attempts`` counts retries, one
more), with S3Transfer's own download retries off (``num_download_attempts=1``: they came on top),
so a store that accepts connections and never answers fails a download or upload after about
``MAX_ATTEMPTS × (connect + read)`` and botocore's backoff of a few seconds. The endpoint is
``$MLFLOW_S3_ENDPOINT_URL`` when set (the variable MLflow reads for the artifacts, so one setting
serves both), else boto3's own (``$AWS_ENDPOINT_URL_S3``, ``$AWS_ENDPOINT_URL``, AWS); credentials
and region are boto3's (``$AWS_ACCESS_KEY_ID`` …, ``~/.aws``).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from attnstudy.config import ConfigError
from attnstudy.runtime.paths import experiment_folder

CHECKPOINT_URI_VAR = "ATTNSTUDY_CHECKPOINT_URI"
ENDPOINT_VAR = "MLFLOW_S3_ENDPOINT_URL"
CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 60
MAX_ATTEMPTS = 3
"""Tries of one request to the store, the first included."""
CHECKPOINT_FILE = "last.pt"

_S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(?P<prefix>.*))?$")
BOTO3_EXTRA = "checkpoints on an S3-compatible store need boto3: pip install -e '.[distributed]'"


def resume_note() -> str:
    """The note of ``attnstudy run --executor ray --resume`` on a cluster: where an interrupted
    training continues, as ``$ATTNSTUDY_CHECKPOINT_URI`` decides (set: on any node, from the
    shared store; unset: only on the node that holds its checkpoint)."""
    uri = os.environ.get(CHECKPOINT_URI_VAR, "").strip()
    if uri:
        return (
            "--resume on a cluster continues an interrupted training from its last checkpoint "
            f"on whichever node its task runs: checkpoints are shared through {uri} "
            f"({CHECKPOINT_URI_VAR})"
        )
    return (
        "--resume on a cluster continues an interrupted training from its checkpoint only if its "
        "task runs on the node that holds it; elsewhere it trains again (the same result); set "
        f"{CHECKPOINT_URI_VAR}=s3://BUCKET/PREFIX to share checkpoints between the nodes"
    )


class CheckpointStoreError(RuntimeError):
    """The checkpoint store cannot be reached or used (the message names the object and what to
    do); the local checkpoint is kept."""


@dataclass(frozen=True)
class CheckpointStore:
    """Checkpoints under ``s3://bucket/prefix/<model key>/last.pt``; one experiment's are in
    :meth:`for_experiment`'s store, under ``prefix/<experiment folder>``.

    Attributes:
        bucket: the bucket's name.
        prefix: the key prefix (no leading or trailing ``/``; may be empty).
    """

    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, uri: str) -> CheckpointStore:
        """A store from ``s3://BUCKET[/PREFIX]``.

        Raises:
            ConfigError: not such a URI (one line naming :data:`CHECKPOINT_URI_VAR`).
        """
        m = _S3_URI.match(uri.strip())
        if m is None:
            raise ConfigError(
                f"{CHECKPOINT_URI_VAR}={uri!r}: give s3://BUCKET/PREFIX of an S3-compatible "
                "store (the bucket: 3-63 lower-case letters, digits, '.' or '-'), or unset it to "
                "keep checkpoints on the node that trains"
            )
        prefix = (m["prefix"] or "").strip("/")
        return cls(m["bucket"], prefix)

    @classmethod
    def from_env(cls) -> CheckpointStore | None:
        """The store ``$ATTNSTUDY_CHECKPOINT_URI`` names, or None when it is unset or empty.

        Raises:
            ConfigError: a malformed URI, or boto3 is not installed.
        """
        uri = os.environ.get(CHECKPOINT_URI_VAR, "").strip()
        if not uri:
            return None
        store = cls.parse(uri)
        import importlib.util

        if importlib.util.find_spec("boto3") is None:
            raise ConfigError(f"{CHECKPOINT_URI_VAR} is set, but {BOTO3_EXTRA}")
        return store

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def for_experiment(self, experiment: str) -> CheckpointStore:
        """The store of one experiment's checkpoints: ``PREFIX/<experiment folder>``
        (:func:`attnstudy.runtime.paths.experiment_folder` of its name)."""
        return CheckpointStore(
            self.bucket, "/".join(p for p in (self.prefix, experiment_folder(experiment)) if p)
        )

    def key_of(self, model_key: str) -> str:
        """The object key of a model's checkpoint: ``PREFIX/<model key>/last.pt``."""
        return "/".join(p for p in (self.prefix, model_key, CHECKPOINT_FILE) if p)

    def _client(self):
        import boto3
        from botocore.config import Config

        config = Config(
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
            # total_max_attempts counts the first try; max_attempts would add one to it
            retries={"total_max_attempts": MAX_ATTEMPTS, "mode": "standard"},
        )
        endpoint = os.environ.get(ENDPOINT_VAR) or None
        return boto3.client("s3", endpoint_url=endpoint, config=config)

    @staticmethod
    def _transfer_config():
        """S3Transfer without retries of its own (botocore's :data:`MAX_ATTEMPTS` are the only
        ones) and on botocore, whose timeouts apply (not the CRT client boto3 may prefer)."""
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(num_download_attempts=1, preferred_transfer_client="classic")

    def _fail(self, what: str, model_key: str, err: Exception) -> CheckpointStoreError:
        # S3Transfer's RetriesExceededError says only "Max Retries Exceeded": the cause is inside
        err = getattr(err, "last_exception", None) or err
        reason = str(err).strip().splitlines()
        reason = reason[0][:200] if reason else type(err).__name__
        endpoint = os.environ.get(ENDPOINT_VAR)
        at = f" at {endpoint}" if endpoint else ""
        return CheckpointStoreError(
            f"cannot {what} checkpoint s3://{self.bucket}/{self.key_of(model_key)}{at} "
            f"({type(err).__name__}: {reason}); check that the checkpoint store{at} answers, "
            f"its bucket {self.bucket!r} and the credentials (AWS_ACCESS_KEY_ID …, "
            f"{ENDPOINT_VAR}), or unset {CHECKPOINT_URI_VAR} to keep checkpoints on the node "
            "that trains"
        )

    def upload(self, model_key: str, path: Path) -> None:
        """Upload a model's ``last.pt`` (replacing the one stored before it).

        Raises:
            CheckpointStoreError: the store failed (a request that gets no answer: after
                :data:`MAX_ATTEMPTS` tries of :data:`CONNECT_TIMEOUT_S` + :data:`READ_TIMEOUT_S`).
        """
        try:
            self._client().upload_file(
                str(path), self.bucket, self.key_of(model_key), Config=self._transfer_config()
            )
        except Exception as err:  # botocore's and S3Transfer's errors, connection errors
            raise self._fail("upload", model_key, err) from None

    def holds(self, model_key: str) -> bool:
        """Whether the store holds a checkpoint of the model (one ``HEAD`` request).

        Raises:
            CheckpointStoreError: the store failed (anything but a missing object).
        """
        from botocore.exceptions import ClientError

        try:
            self._client().head_object(Bucket=self.bucket, Key=self.key_of(model_key))
        except ClientError as err:
            code = str(err.response.get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._fail("look for", model_key, err) from None
        except Exception as err:  # connection errors, timeouts
            raise self._fail("look for", model_key, err) from None
        return True

    def download(self, model_key: str, dest: Path) -> bool:
        """Download a model's stored checkpoint to ``dest`` (written whole or not at all).

        Returns:
            True if the store held one, False if it holds none.

        Raises:
            CheckpointStoreError: the store failed (anything but a missing object; a request that
                gets no answer: after :data:`MAX_ATTEMPTS` tries of :data:`CONNECT_TIMEOUT_S` +
                :data:`READ_TIMEOUT_S`).
        """
        from botocore.exceptions import ClientError

        client = self._client()
        key = self.key_of(model_key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".download-", suffix=".pt")
        os.close(fd)
        try:
            try:
                client.download_file(self.bucket, key, tmp, Config=self._transfer_config())
            except ClientError as err:
                code = str(err.response.get("Error", {}).get("Code", ""))
                if code in ("404", "NoSuchKey", "NotFound"):
                    return False
                raise self._fail("download", model_key, err) from None
            except Exception as err:
                raise self._fail("download", model_key, err) from None
            os.replace(tmp, dest)
            return True
        finally:
            Path(tmp).unlink(missing_ok=True)
