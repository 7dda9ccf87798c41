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
                                  "--tier", "full", "--json", "x.json", "-n", "4", "--seed", "3",
                                  "--commit", "abc1234"])
    args = cli.pytest_args(a)
    assert args[args.index("--conform-commit") + 1] == "abc1234"
    assert "--conform-commit" not in cli.pytest_args(cli._parser().parse_args([]))
    assert args[0].endswith("test_conformance.py")
    for flag, val in (("--backend", "triton"), ("--only", "window,chunk"), ("--device", "cpu"),
                      ("--tier", "full"), ("-n", "4"), ("--seed", "3")):
        assert args[args.index(flag) + 1] == val
    assert args[args.index("--conform-json") + 1] == os.path.abspath("x.json")
    assert "--conform-progress" in args
    a = cli._parser().parse_args(["--where", "Lq > 64", "--where", "-Lq < -64"])
    assert [x for x in cli.pytest_args(a) if x.startswith("--where")] == [
        "--where=Lq > 64", "--where=-Lq < -64"]  # one token each: a leading '-' stays the value


def test_passing_run_writes_matrix_and_json(tmp_path):
    out = tmp_path / "r.json"
    p = _run("--backend", "reference", "--backend", "mutant:output_dtype_fp32", "--only", "basic",
             "--device", "cpu", "--seed", "5", "--json", str(out))
    text = p.stdout + p.stderr
    assert p.returncode == 1, text  # the mutant fails
    assert "run seed 5" in text and "category" in text and "reference~mutant:output_dtype_fp32" in text
    assert "FAIL (dtype)" in text
    # the failures end with what to run next: diff names the broken rule
    assert "hils-swa diff reference mutant:output_dtype_fp32 --device cpu" in text
    # ... and what its failing cases share that its passing ones do not
    assert ("what mutant:output_dtype_fp32's 4 failing cases share, that none of its 2 passing cases "
            "has: dtype bf16, fp16") in text
    data = json.loads(out.read_text())
    assert data["run_seed"] == 5 and data["tier"] == "quick" and data["device"] == "cpu"
    cell = data["matrix"]["cells"]["basic|reference"]
    assert cell["failed"] == 0 and cell["passed"] == 6
    assert data["matrix"]["cells"]["basic|mutant:output_dtype_fp32"]["failed"] == 4  # bf16/fp16 cases
    ids = {r["case"] for r in data["results"]}
    assert len(ids) == 6 and all(r["worker"] for r in data["results"])
    assert "main" in data["workers"]
    # what ran: the commit (the checkout's label without --commit), versions, the selection
    assert data["commit"] and data["commit"] != "unknown", data["commit"]
    assert data["versions"]["torch"] == __import__("torch").__version__
    assert set(data["versions"]) == {"python", "torch", "triton", "tilelang"}
    assert data["only"] == ["basic"] and data["exclude"] == [] and data["where"] == []


def test_clean_run_exits_zero():
    p = _run("--backend", "reference", "--only", "errors,empty_dims", "--device", "cpu")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[##############################]" in p.stdout
    # nothing imports the plugin before pytest loads it (its asserts could not be rewritten:
    # a PytestAssertRewriteWarning closed every run from 5cfcae9 to session 30)
    assert "Warning" not in p.stdout + p.stderr, p.stdout + p.stderr


def test_list_and_bad_usage():
    p = _run("--list", "--only", "errors", "--device", "cpu")
    assert p.returncode == 0 and "err-q_3d-bf16" in p.stdout
    p = _run("--backend", "nope", "--only", "basic", "--device", "cpu")
    assert p.returncode == 2 and "unknown backend" in p.stderr
    p = _run("--backend", "reference", "--only", "nothing-matches", "--device", "cpu")
    assert p.returncode != 0 and "nothing-matches matches no case" in (p.stdout + p.stderr)


def test_exclude_leaves_out_what_it_names_and_refuses_names_that_match_nothing():
    from conformance.cases import generate
    from conformance.selection import select

    cases = generate("quick", "cpu")
    kept = select(cases, ["window", "long4m"], exclude=["long4m", "*-W18446744073709551619C*"])
    assert kept and all(c.category == "window" and "W18446744073709551619C" not in c.id for c in kept)
    assert len(kept) < len(select(cases, ["window"]))
    assert not any(c.category == "long4m" for c in select(cases, None, exclude=["long4m"]))
    p = _run("--list", "--exclude", "long4m,no-such-case", "--device", "cpu")
    assert p.returncode == 2 and "--exclude: no-such-case matches no case" in p.stderr
    p = _run("--backend", "reference", "--only", "window", "--exclude", "window", "--device", "cpu")
    assert p.returncode == 2 and "leaves none of the cases" in p.stdout + p.stderr, p.stdout[-800:]
    p = _run("--list", "--only", "long4m,errors", "--exclude", "long4m", "--device", "cpu")
    assert p.returncode == 0 and "long4m" not in p.stdout.split("cases (")[0] and "err-q_3d-bf16" in p.stdout
    a = cli._parser().parse_args(["--exclude", "long4m", "--exclude", "errors"])
    args = cli.pytest_args(a)
    assert [args[i + 1] for i, x in enumerate(args) if x == "--exclude"] == ["long4m", "errors"]


def test_a_module_function_backend_takes_a_short_name(tmp_path):
    from conformance.registry import load_backend, spec_of

    b = load_backend("ref64=reference:sliding_window_attention")
    assert b.name == "ref64" and spec_of(b) == "ref64=reference:sliding_window_attention"
    assert spec_of(load_backend("reference:sliding_window_attention")) == "reference:sliding_window_attention"
    from conformance.registry import resolve
    try:
        resolve(["toy=conformance.mutants:lse_base2", "toy=conformance.mutants:kv_start_ignored"])
    except ValueError as e:
        assert "given twice" in str(e)
    else:
        raise AssertionError("two backends under one name were accepted")
    assert [b.name for b in resolve(["toy=conformance.mutants:lse_base2"] * 2)] == ["toy"]
    for bad, says in (("triton=reference:sliding_window_attention", "already names a backend"),
                      ("a~b=reference:sliding_window_attention", "expected NAME=package.module:function"),
                      ("short=reference", "expected NAME=package.module:function")):
        try:
            load_backend(bad)
        except ValueError as e:
            assert says in str(e), e
        else:
            raise AssertionError(f"{bad} was accepted")
    out = tmp_path / "r.json"
    p = _run("--backend", "reference", "--backend", "bug=conformance.mutants:lse_base2", "--only", "basic",
             "--device", "cpu", "--json", str(out))
    text = p.stdout + p.stderr
    assert p.returncode == 1, text
    assert "reference~bug" in text and "hils-swa diff reference bug=conformance.mutants:lse_base2" in text
    assert "basic|bug" in json.loads(out.read_text())["matrix"]["cells"]


def test_separating_axes_say_which_inputs_fail():
    from dataclasses import replace

    from conformance.cases import Case
    from conformance.plugin import separating_axes, shared_values

    base = Case("basic")
    cases = [replace(base, dtype=d, kv_start=kv, chunk=16, category=cat) for d in ("bf16", "fp16", "fp32")
             for kv in (0, 5, 32) for cat in ("basic", "window")]
    failing = [c for c in cases if c.dtype == "fp16" and c.kv_start % c.chunk == 0]
    passing = [c for c in cases if c not in failing]
    assert separating_axes(failing, passing) == []  # neither axis alone separates them
    assert shared_values(failing, passing)[:2] == ["kv_start % chunk 0 (as have 8 of the 14 passing)",
                                                   "dtype fp16 (as have 2 of the 14 passing)"][::-1]
    failing = [c for c in cases if c.dtype == "fp16"]
    passing = [c for c in cases if c.dtype != "fp16"]
    assert separating_axes(failing, passing) == ["dtype fp16"]
    failing = [c for c in cases if c.kv_start % c.chunk == 0]
    passing = [c for c in cases if c.kv_start % c.chunk]
    assert separating_axes(failing, passing)[0] == "kv_start % chunk 0"


def test_diff_hints_name_the_next_command():
    from conformance.plugin import diff_hints

    fail = lambda who, pair=False: dict(who=who, pair=pair)  # noqa: E731
    assert diff_hints([], "cpu") == []
    # the reference alone failing is the yardstick's problem: no diff to suggest
    assert diff_hints([fail("reference"), fail("reference~triton", True)], "cpu") == []
    assert diff_hints([fail("reference"), fail("triton"), fail("reference~triton", True)], "cuda") == [
        "which SPEC rule differs:", "  hils-swa diff reference triton --device cuda"]
    # every backend conforms alone, a pair disagrees: diff the pair
    assert diff_hints([fail("triton~tilelang", True)], "cpu")[1] == "  hils-swa diff triton tilelang --device cpu"
    many = diff_hints([fail(f"b{i}") for i in range(6)], "cpu", most=4)
    assert len(many) == 6 and many[-1] == "  ... (and 2 more)"


def test_default_seed_is_fixed_and_random_is_printed(tmp_path):
    out = tmp_path / "r.json"
    p = _run("--backend", "reference", "--only", "errors", "--device", "cpu", "--json", str(out))
    assert p.returncode == 0 and json.loads(out.read_text())["run_seed"] == 0
    p = _run("--backend", "reference", "--only", "errors", "--device", "cpu", "--seed", "random",
             "--json", str(out))
    seed = json.loads(out.read_text())["run_seed"]
    assert p.returncode == 0 and f"run seed {seed}" in p.stdout


def test_default_workers():
    assert cli.default_workers("cpu", gpus=["0"], cores=16) == "0"
    assert cli.default_workers("auto", gpus=[], cores=16) == "0"
    assert cli.default_workers("cuda", gpus=["0"], cores=16) == "8"
    assert cli.default_workers("auto", gpus=["0", "1"], cores=4) == "2"


def test_kernel_group_keeps_cases_of_one_kernel_together():
    from conformance.plugin import kernel_group

    a = kernel_group("bf16-B2-H4x2-q129k129-D64x64-W32C16-lmk1exp1-kv0-bhld")
    b = kernel_group("bf16-B1-H8x1-q65k200-D64x64-W8C4-lmk1exp1-kv7-bhld-s0.3-nan")
    assert a == b == "bf16-D64x64-lmk1exp1-bhld-pre"
    assert kernel_group("bf16-B2-H4x2-q1k129-D64x64-W32C16-lmk1exp1-kv0-bhld").endswith("-dec")
    assert kernel_group("fp16-B2-H4x2-q129k129-D64x64-W32C16-lmk1exp1-kv0-bhld") != a
    assert kernel_group("err-q_3d-bf16") == "err-q_3d-bf16"


def test_backend_load_errors_name_the_backend_and_the_fix(monkeypatch):
    """A package.module:function whose package is not importable says how to make it so; an
    installed entry point that fails to load raises a ValueError naming it (the CLI's exit 2
    with that message) instead of a traceback that looks like a failed check."""
    import pytest

    from conformance import registry

    with pytest.raises(ValueError, match=r"no_such_pkg_xyz.*PYTHONPATH"):
        registry.load_backend("no_such_pkg_xyz.attn:sliding_window_attention")

    class BrokenEntryPoint:
        value = "ghostpkg.attn:fn"

        def load(self):
            raise ModuleNotFoundError("No module named 'ghostpkg'")
    monkeypatch.setattr(registry, "_entry_points", lambda: {"ghost": BrokenEntryPoint()})
    with pytest.raises(ValueError, match=r"'ghost' \(entry point ghostpkg.attn:fn.*--backend"):
        registry.load_backend("ghost")
    with pytest.raises(ValueError, match="ghost"):
        registry.default_backends()


def test_a_backend_that_serves_nothing_fails_the_run(tmp_path):
    """Every case unsupported (TileLang's forced split-KV on CPU tensors) is not a pass:
    the summary names the backend and the run exits 1, as its JSON report says; beside a
    backend that serves them, too."""
    for backends in (["tilelang-split"], ["reference", "tilelang-split"]):
        args = [x for b in backends for x in ("--backend", b)]
        out = tmp_path / f"{len(backends)}.json"
        r = _run(*args, "--only", "basic", "--device", "cpu", "--json", str(out))
        assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
        assert json.loads(out.read_text())["exitstatus"] == 1
        assert "FAILED: tilelang-split served none of its 6 cases" in r.stdout, r.stdout[-2000:]
        assert "skipped" in r.stdout  # its checks show as skips with the reason, not passes


def test_only_names_that_select_nothing_are_refused():
    """A typo in --only (category, id or glob) is a usage error naming it, in a run and in
    --list, not a silently smaller run."""
    r = _run("--backend", "reference", "--only", "basic,typo_cat", "--device", "cpu")
    assert r.returncode == 2 and "typo_cat matches no case" in (r.stdout + r.stderr), r.stdout[-1500:]
    r = _run("--list", "--only", "nosuchcat", "--device", "cpu")
    assert r.returncode == 2 and "nosuchcat matches no case" in r.stderr, r.stderr
    r = _run("--list", "--only", "basic,fp32-*", "--device", "cpu")
    assert r.returncode == 0 and "cases (quick tier, cpu)" in r.stdout
    # what the device leaves out is said, with the reason
    assert "left out on cpu: categories gqa_pack, chunk_view, reach, long: CUDA only" in r.stdout


def test_cuda_without_a_device_is_one_line_and_exit_2(monkeypatch, capsys):
    import torch

    from conformance import pinning

    monkeypatch.setattr(pinning, "apply", lambda: [])  # leave this process's environment alone
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["--device", "cuda", "--only", "basic"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device is available" in err and "--device cpu" in err


def test_failures_of_one_worker_are_named_as_such():
    """When every failure and error of a run of several xdist workers came from one of them,
    and some are errors outside the checks or the reference's failures, the summary says so
    (session 43: one worker's CUDA out-of-memory, then the fp32 calls after it failed, the
    reference's included). A kernel's wrong answers alone do not (its cases share a worker).
    Errors outside the checks name their worker."""
    from types import SimpleNamespace as NS

    from conformance.plugin import Collector

    col = Collector(NS(getoption=lambda name: False))

    def error(nodeid, wid):
        col.pytest_runtest_logreport(NS(nodeid=f"conformance/test_conformance.py::test_conformance[{nodeid}]",
                                        user_properties=[], when="call", passed=False,
                                        outcome="failed", longrepr="E  CUDA error: out of memory",
                                        node=NS(gateway=NS(id=wid))))

    def result(case, wid, status, pair=False):
        col.results.append(dict(case=case, who="tilelang", pair=pair, status=status,
                                worker=dict(worker=wid)))

    result("a", "gw0", "pass")
    result("b", "gw3", "fail")
    result("b", "gw3", "fail", pair=True)  # pairs repeat their member's failure: not counted
    error("c-reference", "gw3")
    error("d-tilelang", "gw3")
    assert col.errors[0].startswith("conformance/test_conformance.py::test_conformance[c-reference] [gw3]: ")
    assert col.by_worker() == ({"gw3": 3}, {"gw0", "gw3"})
    note = col.one_worker_note()
    assert note and "all 3 failures and errors above came from one worker, gw3, of the 2" in note
    error("e-tilelang", "gw1")  # a second worker fails too: no note
    assert col.one_worker_note() is None
    checks = Collector(NS(getoption=lambda name: False))  # wrong answers only: a kernel's bug,
    for case in "abc":  # whose cases one worker runs (kernel_group): no note
        checks.results.append(dict(case=case, who="tilelang", pair=False, status="fail",
                                   worker=dict(worker="gw2")))
    checks.results.append(dict(case="d", who="tilelang", pair=False, status="pass",
                               worker=dict(worker="gw0")))
    assert checks.one_worker_note() is None
    checks.results.append(dict(case="a", who="reference", pair=False, status="fail",
                               worker=dict(worker="gw2")))  # the reference fails there too
    assert "came from one worker, gw2, of the 2" in checks.one_worker_note()
    one = Collector(NS(getoption=lambda name: False))  # a run of one process: no note
    one.results.append(dict(case="a", who="x", pair=False, status="fail", worker=dict(worker="main")))
    one.error_workers += ["main", "main"]
    assert one.one_worker_note() is None


def test_where_keeps_the_cases_its_expression_holds_for_and_refuses_what_it_cannot_read():
    """``--where`` (session 45): a Python expression over a case's fields selects exactly the
    cases it holds for (here the long-call cases of the TileLang tensor-core kernels that
    session 45 listed by hand), after ``--only`` / ``--exclude``; every expression must hold;
    an unknown name, an attribute, another call or an expression that leaves nothing is a
    usage error, not a silently changed run."""
    import pytest

    from conformance.cases import generate
    from conformance.selection import case_filter, select

    cases = generate("full", "cuda")
    expr = "Lq > 64 and max(Dqk, Dv) <= 128 and dtype in ('bf16', 'fp16')"
    kept = select(cases, None, exprs=[expr])
    want = [c for c in cases if c.Lq > 64 and max(c.Dqk, c.Dv) <= 128 and c.dtype != "fp32"]
    assert kept == want and 0 < len(kept) < len(cases)
    assert {c.id for c in select(cases, None, exprs=[expr, "max(Dqk, Dv) > 64"])} == \
        {c.id for c in want if max(c.Dqk, c.Dv) > 64}
    flags = select(cases, ["flags"], exprs=["not mask_lmk"])
    assert flags and flags == [c for c in cases if c.category == "flags" and not c.mask_lmk]
    assert case_filter("category == 'chunk' and chunk % 2 == 1 and -kv_start <= 0")(
        next(c for c in cases if c.category == "chunk" and c.chunk % 2 == 1))
    for bad, why in (("Lq > 64 and Lkk < 3", "'Lkk' is no case field"),
                     ("Lq.real > 64", "Attribute is not allowed"),
                     ("len(id) > 3", "calls only max, min and abs"),
                     ("__import__('os')", "calls only max, min and abs"),
                     ("Lq >", "not an expression"),
                     ("[c for c in id]", "is not allowed")):
        with pytest.raises(ValueError, match=why):
            select(cases, None, exprs=[bad])
    with pytest.raises(ValueError, match="leaves none"):
        select(cases, ["window"], exprs=["Lq < 0"])
    # an expression that fails on a case (sm_scale is None on most) is a usage error too
    with pytest.raises(ValueError, match=r"on .*: TypeError"):
        select(cases, None, exprs=["sm_scale > 0.1"])
    assert select(cases, ["scale"], exprs=["sm_scale is not None and sm_scale > 0.1"])
    with pytest.raises(ValueError, match="only against None"):
        select(cases, None, exprs=["Lq is 129"])
    p = _run("--list", "--only", "basic", "--where", "dtype == 'fp16'", "--device", "cpu")
    listed = [ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("basic ")]
    assert p.returncode == 0 and listed and all(i.startswith("fp16-") for i in listed), p.stdout
    p = _run("--list", "--where", "Lq == -1", "--device", "cpu")
    assert p.returncode == 2 and "leaves none" in p.stderr
    # a run: refused before pytest starts, and the report records the expression it ran under
    p = _run("--backend", "reference", "--where", "Lkk > 3", "--device", "cpu")
    assert p.returncode == 2 and "'Lkk' is no case field" in p.stderr, p.stdout + p.stderr


def test_a_run_under_where_checks_only_its_cases_and_records_it(tmp_path):
    out = tmp_path / "w.json"
    p = _run("--backend", "reference", "--only", "basic", "--where", "dtype == 'fp16'",
             "--device", "cpu", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(out.read_text())
    assert data["where"] == ["dtype == 'fp16'"] and data["only"] == ["basic"]
    ids = {r["case"] for r in data["results"]}
    assert ids and all(i.startswith("fp16-") for i in ids), ids
