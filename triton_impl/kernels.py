"""Triton kernels of HiLS sliding-window attention, forward (SPEC.md).

Four kernels:

- :func:`_swa_fwd_kernel`: prefill / training. One program per (query block,
  batch x query head). It loops only over the key blocks its rows can see.
  ``PHASES=False`` masks every block in one loop; ``PHASES=True`` runs the
  masked edge blocks first (left edge, then diagonal), then the middle blocks
  without the window test (only the cheap per-column landmark test), as the
  TMA kernel's ``PHASES`` does (``launch.PHASES`` decides per config).
- :func:`_swa_splitkv_kernel`: split-KV for small grids (decode, short chunks).
  The ``G`` query heads of one key/value head and the ``Lq`` queries are packed
  into the M rows of a tile (row ``r`` is query ``r // G`` of head
  ``kv_head * G + r % G``), so one K/V load serves all of them; the visible key
  range of the tile is split over ``NUM_SPLITS`` programs, each writing a
  partial online-softmax state (normalised ``o`` and base-2 LSE, fp32).
- :func:`_swa_combine_kernel`: merges the partial states of one row.
- :func:`_swa_fwd_tma_kernel`: the prefill kernel with ``q``/``k``/``o`` (and
  optionally ``v``) through TMA tensor descriptors, bf16/fp16 on Hopper; the
  launcher takes it for long prefills (``launch.PREFILL_TMA``). ``PHASES``
  runs the partly visible edge blocks first, then the blocks inside every
  row's window without the window test (``launch.TMA_PHASES``). The Triton
  interpreter runs it too (fp16, when forced: ``tests/test_triton_swa.py``).

The three attention kernels work in base 2 (``exp2``; scores pre-multiplied by
``sm_scale * log2(e)``) and write the natural-log LSE ``(m + log2 l) * ln 2``
and ``o`` straight into the canonical contiguous ``(B, Hq, Lq, Dv)`` layout.

The visibility rule of SPEC.md (the Python copy is ``reference.mask``)::

    qpos(i) = kv_start + (Lk - Lq) + i,   kpos(j) = kv_start + j
    left(i) = qpos(i) - W + 1;  if EXPAND: left(i) = floor(left(i) / C) * C
    visible(i, j) = left(i) <= kpos(j) <= qpos(i)
                    and not (MASK_LMK and (kpos(j) + 1) % C == 0)

How a key block evaluates it (the integer work between the two matrix
products is most of a block's instructions): the window test is one
subtraction and one unsigned compare per element (:func:`_in_window`); the
landmark test, when ``C >= BLOCK_N`` (``LMK_ONE``, chosen per call by the
launcher for 16-bit dtypes), is one compare per column against a per-block
scalar carried from block to block (:func:`_not_lmk`), otherwise an integer
modulo per column. SASS of one key block, sm_90, bf16, D=128 64x64 TMA
kernel: 1002 instructions before, 665 after (Triton 3.9 on CPU); with the
scale folded into the exponent (``FOLD``, :func:`_softmax_p`, off by default)
636.

NaN safety: a matrix product turns ``0 * NaN`` into NaN, so a key that no row
of the program can see (left of the first row's window edge, right of the last
row, or a landmark when ``MASK_LMK``) is *loaded* as 0 (``mask=..., other=0``),
not only masked in the scores. The TMA prefill kernel does the same for ``v``
(masked pointer loads over the program's key range ``[j_lo, j_hi)``, landmarks
zeroed); its ``k`` tiles come by TMA, aligned to the first key any query of the
*call* sees (nothing left of it is ever read), and a NaN in a ``k`` column
reaches only scores that ``tl.where`` replaces. With ``V_CHUNK`` (shipped at
D <= 64 and, since session 28, D <= 128, ``launch.TMA_V_CHUNK``) the blocks inside
every row's window take ``v`` by TMA through a chunked view ``(B, Hkv, chunks, C - 1,
Dv)`` whose chunks start on chunk boundaries: a chunk's landmark row lies outside the
view, and the copy engine fills it with zeros. With ``V_TMA`` (a tuning mode, not shipped) ``v``
tiles come by TMA too and only landmark rows are zeroed, in registers.

Under ``TRITON_INTERPRET=1`` the interpreter computes bf16 wrongly (loads,
arithmetic and ``tl.dot``: triton-lang/triton#11584). The launcher then sets
``UPCAST=True`` and every tile is converted to fp32 right after ``tl.load``, and
``P`` and the output are rounded to bf16 by :func:`_bf16_rne` before the interpreter's
conversion (which truncates); on a GPU ``UPCAST`` is False and the code is unchanged.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _window_left(qpos, W, C, EXPAND: tl.constexpr):
    """Left window edge (absolute, inclusive) of queries at ``qpos``.

    Triton's integer ``//`` truncates toward zero on runtime values, and SPEC
    needs a floor. Key positions are >= 0, so an edge below 0 sees exactly the
    keys an edge of 0 sees: clamping to 0 first keeps the visible set and makes
    truncation equal to the floor.
    """
    left = qpos - W + 1
    if EXPAND:
        left = tl.maximum(left, 0)
        left = (left // C) * C
    return left


@triton.jit
def _span_u32(qpos, left):
    """``qpos - left`` (>= 0: a window never starts right of its query) as uint32,
    for :func:`_in_window`. Clamped to ``2**31 - 1``: a wider span already
    reaches every key left of the query (key indices are below ``2**31``)."""
    return tl.minimum(qpos - left, 2147483647).to(tl.int32).to(tl.uint32, bitcast=True)


@triton.jit
def _in_window(qidx, n0, offs_n, span):
    """Window test of every (row, key) pair of a tile: ``left <= kpos <= qpos``.

    ``qidx`` is the key index of each row's own position (``Lk - Lq + i``),
    ``span = qpos - left`` (:func:`_span_u32`), the keys are ``n0 + offs_n``.
    With ``d = qidx - key`` the test is ``0 <= d <= span``: one subtraction
    and one unsigned compare per element (``d < 0`` wraps above any span)
    instead of two signed compares and an ``and``. Key indices are below
    ``2**31``, so ``d`` fits int32 whatever width the positions have.
    """
    kidx = (n0 + offs_n).to(tl.int32)
    d = qidx.to(tl.int32)[:, None] - kidx[None, :]
    return d.to(tl.uint32, bitcast=True) <= span[:, None]


@triton.jit
def _rows(rows, first, last, kv_start, Lq, Lk, W, C, EXPAND: tl.constexpr):
    """Window facts of a program's query rows (query indices ``rows``; ``first``
    and ``last`` its first and last real row): per row the key index of its own
    position ``qidx`` and its span (:func:`_in_window`), and the key range
    ``[j_lo, j_hi)`` some row sees (left edges are non-decreasing in the row,
    windows of consecutive rows overlap or touch)."""
    q_off = kv_start + Lk - Lq  # absolute position of query 0
    qpos = q_off + rows
    qidx = Lk - Lq + rows
    span = _span_u32(qpos, _window_left(qpos, W, C, EXPAND))
    j_lo = tl.maximum(_window_left(q_off + first, W, C, EXPAND) - kv_start, 0)
    j_hi = Lk - Lq + last + 1
    return qidx, span, j_lo, j_hi


@triton.jit
def _finish(acc, m_i, l_i):
    """``(o, base-2 lse)`` of finished rows; a row with no visible key gets
    ``o = 0`` and ``lse = -inf`` (never NaN).

    ``o`` is ``acc`` times one reciprocal per row, not ``acc / l`` per element:
    Triton lowers an fp32 tensor division to ``div.full.f32``, whose range
    scaling costs about three instructions per element (an FSEL and two FMUL:
    184 of a D=128 TMA program's 441 epilogue instructions at sm_90, 2784 ->
    2600 in all; Nsight Compute at d4faf39 found the epilogue). A
    finished row's ``l`` is at least 1 (its maximum contributes ``exp2(0)``) or
    NaN (propagated, as SPEC requires), so the reciprocal needs no range care;
    the product adds at most half an ulp to the reciprocal's error. A row that saw a
    score of ``+inf`` has ``m = +inf`` and ``l = +inf`` (:func:`_softmax_p`), so its
    ``lse`` is ``+inf``, SPEC's ``log(inf)``, and ``o`` NaN (``inf / inf``); with a NaN
    score too, ``l`` is NaN and so is ``lse``."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    inv = 1.0 / l_safe
    return acc * inv[:, None], tl.where(empty, float("-inf"), m_i + tl.math.log2(l_safe))


@triton.jit
def _lmk_phase(kv_start, n0, C):
    """``(kv_start + n0) % C``: the landmark phase of key ``n0`` (:func:`_not_lmk`)."""
    return (kv_start + n0) % C


@triton.jit
def _next_phase(ph, C, BLOCK_N: tl.constexpr, LMK_ONE: tl.constexpr):
    """The phase of the next key block (``BLOCK_N`` keys on): one add and one
    conditional subtraction, valid because ``BLOCK_N <= C`` with ``LMK_ONE``.
    Unused (returned unchanged) otherwise."""
    if LMK_ONE:
        ph = ph + BLOCK_N
        ph = tl.where(ph >= C, ph - C, ph)
    return ph


@triton.jit
def _not_lmk(offs_n, n0, kv_start, C, ph, BLOCK_N: tl.constexpr, LMK_ONE: tl.constexpr):
    """Keys ``n0 + offs_n`` (``offs_n`` in ``[0, BLOCK_N)``) that are not
    landmarks: ``(kpos + 1) % C != 0``.

    ``LMK_ONE`` (the launcher sets it for 16-bit dtypes when ``C >= BLOCK_N``):
    a block holds at most one landmark. With ``ph = (kv_start + n0) % C``,
    ``ph + j + 1`` lies in ``[1, C + BLOCK_N)``, so it is a multiple of ``C``
    exactly when it equals ``C``: column ``j = C - 1 - ph`` (none when that is
    ``>= BLOCK_N``; clamped to ``BLOCK_N`` before the int32 cast, since the
    frame's ``C`` can exceed 2**32). One compare per column against a
    per-block scalar instead of an integer modulo per column. Otherwise the
    modulo itself.

    ``LMK_ONE == 2`` (the TMA kernel's last-column variant, ``launch._vchunk_variant``;
    session 36's lab mode, shipped in session 37): ``C == BLOCK_N`` and every block starts
    on a chunk boundary (``ph == 0``, as the chunked view of ``v`` requires), so the
    landmark is always the last column, a compile-time constant.
    """
    if LMK_ONE == 2:
        return offs_n != BLOCK_N - 1
    if LMK_ONE:
        return offs_n != tl.minimum(C - 1 - ph, BLOCK_N).to(tl.int32)
    else:
        return ((kv_start + n0 + offs_n + 1) % C) != 0


@triton.jit
def _softmax_p(s, m_i, qk_scale, FOLD: tl.constexpr):
    """``(p, m_new, alpha)`` of one online-softmax step over the masked score
    tile ``s`` (masked entries ``-inf``), base 2, ``m`` in scaled units.

    ``FOLD=False``: ``s`` is already scaled (``* qk_scale``). ``FOLD=True``
    (the launcher allows it only for a positive normal ``qk_scale``): ``s`` is
    raw, the row max is scaled once per row (``max(s) * c == max(s * c)`` for
    ``c > 0``, ``-inf * c == -inf``) and each score's scale rides in the
    exponent's FMA, ``exp2(s * c - m)``: one multiply per score fewer. A row
    with nothing visible yet uses 0 as its reference (``p = 0``, ``alpha = 0``,
    never ``exp(-inf + inf)``); so does a row whose max is ``+inf`` (a score of
    ``+inf``): that score's ``p`` is then ``+inf``, not ``exp2(inf - inf)`` = NaN, so
    ``l`` is ``+inf`` and the LSE ``+inf`` as SPEC's formula gives, while a NaN score
    still makes ``l`` NaN (the running max skips NaN: ``l`` is what carries it).
    """
    if FOLD:
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(tl.abs(m_new) == float("inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_safe)
    if FOLD:
        p = tl.math.exp2(s * qk_scale - m_safe[:, None])
    else:
        p = tl.math.exp2(s - m_safe[:, None])
    return p, m_new, alpha


@triton.jit
def _online_step(s, acc, m_i, l_i, qidx, n0, span, keep, qk_scale, BLOCK_N: tl.constexpr,
                 MASK_WINDOW: tl.constexpr, MASK_LMK: tl.constexpr, FOLD: tl.constexpr):
    """The work between a key block's two matrix products, for both prefill kernels
    and the split-KV kernel: scale the raw score tile ``s`` (unless ``FOLD``), mask
    it (the window test with ``MASK_WINDOW``, the landmark columns ``keep`` with
    ``MASK_LMK``) and take one online-softmax step. Returns ``(p, m_new, l_i, acc)``
    with ``acc`` already rescaled for the new maximum."""
    if not FOLD:
        s = s * qk_scale
    if MASK_WINDOW:
        # Keys outside [j_lo, j_hi) fail the window test of every real row
        # (j_lo is the first row's edge, j_hi - 1 the last row's position);
        # rows past Lq are never stored.
        vis = _in_window(qidx, n0, tl.arange(0, BLOCK_N), span)
        if MASK_LMK:
            vis = vis & keep[None, :]
        s = tl.where(vis, s, float("-inf"))
    elif MASK_LMK:
        s = tl.where(keep[None, :], s, float("-inf"))
    p, m_new, alpha = _softmax_p(s, m_i, qk_scale, FOLD)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    return p, m_new, l_i, acc


@triton.jit
def _inside_blocks(start, j_hi, m0, m_last, kv_start, Lq, Lk, W, C, EXPAND: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """``(n_left, n_mid)`` of a ``PHASES`` key loop over the blocks ``start, start +
    BLOCK_N, ...`` below ``j_hi``: the first ``n_left`` blocks (left edge) and all
    past the next ``n_mid`` (diagonal) need the window test; those ``n_mid`` hold only
    keys every real row of the tile sees, from the last row's left edge to the first
    row's own position (``m0`` / ``m_last``: first and last real query rows)."""
    n_all = tl.cdiv(j_hi - start, BLOCK_N)
    full_lo = _window_left(kv_start + Lk - Lq + m_last, W, C, EXPAND) - kv_start
    full_hi = Lk - Lq + m0 + 1  # one past the first row's own position
    n_left = tl.minimum(tl.cdiv(tl.maximum(full_lo - start, 0), BLOCK_N), n_all)
    n_mid = tl.maximum(tl.minimum((full_hi - start) // BLOCK_N, n_all) - n_left, 0)
    return n_left, n_mid


@triton.jit
def _edge_block(i, start, n_left, mid_hi, BLOCK_N: tl.constexpr):
    """The first key of edge block ``i`` of a ``PHASES`` loop (:func:`_inside_blocks`):
    the ``n_left`` left-edge blocks from ``start``, then the diagonal ones from
    ``mid_hi`` (one past the inside blocks)."""
    return tl.where(i < n_left, start + i * BLOCK_N, mid_hi + (i - n_left) * BLOCK_N)


@triton.jit
def _load_tile(ptrs, rmask, cmask, HAS_R: tl.constexpr, HAS_C: tl.constexpr, UPCAST: tl.constexpr):
    """``tl.load`` with an optional row mask and an optional column mask (0 where masked)."""
    if HAS_R:
        if HAS_C:
            x = tl.load(ptrs, mask=rmask[:, None] & cmask[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=rmask[:, None], other=0.0)
    else:
        if HAS_C:
            x = tl.load(ptrs, mask=cmask[None, :], other=0.0)
        else:
            x = tl.load(ptrs)
    if UPCAST:  # interpreter only: its bf16 is wrong (triton-lang/triton#11584)
        x = x.to(tl.float32)
    return x


@triton.jit
def _bf16_rne(x, UPCAST: tl.constexpr):
    """``x`` (fp32) rounded to the nearest bf16 value, ties to even, kept in fp32, under
    ``UPCAST`` (the interpreter's bf16 calls, whose tiles are fp32 after loading); ``x``
    itself otherwise (on a GPU: no code). The interpreter converts fp32 to bf16 by
    truncation (up to one ulp off; its bf16 defect, triton-lang/triton#11584), so under it
    the probabilities fed to ``P @ V`` and the outputs are rounded here first, as the GPU's
    conversion rounds them: the interpreter's conversion of the rounded value is then exact
    for every normal value. Infinities stay infinite; a finite value past bf16's largest
    rounds to infinity; NaN is passed through untouched (the carry of a NaN whose low bits
    are set could reach the exponent). Left to the interpreter's conversion, as before:
    a NaN with only its low 16 bits set truncates to infinity there (the NaN of
    arithmetic and of any bf16 input has upper bits set), and it garbles bf16 subnormals
    (below 1.2e-38) whatever this rounding does (a review's 2**20 random bit patterns)."""
    if UPCAST:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        x = tl.where(x != x, x, b.to(tl.float32, bitcast=True))
    return x


@triton.jit
def _attend(acc, m_i, l_i, q, k_ptrs, v_ptrs, n0, j_lo, j_hi, qidx, span, kv_start, C, ph, qk_scale,
            dk_ok, dv_ok,
            BLOCK_N: tl.constexpr, MASK_WINDOW: tl.constexpr, MASK_LMK: tl.constexpr,
            LMK_ONE: tl.constexpr, PAD_DK: tl.constexpr, PAD_DV: tl.constexpr,
            UPCAST: tl.constexpr, IEEE: tl.constexpr, FOLD: tl.constexpr = False):
    """One key block ``[n0, n0 + BLOCK_N)`` of the online softmax (base 2).

    ``MASK_WINDOW``: the block may hold keys outside some row's window (or
    outside ``[j_lo, j_hi)``): bounds-masked loads and the window test
    (:func:`_in_window`). Otherwise every key of the block is inside every
    row's window and only the landmark column test (``MASK_LMK``) remains.
    ``ph`` is the block's landmark phase (:func:`_not_lmk`).
    """
    offs_n = n0 + tl.arange(0, BLOCK_N)
    in_range = (offs_n >= j_lo) & (offs_n < j_hi)
    if MASK_LMK:
        keep = _not_lmk(tl.arange(0, BLOCK_N), n0, kv_start, C, ph, BLOCK_N, LMK_ONE)
        col_ok = in_range & keep if MASK_WINDOW else keep
    else:
        col_ok = in_range
    HAS_COL: tl.constexpr = MASK_WINDOW or MASK_LMK
    # k is loaded transposed: (D, BLOCK_N); v as (BLOCK_N, D). A NaN in an
    # in-range k column only reaches scores that tl.where below replaces, so k
    # needs just the range mask; v enters a product with p = 0, so every
    # column no row sees (range or landmark) is loaded as 0.
    k = _load_tile(k_ptrs, dk_ok, in_range, PAD_DK, MASK_WINDOW, UPCAST)
    v = _load_tile(v_ptrs, col_ok, dv_ok, HAS_COL, PAD_DV, UPCAST)
    if IEEE:
        s = tl.dot(q, k, input_precision="ieee")
    else:
        s = tl.dot(q, k)
    if not MASK_LMK:
        keep = in_range  # unused: no landmark test
    p, m_new, l_i, acc = _online_step(s, acc, m_i, l_i, qidx, n0, span, keep, qk_scale, BLOCK_N,
                                      MASK_WINDOW, MASK_LMK, FOLD)
    p = _bf16_rne(p, UPCAST)  # interpreter: P as the GPU feeds it (bf16) to P @ V
    if IEEE:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit
def _attend_range(acc, m_i, l_i, q, k_base, v_base, lo, hi, j_lo, j_hi, qidx, span, kv_start, C,
                  qk_scale, skl, skd, svl, svd, offs_dk, offs_dv, dk_ok, dv_ok,
                  BLOCK_N: tl.constexpr, MASK_WINDOW: tl.constexpr, MASK_LMK: tl.constexpr,
                  LMK_ONE: tl.constexpr, PAD_DK: tl.constexpr, PAD_DV: tl.constexpr,
                  UPCAST: tl.constexpr, IEEE: tl.constexpr, FOLD: tl.constexpr):
    """The key blocks ``lo, lo + BLOCK_N, ...`` below ``hi`` through :func:`_attend`
    (pointers into the ``k`` / ``v`` rows of one batch and key/value head), the
    landmark phase carried from block to block. Every pointer-kernel key loop over
    consecutive blocks is this one (the prefill kernel's whole range, or its
    inside blocks after the edge loop of ``PHASES``; the split-KV kernel's split)."""
    offs_n = tl.arange(0, BLOCK_N)
    k_ptrs = k_base + (lo + offs_n)[None, :].to(tl.int64) * skl + offs_dk[:, None] * skd
    v_ptrs = v_base + (lo + offs_n)[:, None].to(tl.int64) * svl + offs_dv[None, :] * svd
    ph = _lmk_phase(kv_start, lo, C)
    for n0 in range(lo, hi, BLOCK_N):
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_ptrs, v_ptrs, n0, j_lo, j_hi, qidx, span,
                                kv_start, C, ph, qk_scale, dk_ok, dv_ok, BLOCK_N, MASK_WINDOW,
                                MASK_LMK, LMK_ONE, PAD_DK, PAD_DV, UPCAST, IEEE, FOLD)
        ph = _next_phase(ph, C, BLOCK_N, LMK_ONE)
        k_ptrs += BLOCK_N * skl
        v_ptrs += BLOCK_N * svl
    return acc, m_i, l_i


@triton.jit
def _swa_fwd_kernel(
    Q, K, V, O, LSE,
    sqb, sqh, sql, sqd,
    skb, skh, skl, skd,
    svb, svh, svl, svd,
    sob, soh, sol, sod,
    Hq, G, Lq, Lk, kv_start, W, C, qk_scale,
    DK: tl.constexpr, DV: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_LMK: tl.constexpr, EXPAND: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    PHASES: tl.constexpr = False, LMK_ONE: tl.constexpr = False, FOLD: tl.constexpr = False,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // Hq
    h = pid_bh % Hq
    kvh = h // G
    PAD_DK: tl.constexpr = BLOCK_DK != DK
    PAD_DV: tl.constexpr = BLOCK_DV != DV

    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    dk_ok = offs_dk < DK
    dv_ok = offs_dv < DV
    row_ok = offs_m < Lq

    m_last = tl.minimum(m0 + BLOCK_M, Lq) - 1
    qidx, span, j_lo, j_hi = _rows(offs_m, m0, m_last, kv_start, Lq, Lk, W, C, EXPAND)
    start = (j_lo // BLOCK_N) * BLOCK_N
    end = j_hi

    b64 = b.to(tl.int64)
    q_base = Q + b64 * sqb + h.to(tl.int64) * sqh
    k_base = K + b64 * skb + kvh.to(tl.int64) * skh
    v_base = V + b64 * svb + kvh.to(tl.int64) * svh

    q_ptrs = q_base + offs_m[:, None].to(tl.int64) * sql + offs_dk[None, :] * sqd
    q = _load_tile(q_ptrs, row_ok, dk_ok, True, PAD_DK, UPCAST)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    if PHASES:
        # The edge blocks first, masked: [start, b_), then [c_, end) (the diagonal) ...
        n_left, n_mid = _inside_blocks(start, end, m0, m_last, kv_start, Lq, Lk, W, C, EXPAND, BLOCK_N)
        b_ = start + n_left * BLOCK_N
        c_ = b_ + n_mid * BLOCK_N
        offs_n = tl.arange(0, BLOCK_N)
        for i in range(0, tl.cdiv(end - start, BLOCK_N) - n_mid):
            n0 = _edge_block(i, start, n_left, c_, BLOCK_N)
            k_ptrs = k_base + (n0 + offs_n)[None, :].to(tl.int64) * skl + offs_dk[:, None] * skd
            v_ptrs = v_base + (n0 + offs_n)[:, None].to(tl.int64) * svl + offs_dv[None, :] * svd
            acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_ptrs, v_ptrs, n0, j_lo, j_hi, qidx, span,
                                    kv_start, C, _lmk_phase(kv_start, n0, C), qk_scale, dk_ok, dv_ok,
                                    BLOCK_N, True, MASK_LMK, LMK_ONE, PAD_DK, PAD_DV, UPCAST, IEEE, FOLD)
        # ... then the blocks inside every row's window, landmark test only.
        lo = b_
        hi = c_
        MASK_REST: tl.constexpr = False
    else:
        lo = start  # one loop, every block masked
        hi = end
        MASK_REST: tl.constexpr = True
    acc, m_i, l_i = _attend_range(acc, m_i, l_i, q, k_base, v_base, lo, hi, j_lo, j_hi, qidx, span,
                                  kv_start, C, qk_scale, skl, skd, svl, svd, offs_dk, offs_dv, dk_ok,
                                  dv_ok, BLOCK_N, MASK_REST, MASK_LMK, LMK_ONE, PAD_DK, PAD_DV, UPCAST,
                                  IEEE, FOLD)

    out, lse2 = _finish(acc, m_i, l_i)
    lse = lse2 * 0.6931471805599453

    o_ptrs = (O + b64 * sob + h.to(tl.int64) * soh + offs_m[:, None].to(tl.int64) * sol
              + offs_dv[None, :] * sod)
    out = _bf16_rne(out, UPCAST)
    if PAD_DV:
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])
    else:
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None])
    lse_ptrs = LSE + (pid_bh.to(tl.int64) * Lq + offs_m)
    tl.store(lse_ptrs, lse, mask=row_ok)


@triton.jit
def _attend_tma(acc, m_i, l_i, q, desc_k, desc_v, v_ptrs, b, kvh, n0, j_min, j_lo, j_hi,
                qidx, span, kv_start, C, ph, qk_scale, DV: tl.constexpr, BLOCK_DK: tl.constexpr,
                BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, MASK_WINDOW: tl.constexpr,
                MASK_LMK: tl.constexpr, V_TMA: tl.constexpr, LMK_ONE: tl.constexpr,
                FOLD: tl.constexpr, V_CHUNK: tl.constexpr = False, vc=0):
    """One key block ``[n0, n0 + BLOCK_N)`` of :func:`_swa_fwd_tma_kernel`: ``k`` by
    TMA, ``v`` by TMA (landmark rows zeroed) or by masked pointer loads through
    ``v_ptrs`` (the block's ``(BLOCK_N, BLOCK_DV)`` pointers); the window test only
    with ``MASK_WINDOW`` (otherwise every key of the block is inside every real
    row's window)."""
    offs_n = tl.arange(0, BLOCK_N)
    k = desc_k.load([b, kvh, (n0 - j_min).to(tl.int32), 0]).reshape(BLOCK_N, BLOCK_DK)
    s = tl.dot(q, k.T)
    if MASK_LMK:
        keep = _not_lmk(offs_n, n0, kv_start, C, ph, BLOCK_N, LMK_ONE)
    else:
        keep = offs_n >= 0  # unused: no landmark test
    p, m_new, l_i, acc = _online_step(s, acc, m_i, l_i, qidx, n0, span, keep, qk_scale, BLOCK_N,
                                      MASK_WINDOW, MASK_LMK, FOLD)
    if V_CHUNK:
        # the chunked view (chunk vc, row ph of it): the landmark row lies outside it and
        # arrives as the copy engine's zero fill
        v = desc_v.load([b, kvh, vc, ph.to(tl.int32), 0]).reshape(BLOCK_N, BLOCK_DV)
    elif V_TMA:
        v = desc_v.load([b, kvh, (n0 - j_min).to(tl.int32), 0]).reshape(BLOCK_N, BLOCK_DV)
        if MASK_LMK:
            v = tl.where(keep[:, None], v, 0.0)
    else:
        offs_dv = tl.arange(0, BLOCK_DV)
        if MASK_WINDOW:
            vrow = (n0 + offs_n >= j_lo) & (n0 + offs_n < j_hi)  # keys some row of the block sees
            if MASK_LMK:
                vrow = vrow & keep
            HAS_ROW: tl.constexpr = True
        else:
            vrow = keep if MASK_LMK else offs_n >= 0
            HAS_ROW: tl.constexpr = MASK_LMK
        if HAS_ROW:
            if BLOCK_DV != DV:
                v = tl.load(v_ptrs, mask=vrow[:, None] & (offs_dv < DV)[None, :], other=0.0)
            else:
                v = tl.load(v_ptrs, mask=vrow[:, None], other=0.0)
        else:
            if BLOCK_DV != DV:
                v = tl.load(v_ptrs, mask=(offs_dv < DV)[None, :], other=0.0)
            else:
                v = tl.load(v_ptrs)
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit
def _swa_fwd_tma_kernel(
    desc_q, desc_k, desc_v, desc_o, V, LSE,
    svb, svh, svl, svd,
    Hq, G, Lq, Lk, kv_start, j_min, W, C, qk_scale,
    DK: tl.constexpr, DV: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_LMK: tl.constexpr, EXPAND: tl.constexpr, V_TMA: tl.constexpr,
    LMK_ONE: tl.constexpr = False, FOLD: tl.constexpr = False, PHASES: tl.constexpr = False,
    V_CHUNK: tl.constexpr = False, EDGE_STAGES: tl.constexpr = 0, EDGE_VIEW: tl.constexpr = False,
):
    """Prefill with TMA tensor descriptors (Hopper, bf16/fp16).

    ``desc_q`` / ``desc_o`` describe ``(B, Hq, Lq, D)`` with blocks
    ``[1, 1, BLOCK_M, BLOCK_D]``; ``desc_k`` / ``desc_v`` describe the key
    range from key ``j_min`` on (``(B, Hkv, Lk - j_min, D)``, blocks
    ``[1, 1, BLOCK_N, BLOCK_D]``), where ``j_min`` is the first key any query
    of the call sees. Key tiles are aligned to ``j_min``, so no tile reaches
    left of it, and the copy engine fills rows past ``Lk``, rows past ``Lq``
    and columns past ``D`` with zeros: no load needs a mask. The only keys
    inside ``[j_min, Lk)`` that no query sees are landmarks (``MASK_LMK``);
    their ``v`` rows are zeroed after the load (``V_TMA``) or not loaded at
    all (``V_TMA=False``: ``v`` by masked pointer loads), so ``0 * NaN``
    cannot reach ``o``. The store of ``o`` through ``desc_o`` clips rows past
    ``Lq`` and columns past ``Dv``.

    ``V_CHUNK`` (with ``PHASES``, ``LMK_ONE``, ``MASK_LMK``, pointer ``v``): the
    blocks inside every real row's window load ``v`` through ``desc_v``
    describing ``(B, Hkv, (Lk - j_min) // C, C - 1, Dv)`` with strides
    ``(sb, sh, C * sl, sl, sd)`` from key ``j_min`` and blocks ``[1, 1, 1,
    BLOCK_N, BLOCK_DV]``: the launcher guarantees that ``C`` is a multiple of
    ``BLOCK_N`` and that key ``j_min`` starts a chunk (``launch._v_chunk_desc``),
    so a block is rows ``ph .. ph + BLOCK_N - 1`` of one chunk (``ph`` its
    landmark phase) and the landmark, row ``C - 1``, lies outside the view: the
    copy engine fills it with zeros. Inside blocks past the last whole chunk run
    with the edge blocks (pointer loads); the block order changes there, not the
    result beyond rounding.

    ``PHASES`` (a tuning mode, :data:`launch.TMA_PHASES`): the key blocks some
    row sees only in part (the left edge and the diagonal) run first, with the
    window test, then the blocks inside every real row's window run without it
    (only the landmark column test). Online softmax does not depend on the
    order of its blocks; rows past ``Lq`` are never stored. Otherwise one loop
    masks every block.

    ``EDGE_STAGES`` (with ``PHASES``; 0 = the launch's ``num_stages``; 2 shipped at D = 128
    since session 28, ``launch.TMA_V_CHUNK_EDGE_STAGES``): the pipeline depth of the
    edge-block loop alone. Triton 3.6 gives each
    pipelined loop its own mbarrier arrays and places one of them between the V stages and
    the Q tile, whose 1024-byte alignment then costs 1000 bytes: at D = 128, 64 x 64, three
    stages, the ``V_CHUNK`` kernel needs 115736 bytes of shared memory, 24 more than two
    CTAs per SM allow, and 114744 with ``EDGE_STAGES=2`` (CPU compile, session 26;
    ``tools/lab_vchunk.py``'s ``chunk-s3-edge2``).

    ``EDGE_VIEW`` (session 36's lab mode, shipped in session 37 where
    ``launch._vchunk_variant`` finds the conditions below): the edge blocks take ``v``
    through the chunked view too. Right only where
    ``C == BLOCK_N``, ``expand_to_chunk`` and ``Lq``, ``Lk``, ``kv_start`` and the row tile are
    whole chunks: every edge block is then one whole chunk inside the view, and every key of
    it but the landmark (the copy engine's zero row) is seen by some row of the tile, so no
    invisible slot is loaded.
    """
    # V_CHUNK: the inside blocks' v through the chunked view (needs the phases, the landmark
    # phase carried block to block, and v's edge blocks by pointers)
    tl.static_assert(not V_CHUNK or (PHASES and LMK_ONE and MASK_LMK and not V_TMA))
    tl.static_assert(not EDGE_VIEW or V_CHUNK)
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // Hq
    h = pid_bh % Hq
    kvh = h // G

    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    m_last = tl.minimum(m0 + BLOCK_M, Lq) - 1
    qidx, span, j_lo, j_hi = _rows(offs_m, m0, m_last, kv_start, Lq, Lk, W, C, EXPAND)
    start = j_min + ((j_lo - j_min) // BLOCK_N) * BLOCK_N

    q = desc_q.load([b, h, m0, 0]).reshape(BLOCK_M, BLOCK_DK)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    offs_dv = tl.arange(0, BLOCK_DV)
    v_base = V + b.to(tl.int64) * svb + kvh.to(tl.int64) * svh
    if PHASES:
        # Blocks inside every real row's window: [mid_lo, mid_hi) on the block grid from start.
        n_left, n_mid = _inside_blocks(start, j_hi, m0, m_last, kv_start, Lq, Lk, W, C, EXPAND, BLOCK_N)
        if V_CHUNK:  # the chunked view of v ends at the last whole chunk; blocks past it are edges
            n_mid = tl.maximum(tl.minimum(n_mid, ((Lk - j_min) // C * C - (start - j_min)) // BLOCK_N - n_left), 0)
        mid_lo = start + n_left * BLOCK_N
        mid_hi = mid_lo + n_mid * BLOCK_N
        # The edge blocks, masked: [start, mid_lo), then [mid_hi, j_hi).
        for i in tl.range(0, tl.cdiv(j_hi - start, BLOCK_N) - n_mid,
                          num_stages=EDGE_STAGES if EDGE_STAGES > 0 else None):
            n0 = _edge_block(i, start, n_left, mid_hi, BLOCK_N)
            v_ptrs = v_base + (n0 + offs_n)[:, None].to(tl.int64) * svl + offs_dv[None, :] * svd
            ph_e = _lmk_phase(kv_start, n0, C)
            if EDGE_VIEW:  # the block is chunk (n0 - j_min) // C of the view, from its row 0
                ph_e = ph_e * 0  # the phase is 0 on whole chunks; "* 0" lets the compiler drop the modulo
            acc, m_i, l_i = _attend_tma(acc, m_i, l_i, q, desc_k, desc_v, v_ptrs, b, kvh,
                                        n0, j_min, j_lo, j_hi, qidx, span, kv_start, C,
                                        ph_e, qk_scale, DV, BLOCK_DK, BLOCK_DV,
                                        BLOCK_N, True, MASK_LMK, V_TMA, LMK_ONE, FOLD,
                                        EDGE_VIEW, ((n0 - j_min) // C).to(tl.int32))
        lo = mid_lo
        hi = mid_hi
        MASK_MID: tl.constexpr = False
    else:
        lo = start
        hi = j_hi
        MASK_MID: tl.constexpr = True
    ph = _lmk_phase(kv_start, lo, C)
    vc = 0
    if V_CHUNK:  # the chunk of key lo (its row in the chunk: ph)
        vc = ((lo - j_min) // C).to(tl.int32)
    v_ptrs = v_base + (lo + offs_n)[:, None].to(tl.int64) * svl + offs_dv[None, :] * svd
    for n0 in range(lo, hi, BLOCK_N):
        acc, m_i, l_i = _attend_tma(acc, m_i, l_i, q, desc_k, desc_v, v_ptrs, b, kvh, n0, j_min,
                                    j_lo, j_hi, qidx, span, kv_start, C, ph, qk_scale, DV, BLOCK_DK,
                                    BLOCK_DV, BLOCK_N, MASK_MID, MASK_LMK, V_TMA, LMK_ONE, FOLD,
                                    V_CHUNK, vc)
        ph = _next_phase(ph, C, BLOCK_N, LMK_ONE)
        if V_CHUNK:
            vc = tl.where(ph == 0, vc + 1, vc)
        else:
            v_ptrs += BLOCK_N * svl

    out, lse2 = _finish(acc, m_i, l_i)
    lse = lse2 * 0.6931471805599453
    desc_o.store([b, h, m0, 0], out.to(desc_o.dtype).reshape(1, 1, BLOCK_M, BLOCK_DV))
    tl.store(LSE + (pid_bh.to(tl.int64) * Lq + offs_m), lse, mask=offs_m < Lq)


@triton.jit
def _swa_splitkv_kernel(
    Q, K, V, OP, LP,
    sqb, sqh, sql, sqd,
    skb, skh, skl, skd,
    svb, svh, svl, svd,
    Hq, Hkv, G, Lq, Lk, kv_start, W, C, split_len, rows_total, qk_scale,
    DK: tl.constexpr, DV: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_LMK: tl.constexpr, EXPAND: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    DIRECT: tl.constexpr = False, LMK_ONE: tl.constexpr = False, FOLD: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """Partial states: ``OP[s, row, :]`` (fp32, normalised) and ``LP[s, row]``
    (base-2 LSE, -inf when split ``s`` saw nothing), ``row = (b*Hq + h)*Lq + i``;
    ``rows_total = B * Hq * Lq`` is the stride of one split.

    ``DIRECT`` (one split only): ``OP``/``LP`` are the final ``o`` (contiguous
    canonical layout) and ``lse``, written with the natural-log LSE; this is
    the GQA-packed prefill path (one K/V tile serves the ``G`` heads).

    ``PDL`` (Hopper programmatic dependent launch, ``launch.SPLIT_PDL``): every
    program tells the GPU at its start that the dependent grid (the combine,
    launched with ``launch_pdl``) may be scheduled now; the combine waits for
    this grid's completion and memory flush (``gdc_wait``) before it reads a
    partial state, so only its launch and start overlap this kernel."""
    if PDL:
        gdc_launch_dependents()
    pid_m = tl.program_id(0)
    pid_bk = tl.program_id(1)
    pid_s = tl.program_id(2)
    b = pid_bk // Hkv
    kvh = pid_bk % Hkv
    PAD_DK: tl.constexpr = BLOCK_DK != DK
    PAD_DV: tl.constexpr = BLOCK_DV != DV

    GL = G * Lq
    r0 = pid_m * BLOCK_M
    offs_r = r0 + tl.arange(0, BLOCK_M)
    row_ok = offs_r < GL
    i_row = offs_r // G  # query index (non-decreasing in r)
    g_row = offs_r % G
    h_row = kvh * G + g_row
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    dk_ok = offs_dk < DK
    dv_ok = offs_dv < DV

    i_last = (tl.minimum(r0 + BLOCK_M, GL) - 1) // G
    qidx, span, j_lo, j_hi = _rows(i_row, r0 // G, i_last, kv_start, Lq, Lk, W, C, EXPAND)
    start = (j_lo // BLOCK_N) * BLOCK_N + pid_s * split_len
    end = tl.minimum(start + split_len, j_hi)

    b64 = b.to(tl.int64)
    q_ptrs = (Q + b64 * sqb + h_row[:, None].to(tl.int64) * sqh + i_row[:, None].to(tl.int64) * sql
              + offs_dk[None, :] * sqd)
    q = _load_tile(q_ptrs, row_ok, dk_ok, True, PAD_DK, UPCAST)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    k_base = K + b64 * skb + kvh.to(tl.int64) * skh
    v_base = V + b64 * svb + kvh.to(tl.int64) * svh
    acc, m_i, l_i = _attend_range(acc, m_i, l_i, q, k_base, v_base, start, end, j_lo, j_hi, qidx, span,
                                  kv_start, C, qk_scale, skl, skd, svl, svd, offs_dk, offs_dv, dk_ok,
                                  dv_ok, BLOCK_N, True, MASK_LMK, LMK_ONE, PAD_DK, PAD_DV, UPCAST,
                                  IEEE, FOLD)

    out, lse2 = _finish(acc, m_i, l_i)
    row = (b64 * Hq + h_row) * Lq + i_row  # int64
    if DIRECT:
        part = row
        lse_out = lse2 * 0.6931471805599453
    else:
        part = pid_s.to(tl.int64) * rows_total + row
        lse_out = lse2
    op_ptrs = OP + part[:, None] * DV + offs_dv[None, :]
    if DIRECT:  # OP is the bf16 output itself (packed rows); else fp32 partials, not rounded
        out = _bf16_rne(out, UPCAST)
    if PAD_DV:
        tl.store(op_ptrs, out.to(OP.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])
    else:
        tl.store(op_ptrs, out.to(OP.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LP + part, lse_out, mask=row_ok)


@triton.jit
def _swa_combine_kernel(
    OP, LP, O, LSE, rows_total, num_splits,
    DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr, ROWS: tl.constexpr,
    PDL: tl.constexpr = False, UPCAST: tl.constexpr = False,
):
    """``O[row] = sum_s w_s OP[s, row]``, ``w_s = 2^(LP[s,row] - lse2)``; ``O`` is the
    contiguous canonical output, so its row ``(b*Hq + h)*Lq + i`` is at ``row * DV``.

    ``PDL``: launched as a programmatic dependent of the split kernel; nothing
    is read before ``gdc_wait`` returns (the split grid complete, its writes
    visible)."""
    pid = tl.program_id(0)
    if PDL:
        gdc_wait()
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_DV)
    s_ok = offs_s < num_splits
    d_ok = offs_d < DV
    for rr in range(ROWS):
        row = pid.to(tl.int64) * ROWS + rr
        if row < rows_total:
            lp = tl.load(LP + offs_s.to(tl.int64) * rows_total + row, mask=s_ok, other=float("-inf"))
            m = tl.max(lp, 0)
            m_safe = tl.where(tl.abs(m) == float("inf"), 0.0, m)  # a split that saw +inf: w = inf
            w = tl.math.exp2(lp - m_safe)  # 0 for empty splits
            denom = tl.sum(w, 0)
            op = tl.load(OP + (offs_s.to(tl.int64) * rows_total + row)[:, None] * DV + offs_d[None, :],
                         mask=(s_ok & (w > 0))[:, None] & d_ok[None, :], other=0.0)
            empty = denom == 0.0
            d_safe = tl.where(empty, 1.0, denom)
            out = tl.sum(op * w[:, None], 0) / d_safe
            lse = tl.where(empty, float("-inf"), (m_safe + tl.math.log2(d_safe)) * 0.6931471805599453)
            tl.store(O + row * DV + offs_d, _bf16_rne(out, UPCAST).to(O.dtype.element_ty), mask=d_ok)
            tl.store(LSE + row, lse)
