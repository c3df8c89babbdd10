"""What a teacher-forced pass returns, for every model family: :class:`Trace` and its selectors.

A trace holds the cross-attention of every decoder layer, ``(B, L, H, T_y, T_x)`` (L = 1 for the
recurrent family), and a selector of the *analysed unit*: one layer or all layers at once
(:data:`ALL`), and all heads jointly or one head. The ablations see only :attr:`Trace.attention`,
the analysed rows ``(B, H', T_y, T_x)``:

* one layer, all heads: H' = H, that layer's rows;
* all layers at once: H' = L·H, the layers' heads side by side (layer-major), so an ablation
  that treats heads independently (a permutation per head, the max of each head erased) treats
  every (layer, head) row independently, and the head mean is the layer-and-head mean;
* one layer, one head: H' = 1; a replacement for it keeps the other heads' own rows
  (:meth:`Trace.expand_heads`).

Each family subclasses :class:`Trace` with the state its local intervention needs and overrides
:meth:`Trace.select` to carry that state.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor, nn

ALL = "all"
"""Selector value: all layers at once (``layer``) or all heads jointly (``head``); integer
selectors are indices, negative ones counting from the top. Tables write it as −1."""

ROW_VALUES_BUDGET = 16 * 2**20
"""Most floats (64 MiB in float32) a model's ``rows_given_attention`` copies per row (its rows'
projected values); past it the row form is not prepared and the caller scatters instead."""


@dataclass(kw_only=True)
class Trace:
    """A teacher-forced pass over a target prefix (satisfies
    :class:`attnstudy.analysis.contract.AttentionTrace`).

    Attributes:
        src: long (B, T_x); src_lengths: long (B,); pad_mask: bool (B, T_x), True at padding.
        tgt_in: long (B, T_y), BOS + prefix; tgt_out: long (B, T_y), prefix + EOS.
        step_mask: bool (B, T_y), True at real (non-padding) steps.
        logits: (B, T_y, V).
        cross: (B, L, H, T_y, T_x) cross-attention of every decoder layer, rows summing to 1,
            exactly 0 at padding; None for a model without cross-attention.
        embedded: the source embeddings used, (B, T_x, E) (a leaf when gradients were asked for).
        layer: the analysed layer, 0 ≤ layer < L, or :data:`ALL` (``"all"``).
        head: the analysed head, 0 ≤ head < H, or :data:`ALL` (all heads jointly).
        step_logits: the T_y per-step logits (B, V) before they were stacked into ``logits``,
            kept by a step-by-step pass that records gradients (else None, and never carried by
            :meth:`select`): a gradient of step t's output taken from them starts at step t,
            where one taken from a slice of ``logits`` back-propagates zeros through every other
            step's output layer and every later step first.
    """

    src: Tensor
    src_lengths: Tensor
    pad_mask: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    step_mask: Tensor
    logits: Tensor
    cross: Tensor | None
    embedded: Tensor
    layer: int | str = 0
    head: int | str = ALL
    step_logits: tuple[Tensor, ...] | None = None

    @property
    def cross_attention(self) -> Tensor | None:
        """(B, L, H, T_y, T_x): every layer's cross-attention."""
        return self.cross

    @property
    def n_layers(self) -> int:
        """L, the decoder layers with cross-attention (1 without any)."""
        return 1 if self.cross is None else self.cross.size(1)

    @property
    def n_heads(self) -> int:
        """H, heads per layer (1 without cross-attention)."""
        return 1 if self.cross is None else self.cross.size(2)

    @property
    def unit_attention(self) -> Tensor | None:
        """(B, H_u, T_y, T_x): every head of the analysed layer(s), H_u = H (one layer) or L·H
        (:data:`ALL`, layer-major), before any head selection."""
        if self.cross is None:
            return None
        if self.layer == ALL:
            return self.cross.flatten(1, 2)
        return self.cross[:, self.layer]

    @property
    def attention(self) -> Tensor | None:
        """(B, H', T_y, T_x): the analysed rows (see the module docstring); None without
        cross-attention."""
        unit = self.unit_attention
        if unit is None or self.head == ALL:
            return unit
        return unit[:, self.head : self.head + 1]

    def with_layer(self, layer: int | str) -> Trace:
        """The same trace analysing another layer: an index (negative counts from the top) or
        :data:`ALL` for all layers at once (with one layer, the same as layer 0).

        Raises:
            ValueError: no such layer, or :data:`ALL` with one head selected.
        """
        n = self.n_layers
        if layer == ALL:
            if n == 1:
                return replace(self, layer=0)
            if self.head != ALL:
                raise ValueError("one head of all layers at once is not defined; analyse a layer")
            return replace(self, layer=ALL)
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise ValueError(f"layer must be an index or 'all', got {layer!r}")
        index = layer + n if layer < 0 else layer
        if not 0 <= index < n:
            raise ValueError(
                f"layer {layer} out of range: the model has {n} layer(s) of cross-attention"
            )
        return self if index == self.layer else replace(self, layer=index)

    def with_head(self, head: int | str) -> Trace:
        """The same trace analysing one head (the others keep their rows under an intervention)
        or all heads jointly (:data:`ALL`).

        Raises:
            ValueError: no such head, or one head while all layers are analysed at once.
        """
        if head == ALL:
            return self if self.head == ALL else replace(self, head=ALL)
        if not isinstance(head, int) or isinstance(head, bool) or not 0 <= head < self.n_heads:
            raise ValueError(f"head {head!r} out of range: the model has {self.n_heads} head(s)")
        if self.layer == ALL:
            raise ValueError("one head of all layers at once is not defined; analyse a layer")
        return replace(self, head=head)

    def expand_heads(self, weights: Tensor) -> Tensor:
        """Replacement rows for the analysed rows → rows for every head of the analysed layer(s).

        Args:
            weights: (B, P, H', T_y, T_x), replacements of :attr:`attention`'s rows.

        Returns:
            (B, P, H_u, T_y, T_x): ``weights`` itself when all heads are analysed; otherwise the
            layer's own rows with the analysed head's replaced.
        """
        if self.head == ALL:
            return weights
        unit = self.unit_attention
        b, p = weights.shape[:2]
        full = unit.unsqueeze(1).expand(b, p, *unit.shape[1:]).clone()
        full[:, :, self.head] = weights[:, :, 0]
        return full

    def _pick(self, rows: Tensor, t: slice) -> dict:
        """The common fields of a subset of batch rows and a window of steps (for subclasses'
        :meth:`select`)."""

        def pick(x):
            return None if x is None else x.index_select(0, rows)

        return dict(
            src=pick(self.src),
            src_lengths=pick(self.src_lengths),
            pad_mask=pick(self.pad_mask),
            tgt_in=pick(self.tgt_in)[:, t],
            tgt_out=pick(self.tgt_out)[:, t],
            step_mask=pick(self.step_mask)[:, t],
            logits=pick(self.logits)[:, t],
            cross=None if self.cross is None else pick(self.cross)[:, :, :, t],
            embedded=pick(self.embedded),
            layer=self.layer,
            head=self.head,
        )

    def select(self, rows: Tensor, start: int = 0, stop: int | None = None) -> Trace:
        """The trace of a subset of batch rows (long (B',)) and a window of decoder steps
        ``[start, stop)`` — still a valid trace for local interventions of those steps."""
        raise NotImplementedError

    def _window(self, start: int, stop: int | None) -> slice:
        return slice(start, self.tgt_in.size(1) if stop is None else stop)


def field_names(cls) -> list[str]:
    """The dataclass field names of a trace class (for tests and subclasses)."""
    return [f.name for f in fields(cls)]


@dataclass
class Decoded:
    """Output of ``decode``.

    Attributes:
        tokens: long (B, T), emitted tokens, PAD after EOS.
        lengths: long (B,), number of tokens up to and including EOS (or T if none).
        logits: (B, T, V).
        attention: (B, H', T, T_x) of the analysed rows actually used, or None.
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


@contextmanager
def gradients_in_eval():
    """Gradients through a model in ``eval()`` mode: ``torch.enable_grad()`` with cuDNN off.

    cuDNN's RNN kernels have no backward in eval mode: on CUDA, a gradient through ``nn.GRU`` or
    ``nn.LSTM`` in eval mode raises "cudnn RNN backward can only be called in training mode" (seen
    on an NVIDIA H200, torch 2.11, in the adversarial search). With cuDNN off PyTorch runs its own
    RNN kernels, the same function with a backward in either mode (the remedy PyTorch's and
    Captum's maintainers give: pytorch/pytorch#5878, pytorch/captum#564); the analysis needs eval
    mode (no dropout), so cuDNN is what gives way. No effect on the CPU, where cuDNN is not used.
    The flag is process-wide: a CUDA training in another thread of the same process runs without
    cuDNN meanwhile (slower, the same function); the previous setting is restored on exit, also
    after an error. Every gradient the battery takes through a model in eval mode runs inside
    this (gradient importance, erase-until-flip's attention gradient, the adversarial search);
    ``tests/training/test_devices.py`` checks that none escapes it.
    """
    previous = torch.backends.cudnn.enabled
    torch.backends.cudnn.enabled = False
    try:
        with torch.enable_grad():
            yield
    finally:
        torch.backends.cudnn.enabled = previous


def folded_rows(
    weights: Tensor,
    mask: Tensor,
    projected: Tensor,
    per_step: Tensor,
    finish: Callable[[Tensor, Tensor, Tensor], Tensor],
    n_out: int,
    chunk_rows: int = 4096,
) -> Tensor:
    """A local intervention whose first layer is linear in the attention row, folded: the shared
    loop of the Luong flow's and the Transformer's folded forms.

    Per example, the rows of its real steps (all P replacements) are one product
    ``α_rows @ projected`` (the attention rows, H·T_x values each, against what each position adds
    per unit of attention), to which each step's own term (a state term, a residual stream) is
    added once per replacement. Only real steps are computed; examples go in chunks of about
    ``chunk_rows`` rows (at least one example), and ``finish`` takes each chunk the rest of the
    way.

    Args:
        weights: (B, P, H, T_y, T_x) replacement rows of every head.
        mask: bool (B, T_y), the steps computed.
        projected: (B, H·T_x, d), row h·T_x + j what position j of head h adds per unit of
            attention (the values through the layer's weight on the context).
        per_step: (B, T_y, d), each step's term (the same for every replacement).
        finish: ``fn(x (N, d), b_idx (N,), t_idx (N,)) -> logits (N, n_out)``; rows in
            (example, replacement, step) order.
        n_out: output size V.
        chunk_rows: rows per chunk.

    Returns:
        logits (B, P, T_y, V); 0 where not computed.
    """
    b, p = weights.shape[:2]
    out = weights.new_zeros(b, p, mask.size(1), n_out)
    grad = torch.is_grad_enabled() and (
        weights.requires_grad or projected.requires_grad or per_step.requires_grad
    )
    counts = mask.sum(1).tolist()  # real steps per example
    # the real steps of each example, None where they are its first n (a greedy or reference
    # prefix): its rows are then a narrow view instead of an index_select
    steps_of = [
        None if bool(mask[e, :n].all()) else mask[e].nonzero().squeeze(1)
        for e, n in enumerate(counts)
    ]
    example = 0
    while example < b:
        lo, n_rows = example, 0
        while example < b and (n_rows == 0 or n_rows + p * counts[example] <= chunk_rows):
            n_rows += p * counts[example]
            example += 1
        if n_rows == 0:
            continue
        # the chunk's rows, written in place into one buffer (out= is refused under autograd:
        # then the parts are concatenated)
        x = None if grad else projected.new_empty(n_rows, projected.size(-1))
        parts, bi, ti, offset = [], [], [], 0
        for e in range(lo, example):
            n = counts[e]
            if n == 0:
                continue
            steps = steps_of[e]
            rows_e = (
                weights[e].narrow(2, 0, n) if steps is None else weights[e].index_select(2, steps)
            )
            rows_e = rows_e.permute(0, 2, 1, 3).reshape(p * n, -1)
            term = (
                per_step[e].narrow(0, 0, n) if steps is None else per_step[e].index_select(0, steps)
            )
            if grad:
                parts.append(((rows_e @ projected[e]).view(p, n, -1) + term).view(p * n, -1))
            else:
                x_e = x[offset : offset + p * n]
                torch.mm(rows_e, projected[e], out=x_e)
                x_e.view(p, n, -1).add_(term)  # each step's own term, for every replacement
            bi.append(torch.full((p * n,), e, dtype=torch.long, device=weights.device))
            ti.append(
                (torch.arange(n, device=weights.device) if steps is None else steps).repeat(p)
            )
            offset += p * n
        logits = finish(torch.cat(parts) if grad else x, torch.cat(bi), torch.cat(ti))
        offset = 0
        for e in range(lo, example):
            n = counts[e]
            if n:
                block = logits[offset : offset + p * n].view(p, n, -1)
                if steps_of[e] is None:
                    out[e].narrow(1, 0, n).copy_(block)
                else:
                    out[e].index_copy_(1, steps_of[e], block)
                offset += p * n
    return out
