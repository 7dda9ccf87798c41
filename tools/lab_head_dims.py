"""Lab (session 57): TileLang's own kernel at a head dim against a wider one reading the
call's inputs narrow (``launch.TC_WIDER``), one device call.

    PYTHONUNBUFFERED=1 python -m tools.lab_head_dims --out $OUT/lab-head-dims.json \\
        [--dims 48,80,96,112] [--shapes prefill,decode1,decode8]
    python -m tools.lab_head_dims --out $OUT/lab.json --dims 80:96,80   # 80 -> 96 and -> 128

Why. TileLang copies a tile of ``D`` columns in boxes of 64 columns (128-byte swizzle) where
64 divides ``D``, else of 32, else of 16 (the generated CUDA of the shipped tile at 850ef71,
lowered on the CPU at every head dim named here): 16 columns at 48, 80, 112, 144, 176, 208,
240; 32 at 96, 160, 224. On an H100 at 850ef71 (BENCHMARKS.md, session 57) the D = 112
prefill (32/32, L = 8K, bf16) took 297 us against D = 128's 196. The likely cause, not
profiled: 32-byte box rows take four times the copy engine's requests of 128-byte ones, and
requests cost (rows 16 bytes off a 32-byte sector took 2.8x the D = 128 kernel's L2 requests
and 22% more time). A call at such a head dim can run on the kernel of the next multiple of
64 instead, the copy engine filling the columns past the call's with zeros (the narrow reads
of session 56: ``qk_cols`` / ``v_cols``), for more matrix work: ``launch.TC_WIDER`` says
which.

What runs. For each head dim ``D`` and shape, bf16, W = 512, C = 64, fresh random inputs:
``own`` (``TC_WIDER`` without ``D``: its own kernel), ``wider`` (``TC_WIDER[D]`` = the next
multiple of 64; ``--dims D:W`` names another target ``W``, a multiple of 32 above ``D``, and
its variant ``wider:W``), and once per wider head dim ``at-wider`` (the same shape at that
head dim, its own kernel: the ceiling a widened call can reach). Every kernel is built first in
parallel processes (``tools.tl_lower.lower_all``) from the calls planned on ``meta`` tensors
for 132 SMs (H100 SXM, H200; elsewhere the calls build what the plan missed themselves); an
item whose kernel does not build is reported and not run. Checks: the ``own`` and ``wider``
outputs of the same inputs compared: no NaN, the same ``-inf`` LSE rows, ``o`` within
:data:`O_TOL` and ``lse`` within :data:`LSE_TOL` of each other (and whether the bits agree);
the exit status is 1 where a check, a build or a graph capture fails. The conformance tier,
not this screen, judges what ships. Timing: kernel only (``tools.bench.Timer.graph``:
CUDA-graph replay, L2 flushed before each replay), ``--rounds`` interleaved rounds
alternating the order; TFLOP/s over visible pairs at the call's own ``D``. The JSON is
written after the checks and after every round.

Predicted before any GPU run (session 57): the widened D = 112 prefill within 200-260 us
(the D = 128 kernel, 196 us at full width, on 224-byte rows, 32-byte aligned, so without the
misaligned rows' extra requests; the 16 columns past the call's read as zero fill, whose
cost is not measured: session 56's D = 120 narrow call, whose rows are misaligned too, took
258 us); D = 80 and 48 faster widened (their own kernels have 16-column boxes too); D = 96,
with 32-column boxes, not predicted (its own kernel does 3/4 of the wider one's matrix work).
Measured in session 58 (an H100 at 663faa3, bench_results/tilelang-head-dims-h100-a71cfdf.json):
D = 112 widened 200.4 us against 296.8, D = 48 115.2 against 134.8, D = 80 193.8 against
217.4 (but a B = 1 decode 1.05x), D = 96 194.9 against 175.9; ``launch.TC_WIDER`` took 48
and 112.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch

#: name -> (B, Hq, Hkv, Lq, Lk): a prefill, a B = 1 decode (split-KV) and a packed GQA decode.
SHAPES = {
    "prefill": (1, 32, 32, 8192, 8192),
    "decode1": (1, 32, 32, 1, 8192),
    "decode8": (8, 32, 8, 1, 4096),
}
RULE = dict(window_size=512, chunk_size=64, kv_start=0, mask_lmk=True, expand_to_chunk=True)
VARIANTS = ("own", "wider", "at-wider")  # and "wider:W", a target W named on the command line
#: The screen's bounds between ``own`` and ``wider`` on the same inputs (bf16 ``o`` of about
#: unit size, which both round from float32 sums of the same products in another order;
#: float32 ``lse``).
O_TOL, LSE_TOL = 3e-2, 1e-3


def wider(D: int) -> int:
    """The next multiple of 64 above ``D`` (``D`` a multiple of 16 but not of 64)."""
    from tilelang_impl import launch
    if D % launch.D_STEP or D % 64 == 0 or not launch.MIN_D <= D <= launch.MAX_D:
        raise ValueError(f"head dim {D}: a multiple of {launch.D_STEP} but not of 64, in "
                         f"{launch.MIN_D}..{launch.MAX_D}")
    return -(-D // 64) * 64


def target(D: int, W: int) -> int:
    """``W``, checked as a head dim ``D`` may be widened to: a multiple of 32 (boxes of 32
    columns or more) above ``D``, at most ``launch.MAX_D``; ``D`` as :func:`wider` wants it."""
    from tilelang_impl import launch
    wider(D)
    if W % 32 or not D < W <= launch.MAX_D:
        raise ValueError(f"head dim {D} widened to {W}: the target must be a multiple of 32 "
                         f"in {D + 1}..{launch.MAX_D}")
    return W


def variant_of(D: int, W: int) -> str:
    """The variant that runs head dim ``D`` on the kernel of ``W``: ``wider`` where ``W`` is
    :func:`wider`'s, else ``wider:W``."""
    return "wider" if W == wider(D) else f"wider:{target(D, W)}"


def width(D: int, variant: str) -> int | None:
    """The kernel head dim a ``wider`` / ``wider:W`` variant of ``D`` runs; None for the
    others."""
    if variant == "wider":
        return wider(D)
    if variant.startswith("wider:"):
        return target(D, int(variant[len("wider:"):]))
    return None


def pairs(spec: list) -> list[tuple[int, int]]:
    """``(D, W)`` of each entry: a head dim (widened as :func:`wider` says) or ``(D, W)``."""
    return [(x, wider(x)) if isinstance(x, int) else (x[0], target(*x)) for x in spec]


@contextlib.contextmanager
def table(D: int, variant: str):
    """``launch.TC_WIDER`` as ``variant`` of head dim ``D`` wants it, restored after."""
    from tilelang_impl import launch
    saved = dict(launch.TC_WIDER)
    launch.TC_WIDER.pop(D, None)
    W = width(D, variant)
    if W is not None:
        launch.TC_WIDER[D] = W
    try:
        yield
    finally:
        launch.TC_WIDER.clear()
        launch.TC_WIDER.update(saved)


def inputs(shape: str, D: int, device, seed: int = 0):
    """``(q, k, v)`` bf16 of ``shape`` (a name of :data:`SHAPES`) at head dim ``D``
    (:func:`shape_inputs`)."""
    return shape_inputs(SHAPES[shape], D, device, seed)


def shape_inputs(dims: tuple, D: int, device, seed: int = 0):
    """``(q, k, v)`` bf16 of ``dims = (B, Hq, Hkv, Lq, Lk)`` at head dim ``D``: fresh normal
    values on ``device`` (``meta``: empty stand-ins)."""
    B, Hq, Hkv, Lq, Lk = dims
    sizes = ((B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D))
    if str(device) == "meta":
        return tuple(torch.empty(s, dtype=torch.bfloat16, device="meta") for s in sizes)
    g = torch.Generator(device="cpu").manual_seed(seed)
    return tuple(torch.randn(s, generator=g).to(torch.bfloat16).to(device) for s in sizes)


def items(dims: list, shapes: list[str]) -> list[tuple[str, int, str]]:
    """``(shape, D, variant)``: ``own`` once per head dim and shape, a ``wider`` variant per
    entry of ``dims`` (:func:`pairs`: ``D`` or ``(D, W)``), and ``at-wider`` once per shape
    and wider head dim (its ``D`` that head dim) that is not timed as ``own`` already (the
    same call: ``--dims 80:96,96``)."""
    todo = pairs(dims)
    out = []
    for s in shapes:
        for D in dict.fromkeys(d for d, _ in todo):
            out += [(s, D, "own")] + [(s, D, variant_of(D, W)) for d, W in todo if d == D]
        out += [(s, W, "at-wider") for W in sorted({W for _, W in todo})
                if (s, W, "own") not in out]
    return list(dict.fromkeys(out))


def _planned(item: tuple[str, int, str], fn):
    """``fn(p, q, k, v)`` for an item's call on ``meta`` tensors, its table set."""
    from tilelang_impl import api
    shape, D, variant = item
    q, k, v = inputs(shape, D, "meta")
    with table(D, variant):
        return fn(api._problem(q, k, v, devices=("meta",), sm_scale=None, **RULE), q, k, v)


def meta_jobs(dims: tuple, D: int) -> set[tuple]:
    """The ``(kind, args)`` kernels the call of ``dims = (B, Hq, Hkv, Lq, Lk)`` at head dim
    ``D`` builds with the tables as they stand, planned on ``meta`` tensors through the real
    adapter and launcher (``tools.tl_lower.recording``: nothing built)."""
    from tilelang_impl import api
    from tools.tl_lower import recording
    q, k, v = shape_inputs(dims, D, "meta")
    with recording() as got:
        api._run_cuda(api._problem(q, k, v, devices=("meta",), sm_scale=None, **RULE), q, k, v)
    return set(got)


def item_jobs(item: tuple[str, int, str]) -> set[tuple]:
    """:func:`meta_jobs` of an item's call, its table set."""
    shape, D, variant = item
    with table(D, variant):
        return meta_jobs(SHAPES[shape], D)


def jobs(todo: list[tuple[str, int, str]]) -> list[tuple]:
    """Every kernel the items' calls build (:func:`item_jobs`), each once."""
    return sorted(set().union(*(item_jobs(i) for i in todo)), key=repr)


def describe(shape: str, D: int, variant: str) -> str:
    """What ``describe_call`` says of an item's call, planned on ``meta`` tensors."""
    from tilelang_impl import api
    return _planned((shape, D, variant), api._describe)


def _compare(a, b) -> dict:
    """The screen of a ``wider`` variant's outputs ``a`` against ``own``'s ``b`` on the same
    inputs."""
    (o1, l1), (o0, l0) = a, b
    fin = torch.isfinite(l0)
    c = dict(max_abs_o=float((o1.float() - o0.float()).abs().max()),
             max_abs_lse=float((l1[fin] - l0[fin]).abs().max()) if bool(fin.any()) else 0.0,
             inf_rows_equal=bool(torch.equal(torch.isfinite(l1), fin)),
             nan=int(o1.isnan().sum() + o0.isnan().sum() + l1.isnan().sum() + l0.isnan().sum()),
             bits_equal=bool(torch.equal(o1.view(torch.int16), o0.view(torch.int16))
                             and torch.equal(l1.view(torch.int32), l0.view(torch.int32))))
    c["ok"] = (c["nan"] == 0 and c["inf_rows_equal"] and c["max_abs_o"] <= O_TOL
               and c["max_abs_lse"] <= LSE_TOL)
    return c


def run(dims: list, shapes: list[str], reps: int, rounds: int, workers: int,
        out: str | None = None, log=print) -> dict:
    from tools import tl_lower
    t0 = time.time()
    todo = items(dims, shapes)
    per_item = {i: item_jobs(i) for i in todo}
    need = sorted(set().union(*per_item.values()), key=repr)
    errs = tl_lower.lower_all(need, workers, build=True)  # before CUDA: worker processes fork
    log(f"built {len(need) - len(errs)} of {len(need)} kernels in {time.time() - t0:.0f} s")
    import tilelang_impl
    from tools.bench import Timer
    res = dict(device=torch.cuda.get_device_name(), rule=RULE,
               build_errors=[f"{kind}{args}: {e}" for (kind, args), e in errs.items()],
               not_run=[list(i) for i in todo if per_item[i] & set(errs)], rows=[], checks=[])

    def dump():
        res["seconds"] = time.time() - t0
        if out:
            with open(out, "w") as f:
                json.dump(res, f, indent=1)
    todo = [i for i in todo if not per_item[i] & set(errs)]
    timer = Timer("cuda", reps)
    calls, data = {}, {}
    for n, (shape, D, variant) in enumerate(todo):
        if (shape, D) not in data:  # own and wider read the same tensors
            data[(shape, D)] = inputs(shape, D, "cuda", seed=n)

        def call(q, k, v, D=D, variant=variant):
            with table(D, variant):
                return tilelang_impl.sliding_window_attention(q, k, v, **RULE)
        calls[(shape, D, variant)] = (call, data[(shape, D)], describe(shape, D, variant))
    outs = {key: c(*x) for key, (c, x, _) in calls.items() if key[2] != "at-wider"}
    torch.cuda.synchronize()
    for (shape, D, variant) in todo:
        if width(D, variant) is not None and (shape, D, "own") in outs:
            chk = dict(shape=shape, D=D, variant=variant,
                       **_compare(outs[(shape, D, variant)], outs[(shape, D, "own")]))
            res["checks"].append(chk)
            log(json.dumps(chk))
    del outs
    dump()
    timed = {key: (c, [x]) for key, (c, x, _) in calls.items()}
    for times, why in interleaved(timer, timed, rounds, log):
        res["rows"] = rows(times, why, SHAPES, {key: plan for key, (_, _, plan) in calls.items()})
        dump()
    log(summary(res))
    return res


def interleaved(timer, calls: dict, rounds: int, log=print):
    """Kernel-only times of ``calls`` (``{key: (call, input sets)}``, ``timer.graph``: CUDA-graph
    replay) in ``rounds`` rounds, each in the order of the one before reversed; after each
    round, yields ``(times, why)``: ``{key: [us per round]}`` and ``{key: reason}`` of the keys
    dropped because a graph could not be timed. Both labs time this way (``tools.lab_patch``)."""
    times = {key: [] for key in calls}
    why = {}
    for r in range(rounds):
        for key in (list(calls) if r % 2 == 0 else list(reversed(list(calls)))):
            if key in why:
                continue
            t, reason = timer.graph(*calls[key])
            if t is None:
                why[key] = reason
                log(f"{key}: not timed: {reason}")
            else:
                times[key].append(t * 1e3)
        yield times, why


def rows(times: dict, why: dict, shapes: dict, plans: dict) -> list[dict]:
    """The JSON rows of :func:`interleaved`'s ``(shape, D, variant)`` keys: the median us, the
    rounds, TFLOP/s over visible pairs at ``D`` (:data:`RULE`, ``shapes[shape]`` the sizes),
    why a key was not timed, and what its call ran (``plans``)."""
    from tools._common import attention_flops
    out = []
    for (shape, D, variant), us in times.items():
        B, Hq, _, Lq, Lk = shapes[shape]
        med = statistics.median(us) if us else None
        flops = attention_flops(B, Hq, Lq, Lk, D, **RULE)
        out.append(dict(shape=shape, D=D, variant=variant, us=med, rounds_us=us,
                        tflops=flops / (med * 1e-6) / 1e12 if med else None,
                        why=why.get((shape, D, variant)), plan=plans[(shape, D, variant)]))
    return out


def summary(res: dict) -> str:
    """One line per (shape, D, wider variant): the medians of own, the wider variant and
    at-wider of its width, and wider / own."""
    us = {(r["shape"], r["D"], r["variant"]): r["us"] for r in res["rows"]}

    def f(x, n, spec):
        return format(x, f"{n}{spec}") if x is not None else "-".rjust(n)
    lines = ["shape      D    W    own us  wider us  at-wider us  wider/own"]
    for (shape, D, variant), w in us.items():
        W = width(D, variant)
        if W is not None:
            t = us.get((shape, D, "own"))
            a = us.get((shape, W, "at-wider"), us.get((shape, W, "own")))  # items(): one of them
            ratio = w / t if w and t else None
            lines.append(f"{shape:8s} {D:3d} {W:4d} {f(t, 9, '.1f')} {f(w, 9, '.1f')} "
                         f"{f(a, 12, '.1f')} {f(ratio, 10, '.3f')}")
    return "\n".join(lines)


def _dims(text: str) -> list:
    """``--dims``: head dims ``D`` and pairs ``D:W``, comma-separated."""
    out = []
    for x in (x for x in text.split(",") if x):
        parts = [int(y) for y in x.split(":")]
        if len(parts) > 2:
            raise ValueError(f"{x!r}: a head dim D or a pair D:W")
        out.append(parts[0] if len(parts) == 1 else tuple(parts))
    return out


def main(argv=None) -> int:
    from tools.tl_lower import default_workers
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dims", default="48,80,96,112",
                    help="head dims, multiples of 16 not of 64; D:W widens D to W (a multiple "
                         "of 32) instead of the next multiple of 64")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("-j", "--workers", type=int, default=default_workers())
    a = ap.parse_args(argv)
    shapes = [s for s in a.shapes.split(",") if s]
    try:
        dims = _dims(a.dims)
        pairs(dims)
    except ValueError as e:
        ap.error(str(e))
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        ap.error(f"unknown shapes {bad}: of {', '.join(SHAPES)}")
    res = run(dims, shapes, a.reps, a.rounds, a.workers, a.out)
    ok = (not res["build_errors"] and all(c["ok"] for c in res["checks"])
          and not any(r["why"] for r in res["rows"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
