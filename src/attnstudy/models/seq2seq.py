"""The encoder-decoder and the analysis contract (docs/design.md §3).

1. :meth:`Seq2Seq.trace` — a teacher-forced pass over a given target prefix returning per-step
   logits, attention and the per-step prefix state.
2. :meth:`Seq2Seq.logits_given_attention` — local intervention: the logits every real step
   would have produced from the SAME prefix state with a replacement attention row, for P
   replacements at once, computing non-padding rows only, in chunks.
3. :meth:`Seq2Seq.decode` — global intervention: decode again (teacher-forced or greedy) with an
   intervention applied at every step, so effects propagate.
4. Both work with autograd (adversarial search optimises replacement weights; gradient
   importance differentiates w.r.t. source embeddings with attention detached).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from .attention import Memory
from .decoder import Decoder, DecoderState
from .encoder import RecurrentEncoder

BOS_ID, EOS_ID, PAD_ID = 1, 2, 0


@dataclass
class Trace:
    """A teacher-forced pass (satisfies :class:`attnstudy.analysis.contract.AttentionTrace`).

    Attributes:
        src: long (B, T_x); src_lengths: long (B,); pad_mask: bool (B, T_x), True at padding.
        tgt_in: long (B, T_y), BOS + prefix; tgt_out: long (B, T_y), prefix + EOS.
        step_mask: bool (B, T_y), True at real (non-padding) steps.
        logits: (B, T_y, V).
        attention: (B, H, T_y, T_x), the cross-attention of the analysed layer, or None for the
            ``none`` model.
        prefix: (B, T_y, ·) per-step prefix state for :meth:`Seq2Seq.logits_given_attention`.
        memory: the attention memory (keys/values), or None.
        embedded: the source embeddings used, (B, T_x, E) (a leaf when gradients were asked for).
        layers: (B, L, H, T_y, T_x) cross-attention of every layer for a multi-layer family, else
            None (the recurrent decoder has one attention: L = 1).
        layer: index of the analysed layer.
    """

    src: Tensor
    src_lengths: Tensor
    pad_mask: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    step_mask: Tensor
    logits: Tensor
    attention: Tensor | None
    prefix: Tensor
    memory: Memory | None
    embedded: Tensor
    layers: Tensor | None = None
    layer: int = 0

    @property
    def cross_attention(self) -> Tensor | None:
        """(B, L, H, T_y, T_x), every layer's cross-attention (L = 1 here unless :attr:`layers`)."""
        if self.layers is not None:
            return self.layers
        return None if self.attention is None else self.attention.unsqueeze(1)

    def with_layer(self, layer: int) -> Trace:
        """The trace analysing layer ``layer`` (negative counts from the top).

        Raises:
            ValueError: no such layer.
        """
        n = 1 if self.layers is None else self.layers.size(1)
        index = layer + n if layer < 0 else layer
        if not 0 <= index < n:
            raise ValueError(
                f"layer {layer} out of range: the model has {n} layer(s) of cross-attention"
            )
        if self.layers is None:
            return self if index == self.layer else replace(self, layer=index)
        return replace(self, attention=self.layers[:, index], layer=index)

    def select(self, rows: Tensor, start: int = 0, stop: int | None = None) -> Trace:
        """The trace of a subset of batch rows (long (B',)) and a window of decoder steps.

        Every step's local intervention needs only its own prefix state and the encoder memory,
        so a window ``[start, stop)`` of steps is a valid trace for local interventions.
        """
        t = slice(start, self.tgt_in.size(1) if stop is None else stop)
        pick = lambda x: None if x is None else x.index_select(0, rows)  # noqa: E731
        return Trace(
            src=pick(self.src),
            src_lengths=pick(self.src_lengths),
            pad_mask=pick(self.pad_mask),
            tgt_in=pick(self.tgt_in)[:, t],
            tgt_out=pick(self.tgt_out)[:, t],
            step_mask=pick(self.step_mask)[:, t],
            logits=pick(self.logits)[:, t],
            attention=None if self.attention is None else pick(self.attention)[:, :, t],
            prefix=pick(self.prefix)[:, t],
            memory=None if self.memory is None else self.memory.index_select(rows),
            embedded=pick(self.embedded),
            layers=None if self.layers is None else pick(self.layers)[:, :, :, t],
            layer=self.layer,
        )


@dataclass
class Decoded:
    """Output of :meth:`Seq2Seq.decode`.

    Attributes:
        tokens: long (B, T), emitted tokens, PAD after EOS.
        lengths: long (B,), number of tokens up to and including EOS (or T if none).
        logits: (B, T, V).
        attention: (B, H, T, T_x) of the rows actually used, or None.
    """

    tokens: Tensor
    lengths: Tensor
    logits: Tensor
    attention: Tensor | None


@contextmanager
def eval_mode(model: nn.Module):
    """Run in ``eval()`` mode and restore the previous mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


class Seq2Seq(nn.Module):
    """Encoder + attention + decoder."""

    def __init__(self, encoder: RecurrentEncoder, decoder: Decoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    @property
    def attention(self):
        return self.decoder.attention

    @property
    def has_attention(self) -> bool:
        return self.decoder.attention is not None

    @property
    def n_layers(self) -> int:
        """Layers with cross-attention: one (the recurrent decoder attends once per step)."""
        return 1

    def value_vectors(self, trace: Trace) -> Tensor:
        """f(x_j) per head, (B, H, T_x, d), such that the context of step t is Σ_h Σ_j α_thj f_h(x_j):
        the attention memory's values after the score's output projection (multihead: each head's
        block of W^O; the other scores have none), so Σ over heads and positions is the context.

        Raises:
            ValueError: for the ``none`` model.
        """
        if not self.has_attention or trace.memory is None:
            raise ValueError("the 'none' model has no value vectors")
        values = trace.memory.values  # (B, H, T_x, d_v)
        out_proj = getattr(self.attention, "out_proj", None)
        if out_proj is None:
            return values
        h, d = values.size(1), values.size(-1)
        blocks = out_proj.weight.view(out_proj.out_features, h, d).permute(1, 2, 0)  # (H, d_v, A)
        return torch.einsum("bhxd,hda->bhxa", values, blocks)

    def embed(self, src: Tensor) -> Tensor:
        """Source embeddings (B, T_x, E) of ``src`` long (B, T_x): what gradient importance
        differentiates against (pass them back through :meth:`trace`'s ``embedded``)."""
        return self.encoder.embedding(src)

    def encode(
        self, src: Tensor, src_lengths: Tensor, embedded: Tensor | None = None
    ) -> tuple[Memory | None, DecoderState, Tensor]:
        """Encode. Returns (memory or None, initial decoder state, pad_mask (B, T_x))."""
        if src.dim() != 2 or src_lengths.dim() != 1 or src.size(0) != src_lengths.size(0):
            raise ValueError(
                f"src must be (B, T_x) with src_lengths (B,), got {tuple(src.shape)} "
                f"and {tuple(src_lengths.shape)}"
            )
        if int(src_lengths.min()) < 1:
            raise ValueError("every source needs at least one token (got an empty sequence)")
        states, summary = self.encoder(src, src_lengths, embedded)
        pad_mask = torch.arange(src.size(1), device=src.device)[None, :] >= src_lengths[:, None]
        memory = self.attention.memory(states, pad_mask) if self.has_attention else None
        return memory, self.decoder.init_state(summary), pad_mask

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T_y, V) — the training forward."""
        return self.trace(src, src_lengths, tgt_in).logits

    # --- 1. trace ------------------------------------------------------------------------------
    def trace(
        self,
        src: Tensor,
        src_lengths: Tensor,
        tgt_in: Tensor,
        tgt_out: Tensor | None = None,
        embedded: Tensor | None = None,
        detach_attention: bool = False,
    ) -> Trace:
        """Teacher-forced pass over a given target prefix.

        Args:
            src: long (B, T_x); src_lengths: long (B,).
            tgt_in: long (B, T_y), BOS followed by the prefix, PAD-padded.
            tgt_out: long (B, T_y), the prefix followed by EOS (optional; used for ``step_mask``,
                else the mask is ``tgt_in != PAD``).
            embedded: optional source embeddings (B, T_x, E) to differentiate against.
            detach_attention: stop gradients through the attention weights.

        Returns:
            :class:`Trace`.
        """
        if embedded is None:
            embedded = self.encoder.embedding(src)
        memory, state, pad_mask = self.encode(src, src_lengths, embedded)
        logits, weights, prefixes = [], [], []
        for t in range(tgt_in.size(1)):
            out = self.decoder.step(tgt_in[:, t], state, memory, detach_attention=detach_attention)
            state = out.state
            logits.append(out.logits)
            prefixes.append(out.prefix)
            if out.weights is not None:
                weights.append(out.weights)
        step_mask = (tgt_out if tgt_out is not None else tgt_in) != PAD_ID
        if tgt_out is None:
            tgt_out = torch.cat(
                [tgt_in[:, 1:], tgt_in.new_full((tgt_in.size(0), 1), PAD_ID)], dim=1
            )
        return Trace(
            src=src,
            src_lengths=src_lengths,
            pad_mask=pad_mask,
            tgt_in=tgt_in,
            tgt_out=tgt_out,
            step_mask=step_mask,
            logits=torch.stack(logits, 1),
            attention=torch.stack(weights, 2) if weights else None,
            prefix=torch.stack(prefixes, 1),
            memory=memory,
            embedded=embedded,
        )

    # --- 2. local intervention -----------------------------------------------------------------
    def logits_given_attention(
        self, trace: Trace, weights: Tensor, chunk_rows: int = 4096, steps: Tensor | None = None
    ) -> Tensor:
        """Logits each step would give from its traced prefix state with replacement attention.

        Rows (example, replacement, step) are independent: the context is one batched matmul per
        example, then only real steps go through the output layers, ``chunk_rows`` at a time.

        Args:
            trace: from :meth:`trace`.
            weights: replacement rows, (B, H, T_y, T_x) or (B, P, H, T_y, T_x); rows of padding
                steps are ignored.
            chunk_rows: rows per output-layer call (sized for the cache).
            steps: optional bool (B, T_y) restricting which steps are computed (default: all real
                steps, ``trace.step_mask``).

        Returns:
            logits, (B, T_y, V) or (B, P, T_y, V); 0 at steps not computed.

        Raises:
            ValueError: for the ``none`` model or a shape that does not match the trace.
        """
        if not self.has_attention:
            raise ValueError("the 'none' model has no attention to replace")
        single = weights.dim() == 4
        if single:
            weights = weights.unsqueeze(1)
        b, p, h, t_y, t_x = weights.shape
        expected = (
            trace.src.size(0),
            self.attention.heads,
            trace.tgt_in.size(1),
            trace.src.size(1),
        )
        if (b, h, t_y, t_x) != expected:
            raise ValueError(
                f"weights must be (B, P, H, T_y, T_x) with (B, H, T_y, T_x) = {expected}, "
                f"got {tuple(weights.shape)}"
            )
        mask = trace.step_mask if steps is None else steps & trace.step_mask
        # context for every (example, replacement, step): one matmul per example and head
        flat = weights.permute(0, 2, 1, 3, 4).reshape(b, h, p * t_y, t_x)
        context = self.attention.context(flat, trace.memory).view(b, p, t_y, -1)
        rows = mask.unsqueeze(1).expand(b, p, t_y).nonzero(as_tuple=True)  # (bi, pi, ti)
        out = context.new_zeros(b, p, t_y, self.decoder.output.out_features)
        n = rows[0].numel()
        for start in range(0, n, chunk_rows):
            bi, pi, ti = (r[start : start + chunk_rows] for r in rows)
            logits = self.decoder.output_given_context(trace.prefix[bi, ti], context[bi, pi, ti])
            out.index_put_((bi, pi, ti), logits)
        return out[:, 0] if single else out

    # --- 3. decoding and global intervention -------------------------------------------------
    def decode(
        self,
        src: Tensor,
        src_lengths: Tensor,
        max_len: int,
        prefix: Tensor | None = None,
        intervene=None,
    ) -> Decoded:
        """Greedy (free-running) or teacher-forced decoding, optionally intervening at every step.

        Args:
            src: long (B, T_x); src_lengths: long (B,).
            max_len: maximum number of steps (including EOS) when free-running.
            prefix: optional long (B, T_y) BOS + prefix to teacher-force (global intervention
                under teacher forcing); decodes exactly T_y steps.
            intervene: optional ``fn(weights (B, H, T_x), t: int) -> (B, H, T_x)``.

        Returns:
            :class:`Decoded` (tokens are the argmax at every step, also under teacher forcing).
        """
        memory, state, _ = self.encode(src, src_lengths)
        b = src.size(0)
        y = src.new_full((b,), BOS_ID)
        finished = torch.zeros(b, dtype=torch.bool, device=src.device)
        lengths = torch.full((b,), max_len if prefix is None else prefix.size(1), dtype=torch.long)
        tokens, logits, weights = [], [], []
        steps = max_len if prefix is None else prefix.size(1)
        for t in range(steps):
            if prefix is not None:
                y = prefix[:, t]
            fn = None if intervene is None else (lambda w, t=t: intervene(w, t))
            out = self.decoder.step(y, state, memory, intervene=fn)
            state = out.state
            pred = out.logits.argmax(-1)
            tokens.append(pred.masked_fill(finished, PAD_ID))
            logits.append(out.logits)
            if out.weights is not None:
                weights.append(out.weights)
            newly = ~finished & (pred == EOS_ID)
            lengths[newly] = t + 1
            finished |= newly
            y = pred
            if prefix is None and bool(finished.all()):
                break
        return Decoded(
            torch.stack(tokens, 1),
            lengths,
            torch.stack(logits, 1),
            torch.stack(weights, 2) if weights else None,
        )

    @torch.no_grad()
    def greedy(self, src: Tensor, src_lengths: Tensor, max_len: int) -> list[list[int]]:
        """Greedy decoding; returns token ids per example, without EOS."""
        with eval_mode(self):
            out = self.decode(src, src_lengths, max_len)
        return [
            row[: max(int(n) - 1, 0)].tolist()
            if row[int(n) - 1] == EOS_ID
            else row[: int(n)].tolist()
            for row, n in zip(out.tokens, out.lengths)
        ]

    @torch.no_grad()
    def beam_search(
        self,
        src: Tensor,
        src_lengths: Tensor,
        max_len: int | Tensor,
        beam_size: int = 5,
        length_penalty: float = 1.0,
    ) -> list[list[int]]:
        """Batched beam search; hypotheses scored by log-probability / length^α (Wu et al. 2016 style).

        Every example is searched as if it were alone: its own step budget, and once no live beam
        can beat its best finished hypothesis it takes no more candidates, so the result never
        depends on which other examples share the batch.

        Args:
            src: long (B, T_x); src_lengths: long (B,).
            max_len: maximum length including EOS, one int or long (B,) per example.
            beam_size: K.
            length_penalty: α; 0 disables normalisation.

        Returns:
            Best hypothesis per example, token ids without EOS.
        """
        with eval_mode(self):
            b, k = src.size(0), beam_size
            limits = [int(x) for x in torch.as_tensor(max_len).expand(b).tolist()]
            memory, state, _ = self.encode(src, src_lengths)
            rep = torch.arange(b).repeat_interleave(k)
            memory = None if memory is None else memory.index_select(rep)
            state = state.index_select(rep)
            scores = torch.full((b, k), float("-inf"))
            scores[:, 0] = 0.0
            y = src.new_full((b * k,), BOS_ID)
            history = torch.empty(b * k, 0, dtype=torch.long)
            finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
            done = [False] * b

            def norm(length: int) -> float:
                return length**length_penalty if length_penalty else 1.0

            for t in range(max(limits)):
                out = self.decoder.step(y, state, memory)
                logp = torch.log_softmax(out.logits, -1)  # (B*K, V)
                v = logp.size(-1)
                cand = (scores.view(-1, 1) + logp).view(b, k * v)
                top, idx = cand.topk(min(2 * k, k * v), dim=-1)
                beam_idx, tok = idx // v, idx % v
                new_scores = torch.full((b, k), float("-inf"))
                new_src = torch.zeros(b, k, dtype=torch.long)
                new_tok = torch.full((b, k), PAD_ID, dtype=torch.long)
                for i in range(b):
                    if done[i]:
                        continue
                    last = t == limits[i] - 1
                    j = 0
                    for s, bi, tk in zip(top[i].tolist(), beam_idx[i].tolist(), tok[i].tolist()):
                        if s == float("-inf"):
                            break
                        seq = history[i * k + bi].tolist()
                        if tk == EOS_ID or last:
                            finished[i].append(
                                (s / norm(len(seq) + 1), seq if tk == EOS_ID else seq + [tk])
                            )
                        elif j < k:
                            new_scores[i, j], new_src[i, j], new_tok[i, j] = s, bi, tk
                            j += 1
                        if j >= k:
                            break
                    # done when no live beam can still beat the best finished hypothesis: log-probs
                    # only fall, and normalising by length^α is most lenient at the example's limit
                    bound = float(new_scores[i].max()) / norm(limits[i])
                    if last or (finished[i] and max(f[0] for f in finished[i]) >= bound):
                        done[i] = True
                        new_scores[i] = float("-inf")
                flat_src = (torch.arange(b)[:, None] * k + new_src).view(-1)
                state = out.state.index_select(flat_src)
                history = torch.cat([history.index_select(0, flat_src), new_tok.view(-1, 1)], dim=1)
                scores = new_scores
                y = new_tok.view(-1)
                if all(done):
                    break
            return [max(f, key=lambda x: x[0])[1] if f else [] for f in finished]
