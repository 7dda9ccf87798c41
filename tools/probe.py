"""``hils-swa probe``: recover a backend's effective visibility mask as a black box.

    hils-swa probe BACKEND --lq 8 --lk 12 --window 3 --chunk 4 [--kv-start 5]
                   [--no-mask-lmk] [--no-expand] [--device cpu|cuda] [--dtype fp32|bf16|fp16]

How it reads the mask without looking inside the backend:

* the queries are all zero, so every score is exactly 0 and the softmax of row
  ``i`` is uniform, ``1 / n_i``, over the keys the backend lets row ``i`` see;
* the values are one-hot: key ``j`` carries ``e_j`` (split over heads when the
  keys outnumber the head dim: head ``h`` carries keys ``h*D .. h*D + D - 1``),
  so ``o[i, j] = 1 / n_i`` exactly when row ``i`` averaged key ``j``, else 0;
* ``lse_i`` must then be ``log(n_i)`` (``-inf`` for an empty row): that checks
  the LSE's base and the empty-row convention on the way.

The recovered mask is printed next to the reference's
(:func:`reference.visibility_mask`, drawn with :func:`reference.render_mask`),
with a third picture marking every cell where they differ. Exit status 0 when
the masks are equal (and the LSE checks out), 1 when not, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field

import torch

__all__ = ["ProbeResult", "probe_mask", "reference_masks", "format_report", "main"]

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
# Head dims tried in turn when the caller does not fix one: the common
# kernel-supported sizes first (a backend may serve only a few).
_HEAD_DIMS = (64, 128, 32, 16, 256)


@dataclass
class ProbeResult:
    """What a probe recovered from one backend."""

    mask: torch.Tensor                     # (Lq, Lk) bool: keys the backend averaged
    weights: torch.Tensor                  # (Lq, Lk) float64: o[i, j] as read back
    lse: torch.Tensor                      # (Lq,) float64 as returned
    head_dim: int
    dtype: torch.dtype
    calls: int
    problems: list[str] = field(default_factory=list)  # LSE / weight / dtype anomalies

    @property
    def counts(self) -> torch.Tensor:
        return self.mask.sum(dim=1)


def reference_masks(Lq, Lk, *, window_size, chunk_size, mask_lmk=True, expand_to_chunk=True,
                    kv_start=0):
    """The reference's mask of a call and its window without the landmark rule
    (for drawing landmarks as ``L``)."""
    from reference import visibility_mask

    kw = dict(window_size=window_size, chunk_size=chunk_size, expand_to_chunk=expand_to_chunk,
              kv_start=kv_start)
    return (visibility_mask(Lq, Lk, mask_lmk=mask_lmk, **kw),
            visibility_mask(Lq, Lk, mask_lmk=False, **kw))


def _call(fn, q, k, v, rule):
    out = fn(q, k, v, **rule)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"backend returned {type(out).__name__}, expected an (o, lse) tuple")
    return out


def _probe_once(fn, Lq, Lk, D, rule, device, dtype, heads_per_call):
    """All keys of one probe with head dim ``D``; returns (weights, lse, calls, problems)."""
    n_heads = max(1, math.ceil(Lk / D))
    weights = torch.zeros(Lq, Lk, dtype=torch.float64)
    lse_rows = []
    problems: list[str] = []
    calls = 0
    for h0 in range(0, n_heads, heads_per_call):
        h1 = min(n_heads, h0 + heads_per_call)
        H = h1 - h0
        q = torch.zeros(1, H, Lq, D, dtype=dtype, device=device)
        # Keys are finite and distinct; with q = 0 their values do not matter.
        k = torch.linspace(-1, 1, H * Lk * D, dtype=torch.float32).reshape(1, H, Lk, D).to(device, dtype)
        v = torch.zeros(1, H, Lk, D, dtype=dtype, device=device)
        for hh in range(H):
            for d in range(D):
                j = (h0 + hh) * D + d
                if j < Lk:
                    v[0, hh, j, d] = 1
        o, lse = _call(fn, q, k, v, rule)
        calls += 1
        if tuple(o.shape) != (1, H, Lq, D):
            raise ValueError(f"backend returned o of shape {tuple(o.shape)}, expected {(1, H, Lq, D)}")
        if tuple(lse.shape) != (1, H, Lq):
            raise ValueError(f"backend returned lse of shape {tuple(lse.shape)}, expected {(1, H, Lq)}")
        if o.dtype != dtype:
            problems.append(f"o.dtype is {o.dtype}, expected {dtype}")
        if lse.dtype != torch.float32:
            problems.append(f"lse.dtype is {lse.dtype}, expected torch.float32")
        o = o.detach().to("cpu", torch.float64)
        lse = lse.detach().to("cpu", torch.float64)
        for hh in range(H):
            for d in range(D):
                j = (h0 + hh) * D + d
                if j < Lk:
                    weights[:, j] = o[0, hh, :, d]
        lse_rows.append(lse[0])
    # Every head of every call saw the same rows (q = 0 everywhere): its lse must agree.
    lse_all = torch.cat([x for x in lse_rows], dim=0)  # (n_heads, Lq)
    lse0 = lse_all[0]
    same = (lse_all == lse0) | (torch.isnan(lse_all) & torch.isnan(lse0)) | ((lse_all - lse0).abs() <= 1e-3)
    if not bool(same.all()):
        problems.append("lse differs between heads that saw identical inputs")
    return weights, lse0, calls, problems


def probe_mask(fn, Lq: int, Lk: int, *, window_size: int, chunk_size: int, mask_lmk: bool = True,
               expand_to_chunk: bool = True, kv_start: int = 0, device="cpu", dtype=None,
               head_dim: int | None = None, heads_per_call: int = 8) -> ProbeResult:
    """Recover the effective visibility mask of backend function ``fn``.

    ``dtype`` None tries fp32, then bf16, then fp16; ``head_dim`` None tries
    64, 128, 32, 16, 256 (the first the backend does not refuse with
    ``UnsupportedConfig``). Raises whatever the backend raises otherwise.
    """
    from reference import UnsupportedConfig

    rule = dict(window_size=window_size, chunk_size=chunk_size, mask_lmk=mask_lmk,
                expand_to_chunk=expand_to_chunk, kv_start=kv_start)
    dtypes = [dtype] if dtype is not None else [torch.float32, torch.bfloat16, torch.float16]
    dims = [head_dim] if head_dim is not None else list(_HEAD_DIMS)
    refusals = []
    for dt in dtypes:
        for D in dims:
            try:
                weights, lse, calls, problems = _probe_once(fn, Lq, Lk, D, rule, device, dt, heads_per_call)
            except UnsupportedConfig as e:
                refusals.append(f"{str(dt).replace('torch.', '')}/D={D}: {e}")
                continue
            return _interpret(weights, lse, D, dt, calls, problems)
    raise UnsupportedConfig("probe: the backend refused every probe configuration: " + "; ".join(refusals))


def _interpret(weights, lse, D, dtype, calls, problems) -> ProbeResult:
    """Turn read-back weights into a mask and cross-check them with the LSE."""
    Lq = weights.shape[0]
    problems = list(problems)
    if not bool(torch.isfinite(weights).all()):
        bad = sorted({int(i) for i in (~torch.isfinite(weights)).nonzero()[:, 0]})
        problems.append(f"o holds NaN/inf on rows {bad} (the probe's inputs are all finite)")
    w = torch.nan_to_num(weights, nan=0.0, posinf=0.0, neginf=0.0)
    row_max = w.abs().max(dim=1).values
    # A key counts as averaged when its weight is at least half the row's
    # largest: uniform weights are 1/n, unaveraged ones exactly 0 in any kernel
    # that masks with -inf (and tiny in one that masks with a large negative).
    mask = (w > 0.5 * row_max[:, None]) & (row_max[:, None] > 0)
    eps = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}.get(dtype, 1e-2)
    for i in range(Lq):
        n = int(mask[i].sum())
        li = float(lse[i])
        if n == 0:
            if not (math.isinf(li) and li < 0):
                problems.append(f"row {i}: no key averaged (o = 0) but lse = {li:.6g}, expected -inf")
            continue
        vals = w[i][mask[i]]
        if float((vals - 1.0 / n).abs().max()) > 4 * eps / n + 1e-12:
            problems.append(f"row {i}: weights are not uniform 1/{n} (min {float(vals.min()):.6g}, "
                            f"max {float(vals.max()):.6g})")
        outside = w[i][~mask[i]].abs()
        if outside.numel() and float(outside.max()) > 0:
            problems.append(f"row {i}: keys outside the recovered mask carry nonzero weight "
                            f"(max {float(outside.max()):.3g})")
        expect = math.log(n)
        if not math.isfinite(li) or abs(li - expect) > 1e-3 * max(1.0, abs(expect)):
            hint = ""
            if n > 1 and math.isfinite(li) and abs(li - expect / math.log(2)) < 1e-3 * max(1.0, expect):
                hint = " (that is log2(n): a base-2 LSE)"
            problems.append(f"row {i}: lse = {li:.6g} but {n} keys averaged, expected log({n}) = {expect:.6g}{hint}")
    return ProbeResult(mask=mask, weights=weights, lse=lse, head_dim=D, dtype=dtype, calls=calls,
                       problems=problems)


def _positions_line(Lq, Lk, kv_start, chunk_size, mask_lmk):
    q0 = kv_start + Lk - Lq
    line = (f"keys j=0..{Lk - 1} at positions {kv_start}..{kv_start + Lk - 1}; "
            f"queries i=0..{Lq - 1} at positions {q0}..{q0 + Lq - 1}")
    if mask_lmk:  # on Python ints: exact at any kv_start and chunk (int64 tensors wrap past 2**63)
        from reference import is_landmark

        lm = [j for j in range(Lk) if is_landmark(kv_start + j, chunk_size=chunk_size)]
        line += f"; landmarks (masked) at j={lm}"
    return line


def diff_picture(got: torch.Tensor, want: torch.Tensor) -> str:
    """``+`` where the backend sees a key the reference hides, ``-`` where it
    misses one the reference sees, ``.`` where they agree."""
    rows = []
    for g_row, w_row in zip(got.tolist(), want.tolist()):
        rows.append("".join("+" if g and not w else "-" if w and not g else "." for g, w in zip(g_row, w_row)))
    return "\n".join(rows)


def format_report(name: str, res: ProbeResult, *, Lq, Lk, window_size, chunk_size, mask_lmk,
                  expand_to_chunk, kv_start, device) -> tuple[str, bool]:
    """The printed report and whether the backend's mask equals the reference's."""
    from reference import render_mask

    want, window = reference_masks(Lq, Lk, window_size=window_size, chunk_size=chunk_size,
                                   mask_lmk=mask_lmk, expand_to_chunk=expand_to_chunk, kv_start=kv_start)
    equal = bool(torch.equal(res.mask, want))
    # L only on the reference's hidden landmarks (inside its window): a key the backend
    # misses for another reason is drawn '.', not 'L'
    landmarks = window & ~want
    got_pic = render_mask(res.mask, window=landmarks).splitlines()
    want_pic = render_mask(want, window=landmarks).splitlines()
    diff_pic = diff_picture(res.mask, want).splitlines()
    col = max(Lk, len(name), len("reference"), len("difference")) + 3
    head = "".join(str(j % 10) for j in range(Lk))
    out = [
        f"probe {name}: Lq={Lq} Lk={Lk} window_size={window_size} chunk_size={chunk_size} "
        f"kv_start={kv_start} mask_lmk={mask_lmk} expand_to_chunk={expand_to_chunk}",
        f"  {device}, {str(res.dtype).replace('torch.', '')}, head dim {res.head_dim}, {res.calls} call(s); "
        + _positions_line(Lq, Lk, kv_start, chunk_size, mask_lmk),
        "",
        "     " + f"{name:<{col}}{'reference':<{col}}difference",
        "     " + f"{head:<{col}}{head:<{col}}{head}",
    ]
    for i in range(Lq):
        n = int(res.mask[i].sum())
        out.append(f"{i:>3}  {got_pic[i]:<{col}}{want_pic[i]:<{col}}{diff_pic[i]:<{Lk}}   n={n}")
    out += ["",
            "  # visible   . not visible   L inside the reference window but a landmark (hidden)",
            "  difference: + backend sees a key the reference hides, - backend misses a key the reference sees"]
    if res.problems:
        out.append("")
        out.append(f"  {len(res.problems)} other finding(s):")
        out += [f"    - {p}" for p in res.problems[:20]]
        if len(res.problems) > 20:
            out.append(f"    ... {len(res.problems) - 20} more")
    n_diff = int((res.mask != want).sum())
    out.append("")
    if equal and not res.problems:
        out.append(f"result: EQUAL: {name}'s mask is the reference's, lse = log(n) on every row")
    elif equal:
        out.append(f"result: DIFFERENT: the mask is the reference's but {len(res.problems)} check(s) failed")
    else:
        rows = sorted({int(i) for i in (res.mask != want).nonzero()[:, 0]})
        out.append(f"result: DIFFERENT: {n_diff} cell(s) differ, on rows {rows}")
    return "\n".join(out), equal and not res.problems


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="hils-swa probe",
        description="Recover a backend's effective visibility mask (zero queries, one-hot values) "
                    "and draw it beside the reference's. Exit 0 when equal, 1 when not.")
    ap.add_argument("backend", help="registered name (reference, triton, tilelang, flex), "
                                    "an entry-point name, package.module:function, or mutant:NAME")
    ap.add_argument("--lq", type=int, default=8)
    ap.add_argument("--lk", type=int, default=None, help="default: --lq")
    ap.add_argument("--window", type=int, default=3, help="window_size")
    ap.add_argument("--chunk", type=int, default=4, help="chunk_size")
    ap.add_argument("--kv-start", type=int, default=0)
    ap.add_argument("--no-mask-lmk", action="store_true", help="mask_lmk=False")
    ap.add_argument("--no-expand", action="store_true", help="expand_to_chunk=False")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    ap.add_argument("--dtype", choices=sorted(_DTYPES), default=None,
                    help="default: fp32, falling back to bf16/fp16 if the backend refuses it")
    ap.add_argument("--head-dim", type=int, default=None, help="default: first of 64,128,32,16,256 served")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    Lk = args.lq if args.lk is None else args.lk
    from tools._common import pick_device, resolve_backend

    try:
        device = pick_device(args.device)
        backend = resolve_backend(args.backend)
    except ValueError as e:
        print(f"hils-swa probe: {e}", file=sys.stderr)
        return 2
    rule = dict(window_size=args.window, chunk_size=args.chunk, mask_lmk=not args.no_mask_lmk,
                expand_to_chunk=not args.no_expand, kv_start=args.kv_start)
    if args.lq < 1 or Lk < args.lq:
        print(f"hils-swa probe: need 1 <= --lq <= --lk, got --lq {args.lq} --lk {Lk}", file=sys.stderr)
        return 2
    try:
        from reference import check_inputs

        z = torch.zeros(1, 1, args.lq, 1)
        check_inputs(z, torch.zeros(1, 1, Lk, 1), torch.zeros(1, 1, Lk, 1), **rule)
    except ValueError as e:
        print(f"hils-swa probe: {e}", file=sys.stderr)
        return 2
    from reference import UnsupportedConfig

    try:
        res = probe_mask(backend.fn, args.lq, Lk, device=device,
                         dtype=_DTYPES[args.dtype] if args.dtype else None,
                         head_dim=args.head_dim, **rule)
    except UnsupportedConfig as e:
        print(f"hils-swa probe: {backend.name} cannot serve the probe: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # the backend itself failed: say so plainly, no traceback wall
        print(f"hils-swa probe: {backend.name} raised {type(e).__name__} on the probe inputs: {e}",
              file=sys.stderr)
        return 1
    text, ok = format_report(backend.name, res, Lq=args.lq, Lk=Lk, device=device, **rule)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
