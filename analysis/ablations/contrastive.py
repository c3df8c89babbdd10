"""Contrastive questions per decoder step: why ŷ_t rather than a foil y'_t (Yin & Neubig 2022,
"Interpreting Language Models with Contrastive Explanations", §3).

* Contrastive input × gradient: c_tj = Σ_d e_jd · ∂(log p_t(ŷ_t) − log p_t(y'_t)) / ∂e_jd (the
  attention detached, as the importance ablation's gradient), beside the plain input × gradient
  of log p_t(ŷ_t): Kendall τ-b of |c_t| against the attention row and against the plain form.
* Interventions that move the decision *to the foil*: under uniform attention, with the largest
  weight erased, and under ``n`` random permutations (the permutation ablation's), whether the
  argmax becomes y'_t specifically, beside whether it changes at all (the plain flip).

The foil of step t is one of:

* the runner-up (the most probable token other than ŷ_t at that step; the default);
* a token the user names (``foil = "x"``, a token of the target vocabulary), the same at every
  step;
* step t's token of a *contrast sequence* given per example (``contrast``, as inseq's
  ``contrast_targets``): c = the sequence's tokens followed by ``<eos>``, aligned to the output
  position by position, c_t the foil of step t.

Every foil is scored at the output's own prefix ŷ_<t (the decision the interventions change). A
step has no foil — undefined, left out of every mean, and counted — where the foil is ŷ_t itself
(``ablation/contrastive/foil_is_output``: a named foil emitted, or a contrast token equal to the
output's) or where the output is longer than the contrast (``beyond_contrast``); contrast tokens
past the output's end have no step and are counted (``contrast_unused``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from attnstudy.analysis.catalogue import AblationSpec, Params, Stat, VerdictRole
from pydantic import Field, PrivateAttr, field_validator, model_serializer
from torch import Tensor

from attnstudy.models import eval_mode, gradients_in_eval

from .._chunks import base_probs, n_valid, require_attention, step_frame
from ..batch import AblationContext, PreparedBatch, step_streams
from ..divergences import kendall_tau
from ..interventions import erase_max, permute, uniform


class ContrastiveParams(Params):
    """Settings of ``[ablation.contrastive]``.

    Attributes:
        foil: ``"runner_up"`` or a token of the target vocabulary (the same foil at every step).
        n: random permutations per step.
        contrast: the contrast sequences, one per example (instead of ``foil``): a UTF-8 file of
            ``example_id<TAB>sequence`` lines (an experiment file's relative path resolves
            against its folder), or, from Python, a mapping ``{example_id: sequence}``
            (:func:`contrast_by_id` builds one from a list aligned with the examples). Read and
            checked here: a missing or non-UTF-8 file, a blank line, a line without exactly two
            non-empty fields, an example named twice are refused (one line, naming the file
            and line).
        contrast_tokenization: how a sequence splits into target tokens for attnstudy's own
            models, as the data's ``target_tokenization``: ``"spaces"`` (default) or
            ``"chars"``; a pretrained (``hf:``) model's tokenizer splits the text itself.
        contrast_sha256: the SHA-256 of the contrast file's bytes (of the mapping's sorted JSON
            items), filled in when it is read (it keys the results); a value given (the
            resolved settings sent to a worker) must match the file, else it is refused.

    The three ``contrast`` settings are left out of the resolved settings when ``contrast`` is
    not given, so the keys of runs without one do not change.
    """

    foil: str = Field("runner_up", min_length=1, max_length=200)
    n: int = Field(20, ge=1, le=10_000)
    contrast: str | dict[str, str] | None = None
    contrast_tokenization: str = Field("spaces", pattern=r"^(spaces|chars)$")
    contrast_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    _sequences: dict | None = PrivateAttr(None)

    @staticmethod
    def read_contrast(value) -> tuple[dict, str]:
        """The sequences of a contrast (file path or mapping) and its SHA-256.

        Returns:
            ({example id: sequence text}, hex digest).

        Raises:
            ValueError: one line naming the problem (and file and line) and what to do.
        """
        import hashlib
        import json
        from pathlib import Path

        if isinstance(value, dict):
            for key, text in value.items():
                if not key.strip() or not text.strip():
                    raise ValueError(
                        f"an empty example id or contrast sequence ({key!r}: {text!r}); give "
                        "each example a non-empty sequence"
                    )
            if not value:
                raise ValueError("no contrast sequences; give one per analysed example")
            blob = json.dumps(sorted(value.items()), ensure_ascii=False).encode()
            return dict(value), hashlib.sha256(blob).hexdigest()
        if value.startswith("python:"):
            raise ValueError(
                "a contrast given from Python (a mapping) cannot be read in another process; "
                "write it to a file of example_id<TAB>sequence lines and name the file"
            )
        path = Path(value).expanduser()
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise ValueError(
                f"{path}: no such file; give a UTF-8 file of example_id<TAB>sequence lines"
            ) from None
        except IsADirectoryError:
            raise ValueError(
                f"{path} is a folder; give a file of example_id<TAB>sequence lines"
            ) from None
        except OSError as err:
            raise ValueError(f"cannot read {path}: {err.strerror}") from None
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise ValueError(
                f"{path}: not UTF-8 ({err.reason} at byte {err.start}); convert it"
            ) from None
        out: dict[str, str] = {}
        line_of: dict[str, int] = {}
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                raise ValueError(f"{path}:{n}: blank line; remove it (one example per line)")
            fields = line.split("\t")
            if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
                raise ValueError(
                    f"{path}:{n}: expected example_id<TAB>contrast sequence (two non-empty "
                    f"fields), got {len(fields)} field(s); the ids are those of the per-step "
                    "table (e.g. tsv/test/3)"
                )
            key = fields[0].strip()
            if key in out:
                raise ValueError(
                    f"{path}:{n}: example {key!r} has a contrast on line {line_of[key]} already; "
                    "give one line per example"
                )
            out[key], line_of[key] = fields[1], n
        if not out:
            raise ValueError(f"{path}: no contrast sequences; give one line per analysed example")
        return out, hashlib.sha256(raw).hexdigest()

    @field_validator("contrast")
    @classmethod
    def _readable(cls, value, info):
        if value is None:
            return value
        if info.data.get("foil", "runner_up") != "runner_up":
            raise ValueError(
                "give either a foil (the same token at every step) or contrast sequences, not both"
            )
        if isinstance(value, str) and not value.startswith("python:"):
            from pathlib import Path

            value = str(Path(value).expanduser().resolve())
        ContrastiveParams.read_contrast(value)
        return value

    @field_validator("contrast_sha256")
    @classmethod
    def _same_contrast(cls, value, info):
        if value is None or "contrast" not in info.data:
            return value
        if info.data["contrast"] is None:
            raise ValueError("contrast_sha256 is the digest of a contrast; give contrast too")
        _, digest = ContrastiveParams.read_contrast(info.data["contrast"])
        if digest != value:
            raise ValueError(
                f"the contrast {info.data['contrast']} has changed (SHA-256 {digest[:12]}…, "
                f"expected {value[:12]}…); run again with the file as it is now"
            )
        return value

    def model_post_init(self, context) -> None:
        if self.contrast is not None:
            sequences, digest = ContrastiveParams.read_contrast(self.contrast)
            self._sequences = sequences
            if self.contrast_sha256 is None:
                object.__setattr__(self, "contrast_sha256", digest)

    def sequences(self) -> dict | None:
        """{example id: contrast sequence text}, or None without ``contrast``."""
        return self._sequences

    @model_serializer(mode="wrap")
    def _dump(self, handler, info):
        data = handler(self)
        if self.contrast is None:
            for key in ("contrast", "contrast_tokenization", "contrast_sha256"):
                data.pop(key, None)
        elif isinstance(self.contrast, dict) and info.mode == "json":
            # python:<its SHA-256>: it keys the results; such a contrast reaches no other process
            data["contrast"] = f"python:{self.contrast_sha256}"
        return data


SPEC = AblationSpec(
    name="contrastive",
    run="attnstudy.analysis.ablations.contrastive:run",
    params=ContrastiveParams,
    requires=("attention", "local", "gradients"),
    stats={
        "log_odds": Stat(
            "contrastive_log_odds", label="log p(y) − log p(foil)", unit="nats", question=None
        ),
        "tau_attn": Stat(
            "contrastive_tau_attn",
            label="τ attention–contrastive gradient",
            unit="Kendall τ-b",
            question="agrees",
            # its own sentence: the gradient of another quantity than the measures' log p(y_t)
            verdict=VerdictRole(
                "contrastive",
                "note",
                measure="the contrastive gradient",
                note="On the contrastive question (why y_t rather than its foil), attention "
                "{relation}.",
            ),
        ),
        "tau_plain": Stat(
            "contrastive_tau_plain",
            label="τ contrastive–plain gradient",
            unit="Kendall τ-b",
            question="agrees",
        ),
        "uniform_flip": Stat("contrastive_uniform_flip"),
        "uniform_to_foil": Stat(
            "contrastive_uniform_to_foil", label="uniform: to the foil", question="used"
        ),
        "erase_max_flip": Stat("contrastive_erase_max_flip"),
        "erase_max_to_foil": Stat(
            "contrastive_erase_max_to_foil", label="erase-max: to the foil", question="used"
        ),
        "permutation_flip": Stat("contrastive_permutation_flip"),
        "permutation_to_foil": Stat(
            "contrastive_permutation_to_foil",
            label="permutation: to the foil",
            unit="share of permutations (0–1)",
            question="used",
        ),
    },
    # steps without a foil, by reason, and contrast tokens without a step (module docstring)
    counts=(
        "contrastive_foil_is_output",
        "contrastive_beyond_contrast",
        "contrastive_contrast_unused",
    ),
    definitions=(
        (
            "foil",
            "the token a contrastive question sets against the emitted y_t: by default the "
            "runner-up of p_t, else a named token or step t's token of a contrast sequence "
            "(scored at the output's own prefix); 'to the foil': the intervention makes the "
            "foil the argmax (Yin & Neubig 2022).",
        ),
        (
            "contrastive gradient",
            "Σ_d e_jd ∂(log p_t(y_t) − log p_t(foil))/∂e_jd, attention detached, ranked by "
            "absolute value.",
        ),
    ),
    terms=("Kendall τ-b", "flip"),
    default=False,
    order=78,
    description="contrastive questions: input × gradient of log p(y_t) − log p(foil) (runner-up, "
    "a named token or a contrast sequence) against attention and the plain gradient; whether "
    "uniform, erase-max and permuted attention move the argmax to the foil",
    reference="Yin & Neubig 2022",
)


def foils(probs: Tensor, target: Tensor, foil: str, vocab) -> Tensor:
    """The foil of every step: long (B, T_y); −1 where there is none (ŷ_t is the named token).

    Args:
        probs: (B, T_y, V) the step's output distribution; target: long (B, T_y) ŷ_t.
        foil: ``"runner_up"`` or a token of ``vocab`` (the target vocabulary).

    Raises:
        ValueError: a named foil that is not in the target vocabulary.
    """
    if foil == "runner_up":
        return probs.scatter(-1, target[..., None], -1.0).argmax(-1)
    if foil not in vocab.stoi:
        raise ValueError(
            f"ablation.contrastive.foil {foil!r} is not a token of the target vocabulary; name "
            "one of its tokens or use 'runner_up' (a word the model splits into several tokens "
            "is a contrast sequence: [ablation.contrastive] contrast = FILE)"
        )
    out = torch.full_like(target, vocab.stoi[foil])
    return out.masked_fill(target == out, -1)


def contrast_by_id(examples, sequences) -> dict[str, str]:
    """Contrast sequences given as a list aligned with the examples, keyed by example id (what
    ``[ablation.contrastive] contrast`` takes from Python): the k-th sequence is the k-th
    example's.

    Args:
        examples: the examples the battery analyses (:class:`~attnstudy.data.types.Example`, or
            anything with an ``id``), in order.
        sequences: one contrast sequence (text) per example, in the same order.

    Raises:
        DataError: the lengths differ, or an example id repeats.
    """
    from attnstudy.data.types import DataError

    ids = [ex.id for ex in examples]
    sequences = list(sequences)
    if len(sequences) != len(ids):
        raise DataError(
            f"{len(sequences)} contrast sequence(s) for {len(ids)} example(s); give one per "
            "example, in the examples' order"
        )
    if len(set(ids)) != len(ids):
        raise DataError("the examples repeat an id; a contrast needs one example per id")
    return dict(zip(ids, sequences))


def contrast_tokens(model, text: str, tokenization: str) -> tuple[str, ...]:
    """A contrast sequence as target tokens (without ``<eos>``): a pretrained model's own
    tokenizer (:meth:`attnstudy.models.hf.HFSeq2Seq.target_tokens`, so a word may become several
    subwords), else :func:`attnstudy.data.types.tokenize` with ``tokenization``."""
    from attnstudy.data.types import tokenize

    split = getattr(model, "target_tokens", None)
    return tuple(split(text)) if callable(split) else tuple(tokenize(text, tokenization))


def contrast_foils(model, batch: PreparedBatch, params: ContrastiveParams) -> tuple[Tensor, Tensor]:
    """Step t's foil from each example's contrast sequence: c = its tokens then ``<eos>``,
    c_t for step t (−1 past the end of c), and how many tokens of c lie past the output's end.

    Args:
        model: the analysed model (its tokenizer, if it has one, splits the sequences).
        batch: the prepared batch; params: with ``contrast`` given.

    Returns:
        (foil: long (B, T_y), −1 past the contrast's end or at padding steps; unused: long (B,),
        the contrast tokens past the example's last real step).

    Raises:
        DataError: an analysed example without a contrast sequence, or a sequence with a token
            outside the target vocabulary (a special token included), naming the example.
    """
    from attnstudy.data.types import DataError
    from attnstudy.data.vocab import EOS_ID, SPECIALS

    tr = batch.trace
    sequences = params.sequences() or {}
    ids = batch.example_ids
    missing = [i for i in ids if i not in sequences]
    if missing:
        raise DataError(
            f"ablation.contrastive.contrast has no sequence for example {missing[0]!r} (nor for "
            f"{len(missing) - 1} other(s) of this batch); give one line example_id<TAB>sequence "
            "per analysed example (ids as in the per-step table)"
        )
    vocab = batch.tgt_vocab
    b_size, t_y = tr.tgt_out.shape
    # filled row by row on the host, moved to the model's device once at the end
    foil = torch.full((b_size, t_y), -1, dtype=torch.long, device="cpu")
    unused = torch.zeros(b_size, dtype=torch.long, device="cpu")
    n_steps = tr.step_mask.sum(1).cpu()
    for b, ex_id in enumerate(ids):
        tokens = contrast_tokens(model, sequences[ex_id], params.contrast_tokenization)
        bad = [t for t in tokens if t not in vocab.stoi or t in SPECIALS]
        if bad:
            hint = (
                "the model's tokenizer does not know it"
                if callable(getattr(model, "target_tokens", None))
                else "write the target tokens as the data's target field does (contrast_"
                f"tokenization = {params.contrast_tokenization!r}; 'chars' if the targets are "
                "characters)"
            )
            raise DataError(
                f"ablation.contrastive.contrast: example {ex_id!r}'s sequence "
                f"{sequences[ex_id]!r} has the token {bad[0]!r}, not a token of the target "
                f"vocabulary; {hint}"
            )
        c = [vocab.stoi[t] for t in tokens] + [EOS_ID]
        k = min(len(c), t_y)
        foil[b, :k] = torch.tensor(c[:k], dtype=torch.long, device="cpu")
        unused[b] = max(0, len(c) - int(n_steps[b]))
    device = tr.tgt_out.device
    foil = foil.to(device).masked_fill(~tr.step_mask, -1)
    return foil, unused.to(device)


def contrastive_gradient(model, batch: PreparedBatch, foil: Tensor) -> Tensor:
    """Contrastive input × gradient, one backward per step for the whole batch.

    Args:
        foil: long (B, T_y) foils (−1: none).

    Returns:
        (B, T_y, T_x) signed scores (nats), NaN at padding, padding steps and steps without foil.
    """
    tr = batch.trace
    b, t_y, t_x = tr.src.size(0), tr.tgt_in.size(1), tr.src.size(1)
    out = torch.full((b, t_y, t_x), math.nan, dtype=tr.logits.dtype, device=tr.src.device)
    with eval_mode(model), gradients_in_eval():
        leaf = model.embed(tr.src).detach().requires_grad_(True)
        trace = model.trace(
            tr.src, tr.src_lengths, tr.tgt_in, tr.tgt_out, embedded=leaf, detach_attention=True
        )
        steps = getattr(trace, "step_logits", None) or trace.logits.unbind(1)
        for t in range(t_y):
            logp = torch.log_softmax(steps[t], -1)
            diff = logp.gather(-1, tr.tgt_out[:, t : t + 1]) - logp.gather(
                -1, foil[:, t : t + 1].clamp(min=0)
            )
            (g,) = torch.autograd.grad(diff.sum(), leaf, retain_graph=t < t_y - 1)
            out[:, t] = (g * leaf).sum(-1).detach()
    bad = ~tr.step_mask[:, :, None] | tr.pad_mask[:, None, :] | (foil < 0)[:, :, None]
    return out.masked_fill(bad, math.nan)


def to_foil(model, batch: PreparedBatch, base: Tensor, foil: Tensor, ok: Tensor, n: int, ctx):
    """Whether uniform attention, the largest weight erased and each of ``n`` random permutations
    (the permutation ablation's: seed and stream ``"permutation"``) change the argmax, and
    whether they move it to the foil.

    Args:
        base: (B, T_y, V) the unmodified steps' distribution; foil: long (B, T_y); ok: bool
            (B, T_y), the steps to compute.

    Returns:
        ``contrastive_<uniform|erase_max|permutation>_<flip|to_foil>`` → (B, T_y) float64 (0/1;
        permutation: shares of the n that are not the identity), NaN outside ``ok``; to the foil = the argmax becomes the
        foil and was not the foil before (so it is also a flip).
    """
    tr = batch.trace
    att = tr.attention
    valid = ~tr.pad_mask
    base_arg = base.argmax(-1)
    # "to the foil" is a move: where the unmodified argmax is the foil already (y_t not the
    # argmax: a reference prefix, a forced <eos>), staying there is no move to it
    moved = base_arg != foil
    cols = {}
    with eval_mode(model), torch.no_grad():
        for name, weights in (
            ("uniform", uniform(valid, att)),
            ("erase_max", erase_max(att, valid).weights),
        ):
            arg = model.logits_given_attention(tr, weights, ctx.chunk_rows, ok).argmax(-1)
            cols[f"contrastive_{name}_flip"] = (arg != base_arg).double().masked_fill(~ok, math.nan)
            cols[f"contrastive_{name}_to_foil"] = (
                ((arg == foil) & moved).double().masked_fill(~ok, math.nan)
            )
        ids = batch.example_ids
        # the permutation ablation's streams: its first n permutations of each step
        perm = permute(att, valid, n, step_streams(ctx, ids, "permutation"), ok)
        arg = model.logits_given_attention(tr, perm.weights, ctx.chunk_rows, ok).argmax(-1)
        # shares of the permutations that are not the identity, as the permutation ablation's
        # flip rate (NaN where every permutation was the identity)
        real = (~perm.identity).double()  # (B, P, T_y)
        n_real = real.sum(1)
        undefined = ~ok | (n_real == 0)
        for col, hit in (
            ("flip", arg != base_arg[:, None]),
            ("to_foil", (arg == foil[:, None]) & moved[:, None]),
        ):
            share = (hit.double() * real).sum(1) / n_real.clamp(min=1)
            cols[f"contrastive_permutation_{col}"] = share.masked_fill(undefined, math.nan)
    return cols


def run(model, batch: PreparedBatch, params: ContrastiveParams, ctx: AblationContext):
    """The contrastive questions of every real step.

    Returns:
        One row per real step: ``example_id``, ``step``, ``contrastive_foil`` (token id, −1:
        none), ``contrastive_log_odds`` (log p_t(ŷ_t) − log p_t(foil), nats),
        ``contrastive_tau_attn`` / ``contrastive_tau_plain`` (Kendall τ-b of |contrastive
        gradient| against the head-mean attention / the plain |input × gradient|),
        ``contrastive_<intervention>_flip`` and ``…_to_foil`` for uniform, erase_max and
        permutation (permutation: shares of the ``n`` permutations), ``contrastive_skipped``
        (fewer than two source tokens); NaN where undefined (no foil, or skipped). The counts
        (1.0 or 0.0 per step, summed into ``ablation/contrastive/<count>``):
        ``contrastive_foil_is_output`` (the foil is ŷ_t: a named foil emitted, a contrast token
        equal to the output's), ``contrastive_beyond_contrast`` (the step lies past the contrast
        sequence's ``<eos>``) and ``contrastive_contrast_unused`` (on an example's last step:
        its contrast tokens past the output's end, ``<eos>`` included).

    Raises:
        NoAttentionError: for the ``none`` model.
        ValueError: a named foil not in the target vocabulary.
        DataError: an example without a contrast sequence, a contrast token outside the target
            vocabulary (:func:`contrast_foils`).
    """
    from ..attribution import gradient_scores

    att = require_attention(model, batch, "contrastive")
    tr = batch.trace
    frame, b_idx, t_idx = step_frame(batch)
    nv = n_valid(tr)
    with eval_mode(model), torch.no_grad():
        base = base_probs(model, tr, ctx.chunk_rows)
    real = tr.step_mask
    if params.contrast is None:
        foil = foils(base, tr.tgt_out, params.foil, batch.tgt_vocab)
        is_output = real & (foil < 0)  # a named foil emitted: no foil
        beyond = torch.zeros_like(real)
        unused = torch.zeros(real.size(0), dtype=torch.long, device=real.device)
    else:
        foil, unused = contrast_foils(model, batch, params)
        beyond = real & (foil < 0)
        is_output = real & (foil == tr.tgt_out)
        foil = foil.masked_fill(is_output, -1)
    ok = real & (nv >= 2)[:, None] & (foil >= 0)
    logp = torch.log(base.double().clamp_min(1e-300))
    odds = (
        logp.gather(-1, tr.tgt_out[..., None])[..., 0]
        - logp.gather(-1, foil.clamp(min=0)[..., None])[..., 0]
    )
    cols = {"contrastive_log_odds": odds.masked_fill(~ok, math.nan)}
    cols.update(to_foil(model, batch, base, foil, ok, params.n, ctx))
    contrast = contrastive_gradient(model, batch, foil).abs().cpu().numpy()
    plain = gradient_scores(model, batch)["input_x_gradient"].abs().cpu().numpy()
    mean_att = att.mean(1).cpu().numpy()
    lengths = tr.src_lengths.tolist()
    ok_np = ok.cpu().numpy()
    tau_attn, tau_plain = [], []
    for b, t in zip(b_idx.tolist(), t_idx.tolist()):
        n = int(lengths[b])
        if not ok_np[b, t]:
            tau_attn.append(math.nan)
            tau_plain.append(math.nan)
            continue
        c = contrast[b, t, :n]
        tau_attn.append(kendall_tau(mean_att[b, t, :n], c)[0])
        tau_plain.append(kendall_tau(plain[b, t, :n], c)[0])
    for col, v in cols.items():
        frame[col] = v[b_idx, t_idx].cpu().numpy()
    frame["contrastive_foil"] = foil[b_idx, t_idx].cpu().numpy()
    frame["contrastive_tau_attn"] = np.asarray(tau_attn, dtype=float)
    frame["contrastive_tau_plain"] = np.asarray(tau_plain, dtype=float)
    frame["contrastive_skipped"] = (nv[b_idx] < 2).cpu().numpy()
    frame["contrastive_foil_is_output"] = is_output[b_idx, t_idx].double().cpu().numpy()
    frame["contrastive_beyond_contrast"] = beyond[b_idx, t_idx].double().cpu().numpy()
    # the contrast tokens without a step: on each example's last real step (they sum per example)
    last = t_idx == (real.sum(1) - 1)[b_idx]
    frame["contrastive_contrast_unused"] = (
        torch.where(last, unused[b_idx].double(), torch.zeros_like(last, dtype=torch.float64))
        .cpu()
        .numpy()
    )
    return frame


__all__ = [
    "ContrastiveParams",
    "contrast_by_id",
    "contrast_foils",
    "contrast_tokens",
    "contrastive_gradient",
    "foils",
    "run",
    "to_foil",
]
