"""Which device a model runs on: ``"cpu"``, ``"cuda"``, ``"cuda:<index>"``, or ``"auto"`` (the first CUDA GPU
when this machine has one, else the CPU), checked against what this machine and this build of torch have.

A device this machine lacks is a clear error when the model is loaded, never a crash in its first batch:

>>> resolve_device("cpu"), resolve_device(None)
('cpu', 'cpu')
>>> resolve_device("gpu")
Traceback (most recent call last):
...
embedrank.errors.InvalidInputError: device must be 'cpu', 'cuda', 'cuda:<index>' or 'auto', got 'gpu'
"""

from __future__ import annotations

import re

import torch

from embedrank.errors import InvalidInputError

DEVICES = ("cpu", "cuda", "cuda:<index>", "auto")
_NAME = re.compile(r"^(cpu|auto|cuda(?::(\d+))?)$")


def cuda_devices() -> int:
    """How many CUDA GPUs this process can use (0 with a CPU build of torch, or none visible)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(device: str | None, *, param: str = "device") -> str:
    """The torch device ``device`` names on this machine: ``"cpu"`` or ``"cuda:<index>"`` (None: ``"cpu"``).

    Raises:
        InvalidInputError: not a device name, or a CUDA device this machine does not have (the message says
            what it has, and why none when torch is a CPU build).
    """
    name = (device or "cpu").strip().lower()
    match = _NAME.match(name)
    if match is None:
        raise InvalidInputError(
            f"{param} must be {', '.join(map(repr, DEVICES[:-1]))} or 'auto', got {device!r}", param=param
        )
    count = cuda_devices()
    if name == "auto":
        return "cuda:0" if count else "cpu"
    if name == "cpu":
        return "cpu"
    index = int(match.group(2) or 0)
    if not count:
        why = (
            f"torch {torch.__version__} is a CPU build"
            if torch.version.cuda is None
            else f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"
        )
        raise InvalidInputError(
            f"{param} {device!r} needs a CUDA GPU, and this machine has none ({why}); use 'cpu', or 'auto' "
            "to take a GPU only where there is one",
            param=param,
        )
    if index >= count:
        raise InvalidInputError(
            f"{param} {device!r}: this machine has {count} CUDA device{'s' if count > 1 else ''} "
            f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})",
            param=param,
        )
    return f"cuda:{index}"
