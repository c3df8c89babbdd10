"""Errors of the analysis layer."""


class NoAttentionError(ValueError):
    """The model has no attention (the ``none`` score): attention-based ablations do not apply."""
