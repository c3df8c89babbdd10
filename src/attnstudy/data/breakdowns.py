"""Alignment broken down by the source word's tag (a part of speech) and by the gold link's
shape: AER, precision, recall and gold mass per group, for any task whose registry entry has word
tags (:attr:`attnstudy.data.tasks.TaskSpec.word_tags`) and for any aligner — eflomal's links
(:func:`eflomal_breakdowns`) or attention's per-step table (:func:`attention_steps`).

**Steps and their weights.** A step is one target word (an English word for ``nt-greek-english``;
punctuation is no word). It counts for the groups of its gold links, with weights summing to 1:
a step whose English word is gold-linked to a noun and an article counts ½ for "noun" and ½ for
"article"; a step with no gold link counts 1 for :data:`NO_LINK`. By tag the group of a link is
the tag group of its source word (:meth:`attnstudy.data.tasks.WordTags.group`); by shape it is
the link's :func:`link_shapes` shape. With w_c(t) step t's weight in group c, A_t its predicted
links, S_t its gold links, per group (sums over the corpus's steps; Och & Ney 2003, eq. 7 with
S = P, as the task's gold has sure links only):

* precision_c = Σ w_c(t) |A_t ∩ S_t| / Σ w_c(t) |A_t|,
* recall_c = Σ w_c(t) |A_t ∩ S_t| / Σ w_c(t) |S_t| (the denominator is the number of gold links
  of group c: w_c(t) |S_t| counts step t's links in c),
* AER_c = 1 − 2 Σ w_c(t) |A_t ∩ S_t| / Σ w_c(t) (|A_t| + |S_t|),
* gold mass_c = Σ w_c(t) m(t) / Σ w_c(t) over the steps with gold links, m(t) the attention
  mass on step t's gold-linked source words (an aligner of hard links has none).

Each with a 95 % percentile bootstrap interval resampling sentences
(:func:`attnstudy.data.ratios.ratio_estimate`). :data:`NO_LINK` has no recall and no gold mass:
its precision is 0 by definition (every link of an unlinked word is wrong), its AER 1.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from attnstudy.data.ratios import Estimate, cell, ratio_estimate

NO_LINK = "no link"
"""The group of a step whose target word has no gold link."""
SHAPES = ("1–1", "1–n", "n–1", "n–m")
"""Link shapes, source side first: a source word linked to one target word that no other source
word links (1–1), to several target words each linked to it alone (1–n), a target word linked to
several source words each linked to it alone (n–1), and the rest (n–m)."""
FIELDS = ("hit", "n_hyp", "n_sure", "mass", "mass_weight", "steps")
"""The per-sentence, per-group weighted sums a breakdown is made of."""
Step = tuple[int, float, float, float]
"""``(target word, |A_t|, |A_t ∩ S_t|, gold mass or NaN)``."""


def link_shapes(gold: Iterable[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """Each gold link's shape (:data:`SHAPES`) from the degrees of its two words.

    Args:
        gold: links ``(source word, target word)`` of one sentence.

    Returns:
        Link → ``1–1``, ``1–n``, ``n–1`` or ``n–m``.
    """
    gold = set(gold)
    n_tgt = Counter(i for i, _ in gold)  # target words per source word
    n_src = Counter(j for _, j in gold)  # source words per target word
    out = {}
    for i, j in gold:
        many_tgt, many_src = n_tgt[i] > 1, n_src[j] > 1
        out[(i, j)] = SHAPES[2 * many_src + many_tgt]
    return out


def sentence_sums(
    gold: Iterable[tuple[int, int]],
    steps: Iterable[Step],
    group: Callable[[int, int], str],
) -> dict[str, np.ndarray]:
    """One sentence's weighted sums per group (:data:`FIELDS`, in that order).

    Args:
        gold: its gold links ``(source word, target word)``.
        steps: one :data:`Step` per target word scored.
        group: link ``(i, j)`` → its group.

    Returns:
        Group → array of the six sums.
    """
    by_word: dict[int, list[tuple[int, int]]] = {}
    for i, j in gold:
        by_word.setdefault(j, []).append((i, j))
    out: dict[str, np.ndarray] = {}
    for word, n_hyp, n_hit, mass in steps:
        links = by_word.get(word, [])
        weights = Counter(group(*link) for link in links) if links else Counter({NO_LINK: 1})
        total = sum(weights.values())
        for g, k in weights.items():
            w = k / total
            row = out.setdefault(g, np.zeros(len(FIELDS)))
            has_mass = bool(links) and not math.isnan(mass)
            row += w * np.array(
                [n_hit, n_hyp, len(links), mass if has_mass else 0.0, float(has_mass), 1.0]
            )
    return out


def hard_steps(hyp: Iterable[tuple[int, int]], gold: Iterable[tuple[int, int]], n_words: int):
    """The :data:`Step` of every target word ``0 … n_words − 1`` of an aligner of hard links
    (no gold mass)."""
    hyp, gold = set(hyp), set(gold)
    n_hyp, n_hit = Counter(j for _, j in hyp), Counter(j for i, j in hyp if (i, j) in gold)
    return [(j, float(n_hyp[j]), float(n_hit[j]), math.nan) for j in range(n_words)]


def breakdown(
    sums: Sequence[Mapping[str, np.ndarray]],
    *,
    order: Sequence[str] = (),
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, dict[str, Estimate | float]]:
    """Per group, the estimates of the module docstring over the sentences' sums.

    Args:
        sums: per sentence, :func:`sentence_sums`'s result.
        order: groups first in this order; the others after them by gold links, most first (ties
            by name), and :data:`NO_LINK` last.
        resamples, seed: of the bootstrap.

    Returns:
        Group → ``aer``, ``precision``, ``recall``, ``gold_mass`` (:class:`Estimate`, NaN where
        undefined), ``gold_links`` and ``steps`` (weighted counts, floats).
    """
    groups = {g for s in sums for g in s}
    total = {g: sum(s[g] for s in sums if g in s) for g in groups}
    rest = sorted(
        (g for g in groups if g not in order and g != NO_LINK), key=lambda g: (-total[g][2], g)
    )
    ranked = [g for g in order if g in groups] + rest + ([NO_LINK] if NO_LINK in groups else [])
    out = {}
    for g in ranked:
        m = np.array([s[g] if g in s else np.zeros(len(FIELDS)) for s in sums])
        hit, n_hyp, n_sure, mass, mass_w, steps = m.T
        kw = {"resamples": resamples, "seed": seed}
        out[g] = {
            "aer": ratio_estimate(2 * hit, n_hyp + n_sure, complement=True, **kw),
            "precision": ratio_estimate(hit, n_hyp, **kw),
            "recall": ratio_estimate(hit, n_sure, **kw),
            "gold_mass": ratio_estimate(mass, mass_w, **kw),
            "gold_links": float(n_sure.sum()),
            "steps": float(steps.sum()),
        }
    return out


def _count(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def rows(
    result: Mapping[str, Mapping[str, Estimate | float]],
    lead: Mapping[str, str],
    group_label: str,
    stats: Sequence[str] = ("aer", "precision", "recall", "gold_mass"),
    no_mass: str = "no attention",
) -> list[dict[str, str]]:
    """:func:`breakdown`'s result as table rows of cell text: the ``lead`` cells (aligner, test
    verses …), the group under ``group_label``, ``steps``, ``gold links`` and ``stats`` (AER,
    precision, recall, gold mass; a gold mass without steps to define it says ``no_mass``)."""
    labels = {"aer": "AER", "precision": "precision", "recall": "recall", "gold_mass": "gold mass"}
    out = []
    for g, r in result.items():
        row = {**lead, group_label: g, "steps": _count(r["steps"])}
        row["gold links"] = _count(r["gold_links"])
        for s in stats:
            e = r[s]
            if s == "gold_mass" and not math.isfinite(e.value) and g != NO_LINK:
                row[labels[s]] = no_mass
            else:
                row[labels[s]] = cell(e)
        out.append(row)
    return out


def tag_group(task: str, cfg) -> Callable[[str, int, int], str] | None:
    """``(example id, source word, target word) -> group`` of the task's word tags
    (:attr:`attnstudy.data.tasks.TaskSpec.word_tags`), or None where the task (or its direction)
    has none.

    Raises:
        DataError: as the task's loader.
    """
    from attnstudy.data.tasks import get_task

    spec = get_task(task).word_tags
    if spec is None:
        return None
    tags = spec.tags(cfg)
    if not tags:
        return None
    return lambda ex, i, j: spec.group(tags[ex][i])


def eflomal_breakdowns(
    aligned, *, heuristic: str | None = None, n_scored=(None,), resamples: int = 1000, seed: int = 0
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """eflomal's breakdowns on task ``nt-greek-english``: by the Greek word's part of speech
    (through the task registry's word tags) AER, precision and recall, and by link shape recall;
    for one symmetrisation (default grow-diag-final-and) and each number of test verses in
    ``n_scored`` (None: all).

    Args:
        aligned: :class:`attnstudy.data.eflomal.NTAlignment`.

    Returns:
        (rows by part of speech, rows by link shape), cell text.
    """
    from attnstudy.data import nt
    from attnstudy.data.symmetrise import DEFAULT
    from attnstudy.data.tasks import get_task

    heuristic = heuristic or DEFAULT
    group = tag_group(nt.TASK, aligned.cfg)
    label = get_task(nt.TASK).word_tags.label
    by_pos, by_shape = [], []
    for n in n_scored:
        hyps, golds = aligned.scored(heuristic, n)
        verses = aligned.test[: len(golds)]
        lead = {"aligner": f"eflomal, {heuristic}", "test verses": f"{len(golds):,}"}
        pos_sums, shape_sums = [], []
        for v, hyp, gold, ren in zip(verses, hyps, golds, aligned.renumber):
            steps = hard_steps(hyp, gold, len(ren))
            ex = f"nt/test/{v.id}"
            pos_sums.append(sentence_sums(gold, steps, lambda i, j, ex=ex: group(ex, i, j)))
            shapes = link_shapes(gold)
            shape_sums.append(sentence_sums(gold, steps, lambda i, j, s=shapes: s[(i, j)]))
        kw = {"resamples": resamples, "seed": seed}
        by_pos += rows(breakdown(pos_sums, **kw), lead, label, ("aer", "precision", "recall"))
        by_shape += rows(breakdown(shape_sums, order=SHAPES, **kw), lead, "link shape", ("recall",))
    return by_pos, by_shape


def attention_steps(table, n_words: int) -> list[Step]:
    """An example's :data:`Step` list from the ``alignment`` ablation's per-step rows (one
    example, one unit: a layer's head mean), one step per target word ``0 … n_words − 1`` that
    the table scores: its ``alignment_n_hyp``, ``alignment_n_hyp_sure`` and
    ``alignment_gold_mass`` on the row of the word (``alignment_word`` for subword tokens, else
    the step; the ``<eos>`` step and a subword after its word's first count nothing).

    Args:
        table: a :class:`pandas.DataFrame` of the ablation's rows of one example.
        n_words: the example's number of target words.
    """
    unit = table["alignment_word"] if "alignment_word" in table.columns else table["step"]
    counted = table["alignment_gold_mass"].notna() | (table["alignment_n_hyp"] > 0)
    out = {}
    for w, n_hyp, n_hit, mass, ok in zip(
        unit.tolist(),
        table["alignment_n_hyp"].tolist(),
        table["alignment_n_hyp_sure"].tolist(),
        table["alignment_gold_mass"].tolist(),
        counted.tolist(),
    ):
        if w is None or (isinstance(w, float) and math.isnan(w)):
            continue
        w = int(w)
        if 0 <= w < n_words and (ok or w not in out):
            out[w] = (w, float(n_hyp), float(n_hit), float(mass))
    return [out[w] for w in sorted(out)]


def attention_breakdowns(
    table, examples, task: str, cfg, *, label: str, resamples: int = 1000, seed: int = 0
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Attention's breakdowns from the ``alignment`` ablation's per-step table of one unit (the
    head mean of one layer, reference prefix): by the source word's tag (where the task has word
    tags) AER, precision, recall and gold mass; by link shape recall and gold mass.

    Args:
        table: a :class:`pandas.DataFrame` with ``example_id`` and the ablation's columns.
        examples: the :class:`~attnstudy.data.types.Example` of every ``example_id`` (gold links
            ``(source word, target word)``; ``tgt_words`` for subword tokens).
        task, cfg: the task and its data section (for :func:`tag_group`).
        label: the rows' ``aligner`` cell (e.g. the model and layer).
        resamples, seed: of the bootstrap.

    Returns:
        (rows by tag — empty where the task has no word tags —, rows by link shape), cell text;
        examples without gold links are left out.
    """
    from attnstudy.data.tasks import get_task

    group = tag_group(task, cfg)
    by_id = {ex.id: ex for ex in examples}
    pos_sums, shape_sums = [], []
    for ex_id, part in table.groupby("example_id", sort=False):
        ex = by_id[ex_id]
        if ex.alignment is None:
            continue
        gold = set(ex.alignment.sure)
        n_words = max(ex.tgt_words) + 1 if ex.tgt_words else len(ex.tgt)
        steps = attention_steps(part, n_words)
        if group is not None:
            pos_sums.append(sentence_sums(gold, steps, lambda i, j, e=ex_id: group(e, i, j)))
        shapes = link_shapes(gold)
        shape_sums.append(sentence_sums(gold, steps, lambda i, j, s=shapes: s[(i, j)]))
    lead = {"aligner": label, "examples": f"{len(shape_sums):,}"}
    kw = {"resamples": resamples, "seed": seed}
    by_tag = []
    if group is not None:
        tag_label = get_task(task).word_tags.label
        by_tag = rows(breakdown(pos_sums, **kw), lead, tag_label)
    by_shape = rows(
        breakdown(shape_sums, order=SHAPES, **kw), lead, "link shape", ("recall", "gold_mass")
    )
    return by_tag, by_shape
