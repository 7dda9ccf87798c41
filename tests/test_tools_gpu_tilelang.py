"""tools/gpu_tilelang.py's precompile list, on CPU: every kernel it compiles up
front is the kernel ``tilelang_impl.launch.run_cuda`` asks for on the script's
timed shapes (chunk_size 64, default scale), so the GPU run finds them in the
cache instead of compiling at run time (the lists drifted apart once: a new
per-call knob made the precompiled keys stale)."""

from __future__ import annotations

import torch

from reference import check_inputs
from tilelang_impl import launch
from reference.validation import default_scale
from tools import gpu_tilelang


def _requested_key(monkeypatch, Dqk, Dv, dtype, lmk, exp, Lq, Lk, B=1, Hq=2, Hkv=1,
                   force_split=None):
    """The ``fwd_tc`` cache key run_cuda requests for one call (kernels replaced by a recorder;
    ``force_split`` as run_cuda's)."""
    keys = []
    monkeypatch.setattr(launch, "_kernel", lambda kind, *a: keys.append((kind, a)) or (lambda *x: None))
    q = torch.zeros(B, Hq, Lq, Dqk, dtype=dtype)
    k = torch.zeros(B, Hkv, Lk, Dqk, dtype=dtype)
    v = torch.zeros(B, Hkv, Lk, Dv, dtype=dtype)
    p = check_inputs(q, k, v, window_size=512, chunk_size=64, mask_lmk=lmk, expand_to_chunk=exp)
    o, lse = p.new_outputs()
    launch.run_cuda(p, q, k, v, False, False, o, lse, force_split=force_split)
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
    # the script's decode timed at split=1 (the prefill grid: one query block, short_config,
    # which at D = 128 differs from the long calls' config since session 45)
    key = _requested_key(monkeypatch, 128, 128, bf, True, True, 1, 8192, Hq=32, Hkv=32,
                         force_split=1)
    assert key[11] is False and key in pre, key
    key = _requested_key(monkeypatch, 64, 64, bf, True, True, 1, 8192, Hq=2, Hkv=2)  # decode D=64
    assert key[11] is False and key[7:11] == launch.tc_config(64, 64) and key in pre, key
    # prefill D=64 (session 42): launch.shipped_config's 64 x 64 tile, four CTAs per SM since
    # session 44 (three before)
    key = _requested_key(monkeypatch, 64, 64, bf, True, True, 4096, 4096, Hq=32, Hkv=32)
    assert key[7:11] == (64, 64, 2, 128) and key[12 + launch._KNOB["min_blocks"]] == 4, key
    # GQA decode D=64 (the timed B=8 GQA 32/4 shape): the prefill tile with G = 8 packed rows
    key = _requested_key(monkeypatch, 64, 64, bf, True, True, 1, 32768, B=8, Hq=32, Hkv=4)
    assert key[7:11] == launch.tc_config(64, 64) and key[12 + launch._KNOB["pack"]] == 8 and key in pre, key


def test_precompile_records_every_correctness_case_kernel(monkeypatch):
    """record_case_kernels runs the script's correctness cases with a stand-in for
    launch._kernel (no kernel, no reference): one request per case, including the
    cases' own chunk sizes (session 5's GPU run compiled those one by one inside
    the cases and ran out of time) and the D = 96 prefill-grid kernel at C = 16
    that once failed to compile."""
    import tilelang_impl

    def cpu_inputs(B, Hq, Hkv, Lq, Lk, Dqk, Dv, dtype, blhd=False, seed=0):
        def mk(H, L, D):  # the script's layouts: BLHD storage passed as a transposed view
            return (torch.zeros(B, L, H, D, dtype=dtype).transpose(1, 2) if blhd
                    else torch.zeros(B, H, L, D, dtype=dtype))
        return mk(Hq, Lq, Dqk), mk(Hkv, Lk, Dqk), mk(Hkv, Lk, Dv)

    def public(*a, **k):  # the public API on CPU would run the C kernel: not this script's GPU kernels
        raise gpu_tilelang._Recorded

    monkeypatch.setattr(gpu_tilelang, "_inputs", cpu_inputs)
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    monkeypatch.setattr(tilelang_impl, "sliding_window_attention", public)
    keys = gpu_tilelang.record_case_kernels()
    kinds = {k for k, _ in keys}
    assert kinds == {"fwd_tc", "fwd_fp32"}, kinds
    sl2 = default_scale(96) * launch.LOG2E
    d96_c16 = launch.tc_kernel_key(96, 96, "bfloat16", True, True, False, False,
                                   launch.shipped_config(96, 96), 16, sl2)
    assert d96_c16 in keys
    # split-KV is among the cases, with BLHD inputs and with each flag pair (fwd_tc
    # arguments: Dqk, Dv, dtype, mask_lmk, expand, q_blhd, kv_blhd, tile..., split)
    split = [a for k, a in keys if k == "fwd_tc" and a[11]]
    assert any(a[5] and a[6] for a in split)
    assert {(a[3], a[4]) for a in split} == {(True, True), (True, False), (False, True), (False, False)}
    assert not set(keys) <= {("fwd_tc", c) for c in gpu_tilelang.precompile_configs()}
    # the stand-in was put back
    assert launch._kernel is not None and launch._kernel.__name__ == "_kernel"
