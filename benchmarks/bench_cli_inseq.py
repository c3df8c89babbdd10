"""Benchmark — a command against inseq's command: ``attnstudy ablate`` and ``inseq attribute``.

The whole command as a user runs it, each a fresh process (interpreter start-up, imports, model
load, store creation, what it writes), on one tiny Marian model folder
(:mod:`attnstudy.models.hf_tiny`, word tokenizer, built here unless ``--model`` names one) and the
seeded copy-task sentences of ``benchmarks/bench_inseq.py``; wall and CPU time (user + system of
the child, ``resource.getrusage(RUSAGE_CHILDREN)``), median of ``--repeats`` runs interleaved:

* **one example, saliency** — ``attnstudy ablate hf:FOLDER --tsv one.tsv --n-examples 1
  --ablations saliency`` against ``inseq attribute -m FOLDER -a saliency -i TEXT --hide -o out.json``
  (greedy generation, then saliency; the JSON written);
* **one example, attnstudy's default battery** — the same ``ablate`` without ``--ablations``
  (permutation, uniform, erasure, the adversarial search, importance, alignment: what the
  review timed at 23.6 s against inseq's 9.8 s); inseq has no battery (its one-example time is
  the saliency job's, not run again);
* **N sentences, saliency** — both on ``--sentences`` sentences (inseq's ``--batch_size`` 8, its
  default; attnstudy's default batching).

Each ``ablate`` runs twice: as it runs by default (the statistics and verdict printed, nothing
recorded, MLflow not imported: the like of inseq's command, which records nothing either) and
with ``--record`` (a fresh store in an empty folder: the model and ablation runs, the per-step
table, pages, figures and example browser).

Both commands run from the same virtualenv (``benchmarks/inseq_env.sh`` makes ``.venv-inseq``
with attnstudy editable and inseq 0.7.1), one thread each (``OMP_NUM_THREADS=1``, attnstudy's
``ATTNSTUDY_THREADS=1``). Targets (#63): one example no slower than inseq's command, the
N-sentence saliency job faster.

Run: ``.venv-inseq/bin/python -m benchmarks.bench_cli_inseq [--sentences 100] [--repeats 3]``.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import common

SENTENCE_SEED = 41  # bench_inseq's sentences


def timed_command(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one command run to its end; its failure raises with its stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} … failed ({out.returncode}): {out.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def jobs(folder: str, data: Path, sentences: list[str], n: int) -> dict:
    """Job name → {tool: argv} (``ROOT``: the run's own empty folder)."""
    py = sys.executable
    inseq = str(Path(py).parent / "inseq")
    ablate = [py, "-m", "attnstudy.cli", "ablate", f"hf:{folder}", "--quiet"]
    attribute = [inseq, "attribute", "-m", folder, "-a", "saliency", "--dev", "cpu", "--hide"]
    first, every = sentences[:1], sentences[:n]
    one = [*ablate, "--tsv", str(data / "one.tsv"), "--n-examples", "1"]
    every_tsv = [*ablate, "--tsv", str(data / "all.tsv"), "--n-examples", str(n)]
    return {
        "one example, saliency": {
            "attnstudy": [*one, "--ablations", "saliency"],
            "attnstudy --record": [*one, "--ablations", "saliency", "--record"],
            "inseq": [*attribute, "-o", "ROOT/out.json", "-i", *first],
        },
        # inseq has no battery: its one-example time is the saliency job's, not run twice
        "one example, attnstudy's default battery": {
            "attnstudy": one,
            "attnstudy --record": [*one, "--record"],
        },
        f"{n} sentences, saliency": {
            "attnstudy": [*every_tsv, "--ablations", "saliency"],
            "attnstudy --record": [*every_tsv, "--ablations", "saliency", "--record"],
            "inseq": [*attribute, "-o", "ROOT/out.json", "-bs", "8", "-i", *every],
        },
    }


def run(args) -> dict:
    from attnstudy.models.hf_tiny import build_tiny, copy_pairs

    n = args.sentences or (4 if args.smoke else 100)
    repeats = args.repeats or (1 if args.smoke else 3)
    tools = ["attnstudy", "attnstudy --record"]
    tools += [] if args.tools == "attnstudy" else ["inseq"]
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="attnstudy-bench-cli-") as tmp:
        base = Path(tmp)
        folder = args.model or str(
            build_tiny(base / "marian", family="marian", tokenizer="word", steps=150)
        )
        sentences = copy_pairs(n, seed=SENTENCE_SEED)  # the copy task: target = source
        (base / "one.tsv").write_text(f"{sentences[0]}\t{sentences[0]}\n", encoding="utf-8")
        (base / "all.tsv").write_text("".join(f"{s}\t{s}\n" for s in sentences), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        env |= {"OMP_NUM_THREADS": "1", "ATTNSTUDY_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        env |= {"TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        todo = jobs(folder, base, sentences, n)
        runs = 0
        for _ in range(repeats):  # interleaved: each job's tools back to back
            for job, argv_of in todo.items():
                for tool in (t for t in tools if t in argv_of):
                    runs += 1
                    root = base / f"run{runs}"
                    root.mkdir()
                    argv = [a.replace("ROOT", str(root)) for a in argv_of[tool]]
                    env_run = env | {"ATTNSTUDY_ROOT": str(root)}
                    times.setdefault((job, tool), []).append(timed_command(argv, root, env_run))
    rows = []
    for job in todo:
        row: dict[str, object] = {"job": job}
        for tool in tools:
            if (job, tool) not in times:  # inseq has no counterpart of the battery
                row |= {f"{tool} wall s": "—", f"{tool} CPU s": "—"}
                continue
            walls, cpus = zip(*times[(job, tool)])
            row[f"{tool} wall s"] = statistics.median(walls)
            row[f"{tool} CPU s"] = statistics.median(cpus)
        if "inseq" in tools:
            inseq = row["inseq wall s"]
            for tool in ("attnstudy", "attnstudy --record"):
                row[f"inseq / {tool} (wall)"] = (
                    inseq / row[f"{tool} wall s"] if isinstance(inseq, float) else "—"
                )
        rows.append(row)
    notes = [
        f"each a fresh process, median of {repeats}, interleaved; model {folder} "
        f"(tiny Marian, word tokenizer); sentences: bench_inseq's copy pairs (seed "
        f"{SENTENCE_SEED}); one thread",
        common.load_note(args),
    ]
    if "inseq" in tools:
        for r in rows:
            if not isinstance(r["inseq wall s"], float):
                continue
            for tool in ("attnstudy", "attnstudy --record"):
                met = common.verdict(r[f"{tool} wall s"], r["inseq wall s"], higher_is_better=False)
                notes.append(
                    f"{r['job']}: {tool} {r[f'{tool} wall s']:.1f} s, inseq "
                    f"{r['inseq wall s']:.1f} s (target: no slower, {met})"
                )
    common.report(
        "A command against inseq's command: attnstudy ablate and inseq attribute",
        args,
        {"sentences": n, "timing": f"median of {repeats}, wall and CPU"},
        [("", common.table(rows))],
        notes,
    )
    return {"rows": rows}


def main(argv=None) -> dict:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a Hugging Face model folder (default: build)")
    p.add_argument("--sentences", type=int, default=None, help="sentences (default 100)")
    p.add_argument(
        "--tools", choices=("both", "attnstudy"), default="both", help="attnstudy alone: no inseq"
    )
    args = p.parse_args(argv)
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
