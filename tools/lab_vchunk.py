"""Lab (session 24): ``v`` of the TMA prefill kernel's inside blocks through a chunked view.

The TMA prefill kernel loads ``v`` by masked pointer loads, because a landmark row of
``v`` (never visible, may hold NaN) must reach ``P @ V`` as 0 and zeroing a TMA-loaded
tile in registers costs more than it saves (``launch.PREFILL_TMA``). With ``V_CHUNK`` the
blocks inside every row's window take ``v`` by TMA through a 5-D view
``(B, Hkv, Lk // C, C - 1, Dv)`` with strides ``(sb, sh, C * sl, sl, 1)``: the landmark
row of each chunk lies outside the view, and the copy engine fills it with zeros. Valid
when ``C % BLOCK_N == 0`` and key tiles start on chunk boundaries.

Checks first (bit-identical ``o`` and ``lse`` against the shipped pointer-``v`` kernel on
fresh inputs with NaN in every landmark slot of ``v`` and ``k``, outputs poisoned; error
against the float64 reference), then kernel-only times, interleaved rounds: back to back
(CUDA graph over three input sets) and the bench's flushed timer.

    python -m tools.lab_vchunk --out results.json [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

import reference
from tools._common import attention_flops
from tools.gpu_triton import flushed_time, graph_time
from triton_impl import kernels
from triton_impl import launch as L

import os

DEV = os.environ.get("LAB_DEVICE", "cuda")
MUTANT = os.environ.get("LAB_MUTANT") == "1"


def make(B, Hq, Hkv, L_, D, dtype, seed, C, nan_lmk=True, kv_start=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(B, Hq, L_, D, device=DEV, dtype=dtype, generator=g)
    k = torch.randn(B, Hkv, L_, D, device=DEV, dtype=dtype, generator=g)
    v = torch.randn(B, Hkv, L_, D, device=DEV, dtype=dtype, generator=g)
    if nan_lmk:
        pos = torch.arange(L_, device=DEV) + kv_start
        lmk = (pos + 1) % C == 0
        k[:, :, lmk] = float("nan")
        v[:, :, lmk] = float("nan")
    return q, k, v


def runner(q, k, v, W, C, kv_start, chunk, config=None, extra=None):
    """A function running the TMA prefill kernel once on (q, k, v) into fresh outputs,
    V_CHUNK on or off, ``extra`` constexprs of the kernel set (session 26: ``EDGE_STAGES``);
    everything else as the shipped plan (tma='v_ptr' forced)."""
    p = reference.check_inputs(q, k, v, window_size=W, chunk_size=C, kv_start=kv_start)
    plan = L._plan(p, path="prefill", config=config, tma="v_ptr").tma
    assert plan is not None and plan.path == "prefill_tma"
    bm, bn, bdk, bdv = plan.blocks
    r, w, c = L._frame(p)
    j_min = L._j_min(plan, p)
    qk_scale = p.sm_scale * L.LOG2E
    cx, st = plan.pick(c, qk_scale)
    cx = dict(cx, **(extra or {}))
    kk, vv = k[:, :, j_min:], v[:, :, j_min:]
    if chunk:
        assert c % bn == 0 and (r + j_min) % c == 0, (c, bn, r, j_min)
        nch = (p.Lk - j_min) // c
        s = v.stride()
        rows = c if MUTANT else c - 1  # MUTANT: the landmark row inside the view (the checks must fail)
        v5 = torch.as_strided(v, (p.B, p.Hkv, nch, rows, p.Dv), (s[0], s[1], c * s[2], s[2], s[3]),
                              v.storage_offset() + j_min * s[2])
        dv = TensorDescriptor(v5, list(v5.shape), list(v5.stride()), [1, 1, 1, bn, bdv])
        cx["V_CHUNK"] = True
    else:
        dv = TensorDescriptor(vv, list(vv.shape), list(vv.stride()), [1, 1, bn, bdv])
    opts = dict(num_warps=plan.num_warps, num_stages=plan.num_stages)
    if st[4] is not None:
        opts["maxnreg"] = st[4]
    dq = TensorDescriptor(q, list(q.shape), list(q.stride()), [1, 1, bm, bdk])
    dk = TensorDescriptor(kk, list(kk.shape), list(kk.stride()), [1, 1, bn, bdk])

    def fn(o=None, lse=None):
        if o is None:
            o, lse = p.new_outputs()
        do = TensorDescriptor(o, list(o.shape), list(o.stride()), [1, 1, bm, bdv])
        kernels._swa_fwd_tma_kernel[plan.grid](
            dq, dk, dv, do, v, lse, *v.stride(), *plan.head, p.Lk, r, j_min, w, c, qk_scale, **cx, **opts)
        return o, lse
    return fn, p


def check(results, only_fp16=False, lmk2=False):
    """Each case: V_CHUNK (and session 26's EDGE_STAGES variants) against the shipped pointer
    kernel (bit-identical) and the float64 reference."""
    bf, f16 = torch.bfloat16, torch.float16
    if only_fp16:  # the interpreter: fp16 only (its bf16 is wrong, triton-lang/triton#11584)
        bf = f16
    cases = [  # B, Hq, Hkv, L, D, W, C, kv_start, dtype
        (2, 4, 2, 1000, 128, 200, 64, 0, bf), (1, 4, 4, 1100, 128, 300, 128, 128, bf),
        (2, 8, 2, 777, 64, 100, 64, 64, f16), (1, 2, 1, 1500, 64, 512, 256, 0, bf),
        (1, 4, 1, 640, 128, 512, 64, 0, bf), (3, 2, 2, 513, 64, 64, 64, 192, f16),
        (1, 4, 2, 900, 128, 300, 64, 64, bf, L.Config(64, 32, 4, 3)),
        (1, 4, 2, 900, 128, 300, 128, 0, bf, L.Config(64, 64, 4, 2)),
    ]
    if only_fp16:  # the interpreter: smaller
        cases = [(1, 2, 1, 400, 64, 200, 64, 0, f16), (1, 2, 2, 520, 64, 150, 128, 128, f16),
                 (1, 2, 1, 333, 64, 64, 64, 64, f16), (1, 2, 1, 300, 64, 150, 64, 64, f16, L.Config(64, 32, 4, 3))]
    ok = True
    # (V_CHUNK, extra constexprs, case) of the kernel held to the shipped pointer-v kernel's bits
    views = [(True, {}, cs) for cs in cases]
    if lmk2:  # session 36: only cases whose C is the block's 64 keys (the table's tile)
        # EDGE_VIEW needs whole chunks everywhere (kernels._swa_fwd_tma_kernel): these cases
        cases += ([(1, 2, 1, 384, 64, 200, 64, 0, f16), (1, 2, 2, 320, 64, 64, 64, 64, f16)] if only_fp16
                  else [(2, 4, 2, 1024, 128, 200, 64, 0, bf), (1, 4, 2, 768, 64, 100, 64, 128, f16),
                        (1, 4, 4, 1280, 128, 512, 64, 0, bf)])
        ones = [cs for cs in cases if cs[6] == 64 and len(cs) == 9]

        def shipped(cs):  # the edge loop as shipped (launch.TMA_V_CHUNK_EDGE_STAGES)
            return _edge_stages(cs[4])
        views = [(True, dict(ex, **shipped(cs)), cs)
                 for cs in ones for ex in ({"LMK_ONE": 2}, {"LMK_ONE": 2, "FOLD": True}, {"FOLD": True})]
        views += [(True, dict({"LMK_ONE": 2, "EDGE_VIEW": True}, **fo, **shipped(cs)), cs)
                  for cs in ones if cs[3] % 64 == 0 and cs[7] % 64 == 0 for fo in ({}, {"FOLD": True})]
    # session 26: the D = 128 kernels with the edge loop two deep, view and pointer v
    views += [(ch, {"EDGE_STAGES": 2}, cs) for cs in cases if cs[4] == 128 and len(cs) == 9
              for ch in (True, False)]
    for i, (view, extra, (B, Hq, Hkv, L_, D, W, C, ks, dt, *cfg)) in enumerate(views):
        cfg = cfg[0] if cfg else None
        q, k, v = make(B, Hq, Hkv, L_, D, dt, 1000 + i, C, True, ks)
        outs = []
        for chunk, ex in ((False, None), (view, extra)):
            fn, p = runner(q, k, v, W, C, ks, chunk, cfg, ex)
            o, lse = p.new_outputs()
            o.fill_(float("nan")), lse.fill_(float("nan"))  # poisoned: an element never written shows
            o, lse = fn(o, lse)
            if DEV == "cuda":
                torch.cuda.synchronize()
            outs.append((o, lse))
        (o0, l0), (o1, l1) = outs
        same = torch.equal(o0.view(torch.int16), o1.view(torch.int16)) and torch.equal(
            l0.view(torch.int32), l1.view(torch.int32))
        ro, rl = reference.golden(q, k, v, window_size=W, chunk_size=C, kv_start=ks)
        fin = torch.isfinite(rl)

        def errs(o, lse):
            eo = (o.double() - ro.double()).abs().max().item()
            el = (lse.double()[fin] - rl.double()[fin]).abs().max().item() if fin.any() else 0.0
            return eo, el
        (e0o, e0l), (err_o, err_l) = errs(o0, l0), errs(o1, l1)
        nan = bool(torch.isnan(o1).any() or torch.isnan(l1).any())
        # bit-identical expected; a compile that orders the same math differently may move an
        # ulp: then the error against float64 must stay the pointer kernel's (1.25x + a floor)
        good = not nan and (same or (err_o <= 1.25 * e0o + 1e-3 and err_l <= 1.25 * e0l + 1e-5))
        ok &= good
        if lmk2 and extra.get("LMK_ONE") == 2:
            # the controls: the same kernel where its premise fails must disagree with the
            # pointer kernel: LMK_ONE = 2 at C = 128 (two blocks a chunk, the landmark not in
            # every block's last column); EDGE_VIEW on a key range that ends in a partial chunk
            # (past the view: zero rows where keys are)
            if extra.get("EDGE_VIEW"):
                Ln, Cn, ex_n = L_ - 24, C, extra
            else:
                Ln, Cn, ex_n = L_, 128, {"LMK_ONE": 2}
            qn, kn, vn = make(B, Hq, Hkv, Ln, D, dt, 2000 + i, Cn, True, 0)
            fb, pb = runner(qn, kn, vn, W, Cn, 0, False, None, None)
            fm, _ = runner(qn, kn, vn, W, Cn, 0, bool(extra.get("EDGE_VIEW")), None, ex_n)
            ob, _ = fb()
            om, _ = fm()
            teeth = not torch.equal(ob.view(torch.int16), om.view(torch.int16))
            results.setdefault("controls", []).append(dict(case=i, extra=extra, L=Ln, C=Cn, differs=teeth))
            ok &= teeth
        do = (o1.double() - o0.double()).abs()
        row = dict(case=i, shape=(B, Hq, Hkv, L_, D, W, C, ks, str(dt)), view=view, extra=extra,
                   bit_identical=same, nan=nan,
                   err_o=err_o, err_lse=err_l, ptr_err_o=e0o, ptr_err_lse=e0l, ok=good,
                   o_diff_max=do.max().item(), o_diff_n=int((do > 0).sum()), o_n=do.numel(),
                   lse_diff_n=int((l1 != l0).sum()))
        results["checks"].append(row)
        print("check", row, flush=True)
    return ok


def graph_us(fn):
    """Kernel-only microseconds per call back to back (``tools.gpu_triton.graph_time``)."""
    return graph_time(fn, [()])


def flushed_us(fn):
    """Microseconds per call by the bench's flushed timer (``tools.gpu_triton.flushed_time``,
    NaN when the graph capture failed: refused here)."""
    us = flushed_time(fn, [()], reps=15)
    if not math.isfinite(us):
        raise RuntimeError("the flushed timer's graph capture failed")
    return us


C_ = L.Config
# per head dim: (name, V_CHUNK, config[, extra constexprs]); the first is the shipped kernel.
# Session 26 (written on the CPU, not run): chunk-s3-edge2, the view at three stages with
# the edge loop two deep (114744 bytes of shared memory, two CTAs per SM; the plain view
# kernel at three stages needs 115736, one CTA), and its control ptr-edge2. Predicted:
# chunk-s3-edge2 2-5% less kernel time than ptr at D = 128 (session 24's view took 3.9-4.7%
# off D = 64, where the pointer loads of v are half as many per block), ptr-edge2 within 1%.
VARIANTS = {
    128: [("ptr", False, None), ("chunk-s2", True, C_(64, 64, 4, 2)), ("ptr-s2", False, C_(64, 64, 4, 2)),
          ("chunk-64x32s3", True, C_(64, 32, 4, 3)), ("chunk-64x32s4", True, C_(64, 32, 4, 4)),
          ("chunk-s3-edge2", True, None, {"EDGE_STAGES": 2}), ("ptr-edge2", False, None, {"EDGE_STAGES": 2})],
    64: [("ptr", False, None), ("chunk", True, None), ("chunk-s3", True, C_(64, 64, 4, 3, maxnreg=128)),
         ("chunk-s3-nocap", True, C_(64, 64, 4, 3))],
}

# Session 36 (--lmk2): the landmark test as a compile-time column (kernels._not_lmk LMK_ONE == 2:
# C == BLOCK_N, every block on a chunk boundary, as the view requires) and the scale folded into
# the exponent (FOLD, measured in session 6 on the one-loop kernel only), against the shipped
# kernel (the view; D = 128 with the edge loop two deep). SASS per inside / edge block (Triton 3.9,
# sm_90, CPU): D = 64 400 / 596 -> 351 / 509 (lmk2) -> 321 / 478 (lmk2-fold); D = 128 446 / 716 ->
# 407 / 622 -> 377 / 593. Predicted: D = 64 -3..-7% kernel time with lmk2, -4..-9% with lmk2-fold;
# D = 128 -0.5..-3%; fold alone within 2% (session 6: within noise). lmk2-edgeview (EDGE_VIEW: the
# edge blocks' v through the view as well, right only on whole chunks: every SHAPES row with
# C = 64): edge block 622 -> 518 instructions at D = 128 (its 16 pointer loads of v gone), 509 ->
# 464 at D = 64; predicted a further -1..-3% at D = 128, -0.5..-2% at D = 64.
# Measured in session 37 (one H100, bench_results/vchunk-lab37-lmk2-h100-ecbe587.json): lmk2
# -2.9..-8.9%, lmk2-fold -1.6..-11.0%, fold -3.7..+4.0%, lmk2-edgeview -3.6..-10.4%; lmk2 and
# lmk2-edgeview shipped (launch._vchunk_variant), so "shipped" below names session 36's view
# kernel (the runner builds every arm from the pointer-v plan). Added then: lmk2-edgeview-fold,
# timed in session 38 (one H100, bench_results/vchunk-lab38-lmk2-h100-6dbab1c.json): against
# lmk2-edgeview, per round, D = 64 -1.4..-4.0% (every round of the three 8K-class shapes), D = 128
# -0.3..-0.9% at 8K and -1.6..+4.7% at 16K; FOLD shipped in both variants at D = 64
# (launch.TMA_VIEW_FOLD): the arms "lmk2-fold" / "lmk2-edgeview-fold" are then what D = 64 runs.
LMK2_ARMS = [("shipped", {}), ("lmk2", {"LMK_ONE": 2}), ("lmk2-fold", {"LMK_ONE": 2, "FOLD": True}),
             ("fold", {"FOLD": True}), ("lmk2-edgeview", {"LMK_ONE": 2, "EDGE_VIEW": True}),
             ("lmk2-edgeview-fold", {"LMK_ONE": 2, "EDGE_VIEW": True, "FOLD": True})]


def _edge_stages(d: int) -> dict:
    """The edge loop's depth as the bf16 view kernel ships it at head dim ``d``
    (``launch.TMA_V_CHUNK_EDGE_STAGES``: two at D = 128), as constexprs."""
    n = L.TMA_V_CHUNK_EDGE_STAGES.get(("16", d), 0)
    return {"EDGE_STAGES": n} if n else {}


VARIANTS_LMK2 = {d: [(name, True, None, dict(ex, **_edge_stages(d))) for name, ex in LMK2_ARMS]
                 for d in (64, 128)}

SHAPES = [  # name, B, Hq, Hkv, L, D, W, C
    ("train-8k-32/32/128", 1, 32, 32, 8192, 128, 512, 64),
    ("train-16k-32/32/128", 1, 32, 32, 16384, 128, 512, 64),
    ("train-8k-32/4/64", 1, 32, 4, 8192, 64, 512, 64),
    ("train-8k-16/2/64", 1, 16, 2, 8192, 64, 512, 64),
    ("batch4x4k-32/4/64", 4, 32, 4, 4096, 64, 512, 64),
    ("longwin-w4096-8k-32/4/64", 1, 32, 4, 8192, 64, 4096, 64),
    ("train-8k-32/32/128-C128", 1, 32, 32, 8192, 128, 512, 128),
]


CHUNKED = [  # name, B, Hq, Hkv, Lq, Lk, D, W, C: grids under TMA_MIN_WAVES (the pointer kernel ships)
    ("chunk512of8k-32/4/64", 1, 32, 4, 512, 8192, 64, 512, 64),
    ("chunk1024of8k-32/4/64", 1, 32, 4, 1024, 8192, 64, 512, 64),
    ("chunk512of8k-32/32/128", 1, 32, 32, 512, 8192, 128, 512, 64),
    ("chunk1024of8k-32/32/128", 1, 32, 32, 1024, 8192, 128, 512, 64),
]
CHUNKED_SMALL = [  # session 24, part 3: grids from 0.73 to 1.45 waves of 132 SMs
    (f"chunk{lq}of8k-{h}/{hk}/{d}", 1, h, hk, lq, 8192, d, 512, 64)
    for lq in (192, 256, 384) for h, hk, d in ((32, 32, 128), (32, 4, 64))]
CHUNKED_VARIANTS = [("table", {}), ("tma v_ptr", dict(_force_path="prefill", _tma="v_ptr")),
                    ("tma shipped", dict(_force_path="prefill", _tma="shipped")),
                    ("tma v_chunk", dict(_force_path="prefill", _tma="v_chunk"))]


def host_us(fn, n=100):
    """Host microseconds per call, back to back (the device not waited for inside)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t0) * 1e6 / n
    torch.cuda.synchronize()
    return dt


def chunked(results, rounds, shapes=CHUNKED):
    """Session 24, part 2: the public call on chunked-prefill shapes (grids under
    TMA_MIN_WAVES, where the table runs the pointer kernel), the TMA kernel forced with
    pointer v, as shipped (the view at D <= 64) and with the view everywhere: whether the
    view moves the gate. Each variant's output is checked against the table's first."""
    from triton_impl import sliding_window_attention as swa
    from triton_impl.api import describe_call
    for name, B, Hq, Hkv, Lq, Lk, D, W, C in shapes:
        q, k, v = make(B, Hq, Hkv, Lk, D, torch.bfloat16, 11, C, False)
        q = q[:, :, -Lq:].contiguous()
        kw = dict(window_size=W, chunk_size=C)
        ref = swa(q, k, v, **kw)
        fns, runs = {}, {}
        for vn, knobs in CHUNKED_VARIANTS:
            o, lse = swa(q, k, v, **kw, **knobs)
            err = (o.float() - ref[0].float()).abs().max().item()
            assert err < 0.05 and torch.equal(torch.isinf(lse), torch.isinf(ref[1])), (name, vn, err)
            fns[vn] = (lambda kn=knobs: swa(q, k, v, **kw, **kn))
            runs[vn] = describe_call(q, k, v, **kw, **{kk.lstrip("_").replace("force_path", "path"): vv
                                                        for kk, vv in knobs.items()})
        flops = attention_flops(B, Hq, Lq, Lk, D, window_size=W, chunk_size=C)
        per = {vn: [] for vn in fns}
        fl = {vn: [] for vn in fns}
        hs = {vn: [] for vn in fns}
        names = list(fns)
        for rnd in range(rounds):
            for vn in (names if rnd % 2 == 0 else names[::-1]):
                per[vn].append(graph_us(fns[vn]))
                fl[vn].append(flushed_us(fns[vn]))
                hs[vn].append(host_us(fns[vn]))
        row = dict(shape=name, flops=flops, b2b=per, flushed=fl, host=hs, runs=runs, variants={})
        line = f"{name:26s}"
        for vn in names:
            d = [x - y for x, y in zip(per[vn], per[names[0]])]
            hd = [x - y for x, y in zip(hs[vn], hs[names[0]])]
            st = dict(med=statistics.median(per[vn]), med_fl=statistics.median(fl[vn]),
                      paired=statistics.median(d), slower=sum(x > 0 for x in d),
                      host=statistics.median(hs[vn]), host_paired=statistics.median(hd))
            row["variants"][vn] = st
            line += (f" | {vn} {st['med']:6.1f} ({st['paired']:+5.1f}) fl {st['med_fl']:6.1f}"
                     f" host {st['host']:5.1f} ({st['host_paired']:+5.1f})")
        results["chunked"].append(row)
        print(line, flush=True)
        print("   runs:", runs, flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--chunked", action="store_true", help="part 2 only: the chunked-prefill gate")
    ap.add_argument("--small", action="store_true", help="with --chunked: the grids under two waves")
    ap.add_argument("--lmk2", action="store_true",
                    help="session 36: the compile-time landmark column and FOLD against the shipped kernel")
    a = ap.parse_args(argv)
    t0 = time.time()
    results = dict(checks=[], times=[], chunked=[], device=torch.cuda.get_device_name())
    if a.chunked:
        chunked(results, a.rounds, CHUNKED_SMALL if a.small else CHUNKED)
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
        return 0
    ok = check(results, lmk2=a.lmk2)
    results["checks_ok"] = ok
    if not ok:
        print("checks failed: no timing", flush=True)
    else:
        for name, B, Hq, Hkv, L_, D, W, C in SHAPES:
            if a.lmk2 and C != 64:
                continue  # the compile-time column needs C == BLOCK_N (64)
            if time.time() - t0 > a.budget_s:
                print("budget reached", flush=True)
                break
            q, k, v = make(B, Hq, Hkv, L_, D, torch.bfloat16, 7, C, False)
            variants = (VARIANTS_LMK2 if a.lmk2 else VARIANTS)[D]
            fns = {vn: runner(q, k, v, W, C, 0, chunk, cfg, ex[0] if ex else None)[0]
                   for vn, chunk, cfg, *ex in variants}
            flops = attention_flops(B, Hq, L_, L_, D, window_size=W, chunk_size=C)
            per = {vn: [] for vn in fns}
            fl = {vn: [] for vn in fns}
            names = list(fns)
            for rnd in range(a.rounds):
                for vn in (names if rnd % 2 == 0 else names[::-1]):
                    per[vn].append(graph_us(fns[vn]))
                    fl[vn].append(flushed_us(fns[vn]))
            base = names[0]
            row = dict(shape=name, flops=flops, b2b=per, flushed=fl, variants={})
            line = f"{name:26s}"
            for vn in names:
                d = [x - y for x, y in zip(per[vn], per[base])]
                fd = [x - y for x, y in zip(fl[vn], fl[base])]
                st = dict(med=statistics.median(per[vn]), med_fl=statistics.median(fl[vn]),
                          paired=statistics.median(d), paired_fl=statistics.median(fd),
                          slower=sum(x > 0 for x in d), tflops_fl=flops / statistics.median(fl[vn]) / 1e6)
                row["variants"][vn] = st
                line += (f" | {vn} {st['med']:7.1f} ({100 * st['paired'] / row['variants'][base]['med']:+5.1f}%)"
                         f" fl {st['med_fl']:7.1f} {st['tflops_fl']:5.1f}TF")
            results["times"].append(row)
            print(line, flush=True)
            del fns, q, k, v
            torch.cuda.empty_cache()
    results["wall_s"] = time.time() - t0
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
