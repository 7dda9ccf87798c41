"""``hils-swa bench``: time backends on the benchmark shape suite (GPU).

    hils-swa bench [--backend triton,tilelang,flex,sdpa] [--shapes NAMES] [--json PATH]
                   [--md BENCHMARKS.md] [--png PATH] [--reps N] [--budget-s S]
    hils-swa bench --device cpu --smoke ...        # tiny shapes, code paths only (CI)
    hils-swa bench -n 2 [...]                       # shapes spread over 2 GPUs (pytest-xdist)

For every (shape, backend):

1. **Conformance gate.** The backend runs once on the benchmark inputs; batch
   element 0 of its output is judged against the reference (float64 golden of
   that batch element, ``conformance.verdict``). A backend that fails is not
   timed on that shape (``refused`` with the verdict's reason).
2. **Kernel-only time**: the call captured in a CUDA graph (one graph per input
   set, the sets rotated), L2 flushed (a 256 MiB memset) before each replay,
   CUDA events around the replay alone.
3. **Eager end-to-end time**: the public Python function, CUDA events around
   the call, device idle at the start (L2 flushed, synchronized), so the
   wrapper's host work is inside the measurement.

Medians over ``--reps`` repetitions. TFLOP/s count visible pairs only,
``2 * (Dqk + Dv) * sum(reference.visible_counts(...)) * B * Hq``, in closed
form; the percentage is of a dense bf16 8192^3 matmul measured in the same
run. Decode shapes also report bytes moved (the reachable K/V window, q, o,
lse) and their percentage of a device-to-device copy measured in the same run.

Peers: ``flex`` (FlexAttention, compiled: every shape is warmed before
timing) and ``sdpa`` (dense PyTorch SDPA, flash kernel: causal for Lq = Lk,
full attention over the cache otherwise) as a ceiling line: its TFLOP/s count
the dense work it does, its GB/s the whole cache it reads.

Writes a table to stdout, ``--json``, a section of ``--md`` between
``<!-- bench:begin -->`` and ``<!-- bench:end -->`` (the rest of the file is
left alone), and ``--png`` (TFLOP/s per shape per backend with the ceilings as
lines; decode in microseconds on a second panel). ``--budget-s`` bounds the
whole run: what does not fit is reported as skipped, never silently dropped.

``-n N`` (``N > 1`` or ``auto`` = one per GPU) spreads the shapes over the GPUs
of the host with pytest-xdist, the mechanism of ``hils-swa conform -n``, no
scheduler of its own: ``tools.bench_xdist`` runs ``tools/bench_suite.py`` (one
test per shape, not part of the repo's test suite) through ``pytest.main``;
each worker ``gwK`` is pinned to GPU ``K % len(gpus)`` by ``conformance.pinning``
before it imports torch, so it sees one GPU as ``cuda``, measures its own
ceilings once and times the shapes xdist hands it with :func:`bench_shape`
(gate included; ``--budget-s`` counts per worker). Rows, device name, PCI bus id
and ceilings come back through ``report.user_properties``; the controller
merges the rows in suite order and writes the same table, JSON (plus
``workers``), markdown section and plot. More workers than GPUs is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field

import torch

from ._common import attention_flops, capture_graph, commit_label, visible_pairs

__all__ = ["Shape", "SHAPES", "SMOKE_SHAPES", "bench_shape", "measure_ceilings", "run_info", "write_outputs",
           "main"]

MD_BEGIN = "<!-- bench:begin -->"
MD_END = "<!-- bench:end -->"
DEFAULT_BACKENDS = ("triton", "tilelang", "flex", "sdpa")


@dataclass(frozen=True)
class Shape:
    name: str
    kind: str            # "prefill" or "decode"
    B: int
    Hq: int
    Hkv: int
    D: int
    Lq: int
    Lk: int
    W: int = 512
    C: int = 64
    kv_start: int = 0
    note: str = ""

    @property
    def rule(self) -> dict:
        return dict(window_size=self.W, chunk_size=self.C, mask_lmk=True, expand_to_chunk=True,
                    kv_start=self.kv_start)

    def pairs(self) -> int:
        """Visible (query, key) pairs of one head of one batch element (closed form)."""
        return visible_pairs(self.Lq, self.Lk, **self.rule)

    def flops(self) -> float:
        return attention_flops(self.B, self.Hq, self.Lq, self.Lk, self.D, **self.rule)

    def window_keys(self) -> int:
        from reference import visible_key_range

        lo, hi = visible_key_range(0, self.Lq, Lq=self.Lq, Lk=self.Lk, window_size=self.W, chunk_size=self.C,
                                   expand_to_chunk=True, kv_start=self.kv_start)
        return hi - lo

    def bytes_moved(self, elt: int) -> float:
        """Reachable K/V window + q + o (dtype) + lse (fp32)."""
        kv = self.B * self.Hkv * self.window_keys() * 2 * self.D * elt
        qo = self.B * self.Hq * self.Lq * 2 * self.D * elt
        return float(kv + qo + self.B * self.Hq * self.Lq * 4)


def _train(L, hq, hkv, d):
    return Shape(f"train-{L // 1024}k-{hq}/{hkv}/{d}", "prefill", 1, hq, hkv, d, L, L)


SHAPES: tuple[Shape, ...] = tuple(
    _train(L, hq, hkv, d) for (hq, hkv, d) in ((32, 32, 128), (32, 4, 64), (16, 2, 64)) for L in (4096, 8192, 16384)
) + (
    Shape("batch4x4k-32/4/64", "prefill", 4, 32, 4, 64, 4096, 4096, note="batch 4 x 4K"),
    Shape("chunk512of8k-32/4/64", "prefill", 1, 32, 4, 64, 512, 8192, note="chunked prefill: last 512 of 8K"),
    # the issues' chunked-prefill and single-token decode targets are D = 128, Hq = Hkv = 32
    Shape("chunk512of8k-32/32/128", "prefill", 1, 32, 32, 128, 512, 8192,
          note="chunked prefill: last 512 of 8K"),
    Shape("decode-8k-32/32/128", "decode", 1, 32, 32, 128, 1, 8192),
    Shape("decode-128k-32/32/128", "decode", 1, 32, 32, 128, 1, 131072),
    Shape("decode-8k-32/4/64", "decode", 1, 32, 4, 64, 1, 8192),
    Shape("decode-32k-32/4/64", "decode", 1, 32, 4, 64, 1, 32768),
    Shape("decode-128k-32/4/64", "decode", 1, 32, 4, 64, 1, 131072),
    Shape("decode-b8-32k-32/4/64", "decode", 8, 32, 4, 64, 1, 32768),
    Shape("longwin-w4096-8k-32/4/64", "prefill", 1, 32, 4, 64, 8192, 8192, W=4096, note="long window W=4096"),
)

SMOKE_SHAPES: tuple[Shape, ...] = (
    Shape("smoke-prefill", "prefill", 1, 2, 1, 32, 128, 128, W=32, C=16),
    Shape("smoke-chunked", "prefill", 1, 2, 1, 32, 16, 128, W=32, C=16),
    Shape("smoke-decode", "decode", 2, 2, 1, 32, 1, 256, W=32, C=16),
)


def _log(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------ timing

class Timer:
    """Kernel-only (CUDA graph) and eager timings on one device."""

    def __init__(self, device: str, reps: int):
        self.device = device
        self.cuda = device.startswith("cuda")
        self.reps = reps
        self.flush_buf = torch.empty(256 * 2**20, dtype=torch.int8, device=device) if self.cuda else None

    def _flush(self):
        if self.flush_buf is not None:
            self.flush_buf.zero_()

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def eager(self, call, sets) -> float:
        """Median milliseconds of ``call(*inputs)``, host work included."""
        return self.eager_host(call, sets)[0]

    def eager_host(self, call, sets) -> tuple[float, float]:
        """``(eager ms, host us)``, medians over the repetitions: the eager time of
        ``call(*inputs)`` (CUDA events around it, the device idle and L2 flushed
        before it), and the host time the call takes to return (``perf_counter``
        around the same call: the Python wrapper and its launches, without
        waiting for the device)."""
        times, host = [], []
        for r in range(self.reps):
            inp = sets[r % len(sets)]
            if self.cuda:
                self._flush()
                torch.cuda.synchronize(self.device)
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                t0 = time.perf_counter()
                call(*inp)
                host.append((time.perf_counter() - t0) * 1e6)
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e))
            else:
                t0 = time.perf_counter()
                call(*inp)
                host.append((time.perf_counter() - t0) * 1e6)
                times.append(host[-1] * 1e-3)
        return statistics.median(times), statistics.median(host)

    def graph(self, call, sets) -> tuple[float | None, str]:
        """Median milliseconds of CUDA-graph replays (kernel only), or (None, reason)."""
        if not self.cuda:
            return None, "CUDA graphs skipped: device is CPU (kernel-only time needs CUDA graph replay)"
        try:
            graphs = [capture_graph(lambda inp=inp: call(*inp)) for inp in sets]
            torch.cuda.synchronize()
        except Exception as e:  # reported in the table, the eager time still stands
            torch.cuda.synchronize()
            return None, f"CUDA graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        for g, _ in graphs:  # one untimed replay each
            g.replay()
        for r in range(self.reps):
            g = graphs[r % len(graphs)][0]
            self._flush()
            starts[r].record()
            g.replay()
            ends[r].record()
        torch.cuda.synchronize()
        ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
        del graphs
        return ms, ""

    def matmul_tflops(self, dtype) -> float:
        n = 8192 if self.cuda else 512
        a = torch.randn(n, n, device=self.device, dtype=dtype)
        b = torch.randn(n, n, device=self.device, dtype=dtype)
        call = lambda: torch.mm(a, b)  # noqa: E731
        for _ in range(3):
            call()
        self.sync()
        ms = self.eager(lambda: call(), [()])
        return 2.0 * n ** 3 / (ms * 1e-3) / 1e12

    def floor_us(self, kernels: int) -> float | None:
        """The kernel column for (almost) nothing: :meth:`graph` of a call that
        launches ``kernels`` one-block fill kernels on one float (the timer's
        fixed cost: graph launch and, after the first, each kernel's launch in
        the graph); None without CUDA graphs."""
        ms, _ = self.graph(self._fills(kernels), [()])
        return None if ms is None else ms * 1e3

    def _fills(self, kernels: int):
        x = torch.zeros(1, device=self.device)

        def call():
            for _ in range(kernels):
                x.fill_(1.0)
        return call

    def eager_floor_us(self) -> tuple[float, float] | None:
        """``(eager us, host us)`` of one one-block fill kernel (:meth:`eager_host`):
        what the eager column costs for a call that launches one kernel and
        does nothing else; None without CUDA."""
        if not self.cuda:
            return None
        ms, host = self.eager_host(self._fills(1), [()])
        return ms * 1e3, host

    def copy_gbps(self) -> float:
        n = (1 << 30) if self.cuda else (64 << 20)
        src = torch.empty(n, dtype=torch.int8, device=self.device)
        src.fill_(1)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        self.sync()
        ms = self.eager(lambda: dst.copy_(src), [()])
        return 2.0 * n / (ms * 1e-3) / 1e9


# ---------------------------------------------------------------- backends

@dataclass
class Runner:
    name: str
    call: object          # (q, k, v) -> outputs
    canonical: bool       # a SPEC backend (gated); False for the sdpa ceiling
    note: str = ""
    prepare: object = None  # (q, k, v) -> inputs for call (sdpa: expanded heads when needed)


def _canonical_runner(name: str, shape: Shape) -> Runner:
    from ._common import resolve_backend

    fn = resolve_backend(name).fn
    rule = shape.rule
    return Runner(name, lambda q, k, v: fn(q, k, v, **rule), True)


def _sdpa_runner(shape: Shape, device: str) -> Runner:
    import torch.nn.functional as F

    causal = shape.Lq == shape.Lk
    gqa = shape.Hq != shape.Hkv
    ctx = None
    if device.startswith("cuda"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        ctx = lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])  # noqa: E731
    note = "dense causal" if causal else "dense, all Lk keys"
    if ctx is not None:
        note = "flash, " + note

    def call(q, k, v):
        if ctx is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        with ctx():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    return Runner("sdpa", call, False, note)


def _sdpa_expanded(shape: Shape, device: str) -> Runner:
    """SDPA with key/value heads repeated up front (flash builds without enable_gqa)."""
    r = _sdpa_runner(Shape(**{**asdict(shape), "Hkv": shape.Hq}), device)
    G = shape.Hq // shape.Hkv
    r.prepare = lambda q, k, v: (q, k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1))
    r.note += ", K/V heads repeated before the call (enable_gqa refused)"
    return r


def _sdpa_work(shape: Shape) -> tuple[float, float]:
    """(flops, bytes) of the dense SDPA call."""
    if shape.Lq == shape.Lk:
        pairs = shape.Lq * (shape.Lq + 1) / 2
    else:
        pairs = shape.Lq * shape.Lk
    flops = 4.0 * shape.D * pairs * shape.B * shape.Hq
    by = 2.0 * (shape.B * shape.Hkv * shape.Lk * 2 * shape.D + shape.B * shape.Hq * shape.Lq * 2 * shape.D)
    return flops, by


# ------------------------------------------------------------------- gate

class Gate:
    """Quick conformance check on a benchmarked shape: batch element 0 of the
    backend's output against the reference's golden, under the suite's verdict."""

    def __init__(self, shape: Shape, q, k, v):
        self.shape = shape
        self.inputs = (q[:1], k[:1], v[:1])
        self._exp = None

    def expected(self):
        if self._exp is None:
            from conformance import verdict

            q, k, v = self.inputs
            self._exp = verdict.expected(q, k, v, dict(self.shape.rule))
        return self._exp

    def check(self, out) -> tuple[bool, str]:
        from conformance import verdict

        if not (isinstance(out, tuple) and len(out) == 2):
            return False, f"returned {type(out).__name__}, expected (o, lse)"
        o, lse = out
        v = verdict.judge(o[:1], lse[:1], self.expected())
        if v.status == "pass":
            return True, f"pass (worst error/bound {v.ratio:.2g})"
        return False, "; ".join(p.splitlines()[0][:160] for p in v.problems[:2])

    def release(self):
        self._exp = None


# ------------------------------------------------------------------ driver

@dataclass
class Result:
    shape: str
    kind: str
    backend: str
    status: str                  # ok, refused, error, skipped
    reason: str = ""
    gate: str = ""
    kernel_us: float | None = None
    eager_us: float | None = None
    host_us: float | None = None
    graph_note: str = ""
    tflops: float | None = None
    pct_matmul: float | None = None
    gbps: float | None = None
    pct_copy: float | None = None
    flops: float = 0.0
    bytes: float = 0.0
    note: str = ""
    extra: dict = field(default_factory=dict)


def _inputs(shape: Shape, device, dtype, n_sets: int, seed: int = 0):
    sets = []
    for s in range(n_sets):
        g = torch.Generator(device=device).manual_seed(seed + s)
        q = torch.randn(shape.B, shape.Hq, shape.Lq, shape.D, device=device, dtype=dtype, generator=g)
        k = torch.randn(shape.B, shape.Hkv, shape.Lk, shape.D, device=device, dtype=dtype, generator=g)
        v = torch.randn(shape.B, shape.Hkv, shape.Lk, shape.D, device=device, dtype=dtype, generator=g)
        sets.append((q, k, v))
    return sets


def _n_sets(shape: Shape, elt: int, cuda: bool) -> int:
    if not cuda:
        return 2
    per = (shape.B * (shape.Hq * shape.Lq + 2 * shape.Hkv * shape.Lk) * shape.D) * elt
    # enough sets that their reachable bytes exceed the L2 a few times, at most 4 GiB of inputs
    return int(max(2, min(6, (4 << 30) // max(per, 1))))


def bench_one(shape: Shape, name: str, sets, gate: Gate | None, timer: Timer, ceilings: dict,
              device: str) -> Result:
    res = Result(shape.name, shape.kind, name, "ok")
    try:
        if name == "sdpa":
            runner = _sdpa_runner(shape, device)
            try:
                runner.call(*sets[0])
                timer.sync()
            except Exception as e:
                if shape.Hq == shape.Hkv:
                    raise
                _log(f"    sdpa: {type(e).__name__}: {str(e).splitlines()[0][:100]}; retrying with repeated heads")
                runner = _sdpa_expanded(shape, device)
            res.flops, res.bytes = _sdpa_work(shape)
        else:
            runner = _canonical_runner(name, shape)
            res.flops = shape.flops()
            res.bytes = shape.bytes_moved(sets[0][0].element_size())
        res.note = runner.note
        if runner.prepare is not None:
            sets = [runner.prepare(*s) for s in sets]
        t0 = time.perf_counter()
        out = runner.call(*sets[0])  # first call: compiles / JIT-builds
        timer.sync()
        res.extra["first_call_s"] = round(time.perf_counter() - t0, 3)
        # sdpa is no SPEC backend (nothing to describe_call): its column says what it runs
        res.extra["kernel"] = (_kernel_line(name, shape, sets[0]) if runner.canonical
                               else f"SDPA, {runner.note}")
        if runner.canonical and gate is not None:
            ok, msg = gate.check(out)
            res.gate = msg
            if not ok:
                res.status, res.reason = "refused", f"fails the conformance gate: {msg}"
                return res
        del out
        for inp in sets[1:]:  # warm every input set (compiled peers: no compile inside timing)
            runner.call(*inp)
        timer.sync()
        eager_ms, res.host_us = timer.eager_host(runner.call, sets)
        res.eager_us = eager_ms * 1e3
        k_ms, why = timer.graph(runner.call, sets)
        res.graph_note = why if timer.cuda else ""  # on CPU the reason is printed once, up front
        if k_ms is not None:
            res.kernel_us = k_ms * 1e3
    except Exception as e:
        from reference import UnsupportedConfig

        res.status = "unsupported" if isinstance(e, UnsupportedConfig) else "error"
        res.reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        res.extra["traceback"] = traceback.format_exc(limit=6)
        try:
            timer.sync()
        except Exception:
            pass
        return res
    t_us = res.kernel_us if res.kernel_us is not None else res.eager_us
    res.tflops = res.flops / (t_us * 1e-6) / 1e12
    if ceilings.get("matmul_tflops"):
        res.pct_matmul = 100.0 * res.tflops / ceilings["matmul_tflops"]
    if shape.kind == "decode":
        res.gbps = res.bytes / (t_us * 1e-6) / 1e9
        if ceilings.get("copy_gbps"):
            res.pct_copy = 100.0 * res.gbps / ceilings["copy_gbps"]
    return res


def _fmt(x, spec=".1f", none="-"):
    return none if x is None else format(x, spec)


def _kernel_line(name: str, shape: Shape, inputs) -> str:
    """What a backend runs for the shape (``Backend.describe``: a built-in's
    ``describe_call``, kernel, tile, splits), or "" where a backend does not say."""
    from ._common import resolve_backend

    try:
        fn = resolve_backend(name).describe
        return fn(*inputs, **shape.rule) if fn is not None else ""
    except Exception as e:  # a description must never cost a timing
        return f"(no description: {type(e).__name__})"


def _floor_text(ceilings: dict) -> str:
    """The timer's floor (``Timer.floor_us``) as a sentence fragment."""
    return (f"timer floor (kernel column of one / two one-block fill kernels) "
            f"{_fmt(ceilings.get('floor1_us'))} / {_fmt(ceilings.get('floor2_us'))} us, "
            f"eager / host columns of one fill kernel {_fmt(ceilings.get('eager_floor_us'))} / "
            f"{_fmt(ceilings.get('host_floor_us'))} us")


def table(results: list[Result], ceilings: dict) -> str:
    head = (f"{'shape':<26} {'backend':<9} {'kernel us':>10} {'eager us':>10} {'host us':>8} {'TFLOP/s':>8} {'%mm':>5} "
            f"{'GB/s':>7} {'%copy':>6}  status")
    lines = [head, "-" * len(head)]
    for r in results:
        status = r.status if r.status == "ok" else f"{r.status}: {r.reason[:90]}"
        if r.status == "ok" and r.kernel_us is None and r.graph_note:
            status = f"ok ({r.graph_note[:70]})"
        kernel = r.extra.get("kernel", "")
        lines.append(f"{r.shape:<26} {r.backend:<9} {_fmt(r.kernel_us):>10} {_fmt(r.eager_us):>10} "
                     f"{_fmt(r.host_us):>8} {_fmt(r.tflops, '.4g'):>8} {_fmt(r.pct_matmul, '.3g'):>5} {_fmt(r.gbps, '.4g'):>7} "
                     f"{_fmt(r.pct_copy, '.3g'):>6}  {status}" + (f"  [{kernel}]" if kernel else ""))
    lines.append("")
    lines.append(f"ceilings measured in this run: dense {ceilings.get('matmul_dtype', 'bf16')} matmul "
                 f"{_fmt(ceilings.get('matmul_tflops'), '.4g')} TFLOP/s, device copy {_fmt(ceilings.get('copy_gbps'), '.0f')} GB/s; "
                 + _floor_text(ceilings))
    return "\n".join(lines)


def markdown(results: list[Result], info: dict, ceilings: dict) -> str:
    lines = [
        MD_BEGIN,
        "## `hils-swa bench` (generated: edit nothing between the markers)",
        "",
        f"{info['device_name']}, torch {info['torch']}, triton {info.get('triton', '?')}, commit "
        f"{info.get('commit', 'unknown')}, {info['date']}. {info['reps']} repetitions, median. Kernel = "
        "CUDA-graph replay with L2 flushed before each replay, input sets rotated; eager = the public "
        "function end to end (CUDA events, device idle and L2 flushed at start); host = the host time "
        "of that call until it returns (`perf_counter`: validation, allocation, launches; the device "
        "not waited for). TFLOP/s over visible pairs "
        "(`4 * D * sum(reference.visible_counts) * B * Hq`, from the kernel time when there is one); "
        f"ceilings measured in the same run: dense {ceilings.get('matmul_dtype', 'bf16')} matmul "
        f"{_fmt(ceilings.get('matmul_tflops'))} TFLOP/s, device-to-device copy "
        f"{_fmt(ceilings.get('copy_gbps'), '.0f')} GB/s; {_floor_text(ceilings).replace(' us', ' µs')}: "
        "the kernel column of a one-kernel call includes the first, of a two-kernel call (split-KV "
        "and its combine) the second. Decode bytes = reachable K/V window + q + o + lse. "
        "`sdpa` = dense PyTorch SDPA (flash), a ceiling line: its numbers count the dense work it does. "
        "Every SPEC backend passed a conformance check on each shape before it was timed. "
        "`kernel run`: what the backend says it ran (`describe_call` of its package: kernel, tile "
        "BLOCK_M x BLOCK_N, warps w / stages s / threads t, register cap r, split count S, knobs)."
        + (" " + info["workers_note"] if info.get("workers_note") else ""),
        "",
        "| shape | backend | kernel µs | eager µs | host µs | TFLOP/s | % matmul | GB/s | % copy | status | kernel run |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in results:
        status = r.status if r.status == "ok" else f"{r.status}: {r.reason[:120]}"
        if r.status == "ok" and r.kernel_us is None and r.graph_note:
            status = f"ok; {r.graph_note[:100]}"
        status = status.replace("|", "/")
        kernel = r.extra.get("kernel", "").replace("|", "/")
        lines.append(f"| {r.shape} | {r.backend} | {_fmt(r.kernel_us)} | {_fmt(r.eager_us)} | {_fmt(r.host_us)} | "
                     f"{_fmt(r.tflops, '.4g')} | "
                     f"{_fmt(r.pct_matmul, '.3g')} | {_fmt(r.gbps, '.4g')} | {_fmt(r.pct_copy, '.3g')} | {status} | "
                     f"{kernel} |")
    lines.append(MD_END)
    return "\n".join(lines)


def write_md(path: str, section: str) -> None:
    """Replace the text between the markers (inclusive); append the section when absent."""
    text = ""
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    b, e = text.find(MD_BEGIN), text.find(MD_END)
    if b >= 0 and e > b:
        text = text[:b] + section + text[e + len(MD_END):]
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + section + "\n"
    with open(path, "w") as f:
        f.write(text)


def plot(results: list[Result], ceilings: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = list(dict.fromkeys(r.backend for r in results))
    colors = {b: c for b, c in zip(backends, ["#1f77b4", "#ff7f0e", "#2ca02c", "#7f7f7f", "#9467bd", "#8c564b"])}
    pre = list(dict.fromkeys(r.shape for r in results if r.kind == "prefill"))
    dec = list(dict.fromkeys(r.shape for r in results if r.kind == "decode"))
    by = {(r.shape, r.backend): r for r in results}
    fig, axes = plt.subplots(1, 2, figsize=(16, 6.5), gridspec_kw=dict(width_ratios=[max(len(pre), 1), max(len(dec), 1) + 1]))
    width = 0.8 / max(len(backends), 1)
    ax = axes[0]
    for bi, b in enumerate(backends):
        xs, ys = [], []
        for si, s in enumerate(pre):
            r = by.get((s, b))
            if r is not None and r.tflops is not None and r.status == "ok":
                xs.append(si + (bi - (len(backends) - 1) / 2) * width)
                ys.append(r.tflops)
                if r.pct_matmul is not None:
                    ax.text(xs[-1], r.tflops, f"{r.tflops:.0f} ({r.pct_matmul:.0f}%)" if r.tflops >= 1 else
                            f"{r.tflops:.2g}", ha="center", va="bottom", fontsize=6, rotation=90)
        ax.bar(xs, ys, width, label=b, color=colors[b], hatch="//" if b == "sdpa" else None,
               alpha=0.6 if b == "sdpa" else 1.0)
    if ceilings.get("matmul_tflops"):
        ax.axhline(ceilings["matmul_tflops"], color="k", ls="--", lw=1)
        ax.text(len(pre) - 0.5, ceilings["matmul_tflops"], f"dense matmul {ceilings['matmul_tflops']:.0f}",
                ha="right", va="bottom", fontsize=8)
    ax.set_xticks(range(len(pre)))
    ax.set_xticklabels(pre, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s over visible pairs (sdpa: dense work); label: % of matmul")
    ax.set_title("prefill / training (higher is better)")
    ax.legend(fontsize=8)
    ax = axes[1]
    for bi, b in enumerate(backends):
        xs, ys = [], []
        for si, s in enumerate(dec):
            r = by.get((s, b))
            t = None if r is None else (r.kernel_us if r.kernel_us is not None else r.eager_us)
            if r is not None and r.status == "ok" and t is not None:
                xs.append(si + (bi - (len(backends) - 1) / 2) * width)
                ys.append(t)
                if r.pct_copy is not None:
                    ax.text(xs[-1], t, f"{r.pct_copy:.0f}%", ha="center", va="bottom", fontsize=6, rotation=90)
        ax.bar(xs, ys, width, label=b, color=colors[b], hatch="//" if b == "sdpa" else None,
               alpha=0.6 if b == "sdpa" else 1.0)
    ax.set_xticks(range(len(dec)))
    ax.set_xticklabels(dec, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("µs per call (kernel, CUDA graph; eager where none; lower is better)")
    ax.set_yscale("log")
    ax.set_title("decode (label: % of measured copy bandwidth)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def shape_pool(smoke: bool) -> tuple[Shape, ...]:
    """The shapes a run chooses from: the CPU smoke set or the suite."""
    return SMOKE_SHAPES if smoke else SHAPES


def _select(names: str | None, pool: tuple[Shape, ...]) -> list[Shape]:
    if not names or names == "all":
        return list(pool)
    out = []
    for token in names.split(","):
        token = token.strip()
        hit = [s for s in pool if s.name == token or (token in ("prefill", "decode") and s.kind == token)
               or (token not in ("prefill", "decode") and token in s.name)]
        if not hit:
            raise ValueError(f"unknown shape {token!r}; known: {', '.join(s.name for s in pool)}")
        out += [s for s in hit if s not in out]
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="hils-swa bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=_EPILOG)
    ap.add_argument("--backend", action="append", default=None,
                    help=f"backend(s), repeatable or comma-separated (default {','.join(DEFAULT_BACKENDS)}); "
                         "'sdpa' is the dense ceiling line")
    ap.add_argument("--shapes", default=None, help="comma-separated names or substrings, 'prefill', 'decode' "
                                                   "(default: all)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None, help="update the bench section of this markdown file (e.g. BENCHMARKS.md)")
    ap.add_argument("--png", default=None)
    ap.add_argument("--reps", type=int, default=None, help="repetitions per timing (default 20 on GPU, 3 on CPU)")
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes: exercise the code paths (CPU CI)")
    ap.add_argument("-n", "--workers", default=None, metavar="N",
                    help="spread the shapes over N pytest-xdist workers, one GPU each (conformance.pinning, "
                         "as in `hils-swa conform -n`); 'auto' = one per GPU (2 with --device cpu). "
                         "N may not exceed the GPUs: two workers on one GPU would time each other. "
                         "0 or 1 (the default): this process times every shape")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="stop starting new (shape, backend) timings after this many seconds (default 420); "
                         "with -n the budget is per worker, counted from that worker's start (its ceiling "
                         "measurement included)")
    ap.add_argument("--flex-static", action="store_true",
                    help="compile flex statically per shape (default: torch's automatic dynamic shapes, fewer compiles)")
    ap.add_argument("--commit", default=None, help="commit label for the report (default: tools._common.commit_label, git describe --dirty)")
    ap.add_argument("--list", action="store_true", help="print the shape suite and exit")
    return ap


# The docstring's ``-n N`` paragraph, as the command line's epilog.
_EPILOG = next(par for par in __doc__.split("\n\n") if par.startswith("``-n N``"))


def _configure(args) -> tuple[str, list[Shape], list[str], int] | int:
    """(device, shapes, backends, reps) of a parsed command line, or an exit status."""
    from ._common import pick_device

    try:
        device = pick_device(args.device)
        shapes = _select(args.shapes, shape_pool(args.smoke))
    except ValueError as e:
        print(f"hils-swa bench: {e}", file=sys.stderr)
        return 2
    cuda = device.startswith("cuda")
    if not cuda and not args.smoke:
        print("hils-swa bench: the benchmark suite needs a CUDA device; use --device cpu --smoke to exercise "
              "the code paths on CPU", file=sys.stderr)
        return 2
    backends = []
    for b in (args.backend or [",".join(DEFAULT_BACKENDS if cuda else ("reference", "flex", "sdpa"))]):
        backends += [x.strip() for x in b.split(",") if x.strip()]
    from ._common import resolve_backend
    try:  # every name resolved before anything is measured
        for name in backends:
            if name != "sdpa":
                resolve_backend(name)
    except ValueError as e:
        print(f"hils-swa bench: {e}", file=sys.stderr)
        return 2
    reps = args.reps or (20 if cuda else 3)
    return device, shapes, backends, reps


def describe_device(device: str) -> str:
    """What the report calls ``device``: the GPU's name, or the CPU's and its core count."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    return (platform.processor() or platform.machine()) + f" CPU ({os.cpu_count()} cores)"


def run_info(device: str, reps: int, commit: str | None, device_name: str | None = None) -> dict:
    """The report's ``info`` (device, versions, date, commit); ``device_name`` is
    queried from ``device`` unless given."""
    if device_name is None:
        device_name = describe_device(device)
    info = dict(device=device, device_name=device_name,
                torch=torch.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                reps=reps, commit=commit or commit_label(), python=platform.python_version())
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = "absent"
    return info


def measure_ceilings(timer: Timer, dtype, t_start: float) -> dict:
    """Dense matmul TFLOP/s and device copy GB/s on ``timer``'s device (logged)."""
    ceilings = dict(matmul_dtype="bf16")
    try:
        ceilings["matmul_tflops"] = timer.matmul_tflops(dtype)
        ceilings["copy_gbps"] = timer.copy_gbps()
        ceilings["floor1_us"] = timer.floor_us(1)
        ceilings["floor2_us"] = timer.floor_us(2)
        eager_floor = timer.eager_floor_us()
        if eager_floor is not None:
            ceilings["eager_floor_us"], ceilings["host_floor_us"] = eager_floor
    except Exception as e:
        _log(f"  ceiling measurement failed: {type(e).__name__}: {e}")
    _log(f"  ceilings: dense bf16 matmul {_fmt(ceilings.get('matmul_tflops'), '.4g')} TFLOP/s, "
         f"copy {_fmt(ceilings.get('copy_gbps'), '.0f')} GB/s, {_floor_text(ceilings)}  "
         f"[{time.perf_counter() - t_start:.1f} s]")
    return ceilings


def bench_shape(shape: Shape, backends: list[str], device: str, dtype, timer: Timer, ceilings: dict,
                t_start: float, budget_s: float) -> list[Result]:
    """Every backend on one shape (gate, then timings); what starts after
    ``budget_s`` seconds since ``t_start`` is reported as skipped."""
    cuda = device.startswith("cuda")
    results: list[Result] = []
    elt = torch.empty((), dtype=dtype).element_size()
    if time.perf_counter() - t_start > budget_s:
        for b in backends:
            results.append(Result(shape.name, shape.kind, b, "skipped", f"time budget {budget_s:.0f} s spent"))
        _log(f"{shape.name}: skipped (time budget)")
        return results
    _log(f"{shape.name}: B={shape.B} Hq/Hkv/D={shape.Hq}/{shape.Hkv}/{shape.D} Lq={shape.Lq} Lk={shape.Lk} "
         f"W={shape.W} C={shape.C}")
    try:
        sets = _inputs(shape, device, dtype, _n_sets(shape, elt, cuda))
    except Exception as e:
        for b in backends:
            results.append(Result(shape.name, shape.kind, b, "error", f"inputs: {type(e).__name__}: {e}"))
        return results
    gate = Gate(shape, *sets[0])
    for b in backends:
        if time.perf_counter() - t_start > budget_s:
            results.append(Result(shape.name, shape.kind, b, "skipped", f"time budget {budget_s:.0f} s spent"))
            continue
        t0 = time.perf_counter()
        r = bench_one(shape, b, sets, gate, timer, ceilings, device)
        results.append(r)
        _log(f"  {b:<9} {r.status:<8} kernel {_fmt(r.kernel_us)} us, eager {_fmt(r.eager_us)} us, "
             f"host {_fmt(r.host_us)} us, "
             f"{_fmt(r.tflops, '.4g')} TFLOP/s{'' if r.gbps is None else f', {r.gbps:.4g} GB/s'}"
             f"{'' if not r.reason else '  (' + r.reason[:150] + ')'}"
             f"{'' if not r.graph_note else '  [' + r.graph_note[:100] + ']'}"
             f"  [first call {r.extra.get('first_call_s', '-')} s, {time.perf_counter() - t0:.1f} s, "
             f"total {time.perf_counter() - t_start:.0f} s]")
    gate.release()
    del sets, gate
    if cuda:
        torch.cuda.empty_cache()
    return results


def write_outputs(args, results: list[Result], info: dict, ceilings: dict, shapes: list[Shape],
                  workers: dict | None = None) -> None:
    """The table on stdout, then ``--json``, ``--md``, ``--png``. ``workers``
    (``-n`` runs): per-worker device info, printed and added to the JSON."""
    _log("")
    _log(table(results, ceilings))
    if workers is not None:
        _log(worker_lines(workers))
    if args.json:
        data = dict(info=info, ceilings=ceilings, shapes=[asdict(s) for s in shapes],
                    results=[asdict(r) for r in results])
        if workers is not None:
            data["workers"] = workers
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)
        _log(f"wrote {args.json}")
    if args.md:
        write_md(args.md, markdown(results, info, ceilings))
        _log(f"updated {args.md} between {MD_BEGIN} and {MD_END}")
    if args.png:
        try:
            plot(results, ceilings, args.png, f"hils-swa bench: {info['device_name']}, torch {info['torch']}, "
                                              f"commit {info['commit']}")
            _log(f"wrote {args.png}")
        except Exception as e:  # e.g. no row to draw; the table and JSON above stand
            _log(f"plot {args.png} failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")


def worker_lines(workers: dict) -> str:
    lines = ["workers (pytest-xdist, one GPU each; % columns against each worker's own ceilings):"]
    for wid, w in workers.items():
        c = w.get("ceilings") or {}
        lines.append(f"  {wid:<4} CUDA_VISIBLE_DEVICES={w.get('cuda_visible_devices')}  {w.get('device_name')}  "
                     f"pci {w.get('pci_bus_id') or '-'}  matmul {_fmt(c.get('matmul_tflops'), '.4g')} TFLOP/s, "
                     f"copy {_fmt(c.get('copy_gbps'), '.0f')} GB/s  [{w.get('wall_s', '-')} s]  "
                     f"shapes: {', '.join(w.get('shapes', []))}")
        if w.get("replacement"):
            lines.append(f"       {wid} replaced a crashed worker; pinned by its index it may have shared its GPU "
                         "with a live worker: treat its timings with suspicion")
    return "\n".join(lines)


def exit_status(results: list[Result]) -> int:
    bad = [r for r in results if r.status in ("error", "refused")]
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list:
        for s in shape_pool(args.smoke):
            _log(f"{s.name:<26} {s.kind:<8} B={s.B} Hq={s.Hq} Hkv={s.Hkv} D={s.D} Lq={s.Lq} Lk={s.Lk} "
                 f"W={s.W} C={s.C}  visible pairs/head={s.pairs()}")
        return 0
    conf = _configure(args)
    if isinstance(conf, int):
        return conf
    device, shapes, backends, reps = conf
    if args.workers is not None:
        from . import bench_xdist

        try:
            n = bench_xdist.resolve_workers(args.workers, device)
        except ValueError as e:
            print(f"hils-swa bench: {e}", file=sys.stderr)
            return 2
        if n > 1:
            return bench_xdist.run(args, device, shapes, backends, reps, n)
    cuda = device.startswith("cuda")
    if args.flex_static:
        from . import flex_backend

        flex_backend.DYNAMIC = False
    dtype = torch.bfloat16
    t_start = time.perf_counter()
    timer = Timer(device, reps)
    info = run_info(device, reps, args.commit)
    _log(f"hils-swa bench on {info['device_name']} (torch {info['torch']}, triton {info['triton']}): "
         f"{len(shapes)} shapes x {len(backends)} backends ({', '.join(backends)}), {reps} reps, "
         f"budget {args.budget_s:.0f} s")
    if not cuda:
        _log("  CUDA graphs skipped: device is CPU, so the kernel-only column stays empty and TFLOP/s use the "
             "eager time (smoke mode exercises the code paths; its numbers mean nothing)")
    ceilings = measure_ceilings(timer, dtype, t_start)

    results: list[Result] = []
    for shape in shapes:
        results += bench_shape(shape, backends, device, dtype, timer, ceilings, t_start, args.budget_s)

    info["wall_s"] = round(time.perf_counter() - t_start, 1)
    write_outputs(args, results, info, ceilings, shapes)
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
