"""The device scripts (``tools/gpu_all.sh``, ``tools/gpu_sanitize.sh``) on the CPU:
they parse, the sanitizer's case selection names every category it means to, and
each script's verdict and gating follow from what its tools return (fake tools)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["tools/gpu_all.sh", "tools/gpu_sanitize.sh", "tools/tl_site_slim.sh"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("script", SCRIPTS)
def test_script_parses(script):
    res = subprocess.run(["bash", "-n", str(ROOT / script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _var(name: str, script: str = "tools/gpu_sanitize.sh") -> list[str]:
    """The comma list a device script assigns to ``name`` (``NAME="a,b"`` at a line start)."""
    text = (ROOT / script).read_text()
    m = re.search(rf'^{name}="([^"]*)"', text, flags=re.M)
    assert m, f"{name} not found in {script}"
    return m.group(1).split(",")


def test_sanitizer_runs_every_category_but_long():
    """A category added to the suite is sanitized too unless this list says why not:
    only ``long`` (caches up to 128K keys) is left out."""
    from conformance.cases import CATEGORIES

    assert sorted(_var("ALL_CATS")) == sorted(c.name for c in CATEGORIES if c.name != "long")
    names = {c.name for c in CATEGORIES}
    assert set(_var("SMALL_CATS")) <= names


def test_gpu_all_shards_cover_every_category_once():
    """tools/gpu_all.sh's SHARD_1..3 split the full tier over calls: every category in
    exactly one shard (session 27's hand-made split had left chunk_view out)."""
    from conformance.cases import CATEGORIES

    shards = [_var(f"SHARD_{i}", "tools/gpu_all.sh") for i in (1, 2, 3)]
    flat = [c for s in shards for c in s]
    assert sorted(flat) == sorted(c.name for c in CATEGORIES), flat


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("env, rc, want", [
    (dict(SHARD="4"), 2, "SHARD=4: 1, 2 or 3"),
    (dict(SHARD="2", ONLY="basic"), 2, "SHARD and ONLY together"),
], ids=["bad-shard", "shard-and-only"])
def test_gpu_all_shard_errors(tmp_path, env, rc, want):
    full = dict(os.environ, OUT=str(tmp_path), TL_UNPACK="0", **env)
    res = subprocess.run(["bash", str(ROOT / "tools/gpu_all.sh"), "x"], cwd=ROOT, env=full,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == rc and want in res.stderr, res.stdout + res.stderr


_FAKE = """#!/usr/bin/env bash
# stands in for compute-sanitizer: prints the summary line of the tool it is asked for
[ "$1" = --version ] && { echo "fake sanitizer"; exit 0; }
tool=$2
echo "tier quick  device cuda  run seed 0  3 checks in 1s"
if [ "$tool" = racecheck ]; then
  echo "========= RACECHECK SUMMARY: $FAKE_N hazards displayed ($FAKE_N errors, 0 warnings)"
else
  echo "========= ERROR SUMMARY: $FAKE_N errors"
fi
exit $FAKE_RC
"""


def _sanitize(tmp_path, **env):
    """Run tools/gpu_sanitize.sh with the fake sanitizer; (result, its $OUT)."""
    fake = tmp_path / "fake-sanitizer"
    fake.write_text(_FAKE)
    fake.chmod(0o755)
    out = tmp_path / "out"
    full = dict(os.environ, SANITIZER=str(fake), OUT=str(out), FAKE_N="0", FAKE_RC="0", TL_UNPACK="0",
                PREBUILD="0")
    full.update(env)
    res = subprocess.run(["bash", str(ROOT / "tools/gpu_sanitize.sh")], cwd=ROOT, env=full,
                         capture_output=True, text=True, timeout=60)
    return res, out


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("n, rc, status", [("0", "0", 0), ("3", "99", 1), ("0", "1", 1), ("0", "124", 1)],
                         ids=["clean", "sanitizer-errors", "failing-check", "timeout"])
def test_sanitizer_script_status_and_summary(tmp_path, n, rc, status):
    """The script's verdict from each run's exit status and summary line (a fake
    sanitizer): clean only when every run exits 0 with a zero summary; racecheck and
    synccheck run for TileLang backends only."""
    res, out = _sanitize(tmp_path, FAKE_N=n, FAKE_RC=rc, TOOLS="memcheck racecheck",
                         BACKENDS="triton tilelang")
    assert res.returncode == status, res.stdout + res.stderr
    lines = (out / "summary.txt").read_text().splitlines()[1:]
    assert lines[-1] == "TileLang prebuild (tools/tl_lower.py --build) rc=skipped", lines  # PREBUILD=0
    lines = lines[:-1]
    rows = [r for r in lines if not r.startswith(" ")]
    assert sorted(r.split()[0] + " " + r.split()[1] for r in rows) == [
        "memcheck tilelang", "memcheck triton", "racecheck tilelang"]
    assert all(f"SUMMARY: {n} " in r for r in rows), rows
    # a failing run's own sanitizer lines follow its row (the device tool returns few files)
    excerpts = [r.strip() for r in lines if r.startswith("    ")]
    if status:
        assert len(excerpts) == 3 and all(e.startswith("========= ") for e in excerpts), lines
    else:
        assert not excerpts, lines


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("tools", ["initcheck", "memcheck initcheck", "memchek"])
def test_sanitizer_script_refuses_initcheck_and_unknown_tools(tmp_path, tools):
    """initcheck gives no verdict on this suite (the script's header: false reports
    either way, sessions 15 and 16) and a misspelt tool is not run as a no-op:
    both exit 2 before anything runs."""
    res, out = _sanitize(tmp_path, TOOLS=tools, BACKENDS="triton")
    assert res.returncode == 2, res.stdout + res.stderr
    assert ("no verdict" if "initcheck" in tools else "unknown tool") in res.stderr
    assert not out.exists()


_FAKE_BUILD = """#!/usr/bin/env bash
# stands in for python in tools/gpu_sanitize.sh's prebuild: logs the call, answers as told
echo "$*" >> "$OUT/calls"
[ "$FAKE_BUILD_RC" = 0 ] || { echo "FAIL fwd_tc(64, 64)"; echo "  ThreadSync"; }
echo "7/8 built, 3 s"
exit "$FAKE_BUILD_RC"
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("env, only, rc", [
    (dict(BACKENDS="triton tilelang", TOOLS="memcheck"), "ALL_CATS", "0"),
    (dict(BACKENDS="tilelang-split", TOOLS="racecheck"), "SMALL_CATS", "0"),
    (dict(BACKENDS="tilelang", TOOLS="memcheck", SAN_ONLY="long4m,reach"), "long4m,reach", "0"),
    (dict(BACKENDS="tilelang", TOOLS="memcheck", FAKE_BUILD_RC="1"), "ALL_CATS", "1"),
    (dict(BACKENDS="tilelang", TOOLS="memcheck", FAKE_BUILD_RC="124"), "ALL_CATS", "124"),
    (dict(BACKENDS="triton triton-tma", TOOLS="memcheck"), None, "skipped"),
    (dict(BACKENDS="tilelang", TOOLS="memcheck", PREBUILD="0"), None, "skipped"),
], ids=["memcheck", "racecheck", "san-only", "fails-to-build", "out-of-time", "no-tilelang",
        "prebuild-off"])
def test_sanitizer_script_prebuilds_tilelang_kernels(tmp_path, env, only, rc):
    """With a TileLang backend, gpu_sanitize.sh first builds the quick tier's kernels of the
    categories its runs take (tools/tl_lower.py --build, a fake python here); the runs
    follow whatever the build returns (not a gate), and the summary says how it went,
    with the kernels that failed to build."""
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(_FAKE_BUILD)
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}", "FAKE_BUILD_RC": "0",
           "PREBUILD": "1", **env}
    res, out = _sanitize(tmp_path, **env)
    assert res.returncode == 0, res.stdout + res.stderr
    calls = (out / "calls").read_text().splitlines() if (out / "calls").exists() else []
    if only is None:
        assert calls == [], calls
    else:
        want = ",".join(_var(only)) if only.isupper() else only
        (call,) = calls
        assert call.startswith("-m tools.tl_lower --tier quick --build --only ") and \
            call.endswith(f"--only {want}") and "--fold-dtypes" not in call, call
    summary = (out / "summary.txt").read_text()
    rows = [r for r in summary.splitlines()[1:] if r.split()[0] in ("memcheck", "racecheck")]
    assert rows, summary  # the runs happen whatever the build returned
    assert f"TileLang prebuild (tools/tl_lower.py --build) rc={rc}" in summary, summary
    assert ("FAIL fwd_tc(64, 64)" in summary) == (rc not in ("0", "skipped")), summary


_FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for python in tools/gpu_all.sh: logs each call, answers as told
echo "$*" >> "$OUT/calls"
case "$2" in
  tools.tl_lower) echo "FAIL fwd_tc(128, 128)"; echo "  ThreadSync"; echo "3/4 lower, 1 s"
                  exit "$FAKE_LOWER_RC" ;;
  tools.cli) echo "hils-swa conformance ="; echo "$3 ran"
             prev=; for a in "$@"; do [ "$prev" = --json ] && echo "{}" > "$a"; prev=$a; done
             exit 0 ;;
esac
exit 3
"""


def _gpu_all(tmp_path, commit="abc1234", **env):
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(_FAKE_PYTHON)
    fake.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    full = dict(os.environ, PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}", OUT=str(out),
                TL_UNPACK="0", PART="conform", FAKE_LOWER_RC="0")
    full.update(env)
    res = subprocess.run(["bash", str(ROOT / "tools/gpu_all.sh"), *([commit] if commit else [])],
                         cwd=ROOT, env=full,
                         capture_output=True, text=True, timeout=60)
    raw = (out / "calls").read_text().splitlines() if (out / "calls").exists() else []
    words = [c.split() for c in raw]  # "-m tools.cli conform ...": module, and the command of tools.cli
    return res, [" ".join(w[1:3] if w[1] == "tools.cli" else w[1:2]) for w in words], raw


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("shard", ["1", "2", "3"])
def test_gpu_all_shard_sets_the_categories(tmp_path, shard):
    """SHARD=n hands its shard's categories to the pre-flight and to the tier (fake python)."""
    res, ran, raw = _gpu_all(tmp_path, SHARD=shard)
    assert res.returncode == 0, res.stdout + res.stderr
    want = ",".join(_var(f"SHARD_{shard}", "tools/gpu_all.sh"))
    assert ran == ["tools.tl_lower", "tools.cli conform"], raw
    assert all(f"--only {want}" in call for call in raw), raw
    assert "--commit abc1234" in raw[-1], raw  # the report names the commit the call was given


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_all_without_a_commit_leaves_the_report_its_own(tmp_path):
    """Without the commit argument the tier gets no --commit, so the report takes the
    checkout's git describe instead of the bench's placeholder "unknown"."""
    res, _, raw = _gpu_all(tmp_path, commit=None)
    assert res.returncode == 0, res.stderr
    assert "tools.cli conform" in raw[-1] and "--commit" not in raw[-1], raw


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("env, ran, said", [
    ({}, ["tools.tl_lower", "tools.cli conform"], "tl_lower rc=0 conform rc=0"),
    ({"FAKE_LOWER_RC": "1"}, ["tools.tl_lower"], "kernels that do not lower"),
    ({"FAKE_LOWER_RC": "124"}, ["tools.tl_lower"], "out of time"),
    ({"FAKE_LOWER_RC": "2"}, ["tools.tl_lower"], "crashed (rc 2"),
    ({"BACKEND_ARGS": "--backend reference --backend triton"}, ["tools.cli conform"],
     "tl_lower rc=skipped conform rc=0"),
    ({"BACKEND_ARGS": "--backend triton --backend tilelang-split"},
     ["tools.tl_lower", "tools.cli conform"], "conform rc=0"),
    ({"PRELOWER": "0"}, ["tools.cli conform"], "tl_lower rc=skipped"),
    ({"CONFORM_S": "10"}, ["tools.tl_lower"], "conform rc=no-time"),
    ({"PART": "bench", "FAKE_LOWER_RC": "1"}, ["tools.cli bench"], "tl_lower rc=skipped"),
    ({"PRELOWER": "build"}, ["tools.tl_lower", "tools.cli conform"], "tl_lower rc=0 conform rc=0"),
    ({"PRELOWER": "build", "FAKE_LOWER_RC": "1"}, ["tools.tl_lower"], "kernels that do not build"),
    ({"PRELOWER": "build", "FAKE_LOWER_RC": "124"}, ["tools.tl_lower", "tools.cli conform"],
     "the tier builds the rest"),
], ids=["clean", "fails-to-lower", "timeout", "crash", "no-tilelang", "tilelang-split",
        "prelower-off", "no-time-left", "bench-only", "build", "fails-to-build", "build-timeout"])
def test_gpu_all_pre_flight_gates_the_tier(tmp_path, env, ran, said):
    """gpu_all.sh lowers the TileLang kernels first when a TileLang backend runs, starts
    the tier only when they all lower and time is left, and says why not (a fake
    python stands in for tl_lower and hils-swa)."""
    res, calls, raw = _gpu_all(tmp_path, **env)
    assert res.returncode == 0, res.stderr
    assert calls == ran, (calls, res.stdout)
    assert said in res.stdout, res.stdout
    for c in raw:
        if "tools.tl_lower" in c:  # PRELOWER=build builds each dtype's kernel; lowering folds them
            want, not_want = (("--build", "--fold-dtypes") if env.get("PRELOWER") == "build"
                              else ("--fold-dtypes", "--build"))
            assert want in c.split() and not_want not in c.split(), c
            assert "-j" not in c.split(), c  # tl_lower's default: at most 16 (test below)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_all_shards_in_one_call_keep_their_files(tmp_path):
    """Two shards run into one $OUT (session 39 ran shards 1 and 2 in one device call and
    shard 2's conform.json replaced shard 1's): each shard writes conform-shardN.json /
    .log and tl_lower-shardN.log, and a shard that finishes removes its own partial results
    only, not another shard's (fake python)."""
    out = tmp_path / "out"
    res1, _, raw1 = _gpu_all(tmp_path, SHARD="1")
    assert res1.returncode == 0, res1.stderr
    (out / "conform-shard1.json").unlink()  # shard 1 left no report, only its partial one
    (out / "conform-shard1.json.partial.jsonl").write_text("{}\n")
    (out / "conform-shard2.json.partial.jsonl").write_text("{}\n")
    res2, _, raw2 = _gpu_all(tmp_path, SHARD="2")
    assert res2.returncode == 0, res2.stderr
    assert f"--json {out}/conform-shard1.json" in raw1[-1], raw1
    assert f"--json {out}/conform-shard2.json" in raw2[-1], raw2
    names = {f.name for f in out.iterdir()}
    assert {"conform-shard1.log", "conform-shard2.log", "tl_lower-shard1.log",
            "tl_lower-shard2.log", "conform-shard2.json",
            "conform-shard1.json.partial.jsonl"} <= names, names
    assert "conform-shard2.json.partial.jsonl" not in names and "conform.json" not in names


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_all_refuses_an_unknown_prelower_mode(tmp_path):
    res, calls, _ = _gpu_all(tmp_path, PRELOWER="yes")
    assert res.returncode == 2 and "0, 1 or build" in res.stderr and not calls


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("value", ["9m", "abc", "5.5"])
def test_gpu_all_wants_conform_s_in_whole_seconds(tmp_path, value):
    res, calls, _ = _gpu_all(tmp_path, CONFORM_S=value)
    assert res.returncode == 2 and "whole seconds" in res.stderr and not calls


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("xz") is None,
                    reason="needs bash and xz")
def test_tl_site_slim_drops_only_the_sources_no_build_reads(tmp_path):
    """``tools/tl_site_slim.sh`` rewrites the site's tar without TVM's C++ sources and CUTLASS's
    tools, keeping every other file (the headers kernels include, the libraries, the Python
    packages) byte for byte; a tar without ``tilelang/`` is refused and left as it was."""
    import tarfile

    site = tmp_path / "site"
    keep = {"tilelang/lib/libtilelang.so": b"\x7fELF lib", "tilelang/__init__.py": b"x = 1\n",
            "tilelang/3rdparty/cutlass/include/cute/tensor.hpp": b"// header\n",
            "tilelang/3rdparty/tvm/include/tvm/runtime/c_runtime_api.h": b"// api\n",
            "tilelang/3rdparty/tvm/python/tvm/__init__.py": b"y = 2\n",
            "z3/lib/libz3.so.4.15": b"z3"}
    drop = {"tilelang/3rdparty/tvm/src/runtime/module.cc": b"// source\n",
            "tilelang/3rdparty/cutlass/tools/util/include/x.h": b"// tool\n"}
    for rel, data in {**keep, **drop}.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    tar = tmp_path / "tl_site.tar.xz"
    with tarfile.open(tar, "w:xz") as t:
        t.add(site, arcname=".")
    # the path relative to the working directory, as the script's usage line gives it (session
    # 56: the tar was written from inside the unpacked site, where that path did not resolve)
    res = subprocess.run(["bash", str(ROOT / "tools/tl_site_slim.sh"), tar.name],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    with tarfile.open(tar, "r:xz") as t:
        files = {m.name.removeprefix("./"): t.extractfile(m).read() for m in t.getmembers()
                 if m.isfile()}
    assert files == keep
    bare = tmp_path / "bare.tar.xz"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.txt").write_text("a")
    with tarfile.open(bare, "w:xz") as t:
        t.add(tmp_path / "other", arcname=".")
    before = bare.read_bytes()
    res = subprocess.run(["bash", str(ROOT / "tools/tl_site_slim.sh"), str(bare)],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "holds no tilelang/" in res.stderr
    assert bare.read_bytes() == before
    # compression fails (an xz that refuses -9e, the script's compress step): the old tar is
    # left whole and no temporary file beside it
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "xz").write_text(f'#!/usr/bin/env bash\ncase " $* " in *" -9e "*) exit 1 ;; esac\n'
                             f'exec {shutil.which("xz")} "$@"\n')
    (fake / "xz").chmod(0o755)
    kept = tar.read_bytes()
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
    res = subprocess.run(["bash", str(ROOT / "tools/tl_site_slim.sh"), str(tar)],
                         capture_output=True, text=True, env=env)
    assert res.returncode != 0
    assert tar.read_bytes() == kept
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tl_site_slim")) == []
