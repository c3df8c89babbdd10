"""Plain references of the model families' fast paths: slow by design, for tests and benchmarks.

Each re-runs the whole model where the fast path reuses a traced state: :meth:`Transformer.logits_given_attention`
against :func:`transformer_logits_given_attention`, :meth:`HFSeq2Seq.logits_given_attention` against
:func:`hf_logits_given_attention` (importing this module does not import transformers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .trace import ALL
from .transformer import attend

if TYPE_CHECKING:
    from .hf import HFSeq2Seq, HFTrace
    from .transformer import Transformer, TransformerTrace


def transformer_logits_given_attention(
    model: Transformer, trace: TransformerTrace, weights: Tensor
) -> Tensor:
    """Plain reference of :meth:`Transformer.logits_given_attention`: for every real step t and
    replacement p, the whole decoder re-run over positions 0 … t of that example alone, with
    position t's cross-attention rows replaced at the analysed layer(s). Slow by design.

    Args:
        model: the model; trace: a full trace (offset 0) from :meth:`Transformer.trace`.
        weights: (B, P, H', T_y, T_x) replacements of ``trace.attention``.

    Returns:
        (B, P, T_y, V), 0 at padding steps.
    """
    full = trace.expand_heads(weights)
    b, p, _, t_y, _ = full.shape
    h = model.heads
    layers = list(range(model.layers)) if trace.layer == ALL else [trace.layer]
    out = full.new_zeros(b, p, t_y, model.output.out_features)
    for i in range(b):
        n = int(trace.src_lengths[i])
        memory, _ = model.encode(trace.src[i : i + 1, :n], trace.src_lengths[i : i + 1])
        for t in range(t_y):
            if not bool(trace.step_mask[i, t]):
                continue
            tokens = trace.tgt_in[i : i + 1, : t + 1]
            for r in range(p):
                x = model._decoder_input(tokens, 0, memory)
                future = torch.ones(t + 1, t + 1, dtype=torch.bool, device=tokens.device).triu(1)
                for m, layer in enumerate(model.decoder_layers):
                    a = layer.sub.inp(0, x)
                    k, v = layer.self_attn.keys_values(a)
                    w = attend(layer.self_attn.queries(a), k, future)
                    x = layer.sub.add(0, x, layer.self_attn.output(w, v))
                    c = model._cross_weights(layer, x, memory.keys[:, m], memory.pad_mask)
                    if m in layers:
                        j = layers.index(m)
                        c = c.clone()
                        c[0, :, t] = full[i, r, j * h : (j + 1) * h, t, :n]
                    x = layer.cross_given_weights(x, c, memory.values[:, m])
                    x = layer.feed_forward(x)
                out[i, r, t] = model._logits(x)[0, t]
    return out


def hf_logits_given_attention(
    model: HFSeq2Seq, trace: HFTrace, weights: Tensor, steps: Tensor | None = None
) -> Tensor:
    """Plain reference of :meth:`HFSeq2Seq.logits_given_attention`: for every (example, replacement,
    step), the whole model run again on the prefix up to that step, no cache, with the last
    position's rows at the analysed layer(s) replaced. Slow; for tests and benchmarks.

    Args and returns as :meth:`HFSeq2Seq.logits_given_attention` (``trace`` unwindowed).
    """
    from . import hf

    single = weights.dim() == 4
    if single:
        weights = weights.unsqueeze(1)
    weights = trace.expand_heads(weights)
    b, p, _, t_y, _ = weights.shape
    h = model.heads
    layers = list(range(model.layers)) if trace.layer == ALL else [trace.layer]
    mask = trace.step_mask if steps is None else steps & trace.step_mask
    out = weights.new_zeros(b, p, t_y, len(model.vocab))
    for i in range(b):
        n = int(trace.src_lengths[i])
        src = trace.src[i : i + 1, :n]
        for t in range(t_y):
            if not bool(mask[i, t]):
                continue
            for r in range(p):
                repl = {m: weights[i, r, k * h : (k + 1) * h, t, :n] for k, m in enumerate(layers)}

                def fn(m, w, repl=repl):
                    if m not in repl:
                        return None
                    w = w.clone()
                    w[0, :, -1] = repl[m]
                    return w

                token = hf._ACTIVE.set(model._hooks(fn))
                try:
                    res = model.hf(
                        input_ids=model._model_ids(src),
                        decoder_input_ids=model._model_ids(trace.tgt_in[i : i + 1, : t + 1]),
                        use_cache=False,
                        return_dict=True,
                    )
                finally:
                    hf._ACTIVE.reset(token)
                out[i, r, t] = model.ids.logits(res.logits[0, -1])
    return out[:, 0] if single else out
