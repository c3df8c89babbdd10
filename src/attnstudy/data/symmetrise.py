"""Symmetrisation of two directional word alignments: the heuristics of statistical MT.

An aligner of the IBM-model family links each target word to at most one source word
(``forward``) and, run the other way, each source word to at most one target word
(``backward``); the heuristics join the two (Och & Ney 2003, §4.1, "Computational Linguistics"
29(1): intersection, union, and the refined method; Koehn, Och & Marcu 2003, "Statistical
Phrase-Based Translation", NAACL, §3.1: grow-diag-final; Koehn, Axelrod, Birch Mayne,
Callison-Burch, Osborne & Talbot 2005, "Edinburgh System Description for the 2005 IWSLT Speech
Translation Evaluation", §2: grow-diag-final-and). The growing heuristics are Moses' ``symal``
(``-alignment=grow -diagonal=yes [-final=yes [-both=yes]]``), in the Moses manual's pseudo-code
(statmt.org/moses, "Training: word alignment"):

.. code-block:: text

    alignment = intersect(e2f, f2e); GROW-DIAG(); FINAL(e2f); FINAL(f2e)
    GROW-DIAG: iterate until no new points added
        for e = 0 … en: for f = 0 … fn: if (e, f) aligned:
            for each of the 8 neighbouring points (e-new, f-new):
                if (e-new not aligned or f-new not aligned) and (e-new, f-new) in union(e2f, f2e):
                    add (e-new, f-new)
    FINAL(a): for e-new = 0 … en: for f-new = 0 … fn:
        if (e-new not aligned or f-new not aligned) and (e-new, f-new) in a: add it
    FINAL-AND(a): the same with "e-new not aligned and f-new not aligned"

grow-diag stops after GROW-DIAG; grow-diag-final-and calls FINAL-AND where grow-diag-final
calls FINAL. Links are ``(source_index, target_index)`` pairs as everywhere in attnstudy;
"aligned" is read from the alignment as it grows; the loops run over source words, then target
words. eflomal ships no symmetrisation (its authors use ``atools``).

:data:`SYMMETRISATIONS` is the one list of the rows a reference aligner is reported with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

Links = set[tuple[int, int]]
Pairs = Iterable[tuple[int, int]]

NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))
"""The eight neighbouring points of GROW-DIAG (the first four alone are GROW)."""


def forward_only(forward: Pairs, backward: Pairs) -> Links:
    """The forward (source → target model) links alone; ``backward`` is not read."""
    return set(forward)


def backward_only(forward: Pairs, backward: Pairs) -> Links:
    """The backward (target → source model) links alone; ``forward`` is not read."""
    return set(backward)


def intersection(forward: Pairs, backward: Pairs) -> Links:
    """Links both directions make (Och & Ney 2003, §4.1): high precision, one link per word at
    most on each side."""
    return set(forward) & set(backward)


def union(forward: Pairs, backward: Pairs) -> Links:
    """Links either direction makes (Och & Ney 2003, §4.1): high recall."""
    return set(forward) | set(backward)


def _grow_diag(fwd: Links, rev: Links) -> tuple[Links, set[int], set[int]]:
    """The intersection grown along the eight neighbours inside the union (GROW-DIAG), with the
    source and target words it aligns."""
    both = fwd | rev
    alignment = fwd & rev
    src_aligned = {i for i, _ in alignment}
    tgt_aligned = {j for _, j in alignment}
    src_len = max((i for i, _ in both), default=-1) + 1
    tgt_len = max((j for _, j in both), default=-1) + 1
    added = True
    while added:
        added = False
        for i in range(src_len):
            for j in range(tgt_len):
                if (i, j) not in alignment:
                    continue
                for di, dj in NEIGHBOURS:
                    ni, nj = i + di, j + dj
                    if (ni, nj) in alignment or (ni, nj) not in both:
                        continue
                    if ni not in src_aligned or nj not in tgt_aligned:
                        alignment.add((ni, nj))
                        src_aligned.add(ni)
                        tgt_aligned.add(nj)
                        added = True
    return alignment, src_aligned, tgt_aligned


def _final(fwd: Links, rev: Links, *, both_unaligned: bool) -> Links:
    """GROW-DIAG, then FINAL (``both_unaligned`` False) or FINAL-AND (True) of the forward
    links, then of the backward links."""
    alignment, src_aligned, tgt_aligned = _grow_diag(fwd, rev)
    for directional in (fwd, rev):
        for i, j in sorted(directional):  # source words, then target words, as the loops
            if (i, j) in alignment:
                continue
            free_i, free_j = i not in src_aligned, j not in tgt_aligned
            if (free_i and free_j) if both_unaligned else (free_i or free_j):
                alignment.add((i, j))
                src_aligned.add(i)
                tgt_aligned.add(j)
    return alignment


def grow_diag(forward: Pairs, backward: Pairs) -> Links:
    """The intersection grown along the diagonal neighbours inside the union (GROW-DIAG of the
    module docstring; Koehn et al. 2003, §3.1), without a final step."""
    return _grow_diag(set(forward), set(backward))[0]


def grow_diag_final(forward: Pairs, backward: Pairs) -> Links:
    """grow-diag-final (Koehn et al. 2003, §3.1): GROW-DIAG, then each direction's links of
    which at least one word is still unaligned (FINAL), forward first."""
    return _final(set(forward), set(backward), both_unaligned=False)


def grow_diag_final_and(forward: Pairs, backward: Pairs) -> Links:
    """grow-diag-final-and of a forward and a backward alignment of one sentence pair (Koehn et
    al. 2005, §2; the module docstring gives the procedure).

    Args:
        forward: links ``(source_index, target_index)`` of the source → target model (each target
            word linked to at most one source word, as eflomal's ``-f`` writes them).
        backward: links ``(source_index, target_index)`` of the target → source model (eflomal's
            ``-r``, also source first).

    Returns:
        The symmetrised links: the intersection, grown along the diagonal neighbours inside the
        union, then the union's links of words still unaligned on both sides (forward first).
    """
    return _final(set(forward), set(backward), both_unaligned=True)


SYMMETRISATIONS: dict[str, Callable[[Pairs, Pairs], Links]] = {
    "forward": forward_only,
    "backward": backward_only,
    "intersection": intersection,
    "union": union,
    "grow-diag": grow_diag,
    "grow-diag-final": grow_diag_final,
    "grow-diag-final-and": grow_diag_final_and,
}
"""Registry: a reference aligner's row name → ``(forward, backward) -> links``. Every function
takes and returns ``(source_index, target_index)`` links of one sentence pair."""
DEFAULT = "grow-diag-final-and"
"""The row a study's report shows beside attention (the reference aligner's name)."""
