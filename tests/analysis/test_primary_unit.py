"""The plain ``ablation/<name>/<stat>`` keys hold the top analysed layer with all heads jointly,
whatever ``ablation.heads`` says, and the suite names that unit (the ablation run's
``ablation.primary_unit`` tag). With ``heads = "each"`` no all-heads unit was computed and the
plain keys silently held the first unit (layer 1, head 1)."""

from __future__ import annotations

import pytest
from analysis_testkit import VOCAB, make_examples, sharpen, tiny_model
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.suite import headline_units, run_suite, unit_label

from attnstudy.models import ALL

NAMES = ["uniform", "alignment"]  # the analysis prefix and the reference


def _cfg(**kw) -> AblationConfig:
    return AblationConfig(ablations=NAMES, bootstrap_resamples=20, seed=3, **kw)


def _plain(summary: dict[str, float]) -> dict[str, float]:
    return {
        k: v
        for k, v in summary.items()
        if k.split("/")[1] in NAMES  # ablation/<name>/<stat>, not ablation/<unit>/…
    }


@pytest.fixture(scope="module")
def transformer():
    """A tiny two-layer, two-head Transformer."""
    return sharpen(tiny_model("multihead", "transformer", heads=2))


@pytest.mark.parametrize("layers", ["each", [0, 1]])
def test_the_plain_keys_hold_the_top_layer_with_all_heads_when_heads_are_analysed_alone(
    transformer, layers
):
    examples = make_examples(6)
    each = run_suite(
        transformer, examples, VOCAB, VOCAB, _cfg(layers=layers, heads="each"), progress=False
    )
    joint = run_suite(transformer, examples, VOCAB, VOCAB, _cfg(), progress=False)  # default
    assert joint.primary_unit == each.primary_unit == "layer 2 of 2, all heads"
    plain = _plain(each.summary)
    assert plain and plain == _plain(joint.summary)
    # the added unit is logged as a unit too, and differs from the unit the keys held before
    assert {
        k.replace("ablation/layer1/", "ablation/", 1): v
        for k, v in each.summary.items()
        if k.startswith("ablation/layer1/") and not k.startswith("ablation/layer1/head")
    } == plain
    first_head = {
        k.replace("ablation/layer0/head0/", "ablation/", 1): v
        for k, v in each.summary.items()
        if k.startswith("ablation/layer0/head0/")
    }
    for stat in ("uniform/tvd", "alignment/gold_mass"):  # 0.198 vs 0.172, 0.307 vs 0.405
        assert first_head[f"ablation/{stat}"] != pytest.approx(plain[f"ablation/{stat}"], abs=0.02)
    # each head of each layer is still its own unit; the table has the all-heads rows of layer 2
    for layer in (0, 1):
        for head in (0, 1):
            assert f"ablation/layer{layer}/head{head}/alignment/aer" in each.summary
    heads_of = each.table.groupby("layer")["head"].unique().map(sorted).to_dict()
    assert heads_of == {0: [0, 1], 1: [-1, 0, 1]}


def test_units_and_their_labels():
    assert headline_units([(0, 0), (0, 1), (1, 0), (1, 1)]) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
        (1, ALL),
    ]
    assert headline_units([(1, 0), (0, 0)]) == [(1, 0), (1, ALL), (0, 0)]
    assert headline_units([(0, ALL), (1, ALL)]) == [(0, ALL), (1, ALL)]  # heads = "all"
    assert headline_units([(ALL, ALL)]) == [(ALL, ALL)]  # layers = "all"
    assert unit_label((1, ALL), 2) == "layer 2 of 2, all heads"
    assert unit_label((0, 2), 3) == "layer 1 of 3, head 3"
    assert unit_label((ALL, ALL), 2) == "all 2 layers at once, all heads"


def test_a_recurrent_model_names_its_one_layer_and_a_model_without_attention_none():
    examples = make_examples(3)
    res = run_suite(sharpen(tiny_model("additive")), examples, VOCAB, VOCAB, _cfg(), progress=False)
    assert res.primary_unit == "layer 1 of 1, all heads"
    none = run_suite(tiny_model("none"), examples, VOCAB, VOCAB, _cfg(), progress=False)
    assert none.primary_unit is None
