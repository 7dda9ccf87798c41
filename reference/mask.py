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
broadcast), and uses floor division in both cases.
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


def query_positions(Lq: int, Lk: int, kv_start: int = 0, device=None) -> torch.Tensor:
    """Absolute positions of the ``Lq`` queries: the last ``Lq`` of the key range."""
    first = kv_start + Lk - Lq
    return torch.arange(first, first + Lq, dtype=torch.int64, device=device)


def key_positions(Lk: int, kv_start: int = 0, device=None) -> torch.Tensor:
    """Absolute positions of the ``Lk`` keys."""
    return torch.arange(kv_start, kv_start + Lk, dtype=torch.int64, device=device)


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
