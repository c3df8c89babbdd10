"""Where things live: the project root, the local store, the git commit (standard library only)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


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


def checkpoint_dir(model_key: str) -> Path:
    """The training checkpoints of one model, ``<project root>/mlruns/checkpoints/<model key>``."""
    return store_dir() / "checkpoints" / model_key


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
