"""The exact pure-PyTorch reference of HiLS sliding-window attention (forward).

Memory is linear in the window: queries are processed in blocks, and each block
reads only the key range its windows can reach (``visible_key_range``), split
further into key blocks merged by log-sum-exp when that range is long. No
``Lq x Lk`` matrix is ever built.
"""

from __future__ import annotations

import torch

from .mask import key_positions, query_positions, visible, visible_key_range
from .errors import UnsupportedConfig
from .validation import CANONICAL_DTYPES, Problem, check_inputs

__all__ = ["sliding_window_attention", "golden", "same_dtype"]

# Largest score tile (B * Hq * rows * keys elements) one step materialises:
# 2**22 float64 values = 32 MiB, so the peak extra memory stays far under 1 GB
# whatever Lq, Lk and the window are.
_TILE_ELEMS = 1 << 22
_REF_DTYPES = CANONICAL_DTYPES + (torch.float64,)


def _blocks(p: Problem) -> tuple[int, int]:
    """Query-block and key-block lengths that keep one score tile under budget."""
    heads = max(1, p.B * p.Hq)
    reach = max(1, min(p.Lk, p.window_size + p.chunk_size))
    block_q = max(1, min(p.Lq, 1024, _TILE_ELEMS // (heads * reach)))
    block_k = max(64, _TILE_ELEMS // (heads * block_q))
    return block_q, block_k


def _weighted_sum(w: torch.Tensor, vis: torch.Tensor, vb: torch.Tensor) -> torch.Tensor:
    """``sum_j w_ij v_j`` over visible ``j`` only, exact even when a ``v_j`` is not finite.

    ``w`` is ``(B, Hkv, G, I, J)``, ``vis`` ``(I, J)``, ``vb`` ``(B, Hkv, J, Dv)``. A
    matrix product would turn ``0 * NaN`` of an invisible key into NaN, so the
    non-finite *elements* of ``v`` are left out of the product (zeroed there) and
    added element-wise to the rows that see their key only; every finite element,
    those of such a key included, goes through the product as usual (so the
    rounding of the finite part does not depend on whether a ``v`` elsewhere holds
    a NaN, and neither does the tolerance built from ``same_dtype``).
    """
    finite = torch.isfinite(vb)  # (B, Hkv, J, Dv)
    if bool(finite.all()):
        return w @ vb.unsqueeze(2)
    out = w @ torch.where(finite, vb, 0).unsqueeze(2)
    bad = (~finite).any(dim=(0, 1, 3)).nonzero().flatten().tolist()
    for j in bad:  # rare: only keys that hold inf or NaN
        contrib = w[..., j, None] * vb[:, :, None, None, j, :]  # (B, Hkv, G, I, Dv)
        take = vis[:, j][None, None, None, :, None] & ~finite[:, :, None, None, j, :]
        out = out + torch.where(take, contrib, 0)
    return out


def _attention(q, k, v, p: Problem, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Core loop. ``mode`` is ``"golden"`` (float64 everywhere) or ``"same"`` (fp32
    everywhere, the weights rounded to the input dtype before ``P @ V``)."""
    acc = torch.float64 if mode == "golden" else torch.float32
    # "same": the products read their operands at the input dtype's precision (q, k, v as
    # given, the weights rounded to it) and are computed and kept in fp32, as a tensor-core
    # kernel's are: exact products of 16-bit values, fp32 sums, no rounding of the scores.
    # (float64 inputs, accepted for the verdict's own tests: products in float64, as before.)
    prod = torch.float64 if mode == "golden" or p.dtype == torch.float64 else acc
    rnd = p.dtype if mode == "same" and p.dtype.itemsize == 2 else None
    o = torch.zeros((p.B, p.Hq, p.Lq, p.Dv), dtype=acc, device=p.device)
    lse = torch.full((p.B, p.Hq, p.Lq), float("-inf"), dtype=acc, device=p.device)
    if p.empty:
        return o, lse
    if p.device.type == "meta":  # a valid call with no values to compute on (SPEC: UnsupportedConfig)
        raise UnsupportedConfig("reference: tensors on the meta device hold no values to attend over")
    G = p.group
    # (B, Hkv, G, Lq, D) views: query head h = kv_head * G + g reads kv head h // G.
    qg = q.unflatten(1, (p.Hkv, G))
    og = o.unflatten(1, (p.Hkv, G))
    lg = lse.unflatten(1, (p.Hkv, G))
    p = p.int64_framed()  # the call itself where int64 holds its positions, its small twin where not
    qpos = query_positions(p.Lq, p.Lk, p.kv_start, p.device)
    kpos = key_positions(p.Lk, p.kv_start, p.device)
    rule = dict(window_size=p.window_size, chunk_size=p.chunk_size, mask_lmk=p.mask_lmk,
                expand_to_chunk=p.expand_to_chunk)
    block_q, block_k = _blocks(p)
    for i0 in range(0, p.Lq, block_q):
        i1 = min(p.Lq, i0 + block_q)
        j_lo, j_hi = visible_key_range(i0, i1, Lq=p.Lq, Lk=p.Lk, window_size=p.window_size,
                                       chunk_size=p.chunk_size, expand_to_chunk=p.expand_to_chunk,
                                       kv_start=p.kv_start)
        qb = qg[:, :, :, i0:i1].to(prod)
        m_run = None
        for j0 in range(j_lo, j_hi, block_k):
            j1 = min(j_hi, j0 + block_k)
            vis = visible(qpos[i0:i1, None], kpos[None, j0:j1], **rule)  # (I, J)
            if not bool(vis.any()):
                continue
            kb = k[:, :, j0:j1].to(prod)
            vb = v[:, :, j0:j1].to(prod)
            s = (qb @ kb.unsqueeze(2).transpose(-1, -2)).to(acc) * p.sm_scale
            s = torch.where(vis, s, float("-inf"))  # also drops NaN/inf of invisible keys
            # Each row's block state: its max score m, l = sum exp(s - m), and the weights
            # normalised by dividing by l. Not exp(s - logsumexp(s)): past |s| ~ 1e16 (float64;
            # ~1e7 in float32) log(l) vanishes in m + log(l) and those weights no longer sum
            # to 1. m is NaN for a NaN score, +inf for a +inf one (then l = inf and o NaN:
            # exp(inf - inf), as SPEC's formula gives), -inf where nothing is visible (l = 0).
            blk_m = s.amax(dim=-1)
            e = torch.exp(s - _finite_or_0(blk_m)[..., None])  # exactly 0 where invisible
            blk_l = e.sum(dim=-1)
            w = e / torch.where(blk_l > 0, blk_l, 1)[..., None]
            if rnd is not None:
                w = w.to(rnd)  # P as a 16-bit kernel feeds it to P @ V (then read in fp32)
            blk_o = _weighted_sum(w.to(prod), vis, vb).to(acc)
            if m_run is None:
                m_run = (blk_m, blk_l, blk_o)
                continue
            run_m, run_l, run_o = m_run
            new_m = torch.maximum(run_m, blk_m)  # NaN if either is
            ms = _finite_or_0(new_m)
            a = run_l * torch.exp(run_m - ms)
            b = blk_l * torch.exp(blk_m - ms)
            new_l = a + b
            new_o = (run_o * a[..., None] + blk_o * b[..., None]) / torch.where(new_l > 0, new_l, 1)[..., None]
            m_run = (new_m, new_l, new_o)
        if m_run is not None:
            m, l, o_run = m_run
            lg[:, :, :, i0:i1] = _finite_or_0(m) + torch.log(l)  # -inf / NaN / +inf carried by l
            og[:, :, :, i0:i1] = o_run
    return o, lse


def _finite_or_0(m: torch.Tensor) -> torch.Tensor:
    """``m`` where finite, else 0: the shift of a row whose max score is not finite (its
    ``l`` then carries the -inf, +inf or NaN into the LSE)."""
    return torch.where(torch.isfinite(m), m, 0)


def golden(q, k, v, *, window_size, chunk_size, mask_lmk=True, expand_to_chunk=True,
           kv_start=0, sm_scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Ground truth: float64 math on the given inputs; returns float64 ``o`` and ``lse``.

    Accepts float64 inputs besides the canonical dtypes.

    The conformance suite measures every backend's error against this.
    """
    p = check_inputs(q, k, v, window_size=window_size, chunk_size=chunk_size, mask_lmk=mask_lmk,
                     expand_to_chunk=expand_to_chunk, kv_start=kv_start, sm_scale=sm_scale,
                     dtypes=_REF_DTYPES)
    return _attention(q, k, v, p, "golden")


def same_dtype(q, k, v, *, window_size, chunk_size, mask_lmk=True, expand_to_chunk=True,
               kv_start=0, sm_scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """What a kernel computing in the input dtype returns: the yardstick of the tolerance.

    The operands of both products are read at the input dtype's precision: ``q``, ``k``
    and ``v`` as given, and the softmax weights rounded to the input dtype before ``P @
    V``, as a 16-bit kernel feeds its probabilities to the tensor cores. Everything else
    is fp32: the products themselves (products of 16-bit values are exact there, the sums
    fp32), the scores, which are never rounded to a 16-bit dtype, the softmax and the
    cross-block merge. fp32 inputs: plain fp32 throughout. Returns ``o`` rounded to the
    input dtype and fp32 ``lse``. Its error against :func:`golden` is the yardstick of the
    conformance tolerance (``conformance.verdict``): a backend may be a small multiple of
    it away from ground truth.

    Until session 32 the products ran in the input dtype and their results were rounded
    to it, scores included, as plain PyTorch in bf16 computes ``q @ k^T``: no tensor-core
    kernel rounds its scores so, and the bound grew with the scores' magnitude (bf16 inputs
    scaled by 10 passed a row missing a key of probability up to 0.23).
    """
    p = check_inputs(q, k, v, window_size=window_size, chunk_size=chunk_size, mask_lmk=mask_lmk,
                     expand_to_chunk=expand_to_chunk, kv_start=kv_start, sm_scale=sm_scale,
                     dtypes=_REF_DTYPES)
    o, lse = _attention(q, k, v, p, "same")
    return o.to(p.dtype), lse.to(torch.float32)


def sliding_window_attention(q, k, v, *, window_size, chunk_size, mask_lmk=True,
                             expand_to_chunk=True, kv_start=0, sm_scale=None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""HiLS sliding-window attention, forward: the canonical interface (SPEC.md).

    Computed exactly (float64) and returned as ``o`` in ``q.dtype`` (canonical
    layout, contiguous) and ``lse`` in fp32, natural log.

    Shapes::

        q   (B, Hq,  Lq, Dqk)      k (B, Hkv, Lk, Dqk)      v (B, Hkv, Lk, Dv)
        o   (B, Hq,  Lq, Dv)       lse (B, Hq, Lq)

    Any strides are accepted (``x.transpose(1, 2)`` of a ``(B, L, H, D)`` tensor
    included). ``G = Hq / Hkv``; query head ``h`` reads key/value head ``h // G``.

    Positions are absolute; the queries are the last ``Lq`` key positions::

        qpos(i) = kv_start + (Lk - Lq) + i        kpos(j) = kv_start + j
        left(i) = qpos(i) - window_size + 1
        if expand_to_chunk: left(i) = floor(left(i) / chunk_size) * chunk_size
        visible(i, j) = left(i) <= kpos(j) <= qpos(i)
                        and (not mask_lmk or (kpos(j) + 1) % chunk_size != 0)

        s_ij  = sm_scale * <q_i, k_j>          sm_scale defaults to 1 / sqrt(Dqk)
        lse_i = log(sum_{j visible} exp(s_ij))
        o_i   = sum_{j visible} exp(s_ij - lse_i) * v_j

    A row with no visible key has ``o_i = 0`` and ``lse_i = -inf`` (never NaN).
    Values in key slots that no query of the call can see (NaN included) do not
    change any output. Non-finite scores of visible keys follow the formula: NaN
    gives NaN ``o_i`` and ``lse_i``; ``+inf`` gives ``lse_i = +inf`` and NaN ``o_i``
    (``exp(inf - inf)``); ``-inf`` adds nothing. Any finite score magnitude is exact
    (each key block's weights are divided by their sum). Empty dimensions return
    empty outputs.

    Masks from :func:`reference.mask.render_mask` (``#`` visible, ``.`` not,
    ``L`` inside the window but a landmark), ``Lq = Lk = 8``,
    ``window_size = 3``, ``chunk_size = 4``, ``kv_start = 0``::

        plain causal window       expand_to_chunk=True      expand_to_chunk=True
        mask_lmk=False            mask_lmk=False            mask_lmk=True (defaults)
        expand_to_chunk=False
        #.......                  #.......                  #.......
        ##......                  ##......                  ##......
        ###.....                  ###.....                  ###.....
        .###....                  ####....                  ###L....
        ..###...                  #####...                  ###L#...
        ...###..                  ######..                  ###L##..
        ....###.                  ....###.                  ....###.
        .....###                  ....####                  ....###L

    Query 4 (position 4): ``left = 4 - 3 + 1 = 2``, floored to the chunk start
    0, so it sees keys 0..4 except the landmark at position 3. Query 6:
    ``left = 4`` already on a chunk start.

    ``Lq = 4 < Lk = 10``, ``kv_start = 5`` (same window and chunk, defaults):
    keys sit at positions 5..14, queries at 11..14, and landmarks are where
    ``(position + 1) % 4 == 0`` (positions 7 and 11: ``j = 2, 6``), not
    where ``(j + 1) % 4 == 0``::

        ...###L...
        ...###L#..
        ...###L##.
        .......###

    Raises ``ValueError`` (naming the argument) for bad input, before any work.
    """
    p = check_inputs(q, k, v, window_size=window_size, chunk_size=chunk_size, mask_lmk=mask_lmk,
                     expand_to_chunk=expand_to_chunk, kv_start=kv_start, sm_scale=sm_scale)
    o, lse = _attention(q, k, v, p, "golden")
    return o.to(p.dtype), lse.to(torch.float32)
