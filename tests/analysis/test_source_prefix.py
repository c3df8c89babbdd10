"""Source vs prefix (Voita et al. 2021's question in gradient form): the contract's trace through
target-prefix embeddings for every family, the scores equal to Captum's with the source and the
prefix as its two inputs, integrated gradients complete over both, the prefix after a step never
credited, the share's formula, and the table, figure and definition in the report."""

from __future__ import annotations

import math
import re

import pytest
import torch
from analysis_testkit import hf_examples, make_examples, one_batch, tiny_model
from attnstudy.analysis import catalogue
from attnstudy.analysis.ablations.source_prefix import (
    source_prefix_scores,
    source_share,
    step_gradients,
)

from attnstudy.models import eval_mode, gradients_in_eval

FAMILIES = [("additive", "bahdanau"), ("multihead", "luong"), ("multihead", "transformer")]


def _model(request, kind):
    if kind == "hf":
        model = request.getfixturevalue("hf_model")
        return model, one_batch(model, hf_examples(model, 4))
    torch.manual_seed(0)
    model = tiny_model(*kind)
    return model, one_batch(model, make_examples(5))


@pytest.mark.parametrize("kind", [*FAMILIES, "hf"])
def test_the_trace_through_prefix_embeddings_is_the_trace(request, kind):
    """The contract: ``trace(embedded=embed(src), embedded_target=embed_target(tgt_in))`` is the
    plain trace, and the prefix embeddings are what the decoder reads (changing one changes the
    logits from its step on, never before)."""
    model, batch = _model(request, kind)
    tr = batch.trace
    with eval_mode(model), torch.no_grad():
        e, f = model.embed(tr.src), model.embed_target(tr.tgt_in)
        assert f.shape[:2] == tr.tgt_in.shape
        plain = model.trace(tr.src, tr.src_lengths, tr.tgt_in, tr.tgt_out)
        given = model.trace(
            tr.src, tr.src_lengths, tr.tgt_in, tr.tgt_out, embedded=e, embedded_target=f
        )
        torch.testing.assert_close(given.logits, plain.logits, atol=1e-5, rtol=1e-5)
        moved = f.clone()
        moved[:, 2] += torch.randn_like(moved[:, 2])  # the input of step 2
        other = model.trace(
            tr.src, tr.src_lengths, tr.tgt_in, tr.tgt_out, embedded=e, embedded_target=moved
        )
    real = tr.step_mask
    torch.testing.assert_close(other.logits[:, :2], plain.logits[:, :2], atol=1e-5, rtol=1e-5)
    changed = (other.logits[:, 2:] - plain.logits[:, 2:]).abs().amax(-1)[real[:, 2:]]
    assert (changed > 1e-4).all()


def _captum(model, tr, method, row, step, n_steps):
    """Captum's attribution of one example's step with (source, prefix) embeddings as inputs."""
    from captum.attr import InputXGradient, IntegratedGradients, Saliency

    n, t_y = int(tr.src_lengths[row]), int(tr.step_mask[row].sum())
    src, lengths = tr.src[row : row + 1, :n], tr.src_lengths[row : row + 1]
    tgt_in, tgt_out = tr.tgt_in[row : row + 1, :t_y], tr.tgt_out[row : row + 1, :t_y]

    def forward(e, f):
        m = e.size(0)
        trace = model.trace(
            src.expand(m, -1),
            lengths.expand(m),
            tgt_in.expand(m, -1),
            tgt_out.expand(m, -1),
            embedded=e,
            embedded_target=f,
        )
        logp = torch.log_softmax(trace.logits[:, step], -1)
        return logp.gather(-1, tgt_out[:, step].expand(m)[:, None])[:, 0]

    with eval_mode(model), gradients_in_eval():
        inputs = (model.embed(src).detach(), model.embed_target(tgt_in).detach())
        if method == "saliency":
            got = Saliency(forward).attribute(inputs, abs=True)
        elif method == "input_x_gradient":
            got = InputXGradient(forward).attribute(inputs)
        else:
            got, delta = IntegratedGradients(forward).attribute(
                inputs,
                baselines=tuple(torch.zeros_like(x) for x in inputs),
                n_steps=n_steps,
                method="gausslegendre",
                return_convergence_delta=True,
            )
    return got[0].sum(-1)[0].detach(), got[1].sum(-1)[0, : step + 1].detach()


@pytest.mark.parametrize("kind", [("additive", "bahdanau"), ("multihead", "transformer")])
@pytest.mark.parametrize("method", ["saliency", "input_x_gradient", "integrated_gradients"])
def test_scores_equal_captums_with_source_and_prefix_as_inputs(request, kind, method):
    model, batch = _model(request, kind)
    tr = batch.trace
    src, pre, _ = source_prefix_scores(model, tr, method, n_steps=8)
    for row in range(tr.src.size(0)):
        n = int(tr.src_lengths[row])
        for step in range(int(tr.step_mask[row].sum())):
            want_src, want_pre = _captum(model, tr, method, row, step, 8)
            torch.testing.assert_close(src[row, step, :n], want_src, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(pre[row, step, : step + 1], want_pre, atol=1e-5, rtol=1e-4)
            assert pre[row, step, step + 1 :].isnan().all()  # after the step: never credited


@pytest.mark.parametrize("kind", [*FAMILIES, "hf"])
def test_integrated_gradients_are_complete_over_source_and_prefix(request, kind):
    """Σ_j IG_tj + Σ_k IG_tk = f_t(e, f) − f_t(0, 0): the delta shrinks with the path points
    (float64 sums; untrained, unsharpened tiny models are smooth enough for 64 points)."""
    model, batch = _model(request, kind)
    tr = batch.trace
    _, _, coarse = source_prefix_scores(model, tr, "integrated_gradients", n_steps=2)
    _, _, fine = source_prefix_scores(model, tr, "integrated_gradients", n_steps=64)
    real = tr.step_mask
    assert fine[real].abs().max() < 5e-3
    assert fine[real].abs().max() < coarse[real].abs().max()
    assert fine[~real].isnan().all()


def test_the_prefix_after_a_step_has_no_gradient():
    """Causality, on the plain gradients: ∂ log p_t / ∂f_k = 0 for k > t, nonzero for k ≤ t."""
    torch.manual_seed(0)
    model = tiny_model("multihead", "transformer")
    tr = one_batch(model, make_examples(5)).trace
    with eval_mode(model), gradients_in_eval():
        e, f = model.embed(tr.src), model.embed_target(tr.tgt_in)
        _, gf = step_gradients(model, tr, e, f, detach_attention=False)
    norms = gf.abs().sum(-1)  # (T_y, B, T_y)
    for t in range(norms.size(0)):
        assert (norms[t, :, t + 1 :] == 0).all()
        rows = tr.step_mask[:, t]
        assert (norms[t, rows, : t + 1] > 0).all()


def test_the_share_is_the_source_mass_over_all_mass():
    nan = math.nan
    src = torch.tensor([[[1.0, -3.0, nan], [0.0, 0.0, nan]]])  # (1, 2 steps, 3 positions)
    pre = torch.tensor([[[-4.0, nan], [0.0, 0.0]]])
    got = source_share(src, pre)
    assert got[0, 0].item() == pytest.approx(4.0 / 8.0)
    assert math.isnan(got[0, 1].item())  # no mass at all: undefined, not 0


def test_a_model_without_the_capability_is_skipped_with_the_reason():
    """A model whose trace takes no prefix embeddings (no ``embed_target``: a user's own model of
    an earlier contract) skips the entry with the missing capability named."""
    from analysis_testkit import VOCAB
    from attnstudy.analysis.catalogue import AblationConfig
    from attnstudy.analysis.suite import run_suite

    torch.manual_seed(0)
    model = tiny_model("additive", "bahdanau")

    class EarlierContract(type(model)):
        embed_target = None  # a protocol member set to None: the class does not have it

    model.__class__ = EarlierContract  # a class of its own (protocol checks are cached by class)
    cfg = AblationConfig(ablations=["source_prefix"], bootstrap_resamples=20)
    res = run_suite(model, make_examples(3), VOCAB, VOCAB, cfg, progress=False)
    assert "prefix_gradients" in res.skipped["source_prefix"]


EXPERIMENT = """
[experiment]
name = "source-prefix"
seeds = [1]

[data]
task = "copy"
vocab_size = 8
min_len = 3
max_len = 6
n_train = 200
n_dev = 20
n_test = 20

[training]
epochs = 2
batch_size = 32

[ablation]
ablations = ["source_prefix"]
n_examples = 6
bootstrap_resamples = 100
[ablation.source_prefix]
n_steps = 4

[[models]]
model = { architecture = "transformer", layers = 2, heads = 2, d_model = 16, d_ff = 32 }

[[models]]
model = { attention = "additive", flow = "bahdanau", embedding_dim = 8, encoder_hidden = 8, decoder_hidden = 16, attention_dim = 8 }
"""

INTERVAL = r"-?\d[\d.e-]* \[-?\d[\d.e-]*, -?\d[\d.e-]*\]"


@pytest.mark.slow
def test_the_table_figure_and_definition_reach_the_report(tmp_path, monkeypatch):
    from attnstudy import api
    from attnstudy.experiment import load_experiment

    root = tmp_path / "root"
    (root / "mlruns").mkdir(parents=True)
    (root / "sp.toml").write_text(EXPERIMENT, encoding="utf-8")
    monkeypatch.setenv("ATTNSTUDY_ROOT", str(root))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = api.run(load_experiment(root / "sp.toml"), progress=False)
    report = result.report.parent
    md = (report / "report.md").read_text(encoding="utf-8")
    question = catalogue.get_ablation("source_prefix").questions["source_prefix"]
    block = md.split(question.title, 1)[1].split("\n### ", 1)[0]
    header = next(x for x in block.splitlines() if x.startswith("| model"))
    labels = [s.stat.label for s in catalogue.shown_stats(["source_prefix"])]
    assert [c.strip() for c in header.strip().strip("|").split("|")][-len(labels) :] == labels
    rows = [x for x in block.splitlines() if x.startswith("| ") and not x.startswith("| model")]
    assert len(rows) == 2
    for row in rows:  # both families: a share with its interval for each method, and the delta
        cells = [c.strip() for c in row.strip().strip("|").split("|")][-len(labels) :]
        assert all(re.fullmatch(INTERVAL, c) for c in cells), cells
        shares = [float(c.split()[0]) for c in cells[:3]]
        assert all(0.0 <= s <= 1.0 for s in shares)
    _, fig = next((s, f) for s, f in catalogue.figures(["source_prefix"]))
    assert f"![{fig.title}](figures/source_prefix.png)" in md
    assert (report / "figures" / "source_prefix.png").stat().st_size > 10_000
    assert "source share" in md.split("## Definitions", 1)[1]
