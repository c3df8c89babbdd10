"""A model that is not attnstudy's: written only here, against the contract of
:mod:`attnstudy.analysis.contract` (what docs/own-model.md describes), to show that the ablations need
nothing else.

``BagOfEmbeddingsAttention``: the query of step t is the embedding of the previous target token, the
keys and values are the source embeddings; α_t = softmax(q_t · k_j), c_t = Σ_j α_tj v_j and the
logits are W [c_t; q_t]. Each step depends only on its own previous token and the source, so its
"prefix state" is just q_t.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from attnstudy.data.synthetic import symbols, synthetic_example
from attnstudy.data.vocab import BOS_ID, EOS_ID, PAD_ID, Vocab


@dataclass
class OwnTrace:
    """The :class:`~attnstudy.analysis.contract.AttentionTrace` of the model below."""

    src: Tensor
    src_lengths: Tensor
    pad_mask: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    step_mask: Tensor
    logits: Tensor
    attention: Tensor | None  # (B, 1, T_y, T_x)
    queries: Tensor  # (B, T_y, d)
    values: Tensor  # (B, T_x, d)
    embedded: Tensor
    layer: int = 0

    @property
    def cross_attention(self) -> Tensor:
        return self.attention.unsqueeze(1)

    def with_layer(self, layer: int) -> OwnTrace:
        if layer not in (0, -1):
            raise ValueError("one layer")
        return self

    def select(self, rows: Tensor, start: int = 0, stop: int | None = None) -> OwnTrace:
        t = slice(start, stop)
        pick = lambda x: x.index_select(0, rows)  # noqa: E731
        return replace(
            self,
            src=pick(self.src),
            src_lengths=pick(self.src_lengths),
            pad_mask=pick(self.pad_mask),
            tgt_in=pick(self.tgt_in)[:, t],
            tgt_out=pick(self.tgt_out)[:, t],
            step_mask=pick(self.step_mask)[:, t],
            logits=pick(self.logits)[:, t],
            attention=pick(self.attention)[:, :, t],
            queries=pick(self.queries)[:, t],
            values=pick(self.values),
            embedded=pick(self.embedded),
        )


@dataclass
class OwnDecoded:
    tokens: Tensor
    lengths: Tensor


class BagOfEmbeddingsAttention(nn.Module):
    has_attention = True

    def __init__(self, vocab_size: int = 9, dim: int = 6, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.src_emb = nn.Embedding(vocab_size, dim)
        self.tgt_emb = nn.Embedding(vocab_size, dim)
        self.out = nn.Linear(2 * dim, vocab_size)
        with torch.no_grad():
            for p in self.parameters():
                p.mul_(3.0)
        self.eval()

    # --- InputGradients -------------------------------------------------------------------
    def embed(self, src: Tensor) -> Tensor:
        return self.src_emb(src)

    def trace(
        self, src, src_lengths, tgt_in, tgt_out=None, embedded=None, detach_attention=False
    ) -> OwnTrace:
        emb = self.embed(src) if embedded is None else embedded
        pad = torch.arange(src.size(1))[None, :] >= src_lengths[:, None]
        q = self.tgt_emb(tgt_in)  # (B, T_y, d)
        att = torch.softmax(
            (q @ emb.transpose(1, 2)).masked_fill(pad[:, None, :], float("-inf")), -1
        )
        used = att.detach() if detach_attention else att
        logits = self.out(torch.cat([used @ emb, q], -1))
        tgt_out = (
            tgt_out
            if tgt_out is not None
            else torch.cat([tgt_in[:, 1:], torch.zeros_like(tgt_in[:, :1])], 1)
        )
        return OwnTrace(
            src,
            src_lengths,
            pad,
            tgt_in,
            tgt_out,
            tgt_out != PAD_ID,
            logits,
            att.unsqueeze(1),
            q,
            emb,
            emb,
        )

    # --- LocallyIntervenable --------------------------------------------------------------
    def logits_given_attention(
        self, trace: OwnTrace, weights: Tensor, chunk_rows: int = 4096, steps=None
    ) -> Tensor:
        single = weights.dim() == 4
        w = weights.unsqueeze(1) if single else weights  # (B, P, 1, T_y, T_x)
        ctx = w[:, :, 0] @ trace.values.unsqueeze(1)  # (B, P, T_y, d)
        q = trace.queries.unsqueeze(1).expand(-1, w.size(1), -1, -1)
        logits = self.out(torch.cat([ctx, q], -1))
        mask = trace.step_mask if steps is None else steps & trace.step_mask
        logits = logits * mask[:, None, :, None]
        return logits[:, 0] if single else logits

    # --- GloballyIntervenable and decoding ------------------------------------------------
    def decode(self, src, src_lengths, max_len, prefix=None, intervene=None) -> OwnDecoded:
        emb = self.embed(src)
        pad = torch.arange(src.size(1))[None, :] >= src_lengths[:, None]
        y = torch.full((src.size(0),), BOS_ID)
        tokens, done = [], torch.zeros(src.size(0), dtype=torch.bool)
        lengths = torch.full((src.size(0),), max_len)
        for t in range(max_len):
            q = self.tgt_emb(y)
            att = torch.softmax((emb @ q[:, :, None])[..., 0].masked_fill(pad, float("-inf")), -1)[
                :, None
            ]
            if intervene is not None:
                att = intervene(att, t)
            logits = self.out(torch.cat([(att[:, 0, None] @ emb)[:, 0], q], -1))
            y = logits.argmax(-1)
            tokens.append(y.masked_fill(done, PAD_ID))
            newly = ~done & (y == EOS_ID)
            lengths[newly] = t + 1
            done |= newly
            if bool(done.all()):
                break
        return OwnDecoded(torch.stack(tokens, 1), lengths)

    @torch.no_grad()
    def greedy(self, src, src_lengths, max_len) -> list[list[int]]:
        out = self.decode(src, src_lengths, max_len)
        return [
            row[: int(n) - 1].tolist() if row[int(n) - 1] == EOS_ID else row[: int(n)].tolist()
            for row, n in zip(out.tokens, out.lengths)
        ]


def examples_and_vocab():
    names = symbols(5)
    vocab = Vocab.build([names])
    g = torch.Generator().manual_seed(3)
    examples = [
        synthetic_example(
            "copy", torch.randint(0, 5, (2 + k % 4,), generator=g).tolist(), names, f"own/{k}"
        )
        for k in range(6)
    ]
    return examples, vocab
