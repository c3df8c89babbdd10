"""The New Testament corpus's verses grouped into examples
(:func:`attnstudy.data.nt.parse_corpus`): a union-find over verse ids joins the verses an
alignment record spans, and each group with words on both sides and a linked record becomes one
example."""

from __future__ import annotations


class VerseUnion:
    """Union-find over verse ids (path halving); a record joins the verses of all its words."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, v: str) -> str:
        parent = self.parent
        parent.setdefault(v, v)
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    def join(self, verses: set[str]) -> None:
        """Put ``verses`` in one group (the group of the smallest id's root)."""
        first = self.find(min(verses)) if verses else None
        for v in verses:
            root = self.find(v)
            if root != first:
                self.parent[root] = first


def verse_groups(greek: dict, english: dict, parsed: list, union: VerseUnion) -> dict:
    """Root verse → {"verses", "g": [(Greek token id, text)], "e": [(English token id, row)],
    "recs": records with links}, tokens in id order."""
    groups: dict[str, dict] = {}
    for tid, (verse, text) in sorted(greek.items()):
        groups.setdefault(union.find(verse), {"verses": set(), "g": [], "e": [], "recs": 0})
        g = groups[union.find(verse)]
        g["verses"].add(verse)
        g["g"].append((tid, text))
    for tid, (verse, row) in sorted(english.items()):
        g = groups.setdefault(union.find(verse), {"verses": set(), "g": [], "e": [], "recs": 0})
        g["e"].append((tid, row))
    for src_ids, tgt_ids in parsed:  # the records with links (a Greek and an English side)
        if src_ids and tgt_ids:
            groups[union.find(greek[src_ids[0]][0])]["recs"] += 1
    return groups


def group_examples(groups: dict, greek_pos: dict):
    """One example per group with both sides and a linked record, in verse order. Returns (the
    examples as dicts with empty ``links``, token id → (example, position), the counts of
    dropped and merged verses)."""
    out, dropped_verses, dropped_english = [], 0, 0
    merged_examples = merged_verses = across = 0
    index: dict[str, tuple[int, int]] = {}  # token id → (example, position)
    for key in sorted(groups, key=lambda k: min(groups[k]["verses"] or {k})):
        g = groups[key]
        if not g["g"] or not g["e"] or not g["recs"]:
            dropped_verses += len(g["verses"])
            dropped_english += len(g["e"])
            continue
        verses = sorted(g["verses"])
        if len(verses) > 1:
            merged_examples += 1
            merged_verses += len(verses)
        if len({v[:5] for v in verses}) > 1:
            across += 1
        n = len(out)
        for pos, (tid, _) in enumerate(g["g"]):
            index[tid] = (n, pos)
        for pos, (tid, _) in enumerate(g["e"]):
            index[tid] = (n, pos)
        out.append(
            {
                "id": "+".join(verses),
                "chapter": verses[0][:5],
                "greek": tuple(t for _, t in g["g"]),
                "pos": tuple(greek_pos[tid] for tid, _ in g["g"]),
                "english": tuple(r["text"] for _, r in g["e"]),
                "exclude": tuple(r["exclude"] == "y" for _, r in g["e"]),
                "skip": tuple(r["skip_space_after"] == "y" for _, r in g["e"]),
                "links": set(),
            }
        )
    counts = {
        "dropped_verses": dropped_verses,
        "dropped_english": dropped_english,
        "merged_examples": merged_examples,
        "merged_verses": merged_verses,
        "across": across,
    }
    return out, index, counts
