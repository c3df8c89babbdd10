"""Where the tensors of a training or an analysis live: ``training.device`` and ``ablation.device``
(``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``), resolved on the machine that runs the work
(a Ray worker resolves its own), never where the study was configured.

``auto`` is the GPU when this torch build has CUDA and a GPU is visible, else the CPU. Inside a
Ray task (:func:`placed_by_scheduler`) the scheduler's placement decides: a task that asked for no
GPU runs ``auto`` on the CPU, so tasks placed by their CPU request never share a GPU behind the
scheduler's back, and a task that asked for one (``cuda`` or ``cuda:N``) runs on the GPU it was
given, which it sees as ``cuda:0``. The device decides where
the numbers are computed, not what is computed: it is logged as the run's ``device`` tag and left
out of the model key (like ``training.threads``). Random draws of the ablations stay on CPU
generators and are moved to the device afterwards, so permutations are identical on every device.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from attnstudy.config import DEVICE_PATTERN, ConfigError

_PLACED: list[bool | None] = [None]  # None: not inside a scheduled task; else: it was given a GPU


class DeviceError(ConfigError):
    """The named device does not exist on this machine (the message says what to use instead)."""


@contextmanager
def placed_by_scheduler(gpu: bool) -> Iterator[None]:
    """Within the block, devices resolve as a cluster task placed by its resource request:
    ``auto`` is ``cuda:0`` only if the task was given a GPU (``gpu``), and ``cuda``/``cuda:N``
    name the one GPU it was given (``cuda:0`` of what it sees)."""
    before = _PLACED[0]
    _PLACED[0] = gpu
    try:
        yield
    finally:
        _PLACED[0] = before


def resolve_device(name: str, setting: str = "training.device") -> torch.device:
    """The torch device a setting names, checked on this machine.

    Args:
        name: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        setting: the setting's name, for the message.

    Returns:
        ``cpu``, or ``cuda:N`` (``cuda`` is ``cuda:0`` of the visible devices).

    Raises:
        DeviceError: an unknown name, a CUDA device on a torch build without CUDA or a machine
            without a visible GPU, or an index past the visible GPUs.
    """
    if not DEVICE_PATTERN.match(name):
        raise DeviceError(f"{setting} = {name!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if name == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    placed = _PLACED[0]
    if name == "auto":
        return torch.device("cuda:0" if available and placed is not False else "cpu")
    if not available:
        build = (
            f"this torch ({torch.__version__}) is a CPU build"
            if torch.version.cuda is None
            else "no GPU is visible (CUDA_VISIBLE_DEVICES, the driver)"
        )
        raise DeviceError(
            f"{setting} = {name!r} but {build}; use 'cpu' or 'auto', or install a CUDA build of "
            "torch (docs/gpu.md)"
        )
    index = 0 if placed is not None else int(name.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceError(
            f"{setting} = {name!r} but this machine shows {count} GPU(s) (cuda:0 … cuda:{count - 1})"
        )
    return torch.device("cuda", index)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's parameters (the CPU for a model without parameters)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def requests_gpu(name: str) -> bool:
    """Whether a device setting asks for a GPU explicitly (``cuda`` or ``cuda:N``): only then does a
    Ray task request one."""
    return name.startswith("cuda")
