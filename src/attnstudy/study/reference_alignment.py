"""A study's reference aligner, at study time (the report's tables of it:
:mod:`attnstudy.report.alignment_tables`).

* The **reference row**: a task with human gold links and a reference aligner
  (:data:`attnstudy.data.reference_aligners.REFERENCE_ALIGNERS`; ``nt-greek-english``: eflomal,
  symmetrised with grow-diag-final-and) has it computed once per study, on the battery's test
  examples (the first ``ablation.n_examples``), and stored as a run of its own (kind
  ``reference_alignment``) keyed by the data settings, the examples scored and the aligner's
  version (:func:`reference_key`): a later study with the same settings reuses it.
  :func:`check_study` refuses, before anything trains, a study whose aligner is not installed.

Its scores are ``value [low, high]``: a 95 % percentile bootstrap over examples.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from attnstudy.data.reference_aligners import ReferenceAligner, reference_aligner
from attnstudy.data.types import DataError
from attnstudy.tracking import Artifact, Kind, Role, Tag, store


def reference_key(task: str, data: Any, n_scored: int, aligner: ReferenceAligner) -> str:
    """What decides a reference run's reuse: SHA-256 (16 hex digits) of the task, its data
    settings, the number of test examples scored and the aligner's version."""
    payload = {
        "task": task,
        "data": data.model_dump(mode="json"),
        "n_scored": n_scored,
        "aligner": aligner.version,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _groups(cfg) -> dict[str, tuple[str, Any, ReferenceAligner]]:
    out = {}
    for spec in cfg.runs():
        task = spec.data.task
        aligner = reference_aligner(task)
        if aligner is None:
            continue
        key = reference_key(task, spec.data, cfg.ablation.n_examples, aligner)
        out.setdefault(key, (task, spec.data, aligner))
    return out


def check_study(cfg) -> None:
    """Refuse a study whose tasks' reference aligner is not installed, before it trains.

    Raises:
        DataError: one line naming the command and what to install.
    """
    for task, _, aligner in _groups(cfg).values():
        try:
            aligner.check()
        except Exception as err:
            raise DataError(f"{err} (the reference aligner of task {task!r})") from None


def ensure_references(cfg, tracker, experiment_id: str, study_id: str) -> list[str]:
    """The reference aligner's scores for every task of the study that has one: reused from a
    finished run with the same :func:`reference_key`, else computed now and logged as a run of its
    own (params: the data settings; metrics ``reference/<stat>`` with ``_ci_low``/``_ci_high``;
    ``Artifact.REFERENCE_ALIGNMENT``). Each run is recorded in the study (``attnstudy.study.<id>``).

    Returns:
        The reference runs' ids.

    Raises:
        Exception: the aligner's own one-line error (its run is marked FAILED with it).
    """
    run_ids = []
    for key, (task, data, aligner) in _groups(cfg).items():
        done = tracker.search_runs(
            [experiment_id],
            f"tags.{Tag.REFERENCE_KEY} = '{key}' and attributes.status = 'FINISHED'",
            max_results=1,
        )
        if done:
            run_ids.append(done[0].run_id)
            continue
        run_id = tracker.start_run(
            experiment_id,
            f"reference aligner · {task}",
            {
                Tag.KIND: Kind.REFERENCE_ALIGNMENT,
                Tag.REFERENCE_KEY: key,
                Tag.TASK: task,
                Tag.STUDY_ID: study_id,
                Tag.NOTE: f"{aligner.name}: {aligner.how}",
            },
        )
        try:
            scores, counts = aligner.align(data, cfg.ablation.n_examples)
        except BaseException as err:
            tracker.set_tags(run_id, {Tag.ERROR_MESSAGE: str(err)[:5000]})
            tracker.end_run(run_id, "FAILED")
            raise
        tracker.log_params(
            run_id,
            {
                "aligner": aligner.name,
                "aligner.version": aligner.version,
                "n_scored": str(cfg.ablation.n_examples),
                **{f"data.{k}": str(v) for k, v in data.model_dump(mode="json").items()},
            },
        )
        metrics = {f"reference/{k}": float(v) for k, v in counts.items()}
        for stat, est in scores.items():
            metrics[f"reference/{stat}"] = est.value
            metrics[f"reference/{stat}_ci_low"] = est.low
            metrics[f"reference/{stat}_ci_high"] = est.high
        tracker.log_metrics(run_id, {k: v for k, v in metrics.items() if math.isfinite(v)})
        payload = {
            "task": task,
            "aligner": aligner.name,
            "how": aligner.how,
            "version": aligner.version,
            "scores": {k: [e.value, e.low, e.high] for k, e in scores.items()},
            "counts": counts,
        }
        tracker.log_text(run_id, json.dumps(payload, indent=2), Artifact.REFERENCE_ALIGNMENT)
        tracker.end_run(run_id)
        run_ids.append(run_id)
    for position, run_id in enumerate(run_ids):  # the study's members (attnstudy.study.<id>)
        store.add_member(tracker, study_id, run_id, Role.REFERENCE, position)
    return run_ids
