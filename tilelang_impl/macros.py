"""The rule and the online softmax, written once as TileLang macros.

Every kernel of this backend (the Hopper kernels in :mod:`tilelang_impl.kernels`
and the CPU kernel built with TileLang's C target) calls these macros, so the
window bounds, the visibility predicate and the online-softmax update exist
exactly once in TileLang. The Python copy of the rule lives in
:mod:`reference.mask`; the conformance suite checks the two against each other.

Position frame. The kernels never see ``kv_start`` itself. They receive
``r = kv_start % chunk_size`` and work with *relative* positions::

    kpos(j) = r + j                 qpos(i) = r + (Lk - Lq) + i

Both the floor alignment of the expanded left edge and the landmark rule
depend on a position only modulo ``chunk_size``, and ``kv_start - r`` is a
multiple of ``chunk_size``, so the relative frame gives the same visibility as
the absolute one while every integer stays small (no int32 overflow for any
``kv_start``, 10**6 + 3 or 2**40).

Landmark test. :func:`is_landmark` tests a position with a float quotient (about 9
instructions; exact below 2**24, used below 2**22) or two (up to 2**29, in the kernels
built ``wide``, whose ``inv_chunk`` is a :class:`WidePositions`; where a tile tests its
positions one by one, the first quotient is taken once per tile, :func:`tile_divisor`);
:func:`tile_landmark`
is what the score masks and the V-row tests call: with ``lmk_cols = K`` baked in it
compares the tile column with the tile's first ``K`` landmark columns instead (``K``
integer compares, one floor modulo per tile), which is the same predicate whenever
``K * C >= block_N`` (the launcher's rule, ``launch.lmk_cols_for``).

Arithmetic knobs (baked in, never the answer): ``win_u32`` (:func:`visible`: the
window test as one unsigned compare), a folded scale (:func:`mask_scores`,
:func:`mask_landmarks` and :func:`online_softmax_update` with the scale moved
from the mask select into the exponent: valid for a positive scale only, which
the launcher decides per call) and ``fast_exp2`` (:func:`exp2`: the hardware
``ex2.approx.ftz`` on the GPU).

Loops. Buffer-level macros take ``gpu``: on the GPU they loop with
``T.Parallel`` over fragments; the C target rejects ``T.Parallel`` over local
buffers, so the CPU kernel passes ``gpu=False`` and the same body runs under
``T.grid`` (row maxima and sums as plain loops there; ``T.reduce_max`` /
``T.reduce_sum`` over fragments on the GPU).
"""

from __future__ import annotations

import math

import tilelang.language as T

from reference.validation import LOG2E  # noqa: F401  (macros.LOG2E: the kernels' base-2 scale)

LN2 = 0.6931471805599453


def _loop(gpu: bool):
    return T.Parallel if gpu else T.grid


#: CUDA source of the approximate base-2 exponential (:func:`exp2` with
#: ``fast=True``): the hardware ``ex2.approx.ftz.f32`` (one MUFU.EX2; relative
#: error about 2**-22, subnormal inputs and results flushed to zero). A kernel
#: that uses it imports it once (``T.import_source(EX2_APPROX_SRC)``).
EX2_APPROX_SRC = r"""
__device__ __forceinline__ float hils_ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
"""


def exp2(x, fast: bool = False):
    """``2 ** x`` in fp32 (plain Python, expands at trace time).

    ``fast=False``: ``T.exp2`` (CUDA ``exp2f`` without fast math: four
    instructions on sm_90, a range test and two rescaling multiplies around
    MUFU.EX2, so that subnormal results stay exact). ``fast=True`` (GPU
    kernels only, baked in): ``hils_ex2_approx`` (:data:`EX2_APPROX_SRC`), the
    MUFU.EX2 alone. The two differ by a few ulp and below 2**-126, where the
    fast one gives 0: ``exp2(-inf) = 0``, ``exp2(0) = 1`` and NaN stay exact,
    which is all the online softmax relies on (a probability below 2**-126
    next to a row maximum of probability 1 is below fp32 resolution of the sum).
    """
    if fast:
        return T.call_extern("float32", "hils_ex2_approx", x)
    return T.exp2(x)


@T.macro
def window_left(qpos, window_size, chunk_size, expand_to_chunk):
    """Left edge (inclusive, relative position) of the window of a query at ``qpos``.

    ``T.floordiv`` rounds toward minus infinity, as SPEC.md requires for an
    edge left of position 0. ``expand_to_chunk`` is a Python bool (baked in).
    """
    left = qpos - window_size + 1
    if expand_to_chunk:
        left = T.floordiv(left, chunk_size) * chunk_size
    return left


class WidePositions:
    """The landmark divisor of a kernel built for positions up to 2**29 (``wide``, baked
    in): ``inv`` is the kernel's ``float32(1 / C)`` argument, and :func:`is_landmark` takes
    a second float quotient of the first one's remainder. Made by
    :func:`landmark_divisor`; passed where the macros take ``inv_chunk``, so only the
    landmark tests look at it (a trace-time Python object, never in the IR).

    ``base``, ``k_first``: set by :func:`tile_divisor` for one tile, ``base`` the int32
    register holding the first quotient's remainder of the tile's first position ``r +
    k_first`` (congruent to it modulo ``C``, in ``[-192, C + 192]``); the tile's tests
    then take one quotient of ``base + j`` (:func:`_tile_is_landmark`)."""

    __slots__ = ("inv", "base", "k_first")

    def __init__(self, inv, base=None, k_first=None):
        self.inv = inv
        self.base = base
        self.k_first = k_first


def landmark_divisor(inv_c, wide: bool):
    """What a kernel passes as ``inv_chunk``: its ``inv_c`` argument, or with ``wide``
    (baked in: the launcher's ``launch.wide_positions`` of the call) that argument as a
    :class:`WidePositions`."""
    return WidePositions(inv_c) if wide else inv_c


def _float_rem(x, chunk_size, inv):
    """``x - trunc(float32(x) * inv) * C`` in int32: ``x`` minus the float quotient's multiple
    of ``C`` (``inv = float32(1 / C)``)."""
    return x - T.Cast("int32", T.Cast("float32", x) * inv) * chunk_size


@T.macro
def is_landmark(kpos, chunk_size, inv_chunk):
    """``(kpos + 1) % chunk_size == 0`` for ``kpos >= 0`` without an integer division.

    ``inv_chunk`` is ``float32(1 / chunk_size)``. For ``x = kpos + 1 < 2**24`` (exact in
    float32) the reciprocal and the product each round by at most ``2**-24`` relative,
    so the quotient is within ``(x / C) * 2**-23 < 1`` of ``x / C`` (``C >= 3``; exact for
    ``C`` = 1, 2) and ``x - q * chunk_size`` lies in ``(-C, 2C)``: ``x`` is a multiple
    of ``C`` exactly when that remainder is ``0`` or ``C`` (``-C`` is tested too). The
    launcher bakes this form for calls with ``Lk + C < 2**22`` (``C`` the kernel-frame
    chunk, ``launch.frame``; the bound it has always used, with room for the tiles' keys
    past ``Lk``). A scan of ``C`` = 1..39 and 15 larger chunks found its first error at
    ``x = 2**25 + 2`` (``C = 1``).

    ``inv_chunk`` a :class:`WidePositions` (the ``wide`` kernels, ``Lk + C < 2**29``):
    two quotients. For ``x < 2**30`` the first one's relative error is, to first order, at
    most ``3 * 2**-24`` (``x`` rounded to float32, the rounded reciprocal, the product),
    so it is off by at most ``1 + 192 / C`` and its remainder ``y`` lies in ``[-192, C +
    192]`` with ``y = x (mod C)``, no int32 product past ``2 * 2**29``; the second
    quotient, of ``y``, is off by less than one past its truncation, so ``y - q' * C``
    lies in ``(-2C, 2C)``, a multiple of ``C`` exactly when it is ``-C``, ``0`` or ``C``.
    ``tests/test_tilelang_cpu.py`` runs both forms of this macro on TileLang's C target
    over millions of positions up to ``2**29`` (a review emulated float32 exhaustively
    below ``2**29 + 512`` for nine chunks: no error).

    A negative ``kpos`` (the tile tests of the ``wide`` kernels, :func:`_tile_is_landmark`:
    ``x`` down to ``-191``) takes the single form, exact there too: for ``|x| / C`` below
    ``2**20`` the quotient is within ``2**-2`` of ``x / C``, so its truncation is within
    ``2`` of it and ``rem`` lies in ``(-2C, 2C)``, congruent to ``x`` modulo ``C``.
    """
    x = kpos + 1
    if isinstance(inv_chunk, WidePositions):
        rem = _float_rem(_float_rem(x, chunk_size, inv_chunk.inv), chunk_size, inv_chunk.inv)
    else:
        rem = _float_rem(x, chunk_size, inv_chunk)
    return T.Or(T.Or(rem == 0, rem == chunk_size), rem == -chunk_size)


@T.macro
def tile_divisor(inv_chunk, k_first, r, chunk_size, needed=True):
    """``inv_chunk`` for the landmark tests of the tile whose column 0 is key index
    ``k_first``: itself, except a :class:`WidePositions` (the ``wide`` kernels) where
    ``needed`` (the tile tests positions one by one: ``mask_lmk`` with ``lmk_cols = 0``),
    which gets the tile's reduced first position, ``_float_rem(r + k_first)`` in an int32
    register computed once per tile. Its tests then cost what the single-quotient test
    costs per element (one quotient of ``base + j``, :func:`_tile_is_landmark`), where two
    quotients per element made the ``wide`` kernels 6-13% slower at ``C = 16`` (session
    31, ``tools/lab_wide.py``). The kernels without ``wide`` get ``inv_chunk`` unchanged:
    their IR does not change. Called by :func:`mask_scores`, :func:`mask_landmarks` and
    :func:`zero_landmark_rows`; :func:`key_kept` (the element-wise ``V`` load of
    ``lmk_zero="tile"`` and the CPU kernel's loads) keeps the two quotients per key."""
    d = inv_chunk
    if needed and isinstance(inv_chunk, WidePositions) and inv_chunk.base is None:
        d = WidePositions(inv_chunk.inv,
                          T.alloc_var("int32", init=_float_rem(r + k_first, chunk_size, inv_chunk.inv)),
                          k_first)
    return d


def _tile_is_landmark(k_first, j, r, chunk_size, inv_chunk):
    """:func:`is_landmark` of ``r + k_first + j`` (``j`` a tile column or row), through the
    tile's register when ``inv_chunk`` is a :class:`WidePositions` from :func:`tile_divisor`
    for this ``k_first``: ``base + j`` is congruent to ``r + k_first + j`` modulo ``C`` and
    lies in ``[-192, C + 192 + 2 * block_N]``, where one quotient is exact
    (:func:`is_landmark`: ``|x| / C <= 706``, its error below ``2**-14``)."""
    if isinstance(inv_chunk, WidePositions) and inv_chunk.base is not None:
        if inv_chunk.k_first is not k_first:  # trace time: a register is one tile's
            raise ValueError("tile_divisor: a tile's landmark register used for another tile")
        lmk = is_landmark(inv_chunk.base[0] + j, chunk_size, inv_chunk.inv)
    else:
        lmk = is_landmark(r + k_first + j, chunk_size, inv_chunk)
    return lmk


@T.macro
def first_landmark(k_first, r, chunk_size):
    """Column of the first landmark in the tile whose column 0 is key index ``k_first``.

    Column ``j`` holds the key at relative position ``r + k_first + j``, a
    landmark when ``(r + k_first + j + 1) % C == 0``: so exactly the columns
    ``j0 + m * C`` (``m >= 0``) with ``j0 = floormod(-(r + k_first + 1), C)`` in
    ``[0, C)``. One integer division per tile, not per element.
    """
    return T.floormod(-(r + k_first + 1), chunk_size)


@T.macro
def tile_landmark_start(k_first, r, chunk_size, mask_lmk, lmk_cols):
    """``j0`` (:func:`first_landmark`) of the tile, computed once into an int32
    register before a loop over the tile when ``mask_lmk`` and ``lmk_cols``
    (else ``None``: the general test needs no per-tile value). Passed on to
    :func:`tile_landmark` (and, with ``lmk_rows_j0``, to
    :func:`zero_landmark_rows`); without the register nvcc re-derives the
    floor modulo inside every short-circuited ``&&`` branch of the window test.
    """
    j0 = None
    if mask_lmk and _column_count(lmk_cols):  # constant columns (a tuple): no register
        j0 = T.alloc_var("int32", init=first_landmark(k_first, r, chunk_size))
    return j0


def _columns_baked(lmk_cols) -> bool:
    """Whether the landmark columns are baked (a count ``K > 0`` or constant columns, a
    tuple): a Python bool for the macros' trace-time tests (TileLang's builder warns on a
    tuple used as a condition and takes it for a constant)."""
    return isinstance(lmk_cols, tuple) or lmk_cols > 0


def _column_count(lmk_cols) -> bool:
    """Whether the columns are a count ``K > 0`` (``j0 + m * C`` from a tile's register),
    not constants (a tuple, :func:`constant_landmark_columns`)."""
    return not isinstance(lmk_cols, tuple) and lmk_cols > 0


def constant_landmark_columns(block_N: int, lmk_cols: int) -> tuple:
    """The landmark columns of every tile of a call whose tiles start on chunk boundaries and
    whose kernel-frame chunk is ``C = block_N / lmk_cols`` (``kernels.fwd_tc``'s
    ``lmk_const``; ``launch.lmk_const_acts`` says which calls): ``C - 1, 2 C - 1, ...,
    block_N - 1``, plain ints, the ``lmk_cols`` form of :func:`tile_landmark` with ``j0 =
    C - 1`` known at trace time (``first_landmark`` of a tile at a chunk start)."""
    if lmk_cols <= 0 or block_N % lmk_cols:
        raise ValueError(f"lmk_const: constant landmark columns need lmk_cols={lmk_cols} > 0 "
                         f"dividing block_N={block_N}")
    c = block_N // lmk_cols
    return tuple((m + 1) * c - 1 for m in range(lmk_cols))


def _landmark_columns(j, j0, chunk_size, lmk_cols):
    """``j`` is one of ``j0, j0 + C, ..., j0 + (lmk_cols - 1) * C`` (plain Python:
    ``lmk_cols`` integer compares, unrolled at trace time); ``lmk_cols`` a tuple
    (:func:`constant_landmark_columns`): one of those columns, constants (``j0`` unused)."""
    cols = lmk_cols if isinstance(lmk_cols, tuple) else (
        [j0] + [j0 + m * chunk_size for m in range(1, lmk_cols)])
    hit = j == cols[0]
    for col in cols[1:]:
        hit = T.Or(hit, j == col)
    return hit


@T.macro
def tile_landmark(k_first, j, r, chunk_size, inv_chunk, lmk_cols, j0=None):
    """Whether column ``j`` of the tile whose column 0 is key index ``k_first``
    holds a landmark, i.e. ``(kpos + 1) % C == 0`` for ``kpos = r + k_first + j``.

    ``lmk_cols`` (Python int, baked in) picks the arithmetic, never the answer:

    - ``0``: :func:`is_landmark` of the position (about 9 instructions per
      element: int to float, multiply, float to int, multiply-add, 3 compares);
    - ``K >= 1``: ``j`` compared with the first ``K`` landmark columns
      ``j0 + m * C`` of the tile (``j0`` from :func:`tile_landmark_start`, once
      per tile, required): ``K`` integer compares per element;
    - a tuple of ints (:func:`constant_landmark_columns`, for calls whose every tile
      starts a chunk with ``K * C == block_N``): ``j`` compared with those constants.

    The two agree exactly for every column ``j`` in ``[0, block_N)`` when
    ``K * C >= block_N``: the tile's landmark columns are ``j0 + m * C`` with
    ``j0 >= 0``, so those with ``m >= K`` lie at ``j >= K * C >= block_N``,
    outside the tile (e.g. ``C >= block_N``: one column ``j0``, or none when
    ``j0 >= block_N``). The launcher bakes ``K = ceil(block_N / C)`` for the
    call's kernel-frame ``C`` (``tilelang_impl.launch.lmk_cols_for``), which
    meets that, and ``0`` when that would take more than a few compares. The
    frame's ``C`` is the one the kernel computes with, so the equality holds in
    every frame; when the chunk outlasts every position (``C = Lk + 1``) no key
    below ``Lk`` is a landmark and both tests mark at most column
    ``Lk - k_first``, a key past ``Lk`` that no row sees.
    """
    if _columns_baked(lmk_cols):
        lmk = _landmark_columns(j, j0, chunk_size, lmk_cols)
    else:
        lmk = _tile_is_landmark(k_first, j, r, chunk_size, inv_chunk)
    return lmk


@T.macro
def visible(qpos, k_first, j, left, r, chunk_size, inv_chunk, mask_lmk, lmk_cols=0, j0=None,
            win_u32=False):
    """Whether the query at ``qpos`` (window edge ``left``) sees the key in column
    ``j`` of the tile whose column 0 is key index ``k_first`` (relative position
    ``r + k_first + j``); ``lmk_cols`` as in :func:`tile_landmark`.

    ``win_u32`` (Python bool, baked in) picks the arithmetic of ``left <= kpos
    <= qpos``, never the answer: ``False`` two signed compares joined by a
    short-circuit ``&&``; ``True`` one unsigned compare ``uint32(kpos - left)
    <= uint32(qpos - left)``. The same predicate because ``left <= qpos``
    always (``left`` is at most ``qpos - window_size + 1``, floored) and no
    difference overflows int32: the launcher keeps ``Lk + C < 2**29``
    (``launch.MAX_POSITIONS_WIDE``, ``C`` the kernel-frame chunk, the window clamped to
    ``Lk + C``), so ``kpos < 2**29 + block_N`` and ``left > -2**30``; a ``kpos`` left
    of ``left`` wraps to at least ``2**31``, above any ``qpos - left``.
    """
    kpos = r + k_first + j
    if win_u32:
        ok = T.Cast("uint32", kpos - left) <= T.Cast("uint32", qpos - left)
    else:
        ok = T.And(kpos >= left, kpos <= qpos)
    if mask_lmk:
        ok = T.And(ok, T.Not(tile_landmark(k_first, j, r, chunk_size, inv_chunk, lmk_cols, j0)))
    return ok


@T.macro
def block_key_range(q_first, q_end, Lq, Lk, r, window_size, chunk_size, expand_to_chunk):
    """Key indices ``[lo, hi)`` any query index in ``[q_first, q_end)`` can see.

    ``left`` is non-decreasing in the query position, so the range runs from the
    first query's left edge to the last query itself, clipped to ``[0, Lk)``.
    Keys left of ``lo`` are never loaded: whatever they hold (NaN included)
    cannot reach an output.
    """
    off = Lk - Lq
    lo = T.max(window_left(r + off + q_first, window_size, chunk_size, expand_to_chunk) - r, 0)
    hi = T.min(off + q_end, Lk)
    return lo, T.max(hi, lo)


def packed_row(hk, t, G):
    """``(head, query)`` of packed row ``t`` of key/value head ``hk``: with ``G`` (a
    baked int) query heads per key/value head packed query by query, row ``t`` is
    query ``t // G`` of head ``hk * G + t % G`` (a shift or a multiply by a
    constant, never a runtime division)."""
    return hk * G + t % G, t // G


def _row_pos(r, Lk, Lq, q_first, i, pack):
    """Relative position of tile row ``i``'s query: query ``q_first + i``, or with
    ``pack = G`` (``q_first`` the tile's first packed row) the query of packed row
    ``q_first + i`` (:func:`packed_row`)."""
    if pack:
        return r + Lk - Lq + packed_row(0, q_first + i, pack)[1]
    return r + Lk - Lq + q_first + i


@T.macro
def row_left_edges(left_row, q_first, block_M, Lq, Lk, r, window_size, chunk_size,
                   expand_to_chunk, gpu, pack=0):
    """``left_row[i]`` = relative left edge of the query of row ``i``
    (:func:`_row_pos`; once per block)."""
    for i in _loop(gpu)(block_M):
        left_row[i] = window_left(_row_pos(r, Lk, Lq, q_first, i, pack), window_size,
                                  chunk_size, expand_to_chunk)


def _scaled(x, scale_log2):
    """``x * scale_log2``, or ``x`` itself when the scale is folded into the
    exponent (``scale_log2 is None``: :func:`online_softmax_update` with
    ``scale``)."""
    return x if scale_log2 is None else x * scale_log2


@T.macro
def mask_scores(acc_s, left_row, q_first, k_first, block_M, block_N, Lq, Lk, r, chunk_size,
                inv_chunk, mask_lmk, scale_log2, gpu, lmk_cols=0, win_u32=False, j0=None,
                pack=0):
    """Scale the raw products into base-2 logits (``* scale_log2``) and replace
    the score of every invisible (row, key) pair by ``-inf``.

    A select, not an addition: a NaN score of an invisible key (from a NaN in
    ``k``) becomes ``-inf`` too. The scale is applied inside the select, so a
    masked score stays ``-inf`` for any ``sm_scale`` (zero and negative
    included; scaling after the mask would turn ``-inf`` into ``+inf`` or NaN).
    ``scale_log2=None``: no scale here, the raw product or ``-inf`` (the scale
    folded into the exponent, :func:`online_softmax_update` with ``scale``;
    positive scales only).
    Keys at or beyond ``Lk`` are invisible because ``kpos <= qpos <= r + Lk - 1``
    for every real row. ``lmk_cols``: the landmark arithmetic
    (:func:`tile_landmark`, baked in); ``win_u32``: the window compare
    (:func:`visible`, baked in); ``j0``: the tile's first landmark column when
    the kernel already holds it (:func:`tile_landmark_start`), else computed here.
    ``pack``: the row's query as in :func:`_row_pos`.
    """
    if j0 is None:
        j0 = tile_landmark_start(k_first, r, chunk_size, mask_lmk, lmk_cols)
    inv_t = tile_divisor(inv_chunk, k_first, r, chunk_size, mask_lmk and not _columns_baked(lmk_cols))
    for i, j in _loop(gpu)(block_M, block_N):
        acc_s[i, j] = T.if_then_else(
            visible(_row_pos(r, Lk, Lq, q_first, i, pack), k_first, j, left_row[i], r,
                    chunk_size, inv_t, mask_lmk, lmk_cols, j0, win_u32),
            _scaled(acc_s[i, j], scale_log2), -T.infinity("float32"))


@T.macro
def tile_inside_windows(q_first, k_first, block_M, block_N, Lq, Lk, r, window_size, chunk_size,
                        expand_to_chunk, left_last=None):
    """Whether every key of the tile ``[k_first, k_first + block_N)`` lies inside the
    window of every query row ``q_first .. q_first + block_M - 1`` (rows past ``Lq``
    included, which only makes the test stricter).

    ``left`` is non-decreasing and ``qpos`` increasing in the row, so it is
    enough that the tile starts at or right of the last row's left edge and
    ends at or left of the first row's position. Such a tile needs no window
    test, only the landmark columns (:func:`mask_landmarks`); it never reaches
    past ``Lk`` since the first row's position is below ``r + Lk``.

    ``left_last``: the last row's left edge when the caller holds it in a register
    (:func:`last_row_left`, the ``hoist_left`` knob of ``kernels.fwd_tc``); else it is
    computed here, in the key loop (where nvcc leaves the runtime floor division: the SASS
    of session 44).
    """
    if left_last is None:
        left_last = last_row_left(q_first + block_M, Lq, Lk, r, window_size, chunk_size,
                                  expand_to_chunk)
    return T.And(r + k_first >= left_last, k_first + block_N - 1 <= Lk - Lq + q_first)


@T.macro
def last_row_left(q_end, Lq, Lk, r, window_size, chunk_size, expand_to_chunk):
    """Left edge (relative position) of the window of query index ``q_end - 1``, the last
    row of a tile of queries ``[.., q_end)``: the ``left_last`` of
    :func:`tile_inside_windows` for that tile, computed once before a key loop."""
    return window_left(r + (Lk - Lq) + q_end - 1, window_size, chunk_size, expand_to_chunk)


@T.macro
def mask_landmarks(acc_s, k_first, block_M, block_N, r, chunk_size, inv_chunk, scale_log2, gpu,
                   lmk_cols=0, j0=None):
    """Scale (``* scale_log2``; not with ``scale_log2=None``, as in
    :func:`mask_scores`) and put ``-inf`` (by select) in every landmark column
    of the tile; nothing else.

    What :func:`mask_scores` does with ``mask_lmk`` on a tile for which
    :func:`tile_inside_windows` holds (every window test there is true).
    ``lmk_cols``: the landmark arithmetic (:func:`tile_landmark`, baked in);
    ``j0`` as in :func:`mask_scores`.
    """
    if j0 is None:
        j0 = tile_landmark_start(k_first, r, chunk_size, True, lmk_cols)
    inv_t = tile_divisor(inv_chunk, k_first, r, chunk_size, not _columns_baked(lmk_cols))
    for i, j in _loop(gpu)(block_M, block_N):
        acc_s[i, j] = T.if_then_else(
            tile_landmark(k_first, j, r, chunk_size, inv_t, lmk_cols, j0),
            -T.infinity("float32"), _scaled(acc_s[i, j], scale_log2))


@T.macro
def scale_scores(acc_s, block_M, block_N, scale_log2, gpu):
    """``acc_s *= scale_log2``: what :func:`mask_scores` does without
    ``mask_lmk`` on a tile for which :func:`tile_inside_windows` holds."""
    for i, j in _loop(gpu)(block_M, block_N):
        acc_s[i, j] = acc_s[i, j] * scale_log2


@T.macro
def zero_landmark_rows(V_s, k_first, block_N, Dv, r, chunk_size, inv_chunk, dtype, gpu=True,
                       j0=None, lmk_cols=0):
    """Zero the rows of a loaded key/value tile that hold landmarks, and only those.

    Tile row ``j`` holds the key at relative position ``r + k_first + j``; it is a
    landmark when ``(r + k_first + j + 1) % C == 0``, so the first one is
    ``j0`` (:func:`first_landmark`) and the others follow every ``C``
    rows: ``ceil((block_N - j0) / C)`` rows (at most ``ceil(block_N / C)``).

    Why this is enough to keep ``0 * NaN`` out of ``P @ V`` (SPEC.md: only
    slots no query sees may hold NaN): keys left of the block's ``lo`` are never
    loaded; a non-landmark key in ``[lo, Lk)`` is seen by some query of the call
    (key ``j`` by query ``j - (Lk - Lq)`` when it is right of the block, by a
    query of the block otherwise), so it is finite; rows at or beyond ``Lk`` are
    zero-filled by the bulk copy (TMA bounds; the lab checks this with NaN
    placed right after the tensor).

    The write is a select on :func:`is_landmark` of the row (true by
    construction): a read-modify-write of the loaded tile, so the compiler
    orders it after the tile's load completes (a plain store would not wait
    for the bulk copy under warp specialisation, and the copy could land after
    it).

    Rows go ``R`` at a time, ``R * Dv`` a multiple of 256 elements (``R`` = 2
    for ``Dv`` = 128, 4 for 64): TileLang spreads a parallel loop over ``elements
    / vector width`` threads and cannot place the shared-memory sync inside a
    loop that only part of a warp runs (ThreadSync), which one row of 64
    elements did.

    ``j0`` given (the knob ``lmk_rows_j0`` of ``kernels.fwd_tc``: the tile's
    int32 first landmark row from :func:`tile_landmark_start`, the register the
    ``lmk_cols`` masks test against, computed once per tile): the same rows
    get the same zeros, with cheaper arithmetic, baked in:

    - the rows are ``j0 + m * C`` with that ``j0`` (no second floor modulo; the
      expression above is re-derived by TileLang in 64-bit inside the index,
      four software divisions per element);
    - the select tests ``j0 >= 0``, an integer condition true by construction
      (``j0 = floormod(., C)`` lies in ``[0, C)``) that TileLang cannot fold:
      the write stays a read-modify-write, so the consumer still waits for the
      bulk copy before it, and the value written is always 0, as above;
    - ``lmk_cols = K`` (baked, ``K * C >= block_N``, ``launch.lmk_cols_for``):
      the tile holds at most the ``K`` rows ``m < K`` (those with ``m >= K``
      lie at ``j >= K * C >= block_N``), so the rows are one static
      ``K x Dv`` parallel loop (``K`` padded to a multiple of ``R``) guarded by
      ``j0 + m * C < block_N``, no serial loop over row groups and no trip
      count to divide out. ``j0`` needs ``lmk_cols > 0`` (``launch.rows_j0_acts``;
      its serial-loop form failed ThreadSync at Dv = 80, 96, 112).

    Barriers (TileLang 0.1.15's ThreadSync, both forms): two of all consumer
    threads per tile (``bar.sync 3, 256``), one before the write (write after
    read: the previous tile's ``P @ V`` read ``V_s``; the stage mbarriers
    already order that, ThreadSync does not model them) and one before this
    tile's ``P @ V`` (read after write: each warpgroup's wgmma reads the rows
    the other one zeroed; needed). Here the first one is hoisted out of the
    rows, so a tile without a landmark row (``C > block_N``) has both, where
    the serial loop has only the second; wrapping the rows in a uniform
    ``if`` or a 0/1-trip loop did not move it (tried).

    Exact in every frame: ``j0`` is the same integer (:func:`first_landmark`
    of the same ``k_first``, ``r`` and ``C``), ``C < block_N`` gives several
    rows (all ``m < K``), ``C >= block_N``
    one row or none (``j0 >= block_N``), and with the frame's ``C = Lk + 1``
    the one row it may name lies at or past ``Lk``, zero already; rows past
    ``Lk`` are zero either way; a NaN in a landmark slot is overwritten, never
    read into the result (the select's value does not depend on it).
    """
    R = min(block_N, 256 // math.gcd(256, Dv))
    if isinstance(lmk_cols, tuple):  # kernels.fwd_tc's lmk_const comes with the view only
        raise ValueError("zero_landmark_rows: constant landmark columns need the chunk view of "
                         "v, which zeroes no V rows")
    if j0 is not None and not _column_count(lmk_cols):
        raise ValueError("zero_landmark_rows: j0 needs lmk_cols > 0 (launch.rows_j0_acts)")
    if j0 is None:
        j0 = first_landmark(k_first, r, chunk_size)
        n = T.max(T.ceildiv(block_N - j0, chunk_size), 0)
        inv_t = tile_divisor(inv_chunk, k_first, r, chunk_size)
        for p in T.serial(T.ceildiv(n, R)):
            for u, d in _loop(gpu)(R, Dv):
                if p * R + u < n:
                    V_s[j0 + (p * R + u) * chunk_size, d] = T.if_then_else(
                        _tile_is_landmark(k_first, j0 + (p * R + u) * chunk_size, r, chunk_size,
                                          inv_t),
                        T.Cast(dtype, 0), V_s[j0 + (p * R + u) * chunk_size, d])
    else:
        rows = -(-lmk_cols // R) * R
        for u, d in _loop(gpu)(rows, Dv):
            if T.And(u < lmk_cols, j0 + u * chunk_size < block_N):
                V_s[j0 + u * chunk_size, d] = T.if_then_else(
                    j0 >= 0, T.Cast(dtype, 0), V_s[j0 + u * chunk_size, d])


def finite_or_0(x):
    """``x``, or 0 where ``x`` is ``-inf`` or ``+inf``: the reference a row's exponentials
    are taken against (:func:`online_softmax_update`, the split-KV combine). A plain
    expression builder, not a ``T.macro``: a macro called inside the update's loops changes
    the IR enough that TileLang's ThreadSync refuses the split kernel without expansion
    (``d96-split-noexp``, CPU lowering)."""
    # two compares, not |x| == inf: TileLang's C target (the CPU kernel) has no fabs
    return T.if_then_else(T.Or(x == -T.infinity("float32"), x == T.infinity("float32")), 0.0, x)


def _finite(x):
    """``x`` is neither ``-inf`` nor ``+inf``, nor NaN (a running max can be NaN on the C
    target, whose ``max`` is a select; on the GPU ``fmaxf`` skips NaN)."""
    return T.And(x > -T.infinity("float32"), x < T.infinity("float32"))


@T.macro
def _tile_max(acc_s, row_max, block_M, block_N, gpu):
    """``row_max[i] = max_j acc_s[i, j]`` (``-inf`` for a row of ``-inf``)."""
    if gpu:
        T.reduce_max(acc_s, row_max, dim=1, clear=True)
    else:  # thread-local rows: plain loops (T.reduce_* of one row trips a TVM check)
        T.fill(row_max, -T.infinity("float32"))
        for i, j in T.grid(block_M, block_N):
            row_max[i] = T.max(row_max[i], acc_s[i, j])


@T.macro
def online_softmax_update(acc_s, m, m_prev, alpha, l, row_sum, block_M, block_N, gpu, fold=False,
                          scale=None, fast_exp2=False, lazy=0):
    """One step of the online softmax over a masked, scaled score tile ``acc_s``
    (fp32 base-2 logits, from :func:`mask_scores` / :func:`mask_landmarks` /
    :func:`scale_scores`).

    Updates the running max ``m`` (of the scaled logits), turns ``acc_s`` into
    ``exp2(s - m)``, writes the rescale factor of the old state into ``alpha``
    and updates the running sum ``l``. A row whose max is still ``-inf``
    (nothing visible yet) uses 0 as its reference, so it gets ``p = 0`` and
    ``alpha = 0``, never ``exp(-inf + inf) = NaN``; so does a row whose max is
    ``+inf`` (:func:`finite_or_0`): that score's ``p`` is ``+inf``, ``l`` becomes
    ``+inf`` and the LSE ``+inf``, SPEC's ``log(inf)``, while a NaN score still makes
    ``l`` NaN (the running max skips NaN on the GPU, ``fmaxf``; on the C target it may
    become NaN itself: either way ``l`` carries it).

    ``fold`` (Python bool, baked in) changes only the arithmetic, not the
    result: the row reference is computed once per row (kept in ``m_prev``
    after ``alpha``) instead of a per-element select.

    ``scale`` (baked in as present or not; its value is the kernel's
    ``scale_log2``): ``acc_s`` holds the *raw* masked products (``-inf`` where
    invisible, from the mask macros with ``scale_log2=None``) and the scale
    moves into the exponent, ``exp2(s * scale - m)``, one FMA per score. The
    row max is taken over the raw scores and scaled once per row, equal to the
    max of the scaled scores because ``x -> x * scale`` (rounded) is
    non-decreasing for ``scale > 0``. Valid for a positive, normal fp32
    ``scale`` only (zero or negative would turn ``-inf`` into NaN or ``+inf``):
    the launcher bakes it per call (``launch.scale_fold_ok``).
    ``row_sum`` holds the raw row max until the row sums overwrite it.

    ``fast_exp2`` (baked in): :func:`exp2` with ``fast`` on the GPU (the CPU
    kernel has no such instruction and keeps ``T.exp2``).

    ``lazy`` (session 43, a lab knob: an int ``tau``, 0 = off; baked in): ``m`` is then the
    reference the row's exponentials were taken against, not always the running max. A row
    whose old reference is finite keeps it while the tile's max stays within ``tau`` of it
    (base 2): its ``p`` are at most ``2**tau``, its ``alpha`` is exactly 1 and its output
    needs no rescale (:func:`rescale_output` with ``lazy``). Any other row updates as
    without the knob, so the non-finite cases are unchanged. ``o = acc_o / l`` and the LSE
    ``m + log2 l`` are the same sums taken against another reference (FlashAttention 4's
    conditional rescale).
    """
    loop = _loop(gpu)
    fast = fast_exp2 and gpu
    T.copy(m, m_prev)
    if lazy:
        _tile_max(acc_s, row_sum, block_M, block_N, gpu)
        for i in loop(block_M):
            cand = T.max(m_prev[i], row_sum[i] if scale is None else row_sum[i] * scale)
            m[i] = T.if_then_else(T.And(T.And(_finite(m_prev[i]), _finite(cand)),
                                        cand <= m_prev[i] + float(lazy)), m_prev[i], cand)
    elif scale is None:
        if gpu:
            T.reduce_max(acc_s, m, dim=1, clear=False)
        else:  # thread-local rows: plain loops (T.reduce_* of one row trips a TVM check)
            for i, j in T.grid(block_M, block_N):
                m[i] = T.max(m[i], acc_s[i, j])
    else:
        _tile_max(acc_s, row_sum, block_M, block_N, gpu)
        for i in loop(block_M):
            m[i] = T.max(m[i], row_sum[i] * scale)
    if fold:
        for i in loop(block_M):
            m_ref = finite_or_0(m[i])
            alpha[i] = _alpha(m_prev[i], m[i], m_ref, fast, lazy)
            m_prev[i] = m_ref
        for i, j in loop(block_M, block_N):
            acc_s[i, j] = exp2(_scaled(acc_s[i, j], scale) - m_prev[i], fast)
    else:
        for i in loop(block_M):
            m_ref = finite_or_0(m[i])
            alpha[i] = _alpha(m_prev[i], m[i], m_ref, fast, lazy)
        for i, j in loop(block_M, block_N):
            m_ref = finite_or_0(m[i])
            acc_s[i, j] = exp2(_scaled(acc_s[i, j], scale) - m_ref, fast)
    if gpu:
        T.reduce_sum(acc_s, row_sum, dim=1)
    else:
        T.clear(row_sum)
        for i, j in T.grid(block_M, block_N):
            row_sum[i] = row_sum[i] + acc_s[i, j]
    for i in loop(block_M):
        l[i] = l[i] * alpha[i] + row_sum[i]


def _alpha(m_old, m_new, m_ref, fast, lazy):
    """The rescale factor of a row's old state: ``exp2(m_old - m_ref)``; with ``lazy``
    exactly 1 where a finite reference was kept (:func:`online_softmax_update`), which the
    approximate exponential of 0 need not return, and where a row's max stays ``-inf`` (no
    key seen yet: its ``acc_o`` and ``l`` are 0, or NaN, which 1 keeps as 0 does), so that
    padded and unused rows do not make their warp rescale every tile."""
    a = exp2(m_old - m_ref, fast)
    if lazy:
        a = T.if_then_else(T.And(m_old < T.infinity("float32"), m_new == m_old), 1.0, a)
    return a


@T.macro
def rescale_output(acc_o, alpha, block_M, Dv, gpu, lazy_flag=None):
    """``acc_o[i, :] *= alpha[i]`` before the tile's ``P @ V`` is added. ``lazy_flag`` (a
    local int32 buffer of one element, with :func:`online_softmax_update`'s ``lazy`` on the
    GPU): the multiplies are skipped where no row of the thread's warp has ``alpha != 1``
    (a warp vote, so the branch is uniform; skipping multiplies by 1 changes nothing)."""
    if lazy_flag is None:
        for i, d in _loop(gpu)(block_M, Dv):
            acc_o[i, d] = acc_o[i, d] * alpha[i]
    else:
        lazy_flag[0] = 0
        for i in T.Parallel(block_M):
            lazy_flag[0] = lazy_flag[0] | T.Cast("int32", alpha[i] != 1.0)
        if T.call_extern("int32", "__any_sync", T.uint32(0xFFFFFFFF), lazy_flag[0]) != 0:
            for i, d in T.Parallel(block_M, Dv):
                acc_o[i, d] = acc_o[i, d] * alpha[i]


@T.macro
def softmax_init(acc_o, m, l):
    """Empty online-softmax state: no key seen yet."""
    T.clear(acc_o)
    T.clear(l)
    T.fill(m, -T.infinity("float32"))


@T.macro
def finalize_output(acc_o, l, block_M, Dv, gpu):
    """``o = acc_o / l``; a row with no visible key (``l == 0``) gets ``o = 0``. The
    test is ``l != 0``, not ``l > 0``: a NaN from a key the row sees (SPEC: it
    propagates to the row) must stay NaN, not read as an empty row.

    Written as ``acc_o`` times the reciprocal of ``l`` (1 for an empty row), both
    selects outside the division: every element of a row then holds the same
    division expression, which the compiler keeps once per row, and a multiply per
    element. A division per element compiled to ``MUFU.RCP``, ``FCHK`` and a call to
    the slow path each (1111 instructions for a 64 x 128 tile, a third of the D=128
    prefill consumers' sampled warp time; Nsight Compute at d4faf39). Precision: the
    division rounded once (half an ulp); the reciprocal and the product round once
    each, so ``o`` is within about one ulp of the exact quotient, far inside the
    conformance bound (fp32's floor is 32 ulps)."""
    for i, d in _loop(gpu)(block_M, Dv):
        acc_o[i, d] = (T.if_then_else(l[i] != 0, acc_o[i, d], 0.0)
                       * (1.0 / T.if_then_else(l[i] != 0, l[i], 1.0)))


@T.macro
def row_lse2(m_i, l_i):
    """Base-2 LSE of a finished row: ``m + log2 l`` (``m`` is the running max of the
    base-2 logits); ``-inf`` when the row saw no key (``l == 0``; NaN stays NaN, as
    in :func:`finalize_output`); ``+inf`` when it saw a score of ``+inf`` and no NaN
    (``m = l = +inf``, :func:`online_softmax_update`: SPEC's ``log(inf)``). What a split-KV
    partial keeps (the combine works in base 2); the public LSE is :func:`row_lse`."""
    return T.if_then_else(l_i != 0, m_i + T.log2(l_i), -T.infinity("float32"))


@T.macro
def row_lse(m_i, l_i):
    """Natural-log LSE of a finished row: :func:`row_lse2` times ``ln 2`` (``-inf``
    and NaN stay as they are)."""
    return row_lse2(m_i, l_i) * LN2


@T.macro
def key_kept(k_first, j, hi, r, chunk_size, inv_chunk, mask_lmk, lmk_cols=0, j0=None):
    """Whether the key in row ``j`` of the tile whose row 0 is key index
    ``k_first`` is loaded at all: inside the block's key range (``k_first + j <
    hi``) and not a landmark (when ``mask_lmk``; ``lmk_cols`` as in
    :func:`tile_landmark`, ``j0`` from :func:`tile_landmark_start`). Keys that
    fail this are seen by no query of the block; they are zero-filled on load so
    a NaN there cannot turn ``0 * NaN`` into NaN in ``P @ V``."""
    ok = k_first + j < hi
    if mask_lmk:
        ok = T.And(ok, T.Not(tile_landmark(k_first, j, r, chunk_size, inv_chunk, lmk_cols, j0)))
    return ok
