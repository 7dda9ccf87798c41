"""TileLang kernel factories of the sliding-window attention forward.

Every factory is a ``@tilelang.jit`` function: its Python arguments are baked
into the compiled kernel (one compile per static configuration); everything
else is dynamic. In all kernels ``B, Hq, Hkv, Lq, Lk`` (and the split count)
are dynamic shape variables, so one compile serves every length, and the
per-call values are scalar kernel arguments:

    W          int32   window_size, clamped by the launcher to Lk + C
    C          int32   chunk_size of the kernel frame (``launch.frame``: chunk_size,
                       or Lk + 1 for a chunk longer than the cache)
    r          int32   kv_start modulo the chunk (the relative frame of macros.py)
    inv_c      float32 1 / C (exact landmark test without a division; the kernels built
               ``wide`` take its quotient twice, macros.is_landmark, the first one per
               tile, macros.tile_divisor)
    scale_log2 float32 sm_scale * log2(e) (with ``scale_fold`` a positive normal
                       float32, which the launcher guarantees)

Layouts. ``q_blhd`` / ``kv_blhd`` bake the memory order of the inputs:
False reads ``(B, H, L, D)`` contiguous tensors, True reads ``(B, L, H, D)``
contiguous tensors (what ``x.transpose(1, 2)`` of a canonical-shaped BLHD
view gives back without a copy). ``o`` is always written ``(B, Hq, Lq, Dv)``
contiguous and ``lse`` ``(B, Hq, Lq)`` fp32 natural log, by the kernel itself.

The rule and the softmax come from :mod:`tilelang_impl.macros` in every kernel.
"""


import functools

import tilelang
import tilelang.language as T
from tvm.target import Target

from . import macros as M
from . import producer_guard as PG
from .launch import (FP32_TILE, INT_KNOBS, OVERLAP_OLD, V_CHUNK_SPAN_DV, V_CHUNK_SPANS,
                     consumer_writes_v, rows_j0_acts, vc_shift_acts)

#: The tensor-core kernels use wgmma, TMA and warpgroup register reallocation:
#: sm_90a (plain sm_90 cannot build them).
HOPPER = Target({"kind": "cuda", "arch": "sm_90a"})

_NEG_INF = -float("inf")

PG.ensure()  # our warp-specialised kernels' producer: warp 0 alone waits (its docstring)

#: Registers per thread the producer warp group keeps after ``setmaxnreg``
#: (TileLang's default; the least the instruction allows).
PRODUCER_REGS = 24
#: Register file of one SM (32-bit registers) and the most ``setmaxnreg`` gives.
SM_REGS, MAX_NREG = 65536, 240
#: ``min_blocks`` values the kernels accept: 0 (TileLang's launch bounds ``(threads,
#: 1)`` and its 240 / 24 register split), 2 (shipped: ``launch.TC_MIN_BLOCKS``), 3
#: (session 39's lab ``occ3-64x64v``, shipped in sessions 42-43 for calls of several query
#: blocks at ``max(Dqk, Dv) <= 64``) and 4 (those calls since session 44:
#: ``launch.TC_LONG``, below). Three and four
#: CTAs per SM hung on the H200 (session 12 lab, bench_results/tilelang-lab15-287ff31.json:
#: 64x64 tiles, one consumer warp group; at three the consumers asked for 144 registers where
#: the CTA launched with 80, :func:`consumer_regs` before it counted the launch registers: 136
#: since). Four hung then with a split that fits (64 at launch, consumers 104), and was
#: refused until session 43. Three with the split that fits (80 at launch, consumers 136) hung too
#: (session 40, H100, ``tools/lab_hang``: within 1000 launches of D = 64 GQA 32/4, eager and
#: graph; the same kernel at two CTAs ran 100,000). Session 41 found why: a producer warp a
#: round behind on a parity wait (:mod:`producer_guard`, the fix, in every kernel since);
#: with it three CTAs ran 100,000 launches, +9..+20% on the D = 64 GQA rows (lab, H100).
#: 4 (session 43's lab ``occ4-64x64v``; 64 registers at launch, consumers 104) is the
#: four-CTA build of session 12 again, now with the guard: 100,000 launches without a hang
#: under graph replay (session 43) and eager (session 44), H100; over occ3 on the D = 64 GQA
#: rows +1..+6% in session 43's two lab runs and +7..+14% in session 44's two; shipped in
#: session 44.
MIN_BLOCKS = (0, 2, 3, 4)
#: ``reg_slack`` values the kernels accept (session 40, a lab knob): registers per consumer
#: thread left unclaimed below :func:`consumer_regs`' exact fill of the CTA's pool. 8 is for
#: the lab's three-CTA hang (``occ3-64x64v-slack8``: consumers 128 where they fill the pool at
#: 136), to tell a pool filled to the register from the rest; never run on a GPU yet.
REG_SLACKS = (0, 8)
#: ``producer_warps`` values the kernels accept (session 41): 1, the producer warp group's
#: warp 0 alone runs its key loop (:mod:`producer_guard`: warps 1-3 leave, the fix of the
#: hang that module describes; every kernel the launcher builds), or 4, the four warps as
#: TileLang 0.1.15 generates them (a lab value: the control of the fix, which can hang).
PRODUCER_WARPS = (1, 4)
#: ``lazy_rescale`` values the kernels accept (session 43, a lab knob): 0, the running max
#: every tile, or ``tau`` = 8, a row keeps its reference while the tile max stays within
#: ``2**8`` of it and a warp none of whose rows moved skips the output rescale
#: (``macros.online_softmax_update``, ``macros.rescale_output``).
LAZY_RESCALES = (0, 8)
#: ``hoist_left`` values the kernels accept (session 44; shipped in session 45 for calls of
#: several query blocks, ``launch.TC_HOIST_LEFT``): 0, the key loop computes
#: the last row's left edge for :func:`_mask_split`'s test every tile (a runtime floor division
#: by the chunk, which nvcc leaves in the loop, presumably because the loop may run no
#: iteration and the division may trap; 34 instructions a tile of the consumer's loop at
#: sm_90a, D = 64; kernels with ``expand_to_chunk`` only: without it the edge has no
#: division), or 1, once before the loop into a register (``macros.last_row_left``). Only
#: with ``mask_split``, and not with ``overlap`` 1 or 2 or ``pack`` (not built or run there).
HOIST_LEFT = (0, 1)
#: ``hoist_keys`` values the kernels accept (session 45; ``launch.shipped_config`` bakes 1 since
#: session 46, ``launch.TC_HOIST_KEYS``): 0, the key/value head
#: (``by // (Hq // Hkv)``) and the block's key range (``lo``, a floor division by the chunk with
#: ``expand_to_chunk``, and ``hi``, built on it) as expressions that the warp-specialised loop
#: recomputes where it uses them (nvcc leaves their runtime integer divisions in the producer's
#: key loop: three to five a tile in the SASS of session 44, D = 64), or 1, the three held in
#: registers from before the key loop (``T.alloc_var``). Not with ``overlap`` 1 or 2 (not
#: built or run there).
HOIST_KEYS = (0, 1)
#: ``vc_shift`` values the kernels accept (session 47, a lab knob): 0, the chunk view's tile
#: coordinates (:func:`_load_v_chunks` at one chunk per tile) as ``k0 % C`` and ``k0 // C`` by
#: the runtime chunk, the producer's last runtime integer division a tile once ``hoist_keys``
#: holds the rest; or 1, ``0`` and ``k0 // block_N`` (a shift): exact where ``lmk_const`` is
#: baked with ``v_chunk = 1``, which already needs ``C == block_N`` (``lmk_cols * C ==
#: block_N`` with ``C`` a multiple of ``block_N``: one landmark column, every tile one whole
#: chunk). Only there. Measured in session 49 (``tools/lab_tilelang.py --only shipped,vshift``,
#: nine runs on one H100 at 80bae8d, L2 not flushed, best of 5 each,
#: bench_results/tilelang-lab49-h100-{1..9}.json): the median speed ratio to ``shipped`` was 0.999
#: and 1.004 at 32/32/128 L = 8K / 16K, 1.003, 1.011 and 1.007 on the three D = 64 rows
#: (single runs 0.947..1.076) and 0.983 on the chunked row (0.960..1.015); predicted from the
#: producer's SASS: D = 64 +1..+8%, D = 128 +1..+4%, chunked +0..+4%. Not shipped
#: (BENCHMARKS.md, session 49; ``python -m tools.lab_pool`` pools the runs).
VC_SHIFT = (0, 1)
#: ``pingpong`` values the kernels accept (session 52, a lab knob): 0 off; 1, with two consumer
#: warp groups (``threads = 256``, ``block_M = 128``: each group 64 rows of the tile), FA3's
#: ping-pong: the groups take turns at the tensor cores through two named barriers
#: (:data:`PINGPONG_BARRIERS`), each product of one group issued while the other runs its
#: softmax step, instead of both groups in step. 1 hands the turn over once the product is done
#: (``T.gemm`` waits for it); 2 once it is issued (``T.wgmma_gemm``, then the hand-over, then
#: ``T.wait_wgmma``), so the other group's product queues behind it, as FA3 does. Measured in
#: session 52 (``tools/lab_tilelang.py`` ``pp`` and the control ``pp-off`` in five runs,
#: ``pp-async`` in two, one H100, L2 not flushed, bench_results/tilelang-lab52-h100-*.json): at
#: D = 128, L = 8K, 0.70-0.72x the shipped kernel with 1 and 0.78x with 2, where the same tile
#: with the groups in step is 0.80-0.82x (1 is 11-15% below that control, 2 is 2-3%): the
#: turns gain nothing over the in-step groups, and the tile they need loses to two 64-row CTAs
#: an SM. Never shipped (BENCHMARKS.md, session 52).
PINGPONG = (0, 1, 2)
#: The two named barriers of ``pingpong`` (turn of group 0, turn of group 1): ids TileLang
#: 0.1.15 leaves unused in this kernel (it takes 0 for the CTA and low ids for its own
#: partial syncs; checked in the generated source by tests/test_tilelang_compile.py).
PINGPONG_BARRIERS = (12, 13)
#: ``pingpong``'s turns (:func:`_turn`), CUDA imported into the kernel. TileLang 0.1.15's warp
#: specialisation numbers the producer group's threads 0-127 and the consumers' 128-383, so
#: bit 7 of ``threadIdx.x`` tells the two consumer groups apart (group ``g``: threads of bit
#: 7 equal to ``1 - g``; the generated wgmma addresses rows the same way). A turn is a
#: ``bar.sync`` of 256 threads at the group's own barrier, which the other group completes
#: with a ``bar.arrive`` of its 128: group 1 arrives once at group 0's barrier before its
#: first turn, so group 0 goes first, and after each of its turns but the last; group 0 after
#: each of its. Each barrier sees ``2 n_it`` syncs and ``2 n_it`` arrivals: none is left
#: pending when the CTA ends.
PINGPONG_SRC = r"""
__device__ __forceinline__ int hils_pp_turn(int step, int kb, int n_it, float dep, int C) {
  const int g = ((((int)threadIdx.x) >> 7) & 1) ^ 1;
  if (step == 0 && kb == 0 && g == 1) {
    asm volatile("bar.arrive %0, 256;" :: "r"(B0) : "memory");
  }
  if ((step & 1) == 0) {
    // (C >> 31) is 0 (the chunk is positive) but not to ptxas: the barrier's id depends on
    // dep, the row sums of the softmax step, so ptxas cannot move the wait above that step
    const int id = B0 + g + (__float_as_int(dep) & (C >> 31));
    asm volatile("bar.sync %0, 256;" :: "r"(id) : "memory");
  } else if (!(step == 3 && g == 1 && kb == n_it - 1)) {
    asm volatile("bar.arrive %0, 256;" :: "r"(B1 - g) : "memory");
  }
  return 0;
}
""".replace("B0", str(PINGPONG_BARRIERS[0])).replace("B1", str(PINGPONG_BARRIERS[1]))


def launch_regs(threads: int, min_blocks: int) -> int:
    """Registers per thread ptxas gives every thread of a CTA at launch under
    ``__launch_bounds__(threads + 128, min_blocks)``: the register file split over
    ``min_blocks`` CTAs of ``threads`` consumers and the 128-thread producer, rounded
    down to the allocation granule of 8 (what ``cuobjdump -res-usage`` reports for
    kernels with ``setmaxnreg``, checked by tests/test_tilelang_compile.py)."""
    return SM_REGS // (min_blocks * (threads + 128)) // 8 * 8


def consumer_regs(threads: int, min_blocks: int, slack: int = 0) -> int:
    """Registers per consumer thread after ``setmaxnreg``: what the CTA launched with
    (:func:`launch_regs`) less the producer's :data:`PRODUCER_REGS`, shared by the
    ``threads`` consumers, a multiple of 8, at most :data:`MAX_NREG`, less ``slack``
    (:data:`REG_SLACKS`, a lab knob). ``setmaxnreg.inc`` waits for registers the CTA's own
    warps released, so asking for more never returns (a hang, not an error)."""
    pool = launch_regs(threads, min_blocks) * (threads + 128) - 128 * PRODUCER_REGS
    return min(MAX_NREG, pool // threads // 8 * 8) - slack


def _shape(blhd: bool, B, H, L, D):
    return (B, L, H, D) if blhd else (B, H, L, D)


def _tile(X, blhd: bool, b, h, l0, n, width: int = 0):
    """``X[b, h, l0:l0+n, :]`` in either memory order; ``width`` (a narrow input, knobs
    ``qk_cols`` / ``v_cols`` of :func:`fwd_tc`): columns ``0:width`` of a tensor that has
    fewer, the copy engine filling the rest of the box with zeros; 0 (the default): all of
    ``X``'s columns, the region the kernels read before the knobs."""
    cols = slice(0, width) if width else slice(None)
    return X[b, l0:l0 + n, h, cols] if blhd else X[b, h, l0:l0 + n, cols]


def _elem(X, blhd: bool, b, h, l, d):
    return X[b, l, h, d] if blhd else X[b, h, l, d]


# --------------------------------------------------------------------------------------
# Hopper kernel (bf16 / fp16): wgmma GEMMs, TMA loads, software pipeline
# --------------------------------------------------------------------------------------
@T.macro
def _load_v(V, V_s, kv_blhd, bz, hk, k0, hi, r, C, inv_c, block_N, Dv, dtype, mask_lmk, ws,
            lmk_zero, lmk_cols, v_cols=0):
    """The ``V`` tile load: a bulk copy, except without warp specialisation and
    ``lmk_zero="tile"`` where kept rows are loaded and the others zero-filled
    element by element (the pre-knob non-ws kernel); ``v_cols``: ``V``'s columns where it has
    fewer than ``Dv`` (:func:`fwd_tc`), the rest of the tile zeros."""
    if mask_lmk and not ws and lmk_zero == "tile":
        j0 = M.tile_landmark_start(k0, r, C, mask_lmk, lmk_cols)
        for j, d in T.Parallel(block_N, Dv):
            kept = M.key_kept(k0, j, hi, r, C, inv_c, mask_lmk, lmk_cols, j0)
            V_s[j, d] = T.if_then_else(T.And(kept, d < v_cols) if v_cols else kept,
                                       _elem(V, kv_blhd, bz, hk, k0 + j, d), T.Cast(dtype, 0))
    else:
        T.copy(_tile(V, kv_blhd, bz, hk, k0, block_N, Dv if v_cols else 0), V_s)


@T.macro
def _load_v_chunks(V5, V_s, bz, hk, k0, C, block_N, span, shift=0, width=0):
    """The ``V`` tile from the chunk view ``V5[b, h, c, t, :] = V[b, h, c * C + t, :]``,
    ``t < C - 1`` (knob ``v_chunk`` of :func:`fwd_tc`, view built by
    ``launch.v_chunk_view``): every chunk's last row, its landmark, lies outside the view,
    so the bulk copy writes zeros there; nothing is zeroed by hand. Valid only for the calls
    ``launch.v_chunk_call`` admits (tiles starting on chunk boundaries of a frame with
    ``r = 0``, ``Lk`` a multiple of ``C``), in one of two forms (:data:`V_CHUNK`):

    - ``span = 1``: ``C`` a multiple of ``block_N``; the tile lies inside one chunk, rows
      ``k0 % C`` on, one copy.
    - ``span = n >= 2``: ``C = block_N / n`` (the launcher checks it; the kernel uses the
      static ``block_N // n``); the tile is ``n`` whole chunks, one copy of ``C`` rows per
      chunk into its rows of ``V_s``. TileLang 0.1.15 lowers each as a bulk copy because
      the split rows are static (with a runtime ``C`` they became element loads, session
      25). A tile past ``Lk`` (``Lk`` need not be a multiple of ``block_N`` here) reads
      chunks past the view's last, which the copy engine fills with zeros.

    ``shift`` (knob ``vc_shift``, :data:`VC_SHIFT`): at ``span = 1`` with ``C == block_N``
    (the kernel checks ``lmk_const``, which needs it) the tile is chunk ``k0 // block_N``
    from its row 0, a shift instead of the runtime division by ``C``. ``width``: as
    :func:`_tile`'s (a view of fewer columns than the tile's, knob ``v_cols``)."""
    d = slice(0, width) if width else slice(None)
    if span == 1 and shift:
        T.copy(V5[bz, hk, k0 // block_N, 0:block_N, d], V_s)
    elif span == 1:
        t0 = k0 % C
        T.copy(V5[bz, hk, k0 // C, t0:t0 + block_N, d], V_s)
    else:
        cs = block_N // span
        c0 = k0 // cs
        # one statement per chunk: as a loop (T.unroll) the copies lower as element loads
        T.copy(V5[bz, hk, c0, 0:cs, d], V_s[0:cs, :])
        T.copy(V5[bz, hk, c0 + 1, 0:cs, d], V_s[cs:2 * cs, :])
        if span == 4:
            T.copy(V5[bz, hk, c0 + 2, 0:cs, d], V_s[2 * cs:3 * cs, :])
            T.copy(V5[bz, hk, c0 + 3, 0:cs, d], V_s[3 * cs:4 * cs, :])


@T.macro
def _mask_split(acc_s, left_row, q0, k0, block_M, block_N, Lq, Lk, r, W, C, inv_c, mask_lmk,
                expand_to_chunk, scale_log2, gpu, lmk_cols=0, win_u32=False, j0=None, pack=0,
                q_first=None, n_q=None, left_last=None):
    """``mask_scores`` on tiles that cross a window edge; on tiles inside every
    row's window only the scale and the landmark columns (``mask_landmarks``), or
    only the scale without ``mask_lmk`` (``scale_scores``), or nothing at all
    without ``mask_lmk`` when the scale is folded into the exponent
    (``scale_log2=None``). One statement (an ``if``), as ``mask_scores`` is.
    ``lmk_cols``: ``macros.tile_landmark``; ``win_u32``: ``macros.visible``; ``j0``:
    the tile's first landmark column when the caller holds it (``macros.mask_scores``);
    ``pack``: rows hold several heads' queries (``macros.mask_scores``; ``q0`` is
    the first row). The tile's queries are ``n_q`` from ``q_first`` (default: its
    ``block_M`` rows from ``q0``, unpacked). ``left_last``: the last query's left edge, held
    from before the key loop (the ``hoist_left`` knob), or None (computed here)."""
    inside = M.tile_inside_windows(q0 if q_first is None else q_first, k0,
                                   block_M if n_q is None else n_q, block_N, Lq, Lk, r, W, C,
                                   expand_to_chunk, left_last)
    if mask_lmk or scale_log2 is not None:
        if inside:
            if mask_lmk:
                M.mask_landmarks(acc_s, k0, block_M, block_N, r, C, inv_c, scale_log2, gpu,
                                 lmk_cols, j0)
            else:
                M.scale_scores(acc_s, block_M, block_N, scale_log2, gpu)
        else:
            M.mask_scores(acc_s, left_row, q0, k0, block_M, block_N, Lq, Lk, r, C, inv_c,
                          mask_lmk, scale_log2, gpu, lmk_cols, win_u32, j0, pack)
    else:
        if T.Not(inside):
            M.mask_scores(acc_s, left_row, q0, k0, block_M, block_N, Lq, Lk, r, C, inv_c,
                          mask_lmk, scale_log2, gpu, lmk_cols, win_u32, j0, pack)


def _hoisted_left(hoist, q_end, Lq, Lk, r, W, C, expand_to_chunk):
    """``left_last`` of :func:`_mask_split` for a block of queries ``[.., q_end)``: the last
    query's left edge held in a register from before the key loop (``macros.last_row_left``)
    where ``hoist`` (``hoist_left``, :data:`HOIST_LEFT`), else None (each tile computes it)."""
    if not hoist:
        return None
    return T.alloc_var("int32", init=M.last_row_left(q_end, Lq, Lk, r, W, C, expand_to_chunk))


@T.macro
def _score_step(acc_s, m, m_prev, alpha, l, row_sum, left_row, q0, q_first, q_end, k0, j0,
                block_M, block_N, Lq, Lk, r, window_size, C, inv_c, mask_lmk, expand_to_chunk,
                scale_log2, mask_split, fold, lmk_cols, fast_exp2, scale_fold, win_u32, pack,
                lazy=0, left_last=None):
    """One key tile's scores ``acc_s`` masked (:func:`_mask_split` or ``macros.mask_scores``)
    and folded into the online softmax (``macros.online_softmax_update``): the step both
    key loops of :func:`_fwd_tc_body` run, the shipped one and :func:`_overlap_loop`.
    ``j0``: the tile's first landmark column, or None (``macros.mask_scores``). The window
    is named ``window_size`` as in ``macros``: a macro's parameter names the kernel's scalar
    in the generated CUDA source, which stays as it was before this macro existed.
    ``left_last``: :func:`_mask_split`'s, with ``mask_split``."""
    if mask_split:
        _mask_split(acc_s, left_row, q0, k0, block_M, block_N, Lq, Lk, r, window_size, C, inv_c,
                    mask_lmk, expand_to_chunk, None if scale_fold else scale_log2,
                    True, lmk_cols, win_u32, j0, pack,
                    *((q_first, q_end - q_first) if pack else (None, None)), left_last)
    else:
        M.mask_scores(acc_s, left_row, q0, k0, block_M, block_N, Lq, Lk, r, C,
                      inv_c, mask_lmk, None if scale_fold else scale_log2, True,
                      lmk_cols, win_u32, j0, pack)
    M.online_softmax_update(acc_s, m, m_prev, alpha, l, row_sum, block_M, block_N,
                            True, fold, scale_log2 if scale_fold else None, fast_exp2, lazy)


@T.macro
def _overlap_loop(K, V, Q_s, K_s, V_s, acc_s, acc_p, acc_o, m, m_prev, alpha, l, row_sum,
                  left_row, kv_blhd, bz, hk, lo, hi, kb0, n_it, q0, q_first, q_end, block_M,
                  block_N, Dv, dtype, num_stages, Lq, Lk, r, W, C, inv_c, mask_lmk,
                  expand_to_chunk, scale_log2, mask_split, fold, lmk_cols, fast_exp2, scale_fold,
                  win_u32, rows_j0, pack, v_zero, policy, threads, serial=False, lean=False,
                  v_chunk=0, vc_shift=0, left_last=None, k_width=0, v_width=0):
    """The key loop with one tile's softmax overlapped with the previous tile's ``P @ V``
    (the ``overlap`` knob of :func:`fwd_tc`; FA3's intra-warpgroup overlap).

    Iteration ``kb`` of ``n_it + 1`` (none when ``n_it == 0``) loads key tile ``min(kb,
    n_it - 1)`` and value tile ``max(kb - 1, 0)``, issues ``S = Q K^T`` and ``O += P V``
    of the previous tile as two asynchronous wgmma groups, waits for ``S`` only, masks it
    and runs the online-softmax step while ``P V`` is on the tensor cores, then waits for
    ``P V``, rescales ``O`` and keeps the new ``P``. ``P`` of "tile -1" is zero (its
    product adds nothing: landmark rows of the value tile are zeroed as always; other
    rows of tile 0 are finite by :func:`macros.zero_landmark_rows`' argument). The last
    iteration's score tile is a repeat of the last key tile, and its softmax step is
    skipped. ``serial`` (``overlap=2``, the lab's control): the same loop with both
    products waited for before the softmax step.

    ``lean`` (``overlap`` 3, its serial control 4; session 51): no ``P V`` of tile -1 (at
    ``kb == 0`` only ``S`` is issued and waited for), with the chunk view of ``v``
    (``v_chunk``, ``vc_shift``: :func:`_load_v_chunks` at the value tile) and ``left_last``
    (``hoist_left``, :func:`_mask_split`). The repeated last key tile's ``S`` is still
    computed: with that product skipped too, ptxas 12.x serialises every wgmma of the kernel
    (C7515, "non wgmma instructions defining accumulator registers of a wgmma between start
    and end of the pipeline stage"), and so it does for this loop on D = 64's tile at four
    CTAs an SM (104 consumer registers), where the lean loop spills. Both forms copy value
    tile 0 and the last key tile twice (one more copy of each a block).

    The copy stages are released by the warp-specialisation pass after the last statement
    that reads them, which it takes to be the (asynchronous) product: ``held`` reads one
    element of ``K_s`` / ``V_s`` after the wait that covers the product, so the release
    follows the wait (the reads themselves are dead code for nvcc). ``k_width`` /
    ``v_width``: :func:`_tile`'s ``width`` of the key and value tiles (knobs ``qk_cols`` /
    ``v_cols``)."""
    T.clear(acc_p)
    held = T.alloc_local([2], dtype)  # see the docstring's last paragraph
    for kb in T.Pipelined(n_it + T.min(n_it, 1), num_stages=num_stages):
        k0 = lo + (kb0 + T.min(kb, n_it - 1)) * block_N
        k0v = lo + (kb0 + T.max(kb - 1, 0)) * block_N
        T.copy(_tile(K, kv_blhd, bz, hk, k0, block_N, k_width), K_s)
        if v_chunk:
            _load_v_chunks(V, V_s, bz, hk, k0v, C, block_N, v_chunk, vc_shift, v_width)
        else:
            T.copy(_tile(V, kv_blhd, bz, hk, k0v, block_N, v_width), V_s)
        if v_zero:
            M.zero_landmark_rows(V_s, k0v, block_N, Dv, r, C, inv_c, dtype, True,
                                 M.tile_landmark_start(k0v, r, C, mask_lmk, lmk_cols)
                                 if rows_j0 else None, lmk_cols)
        T.wgmma_gemm(Q_s, K_s, acc_s, transpose_B=True, clear_accum=True, policy=policy)
        if lean:  # no product of tile -1 (P = 0); the repeated key tile's stays (docstring)
            if kb > 0:
                T.wgmma_gemm(acc_p, V_s, acc_o, policy=policy)
            if serial or kb == 0:
                T.wait_wgmma(0)
            else:
                T.wait_wgmma(1)
        else:
            T.wgmma_gemm(acc_p, V_s, acc_o, policy=policy)
            T.wait_wgmma(0 if serial else 1)
        T.warpgroup_fence_operand(acc_s, num_regs=block_M * block_N // threads)
        held[0] = K_s[0, 0]  # K_s is released here, after its product is done
        if kb < n_it:
            j0 = None
            if rows_j0:
                j0 = M.tile_landmark_start(k0, r, C, mask_lmk, lmk_cols)
            _score_step(acc_s, m, m_prev, alpha, l, row_sum, left_row, q0, q_first, q_end, k0,
                        j0, block_M, block_N, Lq, Lk, r, W, C, inv_c, mask_lmk,
                        expand_to_chunk, scale_log2, mask_split, fold, lmk_cols, fast_exp2,
                        scale_fold, win_u32, pack, 0, left_last)
        T.wait_wgmma(0)
        T.warpgroup_fence_operand(acc_o, num_regs=block_M * Dv // threads)
        T.warpgroup_fence_operand(acc_p, num_regs=block_M * block_N // threads // 2)
        held[1] = V_s[0, 0]  # V_s likewise
        if kb < n_it:
            M.rescale_output(acc_o, alpha, block_M, Dv, True)
            T.copy(acc_s, acc_p)


#: Values of the ``overlap`` knob (:func:`fwd_tc`): 0 off, 1 the overlapped loop
#: (:func:`_overlap_loop`), 2 its serial control (the lab's); 3 the lean overlapped loop
#: (no product of tile -1; with the chunk view and the hoists), 4 its serial control.
OVERLAP = (0, 1, 2, 3, 4)

#: Values of the ``v_chunk`` knob (:func:`fwd_tc`, :func:`_load_v_chunks`): 0 (or False)
#: off; 1 (or True) the tile inside one chunk (``C`` a multiple of ``block_N``); 2 or 4
#: (``launch.V_CHUNK_SPANS``) the tile of that many whole chunks (``C = block_N / 2`` or
#: ``block_N / 4``, baked).
V_CHUNK = (0, 1) + V_CHUNK_SPANS


#: Landmark-row treatment of the ``V`` tile with ``mask_lmk`` (a baked-in knob):
#: ``"tile"`` re-writes the whole tile (every row tested with ``key_kept``; the
#: behaviour before the knobs existed), ``"rows"`` zeroes only the landmark rows
#: (``macros.zero_landmark_rows``).
LMK_ZERO = ("tile", "rows")


def _check_knobs(lmk_cols, pack=0, block_M=None, min_blocks=0, reg_slack=0, producer_warps=1,
                 ws=True, lazy_rescale=0, overlap=0, hoist_left=0, mask_split=False, hoist_keys=0,
                 vc_shift=0, vc_shift_ok=False, pingpong=0, **flags):
    """``lmk_cols`` is a count of landmark columns (``macros.tile_landmark``), 0 =
    general; ``pack`` a group size (0 = rows not packed, else at most ``block_M``);
    ``min_blocks`` one of :data:`MIN_BLOCKS`; ``reg_slack`` one of :data:`REG_SLACKS`,
    non-zero only with ``min_blocks`` (TileLang's default split has nothing of ours to
    leave); ``producer_warps`` one of :data:`PRODUCER_WARPS`, 1 without warp specialisation
    (``ws`` False: no producer); ``lazy_rescale`` one of :data:`LAZY_RESCALES`, not with
    ``overlap``; ``hoist_left`` one of :data:`HOIST_LEFT`, 1 only with ``mask_split`` and
    without ``overlap`` 1 or 2 or ``pack`` (paths it was not built or run on); ``hoist_keys``
    one of :data:`HOIST_KEYS`, not with ``overlap`` 1 or 2; ``vc_shift`` one of
    :data:`VC_SHIFT`, 1 only where ``vc_shift_ok`` (``launch.vc_shift_acts``: ``lmk_const``
    with ``v_chunk = 1`` and one landmark column, so ``C == block_N``); ``pingpong`` one of
    :data:`PINGPONG`, not with ``hoist_keys``; the other knobs named in ``flags`` are bools."""
    # each int knob (launch.INT_KNOBS): its value, its off value, whether another value may
    # stand here, and where one may
    for name, value, off, ok, where in (
            ("min_blocks", min_blocks, 0, True, ""),
            ("reg_slack", reg_slack, 0, min_blocks, "non-zero only with min_blocks"),
            ("producer_warps", producer_warps, 1, ws,
             "1 without warp specialisation (no producer)"),
            ("lazy_rescale", lazy_rescale, 0, not overlap, "not with overlap"),
            ("hoist_left", hoist_left, 0, mask_split and overlap not in OVERLAP_OLD and not pack,
             "1 only with mask_split and without overlap 1 or 2 or pack (not built or run "
             "there)"),
            ("hoist_keys", hoist_keys, 0, overlap not in OVERLAP_OLD,
             "not with overlap 1 or 2 (not built or run there)"),
            ("vc_shift", vc_shift, 0, vc_shift_ok,
             "1 only with lmk_const, v_chunk=1 and lmk_cols=1 (there C == block_N)"),
            ("pingpong", pingpong, 0, not hoist_keys,
             "not with hoist_keys (TileLang 0.1.15's SplitHostDevice fails: 'variable hk has "
             "been used before definition')")):
        values = globals()[INT_KNOBS[name]]
        if value not in values or isinstance(value, bool) or (value != off and not ok):
            raise ValueError(f"{name}={value!r}: one of {values} (kernels.{INT_KNOBS[name]})"
                             + (f", {where}" if where else ""))
    if not (isinstance(lmk_cols, int) and not isinstance(lmk_cols, bool) and lmk_cols >= 0):
        raise ValueError(f"lmk_cols={lmk_cols!r}: a non-negative int")
    if not (isinstance(pack, int) and not isinstance(pack, bool) and 0 <= pack
            and (block_M is None or pack <= block_M)):
        raise ValueError(f"pack={pack!r}: an int from 0 (off) to block_M={block_M} (heads per tile)")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{name}={value!r}: a bool")


def _check_cols(name, n, D, dim):
    """A column-count knob (``o_cols``, ``qk_cols``, ``v_cols``) is an int from 0 (all of the
    tile's ``D`` columns, its head dim ``dim``) to ``D``."""
    if not (isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= D):
        raise ValueError(f"{name}={n!r}: an int from 0 (all {dim}={D} columns) to {dim}")


def _check_in_cols(qk_cols, v_cols, Dqk, Dv):
    """``qk_cols`` / ``v_cols`` (knobs of :func:`fwd_tc`: the columns of ``Q`` and ``K`` / of
    ``V`` where the call's inputs have fewer than the tile's ``Dqk`` / ``Dv``, 0 = as many) are
    ints from 0 to the tile's head dim."""
    _check_cols("qk_cols", qk_cols, Dqk, "Dqk")
    _check_cols("v_cols", v_cols, Dv, "Dv")


def _check_o_cols(o_cols, Dv, split=False):
    """``o_cols`` (the ``o_cols`` knob: the columns of ``O`` a kernel writes, 0 = ``Dv``) is an
    int from 0 to ``Dv``, 0 where the kernel writes split partials (``split``: fp32 scratch of
    ``Dv`` columns; the combine writes ``o``, :func:`combine`)."""
    _check_cols("o_cols", o_cols, Dv, "Dv")
    if o_cols and split:
        raise ValueError(f"o_cols={o_cols!r} with split: the partials keep Dv={Dv} columns "
                         "(the combine writes o's)")


def _turn(step, kb, n_it, dep=0.0, C=0):
    """``pingpong``'s turns at the tensor cores (:data:`PINGPONG_SRC`): ``step`` 0 / 2 waits
    for this group's turn before ``Q K^T`` / ``P V`` of tile ``kb``, 1 / 3 hands the turn
    to the other group after it. An extern call: TileLang 0.1.15's warp specialisation drops
    ``T.sync_threads`` and ``T.named_barrier_arrive`` from the consumer's pipelined loop."""
    T.evaluate(T.call_extern("int32", "hils_pp_turn", step, kb, n_it, dep, C))


def _fwd_tc_body(Dqk, Dv, dtype, mask_lmk, expand_to_chunk, q_blhd, kv_blhd, block_M, block_N,
                 num_stages, threads, split, ws, lmk_zero="tile", mask_split=False, fold=False,
                 lmk_cols=0, fast_exp2=False, scale_fold=False, win_u32=False,
                 lmk_rows_j0=False, pack=0, min_blocks=0, overlap=0, v_chunk=0, wide=False,
                 lmk_const=False, reg_slack=0, producer_warps=1, lazy_rescale=0, hoist_left=0,
                 hoist_keys=0, vc_shift=0, pingpong=0, o_cols=0, qk_cols=0, v_cols=0):
    """Body of :func:`fwd_tc` / :func:`fwd_tc_nows` (see their docstrings).

    One program per (query block [, split], query head, batch). It loads its
    ``block_M`` queries once, then walks the key range ``[lo, hi)`` that the
    block can see (``macros.block_key_range``) in tiles of ``block_N`` keys
    starting *at* ``lo`` (keys left of the block's first window are never
    read). ``K`` tiles come by bulk copy; the score tile ``Q K^T`` is masked by
    select (NaN in an invisible ``k`` cannot leak), and with ``mask_lmk`` the
    ``V`` tile is loaded with landmark rows (and rows past ``hi``) zero-filled,
    so ``0 * NaN`` cannot leak through ``P @ V``.

    ``split=False``: grid ``(cdiv(Lq, block_M), Hq, B)``, writes ``O`` and
    ``LSE`` directly. ``split=True`` (decode): grid ``(cdiv(Lq, block_M) * S,
    Hq, B)``; split ``s`` takes its share of the block's key tiles and writes a
    normalised partial ``Op[b, h, s]`` (fp32) and its base-2 ``LSEp``
    (``macros.row_lse2``); :func:`combine` merges them.

    Performance knobs (all baked in; the defaults are the kernel as it was
    before they existed): ``lmk_zero`` (:data:`LMK_ZERO`), ``mask_split``
    (tiles inside every row's window skip the window test and only mask
    landmark columns, ``macros.tile_inside_windows``), ``fold`` (softmax
    arithmetic, ``macros.online_softmax_update``), ``lmk_cols`` (landmark test
    per score / V row as ``K`` compares against the tile's landmark columns
    instead of a float division, ``macros.tile_landmark``: valid only for calls
    with ``K * C >= block_N``, which the launcher guarantees; ``0`` = the
    general test), ``fast_exp2`` (the softmax exponentials as the bare
    ``ex2.approx.ftz`` instruction, ``macros.exp2``), ``scale_fold`` (the
    scale as one FMA in the exponent instead of a multiply in the mask select:
    valid only for calls with a positive normal fp32 ``scale_log2``, which the
    launcher decides per call, ``launch.scale_fold_ok``;
    ``macros.online_softmax_update``), ``win_u32`` (the window test of
    edge tiles as one unsigned compare, ``macros.visible``) and
    ``lmk_rows_j0`` (with ``lmk_zero="rows"``, ``mask_lmk`` and ``lmk_cols > 0``,
    ``launch.rows_j0_acts``: the tile's first landmark row computed once per
    tile into one int32 register that the landmark masks and
    ``macros.zero_landmark_rows`` share, the zeroing select on an integer
    condition, the rows as one static loop without the per-row-group barrier;
    no effect otherwise) and ``pack`` (GQA-packed rows, an int baked per call,
    0 = off: with ``pack = G = Hq / Hkv`` the G query heads of a key/value
    head share each tile, query by query: packed row ``t`` (``t = qb * block_M
    + i`` for row ``i`` of query block ``qb``) is query ``t // G`` of head ``hk *
    G + t % G``, a division by a constant; grid ``(cdiv(G * Lq, block_M) [*
    S], Hkv, B)``; valid only for ``G == Hq / Hkv``, which the launcher
    guarantees (``launch.call_knobs``); each K/V tile is read once for the G
    heads; rows past ``G * Lq`` compute on zero
    queries and are not stored) and ``min_blocks`` (:data:`MIN_BLOCKS`; 0 = TileLang's
    defaults: ``__launch_bounds__(threads + 128, 1)``, consumers 240 and producer 24
    registers after ``setmaxnreg``; ``n``: ``__launch_bounds__(threads + 128, n)``, so
    ptxas gives every thread :func:`launch_regs` at launch, and the consumers
    :func:`consumer_regs` after ``setmaxnreg``: ``n`` CTAs per SM where shared memory
    allows; with a 64-row tile and one consumer warp group, 2 lets one CTA's softmax
    run beside another's tensor work). Two lab knobs of session 8 were measured and
    removed in session 9: ``pdl`` (the combine as a programmatic dependent
    launch: no gain, with either launcher) and ``narrow`` (16-row ``mma.sync``
    decode tiles: 2-3x slower); BENCHMARKS.md. A manual FA3-style
    ``T.Pipelined(order=..., stage=...)`` schedule was tried: TileLang 0.1.15
    drops warp specialisation for it and refuses it when the consumer writes
    ``V_s`` (mask_lmk), so it is not offered.
    """
    if lmk_zero not in LMK_ZERO:
        raise ValueError(f"lmk_zero={lmk_zero!r}: one of {LMK_ZERO}")
    _check_o_cols(o_cols, Dv, split)
    _check_in_cols(qk_cols, v_cols, Dqk, Dv)
    _check_knobs(lmk_cols, pack, block_M, min_blocks, reg_slack, producer_warps, ws,
                 lazy_rescale, overlap, hoist_left, mask_split, hoist_keys, vc_shift,
                 vc_shift_acts(v_chunk, lmk_const, lmk_cols), pingpong, fast_exp2=fast_exp2,
                 scale_fold=scale_fold, win_u32=win_u32, lmk_rows_j0=lmk_rows_j0, wide=wide)
    regs = consumer_regs(threads, min_blocks, reg_slack) if min_blocks else None
    if reg_slack and regs < launch_regs(threads, min_blocks):
        raise ValueError(f"reg_slack={reg_slack}: consumers at {regs} registers, fewer than the "
                         f"{launch_regs(threads, min_blocks)} they launch with (threads={threads}, "
                         f"min_blocks={min_blocks}): setmaxnreg.inc would lower them")
    divisor = functools.partial(M.landmark_divisor, wide=wide)  # inv_c itself unless wide
    if mask_lmk and not ws and lmk_zero == "rows":
        # the software pipeline planner (no warp specialisation) refuses a second
        # writer of V_s after its copy ("multiple writes to overlapping regions")
        raise ValueError("lmk_zero='rows' needs warp specialisation (fwd_tc) with mask_lmk")
    if overlap and not (ws and (lmk_zero == "rows" or not mask_lmk)):
        raise ValueError("overlap needs warp specialisation (fwd_tc) and, with mask_lmk, "
                         "lmk_zero='rows'")
    if v_chunk not in V_CHUNK or (v_chunk > 1 and (block_N % (v_chunk * 8)
                                                   or Dv not in V_CHUNK_SPAN_DV)):
        raise ValueError(f"v_chunk={v_chunk!r}: one of {V_CHUNK} (kernels.V_CHUNK); a span "
                         f"n >= 2 needs block_N={block_N} a multiple of 8 n and Dv={Dv} one of "
                         f"{V_CHUNK_SPAN_DV} (launch.V_CHUNK_SPAN_DV)")
    if pingpong and not (ws and threads == 256 and block_M == 128 and not overlap and not split
                         and not lazy_rescale and not pack):
        raise ValueError("pingpong needs warp specialisation (fwd_tc), two consumer warp groups "
                         "(threads=256, block_M=128), the prefill grid (no split) and none of "
                         "overlap, lazy_rescale and pack (never built or run with it)")
    if overlap not in OVERLAP or isinstance(overlap, bool):
        raise ValueError(f"overlap={overlap!r}: an int, one of {OVERLAP} (kernels.OVERLAP)")
    if v_chunk and not (mask_lmk and ws and overlap not in OVERLAP_OLD):
        raise ValueError("v_chunk needs mask_lmk and warp specialisation (fwd_tc), "
                         "without overlap 1 or 2")
    v_zero = consumer_writes_v(mask_lmk, v_chunk, ws, lmk_zero)  # consumer writes V_s
    if pingpong and v_zero:  # its sync of both groups would meet a group waiting for its turn
        raise ValueError("pingpong needs the chunk view of v (v_chunk) with mask_lmk: the "
                         "consumers write V_s otherwise")
    rows_j0 = lmk_rows_j0 and rows_j0_acts(mask_lmk, lmk_zero, lmk_cols)  # one j0 register per tile
    if not isinstance(lmk_const, bool):
        raise ValueError(f"lmk_const={lmk_const!r}: a bool")
    if lmk_const:
        # every tile starts a chunk only with the view (v_chunk: launch.v_chunk_call), and its
        # landmark columns are the constants only where K * C == block_N (launch.lmk_const_acts);
        # constant_landmark_columns refuses a K that is not a positive divisor of block_N
        if not (v_chunk and mask_lmk):
            raise ValueError("lmk_const needs v_chunk and mask_lmk")
        lmk_cols = M.constant_landmark_columns(block_N, lmk_cols)

    B, Hq, Hkv, Lq, Lk = T.dynamic("B Hq Hkv Lq Lk")
    S = T.dynamic("S")
    accum = "float32"
    # qk_cols / v_cols: the inputs' own columns, the tiles' copies reading Dqk / Dv of them
    qk_w, v_w = (Dqk if qk_cols else 0), (Dv if v_cols else 0)  # _tile's width (0: all)
    q_shape = _shape(q_blhd, B, Hq, Lq, qk_cols or Dqk)
    k_shape = _shape(kv_blhd, B, Hkv, Lk, qk_cols or Dqk)
    v_shape = _shape(kv_blhd, B, Hkv, Lk, v_cols or Dv)
    if v_chunk:  # the chunk view of V (launch.v_chunk_view): strides are the call's,
        # int64 (the batch stride Hkv * Lk * Dv passes 2**31 in long contexts; as int32, the
        # default until 2026-12-05, the TMA descriptor got it wrapped: negative, or 0 at
        # exactly 2**32). TileLang 0.1.15's disk-cache key prints a stride variable by name,
        # not dtype: the names changed with the dtype, so no int32 kernel is served from a
        # cache made before.
        NC, Cm1 = T.dynamic("NC Cm1")
        sb, sh, sc, sl = T.dynamic("v5_sb v5_sh v5_sc v5_sl", "int64")
        v_param = T.StridedTensor((B, Hkv, NC, Cm1, v_cols or Dv), (sb, sh, sc, sl, 1), dtype)
    else:
        v_param = T.Tensor(v_shape, dtype)
    cols = o_cols or Dv  # the columns of o this kernel writes (_check_o_cols)
    o_shape = (B, Hq, S, Lq, Dv) if split else (B, Hq, Lq, cols)
    o_dtype = accum if split else dtype
    l_shape = (B, Hq, S, Lq) if split else (B, Hq, Lq)

    @T.prim_func  # named for producer_guard (the CUDA entry point hils_swa_fwd_tc_kernel)
    def hils_swa_fwd_tc(Q: T.Tensor(q_shape, dtype), K: T.Tensor(k_shape, dtype), V: v_param,
             O: T.Tensor(o_shape, o_dtype), LSE: T.Tensor(l_shape, accum),
             W: T.int32, C: T.int32, r: T.int32, inv_c: T.float32, scale_log2: T.float32):
        n_qb = T.ceildiv(pack * Lq, block_M) if pack else T.ceildiv(Lq, block_M)
        with T.Kernel(n_qb * S if split else n_qb, Hkv if pack else Hq, B,
                      threads=threads) as (bx, by, bz):
            if min_blocks:  # occupancy: launch bounds and the warp groups' register split
                T.annotate_min_blocks_per_sm(min_blocks)
                T.annotate_producer_reg_dealloc(PRODUCER_REGS)
                T.annotate_consumer_reg_alloc(regs)
            Q_s = T.alloc_shared([block_M, Dqk], dtype)
            K_s = T.alloc_shared([block_N, Dqk], dtype)
            V_s = T.alloc_shared([block_N, Dv], dtype)
            O_s = T.alloc_shared([block_M, Dv], o_dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum)
            acc_p = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, Dv], accum)
            m = T.alloc_fragment([block_M], accum)
            m_prev = T.alloc_fragment([block_M], accum)
            alpha = T.alloc_fragment([block_M], accum)
            l = T.alloc_fragment([block_M], accum)
            row_sum = T.alloc_fragment([block_M], accum)
            left_row = T.alloc_fragment([block_M], "int32")
            lazy_flag = T.alloc_local([1], "int32") if lazy_rescale else None
            pp_dep = T.alloc_local([1], accum) if pingpong else None
            pp_held = T.alloc_local([2], dtype) if pingpong == 2 else None

            if fast_exp2 or pingpong:  # one import: a second would replace the first
                T.import_source((M.EX2_APPROX_SRC if fast_exp2 else "")
                                + (PINGPONG_SRC if pingpong else ""))
            qb = bx // S if split else bx
            sp = bx % S if split else 0
            G = Hq // Hkv
            hk = by if pack else by // G  # packed: the launcher guarantees pack == Hq // Hkv
            q0 = qb * block_M  # first row (packed: packed row q0 + i is query (q0 + i) // pack)
            q_first = q0 // pack if pack else q0  # the tile's queries [q_first, q_end)
            q_end = T.min((q0 + block_M - 1) // pack + 1, Lq) if pack else q0 + block_M
            lo, hi = M.block_key_range(q_first, q_end, Lq, Lk, r, W, C, expand_to_chunk)
            if hoist_keys:  # HOIST_KEYS: once, in registers, before the loop uses them
                hk = T.alloc_var("int32", init=hk)
                hi = T.alloc_var("int32", init=hi)  # built on lo's expression: held too
                lo = T.alloc_var("int32", init=lo)
            n_kb = T.ceildiv(hi - lo, block_N)
            kb0 = 0
            n_it = n_kb
            if split:
                per = T.ceildiv(n_kb, S)
                kb0 = sp * per
                n_it = T.max(T.min(per, n_kb - kb0), 0)

            if pack:  # row i: packed row q0 + i (M.packed_row), zeros past pack * Lq (and
                # past a narrow q's columns, qk_cols)
                for i, d in T.Parallel(block_M, Dqk):
                    Q_s[i, d] = T.if_then_else(
                        T.And(q0 + i < pack * Lq, d < qk_cols) if qk_cols else q0 + i < pack * Lq,
                        _elem(Q, q_blhd, bz, *M.packed_row(hk, q0 + i, pack), d),
                        T.Cast(dtype, 0))
            else:
                T.copy(_tile(Q, q_blhd, bz, by, q0, block_M, qk_w), Q_s)
            M.row_left_edges(left_row, q0, block_M, Lq, Lk, r, W, C, expand_to_chunk, True, pack)
            M.softmax_init(acc_o, m, l)
            # hoist_left: the last query's left edge, once (HOIST_LEFT)
            left_last = _hoisted_left(hoist_left, q_end, Lq, Lk, r, W, C, expand_to_chunk)

            policy = T.GemmWarpPolicy.FullRow
            if overlap:
                _overlap_loop(K, V, Q_s, K_s, V_s, acc_s, acc_p, acc_o, m, m_prev, alpha, l,
                              row_sum, left_row, kv_blhd, bz, hk, lo, hi, kb0, n_it, q0, q_first,
                              q_end, block_M, block_N, Dv, dtype, num_stages, Lq, Lk, r, W, C,
                              divisor(inv_c), mask_lmk, expand_to_chunk, scale_log2, mask_split,
                              fold, lmk_cols, fast_exp2, scale_fold, win_u32, rows_j0, pack, v_zero,
                              policy, threads, overlap in (2, 4), overlap not in OVERLAP_OLD,
                              v_chunk, vc_shift, left_last, qk_w, v_w)
            else:
                for kb in T.Pipelined(n_it, num_stages=num_stages):
                    k0 = lo + (kb0 + kb) * block_N
                    T.copy(_tile(K, kv_blhd, bz, hk, k0, block_N, qk_w), K_s)
                    if v_chunk:
                        _load_v_chunks(V, V_s, bz, hk, k0, C, block_N, v_chunk, vc_shift, v_w)
                    else:
                        _load_v(V, V_s, kv_blhd, bz, hk, k0, hi, r, C, divisor(inv_c), block_N,
                                Dv, dtype, mask_lmk, ws, lmk_zero, lmk_cols, v_cols)
                    if pingpong:
                        _turn(0, kb, n_it)
                    if pingpong == 2:  # the turn handed over once the product is issued
                        T.wgmma_gemm(Q_s, K_s, acc_s, transpose_B=True, clear_accum=True,
                                     policy=policy)
                        _turn(1, kb, n_it)
                        T.wait_wgmma(0)
                        T.warpgroup_fence_operand(acc_s, num_regs=block_M * block_N // threads)
                        pp_held[0] = K_s[0, 0]  # K_s released after the wait (_overlap_loop)
                    else:
                        T.gemm(Q_s, K_s, acc_s, transpose_B=True, clear_accum=True,
                               policy=policy)
                        if pingpong:
                            _turn(1, kb, n_it)
                    j0 = None
                    if rows_j0:
                        j0 = M.tile_landmark_start(k0, r, C, mask_lmk, lmk_cols)
                    _score_step(acc_s, m, m_prev, alpha, l, row_sum, left_row, q0, q_first, q_end,
                                k0, j0, block_M, block_N, Lq, Lk, r, W, C, divisor(inv_c), mask_lmk,
                                expand_to_chunk, scale_log2, mask_split, fold, lmk_cols,
                                fast_exp2, scale_fold, win_u32, pack, lazy_rescale, left_last)
                    T.copy(acc_s, acc_p)
                    M.rescale_output(acc_o, alpha, block_M, Dv, True, lazy_flag)
                    if v_zero:
                        if lmk_zero == "rows":
                            M.zero_landmark_rows(V_s, k0, block_N, Dv, r, C, divisor(inv_c), dtype,
                                                 True, j0, lmk_cols)
                        else:
                            j0 = M.tile_landmark_start(k0, r, C, mask_lmk, lmk_cols)
                            for j, d in T.Parallel(block_N, Dv):
                                V_s[j, d] = T.if_then_else(
                                    M.key_kept(k0, j, hi, r, C, divisor(inv_c), mask_lmk, lmk_cols,
                                               j0),
                                    V_s[j, d],
                                    T.Cast(dtype, 0))
                    if pingpong:  # the turn after the softmax step: see PINGPONG_SRC
                        pp_dep[0] = 0
                        for i in T.Parallel(block_M):
                            pp_dep[0] += l[i]
                        _turn(2, kb, n_it, pp_dep[0], C)
                    if pingpong == 2:
                        T.wgmma_gemm(acc_p, V_s, acc_o, policy=policy)
                        _turn(3, kb, n_it)
                        T.wait_wgmma(0)
                        T.warpgroup_fence_operand(acc_o, num_regs=block_M * Dv // threads)
                        T.warpgroup_fence_operand(acc_p,
                                                  num_regs=block_M * block_N // threads // 2)
                        pp_held[1] = V_s[0, 0]
                    else:
                        T.gemm(acc_p, V_s, acc_o, policy=policy)
                        if pingpong:
                            _turn(3, kb, n_it)

            M.finalize_output(acc_o, l, block_M, Dv, True)
            if pack:
                for i in T.Parallel(block_M):
                    if q0 + i < pack * Lq:
                        h, qi = M.packed_row(hk, q0 + i, pack)
                        if split:
                            LSE[bz, h, sp, qi] = M.row_lse2(m[i], l[i])
                        else:
                            LSE[bz, h, qi] = M.row_lse(m[i], l[i])
                T.copy(acc_o, O_s)
                for i, d in T.Parallel(block_M, cols):  # cols = Dv: the IR of before o_cols
                    if q0 + i < pack * Lq:
                        h, qi = M.packed_row(hk, q0 + i, pack)
                        if split:
                            O[bz, h, sp, qi, d] = O_s[i, d]
                        else:
                            O[bz, h, qi, d] = O_s[i, d]
            else:
                for i in T.Parallel(block_M):
                    if q0 + i < Lq:
                        if split:
                            LSE[bz, by, sp, q0 + i] = M.row_lse2(m[i], l[i])
                        else:
                            LSE[bz, by, q0 + i] = M.row_lse(m[i], l[i])
                T.copy(acc_o, O_s)
                if split:
                    T.copy(O_s, O[bz, by, sp, q0:q0 + block_M, :])
                elif o_cols:  # the tile's Dv columns into o's o_cols: the copy engine drops
                    # the rest where o's rows allow a tensor map, else a predicated SIMT copy
                    T.copy(O_s, O[bz, by, q0:q0 + block_M, 0:Dv])
                else:
                    T.copy(O_s, O[bz, by, q0:q0 + block_M, :])

    func = hils_swa_fwd_tc
    if producer_warps != 1:  # another entry point, which producer_guard leaves as TileLang
        # wrote it (and another disk-cache key: the name is in it)
        func = func.with_attr("global_symbol", PG.KERNEL_ALL_WARPS)
    # the guard's version in TileLang's disk-cache key (producer_guard.GUARD_VERSION)
    return func.with_attr("hils_swa_producer_guard", PG.GUARD_VERSION) if ws else func


@tilelang.jit(target=HOPPER)
def fwd_tc(Dqk: int, Dv: int, dtype: str, mask_lmk: bool, expand_to_chunk: bool,
           q_blhd: bool, kv_blhd: bool, block_M: int, block_N: int, num_stages: int,
           threads: int, split: bool, lmk_zero: str = "tile", mask_split: bool = False,
           fold: bool = False, lmk_cols: int = 0, fast_exp2: bool = False,
           scale_fold: bool = False, win_u32: bool = False, lmk_rows_j0: bool = False,
           pack: int = 0, min_blocks: int = 0, overlap: int = 0, v_chunk: int = 0,
           wide: bool = False, lmk_const: bool = False, reg_slack: int = 0,
           producer_warps: int = 1, lazy_rescale: int = 0, hoist_left: int = 0,
           hoist_keys: int = 0, vc_shift: int = 0, pingpong: int = 0, o_cols: int = 0,
           qk_cols: int = 0, v_cols: int = 0):
    """Tensor-core forward for bf16/fp16 on sm_90a, warp-specialised.

    Baked in: head dims ``Dqk``/``Dv``, ``dtype``, the two flags, the input
    layouts, the tile ``block_M x block_N``, the pipeline depth ``num_stages``
    (``T.Pipelined``), ``threads`` (consumer threads; TileLang adds a producer
    group that issues the TMA / cp.async loads) and ``split``; and the
    performance knobs ``lmk_zero`` (``"tile"``: every V tile re-written with
    non-kept rows zeroed; ``"rows"``: only its landmark rows zeroed),
    ``mask_split`` (window test only on tiles that cross a window edge),
    ``fold`` (one FMA per score in the softmax) and ``lmk_cols`` (``K``: the
    landmark test as ``K`` integer compares per score / V row against the
    tile's landmark columns, ``macros.tile_landmark``; exact only for calls
    with ``K * chunk_size >= block_N`` in the kernel frame, so the launcher
    bakes ``K`` per call, ``launch.lmk_cols_for``; ``0`` = the general float
    test, valid for every call), ``fast_exp2`` (the softmax exponentials as the
    bare ``ex2.approx.ftz`` instruction instead of ``exp2f``), ``scale_fold``
    (``exp2(s * scale - m)`` as one FMA, the mask selecting raw scores; exact
    only for a positive normal fp32 ``scale_log2``, so the launcher bakes it
    per call, ``launch.scale_fold_ok``), ``win_u32`` (the edge tiles'
    window test as one unsigned compare per score) and ``lmk_rows_j0`` (with
    ``lmk_zero="rows"``, ``mask_lmk`` and ``lmk_cols > 0``, ``launch.rows_j0_acts``:
    the landmark-row zeroing from the tile's one int32 first-landmark register,
    integer select, static rows without the per-row-group barrier;
    ``macros.zero_landmark_rows``) and ``pack`` (``G``: GQA-packed rows of the
    ``G = Hq / Hkv`` query heads of one key/value head; 0 = off; :func:`_fwd_tc_body`)
    and ``min_blocks`` (CTAs per SM the launch bounds and the ``setmaxnreg`` split are
    made for, :data:`MIN_BLOCKS`; 0 = TileLang's defaults), ``overlap`` (a lab knob,
    :data:`OVERLAP`: the key loop with each tile's softmax beside the previous tile's
    ``P @ V``, :func:`_overlap_loop`; never shipped, 14-16% slower on the H200, session 25;
    3 and 4 its lean form and control, session 51, which take the chunk view and the hoists:
    6.2-6.5% slower than the shipped loop at D = 128 on an H100, its control 8.1-8.6%)
    and ``v_chunk`` (``V`` is then the 5-D chunk view ``(B, Hkv, Lk / C, C - 1, Dv)`` of
    ``launch.v_chunk_view``, its shape and strides dynamic, read by :func:`_load_v_chunks`:
    the copy engine writes each chunk's landmark row as zeros and the consumer zeroes
    nothing; :data:`V_CHUNK`: 1 for ``C`` a multiple of ``block_N``, ``n`` = 2 or 4 for
    ``C = block_N / n``, one copy per chunk; exact only for the calls ``launch.v_chunk_call``
    admits with that ``C``, which the launcher checks per call, ``launch.call_knobs``)
    and ``wide`` (the landmark test's float quotient taken twice, exact for the kernel
    frame's positions up to ``2**29`` where the single one is exact below ``2**24``,
    ``macros.is_landmark``; the first one once per tile where a tile tests its positions
    one by one, ``macros.tile_divisor``; baked per call by the launcher for ``Lk + C >= 2**22``,
    ``launch.wide_positions``; off, a kernel's IR is what it was before the knob) and
    ``lmk_const`` (session 38; in the shipped prefill config since session 39, the
    64 x 64 split-KV config since session 40; with
    ``v_chunk`` and ``lmk_cols = K > 0``: the landmark columns as the constants ``C - 1,
    2 C - 1, ..., block_N - 1`` instead of compares against the tile's ``j0`` register,
    ``macros.constant_landmark_columns``;
    exact only for calls with ``K * C == block_N`` whose every tile starts a chunk, which
    ``launch.lmk_const_acts`` decides per call) and ``reg_slack`` (session 40, a lab knob,
    :data:`REG_SLACKS`: consumer registers left below the exact fill of the pool,
    :func:`consumer_regs`; with ``min_blocks`` only), ``lazy_rescale`` (session 43, a lab
    knob, :data:`LAZY_RESCALES`: the conditional output rescale of
    ``macros.online_softmax_update`` / ``macros.rescale_output``), ``hoist_left`` (session 44,
    :data:`HOIST_LEFT`: ``mask_split``'s last-row left edge computed once before the key loop;
    ``launch.shipped_config`` sets it since session 45), ``hoist_keys`` (session 45,
    :data:`HOIST_KEYS`: the key/value head and the block's key range held in registers
    from before the key loop; ``launch.shipped_config`` sets it since session 46), ``vc_shift``
    (session 47, a lab knob, :data:`VC_SHIFT`: the chunk view's tile coordinates as a shift where
    ``lmk_const`` with ``v_chunk = 1`` puts ``C == block_N``), ``pingpong`` (session 52, a lab
    knob, :data:`PINGPONG`: the 128-row tile's two consumer warp groups take turns at the
    tensor cores, :data:`PINGPONG_SRC`; not with ``hoist_keys``) and ``producer_warps`` (session
    41, :data:`PRODUCER_WARPS`: 1, the producer group's warp 0 alone runs its key loop,
    :mod:`producer_guard`, the fix of a hang; 4, the lab's control, TileLang's code) and
    ``o_cols`` (session 55; not a speed knob: 0 = ``Dv``, else ``O`` has that many columns, the
    first of the tile's ``Dv``: a call whose head dims the adapter padded gets its own ``o``
    written. The prefill grid's tile goes by the copy engine where ``o``'s rows
    allow a tensor map (rows of a multiple of 16 bytes), which drops the columns past
    ``o_cols`` itself, else by a predicated SIMT copy, which the launcher does not bake
    (slower than a copy-out, ``launch.TMA_STRIDE``); the packed rows by their element loop;
    refused with ``split``, whose partials keep ``Dv`` columns: :func:`combine` takes it),
    ``qk_cols`` / ``v_cols`` (session 56; not speed knobs: 0 = ``Dqk`` / ``Dv``, else ``Q`` and
    ``K`` / ``V`` have that many columns, the call's own inputs where the adapter rounded a
    head dim up: the tiles' copies read ``Dqk`` / ``Dv`` columns of them, and the copy engine
    fills the box's columns past the tensor map's width with zeros, as it fills rows past
    ``Lk``; they add nothing to a score or to ``o``. The device code is the full-width
    kernel's; only the tensor maps change, which need rows of a multiple of 16 bytes
    (``launch.in_cols`` refuses others). The packed rows' element loop tests the column).
    The knob defaults are the kernel as first shipped, but for ``producer_warps``. The
    kernel's entry point is ``hils_swa_fwd_tc_kernel`` (``_allwarps_kernel`` with
    ``producer_warps = 4``). Sequence lengths, batch, heads,
    the window, the chunk and the scale are runtime arguments: one compile serves every
    call of a configuration.
    """
    return _fwd_tc_body(Dqk, Dv, dtype, mask_lmk, expand_to_chunk, q_blhd, kv_blhd, block_M,
                        block_N, num_stages, threads, split, True, lmk_zero, mask_split, fold,
                        lmk_cols, fast_exp2, scale_fold, win_u32, lmk_rows_j0, pack, min_blocks,
                        overlap, v_chunk, wide, lmk_const, reg_slack, producer_warps,
                        lazy_rescale, hoist_left, hoist_keys, vc_shift, pingpong, o_cols,
                        qk_cols, v_cols)


@tilelang.jit(target=HOPPER,
              pass_configs={tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True,
                            tilelang.PassConfigKey.TL_DISABLE_TMA_LOWER: True})
def fwd_tc_nows(Dqk: int, Dv: int, dtype: str, mask_lmk: bool, expand_to_chunk: bool,
                q_blhd: bool, kv_blhd: bool, block_M: int, block_N: int, num_stages: int,
                threads: int, split: bool, lmk_zero: str = "tile", mask_split: bool = False,
                fold: bool = False, lmk_cols: int = 0, fast_exp2: bool = False,
                scale_fold: bool = False, win_u32: bool = False, lmk_rows_j0: bool = False,
                pack: int = 0, min_blocks: int = 0, overlap: int = 0, v_chunk: int = 0,
                wide: bool = False, lmk_const: bool = False, reg_slack: int = 0,
                producer_warps: int = 1, lazy_rescale: int = 0, hoist_left: int = 0,
                hoist_keys: int = 0, vc_shift: int = 0, pingpong: int = 0,
                o_cols: int = 0, qk_cols: int = 0, v_cols: int = 0):
    """Same kernel as :func:`fwd_tc` without warp specialisation (and without TMA).

    Baked in: as :func:`fwd_tc`, knobs included. All ``threads`` compute; the
    loads of the next ``num_stages - 1`` tiles are issued ahead inside the
    software pipeline (``T.Pipelined``) instead of by a producer warp group.

    Not used by the launcher: TileLang 0.1.15 cannot lower it ("Downcast from
    tirx.Sub to ir.IntImm failed"; pinned by
    ``tests/test_tilelang_compile.py::test_no_ws_variant_still_fails_to_lower``).
    Kept as the reference point the first GPU sweeps compared against.
    """
    return _fwd_tc_body(Dqk, Dv, dtype, mask_lmk, expand_to_chunk, q_blhd, kv_blhd, block_M,
                        block_N, num_stages, threads, split, False, lmk_zero, mask_split, fold,
                        lmk_cols, fast_exp2, scale_fold, win_u32, lmk_rows_j0, pack, min_blocks,
                        overlap, v_chunk, wide, lmk_const, reg_slack, producer_warps,
                        lazy_rescale, hoist_left, hoist_keys, vc_shift, pingpong, o_cols,
                        qk_cols, v_cols)


@tilelang.jit(target=HOPPER)
def combine(Dv: int, dtype: str, threads: int = 128, o_cols: int = 0):
    """Merge the split partials of :func:`fwd_tc` (``split=True``) into ``O``/``LSE``.

    Baked in: ``Dv``, the output ``dtype`` and ``threads``. One program per
    (query, head, batch) loops over the ``S`` splits (dynamic). The partial LSEs
    are base 2 (``macros.row_lse2``): ``m = max_s lse_s``, ``w_s = 2^(lse_s - m)``,
    ``l = sum_s w_s``, ``o = sum_s w_s o_s / l``, ``lse = (m + log2 l) ln 2``, and the
    row is finished by the single-pass kernels' own macros
    (``macros.finalize_output``, ``macros.row_lse``): a split with ``lse_s = -inf``
    weighs 0, a row with no split left gets ``o = 0`` and ``lse = -inf``, NaN stays
    NaN, and a split that saw a score of ``+inf`` (its ``lse_s = +inf``) makes the row's
    ``lse`` ``+inf`` and ``o`` NaN, the single-pass kernels' result. ``o_cols`` (baked; 0 =
    ``Dv``): ``O`` has that many columns, the partials' first ones (a call whose head dims the
    adapter padded, ``launch.run_cuda``).
    """
    _check_o_cols(o_cols, Dv)
    cols = o_cols or Dv  # cols = Dv: the IR of before o_cols
    B, Hq, S, Lq = T.dynamic("B Hq S Lq")
    accum = "float32"

    @T.prim_func
    def main(Op: T.Tensor((B, Hq, S, Lq, Dv), accum), LSEp: T.Tensor((B, Hq, S, Lq), accum),
             O: T.Tensor((B, Hq, Lq, cols), dtype), LSE: T.Tensor((B, Hq, Lq), accum)):
        with T.Kernel(Lq, Hq, B, threads=threads) as (bx, by, bz):
            acc = T.alloc_fragment([1, Dv], accum)
            l = T.alloc_fragment([1], accum)
            st = T.alloc_local([2], accum)  # max of the partial LSEs, weight of a split
            st[0] = -T.infinity(accum)
            for s in T.serial(S):
                st[0] = T.max(st[0], LSEp[bz, by, s, bx])
            ref = M.finite_or_0(st[0])  # a split that saw +inf weighs +inf: lse +inf, o NaN
            T.clear(l)
            T.clear(acc)
            for s in T.serial(S):
                st[1] = T.exp2(LSEp[bz, by, s, bx] - ref)
                for i in T.Parallel(1):
                    l[i] = l[i] + st[1]
                for i, d in T.Parallel(1, Dv):
                    acc[i, d] = acc[i, d] + st[1] * Op[bz, by, s, bx, d]
            M.finalize_output(acc, l, 1, Dv, True)
            for i, d in T.Parallel(1, cols):
                O[bz, by, bx, d] = acc[i, d]
            for i in T.Parallel(1):
                LSE[bz, by, bx] = M.row_lse(st[0], l[i])

    return main


# --------------------------------------------------------------------------------------
# Row-per-thread kernels: fp32 on the GPU (CUDA cores) and the CPU kernel (C target)
# --------------------------------------------------------------------------------------
def _rowwise_body(Dqk, Dv, dtype, mask_lmk, expand_to_chunk, q_blhd, kv_blhd, block_M, block_N,
                  gpu, lmk_zero="tile", mask_split=False, fold=False, lmk_cols=0, fast_exp2=False,
                  scale_fold=False, win_u32=False, lmk_rows_j0=False, wide=False, lazy=0,
                  hoist=0, o_cols=0):
    """Blocked forward on CUDA or C cores: the CPU kernel (``gpu=False``: a
    program handles ``block_M`` queries with ``T.gemm`` on local tiles) and
    the fp32 GPU kernel (``gpu=True``: one thread per query, ``block_M = 1``
    per thread, scalar FMA loops so fp32 stays fp32 instead of tf32).

    The GPU kernel's ``block_M`` threads walk the key range of their whole block
    (:func:`macros.block_key_range` over its rows) and load each key tile once into
    shared memory, all threads together; a thread adds to its output only the ``v`` rows of
    keys in its own row's range, so a NaN in a ``v`` row that other rows of the block see
    reaches none of its rows (no ``p = 0`` times NaN; the tensor-core kernel's documented
    deviation does not apply here). Before session 43 each thread held its own ``K`` and
    ``V`` tiles in local memory: 16.6 KB of stack a thread at D = 128, 34 KB at D = 256,
    which the driver backs for every thread an SM can hold (2048 x 132 SMs: 4.5 / 9.2 GB
    a process, kept for the context's life); conformance workers on one GPU ran out of
    memory with it (sessions 41 and 43, ``layout``'s fp32 D = 128 cases). ``o_cols``: as
    :func:`fwd_tc`'s (0 = ``Dv``), the first columns of each row written."""
    _check_o_cols(o_cols, Dv)
    cols = o_cols or Dv  # cols = Dv: the IR of before o_cols
    _check_knobs(lmk_cols, lazy_rescale=lazy, hoist_left=hoist, mask_split=mask_split,
                 fast_exp2=fast_exp2, scale_fold=scale_fold, win_u32=win_u32,
                 lmk_rows_j0=lmk_rows_j0, wide=wide)
    if gpu and lmk_zero != "tile":
        raise ValueError(f"lmk_zero={lmk_zero!r}: the fp32 GPU kernel zero-fills on load ('tile')")
    divisor = functools.partial(M.landmark_divisor, wide=wide)  # inv_c itself unless wide
    rows_j0 = lmk_rows_j0 and rows_j0_acts(mask_lmk, lmk_zero, lmk_cols)
    B, Hq, Hkv, Lq, Lk = T.dynamic("B Hq Hkv Lq Lk")
    accum = "float32"
    q_shape = _shape(q_blhd, B, Hq, Lq, Dqk)
    k_shape = _shape(kv_blhd, B, Hkv, Lk, Dqk)
    v_shape = _shape(kv_blhd, B, Hkv, Lk, Dv)
    bm = 1 if gpu else block_M          # rows held by one executor
    threads = block_M if gpu else 1

    @T.prim_func
    def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(k_shape, dtype), V: T.Tensor(v_shape, dtype),
             O: T.Tensor((B, Hq, Lq, cols), dtype), LSE: T.Tensor((B, Hq, Lq), accum),
             W: T.int32, C: T.int32, r: T.int32, inv_c: T.float32, scale_log2: T.float32):
        with T.Kernel(T.ceildiv(Lq, block_M), Hq, B, threads=threads) as (bx, by, bz):
            q_l = T.alloc_local([bm, Dqk], accum)
            if gpu:  # one key tile for the block's threads
                k_l = T.alloc_shared([block_N, Dqk], accum)
                v_l = T.alloc_shared([block_N, Dv], accum)
            else:
                k_l = T.alloc_local([block_N, Dqk], accum)
                v_l = T.alloc_local([block_N, Dv], accum)
            acc_s = T.alloc_local([bm, block_N], accum)
            acc_o = T.alloc_local([bm, Dv], accum)
            m = T.alloc_local([bm], accum)
            m_prev = T.alloc_local([bm], accum)
            alpha = T.alloc_local([bm], accum)
            l = T.alloc_local([bm], accum)
            row_sum = T.alloc_local([bm], accum)
            left_row = T.alloc_local([bm], "int32")

            hk = by // (Hq // Hkv)
            q0 = bx * block_M
            lo, hi = M.block_key_range(q0, q0 + block_M, Lq, Lk, r, W, C, expand_to_chunk)
            if gpu:  # this thread's row, and the keys it can see
                q0 = bx * block_M + T.get_thread_binding()
                row_lo, row_hi = M.block_key_range(q0, q0 + 1, Lq, Lk, r, W, C, expand_to_chunk)
            T.clear(q_l)
            for i, d in T.grid(bm, Dqk):
                if q0 + i < Lq:
                    q_l[i, d] = _elem(Q, q_blhd, bz, by, q0 + i, d)
            M.row_left_edges(left_row, q0, bm, Lq, Lk, r, W, C, expand_to_chunk, False)
            M.softmax_init(acc_o, m, l)
            left_last = _hoisted_left(hoist, q0 + bm, Lq, Lk, r, W, C, expand_to_chunk)
            for kb in T.serial(T.ceildiv(hi - lo, block_N)):
                k0 = lo + kb * block_N
                j0 = None
                if rows_j0:
                    j0 = M.tile_landmark_start(k0, r, C, mask_lmk, lmk_cols)
                if gpu:
                    j0 = M.tile_landmark_start(k0, r, C, mask_lmk, lmk_cols)
                    for j, d in T.Parallel(block_N, Dqk):
                        k_l[j, d] = T.if_then_else(
                            M.key_kept(k0, j, hi, r, C, divisor(inv_c), mask_lmk, lmk_cols, j0),
                            _elem(K, kv_blhd, bz, hk, k0 + j, d), T.Cast(accum, 0))
                    for j, d in T.Parallel(block_N, Dv):
                        v_l[j, d] = T.if_then_else(
                            M.key_kept(k0, j, hi, r, C, divisor(inv_c), mask_lmk, lmk_cols, j0),
                            _elem(V, kv_blhd, bz, hk, k0 + j, d), T.Cast(accum, 0))
                elif lmk_zero == "rows":  # as the bulk copy: every row < Lk, then landmark rows
                    T.clear(k_l)
                    T.clear(v_l)
                    for j in T.serial(block_N):
                        if k0 + j < Lk:
                            for d in T.serial(Dqk):
                                k_l[j, d] = _elem(K, kv_blhd, bz, hk, k0 + j, d)
                            for d in T.serial(Dv):
                                v_l[j, d] = _elem(V, kv_blhd, bz, hk, k0 + j, d)
                    if mask_lmk:
                        M.zero_landmark_rows(v_l, k0, block_N, Dv, r, C, divisor(inv_c), accum,
                                             False, j0, lmk_cols)
                else:
                    T.clear(k_l)
                    T.clear(v_l)
                    j0 = M.tile_landmark_start(k0, r, C, mask_lmk, lmk_cols)
                    for j in T.serial(block_N):
                        if M.key_kept(k0, j, hi, r, C, divisor(inv_c), mask_lmk, lmk_cols, j0):
                            for d in T.serial(Dqk):
                                k_l[j, d] = _elem(K, kv_blhd, bz, hk, k0 + j, d)
                            for d in T.serial(Dv):
                                v_l[j, d] = _elem(V, kv_blhd, bz, hk, k0 + j, d)
                T.clear(acc_s)
                if gpu:
                    for j, d in T.grid(block_N, Dqk):
                        acc_s[0, j] = acc_s[0, j] + q_l[0, d] * k_l[j, d]
                else:
                    T.gemm(q_l, k_l, acc_s, transpose_B=True)
                if mask_split:
                    _mask_split(acc_s, left_row, q0, k0, bm, block_N, Lq, Lk, r, W, C,
                                divisor(inv_c), mask_lmk, expand_to_chunk,
                                None if scale_fold else scale_log2,
                                False, lmk_cols, win_u32, j0, 0, None, None, left_last)
                else:
                    M.mask_scores(acc_s, left_row, q0, k0, bm, block_N, Lq, Lk, r, C,
                                  divisor(inv_c), mask_lmk, None if scale_fold else scale_log2,
                                  False, lmk_cols,
                                  win_u32, j0)
                M.online_softmax_update(acc_s, m, m_prev, alpha, l, row_sum, bm, block_N,
                                        False, fold, scale_log2 if scale_fold else None, fast_exp2,
                                        lazy)
                M.rescale_output(acc_o, alpha, bm, Dv, False)
                if gpu:  # v rows of keys outside this row's range: never added (NaN-safe)
                    for j in T.serial(block_N):
                        if T.And(k0 + j >= row_lo, k0 + j < row_hi):
                            for d in T.serial(Dv):
                                acc_o[0, d] = acc_o[0, d] + acc_s[0, j] * v_l[j, d]
                else:
                    T.gemm(acc_s, v_l, acc_o)
            M.finalize_output(acc_o, l, bm, Dv, False)
            for i, d in T.grid(bm, cols):
                if q0 + i < Lq:
                    O[bz, by, q0 + i, d] = acc_o[i, d]
            for i in T.serial(bm):
                if q0 + i < Lq:
                    LSE[bz, by, q0 + i] = M.row_lse(m[i], l[i])

    return main


@tilelang.jit(target="c", execution_backend="cython")
def fwd_cpu(Dqk: int, Dv: int, mask_lmk: bool, expand_to_chunk: bool, q_blhd: bool,
            kv_blhd: bool, block_M: int = 16, block_N: int = 16, lmk_zero: str = "tile",
            mask_split: bool = False, fold: bool = False, lmk_cols: int = 0,
            fast_exp2: bool = False, scale_fold: bool = False, win_u32: bool = False,
            lmk_rows_j0: bool = False, pack: int = 0, min_blocks: int = 0, overlap: int = 0,
            v_chunk: int = 0, wide: bool = False, lazy_rescale: int = 0, hoist_left: int = 0,
            o_cols: int = 0):
    """CPU kernel (TileLang C target, cython execution backend), fp32 in and out.

    Baked in: head dims, the two flags, the input layouts, the tile
    ``block_M x block_N``, and the knobs of :func:`fwd_tc` that change which
    macros run (so CI runs each of them on the C target): ``lmk_zero="tile"``
    never loads keys the block cannot see (left of ``lo``, past ``hi``,
    landmarks with ``mask_lmk``; tile rows stay zero), ``"rows"`` loads every
    row below ``Lk`` as the bulk copy does and zeroes the landmark rows
    (``macros.zero_landmark_rows``); ``mask_split``, ``fold``, ``lmk_cols``,
    ``scale_fold``, ``win_u32`` and ``lmk_rows_j0`` (the same zeroing macro
    from the tile's one ``j0`` register) as in :func:`fwd_tc` (``lmk_cols = K`` is
    exact only for calls with ``K * chunk_size >= block_N``, ``scale_fold``
    only for a positive normal fp32 scale; the launcher picks both per call);
    ``fast_exp2`` is accepted so the CPU kernel takes the GPU's knob tuple, and
    changes nothing here (no ``ex2.approx`` on the C target: ``T.exp2``); so are ``pack``,
    ``min_blocks``, ``overlap`` and ``v_chunk``, which must be off (0), and ``wide``, which
    acts as in :func:`fwd_tc` (the same landmark test), and ``lazy_rescale`` (a lab knob,
    :data:`LAZY_RESCALES`), the online softmax's arithmetic as :func:`fwd_tc` has it with the
    knob (rows are a program's own here, so no vote: a kept row's ``alpha`` is 1), and
    ``hoist_left`` (:data:`HOIST_LEFT`), as in :func:`fwd_tc` (``launch.cpu_kernel_args`` sets
    it where the GPU's prefill grid does), and ``o_cols`` as in :func:`fwd_tc` (0 = ``Dv``:
    ``launch.run_cpu`` sets it for a call whose head dims the adapter padded). One program per
    (query block, head, batch); tiles live in local buffers, the two products
    are ``T.gemm`` on them.
    """
    if pack or min_blocks or overlap or v_chunk:
        raise ValueError(f"fwd_cpu: pack={pack!r}, min_blocks={min_blocks!r}, overlap={overlap!r}, "
                         f"v_chunk={v_chunk!r}: the C target has none of them (0)")
    return _rowwise_body(Dqk, Dv, "float32", mask_lmk, expand_to_chunk, q_blhd, kv_blhd,
                         block_M, block_N, False, lmk_zero, mask_split, fold, lmk_cols,
                         fast_exp2, scale_fold, win_u32, lmk_rows_j0, wide, lazy_rescale,
                         hoist_left, o_cols)


@tilelang.jit
def fwd_fp32(Dqk: int, Dv: int, mask_lmk: bool, expand_to_chunk: bool, q_blhd: bool,
             kv_blhd: bool, block_M: int = FP32_TILE[0], block_N: int = FP32_TILE[1],
             wide: bool = False, o_cols: int = 0):
    """fp32 forward on the GPU: one thread per query, scalar FMA (fp32 accuracy), each
    tile of ``block_N`` keys loaded once a program into shared memory (:func:`_rowwise_body`:
    a thread's stack holds its own row only).

    Baked in: head dims, the two flags, the input layouts, ``block_M`` queries
    (= threads) per program, ``block_N`` keys per step, ``wide`` and ``o_cols`` as in
    :func:`fwd_tc`.
    Hopper's tensor cores take fp32 only as tf32 (10-bit mantissa), which would not meet fp32
    accuracy; this kernel is a correctness path, not a tuned one.
    """
    return _rowwise_body(Dqk, Dv, "float32", mask_lmk, expand_to_chunk, q_blhd, kv_blhd,
                         block_M, block_N, gpu=True, wide=wide, o_cols=o_cols)

