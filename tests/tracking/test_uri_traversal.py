"""D19: a ``runs:/M/<path>`` URI must not leave run M, however its path is encoded.

``..`` was refused, but ``runs:/M/%2e%2e/%2e%2e/N/artifacts/model`` reached MLflow, which
percent-decodes artifact paths: ``predict`` printed run N's output and ``ablate`` logged N's model
as a child of M. The path is now decoded the way MLflow decodes it (repeatedly, until it stops
changing) and the decoded path is checked: plain names only, nothing that could leave the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnstudy import config
from attnstudy.config import ConfigError

ROOT = Path(__file__).parents[2]
RUN = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"

ESCAPES = [
    "%2e%2e/%2e%2e/{n}/artifacts/model",  # the review's reproduction
    "%2E%2E/%2E%2E/{n}/artifacts/model",  # upper-case hex
    "%2e%2E/%2E%2e/{n}/artifacts/model",  # mixed case
    ".%2e/.%2e/{n}/artifacts/model",  # half encoded
    "%2e./%2e./{n}/artifacts/model",
    "%252e%252e/%252e%252e/{n}/artifacts/model",  # encoded twice
    "%25252e%25252e/%25252e%25252e/{n}/artifacts/model",  # three times
    "%%32%65%%32%65/%%32%65%%32%65/{n}/artifacts/model",  # '%2e' spelled with encoded digits
    "..%2f..%2f{n}%2fartifacts%2fmodel",  # encoded slashes
    "..%2F..%2F{n}%2Fartifacts%2Fmodel",
    "%2e%2e%2f%2e%2e%2f{n}%2fartifacts%2fmodel",  # the whole path one segment
    "%252e%252e%252f%252e%252e%252f{n}",  # ... encoded twice
    "..\\..\\{n}\\artifacts\\model",  # backslashes (Windows separators)
    "..%5c..%5c{n}%5cartifacts%5cmodel",  # encoded backslashes
    "%255c..%255c{n}",
    "model/../../../{n}/artifacts/model",  # in, then out
    "model/%2e%2e/%2e%2e/%2e%2e/{n}/artifacts/model",
    "./model",  # current-folder parts
    "%2e/model",
    "model/%2e",
    "model//weights",  # empty parts
    "model/%2f/weights",
    "%2f{n}/artifacts/model",  # an absolute path once decoded
    "%2fetc%2fpasswd",
    "file:%2f%2f%2fetc",  # a file URI
    "C:%5cWindows",  # a drive
    "model%00",  # a NUL byte
    "model%0a",  # a control character
    "model#frag",
    "model%23frag",
    "model?x=1",
    "%c0%ae%c0%ae/%c0%ae%c0%ae/{n}",  # overlong UTF-8 for '.'
    "\uff0e\uff0e/\uff0e\uff0e/{n}",  # fullwidth full stops
    "%ef%bc%8e%ef%bc%8e/{n}",  # ... percent-encoded
    "~/model",
    "%" + "25" * 12 + "2e",  # decodes more than MLflow's 10 rounds
]


@pytest.mark.parametrize("path", ESCAPES)
def test_every_encoding_of_a_way_out_is_refused(path):
    uri = f"runs:/{RUN}/" + path.format(n=OTHER)
    with pytest.raises(ConfigError) as info:
        config.split_runs_uri(uri)
    msg = str(info.value)
    assert "\n" not in msg and "would leave the run" in msg and "runs:/<run_id>[/model]" in msg


@pytest.mark.parametrize(
    "rest",
    [
        f"{RUN}%2f%2e%2e%2f{OTHER}/model",  # an encoded way out inside the run id
        f"{RUN}%2fmodel",
        f"%2e%2e/{OTHER}/model",
        "..",
        f"{RUN}\\..\\{OTHER}",
        f"{RUN}?x",
        "-" + RUN,
        RUN + "\n",
    ],
)
def test_a_run_id_is_letters_digits_dash_underscore(rest):
    with pytest.raises(ConfigError, match="not a run id"):
        config.split_runs_uri(f"runs:/{rest}")


@pytest.mark.parametrize(
    "uri, sub",
    [
        (f"runs:/{RUN}", ""),
        (f"runs:/{RUN}/", ""),
        (f"runs:///{RUN}", ""),
        (f"runs:/{RUN}/model", "model"),
        (f"runs:/{RUN}/model/", "model"),
        (f"runs:/{RUN}/%6dodel", "model"),  # decoded as MLflow decodes it
        (f"runs:/{RUN}/sub/model_2.v1-x", "sub/model_2.v1-x"),
        (f"runs:/{RUN}/..model", "..model"),  # a name that starts with dots is a name
    ],
)
def test_plain_paths_inside_the_run_are_kept(uri, sub):
    assert config.split_runs_uri(uri) == (RUN, sub)


@pytest.mark.slow
def test_an_encoded_way_out_loads_nothing(tiny_models, store_root):
    """The review's reproduction through the API: refused before the store is read; the plain
    ``runs:/M/model`` still loads M's model."""
    from attnstudy import api

    m, n = tiny_models[0].run_id, tiny_models[1].run_id
    for path in ("%2e%2e/%2e%2e/{n}/artifacts/model", "%252e%252e/%252e%252e/{n}/artifacts/model"):
        with pytest.raises(ConfigError, match="would leave the run"):
            api.load_model(f"runs:/{m}/" + path.format(n=n))
    for uri in (f"runs:/{m}", f"runs:/{m}/model", f"runs:/{m}/%6dodel"):
        run_id, loaded = api.load_model(uri)
        assert run_id == m and loaded.spec.model.attention == tiny_models[0].spec.model.attention


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        ATTNSTUDY_ROOT=str(root),
        ATTNSTUDY_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    )
    for k in ("MLFLOW_TRACKING_URI", "ATTNSTUDY_DEBUG"):
        env.pop(k, None)
    return subprocess.run(
        [sys.executable, "-m", "attnstudy.cli", *args],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize("verb", ["predict", "ablate"])
def test_the_cli_refuses_it_in_one_line_with_exit_2(tiny_models, store_root, verb):
    m, n = tiny_models[0].run_id, tiny_models[1].run_id
    uri = f"runs:/{m}/%2e%2e/%2e%2e/{n}/artifacts/model"
    args = ["abc"] if verb == "predict" else ["--ablations", "uniform", "--n-examples", "1"]
    res = _cli(store_root, verb, uri, *args)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("attnstudy: error: "), res.stderr[-2000:]
    assert "would leave the run" in lines[0] and res.stdout == ""
