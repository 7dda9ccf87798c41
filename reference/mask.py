"""The visibility rule of SPEC.md, written once.

Every module of the project that needs to know whether query ``i`` sees key
``j`` imports it from here; nobody keeps a second copy. Kernels implement the
same rule in their own language, and the conformance suite checks them against
these functions.

Positions are absolute::

    qpos(i) = kv_start + (Lk - Lq) + i          i in [0, Lq)
    kpos(j) = kv_start + j                       j in [0, Lk)

    left(i) = qpos(i) - window_size + 1
    if expand_to_chunk:
        left(i) = floor(left(i) / chunk_size) * chunk_size   # floor, not truncation

    visible(i, j) = left(i) <= kpos(j) <= qpos(i)
                    and (not mask_lmk or (kpos(j) + 1) % chunk_size != 0)

Every function accepts Python ints or integer ``torch.Tensor`` s (which
broadcast), and uses floor division in both cases. Python ints are exact at any
size; int64 tensors are not, so the functions that take a whole call
(:func:`visibility_mask`, :func:`seen_keys`, :func:`visible_counts`, the reference's
attention) compute a call whose values would overflow int64 in :func:`small_frame`'s
equivalent one (SPEC bounds neither ``kv_start`` nor the window nor the chunk).
"""

from __future__ import annotations

import torch

__all__ = [
    "query_positions",
    "key_positions",
    "window_left",
    "is_landmark",
    "visible",
    "visibility_mask",
    "visible_key_range",
    "seen_keys",
    "render_mask",
    "visible_counts",
    "small_frame",
    "int64_frame",
    "RULE_KEYS",
    "rule_kwargs",
]

#: The keyword arguments of the canonical call that the visibility rule reads
#: (``sm_scale`` is the call's other keyword; it changes scores, not visibility).
RULE_KEYS = ("window_size", "chunk_size", "mask_lmk", "expand_to_chunk", "kv_start")


def rule_kwargs(kwargs: dict) -> dict:
    """The visibility rule's part of a canonical call's keyword arguments (the
    :data:`RULE_KEYS` present), for the functions of this module. ``TypeError`` for a
    key that is neither a rule key nor ``sm_scale`` (a misspelling is not dropped)."""
    unknown = sorted(set(kwargs) - set(RULE_KEYS) - {"sm_scale"})
    if unknown:
        raise TypeError(f"not keyword arguments of the canonical call: {unknown}")
    return {n: kwargs[n] for n in RULE_KEYS if n in kwargs}


#: Calls whose ``kv_start + Lk + window_size + 2 * chunk_size`` stays below this compute
#: the rule on their own int64 positions; larger ones (SPEC bounds none of these values)
#: through :func:`small_frame`, whose values are small (:func:`int64_frame`).
INT64_EXACT = 2 ** 62


def _positions(first: int, n: int, device) -> torch.Tensor:
    if first + n > 2 ** 63:  # torch would raise its own overflow error, naming nothing
        raise OverflowError(f"positions up to {first + n - 1} do not fit int64: compute "
                            "the call in reference.mask.small_frame(...)'s positions")
    # arange's exclusive end would be 2**63 for a last position of 2**63 - 1: add instead
    return torch.arange(n, dtype=torch.int64, device=device) + first


def query_positions(Lq: int, Lk: int, kv_start: int = 0, device=None) -> torch.Tensor:
    """Absolute positions of the ``Lq`` queries: the last ``Lq`` of the key range
    (int64: ``OverflowError`` past ``2**63 - 1``, see :func:`small_frame`)."""
    return _positions(kv_start + Lk - Lq, Lq, device)


def key_positions(Lk: int, kv_start: int = 0, device=None) -> torch.Tensor:
    """Absolute positions of the ``Lk`` keys (int64, as :func:`query_positions`)."""
    return _positions(kv_start, Lk, device)


def small_frame(Lk: int, *, window_size: int, chunk_size: int, kv_start: int = 0,
                shift_boundary: bool = True) -> tuple[int, int, int]:
    """``(kv_start, window_size, chunk_size)`` of a call with exactly this call's
    visibility (the same ``(Lq, Lk)`` mask, with either flag) and small values, for code
    that computes positions in fixed-width integers: this module where a call's own values
    would overflow int64 (:data:`INT64_EXACT`), every value then at most ``2 * Lk + 1``
    (``kv_start < chunk_size <= Lk + 1``, ``window_size <= Lk + chunk_size``), and the
    kernels (``Problem.kernel_frame``: ``shift_boundary=False`` by default, which leaves a
    chunk boundary that falls inside the cache where it is, so a chunk longer than the
    cache stays as long there; a backend asks for the shift only where its positions
    would not fit without it: Triton's past int64, TileLang's past 2**22).

    - ``r = kv_start mod chunk_size``: the rule reads positions only through
      differences and modulo ``chunk_size`` (the floor of the expanded edge, the
      landmark test), so shifting every position by the chunk multiple
      ``kv_start - r`` changes nothing.
    - When the chunk is longer than every relative position
      (``chunk_size > r + Lk``), no landmark falls on a key and every expanded left
      edge floors to 0 or below (all keys from index 0), while unexpanded edges do
      not depend on ``r``: ``r = 0, C = Lk + 1`` gives the same visibility.
    - With ``shift_boundary``, a chunk longer than ``Lk + 1`` whose boundary falls inside
      the cache (``t = C - r <= Lk`` keys before it) becomes ``C = Lk + 1`` with
      ``r = C - t``: the one boundary and the one landmark before it stay at the same
      key indices, no other one reaches the cache, and an expanded edge floors to that
      boundary exactly when ``x - window_size + 1 >= t`` in both, ``x = Lk - Lq + i`` the
      query's key index (to key 0 or left of it otherwise).
    - ``W = min(window_size, Lk + C)``: a wider window already reaches left of key 0
      for every query, expanded or not.

    Checked against the rule evaluated on Python ints (exact at any size) by
    ``tests/test_reference_mask.py``.
    """
    return _frame(Lk, window_size, chunk_size, kv_start, shift_boundary)


def _frame(Lk: int, window_size: int, c: int, kv_start: int, shift_boundary: bool) -> tuple[int, int, int]:
    """:func:`small_frame` with positional arguments: ``Problem.kernel_frame`` calls it on
    every kernel launch (keywords cost about 0.1 us more a call)."""
    r = kv_start % c
    if c > r + Lk:
        r, c = 0, Lk + 1
    elif shift_boundary and c > Lk + 1:
        r, c = Lk + 1 - (c - r), Lk + 1
    return r, min(window_size, Lk + c), c


def int64_frame(Lk: int, window_size: int, chunk_size: int, kv_start: int) -> tuple[int, int, int]:
    """The call's own ``(kv_start, window_size, chunk_size)`` where int64 arithmetic on its
    positions is exact (every intermediate of the rule stays below :data:`INT64_EXACT`
    in magnitude), :func:`small_frame` where it would not be."""
    if kv_start + Lk + window_size + 2 * chunk_size < INT64_EXACT:
        return kv_start, window_size, chunk_size
    return _frame(Lk, window_size, chunk_size, kv_start, True)


def _floor_div(a, b: int):
    if isinstance(a, torch.Tensor):
        return torch.div(a, b, rounding_mode="floor")
    return a // b  # Python ints: floor division already


def window_left(qpos, *, window_size: int, chunk_size: int, expand_to_chunk: bool = True):
    """Left edge (inclusive, absolute position) of the window of a query at ``qpos``.

    May be negative: the key range clips it, this function does not.
    """
    left = qpos - window_size + 1
    if expand_to_chunk:
        left = _floor_div(left, chunk_size) * chunk_size
    return left


def is_landmark(kpos, *, chunk_size: int):
    """True where the key at absolute position ``kpos`` closes a chunk."""
    return (kpos + 1) % chunk_size == 0


def visible(
    qpos,
    kpos,
    *,
    window_size: int,
    chunk_size: int,
    mask_lmk: bool = True,
    expand_to_chunk: bool = True,
):
    """Whether a query at absolute ``qpos`` sees a key at absolute ``kpos``.

    Broadcasts like ``qpos <= kpos``; pass ``qpos[:, None]`` and ``kpos[None, :]``
    for a ``(Lq, Lk)`` mask.
    """
    left = window_left(qpos, window_size=window_size, chunk_size=chunk_size,
                       expand_to_chunk=expand_to_chunk)
    ok = (left <= kpos) & (kpos <= qpos)
    if mask_lmk:
        lmk = is_landmark(kpos, chunk_size=chunk_size)
        if isinstance(ok, bool) and isinstance(lmk, bool):
            ok = ok and not lmk
        else:
            ok = ok & ~torch.as_tensor(lmk)
    return ok


def visibility_mask(
    Lq: int,
    Lk: int,
    *,
    window_size: int,
    chunk_size: int,
    mask_lmk: bool = True,
    expand_to_chunk: bool = True,
    kv_start: int = 0,
    device=None,
) -> torch.Tensor:
    """The ``(Lq, Lk)`` boolean mask of a call; ``mask[i, j]`` is True when
    query ``i`` sees key ``j``. Quadratic in size: for tests, tools and small
    problems, never for the reference's own computation."""
    kv_start, window_size, chunk_size = int64_frame(Lk, window_size, chunk_size, kv_start)
    qpos = query_positions(Lq, Lk, kv_start, device)
    kpos = key_positions(Lk, kv_start, device)
    return visible(qpos[:, None], kpos[None, :], window_size=window_size,
                   chunk_size=chunk_size, mask_lmk=mask_lmk,
                   expand_to_chunk=expand_to_chunk)


def visible_key_range(
    i0: int,
    i1: int,
    *,
    Lq: int,
    Lk: int,
    window_size: int,
    chunk_size: int,
    expand_to_chunk: bool = True,
    kv_start: int = 0,
) -> tuple[int, int]:
    """Key indices ``[j_lo, j_hi)`` that can hold a visible key of any query in
    ``[i0, i1)``; empty (``j_lo >= j_hi``) when no key can be visible.

    ``left`` is non-decreasing in ``qpos``, so the range runs from the left edge
    of query ``i0`` to query ``i1 - 1`` itself, clipped to the key range.
    Landmarks inside the range are still masked by :func:`visible`.
    """
    if i0 >= i1:
        return 0, 0
    offset = kv_start + Lk - Lq
    left = window_left(offset + i0, window_size=window_size, chunk_size=chunk_size,
                       expand_to_chunk=expand_to_chunk)
    j_lo = max(0, left - kv_start)
    j_hi = min(Lk, offset + i1 - 1 - kv_start + 1)
    return j_lo, max(j_lo, j_hi)


def seen_keys(
    Lq: int,
    Lk: int,
    *,
    window_size: int,
    chunk_size: int,
    mask_lmk: bool = True,
    expand_to_chunk: bool = True,
    kv_start: int = 0,
    device=None,
    block: int = 4096,
) -> torch.Tensor:
    """``(Lk,)`` bool: the keys some query of the call sees, ``visibility_mask(...).any(0)``.

    Computed by blocks of ``block`` queries, each over the key range
    :func:`visible_key_range` says it can reach, so memory stays linear for long
    caches. Its complement is what SPEC.md lets hold any value (NaN included):
    keys left of every window, and landmarks with ``mask_lmk``.
    """
    seen = torch.zeros(Lk, dtype=torch.bool, device=device)
    kv_start, window_size, chunk_size = int64_frame(Lk, window_size, chunk_size, kv_start)
    qpos = query_positions(Lq, Lk, kv_start, device)
    kpos = key_positions(Lk, kv_start, device)
    for i0 in range(0, Lq, block):
        i1 = min(Lq, i0 + block)
        j0, j1 = visible_key_range(i0, i1, Lq=Lq, Lk=Lk, window_size=window_size,
                                   chunk_size=chunk_size, expand_to_chunk=expand_to_chunk,
                                   kv_start=kv_start)
        if j0 < j1:
            vis = visible(qpos[i0:i1, None], kpos[None, j0:j1], window_size=window_size,
                          chunk_size=chunk_size, mask_lmk=mask_lmk, expand_to_chunk=expand_to_chunk)
            seen[j0:j1] |= vis.any(dim=0)
    return seen


def visible_counts(
    Lq: int,
    Lk: int,
    *,
    window_size: int,
    chunk_size: int,
    mask_lmk: bool = True,
    expand_to_chunk: bool = True,
    kv_start: int = 0,
    device=None,
) -> torch.Tensor:
    """Number of visible keys of every query, ``(Lq,)`` int64, in closed form.

    Linear in ``Lq`` (no mask is built): the window ``[max(left, kv_start), qpos]``
    minus the landmarks inside it, ``floor((b + 1) / C) - floor(a / C)`` for a
    range ``[a, b]``. Benchmarks count FLOPs over these visible pairs; tests
    check it against :func:`visibility_mask`.
    """
    kv_start, window_size, chunk_size = int64_frame(Lk, window_size, chunk_size, kv_start)
    qpos = query_positions(Lq, Lk, kv_start, device)
    lo = torch.clamp(window_left(qpos, window_size=window_size, chunk_size=chunk_size,
                                 expand_to_chunk=expand_to_chunk), min=kv_start)
    n = torch.clamp(qpos - lo + 1, min=0)
    if mask_lmk:
        lmk = _floor_div(qpos + 1, chunk_size) - _floor_div(lo, chunk_size)
        n = n - torch.where(n > 0, lmk, torch.zeros_like(lmk))
    return n


def render_mask(mask: torch.Tensor, *, window: torch.Tensor | None = None,
                on: str = "#", off: str = ".", landmark: str = "L") -> str:
    """ASCII picture of a boolean ``(Lq, Lk)`` mask, one query per line.

    ``window`` (optional) is the same call's mask with ``mask_lmk=False``:
    cells inside the window that the landmark rule hides are then drawn as
    ``landmark``, so the picture shows why they are empty.
    """
    mask = torch.as_tensor(mask).to("cpu", torch.bool)
    hidden = None
    if window is not None:
        hidden = torch.as_tensor(window).to("cpu", torch.bool) & ~mask
    lines = []
    for i, row in enumerate(mask.tolist()):
        chars = []
        for j, seen in enumerate(row):
            if seen:
                chars.append(on)
            elif hidden is not None and bool(hidden[i, j]):
                chars.append(landmark)
            else:
                chars.append(off)
        lines.append("".join(chars))
    return "\n".join(lines)
