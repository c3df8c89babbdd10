"""What a researcher finds in MLflow after `attnstudy run` (the tiny study): a model-training
experiment, datasets with digests and sizes, descriptions, registered versions with tags, aliases
and verdicts, logged models named by variant, and figures and tables on the runs themselves."""

import json
import struct

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tiny_study):
    from attnstudy.tracking import Kind, Tracker
    from attnstudy.tracking.store import study_runs

    tracker = Tracker()
    recorded = study_runs(tracker, tiny_study.study_run_id)
    study, models = recorded.study, recorded.models
    ablations = [recorded.ablations[m.run_id] for m in models]
    assert {m.kind for m in models} == {Kind.MODEL} and len(ablations) == len(models) == 2
    return tracker, study, models, ablations


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_experiment_opens_in_the_model_training_view(store):
    from attnstudy.tracking.client import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG

    tracker, study, _, _ = store
    exp = tracker.client.get_experiment(study.experiment_id)
    # the tag and value MLflow 3.17's UI reads (its ExperimentKind enum: "custom_model_development")
    assert (EXPERIMENT_KIND_TAG, EXPERIMENT_KIND) == (
        "mlflow.experimentKind",
        "custom_model_development",
    )
    assert exp.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND


def test_datasets_with_digest_sizes_and_source(store, tiny_config):
    tracker, _, models, _ = store
    spec = tiny_config.runs()[0]
    for m in models:
        run = tracker.client.get_run(m.run_id)
        inputs = {
            next(t.value for t in d.tags if t.key == "mlflow.data.context"): d.dataset
            for d in run.inputs.dataset_inputs
        }
        assert set(inputs) == {"train", "dev", "test"}
        for split, n in (("train", spec.data.n_train), ("dev", spec.data.n_dev), ("test", 20)):
            ds = inputs[split]
            assert ds.name == f"copy/{split}" and len(ds.digest) >= 8
            source = json.loads(ds.source)["tags"]  # a CodeDatasetSource's tags
            assert source["split"] == split and source["n"] == str(n)
            assert source["task"] == "copy" and "data.data_seed" in source
            assert json.loads(ds.profile)["num_rows"] == n
        assert inputs["train"].digest != inputs["test"].digest


def test_descriptions_on_study_model_and_ablation_runs(store):
    from attnstudy.tracking import Tag

    _, study, models, ablations = store
    assert "tiny" in study.tags[Tag.NOTE]
    for run in models:
        note = run.tags[Tag.NOTE]
        assert "Trained on 200 examples (dev 20, test 20)" in note and "test exact match" in note
    for run in ablations:
        assert len(run.tags[Tag.NOTE]) > 80


def test_registered_versions_tags_alias_verdict_and_named_models(store):
    from attnstudy.tracking import Tag

    tracker, _, models, _ = store
    for m in models:
        name, version = m.tags[Tag.REGISTERED_MODEL].rsplit("/", 1)
        mv = tracker.client.get_model_version(name, version)
        for key in ("task", "data", "attention", "flow", "test/exact_match"):
            assert key in mv.tags, key
        assert mv.tags["task"] == "copy" and "digest" in mv.tags["data"]
        assert mv.description.startswith("**copy · ")
        assert str(tracker.client.get_model_version_by_alias(name, "seed1").version) == version
        # the version's source is the logged model (MLflow 3.17's SQLite store keeps no model_id)
        assert mv.source.startswith("models:/m-")
        logged = tracker.client.get_logged_model(mv.source.removeprefix("models:/"))
        assert logged.name == f"copy-{m.tags[Tag.VARIANT]}"
        # test metrics are linked to the logged model
        assert {x.key for x in logged.metrics} >= {"test/exact_match"}
    attn = next(m for m in models if m.tags[Tag.ATTENTION] != "none")
    name, version = attn.tags[Tag.REGISTERED_MODEL].rsplit("/", 1)
    tags = tracker.client.get_model_version(name, version).tags
    # the version carries the verdict of its model's latest ablation run: the study's, or a later
    # one by another test on the session's models (a smaller battery answers "n/a" where it did
    # not ask)
    latest = tracker.search_runs(
        [attn.experiment_id],
        f"tags.source_run_id = '{attn.run_id}' and tags.kind = 'ablation'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )[0]
    verdict = {k: v for k, v in latest.tags.items() if k.startswith("verdict.")}
    assert {"verdict.used", "verdict.unique"} <= set(verdict)
    assert {k: v for k, v in tags.items() if k.startswith("verdict.")} == verdict
    assert set(verdict.values()) <= {"yes", "no", "unclear", "n/a"}


def test_figures_and_tables_on_the_runs(store, tmp_path):
    from attnstudy.tracking import Artifact, Tag

    tracker, study, models, ablations = store
    for m in models:
        png = tracker.download_artifact(m.run_id, Artifact.LEARNING_CURVE, tmp_path / m.run_id)
        w, h = _png_size(__import__("pathlib").Path(png))
        assert w >= 500 and h >= 250
    by_model = {a.tags[Tag.SOURCE_RUN_ID]: a for a in ablations}
    for m in models:
        a = by_model[m.run_id]
        for path in (Artifact.ABLATION_SUMMARY_FIGURE, Artifact.BROWSER, Artifact.SUMMARY_CSV):
            assert tracker.has_artifact(a.run_id, path), path
        has_attention = m.tags[Tag.ATTENTION] != "none"
        # heatmaps are logged when the ablation runs, for every model with attention
        assert tracker.has_artifact(a.run_id, "figures/heatmaps.png") == has_attention
        assert tracker.has_artifact(m.run_id, "alignments/test.pharaoh") == has_attention
    table = tracker.load_table(study.run_id, Artifact.STUDY_SUMMARY)
    assert len(table) >= 2
    assert tracker.has_artifact(study.run_id, Artifact.STUDY_SUMMARY_TABLE)


def test_pharaoh_alignments_are_0_based_source_first(store, tmp_path):
    from attnstudy.tracking import Tag

    tracker, _, models, _ = store
    m = next(m for m in models if m.tags[Tag.ATTENTION] != "none")
    folder = tmp_path / "al"
    for name in ("test.pharaoh", "test.src-tgt", "test.ids"):
        tracker.download_artifact(m.run_id, f"alignments/{name}", folder)
    links = (folder / "test.pharaoh").read_text().splitlines()
    pairs = (folder / "test.src-tgt").read_text().splitlines()
    ids = (folder / "test.ids").read_text().splitlines()
    assert len(links) == len(pairs) == len(ids) == 20
    for line, pair in zip(links, pairs):
        src, tgt = (p.split() for p in pair.split(" ||| "))
        for link in line.split():
            i, j = map(int, link.split("-"))
            assert 0 <= i < len(src) and 0 <= j < len(tgt)
