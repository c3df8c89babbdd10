"""Missing prerequisites: skipped with the reason on a developer's machine, a failure under CI.

`make test` installs what the tests need (Debian's chromium, the optional extras); a test whose
prerequisite is still missing must not pass quietly in CI, where a skip would hide a broken install.
``CI=true`` (set by ``.ci/run`` and by most CI services) turns the skip into a failure.
"""

from __future__ import annotations

import os
import sys

import pytest


def under_ci() -> bool:
    """Whether ``$CI`` says this is a CI run (``true``/``1``/``yes``)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require(available: bool, reason: str, module_level: bool = False) -> None:
    """Skip (or, under CI, fail) unless ``available``; the reason is printed past the capture."""
    if available:
        return
    if under_ci():
        pytest.fail(f"prerequisite missing under CI=true: {reason}", pytrace=False)
    print(f"\nSKIPPED: {reason}", file=sys.__stderr__)
    pytest.skip(reason, allow_module_level=module_level)
