"""Run names that tell a model run from its ablation run in the MLflow UI, which cuts long names
at their end: ``g2p/additive-ba…`` was both the model run and its ``…/ablations`` run."""

from __future__ import annotations

from attnstudy.tracking.schema import ablation_run_name, model_name_of_ablation_run


def test_an_ablation_run_is_named_by_its_kind_first():
    model = "g2p/additive-bahdanau/seed1"
    assert ablation_run_name(model) == "ablations of g2p/additive-bahdanau/seed1"
    cut = 16  # about what the runs table shows of a name
    assert ablation_run_name(model)[:cut] != model[:cut]


def test_both_forms_name_their_model_run():
    model = "copy/none-bahdanau/seed2"
    assert model_name_of_ablation_run(ablation_run_name(model)) == model
    assert model_name_of_ablation_run(f"{model}/ablations") == model  # a run logged before
