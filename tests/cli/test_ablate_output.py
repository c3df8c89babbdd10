"""What ``attnstudy ablate`` prints: each statistic with its 95 % interval (catalogue labels),
the verdict, the example browser's path and the ablation run — no unexplained counters
(it printed ``ablation/permutation/n_identity 72`` and point values only)."""

from pathlib import Path

from attnstudy.analysis import catalogue

from attnstudy.cli.main import main
from attnstudy.tracking import Tag, Tracker
from attnstudy.verdict.findings import VERDICT_QUESTIONS, estimate


def test_ablate_prints_intervals_verdict_browser_and_run(tiny_models, capsys):
    model = next(m for m in tiny_models if m.spec.model.attention == "additive")
    args = ["ablate", f"runs:/{model.run_id}", "--n-examples", "4", "--quiet"]
    assert main([*args, "--ablations", "permutation,uniform,alignment"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    run_id = lines[-1].removeprefix("ablation run: runs:/")  # the last line, alone, as before
    assert lines[-1] == f"ablation run: runs:/{run_id}" and len(run_id) == 32
    run = Tracker(create=False).get_run(run_id)

    shown = catalogue.shown_stats(["permutation", "uniform", "alignment"])
    assert shown and all(s.key in run.metrics for s in shown)
    for s in shown:  # the catalogue's label, the logged value with its logged interval
        est = estimate(run.metrics, s.key)
        assert est.has_ci and est.low <= est.value <= est.high
        line = next(line for line in lines if line.strip().startswith(s.stat.label + " "))
        assert f" {est.fmt()}  ({s.stat.unit}" in line, line
        # the steps it was computed on: analysed, not skipped, with a value (it printed every
        # analysed step: 99 for gold mass where 20 <eos> steps have none)
        m = run.metrics
        n = m[f"ablation/{s.ablation}/n_steps"] - m[f"ablation/{s.ablation}/n_skipped"]
        n -= m.get(f"{s.key}_n_undefined", 0)
        assert line.endswith(f"; {int(n)} decoder steps)"), line
        if s.key == "ablation/alignment/gold_mass":
            assert n < m["ablation/alignment/n_steps"]  # the <eos> steps are left out
    flips = int(run.metrics["ablation/permutation/n_steps"])
    flips -= int(run.metrics["ablation/permutation/n_skipped"])
    flips -= int(run.metrics.get("ablation/permutation/flip_rate_n_undefined", 0))
    assert f"(n = 4 examples, {flips} decoder steps)" in out  # the verdict's, the same count
    assert "Is attention used? Intervening on it" in lines
    assert "Does it align with gold links?" in lines

    answers = ", ".join(f"{q} {run.tags[f'{Tag.VERDICT_PREFIX}{q}']}" for q in VERDICT_QUESTIONS)
    assert f"verdict: {answers}" in lines  # the verdict the run was tagged with
    assert "n_identity" not in out and "n_undefined" not in out and "n_skipped" not in out
    assert "/n_steps" not in out and "\t" not in out

    browser = next(line for line in lines if line.startswith("example browser: "))
    path = Path(browser.removeprefix("example browser: "))
    assert path.name == "browser.html" and run_id in path.parts
    assert path.is_file() and "<html" in path.read_text(encoding="utf-8")[:500].lower()
