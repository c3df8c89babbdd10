"""A pyfunc logged before src/attnstudy was grouped into folders still loads and predicts.

tests/fixtures/models/pyfunc-flat/model.tar.gz is a registered model's pyfunc as attnstudy logged
it at 7ca8cce, when the package was flat (``serving.py``, ``inference.py``, ``training.py`` at its
top): its ``MLmodel``, the four model files, its ``serving.py`` and its ``code/attnstudy`` (the
package it was logged with; ``analysis/`` left out, as an editable install logs it). MLflow puts
that stored code first on the path when it loads the model, so the old layout must still run in a
process where the new one is installed, and give what it gave when it was logged
(``expected.json``, written by that commit's code) — and what today's loader gives on the same
files.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parents[1] / "fixtures" / "models" / "pyfunc-flat"

_LOAD = """
import json, sys
if sys.argv[3] == "imported first":
    import attnstudy.models.inference  # the installed (grouped) package
import mlflow
model = mlflow.pyfunc.load_model(sys.argv[1])
import attnstudy
print(json.dumps({"outputs": model.predict(json.loads(sys.argv[2])), "ran": attnstudy.__file__}))
"""


@pytest.mark.parametrize("process", ["fresh", "imported first"])
def test_a_pyfunc_logged_before_the_folders_loads_and_predicts_as_it_did(tmp_path, process):
    """In a fresh process the model's stored package runs whole; where the installed attnstudy
    was imported first, its ``attnstudy.inference`` (the old name, kept) serves the stored
    ``serving.py``."""
    expected = json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))
    model = tmp_path / "model"
    with tarfile.open(FIXTURE / "model.tar.gz") as tar:
        tar.extractall(model, filter="data")
    assert (model / "code" / "attnstudy" / "serving.py").is_file()  # the flat layout
    assert not (model / "code" / "attnstudy" / "serving").exists()

    res = subprocess.run(
        [sys.executable, "-c", _LOAD, str(model), json.dumps(expected["sources"]), process],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["outputs"] == expected["outputs"]
    # in a fresh process the model's own stored package ran, not the installed one
    stored = Path(got["ran"]).resolve().is_relative_to(model.resolve())
    assert stored == (process == "fresh"), got["ran"]

    # today's loader reads the same four files to the same outputs
    from attnstudy.models.inference import predict_loaded
    from attnstudy.models.io import load_model_dir

    files = model / "artifacts"
    loaded = load_model_dir(files)
    assert [r["output"] for r in predict_loaded(loaded, expected["sources"])] == expected["outputs"]
