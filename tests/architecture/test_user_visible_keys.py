"""Nothing a user sees changes when the code is reorganised: every shipped experiment's model keys,
MLflow params, run tags, registered model names and ablation keys are those recorded in
``tests/fixtures/keys/keys.json`` (by ``tests/fixtures/keys/record.py``, before the app layer was
split). The ablation key and params recorded are the battery's with the legacy random streams
(``ablation.rng = "legacy"``) and Jain & Wallace's adversarial solver (``solver = "jw"``); the
default counter-based streams (``"counter-1"``) add ``ablation.rng`` to the params, and the
default adversarial solver (``"rprop-1"``, changed on purpose in issue 58) adds
``ablation.adversarial.solver``, its 80 iterations as ``steps`` and no ``lr``: both change the
ablation key (stored ablations are recomputed), never a model key. The experiments that set
Jain & Wallace's Adam steps name ``solver = "jw"`` (their committed results were made with it).
Changed on purpose (2026-12-07, issue 58): dates-variants.toml no longer sets J&W's 250 steps (it
was regenerated with the default solver), so its legacy reconstruction is J&W's 500 and its
recorded ablation key and params were recorded again; its model keys did not change."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

FIXTURE = Path(__file__).parents[1] / "fixtures" / "keys"


def test_every_shipped_experiment_keeps_its_keys_params_tags_and_names():
    spec = importlib.util.spec_from_file_location("keys_record", FIXTURE / "record.py")
    record = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record)
    recorded = json.loads((FIXTURE / "keys.json").read_text(encoding="utf-8"))
    now = json.loads(json.dumps(record.compute(), sort_keys=True))
    assert sorted(now) == sorted(recorded)
    from attnstudy import api
    from attnstudy.experiment import load_experiment

    root = Path(__file__).parents[2] / "experiments"
    for name, exp in recorded.items():
        assert now[name]["ablation_key"] == exp["ablation_key"], name
        assert now[name]["ablation_params"] == exp["ablation_params"], name
        default = load_experiment(root / name).ablation
        assert default.rng == "counter-1", name
        want = exp["ablation_params"] | {"ablation.rng": "counter-1"}
        if "ablation.adversarial.k" in want and default.params_for("adversarial").solver != "jw":
            del want["ablation.adversarial.lr"]  # J&W's Adam learning rate
            want |= {"ablation.adversarial.solver": "rprop-1", "ablation.adversarial.steps": "80"}
        assert default.flat() == want, name
        assert api.ablation_key(default) != exp["ablation_key"], name
        assert len(now[name]["runs"]) == len(exp["runs"]), name
        for got, want in zip(now[name]["runs"], exp["runs"]):
            where = f"{name} {want['label']} seed {want['seed']}"
            assert got["model_key"] == want["model_key"], where
            assert got["params"] == want["params"], where
            assert got["tags"] == want["tags"], where
            assert got["registered_name"] == want["registered_name"], where
            assert got["variant_slug"] == want["variant_slug"], where


def test_each_task_logs_its_token_error_rate_under_its_registry_name():
    """Changed on purpose (2026-12-07): a model run logs its token error rate as
    ``test/<name>``, ``dev/<name>``, ``best_dev/<name>`` with the task registry's name: ``per``
    (phoneme error rate) for G2P only; every other task logged ``per``, a G2P term, before, and
    now logs ``token_error_rate``. Model keys, params, tags and names are unchanged; the report
    reads a stored run's ``per`` as before (``attnstudy.data.tasks.report_metrics``)."""
    from attnstudy.data.tasks import TASKS

    assert {name: task.error_rate for name, task in TASKS.items()} == {
        "copy": "token_error_rate",
        "reverse": "token_error_rate",
        "sort": "token_error_rate",
        "bigram_flip": "token_error_rate",
        "g2p": "per",
        "tsv": "token_error_rate",
        "dates": "token_error_rate",
        "nt-greek-english": "token_error_rate",
    }
