"""One of each: one bootstrap behind every interval (attnstudy.scoring.estimates), one parser for
the
seconds-valued environment variables (attnstudy.runtime.env)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
LIBRARY = [*(ROOT / "src" / "attnstudy").rglob("*.py"), *(ROOT / "analysis").rglob("*.py")]


def _calls(path: Path, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return found


def test_one_bootstrap():
    """scipy's bootstrap, and a percentile of resamples, only in attnstudy.scoring.estimates (the
    battery, the layer mean, the reference aligner and the translation metrics each had one)."""
    home = ROOT / "src" / "attnstudy" / "scoring" / "estimates.py"
    found = [
        c
        for p in LIBRARY
        if p != home
        for c in _calls(p, {"bootstrap", "percentile", "nanpercentile", "quantile"})
    ]
    assert found == []


def test_one_parser_of_seconds_from_the_environment():
    """No module but attnstudy.runtime.env turns an environment variable into a number."""
    home = ROOT / "src" / "attnstudy" / "runtime" / "env.py"
    found = []
    for p in LIBRARY:
        if p == home:
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "float"
                and "environ" in ast.unparse(node)
            ):
                found.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert found == []


@pytest.mark.parametrize(
    "var, read, shown",
    [
        (
            "ATTNSTUDY_TRACKING_TIMEOUT",
            "attnstudy.runtime.store_check:resolve_timeout",
            "(0, 3600]",
        ),
        ("ATTNSTUDY_TRAINING_WAIT", "attnstudy.models.training:training_wait", "[0, 604800]"),
        ("ATTNSTUDY_LEASE_SECONDS", "attnstudy.tracking.leases:lease_seconds", "[4, 86400]"),
        ("ATTNSTUDY_PROGRESS_SECONDS", "attnstudy.runtime.progress:line_interval", "[0, 86400]"),
        (
            "ATTNSTUDY_PROGRESS_METRIC_SECONDS",
            "attnstudy.runtime.progress:metric_interval",
            "[0, 86400]",
        ),
        (
            "ATTNSTUDY_SYSTEM_METRICS_SECONDS",
            "attnstudy.tracking.system_metrics:sampling_interval",
            "[0.1, 86400]",
        ),
    ],
)
def test_every_seconds_variable_reads_and_refuses_alike(monkeypatch, var, read, shown):
    import importlib

    from attnstudy.config import ConfigError

    monkeypatch.setenv("ATTNSTUDY_SYSTEM_METRICS", "1")
    module, name = read.split(":")
    fn = getattr(importlib.import_module(module), name)
    monkeypatch.setenv(var, " 7 ")
    assert fn() == 7.0
    monkeypatch.setenv(var, "soon")
    with pytest.raises(ConfigError) as err:
        fn()
    assert str(err.value).startswith(f"{var}='soon' is not a number of seconds in {shown}")
    assert "unset it for the default (" in str(err.value) and "\n" not in str(err.value)
    monkeypatch.setenv(var, "")
    assert fn() > 0  # blank: the default
