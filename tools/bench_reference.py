"""Time and peak extra memory of the CPU reference on its two large contract runs.

    python -m tools.bench_reference [--json PATH]

Runs ``reference.golden`` (float64 math) on

* prefill: Lq = Lk = 16384, W = 512, C = 64, B = 1, Hq = Hkv = 4, D = 128, bf16;
* decode:  Lq = 1, Lk = 1,048,576, same heads and window,

and reports wall time and the peak resident memory above what the inputs
already hold (RSS sampled every millisecond from /proc while the call runs).
A benchmark, not a test: the numbers go into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time

import torch

from reference import golden

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _measure(fn):
    peak = [_rss()]
    base = peak[0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    stop.set()
    t.join()
    peak[0] = max(peak[0], _rss())
    return out, dt, peak[0] - base


def _inputs(B, H, Lq, Lk, D, gen):
    def make(L):
        x = torch.empty(B, H, L, D, dtype=torch.bfloat16)
        for i in range(0, L, 65536):  # fill in slices: no full-size fp32 temporary
            x[:, :, i:i + 65536] = torch.randn(B, H, min(65536, L - i), D, generator=gen)
        return x

    return make(Lq), make(Lk), make(Lk)


RUNS = {
    "prefill Lq=Lk=16384": dict(Lq=16384, Lk=16384),
    "decode Lq=1, Lk=1048576": dict(Lq=1, Lk=1 << 20),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    B, H, D, W, C = 1, 4, 128, 512, 64
    results = []
    for name, sz in RUNS.items():
        q, k, v = _inputs(B, H, sz["Lq"], sz["Lk"], D, gen)
        (o, lse), dt, extra = _measure(lambda: golden(q, k, v, window_size=W, chunk_size=C))
        assert torch.isfinite(o).all() and torch.isfinite(lse).all()
        in_bytes = sum(t.numel() * t.element_size() for t in (q, k, v))
        results.append(dict(run=name, B=B, Hq=H, Hkv=H, D=D, W=W, C=C, dtype="bfloat16",
                            Lq=sz["Lq"], Lk=sz["Lk"], seconds=round(dt, 3),
                            peak_extra_MiB=round(extra / 2**20, 1),
                            inputs_MiB=round(in_bytes / 2**20, 1)))
        q = k = v = o = lse = None  # free them (a closure above holds q, k, v)
    info = dict(torch=torch.__version__, threads=torch.get_num_threads(), cpu=platform.processor()
                or platform.machine(), cores=os.cpu_count())
    print(f"reference.golden on CPU ({info['cores']} cores, torch {info['torch']})")
    print(f"{'run':<26} {'time s':>8} {'peak extra MiB':>15} {'inputs MiB':>11}")
    for r in results:
        print(f"{r['run']:<26} {r['seconds']:>8.2f} {r['peak_extra_MiB']:>15.1f} {r['inputs_MiB']:>11.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(info=info, results=results), f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
