"""The case generator: coverage the issue asks for, the pairwise property of the
quick tier, and the inputs (seeded, never zeros, layouts, NaN slots)."""

import itertools
import math

import pytest
import torch

import reference
from conformance.cases import (CATEGORIES, ERROR_RULES, LONG4M_LK, REACH, Case, case_seed, generate,
                               input_layouts, invisible_slots, make_inputs, pairwise, poison_unseen)

QUICK_CPU = generate("quick", "cpu")
FULL_CPU = generate("full", "cpu")
FULL_CUDA = generate("full", "cuda")


def test_ids_unique_and_deterministic():
    for cases in (QUICK_CPU, FULL_CPU, FULL_CUDA):
        ids = [c.id for c in cases]
        assert len(ids) == len(set(ids))
    assert [c.id for c in generate("quick", "cpu")] == [c.id for c in QUICK_CPU]


def test_id_format():
    c = Case(category="x", dtype="bf16", B=2, Hq=8, Hkv=2, Lq=65, Lk=129, Dqk=64, Dv=64, window=32,
             chunk=16, kv_start=0, layout="bthd")
    assert c.id == "bf16-B2-H8x2-q65k129-D64x64-W32C16-lmk1exp1-kv0-bthd"
    assert Case(category="x", sm_scale=0.3, nan_slots=True).id.endswith("-s0.3-nan")


def test_quick_is_a_subset_of_full_and_smaller():
    full = {c.id for c in FULL_CPU}
    assert {c.id for c in QUICK_CPU} <= full
    assert len(QUICK_CPU) < len(FULL_CPU)


def test_pairwise_covers_every_pair():
    axes = {"a": [1, 2, 3], "b": ["x", "y"], "c": [True, False], "d": [0, 5, 7, 9]}
    valid = lambda r: not (r["a"] == 3 and r["d"] == 9)  # noqa: E731
    rows = pairwise(axes, valid)
    full = [r for r in (dict(zip(axes, p)) for p in itertools.product(*axes.values())) if valid(r)]
    assert len(rows) < len(full)
    for x, y in itertools.combinations(axes, 2):
        want = {(r[x], r[y]) for r in full}
        got = {(r[x], r[y]) for r in rows}
        assert want == got, (x, y)


def test_quick_tier_is_pairwise_per_category():
    """Every pair of axis values of a category that the full tier has, the quick tier has."""
    for cat in CATEGORIES:
        for cuda in (False, True):
            if cat.cuda_only and not cuda:
                continue
            axes = cat.axes(cuda)
            rows = pairwise(axes, cat.valid)
            for x, y in itertools.combinations(axes, 2):
                full = {(repr(r[x]), repr(r[y])) for r in itertools.starmap(
                    lambda *p: dict(zip(axes, p)), itertools.product(*axes.values())) if cat.valid(r)}
                got = {(repr(r[x]), repr(r[y])) for r in rows}
                assert full == got, (cat.name, x, y)


def _values(cases, attr):
    return {getattr(c, attr) for c in cases if c.error is None}


@pytest.mark.parametrize("cases", [QUICK_CPU, FULL_CUDA], ids=["quick-cpu", "full-cuda"])
def test_coverage_of_the_issue(cases):
    assert _values(cases, "dtype") == {"bf16", "fp16", "fp32"}
    assert {32, 64, 96, 128, 192, 256} <= _values(cases, "Dqk")
    assert any(c.Dqk != c.Dv for c in cases)
    ratios = {c.Hq // c.Hkv for c in cases if c.Hkv and c.error is None}
    assert {1, 2, 4, 8} <= ratios
    assert any(c.Hkv == 1 and c.Hq > 1 for c in cases)  # MQA
    assert {1, 2, 3} <= _values(cases, "B")
    assert any(c.Lq == c.Lk for c in cases) and any(0 < c.Lq < c.Lk for c in cases)
    assert any(c.Lq == 1 and c.Lk > 1 for c in cases)  # decode
    assert {1, 63, 64, 65, 127, 128, 129, 333} <= _values(cases, "Lk")
    assert {1, 2, 63, 64, 65, 128} <= _values(cases, "chunk")
    ks = {(c.kv_start, c.chunk) for c in cases if c.error is None}
    assert {0, 1, 10**6 + 3} <= {k for k, _ in ks}
    assert any(k == C - 1 for k, C in ks) and any(k == C for k, C in ks if k)
    flags = {(c.mask_lmk, c.expand) for c in cases}
    assert flags == {(True, True), (True, False), (False, True), (False, False)}
    w = [(c.window, c.chunk, c.Lk, c.kv_start) for c in cases if c.error is None and c.Lk]
    assert any(W < C for W, C, _, _ in w) and any(W == C for W, C, _, _ in w)
    assert any(W > C and W % C == 0 for W, C, _, _ in w) and any(W > C and W % C for W, C, _, _ in w)
    assert any(W >= L + k for W, _, L, k in w)
    assert any(c.sm_scale is not None for c in cases)
    assert {"bhld", "bthd", "pad", "padt", "pad16", "mix", "cache"} <= _values(cases, "layout")
    assert any(c.nan_slots for c in cases)
    assert {c.error for c in cases if c.error} >= set(ERROR_RULES) - {"mixed_device"}
    assert any(c.B == 0 for c in cases) and any(c.Lq == 0 for c in cases)


def test_cuda_tier_adds_long_keys():
    wide_view = [c.id for c in FULL_CUDA if c.category == "reach" and c.Lk == 1 << 22]
    assert len(wide_view) == 2  # reach's wide-view calls (session 40), a cache of 2**22 keys
    assert max(c.Lk for c in FULL_CUDA if c.category != "long4m" and c.id not in wide_view) == 131072
    assert {1000, 2080} <= {c.Lk for c in FULL_CUDA}
    assert "mixed_device" in {c.error for c in FULL_CUDA}
    assert all(c.category != "long" for c in FULL_CPU)
    # the Triton interpreter budget; long4m's cost on the CPU is its allocation, below
    assert max(c.Lk for c in QUICK_CPU if c.category != "long4m") <= 333


def test_long4m_takes_tilelang_s_wide_kernels_on_both_tiers():
    """``long4m``: every case's kernel frame reaches launch.MAX_POSITIONS (TileLang builds its
    kernels ``wide``; positions below 2**24, where the single quotient is exact too, so the
    category shows such calls served, not the knob needed: tests/test_tilelang_cpu.py and
    tests/test_tilelang_wide_gpu.py do that), on the CPU tier too, where it stays cheap for the Triton interpreter
    (one key/value head of D = 32, at most 40 queries, 2 query heads: the interpreter runs
    the window's key blocks only; the inputs, 2 x 512 MiB in fp32, are the cost)."""
    from reference import check_inputs
    from tilelang_impl import launch

    for cases in (FULL_CPU, FULL_CUDA, QUICK_CPU):
        long4m = [c for c in cases if c.category == "long4m"]
        assert long4m and all(c.Lk == LONG4M_LK for c in long4m)
        for c in long4m:
            k = torch.empty(c.B, c.Hkv, c.Lk, c.Dqk, device="meta")
            p = check_inputs(torch.empty(c.B, c.Hq, c.Lq, c.Dqk, device="meta"), k,
                             torch.empty(c.B, c.Hkv, c.Lk, c.Dv, device="meta"), **c.kwargs())
            assert launch.wide_positions(p, launch.frame(p)[2]), c.id
    for c in QUICK_CPU + FULL_CPU:
        if c.category == "long4m":
            assert c.Lq <= 40 and c.B * c.Hq <= 2 and c.Dqk == c.Dv == 32 and c.Hkv == 1, c.id
    assert {c.Lq for c in FULL_CUDA if c.category == "long4m"} == {1, 200}


@pytest.mark.parametrize("category, dims, dtypes", [
    ("nan_seen", {64, 96, 128}, {"bf16"}),
    ("nan_v_seen", {64, 128}, {"bf16", "fp16", "fp32"}),
    ("inf_seen", {64, 128}, {"bf16", "fp16", "fp32"}),
    ("decode", {64, 128}, {"bf16", "fp32"}),
])
def test_nan_and_decode_reach_the_split_head_dims_on_cuda(category, dims, dtypes):
    """Session 15: NaN in a seen k / v row and long decode caches at Dv 96 / 128 (the
    head dims of TileLang's split-KV kernels), in every dtype of the category, on the
    GPU only; the CPU tier keeps the default D = 64."""
    cuda = [c for c in FULL_CUDA if c.category == category]
    assert {(c.Dqk, c.Dv) for c in cuda} == {(d, d) for d in dims}
    for d in dims:
        assert {c.dtype for c in cuda if c.Dv == d} == dtypes, d
    assert {c.Dv for c in FULL_CPU if c.category == category} == {64}


#: What each ``reach`` call must plan on a 132-SM Hopper device: a pattern of Triton's and
#: of TileLang's ``describe`` (None: any plan that serves it), and a check of the problem.
_REACH_PLANS = {
    "cache-decode-G4": (None, r"pack=4\b", None),
    "cache-decode-G3": (None, r"pack=3\b", None),
    "cache-pack-G8": (None, r"^fwd_tc .*pack=8\b", None),
    "cache-chunk-D128": (None, r"^fwd_tc 64x64 (?!.*S=)", None),
    "int64-split": (r"^splitkv ", None, "int64"),
    "int64-decode": (r"^splitkv ", None, "int64"),
    "int64-prefill": (r"^prefill \d", None, "int64"),
    "int64-moved": (r"^prefill \d", None, "moved"),
    "int64-tma": (r"^prefill_tma ", None, "int64"),
    "split-D32": (r"^splitkv 16x32 ", None, None),
    "split-D32-B8": (r"^splitkv 16x128 ", None, None),
    "split-D64-B8": (r"^splitkv 16x128 ", None, None),
    "D48-prefill": (r"^prefill \d+x\d+ .*phases", None, None),
    "D48-tma": (r"^prefill_tma .* r128 .*v-chunk", None, None),
    "fp32-D96-prefill": (r"^prefill 32x16 w8 s3", r"^fwd_fp32", None),
    "fp32-D256-prefill": (r"^prefill 32x16 w8 s2", r"^fwd_fp32", None),
    "fp32-scale-prefill": (r"^prefill 64x32 w8 s2", r"^fwd_fp32", None),
    "D256-lmk-one": (r"^prefill 64x32 ", r"^fwd_tc ", "lmk_one"),
    "D256-no-lmk": (r"^splitkv 64x32 w8 s2 ", r"^fwd_tc 64x64 s2 t128$", None),
    "D192-no-expand": (r"^splitkv 64x32 w8 s2 ", r"^fwd_tc 64x64 s2 t128$", None),
    "D32-no-flags": (r"^prefill 128x64 w4 s3", r"^fwd_tc 64x64 .*min_blocks=4", None),
    "noexp-split-C32": (None, r"^fwd_tc 128x64 .*S=\d+ .*lmk_cols=2", None),
    "noexp-split-DqkDv": (None, r"^fwd_tc 128x64 .*S=\d+ .*lmk_cols=1", None),
    "scale-split-neg": (r"^splitkv ", r"^fwd_tc (?!.*scale_fold).*S=\d+", None),
    "scale-split-zero": (r"^splitkv 16x32 ", None, None),
    "wide-view-decode": (None, r"^fwd_tc 64x64 .*S=\d+ .*v_chunk wide lmk_const\]", None),
    "wide-view-prefill": (None, r"^fwd_tc 64x64 (?!.*S=).*v_chunk wide lmk_const hoist_left=1 "
                                r"hoist_keys=1\]", None),
}


@pytest.mark.parametrize("name", list(REACH))
def test_reach_calls_plan_the_branch_they_are_for(name, monkeypatch):
    """Each ``reach`` call (CUDA only) still takes the kernel branch it was chosen for when
    both launchers plan it for an H200 (132 SMs, sm_90; meta tensors, no kernel built): a
    change of a launch table or rule that moves one off its branch fails here, not silently
    on the GPU tier. The BLHD-cache calls must reach TileLang with ``q`` BHLD and ``k`` /
    ``v`` BLHD, read in place."""
    import dataclasses
    import re

    import tilelang_impl.api as lapi
    import tilelang_impl.launch as LL
    import triton_impl.launch as TL
    from reference.validation import LOG2E, check_inputs
    from conformance.cases import _store

    for mod in (TL, LL):
        monkeypatch.setattr(mod, "sm_count", lambda d: 132)
        monkeypatch.setattr(mod, "capability", lambda d: (9, 0))
        monkeypatch.setattr(mod, "_PLANS", {})
    monkeypatch.setattr(TL, "_INTERPRETED", False)  # plan the GPU's kernels, not the interpreter's
    monkeypatch.setattr(TL, "_STRIDES_FIT", {})
    c = [c for c in FULL_CUDA if c.category == "reach"][list(REACH).index(name)]
    shapes = ((c.B, c.Hq, c.Lq, c.Dqk), (c.B, c.Hkv, c.Lk, c.Dqk), (c.B, c.Hkv, c.Lk, c.Dv))
    q, k, v = (_store(torch.empty(s, dtype=c.torch_dtype, device="meta"), lay)
               for s, lay in zip(shapes, input_layouts(c)))
    p = dataclasses.replace(check_inputs(q, k, v, **c.kwargs()), device=torch.device("cuda", 0))
    t_want, l_want, check = _REACH_PLANS[name]
    what = f"{name} (for {REACH[name][1]})"
    t_text = TL.describe(p, q, k, v)
    LL.check_limits(p)
    l_text = lapi._describe(p, q, k, v)
    if t_want:
        assert re.search(t_want, t_text), f"{what}: triton plans {t_text!r}"
    if l_want:
        assert re.search(l_want, l_text), f"{what}: tilelang plans {l_text!r}"
    if c.layout == "cache":
        (_, q_blhd, kv_blhd) = lapi._views(q, k, v)
        assert (q_blhd, kv_blhd) == (False, True) and "copies" not in l_text, (what, l_text)
    if check == "int64":
        assert max(TL._frame(p)) >= TL._I32, what
    elif check == "moved":
        assert p.kernel_frame()[0] < TL._I32 <= TL._frame(p)[0], what
    elif check == "lmk_one":
        chunk = TL._frame(p)[2]
        cx, _ = TL._plan(p).pick(chunk, p.sm_scale * LOG2E)
        assert cx["LMK_ONE"] and cx["MASK_LMK"], (what, cx)


def test_reach_rows_are_all_planned_and_cuda_only():
    assert set(_REACH_PLANS) == set(REACH)
    assert not [c for c in FULL_CPU if c.category == "reach"]
    assert len([c for c in FULL_CUDA if c.category == "reach"]) == len(REACH)


def test_cpu_quick_cases_stay_small():
    """Triton interpreter cost grows with programs x loop steps: keep CPU cases small
    (``long4m``'s long cache apart: its test above)."""
    for c in QUICK_CPU:
        if c.category != "long4m":
            assert c.Lq <= 333 and c.Lk <= 333 and c.B * c.Hq <= 48, c.id


def test_empty_rows_category_has_empty_rows():
    for c in (c for c in FULL_CPU if c.category == "empty_rows"):
        n = reference.visible_counts(c.Lq, c.Lk, window_size=c.window, chunk_size=c.chunk,
                                     mask_lmk=c.mask_lmk, expand_to_chunk=c.expand, kv_start=c.kv_start)
        assert bool((n == 0).any()), c.id


def test_poison_unseen_writes_through_views():
    """NaN exactly in the unseen slots of k and v, written through a BLHD transposed view
    and a column-sliced v; the mask returned is invisible_slots'; bad arguments refused."""
    c = Case(category="x", Lq=7, Lk=60, window=5, chunk=4, kv_start=3)
    g = torch.Generator().manual_seed(1)
    k_store = torch.randn(2, 60, 3, 8, generator=g)
    v_store = torch.randn(2, 3, 60, 12, generator=g)
    k, v = k_store.transpose(1, 2), v_store[..., 2:10]
    dead = poison_unseen(k, v, c.Lq, c.kwargs())
    assert torch.equal(dead, invisible_slots(c)) and dead.any() and (~dead).any()
    for t in (k_store.transpose(1, 2), v_store[..., 2:10]):
        assert t[:, :, dead].isnan().all() and t[:, :, ~dead].isfinite().all()
    assert v_store[..., :2].isfinite().all() and v_store[..., 10:].isfinite().all()  # outside the view
    with pytest.raises(TypeError, match="windw"):
        poison_unseen(k, v, c.Lq, dict(c.rule(), windw=3))
    with pytest.raises(ValueError, match="same Lk"):
        poison_unseen(k_store, v, c.Lq, c.kwargs())  # raw BLHD storage: H would be taken for Lk


def test_invisible_slots_match_the_mask():
    for c in [c for c in FULL_CPU if c.nan_slots][:20] + [Case(category="x", Lq=7, Lk=300, window=5, chunk=4,
                                                               kv_start=3)]:
        m = reference.visibility_mask(c.Lq, c.Lk, window_size=c.window, chunk_size=c.chunk,
                                      mask_lmk=c.mask_lmk, expand_to_chunk=c.expand, kv_start=c.kv_start)
        assert torch.equal(invisible_slots(c, block=3), ~m.any(dim=0)), c.id


def test_inputs_seeded_fresh_and_never_zero():
    c = Case(category="x", Lq=20, Lk=40)
    q1, k1, v1, kw = make_inputs(c, 5)
    q2, _, _, _ = make_inputs(c, 5)
    q3, _, _, _ = make_inputs(c, 6)
    assert torch.equal(q1, q2) and not torch.equal(q1, q3)
    assert case_seed(c, 5) != case_seed(Case(category="x", Lq=21, Lk=40), 5)
    assert kw == c.kwargs()
    for t in (q1, k1, v1):
        assert t.dtype == torch.bfloat16 and bool((t != 0).any())


def test_logits_are_informative():
    """Softmax neither uniform nor one-hot, also with an explicit sm_scale."""
    for scale in (None, 0.05, 1.0):
        c = Case(category="x", dtype="fp32", Lq=64, Lk=64, sm_scale=scale, B=1)
        q, k, v, kw = make_inputs(c, 0)
        s = (q[:, :1] @ k[:, :1].transpose(-1, -2)) * (kw["sm_scale"] or 1 / math.sqrt(c.Dqk))
        assert 0.8 < float(s.std()) < 3.0, scale


@pytest.mark.parametrize("layout", ["bhld", "bthd", "pad", "padt", "pad16", "mix", "cache"])
def test_layouts(layout):
    c = Case(category="x", layout=layout, Lq=10, Lk=20, dtype="fp32")
    q, k, v, _ = make_inputs(c, 1)
    qc, kc, vc, _ = make_inputs(Case(category="x", layout="bhld", Lq=10, Lk=20, dtype="fp32"), 1)
    assert q.shape == qc.shape and k.shape == kc.shape and v.shape == vc.shape
    if layout in ("pad", "padt", "pad16"):
        for t in (q, k, v):
            assert t.storage_offset() > 0 and not t.is_contiguous()
            full = torch.as_strided(t, (t.untyped_storage().nbytes() // 4,), (1,), 0)
            assert bool(full.isnan().any()) and not bool(t.isnan().any())
    if layout == "pad16":  # what the TMA kernels need: 16-byte base and strides, NaN around
        for dt in ("bf16", "fp16", "fp32"):
            for t in make_inputs(Case(category="x", layout=layout, Lq=10, Lk=20, dtype=dt), 1)[:3]:
                es = t.element_size()
                assert t.data_ptr() % 16 == 0 and t.stride(-1) == 1
                assert all((s * es) % 16 == 0 for s in t.stride()[:-1])
    if layout == "bthd":
        assert q.transpose(1, 2).is_contiguous() and not q.is_contiguous()
    if layout == "cache":  # fresh BHLD queries, a BLHD key/value cache read in place
        assert q.is_contiguous()
        assert all(t.transpose(1, 2).is_contiguous() and not t.is_contiguous() for t in (k, v))


def test_nan_slots_inputs():
    c = Case(category="x", Lq=5, Lk=100, window=8, chunk=4, kv_start=3, nan_slots=True, layout="padt")
    q, k, v, kw = make_inputs(c, 0)
    dead = invisible_slots(c)
    assert bool(dead.any())
    assert bool(k[:, :, dead].isnan().all()) and not bool(k[:, :, ~dead].isnan().any())
    o, lse = reference.golden(q, k, v, **kw)
    assert not bool(o.isnan().any())


def test_error_cases_break_their_rule():
    for c in [c for c in FULL_CUDA if c.error]:
        if c.error == "mixed_device":
            continue
        q, k, v, kw = make_inputs(c, 0, device="cpu")
        with pytest.raises(ValueError):
            reference.check_inputs(q, k, v, **kw)


def test_generate_rejects_unknown():
    with pytest.raises(ValueError, match="tier"):
        generate("medium")
    with pytest.raises(ValueError, match="categories"):
        generate("quick", categories=["nope"])


def test_tile_chunk_gpu_grids_take_the_paths_they_are_for(monkeypatch):
    """The GPU tile_chunk cases come in two grids (conformance.cases._tile_chunk_build):
    2 x 12/4 heads put both backends on their prefill grid (TileLang's D = 96 prefill
    kernel at C < 64 once failed to compile and no case reached it), 1 x 4/2 heads are a
    small grid: TileLang's default path keeps the prefill grid there too (windows of C + 5
    keys reach under launch.SPLIT_MIN_TILES key tiles), and the optional backend
    tilelang-split runs them on split-KV for Dv 96 and 128 (launch.splits_at,
    launch.forced_splits). Checked with the launchers' own choices on an H200-sized
    device (132 SMs)."""
    from tilelang_impl import launch as tl_launch
    from triton_impl import launch as tr_launch

    monkeypatch.setattr(tl_launch, "sm_count", lambda device: 132)
    monkeypatch.setattr(tr_launch, "sm_count", lambda device: 132)
    tc = [c for c in FULL_CUDA if c.category == "tile_chunk"]
    seen = set()
    for c in tc:
        q = torch.empty((c.B, c.Hq, c.Lq, c.Dqk), dtype=torch.bfloat16, device="meta")
        k = torch.empty((c.B, c.Hkv, c.Lk, c.Dqk), dtype=torch.bfloat16, device="meta")
        v = torch.empty((c.B, c.Hkv, c.Lk, c.Dv), dtype=torch.bfloat16, device="meta")
        p = reference.check_inputs(q, k, v, **c.kwargs())
        tl_split = tl_launch.split_plan(p)[0] > 1  # as run_cuda
        tr_path = tr_launch.choose_path(p)
        grid = "prefill" if c.Hq == 12 else "split"
        seen.add((grid, c.Dv))
        if grid == "prefill":
            assert not tl_split and tr_path == "prefill", c.id
        else:
            assert not tl_split, c.id
            if tl_launch.splits_at(c.Dqk, c.Dv):
                assert tl_launch.forced_splits(p) >= 2, c.id
                assert tl_launch.grid_programs(p, 64) * 2 < 132, c.id  # a small grid
    assert seen == {(g, d) for g in ("prefill", "split") for d in (64, 96, 128)}


def test_every_nan_slots_case_has_a_slot_to_poison():
    """A nan_slots case whose queries see every key would test nothing: the category drops
    such rows (they were 4 of its CPU quick cases)."""
    from reference.mask import seen_keys
    for tier, dev in (("quick", "cpu"), ("full", "cpu"), ("quick", "cuda"), ("full", "cuda")):
        cases = [c for c in generate(tier, dev) if c.category == "nan_slots"]
        assert cases
        for c in cases:
            assert not seen_keys(c.Lq, c.Lk, **c.rule()).all(), c.id


def test_strided_inputs_at_every_head_dim_and_in_multi_head_decode():
    """headdim runs BLHD views and NaN-padded views too, at every head-dim pair; decode has
    strided caches with several key/value heads (their head stride matters)."""
    for dev in ("cpu", "cuda"):
        cases = generate("quick", dev)
        dims = {(c.Dqk, c.Dv) for c in cases if c.category == "headdim"}
        for layout in ("bthd", "padt"):
            assert {(c.Dqk, c.Dv) for c in cases if c.category == "headdim" and c.layout == layout}, layout
        assert {(c.Dqk, c.Dv) for c in cases if c.category == "headdim" and c.layout != "bhld"} == dims
        assert any(c.category == "decode" and c.layout != "bhld" and c.Hkv > 1 for c in cases)


def test_visibility_categories_poison_half_their_rows():
    """lengths, window, chunk, kv_start and flags: some rows NaN in every unseen slot (a leak
    is then exact), some clean; in every tier."""
    for tier, dev in (("quick", "cpu"), ("full", "cpu"), ("quick", "cuda"), ("full", "cuda")):
        cases = generate(tier, dev)
        for cat in ("lengths", "window", "chunk", "kv_start", "flags"):
            flags = {c.nan_slots for c in cases if c.category == cat}
            assert flags == {False, True}, (tier, dev, cat, flags)
