"""Data: tasks, vocabulary, gold alignments and batching (DESIGN.md §2).

``batching`` imports torch; import it as ``attnstudy.data.batching`` where needed, so
``attnstudy.data`` itself stays light.
"""

from attnstudy.data.alignment import Alignment, format_pharaoh, parse_pharaoh
from attnstudy.data.tasks import TASKS, DataError, Example, Splits, detokenize, load_task, tokenize
from attnstudy.data.vocab import BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, UNK, UNK_ID, Vocab

__all__ = [
    "Alignment",
    "format_pharaoh",
    "parse_pharaoh",
    "TASKS",
    "DataError",
    "Example",
    "Splits",
    "detokenize",
    "load_task",
    "tokenize",
    "BOS",
    "BOS_ID",
    "EOS",
    "EOS_ID",
    "PAD",
    "PAD_ID",
    "UNK",
    "UNK_ID",
    "Vocab",
]
