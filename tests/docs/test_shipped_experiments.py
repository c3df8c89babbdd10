"""The shipped experiments set an ablation's parameters one way, the documented one
(``[ablation.<name>]``, e.g. ``[ablation.permutation] n``), never an earlier key
(``[ablation] n_permutations``) that the catalogue still reads for old files."""

import tomllib
from pathlib import Path

from attnstudy.analysis import catalogue

ROOT = Path(__file__).parents[2]


def test_shipped_experiments_use_only_the_per_ablation_tables():
    files = sorted((ROOT / "experiments").glob("*.toml"))
    assert files
    found = []
    for path in files:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        sections = [raw.get("ablation", {})]
        sections += [m.get("ablation", {}) for m in raw.get("models", [])]
        for section in sections:
            found += [f"{path.name}: ablation.{k}" for k in catalogue._OLD_KEYS if k in section]
    assert not found, f"use [ablation.<name>] tables instead: {found}"
