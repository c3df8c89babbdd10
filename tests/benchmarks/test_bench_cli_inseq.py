"""benchmarks/bench_cli_inseq.py's commands, without running them (each is a fresh process of
seconds; the benchmark itself needs inseq's virtualenv): every attnstudy command parses with the
CLI's own parser into the job it names, and inseq's are given the same sentences."""

from __future__ import annotations

from pathlib import Path

from attnstudy.cli.main import build_parser
from benchmarks.bench_cli_inseq import jobs


def test_each_job_is_the_same_work_for_both_tools(tmp_path):
    sentences = ["red fish", "blue fish two", "new light"]
    todo = jobs("/models/marian", tmp_path, sentences, 3)
    assert list(todo) == [
        "one example, saliency",
        "one example, attnstudy's default battery",
        "3 sentences, saliency",
    ]
    parser = build_parser()
    for job, argv in todo.items():
        ours = parser.parse_args(argv["attnstudy"][3:])  # after python -m attnstudy.cli
        # the default records nothing (what inseq's command does); --record is all that differs
        assert ours.model_uri == "hf:/models/marian" and ours.quiet and not ours.record
        assert ours.tracking_uri is None
        assert argv["attnstudy --record"] == [*argv["attnstudy"], "--record"]
        assert parser.parse_args(argv["attnstudy --record"][3:]).record
        n = 3 if job.startswith("3 ") else 1
        assert ours.n_examples == n
        assert Path(ours.tsv).name == ("all.tsv" if n == 3 else "one.tsv")
        assert ours.ablations == (None if "default battery" in job else "saliency")
        if "default battery" in job:  # inseq has none: its one-example run is not repeated
            assert set(argv) == {"attnstudy", "attnstudy --record"}
            continue
        theirs = argv["inseq"]
        assert theirs[1:4] == ["attribute", "-m", "/models/marian"]
        assert theirs[theirs.index("-a") + 1] == "saliency"
        assert theirs[theirs.index("-i") + 1 :] == sentences[:n]
