"""eflomal as a subprocess: refusals in one line (missing, failing, past its timeout, bad output),
the scores against sure-only gold, and (where eflomal is installed) a real run on the fixture."""

from __future__ import annotations

import math
import shutil
import stat
import sys
from pathlib import Path

import pytest
from attnstudy.analysis.ablations.alignment import aer
from prerequisites import require

from attnstudy.config import data_config
from attnstudy.data import eflomal, nt

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nt"
FILES = nt.NTFiles(
    FIXTURE / "SBLGNT.tsv", FIXTURE / "nt_BSB.tsv", FIXTURE / "SBLGNT-BSB-manual.json"
)
PAIRS = [(("a", "b"), ("x", "y", "z")), (("c",), ("w",))]


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-eflomal-align"
    path.write_text(f"#!{sys.executable}\n{body}\n", "utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_failing_command_is_one_line_naming_it(tmp_path):
    exe = script(
        tmp_path,
        "import sys\nprint('reading input', file=sys.stderr)\n"
        "print('ERROR: out of memory', file=sys.stderr)\nsys.exit(3)",
    )
    with pytest.raises(eflomal.EflomalError) as err:
        eflomal.align(PAIRS, command=exe)
    assert str(err.value) == "eflomal-align failed (exit code 3): ERROR: out of memory"


def test_timeout(tmp_path):
    exe = script(tmp_path, "import time\ntime.sleep(30)")
    with pytest.raises(eflomal.EflomalError, match="eflomal-align ran past its timeout of 0.5 s"):
        eflomal.align(PAIRS, command=exe, timeout_s=0.5)


def test_output_not_one_line_per_pair(tmp_path):
    exe = script(
        tmp_path,
        "import sys\na = sys.argv\nopen(a[a.index('-f') + 1], 'w').write('0-0\\n')\n"
        "open(a[a.index('-r') + 1], 'w').write('0-0\\n0-0\\n')",
    )
    with pytest.raises(
        eflomal.EflomalError, match="wrote 1 lines to forward.txt for 2 sentence pairs"
    ):
        eflomal.align(PAIRS, command=exe)


def test_links_are_read_source_first(tmp_path):
    exe = script(
        tmp_path,
        "import sys\na = sys.argv\nopen(a[a.index('-f') + 1], 'w').write('0-0 1-2\\n0-0\\n')\n"
        "open(a[a.index('-r') + 1], 'w').write('1-1\\n\\n')",
    )
    out = eflomal.align(PAIRS, command=exe)
    assert out[0].forward == {(0, 0), (1, 2)} and out[0].reverse == {(1, 1)}
    assert out[1].forward == {(0, 0)} and out[1].reverse == frozenset()
    bad = script(
        tmp_path,
        "import sys\na = sys.argv\nopen(a[a.index('-f') + 1], 'w').write('0-5\\n0-0\\n')\n"
        "open(a[a.index('-r') + 1], 'w').write('\\n\\n')",
    )
    with pytest.raises(eflomal.EflomalError, match="wrote '0-5' on line 1 of forward.txt"):
        eflomal.align(PAIRS, command=bad)


def test_missing_command_says_what_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(eflomal.EflomalMissing, match=r"pip install eflomal==2.0.0"):
        eflomal.find_command()
    monkeypatch.setattr(nt, "package_files", lambda: FILES)
    assert eflomal.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnstudy: error: the command 'eflomal-align' is not installed")
    assert err.count("\n") == 1


def test_scores_are_one_minus_f1_with_sure_only_gold():
    hyps = [{(0, 0), (1, 1), (2, 1)}, {(0, 0)}]
    gold = [{(0, 0), (1, 1), (2, 2)}, {(0, 1)}]
    s = eflomal.score(hyps, gold, resamples=200, seed=1)
    # hits 2 + 0, |A| 3 + 1, |S| 3 + 1: P = R = 2/4, F1 = 1/2
    assert s["precision"].value == pytest.approx(0.5)
    assert s["recall"].value == pytest.approx(0.5)
    assert s["aer"].value == pytest.approx(0.5)
    # Och & Ney's AER with P = S is the same number
    flat_h = {(i, j, k) for k, h in enumerate(hyps) for i, j in h}
    flat_g = {(i, j, k) for k, g in enumerate(gold) for i, j in g}
    assert aer(flat_h, flat_g, flat_g) == pytest.approx(s["aer"].value)
    assert s["aer"].low <= s["aer"].value <= s["aer"].high


def test_eflomal_on_the_fixture():
    require(
        shutil.which("eflomal-align") is not None
        or (Path(sys.executable).parent / "eflomal-align").is_file(),
        "eflomal-align is not installed (make test-deps installs eflomal==2.0.0)",
    )
    cfg = data_config(task=nt.TASK, nt_min_test_verses=0)
    parts = nt.split_verses(nt.read_corpus(FILES), cfg)
    pairs, renumber = eflomal.nt_pairs(parts["train"])
    links = eflomal.align(pairs, timeout_s=120)
    assert len(links) == len(pairs)
    for (src, tgt), d in zip(pairs, links):
        # forward: each target word from at most one source word; reverse: the other way
        assert len({j for _, j in d.forward}) == len(d.forward)
        assert len({i for i, _ in d.reverse}) == len(d.reverse)
        assert all(i < len(src) and j < len(tgt) for i, j in d.forward | d.reverse)
        assert d.forward & d.reverse <= d.symmetrised <= d.forward | d.reverse
    scores, counts = eflomal.nt_reference(FILES, cfg, timeout_s=120, resamples=100)
    assert counts["test_verses"] == 1 and counts["gold_links"] == 51  # Luke 7:18–19
    assert all(0 <= e.value <= 1 for e in scores.values())
    assert math.isnan(scores["aer"].low)  # one verse: no interval


def test_only_the_battery_s_test_verses_are_scored():
    """``n_scored``: eflomal learns on every test verse's text but is scored on the first
    ``n_scored`` test verses only, the examples a battery with ``ablation.n_examples`` analyses."""
    require(
        shutil.which("eflomal-align") is not None
        or (Path(sys.executable).parent / "eflomal-align").is_file(),
        "eflomal-align is not installed (make test-deps installs eflomal==2.0.0)",
    )
    cfg = data_config(task=nt.TASK, nt_min_test_verses=0, nt_test_fraction=0.3)
    test = nt.split_verses(nt.read_corpus(FILES), cfg)["test"]
    assert len(test) == 4
    _, counts = eflomal.nt_reference(FILES, cfg, timeout_s=120, resamples=20, n_scored=2)
    assert counts["train_verses"] == len(nt.split_verses(nt.read_corpus(FILES), cfg)["train"])
    assert counts["test_verses"] == 2
    assert counts["gold_links"] == sum(len(v.links) for v in test[:2])
    examples = nt.build_splits(FILES, cfg).test
    assert [e.id for e in examples[:2]] == [f"nt/test/{v.id}" for v in test[:2]]


def test_the_command_writes_every_row_and_the_breakdowns(monkeypatch, tmp_path, capsys):
    """``python -m attnstudy.data.eflomal --out-dir``: every heuristic's row on the same verses
    and the two breakdowns, from one run (a fake ``eflomal-align`` linking each pair's first
    words); refused before aligning when one of its files exists."""
    from attnstudy.data import breakdowns
    from attnstudy.data.symmetrise import SYMMETRISATIONS
    from attnstudy.report.results import read_rows

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = script(
        bin_dir,
        "import sys\na = sys.argv\nn = len(open(a[a.index('-s') + 1]).readlines())\n"
        "open(a[a.index('-f') + 1], 'w').write('0-0\\n' * n)\n"
        "open(a[a.index('-r') + 1], 'w').write('0-0 0-1\\n' * n)",
    )
    Path(fake).rename(bin_dir / "eflomal-align")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(nt, "package_files", lambda: FILES)
    out = tmp_path / "results"
    assert eflomal.main(["--out-dir", str(out), "--resamples", "20", "--n-scored", "1"]) == 0
    rows = read_rows(out / eflomal.OUT_FILES["rows"])
    assert [r["aligner"] for r in rows] == [f"eflomal, {h}" for h in SYMMETRISATIONS] * 2
    n_test = rows[0]["test verses"]
    assert {r["test verses"] for r in rows} == {n_test, "1"}
    by = {r["aligner"]: r for r in rows if r["test verses"] == n_test}
    # forward links (0,0) only; backward adds (0,1) (dropped where English token 1 is punctuation)
    verses = nt.split_verses(nt.read_corpus(FILES), data_config(task=nt.TASK))["test"]
    assert by["eflomal, intersection"]["links"] == str(len(verses))
    kept = sum(not v.exclude[1] for v in verses)
    assert int(by["eflomal, union"]["links"]) == len(verses) + kept
    assert by["eflomal, forward"]["links"] == by["eflomal, intersection"]["links"]
    pos = read_rows(out / eflomal.OUT_FILES["pos"])
    assert pos[-1]["part of speech"] == breakdowns.NO_LINK
    assert {r["aligner"] for r in pos} == {"eflomal, grow-diag-final-and"}
    shape = read_rows(out / eflomal.OUT_FILES["shape"])
    assert [r["link shape"] for r in shape if r["test verses"] == "1"][-1] == breakdowns.NO_LINK
    capsys.readouterr()
    assert eflomal.main(["--out-dir", str(out)]) == 2  # the tables exist: refused, not rewritten
    assert "exists; name a new folder" in capsys.readouterr().err
