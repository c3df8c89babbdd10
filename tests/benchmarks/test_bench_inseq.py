"""benchmarks/bench_inseq.py without inseq: its arguments, the conversion of inseq's layout to
attnstudy's, and attnstudy's half in smoke mode (``--tools attnstudy``). The comparison itself
needs inseq's own virtualenv (benchmarks/inseq_env.sh) and is not part of the suite."""

from __future__ import annotations

import importlib.util

import pytest
import torch


def test_arguments_default_and_smoke_sizes():
    from benchmarks import bench_inseq

    full = bench_inseq.parse([])
    assert (full.sentences, full.ig_steps, full.batch_size) == (100, 50, 32)
    assert full.methods == list(bench_inseq.METHODS) and full.tools == "both"
    smoke = bench_inseq.parse(["--smoke", "--methods", "saliency,occlusion"])
    assert (smoke.sentences, smoke.ig_steps) == (4, 4)
    assert smoke.methods == ["saliency", "occlusion"]


@pytest.mark.parametrize(
    "argv",
    [["--methods", "lime"], ["--profile", "lime"], ["--sentences", "0"], ["--tools", "captum"]],
)
def test_arguments_refused(argv, capsys):
    from benchmarks import bench_inseq

    with pytest.raises(SystemExit) as err:
        bench_inseq.parse(argv)
    assert err.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_inseq_layout_becomes_attnstudy_layout():
    """inseq: (T_x, T_y, d) per element, (T_x, T_y) occlusion, (T_x, T_y, L, H) attention;
    attnstudy: (T_y, T_x) token scores (the sum over d), (T_y, T_x, L, H) attention."""
    from benchmarks.bench_inseq import inseq_grid

    g = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 3, 4)  # T_x=2, T_y=3, d=4
    got = inseq_grid(g, "saliency")
    assert got.shape == (3, 2)
    assert got[2, 1] == g[1, 2].sum() == 20 + 21 + 22 + 23
    occ = torch.tensor([[0.5, 1.0], [2.0, 0.25]])  # inseq keeps one element of the window
    assert torch.equal(inseq_grid(occ, "occlusion"), torch.tensor([[0.5, 2.0], [1.0, 0.25]]))
    with pytest.raises(ValueError, match="expected 2 dimensions"):
        inseq_grid(g, "occlusion")
    att = torch.rand(2, 3, 2, 4)  # T_x, T_y, L, H
    assert torch.equal(inseq_grid(att, "attention")[1, 0], att[0, 1])


def test_occlusion_is_compared_by_its_absolute_value():
    from benchmarks.bench_inseq import comparable

    signed = [torch.tensor([[-0.5, 0.25]])]
    assert torch.equal(comparable("occlusion", signed)[0], torch.tensor([[0.5, 0.25]]))
    assert comparable("input_x_gradient", signed) is signed


def test_max_abs_diff_pairs_examples_and_flags_shape_mismatch():
    from benchmarks.bench_inseq import max_abs_diff

    a = [torch.zeros(2, 3), torch.ones(1, 1)]
    b = [torch.full((2, 3), 0.25), torch.full((1, 1), -1.0)]
    assert max_abs_diff(a, b) == 2.0
    assert max_abs_diff([torch.zeros(2, 3)], [torch.zeros(3, 2)]) != max_abs_diff(a, a)  # NaN


def test_agreement_tolerance_scales_with_the_largest_score_above_one():
    from benchmarks.bench_inseq import verdicts

    def row(diff, scale):
        return {
            "batching": "both 32",
            "method": "saliency",
            "inseq / attnstudy": 6.0,
            "max abs diff": diff,
            "largest abs score": scale,
            "relative diff": diff / scale,
        }

    small, large, off = verdicts([row(2.4e-7, 9.3e-4), row(2.7e-5, 25.6), row(3e-4, 25.6)])
    assert "(agree" in small and "(agree" in large and "(DIFFER" in off
    assert "6.0× inseq (target ≥ 5×, met)" in small


def test_without_inseq_the_comparison_is_refused_in_one_line(monkeypatch):
    import sys

    from benchmarks.bench_inseq import load_inseq

    monkeypatch.setitem(sys.modules, "inseq", None)  # import inseq raises ImportError
    with pytest.raises(SystemExit) as err:
        load_inseq("unused", ["saliency"], [0])
    assert str(err.value).startswith("attnstudy: error: inseq cannot be imported here")
    assert "benchmarks/inseq_env.sh" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_attnstudy_half_runs_without_inseq(tmp_path):
    from prerequisites import require

    require(importlib.util.find_spec("transformers") is not None, "the [hf] extra is missing")
    from benchmarks import bench_inseq

    results = tmp_path / "RESULTS.md"
    before = torch.get_num_threads()
    try:
        out = bench_inseq.main(
            ["--smoke", "--tools", "attnstudy", "--profile", "saliency", "--results", str(results)]
        )
    finally:
        torch.set_num_threads(before)
    assert out["sentences"] > 0
    assert [r["method"] for r in out["rows"]] == list(bench_inseq.METHODS)
    assert all(r["attnstudy s"] > 0 and r["scores"] > 0 for r in out["rows"])
    text = results.read_text()
    assert "Side by side with inseq" in text
    # the profile: cProfile's functions and torch.profiler's operator table
    assert "Profile: attnstudy, saliency" in text and "Self CPU" in text
