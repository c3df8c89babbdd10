"""The catalogue drives the report: an ablation added by CONTRIBUTING.md's recipe reaches every
table, figure and definition with no other edit — the opt-in ``norm`` and ``rollout``, and a
throw-away ablation registered from a folder of the test's own (a catalogue search path)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from attnstudy.analysis import catalogue

ROOT = Path(__file__).parents[2]
INTERVAL = r"-?\d[\d.e-]* \[-?\d[\d.e-]*, -?\d[\d.e-]*\]"

PROBE = '''
"""A throw-away ablation: the largest attention weight per decoder step."""

from attnstudy.analysis.catalogue import AblationSpec, Figure, Question, Stat

SPEC = AblationSpec(
    name="peak_probe",
    run="peak_probe:run",
    requires=("attention",),
    stats={
        "peak": Stat(
            "peak_probe_peak", label="attention peak (probe)", unit="weight", question="focus"
        )
    },
    questions={"focus": Question("How peaked is attention? (probe)", "The largest weight.", 60)},
    figure=Figure("stat_distributions", "Attention peak (probe)", "The largest weight per step."),
    definitions=(("attention peak", "the largest weight of the attention row α_t."),),
    default=False,
    order=95,
    description="the largest attention weight per step (a test's throw-away ablation)",
    reference="none",
)


def run(model, batch, params, ctx):
    from attnstudy.analysis._chunks import require_attention, step_frame

    att = require_attention(model, batch, "peak_probe")
    frame, b, t = step_frame(batch)
    peak = att.mean(1).max(-1).values[b, t]
    frame["peak_probe_peak"] = peak.double().cpu().numpy()
    frame["peak_probe_skipped"] = False
    return frame
'''


def test_a_search_path_is_added_and_removed_whole(tmp_path):
    (tmp_path / "peak_probe.py").write_text(textwrap.dedent(PROBE), encoding="utf-8")
    before = catalogue.list_ablations()
    assert catalogue.add_search_path(tmp_path) == ["peak_probe"]
    assert catalogue.get_ablation("peak_probe").questions["focus"].order == 60
    assert "How peaked is attention? (probe)" in [q.title for q in catalogue.questions().values()]
    assert catalogue.add_search_path(tmp_path) == []  # once
    catalogue.remove_search_path(tmp_path)
    assert catalogue.list_ablations() == before
    with pytest.raises(catalogue.AblationSpecError, match="no such folder"):
        catalogue.add_search_path(tmp_path / "missing")


def test_a_spec_that_the_report_could_not_show_is_refused():
    from attnstudy.analysis.catalogue import AblationSpec, AblationSpecError, Stat

    with pytest.raises(AblationSpecError, match="needs a label"):
        Stat("x_col", question="used")
    with pytest.raises(AblationSpecError, match="unknown question 'nope'"):
        AblationSpec("x", run=print, stats={"s": Stat("x_s", label="s", question="nope")})
    with pytest.raises(AblationSpecError, match="unknown shared terms"):
        AblationSpec("x", run=print, terms=("entropy",))


def test_every_figure_kind_a_spec_names_is_drawn_by_the_figures_module():
    from attnstudy.analysis.figures import FIGURE_KINDS

    kinds = {fig.kind for _, fig in catalogue.figures()}
    assert kinds <= set(FIGURE_KINDS)
    assert {"permutation", "stat_distributions"} <= kinds


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A study of an additive model and a one-layer Transformer with permutation, norm, rollout
    and the throw-away ablation; its report folder."""
    folder = tmp_path_factory.mktemp("search_path")
    (folder / "peak_probe.py").write_text(textwrap.dedent(PROBE), encoding="utf-8")
    root = tmp_path_factory.mktemp("root")
    (root / "mlruns").mkdir()
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTNSTUDY_ROOT", str(root))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert catalogue.add_search_path(folder) == ["peak_probe"]
    try:
        from attnstudy import api
        from attnstudy.experiment import load_experiment

        cfg = load_experiment(
            ROOT / "experiments" / "tiny.toml",
            [
                'ablation.ablations=["permutation","importance","norm","rollout","peak_probe"]',
                "experiment.name='catalogue'",
                'models=[{model={attention="additive",flow="bahdanau"}},'
                '{model={architecture="transformer",layers=1,heads=2,d_model=8,d_ff=16}}]',
            ],
        )
        result = api.run(cfg, progress=False)
        yield result.report.parent
    finally:
        catalogue.remove_search_path(folder)
        mp.undo()


def _row_cells(md: str, label: str) -> list[str]:
    """The cells under ``label``'s column in report.md's table that has it."""
    for block in md.split("\n### "):
        lines = [x for x in block.splitlines() if x.startswith("|")]
        if lines and label in [c.strip() for c in lines[0].strip("|").split("|")]:
            header = [c.strip() for c in lines[0].strip("|").split("|")]
            i = header.index(label)
            return [[c.strip() for c in x.strip("|").split("|")][i] for x in lines[2:]]
    raise AssertionError(f"no table has a column {label!r}")


@pytest.mark.slow
@pytest.mark.parametrize(
    "label",
    [
        "τ attention–norm",
        "τ norm–LOO",
        "τ attention–rollout",
        "τ rollout–LOO",
        "attention peak (probe)",
    ],
)
def test_each_added_statistic_is_a_column_with_an_interval(report, label):
    md = (report / "report.md").read_text(encoding="utf-8")
    cells = _row_cells(md, label)
    assert any(re.fullmatch(INTERVAL, c) for c in cells), cells
    html = (report / "report.html").read_text(encoding="utf-8")
    assert f"<th>{label}</th>" in html


@pytest.mark.slow
def test_rollout_on_a_recurrent_model_says_why_it_has_no_value(report):
    md = (report / "report.md").read_text(encoding="utf-8")
    cells = _row_cells(md, "τ attention–rollout")
    assert "skipped" in cells and any(re.fullmatch(INTERVAL, c) for c in cells)


@pytest.mark.slow
def test_each_added_ablation_has_its_figure_its_question_and_its_definitions(report):
    md = (report / "report.md").read_text(encoding="utf-8")
    html = (report / "report.html").read_text(encoding="utf-8")
    for title, file in (
        ("Norm of the weighted value vectors against attention and leave-one-out", "norm"),
        ("Attention rollout against attention and leave-one-out", "rollout"),
        ("Attention peak (probe)", "peak_probe"),
    ):
        assert f"### {title}\n\n![{title}](figures/{file}.png)" in md
        assert (report / "figures" / f"{file}.png").stat().st_size > 10_000
        assert title in html
    assert "### How peaked is attention? (probe)\n\nThe largest weight." in md
    for term in ("norm (‖α f(x)‖)", "attention rollout", "attention peak"):
        assert f"- **{term}**:" in md
        assert f"<dt>{term}</dt>" in html
