"""Several Ray nodes on this machine's loopback: the cluster chapter's one-machine recipe.

``python -m attnstudy.executors.loopback_cluster --nodes 2 --num-cpus 1`` starts a Ray head and one
more
node, both on 127.0.0.1, and keeps them until Ctrl-C (or SIGTERM). Every listener of theirs (the
GCS, each raylet and object manager, the agents, every worker) is on loopback, so nothing of the
cluster is reachable from the network: try the team set-up of docs/cluster.md (a driver, a tracking
server, tasks placed on two nodes) on one machine without opening ports to anyone.

Why not two ``ray start``: Ray 2.60's GCS and raylet bind every interface unless the node's
address is exactly ``127.0.0.1`` (a node on 127.0.0.2 or 127.0.0.3 listened on ``::``, measured),
and ``ray start`` turns ``127.0.0.1`` into the machine's outside address unless
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, with which it refuses to start any node but a head. Ray's
own ``ray.cluster_utils.Cluster`` (what Ray's documentation suggests for a multi-node cluster on one
machine) starts the nodes through its Python API instead, which checks neither; it runs here with
token authentication (``$RAY_AUTH_TOKEN`` if set, else a random token, printed for the driver),
usage statistics, the dashboard and metrics export off, in a temporary folder of its own (also for
Ray's ``ray_current_cluster`` file, so no other user's ``ray.init()`` finds it).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from attnstudy.executors.ray_head import CLUSTERS_VAR, RAY_EXTRA, free_port

READY = "Ray cluster on loopback: "
"""The line that starts the output once every node is up (a test waits for it)."""
JOB_SERVER = "job server: "
"""The line naming the head's job server, with ``--dashboard`` (a test reads it)."""
NODE_RESOURCE = "loopback_node_{}"
"""A custom resource of 1 on node i (0 is the head): a task asking for it runs on that node."""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors in one line (no usage block): ``attnstudy: error: …``, exit 2."""

    def error(self, message: str):
        print(f"attnstudy: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; a bad value exits 2 with one line."""
    p = _Parser(
        prog="python -m attnstudy.executors.loopback_cluster",
        description="Ray nodes on this machine's loopback until Ctrl-C (docs/cluster.md).",
    )
    p.add_argument("--nodes", type=int, default=2, help="nodes, the head included (default 2)")
    p.add_argument("--num-cpus", type=int, default=1, help="CPUs each node offers (default 1)")
    p.add_argument("--port", type=int, default=0, help="the GCS port (default: a free one)")
    p.add_argument(
        "--object-store-mb", type=int, default=150, help="each node's object store (default 150)"
    )
    p.add_argument(
        "--dashboard",
        action="store_true",
        help="also start the head's dashboard on loopback, a free port: the job server of "
        "'attnstudy run --submit' and 'attnstudy job' (needs ray[default]; the job's driver is "
        "the `python` of this shell's PATH)",
    )
    args = p.parse_args(argv)
    if args.nodes < 1:
        p.error(f"--nodes must be at least 1, got {args.nodes}")
    if args.num_cpus < 1:
        p.error(f"--num-cpus must be at least 1, got {args.num_cpus}")
    if args.port and not 1024 <= args.port <= 65535:
        p.error(f"--port must be between 1024 and 65535, got {args.port}")
    if args.object_store_mb < 75:
        p.error(
            f"--object-store-mb must be at least 75 (Ray's minimum), got {args.object_store_mb}"
        )
    return args


def cluster_env(token: str, temp_dir: Path) -> dict[str, str]:
    """The environment the nodes start with (their workers inherit it)."""
    return {
        CLUSTERS_VAR: "0",  # keeps 127.0.0.1 as the nodes' address (read when ray is imported)
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_enable_metrics_collection": "0",
        "RAY_TMPDIR": str(temp_dir),
    }


def _interrupt(signum, frame) -> None:
    """SIGTERM stops the nodes as Ctrl-C does."""
    raise KeyboardInterrupt


def _node_args(args: argparse.Namespace, temp_dir: Path) -> dict:
    """What every node is started with: its CPUs, object store and temporary folder."""
    return {
        "num_cpus": args.num_cpus,
        "object_store_memory": args.object_store_mb * 1024 * 1024,
        "temp_dir": str(temp_dir),
    }


def _own_ports() -> dict[str, int]:
    """Ray's fixed default (52365) for the dashboard agent: a second recipe on the machine
    (another user, a parallel test) would find it taken and its job server no agent."""
    return {"dashboard_agent_listen_port": free_port()}


def _head_args(args: argparse.Namespace, node: dict, dashboard_port: int | None) -> dict:
    """The head's arguments: the node's, its resource, the dashboard (``--dashboard``) and the
    GCS port (``--port``)."""
    dashboard = (
        {"dashboard_host": "127.0.0.1", "dashboard_port": dashboard_port} if args.dashboard else {}
    )
    return (
        node
        | _own_ports()
        | {"include_dashboard": args.dashboard, **dashboard}
        | {"resources": {NODE_RESOURCE.format(0): 1}}
        | ({"gcs_server_port": args.port} if args.port else {})
    )


def _add_nodes(cluster, args: argparse.Namespace, node: dict, temp_dir: Path) -> None:
    """The nodes beyond the head, each in a folder of its own, as a node on another machine has:
    nodes sharing one ``runtime_resources`` folder unpack a job's ``working_dir`` over each
    other (the job's driver then found its working directory gone). Each folder names the
    cluster (``ray_current_cluster``, what ``address="auto"`` reads there: a submitted job's
    supervisor may run on the node; without it Ray looks for any GCS process of the machine)."""
    for i in range(1, args.nodes):
        folder = temp_dir / f"n{i}"
        folder.mkdir()
        (folder / "ray_current_cluster").write_text(cluster.address)
        own = node | _own_ports() | {"temp_dir": str(folder)}
        cluster.add_node(**own, resources={NODE_RESOURCE.format(i): 1})


def _ready_message(address: str, args: argparse.Namespace, token: str, port: int | None) -> str:
    """What the recipe prints once its nodes are up: the address, the driver's variables, the job
    server's URL (``--dashboard``)."""
    server = (
        f"{JOB_SERVER}http://127.0.0.1:{port} (run --executor ray --submit --ray-address it; "
        "attnstudy job … --ray-address it)\n"
        if args.dashboard
        else ""
    )
    return (
        f"{READY}{address} ({args.nodes} node(s), {args.num_cpus} CPU(s) each); point a driver "
        f"at it with --ray-address {address} and, in its environment:\n"
        f"export {CLUSTERS_VAR}=0 RAY_AUTH_MODE=token RAY_AUTH_TOKEN={token} "
        f"RAY_USAGE_STATS_ENABLED=0\n{server}Ctrl-C stops it"
    )


def main(argv: list[str] | None = None) -> int:
    """Start the nodes, print the address and the driver's variables, wait for Ctrl-C/SIGTERM.

    Returns:
        0 once stopped; 1 when Ray is not installed or the nodes did not start, 2 when ``--port``
        is in use (one line each).
    """
    import importlib.util

    args = parse_args(argv)
    if args.port:
        from attnstudy.serving.ui import port_in_use

        if port_in_use("127.0.0.1", args.port):  # Ray would wait 40 s for a GCS that never starts
            print(
                f"attnstudy: error: port {args.port} is in use; choose another with --port",
                file=sys.stderr,
            )
            return 2
    if importlib.util.find_spec("ray") is None:
        print(f"attnstudy: error: {RAY_EXTRA}", file=sys.stderr)
        return 1
    if "ray" in sys.modules:  # the variables below are read when ray is imported
        raise RuntimeError("attnstudy.executors.loopback_cluster must run before ray is imported")
    token = os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(24)
    temp_dir = Path(tempfile.mkdtemp(prefix="attn-rayl-", dir="/tmp"))  # short: socket paths
    (temp_dir / "ray").mkdir()  # Ray's own folder under $RAY_TMPDIR (ray_current_cluster)
    os.environ.update(cluster_env(token, temp_dir))
    signal.signal(signal.SIGTERM, _interrupt)
    cluster = None
    try:
        from ray.cluster_utils import Cluster

        node = _node_args(args, temp_dir)
        dashboard_port = free_port() if args.dashboard else None
        cluster = Cluster(
            initialize_head=True,
            head_node_args=_head_args(args, node, dashboard_port),
            shutdown_at_exit=True,
        )
        _add_nodes(cluster, args, node, temp_dir)
        cluster.wait_for_nodes()
        # Ray's nodes install a SIGTERM handler that drains them first, for up to 30 s (the GCS
        # it asks may be going away too): SIGTERM stops the nodes at once, as Ctrl-C does
        signal.signal(signal.SIGTERM, _interrupt)
        print(_ready_message(cluster.address, args, token, dashboard_port), flush=True)
        signal.pause()
    except KeyboardInterrupt:
        print("stopping the Ray nodes", file=sys.stderr, flush=True)
    except Exception as err:  # noqa: BLE001 - Ray's start failures, in one line
        cause = (str(err).strip().splitlines() or [type(err).__name__])[0]
        print(f"attnstudy: error: the Ray nodes did not start: {cause}", file=sys.stderr)
        return 1
    finally:
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
