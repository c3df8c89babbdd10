"""CLI usage errors: one line on stderr, exit code 2, answered before torch or mlflow load."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def run_cli(*args, cwd=None, env=None):
    code = (
        "import sys; from attnstudy.cli.main import main; rc = main(sys.argv[1:]); "
        "print('HEAVY' if ('torch' in sys.modules or 'mlflow' in sys.modules) else 'LIGHT'); sys.exit(rc)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (["train", "nope.toml"], "experiment file not found: nope.toml"),
        (["train"], "the following arguments are required: experiment"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (
            ["train", "experiments/tiny.toml", "--set", "model.attention=bahdanau_attn"],
            "model.attention: unknown attention score 'bahdanau_attn'; valid: 'additive', 'dot'",
        ),
        (
            ["train", "experiments/tiny.toml", "--set", "models.1.model.attention=luong_dot"],
            "models[1]: model.attention: unknown attention score 'luong_dot'; valid: ",
        ),
        (["train", "experiments/tiny.toml", "--set", "training.epochs=-1"], "training.epochs"),
        (["train", "experiments/tiny.toml", "--set", "model.hiden=3"], "unknown key 'model.hiden'"),
        (["train", "experiments/tiny.toml", "--set", "oops"], "--set expects key=value"),
        (
            ["ablate", "runs:/x", "--ablations", "permutation,telepathy"],
            "unknown ablation 'telepathy'",
        ),
        (["ablate", "runs:/x", "--n-examples", "0"], "--n-examples must be at least 1"),
        (["predict", "s3://bucket/model", "hello"], "unknown model URI"),
        (["predict", "runs:/abc", ""], "an input is empty"),
        (["report", "--verdict", "used=0.2"], "give KEY=VALUE with KEY one of used_flip"),
        (["report", "--verdict", "used_flip"], "give KEY=VALUE"),
        (["report", "--verdict", "used_flip=1.5"], "less than or equal to 1"),
        (["report", "--verdict", "tau_weak=high"], "the value is not a number"),
        (["report", "--ui-url", "localhost:5000"], "is not an http(s) URL"),
    ],
)
def test_usage_errors_are_one_line_exit_2_without_heavy_imports(args, needle):
    out = run_cli(*args)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("attnstudy: error: ")
    assert needle in lines[0]
    assert "Traceback" not in out.stderr
    assert out.stdout.strip() == "LIGHT"


def test_malformed_toml_names_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nattention = \n")
    out = run_cli("train", str(bad))
    assert out.returncode == 2
    assert f"{bad}: malformed TOML" in out.stderr


@pytest.mark.slow
def test_report_verdict_and_ui_url_reach_the_report(tiny_study, tmp_path):
    from attnstudy.cli import main as cli

    out = tmp_path / "report"
    code = cli.main(
        [
            "report",
            "--study",
            tiny_study.study_run_id,
            "--out",
            str(out),
            "--ui-url",
            "http://mlflow.example:8080/",
            "--verdict",
            "used_flip=0",
            "--verdict",
            "unused_flip=0",
        ]
    )
    assert code == 0
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "| `used_flip` | 0.0 |" in md and "| `unused_flip` | 0.0 |" in md
    # a flip rate of 0 [0, 0] is now "used" (lower bound ≥ 0): the threshold decided, not a default
    assert "`used: yes`" in md
    assert "http://mlflow.example:8080/#/experiments/" in md and "127.0.0.1:5000" not in md


def test_a_signal_while_the_exit_switches_handlers_off_still_exits_with_the_code(monkeypatch):
    """A second SIGTERM 10 ms after the first once arrived while entry() switched the handlers
    off: an uncaught KeyboardInterrupt ended the process by SIGINT (-2) instead of exit 1."""
    import signal as signal_module

    from attnstudy.cli import main as cli

    real = signal_module.signal
    calls = {"n": 0}

    def signal(signum, handler):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt  # as the CLI's handler raises it
        return real(signum, handler)

    monkeypatch.setattr(cli, "main", lambda: cli.EXIT_FAILED)
    monkeypatch.setattr(cli.signal, "signal", signal)
    old = {
        s: real(s, real(s, signal_module.SIG_DFL))
        for s in (signal_module.SIGINT, signal_module.SIGTERM)
    }
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli.entry()
    finally:
        for s, h in old.items():
            real(s, h)
    assert exit_info.value.code == cli.EXIT_FAILED and calls["n"] >= 3


def test_notices_go_to_the_stderr_of_the_moment(monkeypatch):
    """A second ``main`` in one process under another stderr (pytest's capture, a notebook) wrote
    its notices to the first stderr, closed by then: "--- Logging error ---"."""
    import io
    import logging

    from attnstudy.cli import main as cli

    first = io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    cli._install_notices()
    first.close()
    second = io.StringIO()
    monkeypatch.setattr("sys.stderr", second)
    cli._install_notices()
    logging.getLogger("attnstudy").warning("after the swap")
    assert second.getvalue() == "attnstudy: note: after the swap\n"
