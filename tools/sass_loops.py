"""Static SASS of TileLang's tensor-core kernel on the CPU: registers, spills and the loops.

    python -m tools.sass_loops --D 64 --variant shipped --variant prev-64x128 [--C 64]
    python -m tools.sass_loops --D 128 --variant dec-shipped --variant dec-nolmkconst

Builds ``kernels.fwd_tc`` for sm_90a with nvcc (no GPU), as TileLang builds it, for each
named config (a variant of ``tools/lab_tilelang.py``: its prefill table ``VARIANTS``, or its
decode table ``DECODE_VARIANTS``, whose split-KV variants build the split kernel; or
``shipped``: ``launch.shipped_config``) at one call shape (bf16, both flags, BHLD, the
default scale, kernel-frame chunk ``--C``, the chunk view of ``v`` where the call admits it:
``kv_start`` and ``Lk`` whole chunks), and prints, per kernel: the registers a thread
launches with, stack / local memory (spills), the ``setmaxnreg`` split, the instruction
count, and every loop whose body issues ``HGMMA`` (instructions from the back branch's
target to the branch, HGMMA, ``MUFU.EX2`` and the branch's address). The first such loop
is the consumer's key loop: the figure sessions 38 and 39 compared (the D = 64 key loop of
the 64x128 tile, which one-block calls run, at C = 64: 957 instructions before ``lmk_const``,
729 with it). Then every back branch of the producer's key loop (TMA loads, no HGMMA:
instructions, ``UTMALDG``, ``MUFU.RCP``), the figures sessions 46 and 47 compared.

Counts are static: an instruction count is not a time (the loop is latency-bound, BENCHMARKS.md
"What bounds each miss"); they are the evidence a lab prediction is written from.
``build(args, kind)`` (``kind`` another factory of ``kernels``, e.g. ``"fwd_fp32"``; the
command line builds ``fwd_tc``) and ``loops(sass)`` are what tests/test_tilelang_compile.py uses.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile


def with_disassembler() -> None:
    """Put the triton wheel's ``cuobjdump`` / ``nvdisasm`` on PATH (TileLang looks there)."""
    try:
        import triton
    except ImportError:
        return
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    if os.path.isdir(bindir) and bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def build(args: tuple, kind: str = "fwd_tc") -> tuple[str, str, str]:
    """CUDA source, SASS and ``cuobjdump -res-usage`` text of the ``kernels.<kind>`` kernel
    with factory arguments ``args``, its cubin built for sm_90a as TileLang builds it."""
    import tilelang
    from tilelang.contrib import nvcc as tl_nvcc

    from tilelang_impl import kernels
    with_disassembler()
    jit = getattr(kernels, kind)
    ker = tilelang.compile(jit.get_tir(*args), target=kernels.HOPPER,
                           pass_configs=jit.pass_configs)
    src = ker.get_kernel_source()
    with kernels.HOPPER:
        cubin = tl_nvcc.compile_cuda(src, target_format="cubin",
                                     options=tl_nvcc.default_compile_options(ker.compile_flags))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run(["cuobjdump", "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
        sass = subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True,
                              text=True, check=True).stdout
    return src, sass, res


_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", re.M)
_TARGET = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def instructions(sass: str) -> list[tuple[int, str]]:
    """``(address, text)`` of every instruction of ``cuobjdump -sass`` output."""
    return [(int(a, 16), t) for a, t in _INSTR.findall(sass)]


def back_branches(sass: str) -> list[tuple[int, int, list[str]]]:
    """``(target, branch, body)`` of every backward branch of ``cuobjdump -sass`` output, the
    body the instructions from its target to the branch, both included, in branch order."""
    ins = instructions(sass)
    at = {a: i for i, (a, _) in enumerate(ins)}
    out = []
    for i, (a, text) in enumerate(ins):
        m = _TARGET.search(text)
        target = int(m.group(1), 16) if m else a
        if target < a and target in at:
            out.append((target, a, [t for _, t in ins[at[target]:i + 1]]))
    return out


def _counted_loops(sass: str, counts: dict, keep) -> list[dict]:
    """Every backward branch whose body (its target to the branch, both included) ``keep``
    accepts (called with the body's counts and the body): ``instructions``, for each ``name:
    opcode`` of ``counts`` the body's instructions that contain ``opcode``, ``start`` and
    ``branch`` addresses, in the order of the branches."""
    out = []
    for target, a, body in back_branches(sass):
        n = {name: sum(op in t for t in body) for name, op in counts.items()}
        if keep(n, body):
            out.append(dict(instructions=len(body), **n, start=hex(target), branch=hex(a)))
    return out


def loops(sass: str) -> list[dict]:
    """Every backward branch whose body (its target to the branch, both included) issues
    ``HGMMA``: ``instructions``, ``hgmma``, ``ex2`` (``MUFU.EX2``), ``start`` and ``branch``
    addresses, in the order of the branches."""
    return _counted_loops(sass, dict(hgmma="HGMMA", ex2="MUFU.EX2"), lambda n, _: n["hgmma"])


def producer_loops(sass: str) -> list[dict]:
    """Every backward branch whose body issues TMA loads (``UTMALDG``) and no ``HGMMA``: the
    warp-specialised producer's key loop as nvcc laid it out (several nested back branches
    where it peels or unrolls the loop): ``instructions``, ``tma`` (``UTMALDG``), ``rcp``
    (``MUFU.RCP``: a runtime integer division's reciprocal), ``start`` and ``branch``
    addresses, in the order of the branches. Per tile: a body's instructions over its TMA
    loads times the loads one tile issues (two at D = 64, K and V; four at D = 128)."""
    return _counted_loops(sass, dict(tma="UTMALDG", rcp="MUFU.RCP"),
                          lambda n, body: n["tma"] and not any("HGMMA" in t for t in body))


def summary(src: str, sass: str, res: str) -> dict:
    """What :func:`main` prints of one kernel: registers at launch, stack and local bytes,
    the ``setmaxnreg`` values in the source, spill instructions, instruction count, loops
    (:func:`loops`) and the producer's (:func:`producer_loops`)."""
    def field(name):
        m = re.search(rf"\b{name}:(\d+)", res)
        return int(m.group(1)) if m else None
    body = [t for _, t in instructions(sass)]
    ops = [w[1] if w[0].startswith("@") and len(w) > 1 else w[0] for w in map(str.split, body) if w]
    return dict(registers=field("REG"), stack=field("STACK"), local=field("LOCAL"),
                setmaxnreg=[int(x) for x in re.findall(r"warpgroup_reg_(?:alloc|dealloc)<(\d+)>", src)],
                spills=sum(op.startswith(("LDL", "STL")) for op in ops),
                instructions=len(body), loops=loops(sass), producer=producer_loops(sass))


def config_of(name: str, D: int) -> tuple[tuple, bool]:
    """The config of ``name`` at head dim ``D`` and whether it is a split-KV kernel:
    ``shipped``, a prefill variant of tools/lab_tilelang.py, or a decode variant (its plan's
    split: the split kernel; else the prefill grid's kernel)."""
    from tilelang_impl import launch
    if name == "shipped":
        return launch.shipped_config(D, D), False
    from tools import lab_tilelang as lab
    try:
        plan = lab._tables(name)[0]
    except KeyError:
        raise SystemExit(f"unknown variant {name!r}: 'shipped' or one of tools/lab_tilelang.py's "
                         f"variants ({', '.join(sorted(lab.VARIANTS) + sorted(lab.DECODE_VARIANTS))})")
    cfg, split = plan(D)
    return cfg, bool(split)


def kernel_args(config: tuple, D: int, C: int, split: bool = False) -> tuple:
    """``kernels.fwd_tc``'s factory arguments for the tool's call shape at head dim ``D``:
    bf16, both flags, BHLD, the default scale, kernel-frame chunk ``C``, the chunk view of v
    (the call admits it: ``kv_start`` and ``Lk`` whole chunks); the split-KV kernel with
    ``split``."""
    from reference.validation import default_scale
    from tilelang_impl import launch
    return launch.tc_kernel_key(D, D, "bfloat16", True, True, False, False, config, C,
                                launch.LOG2E * default_scale(D), split=split, view=True)[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.sass_loops", description=__doc__.split("\n\n")[0])
    ap.add_argument("--D", type=int, default=64, help="head dim (Dqk = Dv)")
    ap.add_argument("--C", type=int, default=64, help="kernel-frame chunk of the call")
    ap.add_argument("--variant", action="append", default=None,
                    help="'shipped' or a prefill variant of tools/lab_tilelang.py (repeatable; "
                         "default: shipped)")
    a = ap.parse_args(argv)
    for name in a.variant or ["shipped"]:
        cfg, split = config_of(name, a.D)
        s = summary(*build(kernel_args(cfg, a.D, a.C, split)))
        kind = "split-KV" if split else "tile"
        print(f"{name} D={a.D} C={a.C} {kind} {cfg[0]}x{cfg[1]}: {s['instructions']} instructions, "
              f"{s['registers']} registers at launch, setmaxnreg {s['setmaxnreg']}, "
              f"stack {s['stack']} local {s['local']}, {s['spills']} spill instructions")
        for lp in s["loops"]:
            print(f"  loop {lp['start']}..{lp['branch']}: {lp['instructions']} instructions, "
                  f"{lp['hgmma']} HGMMA, {lp['ex2']} MUFU.EX2")
        for lp in s["producer"]:
            print(f"  producer {lp['start']}..{lp['branch']}: {lp['instructions']} instructions, "
                  f"{lp['tma']} UTMALDG, {lp['rcp']} MUFU.RCP")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
