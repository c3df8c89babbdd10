"""Step scores: what an ablation reports about one decoder step's output, as a registry.

A step score compares the output distribution of a modified step (permuted, uniform or erased
attention, an occluded source token…) with the unmodified step's, or describes the modified one
alone: the probability of the emitted token, the entropy, KL and TVD against the unmodified step,
whether the argmax flips. Every ablation that reports an output change computes it through
:func:`step_score` (permutation, uniform, erase_max, leave-one-out, occlusion; the adversarial
search's TVD is part of its objective and computed there), and a score registered with
:func:`register_step_score` is usable wherever a score name is a parameter
(``[ablation.occlusion] score = "…"``, the ``scores`` setting of permutation, uniform, erase_max,
importance and adversarial), as inseq's ``register_step_function`` (Sarti et al. 2023).

Every score function has the signature ``fn(probs, reference, target) -> Tensor``:

    probs:     (..., V) the output distribution of the modified step (rows sum to 1);
    reference: (..., V) the unmodified step's distribution, broadcastable to ``probs``;
    target:    long (...) the emitted token ŷ_t (the prefix token at the step), broadcastable
               to ``probs.shape[:-1]``;
    returns:   (...) one float per step (or per step and replacement), in ``probs``' dtype.

Example (a registered score, then used by the occlusion ablation)::

    from attnstudy.analysis.step_scores import register_step_score

    def top_prob_drop(probs, reference, target):
        "Drop of the unmodified step's top probability: p_ref(argmax p_ref) − p(argmax p_ref)."
        top = reference.argmax(-1, keepdim=True).expand(*probs.shape[:-1], 1)
        return (reference.expand_as(probs).gather(-1, top) - probs.gather(-1, top)).squeeze(-1)

    register_step_score("top_prob_drop", top_prob_drop, unit="probability")
    # experiment file: [ablation.occlusion] score = "top_prob_drop"
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .divergences import _smallest_positive, entropy, jsd, tvd

StepScoreFn = Callable[[Tensor, Tensor, Tensor], Tensor]
"""``fn(probs (..., V), reference (..., V), target long (...)) -> (...)`` (module docstring)."""


class UnknownStepScoreError(ValueError):
    """A step score name that is not registered (the message lists the choices)."""


@dataclass(frozen=True)
class StepScore:
    """One registered step score.

    Attributes:
        name: its name (a parameter value such as ``[ablation.occlusion] score``).
        fn: the function (:data:`StepScoreFn`).
        unit: what its numbers measure (``"probability"``, ``"nats"``…).
        description: one line for the docs.
    """

    name: str
    fn: StepScoreFn
    unit: str = ""
    description: str = ""


_REGISTRY: dict[str, StepScore] = {}


def register_step_score(
    name: str,
    fn: StepScoreFn,
    *,
    unit: str = "",
    description: str = "",
    overwrite: bool = False,
) -> StepScore:
    """Register a step score under ``name``.

    Args:
        name: a lower-case identifier.
        fn: ``fn(probs, reference, target) -> Tensor``: ``probs`` (..., V) the modified step's
            output distribution, ``reference`` (..., V) the unmodified step's (broadcastable),
            ``target`` long (...) the emitted token (broadcastable to ``probs.shape[:-1]``);
            returns (...), one number per step.
        unit: what its numbers measure. description: one line (default: ``fn``'s docstring's
            first line).
        overwrite: replace a user-registered score of that name.

    Returns:
        The :class:`StepScore`.

    Raises:
        ValueError: the name is not a lower-case identifier, is built in (the ablations' stored
            numbers are named after the built-in scores: a replaced ``tvd`` would store another
            number under that name), or is taken (without ``overwrite``).
    """
    if not name.isidentifier() or not name.islower():
        raise ValueError(f"step score name {name!r} must be a lower-case identifier")
    if name in globals().get("BUILT_IN", ()):
        raise ValueError(f"step score {name!r} is built in; register yours under another name")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"a step score named {name!r} is already registered; pass overwrite=True")
    doc = (fn.__doc__ or "").strip().splitlines()
    score = StepScore(name, fn, unit, description or (doc[0] if doc else ""))
    _REGISTRY[name] = score
    return score


def unregister_step_score(name: str) -> None:
    """Remove a registered step score (tests, notebooks); a built-in one cannot be removed.

    Raises:
        ValueError: ``name`` is built in.
    """
    if name in BUILT_IN:
        raise ValueError(f"step score {name!r} is built in and cannot be unregistered")
    _REGISTRY.pop(name, None)


def list_step_scores() -> list[str]:
    """Every registered step score's name, built-in ones first."""
    return list(_REGISTRY)


def get_step_score(name: str) -> StepScore:
    """The registered step score ``name``.

    Raises:
        UnknownStepScoreError: not registered (the message lists the choices).
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownStepScoreError(
            f"unknown step score {name!r}; registered: {', '.join(_REGISTRY)} "
            "(register one with attnstudy.analysis.step_scores.register_step_score)"
        ) from None


def step_score(name: str, probs: Tensor, reference: Tensor, target: Tensor | None = None) -> Tensor:
    """Compute the registered step score ``name``.

    Args:
        name: a registered score. probs: (..., V). reference: (..., V), broadcastable.
        target: long (...), broadcastable to ``probs.shape[:-1]``; None for scores that do not
            read it (``tvd``, ``kl``, ``jsd``, ``entropy``, ``flip``) — a score that reads it
            then raises.

    Returns:
        (...), shape ``probs.shape[:-1]`` (broadcast with ``reference``'s).

    Raises:
        UnknownStepScoreError: ``name`` is not registered.
    """
    return get_step_score(name).fn(probs, reference, target)


def _target_prob(probs: Tensor, target: Tensor | None) -> Tensor:
    if target is None:
        raise ValueError("this step score reads the emitted token: pass target=")
    index = target.broadcast_to(probs.shape[:-1]).unsqueeze(-1)
    return probs.gather(-1, index).squeeze(-1)


def _probability(probs: Tensor, reference: Tensor, target: Tensor) -> Tensor:
    """p(ŷ_t): the probability of the emitted token under the modified step."""
    return _target_prob(probs, target)


def _log_probability(probs: Tensor, reference: Tensor, target: Tensor) -> Tensor:
    """log p(ŷ_t) (nats), the probability clamped at the smallest positive float."""
    return _target_prob(probs, target).clamp_min(_smallest_positive(probs.dtype)).log()


def _log_probability_drop(probs: Tensor, reference: Tensor, target: Tensor) -> Tensor:
    """log p_ref(ŷ_t) − log p(ŷ_t) (nats): Captum's occlusion attribution of the target."""
    ref = reference.broadcast_to(probs.shape)
    return _log_probability(ref, ref, target) - _log_probability(probs, probs, target)


def _entropy(probs: Tensor, reference: Tensor, target: Tensor) -> Tensor:
    """H(p) (nats) of the modified step's distribution."""
    return entropy(probs)


def _kl(probs: Tensor, reference: Tensor, target: Tensor) -> Tensor:
    """KL(p_ref ‖ p) (nats): the unmodified step's distribution against the modified one;
    0 · log 0 := 0, the modified probabilities clamped at the smallest positive float."""
    tiny = _smallest_positive(probs.dtype)
    ref = reference.broadcast_to(probs.shape)
    terms = ref * (ref.clamp_min(tiny).log() - probs.clamp_min(tiny).log())
    return torch.where(ref > 0, terms, torch.zeros_like(terms)).sum(-1)


def _tvd(probs: Tensor, reference: Tensor, target: Tensor) -> Tensor:
    """TVD(p, p_ref) = ½ Σ_v |p(v) − p_ref(v)| over the full vocabulary."""
    return tvd(probs, reference)


def _jsd(probs: Tensor, reference: Tensor, target: Tensor) -> Tensor:
    """JSD(p, p_ref) (nats, natural log)."""
    return jsd(probs, reference)


def _flip(probs: Tensor, reference: Tensor, target: Tensor) -> Tensor:
    """1 where argmax p differs from argmax p_ref, else 0 (in ``probs``' dtype). Ties: the first
    maximal position (``max(-1).indices``, the same index as ``argmax`` on the CPU, about twice
    as fast there)."""
    return (probs.max(-1).indices != reference.max(-1).indices).to(probs.dtype)


for _name, _fn, _unit in (
    ("probability", _probability, "probability"),
    ("log_probability", _log_probability, "nats"),
    ("log_probability_drop", _log_probability_drop, "nats"),
    ("entropy", _entropy, "nats"),
    ("kl", _kl, "nats"),
    ("tvd", _tvd, "probability (0–1)"),
    ("jsd", _jsd, "nats"),
    ("flip", _flip, "0 or 1"),
):
    register_step_score(_name, _fn, unit=_unit)

BUILT_IN = tuple(_REGISTRY)
"""The built-in step scores."""


def user_scores_payload() -> bytes | None:
    """The user-registered step scores (every one not built in), pickled by value for worker
    processes (``cloudpickle``: a function defined in a notebook or ``python -c`` travels as its
    code, which plain pickle cannot send to a ``spawn``-started or Ray worker; so does one defined
    in the user's own module file, which a Ray node need not have). None when there are none.
    :func:`register_payload` registers them in the worker.

    Raises:
        ValueError: a score's function cannot be pickled (the message names it).
    """
    user = {name: s for name, s in _REGISTRY.items() if name not in BUILT_IN}
    if not user:
        return None
    import cloudpickle

    # a score defined in the user's own module file (imported by their script or notebook)
    # travels by value too: a worker, a Ray node above all, may not have that file
    own = {m for s in user.values() if (m := _own_module(s.fn)) is not None}
    own = {m for m in own if m.__name__ not in cloudpickle.list_registry_pickle_by_value()}
    try:
        for module in own:
            cloudpickle.register_pickle_by_value(module)
        return cloudpickle.dumps(user)
    except Exception as err:  # a closure over an unpicklable object, …
        names = ", ".join(user)
        raise ValueError(
            f"the registered step scores ({names}) cannot be sent to worker processes "
            f"({type(err).__name__}: {err}); run with experiment.workers = 1"
        ) from None
    finally:
        for module in own:
            cloudpickle.unregister_pickle_by_value(module)


def _own_module(fn):
    """The module of ``fn`` when it is a user's own file (neither ``__main__``, which cloudpickle
    sends by value anyway, nor attnstudy, nor an installed package); else None."""
    import sys
    import sysconfig

    name = getattr(fn, "__module__", None) or ""
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    if module is None or path is None or name == "__main__" or name.split(".")[0] == "attnstudy":
        return None
    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    if any(path.startswith(p) for p in installed):
        return None
    return module


def register_payload(blob: bytes | None) -> None:
    """Register in this (worker) process the step scores of :func:`user_scores_payload`
    (replacing a user score of the same name; built-in ones are never in it)."""
    if not blob:
        return
    import pickle

    for name, score in pickle.loads(blob).items():
        _REGISTRY[name] = score


def markdown_table() -> str:
    """The registered step scores as a Markdown table (name, unit, what it computes)."""
    rows = ["| step score | unit | what it computes |", "|---|---|---|"]
    rows += [f"| `{s.name}` | {s.unit} | {s.description} |" for s in _REGISTRY.values()]
    return "\n".join(rows)


def score_columns(
    ablation: str, names, probs: Tensor, reference: Tensor, target: Tensor, *, keep: Tensor
) -> dict[str, Tensor]:
    """The extra step scores an ablation reports (its ``scores`` setting), one column each.

    Args:
        ablation: the column prefix (``"uniform"``, ``"erase_max"``, ``"permutation_median"``);
            ``""``: the score names alone (the adversarial search's per-row scores).
        names: registered step scores. probs: (B, T_y, V) modified outputs (or rows (N, V)), or
            (B, P, T_y, V). reference: (B, T_y, V) unmodified outputs (rows: (N, V)).
        target: long (B, T_y) (rows: (N,)), the emitted tokens.
        keep: bool (B, T_y) (rows: (N,)), or (B, P, T_y): the values to keep (the rest NaN).

    Returns:
        ``<ablation>_<score>`` → float64 (B, T_y); with P replacements, the median over those
        kept (NaN where none is).

    Raises:
        UnknownStepScoreError: a name is not registered.
    """
    out = {}
    many = probs.dim() == 4
    for name in names:
        fn = get_step_score(name).fn
        if many:
            v = fn(probs, reference.unsqueeze(1), target.unsqueeze(1)).double()
            v = v.masked_fill(~keep, float("nan")).cpu().numpy()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices → NaN
                v = torch.from_numpy(np.nanmedian(v, axis=1)).to(probs.device)  # as its TVD
        else:
            v = fn(probs, reference, target).double().masked_fill(~keep, float("nan"))
        out[f"{ablation}_{name}" if ablation else name] = v
    return out


def score_stats(ablation: str, columns, *, middle: str = "") -> dict:
    """The statistics of an ablation's extra step-score columns found among ``columns``:
    ``{<middle><score>: Stat("<ablation>_<middle><score>")}``, the mean over steps (logged, not a
    report column). For :attr:`~attnstudy.analysis.catalogue.AblationSpec.more_stats`."""
    from .catalogue import Stat

    names = set(columns)
    return {
        f"{middle}{name}": Stat(f"{ablation}_{middle}{name}", unit=score.unit or "–")
        for name, score in _REGISTRY.items()
        if name not in ("tvd", "flip") and f"{ablation}_{middle}{name}" in names
    }
