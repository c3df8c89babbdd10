"""Decoding raw text with a loaded model: the tokenization of the model's task, the decode budget,
greedy or beam search, and optionally the attention matrix (core layer: no tracking)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnstudy.config import RunSpec
from attnstudy.data.batching import collate
from attnstudy.data.tasks import get_task
from attnstudy.data.types import DataError, Example, detokenize, tokenize
from attnstudy.data.vocab import BOS_ID, EOS_ID, SPECIALS
from attnstudy.models import eval_mode
from attnstudy.models.io import LoadedModel
from attnstudy.models.trace import Trace
from attnstudy.models.training import NonFiniteError, max_decode_len


def tokenizations(spec: RunSpec) -> tuple[str, str]:
    """How raw source text is split and how output tokens are joined: (source, target), each
    ``"chars"`` or ``"spaces"``, as the task's registry entry says."""
    return get_task(spec.data.task).tokenization(spec.data)


def source_tokens(spec: RunSpec, text: str) -> list[str]:
    """The source tokens of one raw input, as the model's task reads them.

    Raises:
        DataError: an empty input, one longer than the model's ``data.max_source_len``, or one
            holding a special token (``<eos>`` …), which would merge with the model's own.
    """
    task = get_task(spec.data.task)
    tokens = tokenize(task.normalize(text), task.tokenization(spec.data)[0])
    if not tokens:
        raise DataError(f"empty input {text!r}: give at least one token")
    if len(tokens) > spec.data.max_source_len:
        raise DataError(
            f"an input has {len(tokens):,} tokens, more than the model's data.max_source_len = "
            f"{spec.data.max_source_len:,}; shorten it"
        )
    specials = sorted(set(tokens) & set(SPECIALS))
    if specials:
        raise DataError(
            f"an input holds the special token(s) {specials}, which the model reserves; "
            "remove them from the input"
        )
    return tokens


PREDICT_BATCH = 64
"""Inputs decoded together (results never depend on batch-mates: each input keeps its own budget)."""


def predict_loaded(
    loaded: LoadedModel,
    inputs: list[str],
    beam_size: int = 1,
    with_attention: bool = False,
    batch_size: int = PREDICT_BATCH,
) -> list[dict]:
    """Decode raw input strings with a loaded model, ``batch_size`` inputs at a time.

    Every input is decoded with its own step budget
    (:func:`attnstudy.models.training.max_decode_len`),
    and greedy and beam search are batch-invariant, so an input's output is the one it gets when
    decoded alone (tested). One teacher-forced pass over the outputs checks that what they were
    chosen from is finite (:func:`check_finite`) and gives the attention.

    Args:
        loaded: the model with its config and vocabularies.
        inputs: raw texts (a G2P word, a token sequence, …).
        beam_size: 1 for greedy decoding, else beam search with that many beams.
        with_attention: also return the head-mean attention over the decoded output.
        batch_size: inputs per decoding batch.

    Returns:
        one dict per input, in order: ``input``, ``output`` (detokenised), ``tokens``,
        ``n_unknown`` (source tokens mapped to ``<unk>``), and with ``with_attention`` the head-mean
        attention matrix ``attention`` (T_y × T_x, T_y = output tokens + ``<eos>``; list of lists
        of floats rounded to 4 digits; None for a model without attention) with ``source_tokens``.

    Raises:
        DataError: see :func:`source_tokens` (every input is checked before any is decoded).
        NonFiniteError: the logits, attention or output probabilities of an input's decoded
            output are not finite (:func:`check_finite`; nothing is returned).
    """
    spec, model = loaded.spec, loaded.model
    out_tok = tokenizations(spec)[1]
    token_lists = [source_tokens(spec, text) for text in inputs]
    results = []
    for start in range(0, len(inputs), batch_size):
        chunk = token_lists[start : start + batch_size]
        batch = collate(
            [Example(id=f"input-{i}", src=tuple(t), tgt=("<unk>",)) for i, t in enumerate(chunk)],
            loaded.src_vocab,
            loaded.tgt_vocab,
        )
        budgets = [max_decode_len(spec, len(t)) for t in chunk]
        with eval_mode(model), torch.no_grad():
            if beam_size > 1:
                hyps = model.beam_search(
                    batch.src,
                    batch.src_lengths,
                    torch.tensor(budgets, device=batch.src.device),
                    beam_size,
                )
            else:
                hyps = model.greedy(batch.src, batch.src_lengths, max(budgets))
        # each input's own budget, so an output never depends on its batch-mates
        hyps = [h[:n] for h, n in zip(hyps, budgets)]
        trace = _trace(model, batch, hyps)
        texts = inputs[start : start + len(chunk)]
        labels = [f"input {start + i + 1} {t[:40]!r}" for i, t in enumerate(texts)]
        check_finite(trace, labels, "its output would mean nothing")
        attention = _attention(trace, batch, hyps) if with_attention else None
        for i, (text, tokens, ids) in enumerate(zip(inputs[start:], chunk, hyps)):
            out_tokens = loaded.tgt_vocab.decode(ids)
            rec = {
                "input": text,
                "output": detokenize(out_tokens, out_tok),
                "tokens": out_tokens,
                "n_unknown": loaded.src_vocab.count_unknown(tokens),
            }
            if with_attention:
                rec["source_tokens"] = tokens
                rec["attention"] = None if attention is None else attention[i]
            results.append(rec)
    return results


def check_finite(trace: Trace, labels: Sequence[str], consequence: str) -> None:
    """Refuse a teacher-forced pass whose logits or attention hold NaN/inf, or whose output
    probabilities (the softmax of the logits, in float32) are not finite or do not sum to 1, at
    any real step. Finite weights can still overflow the logits (output weights of 3e38), so the
    stored weights' check is not enough: ``predict`` and every ablation call this on what they use.

    Args:
        trace: the pass (its ``step_mask`` marks the real steps).
        labels: one per batch row, naming it in the message (``"example 'e1'"``, ``"input 'abc'"``).
        consequence: what would be meaningless, for the message.

    Raises:
        NonFiniteError: one line naming the first row concerned.
    """
    real_steps = trace.step_mask
    for name, t in (("logits", trace.logits), ("attention", trace.attention)):
        if t is None:
            continue
        real = (
            real_steps.view(*real_steps.shape[:1], *([1] * (t.dim() - 3)), real_steps.size(1), 1)
            if name == "attention"
            else real_steps[..., None]
        )
        bad = (~torch.isfinite(t)) & real
        if bool(bad.any()):
            row = int(bad.reshape(bad.size(0), -1).any(-1).nonzero()[0, 0])
            raise NonFiniteError(
                f"the model's {name} are NaN or infinite for {labels[row]}: {consequence}; "
                "check the model's weights"
            )
    for row in range(trace.logits.size(0)):  # one row at a time: V may be a large vocabulary
        p = trace.logits[row][real_steps[row]].float().softmax(-1)
        if not (bool(torch.isfinite(p).all()) and bool(((p.sum(-1) - 1).abs() <= 1e-3).all())):
            raise NonFiniteError(
                f"the model's output probabilities are not finite or do not sum to 1 for "
                f"{labels[row]}: {consequence}; check the model's weights"
            )


def _trace(model, batch, hyps: list[list[int]]) -> Trace:
    """The teacher-forced pass over every input's own output + ``<eos>``."""
    t = max(len(h) for h in hyps) + 1
    device = batch.src.device  # the model's: a CUDA model's batch is on the GPU
    tgt_in = torch.zeros((len(hyps), t), dtype=torch.long, device=device)
    tgt_out = torch.zeros((len(hyps), t), dtype=torch.long, device=device)
    for i, h in enumerate(hyps):
        tgt_in[i, : len(h) + 1] = torch.tensor([BOS_ID, *h], device=device)
        tgt_out[i, : len(h) + 1] = torch.tensor([*h, EOS_ID], device=device)
    with eval_mode(model), torch.no_grad():
        return model.trace(batch.src, batch.src_lengths, tgt_in, tgt_out)


def _attention(tr: Trace, batch, hyps: list[list[int]]) -> list[list[list[float]]] | None:
    """Head-mean attention (analysed layer) of every input over its own output + ``<eos>``."""
    if tr.attention is None:
        return None
    att = tr.attention.mean(1)  # (B, T_y, T_x)
    out = []
    for i, h in enumerate(hyps):
        n_src = int(batch.src_lengths[i])
        out.append([[round(float(v), 4) for v in row[:n_src]] for row in att[i, : len(h) + 1]])
    return out
