"""CPU smoke test of tools/lab_tilelang.py's pure-Python parts (no GPU, no compile)."""

import pytest

pytest.importorskip("tilelang", reason="tilelang is not installed")

from tools import lab_tilelang as L  # noqa: E402
from tilelang_impl import launch  # noqa: E402


# "nolmkcols" is the pre-lmk_cols shipped kernel, the same kernel as another variant
# per head dim (D=64: split, D=128: all); "shipped" is launch.shipped_config, the same
# kernel as "s5-rows+fold" from session 5 to 11 (and at D=128 as "fexp+sfold+wu32+lmkj0";
# "lmkcols" before), as "occ3-64x64v" at D = 64 in sessions 42-43 and "occ4-64x64v" since
# session 44; the lab compiles shared
# kernels once.
ALIASES = {"nolmkcols", "shipped"}
# session 45: "hoist" shipped (launch.TC_HOIST_LEFT; "shipped" stands for it), and "nohoist",
# the kernel shipped before, is occ4-64x64v's at D = 64 and occ3-64x64v's at D = 128
ALIASES |= {"nohoist"}
# session 46: "hkeys" shipped (launch.TC_HOIST_KEYS; "shipped" and "hoist" stand for it);
# "nohkeys", the kernel shipped in session 45, is its own kernel
ALIASES |= {"hkeys"}
# session 5's "s5" variants vary launch.shipped_config as it is: at D = 128 all three are the
# shipped kernel (noise checks); at D = 64 "s5-rows+fold" is what shipped after that lab
S5 = {"s5-rows", "s5-rows+fold", "s5+fold"}
# session 12's occupancy variants: occ2-64x128 shipped (the "shipped" kernel at both head
# dims until session 42, "prev-64x128"'s since, but for the view); at D = 128 all five are
# its kernel (64x64 with two CTAs per SM: the others' D = 64 tiles and CTA counts do not fit
# D = 128's shared memory)
OCC = {"occ2-64x128-s3", "occ2-64x64"}


def test_variants_are_distinct_kernels_and_base_is_the_tile_without_knobs():
    for D in (64, 128):
        assert L.VARIANTS["base"][0](D) == L.SESSION11_TILE
        # kernels of the timed shapes (mask_lmk, C = 64, default scale)
        sl2 = L.scale_log2(D)
        # lmk_rows_j0 acts only with lmk_zero="rows" (D = 128): at D = 64 its variants
        # are their base variants' kernels (launch.call_knobs drops the knob)
        skip = ALIASES | S5 | (set(J0) if D == 64 else set())
        # (below, "shipped at D = 128" is the config shipped before session 45's hoist_left,
        # nohoist's kernel there, which one-block calls still run)
        # session 7: pack drops at G = 1 (these keys), noj0-64 is shipped at D = 128
        skip |= {"pack"} | ({"noj0-64"} if D == 128 else set())
        skip |= {"occ2-64x128"} | (OCC if D == 128 else set())
        # session 25: vchunk was shipped then (permission 1), and zero-rows is another
        # variant's kernel at both head dims: vchunk's at D = 64 (C = 64 is below its 64 x 128
        # tile: permission 1 keeps the zeroing), occ2-64x128's at D = 128; vchunk-64x64 is
        # the shipped 64 x 64 tile at D = 128
        skip |= {"vchunk", "zero-rows"} | ({"vchunk-64x64"} if D == 128 else set())
        # session 26: vchunk2 is the shipped kernel since session 28 (launch.TC_V_CHUNK = 2;
        # "shipped" is skipped above, so vchunk2 stands for it at D = 64), and at D = 128 so
        # is the occ2-128x64 pair
        skip |= {"vchunk2", "occ2-128x64", "occ2-128x64-s3"} if D == 128 else set()
        # session 40: occ3-64x64v-slack8 is shipped at D = 128, as occ3-64x64v is (which
        # stands for it there)
        skip |= {"occ3-64x64v-slack8"} if D == 128 else set()
        # session 43: occ4-64x64v is the shipped kernel at D = 128 too
        skip |= {"occ4-64x64v"} if D == 128 else set()
        # session 41: occ3-64x64v-allwarps was shipped-allwarps at D = 128 until session 45
        # (and at D = 64 in sessions 42-43, while occ3-64x64v shipped); since hoist_left they
        # differ there; prev-64x128 (session 42) is the config occ3 replaced: vchunk2's kernel
        # at D = 64, the shipped one at D = 128
        skip |= {"prev-64x128"}
        # session 51: s3 and ovl-lean-s3 change the stages above D = 64 only: the shipped
        # kernel and ovl-lean's at D = 64
        skip |= {"s3", "ovl-lean-s3"} if D == 64 else set()
        # session 52: pp-occ2 and pp-async-occ2 take two CTAs an SM at D = 64 only: pp's and
        # pp-async's kernels at D = 128
        skip |= {"pp-occ2", "pp-async-occ2"} if D == 128 else set()
        keys = [launch.tc_kernel_args(L.VARIANTS[n][0](D), True, L.C_T, sl2, view=True, Dv=D)
                for n in L.VARIANTS if n not in skip]
        # every variant but the tile alternative (same as base tile for none) is its own kernel
        assert len(set(keys)) == len(keys), keys
        assert launch.tc_kernel_args(L.VARIANTS["base"][0](D), True, L.C_T)[2] == ()


def test_shipped_and_lmkcols_variants():
    """nolmkcols = the session-4 shipped config with lmk_cols off; lmkcols = the
    session-4 shipped config, whose kernel at C = 64 on 128-key tiles tests two
    landmark columns; shipped = launch.shipped_config = fexp+sfold+wu32+lmkj0."""
    for D in (64, 128):
        ship, lmk = L.VARIANTS["nolmkcols"][0](D), L.VARIANTS["lmkcols"][0](D)
        assert lmk == L._session4(D) and lmk[:4] == L.SESSION11_TILE
        sl2 = L.scale_log2(D)

        def kern(name):
            return launch.tc_kernel_args(L.VARIANTS[name][0](D), True, L.C_T, sl2)
        now = launch.tc_kernel_args(launch.shipped_config(D, D), True, L.C_T, sl2)
        # session 45: shipped = hoist (launch.TC_HOIST_LEFT) at both head dims; nohoist, the
        # kernel shipped before, = occ4-64x64v at D = 64 (shipped in session 44; occ3-64x64v
        # in sessions 42-43, the same kernel at three CTAs); prev-64x128 = the config occ3
        # replaced, launch.short_config (session 12's occ2-64x128 tile and the knobs since):
        # at D = 128 nohoist's config, and occ3's and occ4's there
        # session 46: shipped = hkeys (launch.TC_HOIST_KEYS) too; nohkeys, the kernel shipped
        # in session 45, = shipped without hoist_keys; nohoist keeps the kernel it named then
        prev, nohoist = kern("prev-64x128"), kern("nohoist")
        assert kern("shipped") == now == kern("hoist") == kern("hkeys") != nohoist
        hoists = (launch._KNOB["hoist_left"], launch._KNOB["hoist_keys"])
        assert now[2] == launch.trimmed_knobs(1 if i in hoists else k
                                              for i, k in enumerate(launch.full_knobs(nohoist[2])))
        nohkeys = kern("nohkeys")
        assert nohkeys not in (now, nohoist) and nohkeys[:2] == now[:2]
        assert nohkeys[2] == launch.trimmed_knobs(
            0 if i == launch._KNOB["hoist_keys"] else k
            for i, k in enumerate(launch.full_knobs(now[2])))
        assert nohoist == kern("occ4-64x64v") and prev[1:] == kern("occ2-64x128")[1:]
        occ3 = kern("occ3-64x64v")
        assert (occ3 == nohoist) == (D == 128)
        if D == 64:
            assert occ3[:2] == nohoist[:2] and occ3[2] == tuple(
                3 if i == launch._KNOB["min_blocks"] else k for i, k in enumerate(nohoist[2]))
        assert now[1] == ((64, 64, 2, 128) if D == 64 else launch.tc_config(D, D))
        assert (prev == nohoist) == (D == 128) and prev[1] == launch.tc_config(D, D)
        assert L.VARIANTS["base"][0](D) == L.SESSION11_TILE
        # the session-5 knobs, on session 12's tile with two CTAs per SM
        s5 = kern("s5-rows+fold")
        assert s5[1] == L.SESSION11_TILE
        assert prev[2] == launch.call_knobs(s5[2] + (False, launch.TC_MIN_BLOCKS), True, L.C_T,
                                            prev[1][1], sl2)
        if D == 128:  # every s5 variant is one kernel, and so is the session-5 lab's best
            assert kern("s5-rows") == kern("s5+fold") == kern("fexp+sfold+wu32+lmkj0") == s5
        else:  # D = 64: three kernels besides the session-4 one with the same three knobs
            ks = [kern(n) for n in ("s5-rows", "s5-rows+fold", "s5+fold", "fexp+sfold+wu32")]
            assert len(set(ks)) == 4
        for name in OCC:
            assert (kern(name) == prev) == (D == 128), name
        assert ship[:7] == lmk[:7] and ship[7] == 0
        k_ship = launch.tc_kernel_args(ship, True, L.C_T)
        k_lmk = launch.tc_kernel_args(lmk, True, L.C_T)
        assert k_lmk[:2] == k_ship[:2] and k_lmk[2] == tuple(ship[4:7]) + (2,)
        assert len(k_ship[2]) <= 3  # no lmk_cols
        # C below block_N / 2: the lmkcols variant takes the general kernel
        assert launch.tc_kernel_args(lmk, True, 16) == k_ship
    assert L.VARIANTS["lmkcols"][2] and "D128" in L.VARIANTS["lmkcols"][2]  # a prediction


def test_kernel_jobs_cover_cases_and_shapes():
    names = ["base", "all", "nolmkcols", "lmkcols", "shipped"] + NEW
    jobs = L.kernel_jobs(names)
    for name, kind, args in jobs:
        assert kind in ("fwd_tc", "fwd_tc_nows")
        assert args[2] == "bfloat16" and args[11] is False  # prefill grid
    # every kernel a case or timed shape launches is compiled up front, once per variant
    have = {(n, k, a) for n, k, a in jobs}
    assert len(have) == len(jobs)
    calls = [(D, f, L.frame_chunk(**kw), L.scale_log2(D, **kw)) for _, D, f, kw in L.CASES]
    calls += [(s[6], (True, True), L.frame_chunk(s[4], s[5], L.W_T, L.C_T, 0), L.scale_log2(s[6]))
              for s in L.SHAPES]
    for name in names:
        for D, (lmk, exp), C, sl2 in calls:
            kind, args = launch.tc_kernel_key(D, D, "bfloat16", lmk, exp, False, False,
                                              L.VARIANTS[name][0](D), C, sl2)
            assert (name, kind, args) in have
    lmk_cols = {a[15] for n, _, a in jobs if n == "lmkcols" and len(a) > 15}
    assert lmk_cols == {1, 2}  # C192 / frame Lk+1 cases, and C = 64
    # the session-6 variants compile both scale paths: scale_fold on (sm_scale > 0) and
    # off (the sm_scale <= 0 cases), for both head dims
    for name in NEW[1:]:
        folds = {(a[0], a[17] if len(a) > 17 else False) for n, _, a in jobs if n == name}
        assert folds == {(64, True), (64, False), (128, True), (128, False)}, (name, folds)


NEW = ["fexp", "fexp+sfold", "fexp+sfold+wu32"]


def test_new_variants_bake_their_knobs_on_top_of_shipped():
    """fexp / fexp+sfold / fexp+sfold+wu32 are the session-4 shipped config plus the
    knobs of their name (cumulative), each with a written prediction; scale_fold only
    for a positive scale (launch.scale_fold_ok)."""
    names = [n for n, _ in launch.TC_KNOBS]
    for D in (64, 128):
        ship = L.VARIANTS["lmkcols"][0](D)
        for name, on in zip(NEW, [{"fast_exp2"}, {"fast_exp2", "scale_fold"},
                                  {"fast_exp2", "scale_fold", "win_u32"}]):
            cfg = L.VARIANTS[name][0](D)
            assert cfg[:4 + len(ship) - 4] == ship
            for n in ("fast_exp2", "scale_fold", "win_u32"):
                assert cfg[4 + names.index(n)] == (n in on), (name, n)
            assert "SASS" in L.VARIANTS[name][2]
            on_pos = launch.tc_kernel_args(cfg, True, L.C_T, L.scale_log2(D))[2]
            on_neg = launch.tc_kernel_args(cfg, True, L.C_T, L.scale_log2(D, sm_scale=-0.2))[2]
            assert (len(on_pos) > 5 and on_pos[5]) == ("scale_fold" in on)
            assert not (len(on_neg) > 5 and on_neg[5])
    # the lab's correctness cases reach sm_scale zero and negative, and a positive one
    scales = {kw.get("sm_scale") for _, _, _, kw in L.CASES}
    assert {0.0, None} <= scales and any(s is not None and s < 0 for s in scales)
    assert any(s is not None and s > 0 for s in scales)


def test_fold_events_and_table():
    ev = [dict(ev="start", variant="base"),
          dict(ev="check", variant="base", case="c1", ok=True, err_o=0.01),
          dict(ev="time", variant="base", shape=L.SHAPES[0][0], us=100.0, tflops=50.0),
          dict(ev="done", variant="base", timed=True),
          dict(ev="start", variant="all"),
          dict(ev="check", variant="all", case="c1", ok=False, err_o=1.0),
          dict(ev="done", variant="all", timed=False),
          dict(ev="start", variant="rows"),
          dict(ev="time", variant="rows", shape=L.SHAPES[0][0], us=50.0, tflops=100.0)]
    res = L.fold_events(ev, {})
    v = res["variants"]
    assert v["base"]["status"] == "timed"
    assert v["all"]["status"].startswith("failed correctness") and "c1" in v["all"]["status"]
    assert v["rows"]["status"] == "running" and v["rows"]["last"]["shape"] == L.SHAPES[0][0]
    t = L.table(res)
    assert "2.00x" in t and "base" in t and "all" in t


def test_flops_counts_visible_pairs():
    # one query, full window of 3 keys, no landmark inside: 4 * D * 3
    assert L.flops(1, 1, 1, 3, 64, W=3, C=100) == 4 * 64 * 3


J0 = {"lmkj0": "lmkcols", "fexp+sfold+wu32+lmkj0": "fexp+sfold+wu32"}


def test_lmk_rows_j0_variants():
    """lmkj0 / fexp+sfold+wu32+lmkj0 = their base variant plus lmk_rows_j0, baked for the
    D = 128 kernels with mask_lmk (lmk_zero="rows"), the same kernel as the base at D = 64
    and without mask_lmk; a written prediction; the lab's cases reach the knob with NaN in
    landmark slots at C < block_N, C == block_N, C > block_N and the frame's C = Lk + 1."""
    for name, base in J0.items():
        assert "SASS" in L.VARIANTS[name][2]
        for D in (64, 128):
            cfg, bcfg = L.VARIANTS[name][0](D), L.VARIANTS[base][0](D)
            for lmk, C in ((True, 64), (True, 16), (True, 200), (False, 64)):
                k = launch.tc_kernel_args(cfg, lmk, C, L.scale_log2(D))
                kb = launch.tc_kernel_args(bcfg, lmk, C, L.scale_log2(D))
                if D == 128 and lmk and launch.lmk_cols_for(2, True, C, 128):
                    assert k[2][:-1] == kb[2] + (False,) * (7 - len(kb[2])) and k[2][-1] is True
                else:  # D = 64's base zeroes whole tiles; C = 16: no landmark columns baked
                    assert k == kb
    jobs = L.kernel_jobs(list(J0))
    baked = {(a[15] if len(a) > 15 else 0) for n, _, a in jobs
             if n == "lmkj0" and len(a) > 19 and a[19]}
    assert baked == {1, 2}  # one row (C128, C192, Lk+1), two (C64); never the general test
    cases = [(D, kw) for _, D, (lmk, _), kw in L.CASES if D == 128 and lmk]
    chunks = {L.frame_chunk(**kw) for _, kw in cases if kw.get("nan_slots")}
    assert any(C < 128 for C in chunks) and 128 in chunks and any(C > 128 for C in chunks)
    assert any(kw["chunk_size"] > kw["Lk"] + kw["kv_start"] for _, kw in cases)


def test_decode_variants_compile_what_their_runs_launch(monkeypatch):
    """Every kernel a decode variant's runner asks launch._kernel for, on each decode
    case and timed shape (meta tensors, kernels replaced by a recorder, 132 SMs), is in
    kernel_jobs; split variants split (S >= 2) and add the combine; each variant has a
    written prediction."""
    import torch
    from reference.validation import check_inputs

    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    asked = []
    monkeypatch.setattr(launch, "_kernel",
                        lambda kind, *a: asked.append((kind, a)) or (lambda *x: None))
    calls = [(D, f, kw) for _, D, f, kw in L.DECODE_CASES]
    calls += [(s[6], (True, True), dict(B=s[1], Hq=s[2], Hkv=s[3], Lq=s[4], Lk=s[5],
                                        window_size=L.W_T, chunk_size=L.C_T, kv_start=0))
              for s in L.DECODE_SHAPES]
    for name, (fn, change, prediction) in L.DECODE_VARIANTS.items():
        assert name.startswith("dec-") and change and prediction
        jobs = {(k, a) for _, k, a in L.kernel_jobs([name])}
        for D, (lmk, exp), kw in calls:
            cfg, split = fn(D)
            asked.clear()
            shp = dict(kw)
            B, Hq, Hkv, Lq, Lk = (shp.pop(n) for n in ("B", "Hq", "Hkv", "Lq", "Lk"))
            for n in ("nan_slots", "tail_nan", "seed"):
                shp.pop(n, None)
            q = torch.empty(B, Hq, Lq, D, dtype=torch.bfloat16, device="meta")
            k = torch.empty(B, Hkv, Lk, D, dtype=torch.bfloat16, device="meta")
            L._runner(cfg, split)(q, k, k, dict(shp, mask_lmk=lmk, expand_to_chunk=exp))
            assert asked and set(asked) <= jobs, (name, D, kw, asked)
            p = check_inputs(q, k, k, mask_lmk=lmk, expand_to_chunk=exp, **shp)
            assert (L._splits(p, cfg, split) >= 2) == bool(split)
            tc = [a for kind, a in asked if kind == "fwd_tc"]
            assert len(tc) == 1 and tc[0][11] == bool(split), (name, D, tc)  # the kernel's split flag
            combines = [(kind, a) for kind, a in asked if kind.startswith("combine")]
            assert bool(combines) == bool(split)
            assert combines in ([], [launch.combine_key(tc[0])]), (name, D, combines)


def test_table_has_a_decode_block_in_microseconds():
    res = dict(variants={
        "base": dict(status="timed", times={L.SHAPES[0][0]: dict(us=100.0, tflops=200.0)}),
        "dec-shipped": dict(status="timed", times={L.DECODE_SHAPES[0][0]: dict(us=20.0, tflops=1.0)}),
        "dec-split-64": dict(status="timed", times={L.DECODE_SHAPES[0][0]: dict(us=10.0, tflops=2.0)}),
    })
    t = L.table(res)
    assert "TFLOP/s" in t and "microseconds" in t and "2.00x" in t and "  200.0" in t
    assert "   20.0" in t and "   10.0" in t


def test_table_headers_tell_decode_shapes_apart_and_skip_untimed_references():
    res = dict(variants={
        "dec-split-64": dict(status="compile failed", checks={}, times={}),
        "dec-split-knobs": dict(status="timed", times={s[0]: dict(us=10.0, tflops=1.0)
                                                       for s in L.DECODE_SHAPES}),
        "dec-shipped": dict(status="timed", times={s[0]: dict(us=20.0, tflops=1.0)
                                                   for s in L.DECODE_SHAPES}),
    })
    t = L.table(res)
    assert "B1 H32 D128 8K" in t and "B1 H32 D128 128K" in t
    assert "relative to 'dec-shipped'" in t and "2.00x" in t
    del res["variants"]["dec-shipped"]
    assert "relative to 'dec-split-knobs'" in L.table(res)
