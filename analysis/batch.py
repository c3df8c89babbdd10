"""What every ablation shares: prepared batches (a trace over the chosen prefix), the run context
and the seeded random streams.

An ablation is a function ``fn(model, batch: PreparedBatch, params, ctx: AblationContext) ->
DataFrame`` whose rows are decoder steps (``example_id``, ``step`` and its own columns); the suite
merges them into one tidy per-step table (see :mod:`attnstudy.analysis.catalogue`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from attnstudy.data.batching import collate
from attnstudy.data.types import Example
from attnstudy.data.vocab import BOS_ID, EOS_ID, PAD_ID, Vocab
from attnstudy.models import ALL, Seq2Seq, Trace, eval_mode
from attnstudy.models.devices import model_device

from .divergences import entropy
from .interventions import permutation_indices
from .random_streams import COUNTER_1, LEGACY, RNG_SCHEMES, CounterStreams, permutations


@dataclass(frozen=True)
class AblationContext:
    """What every ablation run shares beyond its own parameters.

    Attributes:
        seed: the ablation seed (random draws come from :func:`step_streams`).
        chunk_rows: rows per output-layer call in local interventions (sized for the cache).
        rng: the random streams' scheme, ``"counter-1"`` (counter-based,
            :mod:`attnstudy.analysis.random_streams`) or ``"legacy"`` (:func:`step_generator`).
        cache: the run's attribution cache
            (:func:`~attnstudy.analysis.attribution.cached_attribution`), empty at the start.
    """

    seed: int = 0
    chunk_rows: int = 4096
    rng: str = COUNTER_1
    cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.rng not in RNG_SCHEMES:
            raise ValueError(f"unknown rng {self.rng!r}; valid: {', '.join(RNG_SCHEMES)}")

    @classmethod
    def of(cls, cfg) -> AblationContext:
        """From an :class:`~attnstudy.analysis.catalogue.AblationConfig`."""
        return cls(seed=cfg.seed, chunk_rows=cfg.chunk_rows, rng=cfg.rng)


@dataclass
class PreparedBatch:
    """A batch of examples with a no-grad teacher-forced trace over the chosen prefix.

    Attributes:
        examples: the examples, in batch order.
        trace: :class:`attnstudy.models.Trace` (B examples), computed under ``torch.no_grad``.
        prefix: "greedy" (the model's own output) or "reference".
        src_vocab, tgt_vocab: vocabularies.
    """

    examples: list[Example]
    trace: Trace
    prefix: str
    src_vocab: Vocab
    tgt_vocab: Vocab

    @property
    def example_ids(self) -> list[str]:
        return [ex.id for ex in self.examples]

    @property
    def probs(self) -> Tensor:
        """Output distributions p_t, shape (B, T_y, V)."""
        return torch.softmax(self.trace.logits, -1)

    def steps(self) -> Iterator[tuple[int, int]]:
        """(batch row, step) of every real step, in order."""
        yield from (tuple(bt) for bt in self.trace.step_mask.nonzero().tolist())

    def valid_positions(self) -> Tensor:
        """bool (B, T_x), True at real source positions."""
        return ~self.trace.pad_mask


def step_seed(seed: int, example_id: str, step: int, ablation: str) -> int:
    """The seed of :func:`step_generator`'s stream: the first 8 bytes of
    SHA-256("seed|example id|step|ablation"), little-endian, top bit cleared."""
    digest = hashlib.sha256(f"{seed}|{example_id}|{step}|{ablation}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def step_generator(seed: int, example_id: str, step: int, ablation: str) -> torch.Generator:
    """A torch generator seeded from (seed, example id, step, ablation name) (docs/design.md §4).

    The stream is independent of batch composition and of which examples ran before.
    """
    # on the CPU whatever the model's device: draws are moved afterwards, so they are the same
    # numbers on every device
    return torch.Generator(device="cpu").manual_seed(step_seed(seed, example_id, step, ablation))


@dataclass(frozen=True)
class StepStreams:
    """The random streams of some batch rows' steps for one ablation, as a generator function.

    ``streams(b, t)`` is ``step_generator(seed, example_ids[b], start + t, ablation)``: row ``b``
    of the slice is example ``example_ids[b]``, its step ``t`` decoder step ``start + t``.
    :meth:`seed_of` gives the same stream's seed without building a generator, so a caller that
    draws for many steps (:func:`attnstudy.analysis.interventions.permute`) reseeds one
    generator instead of building one per step (the same numbers).

    Attributes:
        seed: the ablation seed. example_ids: the example id of each row of the slice.
        ablation: the stream's name (``"permutation"``). start: the slice's first decoder step.
    """

    seed: int
    example_ids: Sequence[str]
    ablation: str
    start: int = 0

    def seed_of(self, b: int, t: int) -> int:
        """The seed of stream (b, t) (:func:`step_seed`)."""
        return step_seed(self.seed, self.example_ids[b], self.start + t, self.ablation)

    def __call__(self, b: int, t: int) -> torch.Generator:
        return torch.Generator(device="cpu").manual_seed(self.seed_of(b, t))


def step_streams(
    ctx: AblationContext, example_ids: Sequence[str], purpose: str, start: int = 0
) -> StepStreams | CounterStreams:
    """The random streams of some batch rows' steps for one purpose, in ``ctx.rng``'s scheme.

    Row ``b`` is example ``example_ids[b]``, its step ``t`` decoder step ``start + t``. Both kinds
    are what :func:`attnstudy.analysis.interventions.permute` takes as ``generators``.

    Returns:
        :class:`~attnstudy.analysis.random_streams.CounterStreams` for ``"counter-1"``,
        :class:`StepStreams` (reseeded torch generators) for ``"legacy"``.
    """
    if ctx.rng == LEGACY:
        return StepStreams(ctx.seed, example_ids, purpose, start)
    return CounterStreams(ctx.seed, example_ids, purpose, start)


def step_permutations(
    ctx: AblationContext,
    example_id: str,
    step: int,
    purpose: str,
    *,
    n: int,
    heads: int,
    n_valid: int,
) -> Tensor:
    """The ``n`` permutations per head of one step's stream, drawn alone (the plain references'
    draw): ``permutation_indices(step_generator(…), n, heads, n_valid)`` for ``"legacy"``, rows
    p·H + h of :func:`~attnstudy.analysis.random_streams.permutations` for ``"counter-1"``.

    Returns:
        long (n, heads, n_valid) on the CPU: ``[p, h, i]`` is the valid item placed at i.
    """
    if ctx.rng == LEGACY:
        return permutation_indices(
            step_generator(ctx.seed, example_id, step, purpose), n, heads, n_valid
        )
    keys = CounterStreams(ctx.seed, [example_id], purpose).keys([0], [step])
    perm = permutations(keys, n * heads, np.array([n_valid]), n_valid)
    return torch.from_numpy(perm).to("cpu").view(n, heads, n_valid)


def prepare_batches(
    model: Seq2Seq,
    examples: Sequence[Example],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    prefix: str = "greedy",
    batch_size: int = 32,
    max_decode_factor: float = 2.0,
    layer: int = -1,
) -> Iterator[PreparedBatch]:
    """Yield :class:`PreparedBatch` objects over ``examples`` (in order, ``batch_size`` at a time).

    With ``prefix="greedy"`` the trace follows the model's own greedy output (the step that emits
    ``<eos>`` included); with ``"reference"`` it follows the first reference. ``layer`` chooses the
    cross-attention layer the ablations analyse (default the last; the recurrent family has one).
    The batch's tensors are on the model's device (:func:`attnstudy.models.devices.model_device`).

    A model that tokenises text itself (a pretrained Hugging Face model: it has
    ``source_tokens``) reads its tokenizer's subwords: examples of words it does not know get a
    notice with the count of tokens that read as ``<unk>`` (:func:`unknown_token_notice`).

    Raises:
        ValueError: for an unknown prefix or layer.
    """
    if prefix not in ("greedy", "reference"):
        raise ValueError(f"unknown prefix {prefix!r}; valid: greedy, reference")
    if callable(getattr(model, "source_tokens", None)):
        unknown_token_notice(examples, src_vocab, tgt_vocab if prefix == "reference" else None)
    device = model_device(model)
    for start in range(0, len(examples), batch_size):
        chunk = list(examples[start : start + batch_size])
        batch = collate(chunk, src_vocab, tgt_vocab).to(device)
        with eval_mode(model), torch.no_grad():
            if prefix == "greedy":
                max_len = int(max_decode_factor * int(batch.src_lengths.max())) + 2
                hyps = model.greedy(batch.src, batch.src_lengths, max_len)
                # each example's own budget, so a prefix never depends on its batch-mates
                hyps = [
                    h[: int(max_decode_factor * n) + 1]
                    for h, n in zip(hyps, batch.src_lengths.tolist())
                ]
                tgt_in, tgt_out = _prefix_tensors(hyps, device)
            else:
                tgt_in, tgt_out = batch.tgt_in, batch.tgt_out
            trace = model.trace(batch.src, batch.src_lengths, tgt_in, tgt_out)
        if trace.attention is not None:
            trace = trace.with_layer(layer)
        check_finite(trace, chunk)
        yield PreparedBatch(chunk, trace, prefix, src_vocab, tgt_vocab)


def unknown_token_notice(
    examples: Sequence[Example], src_vocab: Vocab, tgt_vocab: Vocab | None = None
) -> int:
    """Say (one notice, :func:`attnstudy.runtime.notices.notice`) how many of the examples' source
    tokens
    (and target tokens, given ``tgt_vocab``) are not in the vocabulary and so read as ``<unk>``.

    For a pretrained model's examples: words where its tokenizer's subwords are expected
    (``Example("mine/0", ("new", "dog"), …)`` reads as ``<unk>`` ids, without the end-of-sequence
    token); :func:`attnstudy.models.hf.subword_examples` makes them as the model sees text.

    Returns:
        The number of such tokens (0: no notice).
    """
    sides = [("source", src_vocab, [t for ex in examples for t in ex.src])]
    if tgt_vocab is not None:
        sides.append(("target", tgt_vocab, [t for ex in examples for t in ex.tgt]))
    parts, unknown = [], []
    for side, vocab, tokens in sides:
        missing = [t for t in tokens if t not in vocab.stoi]
        if missing:
            parts.append(f"{len(missing):,} of {len(tokens):,} {side} tokens")
            unknown += missing
    if unknown:
        from attnstudy.runtime.notices import notice

        shown = ", ".join(repr(t) for t in list(dict.fromkeys(unknown))[:3])
        notice(
            f"{' and '.join(parts)} of {len(examples):,} example(s) are not in the model's "
            f"vocabulary and read as <unk> ({shown}…): a pretrained model reads its tokenizer's "
            "subwords; make the examples with attnstudy.models.hf.subword_examples(model, examples)"
        )
    return len(unknown)


def table_index(selector: int | str) -> int:
    """A layer or head selector as the tables write it: the index, or −1 for :data:`ALL`."""
    return -1 if selector == ALL else int(selector)


def analysis_units(trace: Trace, layers, heads: str = "all") -> list[tuple[int | str, int | str]]:
    """The (layer, head) units the battery analyses on a model, from ``ablation.layers`` and
    ``ablation.heads``; :data:`~attnstudy.models.ALL` marks all layers at once / all heads jointly.

    Args:
        trace: any trace of the model (its number of layers and heads).
        layers: a list of layer indices (negative from the top), ``"each"`` or ``"all"``.
        heads: ``"all"`` (jointly) or ``"each"`` (each head alone, the others keep their rows).

    Returns:
        Distinct units in order; one unit (layer 0, all heads) for a model without attention.

    Raises:
        ValueError: a layer index out of range (one line naming the setting and the model's L).
    """
    cross = trace.cross_attention
    if cross is None:
        return [(0, ALL)]
    n_layers, n_heads = cross.size(1), cross.size(2)
    if layers == "all":
        chosen = [ALL if n_layers > 1 else 0]
    elif layers == "each":
        chosen = list(range(n_layers))
    else:
        chosen = []
        for layer in layers:
            index = layer + n_layers if layer < 0 else layer
            if not 0 <= index < n_layers:
                raise ValueError(
                    f"ablation.layers = {list(layers)}: layer {layer} is out of range for a model "
                    f"with {n_layers} layer(s) of cross-attention (use 0…{n_layers - 1}, negative "
                    "indices from the top, 'each' or 'all')"
                )
            chosen.append(index)
    units = []
    for layer in chosen:
        for head in range(n_heads) if heads == "each" and layer != ALL else [ALL]:
            units.append((layer, head))
    return list(dict.fromkeys(units))


def unit_batch(batch: PreparedBatch, layer: int | str, head: int | str) -> PreparedBatch:
    """The batch analysing one (layer, head) unit (see :func:`analysis_units`)."""
    tr = batch.trace
    if tr.cross_attention is None:
        return batch
    tr = tr.with_layer(layer)
    if head != getattr(tr, "head", ALL):
        tr = tr.with_head(head)
    return PreparedBatch(batch.examples, tr, batch.prefix, batch.src_vocab, batch.tgt_vocab)


def check_finite(trace: Trace, examples: Sequence[Example]) -> None:
    """Refuse a trace whose logits, attention or output probabilities hold NaN/inf (or do not
    sum to 1): every ablation number built on it (a flip rate of 0, an AER of 1) would look
    meaningful and mean nothing. The check is ``predict``'s
    (:func:`attnstudy.models.inference.check_finite`).

    Raises:
        NonFiniteError: naming the first example concerned.
    """
    from attnstudy.models.inference import check_finite as check

    check(trace, [f"example {e.id!r}" for e in examples], "no ablation of it would mean anything")


def _prefix_tensors(hyps: list[list[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    """BOS + hyp and hyp + EOS, PAD-padded, shape (B, max len + 1) each, on ``device``."""
    t = max(len(h) for h in hyps) + 1
    pad = [[PAD_ID] * (t - 1 - len(h)) for h in hyps]
    tgt_in = torch.tensor(
        [[BOS_ID, *h, *p] for h, p in zip(hyps, pad)], dtype=torch.long, device=device
    )
    tgt_out = torch.tensor(
        [[*h, EOS_ID, *p] for h, p in zip(hyps, pad)], dtype=torch.long, device=device
    )
    return tgt_in, tgt_out


def base_table(batch: PreparedBatch) -> pd.DataFrame:
    """The columns every per-step record carries.

    Columns: example_id, step, layer (the analysed layer of cross-attention; 0 for the recurrent
    family, −1 for all layers at once), head (the analysed head; −1 for all heads jointly), src_len, target_token (the prefix token at this step), predicted_token (argmax),
    is_eos, max_attention and attention_entropy (head mean; NaN without attention).
    """
    tr = batch.trace
    b_idx, t_idx = tr.step_mask.nonzero(as_tuple=True)
    pred = tr.logits.argmax(-1)
    att = tr.attention.mean(1) if tr.attention is not None else None  # (B, T_y, T_x)
    itos = batch.tgt_vocab.itos
    rows = {
        "example_id": [batch.examples[b].id for b in b_idx.tolist()],
        "step": t_idx.cpu().numpy(),
        "layer": np.full(len(b_idx), table_index(getattr(tr, "layer", 0)), dtype=np.int64),
        "head": np.full(len(b_idx), table_index(getattr(tr, "head", ALL)), dtype=np.int64),
        "src_len": tr.src_lengths[b_idx].cpu().numpy(),
        "target_token": [itos[i] for i in tr.tgt_out[b_idx, t_idx].tolist()],
        "predicted_token": [itos[i] for i in pred[b_idx, t_idx].tolist()],
        "is_eos": (tr.tgt_out[b_idx, t_idx] == EOS_ID).cpu().numpy(),
    }
    if att is not None:
        rows["max_attention"] = att[b_idx, t_idx].max(-1).values.cpu().numpy()
        rows["attention_entropy"] = entropy(att[b_idx, t_idx]).cpu().numpy()
    else:
        rows["max_attention"] = np.full(len(b_idx), np.nan)
        rows["attention_entropy"] = np.full(len(b_idx), np.nan)
    return pd.DataFrame(rows)
