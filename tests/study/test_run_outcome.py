"""The end of an ablation run, one helper for the study's runs and ``ablate hf:FOLDER``'s
(:func:`attnstudy.pages.run_pages.log_outcome`): what the battery skipped (an artifact and a
``skipped.<ablation>`` tag each, cut at 500 characters), the unit of the plain keys, and the
metrics. ``ablate`` on a pretrained folder logged the artifact but not the tags before."""

from __future__ import annotations

import json
import types

from attnstudy.pages import run_pages
from attnstudy.tracking import Tracker
from attnstudy.tracking.schema import Artifact, Tag


def test_skipped_ablations_unit_and_metrics_are_logged(fresh_root, tmp_path):
    tracker = Tracker(f"sqlite:///{fresh_root / 'mlruns' / 'mlflow.db'}")
    run_id = tracker.start_run(tracker.experiment_id("outcome"), "ablations of x")
    result = types.SimpleNamespace(
        skipped={"decoder_lens": "a one-layer encoder", "alti_plus": "x" * 600},
        primary_unit="step",
    )
    run_pages.log_outcome(tracker, run_id, result, {"ablation/seconds": 1.5})
    run = tracker.get_run(run_id)
    assert run.tags[f"{Tag.SKIPPED_PREFIX}decoder_lens"] == "a one-layer encoder"
    assert run.tags[f"{Tag.SKIPPED_PREFIX}alti_plus"] == "x" * 500
    assert run.tags[Tag.PRIMARY_UNIT] == "step"
    assert run.metrics["ablation/seconds"] == 1.5
    got = tracker.download_artifact(run_id, Artifact.SKIPPED, tmp_path / "skipped")
    assert json.loads(open(got, encoding="utf-8").read()) == result.skipped
