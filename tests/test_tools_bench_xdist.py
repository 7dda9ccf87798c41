"""hils-swa bench -n N: the shape suite over pytest-xdist workers (issue 7), on CPU.

Real xdist workers with a fake two-GPU list: each worker is pinned the
conformance way (``conformance.pinning``, gwK -> entry K % 2) before it imports
torch; torch never sees a GPU here, so the timings are CPU smoke numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conformance import pinning
from tools import bench, bench_xdist

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra) -> dict:
    env = dict(os.environ)
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
                pinning.PINNED_VAR, pinning.GPUS_VAR, "CUDA_VISIBLE_DEVICES"):
        env.pop(var, None)
    env.update(extra)
    return env


def _bench(args, env, tmp_path):
    return subprocess.run([sys.executable, "-m", "tools.cli", "bench", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)


def test_n2_smoke_same_rows_as_one_process_workers_pinned(tmp_path, capsys):
    single = tmp_path / "single.json"
    assert bench.main(["--device", "cpu", "--smoke", "--reps", "1", "--json", str(single)]) == 0
    capsys.readouterr()
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\n" + bench.MD_BEGIN + "\nold\n" + bench.MD_END + "\nkeep me\n")
    js, png = tmp_path / "b.json", tmp_path / "b.png"
    env = _env(**{pinning.GPUS_VAR: "7,9", "TRITON_INTERPRET": "1"})
    p = _bench(["--device", "cpu", "--smoke", "-n", "2", "--reps", "1", "--json", str(js), "--md", str(md),
                "--png", str(png)], env, tmp_path)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    one, many = json.loads(single.read_text()), json.loads(js.read_text())
    key = lambda r: (r["shape"], r["backend"], r["status"])  # noqa: E731
    assert [key(r) for r in many["results"]] == [key(r) for r in one["results"]]
    assert len(many["results"]) == len(bench.SMOKE_SHAPES) * 3
    assert all(r["status"] == "ok" and r["eager_us"] > 0 for r in many["results"])
    assert all(r["gate"].startswith("pass") for r in many["results"] if r["backend"] != "sdpa")
    assert many["shapes"] == one["shapes"]
    # two workers, each pinned by conformance.pinning before torch was imported
    workers = many["workers"]
    assert set(workers) == {"gw0", "gw1"}, workers
    for wid, w in workers.items():
        assert w["cuda_visible_devices"] == ["7", "9"][int(wid[2:]) % 2]
        assert w["torch_imported_before_pinning"] is False and w["replacement"] is False
        assert w["ceilings"]["matmul_tflops"] > 0 and w["device_name"]
    assert sorted(s for w in workers.values() for s in w["shapes"]) == sorted(s.name for s in bench.SMOKE_SHAPES)
    assert {r["extra"]["worker"] for r in many["results"]} == {"gw0", "gw1"}
    assert many["info"]["workers"] == 2 and many["ceilings"]["matmul_tflops"] > 0
    # same outputs as the single-process run
    text = md.read_text()
    assert "old" not in text and "keep me" in text and "| smoke-decode | flex |" in text
    assert "pytest-xdist workers" in text
    assert png.stat().st_size > 10_000
    assert "[gw0]" in p.stdout and "[gw1]" in p.stdout and "ceilings measured in this run" in p.stdout


def test_a_worker_that_dies_costs_its_shape_only(tmp_path):
    (tmp_path / "crashy_backend.py").write_text(
        "import os\nimport reference\n\n"
        "def dies_on_decode(q, k, v, **kw):\n"
        "    if q.shape[2] == 1:\n"
        "        os._exit(3)\n"
        "    return reference.sliding_window_attention(q, k, v, **kw)\n")
    js = tmp_path / "b.json"
    env = _env(**{pinning.GPUS_VAR: "7,9", "TRITON_INTERPRET": "1",
                  "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])})
    p = _bench(["--device", "cpu", "--smoke", "--shapes", "smoke-chunked,smoke-decode", "--backend",
                "reference,crashy_backend:dies_on_decode", "-n", "2", "--reps", "1", "--json", str(js)], env, tmp_path)
    assert p.returncode == 1, p.stdout[-4000:] + p.stderr[-4000:]
    res = json.loads(js.read_text())["results"]
    assert [(r["shape"], r["status"]) for r in res] == [("smoke-chunked", "ok")] * 2 + [("smoke-decode", "error")] * 2
    assert all("died" in r["reason"] for r in res[2:]), res[2:]


def test_resolve_workers():
    r = bench_xdist.resolve_workers
    assert r("auto", "cuda", gpus=["0", "1"]) == 2
    assert r("auto", "cpu", gpus=[], cores=8) == 2
    assert r("2", "cuda", gpus=["3", "5"]) == 2 and r("1", "cuda", gpus=[]) == 1
    for bad in (dict(value="3", device="cuda", gpus=["0", "1"]),   # two workers on one GPU
                dict(value="2", device="cuda", gpus=[]),            # no list to pin from
                dict(value="2", device="cuda:1", gpus=["0", "1"]),  # each worker sees its GPU as cuda
                dict(value="two", device="cpu", gpus=[])):
        with pytest.raises(ValueError):
            r(**bad)


def test_budget_is_checked_per_shape_from_the_given_start():
    shape = bench.SMOKE_SHAPES[0]
    timer = bench.Timer("cpu", 1)
    rows = bench.bench_shape(shape, ["reference", "sdpa"], "cpu", torch.bfloat16, timer, {},
                             t_start=time.perf_counter() - 10, budget_s=5)
    assert [(r.backend, r.status) for r in rows] == [("reference", "skipped"), ("sdpa", "skipped")]


def test_the_shape_suite_is_not_part_of_the_test_suite():
    assert not Path(bench_xdist.SUITE).name.startswith("test_")
    assert Path(bench_xdist.SUITE).parent.name not in ("tests", "conformance")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", bench_xdist.SUITE],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 5) and "1 skipped" in p.stdout, p.stdout[-2000:]  # 5: no test ran
