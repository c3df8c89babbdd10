"""The store's schema, named once: run kinds, tag names, artifact paths, and the plain record
every search returns (writer and reader share these names; nothing outside :mod:`attnstudy.tracking`
spells a tag or an artifact path).

Layout (one study): a study run (``<experiment>/study``) → one model run per variant and seed
(``<task>/<attention>-<flow>/seed<N>``, nested under the study that trained it) → one ablation run
per suite (``ablations of <the model run's name>``: :func:`ablation_run_name`, nested under its
model). Nesting is for browsing; links are tags, because a reused model belongs to an older study.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Kind(StrEnum):
    """The ``kind`` tag of a run."""

    STUDY = "study"
    MODEL = "model"
    ABLATION = "ablation"
    ADVERSARY = "adversary"  # a model-consistent adversary (attnstudy.study.adversaries)
    REFERENCE_ALIGNMENT = "reference_alignment"  # a task's reference aligner (eflomal) scored


ABLATION_RUN_PREFIX = "ablations of "
"""How an ablation run's name starts. The MLflow UI cuts long run names at their end, so the word
that tells an ablation run from its model run comes first (``g2p/additive-bahdanau/seed1`` and
``ablations of g2p/additive-bahdanau/seed1``); runs logged before 2026-12-07 are named
``<model run's name>/ablations``."""


def ablation_run_name(model_run_name: str) -> str:
    """The name of the ablation run of a model run named ``model_run_name``:
    ``ablations of g2p/additive-bahdanau/seed1``."""
    return f"{ABLATION_RUN_PREFIX}{model_run_name}"


def model_name_of_ablation_run(name: str) -> str:
    """The model run's name an ablation run's name was made from (either form, new or old)."""
    return name.removeprefix(ABLATION_RUN_PREFIX).removesuffix("/ablations")


class Role(StrEnum):
    """What a run is to a study that recorded it (the value of its ``attnstudy.study.<id>`` tag,
    before the position)."""

    MODEL = "model"  # a model the study trained or reused
    ABLATION = "ablation"  # a model's ablation run of the study
    FAILED = "failed"  # a training or ablation run of the study that failed
    ADVERSARY = "adversary"  # a trained adversary of the study
    REFERENCE = "reference_alignment"  # a reference aligner run the study reports


class Tag:
    """Tag names."""

    KIND = "kind"
    EXPERIMENT = "experiment"
    TASK = "task"
    ATTENTION = "attention"
    FLOW = "flow"
    ARCHITECTURE = "architecture"
    LAYERS = "layers"
    HEADS = "heads"
    VARIANT = "variant"  # the variant label: its [[models]] name, else additive-bahdanau, transformer-L2H4
    SEED = "seed"
    GIT_COMMIT = "git_commit"
    SCHEMA_VERSION = "schema_version"
    MODEL_KEY = "model_key"
    DATA_DIGEST = "data_digest"
    STUDY_ID = "study_id"  # the study that started the run
    STUDY_IDS = "study_ids"  # every study of a model run: read in older stores, no longer written
    STUDY_KEY = "study_key"
    SOURCE_RUN_ID = "source_run_id"
    ABLATION_KEY = "ablation_key"
    # an ablation run's unit of the plain ablation/<name>/<stat> keys: "layer 2 of 2, all heads"
    PRIMARY_UNIT = "ablation.primary_unit"
    # a study's members, one tag on each member run: attnstudy.study.<study run id> = "<role>
    # <position>" (Role; the position of its variant × seed in the study, 0-based), searched by
    # study; no size limit, unlike the comma-joined lists below, which older stores hold
    # (read, no longer written; MLflow caps a tag at 8,000 characters, ~240 run ids)
    STUDY_MEMBER_PREFIX = "attnstudy.study."
    MODEL_RUN_IDS = "model_run_ids"
    ABLATION_RUN_IDS = "ablation_run_ids"
    ADVERSARY_RUN_IDS = "adversary_run_ids"  # a study's trained adversaries
    ADVERSARY_KEY = "adversary_key"  # what decides an adversary run's reuse
    REFERENCE_RUN_IDS = "reference_alignment_run_ids"  # a study's reference aligner runs
    REFERENCE_KEY = "reference_alignment_key"  # data settings, examples scored, aligner version
    LAMBDA = "lambda"  # an adversary's λ
    FAILED_RUN_IDS = "failed_run_ids"
    FAILED = "failed"
    SKIPPED_PREFIX = "skipped."
    ERROR_CLASS = "error.class"
    ERROR_MESSAGE = "error.message"
    NONFINITE = "nonfinite_metrics"
    OWNER_HOST = "attnstudy.owner.host"
    OWNER_PID = "attnstudy.owner.pid"
    OWNER_START = "attnstudy.owner.start"
    LEASE_EXPIRES = "attnstudy.lease_expires"  # Unix seconds; renewed while running (leases.py)
    DEVICE = "device"  # where the run's training or analysis ran (cpu, cuda:0, …)
    CLUSTER_TASK = (
        "attnstudy.cluster_task"  # the cluster task that wrote the run (executors/distributed.py)
    )
    # the attnstudy code that wrote the run (attnstudy.runtime.code_version): its sources' digest
    # and the
    # git commit of its checkout ("unknown" for a wheel)
    CODE_DIGEST = "attnstudy.code_digest"
    CODE_COMMIT = "attnstudy.code_commit"
    NOTE = "mlflow.note.content"  # the run's description in the MLflow UI
    REGISTERED_MODEL = "registered_model"  # name/version of a model run's registered version
    VERDICT_PREFIX = "verdict."  # verdict.used, verdict.unique … on runs and model versions
    PARENT = "mlflow.parentRunId"


class Artifact:
    """Artifact paths inside a run."""

    MODEL_DIR = "model"
    CONFIG = "config.json"
    PARAMS_FULL = "params_full.json"
    PREDICTIONS = "predictions/test.parquet"
    STEPS = "ablations/steps.parquet"
    EXAMPLES = "ablations/examples.parquet"
    HEATMAPS = "ablations/heatmaps.json"  # per-example matrices (attnstudy.analysis.heatmaps)
    BROWSER = "ablations/browser.html"  # the example browser
    EXAMPLES_CSV = "ablations/examples.csv"  # one row per analysed example (previewable)
    STEPS_CSV = "ablations/steps.csv"  # the per-step table as CSV (previewable)
    SUMMARY_CSV = "ablations/summary.csv"  # statistic, value, interval, n
    SKIPPED = "ablations/skipped.json"
    PREDICTIONS_CSV = "predictions/test.csv"
    ALIGNMENTS_DIR = "alignments"  # test.pharaoh, test.gold.pharaoh, test.src-tgt, README.txt
    LEARNING_CURVE = "figures/learning_curve.png"
    ABLATION_SUMMARY_FIGURE = "figures/ablation_summary.png"
    STUDY_SUMMARY = "summary.csv"
    STUDY_SUMMARY_TABLE = "summary.json"  # mlflow.log_table: the UI's table view
    SEED_VARIANCE = "seed_variance/steps.parquet"
    ADVERSARY_STEPS = "adversary/steps.parquet"  # a trained adversary against its base, per step
    REFERENCE_ALIGNMENT = "reference_alignment.json"  # a reference aligner's scores and counts
    EXPERIMENT_TOML = "experiment.toml"
    EXPERIMENT_JSON = "experiment.json"
    REPORT_DIR = "report"
    FIGURES_DIR = "figures"


class Metric:
    """Metric names the store's own bookkeeping writes."""

    N_NONFINITE = "n_nonfinite_dropped"
    STUDY_N_OK = "study/n_ok"
    STUDY_N_FAILED = "study/n_failed"
    PROGRESS = "progress/fraction"  # how far a RUNNING training or ablation is, 0 to 1


@dataclass(frozen=True)
class RunRecord:
    """A run as plain data: what every search and lookup of the tracking layer returns.

    Attributes:
        run_id, experiment_id, name: identity.
        status: ``RUNNING``, ``FINISHED``, ``FAILED`` or ``KILLED``.
        tags, params, metrics: the run's latest values.
        lifecycle_stage: ``active``, or ``deleted`` (in the store's trash, restorable).
        artifact_uri: where the run's own artifacts are (its logged models' may be elsewhere).
    """

    run_id: str
    experiment_id: str
    name: str
    status: str
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    lifecycle_stage: str = "active"
    artifact_uri: str = ""

    @property
    def kind(self) -> str:
        return self.tags.get(Tag.KIND, "")

    def ids(self, tag: str) -> list[str]:
        """A comma-separated id list tag (``model_run_ids`` … of an older store) as a list."""
        return [i for i in self.tags.get(tag, "").split(",") if i]

    def membership(self, study_id: str) -> tuple[str, int] | None:
        """(role, position) of this run in the study ``study_id`` (its ``attnstudy.study.<id>``
        tag), or None when the study did not record it."""
        role, _, position = self.tags.get(Tag.STUDY_MEMBER_PREFIX + study_id, "").partition(" ")
        if not role:
            return None
        return role, int(position) if position.isdigit() else 0

    @classmethod
    def of(cls, run) -> RunRecord:
        """From an MLflow ``Run`` entity."""
        return cls(
            run.info.run_id,
            run.info.experiment_id,
            run.info.run_name or "",
            run.info.status,
            dict(run.data.tags),
            dict(run.data.params),
            dict(run.data.metrics),
            run.info.lifecycle_stage or "active",
            run.info.artifact_uri or "",
        )
