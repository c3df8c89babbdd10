"""One report folder per experiment name (report.build.report_dir): ``.tiny`` wrote into
``reports/tiny``, ``a..b`` into ``reports/a.b`` and a store name ``a b`` into ``reports/a_b``, so
one experiment's report replaced another's."""

from __future__ import annotations

import random

import pytest

from attnstudy.report import report_dir
from attnstudy.report.build import report_folder_name

PLAIN = ("quickstart", "tiny", "dates-seeds", "copy80", "a.b", "x_y", "hf-example", "-x", "9")
"""Names that are already a safe folder name: their folder is the plain name, as before."""


@pytest.fixture
def reports(fresh_root):
    return (fresh_root / "reports").resolve()


@pytest.mark.parametrize(
    ("one", "other"),
    [(".tiny", "tiny"), ("a..b", "a.b"), ("a b", "a_b"), ("a/b", "a_b"), ("Tiny", "tiny")],
)
def test_names_the_slug_merged_get_their_own_folders(one, other, reports):
    assert report_dir(one) != report_dir(other)
    # a case-insensitive file system (macOS, Windows) must see two folders too
    assert report_dir(one).name.lower() != report_dir(other).name.lower()
    for name in (one, other):
        assert report_dir(name).parent == reports and not report_dir(name).name.startswith(".")


def test_a_safe_name_keeps_its_plain_folder(reports):
    for name in PLAIN:
        assert report_dir(name) == reports / name
    assert report_dir(".tiny").name.startswith("tiny-")  # the slug stays readable
    assert report_dir(".tiny") == report_dir(".tiny")  # and the same on every call


def _names(rng: random.Random, n: int) -> list[str]:
    """Names an experiment (``[A-Za-z0-9_.-]``) or the store (anything) can have, crowded onto few
    slugs: dots, case, characters the slug replaces, long and non-ASCII names."""
    alphabet = ["a", "A", "b", "B", ".", "..", "_", "-", " ", "/", "\\", "é", "\x00", "0", "ß"]
    names = set()
    while len(names) < n:
        names.add("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))))
    names |= {"a" * 300, "a" * 300 + "b", "." * 3, "", "study"}
    return sorted(names)


def test_distinct_names_give_distinct_folders(reports):
    rng = random.Random(0)
    names = _names(rng, 3000)
    names += [report_folder_name(n) for n in names]  # a name spelled as another's folder
    seen: dict[str, str] = {}
    for name in names:
        folder = report_folder_name(name)
        assert folder not in ("", ".", "..") and "/" not in folder and "\x00" not in folder, name
        assert not folder.startswith(".") and len(folder.encode()) <= 255, name
        key = folder.lower()
        assert seen.setdefault(key, name) == name, (name, seen[key], folder)
    assert len(seen) == len(set(names)) > 3000
    for name in names[::50]:  # report_dir is that folder under reports/
        assert report_dir(name) == reports / report_folder_name(name)
