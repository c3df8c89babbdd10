"""The local executor on several worker processes: a study's independent models trained and
ablated side by side on this machine (``experiment.workers``; ``--set experiment.workers=N``).

* **Task units.** The same two tasks as on a Ray cluster (:func:`attnstudy.study.tasks.train_task`
  and :func:`~attnstudy.study.tasks.ablate_task`), run in a pool of ``spawn``-started worker
  processes: every training is submitted at once, a model's ablation as soon as its training has
  come back. Each task sets its spec's intra-op threads (``training.threads``, 1 by default) as
  the one-process study does, so every stored table and metric is bit-identical to the
  one-process run (tests/study/test_local_workers.py compares them).
* **The driver** (this process) keeps the study run, the seed variance, the trained adversaries
  and the report, collects the run ids in spec order, and shows one progress bar of tasks.
* **Progress of the tasks.** Each task writes the line it starts with (``train NAME (model k of
  N): started``) and plain progress lines (batches of an epoch, examples × prefixes of the
  ablations, with rate and time left; at least one every
  :func:`attnstudy.runtime.progress.line_interval`
  seconds), never a bar: a worker sends its lines through a pipe to the driver, which writes
  them to its stderr above its own bar (lines of several processes never interleave mid-line);
  ``--quiet`` silences them as well.
* **Failures.** A task that raises fails alone, its run FAILED with the error, as in the
  one-process study. A worker process that dies (killed, out of memory) breaks the pool: every
  task not yet back fails with that reason and the runs they left RUNNING (each carries its task's
  token, ``attnstudy.cluster_task``) are ended FAILED; the other models' finished runs are kept
  (``--resume`` reuses them).
* **Ctrl-C / SIGTERM** reach the driver only (the workers run in their own process group); it
  passes an interrupt to every worker (each reports its PID when it starts) — a busy one's run
  ends KILLED as in the one-process study,
  and no worker starts a task after it (one the pool had already handed over returns
  "interrupted" without a run) —, ends KILLED what a worker could not close within
  :data:`STOP_WAIT` seconds, and the study run ends KILLED.
* **Reuse and ``--resume``** as in the one-process study: a finished run of the same model key is
  reused, a finished ablation of a resumed study is kept; two models of the same key wait for each
  other (:func:`attnstudy.models.training.checkpoint_lock`).

One worker (``experiment.workers = 1``) is the one-process study itself
(:func:`attnstudy.study.driver._run_variants_here`), with no pool.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from attnstudy.experiment import ExperimentConfig
from attnstudy.study.tasks import (
    Job,
    ablate_payload,
    ablate_task,
    common_payload,
    end_interrupted,
    record_jobs,
    settle_best_aliases,
    train_payload,
    train_task,
)

STOP_WAIT = 20.0
"""Seconds an interrupted study waits for its busy workers to close their runs KILLED."""


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


WORKERS_VAR = "ATTNSTUDY_WORKERS"
"""The default of ``experiment.workers`` where a study's config leaves it unset (the test suite
sets 1: its tests patch functions that worker processes would not see)."""


def local_workers(cfg: ExperimentConfig) -> int:
    """How many worker processes the local executor runs: ``experiment.workers``, else
    ``$ATTNSTUDY_WORKERS``, else this machine's cores divided by the largest ``training.threads``
    of the study; capped by the number of models (variants × seeds), at least 1.

    Raises:
        ConfigError: a ``$ATTNSTUDY_WORKERS`` that is not a count in 1..256; an invalid variant
            (from :meth:`ExperimentConfig.runs`).
    """
    from attnstudy.config import ConfigError

    specs = cfg.runs()
    n = cfg.experiment.workers
    env = os.environ.get(WORKERS_VAR, "").strip()
    if n is None and env:
        if not env.isdigit() or not 1 <= int(env) <= 256:
            raise ConfigError(
                f"{WORKERS_VAR}={env!r} is not a count of worker processes in 1..256; set it to "
                "1 for one model after another, or unset it for one per core"
            )
        n = int(env)
    if n is None:
        n = available_cores() // max(spec.training.threads for spec in specs)
    return max(1, min(n, len(specs)))


def local_executor(cfg: ExperimentConfig) -> LocalPoolExecutor | None:
    """The local executor for ``cfg``: a :class:`LocalPoolExecutor` with :func:`local_workers`
    processes, or None (the one-process study) when that is 1."""
    n = local_workers(cfg)
    return LocalPoolExecutor(n) if n > 1 else None


_stopped = False
"""Set in a worker once the driver interrupted it: a task handed to it afterwards (the pool queues
one more task than it has workers, and a queued task cannot be cancelled) returns "interrupted"
without starting a run."""


def _stop_between_tasks(signum, frame) -> None:
    """SIGINT / SIGTERM while the worker waits for a task: no task starts after it."""
    global _stopped
    _stopped = True


def _interrupt_task(signum, frame) -> None:
    """SIGINT / SIGTERM during a task: it raises KeyboardInterrupt inside it (its run ends KILLED,
    as in the CLI), and no task starts after it."""
    from attnstudy.runtime.signals import request_interrupt

    _stop_between_tasks(signum, frame)
    request_interrupt(signum, frame)


LINE_BYTES = 4000
"""A progress line's longest form through the pipe: one write of at most ``PIPE_BUF`` (4096)
bytes is atomic, so the workers need no lock (a worker killed while holding one would stop the
others' lines, and their tasks, for ever)."""


class _LineSender:
    """A worker's progress stream: each whole line written goes to the driver as one message on
    the pipe ``conn`` (not a terminal: progress shows plain lines)."""

    def __init__(self, conn):
        import threading

        self.conn, self.pending = conn, ""
        self._lock = threading.Lock()  # a task's watchdog thread writes too

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self.pending = (self.pending + text).split("\n")
            for line in lines:
                self.conn.send_bytes(line.encode("utf-8", "replace")[:LINE_BYTES])
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _init_worker(policy: str | None, said: tuple[str, ...] = (), lines=None, pids=None) -> None:
    """A worker process's start: its own process group (a terminal's Ctrl-C reaches the driver,
    which passes it on), an interrupt between tasks remembered (no task starts after it:
    :data:`_stopped`), the driver's library-output policy and,
    under the command line, its ``attnstudy: note:`` lines without the notices the driver already
    gave (``said``: each worker loads the same data again); its progress lines go to the driver
    through the pipe ``lines`` (a connection's sending end), and its PID through the pipe ``pids``
    (one atomic write: the driver interrupts its workers by PID, :class:`_Workers`)."""
    from attnstudy.runtime.notices import skip_said
    from attnstudy.runtime.progress import set_stream

    if pids is not None:
        pids.send_bytes(str(os.getpid()).encode())
    if lines is not None:
        set_stream(_LineSender(lines))
    os.setpgrp()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _stop_between_tasks)
    skip_said(list(said))
    if policy is not None:
        from attnstudy.runtime.notices import install_note_lines, set_library_output

        set_library_output(policy == "verbose")
        install_note_lines()


def _run_task(phase: str, *args) -> dict:
    """One task in a worker: :func:`train_task` or :func:`ablate_task`, interruptible (SIGINT or
    SIGTERM from the driver raise KeyboardInterrupt inside it, as in the CLI); refused, before
    any run starts, when the package's sources changed since the driver started (the worker
    would train other code than the study records) or when the driver interrupted this worker
    before the task reached it (it returns "interrupted": no run starts after Ctrl-C)."""
    from attnstudy.runtime.code_version import CodeVersion, this_code

    job = args[-1]
    driver, here = CodeVersion(**job["code"]), this_code()
    if driver.digest != here.digest:  # the sources were edited after the study started
        return {
            "ok": False,
            "error": f"the attnstudy sources changed after the study started ({driver.describe()} "
            f"then, {here.describe()} in the worker process): a worker would run other code than "
            "the study records; run the study again (--resume) once the edits are done",
            "failed_run_id": None,
        }
    interrupted = {"ok": False, "error": "interrupted", "interrupted": True, "failed_run_id": None}
    if _stopped:  # the driver interrupted this worker before the task reached it
        return interrupted
    fn = train_task if phase == "training" else ablate_task
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _interrupt_task)
    try:
        return fn(*args)
    except KeyboardInterrupt:
        return interrupted
    finally:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, _stop_between_tasks)


class LocalPoolExecutor:
    """Trains and ablates a study's models in ``workers`` local processes (module docstring).

    Args:
        workers: worker processes (≥ 2; one worker is the one-process study).
    """

    on_this_machine = True
    """The work runs here: :func:`attnstudy.study.driver.run_study` checks the devices before the store."""

    def __init__(self, workers: int):
        self.workers = workers

    def prepare(self, cfg, tracker, experiment_id: str) -> None:
        """Nothing to check: the devices were resolved on this machine before the store opened."""

    def close(self) -> None:
        """Nothing to release: the pool lives only inside :meth:`run_variants`."""

    def run_variants(self, ctx) -> None:
        """Train every model and ablate it as soon as it is trained, ``workers`` at a time,
        recording into ``ctx.result`` (see :meth:`attnstudy.study.driver.Executor.run_variants`)."""
        from attnstudy.runtime import notices
        from attnstudy.runtime.progress import Progress
        from attnstudy.study.model_runs import model_task

        common = common_payload(ctx)  # devices resolve as in this process (no scheduler's GPU)
        jobs = [Job.new(ctx.study_id, i, spec) for i, spec in enumerate(ctx.specs)]
        payloads = {  # job index → (training, ablation) task
            job.index: (train_payload(ctx, job, common), ablate_payload(ctx, job, common))
            for job in jobs
        }
        spawn = multiprocessing.get_context("spawn")
        # the workers' progress lines: one pipe, one atomic write per line
        inbox, lines = spawn.Pipe(duplex=False) if ctx.progress else (None, None)
        workers = _Workers(spawn)
        pool = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=spawn,
            initializer=_init_worker,
            initargs=(notices.library_output(), tuple(notices.said()), lines, workers.sender),
        )
        bar = Progress(
            2 * len(jobs), "local tasks", enabled=ctx.progress, unit="task", heartbeat=False
        )
        relay = _relay(inbox, bar) if inbox is not None else None
        running: dict[Future, tuple[Job, str]] = {}
        try:
            for job in jobs:
                running[pool.submit(_run_task, "training", payloads[job.index][0])] = (
                    job,
                    "training",
                )
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    job, phase = running.pop(fut)
                    out = self._collect(ctx, job, phase, fut)
                    bar.update(1, note=f"{model_task(job.spec, phase, noun=True)} {job.spec.name}")
                    if phase == "ablation":
                        continue
                    if job.model is None:
                        bar.update(1)  # no ablation for a failed training
                    elif job.model.run_id in ctx.done:  # a resumed study's finished ablation
                        job.ablation = ctx.done[job.model.run_id]
                        bar.update(1)
                    else:
                        try:
                            nxt = pool.submit(_run_task, "ablation", out, payloads[job.index][1])
                        except BrokenProcessPool as err:
                            self._fail(ctx, job, "ablation", err)
                            bar.update(1)
                        else:
                            running[nxt] = (job, "ablation")
                record_jobs(ctx, jobs)
        except KeyboardInterrupt:
            self._stop(ctx, workers, jobs, running)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            workers.close()
            if relay is not None:  # every worker has exited: what they wrote is in the pipe
                lines.send_bytes(_END)
                relay.join(timeout=10)
                inbox.close()
                lines.close()
            bar.close()
        settle_best_aliases(ctx, jobs)

    def _collect(self, ctx, job: Job, phase: str, fut: Future) -> dict:
        """Turn one finished task into a model, an ablation run or a failure; returns its outcome."""
        try:
            out = fut.result()
        except BrokenProcessPool as err:
            self._fail(ctx, job, phase, err)
            return {"ok": False}
        if out.get("interrupted"):
            raise KeyboardInterrupt
        job.take(phase, out)
        return out

    @staticmethod
    def _fail(ctx, job: Job, phase: str, err: BaseException) -> None:
        """A task lost when a worker process died (the pool then stops every worker and every task
        not yet back, queued ones included, is lost): its runs left RUNNING end FAILED, with the
        reason; a run it had already FINISHED stays FINISHED (``--resume`` reuses it)."""
        job.lose(
            ctx,
            phase,
            f"a worker process of the study died ({err or type(err).__name__}); this task's "
            "result did not come back",
        )

    @staticmethod
    def _stop(ctx, workers: _Workers, jobs: list[Job], running: dict) -> None:
        """Ctrl-C or SIGTERM in the driver: interrupt every worker (its run ends KILLED), wait up
        to :data:`STOP_WAIT` seconds, then end KILLED what a worker could not close."""
        from attnstudy.runtime.signals import acknowledge_interrupt

        # handled here: else every store call below raises it again and nothing is closed (the
        # study run still ends KILLED: the interrupt is raised again after this)
        acknowledge_interrupt()

        for fut in running:
            fut.cancel()  # the ones still queued
        for proc in workers.alive():  # the busy ones
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGINT)
        deadline = time.monotonic() + STOP_WAIT
        with contextlib.suppress(Exception):
            wait(running, timeout=max(0.1, deadline - time.monotonic()))
        for proc in workers.alive():  # it did not stop in time: its runs are ended below
            proc.kill()
        end_interrupted(ctx, jobs)


class _Workers:
    """The pool's worker processes, as they report themselves: each sends its PID through the pipe
    :attr:`sender` when it starts (:func:`_init_worker`); :meth:`alive` gives those of them that
    are still running children of this process (:func:`multiprocessing.active_children`, which
    also keeps a PID the system gave to another process out of reach)."""

    def __init__(self, context):
        self._inbox, self.sender = context.Pipe(duplex=False)
        self._pids: set[int] = set()

    def alive(self) -> list:
        """The reported workers still running (:class:`multiprocessing.Process` objects)."""
        with contextlib.suppress(EOFError, OSError):
            while self._inbox.poll():
                self._pids.add(int(self._inbox.recv_bytes()))
        return [p for p in multiprocessing.active_children() if p.pid in self._pids]

    def close(self) -> None:
        """Close both ends of the pipe (every worker has exited)."""
        self._inbox.close()
        self.sender.close()


_END = b"\x00"
"""What the driver sends itself once the workers are gone: the relay stops."""


def _relay(inbox, bar):
    """A thread writing the workers' progress lines (messages on the pipe ``inbox``, until
    :data:`_END`) to the driver's stderr, above its bar ``bar`` (a
    :class:`attnstudy.runtime.progress.Progress`)."""
    import threading

    def run() -> None:
        while True:
            try:
                message = inbox.recv_bytes()
            except (EOFError, OSError):
                return
            if message == _END:
                return
            bar.write(message.decode("utf-8", "replace"))

    thread = threading.Thread(target=run, name="attnstudy-worker-lines", daemon=True)
    thread.start()
    return thread
