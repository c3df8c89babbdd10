"""A refusal that needs no model and no store answers before the heavy libraries load.

Each case runs the command in a fresh interpreter (the process boundary is what is tested: which
modules the refusal imported) and checks its one line, its exit code, that nothing was created,
and that torch, mlflow, matplotlib and pandas were never imported. Their CPU time is measured in
``benchmarks/bench_refusals.py`` (each well under a second; ~5 s when MLflow loaded first).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
TINY = ROOT / "experiments" / "tiny.toml"
HEAVY = ("torch", "mlflow", "matplotlib", "pandas")

WRAPPER = (
    "import sys; from attnstudy.cli.main import main; rc = main(sys.argv[1:]); "
    f"print(','.join(m for m in {HEAVY!r} if m in sys.modules) or 'LIGHT'); sys.exit(rc)"
)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refuse(tmp_path: Path, args: list[str], env: dict[str, str] | None = None):
    """Run ``attnstudy ARGS`` in a fresh interpreter from ``tmp_path``, with no tracking URI
    from the environment unless ``env`` gives one."""
    full = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    full["ATTNSTUDY_ROOT"] = str(tmp_path)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", WRAPPER, *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=full,
        timeout=120,
    )


def deep_toml(path: Path) -> Path:
    path.write_text('[experiment]\nname = "deep"\n[data]\nx = ' + "[" * 40 + "]" * 40 + "\n")
    return path


CASES = {
    # name: (args (TMP: the test's folder), environment, exit code, what the line says)
    "refused server (environment)": (
        ["report", "--experiment", "x"],
        {"MLFLOW_TRACKING_URI": "http://127.0.0.1:{port}"},
        1,
        "tracking server http://127.0.0.1:{port} refused the connection",
    ),
    "refused server (train)": (
        ["train", str(TINY), "--tracking-uri", "http://127.0.0.1:{port}"],
        {},
        1,
        "refused the connection",
    ),
    "unknown scheme": (
        ["report", "--tracking-uri", "foo://bar"],
        {},
        2,
        "tracking URI 'foo://bar': the 'foo' scheme names no tracking store",
    ),
    "unknown scheme (environment)": (
        ["predict", "runs:/abc", "hello"],
        {"MLFLOW_TRACKING_URI": "foo://bar"},
        2,
        "the 'foo' scheme names no tracking store",
    ),
    "host:port without a scheme": (
        ["report", "--tracking-uri", "localhost:5000"],
        {},
        2,
        "(a server: http://localhost:5000)",
    ),
    "server without a host": (
        ["report", "--tracking-uri", "http://"],
        {},
        2,
        "tracking URI 'http://' names no host",
    ),
    "server with a space": (
        ["report", "--tracking-uri", "http://a b:5000"],
        {},
        2,
        "holds a space or a control character",
    ),
    "server with a bad port": (
        ["ablate", "runs:/abc", "--tracking-uri", "http://host:99999"],
        {},
        2,
        "has a port that is no number in 1..65535",
    ),
    "unknown scheme in train": (
        ["train", str(TINY), "--tracking-uri", "foo://bar"],
        {},
        2,
        "the 'foo' scheme names no tracking store",
    ),
    "missing store (report)": (
        ["report", "--tracking-uri", "sqlite:///TMP/none/mlflow.db"],
        {},
        2,
        "no tracking store at sqlite:///TMP/none/mlflow.db",
    ),
    "missing store (predict)": (
        ["predict", "runs:/abc", "hello"],
        {},
        2,
        "no tracking store at sqlite:///TMP/mlruns/mlflow.db",
    ),
    "missing store (ablate)": (
        ["ablate", "models:/m/1"],
        {},
        2,
        "no tracking store at",
    ),
    "missing store (ui)": (
        ["ui", "--port", "{port}", "--tracking-uri", "sqlite:///TMP/none.db"],
        {},
        2,
        "no tracking store at sqlite:///TMP/none.db",
    ),
    "missing model folder": (
        ["ablate", "hf:TMP/nope", "--tsv", "TMP/ok.tsv"],
        {},
        2,
        "TMP/nope: no such folder; pass a folder written by save_pretrained",
    ),
    "folder that is no model": (
        ["ablate", "hf:TMP", "--tsv", "TMP/ok.tsv"],
        {},
        2,
        "no config.json",
    ),
    "missing --tsv": (
        ["ablate", "hf:TMP", "--tsv", "TMP/missing.tsv"],
        {},
        2,
        "--tsv TMP/missing.tsv: no such file",
    ),
    "missing experiment file": (
        ["run", "TMP/missing.toml"],
        {},
        2,
        "experiment file not found: TMP/missing.toml",
    ),
    "unknown setting": (
        ["run", str(TINY), "--set", "training.epochz=3"],
        {},
        2,
        "unknown key 'training.epochz'",
    ),
    "bad setting value": (
        ["run", str(TINY), "--set", "training.epochs=abc"],
        {},
        2,
        "training.epochs",
    ),
    "deep TOML nesting": (
        ["run", "TMP/deep.toml"],
        {},
        2,
        "nested too deeply",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_refusal_loads_neither_torch_nor_mlflow(tmp_path, name):
    args, env, code, needle = CASES[name]
    port = closed_port()
    deep_toml(tmp_path / "deep.toml")
    (tmp_path / "ok.tsv").write_text("a b\tc d\n", encoding="utf-8")

    def fill(text: str) -> str:
        return text.replace("TMP", str(tmp_path)).replace("{port}", str(port))

    before = sorted(p.name for p in tmp_path.iterdir())
    out = refuse(tmp_path, [fill(a) for a in args], {k: fill(v) for k, v in env.items()})
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code, out.stderr
    assert len(lines) == 1 and lines[0].startswith("attnstudy: error: "), out.stderr
    assert fill(needle) in lines[0]
    assert out.stdout.strip() == "LIGHT"
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created


def test_the_tracking_uris_read_pass_their_text_check():
    """The stricter text check keeps every form that was read: SQLite paths with spaces, servers
    with a path or an IPv6 host, database URIs with a driver."""
    from attnstudy.config import check_tracking_uri

    for uri in (
        "sqlite:////abs/st ore#1/mlflow.db",
        "sqlite:///mlruns/mlflow.db",
        "http://127.0.0.1:5000",
        "https://mlflow.example.org/team/",
        "http://[::1]:5000",
        "http://user@host:8080",
        "postgresql+psycopg://me@db.example:5432/mlflow",
        "mysql://me@db/mlflow",
    ):
        assert check_tracking_uri(uri) == uri
