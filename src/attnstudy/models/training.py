"""Teacher-forced training with Adam, gradient clipping, early stopping and per-epoch checkpoints.

Deterministic on CPU for a given seed: parameters are initialised after ``torch.manual_seed``,
batch order comes from a generator seeded by (seed, epoch), and a checkpoint holds model,
optimiser and RNG state, so a resumed run continues exactly where it stopped.

The model is built on the CPU (the same initial weights whatever the device) and moved to
``training.device`` (:mod:`attnstudy.models.devices`); every batch follows it. ``training.amp`` runs
the
training forward and backward under autocast (float16 with loss scaling on CUDA, bfloat16 on the
CPU); the parameters, evaluation and the stored model stay float32.
"""

from __future__ import annotations

import collections
import fcntl
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from attnstudy.config import RunSpec
from attnstudy.data.batching import make_batches
from attnstudy.data.tasks import get_task
from attnstudy.data.types import Example, Splits
from attnstudy.data.vocab import PAD_ID, Vocab
from attnstudy.models import Seq2Seq, build_model, eval_mode
from attnstudy.models.devices import model_device, resolve_device
from attnstudy.runtime.env import env_seconds
from attnstudy.runtime.notices import notice
from attnstudy.runtime.progress import Progress
from attnstudy.runtime.signals import check_interrupt
from attnstudy.scoring.metrics import evaluate

LOWER_IS_BETTER = {"loss", "per", "token_error_rate", "wer"}


@dataclass
class TrainResult:
    """What training produced.

    Attributes:
        model: the best model (by the early-stopping metric), in eval mode.
        history: one dict of metrics per epoch (``train/loss``, ``dev/…``).
        best_epoch: 1-based epoch of the best model.
        stopped_early: True if patience ran out before ``epochs``.
        seconds: training wall time (this process; resumed time excluded).
        averaged: with ``training.average_last`` > 1, the dev metrics (``dev/…``) of the average of
            the last epochs' weights where it beat the best epoch (``model`` is then that
            average), else None.
        averaged_epochs: the epochs averaged (empty when ``averaged`` is None).
    """

    model: Seq2Seq
    history: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int = 0
    stopped_early: bool = False
    seconds: float = 0.0
    averaged: dict[str, float] | None = None
    averaged_epochs: tuple[int, ...] = ()


def early_stopping_metric(spec: RunSpec) -> str:
    """The dev metric that selects the model: ``training.early_stopping``, or under ``auto`` the
    task's own (its registry entry: PER for G2P, exact match otherwise). ``per`` and
    ``token_error_rate`` both name the token error rate, under the task's own name
    (:attr:`attnstudy.data.tasks.TaskSpec.error_rate`)."""
    configured = spec.training.early_stopping
    if configured == "auto":
        return get_task(spec.data.task).early_stopping_metric
    if configured in ("per", "token_error_rate"):
        return get_task(spec.data.task).error_rate
    return configured


def max_decode_len(spec: RunSpec, src_len: int) -> int:
    """Step budget (EOS included) for free-running decoding of a source of ``src_len`` tokens:
    ``ceil(training.max_decode_factor × src_len) + 2``, at most ``data.max_target_len + 1``."""
    return min(
        int(math.ceil(spec.training.max_decode_factor * src_len)) + 2, spec.data.max_target_len + 1
    )


def translate(
    model: Seq2Seq,
    examples: Sequence[Example],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    spec: RunSpec,
    beam_size: int = 1,
    batch_size: int = 256,
) -> list[list[str]]:
    """Decode ``examples`` (greedy, or beam search when ``beam_size`` > 1); tokens without EOS."""
    hyps: list[list[str] | None] = [None] * len(examples)
    device = model_device(model)
    with eval_mode(model), torch.no_grad():
        for batch in make_batches(list(examples), src_vocab, tgt_vocab, batch_size, shuffle=False):
            batch = batch.to(device)
            max_len = max_decode_len(spec, int(batch.src_lengths.max()))
            if beam_size > 1:
                budgets = torch.tensor(
                    [max_decode_len(spec, n) for n in batch.src_lengths.tolist()], device="cpu"
                )
                out = model.beam_search(batch.src, batch.src_lengths, budgets, beam_size)
            else:
                out = model.greedy(batch.src, batch.src_lengths, max_len)
            for i, ids, n in zip(batch.indices, out, batch.src_lengths.tolist()):
                # each example's own budget, so a hypothesis never depends on its batch-mates
                hyps[i] = tgt_vocab.decode(ids[: max_decode_len(spec, n)])
    return hyps  # type: ignore[return-value]


def dev_loss(
    model: Seq2Seq,
    examples: Sequence[Example],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    batch_size: int = 256,
) -> float:
    """Mean per-token cross-entropy (nats) under teacher forcing."""
    total, tokens = 0.0, 0
    device = model_device(model)
    with eval_mode(model), torch.no_grad():
        for batch in make_batches(list(examples), src_vocab, tgt_vocab, batch_size, shuffle=False):
            batch = batch.to(device)
            logits = model(batch.src, batch.src_lengths, batch.tgt_in)
            total += float(
                nn.functional.cross_entropy(
                    logits.transpose(1, 2), batch.tgt_out, ignore_index=PAD_ID, reduction="sum"
                )
            )
            tokens += int((batch.tgt_out != PAD_ID).sum())
    return total / max(tokens, 1)


def evaluate_split(
    model: Seq2Seq,
    examples: Sequence[Example],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    spec: RunSpec,
    beam_size: int = 1,
) -> tuple[dict[str, float], list[list[str]]]:
    """Task metrics (metrics.evaluate) of greedy or beam decoding, and the hypotheses."""
    hyps = translate(model, examples, src_vocab, tgt_vocab, spec, beam_size)
    return evaluate(hyps, list(examples), error_rate=get_task(spec.data.task).error_rate), hyps


CHECKPOINT_KEYS = {
    "model",
    "optimizer",
    "rng",
    "epoch",
    "history",
    "best",
    "best_epoch",
    "bad_epochs",
    "best_state",
}


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message names the file and what to do."""


class NonFiniteError(RuntimeError):
    """A loss, score, logit or attention weight is NaN or infinite: no number computed from it is trustworthy."""


class TrainingConflictError(RuntimeError):
    """Another process is training the same model (same model key) right now."""


def _atomic_save(obj, path: Path) -> None:
    """Write ``obj`` to ``path`` through a temporary file of this process, then rename it into place,
    so a reader (or a second writer) never sees a torn file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_checkpoint(path: str | Path) -> dict:
    """Load and check a training checkpoint (``weights_only=True``: tensors and plain containers only).

    Raises:
        CheckpointError: the file is unreadable, truncated, not a plain checkpoint or lacks entries
            (one line naming the file; never the suggestion to load it unsafely).
    """
    path = Path(path)
    hint = "delete it or train without --resume"
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, random bytes, a pickle with code …
        text = str(err).strip().splitlines()
        first = text[0][:160] if text else ""
        if "weights_only" in str(err) or "Unpickl" in str(err):
            first = "not a plain checkpoint of tensors"
        reason = f"{type(err).__name__}{': ' + first if first else ''}"
        raise CheckpointError(f"checkpoint {path} is unreadable ({reason}); {hint}") from None
    if not isinstance(ckpt, dict) or not CHECKPOINT_KEYS <= set(ckpt):
        missing = sorted(CHECKPOINT_KEYS - set(ckpt)) if isinstance(ckpt, dict) else ["everything"]
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}; {hint}")
    return ckpt


TRAINING_WAIT = 6 * 3600.0
"""Seconds a training waits for another process training the same model, unless
``$ATTNSTUDY_TRAINING_WAIT`` says otherwise (0: do not wait)."""

LOCK_POLL = 0.25
"""Seconds between two tries of a held checkpoint lock."""


def training_wait(value: float | None = None) -> float:
    """How long a training waits for another process that trains the same model: ``value`` if
    given, else ``$ATTNSTUDY_TRAINING_WAIT``, else :data:`TRAINING_WAIT` (6 h); 0 does not wait.

    Raises:
        ConfigError: the variable is not a number of seconds in [0, 604800] (a week).
    """
    if value is not None:
        return float(value)
    return env_seconds("ATTNSTUDY_TRAINING_WAIT", TRAINING_WAIT, low=0, high=7 * 86400)


@dataclass(frozen=True)
class HeldLock:
    """A checkpoint lock this process holds.

    Attributes:
        folder: the checkpoint folder.
        waited_for: who held it before this process got it after waiting (``PID 123
            (experiment 'tiny')``), or "" when it was free at once.
    """

    folder: Path
    waited_for: str = ""


def _holder(f) -> tuple[str, str]:
    """(PID, description) written in an open lock file by the process that holds it."""
    f.seek(0)
    pid, _, owner = f.read().strip().partition("\n")
    return pid.strip() or "?", owner.strip()


@contextmanager
def checkpoint_lock(
    directory: str | Path, *, wait: float = 0.0, owner: str = ""
) -> Iterator[HeldLock]:
    """Hold an exclusive lock on a model's checkpoint folder for a whole training.

    When another process holds it, wait up to ``wait`` seconds for it, with one note naming that
    process (its PID and ``owner``, e.g. its experiment), trying again every
    :data:`LOCK_POLL` seconds; a Ctrl-C stops the wait.

    Args:
        wait: seconds to wait for a lock another process holds (0: refuse at once).
        owner: who this process is, for the note of a process that waits for it.

    Raises:
        TrainingConflictError: another process still holds it after ``wait`` seconds ("… still
            being trained by PID …", one line naming ``ATTNSTUDY_TRAINING_WAIT``).
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    lock_path = d / ".lock"
    f = open(lock_path, "a+")
    try:
        deadline = time.monotonic() + wait
        waited_for, tries = "", 0
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pid, who = _holder(f)
                holder = f"PID {pid}" + (f" ({who})" if who else "")
                left = deadline - time.monotonic()
                if left <= 0:
                    waited = f"still being trained by {holder} after waiting {wait:g} s"
                    if not wait:
                        waited = f"being trained by {holder} (a wait of 0 s was asked for)"
                    raise TrainingConflictError(
                        f"this model (checkpoint folder {d}) is {waited}; run again once it has "
                        "finished (a finished run is reused in its experiment), or wait longer "
                        "with ATTNSTUDY_TRAINING_WAIT=SECONDS"
                    ) from None
                tries += 1
                if pid == "?" and tries < 3:  # it holds the lock but has not written its PID yet
                    pass
                elif not waited_for:
                    notice(
                        f"waiting for {holder}, which is training this model (checkpoint folder "
                        f"{d}), for up to {wait:g} s (ATTNSTUDY_TRAINING_WAIT)"
                    )
                    waited_for = holder
                check_interrupt()
                time.sleep(min(LOCK_POLL, left))
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n{owner}" if owner else str(os.getpid()))
        f.flush()
        yield HeldLock(d, waited_for or ("PID ?" if tries else ""))
    finally:
        f.close()  # releases the lock


def average_states(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of several state dicts of one model (checkpoint averaging, Vaswani
    et al. 2017, §6.1), accumulated in float64 and cast back; a non-floating entry (a counter)
    is taken from the last state.

    Raises:
        ValueError: no states, or states with different keys.
    """
    if not states:
        raise ValueError("nothing to average")
    keys = list(states[-1])
    if any(list(s) != keys for s in states):
        raise ValueError("the states to average hold different tensors")
    out = {}
    for k in keys:
        last = states[-1][k]
        if last.is_floating_point():
            total = sum(s[k].to(torch.float64) for s in states)
            out[k] = (total / len(states)).to(last.dtype)
        else:
            out[k] = last.clone()
    return out


def inverse_sqrt_factor(step: int, warmup_steps: int) -> float:
    """The ``inverse_sqrt`` schedule's multiplier of the peak lr after ``step`` updates:
    ``step / warmup`` while warming up, then ``√(warmup / step)`` (Vaswani et al. 2017, eq. 3,
    rescaled so the peak is the configured lr; fairseq's ``inverse_sqrt``). Step 0 (before the
    first update) gives ``1 / warmup``, so no update is taken at lr 0."""
    step = max(step, 1)
    return step / warmup_steps if step < warmup_steps else math.sqrt(warmup_steps / step)


def _make_scheduler(spec: RunSpec, optimizer: torch.optim.Optimizer):
    """``ReduceLROnPlateau`` on the (sign-adjusted, lower is better) early-stopping score (stepped
    per epoch), a ``LambdaLR`` of :func:`inverse_sqrt_factor` (stepped per update), or None."""
    t = spec.training
    if t.scheduling == "constant":
        return None
    if t.scheduling == "inverse_sqrt":
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: inverse_sqrt_factor(step + 1, t.warmup_steps)
        )
    return torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer,
        mode="min",
        factor=t.decrease_factor,
        patience=t.scheduling_patience,
        min_lr=t.min_lr,
        threshold=0.0,
        threshold_mode="abs",
    )  # strict improvement, as early stopping; sign-safe


class _Amp:
    """Mixed precision for the training forward/backward (``training.amp``): autocast to float16
    with a gradient scaler on CUDA, to bfloat16 (no scaler needed) on the CPU; both pass-throughs
    when off."""

    def __init__(self, enabled: bool, device: torch.device):
        self.enabled, self.device = enabled, device
        self.dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
        self.scaler = torch.amp.GradScaler(device.type, enabled=enabled and device.type == "cuda")

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.enabled)


@dataclass
class _Training:
    """One training's parts and its state between epochs (what ``last.pt`` holds)."""

    spec: RunSpec
    model: nn.Module
    optimizer: torch.optim.Optimizer
    amp: _Amp
    scheduler: object | None
    device: torch.device
    metric: str  # the early-stopping metric
    sign: float  # 1: lower is better, -1: higher is better
    best_state: dict[str, torch.Tensor]
    recent: collections.deque  # (epoch, CPU weights) of the last epochs, for averaging
    start_epoch: int = 1
    history: list[dict[str, float]] = field(default_factory=list)
    best: float = math.inf
    best_epoch: int = 0
    bad_epochs: int = 0

    @property
    def per_update(self) -> bool:
        """The schedule steps per update (``inverse_sqrt``), not per epoch."""
        return self.spec.training.scheduling == "inverse_sqrt"

    @property
    def stopped(self) -> bool:
        """Early stopping's patience is spent."""
        return self.bad_epochs >= self.spec.training.patience


def _start(spec: RunSpec, n_src: int, n_tgt: int, device: torch.device) -> _Training:
    """A fresh training: threads, the seed, the model built on the CPU after the seed (the same
    initial weights on every device) and moved, the optimiser, mixed precision and schedule."""
    torch.set_num_threads(spec.training.threads)
    torch.manual_seed(spec.seed)
    model = build_model(spec.model, n_src, n_tgt).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=spec.training.lr)
    metric = early_stopping_metric(spec)
    return _Training(
        spec,
        model,
        optimizer,
        _Amp(spec.training.amp, device),
        _make_scheduler(spec, optimizer),
        device,
        metric,
        1.0 if metric in LOWER_IS_BETTER else -1.0,
        {k: v.clone() for k, v in model.state_dict().items()},
        collections.deque(maxlen=spec.training.average_last),
    )


def _resume(t: _Training, ckpt_path: Path, on_epoch) -> None:
    """Continue ``t`` from its checkpoint: weights, optimiser, schedule, RNG, history and early
    stopping's state; ``on_epoch`` is given the whole history again.

    Raises:
        CheckpointError: the checkpoint does not fit this model.
    """
    ckpt = read_checkpoint(ckpt_path)
    try:
        t.model.load_state_dict(ckpt["model"])
    except RuntimeError as err:
        raise CheckpointError(
            f"checkpoint {ckpt_path} does not fit this model "
            f"({str(err).splitlines()[0][:160]}); delete it or train without --resume"
        ) from None
    if t.scheduler is not None:
        if "scheduler" in ckpt:
            t.scheduler.load_state_dict(ckpt["scheduler"])
        elif t.spec.training.scheduling == "plateau":  # written without a schedule: replay
            for past in ckpt["history"]:
                t.scheduler.step(t.sign * past[f"dev/{t.metric}"])
    t.optimizer.load_state_dict(ckpt["optimizer"])  # after the replay: the saved lr wins
    torch.set_rng_state(ckpt["rng"])
    if t.device.type == "cuda" and "cuda_rng" in ckpt:  # dropout draws on the GPU
        torch.cuda.set_rng_state(ckpt["cuda_rng"], t.device)
    if "scaler" in ckpt:
        t.amp.scaler.load_state_dict(ckpt["scaler"])
    t.start_epoch, t.history = ckpt["epoch"] + 1, ckpt["history"]
    t.recent.extend((e, w) for e, w in ckpt.get("recent", []))
    t.best, t.best_epoch, t.bad_epochs, t.best_state = (
        ckpt["best"],
        ckpt["best_epoch"],
        ckpt["bad_epochs"],
        ckpt["best_state"],
    )
    if on_epoch is not None:  # the resumed run carries the whole history
        for epoch, metrics in enumerate(t.history, start=1):
            on_epoch(epoch, metrics)


def _train_epoch(
    t: _Training, splits: Splits, vocabs: tuple[Vocab, Vocab], *, epoch: int, progress: bool
) -> tuple[float, int, Progress]:
    """One epoch of teacher-forced updates; returns (summed loss, target tokens, its bar)."""
    spec = t.spec
    t.model.train()
    batches = make_batches(
        splits.train,
        *vocabs,
        spec.training.batch_size,
        shuffle=True,
        seed=spec.seed * 100_003 + epoch,
        bucket=spec.training.bucket_batches,
    )
    total, tokens = 0.0, 0
    bar = Progress(
        len(batches),
        f"train {spec.name} epoch {epoch}",
        enabled=progress,
        unit="batch",
        span=((epoch - 1) / spec.training.epochs, epoch / spec.training.epochs),
    )
    for batch in batches:
        check_interrupt()  # an interrupt a finalizer swallowed is acted on here
        batch = batch.to(t.device)
        with t.amp.autocast():
            logits = t.model(batch.src, batch.src_lengths, batch.tgt_in)
        n_tok = int((batch.tgt_out != PAD_ID).sum())
        loss = nn.functional.cross_entropy(
            logits.float().transpose(1, 2),
            batch.tgt_out,
            ignore_index=PAD_ID,
            reduction="sum",
            label_smoothing=spec.training.label_smoothing,
        )
        t.optimizer.zero_grad(set_to_none=True)
        t.amp.scaler.scale(loss / n_tok).backward()
        t.amp.scaler.unscale_(t.optimizer)  # clip the true gradients
        nn.utils.clip_grad_norm_(t.model.parameters(), spec.training.clip_norm)
        t.amp.scaler.step(t.optimizer)
        t.amp.scaler.update()
        if t.per_update:
            t.scheduler.step()
        total += loss.item()
        tokens += n_tok
        bar.update(1, note=f"loss {total / tokens:.3f}")
    bar.close()
    return total, tokens, bar


def _epoch_metrics(
    t: _Training, splits: Splits, vocabs: tuple[Vocab, Vocab], *, epoch: int, loss: float
) -> dict[str, float]:
    """An epoch's train and dev metrics.

    Raises:
        NonFiniteError: a loss, the early-stopping metric or a weight is NaN/inf.
    """
    metrics = {
        "train/loss": loss,
        "train/lr": t.optimizer.param_groups[0]["lr"],
        "dev/loss": dev_loss(t.model, splits.dev, *vocabs),
    }
    dev_metrics, _ = evaluate_split(t.model, splits.dev, *vocabs, t.spec)
    metrics.update({f"dev/{k}": v for k, v in dev_metrics.items() if k != "n"})
    bad = [
        k for k in ("train/loss", "dev/loss", f"dev/{t.metric}") if not math.isfinite(metrics[k])
    ]
    if bad or not all(bool(torch.isfinite(p).all()) for p in t.model.parameters()):
        what = ", ".join(f"{k} = {metrics[k]}" for k in bad) or "the weights hold NaN/inf"
        raise NonFiniteError(
            f"{t.spec.name} epoch {epoch}: {what}; training diverged (lower training.lr or "
            "training.clip_norm, or resume from an earlier checkpoint)"
        )
    return metrics


def _record_epoch(t: _Training, epoch: int, metrics: dict[str, float]) -> None:
    """Early stopping's bookkeeping (the best weights), the per-epoch schedule, the history and
    the weights kept for averaging."""
    score = t.sign * metrics[f"dev/{t.metric}"]
    if score < t.best:
        t.best, t.best_epoch, t.bad_epochs = score, epoch, 0
        t.best_state = {k: v.detach().clone() for k, v in t.model.state_dict().items()}
    else:
        t.bad_epochs += 1
    if t.scheduler is not None and not t.per_update:
        t.scheduler.step(score)
    t.history.append(metrics)
    if t.spec.training.average_last > 1:
        t.recent.append(
            (epoch, {k: v.detach().cpu().clone() for k, v in t.model.state_dict().items()})
        )


def _checkpoint(t: _Training, epoch: int) -> dict:
    """What ``last.pt`` holds after ``epoch``: everything :func:`_resume` reads."""
    state = {
        "model": t.model.state_dict(),
        "optimizer": t.optimizer.state_dict(),
        "rng": torch.get_rng_state(),
        "epoch": epoch,
        "history": t.history,
        "best": t.best,
        "best_epoch": t.best_epoch,
        "bad_epochs": t.bad_epochs,
        "best_state": t.best_state,
    }
    if t.scheduler is not None:
        state["scheduler"] = t.scheduler.state_dict()
    if t.spec.training.average_last > 1:
        state["recent"] = list(t.recent)
    if t.device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(t.device)
    if t.amp.scaler.is_enabled():
        state["scaler"] = t.amp.scaler.state_dict()
    return state


def _final_weights(
    t: _Training, splits: Splits, vocabs: tuple[Vocab, Vocab]
) -> tuple[dict[str, float] | None, tuple[int, ...]]:
    """Load the weights the training keeps: the average of the last epochs' weights where it
    beats the best epoch on dev (returns its dev metrics and epochs), else the best epoch's
    (returns None, ())."""
    averaged, averaged_epochs = None, ()
    if t.spec.training.average_last > 1 and len(t.recent) > 1:
        t.model.load_state_dict(average_states([w for _, w in t.recent]))
        t.model.eval()
        dev_metrics, _ = evaluate_split(t.model, splits.dev, *vocabs, t.spec)
        if t.sign * dev_metrics[t.metric] < t.best:
            averaged = {f"dev/{k}": v for k, v in dev_metrics.items() if k != "n"}
            averaged["dev/loss"] = dev_loss(t.model, splits.dev, *vocabs)
            averaged_epochs = tuple(e for e, _ in t.recent)
    if averaged is None:
        t.model.load_state_dict(t.best_state)
    t.model.eval()
    return averaged, averaged_epochs


def train(
    spec: RunSpec,
    splits: Splits,
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    checkpoint_dir: str | Path,
    on_epoch: Callable[[int, dict[str, float]], None] | None = None,
    resume: bool = False,
    progress: bool = True,
    device: torch.device | None = None,
    on_checkpoint: Callable[[Path], None] | None = None,
) -> TrainResult:
    """Train one model.

    Args:
        spec: the resolved run config.
        splits: train/dev/test examples (test is not touched here).
        src_vocab, tgt_vocab: vocabularies built from the training data.
        checkpoint_dir: where ``last.pt`` (written atomically after every epoch: model, optimiser,
            RNG state, history, best weights) lives.
        on_epoch: called with (epoch, metrics) after every epoch (tracking hook).
        resume: continue from ``checkpoint_dir/last.pt`` if it exists.
        progress: show progress: one bar per epoch naming the model in a terminal, a plain line
            every few seconds and one per epoch outside it
            (:class:`attnstudy.runtime.progress.Progress`).
        device: where to train (default: ``training.device`` resolved on this machine).
        on_checkpoint: called with the path of ``last.pt`` each time it is written (a shared
            store's upload, :mod:`attnstudy.study.checkpoint_store`).

    Returns:
        :class:`TrainResult` holding the best model, on ``device``.

    Raises:
        ValueError: if the training split is empty. DeviceError: the device does not exist here.
    """
    if not splits.train:
        raise ValueError("the training split is empty")
    device = resolve_device(spec.training.device) if device is None else torch.device(device)
    t = _start(spec, len(src_vocab), len(tgt_vocab), device)
    vocabs = (src_vocab, tgt_vocab)
    ckpt_dir = Path(checkpoint_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = ckpt_dir / "last.pt"
    if resume and ckpt_path.is_file():
        _resume(t, ckpt_path, on_epoch)
    t0 = time.perf_counter()
    stopped_early = t.stopped
    for epoch in range(t.start_epoch, spec.training.epochs + 1):
        if stopped_early:
            break
        total, tokens, bar = _train_epoch(t, splits, vocabs, epoch=epoch, progress=progress)
        metrics = _epoch_metrics(t, splits, vocabs, epoch=epoch, loss=total / max(tokens, 1))
        _record_epoch(t, epoch, metrics)
        _atomic_save(_checkpoint(t, epoch), ckpt_path)
        if on_checkpoint is not None:
            on_checkpoint(ckpt_path)
        bar.write(
            f"{spec.name} epoch {epoch}: train/loss {metrics['train/loss']:.4f} "
            f"dev/{t.metric} {metrics[f'dev/{t.metric}']:.4f}"
        )
        if on_epoch is not None:
            on_epoch(epoch, metrics)
        stopped_early = t.stopped
    if stopped_early and len(t.history) < spec.training.epochs and progress:
        print(
            f"{spec.name}: stopped early after epoch {len(t.history)} of {spec.training.epochs}: "
            f"dev/{t.metric} did not improve for {spec.training.patience} epochs",
            file=sys.stderr,
            flush=True,
        )
    averaged, averaged_epochs = _final_weights(t, splits, vocabs)
    return TrainResult(
        t.model,
        t.history,
        t.best_epoch,
        stopped_early,
        time.perf_counter() - t0,
        averaged,
        averaged_epochs,
    )
