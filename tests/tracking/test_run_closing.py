"""How :meth:`Tracker.active` closes a run when an interrupt comes at an awkward moment.

CI measured the defect these tests pin: a SIGINT 30 ms after a model run's logged model was
created left the run RUNNING after the process had exited (the CLI said "interrupted", exit 1),
once in 816 tests; the subprocess test (test_security_and_failures) cannot hit the moment on
purpose, so the two ways a single interrupt could skip the run's closing are made here directly:
an interrupt Python drops inside a finalizer near the end of the block (only remembered, raised by
the next store call — which was the FINISHED write itself, outside the handler), and one raised
as the FINISHED write begins.
"""

from __future__ import annotations

import gc
import signal
import sys

import pytest

from attnstudy.runtime import signals
from attnstudy.tracking import Tracker


@pytest.fixture
def tracker(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "unraisablehook", signals.quiet_dropped_interrupts)
    yield Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    signals.acknowledge_interrupt()  # no request leaks into the next test


def _new_run(tracker: Tracker) -> str:
    return tracker.start_run(tracker.experiment_id("closing"), "r")


class _InterruptInFinalizer:
    """Calls the CLI's signal handler from ``__del__``, as a Ctrl-C that lands while Python runs a
    finalizer does: the KeyboardInterrupt is dropped, the request is remembered."""

    def __del__(self):
        signals.request_interrupt(signal.SIGINT, None)


def test_an_interrupt_dropped_in_a_finalizer_at_the_end_of_the_block_kills_the_run(tracker):
    run_id = _new_run(tracker)
    with pytest.raises(KeyboardInterrupt):
        with tracker.active(run_id):
            tracker.set_tags(run_id, {"step": "last store call of the block"})
            _InterruptInFinalizer()  # freed at once: the interrupt is dropped, not raised
            gc.collect()
            assert signals._requested  # remembered, and nothing raised yet
    assert tracker.get_run(run_id).status == "KILLED"
    assert not signals._requested  # handled where the run was ended


def test_an_interrupt_as_the_finished_write_begins_still_closes_the_run(tracker, monkeypatch):
    run_id = _new_run(tracker)
    real = tracker.end_run
    calls: list[str] = []

    def end_run(rid, status="FINISHED"):
        calls.append(status)
        if len(calls) == 1:  # the signal lands before the first write reaches the store
            raise KeyboardInterrupt
        real(rid, status)

    monkeypatch.setattr(tracker, "end_run", end_run)
    with pytest.raises(KeyboardInterrupt):
        with tracker.active(run_id):
            pass
    # the block had completed: the run is FINISHED (written on the second call), then the
    # interrupt travels on to the CLI
    assert calls == ["FINISHED", "FINISHED"]
    assert tracker.get_run(run_id).status == "FINISHED"


def test_an_interrupt_during_the_block_kills_the_run_and_an_error_fails_it(tracker):
    killed, failed, finished = _new_run(tracker), _new_run(tracker), _new_run(tracker)
    with pytest.raises(KeyboardInterrupt):
        with tracker.active(killed):
            raise KeyboardInterrupt
    with pytest.raises(ValueError) as err:
        with tracker.active(failed):
            raise ValueError("bad value in the block")
    with tracker.active(finished):
        pass
    assert [tracker.get_run(r).status for r in (killed, failed, finished)] == [
        "KILLED",
        "FAILED",
        "FINISHED",
    ]
    assert err.value.failed_run_id == failed
    assert tracker.get_run(failed).tags["error.message"] == "bad value in the block"
