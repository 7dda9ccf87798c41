"""TileLang's kernels built ``wide`` on the GPU (session 31: ``launch.wide_positions``, knob
``wide`` of ``kernels.fwd_tc`` / ``fwd_fp32``, ``macros.is_landmark``'s two float quotients).

A cache of ``2**26 + 1003`` keys puts the kernel frame's positions past ``2**25``, where the
single float quotient the other kernels take names wrong keys as landmarks for small chunks
(``tests/test_tilelang_cpu.py`` shows it on the macro; at these positions C = 3 is such a
chunk, C = 7 not yet: the H200 run at 9eae254 passed a C = 7 call on both kernels). Only the last ``TAIL`` keys are
written (every key a call here can see lies among them; the rest of the cache is whatever
the allocator left, which no query sees): the reference runs on that tail with ``kv_start``
moved by as much, the same visibility. Each call, with the outputs poisoned, must pass the
suite's verdict on the split-KV kernel (decode), the prefill grid and the fp32 kernel; the
same call on the kernel without ``wide`` must not (which shows the call exercises the
knob).
"""

from __future__ import annotations

import pytest
import torch

from conformance import verdict
from conformance.cases import seen_tail
from conformance.runner import poisoned_empty

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.usefixtures("gpu_memory_lock")]  # 32 GB a test (conformance/gpu_lock.py)
pytest.importorskip("tilelang", reason="tilelang is not installed")

from reference import check_inputs  # noqa: E402
from tilelang_impl import describe_call, launch, sliding_window_attention as swa  # noqa: E402

LK = (1 << 26) + 1003
TAIL = 4096

# (dtype, Hq, Hkv, Lq, D, rule, the path describe_call names)
CASES = [
    (torch.bfloat16, 4, 1, 1, 128, dict(window_size=512, chunk_size=3, kv_start=1), "S="),
    (torch.bfloat16, 4, 1, 1, 128, dict(window_size=700, chunk_size=3, kv_start=10**6 + 3,
                                        expand_to_chunk=False), "S="),
    (torch.bfloat16, 32, 1, 256, 64, dict(window_size=512, chunk_size=3, kv_start=2), "fwd_tc"),
    (torch.float32, 4, 1, 40, 32, dict(window_size=512, chunk_size=3, kv_start=1), "fwd_fp32"),
]


def _ids(c):
    dt, Hq, Hkv, Lq, D, kw, _ = c
    return f"{str(dt)[6:]}-{Hq}/{Hkv}-Lq{Lq}-D{D}-C{kw['chunk_size']}"


def _inputs(dt, Hq, Hkv, Lq, D, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.empty(1, Hkv, LK, D, device="cuda", dtype=dt)
    v = torch.empty(1, Hkv, LK, D, device="cuda", dtype=dt)
    k[:, :, -TAIL:] = torch.randn(1, Hkv, TAIL, D, device="cuda", generator=g).to(dt)
    v[:, :, -TAIL:] = torch.randn(1, Hkv, TAIL, D, device="cuda", generator=g).to(dt)
    q = (torch.randn(1, Hq, Lq, D, device="cuda", generator=g) * 0.3).to(dt)
    return q, k, v


def _call(q, k, v, kw):
    """The public call with every output it allocates poisoned (NaN)."""
    with poisoned_empty():
        return swa(q, k, v, **kw)


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_wide_kernels_serve_positions_past_the_single_quotient(case, monkeypatch):
    dt, Hq, Hkv, Lq, D, kw, path = case
    q, k, v = _inputs(dt, Hq, Hkv, Lq, D, seed=Lq + D)
    p = check_inputs(q, k, v, **kw)
    assert launch.wide_positions(p, launch.frame(p)[2])
    text = describe_call(q, k, v, **kw)
    assert path in text and "wide" in text, text
    kt, vt, tail = seen_tail(k, v, Lq, kw, TAIL)  # every key some query sees lies in the tail
    o, lse = _call(q, k, v, kw)
    verdict.assert_pass(o, lse, q, kt, vt, tail)
    # the kernel without the knob, on the same call: wrong (so this call tests the knob)
    monkeypatch.setattr(launch, "wide_positions", lambda p, C: False)
    launch.clear_plans()
    o1, lse1 = _call(q, k, v, kw)
    launch.clear_plans()
    assert verdict.judge(o1, lse1, verdict.expected(q, kt, vt, tail)).status == verdict.FAIL
