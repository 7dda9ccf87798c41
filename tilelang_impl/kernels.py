"""TileLang kernel factories of the sliding-window attention forward.

Every factory is a ``@tilelang.jit`` function: its Python arguments are baked
into the compiled kernel (one compile per static configuration); everything
else is dynamic. In all kernels ``B, Hq, Hkv, Lq, Lk`` (and the split count)
are dynamic shape variables, so one compile serves every length, and the
per-call values are scalar kernel arguments:

    W          int32   window_size, clamped by the launcher to Lk + chunk_size
    C          int32   chunk_size
    r          int32   kv_start % chunk_size (the relative frame of macros.py)
    inv_c      float32 1 / chunk_size (exact landmark test without a division)
    scale_log2 float32 sm_scale * log2(e)

Layouts. ``q_blhd`` / ``kv_blhd`` bake the memory order of the inputs:
False reads ``(B, H, L, D)`` contiguous tensors, True reads ``(B, L, H, D)``
contiguous tensors (what ``x.transpose(1, 2)`` of a canonical-shaped BLHD
view gives back without a copy). ``o`` is always written ``(B, Hq, Lq, Dv)``
contiguous and ``lse`` ``(B, Hq, Lq)`` fp32 natural log, by the kernel itself.

The rule and the softmax come from :mod:`tilelang_impl.macros` in every kernel.
"""


import tilelang
import tilelang.language as T
from tvm.target import Target

from . import macros as M

#: The tensor-core kernels use wgmma, TMA and warpgroup register reallocation:
#: sm_90a (plain sm_90 cannot build them).
HOPPER = Target({"kind": "cuda", "arch": "sm_90a"})

_NEG_INF = -float("inf")


def _shape(blhd: bool, B, H, L, D):
    return (B, L, H, D) if blhd else (B, H, L, D)


def _tile(X, blhd: bool, b, h, l0, n):
    """``X[b, h, l0:l0+n, :]`` in either memory order."""
    return X[b, l0:l0 + n, h, :] if blhd else X[b, h, l0:l0 + n, :]


def _elem(X, blhd: bool, b, h, l, d):
    return X[b, l, h, d] if blhd else X[b, h, l, d]


# --------------------------------------------------------------------------------------
# Hopper kernel (bf16 / fp16): wgmma GEMMs, TMA loads, software pipeline
# --------------------------------------------------------------------------------------
def _fwd_tc_body(Dqk, Dv, dtype, mask_lmk, expand_to_chunk, q_blhd, kv_blhd, block_M, block_N,
                 num_stages, threads, split, ws):
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
    normalised partial ``Op[b, h, s]`` (fp32) and its natural-log ``LSEp``;
    :func:`combine` merges them.
    """
    B, Hq, Hkv, Lq, Lk = T.dynamic("B Hq Hkv Lq Lk")
    S = T.dynamic("S")
    accum = "float32"
    q_shape = _shape(q_blhd, B, Hq, Lq, Dqk)
    k_shape = _shape(kv_blhd, B, Hkv, Lk, Dqk)
    v_shape = _shape(kv_blhd, B, Hkv, Lk, Dv)
    o_shape = (B, Hq, S, Lq, Dv) if split else (B, Hq, Lq, Dv)
    o_dtype = accum if split else dtype
    l_shape = (B, Hq, S, Lq) if split else (B, Hq, Lq)

    @T.prim_func
    def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(k_shape, dtype), V: T.Tensor(v_shape, dtype),
             O: T.Tensor(o_shape, o_dtype), LSE: T.Tensor(l_shape, accum),
             W: T.int32, C: T.int32, r: T.int32, inv_c: T.float32, scale_log2: T.float32):
        n_qb = T.ceildiv(Lq, block_M)
        with T.Kernel(n_qb * S if split else n_qb, Hq, B, threads=threads) as (bx, by, bz):
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

            qb = bx // S if split else bx
            sp = bx % S if split else 0
            hk = by // (Hq // Hkv)
            q0 = qb * block_M
            lo, hi = M.block_key_range(q0, q0 + block_M, Lq, Lk, r, W, C, expand_to_chunk)
            n_kb = T.ceildiv(hi - lo, block_N)
            kb0 = 0
            n_it = n_kb
            if split:
                per = T.ceildiv(n_kb, S)
                kb0 = sp * per
                n_it = T.max(T.min(per, n_kb - kb0), 0)

            T.copy(_tile(Q, q_blhd, bz, by, q0, block_M), Q_s)
            M.row_left_edges(left_row, q0, block_M, Lq, Lk, r, W, C, expand_to_chunk, True)
            M.softmax_init(acc_o, m, l)

            for kb in T.Pipelined(n_it, num_stages=num_stages):
                k0 = lo + (kb0 + kb) * block_N
                T.copy(_tile(K, kv_blhd, bz, hk, k0, block_N), K_s)
                if mask_lmk and not ws:
                    for j, d in T.Parallel(block_N, Dv):
                        V_s[j, d] = T.if_then_else(
                            M.key_kept(k0 + j, hi, r, C, inv_c, mask_lmk),
                            _elem(V, kv_blhd, bz, hk, k0 + j, d), T.Cast(dtype, 0))
                else:
                    T.copy(_tile(V, kv_blhd, bz, hk, k0, block_N), V_s)
                T.gemm(Q_s, K_s, acc_s, transpose_B=True, clear_accum=True,
                       policy=T.GemmWarpPolicy.FullRow)
                M.mask_scores(acc_s, left_row, q0, k0, block_M, block_N, Lq, Lk, r, C, inv_c,
                              mask_lmk, True)
                M.online_softmax_update(acc_s, m, m_prev, alpha, l, row_sum, block_M, block_N,
                                        scale_log2, True)
                T.copy(acc_s, acc_p)
                M.rescale_output(acc_o, alpha, block_M, Dv, True)
                if mask_lmk and ws:
                    for j, d in T.Parallel(block_N, Dv):
                        V_s[j, d] = T.if_then_else(M.key_kept(k0 + j, hi, r, C, inv_c, mask_lmk),
                                                   V_s[j, d], T.Cast(dtype, 0))
                T.gemm(acc_p, V_s, acc_o, policy=T.GemmWarpPolicy.FullRow)

            M.finalize_output(acc_o, l, block_M, Dv, True)
            for i in T.Parallel(block_M):
                if q0 + i < Lq:
                    if split:
                        LSE[bz, by, sp, q0 + i] = M.row_lse(m[i], l[i], scale_log2)
                    else:
                        LSE[bz, by, q0 + i] = M.row_lse(m[i], l[i], scale_log2)
            T.copy(acc_o, O_s)
            if split:
                T.copy(O_s, O[bz, by, sp, q0:q0 + block_M, :])
            else:
                T.copy(O_s, O[bz, by, q0:q0 + block_M, :])

    return main


@tilelang.jit(target=HOPPER)
def fwd_tc(Dqk: int, Dv: int, dtype: str, mask_lmk: bool, expand_to_chunk: bool,
           q_blhd: bool, kv_blhd: bool, block_M: int, block_N: int, num_stages: int,
           threads: int, split: bool):
    """Tensor-core forward for bf16/fp16 on sm_90a, warp-specialised.

    Baked in: head dims ``Dqk``/``Dv``, ``dtype``, the two flags, the input
    layouts, the tile ``block_M x block_N``, the pipeline depth ``num_stages``
    (``T.Pipelined``), ``threads`` (consumer threads; TileLang adds a producer
    group that issues the TMA / cp.async loads) and ``split``.
    """
    return _fwd_tc_body(Dqk, Dv, dtype, mask_lmk, expand_to_chunk, q_blhd, kv_blhd, block_M,
                        block_N, num_stages, threads, split, True)


@tilelang.jit(target=HOPPER,
              pass_configs={tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True,
                            tilelang.PassConfigKey.TL_DISABLE_TMA_LOWER: True})
def fwd_tc_nows(Dqk: int, Dv: int, dtype: str, mask_lmk: bool, expand_to_chunk: bool,
                q_blhd: bool, kv_blhd: bool, block_M: int, block_N: int, num_stages: int,
                threads: int, split: bool):
    """Same kernel as :func:`fwd_tc` without warp specialisation.

    Baked in: as :func:`fwd_tc`. All ``threads`` compute; the loads of the
    next ``num_stages - 1`` tiles are issued ahead inside the software
    pipeline (``T.Pipelined``) instead of by a producer warp group.
    """
    return _fwd_tc_body(Dqk, Dv, dtype, mask_lmk, expand_to_chunk, q_blhd, kv_blhd, block_M,
                        block_N, num_stages, threads, split, False)


@tilelang.jit(target=HOPPER)
def combine(Dv: int, dtype: str, threads: int = 128):
    """Merge the split partials of :func:`fwd_tc` (``split=True``) into ``O``/``LSE``.

    Baked in: ``Dv``, the output ``dtype``, ``threads``. One program per
    (query, head, batch) loops over the ``S`` splits (dynamic):
    ``lse = log sum_s exp(lse_s)``, ``o = sum_s exp(lse_s - lse) o_s``; splits
    with ``lse_s = -inf`` weigh 0, and a row with no split left gets ``o = 0``,
    ``lse = -inf``.
    """
    B, Hq, S, Lq = T.dynamic("B Hq S Lq")
    accum = "float32"

    @T.prim_func
    def main(Op: T.Tensor((B, Hq, S, Lq, Dv), accum), LSEp: T.Tensor((B, Hq, S, Lq), accum),
             O: T.Tensor((B, Hq, Lq, Dv), dtype), LSE: T.Tensor((B, Hq, Lq), accum)):
        with T.Kernel(Lq, Hq, B, threads=threads) as (bx, by, bz):
            acc = T.alloc_fragment([Dv], accum)
            st = T.alloc_local([3], accum)  # max lse, sum of weights, weight
            st[0] = -T.infinity(accum)
            for s in T.serial(S):
                st[0] = T.max(st[0], LSEp[bz, by, s, bx])
            st[1] = 0.0
            T.clear(acc)
            ref = T.if_then_else(st[0] == -T.infinity(accum), 0.0, st[0])
            for s in T.serial(S):
                st[2] = T.exp2((LSEp[bz, by, s, bx] - ref) * M.LOG2E)
                st[1] = st[1] + st[2]
                for d in T.Parallel(Dv):
                    acc[d] = acc[d] + st[2] * Op[bz, by, s, bx, d]
            for d in T.Parallel(Dv):
                O[bz, by, bx, d] = T.if_then_else(st[1] > 0, acc[d] / st[1], 0.0)
            LSE[bz, by, bx] = T.if_then_else(st[1] > 0, T.log2(st[1]) * M.LN2 + ref,
                                             -T.infinity(accum))

    return main


# --------------------------------------------------------------------------------------
# Row-per-thread kernels: fp32 on the GPU (CUDA cores) and the CPU kernel (C target)
# --------------------------------------------------------------------------------------
def _rowwise_body(Dqk, Dv, dtype, mask_lmk, expand_to_chunk, q_blhd, kv_blhd, block_M, block_N,
                  gpu):
    """Blocked forward on local buffers: the CPU kernel (``gpu=False``: a
    program handles ``block_M`` queries with ``T.gemm`` on local tiles) and
    the fp32 GPU kernel (``gpu=True``: one thread per query, ``block_M = 1``
    per thread, scalar FMA loops so fp32 stays fp32 instead of tf32)."""
    B, Hq, Hkv, Lq, Lk = T.dynamic("B Hq Hkv Lq Lk")
    accum = "float32"
    q_shape = _shape(q_blhd, B, Hq, Lq, Dqk)
    k_shape = _shape(kv_blhd, B, Hkv, Lk, Dqk)
    v_shape = _shape(kv_blhd, B, Hkv, Lk, Dv)
    bm = 1 if gpu else block_M          # rows held by one executor
    threads = block_M if gpu else 1

    @T.prim_func
    def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(k_shape, dtype), V: T.Tensor(v_shape, dtype),
             O: T.Tensor((B, Hq, Lq, Dv), dtype), LSE: T.Tensor((B, Hq, Lq), accum),
             W: T.int32, C: T.int32, r: T.int32, inv_c: T.float32, scale_log2: T.float32):
        with T.Kernel(T.ceildiv(Lq, block_M), Hq, B, threads=threads) as (bx, by, bz):
            q_l = T.alloc_local([bm, Dqk], accum)
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
            if gpu:
                q0 = bx * block_M + T.get_thread_binding()
            lo, hi = M.block_key_range(q0, q0 + bm, Lq, Lk, r, W, C, expand_to_chunk)
            T.clear(q_l)
            for i, d in T.grid(bm, Dqk):
                if q0 + i < Lq:
                    q_l[i, d] = _elem(Q, q_blhd, bz, by, q0 + i, d)
            M.row_left_edges(left_row, q0, bm, Lq, Lk, r, W, C, expand_to_chunk, False)
            M.softmax_init(acc_o, m, l)
            for kb in T.serial(T.ceildiv(hi - lo, block_N)):
                k0 = lo + kb * block_N
                T.clear(k_l)
                T.clear(v_l)
                for j in T.serial(block_N):
                    if M.key_kept(k0 + j, hi, r, C, inv_c, mask_lmk):
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
                M.mask_scores(acc_s, left_row, q0, k0, bm, block_N, Lq, Lk, r, C, inv_c,
                              mask_lmk, False)
                M.online_softmax_update(acc_s, m, m_prev, alpha, l, row_sum, bm, block_N,
                                        scale_log2, False)
                M.rescale_output(acc_o, alpha, bm, Dv, False)
                if gpu:
                    for j, d in T.grid(block_N, Dv):
                        acc_o[0, d] = acc_o[0, d] + acc_s[0, j] * v_l[j, d]
                else:
                    T.gemm(acc_s, v_l, acc_o)
            M.finalize_output(acc_o, l, bm, Dv, False)
            for i, d in T.grid(bm, Dv):
                if q0 + i < Lq:
                    O[bz, by, q0 + i, d] = acc_o[i, d]
            for i in T.serial(bm):
                if q0 + i < Lq:
                    LSE[bz, by, q0 + i] = M.row_lse(m[i], l[i], scale_log2)

    return main


@tilelang.jit(target="c", execution_backend="cython")
def fwd_cpu(Dqk: int, Dv: int, mask_lmk: bool, expand_to_chunk: bool, q_blhd: bool,
            kv_blhd: bool, block_M: int = 16, block_N: int = 16):
    """CPU kernel (TileLang C target, cython execution backend), fp32 in and out.

    Baked in: head dims, the two flags, the input layouts, the tile
    ``block_M x block_N``. One program per (query block, head, batch); tiles
    live in local buffers, the two products are ``T.gemm`` on them. Keys the
    block cannot see (left of ``lo``, past ``hi``, landmarks with
    ``mask_lmk``) are never loaded (tile rows stay zero).
    """
    return _rowwise_body(Dqk, Dv, "float32", mask_lmk, expand_to_chunk, q_blhd, kv_blhd,
                         block_M, block_N, gpu=False)


@tilelang.jit
def fwd_fp32(Dqk: int, Dv: int, mask_lmk: bool, expand_to_chunk: bool, q_blhd: bool,
             kv_blhd: bool, block_M: int = 128, block_N: int = 16):
    """fp32 forward on the GPU: one thread per query, scalar FMA (fp32 accuracy).

    Baked in: head dims, the two flags, the input layouts, ``block_M`` queries
    (= threads) per program, ``block_N`` keys per step. Hopper's tensor cores
    take fp32 only as tf32 (10-bit mantissa), which would not meet fp32
    accuracy; this kernel is a correctness path, not a tuned one.
    """
    return _rowwise_body(Dqk, Dv, "float32", mask_lmk, expand_to_chunk, q_blhd, kv_blhd,
                         block_M, block_N, gpu=True)
