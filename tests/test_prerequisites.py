"""A missing prerequisite is a skip on a developer's machine and a failure under CI=true."""

import pytest
from prerequisites import require


def test_missing_prerequisite_skips_locally_and_fails_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no chromium"):
        require(False, "no chromium")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(
        pytest.fail.Exception, match="prerequisite missing under CI=true: no chromium"
    ):
        require(False, "no chromium")
    require(True, "present")  # nothing happens
