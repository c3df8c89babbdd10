"""The symmetrisation heuristics against hand-worked examples (Och & Ney 2003; Koehn et al. 2003
and 2005; Moses' pseudo-code), and grow-diag-final-and against the implementation it replaced."""

import random

import pytest

from attnstudy.data.symmetrise import (
    SYMMETRISATIONS,
    grow_diag,
    grow_diag_final,
    grow_diag_final_and,
)

# 5 source words (i), 6 target words (j); links (i, j).
# forward (one source per target): j0→0, j1→1, j2→1, j3→3, j4→0; j5 unaligned
FORWARD = {(0, 0), (1, 1), (1, 2), (3, 3), (0, 4)}
# backward (one target per source): i0→0, i1→1, i2→3, i3→3, i4→5
BACKWARD = {(0, 0), (1, 1), (2, 3), (3, 3), (4, 5)}

WORKED = {
    "forward": FORWARD,
    "backward": BACKWARD,
    # both directions make (0,0), (1,1) and (3,3)
    "intersection": {(0, 0), (1, 1), (3, 3)},
    "union": {(0, 0), (1, 1), (1, 2), (3, 3), (0, 4), (2, 3), (4, 5)},
    # GROW-DIAG: (1,2) right of (1,1), j2 unaligned → added; (2,3) above (3,3), i2 unaligned →
    # added; (0,4) and (4,5) touch no aligned point → not grown
    "grow-diag": {(0, 0), (1, 1), (1, 2), (3, 3), (2, 3)},
    # FINAL(forward): (0,4): i0 aligned but j4 not → added; FINAL(backward): (4,5) → added
    "grow-diag-final": {(0, 0), (1, 1), (1, 2), (3, 3), (2, 3), (0, 4), (4, 5)},
    # FINAL-AND(forward): (0,4): i0 is aligned → not added; FINAL-AND(backward): (4,5): i4 and j5
    # both unaligned → added
    "grow-diag-final-and": {(0, 0), (1, 1), (1, 2), (3, 3), (2, 3), (4, 5)},
}


@pytest.mark.parametrize("name", list(SYMMETRISATIONS))
def test_every_heuristic_on_the_worked_example(name):
    assert set(WORKED) == set(SYMMETRISATIONS)
    assert SYMMETRISATIONS[name](FORWARD, BACKWARD) == WORKED[name]


def test_final_adds_a_link_with_one_word_free_and_final_and_does_not():
    # (0,1) touches (0,0) but is in the union of forward only; i0 aligned, j1 not:
    # GROW-DIAG adds it already (one side unaligned)
    assert grow_diag({(0, 0), (0, 1)}, {(0, 0)}) == {(0, 0), (0, 1)}
    # (0,2) is two steps from (0,0): not grown; FINAL adds it (j2 unaligned), FINAL-AND does not
    fwd, rev = {(0, 0), (0, 2)}, {(0, 0)}
    assert grow_diag(fwd, rev) == {(0, 0)}
    assert grow_diag_final(fwd, rev) == {(0, 0), (0, 2)}
    assert grow_diag_final_and(fwd, rev) == {(0, 0)}
    # both words of (0,1) aligned: neither grown nor added by either final step, though in union
    fwd, rev = {(0, 0), (1, 1), (0, 1)}, {(0, 0), (1, 1)}
    assert grow_diag_final(fwd, rev) == grow_diag_final_and(fwd, rev) == {(0, 0), (1, 1)}
    assert SYMMETRISATIONS["union"](fwd, rev) == fwd


def test_grow_diag_only_inside_the_union_and_diagonals_count():
    # (1,1) is diagonal to (0,0) and in the union: grown
    assert grow_diag_final_and({(0, 0), (1, 1)}, {(0, 0)}) == {(0, 0), (1, 1)}
    # (2,2) touches no aligned point: not grown, but FINAL-AND adds it (both words unaligned)
    assert grow_diag({(0, 0)}, {(0, 0), (2, 2)}) == {(0, 0)}
    assert grow_diag_final_and({(0, 0)}, {(0, 0), (2, 2)}) == {(0, 0), (2, 2)}


def test_identical_directions_and_empty():
    links = {(0, 1), (1, 0), (2, 2)}
    for name, fn in SYMMETRISATIONS.items():
        assert fn(links, links) == links, name
        assert fn(set(), set()) == set(), name


def _previous_grow_diag_final_and(forward, reverse):
    """The implementation of attnstudy.data.symmetrise before the other heuristics (commit
    1e49fdb), kept verbatim as the oracle of the refactored one."""
    fwd, rev = set(forward), set(reverse)
    union = fwd | rev
    alignment = fwd & rev
    src_aligned = {i for i, _ in alignment}
    tgt_aligned = {j for _, j in alignment}

    def add(i, j):
        alignment.add((i, j))
        src_aligned.add(i)
        tgt_aligned.add(j)

    src_len = max((i for i, _ in union), default=-1) + 1
    tgt_len = max((j for _, j in union), default=-1) + 1
    neighbours = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))
    added = True
    while added:
        added = False
        for i in range(src_len):
            for j in range(tgt_len):
                if (i, j) not in alignment:
                    continue
                for di, dj in neighbours:
                    ni, nj = i + di, j + dj
                    if (ni, nj) in alignment or (ni, nj) not in union:
                        continue
                    if ni not in src_aligned or nj not in tgt_aligned:
                        add(ni, nj)
                        added = True
    for directional in (fwd, rev):
        for i in range(src_len):
            for j in range(tgt_len):
                if (i, j) in directional and i not in src_aligned and j not in tgt_aligned:
                    add(i, j)
    return alignment


def test_grow_diag_final_and_gives_the_previous_implementation_s_links():
    rng = random.Random(0)
    differs_from_gdf = 0
    for _ in range(400):
        n_src, n_tgt = rng.randint(1, 9), rng.randint(1, 9)
        fwd = {(rng.randrange(n_src), j) for j in range(n_tgt) if rng.random() < 0.8}
        rev = {(i, rng.randrange(n_tgt)) for i in range(n_src) if rng.random() < 0.8}
        got = grow_diag_final_and(fwd, rev)
        assert got == _previous_grow_diag_final_and(fwd, rev), (fwd, rev)
        grown = grow_diag(fwd, rev)
        assert fwd & rev <= grown <= got <= fwd | rev
        assert grown <= grow_diag_final(fwd, rev) <= fwd | rev
        differs_from_gdf += got != grow_diag_final(fwd, rev)
    assert differs_from_gdf > 50  # the random pairs exercise FINAL against FINAL-AND
