"""hils-swa bench in CPU smoke mode: every code path but CUDA graphs (which need a GPU)."""

from __future__ import annotations

import json

import pytest
import torch

from reference import visibility_mask
from tools import bench


def test_smoke_run_writes_json_md_png(tmp_path, capsys):
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\nintro\n\n" + bench.MD_BEGIN + "\nold table\n" + bench.MD_END + "\n\n## after\nkeep me\n")
    js, png = tmp_path / "b.json", tmp_path / "b.png"
    rc = bench.main(["--device", "cpu", "--smoke", "--backend", "reference,flex", "--backend", "sdpa",
                     "--reps", "1", "--json", str(js), "--md", str(md), "--png", str(png)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "CUDA graphs skipped" in out
    data = json.loads(js.read_text())
    res = data["results"]
    assert len(res) == len(bench.SMOKE_SHAPES) * 3
    assert all(r["status"] == "ok" for r in res), [r for r in res if r["status"] != "ok"]
    assert all(r["eager_us"] > 0 and r["kernel_us"] is None for r in res)
    # on CPU the eager time is the host time of the same call (one repetition here)
    assert all(r["host_us"] > 0 and r["host_us"] == pytest.approx(r["eager_us"]) for r in res)
    assert all(r["gate"].startswith("pass") for r in res if r["backend"] != "sdpa")
    # the kernel column: a backend's describe_call ("" for these two), sdpa its own line
    assert all("no description" not in r["extra"]["kernel"] for r in res), [r["extra"] for r in res]
    assert all(r["extra"]["kernel"].startswith("SDPA, dense") for r in res if r["backend"] == "sdpa")
    assert all(r["gbps"] is not None for r in res if r["kind"] == "decode")
    text = md.read_text()
    assert "old table" not in text and "keep me" in text and text.startswith("# Benchmarks\n\nintro")
    assert text.count(bench.MD_BEGIN) == 1 and "| smoke-decode | flex |" in text
    # the timer's floor: a kernel-column figure, so none without CUDA graphs
    assert data["ceilings"]["floor1_us"] is None and data["ceilings"]["floor2_us"] is None
    assert "timer floor (kernel column of one / two one-block fill kernels) - / - µs, eager / host " \
        "columns of one fill kernel - / - µs" in text
    assert "| kernel µs | eager µs | host µs |" in text
    assert png.stat().st_size > 10_000


def test_gate_refuses_a_wrong_backend(capsys):
    rc = bench.main(["--device", "cpu", "--smoke", "--shapes", "smoke-chunked", "--backend",
                     "mutant:kv_start_ignored,mutant:window_off_by_one", "--reps", "1"])
    out = capsys.readouterr().out
    assert rc == 1
    assert out.count("refused") >= 2 and "conformance gate" in out


def test_flops_count_visible_pairs_in_closed_form():
    s = bench.Shape("t", "prefill", 2, 4, 2, 16, 40, 64, W=9, C=8, kv_start=3)
    m = visibility_mask(40, 64, window_size=9, chunk_size=8, kv_start=3)
    assert s.pairs() == int(m.sum())
    assert s.flops() == 4 * 16 * int(m.sum()) * 2 * 4
    d = bench.Shape("d", "decode", 1, 4, 2, 16, 1, 1000, W=100, C=16)
    first = int(visibility_mask(1, 1000, window_size=100, chunk_size=16)[0].nonzero().min())
    assert d.window_keys() == 1000 - first


def test_default_suite_has_the_issue_shapes():
    names = [s.name for s in bench.SHAPES]
    assert len(names) >= 11 and len(set(names)) == len(names)
    kinds = {(s.Hq, s.Hkv, s.D, s.Lq) for s in bench.SHAPES if s.name.startswith("train")}
    assert kinds == {(h, g, d, L) for (h, g, d) in ((32, 32, 128), (32, 4, 64), (16, 2, 64))
                     for L in (4096, 8192, 16384)}
    dec = [s for s in bench.SHAPES if s.kind == "decode"]
    assert sorted((s.B, s.Lk, s.Hq, s.Hkv, s.D) for s in dec) == [
        (1, 8192, 32, 4, 64), (1, 8192, 32, 32, 128), (1, 32768, 32, 4, 64), (1, 131072, 32, 4, 64),
        (1, 131072, 32, 32, 128), (8, 32768, 32, 4, 64)]  # the issues' decode targets: 32/32/128
    assert any(s.W == 4096 and s.Lq == 8192 for s in bench.SHAPES)
    chunked = {(s.Hkv, s.D) for s in bench.SHAPES if s.Lq == 512 and s.Lk == 8192}
    assert chunked == {(4, 64), (32, 128)}  # the chunked-prefill target is D = 128
    assert any(s.B == 4 and s.Lq == 4096 for s in bench.SHAPES)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_refuses_full_suite_without_cuda(capsys):
    assert bench.main(["--device", "cpu"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_kernel_line_says_what_each_builtin_backend_runs():
    """The bench's `kernel run` column: each built-in backend's ``describe_call``
    (planning only) on the shape's first input set; nothing for backends without one."""
    shape = next(s for s in bench.SMOKE_SHAPES if s.kind == "decode")
    inputs = bench._inputs(shape, "cpu", torch.float32, 1)[0]
    assert bench._kernel_line("reference", shape, inputs) == ""
    assert bench._kernel_line("flex", shape, inputs) == ""
    assert bench._kernel_line("triton", shape, inputs).startswith(("splitkv ", "prefill "))
    assert bench._kernel_line("tilelang", shape, inputs).startswith("fwd_cpu 16x16")


def test_kernel_line_of_an_external_backend(monkeypatch):
    """A backend function's ``describe`` attribute (docs/porting.md) reaches the column;
    a describe that fails costs the row nothing but the text."""
    from conformance import registry
    from tools import _common

    shape = bench.SMOKE_SHAPES[0]
    inputs = bench._inputs(shape, "cpu", torch.float32, 1)[0]

    def fn(q, k, v, **kw):
        return None

    fn.describe = lambda q, k, v, **kw: f"my kernel, window {kw['window_size']}"
    backend = registry._as_backend(fn, name="ext", origin="test")
    monkeypatch.setattr(_common, "resolve_backend", lambda name: backend)
    assert bench._kernel_line("ext", shape, inputs) == f"my kernel, window {shape.rule['window_size']}"
    fn.describe = lambda *a, **kw: 1 / 0
    backend = registry._as_backend(fn, name="ext", origin="test")
    assert bench._kernel_line("ext", shape, inputs) == "(no description: ZeroDivisionError)"


def test_unknown_backend_and_device_are_refused_before_any_timing(capsys, monkeypatch):
    """A backend name that does not resolve, or a device that is not cpu / cuda[:N], exits 2
    with the reason before the ceilings are measured."""
    monkeypatch.setattr(bench, "measure_ceilings", lambda *a, **k: pytest.fail("measured first"))
    assert bench.main(["--device", "cpu", "--smoke", "--backend", "reference,nosuch"]) == 2
    assert "unknown backend 'nosuch'" in capsys.readouterr().err
    assert bench.main(["--device", "gpu", "--smoke"]) == 2
    assert "expected cpu, cuda or cuda:N" in capsys.readouterr().err
