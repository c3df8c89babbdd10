"""CPU and memory of a training or ablation run, logged as ``system/*`` metrics while it runs
(the MLflow UI's "System metrics" tab shows them).

Every :data:`INTERVAL` seconds (``$ATTNSTUDY_SYSTEM_METRICS_SECONDS``) a daemon thread samples,
and once more when the run's block ends (so a run shorter than the interval has its figures too):

* ``system/process_cpu_utilization_percentage``: CPU of the process doing the run since the
  previous sample (100 = one core busy; a process using several threads can exceed 100);
* ``system/process_memory_rss_megabytes``: its resident memory now (MB = 10⁶ bytes);
* ``system/process_memory_peak_megabytes``: its peak resident memory since the process started
  (a worker process's peak includes its earlier tasks; not on Windows);
* ``system/cpu_utilization_percentage``, ``system/system_memory_usage_megabytes``,
  ``system/system_memory_usage_percentage``: the whole machine, under MLflow's own names.

MLflow's monitor (``mlflow.system_metrics``) is not used: it measures only the machine (two
workers' runs on one machine would show the same figures), logs through a client of its own
bound to the process-wide tracking URI, and adds disk and network figures. The sampler writes
through the tracker's client, from its own thread; a failed write is skipped (the next sample
tries again). ``$ATTNSTUDY_SYSTEM_METRICS=0`` turns it off (the test suite does).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from attnstudy.runtime.env import env_seconds

ENABLED_VAR = "ATTNSTUDY_SYSTEM_METRICS"
INTERVAL_VAR = "ATTNSTUDY_SYSTEM_METRICS_SECONDS"
INTERVAL = 30.0
"""Seconds between two samples of a run."""
PREFIX = "system/"
MB = 1e6


def sampling_interval() -> float | None:
    """Seconds between two samples, or None when sampling is off (``$ATTNSTUDY_SYSTEM_METRICS``
    is ``0``, ``false``, ``off`` or ``no``).

    Raises:
        ConfigError: a value of either variable that cannot be read (one line naming it).
    """
    from ..config import ConfigError

    on = os.environ.get(ENABLED_VAR, "").strip().lower()
    if on in ("0", "false", "off", "no"):
        return None
    if on not in ("", "1", "true", "on", "yes"):
        raise ConfigError(
            f"{ENABLED_VAR}={on!r}: give 1 to log the CPU and memory of every run as system/* "
            "metrics, 0 to not"
        )
    return env_seconds(INTERVAL_VAR, INTERVAL, low=0.1, high=86_400)


class Sampler:
    """Samples this process and the machine (see the module docstring).

    Args:
        write: ``write(metrics, step)`` logs one sample (``{name: value}``, the sample's index).
        interval: seconds between two samples of the thread.
    """

    def __init__(self, write, interval: float):
        import psutil

        self.write, self.interval = write, interval
        self.process = psutil.Process()
        self.process.cpu_percent(None)  # the first call only starts the measurement
        psutil.cpu_percent(None)
        self.step = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def sample(self) -> dict[str, float]:
        """One sample: ``{metric name: value}``, CPU since the previous sample."""
        import psutil

        memory = psutil.virtual_memory()
        out = {
            "process_cpu_utilization_percentage": self.process.cpu_percent(None),
            "process_memory_rss_megabytes": self.process.memory_info().rss / MB,
            "cpu_utilization_percentage": psutil.cpu_percent(None),
            "system_memory_usage_megabytes": memory.used / MB,
            "system_memory_usage_percentage": memory.used / memory.total * 100,
        }
        peak = _peak_rss()
        if peak is not None:
            out["process_memory_peak_megabytes"] = peak / MB
        return {PREFIX + k: round(v, 1) for k, v in out.items()}

    def log(self) -> None:
        """Take one sample and write it (a failed write is skipped)."""
        with self._lock:
            step, self.step = self.step, self.step + 1
            try:
                self.write(self.sample(), step)
            except Exception:  # noqa: BLE001 - figures about the run, never a reason to stop it
                pass

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="attnstudy-system", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.log()

    def stop(self) -> None:
        """Stop the thread and write a last sample."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.log()


def _peak_rss() -> float | None:
    """This process's peak resident memory in bytes since it started, None where unknown."""
    try:
        import resource
        import sys
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


@contextlib.contextmanager
def sampling(client, run_id: str, interval: float | None):
    """Within the block, log ``run_id``'s ``system/*`` metrics every ``interval`` seconds and
    once at its end, through ``client`` (an ``MlflowClient``); nothing when ``interval`` is None
    (sampling off)."""
    if interval is None:
        yield
        return
    from mlflow.entities import Metric

    def write(metrics: dict[str, float], step: int) -> None:
        ts = int(time.time() * 1000)
        client.log_batch(run_id, metrics=[Metric(k, v, ts, step) for k, v in metrics.items()])

    sampler = Sampler(write, interval)
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.stop()
