"""Batches past a launch grid's y / z bound, at the real bound (GPU tier).

CUDA grids hold at most 65535 programs on y and z (``reference.device.GRID_YZ_MAX``).
Triton puts batch x heads on y (``B * Hq`` programs on its prefill grids, ``B * Hkv`` on the
split and packed ones), so a call whose ``B * Hq`` passes the bound runs as launches over
slices of the batch; TileLang puts the batch on z, so ``B`` past it does. The CPU tests reach
the slicing only with the bound lowered (``tests/test_triton_swa.py``,
``tests/test_tilelang_cpu.py``); here the bound is the hardware's, and a launch whose grid
passed it would fail to launch or leave rows unwritten (the outputs are poisoned: NaN).

One set of inputs per dtype (fresh random, the key slots no query sees NaN). Triton: the
default call and each of its paths (the TMA and the pointer prefill kernels, split-KV, the
GQA-packed split kernel); TileLang: its default plan (the packed tile in bf16, the fp32
kernel). Each call must pass the suite's verdict against the float64 reference and agree
with every other within the sum of their bounds.
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
DTYPES = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])


def _inputs(dtype, seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, device=DEVICE, generator=g).to(dtype)
               for H, L in ((HQ, LQ), (HKV, LK), (HKV, LK)))
    poison_unseen(k, v, LQ, RULE)  # NaN where SPEC lets a slot hold anything
    return q, k, v


def _triton_calls(dtype):
    """(name, call, describe, launches, plan prefix) of Triton's default call and each path."""
    import triton_impl

    def forced(path, **knobs):
        return (lambda q, k, v: triton_impl.sliding_window_attention(
                    q, k, v, _force_path=path, **{f"_{n}": x for n, x in knobs.items()}, **RULE),
                lambda q, k, v, **kw: triton_impl.describe_call(q, k, v, path=path, **knobs, **kw))

    out = [("triton", lambda q, k, v: triton_impl.sliding_window_attention(q, k, v, **RULE),
            triton_impl.describe_call, 3, "")]
    if dtype != torch.float32:  # the TMA kernel serves 16-bit inputs
        out.append(("triton-tma", *forced("prefill", tma="v_ptr"), 3, "prefill_tma "))
    out.append(("triton-pointer", *forced("prefill", tma=False), 3, "prefill "))
    for path in ("splitkv", "packed"):
        out.append((f"triton-{path}", *forced(path), 3, path + " "))
    return out


def _run(calls, q, k, v, exp):
    """Each call with its outputs poisoned, judged; then every pair compared."""
    got = {}
    for name, call, describe, launches, plan in calls:
        text = describe(q, k, v, **RULE)
        assert text.startswith(plan) and text.endswith(f"{launches} launches)"), f"{name}: {text}"
        with poisoned_empty():
            o, lse = call(q, k, v)
        vd = verdict.judge(o, lse, exp)
        assert vd.status == verdict.PASS, f"{name} ({text}): " + "; ".join(vd.problems)
        got[name] = (o, lse, vd)
    names = sorted(got)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pv = verdict.judge_pair(got[a][2], got[b][2], got[a][:2], got[b][:2], exp, a, b)
            assert pv.status == verdict.PASS, f"{a} vs {b}: " + "; ".join(pv.problems)
    return got


@DTYPES
def test_triton_batches_past_the_grid_bound_run_in_slices(dtype):
    q, k, v = _inputs(dtype, seed=7 if dtype == torch.bfloat16 else 8)
    calls = _triton_calls(dtype)
    got = _run(calls, q, k, v, verdict.expected(q, k, v, RULE))
    assert len(got) == len(calls) >= 4


@DTYPES
def test_tilelang_batches_past_the_grid_bound_run_in_slices(dtype):
    pytest.importorskip("tilelang", reason="tilelang is not installed")
    import tilelang_impl
    import triton_impl

    q, k, v = _inputs(dtype, seed=9 if dtype == torch.bfloat16 else 10)
    calls = [("tilelang", lambda q, k, v: tilelang_impl.sliding_window_attention(q, k, v, **RULE),
              tilelang_impl.describe_call, 2, "fwd_fp32 " if dtype == torch.float32 else "fwd_tc "),
             ("triton", lambda q, k, v: triton_impl.sliding_window_attention(q, k, v, **RULE),
              triton_impl.describe_call, 3, "")]
    assert len(_run(calls, q, k, v, verdict.expected(q, k, v, RULE))) == 2
