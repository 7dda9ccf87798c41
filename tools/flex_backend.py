"""FlexAttention backend: the SPEC operator as a ``mask_mod`` for PyTorch's
``torch.nn.attention.flex_attention``.

The project's worked example of a port (``docs/porting.md`` walks through it)
and the peer of the Triton and TileLang kernels in ``hils-swa bench``. Registered
as the optional backend ``flex`` (``hils-swa conform --backend flex``).

What the adapter owns, and how this one does it:

* **Validation**: ``reference.check_inputs`` first, so bad input raises the
  SPEC ``ValueError`` before anything runs.
* **The rule**: the ``mask_mod`` calls :func:`reference.mask.visible` on the
  index tensors flex hands it (``q_idx``, ``kv_idx`` shifted to absolute
  positions). ``visible`` broadcasts on tensors and floors with
  ``torch.div(..., rounding_mode="floor")``, so the same code runs under flex's
  vmap (eager, and ``create_block_mask``) and inside the compiled kernel; there
  is no second copy of the rule here.
* **Layout**: flex takes and returns ``(B, H, L, D)``, the canonical layout.
  It accepts any strides; recent versions return ``o`` in the query's stride
  order, so ``o`` is made contiguous (a copy only when the input was
  ``(B, L, H, D)``-strided).
* **LSE base**: ``flex_attention(..., return_aux=AuxRequest(lse=True))`` (torch
  >= 2.9; older versions: ``return_lse=True``) returns the natural-log LSE: the
  kernel keeps base-2 statistics and the public function multiplies by ln 2
  (``_finalize_outputs(..., stats_are_log2=...)`` in torch 2.11 and 2.13).
  Nothing to convert; the conformance suite checks it.
* **GQA**: ``enable_gqa=True`` (query head ``h`` reads key/value head ``h // G``).
* **Empty rows**: flex writes ``o = 0`` and ``lse = -inf`` for rows with no
  visible key; the adapter makes sure (``torch.where``) so a version change
  cannot leak NaN.
* **NaN safety**: invisible scores are ``-inf`` before the softmax, so a NaN
  *key* in an invisible slot is harmless; a NaN *value* is not (``0 * NaN``
  in ``P @ V``). The adapter therefore (1) drops the key prefix no query can
  reach (``reference.visible_key_range``: this also makes decode over a long
  cache cost only its window) and (2) zeroes the values of landmark slots when
  ``mask_lmk`` (in the remaining range those are the only slots no query sees).
  (2) is one pass over the reachable part of V; it is part of the backend's
  cost in the benchmark.
* **Compilation**: on CUDA the call runs ``torch.compile(flex_attention)``;
  on CPU it runs flex's eager path (it materialises the score matrix: fine for
  tests, not for speed). The window, chunk and flags are Python constants of
  the ``mask_mod`` (a new value recompiles once); the two offsets (absolute
  positions of query 0 and of the first key passed) are captured as 0-d int64
  device tensors cached per value: dynamo lifts them to graph inputs (checked
  with ``backend="aot_eager"`` on CPU: three different ``kv_start`` of one
  shape give one graph), so a new offset is not a recompile, and no
  host-to-device copy happens per call (CUDA-graph capturable after warm-up).
  Sizes change with the call (and with the dropped key prefix): ``DYNAMIC``
  (default None) leaves torch's automatic dynamic shapes on, so a new size
  costs one recompile with symbolic sizes and then none. The block mask is
  cached per (shape, rule, offsets). ``torch._dynamo``'s recompile limit is
  raised to 64 on first use and ``fail_on_recompile_limit_hit`` set, so a
  benchmark's shape suite never silently falls back to the unfused eager path.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable

import torch

from reference import UnsupportedConfig, check_inputs, visible, visible_key_range
from reference.mask import is_landmark, key_positions

__all__ = ["sliding_window_attention", "make_mask_mod", "clear_caches"]

#: ``dynamic`` of ``torch.compile``: None = torch's automatic dynamic shapes (the
#: first shape compiles static, a second distinct shape recompiles once with
#: symbolic sizes, later shapes reuse it; Lq = 1 decode specialises once).
#: ``hils-swa bench --flex-static`` sets False: one static compile per shape.
DYNAMIC: bool | None = None

_OFFSETS: dict[tuple[str, int], torch.Tensor] = {}
_BLOCK_MASKS: dict[tuple, object] = {}
_COMPILED: dict[str, Callable] = {}


def _flex():
    try:
        from torch.nn.attention import flex_attention as fa
    except ImportError as e:  # torch < 2.5
        raise UnsupportedConfig(f"flex: torch {torch.__version__} has no flex_attention ({e})") from e
    return fa


def clear_caches() -> None:
    """Forget cached offset tensors, block masks and compiled functions."""
    _OFFSETS.clear()
    _BLOCK_MASKS.clear()
    _COMPILED.clear()


def _offset(value: int, device: torch.device) -> torch.Tensor:
    key = (str(device), int(value))
    t = _OFFSETS.get(key)
    if t is None:
        t = torch.tensor(int(value), dtype=torch.int64, device=device)
        _OFFSETS[key] = t
    return t


def make_mask_mod(*, window_size: int, chunk_size: int, mask_lmk: bool, expand_to_chunk: bool,
                  q_pos0, k_pos0):
    """A flex ``mask_mod(b, h, q_idx, kv_idx)`` for one call.

    ``q_pos0`` / ``k_pos0``: absolute positions of query 0 and key 0 (ints or
    0-d int64 tensors). The rule itself is :func:`reference.mask.visible`.
    """

    def mask_mod(b, h, q_idx, kv_idx):
        return visible(q_idx + q_pos0, kv_idx + k_pos0, window_size=window_size,
                       chunk_size=chunk_size, mask_lmk=mask_lmk, expand_to_chunk=expand_to_chunk)

    return mask_mod


def _compiled_flex(device: torch.device) -> Callable:
    fa = _flex()
    if device.type == "cpu":
        return fa.flex_attention
    key = f"{device.type}:{DYNAMIC}"
    fn = _COMPILED.get(key)
    if fn is None:
        try:
            import torch._dynamo.config as dcfg

            for name in ("recompile_limit", "cache_size_limit"):
                if hasattr(dcfg, name):
                    setattr(dcfg, name, max(int(getattr(dcfg, name)), 64))
            if hasattr(dcfg, "fail_on_recompile_limit_hit"):
                # past the limit dynamo would run flex unfused (eager): fail loudly instead
                dcfg.fail_on_recompile_limit_hit = True
            if hasattr(dcfg, "accumulated_recompile_limit"):
                dcfg.accumulated_recompile_limit = max(int(dcfg.accumulated_recompile_limit), 4096)
            elif hasattr(dcfg, "accumulated_cache_size_limit"):
                dcfg.accumulated_cache_size_limit = max(int(dcfg.accumulated_cache_size_limit), 4096)
        except Exception:  # config layout differs: keep torch's defaults
            pass
        fn = torch.compile(fa.flex_attention, dynamic=DYNAMIC)
        _COMPILED[key] = fn
    return fn


def _block_mask(p, Lk_eff: int, kv0: int, device):
    fa = _flex()
    q_pos0 = p.q_offset                         # absolute position of query 0
    k_pos0 = p.kv_start + kv0                   # absolute position of the first key passed
    key = (str(device), p.Lq, Lk_eff, p.window_size, p.chunk_size, p.mask_lmk, p.expand_to_chunk,
           q_pos0, k_pos0)
    bm = _BLOCK_MASKS.get(key)
    if bm is None:
        mask_mod = make_mask_mod(window_size=p.window_size, chunk_size=p.chunk_size, mask_lmk=p.mask_lmk,
                                 expand_to_chunk=p.expand_to_chunk, q_pos0=_offset(q_pos0, device),
                                 k_pos0=_offset(k_pos0, device))
        # B=None, H=None: the mask does not depend on batch or head.
        bm = fa.create_block_mask(mask_mod, None, None, p.Lq, Lk_eff, device=device)
        if len(_BLOCK_MASKS) > 256:
            _BLOCK_MASKS.clear()
        _BLOCK_MASKS[key] = bm
    return bm


def _call_flex(fn, q, k, v, bm, scale, gqa):
    fa = _flex()
    with warnings.catch_warnings():
        # The eager (CPU) path warns that it is unfused on every first call: known, by design here.
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        if hasattr(fa, "AuxRequest"):
            o, aux = fn(q, k, v, block_mask=bm, scale=scale, enable_gqa=gqa,
                        return_aux=fa.AuxRequest(lse=True))
            return o, aux.lse
        return fn(q, k, v, block_mask=bm, scale=scale, enable_gqa=gqa, return_lse=True)


def sliding_window_attention(q, k, v, *, window_size, chunk_size, mask_lmk=True, expand_to_chunk=True,
                             kv_start=0, sm_scale=None):
    """HiLS sliding-window attention (SPEC.md) through FlexAttention.

    Canonical interface: ``q (B, Hq, Lq, Dqk)``, ``k (B, Hkv, Lk, Dqk)``,
    ``v (B, Hkv, Lk, Dv)`` -> ``o (B, Hq, Lq, Dv)`` in ``q.dtype`` (contiguous),
    ``lse (B, Hq, Lq)`` fp32, natural log. Compiled on CUDA, eager on CPU.
    """
    p = check_inputs(q, k, v, window_size=window_size, chunk_size=chunk_size, mask_lmk=mask_lmk,
                     expand_to_chunk=expand_to_chunk, kv_start=kv_start, sm_scale=sm_scale)
    p = p.int64_framed()  # positions as int64 tensors: a call past them runs as its small twin
    if p.empty:  # otherwise Lq >= 1, so Lk >= 1 and Hkv >= 1
        o, lse = p.new_outputs()
        o.zero_()
        lse.fill_(float("-inf"))
        return o, lse
    if p.device.type == "cuda" and (p.Dqk < 16 or p.Dv < 16):
        raise UnsupportedConfig(f"flex: head dims below 16 are not served on CUDA (Dqk={p.Dqk}, Dv={p.Dv})")
    if p.device.type not in ("cuda", "cpu"):
        raise UnsupportedConfig(f"flex: device {p.device} is not supported (cuda or cpu)")

    # Keys left of query 0's window are seen by no query: drop them (exact, and
    # it is what makes decode over a long cache cheap).
    j_lo, j_hi = visible_key_range(0, p.Lq, Lq=p.Lq, Lk=p.Lk, window_size=p.window_size,
                                   chunk_size=p.chunk_size, expand_to_chunk=p.expand_to_chunk,
                                   kv_start=p.kv_start)
    # j_hi == Lk always (the last query sits on the last key); j_lo < j_hi.
    ks, vs = k[:, :, j_lo:], v[:, :, j_lo:]
    Lk_eff = p.Lk - j_lo
    if p.mask_lmk:
        # Landmark slots are seen by no query: zero their values so a NaN
        # there cannot leak through 0 * NaN in P @ V.
        lmk = is_landmark(key_positions(Lk_eff, p.kv_start + j_lo, device=p.device), chunk_size=p.chunk_size)
        vs = torch.where(lmk[:, None], torch.zeros((), dtype=v.dtype, device=v.device), vs)

    bm = _block_mask(p, Lk_eff, j_lo, p.device)
    fn = _compiled_flex(p.device)
    o, lse = _call_flex(fn, q, ks, vs, bm, p.sm_scale, p.Hq != p.Hkv)
    lse = lse.float()
    empty = _rows_empty(p)
    if empty is not None:
        # Rows with no visible key (known in closed form, no device sync):
        # o = 0 and lse = -inf whatever this torch version writes there.
        o = torch.where(empty[:, None], torch.zeros((), dtype=o.dtype, device=o.device), o)
        lse = torch.where(empty, torch.full((), float("-inf"), device=lse.device), lse)
    return o.to(p.dtype).contiguous(), lse.contiguous()


@functools.lru_cache(maxsize=256)
def _empty_rows_cached(Lq, Lk, window_size, chunk_size, mask_lmk, expand_to_chunk, kv_start, device):
    from reference import visible_counts

    empty = visible_counts(Lq, Lk, window_size=window_size, chunk_size=chunk_size, mask_lmk=mask_lmk,
                           expand_to_chunk=expand_to_chunk, kv_start=kv_start) == 0
    # Moved to the device once per configuration: no host-to-device copy per call.
    return empty.to(device) if bool(empty.any()) else None


def _rows_empty(p):
    """(Lq,) bool tensor on the call's device of the rows with no visible key,
    or None when there is none."""
    return _empty_rows_cached(p.Lq, p.Lk, p.window_size, p.chunk_size, p.mask_lmk, p.expand_to_chunk,
                              p.kv_start, p.device)
