"""Launchers: config table, compile cache, path choice.

Everything here runs after :func:`reference.check_inputs` accepted the call and
:mod:`tilelang_impl.api` resolved the layouts. A call's plan (split count and
kernel, :func:`_plan`) is cached by its static problem, and a compiled kernel
is fetched from a plain dict keyed by its static configuration (one dict lookup
per call; TileLang's own JIT cache is consulted only on a miss).
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace

import torch

from reference.device import GRID_YZ_MAX, batch_slices, capability, device_type, scratch, sm_count
from reference.errors import UnsupportedConfig
from reference.validation import LOG2E, check_f32_score_scale, positive_normal_f32

from . import producer_guard


# Head dims served (both Dqk and Dv), and the step of the head dims the kernels are built for
# (the wgmma K step is 16): a call between two steps runs on the next step's kernels, which
# read its inputs narrow or zero-padded copies of them (:func:`kernel_dims`, ``api._kernel_call``).
MIN_D, MAX_D, D_STEP = 32, 256, 16
#: The landmark test divides in float32 (``macros.is_landmark``): one quotient is exact for
#: the kernel frame's positions below this (``Lk + C``, ``C`` its chunk, :func:`frame`) ...
MAX_POSITIONS = 1 << 22
#: ... and two quotients (the kernels built ``wide``, :func:`wide_positions`) below this,
#: which also keeps every difference of positions and window edges inside int32
#: (``macros.visible``); :func:`check_limits` refuses calls at or past it.
MAX_POSITIONS_WIDE = 1 << 29

#: Most landmark columns per key tile the kernels test by integer compares
#: (``macros.tile_landmark``): 2 covers C = 64 on the 128-key tiles.
LMK_COLS_MAX = 2

_TL_DTYPE = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


#: Split-KV is used for these Dv only, with ``max(Dqk, Dv) <= 128``
#: (:func:`splits_at`); other calls keep the prefill grid. At Dv = 64 the
#: split variant (128 x 64 with the split knobs, the tile that lowers there for
#: every flag pair but both off) lost to the prefill grid's 64-row tile
#: (64 x 128, one consumer warp group, :func:`tc_config`) in session 6's decode lab
#: (B=1 GQA 32/4 D=64: 11.4 vs 9.8 us); Dv = 80 / 112 and Dv < 64 were never
#: measured as split variants.
SPLIT_DV = (96, 128)

#: CTAs per SM the prefill-grid kernel is built for at ``max(Dqk, Dv) <= 128`` (but for
#: long calls at ``max(Dqk, Dv) <= 64``: :data:`TC_LONG`; the
#: ``min_blocks`` knob, :data:`kernels.MIN_BLOCKS`): launch bounds ``(256, 2)``, 128
#: registers per thread at launch, consumers 232 after ``setmaxnreg``. Above 128 the
#: kernel keeps TileLang's defaults (never measured otherwise; shared memory holds
#: one 64 x 64 CTA at D = 192 / 256 anyway).
TC_MIN_BLOCKS = 2

#: The prefill grid's calls of several query blocks (``Lq > 64``) at ``max(Dqk, Dv) <= 64``
#: (:func:`shipped_config`): the 64 x 64 tile with four CTAs per SM (``min_blocks`` 4:
#: launch bounds ``(256, 4)``, 64 registers per thread at launch, consumers 104 after
#: ``setmaxnreg``, no spills), the chunk view of ``v`` at one chunk per tile (``v_chunk`` 1:
#: C = 64, 128, ...) and ``lmk_const``; the lab variant ``occ4-64x64v`` (``nohoist`` since
#: session 45's :data:`TC_HOIST_LEFT`). Shared memory is
#: about 40 KB a CTA at two stages, so four fit an SM's 228 KB.
#:
#: Session 42 shipped this tile at three CTAs per SM (``occ3-64x64v`` of sessions 39-41,
#: consumers 136): three overlap more softmax with tensor work than two 64 x 128 CTAs, at
#: about +27% instructions per key. Session 41 lab on an H100 with the producer guard
#: (1977d21, three runs, L2 not flushed, bench_results/tilelang-lab41-guard-h100-1977d21-{1,2,3}.json),
#: against the 64 x 128 tile of two CTAs shipped before: GQA 32/4 D=64 L=8K 222-235 -> 253-268
#: TFLOP/s, 16/2 L=8K 214-226 -> 241-255, batch 4 x 4K 228-238 -> 265-274; session 42 at
#: 72984ca (bench_results/tilelang-lab42-occ3-shipped-h100-72984ca.json): 234.2 -> 266.5,
#: 226.1 -> 243.2, 230.2 -> 271.1. Before the guard (:mod:`producer_guard`) three CTAs hung
#: within a few hundred launches, and four (session 12) too.
#:
#: Session 44 shipped four (a fourth latency-bound chain an SM where the issue slots had room
#: for it). Lab, H100, L2 not flushed, against three CTAs in the same run
#: (bench_results/tilelang-lab44-h100-{1,3}.json): GQA 32/4 D=64 L=8K 255.0 -> 273.8
#: and 259.7 -> 288.1 TFLOP/s, 16/2 L=8K 242.0 -> 258.6 and 245.8 -> 270.8, batch 4 x 4K
#: 260.1 -> 296.0 and 266.1 -> 295.7 (two runs; session 43's two runs at bcf0762 gave
#: +1.3..+6.0%). 100,000 launches without a hang under graph replay (session 43) and eager
#: (session 44), ``tools/lab_hang``. Calls of one query block (decode, short chunks, packed or
#: not: :func:`prefill_config`) keep :func:`short_config`'s 64 x 128 tile, the one their
#: numbers were measured on.
TC_LONG = {"tile": (64, 64), "min_blocks": 4, "v_chunk": 1, "max_d": 64}

#: The ``hoist_left`` permission of :func:`shipped_config` (calls of several query blocks) at
#: ``max(Dqk, Dv) <= 128``, where ``mask_split`` ships (session 45): ``mask_split``'s last-row
#: left edge computed once before the consumer's key loop (``macros.last_row_left``) instead
#: of every key tile, a runtime floor division by the chunk that nvcc leaves in the loop. The
#: key loop at sm_90a, C = 64: 470 -> 436 instructions at D = 64, 507 -> 474 at D = 128
#: (``tools/sass_loops``), HGMMA and EX2 unchanged, registers as before. Lab on an H100 at
#: bbc3780 (lab variants ``shipped`` / ``hoist``, two runs, L2 not flushed,
#: bench_results/tilelang-lab45-h100-{1,2}.json): 32/32/128 L=8K 330.1 -> 351.8 and 332.1
#: -> 350.5 TFLOP/s, L=16K 343.2 -> 366.5 and 346.8 -> 366.0, GQA 32/4 D=64 L=8K 284.1 ->
#: 299.3 and 286.3 -> 295.3, 16/2 267.2 -> 275.0 and 270.0 -> 271.8, batch 4 x 4K 293.0 ->
#: 299.6 and 294.6 -> 304.1, chunked Lq=512 of 8K D=128 305.2 -> 305.4 and 306.8 -> 312.3
#: (at D = 128 above the prediction, +0..+2%, made from the 34 instructions a tile; at D = 64
#: within it, +0..+4%; why the division cost more at D = 128 is not known). 100,000 eager launches without a hang
#: (``tools/lab_hang``, the D = 64 shape B4 GQA32/4 L4K only; not under graph replay, not at
#: D = 128). Calls of one query block keep the per-tile edge (not measured with
#: the knob); :func:`call_knobs` drops the permission where the kernel cannot take it
#: (``kernels._check_knobs``: no ``mask_split``, or ``overlap`` 1 or 2 or ``pack`` baked).
TC_HOIST_LEFT = 1

#: The ``hoist_keys`` permission of :func:`shipped_config`, beside :data:`TC_HOIST_LEFT` (session
#: 46): the key/value head (``by // (Hq // Hkv)``) and the block's key range (``lo``, a floor
#: division by the chunk with ``expand_to_chunk``, and ``hi``, built on it) held in registers
#: from before the key loop (``kernels.HOIST_KEYS``) instead of expressions that the
#: warp-specialised loop recomputes where it uses them. sm_90a, C = 64: the producer loop's
#: innermost region 156 -> 109 instructions at D = 64 and 164 -> 117 at D = 128, its runtime
#: integer divisions 3 -> 1 (the V view's chunk index stays; ``tools/sass_loops``); the
#: consumer's key loop 436 -> 433. Lab on the H200 at 16e5c2e (variants ``shipped`` /
#: ``hkeys``, three runs, L2 not flushed, best of 5,
#: bench_results/tilelang-lab46-h200-{1,2,3}.json), TFLOP/s: 32/32/128 L=8K 356.3 -> 374.8,
#: 355.7 -> 374.8, 355.2 -> 374.7; L=16K 367.7 -> 385.5, 367.7 -> 385.7, 367.7 -> 386.0; GQA
#: 32/4 D=64 L=8K 296.9 -> 315.8, 297.0 -> 325.4, 270.2 -> 291.9; 16/2 258.7 -> 299.0, 266.5
#: -> 307.7, 257.3 -> 276.6; batch 4 x 4K 288.8 -> 324.7, 285.9 -> 335.2, 277.9 -> 299.9;
#: chunked Lq=512 of 8K D=128 304.8 -> 329.3, 302.5 -> 336.6, 293.9 -> 307.0 (D = 128 +4.8..+5.5%,
#: D = 64 +6.4..+17.3%, chunked +4.5..+11.3%; predicted D = 64 +0..+3%, D = 128 +0..+2%: the
#: producer's divisions held the consumers back more than a producer a tile ahead should; why
#: is not known). The lab's GPU correctness cases passed in all three runs; ``tools/lab_hang``
#: eager and under graph replay, 20,000 launches each at B4 GQA32/4 D64 L4K and 10,000 at
#: 32/32/128 L=8K: no hang. Calls of one query block (:func:`short_config`: decode, short
#: chunks, packed or not) and the split-KV grid (:func:`split_config`) keep the expressions (not
#: measured with the knob); :func:`call_knobs` drops the permission where the kernel cannot
#: take it (``overlap`` 1 or 2 baked) and where it was never built or run (``pack`` baked: no
#: packed call takes :func:`shipped_config`; a packed build with it lowered where the packed kernel
#: without it does not, ``tests/test_tilelang_compile.py``'s G = 2 case, which was not
#: looked into).
TC_HOIST_KEYS = 1


#: The ``v_chunk`` permission of the prefill-grid config at ``max(Dqk, Dv) <= 128``
#: (:func:`short_config`; 1 in :data:`TC_LONG`): ``v`` through the chunk view (:func:`v_chunk_view`) for calls
#: that admit it (:func:`v_chunk_call`) and whose chunk is a multiple of the tile's
#: ``block_N`` (:func:`call_knobs`: C = 64, 128, ... on the 64 x 64 tile of D = 128; C =
#: 128, 256, ... on the 64 x 128 tile of D <= 64's one-block calls). The copy engine then writes each
#: chunk's landmark row of the V tile as zeros, and the consumer's landmark-row zeroing
#: (a shared-memory write, two named barriers and a proxy fence per tile before
#: ``P @ V``) goes. Session 25 lab (tools/lab_tilelang.py ``vchunk`` against ``shipped``,
#: bench_results/tilelang-lab25b-ovl-vchunk-e647c8b+wip.json, H200, bf16, W=512, C=64,
#: L2 not flushed): 32/32/128 L=8K 303.6 -> 324.5 TFLOP/s, L=16K 312.8 -> 336.7, chunked
#: Lq=512 of 8K 276.1 -> 291.4 (predicted +2-6%); the D=64 rows (C=64 < 128: not
#: served) within 1%; the 64 x 64 tile with the view at D=64 3-4% below the shipped
#: 64 x 128 tile. Split-KV kept the zeroing until session 28 (below).
#: Bench at 41eda82 (L2 flushed, bench_results/bench-41eda82.json): the same three rows
#: 293.5 -> 315.4, 304.5 -> 328.1 and 198.4 -> 210.1 TFLOP/s (5.6-7.2% less kernel time).
#: The permission is the most chunks one key tile may span (:func:`v_chunk_span`): 2 since
#: session 28, which also serves D <= 64's 128-key tile at C = 64 with one bulk copy per
#: chunk (session 26's lab variant ``vchunk2``), and the split-KV kernel
#: (:func:`split_config`, lab variant ``dec-vchunk``). Session 28 lab
#: (bench_results/tilelang-lab28-e41b767.json, H200, bf16, W=512, C=64, L2 not flushed,
#: best of 5 replays): GQA 32/4 D=64 L=8K 206.9 -> 220.0 TFLOP/s, 16/2 201.4 -> 212.9,
#: batch 4 x 4K 211.8 -> 223.0 (predicted +3-7%), D=128 and chunked rows within 1%;
#: decode B=1 32/32/128 9.1 -> 7.9 us at 8K and 128K (split kernel without V's zeroing;
#: predicted -0.5..-1.5 us), B=1 GQA 32/4 D=64 8.5 -> 7.7 us (packed prefill grid, two
#: chunks a tile).
TC_V_CHUNK = 2

#: The multi-chunk values of ``kernels.V_CHUNK`` (a tile of 2 or 4 whole chunks; defined
#: here, where the launcher and the kernels both read it: this module imports no TileLang),
#: and the value head dims they serve: a V row of 64 or 128 bytes. TileLang 0.1.15 cannot
#: lower a bulk copy into part of a V tile whose rows are 96 or 256 bytes (Dv = 48, 128:
#: the swizzled shared tile is not contiguous over one chunk's rows; "plain SMEM layout is
#: not a bijection", CPU lowering, session 26).
V_CHUNK_SPANS = (2, 4)
V_CHUNK_SPAN_DV = (32, 64)


def tc_config(Dqk: int, Dv: int) -> tuple[int, int, int, int]:
    """``(block_M, block_N, num_stages, threads)`` of the tensor-core kernel on the
    prefill grid (:func:`short_config`'s tile): 64-row tiles with one consumer warp group
    (128 threads) for every head dim, 64 x 128 at ``max(Dqk, Dv) <= 64``, 64 x 64 above; two
    CTAs per SM at ``max(Dqk, Dv) <= 128`` (:data:`TC_MIN_BLOCKS`, set by
    :func:`short_config`). Since session 42 calls of several query blocks at ``max(Dqk, Dv)
    <= 64`` run another tile, 64 x 64 at three CTAs per SM, four since session 44
    (:data:`TC_LONG`, :func:`shipped_config`).

    Session 12 lab (tools/lab_tilelang.py ``occ2-64x128``,
    bench_results/tilelang-lab15-287ff31.json, H200, bf16, W=512, C=64, L2 not
    flushed), against the 128 x 128 tile with two consumer warp groups and one CTA
    per SM shipped before: 32/32/128 L=8K 237.6 -> 259.9 TFLOP/s, L=16K 245.2 ->
    270.0, GQA 32/4 D=64 155.3 -> 188.5, 16/2 146.9 -> 182.2, batch 4 x 4K 160.2 ->
    190.9, chunked Lq=512 of 8K D=128 217.4 -> 242.2. Two independent CTAs per SM
    overlap one's softmax with the other's tensor work (the two warp groups of one
    128-row CTA run theirs in step), and a 64-row tile reads ~576 keys of the window
    instead of ~640. Without the knob the 64-row tile ran one CTA per SM (TileLang's
    launch bounds let ptxas give it 240 registers) and lost 37% at D=64 (session 3,
    ``all-64x64``). 64 x 128 at D=128 does not fit two CTAs' shared memory (160 KB);
    three or four CTAs per SM of 64 x 64 hung (:data:`kernels.MIN_BLOCKS`: a producer race,
    fixed in session 41; three shipped in session 42 for long calls, four in session 44,
    :data:`TC_LONG`).

    History: D <= 64 with ``Lq <= 64`` (decode, short chunks) ran this 64 x 128 tile
    one CTA per SM since session 6 (bench_results/tilelang-lab8-89a7885.json, GQA
    32/4 D=64 Lk 8K / 32K: B=1 13.0 -> 9.8 us, B=8 25.1 -> 18.6 us against the 128-row
    tile); longer calls ran 128 x 128 with two consumer warp groups, which beat
    128 x 64 by 17% at D = 128 (146 vs 125 TFLOP/s, tilelang-lab-*.json). D > 128:
    64 x 64, one consumer warp group (the register file); verified on the H200 at
    D = 192 / 256.
    """
    if max(Dqk, Dv) <= 64:
        return 64, 128, 2, 128
    return 64, 64, 2, 128


def tc_knobs(Dqk: int, Dv: int) -> tuple:
    """Values of :data:`TC_KNOBS` shipped per head dim (eight for D <= 128, all
    but ``pack``, which :func:`prefill_config` sets per call, and ``min_blocks``, a
    property of the tile that :func:`short_config` and :func:`shipped_config` add: ``lmk_zero``,
    ``mask_split``, ``fold``, the ``lmk_cols`` cap, ``fast_exp2``, ``scale_fold``,
    ``win_u32``, ``lmk_rows_j0``; none above 128). The history
    that chose them, oldest first:

    Measured on the H200 (bf16, W=512, C=64, kernel-only TFLOP/s, lab run of
    session 3): the split mask (window test only on edge tiles) is the win,
    +27% (D=128) to +38% (D=64 GQA); zeroing only the landmark rows of V and
    the folded softmax are within +-3% alone. D <= 64 then shipped the split mask
    only (90 vs 66 TFLOP/s on GQA 32/4); D = 128 all three at 128 x 128
    (the measured combination, 146 vs 101); D > 128 keeps the kernel that was
    verified there (no knobs). These lab figures predate the sm_scale fix of
    da4dfe3 (scale inside the mask select), which cost about 5% (bench:
    144 -> 137 TFLOP/s at 32/32/128 L=8K).

    ``lmk_cols`` cap :data:`LMK_COLS_MAX` for D <= 128 (the landmark test as
    one or two integer compares per score when ``chunk_size >= block_N / 2``,
    :func:`lmk_cols_for`): exact; SASS of the consumer key loop, sm_90a: per
    128-key tile ~15% (D=128) to ~20% (D=64) fewer instructions at C = 64, the
    edge-tile mask branch-free. Measured on the H200 (lab variants ``shipped`` /
    ``lmkcols`` of tools/lab_tilelang.py, bench_results/tilelang-lab3-dbb5ab4.json):
    32/32/128 L=8K 137 -> 185 TFLOP/s, GQA 32/4 D=64 84 -> 136.

    ``fast_exp2``, ``scale_fold`` (a permission: per call,
    :func:`scale_fold_ok`), ``win_u32`` for D <= 128 and ``lmk_rows_j0`` (then
    acting at D = 128 only, where ``lmk_zero="rows"``): lab of session 5 at 1a0b87e
    (bench_results/tilelang-lab4-1a0b87e.json, L2 not flushed), all four vs the
    knobs above: 32/32/128 L=8K 185 -> 236 TFLOP/s (+27%), L=16K 192 -> 244,
    GQA 32/4 D=64 137 -> 147 (+8%), chunked Lq=512 of 8K D=128 180 -> 219
    (+22%). ``lmk_rows_j0`` alone gave +18% at D=128 (predicted +4-10%), the
    three exponent/window knobs +5% (predicted +12-25%) and +8% at D=64.
    D <= 64 took D = 128's knobs in the same session (landmark rows of V zeroed
    from the j0 register instead of the whole V tile, and the folded softmax):
    lab variant ``s5-rows+fold`` on the tree of 7e93d56 (bench_results/tilelang-lab5-7e93d56.json):
    GQA 32/4 D=64 147 -> 156 TFLOP/s (+6%), 16/2 141 -> 148, batch 4 x 4K 152 ->
    161 (predicted +8-20%); D=128 columns unchanged within 1%.
    """
    d = max(Dqk, Dv)
    if d <= 128:
        return ("rows", True, True, LMK_COLS_MAX, True, True, True, True)
    return ()


#: Knobs of the split-KV variant (:data:`TC_KNOBS` order, up to ``win_u32``):
#: landmark rows of V, the full mask (the split mask and the folded softmax did not
#: lower as split variants in TileLang 0.1.15 on session 6's tiles; on today's 64 x 64
#: tile with two CTAs per SM they do (session 14, CPU) and were measured within 1%:
#: B=1 32/32/128 W=512 11.64 -> 11.57 us, W=4096 30.02 -> 29.94, lab 3,
#: bench_results/tilelang-declab3-cd950ec.json; ``lmk_rows_j0`` still fails ThreadSync
#: in every split variant tried), the ``lmk_cols`` cap, fast_exp2, scale_fold, win_u32.
#: Session 6 decode lab (bench_results/tilelang-lab7-4e2da01.json, L2 not flushed, 4
#: splits): at B=1 32/32/128 this 64 x 64 tile 12.0 us against 13.0 us for the session-5
#: split kernel (128 x 64, whole V tile zeroed, no knobs) at the same split count.
SPLIT_KNOBS = ("rows", False, False, LMK_COLS_MAX, True, True, True)
#: Knobs of the split-KV variant with ``mask_lmk`` and without ``expand_to_chunk``,
#: where :data:`SPLIT_KNOBS` does not lower on either split tile (ThreadSync,
#: session 6 CPU compile): session 5's split kernel (whole V tile zeroed, the
#: ``lmk_cols`` cap only; 13.0 us against 12.0 us at the lab shape above).
SPLIT_KNOBS_NOEXP = ("tile", False, False, LMK_COLS_MAX)


@functools.cache  # a constant per argument tuple: asked on every plan (launch._plan) and forced split
def split_config(Dqk: int, Dv: int, mask_lmk: bool = True, expand_to_chunk: bool = True) -> tuple:
    """Tile and knobs of the split-KV variant for head dims where
    :func:`splits_at` (a ValueError elsewhere: the choice below was
    compiled and measured there only): 64 x 64 with
    one consumer warp group and :data:`SPLIT_KNOBS` (decode rows are a few of
    the tile's: half the wasted MMA rows of a 128-row tile); with ``mask_lmk``
    and without ``expand_to_chunk`` session 5's split kernel instead (128 x 64,
    :data:`SPLIT_KNOBS_NOEXP`): TileLang 0.1.15 does not lower
    :data:`SPLIT_KNOBS` there on either tile (ThreadSync, "shared-memory sync
    inside a divergent region"; CPU compile of every split kernel the launcher
    can pick, session 6, pinned by tests/test_tilelang_compile.py). Every flag
    combination has a split variant that lowers (session 5's 128 x 64 kernel
    did not with both flags off; the 64 x 64 one does).

    The 64 x 64 split kernel runs two CTAs per SM (``min_blocks`` =
    :data:`TC_MIN_BLOCKS`), and :func:`split_plan` fills one wave of them: session
    12 lab (bench_results/tilelang-lab16-e7ceddd.json, L2 not flushed, B=1
    32/32/128 decode, 8K / 128K): 12.3 / 12.2 us shipped (one CTA per SM, S = 4),
    12.3 / 12.3 with two CTAs per SM at S = 4, 11.7 / 11.6 at S = 8 (one wave of two
    CTAs per SM; predicted 10.0-11.5), 17.5 / 17.4 at S = 8 with one CTA per SM (a
    second wave). Session 5's 128 x 64 kernel keeps one (its two consumer warp groups
    would get 104 registers each, :func:`kernels.consumer_regs`).

    The 64 x 64 split kernel reads ``v`` through the chunk view where a call admits it
    (``v_chunk`` = :data:`TC_V_CHUNK`, :func:`v_chunk_call`; since session 28): the copy
    engine zero-fills V's landmark rows instead of the consumer (session 28 lab, B=1
    32/32/128 decode 9.1 -> 7.9 us, L2 not flushed), and takes ``lmk_const`` (a
    permission, :func:`lmk_const_acts`: at C = 64 the tile's one landmark column is its
    last; since session 40. Lab on an H100 at 9aefa69, four runs, L2 not flushed, against
    the kernel without it: B=1 32/32/128 8K 8.2-8.8 -> 8.0-8.2 us, 128K 8.2-8.6 -> 7.9-8.2
    us, and split where the launcher packs it instead, B=8 GQA 32/8 D128 32K 20.7-20.9 ->
    19.3-19.8 us: +3..+7% in every run; predicted +-0.2 us: the key loop's 514 -> 464
    instructions mattered more than its two or three tiles a program suggested)."""
    if not splits_at(Dqk, Dv):
        raise ValueError(f"no split-KV variant for Dqk={Dqk}, Dv={Dv} (launch.splits_at)")
    if mask_lmk and not expand_to_chunk:
        return (128, 64, 2, 256) + SPLIT_KNOBS_NOEXP
    return with_knobs((64, 64, 2, 128) + SPLIT_KNOBS, min_blocks=TC_MIN_BLOCKS, v_chunk=TC_V_CHUNK,
                      lmk_const=True)


def ctas_per_sm(config) -> int:
    """CTAs per SM a config's kernel is built for: its ``min_blocks`` knob, 1 without."""
    i = 4 + _KNOB["min_blocks"]
    return max(1, config[i]) if len(config) > i else 1


@functools.cache  # a constant per head-dim pair: asked on every plan (prefill_config)
def short_config(Dqk: int, Dv: int) -> tuple:
    """The prefill-grid config of head dims ``Dqk``/``Dv`` for calls of one query block
    (``Lq <= block_M``: decode and short chunks, packed or not, :func:`prefill_config`), and
    for every call at ``max(Dqk, Dv) > 128`` (from 65 to 128 longer calls add ``hoist_left``
    and ``hoist_keys``, :func:`shipped_config`): tile (:func:`tc_config`), knobs
    (:func:`tc_knobs`) and, at ``max(Dqk, Dv) <= 128``, ``min_blocks`` =
    :data:`TC_MIN_BLOCKS`, the chunk view of ``v`` (``v_chunk`` = :data:`TC_V_CHUNK`) and
    ``lmk_const`` (a permission, :func:`lmk_const_acts` per call; session 39 lab on an H100,
    four runs at fe9de2e and the control at ebd1760, L2 not flushed: D = 128 L = 8K / 16K
    +2.1..+4.4%, the D = 64 GQA rows +0.5..+8.9%, chunked prefill +0.5..+8.7%; never slower
    in any of the five pairs). Every call's config at ``max(Dqk, Dv) <= 64`` until session
    42, and up to 128 until session 45 (:func:`shipped_config` since, for calls of several
    query blocks)."""
    cfg = tc_config(Dqk, Dv) + tc_knobs(Dqk, Dv)
    return (with_knobs(cfg, min_blocks=TC_MIN_BLOCKS, v_chunk=TC_V_CHUNK, lmk_const=True)
            if max(Dqk, Dv) <= 128 else cfg)


@functools.cache
def shipped_config(Dqk: int, Dv: int) -> tuple:
    """The prefill-grid config of head dims ``Dqk``/``Dv`` for calls of several query blocks
    (``Lq > block_M``; rows not packed): :func:`short_config` with the ``hoist_left`` and
    ``hoist_keys`` permissions (:data:`TC_HOIST_LEFT`, since session 45; :data:`TC_HOIST_KEYS`,
    since session 46) at ``max(Dqk, Dv) <= 128``, and at
    ``max(Dqk, Dv) <= 64`` (:data:`TC_LONG`) the 64 x 64 tile with four CTAs per SM
    (``min_blocks`` 4) and the chunk view of ``v`` at one chunk per tile (``v_chunk`` 1);
    above 128, :func:`short_config` itself. What :func:`run_cuda` uses
    when none is given is :func:`prefill_config` (this or :func:`short_config` by ``Lq``,
    :func:`grid_config`)."""
    cfg = short_config(Dqk, Dv)
    if not full_knobs(cfg[4:])[_KNOB["mask_split"]]:  # above 128: no knobs, nothing to hoist
        return cfg
    hoists = dict(hoist_left=TC_HOIST_LEFT, hoist_keys=TC_HOIST_KEYS)
    if max(Dqk, Dv) > TC_LONG["max_d"]:
        return with_knobs(cfg, **hoists)
    return with_knobs(TC_LONG["tile"] + cfg[2:], min_blocks=TC_LONG["min_blocks"],
                      v_chunk=TC_LONG["v_chunk"], **hoists)


def packs(p, block_M: int) -> bool:
    """Whether a prefill-grid call on ``block_M``-row tiles packs the ``G = Hq / Hkv``
    query heads of each key/value head into one tile (the ``pack`` knob,
    ``kernels._fwd_tc_body``): ``G > 1``, ``G * Lq <= block_M`` (:func:`pack_fits`:
    decode and short chunks) and ``max(Dqk, Dv) <= 128`` (the tiles with knobs;
    never measured above). One program per (KV head, batch) reads each K/V tile
    once for its G heads, where the unpacked grid has G programs reading it each
    for ``Lq`` real rows of a 64-row tile (128-row tiles before session 12).

    Measured on the H200 (decode, W=512, C=64, L2 not flushed, lab9/lab10,
    bench_results/tilelang-lab10-4aae060.json): B=8 GQA 32/4 D=64 Lk=32K 18.8 ->
    10.2 us, B=8 GQA 32/8 D=128 32.6 -> 22.0 us, B=1 GQA 32/4 D=64 10.1 -> 9.8 us.
    Split-KV calls (:func:`split_plan`) do not pack: the packed split tile lost to
    the packed prefill grid (B=8 13.0 us, B=1 11.4 us at D=64). Longer query
    blocks do not pack either, although the kernel packs any ``Lq`` (blocks of
    ``block_M`` packed rows): lab11 at 2f11a45 (bench_results/tilelang-lab11-2f11a45.json)
    measured GQA prefill D=64 (32/4 and 16/2 at L=8K, 4 x 4K) packed at 97-102
    TFLOP/s against 124-132 for the same kernel unpacked (both without
    ``lmk_rows_j0``: the packed D=64 128-row kernel with G=8 and that knob fails
    ThreadSync) and 146-159 shipped.

    ``G``: :func:`pack_lowers`. The launcher's one-tile condition is a choice, not
    a limit of the kernel (it packs any ``Lq`` when a config asks)."""
    G = p.Hq // p.Hkv
    return (G > 1 and pack_fits(p, block_M) and max(p.Dqk, p.Dv) <= 128
            and pack_lowers(G, p.Dqk, p.Dv, p.mask_lmk, p.expand_to_chunk))


def pack_lowers(G: int, Dqk: int, Dv: int, mask_lmk: bool, expand_to_chunk: bool) -> bool:
    """Whether the packed kernel of group size ``G`` lowers for sm_90a on the shipped
    tile: powers of two and 3..8 (session 7 CPU sweep of 155 packed kernels at
    2f11a45 on the 128-row tiles of then, every flag pair, Dqk 32..128 and Dqk !=
    Dv, lmk_cols 0 / 1 / 2, bf16 / fp16, BHLD / BLHD, G 2..8, 16, 32, 64; none
    failed), except G = 2 with both flags off and ``Dqk != Dv`` on the 64 x 64 tile
    of ``max(Dqk, Dv) > 64``: TileLang 0.1.15's ThreadSync refuses it ("a required
    shared-memory sync inside a divergent region with 105 participating threads";
    session 12 CPU sweep of 138 packed kernels on the 64-row tiles, G 2, 3, 4, 6, 8,
    16, Dqk/Dv 32..128: it failed for (96, 64), (64, 96), (128, 64), (64, 128),
    (80, 64) and lowered for (96, 128), (128, 96), (112, 128), every other flag pair
    and every other G; found by the GPU conformance tier's ``gqa_pack`` cases at
    0e82bb5, pinned by tests/test_tilelang_compile.py). Those calls and other group
    sizes run unpacked."""
    if (G == 2 and not (mask_lmk or expand_to_chunk) and Dqk != Dv
            and tc_config(Dqk, Dv)[:2] == (64, 64)):
        return False
    return G & (G - 1) == 0 or G <= 8


def grid_config(Dqk: int, Dv: int, Lq: int) -> tuple:
    """The prefill-grid config of a call of ``Lq`` queries at head dims ``Dqk``/``Dv``, rows
    not packed: :func:`shipped_config` for several query blocks (``Lq > block_M``), else
    :func:`short_config` (decode, short chunks: the tile their numbers were measured on).
    Both tiles have 64 rows; from head dim 65 to 128 they differ in ``hoist_left`` and
    ``hoist_keys`` only, and above 128 they are one config."""
    short = short_config(Dqk, Dv)
    return shipped_config(Dqk, Dv) if Lq > short[0] else short


def prefill_config(p) -> tuple:
    """The prefill-grid config :func:`run_cuda` uses for a call when none is given:
    :func:`grid_config`, with the ``pack`` permission set where :func:`packs` (only calls of
    one query block fit; the kernel then bakes ``G``, :func:`call_knobs`)."""
    cfg = grid_config(p.Dqk, p.Dv, p.Lq)
    return with_knobs(cfg, pack=True) if packs(p, cfg[0]) else cfg


#: Knobs of :func:`kernels.fwd_tc` beyond the 4-tuple of :func:`tc_config`, in
#: the factory's positional order after ``split``, with the defaults that give
#: the kernel as first shipped (but for ``producer_warps``, whose default is the producer
#: guard of session 41). A config passed to :func:`run_cuda` may be
#: ``(block_M, block_N, num_stages, threads)`` or that tuple followed by these
#: values (all or a prefix), plus optionally ``ws`` as the item after *all* of
#: them (``False``: :func:`kernels.fwd_tc_nows`): see :func:`tc_kernel_args`.
#: Two items of a config are permissions, not baked values: ``lmk_cols`` is a
#: cap (the kernel gets :func:`lmk_cols_for` of the call, 0 when the cap is 0)
#: and ``scale_fold`` is baked only for calls whose scale allows it
#: (:func:`scale_fold_ok`); ``lmk_rows_j0`` (the last of :func:`tc_knobs`: cheaper
#: landmark-row zeroing, ``macros.zero_landmark_rows``; shipped at D <= 128)
#: is kept only where it acts (:func:`rows_j0_acts`: ``mask_lmk``,
#: ``lmk_zero="rows"`` and ``lmk_cols > 0``). ``pack`` (GQA-packed rows,
#: ``kernels._fwd_tc_body``; a permission: the kernel bakes the call's ``G =
#: Hq / Hkv``, nothing at ``G = 1``) is appended by :func:`prefill_config` where
#: :func:`packs` (any ``Lq``: the kernel tiles ``G * Lq`` packed rows in blocks of
#: ``block_M``; ``G <= block_M``). Appending it (session 6) moved the optional
#: ``ws`` item of a full config from position 13 to 14. Session 8 appended two lab
#: knobs, ``pdl`` (the combine as a programmatic dependent launch of the split
#: kernel) and ``narrow`` (16-row ``mma.sync`` decode tiles); session 9 removed
#: both after measuring them (``ws`` was back at 14): ``narrow`` ran 24-39 us
#: against 12 (bench_results/tilelang-lab13-c5b4012.json) and ``pdl`` gave nothing
#: with TileLang's default launcher (which launched the combine serially) nor
#: with its cython launcher (which launches it as a programmatic dependent):
#: 12.1 vs 12.0 us (B=1 32/32/128 8K), 12.0 vs 11.9 (128K), 9.3 vs 9.3 (B=1 GQA),
#: 9.4 vs 9.5 (B=8 GQA), L2 not flushed (tilelang-lab12-ab58094.json,
#: tilelang-lab14-92218e9.json).
#: ``min_blocks`` (session 12: CTAs per SM the launch bounds and the ``setmaxnreg``
#: split are made for, :data:`kernels.MIN_BLOCKS`; set by :func:`shipped_config` and
#: :func:`split_config`) follows ``pack`` and moved ``ws`` to position 15: a config
#: written with ``ws`` at 14 is refused (:func:`tc_kernel_args`), not misread.
#: ``wide`` (session 31: the landmark test for kernel-frame positions up to 2**29,
#: ``macros.is_landmark``) is a property of the call, not of a config: :func:`call_knobs`
#: sets it where :func:`wide_positions`; a config may only force it on (a lab timing it).
#: It follows ``v_chunk`` and puts the optional ``ws`` after itself (index 17 of a config):
#: a config written for the layout before it would have its ``ws`` read as ``wide``.
#: ``lmk_const`` (session 38, a permission; on in :func:`shipped_config` since session 39, in
#: :func:`split_config`'s 64 x 64 kernel since session 40): the
#: landmark columns as compile-time constants where :func:`lmk_const_acts` holds for the call
#: (``kernels.fwd_tc``); ``ws`` moves to index 18.
#: ``reg_slack`` (session 40, a lab knob, ``kernels.REG_SLACKS``): consumer registers left
#: below the exact fill of the CTA's pool; no shipped config sets it; ``ws`` moves to 19.
#: ``producer_warps`` (session 41, ``kernels.PRODUCER_WARPS``): 1, every kernel since then,
#: the producer warp group's warp 0 alone runs its key loop (``producer_guard``: the fix of a
#: hang); 4, a lab value, the four warps as TileLang generates them; ``ws`` moves to 20.
#: ``lazy_rescale`` (session 43, a lab knob, ``kernels.LAZY_RESCALES``): a row keeps its
#: softmax reference while its max moves at most ``tau`` (base 2), and warps whose rows all kept
#: theirs skip the output rescale; no shipped config sets it; ``ws`` moves to 21.
#: ``hoist_left`` (session 44, ``kernels.HOIST_LEFT``): ``mask_split``'s last-row left edge
#: computed once before the key loop instead of every tile; a permission (:func:`call_knobs`),
#: on in :func:`shipped_config` since session 45 (:data:`TC_HOIST_LEFT`); ``ws`` moves to 22.
#: ``hoist_keys`` (session 45, ``kernels.HOIST_KEYS``): the key/value head and the block's key
#: range held in registers from before the key loop, where the producer's loop recomputed their
#: integer divisions every tile; a permission (:func:`call_knobs`), on in :func:`shipped_config`
#: since session 46 (:data:`TC_HOIST_KEYS`); ``ws`` moves to 23.
#: ``vc_shift`` (session 47, a lab knob, ``kernels.VC_SHIFT``): the chunk view's tile
#: coordinates as ``k0 // block_N`` (a shift) where ``lmk_const`` acts at one chunk a tile (``C
#: == block_N``) instead of a runtime division by ``C``; a permission (:func:`call_knobs`); no
#: shipped config sets it: session 49's nine lab runs against ``shipped`` (one H100, 80bae8d)
#: moved no row beyond the runs' spread (``kernels.VC_SHIFT``); ``ws`` moves to 24.
#: ``pingpong`` (session 52, a lab knob, ``kernels.PINGPONG``): the two consumer warp groups of
#: a 128-row tile take turns at the tensor cores (FA3's ping-pong); no shipped config sets it;
#: :func:`call_knobs` drops it with ``mask_lmk`` where the call takes no chunk view of v and
#: with ``pack``, and drops ``hoist_keys`` where it stays (the kernel refuses the pair); ``ws``
#: moves to 25.
#: ``o_cols`` (session 55): not a config's but the call's (:func:`o_cols`, set by
#: :func:`call_knobs`): the columns of ``o`` where the adapter padded ``Dv``, which the
#: kernel writes itself (:func:`copied_out` says where it does not); ``ws`` moves to 26.
#: ``qk_cols`` / ``v_cols`` (session 56): the call's too (:func:`in_cols`, set by
#: :func:`call_knobs`): the columns of ``q`` and ``k`` / of ``v`` where the adapter rounded a
#: head dim up and passes the call's own inputs, which the kernel reads narrow; ``ws`` moves
#: to 28.
TC_KNOBS = (("lmk_zero", "tile"), ("mask_split", False), ("fold", False), ("lmk_cols", 0),
            ("fast_exp2", False), ("scale_fold", False), ("win_u32", False),
            ("lmk_rows_j0", False), ("pack", 0), ("min_blocks", 0), ("overlap", 0), ("v_chunk", False),
            ("wide", False), ("lmk_const", False), ("reg_slack", 0), ("producer_warps", 1),
            ("lazy_rescale", 0), ("hoist_left", 0), ("hoist_keys", 0), ("vc_shift", 0),
            ("pingpong", 0), ("o_cols", 0), ("qk_cols", 0), ("v_cols", 0))
_KNOB = {name: i for i, (name, _) in enumerate(TC_KNOBS)}  # knob name -> position
#: The ``overlap`` values (``kernels.OVERLAP``) of session 25's overlapped loop, which takes
#: neither the chunk view of v nor the hoists: :func:`call_knobs` drops those permissions
#: there, and the kernel refuses them; 0 and session 51's lean loop (3, 4) take them.
OVERLAP_OLD = (1, 2)

#: The int knobs of TC_KNOBS and the ``kernels`` tuple of the values each takes: the
#: kernels refuse others (``kernels._check_knobs``), and :func:`tc_kernel_args` refuses a
#: config whose ``ws`` (a bool) stands where one of them belongs.
INT_KNOBS = {"min_blocks": "MIN_BLOCKS", "reg_slack": "REG_SLACKS",
             "producer_warps": "PRODUCER_WARPS", "lazy_rescale": "LAZY_RESCALES",
             "hoist_left": "HOIST_LEFT", "hoist_keys": "HOIST_KEYS", "vc_shift": "VC_SHIFT",
             "pingpong": "PINGPONG"}


def with_knobs(config, **values) -> tuple:
    """``config`` (a tile 4-tuple and a prefix of :data:`TC_KNOBS`, without ``ws``)
    with every knob item present (defaults filled in) and the named ones set."""
    full = list(config[:4]) + full_knobs(config[4:])
    for name, value in values.items():
        full[4 + _KNOB[name]] = value
    return tuple(full)


def pack_fits(p, block_M: int) -> bool:
    """Whether a call's query heads of one KV head and their queries fit one tile of
    ``block_M`` rows (:func:`packs`' condition: the launcher packs only then)."""
    return (p.Hq // p.Hkv) * p.Lq <= block_M


def lmk_cols_for(cap: int, mask_lmk: bool, C: int, block_N: int) -> int:
    """``lmk_cols`` baked into the kernel of one call: ``K = ceil(block_N / C)``
    when ``mask_lmk`` and ``K <= cap``, else 0 (the general landmark test).

    ``C`` is the kernel-frame chunk (:func:`frame`, what the kernel
    receives, ``Lk + 1`` when the chunk outlasts every position). A tile's
    landmark columns are ``j0 + m * C`` with ``0 <= j0 < C``; ``K * C >=
    block_N`` puts every ``m >= K`` outside the tile, so testing ``m < K`` is the
    rule itself on every column (``macros.tile_landmark``). The rule is
    decided here, once per call; the kernel cache holds one kernel per ``K``.
    """
    if not mask_lmk or cap <= 0:
        return 0
    k = -(-block_N // C)
    return k if k <= cap else 0


def scale_fold_ok(scale_log2) -> bool:
    """Whether a call may run the kernel with ``scale_fold`` (the scale moved
    from the mask select into the exponent, ``macros.online_softmax_update``):
    ``scale_log2`` (``sm_scale * log2(e)``, what the kernel receives) must be a
    positive normal float32 (``reference.validation.positive_normal_f32``);
    other scales (and no call, ``None``) keep the scale in the mask select."""
    return positive_normal_f32(scale_log2)


def consumer_writes_v(mask_lmk: bool, v_chunk, ws: bool = True, lmk_zero: str = "tile") -> bool:
    """Whether the tensor-core kernel's consumers write the ``V`` tile in shared memory (its
    landmark rows zeroed there, ``kernels._fwd_tc_body``'s ``v_zero``): with ``mask_lmk`` and
    without the chunk view of v (``v_chunk``, whose copy writes those rows as zeros), in the
    warp-specialised kernel (``ws``) or with ``lmk_zero="rows"``. The kernel refuses
    ``pingpong`` there and :func:`call_knobs` drops it."""
    return bool(mask_lmk and (ws or lmk_zero == "rows") and not v_chunk)


def rows_j0_acts(mask_lmk: bool, lmk_zero: str, lmk_cols: int) -> bool:
    """Where ``lmk_rows_j0`` changes a kernel: V's landmark rows are zeroed
    (``macros.zero_landmark_rows``) only with ``mask_lmk`` and ``lmk_zero="rows"``,
    and the knob's rows need the landmark columns baked (``lmk_cols > 0``, the
    static ``K``-row form). Its serial-loop form for ``lmk_cols = 0`` failed
    TileLang 0.1.15's ThreadSync at Dv = 80, 96 and 112 ("shared-memory sync
    inside a divergent region"; C = 16, found by tools/gpu_tilelang.py on the
    H200 at 7e93d56, reproduced on CPU) and was never measured: removed."""
    return mask_lmk and lmk_zero == "rows" and lmk_cols > 0


def call_knobs(knobs: tuple, mask_lmk: bool, C: int, block_N: int,
               scale_log2: float | None = None, group: int = 1, view: bool = False,
               Dv: int = 0, wide: bool = False, o_cols: int = 0,
               in_cols: tuple = (0, 0)) -> tuple:
    """Knob values baked for one call from a config's knob items (a prefix of
    :data:`TC_KNOBS`): the ``lmk_cols`` cap becomes :func:`lmk_cols_for` of the
    call (0 without ``C``), ``scale_fold`` stays on only where
    :func:`scale_fold_ok` of the call's ``scale_log2`` (off without one),
    ``lmk_rows_j0`` only with ``mask_lmk``, ``lmk_zero="rows"`` and ``lmk_cols > 0``
    (:func:`rows_j0_acts`; one kernel, not two, where it would change nothing),
    ``pack`` (a permission) becomes the call's ``group`` (``Hq / Hkv``) where it is
    above 1, else 0 (one query head per key/value head: nothing to pack); trailing
    defaults are dropped (one cache key per kernel; the default kernel keeps the key
    it always had). ``v_chunk`` (a permission: the most chunks a tile may span, True = 1)
    becomes :func:`v_chunk_span` of the call (its value head dim ``Dv``; 0: no
    multi-chunk tile) where ``view`` (the call's :func:`v_chunk_call`), else 0. ``wide``
    is on where the call needs it (``wide``: :func:`wide_positions`) or the config asks for
    it (a lab timing its cost: the wide test is exact at every position a kernel gets).
    ``lmk_const`` (a permission) stays on only where :func:`lmk_const_acts` of the call.
    ``hoist_left`` (a permission) stays where the kernel takes it: with ``mask_split`` and
    neither ``overlap`` 1 or 2 nor ``pack`` baked (``kernels._check_knobs``); ``hoist_keys`` (a
    permission) where neither ``overlap`` 1 or 2 (the kernel refuses it) nor ``pack`` (never
    built or run with it) is baked; ``vc_shift`` (a permission) where :func:`vc_shift_acts`
    (``lmk_const`` on at one chunk a tile: there ``C == block_N``), the only place the kernel
    takes it, and neither ``overlap`` 1 or 2 nor ``pack`` is baked (never built or run with
    it). ``overlap`` 3 and 4 (session 51's lean loop, ``kernels._overlap_loop``) keep all
    three. ``pingpong`` (session 52, a lab knob) is dropped with ``mask_lmk`` where the call
    takes no chunk view of v (the consumers would write ``V_s``, and their sync of both warp
    groups would meet a group waiting for its turn) and with ``pack`` or ``overlap`` 1 or 2
    (never built or run there); where it stays, ``hoist_keys`` is dropped. ``o_cols`` is the
    call's (:func:`o_cols`: the columns of ``o`` where the adapter padded ``Dv``, else 0), not
    a config's, and so are ``qk_cols`` and ``v_cols``, ``in_cols`` (:func:`in_cols`)."""
    full = full_knobs(knobs)
    full[_KNOB["wide"]] = bool(full[_KNOB["wide"]]) or bool(wide)
    cols, fold, j0 = _KNOB["lmk_cols"], _KNOB["scale_fold"], _KNOB["lmk_rows_j0"]
    vc = _KNOB["v_chunk"]
    full[vc] = v_chunk_span(full[vc], C, block_N, Dv) if (view and mask_lmk) else 0
    pk = _KNOB["pack"]
    full[pk] = group if (full[pk] and group > 1) else 0
    full[cols] = lmk_cols_for(full[cols], mask_lmk, C, block_N) if C else 0
    full[fold] = bool(full[fold]) and scale_fold_ok(scale_log2)
    full[j0] = bool(full[j0]) and rows_j0_acts(mask_lmk, full[_KNOB["lmk_zero"]], full[cols])
    lc = _KNOB["lmk_const"]
    full[lc] = bool(full[lc]) and lmk_const_acts(full[vc], full[cols], C, block_N)
    # the hoists: the values themselves where they may act (the kernel checks them); neither
    # was built or run with session 25's overlap (1, 2) or pack, and hoist_left acts in
    # mask_split's tile test
    unrun = full[_KNOB["overlap"]] in OVERLAP_OLD or full[pk]
    # pingpong first (the kernel refuses it where the consumers write V_s, and with pack, which
    # it was never built or run with); then hoist_keys, which the kernel refuses beside it
    pp = _KNOB["pingpong"]
    if unrun or consumer_writes_v(mask_lmk, full[vc], True, full[_KNOB["lmk_zero"]]):
        full[pp] = 0
    if unrun or not full[_KNOB["mask_split"]]:
        full[_KNOB["hoist_left"]] = 0
    if unrun or full[pp]:
        full[_KNOB["hoist_keys"]] = 0
    if unrun or not vc_shift_acts(full[vc], full[lc], full[cols]):
        full[_KNOB["vc_shift"]] = 0
    full[_KNOB["o_cols"]] = o_cols
    full[_KNOB["qk_cols"]], full[_KNOB["v_cols"]] = in_cols
    return trimmed_knobs(full)


def full_knobs(knobs) -> list:
    """Knob values (a prefix of :data:`TC_KNOBS`' order) with the left-out ones at their
    defaults."""
    return list(knobs) + [d for _, d in TC_KNOBS[len(knobs):]]


def trimmed_knobs(knobs) -> tuple:
    """Knob values with trailing defaults left out: one cache key per kernel (a kernel's key
    keeps the form it had before the knobs after its last set one existed)."""
    full = list(knobs)
    while full and full[-1] == TC_KNOBS[len(full) - 1][1]:
        full.pop()
    return tuple(full)


def vc_shift_acts(span: int, lmk_const: bool, lmk_cols: int) -> bool:
    """Whether a kernel may take ``vc_shift`` (``kernels.VC_SHIFT``: the chunk view's tile
    coordinates as ``0`` and ``k0 // block_N``): the view at one chunk a tile (``span`` 1) with
    ``lmk_const`` baked at one landmark column, which :func:`lmk_const_acts` allows only where
    ``C == block_N`` and every tile starts a chunk. The kernel refuses the knob elsewhere, and
    :func:`call_knobs` drops the permission there."""
    return span == 1 and lmk_const is True and lmk_cols == 1


def lmk_const_acts(span: int, lmk_cols: int, C: int, block_N: int) -> bool:
    """Whether a call may run ``kernels.fwd_tc`` with ``lmk_const`` (its tile's landmark
    columns as constants, ``macros.constant_landmark_columns``): the chunk view of ``v``
    baked (``span``, :func:`v_chunk_span`, non-zero only for calls :func:`v_chunk_call`
    admits: ``r = 0``, ``expand_to_chunk``, so every query block's key range starts a chunk
    and every tile, ``block_N`` keys on from it, too) and the landmark columns baked
    (``lmk_cols = K > 0``) with ``K * C == block_N`` (``C`` the kernel-frame chunk), so
    that the tile's landmarks are its columns ``C - 1, 2 C - 1, ..., block_N - 1``: ``C ==
    block_N`` (``span`` 1), ``block_N / 2`` or ``block_N / 4`` (``span`` 2 or 4). A chunk
    longer than the tile (``C = 2 block_N``, ...) puts a landmark in some tiles only."""
    return bool(span) and lmk_cols > 0 and C > 0 and lmk_cols * C == block_N


def v_chunk_span(cap: int, C: int, block_N: int, Dv: int) -> int:
    """The ``v_chunk`` value baked for a call whose kernel-frame chunk is ``C`` under the
    permission ``cap`` (the most chunks one key tile may span; 0 / False: no view):

    - True (the value 1; a bool, as the knob was in session 25, so those kernels keep
      their cache keys and ``describe`` text) when ``C`` is a multiple of ``block_N``:
      every tile inside one chunk;
    - ``n = block_N / C`` when that is one of :data:`V_CHUNK_SPANS`, at most ``cap``, and
      ``Dv`` is one of :data:`V_CHUNK_SPAN_DV`: every tile ``n`` whole chunks, one bulk
      copy each;
    - else 0: the consumer zeroes V's landmark rows."""
    if not cap or C <= 0:
        return 0
    if C % block_N == 0:
        return True
    n = block_N // C
    ok = block_N % C == 0 and n in V_CHUNK_SPANS and n <= int(cap) and Dv in V_CHUNK_SPAN_DV
    return n if ok else 0


def tc_kernel_args(config, mask_lmk: bool = False, C: int = 0,
                   scale_log2: float | None = None, group: int = 1,
                   view: bool = False, Dv: int = 0, wide: bool = False,
                   o_cols: int = 0, in_cols: tuple = (0, 0)) -> tuple[str, tuple, tuple]:
    """``(factory name, (block_M, block_N, num_stages, threads), knob values)``
    of a config tuple (4 items, 4 + up to len(TC_KNOBS), or 4 + len(TC_KNOBS) + ws)
    for a call with ``mask_lmk``, kernel-frame chunk ``C`` and ``scale_log2``
    (:func:`call_knobs`: the ``lmk_cols`` item becomes :func:`lmk_cols_for` of
    the call, 0 without ``C``; ``scale_fold`` needs :func:`scale_fold_ok`, off
    without a scale). Trailing knobs at their defaults are left out, so the
    default kernel keeps the cache key ``("fwd_tc", ..., split)`` it always had (the kernel
    behind it changed with session 41's producer guard, ``producer_guard``; TileLang's disk
    cache tells them apart by the prim_func's name and attributes)."""
    base, extra = tuple(config[:4]), tuple(config[4:])
    kind = "fwd_tc"
    # a config written before one of these int knobs ends in ws, a bool, where it stands
    for name, values in (*((n, f"kernels.{v}") for n, v in INT_KNOBS.items()),
                         ("o_cols", "the call's, launch.o_cols"),
                         ("qk_cols", "the call's, launch.in_cols"),
                         ("v_cols", "the call's, launch.in_cols")):
        at = _KNOB[name]
        if len(extra) > at and isinstance(extra[at], bool):
            raise ValueError(f"config {config!r}: item {4 + at} is {name} (an int: "
                             f"{values}); ws, if given, comes after it")
    if len(extra) > len(TC_KNOBS):
        if len(extra) != len(TC_KNOBS) + 1:
            raise ValueError(f"config {config!r}: too many items")
        kind = "fwd_tc" if extra[-1] else "fwd_tc_nows"
        extra = extra[:-1]
    return kind, base, call_knobs(extra, mask_lmk, C, base[1], scale_log2, group, view, Dv, wide,
                                  o_cols, in_cols)


def tc_kernel_key(Dqk: int, Dv: int, dtype: str, mask_lmk: bool, expand_to_chunk: bool,
                  q_blhd: bool, kv_blhd: bool, config, C: int = 0, scale_log2: float | None = None,
                  split: bool = False, group: int = 1, view: bool = False,
                  wide: bool = False, o_cols: int = 0,
                  in_cols: tuple = (0, 0)) -> tuple[str, tuple]:
    """``(factory name, factory arguments)`` of the tensor-core kernel a call with
    this config, kernel-frame chunk ``C``, ``scale_log2``, ``wide``
    (:func:`wide_positions`), ``o_cols`` (:func:`o_cols`; the split kernel's partials keep
    ``Dv`` columns, :func:`combine_key` takes it there) and ``in_cols`` (:func:`in_cols`) runs:
    the kernel cache key of :func:`run_cuda` (and what the GPU tools precompile)."""
    kind, base, knobs = tc_kernel_args(config, mask_lmk, C, scale_log2, group, view, Dv, wide,
                                       0 if split else o_cols, in_cols)
    return kind, (Dqk, Dv, dtype, mask_lmk, expand_to_chunk, q_blhd, kv_blhd) + base + (split,) + knobs


#: Where the knobs start in :func:`tc_kernel_key`'s factory arguments.
_KNOBS_AT = 12
#: Where the ``v_chunk`` knob is in them (absent when it and the knobs after it are off).
_V_CHUNK_AT = _KNOBS_AT + _KNOB["v_chunk"]


def v_chunk_call(p) -> bool:
    """Whether a call admits the chunk view of ``v`` (:func:`v_chunk_view`, knob ``v_chunk``
    of ``kernels.fwd_tc``, which also needs ``C`` a multiple of the tile's ``block_N``,
    :func:`call_knobs`): ``mask_lmk`` and ``expand_to_chunk`` (every query block's first
    key then starts a chunk), the kernel frame's ``r = 0`` (``kv_start`` a multiple of
    ``chunk_size``, so key 0 starts a chunk too) and ``Lk`` a whole number of chunks
    (at least one), so that every tile a block loads lies inside one chunk of the view
    or past ``Lk``, where the copy engine fills zeros as the plain tile's copy does."""
    c = p.chunk_size  # Lk a multiple of c puts c <= Lk: the kernel frame is (kv_start % c, c)
    return (p.mask_lmk and p.expand_to_chunk and p.Lk > 0 and c >= 2 and p.Lk % c == 0
            and p.kv_start % c == 0)


def v_chunk_view(v, C: int, kv_blhd: bool = False):
    """``v`` as :func:`run_cuda` receives it (storage order: ``(B, Hkv, Lk, Dv)``, or ``(B,
    Lk, Hkv, Dv)`` with ``kv_blhd``; a unit last stride) as the chunk view ``(B, Hkv, Lk //
    C, C - 1, Dv)`` that ``kernels.fwd_tc`` reads with ``v_chunk`` in either layout:
    element ``[b, h, c, t, d]`` is key ``c * C + t`` of head ``h``. Each chunk's last row,
    its landmark, is left out (the bulk copy writes zeros for it). A view of the same
    storage: nothing is copied. ``v``'s own strides, except on a dimension of size 1, which
    may carry any stride (contiguity ignores it) and would reach the copy engine (it needs
    multiples of 16 bytes): there the stride a contiguous tensor would have over the next
    inner dimension."""
    if kv_blhd:
        B, L, H, D = v.shape
        sb, sl, sh, sd = v.stride()
        sh = sh if H > 1 else sd * D
        sb = sb if B > 1 else sl * L
    else:
        B, H, L, D = v.shape
        sb, sh, sl, sd = v.stride()
        sh = sh if H > 1 else sl * L
        sb = sb if B > 1 else sh * H
    return v.as_strided((B, H, L // C, C - 1, D), (sb, sh, C * sl, sl, sd), v.storage_offset())


#: ``kernels.combine``'s threads (its default), written out in its arguments before ``o_cols``.
COMBINE_THREADS = 128


def combine_key(tc_args: tuple, o_cols: int = 0) -> tuple[str, tuple]:
    """``(factory name, factory arguments)`` of the combine for the split kernel
    whose factory arguments (:func:`tc_kernel_key`) are ``tc_args``:
    ``("combine", (Dv, dtype))``, and :data:`COMBINE_THREADS` and ``o_cols`` after them
    where :func:`o_cols` of the call is not 0."""
    extra = (COMBINE_THREADS, o_cols) if o_cols else ()
    return "combine", (tc_args[1], tc_args[2]) + extra


_cache: dict[tuple, object] = {}


def _kernel(kind: str, *args, **named):
    """The kernel ``kernels.<kind>(*args, **named)``, built once (cached under its arguments;
    ``named``: the CPU kernel's knobs it takes by name, :func:`cpu_kernel_args`)."""
    key = args + tuple(sorted(named.items()))
    ker = _cache.get((kind,) + key)
    if ker is None:
        from . import kernels  # TileLang import deferred to the first launch
        if kind.startswith("fwd") and (args[0] % D_STEP or args[1] % D_STEP):
            raise RuntimeError(f"tilelang: {kind} built for head dims {args[:2]}: the kernels take "
                               f"multiples of {D_STEP} (api._kernel_call pads the others)")
        if kind == "fwd_tc":  # warp-specialised: built with the producer guard, or refused
            producer_guard.ensure()
        ker = _keep(kind, key, getattr(kernels, kind)(*args, **named))
    return ker


def _keep(kind: str, args: tuple, ker):
    """Cache the built kernel ``ker`` of ``kind(*args)`` for :func:`_kernel`, a ``fwd_tc``
    kernel only if it carries the producer guard (``producer_guard.check``): :func:`_kernel`'s
    builds and those compiled ahead in parallel (``tools/gpu_tilelang.py``)."""
    if kind == "fwd_tc":
        producer_guard.check(ker, f"fwd_tc{args}")
    _cache[(kind,) + args] = ker
    return ker


#: The launch callable of each compiled GPU kernel (:func:`_call`), keyed by the kernel;
#: cleared when full (stand-ins for :func:`_kernel` in tools and tests add one per call).
_calls: dict = {}
_CALLS_MAX = 1024
#: False: every GPU launch through the compiled kernel's own ``__call__`` (the lab's
#: switch, tools/lab_host.py; ``HILS_SWA_TILELANG_FAST_CALL=0`` in the environment).
FAST_CALL = os.environ.get("HILS_SWA_TILELANG_FAST_CALL", "1") != "0"
#: The TileLang release whose tvm-ffi adapter :func:`_executable` was written against.
FAST_CALL_TILELANG = "0.1.15"


def _executable(ker):
    """The compiled executable behind ``ker`` when calling it directly is what
    ``ker(*args)`` does, else None.

    TileLang 0.1.15's ``JITKernel.__call__`` goes to its tvm-ffi adapter's ``func``,
    which, for a kernel that allocates no output (``result_idx`` empty: ours write
    into the tensors they are given), places the arguments in parameter order, asks
    for the device of the first tensor (used only on NPUs) and calls the executable
    with them: a Python frame and two loops over the parameters per launch. The
    executable itself (the generated host code) checks every argument's dtype,
    shape, strides and device as before. Only that release (a local build suffix
    ``+...`` allowed; ``.post`` / ``.dev`` builds are not) and that adapter class, with
    no callee-allocated outputs and ``ker``'s call still the adapter's ``func``, are
    accepted; anything else keeps ``ker``.
    """
    adapter = getattr(ker, "adapter", None)
    if adapter is None:  # not a TileLang kernel (a stand-in): nothing to import
        return None
    try:
        import tilelang
        from tilelang.jit.adapter.tvm_ffi import TVMFFIKernelAdapter
        if (tilelang.__version__.split("+")[0] != FAST_CALL_TILELANG
                or type(adapter) is not TVMFFIKernelAdapter or adapter.result_idx
                or getattr(adapter, "_ffi_callee_allocated_output_abi", False)
                or getattr(ker, "torch_function", None) is not adapter.func):  # the call _executable replaces
            return None
        return adapter._get_executable()
    except Exception:  # another TileLang, another adapter: the kernel's own call
        return None


def _call(kind: str, *args):
    """What launches the GPU kernel :func:`_kernel` ``(kind, *args)`` returns: its
    executable (:func:`_executable`) where :data:`FAST_CALL` allows, else the kernel.
    Keyed by the kernel object, so a stand-in for :func:`_kernel` (the tools that
    record which kernels a call asks for) is asked on every call."""
    ker = _kernel(kind, *args)
    if not FAST_CALL:
        return ker
    fn = _calls.get(ker)
    if fn is None:
        if len(_calls) >= _CALLS_MAX:
            _calls.clear()
        fn = _calls[ker] = _executable(ker) or ker
    return fn


#: Head dims (multiples of :data:`D_STEP`) served by a wider tensor-core kernel that reads
#: the call's inputs narrow (:func:`kernel_dims`, :func:`reads_narrow`; the knobs
#: ``qk_cols`` / ``v_cols``): ``{112: 128}`` runs a bf16 / fp16 call at D = 112 on the
#: D = 128 kernel. Why: TileLang copies a tile of ``D`` columns in boxes of 64 columns
#: (128-byte swizzle) where 64 divides ``D``, else of 32, else of 16 (the generated CUDA,
#: session 57), and narrow boxes cost the copy engine more requests (rows off a 32-byte
#: sector took the D = 128 kernel 2.8x the L2 requests and 22% more time). Each entry maps a
#: multiple of 16 to a larger multiple of 64 up to :data:`MAX_D` (a test holds the table to
#: that). The entries are ``tools/lab_head_dims.py``'s measurement (session 58, an H100,
#: bf16 32/32 prefill at L = 8K, W = 512, C = 64, kernel only; BENCHMARKS.md), by a rule
#: fixed before the run: widen where the prefill's wider median is at most 0.97x its own
#: kernel's and each of two decodes' at most 1.03x. D = 112: 296.8 -> 200.4 us; D = 48:
#: 134.8 -> 115.2 us, decodes 7% faster. Not listed: 80 (prefill 0.89x, but a B = 1 decode
#: 1.05x), 96 (prefill 1.11x), 208 (1.09-1.11x everywhere).
TC_WIDER: dict[int, int] = {48: 64, 112: 128}

#: dtypes of the tensor-core kernels, which read a call's inputs through tensor maps.
NARROW_DTYPES = (torch.bfloat16, torch.float16)


def reads_narrow(p) -> bool:
    """Whether the kernels may read a call's own ``q``, ``k`` and ``v`` at widths below
    theirs (``api._kernel_call``; :func:`in_cols`): the tensor-core kernels (bf16 / fp16 on
    a CUDA device, or ``meta`` tensors planned as one, ``tools/tl_lower.py``) and rows of
    both head dims that a tensor map takes (:func:`tma_rows`). The fp32 and CPU kernels read
    zero-padded copies."""
    if p.dtype not in NARROW_DTYPES or device_type(p.device) == "cpu":
        return False
    n = p.dtype.itemsize
    return tma_rows(p.Dqk, n) and tma_rows(p.Dv, n)


def kernel_dims(p) -> tuple[int, int]:
    """``(Dqk, Dv)`` of the kernels that serve ``p``: each head dim rounded up to a multiple
    of :data:`D_STEP` (itself where it is one), and where :func:`reads_narrow`, widened as
    :data:`TC_WIDER` says (tested only where it lists one: every call plans through here)."""
    dims = (-(-p.Dqk // D_STEP) * D_STEP, -(-p.Dv // D_STEP) * D_STEP)
    if (dims[0] in TC_WIDER or dims[1] in TC_WIDER) and reads_narrow(p):
        return TC_WIDER.get(dims[0], dims[0]), TC_WIDER.get(dims[1], dims[1])
    return dims


#: Integer words for the adapter's copies (``api._padded``) and the copy-out of ``o``
#: (:func:`copy_columns`), widest first: PyTorch's strided copy moves one element a thread
#: step, so rows moved as 8-byte words take a quarter of the steps of 2-byte elements
#: (session 54, an H100: 84.6 -> 59.6 us a copy of 63 MB, BENCHMARKS.md).
WORDS = ((8, torch.int64), (4, torch.int32), (2, torch.int16))


def words(x):
    """``x`` viewed as the widest integer word that tiles its rows, strides and address (the
    same bytes: a copy or a zero fill of them makes the same bits), or ``x`` itself where no
    word wider than its element fits (last dim not stride 1, a row of 66 bytes, a view that
    starts off the word, or on it in a storage that does not: ``torch.frombuffer`` at an
    offset)."""
    es = x.element_size()
    if x.stride(-1) == 1:
        for w, dt in WORDS:  # the address for the loads, the storage offset for .view
            if w > es and x.data_ptr() % w == 0 and all(
                    n * es % w == 0 for n in (*x.stride()[:-1], x.shape[-1], x.storage_offset())):
                return x.view(dt)
    return x


def copy_columns(o, full) -> None:
    """``o`` (contiguous) := the first ``o.shape[-1]`` columns of ``full``, moved as integer
    words (:func:`words`) where both views take the same word."""
    cut = full[..., :o.shape[-1]]
    a, b = words(o), words(cut)
    if a.dtype == b.dtype:
        a.copy_(b)
    else:
        o.copy_(cut)


#: The copy engine's tensor maps need every global stride a multiple of this many bytes: the
#: unpacked prefill tile writes a narrow ``o`` itself (``o_cols``) only where its rows are,
#: else the kernel writes a padded ``o`` and :func:`run_cuda` copies its columns out
#: (:func:`copied_out`). A predicated SIMT store of 180-byte rows made the kernel 72 us slower
#: than a full-width one at L = 8K, 32 heads, where the copy-out it replaced took 47 us
#: (session 55, an H100, BENCHMARKS.md). Packed rows (decode, short chunks) are written by an
#: element loop in any case and keep ``o_cols`` (not measured against a copy-out).
TMA_STRIDE = 16


def tma_rows(cols: int, itemsize: int) -> bool:
    """Whether rows of ``cols`` elements of ``itemsize`` bytes, stored one after another, take a
    tensor map (:data:`TMA_STRIDE`): the test of a narrow ``o`` (:func:`_tc_choice`) and of
    narrow inputs (:func:`in_cols`, :func:`reads_narrow`)."""
    return cols * itemsize % TMA_STRIDE == 0


def copied_out(S: int, args: tuple, ocols: int) -> bool:
    """Whether :func:`run_cuda` runs the plan ``(S, kind, args)`` of a call with :func:`o_cols`
    ``ocols`` into a padded ``o`` and copies its columns out (:func:`copy_columns`): a narrow
    ``o`` (``ocols``) on the prefill grid (``S == 1``) whose kernel does not write it
    (:func:`_tc_choice` left ``o_cols`` out: rows no tensor map takes, :data:`TMA_STRIDE`)."""
    return bool(ocols) and S == 1 and not tc_knob(args, "o_cols")


def tc_knob(args: tuple, name: str):
    """The value of knob ``name`` in ``fwd_tc`` factory arguments ``args`` (its default where
    the trimmed arguments leave it out)."""
    at = _KNOBS_AT + _KNOB[name]
    return args[at] if len(args) > at else TC_KNOBS[_KNOB[name]][1]


def o_cols(p, o) -> int:
    """The ``o_cols`` knob of a call's kernels (``kernels.fwd_tc``): ``o``'s columns where they
    are fewer than the kernels' ``p.Dv`` (the adapter padded ``Dv``, and the kernels write the
    call's ``o`` themselves), else 0. A wider ``o`` is a caller's error."""
    n = o.shape[-1]
    if n > p.Dv:
        raise ValueError(f"o has {n} columns, more than the kernels' Dv={p.Dv}")
    return n if n != p.Dv else 0


def in_cols(p, q, v) -> tuple[int, int]:
    """``(qk_cols, v_cols)``, knobs of a call's tensor-core kernels (``kernels.fwd_tc``): the
    columns of ``q`` (``k`` has as many: ``reference.validation``) and of ``v`` where they are
    fewer than the kernels' ``p.Dqk`` / ``p.Dv`` (the adapter rounded a head dim up and passes
    the call's own inputs, ``tilelang_impl.api``), else 0. The kernels read such an input through
    a tensor map, which needs its rows a multiple of :data:`TMA_STRIDE` bytes: other widths,
    and wider inputs, are a caller's error."""
    if q.shape[-1] == p.Dqk and v.shape[-1] == p.Dv:  # every call but a narrow one: fast
        return 0, 0
    cols = []
    for name, x, D in (("q", q, p.Dqk), ("v", v, p.Dv)):
        n = x.shape[-1]
        if n > D or (n < D and not tma_rows(n, x.element_size())):
            raise ValueError(f"{name} has {n} columns: the kernels read {D} (or fewer, in rows "
                             f"of a multiple of {TMA_STRIDE} bytes)")
        cols.append(n if n != D else 0)
    return tuple(cols)


def check_limits(p) -> None:
    """Raise :class:`UnsupportedConfig` for valid inputs this backend cannot serve."""
    for name, d in (("Dqk", p.Dqk), ("Dv", p.Dv)):
        if not MIN_D <= d <= MAX_D:
            raise UnsupportedConfig(
                f"tilelang: head dim {name}={d} is not supported ({MIN_D}..{MAX_D})")
    check_f32_score_scale(p.sm_scale, "tilelang")
    if p.Hq > GRID_YZ_MAX and device_type(p.device) != "cpu":
        raise UnsupportedConfig(f"tilelang: Hq={p.Hq} query heads are not supported on the GPU (at "
                                f"most {GRID_YZ_MAX}: a launch grid's y extent holds one batch's heads)")
    C = frame(p)[2]
    if p.Lk + C >= MAX_POSITIONS_WIDE:  # then C = min(chunk_size, Lk + 1)
        raise UnsupportedConfig(
            f"tilelang: Lk + min(chunk_size, Lk + 1) = {p.Lk + C} is not supported (< 2**29: "
            f"the kernels' positions are int32 and their landmark test divides in float32; "
            f"Lk={p.Lk}, chunk_size={p.chunk_size})")
    if device_type(p.device) == "cuda" and p.dtype != torch.float32:
        if capability(p.device)[0] != 9:
            raise UnsupportedConfig(
                "tilelang: the bf16/fp16 kernels are built for Hopper (sm_90a); "
                f"device {torch.cuda.get_device_name(p.device)!r} is not supported")


def wide_positions(p, C: int) -> bool:
    """Whether a call whose kernel-frame chunk is ``C`` (:func:`frame`) runs the kernels
    built ``wide`` (``kernels.fwd_tc``'s knob: two float quotients in the landmark test,
    ``macros.is_landmark``): its positions reach :data:`MAX_POSITIONS` (``Lk + C >=
    2**22``, e.g. a cache of 4M keys). Every other call runs the kernels it always ran."""
    return p.Lk + C >= MAX_POSITIONS


def frame(p) -> tuple[int, int, int]:
    """``(r, W, C)`` the kernels get: ``p.kernel_frame()`` (same visibility, small values:
    ``r`` is the relative frame of macros.py, ``W`` is clamped to ``Lk + C``, and ``C`` is
    ``chunk_size``, or ``Lk + 1`` where the chunk outlasts every key), or where its
    positions would reach :data:`MAX_POSITIONS` (a chunk longer than the cache whose
    boundary falls inside it: ``C <= r + Lk``), ``p.kernel_frame(True)``: that boundary at
    the same key index in a chunk of ``Lk + 1``. So the kernel frame's chunk is larger than
    ``Lk + 1`` only where the single-quotient landmark test serves it, and :func:`check_limits`
    refuses only ``Lk + min(chunk_size, Lk + 1) >= 2**29``; from ``2**22`` the kernels are
    built ``wide`` (:func:`wide_positions`)."""
    f = p.kernel_frame()
    return f if p.Lk + f[2] < MAX_POSITIONS else p.kernel_frame(True)


def scalars(p) -> tuple[int, int, int, float, float]:
    """Per-call scalar kernel arguments ``(W, C, r, inv_c, scale_log2)`` from
    :func:`frame`."""
    r, W, C = frame(p)
    return W, C, r, 1.0 / C, p.sm_scale * LOG2E


def split_plan(p) -> tuple[int, tuple | None]:
    """``(S, config)``: the number of KV splits ``run_cuda`` uses for a call (1 =
    the prefill grid) and the split variant's config (:func:`split_config`;
    ``None`` where :func:`splits_at` is false), chosen by grid saturation.

    The split tile's grid has ``cdiv(Lq, block_M) * B * Hq`` programs. When
    that occupies at least half the SMs, splitting only adds a combine pass
    (the threshold of the Triton backend's ``triton_impl.launch.choose_path``,
    which counts 64-row GQA-packed tiles instead of programs); below it, each
    query block's key range is cut into ``S`` pieces so that one wave of
    programs runs (:func:`splits_by_saturation`). Measured on the H200 (bf16,
    chunked prefill Lq=512 of 8K, 32/32/128: 128 programs of session 5's
    128-row split tile on 132 SMs): split-KV 72.0 us (L2 flushed, bench at
    d0de4f1, when the threshold was a full wave) against about 20 us on the
    prefill grid (lab, no flush). And by the key range: the 64 x 64 split kernel
    only where a query block reaches :data:`SPLIT_MIN_TILES` key tiles (a short
    window or cache takes the prefill grid however small the grid is).
    """
    if not splits_at(p.Dqk, p.Dv):
        return 1, None
    cfg = split_config(p.Dqk, p.Dv, p.mask_lmk, p.expand_to_chunk)
    if cfg[:2] == (64, 64) and key_tiles(p, *cfg[:2]) < SPLIT_MIN_TILES:
        return 1, cfg  # a short key range: the prefill grid's loop is shorter than a split's start
    return splits_by_saturation(p, cfg[0], cfg[1], sm_count(p.device), ctas_per_sm(cfg)), cfg


#: The 64 x 64 split kernel runs only where a query block reaches at least this many
#: 64-key tiles (:func:`key_tiles`); below, the prefill grid serves the call however
#: small it is. Session 14 lab 3 (bench_results/tilelang-declab3-cd950ec.json, H200,
#: bf16, C = 64, W = 64..640, L2 not flushed; grid = the prefill grid forced): the
#: prefill grid costs about 3.3 us + 1.0 us per key tile of its one program, the split
#: kernel about 6.4 us + 1.5 us per tile of a split (its landmark rows are zeroed the
#: general way: ``lmk_rows_j0`` fails ThreadSync in split variants) plus 2.3 us of
#: combine. B=1 32/32/128: 3 tiles (W=64) 10.1 -> 6.6 us, 5 tiles 11.3 -> 8.5, 7 tiles
#: 12.1 -> 10.5, at 8 tiles both 11.5, 10 tiles (W=512) split 11.7 against 13.5;
#: B=1 8/8/128 and B=2 16/16/96 cross at 8 and 9 tiles (the L2-flushed timer: 9 / 8 /
#: 10).
SPLIT_MIN_TILES = 8


def forced_splits(p) -> int:
    """The split count of a call when split-KV is forced (``tilelang_impl.split_kv``, the
    conformance suite's ``tilelang-split``): :func:`split_plan`'s one wave of programs,
    whatever the grid size and the key range, at least 2 (a split without a key tile
    leaves an empty partial, which the combine must weigh 0). Only where
    :func:`splits_at`."""
    cfg = split_config(p.Dqk, p.Dv, p.mask_lmk, p.expand_to_chunk)
    programs = max(1, grid_programs(p, cfg[0]))
    return max(2, _one_wave(p, cfg[0], cfg[1], programs, sm_count(p.device), ctas_per_sm(cfg)))


def forced_plan(p) -> int | None:
    """:func:`forced_splits` of a call that has a split variant (bf16/fp16,
    :func:`splits_at`), else None: what ``tilelang_impl.split_kv`` runs on CUDA and what
    ``tools/tl_lower.py`` lowers for it (the device is the caller's to check)."""
    if p.dtype not in (torch.bfloat16, torch.float16) or not splits_at(p.Dqk, p.Dv):
        return None
    return forced_splits(p)


def splits_at(Dqk: int, Dv: int) -> bool:
    """Whether calls of these head dims may take the split-KV variant."""
    return Dv in SPLIT_DV and max(Dqk, Dv) <= 128


def splits_by_saturation(p, block_M: int, block_N: int, sms: int, ctas: int = 1) -> int:
    """:func:`split_plan`'s arithmetic for a split tile ``block_M x block_N`` built
    for ``ctas`` CTAs per SM, without its head-dim gate (the lab times split variants
    the launcher does not pick).

    Whether to split: only when the unsplit grid occupies less than half the SMs.
    One wave: ``S = ctas * sms // programs`` (never more than the reachable key
    tiles, nor 64; ``ctas = 2`` since session 12, :func:`split_config`). Measured on the H200 (session 6 decode lab, B=1 32/32/128, 32
    programs, L2 not flushed, bench_results/tilelang-lab7-4e2da01.json): S = 2 /
    4 / 6 / 9 took 17.3 / 13.0 / 20.9 / 23.3 us with the 128 x 64 split tile
    (11.9-16.3 us with the 64 x 64 one at S = 4 / 2): past one program per SM
    a split kernel pays a second wave of whole programs (fixed start and
    epilogue) for one or two key tiles each; session 5's rule (about two
    programs per SM, S = 9 here) was the slowest."""
    programs = grid_programs(p, block_M)
    if programs == 0 or 2 * programs >= sms:
        return 1
    return _one_wave(p, block_M, block_N, programs, sms, ctas)


def _one_wave(p, block_M: int, block_N: int, programs: int, sms: int, ctas: int) -> int:
    """Splits that fill one wave of ``ctas`` CTAs per SM with ``programs`` (> 0) query
    blocks of ``block_M`` rows, at most the key tiles a block reaches and 64 (the
    combine's bound)."""
    return min(key_tiles(p, block_M, block_N), ctas * sms // programs, 64)


def grid_programs(p, block_M: int) -> int:
    """Programs of a grid of ``block_M``-row query blocks: ``cdiv(Lq, block_M) * B * Hq``."""
    return -(-p.Lq // block_M) * p.B * p.Hq


def key_tiles(p, rows: int, block_N: int) -> int:
    """``block_N``-key tiles a block of ``rows`` consecutive queries can reach at most
    (window, chunk expansion and the block's own span; at least 1)."""
    reach = min(p.Lk, p.window_size + p.chunk_size + rows)
    return max(1, -(-reach // block_N))


#: Launch plans of bf16/fp16 CUDA calls without an explicit config (:func:`_plan`).
_PLANS: dict = {}
PLANS_MAX = 1024  # cleared when it holds this many (distinct static shapes)
#: A bound on the rows of the split tiles whose key tiles a plan counts (:func:`key_tiles`
#: of :func:`split_config`'s tiles: 64 or 128 rows), with room to spare.
PLAN_ROWS_MAX = 256
#: The key-tile width :func:`_lk_key` counts ``Lk`` in: every split tile's ``block_N`` is a
#: multiple of it (64 today; tests/test_tilelang_cpu.py holds both bounds).
PLAN_KEY_TILE = 64
#: A bound on every tile's ``block_N`` (:func:`tc_config`, :func:`split_config`; the test
#: holds it): past it the kernel-frame chunk no longer changes a plan (:func:`_c_key`).
PLAN_C_MAX = 128


def _lk_key(p) -> int:
    """``Lk`` as far as :func:`_tc_choice` depends on it (without an explicit config): only
    through :func:`key_tiles` of a split tile, ``cdiv(min(Lk, window + chunk + rows),
    block_N)`` with ``rows <= PLAN_ROWS_MAX`` and ``block_N`` a multiple of
    :data:`PLAN_KEY_TILE`, and through the kernel-frame chunk ``C``, a key of its own. So
    ``cdiv(Lk, PLAN_KEY_TILE)``, no more than it is at ``Lk = window + chunk +
    PLAN_ROWS_MAX``, decides it (``cdiv(cdiv(x, a), b) = cdiv(x, a * b)``, and ``cdiv``
    keeps the order of ``min``). A decode loop whose ``Lk`` grows by one a step plans once
    per 64 keys, and once in all past that reach."""
    t = PLAN_KEY_TILE
    return min(-(-p.Lk // t), -(-(p.window_size + p.chunk_size + PLAN_ROWS_MAX) // t))


def _c_key(C: int) -> int:
    """The kernel-frame chunk ``C`` as far as :func:`_tc_choice` depends on it: only through
    :func:`call_knobs`, by :func:`lmk_cols_for`'s ``ceil(block_N / C)`` (1 for every ``C >=
    block_N``, and ``block_N <= PLAN_C_MAX``) and by :func:`v_chunk_span` and
    :func:`lmk_const_acts` (``K * C == block_N``, only with the view baked) for calls that
    admit the view, whose ``C`` is ``chunk_size`` (a key of its own). A chunk that outlasts every
    key reaches the kernel as ``Lk + 1``: without this bound, a decode loop in the first
    chunk of a long one planned once per step."""
    return min(C, PLAN_C_MAX)


def _plan(p, q_blhd: bool, kv_blhd: bool, C: int, sl2: float, force_split: int | None = None,
          ocols: int = 0, incols: tuple = (0, 0)):
    """:func:`_tc_choice` of a call without an explicit config, cached by what it reads:
    the static problem (``Lk`` through :func:`_lk_key`), the layouts, the kernel-frame
    chunk ``C`` (through :func:`_c_key`), whether the kernels are built wide
    (:func:`wide_positions`, which the saturated ``Lk`` and ``C`` do not decide), whether
    ``scale_log2`` allows ``scale_fold`` (:func:`scale_fold_ok`),
    ``force_split``, the device's SM count and whether the call admits the chunk view of
    ``v`` (:func:`v_chunk_call`: ``kv_start`` and ``Lk`` multiples of the chunk, which
    the saturated ``Lk`` alone does not decide), ``ocols`` (:func:`o_cols`) and ``incols``
    (:func:`in_cols`). The tables
    and functions it consults
    (:func:`tc_config`, :func:`tc_knobs`, :func:`pack_lowers`, ...) are not in the key:
    code that replaces one at run time calls :func:`clear_plans` (``tests/conftest.py``
    does around every test of ``tests/``)."""
    key = (p.B, p.Hq, p.Hkv, p.Lq, _lk_key(p), p.Dqk, p.Dv, p.dtype, p.device, p.window_size,
           p.chunk_size, p.mask_lmk, p.expand_to_chunk, q_blhd, kv_blhd, _c_key(C), scale_fold_ok(sl2),
           force_split, ocols, incols, sm_count(p.device), v_chunk_call(p),
           wide_positions(p, C))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _tc_choice(p, q_blhd, kv_blhd, C, sl2, force_split, ocols=ocols, incols=incols)
        if len(_PLANS) >= PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def clear_plans() -> None:
    """Forget every cached launch plan (:func:`_plan`) and the memoised configs
    (:func:`short_config`, :func:`shipped_config`, :func:`split_config`): after replacing a table or a planning
    function of this module at run time."""
    _PLANS.clear()
    short_config.cache_clear()
    shipped_config.cache_clear()
    split_config.cache_clear()


def _tc_choice(p, q_blhd: bool, kv_blhd: bool, C: int, sl2: float, force_split: int | None = None,
               config: tuple | None = None, ocols: int = 0,
               incols: tuple = (0, 0)) -> tuple[int, str, tuple]:
    """``(S, factory name, factory arguments)`` of a bf16/fp16 CUDA call (kernel-frame
    chunk ``C`` and ``scale_log2`` from :func:`scalars`; ``ocols``: :func:`o_cols`;
    ``incols``: :func:`in_cols`): the split
    count (1 = the prefill grid) and the tensor-core kernel :func:`run_cuda` runs. Uncached
    (every call without a config goes through :func:`_plan`)."""
    if force_split is None:
        S, split_cfg = split_plan(p)
    else:
        S = force_split
        split_cfg = (split_config(p.Dqk, p.Dv, p.mask_lmk, p.expand_to_chunk)
                     if S > 1 and config is None else None)
    split = S > 1
    cfg = config or (split_cfg if split else prefill_config(p))
    key = functools.partial(tc_kernel_key, p.Dqk, p.Dv, _TL_DTYPE[p.dtype], p.mask_lmk,
                            p.expand_to_chunk, q_blhd, kv_blhd, cfg, C, sl2, split, p.Hq // p.Hkv,
                            v_chunk_call(p), wide_positions(p, C))
    kind, args = key(ocols, incols)
    if (ocols and not split and not tc_knob(args, "pack")
            and not tma_rows(ocols, p.dtype.itemsize)):  # copied out (run_cuda, tma_rows)
        kind, args = key(0, incols)
    return S, kind, args


def describe(p, q_blhd: bool = False, kv_blhd: bool = False, force_split: int | None = None,
             ocols: int = 0, incols: tuple = (0, 0)) -> str:
    """What :func:`run_cuda` (or :func:`run_cpu` on CPU tensors) runs for this call,
    in one line: kernel, tile ``block_M x block_N``, pipeline stages, threads, the
    split count and the knobs baked for the call (:data:`TC_KNOBS` names, those
    off or at their default left out; ``o_cols`` after the kernel's name where it is not a
    knob list's, ``ocols``: :func:`o_cols`; ``incols``: :func:`in_cols`, the knobs ``qk_cols`` /
    ``v_cols``); ``force_split`` as in :func:`run_cuda`; a call run
    over batch slices
    is described by its first slice and the number of launches. Plans only; builds and
    launches nothing."""
    wide = " [wide]" if wide_positions(p, frame(p)[2]) else ""
    oc = f" [o_cols={ocols}]" if ocols else ""
    if device_type(p.device) == "cpu":  # meta tensors are planned as CUDA (tools/tl_lower.py)
        return f"fwd_cpu {CPU_TILE[0]}x{CPU_TILE[1]} (C target, fp32)" + wide + oc
    if p.B > GRID_YZ_MAX:
        cuts = batch_slices(p.B, GRID_YZ_MAX)
        return (describe(replace(p, B=cuts[0].stop), q_blhd, kv_blhd, force_split, ocols, incols)
                + f" (batch slices of {cuts[0].stop} or fewer: {len(cuts)} launches)")
    if p.dtype == torch.float32:
        return "fwd_fp32 (one row per thread, CUDA cores)" + wide + oc
    _, C, _, _, sl2 = scalars(p)
    S, kind, args = _plan(p, q_blhd, kv_blhd, C, sl2, force_split, ocols, incols)
    bm, bn, stages, threads = args[7:11]
    knobs = [f"{name}={val}" if not isinstance(val, bool) else name
             for (name, off), val in zip(TC_KNOBS, args[_KNOBS_AT:]) if val != off]
    text = f"{kind} {bm}x{bn} s{stages} t{threads}"
    if S > 1:
        text += f" S={S} +{combine_key(args, ocols)[0]}" + oc
    text += " [" + " ".join(knobs) + "]" if knobs else ""
    return text + (" (o copied out)" if copied_out(S, args, ocols) else "")


#: ``kernels.fwd_fp32``'s tile (its defaults, which take it from here), written out in the
#: factory arguments where ``wide`` follows it.
FP32_TILE = (128, 16)


def fp32_wide_args(args: tuple) -> tuple:
    """The fp32 GPU kernel's factory arguments built ``wide``, from its first six (the
    head dims, flags and layouts): its tile written out, then ``wide``, then ``o_cols`` where
    ``args`` has it (:func:`fp32_args`)."""
    return args[:6] + FP32_TILE + (True,) + args[9:]


def fp32_args(p, q_blhd: bool, kv_blhd: bool, C: int, ocols: int = 0) -> tuple:
    """Factory arguments of the fp32 GPU kernel of a call (kernel-frame chunk ``C``):
    those it always had, and its tile and ``wide`` where :func:`wide_positions`
    (:func:`fp32_wide_args`) or ``ocols`` (:func:`o_cols`), which then follows them."""
    args = (p.Dqk, p.Dv, p.mask_lmk, p.expand_to_chunk, q_blhd, kv_blhd)
    if ocols:
        args += FP32_TILE + (False, ocols)
    return fp32_wide_args(args) if wide_positions(p, C) else args


def run_cuda(p, q, k, v, q_blhd: bool, kv_blhd: bool, o, lse, force_split: int | None = None,
             config: tuple | None = None) -> None:
    """Launch the CUDA path into ``o``/``lse`` (already allocated, canonical; ``o`` may have
    fewer columns than ``p.Dv``, where the adapter padded ``Dv``: the kernels write those,
    :func:`o_cols`, but where :func:`copied_out`: there the kernel writes a padded ``o``, of
    this call's own allocation, whose columns are then copied into ``o``). bf16 / fp16 ``q``,
    ``k`` and ``v`` may have fewer columns than ``p.Dqk`` / ``p.Dv`` (the call's own inputs,
    where the adapter rounded a head dim up): the kernels read them narrow, :func:`in_cols`;
    the fp32 kernel does not (an error). The kernels
    put heads on the grid's y (``Hq``, or ``Hkv`` packed) and the batch on z: a batch past
    z's bound (``reference.device.GRID_YZ_MAX``) runs as launches over near-equal slices
    of it (views, nothing copied), each planned as its own call; ``Hq`` must fit
    (:func:`check_limits`)."""
    if p.B > GRID_YZ_MAX:
        for s in batch_slices(p.B, GRID_YZ_MAX):
            run_cuda(replace(p, B=s.stop - s.start), q[s], k[s], v[s], q_blhd, kv_blhd, o[s], lse[s],
                     force_split, config)
        return
    W, C, r, inv_c, sl2 = scalars(p)
    ocols, incols = o_cols(p, o), in_cols(p, q, v)
    if p.dtype == torch.float32:
        if incols != (0, 0):
            raise ValueError(f"fwd_fp32 reads Dqk={p.Dqk} / Dv={p.Dv} columns: inputs of "
                             f"{q.shape[-1]} / {v.shape[-1]} (narrow inputs are bf16 / fp16's)")
        ker = _call("fwd_fp32", *fp32_args(p, q_blhd, kv_blhd, C, ocols))
        ker(q, k, v, o, lse, W, C, r, inv_c, sl2)
        return
    S, kind, args = (_plan(p, q_blhd, kv_blhd, C, sl2, force_split, ocols, incols)
                     if config is None else
                     _tc_choice(p, q_blhd, kv_blhd, C, sl2, force_split, config, ocols, incols))
    split = S > 1
    ker = _call(kind, *args)
    if len(args) > _V_CHUNK_AT and args[_V_CHUNK_AT]:
        v = v_chunk_view(v, C, kv_blhd)
    if not split:
        if copied_out(S, args, ocols):  # o's rows take no tensor map (TMA_STRIDE)
            full = torch.empty((*o.shape[:-1], p.Dv), dtype=o.dtype, device=o.device)
            ker(q, k, v, full, lse, W, C, r, inv_c, sl2)
            copy_columns(o, full)
            return
        ker(q, k, v, o, lse, W, C, r, inv_c, sl2)
        return
    # Normalised partial outputs and their LSEs (fp32): the scratch cached for this
    # thread and stream (reference.device.scratch: nothing allocated once sized; under
    # CUDA-graph capture the graph's own tensors).
    op, lp = scratch(p.device, ((p.B, p.Hq, S, p.Lq, p.Dv), (p.B, p.Hq, S, p.Lq)))
    ker(q, k, v, op, lp, W, C, r, inv_c, sl2)
    ckind, cargs = combine_key(args, ocols)
    _call(ckind, *cargs)(op, lp, o, lse)


#: Tile of the CPU kernel (:func:`run_cpu`).
CPU_TILE = (16, 16)


def cpu_kernel_args(p, q_blhd: bool, kv_blhd: bool, ocols: int = 0) -> tuple[tuple, dict, tuple]:
    """``kernels.fwd_cpu``'s factory arguments for a call (positional, then by name) and the
    kernel's runtime scalars (:func:`scalars`): the knobs the GPU kernel ships for these head
    dims (:func:`tc_knobs`; the ``lmk_cols`` cap resolved per call by :func:`lmk_cols_for`
    for the 16-key tile; ``scale_fold`` per call, :func:`scale_fold_ok`), and by name
    ``hoist_left`` as the call's prefill-grid config bakes it (:func:`grid_config`: on for
    calls of several 64-row query blocks at ``max(Dqk, Dv) <= 128``, :data:`TC_HOIST_LEFT`),
    so the CPU tier runs the same macros as the GPU (16 x 16 tiles); ``o_cols`` by name where
    ``ocols`` (:func:`o_cols`) is not 0."""
    W, C, r, inv_c, sl2 = scalars(p)
    knobs = call_knobs(tc_knobs(p.Dqk, p.Dv), p.mask_lmk, C, CPU_TILE[1], sl2,
                       wide=wide_positions(p, C))
    # kernels.fwd_cpu follows TC_KNOBS by position only up to ``wide``; its later arguments
    # are the lab knobs, given by name: a longer tuple would land a GPU knob in one of them
    if len(knobs) > _KNOB["wide"] + 1:
        raise RuntimeError(f"cpu_kernel_args: knobs {knobs!r} reach past 'wide', which "
                           f"kernels.fwd_cpu does not take by position")
    # hoist_left as the GPU's prefill grid bakes it, where this kernel's knobs have mask_split
    hl = full_knobs(grid_config(p.Dqk, p.Dv, p.Lq)[4:])[_KNOB["hoist_left"]]
    named = {"hoist_left": hl} if hl and full_knobs(knobs)[_KNOB["mask_split"]] else {}
    if ocols:
        named["o_cols"] = ocols
    return ((p.Dqk, p.Dv, p.mask_lmk, p.expand_to_chunk, q_blhd, kv_blhd, *CPU_TILE, *knobs),
            named, (W, C, r, inv_c, sl2))


def run_cpu(p, q, k, v, q_blhd: bool, kv_blhd: bool, o32, lse) -> None:
    """Launch the CPU kernel (TileLang C target) on fp32 inputs into fp32 ``o32``/``lse``
    (:func:`cpu_kernel_args`; ``o32`` may have fewer columns than ``p.Dv``, :func:`o_cols`)."""
    if in_cols(p, q, v) != (0, 0):
        raise ValueError(f"fwd_cpu reads Dqk={p.Dqk} / Dv={p.Dv} columns: inputs of "
                         f"{q.shape[-1]} / {v.shape[-1]} (the adapter pads them on the CPU)")
    args, named, runtime = cpu_kernel_args(p, q_blhd, kv_blhd, o_cols(p, o32))
    _kernel("fwd_cpu", *args, **named)(q, k, v, o32, lse, *runtime)

