"""Statistics the ablation's settings select (``Stat.optional``: the faithfulness rankings) are
columns of the report only where the study measured them, and result tables written under a
statistic's former label read under its label now."""

from __future__ import annotations

from types import SimpleNamespace

from attnstudy.analysis import catalogue

from attnstudy.report import results
from attnstudy.report.tables import measured_somewhere


def _shown(name: str) -> catalogue.ShownStat:
    (st,) = [s for s in catalogue.shown_stats(["faithfulness"]) if s.name == name]
    return st


def _entry(metrics: dict, status: str = "FINISHED") -> SimpleNamespace:
    return SimpleNamespace(
        ablation_status=status,
        ablations_run=["faithfulness"],
        skipped={},
        ablation_metrics=metrics,
    )


def test_an_optional_statistic_is_a_column_only_where_the_study_measured_it():
    saliency = _shown("comprehensiveness_saliency")
    attention = _shown("comprehensiveness_attention")
    assert saliency.stat.optional and attention.stat.optional
    key = "ablation/faithfulness/comprehensiveness_"
    # the none baseline logged attention's count of undefined steps: measured, undefined
    study = SimpleNamespace(
        entries=[
            _entry({f"{key}attention": 0.6, f"{key}attention_n_undefined": 0.0}),
            _entry({f"{key}attention_n_undefined": 40.0}),
        ]
    )
    assert measured_somewhere(study, attention)
    assert not measured_somewhere(study, saliency)  # not among the study's rankings
    # every run failed: the columns stay, their cells say why
    failed = SimpleNamespace(entries=[_entry({}, "FAILED")])
    assert measured_somewhere(failed, saliency)
    # a statistic that is not optional is always a column
    plain = catalogue.shown_stats(["permutation"])[0]
    assert not plain.stat.optional and measured_somewhere(study, plain)


def test_a_former_label_is_read_as_the_label_now(tmp_path):
    old = "comprehensiveness, input x gradient"
    assert results.former_labels()[old] == "comprehensiveness, input × gradient"
    assert results.former_labels()["sufficiency, leave one out"] == "sufficiency, leave-one-out"
    # the agreement matrix's short labels, before its labels came from the registry
    assert results.former_labels()["τ IG–LOO"] == "τ integrated gradients–leave-one-out"
    assert results.former_labels()["τ saliency–IG"] == "τ saliency–integrated gradients"
    assert "τ saliency–occlusion" not in results.former_labels()  # unchanged: no former label
    path = tmp_path / "exp-faithfulness.csv"
    path.write_text(f'model,"{old}"\ncopy additive,"0.5 [0.4, 0.6]"\n', encoding="utf-8")
    assert results.read_rows(path) == [
        {"model": "copy additive", "comprehensiveness, input × gradient": "0.5 [0.4, 0.6]"}
    ]
    block = (
        '<!-- results:exp-faithfulness.csv[model,"comprehensiveness, input × gradient"]:begin -->'
        "\n<!-- results:exp-faithfulness.csv:end -->"
    )
    assert "| copy additive | 0.5 [0.4, 0.6] |" in results.render_blocks(block, tmp_path)
