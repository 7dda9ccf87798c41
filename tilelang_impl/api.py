"""The canonical interface of the TileLang backend (SPEC.md).

Adapter only: validate (``reference.check_inputs`` first, so bad input raises
before anything else), return empty outputs for empty problems, refuse what
the kernels are not built for (:class:`UnsupportedConfig`), pick the input
layouts the kernels read in place, allocate the canonical outputs, launch.

Layouts. The kernels read either ``(B, H, L, D)`` or ``(B, L, H, D)``
contiguous memory (a baked-in flag per input). A tensor that is contiguous in
the canonical order is read as is; a ``(B, L, H, D)`` tensor passed as
``x.transpose(1, 2)`` is read in place through ``x.transpose(1, 2)`` (a view,
no copy). Any other stride pattern is copied once to the canonical order
(``.contiguous()``). If ``k`` and ``v`` arrive in different orders, ``v`` is
copied into ``k``'s. A tensor whose address is not a multiple of 16 bytes (a
view at an odd offset into a larger buffer), which the copy engine's tensor
maps cannot take, is copied once in its own order.

Head dims. The kernels are built for head dims that are multiples of 16 (the wgmma K
step). A call with another head dim (32..256) runs on kernels built for the next
multiples (``launch.kernel_dims``; where the inputs are read narrow, a head dim listed
in ``launch.TC_WIDER`` runs on the wider kernel it names: 48 on the 64 kernel, 112 on
the 128 one, as measured in session 58). On the GPU, bf16 / fp16 inputs whose rows are a
multiple of 16 bytes (head dims of 8 mod 16: 40, 56, .., 120, ..) are read as they are
(``launch.reads_narrow``): the kernels' tensor maps have the call's widths and the copy
engine fills the tiles' columns past them with zeros (knobs ``qk_cols`` / ``v_cols``,
``launch.in_cols``). Other calls run on zero-padded copies (:func:`_kernel_call`): ``q``
and ``k`` padded to the next multiple for ``Dqk``, ``v`` for ``Dv``, only the keys some
query can see copied. Either way the kernels write the call's ``o`` themselves, its
``Dv`` columns of their tile (``launch.o_cols``), but the unpacked prefill tile where
``o``'s rows are not a multiple of 16 bytes: there the launcher copies them out of a
padded ``o`` (``launch.copied_out``). These and the copies above are the only copies the
adapter makes on the GPU; :func:`describe_call` names them.

CPU tensors run the CPU kernel (TileLang's C target) in fp32: inputs are
upcast exactly, ``o`` is rounded back to the input dtype. TileLang's C target
has no bf16/fp16 arithmetic of its own, and fp32 accumulation is what the
GPU kernels do anyway.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from reference.device import device_type, made_current
from reference.errors import UnsupportedConfig
from reference.mask import visible_key_range
from reference.validation import check_inputs

from . import launch

__all__ = ["sliding_window_attention", "UnsupportedConfig"]


def _blhd(x: torch.Tensor) -> bool:
    """Whether ``x`` is a ``(B, L, H, D)``-stored tensor passed as ``x.transpose(1, 2)``
    (contiguous ``(B, H, L, D)`` tensors are not)."""
    return not x.is_contiguous() and x.transpose(1, 2).is_contiguous()


def _views(q, k, v):
    """``((q, k, v) as the kernels read them, q_blhd, kv_blhd)``: ``q`` in its own
    layout, ``k`` and ``v`` in ``k``'s (one flag for both); ``(B, L, H, D)``-stored
    tensors passed as ``x.transpose(1, 2)`` are read in place. A view that is not
    contiguous (strides matching neither layout) is what the call copies once."""
    q_blhd, kv_blhd = _blhd(q), _blhd(k)
    return ((q.transpose(1, 2) if q_blhd else q, k.transpose(1, 2) if kv_blhd else k,
             v.transpose(1, 2) if kv_blhd else v), q_blhd, kv_blhd)


def _problem(q, k, v, window_size, chunk_size, mask_lmk, expand_to_chunk, kv_start, sm_scale,
             devices=("cuda", "cpu")):
    """The call's :class:`reference.validation.Problem` after every check that comes
    before a kernel: SPEC errors, then, unless the output is empty (no kernel runs),
    the device and :func:`launch.check_limits`. ``devices``: the device types served
    (``tools/tl_lower.py`` plans CUDA calls on ``meta`` tensors)."""
    p = check_inputs(q, k, v, window_size=window_size, chunk_size=chunk_size, mask_lmk=mask_lmk,
                     expand_to_chunk=expand_to_chunk, kv_start=kv_start, sm_scale=sm_scale)
    if not p.empty:
        if device_type(p.device) not in devices:
            raise UnsupportedConfig(
                f"tilelang: tensors on device {p.device} are not supported (CUDA or CPU only)")
        launch.check_limits(p)
    return p


def _kernel_problem(p):
    """``(problem, j0)``: the call as the kernels take it, planning only (no tensor made).
    Itself and 0 where the kernels' head dims are the call's (``launch.kernel_dims``: both
    multiples of ``launch.D_STEP`` and, read narrow, not widened by ``launch.TC_WIDER``);
    else the same call at the kernels' head dims: where ``launch.reads_narrow``,
    with 0 (the call's own inputs); else moved to start at ``j0``, the
    first key a query can see (``reference.mask.visible_key_range``): ``kv_start`` plus the
    keys left out, so every position and landmark stays where it was."""
    Dqk, Dv = launch.kernel_dims(p)
    if (Dqk, Dv) == (p.Dqk, p.Dv):
        return p, 0
    if launch.reads_narrow(p):
        return dataclasses.replace(p, Dqk=Dqk, Dv=Dv), 0
    j0 = visible_key_range(0, p.Lq, Lq=p.Lq, Lk=p.Lk, window_size=p.window_size,
                           chunk_size=p.chunk_size, expand_to_chunk=p.expand_to_chunk,
                           kv_start=p.kv_start)[0]
    return dataclasses.replace(p, Dqk=Dqk, Dv=Dv, Lk=p.Lk - j0, kv_start=p.kv_start + j0), j0


#: The adapter's copies move rows as integer words (``launch.words``).
_words = launch.words


def _padded(x, D: int, blhd: bool, plan_only: bool):
    """``x`` with zero columns up to ``D``, stored in the ``(B, L, H, D)`` order where
    ``blhd`` (returned as its ``transpose(1, 2)``), else ``(B, H, L, D)``: a new tensor, or
    ``x`` itself where it has ``D`` columns and is already stored so. One ``F.pad`` (or
    ``.contiguous()``) over ``x`` as words (:func:`_words`): few host calls, and a copy of
    fewer, wider elements (a quarter as many for bf16 rows of 8-byte words). ``plan_only``:
    a contiguous ``meta`` stand-in of the copy's shape, nothing copied (``F.pad`` may give a
    size-1 dim another stride, which no reader of a contiguous tensor looks at)."""
    s = x.transpose(1, 2) if blhd else x
    n = s.shape[-1]
    if D == n and s.is_contiguous():
        return x
    if plan_only:
        s = torch.empty((*s.shape[:-1], D), dtype=s.dtype, device="meta")
    else:
        w = _words(s)
        per = n // w.shape[-1]  # elements a word; D - n is a whole number of words (D_STEP)
        s = F.pad(w, (0, (D - n) // per)) if D != n else w.contiguous()
        s = s.view(x.dtype) if per > 1 else s
    return s.transpose(1, 2) if blhd else s


def _kernel_call(p, q, k, v, plan_only: bool = False):
    """``(p, q, k, v)`` as the kernels take them (``p`` checked, not empty;
    :func:`_kernel_problem`): the call itself where the kernels' head dims are the call's;
    the call's own inputs with the kernels' head dims where
    ``launch.reads_narrow`` (the kernels read them narrow, ``launch.in_cols``); else ``q`` and
    ``k`` with zero columns up to the kernels' ``Dqk`` (they add nothing to a score), ``v`` up
    to their ``Dv`` (columns of the kernels' tile that they do not write to the call's ``o``,
    ``launch.o_cols``), ``k`` and ``v`` from the first key a query can see only, each
    in its own storage order and ``v`` in ``k``'s (:func:`_padded`), so the kernels read
    them as they are. ``p.sm_scale`` is the call's: the default stays 1 / sqrt of the call's
    ``Dqk``. A decode step over a long cache copies its window, not the cache.
    ``plan_only``: ``meta`` stand-ins for the copies (:func:`_describe`)."""
    kp, j0 = _kernel_problem(p)
    if kp is p or launch.reads_narrow(p):
        return kp, q, k, v
    kv_blhd = _blhd(k)
    if j0:
        k, v = k[:, :, j0:], v[:, :, j0:]
    return (kp, _padded(q, kp.Dqk, _blhd(q), plan_only), _padded(k, kp.Dqk, kv_blhd, plan_only),
            _padded(v, kp.Dv, kv_blhd, plan_only))


def _same_storage(x, y) -> bool:
    """Whether ``y`` (from :func:`_kernel_call`) is a view of ``x``'s memory, not a copy (a
    ``meta`` stand-in for one counts as a copy: ``meta`` storages, which have no address, are
    told apart by the storage object itself)."""
    if x.device != y.device:
        return False
    a, b = x.untyped_storage(), y.untyped_storage()
    return a._cdata == b._cdata if x.device.type == "meta" else a.data_ptr() == b.data_ptr()


#: The copy engine's tensor maps need base addresses aligned to this many bytes.
TMA_ALIGN = 16


def _copied(x) -> bool:
    """Whether the CUDA path copies ``x`` (a view in one of the kernels' storage orders, or
    not) before the kernels read it: not contiguous, or at an address the copy engine's
    tensor maps refuse."""
    return not x.is_contiguous() or x.data_ptr() % TMA_ALIGN != 0


def _served(x):
    """``x`` as the kernels read it: itself, or where :func:`_copied`, one contiguous copy
    in its own storage order (from the allocator: aligned)."""
    return x.clone(memory_format=torch.contiguous_format) if _copied(x) else x


def _run_cuda(p, q, k, v, force_split: int | None = None):
    """The CUDA path of a checked, non-empty call: the call as the kernels take it
    (:func:`_kernel_call`), the kernels' views of its inputs
    (:func:`_views`; one copy of a tensor neither layout serves or whose address the copy
    engine refuses, :func:`_served`; narrow inputs stay narrow), the call's new canonical
    outputs (at a padded ``Dv``
    the kernels write ``o``'s ``Dv`` columns, ``launch.o_cols``, or the launcher copies them
    out of a padded ``o``, ``launch.copied_out``),
    :func:`launch.run_cuda` (``force_split``: its private knob, ``split_kv``'s)."""
    kp, q, k, v = _kernel_call(p, q, k, v)
    (q_, k_, v_), q_blhd, kv_blhd = _views(q, k, v)
    o, lse = p.new_outputs()
    with made_current(p.device):  # TVM launches on the current device and its stream
        launch.run_cuda(kp, _served(q_), _served(k_), _served(v_), q_blhd, kv_blhd, o, lse,
                        force_split=force_split)
    return o, lse


def describe_call(q, k, v, *, window_size, chunk_size, mask_lmk=True, expand_to_chunk=True,
                  kv_start=0, sm_scale=None) -> str:
    """What :func:`sliding_window_attention` runs for these arguments, in one line
    (``launch.describe``: kernel, tile, stages, threads, splits, baked knobs; and
    the copies the adapter would make); plans only, builds and launches nothing.
    Raises what the call would raise before its kernels."""
    p = _problem(q, k, v, window_size, chunk_size, mask_lmk, expand_to_chunk, kv_start, sm_scale)
    return _describe(p, q, k, v)


def _describe(p, q, k, v, force_split: int | None = None) -> str:
    """:func:`describe_call` of a checked call (``force_split``: ``split_kv``'s, planned for
    the call as the kernels take it)."""
    if p.empty:
        return "no kernel (empty output)"
    kp, *served = _kernel_call(p, q, k, v, plan_only=True)
    views, q_blhd, kv_blhd = _views(*served)
    ocols = p.Dv if kp.Dv != p.Dv else 0  # launch.o_cols(kp, o) of the call's o (p.Dv columns)
    incols = launch.in_cols(kp, views[0], views[2])
    text = launch.describe(kp, q_blhd, kv_blhd, force_split, ocols, incols)
    if kp is not p:
        pads = [f"{n} {d} -> {kd}" for n, d, kd in (("Dqk", p.Dqk, kp.Dqk), ("Dv", p.Dv, kp.Dv))
                if d != kd]
        made = [n for n, x, y in zip("qkv", (q, k, v), served) if not _same_storage(x, y)]
        text += (f" (head dims padded: {', '.join(pads)}; " + (
            "inputs read narrow)" if launch.reads_narrow(p)
            else f"copies {', '.join(made)}, keys {p.Lk - kp.Lk}..{p.Lk - 1})"))
    copies = [n for n, x in zip("qkv", views) if _copied(x)]
    return text + (f" (copies {', '.join(copies)})" if copies and p.device.type == "cuda" else "")


def sliding_window_attention(q, k, v, *, window_size, chunk_size, mask_lmk=True,
                             expand_to_chunk=True, kv_start=0, sm_scale=None):
    """HiLS sliding-window attention forward with TileLang kernels.

    Same contract as :func:`reference.sliding_window_attention`: returns
    ``o (B, Hq, Lq, Dv)`` contiguous in ``q.dtype`` and ``lse (B, Hq, Lq)``
    fp32, natural log. Raises ``ValueError`` for bad input and
    :class:`UnsupportedConfig` for head dims outside 32..256 (head dims that are
    not multiples of 16 run on kernels built for the next multiple, reading the inputs as
    they are or zero-padded copies: the module's docstring),
    ``Lk + min(chunk_size, Lk + 1) >= 2**29`` (``launch.frame``; from ``2**22`` the
    kernels are built ``wide``, ``launch.wide_positions``), ``|sm_scale| > 2.3586e38`` (the
    score scale ``sm_scale * log2(e)`` is float32), devices other than CUDA/CPU,
    bf16/fp16 on a CUDA device that is not Hopper, and more than 65535 query heads on a CUDA
    device (a launch grid's y extent holds one batch's heads; batches past the grid's bounds
    run as slices). Scores are float32: a score
    ``sm_scale * <q_i, k_j>`` beyond the float32 range overflows as float32
    does (data-dependent, not checked).
    """
    p = _problem(q, k, v, window_size, chunk_size, mask_lmk, expand_to_chunk, kv_start, sm_scale)
    if p.empty:
        return p.new_outputs()
    return _run(p, q, k, v)


def _run(p, q, k, v, force_split: int | None = None, run_cpu=None):
    """``(o, lse)`` of a checked, non-empty call: the call as the kernels take it
    (:func:`_kernel_call`), run on its device into outputs of the call's shape (at a padded
    ``Dv`` the kernels write its ``Dv`` columns, ``launch.o_cols``, but where
    ``launch.copied_out``). CUDA:
    :func:`_run_cuda` (``force_split``: ``split_kv``'s). CPU: the inputs upcast to fp32 in
    their storage orders, ``run_cpu`` (default :func:`launch.run_cpu`; the lab's CPU
    kernels with knobs, ``tools/lab_tilelang.py``) into fp32 outputs, ``o`` rounded to the
    input dtype."""
    if device_type(p.device) == "cuda":
        return _run_cuda(p, q, k, v, force_split)
    kp, q, k, v = _kernel_call(p, q, k, v)
    (q_, k_, v_), q_blhd, kv_blhd = _views(q.float(), k.float(), v.float())
    o32 = torch.empty((p.B, p.Hq, p.Lq, p.Dv), dtype=torch.float32)
    lse = torch.empty((p.B, p.Hq, p.Lq), dtype=torch.float32)
    (run_cpu or launch.run_cpu)(kp, q_.contiguous(), k_.contiguous(), v_.contiguous(), q_blhd,
                                kv_blhd, o32, lse)
    return (o32 if p.dtype == torch.float32 else o32.to(p.dtype)), lse
