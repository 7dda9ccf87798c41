"""Lower every TileLang GPU kernel a conformance tier asks for, on the CPU.

    python -m tools.tl_lower [--tier full] [--sms 132] [-j 2] [--only gqa_pack,...] [--where EXPR]

Run it before a GPU run that reaches new TileLang kernels: about 10 minutes on 2
cores for the full tier's 215 kernels (128 with fp16 folded; ``tilelang-split``'s
included), 151 s on the device host's 16 (session 16, 128/128).

TileLang builds a kernel on its first call, on the GPU machine: a kernel that its
lowering passes refuse (ThreadSync, layout inference) shows up there as a crashed
case, after the device time is spent. Session 12 found four ``gqa_pack`` cases that
way (a packed kernel with G = 2, both flags off and Dqk != Dv on the 64x64 tile).
This tool finds such kernels without a GPU:

1. :func:`tier_kernels` runs the CUDA path of the TileLang adapter for every case of
   the tier on ``meta`` tensors (no data, no device), in the case's own layout and
   dtype, with the device's SM count (132: H200) for the launcher's grid choices and
   ``launch._kernel`` replaced by a recorder: the ``(factory, arguments)`` each call
   would build, deduplicated (the combine of every split kernel included).
2. :func:`lower_one` lowers each through TileLang's passes for sm_90a
   (``tilelang.lower``: TIR to CUDA source, no nvcc), in worker processes.

Exit status 1 when any kernel fails to lower; the failures are printed with the
cases that need them. ``tools/gpu_all.sh`` runs it on the device host before the
GPU tier, over the categories of the call, with fp16 kernels folded into their bf16
twins (:func:`fold_dtypes`); CI tests the tool (``tests/test_tilelang_lowering.py``)
but no longer runs the sweep (848 s of the 2360 s of test time of a 2-core CI run at
62cc54a, session 16). It proves
lowering only: nvcc and the SASS checks are ``tests/test_tilelang_compile.py``'s,
and running is the GPU tier's.

``--changed-by PATCH`` (``tools/lab_patch.py``'s syntax for a table of ``tilelang_impl.launch``,
e.g. ``'TC_WIDER[80]=96'``; repeatable) plans the tier twice, as shipped and patched, names the
cases whose kernels differ (:func:`changed_cases`; ``--ids-out`` writes them for
``tools/gpu_all.sh``'s ``ONLY``, and refuses, exit status 1, to write none: an empty ``ONLY``
runs the whole tier) and lowers only the kernels the patch adds. Only kernels are compared:
a table that changes how a call runs without changing a kernel's arguments changes no case
here.

``--build`` (on the GPU host) builds the kernels instead, nvcc included, each exactly as
the launcher would (:func:`build_one`), into TileLang's disk cache: a later process on
that machine loads them instead of compiling them. ``tools/gpu_sanitize.sh`` runs it
before its sanitized runs, which take one case at a time: session 35's memcheck of
TileLang on ``long4m`` and ``reach`` spent 8-53 s on each check that compiled a kernel and
0.4-1.4 s on the others, and ran out of its 420 s after 28 of 32 checks.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch


@contextlib.contextmanager
def recording(sms: int = 132):
    """Within it, ``launch._kernel`` builds nothing: each ``(kind, args)`` a call asks for is
    appended to the list it yields (the launcher's stub runs nothing), and ``launch.sm_count``
    is ``sms``, so calls planned on ``meta`` tensors ask for what a GPU of ``sms`` SMs runs."""
    from tilelang_impl import launch

    got: list[tuple] = []

    def record(kind, *args):
        got.append((kind, args))
        return lambda *a: None

    saved = launch._kernel, launch.sm_count
    launch._kernel, launch.sm_count = record, (lambda device: sms)
    try:
        yield got
    finally:
        launch._kernel, launch.sm_count = saved


def tier_kernels(tier: str = "full", sms: int = 132,
                 categories=None, where=None) -> dict[tuple, list[str]]:
    """``{(kind, args): [case ids]}`` of the TileLang GPU kernels the CUDA cases of
    ``tier`` (``categories``: those ``--only`` selects with these names, categories, case
    ids or id globs; ``where``: expressions over the case's fields, conform's ``--where``:
    ``conformance.selection.select``) build, every kernel a call requests
    (the split kernel and its combine), with the default backend ``tilelang`` and the
    optional ``tilelang-split`` (split-KV forced where a split variant exists)."""
    from conformance.cases import _store, generate, input_layouts
    from conformance.selection import select
    from reference.errors import UnsupportedConfig
    from tilelang_impl import api, launch

    wanted: dict[tuple, list[str]] = {}
    with recording(sms) as got:
        cases = generate(tier, "cuda")
        for case in select(cases, list(categories) if categories else None, exprs=where):
            if case.error is not None:
                continue
            dt = case.torch_dtype
            shapes = ((case.B, case.Hq, case.Lq, case.Dqk), (case.B, case.Hkv, case.Lk, case.Dqk),
                      (case.B, case.Hkv, case.Lk, case.Dv))
            q, k, v = (_store(torch.empty(s, dtype=dt, device="meta"), lay)
                       for s, lay in zip(shapes, input_layouts(case)))
            try:  # the adapter's own checks, on meta tensors
                p = api._problem(q, k, v, devices=("meta",), **case.kwargs())
            except (UnsupportedConfig, ValueError):
                continue  # refused before any kernel: nothing is built
            if p.empty:
                continue
            start = len(got)
            api._run_cuda(p, q, k, v)  # at the kernels' head dims (api._kernel_call)
            S = launch.forced_plan(api._kernel_problem(p)[0])
            if S is not None:  # the optional backend tilelang-split on the case
                api._run_cuda(p, q, k, v, force_split=S)
            for job in got[start:]:
                wanted.setdefault(job, []).append(case.id)
    return wanted


def by_case(wanted: dict[tuple, list[str]]) -> dict[str, set[tuple]]:
    """``{case id: {(kind, args)}}``: :func:`tier_kernels`' map turned round."""
    out: dict[str, set[tuple]] = {}
    for job, ids in wanted.items():
        for i in ids:
            out.setdefault(i, set()).add(job)
    return out


def changed_cases(before: dict[tuple, list[str]], after: dict[tuple, list[str]]) -> list[str]:
    """The case ids whose kernels differ between two :func:`tier_kernels` maps (a case in
    one only counts), in the order they first appear: what a GPU run must repeat after a
    change of the launcher's tables, and nothing else."""
    a, b = by_case(before), by_case(after)
    ids = dict.fromkeys([*(i for ids in before.values() for i in ids),
                         *(i for ids in after.values() for i in ids)])
    return [i for i in ids if a.get(i) != b.get(i)]


def fold_dtypes(wanted: dict[tuple, list[str]]) -> dict[tuple, list[str]]:
    """``wanted`` with every fp16 tensor-core kernel folded into its bf16 twin (the same
    TIR but the element type: the lowering passes that refuse kernels, ThreadSync and
    layout inference, do not look at it; nvcc does, ``tests/test_tilelang_compile.py``)."""
    out: dict[tuple, list[str]] = {}
    for (kind, args), cases in wanted.items():
        if kind == "fwd_tc" and args[2] == "float16":
            args = args[:2] + ("bfloat16",) + args[3:]
        out.setdefault((kind, args), []).extend(cases)
    return out


def widened(wanted: dict[tuple, list[str]]) -> dict[tuple, list[str]]:
    """``wanted`` with each kernel that tests landmarks replaced by its twin built ``wide``
    (``kernels.fwd_tc`` / ``fwd_fp32``'s knob, two float quotients in the landmark test):
    the kernels the same calls would take with a cache past 2**22 keys
    (``launch.wide_positions``); the combine, which has no landmark test, and any other
    kind are left out.
    ``--wide`` lowers these (session 31: all 199 of the full tier's, fp16 folded)."""
    from tilelang_impl import launch

    out: dict[tuple, list[str]] = {}
    for (kind, args), cases in wanted.items():
        if kind == "fwd_tc":
            knobs = launch.full_knobs(args[launch._KNOBS_AT:])  # left out: defaults
            knobs[launch._KNOB["wide"]] = True
            args = args[:launch._KNOBS_AT] + launch.trimmed_knobs(knobs)  # as launch.call_knobs
        elif kind == "fwd_fp32":
            args = launch.fp32_wide_args(args)
        else:
            continue
        out.setdefault((kind, args), []).extend(cases)
    return out


def lower_one(job: tuple) -> str | None:
    """Lower one ``(kind, args)`` for its target; None, or the error's first line."""
    import tilelang

    from tilelang_impl import kernels
    kind, args = job
    jit = getattr(kernels, kind)
    target = getattr(jit, "target", None) or kernels.HOPPER  # fwd_fp32: "auto", built for the GPU found
    try:
        func = jit.get_tir(*args)
        with tilelang.transform.PassContext(config=jit.pass_configs or {}), kernels.HOPPER:
            tilelang.lower(func, target=target)
    except Exception as e:  # noqa: BLE001 -- reported, not raised: the list is the result
        return _first_error_line(e)
    return None


def build_one(job: tuple) -> str | None:
    """Build one ``(kind, args)`` exactly as the launcher does (``launch._kernel``: the
    ``@tilelang.jit`` factory called with the arguments, lowering and nvcc included), which
    leaves the kernel in TileLang's disk cache (``~/.tilelang``) for every later process on
    this machine; None, or the error's first line."""
    from tilelang_impl import kernels
    kind, args = job
    try:
        getattr(kernels, kind)(*args)
    except Exception as e:  # noqa: BLE001 -- reported, not raised: the list is the result
        return _first_error_line(e)
    return None


def _first_error_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return next((t for t in text if "Error" in t or "[" in t), text[0] if text else repr(e))


def lower_all(jobs: list[tuple], workers: int, build: bool = False) -> dict[tuple, str]:
    """``{job: error}`` of the jobs that fail to lower (``build``: to build; worker
    processes, TileLang's passes are not thread-safe)."""
    one = build_one if build else lower_one
    if workers <= 1:
        errors = {j: one(j) for j in jobs}
    else:
        with ProcessPoolExecutor(workers) as ex:
            errors = dict(zip(jobs, ex.map(one, jobs, chunksize=1)))
    return {j: e for j, e in errors.items() if e is not None}


def default_workers() -> int:
    """The CPUs this process may run on, at most 16 (the device host's cores)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(16, cpus))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tier", default="full", choices=("quick", "full"))
    ap.add_argument("--sms", type=int, default=132, help="SM count of the GPU the tier runs on")
    ap.add_argument("-j", "--workers", type=int, default=default_workers(),
                    help="processes (default: this process's CPUs, at most 16: the device "
                         "host's cores; gpu_all.sh and gpu_sanitize.sh take the default)")
    ap.add_argument("--only", default="",
                    help="comma-separated categories, case ids or id globs (conform's --only; "
                         "gpu_all.sh passes its ONLY)")
    ap.add_argument("--where", action="append", default=None, metavar="EXPR",
                    help="conform's --where: an expression over the case's fields (repeatable; "
                         "gpu_all.sh passes its WHERE)")
    ap.add_argument("--fold-dtypes", action="store_true",
                    help="lower each fp16 kernel's bf16 twin only (fold_dtypes; what gpu_all.sh runs)")
    ap.add_argument("--wide", action="store_true",
                    help="lower each kernel's twin built wide instead (widened: what the same "
                         "calls take past 2**22 positions)")
    ap.add_argument("--changed-by", action="append", default=[], metavar="PATCH",
                    help="a patch of tilelang_impl.launch's tables (tools/lab_patch's syntax, "
                         "repeatable): name the cases whose kernels it changes and lower (or "
                         "build) only the kernels it adds")
    ap.add_argument("--ids-out", metavar="FILE",
                    help="with --changed-by: write the changed case ids there, comma-separated "
                         "(gpu_all.sh's ONLY)")
    ap.add_argument("--build", action="store_true",
                    help="build each kernel as the launcher does (nvcc included) into TileLang's "
                         "disk cache instead of lowering it: on the GPU host, before a run that "
                         "would compile them one at a time (tools/gpu_sanitize.sh)")
    a = ap.parse_args(argv)
    if a.build and a.fold_dtypes:
        ap.error("--build builds the kernels the tier calls: --fold-dtypes would build bf16 "
                 "twins no call takes")
    if a.ids_out and not a.changed_by:
        ap.error("--ids-out writes the cases --changed-by changes")
    t0 = time.time()
    only = a.only.split(",") if a.only else None
    try:
        patches = []
        if a.changed_by:
            from tilelang_impl import launch
            from tools.lab_patch import parse_patch, patched
            patches = [parse_patch(launch, t) for t in a.changed_by]
        wanted = tier_kernels(a.tier, a.sms, only, a.where)
    except ValueError as e:  # a bad patch, a selection that matches nothing, a bad expression
        ap.error(str(e))
    if patches:
        try:
            with patched(launch, patches):
                after = tier_kernels(a.tier, a.sms, only, a.where)
        except Exception as e:  # a value the planner cannot use (a str for a count, ...)
            ap.error(f"the planner refuses {a.changed_by}: {type(e).__name__}: {e}")
        ids = changed_cases(wanted, after)
        print(f"{len(ids)} cases of the {a.tier} tier change kernels under {a.changed_by}: "
              + ",".join(ids), flush=True)
        if a.ids_out and not ids:  # an empty ONLY would run gpu_all.sh's whole tier
            print(f"no case changes: {a.ids_out} not written")
            return 1
        if a.ids_out:
            with open(a.ids_out, "w") as f:
                f.write(",".join(ids))
        wanted = {j: c for j, c in after.items() if j not in wanted}
    if a.fold_dtypes:
        wanted = fold_dtypes(wanted)
    if a.wide:
        wanted = widened(wanted)
    jobs = list(wanted)
    kinds = sorted({k for k, _ in jobs})
    print(f"{len(jobs)} TileLang kernels ({', '.join(kinds)}) for the {a.tier} GPU tier "
          f"({a.sms} SMs); {'building' if a.build else 'lowering'} with {a.workers} processes",
          flush=True)
    bad = lower_all(jobs, a.workers, build=a.build)
    for (kind, args), err in bad.items():
        cases = wanted[(kind, args)]
        print(f"FAIL {kind}{args}\n  {err}\n  cases ({len(cases)}): {', '.join(cases[:4])}"
              + (" ..." if len(cases) > 4 else ""))
    print(f"{len(jobs) - len(bad)}/{len(jobs)} {'built' if a.build else 'lower'}, "
          f"{time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
