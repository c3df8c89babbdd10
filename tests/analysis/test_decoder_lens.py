"""DecoderLens (Langedijk et al. 2024): known answers. At the last encoder layer the lens is the
model itself (its greedy output and task metrics exactly, its teacher-forced logits); at layer ℓ
it is the model with its encoder cut after layer ℓ (the pre-LN Transformer's final encoder layer
norm kept, as the paper applies it), for attnstudy's Transformer (pre- and post-LN) and a Hugging
Face Marian model; the same Marian built twice (Hugging Face, and attnstudy's Transformer with
copied weights) gives the same lens at every layer; the models it does not read are refused in
one line. Batch size and batch-mates changing nothing is the contract tests' check
(tests/analysis/test_ablation_contract.py, every family)."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from analysis_testkit import VOCAB, hf_examples, make_examples, one_batch, sharpen, tiny_model
from attnstudy.analysis.ablations.decoder_lens import (
    DecoderLensUnsupportedError,
    encoder_layer_states,
    lens_decode,
)
from attnstudy.analysis.batch import prepare_batches
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.suite import run_suite

from attnstudy.config import TransformerConfig
from attnstudy.models import build_model
from attnstudy.scoring.metrics import evaluate

HAS_HF = importlib.util.find_spec("transformers") is not None
CFG = AblationConfig(ablations=["decoder_lens"], bootstrap_resamples=20)


def _transformer(layer_norm: str, layers: int = 2):
    torch.manual_seed(0)
    cfg = TransformerConfig(
        architecture="transformer", layers=layers, heads=2, d_model=8, d_ff=16, dropout=0.0,
        layer_norm=layer_norm,
    )  # fmt: skip
    return sharpen(build_model(cfg, len(VOCAB), len(VOCAB)).eval(), 3.0)


def _greedy_metrics(model, examples, vocab):
    """The model's own greedy output (the battery's per-example budget) and its task metrics."""
    batch = next(prepare_batches(model, examples, vocab, vocab, "greedy", batch_size=99))
    hyps = [vocab.decode(row.tolist()) for row in batch.trace.tgt_out]
    return hyps, evaluate(hyps, examples)


@pytest.mark.parametrize("layer_norm", ["pre", "post"])
def test_the_last_layer_is_the_model_itself(layer_norm):
    model = _transformer(layer_norm)
    examples = make_examples(7)
    hyps, want = _greedy_metrics(model, examples, VOCAB)
    res = run_suite(model, examples, VOCAB, VOCAB, CFG, progress=False)
    rows = res.examples.set_index("example_id").loc[[ex.id for ex in examples]]
    # exact match and token error rate of the last layer's lens are the model's, exactly
    assert rows["decoder_lens_last_exact"].mean() == want["exact_match"]
    assert (
        rows["decoder_lens_last_edits"].sum() / rows["decoder_lens_last_ref_len"].sum()
        == (want["per"])
    )
    assert res.summary["ablation/decoder_lens/token_error_rate_l2"] == want["per"]
    assert want["per"] > 0  # an untrained model: not a vacuous equality of two zeros
    # the greedy outputs themselves, token for token
    batch = one_batch(model, examples)
    states = encoder_layer_states(model, batch.trace.src, batch.trace.src_lengths)
    tr = batch.trace
    dec = lens_decode(model, states[-1], tr.src, tr.src_lengths, max_len=64)
    own = model.decode(tr.src, tr.src_lengths, 64)
    assert torch.equal(dec.tokens, own.tokens) and torch.equal(dec.logits, own.logits)
    # teacher-forced on the reference: the trace's logits and attention
    forced = lens_decode(model, states[-1], tr.src, tr.src_lengths, max_len=0, prefix=tr.tgt_in)
    real = tr.step_mask
    # float32 noise of two code paths: logits of magnitude ~3, up to 2.1e-5 apart on an
    # AVX-512/AMX CPU (1e-5 held on AVX2 machines)
    torch.testing.assert_close(forced.logits[real], tr.logits[real], atol=1e-4, rtol=1e-5)
    got_att = forced.attention  # the last decoder layer's rows, every head
    torch.testing.assert_close(
        got_att.transpose(1, 2)[real], tr.attention.transpose(1, 2)[real], atol=1e-5, rtol=0
    )
    assert len(hyps) == len(examples)


@pytest.mark.parametrize("layer_norm", ["pre", "post"])
def test_layer_one_is_the_model_with_its_encoder_cut_after_layer_one(layer_norm):
    """Transformer.encode runs its encoder layers, then (pre-LN) the final layer norm: cutting
    the layer list after layer 1 is the paper's lens at ℓ = 1, final norm included."""
    model = _transformer(layer_norm)
    cut = copy.deepcopy(model)
    cut.encoder_layers = cut.encoder_layers[:1]
    tr = one_batch(model, make_examples(7)).trace
    states = encoder_layer_states(model, tr.src, tr.src_lengths)
    got = lens_decode(model, states[0], tr.src, tr.src_lengths, max_len=0, prefix=tr.tgt_in)
    want = cut.decode(tr.src, tr.src_lengths, 0, prefix=tr.tgt_in)
    assert torch.equal(got.logits, want.logits)
    # and it is another function than the whole model's (the equality is not vacuous)
    whole = model.decode(tr.src, tr.src_lengths, 0, prefix=tr.tgt_in)
    assert (got.logits - whole.logits).abs().max() > 1e-2


@pytest.mark.skipif(not HAS_HF, reason="transformers is not installed")
def test_hugging_face_marian_lens_is_the_model_cut_and_the_model_itself(hf_model):
    examples = hf_examples(hf_model, 6)
    hyps, want = _greedy_metrics(hf_model, examples, hf_model.vocab)
    res = run_suite(hf_model, examples, hf_model.vocab, hf_model.vocab, CFG, progress=False)
    rows = res.examples.set_index("example_id").loc[[ex.id for ex in examples]]
    assert rows["decoder_lens_last_exact"].mean() == want["exact_match"]
    assert (
        rows["decoder_lens_last_edits"].sum() / rows["decoder_lens_last_ref_len"].sum()
        == (want["per"])
    )
    assert 0 < want["per"] < 2  # a real error rate, not two zeros
    # layer 1: the Marian with its encoder cut after its first layer (no final encoder norm)
    vocab = hf_model.vocab
    tr = next(prepare_batches(hf_model, examples, vocab, vocab, "reference", batch_size=9)).trace
    states = encoder_layer_states(hf_model, tr.src, tr.src_lengths)
    encoder = hf_model.hf.model.encoder
    full = encoder.layers
    with torch.no_grad():
        got = lens_decode(hf_model, states[0], tr.src, tr.src_lengths, max_len=0, prefix=tr.tgt_in)
        whole = hf_model.decode(tr.src, tr.src_lengths, 0, prefix=tr.tgt_in)
        try:  # the session's model, cut after its first encoder layer for this call only
            encoder.layers = full[:1]
            want_cut = hf_model.decode(tr.src, tr.src_lengths, 0, prefix=tr.tgt_in)
        finally:
            encoder.layers = full
    torch.testing.assert_close(got.logits, want_cut.logits, atol=1e-5, rtol=0)
    assert (got.logits - whole.logits).abs().max() > 1e-2
    assert len(hyps) == len(examples)


def test_models_it_does_not_read_are_refused_in_one_line():
    # a recurrent model has no encoder self-attention: skipped with the reason
    rnn = tiny_model("additive", "bahdanau")
    res = run_suite(rnn, make_examples(3), VOCAB, VOCAB, CFG, progress=False)
    assert "self_attention" in res.skipped["decoder_lens"]
    # a one-layer encoder: nothing to look through
    one = _transformer("pre", layers=1)
    with pytest.raises(DecoderLensUnsupportedError, match="at least 2 encoder layers") as err:
        run_suite(one, make_examples(3), VOCAB, VOCAB, CFG, progress=False)
    assert "\n" not in str(err.value)
    with pytest.raises(DecoderLensUnsupportedError, match="not one"):
        encoder_layer_states(rnn, torch.ones(1, 2, dtype=torch.long), torch.tensor([2]))


@pytest.mark.skipif(not HAS_HF, reason="transformers is not installed")
def test_the_same_marian_built_twice_gives_the_same_lens_at_every_layer(twins):
    hf, twin, _ = twins
    tr, ttr = _traces(hf, twin)
    ours = encoder_layer_states(twin, ttr.src, ttr.src_lengths)
    theirs = encoder_layer_states(hf, tr.src, tr.src_lengths)
    real = tr.step_mask
    keep = ~hf.ids.banned
    differ = []
    with torch.no_grad():
        for a, b in zip(ours, theirs, strict=True):
            got = lens_decode(twin, a, ttr.src, ttr.src_lengths, max_len=0, prefix=ttr.tgt_in)
            want = lens_decode(hf, b, tr.src, tr.src_lengths, max_len=0, prefix=tr.tgt_in)
            g = got.logits[..., hf.ids.columns][..., keep][real]
            w = want.logits[..., keep][real]
            torch.testing.assert_close(g, w, atol=1e-6, rtol=0)
            torch.testing.assert_close(
                got.attention.transpose(1, 2)[real],
                want.attention.transpose(1, 2)[real],
                atol=1e-6,
                rtol=0,
            )
            differ.append(w)
    assert (differ[0] - differ[-1]).abs().max() > 1e-2  # the layers' lenses differ


if HAS_HF:  # the twins of the ALTI+ test (issue 66): a Marian and attnstudy's copy of it
    from test_alti_plus_marian_twin import _traces, twins  # noqa: F401


def test_the_figure_draws_each_layers_summary_numbers():
    from attnstudy.analysis.figures.decoder_lens import layers_known

    model = _transformer("post")
    res = run_suite(model, make_examples(7), VOCAB, VOCAB, CFG, progress=False)
    fig = layers_known(res.examples.assign(variant="m"), {"m": (0.1, 0.2, 0.7)})
    axes = fig.axes[:3]
    for ax, stat in zip(axes, ("exact_match", "token_error_rate", "aer")):
        line = ax.lines[0]
        assert list(line.get_xdata()) == [1.0, 2.0]
        want = [res.summary[f"ablation/decoder_lens/{stat}_l{ell}"] for ell in (1, 2)]
        assert line.get_ydata() == pytest.approx(want, abs=1e-12), stat
    assert 0 < res.summary["ablation/decoder_lens/aer_l1"] < 1
    # no rows: a note, not an empty axis
    empty = layers_known(None)
    assert "no DecoderLens rows" in empty.axes[0].texts[0].get_text()


def test_its_cost_is_one_encoder_pass_and_two_decodings_per_layer(monkeypatch):
    """docs/attribution.md, "Cost per decoder step": per example, L teacher-forced decodings of
    the reference (T steps each) and L greedy decodings (each its own output's length), counted
    as decoder steps (``advance`` rows), and one pass of the encoder's layers."""
    model = _transformer("pre")
    examples = make_examples(6)[-2:-1]  # one example of 5 tokens: T = 6 reference steps
    batch = one_batch(model, examples)
    greedy_steps = []
    states = encoder_layer_states(model, batch.trace.src, batch.trace.src_lengths)
    for state in states:
        out = lens_decode(model, state, batch.trace.src, batch.trace.src_lengths, max_len=12)
        greedy_steps.append(out.logits.size(1))
    steps, encoder_calls = [0], [0]
    advance = model.advance

    def counted(y, *args, **kwargs):
        steps[0] += y.size(0)
        return advance(y, *args, **kwargs)

    for layer in model.encoder_layers:
        layer.register_forward_hook(lambda *_: encoder_calls.__setitem__(0, encoder_calls[0] + 1))
    monkeypatch.setattr(model, "advance", counted)
    from attnstudy.analysis.ablations.decoder_lens import run

    run(model, batch, None, None)
    t = int(batch.trace.step_mask.sum())
    assert t == 6
    assert steps[0] == model.layers * t + sum(greedy_steps)
    assert encoder_calls[0] == model.layers  # one pass through the L encoder layers


@pytest.mark.skipif(not HAS_HF, reason="transformers is not installed")
@pytest.mark.parametrize("family", ["bart", "t5"])
def test_a_tiny_bart_is_read_and_t5_refused_in_one_line(family, tmp_path):
    """BART (embedding layer norm, post-LN layers, no final encoder norm): the last layer's lens
    is the model's own greedy output exactly; T5 (pre-LN with RMSNorm) is refused."""
    from attnstudy.models.hf import load_pretrained
    from attnstudy.models.hf_tiny import build_tiny

    model = load_pretrained(build_tiny(tmp_path / family, family=family, steps=0)).eval()
    vocab = model.vocab
    tr = next(prepare_batches(model, hf_examples(model, 4), vocab, vocab, "reference")).trace
    if family == "t5":
        with pytest.raises(DecoderLensUnsupportedError, match="Marian and BART.*'t5'") as err:
            encoder_layer_states(model, tr.src, tr.src_lengths)
        assert "\n" not in str(err.value)
        return
    with torch.no_grad():
        states = encoder_layer_states(model, tr.src, tr.src_lengths)
        assert len(states) == model.encoder_layers == 2
        got = lens_decode(model, states[-1], tr.src, tr.src_lengths, max_len=12)
        own = model.decode(tr.src, tr.src_lengths, 12)
        first = lens_decode(model, states[0], tr.src, tr.src_lengths, max_len=12)
    assert torch.equal(got.tokens, own.tokens) and torch.equal(got.logits, own.logits)
    # untrained (init std 0.02): the cross-attention moves the logits little, but layer 1's
    # lens is another function (5e-5 measured)
    assert (first.logits - own.logits).abs().max() > 1e-6
