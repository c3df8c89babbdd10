"""One-line notices to the user: hints about doubtful input and counts of what was left out.

They go to the ``attnstudy`` logger at WARNING level; the CLI prints each as
``attnstudy: note: …`` on stderr, a notebook sees them through :mod:`logging`.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("attnstudy")


def notice(message: str) -> None:
    """Tell the user something they should know but that does not stop the work (one line)."""
    logger.warning(message.replace("\n", " "))
