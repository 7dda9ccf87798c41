"""CPU smoke test of tools/lab_tilelang.py's pure-Python parts (no GPU, no compile)."""

import pytest

pytest.importorskip("tilelang", reason="tilelang is not installed")

from tools import lab_tilelang as L  # noqa: E402
from tilelang_impl import launch  # noqa: E402


# "shipped" is the pre-lmk_cols shipped kernel, the same kernel as another variant
# per head dim (D=64: split, D=128: all); the lab compiles shared kernels once.
ALIASES = {"shipped"}


def test_variants_are_distinct_kernels_and_base_is_the_tile_without_knobs():
    for D in (64, 128):
        assert L.VARIANTS["base"][0](D) == launch.tc_config(D, D)
        # kernels of the timed shapes (mask_lmk, C = 64)
        keys = [launch.tc_kernel_args(L.VARIANTS[n][0](D), True, L.C_T) for n in L.VARIANTS
                if n not in ALIASES]
        # every variant but the tile alternative (same as base tile for none) is its own kernel
        assert len(set(keys)) == len(keys), keys
        assert launch.tc_kernel_args(L.VARIANTS["base"][0](D), True, L.C_T)[2] == ()


def test_shipped_and_lmkcols_variants():
    """shipped = launch.shipped_config with lmk_cols off; lmkcols = launch.shipped_config,
    whose kernel at C = 64 on 128-key tiles tests two landmark columns."""
    for D in (64, 128):
        ship, lmk = L.VARIANTS["shipped"][0](D), L.VARIANTS["lmkcols"][0](D)
        assert lmk == launch.shipped_config(D, D)
        assert ship[:7] == lmk[:7] and ship[7] == 0
        k_ship = launch.tc_kernel_args(ship, True, L.C_T)
        k_lmk = launch.tc_kernel_args(lmk, True, L.C_T)
        assert k_lmk[:2] == k_ship[:2] and k_lmk[2] == tuple(ship[4:7]) + (2,)
        assert len(k_ship[2]) <= 3  # no lmk_cols
        # C below block_N / 2: the lmkcols variant takes the general kernel
        assert launch.tc_kernel_args(lmk, True, 16) == k_ship
    assert L.VARIANTS["lmkcols"][2] and "D128" in L.VARIANTS["lmkcols"][2]  # a prediction


def test_kernel_jobs_cover_cases_and_shapes():
    names = ["base", "all", "shipped", "lmkcols"]
    jobs = L.kernel_jobs(names)
    for name, kind, args in jobs:
        assert kind in ("fwd_tc", "fwd_tc_nows")
        assert args[2] == "bfloat16" and args[11] is False  # prefill grid
    # every kernel a case or timed shape launches is compiled up front, once per variant
    have = {(n, k, a) for n, k, a in jobs}
    assert len(have) == len(jobs)
    calls = [(D, f, L.frame_chunk(**kw)) for _, D, f, kw in L.CASES]
    calls += [(s[6], (True, True), L.frame_chunk(s[4], s[5], L.W_T, L.C_T, 0)) for s in L.SHAPES]
    for name in names:
        for D, (lmk, exp), C in calls:
            kind, base, knobs = launch.tc_kernel_args(L.VARIANTS[name][0](D), lmk, C)
            args = (D, D, "bfloat16", lmk, exp, False, False) + base + (False,) + knobs
            assert (name, kind, args) in have
    lmk_cols = {a[15] for n, _, a in jobs if n == "lmkcols" and len(a) > 15}
    assert lmk_cols == {1, 2}  # C192 / frame Lk+1 cases, and C = 64


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
