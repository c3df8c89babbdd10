"""Adversarial attention (Jain & Wallace 2019, §4.2), carried over to every decoder step.

For one decoder step with attention row α and output distribution p, look for K attention
distributions α̃_1 … α̃_K over the valid source positions that are as different from α as
possible (JSD) while the output they induce from the SAME prefix state stays close to p (TVD):

    loss = Σ_k [ −JSD(α̃_k, α) + λ · ReLU(TVD(p̃_k, p) − ε_opt) ] − mean_{k,k'} JSD(α̃_k, α̃_k')

with α̃_k = masked_softmax(θ_k), θ initialised to log(uniform over valid positions) + N(0, σ²) —
the objective and defaults of Jain & Wallace's class ``AdversaryMulti`` (repository ``successar/AttentionExplanation``, ``model/Binary_Classification.py``
and ``model/Question_Answering.py``: K = 5, σ = 3, lr 0.01, 500 iterations, λ = 500, ε = 0.01;
the pairwise term there is ``cross_jsd.sum(0).mean()``, i.e. per example the mean over the K × K
candidate pairs, diagonal included, which is what we use per decoder step).
``solver`` minimises it: ``"rprop-1"`` (the default, 80 iterations;
:mod:`attnstudy.analysis.adversarial_rprop`: resilient propagation on the objective smoothed by
a continuation that ends at the objective itself, the logits' spread bounded) or ``"jw"``, Jain &
Wallace's Adam with AMSGrad (lr 0.01, 500 iterations), which has not converged at 500 iterations
(its objective still falls between 5,000 and 20,000 iterations on the benchmark models).
p̃_k = softmax(logits given α̃_k), a local intervention through
:meth:`Seq2Seq.logits_given_attention`. After optimisation, candidates with
TVD(p̃_k, p) ≤ ε_eval are kept and the largest JSD(α̃_k, α) among them is reported (J&W report
the maximum JSD of the candidates that stay within ε of the output). ε_opt (the hinge during the
search) and ε_eval (the acceptance threshold) are separate settings and are logged separately.

All steps × examples × K candidates are optimised in ONE batched problem: the loss is the sum of
the per-row losses and rows share no parameters, so each row receives exactly its own gradient,
and both solvers' updates are element-wise, so the batched search follows each row's own
trajectory (checked against :func:`adversarial_loop_reference`, one step at a time). In float32
a row's numbers still vary with its batch-mates at the level of rounding (the model's batched
products round differently), and a search amplifies that: Adam to ~10⁻⁵ in the max JSD,
rprop-1, whose steps follow gradient signs, to ~10⁻³ on some steps (docs/design.md §4).

Multi-head models: every head gets its own candidate distribution (replacement shape
(B, K, H, T_y, T_x)); JSD between attention distributions — in the objective and in the
report — is taken between head means, the quantity every per-step summary uses (docs/design.md §3);
all heads of a candidate start from the same noise.

``[ablation.adversarial] scores``: registered step scores (:mod:`attnstudy.analysis.step_scores`)
of the chosen adversary's output p̃ against p, from the final evaluation that gives its TVD (no
extra pass): columns ``adversarial_<score>``, NaN where no adversary was found, as that TVD.

Cost: every iteration of either solver is one forward + backward of the output layers over N × K
rows, so a search costs ``steps`` such passes per batch whatever its size (the batching is what keeps it
affordable: one optimiser per step was ~10× slower on a 4-example batch).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from attnstudy.analysis.catalogue import (
    KEY_CONTEXT,
    AblationSpec,
    Capture,
    ExampleColumn,
    Figure,
    MapView,
    OutputChangeParams,
    Stat,
    Thresholds,
    VerdictRole,
)
from pydantic import (
    Field,
    SerializationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from torch import Tensor

from attnstudy.models import Seq2Seq, eval_mode, gradients_in_eval

from .. import adversarial_rprop as rprop_solver
from .. import adversarial_steps as solver_steps
from .._chunks import ELEMENT_BUDGET, rows_given_attention
from ..adversarial_objective import (  # noqa: F401 (re-exported: tests and benchmarks name them here)
    _fixed_terms,
    _objective_and_grad,
    _row_objective,
    _row_objective_reference,
)
from ..batch import AblationContext, PreparedBatch, step_generator
from ..random_streams import LEGACY, CounterStreams, normals
from ..step_scores import score_columns, score_stats

NAME = "adversarial"


class AdversarialParams(OutputChangeParams):
    """``[ablation.adversarial]``: Jain & Wallace (2019) ``AdversaryMulti`` search settings, the
    solver that minimises its objective, and ``scores``: registered step scores of the chosen
    adversary's output (module docstring).

    ``solver``: ``"rprop-1"`` (the default, :mod:`attnstudy.analysis.adversarial_rprop`) or
    ``"jw"``, Jain & Wallace's Adam with AMSGrad at learning rate ``lr``; ``steps`` is the chosen
    solver's iterations (default 80 for rprop-1, 500 for jw). ``lr`` with rprop-1 is refused (it
    would be unused). With ``"jw"`` the solver is left out of the resolved settings, so its key
    and logged params are those of every run stored before the setting existed; with
    ``"rprop-1"`` ``lr`` is left out.
    """

    k: int = Field(5, ge=1, le=1000, description="candidate distributions per step")
    solver: str = Field(
        "rprop-1", description="rprop-1 (smoothed resilient propagation) or jw (J&W's Adam)"
    )
    # the rprop-1 default, adversarial_rprop.STEPS (the SPEC is read without imports; a test
    # holds the two equal); 500 for jw (_solvers_defaults)
    steps: int = Field(
        80, ge=1, le=1_000_000, description="iterations of the solver (rprop-1: 80, jw: 500)"
    )
    lr: float = Field(0.01, gt=0, le=100, description="Adam learning rate (amsgrad), solver = 'jw'")
    lam: float = Field(500.0, ge=0, le=1e9, description="weight λ of the output-change hinge")
    eps_opt: float = Field(0.01, ge=0, le=1, description="TVD hinge ε during the search")
    eps_eval: float = Field(0.05, ge=0, le=1, description="TVD threshold ε for keeping a candidate")
    init_sd: float = Field(3.0, ge=0, le=100, description="σ of the initial logit noise")

    @model_validator(mode="before")
    @classmethod
    def _solvers_defaults(cls, data):
        if isinstance(data, dict) and data.get("solver") == "jw" and "steps" not in data:
            data = {**data, "steps": 500}  # Jain & Wallace's 500 Adam iterations
        return data

    @field_validator("scores")
    @classmethod
    def _own_columns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # ("skipped" is refused by OutputChangeParams for every ablation)
        taken = [n for n in value if n in ("found", "n_kept", "max_jsd", "max_tvd")]
        if taken:
            raise ValueError(
                f"step score {taken[0]!r} would replace column adversarial_{taken[0]}; "
                "register it under another name"
            )
        return value

    @field_validator("solver")
    @classmethod
    def _known_solver(cls, value: str) -> str:
        if value not in ("rprop-1", "jw"):
            raise ValueError(f"unknown solver {value!r}; valid: rprop-1, jw")
        return value

    @field_validator("lr")
    @classmethod
    def _jw_only(cls, value: float, info) -> float:
        # runs for a given lr only (defaults are not validated); solver is validated before it
        solver = info.data.get("solver", "jw")
        if solver != "jw":
            raise ValueError(
                f"the learning rate of solver = 'jw' (Adam), but solver = '{solver}'; set "
                "solver = 'jw' to use it"
            )
        return value

    @model_serializer(mode="wrap")
    def _solvers_settings_only(self, handler, info: SerializationInfo):
        # (replaces OutputChangeParams' serializer, whose rule is kept: no scores, no key).
        # rprop-1 has no lr: never written (its absence reads back as the default, unused).
        # "jw" is left out of the key form only (AblationConfig.resolved: context key=True),
        # so a J&W run keeps the key and params of the runs stored before the setting; every
        # other dump keeps it, or a config sent to a worker would come back as rprop-1
        data = handler(self)
        unused = () if self.solver == "jw" else ("lr",)
        if self.solver == "jw" and (info.context or {}).get(KEY_CONTEXT):
            unused += ("solver",)
        unused += () if self.scores else ("scores",)
        for name in unused:
            data.pop(name, None)
        return data


SPEC = AblationSpec(
    name="adversarial",
    run="attnstudy.analysis.ablations.adversarial:run",
    params=AdversarialParams,
    more_stats="attnstudy.analysis.ablations.adversarial:more_stats",
    stats={
        "max_jsd": Stat(
            "adversarial_max_jsd",
            label="adversarial max JSD (nats)",
            unit="nats (≤ ln 2)",
            question="unique",
            direction="lower",
            order=61,
            verdict=VerdictRole(
                "unique",
                rule=Thresholds("unique_jsd", "unique_jsd"),
                phrase="on average {fmt} nats JSD from the model's own (at most ln 2 ≈ 0.693)",
            ),
        ),
        "found_rate": Stat(
            "adversarial_found",
            label="adversary found within ε",
            question="unique",
            direction="lower",
            order=60,
            verdict=VerdictRole(
                "unique",
                rule=Thresholds("unique_found", "unique_found"),
                phrase="for {pct} of decoder steps an attention distribution keeps the output "
                "within{eps} (TVD)",
                summary="an attention far from the model's gives the same output at{span} of steps",
            ),
        ),
    },
    figure=Figure(
        "adversarial",
        "Adversarial attention: how different can attention be for the same output?",
        "Jain & Wallace (2019) fig. 5 design: per step, the largest JSD (nats; the dotted line is "
        "the ceiling ln 2) between the model's attention and an alternative whose output stays "
        "within ε (TVD), by the step's largest attention weight. High values mean very different "
        "attention gives the same output: attention is then not a unique explanation. Steps "
        "where no alternative was found are not drawn (their share is the found rate in the "
        "tables).",
    ),
    definitions=(
        (
            "adversarial attention",
            "K rows optimised to maximise JSD from α_t while the output stays within ε (TVD) "
            "(Jain & Wallace 2019, §4.2, AdversaryMulti).",
        ),
    ),
    examples=(
        ExampleColumn(
            "adv_jsd",
            "adversarial max JSD",
            "adversarial_max_jsd",
            unit="nats (≤ ln 2)",
            undefined="no adversarial distribution within ε of the output at any step (or one "
            "source position)",
            step_label="adv. JSD",
        ),
        ExampleColumn(
            "adv_found",
            "adversary found",
            "adversarial_found",
            unit="share of steps (0–1)",
            undefined="not searched: a source of one position",
        ),
    ),
    captures=Capture(
        "attnstudy.analysis.heatmaps:capture_adversarial",
        "attnstudy.analysis.heatmaps:adversarial_maps",
        (
            MapView(
                "adversarial",
                "adversarial attention",
                "the alternative with the largest JSD whose output stays within ε{eps} (grey "
                "row: none found)",
            ),
        ),
    ),
    order=60,
    description="K attention distributions as far (JSD) from α_t as possible with the output within ε "
    "(TVD); max JSD, share found",
    reference="Jain & Wallace 2019, §4.2 (AdversaryMulti)",
)


@dataclass(frozen=True)
class EarlyStop:
    """Per-row early stopping of the search (off unless passed; not an experiment setting, so
    the ablation's key and results are those of the plain search).

    Every ``every`` iterations, a row whose loss (at the parameters before that iteration's
    update) improved by at most ``tol × max(1, |loss|)`` since the previous check keeps its θ
    after that update and leaves the search.
    """

    tol: float = 1e-4
    every: int = 20


@dataclass
class AdversarialResult:
    """Outcome of the search for the searched steps of one batch.

    N searched rows = real steps whose source has ≥ 2 valid positions.

    Attributes:
        b_idx, t_idx: long (N,), batch row and decoder step of each searched row.
        candidates: (N, K, H, T_x) final adversarial distributions (0 at padding).
        jsd: (N, K) JSD(head-mean α̃_k, head-mean α), nats.
        tvd: (N, K) TVD(p̃_k, p).
        objective: (N,) the per-row loss at the final parameters (the minimised quantity).
        kept: bool (N, K), TVD ≤ ε_eval.
        best: long (N,), index of the kept candidate with the largest JSD, −1 if none kept.
        eps_opt, eps_eval: the two thresholds used.
        scores: step score → float64 (N,), the score of the chosen adversary's output (candidate
            ``best``) against p, NaN where none was kept (``params.scores``; empty by default).
    """

    b_idx: Tensor
    t_idx: Tensor
    candidates: Tensor
    jsd: Tensor
    tvd: Tensor
    objective: Tensor
    kept: Tensor
    best: Tensor
    eps_opt: float
    eps_eval: float
    scores: dict[str, Tensor] = field(default_factory=dict)


def _requires_grad_off(model: Seq2Seq) -> list[bool]:
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    return flags


def _restore_requires_grad(model: Seq2Seq, flags: list[bool]) -> None:
    for p, f in zip(model.parameters(), flags):
        p.requires_grad_(f)


def _searched_rows(batch: PreparedBatch) -> tuple[Tensor, Tensor]:
    """(b_idx, t_idx) of real steps whose source has at least two valid positions."""
    tr = batch.trace
    mask = tr.step_mask & (tr.src_lengths >= 2)[:, None]
    return mask.nonzero(as_tuple=True)


def _initial_logits(
    batch: PreparedBatch,
    b_idx: Tensor,
    t_idx: Tensor,
    acfg: AdversarialParams,
    seed: int,
    heads: int,
    rng: str = "counter-1",
) -> Tensor:
    """θ₀ = log(1/L) + N(0, σ²) on the L valid positions, 0 at padding. Shape (N, K, H, T_x).

    The noise of row (example, step) comes from its stream (seed, example id, step,
    "adversarial") and is drawn for the valid positions only, so it does not depend on the
    batch's padding or composition: counter-based (``rng = "counter-1"``: normals 0 … K·L − 1 of
    the stream, :func:`~attnstudy.analysis.random_streams.normals`, candidate k's position j
    normal k·L + j, every row in one call; θ₀ computed in float64, then cast) or, in the legacy
    scheme, ``torch.randn`` from ``step_generator``. Every head of a candidate starts from the same noise: with
    the head-mean JSD objective, heads started at different random points tend to settle on
    different vertices, a local maximum whose head mean stays close to α.
    """
    tr = batch.trace
    t_x = tr.src.size(1)
    # drawn and assembled on the CPU (the generators' device), moved to the model's device once
    cpu = torch.device("cpu")
    out = torch.zeros(len(b_idx), acfg.k, heads, t_x, dtype=tr.logits.dtype, device=cpu)
    if rng != LEGACY:
        ids = batch.example_ids
        keys = CounterStreams(seed, ids, NAME).keys(b_idx.tolist(), t_idx.tolist())
        lengths_np = tr.src_lengths.cpu()[b_idx.cpu()].numpy().astype(np.int64)  # (N,)
        z = normals(keys, acfg.k * lengths_np)  # every row's K · L normals, concatenated
        drawn = np.arange(t_x) < lengths_np[:, None, None]  # (N, 1, T_x)
        drawn = np.broadcast_to(drawn, (len(lengths_np), acfg.k, t_x))
        theta = np.zeros((len(lengths_np), acfg.k, t_x))
        theta[drawn] = z * acfg.init_sd
        theta += np.log(1.0 / np.maximum(lengths_np, 1))[:, None, None]
        theta[~drawn] = 0.0
        out[...] = torch.from_numpy(theta).to(cpu, out.dtype)[:, :, None, :]
        return out.to(tr.src.device)
    lengths = tr.src_lengths.tolist()
    for n, (b, t) in enumerate(zip(b_idx.tolist(), t_idx.tolist())):
        length = int(lengths[b])
        gen = step_generator(seed, batch.examples[b].id, t, NAME)
        noise = (
            torch.randn((acfg.k, 1, length), generator=gen, device=gen.device).expand(
                acfg.k, heads, length
            )
            * acfg.init_sd
        )
        out[n, :, :, :length] = (math.log(1.0 / length) + noise).to(out.dtype)
    return out.to(tr.src.device)


def _optimise(
    model: Seq2Seq,
    batch: PreparedBatch,
    b_idx: Tensor,
    t_idx: Tensor,
    params: AdversarialParams,
    ctx: AblationContext,
    steps: int | None = None,
    plain: bool = False,
    early_stop: EarlyStop | None = None,
    monitor: Callable[[int, Callable[[], tuple[Tensor, Tensor, Tensor]]], None] | None = None,
) -> AdversarialResult:
    """Run the batched search over the rows (b_idx, t_idx) (model already in eval, no param grads).

    ``params.solver``: ``"jw"``, Adam with AMSGrad on the objective, or ``"rprop-1"``,
    :mod:`~attnstudy.analysis.adversarial_rprop` (Rprop on the objective smoothed by that
    iteration's (δ, τ), then the bound on the logits' spread), for ``params.steps`` iterations
    (``steps`` overrides it).

    ``plain``: the reference — the objective's plain form :func:`_row_objective_reference`
    under autograd, stepped by ``torch.optim.Adam`` (``torch.optim.Rprop``) — instead of the fast
    path: the fused objective's loss and gradient from :func:`_objective_and_grad` (autograd
    through the model only), stepped by :class:`..adversarial_steps.AmsGrad`
    (:class:`.adversarial_rprop.Rprop`), the same update. The final evaluation is the fused :func:`_row_objective` (the plain one for
    ``plain``) of J&W's objective, whichever the solver.

    ``early_stop`` (:class:`EarlyStop`): every ``every`` iterations, a row whose loss (at the
    parameters before that iteration's update) improved by at most ``tol × max(1, |loss|)``
    since the previous check keeps its θ after that update and leaves the search; the others go
    on with their own Adam moments (sliced, unchanged). A row's result
    then depends only on its own trajectory, as without early stopping (``"jw"`` only).

    ``monitor`` (benchmarks: a convergence curve): after every iteration, ``monitor(i, evaluate)``
    with i the iterations done and ``evaluate()`` J&W's objective at the current θ as the final
    evaluation computes it: (objective (N,), JSD (N, K), output TVD (N, K)), under no_grad; the
    search's result does not depend on whether or when it is called.

    Raises:
        ValueError: ``early_stop`` with the rprop-1 solver, or with ``monitor``.
    """
    acfg = params
    rprop = acfg.solver == rprop_solver.NAME
    if early_stop is not None and (rprop or monitor is not None):
        raise ValueError(
            "early stopping is a setting of J&W's solver (solver = 'jw') and has no monitor"
        )
    n_iter = acfg.steps if steps is None else steps
    theta_all = _initial_logits(
        batch, b_idx, t_idx, acfg, ctx.seed, batch.trace.attention.size(1), rng=ctx.rng
    )
    # masked once: at −inf the softmax is exactly 0, its gradient exactly 0, and Adam leaves
    # θ = −inf there (a zero moment moves nothing)
    theta_all.masked_fill_(batch.trace.pad_mask[b_idx][:, None, None, :], float("-inf"))
    theta = theta_all.clone()
    optim, adam = solver_steps.optimisers(theta, acfg.lr, plain=plain, rprop=rprop)

    final_logits: list[Tensor] = []  # the final evaluation's logits (N, K, V), for the scores
    prepared = functools.partial(
        _row_functions,
        model=model,
        batch=batch,
        b_idx=b_idx,
        t_idx=t_idx,
        acfg=acfg,
        ctx=ctx,
        plain=plain,
        final_logits=final_logits,
    )

    active = torch.arange(len(b_idx), device=b_idx.device)
    whole, step = prepared(active)
    previous = None
    with gradients_in_eval():
        for it in range(n_iter):
            smooth = rprop_solver.smoothing(it, n_iter) if rprop else None
            loss = solver_steps.iteration(step, theta, smooth, optim=optim, adam=adam, rprop=rprop)
            if monitor is not None:
                monitor(it + 1, functools.partial(_evaluate, whole, theta))
            if early_stop is None or it % early_stop.every:
                continue
            done, previous = solver_steps.stopped(loss, previous, early_stop.tol)
            if done is None or not bool(done.any()):
                continue
            # the rows that stopped keep their θ (after this iteration's update); the others
            # go on with their slice of θ and of Adam's moments
            theta_all[active[done]] = theta.detach()[done]
            keep = ~done
            active, previous = active[keep], previous[keep]
            if active.numel() == 0:
                break
            theta = solver_steps.keep_rows(keep, theta, optim=optim, adam=adam)
            _, step = prepared(active)
    if active.numel():
        theta_all[active] = theta.detach()
    with torch.no_grad():
        evaluated = whole(theta_all)
    return _result(batch, b_idx, t_idx, acfg=acfg, evaluated=evaluated, final_logits=final_logits)


def _row_functions(
    rows: Tensor,
    *,
    model: Seq2Seq,
    batch: PreparedBatch,
    b_idx: Tensor,
    t_idx: Tensor,
    acfg: AdversarialParams,
    ctx: AblationContext,
    plain: bool,
    final_logits: list[Tensor],
):
    """(value, step) of the rows ``rows``: the per-row objective (its value, the final
    evaluation, which keeps its logits in ``final_logits``) and what one iteration calls
    (the plain objective under autograd, or the loss and gradient of
    :func:`_objective_and_grad`)."""
    logits_of = rows_given_attention(model, batch.trace, b_idx[rows], t_idx[rows], ctx.chunk_rows)

    def kept_logits(cand: Tensor) -> Tensor:
        final_logits[:] = [logits_of(cand)]
        return final_logits[0]

    if plain:

        def reference(th: Tensor, smooth=None, logits=logits_of):
            return _row_objective_reference(
                logits, batch, th, b_idx[rows], t_idx[rows], acfg, smoothing=smooth
            )

        return functools.partial(reference, logits=kept_logits), reference
    fixed = _fixed_terms(batch, b_idx[rows], t_idx[rows])
    return (
        lambda th: _row_objective(
            kept_logits, batch, th, b_idx[rows], t_idx[rows], acfg, fixed=fixed
        ),
        lambda th, smooth=None: _objective_and_grad(logits_of, th, fixed, acfg, smooth),
    )


def _result(
    batch: PreparedBatch,
    b_idx: Tensor,
    t_idx: Tensor,
    *,
    acfg: AdversarialParams,
    evaluated: tuple[Tensor, Tensor, Tensor, Tensor],
    final_logits: list[Tensor],
) -> AdversarialResult:
    """The search's result from its final evaluation ``evaluated`` = (objective (N,), JSD (N, K),
    output TVD (N, K), candidates (N, K, H, T_x)): the kept candidates (TVD ≤ ε_eval), each row's
    best (largest JSD among them; −1: none kept) and its step scores from the evaluation's
    logits ``final_logits`` (emptied)."""
    loss, div, out_tvd, cand = evaluated
    kept = out_tvd <= acfg.eps_eval
    score = div.masked_fill(~kept, float("-inf"))
    best = torch.where(kept.any(-1), score.argmax(-1), torch.full_like(b_idx, -1))
    scores = {}  # the step scores of each row's chosen adversary against p (NaN: none kept)
    if acfg.scores:
        chosen = final_logits[0][torch.arange(len(b_idx), device=best.device), best.clamp(min=0)]
        p_orig = torch.softmax(batch.trace.logits[b_idx, t_idx], -1)
        target = batch.trace.tgt_out[b_idx, t_idx]
        scores = score_columns("", acfg.scores, chosen.softmax(-1), p_orig, target, keep=best >= 0)
    final_logits.clear()
    return AdversarialResult(
        b_idx,
        t_idx,
        cand.detach(),
        div.detach(),
        out_tvd.detach(),
        loss.detach(),
        kept,
        best,
        acfg.eps_opt,
        acfg.eps_eval,
        scores,
    )


def _evaluate(whole, theta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """J&W's objective at θ as the final evaluation computes it: (objective, JSD, output TVD)."""
    with torch.no_grad():
        loss, div, out_tvd, _ = whole(theta.detach())
    return loss, div, out_tvd


def _check(model: Seq2Seq, batch: PreparedBatch) -> None:
    if not model.has_attention or batch.trace.attention is None:
        raise ValueError(
            "adversarial attention needs attention weights; the 'none' model has none "
            "(skip this ablation for it)"
        )


def search_adversarial(
    model: Seq2Seq,
    batch: PreparedBatch,
    params: AdversarialParams,
    ctx: AblationContext,
    steps: int | None = None,
    budget: int | None = None,
    *,
    early_stop: EarlyStop | None = None,
) -> AdversarialResult:
    """Batched ``AdversaryMulti`` search over every searchable step of a batch (J&W 2019, §4.2).

    Args:
        model: the model (put in eval mode; its parameters get no gradients — ``requires_grad``
            is switched off during the search — and both are restored afterwards).
        batch: prepared batch; its trace gives α (B, H, T_y, T_x) and p (B, T_y, V).
        params: K, solver, iterations, lr, λ, ε_opt, ε_eval, σ.
        ctx: ``seed`` seeds the initial noise; ``chunk_rows`` sizes the output-layer chunks.
        steps: override of ``params.steps`` (the solver's iterations).
        budget: elements of one chunk's (N', K, K, T_x) tensors (default
            :data:`~attnstudy.analysis._chunks.ELEMENT_BUDGET`): the rows are searched in
            chunks of N' rows, so a long example's memory stays bounded; a row's result does not
            depend on its chunk.
        early_stop: per-row early stopping (:class:`EarlyStop`); None (the default): every row
            runs all the iterations.

    Returns:
        :class:`AdversarialResult` over the N real steps with ≥ 2 valid source positions.

    Raises:
        ValueError: for the ``none`` model (no attention to replace); ``early_stop`` with the
            rprop-1 solver.
    """
    _check(model, batch)
    b_idx, t_idx = _searched_rows(batch)
    h, t_x = batch.trace.attention.size(1), batch.trace.src.size(1)
    # rows are independent (their own candidates, noise and Adam moments): in chunks whose
    # (N', K, K, T_x) pairwise-JSD and (N', K, H, T_x) candidate tensors fit the budget
    size = max(1, (budget or ELEMENT_BUDGET) // (params.k * max(params.k, h) * t_x))
    flags = _requires_grad_off(model)
    try:
        with eval_mode(model):
            if len(b_idx) <= size:
                return _optimise(
                    model, batch, b_idx, t_idx, params, ctx, steps, early_stop=early_stop
                )
            parts = [
                _optimise(
                    model,
                    batch,
                    b_idx[s : s + size],
                    t_idx[s : s + size],
                    params,
                    ctx,
                    steps,
                    early_stop=early_stop,
                )
                for s in range(0, len(b_idx), size)
            ]
    finally:
        _restore_requires_grad(model, flags)
    return _concat(parts, b_idx, t_idx, params, h, t_x)


def _concat(
    parts: list[AdversarialResult],
    b_idx: Tensor,
    t_idx: Tensor,
    params: AdversarialParams,
    heads: int,
    t_x: int,
) -> AdversarialResult:
    """One :class:`AdversarialResult` of the rows (b_idx, t_idx) from the results of its
    consecutive parts."""
    dev = b_idx.device

    def cat(name: str, empty: Tensor) -> Tensor:
        return torch.cat([getattr(p, name) for p in parts]) if parts else empty

    def cat_scores(name: str) -> Tensor:
        empty = torch.zeros(0, dtype=torch.float64, device=dev)
        return torch.cat([p.scores[name] for p in parts]) if parts else empty

    return AdversarialResult(
        b_idx,
        t_idx,
        cat("candidates", torch.zeros(0, params.k, heads, t_x, device=dev)),
        cat("jsd", torch.zeros(0, params.k, device=dev)),
        cat("tvd", torch.zeros(0, params.k, device=dev)),
        cat("objective", torch.zeros(0, device=dev)),
        cat("kept", torch.zeros(0, params.k, dtype=torch.bool, device=dev)),
        cat("best", torch.zeros(0, dtype=torch.long, device=dev)),
        params.eps_opt,
        params.eps_eval,
        {n: cat_scores(n) for n in params.scores},
    )


def adversarial_loop_reference(
    model: Seq2Seq,
    batch: PreparedBatch,
    params: AdversarialParams,
    ctx: AblationContext,
    steps: int | None = None,
    *,
    early_stop: EarlyStop | None = None,
) -> AdversarialResult:
    """Plain-loop reference of :func:`search_adversarial`: one step (K candidates) at a time.

    Each step gets its own parameters and its own Adam optimiser, seeded identically; used to
    check that the batched search gives every row its own trajectory.

    Args / Returns / Raises: as :func:`search_adversarial`.
    """
    _check(model, batch)
    b_all, t_all = _searched_rows(batch)
    dev = batch.trace.src.device
    flags = _requires_grad_off(model)
    parts = []
    try:
        with eval_mode(model):
            for b, t in zip(b_all.tolist(), t_all.tolist()):
                parts.append(
                    _optimise(
                        model,
                        batch,
                        torch.tensor([b], device=dev),
                        torch.tensor([t], device=dev),
                        params,
                        ctx,
                        steps,
                        plain=True,
                        early_stop=early_stop,
                    )
                )
    finally:
        _restore_requires_grad(model, flags)
    return _concat(
        parts, b_all, t_all, params, batch.trace.attention.size(1), batch.trace.src.size(1)
    )


def adversarial_table(batch: PreparedBatch, result: AdversarialResult) -> pd.DataFrame:
    """Per-step table of a search result.

    Columns: ``example_id``, ``step``, ``adversarial_skipped`` (source with one valid position:
    not searched), ``adversarial_found`` (nullable boolean: some candidate has TVD ≤ ε_eval;
    <NA> when skipped),
    ``adversarial_n_kept``, ``adversarial_max_jsd`` (max JSD(α̃, α) among kept candidates, nats,
    NaN if none), ``adversarial_max_tvd`` (the output TVD of that candidate, NaN if none), then
    ``adversarial_<score>`` for each score of ``result.scores`` (that candidate's output scored
    against the unmodified step, NaN if none).
    ε_opt and ε_eval are in ``df.attrs`` (and in the ablation's params for logging).
    """
    tr = batch.trace
    b_real, t_real = tr.step_mask.nonzero(as_tuple=True)
    n = len(b_real)
    pos = {(b, t): i for i, (b, t) in enumerate(zip(b_real.tolist(), t_real.tolist()))}
    max_jsd = np.full(n, np.nan)
    max_tvd = np.full(n, np.nan)
    found = np.zeros(n, dtype=bool)
    n_kept = np.zeros(n, dtype=np.int64)
    skipped = np.ones(n, dtype=bool)
    kept_n = result.kept.sum(-1).tolist()  # host copies, once
    best, r_jsd, r_tvd = result.best.tolist(), result.jsd.tolist(), result.tvd.tolist()
    r_scores = {name: v.tolist() for name, v in result.scores.items()}
    scored = {name: np.full(n, np.nan) for name in r_scores}
    for r, (b, t) in enumerate(zip(result.b_idx.tolist(), result.t_idx.tolist())):
        i = pos[(b, t)]
        skipped[i] = False
        n_kept[i] = int(kept_n[r])
        k = int(best[r])
        if k >= 0:
            found[i] = True
            max_jsd[i] = float(r_jsd[r][k])
            max_tvd[i] = float(r_tvd[r][k])
            for name, v in r_scores.items():
                scored[name][i] = v[r]
    df = pd.DataFrame(
        {
            "example_id": [batch.examples[b].id for b in b_real.tolist()],
            "step": t_real.cpu().numpy(),
            f"{NAME}_skipped": skipped,
            # missing (<NA>) where not searched, so a found rate counts searched steps only
            f"{NAME}_found": pd.array(np.where(skipped, None, found), dtype="boolean"),
            f"{NAME}_n_kept": n_kept,
            f"{NAME}_max_jsd": max_jsd,
            f"{NAME}_max_tvd": max_tvd,
            **{f"{NAME}_{name}": v for name, v in scored.items()},
        }
    )
    df.attrs[f"{NAME}_eps_opt"] = result.eps_opt
    df.attrs[f"{NAME}_eps_eval"] = result.eps_eval
    return df


def run(
    model: Seq2Seq, batch: PreparedBatch, params: AdversarialParams, ctx: AblationContext
) -> pd.DataFrame:
    """Adversarial attention per decoder step (Jain & Wallace 2019, §4.2, ``AdversaryMulti``).

    Args:
        model: the model (eval mode and ``requires_grad`` flags restored afterwards).
        batch: prepared batch (B examples, trace over the chosen prefix).
        params: the search settings and ``scores``. ctx: ``seed``, ``chunk_rows``.

    Returns:
        One row per real decoder step, columns as :func:`adversarial_table`.

    Raises:
        ValueError: for the ``none`` model (no attention).
        UnknownStepScoreError: a score of ``params.scores`` is not registered.
    """
    return adversarial_table(batch, search_adversarial(model, batch, params, ctx))


def more_stats(columns) -> dict:
    """The statistics of the step scores named in ``[ablation.adversarial] scores``: their mean
    over the steps where an adversary was found (logged, not a report column)."""
    return score_stats(NAME, columns)


def adversarial_rows(
    batch: PreparedBatch, result: AdversarialResult, example: int | str
) -> dict[str, np.ndarray]:
    """Original and best adversarial attention of one example, for a heatmap.

    Args:
        batch: the batch the result belongs to.
        result: from :func:`search_adversarial`.
        example: batch row or example id.

    Returns:
        dict with ``original`` (T, L) head-mean attention over the example's T real steps and L
        valid positions; ``adversarial`` (T, L) head mean of the best kept candidate (NaN rows
        where none was found or the step was not searched); ``original_heads`` and
        ``adversarial_heads`` (H, T, L); ``found`` bool (T,); ``jsd`` and ``tvd`` (T,).

    Raises:
        KeyError: for an unknown example id.
    """
    if isinstance(example, str):
        ids = batch.example_ids
        if example not in ids:
            raise KeyError(f"example {example!r} is not in this batch")
        example = ids.index(example)
    tr = batch.trace
    n_steps = int(tr.step_mask[example].sum())
    length = int(tr.src_lengths[example])
    orig = tr.attention[example, :, :n_steps, :length].cpu().numpy()  # (H, T, L)
    adv = np.full_like(orig, np.nan)
    found = np.zeros(n_steps, dtype=bool)
    div = np.full(n_steps, np.nan)
    dist = np.full(n_steps, np.nan)
    for r, (b, t) in enumerate(zip(result.b_idx.tolist(), result.t_idx.tolist())):
        k = int(result.best[r])
        if b != example or k < 0 or t >= n_steps:
            continue
        adv[:, t] = result.candidates[r, k, :, :length].cpu().numpy()
        found[t] = True
        div[t] = float(result.jsd[r, k])
        dist[t] = float(result.tvd[r, k])
    return {
        "original": orig.mean(0),
        "adversarial": adv.mean(0),
        "original_heads": orig,
        "adversarial_heads": adv,
        "found": found,
        "jsd": div,
        "tvd": dist,
    }
