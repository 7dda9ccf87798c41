"""Device facts the backends' launchers share (cached, no synchronisation)."""

from __future__ import annotations

import contextlib
import math
import threading

import torch

#: CUDA's bound on a launch grid's y and z extents (x goes to 2**31 - 1). Both backends put
#: batch and heads on y or z and launch over slices of the batch past it (:func:`batch_slices`).
GRID_YZ_MAX = 65535


def batch_slices(B: int, per: int) -> list[slice]:
    """``range(B)`` cut into the fewest slices of at most ``per`` batches, as equal as can be
    (sizes differ by one at most, so every launch of a call plans alike)."""
    n = max(1, -(-B // max(per, 1)))
    out, b0 = [], 0
    for i in range(n):
        size = B // n + (i < B % n)
        out.append(slice(b0, b0 + size))
        b0 += size
    return out


_SM_COUNT: dict[int, int] = {}
_CAPABILITY: dict[int, tuple[int, int]] = {}
_TYPES: dict = {}  # torch.device -> its type string (a process meets a handful of devices)


def device_type(device: torch.device) -> str:
    """``device.type``, cached per device. Reading ``torch.device.type`` builds a new
    string each time (0.26 us on the CI machine, against 0.09 for this lookup), and a
    public call asks it five or six times on its way to the kernels."""
    t = _TYPES.get(device)
    if t is None:
        t = _TYPES[device] = device.type
    return t


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (cached per device index); a
    nominal 132 (an H200) for other devices, so CPU runs plan grids as a GPU would."""
    if device_type(device) != "cuda":
        return 132
    idx = device.index if device.index is not None else torch.cuda.current_device()
    n = _SM_COUNT.get(idx)
    if n is None:
        n = _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n


def capability(device: torch.device) -> tuple[int, int]:
    """Compute capability of a CUDA device (cached per device index); ``(0, 0)``
    for other devices."""
    if device_type(device) != "cuda":
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
    if device_type(device) == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return _SAME


# Split-KV scratch (the partial states a split kernel writes and its combine reads).
# One grow-only float32 buffer per (host thread, device, stream). Calls of one thread on
# one stream reach the stream whole and in order, so they may share it. Calls on two
# streams may run at once; two threads on one stream may interleave their launches (a
# launch releases the GIL: split A, split B, combine A), so neither may share it. The
# caching allocator keeps each buffer on the stream that allocated it, so one dropped
# (grown, evicted) while its last call runs is reused only by work queued after that call;
# a thread id that Python reuses after its thread ended inherits that thread's buffers,
# safely too (the old thread launched everything it queued). Buffers of ended threads are
# kept until the key bound drops them.
_SCRATCH: dict = {}  # (thread id, _stream_key) -> [buffer, {shapes: views}]
SCRATCH_KEYS_MAX = 64  # (thread, stream) pairs kept; all dropped when one more arrives
SCRATCH_VIEWS_MAX = 256  # shape tuples kept per buffer; all dropped when one more arrives
SCRATCH_MIN_NUMEL = 1 << 16
_ALIGN = 64  # floats: views start at multiples of 256 bytes into their buffer
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or torch.cuda.is_current_stream_capturing
_thread = threading.get_ident


def _stream_key(device: torch.device, stream: int | None = None):
    """The cache key of the current stream of ``device`` (the current device): the raw
    stream handle, or ``-1 - index`` for a device's default stream (handle 0 on every
    device); ``None`` while that stream captures a CUDA graph (no key: no cache).
    ``stream``: that raw handle when the caller has just read it (it is not read again)."""
    kind = device_type(device)
    if kind != "cuda":
        return kind
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if stream is None:
        stream = _raw_stream(idx) if _raw_stream is not None else torch.cuda.current_stream(idx).cuda_stream
    if not stream:  # the legacy default stream, which cannot capture
        return -1 - idx
    return None if _capturing() else stream


def scratch(device: torch.device, shapes: tuple, stream: int | None = None) -> tuple:
    """Float32 tensors of the given ``shapes`` (a tuple of shape tuples) on ``device``,
    contiguous, disjoint, each starting a multiple of 256 bytes into its buffer (on CUDA,
    whose allocations start 512-byte aligned: 256-byte aligned), for one call's
    intermediate results; their contents are undefined.

    Outside CUDA-graph capture they are views of a buffer cached for the calling thread
    and the current stream of ``device`` (grown, never shrunk; views memoised by
    ``shapes``): a call allocates nothing once a call of the same shapes has run there,
    and calls on other streams or from other threads get other buffers, so calls that
    can overlap never share scratch. Under capture every call gets new tensors from the
    graph's memory pool, so each captured graph owns its scratch and graphs replayed at
    once do not share it, unless they were captured into one shared pool (``pool=``,
    ``make_graphed_callables``): torch's rule for such graphs is to replay them one at a
    time in capture order, and scratch freed in one capture may back the next one's.
    ``device`` must be the current CUDA device (the launchers run under
    :func:`made_current`). ``stream``: the raw handle of its current stream
    (``torch._C._cuda_getCurrentRawStream``, which Triton's launchers read too) when the
    caller has read it for its launches; ``None``: read here.
    """
    stream = _stream_key(device, stream)
    if stream is None:
        return tuple(torch.empty(s, dtype=torch.float32, device=device) for s in shapes)
    key = (_thread(), stream)
    entry = _SCRATCH.get(key)
    if entry is not None:
        views = entry[1].get(shapes)
        if views is not None:
            return views
    numels, starts, end = _layout(shapes)
    if entry is None or entry[0].numel() < end:
        if entry is None and len(_SCRATCH) >= SCRATCH_KEYS_MAX:
            _SCRATCH.clear()
        # the old buffer's views are dropped with it (they would keep it alive)
        entry = _SCRATCH[key] = [torch.empty(max(end, SCRATCH_MIN_NUMEL), dtype=torch.float32,
                                             device=device), {}]
    buf, memo = entry
    if len(memo) >= SCRATCH_VIEWS_MAX:
        memo.clear()
    views = memo[shapes] = _cut(buf, shapes, numels, starts)
    return views


def _layout(shapes: tuple) -> tuple[list, list, int]:
    """``(numels, starts, end)`` of ``shapes`` laid out one after another in one float32
    buffer, each start a multiple of ``_ALIGN`` elements; ``end`` the elements it needs."""
    numels = [math.prod(s) for s in shapes]
    starts, end = [], 0
    for n in numels:
        starts.append(end)
        end += -(-n // _ALIGN) * _ALIGN
    return numels, starts, end


def _cut(buf: torch.Tensor, shapes: tuple, numels: list, starts: list) -> tuple:
    """The views of ``buf`` that :func:`_layout` places."""
    return tuple(buf[a: a + n].view(s) for a, n, s in zip(starts, numels, shapes))


def clear_scratch() -> None:
    """Drop every cached scratch buffer (its memory returns to torch's caching allocator)."""
    _SCRATCH.clear()
