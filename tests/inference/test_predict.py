"""``predict`` with many inputs: --input FILE and - (stdin), one model load, outputs that do not
depend on batch-mates.

The command runs in the test process (tests/cli_in_process.py) except where it reads stdin, a
``python -m attnstudy.cli`` process (~3.5 s CPU of imports once it loads a model)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cli_in_process import run_cli

pytestmark = pytest.mark.slow


def _cli(root, *args, stdin=None):
    env = dict(os.environ, ATTNSTUDY_ROOT=str(root))
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(
        [sys.executable, "-m", "attnstudy.cli", "predict", *args],
        capture_output=True,
        text=True,
        input=stdin,
        env=env,
        timeout=180,
    )


def _cli_here(capfd, root, *args):
    """:func:`_cli` in this process."""
    env = {"ATTNSTUDY_ROOT": str(root), "MLFLOW_TRACKING_URI": None}
    return run_cli(capfd, ["predict", *args], cwd=os.getcwd(), env=env)


def test_batched_prediction_equals_one_input_at_a_time(tiny_models):
    """Inputs of different lengths decoded together give what each gives alone (greedy and beam,
    attention included)."""
    from attnstudy import api
    from attnstudy.models.inference import predict_loaded

    _, loaded = api.load_model(f"runs:/{tiny_models[0].run_id}")
    inputs = ["abc", "abcdef", "ba", "cab", "fedcba", "a", "eeeeee", "bad"]
    for beam in (1, 3):
        together = predict_loaded(loaded, inputs, beam, with_attention=True, batch_size=3)
        alone = [predict_loaded(loaded, [x], beam, with_attention=True)[0] for x in inputs]
        assert [r["input"] for r in together] == inputs
        for a, b in zip(together, alone):
            assert a["tokens"] == b["tokens"] and a["output"] == b["output"]
            assert len(a["attention"]) == len(a["tokens"]) + 1
            assert all(len(row) == len(a["source_tokens"]) for row in a["attention"])
            assert np.allclose(a["attention"], b["attention"], atol=1e-4)


def test_input_file_and_stdin_give_one_line_per_input(tiny_models, store_root, tmp_path, capfd):
    uri = f"runs:/{tiny_models[0].run_id}"
    words = ["abc", "cab", "bbad"]
    f = tmp_path / "inputs.txt"
    f.write_text("\n".join(words) + "\n", encoding="utf-8")
    by_args = _cli_here(capfd, store_root, uri, *words, "--json")
    by_file = _cli_here(capfd, store_root, uri, "--input", str(f), "--json")
    by_stdin = _cli(store_root, uri, "--input", "-", "--json", stdin="abc\r\ncab\nbbad")
    for out in (by_args, by_file, by_stdin):
        assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in by_file.stdout.splitlines()]
    assert [r["input"] for r in rows] == words
    assert by_file.stdout == by_args.stdout == by_stdin.stdout


@pytest.mark.parametrize(
    "content,needle",
    [
        (b"abc\n\ncab\n", "inputs.txt:2: blank line"),
        (b"abc\ncb\xff\n", "inputs.txt:2: not UTF-8"),
        (b"", "inputs.txt: no inputs"),
    ],
)
def test_bad_input_file_is_one_line_exit_2(
    tiny_models, store_root, tmp_path, content, needle, capfd
):
    f = tmp_path / "inputs.txt"
    f.write_bytes(content)
    out = _cli_here(capfd, store_root, f"runs:/{tiny_models[0].run_id}", "--input", str(f))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr


def test_missing_input_file_and_no_inputs(tiny_models, store_root, tmp_path, capfd):
    uri = f"runs:/{tiny_models[0].run_id}"
    out = _cli_here(capfd, store_root, uri, "--input", str(tmp_path / "nope.txt"))
    assert out.returncode == 2 and "nope.txt: file not found" in out.stderr
    out = _cli_here(capfd, store_root, uri)
    assert out.returncode == 2 and "give inputs as arguments or with --input" in out.stderr
