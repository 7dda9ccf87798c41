"""Verdicts: one backend against the float64 golden, two backends against each other.

Tolerance (FlashAttention-style, see docs/conformance.md)::

    max|out - golden|  <= 2 * max|same_dtype - golden|  + floor(dtype)
    mean|out - golden| <= 2 * mean|same_dtype - golden| + mean_floor_share(n) * floor(dtype)

where ``golden`` is ``reference.golden`` (float64 math on the same inputs),
``same_dtype`` is ``reference.same_dtype`` (what a kernel computes from inputs in their
dtype: fp32 scores, softmax and sums, the weights rounded to the input dtype before ``P @ V``;
for fp32 inputs run on the CPU, :func:`same_dtype_device`) and ``floor(dtype)`` is
:func:`o_floor_ulps` ulps of the dtype (``FLOOR_ULPS``, ``FLOOR_ULPS_FP32`` for fp32) at the
largest output magnitude (widened by ``sqrt(Dqk / 64)`` above Dqk = 64, see
:func:`dot_length_factor`), and at least ``FLOOR_ULPS_O_SCORES`` fp32 ulps at the
scores' scale times the largest seen ``|v|`` (:func:`_score_scale`). The LSE is compared
the same way in fp32 over its finite entries (floor ``FLOOR_ULPS_LSE`` fp32 ulps at the
largest |lse| or at the scores' scale ``|sm_scale| * max|q_i| * max|k_j|`` (rows with a
finite lse, keys some query sees, per batch and key/value head), whichever is larger,
widened the same way: an LSE errs by its scores' rounding, which |lse| does not measure
where scores cancel). Everything else is exact: shapes, dtypes (``o`` in ``q.dtype``,
``lse`` fp32), ``o`` contiguous and on the input device, rows with no visible
key (``o == 0`` exactly, ``lse == -inf``), NaN exactly where golden has NaN,
infinities where golden has them, with their sign. No fraction of mismatching
elements is ever tolerated.

A pair of backends passes a case when both pass it and their mutual maximum
difference is within the sum of their bounds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch

import reference
from reference.mask import rule_kwargs

__all__ = ["Expected", "Verdict", "YardstickOverflow", "expected", "same_dtype_device", "judge", "judge_error", "judge_pair",
           "assert_pass",
           "floor", "ulp", "dot_length_factor", "mean_floor_share", "o_floor_ulps", "FLOOR_ULPS",
           "FLOOR_ULPS_FP32", "FLOOR_ULPS_LSE", "FLOOR_ULPS_O_SCORES", "MAX_FACTOR", "MEAN_FACTOR"]

FLOOR_ULPS = 2
#: fp32's floor for ``o``. Two ulps are the 16-bit rule: there the output's own rounding
#: (half an ulp) dominates and 2 ulps is far above any kernel's computing error. In fp32
#: the computing error is the larger part and depends on the order of the sums: per
#: output element a flash-style kernel rounds the scaled score and its exponential, the
#: running-max rescales, every product and partial sum of ``P @ V`` and the final
#: division, and PyTorch's error, the yardstick, is a matter of its BLAS's summation order
#: (the CPUs of two machines, torch 2.11 and 2.13, put it 3x apart on one fp32 case).
#: Measured on the H200 at 14f4cbc (fp32 cases of the full GPU tier,
#: ``conformance/results/h200x2-fp32cats-4backends-n16-14f4cbc.json.xz``),
#: in ulps of max|golden| (times :func:`dot_length_factor`): correct Triton and TileLang
#: kernels median 5, p90 9-12, worst 19 (decode) and 14 (prefill); ``same_dtype`` (the
#: run host's CPU) median 5, p90 8, worst 15, and as low as 0 (exact) on some cases; exact
#: rounding 0.5. Kernel and yardstick are alike, but each case draws them independently, so
#: ``2 x same_dtype`` alone fails a correct kernel wherever the yardstick draws low. At 2 ulps
#: with the CUDA yardstick they reached 1.83x the bound
#: (``tools/fp32_probe.py``), at 8 ulps with the CPU one 0.97 (that run: all pass); at 16
#: the worst is 0.66 there (recomputed from the run's recorded errors and bounds) and 0.51
#: on the CPU's full decode tier. Precision bugs stay far above it:
#: inputs cut to tf32's mantissa land over 100x the bound (``conformance/test_verdict.py``);
#: the mutants ``low_precision_accumulation`` and ``window_off_by_one`` at least 1.7e3x and
#: 1e5x on every fp32 quick-tier case of ``decode``, ``dtype`` and ``headdim`` they fail, and
#: ``fp16_probabilities`` (P rounded to fp16, the nearest precision bug) 62-231x on the 33 of
#: 34 fp32 quick-tier cases of six categories it changes (CPU).
#: Session 28 doubled it to 32: the H200 full tier at e41b767
#: (``conformance/results/h200-full-part2-n14-e41b767.json.xz``) had one fp32 decode case,
#: ``fp32-B2-H8x2-q1k2080-D128x128-W48C64-lmk1exp1-kv1000003-padt-nan``, over 16 ulps in
#: both kernels (1.10x and 1.15x: 2.25e-6 and 2.34e-6, 27-28 ulps of max|golden| 0.95 after
#: the widening), every other fp32 check of the tier at most 0.69. The error is the row's,
#: not a kernel's: Triton's interpreter on the CPU (exact exponentials, numpy's fp32 dot)
#: errs 2.07e-6 on the same row, and ``same_dtype`` errs 1.05e-6 there on the CI-class CPU
#: (torch 2.13) but at most 3.45e-7 on the device host's (torch 2.11): the yardstick drew
#: low. At 32 ulps that case passed on the H200 at af28a17 (Triton 0.66, TileLang 0.69),
#: and on the CPU (quick tier, fp32 cases of ``basic``, ``dtype``, ``headdim``, ``layout``,
#: ``scale``, ``decode``, b4fdfd0)
#: ``fp16_probabilities`` fails 33 of 34 at 38-90x the bound (the 34th, one key, it
#: computes exactly) and ``low_precision_accumulation`` all 34 at 925x or more.
FLOOR_ULPS_FP32 = 32
#: the LSE passes through a log and, in most kernels, a base change (exp2/log2
#: with log2(e) folded into the scale, ``* ln 2`` on the way out): two more fp32
#: roundings than ``o``, so its floor is a few ulps wider. Its magnitude is the larger
#: of max|lse| and the scores' scale (:func:`_score_scale`): an LSE
#: carries its scores' absolute rounding, and where scores cancel (two keys whose lse is
#: near 0, one key whose dot product cancels) |lse| is far below it. Session 30: at
#: max|lse| alone correct Triton and TileLang kernels failed 3-6 of 200 seeds of such
#: fp32 rows (CPU, up to 11.8x the bound); at the scores' scale none of 200, worst 0.16.
#: The fp32 LSE bound of the quick tier's cases widens by a median 2.6x (at most 5.1x;
#: bf16 / fp16 within 1%, their yardstick's error dominates); the precision mutants'
#: smallest margins there are unchanged (``fp16_probabilities`` 38x, decided by ``o``).
FLOOR_ULPS_LSE = 4
#: The floor of ``o`` is at least this many fp32 ulps at ``S * max |v_j|`` (``S`` the
#: scores' scale, :func:`_score_scale`): a probability carries its score's absolute fp32
#: rounding (about ``|s| * eps``) as a relative error, so with large scores (a large
#: ``sm_scale``) ``o`` errs by far more than the ulps of max|o|. Session 30: with
#: ``sm_scale`` 2..8 (fp32, D = 64 / 128) correct Triton and TileLang kernels failed 19 of
#: 1053 verdicts at up to 2.1x the bound where ``FLOOR_ULPS_FP32`` ulps at max|o| was the
#: whole floor, wherever the yardstick drew low (a fuzzing helper).
FLOOR_ULPS_O_SCORES = 1
MAX_FACTOR = 2.0
MEAN_FACTOR = 2.0

PASS, FAIL, UNSUPPORTED = "pass", "fail", "unsupported"
#: a backend fails a case the way its registry entry documents (``Backend.deviation``):
#: reported with the reason and the failure, never counted as a pass
DEVIATES = "deviates"


def ulp(magnitude: float, dtype: torch.dtype) -> float:
    """Spacing of ``dtype`` floats at ``magnitude`` (the ulp of the largest
    power of two not above it; the smallest normal's ulp for tiny values)."""
    fi = torch.finfo(dtype)
    m = max(abs(float(magnitude)), fi.tiny)
    return fi.eps * 2.0 ** math.floor(math.log2(m))


def floor(magnitude: float, dtype: torch.dtype, ulps: float = FLOOR_ULPS) -> float:
    """The absolute slack every comparison gets: ``ulps`` ulps at ``magnitude``."""
    return ulps * ulp(magnitude, dtype)


def _fmt(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def _idx(flat: int, shape) -> tuple[int, ...]:
    out = []
    for n in reversed(shape):
        out.append(flat % n)
        flat //= n
    return tuple(reversed(out))


def _where(index: tuple[int, ...]) -> str:
    names = ("b", "h", "i", "d")
    return "(" + ", ".join(f"{n}={int(v)}" for n, v in zip(names, index)) + ")"


@dataclass
class Stat:
    """Error of one tensor against golden and its bound."""

    max_err: float
    max_bound: float
    mean_err: float
    mean_bound: float
    worst: tuple[int, ...] | None = None
    got: float = float("nan")
    want: float = float("nan")

    @property
    def ratio(self) -> float:
        r = 0.0
        if self.max_bound > 0:
            r = max(r, self.max_err / self.max_bound)
        if self.mean_bound > 0:
            r = max(r, self.mean_err / self.mean_bound)
        return r


@dataclass
class Expected:
    """Golden and same-dtype results of one case, and the bounds they give."""

    o: torch.Tensor  # float64
    lse: torch.Tensor  # float64
    dtype: torch.dtype
    device: torch.device
    empty_rows: torch.Tensor  # (B, H, Lq) bool: golden lse == -inf
    o_same: Stat
    lse_same: Stat

    @property
    def o_bound(self) -> float:
        return self.o_same.max_bound

    @property
    def lse_bound(self) -> float:
        return self.lse_same.max_bound


def _err(got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, int]:
    """max and mean of |got - want| over ``mask``, and the flat index of the max."""
    if not bool(mask.any()):
        return 0.0, 0.0, -1
    diff = torch.where(mask, (got.double() - want).abs(), 0.0)
    flat = int(diff.flatten().argmax())
    return float(diff.flatten()[flat]), float(diff.sum() / mask.sum()), flat


def dot_length_factor(dqk: int) -> float:
    """Floor widening for long dot products: ``max(1, sqrt(Dqk / 64))``.

    The scores' rounding error grows like the square root of the dot-product
    length, and kernels legitimately sum in another order than the BLAS call
    of ``same_dtype`` (which, blocked, is unusually accurate in fp32): at
    Dqk = 256, fp32 kernels with fp32 accumulation sat at 0.6-1.04 of the
    un-widened bound across seeds. Below 64 nothing changes."""
    return max(1.0, math.sqrt(max(dqk, 1) / 64))


def mean_floor_share(n: int) -> float:
    """The share of the floor the mean bound gets over ``n`` compared elements:
    ``min(1, 1/2 + 1/sqrt(3 n))``, the mean of ``n`` rounding errors spread
    evenly up to the floor plus two standard deviations. Large samples get half
    the floor (a low-precision accumulator shows up there); one element gets
    the whole floor (its mean is its max, so the mean check is then no
    stricter than the max check), a handful nearly all of it."""
    return min(1.0, 0.5 + 1.0 / math.sqrt(3.0 * max(n, 1)))


def _bounds(same: torch.Tensor, golden: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype,
            ulps: float, mag_at_least: float = 0.0, floor_at_least: float = 0.0) -> Stat:
    mx, mean, _ = _err(same, golden, mask)
    n = int(mask.sum())
    mag = max(float(golden[mask].abs().max()), mag_at_least) if n else 0.0
    fl = max(floor(mag, dtype, ulps), floor_at_least if n else 0.0)
    return Stat(max_err=mx, mean_err=mean, max_bound=MAX_FACTOR * mx + fl,
                mean_bound=MEAN_FACTOR * mean + fl * mean_floor_share(n))


def o_floor_ulps(dtype: torch.dtype) -> float:
    """Ulps of ``dtype`` at max|golden| in the floor of the ``o`` bound (before the
    :func:`dot_length_factor` widening): ``FLOOR_ULPS_FP32`` for fp32, ``FLOOR_ULPS`` else."""
    return FLOOR_ULPS_FP32 if dtype == torch.float32 else FLOOR_ULPS


def same_dtype_device(dtype: torch.dtype, device: torch.device) -> torch.device:
    """Where the yardstick ``reference.same_dtype`` runs for inputs of ``dtype`` on ``device``.

    fp32: on the CPU. PyTorch's CUDA fp32 products compute a lone query row more
    accurately than the same row among other queries (session 13, ``tools/fp32_probe.py``,
    H200: on the small decode shapes 2.6-3.6e-7 alone, 4.4-8.8e-7 among three queries,
    same keys and values), so on CUDA the yardstick of an fp32 decode case was 1.4-2.9x
    smaller than that of the same row in a prefill, and the kernels, whose error does not
    change with the query count, crossed the bound on 0-5 seeds of 12. On the CPU the row's
    error did not depend on the other rows (a scratch run over the probe's shapes, 12 seeds
    each, on the CI-class machine), so an fp32 case's bound no longer depends on its number of queries. It still
    depends on the CPU and torch build (two machines put it 3x apart on one case): the fp32 floor,
    ``FLOOR_ULPS_FP32``, is sized for that. bf16 / fp16: on the inputs' device (their ``o``
    error is the dtype's rounding of the probabilities and of ``o``, not the summation order)."""
    return torch.device("cpu") if dtype == torch.float32 else device


class YardstickOverflow(ValueError):
    """The yardstick (``reference.same_dtype``) is not finite where the ground truth is,
    with the scale folded into ``q`` (after its own scores overflowed or may have): no
    bound can be formed, so the call is not judged (it never passes by a NaN, infinite or
    overflow-inflated bound)."""


def _yardstick(q, k, v, kw: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    where = same_dtype_device(q.dtype, q.device)
    if where == q.device:
        return reference.same_dtype(q, k, v, **kw)
    os_, ls = reference.same_dtype(q.to(where), k.to(where), v.to(where), **kw)
    return os_.to(q.device), ls.to(q.device)


def _overflows(os_, ls, omask, lmask) -> bool:
    return bool((~torch.isfinite(os_) & omask).any()) or bool((~torch.isfinite(ls) & lmask).any())


def _max_finite(x: torch.Tensor) -> float:
    x = x[torch.isfinite(x)]
    return float(x.max()) if x.numel() else 0.0


def _row_norms(x: torch.Tensor) -> torch.Tensor:
    """``|x_i|`` per row (``(B, H, L)``, float64)."""
    # a float64 reduction, no float64 copy of the inputs (the long tier's caches are GBs)
    return torch.linalg.vector_norm(x, dim=-1, dtype=torch.float64)


def _scores_may_overflow(dot_bound: float) -> bool:
    """Whether some ``<q_i, k_j>`` may pass fp32's largest value, the precision of
    ``same_dtype``'s scores (``dot_bound``: ``max |q_i| * max |k_j|`` over every finite row,
    Cauchy-Schwarz; only bf16 and fp32 inputs reach it). An overflow to ``-inf`` (or, with a
    negative scale, to ``+inf``) leaves the yardstick's outputs finite: the key drops out of
    the row, the yardstick's error grows and the bound with it, silently (50-270x on fp16
    calls a review drew in session 29, when the yardstick still rounded its scores to the
    input dtype and fp16's 65504 was the limit)."""
    return dot_bound > torch.finfo(torch.float32).max


def _score_scale(qn: torch.Tensor, kn: torch.Tensor, v: torch.Tensor, lmask: torch.Tensor,
                 scale: float, kw: dict[str, Any]) -> tuple[float, float]:
    """``(S, S_v)``: ``S`` the largest ``|sm_scale| * |q_i| * |k_j|`` over each batch and
    key/value head's query rows with a finite lse and its keys some query sees, ``S_v``
    the largest such product times the largest finite ``|v_jd|`` of those keys (rows
    holding a non-finite element count their other elements as 0: a smaller floor, never
    a larger one). By Cauchy-Schwarz ``S`` is at least every score ``|s_ij|`` and every
    ``|sm_scale| * sum_d |q_id k_jd|`` that reaches an output, the scale of its rounding
    in fp32, where kernels hold scores whatever the input dtype; a probability carries
    that rounding as a relative error into ``o``, up to ``max |v_j|`` times it. Paired per
    batch and head (a large ``q`` in one batch meets no large ``k`` of another); unseen key
    slots may hold anything (SPEC): a large finite value there widens nothing. ``qn``,
    ``kn``: :func:`_row_norms` of ``q`` and ``k``."""
    B, Hq, Lq = qn.shape
    Hkv, Lk = kn.shape[1], kn.shape[2]
    if 0 in (B, Hq, Lq, Hkv, Lk):
        return 0.0, 0.0
    seen = reference.seen_keys(Lq, Lk, device=kn.device, **rule_kwargs(kw))
    if not bool(seen.any()):
        return 0.0, 0.0
    zero = torch.zeros((), dtype=torch.float64, device=qn.device)
    qmax = torch.where(lmask & torch.isfinite(qn), qn, zero).amax(-1)  # (B, Hq)
    qmax = qmax.view(B, Hkv, Hq // Hkv).amax(-1)  # (B, Hkv): head h reads key/value head h // G
    kmax = torch.where(torch.isfinite(kn), kn, zero)[..., seen].amax(-1)
    prod = abs(scale) * qmax * kmax
    if v.shape[-1] == 0:  # Dv = 0: no o to bound (the inf norm of an empty row raises)
        return float(prod.max()), 0.0
    vrow = torch.linalg.vector_norm(v, ord=math.inf, dim=-1)  # max |v_jd| per row, no copy of v
    vmax = torch.where(torch.isfinite(vrow), vrow.double(), zero)[..., seen].amax(-1)
    return float(prod.max()), float((prod * vmax).max())


def expected(q, k, v, kw: dict[str, Any]) -> Expected:
    """Run ``reference.golden`` and ``reference.same_dtype`` on a case's inputs
    (``same_dtype`` where :func:`same_dtype_device` says; its outputs come back to
    the inputs' device).

    ``same_dtype`` computes ``q @ k^T`` in fp32 before scaling, so inputs whose raw dot
    products pass fp32's range (bf16 or fp32 values near 1e19 with a small explicit
    ``sm_scale``) give a non-finite yardstick, hence a NaN or infinite bound that no error
    exceeds (session 29, a fuzzer's ``o = 1 - golden`` passed so, at fp16's 65504 while the
    yardstick rounded its scores to the input dtype), and an overflow to ``-inf`` leaves it
    finite and loose. Where the yardstick is not finite on an element the ground truth has
    finite, or a raw product may pass fp32's range (:func:`_scores_may_overflow`), it is
    taken with the scale folded into ``q`` first (``q * sm_scale`` rounded to the dtype,
    ``sm_scale = 1``: FlashAttention's order); if that is not finite where the truth is,
    :class:`YardstickOverflow`."""
    og, lg = reference.golden(q, k, v, **kw)
    empty = torch.isneginf(lg)
    omask = torch.isfinite(og) & ~empty[..., None]
    lmask = torch.isfinite(lg)
    os_, ls = _yardstick(q, k, v, kw)
    scale = reference.check_inputs(q, k, v, dtypes=reference.CANONICAL_DTYPES + (torch.float64,),
                                   **kw).sm_scale  # resolved by the rule's one implementation
    qn, kn = _row_norms(q), _row_norms(k)
    if _overflows(os_, ls, omask, lmask) or _scores_may_overflow(_max_finite(qn) * _max_finite(kn)):
        qs = (q.to(torch.float32) * scale).to(q.dtype)  # one rounding of the scaled q to the dtype
        os_, ls = _yardstick(qs, k, v, dict(kw, sm_scale=1.0))
        if _overflows(os_, ls, omask, lmask):
            raise YardstickOverflow(
                f"reference.same_dtype ({q.dtype}) is not finite where golden is, with the scale "
                f"folded into q too (sm_scale={scale!r}): its scores or P @ V pass the dtype's "
                f"range, so no tolerance can be formed for this call")
    wide = dot_length_factor(q.shape[-1])
    S, S_v = _score_scale(qn, kn, v, lmask, scale, kw)
    if not (math.isfinite(S) and math.isfinite(S_v)):  # float64 inputs past fp32's range
        raise YardstickOverflow(f"the scores' scale ({S!r}, times |v|: {S_v!r}) is not finite: "
                                "no floor can be formed for this call")
    return Expected(o=og, lse=lg, dtype=q.dtype, device=q.device, empty_rows=empty,
                    o_same=_bounds(os_, og, omask, q.dtype, o_floor_ulps(q.dtype) * wide,
                                   floor_at_least=floor(S_v, torch.float32, FLOOR_ULPS_O_SCORES)),
                    lse_same=_bounds(ls, lg, lmask, torch.float32, FLOOR_ULPS_LSE * wide,
                                     mag_at_least=S))


@dataclass
class Verdict:
    """Outcome of one check. ``kinds`` names what differs (output, lse, shape,
    dtype, layout, nan, inf, empty row, error, return, crash)."""

    status: str
    problems: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    ratio: float | None = None  # worst error / bound (None when not applicable)
    details: dict[str, Any] = field(default_factory=dict)

    def add(self, kind: str, text: str) -> None:
        self.status = FAIL
        if kind not in self.kinds:
            self.kinds.append(kind)
        self.problems.append(text)

    def message(self, case_id: str, who: str) -> str:
        if self.status == PASS:
            return f"{case_id} [{who}]: pass (worst error/bound {_fmt(self.ratio or 0.0)})"
        if self.status == UNSUPPORTED:
            return f"{case_id} [{who}]: unsupported: " + "; ".join(self.problems)
        if self.status == DEVIATES:
            return f"{case_id} [{who}]: deviates: " + "; ".join(self.problems)
        head = f"{case_id} [{who}]: FAIL ({', '.join(self.kinds)})"
        return head + "".join(f"\n  - {p}" for p in self.problems)


def _exact_checks(v: Verdict, o, lse, exp: Expected, shape_o, shape_l) -> bool:
    """Shape, dtype, layout, device; False when values cannot be compared."""
    if not isinstance(o, torch.Tensor) or not isinstance(lse, torch.Tensor):
        v.add("return", f"return: expected (o, lse) tensors, got ({type(o).__name__}, {type(lse).__name__})")
        return False
    ok = True
    if tuple(o.shape) != shape_o:
        v.add("shape", f"shape: o is {tuple(o.shape)}, expected {shape_o} (B, Hq, Lq, Dv)")
        ok = False
    if tuple(lse.shape) != shape_l:
        v.add("shape", f"shape: lse is {tuple(lse.shape)}, expected {shape_l} (B, Hq, Lq)")
        ok = False
    if o.dtype != exp.dtype:
        v.add("dtype", f"dtype: o is {o.dtype}, expected q.dtype {exp.dtype}")
    if lse.dtype != torch.float32:
        v.add("dtype", f"dtype: lse is {lse.dtype}, expected torch.float32")
    if o.device != exp.device or lse.device != exp.device:
        v.add("device", f"device: outputs on {o.device} / {lse.device}, inputs on {exp.device}")
        ok = False
    if ok and not o.is_contiguous():
        v.add("layout", f"layout: o is not contiguous in (B, Hq, Lq, Dv) (strides {tuple(o.stride())})")
    return ok


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(x) for x in mask.nonzero()[0].tolist())


def _special_checks(v: Verdict, o64: torch.Tensor, l64: torch.Tensor, exp: Expected) -> None:
    """Empty rows, NaN positions, infinities: exact."""
    empty = exp.empty_rows
    if bool(empty.any()):
        bad_o = empty[..., None] & (o64 != 0)  # NaN != 0 is True
        if bool(bad_o.any()):
            at = _first(bad_o)
            v.add("empty row", f"empty row: {int(bad_o.any(-1).sum())} rows with no visible key have o != 0, "
                  f"first at {_where(at)}: o={_fmt(float(o64[at]))}, expected exactly 0")
        bad_l = empty & ~torch.isneginf(l64)
        if bool(bad_l.any()):
            at = _first(bad_l)
            v.add("empty row", f"empty row: {int(bad_l.sum())} rows with no visible key have lse != -inf, "
                  f"first at {_where(at)}: lse={_fmt(float(l64[at]))}")
    live = ~empty
    for name, got, want, rows in (("o", o64, exp.o, live[..., None]), ("lse", l64, exp.lse, live)):
        gn, wn = torch.isnan(got) & rows, torch.isnan(want) & rows
        extra = gn & ~wn
        if bool(extra.any()):
            at = _first(extra)
            v.add("nan", f"NaN: {int(extra.sum())} elements of {name} are NaN where golden is finite, "
                  f"first at {_where(at)} (golden {_fmt(float(want[at]))}): an unwritten output or NaN "
                  f"leaking from key slots no query sees")
        missing = wn & ~gn
        if bool(missing.any()):
            at = _first(missing)
            v.add("nan", f"NaN: golden {name} is NaN at {int(missing.sum())} elements but the backend is not, "
                  f"first at {_where(at)} ({name}={_fmt(float(got[at]))})")
        ginf = torch.isinf(got) & rows
        winf = torch.isinf(want) & rows
        bad = (ginf | winf) & ~(got == want) & ~gn & ~wn
        if bool(bad.any()):
            at = _first(bad)
            v.add("inf", f"inf: {name} infinities differ from golden at {int(bad.sum())} elements, first at "
                  f"{_where(at)}: {name}={_fmt(float(got[at]))}, golden {_fmt(float(want[at]))}")


def _value_check(v: Verdict, name: str, kind: str, got64, want, mask, bound: Stat) -> Stat:
    mx, mean, flat = _err(got64, want, mask)
    st = Stat(max_err=mx, mean_err=mean, max_bound=bound.max_bound, mean_bound=bound.mean_bound)
    if flat >= 0:
        st.worst = _idx(flat, tuple(want.shape))
        st.got, st.want = float(got64.flatten()[flat]), float(want.flatten()[flat])
    if mx > bound.max_bound:
        v.add(kind, f"{kind}: max|{name} - golden| = {_fmt(mx)} at {_where(st.worst)}: {name}={_fmt(st.got)}, "
              f"golden {_fmt(st.want)}; bound {_fmt(bound.max_bound)} = {MAX_FACTOR:g} x same-dtype "
              f"{_fmt(bound.max_err)} + floor {_fmt(bound.max_bound - MAX_FACTOR * bound.max_err)} "
              f"(ratio {_fmt(mx / bound.max_bound)})")
    if mean > bound.mean_bound:
        v.add(kind, f"{kind}: mean|{name} - golden| = {_fmt(mean)} > bound {_fmt(bound.mean_bound)} = "
              f"{MEAN_FACTOR:g} x same-dtype mean {_fmt(bound.mean_err)} + a share of the floor "
              f"(worst at {_where(st.worst)}; ratio {_fmt(mean / bound.mean_bound)})")
    return st


def judge(o, lse, exp: Expected) -> Verdict:
    """One backend's ``(o, lse)`` against golden."""
    v = Verdict(PASS)
    shape_o, shape_l = tuple(exp.o.shape), tuple(exp.lse.shape)
    if not _exact_checks(v, o, lse, exp, shape_o, shape_l):
        v.ratio = math.inf
        return v
    o64, l64 = o.detach().double(), lse.detach().double()
    _special_checks(v, o64, l64, exp)
    live = ~exp.empty_rows
    omask = torch.isfinite(exp.o) & torch.isfinite(o64) & live[..., None]
    lmask = torch.isfinite(exp.lse) & torch.isfinite(l64)
    so = _value_check(v, "o", "output", o64, exp.o, omask, exp.o_same)
    sl = _value_check(v, "lse", "lse", l64, exp.lse, lmask, exp.lse_same)
    exact_fail = any(kind not in ("output", "lse") for kind in v.kinds)
    v.ratio = math.inf if exact_fail else max(so.ratio, sl.ratio)
    v.details = dict(o_max_err=so.max_err, o_bound=so.max_bound, o_mean_err=so.mean_err,
                     o_mean_bound=so.mean_bound, lse_max_err=sl.max_err, lse_bound=sl.max_bound,
                     lse_mean_err=sl.mean_err, lse_mean_bound=sl.mean_bound,
                     o_worst=list(so.worst) if so.worst else None,
                     lse_worst=list(sl.worst) if sl.worst else None)
    return v


def assert_pass(o, lse, q, k, v, kw: dict[str, Any], what: str = "") -> Verdict:
    """For tests and tools: :func:`judge` one call's ``(o, lse)`` against the reference
    run on its inputs ``q, k, v`` with the call's keyword arguments ``kw``, and raise
    ``AssertionError`` naming every problem (after ``what``) unless it passes."""
    vd = judge(o, lse, expected(q, k, v, kw))
    if vd.status != PASS:
        raise AssertionError(f"{what}{': ' if what else ''}" + "; ".join(vd.problems))
    return vd


def judge_error(exc: BaseException | None, rule: str, tokens: tuple[str, ...]) -> Verdict:
    """An error case: the call must raise ``ValueError`` whose message matches every token."""
    v = Verdict(PASS, ratio=0.0)
    if exc is None:
        v.add("error", f"error: no exception for invalid input ({rule}); expected ValueError")
        return v
    if not isinstance(exc, ValueError):
        v.add("error", f"error: raised {type(exc).__name__}: {str(exc)[:200]!r}; expected ValueError ({rule})")
        return v
    msg = str(exc)
    missing = [t for t in tokens if not re.search(t, msg)]
    if missing:
        v.add("error", f"error: ValueError message {msg[:200]!r} does not name the argument "
              f"(needs {', '.join(missing)})")
    return v


def _comparable(out_a, out_b) -> bool:
    """Whether a pair's outputs can be measured against each other as they stand: both
    ``(o, lse)`` tensors of the same shapes on one device, non-finite in the same places
    alike (NaN where NaN, each infinity where it is): a difference there is no distance."""
    if out_a is None or out_b is None:
        return False
    outs = (*out_a, *out_b)
    if len(outs) != 4 or not all(isinstance(x, torch.Tensor) for x in outs):
        return False
    for xa, xb in zip(out_a, out_b):
        if xa.shape != xb.shape or xa.device != xb.device:
            return False
        for test in (torch.isnan, torch.isposinf, torch.isneginf):
            if not torch.equal(test(xa), test(xb)):
                return False
    return True


def judge_pair(va: Verdict, vb: Verdict, out_a, out_b, exp: Expected | None, a: str, b: str) -> Verdict:
    """Two backends on one case: both pass and their mutual difference is within
    the sum of their bounds (both bounds are the case's golden bound). Where a member
    fails, so does the pair; its ``ratio`` is then still the measured ``|a - b|`` over
    that sum where the two outputs can be compared (:func:`_comparable`; ``inf`` where not)."""
    if UNSUPPORTED in (va.status, vb.status):
        who = [n for n, x in ((a, va), (b, vb)) if x.status == UNSUPPORTED]
        return Verdict(UNSUPPORTED, problems=[f"{', '.join(who)} unsupported"])
    v = Verdict(PASS, ratio=0.0)
    for n, x in ((a, va), (b, vb)):
        if x.status == FAIL:
            v.add("member", f"member: {n} fails this case ({', '.join(x.kinds)})")
    if v.status != FAIL and DEVIATES in (va.status, vb.status):  # a failing member comes first
        who = [n for n, x in ((a, va), (b, vb)) if x.status == DEVIATES]
        return Verdict(DEVIATES, problems=[f"{', '.join(who)} deviates (documented)"])
    if exp is None:
        if v.status == FAIL:
            v.ratio = math.inf
        return v
    member_failed = v.status == FAIL
    if member_failed and not _comparable(out_a, out_b):
        v.ratio = math.inf  # a member raised, or its outputs cannot be laid beside the other's
        return v
    ratio = 0.0
    for name, kind, i, bound in (("o", "output", 0, exp.o_bound), ("lse", "lse", 1, exp.lse_bound)):
        xa, xb = out_a[i].detach().double(), out_b[i].detach().double()
        mask = torch.isfinite(xa) & torch.isfinite(xb)
        mx, _, flat = _err(xa, xb, mask)
        lim = 2 * bound
        if lim > 0:
            ratio = max(ratio, mx / lim)
        if mx > lim and not member_failed:
            at = _idx(flat, tuple(xa.shape))
            v.add(kind, f"{kind}: max|{name}[{a}] - {name}[{b}]| = {_fmt(mx)} at {_where(at)}: "
                  f"{_fmt(float(xa[at]))} vs {_fmt(float(xb[at]))}; golden {_fmt(float(exp.o[at] if i == 0 else exp.lse[at]))}; "
                  f"bound {_fmt(lim)} = sum of both bounds")
    # a failing member fails the pair; its ratio is still the pair's own measured |a - b|
    # (two members failing alike read near 0: they share the bug)
    v.ratio = ratio if v.status == PASS or member_failed else max(ratio, 1.0)
    return v
