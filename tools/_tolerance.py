"""Per-row closeness of a backend's output to an expected output, with the
conformance tolerance.

The bound of a case comes from the conformance suite's policy
(``conformance.verdict``): how far a kernel's computation in the input dtype
(``reference.same_dtype``) lands from the float64 ground truth
(``reference.golden``), times a factor, plus the dtype's rounding noise. It is
computed once per case from the unmodified problem, and the same bound is then
used to compare a backend with the golden output or with the output a
hypothesis predicts. NaN and infinities must match exactly; never a fraction of
mismatching elements.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Bound:
    o: float
    lse: float


def bound(expected) -> Bound:
    """The max-error tolerance of one case: the ``o_bound`` / ``lse_bound`` of
    the suite's ``Expected`` (``conformance.verdict.expected``), the only
    tolerance policy of the project."""
    return Bound(o=float(expected.o_bound), lse=float(expected.lse_bound))


@dataclass
class RowCompare:
    """Per-row outcome of comparing an output with an expectation."""

    row_ok: torch.Tensor      # (Lq,) bool: every (b, h, d) of the row within bound, NaN/inf patterns equal
    o_err: torch.Tensor       # (Lq,) float64: max |o - expected| of the row (inf on a pattern mismatch)
    lse_err: torch.Tensor     # (Lq,) float64
    nan_rows: torch.Tensor    # (Lq,) bool: the output has NaN where the expectation does not
    shape_ok: bool
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.shape_ok and bool(self.row_ok.all())


def _row_err(x: torch.Tensor, e: torch.Tensor, row_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Max abs error per query row; inf where NaN/inf patterns differ; rows with extra NaN."""
    x_nan, e_nan = torch.isnan(x), torch.isnan(e)
    x_inf, e_inf = torch.isinf(x), torch.isinf(e)
    pattern_bad = (x_nan != e_nan) | (x_inf != e_inf) | (x_inf & e_inf & (x != e))
    fin = torch.isfinite(x) & torch.isfinite(e)
    d = torch.where(fin, (x - e).abs(), torch.zeros((), dtype=x.dtype))
    d = torch.where(pattern_bad, torch.full((), float("inf"), dtype=x.dtype), d)
    extra_nan = x_nan & ~e_nan
    dims = [i for i in range(x.dim()) if i != row_dim]
    if dims:
        d = d.amax(dim=dims)
        extra_nan = extra_nan.any(dim=dims[-1])
        for dd in reversed(dims[:-1]):
            extra_nan = extra_nan.any(dim=dd)
    return d, extra_nan, pattern_bad


def compare(o, lse, expect_o, expect_lse, b: Bound) -> RowCompare:
    """Compare a backend's ``(o, lse)`` with an expected pair, row by row."""
    eo, el = expect_o.double().cpu(), expect_lse.double().cpu()
    Lq = eo.shape[2]
    if tuple(o.shape) != tuple(eo.shape) or tuple(lse.shape) != tuple(el.shape):
        nan = torch.full((Lq,), float("inf"), dtype=torch.float64)
        return RowCompare(torch.zeros(Lq, dtype=torch.bool), nan, nan.clone(), torch.zeros(Lq, dtype=torch.bool),
                          False, f"shape o {tuple(o.shape)} lse {tuple(lse.shape)}, expected "
                                 f"{tuple(eo.shape)} and {tuple(el.shape)}")
    xo, xl = o.detach().double().cpu(), lse.detach().double().cpu()
    o_err, o_nan, _ = _row_err(xo, eo, 2)
    l_err, l_nan, _ = _row_err(xl, el, 2)
    row_ok = (o_err <= b.o) & (l_err <= b.lse)
    return RowCompare(row_ok, o_err, l_err, o_nan | l_nan, True)
