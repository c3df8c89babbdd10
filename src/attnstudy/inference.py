"""Decoding raw text with a loaded model: the tokenization of the model's task, the decode budget,
greedy or beam search, and optionally the attention matrix (core layer: no tracking)."""

from __future__ import annotations

import torch

from .config import RunSpec
from .data.batching import collate
from .data.tasks import get_task
from .data.types import DataError, Example, detokenize, tokenize
from .data.vocab import BOS_ID, EOS_ID, SPECIALS
from .models import eval_mode
from .models.io import LoadedModel
from .training import max_decode_len


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


def predict_loaded(
    loaded: LoadedModel, inputs: list[str], beam_size: int = 1, with_attention: bool = False
) -> list[dict]:
    """Decode raw input strings with a loaded model, one input at a time.

    Args:
        loaded: the model with its config and vocabularies.
        inputs: raw texts (a G2P word, a token sequence, …).
        beam_size: 1 for greedy decoding, else beam search with that many beams.
        with_attention: also return the head-mean attention over the decoded output.

    Returns:
        one dict per input: ``input``, ``output`` (detokenised), ``tokens``, ``n_unknown`` (source
        tokens mapped to ``<unk>``), and with ``with_attention`` the head-mean attention matrix
        ``attention`` (T_y × T_x, list of lists of floats rounded to 4 digits; None for a model
        without attention) with ``source_tokens``.

    Raises:
        DataError: see :func:`source_tokens`.
    """
    spec, model = loaded.spec, loaded.model
    out_tok = tokenizations(spec)[1]
    results = []
    for text in inputs:
        tokens = source_tokens(spec, text)
        batch = collate(
            [Example(id="input", src=tuple(tokens), tgt=("<unk>",))],
            loaded.src_vocab,
            loaded.tgt_vocab,
        )
        max_len = max_decode_len(spec, len(tokens))
        with eval_mode(model), torch.no_grad():
            if beam_size > 1:
                ids = model.beam_search(batch.src, batch.src_lengths, max_len, beam_size)[0]
            else:
                ids = model.greedy(batch.src, batch.src_lengths, max_len)[0]
        out_tokens = loaded.tgt_vocab.decode(ids)
        rec = {
            "input": text,
            "output": detokenize(out_tokens, out_tok),
            "tokens": out_tokens,
            "n_unknown": loaded.src_vocab.count_unknown(tokens),
        }
        if with_attention:
            with eval_mode(model), torch.no_grad():
                tr = model.trace(
                    batch.src,
                    batch.src_lengths,
                    torch.tensor([[BOS_ID, *ids]]),
                    torch.tensor([[*ids, EOS_ID]]),
                )
            rec["source_tokens"] = tokens
            rec["attention"] = (
                None
                if tr.attention is None
                else [[round(float(v), 4) for v in row] for row in tr.attention.mean(1)[0]]
            )
        results.append(rec)
    return results
