"""The Triton backend with its TMA prefill kernel forced, for the conformance suite.

The public :func:`triton_impl.sliding_window_attention` takes the TMA kernel
only for long prefills (``launch.PREFILL_TMA``, ``launch.TMA_MIN_WAVES``), so
the suite's cases, which are small, would rarely reach it. This module exposes
the same canonical function with the prefill path and the TMA kernel forced for
every call, as the tables ship it (K by TMA; V by pointers, and the blocks inside
every window through the chunked view where the call allows it, at D <= 64 and
since session 28 D = 128, ``launch.TMA_V_CHUNK``), registered as the optional backend
``triton-tma`` (``hils-swa conform --backend triton-tma``). Calls the TMA
kernel cannot serve (fp32, strides the copy engine refuses, CPU tensors
without the interpreter, and under it bf16: the kernel has no upcast path)
raise :class:`UnsupportedConfig` instead of silently running another kernel;
under ``TRITON_INTERPRET=1`` fp16 CPU calls run the kernel itself.
"""

from __future__ import annotations

from .api import UnsupportedConfig
from .api import describe_call as _describe
from .api import sliding_window_attention as _swa

__all__ = ["sliding_window_attention", "describe_call", "UnsupportedConfig"]


def sliding_window_attention(q, k, v, *, window_size, chunk_size, mask_lmk=True,
                             expand_to_chunk=True, kv_start=0, sm_scale=None):
    """:func:`triton_impl.sliding_window_attention` through the TMA prefill kernel only."""
    return _swa(q, k, v, window_size=window_size, chunk_size=chunk_size, mask_lmk=mask_lmk,
                expand_to_chunk=expand_to_chunk, kv_start=kv_start, sm_scale=sm_scale,
                _force_path="prefill", _tma="shipped")


def describe_call(q, k, v, *, window_size, chunk_size, mask_lmk=True, expand_to_chunk=True,
                  kv_start=0, sm_scale=None):
    """What :func:`sliding_window_attention` of this module runs (``api.describe_call``)."""
    return _describe(q, k, v, window_size=window_size, chunk_size=chunk_size, mask_lmk=mask_lmk,
                     expand_to_chunk=expand_to_chunk, kv_start=kv_start, sm_scale=sm_scale,
                     path="prefill", tma="shipped")
