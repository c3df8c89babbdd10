"""What each report cell, note, heading and link says it was computed on (issue 39, item 3): an
undefined τ says why, multi-head rows say their heads are averaged, models are named by experiment
and data set, variants whose names differ only in punctuation get their own example pages, and
the literature is cited once, beside (not inside) the verdicts. A constructed store: no training."""

import re

import numpy as np
import pandas as pd
import pytest

EXPERIMENT = "cells"
N_STEPS = 31


def _metrics(**stats):
    """``name__stat=(value, low, high)`` → flat ``ablation/<name>/<stat>`` metrics."""
    out = {}
    for key, (value, low, high) in stats.items():
        name, stat = key.split("__")
        k = f"ablation/{name}/{stat}"
        out[k], out[f"{k}_ci_low"], out[f"{k}_ci_high"] = value, low, high
        out[f"ablation/{name}/n_steps"] = float(N_STEPS)
    return out


def _steps(*, layer: int = 0, constant: bool = False) -> pd.DataFrame:
    """An importance table of 31 steps (8 examples); ``constant``: the uniform model's attention
    rows, whose τ with attention is undefined at every step."""
    rng = np.random.default_rng(layer)
    n = N_STEPS
    tau = np.full(n, np.nan) if constant else rng.uniform(-1, 1, n)
    return pd.DataFrame(
        {
            "example_id": [f"ex{i % 8}" for i in range(n)],
            "prefix": "greedy",
            "step": [i // 8 for i in range(n)],
            "layer": layer,
            "head": -1,
            "max_attention": rng.uniform(0.2, 1, n),
            "importance_skipped": False,
            "importance_tau_attn_grad": tau,
            "importance_tau_attn_loo": tau,
            "importance_tau_grad_loo": rng.uniform(-1, 1, n),
            "importance_attn_reason": pd.Series(
                ["constant attention row" if constant else None] * n, dtype=object
            ),
            "importance_grad_loo_reason": pd.Series([None] * n, dtype=object),
        }
    )


IMPORTANCE = _metrics(
    importance__tau_attn_grad=(0.3, 0.2, 0.4),
    importance__tau_attn_loo=(0.35, 0.25, 0.45),
    importance__tau_grad_loo=(0.5, 0.4, 0.6),
)
UNIFORM = _metrics(importance__tau_grad_loo=(0.5, 0.4, 0.6)) | {
    "ablation/importance/tau_attn_grad_n_undefined": float(N_STEPS),
    "ablation/importance/tau_attn_loo_n_undefined": float(N_STEPS),
}
DATA = {"data.task": "copy", "data.vocab_size": "8", "data.min_len": "3", "data.max_len": "7"}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Four models written straight into a fresh store (uniform, two variants named ``add-1`` and
    ``add_1``, a two-layer two-head Transformer) and their built report: (folder, report.md)."""
    from attnstudy.report import build_report
    from attnstudy.tracking import Artifact, Kind, Tag, Tracker

    root = tmp_path_factory.mktemp("cells")
    tracker = Tracker(f"sqlite:///{root / 'mlflow.db'}")
    exp = tracker.experiment_id(EXPERIMENT)
    study = tracker.start_run(exp, "study", {Tag.KIND: Kind.STUDY, Tag.EXPERIMENT: EXPERIMENT})
    models = [  # variant, attention, model params, metrics, steps
        ("uniform-bahdanau", "uniform", {}, UNIFORM, _steps(constant=True)),
        ("add-1", "additive", {}, IMPORTANCE, _steps()),
        ("add_1", "additive", {}, IMPORTANCE, _steps(layer=0)),
        (
            "transformer-L2H2",
            "multihead",
            {"model.heads": "2", "model.layers": "2"},
            IMPORTANCE,
            _steps(layer=1),
        ),
    ]
    model_ids, ablation_ids = [], []
    for variant, attention, params, m, steps in models:
        tags = {
            Tag.KIND: Kind.MODEL,
            Tag.TASK: "copy",
            Tag.ATTENTION: attention,
            Tag.FLOW: "bahdanau",
            Tag.VARIANT: variant,
            Tag.SEED: "1",
        }
        run = tracker.start_run(exp, f"{variant}/seed1", tags, study)
        tracker.log_params(run, DATA | params)
        tracker.log_metrics(run, {"test/exact_match": 0.5})
        tracker.end_run(run)
        abl = tracker.start_run(
            exp,
            f"{variant}/seed1/ablations",
            {Tag.KIND: Kind.ABLATION, Tag.SOURCE_RUN_ID: run},
            run,
        )
        tracker.log_params(
            abl, {"ablation.prefix": "greedy", "ablation.ablations": '["importance"]'}
        )
        tracker.log_metrics(abl, m)
        tracker.log_table(abl, steps, Artifact.STEPS)
        tracker.end_run(abl)
        model_ids.append(run)
        ablation_ids.append(abl)
    tracker.set_tags(
        study,
        {Tag.MODEL_RUN_IDS: ",".join(model_ids), Tag.ABLATION_RUN_IDS: ",".join(ablation_ids)},
    )
    tracker.end_run(study)
    html = build_report(tracker, study, root / "report")
    return html.parent, (html.parent / "report.md").read_text(encoding="utf-8")


def _row(md: str, table: str, model: str) -> list[str]:
    section = md.split(f"### {table}")[1].split("\n### ")[0]
    line = next(x for x in section.splitlines() if x.startswith(f"| {model} |"))
    return [c.strip() for c in line.strip("| ").split(" | ")]


def test_an_undefined_tau_cell_says_why(report):
    """It said ``undefined (31 of 31 steps)``; the reason was only in the per-step table."""
    _, md = report
    cells = _row(md, "Does it agree with other importance measures?", "copy uniform-bahdanau")
    assert cells[3:5] == ["undefined: constant attention row (31 of 31 steps)"] * 2
    assert cells[5] == "0.5 [0.4, 0.6]"  # τ gradient–LOO is defined


def test_multi_head_rows_say_their_heads_are_averaged(report):
    _, md = report
    section = md.split("### Does it agree with other importance measures?")[1].split("\n### ")[0]
    notes = [x for x in section.splitlines() if x.startswith("Heads averaged")]
    assert len(notes) == 1
    assert "copy transformer-L2H2 at layer 2 of 2 (the last) with its 2 heads" in notes[0]
    assert "read the heads' mean" in notes[0]
    for one_head in ("copy add-1", "copy uniform-bahdanau"):
        assert one_head not in notes[0]


def test_models_are_named_by_experiment_and_data_set(report):
    _, md = report
    data = "synthetic copy, vocabulary 8, lengths 3–7"
    assert f"### copy add-1 (experiment {EXPERIMENT}; data: {data})\n" in md
    runs = md.split("## Browse")[1]
    assert "| model | experiment | data | model run |" in runs
    row = next(x for x in runs.splitlines() if x.startswith("| copy transformer-L2H2 |"))
    assert f"| {EXPERIMENT} | {data} |" in row


def test_names_differing_only_in_punctuation_get_their_own_example_pages(report):
    """NEW-7: ``add-1`` and ``add_1`` both wrote ``examples/copy_add_1.html``, and both rows
    linked it: one model's row opened the other model's examples."""
    folder, md = report
    runs = md.split("## Browse")[1]
    links = {
        model: re.search(r"\[here\]\((examples/[^)]+)\)", line).group(1)
        for line in runs.splitlines()
        for model in ("copy add-1", "copy add_1")
        if line.startswith(f"| {model} |")
    }
    assert len(set(links.values())) == 2, links
    for model, link in links.items():
        page = (folder / link).read_text(encoding="utf-8")
        assert f"<h1>Examples — {model}</h1>" in page
    heatmaps = sorted(p.name for p in (folder / "figures").glob("heatmaps_*"))
    assert len(heatmaps) == len(set(heatmaps))


def test_the_literature_is_cited_once_and_not_beside_our_flip_rates(report):
    _, md = report
    findings = md.split("## Findings")[1].split("## How this was measured")[0]
    assert findings.count("68 % of function words and 21 % of content words") == 1
    assert findings.count("Vashishth et al. (2019)") == 1
    assert findings.count("Jain & Wallace (2019, NAACL)") == 1
    literature = next(x for x in findings.split("\n\n") if "The literature, for context" in x)
    assert "not the per-step token flip rates" in literature
    verdicts = findings.split("The findings are generated")[0].split("\n### ")[1:]
    assert len(verdicts) == 4
    for verdict in verdicts:
        assert "Moradi" not in verdict and "Jain & Wallace" not in verdict


def test_a_model_without_attention_shows_no_stored_attention_recall():
    """Runs stored before the attribution_alignment fix kept a `none` model's attention recall
    as 0; the report reads them as "no attention" (dropped when loaded), other models' and the
    methods' values stay."""
    from attnstudy.report.store import _without_false_attention

    stored = {
        "ablation/attribution_alignment/recall_attention": 0.0,
        "ablation/attribution_alignment/recall_attention_ci_low": 0.0,
        "ablation/attribution_alignment/aer_attention": float("nan"),
        "ablation/attribution_alignment/recall_integrated_gradients": 0.121,
    }
    assert _without_false_attention("none", stored) == {
        "ablation/attribution_alignment/recall_integrated_gradients": 0.121
    }
    assert _without_false_attention("additive", stored) == stored
