"""CPU tests of tools/gpu_ncu.py: the parsing of Nsight Compute's CSV pages and the CLI's
refusals (the profiling itself needs the device and ncu)."""

from __future__ import annotations

import io
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
        ("0x100", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R13+UR19], R6", 3, 142848),
        ("0x110", "FADD R1, R2, R3", 7, 142848),
        ("0x120", "@!P0  BRA 0x300", 40, 142848),     # tests P0: a wait, TileLang's retry path
        ("0x130", "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR17+0x30], R2", 2, 1000),
        ("0x140", "ISETP.NE.AND P2, P1, R1, RZ, PT", 1, 1000),  # P1 written again: no wait
        ("0x150", "@!P1  BRA 0x400", 9, 1000),
        ("0x160", "SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [UR17+0x38], R2", 1, 1000),
        ("0x170", "@P2   BRA 0x500", 5, 1000),        # taken when the phase completed
        ("0x180", "@!UP2 BRA 0x500", 2, 1000),        # another predicate
        ("0x190", "@!P2  BRA 0x999", 6, 1000),        # a wait; its target outside the listing
        ("0x1a0", "SYNCS.PHASECHK.TRANS64.TRYWAIT P3, [UR9], R2", 1, 1000),
        ("0x1b0", "EXIT", 4, 1000),                   # the listing's next is not run next
        ("0x1c0", "@!P3  BRA 0x600", 0, 1000),
        ("0x1d0", "SYNCS.PHASECHK.TRANS64.TRYWAIT P4, [UR25], R2", 2, 2000),
        ("0x1e0", "@!P4  BRA `(.L_x_7)", 3, 2000),   # a wait; a label for a target
        ("0x1f0", "SYNCS.PHASECHK.TRANS64.TRYWAIT P5, [UR26], R2", 1, 2000),
        ("0x200", "@!P5  BRA 0x240", 2, 2000),        # a wait; its target an offset (0x340)
        ("0x300", "MOV R7, R13", 0, 5),               # TileLang's retry path: a NANOSLEEP loop
        ("0x310", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R7+URZ], R6", 4, 4351),
        ("0x320", "@!P0  NANOSLEEP.SYNCS 0x989680", 0, 4351),
        ("0x330", "@!P0  SYNCS.PHASECHK.TRANS64 P0, [R7+URZ], R6", 0, 4351),
        ("0x340", "SYNCS.PHASECHK.TRANS64.TRYWAIT P5, [UR26], R2", 0, 1234),  # a retry path
        ("0x350", "@!P5  BRA 0x370", 0, 1234),        # whose try-wait a branch tests
        ("0x360", "BRA 0x210", 0, 20),
        ("0x370", "NANOSLEEP.SYNCS 0x20", 0, 1200),
        ("0x380", "BRA 0x340", 0, 1200),
        ("0x390", "SYNCS.PHASECHK.TRANS64.TRYWAIT P6, [UR27], R2", 0, 7),  # Triton's retry
        ("0x3a0", "@!P6  BRA 0x390", 0, 7),           # path: a self-loop, no wait its own
    ]
    head = ('"Address","Source","Warp Stall Sampling (All Samples)",'
            '"Warp Stall Sampling (Not-issued Samples)","Instructions Executed"\n')
    body = "".join(f'"{a}","{t}","{n}","0","{x:,}"\n' for a, t, n, x in rows)
    return f'"Kernel Name","{kernel}",\n' + head + body


WAITS = [
    {"at": "0x0", "barrier": "[R13+UR19]", "pred": "P0", "branch_at": "0x20", "samples": 43,
     "executed": 142848, "retries": 4351},
    {"at": "0x60", "barrier": "[UR17+0x38]", "pred": "P2", "branch_at": "0x90", "samples": 7,
     "executed": 1000, "retries": None},
    {"at": "0xd0", "barrier": "[UR25]", "pred": "P4", "branch_at": "0xe0", "samples": 5,
     "executed": 2000, "retries": None},
    {"at": "0xf0", "barrier": "[UR26]", "pred": "P5", "branch_at": "0x100", "samples": 3,
     "executed": 2000, "retries": 1234},
]


def test_barrier_waits_pair_each_try_wait_with_the_branch_that_tests_it():
    (src,) = gpu_ncu.parse_sources(_wait_source())
    assert src["samples"] == 93
    assert src["waits"] == WAITS
    # a page without counts: the same waits, no runs or retry rounds
    (bare,) = gpu_ncu.parse_sources(_wait_source().replace(',"Instructions Executed"', ""))
    assert bare["waits"] == [dict(w, executed=None, retries=None) for w in WAITS]
    # without addresses no waits are found, the rest of the table is as before
    no_addr = "\n".join(ln.split(",", 1)[1] for ln in _wait_source().splitlines()[1:])
    (plain,) = gpu_ncu.parse_sources(no_addr)
    assert plain["waits"] == [] and plain["samples"] == 93
    assert gpu_ncu.parse_sources(SOURCE)[0]["waits"] == []


@pytest.mark.parametrize("text,pred,writes", [
    ("ISETP.NE.AND P2, P1, R1, RZ, PT", "P1", True),
    ("ISETP.GT.OR P0, PT, R10, R21, P0", "P0", True),
    ("ISETP.GT.OR P3, PT, R10, R21, P0", "P0", False),   # P0 a source
    ("IADD3 R4, P0, PT, R1, R2, RZ", "P0", True),
    ("FSEL R1, R2, R3, !P0", "P0", False),
    ("@!P0  SYNCS.PHASECHK.TRANS64 P0, [R7+URZ], R6", "P0", True),
    ("@P0 R2P PR, R3, 0x7f", "P4", True),
    ("NANOSLEEP.SYNCS 0x989680", "P0", False),
    ("ISETP.NE.AND P10, PT, R1, RZ, PT", "P1", False),
])
def test_writes_finds_a_predicate_among_the_leading_operands(text, pred, writes):
    assert gpu_ncu._writes(text, pred) is writes


def test_by_count_groups_the_issued_instructions_by_how_often_each_ran():
    (src,) = gpu_ncu.parse_sources(_wait_source())
    assert src["by_count"] == {"total": 464504, "groups": [
        [142848, 3, 428544, 50.0], [4351, 3, 13053, 4.0], [1000, 10, 10000, 31.0],
        [2000, 4, 8000, 8.0], [1234, 2, 2468, 0.0], [1200, 2, 2400, 0.0], [20, 1, 20, 0.0],
        [7, 2, 14, 0.0], [5, 1, 5, 0.0]]}
    assert gpu_ncu.by_count([(0, "A", 1.0, 3), (16, "B", 2.0, 3)], keep=1) == {
        "total": 6, "groups": [[3, 2, 6, 3.0]]}
    (bare,) = gpu_ncu.parse_sources(_wait_source().replace(',"Instructions Executed"', ""))
    assert bare["by_count"] == {}
    assert gpu_ncu.parse_sources(SOURCE)[0]["by_count"] == {}  # addresses, no counts


def _stored_summary():
    k = gpu_ncu.summarize_kernel(gpu_ncu.parse_raw(RAW)[0])
    k["kernel"] = "hils_swa_fwd_tc_kernel"
    k["source"] = {"kernel": "hils_swa_fwd_tc_kernel", "samples": 1.0, "by_opcode": {"OLD": 1.0},
                   "top": []}  # a summary written before the waits existed
    old = dict(k, source=dict(k["source"]))
    return {"tilelang__x": {"status": "ok", "note": "", "kernels": [k]},
            "tilelang_lab-y__x": {"status": "ok", "note": "", "kernels": [old]}}


def _tar(path, pages):
    with tarfile.open(path, "w:xz") as tf:
        for name, text in pages.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_summarize_reads_the_source_pages_again_from_the_runs_tar(tmp_path, capsys):
    (tmp_path / "ncu_summary.json").write_text(json.dumps(_stored_summary()))
    capsys.readouterr()
    assert gpu_ncu.main(["--summarize", str(tmp_path)]) == 0  # no tar: the JSON as it is
    assert "OLD 100%" in capsys.readouterr().out
    _tar(tmp_path / "ncu.tar.xz", {  # the first tag's page; the second's names other kernels
        "ncu/tilelang__x.source.csv": _wait_source(),
        "ncu/tilelang_lab-y__x.source.csv": _wait_source(kernel="other")})
    loaded = gpu_ncu.load_summary(str(tmp_path))
    assert loaded["tilelang__x"]["kernels"][0]["source"]["samples"] == 93
    assert loaded["tilelang_lab-y__x"]["kernels"][0]["source"]["by_opcode"] == {"OLD": 1.0}
    assert gpu_ncu.main(["--summarize", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "warp instructions issued: 464,504; by how often each instruction ran" in text
    assert ("      142,848 x 3: 92.3%, 4,351 x 3: 2.8%, 1,000 x 10: 2.2%, 2,000 x 4: 1.7%, "
            "1,234 x 2: 0.5%, 1,200 x 2: 0.5%\n") in text
    assert "mbarrier waits (try-wait + its branch): 62.4% of samples in 4 waits" in text
    assert "      0x0 [R13+UR19]: 46.2%, 142848 runs, 4351 retry rounds\n" in text
    assert "      0x60 [UR17+0x38]: 7.5%, 1000 runs\n" in text
    assert "OLD 100%" in text  # the second tag kept its stored table


def test_summarize_takes_a_stored_summary_and_its_csv_tar(tmp_path, capsys):
    (tmp_path / "ncu-abc-summary.json").write_text(json.dumps(_stored_summary()))
    _tar(tmp_path / "ncu-abc-csv.tar.xz", {"ncu/tilelang__x.source.csv": _wait_source()})
    capsys.readouterr()
    assert gpu_ncu.main(["--summarize", str(tmp_path / "ncu-abc-summary.json")]) == 0
    assert "in 4 waits" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gpu_ncu.main(["--summarize", str(tmp_path / "ncu-abc-csv.tar.xz")])
    assert "a run's folder or a NAME-summary.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_ncu.main(["--summarize", str(tmp_path / "nothing-summary.json")])
