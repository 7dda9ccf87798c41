"""Host-time lab of both backends' wrappers (TileLang's with --tilelang), one device call.

    PYTHONUNBUFFERED=1 python tools/lab_host.py --out $OUT

Session 20: ``launch._RawLaunch``: the pointer kernels' direct launches enter
Triton 3.6's C launch below ``CudaLauncher.__call__``, and every direct launch
(the TMA one too) passes pointers as the ``data_ptr()`` ints read for the cache
key, which the C launch takes as they are (for a tensor it calls ``data_ptr()``
and ``cuPointerGetAttribute`` per argument). Variants, in one process,
interleaved per shape: the new path; ``ck.run`` with ints (``_RawLaunch.enabled
= False``); as at 811d4fe (``ck.run`` with the tensors: the lab makes ``_key``
return no ints); the new path again.

1. Checks (fresh random inputs, outputs poisoned, NaN in slots no query sees):
   the TMA kernel (key ranges from key 0 and past it, BHLD and BLHD, GQA,
   ``kv_start``, ``Dqk != Dv``), the pointer prefill kernel (bf16, fp16 one-loop,
   fp32, BLHD), split-KV decode (MHA, MQA, GQA with ``kv_start`` past 10^6):
   ``tools.gpu_triton.check_case`` (the first call through the JIT, the second
   through the direct launch, compared bit for bit, and ``conformance.verdict``
   against float64). Then the raw and TMA fast paths must have been taken; calls
   on new tensors equal the old path (tensors through ``ck.run`` and, for TMA,
   descriptors per call) bit for bit; a CUDA graph captured through the new path
   replays new data exactly (TMA prefill and decode).
2. Timing, per shape and variant: the bench's eager and host columns
   (``tools.bench.Timer.eager_host``: L2 flushed, device idle) and its
   kernel-only graph replay; host time per call back to back; the call's pieces.

Predicted before the run (written down with the change): per pointer argument
0.3-0.8 us less (``data_ptr()`` and ``cuPointerGetAttribute`` skipped), per
pointer-kernel launch another 0.5-1.5 us (``CudaLauncher.__call__`` skipped): decode
(two launches, 9 pointers) ``launch()`` 32 -> 24-29 us, the pointer prefill
(chunked, 5 pointers) 2-5 us less, TMA prefill (written as 3 pointers besides the
descriptors; there are 2, ``v`` and ``lse``) 1-2.5 us less; kernel times unchanged; outputs bit-identical.

Measured on the H200 (``bench_results/triton-lab20-host-ed03c79.json``, interleaved
medians of 25 rounds; block timings and checks also at e177f5a): checks 11 / 11, new
addresses and graph replays bit-exact; ``launch()`` as at 811d4fe -> new: decode 28.7 ->
24.3 us, chunked 16.6 -> 14.8, TMA prefill 23.8 -> 22.3 and 24.9 -> 22.1. See BENCHMARKS.md,
session 20.

Session 19 (``launch._TmaFast``, the TMA descriptors encoded once per ``(data_ptr,
shape, strides)``) measured at 4b2f26d with this lab's predecessor
(``bench_results/triton-lab19-host-4b2f26d.json``): ``launch()`` of the TMA prefill
53-103 us -> 19-37 us; see BENCHMARKS.md, session 19.

Session 21: ``--tilelang`` (:func:`tilelang_ab`) times TileLang's public call in three
variants (the plan cached, ``tilelang_impl.launch._plan``; computed per call; and the
kernels' own ``__call__`` as before 5773de3) after checking them bit-identical; measured at
e7fc8ad (``bench_results/tilelang-lab21-host-e7fc8ad.json``): decode 101.0 / 87.3 / 72.1 us,
chunked 65.4 / 56.5 / 45.5, prefill 50.6 / 45.6 / 39.4 and 52.8 / 48.4 / 38.9 (interleaved
medians). ``--plan-micro`` (:func:`plan_micro`) times the plan alone on the device host
(``tilelang-lab21-planmicro-*.{json,txt}``). See BENCHMARKS.md, session 21.

Session 22: ``--scratch`` (:func:`scratch_ab`) times both backends' split-KV decode with
the partial states from the scratch cached per stream (``reference.device.scratch``; per thread
too since e7ba038, after this lab ran) against
two earlier schemes: TileLang's two ``torch.empty`` per call, and one buffer per device
(Triton's workspace before, which concurrent streams shared). Measured at 2f53c4b
(``bench_results/scratch-lab22-host-2f53c4b.json``, paired medians): TileLang's decode 7.4 us
less than with per-call allocation (1.8 more than with the device buffer), Triton's 2.6-2.8 us
more than with the device buffer; at b9c5ac5 on a host half as fast
(``scratch-lab22-host-b9c5ac5.json``) TileLang 14.5 less, Triton 1.0-2.5 more. See BENCHMARKS.md, session 22.

Session 23: ``--scratch`` adds a Triton split call that reads its stream once
(``launch.PASS_STREAM``) and the device type cached per device
(``reference.device.device_type``), each alone and both undone (``as a215cfe``), and times
the chunked prefill too; every timing carries its paired median against the first variant
(:func:`paired_stats`: median, bootstrap interval, rounds slower). Measured at 8e62990
(``bench_results/scratch-lab23-host-8e62990.json``, 25 rounds, the paired statistics computed
afterwards): ``as a215cfe`` costs Triton's B8 GQA decode 2.7 us and its chunked prefill 1.7,
TileLang's decode 3.1 and chunked 1.8; the stream read once (+0.5-0.6 us on Triton's decode)
and Triton's B1 decode row are not resolved (intervals holding 0). See BENCHMARKS.md,
session 23.

Writes ``lab_host.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import reference  # noqa: E402
from tools import gpu_triton as G  # noqa: E402
from tools._common import capture_graph  # noqa: E402
from tools.bench import Timer  # noqa: E402
from triton_impl import launch as L  # noqa: E402
from triton_impl import sliding_window_attention as swa  # noqa: E402

DEV = "cuda"
RES: dict = {}


class Counter:
    """Counts the calls of :meth:`launch._TmaFast.launch` (``n``: the TMA fast path
    taken) and of :meth:`launch._RawLaunch.launch` (``raw``: every raw C launch, the
    TMA ones included), once :meth:`install` (``main``) has wrapped them."""

    n = 0
    raw = 0

    @staticmethod
    def _counting(cls, attr):
        orig = cls.launch

        def wrap(self, *a):
            setattr(Counter, attr, getattr(Counter, attr) + 1)
            return orig(self, *a)
        cls.launch = wrap

    @staticmethod
    def install():
        Counter._counting(L._TmaFast, "n")
        Counter._counting(L._RawLaunch, "raw")


ORIG_KEY = L._Kernel._key


def _key_no_ints(static, tensors, ints):
    """``_Kernel._key`` as at 811d4fe: no ``data_ptr()`` ints, so the tensors travel (the
    tensors stand where the ints would: the direct launches pass them as they are, as
    811d4fe did; since de5f031 ``_TmaFast``'s launch has no branch for ``None`` there,
    and session 21's first run of this lab, which returned ``None``, turned the TMA fast
    path off for the rest of the process)."""
    return ORIG_KEY(static, tensors, ints)[0], list(tensors)


class Old:
    """The direct launches as at 811d4fe (tensors through ``ck.run``) while in effect;
    ``tma_too``: the TMA descriptors built and encoded per call as well."""

    def __init__(self, tma_too=False):
        self.tma_too = tma_too

    def __enter__(self):
        # the switches as found (a fast path that turned itself off mid-run stays off)
        self.saved = (L._RawLaunch.enabled, L._TmaFast.enabled)
        L._RawLaunch.enabled = False
        L._Kernel._key = staticmethod(_key_no_ints)
        if self.tma_too:
            L._TmaFast.enabled = False

    def __exit__(self, *exc):
        L._RawLaunch.enabled, L._TmaFast.enabled = self.saved
        L._Kernel._key = staticmethod(ORIG_KEY)


def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def same(a, b):
    return bool(torch.equal(bits(a[0]), bits(b[0])) and torch.equal(bits(a[1]), bits(b[1])))


def checks():
    bf, fp = torch.bfloat16, torch.float16
    base = dict(W=200, C=64, nan_invisible=True, tma="v_ptr", path="prefill")
    cases = [
        dict(base, B=2, Hq=4, Hkv=2, Lq=600, Lk=700, Dqk=128, Dv=128, dtype=bf),            # j_min = 0
        dict(base, B=2, Hq=4, Hkv=2, Lq=300, Lk=1000, Dqk=128, Dv=128, dtype=bf),           # j_min = 448
        dict(base, B=1, Hq=8, Hkv=2, Lq=300, Lk=1000, Dqk=64, Dv=64, dtype=fp, kv_start=5, blhd=True),
        dict(base, B=2, Hq=6, Hkv=3, Lq=333, Lk=1200, Dqk=96, Dv=64, dtype=bf, kv_start=70, blhd=True),
        dict(base, B=1, Hq=4, Hkv=4, Lq=1000, Lk=1000, Dqk=128, Dv=128, dtype=fp, kv_start=3, W=37, C=16),
    ]
    ptr = dict(base, tma=False)
    n_tma = len(cases)
    cases += [  # the pointer kernels: prefill, then split-KV decode
        dict(ptr, B=2, Hq=4, Hkv=2, Lq=600, Lk=700, Dqk=128, Dv=128, dtype=bf, phases=False),
        dict(ptr, B=2, Hq=6, Hkv=3, Lq=333, Lk=1200, Dqk=96, Dv=64, dtype=fp, kv_start=70, blhd=True),
        dict(ptr, B=1, Hq=4, Hkv=2, Lq=300, Lk=1000, Dqk=64, Dv=64, dtype=torch.float32, kv_start=5),
        dict(base, B=1, Hq=8, Hkv=8, Lq=1, Lk=5000, Dqk=128, Dv=128, dtype=bf, path="splitkv", tma=None),
        dict(base, B=1, Hq=8, Hkv=1, Lq=1, Lk=5000, Dqk=128, Dv=128, dtype=bf, path=None, tma=None),
        dict(base, B=2, Hq=8, Hkv=2, Lq=3, Lk=1500, Dqk=64, Dv=64, dtype=fp, path="splitkv", tma=None,
             kv_start=10 ** 6 + 3, blhd=True),
    ]
    rows = RES.setdefault("checks", [])
    before, raw_before = Counter.n, Counter.raw
    for c in cases:
        try:
            G.check_case(c, rows)
        except Exception as e:
            traceback.print_exc()
            rows.append(dict(case={k: str(v) for k, v in c.items()}, ok=False, error=f"{type(e).__name__}: {e}"[:300]))
    fast_calls, raw_calls = Counter.n - before, Counter.raw - raw_before
    RES["diagnosis"] = diagnose()
    RES["fast_calls_in_checks"], RES["raw_calls_in_checks"] = fast_calls, raw_calls
    # each case's second call takes the fast path: TMA cases one raw launch, pointer
    # prefill one, split-KV decode two (split and combine)
    ok = (all(r["ok"] for r in rows) and fast_calls >= n_tma and raw_calls >= len(cases) + 3
          and not L.FAST_PATH_OFF)
    print(f"checks: {sum(r['ok'] for r in rows)}/{len(rows)} ok, TMA fast launches {fast_calls}, raw launches "
          f"{raw_calls}, fast paths off: {L.FAST_PATH_OFF}", flush=True)

    # New tensors each call (new addresses, the encodings' cache keys), fast against slow.
    kw = dict(window_size=200, chunk_size=64, _tma="v_ptr", _force_path="prefill")
    reuse = []
    for i in range(9):
        Lq, Lk = ((300, 1000), (1000, 1000), (1, 3000))[i % 3]
        q, k, v = G.make(1, 8, 2, Lq, Lk, 128, 128, torch.bfloat16, blhd=bool(i % 2), seed=50 + i)
        kwi = kw if Lq > 1 else dict(window_size=200, chunk_size=64)
        n0 = Counter.raw
        fast = swa(q, k, v, **kwi)
        took = Counter.raw - n0
        with Old(tma_too=True):
            slow = swa(q, k, v, **kwi)
        reuse.append(dict(i=i, Lq=Lq, Lk=Lk, raw=took, equal=same(fast, slow)))
    RES["reuse"] = reuse
    ok = ok and all(r["equal"] for r in reuse) and sum(r["raw"] > 0 for r in reuse) >= 8
    print(f"reuse: {reuse}", flush=True)

    # CUDA graphs captured through the new path replay new data exactly: the TMA prefill
    # (its descriptors' fast path) and a decode (split and combine, raw launches)
    dkw = dict(window_size=512, chunk_size=64)
    for what, shape, kwg, attr, ctx in (("graph", (1, 8, 2, 300, 1000), kw, "n", Variant("raw, ints")),
                                        ("graph_decode", (2, 8, 2, 1, 6000), dkw, "raw", Old())):
        q, k, v = G.make(*shape, 128, 128, torch.bfloat16, seed=7)
        swa(q, k, v, **kwg)
        n0 = getattr(Counter, attr)
        g, out = capture_graph(lambda: swa(q, k, v, **kwg))
        captured = getattr(Counter, attr) - n0
        q2, k2, v2 = G.make(*shape, 128, 128, torch.bfloat16, seed=8)
        q.copy_(q2), k.copy_(k2), v.copy_(v2)
        g.replay()
        torch.cuda.synchronize()
        with ctx:  # the reference call: the new path for TMA (as before), the old one for decode
            want = swa(q2, k2, v2, **kwg)
        RES[what] = dict(fast_calls=captured, equal=same(out, want))
        ok = ok and RES[what]["equal"] and captured >= (1 if attr == "n" else 2)
    print(f"graph: {RES['graph']}, decode {RES['graph_decode']}", flush=True)
    RES["fast_path_off"] = list(L.FAST_PATH_OFF)
    ok = ok and not L.FAST_PATH_OFF
    RES["checks_ok"] = ok
    return ok


def diagnose():
    """Why ``_TmaFast.of`` accepts or refuses the compiled TMA kernels seen so far."""
    import triton
    from triton.backends.nvidia import driver as nv
    out = dict(no_launch_hooks=L._no_launch_hooks(), tma_cache=[repr(v) for v in L._FWD_TMA.tma_cache.values()],
               make_arg_argcount=nv.make_tensordesc_arg.__code__.co_argcount,
               base_format=getattr(nv, "_BASE_ARGS_FORMAT", None),
               enter_hook=repr(triton.knobs.runtime.launch_enter_hook))
    for ck, _ in list(L._FWD_TMA.cache.values())[:1]:
        run = ck.run
        inner = getattr(run, "launch", None)
        code = getattr(inner, "__code__", None)
        out.update(run_type=type(run).__name__, inner=repr(inner),
                   freevars=list(code.co_freevars) if code else None,
                   metas=repr(dict(zip(code.co_freevars, (c.cell_contents for c in inner.__closure__ or ())))
                              .get("tensordesc_meta")) if code else None,
                   scratch=(getattr(run, "global_scratch_size", "?"), getattr(run, "profile_scratch_size", "?")),
                   num_ctas=getattr(run, "num_ctas", "?"), of=repr(L._TmaFast.of(ck, 4)))
    print(f"diagnosis: {out}", flush=True)
    return out


SHAPES = {
    "mha D128 L8K (tma)": (1, 32, 32, 8192, 8192, 128),
    "mha D128 L16K (tma)": (1, 32, 32, 16384, 16384, 128),
    "gqa32/4 D64 L8K (tma)": (1, 32, 4, 8192, 8192, 64),
    "batch4x4K D64 (tma)": (4, 32, 4, 4096, 4096, 64),
    "chunk 512/8K D128": (1, 32, 32, 512, 8192, 128),
    "decode B1 8K": (1, 32, 32, 1, 8192, 128),
}


def back_to_back(fn, args, n=100, rounds=5):
    """Median over ``rounds`` of ``gpu_triton.host_time`` (host microseconds per call)."""
    return statistics.median(G.host_time(fn, args, n) for _ in range(rounds))


VARIANTS = ("raw, ints", "ck.run, ints", "as at 811d4fe")


class Variant:
    """One of :data:`VARIANTS` in effect (a context)."""

    def __init__(self, name):
        self.name, self.old = name, Old() if name == "as at 811d4fe" else None

    def __enter__(self):
        self.saved = L._RawLaunch.enabled
        if self.old:
            self.old.__enter__()
        elif self.name == "ck.run, ints":
            L._RawLaunch.enabled = False

    def __exit__(self, *exc):
        if self.old:
            self.old.__exit__()
        L._RawLaunch.enabled = self.saved


def timings():
    timer = Timer(DEV, 30)
    kw = dict(window_size=512, chunk_size=64)
    rows = RES.setdefault("timings", [])
    for name, (B, Hq, Hkv, Lq, Lk, D) in SHAPES.items():
        sets = [G.make(B, Hq, Hkv, Lq, Lk, D, D, torch.bfloat16, seed=200 + i) for i in range(3)]
        call = lambda q, k, v: swa(q, k, v, **kw)  # noqa: E731
        for variant in (*VARIANTS, "raw, ints again"):
            try:
                ctx = Variant(variant.replace(" again", ""))
                ctx.__enter__()
                call(*sets[0])
                torch.cuda.synchronize()
                ms, why = timer.graph(call, sets)
                eager_ms, host_us = timer.eager_host(call, sets)
                b2b = back_to_back(call, sets[0], n=20 if Lq >= 8192 else 100)
                p = reference.check_inputs(*sets[0], **kw)
                o, lse = p.new_outputs()
                parts = dict(check_inputs=back_to_back(lambda: reference.check_inputs(*sets[0], **kw), ()),
                             new_outputs=back_to_back(lambda: p.new_outputs(), ()),
                             launch=back_to_back(lambda: L.launch(p, *sets[0], o, lse), (), n=20 if Lq >= 8192 else 100))
                kern = ms * 1e3 if ms is not None else float("nan")
                row = dict(shape=name, variant=variant, kernel_us=kern, eager_us=eager_ms * 1e3, host_us=host_us,
                           eager_minus_kernel_us=eager_ms * 1e3 - kern, host_b2b_us=b2b, parts=parts,
                           graph_note=why)
            except Exception as e:
                traceback.print_exc()
                row = dict(shape=name, variant=variant, error=f"{type(e).__name__}: {e}"[:300])
            finally:
                ctx.__exit__()
            rows.append(row)
            if "error" not in row:
                print(f"  {name:24s} {variant:22s} kern {row['kernel_us']:7.1f} eager {row['eager_us']:7.1f} "
                      f"host {row['host_us']:6.1f} e-k {row['eager_minus_kernel_us']:6.1f} b2b {b2b:6.1f} "
                      + " ".join(f"{k}={v:.1f}" for k, v in parts.items()), flush=True)
        sets = None  # free them (closures above hold the cell)
        torch.cuda.empty_cache()


def _rounds(variants, enter, measures: dict, n: int, rounds: int):
    """Host microseconds per call, back to back (``gpu_triton.host_time``, ``n`` calls), of
    each ``measures`` function under each of ``variants`` (``enter(var)``: a context putting
    it in effect): every round times each variant once, in turn, the order reversed every
    other round, after one warm call of each. Returns ``(raw, stats)``: per variant and
    measure the list over rounds, its median, 25th percentile and minimum, and ``paired``
    (:func:`paired_stats` against the first variant: the host's drift between rounds
    cancels)."""
    raw = {var: {what: [] for what in measures} for var in variants}
    for var in variants:
        with enter(var):
            for fn in measures.values():
                fn()
    torch.cuda.synchronize()
    for r in range(rounds):
        for var in (variants if r % 2 == 0 else variants[::-1]):
            with enter(var):
                for what, fn in measures.items():
                    raw[var][what].append(G.host_time(fn, (), n))
    first = raw[variants[0]]
    stats = {var: {what: dict(median=statistics.median(xs), p25=sorted(xs)[len(xs) // 4], min=min(xs),
                              paired=paired_stats(xs, first[what]))
                   for what, xs in per.items()} for var, per in raw.items()}
    return raw, stats


def paired_stats(xs: list, base: list, resamples: int = 2000) -> dict:
    """A variant against the base timed in the same round, over rounds: ``median`` of
    ``x - b``, ``lo`` / ``hi`` the 2.5th / 97.5th percentiles of that median over
    ``resamples`` bootstrap resamples of the rounds (seeded: the same data gives the same
    interval), ``slower`` the rounds in which the variant took longer. A difference whose
    interval holds 0 is not resolved by the run."""
    import random

    d = [x - b for x, b in zip(xs, base, strict=True)]
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(d, k=len(d))) for _ in range(resamples))
    return dict(median=statistics.median(d), lo=meds[int(0.025 * resamples)],
                hi=meds[int(0.975 * resamples) - 1], slower=sum(x > 0 for x in d), rounds=len(d))


def _timed_call(timing: dict, key: str, title: str, variants, enter, call, n: int, rounds: int) -> None:
    """:func:`_rounds` of the public ``call`` alone, kept as ``timing[key]`` and printed."""
    got, st = _rounds(variants, enter, dict(call=call), n, rounds)
    timing[key] = dict(rounds=rounds, n=n, stats=st, raw=got)
    print(f"  {title} {key:34s} " + "  ".join(
        f"{var}: call {x['call']['median']:.1f} (min {x['call']['min']:.1f}; paired {_paired_text(x['call'])})"
        for var, x in st.items()), flush=True)


def _paired_text(stat: dict) -> str:
    pr = stat["paired"]
    return f"{pr['median']:+.2f} [{pr['lo']:+.2f}, {pr['hi']:+.2f}] slower {pr['slower']}/{pr['rounds']}"


def interleaved(rounds=25):
    """The host noise of one variant timed after another (session 20's first run: check_inputs
    5-10 us between blocks) hides a few microseconds: here every round times each variant
    once, in turn, and the medians over rounds are compared. Host microseconds per call,
    back to back: ``launch()`` alone and the public call."""
    kw = dict(window_size=512, chunk_size=64)
    out = RES.setdefault("interleaved", {})
    for name in ("decode B1 8K", "chunk 512/8K D128", "gqa32/4 D64 L8K (tma)", "mha D128 L8K (tma)"):
        B, Hq, Hkv, Lq, Lk, D = SHAPES[name]
        q, k, v = G.make(B, Hq, Hkv, Lq, Lk, D, D, torch.bfloat16, seed=300)
        p = reference.check_inputs(q, k, v, **kw)
        o, lse = p.new_outputs()
        n = 200 if Lq < 8192 else 20
        got, row = _rounds(VARIANTS, Variant, dict(launch=lambda: L.launch(p, q, k, v, o, lse),
                                                   call=lambda: swa(q, k, v, **kw)), n, rounds)
        out[name] = dict(rounds=rounds, n=n, stats=row, raw=got)
        print(f"  interleaved {name:22s} " + "  ".join(
            f"{var}: launch {row[var]['launch']['median']:.1f} (min {row[var]['launch']['min']:.1f}) "
            f"call {row[var]['call']['median']:.1f} (min {row[var]['call']['min']:.1f})" for var in VARIANTS),
            flush=True)
        q = k = v = o = lse = None  # free them (closures above hold the cells)
        torch.cuda.empty_cache()


def tilelang_ab(rounds=25):
    """TileLang's host path, three variants: ``new`` (the tvm-ffi executable called
    directly, ``tilelang_impl.launch._call``, session 20; the launch plan cached by problem,
    ``launch._plan``, session 21); ``plans uncached`` (the plan computed per call, as at
    de5f031: ``launch._plan`` replaced by ``launch._tc_choice``); ``kernel __call__`` (that,
    and the kernels' own ``__call__``, ``FAST_CALL = False``: as before 5773de3). Checks
    (the variants bit-identical on fresh inputs with NaN in slots no query sees, each within
    the suite's bound of float64; the executable path taken; a decode captured in a CUDA
    graph through it replays new data exactly), then host microseconds per public call,
    back to back, interleaved as :func:`interleaved`. Predicted for the executable (written
    with it): 2-5 us less per launch, so 2-5 us less per prefill call and 4-10 us per split
    decode call (two launches). Predicted for the plan cache (session 21, written with it):
    ``_tc_choice`` took 2.8-5.1 us and the cached lookup 1.0-1.7 us on the CPU machine,
    so 1.5-4 us less per public call (decode the most), outputs bit-identical."""
    from conformance import verdict
    from conformance.cases import poison_unseen
    from tilelang_impl import launch as TLL
    from tilelang_impl import sliding_window_attention as tl_swa

    cached_plan = TLL._plan
    variants = ("new", "plans uncached", "kernel __call__")

    @contextlib.contextmanager
    def fast_call(var):  # one of ``variants``
        TLL.FAST_CALL = var != "kernel __call__"
        TLL._plan = cached_plan if var == "new" else TLL._tc_choice
        try:
            yield
        finally:
            TLL.FAST_CALL, TLL._plan = True, cached_plan

    out = RES.setdefault("tilelang", {})
    bf, fp, f32 = torch.bfloat16, torch.float16, torch.float32
    cases = [  # (B, Hq, Hkv, Lq, Lk, Dqk, Dv, dtype, blhd, kw)
        (1, 8, 8, 1, 5000, 128, 128, bf, False, dict(window_size=512, chunk_size=64)),           # split decode
        (2, 8, 2, 3, 1500, 64, 64, fp, True, dict(window_size=200, chunk_size=64, kv_start=10 ** 6 + 3)),
        (2, 4, 2, 600, 700, 128, 128, bf, False, dict(window_size=200, chunk_size=64)),          # prefill
        (2, 6, 3, 333, 1200, 96, 64, fp, True, dict(window_size=100, chunk_size=16, kv_start=70)),
        (1, 4, 2, 300, 1000, 64, 64, f32, False, dict(window_size=200, chunk_size=64, kv_start=5)),
    ]
    rows, ok = [], True
    for i, (B, Hq, Hkv, Lq, Lk, Dqk, Dv, dt, blhd, kw) in enumerate(cases):
        q, k, v = G.make(B, Hq, Hkv, Lq, Lk, Dqk, Dv, dt, blhd=blhd, seed=400 + i)
        poison_unseen(k, v, Lq, kw)
        got = {}
        for var in variants:
            with fast_call(var):
                got[var] = tl_swa(q, k, v, **kw)
        torch.cuda.synchronize()
        fast = got["new"]
        vd = verdict.judge(*fast, verdict.expected(q, k, v, kw))
        row = dict(case=[B, Hq, Hkv, Lq, Lk, Dqk, Dv, str(dt), blhd, kw],
                   equal=all(same(fast, got[var]) for var in variants[1:]), verdict=vd.status, ratio=vd.ratio)
        rows.append(row)
        ok = ok and row["equal"] and vd.status == verdict.PASS
        print(f"  tilelang check {row}", flush=True)
    exes = sum(1 for ker, fn in TLL._calls.items() if fn is not ker)
    out.update(checks=rows, executables=exes, calls=len(TLL._calls), plans=len(TLL._PLANS),
               torch_dlpack_c_exchange=hasattr(torch.Tensor, "__dlpack_c_exchange_api__"))
    ok = ok and exes >= 4  # prefill, split, combine, fp32 at least
    # a decode captured through the executables replays new data exactly
    dkw = dict(window_size=512, chunk_size=64)
    q, k, v = G.make(2, 8, 2, 1, 6000, 128, 128, torch.bfloat16, seed=11)
    tl_swa(q, k, v, **dkw)
    g, o_g = capture_graph(lambda: tl_swa(q, k, v, **dkw))
    q2, k2, v2 = G.make(2, 8, 2, 1, 6000, 128, 128, torch.bfloat16, seed=12)
    q.copy_(q2), k.copy_(k2), v.copy_(v2)
    g.replay()
    torch.cuda.synchronize()
    with fast_call("kernel __call__"):
        want = tl_swa(q2, k2, v2, **dkw)
    out["graph_equal"] = same(o_g, want)
    ok = ok and out["graph_equal"]
    out["checks_ok"] = ok
    print(f"tilelang checks: {sum(r['equal'] and r['verdict'] == verdict.PASS for r in rows)}/{len(rows)}, "
          f"executables {exes} of {len(TLL._calls)}, plans {out['plans']}, graph {out['graph_equal']}, "
          f"torch DLPack C exchange {out['torch_dlpack_c_exchange']}", flush=True)
    kw = dict(window_size=512, chunk_size=64)
    timing = out.setdefault("interleaved", {})
    for name in ("decode B1 8K", "chunk 512/8K D128", "gqa32/4 D64 L8K (tma)", "mha D128 L8K (tma)"):
        B, Hq, Hkv, Lq, Lk, D = SHAPES[name]
        q, k, v = G.make(B, Hq, Hkv, Lq, Lk, D, D, torch.bfloat16, seed=300)
        n = 200 if Lq < 8192 else 20
        _timed_call(timing, name, "tilelang interleaved", variants, fast_call, lambda: tl_swa(q, k, v, **kw),
                    n, rounds)
        q = k = v = None  # free them (closures above hold the cells)
        torch.cuda.empty_cache()
    return ok


def scratch_ab(rounds=25):
    """Split-KV scratch, three variants in both backends: ``stream scratch``
    (``reference.device.scratch``, shipped: one cached buffer per stream, per thread and
    stream since e7ba038, new tensors under capture); ``per-call alloc`` (two ``torch.empty`` per call: TileLang as before);
    ``device buffer`` (views memoised by shape, cut from a buffer made for that shape tuple,
    with no stream, thread or capture query: the cost of Triton's workspace before, one per
    device, which two streams shared). Checks
    the variants bit-identical on fresh split-KV decode inputs, within the suite's bound;
    then host microseconds per public call, back to back, interleaved as :func:`interleaved`.
    Predicted (written with the change): TileLang decode 4-12 us less than per-call alloc
    (two allocations at 3-6 us each on the device host, less 1-2 us for the stream and capture
    queries and two dict lookups); Triton 0.5-2 us more than the device buffer, 4-12 us less
    than per-call alloc; kernels and outputs unchanged.

    Session 23 adds three variants, the shipped call being ``stream scratch``: ``stream read
    thrice`` (``launch.PASS_STREAM`` off: Triton's split path as at a215cfe, the scratch and
    both launches each reading the current stream; TileLang's call unchanged by it); ``type
    per read`` (``reference.device.device_type`` replaced by ``device.type``, read anew each
    time, in every module that calls it); ``as a215cfe`` (both). Predicted: Triton's split
    decode 0.3-1.0 us less with the stream passed (two reads through Triton's driver object,
    0.2-0.5 us each); the cached type 0.5-2 us less for either backend (five or six reads at
    0.2-0.3 us on the CI machine, more on the device host); ``as a215cfe`` - ``stream
    scratch`` 0.8-3 us for Triton; and, timed alone (:func:`_scratch_micro`), ``scratch``
    with the stream given 0.1-0.3 us under ``scratch`` reading it, the thread id of the key
    (e7ba038) under 0.1 us."""
    from conformance import verdict
    from conformance.cases import poison_unseen
    from reference import device as D
    from tilelang_impl import launch as TLL
    from tilelang_impl import sliding_window_attention as tl_swa

    f32 = torch.float32
    per_dev: dict = {}
    shipped_type = D.device_type  # restored after each variant

    def device_buffer(device, shapes, stream=None):
        views = per_dev.get(shapes)
        if views is None:
            numels, starts, end = D._layout(shapes)
            views = per_dev[shapes] = D._cut(torch.empty(end, dtype=f32, device=device), shapes, numels, starts)
        return views

    schemes = {"stream scratch": D.scratch,
               "stream read thrice": D.scratch,
               "type per read": D.scratch,
               "as a215cfe": D.scratch,
               "per-call alloc": lambda device, shapes, stream=None: tuple(
                   torch.empty(sh, dtype=f32, device=device) for sh in shapes),
               "device buffer": device_buffer}
    variants = tuple(schemes)
    from tilelang_impl import api as TLA
    from triton_impl import api as TA
    typed = (D, TA, L, TLA, TLL)  # the modules that call device_type

    def type_per_read(device):
        return device.type

    @contextlib.contextmanager
    def scheme(var):
        L.scratch = TLL.scratch = schemes[var]
        L.PASS_STREAM = var not in ("stream read thrice", "as a215cfe")
        for m in typed:
            m.device_type = type_per_read if var in ("type per read", "as a215cfe") else shipped_type
        try:
            yield
        finally:
            L.scratch = TLL.scratch = D.scratch
            L.PASS_STREAM = True
            for m in typed:
                m.device_type = shipped_type

    out = RES.setdefault("scratch", {})
    bf = torch.bfloat16
    cases = [  # (B, Hq, Hkv, Lq, Lk, D, kw): split-KV in both backends
        (1, 32, 32, 1, 8192, 128, dict(window_size=512, chunk_size=64)),
        (2, 8, 8, 1, 5000, 128, dict(window_size=900, chunk_size=16, kv_start=10 ** 6 + 3)),
        (1, 8, 8, 4, 6000, 96, dict(window_size=700, chunk_size=32, expand_to_chunk=False)),
    ]
    rows, ok = [], True
    for i, (B, Hq, Hkv, Lq, Lk, Dh, kw) in enumerate(cases):
        q, k, v = G.make(B, Hq, Hkv, Lq, Lk, Dh, Dh, bf, seed=500 + i)
        poison_unseen(k, v, Lq, kw)
        for name, fn in (("triton", swa), ("tilelang", tl_swa)):
            got = {}
            for var in variants:
                with scheme(var):
                    got[var] = fn(q, k, v, **kw)
            torch.cuda.synchronize()
            vd = verdict.judge(*got[variants[0]], verdict.expected(q, k, v, kw))
            row = dict(backend=name, case=[B, Hq, Hkv, Lq, Lk, Dh, kw],
                       split=(L._make_plan(reference.check_inputs(q, k, v, **kw), None, None, None, None).path
                              == "splitkv") if name == "triton" else "+combine" in TLL.describe(
                           reference.check_inputs(q, k, v, **kw)),
                       equal=all(same(got[variants[0]], got[var]) for var in variants[1:]),
                       verdict=vd.status, ratio=vd.ratio)
            rows.append(row)
            ok = ok and row["equal"] and row["split"] and vd.status == verdict.PASS
            print(f"  scratch check {row}", flush=True)
    out.update(checks=rows, checks_ok=ok)
    kw = dict(window_size=512, chunk_size=64)
    timing = out.setdefault("interleaved", {})
    for label, (B, Hq, Hkv, Lq, Lk, Dh) in (("decode B1 8K", SHAPES["decode B1 8K"]),
                                            ("decode B8 GQA32/4 D64 32K", (8, 32, 4, 1, 32768, 64)),
                                            ("chunk 512/8K D128", SHAPES["chunk 512/8K D128"])):
        q, k, v = G.make(B, Hq, Hkv, Lq, Lk, Dh, Dh, bf, seed=300)
        # TileLang's split-KV serves Dv of SPLIT_DV; the chunked shape is prefill in both
        both = Dh in TLL.SPLIT_DV or Lq > 1
        backends = (("triton", swa), ("tilelang", tl_swa)) if both else (("triton", swa),)
        for name, fn in backends:
            _timed_call(timing, f"{name} {label}", "scratch interleaved", variants, scheme,
                        lambda: fn(q, k, v, **kw), 200, rounds)
        q = k = v = None  # free them (closures above hold the cells)
        torch.cuda.empty_cache()
    _scratch_micro(out)
    return ok


def _alone_us(fn, rounds: int, n: int) -> float:
    """Host microseconds of ``fn`` timed alone: the median of ``rounds`` timeit loops of ``n`` calls."""
    import timeit

    return statistics.median(timeit.timeit(fn, number=n) / n * 1e6 for _ in range(rounds))


def _scratch_micro(out: dict, rounds=7, n=20000) -> None:
    """Host microseconds, timed alone (medians of ``rounds`` timeit loops of ``n`` calls), of
    what a split call's stream and scratch cost: the stream read as Triton's launches read it
    (``launch._stream``) and as the scratch does (``torch._C._cuda_getCurrentRawStream``),
    the thread id, a cached ``scratch`` with the stream given and reading it, a device's type
    read and looked up, and the current-device query of ``made_current``."""
    import threading

    from reference import device as D

    idx = torch.cuda.current_device()
    dev = torch.device(DEV, idx)  # with its index, as a call's tensors have it
    shapes = ((1, 32, 4, 1, 128), (1, 32, 4, 1))
    stream = L._stream(idx)
    D.scratch(dev, shapes, stream)

    def us(fn):
        return _alone_us(fn, rounds, n)

    row = {"launch._stream": us(lambda: L._stream(idx)),
           "raw stream read": us(lambda: D._raw_stream(idx)),
           "threading.get_ident": us(threading.get_ident),
           "scratch, stream given": us(lambda: D.scratch(dev, shapes, stream)),
           "scratch, stream read": us(lambda: D.scratch(dev, shapes)),
           "device.type": us(lambda: dev.type),
           "device_type(device)": us(lambda: D.device_type(dev)),
           "torch.cuda.current_device": us(torch.cuda.current_device),
           "empty lambda": us(lambda: None)}
    out["micro_us"] = row
    print("  scratch micro (us) " + "  ".join(f"{k}: {v:.3f}" for k, v in row.items()), flush=True)


def plan_micro(rounds=7, n=5000):
    """Host microseconds of TileLang's launch plan on this host, for the interleaved
    shapes: computed (``launch._tc_choice``) and cached (``launch._plan``), with
    ``reference.check_inputs`` on the same CUDA tensors and on CPU copies of them as
    a yardstick of the host's Python speed against the CPU machine where the plan cache's
    prediction was made; then each right after a CUDA launch (a ``fill_`` of 1024 floats),
    to see whether a plan costs more between launches than in a loop of its own (medians
    of ``rounds`` timeit loops of ``n`` calls)."""
    from tilelang_impl import launch as TLL

    kw = dict(window_size=512, chunk_size=64)
    out = RES.setdefault("plan_micro", {})

    def us(fn):
        return _alone_us(fn, rounds, n)

    for name in ("decode B1 8K", "chunk 512/8K D128", "gqa32/4 D64 L8K (tma)", "mha D128 L8K (tma)"):
        B, Hq, Hkv, Lq, Lk, D = SHAPES[name]
        q, k, v = G.make(B, Hq, Hkv, Lq, Lk, D, D, torch.bfloat16, seed=500)
        p = reference.check_inputs(q, k, v, **kw)
        _, C, _, _, sl2 = TLL.scalars(p)
        qc, kc, vc = q[:, :, :8].cpu(), k[:, :, :8].cpu(), v[:, :, :8].cpu()
        x = torch.empty(1024, device=DEV)

        def after_fill(fn):  # fn right after a CUDA launch (the driver's code and data in the caches)
            def loop():
                x.fill_(1.0)
                fn()
            return loop

        def choice():
            return TLL._tc_choice(p, False, False, C, sl2)

        def plan():
            return TLL._plan(p, False, False, C, sl2)

        row = dict(tc_choice=us(choice), plan=us(plan),
                   check_inputs_cuda=us(lambda: reference.check_inputs(q, k, v, **kw)),
                   check_inputs_cpu=us(lambda: reference.check_inputs(qc, kc, vc, **kw)),
                   fill=us(lambda: x.fill_(1.0)), fill_tc_choice=us(after_fill(choice)),
                   fill_plan=us(after_fill(plan)))
        torch.cuda.synchronize()
        out[name] = row
        print(f"  plan micro {name:22s} " + " ".join(f"{k} {x:.2f}" for k, x in row.items()), flush=True)
        q = k = v = None  # free them (closures above hold the cells)
    torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", ".out"))
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--interleaved-only", action="store_true", help="checks, then the interleaved host timing only")
    mode.add_argument("--tilelang", action="store_true", help="TileLang's host path only (tilelang_ab)")
    mode.add_argument("--plan-micro", action="store_true", help="TileLang's launch plan timed alone (plan_micro)")
    mode.add_argument("--scratch", action="store_true", help="split-KV scratch schemes, both backends (scratch_ab)")
    ap.add_argument("--rounds", type=int, default=25, help="interleaved rounds of the --tilelang / --scratch timings")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    G.DEV = DEV
    Counter.install()
    import triton
    RES.update(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    path = os.path.join(args.out, "lab_host.json")
    t0 = time.time()
    if args.plan_micro:
        plan_micro()
        with open(path, "w") as f:
            json.dump(RES, f, indent=1, default=str)
        return 0
    if args.tilelang or args.scratch:
        ok = tilelang_ab(args.rounds) if args.tilelang else scratch_ab(args.rounds)
        RES["wall_s"] = time.time() - t0
        with open(path, "w") as f:
            json.dump(RES, f, indent=1, default=str)
        print(f"{'tilelang' if args.tilelang else 'scratch'} checks ok: {ok}; {time.time() - t0:.0f} s", flush=True)
        return 0 if ok else 1
    ok = checks()
    with open(path, "w") as f:
        json.dump(RES, f, indent=1, default=str)
    if not args.interleaved_only:
        timings()
    interleaved()
    RES["fast_path_off_end"] = list(L.FAST_PATH_OFF)
    RES["wall_s"] = time.time() - t0
    with open(path, "w") as f:
        json.dump(RES, f, indent=1, default=str)
    print(f"checks ok: {ok}; {time.time() - t0:.0f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
