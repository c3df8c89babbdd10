"""Greedy, teacher-forced and beam-search decoding, written once for every model family.

A family implements two methods and inherits :class:`Decoding`:

* ``begin(src, src_lengths) -> state`` — encode; ``state.index_select(index)`` picks rows
  (beams) of every tensor it holds;
* ``advance(y, state, t, intervene=None) -> (logits (N, V), rows (N, H_u, T_x) | None, state)`` —
  one decoder step from the previous token ``y`` (long (N,)) at target position ``t``;
  ``intervene(rows (N, H, T_x)) -> rows`` replaces the cross-attention rows of the layer(s)
  chosen by :meth:`Decoding.decode`'s ``layer`` before they are used (called once per chosen
  layer, in layer order), and ``rows`` are the rows actually used (all heads of the analysed
  layer(s), layer-major).

So the recurrent and the Transformer families decode through the same code: the same stopping
rule, the same per-example budgets, the same beam bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .trace import ALL, Decoded, eval_mode

BOS_ID, EOS_ID, PAD_ID = 1, 2, 0

Intervention = Callable[[Tensor, int], Tensor]
"""``fn(rows (B, H', T_x), t) -> rows``: a replacement of the analysed attention rows at step t."""


def select_heads(intervene: Intervention | None, head: int) -> Intervention | None:
    """Wrap an intervention on one head's rows (N, 1, T_x) as one on all heads' rows (N, H, T_x),
    the other heads keeping their own rows. ``head`` = :data:`ALL` returns ``intervene``."""
    if intervene is None or head == ALL:
        return intervene

    def on_all(rows: Tensor, t: int) -> Tensor:
        out = rows.clone()
        out[:, head : head + 1] = intervene(rows[:, head : head + 1], t)
        return out

    return on_all


class Decoding:
    """Decoding over a family's ``begin``/``advance`` (see the module docstring). A family with
    several decoder layers sets ``self.layers`` (their number)."""

    def _layers_of(self, layer: int | str) -> set[int]:
        """The decoder layers a ``layer`` selector names: every layer for :data:`ALL`, else one
        index (negative from the top).

        Raises:
            ValueError: for a layer out of range.
        """
        if layer == ALL:
            return set(range(self.layers))
        index = layer + self.layers if layer < 0 else layer
        if not 0 <= index < self.layers:
            raise ValueError(
                f"layer {layer} out of range: the model has {self.layers} layer(s) of "
                "cross-attention"
            )
        return {index}

    def decode(
        self,
        src: Tensor,
        src_lengths: Tensor,
        max_len: int,
        prefix: Tensor | None = None,
        intervene: Intervention | None = None,
        layer: int | str = ALL,
        head: int | str = ALL,
    ) -> Decoded:
        """Greedy (free-running) or teacher-forced decoding, optionally intervening at every step.

        Args:
            src: long (B, T_x); src_lengths: long (B,).
            max_len: maximum number of steps (including EOS) when free-running.
            prefix: optional long (B, T_y) BOS + prefix to teacher-force; decodes exactly T_y
                steps.
            intervene: optional ``fn(rows (B, H', T_x), t) -> rows``, applied to the analysed
                rows (``layer``, ``head``) at every step, so effects propagate. With ``layer`` =
                :data:`ALL` on a multi-layer model it is called once per layer with that layer's
                rows.
            layer: the layer intervened on (an index, negative from the top, or :data:`ALL`).
            head: the head intervened on, or :data:`ALL`.

        Returns:
            :class:`Decoded` (tokens are the argmax at every step, also under teacher forcing);
            its ``attention`` holds the rows used by the intervened layer(s), all heads.
        """
        state = self.begin(src, src_lengths)
        b = src.size(0)
        y = src.new_full((b,), BOS_ID)
        finished = torch.zeros(b, dtype=torch.bool, device=src.device)
        steps = max_len if prefix is None else prefix.size(1)
        lengths = torch.full((b,), steps, dtype=torch.long, device=src.device)
        tokens, logits, weights = [], [], []
        fn = select_heads(intervene, head)
        for t in range(steps):
            if prefix is not None:
                y = prefix[:, t]
            step_fn = None if fn is None else (lambda w, t=t: fn(w, t))
            out, rows, state = self.advance(y, state, t, step_fn, layer)
            pred = out.argmax(-1)
            tokens.append(pred.masked_fill(finished, PAD_ID))
            logits.append(out)
            if rows is not None:
                weights.append(rows)
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
        """Batched beam search; hypotheses scored by log-probability / length^α (Wu et al. 2016,
        eq. 14, without the coverage term).

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
            limits = [int(x) for x in torch.as_tensor(max_len, device="cpu").expand(b).tolist()]
            rep = torch.arange(b, device=src.device).repeat_interleave(k)
            state = self.begin(src, src_lengths).index_select(rep)
            scores = torch.full((b, k), float("-inf"), device=src.device)
            scores[:, 0] = 0.0
            y = src.new_full((b * k,), BOS_ID)
            history = torch.empty(b * k, 0, dtype=torch.long, device=src.device)
            finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
            done = [False] * b

            def norm(length: int) -> float:
                return length**length_penalty if length_penalty else 1.0

            for t in range(max(limits)):
                logits, _, state = self.advance(y, state, t)
                logp = torch.log_softmax(logits, -1)  # (B*K, V)
                v = logp.size(-1)
                cand = (scores.view(-1, 1) + logp).view(b, k * v)
                top, idx = cand.topk(min(2 * k, k * v), dim=-1)
                beam_idx, tok = idx // v, idx % v
                top, beam_idx, tok = top.cpu(), beam_idx.cpu(), tok.cpu()
                # the beams' bookkeeping is host-side; the model's tensors stay on its device
                new_scores = torch.full((b, k), float("-inf"), device="cpu")
                new_src = torch.zeros(b, k, dtype=torch.long, device="cpu")
                new_tok = torch.full((b, k), PAD_ID, dtype=torch.long, device="cpu")
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
                flat_src = (
                    (torch.arange(b, device="cpu")[:, None] * k + new_src).view(-1).to(src.device)
                )
                state = state.index_select(flat_src)
                history = torch.cat(
                    [history.index_select(0, flat_src), new_tok.view(-1, 1).to(src.device)], dim=1
                )
                scores = new_scores.to(src.device)
                y = new_tok.view(-1).to(src.device)
                if all(done):
                    break
            return [max(f, key=lambda x: x[0])[1] if f else [] for f in finished]
