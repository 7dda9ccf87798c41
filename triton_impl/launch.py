"""Launchers of the Triton kernels: the config table, path choice, workspace.

Everything here is host-side Python that never synchronises with the device:
no ``.item()``, no device tensor built per call except the outputs and the
split-KV scratch, which lives in a cached, grow-only workspace. A call is
therefore capturable in a CUDA graph once a warm-up call has compiled the
kernel and sized the workspace. Triton caches the compiled kernel per static
configuration (dtype, head dims, block sizes, flags, stride specialisation).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton

from reference.validation import Problem

from . import kernels

LOG2E = 1.4426950408889634


def interpreter_active() -> bool:
    """True when Triton runs kernels on CPU tensors (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# ---------------------------------------------------------------------------
# THE config table (H200, sm_90). Key: (precision class, padded head dim =
# next power of two of max(Dqk, Dv)). "16" covers bf16 and fp16 (tensor-core
# wgmma); "32" is fp32 with input_precision="ieee" (exact fp32 products, no
# tensor cores, hence narrower tiles). Lessons behind it (FIELD-NOTES): a small
# BLOCK_N with more stages pays on Hopper for a window of a few hundred keys
# (less work wasted on the masked edge blocks, more blocks per SM); head dims
# above 128 and fp32 need narrower blocks (registers, shared memory).
# Timings that chose these rows: tools/gpu_triton.py, bench_results/.
# ---------------------------------------------------------------------------
PREFILL: dict[tuple[str, int], Config] = {
    ("16", 32): Config(128, 64, 4, 3),
    ("16", 64): Config(128, 64, 4, 3),
    ("16", 128): Config(128, 64, 8, 3),
    ("16", 256): Config(64, 32, 4, 3),
    ("32", 32): Config(64, 32, 4, 2),
    ("32", 64): Config(64, 32, 4, 2),
    ("32", 128): Config(32, 32, 4, 2),
    ("32", 256): Config(32, 16, 4, 2),
}
# Split-KV: BLOCK_N, warps and stages per (precision, head dim); BLOCK_M is the
# packed row count (G query heads x Lq queries of one key/value head) rounded
# up to a power of two, between 16 and SPLIT_MAX_M.
SPLIT: dict[tuple[str, int], Config] = {
    ("16", 32): Config(64, 64, 4, 3),
    ("16", 64): Config(64, 64, 4, 3),
    ("16", 128): Config(64, 64, 4, 3),
    ("16", 256): Config(64, 32, 4, 2),
    ("32", 32): Config(32, 32, 4, 2),
    ("32", 64): Config(32, 32, 4, 2),
    ("32", 128): Config(32, 32, 4, 2),
    ("32", 256): Config(16, 16, 4, 2),
}
SPLIT_BLOCK_M = (16, 32, 64)  # the shipped split-KV row tiles (capped by SPLIT[...].block_m)
MAX_SPLITS = 64
COMBINE_ROWS = 1
COMBINE_WARPS = 4


def dtype_class(dtype: torch.dtype) -> str:
    return "32" if dtype == torch.float32 else "16"


def head_bucket(p: Problem) -> int:
    return max(32, _pow2(max(p.Dqk, p.Dv)))


_SM_COUNT: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (cached); a nominal 132 on CPU."""
    if device.type != "cuda":
        return 132
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


# Grow-only fp32 scratch per device for the split-KV partial states.
_WORKSPACE: dict[tuple[str, int | None], torch.Tensor] = {}


def workspace(device: torch.device, numel: int) -> torch.Tensor:
    """A cached fp32 buffer of at least ``numel`` elements on ``device``.

    Grown (never shrunk) outside the hot path; a warm-up call before CUDA-graph
    capture sizes it, so a capture allocates nothing. Calls on one device share
    it: two split-KV calls must not run concurrently on different streams.
    """
    key = (device.type, device.index)
    buf = _WORKSPACE.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(max(numel, 1 << 16), dtype=torch.float32, device=device)
        _WORKSPACE[key] = buf
    return buf


def _span(p: Problem) -> int:
    """Upper bound of the keys one query sees, plus chunk expansion."""
    extra = p.chunk_size - 1 if p.expand_to_chunk else 0
    return min(p.Lk, p.window_size + extra)


def choose_path(p: Problem, cfg: Config) -> str:
    """``"prefill"`` unless its grid would not fill the GPU: split-KV when
    query blocks x B x Hq is under the SM count and the key range per program
    is long enough to split. Decided by grid saturation, never by ``Lq`` alone."""
    programs = triton.cdiv(p.Lq, cfg.block_m) * p.B * p.Hq
    if programs >= sm_count(p.device):
        return "prefill"
    split_cfg = SPLIT[(dtype_class(p.dtype), head_bucket(p))]
    if _span(p) + min(p.Lq, cfg.block_m) <= 2 * split_cfg.block_n:
        return "prefill"  # nothing worth splitting
    return "splitkv"


def launch(p: Problem, q, k, v, o, lse, *, path: str | None = None, config: Config | None = None,
           num_splits: int | None = None) -> str:
    """Run one call; returns the path taken. ``path``/``config``/``num_splits``
    are private knobs for tests and tuning (``tools/gpu_triton.py``)."""
    upcast = interpreter_active()
    ieee = p.dtype == torch.float32
    cls, bucket = dtype_class(p.dtype), head_bucket(p)
    bdk, bdv = max(16, _pow2(p.Dqk)), max(16, _pow2(p.Dv))
    qk_scale = p.sm_scale * LOG2E
    pre_cfg = config if (config is not None and path != "splitkv") else PREFILL[(cls, bucket)]
    if path is None:
        path = choose_path(p, pre_cfg)
    common = dict(DK=p.Dqk, DV=p.Dv, BLOCK_DK=bdk, BLOCK_DV=bdv, MASK_LMK=p.mask_lmk,
                  EXPAND=p.expand_to_chunk, UPCAST=upcast, IEEE=ieee)
    if path == "prefill":
        cfg = pre_cfg
        grid = (triton.cdiv(p.Lq, cfg.block_m), p.B * p.Hq)
        kernels._swa_fwd_kernel[grid](
            q, k, v, o, lse,
            *q.stride(), *k.stride(), *v.stride(), *o.stride(),
            p.Hq, p.group, p.Lq, p.Lk, p.kv_start, p.window_size, p.chunk_size, qk_scale,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, **common)
        return path
    if path != "splitkv":
        raise ValueError(f"unknown path {path!r}")
    base = config if config is not None else SPLIT[(cls, bucket)]
    rows = p.group * p.Lq
    block_m = min(base.block_m, max(16, _pow2(rows)))
    block_n = base.block_n
    m_tiles = triton.cdiv(rows, block_m)
    grid_base = m_tiles * p.B * p.Hkv
    # Keys a tile can need: the window of its first query to its last query.
    q_per_tile = min(p.Lq, triton.cdiv(block_m, p.group) + 1)
    n_blocks = triton.cdiv(min(p.Lk, _span(p) + q_per_tile) + block_n, block_n)
    if num_splits is None:
        target = 2 * sm_count(p.device)
        num_splits = max(1, min(n_blocks, MAX_SPLITS, triton.cdiv(target, grid_base)))
    num_splits = max(1, min(num_splits, n_blocks))
    split_len = triton.cdiv(n_blocks, num_splits) * block_n
    num_splits = triton.cdiv(n_blocks * block_n, split_len)
    rows_total = p.B * p.Hq * p.Lq
    ws = workspace(p.device, num_splits * rows_total * (p.Dv + 1))
    op = ws[: num_splits * rows_total * p.Dv]
    lp = ws[num_splits * rows_total * p.Dv: num_splits * rows_total * (p.Dv + 1)]
    grid = (m_tiles, p.B * p.Hkv, num_splits)
    kernels._swa_splitkv_kernel[grid](
        q, k, v, op, lp,
        *q.stride(), *k.stride(), *v.stride(),
        p.Hq, p.Hkv, p.group, p.Lq, p.Lk, p.kv_start, p.window_size, p.chunk_size, qk_scale,
        split_len, rows_total,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=base.num_warps, num_stages=base.num_stages,
        **common)
    kernels._swa_combine_kernel[(triton.cdiv(rows_total, COMBINE_ROWS),)](
        op, lp, o, lse, rows_total, num_splits,
        DV=p.Dv, BLOCK_DV=bdv, BLOCK_S=max(2, _pow2(num_splits)), ROWS=COMBINE_ROWS,
        num_warps=COMBINE_WARPS)
    return path
