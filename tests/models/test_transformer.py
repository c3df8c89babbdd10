"""The Transformer family under the analysis contract: exact local intervention against a naive
re-run, causal masking, batch and padding invariance, decoding through the shared code paths."""

from __future__ import annotations

import pytest
import torch

from attnstudy.config import ConfigError, ModelConfig, TransformerConfig
from attnstudy.experiment import parse_experiment
from attnstudy.models import ALL, build_model
from attnstudy.models.references import transformer_logits_given_attention
from attnstudy.models.transformer import (
    Transformer,
    sinusoidal_positions,
)

V_SRC, V_TGT = 9, 11


def model_of(layer_norm="pre", attention="multihead", layers=3, heads=4, seed=0, **kw):
    torch.manual_seed(seed)
    m = Transformer(
        V_SRC,
        V_TGT,
        d_model=16,
        heads=heads,
        d_ff=24,
        layers=layers,
        dropout=0.0,
        layer_norm=layer_norm,
        attention=attention,
        **kw,
    )
    with torch.no_grad():  # an untrained model whose outputs depend on its attention
        for p in m.parameters():
            p.mul_(2.0)
    return m.eval()


def batch():
    g = torch.Generator().manual_seed(3)
    src = torch.randint(3, V_SRC, (3, 7), generator=g)
    lengths = torch.tensor([7, 5, 2])
    for i, n in enumerate(lengths.tolist()):
        src[i, n:] = 0
    tgt = torch.randint(3, V_TGT, (3, 5), generator=g)
    tgt[:, 0] = 1
    tgt[2, 3:] = 0  # a shorter prefix: padding steps
    return src, lengths, tgt


def random_rows(trace, p, seed=0):
    """P random replacement rows (B, P, H', T_y, T_x), zero at padding, rows summing to 1."""
    g = torch.Generator().manual_seed(seed)
    b, h, t_y, t_x = trace.attention.shape
    logits = torch.randn(b, p, h, t_y, t_x, generator=g) * 2
    logits = logits.masked_fill(trace.pad_mask[:, None, None, None, :], float("-inf"))
    return torch.softmax(logits, -1)


UNITS = [(0, ALL), (1, ALL), (2, ALL), (ALL, ALL), (1, 2)]


@pytest.mark.parametrize("layer_norm", ["pre", "post"])
@pytest.mark.parametrize("attention", ["multihead", "uniform"])
@pytest.mark.parametrize(("layer", "head"), UNITS)
def test_own_attention_reproduces_the_traced_logits(layer_norm, attention, layer, head):
    m = model_of(layer_norm, attention)
    src, lengths, tgt = batch()
    tr = m.trace(src, lengths, tgt).with_layer(layer).with_head(head)
    with torch.no_grad():
        got = m.logits_given_attention(tr, tr.attention, chunk_rows=4)
    real = tr.step_mask
    assert (got[real] - tr.logits[real]).abs().max() <= 1e-5
    assert (got[~real] == 0).all()


@pytest.mark.parametrize("layer_norm", ["pre", "post"])
@pytest.mark.parametrize(("layer", "head"), UNITS)
def test_local_intervention_equals_a_naive_rerun_of_the_whole_decoder(layer_norm, layer, head):
    m = model_of(layer_norm)
    src, lengths, tgt = batch()
    tr = m.trace(src, lengths, tgt).with_layer(layer).with_head(head)
    w = random_rows(tr, 2)
    with torch.no_grad():
        fast = m.logits_given_attention(tr, w, chunk_rows=5)
        slow = transformer_logits_given_attention(m, tr, w)
    real = tr.step_mask[:, None].expand(-1, 2, -1)
    # the output distributions (what every ablation compares) agree to 1e-5
    p_fast, p_slow = torch.softmax(fast[real], -1), torch.softmax(slow[real], -1)
    assert (p_fast - p_slow).abs().max() <= 1e-5
    assert torch.allclose(fast, slow, rtol=1e-5, atol=1e-5)
    # the replacement mattered: the outputs moved
    assert (fast[:, 0][tr.step_mask] - tr.logits[tr.step_mask]).abs().max() > 1e-2


@pytest.mark.parametrize("layer_norm", ["pre", "post"])
@pytest.mark.parametrize(("layer", "head"), [(0, ALL), (2, ALL), (1, 2)])
def test_the_folded_one_layer_form_equals_the_plain_form(layer_norm, layer, head):
    """W^O folded into the values and the residual stream added in the same product: the same
    logits as the contexts per head and W^O per row (``plain=True``), the form it replaced."""
    m = model_of(layer_norm)
    src, lengths, tgt = batch()
    tr = m.trace(src, lengths, tgt).with_layer(layer).with_head(head)
    w = random_rows(tr, 3, seed=4)
    with torch.no_grad():
        folded = m.logits_given_attention(tr, w, chunk_rows=7)
        plain = m.logits_given_attention(tr, w, plain=True)
    # float32 reassociation on logits of size ~10 (this model's weights are doubled)
    assert torch.allclose(folded, plain, rtol=1e-5, atol=1e-5) and plain.abs().max() > 0.05


def test_batch_size_and_padding_change_nothing():
    m = model_of()
    src, lengths, tgt = batch()
    tr = m.trace(src, lengths, tgt).with_layer(1)
    w = random_rows(tr, 3, seed=1)
    with torch.no_grad():
        together = m.logits_given_attention(tr, w)
        for i in range(3):
            n, steps = int(lengths[i]), int(tr.step_mask[i].sum())
            alone = m.trace(src[i : i + 1, :n], lengths[i : i + 1], tgt[i : i + 1, :steps])
            alone = alone.with_layer(1)
            got = m.logits_given_attention(alone, w[i : i + 1, :, :, :steps, :n])
            assert (got[0] - together[i, :, :steps]).abs().max() <= 1e-5
            assert (alone.logits[0] - tr.logits[i, :steps]).abs().max() <= 1e-5


def test_an_intervention_at_t_never_changes_earlier_positions():
    """Decoding teacher-forced with a replacement at step 2 only: steps 0–1 are bit-identical,
    step 2 changes."""
    m = model_of()
    src, lengths, tgt = batch()

    def at_two(rows, t):
        return torch.flip(rows, [-1]).contiguous() if t == 2 else rows

    with torch.no_grad():
        base = m.decode(src, lengths, 5, prefix=tgt, layer=0)
        hit = m.decode(src, lengths, 5, prefix=tgt, intervene=at_two, layer=0)
    assert torch.equal(base.logits[:, :2], hit.logits[:, :2])
    assert (base.logits[:, 2] - hit.logits[:, 2]).abs().max() > 1e-3


def test_a_window_of_steps_is_exact():
    """A trace cut to a window of steps (one long example's memory bound) keeps the keys and
    values of the whole prefix, so its steps' interventions are unchanged."""
    m = model_of()
    src, lengths, tgt = batch()
    tr = m.trace(src, lengths, tgt).with_layer(0)
    w = random_rows(tr, 2, seed=4)
    with torch.no_grad():
        whole = m.logits_given_attention(tr, w)
        part = tr.select(torch.tensor([0, 1]), 2, 4)
        got = m.logits_given_attention(part, w[:2, :, :, 2:4])
    assert part.offset == 2
    assert (got - whole[:2, :, 2:4]).abs().max() <= 1e-5


def test_teacher_forced_decoding_equals_the_trace_and_greedy_is_its_argmax():
    m = model_of()
    src, lengths, tgt = batch()
    with torch.no_grad():
        tr = m.trace(src, lengths, tgt)
        forced = m.decode(src, lengths, 5, prefix=tgt)
        free = m.decode(src, lengths, 6)
    real = tr.step_mask
    assert (forced.logits[real] - tr.logits[real]).abs().max() <= 1e-5
    hyps = m.greedy(src, lengths, 6)
    for i, h in enumerate(hyps):
        assert h == [t for t in free.tokens[i, : int(free.lengths[i])].tolist() if t != 2]
    # the decoded cross-attention rows are the analysed layer's rows (all layers: L·H)
    assert forced.attention.shape == (3, 3 * 4, 5, 7)


def test_beam_search_is_batch_invariant_and_beam_one_is_greedy():
    m = model_of(seed=2)
    src, lengths, _ = batch()
    together = m.beam_search(src, lengths, 6, beam_size=3)
    for i in range(3):
        n = int(lengths[i])
        assert m.beam_search(src[i : i + 1, :n], lengths[i : i + 1], 6, beam_size=3) == [
            together[i]
        ]
    assert m.beam_search(src, lengths, 6, beam_size=1, length_penalty=0) == m.greedy(
        src, lengths, 6
    )


def test_attention_rows_are_distributions_with_zero_at_padding_and_causal_self_attention():
    m = model_of()
    src, lengths, tgt = batch()
    with torch.no_grad():
        tr = m.trace(src, lengths, tgt)
    assert tr.cross_attention.shape == (3, 3, 4, 5, 7)
    assert torch.allclose(tr.cross_attention.sum(-1), torch.ones(3, 3, 4, 5))
    assert (tr.cross_attention.masked_select(tr.pad_mask[:, None, None, None, :]) == 0).all()
    assert (tr.encoder_attention.masked_select(tr.pad_mask[:, None, None, None, :]) == 0).all()
    above = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert (tr.self_attention[..., above] == 0).all()


def test_value_vectors_sum_to_the_cross_attention_output():
    """Kobayashi et al. (2020), eq. 4: Σ_h Σ_j α_thj f_h(x_j) + b^O is the sublayer's output."""
    m = model_of()
    src, lengths, tgt = batch()
    with torch.no_grad():
        tr = m.trace(src, lengths, tgt).with_layer(1)
        f = m.value_vectors(tr)  # (B, H, T_x, d)
        by_norm = torch.einsum("bhtx,bhxd->btd", tr.attention, f)
        layer = m.decoder_layers[1].cross_attn
        direct = layer.output(tr.attention, tr.memory.values[:, 1]) - layer.out_proj.bias
    assert (by_norm - direct).abs().max() <= 1e-5
    assert m.value_vectors(tr.with_head(3)).shape == (3, 1, 7, 16)


def test_gradients_flow_to_the_source_embeddings_and_detached_attention_changes_them():
    m = model_of()
    src, lengths, tgt = batch()
    grads = []
    for detach in (False, True):
        leaf = m.embed(src).detach().requires_grad_(True)
        tr = m.trace(src, lengths, tgt, embedded=leaf, detach_attention=detach)
        (g,) = torch.autograd.grad(tr.logits[:, 1, 3].sum(), leaf)
        grads.append(g)
    assert grads[0].abs().sum() > 0 and (grads[0] - grads[1]).abs().max() > 1e-6


def test_sinusoidal_positions_follow_the_paper():
    pe = sinusoidal_positions(50, 16)
    pos, i = 7, 3
    assert pe[pos, 2 * i] == pytest.approx(torch.sin(torch.tensor(pos / 10000 ** (2 * i / 16))))
    assert pe[pos, 2 * i + 1] == pytest.approx(torch.cos(torch.tensor(pos / 10000 ** (2 * i / 16))))


def test_none_has_no_cross_attention_and_uniform_rows_are_uniform():
    src, lengths, tgt = batch()
    none = model_of(attention="none")
    with torch.no_grad():
        tr = none.trace(src, lengths, tgt)
    assert tr.cross_attention is None and not none.has_attention
    assert all(layer.cross_attn is None for layer in none.decoder_layers)
    uni = model_of(attention="uniform")
    with torch.no_grad():
        att = uni.trace(src, lengths, tgt).cross_attention
    expect = (~batch_pad(lengths, 7)).float() / lengths[:, None]
    assert torch.allclose(att, expect[:, None, None, None, :].expand_as(att))


def batch_pad(lengths, t_x):
    return torch.arange(t_x)[None, :] >= lengths[:, None]


def test_learned_positions_refuse_a_sequence_past_max_positions():
    m = model_of(positions="learned", max_positions=6)
    src, lengths, tgt = batch()
    with pytest.raises(ValueError, match="longer than the model's max_positions = 6"):
        m.trace(src, lengths, tgt)


def test_tied_embeddings_share_one_matrix():
    m = model_of(tie_embeddings=True)
    assert m.output.weight is m.tgt_embedding.weight


# --- configuration ------------------------------------------------------------------------------
def _exp(model_tables, base_model=None):
    return {
        "experiment": {"name": "x"},
        "data": {"task": "copy", "n_train": 10, "n_dev": 5, "n_test": 5},
        "model": base_model or {},
        "models": [{"model": t} for t in model_tables],
    }


def test_a_transformer_refuses_rnn_only_keys_in_one_line():
    with pytest.raises(ConfigError) as err:
        parse_experiment(_exp([{"architecture": "transformer", "cell": "lstm"}]))
    msg = str(err.value)
    assert "'cell' is a key of the rnn architecture" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="'d_model' is a key of the transformer architecture"):
        parse_experiment(_exp([{"d_model": 64}]))
    with pytest.raises(ConfigError, match="d_model divisible by heads"):
        parse_experiment(_exp([{"architecture": "transformer", "d_model": 30, "heads": 4}]))
    with pytest.raises(ConfigError, match="architecture: unknown value 'lstm'"):
        parse_experiment(_exp([{"architecture": "lstm"}]))


def test_run_names_tags_and_the_base_model_section_of_another_architecture():
    cfg = parse_experiment(
        _exp(
            [
                {"attention": "additive"},
                {"architecture": "transformer", "layers": 2, "heads": 4},
                {"architecture": "transformer", "attention": "uniform"},
            ],
            base_model={"cell": "gru", "encoder_hidden": 8},
        )
    )
    names = [s.name for s in cfg.runs()]
    assert names == [
        "copy/additive-bahdanau/seed1",
        "copy/transformer-L2H4/seed1",
        "copy/transformer-L2H4-uniform/seed1",
    ]
    rnn, tf, _ = cfg.runs()
    assert rnn.model.encoder_hidden == 8  # the base [model] applies to its own architecture
    assert isinstance(tf.model, TransformerConfig) and tf.model.d_model == 128
    params = tf.flat_params()[0]
    assert params["model.architecture"] == "transformer" and params["model.layers"] == "2"
    assert rnn.flat_params()[0]["model.architecture"] == "rnn"


def test_named_variants_label_runs_and_duplicates_are_refused():
    raw = _exp([{"attention": "additive"}, {"attention": "additive", "encoder_hidden": 16}])
    with pytest.raises(ConfigError, match=r"models\[1\] and models\[0\] are both copy/additive"):
        parse_experiment(raw)
    raw["models"][1]["name"] = "wide"
    assert [s.name for s in parse_experiment(raw).runs()] == [
        "copy/additive-bahdanau/seed1",
        "copy/wide/seed1",
    ]
    raw["models"][0]["name"] = "wide"
    with pytest.raises(ConfigError, match="both copy/wide"):
        parse_experiment(raw)


def test_the_rnn_model_key_is_unchanged_by_the_architecture_field():
    """Models stored before the architecture field keep their key (it is key-neutral at rnn)."""
    from attnstudy.config import RunSpec, TrainingConfig, data_config

    spec = RunSpec(
        experiment="x",
        seed=1,
        data=data_config(),
        model=ModelConfig(attention="multihead"),
        training=TrainingConfig(),
    )
    fields = spec.used_fields()["model"]
    assert fields["architecture"] == "rnn" and fields["attention_key_dim"] is None
    # the key of this spec computed without the new fields (as the code before them did)
    import hashlib
    import json

    from attnstudy.config import SCHEMA_VERSION

    payload = {"schema": SCHEMA_VERSION, "seed": 1, "data_digest": "d"}
    for section, values in fields_without(spec).items():
        payload[section] = values
    old = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    assert spec.model_key("d") == old


def fields_without(spec):
    new = {
        "architecture",
        "attention_key_dim",
        "attention_value_dim",
        "label_smoothing",
        "device",  # not part of any key
        "num_gpus",  # not part of any key (Ray's request per task)
        "memory_gib",  # not part of any key (Ray's request per task)
        "amp",  # key-neutral while off
        "warmup_steps",  # key-neutral at its default (used by scheduling = "inverse_sqrt")
        "average_last",  # key-neutral at 1 (no checkpoint averaging)
    }
    skip = {"data.train_path", "data.dev_path", "data.test_path", "training.threads"}
    out = {}
    for section, values in spec.used_fields().items():
        out[section] = {
            k: v
            for k, v in values.items()
            if k not in new
            and f"{section}.{k}" not in skip
            and not (section == "data" and k == "alignment_base" and v == 0)
        }
    return out


def test_build_model_makes_a_transformer_from_its_config():
    cfg = TransformerConfig(architecture="transformer", layers=1, heads=2, d_model=8, d_ff=8)
    m = build_model(cfg, 5, 6)
    assert isinstance(m, Transformer) and m.n_layers == 1 and m.heads == 2


@pytest.mark.parametrize("layer_norm", ["pre", "post"])
def test_feed_forward_rows_is_the_feed_forward_sublayer(layer_norm):
    """The in-place row form the folded kernel uses equals the plain sublayer (≤ 1e-6) and is the
    plain sublayer itself when gradients are recorded."""
    layer = model_of(layer_norm).eval().decoder_layers[1]
    x = torch.randn(50, layer.ff.net[0].in_features, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(
            layer.feed_forward_rows(x), layer.feed_forward(x), atol=1e-6, rtol=1e-6
        )
    x.requires_grad_(True)
    out = layer.feed_forward_rows(x)
    assert out.requires_grad and torch.equal(out, layer.feed_forward(x))


def _rows_by_scatter(m, tr, b_idx, t_idx, weights):
    """The rows' logits through ``logits_given_attention(plain=True)``: each row's K candidates
    scattered into a (B, K, H, T_y, T_x) replacement, every other row left at the traced one."""
    n, k = weights.shape[:2]
    full = tr.attention.unsqueeze(1).expand(-1, k, -1, -1, -1).clone()
    full = full.permute(0, 3, 1, 2, 4).index_put((b_idx, t_idx), weights).permute(0, 2, 3, 1, 4)
    out = m.logits_given_attention(tr, full, plain=True)  # (B, K, T_y, V)
    return out.permute(0, 2, 1, 3)[b_idx, t_idx]


@pytest.mark.parametrize("layer_norm", ["pre", "post"])
@pytest.mark.parametrize("layer", [0, 2])
@pytest.mark.parametrize("window", [False, True])
def test_row_form_equals_the_plain_scatter_form(layer_norm, layer, window):
    """``rows_given_attention`` (the adversarial search's row form: W^O folded into each row's
    values, the layers above through the row's own self-attention) against the plain form of
    ``logits_given_attention`` at the same rows, logits and gradients w.r.t. the rows; a window
    of steps (offset 1) checks the positions of the layers above."""
    m = model_of(layer_norm)
    src, lengths, tgt = batch()
    tr = m.trace(src, lengths, tgt).with_layer(layer)
    if window:
        tr = tr.select(torch.arange(3), 1, 4)
    b_idx, t_idx = tr.step_mask.nonzero(as_tuple=True)
    weights = random_rows(tr, 3, seed=5).permute(0, 3, 1, 2, 4)[b_idx, t_idx]  # (N, K, H, T_x)
    weights.requires_grad_(True)
    fast = m.rows_given_attention(tr, b_idx, t_idx)(weights)
    (grad_fast,) = torch.autograd.grad(fast.square().sum(), weights)
    slow = _rows_by_scatter(m, tr, b_idx, t_idx, weights)
    (grad_slow,) = torch.autograd.grad(slow.square().sum(), weights)
    assert fast.shape == (len(b_idx), 3, V_TGT)
    # float32 reassociation on logits of size ~10, as the folded form's test
    assert torch.allclose(fast, slow, rtol=1e-5, atol=1e-5)
    assert (grad_fast - grad_slow).abs().max() <= 1e-4 * grad_slow.abs().max()
    # the replacement mattered: the rows' outputs moved from the traced ones
    assert (fast[:, 0] - tr.logits[b_idx, t_idx]).abs().max() > 1e-2


def test_row_form_applies_to_one_layer_and_all_heads_only():
    m = model_of()
    src, lengths, tgt = batch()
    tr = m.trace(src, lengths, tgt)
    b_idx, t_idx = tr.step_mask.nonzero(as_tuple=True)
    assert m.rows_given_attention(tr, b_idx, t_idx) is not None
    assert m.rows_given_attention(tr.with_head(1), b_idx, t_idx) is None
    assert m.rows_given_attention(tr.with_layer(ALL), b_idx, t_idx) is None
    with pytest.raises(ValueError, match="'none' model"):
        model_of(attention="none").rows_given_attention(tr, b_idx, t_idx)
