"""ALTI+ (Ferrando et al. 2022): contributions by hand, a constructed model whose contributions are
its attention, the rollout by hand, and the contributions of the Transformer (pre- and post-LN)
and a Hugging Face Marian model: non-negative, summing to 1 per step, 0 at padding and in the
future. Each check separates readings of the paper: L1 against L2 distance, the layer norm folded
with the whole sum's σ against each part normalised on its own, the order of the rollout's
products."""

from __future__ import annotations

import math

import pytest
import torch
from analysis_testkit import VOCAB, hf_examples, make_examples, sharpen, tiny_model
from attnstudy.analysis.ablations.alti_plus import (
    AltiUnsupportedError,
    alti_plus,
    block_contributions,
    fold_layer_norm,
    l1_contributions,
    rollout,
)
from attnstudy.analysis.batch import prepare_batches
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.suite import run_suite
from torch import nn

# two tokens, d = 2, identity value and output projections, no bias: x1 = (2, 0), x2 = (1, 1),
# every attention row (½, ½); self-attention, the residual on the query's own position
X = torch.tensor([[[2.0, 0.0], [1.0, 1.0]]])  # (B=1, T=2, d=2)
HALF = torch.full((1, 1, 2, 2), 0.5)  # (B, H=1, T_q, T_k)


def _identity_block(norm=None):
    return block_contributions(
        weights=HALF,
        values=X[:, None],  # (B, H, T, d_h = d)
        w_out=torch.eye(2),
        b_out=None,
        residual=X,
        norm=norm,
        self_attention=True,
    )[0]


def test_two_by_two_contributions_by_hand():
    # row 1: T(x1) = ½(2,0) + (2,0) = (3,0), T(x2) = ½(1,1) = (½,½), y = (3½,½), ‖y‖₁ = 4:
    # c = (4 − ‖(½,½)‖₁, 4 − ‖(3,0)‖₁) = (3, 1) → (¾, ¼). Row 2: T(x1) = (1,0), T(x2) = (1½,1½),
    # y = (2½,1½): c = (4 − 3, 4 − 1) = (1, 3) → (¼, ¾). The L2 reading gives row 1 (0.84, 0.16).
    got = _identity_block()
    assert torch.allclose(got, torch.tensor([[0.75, 0.25], [0.25, 0.75]]))
    # the clamp at 0: a part farther from y than the origin contributes nothing
    parts = torch.tensor([[1.5, 0.0], [-0.5, 0.5]])
    assert torch.allclose(l1_contributions(parts, parts.sum(0)), torch.tensor([1.0, 0.0]))
    # nothing closer to y than 0 is: undefined, never a guess
    assert torch.isnan(l1_contributions(torch.zeros(2, 2), torch.zeros(2))).all()


def test_the_layer_norm_is_folded_with_the_whole_sums_sigma():
    # post-LN with γ = 1, β = 0, ε = 0: row 1's sum z = (3½, ½), μ = 2, σ = 1½ → y = (1, −1);
    # T(x1) = ((3,0) − 1½) / 1½ = (1, −1) = y, T(x2) = ((½,½) − ½) / 1½ = 0 → (1, 0). Row 2:
    # z = (2½, 1½), σ = ½: T(x1) = ((1,0) − ½) / ½ = (1, −1) = y, T(x2) = 0 → (1, 0). Each part
    # normalised by its own σ would divide by 0 for x2's part.
    norm = nn.LayerNorm(2, eps=0.0)
    got = _identity_block(norm)
    assert torch.allclose(got, torch.tensor([[1.0, 0.0], [1.0, 0.0]]))


def test_the_folded_parts_add_up_to_the_models_own_layer_norm_output():
    # σ of the whole sum with the biased variance and ε inside the root, as torch's LayerNorm:
    # the folded parts, the folded bias and β add up to LN(z) exactly; torch's unbiased standard
    # deviation (the authors' notebook) would be off by √(d / (d − 1)) = √(5/4) here
    torch.manual_seed(0)
    norm = nn.LayerNorm(5, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
        norm.bias.uniform_(-1.0, 1.0)
    parts, bias = torch.randn(3, 4, 5), torch.randn(5)
    z = parts.sum(-2) + bias
    folded, y = fold_layer_norm(parts, z, norm)
    rest, _ = fold_layer_norm(bias.expand(3, 1, 5), z, norm)
    assert torch.allclose(folded.sum(-2) + rest[:, 0] + norm.bias, y, atol=1e-5)
    assert torch.allclose(y, norm(z))


def test_the_rollout_by_hand():
    # encoder: one layer (¾ ¼; ¼ ¾); decoder: one step, its self-attention on itself (1), its
    # cross-attention ½ to encoder output 1, ¼ to output 2, ¼ to the residual (the prefix):
    # source = ½ (¾, ¼) + ¼ (¼, ¾) = (7/16, 5/16), the prefix token ¼
    enc = [torch.tensor([[[0.75, 0.25], [0.25, 0.75]]])]
    got = rollout(enc, [torch.ones(1, 1, 1)], [torch.tensor([[[0.5, 0.25, 0.25]]])])
    assert torch.allclose(got, torch.tensor([[[7 / 16, 5 / 16, 0.25]]]))
    # two encoder layers compose as C2 · C1 (the later layer on the left), not C1 · C2
    c1 = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]])
    c2 = torch.tensor([[[0.5, 0.5], [0.0, 1.0]]])
    got = rollout([c1, c2], [torch.ones(1, 1, 1)], [torch.tensor([[[1.0, 0.0, 0.0]]])])
    assert torch.allclose(got[0, 0, :2], (c2 @ c1)[0, 0]) and not torch.allclose(
        got[0, 0, :2], (c1 @ c2)[0, 0]
    )


def _constructed(d: int = 12) -> nn.Module:
    """One layer, one head, identity value and output projections, no layer norm (each replaced
    by the identity), zero biases but the cross-attention's query bias (so that the weights are
    not uniform); the encoder's self-attention and both feed-forward networks write nothing; the
    source embeddings are one-hot in the first dims, the target ones in the last (disjoint
    supports, all entries non-negative), positions zero."""
    from attnstudy.models.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(
        len(VOCAB),
        len(VOCAB),
        d_model=d,
        heads=1,
        d_ff=4,
        layers=1,
        dropout=0.0,
        layer_norm="pre",
        positions="learned",
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        n = len(VOCAB)
        half = d // 2
        for tok in range(1, n):
            model.src_embedding.weight[tok, (tok - 1) % half] = 1.0
            model.tgt_embedding.weight[tok, half + (tok - 1) % half] = 1.0
        enc, dec = model.encoder_layers[0], model.decoder_layers[0]
        dec.self_attn.v_proj.weight.copy_(torch.eye(d))
        dec.self_attn.out_proj.weight.copy_(torch.eye(d))
        dec.cross_attn.v_proj.weight.copy_(torch.eye(d))
        dec.cross_attn.out_proj.weight.copy_(torch.eye(d))
        dec.cross_attn.k_proj.weight.copy_(torch.eye(d))
        dec.cross_attn.q_proj.bias.copy_(torch.linspace(0.5, 3.0, d))
    for sub in (enc.sub, dec.sub):
        sub.norms = nn.ModuleList(nn.Identity() for _ in sub.norms)
    model.encoder_norm = nn.Identity()
    model.decoder_norm = nn.Identity()
    return model


def test_one_layer_one_head_identity_model_reduces_to_its_attention():
    model = _constructed()
    examples = [ex for ex in make_examples(6) if len(set(ex.src)) == len(ex.src) > 1]
    batch = next(iter(prepare_batches(model, examples, VOCAB, VOCAB, "reference")))
    tr = batch.trace
    got = alti_plus(model, tr)
    t_x = tr.src.size(1)
    att = tr.attention[:, 0].double()  # one head
    assert att.std() > 0.01  # not uniform: the query bias makes a real test of it
    for b in range(tr.src.size(0)):
        for t in range(int(tr.step_mask[b].sum())):
            src = got[b, t, :t_x]
            share = float(src.sum())
            # the source's share of the sum: √d‖e‖₁ per source token, against the prefix's
            assert 0 < share < 1
            # every encoder output has the same L1 norm, all entries ≥ 0, disjoint supports:
            # c_j ∝ α_j ‖e_j‖₁ = α_j · const, so the source contributions are the attention
            assert torch.allclose(src / share, att[b, t], atol=1e-9), (b, t)


@pytest.mark.parametrize(
    ("layer_norm", "attention"), [("pre", "multihead"), ("post", "multihead"), ("post", "uniform")]
)
def test_transformer_contributions_are_a_distribution_over_source_and_prefix(layer_norm, attention):
    from attnstudy.config import TransformerConfig
    from attnstudy.models import build_model

    torch.manual_seed(1)
    cfg = TransformerConfig(
        architecture="transformer",
        layers=2,
        heads=2,
        d_model=8,
        d_ff=16,
        dropout=0.0,
        layer_norm=layer_norm,
        attention=attention,
    )
    model = sharpen(build_model(cfg, len(VOCAB), len(VOCAB)).eval(), 2.0)
    batch = next(iter(prepare_batches(model, make_examples(6), VOCAB, VOCAB, "reference")))
    _check_distribution(model, batch.trace, 0.8)


def _check_distribution(model, tr, least_defined: float, some_share: bool = True):
    got = alti_plus(model, tr)
    # one example at a time (the smallest budget) gives the same numbers, to float32 noise (a
    # batch of 1 and of 6 take other matmul kernels: up to 1.7e-5 apart on an AVX-512/AMX CPU)
    torch.testing.assert_close(
        alti_plus(model, tr, budget=1), got, equal_nan=True, atol=1e-4, rtol=0
    )
    t_x, t_y = tr.src.size(1), tr.tgt_in.size(1)
    assert got.shape == (tr.src.size(0), t_y, t_x + t_y)
    real = tr.step_mask.cpu()
    # a row is undefined (NaN, whole) where some layer's output cancels every part it is made of
    # (no part closer to y than 0 is: ALTI's c is 0 for all), or where it reads such a row
    defined = ~torch.isnan(got).any(-1) & real
    assert defined.sum() >= least_defined * real.sum()
    assert torch.isnan(got[real & ~defined]).all()
    rows = got[defined]
    assert (rows >= 0).all()
    assert torch.allclose(rows.sum(-1), torch.ones(len(rows), dtype=rows.dtype), rtol=0, atol=1e-6)
    assert (
        got[:, :, :t_x].masked_select(tr.pad_mask.cpu()[:, None, :] & defined[..., None]) == 0
    ).all()
    future = torch.ones(t_y, t_y, dtype=torch.bool).triu(1)
    # a step reads no later prefix token
    assert (got[:, :, t_x:].masked_select(future & defined[..., None]) == 0).all()
    share = got[:, :, :t_x].sum(-1)[defined]
    assert ((share >= 0) & (share <= 1 + 1e-6)).all()
    assert ((share > 0) & (share < 1)).any() or not some_share


def test_hugging_face_marian_contributions_are_a_distribution(hf_model):
    examples = hf_examples(hf_model, 5)
    batch = next(
        iter(prepare_batches(hf_model, examples, hf_model.vocab, hf_model.vocab, "reference"))
    )
    # the session's Marian is barely fine-tuned (20 steps, init std 0.02): its cross-attention
    # parts are ~1/25 of the residual stream in L1 and point away from the output, so ALTI+
    # gives the source nothing; the layers are read as the model computes them (the
    # cross-attention weights recomputed from the decomposed stream equal the model's)
    _check_distribution(hf_model, batch.trace, 1.0, some_share=False)


def test_the_ablation_runs_on_a_transformer_and_is_refused_for_a_recurrent_model():
    cfg = AblationConfig(ablations=["alti_plus"], bootstrap_resamples=20)
    tf = sharpen(tiny_model("multihead", "transformer"), 2.0)
    res = run_suite(tf, make_examples(6), VOCAB, VOCAB, cfg, progress=False)
    assert res.skipped == {}
    s = res.summary
    assert 0 < s["ablation/alti_plus/source_share"] < 1
    for k in ("tau_attn_alti", "tau_alti_loo", "tau_attn_loo"):
        assert -1 <= s[f"ablation/alti_plus/{k}"] <= 1
    assert 0 <= s["ablation/alti_plus/aer_alti"] <= 1
    # attention's AER is the alignment ablation's own
    al = run_suite(
        tf,
        make_examples(6),
        VOCAB,
        VOCAB,
        AblationConfig(ablations=["alignment"], bootstrap_resamples=20),
        progress=False,
    )
    assert math.isclose(s["ablation/alti_plus/aer_attention"], al.summary["ablation/alignment/aer"])
    rnn = tiny_model("additive", "bahdanau")
    res = run_suite(rnn, make_examples(3), VOCAB, VOCAB, cfg, progress=False)
    assert "self_attention" in res.skipped["alti_plus"]
    batch = next(iter(prepare_batches(rnn, make_examples(3), VOCAB, VOCAB, "reference")))
    with pytest.raises(AltiUnsupportedError, match="ALTI\\+ decomposes Transformer"):
        alti_plus(rnn, batch.trace)


def test_the_figure_draws_the_source_share_per_fifth_of_the_output():
    import pandas as pd
    from attnstudy.analysis.figures.alti_plus import source_share_along_output

    # one model, two examples of 5 steps (step t in fifth t + 1): a falls 0.9 → 0.1, b 0.7 → 0.1
    rows = pd.DataFrame(
        {
            "variant": ["m"] * 10,
            "example_id": ["a"] * 5 + ["b"] * 5,
            "step": list(range(5)) * 2,
            "alti_plus_source_share": [0.9, 0.7, 0.5, 0.3, 0.1, 0.7, 0.5, 0.3, 0.1, float("nan")],
        }
    )
    fig = source_share_along_output(rows, {"m": "C0"})
    line = fig.axes[0].lines[0]
    # fifths 1–4: the two examples' mean; fifth 5: example a's alone (b's step is undefined)
    assert list(line.get_ydata()) == pytest.approx([0.8, 0.6, 0.4, 0.2, 0.1])
    empty = source_share_along_output(rows.iloc[:0], {"m": "C0"})
    assert "no ALTI+ source contribution" in empty.axes[0].texts[0].get_text()


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_a_tiny_bart_is_decomposed_and_t5_refused_in_one_line(family, tmp_path):
    pytest.importorskip("transformers")
    from attnstudy.models.hf import load_pretrained
    from attnstudy.models.hf_tiny import build_tiny

    model = load_pretrained(build_tiny(tmp_path / family, family=family, steps=0)).eval()
    batch = next(
        iter(prepare_batches(model, hf_examples(model, 4), model.vocab, model.vocab, "reference"))
    )
    if family == "t5":
        with pytest.raises(AltiUnsupportedError, match="post-LN Marian and BART.*'t5'"):
            alti_plus(model, batch.trace)
        return
    _check_distribution(model, batch.trace, 1.0, some_share=False)


def test_a_stream_read_wrongly_is_refused_not_decomposed(hf_model):
    from attnstudy.analysis.ablations import alti_plus as module

    batch = next(
        iter(
            prepare_batches(
                hf_model, hf_examples(hf_model, 3), hf_model.vocab, hf_model.vocab, "reference"
            )
        )
    )
    calls = []
    real = module._check_cross_weights

    def misread(att, stream, memory, pad_mask, weights):
        calls.append(1)
        # the layer's input instead of the self-attention sublayer's output
        real(att, stream * 0.5, memory, pad_mask, weights)

    module._check_cross_weights = misread
    try:
        with pytest.raises(AltiUnsupportedError, match="do not compute as ALTI\\+ reads"):
            alti_plus(hf_model, batch.trace)
    finally:
        module._check_cross_weights = real
    assert calls
