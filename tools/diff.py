"""``hils-swa diff``: which rule of SPEC.md do two backends disagree on?

    hils-swa diff A B [--device cpu|cuda] [--png PATH] [-v]

Runs both backends on a small case set in which every case isolates one rule
of SPEC.md (GQA on/off, Lq < Lk, kv_start off the chunk grid, Dqk != Dv, an
explicit scale, rows with no visible key, NaN in slots no query sees, strided
inputs, long rows, bf16, a query range longer than one 64-row tile, positions,
windows and chunks past int64, bad inputs), compares each with the float64
ground truth (``reference.golden``) under the conformance tolerance, and then
tests one *hypothesis* per rule:

* exact hypotheses predict the whole output of a backend that breaks exactly
  that rule (the SPEC computed with ``window_size + 1``, with positions from 0,
  with landmarks from the cache index, the LSE divided by ln 2, the output
  reshaped from ``(B, Lq, H, D)`` ...) and must match on *every* case;
* signature hypotheses (empty rows, NaN leak, strides, low precision, unwritten
  rows, validation, output dtype) say which cases and rows may fail and how.

The first hypothesis that explains every difference names the rule. A backend
whose differences no single rule explains is reported case by case, with the
rules each failing case is consistent with. Masks are also recovered as a
black box (``hils-swa probe``) and drawn when they differ.

Exit status: 0 when A and B are equivalent (both conform, or both deviate the
same way within tolerance), 1 when they are not, 2 on bad usage.
``--png PATH`` draws the visibility difference of the probes and the per-row
error map of B against A over all cases (matplotlib, Agg).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

import reference
from conformance import verdict
from conformance.cases import poison_unseen
from reference.mask import int64_frame, is_landmark, key_positions, query_positions, visible, visibility_mask
from reference.validation import default_scale

from . import _tolerance as tol
from ._common import dtype_name, pick_device, resolve_backend

__all__ = ["RULES", "CASES", "Case", "Diagnosis", "diagnose", "compare_backends", "main"]

_LN2 = math.log(2.0)


def _first_line(x: object) -> str:
    """The first line of a message or an exception's ("" for a bare ``raise RuntimeError()``)."""
    return (str(x).splitlines() or [""])[0]

#: rule key -> what SPEC.md says and how a backend usually breaks it.
RULES: dict[str, str] = {
    "validation": "input validation: bad input must raise ValueError naming the argument, before any kernel runs",
    "inputs": "inputs are read only: q, k and v must be bitwise unchanged after the call (outputs are fresh tensors)",
    "output_dtype": "output dtype: o in q.dtype, lse in float32",
    "unwritten_rows": "rows never written: the tail of the query range is left uninitialised (grid too small)",
    "empty_rows": "empty-row handling: a row with no visible key must give o = 0 and lse = -inf, never NaN",
    "layout": "output layout: a (B, Lq, H, D) kernel output reshaped instead of transposed to (B, H, Lq, D)",
    "lse_base": "LSE base: lse must be the natural log (ratio ln 2 = base-2 LSE)",
    "window_left": "window left edge: left(i) = qpos(i) - window_size + 1 (off by one)",
    "chunk_expansion": "chunk expansion: with expand_to_chunk the left edge is floored to the chunk start, else not",
    "landmark_shifted": "landmark rule: the landmark is the key with (kpos + 1) % C == 0 (shifted in the backend)",
    "landmark_index": "landmark rule: landmarks from the position kv_start + j, not from the cache index j",
    "landmark_flag": "landmark rule: mask_lmk must switch landmark masking on and off",
    "kv_start": "kv_start ignored: keys sit at positions kv_start + j",
    "positions": "positions past int64: kv_start, window_size and chunk_size are unbounded ints (SPEC bounds "
                 "none); int64 arithmetic on them wraps or raises (compute on Problem.int64_framed() or "
                 "kernel_frame(): the same visibility in small values)",
    "query_offset": "query offset ignored: queries are the LAST Lq key positions (qpos = kv_start + Lk - Lq + i)",
    "gqa": "GQA head mapping: query head h reads key/value head h // (Hq / Hkv)",
    "default_scale": "default scale: sm_scale=None means 1 / sqrt(Dqk)",
    "explicit_scale": "explicit sm_scale ignored: a given sm_scale must be used",
    "strides": "stride handling: inputs may have any strides (e.g. (B, L, H, D) passed as .transpose(1, 2))",
    "nan_leak": "NaN leaking from invisible slots: values in slots no query sees must not change any output",
    "nan_propagation": "NaN propagation: NaN in a key row i sees must reach row i (not read as an empty row)",
    "nan_v_spread": "NaN / inf in v: a non-finite v of a key some rows see must reach only those rows (P @ V "
                    "multiplies the others' p = 0 by it; a known deviation of both kernels, docs/conformance.md)",
    "low_precision": "low precision: softmax sums and P @ V must accumulate in at least fp32, and fp32 "
                     "inputs keep fp32 probabilities",
}


# ------------------------------------------------------------------ the cases

@dataclass(frozen=True)
class Case:
    name: str
    purpose: str
    B: int = 2
    Hq: int = 4
    Hkv: int = 2
    Lq: int = 12
    Lk: int = 20
    Dqk: int = 32      # the kernels serve 32..256
    Dv: int = 32
    dtype: torch.dtype = torch.float32
    window_size: int = 5
    chunk_size: int = 4
    mask_lmk: bool = True
    expand_to_chunk: bool = True
    kv_start: int = 3
    sm_scale: float | None = None
    layout: str = "canonical"      # or "blhd": (B, L, H, D) storage passed as .transpose(1, 2)
    nan_unseen: bool = False       # NaN in k and v slots no query of the call sees
    nan_seen: bool = False         # NaN in the k row of one key some queries see (cases.seen_slot)
    nan_v: bool = False            # NaN, +inf, -inf in the v row of that key (columns 0..2)
    seed: int = 0

    @property
    def rule(self) -> dict:
        return dict(window_size=self.window_size, chunk_size=self.chunk_size, mask_lmk=self.mask_lmk,
                    expand_to_chunk=self.expand_to_chunk, kv_start=self.kv_start)

    @property
    def kwargs(self) -> dict:
        return dict(self.rule, sm_scale=self.sm_scale)

    def as_conformance_case(self, device: str = "cpu"):
        """This case as the suite's ``conformance.cases.Case`` (category ``"diff"``): what a
        backend's ``deviation(case)`` receives here and in ``hils-swa conform`` alike."""
        from conformance.cases import DTYPES, Case as SuiteCase

        dtype = next(name for name, dt in DTYPES.items() if dt == self.dtype)
        return SuiteCase("diff", dtype=dtype, B=self.B, Hq=self.Hq, Hkv=self.Hkv, Lq=self.Lq, Lk=self.Lk,
                         Dqk=self.Dqk, Dv=self.Dv, window=self.window_size, chunk=self.chunk_size,
                         mask_lmk=self.mask_lmk, expand=self.expand_to_chunk, kv_start=self.kv_start,
                         sm_scale=self.sm_scale, layout={"canonical": "bhld", "blhd": "bthd"}[self.layout],
                         nan_slots=self.nan_unseen, nan_seen=self.nan_seen, nan_v=self.nan_v,
                         device=str(device))


CASES: tuple[Case, ...] = (
    Case("base", "GQA 4/2, Lq < Lk, kv_start off the chunk grid, landmarks, expansion"),
    Case("mha", "as base with Hq = Hkv (isolates GQA)", B=1, Hq=4, Hkv=4),
    Case("square", "Lq = Lk, kv_start = 0 (isolates the offsets)", B=1, Hq=2, Hkv=2, Lq=16, Lk=16, kv_start=0),
    Case("no_expand", "expand_to_chunk=False", B=1, Hq=2, Hkv=1, Lq=10, Lk=16, window_size=4, chunk_size=3,
         kv_start=2, expand_to_chunk=False),
    Case("no_lmk", "mask_lmk=False", B=1, Hq=2, Hkv=1, Lq=10, Lk=16, window_size=4, chunk_size=3, kv_start=2,
         mask_lmk=False),
    Case("dv", "Dqk != Dv, default scale", B=1, Hq=2, Hkv=2, Dqk=32, Dv=64, kv_start=0, seed=1),
    Case("scale", "explicit sm_scale", B=1, Hq=2, Hkv=2, sm_scale=0.37, seed=2),
    Case("empty", "every other row has no visible key (W=1, C=2, no expansion)", B=1, Hq=2, Hkv=2, Lq=10, Lk=10,
         window_size=1, chunk_size=2, expand_to_chunk=False, kv_start=0),
    Case("nan", "NaN in k/v slots no query sees (left of every window, landmarks)", B=1, Hq=2, Hkv=1, Lq=6,
         Lk=24, window_size=4, chunk_size=4, kv_start=1, nan_unseen=True, seed=3),
    Case("nan_seen", "NaN in the k row of one key that some queries see (NaN in exactly those rows)",
         B=1, Hq=2, Hkv=1, Lq=12, Lk=20, window_size=4, chunk_size=4, kv_start=1, nan_seen=True, seed=8),
    Case("nan_v", "NaN, +inf, -inf in the v row of one key that some queries see (in exactly those rows)",
         B=1, Hq=2, Hkv=1, Lq=12, Lk=20, window_size=4, chunk_size=4, kv_start=1, nan_v=True, seed=9),
    Case("strided", "as base, inputs (B, L, H, D) passed as .transpose(1, 2), v a slice of a wider tensor",
         layout="blhd", seed=4),
    Case("long", "fp32 rows of ~256 keys (accumulation precision)", B=1, Hq=1, Hkv=1, Lq=300, Lk=300,
         window_size=256, chunk_size=64, kv_start=0, seed=5),
    Case("bf16", "as base in bf16 (output dtype)", dtype=torch.bfloat16, seed=6),
    Case("tail", "Lq = 70: a query range longer than one 64-row tile", B=1, Hq=1, Hkv=1, Lq=70, Lk=80,
         window_size=8, chunk_size=8, kv_start=0, seed=7),
    Case("gqa4", "as base with GQA 8/2: four query heads per key/value head", Hq=8, Hkv=2, seed=12),
    Case("fp16", "as base in fp16 (16-bit scores or accumulators)", dtype=torch.float16, seed=13),
    Case("past_i64", "kv_start = 2^63 + 5: positions past int64 (C = 3 does not divide 2^64)", B=1, Hq=2,
         Hkv=1, Lq=10, Lk=16, window_size=5, chunk_size=3, kv_start=2**63 + 5, seed=10),
    Case("huge_wc", "window 2^64 + 3, chunk 2^63 + 5: every key from the cache start", B=1, Hq=2, Hkv=1,
         Lq=10, Lk=16, window_size=2**64 + 3, chunk_size=2**63 + 5, kv_start=7, seed=11),
)

#: a case with a rule value this large (``past_i64``, ``huge_wc``: 2^63 + 5, 2^64 + 3) has
#: positions or edges past int64, or intermediates that overflow it
_HUGE = 2**62

#: probe configurations (masks recovered as a black box, drawn when they differ)
PROBES: tuple[dict, ...] = (
    dict(Lq=8, Lk=12, window_size=3, chunk_size=4, mask_lmk=True, expand_to_chunk=True, kv_start=5),
)


def make_inputs(case: Case, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deterministic inputs of a case (generated in fp32 on CPU, then moved)."""
    g = torch.Generator().manual_seed(1234 + case.seed)

    def t(H, L, D, wide=0):
        if case.layout == "blhd":
            x = torch.randn(case.B, L, H, D + wide, generator=g)[..., :D] if wide else \
                torch.randn(case.B, L, H, D, generator=g)
            return x.to(device, case.dtype).transpose(1, 2)
        return torch.randn(case.B, H, L, D, generator=g).to(device, case.dtype)

    q = t(case.Hq, case.Lq, case.Dqk)
    k = t(case.Hkv, case.Lk, case.Dqk)
    v = t(case.Hkv, case.Lk, case.Dv, wide=8)
    if case.nan_unseen:
        k = k.clone()
        v = v.clone()
        poison_unseen(k, v, case.Lq, case.rule)
    if case.nan_seen:
        from conformance.cases import seen_slot

        k = k.clone()
        k[:, :, seen_slot(case.Lq, case.Lk, **case.rule)] = float("nan")
    if case.nan_v:
        from conformance.cases import put_nan_v, seen_slot

        v = v.clone()
        put_nan_v(v, seen_slot(case.Lq, case.Lk, **case.rule))
    return q, k, v


BAD_INPUTS: tuple[tuple[str, Callable[[str], tuple]], ...] = (
    ("Hq % Hkv != 0", lambda d: ((torch.randn(1, 3, 4, 32, device=d), torch.randn(1, 2, 8, 32, device=d),
                                  torch.randn(1, 2, 8, 32, device=d)), dict(window_size=3, chunk_size=4))),
    ("Lq > Lk", lambda d: ((torch.randn(1, 2, 9, 32, device=d), torch.randn(1, 2, 8, 32, device=d),
                            torch.randn(1, 2, 8, 32, device=d)), dict(window_size=3, chunk_size=4))),
    ("window_size = 0", lambda d: ((torch.randn(1, 2, 4, 32, device=d), torch.randn(1, 2, 8, 32, device=d),
                                    torch.randn(1, 2, 8, 32, device=d)), dict(window_size=0, chunk_size=4))),
    ("chunk_size = 0", lambda d: ((torch.randn(1, 2, 4, 32, device=d), torch.randn(1, 2, 8, 32, device=d),
                                   torch.randn(1, 2, 8, 32, device=d)), dict(window_size=3, chunk_size=0))),
    ("kv_start = -1", lambda d: ((torch.randn(1, 2, 4, 32, device=d), torch.randn(1, 2, 8, 32, device=d),
                                  torch.randn(1, 2, 8, 32, device=d)), dict(window_size=3, chunk_size=4,
                                                                            kv_start=-1))),
    ("sm_scale = nan", lambda d: ((torch.randn(1, 2, 4, 32, device=d), torch.randn(1, 2, 8, 32, device=d),
                                   torch.randn(1, 2, 8, 32, device=d)), dict(window_size=3, chunk_size=4,
                                                                             sm_scale=float("nan")))),
    ("mixed dtypes", lambda d: ((torch.randn(1, 2, 4, 32, device=d),
                                 torch.randn(1, 2, 8, 32, device=d, dtype=torch.float16),
                                 torch.randn(1, 2, 8, 32, device=d)), dict(window_size=3, chunk_size=4))),
    ("3-D q", lambda d: ((torch.randn(2, 4, 32, device=d), torch.randn(1, 2, 8, 32, device=d),
                          torch.randn(1, 2, 8, 32, device=d)), dict(window_size=3, chunk_size=4))),
    ("mismatched Dqk", lambda d: ((torch.randn(1, 2, 4, 32, device=d), torch.randn(1, 2, 8, 64, device=d),
                                   torch.randn(1, 2, 8, 32, device=d)), dict(window_size=3, chunk_size=4))),
)


# ------------------------------------------------------ truth and predictions

def _dense_golden(q, k, v, mask: torch.Tensor, scale: float, head_map: torch.Tensor | None = None):
    """Float64 attention with an explicit ``(Lq, Lk)`` mask, NaN-exact like the
    reference (a non-finite value reaches only the rows that see it). The mask
    is data: it always comes from :func:`reference.mask.visible`."""
    B, Hq, Lq, _ = q.shape
    Hkv = k.shape[1]
    idx = head_map if head_map is not None else torch.arange(Hq, device=q.device) // (Hq // Hkv)
    kd, vd = k.double()[:, idx], v.double()[:, idx]
    s = (q.double() @ kd.transpose(-1, -2)) * scale
    s = torch.where(mask, s, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    safe = torch.where(torch.isfinite(lse), lse, 0)
    w = torch.exp(s - safe[..., None])
    finite = torch.isfinite(vd).all(dim=-1)  # (B, H, Lk)
    o = w @ torch.where(finite[..., None], vd, 0)
    for j in (~finite).any(dim=(0, 1)).nonzero().flatten().tolist():
        take = mask[:, j][None, None, :, None] & ~finite[:, :, j][:, :, None, None]
        o = o + torch.where(take, w[..., j, None] * vd[:, :, None, j, :], 0)
    return o, lse


def _framed(case: Case) -> Case:
    """The case itself, or where int64 positions cannot hold it the equivalent small call
    (``reference.mask.int64_frame``: exactly the same visibility). The mask hypotheses build
    position tensors, so they perturb the rule there, as the mutants do
    (``conformance.mutants._true_mask``); a bug evaluated in the frame may differ from the
    same bug on the real positions, and then that hypothesis does not explain the case."""
    kv, w, c = int64_frame(case.Lk, case.window_size, case.chunk_size, case.kv_start)
    if (kv, w, c) == (case.kv_start, case.window_size, case.chunk_size):
        return case
    return replace(case, kv_start=kv, window_size=w, chunk_size=c)


def _mask_with(case: Case, *, qpos=None, kpos_lmk=None, **override) -> torch.Tensor:
    """The case's mask from :func:`reference.mask.visible` with perturbed inputs:
    ``override`` changes rule parameters, ``qpos`` the query positions,
    ``kpos_lmk`` the positions the landmark rule is evaluated at. ``case`` must be
    :func:`_framed` (its positions int64 tensors)."""
    rule = dict(case.rule)
    rule.update(override)
    kv = rule.pop("kv_start")
    qp = query_positions(case.Lq, case.Lk, kv) if qpos is None else qpos
    kp = key_positions(case.Lk, kv)
    if kpos_lmk is None:
        return visible(qp[:, None], kp[None, :], **rule)
    m = visible(qp[:, None], kp[None, :], **dict(rule, mask_lmk=False))
    if rule["mask_lmk"]:
        m = m & ~is_landmark(kpos_lmk, chunk_size=rule["chunk_size"])[None, :]
    return m


def _scale(case: Case) -> float:
    return case.sm_scale if case.sm_scale is not None else default_scale(case.Dqk)


# A variant maps (case, q, k, v, golden) -> predicted (o, lse) float64, or None
# when the variant predicts exactly the SPEC on that case.
Variant = Callable[[Case, torch.Tensor, torch.Tensor, torch.Tensor, tuple], "tuple | None"]


def _golden_with(case, q, k, v, **override):
    kw = dict(case.kwargs)
    kw.update(override)
    return reference.golden(q, k, v, **kw)


def _masked(case, q, k, v, mask, scale=None):
    return _dense_golden(q, k, v, mask.to(q.device), _scale(case) if scale is None else scale)


def _v_param(name, value_fn):
    """A variant that re-runs the SPEC with one parameter changed."""
    def variant(case, q, k, v, g):
        new = value_fn(case)
        if new is None or new == case.kwargs[name]:
            return None
        return _golden_with(case, q, k, v, **{name: new})
    return variant


def _v_mask(mask_fn):
    def variant(case, q, k, v, g):
        case = _framed(case)
        m = mask_fn(case)
        if m is None:
            return None
        if torch.equal(m, _mask_with(case)):
            return None
        return _masked(case, q, k, v, m)
    return variant


def _v_transform(fn):
    def variant(case, q, k, v, g):
        return fn(case, g)
    return variant


def _lmk_shift(delta):
    return lambda c: _mask_with(c, kpos_lmk=key_positions(c.Lk, c.kv_start) + delta) if c.mask_lmk else None


def _lmk_index(c):
    return _mask_with(c, kpos_lmk=torch.arange(c.Lk)) if c.mask_lmk else None


def _query_first(c):
    return _mask_with(c, qpos=key_positions(c.Lq, c.kv_start))


def _gqa_variant(head_map_fn):
    def variant(case, q, k, v, g):
        if case.Hq == case.Hkv:
            return None
        idx = head_map_fn(case).to(q.device)
        return _dense_golden(q, k, v, _mask_with(_framed(case)).to(q.device), _scale(case), head_map=idx)
    return variant


def _default_scale(fn):
    def variant(case, q, k, v, g):
        if case.sm_scale is not None:
            return None
        s = fn(case)
        if abs(s - default_scale(case.Dqk)) <= 1e-12:
            return None
        return _golden_with(case, q, k, v, sm_scale=s)
    return variant


def _explicit_ignored(case, q, k, v, g):
    if case.sm_scale is None or abs(case.sm_scale - default_scale(case.Dqk)) <= 1e-12:
        return None
    return _golden_with(case, q, k, v, sm_scale=None)


def _reshaped(case, g):
    o, lse = g
    B, H, L, D = o.shape
    return o.transpose(1, 2).contiguous().reshape(B, H, L, D), lse


def _reshaped_both(case, g):
    o, lse = _reshaped(case, g)
    B, H, L = lse.shape
    return o, g[1].transpose(1, 2).contiguous().reshape(B, H, L)


#: exact hypotheses: rule -> [(variant description, variant)]
EXACT: dict[str, list[tuple[str, Variant]]] = {
    "layout": [("o reshaped from (B, Lq, H, D)", _v_transform(_reshaped)),
               ("o and lse reshaped from (B, Lq, H, ...)", _v_transform(_reshaped_both))],
    "lse_base": [("lse = log2(sum exp) = ln(...) / ln 2", _v_transform(lambda c, g: (g[0], g[1] / _LN2))),
                 ("lse = ln(...) * ln 2", _v_transform(lambda c, g: (g[0], g[1] * _LN2)))],
    "window_left": [("left = qpos - W (one key too many)", _v_param("window_size", lambda c: c.window_size + 1)),
                    ("left = qpos - W + 2 (one key too few)",
                     _v_param("window_size", lambda c: c.window_size - 1 if c.window_size > 1 else None))],
    "chunk_expansion": [("never expands to the chunk start", _v_param("expand_to_chunk", lambda c: False)),
                        ("always expands to the chunk start", _v_param("expand_to_chunk", lambda c: True))],
    "landmark_shifted": [("landmark at kpos % C == 0", _v_mask(_lmk_shift(-1))),
                         ("landmark at (kpos + 2) % C == 0", _v_mask(_lmk_shift(+1)))],
    "landmark_index": [("landmark where (j + 1) % C == 0, j the cache index", _v_mask(_lmk_index))],
    "landmark_flag": [("landmarks never masked", _v_param("mask_lmk", lambda c: False)),
                      ("landmarks always masked", _v_param("mask_lmk", lambda c: True))],
    "kv_start": [("positions start at 0 (kv_start ignored)", _v_param("kv_start", lambda c: 0))],
    "query_offset": [("queries at the first Lq positions (qpos = kv_start + i)", _v_mask(_query_first))],
    "gqa": [("query head h reads key/value head h % Hkv",
             _gqa_variant(lambda c: torch.arange(c.Hq) % c.Hkv))],
    "default_scale": [("default 1/sqrt(Dv)", _default_scale(lambda c: 1.0 / math.sqrt(c.Dv))),
                      ("default 1", _default_scale(lambda c: 1.0)),
                      ("default 1/Dqk", _default_scale(lambda c: 1.0 / c.Dqk)),
                      ("default log2(e)/sqrt(Dqk) (exp2 scale folded twice)",
                       _default_scale(lambda c: 1.0 / (_LN2 * math.sqrt(c.Dqk))))],
    "explicit_scale": [("explicit sm_scale replaced by 1/sqrt(Dqk)", _explicit_ignored)],
}


# ------------------------------------------------------------ running things

@dataclass
class Run:
    o: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    error: BaseException | None = None
    modified: tuple[str, ...] = ()  # the inputs the call wrote into (restored after it)


@dataclass
class CaseTruth:
    case: Case
    inputs: tuple
    golden: tuple          # float64 on CPU
    expected: object       # conformance.verdict.Expected
    predictions: dict      # (rule, variant index) -> (o, lse) float64 CPU, or None (= SPEC)

    @property
    def bound(self) -> tol.Bound:
        """The case's max-error tolerance, from :attr:`expected`."""
        return tol.bound(self.expected)


_TRUTH_CACHE: dict[tuple[str, str], CaseTruth] = {}


def truth(case: Case, device) -> CaseTruth:
    """Inputs, golden output, tolerance and every hypothesis' prediction of a case (cached)."""
    key = (case.name + repr(case), str(device))
    if key in _TRUTH_CACHE:
        return _TRUTH_CACHE[key]
    q, k, v = make_inputs(case, device)
    exp = verdict.expected(q, k, v, dict(case.kwargs))
    g = (exp.o, exp.lse)
    g_cpu = tuple(x.double().cpu() for x in g)
    preds = {}
    for rule, variants in EXACT.items():
        for vi, (_, fn) in enumerate(variants):
            p = fn(case, q, k, v, g)
            preds[(rule, vi)] = None if p is None else tuple(x.double().cpu() for x in p)
    t = CaseTruth(case, (q, k, v), g_cpu, exp, preds)
    _TRUTH_CACHE[key] = t
    return t


def run_backend(fn, t: CaseTruth) -> Run:
    """One call, its outputs allocated poisoned as in the suite (``runner.poisoned_empty``:
    an element never written is NaN, not whatever the memory held) and its inputs checked
    unchanged afterwards (restored when not)."""
    from conformance.runner import input_snapshot, poisoned_empty, restore_modified

    q, k, v = t.inputs
    saved = input_snapshot(q, k, v)
    try:
        with poisoned_empty():
            o, lse = fn(q, k, v, **t.case.kwargs)
        run = Run(o=o, lse=lse)
    except Exception as e:  # reported, never hidden: it becomes this case's finding
        run = Run(error=e)
    run.modified = tuple(restore_modified(q, k, v, saved))
    return run


def _fmt_rows(rows: list[int]) -> str:
    if not rows:
        return "-"
    spans, start, prev = [], rows[0], rows[0]
    for r in rows[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(f"{start}" if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(spans)


@dataclass
class CaseResult:
    case: Case
    run: Run
    cmp: tol.RowCompare | None
    meta: list[str]        # dtype problems
    verdict: object = None  # conformance.verdict.Verdict of the case (None when the call raised)

    @property
    def ok(self) -> bool:
        """The outputs pass (the inputs left unchanged is :attr:`Diagnosis.conforms`'s)."""
        if self.run.error is not None or self.cmp is None or not self.cmp.ok or self.meta:
            return False
        return self.verdict.status == "pass"  # set whenever the call returned

    def summary(self, b: tol.Bound) -> str:
        if self.run.error is not None:
            return f"raised {type(self.run.error).__name__}: {_first_line(self.run.error)[:80]}"
        c = self.cmp
        parts = []
        if not c.shape_ok:
            parts.append(c.detail)
        else:
            bad = [int(i) for i in (~c.row_ok).nonzero().flatten()]
            if bad:
                oe = float(c.o_err[bad].max())
                le = float(c.lse_err[bad].max())
                nan = " NaN" if bool(c.nan_rows.any()) else ""
                parts.append(f"rows {_fmt_rows(bad)} of {len(c.row_ok)}:{nan} max|o err| {oe:.2g} "
                             f"(tol {b.o:.2g}), max|lse err| {le:.2g} (tol {b.lse:.2g})")
        parts += self.meta
        if not parts and self.verdict.status != "pass":
            parts += [_first_line(p)[:160] for p in self.verdict.problems[:2]]
        return "; ".join(parts) if parts else "ok"


def _meta(run: Run, case: Case) -> list[str]:
    out = []
    if run.o is not None and run.o.dtype != case.dtype:
        out.append(f"o.dtype {dtype_name(run.o.dtype)}, expected {dtype_name(case.dtype)}")
    if run.lse is not None and run.lse.dtype != torch.float32:
        out.append(f"lse.dtype {dtype_name(run.lse.dtype)}, expected float32")
    return out


def _cmp(run: Run, expect: tuple, b: tol.Bound) -> tol.RowCompare | None:
    if run.error is not None or run.o is None:
        return None
    return tol.compare(run.o, run.lse, expect[0], expect[1], b)


# --------------------------------------------------------------- diagnosis

@dataclass
class Finding:
    rule: str
    evidence: str


@dataclass
class Diagnosis:
    """How one backend stands against SPEC.md on the case set."""

    name: str
    results: dict[str, CaseResult]
    truths: dict[str, CaseTruth]
    validation: list[str]                        # bad inputs not refused with ValueError
    unsupported: dict[str, str] = field(default_factory=dict)  # case -> the backend's UnsupportedConfig
    explained_by: Finding | None = None          # the single rule explaining every difference
    also: list[Finding] = field(default_factory=list)
    per_case: dict[str, list[str]] = field(default_factory=dict)  # failing case -> rules consistent with it
    probes: list = field(default_factory=list)   # (config, ProbeResult | Exception)
    documented: dict[str, str] = field(default_factory=dict)  # case -> why: a registry Deviation, undone
    # failing case -> its own configuration probed (hils-swa probe): the (Lq, Lk) cells where the
    # recovered mask differs from SPEC's, or the exception the probe raised
    case_probes: dict[str, object] = field(default_factory=dict)
    spec: str = ""  # what --backend resolves to this backend (registry.spec_of), for the commands shown
    device: str = "cpu"

    @property
    def conforms(self) -> bool:
        return not self.validation and not self.modified and all(r.ok for r in self.results.values())

    @property
    def modified(self) -> dict[str, tuple[str, ...]]:
        """case -> the inputs the backend wrote into during that case's call."""
        return {n: r.run.modified for n, r in self.results.items() if r.run.modified}

    def failing(self) -> list[str]:
        return [n for n, r in self.results.items() if not r.ok]


def _check_validation(fn, device) -> list[str]:
    bad = []
    for what, make in BAD_INPUTS:
        (q, k, v), kw = make(device)
        try:
            fn(q, k, v, **kw)
        except ValueError:
            continue
        except Exception as e:
            bad.append(f"{what}: raised {type(e).__name__} ({_first_line(e)[:70]}), expected ValueError")
            continue
        bad.append(f"{what}: accepted, expected ValueError")
    return bad


def _values_ok(r: CaseResult) -> bool:
    return r.run.error is None and r.cmp is not None and r.cmp.ok


def _exact(rule: str, d: Diagnosis) -> Finding | None:
    """An exact hypothesis explains ``d`` when one of its variants predicts
    every case (and differs from the SPEC on at least one)."""
    for vi, (text, _) in enumerate(EXACT[rule]):
        differs = False
        ok = True
        for name, r in d.results.items():
            t = d.truths[name]
            pred = t.predictions[(rule, vi)]
            if r.meta or r.run.error is not None:
                ok = False
                break
            if pred is None:
                if not r.cmp.ok:
                    ok = False
                    break
                continue
            c = _cmp(r.run, pred, t.bound)
            if not c.ok:
                ok = False
                break
            differs = differs or not r.cmp.ok
        if ok and differs:
            cases = [n for n, r in d.results.items() if not r.ok]
            return Finding(rule, f"{text}: predicts the output on all {len(d.results)} cases "
                                 f"(differs from the SPEC on {', '.join(cases)})")
    return None


def _rows_failing(r: CaseResult) -> torch.Tensor | None:
    if r.run.error is not None or r.cmp is None or not r.cmp.shape_ok:
        return None
    return ~r.cmp.row_ok


def _sig_inputs(d: Diagnosis) -> Finding | None:
    if d.modified and all(r.ok for r in d.results.values()):
        ex = [f"{n}: {', '.join(names)}" for n, names in d.modified.items()]
        return Finding("inputs", f"outputs within tolerance, but the call wrote into its inputs on "
                       f"{len(ex)} cases ({'; '.join(ex[:3])}{' ...' if len(ex) > 3 else ''})")
    return None


def _sig_validation(d: Diagnosis) -> Finding | None:
    if d.validation and all(r.ok for r in d.results.values()):
        return Finding("validation", "; ".join(d.validation[:4]) + (" ..." if len(d.validation) > 4 else ""))
    return None


def _sig_output_dtype(d: Diagnosis) -> Finding | None:
    if d.validation:
        return None
    if all(_values_ok(r) for r in d.results.values()) and any(r.meta for r in d.results.values()):
        ex = [f"{n}: {'; '.join(r.meta)}" for n, r in d.results.items() if r.meta]
        return Finding("output_dtype", "values within tolerance, but " + "; ".join(ex[:2]))
    return None


#: an error above this share of the output scale (:func:`_out_scale`) is no rounding: a
#: precision bug stays under it, an unwritten row or a wrong rule goes over
_WILD = 0.25


def _out_scale(golden_o: torch.Tensor) -> float:
    """The output scale errors are measured against: max |golden o| over finite entries, at least 1."""
    fin = torch.isfinite(golden_o)
    return max(1.0, float(golden_o[fin].abs().max())) if bool(fin.any()) else 1.0


def _sig_unwritten(d: Diagnosis) -> Finding | None:
    if d.validation:
        return None
    tails = []
    proper = False
    for name, r in d.results.items():
        if r.meta:
            return None
        bad = _rows_failing(r)
        if bad is None:
            return None
        if not bool(bad.any()):
            continue
        # an unwritten row holds poison, garbage or fresh zeros, not a value a rounding away
        # from golden: every failing row NaN, all zero, or off by a quarter of the output scale
        g = d.truths[name].golden
        zero = (r.run.o.float() == 0).flatten(0, 1).all(dim=0).all(dim=-1).cpu()  # (Lq,)
        wild = (r.cmp.nan_rows | ~torch.isfinite(r.cmp.o_err) | zero
                | (r.cmp.o_err > _WILD * _out_scale(g[0])))
        if not bool(wild[bad].all()):
            return None
        # rows whose golden is NaN (a NaN key they see) match an unwritten NaN row: part of any tail
        bad = bad | torch.isnan(g[1]).any(dim=0).any(dim=0)
        rows = bad.nonzero().flatten()
        r0 = int(rows[0])
        if not bool(bad[r0:].all()):
            return None  # not a tail
        tails.append(f"{name}: rows {r0}-{len(bad) - 1} of {len(bad)}")
        proper = proper or r0 > 0
    if tails and proper:
        return Finding("unwritten_rows", "only a tail of the query range fails: " + "; ".join(tails))
    return None


def _sig_empty_rows(d: Diagnosis) -> Finding | None:
    if d.validation:
        return None
    seen = []
    for name, r in d.results.items():
        if r.meta:
            return None
        bad = _rows_failing(r)
        if bad is None:
            return None
        if not bool(bad.any()):
            continue
        empty = torch.isneginf(d.truths[name].golden[1]).all(dim=(0, 1))  # rows with no visible key
        if bool((bad & ~empty).any()):
            return None
        seen.append(f"{name}: rows {_fmt_rows([int(i) for i in bad.nonzero().flatten()])}")
    if seen:
        return Finding("empty_rows", "only rows with no visible key differ: " + "; ".join(seen))
    return None


def _sig_nan_v_spread(d: Diagnosis) -> Finding | None:
    """Only the ``nan_v`` case differs, and undoing exactly the spread there (NaN where
    golden is finite, in the columns of the non-finite seen ``v`` and the heads reading
    it: ``conformance.registry.forgive_nan_v_spread``) leaves it conforming."""
    from conformance.registry import forgive_nan_v_spread

    if d.validation or d.failing() != ["nan_v"]:
        return None
    r, t = d.results["nan_v"], d.truths["nan_v"]
    if r.run.error is not None:
        return None
    o2, l2 = forgive_nan_v_spread(r.run.o, r.run.lse, *t.inputs, dict(r.case.kwargs), t.expected)
    if verdict.judge(o2, l2, t.expected).status != verdict.PASS:
        return None
    return Finding("nan_v_spread", "only the case with NaN and infinities in the v row of a key some rows see "
                   "differs, and undoing the spread of those values to the rows that do not see it leaves "
                   "it conforming (nan_v)")


def _sig_only(rule: str, pick: Callable[[Case], bool], text: str, need_nan: bool = False,
              empty_rows_may_fail: bool = False):
    def sig(d: Diagnosis) -> Finding | None:
        if d.validation:
            return None
        hit, extra = [], []
        for name, r in d.results.items():
            if pick(r.case):
                if not r.ok:
                    if need_nan and not (r.cmp is not None and bool(r.cmp.nan_rows.any())):
                        return None
                    hit.append(name)
            elif not r.ok:
                bad = _rows_failing(r)
                empty = torch.isneginf(d.truths[name].golden[1]).all(dim=(0, 1))
                if empty_rows_may_fail and bad is not None and not r.meta and not bool((bad & ~empty).any()):
                    extra.append(name)
                    continue
                return None
        if hit:
            more = (f"; rows with no visible key also differ ({', '.join(extra)}): the same masking by "
                    f"adding -inf, whose empty rows give exp(-inf + inf) = NaN") if extra else ""
            return Finding(rule, f"{text} ({', '.join(hit)}){more}; every other case conforms")
        return None
    return sig


def _sig_low_precision(d: Diagnosis) -> Finding | None:
    """Small, NaN-free errors with the right mask (the failing cases' own configurations
    probed), larger than the tolerance, where the 256-key fp32 'long' case fails or only
    16-bit cases do: an accumulator, or scores, narrower than the SPEC's fp32."""
    if d.validation:
        return None
    worst = 0.0
    long_fails = False
    failing = d.failing()
    for name, r in d.results.items():
        if r.meta or r.run.error is not None or r.cmp is None or not r.cmp.shape_ok:
            return None
        if r.ok:
            continue
        if bool(r.cmp.nan_rows.any()) or not bool(torch.isfinite(r.cmp.o_err).all()):
            return None
        rel = float(r.cmp.o_err.max()) / _out_scale(d.truths[name].golden[0])
        lerr = r.cmp.lse_err[torch.isfinite(r.cmp.lse_err)]
        if rel > _WILD or (lerr.numel() and float(lerr.max()) > _WILD):
            return None
        worst = max(worst, rel)
        long_fails = long_fails or name == "long"
    masks_ok = all(not isinstance(p, BaseException) and bool(torch.equal(p.mask, _ref_probe_mask(cfg)))
                   for cfg, p in d.probes) if d.probes else True
    probed = [n for n, x in d.case_probes.items() if isinstance(x, torch.Tensor)]
    if _case_probe_differs(d):
        return None  # a failing case's own mask is wrong: not a precision bug
    only16 = bool(failing) and all(d.results[n].case.dtype != torch.float32 for n in failing)
    if (long_fails or only16) and masks_ok:
        where = (f"the masks of {', '.join(probed)} probed right" if probed else "mask right (probe)")
        which = ("the 256-key 'long' case fails" if long_fails else
                 f"only 16-bit cases fail ({', '.join(failing)}), every fp32 case conforms")
        return Finding("low_precision", f"{where}, no NaN, errors small but beyond tolerance "
                                        f"(worst {worst:.2g} of the output scale); {which}")
    return None


def _ref_probe_mask(cfg: dict) -> torch.Tensor:
    c = dict(cfg)
    return visibility_mask(c.pop("Lq"), c.pop("Lk"), **c)


# In priority order: structural signatures, then exact hypotheses, then the
# signatures that only look at which cases fail.
HYPOTHESES: list[tuple[str, Callable[[Diagnosis], Finding | None]]] = [
    ("inputs", _sig_inputs),
    ("validation", _sig_validation),
    ("output_dtype", _sig_output_dtype),
    ("unwritten_rows", _sig_unwritten),
    ("empty_rows", _sig_empty_rows),
] + [(rule, (lambda rr: (lambda d: _exact(rr, d)))(rule)) for rule in EXACT] + [
    ("positions", _sig_only("positions", lambda c: max(c.kv_start, c.window_size, c.chunk_size) >= _HUGE,
                            "only the cases whose kv_start, window or chunk int64 cannot hold differ "
                            "(or raise)")),
    ("strides", _sig_only("strides", lambda c: c.layout != "canonical",
                          "only strided inputs differ")),
    # nan_v_spread before nan_leak: a backend that only spreads a seen v's NaN over its
    # tile fails the nan_v case alone; one that leaks unseen slots fails "nan" too
    ("nan_v_spread", _sig_nan_v_spread),
    ("nan_leak", _sig_only("nan_leak", lambda c: c.nan_unseen or c.nan_seen or c.nan_v,
                           "only the cases with NaN in slots some rows do not see differ, and their output "
                           "holds NaN", need_nan=True, empty_rows_may_fail=True)),
    ("nan_propagation", _sig_only("nan_propagation", lambda c: c.nan_seen,
                                  "only the case with NaN in a key some rows see differs")),
    ("low_precision", _sig_low_precision),
]


def _consistent(rule: str, name: str, d: Diagnosis) -> bool:
    """Whether one failing case alone is consistent with an exact hypothesis."""
    r, t = d.results[name], d.truths[name]
    if r.run.error is not None or r.cmp is None:
        return False
    for vi in range(len(EXACT[rule])):
        pred = t.predictions[(rule, vi)]
        if pred is not None and _cmp(r.run, pred, t.bound).ok:
            return True
    return False


#: how many failing cases are probed with their own configuration, and the largest (Lq * Lk)
_CASE_PROBES = 6
_CASE_PROBE_CELLS = 320 * 320


def _probe_failing_cases(fn, d: Diagnosis, device) -> None:
    """Probe each failing case's own configuration (zero queries, one-hot values): a mask
    bug the fixed probes cannot show (a window too short to reach a landmark, a cap on
    the key loop) shows there, row by row."""
    from .probe import probe_mask

    for n in d.failing()[:_CASE_PROBES]:
        c = d.results[n].case
        if c.Lq * c.Lk > _CASE_PROBE_CELLS or d.results[n].run.error is not None:
            continue
        try:
            got = probe_mask(fn, c.Lq, c.Lk, device=device, dtype=c.dtype, head_dim=c.Dqk, **c.rule).mask
        except Exception as e:  # noqa: BLE001 -- reported with the probe, never hidden
            d.case_probes[n] = e
            continue
        d.case_probes[n] = got != visibility_mask(c.Lq, c.Lk, **c.rule)


def _case_probe_differs(d: Diagnosis) -> list[str]:
    return [n for n, x in d.case_probes.items() if isinstance(x, torch.Tensor) and bool(x.any())]


def diagnose(backend, device="cpu", *, cases=CASES, probes=PROBES, probe_masks: bool = True) -> Diagnosis:
    """Run ``backend`` (a registry ``Backend`` or a canonical function) on the
    case set and explain its differences from SPEC.md."""
    fn = getattr(backend, "fn", backend)
    name = getattr(backend, "name", getattr(fn, "__name__", "backend"))
    deviation = getattr(backend, "deviation", None)
    results, truths, unsupported, documented = {}, {}, {}, {}
    for case in cases:
        t = truth(case, device)
        run = run_backend(fn, t)
        if isinstance(run.error, reference.UnsupportedConfig):
            unsupported[case.name] = _first_line(run.error)
            continue
        v = None if run.error is not None else verdict.judge(run.o, run.lse, t.expected)
        dev = deviation(case.as_conformance_case(device)) if deviation is not None and v is not None else None
        if dev is not None and v.status == verdict.FAIL:
            # a documented bug (conformance.registry): undone by the suite's own rule; a case
            # that is not exactly that bug is left out of the evidence (its other difference
            # cannot be told from the documented one) and listed
            documented[case.name] = dev.why
            undone = dev.undo(v, run.o, run.lse, *t.inputs, dict(case.kwargs), t.expected)
            if undone is None:
                unsupported[case.name] = "documented deviation plus another difference: not used as evidence"
                continue
            run = Run(o=undone[0], lse=undone[1])
            v = verdict.judge(run.o, run.lse, t.expected)
        results[case.name] = CaseResult(case, run, _cmp(run, t.golden, t.bound), _meta(run, case), v)
        truths[case.name] = t
    from conformance.registry import Backend, spec_of

    d = Diagnosis(name=name, results=results, truths=truths, validation=_check_validation(fn, device),
                  unsupported=unsupported, documented=documented,
                  spec=spec_of(backend) if isinstance(backend, Backend) else name, device=str(device))
    if probe_masks:
        from .probe import probe_mask

        for cfg in probes:
            c = dict(cfg)
            try:
                d.probes.append((cfg, probe_mask(fn, c.pop("Lq"), c.pop("Lk"), device=device, **c)))
            except Exception as e:
                d.probes.append((cfg, e))
    if d.conforms:
        return d
    if probe_masks:
        _probe_failing_cases(fn, d, device)
    found = []
    for rule, hyp in HYPOTHESES:
        f = hyp(d)
        if f is not None:
            found.append(f)
    if found:
        d.explained_by, d.also = found[0], found[1:]
    for n in d.failing():
        d.per_case[n] = [rule for rule in EXACT if _consistent(rule, n, d)]
    return d


# ----------------------------------------------------------- A against B

@dataclass
class Comparison:
    a: Diagnosis
    b: Diagnosis
    case_agree: dict[str, bool]
    row_err: dict[str, torch.Tensor]   # per-row max |o_B - o_A| / tol (B against A)
    equivalent: bool


def _agree(ra: CaseResult, rb: CaseResult, b: tol.Bound) -> tuple[bool, torch.Tensor]:
    if ra.run.error is not None or rb.run.error is not None:
        same = (ra.run.error is not None) and (rb.run.error is not None) and \
            type(ra.run.error) is type(rb.run.error)
        return same, torch.full((ra.case.Lq,), 0.0 if same else float("inf"))
    if ra.meta != rb.meta:
        return False, torch.zeros(ra.case.Lq)
    both = tol.Bound(o=2 * b.o, lse=2 * b.lse)  # each side may carry its own rounding
    c = tol.compare(rb.run.o, rb.run.lse, ra.run.o.double().cpu(), ra.run.lse.double().cpu(), both)
    err = c.o_err / max(both.o, 1e-300)
    return c.ok, err


def compare_backends(a, b, device="cpu", **kw) -> Comparison:
    da = diagnose(a, device, **kw)
    db = diagnose(b, device, **kw)
    agree, errs = {}, {}
    for name in da.results:
        if name not in db.results:
            continue
        ok, err = _agree(da.results[name], db.results[name], da.truths[name].bound)
        agree[name], errs[name] = ok, err
    eq = (bool(agree) and all(agree.values()) and (bool(da.validation) == bool(db.validation))
          and (bool(da.modified) == bool(db.modified)))
    return Comparison(da, db, agree, errs, eq)


# ---------------------------------------------------------------- reporting

def _probe_block(cmp: Comparison) -> list[str]:
    from reference import render_mask

    from .probe import diff_picture

    out = []
    for (cfg, pa), (_, pb) in zip(cmp.a.probes, cmp.b.probes):
        if isinstance(pa, BaseException) or isinstance(pb, BaseException):
            err = pa if isinstance(pa, BaseException) else pb
            out.append(f"probe {cfg}: could not recover a mask ({type(err).__name__}: {err})")
            continue
        if torch.equal(pa.mask, pb.mask):
            out.append(f"probe (Lq={cfg['Lq']} Lk={cfg['Lk']} W={cfg['window_size']} C={cfg['chunk_size']} "
                       f"kv_start={cfg['kv_start']}): masks equal ({int(pa.mask.sum())} visible pairs)")
            continue
        out.append(f"probe (Lq={cfg['Lq']} Lk={cfg['Lk']} W={cfg['window_size']} C={cfg['chunk_size']} "
                   f"kv_start={cfg['kv_start']}): masks differ in {int((pa.mask != pb.mask).sum())} cells "
                   f"(+ only {cmp.b.name} sees, - only {cmp.a.name} sees)")
        A = render_mask(pa.mask).splitlines()
        B = render_mask(pb.mask).splitlines()
        D = diff_picture(pb.mask, pa.mask).splitlines()
        w = max(cfg["Lk"], 6) + 3
        out.append(f"     {'A':<{w}}{'B':<{w}}B vs A")
        for i in range(len(A)):
            out.append(f"  {i:>2} {A[i]:<{w}}{B[i]:<{w}}{D[i]}")
    return out


def _diag_lines(d: Diagnosis) -> list[str]:
    if not d.results and d.unsupported:
        return [f"{d.name}: serves none of the cases (unsupported: {next(iter(d.unsupported.values()))})"]
    if d.conforms:
        extra = f" ({len(d.unsupported)} unsupported: {', '.join(d.unsupported)})" if d.unsupported else ""
        docs = (f"; deviates as documented on {', '.join(d.documented)} (undone before judging: "
                f"{next(iter(d.documented.values()))})") if d.documented else ""
        return [f"{d.name}: conforms to SPEC.md on all {len(d.results)} cases it serves{extra} "
                f"and the {len(BAD_INPUTS)} bad inputs{docs}"]
    out = []
    if d.explained_by is not None:
        f = d.explained_by
        out.append(f"{d.name}: differs from SPEC.md in ONE rule on diff's cases: [{f.rule}] {RULES[f.rule]}")
        out.append(f"    evidence: {f.evidence}")
        for g in d.also:
            out.append(f"    also consistent with [{g.rule}]: {g.evidence}")
        if d.validation and f.rule != "validation":
            out.append(f"    note: bad inputs not refused (may follow from the same bug): {'; '.join(d.validation[:3])}")
    else:
        errs = {f"{type(r.run.error).__name__}: {_first_line(r.run.error)[:160]}"
                for r in d.results.values() if r.run.error is not None}
        if len(errs) == 1 and all(r.run.error is not None for r in d.results.values()):
            out.append(f"{d.name}: every case raised the same error, nothing to diagnose: {errs.pop()}")
            return out
        out.append(f"{d.name}: differs from SPEC.md; no single rule explains every difference")
        if d.validation:
            out.append(f"    [validation] {'; '.join(d.validation[:3])}")
        for n, rules in d.per_case.items():
            r = d.results[n]
            hint = f"consistent with {', '.join(rules)}" if rules else "no single-rule hypothesis predicts it"
            out.append(f"    {n}: {r.summary(d.truths[n].bound)} -- {hint}")
    return out + _case_probe_lines(d)


def _probe_command(name: str, c: Case, device: str) -> str:
    """The ``hils-swa probe`` command of a case's own configuration, as diff probed it."""
    flags = ("" if c.kv_start == 0 else f" --kv-start {c.kv_start}") + \
            ("" if c.mask_lmk else " --no-mask-lmk") + ("" if c.expand_to_chunk else " --no-expand")
    return (f"hils-swa probe {name} --lq {c.Lq} --lk {c.Lk} --window {c.window_size} --chunk {c.chunk_size}"
            f"{flags} --dtype {dtype_name(c.dtype)} --head-dim {c.Dqk} --device {device}")


def _case_probe_lines(d: Diagnosis) -> list[str]:
    """One line per failing case probed with its own configuration."""
    out = []
    for n, x in d.case_probes.items():
        c = d.results[n].case
        where = f"probe of case {n} (Lq={c.Lq} Lk={c.Lk} W={c.window_size} C={c.chunk_size} kv_start={c.kv_start})"
        if isinstance(x, BaseException):
            out.append(f"    {where}: could not recover a mask ({type(x).__name__}: {_first_line(x)[:80]})")
        elif bool(x.any()):
            rows = [int(i) for i in x.any(dim=1).nonzero().flatten()]
            out.append(f"    {where}: the mask differs from SPEC's in {int(x.sum())} cells, rows "
                       f"{_fmt_rows(rows)}; see it: {_probe_command(shlex.quote(d.spec or d.name), c, d.device)}")
        else:
            out.append(f"    {where}: the mask is SPEC's (the difference is in the values)")
    return out


def format_report(cmp: Comparison, device: str, verbose: bool = False) -> str:
    a, b = cmp.a, cmp.b
    w = max(12, len(a.name), len(b.name)) + 2
    lines = [f"hils-swa diff {a.name} {b.name}  ({device}, {len(a.results)} cases against reference.golden "
             f"under the conformance tolerance; the last two rows: {len(BAD_INPUTS)} bad inputs must raise "
             f"ValueError, the inputs must be left unchanged)", ""]
    lines.append(f"{'case':<10} {'A: ' + a.name:<{w + 3}} {'B: ' + b.name:<{w + 3}} B~A  what it isolates")
    for case in CASES:
        name = case.name
        if name not in a.results and name not in a.unsupported:
            continue
        ra, rb = a.results.get(name), b.results.get(name)
        sa = (("FAIL+documented" if name in a.documented else "unsupported") if ra is None
              else ("documented" if name in a.documented else "ok") if ra.ok else "FAIL")
        sb = (("FAIL+documented" if name in b.documented else "unsupported") if rb is None
              else ("documented" if name in b.documented else "ok") if rb.ok else "FAIL")
        same = "-" if name not in cmp.case_agree else "yes" if cmp.case_agree[name] else "NO"
        lines.append(f"{name:<10} {sa:<{w + 3}} {sb:<{w + 3}} {same:<4} {case.purpose}")
    lines.append(f"{'errors':<10} {'ok' if not a.validation else 'FAIL':<{w + 3}} "
                 f"{'ok' if not b.validation else 'FAIL':<{w + 3}} "
                 f"{'yes' if bool(a.validation) == bool(b.validation) else 'NO ':<4} bad inputs raise ValueError")
    lines.append(f"{'inputs':<10} {'ok' if not a.modified else 'FAIL':<{w + 3}} "
                 f"{'ok' if not b.modified else 'FAIL':<{w + 3}} "
                 f"{'yes' if bool(a.modified) == bool(b.modified) else 'NO ':<4} q, k, v unchanged by the call")
    failing = [(d, n) for d in (a, b) for n in d.failing()]
    if failing and (verbose or len(failing) <= 12):
        lines += ["", "details:"]
        for d, n in failing:
            lines.append(f"  {d.name} / {n}: {d.results[n].summary(d.truths[n].bound)}")
    elif failing:
        lines += ["", f"details: {len(failing)} failing cases, not listed (-v lists them)"]
    for d in (a, b):
        for n, why in d.unsupported.items():
            lines.append(f"  {d.name} does not serve case {n}: {why}")
    lines.append("")
    lines += _probe_block(cmp)
    lines.append("")
    lines += _diag_lines(a)
    lines += _diag_lines(b)
    lines.append("")
    idle = [d.name for d in (a, b) if not d.results and d.unsupported]
    if idle:
        lines.append(f"result: NOTHING COMPARED: {' and '.join(idle)} served none of the "
                     f"{len(CASES)} cases (all unsupported on {device})")
    elif cmp.equivalent:
        scope = (f"on diff's {len(a.results)} cases (small inputs, one rule each; `hils-swa conform` "
                 f"runs the whole case set, and a bug outside these cases shows only there)")
        if a.conforms:
            lines.append(f"result: EQUIVALENT: both conform to SPEC.md {scope}")
        else:
            lines.append(f"result: EQUIVALENT: {a.name} and {b.name} agree on every case (both deviate the "
                         f"same way) {scope}")
    else:
        rules_a = {a.explained_by.rule} if a.explained_by else set()
        rules_b = {b.explained_by.rule} if b.explained_by else set()
        diff = sorted(rules_a ^ rules_b)
        if diff:
            lines.append("result: DIFFERENT: the rule that differs: "
                         + "; ".join(f"[{r}] {RULES[r]}" for r in diff))
        else:
            bad = [n for n, ok in cmp.case_agree.items() if not ok]
            lines.append(f"result: DIFFERENT on cases {', '.join(bad) or 'errors'}; no single SPEC rule explains it")
    return "\n".join(lines)


def write_png(cmp: Comparison, path: str) -> None:
    """Visibility difference of the probes and per-row error of B against A."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    probes = [(cfg, pa, pb) for (cfg, pa), (_, pb) in zip(cmp.a.probes, cmp.b.probes)
              if not isinstance(pa, BaseException) and not isinstance(pb, BaseException)]
    if not cmp.row_err:
        return
    n_cases = len(cmp.row_err)
    cap = 72  # rows drawn per case: the long case would squash the others
    max_lq = min(cap, max(len(e) for e in cmp.row_err.values()))
    fig, axes = plt.subplots(1, 1 + len(probes), figsize=(6 + 4 * len(probes), 0.35 * n_cases + 2.5),
                             gridspec_kw=dict(width_ratios=[2.5] + [1] * len(probes)))
    axes = list(axes) if hasattr(axes, "__len__") else [axes]
    ax = axes[0]
    img = torch.full((n_cases, max_lq), float("nan"), dtype=torch.float64)
    labels = []
    for i, (n, e) in enumerate(cmp.row_err.items()):
        e = e.double().clone()
        e[torch.isinf(e)] = 1e6
        # a case longer than the cap: the cap's rows around its worst row, so a difference
        # past row cap - 1 is drawn, not left out
        start = max(0, min(int(torch.nan_to_num(e, nan=1e6).argmax()) - cap // 2, len(e) - cap))
        labels.append(f"{n}{f' (rows {start}-{start + cap - 1} of {len(e)})' if len(e) > cap else ''}"
                      f"{'' if cmp.case_agree[n] else ' (differs)'}")
        e = e[start:start + cap]
        img[i, : len(e)] = torch.log10(torch.clamp(e, min=1e-3))
    im = ax.imshow(img.numpy(), aspect="auto", cmap="magma", vmin=-3, vmax=6, interpolation="nearest")
    ax.set_yticks(range(n_cases))
    ax.set_yticklabels(labels)
    ax.set_xlabel("query row i")
    ax.set_title(f"per-row max |o_B - o_A| / tolerance (log10; >0 = beyond)\nA = {cmp.a.name}, B = {cmp.b.name}")
    fig.colorbar(im, ax=ax, fraction=0.03)
    cmap = ListedColormap(["#f4f4f4", "#3b6fb6", "#d62728", "#2ca02c"])
    for ax, (cfg, pa, pb) in zip(axes[1:], probes):
        code = torch.zeros(pa.mask.shape, dtype=torch.int64)
        code[pa.mask & pb.mask] = 1
        code[pa.mask & ~pb.mask] = 2
        code[~pa.mask & pb.mask] = 3
        ax.imshow(code.numpy(), cmap=cmap, vmin=0, vmax=3, interpolation="nearest")
        ax.set_title(f"visibility (probe) W={cfg['window_size']} C={cfg['chunk_size']} kv_start={cfg['kv_start']}\n"
                     "blue both, red only A, green only B", fontsize=9)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="hils-swa diff",
        description="Run two backends on cases that each isolate one SPEC rule and name the rule they "
                    "disagree on. Exit 0 when equivalent, 1 when not.")
    ap.add_argument("a", help="backend A (e.g. reference): name, package.module:function or mutant:NAME")
    ap.add_argument("b", nargs="?", default=None, help="backend B (default: A against reference)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    ap.add_argument("--png", default=None, help="draw the visibility difference and per-row error map here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every failing case's details")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    a_spec, b_spec = (args.a, args.b) if args.b is not None else ("reference", args.a)
    try:
        device = pick_device(args.device)
        a = resolve_backend(a_spec)
        b = resolve_backend(b_spec)
    except ValueError as e:
        print(f"hils-swa diff: {e}", file=sys.stderr)
        return 2
    cmp = compare_backends(a, b, device)
    print(format_report(cmp, device, args.verbose))
    if args.png:
        write_png(cmp, args.png)
        print(f"wrote {args.png}")
    return 0 if cmp.equivalent else 1


if __name__ == "__main__":
    sys.exit(main())
