"""CPU smoke test of tools/lab_tilelang.py's pure-Python parts (no GPU, no compile)."""

import pytest

pytest.importorskip("tilelang", reason="tilelang is not installed")

from tools import lab_tilelang as L  # noqa: E402
from tilelang_impl import launch  # noqa: E402


def test_variants_are_distinct_kernels_and_base_is_the_tile_without_knobs():
    for D in (64, 128):
        assert L.VARIANTS["base"][0](D) == launch.tc_config(D, D)
        keys = [launch.tc_kernel_args(L.VARIANTS[n][0](D)) for n in L.VARIANTS]
        # every variant but the tile alternative (same as base tile for none) is its own kernel
        assert len(set(keys)) == len(keys), keys
        assert launch.tc_kernel_args(L.VARIANTS["base"][0](D))[2] == ()


def test_kernel_jobs_cover_cases_and_shapes():
    jobs = L.kernel_jobs(["base", "all"])
    need = {(D, f) for _, D, f, _ in L.CASES} | {(s[6], (True, True)) for s in L.SHAPES}
    assert len(jobs) == 2 * len(need)
    for name, kind, args in jobs:
        assert kind in ("fwd_tc", "fwd_tc_nows")
        assert args[2] == "bfloat16" and args[11] is False  # prefill grid


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
