"""Hopper prefill kernel in Gluon (Triton's explicit tile language), bf16/fp16.

Status: a lab kernel, not shipped. ``launch`` runs it only when asked through
the private knob ``tma="gluon"`` (``tools/gpu_triton.py --lab 5``). It passes
every GPU check of that lab (outputs poisoned, NaN in unseen slots, GQA,
BLHD views, ``Dqk != Dv``, empty rows, large ``kv_start``) but is slower than
the Triton-language TMA kernel it was written to beat (H200, bf16, 32/32/128,
W=512, C=64, L=8K, kernel only: 275 us at 64x64 w4 s2 against 229 us;
without landmarks 248 against 212 us; D=64 GQA 32/4 185 against 159 us;
``bench_results/triton-lab12*-gluon-wip.json``, BENCHMARKS.md session 9).
Warp-specialised versions (a loader warp, one or two consumer warp groups,
FA3's ping-pong) did no better at D=128 and are kept only in commit 2935924.

Why a second prefill kernel: the Triton-language TMA kernel
(:func:`kernels._swa_fwd_tma_kernel`) runs QK^T -> mask and softmax -> PV in
series inside its warp group, and Triton's pipeliner keeps a warpgroup MMA in
flight only when the next MMA consumes it as its accumulator, so the softmax
never overlaps a tensor-core product (BENCHMARKS.md, "What bounds"). Here the
schedule is written out (FA3's intra-warpgroup overlap): in iteration ``j``
the kernel issues ``S_j = Q K_j^T`` and ``O += P_{j-1} V_{j-1}`` as
asynchronous wgmma groups, waits for ``S_j`` only, masks it and computes
``P_j`` while ``P_{j-1} V_{j-1}`` still runs, then waits for it and rescales.
``P`` goes through shared memory (two buffers): as the register operand of
the PV product its registers were reused for the next ``P``, and ptxas then
placed the wait for the product before the softmax (SASS, sm_90), which
undid the overlap.

Semantics are those of the other kernels (SPEC.md; the window and landmark
helpers are the Triton-language ones of :mod:`triton_impl.kernels`, called
from this kernel): base-2 online softmax, natural-log LSE written as
``(m + log2 l) * ln 2``, ``o`` stored in the canonical ``(B, Hq, Lq, Dv)``.

Data movement: ``q``, ``k`` and ``v`` arrive by TMA (4-D descriptors over
``(B, H, L, D)``, any strides the copy engine accepts, so BLHD views are read
in place), ``k``/``v`` through a ring of ``STAGES`` shared-memory slots with
one mbarrier each. The key descriptors start at ``j_min``, the first key any
query of the call sees, and tiles are aligned to it; the copy engine fills
rows past ``Lk``/``Lq`` and columns past ``D`` with zeros. Inside
``[j_min, Lk)`` the only keys no query sees are landmarks (``MASK_LMK``):
a NaN in such a ``k`` row reaches only scores that the mask replaces, and
the ``v`` rows of landmarks are zeroed in shared memory after their tile
lands (``0 * NaN`` would otherwise reach ``o``).
"""

from __future__ import annotations

try:  # Gluon: Triton 3.5+ (the H200 image: 3.6; CI: 3.9)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor  # noqa: F401 (launch.py)

    # A CTA-wide barrier: gl.thread_barrier up to Triton 3.6, gl.barrier later.
    _cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
    # A TMA load onto an mbarrier: tma.async_copy_global_to_shared up to Triton 3.6,
    # renamed tma.async_load later (the old name raises there).
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    HAVE_GLUON = True
except (ImportError, AttributeError):  # pragma: no cover - a Triton without this Gluon API:
    HAVE_GLUON = False                 # the launcher refuses the knob (UnsupportedConfig)

from .kernels import _finish, _in_window, _lmk_phase, _next_phase, _not_lmk, _rows

if HAVE_GLUON:

    @gluon.jit
    def _load_kv(desc_k, desc_v, k_slot, v_slot, bar, b, kvh, row, pred):
        """TMA of one key tile and one value tile (key rows ``row ..``) onto ``bar``."""
        mbarrier.expect(bar, desc_k.block_type.nbytes + desc_v.block_type.nbytes, pred=pred)
        _tma_load(desc_k, [b, kvh, row, 0], bar, k_slot, pred=pred)
        _tma_load(desc_v, [b, kvh, row, 0], bar, v_slot, pred=pred)

    @gluon.jit
    def _zero_landmarks(v_slot, n0, kv_start, C, ph,
                        BLOCK_N: gl.constexpr, BLOCK_DV: gl.constexpr, LMK_ONE: gl.constexpr,
                        NUM_WARPS: gl.constexpr):
        """Zero the ``v`` rows of landmark keys in a landed tile, 8 rows at a time
        (shared memory, read and written back through registers), then fence the
        generic-proxy writes against the wgmma that reads the tile. With
        ``LMK_ONE`` (at most one landmark per tile, row ``C - 1 - ph``) only the
        group holding it makes the round trip."""
        tile = v_slot.reshape([BLOCK_N, BLOCK_DV])
        TPC: gl.constexpr = BLOCK_DV // 8  # threads per row, 8 elements each
        blk8: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPC, TPC], [NUM_WARPS, 1], [1, 0])
        i8 = gl.arange(0, 8, layout=gl.SliceLayout(1, blk8))
        r = gl.minimum(C - 1 - ph, BLOCK_N).to(gl.int32)
        for g in gl.static_range(BLOCK_N // 8):  # slices take static offsets: branch to the group
            if LMK_ONE:
                if r // 8 == g:
                    grp = tile.slice(g * 8, 8)
                    v = grp.load(blk8)
                    grp.store(gl.where(gl.expand_dims(i8 != r % 8, 1), v, gl.zeros_like(v)))
            else:
                grp = tile.slice(g * 8, 8)
                v = grp.load(blk8)
                keep = _not_lmk(g * 8 + i8, n0, kv_start, C, ph, BLOCK_N, LMK_ONE)
                grp.store(gl.where(gl.expand_dims(keep, 1), v, gl.zeros_like(v)))
        fence_async_shared()

    @gluon.jit
    def _scores(s, n0, cols, qidx, span, kv_start, C, ph, qk_scale,
                BLOCK_N: gl.constexpr, MASK_LMK: gl.constexpr, LMK_ONE: gl.constexpr):
        """Scaled, masked scores of key block ``n0`` (invisible pairs ``-inf``)."""
        vis = _in_window(qidx, n0, cols, span)
        if MASK_LMK:
            keep = _not_lmk(cols, n0, kv_start, C, ph, BLOCK_N, LMK_ONE)
            vis = vis & gl.expand_dims(keep, 0)
        return gl.where(vis, s * qk_scale, float("-inf"))

    @gluon.jit
    def _softmax_step(s, m_i, l_i):
        """``(p, m_new, l_new, alpha)`` of one online-softmax step (base 2); a row
        with nothing visible yet uses 0 as its reference (``p = 0``, ``alpha = 0``)."""
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_safe = gl.where((m_new == float("-inf")) | (m_new == float("inf")), 0.0, m_new)  # _softmax_p's rule
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(s - gl.expand_dims(m_safe, 1))
        return p, m_new, l_i * alpha + gl.sum(p, 1), alpha

    @gluon.jit
    def _block(desc_k, desc_v, q_tile, k_smem, v_smem, p_smem, kv_bar, j, acc, m_i, l_i, ph,
               start, row0, n_blocks, b, kvh, cols, qidx, span, kv_start, C, qk_scale,
               s_layout: gl.constexpr, row_o: gl.constexpr,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_DK: gl.constexpr,
               BLOCK_DV: gl.constexpr, STAGES: gl.constexpr, MASK_LMK: gl.constexpr,
               LMK_ONE: gl.constexpr, NUM_WARPS: gl.constexpr):
        """Key block ``j >= 1``: issue ``S_j = Q K_j^T`` and ``O += P_{j-1} V_{j-1}``
        (``P_{j-1}`` from shared memory), mask and soften ``S_j`` while the product
        runs, store ``P_j``, wait, refill the freed slot, rescale ``O``. Returns
        ``(acc, m, l, landmark phase)``."""
        dtype: gl.constexpr = q_tile.dtype
        slot = j % STAGES
        prev = (j - 1) % STAGES
        n0 = start + j * BLOCK_N
        ph = _next_phase(ph, C, BLOCK_N, LMK_ONE)
        mbarrier.wait(kv_bar.index(slot), (j // STAGES) & 1)
        s = warpgroup_mma(q_tile, k_smem.index(slot).reshape([BLOCK_N, BLOCK_DK]).permute((1, 0)),
                          gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
        acc = warpgroup_mma(p_smem.index((j - 1) % 2), v_smem.index(prev).reshape([BLOCK_N, BLOCK_DV]), acc,
                            is_async=True)
        if MASK_LMK:
            _zero_landmarks(v_smem.index(slot), n0, kv_start, C, ph, BLOCK_N, BLOCK_DV, LMK_ONE, NUM_WARPS)
        s = warpgroup_mma_wait(1, deps=(s,))
        s = _scores(s, n0, cols, qidx, span, kv_start, C, ph, qk_scale, BLOCK_N, MASK_LMK, LMK_ONE)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i)
        # P_j goes to shared memory (the other buffer than the one the product
        # reads): a register operand would keep the product's registers busy, and
        # ptxas then waits for the product before writing the next P.
        p_smem.index(j % 2).store(p.to(dtype))
        fence_async_shared()
        acc = warpgroup_mma_wait(0, deps=(acc,))
        # Every warp is past the PV product of tile j - 1, the landmark fix-up of
        # tile j and its share of P_j: slot ``prev`` is free, tile j and P_j are ready.
        _cta_barrier()
        _load_kv(desc_k, desc_v, k_smem.index(prev), v_smem.index(prev), kv_bar.index(prev), b, kvh,
                 row0 + (j - 1 + STAGES) * BLOCK_N, j - 1 + STAGES < n_blocks)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        return acc, m_i, l_i, ph

    @gluon.jit
    def _swa_fwd_gluon_kernel(
        desc_q, desc_k, desc_v, O, LSE,
        sob, soh, sol,
        Hq, G, Lq, Lk, kv_start, j_min, W, C, qk_scale,
        DV: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        BLOCK_DK: gl.constexpr, BLOCK_DV: gl.constexpr, STAGES: gl.constexpr,
        MASK_LMK: gl.constexpr, EXPAND: gl.constexpr, LMK_ONE: gl.constexpr,
        NUM_WARPS: gl.constexpr,
    ):
        """One program per (query block, batch x query head); see the module docstring.

        Baked in: tile ``BLOCK_M x BLOCK_N``, padded head dims, ``STAGES`` k/v
        slots (>= 2), the mask flags and ``NUM_WARPS`` (``BLOCK_M`` rows over
        ``NUM_WARPS // 4`` warp groups; launched with ``num_warps=NUM_WARPS``).
        Runtime: every length, ``kv_start``, the window frame (int32 or int64:
        positions follow the frame's width, block and slot indices stay int32)
        and the scale.
        """
        dtype: gl.constexpr = desc_q.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, BLOCK_DV, 16])
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        col_o: gl.constexpr = gl.SliceLayout(0, o_layout)

        pid_m = gl.program_id(0)
        pid_bh = gl.program_id(1)
        b = pid_bh // Hq
        h = pid_bh % Hq
        kvh = h // G
        m0 = pid_m * BLOCK_M
        m_last = gl.minimum(m0 + BLOCK_M, Lq) - 1
        rows = m0 + gl.arange(0, BLOCK_M, layout=row_s)
        qidx, span, j_lo, j_hi = _rows(rows, m0, m_last, kv_start, Lq, Lk, W, C, EXPAND)
        start = j_min + ((j_lo - j_min) // BLOCK_N) * BLOCK_N
        n_blocks = gl.cdiv(j_hi - start, BLOCK_N).to(gl.int32)  # int32 loop and slot indices, any frame
        row0 = (start - j_min).to(gl.int32)  # key row of the first tile inside the descriptors
        cols = gl.arange(0, BLOCK_N, layout=col_s)

        q_smem = gl.allocate_shared_memory(dtype, desc_q.block_type.shape, desc_q.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_k.block_type.shape, desc_k.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_v.block_type.shape, desc_v.layout)
        p_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, BLOCK_N],
                                           gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dtype))
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(kv_bar.index(i), count=1)
        fence_async_shared()

        mbarrier.expect(q_bar, desc_q.block_type.nbytes)
        _tma_load(desc_q, [b, h, m0, 0], q_bar, q_smem)
        for i in gl.static_range(STAGES):
            _load_kv(desc_k, desc_v, k_smem.index(i), v_smem.index(i), kv_bar.index(i), b, kvh,
                     row0 + i * BLOCK_N, i < n_blocks)
        q_tile = q_smem.reshape([BLOCK_M, BLOCK_DK])

        # Block 0: S_0, then P_0 (no PV product to overlap yet).
        ph = _lmk_phase(kv_start, start, C)
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(kv_bar.index(0), 0)
        s = warpgroup_mma(q_tile, k_smem.index(0).reshape([BLOCK_N, BLOCK_DK]).permute((1, 0)),
                          gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
        if MASK_LMK:
            _zero_landmarks(v_smem.index(0), start, kv_start, C, ph, BLOCK_N, BLOCK_DV, LMK_ONE, NUM_WARPS)
        s = warpgroup_mma_wait(0, deps=(s,))
        s = _scores(s, start, cols, qidx, span, kv_start, C, ph, qk_scale, BLOCK_N, MASK_LMK, LMK_ONE)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i)
        p_smem.index(0).store(p.to(dtype))
        fence_async_shared()
        acc = gl.zeros([BLOCK_M, BLOCK_DV], gl.float32, o_layout)
        _cta_barrier()

        for j in range(1, n_blocks):
            acc, m_i, l_i, ph = _block(
                desc_k, desc_v, q_tile, k_smem, v_smem, p_smem, kv_bar, j, acc, m_i, l_i, ph,
                start, row0, n_blocks, b, kvh, cols, qidx, span, kv_start, C, qk_scale,
                s_layout, row_o, BLOCK_M, BLOCK_N, BLOCK_DK, BLOCK_DV, STAGES, MASK_LMK, LMK_ONE, NUM_WARPS)

        last = (n_blocks - 1) % STAGES
        acc = warpgroup_mma(p_smem.index((n_blocks - 1) % 2), v_smem.index(last).reshape([BLOCK_N, BLOCK_DV]), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(kv_bar.index(i))

        out, lse2 = _finish(acc, gl.convert_layout(m_i, row_o), gl.convert_layout(l_i, row_o))
        lse = lse2 * 0.6931471805599453
        rows_o = m0 + gl.arange(0, BLOCK_M, layout=row_o)
        cols_o = gl.arange(0, BLOCK_DV, layout=col_o)
        o_ptrs = (O + b.to(gl.int64) * sob + h.to(gl.int64) * soh
                  + gl.expand_dims(rows_o.to(gl.int64) * sol, 1) + gl.expand_dims(cols_o, 0))
        o_mask = gl.expand_dims(rows_o < Lq, 1) & gl.expand_dims(cols_o < DV, 0)
        gl.store(o_ptrs, out.to(dtype), mask=o_mask)
        gl.store(LSE + (pid_bh.to(gl.int64) * Lq + rows_o), lse, mask=rows_o < Lq)
