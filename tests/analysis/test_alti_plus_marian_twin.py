"""ALTI+ (Ferrando et al. 2022) of the same tiny Marian built twice — a Hugging Face
``MarianMTModel`` saved as a folder and loaded by :func:`attnstudy.models.hf.load_pretrained`, and
attnstudy's :class:`~attnstudy.models.transformer.Transformer` with its weights copied — gives equal
contributions (issue 66, item 2). The two readings of the layers (``_hf_layers`` reads the
model's hidden states and attentions through transformers; ``_transformer_layers`` recomputes
attnstudy's layers) cannot both be right unless they agree.

What matches by configuration: post-LN layers (self-attention, cross-attention, feed-forward,
each LayerNorm(x + F(x))) with no final or embedding layer norm, ReLU
(``activation_function="relu"``; MarianConfig's default is GELU), token embeddings × √d
(``scale_embedding=True``; the config's default is False), sinusoidal positions from 0,
softmax(QKᵀ/√d_h) per head, biases on every projection, no dropout. What differs and how it is bridged: Marian's sinusoids are not
interleaved (sin of frequency i in dimension i, its cos in d/2 + i), attnstudy's are (sin in
2i, cos in 2i + 1). So the copy permutes the model dimension — Marian's dimension π(a) becomes
attnstudy's a, π(2i) = i, π(2i + 1) = d/2 + i — in every embedding, every projection into or
out of the residual stream and every LayerNorm weight and bias. The permuted model computes the
same function up to that permutation of its stream (LayerNorm's mean and σ and ALTI's L1
distances ignore the order of the dimensions), so its logits, attention and ALTI+ contributions
are the Marian's. The position tables themselves are computed differently (attnstudy in float32
torch, Marian in float64 NumPy stored as float32): equal after the permutation to 1e-6; both
models then run in float64.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from analysis_testkit import hf_examples
from attnstudy.analysis.ablations.alti_plus import alti_plus
from attnstudy.analysis.batch import prepare_batches

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed (pip install -e '.[hf]')",
)

D, HEADS, FF, LAYERS = 16, 2, 32, 2
PERM = torch.tensor([i // 2 + (D // 2) * (i % 2) for i in range(D)])
"""attnstudy's dimension a is Marian's PERM[a]: sin of frequency i at 2i ↔ i, cos at 2i + 1 ↔
d/2 + i."""


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """(the Hugging Face model, attnstudy's copy, the copy without the permutation), float64."""
    from transformers import MarianConfig, MarianMTModel

    from attnstudy.models.hf import load_pretrained
    from attnstudy.models.hf_tiny import _tokenizer, copy_pairs

    tok = _tokenizer("word", copy_pairs(400, 0))
    cfg = MarianConfig(
        vocab_size=len(tok),
        d_model=D,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=FF,
        decoder_ffn_dim=FF,
        max_position_embeddings=64,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        decoder_start_token_id=tok.pad_token_id,
        forced_eos_token_id=tok.eos_token_id,
        activation_function="relu",
        scale_embedding=True,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        # weights N(0, 0.2²): the source's share of a step is 0.41–0.66 (at Marian's 0.02 the
        # cross-attention parts are too small for the source to get anything)
        init_std=0.2,
    )
    torch.manual_seed(0)
    marian = MarianMTModel(cfg)
    with torch.no_grad():  # biases and layer norms that are not their initial 0 and 1
        for name, p in marian.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "layer_norm" in name:
                p.normal_(1.0, 0.2)
        marian.final_logits_bias.normal_(0.0, 0.1)
    folder = tmp_path_factory.mktemp("marian-twin")
    marian.save_pretrained(folder)
    tok.save_pretrained(folder)
    hf = load_pretrained(folder).double()
    return hf, _copy(hf, PERM), _copy(hf, torch.arange(D))


def _copy(hf, perm: torch.Tensor):
    """attnstudy's post-LN Transformer with the Marian's weights, its model dimension permuted by
    ``perm`` (attnstudy dimension a ← Marian dimension perm[a])."""
    from attnstudy.models.transformer import Transformer

    m = hf.hf.model
    v = int(hf.hf.config.vocab_size)
    twin = Transformer(
        v, v, d_model=D, heads=HEADS, d_ff=FF, layers=LAYERS, dropout=0.0, layer_norm="post",
        positions="sinusoidal", max_positions=64,
    ).double()  # fmt: skip

    def into(dst, src):  # a projection that reads the stream: its input columns permuted
        dst.weight.copy_(src.weight[:, perm])
        dst.bias.copy_(src.bias)

    def out_of(dst, src):  # one that writes the stream (and a LayerNorm): its outputs permuted
        dst.weight.copy_(src.weight[perm])
        dst.bias.copy_(src.bias[perm])

    def attention(dst, src):
        for name in ("q_proj", "k_proj", "v_proj"):
            into(getattr(dst, name), getattr(src, name))
        out_of(dst.out_proj, src.out_proj)

    with torch.no_grad():
        twin.src_embedding.weight.copy_(m.encoder.embed_tokens.weight[:, perm])
        twin.tgt_embedding.weight.copy_(m.decoder.embed_tokens.weight[:, perm])
        for a, b in zip(twin.encoder_layers, m.encoder.layers, strict=True):
            attention(a.self_attn, b.self_attn)
            out_of(a.sub.norms[0], b.self_attn_layer_norm)
            into(a.ff.net[0], b.fc1)
            out_of(a.ff.net[3], b.fc2)
            out_of(a.sub.norms[1], b.final_layer_norm)
        for a, b in zip(twin.decoder_layers, m.decoder.layers, strict=True):
            attention(a.self_attn, b.self_attn)
            out_of(a.sub.norms[0], b.self_attn_layer_norm)
            attention(a.cross_attn, b.encoder_attn)
            out_of(a.sub.norms[1], b.encoder_attn_layer_norm)
            into(a.ff.net[0], b.fc1)
            out_of(a.ff.net[3], b.fc2)
            out_of(a.sub.norms[2], b.final_layer_norm)
        twin.output.weight.copy_(hf.hf.lm_head.weight[:, perm])
        twin.output.bias.copy_(hf.hf.final_logits_bias[0])
    return twin.eval()


def _traces(hf, twin):
    """The Hugging Face model's reference trace of six copy examples and the twin's of the same
    token ids (the model's own ids: the twin's vocabulary is the Marian's)."""
    batch = next(iter(prepare_batches(hf, hf_examples(hf, 6), hf.vocab, hf.vocab, "reference")))
    tr = batch.trace
    ids = hf.ids.to_model
    return tr, twin.trace(ids[tr.src], tr.src_lengths, ids[tr.tgt_in], ids[tr.tgt_out])


def test_the_twins_compute_the_same_function(twins):
    hf, twin, _ = twins
    marian_positions = hf.hf.model.encoder.embed_positions.weight
    torch.testing.assert_close(
        marian_positions[:, PERM], twin.sinusoid[:64].double(), atol=1e-6, rtol=0
    )
    tr, ttr = _traces(hf, twin)
    real = tr.step_mask
    keep = ~hf.ids.banned  # attnstudy's columns of the model's outputs, <pad> and <bos> aside
    got = ttr.logits[..., hf.ids.columns][..., keep][real]
    want = tr.logits[..., keep][real]
    assert want.abs().max() > 1.0  # not a model whose outputs are all near 0
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(ttr.cross, tr.cross, atol=1e-6, rtol=0)


def test_alti_plus_contributions_are_equal_for_the_same_marian_built_twice(twins):
    hf, twin, unpermuted = twins
    tr, ttr = _traces(hf, twin)
    real = tr.step_mask
    want = alti_plus(hf, tr)
    got = alti_plus(twin, ttr)
    assert not torch.isnan(want[real]).any()  # every real step decomposed
    torch.testing.assert_close(got[real], want[real], atol=1e-6, rtol=0)
    t_x = tr.src.size(1)
    share = want[..., :t_x].sum(-1)[real]
    # source and prefix both contribute: a test of both halves of the rollout
    assert share.min() > 0.3 and share.max() < 0.8, share
    # the copy without the permutation is another model (Marian's sin and cos on the wrong
    # dimensions): its contributions differ, so equality above is not vacuous
    _, utr = _traces(hf, unpermuted)
    assert (alti_plus(unpermuted, utr)[real] - want[real]).abs().max() > 1e-2
