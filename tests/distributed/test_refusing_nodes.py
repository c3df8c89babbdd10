"""A node that cannot run the study's tasks (other code, a broken torch, other data) is left out
before it is given any: the driver asks every alive node once (``probe_node``, a Ray task pinned
to the node by its ``ray.io/node-id`` label) and gives every task a label selector that excludes
the nodes that refused, each named in one note line. Ray is replaced by a stand-in here (the
decisions: who is asked, who is left out, what is said); the probe itself runs in-process against
other code and other data; Ray's selector on two real loopback nodes is
tests/distributed/test_loopback_recipe.py."""

from __future__ import annotations

import types
from dataclasses import asdict

import pytest

from attnstudy.executors.distributed import NODE_ID_LABEL, RayExecutor
from attnstudy.executors.ray_head import ClusterError
from attnstudy.runtime.code_version import this_code
from attnstudy.runtime.notices import said
from attnstudy.study.tasks import probe_node, probe_payload


class _Ref:
    def __init__(self, node: str):
        self.node = node


class _FakeRay:
    """``nodes``, ``remote(f).options(...).remote(payload)``, ``wait``, ``get``, ``cancel``: each
    probe answers what ``answers`` says for its node (a dict, or an exception to raise, or
    ``None``: no answer in time)."""

    def __init__(self, nodes: dict[str, dict], answers: dict[str, object]):
        self._nodes, self.answers, self.asked, self.cancelled = nodes, answers, [], []

    def nodes(self):
        return [
            {"NodeID": nid, "NodeManagerAddress": f"10.0.0.{i}", "Alive": True, "Resources": r}
            for i, (nid, r) in enumerate(self._nodes.items(), start=5)
        ]

    def remote(self, fn):
        fake = self

        class _Remote:
            def options(self, **opts):
                (node,) = [v for k, v in opts["label_selector"].items() if k == NODE_ID_LABEL]
                assert opts["num_cpus"] == 0 and opts["max_retries"] == 0
                return types.SimpleNamespace(remote=lambda payload: fake._ask(node, payload))

        return _Remote()

    def _ask(self, node, payload):
        self.asked.append((node, payload))
        return _Ref(node)

    def wait(self, refs, num_returns, timeout):
        ready = [r for r in refs if self.answers[r.node] is not None]
        return ready, [r for r in refs if r not in ready]

    def get(self, ref):
        answer = self.answers[ref.node]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def cancel(self, ref):
        self.cancelled.append(ref.node)


def tiny_config_path():
    from pathlib import Path

    return Path(__file__).parents[2] / "experiments" / "tiny.toml"


def _common(tmp_path) -> dict:
    return {"code": asdict(this_code()), "shipped": True, "root": str(tmp_path), "uri": "x"}


CPU = {"CPU": 4.0}


def test_refusing_nodes_are_left_out_and_named_the_rest_take_the_queue(tiny_config, tmp_path):
    ok, other, broken, slow = "a" * 56, "b" * 56, "c" * 56, "d" * 56
    fake = _FakeRay(
        {ok: CPU, other: CPU, broken: CPU, slow: CPU, "e" * 56: {"memory": 1.0}},  # e: no CPU
        {
            ok: {"ok": True},
            other: {"ok": False, "error": "copy/x/seed1: the data on this node differ"},
            broken: RuntimeError("Failed to set up runtime environment.\ntraceback"),
            slow: None,
        },
    )
    executor = RayExecutor("127.0.0.1:1")
    executor._ray = fake
    before = len(said())
    options = executor._leave_out_refusing(tiny_config, tiny_config.runs(), _common(tmp_path))
    assert options == {"label_selector": {NODE_ID_LABEL: f"!in({other},{broken})"}}
    assert sorted(n for n, _ in fake.asked) == [ok, other, broken, slow]  # not the CPU-less node
    assert fake.cancelled == [slow]  # no answer in time: asked to stop, not left out
    assert said()[before:] == [
        f"node 10.0.0.6 ({other[:12]}): copy/x/seed1: the data on this node differ; it is left "
        "out of this study, the other nodes take its tasks",
        f"node 10.0.0.7 ({broken[:12]}): RuntimeError: Failed to set up runtime environment.; it "
        "is left out of this study, the other nodes take its tasks",
    ]
    payload = fake.asked[0][1]
    assert payload["code"] == asdict(this_code()) and payload["shipped"] is True
    assert len(payload["data"]) == 1  # the tiny study's variants share one data set


def test_one_node_is_not_asked_and_every_node_refusing_is_one_error(tiny_config, tmp_path):
    executor = RayExecutor("127.0.0.1:1")
    executor._ray = _FakeRay({"a" * 56: CPU}, {"a" * 56: {"ok": False, "error": "no"}})
    assert executor._leave_out_refusing(tiny_config, tiny_config.runs(), _common(tmp_path)) == {}
    assert executor._ray.asked == []
    refuse = {"ok": False, "error": "other code"}
    executor._ray = _FakeRay({"a" * 56: CPU, "b" * 56: CPU}, {"a" * 56: refuse, "b" * 56: refuse})
    with pytest.raises(ClusterError) as err:
        executor._leave_out_refusing(tiny_config, tiny_config.runs(), _common(tmp_path))
    assert str(err.value) == (
        f"no node of the cluster can run the study's tasks: node 10.0.0.5 ({'a' * 12}): other "
        f"code; node 10.0.0.6 ({'b' * 12}): other code"
    )


def test_the_nodes_left_must_still_place_every_task(tiny_config, tmp_path):
    """The one node big enough for a task refuses: the study is refused before it starts."""
    from attnstudy.config import ConfigError
    from attnstudy.experiment import load_experiment

    cfg = load_experiment(tiny_config_path(), ["training.threads=8"])
    executor = RayExecutor("127.0.0.1:1")
    executor._ray = _FakeRay(
        {"a" * 56: {"CPU": 8.0}, "b" * 56: {"CPU": 2.0}},
        {"a" * 56: {"ok": False, "error": "other code"}, "b" * 56: {"ok": True}},
    )
    with pytest.raises(ConfigError, match="threads"):
        executor._leave_out_refusing(cfg, cfg.runs(), _common(tmp_path))


def test_the_probe_refuses_other_code_and_other_data_and_passes_the_same(tiny_config, tmp_path):
    payload = probe_payload(tiny_config.runs(), _common(tmp_path))
    assert probe_node(payload) == {"ok": True}
    other = payload | {"code": {"digest": "0" * 64, "commit": "unknown"}}
    refused = probe_node(other)
    assert refused["ok"] is False and "code" in refused["error"], refused
    spec_json, digest = payload["data"][0]
    moved = payload | {"data": [(spec_json, "f" * 64)]}
    refused = probe_node(moved)
    assert refused["ok"] is False
    assert refused["error"] == (
        f"{tiny_config.runs()[0].name}: the data on this node (digest {digest[:12]}) differ from "
        f"the driver's ({'f' * 12}); give every node the same data files"
    )
