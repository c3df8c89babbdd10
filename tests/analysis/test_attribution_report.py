"""The attribution methods reach the report through the catalogue alone: a study with them on
shows each method's τ against attention and the method × method agreement matrix as columns with
bootstrap intervals, their figures and definitions (no edit of the report's code)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from attnstudy.analysis import catalogue

ROOT = Path(__file__).parents[2]
INTERVAL = r"-?\d[\d.e-]* \[-?\d[\d.e-]*, -?\d[\d.e-]*\]"
METHODS = ["saliency", "input_x_gradient", "integrated_gradients", "occlusion"]


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

        names = ",".join(f'"{n}"' for n in [*METHODS, "attribution_agreement"])
        cfg = load_experiment(
            ROOT / "experiments" / "tiny.toml",
            [
                f"ablation.ablations=[{names}]",
                "ablation.integrated_gradients={n_steps=8}",
                "ablation.attribution_agreement={integrated_gradients={n_steps=8}}",
                "experiment.name='attribution'",
                'models=[{model={attention="additive",flow="bahdanau"}},'
                '{model={architecture="transformer",layers=1,heads=2,d_model=8,d_ff=16}}]',
            ],
        )
        result = api.run(cfg, progress=False)
        yield result.report.parent
    finally:
        mp.undo()


def _row_cells(md: str, label: str) -> list[str]:
    for block in md.split("\n### "):
        lines = [x for x in block.splitlines() if x.startswith("|")]
        if lines and label in [c.strip() for c in lines[0].strip("|").split("|")]:
            header = [c.strip() for c in lines[0].strip("|").split("|")]
            i = header.index(label)
            return [[c.strip() for c in x.strip("|").split("|")][i] for x in lines[2:]]
    raise AssertionError(f"no table has a column {label!r}")


def _labels() -> list[str]:
    names = [*METHODS, "attribution_agreement"]
    return [s.stat.label for s in catalogue.shown_stats(names)]


@pytest.mark.slow
def test_each_method_and_agreement_statistic_is_a_report_column_with_an_interval(report):
    md = (report / "report.md").read_text(encoding="utf-8")
    html = (report / "report.html").read_text(encoding="utf-8")
    labels = _labels()
    assert "τ attention–integrated gradients" in labels
    assert "τ integrated gradients–leave-one-out" in labels  # the registry's labels
    assert len(labels) == 4 + 10  # τ against attention per method, the 10 pairs of 5 measures
    for label in labels:
        cells = _row_cells(md, label)
        assert sum(bool(re.fullmatch(INTERVAL, c)) for c in cells) == 2, (label, cells)
        assert f"<th>{label}</th>" in html
    assert "Do the importance measures agree with each other?" in md
    for term in ("saliency", "input × gradient", "integrated gradients (IG)", "occlusion"):
        assert f"- **{term}**:" in md


@pytest.mark.slow
def test_each_method_has_its_figure(report):
    md = (report / "report.md").read_text(encoding="utf-8")
    for spec, fig in catalogue.figures([*METHODS, "attribution_agreement"]):
        assert f"### {fig.title}\n\n![{fig.title}](figures/{spec.name}.png)" in md
        assert (report / "figures" / f"{spec.name}.png").stat().st_size > 10_000
