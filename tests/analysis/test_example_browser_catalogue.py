"""The example browser shows the columns and maps of the ablations the run has, as their catalogue
entries declare them (labels, units, why a value is missing): a run of opt-in ablations only, and a
throw-away ablation registered in the test with a column of its own and a map it captures. The
browser described columns a run lacked (per_example.MEANS and LABELS were hand-kept) and never
showed a new ablation."""

from __future__ import annotations

import pytest
import torch
from analysis_testkit import VOCAB, make_examples, sharpen, tiny_model
from attnstudy.analysis import catalogue
from attnstudy.analysis.catalogue import (
    AblationConfig,
    AblationSpec,
    Capture,
    MapView,
    Stat,
    register_ablation,
    unregister_ablation,
)
from attnstudy.analysis.heatmaps import Recorder
from attnstudy.analysis.per_example import per_example_summary
from attnstudy.analysis.suite import run_suite

from attnstudy.pages.browser import browser_data, browser_html, step_columns


def _run(ablations: list[str], n: int = 6):
    model = sharpen(tiny_model("additive", seed=2))
    cfg = AblationConfig(ablations=ablations, bootstrap_resamples=20, seed=3)
    rec = Recorder(cfg.prefix)
    res = run_suite(
        model, make_examples(n), VOCAB, VOCAB, cfg, progress=False, batch_size=4, recorder=rec
    )
    records = rec.result()
    data = browser_data(records, res.table, examples=res.examples, meta={"title": "t"})
    return res, records, data


def test_a_run_of_opt_in_ablations_shows_their_columns_only():
    res, records, data = _run(["saliency", "occlusion"])
    stats = {n: catalogue.get_ablation(n).stats["tau_attn"] for n in ("saliency", "occlusion")}
    assert [(c["key"], c["label"], c["unit"]) for c in data["columns"]] == [
        ("n_steps", "steps", "decoder steps"),
        ("saliency_tau_attn", stats["saliency"].label, "Kendall τ-b"),
        ("occlusion_tau_attn", stats["occlusion"].label, "Kendall τ-b"),
    ]
    # the default battery's columns, steps and maps are not described: the run has none
    row = data["examples"][0]
    assert not {"perm_flip", "tau_attn_loo", "gold_mass", "aer"} & set(row)
    assert all(rec["step_values"] == {} for rec in data["records"].values())
    assert data["maps"] == [] and not {"gradient", "loo", "adversarial"} & set(records[0])
    # each value is the example's mean of its per-step column, where defined
    table = res.table[res.table["prefix"] == "greedy"]
    for e in data["examples"]:
        for name in ("saliency", "occlusion"):
            steps = table.loc[table["example_id"] == e["id"], f"{name}_tau_attn"].dropna()
            want = None if steps.empty else round(float(steps.mean()), 4)
            assert e[f"{name}_tau_attn"] == (pytest.approx(want) if want is not None else None)


def _peak_run(model, batch, params, ctx):
    frame, b, t = _frame(batch)
    frame["peak_test_peak"] = _peaks(batch)[b, t].double().cpu().numpy()
    frame["peak_test_skipped"] = False
    return frame


def _frame(batch):
    from attnstudy.analysis._chunks import step_frame

    return step_frame(batch)


def _peaks(batch) -> torch.Tensor:
    """The largest head-mean attention weight of every step, (B, T)."""
    return batch.trace.attention.mean(1).max(-1).values


def _peak_capture(model, batch, params, ctx):
    return _peak_run(model, batch, params, ctx), batch.trace.attention.mean(1)


def _peak_record(batch, i, steps, n, rows):
    # one map: each step's weights relative to its peak
    m = rows[i, steps, :n]
    return {"relative": (m / m.max(-1, keepdim=True).values).round(decimals=3).tolist()}


PEAK = AblationSpec(
    name="peak_test",
    run=_peak_run,
    requires=("attention",),
    stats={
        "peak": Stat(
            "peak_test_peak", label="attention peak (test)", unit="weight (0–1)", question="used"
        )
    },
    captures=Capture(
        _peak_capture,
        _peak_record,
        (MapView("relative", "weights over the peak (test)", "α_tj / max_j α_tj", scale="row"),),
    ),
    default=False,
    order=99,
    description="the largest attention weight per step (a test's throw-away ablation)",
)


@pytest.fixture
def peak_test():
    register_ablation(PEAK)
    try:
        yield PEAK
    finally:
        unregister_ablation("peak_test")
    assert "peak_test" not in catalogue.list_ablations()


def test_a_new_ablation_reaches_the_browser_with_its_column_and_map(peak_test):
    res, records, data = _run(["permutation", "peak_test"])
    columns = {c["key"]: c for c in data["columns"]}
    assert list(columns) == ["n_steps", "perm_flip", "perm_tvd", "peak_test_peak"]
    assert columns["peak_test_peak"]["label"] == "attention peak (test)"
    assert columns["peak_test_peak"]["unit"] == "weight (0–1)"
    # its per-example value: the mean of its steps' peaks
    table = res.table[res.table["prefix"] == "greedy"]
    first = data["examples"][0]
    want = table.loc[table["example_id"] == first["id"], "peak_test_peak"].mean()
    assert first["peak_test_peak"] == pytest.approx(round(float(want), 4))
    # its map: recorded while the suite ran, drawn by the page as the entry says
    assert data["maps"] == [
        {
            "key": "relative",
            "title": "weights over the peak (test)",
            "caption": "α_tj / max_j α_tj",
            "scale": "row",
        }
    ]
    rec = records[0]
    assert len(rec["relative"]) == len(rec["steps"]) and max(rec["relative"][0]) == 1.0
    assert "relative" in data["map_keys"] and "relative" in data["records"][rec["id"]]
    page = browser_html(data)
    assert "attention peak (test)" in page and "weights over the peak (test)" in page
    # the per-step table shows the permutation's columns, not a column it lacks
    assert list(data["records"][rec["id"]]["step_values"]) == ["perm. flip", "perm. TVD"]
    assert "peak_test_peak" not in step_columns()  # declared without a step label


def test_declared_columns_keep_their_keys_and_the_summary_its_order():
    """The default battery's per-example columns (examples.csv) as the entries declare them."""
    keys = [c.key for _, c in catalogue.example_columns(catalogue.list_ablations(True)) if c.listed]
    assert keys == [
        "perm_flip",
        "perm_tvd",
        "uniform_flip",
        "uniform_tvd",
        "erase_max_flip",
        "adv_jsd",
        "adv_found",
        "tau_attn_grad",
        "tau_attn_loo",
        "tau_grad_loo",
        "gold_mass",
        "aer",
        "global_changed",
        "global_edit_distance",
    ]
    assert per_example_summary(None).columns.tolist() == ["example_id", "layer", "n_steps"]


def test_a_column_key_declared_twice_is_refused(peak_test):
    twin = AblationSpec(
        name="peak_twin",
        run=_peak_run,
        stats={"peak": Stat("peak_twin_peak", label="x", question="used")},
        examples=(catalogue.ExampleColumn("perm_flip", "x", "peak_twin_peak"),),
        default=False,
    )
    register_ablation(twin)
    try:
        with pytest.raises(catalogue.AblationSpecError, match="perm_flip"):
            catalogue.example_columns()
    finally:
        unregister_ablation("peak_twin")
