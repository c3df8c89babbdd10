"""What ``attnstudy ablate`` prints when the battery is done: each statistic the report shows, with
its 95 % bootstrap interval, grouped by the report's questions; the verdict; what was skipped;
where the example browser is and the ablation run it was logged to.

Labels, units, directions and questions come from the catalogue
(:func:`attnstudy.analysis.catalogue.shown_stats`), the numbers and the verdict from the run as
logged (:func:`attnstudy.verdict.findings.facts_from_metrics`,
:func:`attnstudy.verdict.findings.verdict`, as
:func:`attnstudy.pages.run_pages.log_ablation_pages` builds them). Counters (``n_identity``,
``n_skipped``, ``…_n_undefined``) are not printed: the per-step table holds them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

from attnstudy.pages.run_pages import variant_name
from attnstudy.pages.summary_lines import battery_lines
from attnstudy.tracking import Artifact, Tag, Tracker
from attnstudy.verdict.findings import VerdictThresholds


def summary_lines(
    tracker: Tracker,
    run_id: str,
    *,
    skipped: dict[str, str] | None = None,
    thresholds: VerdictThresholds | None = None,
) -> list[str]:
    """The lines ``attnstudy ablate`` prints for the ablation run ``run_id``.

    Args:
        tracker: the store the run was logged to.
        run_id: the ablation run (its metrics ``ablation/<name>/<stat>`` with ``_ci_low`` /
            ``_ci_high``, its params ``ablation.*`` and its model's tags).
        skipped: ablation → why it was skipped (``SuiteResult.skipped``).
        thresholds: the verdict's thresholds, those the run's verdict tags were set with
            (default :class:`VerdictThresholds`).

    Returns:
        Lines without newlines: a heading naming the model and the sample; per question of the
        report its title and one line per measured statistic (label, ``value [low, high]``,
        unit, which direction answers yes, the decoder steps or examples it was computed on);
        the verdict (each question's answer, then its sentences); the skipped ablations; the
        example browser's location; last, ``ablation run: runs:/<id>``.
    """
    run = tracker.get_run(run_id)
    metrics, params, tags = run.metrics, run.params, run.tags
    lines = battery_lines(
        variant_name(tags),
        tags.get(Tag.ATTENTION, ""),
        metrics,
        params,
        skipped=skipped,
        thresholds=thresholds,
    )
    lines.append(
        f"example browser: {_artifact(tracker, run.experiment_id, run_id, Artifact.BROWSER)}"
    )
    lines.append(f"ablation run: runs:/{run_id}")  # last, alone: scripts read it
    return lines


def print_summary(
    tracker: Tracker,
    run_id: str,
    *,
    skipped: dict[str, str] | None = None,
    thresholds: VerdictThresholds | None = None,
    stream=None,
) -> int:
    """Print :func:`summary_lines` to ``stream`` (default stdout); returns 0, the exit code."""
    print(
        "\n".join(summary_lines(tracker, run_id, skipped=skipped, thresholds=thresholds)),
        file=stream or sys.stdout,
    )
    return 0


def _artifact(tracker: Tracker, experiment_id: str, run_id: str, path: str) -> str:
    """Where a run's artifact is (MLflow's layout, ``<artifact location>/<run id>/artifacts/…``):
    a local path when the store keeps artifacts on this disk, else its URI
    (``mlflow-artifacts:/…/ablations/browser.html``, served by the tracking server)."""
    root = f"{tracker.artifact_location(experiment_id).rstrip('/')}/{run_id}/artifacts"
    parsed = urlparse(root)
    if parsed.scheme in ("", "file"):
        return str(Path(unquote(parsed.path)) / path)
    return f"{root}/{path}"
