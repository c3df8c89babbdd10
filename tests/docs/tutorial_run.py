"""Execute docs/tutorial.ipynb as a reader's Jupyter would: a kernel of this interpreter, the
notebook's own folder as the working directory, a store of its own (``ATTNSTUDY_ROOT``).

Used by tests/docs/test_tutorial.py; ``python tests/docs/tutorial_run.py`` (``make tutorial``)
re-executes the notebook and writes it back with its outputs, as it is committed.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.ipynb"
KERNEL = "attnstudy-tutorial"
"""A kernel spec written for the run: this interpreter, not the ``python`` first on ``PATH``
(ipykernel's own spec names ``python``, which may be another installation's)."""
CELL_TIMEOUT = 600
"""Seconds one cell may run before the run is stopped (a bound, not a measurement)."""


def execute(notebook: Path, store: Path, jupyter: Path):
    """Run every cell of ``notebook``; returns ``(executed notebook, seconds)``.

    Args:
        notebook: the ``.ipynb`` file (read, not written).
        store: ``ATTNSTUDY_ROOT`` of the run (its ``mlruns/``, reports, the Hugging Face folder).
        jupyter: a folder for the kernel spec (``JUPYTER_PATH``).

    Raises:
        nbclient.exceptions.CellExecutionError: a cell raised (the message shows the cell).
    """
    import nbformat
    from ipykernel.kernelspec import write_kernel_spec
    from nbclient import NotebookClient

    write_kernel_spec(jupyter / "kernels" / KERNEL)
    saved = {
        k: os.environ.get(k) for k in ("JUPYTER_PATH", "ATTNSTUDY_ROOT", "MLFLOW_TRACKING_URI")
    }
    os.environ["JUPYTER_PATH"] = str(jupyter)
    os.environ["ATTNSTUDY_ROOT"] = str(store)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        nb = nbformat.read(notebook, as_version=4)
        client = NotebookClient(
            nb,
            timeout=CELL_TIMEOUT,
            kernel_name=KERNEL,
            resources={"metadata": {"path": str(notebook.parent)}},
        )
        t0 = time.monotonic()
        client.execute()
        seconds = time.monotonic() - t0
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    nb.metadata.get("kernelspec", {}).update(name="python3", display_name="Python 3")
    return nb, seconds


def main() -> int:
    """Re-execute docs/tutorial.ipynb in place (its outputs as a reader sees them)."""
    import nbformat

    with tempfile.TemporaryDirectory(prefix="attnstudy-tutorial-") as tmp:
        nb, seconds = execute(TUTORIAL, Path(tmp) / "root", Path(tmp) / "jupyter")
    nbformat.write(nb, TUTORIAL)
    print(f"{TUTORIAL}: executed in {seconds:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
