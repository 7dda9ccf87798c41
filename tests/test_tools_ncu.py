"""CPU tests of tools/gpu_ncu.py: the parsing of Nsight Compute's CSV pages and the CLI's
refusals (the profiling itself needs the device and ncu)."""

from __future__ import annotations

import json
import tarfile

import pytest

from tools import gpu_ncu

RAW = (
    '"ID","Kernel Name","gpu__time_duration.sum","smsp__issue_active.avg.pct_of_peak_sustained_active",'
    '"sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",'
    '"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","l1tex__t_bytes.sum",'
    '"dram__bytes_read.sum.pct_of_peak_sustained_elapsed",'
    '"sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active"\n'
    '"","","usecond","%","%","ratio","ratio","ratio","byte","%","%"\n'
    '"0","_swa_fwd_tma_kernel","228.50","41.2","38.9","0.50","0","2.25","1,024","18.4","39.8"\n'
    '"1","_swa_combine_kernel","2,000.5","n/a","3.0","0.1","0.7","0.3","5","1.0","2.0"\n'
)


def test_parse_raw_reads_units_numbers_and_thousands_separators():
    rows = gpu_ncu.parse_raw("==PROF== noise\n" + RAW)
    assert len(rows) == 2
    assert rows[0]["Kernel Name"] == "_swa_fwd_tma_kernel"
    assert rows[0]["gpu__time_duration.sum"] == 228.5
    assert rows[1]["gpu__time_duration.sum"] == 2000.5
    assert rows[0]["l1tex__t_bytes.sum"] == 1024.0
    assert rows[1]["smsp__issue_active.avg.pct_of_peak_sustained_active"] == "n/a"
    assert rows[0]["_units"]["gpu__time_duration.sum"] == "usecond"
    assert gpu_ncu.parse_raw("") == []


def test_summarize_kernel_keeps_named_metrics_and_sorts_positive_stalls():
    k = gpu_ncu.summarize_kernel(gpu_ncu.parse_raw(RAW)[0])
    assert k["kernel"] == "_swa_fwd_tma_kernel"
    assert k["duration_us"] == pytest.approx(228.5)
    assert k["metrics"]["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"] == 38.9
    assert "l1tex__t_bytes.sum" not in k["metrics"]          # not in KEEP
    assert list(k["stalls"]) == ["long_scoreboard", "wait"]  # sorted, the zero dropped
    assert k["units"]["gpu__time_duration.sum"] == "usecond" and "l1tex__t_bytes.sum" not in k["units"]
    ns = gpu_ncu.parse_raw(RAW.replace('"usecond"', '"nsecond"'))[0]
    assert gpu_ncu.summarize_kernel(ns)["duration_us"] == pytest.approx(0.2285)
    # ncu 2025+ prints the short unit names
    us = gpu_ncu.parse_raw(RAW.replace('"usecond"', '"us"'))[0]
    assert gpu_ncu.summarize_kernel(us)["duration_us"] == pytest.approx(228.5)
    assert gpu_ncu.summarize_kernel(gpu_ncu.parse_raw(RAW.replace('"usecond"', '"parsec"'))[0])[
        "duration_us"] is None


SOURCE = (
    '"Kernel Name","_swa_fwd_tma_kernel",\n'
    '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"\n'
    '"0x10","HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ","5","4"\n'
    '"0x20","@P0 BRA 0x30","1","1"\n'
    '"0x30","MUFU.EX2 R3, R3","12","10"\n'
    '"0x40","@!UP1 MUFU.EX2 R4, R4","3","2"\n'
    '"Kernel Name","_swa_combine_kernel",\n'
    '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"\n'
    '"0x10","EXIT","2","2"\n'
)


def test_parse_sources_splits_kernels_and_groups_by_opcode_without_predicates():
    a, b = gpu_ncu.parse_sources(SOURCE, top=2)
    assert (a["kernel"], b["kernel"]) == ("_swa_fwd_tma_kernel", "_swa_combine_kernel")
    assert a["samples"] == 21
    # the next table's "Kernel Name" row is not read as an instruction of this one
    assert a["by_opcode"] == {"MUFU.EX2": 15, "HGMMA.64x64x16.F32.BF16": 5, "BRA": 1}
    assert a["top"] == [[12, "MUFU.EX2 R3, R3"], [5, "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ"]]
    assert b["by_opcode"] == {"EXIT": 2}
    assert gpu_ncu.parse_sources("no table here\n") == []
    # a page without the name rows still splits by header
    bare = "".join(ln + "\n" for ln in SOURCE.splitlines() if not ln.startswith('"Kernel Name"'))
    assert [t["kernel"] for t in gpu_ncu.parse_sources(bare)] == [None, None]


def test_sources_attach_by_kernel_name_else_in_order():
    kernels = [gpu_ncu.summarize_kernel(r) for r in gpu_ncu.parse_raw(RAW)]
    srcs = gpu_ncu.parse_sources(SOURCE)
    gpu_ncu.attach_sources(kernels, srcs[::-1])        # tables in the other order
    assert kernels[0]["source"]["by_opcode"] == {"MUFU.EX2": 15, "HGMMA.64x64x16.F32.BF16": 5, "BRA": 1}
    assert kernels[1]["source"]["by_opcode"] == {"EXIT": 2}
    kernels = [gpu_ncu.summarize_kernel(r) for r in gpu_ncu.parse_raw(RAW)]
    gpu_ncu.attach_sources(kernels, [dict(t, kernel=None) for t in srcs])
    assert kernels[1]["source"]["samples"] == 2
    kernels = [gpu_ncu.summarize_kernel(r) for r in gpu_ncu.parse_raw(RAW)]
    gpu_ncu.attach_sources(kernels, [dict(srcs[0], kernel="other")])  # named, no match: none
    assert "source" not in kernels[0]


def test_table_and_summarize_round_trip(tmp_path, capsys):
    k = gpu_ncu.summarize_kernel(gpu_ncu.parse_raw(RAW)[0])
    k["source"] = gpu_ncu.parse_sources(SOURCE)[0]
    summary = {"triton__train-8k": {"status": "ok", "note": "gate: pass", "kernels": [k]},
               "tilelang__x": {"status": "failed", "note": "rc 3"}}
    (tmp_path / "ncu_summary.json").write_text(json.dumps(summary))
    assert gpu_ncu.main(["--summarize", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "_swa_fwd_tma_kernel: 228.5 us, issue 41.2 %, warps n/a, dram read 18.4 %, alu pipe 39.8 %" in text
    assert "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active = 38.9 %" in text
    assert "long_scoreboard 2.25, wait 0.50" in text
    assert "MUFU.EX2 71%" in text
    assert "tilelang__x: failed rc 3" in text


def test_cli_refuses_unknown_shapes_and_a_missing_out():
    with pytest.raises(SystemExit):
        gpu_ncu.main(["--out", "/tmp/x", "--shapes", "train-8k-32/32/128,nope"])
    with pytest.raises(SystemExit):
        gpu_ncu.main([])


def _fake_ncu(tmp_path, raw_rc: int) -> str:
    """A stand-in for ncu: profiling writes the report and prints the child's gate line;
    the raw page prints RAW (or fails with ``raw_rc``); the source page prints SOURCE."""
    (tmp_path / "raw.csv").write_text(RAW)
    (tmp_path / "source.csv").write_text(SOURCE)
    script = tmp_path / "ncu"
    script.write_text(f"""#!/usr/bin/env python3
import sys
a = sys.argv[1:]
if "-o" in a:
    open(a[a.index("-o") + 1] + ".ncu-rep", "w").write("rep")
    print("gate fake: pass")
elif "raw" in a:
    assert "--print-units" in a and "base" in a
    if {raw_rc}:
        sys.exit({raw_rc})
    print(open({str(tmp_path / "raw.csv")!r}).read())
else:
    print(open({str(tmp_path / "source.csv")!r}).read())
""")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("raw_rc", [0, 3])
def test_profile_with_a_stand_in_ncu_writes_the_summary_and_fails_on_no_data(tmp_path, raw_rc):
    out = tmp_path / "out"
    out.mkdir()
    rc = gpu_ncu.main(["--out", str(out), "--shapes", "train-8k-32/32/128", "--backends", "triton",
                       "--no-extra", "--ncu", _fake_ncu(tmp_path, raw_rc)])
    summary = json.loads((out / "ncu_summary.json").read_text())
    ent = summary["triton__train-8k-32-32-128"]
    with tarfile.open(out / "ncu.tar.xz") as tf:
        assert "ncu/ncu_summary.json" in tf.getnames()   # rides in the tarball too
    if raw_rc:
        assert rc == 1 and ent["status"] == "failed" and "rc 3" in ent["note"]
    else:
        assert rc == 0 and ent["status"] == "ok" and ent["note"] == "gate fake: pass"
        k0, k1 = ent["kernels"]
        assert k0["source"]["kernel"] == k0["kernel"] == "_swa_fwd_tma_kernel"
        assert k1["source"]["by_opcode"] == {"EXIT": 2}


def test_lab_variant_backends_are_checked_before_any_profile(tmp_path):
    assert gpu_ncu.lab_variant("tilelang:nohkeys") == "nohkeys"
    assert gpu_ncu.lab_variant("tilelang") is None and gpu_ncu.lab_variant("triton:x") is None
    tag = gpu_ncu._tag("tilelang:nohkeys", "train-8k-32/4/64")
    assert tag == "tilelang_lab-nohkeys__train-8k-32-4-64"
    # the lab variant "split" and the registered backend "tilelang-split" keep apart
    assert gpu_ncu._tag("tilelang:split", "s") != gpu_ncu._tag("tilelang-split", "s")
    ok = gpu_ncu.check_backends(["triton", "tilelang", "sdpa", "tilelang:nohkeys",
                                 "tilelang:vshift", "tilelang-split", "tilelang:split"],
                                ["train-8k-32/4/64", "chunk512of8k-32/32/128"])
    assert ok == []
    bad = gpu_ncu.check_backends(["tritn", "tilelang:nope", "tilelang:shipped", "triton", "triton"],
                                 ["train-8k-32/4/64", "decode-8k-32/32/128"])
    assert len(bad) == 4
    assert "unknown backend 'tritn'" in bad[0]
    assert "unknown lab variant 'nope'" in bad[1]
    assert "decode-8k-32/32/128 is not a prefill shape (decode)" in bad[2]
    assert "backends ['triton', 'triton'] would write the same files" in bad[3]
    # the CLI refuses them before ncu runs: a stand-in that fails the test if it is started
    trap = tmp_path / "ncu"
    trap.write_text("#!/bin/sh\necho started > " + str(tmp_path / "started") + "\nexit 1\n")
    trap.chmod(0o755)
    for backends, shapes in (("tilelang:nope", "train-8k-32/4/64"),
                             ("tilelang:nohkeys", "decode-8k-32/32/128"),
                             ("tritn", "train-8k-32/4/64")):
        with pytest.raises(SystemExit):
            gpu_ncu.main(["--out", str(tmp_path / "out"), "--shapes", shapes,
                          "--backends", backends, "--no-extra", "--ncu", str(trap)])
    assert not (tmp_path / "started").exists()


@pytest.mark.parametrize("variant", ["shipped", "nohkeys"])
def test_lab_runner_runs_the_variants_config_on_the_prefill_grid_into_poisoned_outputs(
        monkeypatch, variant):
    import torch

    from tilelang_impl import launch
    from tools import bench, lab_tilelang

    shape = next(s for s in bench.SHAPES if s.name == "train-4k-32/4/64")
    small = bench.Shape(shape.name, shape.kind, 1, 4, 2, shape.D, 200, 200)  # the D, fewer rows
    seen = []
    monkeypatch.setattr(launch, "run_cuda", lambda *a, **kw: seen.append((a, kw)))
    runner = gpu_ncu._lab_runner(variant, small)
    (q, k, v), = bench._inputs(small, "cpu", torch.float16, 1, seed=3)
    args = runner.prepare(q, k, v)
    o, lse = args[-2:]
    assert o.shape == q.shape and lse.shape == q.shape[:3]
    assert torch.isnan(o).all() and torch.isnan(lse).all()   # poisoned once, before any call
    assert runner.call(*args) == (o, lse) and runner.canonical
    (a, kw), = seen
    assert kw == {"force_split": 1, "config": lab_tilelang.VARIANTS[variant][0](small.D)}
    assert a[1] is q and a[6] is o and a[7] is lse and a[4:6] == (False, False)
    assert a[0].window_size == small.W and a[0].chunk_size == small.C


def _wait_source(kernel="hils_swa_fwd_tc_kernel"):
    rows = [  # address, text, samples, executed
        ("0x100", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R13+UR19], R6", 3, 100),
        ("0x110", "FADD R1, R2, R3", 7, 100),
        ("0x120", "@!P0  BRA 0x200", 40, 100),        # tests P0: the first wait
        ("0x130", "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR17+0x30], R2", 2, 10),
        ("0x140", "ISETP.NE.AND P1, PT, R1, RZ, PT", 1, 10),  # P1 written again: no wait
        ("0x150", "@!P1  BRA 0x300", 9, 10),
        ("0x160", "SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [UR17+0x38], R2", 1, 10),
        ("0x170", "@P2   BRA 0x400", 5, 10),          # taken when the phase completed
        ("0x180", "@!P2  BRA 0x999", 6, 10),          # target outside the table
        ("0x200", "MOV R7, R13", 0, 5),               # the first wait's retry path
        ("0x210", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R7+URZ], R6", 4, 25),
        ("0x220", "@!P0  NANOSLEEP.SYNCS 0x989680", 0, 25),
        ("0x230", "@!P0  SYNCS.PHASECHK.TRANS64 P0, [R7+URZ], R6", 0, 25),
        ("0x240", "@!P0  BRA 0x210", 0, 25),
        ("0x250", "BRA 0x130", 0, 5),
    ]
    head = ('"Address","Source","Warp Stall Sampling (All Samples)",'
            '"Warp Stall Sampling (Not-issued Samples)","Instructions Executed"\n')
    body = "".join(f'"{a}","{t}","{n}","0","{x:,}"\n' for a, t, n, x in rows)
    return f'"Kernel Name","{kernel}",\n' + head + body


def test_barrier_waits_pair_each_try_wait_with_the_branch_that_tests_it():
    (src,) = gpu_ncu.parse_sources(_wait_source())
    assert src["samples"] == 78
    assert src["waits"] == [
        {"at": "0x0", "barrier": "[R13+UR19]", "pred": "P0", "branch_at": "0x20",
         "samples": 43, "executed": 100, "retries": 25},
        {"at": "0x60", "barrier": "[UR17+0x38]", "pred": "P2", "branch_at": "0x80",
         "samples": 7, "executed": 10, "retries": None},
    ]
    # a page without counts: the same waits, no runs or retry rounds
    (bare,) = gpu_ncu.parse_sources(_wait_source().replace(',"Instructions Executed"', ""))
    assert [(w["samples"], w["executed"], w["retries"]) for w in bare["waits"]] == [
        (43, None, None), (7, None, None)]
    # without addresses no waits are found, the rest of the table is as before
    no_addr = "\n".join(ln.split(",", 1)[1] for ln in _wait_source().splitlines()[1:])
    (plain,) = gpu_ncu.parse_sources(no_addr)
    assert plain["waits"] == [] and plain["samples"] == 78
    assert gpu_ncu.parse_sources(SOURCE)[0]["waits"] == []


def test_by_count_groups_the_issued_instructions_by_how_often_each_ran():
    (src,) = gpu_ncu.parse_sources(_wait_source())
    assert src["by_count"] == {"total": 470, "groups": [
        [100, 3, 300, 50.0], [25, 4, 100, 4.0], [10, 6, 60, 24.0], [5, 2, 10, 0.0]]}
    assert gpu_ncu.by_count([(0, "A", 1.0, 3), (16, "B", 2.0, 3)], keep=1) == {
        "total": 6, "groups": [[3, 2, 6, 3.0]]}
    (bare,) = gpu_ncu.parse_sources(_wait_source().replace(',"Instructions Executed"', ""))
    assert bare["by_count"] == {}
    assert gpu_ncu.parse_sources(SOURCE)[0]["by_count"] == {}  # addresses, no counts


def test_summarize_reads_the_source_pages_again_from_the_runs_tar(tmp_path, capsys):
    k = gpu_ncu.summarize_kernel(gpu_ncu.parse_raw(RAW)[0])
    k["kernel"] = "hils_swa_fwd_tc_kernel"
    k["source"] = {"kernel": "hils_swa_fwd_tc_kernel", "samples": 1.0, "by_opcode": {"OLD": 1.0},
                   "top": []}  # a summary written before the waits existed
    old = dict(k, source=dict(k["source"]))
    summary = {"tilelang__x": {"status": "ok", "note": "", "kernels": [k]},
               "tilelang_lab-y__x": {"status": "ok", "note": "", "kernels": [old]}}
    (tmp_path / "ncu_summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    assert gpu_ncu.main(["--summarize", str(tmp_path)]) == 0  # no tar: the JSON as it is
    assert "OLD 100%" in capsys.readouterr().out
    page = tmp_path / "page.csv"
    page.write_text(_wait_source())
    with tarfile.open(tmp_path / "ncu.tar.xz", "w:xz") as tf:
        tf.add(page, arcname="ncu/tilelang__x.source.csv")  # only the first tag's page
    loaded = gpu_ncu.load_summary(str(tmp_path))
    assert loaded["tilelang__x"]["kernels"][0]["source"]["samples"] == 78
    assert loaded["tilelang_lab-y__x"]["kernels"][0]["source"]["by_opcode"] == {"OLD": 1.0}
    assert gpu_ncu.main(["--summarize", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "warp instructions issued: 470; by how often each instruction ran" in text
    assert "      100 x 3: 63.8%, 25 x 4: 21.3%, 10 x 6: 12.8%, 5 x 2: 2.1%\n" in text
    assert "mbarrier waits (try-wait + its branch): 64.1% of samples in 2 waits" in text
    assert "      0x0 [R13+UR19]: 55.1%, 100 runs, 25 retry rounds" in text
    assert "      0x60 [UR17+0x38]: 9.0%, 10 runs\n" in text
    assert "OLD 100%" in text  # the second tag kept its stored table
