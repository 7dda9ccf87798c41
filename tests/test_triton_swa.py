"""The Triton backend against the float64 reference (CPU: Triton interpreter).

Without CUDA the repo-root conftest sets ``TRITON_INTERPRET=1`` before anything
imports triton; this module sets it too when it is the first to import, so it
runs the same either way. Kept lean: the interpreter costs ~0.1-1 s a call.

Tolerance, per case, the conformance suite's own (``conformance.verdict``):
the backend's max and mean error against ``reference.golden`` within twice
those of ``reference.same_dtype`` (a kernel's precision in the input dtype) plus a
floor of a few ulps of the dtype at the output's magnitude; empty rows, NaN
and infinities exact. Calls through ``_run`` write into outputs poisoned with
NaN, so an element the kernel never writes fails.
"""

from __future__ import annotations

import dataclasses
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import reference  # noqa: E402
from conformance import verdict  # noqa: E402
from conformance.cases import poison_unseen  # noqa: E402
import triton_impl  # noqa: E402
from triton_impl import UnsupportedConfig, sliding_window_attention  # noqa: E402
from triton_impl import api as _api  # noqa: E402
from triton_impl import kernels  # noqa: E402
from triton_impl import launch as L  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
_SEED = [1234]


def _rand(shape, dtype, blhd=False):
    _SEED[0] += 1
    g = torch.Generator().manual_seed(_SEED[0])  # fresh inputs for every tensor of every case
    if blhd:  # stored (B, L, H, D), passed as a (B, H, L, D) view
        b, h, l, d = shape
        return torch.randn((b, l, h, d), generator=g).to(dtype).to(DEV).transpose(1, 2)
    return torch.randn(shape, generator=g).to(dtype).to(DEV)


def _inputs(B, Hq, Hkv, Lq, Lk, Dqk, Dv, dtype, blhd=False):
    return (_rand((B, Hq, Lq, Dqk), dtype, blhd), _rand((B, Hkv, Lk, Dqk), dtype, blhd),
            _rand((B, Hkv, Lk, Dv), dtype, blhd))


def _run(q, k, v, path=None, phases=None, num_splits=None, config=None, fold=None, tma=None, **kw):
    """One call through the launcher into NaN-poisoned outputs."""
    p = reference.check_inputs(q, k, v, **kw)
    o, lse = p.new_outputs(poison=True)
    taken = L.launch(p, q, k, v, o, lse, path=path, phases=phases, num_splits=num_splits,
                     config=config, fold=fold, tma=tma)
    return o, lse, taken


def _within_rounding(a, b):
    """Two kernels' ``(o, lse)`` that differ only in the order of the same math (a compiled
    variant that schedules a block's work differently; on the GPU, not under the
    interpreter): NaN / infinity in the same places, ``o`` within two ulps of its dtype
    relative plus 1e-3, ``lse`` within 1e-5 (``allclose`` with ``equal_nan``: a NaN or an
    infinity matches only its twin)."""
    (oa, la), (ob, lb) = a, b
    eps = torch.finfo(oa.dtype).eps
    return (torch.allclose(oa.float(), ob.float(), rtol=2 * eps, atol=1e-3, equal_nan=True)
            and torch.allclose(la, lb, rtol=0, atol=1e-5, equal_nan=True))


def _check(o, lse, q, k, v, **kw):
    """The suite's tolerance policy (conformance.verdict): errors against float64
    golden within 2x the same-dtype reference's plus a floor, max and mean;
    empty rows, NaN and infinities exact."""
    verdict.assert_pass(o, lse, q, k, v, kw)


# (B, Hq, Hkv, Lq, Lk, Dqk, Dv, W, C, dtype, extra kwargs, path, phases)
CASES = [
    # two-phase prefill, several key blocks, left edge floored below 0
    (1, 2, 2, 130, 130, 64, 64, 40, 16, torch.float32, {}, "prefill", True),
    # one-loop prefill, GQA 3:1, Lq < Lk, kv_start not a multiple of C
    (2, 3, 1, 50, 117, 32, 32, 23, 7, torch.float16, dict(kv_start=5), "prefill", False),
    # bf16 (upcast after load under the interpreter), D = 96 padded, no landmark mask
    (1, 2, 1, 70, 70, 96, 96, 30, 8, torch.bfloat16, dict(mask_lmk=False), None, None),
    # Dqk != Dv, plain window (no chunk expansion), explicit negative sm_scale
    (1, 2, 2, 64, 64, 64, 32, 17, 5, torch.float32, dict(expand_to_chunk=False, sm_scale=-0.7), "prefill", True),
    # huge kv_start: positions past 10^6, landmarks at absolute positions
    (1, 4, 2, 40, 200, 32, 32, 50, 16, torch.float32, dict(kv_start=10 ** 6 + 3), "prefill", True),
    # split-KV (forced): decode, MQA 4:1
    (2, 4, 1, 1, 150, 32, 32, 60, 8, torch.float32, dict(kv_start=7), "splitkv", None),
    # split-KV (forced): several queries and GQA rows packed in one tile, bf16
    (1, 4, 2, 9, 160, 64, 32, 45, 16, torch.bfloat16, {}, "splitkv", None),
    # GQA-packed prefill (split kernel writing o directly), G = 4
    (1, 8, 2, 60, 90, 32, 32, 25, 8, torch.float16, dict(kv_start=2), "packed", None),
    # fp32 prefill rows no conformance case of the CPU tier reaches (session 33's audit):
    # D = 256 (32 x 16 w8 s2) and D = 96 (padded to 128), an explicit scale on the latter
    (1, 2, 1, 40, 40, 256, 256, 16, 8, torch.float32, {}, "prefill", None),
    (1, 2, 1, 45, 60, 96, 96, 20, 8, torch.float32, dict(sm_scale=0.3, kv_start=3), "prefill", None),
    # 16-bit pointer prefill at D = 256 with the one-landmark column test (C >= BLOCK_N), and
    # at D = 48 in phases with head dims padded to 64 (the same audit)
    (1, 2, 1, 130, 130, 256, 256, 64, 64, torch.float16, {}, "prefill", None),
    (2, 4, 2, 129, 129, 48, 48, 32, 16, torch.float16, {}, "prefill", None),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[11] or 'auto'}-{str(c[9])[6:]}-{i}" for i, c in enumerate(CASES)])
def test_matches_golden(case):
    B, Hq, Hkv, Lq, Lk, Dqk, Dv, W, C, dtype, extra, path, phases = case
    kw = dict(window_size=W, chunk_size=C, **extra)
    q, k, v = _inputs(B, Hq, Hkv, Lq, Lk, Dqk, Dv, dtype)
    o, lse, taken = _run(q, k, v, path=path, phases=phases, **kw)
    if path is not None:
        assert taken == path
    assert o.shape == (B, Hq, Lq, Dv) and o.dtype == dtype and o.is_contiguous()
    assert lse.shape == (B, Hq, Lq) and lse.dtype == torch.float32
    _check(o, lse, q, k, v, **kw)


@pytest.mark.parametrize("path", ["prefill", "splitkv", "packed"])
def test_nan_in_slots_no_query_sees(path):
    """Keys left of every window and landmarks may hold NaN/inf: outputs are
    bit-identical to the same call with finite values there."""
    kw = dict(window_size=20, chunk_size=8, kv_start=3)
    Lq, Lk = (3, 120) if path == "splitkv" else (40, 120)
    q, k, v = _inputs(1, 4, 2, Lq, Lk, 32, 32, torch.float32)
    o_clean, l_clean, _ = _run(q, k, v, path=path, **kw)
    k2, v2 = k.clone(), v.clone()
    unseen = poison_unseen(k2, v2, Lq, kw)
    assert unseen[:60].any() and unseen[-20:].any(), "the case must have unseen slots left and among landmarks"
    k2[:, :, unseen.nonzero()[0]] = float("inf")
    o, lse, _ = _run(q, k2, v2, path=path, **kw)
    assert torch.equal(o, o_clean) and torch.equal(lse, l_clean)


# (path, BLOCK_N, C, PHASES): C == BLOCK_N (the phase wraps to exactly 0 after every block),
# C a multiple and a non-multiple of BLOCK_N (one landmark per block at most:
# LMK_ONE), C < BLOCK_N (several per block: the modulo test).
LMK_PHASE = [("prefill", 16, c, ph) for c in (16, 48, 21, 6) for ph in (False, True)] + [
    ("splitkv", 16, 16, None), ("splitkv", 16, 37, None), ("splitkv", 32, 8, None)]


@pytest.mark.parametrize("path,block_n,chunk,phases", LMK_PHASE,
                         ids=[f"{a}-N{b}-C{c}" + ("" if ph is None else f"-ph{int(ph)}") for a, b, c, ph in LMK_PHASE])
def test_landmark_phase_every_residue(path, block_n, chunk, phases):
    """The landmark test carries its phase ``(kv_start + n0) % C`` from block to
    block (kernels._not_lmk / _next_phase): ``kv_start`` residues 0, 1, C-1,
    C-BLOCK_N, C/2 and 2 past 3C (the blocks then run through further phases),
    NaN in every landmark slot (a landmark the kernel misses turns o into NaN),
    both kernels, the prefill kernel in both loop forms (its edge loop computes the
    phase per block, its other loops carry it)."""
    assert L._lmk_one(chunk, block_n) == (chunk >= block_n)
    kw = dict(window_size=2 * chunk + 5, chunk_size=chunk)
    Lq = 2 if path == "splitkv" else 70
    q, k, v = _inputs(1, 2, 1, Lq, 100, 32, 32, torch.float16)  # 16-bit: the kernels that take LMK_ONE
    cfg = L.Config(16, block_n, 4, 1)
    for kv_start in sorted({0, 1, chunk - 1, max(chunk - block_n, 0), chunk // 2, 3 * chunk + 2}):
        kw["kv_start"] = kv_start
        lmk = reference.is_landmark(reference.key_positions(100, kv_start, DEV), chunk_size=chunk)
        k2, v2 = k.clone(), v.clone()
        k2[:, :, lmk], v2[:, :, lmk] = float("nan"), float("nan")
        o, lse, _ = _run(q, k2, v2, path=path, config=cfg, num_splits=3 if path == "splitkv" else None,
                         phases=phases, **kw)
        _check(o, lse, q, k, v, **kw)
    p = reference.check_inputs(q, k, v, **kw)
    plan = L._make_plan(p, path, cfg, 3 if path == "splitkv" else None, None)
    assert plan.constexprs[(True, False)]["LMK_ONE"] is True  # 16-bit: the one-landmark kernel is reachable


@pytest.mark.parametrize("path", ["prefill", "splitkv"])
def test_empty_rows_are_zero_and_minus_inf(path):
    """chunk_size == 1 with mask_lmk: every key is a landmark, no row sees anything."""
    q, k, v = _inputs(1, 2, 1, 5 if path == "splitkv" else 33, 33, 32, 32, torch.float16)
    o, lse, _ = _run(q, k, v, path=path, window_size=4, chunk_size=1)
    assert torch.equal(o, torch.zeros_like(o))
    assert torch.isneginf(lse).all()


@pytest.mark.parametrize("path", ["prefill", "splitkv", "packed"])
def test_bf16_outputs_round_to_nearest(path):
    """``sm_scale = 0``: every visible score is 0, so with ``W = 2`` and no landmark mask
    each row's ``o`` is the mean of two keys' ``v``, exact in fp32, and a bf16 output must
    be that mean rounded to nearest, ties to even, element for element. Under the
    interpreter, whose fp32-to-bf16 conversion truncates, about half the elements came out
    one ulp low until the kernels rounded first (``kernels._bf16_rne``); on a GPU this
    checks the hardware's conversion. ``packed`` writes the output from the split kernel
    itself, ``splitkv`` through the combine."""
    Hq, Lq = (4, 1) if path == "packed" else (2, 64 if path == "prefill" else 3)
    q, k, v = _inputs(2, Hq, 2 if path != "packed" else 1, Lq, 64, 32, 64, torch.bfloat16)
    kw = dict(window_size=2, chunk_size=16, mask_lmk=False, expand_to_chunk=False, sm_scale=0.0)
    o, lse, taken = _run(q, k, v, path=path, **kw)
    assert taken.startswith(path)
    vf = v.float()
    prev = torch.cat([vf[:, :, :1], vf[:, :, :-1]], dim=2)  # key 0 alone: the mean of v_0 twice
    mean = ((prev + vf) / 2)[:, :, 64 - Lq:]  # row i sees keys 64 - Lq + i - 1 and 64 - Lq + i
    want = mean.repeat_interleave(Hq // v.shape[1], dim=1).to(torch.bfloat16)
    assert torch.equal(o, want)
    seen = torch.full((Lq,), 2.0)
    seen[0] = 1.0 if Lq == 64 else 2.0
    assert torch.allclose(lse, seen.log().expand_as(lse).to(lse.device))


def test_partly_empty_rows():
    """C = 2 and W = 1: even positions see themselves, odd ones (landmarks) nothing."""
    kw = dict(window_size=1, chunk_size=2, expand_to_chunk=False)
    q, k, v = _inputs(1, 2, 2, 16, 16, 32, 32, torch.float32)
    o, lse, _ = _run(q, k, v, path="prefill", **kw)
    assert torch.isneginf(lse[..., 1::2]).all() and torch.isfinite(lse[..., 0::2]).all()
    _check(o, lse, q, k, v, **kw)


def test_blhd_views_are_read_in_place():
    """(B, L, H, D)-stored inputs passed as transpose(1, 2) views give the same
    bits as contiguous copies (all strides reach the kernel, nothing is copied)."""
    kw = dict(window_size=19, chunk_size=4)
    q, k, v = _inputs(2, 4, 2, 37, 52, 32, 64, torch.float16, blhd=True)
    assert not q.is_contiguous() and not k.is_contiguous()
    o, lse = sliding_window_attention(q, k, v, **kw)
    o_c, l_c = sliding_window_attention(q.contiguous(), k.contiguous(), v.contiguous(), **kw)
    assert torch.equal(o, o_c) and torch.equal(lse, l_c)
    assert o.is_contiguous()
    _check(o, lse, q, k, v, **kw)


@pytest.mark.parametrize("num_splits", [1, 2, 5, 64])
def test_splitkv_any_split_count(num_splits):
    kw = dict(window_size=70, chunk_size=16, kv_start=11)
    q, k, v = _inputs(1, 2, 1, 2, 140, 32, 32, torch.float32)
    o, lse, _ = _run(q, k, v, path="splitkv", num_splits=num_splits, **kw)
    _check(o, lse, q, k, v, **kw)


@pytest.mark.parametrize("table", ["SPLIT", "SPLIT_NARROW"])
def test_split_tiles_of_both_tables(table):
    """The 16-bit D <= 64 split tiles of both tables (a small grid takes the narrow
    one by itself: every small CPU case would otherwise skip the wide one), GQA
    with packed rows, NaN-poisoned outputs."""
    kw = dict(window_size=150, chunk_size=32, kv_start=7)
    q, k, v = _inputs(1, 4, 2, 3, 300, 64, 64, torch.float16)
    o, lse, taken = _run(q, k, v, path="splitkv", config=getattr(L, table)[("16", 64)], **kw)
    assert taken == "splitkv"
    _check(o, lse, q, k, v, **kw)


def test_split_scratch_grows_and_serves_cached_plans(monkeypatch):
    """Split-KV partials live in the thread's and stream's cached scratch (reference.device.scratch).
    A later, larger call grows it; the first problem's cached plan must then be served
    from the new buffer (results stay right; the old buffer is not kept alive)."""
    import weakref

    from reference import device as D
    monkeypatch.setattr(D, "_SCRATCH", {})  # earlier tests in this worker may have grown it
    monkeypatch.setattr(L, "_PLANS", {})
    kw = dict(window_size=100, chunk_size=8)
    small = _inputs(1, 2, 1, 1, 200, 32, 32, torch.float32)
    big = _inputs(2, 4, 2, 64, 200, 32, 32, torch.float32)
    o1, l1, _ = _run(*small, path="splitkv", num_splits=4, **kw)
    (entry,) = D._SCRATCH.values()  # one device, one stream
    before = weakref.ref(entry[0])
    del entry
    o2, l2, _ = _run(*big, path="splitkv", num_splits=8, **kw)  # 5 splits x 512 rows x 33 floats > 2**16
    (entry,) = D._SCRATCH.values()
    assert entry[0] is not before(), "the case must grow the scratch"
    assert before() is None, "nothing may keep the outgrown buffer alive"
    o3, l3, _ = _run(*small, path="splitkv", num_splits=4, **kw)
    assert torch.equal(o1, o3) and torch.equal(l1, l3)
    assert len(entry[1]) == 2 and all(t._base is entry[0] for views in entry[1].values() for t in views)
    _check(o2, l2, *big, **kw)


def test_split_calls_of_two_threads_on_one_stream_do_not_share_scratch(monkeypatch):
    """Two host threads may launch onto one stream (the default stream, say) and interleave
    their calls, since a launch releases the GIL: A's split, then B's whole call, then A's
    combine. Forced here by running B's call in a second thread from A's combine launch;
    A's combine must still read A's partials (reference.device.scratch: a buffer per thread
    and stream)."""
    import threading

    kw = dict(window_size=100, chunk_size=8)
    a = _inputs(1, 2, 1, 1, 200, 32, 32, torch.float32)
    b = _inputs(1, 2, 1, 1, 200, 32, 32, torch.float32)  # same shapes: the same scratch views
    want_a, _, _ = _run(*a, path="splitkv", num_splits=4, **kw)
    want_b, _, _ = _run(*b, path="splitkv", num_splits=4, **kw)
    real, fired, got_b = L._COMBINE, [], []

    def combine_after_b(*args, **kwargs):
        if not fired:  # A's combine (B's own combine, inside, passes straight through)
            fired.append(1)
            t = threading.Thread(target=lambda: got_b.append(_run(*b, path="splitkv", num_splits=4, **kw)[0]))
            t.start()
            t.join()
        return real(*args, **kwargs)

    monkeypatch.setattr(L, "_COMBINE", combine_after_b)
    got_a, _, _ = _run(*a, path="splitkv", num_splits=4, **kw)
    assert got_b, "the second thread's call did not run"
    assert torch.equal(got_a, want_a), "thread B's partials reached thread A's combine"
    assert torch.equal(got_b[0], want_b)


def test_split_call_reads_the_stream_once(monkeypatch):
    """A CUDA split-KV call reads its current stream once and hands the handle to its
    scratch and to both launches (each read it before); a call without a device (the
    interpreter's) reads none and lets each launch read its own. The launches and the
    scratch are stood in: only the handle's path is checked here."""
    kw = dict(window_size=100, chunk_size=8)
    q, k, v = _inputs(1, 2, 1, 1, 200, 32, 32, torch.float32)
    p = reference.check_inputs(q, k, v, **kw)
    o, lse = p.new_outputs(poison=True)
    plan = L._plan(p, "splitkv", None, 4)
    assert plan.path == "splitkv" and plan.scratch_shapes
    reads, seen = [], []
    monkeypatch.setattr(L, "_stream", lambda dev: reads.append(dev) or 0x5EED)
    monkeypatch.setattr(L, "scratch", lambda device, shapes, stream=None: (
        seen.append(("scratch", stream)), tuple(torch.empty(sh) for sh in shapes))[1])
    for name in ("_SPLIT", "_COMBINE"):
        monkeypatch.setattr(L, name, lambda *a, _n=name, dev=None, stream=None: seen.append((_n, stream)))
    for dev, want in ((0, 0x5EED), (None, None)):
        reads.clear(), seen.clear()
        assert L._run(plan, p, q, k, v, o, lse, None, dev) == "splitkv"
        assert reads == ([dev] if dev is not None else [])
        assert seen == [("scratch", want), ("_SPLIT", want), ("_COMBINE", want)]
    monkeypatch.setattr(L, "PASS_STREAM", False)  # the lab's "each reads it" variant
    reads.clear(), seen.clear()
    L._run(plan, p, q, k, v, o, lse, None, 0)
    assert reads == [] and seen == [("scratch", None), ("_SPLIT", None), ("_COMBINE", None)]


def test_raw_launch_takes_the_stream_given(monkeypatch):
    """The raw C launch gets the handle it is given, or reads the current stream."""
    got = []
    ck = type("CK", (), dict(function=7, packed_metadata="meta"))()
    raw = L._RawLaunch(lambda *a: got.append(a[3]), ck, False, True)
    monkeypatch.setattr(L, "_stream", lambda dev: 0xD0 + dev)
    raw.launch((2,), (), 1, 0x5EED)
    raw.launch((2,), (), 1)
    raw.launch((2,), (), 1, 0)  # the default stream's handle is 0: given, not read
    assert got == [0x5EED, 0xD1, 0]


@pytest.mark.parametrize("path", ["prefill", "splitkv"])
@pytest.mark.parametrize("sm_scale", [None, 0.37, 0.0, -0.2, 1e-39])
def test_fold_scale(path, sm_scale):
    """The scale folded into the exponent (kernels._softmax_p, FOLD, forced with
    the private knob) matches the reference for every scale; the launcher runs
    it only for a positive normal float32 qk_scale (0, negative, subnormal and
    overflowing scales multiply first). NaN in every slot no query sees."""
    assert L._fold_ok(2.0 ** -126) and not L._fold_ok(2.0 ** -127) and not L._fold_ok(-0.0)
    assert L._fold_ok(3.4e38) and not L._fold_ok(3.5e38) and not L._fold_ok(float("nan"))
    kw = dict(window_size=37, chunk_size=16, kv_start=5, sm_scale=sm_scale)
    Lq = 3 if path == "splitkv" else 70
    q, k, v = _inputs(1, 2, 1, Lq, 120, 32, 32, torch.float16)
    k2, v2 = k.clone(), v.clone()
    poison_unseen(k2, v2, Lq, kw)
    o, lse, _ = _run(q, k2, v2, path=path, fold=True, **kw)
    _check(o, lse, q, k, v, **kw)
    qk = reference.check_inputs(q, k, v, **kw).sm_scale * L.LOG2E
    assert L._fold_ok(qk) == (sm_scale is None or sm_scale == 0.37)


def test_growing_lk_reuses_one_plan(monkeypatch):
    """A decode loop's Lk grows by one a step: past W + C + Lq the launch plan no
    longer depends on Lk, so the steps share one plan (and stay right); the plan
    cache is bounded (cleared when PLANS_MAX plans are held)."""
    monkeypatch.setattr(L, "_PLANS", {})
    kw = dict(window_size=30, chunk_size=8, kv_start=5)
    q, k, v = _inputs(1, 2, 1, 1, 60, 32, 32, torch.float16)
    for lk in range(40, 60):
        o, lse, taken = _run(q, k[:, :, :lk], v[:, :, :lk], path="splitkv", **kw)
        _check(o, lse, q, k[:, :, :lk], v[:, :, :lk], **kw)
    # W + C + Lq = 39: every Lk from 40 to 59 maps to one plan; Lk = 20 gets its own.
    assert len(L._PLANS) == 1
    _run(q, k[:, :, :20], v[:, :, :20], path="splitkv", **kw)
    assert len(L._PLANS) == 2
    monkeypatch.setattr(L, "PLANS_MAX", 2)
    _run(q, k[:, :, :21], v[:, :, :21], path="splitkv", **kw)
    assert len(L._PLANS) == 1


def test_public_function_defaults_and_path_choice():
    """The public function with default flags; auto path on a decode shape is split-KV."""
    q, k, v = _inputs(1, 4, 4, 1, 300, 32, 32, torch.float32)
    o, lse = sliding_window_attention(q, k, v, window_size=100, chunk_size=32)
    _check(o, lse, q, k, v, window_size=100, chunk_size=32)
    assert L.choose_path(reference.check_inputs(q, k, v, window_size=100, chunk_size=32)) == "splitkv"


def test_choose_path_by_saturation(monkeypatch):
    monkeypatch.setattr(L, "sm_count", lambda device: 132)

    def problem(B, Hq, Hkv, Lq, Lk, D=128):
        q = torch.empty((B, Hq, Lq, D), dtype=torch.bfloat16, device="meta")
        k = torch.empty((B, Hkv, Lk, D), dtype=torch.bfloat16, device="meta")
        return reference.check_inputs(q, k, k, window_size=512, chunk_size=64)

    assert L.choose_path(problem(1, 32, 32, 1, 8192)) == "splitkv"  # decode
    assert L.choose_path(problem(8, 32, 4, 1, 32768, 64)) == "splitkv"  # batched GQA decode
    assert L.choose_path(problem(1, 32, 32, 512, 8192)) == "prefill"  # chunked prefill fills the GPU
    assert L.choose_path(problem(1, 32, 32, 8192, 8192)) == "prefill"
    assert L.choose_path(problem(1, 32, 4, 8192, 8192, 64)) == "prefill"  # GQA prefill (packed lost on the H200)
    # Same Lq, different saturation: the choice follows the grid, not Lq.
    assert L.choose_path(problem(1, 2, 2, 64, 8192)) == "splitkv"
    assert L.choose_path(problem(64, 2, 2, 64, 8192)) == "prefill"


def test_split_plan_by_saturation(monkeypatch):
    """The split count aims at SPLIT_TARGET programs per SM, capped by the key blocks;
    grids that the table's key block leaves under one program per SM even so take
    SPLIT_NARROW's 32-key blocks (16-bit D <= 64); explicit configs are kept."""
    monkeypatch.setattr(L, "sm_count", lambda device: 132)

    def plan(B, Hq, Hkv, D, config=None, dtype=torch.bfloat16):
        q = torch.empty((B, Hq, 1, D), dtype=dtype, device="meta")
        k = torch.empty((B, Hkv, 8192, D), dtype=dtype, device="meta")
        p = reference.check_inputs(q, k, k, window_size=512, chunk_size=64)
        return L._make_plan(p, "splitkv", config, None, None)

    mha = plan(1, 32, 32, 128)  # 32 tiles: S = 4 * 132 / 32 -> 17, capped at 10 blocks of 64
    assert (mha.block_n, mha.grid[2]) == (64, 10)
    gqa1 = plan(1, 32, 4, 64)  # 4 tiles x 6 blocks of 128 = 24 programs < 132: 32-key blocks
    assert (gqa1.block_n, gqa1.grid[2]) == (L.SPLIT_NARROW[("16", 64)].block_n, 19)
    assert (gqa1.num_warps, gqa1.num_stages) == (4, 3)
    gqa8 = plan(8, 32, 4, 64)  # 32 tiles x 6 blocks = 192 programs: the table's block
    assert (gqa8.block_n, gqa8.grid[2]) == (128, 6)
    own = plan(1, 32, 4, 64, L.Config(64, 128, 4, 2))
    assert own.block_n == 128
    assert plan(1, 32, 4, 64, dtype=torch.float32).block_n == L.SPLIT[("32", 64)].block_n


def test_describe_call_names_the_path_launch_takes(monkeypatch):
    """describe_call (planning only) names the path, tile and split count the call runs:
    its first word is what launch returns, its tile the plan's; the TMA-forced module
    says so or refuses as its call does."""
    from triton_impl import tma_prefill

    kw = dict(window_size=64, chunk_size=16)
    for B, Hq, Hkv, Lq, Lk, D in ((1, 4, 4, 1, 300, 64), (1, 8, 1, 1, 300, 32), (1, 2, 2, 200, 200, 64)):
        q, k, v = _inputs(B, Hq, Hkv, Lq, Lk, D, D, torch.float16)
        text = triton_impl.describe_call(q, k, v, **kw)
        _, _, taken = _run(q, k, v, **kw)
        assert text.split()[0] == taken, (text, taken)
        plan = L._plan(reference.check_inputs(q, k, v, **kw))
        cx = plan.constexprs[(False, False)]
        assert f" {cx['BLOCK_M']}x{cx['BLOCK_N']} w{plan.num_warps} s{plan.num_stages}" in text
        assert ("phases" in text) == (taken == "prefill" and cx["PHASES"]), (text, taken)
        if taken == "splitkv":
            assert f"S={plan.grid[2]} +combine" in text
    assert triton_impl.describe_call(q[:, :, :0], k, v, **kw) == "no kernel (empty output)"
    # the TMA-forced module: fp16 runs the TMA kernel (under the interpreter too) ...
    text = tma_prefill.describe_call(q, k, v, **kw)
    assert text == "prefill_tma 64x64 w4 s2 r128 phases", text
    assert _run(q, k, v, path="prefill", tma="v_ptr", **kw)[2] == "prefill_tma"
    if DEV == "cpu":  # ... bf16 CPU tensors are refused, by describe_call as by the call itself
        qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
        with pytest.raises(UnsupportedConfig, match="TMA"):
            tma_prefill.describe_call(qb, kb, vb, **kw)
        with pytest.raises(UnsupportedConfig, match="TMA"):
            tma_prefill.sliding_window_attention(qb, kb, vb, **kw)


def test_empty_dimensions():
    for shape_q, shape_k in [((0, 2, 4, 32), (0, 2, 8, 32)), ((1, 2, 0, 32), (1, 2, 8, 32)),
                             ((1, 0, 4, 32), (1, 0, 8, 32)), ((1, 2, 0, 32), (1, 2, 0, 32))]:
        q = torch.randn(shape_q, device=DEV)
        k = torch.randn(shape_k, device=DEV)
        o, lse = sliding_window_attention(q, k, k, window_size=4, chunk_size=2)
        assert o.shape == shape_q[:3] + (32,) and lse.shape == shape_q[:3]


def test_invalid_input_raises_before_any_kernel(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched")

    monkeypatch.setattr(L, "launch", boom)
    q = torch.randn(1, 3, 4, 32, device=DEV)
    k = torch.randn(1, 2, 4, 32, device=DEV)
    with pytest.raises(ValueError, match="Hq % Hkv"):
        sliding_window_attention(q, k, k, window_size=4, chunk_size=2)
    with pytest.raises(ValueError, match="window_size"):
        sliding_window_attention(k, k, k, window_size=0, chunk_size=2)
    with pytest.raises(ValueError, match="Lq"):
        sliding_window_attention(torch.randn(1, 2, 8, 32, device=DEV), k, k, window_size=4, chunk_size=2)


@pytest.mark.parametrize("sm_scale", [2.4e38, -1e300])
def test_score_scale_past_float32_is_unsupported(sm_scale, monkeypatch):
    """sm_scale * log2(e) is the kernels' float32 score scale: past float32 it is a
    clear error before any kernel runs (it was NaN in o), not a wrong answer."""
    monkeypatch.setattr(L, "launch", lambda *a, **k: pytest.fail("a kernel ran"))
    q = torch.randn(1, 1, 4, 32, device=DEV)
    with pytest.raises(UnsupportedConfig, match="sm_scale"):
        sliding_window_attention(q, q, q, window_size=4, chunk_size=2, sm_scale=sm_scale)
    assert L.LOG2E * 2.3586e38 < 3.4028234663852886e38  # the message's bound is inside float32


@pytest.mark.parametrize("dqk,dv", [(16, 16), (512, 512), (64, 288)])
def test_head_dim_out_of_range_is_unsupported(dqk, dv):
    q = torch.randn(1, 1, 4, dqk, device=DEV)
    v = torch.randn(1, 1, 4, dv, device=DEV)
    with pytest.raises(UnsupportedConfig, match="head dim"):
        sliding_window_attention(q, q, v, window_size=4, chunk_size=2)


def test_cpu_without_interpreter_is_unsupported(monkeypatch):
    monkeypatch.setattr(L, "_INTERPRETED", False)
    q = torch.randn(1, 1, 4, 32)
    with pytest.raises(UnsupportedConfig, match="TRITON_INTERPRET=1"):
        sliding_window_attention(q, q, q, window_size=4, chunk_size=2)
    assert issubclass(UnsupportedConfig, NotImplementedError) and _api.UnsupportedConfig is UnsupportedConfig


@pytest.mark.parametrize("kv_start,window_size,chunk_size", [
    (2 ** 31 - 10, 16, 8),          # q_off = kv_start + Lk - Lq crosses 2**31
    (2 ** 31 + 5, 16, 8),
    (2 ** 40 + 3, 40, 64),
    (7, 2 ** 31, 8),                # huge window: every key left of the query
    (2 ** 31 - 10, 2 ** 62, 3),
    (2 ** 31 - 10, 16, 2 ** 31 - 3),  # huge chunk: residue near 2**31
    (5, 20, 2 ** 33),
    (5, 10, 2 ** 63),               # chunk longer than every position: no landmark, edges floor to 0
    (5, 10, 2 ** 63 - 1),
    (2 ** 62 + 9, 30, 2 ** 61 + 3),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_positions_past_int32(kv_start, window_size, chunk_size, dtype):
    """The kernels get kv_start mod chunk_size and a window clamped to Lk + C
    (same visibility); positions that would still pass int32 go int64. fp16
    takes the one-landmark test (LMK_ONE), fp32 the modulo test."""
    q, k, v = _inputs(1, 2, 1, 50, 64, 32, 32, dtype)
    for mask_lmk, expand in ((True, True), (False, False)):
        kw = dict(window_size=window_size, chunk_size=chunk_size, kv_start=kv_start,
                  mask_lmk=mask_lmk, expand_to_chunk=expand)
        for path in ("prefill", "splitkv"):
            o, lse, _ = _run(q, k, v, path=path, **kw)
            _check(o, lse, q, k, v, **kw)


@pytest.mark.parametrize("path", ["prefill", "splitkv"])
def test_landmark_column_with_chunk_past_2_32(path):
    """The one-landmark test's column ``C - 1 - phase`` is near ``C`` in the
    blocks after a landmark; with a frame ``C`` past 2**32 an unclamped int32
    cast wrapped it into the block and hid a visible key (review of 841e9f7).
    C = 2**32 + 100, kv_start = C - 5: the only landmark is key 4, keys 64..199
    sit in later blocks. NaN in the landmark slot."""
    C = 2 ** 32 + 100
    kw = dict(window_size=300, chunk_size=C, kv_start=C - 5)
    q, k, v = _inputs(1, 2, 1, 64 if path == "prefill" else 2, 200, 32, 32, torch.float16)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 4], v2[:, :, 4] = float("nan"), float("nan")
    o, lse, _ = _run(q, k2, v2, path=path, **kw)
    _check(o, lse, q, k, v, **kw)


@pytest.mark.parametrize("path", ["prefill", "splitkv"])
def test_positions_past_int64_are_served(path):
    """kv_start and chunk_size both near 2**63, the chunk's boundary inside the cache
    (key 50; its landmark, key 49, holds NaN): the unshifted kernel frame's positions
    would pass int64, so the kernels get ``kernel_frame(True)`` (that boundary in a
    chunk of Lk + 1). Window 14: on both paths the last query row's edge floors to the
    boundary, the others cross it (every key from 0, the landmark masked). Until
    session 30 this raised UnsupportedConfig."""
    kw = dict(window_size=14, chunk_size=2 ** 63 + 100, kv_start=2 ** 63 + 50)
    q, k, v = _inputs(1, 2, 1, 4 if path == "prefill" else 2, 64, 32, 32, torch.float16)
    p = reference.check_inputs(q, k, v, **kw)
    r, w, c = p.kernel_frame()
    assert r + p.Lk + w + 2 * c >= 2 ** 63 and L._frame(p) == p.kernel_frame(True) == (15, 14, 65)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 49], v2[:, :, 49] = float("nan"), float("nan")
    o, lse, taken = _run(q, k2, v2, path=path, **kw)
    assert taken.startswith(path)  # prefill_tma where a GPU's TMA gate takes it
    _check(o, lse, q, k, v, **kw)


def test_tma_stride_rules():
    """Which inputs the TMA prefill kernel may read: innermost stride 1, other
    strides positive multiples of 16 bytes, 16-byte aligned base; the rest
    takes the pointer kernel (or UnsupportedConfig when TMA is forced)."""
    x = torch.randn(2, 3, 40, 64, dtype=torch.bfloat16)
    assert L._tma_strides_ok(x)
    assert L._tma_strides_ok(torch.randn(2, 40, 3, 64, dtype=torch.bfloat16).transpose(1, 2))  # BLHD view
    assert not L._tma_strides_ok(torch.randn(2 * 3 * 40 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 3, 40, 64))
    assert not L._tma_strides_ok(torch.randn(2, 3, 40, 4, dtype=torch.bfloat16))  # 8-byte rows
    assert not L._tma_strides_ok(x[:, :1].expand(2, 3, 40, 64))  # broadcast head: stride 0
    assert not L._tma_strides_ok(x.transpose(2, 3))  # innermost stride not 1
    # a size-1 dimension may carry any stride; one of 2**40 bytes or more cannot be encoded
    assert not L._tma_strides_ok(x[:1].as_strided((1, 3, 40, 64), (1 << 39, 2560, 64, 1)))
    assert L._tma_strides_ok(x[:1].as_strided((1, 3, 40, 64), (1 << 35, 2560, 64, 1)))
    # forced where the copy engine cannot read the call -> refused, on CPU (interpreter) and GPU
    y = torch.randn(2, 3, 64, 40, dtype=torch.float16, device=DEV).transpose(2, 3)  # innermost stride 40
    with pytest.raises(UnsupportedConfig, match="TMA prefill kernel needs"):
        sliding_window_attention(y, y, y, window_size=8, chunk_size=4, _force_path="prefill", _tma="v_ptr")
    if DEV == "cpu":  # under the interpreter the TMA kernel runs fp16 only: bf16 forced -> refused
        with pytest.raises(UnsupportedConfig, match="TMA prefill kernel runs fp16 only"):
            sliding_window_attention(x, x, x, window_size=8, chunk_size=4, _force_path="prefill", _tma="v_ptr")
    # the launch path's own check (launch._tma_operands): the same rules on q, k, v at once
    from types import SimpleNamespace
    plan = SimpleNamespace(tma=object())
    ops = L._tma_operands(plan, None, x, x, x)
    assert ops == ((x.data_ptr(), x.stride()),) * 3
    shifted = torch.randn(2 * 3 * 40 * 64 + 8, dtype=torch.bfloat16)[8:].view(2, 3, 40, 64)  # 16-byte base
    assert L._tma_operands(plan, None, x, shifted, x) is not None
    odd = torch.randn(2 * 3 * 40 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 3, 40, 64)  # 2-byte base
    assert L._tma_operands(plan, None, x, odd, x) is None and L._tma_operands(plan, None, x, x, odd) is None
    assert L._tma_operands(plan, None, x, x, x[:, :1].expand(2, 3, 40, 64)) is None
    with pytest.raises(UnsupportedConfig, match="TMA prefill kernel needs"):
        L._tma_operands(plan, "v_ptr", odd, x, x)
    assert L._tma_operands(SimpleNamespace(tma=None), None, x, x, x) is None
    with pytest.raises(ValueError, match="prefill path"):  # a TMA mode on another path is a mistake
        sliding_window_attention(x.to(DEV), x.to(DEV), x.to(DEV), window_size=8, chunk_size=4,
                                 _force_path="splitkv", _tma="v_ptr")


# (B, Hq, Hkv, Lq, Lk, Dqk, Dv, W, C, extra kwargs): GQA with Lq < Lk, with kv_start and with
# each tile's first position 2 keys before a block boundary and no landmark mask (an interior
# range one key too long then takes the key after it unmasked); a
# padded head dim (96 -> 128-wide boxes); Dqk != Dv with positions past 10^6; every key a
# landmark (empty rows); no landmark mask, no chunk expansion, negative scale.
TMA_CASES = [(1, 2, 1, 150, 300, 64, 64, 50, 16, dict(kv_start=7)),
             (1, 2, 1, 142, 300, 64, 64, 50, 16, dict(mask_lmk=False)),
             (1, 2, 2, 130, 130, 96, 96, 40, 64, {}),
             (2, 4, 2, 77, 77, 128, 64, 33, 64, dict(kv_start=10 ** 6 + 5)),
             (1, 2, 2, 60, 60, 32, 32, 1, 1, {}),
             (1, 2, 1, 64, 64, 64, 64, 300, 50, dict(mask_lmk=False, expand_to_chunk=False, sm_scale=-0.3))]


@pytest.mark.parametrize("kernel", ["pointer", "tma-v_ptr", "tma-v_tma"])
@pytest.mark.parametrize("phases", [False, True], ids=["one-loop", "phases"])
def test_prefill_loop_forms(phases, kernel):
    """Both loop forms of both prefill kernels (``PHASES``: the edge blocks first, then
    the blocks inside every row's window without the window test), the TMA kernel with
    V by pointers and by TMA (forced: fp16 under the interpreter, ``launch._tma_choice``),
    two tiles, against float64 golden; NaN in every slot no query sees changes nothing
    (bitwise)."""
    tma = False if kernel == "pointer" else kernel[4:]
    for B, Hq, Hkv, Lq, Lk, Dqk, Dv, W, C, extra in TMA_CASES:
        kw = dict(window_size=W, chunk_size=C, **extra)
        q, k, v = _inputs(B, Hq, Hkv, Lq, Lk, Dqk, Dv, torch.float16)
        k2, v2 = k.clone(), v.clone()
        poison_unseen(k2, v2, Lq, kw)
        for cfg in (L.Config(32, 16, 4, 2), L.Config(16, 32, 4, 2)):
            p = reference.check_inputs(q, k, v, **kw)
            outs = []
            for kk, vv in ((k, v), (k2, v2)):
                o, lse = p.new_outputs(poison=True)
                taken = L.launch(p, q, kk, vv, o, lse, path="prefill", tma=tma, phases=phases, config=cfg)
                assert taken == ("prefill" if kernel == "pointer" else "prefill_tma")
                outs.append((o, lse))
            _check(*outs[0], q, k, v, **kw)
            assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


# V_CHUNK (launch._v_chunk_desc): (Lq, Lk, D, W, C, extra, tile, takes the view[, layout]).
# The view serves calls whose chunk is a multiple of the tile's key block, whose first
# seen key starts a chunk and which hold a whole chunk from there; the others run the
# pointer-v kernel. Chunks of 48 (not a power of two), inside blocks past the last whole
# chunk moved to the edge loop (cases 2 and 11), a kernel frame whose kv_start is not a
# multiple of C (case 12, BLHD), kv_start on and off a chunk boundary, GQA, chunked prefill.
V_CHUNK_CASES = [
    (300, 300, 64, 120, 32, {}, L.Config(32, 16, 4, 2), True),
    (300, 300, 64, 120, 48, dict(kv_start=96), L.Config(32, 16, 4, 2), True),
    (260, 330, 64, 150, 128, dict(kv_start=128), L.Config(16, 32, 4, 2), True),
    (200, 200, 128, 90, 64, dict(kv_start=64 * 10 ** 6), L.Config(32, 32, 4, 2), True),  # frame: kv_start 0
    (300, 300, 64, 120, 32, dict(kv_start=5), L.Config(32, 16, 4, 2), False),  # key 0 inside a chunk
    (300, 300, 64, 120, 24, {}, L.Config(32, 16, 4, 2), False),  # chunk not a multiple of 16
    (300, 300, 64, 121, 32, dict(expand_to_chunk=False), L.Config(32, 16, 4, 2), True),  # j_min 0
    (100, 300, 64, 70, 32, dict(expand_to_chunk=False), L.Config(32, 16, 4, 2), False),  # j_min 131
    (100, 300, 64, 41, 32, dict(expand_to_chunk=False), L.Config(32, 16, 4, 2), True),  # j_min 160
    (300, 300, 64, 120, 32, dict(mask_lmk=False), L.Config(32, 16, 4, 2), False),  # no landmark: no view
    (40, 300, 64, 400, 512, {}, L.Config(32, 16, 4, 2), False),  # no whole chunk in the key range
    (360, 360, 64, 120, 64, dict(kv_start=128), L.Config(32, 16, 4, 2), True),  # 40-key tail: capped
    (100, 300, 64, 41, 64, dict(kv_start=32), L.Config(32, 16, 4, 2), True, True),  # j_min 160, r 32
]


@pytest.mark.parametrize("case", range(len(V_CHUNK_CASES)))
def test_tma_v_chunk_view(case):
    """The TMA kernel's inside blocks with ``v`` through the chunked view (``V_CHUNK``,
    forced by ``tma="v_chunk"``; shipped at D <= 64 and D = 128, ``launch.TMA_V_CHUNK``), fp16 under
    the interpreter: taken exactly where the view serves the call (``describe``), against
    float64 golden, outputs poisoned first; NaN in every slot no query sees (landmarks
    among them, which only the copy engine's zero fill keeps out of ``P @ V``) changes
    nothing; bit-identical to the pointer-v kernel when no block moves from the inside
    loop to the edge loop (the view then ends at ``Lk``); the view with the landmark row
    inside it is caught."""
    Lq, Lk, D, W, C, extra, cfg, takes, *blhd = V_CHUNK_CASES[case]
    kw = dict(window_size=W, chunk_size=C, **extra)
    q, k, v = _inputs(1, 2, 1, Lq, Lk, D, D, torch.float16, bool(blhd))
    k2, v2 = k.clone(), v.clone()
    poison_unseen(k2, v2, Lq, kw)
    p = reference.check_inputs(q, k, v, **kw)
    j_min = reference.visible_key_range(0, Lq, Lq=Lq, Lk=Lk, window_size=W, chunk_size=C,
                                        expand_to_chunk=kw.get("expand_to_chunk", True),
                                        kv_start=kw.get("kv_start", 0))[0]
    predicted = (kw.get("mask_lmk", True) and C % cfg.block_n == 0
                 and (kw.get("kv_start", 0) + j_min) % C == 0 and Lk - j_min >= C)
    assert predicted == takes, (j_min, predicted)
    text = L.describe(p, q, k, v, path="prefill", tma="v_chunk", config=cfg)
    assert ("v-chunk" in text) == takes, text
    outs = {}
    for mode in ("v_ptr", "v_chunk"):
        for kk, vv, tag in ((k, v, ""), (k2, v2, "-nan")):
            o, lse = p.new_outputs(poison=True)
            assert L.launch(p, q, kk, vv, o, lse, path="prefill", tma=mode, config=cfg) == "prefill_tma"
            outs[mode + tag] = (o, lse)
    _check(*outs["v_chunk"], q, k, v, **kw)
    for a, b in (("v_chunk", "v_chunk-nan"), ("v_ptr", "v_ptr-nan")):
        assert torch.equal(outs[a][0], outs[b][0]) and torch.equal(outs[a][1], outs[b][1]), (a, b)
    if not takes or (Lk - j_min) % C == 0:
        assert torch.equal(outs["v_chunk"][0], outs["v_ptr"][0])
        assert torch.equal(outs["v_chunk"][1], outs["v_ptr"][1])
    if takes and kw.get("mask_lmk", True):  # the landmark row inside the view: NaN reaches o
        real = L._v_chunk_desc

        def with_landmark(*a):
            ptr, shape, strides = real(*a)
            return ptr, (*shape[:3], shape[3] + 1, shape[4]), strides
        L._v_chunk_desc = with_landmark
        try:
            o, lse = p.new_outputs(poison=True)
            L.launch(p, q, k2, v2, o, lse, path="prefill", tma="v_chunk", config=cfg)
        finally:
            L._v_chunk_desc = real
        assert torch.isnan(o).any()


# The chunked view's variants (launch._vchunk_variant): (B, Lq, Lk, D, W, C, extra, tile, what the
# call runs, layout BLHD), B first. With C == BLOCK_N (16 here) every key block is one chunk, its
# landmark the last column (last-col); where moreover expand_to_chunk holds and Lq, Lk, the
# frame's kv_start and the row tile are whole chunks, the edge blocks read v through the view
# too (edge-view). Otherwise the view kernel as before (plain). D = 128 runs the kernel with
# its edge loop two deep (launch.TMA_V_CHUNK_EDGE_STAGES), as shipped; B = 2 and a kernel frame
# moved past 2**31 (kv_start near 2**31: the int64 form of the kernel) among them.
LAST_COL_CASES = [
    (1, 192, 192, 64, 60, 16, {}, L.Config(32, 16, 4, 2), "edge-view"),
    (1, 192, 192, 64, 60, 16, {}, L.Config(32, 16, 4, 2), "edge-view", True),
    (1, 96, 192, 64, 50, 16, dict(kv_start=80), L.Config(32, 16, 4, 2), "edge-view"),
    (1, 128, 128, 128, 60, 16, {}, L.Config(32, 16, 4, 2), "edge-view"),
    (2, 96, 192, 64, 50, 16, dict(kv_start=2 ** 31 - 64), L.Config(32, 16, 4, 2), "edge-view"),
    (1, 180, 192, 64, 60, 16, {}, L.Config(32, 16, 4, 2), "last-col"),  # Lq a partial chunk
    (1, 192, 202, 64, 60, 16, {}, L.Config(32, 16, 4, 2), "last-col"),  # Lk a partial chunk: tail edge
    (1, 150, 202, 128, 60, 16, {}, L.Config(32, 16, 4, 2), "last-col"),
    (1, 64, 192, 64, 60, 16, dict(kv_start=8), L.Config(32, 16, 4, 2), "last-col"),  # kv_start mid-chunk
    (1, 192, 192, 64, 73, 16, dict(expand_to_chunk=False), L.Config(32, 16, 4, 2), "last-col"),
    (1, 128, 128, 64, 60, 32, {}, L.Config(16, 32, 4, 2), "last-col"),  # row tile of half a chunk
    (1, 192, 192, 64, 60, 32, {}, L.Config(32, 16, 4, 2), "plain"),  # two key blocks a chunk
    (1, 192, 192, 64, 60, 16, dict(sm_scale=-0.3), L.Config(32, 16, 4, 2), "edge-view"),  # no FOLD
]


@pytest.mark.parametrize("case", range(len(LAST_COL_CASES)))
def test_tma_view_last_column_and_edge_view(case, monkeypatch):
    """The chunked view's last-column and edge-view variants (``launch._vchunk_variant``:
    ``kernels._not_lmk`` ``LMK_ONE == 2``, ``EDGE_VIEW``; shipped in session 37 where
    ``launch.TMA_LAST_COL`` / ``TMA_EDGE_VIEW`` say so), fp16 under the interpreter: taken
    exactly where the rule says (``describe``), outputs poisoned first, against float64
    golden, unchanged by NaN in every slot no query sees, and the same as the pointer-v kernel
    with the variant's ``FOLD`` (``launch.TMA_VIEW_FOLD``, session 38: at D = 64 for a
    positive scale, ``describe`` says ``fold``) (bit-identical under the interpreter; on the
    GPU, where the variants compile to another instruction order, within rounding: session 38
    on an H100 saw at most one ulp of ``o`` and 4.8e-7 of ``lse``), on those inputs and on inputs with NaN in the ``v``
    of every key that some query sees but no row of the first (or the last) row tile does (a
    key the edge view must not load for that tile; NaN then lands where the pointer-v kernel
    puts it). Controls: the variant forced where its premise fails (the edge view on calls
    that are not whole chunks, the last column with two key blocks a chunk) gives another
    result on one of those inputs (with the shipped variant's ``FOLD``, so that only the premise
    differs)."""
    B, Lq, Lk, D, W, C, extra, cfg, want, *blhd = LAST_COL_CASES[case]
    assert all(L.TMA_LAST_COL.get(("16", d)) and L.TMA_EDGE_VIEW.get(("16", d)) for d in (64, 128))
    kw = dict(window_size=W, chunk_size=C, **extra)
    q, k, v = _inputs(B, 2, 1, Lq, Lk, D, D, torch.float16, bool(blhd))
    k2, v2 = k.clone(), v.clone()
    poison_unseen(k2, v2, Lq, kw)
    p = reference.check_inputs(q, k, v, **kw)
    text = L.describe(p, q, k, v, path="prefill", tma="v_chunk", config=cfg)
    assert text.endswith({"plain": " phases v-chunk"}.get(want, f" phases {want} v-chunk")), text
    mask = reference.visibility_mask(Lq, Lk, **reference.mask.rule_kwargs(kw))
    tiles = []
    for rows in (slice(0, cfg.block_m), slice((Lq - 1) // cfg.block_m * cfg.block_m, Lq)):
        tiles.append(v.clone())  # NaN in what others see, the first / last row tile not
        tiles[-1][:, :, mask.any(0) & ~mask[rows].any(0)] = float("nan")

    # FOLD (the scale in the exponent) where launch.TMA_VIEW_FOLD ships it and the scale allows
    folds = (want != "plain" and L.TMA_VIEW_FOLD.get(("16", D), False) and kw.get("sm_scale", 1.0) > 0)
    assert (" fold " in text) == folds, text

    def run(vv, mode="v_chunk"):  # the pointer-v kernel with the variant's FOLD
        o, lse = p.new_outputs(poison=True)
        assert L.launch(p, q, k2, vv, o, lse, path="prefill", tma=mode, config=cfg,
                        fold=folds if mode == "v_ptr" else None) == "prefill_tma"
        return o, lse

    def same(a, b):
        if DEV == "cpu":
            return torch.equal(a[0].nan_to_num(7.0), b[0].nan_to_num(7.0)) and torch.equal(
                a[1].nan_to_num(7.0), b[1].nan_to_num(7.0))
        return _within_rounding(a, b)

    shipped = [run(vv) for vv in [v2] + tiles]
    _check(*shipped[0], q, k, v, **kw)  # NaN in every unseen slot of k2, v2: golden of k, v
    for vv, got in zip([v2] + tiles, shipped):
        assert same(got, run(vv, "v_ptr"))
    # the controls: the variant whose premise the call breaks, forced
    plan = L._plan(p, path="prefill", tma="v_chunk", config=cfg).tma.vchunk
    wrong = {"last-col": plan.edge_view, "plain": plan.last_col}.get(want)
    if wrong is not None:
        wrong = L._respun(wrong, wrong.path, folds)  # the shipped variant's FOLD: only the premise differs
        monkeypatch.setattr(L, "_vchunk_variant", lambda *a: wrong)
        moved = [not same(got, run(vv)) for vv, got in zip([v2] + tiles, shipped)]
        assert any(moved), (want, moved)


def test_triton_tma_backend_runs_the_shipped_v_mode():
    """``triton-tma`` (``triton_impl.tma_prefill``) runs the TMA kernel with ``v`` as the
    tables ship it: through the chunked view (``launch.TMA_V_CHUNK``: D = 64, and D = 128
    since session 28) where a call allows it; and the conformance suite's quick tier on the GPU
    has cases that take the view, some of them with NaN in every unseen slot, and among those
    cases that take each of session 37's variants, last column and edge view (on CPU, fp16
    under the interpreter, decided as on the GPU)."""
    from conformance import cases as CS
    from triton_impl import tma_prefill

    assert L.TMA_V_CHUNK == {("16", 64): True, ("16", 128): True}
    kw = dict(window_size=100, chunk_size=64)
    for d, view in ((64, True), (128, True)):
        x = torch.randn(1, 2, 300, d, dtype=torch.float16, device=DEV)
        assert tma_prefill.describe_call(x, x, x, **kw).endswith("v-chunk") == view
    taken = []
    for c in CS.generate("quick", "cuda"):
        # caches past 64K keys (`long`, `long4m`) are left out: their inputs cost most of this
        # test's time on the CPU (105 s on a cold CI run, 7 s without them; session 34) and plan as the
        # shorter ones do (the view's rule reads C, the flags and where the first window
        # starts, not how long the cache is)
        if c.error or c.dtype == "fp32" or 0 in (c.B, c.Hq, c.Lq) or c.Lk > 65536:
            continue
        if DEV == "cpu":  # the interpreter runs the TMA kernel for fp16 only
            c = dataclasses.replace(c, dtype="fp16", device="cpu")
        q, k, v = CS.make_inputs(c, 0, DEV)[:3]
        try:
            text = tma_prefill.describe_call(q, k, v, **c.kwargs())
        except UnsupportedConfig:  # strides the copy engine refuses
            continue
        if text.endswith("v-chunk"):
            taken.append((c, text.split()[-2]))
    assert len(taken) >= 10 and any(c.nan_slots for c, _ in taken), [c.id for c, _ in taken]
    # session 37's variants (launch._vchunk_variant) among them, NaN-slot cases included
    for variant in ("edge-view", "last-col"):
        assert any(c.nan_slots for c, how in taken if how == variant), (variant, [(c.id, how) for c, how in taken])


def test_gluon_knob_refuses_what_it_cannot_run():
    """The Gluon lab kernel (``_tma="gluon"``, never chosen by the table): a tile it
    has no form for is a ValueError, and a call it cannot serve (fp32, head dims
    outside 64/128; on CPU every call, the interpreter has no Gluon; GPUs other
    than sm_90) is refused with UnsupportedConfig before any kernel runs, instead
    of silently running another kernel. On CPU and GPU alike."""
    x = torch.randn(1, 2, 40, 64, dtype=torch.float16, device=DEV)
    kw = dict(window_size=8, chunk_size=4, _force_path="prefill", _tma="gluon")
    for bad in (L.Config(64, 64, 4, 1), L.Config(64, 64, 2, 2), L.Config(96, 64, 8, 2), L.Config(64, 64, 4, 2, 128),
                L.Config(512, 64, 8, 2), L.Config(64, 512, 4, 2)):
        with pytest.raises(ValueError, match="Gluon prefill tile"):
            sliding_window_attention(x, x, x, _config=bad, **kw)
    for y in (x.float(), torch.randn(1, 2, 40, 96, dtype=torch.float16, device=DEV)):
        with pytest.raises(UnsupportedConfig, match="Gluon"):
            sliding_window_attention(y, y, y, **kw)
        with pytest.raises(UnsupportedConfig, match="Gluon"):
            sliding_window_attention(y, y, y, _config=L.Config(128, 64, 8, 2), **kw)
    assert L.GLUON_PREFILL == {}  # shipped nowhere: slower than the TMA kernel (BENCHMARKS.md, session 9)


# ---------------------------------------------------------------- GPU tier
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _graph_replay(call):
    """Capture ``call`` in a CUDA graph (after a warm-up on a side stream),
    replay it once; returns what the captured call returned and the graph
    (kept alive by the caller while it reads those outputs)."""
    from tools._common import capture_graph

    g, out = capture_graph(call)
    g.replay()
    torch.cuda.synchronize()
    return out, g


@pytest.mark.gpu
@gpu
def test_tma_prefill_path_choice_and_graph_replay():
    """Long prefills take the TMA kernel (PREFILL_TMA, TMA_MIN_WAVES), short ones
    the pointer kernel; the TMA call is capturable and replays bit-exactly."""
    kw = dict(window_size=512, chunk_size=64)
    q, k, v = _inputs(1, 32, 32, 8192, 8192, 128, 128, torch.bfloat16)
    p = reference.check_inputs(q, k, v, **kw)
    o, lse = p.new_outputs(poison=True)
    assert L.launch(p, q, k, v, o, lse) == "prefill_tma"
    qs = q[:, :, -512:]
    ps = reference.check_inputs(qs, k, v, **kw)
    assert L.launch(ps, qs, k, v, *ps.new_outputs()) == "prefill"  # 256 programs: under 4 waves
    ref = sliding_window_attention(q, k, v, **kw)
    assert torch.equal(ref[0], o) and torch.equal(ref[1], lse)
    out, _g = _graph_replay(lambda: sliding_window_attention(q, k, v, **kw))
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    # the TMA calls after the first went through the descriptor fast path (launch._TmaFast:
    # Triton 3.6's launcher, the device image's), which never turned itself off
    import triton
    if triton.__version__.startswith("3.6."):
        assert any(isinstance(f, L._TmaFast) for f in L._FWD_TMA.tma_cache.values()), \
            "no TMA fast launch recorded: this Triton's launcher is not the one _TmaFast knows"
    assert not L.FAST_PATH_OFF, L.FAST_PATH_OFF
    _check(*sliding_window_attention(q[:, :4, -700:], k[:, :4], v[:, :4], **kw, _force_path="prefill",
                                     _tma="v_ptr"), q[:, :4, -700:], k[:, :4], v[:, :4], **kw)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("blhd", [False, True], ids=["BHLD", "BLHD"])
def test_tma_v_chunk_shipped_at_d64(blhd):
    """A long GQA prefill at D = 64 takes the TMA kernel with its inside blocks' ``v``
    through the chunked view (launch.TMA_V_CHUNK), its edge blocks' too (whole chunks:
    launch.TMA_EDGE_VIEW, session 37) with the scale in the exponent (launch.TMA_VIEW_FOLD,
    session 38), in both stride orders, through the descriptor fast path: within rounding of
    the pointer-v kernel (the same blocks in the same order; the last-column variant compiles
    to another instruction order: bit-identical until session 37; and since session 38 the
    variant has FOLD, the pointer-v kernel not, so the scale is applied in another order too:
    on an H100 at 8a91ade 2881-3135 of 16.8M elements of ``o`` differed, by at most 2**-9, one
    bf16 ulp below 0.5; 2194-2285 without FOLD at 6dbab1c) with NaN in every landmark slot of ``k`` and ``v``, poisoned outputs, a graph
    replay; and within the bound against float64 on a slice. A ``kv_start`` inside a chunk
    runs the pointer-v kernel."""
    kw = dict(window_size=512, chunk_size=64)
    fast_off = len(L.FAST_PATH_OFF)  # a list the process shares: only this test's entries count
    q, k, v = _inputs(1, 32, 4, 8192, 8192, 64, 64, torch.bfloat16, blhd)
    lmk = (torch.arange(8192, device=DEV) + 1) % 64 == 0
    k[:, :, lmk] = float("nan")
    v[:, :, lmk] = float("nan")
    p = reference.check_inputs(q, k, v, **kw)
    assert L.describe(p, q, k, v).endswith(" fold phases edge-view v-chunk")
    o, lse = p.new_outputs(poison=True)
    assert L.launch(p, q, k, v, o, lse) == "prefill_tma"
    o2, lse2 = p.new_outputs(poison=True)
    assert L.launch(p, q, k, v, o2, lse2, tma="v_ptr") == "prefill_tma"
    assert _within_rounding((o, lse), (o2, lse2)) and not torch.isnan(o).any()
    out, _g = _graph_replay(lambda: sliding_window_attention(q, k, v, **kw))
    assert torch.equal(out[0], o) and torch.equal(out[1], lse)
    import triton
    if triton.__version__.startswith("3.6."):
        assert any(isinstance(f, L._TmaFast) and "('V_CHUNK', True)" in str(key)
                   for key, f in L._FWD_TMA.tma_cache.items())
    assert len(L.FAST_PATH_OFF) == fast_off, L.FAST_PATH_OFF
    off = reference.check_inputs(q, k, v, **kw, kv_start=5)
    assert "v-chunk" not in L.describe(off, q, k, v)
    _check(o[:, :4, -300:].contiguous(), lse[:, :4, -300:].contiguous(), q[:, :4, -300:], k[:, :1], v[:, :1], **kw)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("C, kv_start, Lq, Lk, blhd", [(128, 384, 3000, 8292, False), (256, 0, 4296, 4296, True),
                                                      (64, 32, 4000, 8232, True)],
                         ids=["C128-kv384-tail100", "C256-BLHD-tail200", "C64-kv32-BLHD"])
def test_tma_v_chunk_boxes_inside_chunks(C, kv_start, Lq, Lk, blhd):
    """The chunked view on the copy engine where the lab's shapes do not take it: blocks
    that start inside a chunk (C > BLOCK_N: row ``ph > 0`` of chunk ``vc``), a view whose
    base is past key 0 (``j_min > 0``), a kernel frame whose ``kv_start`` is not a multiple
    of C, and inside blocks past the last whole chunk run with the edge blocks (a tail of
    100 / 200 keys). NaN in every landmark slot, outputs poisoned: no NaN anywhere, within
    rounding of the pointer-v kernel (the same blocks in another order), and within the
    suite's bound against float64 on the last rows, whose tiles hold the moved blocks."""
    kw = dict(window_size=512, chunk_size=C, kv_start=kv_start)
    q, k, v = _inputs(1, 32, 4, Lq, Lk, 64, 64, torch.bfloat16, blhd)
    lmk = (torch.arange(Lk, device=DEV) + kv_start + 1) % C == 0
    k[:, :, lmk] = float("nan")
    v[:, :, lmk] = float("nan")
    p = reference.check_inputs(q, k, v, **kw)
    assert L.describe(p, q, k, v).endswith("v-chunk")
    o, lse = p.new_outputs(poison=True)
    assert L.launch(p, q, k, v, o, lse) == "prefill_tma"
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    o2, lse2 = p.new_outputs(poison=True)
    assert L.launch(p, q, k, v, o2, lse2, tma="v_ptr") == "prefill_tma"
    assert torch.allclose(o.float(), o2.float(), rtol=2e-2, atol=2e-2)
    assert torch.allclose(lse, lse2, rtol=0, atol=1e-4)
    _check(o[:, :4, -256:].contiguous(), lse[:, :4, -256:].contiguous(), q[:, :4, -256:], k[:, :1], v[:, :1], **kw)


@pytest.mark.gpu
@gpu
def test_cuda_graph_capture_replays_exactly():
    """No host sync, no per-call device tensors but the outputs (and, under capture, the
    split scratch the graph owns: reference.device.scratch)."""
    kw = dict(window_size=512, chunk_size=64)
    for Lq in (1, 1024):  # split-KV and prefill
        q, k, v = _inputs(1, 8, 2, Lq, 4096, 128, 128, torch.bfloat16)
        ref = sliding_window_attention(q, k, v, **kw)  # warm-up: compile
        out, _g = _graph_replay(lambda: sliding_window_attention(q, k, v, **kw))
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


@pytest.mark.gpu
@gpu
def test_pdl_combine_matches_serial_launches_back_to_back():
    """The split-KV combine as a programmatic dependent launch (SPLIT_PDL) gives the
    bits of the serial launch, call after call without a host sync in between (each
    split reuses the scratch the previous combine read), and under graph replay;
    D=128 and the narrow D=64 tile (SPLIT_NARROW) of a small GQA grid."""
    kw = dict(window_size=512, chunk_size=64)
    for B, Hq, Hkv, D in ((1, 8, 8, 128), (1, 8, 1, 64)):
        sets = [_inputs(B, Hq, Hkv, 1, 2048, D, D, torch.bfloat16) for _ in range(12)]
        p = reference.check_inputs(*sets[0], **kw)
        assert L._make_plan(p, None, None, None, None).path == "splitkv"
        serial = [sliding_window_attention(*x, **kw, _pdl=False) for x in sets]
        torch.cuda.synchronize()
        chained = [sliding_window_attention(*x, **kw) for x in sets]  # PDL, no sync between
        torch.cuda.synchronize()
        for (o1, l1), (o2, l2) in zip(serial, chained):
            assert torch.equal(o1, o2) and torch.equal(l1, l2)
        _check(*chained[0], *sets[0], **kw)
        out, _g = _graph_replay(lambda: sliding_window_attention(*sets[1], **kw))
        assert torch.equal(out[0], serial[1][0]) and torch.equal(out[1], serial[1][1])


@pytest.mark.gpu
@gpu
def test_tma_prefill_d64_register_cap():
    """The D=64 TMA tile runs under its register cap (PREFILL_TMA, Config.maxnreg),
    matches the reference and replays bit-exactly from a graph."""
    kw = dict(window_size=512, chunk_size=64)
    assert L.PREFILL_TMA[("16", 64)][0].maxnreg is not None
    q, k, v = _inputs(1, 16, 2, 4096, 4096, 64, 64, torch.bfloat16)
    p = reference.check_inputs(q, k, v, **kw)
    o, lse = p.new_outputs(poison=True)
    assert L.launch(p, q, k, v, o, lse) == "prefill_tma"
    _check(o, lse, q, k, v, **kw)
    out, _g = _graph_replay(lambda: sliding_window_attention(q, k, v, **kw))
    assert torch.equal(out[0], o) and torch.equal(out[1], lse)


@pytest.mark.gpu
@gpu
@pytest.mark.usefixtures("gpu_memory_lock")  # 8 GB of k and v (conformance/gpu_lock.py)
def test_int64_offsets_past_2_to_31_elements():
    """k and v hold more than 2**31 elements; the visible keys sit at the end."""
    Lk, D = (1 << 31) // 128 + 4096, 128
    k = torch.randn(1, 1, Lk, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 1, Lk, D, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, 1, 64, D, device="cuda", dtype=torch.bfloat16)
    kw = dict(window_size=300, chunk_size=64)
    o, lse = sliding_window_attention(q, k, v, **kw)
    tail = Lk - 1024  # every visible key is in the tail: the reference runs on that slice
    _check(o, lse, q, k[:, :, tail:], v[:, :, tail:], kv_start=tail, **kw)
    # the TMA prefill kernel on the same tensors: K's descriptor starts at the first
    # visible key, past 2**31 elements into k (its row coordinates stay small); V by
    # pointers with int64 offsets
    o, lse = sliding_window_attention(q, k, v, **kw, _force_path="prefill", _tma="v_ptr")
    _check(o, lse, q, k[:, :, tail:], v[:, :, tail:], kv_start=tail, **kw)


def _fake_tma_kernel(metas, make_arg_calls, raw_calls, scratch=0):
    """A compiled kernel shaped like Triton 3.6's: ``ck.run`` a launcher whose ``launch``
    is the descriptor-handling wrapper closing over the C ``launcher`` and the kernel's
    ``tensordesc_meta``; the C launch records its arguments."""
    from types import SimpleNamespace

    def launcher(*args):
        raw_calls.append(args)

    def wrap(launcher, tensordesc_meta):
        tensordesc_indices = set(range(len(tensordesc_meta)))

        def inner(*args):
            return launcher(*args), tensordesc_meta, tensordesc_indices
        return inner

    run = SimpleNamespace(launch=wrap(launcher, metas), global_scratch_size=scratch, profile_scratch_size=0,
                          num_ctas=1, launch_cooperative_grid=False, launch_pdl=True)
    return SimpleNamespace(run=run, function=0xF00, packed_metadata=("packed",))


def test_tma_fast_launch_encodes_each_descriptor_once(monkeypatch):
    """``launch._TmaFast`` on a stand-in of Triton 3.6's launcher: the C launch gets
    the launcher's leading arguments (grid, stream, function, cooperative, PDL, no
    scratch, packed metadata, no launch metadata or hooks), then each descriptor as
    the encoder expands it, then the rest in order; a descriptor is encoded once per
    ``(data_ptr, shape, strides)`` (a new address or shape encodes again), the cache
    is bounded; a launcher of another structure (Triton 3.9's three-argument encoder,
    scratch memory, a missing meta) gets no fast path."""
    from types import SimpleNamespace

    from triton.backends.nvidia import driver as nv

    enc = []

    def make_arg(arg, meta):  # Triton 3.6's signature: (descriptor, metadata)
        enc.append((arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), meta["b"]))
        return [("map", arg.base.data_ptr(), meta["b"]), *arg.shape, *arg.strides]

    real_make = nv.make_tensordesc_arg
    monkeypatch.setattr(nv, "make_tensordesc_arg", make_arg)
    monkeypatch.setattr(nv, "_BASE_ARGS_FORMAT", "iiiKKppOOOOOO", raising=False)
    monkeypatch.setattr(nv, "CudaLauncher", SimpleNamespace)  # the fakes' launcher class
    monkeypatch.setattr(L, "_stream", lambda dev: 77 + dev)
    raw = []
    metas = [{"b": 1}, {"b": 2}]
    fast = L._TmaFast.of(_fake_tma_kernel(metas, enc, raw), 2)
    assert fast is not None
    d0, d1 = (4096, (1, 2, 8, 16), (256, 128, 16, 1)), (8192, (1, 2, 5, 16), (256, 128, 16, 1))
    fast.launch((3, 4), (d0, d1), ("v", "lse", 9, 0.5, True), 0)  # a 2-D grid, as the prefill plans have
    assert raw[-1] == (3, 4, 1, 77, 0xF00, False, True, None, None, ("packed",), None, None, None,
                       ("map", 4096, 1), 1, 2, 8, 16, 256, 128, 16, 1,
                       ("map", 8192, 2), 1, 2, 5, 16, 256, 128, 16, 1, "v", "lse", 9, 0.5, True)
    assert len(enc) == 2
    fast.launch((3, 4, 1), (d0, d1), ("v", "lse", 9, 0.5, True), 0)
    assert len(enc) == 2 and raw[-1] == raw[-2]  # encodings reused
    moved = (4096 + 16, *d0[1:])
    fast.launch((3, 4, 1), (moved, d1), ("v", "lse", 9, 0.5, True), 0)
    assert enc[-1] == (4096 + 16, (1, 2, 8, 16), (256, 128, 16, 1), 1) and len(enc) == 3
    for i in range(L._TmaFast.ENC_MAX + 5):  # bounded
        fast.launch((1, 1, 1), ((16 * i, *d0[1:]), d1), (), 1)
    assert raw[-1][3] == 78  # the stream of the device it was given
    assert len(fast.enc) <= L._TmaFast.ENC_MAX
    # launchers the fast path does not know
    assert L._TmaFast.of(_fake_tma_kernel(metas, enc, raw, scratch=128), 2) is None
    assert L._TmaFast.of(_fake_tma_kernel([{"b": 1}, None], enc, raw), 2) is None
    assert L._TmaFast.of(_fake_tma_kernel(metas, enc, raw), 3) is None
    assert L._TmaFast.of(object(), 2) is None
    monkeypatch.setattr(nv, "make_tensordesc_arg", real_make)
    if real_make.__code__.co_argcount != 2:  # this Triton's encoder is not 3.6's
        assert L._TmaFast.of(_fake_tma_kernel(metas, enc, raw), 2) is None
    # launch hooks: unset (None or an empty chain) -> the direct launches pass none; a hook set -> not
    import triton
    assert L._no_launch_hooks()
    chain = triton.knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):
        hook = lambda metadata: None  # noqa: E731
        chain.add(hook)
        try:
            assert not L._no_launch_hooks()
        finally:
            chain.remove(hook)
        assert L._no_launch_hooks()


class _FakeCLaunch:
    """Stands in for Triton 3.6's compiled C launch (not a Python function): records its arguments."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


def test_raw_launch_passes_pointers_as_ints(monkeypatch):
    """``launch._RawLaunch`` on a stand-in of Triton 3.6's pointer-kernel launcher: the
    C launch gets the leading arguments ``CudaLauncher.__call__`` would give it (grid,
    stream, function, cooperative, PDL, no scratch, packed metadata, no launch metadata
    or hooks), then the kernel's arguments; ``_Kernel.__call__``'s direct launches hand
    it the tensors' ``data_ptr()`` ints in the kernel's order. A launcher of another
    structure (another argument format, scratch memory, a Python wrapper) gets none."""
    from types import SimpleNamespace

    from triton.backends.nvidia import driver as nv

    monkeypatch.setattr(nv, "_BASE_ARGS_FORMAT", "iiiKKppOOOOOO", raising=False)
    monkeypatch.setattr(nv, "CudaLauncher", SimpleNamespace)  # the fakes' launcher class
    monkeypatch.setattr(L, "_stream", lambda dev: 50 + dev)

    def fake_ck(launch, scratch=0):
        run = SimpleNamespace(launch=launch, global_scratch_size=scratch, profile_scratch_size=0, num_ctas=1,
                              launch_cooperative_grid=False, launch_pdl=True)
        return SimpleNamespace(run=run, function=0xBEEF, packed_metadata=(4, 1, 0))

    c = _FakeCLaunch()
    raw = L._RawLaunch.of(fake_ck(c))
    assert raw is not None
    raw.launch((6, 2), (111, 222, 7, 0.5, True), 1)
    assert c.calls[-1] == (6, 2, 1, 51, 0xBEEF, False, True, None, None, (4, 1, 0), None, None, None,
                           111, 222, 7, 0.5, True)
    assert L._RawLaunch.of(fake_ck(c, scratch=64)) is None
    assert L._RawLaunch.of(fake_ck(lambda *a: None)) is None  # a Python wrapper (descriptors): not this
    assert L._RawLaunch.of(object()) is None
    monkeypatch.setattr(nv, "CudaLauncher", type("OtherLauncher", (), {}))  # another backend's launcher
    assert L._RawLaunch.of(fake_ck(c)) is None
    monkeypatch.setattr(nv, "CudaLauncher", SimpleNamespace)
    monkeypatch.setattr(nv, "_BASE_ARGS_FORMAT", "iiiKKppOOOOOOO")  # another Triton's format
    assert L._RawLaunch.of(fake_ck(c)) is None
    monkeypatch.setattr(nv, "_BASE_ARGS_FORMAT", "iiiKKppOOOOOO")

    # _Kernel.__call__: the first call through the JIT caches the kernel and its raw
    # launch; the next passes ints, in order, then the constexprs' values
    monkeypatch.setattr(L, "interpreter_active", lambda: False)
    monkeypatch.setattr(L._Kernel, "enabled", True)
    monkeypatch.setattr(L, "_no_launch_hooks", lambda: True)
    monkeypatch.setattr(L, "_device", lambda: 0)
    c2 = _FakeCLaunch()
    ck = fake_ck(c2)
    jit = []

    class Fn:
        arg_names = ["X", "Y", "n", "s", "BLOCK"]

        def __getitem__(self, grid):
            return lambda *a, **kw: jit.append(a) or ck

    kern = L._Kernel(Fn())
    x, y = torch.zeros(8), torch.zeros(4, dtype=torch.float16)
    call = ((3,), (x, y), (9,), (0.25,), {"BLOCK": 16}, L.static_key({"BLOCK": 16}, 4, 1))
    kern(*call)
    kern(*call)
    assert len(jit) == 1 and jit[0][:2] == (x, y)  # the JIT got the tensors
    assert c2.calls[-1][13:] == (x.data_ptr(), y.data_ptr(), 9, 0.25, 16)
    # the stream: read for the current device, or the handle the caller read (0 included)
    assert c2.calls[-1][3] == 50
    for handle in (0x5EED, 0):
        kern(*call, stream=handle)
        assert c2.calls[-1][3] == handle
    # the raw launch raises where the JIT's launch succeeds: the raw launch alone turns off
    monkeypatch.setattr(L._RawLaunch, "enabled", True)
    monkeypatch.setattr(L, "FAST_PATH_OFF", [])

    def broken(*a):
        raise TypeError("function takes exactly 40 arguments")

    kern.cache[next(iter(kern.cache))] = (ck, L._RawLaunch(broken, ck, False, True))
    with pytest.warns(RuntimeWarning, match="raw C launch of cached kernels failed .*40 arguments"):
        kern(*call)
    assert len(jit) == 2 and not L._RawLaunch.enabled and L._Kernel.enabled and len(L.FAST_PATH_OFF) == 1
    runs = []
    ck.run = lambda *a: runs.append(a)
    kern(*call)  # then ck.run, with the ints (also the lab's switch)
    assert len(jit) == 2 and runs[-1][9:] == (x.data_ptr(), y.data_ptr(), 9, 0.25, 16)
    assert runs[-1][3] == 50
    for handle in (0x5EED, 0):
        kern(*call, stream=handle)
        assert runs[-1][3] == handle
    # a launch hook set: Triton's own metadata is built from the tensors, so they travel
    monkeypatch.setattr(L, "_no_launch_hooks", lambda: False)
    ck.launch_metadata = lambda *a: "meta"
    kern(*call)
    assert runs[-1][6] == "meta" and runs[-1][9:11] == (x, y) and runs[-1][3] == 50
    kern(*call, stream=0)
    assert runs[-1][3] == 0


def test_tma_fast_launch_falls_back_when_the_raw_launch_fails(monkeypatch):
    """``_Kernel.launch_tma``: the first call of a key goes through ``__call__`` (the
    JIT) and records a ``_TmaFast``; later calls take it. When it raises and ``__call__``
    raises too (the call's own fault: a CUDA error, say), that error propagates and
    the fast path stays; when ``__call__`` succeeds, the TMA fast path is off for the
    process (warned, recorded) and the call ran once through ``__call__``."""
    monkeypatch.setattr(L, "interpreter_active", lambda: False)
    monkeypatch.setattr(L._Kernel, "enabled", True)
    monkeypatch.setattr(L._TmaFast, "enabled", True)
    monkeypatch.setattr(L, "_no_launch_hooks", lambda: True)  # Triton 3.9: hook chains, never None
    monkeypatch.setattr(L, "_device", lambda: 0)
    jit_calls, fast_calls = [], []

    class FakeFast:
        fail = False

        def launch(self, grid, descs, rest, dev):
            fast_calls.append(rest)
            if FakeFast.fail:
                raise RuntimeError("launcher drift")

    monkeypatch.setattr(L._TmaFast, "of", classmethod(lambda cls, ck, n: FakeFast()))
    kern = L._Kernel(L.kernels._swa_fwd_tma_kernel)

    jit_fails = []

    def call(grid, tensors, ints, floats, cx, static, dev=None):
        jit_calls.append(tensors)
        if jit_fails:
            raise jit_fails[0]
        return object()

    monkeypatch.setattr(L._Kernel, "__call__", lambda self, *a: call(*a))
    names = L.kernels._swa_fwd_tma_kernel.arg_names
    v, lse = torch.zeros(4), torch.zeros(2)
    cx = {n: 0 for n in names[6 + 12 + 1:]}  # 4 descriptors, v, lse; 12 ints; qk_scale
    ints = tuple(range(12))
    args = ((8, 1), ((0, (1,), (1,)),) * 4, lambda: ("D",) * 4, (v, lse), ints, (0.5,), cx, ("static",))
    kern.launch_tma(*args)
    kern.launch_tma(*args)
    assert len(jit_calls) == 1 and len(fast_calls) == 1
    # the pointers after the descriptors as their data_ptr() ints, in order, then the rest
    assert fast_calls[0] == (v.data_ptr(), lse.data_ptr(), *ints, 0.5, *cx.values())
    FakeFast.fail = True
    monkeypatch.setattr(L, "FAST_PATH_OFF", [])
    jit_fails.append(RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered"))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        kern.launch_tma(*args)
    assert len(jit_calls) == 2 and len(fast_calls) == 2 and L._TmaFast.enabled and not L.FAST_PATH_OFF
    jit_fails.clear()
    with pytest.warns(RuntimeWarning, match="TMA descriptor fast launch failed .*launcher drift"):
        kern.launch_tma(*args)
    assert len(jit_calls) == 3 and len(fast_calls) == 3 and not L._TmaFast.enabled
    assert len(L.FAST_PATH_OFF) == 1
    kern.launch_tma(*args)
    assert len(jit_calls) == 4 and len(fast_calls) == 3


def test_direct_launch_falls_back_only_when_the_jit_succeeds(monkeypatch):
    """``_Kernel.__call__``'s direct launch of a cached compiled kernel: when it raises,
    the same call goes through the JIT once; the fast path is turned off (warned,
    recorded) only if the JIT succeeds, and a JIT error propagates with the fast path
    kept."""
    from types import SimpleNamespace

    monkeypatch.setattr(L, "interpreter_active", lambda: False)
    monkeypatch.setattr(L._Kernel, "enabled", True)
    monkeypatch.setattr(L, "FAST_PATH_OFF", [])
    monkeypatch.setattr(L, "_device", lambda: 0)
    direct, jit = [], []
    direct_fail, jit_fail = [], []

    def run(*a):
        direct.append(a)
        if direct_fail:
            raise direct_fail[0]

    ck = SimpleNamespace(run=run, packed_metadata=(4, 1, 0), function=1)

    class Fn:
        arg_names = ["X", "n", "BLOCK"]

        def __getitem__(self, grid):
            def launch(*a, **kw):
                jit.append(a)
                if jit_fail:
                    raise jit_fail[0]
                return ck
            return launch

    monkeypatch.setattr(L, "_direct_launch", lambda ck, grid, args, dev, stream=None: ck.run(*args))
    kern = L._Kernel(Fn())
    x = torch.zeros(4)
    call = ((1,), (x,), (5,), (), {"BLOCK": 16}, L.static_key({"BLOCK": 16}, 4, 1))
    assert kern(*call) is ck and len(jit) == 1  # first call: the JIT, cached
    assert kern(*call) is ck and len(direct) == 1 and len(jit) == 1  # then the direct launch
    direct_fail.append(TypeError("function takes exactly 40 arguments"))
    jit_fail.append(RuntimeError("Triton Error [CUDA]: unspecified launch failure"))
    with pytest.raises(RuntimeError, match="launch failure"):
        kern(*call)
    assert L._Kernel.enabled and not L.FAST_PATH_OFF and len(jit) == 2
    jit_fail.clear()
    with pytest.warns(RuntimeWarning, match="direct launch of cached kernels failed .*40 arguments"):
        assert kern(*call) is ck
    assert not L._Kernel.enabled and len(L.FAST_PATH_OFF) == 1 and len(jit) == 3 and len(direct) == 3


def test_launch_plumbing_matches_kernel_signatures(monkeypatch):
    """Every launch path hands its kernel exactly the kernel's parameters: runtime
    args in order, then the constexprs by name, and the precomputed static key of
    those constexprs. Runs the launcher's host code on CPU with the kernels
    replaced by recorders; the TMA path is planned as for a CUDA device (it only
    runs on a GPU), with descriptors of CPU tensors."""
    import dataclasses

    calls = []

    class Rec:
        def __init__(self, fn):
            self.fn = fn

        def __call__(self, grid, tensors, ints, floats, cx, static, dev=None, stream=None):
            calls.append((self.fn, tensors, ints, floats, cx, static))

        def launch_tma(self, grid, descs, build, tensors, ints, floats, cx, static, dev=None):
            built = build()  # the TensorDescriptor objects of the JIT path
            # the fast path's (data_ptr, shape, strides) name the same memory as those objects
            assert [(d.base.data_ptr(), tuple(d.shape), tuple(d.strides)) for d in built] == \
                [(ptr, tuple(shape), tuple(st)) for ptr, shape, st in descs]
            self(grid, (*built, *tensors), ints, floats, cx, static)

    for name in ("_FWD", "_FWD_TMA", "_SPLIT", "_COMBINE"):
        monkeypatch.setattr(L, name, Rec(getattr(L, name).fn))
    monkeypatch.setattr(L, "_PLANS", {})
    # the CPU tensors' calls as under the interpreter, on a GPU machine too (session 33: there
    # launch() refused them; the kernels here are recorders, nothing runs)
    monkeypatch.setattr(L, "interpreter_active", lambda: True)
    kw = dict(window_size=512, chunk_size=64)
    q, k, v = (torch.randn(1, 32, 4096, 128, dtype=torch.bfloat16) for _ in range(3))
    p = reference.check_inputs(q, k, v, **kw)
    o, lse = p.new_outputs()
    assert L.launch(p, q, k, v, o, lse) == "prefill"
    qd, kd, vd = q[:, :, :1], k[:, :, :600], v[:, :, :600]
    pd = reference.check_inputs(qd, kd, vd, **kw)
    od, lsed = pd.new_outputs()
    assert L.launch(pd, qd, kd, vd, od, lsed) == "splitkv"
    monkeypatch.setattr(L, "interpreter_active", lambda: False)
    monkeypatch.setattr(L, "sm_count", lambda device: 132)
    pc = dataclasses.replace(p, device=torch.device("cuda"))
    assert L.launch(pc, q, k, v, o, lse) == "prefill_tma"
    # a key range that starts past key 0 (j_min = 3072: k and v descriptors moved by it), BLHD q
    qc = torch.randn(1, 512, 32, 128, dtype=torch.bfloat16).transpose(1, 2)
    pc0 = reference.check_inputs(qc, k, v, **kw)
    oc, lsec = pc0.new_outputs()
    pcc = dataclasses.replace(pc0, device=torch.device("cuda"))
    assert L.launch(pcc, qc, k, v, oc, lsec, tma="v_ptr") == "prefill_tma"
    assert calls[-1][2][-3] == 3072  # j_min (ints end Lk, r, j_min, W, C)
    # the same with BLHD-stored k and v: their bases move by j_min rows of H * D elements
    kb, vb = (torch.randn(1, 4096, 32, 128, dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
    assert L.launch(dataclasses.replace(pcc), qc, kb, vb, oc, lsec, tma="v_ptr") == "prefill_tma"
    assert calls[-1][2][-3] == 3072
    del calls[-2:]
    # split-KV as planned for a Hopper GPU: the combine is a programmatic dependent launch
    monkeypatch.setattr(L, "capability", lambda device: (9, 0))
    monkeypatch.setattr(L, "scratch", lambda device, shapes, stream=None: tuple(torch.empty(s) for s in shapes))
    pdc = dataclasses.replace(pd, device=torch.device("cuda"))
    assert L.launch(pdc, qd, kd, vd, od, lsed) == "splitkv"
    names = [c[0].fn.__name__ if hasattr(c[0], "fn") else c[0].__name__ for c in calls]
    assert names == ["_swa_fwd_kernel", "_swa_splitkv_kernel", "_swa_combine_kernel",
                     "_swa_fwd_tma_kernel", "_swa_splitkv_kernel", "_swa_combine_kernel"]
    for fn, tensors, ints, floats, cx, static in calls:
        n = len(tensors) + len(ints) + len(floats)
        assert fn.arg_names[n:] == list(cx), fn.__name__
        assert static[0] == tuple(cx.items())  # the options ride in static (launch._options)
    # PDL only on the GPU: the interpreter's split kernels neither trigger nor wait
    (_, split_cpu, comb_cpu), (split_gpu, comb_gpu) = calls[:3], calls[4:]
    assert not split_cpu[4]["PDL"] and not comb_cpu[4]["PDL"] and not L._options(comb_cpu[5]).get("launch_pdl")
    assert split_gpu[4]["PDL"] and comb_gpu[4]["PDL"]
    assert L._options(comb_gpu[5])["launch_pdl"] and "launch_pdl" not in L._options(split_gpu[5])
    # a register cap of a config reaches the compile options and the cache key
    calls.clear()
    capped = L.Config(64, 32, 4, 2, maxnreg=128)
    assert L.launch(pc, q, k, v, o, lse, config=capped) == "prefill"  # an explicit config: the pointer kernel
    (fn, *_, cx, static), = calls
    assert static == L.static_key(cx, 4, 2, False, 128)
    assert L._options(static) == dict(num_warps=4, num_stages=2, maxnreg=128, **L.COMPILE_OPTIONS)
    # ... except for the int64 kernel of a frame past 2**31, which keeps ptxas's count
    assert L._frame_static(static, (2 ** 31, 512, 64)) == L.static_key(cx, 4, 2, False, None)
    assert L._frame_static(static, (5, 512, 64)) == static


@pytest.mark.parametrize("path", ["prefill", "splitkv"])
def test_batch_past_the_grid_y_bound_runs_in_slices(monkeypatch, path):
    """B * Hq programs past a launch grid's y extent (65535; lowered here so the
    interpreter reaches it): launch() runs slices of batches_per_launch(p) batches, each a
    view of the inputs and outputs, and every row is written (poisoned outputs) and right,
    BLHD views included; B * Hq exactly at the bound is one launch."""
    monkeypatch.setattr(L, "GRID_YZ_MAX", 4)
    runs = []
    real = L._run
    monkeypatch.setattr(L, "_run", lambda plan, p, *a: runs.append(p.B) or real(plan, p, *a))
    kw = dict(window_size=9, chunk_size=4, kv_start=3)
    q, k, v = _inputs(5, 2, 1, 7, 12, 32, 32, torch.float16, blhd=True)
    o, lse, _ = _run(q, k, v, path=path, **kw)
    assert runs == [2, 2, 1]  # 4 // Hq = 2 batches at most a launch, in near-equal slices
    assert triton_impl.describe_call(q, k, v, **kw).endswith(" (batch slices of 2 or fewer: 3 launches)")
    _check(o, lse, q, k, v, **kw)
    runs.clear()
    _run(q[:2], k[:2], v[:2], path=path, **kw)
    assert runs == [2]
    # no query head: no division by Hq, and no slicing (launch's callers skip empty calls,
    # tools may not)
    q0 = torch.empty(5, 0, 7, 32, dtype=torch.float16, device=DEV)
    k0 = torch.empty(5, 0, 12, 32, dtype=torch.float16, device=DEV)
    p0 = reference.check_inputs(q0, k0, k0, **kw)
    assert L.batches_per_launch(p0) == 4


def test_more_query_heads_than_a_grid_holds_are_unsupported():
    """Hq > 65535: one batch's heads would not fit the launch grid's y extent; refused
    before any kernel."""
    q = torch.randn(1, 65536, 1, 32, dtype=torch.float16)
    k = torch.randn(1, 1, 1, 32, dtype=torch.float16)
    with pytest.raises(UnsupportedConfig, match="Hq=65536"):
        sliding_window_attention(q, k, k, window_size=1, chunk_size=1)


def _constexpr_names(kernel) -> list[str]:
    """The kernel's constexpr parameters in its own order (JIT or interpreter object alike)."""
    import inspect

    fn = getattr(kernel, "fn", kernel)
    return [n for n, prm in inspect.signature(fn).parameters.items() if "constexpr" in str(prm.annotation)]


_TMA_PATHS = {"prefill", "prefill_tma", "prefill_tma_vchunk", "prefill_tma_lastcol", "prefill_tma_edgeview"}


# (what, shape B, Hq, Hkv, Lq, Lk, Dqk, Dv, dtype, knobs, the plans' paths the row is chosen to reach)
@pytest.mark.parametrize("what, shape, dtype, knobs, paths", [
    ("pointer prefill", (1, 32, 32, 2048, 2048, 64, 64), torch.bfloat16, dict(tma=False), {"prefill"}),
    ("pointer prefill fp32", (1, 32, 32, 2048, 2048, 128, 128), torch.float32, {}, {"prefill"}),
    ("TMA prefill, v by pointers / the view", (1, 32, 32, 8192, 8192, 128, 128), torch.bfloat16, {},
     _TMA_PATHS),
    ("TMA prefill D=64", (1, 32, 4, 8192, 8192, 64, 64), torch.float16, {}, _TMA_PATHS),
    ("TMA prefill, v by TMA", (1, 32, 32, 8192, 8192, 128, 128), torch.bfloat16, dict(tma="v_tma"),
     {"prefill", "prefill_tma"}),
    ("split-KV + combine", (8, 32, 4, 1, 32768, 64, 64), torch.bfloat16, {}, {"splitkv"}),
    ("split-KV fp32", (1, 32, 32, 1, 8192, 128, 128), torch.float32, {}, {"splitkv"}),
    ("packed", (1, 32, 4, 256, 8192, 64, 64), torch.bfloat16, dict(path="packed"), {"packed"}),
], ids=["prefill", "prefill-fp32", "tma-d128", "tma-d64", "tma-v_tma", "split", "split-fp32", "packed"])
def test_plans_pass_every_constexpr_in_the_kernel_s_order(what, shape, dtype, knobs, paths, monkeypatch):
    """A cached kernel is launched directly with its constexprs passed *positionally*
    (``launch._Kernel``: ``*constexprs.values()`` after the runtime arguments), so every plan
    an H200 would make (132 SMs, sm_90; meta tensors, nothing built) must hold each kernel's
    constexprs, defaulted ones included, in the kernel's order: one missing or out of place
    sends every call of that kernel back through the JIT on a GPU (the fast path off, with a
    warning), which no CPU test would otherwise see. Session 36 added ``EDGE_VIEW`` to the TMA
    kernel; each plan's variants, the TMA plan's, its chunked-view plan's (with its last-column
    and edge-view plans, session 37) and the combine's are checked here."""
    B, Hq, Hkv, Lq, Lk, Dqk, Dv = shape
    monkeypatch.setattr(L, "sm_count", lambda d: 132)
    monkeypatch.setattr(L, "capability", lambda d: (9, 0))
    monkeypatch.setattr(L, "_PLANS", {})
    monkeypatch.setattr(L, "_INTERPRETED", False)  # plan the GPU's kernels, not the interpreter's
    q = torch.empty(B, Hq, Lq, Dqk, dtype=dtype, device="meta")
    k = torch.empty(B, Hkv, Lk, Dqk, dtype=dtype, device="meta")
    v = torch.empty(B, Hkv, Lk, Dv, dtype=dtype, device="meta")
    p = dataclasses.replace(reference.check_inputs(q, k, v, window_size=512, chunk_size=64),
                            device=torch.device("cuda", 0))
    plan = L._plan(p, **knobs)
    kern = {"prefill": kernels._swa_fwd_kernel, "splitkv": kernels._swa_splitkv_kernel,
            "packed": kernels._swa_splitkv_kernel}  # every prefill_tma* plan: the TMA kernel
    vchunk = plan.tma and plan.tma.vchunk
    plans = [plan] + [x for x in (plan.tma, vchunk, vchunk and vchunk.last_col, vchunk and vchunk.edge_view) if x]
    seen = {x.path for x in plans}
    for x in plans:
        want = _constexpr_names(kernels._swa_fwd_tma_kernel if x.path.startswith("prefill_tma")
                                else kern[x.path])
        for key, cx in x.constexprs.items():
            assert list(cx) == want, (what, x.path, key, list(cx), want)
    if plan.combine_constexprs is not None:
        assert list(plan.combine_constexprs) == _constexpr_names(kernels._swa_combine_kernel), what
    assert seen == paths, (what, seen)  # a table change that moves a row off its paths fails here
    assert (plan.combine_constexprs is not None) == (plan.path == "splitkv"), what
