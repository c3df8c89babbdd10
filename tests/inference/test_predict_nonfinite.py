"""NEW-2: finite weights whose logits overflow. Output weights of ±3e38 pass the NaN/inf check on
the stored weights, but the logits are ±inf or NaN: ``predict`` printed an empty output with exit
0, while ``ablate`` refused the same model. ``predict`` now refuses outputs whose probabilities are
not finite or not a distribution, with the same check and message as ``ablate``."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnstudy.models.training import NonFiniteError

ROOT = Path(__file__).parents[2]

pytestmark = pytest.mark.slow  # the tiny models are trained once per session


@pytest.fixture(scope="module")
def overflowing(tiny_models, tmp_path_factory):
    """The tiny additive model with its output weights drawn in (-1, 1) × 3e38 (finite), saved
    as a model folder: (loaded model, folder)."""
    from attnstudy.analysis.batch import prepare_batches

    from attnstudy import api
    from attnstudy.data.types import Example
    from attnstudy.models.io import save_model_dir

    _, loaded = api.load_model(f"runs:/{tiny_models[0].run_id}")
    loaded = copy.deepcopy(loaded)
    w = loaded.model.state_dict()["decoder.output.weight"]
    ex = [Example(id="x", src=tuple("abcd"), tgt=tuple("abcd"))]
    for seed in range(100):  # the first draw whose logits overflow on the greedy output (most do)
        torch.manual_seed(seed)
        with torch.no_grad():
            w.uniform_(-1, 1).mul_(3e38)
        try:
            next(prepare_batches(loaded.model, ex, loaded.src_vocab, loaded.tgt_vocab))
        except NonFiniteError:
            break
    else:
        pytest.fail("no draw of output weights overflowed the logits")
    assert bool(torch.isfinite(w).all())
    folder = tmp_path_factory.mktemp("overflow") / "model"
    save_model_dir(folder, loaded.model, loaded.spec, loaded.src_vocab, loaded.tgt_vocab)
    return loaded, folder


@pytest.mark.parametrize("beam", [1, 3])
def test_predict_refuses_overflowing_logits(overflowing, beam):
    from attnstudy.models.inference import predict_loaded

    loaded, _ = overflowing
    with pytest.raises(NonFiniteError) as info:
        predict_loaded(loaded, ["abcd", "ab"], beam)
    msg = str(info.value)
    assert "\n" not in msg and "NaN or infinite" in msg and "'abcd'" in msg
    assert "check the model's weights" in msg


def test_the_message_is_ablates(overflowing):
    """One check for both verbs: ``ablate``'s batches refuse the same model in the same words."""
    from attnstudy.analysis.batch import prepare_batches

    from attnstudy.data.types import Example

    loaded, _ = overflowing
    ex = [Example(id="e0", src=tuple("abcd"), tgt=tuple("abcd"))]
    with pytest.raises(
        NonFiniteError,
        match=r"the model's logits are NaN or infinite for example 'e0': no ablation",
    ):
        next(prepare_batches(loaded.model, ex, loaded.src_vocab, loaded.tgt_vocab))


def test_a_sound_model_still_predicts(tiny_models):
    from attnstudy import api
    from attnstudy.models.inference import predict_loaded

    _, loaded = api.load_model(f"runs:/{tiny_models[0].run_id}")
    out = predict_loaded(loaded, ["abcd"], 1, with_attention=True)
    assert out[0]["attention"] is not None and len(out[0]["attention"]) == len(out[0]["tokens"]) + 1


def test_the_cli_exits_1_in_one_line(overflowing):
    _, folder = overflowing
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    env.pop("ATTNSTUDY_DEBUG", None)
    res = subprocess.run(
        [sys.executable, "-m", "attnstudy.cli", "predict", str(folder), "abcd", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 1, (res.stdout, res.stderr[-2000:])
    assert res.stdout == "" and len(lines) == 1, res.stderr[-2000:]
    assert lines[0].startswith("attnstudy: error: the model's logits are NaN or infinite")
