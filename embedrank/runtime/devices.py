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
from typing import Any

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


GPU_MAX_BATCH_TOKENS = 262_144  # padded tokens per forward pass on a GPU, at most, whatever its memory
GPU_BATCH_MEMORY_SHARE = 0.25  # of the GPU memory free once the model is loaded, for one batch's activations


def batch_tokens_for_memory(
    free_bytes: int,
    *,
    hidden: int,
    intermediate: int,
    heads: int,
    window: int,
    dtype_bytes: int,
    share: float = GPU_BATCH_MEMORY_SHARE,
    most: int = GPU_MAX_BATCH_TOKENS,
) -> int:
    """Padded tokens per forward pass whose activations fit in ``share`` of ``free_bytes``, in whole KiTokens,
    between one ``window`` and ``most``.

    A transformer layer holds, per token, its input and the attention's query, key, value, context and output
    (about 6 x ``hidden`` values, 8 counted for the norms' temporaries), the feed-forward's inner activation
    before and after its nonlinearity (2 x ``intermediate``), and one row of attention scores per head
    (``heads`` x ``window``, the most an attention without a fused kernel materializes); layers run one after
    another, so one layer's worth is live at a time.

    >>> batch_tokens_for_memory(80 * 2**30, hidden=384, intermediate=1536, heads=12, window=256, dtype_bytes=2)
    262144
    >>> batch_tokens_for_memory(2 * 2**30, hidden=768, intermediate=3072, heads=12, window=512, dtype_bytes=2)
    14336
    >>> batch_tokens_for_memory(0, hidden=768, intermediate=3072, heads=12, window=512, dtype_bytes=2)
    512
    """
    per_token = dtype_bytes * (8 * hidden + 2 * intermediate + heads * window)
    fits = int(share * max(0, free_bytes) / per_token) // 1024 * 1024
    return max(window, min(most, fits))


def gpu_batch_tokens(module: torch.nn.Module, window: int) -> int:
    """:func:`batch_tokens_for_memory` for a transformers ``module`` (or a module holding one) on its GPU: its
    config's sizes, its parameters' precision, and the memory that GPU has free now (``torch.cuda.mem_get_info``)."""
    parameter = next(module.parameters())
    config: Any = next(m.config for m in module.modules() if hasattr(getattr(m, "config", None), "hidden_size"))
    hidden = int(config.hidden_size)
    free, _ = torch.cuda.mem_get_info(parameter.device)
    return batch_tokens_for_memory(
        free,
        hidden=hidden,
        intermediate=int(getattr(config, "intermediate_size", None) or 4 * hidden),
        heads=int(getattr(config, "num_attention_heads", None) or 1),
        window=window,
        dtype_bytes=parameter.element_size(),
    )
