"""Both backends on tensors of a CUDA device that is not the current one (GPU tier, two GPUs).

Triton compiles, loads and launches on the current device, and TileLang's launches
take the current device's stream: a call whose tensors sit on ``cuda:1`` while
``cuda:0`` is current must still run on ``cuda:1`` (its context, its current stream)
and give the bits of the same call made with ``cuda:1`` current, leaving the current
device as it was. Calls alternate between the devices, so a compiled kernel kept for
one device and launched on the other (``triton_impl.launch._Kernel``'s caches are per
device) would fail its direct launch and be recorded in ``launch.FAST_PATH_OFF`` (the
call itself falls back to Triton's JIT with the right bits). Needs two GPUs in one
process: run without xdist's one-GPU pinning (``pytest -m gpu
tests/test_multi_device_gpu.py``).
"""

from __future__ import annotations

import importlib

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs two CUDA devices")]

KW = dict(window_size=512, chunk_size=64)


def _bits(out):
    o, lse = out
    return o.view(torch.int16).cpu(), lse.view(torch.int32).cpu()


@pytest.mark.parametrize("lq", [1, 1024, 8192], ids=["decode", "prefill", "prefill-8k"])
@pytest.mark.parametrize("backend", ["triton", "tilelang"])
def test_tensors_on_a_device_that_is_not_current(backend, lq):
    if backend == "tilelang":
        pytest.importorskip("tilelang")
    swa = importlib.import_module(f"{backend}_impl").sliding_window_attention
    g = torch.Generator().manual_seed(lq)
    q, k, v = (torch.randn(1, 8, L, 128, generator=g).to(torch.bfloat16) for L in (lq, lq + 7, lq + 7))
    torch.cuda.set_device(0)
    want = None
    for step in range(2):  # alternate devices twice: per-device caches, both directions
        for dev in ("cuda:0", "cuda:1"):
            t = [x.to(dev) for x in (q, k, v)]
            out = swa(*t, **KW)
            assert torch.cuda.current_device() == 0, "the call changed the current device"
            assert out[0].device == t[0].device and out[1].device == t[0].device
            torch.cuda.synchronize(dev)
            got = _bits(out)
            with torch.cuda.device(dev):  # the same call with its device current
                same = _bits(swa(*t, **KW))
            assert torch.equal(got[0], same[0]) and torch.equal(got[1], same[1]), (dev, step)
            if want is None:
                want = got
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (dev, step)
    if backend == "triton":  # a kernel of the wrong device would fail its direct launch, then
        # fall back to the JIT with the right bits: only the record of fallbacks shows it
        from triton_impl import launch
        assert not launch.FAST_PATH_OFF, launch.FAST_PATH_OFF
