"""Batches past a launch grid's y / z bound, at the real bound (GPU tier).

CUDA grids hold at most 65535 programs on y and z (``reference.device.GRID_YZ_MAX``).
Triton puts batch x heads on y, so ``B * Hq`` past the bound runs as launches over slices of
the batch; TileLang puts the batch on z, so ``B`` past it does. The CPU tests reach the
slicing only with the bound lowered (``tests/test_triton_swa.py``,
``tests/test_tilelang_cpu.py``); here the bound is the hardware's, and a launch whose grid
passed it would fail to launch or leave rows unwritten (the outputs are poisoned: NaN).

One set of inputs (fresh random, bf16 and fp32, the key slots no query sees NaN) serves
every backend and path: each call must pass the suite's verdict against the float64
reference, and every pair of them must agree within the sum of their bounds.
"""

from __future__ import annotations

import pytest
import torch

from conformance import verdict
from conformance.cases import poison_unseen
from conformance.runner import poisoned_empty
from reference.device import GRID_YZ_MAX

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.usefixtures("gpu_memory_lock")]  # float64 truth of 65600 batches

B = GRID_YZ_MAX + 65  # TileLang: 2 launches (z); Triton: B * Hq = 131200, 3 launches (y)
HQ, HKV, LQ, LK, D = 2, 1, 3, 96, 64
RULE = dict(window_size=40, chunk_size=16, kv_start=5)
DEVICE = "cuda"


def _inputs(dtype, seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, device=DEVICE, generator=g).to(dtype)
               for H, L in ((HQ, LQ), (HKV, LK), (HKV, LK)))
    poison_unseen(k, v, LQ, RULE)  # NaN where SPEC lets a slot hold anything
    return q, k, v


def _calls():
    """(name, call, describe, slices): every backend path that serves these calls."""
    import triton_impl
    out = [("triton", lambda q, k, v: triton_impl.sliding_window_attention(q, k, v, **RULE),
            triton_impl.describe_call, 3)]
    for path in ("prefill", "splitkv", "packed"):
        out.append((f"triton-{path}",
                    lambda q, k, v, path=path: triton_impl.sliding_window_attention(
                        q, k, v, _force_path=path, **RULE),
                    lambda q, k, v, path=path, **kw: triton_impl.describe_call(
                        q, k, v, path=path, **kw), 3))
    try:
        import tilelang_impl
    except ImportError:  # the suite's TileLang tests skip the same way
        return out
    out.append(("tilelang", lambda q, k, v: tilelang_impl.sliding_window_attention(q, k, v, **RULE),
                tilelang_impl.describe_call, 2))
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_batches_past_the_grid_bound_run_in_slices(dtype):
    q, k, v = _inputs(dtype, seed=7 if dtype == torch.bfloat16 else 8)
    exp = verdict.expected(q, k, v, RULE)
    got = {}
    for name, call, describe, slices in _calls():
        text = describe(q, k, v, **RULE)
        assert text.endswith(f"{slices} launches)"), f"{name}: {text}"
        with poisoned_empty():
            o, lse = call(q, k, v)
        vd = verdict.judge(o, lse, exp)
        assert vd.status == verdict.PASS, f"{name} ({text}): " + "; ".join(vd.problems)
        got[name] = (o, lse, vd)
    assert "triton" in got and len(got) >= 3
    names = sorted(got)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pv = verdict.judge_pair(got[a][2], got[b][2], got[a][:2], got[b][:2], exp, a, b)
            assert pv.status == verdict.PASS, f"{a} vs {b}: " + "; ".join(pv.problems)
