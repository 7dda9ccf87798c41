"""tools/gpu_tilelang.py's precompile list, on CPU: every kernel it compiles up
front is the kernel ``tilelang_impl.launch.run_cuda`` asks for on the script's
timed shapes (chunk_size 64, default scale), so the GPU run finds them in the
cache instead of compiling at run time (the lists drifted apart once: a new
per-call knob made the precompiled keys stale)."""

from __future__ import annotations

import torch

from reference import check_inputs
from tilelang_impl import launch
from tools import gpu_tilelang


def _requested_key(monkeypatch, Dqk, Dv, dtype, lmk, exp, Lq, Lk, B=1, Hq=2, Hkv=1):
    """The ``fwd_tc`` cache key run_cuda requests for one call (kernels replaced by a recorder)."""
    keys = []
    monkeypatch.setattr(launch, "_kernel", lambda kind, *a: keys.append((kind, a)) or (lambda *x: None))
    q = torch.zeros(B, Hq, Lq, Dqk, dtype=dtype)
    k = torch.zeros(B, Hkv, Lk, Dqk, dtype=dtype)
    v = torch.zeros(B, Hkv, Lk, Dv, dtype=dtype)
    p = check_inputs(q, k, v, window_size=512, chunk_size=64, mask_lmk=lmk, expand_to_chunk=exp)
    o, lse = p.new_outputs()
    launch.run_cuda(p, q, k, v, False, False, o, lse)
    return next(a for kind, a in keys if kind == "fwd_tc")


def test_precompiled_kernels_are_the_ones_run_cuda_requests(monkeypatch):
    pre = set(gpu_tilelang.precompile_configs())
    bf, fp = torch.bfloat16, torch.float16
    cases = [(64, 64, bf, True, True), (96, 96, bf, True, True), (128, 128, bf, True, True),
             (128, 64, bf, True, True), (64, 128, bf, True, True), (128, 128, fp, True, True),
             (128, 128, bf, False, True), (128, 128, bf, True, False), (128, 128, bf, False, False),
             (64, 64, bf, False, True)]
    for Dqk, Dv, dt, lmk, exp in cases:  # prefill grids: 4096 rows x 32 heads fill the SMs
        key = _requested_key(monkeypatch, Dqk, Dv, dt, lmk, exp, 4096, 4096, Hq=32, Hkv=32)
        assert key in pre, (Dqk, Dv, dt, lmk, exp, key)
    for D, lmk in ((128, True), (96, True), (128, False)):  # decode: split-KV
        key = _requested_key(monkeypatch, D, D, bf, lmk, True, 1, 8192)
        assert key[11] is True and key in pre, (D, lmk, key)
