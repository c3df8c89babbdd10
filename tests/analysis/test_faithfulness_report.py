"""The faithfulness ablation reaches the report through the catalogue alone: its table (one
column per configured ranking and statistic, labelled by the registry, with intervals; none for
the rankings the study left out), its figure, its definition and the verdict's sentence on the
most faithful ranking."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from attnstudy.analysis import catalogue

ROOT = Path(__file__).parents[2]
INTERVAL = r"-?\d[\d.e-]* \[-?\d[\d.e-]*, -?\d[\d.e-]*\]"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    (root / "mlruns").mkdir()
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTNSTUDY_ROOT", str(root))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        from attnstudy import api
        from attnstudy.experiment import load_experiment

        cfg = load_experiment(
            ROOT / "experiments" / "tiny.toml",
            ['ablation.ablations=["permutation", "faithfulness"]', "experiment.name='faithful'"],
        )
        result = api.run(cfg, progress=False)
        yield result.report.parent
    finally:
        mp.undo()


def test_the_table_figure_definition_and_verdict_reach_the_report(report):
    md = (report / "report.md").read_text(encoding="utf-8")
    question = catalogue.get_ablation("faithfulness").questions["faithful"]
    assert f"### {question.title}" in md or question.title in md
    block = md.split(question.title, 1)[1].split("\n### ", 1)[0]
    header = next(x for x in block.splitlines() if x.startswith("| model"))
    rows = [x for x in block.splitlines() if x.startswith("| ") and not x.startswith("| model")]
    configured = catalogue.get_ablation("faithfulness").params().rankings  # the default four
    labels = [
        s.stat.label
        for s in catalogue.shown_stats(["faithfulness"])
        if s.name.removeprefix("soft_").split("_", 1)[1] in configured
    ]
    # deletion's AOPCs, then soft erasure's (on by default, one draw)
    assert labels == [
        f"{soft}{mode}, {ranking}"
        for soft in ("", "soft ")
        for mode in ("comprehensiveness", "sufficiency")
        for ranking in ("attention", "input × gradient", "leave-one-out", "random")
    ]
    # exactly the configured rankings' columns: saliency, IG and occlusion were not run
    assert [c.strip() for c in header.strip().strip("|").split("|")][3:] == labels
    summary = (report / "summary.csv").read_text(encoding="utf-8").splitlines()[0]
    assert all(f'"{label}"' in summary for label in labels) and "saliency" not in summary
    attention_row = next(r for r in rows if "additive" in r)
    cells = [c.strip() for c in attention_row.strip().strip("|").split("|")][3:]
    assert all(re.fullmatch(INTERVAL, c) for c in cells[:8]), cells
    # soft erasure is defined only where the all-zero source lowers p(y_t) by 0.01 or more: few
    # steps of this barely trained model, so a number, with an interval where examples allow
    assert all(re.fullmatch(rf"{INTERVAL}|-?\d[\d.e-]*", c) for c in cells[8:16]), cells
    none_row = next(r for r in rows if "none" in r)  # attention undefined; the others measured
    none_cells = [c.strip() for c in none_row.strip().strip("|").split("|")][3:]
    assert sum(bool(re.fullmatch(INTERVAL, c)) for c in none_cells[:8]) == 6, none_cells
    assert [none_cells[i] for i in (0, 4)] == ["no attention"] * 2
    spec, fig = next((s, f) for s, f in catalogue.figures(["faithfulness"]))
    assert f"![{fig.title}](figures/{spec.name}.png)" in md
    assert (report / "figures" / f"{spec.name}.png").stat().st_size > 10_000
    assert "- **comprehensiveness / sufficiency**:" in md
    assert "most faithful" in md
    # the model with attention says how soft erasure orders the rankings against deletion
    assert md.count("By soft erasure, the rankings' order is ") == 1
