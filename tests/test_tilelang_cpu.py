"""The TileLang backend on CPU tensors: the CPU kernel (TileLang C target) is a
real TileLang execution of the shared macros, checked against reference.golden.

Tolerance: the conformance suite's own (``conformance.verdict``): max and mean
|out - golden| within 2 x the same-dtype reference's error plus a floor. The
CPU kernel computes in fp32, so low-precision cases are far inside it; the
knob tests hold fp32 to 1e-5 absolute.
"""

import dataclasses
import math

import pytest
import torch

pytest.importorskip("tilelang", reason="tilelang is not installed")

import reference  # noqa: E402
from conformance import verdict  # noqa: E402
from conformance.cases import poison_unseen, seen_tail  # noqa: E402
from reference import UnsupportedConfig, check_inputs  # noqa: E402
import tilelang_impl  # noqa: E402
from tilelang_impl import launch, sliding_window_attention as swa  # noqa: E402

def _inputs(B, Hq, Hkv, Lq, Lk, Dqk, Dv, dtype, seed=0, blhd=False):
    g = torch.Generator().manual_seed(seed)

    def mk(H, L, D):
        if blhd:
            return torch.randn(B, L, H, D, generator=g).to(dtype).transpose(1, 2)
        return torch.randn(B, H, L, D, generator=g).to(dtype)
    return mk(Hq, Lq, Dqk), mk(Hkv, Lk, Dqk), mk(Hkv, Lk, Dv)


def _poison(q, k, v, kw):
    """Copies of ``k`` and ``v`` with NaN in every key slot no query of the call
    sees (landmarks, left of every window), and that ``(Lk,)`` mask."""
    k, v = k.clone(), v.clone()
    return k, v, poison_unseen(k, v, q.shape[2], kw)


def _assert_exact(o, lse, go, gl, what=""):
    """fp32 CPU kernel against float64 golden: no NaN, the same -inf rows, and
    ``o`` / finite ``lse`` within 1e-5."""
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert torch.equal(torch.isneginf(lse), torch.isneginf(gl))
    assert (o.double() - go).abs().max().item() <= 1e-5, what
    fin = torch.isfinite(gl)
    if fin.any():
        assert (lse.double() - gl)[fin].abs().max().item() <= 1e-5, what


def _check(q, k, v, *, nan_slots=False, **kw):
    """Run the backend and judge it with the suite's policy (conformance.verdict):
    shape, dtype, layout, empty rows, NaN and infinities exact; max and mean
    error within 2x the same-dtype reference's plus a floor."""
    if nan_slots:
        k, v, bad = _poison(q, k, v, kw)
        assert bad.any(), "test must poison at least one slot"
    o, lse = swa(q, k, v, **kw)
    verdict.assert_pass(o, lse, q, k, v, kw)
    return o, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gqa_defaults(dtype):
    q, k, v = _inputs(2, 4, 2, 45, 45, 64, 64, dtype)
    _check(q, k, v, window_size=9, chunk_size=4)


@pytest.mark.parametrize("mask_lmk,expand", [(False, False), (False, True), (True, False)])
def test_flags(mask_lmk, expand):
    q, k, v = _inputs(1, 2, 1, 40, 40, 64, 64, torch.float32, seed=1)
    _check(q, k, v, window_size=7, chunk_size=5, mask_lmk=mask_lmk, expand_to_chunk=expand)


def test_lq_lt_lk_large_kv_start_mqa_sm_scale():
    q, k, v = _inputs(1, 3, 1, 17, 70, 64, 64, torch.float32, seed=2)
    _check(q, k, v, window_size=20, chunk_size=6, kv_start=10**6 + 3, sm_scale=0.37)


def test_kv_start_beyond_int32():
    q, k, v = _inputs(1, 2, 2, 20, 50, 32, 32, torch.float32, seed=3)
    _check(q, k, v, window_size=11, chunk_size=7, kv_start=2**40 + 5)


def test_negative_left_edge_floor():
    # left(i) = qpos - 37 + 1 < 0 for early rows; floor (not truncation) to the chunk
    q, k, v = _inputs(1, 2, 2, 60, 60, 32, 32, torch.float32, seed=4)
    _check(q, k, v, window_size=37, chunk_size=16)


def test_chunk_size_one_rows_empty():
    q, k, v = _inputs(1, 2, 2, 12, 12, 32, 32, torch.float32, seed=5)
    o, lse = _check(q, k, v, window_size=4, chunk_size=1)
    assert torch.isneginf(lse).all() and (o == 0).all()


def test_nan_in_invisible_slots():
    q, k, v = _inputs(1, 2, 1, 24, 80, 64, 64, torch.float32, seed=6)
    _check(q, k, v, window_size=10, chunk_size=4, kv_start=3, nan_slots=True)


def test_blhd_views_and_dqk_ne_dv():
    q, k, v = _inputs(2, 4, 2, 33, 33, 64, 32, torch.float32, seed=7, blhd=True)
    assert not q.is_contiguous() and q.transpose(1, 2).is_contiguous()
    _check(q, k, v, window_size=8, chunk_size=4)


PADDED_KW = dict(window_size=11, chunk_size=4, kv_start=5)


@pytest.mark.parametrize("Dqk,Dv,blhd,dtype,flags", [
    (40, 40, False, torch.float32, {}), (72, 56, True, torch.float16, {}),
    (33, 200, False, torch.bfloat16, {}), (64, 40, True, torch.float32, {}),
    (40, 64, False, torch.float32, dict(expand_to_chunk=False)),
    (255, 33, False, torch.float32, dict(mask_lmk=False, expand_to_chunk=False))],
    ids=lambda x: str(x).replace("torch.", "") if not isinstance(x, dict) else
    "-".join(f"{n}{int(b)}" for n, b in x.items()) or "defaults")
def test_head_dims_between_kernel_steps_run_padded(Dqk, Dv, blhd, dtype, flags, monkeypatch):
    """Head dims that are not multiples of launch.D_STEP run as the same call on zero-padded
    copies (api._kernel_call): the kernel is built for the padded dims, only the keys from
    the first one a query sees are copied (the call moved to start there, kv_start included,
    so the landmarks stay put; without expand_to_chunk the new start is off the chunk grid),
    the kernel writes the call's o itself, its Dv columns (launch.o_cols: nothing copied out;
    outputs allocated poisoned, so a column not written is caught), and the scale stays
    1 / sqrt(Dqk) of the call, not of the padded dim. NaN in every slot no query sees,
    including those left of the copied range. The copies are stored as the kernels read them
    (no second copy)."""
    from conformance.runner import poisoned_empty
    from tilelang_impl import api
    kw = dict(PADDED_KW, **flags)
    q, k, v = _inputs(2, 4, 2, 9, 60, Dqk, Dv, dtype, seed=Dqk + Dv, blhd=blhd)
    seen = {}
    run_cpu, kernel = launch.run_cpu, launch._kernel

    def spy(p, *a):
        seen.update(p=p, o_cols=a[5].shape[-1])
        return run_cpu(p, *a)

    def spy_kernel(kind, *a, **named):  # what the C kernel is built with
        seen["named"] = named
        return kernel(kind, *a, **named)
    monkeypatch.setattr(launch, "run_cpu", spy)
    monkeypatch.setattr(launch, "_kernel", spy_kernel)
    with poisoned_empty():
        _check(q, k, v, nan_slots=True, **kw)
    kp = seen["p"]
    assert seen["o_cols"] == Dv and seen["named"].get("o_cols", 0) == (Dv if Dv % 16 else 0)
    assert (kp.Dqk, kp.Dv) == launch.kernel_dims(kp) == (-(-Dqk // 16) * 16, -(-Dv // 16) * 16)
    rule = {n: kw[n] for n in ("window_size", "chunk_size", "kv_start", "expand_to_chunk")
            if n in kw}
    j0 = reference.visible_key_range(0, 9, Lq=9, Lk=60, **rule)[0]
    assert j0 > 0 and (kp.Lk, kp.kv_start, kp.Lq) == (60 - j0, 5 + j0, 9)
    assert kp.sm_scale == 1 / math.sqrt(Dqk)
    p = api._problem(q, k, v, devices=("cpu",), sm_scale=None, **{
        **dict(mask_lmk=True, expand_to_chunk=True), **kw})
    _, *served = api._kernel_call(p, q, k, v)
    assert not any(api._copied(x) for x in api._views(*served)[0])
    text = api.describe_call(q, k, v, **kw)
    assert f"; copies q, k, v, keys {j0}..59" in text or f"; copies k, v, keys {j0}..59" in text
    assert (f"Dqk {Dqk} -> {kp.Dqk}" in text) == (Dqk % 16 > 0) == ("copies q," in text)
    assert (f"Dv {Dv} -> {kp.Dv}" in text) == (f" [o_cols={Dv}]" in text) == (Dv % 16 > 0)


@pytest.mark.parametrize("Dv", [36, 56])
def test_padded_call_on_the_cuda_branch(Dv, monkeypatch):
    """api._run's CUDA branch: launch.run_cuda gets the call as the kernels take it and the
    call's own outputs (o of the call's Dv, canonical: the kernels write it, launch.o_cols),
    and the call returns those very tensors (the launcher stubbed; nothing is copied out).
    Dv = 36 (72-byte rows, which no tensor map takes): the padded copies of the keys from the
    first one a query sees. Dv = 56 (Dqk = 40: 80- and 112-byte rows): the call's own inputs,
    uncut, in place (launch.reads_narrow; launch.in_cols gives the kernels their widths)."""
    from tilelang_impl import api
    q, k, v = _inputs(2, 4, 2, 9, 60, 40, Dv, torch.bfloat16, blhd=True)
    got = {}

    def fake_run_cuda(kp, q_, k_, v_, q_blhd, kv_blhd, o, lse, force_split=None):
        got.update(kp=kp, tensors=(q_, k_, v_), split=force_split, o=o, lse=lse,
                   o_cols=launch.o_cols(kp, o), in_cols=launch.in_cols(kp, q_, v_),
                   layouts=(q_blhd, kv_blhd))
        o.fill_(1.0)
        lse.zero_()
    p = api._problem(q, k, v, devices=("cpu",), sm_scale=None, mask_lmk=True,
                     expand_to_chunk=True, **PADDED_KW)
    monkeypatch.setattr(launch, "run_cuda", fake_run_cuda)
    monkeypatch.setattr(api, "device_type", lambda d: "cuda")
    monkeypatch.setattr(launch, "device_type", lambda d: "cuda")
    assert launch.reads_narrow(p) == (Dv == 56)
    o, lse = api._run(p, q, k, v, force_split=3)
    kp = got["kp"]
    shapes = tuple(x.shape for x in got["tensors"])
    dims = (launch.TC_WIDER.get(48, 48), 64) if Dv == 56 else (48, 48)  # as TC_WIDER says
    assert (kp.Dqk, kp.Dv, got["split"], got["o_cols"]) == (*dims, 3, Dv)
    if Dv == 56:  # read in place: the call's own storage, (B, L, H, D) order, every key
        assert (kp.Lk, kp.kv_start) == (p.Lk, p.kv_start) and got["in_cols"] == (40, 56)
        assert shapes == ((2, 9, 4, 40), (2, 60, 2, 40), (2, 60, 2, 56))
        assert all(y.data_ptr() == x.data_ptr() for x, y in zip((q, k, v), got["tensors"]))
    else:  # the kernels' views of the copies: (B, L, H, D) storage order (api._views)
        assert kp.Lk < p.Lk and got["in_cols"] == (0, 0)
        assert shapes == ((2, 9, 4, 48), (2, kp.Lk, 2, 48), (2, kp.Lk, 2, 48))
    assert got["layouts"] == (True, True)
    assert o is got["o"] and lse is got["lse"]
    assert o.shape == (2, 4, 9, Dv) and o.is_contiguous() and bool((o == 1).all())


@pytest.mark.parametrize("Lq, Dv", [(4096, 104), (1, 120)])
def test_a_narrow_call_bakes_its_widths(Lq, Dv, monkeypatch):
    """A bf16 call at Dqk = 120 planned on meta tensors through the real launcher
    (api._run_cuda, launch._kernel recorded, as tools/tl_lower.py plans): the prefill (Lq =
    4096, Dv = 104) builds the tensor-core kernel for 128 x 112 with qk_cols = 120, v_cols = 104
    and o_cols = 104; the decode (Lq = 1 of 8K keys, Dv = 120) the split kernel for 128 x 128
    with qk_cols / v_cols = 120 (its partials keep 128 columns: o_cols 0) and a combine with
    o_cols = 120; api._describe says the inputs are read narrow. The same call in fp32 builds
    fwd_fp32 on padded copies of the keys a query sees, named by _describe."""
    from tilelang_impl import api
    built = []
    monkeypatch.setattr(launch, "_kernel",
                        lambda kind, *a, **k: built.append((kind, a)) or (lambda *x: None))
    for dtype in (torch.bfloat16, torch.float32):
        q, k, v = (torch.empty(s, dtype=dtype, device="meta") for s in
                   ((1, 8, Lq, 120), (1, 8, 8192, 120), (1, 8, 8192, Dv)))
        p = api._problem(q, k, v, 512, 64, True, True, 0, None, devices=("meta",))
        built.clear()
        api._run_cuda(p, q, k, v)
        text = api._describe(p, q, k, v)
        kinds = {kind: a for kind, a in built}
        if dtype == torch.float32:
            assert list(kinds) == ["fwd_fp32"] and "copies q, k, v, keys" in text
            continue
        args = kinds["fwd_tc"]
        dv = -(-Dv // 16) * 16
        assert args[:2] == (128, launch.TC_WIDER.get(dv, dv)) and "inputs read narrow" in text
        assert (launch.tc_knob(args, "qk_cols"), launch.tc_knob(args, "v_cols")) == (120, Dv)
        assert f"qk_cols=120 v_cols={Dv}" in text
        if Lq == 1:
            assert args[11] and launch.tc_knob(args, "o_cols") == 0  # split
            assert kinds["combine"] == launch.combine_key(args, Dv)[1]
        else:
            assert not args[11] and launch.tc_knob(args, "o_cols") == Dv
            assert "combine" not in kinds


def test_wider_kernels_only_where_the_inputs_read_narrow(monkeypatch):
    """launch.TC_WIDER (shipped: 48 -> 64, 112 -> 128, session 58's lab) widens a head dim,
    after its rounding to a multiple of 16, each dim on its own, and only for the calls
    launch.reads_narrow takes (bf16 / fp16 on the GPU, meta here): fp32 and CPU calls, and a
    call with a dim whose rows no tensor map takes, keep the rounded dims. A widened call is
    the call's own inputs (j0 = 0) at the kernels' dims. The shipped table's entries map a
    multiple of 16 to a larger multiple of 64 up to launch.MAX_D."""
    from tilelang_impl import api
    for d, w in launch.TC_WIDER.items():
        assert d % launch.D_STEP == 0 and w % 64 == 0 and d < w <= launch.MAX_D, (d, w)
    monkeypatch.setattr(launch, "TC_WIDER", {48: 64, 112: 128})

    def prob(Dqk, Dv, dtype=torch.bfloat16, device="meta"):
        q, k, v = (torch.empty(s, dtype=dtype, device=device) for s in
                   ((1, 2, 4, Dqk), (1, 2, 8, Dqk), (1, 2, 8, Dv)))
        return api._problem(q, k, v, 4, 2, True, True, 0, None, devices=(device,))
    assert launch.kernel_dims(prob(112, 128)) == (128, 128)
    assert launch.kernel_dims(prob(40, 112, torch.float16)) == (64, 128)  # 40 -> 48 -> 64
    assert launch.kernel_dims(prob(112, 112, torch.float32)) == (112, 112)
    assert launch.kernel_dims(prob(112, 112, device="cpu")) == (112, 112)
    assert launch.kernel_dims(prob(36, 112)) == (48, 112)  # 72-byte rows: copies, not widened
    kp, j0 = api._kernel_problem(prob(112, 96))
    assert (kp.Dqk, kp.Dv, j0) == (128, 96, 0) and launch.reads_narrow(kp)


def test_narrow_inputs_only_where_a_tensor_map_takes_them(monkeypatch):
    """launch.reads_narrow: bf16 / fp16 on the GPU (or meta, planned as it) with both head dims'
    rows a multiple of 16 bytes; launch.in_cols refuses other narrow widths and wider inputs,
    and the fp32 and CPU kernels refuse narrow inputs (before building anything)."""
    from tilelang_impl import api

    def prob(Dqk, Dv, dtype, device="meta"):
        q, k, v = (torch.empty(s, dtype=dtype, device=device) for s in
                   ((1, 2, 4, Dqk), (1, 2, 8, Dqk), (1, 2, 8, Dv)))
        return api._problem(q, k, v, 4, 2, True, True, 0, None, devices=(device,)), q, v
    for Dqk, Dv, dtype, want in ((120, 120, torch.bfloat16, True), (40, 56, torch.float16, True),
                                 (120, 90, torch.bfloat16, False), (36, 64, torch.bfloat16, False),
                                 (120, 120, torch.float32, False)):
        assert launch.reads_narrow(prob(Dqk, Dv, dtype)[0]) == want, (Dqk, Dv, dtype)
    assert not launch.reads_narrow(prob(120, 120, torch.bfloat16, "cpu")[0])
    p, q, v = prob(120, 104, torch.bfloat16)
    kp = api._kernel_problem(p)[0]
    assert launch.in_cols(kp, q, v) == (120, 104) and launch.in_cols(p, q, v) == (0, 0)
    for bad_q, bad_v in (((1, 2, 4, 36), (1, 2, 8, 104)), ((1, 2, 4, 136), (1, 2, 8, 104))):
        with pytest.raises(ValueError, match="columns: the kernels read"):
            launch.in_cols(kp, torch.empty(bad_q, dtype=torch.bfloat16, device="meta"),
                           torch.empty(bad_v, dtype=torch.bfloat16, device="meta"))
    p32, q32, v32 = prob(120, 104, torch.float32)
    kp32 = dataclasses.replace(p32, Dqk=128, Dv=112)
    o = torch.empty(1, 2, 4, 104, device="meta")
    lse = torch.empty(1, 2, 4, device="meta")
    monkeypatch.setattr(launch, "_kernel", lambda *a, **k: pytest.fail("built a kernel"))
    with pytest.raises(ValueError, match="fwd_fp32 reads"):
        launch.run_cuda(kp32, q32, q32, v32, False, False, o, lse)
    with pytest.raises(ValueError, match="fwd_cpu reads"):
        launch.run_cpu(kp32, q32, q32, v32, False, False, o, lse)


def _bits_at(shape, dtype, lead: int, offset: int, seed: int):
    """Random bit patterns (NaN payloads included) of `shape` as `dtype`, in a storage that
    starts `lead` bytes past an 8-byte boundary, the tensor `offset` elements into it."""
    isize = {2: torch.int16, 4: torch.int32}[dtype.itemsize]
    n, es = math.prod(shape), dtype.itemsize
    raw = bytearray((n + offset) * es + 16)
    skip = (lead - torch.frombuffer(raw, dtype=torch.uint8).data_ptr()) % 8
    buf = torch.frombuffer(raw, dtype=isize, count=n + offset, offset=skip)
    half = 2 ** (8 * es - 1)
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-half, half, shape, generator=g).to(isize)
    out = buf[offset:].view(shape).copy_(bits).view(dtype)
    assert (out.untyped_storage().data_ptr() - lead) % 8 == 0 and out.storage_offset() == offset
    return out


@pytest.mark.parametrize("D,pad_to,dtype,lead,offset,row,blhd,word", [
    (40, 48, torch.bfloat16, 0, 0, 44, False, torch.int64),
    (120, 128, torch.float16, 0, 0, 124, True, torch.int64),
    (90, 96, torch.bfloat16, 0, 0, 94, False, torch.int32),  # a 180-byte row
    (33, 48, torch.bfloat16, 0, 0, 37, True, None),  # a 66-byte row
    (40, 48, torch.bfloat16, 0, 1, 44, False, None),  # 2 bytes past the word
    (40, 48, torch.bfloat16, 0, 2, 44, True, torch.int32),  # 4 bytes past
    (40, 48, torch.float32, 0, 1, 44, False, None),
    (72, 80, torch.float32, 0, 0, 76, True, torch.int64),
    (64, 64, torch.bfloat16, 0, 0, 68, False, torch.int64),  # cut keys: copied, not padded
    (40, 48, torch.bfloat16, 0, 0, 42, False, torch.int32),  # rows 84 bytes apart
    (40, 48, torch.bfloat16, 2, 0, 44, False, None),  # the storage, and the view, off 8
    (40, 48, torch.bfloat16, 2, 3, 44, False, None),  # at an 8-byte address, offset 6 bytes
    (40, 48, torch.bfloat16, 0, 0, 80, False, None)],  # every other element: stride 2
    ids=lambda x: str(x).replace("torch.", ""))
def test_padding_copies_move_the_same_bits_in_words(D, pad_to, dtype, lead, offset, row, blhd,
                                                    word):
    """api._padded copies rows as the widest integer word that tiles every row, stride,
    storage offset and address (api._words): the word view is what reaches the pad or the
    copy (the ops recorded under a dispatch mode), and the bits are F.pad's (or
    .contiguous()'s), NaN payloads included. Sources of random bit patterns: rows
    longer than D, views past the word, storages off the word (torch.frombuffer), a last dim
    of stride 2 (no word), a key-range cut (not contiguous) where D == pad_to."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode
    from tilelang_impl import api

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.dtypes = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in ("constant_pad_nd", "clone", "copy_"):
                self.dtypes.setdefault(name, []).append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    isize = {2: torch.int16, 4: torch.int32}[dtype.itemsize]
    raw = _bits_at((2, 3, 7, row), dtype, lead, offset, seed=D + row + lead + offset)
    raw = raw[..., :2 * D:2] if row == 2 * D else raw[..., :D]  # (B, L, H, D) where blhd
    x = raw.transpose(1, 2) if blhd else raw
    if D == pad_to:
        x = x[:, :, 2:]
    s = x.transpose(1, 2) if blhd else x
    assert api._words(s).dtype == (word or dtype)
    with Ops() as ops:
        got = api._padded(x, pad_to, blhd, plan_only=False)
    moved = word or dtype
    assert ops.dtypes == ({"constant_pad_nd": [moved]} if D != pad_to else {"clone": [moved]})
    g_s = got.transpose(1, 2) if blhd else got
    assert g_s.is_contiguous() and g_s.shape[-1] == pad_to and got.dtype == dtype
    assert torch.equal(g_s.view(isize), F.pad(s.contiguous().view(isize), (0, pad_to - D)))
    plan = api._padded(x, pad_to, blhd, plan_only=True)
    assert plan.device.type == "meta" and plan.shape == got.shape
    # the layout the copy has; a size-1 dim's stride may differ (F.pad's choice; no reader
    # of a contiguous tensor looks at it)
    assert [st for st, n in zip(plan.stride(), plan.shape) if n > 1] == [
        st for st, n in zip(got.stride(), got.shape) if n > 1]


@pytest.mark.parametrize("D,n,word", [(96, 90, torch.int32), (128, 120, torch.int64),
                                      (48, 33, torch.bfloat16), (64, 56, torch.int64)])
def test_copy_out_moves_the_columns_bit_for_bit_in_words(D, n, word):
    """launch.copy_columns (the copy-out where o's rows take no tensor map, launch.run_cuda):
    the first n columns of the padded output, NaN payloads included, as the widest word both
    views take (what reaches copy_, recorded under a dispatch mode)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.dtypes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ == "copy_":
                self.dtypes.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(D + n)
    full = torch.randint(-2 ** 15, 2 ** 15, (2, 3, 5, D), generator=g).to(torch.int16)
    full = full.view(torch.bfloat16)
    o = torch.full((2, 3, 5, n), float("nan"), dtype=torch.bfloat16)
    with Ops() as ops:
        launch.copy_columns(o, full)
    assert ops.dtypes == [word]
    assert torch.equal(o.view(torch.int16), full[..., :n].contiguous().view(torch.int16))


def test_describe_names_only_the_copies_made():
    """A key cut that leaves k contiguous (one batch, one key head) is a view of k, not a copy:
    describe_call names v's padded copy alone."""
    from tilelang_impl import api
    q, k, v = _inputs(1, 2, 1, 9, 60, 64, 40, torch.float32)
    assert "; copies v, keys " in api.describe_call(q, k, v, **PADDED_KW)


def test_head_dims_on_kernel_steps_are_not_copied(monkeypatch):
    """A call whose head dims are multiples of launch.D_STEP reaches the kernel with its own
    tensors and problem: no padding copy, no key range cut."""
    from tilelang_impl import api
    q, k, v = _inputs(1, 2, 1, 9, 60, 48, 80, torch.float32)
    assert api._kernel_call(p := api._problem(q, k, v, 11, 4, True, True, 5, None), q, k, v) == (
        p, q, k, v)
    assert "padded" not in api.describe_call(q, k, v, window_size=11, chunk_size=4, kv_start=5)


def test_kernels_refuse_head_dims_between_steps():
    """launch._kernel refuses to build a forward kernel for head dims that are not multiples
    of D_STEP (the adapter pads those first), before TileLang sees them."""
    with pytest.raises(RuntimeError, match="multiples of 16"):
        launch._kernel("fwd_cpu", 40, 48, True, True, False, False, 16, 16)


def test_d96_and_odd_strides():
    q, k, v = _inputs(1, 2, 2, 20, 20, 96, 96, torch.float32, seed=8)
    v = torch.randn(1, 20, 96, 2).permute(0, 3, 1, 2)  # (1, 2, 20, 96), neither BHLD nor BLHD
    assert not v.is_contiguous() and not v.transpose(1, 2).is_contiguous()
    _check(q, k, v, window_size=6, chunk_size=3)


def test_unsupported_and_errors():
    q, k, v = _inputs(1, 1, 1, 4, 4, 264, 264, torch.float32)
    with pytest.raises(UnsupportedConfig, match=r"Dqk=264 is not supported \(32..256\)"):
        swa(q, k, v, window_size=2, chunk_size=2)
    q, k, v = _inputs(1, 1, 1, 4, 4, 64, 31, torch.float32)
    with pytest.raises(UnsupportedConfig, match=r"Dv=31 is not supported"):
        swa(q, k, v, window_size=2, chunk_size=2)
    q, k, v = _inputs(1, 3, 2, 4, 4, 32, 32, torch.float32)
    with pytest.raises(ValueError, match="Hq % Hkv"):
        swa(q, k, v, window_size=2, chunk_size=2)
    q, k, v = _inputs(1, 2, 2, 4, 4, 32, 32, torch.float32)
    with pytest.raises(ValueError, match="window_size"):
        swa(q, k, v, window_size=0, chunk_size=2)
    # positions of the kernel frame past 2**29: test_positions_past_2_29_are_refused
    # the float32 score scale sm_scale * log2(e) would overflow (it gave a wrong o)
    with pytest.raises(UnsupportedConfig, match="sm_scale"):
        swa(q, k, v, window_size=2, chunk_size=2, sm_scale=2.4e38)


@pytest.mark.parametrize("chunk_size, kv_start, mask_lmk, expand, frame", [
    (1 << 22, 0, True, True, (0, 20, 71)),          # the chunk outlasts every key: Lk + 1
    (1 << 40, 12345, False, False, (0, 20, 71)),    # a sentinel chunk, both flags off
    # r + Lk past the chunk: the chunk itself, Lk + C < 2**22
    ((1 << 21) + 3, 1 << 21, True, True, (1 << 21, 20, (1 << 21) + 3)),
    # the chunk's boundary at key 50 (its landmark key 49): Lk + chunk would pass 2**22,
    # so the kernel frame shifts it into a chunk of Lk + 1, r = 71 - 50 (until session 30
    # refused)
    ((1 << 22) - 2, (1 << 22) - 52, True, True, (21, 20, 71)),
    ((1 << 22) - 2, (1 << 22) - 52, True, False, (21, 20, 71)),
    (2 ** 63 + 100, 2 ** 63 + 50, False, True, (21, 20, 71)),
])
def test_large_chunks_within_the_kernel_frame_are_served(chunk_size, kv_start, mask_lmk, expand, frame):
    """The position limits (launch.MAX_POSITIONS, launch.MAX_POSITIONS_WIDE) are on the kernel
    frame's positions (launch.check_limits with launch.frame's chunk), not on the raw
    chunk_size or kv_start: chunks longer than
    every key run, and match the reference; so does a long chunk whose boundary falls
    inside the cache, rows on both sides of it (window 20)."""
    q, k, v = _inputs(1, 2, 1, 40, 70, 32, 32, torch.float32, seed=3)
    kw = dict(window_size=20, chunk_size=chunk_size, kv_start=kv_start, mask_lmk=mask_lmk,
              expand_to_chunk=expand)
    assert launch.frame(check_inputs(q, k, v, **kw)) == frame
    _check(q, k, v, **kw)


def _landmark_probe(wide: bool):
    """A C-target kernel running ``macros.is_landmark`` (the kernels' own macro) at every
    ``X[i]`` for chunk ``C``: ``Y[i] = 1`` where it names ``X[i]`` a landmark; the divisor
    as the kernels built ``wide`` or not pass it (``macros.landmark_divisor``)."""
    import tilelang
    import tilelang.language as T

    from tilelang_impl import macros as M

    @tilelang.jit(target="c", execution_backend="cython")
    def probe(wide: bool):
        N, i32 = T.dynamic("N"), "int32"

        @T.prim_func
        def main(X: T.Tensor((N,), i32), Y: T.Tensor((N,), i32), C: T.int32,
                 inv_c: T.float32):
            with T.Kernel(1, threads=1):
                for i in T.serial(N):
                    Y[i] = T.if_then_else(M.is_landmark(X[i], C, M.landmark_divisor(inv_c, wide)),
                                          1, 0)
        return main
    return probe(wide)


def test_landmark_test_single_quotient_below_2_24_two_up_to_2_29():
    """``macros.is_landmark`` on TileLang's C target against ``(x + 1) % C == 0`` on
    Python ints: one float quotient (every kernel below launch.MAX_POSITIONS = 2**22) is
    exact for positions below 2**24 and wrong past 2**25 for small chunks; two (the kernels
    built ``wide``, up to launch.MAX_POSITIONS_WIDE = 2**29 plus a tile's keys past Lk)
    are exact everywhere tested. Chunks 1..299, 2**p - 1 .. 2**p + 1 up to 2**28 and random
    ones up to 2**29; positions random, every multiple of C near the top with its
    neighbours, and the first 2000."""
    g = torch.Generator().manual_seed(2026_12_05)
    top = launch.MAX_POSITIONS_WIDE + 256
    chunks = (list(range(1, 300)) + [2 ** p + d for p in range(9, 29) for d in (-1, 0, 1)]
              + torch.randint(1, launch.MAX_POSITIONS_WIDE, (100,), generator=g).tolist())
    kernels = {w: _landmark_probe(w) for w in (False, True)}
    wrong = {(w, low): 0 for w in (False, True) for low in (False, True)}
    for C in chunks:
        n = top // C
        near = torch.arange(max(0, n - 40), n + 1, dtype=torch.int64) * C
        x = torch.cat([torch.randint(0, top, (20_000,), generator=g), near - 2, near - 1, near,
                       torch.arange(2000)])
        x = x[(x >= 0) & (x < top)]
        want = (x + 1) % C == 0
        low = x + 1 < 2 ** 24
        xi = x.to(torch.int32)
        for w, ker in kernels.items():
            y = torch.full_like(xi, 7)
            ker(xi, y, C, 1.0 / C)
            assert bool(((y == 0) | (y == 1)).all())
            bad = (y == 1) != want
            wrong[w, True] += int(bad[low].sum())
            wrong[w, False] += int(bad[~low].sum())
    assert wrong[True, True] == wrong[True, False] == 0, wrong
    assert wrong[False, True] == 0, wrong
    assert wrong[False, False] > 0, wrong  # the single quotient is not enough up there


#: A cache whose kernel frame reaches past 2**25, where the single float quotient names
#: wrong keys landmarks for small chunks, and the tail of it that is written.
WIDE_LK, WIDE_TAIL = (1 << 26) + 1003, 4096


@pytest.fixture(scope="module")
def cache_past_2_26():
    """``k``, ``v`` of ``WIDE_LK`` keys (one head, D = 32, fp32: 8 GiB each of address space)
    of which only the last ``WIDE_TAIL`` are written: the rest stays unbacked (the kernels
    read the keys a query can see, all in the tail), so resident memory stays small."""
    g = torch.Generator().manual_seed(31)
    k, v = torch.empty(1, 1, WIDE_LK, 32), torch.empty(1, 1, WIDE_LK, 32)
    k[:, :, -WIDE_TAIL:] = torch.randn(1, 1, WIDE_TAIL, 32, generator=g)
    v[:, :, -WIDE_TAIL:] = torch.randn(1, 1, WIDE_TAIL, 32, generator=g)
    return k, v


WIDE_CASES = [  # (Lq, W, C, kv_start, flags)
    (33, 512, 3, 1, (True, True)),             # C = 3: the general float test per score
    (1, 300, 7, 10**6 + 3, (True, False)),     # decode
    (40, 512, 5, 2, (False, True)),            # no landmarks: the window alone
    (40, 70, 64, 2 ** 40 + 12345, (True, True)),
    (40, 70, 2 ** 40, 2 ** 40 - 50, (True, False)),  # the chunk's boundary inside the cache
]


def _wide_call(cache, Lq, W, C, kv_start, flags):
    k, v = cache
    q = torch.randn(1, 2, Lq, 32, generator=torch.Generator().manual_seed(Lq + W))
    kw = dict(window_size=W, chunk_size=C, kv_start=kv_start, mask_lmk=flags[0],
              expand_to_chunk=flags[1])
    return q, kw, seen_tail(k, v, Lq, kw, WIDE_TAIL)  # every key a query sees is written


@pytest.mark.parametrize("Lq, W, C, kv_start, flags", WIDE_CASES)
def test_caches_past_2_26_keys_run_the_wide_kernel(cache_past_2_26, Lq, W, C, kv_start, flags):
    """A cache of 2**26 + 1003 keys puts the kernel frame's positions past
    launch.MAX_POSITIONS: the CPU kernel is built ``wide`` (launch.wide_positions; refused
    as unsupported until session 31) and matches the reference run on the written tail
    (the suite's verdict)."""
    q, kw, (kt, vt, tkw) = _wide_call(cache_past_2_26, Lq, W, C, kv_start, flags)
    k, v = cache_past_2_26
    p = check_inputs(q, k, v, **kw)
    assert launch.wide_positions(p, launch.frame(p)[2])
    assert launch.describe(p).endswith("[wide]")
    o, lse = swa(q, k, v, **kw)
    verdict.assert_pass(o, lse, q, kt, vt, tkw)


def test_the_wide_cases_need_the_knob(cache_past_2_26, monkeypatch):
    """The same call on the kernel without ``wide`` (launch.wide_positions forced off, so
    run_cpu builds the single-quotient kernel) fails the verdict: the cases above test
    the knob and its way through run_cpu (session 31's review: at 2**22 + 1003 keys both
    kernels passed)."""
    q, kw, (kt, vt, tkw) = _wide_call(cache_past_2_26, *WIDE_CASES[0])
    k, v = cache_past_2_26
    monkeypatch.setattr(launch, "wide_positions", lambda p, C: False)
    o, lse = swa(q, k, v, **kw)
    assert verdict.judge(o, lse, verdict.expected(q, kt, vt, tkw)).status == verdict.FAIL


def test_positions_past_2_29_are_refused():
    """``Lk + min(chunk_size, Lk + 1) >= 2**29`` (launch.MAX_POSITIONS_WIDE) raises
    UnsupportedConfig before anything is copied or built (a stride-0 cache of 2**28 keys)."""
    q = torch.randn(1, 2, 1, 32)
    kk = torch.randn(1, 1, 1, 32).expand(1, 1, 1 << 28, 32)
    with pytest.raises(UnsupportedConfig, match="2\\*\\*29"):  # the frame's C: the chunk, Lk
        swa(q, kk, kk, window_size=2, chunk_size=1 << 28, kv_start=5)
    k1 = kk[:, :, 1:]  # one key less: Lk + C = 2**29 - 1, served by the wide kernels
    p = check_inputs(q, k1, k1, window_size=2, chunk_size=1 << 28, kv_start=5)
    assert launch.frame(p)[2] == 1 << 28
    launch.check_limits(p)
    assert launch.wide_positions(p, 1 << 28)


def test_gpu_launch_calls_the_executable_of_a_tvm_ffi_kernel(monkeypatch):
    """``launch._call``: for TileLang 0.1.15's tvm-ffi adapter with no output allocated
    by the kernel, the GPU launches call the adapter's executable with the arguments as
    given (what the adapter's own ``func`` does for such a kernel); any other release,
    adapter or ABI, and the switch off, keep the kernel's own call. ``_kernel`` is asked
    on every call (the tools that record the kernels a call asks for replace it)."""
    import tilelang

    from tilelang.jit.adapter import tvm_ffi

    calls = []

    class TVMFFIKernelAdapter:  # stands in for tvm_ffi.TVMFFIKernelAdapter
        result_idx: list = []

        def __init__(self):  # func: an attribute of the adapter, as TileLang sets it
            self.func = lambda *a: calls.append(("func", a))

        def _get_executable(self):
            return lambda *a: calls.append(("exe", a))

    class Kernel:
        def __init__(self, adapter):
            self.adapter = adapter
            self.torch_function = getattr(adapter, "func", None)

        def __call__(self, *a):
            calls.append(("ker", a))

    monkeypatch.setattr(tvm_ffi, "TVMFFIKernelAdapter", TVMFFIKernelAdapter)

    ker = Kernel(TVMFFIKernelAdapter())
    asked = []
    monkeypatch.setattr(launch, "_kernel", lambda kind, *a: asked.append(kind) or ker)
    monkeypatch.setattr(launch, "_calls", {})
    monkeypatch.setattr(launch, "FAST_CALL", True)
    monkeypatch.setattr(tilelang, "__version__", "0.1.15+cu130.gitabc")
    launch._call("fwd_tc", 1, 2)(10, 20, 0.5)
    launch._call("fwd_tc", 1, 2)(11, 21, 0.5)
    assert calls == [("exe", (10, 20, 0.5)), ("exe", (11, 21, 0.5))] and asked == ["fwd_tc"] * 2
    monkeypatch.setattr(launch, "FAST_CALL", False)
    launch._call("fwd_tc", 1, 2)(12,)
    assert calls[-1] == ("ker", (12,))
    monkeypatch.setattr(launch, "FAST_CALL", True)
    # refused: another release, another adapter, outputs the kernel allocates, the new ABI
    monkeypatch.setattr(tilelang, "__version__", "0.1.16")
    assert launch._executable(ker) is None
    monkeypatch.setattr(tilelang, "__version__", "0.1.15")
    assert launch._executable(ker) is not None
    assert launch._executable(Kernel(object())) is None
    assert launch._executable(object()) is None
    out = TVMFFIKernelAdapter()
    out.result_idx = [4]
    assert launch._executable(Kernel(out)) is None
    abi = TVMFFIKernelAdapter()
    abi._ffi_callee_allocated_output_abi = True
    assert launch._executable(Kernel(abi)) is None
    wrapped = Kernel(TVMFFIKernelAdapter())
    wrapped.torch_function = lambda *a: None  # the kernel's call is no longer the adapter's func
    assert launch._executable(wrapped) is None


def test_describe_call_names_the_kernel_run_cuda_would_build(monkeypatch):
    """describe_call / launch.describe plan only: on CPU tensors the C kernel; for a
    CUDA device (planned on CPU) the factory, tile, split count and combine, and the
    knobs baked for the call, as run_cuda asks launch._kernel for them."""
    import dataclasses

    q, k, v = _inputs(1, 2, 2, 4, 40, 32, 32, torch.float32)
    assert tilelang_impl.describe_call(q, k, v, window_size=8, chunk_size=4).startswith("fwd_cpu 16x16")
    monkeypatch.setattr(launch, "sm_count", lambda dev: 132)
    monkeypatch.setattr(launch, "capability", lambda dev: (9, 0))
    asked = []
    monkeypatch.setattr(launch, "_kernel", lambda kind, *a: asked.append((kind, a)) or (lambda *x: None))
    for B, Hq, Hkv, Lq, D, Dv in ((1, 32, 32, 1, 128, 128), (8, 32, 4, 1, 64, 64), (1, 4, 4, 512, 128, 128),
                                  (1, 16, 16, 1, 64, 96)):
        q = torch.empty(B, Hq, Lq, D, dtype=torch.bfloat16, device="meta")
        k = torch.empty(B, Hkv, 4096, D, dtype=torch.bfloat16, device="meta")
        v = torch.empty(B, Hkv, 4096, Dv, dtype=torch.bfloat16, device="meta")
        p = dataclasses.replace(reference.check_inputs(q, k, v, window_size=512, chunk_size=64),
                                device=torch.device("cuda"))
        text = launch.describe(p)
        asked.clear()
        launched, sizes = [], []
        with monkeypatch.context() as m:  # the split scratch would be a CUDA allocation
            m.setattr(launch, "scratch", lambda dev, shapes: sizes.append(shapes) or (None,) * len(shapes))
            # every launch goes through launch._call's executable where there is one
            m.setattr(launch, "FAST_CALL", True)
            m.setattr(launch, "_executable", lambda ker: lambda *a: launched.append(len(a)))
            o, lse = dataclasses.replace(p, device=q.device).new_outputs()  # meta, as q, k, v
            launch.run_cuda(p, q, k, v, False, False, o, lse)  # meta: v's chunk view is a view
        assert launched == [10] + [4] * (len(asked) - 1)  # the kernel's 10 arguments, the combine's 4
        (kind, args), *comb = asked
        assert text.startswith(f"{kind} {args[7]}x{args[8]} s{args[9]} t{args[10]}"), (text, args)
        assert (" +combine" in text) == bool(comb) == args[11]
        # one scratch request per split call: partial outputs (B, Hq, S, Lq, Dv), their LSEs
        S = int(text.split(" S=")[1].split()[0]) if comb else 0
        assert sizes == ([((B, Hq, S, Lq, Dv), (B, Hq, S, Lq))] if comb else [])
        assert ("pack=" in text) == (B == 8)
        assert "min_blocks=2" in text  # two CTAs per SM: the prefill and the split tile


def _meta_problem(B, Hq, Hkv, Lq, Lk, Dqk, Dv, dtype=torch.bfloat16, **kw):
    q = torch.empty(B, Hq, Lq, Dqk, dtype=dtype, device="meta")
    k = torch.empty(B, Hkv, Lk, Dqk, dtype=dtype, device="meta")
    v = torch.empty(B, Hkv, Lk, Dv, dtype=dtype, device="meta")
    return check_inputs(q, k, v, **kw)


def test_o_cols_reaches_each_kernel_that_writes_o(monkeypatch):
    """launch.run_cuda with an o narrower than the kernels' Dv (a call the adapter padded)
    builds every kernel that writes o for o's columns (launch.o_cols): the unpacked prefill
    tile where o's rows take a tensor map (launch.TMA_STRIDE; else it writes a padded o of
    run_cuda's own, whose columns launch.copy_columns copies into o: launch.copied_out), the
    packed rows at any width (an element loop), the combine after a split kernel (which keeps
    Dv for its partials) and fwd_fp32; describe names it; a wider o is refused."""
    import dataclasses
    import inspect

    from tilelang_impl import kernels
    monkeypatch.setattr(launch, "sm_count", lambda dev: 132)
    monkeypatch.setattr(launch, "capability", lambda dev: (9, 0))
    monkeypatch.setattr(launch, "scratch", lambda dev, shapes: (None,) * len(shapes))
    asked, launched, copies = [], [], []
    monkeypatch.setattr(launch, "_kernel", lambda kind, *a: asked.append((kind, a))
                        or (lambda *x: launched.append(  # o's columns (None: split scratch)
                            getattr(x[2 if kind == "combine" else 3], "shape", [None])[-1])))
    monkeypatch.setattr(launch, "FAST_CALL", False)
    copy_columns = launch.copy_columns
    monkeypatch.setattr(launch, "copy_columns", lambda o, full: copies.append(
        (o, full.shape[-1])) or copy_columns(o, full))
    threads = inspect.signature(kernels.combine.func).parameters["threads"].default
    assert threads == launch.COMBINE_THREADS
    oc = launch._KNOBS_AT + launch._KNOB["o_cols"]
    for Hkv, Lq, Lk, Dv, cols, dtype in (
            (32, 512, 8192, 128, 120, torch.bfloat16), (32, 1, 8192, 96, 90, torch.bfloat16),
            (32, 512, 8192, 64, 40, torch.float32), (32, 512, 8192, 64, 64, torch.bfloat16),
            (32, 512, 8192, 96, 90, torch.bfloat16), (32, 512, 8192, 96, 88, torch.float16),
            (8, 4, 128, 96, 90, torch.bfloat16)):  # packed: G = 4 heads of 4 queries
        p = dataclasses.replace(_meta_problem(1, 32, Hkv, Lq, Lk, 64, Dv, dtype, window_size=512,
                                              chunk_size=64), device=torch.device("cuda"))
        o = torch.empty(1, 32, Lq, cols, dtype=dtype, device="meta")
        lse = torch.empty(1, 32, Lq, device="meta")
        for x in (asked, launched, copies):
            x.clear()
        launch.run_cuda(p, *(torch.empty(1, h, n, d, dtype=dtype, device="meta")
                             for h, n, d in ((32, Lq, 64), (Hkv, Lk, 64), (Hkv, Lk, Dv))),
                        False, False, o, lse)
        n = launch.o_cols(p, o)
        assert n == (cols if cols < Dv else 0)
        text = launch.describe(p, ocols=n)
        (kind, args), *comb = asked
        packed = kind == "fwd_tc" and launch.tc_knob(args, "pack") > 0
        assert packed == (Hkv == 8)
        copied = (bool(n) and dtype != torch.float32 and Lq > 1 and not packed
                  and cols * 2 % launch.TMA_STRIDE > 0)
        assert (f"o_cols={cols}" in text) == (bool(n) and not copied), text
        assert copies == ([(o, Dv)] if copied else [])
        if dtype == torch.float32:
            assert (kind, args) == ("fwd_fp32", (64, Dv, True, True, False, False)
                                    + launch.FP32_TILE + (False, cols))
        elif comb:  # split: the partials keep Dv, the combine writes o's columns
            assert len(args) <= oc and comb == [("combine", (Dv, "bfloat16", 128, cols))]
            assert launched == [None, cols]
            assert f" +combine [o_cols={cols}]" in text
        else:  # the tile by the copy engine where o's rows allow, else o copied out
            assert launch.tc_knob(args, "o_cols") == (0 if copied else n)
            assert launched == [Dv if copied else cols]
            assert text.endswith(" (o copied out)") == copied, text
    with pytest.raises(ValueError, match=f"more than the kernels' Dv={p.Dv}"):
        launch.o_cols(p, torch.empty(1, 32, 512, p.Dv + 8, device="meta"))


def test_o_cols_is_refused_where_no_kernel_writes_o():
    """The split kernel's partials keep Dv columns (the combine takes o_cols), and o_cols is an
    int from 0 to Dv (kernels._check_o_cols, which every factory that writes o calls)."""
    from tilelang_impl import kernels
    with pytest.raises(ValueError, match="with split"):
        kernels._check_o_cols(56, 64, split=True)
    for bad in (65, -1, True, 56.0):
        with pytest.raises(ValueError, match="o_cols"):
            kernels._check_o_cols(bad, 64)
    kernels._check_o_cols(0, 64, split=True)
    kernels._check_o_cols(64, 64)


def test_o_cols_is_in_the_plan_key(monkeypatch):
    """Two calls whose kernel problems are equal (D = 120 padded to 128, and D = 128, both from
    key 0) but whose o differ in width get their own plans: launch._plan caches by
    ``ocols`` too, each plan the uncached choice."""
    import dataclasses

    monkeypatch.setattr(launch, "_PLANS", {})
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    p = dataclasses.replace(_meta_problem(1, 32, 32, 512, 4096, 128, 128, window_size=512,
                                          chunk_size=64), device=torch.device("cuda"))
    args = _plan_args(p)
    plans = {n: launch._plan(*args, ocols=n) for n in (120, 0, 120)}
    assert len(launch._PLANS) == 2
    for n, (S, kind, a) in plans.items():
        assert (S, kind, a) == launch._tc_choice(*args, ocols=n)
        assert launch.tc_knob(a, "o_cols") == n


def _plan_args(p, q_blhd=False, kv_blhd=False, force=None):
    _, c, _, _, sl2 = launch.scalars(p)
    return p, q_blhd, kv_blhd, c, sl2, force


def test_cached_plan_is_the_uncached_choice(monkeypatch):
    """launch._plan (cached by problem, never emptied here) returns what launch._tc_choice
    computes for every call of a seeded random sweep: each random problem is asked, then
    the same problem with one axis moved to each of its other values (batch, GQA group,
    key/value heads, Lq, Dqk, Dv, dtype, window, chunk, both flags, kv_start, the scale
    with and without scale_fold, the SM count), each at a length from the problem and just
    either side of the reach where the key-tile count stops growing (launch._lk_key), each
    layout on its own, with and without a forced split count: a key that leaves out
    anything the plan reads serves one of these calls another's plan. Then pairs picked to
    differ in one such thing only (the kernel-frame chunk, the reach, the SM count)."""
    import random

    monkeypatch.setattr(launch, "_PLANS", {})
    monkeypatch.setattr(launch, "PLANS_MAX", 10 ** 9)
    for D in range(launch.MIN_D, launch.MAX_D + 1, launch.D_STEP):
        for Dv in range(launch.MIN_D, launch.MAX_D + 1, launch.D_STEP):
            for cfg in (launch.tc_config(D, Dv), launch.shipped_config(D, Dv)):
                assert cfg[1] <= launch.PLAN_C_MAX  # launch._c_key's bound, on both grid tiles
            if launch.splits_at(D, Dv):
                for ml in (False, True):
                    for ex in (False, True):
                        bm, bn = launch.split_config(D, Dv, ml, ex)[:2]
                        assert bm <= launch.PLAN_ROWS_MAX and bn % launch.PLAN_KEY_TILE == 0
                        assert bn <= launch.PLAN_C_MAX
    rng = random.Random(21)
    sms_of = {}
    monkeypatch.setattr(launch, "sm_count", lambda device: sms_of["n"])
    axes = dict(  # every value a call can differ in that the plan might read
        B=(1, 2, 3, 8), G=(1, 1, 2, 4, 8), Hkv=(1, 2, 4, 8), Lq=(1, 1, 2, 5, 16, 64, 65, 130, 333, 700),
        Dqk=(64, 96, 128, 256), Dv=(64, 96, 128), dtype=(torch.bfloat16, torch.float16),
        W=(1, 8, 64, 200, 512, 4096), C=(1, 3, 16, 64, 100, 400, 3000), ml=(False, True),
        ex=(False, True), ks=(0, 5, 60, 10 ** 6 + 3), scale=(None, -0.5, 1e-40), sms=(132, 20))
    checked = hits = 0
    for _ in range(300):
        base = {name: rng.choice(values) for name, values in axes.items()}
        base_lk = rng.choice((0, 1, 63, 64, 65, 600, 4000, 10 ** 5))
        # the problem, then the problem with one axis moved to each other value
        calls = [base] + [dict(base, **{name: v}) for name, values in axes.items() for v in values
                          if v != base[name]]
        for c in calls:
            sms_of["n"] = c["sms"]
            reach = c["W"] + c["C"] + launch.PLAN_ROWS_MAX
            for Lk in sorted({c["Lq"] + base_lk, reach - 1, reach + 1}):
                Lk = max(c["Lq"], Lk)
                p = _meta_problem(c["B"], c["G"] * c["Hkv"], c["Hkv"], c["Lq"], Lk, c["Dqk"], c["Dv"], c["dtype"],
                                  window_size=c["W"], chunk_size=c["C"], mask_lmk=c["ml"], expand_to_chunk=c["ex"],
                                  kv_start=c["ks"], sm_scale=c["scale"])
                for q_blhd, kv_blhd in ((False, False), (True, False), (False, True)):
                    for force in ((None, 3) if launch.splits_at(c["Dqk"], c["Dv"]) else (None,)):
                        args = _plan_args(p, q_blhd, kv_blhd, force)
                        before = len(launch._PLANS)
                        assert launch._plan(*args) == launch._tc_choice(*args), (c, Lk, q_blhd, kv_blhd, force)
                        hits += len(launch._PLANS) == before
                        checked += 1
    assert checked > 30000 and hits > 0, (checked, hits)
    # pairs that differ in one thing the plan reads, asked one after the other
    sms_of["n"] = 132
    pairs = [  # the kernel-frame chunk C: 51 (chunk past every position) vs 100 (lmk_cols 0 vs 2)
        (dict(Lk=50, chunk_size=100, window_size=16, kv_start=0),
         dict(Lk=50, chunk_size=100, window_size=16, kv_start=60)),
        (dict(Lk=400, chunk_size=400, window_size=64), dict(Lk=700, chunk_size=400, window_size=64)),
        # Lk + C below and at 2**22 (launch.wide_positions; Lk saturated in the key, C the same)
        (dict(Lk=(1 << 22) - 100, chunk_size=64, window_size=64),
         dict(Lk=(1 << 22) - 20, chunk_size=64, window_size=64)),
    ]
    for a, b in pairs:
        launch.clear_plans()
        for kw in (a, b):
            kw = dict(kw)
            p = _meta_problem(1, 32, 32, 1, kw.pop("Lk"), 64, 64, **kw)
            args = _plan_args(p)
            assert launch._plan(*args) == launch._tc_choice(*args), kw
    p1 = _meta_problem(1, 32, 32, 1, 8192, 128, 128, window_size=512, chunk_size=64)
    launch.clear_plans()
    sms_of["n"] = 132
    s132 = launch._plan(*_plan_args(p1))
    sms_of["n"] = 20
    assert launch._plan(*_plan_args(p1)) == launch._tc_choice(*_plan_args(p1)) != s132


def test_decode_loop_plans_once_past_the_reach_and_the_cache_is_bounded(monkeypatch):
    """A decode loop whose cache grows by one key a step asks for one plan per 64-key tile
    below the reach (window + chunk + PLAN_ROWS_MAX) and one in all past it, and a second
    one of each wherever ``Lk`` and ``kv_start`` are chunk multiples (the chunk view of
    ``v``, launch.v_chunk_call, is in the key); PLANS_MAX bounds the cache (emptied when
    full)."""
    monkeypatch.setattr(launch, "_PLANS", {})
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    reach = 512 + 64 + launch.PLAN_ROWS_MAX
    for Lk in range(reach - 128, reach + 300):
        p = _meta_problem(1, 32, 32, 1, Lk, 128, 128, window_size=512, chunk_size=64, kv_start=Lk)
        launch._plan(*_plan_args(p))
    # the two tiles below the reach, then one; Lk = kv_start = 768, 832, 896, ... (chunk
    # multiples) add the view's flag to the last two of them (704's tile has only 704)
    keys = {(k[4], k[-2]) for k in launch._PLANS}
    assert keys == {(11, True), (12, False), (12, True), (13, False), (13, True)}, keys
    assert not any(k[-1] for k in launch._PLANS)  # none wide (launch.wide_positions)
    monkeypatch.setattr(launch, "PLANS_MAX", 2)
    launch.clear_plans()
    for Lq in (1, 2, 3):
        launch._plan(*_plan_args(_meta_problem(1, 32, 32, Lq, 8192, 128, 128, window_size=512, chunk_size=64)))
    assert len(launch._PLANS) == 1  # emptied when full


def test_decode_loop_inside_a_long_first_chunk_plans_once_per_key_tile(monkeypatch):
    """A chunk longer than the cache reaches the kernel as ``Lk + 1`` (Problem.kernel_frame),
    a new value every step; the plan key bounds it (launch._c_key), so a decode loop inside
    a 4096-key chunk plans once per 64-key tile once the kernel's chunk reaches PLAN_C_MAX
    (Lk = 127 to 1000: 15 tiles), as with a short chunk, not once per step (874 plans
    before)."""
    monkeypatch.setattr(launch, "_PLANS", {})
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    for Lk in range(1, 1001):
        if Lk + 1 == launch.PLAN_C_MAX:  # from here the kernel's chunk is past the bound
            before = len(launch._PLANS)
        p = _meta_problem(1, 32, 32, 1, Lk, 128, 128, window_size=128, chunk_size=4096)
        assert p.kernel_frame()[2] == Lk + 1
        args = _plan_args(p)
        assert launch._plan(*args) == launch._tc_choice(*args)
    assert len(launch._PLANS) - before == -(-1000 // launch.PLAN_KEY_TILE) - 1


def test_clear_plans_follows_a_patched_table(monkeypatch):
    """A cached plan outlives a patched table until launch.clear_plans(), which also
    forgets the memoised configs (short_config, shipped_config, split_config); tests/conftest.py calls it
    around every test of tests/."""
    monkeypatch.setattr(launch, "_PLANS", {})
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    dec = _plan_args(_meta_problem(1, 32, 32, 1, 8192, 128, 128, window_size=512, chunk_size=64))
    assert launch._plan(*dec)[0] > 1  # split-KV
    monkeypatch.setattr(launch, "SPLIT_DV", ())
    assert launch._plan(*dec)[0] > 1  # still cached
    launch.clear_plans()
    assert launch._plan(*dec)[0] == 1  # the prefill grid
    pre = _plan_args(_meta_problem(1, 32, 32, 4096, 4096, 128, 128, window_size=512, chunk_size=64))
    tile = launch._plan(*pre)[2][7:9]
    assert tile == (64, 64)
    monkeypatch.setattr(launch, "tc_config", lambda Dqk, Dv: (128, 64, 2, 256))
    launch.clear_plans()
    assert launch._plan(*pre)[2][7:9] == (128, 64)  # the configs' memos forgotten too
    # (tests/conftest.py clears again after monkeypatch restores tc_config)


def test_the_test_suite_starts_every_test_without_plans():
    """tests/conftest.py empties the plan cache before each test of tests/."""
    assert launch._PLANS == {}


def test_describe_call_reports_the_copies_of_a_cuda_call(monkeypatch):
    """describe_call names the inputs a CUDA call copies (api._views: a tensor whose
    strides match neither layout; v when it arrives in another order than k) and no
    others: BHLD and BLHD-as-transposed views are read in place."""
    import dataclasses

    from tilelang_impl import api

    monkeypatch.setattr(launch, "sm_count", lambda dev: 132)
    monkeypatch.setattr(launch, "capability", lambda dev: (9, 0))
    real = api.check_inputs
    monkeypatch.setattr(api, "check_inputs", lambda *a, **kw: dataclasses.replace(
        real(*a, **kw), device=torch.device("cuda")))
    B, H, L, D = 2, 4, 256, 64

    def bhld():
        return torch.empty(B, H, L, D, dtype=torch.bfloat16, device="meta")

    def blhd():
        return torch.empty(B, L, H, D, dtype=torch.bfloat16, device="meta").transpose(1, 2)

    def strided():  # every row of a wider tensor: matches neither layout
        return torch.empty(B, H, L, 2 * D, dtype=torch.bfloat16, device="meta")[..., :D]

    cases = [((bhld(), bhld(), bhld()), ""), ((blhd(), blhd(), blhd()), ""),
             ((blhd(), bhld(), bhld()), ""), ((strided(), bhld(), bhld()), "q"),
             ((bhld(), blhd(), bhld()), "v"), ((bhld(), bhld(), blhd()), "v"),
             ((bhld(), strided(), strided()), "k, v"), ((strided(), blhd(), strided()), "q, v")]
    for (q, k, v), copies in cases:
        text = tilelang_impl.describe_call(q, k, v, window_size=64, chunk_size=16)
        assert text.startswith("fwd_tc"), text
        assert ("copies" in text) == bool(copies) and (
            not copies or text.endswith(f" (copies {copies})")), (copies, text)

    # a contiguous view at an address the copy engine refuses (not a multiple of 16 bytes)
    # is copied too; CPU tensors (real addresses) with the device reported as CUDA
    def at(offset, blhd=False):
        shape = (B, L, H, D) if blhd else (B, H, L, D)
        x = torch.randn(B * H * L * D + offset).to(torch.bfloat16)[offset:].view(shape)
        return x.transpose(1, 2) if blhd else x
    cases = [((at(8), at(0), at(0)), ""), ((at(1), at(0), at(0)), "q"),
             ((at(0), at(3, True), at(0, True)), "k"), ((at(0), at(0), at(4)), "v")]
    for (q, k, v), copies in cases:
        text = tilelang_impl.describe_call(q, k, v, window_size=64, chunk_size=16)
        assert ("copies" in text) == bool(copies) and (
            not copies or text.endswith(f" (copies {copies})")), (copies, text)


@pytest.mark.parametrize("blhd", [False, True], ids=["BHLD", "BLHD"])
def test_inputs_at_unaligned_addresses_are_copied_in_their_order(blhd):
    """api._served: a contiguous view at a 16-byte-aligned address is read in place; at
    another address it is copied once (the copy engine's tensor maps need 16 bytes),
    keeping its storage order and values; a view neither layout serves is made contiguous."""
    from tilelang_impl import api

    shape = (2, 5, 3, 32)
    for offset in (0, 8, 1, 3, 7):
        x = torch.randn(2 * 5 * 3 * 32 + offset).to(torch.bfloat16)[offset:].view(shape)
        x = x.transpose(1, 2) if blhd else x  # canonical shape, as _views receives it
        stored = api._views(x, x, x)[0][0]  # in its storage order
        got = api._served(stored)
        aligned = stored.data_ptr() % api.TMA_ALIGN == 0
        assert (got is stored) == aligned, (offset, aligned)
        assert got.is_contiguous() and got.data_ptr() % api.TMA_ALIGN == 0
        assert got.shape == stored.shape and torch.equal(got, stored)
    wide = torch.randn(2, 5, 3, 64)[..., :32]
    assert api._served(wide).is_contiguous() and torch.equal(api._served(wide), wide)


def test_empty_outputs():
    q, k, v = _inputs(0, 2, 2, 4, 4, 32, 32, torch.float32)
    o, lse = swa(q, k, v, window_size=2, chunk_size=2)
    assert o.shape == (0, 2, 4, 32) and lse.shape == (0, 2, 4)
    q, k, v = _inputs(1, 2, 2, 0, 5, 32, 32, torch.float32)
    o, lse = swa(q, k, v, window_size=2, chunk_size=2)
    assert o.shape == (1, 2, 0, 32) and lse.shape == (1, 2, 0)


def test_window_clamp_scalars():
    # the launcher clamps a huge window; visibility must not change
    q, k, v = _inputs(1, 1, 1, 10, 10, 32, 32, torch.float32)
    p = reference.check_inputs(q, k, v, window_size=10**12, chunk_size=3)
    W, C, r, inv_c, sl2 = launch.scalars(p)
    assert W == 13 and C == 3 and r == 0 and math.isclose(sl2, p.sm_scale * launch.LOG2E)
    _check(q, k, v, window_size=10**12, chunk_size=3)


def test_split_plan_by_saturation_head_dims_and_flags(monkeypatch):
    """Split-KV only for small grids and Dv 96 / 128, with every flag combination
    (launch.split_config has a variant that lowers for each); elsewhere the
    prefill grid (the same 64-row tile for every Lq since session 12)."""
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)

    def split(B, Hq, Lq, Lk, mask_lmk=True, expand=True, D=128, Dv=None):
        Dv = D if Dv is None else Dv
        p = _meta_problem(B, Hq, Hq, Lq, Lk, D, Dv, window_size=512, chunk_size=64, mask_lmk=mask_lmk,
                          expand_to_chunk=expand)
        S, cfg = launch.split_plan(p)  # what run_cuda uses
        assert (cfg is None) == (not launch.splits_at(D, Dv))
        return S

    # one wave of two CTAs per SM: S = 2 * 132 // programs, at most the reachable key
    # tiles (576 + 64 rows of reach on 64-key tiles: 10); the 128x64 split tile (mask_lmk
    # without expand_to_chunk) one CTA per SM: S = 132 // programs
    assert launch.ctas_per_sm(launch.split_config(128, 128)) == 2
    assert launch.ctas_per_sm(launch.split_config(128, 128, True, False)) == 1
    assert split(1, 32, 1, 8192) == 8                     # decode: 32 programs
    assert split(1, 32, 1, 8192, D=64) == 1               # Dv = 64: the prefill grid's 64x128 tile
    assert split(1, 32, 1, 8192, D=96) == 8
    assert split(1, 8, 1, 8192) == 10                     # 8 programs: capped by the key tiles
    assert split(1, 8, 1, 300) == 1                       # a short cache: 5 key tiles, the grid
    assert split(1, 8, 1, 448) == 1                       # 7 key tiles (launch.SPLIT_MIN_TILES)
    assert split(1, 8, 1, 449) == 8                       # 8: split, one tile per split
    assert split(1, 32, 8192, 8192) == 1                  # prefill fills the GPU
    assert split(1, 32, 512, 8192) == 1                   # chunked: 256 programs
    assert split(2, 33, 64, 8192) == 1                    # 66 programs: half the SMs
    assert split(2, 32, 64, 8192) == 4                    # 64 programs: under half, split
    assert split(1, 32, 128, 8192) == 4                   # 64-row split tile: 64 programs
    assert split(1, 32, 192, 8192) == 1                   # ... 96 programs
    assert split(1, 32, 1, 8192, D=80) == 1               # Dv 80 / 112 never split
    assert split(1, 32, 1, 8192, D=192, Dv=128) == 1      # nor a Dqk above 128
    assert split(1, 32, 1, 8192, expand=False) == 4
    assert split(1, 32, 128, 8192, expand=False) == 4      # 128-row split tile without expand
    assert split(1, 32, 1, 8192, mask_lmk=False) > 1
    assert split(0, 32, 1, 8192) == 1                     # no program: nothing to split
    with pytest.raises(ValueError, match="splits_at"):
        launch.split_config(64, 64)                       # no split variant chosen there
    assert split(1, 32, 1, 8192, mask_lmk=False, expand=False) == 8   # 64-row tile lowers


# The performance knobs of the GPU kernel that change which macros run
# (kernels.fwd_tc: lmk_zero="rows", mask_split, fold) are baked into the CPU
# kernel too, so the C target runs the same macros: macros.zero_landmark_rows
# (with rows past the block's key range loaded, as the bulk copy does),
# macros.tile_inside_windows / mask_landmarks, and the folded softmax.
KNOBS = [("rows", False, False), ("tile", True, False), ("tile", False, True),
         ("rows", True, True)]


def _cpu_knobs(q, k, v, knobs, **kw):
    p = check_inputs(q, k, v, **kw)
    W, C, r, inv_c, sl2 = launch.scalars(p)
    from tilelang_impl import kernels
    ker = kernels.fwd_cpu(p.Dqk, p.Dv, p.mask_lmk, p.expand_to_chunk, False, False, 16, 16,
                          *knobs)
    o = torch.full((p.B, p.Hq, p.Lq, p.Dv), float("nan"))
    lse = torch.full((p.B, p.Hq, p.Lq), float("nan"))
    ker(q, k, v, o, lse, W, C, r, inv_c, sl2)
    return o, lse


@pytest.mark.parametrize("knobs", KNOBS, ids=["-".join(map(str, k)) for k in KNOBS])
@pytest.mark.parametrize("case", [
    # (B, Hq, Hkv, Lq, Lk, D, window, chunk, mask_lmk, expand, kv_start)
    (1, 2, 1, 40, 70, 64, 7, 5, True, True, 3),      # Lq < Lk, odd chunk, C < block_N
    (1, 2, 2, 60, 60, 32, 37, 16, True, True, 0),    # interior tiles exist, negative edges
    (1, 2, 1, 50, 90, 32, 20, 32, True, False, 10**6 + 3),  # C > block_N, no expansion
    (1, 2, 2, 45, 45, 32, 9, 4, False, True, 0),
    (1, 2, 2, 45, 45, 32, 9, 4, False, False, 0),
    (1, 2, 2, 12, 12, 32, 4, 1, True, True, 0),      # every key a landmark: empty rows
])
def test_knobs_match_golden_with_nan_slots(knobs, case):
    B, Hq, Hkv, Lq, Lk, D, W, C, lmk, exp, ks = case
    q, k, v = _inputs(B, Hq, Hkv, Lq, Lk, D, D, torch.float32, seed=11)
    kw = dict(window_size=W, chunk_size=C, mask_lmk=lmk, expand_to_chunk=exp, kv_start=ks)
    go, gl = reference.golden(q, k, v, **kw)
    k, v, _ = _poison(q, k, v, kw)
    o, lse = _cpu_knobs(q, k, v, knobs, **kw)
    _assert_exact(o, lse, go, gl)


@pytest.mark.parametrize("knobs", KNOBS, ids=["-".join(map(str, k)) for k in KNOBS])
@pytest.mark.parametrize("sm_scale", [0.0, -0.3])
@pytest.mark.parametrize("mask_lmk", [True, False])
def test_knobs_scale_inside_the_mask(knobs, sm_scale, mask_lmk):
    """sm_scale <= 0 through every macro that scales (mask_scores on edge tiles,
    mask_landmarks / scale_scores on interior tiles with mask_split, the folded
    softmax): a masked score must stay -inf, never become +inf or NaN. The public
    CPU path uses the default knobs only, so the conformance scale cases do not
    reach mask_landmarks, scale_scores or fold on CPU."""
    q, k, v = _inputs(1, 2, 2, 45, 60, 32, 32, torch.float32, seed=5)
    kw = dict(window_size=40, chunk_size=4, mask_lmk=mask_lmk, expand_to_chunk=True, kv_start=3,
              sm_scale=sm_scale)
    o, lse = _cpu_knobs(q, k, v, knobs, **kw)
    verdict.assert_pass(o, lse, q, k, v, kw)


def test_tc_kernel_args_keeps_default_cache_key():
    assert launch.tc_kernel_args((128, 64, 2, 256)) == ("fwd_tc", (128, 64, 2, 256), ())
    assert launch.tc_kernel_args((128, 64, 2, 256, "tile", False, False)) == \
        ("fwd_tc", (128, 64, 2, 256), ())
    assert launch.tc_kernel_args((128, 64, 2, 256, "rows", True)) == \
        ("fwd_tc", (128, 64, 2, 256), ("rows", True))
    nows = (128, 64, 2, 256) + tuple(d for _, d in launch.TC_KNOBS) + (False,)
    assert launch.tc_kernel_args(nows) == ("fwd_tc_nows", (128, 64, 2, 256), ())
    with pytest.raises(ValueError):
        launch.tc_kernel_args(nows + (1,))


def test_lmk_cols_rule_per_call():
    """launch.lmk_cols_for: K = ceil(block_N / C) landmark columns per tile when
    mask_lmk and K <= the config's cap; otherwise the general test (0)."""
    f = launch.lmk_cols_for
    assert f(2, True, 64, 128) == 2 and f(2, True, 65, 128) == 2 and f(2, True, 128, 128) == 1
    assert f(2, True, 10**6, 128) == 1 and f(2, True, 63, 128) == 0 and f(2, True, 16, 16) == 1
    assert f(2, True, 8, 16) == 2 and f(2, True, 7, 16) == 0 and f(1, True, 64, 128) == 0
    assert f(2, False, 64, 128) == 0 and f(0, True, 128, 128) == 0
    for C in range(1, 300):
        for bN in (16, 64, 128):
            k = f(2, True, C, bN)
            assert k == 0 or (k * C >= bN and (k - 1) * C < bN)  # exact, and the fewest compares
    ship = launch.shipped_config(128, 128)
    # shipped D = 128 knobs after lmk_cols: fast_exp2, scale_fold (only with a call's
    # positive scale), win_u32, lmk_rows_j0 (only with mask_lmk and lmk_cols > 0)
    sl2 = launch.LOG2E / 128 ** 0.5
    # (64-key tiles: C >= 64 one landmark column, 32 <= C < 64 two); two CTAs per SM
    # (calls of several query blocks: hoist_left since session 45, _hoisted)
    tail, occ = (True, True, True, True), (0, 2)
    assert launch.tc_kernel_args(ship, True, 64, sl2)[2] == _hoisted(("rows", True, True, 1) + tail
                                                                     + occ)
    assert launch.tc_kernel_args(ship, True, 32, sl2)[2] == _hoisted(("rows", True, True, 2) + tail
                                                                     + occ)
    assert launch.tc_kernel_args(ship, True, 16, sl2)[2] == _hoisted(
        ("rows", True, True, 0) + tail[:3] + (False,) + occ)  # general
    assert launch.tc_kernel_args(ship, True, 64, -sl2)[2] == _hoisted(
        ("rows", True, True, 1, True, False, True, True) + occ)  # cannot fold
    assert launch.tc_kernel_args(ship, False, 64, sl2)[2] == _hoisted(
        ("rows", True, True, 0, True, True, True, False) + occ)  # no landmarks: no j0
    assert launch.tc_kernel_args(ship)[2] == _hoisted(
        ("rows", True, True, 0, True, False, True, False) + occ)  # no call
    # split-KV (64-key tiles: C = 64 is one landmark column): landmark rows, full mask,
    # fast_exp2, scale_fold per call, win_u32; no lmk_rows_j0
    split = launch.split_config(128, 128)
    assert split[:4] == (64, 64, 2, 128)
    assert launch.split_config(128, 128, expand_to_chunk=False) == (128, 64, 2, 256, "tile", False,
                                                                     False, 2)
    assert launch.split_config(128, 128, False, False) == split
    # the prefill grid's tile (every Lq): 64 rows, one consumer warp group; two CTAs
    # per SM up to D = 128
    assert launch.tc_config(64, 64) == launch.tc_config(32, 64) == (64, 128, 2, 128)
    assert launch.tc_config(64, 80) == launch.tc_config(128, 128) == (64, 64, 2, 128)
    assert launch.tc_config(256, 256) == (64, 64, 2, 128) and launch.tc_knobs(256, 256) == ()
    assert launch.short_config(32, 64) == launch.with_knobs(
        (64, 128, 2, 128) + launch.tc_knobs(32, 64), min_blocks=launch.TC_MIN_BLOCKS,
        v_chunk=launch.TC_V_CHUNK, lmk_const=True)
    # calls of several query blocks at max(Dqk, Dv) <= 64 (session 42): 64 x 64, four CTAs per
    # SM since session 44 (three before), the view of v at one chunk per tile; from 65 to 128
    # the two configs (one-block calls, packed or not, and longer ones: launch.grid_config)
    # differ in hoist_left (session 45; before, they were one) and hoist_keys (session 46)
    # only, above 128 they are one
    assert launch.shipped_config(32, 64) == launch.shipped_config(64, 64) == launch.with_knobs(
        (64, 64, 2, 128) + launch.tc_knobs(64, 64), min_blocks=4, v_chunk=1, lmk_const=True,
        hoist_left=1, hoist_keys=1)
    assert launch.shipped_config(64, 80) == launch.with_knobs(launch.short_config(64, 80),
                                                              hoist_left=1, hoist_keys=1)
    assert launch.shipped_config(128, 128) == launch.with_knobs(launch.short_config(128, 128),
                                                                hoist_left=1, hoist_keys=1)
    assert launch.shipped_config(256, 256) == (64, 64, 2, 128)  # TileLang's launch bounds
    occ = (False, 0, launch.TC_MIN_BLOCKS)  # no lmk_rows_j0, not packed, two CTAs per SM
    assert launch.tc_kernel_args(split, True, 64, sl2) == \
        ("fwd_tc", split[:4], ("rows", False, False, 1, True, True, True) + occ)
    assert launch.tc_kernel_args(split, True, 16) == \
        ("fwd_tc", split[:4], ("rows", False, False, 0, True, False, True) + occ)
    # D = 64 on the CPU kernel's 16-key tiles (lmk_rows_j0 only with landmark columns)
    assert launch.call_knobs(launch.tc_knobs(64, 64), True, 16, 16) == \
        ("rows", True, True, 1, True, False, True, True)
    assert launch.call_knobs(launch.tc_knobs(64, 64), True, 5, 16, sl2) == \
        ("rows", True, True, 0, True, True, True)


# lmk_cols (macros.tile_landmark): the landmark test as K compares against the
# tile's landmark columns, exact when K * C >= block_N for the kernel-frame C.
# The CPU kernel (16-key tiles) with K = 0, the launcher's K, and K = 2 where
# allowed, under the lmk_zero / mask_split modes it meets in the shipped configs.
LMK_CASES = [
    # (B, Hq, Hkv, Lq, Lk, D, window, chunk, expand, kv_start)
    (1, 2, 1, 40, 90, 32, 20, 16, True, 3),            # C == block_N: one column, K = 1
    (1, 2, 2, 64, 64, 32, 37, 40, True, 0),            # C > block_N, some tiles without one
    (1, 2, 1, 50, 120, 32, 45, 24, False, 10**6 + 3),  # block_N < C < 2 block_N, no expansion
    (1, 2, 1, 50, 100, 32, 30, 8, True, 5),            # C = block_N / 2: two columns, K = 2
    (1, 2, 1, 45, 70, 32, 20, 11, True, 2**40 + 7),    # K = 2 with an odd chunk
    (1, 2, 1, 40, 70, 32, 9, 5, True, 3),              # C < block_N / 2: general test only
    (1, 2, 1, 30, 40, 32, 8, 1000, False, 123),        # frame C = Lk + 1 = 41: K = 1
    (1, 3, 1, 4, 10, 32, 6, 10**6, False, 7),          # frame C = 11 < block_N: K = 2
]
LMK_MODES = [("tile", False, False), ("tile", True, False), ("rows", True, True)]


@pytest.mark.parametrize("modes", LMK_MODES, ids=["-".join(map(str, m)) for m in LMK_MODES])
@pytest.mark.parametrize("case", LMK_CASES, ids=[f"C{c[7]}-Lk{c[4]}" for c in LMK_CASES])
def test_lmk_cols_match_golden_with_nan_slots(case, modes):
    B, Hq, Hkv, Lq, Lk, D, W, C, exp, ks = case
    q, k, v = _inputs(B, Hq, Hkv, Lq, Lk, D, D, torch.float32, seed=13)
    kw = dict(window_size=W, chunk_size=C, mask_lmk=True, expand_to_chunk=exp, kv_start=ks)
    lmk = reference.is_landmark(torch.arange(Lk) + ks, chunk_size=C)
    k, v, bad = _poison(q, k, v, kw)  # landmarks and slots left of every window
    assert bad.any()
    go, gl = reference.golden(q, k, v, **kw)
    exp_ = verdict.expected(q, k, v, kw)
    Ck = launch.frame(check_inputs(q, k, v, **kw))[2]
    k_min = launch.lmk_cols_for(launch.LMK_COLS_MAX, True, Ck, 16)
    assert (k_min > 0) == (Ck >= 8)
    runs = {0} | ({k_min, 2} if k_min else set())
    for K in sorted(runs):
        o, lse = _cpu_knobs(q, k, v, modes + (K,), **kw)
        vd = verdict.judge(o, lse, exp_)
        assert vd.status == verdict.PASS, f"lmk_cols={K}: " + "; ".join(vd.problems)
        _assert_exact(o, lse, go, gl, K)
    # the NaN slots include landmarks wherever a key is one (C < Lk + kv_start % C)
    assert not (lmk & ~bad).any()


@pytest.mark.parametrize("modes", LMK_MODES, ids=["-".join(map(str, m)) for m in LMK_MODES])
@pytest.mark.parametrize("sm_scale", [0.0, -0.3])
def test_lmk_cols_scale_inside_the_mask(modes, sm_scale):
    """sm_scale <= 0 through the lmk_cols arithmetic of mask_scores and
    mask_landmarks: masked scores stay -inf."""
    q, k, v = _inputs(1, 2, 2, 45, 80, 32, 32, torch.float32, seed=16)
    kw = dict(window_size=40, chunk_size=16, mask_lmk=True, expand_to_chunk=True, kv_start=3,
              sm_scale=sm_scale)
    o, lse = _cpu_knobs(q, k, v, modes + (1,), **kw)
    verdict.assert_pass(o, lse, q, k, v, kw)


def test_lmk_cols_too_few_is_wrong():
    """The knob changes the arithmetic: one column where a 16-key tile holds two
    landmarks (C = 8) misses one, so the launcher's rule (K * C >= block_N) matters."""
    q, k, v = _inputs(1, 2, 1, 40, 90, 32, 32, torch.float32, seed=14)
    kw = dict(window_size=20, chunk_size=8, mask_lmk=True, expand_to_chunk=True, kv_start=5)
    o, lse = _cpu_knobs(q, k, v, ("tile", False, False, 1), **kw)
    assert verdict.judge(o, lse, verdict.expected(q, k, v, kw)).status != verdict.PASS
    o, lse = _cpu_knobs(q, k, v, ("tile", False, False, 2), **kw)
    verdict.assert_pass(o, lse, q, k, v, kw)


@pytest.mark.parametrize("C,K,expand", [(16, 1, True), (40, 1, True), (8, 2, True), (5, 0, True),
                                        (10**6, 1, False)])
def test_public_cpu_path_bakes_lmk_cols(C, K, expand):
    """sliding_window_attention on CPU runs the CPU kernel with the launcher's
    lmk_cols (shipped knobs, 16-key tile), and matches the reference."""
    q, k, v = _inputs(1, 2, 1, 33, 60, 64, 64, torch.float32, seed=15)
    kw = dict(window_size=21, chunk_size=C, kv_start=9, expand_to_chunk=expand)
    launch._cache.clear()
    _check(q, k, v, nan_slots=True, **kw)
    (key,) = [key for key in launch._cache if key[0] == "fwd_cpu"]
    knobs = key[9:]
    assert (knobs[3] if len(knobs) > 3 else 0) == K, key


# fast_exp2 / scale_fold / win_u32 (kernels.fwd_tc, session 6): scale_fold and win_u32
# change macros (macros.online_softmax_update with a scale, macros.visible), so the
# CPU kernel runs them; fast_exp2 is GPU-only (ex2.approx) and a no-op on the C target,
# run here (with the other two: all3) so the knob tuple is accepted; alone it would
# build the C kernel without knobs again (24 compiles, dropped in session 16). Knob
# values through launch.call_knobs, as the launcher bakes them per call (scale_fold
# only for a positive scale).
NEW_KNOBS = [(False, True, False), (False, False, True), (True, True, True)]
NEW_CASES = [
    # (B, Hq, Hkv, Lq, Lk, D, window, chunk, mask_lmk, expand, kv_start, sm_scale)
    (1, 2, 1, 40, 70, 32, 7, 5, True, True, 3, None),        # C < block_N / 2: K = 0
    (1, 2, 2, 60, 60, 32, 37, 16, True, True, 0, 0.37),      # interior tiles, K = 1
    (1, 2, 1, 50, 90, 32, 20, 8, True, False, 10**6 + 3, None),  # K = 2, no expansion
    (1, 2, 2, 45, 60, 32, 40, 4, True, True, 3, 0.0),        # zero scale: no fold
    (1, 2, 2, 45, 60, 32, 40, 16, True, True, 3, -0.3),      # negative scale: no fold
    (1, 2, 2, 45, 45, 32, 9, 4, False, True, 0, None),       # no landmarks
    (1, 2, 2, 45, 60, 32, 9, 4, False, False, 0, -0.3),
    (1, 2, 2, 12, 12, 32, 4, 1, True, True, 0, 0.5),         # every key a landmark
]
# A Latin square, not the cross product (each run is its own C kernel, about 4 s of
# TileLang's lowering on CI's cores): every case meets each of the three knob sets, each
# under a different mode of LMK_MODES, and every (mode, knob set) pair meets two or three
# cases, a positive scale (the fold acting) among them. 24 runs instead of 72; the
# cross product built 57 kernels, this 24 at most.
NEW_RUNS = [pytest.param(case, LMK_MODES[(i + j) % len(LMK_MODES)], new,
                         id=f"case{i}-{'-'.join(map(str, LMK_MODES[(i + j) % len(LMK_MODES)]))}"
                            f"-{name}")
            for i, case in enumerate(NEW_CASES)
            for j, (new, name) in enumerate(zip(NEW_KNOBS, ["sfold", "wu32", "all3"]))]
assert {(r.values[1], r.values[2]) for r in NEW_RUNS} == \
    {(m, n) for m in LMK_MODES for n in NEW_KNOBS}
assert all(any(r.values[1] == m and r.values[2] == n
               and (r.values[0][11] is None or r.values[0][11] > 0)
               for r in NEW_RUNS) for m in LMK_MODES for n in NEW_KNOBS)


@pytest.mark.parametrize("case, modes, new", NEW_RUNS)
def test_new_knobs_match_golden_with_nan_slots(case, modes, new):
    B, Hq, Hkv, Lq, Lk, D, W, C, lmk, exp, ks, sm = case
    q, k, v = _inputs(B, Hq, Hkv, Lq, Lk, D, D, torch.float32, seed=17)
    kw = dict(window_size=W, chunk_size=C, mask_lmk=lmk, expand_to_chunk=exp, kv_start=ks,
              sm_scale=sm)
    k, v, _ = _poison(q, k, v, kw)
    go, gl = reference.golden(q, k, v, **kw)
    _, C_, _, _, sl2 = launch.scalars(check_inputs(q, k, v, **kw))
    knobs = launch.call_knobs(modes + (2,) + new, lmk, C_, 16, sl2)
    full = knobs + tuple(d for _, d in launch.TC_KNOBS[len(knobs):])
    assert full[5] == (new[1] and (sm is None or sm > 0))
    o, lse = _cpu_knobs(q, k, v, knobs, **kw)
    verdict.assert_pass(o, lse, q, k, v, kw, str(knobs))
    _assert_exact(o, lse, go, gl)


def test_scale_fold_rule_per_call():
    """launch.scale_fold_ok: only a positive normal fp32 scale_log2; call_knobs drops
    scale_fold for every other call (and without a scale)."""
    ok = launch.scale_fold_ok
    assert ok(0.125 * launch.LOG2E) and ok(2.0 ** -126) and ok(1e30)
    assert not ok(0.0) and not ok(-0.3) and not ok(2.0 ** -127) and not ok(1e39)
    assert not ok(None) and not ok(float("nan"))
    cfg = ("rows", True, True, 2, True, True, True)
    assert launch.call_knobs(cfg, True, 64, 128, 0.2) == cfg
    assert launch.call_knobs(cfg, True, 64, 128, 0.0) == ("rows", True, True, 2, True, False,
                                                          True)
    assert launch.call_knobs(cfg, True, 64, 128) == ("rows", True, True, 2, True, False, True)
    assert launch.call_knobs(cfg[:6], True, 64, 128, -1.0) == ("rows", True, True, 2, True)
    ship = launch.shipped_config(128, 128)  # ships scale_fold (session 5): per call
    on = launch.tc_kernel_args(ship, True, 64, 0.2)[2]
    assert on[launch._KNOB["scale_fold"]] is True
    assert launch.tc_kernel_args(ship, True, 64, -0.2)[2] == on[:5] + (False,) + on[6:]


def _hoisted(knobs: tuple) -> tuple:
    """A call's knob values (``knobs``, a prefix of TC_KNOBS' order) as baked for a call of
    several query blocks at head dims up to 128: the knobs after them at their defaults but
    ``hoist_left`` and ``hoist_keys``, 1 (launch.TC_HOIST_LEFT, session 45;
    launch.TC_HOIST_KEYS, session 46), trailing defaults left out."""
    at = launch._KNOB["hoist_left"]
    assert launch._KNOB["hoist_keys"] == at + 1
    return launch.trimmed_knobs(tuple(knobs) + tuple(d for _, d in launch.TC_KNOBS[len(knobs):at])
                                + (1, 1) + tuple(d for _, d in launch.TC_KNOBS[at + 2:]))


def test_hoist_left_permission_per_call():
    """``hoist_left`` (launch.TC_HOIST_LEFT, session 45) is on in the configs of calls of
    several query blocks at head dims up to 128 (launch.grid_config), off for calls of one
    block and above 128 (no ``mask_split``), and launch.call_knobs drops it where the kernel
    refuses it (kernels._check_knobs): without ``mask_split``, with ``overlap`` 1 or 2
    (session 25's loop) or with ``pack`` baked; with the lean loop (``overlap`` 3, 4) and on a
    call that packs nothing (G = 1) it stays."""
    hl = launch._KNOB["hoist_left"]

    def baked(cfg, group=1):
        return launch.full_knobs(launch.tc_kernel_args(cfg, True, 64, 0.2, group)[2])[hl]
    for Dqk, Dv in ((32, 32), (64, 64), (64, 80), (96, 96), (128, 128)):
        assert baked(launch.grid_config(Dqk, Dv, 65)) == launch.TC_HOIST_LEFT == 1
        assert baked(launch.grid_config(Dqk, Dv, 64)) == 0
        ship = launch.shipped_config(Dqk, Dv)
        assert baked(launch.with_knobs(ship, pack=True), group=4) == 0
        assert baked(launch.with_knobs(ship, pack=True), group=1) == 1
        for ovl, kept in ((1, 0), (2, 0), (3, 1), (4, 1)):
            assert baked(launch.with_knobs(ship, overlap=ovl)) == kept, ovl
        assert baked(launch.with_knobs(ship, mask_split=False)) == 0
    assert launch.shipped_config(192, 192) == launch.short_config(192, 192) == (64, 64, 2, 128)
    assert launch.shipped_config(128, 128) == launch.with_knobs(launch.short_config(128, 128),
                                                                hoist_left=1, hoist_keys=1)


def test_hoist_keys_permission_per_call():
    """``hoist_keys`` (launch.TC_HOIST_KEYS, session 46) is on in the configs of calls of
    several query blocks at head dims up to 128 (launch.grid_config), off for calls of one
    block (decode, short chunks, packed or not) and above 128, and launch.call_knobs drops it
    where the kernel refuses it (kernels._check_knobs: with ``overlap`` 1 or 2 baked) and with
    ``pack`` baked (never built or run there); without ``mask_split``, with the lean loop
    (``overlap`` 3, 4), or with a ``pack`` permission on a call that packs nothing (G = 1), it
    stays."""
    hk = launch._KNOB["hoist_keys"]

    def baked(cfg, group=1):
        return launch.full_knobs(launch.tc_kernel_args(cfg, True, 64, 0.2, group)[2])[hk]
    for Dqk, Dv in ((32, 32), (64, 64), (64, 80), (96, 96), (128, 128)):
        assert baked(launch.grid_config(Dqk, Dv, 65)) == launch.TC_HOIST_KEYS == 1
        assert baked(launch.grid_config(Dqk, Dv, 64)) == 0
        ship = launch.shipped_config(Dqk, Dv)
        assert baked(launch.with_knobs(ship, pack=True), group=4) == 0
        assert baked(launch.with_knobs(ship, pack=True), group=1) == 1
        for ovl, kept in ((1, 0), (2, 0), (3, 1), (4, 1)):
            assert baked(launch.with_knobs(ship, overlap=ovl)) == kept, ovl
        assert baked(launch.with_knobs(ship, mask_split=False)) == 1
    for Dqk, Dv in ((160, 160), (192, 192), (256, 256)):
        assert baked(launch.grid_config(Dqk, Dv, 10**4)) == 0
    # the split-KV grid's kernels (decode) do not take it either
    assert launch.full_knobs(launch.split_config(128, 128)[4:])[hk] == 0


def test_vc_shift_permission_per_call():
    """``vc_shift`` (session 47, a lab knob): launch.call_knobs keeps the permission only where
    ``lmk_const`` stays on at one chunk a tile (``v_chunk`` 1 with ``C == block_N``: the
    64-key tiles at C = 64), and drops it at C = 128 (one chunk a tile, no ``lmk_const``), at
    C = 32 (no view under the long calls' permission of one chunk a tile at D = 64, and at
    D = 128 none for a 128-wide ``v`` at two chunks a tile; with two permitted at D = 64 the
    view spans two chunks with ``lmk_const`` on and still drops it), with ``pack`` (never
    built or run with it), without the view (``kv_start`` not a whole chunk: the call's
    ``view`` False) and without ``mask_lmk``; the kernel refuses it anywhere else
    (kernels._check_knobs), before it builds anything."""
    from tilelang_impl import kernels
    vs, lc, vc = (launch._KNOB[k] for k in ("vc_shift", "lmk_const", "v_chunk"))
    for D in (64, 128):
        ship = launch.with_knobs(launch.shipped_config(D, D), vc_shift=1)
        assert launch.full_knobs(launch.shipped_config(D, D)[4:])[vs] == 0  # not shipped

        def baked(C, view=True, mask_lmk=True):
            return launch.full_knobs(launch.call_knobs(ship[4:], mask_lmk, C, ship[1], 0.2,
                                                       view=view, Dv=D))
        at64 = baked(64)
        assert at64[vs] == 1 and at64[lc] and at64[vc] == 1
        for knobs in (baked(128), baked(32), baked(64, view=False), baked(64, mask_lmk=False)):
            assert knobs[vs] == 0
        assert baked(32)[vc] == 0 and baked(128)[vc] == 1 and not baked(128)[lc]
        packed = launch.with_knobs(ship, pack=True)
        assert launch.full_knobs(launch.call_knobs(packed[4:], True, 64, ship[1], 0.2, group=2,
                                                   view=True, Dv=D))[vs] == 0
    two = launch.with_knobs(launch.shipped_config(64, 64), vc_shift=1, v_chunk=2)
    knobs = launch.full_knobs(launch.call_knobs(two[4:], True, 32, two[1], 0.2, view=True, Dv=64))
    assert knobs[vc] == 2 and knobs[lc] is True and knobs[vs] == 0
    args = dict(Dqk=64, Dv=64, dtype="bfloat16", mask_lmk=True, expand_to_chunk=True,
                q_blhd=False, kv_blhd=False, block_M=64, block_N=64, num_stages=2, threads=128,
                split=False, lmk_zero="rows", mask_split=True, lmk_cols=1)
    for extra in (dict(), dict(v_chunk=1), dict(v_chunk=1, lmk_const=True, lmk_cols=2),
                  dict(lmk_const=True, v_chunk=2)):
        with pytest.raises(ValueError, match="vc_shift"):
            kernels.fwd_tc.get_tir(**{**args, **extra, "vc_shift": 1})


@pytest.mark.parametrize("sm_scale", [0.0, -0.3])
def test_scale_fold_forced_with_nonpositive_scale_is_wrong(sm_scale):
    """The fold needs a positive scale (-inf * 0 = NaN, -inf * -s = +inf): baked in
    against launch.scale_fold_ok it breaks, so the per-call rule matters."""
    q, k, v = _inputs(1, 2, 2, 45, 60, 32, 32, torch.float32, seed=5)
    kw = dict(window_size=40, chunk_size=4, mask_lmk=True, expand_to_chunk=True, kv_start=3,
              sm_scale=sm_scale)
    o, lse = _cpu_knobs(q, k, v, ("tile", False, False, 0, False, True), **kw)
    assert verdict.judge(o, lse, verdict.expected(q, k, v, kw)).status != verdict.PASS


def test_public_cpu_path_passes_the_scale_to_call_knobs(monkeypatch):
    """run_cpu resolves scale_fold per call: with a config that asks for it, the CPU
    kernel gets it for a positive scale and not for zero."""
    monkeypatch.setattr(launch, "tc_knobs", lambda Dqk, Dv: ("tile", True, False, 2, True,
                                                            True, True))
    q, k, v = _inputs(1, 2, 1, 33, 60, 32, 32, torch.float32, seed=15)
    for sm, fold in ((0.3, True), (0.0, False), (-0.2, False)):
        launch._cache.clear()
        _check(q, k, v, nan_slots=True, window_size=21, chunk_size=16, kv_start=9, sm_scale=sm)
        (key,) = [key for key in launch._cache if key[0] == "fwd_cpu"]
        knobs = key[9:]
        assert (len(knobs) > 5 and knobs[5]) == fold, key
    launch._cache.clear()


# lmk_rows_j0 (kernels.fwd_tc / fwd_cpu, session 7): macros.zero_landmark_rows from the
# tile's int32 first-landmark register (the one the lmk_cols masks use), integer select,
# static rows with lmk_cols. The CPU kernel runs the same macro (16-key tiles): C < 16
# several landmark rows per tile (lmk_cols 2; for C < 8 no columns are baked and the
# knob is dropped, launch.rows_j0_acts: those cases check that the general kernel
# still serves them), C >= 16 one row or none, the frame's C = Lk + 1; NaN in every
# landmark and invisible slot, rows past Lk.
J0_CASES = [
    # (B, Hq, Hkv, Lq, Lk, D, window, chunk, expand, kv_start)
    (1, 2, 1, 12, 40, 32, 6, 1, True, 0),              # C = 1: every key a landmark
    (1, 2, 1, 40, 70, 32, 9, 3, True, 3),              # C = 3: five rows per tile, K = 0
    (1, 2, 2, 45, 90, 32, 21, 8, False, 5),            # C = 8: two rows, K = 2
    (1, 2, 1, 50, 90, 32, 20, 16, True, 7),            # C == block_N: K = 1
    (1, 2, 1, 60, 150, 64, 50, 64, True, 10**6 + 3),   # C = 64 > block_N
    (1, 2, 2, 64, 250, 32, 70, 200, True, 2**40 + 9),  # C = 200, most tiles without one
    (1, 2, 1, 30, 40, 32, 8, 1000, False, 123),        # frame C = Lk + 1 = 41
    (1, 3, 1, 4, 10, 32, 6, 10**6, False, 7),          # frame C = 11 < block_N: K = 2
]
J0_MODES = [("rows", False, False), ("rows", True, True)]


@pytest.mark.parametrize("modes", J0_MODES, ids=["-".join(map(str, m)) for m in J0_MODES])
@pytest.mark.parametrize("case", J0_CASES, ids=[f"C{c[7]}-Lk{c[4]}" for c in J0_CASES])
def test_lmk_rows_j0_match_golden_with_nan_slots(case, modes):
    B, Hq, Hkv, Lq, Lk, D, W, C, exp, ks = case
    q, k, v = _inputs(B, Hq, Hkv, Lq, Lk, D, D, torch.float32, seed=19)
    kw = dict(window_size=W, chunk_size=C, mask_lmk=True, expand_to_chunk=exp, kv_start=ks)
    lmk = reference.is_landmark(torch.arange(Lk) + ks, chunk_size=C)
    k, v, bad = _poison(q, k, v, kw)
    assert bad.any() and not (lmk & ~bad).any()  # every landmark slot is poisoned
    exp_ = verdict.expected(q, k, v, kw)
    p = check_inputs(q, k, v, **kw)
    _, Ck, _, _, sl2 = launch.scalars(p)
    K = launch.lmk_cols_for(launch.LMK_COLS_MAX, True, Ck, 16)
    for cols in sorted({0, K}):
        knobs = launch.call_knobs(modes + (cols, False, False, False, True), True, Ck, 16, sl2)
        if cols:
            assert knobs[-1] is True and knobs[3] == cols
        else:  # no landmark columns baked: lmk_rows_j0 dropped (launch.rows_j0_acts)
            assert len(knobs) < len(launch.TC_KNOBS)
        o, lse = _cpu_knobs(q, k, v, knobs, **kw)
        vd = verdict.judge(o, lse, exp_)
        assert vd.status == verdict.PASS, f"{knobs}: " + "; ".join(vd.problems)
        assert not torch.isnan(o).any() and not torch.isnan(lse).any()


def test_lmk_rows_j0_sm_scale_and_fold_knobs():
    """lmk_rows_j0 together with fast_exp2 / scale_fold / win_u32 (the lab's
    fexp+sfold+wu32+lmkj0), positive and non-positive scales."""
    q, k, v = _inputs(1, 2, 2, 45, 80, 32, 32, torch.float32, seed=20)
    for sm in (0.37, 0.0, -0.3):
        kw = dict(window_size=40, chunk_size=8, mask_lmk=True, expand_to_chunk=True,
                  kv_start=3, sm_scale=sm)
        p = check_inputs(q, k, v, **kw)
        _, Ck, _, _, sl2 = launch.scalars(p)
        knobs = launch.call_knobs(("rows", True, True, 2, True, True, True, True), True, Ck, 16,
                                  sl2)
        o, lse = _cpu_knobs(q, k, v, knobs, **kw)
        verdict.assert_pass(o, lse, q, k, v, kw, str(sm))


def test_a_config_with_ws_where_min_blocks_sits_is_refused():
    """``min_blocks`` (session 12) took position 13 of a full config, where ``ws`` used to
    follow ``pack``: a bool there is refused instead of being read as ``min_blocks=False``
    (a default, dropped: the warp-specialised kernel would run instead of the one asked
    for). ``ws`` after every knob still picks the factory."""
    full = launch.with_knobs(launch.short_config(64, 64))
    mb = 4 + launch._KNOB["min_blocks"]
    assert len(full) == 4 + len(launch.TC_KNOBS) and full[mb] == launch.TC_MIN_BLOCKS
    with pytest.raises(ValueError, match="min_blocks"):
        launch.tc_kernel_args(full[:mb] + (False,), True, 64, 0.2)
    assert launch.tc_kernel_args(full + (False,), True, 64, 0.2)[0] == "fwd_tc_nows"
    assert launch.tc_kernel_args(full + (True,), True, 64, 0.2)[0] == "fwd_tc"
    assert launch.tc_kernel_args(full, True, 64, 0.2)[2][-1] == 2


@pytest.mark.parametrize("ws", [False, True])
def test_a_config_with_ws_where_reg_slack_sits_is_refused(ws):
    """``reg_slack`` (session 40) was TC_KNOBS' last item, where a config written before it
    ends in ``ws``: a bool there is refused, not read as ``reg_slack = 0`` (dropped: the
    warp-specialised kernel for a ``ws=False`` config) or as 1."""
    full = launch.with_knobs(launch.shipped_config(64, 64))
    rs = 4 + launch._KNOB["reg_slack"]
    assert full[rs] == 0
    with pytest.raises(ValueError, match="reg_slack"):
        launch.tc_kernel_args(full[:rs] + (ws,), True, 64, 0.2)


@pytest.mark.parametrize("ws", [False, True])
@pytest.mark.parametrize("knob, default", [("producer_warps", 1), ("lazy_rescale", 0),
                                           ("hoist_left", 0), ("hoist_keys", 0),
                                           ("vc_shift", 0), ("pingpong", 0), ("o_cols", 0),
                                           ("qk_cols", 0), ("v_cols", 0)])
def test_a_config_with_ws_where_an_int_knob_sits_is_refused(ws, knob, default):
    """``producer_warps`` (session 41), ``lazy_rescale`` (session 43), ``hoist_left`` (session
    44), ``hoist_keys`` (session 45), ``vc_shift`` (session 47), ``pingpong`` (session 52),
    ``o_cols`` (session 55) and ``qk_cols`` / ``v_cols`` (session 56, TC_KNOBS' last items) are
    ints: a config written before one of them that ends in ``ws`` is refused there, not read as
    one producer warp (True) or none, as a rescale threshold, as a hoist, as a shift, as turns
    or as columns of o or of the inputs.
    (The config: the shipped long-call one with ``hoist_left`` and ``hoist_keys`` off, so that
    every knob from ``producer_warps`` on is at its default.)"""
    full = launch.with_knobs(launch.shipped_config(64, 64), hoist_left=0, hoist_keys=0)
    at = 4 + launch._KNOB[knob]
    assert full[at] == default and launch.TC_KNOBS[-1][0] == "v_cols"
    with pytest.raises(ValueError, match=knob):
        launch.tc_kernel_args(full[:at] + (ws,), True, 64, 0.2)
    # the defaults are left out of the kernel key: every shipped kernel keeps its arguments
    assert launch.tc_kernel_args(full, True, 64, 0.2) == launch.tc_kernel_args(full[:at], True, 64, 0.2)


def test_lmk_rows_j0_kept_only_where_it_acts():
    """launch.call_knobs keeps lmk_rows_j0 only with mask_lmk, lmk_zero="rows" and baked
    landmark columns (one kernel where it changes nothing; its serial-loop form failed
    ThreadSync at Dv = 80/96/112), after the shipped knobs in TC_KNOBS (only the
    per-call knob ``pack``, the tile's ``min_blocks``, session 25's ``overlap`` and
    ``v_chunk``, session 31's ``wide``, session 38's ``lmk_const``, session 40's
    ``reg_slack``, session 41's ``producer_warps``, session 43's ``lazy_rescale``,
    session 44's ``hoist_left``, session 45's ``hoist_keys``, session 47's ``vc_shift``,
    session 52's ``pingpong``, session 55's per-call ``o_cols`` and session 56's per-call
    ``qk_cols`` / ``v_cols`` follow it, at their defaults) so older cache keys stay."""
    assert launch.TC_KNOBS[7:] == (("lmk_rows_j0", False), ("pack", False), ("min_blocks", 0),
                                   ("overlap", 0), ("v_chunk", False), ("wide", False),
                                   ("lmk_const", False), ("reg_slack", 0),
                                   ("producer_warps", 1), ("lazy_rescale", 0), ("hoist_left", 0),
                                   ("hoist_keys", 0), ("vc_shift", 0), ("pingpong", 0),
                                   ("o_cols", 0), ("qk_cols", 0), ("v_cols", 0))
    cfg = ("rows", True, True, 2, False, False, False, True)
    assert launch.call_knobs(cfg, True, 64, 128, 0.2) == cfg
    assert launch.call_knobs(cfg, False, 64, 128, 0.2) == ("rows", True, True)
    assert launch.call_knobs(("tile",) + cfg[1:], True, 64, 128, 0.2) == ("tile", True, True, 2)
    assert launch.call_knobs(cfg, True, 16, 128, 0.2) == ("rows", True, True)  # no landmark columns
    for D in (64, 128):  # shipped at D <= 128 since session 5
        ship = launch.shipped_config(D, D)
        assert launch.tc_kernel_args(ship, True, 64)[2][launch._KNOB["lmk_rows_j0"]] is True
        # at C = 16 no landmark columns, no view, no lmk_const; hoist_left (session 45) stays
        assert launch.tc_kernel_args(ship, True, 16)[2] == _hoisted(
            ("rows", True, True, 0, True, False, True, False, 0, launch.ctas_per_sm(ship)))


def test_prefill_grid_packs_gqa_heads_where_they_fit(monkeypatch):
    """run_cuda's prefill grid packs the G query heads of a key/value head into one
    tile (launch.packs) when G > 1, G * Lq fits the tile's rows, max(D) <= 128 and
    the group lowers (launch.pack_lowers); the kernel bakes G; split-KV calls and
    everything else run unpacked."""
    asked = []
    monkeypatch.setattr(launch, "_kernel", lambda kind, *a: asked.append((kind, a)) or (lambda *x: None))
    monkeypatch.setattr(launch, "sm_count", lambda dev: 132)

    def pack_of(B, Hq, Hkv, Lq, Dqk=64, Dv=64, lmk=True, exp=True, W=300):
        asked.clear()
        q = torch.zeros((B, Hq, Lq, Dqk), dtype=torch.bfloat16, device="meta")
        k = torch.zeros((B, Hkv, 700, Dqk), dtype=torch.bfloat16, device="meta")
        v = torch.zeros((B, Hkv, 700, Dv), dtype=torch.bfloat16, device="meta")
        p = check_inputs(q, k, v, window_size=W, chunk_size=64, mask_lmk=lmk, expand_to_chunk=exp)
        o, lse = p.new_outputs()
        launch.run_cuda(p, q, k, v, False, False, o, lse)
        kind, args = asked[0]
        knobs = args[12:]
        i = launch._KNOB["pack"]
        return (knobs[i] if len(knobs) > i else 0), args[11]  # (baked G, split)

    assert pack_of(8, 32, 4, 1) == (8, False)            # decode B=8 GQA 32/4 D=64
    assert pack_of(1, 32, 4, 1) == (8, False)            # B=1: the same kernel, 4 programs
    assert pack_of(1, 32, 4, 8) == (8, False)            # 64 rows: the 64-row tile, full
    assert pack_of(1, 32, 4, 9) == (0, False)            # 72 rows: unpacked
    # G = 2, both flags off, Dqk != Dv on the 64x64 tile: fails ThreadSync (launch.pack_lowers)
    assert pack_of(18, 4, 2, 1, 96, 64, False, False) == (0, False)
    assert pack_of(18, 4, 2, 1, 96, 64, True, False) == (2, False)
    assert pack_of(18, 4, 2, 1, 96, 96, False, False) == (2, False)
    assert pack_of(18, 8, 2, 1, 96, 64, False, False) == (4, False)
    assert pack_of(1, 32, 32, 1) == (0, False)           # G = 1: nothing to pack
    assert pack_of(1, 24, 8, 21) == (3, False)           # G = 3, 63 rows
    assert pack_of(1, 24, 8, 1, 32, 32, False, False) == (3, False)  # every G <= 8 lowers
    assert pack_of(1, 40, 4, 1) == (0, False)            # G = 10: never compiled, unpacked
    assert pack_of(1, 64, 4, 1) == (16, False)           # powers of two
    assert pack_of(8, 32, 8, 1, 128, 128) == (4, False)  # 256 programs: prefill grid, packed
    assert pack_of(8, 32, 8, 16, 128, 128) == (4, False)  # 64 rows of the 64-row tile
    assert pack_of(8, 32, 8, 17, 128, 128) == (0, False)
    assert pack_of(1, 32, 8, 1, 128, 128, W=512) == (0, True)  # 32 programs, 10 key tiles: split-KV
    assert pack_of(1, 32, 8, 1, 128, 128) == (4, False)  # 7 key tiles: packed grid (SPLIT_MIN_TILES)
    assert pack_of(1, 16, 2, 1, 192, 192) == (0, False)  # D > 128: no knobs, unpacked
    assert pack_of(2, 16, 4, 300) == (0, False)          # long prefill


def test_explicit_pack_config_packs_any_lq(monkeypatch):
    """An explicit config with the ``pack`` permission packs whatever Lq: the kernel
    tiles G * Lq packed rows in blocks of block_M (since 2f11a45; before, run_cuda
    refused rows past one tile). The launcher's own choice (launch.packs) still
    packs only calls whose rows fit one tile."""
    asked = []
    monkeypatch.setattr(launch, "_kernel", lambda kind, *a: asked.append((kind, a)) or (lambda *x: None))
    cfg = launch.with_knobs(launch.shipped_config(64, 64), pack=True)

    def call(Hq, Hkv, Lq):
        asked.clear()
        q = torch.empty((1, Hq, Lq, 64), dtype=torch.bfloat16, device="meta")
        k = torch.empty((1, Hkv, 512, 64), dtype=torch.bfloat16, device="meta")
        p = check_inputs(q, k, k, window_size=100, chunk_size=64)
        o, lse = p.new_outputs()
        launch.run_cuda(p, q, k, k, False, False, o, lse, force_split=1, config=cfg)
        return asked[0][1][12 + launch._KNOB["pack"]]

    assert call(32, 4, 8) == 8      # 8 heads x 8 queries = 64 rows: one tile
    assert call(32, 4, 9) == 8      # 72 rows: two tiles, still packed
    assert call(6, 2, 300) == 3


def test_forced_split_count_and_the_split_backend_on_cpu(monkeypatch):
    """``tilelang-split`` (tilelang_impl.split_kv) forces split-KV: one wave of programs,
    at least two splits even where the key range has one tile or the grid is full; it
    refuses what has no split variant instead of running another kernel."""
    from conformance.registry import load_backend
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)

    def forced(B, Hq, Lq, Lk, D=128, W=512):
        q = torch.empty((B, Hq, Lq, D), dtype=torch.bfloat16, device="meta")
        k = torch.empty((B, Hq, Lk, D), dtype=torch.bfloat16, device="meta")
        return launch.forced_splits(check_inputs(q, k, k, window_size=W, chunk_size=64))

    assert forced(1, 32, 1, 8192) == 8          # as split_plan: one wave of two CTAs per SM
    assert forced(1, 8, 1, 300) == 5           # where split_plan now takes the grid
    assert forced(1, 8, 1, 40, W=8) == 2       # one key tile: the second split is empty
    assert forced(1, 32, 8192, 8192) == 2      # a full grid still splits
    backend = load_backend("tilelang-split")
    q, k, v = (torch.randn(1, 2, n, 128) for n in (3, 40, 40))
    with pytest.raises(UnsupportedConfig, match="tilelang-split"):
        backend.fn(q, k, v, window_size=8, chunk_size=4)
    o, lse = backend.fn(q[:, :, :0], k, v, window_size=8, chunk_size=4)  # empty: no kernel
    assert o.shape == (1, 2, 0, 128) and lse.shape == (1, 2, 0)


# --------------------------------------------------------------------------------------
# The chunk view of v (session 25: launch.v_chunk_call / v_chunk_view, knob v_chunk)
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, Lk, want", [
    (dict(window_size=512, chunk_size=64), 8192, True),
    (dict(window_size=512, chunk_size=64, kv_start=128), 8192, True),
    (dict(window_size=512, chunk_size=64, kv_start=5), 8192, False),        # key 0 inside a chunk
    (dict(window_size=512, chunk_size=64), 8191, False),                    # a partial last chunk
    (dict(window_size=512, chunk_size=64, expand_to_chunk=False), 8192, False),  # edges anywhere
    (dict(window_size=512, chunk_size=64, mask_lmk=False), 8192, False),    # no landmark rows
    (dict(window_size=8, chunk_size=1), 64, False),                         # a chunk of one key
    (dict(window_size=8, chunk_size=2), 64, True),
    (dict(window_size=100, chunk_size=128), 100, False),                    # chunk past every key
])
def test_v_chunk_call_rule(kw, Lk, want):
    """The view serves a call only when every tile a query block loads lies inside one
    chunk of it: landmarks masked, edges expanded to chunks, kv_start and Lk multiples
    of the chunk (an independent statement of launch.v_chunk_call's rule)."""
    p = _meta_problem(1, 4, 2, min(Lk, 300), Lk, 128, 128, **kw)
    assert launch.v_chunk_call(p) is want


@pytest.mark.parametrize("blhd", [False, True], ids=["BHLD", "BLHD"])
def test_v_chunk_view_is_a_view_without_landmark_rows(blhd):
    """Element [b, h, c, t, d] of the view is v[b, h, c*C + t, d] for t < C - 1, on the
    same storage (nothing copied), for both layouts (given in storage order, as run_cuda
    receives them) and a storage offset."""
    B, H, L, D, C = 2, 3, 256, 32, 64
    base = torch.randn(B * H * L * D + 7)
    if blhd:
        stored = base[7:].view(B, L, H, D)
        v = stored.transpose(1, 2)  # canonical shape
    else:
        v = stored = base[7:].view(B, H, L, D)
    w = launch.v_chunk_view(stored, C, blhd)
    assert w.shape == (B, H, L // C, C - 1, D)
    assert w.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    idx = torch.arange(L).view(L // C, C)[:, :C - 1]  # key of each (chunk, row) of the view
    assert torch.equal(w, v[:, :, idx.reshape(-1)].view(B, H, L // C, C - 1, D))
    assert not ((idx + 1) % C == 0).any()  # no landmark in it


@pytest.mark.parametrize("blhd", [False, True], ids=["BHLD", "BLHD"])
def test_v_chunk_view_strides_ignore_size_one_dimensions(blhd):
    """A contiguous v may carry any stride on a dimension of size 1 (B = 1 and H = 1 here,
    strides 1 and 3); the view's strides are the storage order's own (the copy engine
    needs multiples of 16 bytes), and it still addresses v's elements."""
    L, D, C = 256, 32, 64
    flat = torch.randn(L * D)
    stored = flat.as_strided((1, L, 1, D) if blhd else (1, 1, L, D),
                             (1, D, 3, 1) if blhd else (1, 3, D, 1))
    assert stored.is_contiguous()
    w = launch.v_chunk_view(stored, C, blhd)
    assert w.stride() == (L * D, D if blhd else L * D, C * D, D, 1)
    v = stored.transpose(1, 2) if blhd else stored
    idx = torch.arange(L).view(L // C, C)[:, :C - 1]
    assert torch.equal(w, v[:, :, idx.reshape(-1)].view(1, 1, L // C, C - 1, D))
    # a strided v (the first L keys of a longer cache, several heads) keeps its own strides
    big = torch.randn((2, L + 64, 3, D) if blhd else (2, 3, L + 64, D))
    stored = big[:, :L] if blhd else big[:, :, :L]
    w = launch.v_chunk_view(stored, C, blhd)
    v = stored.transpose(1, 2) if blhd else stored
    assert torch.equal(w, v[:, :, idx.reshape(-1)].reshape(2, 3, L // C, C - 1, D))


def test_v_chunk_knob_resolved_per_call():
    """call_knobs keeps the v_chunk permission only where the call admits the view and the
    chunk is a multiple of the tile's block_N; the shipped D <= 128 configs carry it."""
    cfg = launch.with_knobs(launch.shipped_config(128, 128))
    at = launch._KNOB["v_chunk"]
    assert cfg[4 + at] == 2 and launch.TC_V_CHUNK == 2  # session 28: tiles of up to two chunks
    assert launch.call_knobs(cfg[4:], True, 64, 64, 0.2, view=True)[at] is True
    assert launch.call_knobs(cfg[4:], True, 128, 64, 0.2, view=True)[at] is True

    def span(*call, **kw):  # the v_chunk value baked (0: none, trimmed or not)
        return launch.full_knobs(launch.call_knobs(cfg[4:], *call, **kw))[at]
    assert span(True, 32, 64, 0.2, view=True) == 0  # C < block_N
    assert span(True, 64, 128, 0.2, view=True) == 0
    assert span(True, 64, 64, 0.2, view=False) == 0
    assert span(False, 64, 64, 0.2, view=True) == 0
    # the split kernel carries the same permission since session 28 (zeroing before)
    assert launch.with_knobs(launch.split_config(128, 128))[4 + at] == launch.TC_V_CHUNK
    assert launch.with_knobs(launch.split_config(128, 128, True, False))[4 + at] is False  # noexp


@pytest.mark.parametrize("cap, C, block_N, Dv, want", [
    (True, 64, 64, 128, True), (True, 256, 64, 128, True),    # a tile inside one chunk
    (True, 64, 128, 64, 0),                                   # two chunks, not permitted
    (2, 64, 128, 64, 2), (2, 64, 128, 32, 2), (4, 64, 128, 64, 2),
    (2, 32, 128, 64, 0), (4, 32, 128, 64, 4),                 # four chunks: permitted or not
    (4, 16, 128, 64, 0),                                      # eight: no such kernel
    (2, 48, 128, 64, 0), (2, 96, 128, 64, 0),                 # not a whole number of chunks
    (2, 64, 128, 48, 0), (2, 32, 64, 128, 0),                 # V rows TileLang cannot split
    (0, 64, 64, 128, 0), (2, 0, 64, 128, 0),
])
def test_v_chunk_span_rule(cap, C, block_N, Dv, want):
    """launch.v_chunk_span: the tile inside one chunk (True), n = block_N / C whole chunks
    where n is 2 or 4, within the permission, at Dv 32 or 64, else no view (0)."""
    got = launch.v_chunk_span(cap, C, block_N, Dv)
    assert got == want and type(got) is type(want)


def test_v_chunk_spans_match_the_kernel():
    """launch.V_CHUNK_SPANS (launch does not import TileLang) is kernels.V_CHUNK's spans."""
    from tilelang_impl import kernels
    assert tuple(v for v in kernels.V_CHUNK if v > 1) == launch.V_CHUNK_SPANS


def test_v_chunk_two_chunk_permission_resolved_per_call():
    """A permission of 2 bakes span 2 for D <= 64's short-call 128-key tile (launch.short_config)
    at C = 64 (Dv passed down by tc_kernel_key), True where the chunk holds whole tiles,
    nothing without the view."""
    at = launch._KNOB["v_chunk"]
    cfg = launch.with_knobs(launch.short_config(64, 64), v_chunk=2)
    key = launch.tc_kernel_key(64, 64, "bfloat16", True, True, False, False, cfg, 64, 0.2,
                               view=True)[1]
    assert key[launch._V_CHUNK_AT] == 2
    key = launch.tc_kernel_key(64, 64, "bfloat16", True, True, False, False, cfg, 128, 0.2,
                               view=True)[1]
    assert key[launch._V_CHUNK_AT] is True
    key = launch.tc_kernel_key(64, 64, "bfloat16", True, True, False, False, cfg, 64, 0.2)[1]
    assert len(key) <= launch._V_CHUNK_AT
    assert len(launch.call_knobs(cfg[4:], True, 64, 128, 0.2, view=True)) <= at  # no Dv given


@pytest.mark.parametrize("Dv, C, kv_start, exp, want", [
    (128, 64, 0, True, True), (96, 128, 256, True, True), (128, 64, 3, True, False),
    (128, 32, 0, True, False), (128, 64, 0, False, False),
])
def test_split_plan_takes_the_view(monkeypatch, Dv, C, kv_start, exp, want):
    """The split-KV plan of a decode call bakes the chunk view of v where the call admits
    it (shipped since session 28: launch.split_config carries TC_V_CHUNK): a 64-key split
    tile inside one chunk at C = 64 and 128, Dv 128 and 96; not where kv_start leaves the
    chunks off the tiles, where C = 32 would put two chunks in a tile at Dv = 128 (TileLang
    cannot split such V rows), nor for mask_lmk without expand_to_chunk (session 5's kernel)."""
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    p = _meta_problem(1, 32, 32, 1, 8192, Dv, Dv, window_size=512, chunk_size=C, kv_start=kv_start,
                      expand_to_chunk=exp)
    S, kind, args = launch._plan(*_plan_args(p))
    assert S > 1 and kind == "fwd_tc" and args[launch._KNOBS_AT - 1] is True  # split
    got = len(args) > launch._V_CHUNK_AT and args[launch._V_CHUNK_AT]
    assert got is want, args


@pytest.mark.parametrize("D, C, Lk, kv_start, want", [
    (128, 64, 8192, 0, True), (128, 64, 8192 + 64, 64, True), (128, 64, 8191, 0, False),
    (128, 64, 8192, 3, False), (64, 64, 8192, 0, True), (64, 128, 8192, 0, True), (64, 32, 8192, 0, False),
    (128, 32, 8192, 0, False),
])
def test_v_chunk_in_the_plan(monkeypatch, D, C, Lk, kv_start, want):
    """The prefill plan of a long unpacked call bakes v_chunk exactly where the view serves it
    and its chunk fills whole 64 x 64 tiles (D = 128, and D = 64 since session 42; its
    permission is one chunk a tile, so C = 32 gets no view); the cached plan keys it (Lk past
    the reach and kv_start are not in the key otherwise). Span 2 on the 128-key tile of one-block
    calls: test_d64_tile_follows_the_query_blocks."""
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    p = _meta_problem(1, 32, 32, 2048, Lk, D, D, window_size=512, chunk_size=C, kv_start=kv_start)
    S, kind, args = launch._plan(*_plan_args(p))
    assert S == 1 and kind == "fwd_tc"
    got = bool(len(args) > launch._V_CHUNK_AT and args[launch._V_CHUNK_AT])
    assert got is want
    # the neighbour that flips the rule shares every other key field: its own plan
    q = _meta_problem(1, 32, 32, 2048, Lk + 1 if want else Lk, D, D, window_size=512,
                      chunk_size=C, kv_start=kv_start)
    if want:
        args2 = launch._plan(*_plan_args(q))[2]
        assert not (len(args2) > launch._V_CHUNK_AT and args2[launch._V_CHUNK_AT])


@pytest.mark.parametrize("B, Hq, Hkv, Lq, C, short", [
    (8, 32, 4, 1, 64, True), (1, 32, 4, 8, 64, True), (8, 32, 4, 2048, 64, False),
    (8, 32, 32, 1, 64, True), (1, 32, 32, 64, 64, True), (1, 32, 32, 65, 64, False),
    (8, 32, 4, 1, 128, True), (8, 32, 4, 2048, 128, False), (1, 32, 4, 64, 64, True),
])
def test_d64_tile_follows_the_query_blocks(monkeypatch, B, Hq, Hkv, Lq, C, short):
    """At D = 64 the plan's tile follows the call's query blocks (session 42): calls of one
    64-row block (decode, short chunks; packed where launch.packs) run launch.short_config's
    64 x 128 tile at two CTAs per SM, with span 2 of the view at C = 64; longer ones
    launch.shipped_config's 64 x 64 tile at four CTAs per SM (three until session 44), the view
    one chunk a tile. The
    knobs that follow the tile (landmark columns, lmk_const) follow it too."""
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    p = _meta_problem(B, Hq, Hkv, Lq, 8192, 64, 64, window_size=512, chunk_size=C)
    S, kind, args = launch._plan(*_plan_args(p))
    packed = launch.packs(p, 64)
    assert S == 1 and kind == "fwd_tc" and packed is (Hq > Hkv and Hq // Hkv * Lq <= 64)
    knob = dict(zip((n for n, _ in launch.TC_KNOBS), launch.full_knobs(args[launch._KNOBS_AT:])))
    tile = args[launch._KNOBS_AT - 5:launch._KNOBS_AT - 1]  # then split (False), the knobs
    if short:
        assert tile == (64, 128, 2, 128) and knob["min_blocks"] == 2
        assert knob["pack"] == (Hq // Hkv if packed else 0)
        assert knob["v_chunk"] == (2 if C == 64 else True) and knob["lmk_cols"] == 128 // C
    else:
        assert tile == (64, 64, 2, 128) and knob["min_blocks"] == 4 and knob["pack"] == 0
        assert knob["v_chunk"] is True and knob["lmk_cols"] == 1
    assert knob["lmk_const"] is (C == tile[1] // knob["lmk_cols"])


def test_run_cuda_hands_the_view_to_a_v_chunk_kernel(monkeypatch):
    """run_cuda passes v as launch.v_chunk_view to a kernel with v_chunk (and nothing
    else changes), the plain v otherwise; stand-ins replace the kernels."""
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    seen = []

    def fake_call(kind, *args):
        return lambda q, k, v, o, lse, *s: seen.append((args, v, s))
    monkeypatch.setattr(launch, "_call", fake_call)
    for Lk, kv_start, blhd, want in ((1024, 0, False, True), (1024, 0, True, True),
                                     (1024, 5, False, False), (1000, 0, True, False)):
        q = torch.randn(1, 4, 512, 128, dtype=torch.bfloat16)
        k = torch.randn(1, 2, Lk, 128, dtype=torch.bfloat16)
        v = torch.randn(1, 2, Lk, 128, dtype=torch.bfloat16)
        if blhd:  # storage order, as the adapter hands it over
            k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        p = check_inputs(q, k.transpose(1, 2) if blhd else k, v.transpose(1, 2) if blhd else v,
                         window_size=256, chunk_size=64, kv_start=kv_start)
        o, lse = p.new_outputs()
        seen.clear()
        launch.run_cuda(p, q, k, v, False, blhd, o, lse)
        (args, got, s), = seen
        assert bool(len(args) > launch._V_CHUNK_AT and args[launch._V_CHUNK_AT]) is want
        if want:
            sb, s1, s2, sd = v.stride()
            sh, sl = (s2, s1) if blhd else (s1, s2)
            assert got.shape == (1, 2, Lk // 64, 63, 128) and got.data_ptr() == v.data_ptr()
            assert got.stride() == (sb, sh, 64 * sl, sl, sd)
            canon = v.transpose(1, 2) if blhd else v
            assert torch.equal(got[0, 1, 3, 5], canon[0, 1, 3 * 64 + 5])
        else:
            assert got is v
        assert s == launch.scalars(p)


def test_kernel_knobs_overlap_and_v_chunk_validated():
    """fwd_tc refuses v_chunk without mask_lmk or with session 25's overlap (1, 2; the lean
    loop, 3 and 4, takes the view), a v_chunk value outside kernels.V_CHUNK or a multi-chunk
    span at Dv = 128, an overlap value outside kernels.OVERLAP, overlap with lmk_zero='tile'
    under mask_lmk, and lmk_const (constant landmark columns) without the view or the columns
    they stand for, before tracing."""
    from tilelang_impl import kernels
    base = (128, 128, "bfloat16", True, True, False, False, 64, 64, 2, 128, False)
    body = kernels._fwd_tc_body
    with pytest.raises(ValueError, match="v_chunk"):
        body(*base[:3], False, *base[4:], True, lmk_zero="rows", v_chunk=True)
    for ovl in (1, 2):
        with pytest.raises(ValueError, match="v_chunk"):
            body(*base, True, lmk_zero="rows", overlap=ovl, v_chunk=True)
    assert kernels.OVERLAP == (0, 1, 2, 3, 4)
    for bad in (5, -1, True):
        with pytest.raises(ValueError, match="overlap"):
            body(*base, True, lmk_zero="rows", overlap=bad)
    with pytest.raises(ValueError, match="overlap"):
        body(*base, True, lmk_zero="tile", overlap=1)
    with pytest.raises(ValueError, match="v_chunk"):
        body(*base, True, lmk_zero="rows", v_chunk=3)  # a span outside kernels.V_CHUNK
    with pytest.raises(ValueError, match="v_chunk"):
        body(*base, True, lmk_zero="rows", v_chunk=2)  # a 256-byte V row: no chunk split
    # session 38's lmk_const: only with the view baked and K > 0 landmark columns dividing
    # block_N (launch.lmk_const_acts decides the rest per call), and a bool
    with pytest.raises(ValueError, match="lmk_const"):
        body(*base, True, lmk_zero="rows", lmk_cols=1, lmk_const=True)  # no view
    with pytest.raises(ValueError, match="lmk_const"):
        body(*base, True, lmk_zero="rows", v_chunk=True, lmk_const=True)  # lmk_cols = 0
    with pytest.raises(ValueError, match="lmk_const"):
        body(*base, True, lmk_zero="rows", lmk_cols=3, v_chunk=True, lmk_const=True)  # 3 of 64
    with pytest.raises(ValueError, match="lmk_const"):
        body(*base, True, lmk_zero="rows", lmk_cols=1, v_chunk=True, lmk_const=1)


def test_batch_past_the_grid_z_bound_runs_in_slices(monkeypatch):
    """B past a launch grid's z extent (65535; lowered to 2 here): launch.run_cuda runs the
    kernel over slices of the batch, each on views of the inputs and outputs at the slice's
    offset, so every row is written (poisoned outputs); the kernels recorded, not run."""
    monkeypatch.setattr(launch, "GRID_YZ_MAX", 2)
    monkeypatch.setattr(launch, "sm_count", lambda dev: 132)
    launched = []

    def fake_call(kind, *args):
        def ker(q, k, v, o, lse, *scalars):
            launched.append((q.shape[0], k.data_ptr(), o.data_ptr(), lse.data_ptr()))
            o.fill_(1.0)
            lse.fill_(0.0)
        return ker
    monkeypatch.setattr(launch, "_call", fake_call)
    q, k, v = _inputs(5, 2, 1, 64, 64, 64, 64, torch.bfloat16)
    p = check_inputs(q, k, v, window_size=16, chunk_size=8)
    o, lse = p.new_outputs(poison=True)
    launch.run_cuda(p, q, k, v, False, False, o, lse)
    assert [n for n, *_ in launched] == [2, 2, 1]
    for b0, (_, kp, op, lp) in zip((0, 2, 4), launched):
        assert kp == k[b0:].data_ptr() and op == o[b0:].data_ptr() and lp == lse[b0:].data_ptr()
    assert (o == 1).all() and (lse == 0).all()
    import dataclasses
    text = launch.describe(dataclasses.replace(p, device=torch.device("cuda")))
    assert text.startswith("fwd_tc") and text.endswith(" (batch slices of 2 or fewer: 3 launches)"), text


def test_more_query_heads_than_a_gpu_grid_holds_are_unsupported(monkeypatch):
    """Hq > 65535 on a GPU: one batch's heads would not fit a launch grid's y extent; refused
    by check_limits, before any kernel (the CPU kernel has no such bound)."""
    monkeypatch.setattr(launch, "capability", lambda dev: (9, 0))
    p = _meta_problem(1, 65536, 1, 1, 1, 32, 32, window_size=1, chunk_size=1)
    import dataclasses
    with pytest.raises(UnsupportedConfig, match="Hq=65536"):
        launch.check_limits(dataclasses.replace(p, device=torch.device("cuda")))
    launch.check_limits(dataclasses.replace(p, device=torch.device("cpu")))


@pytest.mark.parametrize("D, C, Lq, Lk, kv_start, want, short", [
    (64, 64, 3000, 8192, 0, (63, 127), True), (64, 128, 3000, 8192 + 128, 128, (127,), True),
    (64, 64, 3000, 8192, 0, (63,), False),  # D = 64's 64-key tile of long calls (session 42)
    (128, 64, 2000, 6144, 64, (63,), False), (96, 64, 1500, 4096, 128, (63,), False),  # D = 128's
    (64, 256, 3000, 8192, 0, None, True),   # the view, a landmark in every other tile: refused
    (128, 128, 2000, 6144, 0, None, False),  # likewise on D = 128's 64-key tile
    (64, 128, 3000, 8192, 0, None, False),  # and on D = 64's
    (64, 64, 3000, 8192, 3, None, True),    # no view (kv_start inside a chunk): tiles off the chunks
    (64, 32, 3000, 8192, 0, None, False),   # no view: two chunks a tile past the permission of 1
    (128, 32, 2000, 6144, 0, None, False),  # view refused (two chunks of V rows TileLang cannot
])                                          # split): V's rows zeroed by the consumer, not baked
def test_lmk_const_only_where_every_tile_has_constant_landmark_columns(D, C, Lq, Lk, kv_start, want,
                                                                        short):
    """launch.lmk_const_acts (session 38's knob ``lmk_const``: the landmark columns as
    compile-time constants, ``macros.constant_landmark_columns``; a permission in the shipped
    prefill config since session 39): under the permission, baked exactly where the chunk view serves the call and
    ``K * C == block_N`` (the view baked: its consumer zeroes no V rows, whose ``lmk_rows_j0``
    form has no constant variant). There every key tile of every query block (``lo`` as
    ``macros.block_key_range`` takes it, from the reference's ``window_left``; tiles
    ``block_N`` keys on; on the prefill grid, with GQA-packed rows and over split-KV
    splits, as ``kernels._fwd_tc_body`` walks them) holds its landmarks (the reference's ``is_landmark``) at exactly
    those columns. The control: where the view is on but ``C = 2 block_N``, some tile holds
    none, so constant columns would mask a visible key there."""
    from reference import mask as R
    from tilelang_impl import macros

    p = _meta_problem(1, 4, 4, Lq, Lk, D, D, window_size=512, chunk_size=C, kv_start=kv_start)
    cfg = (launch.short_config if short else launch.shipped_config)(D, D)
    assert cfg[4 + launch._KNOB["lmk_const"]] is True  # the shipped permission (session 39)
    r, W, Cf = launch.frame(p)
    view = launch.v_chunk_call(p)
    key = launch.tc_kernel_key(D, D, "bfloat16", True, True, False, False, cfg, Cf, 0.2, view=view)[1]
    knobs = key[launch._KNOBS_AT:]
    at = launch._KNOB["lmk_const"]
    assert (len(knobs) > at and knobs[at]) is (want is not None), knobs
    block_M, block_N = cfg[0], cfg[1]
    if not (len(knobs) > launch._KNOB["v_chunk"] and knobs[launch._KNOB["v_chunk"]]):
        return  # the knob needs the view baked (kernels.fwd_tc refuses it otherwise)
    K = knobs[launch._KNOB["lmk_cols"]]
    tiles = set()
    # the grids of kernels._fwd_tc_body: the prefill grid (pack 1, one split), rows packed
    # G = 4 heads a tile, and three splits of each block's key tiles
    for G, S in ((1, 1), (4, 1), (1, 3)):
        for q0 in range(0, G * Lq, block_M):
            q_first, q_end = q0 // G, min((q0 + block_M - 1) // G + 1, Lq)
            left = R.window_left(r + Lk - Lq + q_first, window_size=W, chunk_size=Cf,
                                 expand_to_chunk=True)
            lo, hi = max(int(left) - r, 0), min(Lk - Lq + q_end, Lk)
            n_kb = -(-max(hi - lo, 0) // block_N)
            per = -(-n_kb // S)
            for sp in range(S):
                for kb in range(max(min(per, n_kb - sp * per), 0)):
                    k0 = lo + (sp * per + kb) * block_N
                    tiles.add(tuple(j for j in range(block_N)
                                    if bool(R.is_landmark(r + k0 + j, chunk_size=Cf))))
    if want is not None:
        assert tiles == {want} == {macros.constant_landmark_columns(block_N, K)}
    else:
        assert len(tiles) > 1 and () in tiles, tiles  # C = 2 block_N: every other tile has none


@pytest.mark.parametrize("D, C, cols, short", [(64, 64, (63, 127), True), (64, 128, (127,), True),
                                                (64, 64, (63,), False), (128, 64, (63,), False)])
def test_lmk_const_kernel_traces_with_constant_columns(D, C, cols, short):
    """The kernels of lmk_const (shipped since session 39, at the calls launch.lmk_const_acts
    admits) trace (``fwd_tc.get_tir``, no compile) with the landmark test as compares against
    the constant columns and no per-tile first-landmark register; and without TileLang's
    builder warning that a Python value (the tuple of columns) stood as a condition, which it
    then takes for a constant (the first form of the macros did that five times a kernel)."""
    import logging
    import re

    import tilelang.language.eager.builder as builder
    from tilelang_impl import kernels

    cfg = (launch.short_config if short else launch.shipped_config)(D, D)
    kind, args = launch.tc_kernel_key(D, D, "bfloat16", True, True, False, False, cfg, C,
                                      launch.LOG2E * 0.125, view=True)
    assert kind == "fwd_tc" and args[launch._KNOBS_AT + launch._KNOB["lmk_const"]] is True
    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    catch = Catch(logging.WARNING)
    builder.logger.addHandler(catch)
    try:
        tir = str(kernels.fwd_tc.get_tir(*args))
    finally:
        builder.logger.removeHandler(catch)
    assert not [m for m in seen if "used as condition" in m], seen
    want = " or ".join(f"j == {c}" for c in cols)
    tests = re.findall(r"lmk: T\.bool = ([^\n]*)", tir)
    assert tests and set(tests) == {want}, tests
    # the control: the same call without the permission tests against the tile's register
    kind, args = launch.tc_kernel_key(D, D, "bfloat16", True, True, False, False,
                                      launch.with_knobs(cfg, lmk_const=False), C,
                                      launch.LOG2E * 0.125, view=True)
    assert want not in str(kernels.fwd_tc.get_tir(*args))


@pytest.mark.parametrize("dtype, D, W, C, flags, scale", [
    (torch.float32, 32, 96, 16, (True, True), None),
    (torch.bfloat16, 64, 200, 7, (True, False), None),
    (torch.float16, 32, 50, 64, (False, True), None),
    (torch.float32, 32, 96, 16, (True, True), -0.3),   # the scale not folded: its own branch
    (torch.bfloat16, 192, 64, 16, (True, True), None),  # no fold knob at D = 192
])
def test_lazy_rescale_arithmetic_on_the_c_target(dtype, D, W, C, flags, scale):
    """The lab knob ``lazy_rescale`` (session 43, ``kernels.LAZY_RESCALES``): the CPU kernel
    built with it (``tools.lab_tilelang.cpu_lazy_rescale``) passes the suite's tolerance on
    keys whose scores grow along the sequence (k scaled by a ramp: the row max rises past
    2**8 of the kept reference tile after tile, so rows update) and on plain random keys
    (rows keep theirs), NaN in every slot no query sees; and its results differ from the
    kernel without the knob (it acts). A kernel that kept the reference but took the new
    max, or set alpha to 1 on an update, fails the ramp cases."""
    from tools.lab_tilelang import cpu_lazy_rescale
    mask_lmk, expand = flags
    kw = dict(window_size=W, chunk_size=C, mask_lmk=mask_lmk, expand_to_chunk=expand, kv_start=5,
              sm_scale=scale)
    for ramp in (True, False):
        q, k, v = _inputs(1, 4, 2, 300, 300, D, D, dtype, seed=43 + ramp)
        if ramp:
            k = (k.float() * torch.linspace(0.2, 6.0, 300)[:, None]).to(dtype)
        kp, vp, _ = _poison(q, k, v, kw)
        o, lse = cpu_lazy_rescale(q, kp, vp, **kw)
        verdict.assert_pass(o, lse, q, k, v, kw, f"lazy_rescale ramp={ramp}")
        o0, lse0 = swa(q, kp, vp, **kw)
        assert not torch.equal(lse, lse0), "lazy_rescale changed nothing"


@pytest.mark.parametrize("D, W, C, flags, kv_start, Lq", [
    (32, 100, 16, (True, True), 5, 300),      # expanded window edges, some left of 0
    (64, 200, 7, (True, False), 0, 300),      # a chunk that is no divisor of the tile
    (32, 50, 64, (False, True), 1000003, 200),  # the kernel frame's chunk offset
    (64, 96, 16, (True, True), 37, 45),       # Lq < Lk: the query offset
])
def test_hoist_left_changes_no_bit_on_the_c_target(D, W, C, flags, kv_start, Lq):
    """``hoist_left`` (session 44, shipped in session 45 for calls of several 64-row query
    blocks, ``launch.TC_HOIST_LEFT``) computes ``mask_split``'s last-row left edge once
    before the key loop: the CPU kernel built with it gives the same bits as the kernel
    without it (a tile wrongly taken as inside every window would skip its window test and
    differ; an edge too far right only sends more tiles through the full test, which this
    cannot see); the public CPU path bakes it as the GPU's prefill grid does
    (``launch.cpu_kernel_args``: for ``Lq > 64``); and the knob acts: with
    ``expand_to_chunk`` the C source's key loop (``for (int32_t kb``) has one floor division
    by the chunk fewer, and the code before it one more."""
    import re

    from tools.lab_tilelang import _cpu_with, cpu_hoist_left
    mask_lmk, expand = flags
    kw = dict(window_size=W, chunk_size=C, mask_lmk=mask_lmk, expand_to_chunk=expand,
              kv_start=kv_start)
    q, k, v = _inputs(1, 4, 2, Lq, 300, D, D, torch.float32, seed=44 + D)
    kp, vp, _ = _poison(q, k, v, kw)
    o, lse = cpu_hoist_left(q, kp, vp, **kw)
    o0, lse0 = _cpu_with(q, kp, vp, dict(hoist_left=0), **kw)
    assert torch.equal(o, o0) and torch.equal(lse, lse0)
    verdict.assert_pass(o, lse, q, k, v, kw, "hoist_left")
    from tilelang_impl import api, kernels
    p = api._problem(q, k, v, W, C, mask_lmk, expand, kv_start, None, devices=("cpu",))
    args, named, _ = launch.cpu_kernel_args(p, False, False)
    assert named == ({"hoist_left": 1} if Lq > 64 else {}), named
    launch._cache.clear()
    o1, lse1 = swa(q, kp, vp, **kw)
    assert torch.equal(o, o1) and torch.equal(lse, lse1)
    (key,) = [key for key in launch._cache if key[0] == "fwd_cpu"]
    assert (("hoist_left", 1) in key) == (Lq > 64), key
    assert args[8 + launch._KNOB["mask_split"]] is True  # after head dims, flags, layouts, tile

    def divisions(hoist):  # floor divisions by the chunk before the key loop and in it
        src = kernels.fwd_cpu(*args, hoist_left=hoist).get_kernel_source()
        at = re.search(r"for \(int32_t kb = ", src).start()
        return src[:at].count("/ chunk_size)"), src[at:].count("/ chunk_size)")
    (before, inside), (before_on, inside_on) = divisions(0), divisions(1)
    # without expand_to_chunk the edge has no division: the knob moves a subtraction only
    want = (before + 1, inside - 1) if expand else (before, inside)
    assert (before_on, inside_on) == want, (before, inside, before_on, inside_on)


def test_hoist_left_backend_is_unsupported_where_the_knob_cannot_act():
    """``tools.lab_tilelang.cpu_hoist_left`` as a conform backend: above head dim 128 the CPU
    kernel's knobs have no ``mask_split`` (nor any knob), so the call is ``unsupported``, not
    a crash or a kernel silently built without the knob."""
    from tools.lab_tilelang import cpu_hoist_left
    q, k, v = _inputs(1, 2, 1, 40, 40, 192, 128, torch.float32, seed=44)
    with pytest.raises(UnsupportedConfig, match="hoist_left"):
        cpu_hoist_left(q, k, v, window_size=16, chunk_size=8)


def test_cpu_kernel_args_refuse_knobs_past_wide(monkeypatch):
    """``kernels.fwd_cpu`` takes TC_KNOBS by position up to ``wide`` and the later ones by
    name (``lazy_rescale``, a lab knob; ``hoist_left``, which launch.cpu_kernel_args sets by
    name for calls of several query blocks), so ``launch.cpu_kernel_args`` refuses a knob
    tuple that reaches past ``wide`` (a GPU knob such as ``lmk_const`` would land in one of
    their slots) instead of building a kernel that misreads it. The shipped knobs stop at
    ``wide`` at every head dim."""
    from tilelang_impl import api
    q, k, v = _inputs(1, 2, 1, 40, 40, 64, 64, torch.float32, seed=44)
    p = api._problem(q, k, v, 16, 8, True, True, 0, None, devices=("cpu",))
    for D in (32, 64, 96, 128, 192, 256):
        assert len(launch.tc_knobs(D, D)) <= launch._KNOB["wide"] + 1, D
    launch.cpu_kernel_args(p, False, False)
    monkeypatch.setattr(launch, "call_knobs", lambda *a, **kw: launch.full_knobs(()))
    with pytest.raises(RuntimeError, match="past 'wide'"):
        launch.cpu_kernel_args(p, False, False)
