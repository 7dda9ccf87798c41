"""Lab for the TileLang kernels: correctness then timing of kernel variants
(prefill variants, :data:`VARIANTS`; decode variants, :data:`DECODE_VARIANTS`).

    python -m tools.lab_tilelang --out $OUT            (H200, TileLang preamble, carry .device)

One device call, time-capped (``--budget-s``, default 225 s including compiles):

1. Compiles every (variant, head dim, flags) kernel up front in parallel worker
   *processes* (``tilelang`` disk cache; the runner then loads them). A variant
   whose compile fails or does not finish in time is reported and skipped.
2. Runs the GPU work in a child process that reports every step to
   ``$OUT/lab_events.jsonl``. The parent is the watchdog: a child that stops
   reporting for ``--stall-s`` seconds (a hung kernel) or dies (a crash) is
   killed, the variant it was on is marked ``hung``/``crashed``, and a fresh
   child continues with the next variant.
3. Per variant: correctness against ``reference.golden`` (float64) on fresh
   random inputs, outputs poisoned with NaN before the call and NaN in every
   key slot no query sees (landmarks, left of every window); NaN also placed
   right after the K/V tensors in memory (the tile rows past ``Lk`` must come
   from the copy's zero fill, not from memory). The lab's own screen, looser
   than the conformance suite's ``conformance.verdict`` (which judges what
   ships, on the GPU tier): max err <= 2 x (``reference.same_dtype`` error) +
   a bf16 floor of 2e-2, no mean bound; ``-inf`` LSE positions must match
   exactly and those rows must be exactly 0.
   A variant that fails any case is not timed.
4. Timing: kernel only (``launch.run_cuda`` with the variant's config, prefill
   grid; decode variants on the prefill grid or split-KV plus the combine,
   :func:`_splits`), CUDA-graph replay of 10 back-to-back calls, best and median of 5
   replays; the L2 cache is *not* flushed between calls (every timed shape's
   K/V are larger than L2 except chunked prefill, which reads 8K keys per
   head). TFLOP/s = 4 * D * sum(visible_counts) * B * Hq / t.

Writes ``$OUT/lab_tilelang.json`` after every step and prints a compact table
last. Variants and the prediction written before any GPU run: :data:`VARIANTS`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback

# ---------------------------------------------------------------------------------------
# Variants: name -> (config for head dim D, what it changes, prediction before any GPU run)
# No variant without warp specialisation: kernels.fwd_tc_nows does not lower in
# TileLang 0.1.15 ("Downcast from tirx.Sub to ir.IntImm failed", already at bad6a66).
# A config is launch.run_cuda's ``config``: (block_M, block_N, num_stages, threads,
# lmk_zero, mask_split, fold, lmk_cols cap, fast_exp2, scale_fold, win_u32, lmk_rows_j0,
# pack, min_blocks [, ws]) -- see launch.tc_kernel_args (``pack`` since session 6,
# ``min_blocks`` since session 12; session 8's ``pdl`` and ``narrow`` were removed in
# session 9: a config written with a ws item at another position reads it as a knob, or is
# refused where it lands on min_blocks; build configs with launch.with_knobs); the lmk_cols cap becomes
# launch.lmk_cols_for of each call
# (C = 64 on 128-key tiles: 2), scale_fold is baked only for calls with a positive
# scale (launch.scale_fold_ok).
# ---------------------------------------------------------------------------------------
def _launch():
    """tilelang_impl.launch, imported on first use (this module loads without TileLang)."""
    from tilelang_impl import launch
    return launch


#: The prefill tile shipped for D <= 128 before session 12 (launch.tc_config then; decode
#: at D <= 64 ran 64x128 / 128 threads): 128x128, two stages, two consumer warp groups.
#: Frozen here so the variants built on it keep their meaning (launch.tc_config moved to
#: 64-row tiles with two CTAs per SM in session 12, the occ2-64x128 variant).
SESSION11_TILE = (128, 128, 2, 256)


def _base(D):
    return SESSION11_TILE if D <= 128 else _launch().tc_config(D, D)


def _cfg(D, tile=None, stages=None, threads=None, lmk_zero="rows", mask_split=True, fold=True):
    bM, bN, ns, th = _base(D)
    if tile is not None:
        bM, bN = tile(D) if callable(tile) else tile
    if stages is not None:
        ns = stages
    if threads is not None:
        th = threads
    return (bM, bN, ns, th, lmk_zero, mask_split, fold, 0)


def _full(cfg, **knobs):
    """A config with every knob item (defaults filled in), ``knobs`` set by name."""
    return _launch().with_knobs(cfg, **knobs)


#: The knobs shipped from dbb5ab4 to 1a0b87e (lmk_zero, mask_split, fold, lmk_cols cap)
#: per head dim bucket: the base the session-4 and session-5 variants build on. Frozen
#: here so the variants keep their meaning when launch.tc_knobs moves on.
SESSION4_KNOBS = {64: ("tile", True, False, 2), 128: ("rows", True, True, 2)}


def _session4(D):
    """The config shipped from dbb5ab4 to 1a0b87e for head dim D <= 128."""
    return _base(D) + SESSION4_KNOBS[64 if D <= 64 else 128]


def _ship_plus(D, **knobs):
    """The session-4 shipped config of head dim D (all knob items) with ``knobs`` set."""
    return _full(_session4(D), **knobs)


def _s5(D, **knobs):
    """The config shipped at 7e93d56 (session-4 knobs + fast_exp2, scale_fold, win_u32,
    and lmk_rows_j0 where it acts) for head dim D, with ``knobs`` set."""
    return _ship_plus(D, **dict(dict(fast_exp2=True, scale_fold=True, win_u32=True,
                                     lmk_rows_j0=True), **knobs))


def _other_tile(D):
    """The other of the two 128-row tiles: 128x64 where the base is 128x128 (every D <= 128
    since 7cedefc; D = 128 was 128x64 when the lab first ran)."""
    return (128, 64) if _base(D)[1] == 128 else (128, 128)


def _ship(D):
    """The config the variants below build on: ``launch.short_config``, the prefill config
    of every head dim before session 42 (at D <= 64 the 64x128 tile, two CTAs per SM, the view
    of v up to two chunks a tile) and still what decode and other one-block calls run. Since
    session 42 long calls at D <= 64 run ``launch.shipped_config`` (the ``shipped`` variant:
    occ3-64x64v's build in sessions 42-43, occ4-64x64v's in session 44), and since session 45
    long calls at D <= 128 take ``hoist_left`` there (and ``hoist_keys`` since session 46): at
    D = 128 the variants built on this config are ``nohoist``'s kernel (their texts' "D=128:
    nohoist"). The variants keep the base they were measured on."""
    return _launch().short_config(D, D)


def _ovl(D, stages=None, tile=None, **knobs):
    """The shipped prefill config of head dim D with the ``overlap`` knob (session 25),
    on another ``tile`` (block_M, block_N, num_stages, threads) or pipeline depth."""
    cfg = _ship(D)
    knobs = dict(dict(overlap=1, v_chunk=False), **knobs)  # v_chunk: not with overlap
    if tile is not None:
        cfg = tuple(tile) + cfg[4:]
    if stages is not None:
        cfg = cfg[:2] + (stages,) + cfg[3:]
    return _full(cfg, **knobs)


def _lean(D, stages=None, **knobs):
    """``launch.shipped_config`` with ``knobs`` set and, above D = 64, ``stages`` copy stages
    (session 51's lean overlapped loop and its three-stage forms: the loop holds each value
    tile one iteration longer; D = 64's four CTAs an SM have no shared memory for a third)."""
    cfg = _launch().shipped_config(D, D)
    if stages is not None and D > 64:
        cfg = cfg[:2] + (stages,) + cfg[3:]
    return _full(cfg, **knobs)


def _pp(D, stages=2, min_blocks=0, **knobs):
    """``launch.shipped_config``'s knobs on the 128 x 64 tile of two consumer warp groups
    (threads 256) with ``stages`` copy stages and ``min_blocks`` (0: TileLang's own register
    split, one CTA an SM), without ``hoist_keys`` (refused with ``pingpong``), ``knobs`` set
    (session 52's ping-pong and its control)."""
    cfg = _launch().shipped_config(D, D)
    return _full((128, 64, stages, 256) + cfg[4:], min_blocks=min_blocks, hoist_keys=0,
                 **knobs)


def _occ3(D, min_blocks=3, **knobs):
    """Session 39's three-CTA build at ``D <= 64``: the shipped knobs (the view of v,
    lmk_const) on the 64x64 tile with ``min_blocks`` (3; 4 for session 43's
    ``occ4-64x64v``) and ``knobs`` set; the shipped config above."""
    shipped = _ship(D)
    if D > 64:
        return _full(shipped)
    return _full((64, 64) + shipped[2:], v_chunk=True, min_blocks=min_blocks, **knobs)


VARIANTS = {
    "base": (lambda D: _base(D),
             "the session-11 tile (SESSION11_TILE) without knobs (lmk_zero=tile, full mask, "
             "unfolded softmax): the first shipped kernel (its D=128 tile was 128x64 until "
             "7cedefc; the shipped kernel is launch.shipped_config)",
             "reference point: ~100 TF/s H32 D128, ~65 TF/s GQA D64"),
    "rows": (lambda D: _cfg(D, mask_split=False, fold=False),
             "V tile: zero only landmark rows (<= ceil(bN/C) rows, 1 for C=64) instead of a "
             "full smem read-modify-write pass + syncs",
             "+15-30% over base (one smem pass of bN x Dv and 4 partial syncs per tile gone)"),
    "split": (lambda D: _cfg(D, lmk_zero="tile", fold=False),
              "window test only on tiles crossing a window edge; interior tiles mask landmark "
              "columns only",
              "+3-8% over base (about half the tiles of W=512 are interior)"),
    "fold": (lambda D: _cfg(D, lmk_zero="tile", mask_split=False),
             "softmax: row reference scaled once per row, one FMA + exp2 per score",
             "0-3% (nvcc already contracts most of it)"),
    "rows+split": (lambda D: _cfg(D, fold=False),
                   "rows + split", "+20-35% over base"),
    "split+fold": (lambda D: _cfg(D, lmk_zero="tile"),
                   "split mask + folded softmax, whole V tile zeroed (no landmark-row zeroing)",
                   "session 3, after the first lab: split alone gave +27-38%, fold and rows within "
                   "+-3%; at 128x128 (D=128) predicted equal to 'all' within 3%"),
    "all": (lambda D: _cfg(D),
            "rows + split + fold, shipped tile/stages/threads",
            "+20-40% over base: ~120-140 TF/s H32 D128"),
    "all-ns1": (lambda D: _cfg(D, stages=1),
                "all, num_stages=1", "-5..-15% vs all (loads no longer overlap compute)"),
    "all-ns3": (lambda D: _cfg(D, stages=3),
                "all, num_stages=3 (more smem; D=64 128x128: 32K+3x(16K+16K))",
                "0..+5% vs all (latency hidden already at 2 with 2 consumer WGs)"),
    "all-tile2": (lambda D: _cfg(D, tile=_other_tile),
                  "all, the other 128-row tile (128x64 since 7cedefc; D=128 was 128x128 when "
                  "the lab first ran)",
                  "D=128 128x128: +5-15% vs all (bigger wgmma N, half the barriers per key); "
                  "D=64 128x64: -5% vs all"),
    "all-64x64": (lambda D: _cfg(D, tile=(64, 64), threads=128),
                  "all, 64x64 tile, one consumer warpgroup (128 threads)",
                  "-20..-40% vs all (one WG cannot hide softmax behind wgmma; 2x programs)"),
    # session 5: the landmark test as integer compares against the tile's landmark
    # columns (macros.tile_landmark). Run: --only shipped,lmkcols
    "nolmkcols": (lambda D: _session4(D)[:7] + (0,),
                  "launch.shipped_config knobs as of ee66ff0, lmk_cols off (D=64: split mask; "
                  "D=128: rows + split + fold; 128x128): the general float landmark test "
                  "(~9 instructions per score); called 'shipped' until lmk_cols shipped",
                  "reference point for lmkcols: ~137 TF/s H32 D128 L8K, ~85 TF/s GQA D64 "
                  "(BENCHMARKS.md)"),
    "ovl": (lambda D: _ovl(D),
            "shipped config with the overlap knob (session 25): each tile's mask and "
            "softmax run while the previous tile's P @ V is on the tensor cores (two "
            "asynchronous wgmma groups per iteration, T.wgmma_gemm / T.wait_wgmma), one "
            "more iteration per block (K tile n-1 twice, V tile 0 twice)",
            "D=128 +10-25% (the softmax, ~1/3 of a tile's serial chain, hidden behind P @ V), "
            "D=64 +5-20%, chunked +0-10% (short loops: the added iteration costs more)"),
    "zero-rows": (lambda D: _full(_ship(D), v_chunk=False),
                  "the shipped config without the chunk view of v (the prefill kernel shipped "
                  "before session 25: the consumer zeroes V's landmark rows)",
                  "reference point of vchunk"),
    "ovl-serial": (lambda D: _ovl(D, overlap=2),
                   "control of ovl: the same loop (one more iteration, V one tile behind) with "
                   "each product waited for at once",
                   "slower than ovl by what the overlap gains"),
    "vchunk": (lambda D: _full(_ship(D), v_chunk=True),
               "shipped config with v through the chunk view (session 25): the copy engine "
               "zero-fills each chunk's landmark row, the consumer no longer zeroes V rows "
               "(no per-tile named barriers and proxy fence before P @ V); where C % block_N "
               "== 0 (D=128 64x64 tiles at C=64; D=64's 64x128 tile keeps the zeroing)",
               "D=128 +2-6%, D=64 shapes unchanged (C=64 < block_N); shipped in session 25 "
               "(launch.TC_V_CHUNK), so equal to 'shipped' from then on at D=128; at D=64 "
               "the zeroing kernel shipped before session 28 (permission 1)"),
    "vchunk2": (lambda D: _full(_ship(D), v_chunk=2),
                "shipped config with the view allowed to span two chunks per tile (session 26): "
                "at C = 64 D=64's 128-key tile is two chunks, filled by one bulk copy each "
                "(kernels._load_v_chunks), so the consumer's landmark-row zeroing (a shared-"
                "memory write, two named barriers, a proxy fence per tile) goes; D=128 runs "
                "the shipped kernel (64-key tiles: one chunk)",
                "D=64 rows +3-7% over shipped (D=128's view gave +6.9% at 8K; a 128-key tile "
                "has twice the softmax per barrier), chunked and D=128 rows within 1%; "
                "measured +5-6% (session 28) and shipped (launch.TC_V_CHUNK = 2): equal to "
                "'shipped' since"),
    "vchunk-64x64": (lambda D: _full((64, 64) + _ship(D)[2:], v_chunk=True),
                     "vchunk on the 64x64 tile at every D (D=64: C=64 fits the view)",
                     "D=64 +0-8% over shipped's 64x128 (the 64x64 tile lost 8% with zeroing)"),
    # session 38 (written on the CPU; run in session 39): on calls the chunk view serves, every tile
    # starts a chunk, so with K * C == block_N its landmark columns are C - 1, ..., block_N - 1
    # at every tile (launch.lmk_const_acts): compile-time constants instead of K compares per
    # score against the tile's j0 register (macros.constant_landmark_columns). SASS (sm_90a,
    # CPU, bf16, the shipped config): the consumer's key loop D=64 C=64 957 -> 729
    # instructions (-24%), D=64 C=128 884 -> 724 (-18%), D=128 C=64 597 -> 507 (-15%); the
    # ISETP / FSEL / LOP3 of the landmark selects go where the thread's column cannot be one.
    # Triton's compile-time landmark column (session 37) took -12% of its inside block's
    # instructions for -3..-9% kernel time.
    # Shipped in session 39 (launch.shipped_config: lmk_const=True): lab on an H100, four
    # runs at fe9de2e and the control at ebd1760 (L2 not flushed): D=128 L=8K / 16K
    # +2.1..+4.4%, the D=64 GQA rows +0.5..+8.9%, chunked prefill +0.5..+8.7%; predicted
    # +5-12% (D=64) / +3-8% (D=128). The control below runs shipped without it. Every variant
    # above and below built on launch.shipped_config takes lmk_const since ebd1760 (where
    # the call allows it): vchunk-64x64, occ2-128x64 and the others measured before then
    # ran without it, so their old figures and new ones differ by it as well.
    "nolmkconst": (lambda D: _full(_ship(D), lmk_const=False),
                   "shipped config with the landmark columns tested against the tile's j0 "
                   "register (lmk_const off: before session 39)",
                   "shipped +0.5-8.9% over it (session 39 lab, H100, fe9de2e / ebd1760)"),
    "ovl-s3": (lambda D: _ovl(D, stages=3),
               "ovl with three stages (the K/V lag one more tile behind the math)",
               "within 3% of ovl (D=128: may not fit two CTAs per SM)"),
    "ovl-128x128": (lambda D: _ovl(D, tile=(128, 128, 2, 256), min_blocks=0),
                    "overlap on the 128-row tile with two consumer warp groups, one CTA per SM "
                    "(FA3's own tile)",
                    "D=128 +0-20% over ovl (one CTA per SM loses the inter-CTA overlap)"),
    "ovl-lean": (lambda D: _lean(D, overlap=3),
                 "shipped config with the lean overlap (session 51): each tile's softmax beside "
                 "the previous tile's P @ V as in ovl, without ovl's unused P @ V of tile -1 "
                 "(the repeated last key tile's Q K^T stays: skipping it, ptxas serialised "
                 "every wgmma), on the chunk view and the hoists",
                 "D=128 +0..+6% over shipped (ovl gained 2.8% over its serial control, whose "
                 "extra products cost about a tenth of a block's tensor work), D=64 +0..+4% "
                 "(written before the D=64 build spilled; BENCHMARKS.md's prediction before "
                 "the run: -10..-2%), chunked -3..+3%; measured (session 51, H100, two runs "
                 "at 71ed54b): D=128 -6.2..-6.5%, D=64 -7..-22% (spills, wgmma serialised), "
                 "chunked -1.8/-6.8%: not shipped"),
    "ovl-lean-serial": (lambda D: _lean(D, overlap=4),
                        "control of ovl-lean: the same loop with each product waited for at "
                        "once",
                        "slower than ovl-lean by what the overlap gains; within -3% of shipped "
                        "(one more loop iteration a block; BENCHMARKS.md's prediction before "
                        "the run: -5..0%); measured (session 51): D=128 -8.1..-8.6% against "
                        "shipped, 2.0-2.4% below ovl-lean"),
    "ovl-lean-s3": (lambda D: _lean(D, stages=3, overlap=3),
                    "ovl-lean with three copy stages: the value tile, which the lean loop holds "
                    "one iteration longer, no longer keeps the producer a tile closer behind",
                    "D=128 within -2..+4% of shipped if the held value tile is what "
                    "ovl-lean-serial's 8% cost is; D=64 unchanged (stages kept at its tile's); "
                    "measured (session 51, H100, three runs at ff52ac6): D=128 -5.2..-5.7%, "
                    "+0.7..+1.2% over ovl-lean: not the cost"),
    "s3": (lambda D: _lean(D, stages=3),
           "the shipped config with three copy stages at D=128 (two CTAs an SM: 112 KB of "
           "dynamic shared memory each), ovl-lean-s3's control",
           "within -2..+2% of shipped (the shipped loop holds no tile longer); measured "
           "(session 51): -0.4..-1.0% at 8K / 16K, chunked -4.3..-5.4%"),
    # Session 52 (written on the CPU, before any GPU run): FA3's ping-pong, kernels.PINGPONG.
    # The 128-row tile's two consumer warp groups take turns at the tensor cores; hoist_keys is
    # off there (launch.call_knobs: the kernel refuses the pair), so "nohkeys" is shipped's
    # side of the comparison too. At W=512, C=64 a 128-row tile reads 10 key tiles of 64 where
    # a 64-row tile reads 9: 11% more tensor work a row.
    "pp": (lambda D: _pp(D, pingpong=1),
           "the 128 x 64 tile, two consumer warp groups (threads 256), one CTA an SM at D=128 "
           "(TileLang's register split), two copy stages, with FA3's ping-pong: each group's "
           "Q K^T and P V issued in turns through two named barriers (bar.sync / bar.arrive), "
           "so one group's softmax runs while the other's products are on the tensor cores",
           "D=128 +15..+35% over pp-off and -5..+15% against shipped; D=64 -10..+5% against "
           "shipped (one CTA of two groups where shipped runs four); measured (session 52, "
           "H100, five runs): D=128 0.70-0.72x shipped, 11-15% below pp-off; D=64 0.52-0.59x"),
    "pp-off": (lambda D: _pp(D),
               "pp's kernel without the turns (pingpong 0): both groups in step, the control",
               "D=128 -10..-20% against shipped (session 12: the 128-row tile in step lost 9% "
               "to two 64-row CTAs, before the hoists), D=64 -20..-35%; measured (session 52): "
               "D=128 0.80-0.82x, D=64 0.58-0.65x"),
    "pp-occ2": (lambda D: _pp(D, pingpong=1, min_blocks=2 if D <= 64 else 0),
                "pp at D=64 with two CTAs an SM (min_blocks 2: 104 consumer registers, no "
                "spill in the CPU build); at D=128 pp itself (two CTAs' shared memory does "
                "not fit)",
                "D=64 +5..+20% over pp and -5..+10% against shipped; measured (session 52): "
                "D=64 0.73-0.80x shipped, +35..+40% over pp"),
    # Written after pp's first runs (session 52, one H100: pp 0.70-0.72x shipped at D=128 and
    # about 13% below its control pp-off in those three runs): pp hands the turn over only once
    # its product is done, so the tensor pipe drains at each of the four hand-overs a tile pair.
    "pp-async": (lambda D: _pp(D, pingpong=2),
                 "pp with the turn handed over once the product is issued (pingpong 2: "
                 "T.wgmma_gemm, bar.arrive, then the wait), so the other group's product queues "
                 "behind it instead of after a drained pipe",
                 "D=128 290-340 TFLOP/s on an H100 (+10..+30% over pp; 0.80-0.93x shipped), "
                 "D=64 within +-5% of pp; measured (session 52, two runs): D=128 L=8K 285.8-287.0 "
                 "TFLOP/s, 0.78x shipped, +10..+13% over pp and 2-4% below pp-off; D=64 "
                 "+4..+9% over pp, 3-5% below pp-off"),
    "pp-async-occ2": (lambda D: _pp(D, pingpong=2, min_blocks=2 if D <= 64 else 0),
                      "pp-async at D=64 with two CTAs an SM (pp-occ2's occupancy); at D=128 "
                      "pp-async itself",
                      "D=64 +5..+20% over pp-occ2, 0.80-0.95x shipped; measured (session 52): "
                      "D=64 0.75-0.77x shipped, +0..+3% over pp-occ2"),
    "pp-s3": (lambda D: _pp(D, stages=3, pingpong=1),
              "pp with three copy stages (160 KB of shared memory at D=128)",
              "within -3..+5% of pp; measured (session 52, three runs): within -2..+3% of pp"),
    "shipped": (lambda D: _full(_launch().shipped_config(D, D)),
                "launch.shipped_config as it is (dbb5ab4..1a0b87e: lmkcols; since session 5: "
                "fexp+sfold+wu32+lmkj0; at D<=64 occ3-64x64v in sessions 42-43, occ4-64x64v "
                "since session 44)",
                "measured on the H200: ~236 TF/s H32 D128 L8K (fexp+sfold+wu32+lmkj0, "
                "1a0b87e), ~156 TF/s GQA D64 (s5-rows+fold, tree of 7e93d56)"),
    "lmkcols": (lambda D: _session4(D),
                "nolmkcols + lmk_cols (shipped dbb5ab4..1a0b87e, SESSION4_KNOBS): landmark test = "
                "K integer compares vs the tile's landmark columns j0 + m*C (K = ceil(bN/C) = 2 "
                "at C=64, bN=128), j0 once per tile in a register; edge-tile mask branch-free",
                "SASS (CPU, sm_90a, consumer key loop per 128-key tile, dynamic): D128 "
                "3550 -> 3024 instr on interior tiles (-15%), <=4164 -> 3552 on edge tiles "
                "(-15%, 190 branches -> 0); D64 2637 -> 2060 (-22%) / <=3191 -> 2587 (-19%). "
                "Predicted: D128 +5-12% TFLOP/s, D64 GQA +8-18%, chunked prefill like D128; "
                "below +3% would mean the loop is MMA/latency bound, not issue bound"),
    # session 6 (measured on the H200 before: shipped = lmkcols, D128 185 TF/s, GQA D64
    # 136 TF/s). Knobs of kernels.fwd_tc added on top of that config (SESSION4_KNOBS), cumulative;
    # all four shipped after the lab of session 5 (bench_results/tilelang-lab4-1a0b87e.json).
    # SASS: consumer key loop, dynamic instructions per 128-key tile per consumer thread
    # (64 scores), sm_90a, C = 64, CPU compile; "interior / edge" tile paths.
    # Run: --only shipped,fexp,fexp+sfold,fexp+sfold+wu32
    "fexp": (lambda D: _ship_plus(D, fast_exp2=True),
             "shipped + fast_exp2: the softmax exponentials as the bare ex2.approx.ftz "
             "(1 MUFU.EX2) instead of exp2f (range test + 2 predicated FMULs + MUFU.EX2)",
             "SASS D128 1418 / 1911 -> 1220 / 1713 (-14% / -10%), D64 1055 / 1557 -> "
             "857 / 1359 (-19% / -13%). Predicted vs shipped: D128 +6-12% TFLOP/s, GQA D64 "
             "+8-15%; if below +3% the exp2 is hidden behind the MMAs (then sfold will also "
             "gain little)"),
    "fexp+sfold": (lambda D: _ship_plus(D, fast_exp2=True, scale_fold=True),
                   "fexp + scale_fold (calls with sm_scale > 0): the mask selects raw scores "
                   "(no FMUL per score), the row max is scaled once per row, p = "
                   "ex2(fma(s, scale, -m)); edge-tile mask loses its predicated per-score "
                   "scale loads",
                   "SASS D128 -> 1159 / 1371 (-18% / -28% vs shipped), D64 -> 794 / 1014 "
                   "(-25% / -35%). Predicted vs shipped: D128 +10-20%, GQA D64 +15-30%"),
    "fexp+sfold+wu32": (lambda D: _ship_plus(D, fast_exp2=True, scale_fold=True, win_u32=True),
                        "fexp+sfold + win_u32: the edge tiles' window test as one unsigned "
                        "compare uint32(kpos - left) <= uint32(qpos - left) per score",
                        "SASS D128 -> 1156 / 1296 (-18% / -32% vs shipped), D64 -> 794 / 942 "
                        "(-25% / -40%). Predicted vs shipped: D128 +12-25%, GQA D64 +18-35% "
                        "(about half the W=512 tiles are edge tiles); vs fexp+sfold +2-5%"),
    # session 7: lmk_rows_j0 (macros.zero_landmark_rows with the tile's int32 j0 register:
    # no 64-bit re-derived floor modulo, integer select, static rows with lmk_cols). Acts
    # only with lmk_zero="rows" and lmk_cols > 0 (the session-4 base has "rows" at D=128,
    # "tile" at D=64: launch.call_knobs drops the knob there, the D=64 kernels are the
    # base variant's, their times a noise check).
    # SASS as above (dynamic per 128-key tile per consumer thread, C=64, interior / edge;
    # this session's path count: Q wait skipped, landmark-select and 32-bit division
    # paths taken): shipped 1250 / 1778 -> 1070 / 1595; fexp+sfold+wu32 991 / 1162 ->
    # 810 / 978. Barriers unchanged: 2 bar.sync of the 256 consumer threads per tile.
    # Run: --only shipped,fexp,fexp+sfold,fexp+sfold+wu32,lmkj0,fexp+sfold+wu32+lmkj0
    "lmkj0": (lambda D: _ship_plus(D, lmk_rows_j0=True),
              "shipped + lmk_rows_j0: the V tile's landmark rows zeroed from the tile's one "
              "int32 first-landmark register (shared with the lmk_cols masks), select on an "
              "integer condition, K static rows instead of a loop over row groups",
              "SASS D128 1250 / 1778 -> 1070 / 1595 (-14% / -10%), barriers 2 -> 2. "
              "Predicted vs shipped: D128 shapes +4-10% TFLOP/s; D64 shapes 0 (same kernel, "
              "+-2% noise); below +2% at D128 would mean the zeroing sat in the shadow of "
              "the V wait / barriers"),
    "fexp+sfold+wu32+lmkj0": (lambda D: _ship_plus(D, fast_exp2=True, scale_fold=True,
                                                   win_u32=True, lmk_rows_j0=True),
                              "fexp+sfold+wu32 + lmk_rows_j0",
                              "SASS D128 991 / 1162 -> 810 / 978 (-18% / -16%). Predicted vs "
                              "fexp+sfold+wu32: D128 +5-12% (the zeroing is a larger share of "
                              "the shorter loop); D64 0 (same kernel)"),
    # session 5, after shipping the four knobs above (7e93d56): D = 64 still zeroed its whole
    # V tile (lmk_zero="tile") and kept the unfolded softmax; D = 128 got +18% from zeroing
    # only the landmark rows from the j0 register. These variants are the D = 128 kernel of
    # 7e93d56 at D = 128 (their columns there are a noise check). Ran on the tree of 7e93d56
    # (tilelang-lab5-7e93d56.json); s5-rows+fold shipped for D <= 64 after it.
    # Run: --only shipped,s5-rows,s5-rows+fold,s5+fold
    "s5-rows": (lambda D: _s5(D, lmk_zero="rows"),
                "shipped + lmk_zero='rows' + lmk_rows_j0 at D=64 (only V's landmark rows zeroed, "
                "from the tile's j0 register, instead of the whole 128x64 V tile)",
                "D64 GQA shapes +8-20% (a full smem read-modify-write pass of V per tile and its "
                "barrier gone, as at D=128 where rows+j0 gave +18%); D128 = shipped (+-2%)"),
    "s5-rows+fold": (lambda D: _s5(D, lmk_zero="rows", fold=True),
                     "s5-rows + fold (row reference scaled once per row)",
                     "vs s5-rows: 0-3% (with scale_fold the exponent is already one FMA)"),
    "s5+fold": (lambda D: _s5(D, fold=True),
                "shipped + fold at D=64 (whole V tile still zeroed)",
                "vs shipped: 0-3%"),
    # single knobs on the session-4 config, for attribution if the cumulative ones surprise
    "sfold": (lambda D: _ship_plus(D, scale_fold=True),
              "shipped + scale_fold only",
              "SASS D128 1357 / 1569 (-4% / -18%), D64 992 / 1212 (-6% / -22%): +3-10% vs "
              "shipped"),
    "wu32": (lambda D: _ship_plus(D, win_u32=True),
             "shipped + win_u32 only (the scale multiply stays in the select)",
             "SASS D128 1415 / 1829, D64 1054 / 1542 (edge -1..-4%): within +-3% of shipped; "
             "the unsigned compare pays only once the select has no multiply (sfold)"),
    # session 7, after packed decode shipped: the packed kernel generalised to any Lq
    # (query blocks of block_M packed rows = block_M / G queries of all G heads).
    # Measured at 2f11a45 (tilelang-lab11-2f11a45.json, L2 not flushed): pack 96.6 /
    # 101.5 / 97.9 TFLOP/s on the three GQA shapes against noj0-64 128.7 / 123.5 /
    # 132.3 and shipped 154.5 / 146.3 / 159.4 (prediction +10-20%: wrong sign); G=1
    # shapes unchanged. lmk_rows_j0 alone is worth +20% at D=64 (noj0-64 vs shipped).
    "pack": (lambda D: _pack_prefill(D),
             "shipped + GQA-packed rows on long prefill (128 packed rows = 128 / G queries "
             "of the G heads of a key/value head; each K/V tile read once for them); at "
             "D <= 64 without lmk_rows_j0 (with it the G = 8 kernel fails ThreadSync, CPU)",
             "GQA 32/4 D64: 152 -> 165-185 TFLOP/s (a tile spans 16 queries, not 128: "
             "~5 key tiles of 128 instead of ~6, fewer edge tiles), 16/2 (G=8) and batch "
             "likewise +10-20%; G=1 shapes unchanged (pack dropped)"),
    "noj0-64": (lambda D: _full(_session11(D), lmk_rows_j0=D > 64),
                "shipped (as before session 12) without lmk_rows_j0 at D <= 64 (pack's "
                "attribution)",
                "D64: -2-8% vs shipped (j0 gave +18% at D=128 in session 5); D128 = shipped"),
    # session 12: occupancy. TileLang's default launch bounds (threads, 1) let ptxas give a
    # 64-row tile with one consumer warp group 240 registers at launch: one CTA per SM, so
    # nothing overlaps its softmax with tensor work (all-64x64 of session 3: -37% at D=64).
    # The min_blocks knob (kernels.consumer_regs) bakes __launch_bounds__(threads + 128, n)
    # and the setmaxnreg split (producer 24, consumers the rest of 1/n of the register file).
    # CPU compile (sm_90a, no spills in any): n=2 -> 128 registers at launch, consumers 232;
    # n=3 -> 80 / 144; n=4 -> 64 / 104 (the rule of 287ff31; kernels.consumer_regs now gives
    # 136 at n=3, and only n=2 is accepted); 64x128 with n=3 does not assemble (ptxas wants 90).
    # Shared memory (O_s aliases Q_s): D=64 64x128 s2 72 KB, s3 104 KB; D=128 64x64 s2 80 KB;
    # D=64 64x64 s2 40 KB. Shipped in the same runs: D=128 128x128 s2 and D=64 128x128 s2,
    # both two consumer warp groups, one CTA per SM (168 registers at launch).
    # Measured before (lab, L2 not flushed): shipped 236 TF/s H32 D128 L8K, ~155 GQA 32/4 D64.
    # Run (287ff31): --only shipped,occ2-64x128,occ2-64x128-s3,occ2-64x64,occ3-64x64,occ4-64x64
    "occ2-64x128": (lambda D: _occ(D, (64, 128) if D <= 64 else (64, 64), 2, 2),
                    "one consumer warp group per CTA, two CTAs per SM (min_blocks=2): D<=64 "
                    "64x128 s2, D=128 64x64 s2 (64x128 does not fit two CTAs' shared memory)",
                    "GQA D64 shapes 155 -> 165-195 TF/s (+5..+25%: two independent CTAs per SM "
                    "overlap one's softmax with the other's wgmma, and a 64-row tile reads "
                    "~576 instead of ~640 keys at W=512); D128 236 -> 200-260 (-15..+10%: "
                    "64-key tiles double the barriers and the softmax passes per key)"),
    "occ2-64x128-s3": (lambda D: _occ(D, (64, 128) if D <= 64 else (64, 64), 3 if D <= 64 else 2, 2),
                       "occ2-64x128 with three stages at D<=64 (D=128 = occ2-64x128)",
                       "D64 0..+5% vs occ2-64x128; D128 = occ2-64x128 (+-2%)"),
    "occ2-64x64": (lambda D: _occ(D, (64, 64), 2, 2),
                   "64x64 s2, one consumer warp group, two CTAs per SM",
                   "D64 145-185 TF/s (half the tensor work per barrier of 64x128); D128 as "
                   "occ2-64x128 (the same kernel there)"),
    # session 26 (written on the CPU, not run): the 128-row tile of two consumer warp
    # groups with two CTAs per SM at D <= 64, sixteen consumer warps per SM where the shipped
    # 64x128 tile has eight. launch_regs(256, 2) = 80 at launch, consumers 104 after setmaxnreg
    # (29696 of the CTA's 30720), no spills (CPU compile); a 128-row block reads the same
    # 640 keys a row as the shipped tile (ten 64-key tiles against five 128-key ones), and
    # C = 64 is a multiple of its 64-key tile, so v comes through the chunk view (span 1).
    "occ2-128x64": (lambda D: _occ2_128x64(D, 2),
                    "D<=64: 128x64 tile, two consumer warp groups, two CTAs per SM (min_blocks=2 "
                    "at 256 consumer threads: 104 registers each), v through the chunk view; "
                    "D=128: the shipped kernel (its 64x128 accumulator would not fit 104)",
                    "D64 rows -5..+20% vs shipped (twice the consumer warps per SM to overlap "
                    "softmax with wgmma, K/V tiles shared by two warp groups; against: twice the "
                    "barriers per key, both groups in lockstep on the shared stages; four CTAs "
                    "per SM hung with an exact register split in session 12, this split leaves "
                    "1024 registers a CTA: the lab's watchdog reports a hang); D128 = nohoist"),
    "occ2-128x64-s3": (lambda D: _occ2_128x64(D, 3),
                       "occ2-128x64 with three stages (64 KB of shared memory a CTA)",
                       "D64 within 3% of occ2-128x64 (the producer already waits for free "
                       "stages at two); D128 = nohoist"),
    # "occ3-64x64" and "occ4-64x64" (64x64 at D=64 with three / four CTAs per SM, consumers
    # 144 / 104 registers) hung in lab15 (bench_results/tilelang-lab15-287ff31.json): at three
    # the consumers asked for more registers than the CTA launched with (80 a thread: 256 x 80
    # < 128 x 24 + 128 x 144), four is refused (kernels.MIN_BLOCKS); their code is in 287ff31.
    # Session 39 (written on the CPU, not run): three CTAs again with the split that counts
    # the launch registers (kernels.consumer_regs(128, 3) = 136; no spills, sm_90a CPU
    # compile), on today's knobs. SASS (sm_90a, CPU, bf16, C = 64, the consumer's key loop from
    # its first instruction to its back branch): 64x128 shipped 729 instructions a 128-key
    # tile, 64x64 464 a 64-key tile at two CTAs and 475 at three (+27..+30% a key). Session 12
    # measured 64x64 8% slower than 64x128 at two CTAs (172.5 against 188.5 TF/s, GQA 32/4):
    # each chain (softmax, then P @ V) is latency-bound (the tensor pipe 26-31% active at D=64,
    # issue slots half idle), so a third CTA per SM is a third chain where the issue slots have
    # room for it. Control: vchunk-64x64 (the same kernel at two CTAs).
    # Run (session 40, H100, six runs at 9aefa69 / 6baba3e, L2 not flushed): the D = 64 GQA
    # rows +8..+15% over shipped in every run that finished them (GQA 32/4 8K 251-263 against
    # 226-234 TF/s), D = 128 and chunked within +-2% (= shipped there); one run hung timing
    # "B4 GQA32/4 D64 L4K" (the watchdog's restart). tools/lab_hang on that shape (6baba3e):
    # hung within its first 1000 launches, eager and under graph replay, after one launch that
    # finished; vchunk-64x64 (the same kernel at two CTAs, setmaxnreg [24, 232] against [24,
    # 136]: both splits fill the launch registers exactly) 50,000 launches each mode, shipped
    # 100,000 under graph replay, none hung. bench_results/tilelang-lab40-*.json,
    # lab-hang-occ3-h100-6baba3e.json. Session 41 found the cause (a producer warp a round
    # behind on a parity wait, tilelang_impl/producer_guard.py) and fixed it in every kernel:
    # with the guard, no hang in 100,000 launches and +9..+20% over shipped on the D = 64 GQA
    # rows (three runs, H100, 1977d21). Shipped in session 42 for calls of several query blocks
    # (launch.shipped_config, the "shipped" variant at D <= 64 until session 44, when
    # occ4-64x64v replaced it: -9..-10% against it in session 44's run 3).
    "occ3-64x64v": (lambda D: _occ3(D),
                    "D<=64: shipped knobs (the view of v, lmk_const) on the 64x64 tile with three "
                    "CTAs per SM (consumers 136 registers); D=128: nohoist",
                    "D64 rows -5..+20% against shipped then (prev-64x128; three latency-bound chains an SM where two "
                    "ran, +27% instructions a key; against: the hang of session 12 if its cause "
                    "was not only the register split: the lab's watchdog reports it), +10..+35% "
                    "against vchunk-64x64; D128 = nohoist"),
    # Session 40 (written on the CPU, not run): occ3-64x64v with slack in its register split
    # (kernels.REG_SLACKS: consumers 128 where 136 fill the CTA's pool; producer 24, launch
    # 80), for the hang above: run beside occ3-64x64v under tools/lab_hang --gdb. If the
    # consumers of the hung kernel wait at their setmaxnreg and this one does not hang, the
    # exact fill is the cause; if both hang, it is not.
    # Session 41: the hang found (tools/lab_hang --gdb, H100 at 56da5a7: one producer warp
    # left on the GPU, spinning on a key-stage mbarrier a round behind; slack8 hung too, and
    # occ3 ran 100,000 launches on a grid of two CTAs an SM and hung at 14,000 on one of
    # three). tilelang_impl/producer_guard.py: warp 0 alone runs the producer's loop, in every
    # kernel since; occ3-64x64v is built with it, and this variant without it (the control).
    "occ3-64x64v-allwarps": (lambda D: (_occ3(D, producer_warps=4) if D <= 64 else
                                        _full(_ship(D), producer_warps=4)),
                             "occ3-64x64v with the producer's four warps in its key loop, as "
                             "TileLang 0.1.15 writes it (before the guard); D=128: nohoist the same way",
                             "hangs under tools/lab_hang where occ3-64x64v does not; speed "
                             "within +-2% of occ3-64x64v where it finishes"),
    # (built on launch.shipped_config: it moves with it, hoist_keys included since session 46)
    "shipped-allwarps": (lambda D: _full(_launch().shipped_config(D, D), producer_warps=4),
                         "launch.shipped_config with the producer's four warps in its key loop "
                         "(the shipped kernel before session 41's guard; at D<=64 the long "
                         "calls' build without the guard: three CTAs in sessions 42-43, four since)",
                         "within +-2% of shipped (the guard removes three warps that only wait, "
                         "suspended, in try-wait); D<=64 hangs under tools/lab_hang, as "
                         "occ3-64x64v-allwarps does"),
    # Session 42: occ3-64x64v shipped for long calls at D <= 64 (launch.shipped_config, the
    # ``shipped`` variant in sessions 42-43); the control is the config it replaced.
    "prev-64x128": (lambda D: _full(_ship(D)),
                    "launch.short_config: D<=64 the 64x128 tile with two CTAs per SM and the view "
                    "of v up to two chunks a tile (every call's config until session 42, decode "
                    "and one-block calls' since); D=128: nohoist",
                    "occ3-64x64v +9..+20% over it on the D64 rows (session 41 lab, H100; "
                    "+7.6..+17.8% in session 42's), shipped (occ4) a further +7..+14% "
                    "(session 44); D128 = nohoist"),
    # Session 43 (written on the CPU): four CTAs an SM of the same kernel. Session 12's
    # occ4-64x64 hung with a split that fits (64 registers at launch, consumers 104): that
    # was before session 41's producer guard, whose race three CTAs made likely; four make it
    # likelier still. Shared memory about 40 KB a CTA (session 12's count): four fit an SM's
    # 228 KB. sm_90a CPU build (bf16,
    # C = 64): see BENCHMARKS' session 43 for its registers, spills and key-loop length.
    # Triton's fourth CTA at D = 64 gave +4% (session 8); TileLang's third gave +22..+24% on
    # this tile (session 40, against vchunk-64x64).
    "occ4-64x64v": (lambda D: _occ3(D, min_blocks=4),
                    "occ3-64x64v with four CTAs per SM (min_blocks 4: 64 registers at launch, "
                    "consumers 104); D=128: nohoist",
                    "D64 rows -8..+8% against occ3-64x64v, shipped then (a fourth latency-bound "
                    "chain an SM where issue slots were about half idle at two; against: 104 "
                    "registers may spill, and L1 left to the four is about 4 x 40 KB less); D128 = "
                    "shipped; shipped itself since session 44"),
    # Session 43 (written on the CPU): FlashAttention 4's conditional rescale. A row keeps its
    # softmax reference while a tile's max stays within 2**8 of it (p up to 256: bf16 and
    # fp16 keep their relative precision there), and a warp none of whose rows moved skips the
    # output rescale (an __any_sync vote makes the branch uniform). Every instruction of the
    # consumer's loop is on one warp group's serial chain (QK^T, softmax, rescale, P @ V, the
    # next tile): the rescale's multiplies, 32 a thread at D = 64 and 64 at D = 128, sit
    # between the exponentials and the P @ V wgmma. sm_90a CPU build: the key loop 475 -> 499
    # instructions at D = 64 and 507 -> 531 at D = 128 as written (the vote and the branch
    # added, the multiplies still in it, skipped at run time); no spills, registers as
    # shipped. Its arithmetic is checked on the C target (cpu_lazy_rescale below, a backend
    # for hils-swa conform; tests/test_tilelang_cpu.py).
    # (built on launch.shipped_config: it moves with it, hoist_keys included since session 46)
    "lazy8": (lambda D: _full(_launch().shipped_config(D, D), lazy_rescale=8),
              "launch.shipped_config with lazy_rescale=8 (kernels.LAZY_RESCALES): a row keeps its "
              "reference while the tile max moves less than 2**8, warps whose rows all kept it "
              "skip the output rescale",
              "D128 rows +0..+5%, D64 rows +0..+3% (the multiplies skipped on most tiles after "
              "the first few; against: a vote and a branch a tile, and the first tiles of each "
              "row still rescale); decode-class calls not in this variant"),
    # Session 44 (written on the CPU): the tile test of mask_split (macros.tile_inside_windows)
    # compares each key tile with the last row's left edge, a runtime floor division by the
    # chunk (with expand_to_chunk) that nvcc leaves in the consumer's key loop (presumably
    # because the loop may run no iteration and an integer division may trap; not checked).
    # hoist_left computes it once before the loop into a register. sm_90a CPU build, C = 64: the key loop 470 -> 436
    # instructions at D = 64 (the four-CTA tile) and 507 -> 474 at D = 128, I2F.RP / MUFU.RCP
    # gone from it, HGMMA and MUFU.EX2 unchanged, no spills, registers as shipped.
    # Shipped in session 45 (launch.TC_HOIST_LEFT): lab on an H100 at bbc3780, two runs,
    # bench_results/tilelang-lab45-h100-{1,2}.json: D128 +5.5..+6.8%, D64 +0.7..+5.3%,
    # chunked +0.0..+1.8% (best of five). Since then "hoist" is launch.shipped_config itself;
    # "nohoist" is the control.
    "hoist": (lambda D: _full(_launch().shipped_config(D, D), hoist_left=1),
              "launch.shipped_config with hoist_left=1 (kernels.HOIST_LEFT): mask_split's "
              "last-row left edge computed once before the key loop",
              "D64 rows +0..+4%, D128 rows +0..+2% (about 34 fewer instructions a tile, 7% of "
              "the key loop, on a latency-bound chain where the four CTAs' issue slots are "
              "busier than at two; against: the removed division overlapped the QK^T wgmma)"),
    # Session 45 (written on the CPU): the producer's key loop recomputes the key/value head
    # (Hq / Hkv, then by / G) and the block's first key (a floor division by the chunk) every
    # tile: runtime integer divisions nvcc leaves in the loop (session 44's SASS, D = 64: three
    # to five a tile). hoist_keys holds them (and hi, built on the first key) in registers from
    # before the loop. Shipped in session 46 (launch.TC_HOIST_KEYS): lab on the H200 at 16e5c2e,
    # three runs, bench_results/tilelang-lab46-h200-{1,2,3}.json: D128 +4.8..+5.5%, D64
    # +6.4..+17.3%, chunked +4.5..+11.3% (best of five). Since then "hkeys" is
    # launch.shipped_config itself; "nohkeys" is the control.
    "hkeys": (lambda D: _full(_launch().shipped_config(D, D), hoist_keys=1),
              "launch.shipped_config with hoist_keys=1 (kernels.HOIST_KEYS): the key/value head "
              "and the block's key range held in registers from before the key loop",
              "D64 rows +0..+3%, D128 rows +0..+2% (the producer runs a tile ahead of the "
              "consumers: its divisions cost only where it falls behind, at four CTAs an SM "
              "the likeliest)"),
    "nohoist": (lambda D: _full(_launch().shipped_config(D, D), hoist_left=0, hoist_keys=0),
                "launch.shipped_config without hoist_left (shipped until session 45; and "
                "without hoist_keys, as it was then): mask_split's last-row left edge "
                "computed in every key tile",
                "D128 rows -10..-11%, D64 rows -13..-18%, chunked -12..-13% (session 46's "
                "lab against hkeys, reversed)"),
    "nohkeys": (lambda D: _full(_launch().shipped_config(D, D), hoist_keys=0),
                "launch.shipped_config without hoist_keys (shipped in session 45): the "
                "key/value head and the block's key range recomputed where the loop uses them",
                "D128 rows -4..-5%, D64 rows -6..-15%, chunked -4..-10% (session 46's lab, "
                "reversed)"),
    # Session 47 (written on the CPU): with hoist_keys the producer's one runtime integer
    # division a tile left is the V chunk view's coordinates (k0 % C, k0 // C). Where
    # lmk_const acts at one chunk a tile (C == block_N: the lab's C = 64 on the 64-key tiles)
    # they are 0 and k0 // block_N, a shift (kernels.VC_SHIFT).
    "vshift": (lambda D: _full(_launch().shipped_config(D, D), vc_shift=1),
               "launch.shipped_config with vc_shift=1 (kernels.VC_SHIFT): the V chunk view's "
               "tile coordinates as a shift where C == block_N, no runtime division in the "
               "producer's loop",
               "D64 rows +1..+8%, D128 rows +1..+4%, chunked +0..+4% (the producer's one "
               "MUFU.RCP a tile gone; its shortest back branch 109 -> 62 instructions at "
               "D = 64, 117 -> 77 at D = 128, and nvcc unrolls the loop 4x: 190 / 255 for "
               "four tiles; hkeys took two of three divisions for D128 +5%, D64 +6..+17%)"),
    "occ3-64x64v-slack8": (lambda D: _occ3(D, reg_slack=8),
                           "occ3-64x64v with consumers at 128 registers (8 below the pool's "
                           "exact fill at 136); D=128: nohoist",
                           "D64: no hang if the exact fill caused occ3's; within -3..0% of "
                           "occ3-64x64v's speed (no spills at 128: the CPU build); D128 = nohoist"),
}


def _cpu_with(q, k, v, knobs, **kw):
    """``tilelang_impl.sliding_window_attention`` on CPU tensors with its CPU kernel built with
    the lab ``knobs`` (names of ``kernels.fwd_cpu``'s arguments) set: the launch of
    ``launch.run_cpu`` (``launch.cpu_kernel_args``) with them. A knob the kernel refuses beside
    the call's other knobs (``kernels._check_knobs``) makes the call ``UnsupportedConfig``."""
    from tilelang_impl import api, kernels
    launch = _launch()
    kw = dict(dict(mask_lmk=True, expand_to_chunk=True, kv_start=0, sm_scale=None), **kw)
    p = api._problem(q, k, v, kw["window_size"], kw["chunk_size"], kw["mask_lmk"],
                     kw["expand_to_chunk"], kw["kv_start"], kw["sm_scale"], devices=("cpu",))
    if p.empty:
        return p.new_outputs()

    def run(kp, q_, k_, v_, q_blhd, kv_blhd, o32, lse):  # launch.run_cpu with the knobs
        args, named, runtime = launch.cpu_kernel_args(kp, q_blhd, kv_blhd, launch.o_cols(kp, o32))
        try:
            ker = kernels.fwd_cpu(*args, **{**named, **knobs})
        except ValueError as e:  # kernels._check_knobs: a lab knob these head dims' knobs refuse
            from reference import UnsupportedConfig
            raise UnsupportedConfig(f"Dqk={kp.Dqk}, Dv={kp.Dv}: {e}") from e
        ker(q_, k_, v_, o32, lse, *runtime)
    return api._run(p, q, k, v, run_cpu=run)


def cpu_lazy_rescale(q, k, v, **kw):
    """The CPU kernel built with ``lazy_rescale = 8`` (the ``lazy8`` variant's arithmetic on
    the C target, :func:`_cpu_with`): a backend for ``hils-swa conform --backend
    lazy8=tools.lab_tilelang:cpu_lazy_rescale --device cpu``."""
    return _cpu_with(q, k, v, dict(lazy_rescale=8), **kw)


def cpu_hoist_left(q, k, v, **kw):
    """The CPU kernel built with ``hoist_left = 1`` for every call (the ``hoist`` variant's tile
    test on the C target, :func:`_cpu_with`; the public CPU path bakes it for ``Lq > 64``
    only, as the GPU's prefill grid does, ``launch.cpu_kernel_args``; ``UnsupportedConfig`` at head dims whose CPU knobs lack
    ``mask_split``, above 128): a backend for ``hils-swa conform --backend hoist=tools.lab_tilelang:cpu_hoist_left --device
    cpu``."""
    return _cpu_with(q, k, v, dict(hoist_left=1), **kw)


def _occ2_128x64(D, stages):
    """Session 26's occ2-128x64 variants: at D <= 64 the shipped knobs on a 128x64 tile of two
    consumer warp groups (256 threads), ``stages`` deep, two CTAs per SM, v through the chunk
    view (span 1 at C = 64); above, the shipped config (its accumulators need more than the
    104 registers a consumer thread gets)."""
    cfg = _ship(D)
    if D > 64:
        return _full(cfg)
    return _full((128, 64, stages, 256) + tuple(cfg[4:]), min_blocks=2, v_chunk=True)


def _occ(D, tile, stages, min_blocks):
    """The shipped knobs of head dim D on a ``tile`` with one consumer warp group (128
    threads), ``stages`` and the ``min_blocks`` occupancy knob; without the chunk view of
    v (session 12's variants, measured before it existed)."""
    cfg = _ship(D)
    return _full(tuple(tile) + (stages, 128) + tuple(cfg[4:]), min_blocks=min_blocks,
                 v_chunk=False)


def _session11(D):
    """The prefill config shipped for head dim D <= 128 before session 12: SESSION11_TILE
    with the knobs of launch.tc_knobs (unchanged since session 5), one CTA per SM."""
    return SESSION11_TILE + _launch().tc_knobs(D, D)


def _pack_prefill(D):
    return _full(_session11(D), lmk_rows_j0=D > 64, pack=True)

# Correctness cases: (name, D, flags (mask_lmk, expand), kwargs). All bf16, prefill grid.
BASE = dict(window_size=100, chunk_size=16, kv_start=3)
CASES = [
    ("D128 GQA4/2 L700 C16 nan", 128, (True, True),
     dict(B=2, Hq=4, Hkv=2, Lq=700, Lk=700, nan_slots=True, tail_nan=True, **BASE)),
    ("D128 W512 C64 L2048 nan", 128, (True, True),
     dict(B=1, Hq=4, Hkv=4, Lq=2048, Lk=2048, window_size=512, chunk_size=64, kv_start=0,
          nan_slots=True)),
    ("D128 Lq<Lk kv_start=1e6+3 GQA8/2 nan", 128, (True, True),
     dict(B=2, Hq=8, Hkv=2, Lq=300, Lk=1000, window_size=200, chunk_size=64, kv_start=10**6 + 3,
          nan_slots=True, tail_nan=True)),
    ("D128 lmk=F exp=T Lq<Lk nan", 128, (False, True),
     dict(B=1, Hq=4, Hkv=1, Lq=257, Lk=600, window_size=37, chunk_size=16, kv_start=5,
          nan_slots=True, tail_nan=True)),
    ("D128 lmk=T exp=F C7", 128, (True, False),
     dict(B=1, Hq=4, Hkv=1, Lq=517, Lk=517, window_size=37, chunk_size=7, kv_start=0,
          nan_slots=True)),
    ("D128 lmk=F exp=F", 128, (False, False),
     dict(B=1, Hq=4, Hkv=2, Lq=517, Lk=517, window_size=90, chunk_size=16, kv_start=0,
          tail_nan=True)),
    ("D128 chunk_size=1 empty rows", 128, (True, True),
     dict(B=1, Hq=2, Hkv=2, Lq=200, Lk=200, window_size=8, chunk_size=1, kv_start=0)),
    ("D64 GQA8/2 Lq<Lk C32 nan", 64, (True, True),
     dict(B=1, Hq=8, Hkv=2, Lq=300, Lk=1000, window_size=64, chunk_size=32, kv_start=5,
          nan_slots=True, tail_nan=True)),
    ("D64 W512 C64 L1500 nan", 64, (True, True),
     dict(B=2, Hq=4, Hkv=1, Lq=1500, Lk=1500, window_size=512, chunk_size=64, kv_start=0,
          nan_slots=True)),
    ("D64 lmk=F exp=F", 64, (False, False),
     dict(B=1, Hq=4, Hkv=4, Lq=333, Lk=333, window_size=50, chunk_size=16, kv_start=0)),
    # one landmark column per 128-key tile at most (lmk_cols = 1 with the lmkcols variant)
    ("D128 C192 Lq<Lk kv_start=777 nan", 128, (True, True),
     dict(B=1, Hq=4, Hkv=2, Lq=400, Lk=1100, window_size=300, chunk_size=192, kv_start=777,
          nan_slots=True, tail_nan=True)),
    # C == block_N at D128 (one landmark row per tile at most, lmk_cols = 1) and the
    # frame's C = Lk + 1 at D128 (landmark-row zeroing of lmkj0 with one row or none)
    ("D128 C128 kv_start=5 nan", 128, (True, True),
     dict(B=1, Hq=4, Hkv=2, Lq=500, Lk=900, window_size=260, chunk_size=128, kv_start=5,
          nan_slots=True, tail_nan=True)),
    ("D128 C=1e6 frame Lk+1 nan", 128, (True, True),
     dict(B=1, Hq=4, Hkv=2, Lq=300, Lk=700, window_size=200, chunk_size=10**6, kv_start=999,
          nan_slots=True, tail_nan=True)),
    # chunk longer than every position: kernel frame C = Lk + 1, no landmark on a key
    ("D64 C=1e6 frame Lk+1 nan", 64, (True, True),
     dict(B=1, Hq=4, Hkv=1, Lq=300, Lk=900, window_size=100, chunk_size=10**6, kv_start=12345,
          nan_slots=True, tail_nan=True)),
    # sm_scale: positive (scale_fold baked), zero and negative (scale_fold off, the scale
    # stays in the mask select; masked scores must stay -inf)
    ("D128 W512 C64 sm_scale=0.37 nan", 128, (True, True),
     dict(B=1, Hq=4, Hkv=2, Lq=1100, Lk=1300, window_size=512, chunk_size=64, kv_start=7,
          nan_slots=True, tail_nan=True, sm_scale=0.37)),
    ("D128 W300 C64 sm_scale=0 nan", 128, (True, True),
     dict(B=1, Hq=4, Hkv=2, Lq=700, Lk=900, window_size=300, chunk_size=64, kv_start=3,
          nan_slots=True, sm_scale=0.0)),
    ("D64 W300 C64 sm_scale=-0.2 nan", 64, (True, True),
     dict(B=1, Hq=4, Hkv=1, Lq=700, Lk=900, window_size=300, chunk_size=64, kv_start=3,
          nan_slots=True, tail_nan=True, sm_scale=-0.2)),
    # calls the chunk view of v serves (launch.v_chunk_call: r = 0, Lk a multiple of C)
    ("D64 GQA4/1 W512 C64 L2048 view nan", 64, (True, True),
     dict(B=1, Hq=4, Hkv=1, Lq=2048, Lk=2048, window_size=512, chunk_size=64, kv_start=0,
          nan_slots=True, tail_nan=True)),
    ("D64 Lq<Lk kv_start=64 C64 Lk=1088 view nan", 64, (True, True),  # a tile past Lk
     dict(B=2, Hq=4, Hkv=2, Lq=333, Lk=1088, window_size=300, chunk_size=64, kv_start=64,
          nan_slots=True, tail_nan=True)),
    ("D128 Lq<Lk kv_start=128 C64 view nan", 128, (True, True),
     dict(B=2, Hq=4, Hkv=2, Lq=300, Lk=1024, window_size=200, chunk_size=64, kv_start=128,
          nan_slots=True, tail_nan=True)),
    # C = 2 block_N and 4 block_N on the long calls' 64-key tiles (a landmark in every other /
    # fourth tile: launch.lmk_const_acts refuses them, the shipped kernel tests the columns
    # against j0 there; written for session 28's 128-key D = 64 tile, where C = 128 was one
    # chunk a tile)
    ("D64 C128 view kv_start=256 nan", 64, (True, True),
     dict(B=1, Hq=4, Hkv=2, Lq=700, Lk=1280, window_size=400, chunk_size=128, kv_start=256,
          nan_slots=True, tail_nan=True)),
    ("D64 C256 view nan", 64, (True, True),
     dict(B=1, Hq=4, Hkv=1, Lq=640, Lk=1024, window_size=300, chunk_size=256, kv_start=0,
          nan_slots=True, tail_nan=True)),
    ("D128 lmk=F sm_scale=-0.1", 128, (False, True),
     dict(B=1, Hq=4, Hkv=2, Lq=600, Lk=600, window_size=300, chunk_size=64, kv_start=0,
          nan_slots=True, sm_scale=-0.1)),
    ("D64 lmk=F exp=F sm_scale=0.5", 64, (False, False),
     dict(B=1, Hq=4, Hkv=4, Lq=600, Lk=600, window_size=300, chunk_size=64, kv_start=0,
          tail_nan=True, sm_scale=0.5)),
]

# Timed shapes: (name, B, Hq, Hkv, Lq, Lk, D); bf16, W=512, C=64, both flags on.
SHAPES = [
    ("H32 D128 L8K", 1, 32, 32, 8192, 8192, 128),
    ("H32 D128 L16K", 1, 32, 32, 16384, 16384, 128),
    ("GQA32/4 D64 L8K", 1, 32, 4, 8192, 8192, 64),
    ("GQA16/2 D64 L8K", 1, 16, 2, 8192, 8192, 64),
    ("B4 GQA32/4 D64 L4K", 4, 32, 4, 4096, 4096, 64),
    ("chunk Lq512/Lk8K H32 D128", 1, 32, 32, 512, 8192, 128),
]
W_T, C_T = 512, 64
FLOOR_BF16 = 2e-2

# ---------------------------------------------------------------------------------------
# Decode variants (session 5, for the decode targets; names start with "dec-"): name ->
# (head dim D -> (config, split-KV?), what it changes, prediction written before any GPU
# run). A split variant always splits (S >= 2 by the launcher's rule, session 5's or
# forced: :func:`_splits`), so it runs one kernel per call shape plus the combine; a
# non-split one runs the prefill grid.
# Checked on DECODE_CASES, timed on DECODE_SHAPES (microseconds). Every config below was
# compiled for sm_90a on CPU first (session 5): the Dv = 64 split variant lowers with
# landmark rows and the full mask, not with session 5's split knobs (SESSION5_SPLIT).
# Measured on the H200 before (bench, L2 flushed, d0de4f1): TileLang 27.4 us at B=1
# 32/32/128 8K (split 128x64 shipped), 15.7 us B=1 GQA 32/4 D=64 8K and 28.7 us B=8 GQA
# 32K (prefill grid); Triton 12.7 / 9.0 / 10.4 us.
# Run: --only dec-s5,dec-shipped,dec-prefill,dec-p64x128
# ---------------------------------------------------------------------------------------
# Frozen on purpose (the lab's variants stay what they were when measured, even where
# they equal a launch constant today: SPLIT_KNOBS_S5 == launch.SPLIT_KNOBS, the tile of
# dec-p64x128 == launch.SHORT_Q_TILE, the D <= 64 decode tile until session 12).
SPLIT_KNOBS_S5 = ("rows", False, False, 2, True, True, True)
#: The split-KV kernel shipped d0de4f1..4e2da01 (then launch.SPLIT_CONFIG + SPLIT_KNOBS),
#: taken for Dv 96 / 128 with S = ceil(2 * SMs / programs) splits (``"s5"``, :func:`_splits`).
SESSION5_SPLIT = (128, 64, 2, 256) + ("tile", False, False, 2)
SESSION5_SPLIT_DV = (96, 128)


def _dec_shipped(D):
    """What run_cuda picks for a decode call (Dqk = Dv = D) today with
    ``expand_to_chunk`` or without ``mask_lmk`` (a lab config depends on D only:
    the launcher's other split kernel, for mask_lmk without expand_to_chunk, is
    session 5's, ``dec-s5``; no D = 128 decode case has that flag pair). Where the
    launcher would not split a D = 128 shape (B=8 GQA 32/8: 256 programs) this
    variant still does; the launcher runs ``dec-pack`` there (session 7). At
    D <= 64 the pack permission is on, as ``launch.prefill_config`` sets it for every
    lab decode call (G * Lq <= 24 rows; G = 1 packs nothing)."""
    launch = _launch()
    if launch.splits_at(D, D):
        return launch.split_config(D, D), True
    return _full(launch.short_config(D, D), pack=True), False  # decode cases: Lq <= 3


def _dec_session5(D):
    """What run_cuda picked for a decode call from d0de4f1 to 4e2da01 (at D <= 64 the
    128x128 tile, here with the knobs shipped since session 5)."""
    if D in SESSION5_SPLIT_DV:
        return SESSION5_SPLIT, "s5"
    return _full(_session11(D)), False


def _dec_forced(S, small=False):
    """Split-KV with ``S`` splits forced (capped by the reachable key tiles; ``"s5"``:
    session 5's rule, :func:`_splits`): session 5's
    split kernel at D > 64 (``small``: dec-split-64's 64x64 tile), dec-split-knobs'
    128x64 tile at D = 64 (the Dv = 64 split variant that lowers)."""
    def cfg(D):
        if D <= 64:
            return SESSION5_SPLIT[:4] + SPLIT_KNOBS_S5, S
        if small:
            return (64, 64, 2, 128) + SPLIT_KNOBS_S5, S
        return SESSION5_SPLIT, S
    return cfg


def _dec_vchunk(D):
    """:func:`_dec_shipped` with the chunk view of v permitted for tiles of up to two
    chunks (session 26): the split-KV kernel at D > 64 too, which had no permission as
    shipped until session 28 (``launch.split_config``); since then the same kernels as
    ``dec-shipped``."""
    cfg, split = _dec_shipped(D)
    return _full(cfg, v_chunk=2), split


# In bench_results/tilelang-lab6-4e2da01.json and -lab7-4e2da01.json "dec-shipped" is
# what "dec-s5" is now (those runs predate session 6's split change).
DECODE_VARIANTS = {
    "dec-s5": (_dec_session5,
               "as shipped in session 5: split-KV 128x64 (whole V tile zeroed, lmk_cols) for "
               "Dv 96/128 with about two programs per SM, the prefill grid otherwise",
               "reference point (L2 not flushed: below the bench's 27.4 / 15.7 / 28.7 us)"),
    "dec-shipped": (_dec_shipped,
                    "as shipped: split-KV for Dv 96/128 (launch.split_config, "
                    "one wave of programs), the prefill grid otherwise (D=64: the 64-row "
                    "tile, launch.SHORT_Q_TILE until session 12, launch.tc_config since; GQA-packed "
                    "since session 7)",
                    "D128 as dec-64-s4 in lab7 (12.0 us at B=1); D64 as dec-p64x128 in lab8 "
                    "(9.8 / 18.6 us)"),
    "dec-vchunk": (_dec_vchunk,
                   "dec-shipped with v through the chunk view, up to two chunks a tile "
                   "(session 26): D=128's split kernel (64-key tiles, one chunk each at C=64) "
                   "no longer zeroes V's landmark rows in shared memory (the general form: "
                   "lmk_rows_j0 does not lower there), D=64's packed prefill-grid decode reads "
                   "its 128-key tiles as two chunks",
                   "D128 B=1: -0.5..-1.5 us (12.0 us; about 1.5 us per key tile of a split, the "
                   "zeroing's barriers and fence part of it); D64 decodes within 0.5 us; "
                   "measured 9.1 -> 7.9 us and -0.8 us (session 28) and shipped: equal to "
                   "'dec-shipped' since"),
    "dec-prefill": (lambda D: (_full(_ship(D)), False),
                    "the prefill grid with the prefill knobs at every head dim",
                    "D128 B=1: slower than split (32 programs for 132 SMs, each 5 key tiles "
                    "in series): +30-80% time; D64 = dec-s5"),
    "dec-split-knobs": (lambda D: (SESSION5_SPLIT[:4] + SPLIT_KNOBS_S5, "s5"),
                        "split-KV 128x64 with landmark rows of V, fast_exp2, scale_fold, win_u32 "
                        "(full mask: the split mask does not lower); at Dv=64 split-KV for the "
                        "first time",
                        "D128: -5-15% time vs dec-s5 (cheaper tile, same launches); D64 B=1: "
                        "15.7 -> 8-11 us (9x the programs, one key tile each), B=8: -30-50%"),
    "dec-split-64": (_dec_forced("s5", small=True),
                     "dec-split-knobs on a 64x64 tile with one consumer warp group (decode "
                     "rows are G * Lq <= 8 of the tile's rows: half the wasted MMA rows); "
                     "D > 64 only: at Dv=64 this tile does not lower without expand_to_chunk "
                     "(ThreadSync, CPU compile), so D=64 runs dec-split-knobs' tile",
                     "D128: -10-30% time vs dec-split-knobs (smaller CTAs, more resident per "
                     "SM); D64 = dec-split-knobs"),
}


# Session 6, after the first decode lab (bench_results/tilelang-lab6-4e2da01.json, L2 not
# flushed): the prefill grid beat split-KV at D=128 B=1 (16.6 vs 23.1 us; predicted the
# other way) and every split variant ran S = 9 (288 programs for 132 SMs). Model: a
# program costs a fixed start/epilogue F plus ~1.5-3 us per key tile; S = 9 gives
# three waves of programs with one or two tiles each, so F dominates. Fewer splits,
# one wave: predicted below. The B=8 shape (256 programs unsplit) stays on the
# prefill grid in the launcher whatever this finds (forced splits only add waves).
DECODE_VARIANTS.update({
    "dec-s2": (_dec_forced(2), "session-5 split kernel (D128), S = 2 (64 programs at B=1 H=32)",
               "D128 B=1: 12-17 us (two waves' worth of tiles in one: 6 tiles per program); "
               "D64 B=1 ~ dec-prefill (13 us)"),
    "dec-s4": (_dec_forced(4), "session-5 split kernel (D128), S = 4 (128 programs, one wave)",
               "D128 B=1: 11-15 us (best of the S sweep); D64 B=1: 9-12 us"),
    "dec-s6": (_dec_forced(6), "session-5 split kernel (D128), S = 6 (192 programs)",
               "D128 B=1: 14-19 us (between S=4 and the shipped S=9)"),
    "dec-64-s2": (_dec_forced(2, small=True), "64x64 split tile (D128), S = 2",
                  "D128 B=1: 10-15 us (half the MMA rows of 128x64 per key tile)"),
    "dec-64-s4": (_dec_forced(4, small=True), "64x64 split tile (D128), S = 4",
                  "D128 B=1: 9-14 us"),
})


def _dec_prefill_rows(tile):
    """The prefill grid on a 64-row tile with the prefill knobs at D = 64 (one consumer
    warp group); D = 128 as shipped (``dec-shipped``)."""
    def cfg(D):
        if D <= 64:
            launch = _launch()
            return _full(tile + launch.tc_knobs(D, D)), False
        return _dec_shipped(D)
    return cfg


# Session 6, after lab7 (split-KV S=4 shipped): B=8 GQA 32/4 D=64 decode stays on the
# prefill grid, 256 programs of 128 rows with two consumer warp groups, one CTA per SM
# (registers): two waves for one real row per program. A 64-row tile with one consumer
# warp group lowers at D = 64 (CPU compile) and may fit two CTAs per SM.
DECODE_VARIANTS.update({
    "dec-p64x128": (_dec_prefill_rows((64, 128, 2, 128)),
                    "D64: prefill grid on 64x128 tiles, one consumer warp group",
                    "D64 B=8 GQA: 25.2 -> 13-18 us (one wave if two CTAs fit per SM); "
                    "B=1 GQA: 13.1 -> 11-13 us (half the MMA rows)"),
    "dec-p64x64": (_dec_prefill_rows((64, 64, 2, 128)),
                   "D64: prefill grid on 64x64 tiles, one consumer warp group",
                   "D64 B=8 GQA: 25.2 -> 13-20 us (as dec-p64x128, twice the key tiles); "
                   "B=1 GQA: 12-15 us"),
})



def _dec_pack(split):
    """GQA-packed rows (the ``pack`` knob: one program per KV head and batch whose
    tile rows are its G query heads' queries; every lab decode case and shape has
    G * Lq <= 64). ``split``: at D = 64 split-KV on 128x64 with session 5's split-knob
    set (the split tile that lowers at Dv = 64 for the lab's flag pairs), one wave of
    packed programs (``"pack"``); at D = 128 ``dec-shipped`` (the packed 64x64 split
    tile fails ThreadSync on CPU, and the D = 128 shapes have G = 1). Else the
    prefill grid on the shipped prefill tile (launch.tc_config; D = 64: 64x128 with one
    consumer warp group, as launch.SHORT_Q_TILE was before session 12), packed at every D."""
    def cfg(D):
        if split and D > 64:
            return _dec_shipped(D)
        if split:
            return _full(SESSION5_SPLIT[:4] + SPLIT_KNOBS_S5, pack=True), "pack"
        return _full(_ship(D), pack=True), False
    return cfg


# Session 6, written after lab8 and not run on a GPU (the session's device time was
# spent): GQA-packed decode. At B=8 GQA 32/4 D=64 the shipped short tile runs 256
# programs, each reading its KV head's whole window for one query row; packed, 32
# programs read each window once for 8 rows. Every kernel below compiles for sm_90a
# on CPU (tests/test_tools_lab_tilelang.py lists them); predictions written first.
# Measured at 9164139 (session 7, bench_results/tilelang-lab9-9164139.json, L2 not
# flushed): dec-pack B=8 GQA 18.3 -> 10.8 us, B=1 GQA 9.7 -> 10.6 us; at D = 128 with
# G = 1, 37.8 us against 12.4 (split) and ~16.6 (prefill grid). The packed kernel of that
# tree loaded Q and stored O element by element with an int64 division and modulo by
# the runtime Lq per element (row i = head i // Lq, query i % Lq) and took i % Lq per
# score in the mask: at D = 128, 64 elements of Q and O per thread each way. Session 7
# bakes G (``pack = G``, rows query by query: query i // G, head i % G, shifts for a
# power-of-two G) and drops the pack at G = 1. Predictions for that kernel:
DECODE_VARIANTS.update({
    "dec-pack": (_dec_pack(False),
                 "GQA-packed rows on the prefill grid (one program per KV head and batch), "
                 "G baked (session 7)",
                 "D64 B=8 GQA: 10.8 -> 6-9 us, B=1 GQA: 10.6 -> 6-9 us (no per-element "
                 "division); D128 G=1: = dec-prefill (pack dropped); D128 B=8 GQA 32/8: "
                 "-30-50% vs dec-shipped (64 programs instead of 256 on 132 SMs)"),
    "dec-pack-split": (_dec_pack(True),
                       "GQA-packed rows on split-KV, one wave of packed programs",
                       "D64 B=8 GQA: 18.6 -> 7-11 us (128 programs, ~2.5 key tiles each); "
                       "B=1 GQA: 9.8 -> 6-9 us (40 programs, one key tile each); D128: as "
                       "dec-shipped (12.0 us). Measured at 9164139: 15.4 / 13.7 us; session 7 "
                       "(G baked): 8-12 / 7-10 us"),
})


def _dec_occ(S, min_blocks=2):
    """Session 12: the shipped split-KV kernel (Dv 96 / 128) with the ``min_blocks`` knob
    and ``S`` splits (an int: forced; ``"occ2"``: one wave of two CTAs per SM,
    :func:`_splits`); at D = 64 what ships (the packed prefill grid, a noise check)."""
    def cfg(D):
        launch = _launch()
        if not launch.splits_at(D, D):
            return _dec_shipped(D)
        return _full(launch.split_config(D, D), min_blocks=min_blocks), S
    return cfg


# Session 12, after the prefill grid went to two CTAs per SM (lab15): the split-KV kernel
# (64x64, one consumer warp group) still runs one CTA per SM, and its split count fills
# one wave of 132 programs (B=1 32/32/128: S = 4, each split 2-3 of the window's ~10
# key tiles, one program per SM). With two CTAs per SM, twice the splits fit one wave.
# Measured before (lab, L2 not flushed): dec-shipped B=1 32/32/128 12.0 us (8K / 128K).
# CPU compile: the split kernel with min_blocks=2 at 128 registers, no spills.
# Run: --only dec-shipped,dec-occ2,dec-occ2-s8,dec-s8
DECODE_VARIANTS.update({
    "dec-occ2": (_dec_occ("wave"),
                 "shipped split-KV with two CTAs per SM, the launcher's split count (S = 4 "
                 "at B=1 32/32/128: 128 programs, under one per SM)",
                 "D128 B=1: 12.0 -> 11.5-12.5 us (occupancy unused at 128 programs); D64 = "
                 "dec-shipped (+-3%)"),
    "dec-occ2-s8": (_dec_occ("occ2"),
                    "shipped split-KV with two CTAs per SM and one wave of them (S = 8 at "
                    "B=1 32/32/128: 256 programs, each 1-2 key tiles)",
                    "D128 B=1: 12.0 -> 10.0-11.5 us (-5..-15%: a shorter key loop per "
                    "program, its partial written in the same wave); D64 = dec-shipped"),
    "dec-s8": (_dec_occ("occ2", min_blocks=0),
               "shipped split-KV, one CTA per SM, the split count of dec-occ2-s8 (two waves)",
               "D128 B=1: 12.0 -> 12-14 us (a second wave); D64 = dec-shipped"),
})



def _dec_nolmkconst(D):
    """The control of ``lmk_const`` in decode (``launch.lmk_const_acts``): what
    ``dec-shipped`` runs without it: the split-KV kernel (Dv 96 / 128; with it since
    session 40) and D <= 64's packed prefill-grid decode (with it since ebd1760)."""
    shipped, split = _dec_shipped(D)
    return _full(shipped, lmk_const=False), split


# Session 39 (written on the CPU): ebd1760 ships lmk_const in the prefill config, measured on
# prefill shapes only (+1..+9%); D = 64 decode runs that config packed, and the split-KV
# kernel (64-key tiles, the view at C = 64: one landmark column, K * C == block_N) could take
# it too (SASS, sm_90a, CPU, `python -m tools.sass_loops --D 128 --variant dec-shipped
# --variant dec-nolmkconst` since session 40: the split kernel's key loop 464 instructions
# with it, 514 without). Predicted: within +-0.2 us either way (decode bound by the programs'
# fixed cost and the window's bytes, about 2-3 key tiles a program).
# Run (session 40, 9aefa69, H100, four runs, L2 not flushed; the variant then named
# "dec-lmkconst", the split kernel with it, against dec-shipped without): D = 128 split
# 8.2-8.8 -> 8.0-8.2 us (B=1 8K), 8.2-8.6 -> 7.9-8.2 (128K), 20.7-20.9 -> 19.3-19.8 (B=8
# GQA 32/8 32K), +3..+7% in every run, past the prediction; shipped in launch.split_config.
# Every split decode variant built on launch.split_config (dec-vchunk, dec-occ2, dec-occ2-s8,
# dec-s8 and the rest) takes lmk_const since 6baba3e where the call allows it, those built
# on the prefill config since ebd1760: their figures from before then ran without it.
# D = 64 (one run, dec-shipped against this control): B=1 GQA 32/4 8K 6.8 against 8.1 us,
# B=8 32K 7.1 against 8.2 (-15%, -13%: ebd1760's unmeasured gain on decode).
def _dec_allwarps(D):
    """``dec-shipped`` with the producer's four warps in the key loop (session 41's control
    of ``producer_guard`` in decode)."""
    shipped, split = _dec_shipped(D)
    return _full(shipped, producer_warps=4), split


DECODE_VARIANTS.update({
    "dec-allwarps": (_dec_allwarps,
                     "dec-shipped with the producer's four warps in the key loop (before "
                     "session 41's producer guard)",
                     "within +-0.2 us of dec-shipped"),
    "dec-nolmkconst": (_dec_nolmkconst,
                       "dec-shipped without lmk_const: split-KV (D128) and D64's packed "
                       "prefill-grid decode",
                       "D128: +0..+0.2 us against dec-shipped (session 39's prediction for "
                       "the split kernel's lmk_const, turned round); D64: +0..+0.2 us"),
})

# Session 8's decode variants "dec-pdl" (the combine as a programmatic dependent launch:
# 12.1 / 12.1 us against 12.0 / 12.0 at ab58094, lab12; with the cython launcher 12.1 /
# 12.0 / 9.3 / 9.4 against 12.0 / 11.9 / 9.3 / 9.5 at 92218e9, lab14) and "dec-m16"
# (16-row mma.sync split tiles: 38.7 / 24.3 / 25.1 us against 12.0 at c5b4012, lab13) were
# removed with their kernel knobs in session 9; their code is in 92218e9.

# Decode correctness cases (name, D, flags, kwargs): split-KV paths, NaN in every unseen
# slot, kernel-frame chunks giving lmk_cols 0, 1 (C=64 on 64-key tiles) and the frame's
# C = Lk + 1; no case with both flags off (session 5's split variants did not lower it).
DECODE_CASES = [
    ("dec D128 GQA8/2 Lq1 C64 kv=1e6+3 nan", 128, (True, True),
     dict(B=2, Hq=8, Hkv=2, Lq=1, Lk=3000, window_size=300, chunk_size=64, kv_start=10**6 + 3,
          nan_slots=True, tail_nan=True)),
    ("dec D64 GQA8/2 Lq1 C64 nan", 64, (True, True),
     dict(B=2, Hq=8, Hkv=2, Lq=1, Lk=3000, window_size=300, chunk_size=64, kv_start=7,
          nan_slots=True, tail_nan=True)),
    ("dec D128 Lq3 C16 nan", 128, (True, True),
     dict(B=1, Hq=4, Hkv=2, Lq=3, Lk=2000, window_size=200, chunk_size=16, kv_start=5,
          nan_slots=True)),
    ("dec D64 Lq3 C16 nan", 64, (True, True),
     dict(B=1, Hq=4, Hkv=2, Lq=3, Lk=2000, window_size=200, chunk_size=16, kv_start=5,
          nan_slots=True)),
    ("dec D64 Lq1 C32 sm_scale=-0.2 nan", 64, (True, True),
     dict(B=1, Hq=8, Hkv=1, Lq=1, Lk=1500, window_size=500, chunk_size=32, kv_start=0,
          nan_slots=True, sm_scale=-0.2)),
    ("dec D128 lmk=F exp=T Lq2", 128, (False, True),
     dict(B=1, Hq=4, Hkv=4, Lq=2, Lk=1200, window_size=300, chunk_size=64, kv_start=3)),
    ("dec D64 lmk=T exp=F Lq1 nan", 64, (True, False),
     dict(B=1, Hq=4, Hkv=2, Lq=1, Lk=1200, window_size=300, chunk_size=64, kv_start=3,
          nan_slots=True)),
    ("dec D128 chunk_size=1 empty rows", 128, (True, True),
     dict(B=1, Hq=4, Hkv=4, Lq=2, Lk=100, window_size=8, chunk_size=1, kv_start=0)),
    ("dec D64 C=1e6 frame Lk+1 nan", 64, (True, True),
     dict(B=1, Hq=4, Hkv=1, Lq=1, Lk=900, window_size=400, chunk_size=10**6, kv_start=12345,
          nan_slots=True, tail_nan=True)),
    # calls the chunk view of v serves (launch.v_chunk_call; session 26's dec-vchunk)
    ("dec D128 GQA8/2 Lq1 C64 Lk=3008 view nan", 128, (True, True),
     dict(B=2, Hq=8, Hkv=2, Lq=1, Lk=3008, window_size=300, chunk_size=64, kv_start=128,
          nan_slots=True, tail_nan=True)),
    ("dec D64 GQA8/2 Lq2 C64 Lk=4032 view nan", 64, (True, True),
     dict(B=2, Hq=8, Hkv=2, Lq=2, Lk=4032, window_size=500, chunk_size=64, kv_start=0,
          nan_slots=True, tail_nan=True)),
]

# Decode timed shapes: (name, B, Hq, Hkv, Lq, Lk, D); bf16, W=512, C=64, both flags on.
DECODE_SHAPES = [
    ("dec B1 H32 D128 8K", 1, 32, 32, 1, 8192, 128),
    ("dec B1 H32 D128 128K", 1, 32, 32, 1, 131072, 128),
    ("dec B1 GQA32/4 D64 8K", 1, 32, 4, 1, 8192, 64),
    ("dec B8 GQA32/4 D64 32K", 8, 32, 4, 1, 32768, 64),
    # since session 7 (packed decode at D = 128 needs a GQA shape there)
    ("dec B8 GQA32/8 D128 32K", 8, 32, 8, 1, 32768, 128),
]


def _tables(name):
    """``(plan, correctness cases, timed shapes)`` of a variant; ``plan(D) -> (config,
    split)`` (split as :func:`_splits` takes it; False for prefill variants)."""
    if name in DECODE_VARIANTS:
        return DECODE_VARIANTS[name][0], DECODE_CASES, DECODE_SHAPES
    fn = VARIANTS[name][0]
    return (lambda D: (fn(D), False)), CASES, SHAPES


def _meta_problem(Lq, Lk, window_size, chunk_size, kv_start, mask_lmk=True,
                  expand_to_chunk=True):
    import torch
    from reference.validation import check_inputs
    q = torch.empty((1, 1, Lq, 64), device="meta")
    k = torch.empty((1, 1, Lk, 64), device="meta")
    return check_inputs(q, k, k, window_size=window_size, chunk_size=chunk_size,
                        kv_start=kv_start, mask_lmk=mask_lmk, expand_to_chunk=expand_to_chunk)


def frame_chunk(Lq, Lk, window_size, chunk_size, kv_start, **_):
    """The kernel-frame chunk ``C`` of a call (``launch.frame``), which decides the
    ``lmk_cols`` the launcher bakes."""
    from tilelang_impl import launch
    return launch.frame(_meta_problem(Lq, Lk, window_size, chunk_size, kv_start))[2]


def view_call(flags, Lq, Lk, window_size, chunk_size, kv_start, **_):
    """``launch.v_chunk_call`` of a call with ``flags = (mask_lmk, expand_to_chunk)``
    (decides the ``v_chunk`` permission)."""
    from tilelang_impl import launch
    return launch.v_chunk_call(_meta_problem(Lq, Lk, window_size, chunk_size, kv_start, *flags))


def scale_log2(D, sm_scale=None, **_):
    """The kernel's ``scale_log2`` of a call (decides ``scale_fold``)."""
    from reference.validation import default_scale
    from tilelang_impl import launch
    return (default_scale(D) if sm_scale is None else sm_scale) * launch.LOG2E


def kernel_jobs(variants):
    """Every (variant, kind, factory args) the lab launches (one per distinct kernel of
    a variant); D, flags, kernel-frame chunk and scale from the variant's cases and
    shapes (:func:`_tables`); split variants add the combine kernel."""
    from tilelang_impl import launch
    jobs = []
    for name in variants:
        plan, cases, shapes = _tables(name)
        need = {(D, f, frame_chunk(**kw), scale_log2(D, **kw), kw["Hq"] // kw["Hkv"],
                 view_call(f, **kw)) for _, D, f, kw in cases}
        need |= {(s[6], (True, True), frame_chunk(s[4], s[5], W_T, C_T, 0), scale_log2(s[6]),
                  s[2] // s[3], view_call((True, True), s[4], s[5], W_T, C_T, 0)) for s in shapes}
        seen = set()
        for D, (lmk, exp), C, sl2, group, view in sorted(need):
            cfg, split = plan(D)
            kind, args = launch.tc_kernel_key(D, D, "bfloat16", lmk, exp, False, False,
                                              cfg, C, sl2, bool(split), group, view)
            todo = [(kind, args)] + ([launch.combine_key(args)] if split else [])
            for job in todo:
                if job not in seen:
                    seen.add(job)
                    jobs.append((name,) + job)
    return jobs


def flops(B, Hq, Lq, Lk, D, W=W_T, C=C_T):
    from tools._common import attention_flops
    return attention_flops(B, Hq, Lq, Lk, D, window_size=W, chunk_size=C)


# ---------------------------------------------------------------------------------------
# compile (parent, worker processes; no CUDA needed)
# ---------------------------------------------------------------------------------------
def _compile_one(job):
    name, kind, args = job
    t0 = time.time()
    try:
        from tilelang_impl import kernels
        getattr(kernels, kind)(*args)
        return dict(variant=name, kind=kind, args=list(args), ok=True, s=time.time() - t0)
    except Exception as e:  # noqa: BLE001 - a failure is a result
        return dict(variant=name, kind=kind, args=list(args), ok=False, s=time.time() - t0,
                    error=repr(e)[-600:])


def precompile(jobs, workers, deadline):
    """Compile in parallel processes, each distinct kernel once (variants share
    kernels); returns per-job results (timeouts reported)."""
    import concurrent.futures as cf
    import multiprocessing as mp
    res = []
    first = {}
    for j in jobs:
        first.setdefault((j[1], j[2]), j)
    twins = [j for j in jobs if first[(j[1], j[2])] is not j]
    jobs = list(first.values())
    ex = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    futs = {ex.submit(_compile_one, j): j for j in jobs}
    try:
        for f in cf.as_completed(futs, timeout=max(1.0, deadline - time.time())):
            res.append(f.result())
    except cf.TimeoutError:
        for f, j in futs.items():
            if not f.done():
                res.append(dict(variant=j[0], kind=j[1], args=list(j[2]), ok=False,
                                error="compile did not finish before the compile deadline"))
    finally:
        procs = list((getattr(ex, "_processes", None) or {}).values())
        ex.shutdown(wait=False, cancel_futures=True)
        for p in procs:  # a compile stuck past the deadline must not hold the lab
            try:
                if p.is_alive():
                    p.kill()
            except Exception:  # noqa: BLE001
                pass
    by_kernel = {(r["kind"], tuple(r["args"])): r for r in res}
    for name, kind, args in twins:  # same kernel as an earlier variant's: same result
        res.append(dict(by_kernel[(kind, tuple(args))], variant=name))
    return res


# ---------------------------------------------------------------------------------------
# child: the GPU work, reporting each step as a JSON line
# ---------------------------------------------------------------------------------------
def _err(e):
    t = repr(e)
    return t if len(t) <= 600 else t[:300] + " ... " + t[-300:]


def _emit(fh, **rec):
    fh.write(json.dumps(rec, default=str) + "\n")
    fh.flush()


def _tensor_with_nan_tail(shape, dtype, g, tail):
    """A contiguous tensor whose storage is followed by ``tail`` NaN elements."""
    import torch
    n = 1
    for s in shape:
        n *= s
    buf = torch.full((n + tail,), float("nan"), dtype=dtype, device="cuda")
    x = buf[:n].view(shape)
    x.copy_(torch.randn(shape, dtype=dtype, device="cuda", generator=g))
    return x


def check_case(run, D, lmk, exp, B, Hq, Hkv, Lq, Lk, window_size, chunk_size, kv_start,
               nan_slots=False, tail_nan=False, seed=0, sm_scale=None):
    """One correctness case; returns a result dict (``ok`` and errors)."""
    import torch
    import reference
    rule = dict(window_size=window_size, chunk_size=chunk_size, mask_lmk=lmk,
                expand_to_chunk=exp, kv_start=kv_start)
    kw = dict(rule, sm_scale=sm_scale)
    g = torch.Generator(device="cuda").manual_seed(seed)
    bf = torch.bfloat16
    q = torch.randn(B, Hq, Lq, D, dtype=bf, device="cuda", generator=g)
    tail = 256 * D if tail_nan else 0
    k = _tensor_with_nan_tail((B, Hkv, Lk, D), bf, g, tail)
    v = _tensor_with_nan_tail((B, Hkv, Lk, D), bf, g, tail)
    go, gl = reference.golden(q, k, v, **kw)
    so, sl = reference.same_dtype(q, k, v, **kw)
    fin = torch.isfinite(gl)
    ref_eo = (so.double() - go).abs().max().item()
    ref_el = (sl.double() - gl)[fin].abs().max().item() if fin.any() else 0.0
    n_nan = 0
    if nan_slots:
        from conformance.cases import poison_unseen
        n_nan = int(poison_unseen(k, v, Lq, rule).sum())
    o, lse = run(q, k, v, kw)
    torch.cuda.synchronize()
    empty = torch.isneginf(gl)
    inf_ok = bool(torch.equal(torch.isneginf(lse), empty))
    zero_ok = bool((o[empty] == 0).all()) if empty.any() else True
    nan = bool(torch.isnan(o).any() or torch.isnan(lse).any())
    eo = (o.double() - go).abs().max().item() if not nan else float("nan")
    el = (lse.double() - gl)[fin].abs().max().item() if fin.any() and not nan else 0.0
    tol_o, tol_l = 2 * ref_eo + FLOOR_BF16, 2 * ref_el + FLOOR_BF16
    ok = (not nan) and eo <= tol_o and el <= tol_l and inf_ok and zero_ok
    return dict(ok=ok, err_o=eo, tol_o=tol_o, err_lse=el, tol_lse=tol_l, inf_match=inf_ok,
                empty_rows_zero=zero_ok, nan=nan, nan_slots=n_nan, empty_rows=int(empty.sum()))


def timed_inputs(B, Hq, Hkv, Lq, Lk, D):
    """``(q, k, v, p)`` of a timed shape: bf16 CUDA tensors drawn with seed 1, checked at the
    lab's window and chunk (``W_T``, ``C_T``); ``tools/lab_hang.py`` draws the same."""
    import torch
    from reference.validation import check_inputs
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(B, H, L, D, dtype=torch.bfloat16, device="cuda", generator=g)
               for H, L in ((Hq, Lq), (Hkv, Lk), (Hkv, Lk)))
    return q, k, v, check_inputs(q, k, v, window_size=W_T, chunk_size=C_T)


def _splits(p, cfg, split):
    """The split count a variant runs a call with: 1 (prefill grid) or at least 2.
    ``split`` is False (prefill grid), True (``launch.splits_by_saturation``), ``"s5"``
    (session 5's rule: about two programs per SM), ``"pack"`` (one wave of GQA-packed
    programs, one per KV head and batch), ``"occ2"`` / ``"wave"`` (one wave of two CTAs
    per SM / of one: the launcher's rule since / before session 12) or an int ``S``
    (forced); the last five capped
    by the key tiles a query block can reach."""
    if not split:
        return 1
    launch = _launch()
    sms = launch.sm_count(p.device)
    if split is True:
        return max(2, launch.splits_by_saturation(p, cfg[0], cfg[1], sms, launch.ctas_per_sm(cfg)))
    if split == "s5":
        split = -(-2 * sms // launch.grid_programs(p, cfg[0]))
    rows = cfg[0]
    if split == "pack":  # one program per KV head and batch (the lab's decode rows fit one tile)
        split, rows = sms // (p.B * p.Hkv), p.Lq
    if split in ("occ2", "wave"):  # one wave of two CTAs per SM / of one (session 12)
        split = (2 if split == "occ2" else 1) * sms // launch.grid_programs(p, cfg[0])
    return max(2, min(int(split), launch.key_tiles(p, rows, cfg[1]), 64))


def _runner(cfg, split=False):
    """``run(q, k, v, kw) -> (o, lse)``: poisoned outputs, this config, the prefill grid
    or (``split``) split-KV (:func:`_splits`)."""
    from reference.validation import check_inputs
    from tilelang_impl import launch

    def run(q, k, v, kw):
        p = check_inputs(q, k, v, **kw)
        o, lse = p.new_outputs(poison=True)
        launch.run_cuda(p, q, k, v, False, False, o, lse, force_split=_splits(p, cfg, split),
                        config=cfg)
        return o, lse
    return run


def bench_graph(fn, calls=10, replays=5):
    import torch

    from tools._common import capture_graph

    def calls_of(n):
        return lambda: [fn() for _ in range(n)]
    g, _ = capture_graph(calls_of(calls), warmup=calls_of(3))
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(replays):
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / calls * 1e3)
    ts.sort()
    return ts[0], ts[len(ts) // 2]


def child(out, names):
    from tilelang_impl import launch
    ev = open(os.path.join(out, "lab_events.jsonl"), "a")
    inputs = {}
    for name in names:
        _emit(ev, ev="start", variant=name)
        ok_all = True
        plan, cases, shapes = _tables(name)
        for cname, D, (lmk, exp), kw in cases:
            _emit(ev, ev="case_start", variant=name, case=cname)
            try:
                rec = check_case(_runner(*plan(D)), D, lmk, exp, **kw)
            except Exception as e:  # noqa: BLE001
                rec = dict(ok=False, error=_err(e))
            ok_all &= rec["ok"]
            _emit(ev, ev="check", variant=name, case=cname, **rec)
        if not ok_all:
            _emit(ev, ev="done", variant=name, timed=False)
            continue
        for sname, B, Hq, Hkv, Lq, Lk, D in shapes:
            _emit(ev, ev="time_start", variant=name, shape=sname)
            try:
                if sname not in inputs:
                    q, k, v, p = timed_inputs(B, Hq, Hkv, Lq, Lk, D)
                    inputs[sname] = (q, k, v, p, p.new_outputs(), flops(B, Hq, Lq, Lk, D))
                q, k, v, p, (o, lse), fl = inputs[sname]
                cfg, split = plan(D)
                S = _splits(p, cfg, split)
                best, med = bench_graph(lambda: launch.run_cuda(p, q, k, v, False, False, o, lse,
                                                                force_split=S, config=cfg))
                _emit(ev, ev="time", variant=name, shape=sname, us=best, us_median=med,
                      tflops=fl / best / 1e6)
            except Exception as e:  # noqa: BLE001
                _emit(ev, ev="time", variant=name, shape=sname, error=_err(e))
        _emit(ev, ev="done", variant=name, timed=True)
    ev.close()
    return 0


# ---------------------------------------------------------------------------------------
# parent: watchdog, results, table
# ---------------------------------------------------------------------------------------
def fold_events(events, result):
    """Fold child events into ``result['variants'][name]`` (pure; tested on CPU)."""
    vs = result.setdefault("variants", {})
    for e in events:
        v = vs.setdefault(e["variant"], dict(checks={}, times={}, status="pending"))
        kind = e["ev"]
        if kind == "start":
            v["status"] = "running"
        elif kind == "check":
            v["checks"][e["case"]] = {k: e[k] for k in e if k not in ("ev", "variant", "case")}
        elif kind == "time":
            v["times"][e["shape"]] = {k: e[k] for k in e if k not in ("ev", "variant", "shape")}
        elif kind == "done":
            fails = [c for c, r in v["checks"].items() if not r.get("ok")]
            v["status"] = "timed" if e.get("timed") else f"failed correctness: {fails}"
        v["last"] = {k: e[k] for k in ("ev", "case", "shape") if k in e}
    return result


def table(result):
    """Prefill variants in TFLOP/s, decode variants (``dec-``) in microseconds, each
    block relative to its reference: ``base`` / ``dec-shipped`` when timed, else the
    first variant with times."""
    lines = []
    every = list(result.get("variants", {}))
    for decode in (False, True):
        names = [n for n in every if (n in DECODE_VARIANTS) == decode]
        if not names:
            continue
        shapes = DECODE_SHAPES if decode else SHAPES
        timed = [n for n in names if result["variants"][n].get("times")]
        pref = "dec-shipped" if decode else "base"
        ref = pref if pref in timed else (timed[0] if timed else names[0])
        unit = "microseconds" if decode else "TFLOP/s"
        heads = [s[0].removeprefix("dec ") if decode else s[0][:14] for s in shapes]
        w = max(14, max(len(h) for h in heads))  # decode names differ only at their end
        nw = max(12, max(len(n) for n in names))
        lines.append(f"{unit} (kernel only, CUDA-graph replay, L2 not flushed; best of 5); "
                     f"x = speed relative to {ref!r}")
        lines.append(f"{'variant':{nw}s} {'status':18s} " + " ".join(f"{h:>{w}s}" for h in heads))
        base = result["variants"].get(ref, {}).get("times", {})
        for n in names:
            v = result["variants"][n]
            st = v.get("status", "?")
            st = "ok" if st == "timed" else st.split(":")[0]
            cells = []
            for s in shapes:
                t = v.get("times", {}).get(s[0], {})
                if "us" in t:
                    b = base.get(s[0], {}).get("us")
                    rel = f"{b / t['us']:.2f}x" if b else ""
                    val = t["us"] if decode else t["tflops"]
                    cells.append(f"{val:7.1f} {rel:>6s}".rjust(w))
                else:
                    cells.append(f"{'-':>{w}s}")
            lines.append(f"{n:{nw}s} {st[:18]:18s} " + " ".join(cells))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", ".out"))
    ap.add_argument("--budget-s", type=float, default=225.0,
                    help="wall-clock cap for everything, compiles included")
    ap.add_argument("--compile-s", type=float, default=110.0, help="cap on the compile phase")
    ap.add_argument("--stall-s", type=float, default=45.0,
                    help="kill the runner when it reports nothing for this long (hang)")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 4))
    ap.add_argument("--only", default="", help="comma-separated variant names")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    if a.child:
        return child(a.out, a.child.split(","))
    t_start = time.time()
    deadline = t_start + a.budget_s
    known = dict(VARIANTS, **DECODE_VARIANTS)
    names = [n for n in (a.only.split(",") if a.only else VARIANTS) if n]
    for n in names:
        if n not in known:
            ap.error(f"unknown variant {n!r}; known: {list(known)}")
    from tools._common import run_commit
    commit = run_commit()
    result = dict(commit=commit, budget_s=a.budget_s, timing="CUDA-graph replay of 10 calls, "
                  "best/median of 5 replays, L2 not flushed",
                  shapes=[s[0] for s in SHAPES + DECODE_SHAPES],
                  predictions={n: dict(change=known[n][1], prediction=known[n][2])
                               for n in names})
    path = os.path.join(a.out, "lab_tilelang.json")

    def save():
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1, default=str)
        os.replace(tmp, path)

    # 1. compile
    print(f"== compile ({a.workers} processes)", flush=True)
    jobs = kernel_jobs(names)
    comp = precompile(jobs, a.workers, min(deadline, t_start + a.compile_s))
    result["compile"] = dict(seconds=time.time() - t_start, jobs=len(jobs),
                             failed=[c for c in comp if not c["ok"]])
    bad = {c["variant"] for c in comp if not c["ok"]}
    for c in comp:
        if not c["ok"]:
            print(f"  compile FAIL {c['variant']} {c['kind']}{tuple(c['args'])}: "
                  f"{c.get('error', '')[-200:]}", flush=True)
    print(f"  {len(jobs)} kernels in {time.time() - t_start:.0f}s, failed variants: "
          f"{sorted(bad)}", flush=True)
    result["variants"] = {n: dict(checks={}, times={}, status="compile failed") for n in bad}
    save()

    # 2. run in a watched child, restarting after a hang or crash
    todo = [n for n in names if n not in bad]
    evpath = os.path.join(a.out, "lab_events.jsonl")
    open(evpath, "w").close()
    pos = 0
    while todo and time.time() < deadline:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        log = open(os.path.join(a.out, "lab_child.log"), "a")
        proc = subprocess.Popen([sys.executable, "-m", "tools.lab_tilelang", "--out", a.out,
                                 "--child", ",".join(todo)], stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
        last = time.time()
        current = None
        reason = None
        while True:
            time.sleep(0.5)
            with open(evpath) as f:
                f.seek(pos)
                chunk = f.read()
            lines = chunk.splitlines(keepends=True)
            if lines and not lines[-1].endswith("\n"):
                lines = lines[:-1]  # partial line: read next time
            evs = [json.loads(x) for x in lines]
            pos += sum(len(x.encode()) for x in lines)
            if evs:
                last = time.time()
                fold_events(evs, result)
                for e in evs:
                    current = e["variant"]
                    if e["ev"] == "done" and e["variant"] in todo:
                        todo.remove(e["variant"])
                        v = result["variants"][e["variant"]]
                        print(f"  {e['variant']}: {v['status']}", flush=True)
                save()
            rc = proc.poll()
            if rc is not None:
                if todo and rc != 0:  # crash (before the first event too: no endless restarts)
                    reason = f"crashed (rc={rc})"
                break
            if time.time() - last > a.stall_s:
                reason = f"hung (no progress for {a.stall_s:.0f}s)"
            elif time.time() > deadline:
                reason = "stopped at the lab's time budget"
            if reason:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
        log.close()
        if reason and todo:
            victim = current if current in todo else todo[0]
            v = result["variants"].setdefault(victim, dict(checks={}, times={}))
            v["status"] = f"{reason} at {v.get('last', {})}"
            print(f"  {victim}: {v['status']}", flush=True)
            todo.remove(victim)
            if reason.startswith("stopped"):
                for n in todo:
                    result["variants"].setdefault(n, dict(checks={}, times={}))["status"] = \
                        "not run (time budget)"
                todo = []
        elif proc.returncode == 0:
            break
        save()
    result["seconds"] = time.time() - t_start
    save()
    print("\n== per-variant correctness failures")
    for n, v in result["variants"].items():
        fails = {c: r for c, r in v.get("checks", {}).items() if not r.get("ok")}
        if fails:
            print(f"  {n}: " + "; ".join(
                f"{c}: err_o={r.get('err_o')} tol={r.get('tol_o')} nan={r.get('nan')} "
                f"inf={r.get('inf_match')} {r.get('error', '')[:120]}" for c, r in fails.items()))
    print(f"\nlab finished in {result['seconds']:.0f}s (budget {a.budget_s:.0f}s), "
          f"commit {commit}\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
