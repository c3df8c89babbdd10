"""Gold word alignments in the Pharaoh format (``0-0 1-2 2p3``).

A link ``i-j`` joins source position ``i`` to target position ``j`` (0-based, source first),
as written by fast_align and awesome-align; ``ipj`` is a "possible" link. Sure links are also
possible (S ⊆ P), as AER requires (Och & Ney 2003, "A Systematic Comparison of Various
Statistical Alignment Models", Computational Linguistics 29(1)).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINK = re.compile(r"^(-?\d+)([-p])(-?\d+)$")


@dataclass(frozen=True)
class Alignment:
    """Sure and possible links, each a ``(source_index, target_index)`` pair.

    Attributes:
        sure: links annotated as sure (S).
        possible: every link, sure ones included (P ⊇ S).
    """

    sure: frozenset[tuple[int, int]]
    possible: frozenset[tuple[int, int]]

    def __post_init__(self) -> None:
        if not self.sure <= self.possible:
            object.__setattr__(self, "possible", self.possible | self.sure)

    @property
    def sure_only(self) -> bool:
        """Whether every link is sure (no possible-only links): AER is then 1 − F1."""
        return self.possible == self.sure

    @classmethod
    def from_links(cls, links: set[tuple[int, int]] | frozenset[tuple[int, int]]) -> Alignment:
        """An alignment whose links are all sure."""
        s = frozenset(links)
        return cls(sure=s, possible=s)


def parse_pharaoh(text: str, src_len: int | None = None, tgt_len: int | None = None) -> Alignment:
    """Parse a Pharaoh alignment line.

    Args:
        text: whitespace-separated links, ``i-j`` (sure) or ``ipj`` (possible only).
        src_len: source length in tokens; if given, every ``i`` must be ``< src_len``.
        tgt_len: target length in tokens; if given, every ``j`` must be ``< tgt_len``.

    Returns:
        The alignment (an empty line gives no links).

    Raises:
        ValueError: naming the bad link, for bad syntax, a negative index or an index past
            the end of the sentence.
    """
    sure: set[tuple[int, int]] = set()
    possible: set[tuple[int, int]] = set()
    for link in text.split():
        m = _LINK.match(link)
        if m is None:
            raise ValueError(
                f"alignment link '{link}' is not 'i-j' or 'ipj' (0-based source-target)"
            )
        i, kind, j = int(m.group(1)), m.group(2), int(m.group(3))
        if i < 0 or j < 0:
            raise ValueError(f"alignment link '{link}' has a negative index; indices are 0-based")
        if src_len is not None and i >= src_len:
            raise ValueError(
                f"alignment link '{link}': source index {i} is past the source ({src_len} tokens)"
            )
        if tgt_len is not None and j >= tgt_len:
            raise ValueError(
                f"alignment link '{link}': target index {j} is past the target ({tgt_len} tokens)"
            )
        possible.add((i, j))
        if kind == "-":
            sure.add((i, j))
    return Alignment(sure=frozenset(sure), possible=frozenset(possible))


def format_pharaoh(alignment: Alignment) -> str:
    """Write an alignment as Pharaoh text, sorted by (target, source).

    Sure links are written ``i-j``, possible-only links ``ipj``.
    """
    links = sorted(alignment.possible | alignment.sure, key=lambda ij: (ij[1], ij[0]))
    return " ".join(f"{i}-{j}" if (i, j) in alignment.sure else f"{i}p{j}" for i, j in links)
