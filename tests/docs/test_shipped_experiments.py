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


def test_the_example_browser_deep_link_is_documented_as_the_page_reads_it():
    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    page = (ROOT / "src" / "attnstudy" / "templates" / "examples.html.j2").read_text(
        encoding="utf-8"
    )
    assert "location.hash.match(/ex=([^&]+)/)" in page and "decodeURIComponent(m[1])" in page
    assert "`#ex=<example id>`" in usage
    assert "examples/copy_additive_bahdanau.html#ex=copy%2Ftest%2F7" in usage


def test_readme_and_usage_say_ablate_takes_the_model_run():
    """``ablate runs:/<run_id>`` needs the training run (the ``runs:/…`` after ``trained …:``),
    not a study or ablation run, which a newcomer could not tell from the README."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert (
        "`runs:/<run_id>` is the *model* run (the `runs:/…` after `trained …:` above, not its ablations run"
        in readme
    )
    usage = " ".join((ROOT / "docs" / "usage.md").read_text(encoding="utf-8").split())
    assert "`attnstudy ablate runs:/<run_id>` takes the *model* run" in usage
