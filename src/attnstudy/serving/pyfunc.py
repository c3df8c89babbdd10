"""MLflow "models from code" pyfunc wrapper, so a trained model appears in the Models tab and can be
served (``mlflow models serve``). Its artifacts are the plain model files; loading goes through
:func:`attnstudy.models.io.load_model_dir` (``weights_only=True``), never through pickle. This file
and the attnstudy package are stored with the model (its ``code/``): MLflow runs them when the
pyfunc is loaded, so load a registered pyfunc only from a store you trust.

Input: a list of strings or a DataFrame with a ``source`` column; output: one string per input.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import mlflow
from mlflow.pyfunc import PythonModel


class AttnStudyPyfunc(PythonModel):
    """Greedy decoding of an attnstudy model."""

    def load_context(self, context):
        from attnstudy.models.io import MODEL_FILES, load_model_dir

        tmp = Path(tempfile.mkdtemp(prefix="attnstudy-model-"))
        for name in MODEL_FILES:
            shutil.copy(context.artifacts[Path(name).stem], tmp / name)
        self.loaded = load_model_dir(tmp)

    def predict(self, context, model_input: list[str], params=None) -> list[str]:
        from attnstudy.models.inference import predict_loaded

        sources = (
            list(model_input["source"]) if hasattr(model_input, "columns") else list(model_input)
        )
        return [r["output"] for r in predict_loaded(self.loaded, [str(s) for s in sources])]


mlflow.models.set_model(AttnStudyPyfunc())
