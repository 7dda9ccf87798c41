"""Device facts the backends' launchers share (cached, no synchronisation)."""

from __future__ import annotations

import contextlib

import torch

_SM_COUNT: dict[int, int] = {}
_CAPABILITY: dict[int, tuple[int, int]] = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (cached per device index); a
    nominal 132 (an H200) for other devices, so CPU runs plan grids as a GPU would."""
    if device.type != "cuda":
        return 132
    idx = device.index if device.index is not None else torch.cuda.current_device()
    n = _SM_COUNT.get(idx)
    if n is None:
        n = _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n


def capability(device: torch.device) -> tuple[int, int]:
    """Compute capability of a CUDA device (cached per device index); ``(0, 0)``
    for other devices."""
    if device.type != "cuda":
        return (0, 0)
    idx = device.index if device.index is not None else torch.cuda.current_device()
    cc = _CAPABILITY.get(idx)
    if cc is None:
        cc = _CAPABILITY[idx] = tuple(torch.cuda.get_device_capability(idx))
    return cc


_SAME = contextlib.nullcontext()


def made_current(device: torch.device):
    """A context in which ``device`` is the current CUDA device: ``torch.cuda.device(device)``
    when the tensors of a call sit on a CUDA device that is not the current one (kernels
    launch on the current device and its streams), else a no-op context."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return _SAME
