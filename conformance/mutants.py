"""Deliberately broken backends: one semantic bug each.

They prove the conformance suite (and ``hils-swa diff``) catches real bugs:
the tests run every mutant through the quick tier and assert it FAILS with a
message naming the right thing.

Every mutant is built from the reference by perturbing what goes into it
(parameters, the positions fed to :mod:`reference.mask`, the inputs) or by
post-processing what comes out. None keeps a second copy of the visibility
rule: where a mutant needs a different mask it calls :func:`reference.mask.visible`
with perturbed positions and attends with :func:`_attend`, a plain float64
masked softmax that takes the mask as data.

``MUTANTS`` maps a name to ``(Backend, rule description)``; the backend's name
is ``"mutant:<name>"``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

import reference
from reference.mask import is_landmark, key_positions, query_positions, visible
from reference.validation import Problem, check_inputs

from .registry import Backend

__all__ = ["MUTANTS", "EXTRA_MUTANTS", "mutant", "names"]

_LN2 = math.log(2.0)
_REF_DTYPES = reference.CANONICAL_DTYPES + (torch.float64,)


def _check(q, k, v, **kw) -> Problem:
    return check_inputs(q, k, v, dtypes=_REF_DTYPES, **kw)


def _ref(q, k, v, **kw):
    return reference.sliding_window_attention(q, k, v, **kw)


# A mask builder gets (problem, i0, i1) and returns the (i1 - i0, Lk) boolean
# visibility of queries i0..i1-1: always computed by reference.mask.visible.
MaskFn = Callable[[Problem, int, int], torch.Tensor]


def _rule(p: Problem, **override) -> dict:
    rule = dict(window_size=p.window_size, chunk_size=p.chunk_size, mask_lmk=p.mask_lmk,
                expand_to_chunk=p.expand_to_chunk)
    rule.update(override)
    return rule


def _true_mask(p: Problem, i0: int, i1: int) -> torch.Tensor:
    # Calls past int64 run in the reference's equivalent small call (Problem.int64_framed): it
    # keeps the true rule; a mutant's bug evaluated there may differ from the same bug on the
    # real positions (landmark_shifted with a chunk longer than the cache, whose frame moves
    # kv_start to 0, masks key 0). A mutant must be wrong, not a faithful model of one bug,
    # and no suite case that catches a mutant is past int64.
    p = p.int64_framed()
    qpos = query_positions(p.Lq, p.Lk, p.kv_start, p.device)[i0:i1]
    kpos = key_positions(p.Lk, p.kv_start, p.device)
    return visible(qpos[:, None], kpos[None, :], **_rule(p))


def _attend(q, k, v, p: Problem, mask_fn: MaskFn, *, scale: float | None = None,
            nan_leak: bool = False, v_spread: bool = False, p_dtype: torch.dtype | None = None,
            block: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense masked attention in float64 (quadratic per query block: small problems).

    ``nan_leak=False`` is exact like the reference: invisible keys never touch
    a row, even when they hold NaN. ``nan_leak=True`` masks the way a careless
    kernel does (add ``-inf`` to the scores, multiply ``0 * v``), so NaN of
    invisible slots leaks into the rows. ``v_spread=True`` is what a flash kernel does
    with ``v``: slots no query of the call sees are zeroed, then ``P @ V`` is a plain
    product, so a NaN or infinity in the ``v`` row of a key some rows see reaches every
    row (``0 * NaN``), not only those. ``p_dtype``: the normalised probabilities are
    rounded to it before ``P @ V`` (a tensor-core product fed half-precision ``P``).
    """
    scale = p.sm_scale if scale is None else scale
    o = torch.zeros((p.B, p.Hq, p.Lq, p.Dv), dtype=torch.float64, device=p.device)
    lse = torch.full((p.B, p.Hq, p.Lq), float("-inf"), dtype=torch.float64, device=p.device)
    if p.empty or p.Lk == 0:
        return o.to(p.dtype), lse.float()
    G = p.group
    kd = k.double().repeat_interleave(G, dim=1)  # (B, Hq, Lk, Dqk): head h reads h // G
    vd = v.double().repeat_interleave(G, dim=1)
    finite_v = torch.isfinite(vd).all(dim=-1)  # (B, Hq, Lk)
    bad = (~finite_v).any(dim=(0, 1)).nonzero().flatten()
    v_clean = torch.where(finite_v[..., None], vd, 0)
    if v_spread:
        seen_any = mask_fn(p, 0, p.Lq).any(dim=0)  # keys some query of the call sees
        v_clean = torch.where(seen_any[:, None], vd, 0)
        bad = bad[:0]
    for i0 in range(0, p.Lq, block):
        i1 = min(p.Lq, i0 + block)
        vis = mask_fn(p, i0, i1)  # (I, Lk)
        s = (q[:, :, i0:i1].double() @ kd.transpose(-1, -2)) * scale
        if nan_leak:
            s = s + torch.where(vis, 0.0, float("-inf"))
            blk_lse = torch.logsumexp(s, dim=-1)
            w = torch.exp(s - blk_lse[..., None])
            blk_o = w @ vd
        else:
            s = torch.where(vis, s, float("-inf"))
            blk_lse = torch.logsumexp(s, dim=-1)
            safe = torch.where(torch.isfinite(blk_lse), blk_lse, 0)
            w = torch.exp(s - safe[..., None])
            if p_dtype is not None:
                w = w.to(p_dtype).double()
            blk_o = w @ v_clean
            if bad.numel():  # visible non-finite values propagate, invisible ones do not
                wb = w[..., bad]  # (B, H, I, nb)
                vb = vd[:, :, bad]  # (B, H, nb, Dv)
                seen = vis[:, bad] & ~finite_v[:, :, None, bad]  # (B, H, I, nb)
                extra = torch.where(seen[..., None], wb[..., None] * vb[:, :, None], 0).sum(-2)
                blk_o = blk_o + extra
        o[:, :, i0:i1] = blk_o
        lse[:, :, i0:i1] = blk_lse
    return o.to(p.dtype), lse.float()


# ---------------------------------------------------------------- the mutants

def lse_base2(q, k, v, **kw):
    o, lse = _ref(q, k, v, **kw)
    return o, lse / _LN2  # log2(sum exp) instead of ln


def reshaped_output(q, k, v, **kw):
    o, lse = _ref(q, k, v, **kw)
    B, H, L, D = o.shape
    blhd = o.transpose(1, 2).contiguous()  # what a (B, L, H, D) kernel writes
    return blhd.reshape(B, H, L, D), lse  # reshape, not transpose back


def window_off_by_one(q, k, v, *, window_size, **kw):
    # left = qpos - window_size (one key too many) instead of qpos - window_size + 1
    return _ref(q, k, v, window_size=window_size + 1, **kw)


def no_chunk_expansion(q, k, v, **kw):
    kw["expand_to_chunk"] = False
    return _ref(q, k, v, **kw)


def _landmark_mask(shift_index: bool, delta: int) -> MaskFn:
    def fn(p: Problem, i0: int, i1: int) -> torch.Tensor:
        p = p.int64_framed()
        qpos = query_positions(p.Lq, p.Lk, p.kv_start, p.device)[i0:i1]
        kpos = key_positions(p.Lk, p.kv_start, p.device)
        vis = visible(qpos[:, None], kpos[None, :], **_rule(p, mask_lmk=False))
        if p.mask_lmk:
            where = torch.arange(p.Lk, device=p.device) if shift_index else kpos + delta
            vis = vis & ~is_landmark(where, chunk_size=p.chunk_size)[None, :]
        return vis
    return fn


def landmark_shifted(q, k, v, **kw):
    # landmark where kpos % C == 0 (chunk's first token) instead of (kpos + 1) % C == 0
    p = _check(q, k, v, **kw)
    return _attend(q, k, v, p, _landmark_mask(False, -1))


def landmark_from_index(q, k, v, **kw):
    # landmark where (j + 1) % C == 0 with the cache index j, not the position
    p = _check(q, k, v, **kw)
    return _attend(q, k, v, p, _landmark_mask(True, 0))


def kv_start_ignored(q, k, v, **kw):
    _check(q, k, v, **kw)
    kw["kv_start"] = 0
    return _ref(q, k, v, **kw)


def _wrap64(x: int) -> int:
    """``x`` as int64 arithmetic holds it: two's complement, modulo 2**64."""
    return (x + 2**63) % 2**64 - 2**63


def positions_int64(q, k, v, **kw):
    # kv_start, window_size and chunk_size put in int64 as they are: values past the range
    # wrap (modulo 2**64), and so do the positions built on them; the rule itself is
    # SPEC's (reference.mask.visible on the wrapped int64 tensors). A chunk that wraps to 0
    # raises inside the "kernel", as an integer division by zero does.
    p = _check(q, k, v, **kw)
    kv, w, c = (_wrap64(x) for x in (p.kv_start, p.window_size, p.chunk_size))
    if (kv, w, c) == (p.kv_start, p.window_size, p.chunk_size):
        return _ref(q, k, v, **kw)
    if c == 0:
        raise RuntimeError("integer division by zero in the kernel (chunk_size wrapped to 0)")

    def fn(p: Problem, i0: int, i1: int) -> torch.Tensor:
        base = torch.tensor(kv, dtype=torch.int64, device=p.device)
        qpos = base + (p.Lk - p.Lq) + torch.arange(i0, i1, device=p.device)
        kpos = base + torch.arange(p.Lk, device=p.device)
        return visible(qpos[:, None], kpos[None, :], **_rule(p, window_size=w, chunk_size=c))

    return _attend(q, k, v, p, fn)


def query_offset_ignored(q, k, v, **kw):
    # queries placed at the first Lq positions (qpos = kv_start + i), not the last
    p = _check(q, k, v, **kw)

    def fn(p: Problem, i0: int, i1: int) -> torch.Tensor:
        p = p.int64_framed()
        qpos = key_positions(p.Lq, p.kv_start, p.device)[i0:i1]
        kpos = key_positions(p.Lk, p.kv_start, p.device)
        return visible(qpos[:, None], kpos[None, :], **_rule(p))

    return _attend(q, k, v, p, fn)


def gqa_modulo(q, k, v, **kw):
    # query head h reads kv head h % Hkv instead of h // (Hq / Hkv)
    p = _check(q, k, v, **kw)
    if p.Hkv == 0 or p.Hq == p.Hkv:
        return _ref(q, k, v, **kw)
    idx = torch.arange(p.Hq, device=q.device) % p.Hkv
    return _ref(q, k[:, idx], v[:, idx], **kw)


def scale_from_dv(q, k, v, *, sm_scale=None, **kw):
    # default scale 1/sqrt(Dv) instead of 1/sqrt(Dqk)
    if sm_scale is None and v.dim() == 4 and v.shape[-1] > 0:
        sm_scale = 1.0 / math.sqrt(v.shape[-1])
    return _ref(q, k, v, sm_scale=sm_scale, **kw)


def sm_scale_ignored(q, k, v, *, sm_scale=None, **kw):
    # an explicit sm_scale is dropped: always 1/sqrt(Dqk)
    _check(q, k, v, sm_scale=sm_scale, **kw)
    return _ref(q, k, v, **kw)


def empty_rows_nan(q, k, v, **kw):
    # a row with no visible key divides 0 by 0
    o, lse = _ref(q, k, v, **kw)
    empty = torch.isneginf(lse)
    return torch.where(empty[..., None], float("nan"), o), lse


def nan_leak(q, k, v, **kw):
    # mask by adding -inf to the scores and multiply 0 * v: NaN of slots no query sees leaks
    p = _check(q, k, v, **kw)
    return _attend(q, k, v, p, _true_mask, nan_leak=True)


def nan_v_spread(q, k, v, **kw):
    # P @ V as a plain product over the keys some query sees (both built-in kernels' known
    # deviation): a NaN or infinity in a seen key's v reaches the rows that do not see it
    p = _check(q, k, v, **kw)
    return _attend(q, k, v, p, _true_mask, v_spread=True)


def nan_rows_emptied(q, k, v, **kw):
    # the finish tests l > 0 (TileLang's until session 10): a row whose sum is NaN, because a
    # key it sees holds NaN, comes out as an empty row instead of NaN
    o, lse = _ref(q, k, v, **kw)
    bad = torch.isnan(lse)
    return (torch.where(bad[..., None], torch.zeros((), dtype=o.dtype, device=o.device), o),
            torch.where(bad, float("-inf"), lse))


def inputs_modified(q, k, v, **kw):
    # zeroes landmark rows of v in place (in global memory instead of shared memory)
    o, lse = _ref(q, k, v, **kw)
    p = _check(q, k, v, **kw).int64_framed()
    if p.mask_lmk and p.Lk:
        lmk = is_landmark(key_positions(p.Lk, p.kv_start, v.device), chunk_size=p.chunk_size)
        v[:, :, lmk] = 0
    return o, lse


def _as_contiguous_strides(x: torch.Tensor) -> torch.Tensor:
    """Read ``x``'s storage as if ``x`` were contiguous (the stride bug)."""
    if x.is_contiguous():
        return x
    need = x.storage_offset() + x.numel()
    if x.untyped_storage().nbytes() < need * x.element_size():
        return x.contiguous()
    return torch.as_strided(x, x.shape, torch.empty(x.shape, device="meta").stride(),
                            x.storage_offset())


def strides_ignored(q, k, v, **kw):
    # the kernel indexes its inputs with contiguous (B, H, L, D) strides whatever it gets
    _check(q, k, v, **kw)
    return _ref(_as_contiguous_strides(q), _as_contiguous_strides(k), _as_contiguous_strides(v), **kw)


def low_precision_accumulation(q, k, v, **kw):
    """Running max, denominator and output accumulated in the input dtype
    (bf16 for fp32 inputs), key by key, instead of fp32."""
    p = _check(q, k, v, **kw)
    low = p.dtype if p.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    G = p.group
    o = torch.zeros((p.B, p.Hq, p.Lq, p.Dv), dtype=low, device=p.device)
    lse = torch.full((p.B, p.Hq, p.Lq), float("-inf"), dtype=torch.float32, device=p.device)
    if p.empty or p.Lk == 0:
        return o.to(p.dtype), lse
    kf = k.float().repeat_interleave(G, dim=1)
    vf = v.float().repeat_interleave(G, dim=1)
    vis = _true_mask(p, 0, p.Lq)  # (Lq, Lk)
    s = (q.float() @ kf.transpose(-1, -2)) * p.sm_scale
    s = torch.where(vis, s, float("-inf"))
    m = s.amax(dim=-1)  # exact max: only the sums are low precision
    safe = torch.where(torch.isfinite(m), m, 0)
    l = torch.zeros_like(m, dtype=low)
    for j in range(p.Lk):
        pj = torch.exp(s[..., j] - safe)  # 0 where invisible
        seen = vis[:, j]
        l = l + pj.to(low)
        contrib = (pj[..., None] * vf[:, :, None, j, :]).to(low)
        o = o + torch.where(seen[None, None, :, None], contrib, 0)
    lf = l.float()
    good = lf != 0  # not > 0: a NaN sum stays NaN (its one bug is the precision)
    o = torch.where(good[..., None], o.float() / torch.where(good, lf, 1)[..., None], 0)
    lse = torch.where(good, safe + torch.log(torch.where(good, lf, 1)), float("-inf"))
    return o.to(p.dtype), lse.float()


def fp16_probabilities(q, k, v, **kw):
    """P rounded to fp16 before ``P @ V`` whatever the input dtype (fp32 inputs too):
    about 2^-12 relative error per probability, the least precision bug an fp32 kernel
    can have with a half-precision tensor-core product. Exact otherwise."""
    p = _check(q, k, v, **kw)
    return _attend(q, k, v, p, _true_mask, p_dtype=torch.float16)


def output_dtype_fp32(q, k, v, **kw):
    # o returned in the fp32 accumulator dtype instead of q.dtype
    o, lse = _ref(q, k, v, **kw)
    return o.float(), lse


def tail_unwritten(q, k, v, **kw):
    # grid of Lq // 64 query tiles: the last partial tile is never written into the
    # torch.empty outputs (caught only because the suite poisons them: runner.poisoned_empty)
    ref_o, ref_lse = _ref(q, k, v, **kw)
    o, lse = torch.empty_like(ref_o), torch.empty_like(ref_lse)
    full = (o.shape[2] // 64) * 64
    o[:, :, :full] = ref_o[:, :, :full]
    lse[:, :, :full] = ref_lse[:, :, :full]
    return o, lse


def no_validation(q, k, v, **kw):
    # no check_inputs up front: bad input surfaces as whatever the launch raises
    try:
        return _ref(q, k, v, **kw)
    except ValueError as e:
        raise RuntimeError(f"kernel launch failed: {e}") from None


_TABLE: dict[str, tuple[Callable, str]] = {
    "lse_base2": (lse_base2, "LSE returned in base 2 (log2) instead of the natural log"),
    "reshaped_output": (reshaped_output, "(B, Lq, H, D) kernel output reshaped, not transposed, to (B, H, Lq, D)"),
    "window_off_by_one": (window_off_by_one, "window left edge qpos - W instead of qpos - W + 1"),
    "no_chunk_expansion": (no_chunk_expansion, "expand_to_chunk ignored: left edge never floored to the chunk start"),
    "landmark_shifted": (landmark_shifted, "landmark rule kpos % C == 0 instead of (kpos + 1) % C == 0"),
    "landmark_from_index": (landmark_from_index, "landmark taken from the cache index j, not the position kv_start + j"),
    "kv_start_ignored": (kv_start_ignored, "kv_start ignored: positions start at 0"),
    "positions_int64": (positions_int64, "kv_start, window_size and chunk_size taken as int64: values past "
                        "2**63 wrap, and the positions with them"),
    "query_offset_ignored": (query_offset_ignored, "queries placed at the first Lq positions instead of the last (Lq < Lk)"),
    "gqa_modulo": (gqa_modulo, "GQA mapping h % Hkv instead of h // (Hq / Hkv)"),
    "scale_from_dv": (scale_from_dv, "default sm_scale 1/sqrt(Dv) instead of 1/sqrt(Dqk)"),
    "sm_scale_ignored": (sm_scale_ignored, "explicit sm_scale ignored (always 1/sqrt(Dqk))"),
    "empty_rows_nan": (empty_rows_nan, "rows with no visible key return NaN instead of o = 0"),
    "nan_leak": (nan_leak, "masking by -inf addition and 0 * v: NaN in slots no query sees leaks into outputs"),
    "nan_v_spread": (nan_v_spread, "P @ V a plain product: NaN or infinity in the v row of a key some rows see "
                                   "reaches the other rows too"),
    "nan_rows_emptied": (nan_rows_emptied, "a row that sees a NaN key returned as an empty row (o = 0, "
                         "lse = -inf) instead of NaN (the finish tests l > 0)"),
    "strides_ignored": (strides_ignored, "inputs indexed with contiguous (B, H, L, D) strides whatever their real strides"),
    "low_precision_accumulation": (low_precision_accumulation,
                                   "softmax denominator and output accumulated key by key in the input dtype (bf16 for fp32)"),
    "fp16_probabilities": (fp16_probabilities, "probabilities rounded to fp16 before P @ V, also for "
                           "fp32 inputs (the fp32 bound's nearest precision bug)"),
    "output_dtype_fp32": (output_dtype_fp32, "o returned in fp32 instead of q.dtype"),
    "tail_unwritten": (tail_unwritten, "last partial 64-row query tile never written (uninitialised output)"),
    "no_validation": (no_validation, "no input validation: bad input fails inside the kernel, not with ValueError"),
    "inputs_modified": (inputs_modified, "landmark rows of v zeroed in place in the caller's tensor"),
}


def _backend(name: str, fn: Callable) -> Backend:
    fn.__qualname__ = f"mutant:{name}"
    return Backend(name=f"mutant:{name}", fn=fn, origin="conformance.mutants")


#: name -> (backend, description of the broken rule)
MUTANTS: dict[str, tuple[Backend, str]] = {
    name: (_backend(name, fn), text) for name, (fn, text) in _TABLE.items()
}


#: bugs that break no rule ``hils-swa diff`` could name, but that the suite must still
#: catch (same shape as ``MUTANTS``); empty since diff names written inputs (``inputs``)
EXTRA_MUTANTS: dict[str, tuple[Backend, str]] = {}


def names() -> list[str]:
    return list(MUTANTS) + list(EXTRA_MUTANTS)


def mutant(name: str) -> Backend:
    """The backend of one mutant; ``name`` with or without the ``mutant:`` prefix."""
    key = name.removeprefix("mutant:")
    table = MUTANTS if key in MUTANTS else EXTRA_MUTANTS
    if key not in table:
        raise ValueError(f"unknown mutant {name!r}; known: {', '.join(names())}")
    return table[key][0]
