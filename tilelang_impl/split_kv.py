"""The TileLang backend with split-KV forced, for the conformance suite.

The public :func:`tilelang_impl.sliding_window_attention` takes the split-KV
kernels (partials, then :func:`kernels.combine`) only for small grids, and on the
64 x 64 split tile only where a query block reaches ``launch.SPLIT_MIN_TILES`` key
tiles (long-window decode), so the suite's cases, whose windows and caches are
short, would rarely reach them. This module exposes the same canonical function
with split-KV forced for every call that has a split variant (``launch.forced_plan``:
bf16/fp16 on CUDA, the kernels' ``Dv`` in ``launch.SPLIT_DV``, head dims up to 128; a head
dim between multiples of 16 counts as the one the kernels are built for,
``api._kernel_problem``), in
``launch.forced_splits`` splits (at least two, so empty partials occur too), registered as the optional backend ``tilelang-split`` (``hils-swa conform
--backend tilelang-split``). Other calls raise :class:`UnsupportedConfig` instead of
silently running another kernel.
"""

from __future__ import annotations

from . import api, launch
from .api import UnsupportedConfig

__all__ = ["sliding_window_attention", "describe_call", "UnsupportedConfig"]


def _checked(q, k, v, window_size, chunk_size, mask_lmk, expand_to_chunk, kv_start, sm_scale):
    """``(problem, split count)``, the count planned for the call as the kernels take it
    (``api._kernel_problem``: at the kernels' head dims); :class:`UnsupportedConfig`
    where no split variant runs."""
    p = api._problem(q, k, v, window_size, chunk_size, mask_lmk, expand_to_chunk, kv_start,
                     sm_scale)
    if p.empty:
        return p, 0
    S = launch.forced_plan(api._kernel_problem(p)[0]) if p.device.type == "cuda" else None
    if S is None:
        raise UnsupportedConfig(
            "tilelang-split: split-KV runs for bf16/fp16 CUDA tensors with Dv in "
            f"{launch.SPLIT_DV} and head dims up to 128 (got {p.dtype}, {p.device.type}, "
            f"Dqk={p.Dqk}, Dv={p.Dv}; the kernels' {launch.kernel_dims(p)})")
    return p, S


def sliding_window_attention(q, k, v, *, window_size, chunk_size, mask_lmk=True,
                             expand_to_chunk=True, kv_start=0, sm_scale=None):
    """:func:`tilelang_impl.sliding_window_attention` through the split-KV kernels only."""
    p, S = _checked(q, k, v, window_size, chunk_size, mask_lmk, expand_to_chunk, kv_start, sm_scale)
    if p.empty:
        return p.new_outputs()
    return api._run(p, q, k, v, force_split=S)


def describe_call(q, k, v, *, window_size, chunk_size, mask_lmk=True, expand_to_chunk=True,
                  kv_start=0, sm_scale=None) -> str:
    """What :func:`sliding_window_attention` of this module runs (``api.describe_call``)."""
    p, S = _checked(q, k, v, window_size, chunk_size, mask_lmk, expand_to_chunk, kv_start, sm_scale)
    return api._describe(p, q, k, v, force_split=S or None)
