"""Public adapter of the Triton backend: the canonical interface of SPEC.md."""

from __future__ import annotations

from reference.device import GRID_YZ_MAX, device_type
from reference.errors import UnsupportedConfig
from reference.validation import check_f32_score_scale, check_inputs

from . import launch as _launch

__all__ = ["sliding_window_attention", "UnsupportedConfig", "MIN_HEAD_DIM", "MAX_HEAD_DIM"]

MIN_HEAD_DIM = 32
MAX_HEAD_DIM = 256


def _check_supported(p) -> None:
    for name, d in (("Dqk", p.Dqk), ("Dv", p.Dv)):
        if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
            raise UnsupportedConfig(
                f"triton: head dim {name}={d} is not supported ({MIN_HEAD_DIM}..{MAX_HEAD_DIM})")
    check_f32_score_scale(p.sm_scale, "triton")
    if p.Hq > GRID_YZ_MAX:
        raise UnsupportedConfig(f"triton: Hq={p.Hq} query heads are not supported (at most "
                                f"{GRID_YZ_MAX}: one launch grid's y extent holds a batch's heads)")
    kind = device_type(p.device)
    if kind == "cpu":
        if not _launch.interpreter_active():
            raise UnsupportedConfig(
                "triton: CPU tensors need the Triton interpreter; set TRITON_INTERPRET=1 "
                "before triton_impl (and triton) are first imported, or pass CUDA tensors")
    elif kind != "cuda":
        raise UnsupportedConfig(f"triton: device type {kind!r} is not supported (cuda, "
                                "or cpu under TRITON_INTERPRET=1)")


def _problem(q, k, v, window_size, chunk_size, mask_lmk, expand_to_chunk, kv_start, sm_scale):
    """The call's :class:`reference.validation.Problem` after every check that comes
    before a kernel: SPEC errors, then, unless the output is empty (no kernel
    runs), :func:`_check_supported`."""
    p = check_inputs(q, k, v, window_size=window_size, chunk_size=chunk_size, mask_lmk=mask_lmk,
                     expand_to_chunk=expand_to_chunk, kv_start=kv_start, sm_scale=sm_scale)
    if not p.empty:
        _check_supported(p)
    return p


def describe_call(q, k, v, *, window_size, chunk_size, mask_lmk=True, expand_to_chunk=True,
                  kv_start=0, sm_scale=None, **knobs) -> str:
    """What :func:`sliding_window_attention` runs for these arguments, in one line
    (``launch.describe``: kernel, tile, warps, stages, splits); plans only, launches
    nothing. Raises what the call would raise before its kernels."""
    p = _problem(q, k, v, window_size, chunk_size, mask_lmk, expand_to_chunk, kv_start, sm_scale)
    if p.empty:
        return "no kernel (empty output)"
    return _launch.describe(p, q, k, v, **knobs)


def sliding_window_attention(q, k, v, *, window_size, chunk_size, mask_lmk=True,
                             expand_to_chunk=True, kv_start=0, sm_scale=None,
                             _force_path=None, _config=None, _num_splits=None, _phases=None,
                             _tma=None, _fold=None, _pdl=None):
    """HiLS sliding-window attention forward (SPEC.md), Triton kernels.

    Returns ``(o, lse)``: ``o`` of shape ``(B, Hq, Lq, Dv)`` in ``q.dtype``,
    contiguous; ``lse`` of shape ``(B, Hq, Lq)``, fp32, natural log. Inputs may
    have any strides (``x.transpose(1, 2)`` of a ``(B, L, H, D)`` tensor is read
    in place). fp32 inputs are computed with exact fp32 products
    (``input_precision="ieee"``, no tf32).

    Raises ``ValueError`` for invalid input (``reference.check_inputs``) and
    ``UnsupportedConfig`` for head dims outside 32..256, ``|sm_scale| >
    2.3586e38`` (the score scale ``sm_scale * log2(e)`` is float32), more than
    65535 query heads, devices other than CUDA, or CPU tensors without
    ``TRITON_INTERPRET=1``. Calls whose ``B * Hq`` passes 65535 (a launch grid's y
    extent) run as launches over slices of the batch. Scores are float32: a score
    ``sm_scale * <q_i, k_j>`` beyond the float32 range overflows as float32
    does (data-dependent, not checked). The keyword arguments starting with ``_`` are
    private test/tuning knobs (``"prefill"`` / ``"packed"`` / ``"splitkv"`` path, a
    ``launch.Config``, a split count, the prefill loop structure, the TMA
    prefill mode, the scale folded into the exponent, the split-KV combine's
    programmatic dependent launch), not part of the interface.
    """
    p = _problem(q, k, v, window_size, chunk_size, mask_lmk, expand_to_chunk, kv_start, sm_scale)
    if p.empty:
        return p.new_outputs()
    o, lse = p.new_outputs()  # not empty: Lq >= 1, so Lk >= 1 and Hkv >= 1
    _launch.launch(p, q, k, v, o, lse, path=_force_path, config=_config, num_splits=_num_splits,
                   phases=_phases, tma=_tma, fold=_fold, pdl=_pdl)
    return o, lse
