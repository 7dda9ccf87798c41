"""``hils-swa conform``: exit status, matrix, JSON, progress, mutants."""

import json
import os
import subprocess
import sys
from pathlib import Path

from conformance import cli

ROOT = Path(__file__).resolve().parents[1]


def _run(*args, timeout=300):
    env = dict(os.environ)
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "HILS_SWA_PINNED", "HILS_SWA_SEED"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-m", "tools.cli", "conform", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_pytest_args():
    a = cli._parser().parse_args(["--backend", "triton", "--only", "window,chunk", "--device", "cpu",
                                  "--tier", "full", "--json", "x.json", "-n", "4", "--seed", "3"])
    args = cli.pytest_args(a)
    assert args[0].endswith("test_conformance.py")
    for flag, val in (("--backend", "triton"), ("--only", "window,chunk"), ("--device", "cpu"),
                      ("--tier", "full"), ("-n", "4"), ("--seed", "3")):
        assert args[args.index(flag) + 1] == val
    assert args[args.index("--conform-json") + 1] == os.path.abspath("x.json")
    assert "--conform-progress" in args


def test_passing_run_writes_matrix_and_json(tmp_path):
    out = tmp_path / "r.json"
    p = _run("--backend", "reference", "--backend", "mutant:output_dtype_fp32", "--only", "basic",
             "--device", "cpu", "--seed", "5", "--json", str(out))
    text = p.stdout + p.stderr
    assert p.returncode == 1, text  # the mutant fails
    assert "run seed 5" in text and "category" in text and "reference~mutant:output_dtype_fp32" in text
    assert "FAIL (dtype)" in text
    data = json.loads(out.read_text())
    assert data["run_seed"] == 5 and data["tier"] == "quick" and data["device"] == "cpu"
    cell = data["matrix"]["cells"]["basic|reference"]
    assert cell["failed"] == 0 and cell["passed"] == 6
    assert data["matrix"]["cells"]["basic|mutant:output_dtype_fp32"]["failed"] == 4  # bf16/fp16 cases
    ids = {r["case"] for r in data["results"]}
    assert len(ids) == 6 and all(r["worker"] for r in data["results"])
    assert "main" in data["workers"]


def test_clean_run_exits_zero():
    p = _run("--backend", "reference", "--only", "errors,empty_dims", "--device", "cpu")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[##############################]" in p.stdout


def test_list_and_bad_usage():
    p = _run("--list", "--only", "errors", "--device", "cpu")
    assert p.returncode == 0 and "err-q_3d-bf16" in p.stdout
    p = _run("--backend", "nope", "--only", "basic", "--device", "cpu")
    assert p.returncode != 0 and "unknown backend" in (p.stdout + p.stderr)
