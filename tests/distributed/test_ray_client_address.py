"""``ray://`` client addresses: refused in one line saying to give the GCS
address instead; they were taken for HOST:PORT and failed with "no Ray head answers"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TINY = Path(__file__).parents[2] / "experiments" / "tiny.toml"


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_ray_client_address_is_refused_naming_the_gcs_address(tmp_path, how):
    env = dict(os.environ, ATTNSTUDY_ROOT=str(tmp_path))
    env.pop("MLFLOW_TRACKING_URI", None)
    address = "ray://127.0.0.1:10001"
    args = ["--ray-address", address] if how == "option" else []
    if how == "environment":
        env["RAY_ADDRESS"] = address
    res = subprocess.run(
        [sys.executable, "-m", "attnstudy.cli", "run", str(TINY), "--executor", "ray"]
        + ["--tracking-uri", "http://127.0.0.1:1", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (
        f"attnstudy: error: --ray-address (or $RAY_ADDRESS) '{address}' is a Ray Client address, "
        "which attnstudy does not use: its driver joins the cluster itself; give the head's GCS "
        "address HOST:PORT (the --port of 'ray start --head', e.g. 10.0.0.5:6380) and run "
        "attnstudy on a machine that reaches every node (docs/cluster.md)"
    )
    assert not (tmp_path / "mlruns").exists()


def test_other_schemes_are_not_taken_for_host_and_port():
    from attnstudy.executors.distributed import _host_port

    assert _host_port("http://head:6380") is None
    assert _host_port("head:6380") == ("head", 6380)
    assert _host_port("[::1]:6380") == ("::1", 6380)
