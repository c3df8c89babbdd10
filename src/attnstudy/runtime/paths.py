"""Where things live: the project root, the local store, the git commit; and the bounds on the
model files attnstudy reads (standard library only)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import BinaryIO


def project_root() -> Path:
    """``$ATTNSTUDY_ROOT``, else the nearest ancestor of the working directory holding
    ``pyproject.toml`` or ``mlruns/``, else the working directory."""
    env = os.environ.get("ATTNSTUDY_ROOT")
    if env:
        return Path(env).resolve()
    cwd = Path.cwd().resolve()
    for d in (cwd, *cwd.parents):
        if (d / "mlruns").is_dir() or (d / "pyproject.toml").is_file():
            return d
    return cwd


def store_dir() -> Path:
    """The local store's folder, ``<project root>/mlruns``."""
    return project_root() / "mlruns"


def artifact_root() -> Path:
    """Where the local store keeps artifacts, ``<project root>/mlruns/artifacts``."""
    return store_dir() / "artifacts"


def checkpoint_dir(experiment: str, model_key: str) -> Path:
    """The training checkpoints of one model of one experiment,
    ``<project root>/mlruns/checkpoints/<experiment_folder(experiment)>/<model key>``.

    The experiment is part of the path because the model key is not: two experiments that
    share a model configuration keep their own checkpoints, and ``--resume`` never continues
    (or replays) another experiment's training.
    """
    return store_dir() / "checkpoints" / experiment_folder(experiment) / model_key


def old_checkpoint_dir(model_key: str) -> Path:
    """Where a model's checkpoints were kept before they were kept per experiment,
    ``<project root>/mlruns/checkpoints/<model key>`` (any experiment's; never resumed)."""
    return store_dir() / "checkpoints" / model_key


EXPERIMENT_FOLDER_MAX = 200
"""The longest :func:`experiment_folder` (a file name may have 255 bytes)."""
_PLAIN_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-")


def experiment_folder(name: str) -> str:
    """An experiment's name as one folder name or S3 key segment, one-to-one.

    Lower-case ASCII letters, digits and ``-`` are kept; every other byte of the name's UTF-8
    (upper-case letters, ``_``, ``.``, ``/``, spaces, non-ASCII) becomes ``_`` and two upper-case
    hex digits (``Tiny`` → ``_54iny``, ``my_exp`` → ``my_5Fexp``, ``a/b`` → ``a_2Fb``). So
    different names give different folders, also on a file system that ignores case (only the
    hex digits are upper case, and they decode the same), and no folder is ``.``, ``..`` or
    hidden, or holds a character S3 asks to avoid. A name whose folder would be longer than
    :data:`EXPERIMENT_FOLDER_MAX` keeps at most its first 134 characters, then ``__`` and the name's
    whole SHA-256 in hex (``__`` appears in no other folder).

    Example: ``experiment_folder("copy-adversary") == "copy-adversary"``.
    """
    out = "".join(chr(b) if b in _PLAIN_BYTES else f"_{b:02X}" for b in name.encode("utf-8"))
    if len(out) <= EXPERIMENT_FOLDER_MAX:
        return out or "_"  # a lone "_" is no other name's
    import hashlib

    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
    head = out[: EXPERIMENT_FOLDER_MAX - len(digest) - 2]
    head = head[: head.rfind("_")] if "_" in head[-2:] else head  # no escape cut in two
    return f"{head}__{digest}"


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else the project's SQLite store."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{store_dir() / 'mlflow.db'}"


def git_commit() -> str:
    """The project's git commit, or "unknown"."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=project_root(),
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# --- bounded model files ----------------------------------------------------------------------

MAX_WEIGHTS_FILE_BYTES = 64 * 2**30
"""Largest weights file read (64 GiB): a ``*.safetensors`` file of a Hugging Face folder or a
model folder's ``weights.pt``. transformers 5 writes shards of up to 50 GB (``save_pretrained``'s
default ``max_shard_size``), so every file it writes passes; a file beyond it is not a model
attnstudy could analyse on one machine, and hashing it alone would take minutes."""

MAX_TEXT_FILE_BYTES = 64 * 2**20
"""Largest config, vocabulary or tokenizer file read (64 MiB): ``config.json``, ``*.json``,
``*.txt``, ``*.model``, ``*.spm`` of a Hugging Face folder and a model folder's JSON files. These
files are read whole into memory; the largest of public models are tens of megabytes at most (a
250k-token ``tokenizer.json`` is 15–35 MB, a SentencePiece model a few MB) and attnstudy's own
vocabularies are kilobytes."""


class InputFileError(ValueError):
    """A model file that is not a regular file or is larger than its bound (one line naming the
    file and the bound)."""


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} bytes"


def _check_stat(path: Path, st: os.stat_result, weights: bool) -> int:
    kinds = (
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    )
    if not stat.S_ISREG(st.st_mode):
        kind = next((k for test, k in kinds if test(st.st_mode)), "a special file")
        via = f", through the link to {os.path.realpath(path)}" if path.is_symlink() else ""
        raise InputFileError(
            f"{path}: not a regular file ({kind}{via}); attnstudy reads only regular files here "
            "(a link to one is fine): put the real file there"
        )
    _check_size(path, st.st_size, weights)
    return st.st_size


def _check_size(path: Path, size: int, weights: bool) -> None:
    bound, name, what = (
        (MAX_WEIGHTS_FILE_BYTES, "MAX_WEIGHTS_FILE_BYTES", "a weights file")
        if weights
        else (MAX_TEXT_FILE_BYTES, "MAX_TEXT_FILE_BYTES", "a config, vocabulary or tokenizer file")
    )
    if size > bound:
        raise InputFileError(
            f"{path}: {size:,} bytes, more than the {_size(bound)} allowed for {what} "
            f"(attnstudy.runtime.paths.{name}); is it the right file?"
        )


def check_input_file(path: str | Path, weights: bool = False) -> int:
    """The size of a model file after checking, without opening it, that it is a regular file
    (symlinks are followed: a link to a regular file is fine) of at most
    :data:`MAX_WEIGHTS_FILE_BYTES` (``weights``) or :data:`MAX_TEXT_FILE_BYTES`. A FIFO, a device
    (``/dev/zero``), a socket or a link to nothing is refused before anything could block on it.

    Raises:
        InputFileError: not a regular file, a link to nothing, or larger than its bound.
    """
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if path.is_symlink():
            raise InputFileError(
                f"{path}: links to nothing ({os.readlink(path)}); put the real file there"
            ) from None
        raise
    return _check_stat(path, st, weights)


def open_input_file(path: str | Path, weights: bool = False) -> BinaryIO:
    """Open a model file for binary reading after :func:`check_input_file`; the open file is
    checked again (the path could have been replaced in between), and opening never waits for a
    FIFO's writer.

    Raises:
        InputFileError: as :func:`check_input_file`.
        OSError: the file cannot be opened.
    """
    path = Path(path)
    check_input_file(path, weights)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        _check_stat(path, os.fstat(fd), weights)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_input_text(path: str | Path) -> str:
    """A config, vocabulary or tokenizer file's text (UTF-8), read only if it passes
    :func:`open_input_file` and never beyond :data:`MAX_TEXT_FILE_BYTES` (a file growing meanwhile).

    Raises:
        InputFileError: as :func:`check_input_file`.
        OSError: the file cannot be read.
        UnicodeDecodeError: not UTF-8.
    """
    with open_input_file(path) as f:
        data = f.read(MAX_TEXT_FILE_BYTES + 1)
    _check_size(Path(path), len(data), weights=False)
    return data.decode("utf-8")
