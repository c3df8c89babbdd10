"""CONTRIBUTING.md's recipes hold: what a reader following them alone writes reaches everything the
recipes promise, with no other edit.

(a) An ablation — one module with one statistic and a verdict role (here ``entropy``, the
normalised entropy of each step's attention row, put on a catalogue search path as a user's own
ablation would be) and its test — reaches the verdict, the report's table, its figure, the
definitions, the example browser and the cross-cutting contract tests.

(b) An attention score with its own size (here ``cosine``, e_tj = β · cos(W q_t, U k_j), Graves
et al. 2014) — its class and its ``Score`` entry declaring the fields it uses — is accepted with
its ``attention_dim``, keyed by it, refused a field it does not use, passes the model contract and
trains.

Both are registered in the test process and removed after; the end-to-end study of both is slow.
"""

from __future__ import annotations

import math
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from attnstudy.analysis import catalogue
from torch import nn
from torch.nn import functional as F

from attnstudy.models.attention import (
    Attention,
    Memory,
    Score,
    register_attention,
    unregister_attention,
)

TESTS = Path(__file__).parents[1]
ROOT = TESTS.parent
INTERVAL = r"-?\d[\d.e-]* \[-?\d[\d.e-]*, -?\d[\d.e-]*\]"

# ----------------------------------------------------------------------------- (a) an ablation

ENTROPY = '''
"""A throw-away ablation written by CONTRIBUTING.md's recipe: the normalised entropy of each
decoder step's attention row."""

from attnstudy.analysis.catalogue import AblationSpec, Figure, Question, Stat, VerdictRole

SPEC = AblationSpec(
    name="entropy",
    run="entropy:run",
    requires=("attention",),
    stats={
        "normalised": Stat(
            "entropy_normalised",
            label="attention entropy (normalised)",
            unit="H(α_t) / ln n",
            direction="lower",
            question="focus",
            verdict=VerdictRole(
                "focus",
                "note",
                note="Its attention rows have normalised entropy {fmt} (0: all weight on one "
                "source token, 1: uniform).",
            ),
        ),
    },
    questions={"focus": Question("How focused is attention?", "Entropy of α_t.", order=45)},
    figure=Figure("stat_distributions", "Attention entropy", "H(α_t) / ln n per decoder step."),
    definitions=(
        (
            "attention entropy",
            "H(α_t) = −Σ_j α_tj ln α_tj over the n source positions, divided by ln n.",
        ),
    ),
    default=False,
    order=95,
    description="the normalised entropy of the attention row per step",
    reference="none",
)


def run(model, batch, params, ctx):
    import torch
    from attnstudy.analysis._chunks import require_attention, step_frame

    rows_all = require_attention(model, batch, "entropy").mean(1)  # (B, T, T_x)
    frame, b, t = step_frame(batch)
    n = batch.trace.src_lengths.to(rows_all.device)[b].double()
    rows = rows_all[b, t].double()
    h = -(rows * torch.log(rows.clamp_min(1e-300))).sum(-1)
    value = torch.where(n > 1, h / torch.log(n.clamp_min(2.0)), torch.nan)
    frame["entropy_normalised"] = value.cpu().numpy()
    frame["entropy_skipped"] = (n < 2).cpu().numpy()
    return frame
'''


@pytest.fixture
def entropy(tmp_path):
    """The ``entropy`` module on a catalogue search path, removed after."""
    (tmp_path / "entropy.py").write_text(textwrap.dedent(ENTROPY), encoding="utf-8")
    assert catalogue.add_search_path(tmp_path) == ["entropy"]
    try:
        yield catalogue.get_ablation("entropy")
    finally:
        catalogue.remove_search_path(tmp_path)
    assert "entropy" not in catalogue.list_ablations()


def _analysis_tests():
    if str(TESTS / "analysis") not in sys.path:
        sys.path.insert(0, str(TESTS / "analysis"))


def test_the_ablation_recipe_by_hand_and_its_verdict(entropy):
    """Its test (recipe step 2): a uniform model's rows have normalised entropy 1 exactly, a
    one-position source none; its statistic reaches the verdict through its role."""
    _analysis_tests()
    from analysis_testkit import call, make_examples, one_batch, tiny_model

    from attnstudy.verdict.findings import facts_from_metrics, verdict

    model = tiny_model("uniform")
    rows = call("entropy", model, one_batch(model, make_examples(7)))
    many = rows[~rows["entropy_skipped"]]
    assert len(many) and (many["entropy_normalised"] - 1.0).abs().max() < 1e-6  # float32 rows
    assert rows[rows["entropy_skipped"]]["entropy_normalised"].isna().all()
    # the verdict reads it through the catalogue's roles
    key = "ablation/entropy/normalised"
    metrics = {key: 0.42, f"{key}_ci_low": 0.4, f"{key}_ci_high": 0.44}
    facts = facts_from_metrics(
        "m",
        "additive",
        metrics,
        stat_keys=catalogue.stat_keys(),
        roles=catalogue.verdict_roles(),
    )
    assert (
        "Its attention rows have normalised entropy 0.42 [0.4, 0.44] (0: all weight on one "
        "source token, 1: uniform)."
    ) in verdict(facts).sentences


@pytest.mark.parametrize(
    ("attention", "flow"),
    [("additive", "bahdanau"), ("multihead", "transformer"), ("none", "bahdanau")],
)
def test_the_new_ablation_passes_the_contract_tests(entropy, attention, flow, request):
    """The cross-cutting contract of tests/analysis/test_ablation_contract.py, as it runs every
    catalogue entry (batch size and batch-mates change nothing, modes restored, same seed same
    table, declared statistics produced; a model without attention skips it)."""
    _analysis_tests()
    import test_ablation_contract

    test_ablation_contract.test_every_ablation_keeps_the_contract(
        "entropy", attention, flow, request
    )


def test_the_new_ablation_reaches_the_report_and_the_browser_catalogue(entropy):
    """What the report and the browser read of it (the study below shows them built)."""
    shown = [s for s in catalogue.shown_stats() if s.ablation == "entropy"]
    assert [s.key for s in shown] == ["ablation/entropy/normalised"]
    assert catalogue.questions()["focus"].title == "How focused is attention?"
    assert ("entropy", "Attention entropy") in [(s.name, f.title) for s, f in catalogue.figures()]
    assert "attention entropy" in dict(catalogue.definitions(["entropy"]))
    assert catalogue.verdict_roles(["entropy"])["ablation/entropy/normalised"].role == "note"
    columns = [c for s, c in catalogue.example_columns(["entropy"])]
    assert [(c.key, c.label, c.unit) for c in columns] == [
        ("entropy_normalised", "attention entropy (normalised)", "H(α_t) / ln n")
    ]


# ----------------------------------------------------------------------------- (b) a score


class CosineAttention(Attention):
    r"""Cosine attention (Graves et al. 2014, eq. 6): :math:`e_{tj} = β \cos(W q_t, U k_j)` with
    a learned sharpness β; ``memory.keys`` holds the unit vectors of :math:`U k_j`, shape
    (B, T_x, attention_dim)."""

    def __init__(self, query_size: int, key_size: int, attention_dim: int):
        super().__init__(query_size, key_size)
        self.query_proj = nn.Linear(query_size, attention_dim, bias=False)
        self.key_proj = nn.Linear(key_size, attention_dim, bias=False)
        self.beta = nn.Parameter(torch.tensor(5.0))

    def memory(self, encoder_states, pad_mask):
        keys = F.normalize(self.key_proj(encoder_states), dim=-1)
        return Memory(keys, encoder_states.unsqueeze(1), pad_mask)

    def scores(self, query, memory):
        q = F.normalize(self.query_proj(query), dim=-1)  # (B, T_q, A)
        return (self.beta * q @ memory.keys.transpose(1, 2)).unsqueeze(1)  # (B, 1, T_q, T_x)


COSINE = Score(
    lambda q, k, cfg: CosineAttention(q, k, cfg.attention_dim),
    uses=("attention_dim",),
)


@pytest.fixture
def cosine():
    register_attention("cosine", COSINE)
    try:
        yield COSINE
    finally:
        unregister_attention("cosine")
    from attnstudy.config.models import SCORE_FIELDS

    assert "cosine" not in SCORE_FIELDS


def test_a_score_with_its_own_size_is_accepted_keyed_and_refused_what_it_does_not_use(cosine):
    from attnstudy.config import ConfigError, ModelConfig
    from attnstudy.experiment import parse_experiment

    cfg = ModelConfig(attention="cosine", attention_dim=8)
    assert cfg.used_fields()[-1] == "attention_dim" and "heads" not in cfg.used_fields()
    assert cfg.n_heads == 1 and cfg.label == "cosine-bahdanau"
    base = {"experiment": {"name": "t"}, "data": {"task": "copy"}}
    exp = parse_experiment(
        {**base, "models": [{"model": {"attention": "cosine", "attention_dim": 8}}]}
    )
    assert exp.runs()[0].used_fields()["model"]["attention_dim"] == 8  # in its model key
    with pytest.raises(ConfigError, match=r"model.heads = 2 is not used by cosine-bahdanau"):
        parse_experiment({**base, "models": [{"model": {"attention": "cosine", "heads": 2}}]})


@pytest.mark.parametrize("flow", ["bahdanau", "luong"])
def test_a_new_score_passes_the_model_contract(cosine, flow):
    """Every check tests/models/test_contract.py runs on each score."""
    if str(TESTS / "models") not in sys.path:
        sys.path.insert(0, str(TESTS / "models"))
    import test_contract as c

    for cell in ("gru", "lstm"):
        c.test_own_attention_reproduces_traced_logits("cosine", flow, cell)
    c.test_teacher_forced_decode_equals_trace("cosine", flow)
    c.test_padding_gets_exactly_zero_weight_and_rows_sum_to_one("cosine", flow)
    c.test_batch_size_and_padding_do_not_change_results("cosine", flow)
    c.test_gradients_flow_through_replacement_weights_and_embeddings("cosine", flow)


def test_a_new_score_trains(cosine):
    """One optimiser step on the copy loss moves the score's own parameters (β, W, U)."""
    from attnstudy.config import ModelConfig
    from attnstudy.models import build_model

    torch.manual_seed(0)
    model = build_model(
        ModelConfig(
            attention="cosine",
            attention_dim=6,
            embedding_dim=5,
            encoder_hidden=4,
            decoder_hidden=8,
            dropout=0.0,
        ),
        11,
        9,
    )
    att = model.decoder.attention
    assert isinstance(att, CosineAttention)
    before = [p.detach().clone() for p in att.parameters()]
    src = torch.tensor([[4, 5, 6, 7], [5, 6, 0, 0]])
    tgt_in, tgt_out = torch.tensor([[1, 4, 5, 6], [1, 5, 6, 0]]), torch.tensor([[4, 5, 6, 2]] * 2)
    tr = model.trace(src, torch.tensor([4, 2]), tgt_in, tgt_out)
    loss = F.cross_entropy(tr.logits[tr.step_mask], tgt_out[tr.step_mask])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss.backward()
    opt.step()
    assert all((p - b).abs().sum() > 0 for p, b in zip(att.parameters(), before))
    assert math.isfinite(float(loss.detach()))


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A study of an additive and a cosine model (its own attention_dim) with the permutation and
    entropy ablations, as the architecture review ran it; its report folder."""
    folder = tmp_path_factory.mktemp("ablations")
    (folder / "entropy.py").write_text(textwrap.dedent(ENTROPY), encoding="utf-8")
    root = tmp_path_factory.mktemp("root")
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTNSTUDY_ROOT", str(root))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    catalogue.add_search_path(folder)
    register_attention("cosine", COSINE)
    try:
        from attnstudy import api
        from attnstudy.experiment import load_experiment

        cfg = load_experiment(
            ROOT / "experiments" / "tiny.toml",
            [
                'ablation.ablations=["permutation","entropy"]',
                "experiment.name='extension'",
                'models=[{model={attention="additive",flow="bahdanau"}},'
                '{model={attention="cosine",flow="luong",attention_dim=6}}]',
            ],
        )
        yield api.run(cfg, progress=False).report.parent
    finally:
        unregister_attention("cosine")
        catalogue.remove_search_path(folder)
        mp.undo()


@pytest.mark.slow
def test_both_extensions_reach_the_report_the_verdict_and_the_browser(study):
    md = (study / "report.md").read_text(encoding="utf-8")
    html = (study / "report.html").read_text(encoding="utf-8")
    focus = md.split("### How focused is attention?")[1].split("\n### ")[0]
    for variant in ("copy additive-bahdanau", "copy cosine-luong"):
        # its column, with an interval, for both models: the cosine model trained and was ablated
        row = next(x for x in focus.splitlines() if x.startswith(f"| {variant} |"))
        assert re.search(INTERVAL, row), row
    assert "<th>attention entropy (normalised)</th>" in html
    # its figure, its definition, its verdict sentence (one per model)
    assert "### Attention entropy\n\n![Attention entropy](figures/entropy.png)" in md
    assert (study / "figures" / "entropy.png").stat().st_size > 10_000
    assert "- **attention entropy**:" in md and "<dt>attention entropy</dt>" in html
    assert md.count("Its attention rows have normalised entropy") == 2
    # the example browser of each model shows its column
    pages = sorted((study / "examples").glob("*.html"))
    assert len(pages) == 2
    for page in pages:
        assert "attention entropy (normalised)" in page.read_text(encoding="utf-8")
