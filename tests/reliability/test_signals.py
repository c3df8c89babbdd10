"""deferred_signals under a signal that lands between two handler swaps.

The block swaps the SIGINT and SIGTERM handlers one after the other, on entry and again on exit. A
real signal is sent to this process right after one swap and before the next; whatever its handler
does, no handler may stay on ``_remember`` outside a block, and nothing may stay pending for a later
block.
"""

from __future__ import annotations

import os
import signal
import types

import pytest

from attnstudy.runtime import signals


class _Interrupted(KeyboardInterrupt):
    pass


def _raise(signum, frame):
    raise _Interrupted(signum)


@pytest.fixture
def handlers():
    """SIGINT raises, SIGTERM is recorded; the test's own handlers are put back afterwards."""
    saved = {s: signal.getsignal(s) for s in signals.SIGNALS}
    seen: list[int] = []
    signal.signal(signal.SIGINT, _raise)
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    yield seen
    for s, h in saved.items():
        signal.signal(s, h)
    signals._pending.clear()
    signals._depth = 0


def _send_after(monkeypatch, call: int, signum: int) -> None:
    """Make the ``call``-th ``signal.signal`` made by attnstudy.runtime.signals send ``signum`` to
    this
    process right after it returns; the handler runs at the next bytecode boundary, i.e. before
    the following swap."""
    calls = {"n": 0}

    def swap(s, handler):
        previous = signal.signal(s, handler)
        calls["n"] += 1
        if calls["n"] == call:
            os.kill(os.getpid(), signum)
            for _ in range(10_000):  # the handler runs here, before this returns
                pass
        return previous

    shim = types.SimpleNamespace(**{k: getattr(signal, k) for k in dir(signal) if k.isupper()})
    shim.signal = swap
    shim.getsignal = signal.getsignal
    monkeypatch.setattr(signals, "signal", shim)


def test_a_sigint_between_the_two_restores_leaves_sigterm_restored(handlers, monkeypatch):
    term_handler = signal.getsignal(signal.SIGTERM)
    # calls 1-2 swap in _remember on entry; call 3 puts SIGINT's handler back, which then fires
    _send_after(monkeypatch, call=3, signum=signal.SIGINT)
    ran = False
    with pytest.raises(_Interrupted):
        with signals.deferred_signals():
            ran = True
    assert ran
    assert signal.getsignal(signal.SIGTERM) is term_handler  # was left on _remember
    assert signal.getsignal(signal.SIGINT) is _raise
    assert signals._depth == 0 and signals._pending == []


def test_a_sigterm_between_the_two_swaps_on_entry_puts_sigint_back(handlers, monkeypatch):
    signal.signal(signal.SIGTERM, _raise)
    # call 1 swaps SIGINT to _remember; SIGTERM, still on its own handler, then raises
    _send_after(monkeypatch, call=1, signum=signal.SIGTERM)
    ran = False
    with pytest.raises(_Interrupted):
        with signals.deferred_signals():
            ran = True
    assert not ran
    assert signal.getsignal(signal.SIGINT) is _raise  # was left on _remember
    assert signal.getsignal(signal.SIGTERM) is _raise
    assert signals._depth == 0 and signals._pending == []


def test_a_signal_inside_the_block_is_delivered_once_after_it(handlers):
    seen = handlers
    with signals.deferred_signals():
        with signals.deferred_signals():  # nested: delivered at the outermost exit only
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000):
                pass
            assert seen == []
        assert seen == []
    assert seen == [signal.SIGTERM]
    with signals.deferred_signals():
        pass
    assert seen == [signal.SIGTERM]  # not held over for the next block
