"""grow-diag-final-and against a hand-worked example (Koehn et al. 2005; Moses' pseudo-code)."""

from attnstudy.data.symmetrise import grow_diag_final_and

# 5 source words (i), 6 target words (j); links (i, j).
# forward (one source per target): j0→0, j1→1, j2→1, j3→3, j4→0; j5 unaligned
FORWARD = {(0, 0), (1, 1), (1, 2), (3, 3), (0, 4)}
# reverse (one target per source): i0→0, i1→1, i2→3, i3→3, i4→5
REVERSE = {(0, 0), (1, 1), (2, 3), (3, 3), (4, 5)}


def test_grow_diag_final_and_known_answer():
    # intersection {(0,0), (1,1), (3,3)};
    # GROW-DIAG: (1,2) right of (1,1), j2 unaligned → added; (2,3) above (3,3), i2 unaligned →
    #   added; (0,4) and (4,5) touch no aligned point → not grown;
    # FINAL-AND(forward): (0,4): i0 is aligned → not added (grow-diag-final would add it);
    # FINAL-AND(reverse): (4,5): i4 and j5 both unaligned → added.
    assert grow_diag_final_and(FORWARD, REVERSE) == {(0, 0), (1, 1), (1, 2), (3, 3), (2, 3), (4, 5)}


def test_grow_diag_only_inside_the_union_and_diagonals_count():
    # (1,1) is diagonal to (0,0) and in the union: grown
    assert grow_diag_final_and({(0, 0), (1, 1)}, {(0, 0)}) == {(0, 0), (1, 1)}
    # (2,2) touches no aligned point: not grown, but FINAL-AND adds it (both words unaligned)
    assert grow_diag_final_and({(0, 0)}, {(0, 0), (2, 2)}) == {(0, 0), (2, 2)}
    # (0,2) is two steps from (0,0), and i0 is aligned: neither grown nor added
    assert grow_diag_final_and({(0, 0), (0, 2)}, {(0, 0)}) == {(0, 0)}


def test_grow_needs_one_side_unaligned():
    # (0,1) is a neighbour of (0,0), but i0 and j1 are both aligned already: not added
    fwd = {(0, 0), (1, 1), (0, 1)}
    rev = {(0, 0), (1, 1)}
    assert grow_diag_final_and(fwd, rev) == {(0, 0), (1, 1)}


def test_identical_directions_and_empty():
    links = {(0, 1), (1, 0), (2, 2)}
    assert grow_diag_final_and(links, links) == links
    assert grow_diag_final_and(set(), set()) == set()
