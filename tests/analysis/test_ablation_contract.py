"""Cross-cutting checks every registered ablation passes, driven by the catalogue (as Captum's
``test_config`` drives its attribution methods): an ablation added to the catalogue is checked here
with no edit to this file.

For each ablation of :func:`list_ablations` and each tiny model of the three families (the
recurrent models, attnstudy's Transformer, and a pretrained Hugging Face Marian model: conftest's
``hf_model``): batch size and batch-mates change nothing (a row's numbers are its own), the model's
train/eval mode and ``requires_grad`` flags are restored, the same seed gives the same table, every
declared statistic is produced and finite, and padding (an example analysed alone has none)
changes nothing.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from analysis_testkit import VOCAB, hf_examples, make_examples, sharpen, tiny_model
from attnstudy.analysis.catalogue import AblationConfig, get_ablation, list_ablations
from attnstudy.analysis.contract import capabilities
from attnstudy.analysis.suite import run_suite

MODELS = [
    ("additive", "bahdanau"),
    ("multihead", "luong"),
    ("none", "bahdanau"),
    ("multihead", "transformer"),
    ("none", "transformer"),
    # the Hugging Face family: the session's tiny Marian checkpoint (fine-tuned, not sharpened)
    # on copy-task examples of its own vocabulary
    ("pretrained", "marian"),
]


def _cfg(name: str) -> AblationConfig:
    # small settings of the ablations that have them: the checks are about structure, not size
    return AblationConfig(
        ablations=[name],
        seed=7,
        bootstrap_resamples=20,
        **{
            n: p
            for n, p in {
                "permutation": {"n": 6},
                "erase_until_flip": {"n_random_orders": 2},
                "adversarial": {"steps": 4},
                "integrated_gradients": {"n_steps": 8},
                "source_prefix": {"n_steps": 4},
                "attribution_agreement": {"integrated_gradients": {"n_steps": 8}},
                # every ranking, so that every declared statistic is produced (soft ones too)
                "faithfulness": {
                    "rankings": list(get_ablation("faithfulness").params.RANKINGS),
                    "soft_draws": 1,
                },
            }.items()
            if n == name
        },
    )


def _model(attention: str, flow: str):
    return sharpen(tiny_model(attention, flow), 3.0)


def _runnable(name: str, model) -> bool:
    return all(c in capabilities(model) for c in get_ablation(name).requires)


def _assert_close(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Equal up to float noise: 1e-5 of each float column's scale (at least 1e-5); a column in
    nats (integrated gradients' convergence delta, tens of nats on these sharpened models) has
    float32 noise of its own magnitude × 1e-7 per term."""
    pd.testing.assert_frame_equal(
        got.drop(columns=list(_floats(want))),
        want.drop(columns=list(_floats(want))),
        check_dtype=False,
    )
    for col in _floats(want):
        scale = max(1.0, float(want[col].abs().max(skipna=True) or 0.0))
        # source vs prefix sums the scores of every source and prefix token along steep paths:
        # on the sharpened Transformer its integrated gradients differ by up to 5e-3 relative
        # between a batch and an example alone (tens of nats with cancellations), the source
        # share by 2.3e-5 and the convergence delta (130 nats at 4 path points) by 1.2e-4 of it
        atol = 1e-5 * scale
        if col.startswith("source_prefix_"):
            atol = 1e-3 * scale if "delta" in col else 1e-4
        pd.testing.assert_series_equal(got[col], want[col], atol=atol, rtol=0, check_dtype=False)


def _floats(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if frame[c].dtype.kind == "f"]


def _rows(res, name):
    spec = get_ablation(name)
    table = res.examples if spec.unit == "example" else res.table
    return table.sort_values(
        ["example_id", *([] if spec.unit == "example" else ["prefix", "step"])]
    ).reset_index(drop=True)


CASES = [(n, a, f) for n in list_ablations() for a, f in MODELS]


@pytest.mark.parametrize(
    ("name", "attention", "flow"),
    CASES,
    ids=[
        f"{n}-hf-{f}" if a == "pretrained" else f"{n}-{a}" + ("-transformer" * (f == "transformer"))
        for n, a, f in CASES
    ],
)
def test_every_ablation_keeps_the_contract(name, attention, flow, request):
    if attention == "pretrained":
        model = request.getfixturevalue("hf_model")
        examples = hf_examples(model, 5)
        vocab = model.vocab
    else:
        model = _model(attention, flow)
        examples = make_examples(5)
        vocab = VOCAB
    cfg = _cfg(name)
    flags = [p.requires_grad for p in model.parameters()]
    model.train()  # the suite must analyse in eval mode and give the training mode back
    try:
        res = run_suite(model, examples, vocab, vocab, cfg, progress=False, batch_size=5)
        assert model.training and [p.requires_grad for p in model.parameters()] == flags
        _check_runs(name, model, examples, vocab, cfg, res)
    finally:
        model.eval()  # the pretrained model is the session's; the others are built here


def _check_runs(name, model, examples, vocab, cfg, res):
    """The checks past the first run ``res`` (batch size 5, every example in one batch; started
    in train mode)."""
    if not _runnable(name, model):
        assert name in res.skipped and not any(
            k.startswith(f"ablation/{name}/") for k in res.summary
        )
        return
    assert res.skipped == {}
    spec = get_ablation(name)
    # every declared statistic is produced (defined for these models) and every value is finite
    for stat in spec.stats:
        assert (
            f"ablation/{name}/{stat}" in res.summary
            or f"ablation/{name}/{stat}_n_undefined" in res.summary
        ), stat
    assert all(math.isfinite(v) for v in res.summary.values())
    unit = "n_examples" if spec.unit == "example" else "n_steps"
    assert res.summary[f"ablation/{name}/{unit}"] > 0
    whole = _rows(res, name)

    # batch size and batch-mates change nothing; an example alone also has no padding
    small = run_suite(model, examples, vocab, vocab, cfg, progress=False, batch_size=2)
    _assert_close(_rows(small, name), whole)
    alone = pd.concat(
        [_rows(run_suite(model, [ex], vocab, vocab, cfg, progress=False), name) for ex in examples]
    )
    alone = alone.sort_values(
        list(whole.columns[:1]) + ([] if spec.unit == "example" else ["prefix", "step"])
    )
    _assert_close(alone.reset_index(drop=True), whole)
    assert small.summary.keys() == res.summary.keys()

    # the same seed gives the same table, exactly
    again = run_suite(model, examples, vocab, vocab, cfg, progress=False, batch_size=5)
    pd.testing.assert_frame_equal(_rows(again, name), whole)
    assert again.summary == res.summary


def test_the_catalogue_is_the_only_list_of_ablations():
    """Config validation, the CLI help and the default battery come from the catalogue."""
    from attnstudy.cli.main import build_parser

    names = list_ablations()
    assert AblationConfig().ablations == list_ablations(default_only=True)
    help_text = build_parser()._subparsers._group_actions[0].choices["ablate"].format_help()
    assert all(n in help_text for n in names)


def test_a_model_defined_in_a_test_runs_the_battery():
    """The contract is all an ablation needs: a model written here, satisfying it, runs every
    ablation whose capabilities it has (see docs/own-model.md)."""
    from own_model import BagOfEmbeddingsAttention, examples_and_vocab

    model = BagOfEmbeddingsAttention(seed=0)
    examples, vocab = examples_and_vocab()
    res = run_suite(
        model,
        examples,
        vocab,
        vocab,
        AblationConfig(
            ablations=[
                "permutation",
                "uniform",
                "erase_max",
                "erase_until_flip",
                "adversarial",
                "alignment",
            ],
            seed=1,
            bootstrap_resamples=20,
            permutation={"n": 5},
            adversarial={"steps": 3},
        ),
        progress=False,
    )
    assert res.skipped == {}
    assert {
        "ablation/permutation/flip_rate",
        "ablation/uniform/tvd",
        "ablation/alignment/aer",
    } <= set(res.summary)
    assert torch.isfinite(torch.tensor(list(res.summary.values()))).all()


def test_captum_shaped_entry_point_records_its_provenance_in_the_parquet_file(tmp_path):
    from analysis_testkit import one_batch
    from attnstudy.analysis.result import AblationResult, ablate

    model = _model("additive", "bahdanau")
    batch = one_batch(model, make_examples(5), "greedy")
    res = ablate(model, batch, "permutation", seed=4, n=7)
    assert res.info["ablation"] == "permutation" and res.info["params"] == {"n": 7}
    assert res.info["seed"] == 4 and res.info["prefix"] == "greedy" and res.info["layer"] == 0
    assert res.info["version"] and res.info["commit"]
    back = AblationResult.read_parquet(res.to_parquet(tmp_path / "perm.parquet"))
    assert back.info == res.info
    pd.testing.assert_frame_equal(back.table, res.table)
    with pytest.raises(ValueError, match="needs attention"):
        ablate(tiny_model("none"), one_batch(tiny_model("none"), make_examples(3)), "uniform")
