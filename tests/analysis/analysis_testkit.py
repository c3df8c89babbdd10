"""Helpers shared by the analysis tests: tiny models (dims 3–8), fixed seeds, hand-made data.

A uniquely named module (not ``conftest``) so tests can import it unambiguously.
"""

from __future__ import annotations

import torch
from attnstudy.analysis.batch import AblationContext, PreparedBatch, prepare_batches
from attnstudy.analysis.catalogue import AblationConfig, get_ablation, list_ablations
from torch import nn

from attnstudy.config import ModelConfig, TransformerConfig
from attnstudy.data.synthetic import symbols, synthetic_example
from attnstudy.data.types import Example
from attnstudy.data.vocab import Vocab
from attnstudy.models import RecurrentTrace, build_model

NAMES = symbols(5)
VOCAB = Vocab.build([NAMES])

# the suite fixtures (recurrent models) run every catalogue ablation of attention but the one that
# optimises (tested in its own module) and those that need what a recurrent model lacks; the
# importance measures that need no attention (importance, the attribution methods: gradients or
# a trace per source token) are tested in their own modules and by the contract tests. A newly
# registered ablation joins them with no edit here
FAST_ABLATIONS = [
    n
    for n in list_ablations()
    if n != "adversarial"
    and "attention" in get_ablation(n).requires
    and "self_attention" not in get_ablation(n).requires
]


def call(name: str, model, batch: PreparedBatch, cfg: AblationConfig | None = None):
    """Run one catalogue ablation on a batch as the suite does: its own parameters from ``cfg``
    (defaults when None) and the run context (seed, chunk size)."""
    cfg = cfg or AblationConfig()
    return get_ablation(name).function()(
        model, batch, cfg.params_for(name), AblationContext.of(cfg)
    )


def make_examples(n: int = 9, seed: int = 0) -> list[Example]:
    """Copy-task examples, source lengths 1…6 (length 1 exercises the skip path), the last one
    without gold alignment."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n):
        ids = torch.randint(0, len(NAMES), (1 + k % 6,), generator=g).tolist()
        ex = synthetic_example("copy", ids, NAMES, f"t/{k}")
        if k == n - 1:
            ex = Example(ex.id, ex.src, ex.tgt, None)
        out.append(ex)
    return out


def hf_examples(model, n: int = 7, seed: int = 0) -> list[Example]:
    """:func:`make_examples` for a pretrained model (:mod:`attnstudy.models.hf`): copy-task
    sentences of 1…6 words of :data:`attnstudy.models.hf_tiny.LEXICON` (source = target, gold
    links i–i), the last one without gold alignment, as the model's tokenizer sees them
    (:func:`attnstudy.models.hf.subword_examples`: its own tokens, the source's end-of-sequence
    token, word maps where there are links; so no source is a single token)."""
    import random

    from attnstudy.data.alignment import Alignment
    from attnstudy.models.hf import subword_examples
    from attnstudy.models.hf_tiny import LEXICON

    rng = random.Random(seed)
    data = []
    for k in range(n):
        words = tuple(rng.choice(LEXICON) for _ in range(1 + k % 6))
        gold = Alignment.from_links({(i, i) for i in range(len(words))}) if k < n - 1 else None
        data.append(Example(f"hf/{k}", words, words, gold))
    return subword_examples(model, data)


def tiny_model(
    attention: str = "additive",
    flow: str = "bahdanau",
    seed: int = 0,
    dropout: float = 0.0,
    heads: int = 2,
):
    """A tiny untrained model in eval mode: the recurrent family with ``flow`` "bahdanau" or
    "luong", or a two-layer Transformer with ``flow="transformer"`` (``attention`` "multihead",
    "uniform" or "none")."""
    torch.manual_seed(seed)
    if flow == "transformer":
        cfg = TransformerConfig(
            architecture="transformer",
            layers=2,
            heads=heads,
            d_model=8,
            d_ff=16,
            dropout=dropout,
            attention=attention,
        )
        return build_model(cfg, len(VOCAB), len(VOCAB)).eval()
    cfg = ModelConfig(
        embedding_dim=4,
        encoder_hidden=3,
        decoder_hidden=5,
        attention_dim=4,
        heads=heads,
        dropout=dropout,
        attention=attention,
        flow=flow,
    )
    model = build_model(cfg, len(VOCAB), len(VOCAB))
    model.eval()
    return model


def sharpen(model, scale: float = 3.0):
    """Scale every parameter so an untrained model's outputs depend on its attention
    (at init, tiny models are nearly insensitive: uniform-attention TVD ~4e-4)."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model


def one_batch(model, examples, prefix: str = "reference") -> PreparedBatch:
    return next(prepare_batches(model, examples, VOCAB, VOCAB, prefix, batch_size=len(examples)))


class LinearReadout(nn.Module):
    """A hand-made 'model' whose logits are ``scale · (α_t head-mean) @ M``.

    Duck-types the parts of :class:`Seq2Seq` the local ablations use, so erase-until-flip can be
    checked against values computed by hand.
    """

    def __init__(self, readout: torch.Tensor, scale: float = 10.0, heads: int = 1):
        super().__init__()
        self.register_buffer("readout", readout)  # (T_x, V)
        self.scale = scale
        self.attention = type("Att", (), {"heads": heads})()

    has_attention = True

    def logits_given_attention(self, trace, weights, chunk_rows=4096, steps=None):
        single = weights.dim() == 4
        w = weights.unsqueeze(1) if single else weights
        logits = self.scale * w.mean(2) @ self.readout  # (B, P, T_y, V)
        mask = trace.step_mask if steps is None else steps & trace.step_mask
        logits = logits * mask[:, None, :, None]
        return logits[:, 0] if single else logits


def hand_batch(
    attention: torch.Tensor,
    lengths: list[int],
    examples: list[Example] | None = None,
    prefix: str = "greedy",
) -> PreparedBatch:
    """A PreparedBatch around a hand-made trace: attention (B, H, T_y, T_x), every step real."""
    b, h, t_y, t_x = attention.shape
    lengths_t = torch.tensor(lengths)
    pad_mask = torch.arange(t_x)[None, :] >= lengths_t[:, None]
    tgt = torch.full((b, t_y), 4, dtype=torch.long)
    tgt[:, -1] = 2  # EOS at the last step
    if examples is None:
        examples = [
            Example(f"h/{i}", tuple("a" * n), tuple("a" * (t_y - 1))) for i, n in enumerate(lengths)
        ]
    trace = RecurrentTrace(
        src=torch.full((b, t_x), 4),
        src_lengths=lengths_t,
        pad_mask=pad_mask,
        tgt_in=tgt,
        tgt_out=tgt,
        step_mask=torch.ones(b, t_y, dtype=torch.bool),
        logits=torch.zeros(b, t_y, len(VOCAB)),
        cross=attention.unsqueeze(1),
        prefix=torch.zeros(b, t_y, 1),
        memory=None,
        embedded=torch.zeros(b, t_x, 1),
    )
    return PreparedBatch(examples, trace, prefix, VOCAB, VOCAB)


__all__ = [
    "NAMES",
    "VOCAB",
    "LinearReadout",
    "FAST_ABLATIONS",
    "call",
    "hand_batch",
    "hf_examples",
    "make_examples",
    "one_batch",
    "sharpen",
    "tiny_model",
]


def target_prob_drop(probs, reference, target):
    """A user's step score for the registry tests: p_ref(ŷ_t) − p(ŷ_t), the emitted token's
    probability lost by the modification (probs, reference: (..., V); target: long (...))."""
    idx = target.broadcast_to(probs.shape[:-1]).unsqueeze(-1)
    return (reference.broadcast_to(probs.shape).gather(-1, idx) - probs.gather(-1, idx)).squeeze(-1)
