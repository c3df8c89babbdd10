"""Symmetrisation of two directional word alignments: grow-diag-final-and.

Koehn, Axelrod, Birch Mayne, Callison-Burch, Osborne & Talbot 2005, "Edinburgh System
Description for the 2005 IWSLT Speech Translation Evaluation", §2 (the heuristic Moses'
``symal`` implements as ``-alignment=grow -diagonal=yes -final=yes -both=yes``), in the Moses
manual's pseudo-code (statmt.org/moses, "Training: word alignment"):

.. code-block:: text

    alignment = intersect(e2f, f2e); GROW-DIAG(); FINAL-AND(e2f); FINAL-AND(f2e)
    GROW-DIAG: iterate until no new points added
        for e = 0 … en: for f = 0 … fn: if (e, f) aligned:
            for each of the 8 neighbouring points (e-new, f-new):
                if (e-new not aligned or f-new not aligned) and (e-new, f-new) in union(e2f, f2e):
                    add (e-new, f-new)
    FINAL-AND(a): for e-new = 0 … en: for f-new = 0 … fn:
        if e-new not aligned and f-new not aligned and (e-new, f-new) in a: add it

Links are ``(source_index, target_index)`` pairs as everywhere in attnstudy; "aligned" is read
from the alignment as it grows. eflomal ships no symmetrisation (its authors use ``atools``).
"""

from __future__ import annotations

from collections.abc import Iterable

Links = set[tuple[int, int]]

NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))
"""The eight neighbouring points of GROW-DIAG (the first four alone are GROW)."""


def grow_diag_final_and(
    forward: Iterable[tuple[int, int]], reverse: Iterable[tuple[int, int]]
) -> Links:
    """grow-diag-final-and of a forward and a reverse alignment of one sentence pair (Koehn et
    al. 2005; the module docstring gives the procedure).

    Args:
        forward: links ``(source_index, target_index)`` of the source → target model (each target
            word linked to at most one source word, as eflomal's ``-f`` writes them).
        reverse: links ``(source_index, target_index)`` of the target → source model (eflomal's
            ``-r``, also source first).

    Returns:
        The symmetrised links: the intersection, grown along the diagonal neighbours inside the
        union, then the union's links of words still unaligned on both sides (forward first).
    """
    fwd, rev = set(forward), set(reverse)
    union = fwd | rev
    alignment = fwd & rev
    src_aligned = {i for i, _ in alignment}
    tgt_aligned = {j for _, j in alignment}

    def add(i: int, j: int) -> None:
        alignment.add((i, j))
        src_aligned.add(i)
        tgt_aligned.add(j)

    src_len = max((i for i, _ in union), default=-1) + 1
    tgt_len = max((j for _, j in union), default=-1) + 1
    added = True
    while added:  # GROW-DIAG
        added = False
        for i in range(src_len):
            for j in range(tgt_len):
                if (i, j) not in alignment:
                    continue
                for di, dj in NEIGHBOURS:
                    ni, nj = i + di, j + dj
                    if (ni, nj) in alignment or (ni, nj) not in union:
                        continue
                    if ni not in src_aligned or nj not in tgt_aligned:
                        add(ni, nj)
                        added = True
    for directional in (fwd, rev):  # FINAL-AND(e2f), FINAL-AND(f2e)
        for i in range(src_len):
            for j in range(tgt_len):
                if (i, j) in directional and i not in src_aligned and j not in tgt_aligned:
                    add(i, j)
    return alignment
