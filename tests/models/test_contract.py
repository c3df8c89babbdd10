"""The analysis contract (docs/design.md §3) for every score × flow × cell."""

import itertools

import pytest
import torch

from attnstudy.config import ATTENTIONS, ModelConfig
from attnstudy.models import build_model, eval_mode

SCORES = [a for a in ATTENTIONS if a != "none"]
FLOWS = ["bahdanau", "luong"]

SRC = torch.tensor([[4, 5, 6, 7, 8], [5, 6, 0, 0, 0], [7, 0, 0, 0, 0]])
SRC_LEN = torch.tensor([5, 2, 1])
TGT_IN = torch.tensor([[1, 4, 5, 6], [1, 5, 0, 0], [1, 4, 4, 0]])
TGT_OUT = torch.tensor([[4, 5, 6, 2], [5, 2, 0, 0], [4, 4, 2, 0]])


def tiny(attention, flow, cell="gru", layers=1, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(
        attention=attention,
        flow=flow,
        cell=cell,
        embedding_dim=5,
        encoder_hidden=4,
        decoder_hidden=8,
        attention_dim=6,
        heads=2,
        layers=layers,
        dropout=0.3,
    )
    return build_model(cfg, 11, 9).eval()


@pytest.mark.parametrize(
    "attention,flow,cell", list(itertools.product(SCORES, FLOWS, ["gru", "lstm"]))
)
def test_own_attention_reproduces_traced_logits(attention, flow, cell):
    model = tiny(attention, flow, cell, layers=2)
    tr = model.trace(SRC, SRC_LEN, TGT_IN, TGT_OUT)
    got = model.logits_given_attention(tr, tr.attention)
    assert (got - tr.logits)[tr.step_mask].abs().max() <= 1e-5
    # P replacements at once, tiny chunks: every copy reproduces the trace
    many = model.logits_given_attention(
        tr, tr.attention.unsqueeze(1).expand(-1, 3, -1, -1, -1), chunk_rows=2
    )
    for p in range(3):
        assert (many[:, p] - tr.logits)[tr.step_mask].abs().max() <= 1e-5
    # padding steps are not computed
    assert many[~tr.step_mask.unsqueeze(1).expand_as(many[..., 0])].abs().max() == 0


@pytest.mark.parametrize("attention,flow", list(itertools.product(ATTENTIONS, FLOWS)))
def test_teacher_forced_decode_equals_trace(attention, flow):
    model = tiny(attention, flow)
    tr = model.trace(SRC, SRC_LEN, TGT_IN, TGT_OUT)
    dec = model.decode(SRC, SRC_LEN, max_len=6, prefix=TGT_IN)
    assert (dec.logits - tr.logits)[tr.step_mask].abs().max() <= 1e-6


@pytest.mark.parametrize("attention,flow", list(itertools.product(SCORES, FLOWS)))
def test_padding_gets_exactly_zero_weight_and_rows_sum_to_one(attention, flow):
    tr = tiny(attention, flow).trace(SRC, SRC_LEN, TGT_IN, TGT_OUT)
    pad = tr.pad_mask[:, None, None, :].expand_as(tr.attention)
    assert torch.all(tr.attention[pad] == 0.0)
    assert torch.allclose(tr.attention.sum(-1), torch.ones(()), atol=1e-6)


@pytest.mark.parametrize("attention,flow", list(itertools.product(SCORES, FLOWS)))
def test_batch_size_and_padding_do_not_change_results(attention, flow):
    model = tiny(attention, flow)
    tr = model.trace(SRC, SRC_LEN, TGT_IN, TGT_OUT)
    for i in range(3):
        n, m = int(SRC_LEN[i]), int((TGT_OUT[i] != 0).sum())
        alone = model.trace(
            SRC[i : i + 1, :n], SRC_LEN[i : i + 1], TGT_IN[i : i + 1, :m], TGT_OUT[i : i + 1, :m]
        )
        assert torch.allclose(alone.logits[0], tr.logits[i, :m], atol=1e-6)
        assert torch.allclose(alone.attention[0], tr.attention[i, :, :m, :n], atol=1e-6)
        # extra padding columns change nothing either
        padded = torch.cat([SRC[i : i + 1], torch.zeros(1, 3, dtype=torch.long)], dim=1)
        more = model.trace(
            padded, SRC_LEN[i : i + 1], TGT_IN[i : i + 1, :m], TGT_OUT[i : i + 1, :m]
        )
        assert torch.allclose(more.logits[0], tr.logits[i, :m], atol=1e-6)


@pytest.mark.parametrize("flow", FLOWS)
def test_uniform_model_weights_are_exactly_uniform(flow):
    tr = tiny("uniform", flow).trace(SRC, SRC_LEN, TGT_IN, TGT_OUT)
    for i, n in enumerate(SRC_LEN.tolist()):
        rows = tr.attention[i, 0, tr.step_mask[i]]
        assert torch.all(rows[:, :n] == 1.0 / n)
        assert torch.all(rows[:, n:] == 0.0)


@pytest.mark.parametrize("attention,flow", list(itertools.product(SCORES, FLOWS)))
def test_gradients_flow_through_replacement_weights_and_embeddings(attention, flow):
    model = tiny(attention, flow)
    emb = model.encoder.embedding(SRC).detach().requires_grad_(True)
    tr = model.trace(SRC, SRC_LEN, TGT_IN, TGT_OUT, embedded=emb, detach_attention=True)
    assert not tr.attention.requires_grad
    (g,) = torch.autograd.grad(tr.logits[tr.step_mask].sum(), emb)
    assert g.abs().sum() > 0
    assert torch.all(g[tr.pad_mask] == 0)
    with torch.no_grad():
        tr = model.trace(SRC, SRC_LEN, TGT_IN, TGT_OUT)
    w = tr.attention.clone().requires_grad_(True)
    (gw,) = torch.autograd.grad(model.logits_given_attention(tr, w)[tr.step_mask].sum(), w)
    assert gw.abs().sum() > 0


def test_global_intervention_applies_at_every_step():
    model = tiny("additive", "bahdanau")
    seen = []

    def to_uniform(w, t):
        seen.append(t)
        valid = (w > 0).float()
        return valid / valid.sum(-1, keepdim=True)

    dec = model.decode(SRC, SRC_LEN, max_len=4, prefix=TGT_IN, intervene=to_uniform)
    assert seen == [0, 1, 2, 3]
    assert torch.allclose(dec.attention[2, 0, :, 0], torch.ones(4))
    assert torch.allclose(dec.attention[0, 0, 0], torch.full((5,), 0.2))


def test_eval_mode_restored_and_greedy_is_deterministic():
    model = tiny("general", "luong")
    model.train()
    a = model.greedy(SRC, SRC_LEN, 6)
    assert model.training
    assert a == model.greedy(SRC, SRC_LEN, 6)


def test_beam_search_with_beam_one_matches_greedy():
    for attention, flow in [("additive", "bahdanau"), ("general", "luong"), ("none", "bahdanau")]:
        model = tiny(attention, flow, seed=3)
        assert model.beam_search(SRC, SRC_LEN, 6, beam_size=1, length_penalty=0.0) == model.greedy(
            SRC, SRC_LEN, 6
        )


def test_empty_source_is_rejected():
    model = tiny("additive", "bahdanau")
    with pytest.raises(ValueError, match="at least one token"):
        model.trace(SRC, torch.tensor([5, 0, 1]), TGT_IN, TGT_OUT)


def test_logits_given_attention_rejects_wrong_shape_and_none_model():
    model = tiny("additive", "bahdanau")
    tr = model.trace(SRC, SRC_LEN, TGT_IN, TGT_OUT)
    with pytest.raises(ValueError, match="weights must be"):
        model.logits_given_attention(tr, tr.attention[:, :, :, :3])
    none = tiny("none", "bahdanau")
    with pytest.raises(ValueError, match="no attention"):
        none.logits_given_attention(none.trace(SRC, SRC_LEN, TGT_IN, TGT_OUT), tr.attention)


def test_eval_mode_context_restores_mode():
    model = tiny("general", "bahdanau")
    model.train()
    with eval_mode(model):
        assert not model.training
    assert model.training


@pytest.mark.parametrize(
    "attention,flow", [("additive", "bahdanau"), ("general", "luong"), ("none", "bahdanau")]
)
def test_beam_search_does_not_depend_on_batch_mates(attention, flow):
    """Each example's own step budget and stopping rule: beam search of a batch equals beam search
    of every example alone (it used the batch's longest budget, so short examples changed)."""
    from attnstudy.config import RunSpec
    from attnstudy.data.synthetic import symbols
    from attnstudy.data.types import Example
    from attnstudy.data.vocab import Vocab
    from attnstudy.models.training import translate

    names = symbols(6)
    vocab = Vocab.build([names])
    torch.manual_seed(5)
    cfg = ModelConfig(
        attention=attention,
        flow=flow,
        embedding_dim=5,
        encoder_hidden=4,
        decoder_hidden=8,
        attention_dim=6,
        dropout=0.0,
    )
    model = build_model(cfg, len(vocab), len(vocab)).eval()
    with torch.no_grad():  # sharpen: an untrained tiny model is nearly indifferent between tokens
        for p in model.parameters():
            p.mul_(3.0)
    g = torch.Generator().manual_seed(0)
    examples = [
        Example(
            f"b/{k}",
            tuple(names[i] for i in torch.randint(0, 6, (1 + k % 9,), generator=g)),
            ("a",),
        )
        for k in range(24)
    ]
    spec = RunSpec(
        experiment="b",
        seed=1,
        data={"task": "copy"},
        model=cfg,
        training={"max_decode_factor": 1.0},
    )
    together = translate(model, examples, vocab, vocab, spec, beam_size=4, batch_size=256)
    alone = [
        translate(model, [ex], vocab, vocab, spec, beam_size=4, batch_size=1)[0] for ex in examples
    ]
    assert together == alone
    assert (
        len({len(h) for h in alone}) > 2
    )  # hypotheses of several lengths: budgets and EOS both acted
