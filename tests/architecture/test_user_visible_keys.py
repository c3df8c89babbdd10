"""Nothing a user sees changes when the code is reorganised: every shipped experiment's model keys,
MLflow params, run tags, registered model names and ablation keys are those recorded in
``tests/fixtures/keys/keys.json`` (by ``tests/fixtures/keys/record.py``, before the app layer was
split). The ablation key and params recorded are the battery's with the legacy random streams
(``ablation.rng = "legacy"``); the default counter-based streams (``"counter-1"``) add
``ablation.rng`` to the params and so change the ablation key (stored ablations are recomputed),
never a model key."""

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
        assert default.flat() == exp["ablation_params"] | {"ablation.rng": "counter-1"}, name
        assert api.ablation_key(default) != exp["ablation_key"], name
        assert len(now[name]["runs"]) == len(exp["runs"]), name
        for got, want in zip(now[name]["runs"], exp["runs"]):
            where = f"{name} {want['label']} seed {want['seed']}"
            assert got["model_key"] == want["model_key"], where
            assert got["params"] == want["params"], where
            assert got["tags"] == want["tags"], where
            assert got["registered_name"] == want["registered_name"], where
            assert got["variant_slug"] == want["variant_slug"], where
