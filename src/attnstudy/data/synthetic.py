"""Synthetic sequence transductions with exact gold alignments: copy, reverse, sort, bigram_flip."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from attnstudy.config import DataConfig
from attnstudy.data.alignment import Alignment
from attnstudy.data.types import DEFAULT_SIZES, SPLITS, Example, Splits, seeded_rng


def symbols(vocab_size: int) -> list[str]:
    """Symbol names: ``a``–``z`` then ``A``–``Z`` if ``vocab_size`` ≤ 52, else ``t0 t1 …``."""
    if vocab_size <= 52:
        letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
        letters += [chr(c) for c in range(ord("A"), ord("Z") + 1)]
        return letters[:vocab_size]
    return [f"t{i}" for i in range(vocab_size)]


def _copy_order(n: int, src_ids: list[int]) -> list[int]:
    return list(range(n))


def _reverse_order(n: int, src_ids: list[int]) -> list[int]:
    return list(range(n - 1, -1, -1))


def _sort_order(n: int, src_ids: list[int]) -> list[int]:
    # stable argsort by symbol index (Python's sort is stable): equal symbols keep source order
    return sorted(range(n), key=lambda i: src_ids[i])


def _bigram_flip_order(n: int, src_ids: list[int]) -> list[int]:
    # swap adjacent pairs: a b c d e -> b a d c e (an odd last token stays)
    return [j ^ 1 if (j ^ 1) < n else j for j in range(n)]


# target position j takes source position order[j]; the gold link is (order[j], j)
_ORDERS: dict[str, Callable[[int, list[int]], list[int]]] = {
    "copy": _copy_order,
    "reverse": _reverse_order,
    "sort": _sort_order,
    "bigram_flip": _bigram_flip_order,
}


def synthetic_example(task: str, src_ids: list[int], names: Sequence[str], id: str) -> Example:
    """Build the example of a synthetic ``task`` for a source given as symbol indices."""
    order = _ORDERS[task](len(src_ids), src_ids)
    src = tuple(names[i] for i in src_ids)
    tgt = tuple(src[i] for i in order)
    return Example(
        id=id,
        src=src,
        tgt=tgt,
        alignment=Alignment.from_links({(i, j) for j, i in enumerate(order)}),
    )


def synthetic_loader(task: str) -> Callable[[DataConfig], Splits]:
    """The data loader of a synthetic task (``copy``, ``reverse``, ``sort``, ``bigram_flip``).

    The loader draws ``n_train``/``n_dev``/``n_test`` examples (else ``DEFAULT_SIZES``) of length
    ``min_len``..``max_len`` over ``vocab_size`` symbols, each split from its own RNG seeded by
    (``data_seed``, task, split), so the splits are reproducible and independent; every example
    carries its exact gold alignment (:func:`synthetic_example`).
    """

    def load(cfg: DataConfig) -> Splits:
        names = symbols(cfg.vocab_size)
        out = {}
        for split in SPLITS:
            n = getattr(cfg, f"n_{split}") or DEFAULT_SIZES[split]
            rng = seeded_rng(cfg.data_seed, task, split)
            examples = []
            for k in range(n):
                length = rng.randint(cfg.min_len, cfg.max_len)
                ids = [rng.randrange(cfg.vocab_size) for _ in range(length)]
                examples.append(synthetic_example(task, ids, names, f"{task}/{split}/{k}"))
            out[split] = examples
        return Splits(**out)

    load.__name__ = f"load_{task}"
    load.__doc__ = f"Synthetic ``{task}`` task, seeded by (data_seed, task, split)."
    return load


ORDERS = tuple(_ORDERS)
"""The synthetic task names."""
