"""Feature importance vs attention per decoder step (Jain & Wallace 2019, §3).

For decoder step t with prefix token ŷ_t (``tgt_out``) and source embeddings e_1 … e_L:

* gradient × input (J&W's "XxE[X]" gradients, attention detached so the gradient flows only
  through the encoder–context path, their §3 footnote):
  g_tj = | Σ_d ∂ log p_t(ŷ_t) / ∂ e_{j,d} · e_{j,d} |;
* leave-one-out (J&W's ``remove_and_run``): delete source token j (the rest shifts left, length
  L − 1), re-encode, re-trace the SAME target prefix and measure
  LOO_tj = TVD(p_t, p_t^{−j}) over the full output vocabulary.

Then Kendall τ-b (with its p-value) between the head-mean attention row α_t and each importance
vector, and between the two importance vectors, over the valid source positions (J&W Table 2 /
Figure 2 report τ between attention and gradients and between attention and LOO).

``[ablation.importance] scores`` (:class:`~attnstudy.analysis.catalogue.OutputChangeParams`):
further registered step scores (:mod:`attnstudy.analysis.step_scores`) of every deletion, the
deleted-source output scored against the unmodified step (LOO^s_tj = s(p_t^{−j}, p_t, ŷ_t)),
computed from the same deletion traces as the TVD. Each gives one more leave-one-out vector per
step and its Kendall τ-b (with p-value) against attention: columns
``importance_tau_attn_loo_<score>`` and ``importance_p_attn_loo_<score>``, metric
``ablation/importance/tau_attn_loo_<score>`` (logged, not a report column). τ is rank-based: a
score and any increasing function of it give the same τ, and a score that is low where a deletion
matters (``probability``: p(ŷ_t) with token j deleted) shows agreement with attention as a
negative τ (``log_probability_drop`` is its positive counterpart). The gradient–LOO τ and the
reason columns stay TVD's only (an undefined τ of a score is NaN, counted as undefined in its
statistic).

Batching: the gradients of every step need one backward each (``torch.autograd.grad`` on the
embedding leaf only, so no parameter gradient is accumulated), but each backward covers the whole
batch (examples are independent, so the gradient of the batch sum is each example's own
gradient). All deletions of a batch — B × L sources — are encoded and traced as one batch,
in chunks; :func:`loo_loop_reference` does one deletion at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from attnstudy.analysis.catalogue import (
    AblationSpec,
    Capture,
    ExampleColumn,
    Figure,
    MapView,
    OutputChangeParams,
    Stat,
    VerdictRole,
)
from torch import Tensor

from attnstudy.models import Seq2Seq, eval_mode, gradients_in_eval

from ..batch import AblationContext, PreparedBatch
from ..divergences import kendall_tau
from ..step_scores import get_step_score, list_step_scores, step_score

NAME = "importance"

SPEC = AblationSpec(
    name="importance",
    run="attnstudy.analysis.ablations.importance:run",
    params=OutputChangeParams,
    more_stats="attnstudy.analysis.ablations.importance:more_stats",
    requires=("gradients",),
    stats={
        "tau_attn_grad": Stat(
            "importance_tau_attn_grad",
            label="τ attention–gradient",
            unit="Kendall τ-b",
            question="agrees",
            direction="higher",
            verdict=VerdictRole("agrees", measure="gradient × input"),
        ),
        "tau_attn_loo": Stat(
            "importance_tau_attn_loo",
            label="τ attention–LOO",
            unit="Kendall τ-b",
            question="agrees",
            direction="higher",
            verdict=VerdictRole("agrees", measure="leave-one-out"),
        ),
        "tau_grad_loo": Stat(
            "importance_tau_grad_loo",
            label="τ gradient–LOO (baseline)",
            unit="Kendall τ-b",
            question="agrees",
            verdict=VerdictRole("agrees", "yardstick", measure="gradient and leave-one-out"),
        ),
    },
    figure=Figure(
        "kendall_tau",
        "Agreement with gradient and leave-one-out importance",
        "Left: Kendall τ-b per step between attention and |gradient × input|, between attention "
        "and leave-one-out, and between gradient and leave-one-out (the baseline: how well two "
        "non-attention measures agree). Right: the share of steps whose τ is significant "
        "(p < 0.05), as Jain & Wallace (2019) report. With 5–20 source tokens τ takes few "
        "distinct values, so boxes are coarse.",
    ),
    definitions=(
        (
            "gradient × input",
            "|Σ_d ∂ log p_t(y_t)/∂e_jd · e_jd| for source embedding e_j, attention detached "
            "(Jain & Wallace 2019, §3).",
        ),
        ("leave-one-out (LOO)", "TVD between p_t and the output with source token j deleted."),
    ),
    terms=("Kendall τ-b",),
    examples=tuple(
        ExampleColumn(
            key,
            label,
            f"importance_{key}",
            unit="Kendall τ-b, mean over steps",
            undefined="τ undefined at every step: fewer than 2 source positions or a constant vector",
            step_label=label,
        )
        for key, label in (
            ("tau_attn_grad", "τ attn–grad"),
            ("tau_attn_loo", "τ attn–LOO"),
            ("tau_grad_loo", "τ grad–LOO"),
        )
    ),
    captures=Capture(
        "attnstudy.analysis.heatmaps:capture_importance",
        "attnstudy.analysis.heatmaps:importance_maps",
        (
            MapView(
                "gradient",
                "|gradient × input|",
                "first-order importance of each source token, each row scaled so its largest "
                "is 1 (no unit); hover a cell for the unscaled value, in nats",
                scale="row",
            ),
            MapView(
                "loo",
                "leave-one-out",
                "output TVD when the source token is deleted, each row scaled so its largest "
                "is 1; hover a cell for the unscaled TVD",
                scale="row",
            ),
        ),
    ),
    order=70,
    description="gradient × input and leave-one-out importance; Kendall τ of attention against each "
    "and of the two against each other",
    reference="Jain & Wallace 2019, §3",
)
PAD_ID = 0

REASON_NO_ATTENTION = "no attention (the 'none' model)"
REASON_ONE_POSITION = "one valid source position"
REASON_CONSTANT_ATTENTION = "constant attention row"
REASON_CONSTANT_IMPORTANCE = "constant importance vector"


@dataclass
class ImportanceVectors:
    """Raw per-position vectors of a batch (for figures and the τ table).

    Attributes:
        gradient: (B, T_y, T_x) |gradient × input|; NaN at padding positions and padding steps.
        loo: (B, T_y, T_x) leave-one-out TVD; NaN at padding, padding steps and sources of
            length 1 (nothing can be deleted).
        attention: (B, T_y, T_x) head-mean attention, or None for the ``none`` model.
        loo_scores: registered step score → (B, T_y, T_x) leave-one-out vector of that score
            (the deleted-source output against the unmodified step), NaN where ``loo`` is;
            empty unless scores were asked for (``[ablation.importance] scores``).
    """

    gradient: Tensor
    loo: Tensor
    attention: Tensor | None
    loo_scores: dict[str, Tensor] = field(default_factory=dict)


def gradient_importance(model: Seq2Seq, batch: PreparedBatch) -> Tensor:
    """Gradient × input importance per step (J&W 2019 §3), attention detached.

    g_tj = | Σ_d ∂ log p_t(ŷ_t) / ∂ e_{j,d} · e_{j,d} |, ŷ_t = ``trace.tgt_out[:, t]``. One
    backward per step for the whole batch, from the step's own logits
    (:attr:`~attnstudy.models.trace.Trace.step_logits`) where the model keeps them: a recurrent
    decoder's backward of step t then visits steps ≤ t only (bit-identical to taking it from the
    stacked logits; timed in ``benchmarks/RESULTS.md``, one long example).

    Args:
        model: the model (eval mode during the call, previous mode restored; gradients are taken
            with respect to the embedding leaf only, parameters accumulate nothing).
        batch: prepared batch, trace over the prefix (B, T_y steps, T_x source positions).

    Returns:
        (B, T_y, T_x), ≥ 0, NaN at padding positions and padding steps. Units: nats (a
        first-order estimate of the change of log p when the embedding is zeroed).
    """
    tr = batch.trace
    with eval_mode(model), gradients_in_eval():
        leaf = model.embed(tr.src).detach().requires_grad_(True)  # (B, T_x, E)
        trace = model.trace(
            tr.src, tr.src_lengths, tr.tgt_in, tr.tgt_out, embedded=leaf, detach_attention=True
        )
        # each step's own logits where the pass kept them (a recurrent decoder's backward then
        # starts at step t, not at the stacked logits of every step)
        steps = trace.step_logits or trace.logits.unbind(1)  # T_y × (B, V)
        t_y = len(steps)
        grads = []
        for t in range(t_y):
            logp = torch.log_softmax(steps[t], -1).gather(-1, tr.tgt_out[:, t : t + 1])  # (B, 1)
            (g,) = torch.autograd.grad(logp.sum(), leaf, retain_graph=t < t_y - 1)
            grads.append((g * leaf).sum(-1).abs().detach())  # (B, T_x)
    out = torch.stack(grads, 1)  # (B, T_y, T_x)
    invalid = ~tr.step_mask[:, :, None] | tr.pad_mask[:, None, :]
    return out.masked_fill(invalid, math.nan)


def _deleted_sources(src: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Every distinct single-token deletion of every source of length ≥ 2.

    Deleting token j or j − 1 of a run of equal tokens gives the same source, so only the first
    token of each run is deleted; :func:`_copy_runs` gives the others its value. (Computed
    separately, the equal values differ in the last float bits with the batch's padding, and
    Kendall τ would order a pair that is a tie.)

    Args:
        src: long (B, T_x); lengths: long (B,).

    Returns:
        rows_b (R,), rows_j (R,) (example and deleted position), src_del long (R, T_x − 1)
        PAD-padded, len_del (R,) = length − 1.
    """
    b_list, j_list = [], []
    for b, n in enumerate(lengths.tolist()):
        if n >= 2:
            row = src[b, :n].tolist()
            js = [j for j in range(n) if j == 0 or row[j] != row[j - 1]]
            b_list += [b] * len(js)
            j_list += js
    rows_b = torch.tensor(b_list, dtype=torch.long, device=src.device)
    rows_j = torch.tensor(j_list, dtype=torch.long, device=src.device)
    t_x = src.size(1)
    width = max(t_x - 1, 1)
    pos = torch.arange(width, device=src.device)[None, :]  # (1, T_x − 1)
    gather = (pos + (pos >= rows_j[:, None]).long()).clamp(max=t_x - 1)  # skip the deleted token
    src_del = src[rows_b].gather(1, gather)
    len_del = lengths[rows_b] - 1
    src_del = src_del.masked_fill(pos >= len_del[:, None], PAD_ID)
    return rows_b, rows_j, src_del, len_del


def _copy_runs(out: Tensor, src: Tensor, lengths: Tensor) -> Tensor:
    """Give every token of a run of equal source tokens the LOO value of the run's first token.

    Args:
        out: (B, T_y, T_x) LOO values, filled at the first token of each run (modified in place).
        src: long (B, T_x); lengths: long (B,).

    Returns:
        ``out``.
    """
    for b, n in enumerate(lengths.tolist()):
        row = src[b, :n].tolist()
        for j in range(1, n):
            if row[j] == row[j - 1]:
                out[b, :, j] = out[b, :, j - 1]
    return out


def loo_importance(model: Seq2Seq, batch: PreparedBatch, chunk_rows: int = 4096) -> Tensor:
    """Leave-one-out importance, all deletions of the batch as one (chunked) batch.

    LOO_tj = TVD(p_t, p_t^{−j}) where p^{−j} is the trace of the same target prefix over the
    source with token j deleted (J&W 2019 §3, ``remove_and_run``). Tokens of a run of equal
    tokens share one value: deleting any of them gives the same source.

    Args:
        model: the model (eval mode during the call, previous mode restored).
        batch: prepared batch (B, T_y, T_x).
        chunk_rows: decoder rows (deleted sources × T_y steps) per trace call.

    Returns:
        (B, T_y, T_x) in [0, 1]; NaN at padding positions, padding steps and for sources of
        length 1.
    """
    return loo_score_vectors(model, batch, ("tvd",), chunk_rows)["tvd"]


def _score_names(scores) -> None:
    """Refuse a single name where a list of step score names is expected (a string would be read
    letter by letter).

    Raises:
        TypeError: ``scores`` is a string.
    """
    if isinstance(scores, str):
        raise TypeError(f"scores is a list of step score names, e.g. [{scores!r}]")


def loo_score_vectors(
    model: Seq2Seq, batch: PreparedBatch, scores, chunk_rows: int = 4096
) -> dict[str, Tensor]:
    """Leave-one-out vectors of several step scores from one pass over the deleted sources.

    LOO^s_tj = s(p_t^{−j}, p_t, ŷ_t): the registered step score ``s``
    (:mod:`attnstudy.analysis.step_scores`) of the output with source token j deleted against the
    unmodified step's, ŷ_t = ``trace.tgt_out[:, t]``. ``"tvd"`` gives :func:`loo_importance`'s
    vector (TVD is symmetric). Every deletion is traced once whatever the number of scores.

    Args:
        model: the model (eval mode during the call, previous mode restored).
        batch: prepared batch (B, T_y, T_x).
        scores: registered step score names (iterable of str).
        chunk_rows: decoder rows (deleted sources × T_y steps) per trace call.

    Returns:
        score → (B, T_y, T_x) in the trace's dtype; NaN at padding positions, padding steps and
        for sources of length 1. Tokens of a run of equal tokens share one value.

    Raises:
        UnknownStepScoreError: a score is not registered (before any trace).
        TypeError: ``scores`` is a string, not a list of names.
    """
    _score_names(scores)
    fns = {name: get_step_score(name).fn for name in scores}
    tr = batch.trace
    b, t_y, t_x = tr.src.size(0), tr.tgt_in.size(1), tr.src.size(1)
    outs = {
        name: torch.full((b, t_y, t_x), math.nan, dtype=tr.logits.dtype, device=tr.src.device)
        for name in fns
    }
    rows_b, rows_j, src_del, len_del = _deleted_sources(tr.src, tr.src_lengths)
    if rows_b.numel() == 0:
        return outs
    p = torch.softmax(tr.logits, -1)  # (B, T_y, V)
    per_chunk = max(1, chunk_rows // t_y)
    with eval_mode(model), torch.no_grad():
        for start in range(0, rows_b.numel(), per_chunk):
            sl = slice(start, start + per_chunk)
            rb, rj = rows_b[sl], rows_j[sl]
            n_max = int(len_del[sl].max())
            trace = model.trace(src_del[sl, :n_max], len_del[sl], tr.tgt_in[rb], tr.tgt_out[rb])
            deleted = torch.softmax(trace.logits, -1)  # (R, T_y, V)
            for name, fn in fns.items():
                if name == "tvd":  # the importance vector as it always was: TVD(p, p^{−j})
                    div = step_score("tvd", p[rb], deleted)
                else:  # the deleted-source output scored against the unmodified step
                    div = fn(deleted, p[rb], tr.tgt_out[rb])
                outs[name][rb, :, rj] = div.to(tr.logits.dtype)  # (R, T_y)
    for name, out in outs.items():
        _copy_runs(out, tr.src, tr.src_lengths)
        outs[name] = out.masked_fill(~tr.step_mask[:, :, None], math.nan)
    return outs


def loo_loop_reference(model: Seq2Seq, batch: PreparedBatch, score: str = "tvd") -> Tensor:
    """Plain-loop reference of :func:`loo_importance` (and of :func:`loo_score_vectors`' vector of
    ``score``): one deleted source at a time.

    Each deletion is traced alone over the example's own (unpadded) prefix; every position is
    deleted (runs of equal tokens too).

    Args:
        model, batch: as :func:`loo_importance`.
        score: a registered step score, the deleted-source output against the unmodified step
            (default ``"tvd"``: :func:`loo_importance`'s vector).

    Returns:
        (B, T_y, T_x), as :func:`loo_importance`.

    Raises:
        UnknownStepScoreError: ``score`` is not registered.
    """
    get_step_score(score)
    tr = batch.trace
    b, t_y, t_x = tr.src.size(0), tr.tgt_in.size(1), tr.src.size(1)
    out = torch.full((b, t_y, t_x), math.nan, dtype=tr.logits.dtype, device=tr.src.device)
    p = torch.softmax(tr.logits, -1)
    with eval_mode(model), torch.no_grad():
        for i in range(b):
            n = int(tr.src_lengths[i])
            steps = int(tr.step_mask[i].sum())
            if n < 2:
                continue
            for j in range(n):
                src = torch.cat([tr.src[i, :j], tr.src[i, j + 1 : n]]).unsqueeze(0)
                trace = model.trace(
                    src,
                    torch.tensor([n - 1], device=tr.src.device),
                    tr.tgt_in[i : i + 1, :steps],
                    tr.tgt_out[i : i + 1, :steps],
                )
                deleted = torch.softmax(trace.logits[0], -1)
                if score == "tvd":
                    div = step_score("tvd", p[i, :steps], deleted)
                else:
                    div = step_score(score, deleted, p[i, :steps], tr.tgt_out[i, :steps])
                out[i, :steps, j] = div.to(out.dtype)
    return out


def importance_vectors(
    model: Seq2Seq, batch: PreparedBatch, chunk_rows: int = 4096, scores=()
) -> ImportanceVectors:
    """Gradient, leave-one-out and head-mean attention vectors of every step of a batch.

    Args:
        model: the model (mode restored; no parameter gradients accumulated).
        batch: prepared batch.
        chunk_rows: decoder rows per leave-one-out trace call.
        scores: further registered step scores of the deletions
            (:attr:`ImportanceVectors.loo_scores`; ``[ablation.importance] scores``), computed
            from the same deletion traces as the TVD.

    Returns:
        :class:`ImportanceVectors`.

    Raises:
        UnknownStepScoreError: a score is not registered.
        TypeError: ``scores`` is a string, not a list of names.
    """
    _score_names(scores)
    att = batch.trace.attention
    gradient = gradient_importance(model, batch)
    loo = loo_score_vectors(model, batch, ("tvd", *scores), chunk_rows)
    return ImportanceVectors(
        gradient=gradient,
        loo=loo.pop("tvd"),
        attention=None if att is None else att.mean(1),
        loo_scores=loo,
    )


def importance_table(batch: PreparedBatch, vectors: ImportanceVectors) -> pd.DataFrame:
    """Kendall τ-b table of importance vectors, one row per real step.

    Columns: ``example_id``, ``step``, ``importance_skipped`` (one valid position),
    ``importance_tau_attn_grad``, ``importance_p_attn_grad``, ``importance_tau_attn_loo``,
    ``importance_p_attn_loo``, ``importance_tau_grad_loo``, ``importance_p_grad_loo`` (NaN when
    undefined), ``importance_attn_reason`` (why the attention τ is undefined, else None) and
    ``importance_grad_loo_reason`` (why the gradient–LOO τ is undefined, else None); then, for
    each score of ``vectors.loo_scores``, ``importance_tau_attn_loo_<score>`` and
    ``importance_p_attn_loo_<score>`` (τ-b of attention against that leave-one-out vector; NaN
    where undefined: one valid position, no attention, a constant vector).
    """
    tr = batch.trace
    b_idx, t_idx = tr.step_mask.nonzero(as_tuple=True)
    grad = vectors.gradient.cpu().numpy()
    loo = vectors.loo.cpu().numpy()
    att = None if vectors.attention is None else vectors.attention.cpu().numpy()
    scored = {name: v.cpu().numpy() for name, v in vectors.loo_scores.items()}
    lengths = tr.src_lengths.tolist()
    cols: dict[str, list] = {
        k: []
        for k in (
            "tau_attn_grad",
            "p_attn_grad",
            "tau_attn_loo",
            "p_attn_loo",
            "tau_grad_loo",
            "p_grad_loo",
            *(f"{k}_loo_{name}" for name in scored for k in ("tau_attn", "p_attn")),
        )
    }
    skipped, attn_reason, pair_reason = [], [], []
    for b, t in zip(b_idx.tolist(), t_idx.tolist()):
        n = int(lengths[b])
        g, lo = grad[b, t, :n], loo[b, t, :n]
        skipped.append(n < 2)
        nan2 = (math.nan, math.nan)
        if n < 2:
            tau_ag = tau_al = tau_gl = nan2
            attn_reason.append(REASON_NO_ATTENTION if att is None else REASON_ONE_POSITION)
            pair_reason.append(REASON_ONE_POSITION)
        else:
            tau_gl = kendall_tau(g, lo)
            pair_reason.append(REASON_CONSTANT_IMPORTANCE if math.isnan(tau_gl[0]) else None)
            if att is None:
                tau_ag = tau_al = nan2
                attn_reason.append(REASON_NO_ATTENTION)
            else:
                a = att[b, t, :n]
                tau_ag, tau_al = kendall_tau(a, g), kendall_tau(a, lo)
                if np.all(a == a[0]):
                    attn_reason.append(REASON_CONSTANT_ATTENTION)
                elif math.isnan(tau_ag[0]) or math.isnan(tau_al[0]):
                    attn_reason.append(REASON_CONSTANT_IMPORTANCE)
                else:
                    attn_reason.append(None)
        pairs = [("attn_grad", tau_ag), ("attn_loo", tau_al), ("grad_loo", tau_gl)]
        for name, vec in scored.items():
            undefined = n < 2 or att is None
            pairs.append((f"attn_loo_{name}", nan2 if undefined else kendall_tau(a, vec[b, t, :n])))
        for key, val in pairs:
            cols[f"tau_{key}"].append(val[0])
            cols[f"p_{key}"].append(val[1])
    df = pd.DataFrame(
        {
            "example_id": [batch.examples[b].id for b in b_idx.tolist()],
            "step": t_idx.cpu().numpy(),
            f"{NAME}_skipped": np.array(skipped, dtype=bool),
            **{f"{NAME}_{k}": np.array(v, dtype=float) for k, v in cols.items()},
            # object dtype whatever the values, so tables of different batches concatenate alike
            f"{NAME}_attn_reason": pd.Series(attn_reason, dtype=object),
            f"{NAME}_grad_loo_reason": pd.Series(pair_reason, dtype=object),
        }
    )
    return df


def run(model: Seq2Seq, batch: PreparedBatch, params, ctx: AblationContext) -> pd.DataFrame:
    """Attention vs gradient and leave-one-out importance per decoder step (J&W 2019 §3).

    Args:
        model: the model (eval mode during the call, previous mode restored; no parameter
            gradients accumulated).
        batch: prepared batch (B examples, trace over the chosen prefix).
        params: ``scores``, further step scores of the deletions (module docstring).
        ctx: ``chunk_rows``.

    Returns:
        One row per real step, columns as :func:`importance_table`. For the ``none`` model the
        attention τ columns are NaN with ``importance_attn_reason`` saying why; gradient–LOO τ
        is still computed.

    Raises:
        UnknownStepScoreError: a score of ``params.scores`` is not registered.
    """
    vectors = importance_vectors(model, batch, ctx.chunk_rows, params.scores)
    return importance_table(batch, vectors)


def more_stats(columns) -> dict:
    """The statistics of the step scores named in ``[ablation.importance] scores``: the mean
    τ-b of attention against each score's leave-one-out vector, ``tau_attn_loo_<score>``
    (logged, not a report column)."""
    names = set(columns)
    return {
        f"tau_attn_loo_{name}": Stat(f"{NAME}_tau_attn_loo_{name}", unit="Kendall τ-b")
        for name in list_step_scores()
        if name not in ("tvd", "flip") and f"{NAME}_tau_attn_loo_{name}" in names
    }
