"""Every TileLang GPU kernel the conformance suite's GPU tier builds lowers for sm_90a,
on the CPU (tools/tl_lower.py): TIR through TileLang's passes to CUDA source, no nvcc.

TileLang builds a kernel on its first call, so a kernel its passes refuse (ThreadSync,
layout inference) used to show up only as a crashed case on the GPU machine: session
12's ``gqa_pack`` cases at 0e82bb5. Here each kernel of the full CUDA tier (the
launcher's own choices on a 132-SM H200, and the forced split-KV of the optional backend
tilelang-split, every case's layout, flags, head dims and chunk) is one test, fp16
kernels folded into their bf16 twins (``fold_dtypes``); about
5 minutes on 2 cores. nvcc and the SASS claims: tests/test_tilelang_compile.py.
"""

import pytest

pytest.importorskip("tilelang", reason="tilelang is not installed")

from tilelang_impl import launch  # noqa: E402
from tools import tl_lower  # noqa: E402

WANTED = tl_lower.fold_dtypes(tl_lower.tier_kernels("full"))


def _id(job) -> str:
    kind, a = job
    if kind == "fwd_tc":
        Dqk, Dv, _, lmk, exp, qb, kb, bm, bn, st, th, split = a[:12]
        knobs = [f"{name}={v}" if not isinstance(v, bool) else name
                 for (name, default), v in zip(launch.TC_KNOBS, a[12:]) if v != default]
        lay = ("blhd" if qb else "bhld") + ("" if qb == kb else "/kv" + ("blhd" if kb else "bhld"))
        return (f"tc-{Dqk}x{Dv}-lmk{int(lmk)}exp{int(exp)}-{lay}-{bm}x{bn}s{st}t{th}"
                + ("-split" if split else "") + "".join(f"-{k}" for k in knobs))
    return f"{kind}-" + "-".join(str(x) for x in a)


JOBS = list(WANTED)
IDS = [_id(j) for j in JOBS]
assert len(set(IDS)) == len(IDS), "two kernels with one test id"


def test_the_tier_reaches_every_kind_of_kernel():
    kinds = {k for k, _ in JOBS}
    assert kinds == {"fwd_tc", "fwd_fp32", "combine"}, kinds
    tc = [a for k, a in JOBS if k == "fwd_tc"]
    assert any(a[11] for a in tc) and any(not a[11] for a in tc)  # split-KV and prefill grid
    pack = launch._KNOBS_AT + launch._KNOB["pack"]
    assert {a[pack] for a in tc if len(a) > pack} >= {2, 3, 4, 8}  # GQA-packed, every G
    assert any(a[5] or a[6] for a in tc)  # BLHD views


@pytest.mark.parametrize("job", JOBS, ids=IDS)
def test_gpu_tier_kernel_lowers(job):
    err = tl_lower.lower_one(job)
    assert err is None, f"{_id(job)} (cases: {', '.join(WANTED[job][:3])}): {err}"


def test_the_check_catches_a_kernel_that_does_not_lower(monkeypatch):
    """With launch.pack_lowers' exclusion undone, the gqa_pack cases ask for the packed
    G = 2 kernel TileLang 0.1.15 refuses, and this check names it (what the GPU tier
    found at 0e82bb5 as four crashed cases)."""
    every = launch.pack_lowers
    monkeypatch.setattr(launch, "pack_lowers", lambda G, *a: G & (G - 1) == 0 or G <= 8)
    wanted = tl_lower.tier_kernels("full", categories=["gqa_pack"])
    monkeypatch.setattr(launch, "pack_lowers", every)
    pack = launch._KNOBS_AT + launch._KNOB["pack"]
    bad = [j for j in wanted if j[0] == "fwd_tc" and len(j[1]) > pack and j[1][pack] == 2
           and not (j[1][3] or j[1][4]) and j[1][0] != j[1][1]]
    assert bad, "the gqa_pack cases no longer reach the packed G = 2 kernel without flags"
    assert not set(tl_lower.fold_dtypes({j: [] for j in bad})) & set(WANTED)  # nor does the launcher
    assert "ThreadSync" in (tl_lower.lower_one(bad[0]) or "")
