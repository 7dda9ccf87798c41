"""Launchers of the Triton kernels: the config table, path choice, split-KV scratch.

Everything here is host-side Python that never synchronises with the device:
no ``.item()``, no device tensor built per call except the outputs and the
split-KV scratch, which comes from :func:`reference.device.scratch` (a cached,
grow-only buffer per thread and stream; new tensors in the graph's pool under capture). A
call is therefore capturable in a CUDA graph once a warm-up call has compiled
the kernel. Triton caches the compiled kernel per static
configuration (dtype, head dims, block sizes, flags, stride specialisation).
"""

from __future__ import annotations

import os
import types
import warnings
from dataclasses import dataclass, field, replace

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from reference.device import (GRID_YZ_MAX, batch_slices, capability, device_type, made_current, scratch,
                              sm_count)
from reference.errors import UnsupportedConfig
from reference.mask import visible_key_range
from reference.validation import LOG2E, Problem, positive_normal_f32

from . import gluon_prefill, kernels


def interpreter_active() -> bool:
    """True when the kernels run under Triton's interpreter (on CPU tensors).

    Decided by what ``@triton.jit`` produced when :mod:`triton_impl.kernels`
    was imported (``TRITON_INTERPRET=1`` must be set before that import), not
    by the environment now: setting the variable later changes nothing.
    """
    return _INTERPRETED


_INTERPRETED = type(kernels._swa_fwd_kernel).__name__ == "InterpretedFunction"


def _cdiv(a: int, b: int) -> int:
    # Not triton.cdiv: that is a @jit function and costs microseconds a call from Python.
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    maxnreg: int | None = None  # a register cap per thread (Triton's maxnreg option), None: ptxas decides


# ---------------------------------------------------------------------------
# THE config table (H200, sm_90). Key: (precision class, padded head dim =
# next power of two of max(Dqk, Dv)). "16" covers bf16 and fp16 (tensor-core
# wgmma); "32" is fp32 with input_precision="ieee" (exact fp32 products, no
# tensor cores, hence narrower tiles). Lessons behind it (FIELD-NOTES): a small
# BLOCK_N with more stages pays on Hopper for a window of a few hundred keys
# (less work wasted on the masked edge blocks, more blocks per SM); head dims
# above 128 and fp32 need narrower blocks (registers, shared memory).
# Timings that chose these rows: tools/gpu_triton.py, bench_results/.
# ("16", 64) serves the grids too small for TMA (below TMA_MIN_WAVES) and
# strides TMA refuses. 64x32 w4 s4 replaced 128x32 w4 s3 (H200, bf16):
# chunked prefill Lq=512 of 8K, GQA 32/4, D=64 13.3 vs 20.2 us (twice the
# programs on 132 SMs; bench_results/triton-lab6-1a0b87e.json) and, TMA off,
# GQA 32/4 L=8K 166.6 vs 213.1 us (triton-lab7-b0a8deb.json; the TMA kernel
# runs it in 163.5 us).
# ---------------------------------------------------------------------------
PREFILL: dict[tuple[str, int], Config] = {
    ("16", 32): Config(128, 64, 4, 3),
    ("16", 64): Config(64, 32, 4, 4),
    ("16", 128): Config(64, 64, 4, 3),
    ("16", 256): Config(64, 32, 4, 3),
    ("32", 32): Config(64, 32, 8, 2),
    ("32", 64): Config(64, 32, 8, 2),
    ("32", 128): Config(32, 16, 8, 3),
    ("32", 256): Config(32, 16, 8, 2),
}
# Pointer prefill loop structure (kernels._swa_fwd_kernel PHASES): True = the
# masked edge blocks first, then the inside blocks without the window test (two
# loops); False = one loop with every block masked. History: the first form of
# PHASES was three loops (left edge, middle, diagonal), which lost everywhere
# (bench_results/triton-7b2f2a1.json: D=128 L=8K 64x64 w4 s3 344 vs 366 us; again
# in session 10's lab 9 on chunked prefill, 20.2 vs 21.5 us). The two-loop form
# (lab 10 at 5ee8260, bench_results/triton-lab17-5ee8260.json, L2 not flushed, one
# loop -> phases): GQA 32/4 D=64 L=8K with TMA off 176.7 -> 158.8 us, chunked
# Lq=512 GQA D=64 13.4 -> 13.6 (within noise); D=128: L=8K with TMA off 261.6 ->
# 258.9, chunked Lq=512 / 1024 20.4 -> 20.3 / 38.2 -> 38.7 (no gain: stays off).
PHASES: dict[tuple[str, int], bool] = {key: key == ("16", 64) for key in PREFILL}
# GQA-packed prefill (the split-KV kernel with one split writing o directly):
# rows are G heads x Lq / G queries. Not chosen automatically: on the H200 it
# lost to the per-head prefill kernel (GQA 32/4, D=64, L=8K: best packed 231 us
# vs 206 us; every block of the packed kernel is masked). Reachable through
# the private ``path="packed"`` knob for experiments.
PACKED: dict[tuple[str, int], Config] = {
    ("16", 32): Config(128, 64, 8, 3),
    ("16", 64): Config(128, 64, 8, 3),
    ("16", 128): Config(128, 64, 8, 3),
    ("16", 256): Config(64, 32, 8, 3),
    ("32", 32): Config(32, 32, 8, 2),
    ("32", 64): Config(32, 32, 8, 2),
    ("32", 128): Config(32, 16, 8, 2),
    ("32", 256): Config(16, 16, 4, 2),
}
PACK_MIN_GROUP = None  # G at or above which choose_path packs GQA prefill; None: never
# Split-KV: BLOCK_N, warps and stages per (precision, head dim); BLOCK_M is the
# packed row count (G query heads x Lq queries of one key/value head) rounded
# up to a power of two, between 16 and the row's block_m.
SPLIT: dict[tuple[str, int], Config] = {
    ("16", 32): Config(64, 128, 4, 2),
    ("16", 64): Config(64, 128, 4, 2),  # B=8 GQA 32/4 decode: 5.8 us vs 6.5 us with BLOCK_N=64
    ("16", 128): Config(64, 64, 4, 3),  # BLOCK_N=128 spills at D=96/128
    ("16", 256): Config(64, 32, 8, 2),
    ("32", 32): Config(32, 32, 8, 2),
    ("32", 64): Config(32, 32, 8, 2),
    ("32", 128): Config(32, 16, 8, 2),
    ("32", 256): Config(16, 16, 4, 2),
}
# Prefill through TMA tensor descriptors (bf16/fp16 on a GPU, inputs whose
# strides the copy engine accepts; everything else takes the pointer kernel).
# Key as PREFILL -> (config, v_by_tma); a missing key means "pointer kernel".
# K arrives by TMA (no pointer tensors, no masks: 204 instead of 255 registers
# at 64x64, D=128); V is loaded through pointers with landmark rows masked to
# 0, because zeroing a TMA-loaded V tile in registers costs more than it
# saves (H200, bf16, 32/32/128, L=8K, W=512, C=64, kernel-only:
# pointer kernel 344 us; TMA K + pointer V 289 us; TMA K and V 324 us;
# bench_results/triton-lab1-*.json). D=64 (bench_results/triton-lab2-ddc1d18.json):
# 128x32 w4 s4 vs the pointer kernel, GQA 32/4 L=8K 197 vs 206 us, 16/2 107
# vs 113 us, batch 4 x 4K 368 vs 384 us. After the mask rewrite (841e9f7,
# bench_results/triton-lab5-841e9f7.json) D=64 moved to 64x64 w4 s3: GQA 32/4
# L=8K 165 vs 178 us (128x32 w4 s4), batch 4 x 4K 310 vs 328 us; D=128 kept
# 64x64 w4 s3 (229 us; V by TMA 273 us).
# Session 8 (bench_results/triton-lab10-4f1c99a.json, L2 not flushed): D=64 moved to
# 64x64 w4 s2 with a 128-register cap (Config.maxnreg; 125 registers, no spills, 41 KB
# of shared memory: 4 CTAs per SM where s3's 136 registers and 57 KB allow 3): GQA
# 32/4 L=8K 165.2 -> 158.9 us, 16/2 86.6 -> 82.9 us (s2 without the cap: 168.1 /
# 88.3). D=128 stays: the same cap for 4 CTAs per SM (64x32 w4 s2 at 128 registers)
# 232.4 vs 229.6 us, 64x32 w4 s3 at 128 (3 CTAs) 230.7 us.
PREFILL_TMA: dict[tuple[str, int], tuple[Config, bool]] = {
    ("16", 64): (Config(64, 64, 4, 2, maxnreg=128), False),
    ("16", 128): (Config(64, 64, 4, 3), False),
}
# The TMA kernel's key loop in two phases (kernels._swa_fwd_tma_kernel PHASES): the
# blocks some row sees only in part (left edge, diagonal) first, with the window
# test, then the blocks inside every row's window with the landmark test only.
# SASS (Triton 3.6, sm_90, bf16, on CPU), instructions per key block of the
# steady loop: D=128 64x64 w4 s3 704 -> 481 inside the window (752 on the edge
# blocks), D=64 64x64 w4 s2 606 -> 400 (644); at W=512, C=64 seven of a 64-row
# tile's nine blocks are inside. Measured on the H200 (tools/gpu_triton.py --lab 7
# at ba4666d, bench_results/triton-lab14-ba4666d.json, L2 not flushed, one loop ->
# phases): 32/32/128 L=8K 228.2 -> 220.0 us, L=16K 483.3 -> 479.9; GQA 32/4 D=64
# 158.3 -> 133.3, 16/2 83.6 -> 70.8, batch 4 x 4K 298.4 -> 251.4, W=4096 843.3 ->
# 630.3 us. The private _phases knob forces it either way (both kernels).
TMA_PHASES: dict[tuple[str, int], bool] = {key: True for key in PREFILL_TMA}
# V of the TMA kernel's inside blocks through a chunked view (kernels._swa_fwd_tma_kernel
# V_CHUNK): a 5-D descriptor (B, Hkv, chunks, C - 1, Dv) whose chunks start on chunk
# boundaries, so each chunk's landmark row lies outside it and arrives as the copy
# engine's zero fill; the edge blocks keep the pointer loads. Taken per call where it
# applies (_v_chunk_desc: mask_lmk, the phases, C a multiple of BLOCK_N, key tiles on chunk
# boundaries); the other calls run the pointer-v kernel. Measured on the H200 (session 24,
# tools/lab_vchunk.py, bench_results/vchunk-lab2-ea2d6b9.json, paired medians of 5
# interleaved rounds, bit-identical outputs or within the pointer kernel's error): D=64
# (64x64 w4 s2 r128) 3.9-4.7% less kernel time back to back, 3.5-6.4% flushed on all four
# D=64 bench shapes (GQA 32/4 L=8K 131.7 -> 126.0 us), SASS of an inside block 412 -> 400;
# D=128 no gain resolved (64x64 s2: +0.5 / -1.2% at L=8K / 16K; 64x64 s3 does not fit two
# CTAs per SM with the view's extra barrier: 24 bytes over, one CTA per SM, +41%).
# Session 28 (tools/lab_vchunk.py, bench_results/vchunk-lab28-e41b767.json, paired medians of
# 5 interleaved rounds, L2 not flushed): D=128 64x64 w4 s3 with the view and a two-deep edge
# loop (TMA_V_CHUNK_EDGE_STAGES) against the pointer-v kernel: 32/32/128 L=8K 219.1 -> 211.0
# us (-4.0%), L=16K 460.3 -> 427.6 (-4.7%), C=128 L=8K 231.5 -> 223.6 (-3.8%); predicted
# -2..-5%; the pointer kernel with the same edge loop within -1.3..+0.2%. With the L2 flushed
# (medians): 225.5 -> 217.6 us (308 -> 319 TFLOP/s), 482.8 -> 448.2 (293 -> 316), 237.6 -> 233.6.
TMA_V_CHUNK: dict[tuple[str, int], bool] = {("16", 64): True, ("16", 128): True}
# The depth of the V_CHUNK kernel's edge-block loop (kernels._swa_fwd_tma_kernel EDGE_STAGES)
# per key; absent: the launch's num_stages (0), as every kernel ran until session 26. Two
# stages there give D = 128's three-stage view kernel back the 24 bytes of shared memory it
# lacked for two CTAs per SM (115736 -> 114744 bytes: the edge loop's barrier array sat
# before the 1024-aligned Q tile; Triton 3.6, CPU compile). Lab variant chunk-s3-edge2
# (tools/lab_vchunk.py), measured in session 28 (TMA_V_CHUNK above) and shipped at D = 128.
TMA_V_CHUNK_EDGE_STAGES: dict[tuple[str, int], int] = {("16", 128): 2}
# Where the call's kernel frame has C == BLOCK_N and the chunked view serves it (_v_chunk_desc),
# every key block of the TMA kernel starts on a chunk boundary, so its landmark is its last
# column, a compile-time constant (kernels._not_lmk, LMK_ONE == 2: _vchunk_variant), and where
# moreover expand_to_chunk holds and Lq, Lk, the frame's kv_start and the row tile are whole
# chunks, the edge blocks take v through the view as well (kernels._swa_fwd_tma_kernel
# EDGE_VIEW). Measured in session 37 (tools/lab_vchunk.py --lmk2, one H100 80GB at ecbe587,
# bench_results/vchunk-lab37-lmk2-h100-ecbe587.json, paired medians of 3 interleaved rounds,
# CUDA-graph replay back to back, each variant checked against the pointer-v kernel and the
# float64 reference first, controls where the premise fails differing): against the shipped
# view kernel, the last column alone -4.6% / -2.9% at 32/32/128 L = 8K / 16K and -4.8..-8.9%
# on the four D = 64 shapes; with the edge view -6.4% / -3.6% and -7.0..-10.4% (predicted from
# SASS: D = 64 -3..-9%, D = 128 -0.5..-3%, the edge view a further -0.5..-3%).
TMA_LAST_COL: dict[tuple[str, int], bool] = {("16", 64): True, ("16", 128): True}
TMA_EDGE_VIEW: dict[tuple[str, int], bool] = {("16", 64): True, ("16", 128): True}
# FOLD (below) in those two variants (_respun's fold): session 38's lab on one H100
# (tools/lab_vchunk.py --lmk2, bench_results/vchunk-lab38-lmk2-h100-6dbab1c.json), paired per
# round against the same variant without it: D = 64 -1.4..-3.0% (b2b) on 8K 32/4, 8K 16/2 and
# batch 4x4K, -2.4..-4.0% on the 4096 window, in every round (session 37's lab, the last column
# with and without it: -2.3..-3.9% on those three, -5.6..+2.7% on the window); D = 128
# -0.3..-0.9% at 8K and -1.6..+4.7% at 16K, within the spread: off.
TMA_VIEW_FOLD: dict[tuple[str, int], bool] = {("16", 64): True}
# Scale in the exponent's FMA instead of a multiply per score (kernels._softmax_p,
# FOLD), for calls whose qk_scale is a positive normal float32 (_fold_ok):
# 665 -> 636 instructions per key block of the D=128 TMA kernel (Triton 3.9,
# sm_90, on CPU). Measured on the H200 at 1a0b87e (tools/gpu_triton.py --lab,
# bench_results/triton-lab6-1a0b87e.json): no gain beyond noise (32/32/128 L=8K
# 228.7 -> 228.0 us, GQA 32/4 D=64 163.5 -> 162.4 us, chunked 20.4 -> 20.5 us,
# decode 7.0 -> 7.1 us; predicted +2-5%): the 29 instructions are not on the
# critical path. Off here (TMA_VIEW_FOLD above ships it in the chunked view's variants at
# D = 64, where the last column left the multiply on the critical path); the private _fold
# knob forces it everywhere.
FOLD_SCALE: dict[tuple[str, int], bool] = {key: False for key in PREFILL}
# TMA only where the grid has at least this many waves of programs. Chosen when
# every call built and encoded four descriptors (chunked prefill Lq=512 of 8K, 256
# programs: the same kernel time as the pointer kernel, +70 us host time). Since
# _TmaFast (session 19) a call whose tensors sit at addresses seen before encodes
# nothing; the gate stays because the short grids gained nothing in kernel time
# (not re-measured).
TMA_MIN_WAVES = 4
# Split-KV on Hopper: the combine kernel is launched as a programmatic dependent
# of the split kernel (CUDA programmatic dependent launch; kernels._swa_splitkv_kernel
# PDL): its programs are scheduled while the split programs run and wait on
# the device for the split grid's completion, instead of being launched after
# it. Measured (bench_results/triton-lab8-76fd3c9.json): B=1 32/32/128 decode
# 7.1 -> 6.6 us back to back, 12.4 -> 11.9 us flushed. The private ``pdl`` knob of
# :func:`launch` overrides it per call (tools/gpu_triton.py); HILS_SWA_TRITON_PDL=0
# in the environment turns it off for the process (a driver or graph tool without
# programmatic launches).
SPLIT_PDL = os.environ.get("HILS_SWA_TRITON_PDL", "1") != "0"  # HILS_SWA_TRITON_PDL=0: serial launches
# A split-KV call reads the current stream once and hands it to its scratch and both
# launches (each read it before: three reads). False: each reads it again, as before
# (the lab's A/B, tools/lab_host.py --scratch).
PASS_STREAM = True
# Split-KV grids that the table's 128-key blocks leave under one program per SM
# even with a split per block (tiles x key blocks < SMs: B=1 GQA decode at
# D <= 64) take 32-key blocks instead, four times the programs. H200, bf16,
# W=512, C=64, B=1 GQA 32/4 D=64 decode (4 tiles x 6 blocks = 24 programs at
# BLOCK_N=128, 76 at 32): 5.0 -> 4.2 us back to back, 8.2 -> 7.5 us under the
# bench's flushed timer (bench_results/triton-lab9-ab58094.json); on saturated
# grids 32-key blocks lost (B=8 GQA 9.8 -> 10.4 us, B=1 32/32/128 11.8 -> 12.0).
SPLIT_NARROW: dict[tuple[str, int], Config] = {
    ("16", 32): Config(64, 32, 4, 3),
    ("16", 64): Config(64, 32, 4, 3),
}
SPLIT_BLOCK_M = (16, 32, 64)  # the shipped split-KV row tiles (capped by SPLIT[...].block_m)
# Split-KV aims at this many programs per SM (capped by the key blocks). 4 since
# session 8: B=1 32/32/128 decode (32 tiles, 10 blocks of 64 keys) runs 10 splits
# of one block instead of 5 of two; under the flushed timer 11.8 -> 11.5 us at
# Lk = 8K, 12.0 -> 11.6 us at 128K, back to back equal at 8K (6.6 us) and 7.4 -> 6.7
# at 128K (
# triton-lab9-ab58094.json, variants "S=16" / "S=32", both capped at 10). The
# other decode shapes of the bench are capped by their key blocks and keep theirs.
SPLIT_TARGET = 4
MAX_SPLITS = 64
COMBINE_ROWS = 1
COMBINE_WARPS = 4


class _Kernel:
    """One ``@triton.jit`` kernel with a host fast path.

    The first call of a static configuration goes through Triton's JIT (which
    compiles, caches and launches); the returned compiled kernel is kept under
    a key that covers everything the JIT specialises on (constexprs, warps,
    stages, each pointer's 16-byte alignment, each int's ``== 1`` /
    ``% 16 == 0`` / 32-bit range), and later calls with the same key launch it
    directly, skipping the JIT's per-call binding and cache lookup (the bulk
    of a small call's host time). A direct launch that fails is retried through
    the JIT: if that succeeds, the fast path is off for the process (with a
    ``RuntimeWarning``, :data:`FAST_PATH_OFF`); if it fails too, its error is
    raised and the fast path stays.
    """

    enabled = os.environ.get("HILS_SWA_TRITON_FAST_LAUNCH", "1") != "0"

    def __init__(self, fn):
        self.fn = fn
        self.cache: dict = {}
        self.tma_cache: dict = {}  # launch_tma's key -> _TmaFast

    # Specialisation of a tuple of runtime ints (see _key), memoised by the tuple
    # itself: a repeated call shape skips the per-int arithmetic. Bounded: cleared
    # when full (a decode loop whose Lk grows adds one entry per step).
    _SPECS: dict = {}
    _SPECS_MAX = 4096

    @staticmethod
    def _int_spec(ints):
        spec = _Kernel._SPECS.get(ints)
        if spec is None:
            spec = tuple((x == 1) + 2 * (x % 16 == 0) + 4 * (x >= 2 ** 31 or x < -2 ** 31) for x in ints)
            if len(_Kernel._SPECS) >= _Kernel._SPECS_MAX:
                _Kernel._SPECS.clear()
            _Kernel._SPECS[ints] = spec
        return spec

    @staticmethod
    def _key(static, tensors, ints):
        """``(key, ptrs)``: the cache key of a call (tensors: dtype and 16-byte alignment;
        TMA descriptor objects: what their type carries, block shape, element type,
        padding; shapes and strides are runtime) and the tensors' ``data_ptr()`` ints
        (None where descriptor objects are among them)."""
        try:
            ptrs = [t.data_ptr() for t in tensors]
            align = tuple([(t.dtype, not p & 15) for t, p in zip(tensors, ptrs)])
        except AttributeError:  # TMA descriptor objects among them (no dtype, no data_ptr)
            ptrs = None
            align = tuple((t.dtype, t.data_ptr() % 16 == 0) if isinstance(t, torch.Tensor)
                          else (tuple(t.block_shape), t.base.dtype, t.padding) for t in tensors)
        return (static, _Kernel._int_spec(ints), align), ptrs

    def __call__(self, grid, tensors, ints, floats, constexprs: dict, static: tuple, dev: int | None = None,
                 stream: int | None = None):
        """Positional runtime args are ``*tensors, *ints, *floats`` in the kernel's order
        (``ints`` a tuple). ``static``: ``static_key(constexprs, num_warps, num_stages,
        launch_pdl, maxnreg)``, precomputed by the caller's plan: the cache key's
        static part and the only source of the compile options (``launch_pdl``:
        launch as a programmatic dependent of the previous kernel on the stream,
        carried by the compiled kernel, so the direct launch keeps it; ``maxnreg``:
        the register cap per thread, ``Config.maxnreg``). ``dev``: the current CUDA device
        when the caller knows it (:func:`launch`), else asked for; ``stream``: the raw handle
        of its current stream when the caller has read it (:func:`_stream`; the split path
        reads it once for its scratch and both launches), else read at the launch. Returns the compiled
        kernel launched (what ``JITFunction.run`` returns; None where it returns nothing)."""
        if interpreter_active() or not _Kernel.enabled:
            return self.fn[grid](*tensors, *ints, *floats, **constexprs, **_options(static))
        if dev is None:
            dev = _device()
        key, ptrs = self._key(static, tensors, ints)
        key = (dev, key)  # a compiled kernel is loaded per device
        hit = self.cache.get(key)
        if hit is not None:
            ck, raw = hit
            # Pointers as the ints already read for the key (_RawLaunch: why), unless a launch
            # hook is set: it reads the launch metadata, which Triton builds from the tensors.
            # (Kernels with descriptor objects among their arguments have no ints, no raw launch.)
            hooks_off = _no_launch_hooks()
            rest = (*(ptrs if hooks_off and ptrs is not None else tensors), *ints, *floats,
                    *constexprs.values())
            via_raw = hooks_off and raw is not None and _RawLaunch.enabled
            try:
                if via_raw:
                    raw.launch(grid, rest, dev, stream)
                else:
                    _direct_launch(ck, grid, rest, dev, stream)
                return ck
            except Exception as e:
                failed = e
            # Triton's own launch of the same call. If it fails too, the fault is the call's
            # (a CUDA error left by an earlier kernel, say): it raises, the fast path stays.
            # If it succeeds, the launch that failed no longer fits this Triton: off from now
            # on (the raw C launch alone, when it was that one; ck.run then serves).
            ck = self.fn[grid](*tensors, *ints, *floats, **constexprs, **_options(static))
            if via_raw:
                _RawLaunch.enabled = False
                _fast_path_off("the raw C launch of cached kernels", failed)
            else:
                _Kernel.enabled = False
                _fast_path_off("the direct launch of cached kernels", failed)
            return ck
        ck = self.fn[grid](*tensors, *ints, *floats, **constexprs, **_options(static))
        # Cache only when the direct call will pass the arguments in the kernel's own order.
        names = list(getattr(self.fn, "arg_names", ()))
        if (ck is not None and hasattr(ck, "run") and hasattr(ck, "packed_metadata")
                and names[len(tensors) + len(ints) + len(floats):] == list(constexprs)):
            self.cache[key] = (ck, _RawLaunch.of(ck))
        return ck

    def launch_tma(self, grid, descs, build, tensors, ints, floats, constexprs: dict, static: tuple,
                   dev: int | None = None):
        """A launch whose first ``len(descs)`` arguments are TMA tensor descriptors.

        ``descs``: per descriptor ``(data_ptr, shape, strides)`` of the tensor it
        describes (block shapes, element type and padding are the kernel's: static
        in ``static`` and the dtypes of ``tensors``); ``build()``: the same
        descriptors as :class:`TensorDescriptor` objects, built only where a call
        goes through :meth:`__call__`. The rest as :meth:`__call__`.

        After the first call of a key, Triton 3.6's launcher is entered below its
        per-call descriptor handling (:class:`_TmaFast`): each descriptor is encoded
        once per ``(data_ptr, shape, strides)`` and the encoding reused, instead
        of four ``TensorDescriptor`` objects built and four ``cuTensorMapEncodeTiled``
        calls per call. Elsewhere (another Triton's launcher, launch hooks set, the
        fast paths off) every call takes :meth:`__call__`.
        """
        if interpreter_active() or not _Kernel.enabled or not _TmaFast.enabled:
            self(grid, (*build(), *tensors), ints, floats, constexprs, static, dev)
            return
        if dev is None:
            dev = _device()
        key, ptrs = self._key(static, tensors, ints)
        key = (dev, key)
        fast = self.tma_cache.get(key, False)  # False: not seen; None: no fast path for this kernel
        if fast and _no_launch_hooks():
            try:
                fast.launch(grid, descs, (*ptrs, *ints, *floats, *constexprs.values()), dev)
                return
            except Exception as e:
                failed = e
            # As in __call__: the call again through __call__; only if that succeeds is the
            # fast path at fault (drift in Triton's private launcher), and off from now on.
            self(grid, (*build(), *tensors), ints, floats, constexprs, static, dev)
            _TmaFast.enabled = False
            _fast_path_off("the TMA descriptor fast launch", failed)
            return
        ck = self(grid, (*build(), *tensors), ints, floats, constexprs, static, dev)
        names = list(getattr(self.fn, "arg_names", ()))
        n_args = len(descs) + len(tensors) + len(ints) + len(floats)
        if fast is False and ck is not None and names[n_args:] == list(constexprs):
            self.tma_cache[key] = _TmaFast.of(ck, len(descs))


#: Why a host fast path was turned off in this process (``_fast_path_off``), or empty.
FAST_PATH_OFF: list[str] = []


def _fast_path_off(what: str, exc: BaseException) -> None:
    """Record and warn (once per path) that a host fast path failed where Triton's own
    launch of the same call succeeded: the path is off for the process."""
    msg = f"triton_impl: {what} failed ({type(exc).__name__}: {exc}); Triton's own launch from now on"
    FAST_PATH_OFF.append(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _hook_unset(hook) -> bool:
    """``None``, or a ``triton.knobs.HookChain`` with no hook in it (Triton 3.6's default:
    the launcher then calls an empty chain twice per launch)."""
    return hook is None or getattr(hook, "calls", None) == []


def _no_launch_hooks() -> bool:
    """Whether Triton's launch enter/exit hooks (profilers such as Proton) are unset.
    Then the direct launches pass no hooks and no launch metadata (which only the
    hooks read); a set hook gets both, as from the JIT."""
    knobs = getattr(triton, "knobs", None)
    return knobs is None or (_hook_unset(knobs.runtime.launch_enter_hook)
                             and _hook_unset(knobs.runtime.launch_exit_hook))


class _Base:
    """``base`` of a :class:`_DescArg`: what Triton's descriptor encoder reads of it."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class _DescArg:
    """The fields of a ``TensorDescriptor`` that Triton's ``make_tensordesc_arg``
    reads, without the tensor (a descriptor of a key range starting past key 0
    has no tensor of its own) or ``TensorDescriptor``'s per-object checks (the
    launcher checked the strides and bases once: ``_tma_operands``)."""

    __slots__ = ("base", "shape", "strides", "padding")

    def __init__(self, ptr: int, shape, strides):
        self.base, self.shape, self.strides, self.padding = _Base(ptr), list(shape), list(strides), "zero"


class _RawLaunch:
    """Triton 3.6's C launch of one compiled pointer-argument kernel, entered directly.

    For a kernel without TMA descriptors, Triton 3.6's ``CudaLauncher.launch`` is the
    compiled C launch itself and ``CudaLauncher.__call__`` only adds the global and
    profile scratch (None for our kernels) to its leading arguments; :meth:`launch`
    passes them itself. Callers pass pointers as the ``data_ptr()`` ints they read for
    the cache key: the C launch takes an int as the device address as it is, where for
    a tensor it calls ``data_ptr()`` and ``cuPointerGetAttribute``, which only refuses
    an address CUDA does not know (a CPU tensor's). Here every pointer is a CUDA
    tensor's of the call's device: :func:`launch` refuses other devices, the public
    call checked the inputs' (``check_inputs``: one device; the backend's CUDA or
    interpreter rule), and the outputs and scratch are allocated on it. :meth:`of`
    accepts only that structure (a ``CudaLauncher`` whose ``launch`` is not a Python
    function, the 13-field argument format ``iiiKKppOOOOOO``, no scratch, one CTA per
    program); anything else takes ``ck.run`` (with the ints).
    """

    FORMAT = "iiiKKppOOOOOO"  # Triton 3.6's _BASE_ARGS_FORMAT
    # False: every direct launch through ck.run. Set by the lab (tools/lab_host.py), and
    # by _Kernel.__call__ after a raw launch raised where Triton's own launch succeeded.
    enabled = True

    def __init__(self, raw, ck, coop, pdl):
        self.raw, self.function, self.packed = raw, ck.function, ck.packed_metadata
        self.coop, self.pdl = coop, pdl

    @staticmethod
    def _plain(run) -> bool:
        from triton.backends.nvidia import driver as nv
        return (isinstance(run, nv.CudaLauncher) and getattr(nv, "_BASE_ARGS_FORMAT", None) == _RawLaunch.FORMAT
                and not run.global_scratch_size
                and not run.profile_scratch_size and getattr(run, "num_ctas", 1) == 1)

    @classmethod
    def of(cls, ck) -> "_RawLaunch | None":
        try:
            run = ck.run
            raw = run.launch
            # the C launch itself, not a Python function (Triton 3.6's descriptor wrapper)
            if not callable(raw) or isinstance(raw, types.FunctionType) or not cls._plain(run):
                return None
            return cls(raw, ck, bool(run.launch_cooperative_grid), bool(run.launch_pdl))
        except Exception:  # any other launcher: ck.run
            return None

    def launch(self, grid, args: tuple, dev: int, stream: int | None = None) -> None:
        """Launch on the current stream of device ``dev`` (the current device, whose
        compiled kernel this is; ``stream`` its raw handle, None: read here); ``args`` the
        kernel's arguments in its order."""
        g = _grid3(grid)
        # The C launch's leading arguments (Triton 3.6, _BASE_ARGS_FORMAT "iiiKKppOOOOOO"): grid,
        # stream, function, cooperative, PDL, global and profile scratch (none), the packed
        # metadata, the launch metadata and the enter / exit hooks (none: _no_launch_hooks).
        self.raw(g[0], g[1], g[2], _stream(dev) if stream is None else stream, self.function, self.coop,
                 self.pdl, None, None, self.packed, None, None, None, *args)


class _TmaFast(_RawLaunch):
    """The raw launch of a compiled kernel with TMA descriptor arguments (Triton 3.6).

    Triton 3.6's ``CudaLauncher`` wraps its C launch in a Python function that,
    on every call, turns each ``TensorDescriptor`` argument into an encoded
    ``CUtensorMap`` plus its shape and strides (``make_tensordesc_arg``, one
    ``cuTensorMapEncodeTiled`` each). The encoding is a pure function of the
    descriptor's base address, shape, strides and the kernel's block shape,
    swizzle and element type, so it is cached here per compiled kernel, keyed by
    ``(descriptor index, data_ptr, shape, strides)``, and the C launch is called
    with the cached arguments (the other pointers as ints, as :class:`_RawLaunch`).
    :meth:`of` accepts only a launcher of exactly that structure (the wrapper's
    closure holding ``launcher``, the descriptors as the leading arguments and one
    non-empty ``tensordesc_meta`` entry each, no scratch memory); anything else
    keeps the JIT path.
    """

    # Cached encodings per compiled kernel (about 0.3 KB each); cleared when full. A model
    # whose layers keep their own q / k / v / o alive needs four per layer for every hit.
    ENC_MAX = 1024
    enabled = True  # False after a raw launch raised: every TMA call through _Kernel.__call__

    def __init__(self, raw, metas, make_arg, ck, coop, pdl):
        super().__init__(raw, ck, coop, pdl)
        self.metas, self.make_arg = metas, make_arg
        self.enc: dict = {}

    @classmethod
    def of(cls, ck, n_desc: int) -> "_TmaFast | None":
        try:
            from triton.backends.nvidia import driver as nv
            run = ck.run
            inner = run.launch
            cells = dict(zip(inner.__code__.co_freevars, (c.cell_contents for c in inner.__closure__ or ())))
            raw, metas = cells.get("launcher"), cells.get("tensordesc_meta")
            make_arg = nv.make_tensordesc_arg
            if (raw is None or not callable(raw) or not metas or len(metas) != n_desc
                    or cells.get("tensordesc_indices") != set(range(n_desc))  # the leading arguments
                    or any(m is None for m in metas) or make_arg.__code__.co_argcount != 2
                    or not _RawLaunch._plain(run)):
                return None
            return cls(raw, list(metas), make_arg, ck, bool(run.launch_cooperative_grid), bool(run.launch_pdl))
        except Exception:  # any other launcher: no fast path
            return None

    def encode(self, i: int, d: tuple) -> list:
        enc = self.make_arg(_DescArg(*d), self.metas[i])
        if len(self.enc) >= self.ENC_MAX:
            self.enc.clear()
        self.enc[(i, *d)] = enc
        return enc

    def launch(self, grid, descs, rest: tuple, dev: int) -> None:  # noqa: D417
        """As :meth:`_RawLaunch.launch`, the descriptors ``descs`` (``(data_ptr, shape,
        strides)`` each) first, encoded (cached), then ``rest``."""
        args = []
        enc = self.enc
        for i, d in enumerate(descs):
            e = enc.get((i, *d))
            args += e if e is not None else self.encode(i, d)
        _RawLaunch.launch(self, grid, (*args, *rest), dev)


def static_key(constexprs: dict, num_warps: int, num_stages: int, launch_pdl: bool = False,
               maxnreg: int | None = None) -> tuple:
    """The static part of :class:`_Kernel`'s cache key, and the compile options
    of the kernel it names (:func:`_options`)."""
    return tuple(constexprs.items()), num_warps, num_stages, launch_pdl, maxnreg


def _frame_static(static: tuple, frame: tuple) -> tuple:
    """``static`` for a call whose kernel frame ``(kv_start, W, C)`` (:func:`_frame`)
    has a value past 2**31: Triton then compiles the int64 form of the kernel,
    which keeps ptxas's own register count (under a ``Config.maxnreg`` cap it
    spills: 77 local loads/stores for the D=64 TMA tile, sm_90 CPU compile)."""
    if static[4] is not None and max(frame) >= _I32:
        return (*static[:4], None)
    return static


# Compile options every kernel here takes (:func:`_options`). Floating-point contraction
# (``a * b + c`` as one FMA) pinned on: every timing in BENCHMARKS.md was taken with it, Triton
# 3.6 and 3.9 default to it, and Triton 3.9 warns that 3.10 will default to off unless
# TRITON_DEFAULT_FP_FUSION says otherwise; FOLD (kernels._softmax_p) exists for the FMA it makes.
# TRITON_FORCE_DISABLE_FP_FUSION=1 still turns it off on Triton 3.9+ (Triton's own override, for
# debugging; Triton 3.6 has no such variable: nothing overrides the option there).
COMPILE_OPTIONS = {"enable_fp_fusion": True}


def _options(static: tuple) -> dict:
    """Triton's launch/compile options of a :func:`static_key`, with :data:`COMPILE_OPTIONS`."""
    _, num_warps, num_stages, launch_pdl, maxnreg = static
    opts = dict(num_warps=num_warps, num_stages=num_stages, **COMPILE_OPTIONS)
    if launch_pdl:
        opts["launch_pdl"] = True
    if maxnreg is not None:
        opts["maxnreg"] = maxnreg
    return opts


def _device() -> int:
    """The current CUDA device, where Triton's JIT compiles, loads and launches."""
    return triton.runtime.driver.active.get_current_device()


def _stream(dev: int) -> int:
    """The current CUDA stream of device ``dev`` as Triton's launchers take it (torch's)."""
    return triton.runtime.driver.active.get_current_stream(dev)


def _grid3(grid) -> tuple:
    """A launch grid of one to three dimensions as the launchers take it: three."""
    return (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)


def _direct_launch(ck, grid, full_args, dev: int, stream: int | None = None) -> None:
    """What ``JITFunction.run`` does after its cache hit (Triton 3.4 .. 3.9), except
    that with no launch hook set (:func:`_no_launch_hooks`) it builds no launch
    metadata and passes ``None`` for the hooks instead of two empty chains (and
    :meth:`_Kernel.__call__` then passes pointers as ints, which every one of these
    launchers takes as the address). ``dev``: the current device, ``ck``'s; ``stream`` the raw
    handle of its current stream (None: read here)."""
    if stream is None:
        stream = _stream(dev)
    g = _grid3(grid)
    if _no_launch_hooks():
        ck.run(g[0], g[1], g[2], stream, ck.function, ck.packed_metadata, None, None, None, *full_args)
        return
    knobs = triton.knobs
    meta = ck.launch_metadata(g, stream, *full_args)
    ck.run(g[0], g[1], g[2], stream, ck.function, ck.packed_metadata, meta, knobs.runtime.launch_enter_hook,
           knobs.runtime.launch_exit_hook, *full_args)


_FWD = _Kernel(kernels._swa_fwd_kernel)
_FWD_TMA = _Kernel(kernels._swa_fwd_tma_kernel)
_FWD_GLUON = _Kernel(gluon_prefill._swa_fwd_gluon_kernel) if gluon_prefill.HAVE_GLUON else None
_SPLIT = _Kernel(kernels._swa_splitkv_kernel)
_COMBINE = _Kernel(kernels._swa_combine_kernel)


def dtype_class(dtype: torch.dtype) -> str:
    return "32" if dtype == torch.float32 else "16"


def head_bucket(p: Problem) -> int:
    return max(32, _pow2(max(p.Dqk, p.Dv)))


def _span(p: Problem) -> int:
    """Upper bound of the keys one query sees, plus chunk expansion."""
    extra = p.chunk_size - 1 if p.expand_to_chunk else 0
    return min(p.Lk, p.window_size + extra)


def choose_path(p: Problem, cfg: Config | None = None) -> str:
    """The kernel for a call, by grid saturation (never by ``Lq`` alone).

    The unit of parallel work is a tile of query rows of one key/value head,
    the ``G`` heads sharing it packed together: ``cdiv(G * Lq, 64) * B * Hkv``
    tiles. Under half the SM count the GPU would idle: split-KV spreads each
    tile's key range over several programs (decode, short chunks). Otherwise
    the prefill kernel (or, if ``PACK_MIN_GROUP`` is set, the GQA-packed one).
    Measured on the H200 (bf16, W=512, C=64): chunked prefill Lq=512 of 8K,
    Hq=32 (256 tiles): prefill 26.6 us vs split-KV 43.5 us; decode B=8 GQA
    32/4 (32 tiles): split-KV 6.5 us vs prefill 19.9 us.
    """
    tiles = _cdiv(p.group * p.Lq, 64) * p.B * p.Hkv
    split_cfg = SPLIT[(dtype_class(p.dtype), head_bucket(p))]
    if tiles * 2 < sm_count(p.device) and _span(p) + p.Lq > 2 * split_cfg.block_n:
        return "splitkv"
    if PACK_MIN_GROUP is not None and p.group >= PACK_MIN_GROUP:
        return "packed"
    return "prefill"


@dataclass
class _Plan:
    """Everything a call derives from its static shape and flags, computed once.

    ``constexprs`` holds the kernel variants keyed by ``(LMK_ONE, FOLD)``
    (``kernels._not_lmk``, ``kernels._softmax_p``) and ``static`` their
    precomputed :func:`static_key`; :meth:`pick` chooses per call from the
    kernel frame and the scale. A prefill plan may carry ``tma``, the plan of
    the TMA prefill kernel (its ``blocks`` are the descriptors' block shapes).
    """

    path: str
    grid: tuple
    head: tuple  # runtime ints before Lk (Lk, then kv_start, W, C: per call)
    tail: tuple  # runtime ints after the frame
    constexprs: dict  # (LMK_ONE, FOLD) -> constexprs
    num_warps: int
    num_stages: int
    block_n: int
    static: dict  # (LMK_ONE, FOLD) -> static_key
    # split-KV only: the shapes of the partial outputs and LSEs (reference.device.scratch)
    scratch_shapes: tuple = ()
    combine_grid: tuple = ()
    combine_ints: tuple = ()
    combine_constexprs: dict | None = None
    combine_static: tuple = ()
    # prefill through TMA descriptors, when the call's strides allow it
    tma: "_Plan | None" = None
    blocks: tuple = ()  # TMA plan: (BLOCK_M, BLOCK_N, BLOCK_DK, BLOCK_DV)
    fold: bool = False  # the plan has FOLD variants (FOLD_SCALE, TMA_VIEW_FOLD or the _fold knob)
    j_mins: dict = field(default_factory=dict)  # TMA plan: (kv_start, Lk) -> j_min (_j_min)
    # TMA plan: the V_CHUNK variants (same grid and tiles), for calls _v_chunk_desc accepts
    vchunk: "_Plan | None" = None
    # V_CHUNK plan: its LMK_ONE == 2 variants, and those with EDGE_VIEW too (_vchunk_variant)
    last_col: "_Plan | None" = None
    edge_view: "_Plan | None" = None

    def pick(self, c: int, qk_scale: float) -> tuple[dict, tuple]:
        """``(constexprs, static key)`` of the variant a call runs: ``LMK_ONE``
        where the frame's chunk allows it (:func:`_lmk_one`), ``FOLD`` where the
        plan has it and the scale allows it (:func:`_fold_ok`, not evaluated
        otherwise); where the plan does not use one, both of its keys hold the
        same kernel (:func:`_variants`)."""
        key = (_lmk_one(c, self.block_n), self.fold and _fold_ok(qk_scale))
        return self.constexprs[key], self.static[key]


def _variants(cx: dict, lmk_one_ok: bool, num_warps: int, num_stages: int,
              fold: bool | None, tail: dict | None = None, maxnreg: int | None = None) -> tuple[dict, dict]:
    """``(constexprs, static keys)`` keyed by ``(LMK_ONE, FOLD)``. Where the
    one-landmark test is not used (``lmk_one_ok`` false, see :func:`_make_plan`)
    both ``LMK_ONE`` keys map to the ``LMK_ONE=False`` kernel; without ``fold``
    both ``FOLD`` keys map to ``FOLD=False`` (``fold=None``: a kernel without a
    ``FOLD`` constexpr). ``tail``: constexprs the kernel declares after ``FOLD``
    (the order is the kernel's: :class:`_Kernel`'s direct launch passes them
    positionally)."""
    cxs, sts = {}, {}
    for one in (False, True):
        for fo in (False, True):
            v = dict(cx, LMK_ONE=one and lmk_one_ok)
            if fold is not None:
                v["FOLD"] = fo and fold
            v.update(tail or {})
            cxs[(one, fo)] = v
            sts[(one, fo)] = static_key(v, num_warps, num_stages, False, maxnreg)
    return cxs, sts


def _respun(plan: _Plan, path: str, fold: bool | None = None, **override) -> _Plan:
    """``plan`` with ``override`` set in every variant's constexprs (each keeps its place in
    the kernel's order) and the static keys made anew; ``fold`` (a bool) sets ``FOLD`` anew
    too, on the variants whose key asks for it (:meth:`_Plan.pick`: a call whose scale
    :func:`_fold_ok` refuses still runs ``FOLD=False``)."""
    cxs = {key: dict(cx, **override, **({} if fold is None else {"FOLD": key[1] and fold}))
           for key, cx in plan.constexprs.items()}
    sts = {key: static_key(cx, plan.num_warps, plan.num_stages, False, plan.static[key][4])
           for key, cx in cxs.items()}
    return replace(plan, path=path, constexprs=cxs, static=sts, last_col=None, edge_view=None,
                   fold=plan.fold if fold is None else fold)


def _qk_scale(p: Problem) -> float:
    """The scale the kernels take: ``sm_scale * log2(e)`` (they exponentiate in base 2 and
    convert the LSE back to natural log); one formula for the launch and :func:`describe`."""
    return p.sm_scale * LOG2E


def _fold_ok(qk_scale: float) -> bool:
    """Whether a call may run ``FOLD`` (``kernels._softmax_p``): ``qk_scale``
    (``sm_scale * log2(e)``, passed as float32) must be a positive normal
    float32 (``reference.validation.positive_normal_f32``); other scales
    multiply first."""
    return positive_normal_f32(qk_scale)


def _lmk_one(c: int, block_n: int) -> bool:
    """Whether the kernel frame's chunk ``c`` allows the one-landmark-per-block
    test (``kernels._not_lmk``): ``c >= BLOCK_N``."""
    return c >= block_n


_PLANS: dict = {}
PLANS_MAX = 1024  # the plan cache is cleared when it holds this many (distinct static shapes)


def _lk_key(p: Problem, path) -> int:
    """``Lk`` as far as a launch plan depends on it: past
    ``window_size + chunk_size + Lq`` nothing the plan computes (path choice,
    split sizes) changes with ``Lk`` (every ``min(Lk, ...)`` in
    :func:`choose_path` / :func:`_make_plan` saturates), so a decode loop whose
    ``Lk`` grows by one a step reuses one plan instead of building one per step.
    The packed path's split length spans all of ``Lk``: exact ``Lk`` wherever
    it can be chosen."""
    if path == "packed" or (path is None and PACK_MIN_GROUP is not None):
        return p.Lk
    return min(p.Lk, p.window_size + p.chunk_size + p.Lq)


# mode -> V by TMA. Triton 3.6's automatic warp specialisation of this loop
# (tl.range(warp_specialize=True)) was tried on the H200 and dropped: 2.3x
# slower at 64x64 and NaN in o at 64x64 w4 s3 (bench_results/triton-lab3-ef576ba.json).
# "v_chunk": v's inside blocks through the chunked view where a call allows it (TMA_V_CHUNK),
# else by pointers; "shipped": the TMA kernel forced, v as the tables ship it.
TMA_MODES = {"v_ptr": False, "v_tma": True, "v_chunk": False, "shipped": False, "gluon": True}
# The Gluon prefill kernel (gluon_prefill._swa_fwd_gluon_kernel: q, k, v by TMA,
# the softmax overlapped with the PV product), per (dtype class, head bucket), for
# head dims whose rows the copy engine and the wgmma tiles take as they are.
GLUON_PREFILL: dict[tuple[str, int], Config] = {}
GLUON_HEADS = (64, 128)


def _gluon_ok(p: Problem) -> bool:
    """Whether the Gluon prefill kernel can serve ``p`` (Hopper, 16-bit, head dims of
    :data:`GLUON_HEADS`). Static in the problem (the plan cache's key): the kernel
    serves int32 and int64 kernel frames alike."""
    return (gluon_prefill.HAVE_GLUON and not interpreter_active() and device_type(p.device) == "cuda"
            and capability(p.device) == (9, 0) and p.dtype != torch.float32
            and p.Dqk in GLUON_HEADS and p.Dv in GLUON_HEADS)


_I32 = 2 ** 31
_I63 = 2 ** 63


def _frame(p: Problem) -> tuple[int, int, int]:
    """``(kv_start, W, C)`` the kernels get: ``p.kernel_frame()`` (same
    visibility; small values unless the chunk itself is large). Triton types
    an int argument of 2**31 or more as int64, and every position derived from
    it with it. When the frame's values are below 2**31 but positions derived
    from them (up to ``r + Lk + W + 2C`` plus a block) could pass it, the frame
    is moved up by whole chunks past 2**31 (then ``C <= r + Lk < 2**31 + Lk``,
    so the moved ``r`` stays below ``2**32 + Lk``). Where they would pass int64
    (a chunk of about 2**61 or more whose boundary falls inside the cache, so
    ``r`` is as large) the kernels get ``p.kernel_frame(True)`` instead: the
    boundary at the same key index in a chunk of ``Lk + 1``, every value at most
    ``2 * Lk + 1``, so ``top <= 6 * Lk + 1027``, and ``Lk < 2**58`` (a tensor's
    ``Lk * Dqk`` elements stay below 2**63, ``Dqk >= 32``): every call fits.
    """
    r, w, c = p.kernel_frame()
    top = r + p.Lk + w + 2 * c + 1024
    if top >= _I63:
        r, w, c = p.kernel_frame(True)
        top = r + p.Lk + w + 2 * c + 1024
    if top >= _I32:
        r += c * -(-(_I32 - r) // c)  # the smallest r + m*c >= 2**31
    return r, w, c


def _tma_choice(p: Problem, tma, cfg: Config | None):
    """``(Config, v_by_tma, v_chunk)`` of the TMA prefill kernel for this problem, or
    None. ``v_chunk``: the plan may take ``V_CHUNK`` (:data:`TMA_V_CHUNK`; calls decide,
    :func:`_v_chunk_desc`).

    ``o`` comes from ``Problem.new_outputs`` (fresh, contiguous): the copy
    engine accepts it exactly when a row of ``Dv`` elements is a multiple of
    16 bytes, decided here once instead of per call.
    """
    if tma == "gluon":
        if cfg is not None and (cfg.num_stages < 2 or cfg.num_warps not in (4, 8) or cfg.block_n % 16
                                or cfg.block_m % (16 * cfg.num_warps) or cfg.maxnreg is not None
                                or cfg.block_m > 256 or cfg.block_n > 256):
            raise ValueError(f"triton: no Gluon prefill tile {cfg}: it needs num_stages >= 2, 4 or 8 warps, "
                             "block_m a multiple of 16 * num_warps, block_n a multiple of 16, both at most "
                             "256 (a TMA box), and no register cap")
        if not _gluon_ok(p):
            raise UnsupportedConfig(
                "triton: the Gluon prefill kernel needs bf16/fp16 CUDA tensors on a Hopper GPU (sm_90) "
                f"with head dims in {GLUON_HEADS}")
        return (cfg or GLUON_PREFILL.get((dtype_class(p.dtype), head_bucket(p))) or Config(64, 64, 4, 2), True,
                False)
    if tma is False or p.dtype == torch.float32:
        return None
    if interpreter_active():
        # CPU tests: the TMA kernel runs under the interpreter when a mode names it,
        # for fp16 only (the kernel has no upcast path, and the interpreter's bf16
        # arithmetic is wrong: triton-lang/triton#11584).
        if tma is None:
            return None
        if p.dtype != torch.float16:
            raise UnsupportedConfig("triton: under TRITON_INTERPRET=1 the TMA prefill kernel runs fp16 "
                                    "only (the interpreter computes bf16 wrongly, triton-lang/triton#11584)")
    elif device_type(p.device) != "cuda":
        return None
    if (p.Dv * p.dtype.itemsize) % 16:
        return None
    key = (dtype_class(p.dtype), head_bucket(p))
    if tma is None:  # the table decides; an explicit pointer-kernel config keeps that kernel
        choice = None if cfg is not None else PREFILL_TMA.get(key)
        if choice is None or (_cdiv(p.Lq, choice[0].block_m) * p.B * p.Hq
                              < TMA_MIN_WAVES * sm_count(p.device)):
            return None
        return (*choice, TMA_V_CHUNK.get(key, False))
    if tma not in TMA_MODES:
        raise ValueError(f"unknown tma mode {tma!r}; one of {sorted(TMA_MODES)}")
    shipped = PREFILL_TMA.get(key)  # forced: the shipped TMA config where there is one
    if tma == "shipped":
        v_tma, v_chunk = (shipped[1] if shipped else False), TMA_V_CHUNK.get(key, False)
    else:
        v_tma, v_chunk = TMA_MODES[tma], tma == "v_chunk"
    return (cfg or (shipped[0] if shipped else PREFILL[key]), v_tma, v_chunk)


def _tma_strides_ok(*tensors) -> bool:
    """The copy engine's rules (:func:`_tma_fits`) for each of ``tensors``."""
    return all(_tma_fits((t.data_ptr(),), (t.stride(),), t.element_size()) for t in tensors)


def _tma_fits(ptrs: tuple, strides: tuple, es: int) -> bool:
    """Whether the copy engine can read tensors at ``ptrs`` with ``strides`` (elements of
    ``es`` bytes): base 16-byte aligned, innermost stride 1, the others positive (a
    broadcast dimension of stride 0 takes the pointer kernel) multiples of 16 bytes."""
    for ptr in ptrs:
        if ptr & 15:
            return False
    return _strides_fit(strides, es)


_STRIDES_FIT: dict = {}


def _strides_fit(strides: tuple, es: int) -> bool:
    """Whether each stride tuple of ``strides`` (elements of ``es`` bytes) suits the copy
    engine: innermost stride 1, the others positive multiples of 16 bytes below 2**40
    bytes (``cuTensorMapEncodeTiled``'s bound; a size-1 dimension may carry any stride).
    Memoised (a caller's strides repeat from call to call); the table is cleared when full."""
    key = (strides, es)
    ok = _STRIDES_FIT.get(key)
    if ok is None:
        ok = all(st[-1] == 1 and all(0 < s * es < 1 << 40 and (s * es) % 16 == 0 for s in st[:-1])
                 for st in strides)
        if len(_STRIDES_FIT) >= 1024:
            _STRIDES_FIT.clear()
        _STRIDES_FIT[key] = ok
    return ok


def _pdl_ok(p: Problem, pdl) -> bool:
    """Whether a split-KV call launches its combine as a programmatic dependent:
    ``SPLIT_PDL`` (or the private knob ``pdl``) on a Hopper-class GPU (compute
    capability 9 or more; the interpreter and older GPUs launch in series)."""
    want = SPLIT_PDL if pdl is None else bool(pdl)
    return want and not interpreter_active() and capability(p.device)[0] >= 9


def _make_plan(p: Problem, path, config, num_splits, phases, tma=None, fold=None, pdl=None) -> _Plan:
    upcast = interpreter_active() and p.dtype == torch.bfloat16  # the interpreter's bf16 only
    ieee = p.dtype == torch.float32
    cls, bucket = dtype_class(p.dtype), head_bucket(p)
    bdk, bdv = max(16, _pow2(p.Dqk)), max(16, _pow2(p.Dv))
    if path is None:
        path = choose_path(p)
    common = dict(DK=p.Dqk, DV=p.Dv, BLOCK_DK=bdk, BLOCK_DV=bdv)
    flags = dict(MASK_LMK=p.mask_lmk, EXPAND=p.expand_to_chunk, UPCAST=upcast, IEEE=ieee)
    # The one-landmark-per-block test (kernels._not_lmk) serves the 16-bit kernels
    # only: the fp32 tiles are FFMA-bound (~1030 FFMA vs ~40 ISETP per block at
    # D=64) and with it ptxas spills 4-8 registers in two fp32 configs.
    lmk_one_ok = p.mask_lmk and not ieee
    fold_on = FOLD_SCALE.get((cls, bucket), False) if fold is None else bool(fold)
    if path == "prefill":
        cfg = config or PREFILL[(cls, bucket)]
        ph = PHASES[(cls, bucket)] if phases is None else phases
        cx, st = _variants(dict(common, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **flags, PHASES=ph),
                           lmk_one_ok, cfg.num_warps, cfg.num_stages, fold_on, maxnreg=cfg.maxnreg)
        plan = _Plan(path, (_cdiv(p.Lq, cfg.block_m), p.B * p.Hq), (p.Hq, p.group, p.Lq), (), cx,
                     cfg.num_warps, cfg.num_stages, cfg.block_n, st, fold=fold_on)
        choice = _tma_choice(p, tma, config)
        if choice is not None and tma == "gluon":
            tcfg = choice[0]
            gcxs, gsts = _variants(dict(DV=p.Dv, BLOCK_M=tcfg.block_m, BLOCK_N=tcfg.block_n, BLOCK_DK=bdk,
                                        BLOCK_DV=bdv, STAGES=tcfg.num_stages, MASK_LMK=p.mask_lmk,
                                        EXPAND=p.expand_to_chunk),
                                   lmk_one_ok, tcfg.num_warps, 1, None, dict(NUM_WARPS=tcfg.num_warps),
                                   maxnreg=tcfg.maxnreg)
            plan.tma = _Plan("prefill_gluon", (_cdiv(p.Lq, tcfg.block_m), p.B * p.Hq), plan.head, (),
                             gcxs, tcfg.num_warps, tcfg.num_stages, tcfg.block_n, gsts,
                             blocks=(tcfg.block_m, tcfg.block_n, bdk, bdv))
        elif choice is not None:
            tcfg, v_tma, v_chunk = choice
            tph = TMA_PHASES.get((cls, bucket), False) if phases is None else phases
            tcommon = dict(common, BLOCK_M=tcfg.block_m, BLOCK_N=tcfg.block_n, MASK_LMK=p.mask_lmk,
                           EXPAND=p.expand_to_chunk, V_TMA=v_tma)
            tcx, tst = _variants(tcommon, lmk_one_ok, tcfg.num_warps, tcfg.num_stages, fold_on,
                                 dict(PHASES=tph, V_CHUNK=False, EDGE_STAGES=0, EDGE_VIEW=False),
                                 maxnreg=tcfg.maxnreg)
            plan.tma = _Plan("prefill_tma", (_cdiv(p.Lq, tcfg.block_m), p.B * p.Hq), plan.head, (),
                             tcx, tcfg.num_warps, tcfg.num_stages, tcfg.block_n, tst,
                             blocks=(tcfg.block_m, tcfg.block_n, bdk, bdv), fold=fold_on)
            # V_CHUNK variants: the kernel needs the landmark test (one landmark a block at
            # most: calls with C >= BLOCK_N), the phases and v by pointers on the edges
            if v_chunk and lmk_one_ok and tph and not v_tma:
                ccx, cst = _variants(tcommon, True, tcfg.num_warps, tcfg.num_stages, fold_on,
                                     dict(PHASES=True, V_CHUNK=True,
                                          EDGE_STAGES=TMA_V_CHUNK_EDGE_STAGES.get((cls, bucket), 0),
                                          EDGE_VIEW=False),
                                     maxnreg=tcfg.maxnreg)
                for fo in (False, True):  # the view needs C >= BLOCK_N: LMK_ONE whatever pick asks
                    ccx[(False, fo)], cst[(False, fo)] = ccx[(True, fo)], cst[(True, fo)]
                vplan = replace(plan.tma, path="prefill_tma_vchunk", constexprs=ccx, static=cst,
                                j_mins=plan.tma.j_mins)
                if TMA_LAST_COL.get((cls, bucket), False):  # calls with C == BLOCK_N (_vchunk_variant)
                    vfold = TMA_VIEW_FOLD.get((cls, bucket), False) if fold is None else bool(fold)
                    vplan.last_col = _respun(vplan, "prefill_tma_lastcol", vfold, LMK_ONE=2)
                    if TMA_EDGE_VIEW.get((cls, bucket), False):
                        vplan.edge_view = _respun(vplan, "prefill_tma_edgeview", vfold, LMK_ONE=2,
                                                  EDGE_VIEW=True)
                plan.tma.vchunk = vplan
        return plan
    if path not in ("splitkv", "packed"):
        raise ValueError(f"unknown path {path!r}")
    packed = path == "packed"
    base = config or (PACKED if packed else SPLIT)[(cls, bucket)]
    rows = p.group * p.Lq
    rows_total = p.B * p.Hq * p.Lq

    def row_tiles(cfg):  # (block_m, row tiles, tiles x batch x KV heads) of a split/packed config
        bm = min(cfg.block_m, max(16, _pow2(rows)))
        return bm, _cdiv(rows, bm), _cdiv(rows, bm) * p.B * p.Hkv

    block_m, m_tiles, grid_base = row_tiles(base)
    # the narrow tile only where the table decides (no explicit config or split count)
    narrow = None if (packed or config is not None or num_splits is not None) else SPLIT_NARROW.get((cls, bucket))
    if narrow is not None and grid_base * _split_blocks(p, block_m, base.block_n) < sm_count(p.device):
        base = narrow
        block_m, m_tiles, grid_base = row_tiles(base)
    block_n = base.block_n
    if packed:
        num_splits, split_len = 1, _cdiv(p.Lk + block_n, block_n) * block_n
    else:
        n_blocks = _split_blocks(p, block_m, block_n)
        if num_splits is None:
            num_splits = max(1, min(n_blocks, MAX_SPLITS, _cdiv(SPLIT_TARGET * sm_count(p.device), grid_base)))
        num_splits = max(1, min(num_splits, n_blocks))
        split_len = _cdiv(n_blocks, num_splits) * block_n
        num_splits = _cdiv(n_blocks * block_n, split_len)
    pdl_on = not packed and _pdl_ok(p, pdl)
    cx, st = _variants(dict(common, BLOCK_M=block_m, BLOCK_N=block_n, **flags, DIRECT=packed),
                       lmk_one_ok, base.num_warps, base.num_stages, fold_on, dict(PDL=pdl_on),
                       maxnreg=base.maxnreg)
    plan = _Plan(path, (m_tiles, p.B * p.Hkv, num_splits), (p.Hq, p.Hkv, p.group, p.Lq),
                 (split_len, rows_total), cx, base.num_warps, base.num_stages, block_n, st,
                 fold=fold_on)
    if not packed:
        plan.scratch_shapes = ((num_splits * rows_total * p.Dv,), (num_splits * rows_total,))
        plan.combine_grid = (_cdiv(rows_total, COMBINE_ROWS),)
        plan.combine_ints = (rows_total, num_splits)
        plan.combine_constexprs = dict(DV=p.Dv, BLOCK_DV=bdv, BLOCK_S=max(2, _pow2(num_splits)),
                                       ROWS=COMBINE_ROWS, PDL=pdl_on, UPCAST=flags["UPCAST"])
        plan.combine_static = static_key(plan.combine_constexprs, COMBINE_WARPS, 1, pdl_on)
    return plan


def _split_blocks(p: Problem, block_m: int, block_n: int) -> int:
    """Key blocks of ``block_n`` a split-KV tile of ``block_m`` packed rows can need
    (the window of its first query to its last, plus one block of misalignment):
    the most splits it can take."""
    q_per_tile = min(p.Lq, _cdiv(block_m, p.group) + 1)
    return _cdiv(min(p.Lk, _span(p) + q_per_tile) + block_n, block_n)


_GLUON_LAYOUTS: dict = {}


def _gluon_descs(q, k, v, bm, bn, bdk, bdv):
    """Gluon TMA descriptors of ``q``, ``k``, ``v`` (4-D, blocks ``[1, 1, rows, D]``,
    NVMMA-swizzled shared layouts)."""
    key = (q.dtype, bm, bn, bdk, bdv)
    lays = _GLUON_LAYOUTS.get(key)
    if lays is None:
        gl = gluon_prefill.gl
        gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
        lays = _GLUON_LAYOUTS[key] = tuple(
            ([1, 1, rows, d], gl.NVMMASharedLayout.get_default_for([1, 1, rows, d], gdt))
            for rows, d in ((bm, bdk), (bn, bdk), (bn, bdv)))
    return tuple(gluon_prefill.GluonDescriptor(t, list(t.shape), list(t.stride()), blk, lay)
                 for t, (blk, lay) in zip((q, k, v), lays))


def _j_min(plan: _Plan, p: Problem) -> int:
    """The first key any query of the call sees (``reference.mask.visible_key_range``),
    memoised per plan by ``(kv_start, Lk)``, the call values it depends on besides the
    plan's static problem."""
    key = (p.kv_start, p.Lk)
    j = plan.j_mins.get(key)
    if j is None:
        j = visible_key_range(0, p.Lq, Lq=p.Lq, Lk=p.Lk, window_size=p.window_size, chunk_size=p.chunk_size,
                              expand_to_chunk=p.expand_to_chunk, kv_start=p.kv_start)[0]
        if len(plan.j_mins) >= 64:
            plan.j_mins.clear()
        plan.j_mins[key] = j
    return j


_TMA_STRIDE_MAX = 1 << 40  # the copy engine's bound on a global stride, in bytes


def _v_chunk_desc(plan: _Plan, p: Problem, j_min: int, r: int, c: int, pv: int, sv: tuple,
                  es: int) -> tuple | None:
    """``(data_ptr, shape, strides)`` of the chunked view of ``v`` that ``V_CHUNK`` reads
    (``kernels._swa_fwd_tma_kernel``), or None: the call runs the pointer-v kernel.

    The view starts at key ``j_min`` (where the kernel's key tiles start) and holds the
    whole chunks from there: shape ``(B, Hkv, (Lk - j_min) // c, c - 1, Dv)``, strides
    ``(sb, sh, c * sl, sl, sd)``. A chunk's last row, its landmark, lies outside the view
    and arrives as the copy engine's zero fill. It serves a call when the plan has the
    variants (:data:`TMA_V_CHUNK`, ``mask_lmk``, the phases), the kernel frame's chunk
    ``c`` is a multiple of ``BLOCK_N`` (a key tile then lies in one chunk), key ``j_min``
    starts a chunk (``(r + j_min) % c == 0``: with ``expand_to_chunk``, whenever the
    first window is not clipped at key 0 or ``kv_start`` starts a chunk), a whole chunk
    lies past it, and the chunk stride fits the copy engine. The kernel runs the inside
    blocks past the last whole chunk as edge blocks (pointer loads)."""
    if plan.vchunk is None or c % plan.block_n or (r + j_min) % c:
        return None
    n_chunks = (p.Lk - j_min) // c
    if n_chunks < 1 or c * sv[2] * es >= _TMA_STRIDE_MAX:
        return None
    return (pv + j_min * sv[2] * es, (p.B, p.Hkv, n_chunks, c - 1, p.Dv),
            (sv[0], sv[1], c * sv[2], sv[2], sv[3]))


def _vchunk_variant(vplan: _Plan, p: Problem, r: int, c: int, block_m: int) -> _Plan:
    """The plan a call that takes the chunked view (:func:`_v_chunk_desc`) runs: ``vplan``
    itself, or where the kernel frame's chunk ``c`` is the key block (``C == BLOCK_N``) its
    last-column variants (``kernels._not_lmk`` ``LMK_ONE == 2``: the view already puts key
    ``j_min`` on a chunk boundary and the key tiles are aligned to it, so every block is one
    whole chunk, its landmark the last column), and among those, where ``expand_to_chunk``
    holds and ``Lq``, ``Lk``, the frame's ``kv_start`` ``r`` and the row tile are whole
    chunks, the variants whose edge blocks read ``v`` through the view too (``EDGE_VIEW``:
    every edge block is then a whole chunk inside the view, and the keys of it that the
    pointer loads would take are the chunk's keys but its landmark, which the view leaves
    out). :data:`TMA_LAST_COL`, :data:`TMA_EDGE_VIEW` say where the plans have them."""
    if vplan.last_col is None or c != vplan.block_n:
        return vplan
    if (vplan.edge_view is not None and p.expand_to_chunk
            and not (r % c or p.Lk % c or p.Lq % c or block_m % c)):
        return vplan.edge_view
    return vplan.last_col


def _launch_tma(plan: _Plan, p: Problem, q, k, v, o, lse, qk_scale: float, ops: tuple,
                dev: int | None) -> None:
    """``plan`` is the TMA plan (``prefill_plan.tma``); ``ops`` the ``(data_ptr, strides)``
    of ``q``, ``k``, ``v`` (:func:`_tma_operands`); ``dev`` the current device (:func:`_run`)."""
    bm, bn, bdk, bdv = plan.blocks
    r, w, c = _frame(p)
    j_min = _j_min(plan, p)
    if plan.path == "prefill_gluon":
        cx, st = plan.pick(c, qk_scale)
        kk, vv = k[:, :, j_min:], v[:, :, j_min:]
        _FWD_GLUON(plan.grid, (*_gluon_descs(q, kk, vv, bm, bn, bdk, bdv), o, lse),
                   (*o.stride()[:3], *plan.head, p.Lk, r, j_min, w, c), (qk_scale,), cx, st, dev=dev)
        return
    (pq, sq), (pk, sk), (pv, sv) = ops
    es = k.element_size()
    vd = _v_chunk_desc(plan, p, j_min, r, c, pv, sv, es)  # None: v by pointers
    cx, st = (plan if vd is None else _vchunk_variant(plan.vchunk, p, r, c, bm)).pick(c, qk_scale)
    st = _frame_static(st, (r, w, c))
    if j_min == 0:
        kd = (pk, k.shape, sk)
        vd = vd or (pv, v.shape, sv)
    else:  # the key range from j_min on: the base moved by j_min rows, Lk - j_min rows
        kd = (pk + j_min * sk[2] * es, (p.B, p.Hkv, p.Lk - j_min, p.Dqk), sk)
        vd = vd or (pv + j_min * sv[2] * es, (p.B, p.Hkv, p.Lk - j_min, p.Dv), sv)

    def build():  # the same four descriptors as TensorDescriptor objects (the JIT path)
        kk = k[:, :, j_min:]
        vv = torch.as_strided(v, vd[1], vd[2], v.storage_offset() + (vd[0] - pv) // es)
        return (TensorDescriptor(q, list(q.shape), list(q.stride()), [1, 1, bm, bdk]),
                TensorDescriptor(kk, list(kk.shape), list(kk.stride()), [1, 1, bn, bdk]),
                TensorDescriptor(vv, list(vv.shape), list(vv.stride()), [1] * (len(vd[1]) - 2) + [bn, bdv]),
                TensorDescriptor(o, list(o.shape), list(o.stride()), [1, 1, bm, bdv]))

    _FWD_TMA.launch_tma(plan.grid, ((pq, q.shape, sq), kd, vd, (o.data_ptr(), o.shape, o.stride())), build,
                        (v, lse), (*sv, *plan.head, p.Lk, r, j_min, w, c), (qk_scale,), cx, st, dev=dev)


def _plan(p: Problem, path=None, config=None, num_splits=None, phases=None, tma=None, fold=None,
          pdl=None) -> _Plan:
    """The cached launch plan of a call (:func:`launch`'s knobs; built on a miss)."""
    key = (p.B, p.Hq, p.Hkv, p.Lq, _lk_key(p, path), p.Dqk, p.Dv, p.dtype, p.device, p.window_size,
           p.chunk_size, p.mask_lmk, p.expand_to_chunk, path, config, num_splits, phases, tma, fold, pdl)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _make_plan(p, path, config, num_splits, phases, tma, fold, pdl)
        if tma and plan.path != "prefill":
            raise ValueError(f"tma={tma!r} applies to the prefill path, not {plan.path!r}")
        if len(_PLANS) >= PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _tma_operands(plan: _Plan, tma, q, k, v) -> tuple | None:
    """``((data_ptr, strides) of q, k, v)`` when a prefill call runs the TMA kernel (the
    plan has one and the call's strides and base addresses suit the copy engine;
    ``o``: decided with the plan), else None. When ``tma`` names a mode and the
    kernel cannot serve the call, :class:`UnsupportedConfig` (asked for explicitly:
    no other kernel runs). ``q``, ``k``, ``v`` share one dtype (``check_inputs``)."""
    if plan.tma is not None:
        ptrs, strides = (q.data_ptr(), k.data_ptr(), v.data_ptr()), (q.stride(), k.stride(), v.stride())
        if _tma_fits(ptrs, strides, q.element_size()):
            return (ptrs[0], strides[0]), (ptrs[1], strides[1]), (ptrs[2], strides[2])
    if tma:
        raise UnsupportedConfig(
            "triton: the TMA prefill kernel needs bf16/fp16 CUDA tensors (fp16 CPU tensors under "
            "TRITON_INTERPRET=1) whose innermost stride is 1, whose other strides and base addresses "
            "are positive multiples of 16 bytes, and whose Dv rows are multiples of 16 bytes")
    return None


def describe(p: Problem, q, k, v, **knobs) -> str:
    """What :func:`launch` runs for this call (same plan, same choice of the TMA
    kernel), in one line: path, tile ``BLOCK_M x BLOCK_N``, warps, stages, the
    register cap, ``fold`` where the kernel it runs has the scale in the exponent (``FOLD``,
    :func:`_fold_ok`), the TMA kernel's phases and ``v-chunk`` (its inside blocks' ``v``
    through the chunked view, :func:`_v_chunk_desc`; ``last-col v-chunk`` / ``edge-view
    v-chunk`` where it runs a variant of :func:`_vchunk_variant`), split count and the combine's
    dependent launch. Plans only (cached like a call's); launches nothing. A call run
    over batch slices (:func:`batches_per_launch`) is described by its first slice's plan
    and the number of launches."""
    per = batches_per_launch(p)
    if per < p.B:
        cuts = batch_slices(p.B, per)
        s = cuts[0]
        return (describe(replace(p, B=s.stop), q[s], k[s], v[s], **knobs)
                + f" (batch slices of {s.stop} or fewer: {len(cuts)} launches)")
    plan = _plan(p, **knobs)
    kind = plan.path
    chunked = False
    ops = _tma_operands(plan, knobs.get("tma"), q, k, v) if kind == "prefill" else None
    if ops is not None:
        plan = plan.tma
        kind = plan.path  # "prefill_tma" or "prefill_gluon"
        r, _, c = _frame(p)
        chunked = _v_chunk_desc(plan, p, _j_min(plan, p), r, c, *ops[2], v.element_size()) is not None
    runs = _vchunk_variant(plan.vchunk, p, r, c, plan.blocks[0]) if chunked else plan  # its FOLD
    variant = {"prefill_tma_lastcol": " last-col", "prefill_tma_edgeview": " edge-view"}.get(runs.path, "")
    cx = next(iter(plan.constexprs.values()))
    st = _frame_static(next(iter(plan.static.values())), _frame(p))
    text = f"{kind} {cx['BLOCK_M']}x{cx['BLOCK_N']} w{plan.num_warps} s{plan.num_stages}"
    if st[4] is not None:
        text += f" r{st[4]}"
    if runs.fold and _fold_ok(_qk_scale(p)):
        text += " fold"
    if kind in ("prefill", "prefill_tma") and cx.get("PHASES"):
        text += " phases"
    if chunked:
        text += variant + " v-chunk"
    if kind == "splitkv":
        text += f" S={plan.grid[2]}" + (" +combine pdl" if plan.combine_static[3] else " +combine")
    return text


def batches_per_launch(p: Problem) -> int:
    """How many batches one launch may serve: all ``B`` unless ``B * Hq`` would pass the
    grid's y bound (``reference.device.GRID_YZ_MAX``; every kernel here puts batch x heads
    on y: ``B * Hq`` programs on the prefill grids, ``B * Hkv`` on the split and packed
    ones); :func:`launch` then runs ``batch_slices`` of at most this many. ``Hq`` itself
    must fit (the adapter refuses more heads)."""
    return min(p.B, GRID_YZ_MAX // max(p.Hq, 1))


def launch(p: Problem, q, k, v, o, lse, *, path: str | None = None, config: Config | None = None,
           num_splits: int | None = None, phases: bool | None = None, tma=None,
           fold: bool | None = None, pdl: bool | None = None) -> str:
    """Run one call; returns the path taken. ``path`` (``"prefill"``,
    ``"packed"``, ``"splitkv"``), ``config``, ``num_splits``, ``phases`` (the
    key loop in phases: the pointer kernel's ``PHASES`` table, the TMA kernel's
    ``TMA_PHASES``; a bool forces both),
    ``tma`` (``None``: the table decides; ``False``: never; a key of
    ``TMA_MODES``: forced on the prefill path) and ``fold`` (``None``: the
    ``FOLD_SCALE`` table, and ``TMA_VIEW_FOLD`` for the chunked view's variants; a bool
    forces it everywhere, still only for a positive normal scale) and ``pdl`` (``None``: ``SPLIT_PDL``; a bool forces the split-KV
    combine's programmatic dependent launch on or off, still only on Hopper)
    are private knobs for tests and tuning (``tools/gpu_triton.py``,
    ``triton_impl.tma_prefill``).

    The kernels run on the tensors' device and its current stream (the current
    device is switched for the call when it is another; compiled kernels are kept per
    device). ``o`` and ``lse`` are ``p.new_outputs()`` (fresh, contiguous). The launch
    plan (path, grids, constexprs, split sizes) depends only on the static
    problem, not on ``kv_start``, strides or data, and is cached. The
    TMA prefill kernel is taken when the plan has one and the call's strides
    and base addresses suit the copy engine (``"prefill_tma"`` is returned);
    otherwise the pointer kernel serves the call, or, when ``tma`` names a
    mode, :class:`UnsupportedConfig` is raised. A call whose ``B * Hq`` programs would
    pass the grid's y bound runs as launches over slices of the batch
    (:func:`batches_per_launch`; views, nothing copied), each planned as its own call.
    """
    if device_type(p.device) != "cuda" and not interpreter_active():  # the direct launches pass raw addresses
        raise UnsupportedConfig(f"triton: launch() needs CUDA tensors, or TRITON_INTERPRET=1 for CPU ones; "
                                f"got {p.device}")
    per = batches_per_launch(p)
    if per < p.B:
        knobs = dict(path=path, config=config, num_splits=num_splits, phases=phases, tma=tma, fold=fold,
                     pdl=pdl)
        for s in batch_slices(p.B, per):  # near-equal slices: each plans like the first
            taken = launch(replace(p, B=s.stop - s.start), q[s], k[s], v[s], o[s], lse[s], **knobs)
        return taken
    plan = _plan(p, path, config, num_splits, phases, tma, fold, pdl)
    # Triton compiles, loads and launches on the current device: the tensors' device for
    # the call (their streams, their context), as torch's own ops do; the kernels are
    # kept per device (_Kernel), which is then p.device.index.
    with made_current(p.device):
        return _run(plan, p, q, k, v, o, lse, tma, p.device.index)


def _run(plan: _Plan, p: Problem, q, k, v, o, lse, tma, dev: int | None) -> str:
    """:func:`launch` on the current device ``dev`` (None: not a CUDA call)."""
    qk_scale = _qk_scale(p)
    if plan.path == "prefill":
        ops = _tma_operands(plan, tma, q, k, v)
        if ops is not None:
            _launch_tma(plan.tma, p, q, k, v, o, lse, qk_scale, ops, dev)
            return plan.tma.path  # "prefill_tma" or "prefill_gluon"
        frame = _frame(p)
        cx, st = plan.pick(frame[2], qk_scale)
        st = _frame_static(st, frame)
        _FWD(plan.grid, (q, k, v, o, lse),
             (*q.stride(), *k.stride(), *v.stride(), *o.stride(), *plan.head, p.Lk, *frame),
             (qk_scale,), cx, st, dev=dev)
        return plan.path
    # The current stream, read once for the scratch and both launches (None: not a CUDA
    # call, or PASS_STREAM off: each reads it).
    stream = _stream(dev) if dev is not None and PASS_STREAM else None
    if plan.path == "packed":
        op, lp = o, lse
    else:
        op, lp = scratch(p.device, plan.scratch_shapes, stream)
    frame = _frame(p)
    cx, st = plan.pick(frame[2], qk_scale)
    st = _frame_static(st, frame)
    _SPLIT(plan.grid, (q, k, v, op, lp),
           (*q.stride(), *k.stride(), *v.stride(), *plan.head, p.Lk, *frame, *plan.tail),
           (qk_scale,), cx, st, dev=dev, stream=stream)
    if plan.path == "splitkv":
        _COMBINE(plan.combine_grid, (op, lp, o, lse), plan.combine_ints, (), plan.combine_constexprs,
                 plan.combine_static, dev=dev, stream=stream)
    return plan.path
