"""tools/lab_pool.py: pooling repeated lab_tilelang / ab_triton runs (CPU, synthetic files
plus the stored session 49 runs whose figures BENCHMARKS.md cites)."""

from __future__ import annotations

import glob
import json
import math
import os

import pytest

from tools import lab_pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lab(path, times: dict, status=None, failed=()):
    """A lab_tilelang.json: ``times`` = {variant: {row: us}} (TFLOP/s = 1000 / us; us None:
    the timing failed, recorded as the lab records it, an error and no time)."""
    def entry(us):
        return dict(error="RuntimeError: boom") if us is None else dict(
            us=us, us_median=us * 1.01, tflops=1000.0 / us)
    variants = {}
    for name, rows in times.items():
        variants[name] = dict(
            status=(status or {}).get(name, "timed"),
            checks={"case a": dict(ok=True), "case b": dict(ok=name not in failed)},
            times={r: entry(us) for r, us in rows.items()})
    rows = list(next(iter(times.values())))
    path.write_text(json.dumps(dict(commit="abc", shapes=rows, variants=variants)))
    return str(path)


def test_lab_runs_pool_per_row_and_leave_out_failed_runs(tmp_path, capsys):
    def runs(b1, b2, n1, n2):
        return {"shipped": {"r1": b1, "r2": b2}, "new": {"r1": n1, "r2": n2}}
    files = [
        _lab(tmp_path / "1.json", runs(100.0, 50.0, 98.0, 49.0)),
        _lab(tmp_path / "2.json", runs(100.0, 50.0, 102.0, 48.0)),
        _lab(tmp_path / "3.json", runs(101.0, 51.0, 95.0, 50.0)),
        # a run whose variant failed a check, and one where it hung: left out, named
        _lab(tmp_path / "4.json", runs(100.0, 50.0, 10.0, 5.0), failed=("new",)),
        _lab(tmp_path / "5.json", runs(100.0, 50.0, 10.0, 5.0),
             status={"new": "hung (no progress for 45s)"}),
        # a run whose r1 timing failed: r1 left out of it, r2 kept, not a gain on every row
        _lab(tmp_path / "6.json", runs(None, 50.0, 1.0, 40.0)),
    ]
    kind, docs = lab_pool.load(files)
    assert kind == "lab"
    p = lab_pool.pool_lab(docs)["new"]
    assert p["runs"] == 4 and p["every_row_runs"] == 2   # runs 1 and 3: both rows at or above 1
    assert len(p["left_out"]) == 2
    assert p["rows_left_out"] == [files[5] + ": ['r1'] (the timing failed)"]
    assert "4.json: new: failed checks ['case b']" in p["left_out"][0]
    assert "5.json: new: status 'hung" in p["left_out"][1]
    r1 = p["rows"]["r1"]
    assert r1["ratio"]["n"] == 3
    assert r1["ratio"]["median"] == pytest.approx(100 / 98)
    assert r1["ratio"]["min"] == pytest.approx(100 / 102)
    assert r1["ratio"]["max"] == pytest.approx(101 / 95)
    assert r1["at_or_above"] == 2
    assert r1["base_tflops"]["median"] == pytest.approx(10.0)
    r2 = p["rows"]["r2"]
    assert r2["ratio"]["n"] == 4 and r2["at_or_above"] == 4
    assert r2["ratio"]["median"] == pytest.approx((50 / 49 + 50 / 48) / 2)
    assert lab_pool.main(files + ["--md"]) == 0
    out = capsys.readouterr().out
    assert "new against shipped: 4 usable run(s); a gain on every row in 2 of them" in out
    assert "| r1 | 9.9 / 10.0 / 10.0 | 1.020 [0.980, 1.063] | 2 of 3 |" in out
    assert ("| row | shipped TFLOP/s min / median / max | new speed / shipped, median [range] |"
            in out)


def test_lab_base_missing_and_bad_files_are_refused(tmp_path, capsys):
    a = _lab(tmp_path / "a.json", {"x": {"r": 1.0}, "y": {"r": 2.0}})
    with pytest.raises(ValueError, match="base 'shipped' is in none of the runs"):
        lab_pool.pool_lab(lab_pool.load([a])[1])
    assert lab_pool.main([a]) == 2
    assert "base 'shipped' is in none" in capsys.readouterr().err
    assert lab_pool.main([a, "--base", "x"]) == 0
    other = tmp_path / "bench.json"
    other.write_text(json.dumps(dict(results=[])))
    ab = tmp_path / "ab.json"
    ab.write_text(json.dumps(dict(checks=[], timings=[])))
    for argv, msg in (([str(other)], "neither a lab_tilelang.json nor an ab_triton.json"),
                      ([a, str(ab)], "mix lab_tilelang and ab_triton"),
                      ([], "no file given"),
                      ([str(tmp_path / "missing.json")], "FileNotFoundError")):
        assert lab_pool.main(argv) == 2
        assert msg in capsys.readouterr().err


def test_ab_passes_pool_per_shape(tmp_path, capsys):
    def ab(path, passes, checks=None):
        doc = dict(checks=[], timings=[dict(shape=s, pass_index=i, base_us=b, new_us=n,
                                            max_diff_o=d, max_diff_lse=0.0)
                                       for i, (s, b, n, d) in enumerate(passes)])
        for t in doc["timings"]:
            if t["max_diff_o"] == "drop":   # a file without the key: the difference unknown
                del t["max_diff_o"]
        if checks:
            doc["checks_passed"] = checks
        path.write_text(json.dumps(doc))
        return str(path)
    files = [ab(tmp_path / "1.json", [("s", 10.0, 9.0, 0.0), ("t", 4.0, 4.0, 0.0),
                                      ("u", 4.0, 4.0, float("nan")), ("w", 4.0, 4.0, "drop")],
                "12/12"),
             ab(tmp_path / "2.json", [("s", 11.0, 10.0, 0.0), ("s", 10.0, 12.0, 2e-3),
                                      ("u", 4.0, 4.0, 0.0)])]
    kind, docs = lab_pool.load(files)
    assert kind == "ab"
    p = lab_pool.pool_ab(docs)
    s = p["shapes"]["s"]
    assert s["ratio"]["n"] == 3 and s["ratio"]["median"] == pytest.approx(1.1)
    assert s["ratio"]["min"] == pytest.approx(10 / 12)
    assert s["ratio"]["max"] == pytest.approx(10 / 9)
    assert s["best_ratio"] == pytest.approx(10 / 9) and s["max_diff"] == 2e-3
    assert p["shapes"]["t"]["max_diff"] == 0.0
    # NaN (a NaN output, two -inf LSE rows) or no record: unknown, never shown as exact
    assert math.isnan(p["shapes"]["u"]["max_diff"])
    assert math.isnan(p["shapes"]["w"]["max_diff"])
    assert p["checks"] == [(files[0], "12/12"), (files[1], "no checks")]
    assert lab_pool.main(files) == 0
    out = capsys.readouterr().out
    assert "checks: " + files[1] + ": no checks" in out
    assert "1.100 [0.833, 1.111]" in out and "0.002" in out


def test_the_stored_session_49_runs_give_the_figures_benchmarks_cites():
    labs = sorted(glob.glob(os.path.join(ROOT, "bench_results",
                                         "tilelang-lab49-h100-*.json")))
    assert len(labs) == 9
    p = lab_pool.pool_lab(lab_pool.load(labs)[1])["vshift"]
    assert p["runs"] == 9 and p["every_row_runs"] == 0 and not p["left_out"]
    med = {r: round(s["ratio"]["median"], 3) for r, s in p["rows"].items()}
    assert med == {"H32 D128 L8K": 0.999, "H32 D128 L16K": 1.004, "GQA32/4 D64 L8K": 1.003,
                   "GQA16/2 D64 L8K": 1.011, "B4 GQA32/4 D64 L4K": 1.007,
                   "chunk Lq512/Lk8K H32 D128": 0.983}
    abs_ = sorted(glob.glob(os.path.join(ROOT, "bench_results",
                                         "ab-triton-edge-shift-s49-h100-*.json")))
    q = lab_pool.pool_ab(lab_pool.load(abs_)[1])
    assert all(e["ratio"]["n"] == 11 and e["max_diff"] == 0 for e in q["shapes"].values())
    assert round(q["shapes"]["batch4x4K gqa32/4 D64"]["ratio"]["median"], 3) == 0.960
