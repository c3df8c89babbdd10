"""Run leases: who still owns a RUNNING run, on whatever node it runs.

A run's owner tags name a process and its host; a later process can tell whether that process
still runs only on the same host (:func:`attnstudy.tracking.client.owner_alive`). A run started
by a Ray worker on another node that died stayed RUNNING for ever. So every run started against a
tracking server (``http(s)://``, the store a cluster shares) carries a lease in the store, the tag
``attnstudy.lease_expires`` (Unix seconds, UTC), and a heartbeat thread of the process that owns
the run renews it every :func:`heartbeat_seconds` (a quarter of the lease) until the run ends.
The clean-up (:func:`attnstudy.tracking.store.reconcile_orphans`) closes a RUNNING run whose lease
expired, whichever node it ran on; on its own host a dead owner PID closes it at once.

* **Lease length**: ``$ATTNSTUDY_LEASE_SECONDS``, default :data:`DEFAULT_LEASE_S` (120 s: the
  heartbeat every 30 s may miss three beats, a server restart say, before the run counts as
  orphaned). The nodes' clocks must agree to within a fraction of it (NTP).
* A SQLite store is one machine's: its runs get no lease (the PID check is exact there).
* A process that is stopped (SIGSTOP) or cut off from the server for longer than the lease loses
  its runs: they are closed KILLED, with the reason in ``error.message``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from attnstudy.runtime.env import env_seconds

from .schema import Tag

LEASE_VAR = "ATTNSTUDY_LEASE_SECONDS"
DEFAULT_LEASE_S = 120.0
"""Seconds a run's owner has to renew its lease before the clean-up may close the run."""
MIN_LEASE_S, MAX_LEASE_S = 4.0, 86400.0


def lease_seconds() -> float:
    """The lease length: ``$ATTNSTUDY_LEASE_SECONDS``, else :data:`DEFAULT_LEASE_S`.

    Raises:
        ConfigError: the variable is not a number of seconds in [4, 86400] (one line naming it).
    """
    return env_seconds(
        LEASE_VAR,
        DEFAULT_LEASE_S,
        low=MIN_LEASE_S,
        high=MAX_LEASE_S,
        why="the time a run's owner has to renew its lease",
    )


def heartbeat_seconds(lease: float) -> float:
    """How often a lease is renewed: a quarter of its length."""
    return lease / 4


def lease_tag(now: float, lease: float) -> dict[str, str]:
    """The lease tag of a run renewed at ``now`` (Unix seconds) for ``lease`` seconds."""
    return {Tag.LEASE_EXPIRES: f"{now + lease:.3f}"}


def lease_expired(tags: dict[str, str], now: float) -> bool | None:
    """Whether a run's lease expired at ``now`` (Unix seconds); None when it has no lease (a run
    of a SQLite store, or one written before leases existed: nothing can be told)."""
    text = tags.get(Tag.LEASE_EXPIRES)
    try:
        expires = float(text) if text is not None else None
    except ValueError:
        return None
    return None if expires is None else expires < now


class LeaseKeeper:
    """Renews the leases of the runs this process owns, from one daemon thread.

    Args:
        write: ``write(run_id, tags)`` sets tags on a run (a failure is ignored: the next beat
            tries again, and an expired lease is what a lost owner looks like anyway).
        lease: the lease length in seconds.
        clock: Unix time now (a fake one in tests).
    """

    def __init__(
        self,
        write: Callable[[str, dict[str, str]], None],
        lease: float,
        clock: Callable[[], float] = time.time,
    ):
        self.write, self.lease, self.clock = write, lease, clock
        self.runs: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start_tags(self) -> dict[str, str]:
        """The lease tag a new run starts with."""
        return lease_tag(self.clock(), self.lease)

    def keep(self, run_id: str) -> None:
        """Renew ``run_id``'s lease from now on (until :meth:`release`)."""
        with self._lock:
            self.runs.add(run_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="attnstudy-lease", daemon=True
                )
                self._thread.start()

    def release(self, run_id: str) -> None:
        """Stop renewing ``run_id``'s lease (the run ended)."""
        with self._lock:
            self.runs.discard(run_id)

    def beat(self) -> list[str]:
        """Renew every kept lease once; returns the run ids renewed."""
        with self._lock:
            runs = sorted(self.runs)
        renewed = []
        for run_id in runs:
            try:
                self.write(run_id, lease_tag(self.clock(), self.lease))
                renewed.append(run_id)
            except Exception:  # noqa: BLE001 - retried at the next beat
                pass
        return renewed

    def _loop(self) -> None:
        while True:
            self._wake.wait(heartbeat_seconds(self.lease))
            with self._lock:
                if not self.runs:
                    self._thread = None
                    return
            self.beat()


_keepers: dict[str, LeaseKeeper] = {}
_keepers_lock = threading.Lock()


def keeper_for(uri: str, client) -> LeaseKeeper | None:
    """This process's lease keeper for a tracking server (one per URI, writing through
    ``client``, an ``MlflowClient``); None for a store that is not ``http(s)://``.

    Raises:
        ConfigError: a bad ``$ATTNSTUDY_LEASE_SECONDS``.
    """
    if not uri.startswith(("http://", "https://")):
        return None
    lease = lease_seconds()
    with _keepers_lock:
        keeper = _keepers.get(uri)
        if keeper is None or keeper.lease != lease:

            def write(run_id: str, tags: dict[str, str]) -> None:
                for k, v in tags.items():
                    client.set_tag(run_id, k, v)

            keeper = _keepers[uri] = LeaseKeeper(write, lease)
        return keeper
