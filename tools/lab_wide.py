"""Lab (session 31): the cost of TileLang's ``wide`` kernels, one device call.

    PYTHONUNBUFFERED=1 python tools/lab_wide.py --out $OUT/lab-wide.json

TileLang builds its kernels ``wide`` (``launch.wide_positions``: the landmark test's float
quotient taken twice, ``macros.is_landmark``) only for calls whose kernel-frame positions
reach ``2**22``, a cache of 4M keys or more, which are too large to time beside the others.
Here the knob is forced on ordinary shapes through a config (``launch.call_knobs`` keeps a
config's ``wide=True``; the wide test is exact at every position, so the outputs must be
bit-identical to the shipped kernel's: checked first), and the two kernels are timed
interleaved, kernel only (``tools.bench.Timer.graph``: CUDA-graph replay, L2 flushed before
each), rounds alternating which goes first.

Measured on the H200 (session 31, ``bench_results/lab-wide-h200-9eae254-91da81f.json``):
bit-identical on all five shapes; C = 64 unchanged (prefill 222.2 / 222.1 us, GQA 162.4 /
162.3, decode 13.73 / 13.74), C = 16 slower (GQA 377.0 -> 426.1 us, +13%; chunked 38.6 ->
40.9, +5.8%). Predicted before the run (sm_90a SASS, CPU, session 31): D = 128 at C = 64 (landmark
columns and V's landmark rows from the tile's first column: no float test in the loop; the
split kernel's V rows take one) unchanged within noise; D = 64 at C = 16 (the float test
per score on edge tiles: 3232 -> 3488 instructions in the whole kernel) a few percent
slower; the fp32 kernel (the test per score) slower by up to its instruction growth
(4357 -> 4461).

Session 32 took the first quotient once per tile (``macros.tile_divisor``); predicted: C = 16
back within about 2% of the shipped kernels, C = 64 unchanged (``d64-general-wide`` 3488 ->
3260 instructions, the narrow kernel 3232). Measured on the H200 at 9e1bbd9 (``--only C16``,
``bench_results/lab-wide-h200-9e1bbd9.json``): bit-identical; GQA 376.1 -> 377.7 us (+0.4%),
chunked 38.4 -> 38.8 (+1.0%).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from reference import check_inputs
from tilelang_impl import launch
from tilelang_impl.api import _views
from tools.bench import Timer

# (name, dtype, B, Hq, Hkv, Lq, Lk, D, rule)
SHAPES = [
    ("prefill-32/32/128-8K-C64", torch.bfloat16, 1, 32, 32, 8192, 8192, 128,
     dict(window_size=512, chunk_size=64)),
    ("gqa-32/4/64-8K-C16", torch.bfloat16, 1, 32, 4, 8192, 8192, 64,
     dict(window_size=512, chunk_size=16)),
    ("gqa-32/4/64-8K-C64", torch.bfloat16, 1, 32, 4, 8192, 8192, 64,
     dict(window_size=512, chunk_size=64)),
    ("decode-B1-32/32/128-8K-C64", torch.bfloat16, 1, 32, 32, 1, 8192, 128,
     dict(window_size=512, chunk_size=64)),
    ("chunked-512of8K-32/32/128-C16", torch.bfloat16, 1, 32, 32, 512, 8192, 128,
     dict(window_size=512, chunk_size=16)),
]


def _plan_config(p):
    """``(S, config)``: the split count the launcher picks for the call and the shipped
    config it runs (``launch.split_plan``, ``launch.prefill_config``)."""
    S, split_cfg = launch.split_plan(p)
    cfg = split_cfg if S > 1 else launch.prefill_config(p)
    return S, cfg


def run(out: str, reps: int, only: list[str] | None = None) -> dict:
    timer = Timer("cuda", reps)
    rows = []
    for name, dt, B, Hq, Hkv, Lq, Lk, D, kw in SHAPES:
        if only and not any(o in name for o in only):
            continue
        g = torch.Generator(device="cuda").manual_seed(31)
        q = torch.randn(B, Hq, Lq, D, device="cuda", generator=g).to(dt) * 0.3
        k = torch.randn(B, Hkv, Lk, D, device="cuda", generator=g).to(dt)
        v = torch.randn(B, Hkv, Lk, D, device="cuda", generator=g).to(dt)
        p = check_inputs(q, k, v, **kw)
        (q_, k_, v_), qb, kb = _views(q, k, v)
        S, cfg = _plan_config(p)
        force = S if S > 1 else None
        outs = {}
        calls = {}
        for label, c in (("shipped", cfg), ("wide", launch.with_knobs(cfg, wide=True))):
            o, lse = p.new_outputs(poison=True)

            def call(o=o, lse=lse, c=c):
                launch.run_cuda(p, q_, k_, v_, qb, kb, o, lse, force_split=force, config=c)
            call()
            torch.cuda.synchronize()
            outs[label] = (o.clone(), lse.clone())
            calls[label] = call
        same = (torch.equal(outs["shipped"][0], outs["wide"][0])
                and torch.equal(outs["shipped"][1], outs["wide"][1])
                and not bool(outs["wide"][0].isnan().any()))
        ms = {"shipped": [], "wide": []}
        for r in range(6):
            order = ("shipped", "wide") if r % 2 == 0 else ("wide", "shipped")
            for label in order:
                t, why = timer.graph(calls[label], [()])
                if t is None:
                    raise RuntimeError(why)
                ms[label].append(t)
        med = {k2: statistics.median(v2) for k2, v2 in ms.items()}
        row = dict(name=name, S=S, bit_identical=same, us={k2: v2 * 1e3 for k2, v2 in med.items()},
                   rounds_us={k2: [x * 1e3 for x in v2] for k2, v2 in ms.items()},
                   wide_over_shipped=med["wide"] / med["shipped"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    res = dict(device=torch.cuda.get_device_name(), rows=rows)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--only", default="", help="comma-separated parts of shape names")
    a = ap.parse_args(argv)
    res = run(a.out, a.reps, [o for o in a.only.split(",") if o] or None)
    return 0 if all(r["bit_identical"] for r in res["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
