"""Token vocabulary with four reserved specials (JoeyNMT style)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIALS = (PAD, BOS, EOS, UNK)


class Vocab:
    """A bidirectional token ↔ id map; ids 0–3 are ``<pad> <bos> <eos> <unk>``.

    Attributes:
        itos: id → token.
        stoi: token → id.
    """

    def __init__(self, itos: Sequence[str]) -> None:
        """Build from a full id → token list (specials first).

        Raises:
            ValueError: if the specials are not the first four entries or a token repeats.
        """
        itos = list(itos)
        if tuple(itos[:4]) != SPECIALS:
            raise ValueError(f"vocabulary must start with {list(SPECIALS)}, got {itos[:4]}")
        if len(set(itos)) != len(itos):
            dup = sorted({t for t in itos if itos.count(t) > 1})
            raise ValueError(f"vocabulary has repeated tokens: {dup[:5]}")
        self.itos: list[str] = itos
        self.stoi: dict[str, int] = {t: i for i, t in enumerate(itos)}

    @classmethod
    def build(cls, sequences: Iterable[Sequence[str]]) -> Vocab:
        """Collect every token of ``sequences``; specials first, then tokens sorted.

        The result depends only on the set of tokens, never on their order or counts.

        Raises:
            ValueError: if the data holds a special token: it would silently merge with it.
        """
        tokens = {t for seq in sequences for t in seq}
        clash = sorted(tokens & set(SPECIALS))
        if clash:
            raise ValueError(
                f"the data holds the special token(s) {clash}, which would merge with the "
                "model's own; rename them in the data"
            )
        return cls([*SPECIALS, *sorted(tokens)])

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Map tokens to ids; unknown tokens → ``UNK_ID``. No ``<bos>``/``<eos>`` is added."""
        return [self.stoi.get(t, UNK_ID) for t in tokens]

    def count_unknown(self, tokens: Iterable[str]) -> int:
        """Number of tokens that are not in the vocabulary."""
        return sum(1 for t in tokens if t not in self.stoi)

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Map ids to tokens, stopping at the first ``<eos>`` and dropping ``<pad>``/``<bos>``."""
        out: list[str] = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i in (PAD_ID, BOS_ID):
                continue
            out.append(self.itos[i] if 0 <= i < len(self.itos) else UNK)
        return out

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``{"itos": [...]}``) that :meth:`from_json` reads back."""
        return {"itos": list(self.itos)}

    @classmethod
    def from_json(cls, d: Any) -> Vocab:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: if ``d`` is not ``{"itos": [str, ...]}`` with the specials first and
                no repeated token.
        """
        if not isinstance(d, dict) or not isinstance(d.get("itos"), list):
            raise ValueError('vocabulary JSON must be an object {"itos": [token, ...]}')
        if not all(isinstance(t, str) for t in d["itos"]):
            raise ValueError("vocabulary JSON: every token in 'itos' must be a string")
        return cls(d["itos"])

    def __len__(self) -> int:
        return len(self.itos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)})"
