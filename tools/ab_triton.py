"""A/B of the Triton backend against a base copy of itself, in one device call.

    python tools/ab_triton.py --base DIR --out $OUT [--budget-s 300]

``DIR`` holds a package ``triton_impl_base``: the ``triton_impl`` directory of
the base commit, renamed (its imports are relative or from ``reference``)::

    mkdir -p lab_base && git archive BASE triton_impl | tar -x -C lab_base \
        && mv lab_base/triton_impl lab_base/triton_impl_base

1. Correctness of the working tree's backend: ``tools/gpu_triton.py``'s cases
   (poisoned outputs, NaN in unseen slots, every path), judged by
   ``conformance.verdict``.
2. Kernel-only time (CUDA-graph replay, three input sets rotated, median of 7
   replays) of the issue's shapes through each public function, base and new
   interleaved shape by shape (``--passes N``: the whole list N times), L2 not flushed (the bench tool flushes; this
   compares two kernels under the same conditions).
3. Host time per eager call (no GPU wait in the loop): a fixed decode call,
   and a decode loop whose ``Lk`` grows by one each step (the serving case).

Writes ``ab_triton.json`` under ``--out`` after every step.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = [  # name, B, Hq, Hkv, Lq, Lk, D  (W=512, C=64, bf16)
    ("mha D128 L8K", 1, 32, 32, 8192, 8192, 128),
    ("mha D128 L16K", 1, 32, 32, 16384, 16384, 128),
    ("gqa32/4 D64 L8K", 1, 32, 4, 8192, 8192, 64),
    ("gqa16/2 D64 L8K", 1, 16, 2, 8192, 8192, 64),
    ("batch4x4K gqa32/4 D64", 4, 32, 4, 4096, 4096, 64),
    ("chunk Lq512/8K D128", 1, 32, 32, 512, 8192, 128),
    ("decode B1 8K D128", 1, 32, 32, 1, 8192, 128),
    ("decode B1 128K D128", 1, 32, 32, 1, 131072, 128),
    ("decode B8 gqa32/4 32K D64", 8, 32, 4, 1, 32768, 64),
]
W, C = 512, 64


def decode_loop_host(fn, steps=300, Lk0=8192):
    """Host us per call of a decode loop whose Lk grows by one each step (views of one cache)."""
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 32, Lk0 + steps, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    for i in range(40):  # warm-up: compiles every specialisation the steps meet (Lk % 16)
        fn(q, k[:, :, :Lk0 - 40 + i], v[:, :, :Lk0 - 40 + i])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        fn(q, k[:, :, :Lk0 + i], v[:, :, :Lk0 + i])
    dt = (time.perf_counter() - t0) / steps * 1e6
    torch.cuda.synchronize()
    return dt


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="directory holding the package triton_impl_base")
    ap.add_argument("--out", default=os.environ.get("OUT", ".out"))
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--passes", type=int, default=1,
                    help="time every shape this many times (base and new interleaved each time)")
    a = ap.parse_args(argv)
    t_start = time.time()
    os.makedirs(a.out, exist_ok=True)
    sys.path.insert(0, os.path.abspath(a.base))
    from tools._common import attention_flops
    from tools.gpu_triton import graph_time, host_time
    from triton_impl import sliding_window_attention as new

    base = importlib.import_module("triton_impl_base").sliding_window_attention
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
               triton=importlib.import_module("triton").__version__, checks=[], timings=[], host={})
    path = os.path.join(a.out, "ab_triton.json")

    def dump():
        with open(path, "w") as f:
            json.dump(res, f, indent=1, default=str)

    if not a.skip_check:
        from tools import gpu_triton
        ok = 0
        cases = gpu_triton.correctness_cases()
        for c in cases:
            rows = []
            try:
                ok += gpu_triton.check_case(c, rows)
            except Exception as e:  # a crash is a failed check, reported
                rows.append(dict(case=str(c), ok=False, error=f"{type(e).__name__}: {e}"[:500]))
                print("BAD", rows[-1], flush=True)
            res["checks"] += rows
        res["checks_passed"] = f"{ok}/{len(cases)}"
        print(f"checks {ok}/{len(cases)}", flush=True)
        dump()

    kw = dict(window_size=W, chunk_size=C)
    for pass_i, (name, B, Hq, Hkv, Lq, Lk, D) in [(i, s) for i in range(max(a.passes, 1)) for s in SHAPES]:
        if time.time() - t_start > a.budget_s:
            print(f"budget reached before {name}", flush=True)
            break
        g = torch.Generator(device="cuda").manual_seed(11)
        sets = [tuple(torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
                      for s in ((B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D))) for _ in range(3)]
        flops = attention_flops(B, Hq, Lq, Lk, D, window_size=W, chunk_size=C)
        row = dict(shape=name, pass_index=pass_i, flops=flops)
        order = (("base", base), ("new", new)) if len(res["timings"]) % 2 == 0 else (("new", new), ("base", base))
        for tag, fn in order:
            f = (lambda q, k, v, fn=fn: fn(q, k, v, **kw))
            us = graph_time(f, sets)
            row[f"{tag}_us"] = us
            row[f"{tag}_tflops"] = flops / us * 1e-6
            row[f"{tag}_host_us"] = host_time(f, sets[0], n=50 if Lq > 1 else 300)
        o_b, l_b = base(*sets[0], **kw)
        o_n, l_n = new(*sets[0], **kw)
        row["max_diff_o"] = (o_b.float() - o_n.float()).abs().max().item()
        row["max_diff_lse"] = (l_b - l_n).abs().max().item()
        row["speedup"] = row["base_us"] / row["new_us"]
        res["timings"].append(row)
        print(f"{name:28s} p{pass_i} base {row['base_us']:9.2f} us {row['base_tflops']:7.1f} TF/s | new {row['new_us']:9.2f} us "
              f"{row['new_tflops']:7.1f} TF/s | x{row['speedup']:.3f} | host {row['base_host_us']:.1f} -> "
              f"{row['new_host_us']:.1f} us | diff o {row['max_diff_o']:.2e}", flush=True)
        dump()
        del sets

    for tag, fn in (("base", base), ("new", new)):
        f = (lambda q, k, v, fn=fn: fn(q, k, v, **kw))
        res["host"][f"{tag}_decode_loop_growing_Lk_us"] = decode_loop_host(f)
    print("host:", res["host"], flush=True)
    res["seconds"] = time.time() - t_start
    dump()


if __name__ == "__main__":
    main()
