"""GPU check and timing of the Triton backend, in one device call.

    PYTHONUNBUFFERED=1 python tools/gpu_triton.py --out $OUT [--budget-s 240]

1. Correctness (fresh random inputs, outputs poisoned with NaN before the
   kernel): every case against ``reference.golden`` (float64 on the GPU),
   tolerance ``max err <= 2 * (same-dtype reference error) + floor``, both
   paths (prefill and split-KV), bf16 / fp16 / fp32, head dims 64..256,
   BLHD-stored inputs passed as ``x.transpose(1, 2)``, NaN in slots no query
   sees, GQA, Lq < Lk, large kv_start.
2. Timing of the issue's shapes and of config variants: kernel-only time from
   CUDA-graph replay (several input sets rotated so the window does not sit in
   L2), eager end-to-end time of the public function, wrapper overhead = eager
   - kernel. TFLOP/s over visible (q, k) pairs, ``4 * D * pairs * B * Hq``, the
   pairs counted in closed form (``reference.mask.visible_counts``).

Writes ``triton_gpu.json`` under ``--out`` (incrementally) and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import reference  # noqa: E402
from conformance import verdict  # noqa: E402
from conformance.cases import poison_unseen  # noqa: E402
from tools._common import attention_flops, capture_graph  # noqa: E402
from triton_impl import launch as L  # noqa: E402
from triton_impl import sliding_window_attention as swa  # noqa: E402

T0 = time.time()
DEV = "cuda"
PROFILES: dict = {}


def make(B, Hq, Hkv, Lq, Lk, Dqk, Dv, dtype, blhd=False, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)

    def r(b, h, l, d):
        if blhd:
            return torch.randn(b, l, h, d, device=DEV, dtype=dtype, generator=g).transpose(1, 2)
        return torch.randn(b, h, l, d, device=DEV, dtype=dtype, generator=g)

    return r(B, Hq, Lq, Dqk), r(B, Hkv, Lk, Dqk), r(B, Hkv, Lk, Dv)


def check_case(c, results):
    B, Hq, Hkv, Lq, Lk, Dqk, Dv, dtype = (c[k] for k in ("B", "Hq", "Hkv", "Lq", "Lk", "Dqk", "Dv", "dtype"))
    kw = dict(window_size=c["W"], chunk_size=c["C"], mask_lmk=c.get("mask_lmk", True),
              expand_to_chunk=c.get("expand", True), kv_start=c.get("kv_start", 0),
              sm_scale=c.get("sm_scale"))
    q, k, v = make(B, Hq, Hkv, Lq, Lk, Dqk, Dv, dtype, c.get("blhd", False), seed=c.get("seed", 0))
    if c.get("nan_invisible"):
        poison_unseen(k, v, Lq, kw)
    p = reference.check_inputs(q, k, v, **kw)
    o, lse = p.new_outputs(poison=True)
    knobs = dict(path=c.get("path"), phases=c.get("phases"), tma=c.get("tma"), config=c.get("config"),
                 num_splits=c.get("num_splits"), fold=c.get("fold"), pdl=c.get("pdl"))
    path = L.launch(p, q, k, v, o, lse, **knobs)
    # second call: the cached compiled kernel launched directly (host fast path)
    o2, lse2 = p.new_outputs(poison=True)
    L.launch(p, q, k, v, o2, lse2, **knobs)
    same = bool(torch.equal(o2.view(torch.uint8) if o2.dtype != torch.float32 else o2.view(torch.int32),
                            o.view(torch.uint8) if o.dtype != torch.float32 else o.view(torch.int32))
                and torch.equal(lse2.view(torch.int32), lse.view(torch.int32)))
    if DEV == "cuda":
        torch.cuda.synchronize()
    # The suite's tolerance policy (conformance.verdict): max and mean error
    # against float64 golden within 2x the same-dtype reference's + a floor,
    # empty rows / NaN / infinities exact.
    exp = verdict.expected(q, k, v, kw)
    vd = verdict.judge(o, lse, exp)
    ok = vd.status == verdict.PASS and same
    d = vd.details
    err_o, tol_o = d.get("o_max_err", math.nan), d.get("o_bound", math.nan)
    err_l, tol_l = d.get("lse_max_err", math.nan), d.get("lse_bound", math.nan)
    row = dict(case={k_: (str(v_) if k_ in ("dtype", "config") else v_) for k_, v_ in c.items()}, path=path,
               ok=ok, ratio=vd.ratio, problems=vd.problems[:4], err_o=err_o, tol_o=tol_o, err_lse=err_l,
               tol_lse=tol_l, repeat_bitwise_equal=same)
    results.append(row)
    print(f"{'ok ' if ok else 'BAD'} {path:8s} {str(dtype)[6:]:8s} B{B} H{Hq}/{Hkv} Lq{Lq} Lk{Lk} "
          f"D{Dqk}/{Dv} W{kw['window_size']} C{kw['chunk_size']} lmk{int(kw['mask_lmk'])} "
          f"exp{int(kw['expand_to_chunk'])} ks{kw['kv_start']} blhd{int(c.get('blhd', False))} "
          f"ph{c.get('phases')} tma{c.get('tma')} ns{c.get('num_splits')} cfg{c.get('config')} "
          f"o {err_o:.2e}/{tol_o:.2e} lse {err_l:.2e}/{tol_l:.2e} rep{int(same)} {vd.problems[:2]}", flush=True)
    return ok


def correctness_cases():
    cases = []
    bf, fp, f32 = torch.bfloat16, torch.float16, torch.float32
    base = dict(B=2, Hq=4, Hkv=2, Lq=600, Lk=700, W=200, C=64, nan_invisible=True)
    for dt in (bf, fp, f32):
        for D in (64, 96, 128, 192, 256):
            cases.append(dict(base, Dqk=D, Dv=D, dtype=dt, path="prefill", kv_start=3 if D == 96 else 0,
                              phases=(D % 64 == 0)))
        for D in (64, 128):
            cases.append(dict(base, Dqk=D, Dv=D, dtype=dt, path="splitkv", Lq=3, Lk=1500, Hq=8, Hkv=2,
                              kv_start=10 ** 6 + 3))
        cases.append(dict(base, Dqk=64, Dv=64, dtype=dt, path="packed", Hq=8, Hkv=2))
    cases += [
        dict(base, Dqk=192, Dv=192, dtype=bf, path="packed", Hq=8, Hkv=1),
        dict(base, Dqk=128, Dv=128, dtype=fp, path="prefill", phases=False),
        dict(B=1, Hq=8, Hkv=1, Lq=1, Lk=5000, Dqk=128, Dv=128, W=512, C=64, dtype=bf, path=None),  # MQA decode
        dict(B=2, Hq=6, Hkv=2, Lq=333, Lk=1000, Dqk=128, Dv=64, W=100, C=16, dtype=bf, blhd=True),
        dict(B=2, Hq=6, Hkv=2, Lq=333, Lk=1000, Dqk=128, Dv=64, W=100, C=16, dtype=bf, blhd=True,
             path="splitkv"),
        dict(B=2, Hq=8, Hkv=2, Lq=333, Lk=1000, Dqk=128, Dv=64, W=100, C=16, dtype=bf, blhd=True,
             path="packed"),
        dict(B=1, Hq=4, Hkv=4, Lq=512, Lk=512, Dqk=128, Dv=128, W=37, C=1, dtype=fp),  # C=1: all rows empty
        dict(B=1, Hq=4, Hkv=2, Lq=900, Lk=900, Dqk=64, Dv=64, W=300, C=50, dtype=bf, mask_lmk=False,
             expand=False, sm_scale=-0.3, phases=False),
        dict(B=1, Hq=4, Hkv=2, Lq=900, Lk=900, Dqk=64, Dv=64, W=300, C=50, dtype=bf, mask_lmk=True,
             expand=False, blhd=True),
        dict(B=1, Hq=32, Hkv=4, Lq=1, Lk=32768, Dqk=64, Dv=64, W=512, C=64, dtype=bf),  # auto: split
        dict(B=1, Hq=8, Hkv=8, Lq=512, Lk=4096, Dqk=128, Dv=128, W=512, C=64, dtype=bf, blhd=True),
    ]
    return cases


def graph_time(fn, inputs, reps=10):
    """Kernel-only microseconds per call: a CUDA graph of ``reps`` rounds over the
    input sets ``inputs`` (rotated so one window does not sit in L2), captured after
    warm-up calls on a side stream, median of 7 replays."""
    for x in inputs:
        fn(*x)
    torch.cuda.synchronize()

    def one_round():
        for x in inputs:
            fn(*x)

    def rounds():
        for _ in range(reps):
            one_round()
    graph, _ = capture_graph(rounds, warmup=one_round)
    graph.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(7):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / (reps * len(inputs)))
    del graph
    return sorted(ts)[len(ts) // 2]


def host_time(fn, args, n=50):
    """Host microseconds per call of an already warm ``fn`` (the GPU not waited for
    inside the loop)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*args)
    dt = (time.perf_counter() - t0) * 1e6 / n
    torch.cuda.synchronize()
    return dt


def time_shape(s, variants, results, sets=3, reps=10):
    """Kernel-only (graph replay) and eager times of one shape per variant."""
    B, Hq, Hkv, Lq, Lk, D, W, C = (s[k] for k in ("B", "Hq", "Hkv", "Lq", "Lk", "D", "W", "C"))
    dtype = torch.bfloat16
    kw = dict(window_size=W, chunk_size=C, mask_lmk=s.get("mask_lmk", True))
    inputs = [make(B, Hq, Hkv, Lq, Lk, D, D, dtype, s.get("blhd", False), seed=100 + i) for i in range(sets)]
    flops = attention_flops(B, Hq, Lq, Lk, D, window_size=W, chunk_size=C)
    out = []
    for name, knobs in variants:
        if time.time() - T0 > ARGS.budget_s:
            print(f"  (budget reached, skipping {s['name']} {name})", flush=True)
            break
        knobs = dict(knobs)
        fast = knobs.pop("fast", True)
        L._Kernel.enabled = fast
        try:
            fn = lambda q, k, v: swa(q, k, v, **kw, **knobs)  # noqa: E731
            kern_us = graph_time(fn, inputs, reps)
            # eager end-to-end
            es = []
            for _ in range(5):
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(reps):
                    for q, k, v in inputs:
                        fn(q, k, v)
                e1.record()
                e1.synchronize()
                es.append(e0.elapsed_time(e1) * 1e3 / (reps * sets))
            eager_us = sorted(es)[len(es) // 2]
            host_us = host_time(fn, inputs[0])  # the wrapper: host cost of one call
            if s.get("profile") and name == "table":
                import cProfile
                import io
                import pstats
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(200):
                    fn(*inputs[0])
                pr.disable()
                torch.cuda.synchronize()
                buf = io.StringIO()
                pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(14)
                PROFILES[s["name"]] = buf.getvalue()
                print(buf.getvalue(), flush=True)
            p = reference.check_inputs(*inputs[0], **kw)
            o_, l_ = p.new_outputs()
            path = L.launch(p, *inputs[0], o_, l_, path=knobs.get("_force_path"), config=knobs.get("_config"),
                            num_splits=knobs.get("_num_splits"), phases=knobs.get("_phases"),
                            tma=knobs.get("_tma"), fold=knobs.get("_fold"), pdl=knobs.get("_pdl"))
            row = dict(shape=s["name"], variant=name, path=path, kernel_us=kern_us, eager_us=eager_us,
                       wrapper_us=eager_us - kern_us, host_us=host_us,
                       tflops=flops / (kern_us * 1e-6) / 1e12, flops=flops)
            if s.get("flushed"):  # the bench's timer: one graph replay per event pair, L2 flushed before
                row["flushed_us"] = flushed_time(fn, inputs)
        except Exception as e:  # a variant that fails to compile or launch is reported, not fatal
            row = dict(shape=s["name"], variant=name, error=f"{type(e).__name__}: {e}"[:400])
            traceback.print_exc()
        finally:
            L._Kernel.enabled = True
        out.append(row)
        results.append(row)
        if "error" in row:
            print(f"  {s['name']:22s} {name:26s} ERROR {row['error'][:120]}", flush=True)
        else:
            fl = f"  flushed {row['flushed_us']:6.1f} us" if "flushed_us" in row else ""
            print(f"  {s['name']:22s} {name:26s} {row['path']:8s} kern {kern_us:8.1f} us  eager "
                  f"{eager_us:8.1f} us  host {host_us:6.1f} us  {row['tflops']:6.1f} TFLOP/s{fl}", flush=True)
    del inputs
    torch.cuda.empty_cache()
    return out


def flushed_time(fn, inputs, reps=20):
    """Microseconds per call by ``tools.bench``'s kernel timer (a CUDA graph per
    input set, one replay between two events, a 256 MiB memset before each)."""
    from tools.bench import Timer
    ms, why = Timer(DEV, reps).graph(fn, inputs)
    return float("nan") if ms is None else ms * 1e3


@triton.jit
def _floor_kernel(X, TRIGGER: tl.constexpr, WAIT: tl.constexpr):
    """An empty program (one store from program 0): the launch floor of a timer."""
    if WAIT:
        gdc_wait()
    if TRIGGER:
        gdc_launch_dependents()
    if tl.program_id(0) == 0:
        tl.store(X, 1.0)


def floor_times(res):
    """What the timers measure for nothing: one empty kernel of 256 programs,
    two in series, and two with the second a programmatic dependent launch
    (the first triggers at its start), each by the lab's back-to-back graph
    replay (``graph_time``) and by the bench's flushed single replay
    (``flushed_time``)."""
    x = torch.zeros(4, device=DEV)

    def one(_x):
        _floor_kernel[(256,)](_x, TRIGGER=False, WAIT=False, num_warps=4)

    def two(_x):
        _floor_kernel[(256,)](_x, TRIGGER=False, WAIT=False, num_warps=4)
        _floor_kernel[(256,)](_x, TRIGGER=False, WAIT=False, num_warps=4)

    def two_pdl(_x):
        _floor_kernel[(256,)](_x, TRIGGER=True, WAIT=False, num_warps=4)
        _floor_kernel[(256,)](_x, TRIGGER=False, WAIT=True, num_warps=4, launch_pdl=True)

    out = {}
    for name, fn in (("1 kernel", one), ("2 kernels", two), ("2 kernels, 2nd PDL", two_pdl)):
        try:
            out[name] = dict(graph_us=graph_time(fn, [(x,)] * 3), flushed_us=flushed_time(fn, [(x,)]))
        except Exception as e:
            out[name] = dict(error=f"{type(e).__name__}: {e}"[:300])
        print(f"  floor {name:20s} {out[name]}", flush=True)
    res["floor"] = out


def pre(bm, bn, w, st, phases, path="prefill"):
    c = L.Config(bm, bn, w, st)
    tag = {"prefill": "3ph" if phases else "1lp", "packed": "pack"}[path]
    return (f"{tag} {bm}x{bn} w{w} s{st}", dict(_force_path=path, _config=c, _phases=phases))


def host_breakdown(res):
    """Host time of one eager call, part by part (no profiler: perf_counter over
    many calls, the device idle), for a prefill and a decode shape."""
    from reference.validation import check_inputs
    out = {}
    for name, (B, Hq, Hkv, Lq, Lk, D) in {"decode B1 8K": (1, 32, 32, 1, 8192, 128),
                                          "chunk 512/8K": (1, 32, 32, 512, 8192, 128),
                                          "mha 8K (tma)": (1, 32, 32, 8192, 8192, 128)}.items():
        q, k, v = make(B, Hq, Hkv, Lq, Lk, D, D, torch.bfloat16)
        kw = dict(window_size=512, chunk_size=64)
        p = check_inputs(q, k, v, **kw)
        o, lse = p.new_outputs()
        swa(q, k, v, **kw)
        torch.cuda.synchronize()
        n = 300 if Lq < 8192 else 30

        def per(fn):
            return round(host_time(fn, (), n), 2)

        row = dict(check_inputs=per(lambda: check_inputs(q, k, v, **kw)),
                   new_outputs=per(lambda: p.new_outputs()),
                   launch=per(lambda: L.launch(p, q, k, v, o, lse)),
                   public_call=per(lambda: swa(q, k, v, **kw)),
                   torch_empty_x2=per(lambda: (torch.empty(8, device="cuda"), torch.empty(8, device="cuda"))),
                   sdpa_tiny=per(lambda: torch.nn.functional.scaled_dot_product_attention(q[:, :, :1], k[:, :, :64], v[:, :, :64])))
        # pieces of one direct launch of the cached compiled kernel (launch._direct_launch)
        kern = L._SPLIT if Lq == 1 else (L._FWD_TMA if Lq >= 8192 else L._FWD)
        if kern.cache:
            ck = next(iter(kern.cache.values()))[0]  # (compiled kernel, _RawLaunch)
            drv = triton.runtime.driver.active
            row["drv_active"] = per(lambda: triton.runtime.driver.active)
            row["get_stream"] = per(lambda: drv.get_current_stream(drv.get_current_device()))
            row["torch_stream"] = per(lambda: torch.cuda.current_stream().cuda_stream)
            knobs = triton.knobs
            row["knob_hooks"] = per(lambda: (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))
            row["launch_metadata"] = per(lambda: ck.launch_metadata((1, 1, 1), 0))
            row["data_ptr_x5"] = per(lambda: (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr()))
            row["strides_x4"] = per(lambda: (q.stride(), k.stride(), v.stride(), o.stride()))
        out[name] = row
        print(f"  host {name:14s} " + " ".join(f"{k_}={v_}" for k_, v_ in row.items()), flush=True)
    res["host_breakdown"] = out


# The long-prefill shapes the TMA tile labs time (L2 not flushed).
TILE_SHAPES = {
    "mha D128 L8K": dict(B=1, Hq=32, Hkv=32, Lq=8192, Lk=8192, D=128, W=512, C=64),
    "mha D128 L16K": dict(B=1, Hq=32, Hkv=32, Lq=16384, Lk=16384, D=128, W=512, C=64),
    "gqa32/4 D64 L8K": dict(B=1, Hq=32, Hkv=4, Lq=8192, Lk=8192, D=64, W=512, C=64),
    "gqa16/2 D64 L8K": dict(B=1, Hq=16, Hkv=2, Lq=8192, Lk=8192, D=64, W=512, C=64),
    "batch4x4K D64": dict(B=4, Hq=32, Hkv=4, Lq=4096, Lk=4096, D=64, W=512, C=64),
}


def _tile_lab(d128, d64, dtype64, shapes, phases=None):
    """``(cases, plan)`` of a TMA tile sweep (labs 3 and 8): every config checked on a
    case of its own (bf16 at D=128, ``dtype64`` at D=64), then timed against the
    table on ``shapes`` (names of :data:`TILE_SHAPES`: D=128 configs on the D=128
    shapes, D=64 configs on the others)."""
    pbase = dict(B=2, Hq=4, Hkv=2, Lq=600, Lk=700, W=200, C=64, nan_invisible=True, kv_start=5,
                 path="prefill", tma="v_ptr", phases=phases)
    cases = ([dict(pbase, Dqk=128, Dv=128, dtype=torch.bfloat16, config=c) for c in d128]
             + [dict(pbase, Dqk=64, Dv=64, dtype=dtype64, config=c) for c in d64])

    def name(c):
        return f"{c.block_m}x{c.block_n} w{c.num_warps} s{c.num_stages}" + (f" r{c.maxnreg}" if c.maxnreg else "")
    variants = {D: [("table", {})] + [(name(c), dict(_tma="v_ptr", _config=c)) for c in cfgs]
                for D, cfgs in ((128, d128), (64, d64))}
    return cases, [(dict(TILE_SHAPES[n], name=n), variants[TILE_SHAPES[n]["D"]]) for n in shapes]


def lab():
    """Session 8: the split-KV combine as a programmatic dependent launch
    (``launch.SPLIT_PDL``) against the serial launch, on the decode shapes,
    timed back to back (``graph_time``) and with the bench's flushed timer;
    and the timers' floor (``floor_times``); ``--lab 2`` the split count and key
    block, ``--lab 3`` register caps on the TMA prefill tile (results:
    ``bench_results/triton-lab8-76fd3c9.json``, ``-lab9-ab58094``, ``-lab10-4f1c99a``),
    ``--lab 4`` 64-key split blocks for GQA decode (run in session 9 at 92218e9,
    ``triton-lab11-92218e9.json``: no gain), ``--lab 5`` the Gluon prefill kernel
    (``triton-lab12*-gluon-wip.json``: slower). Session 9's lab 6 (warp-specialised
    Gluon kernels, ``triton-lab13*-gluon-ws.json``) lives in commit 2935924 with
    its kernels, removed from the tree after it (slower; one run hung); session 17's lab 11
    (q as the QK^T product's register operand, ``triton-lab18-2c4794a.json``: no gain) lives
    in commit 2c4794a with its knob. Each variant is first checked on
    cases of its own (NaN in unseen slots, kv_start, GQA, outputs poisoned).
    Earlier sweeps: session 5's (chunked D=128 tiles, D=64 pointer tile, a
    fused combine) ran at b0a8deb, ``bench_results/triton-lab7-b0a8deb.json``;
    session 5's sweep 2 at 1a0b87e, ``triton-lab6-1a0b87e.json``."""
    bf = torch.bfloat16
    base = dict(Lq=1, W=200, C=64, nan_invisible=True, kv_start=5, path="splitkv")
    cases = []
    for pdl in (True, False):
        cases += [dict(base, B=2, Hq=4, Hkv=4, Lk=700, Dqk=128, Dv=128, dtype=bf, pdl=pdl),
                  dict(base, B=3, Hq=8, Hkv=2, Lk=900, Dqk=64, Dv=64, dtype=torch.float16, pdl=pdl),
                  dict(base, B=1, Hq=6, Hkv=3, Lq=5, Lk=333, Dqk=96, Dv=64, dtype=bf, pdl=pdl,
                       num_splits=4)]
    dec = [("table (pdl)", {}), ("serial combine", dict(_pdl=False))]
    if ARGS.lab == "2":
        # lab 2 (after lab 1 at 76fd3c9 shipped the PDL combine): the split count and the
        # key block under the bench's flushed timer, where the window comes from HBM and
        # more programs in flight may hide more of its latency. Predicted (flushed):
        # B=1 D=128 S=16 11.0-11.9 us (table 11.9), S=32 11.5-12.5, BLOCK_N=32 11.5-12.5;
        # B=8 GQA S=16 9.6-10.3 (table 10.1).
        cases += [dict(base, B=2, Hq=4, Hkv=4, Lk=700, Dqk=128, Dv=128, dtype=bf, num_splits=32),
                  dict(base, B=2, Hq=4, Hkv=4, Lk=700, Dqk=128, Dv=128, dtype=bf,
                       config=L.Config(64, 32, 4, 3))]
        dec = [("table (pdl)", {}), ("S=16", dict(_num_splits=16)), ("S=32", dict(_num_splits=32)),
               ("BLOCK_N=32", dict(_config=L.Config(64, 32, 4, 3)))]
    if ARGS.lab == "4":
        # Measured in session 9 at 92218e9 (bench_results/triton-lab11-92218e9.json), flushed:
        # B=8 10.3 / 10.3 / 10.3 us (table / s3 / s2), B=1 GQA 8.2 / 8.1 / 7.9: within noise,
        # the table stays.
        # lab 4 (written in session 8): B=8 GQA 32/4 D=64 decode splits
        # 6 ways over 128-key blocks (192 programs); 32-key blocks lost there (lab9,
        # 9.8 -> 10.4 us flushed). 64-key blocks give 11 one-block splits (352
        # programs). Predicted (flushed): 9.5-10.3 us against the table's 9.8-10.1.
        C_ = L.Config
        cases += [dict(base, B=3, Hq=8, Hkv=2, Lk=900, Dqk=64, Dv=64, dtype=torch.float16,
                       config=C_(64, 64, 4, s)) for s in (2, 3)]
        dec = [("table", {}), ("BLOCK_N=64 s3", dict(_config=C_(64, 64, 4, 3))),
               ("BLOCK_N=64 s2", dict(_config=C_(64, 64, 4, 2)))]
        return cases, [
            (dict(name="decode B8 gqa 32K", B=8, Hq=32, Hkv=4, Lq=1, Lk=32768, D=64, W=512, C=64,
                  flushed=True), dec),
            (dict(name="decode B1 gqa 8K", B=1, Hq=32, Hkv=4, Lq=1, Lk=8192, D=64, W=512, C=64,
                  flushed=True), dec),
        ]
    if ARGS.lab == "5":
        # Run 3 (landmark fix-up of V: the 8-row group holding the landmark instead
        # of the whole tile through registers: D=128 64x64 w4 s3 229 -> 151 registers):
        # predicted D=128 L=8K 64x64 s2 220-260 us (run 2: 318, table 229); without
        # landmarks (mask_lmk=False rows, no fix-up at all) 200-240.
        # Run 2 (P through shared memory: with P as the register operand of the PV
        # product ptxas placed the wait for it before the softmax, SASS on CPU):
        # predicted D=128 L=8K 200-240 us (table 227), D=64 GQA 140-170 us (table 158).
        # lab 5 (session 9): the Gluon prefill kernel (triton_impl/gluon_prefill.py, the
        # softmax of key block j overlapped with the PV product of block j - 1) against
        # the shipped Triton-language TMA kernel ("table"), L2 not flushed. Predicted:
        # D=128 L=8K table 229 us; Gluon best config 180-230 us; D=64 GQA 32/4 table
        # 159 us, Gluon 130-165 us. CPU compile of run 1's kernel (Triton 3.6, sm_90):
        # D=128 64x64 w4 s2 211 registers, 82 KB shared (2 CTAs per SM); 128x64 w8 s2
        # 173 / 98 KB (1); D=64 64x64 w4 s2 150 / 41 KB (3); 128x64 w8 s2 128 / 49 KB (2).
        # The committed kernel (run 3: P's two shared buffers, 8-row fix-up): D=128 64x64
        # w4 s2 150 registers, 98 KB (still 2 CTAs per SM).
        C_ = L.Config
        gb = dict(B=2, Hq=4, Hkv=2, Lq=600, Lk=700, W=200, C=64, nan_invisible=True, kv_start=5,
                  path="prefill", tma="gluon")
        g128 = [C_(64, 64, 4, 2), C_(64, 64, 4, 3), C_(128, 64, 8, 2), C_(128, 64, 8, 3)]
        g64 = [C_(64, 64, 4, 2), C_(64, 64, 4, 3), C_(64, 64, 4, 4), C_(128, 64, 8, 2), C_(128, 64, 8, 3)]
        cases = ([dict(gb, Dqk=128, Dv=128, dtype=bf, config=c) for c in g128]
                 + [dict(gb, Dqk=64, Dv=64, dtype=torch.float16, config=c) for c in g64]
                 + [dict(gb, Dqk=128, Dv=64, dtype=bf, config=C_(64, 64, 4, 2), blhd=True),
                    dict(gb, Dqk=64, Dv=128, dtype=bf, config=C_(128, 64, 8, 2), Lq=333, Lk=1000, W=100,
                         C=16, Hq=6),
                    dict(gb, Dqk=128, Dv=128, dtype=bf, config=C_(64, 64, 4, 2), W=300, C=50,
                         mask_lmk=False, expand=False, sm_scale=-0.3),
                    dict(gb, Dqk=64, Dv=64, dtype=bf, config=C_(64, 64, 4, 2), W=300, C=50,
                         expand=False, blhd=True),
                    dict(gb, Dqk=128, Dv=128, dtype=torch.float16, config=C_(64, 64, 4, 2), Lq=512, Lk=512,
                         W=37, C=1),
                    dict(gb, Dqk=64, Dv=64, dtype=bf, config=C_(64, 64, 4, 2), Lq=1000, Lk=1000, W=5000,
                         C=64, kv_start=10 ** 6 + 7, B=1, Hq=8, Hkv=1),
                    dict(gb, Dqk=128, Dv=128, dtype=bf, config=C_(64, 64, 4, 2), Lq=1, Lk=700),
                    dict(gb, Dqk=128, Dv=128, dtype=bf, config=C_(64, 64, 4, 2), Lq=70, Lk=70, W=512)])

        def gname(c):
            return f"gluon {c.block_m}x{c.block_n} w{c.num_warps} s{c.num_stages}"
        v128 = [("table", {})] + [(gname(c), dict(_tma="gluon", _config=c, _force_path="prefill"))
                                  for c in g128]
        v64 = [("table", {})] + [(gname(c), dict(_tma="gluon", _config=c, _force_path="prefill"))
                                 for c in g64]
        return cases, [
            (dict(name="mha D128 L8K", B=1, Hq=32, Hkv=32, Lq=8192, Lk=8192, D=128, W=512, C=64), v128),
            (dict(name="gqa32/4 D64 L8K", B=1, Hq=32, Hkv=4, Lq=8192, Lk=8192, D=64, W=512, C=64), v64),
            (dict(name="mha D128 L8K nolmk", B=1, Hq=32, Hkv=32, Lq=8192, Lk=8192, D=128, W=512, C=64,
                  mask_lmk=False), v128[:2]),
            (dict(name="mha D128 L16K", B=1, Hq=32, Hkv=32, Lq=16384, Lk=16384, D=128, W=512, C=64), v128[:3]),
            (dict(name="batch4x4K D64", B=4, Hq=32, Hkv=4, Lq=4096, Lk=4096, D=64, W=512, C=64), v64[:3]),
        ]
    if ARGS.lab == "10":
        # lab 10 (session 10): the pointer kernel's PHASES rewritten as the TMA kernel's two
        # phases (edge blocks first, then the inside blocks without the window test; lab 9's
        # three-loop form lost). SASS (Triton 3.6, sm_90, bf16, CPU) per key block: D=128
        # 64x64 w4 s3 719 -> 488 inside (807 on edges), D=64 64x32 w4 s4 331 -> 259 (364).
        # Predicted (kernel-only, L2 not flushed): chunked Lq=512 D=128 20.2 -> 18.5-20.5 us,
        # GQA D=64 13.5 -> 11.5-13.0, Lq=1024 D=128 38.7 -> 35-38; long prefill on the pointer
        # kernel (TMA off) D=128 L=8K and GQA D=64 -3..-12%.
        # Measured at 5ee8260 (bench_results/triton-lab17-5ee8260.json, kernel-only us, one
        # loop -> phases): chunked Lq=512 D=128 20.4 -> 20.3, GQA D=64 13.4 -> 13.6, Lq=1024
        # D=128 38.2 -> 38.7; TMA off: D=128 L=8K 261.6 -> 258.9, GQA D=64 176.7 -> 158.8.
        # Shipped for the 16-bit D <= 64 bucket (launch.PHASES).
        pbase = dict(B=2, Hq=4, Hkv=2, Lq=600, Lk=700, W=200, C=64, nan_invisible=True, kv_start=5,
                     path="prefill", phases=True, tma=False)
        cases = [dict(pbase, Dqk=128, Dv=128, dtype=bf),
                 dict(pbase, Dqk=64, Dv=64, dtype=bf, config=L.Config(64, 32, 4, 4)),
                 dict(pbase, Dqk=96, Dv=64, dtype=torch.float16, blhd=True, Lq=333, Lk=1000, W=100, C=16),
                 dict(pbase, Dqk=64, Dv=64, dtype=torch.float32, W=300, C=50, mask_lmk=False, expand=False,
                      sm_scale=-0.3),
                 dict(pbase, Dqk=128, Dv=128, dtype=bf, Lq=1000, Lk=1000, W=5000, C=64,
                      kv_start=10 ** 6 + 7, B=1, Hq=8, Hkv=1)]
        vs = [("table", {}), ("pointer phases", dict(_phases=True, _tma=False))]
        off = [("pointer", dict(_tma=False)), ("pointer phases", dict(_phases=True, _tma=False))]
        return cases, [
            (dict(name="chunk512/8K D128", B=1, Hq=32, Hkv=32, Lq=512, Lk=8192, D=128, W=512, C=64,
                  flushed=True), vs),
            (dict(name="chunk512/8K gqa D64", B=1, Hq=32, Hkv=4, Lq=512, Lk=8192, D=64, W=512, C=64,
                  flushed=True), vs),
            (dict(name="chunk1024/8K D128", B=1, Hq=32, Hkv=32, Lq=1024, Lk=8192, D=128, W=512, C=64,
                  flushed=True), vs),
            (dict(name="mha D128 L8K", B=1, Hq=32, Hkv=32, Lq=8192, Lk=8192, D=128, W=512, C=64), off),
            (dict(name="gqa32/4 D64 L8K", B=1, Hq=32, Hkv=4, Lq=8192, Lk=8192, D=64, W=512, C=64), off),
        ]
    if ARGS.lab == "9":
        # lab 9 (session 10): chunked prefill (256 programs of 64 rows: under TMA_MIN_WAVES, so
        # the pointer kernel) with the pointer kernel's three-loop PHASES, and with the TMA
        # kernel forced (two-phase loop, as shipped for long prefills). Predicted (kernel
        # only): pointer PHASES D=128 25 us (flushed) -> 22-27, GQA D=64 18 -> 16-20; TMA
        # forced D=128 -0..-8%, D=64 -5..-15% against the pointer kernel.
        # Measured (bench_results/triton-lab16-595a1ce.json; kernel / flushed us): Lq=512
        # D=128 table 20.2 / 25.2, pointer PHASES 21.5 / 26.0, TMA 19.2 / 24.1 (host 116
        # vs 32 us); GQA D=64 13.5 / 17.5, 14.2 / 18.0, 13.0 / 17.1 (host 140 vs 55);
        # Lq=1024 D=128 (512 programs, just under TMA_MIN_WAVES) 38.7 / 43.3, 40.5 / 45.5,
        # 34.1 / 39.3 (host 96 vs 39). The table stays: the pointer kernel's three loops
        # lose, and TMA's kernel-time gain is smaller than its descriptors' host time.
        pbase = dict(B=2, Hq=4, Hkv=2, Lq=600, Lk=700, W=200, C=64, nan_invisible=True, kv_start=5,
                     path="prefill", phases=True)
        cases = [dict(pbase, Dqk=128, Dv=128, dtype=bf, tma=False),
                 dict(pbase, Dqk=64, Dv=64, dtype=bf, tma=False, config=L.Config(64, 32, 4, 4))]
        vs = [("table", {}), ("pointer phases", dict(_phases=True, _tma=False)),
              ("tma forced", dict(_tma="v_ptr"))]
        return cases, [
            (dict(name="chunk512/8K D128", B=1, Hq=32, Hkv=32, Lq=512, Lk=8192, D=128, W=512, C=64,
                  flushed=True), vs),
            (dict(name="chunk512/8K gqa D64", B=1, Hq=32, Hkv=4, Lq=512, Lk=8192, D=64, W=512, C=64,
                  flushed=True), vs),
            (dict(name="chunk1024/8K D128", B=1, Hq=32, Hkv=32, Lq=1024, Lk=8192, D=128, W=512, C=64,
                  flushed=True), vs),
        ]
    if ARGS.lab == "8":
        # lab 8 (session 10, after lab 7 shipped TMA_PHASES): TMA tiles with the two-phase
        # loop, which leaves fewer instructions per block (CPU compile, Triton 3.6, sm_90:
        # registers / shared KB / CTAs per SM): D=128 64x64 s3 (table) 192 / 116 / 2,
        # 64x64 s2 193 / 83 / 2, 64x32 s3 145 / 67 / 3, 64x32 s2 r96 96 / 49 (spills),
        # 128x64 w8 s2 191 / 98 / 1; D=64 64x64 s2 r128 (table) 126 / 42 / 4, 64x32 s3
        # 115 / 34 / 4, 64x32 s2 r96 92 / 25 / 5, 64x128 s2 237 / 75 / 2, 128x64 w8 s2
        # 152 / 49 / 1. Predicted (L2 not flushed): D=128 64x32 s3 -5..+5% against the
        # table (220 us), 64x64 s2 0..+3%, 128x64 w8 +5..+15%; D=64 (133 us) 64x32
        # tiles -5..+5%, 64x128 and 128x64 w8 +5..+20%.
        # Measured at 595a1ce (bench_results/triton-lab15-595a1ce.json): D=128 L=8K table
        # 219.9 us, 64x64 s2 232.5, 64x32 s3 224.6, 128x64 w8 298.8; GQA 32/4 D=64 table
        # 133.5, 64x32 s3 153.2, 64x32 s2 r96 147.9, 64x128 270.0, 128x64 w8 231.5: the
        # table stays.
        C_ = L.Config
        return _tile_lab([C_(64, 64, 4, 2), C_(64, 32, 4, 3), C_(128, 64, 8, 2)],
                         [C_(64, 32, 4, 3), C_(64, 32, 4, 2, 96), C_(64, 128, 4, 2), C_(128, 64, 8, 2)],
                         torch.float16, ["mha D128 L8K", "gqa32/4 D64 L8K", "mha D128 L16K",
                                         "gqa16/2 D64 L8K", "batch4x4K D64"], phases=True)
    if ARGS.lab == "7":
        # lab 7 (session 10): the TMA kernel's two-phase key loop (kernels._swa_fwd_tma_kernel
        # PHASES: edge blocks first with the window test, then the blocks inside every
        # row's window with the landmark test only). SASS (Triton 3.6, sm_90, bf16, CPU),
        # instructions per key block of the steady loop: D=128 64x64 w4 s3 704 -> 481
        # inside the window (752 on edge blocks), D=64 64x64 w4 s2 r128 606 -> 400 (644);
        # a 64-row tile at W=512, C=64 has 7 of its 9 blocks inside, at W=4096 63 of 65.
        # Predicted (L2 not flushed; table: D=128 L=8K 229-232 us, GQA 32/4 159 us):
        # D=128 L=8K/16K -5..-15%; D=64 GQA 32/4, 16/2, batch 4 x 4K -8..-20%;
        # W=4096 GQA D=64 -15..-30%.
        C_ = L.Config
        pbase = dict(B=2, Hq=4, Hkv=2, Lq=600, Lk=700, W=200, C=64, nan_invisible=True, kv_start=5,
                     path="prefill", tma="v_ptr", phases=True)
        cases = [dict(pbase, Dqk=128, Dv=128, dtype=bf),
                 dict(pbase, Dqk=64, Dv=64, dtype=torch.float16, config=C_(64, 64, 4, 2, 128)),
                 dict(pbase, Dqk=128, Dv=64, dtype=bf, blhd=True, Lq=333, Lk=1000, W=100, C=16, Hq=6),
                 dict(pbase, Dqk=64, Dv=64, dtype=bf, Lq=1000, Lk=1000, W=5000, C=64,
                      kv_start=10 ** 6 + 7, B=1, Hq=8, Hkv=1),
                 dict(pbase, Dqk=128, Dv=128, dtype=torch.float16, Lq=512, Lk=512, W=37, C=1),
                 dict(pbase, Dqk=64, Dv=64, dtype=bf, W=300, C=50, mask_lmk=False, expand=False,
                      sm_scale=-0.3),
                 dict(pbase, Dqk=128, Dv=128, dtype=bf, tma="v_tma"),
                 dict(pbase, Dqk=128, Dv=128, dtype=bf, Lq=70, Lk=70, W=512)]
        ph = [("table", {}), ("phases", dict(_phases=True))]
        return cases, [
            (dict(name="mha D128 L8K", B=1, Hq=32, Hkv=32, Lq=8192, Lk=8192, D=128, W=512, C=64),
             ph + [("phases 64x64 s2", dict(_phases=True, _tma="v_ptr", _config=C_(64, 64, 4, 2)))]),
            (dict(name="gqa32/4 D64 L8K", B=1, Hq=32, Hkv=4, Lq=8192, Lk=8192, D=64, W=512, C=64),
             ph + [("phases 64x64 s3 r128", dict(_phases=True, _tma="v_ptr", _config=C_(64, 64, 4, 3, 128)))]),
            (dict(name="gqa16/2 D64 L8K", B=1, Hq=16, Hkv=2, Lq=8192, Lk=8192, D=64, W=512, C=64), ph),
            (dict(name="batch4x4K D64", B=4, Hq=32, Hkv=4, Lq=4096, Lk=4096, D=64, W=512, C=64), ph),
            (dict(name="mha D128 L16K", B=1, Hq=32, Hkv=32, Lq=16384, Lk=16384, D=128, W=512, C=64), ph),
            (dict(name="gqa32/4 D64 W4096", B=1, Hq=32, Hkv=4, Lq=8192, Lk=8192, D=64, W=4096, C=64), ph),
            (dict(name="mha D128 L8K flushed", B=1, Hq=32, Hkv=32, Lq=8192, Lk=8192, D=128, W=512, C=64,
                  flushed=True), ph),
            (dict(name="gqa32/4 D64 L8K flushed", B=1, Hq=32, Hkv=4, Lq=8192, Lk=8192, D=64, W=512, C=64,
                  flushed=True), ph),
        ]
    if ARGS.lab == "3":
        # lab 3: more CTAs per SM for the TMA prefill kernel through a register cap
        # (Config.maxnreg). CPU compile, sm_90, bf16: D=128 64x64 w4 s3 (the table) 196
        # registers, 115 KB shared: 2 CTAs per SM; 64x32 w4 s2 capped at 128 registers
        # (no spills): 49 KB, 4 CTAs; 64x32 w4 s3 at 128: 66 KB, 3 CTAs (shared
        # memory); D=64 64x64 w4 s3 (the table) 136 registers, 57 KB: 3 CTAs; 64x64 w4
        # s2 capped at 128: 41 KB, 4 CTAs; 64x32 w4 s2 91 registers, 25 KB: 5 CTAs.
        # Predicted (L2 not flushed): D=128 L=8K 229 us -> 205-225 us with 4 CTAs;
        # D=64 GQA 32/4 L=8K 162 us -> 145-160 us with 4 CTAs.
        C_ = L.Config
        return _tile_lab([C_(64, 32, 4, 2, 128), C_(64, 32, 4, 3, 128), C_(64, 32, 4, 2), C_(64, 64, 4, 3, 168)],
                         [C_(64, 64, 4, 2, 128), C_(64, 64, 4, 2), C_(64, 32, 4, 2, 96), C_(64, 32, 4, 3)],
                         torch.bfloat16, ["mha D128 L8K", "gqa32/4 D64 L8K", "gqa16/2 D64 L8K",
                                          "mha D128 L16K"])
    plan = [
        (dict(name="decode B1 8K", B=1, Hq=32, Hkv=32, Lq=1, Lk=8192, D=128, W=512, C=64, flushed=True), dec),
        (dict(name="decode B1 128K", B=1, Hq=32, Hkv=32, Lq=1, Lk=131072, D=128, W=512, C=64, flushed=True), dec),
        (dict(name="decode B1 gqa 8K", B=1, Hq=32, Hkv=4, Lq=1, Lk=8192, D=64, W=512, C=64, flushed=True), dec),
        (dict(name="decode B8 gqa 32K", B=8, Hq=32, Hkv=4, Lq=1, Lk=32768, D=64, W=512, C=64, flushed=True), dec),
    ]
    return cases, plan


def main(argv=None):
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", ".out"))
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="a few auto-path checks and the table config of four shapes (confirmation run)")
    ap.add_argument("--lab", nargs="?", const="1", default=None,
                    help="the current lab (lab(); --lab 2: its second sweep): its own checks, the "
                         "timers' floor, then its variants")
    ap.add_argument("--host", action="store_true",
                    help="host time of one eager call, piece by piece (host_breakdown)")
    ARGS = ap.parse_args(argv)
    os.makedirs(ARGS.out, exist_ok=True)
    import triton
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               sm_count=L.sm_count(torch.device("cuda")), checks=[], timings=[])
    path = os.path.join(ARGS.out, "triton_gpu.json")

    def dump():
        with open(path, "w") as f:
            json.dump(res, f, indent=1, default=str)

    cases = correctness_cases()
    if ARGS.lab:
        cases, lab_plan = lab()
    if ARGS.quick:
        cases = [c for c in cases if c.get("path") is None][:1] + [
            dict(B=1, Hq=8, Hkv=2, Lq=700, Lk=700, Dqk=128, Dv=128, W=200, C=64, dtype=torch.bfloat16,
                 nan_invisible=True),
            dict(B=1, Hq=8, Hkv=2, Lq=700, Lk=700, Dqk=64, Dv=64, W=200, C=64, dtype=torch.float16,
                 nan_invisible=True)]
    if not ARGS.skip_check:
        for c in cases:
            try:
                check_case(c, res["checks"])
            except Exception as e:
                traceback.print_exc()
                res["checks"].append(dict(case={k: str(v) for k, v in c.items()}, ok=False,
                                          error=f"{type(e).__name__}: {e}"[:400]))
            dump()
        print(f"correctness: {sum(r['ok'] for r in res['checks'])}/{len(res['checks'])} ok, "
              f"{time.time() - T0:.0f} s", flush=True)

    cfg_d128 = [("table", {}), pre(128, 64, 8, 3, False), pre(128, 64, 8, 2, False), pre(64, 64, 4, 3, False),
                pre(64, 64, 4, 3, True), pre(64, 64, 4, 2, False), pre(128, 128, 8, 2, False),
                pre(64, 32, 4, 4, True), ("table, JIT launch", dict(fast=False))]
    cfg_gqa = [("table", {}), pre(128, 64, 4, 3, False), pre(128, 32, 4, 3, False), pre(128, 32, 4, 3, True),
               pre(128, 64, 8, 3, None, "packed"), pre(64, 64, 4, 3, None, "packed"),
               pre(128, 64, 4, 3, None, "packed"), pre(128, 128, 8, 2, None, "packed")]
    cfg_dec = [("table", {}), ("table, JIT launch", dict(fast=False)),
               ("split n128 s2", dict(_force_path="splitkv", _config=L.Config(64, 128, 4, 2))),
               ("split s16", dict(_force_path="splitkv", _num_splits=16))]
    plan = [
        (dict(name="mha D128 L8K", B=1, Hq=32, Hkv=32, Lq=8192, Lk=8192, D=128, W=512, C=64), cfg_d128),
        (dict(name="gqa32/4 D64 L8K", B=1, Hq=32, Hkv=4, Lq=8192, Lk=8192, D=64, W=512, C=64), cfg_gqa),
        (dict(name="decode B1 8K", B=1, Hq=32, Hkv=32, Lq=1, Lk=8192, D=128, W=512, C=64, profile=True), cfg_dec),
        (dict(name="decode B8 gqa 32K", B=8, Hq=32, Hkv=4, Lq=1, Lk=32768, D=64, W=512, C=64), cfg_dec),
        (dict(name="chunk Lq512/8K D128", B=1, Hq=32, Hkv=32, Lq=512, Lk=8192, D=128, W=512, C=64, profile=True),
         [("table", {}), ("split", dict(_force_path="splitkv")), pre(128, 64, 8, 3, False), pre(64, 64, 4, 3, True),
          ("table, JIT launch", dict(fast=False))]),
        (dict(name="gqa16/2 D64 L8K", B=1, Hq=16, Hkv=2, Lq=8192, Lk=8192, D=64, W=512, C=64), cfg_gqa[:1] + cfg_gqa[4:]),
        (dict(name="mha D128 L16K", B=1, Hq=32, Hkv=32, Lq=16384, Lk=16384, D=128, W=512, C=64), cfg_d128[:6]),
        (dict(name="batch4x4K D128", B=4, Hq=32, Hkv=32, Lq=4096, Lk=4096, D=128, W=512, C=64), cfg_d128[:6]),
        (dict(name="decode B1 128K", B=1, Hq=32, Hkv=32, Lq=1, Lk=131072, D=128, W=512, C=64), cfg_dec[:1]),
        (dict(name="mha D128 L8K blhd", B=1, Hq=32, Hkv=32, Lq=8192, Lk=8192, D=128, W=512, C=64, blhd=True),
         cfg_d128[:4]),
    ]
    if ARGS.lab:
        plan = lab_plan
        floor_times(res)
        dump()
    if ARGS.host:
        host_breakdown(res)
        dump()
    if ARGS.quick:
        keep = ("mha D128 L8K", "decode B1 8K", "decode B8 gqa 32K", "chunk Lq512/8K D128")
        plan = [(dict(s, profile=False), [("table", {})]) for s, _ in plan if s["name"] in keep]
    for s, v in plan:
        time_shape(s, v, res["timings"])
        res["profiles"] = PROFILES
        dump()

    print("\n=== summary (kernel-only = CUDA graph replay; eager = public call; wrapper = eager - kernel)")
    print(f"{'shape':22s} {'variant':26s} {'path':8s} {'kern us':>9s} {'eager us':>9s} {'wrap us':>8s} {'TFLOP/s':>8s}")
    for r in res["timings"]:
        if "error" in r:
            print(f"{r['shape']:22s} {r['variant']:26s} ERROR")
            continue
        print(f"{r['shape']:22s} {r['variant']:26s} {r['path']:8s} {r['kernel_us']:9.1f} {r['eager_us']:9.1f} "
              f"{r['wrapper_us']:8.1f} {r['tflops']:8.1f}")
    bad = [r for r in res["checks"] if not r["ok"]]
    print(f"correctness: {len(res['checks']) - len(bad)}/{len(res['checks'])} ok; total {time.time() - T0:.0f} s")
    dump()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
