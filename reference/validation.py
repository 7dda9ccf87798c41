"""One input validation for every backend (SPEC.md, "Errors").

Every backend's public ``sliding_window_attention`` calls :func:`check_inputs`
first, so bad input raises the same ``ValueError`` (naming the argument and the
rule) everywhere, before any kernel runs. The returned :class:`Problem` carries
the sizes and the resolved scalars the launchers need.
"""

from __future__ import annotations

import math
import operator
import dataclasses
from dataclasses import dataclass

import torch

from .errors import UnsupportedConfig
from .mask import _frame, int64_frame

__all__ = ["CANONICAL_DTYPES", "LOG2E", "Problem", "check_f32_score_scale", "check_inputs", "default_scale",
           "positive_normal_f32"]

#: dtypes of the canonical interface (SPEC.md).
CANONICAL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class Problem:
    """Sizes and resolved parameters of one valid call."""

    B: int
    Hq: int
    Hkv: int
    Lq: int
    Lk: int
    Dqk: int
    Dv: int
    dtype: torch.dtype
    device: torch.device
    window_size: int
    chunk_size: int
    mask_lmk: bool
    expand_to_chunk: bool
    kv_start: int
    sm_scale: float

    @classmethod
    def _fast(cls, **fields) -> "Problem":
        """The instance ``cls(**fields)`` builds, without the frozen dataclass's
        per-field ``object.__setattr__`` (1.5 of check_inputs' 3.8 us on the CI
        machine, every call). Every field must be given (checked by count: the one
        caller names each field)."""
        if len(fields) != len(cls.__dataclass_fields__):
            raise TypeError(f"Problem fields: need {sorted(cls.__dataclass_fields__)}, got {sorted(fields)}")
        self = object.__new__(cls)
        self.__dict__.update(fields)
        return self

    @property
    def group(self) -> int:
        """Query heads per key/value head (``Hq // Hkv``)."""
        return self.Hq // self.Hkv if self.Hkv else 0

    @property
    def q_offset(self) -> int:
        """Absolute position of query 0: ``kv_start + Lk - Lq``."""
        return self.kv_start + self.Lk - self.Lq

    def kernel_frame(self, shift_boundary: bool = False) -> tuple[int, int, int]:
        """``(r, W, C)``: a ``kv_start``, window and chunk with exactly this call's
        visibility and small values, for kernels that compute positions in
        fixed-width integers: ``reference.mask.small_frame`` of the call (the argument
        why it keeps the visibility is there). Without ``shift_boundary`` a chunk
        boundary that falls inside the cache keeps its chunk, however long (``C <=
        r + Lk``); with it every value is at most ``2 * Lk + 1``, which the kernels
        take only where their positions would not fit otherwise (a launch passes
        the argument positionally: keywords cost about 0.1 us a call)."""
        return _frame(self.Lk, self.window_size, self.chunk_size, self.kv_start, shift_boundary)

    def int64_framed(self) -> "Problem":
        """This call, or where int64 positions cannot hold it, the equivalent small call
        (``reference.mask.int64_frame``): what code that builds int64 position tensors
        computes (the reference, the mutants, the flex backend)."""
        kv, w, c = int64_frame(self.Lk, self.window_size, self.chunk_size, self.kv_start)
        if (kv, w, c) == (self.kv_start, self.window_size, self.chunk_size):
            return self
        return dataclasses.replace(self, kv_start=kv, window_size=w, chunk_size=c)

    @property
    def empty(self) -> bool:
        """True when no query row exists (``B``, ``Hq`` or ``Lq`` is 0): both
        outputs are empty. ``Dv == 0`` is not empty: ``o`` has no element but
        ``lse`` is still defined by SPEC."""
        return 0 in (self.B, self.Hq, self.Lq)

    def new_outputs(self, poison: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh ``o`` (canonical layout, contiguous) and ``lse`` (fp32).

        With ``poison`` they are filled with NaN, so an element no kernel wrote
        is caught by any check; without it they are uninitialised.
        """
        o = torch.empty((self.B, self.Hq, self.Lq, self.Dv), dtype=self.dtype, device=self.device)
        lse = torch.empty((self.B, self.Hq, self.Lq), dtype=torch.float32, device=self.device)
        if poison:
            o.fill_(float("nan"))
            lse.fill_(float("nan"))
        return o, lse


def default_scale(Dqk: int) -> float:
    """SPEC's ``sm_scale`` when ``None`` is passed: ``1 / sqrt(Dqk)`` (1 when
    ``Dqk == 0``, where every score is 0 anyway)."""
    return 1.0 / math.sqrt(Dqk) if Dqk > 0 else 1.0


F32_MAX = 3.4028234663852886e38  # the largest finite float32


#: log2(e): the kernels work in base 2 and scale scores by ``sm_scale * LOG2E``.
LOG2E = 1.4426950408889634


def fits_f32(x: float) -> bool:
    """Whether the float ``x`` stays finite as a float32 (``|x| <= F32_MAX``; rounding
    up to the next power of two past it is not counted: the callers compare scales
    far from that edge)."""
    return abs(x) <= F32_MAX


def check_f32_score_scale(sm_scale: float, backend: str) -> None:
    """Raise :class:`UnsupportedConfig` (message prefixed ``backend``) when a kernel's
    float32 score scale ``sm_scale * log2(e)`` overflows: ``|sm_scale| > 2.3586e38``."""
    if not fits_f32(sm_scale * LOG2E):
        raise UnsupportedConfig(
            f"{backend}: sm_scale={sm_scale!r} is not supported: the kernels scale scores by "
            "sm_scale * log2(e) in float32, which overflows (|sm_scale| must be at most 2.3586e38)")


def positive_normal_f32(x) -> bool:
    """Whether ``x`` is a positive normal float32 (``2**-126 <= x <= float32 max``).

    The kernels that move the scale into the exponent (``sm_scale * log2(e)``
    passed as float32; Triton's ``FOLD``, TileLang's ``scale_fold``) need
    exactly this: ``-inf * x == -inf`` and ``s -> s * x`` keeps the order of
    scores. Zero, negative, subnormal (flushed to zero), overflowing and NaN
    scales are not."""
    return x is not None and 2.0 ** -126 <= x <= F32_MAX


def _int_arg(name: str, value, minimum: int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got bool {value!r}")
    try:
        iv = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if iv < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {iv}")
    return iv


def _bool_arg(name: str, value) -> bool:
    if not isinstance(value, bool):  # numpy.bool_ too: not a bool, and named so
        kind = type(value)
        raise ValueError(f"{name} must be a bool (True or False), got "
                         f"{kind.__module__ + '.' if kind.__module__ != 'builtins' else ''}"
                         f"{kind.__qualname__} {value!r}")
    return value


_STRIDED = torch.strided


def _not_dense(name: str, t: torch.Tensor) -> ValueError:
    got = f"a nested tensor (layout {t.layout})" if t.is_nested else f"layout {t.layout}"
    return ValueError(f"{name} must be a dense (strided) tensor, got {got}")


def check_inputs(
    q,
    k,
    v,
    *,
    window_size,
    chunk_size,
    mask_lmk=True,
    expand_to_chunk=True,
    kv_start=0,
    sm_scale=None,
    dtypes: tuple[torch.dtype, ...] = CANONICAL_DTYPES,
) -> Problem:
    """Validate a call against SPEC.md and return its :class:`Problem`.

    Raises ``ValueError`` naming the argument and the rule for: tensors that
    are not dense (sparse, nested) or not 4-D ``torch.Tensor`` s; non-floating or
    unsupported dtypes; mixed dtypes or devices; mismatched ``B`` / ``Dqk`` / ``Lk`` / ``Hkv``;
    ``Hq % Hkv != 0``; ``Lq > Lk``; ``window_size < 1``; ``chunk_size < 1``;
    ``kv_start < 0``; a non-finite ``sm_scale``; flags that are not bools.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout is not _STRIDED:  # sparse, jagged nested, mkldnn (strided nested: below)
            raise _not_dense(name, t)
        if t.dim() != 4:
            if t.is_nested:  # no shape to print
                raise _not_dense(name, t)
            raise ValueError(f"{name} must be 4-D (B, H, L, D), got shape {tuple(t.shape)}")
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name}.dtype must be floating point, got {t.dtype}")
        if t.dtype not in dtypes:
            allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise ValueError(f"{name}.dtype must be one of {allowed}, got {t.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype, got q={q.dtype}, k={k.dtype}, v={v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device, got q={q.device}, k={k.device}, v={v.device}")

    try:
        B, Hq, Lq, Dqk = q.shape
        Bk, Hkv, Lk, Dk = k.shape
        Bv, Hv, Lv, Dv = v.shape
    except RuntimeError:  # a strided nested tensor has no sizes (costs nothing unraised)
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.is_nested:
                raise _not_dense(name, t) from None
        raise
    if Bk != B or Bv != B:
        raise ValueError(f"batch size B must match: q has {B}, k has {Bk}, v has {Bv}")
    if Dk != Dqk:
        raise ValueError(f"head dim Dqk must match: q has {Dqk}, k has {Dk}")
    if Lv != Lk:
        raise ValueError(f"key length Lk must match: k has {Lk}, v has {Lv}")
    if Hv != Hkv:
        raise ValueError(f"key/value heads Hkv must match: k has {Hkv}, v has {Hv}")
    if Hkv == 0 and Hq != 0:
        raise ValueError(f"Hq % Hkv must be 0: Hq={Hq} query heads cannot share Hkv=0 key/value heads")
    if Hkv != 0 and Hq % Hkv != 0:
        raise ValueError(f"Hq % Hkv must be 0 (whole query heads per key/value head), got Hq={Hq}, Hkv={Hkv}")
    if Lq > Lk:
        raise ValueError(f"Lq must be <= Lk (queries are the last Lq key positions), got Lq={Lq}, Lk={Lk}")

    window_size = _int_arg("window_size", window_size, 1)
    chunk_size = _int_arg("chunk_size", chunk_size, 1)
    kv_start = _int_arg("kv_start", kv_start, 0)
    mask_lmk = _bool_arg("mask_lmk", mask_lmk)
    expand_to_chunk = _bool_arg("expand_to_chunk", expand_to_chunk)

    if sm_scale is None:
        scale = default_scale(Dqk)
    else:
        if isinstance(sm_scale, (bool, torch.Tensor, str, bytes, bytearray)):  # float() parses text
            raise ValueError(f"sm_scale must be a finite float or None, got {sm_scale!r}")
        try:
            scale = float(sm_scale)  # int, float, numpy scalar
        except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float range
            raise ValueError(f"sm_scale must be a finite float or None, got {sm_scale!r}") from None
        if not math.isfinite(scale):
            raise ValueError(f"sm_scale must be finite, got {sm_scale!r}")

    return Problem._fast(B=B, Hq=Hq, Hkv=Hkv, Lq=Lq, Lk=Lk, Dqk=Dqk, Dv=Dv, dtype=q.dtype,
                         device=q.device, window_size=window_size, chunk_size=chunk_size,
                         mask_lmk=mask_lmk, expand_to_chunk=expand_to_chunk, kv_start=kv_start,
                         sm_scale=scale)
