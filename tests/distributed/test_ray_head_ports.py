"""The private Ray head's ports: all distinct, and a head that lost a port to another process
between choosing and binding it is started again on new ports (a CI failure: "the local Ray head
exited (… make sure the same port is not used by multiple components.)")."""

from __future__ import annotations

import importlib.util

import pytest

from attnstudy.executors import ray_head
from attnstudy.executors.ray_head import ClusterError, LocalRayHead, free_ports


def test_free_ports_are_distinct():
    ports = free_ports(64)
    assert len(ports) == len(set(ports)) == 64
    assert all(1024 <= p <= 65535 for p in ports)


@pytest.fixture
def head(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # "ray installed"
    return LocalRayHead()


def test_a_port_clash_starts_the_head_again_on_new_ports(head, monkeypatch):
    tries = []

    def once(timeout):
        tries.append(timeout)
        if len(tries) < 3:
            raise ClusterError(f"the local Ray head exited ({ray_head.PORT_CLASH}.)")
        return "127.0.0.1:40000"

    monkeypatch.setattr(head, "_start_once", once)
    assert head.start(timeout=5) == "127.0.0.1:40000"
    assert tries == [5, 5, 5]


def test_port_clashes_give_up_after_the_last_attempt(head, monkeypatch):
    tries = []

    def once(timeout):
        tries.append(timeout)
        raise ClusterError(f"the local Ray head exited ({ray_head.PORT_CLASH}.)")

    monkeypatch.setattr(head, "_start_once", once)
    with pytest.raises(ClusterError, match="same port"):
        head.start(timeout=5)
    assert len(tries) == ray_head.START_ATTEMPTS


def test_any_other_failure_is_not_retried(head, monkeypatch):
    tries = []

    def once(timeout):
        tries.append(timeout)
        raise ClusterError("the local Ray head did not start within 5 s")

    monkeypatch.setattr(head, "_start_once", once)
    with pytest.raises(ClusterError, match="did not start"):
        head.start(timeout=5)
    assert len(tries) == 1
