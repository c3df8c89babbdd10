"""Run leases: a run's owner is a lease in the store, not only a local PID.

The orphan clean-up closed only runs whose owner process was on the same host; a run left by a
worker on another node stayed RUNNING for ever. And a resumed study kept the clean-up's
``error.class=OwnerGone`` tags although it finished. Here with a fake clock: the lease logic, the
heartbeat, and the clean-up on a local store whose runs say they ran elsewhere.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnstudy.tracking import Tag, Tracker
from attnstudy.tracking.leases import (
    DEFAULT_LEASE_S,
    LeaseKeeper,
    heartbeat_seconds,
    lease_expired,
    lease_seconds,
    lease_tag,
)
from attnstudy.tracking.store import reconcile_orphans

T0 = 1_800_000_000.0  # the fake clock's "now"


def test_a_lease_expires_after_its_length():
    tags = lease_tag(T0, 120)
    assert tags == {Tag.LEASE_EXPIRES: "1800000120.000"}
    assert lease_expired(tags, T0 + 119.9) is False
    assert lease_expired(tags, T0 + 120.1) is True
    assert lease_expired({}, T0) is None  # no lease: nothing can be told
    assert lease_expired({Tag.LEASE_EXPIRES: "soon"}, T0) is None
    assert heartbeat_seconds(120) == 30


def test_the_lease_length_is_a_setting(monkeypatch):
    from attnstudy.config import ConfigError

    monkeypatch.delenv("ATTNSTUDY_LEASE_SECONDS", raising=False)
    assert lease_seconds() == DEFAULT_LEASE_S == 120
    monkeypatch.setenv("ATTNSTUDY_LEASE_SECONDS", "30")
    assert lease_seconds() == 30
    for bad in ("0", "1", "nan", "ten", "1e9"):
        monkeypatch.setenv("ATTNSTUDY_LEASE_SECONDS", bad)
        with pytest.raises(ConfigError, match="ATTNSTUDY_LEASE_SECONDS"):
            lease_seconds()


def test_the_heartbeat_renews_kept_runs_only():
    now = [T0]
    written: list[tuple[str, dict]] = []
    keeper = LeaseKeeper(lambda r, t: written.append((r, t)), lease=60, clock=lambda: now[0])
    assert keeper.start_tags() == {Tag.LEASE_EXPIRES: f"{T0 + 60:.3f}"}
    keeper.runs |= {"a", "b"}  # as keep() does, without its thread
    now[0] = T0 + 15
    assert keeper.beat() == ["a", "b"]
    assert written == [(r, {Tag.LEASE_EXPIRES: f"{T0 + 75:.3f}"}) for r in ("a", "b")]
    keeper.release("a")
    written.clear()
    now[0] = T0 + 30
    assert keeper.beat() == ["b"]
    assert written == [("b", {Tag.LEASE_EXPIRES: f"{T0 + 90:.3f}"})]


def test_a_failed_renewal_is_tried_again_at_the_next_beat():
    calls = []

    def write(run_id, tags):
        calls.append(run_id)
        if len(calls) == 1:
            raise ConnectionError("server down")

    keeper = LeaseKeeper(write, lease=60, clock=lambda: T0)
    keeper.runs.add("a")
    assert keeper.beat() == [] and keeper.beat() == ["a"]


@pytest.fixture
def tracker(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSTUDY_ROOT", str(tmp_path))
    t = Tracker(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    return t, t.experiment_id("leases")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_clean_up_closes_a_run_of_another_node_whose_lease_expired(tracker):
    t, exp = tracker
    elsewhere = t.start_run(exp, "elsewhere")  # a Ray worker's run on another node
    t.set_tags(
        elsewhere,
        {Tag.OWNER_HOST: "node-b", Tag.OWNER_PID: "4242"} | lease_tag(T0, 120),
    )
    no_lease = t.start_run(exp, "old")  # another node's run from before leases: left alone
    t.set_tags(no_lease, {Tag.OWNER_HOST: "node-c", Tag.OWNER_PID: "4243"})
    mine = t.start_run(exp, "mine")  # this process: alive, even with an expired lease
    t.set_tags(mine, lease_tag(T0 - 1000, 120))

    assert reconcile_orphans(t, exp, now=T0 + 119) == []  # the lease still runs
    assert reconcile_orphans(t, exp, now=T0 + 121) == [elsewhere]
    run = t.get_run(elsewhere)
    assert run.status == "KILLED" and run.tags[Tag.ERROR_CLASS] == "OwnerGone"
    assert run.tags[Tag.ERROR_MESSAGE] == (
        "its owner, process 4242 on node-b, stopped renewing its lease (expired "
        "2027-01-15 08:02:00 UTC): the process or its node is gone"
    )
    assert run.tags[Tag.NOTE].startswith("Killed: its owner, process 4242 on node-b")
    assert t.get_run(no_lease).status == "RUNNING" and t.get_run(mine).status == "RUNNING"


def test_a_dead_pid_on_this_host_is_closed_at_once(tracker):
    t, exp = tracker
    run = t.start_run(exp, "killed")
    pid = _dead_pid()
    t.set_tags(run, {Tag.OWNER_PID: str(pid), Tag.OWNER_START: "unknown"} | lease_tag(T0, 120))
    assert reconcile_orphans(t, exp, now=T0) == [run]  # before its lease expired
    assert t.get_run(run).tags[Tag.ERROR_MESSAGE] == (
        f"process {pid} ended without closing the run"
    )


def test_a_resumed_run_carries_no_stale_error_tags(tracker):
    t, exp = tracker
    study = t.start_run(exp, "tiny/study")
    t.set_tags(study, {Tag.OWNER_PID: str(_dead_pid()), Tag.OWNER_START: "unknown"})
    assert reconcile_orphans(t, exp) == [study]
    t.set_tags(study, {Tag.FAILED: "1 part(s) of the study failed"})
    t.reopen_run(study)
    run = t.get_run(study)
    assert run.status == "RUNNING"
    assert not {Tag.ERROR_CLASS, Tag.ERROR_MESSAGE, Tag.FAILED} & set(run.tags), run.tags
    t.end_run(study)
    assert t.get_run(study).status == "FINISHED"
