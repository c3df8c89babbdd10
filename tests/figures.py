"""Figures made and saved but not drawn, for tests whose figures other tests draw in full."""

from __future__ import annotations

import contextlib

import pytest


@contextlib.contextmanager
def figures_undrawn():
    """Within it, figures are made and saved (blank PNG files of their sizes, logged and written
    as usual) but not drawn: ``Figure.draw`` does nothing. For a test that checks nothing drawn,
    where matplotlib's drawing is a large part of its time, and only where the same kinds of
    figure on the same data are drawn in full elsewhere in the suite (:func:`tiny_study`, which
    builds its report, the report and figure tests, or another part of the same test)."""
    from matplotlib.figure import Figure

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "draw", lambda self, renderer: None)
        yield
