"""Permutation and uniform attention (Jain & Wallace 2019, §4.1; Moradi et al. 2019).

* :func:`run_permutation` — local: P random permutations of α_t over the valid positions, every
  step recomputed from its traced prefix state (one batched ``logits_given_attention`` call per
  example chunk); per step the median over permutations of TVD(p_t, p̃_t) and the fraction of
  permutations whose argmax differs. Identity permutations are excluded and counted.
* :func:`permutation_loop_reference` — the same numbers from a plain loop (one forward per
  permutation per step, same generators): the test oracle and the benchmark baseline.
* :func:`run_permutation_global` — the same policy at every step of free-running greedy decoding,
  so effects propagate; per example: output changed?, edit distance, exact match before/after.
* :func:`run_uniform` — α_t := uniform over the valid positions; TVD and flip per step.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import torch

from attnstudy.config import AblationConfig
from attnstudy.models import Seq2Seq, eval_mode

from ._local import base_probs, n_valid, require_attention, step_frame, sub_trace, trace_chunks
from .common import PreparedBatch, step_generator
from .divergences import tvd
from .interventions import permutation_indices, permute, uniform

try:  # the project's own definition when present
    from attnstudy.metrics import edit_distance
except ImportError:  # pragma: no cover - fallback
    import editdistance

    def edit_distance(a, b) -> int:
        return int(editdistance.eval(list(a), list(b)))


def run_permutation(model: Seq2Seq, batch: PreparedBatch, cfg: AblationConfig) -> pd.DataFrame:
    """Local permutation test at every real decoder step (Jain & Wallace 2019, §4.1, Fig. 5).

    For step t with attention α_t (every head permuted independently over the valid source
    positions, generator ``step_generator(cfg.seed, example_id, t, "permutation")``):
    ``median_π TVD(p_t, p_t(α_t[π]))`` with TVD = ½ Σ_v |p − p̃| over the full output vocabulary,
    and the fraction of permutations whose argmax differs from argmax p_t. p_t is recomputed
    through the same local path from the unchanged α_t.

    Args:
        model: the model (run in eval mode, previous mode restored).
        batch: prepared batch (prefix per ``cfg.prefix``).
        cfg: uses ``n_permutations`` (P), ``seed``, ``chunk_rows``.

    Returns:
        One row per real step: ``example_id``, ``step``, ``permutation_median_tvd`` (in [0, 1]),
        ``permutation_flip_rate`` (in [0, 1]), ``permutation_n_identity`` (identity permutations
        excluded), ``permutation_skipped`` (True when the source has < 2 valid positions; the
        values are then NaN). Both values are NaN if every permutation was the identity.

    Raises:
        NoAttentionError: for the ``none`` model.
    """
    require_attention(model, batch, "permutation")
    tr = batch.trace
    frame, b_idx, t_idx = step_frame(batch)
    p_count = cfg.n_permutations
    nv = n_valid(tr)
    ids = batch.example_ids
    med = torch.full(tr.step_mask.shape, float("nan"), dtype=torch.float64)
    flip = med.clone()
    n_id = torch.zeros(tr.step_mask.shape, dtype=torch.long)
    with eval_mode(model), torch.no_grad():
        for chunk in trace_chunks(tr, p_count):
            rows, window = chunk.rows, slice(chunk.start, chunk.stop)
            sub = sub_trace(tr, rows, chunk.start, chunk.stop)
            steps = sub.step_mask & (nv[rows] >= 2)[:, None]
            if not bool(steps.any()):
                continue

            def gen(b: int, t: int, rows=rows, start=chunk.start) -> torch.Generator:
                return step_generator(cfg.seed, ids[int(rows[b])], start + t, "permutation")

            perm = permute(sub.attention, ~sub.pad_mask, p_count, gen, steps)
            base = base_probs(model, sub, cfg.chunk_rows)  # (b, T_y, V)
            probs = torch.softmax(
                model.logits_given_attention(sub, perm.weights, cfg.chunk_rows, steps), -1
            )
            keep = ~perm.identity  # (b, P, T_y)
            d = tvd(probs, base.unsqueeze(1)).double().masked_fill(~keep, float("nan"))
            flips = (probs.argmax(-1) != base.argmax(-1).unsqueeze(1)).double()
            n_keep = keep.sum(1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices → NaN
                m = torch.from_numpy(np.nanmedian(d.numpy(), axis=1))
            f = (flips * keep).sum(1) / n_keep.clamp(min=1)
            f = f.masked_fill(n_keep == 0, float("nan"))
            med[rows, window] = torch.where(steps, m, med[rows, window])
            flip[rows, window] = torch.where(steps, f, flip[rows, window])
            n_id[rows, window] = torch.where(steps, (~keep).sum(1), n_id[rows, window])
    frame["permutation_median_tvd"] = med[b_idx, t_idx].numpy()
    frame["permutation_flip_rate"] = flip[b_idx, t_idx].numpy()
    frame["permutation_n_identity"] = n_id[b_idx, t_idx].numpy()
    frame["permutation_skipped"] = (nv[b_idx] < 2).numpy()
    return frame


def permutation_loop_reference(
    model: Seq2Seq, batch: PreparedBatch, cfg: AblationConfig
) -> pd.DataFrame:
    """Plain-loop reference of :func:`run_permutation`: one forward per permutation per step.

    Uses the same generators and the same draw (:func:`analysis.interventions.permutation_indices`),
    builds each permuted row by hand and recomputes the step with
    ``attention.context`` + ``decoder.output_given_context`` for that single row. Slow by
    design; the result equals :func:`run_permutation` (to float rounding).

    Returns:
        The same columns as :func:`run_permutation`.

    Raises:
        NoAttentionError: for the ``none`` model.
    """
    att = require_attention(model, batch, "permutation")
    tr = batch.trace
    frame, b_idx, t_idx = step_frame(batch)
    h = att.size(1)
    meds, flips, n_ids, skipped = [], [], [], []
    with eval_mode(model), torch.no_grad():
        for b, t in zip(b_idx.tolist(), t_idx.tolist()):
            pos = (~tr.pad_mask[b]).nonzero()[:, 0]
            nv = pos.numel()
            skipped.append(nv < 2)
            if nv < 2:
                meds.append(np.nan), flips.append(np.nan), n_ids.append(0)
                continue
            mem = sub_trace(tr, torch.tensor([b])).memory
            prefix = tr.prefix[b, t].unsqueeze(0)

            def probs_of(
                row: torch.Tensor, mem=mem, prefix=prefix
            ) -> torch.Tensor:  # (H, T_x) -> (V,)
                ctx = model.attention.context(row[None, :, None, :], mem)[:, 0]
                return torch.softmax(model.decoder.output_given_context(prefix, ctx), -1)[0]

            row = att[b, :, t]
            base = probs_of(row)
            perms = permutation_indices(
                step_generator(cfg.seed, batch.example_ids[b], t, "permutation"),
                cfg.n_permutations,
                h,
                nv,
            )
            ds, fs, n_id = [], [], 0
            for perm in perms:  # (H, nv)
                if bool((perm == torch.arange(nv)).all()):
                    n_id += 1
                    continue
                new = row.clone()
                new[:, pos] = row[:, pos][torch.arange(h)[:, None], perm]
                q = probs_of(new)
                ds.append(float(tvd(q, base)))
                fs.append(float(q.argmax() != base.argmax()))
            meds.append(float(np.median(ds)) if ds else np.nan)
            flips.append(float(np.mean(fs)) if fs else np.nan)
            n_ids.append(n_id)
    frame["permutation_median_tvd"] = np.asarray(meds, dtype=float)
    frame["permutation_flip_rate"] = np.asarray(flips, dtype=float)
    frame["permutation_n_identity"] = np.asarray(n_ids, dtype=np.int64)
    frame["permutation_skipped"] = np.asarray(skipped, dtype=bool)
    return frame


def run_permutation_global(
    model: Seq2Seq, batch: PreparedBatch, cfg: AblationConfig, max_decode_factor: float = 2.0
) -> pd.DataFrame:
    """Global permutation: free-running greedy decoding with α_t permuted at every step.

    One permutation per step and head (generator ``step_generator(cfg.seed, example_id, t,
    "permutation_global")``), applied inside :meth:`Seq2Seq.decode` so the changed outputs feed
    the following steps. The original output is the model's greedy decode without intervention.

    Args:
        model, batch, cfg: as for every ablation (``cfg.seed``); only the batch's sources and
            examples are used (the prefix does not matter: decoding is free-running).
        max_decode_factor: max output length of an example = factor × its source length + 2.

    Returns:
        One row per EXAMPLE: ``example_id``, ``permutation_global_changed`` (bool),
        ``permutation_global_edit_distance`` (Levenshtein distance in tokens between the
        original and the permuted output), ``permutation_global_exact_original`` and
        ``permutation_global_exact_permuted`` (bool: output equals any reference; their mean
        difference is the task-metric drop).

    Raises:
        NoAttentionError: for the ``none`` model.
    """
    require_attention(model, batch, "permutation_global")
    tr = batch.trace
    ids = batch.example_ids
    valid = ~tr.pad_mask
    max_len = int(max_decode_factor * int(tr.src_lengths.max())) + 2

    def intervene(weights: torch.Tensor, t: int) -> torch.Tensor:  # (B, H, T_x)
        def gen(b: int, _t: int) -> torch.Generator:
            return step_generator(cfg.seed, ids[b], t, "permutation_global")

        return permute(weights, valid, 1, gen).weights[:, 0]

    with eval_mode(model), torch.no_grad():
        orig = model.decode(tr.src, tr.src_lengths, max_len)
        pert = model.decode(tr.src, tr.src_lengths, max_len, intervene=intervene)
    decode = batch.tgt_vocab.decode
    rows = []
    for i, ex in enumerate(batch.examples):
        # each example's own length limit, so the result does not depend on the batch
        limit = int(max_decode_factor * int(tr.src_lengths[i])) + 2
        a = tuple(decode(orig.tokens[i, :limit].tolist()))
        b = tuple(decode(pert.tokens[i, :limit].tolist()))
        refs = {tuple(r) for r in ex.references}
        rows.append(
            {
                "example_id": ex.id,
                "permutation_global_changed": a != b,
                "permutation_global_edit_distance": edit_distance(a, b),
                "permutation_global_exact_original": a in refs,
                "permutation_global_exact_permuted": b in refs,
            }
        )
    return pd.DataFrame(rows)


def run_uniform(model: Seq2Seq, batch: PreparedBatch, cfg: AblationConfig) -> pd.DataFrame:
    """Uniform attention: α_t := 1/n over the n valid positions (Moradi et al. 2019).

    Returns:
        One row per real step: ``example_id``, ``step``, ``uniform_tvd`` (TVD(p_t, p̃_t) over the
        full vocabulary), ``uniform_flip`` (bool as float: argmax changed), ``uniform_skipped``
        (source with < 2 valid positions: values NaN).

    Raises:
        NoAttentionError: for the ``none`` model.
    """
    att = require_attention(model, batch, "uniform")
    tr = batch.trace
    frame, b_idx, t_idx = step_frame(batch)
    nv = n_valid(tr)
    steps = tr.step_mask & (nv >= 2)[:, None]
    with eval_mode(model), torch.no_grad():
        base = base_probs(model, tr, cfg.chunk_rows)
        probs = torch.softmax(
            model.logits_given_attention(tr, uniform(~tr.pad_mask, att), cfg.chunk_rows, steps), -1
        )
    d = tvd(probs, base).double().masked_fill(~steps, float("nan"))
    f = (probs.argmax(-1) != base.argmax(-1)).double().masked_fill(~steps, float("nan"))
    frame["uniform_tvd"] = d[b_idx, t_idx].numpy()
    frame["uniform_flip"] = f[b_idx, t_idx].numpy()
    frame["uniform_skipped"] = (nv[b_idx] < 2).numpy()
    return frame
