"""One producer warp in the warp-specialised kernels: the fix for a hang TileLang's code has.

TileLang 0.1.15's warp specialisation gives :func:`kernels.fwd_tc` a producer warp group of
128 threads (``setmaxnreg`` takes a whole warp group). One elected thread, lane 0 of the
group's warp 0 (``tl_shuffle_elect<128>``), issues every TMA load and its
``arrive_and_expect_tx``. All four warps run the producer's key loop, and before each load
all four wait on the consumers' "buffer free" mbarrier of the stage (``mbarrier[s].wait(p)``,
a parity wait). Warps 1-3 do nothing else, and nothing ties them to the pipeline.

A parity wait cannot tell phase ``n`` from phase ``n + 2``. So a warp that comes to its wait
for round ``r`` after the barrier has completed round ``r + 1`` waits for the round after.
In the loop's last round that round never comes: the consumers are done, and the warp spins
forever. This happened in session 41, on an H100 (``tools/lab_hang --gdb``,
``bench_results/lab-hang-occ3-h100-56da5a7.json``). ``occ3-64x64v`` (three CTAs per SM)
hung within 500 launches. cuda-gdb found one warp left on the whole GPU: producer warp 2
(thread 64) of one CTA, in ``mbarrier_wait``'s try-wait loop on the stage-0 key barrier.
Every other warp of the grid had exited. The same kernel held to two CTAs per SM by its
grid (256 programs on 132 SMs) ran 100,000 launches without a hang; with 512 programs it
hung again. A producer warp falls a round behind only when it waits long enough. Each
try-wait suspends the warp, and three CTAs per SM make that likely where two rarely do.
But the race is in every ``fwd_tc`` kernel, the shipped ones too.

The fix, :func:`guard`: a CUDA post-processing step (TileLang's
``tilelang_callback_cuda_postproc`` hook, registered by :func:`ensure` when
:mod:`tilelang_impl.kernels` is imported) rewrites the generated source of our kernels
only. Those are the ones whose entry point is :data:`KERNEL` ``+ "_kernel"``; any other
TileLang kernel of the process passes through unchanged, after any post-processor
registered before ours. Right before the producer's key loop, the producer's warps 1-3
leave the kernel. They have already run the ``setmaxnreg`` that the whole group must
run (where the kernel has one: TileLang leaves it out of some). Only warp 0 waits, and
it is the warp that issues the loads, so it can never see a barrier more than one phase
ahead (its lanes 1-31 are tied to lane 0, the elected one, by
the ``elect.sync`` of every round, which takes the full warp).

:func:`guard` first checks that leaving is safe: outside the elected thread's blocks the
loop only waits, declares integers from pure expressions and loops; nothing follows the
loop in the producer's branch; and the kernel ends with the producer / consumer branches.
A ``fwd_tc`` source of any other shape raises :class:`GuardError` at build time (TileLang
passes it on as a ``RuntimeError`` with its message), so a kernel is never built silently
without the guard. :func:`ensure` and :func:`check` see to it that a post-processor
registered after ours does not build one either. The prim_func carries
:data:`GUARD_VERSION` as an attribute, which is part of TileLang's disk-cache key: a change
to :func:`guard` that bumps it builds every kernel again.
"""
from __future__ import annotations

import re

#: The name of :func:`kernels.fwd_tc`'s prim_func: TileLang names the CUDA entry point
#: ``KERNEL + "_kernel"``, which is how :func:`guard` knows our kernels. (It was ``main``
#: before session 41. The name is part of TileLang's disk-cache key, so no kernel built
#: before the guard is served from a cache made before it.)
KERNEL = "hils_swa_fwd_tc"
#: The entry point (less ``_kernel``) of a ``producer_warps = 4`` kernel (a lab value,
#: ``kernels.PRODUCER_WARPS``): :func:`guard` leaves it as TileLang wrote it.
KERNEL_ALL_WARPS = KERNEL + "_allwarps"
#: Bumped with every change to what :func:`guard` writes: ``kernels.fwd_tc`` puts it in the
#: prim_func's attributes (``hils_swa_producer_guard``), so TileLang's disk cache, whose key
#: holds the prim_func's script but not the post-processing, builds the kernels again.
GUARD_VERSION = 1
#: The comment :func:`guard` leaves in the source (:func:`guarded` looks for it).
MARK = "hils-swa producer guard"

_BRANCH = re.compile(r"\n([ \t]*)if \(\(\(int\)threadIdx\.x\) < 128\) \{\n")
_LOOP = re.compile(r"\n([ \t]*)for \(int kb = 0; ")
_ELECT = re.compile(r"if \(tl::tl_shuffle_elect<128>\(\)\) \{")
#: What warps 1-3 may do in the producer's loop outside the elected thread's blocks: wait
#: on an mbarrier, declare an integer, loop, and nothing else; every expression in them pure
#: (:func:`_pure`).
_WAIT = re.compile(r"mbarrier\[(.+)\]\.wait\((.+)\);")
_DECL = re.compile(r"(?:int|int64_t) \w+ = (.+);")
_FOR = re.compile(r"for \(int (\w+) = (\d+); \1 < (.+); \+\+\1\) \{")
_CALL = re.compile(r"(\w+)\s*\(")


def _pure(expr: str) -> bool:
    """Whether ``expr`` (generated C) only computes: names, numbers, arithmetic, compares,
    ``?:``, the casts ``(int)`` / ``(int64_t)`` and calls of ``max`` / ``min``; no memory
    access (``[``, ``*p``), assignment, increment or other call."""
    if re.search(r"\+\+|--|->", expr):  # brackets, braces, ';' and quotes: the charset below
        return False
    if "=" in re.sub(r"[=<>!]=", "", expr):
        return False
    if not re.fullmatch(r"[\w\s+\-*/%&|^<>!?:().,]*", expr):
        return False
    bare = re.sub(r"\((?:int|int64_t)\)", "", expr)  # the casts allowed
    if re.search(r"(?:^|[^\w)\s])\s*\*|\*\s*\)", bare):
        return False  # a dereference (a '*' after no operand) or a pointer cast
    return all(m.group(1) in ("max", "min") for m in _CALL.finditer(expr))


def _allowed(line: str) -> bool:
    """Whether one line of the producer's loop (outside the elected blocks) may be skipped by
    warps 1-3: a wait, an integer declaration, a loop header, a brace, ``#pragma unroll``."""
    if line in ("", "}", "#pragma unroll"):
        return True
    for pat in (_WAIT, _DECL, _FOR):
        m = pat.fullmatch(line)
        if m:
            return all(_pure(g) for g in m.groups() if g is not None and not g.isidentifier())
    return False


class GuardError(RuntimeError):
    """A warp-specialised kernel whose producer :func:`guard` cannot prove safe to trim."""


def _close(code: str, open_at: int) -> int:
    """The index of the ``}`` that closes the ``{`` at ``open_at``."""
    depth = 0
    for i in range(open_at, len(code)):
        c = code[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
    raise GuardError("unbalanced braces in the generated source")


def _strip_elected(body: str) -> str:
    """``body`` without its ``if (tl::tl_shuffle_elect<128>()) { ... }`` blocks."""
    while True:
        m = _ELECT.search(body)
        if m is None:
            return body
        end = _close(body, m.end() - 1)
        body = body[:m.start()] + body[end + 1:]


def guard(code: str) -> str:
    """``code`` with the producer's warps 1-3 leaving before its key loop (the module's
    docstring says why), where ``code`` is one of our kernels (entry point :data:`KERNEL`
    ``_kernel``) with a producer warp group; any other source unchanged. Raises
    :class:`GuardError` for a kernel of ours that has the producer's marks
    (``warpgroup_reg_dealloc``) in a shape this function does not know."""
    if f"{KERNEL}_kernel(" not in code or MARK in code:
        return code
    m = _BRANCH.search(code)
    if m is None:
        if "warpgroup_reg_dealloc" in code:
            raise GuardError(f"{KERNEL}: a warp-specialised kernel without the producer branch "
                             "'if (((int)threadIdx.x) < 128) {'")
        return code  # not warp-specialised (fwd_tc_nows): no producer group
    open_at = m.end() - 2
    close_at = _close(code, open_at)
    if not re.match(r"\} else \{", code[close_at:]):
        raise GuardError(f"{KERNEL}: the producer branch has no consumer 'else'")
    else_close = _close(code, close_at + len("} else "))
    entry = re.search(rf"{KERNEL}_kernel\([^;{{]*\)\s*\{{", code)  # the definition
    after = len(code) - len(code[else_close + 1:].lstrip())  # the first character past it
    if entry is None or _close(code, entry.end() - 1) != after:
        raise GuardError(f"{KERNEL}: the kernel goes on after the producer / consumer branches "
                         "(warps 1-3 of the producer would skip it)")
    body = code[open_at + 1:close_at]
    loops = list(_LOOP.finditer(body))
    if len(loops) != 1:
        raise GuardError(f"{KERNEL}: {len(loops)} producer key loops, expected one")
    lp = loops[0]
    loop_open = body.index("{", lp.end())
    loop_close = _close(body, loop_open)
    if body[loop_close + 1:].strip():
        raise GuardError(f"{KERNEL}: the producer does more after its key loop: "
                         f"{body[loop_close + 1:].strip()[:80]!r}")
    if ("tl::warpgroup_reg_dealloc<" not in body[:lp.start()]
            and "tl::warpgroup_reg_" in code):  # none at all: no instruction the group must run
        raise GuardError(f"{KERNEL}: the producer's setmaxnreg is not before its key loop")
    rest = _strip_elected(body[loop_open + 1:loop_close])
    for line in rest.splitlines():
        if not _allowed(line.strip()):
            raise GuardError(f"{KERNEL}: the producer's warps 1-3 do more than wait in the key "
                             f"loop: {line.strip()[:80]!r}")
    ind = lp.group(1)
    leave = (f"\n{ind}if (((int)threadIdx.x) >= 32) {{  // {MARK}: only warp 0 waits "
             f"(tilelang_impl/producer_guard.py)\n{ind}  return;\n{ind}}}")
    at = open_at + 1 + lp.start()
    return code[:at] + leave + code[at:]


def guarded(source: str) -> bool:
    """Whether a kernel source carries :func:`guard`'s edit."""
    return MARK in source


def check(ker, what: str = "") -> None:
    """Raise :class:`GuardError` if the built kernel ``ker`` (a ``JITKernel`` of
    :func:`kernels.fwd_tc`) is warp-specialised and lacks the guard: a post-processor
    registered after ours replaced it (TileLang keeps one). ``launch._kernel`` asks it of
    every ``fwd_tc`` kernel it builds; a ``producer_warps = 4`` kernel (entry point
    :data:`KERNEL_ALL_WARPS`) passes."""
    src = ker.get_kernel_source()
    if f"{KERNEL_ALL_WARPS}_kernel(" in src:  # the lab's control, unguarded by design
        return
    if "warpgroup_reg_dealloc" in src and not guarded(src):
        raise GuardError(f"{what or KERNEL}: built without hils-swa's producer guard (a TileLang "
                         "CUDA post-processor registered after tilelang_impl.producer_guard's "
                         "replaced it when this kernel was built; launch._kernel chains ours "
                         "again before a build, tilelang_impl.producer_guard.ensure()); clear this "
                         "kernel from TileLang's caches (~/.tilelang/cache) and build it again")


#: A source of the shape :func:`guard` edits, for :func:`active`.
_PROBE = (f'extern "C" __global__ void {KERNEL}_kernel(int n) {{\n'
          "  if (((int)threadIdx.x) < 128) {\n    tl::warpgroup_reg_dealloc<24>();\n"
          "    for (int kb = 0; kb < n; ++kb) {\n      mbarrier[4].wait((kb & 1));\n    }\n"
          "  } else {\n    tl::warpgroup_reg_alloc<240>();\n  }\n}\n")


def active() -> bool:
    """Whether TileLang's CUDA post-processor, as registered now, applies :func:`guard` (it
    is run on a small source of our kernels' shape)."""
    import tvm_ffi
    from tvm.target import Target
    f = tvm_ffi.get_global_func("tilelang_callback_cuda_postproc", allow_missing=True)
    return f is not None and guarded(str(f(_PROBE, Target({"kind": "cuda", "arch": "sm_90a"}))))


def ensure() -> None:
    """Make :func:`guard` part of TileLang's CUDA post-processing (``kernels`` calls it on
    import, ``launch._kernel`` before building a ``fwd_tc`` kernel): unless it is
    :func:`active`, register a post-processor that runs the one registered now (if any) and
    then :func:`guard`. A kernel built without the guard would go to TileLang's disk cache
    under its usual key, and every later process would load it there (and :func:`check`
    would refuse it)."""
    if active():
        return
    import tvm_ffi
    from tilelang.engine import register_cuda_postproc
    before = tvm_ffi.get_global_func("tilelang_callback_cuda_postproc", allow_missing=True)

    def postproc(code, target):
        if before is not None:
            code = before(code, target)
        return guard(str(code))
    register_cuda_postproc(postproc)
