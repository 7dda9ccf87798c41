"""``tools/tl_lower.py``, the pre-flight of a GPU run, on the CPU: it finds every
TileLang GPU kernel the conformance suite's GPU tier builds, and it names a kernel
TileLang's passes refuse, with the cases that need it.

TileLang builds a kernel on its first call, so a kernel its passes refuse (ThreadSync,
layout inference) shows up as a crashed case on the GPU machine: session 12's
``gqa_pack`` cases at 0e82bb5. The sweep over the full tier's kernels (128 with fp16
folded into bf16, 1-23 s each on a CI core: 848 s of the 2360 s of test time of a
1198-s 2-core run at 62cc54a) left CI in session 16, when CI had taken 2116 s against
its 20-minute budget. It
runs where it pays: ``tools/gpu_all.sh`` lowers the kernels of the categories it is
asked for on the device host's 16 cores before the tier starts (``PRELOWER=0`` skips
it), and ``python -m tools.tl_lower`` runs it anywhere. What CI compiles for sm_90a with
nvcc, one kernel per shipped variant class: tests/test_tilelang_compile.py.
"""

import pytest

pytest.importorskip("tilelang", reason="tilelang is not installed")

from conformance.cases import LONG4M_LK  # noqa: E402
from tilelang_impl import launch  # noqa: E402
from tools import tl_lower  # noqa: E402

WANTED = tl_lower.fold_dtypes(tl_lower.tier_kernels("full"))


def test_the_tier_reaches_every_kind_of_kernel():
    kinds = {k for k, _ in WANTED}
    assert kinds == {"fwd_tc", "fwd_fp32", "combine"}, kinds
    tc = [a for k, a in WANTED if k == "fwd_tc"]
    assert any(a[11] for a in tc) and any(not a[11] for a in tc)  # split-KV and prefill grid
    pack = launch._KNOBS_AT + launch._KNOB["pack"]
    assert {a[pack] for a in tc if len(a) > pack} >= {2, 3, 4, 8}  # GQA-packed, every G
    assert any(a[5] or a[6] for a in tc)  # BLHD views


def test_widened_kernels_are_the_same_kernels_built_wide():
    """``--wide`` (tl_lower.widened): every landmark-testing kernel of the tier once more,
    with only the knob ``wide`` on (after the knobs it had, their defaults filled in; the
    knobs after it, session 38's ``lmk_const``, kept where set and left out at their defaults as the
    launcher does), the
    kernel a call past 2**22 positions takes; the combine left out. The tier's ``long4m``
    cases (a cache of 2**22 + 1003 keys) ask for wide kernels themselves: those map to
    themselves."""
    at = launch._KNOBS_AT + launch._KNOB["wide"]
    defaults = tuple(d for _, d in launch.TC_KNOBS)
    for job, cases in WANTED.items():
        kind, args = job
        wide = tl_lower.widened({job: cases})
        if kind == "combine":
            assert wide == {}
            continue
        ((wkind, wargs), wcases), = wide.items()
        assert wkind == kind and wcases == cases
        if kind == "fwd_tc":
            n = len(args) - launch._KNOBS_AT
            assert wargs[:min(len(args), at)] == args[:at]  # the knobs it had, kept
            assert wargs[len(args):at] == defaults[n:launch._KNOB["wide"]] and wargs[at] is True
            assert wargs[at + 1:] == args[at + 1:]  # the knobs after it (lmk_const), kept
            assert len(wargs) == max(len(args), at + 1)
        else:
            assert wargs == args[:6] + launch.FP32_TILE + (True,) + args[9:]  # o_cols kept
        if f"k{LONG4M_LK}-" in " ".join(cases):
            assert wargs == args  # built wide already
    assert any(f"k{LONG4M_LK}-" in " ".join(c) for c in WANTED.values())
    lc = launch._KNOBS_AT + launch._KNOB["lmk_const"]
    assert any(len(a) > lc and a[lc] for k, a in WANTED if k == "fwd_tc")  # kept past wide


def test_a_widened_kernel_without_trailing_knobs_lowers():
    """The knobs a kernel's arguments left out come back at ``TC_KNOBS``' defaults, which
    the factory takes (``pack`` the int 0: the first ``--wide`` sweep filled in the bool
    ``False`` that TC_KNOBS then held, and 10 of 199 kernels failed, D > 128 and the split
    kernels without expand_to_chunk). One of those, lowered."""
    job = ("fwd_tc", (192, 192, "bfloat16", True, True, False, False, 64, 64, 2, 128, False,
                      "tile"))
    ((kind, args), _), = tl_lower.widened({job: ["x"]}).items()
    pk = launch._KNOBS_AT + launch._KNOB["pack"]
    assert type(args[pk]) is int and args[-1] is True
    assert tl_lower.lower_one((kind, args)) is None


def test_the_tier_asks_for_kernels_with_its_categories():
    """``--only`` narrows the sweep to the categories a GPU call runs (gpu_all.sh's
    ``ONLY``): the kernels of two categories are among the tier's, and their cases are
    theirs."""
    from conformance.cases import generate
    part = tl_lower.fold_dtypes(tl_lower.tier_kernels("full", categories=["decode", "gqa_pack"]))
    theirs = {c.id for c in generate("full", "cuda", ["decode", "gqa_pack"])}
    # exactly the tier's kernels that a case of the two categories builds, with those cases
    assert set(part) == {j for j, cases in WANTED.items() if set(cases) & theirs}
    assert all(set(cases) == set(WANTED[j]) & theirs for j, cases in part.items())
    assert 0 < len(part) < len(WANTED)


def test_the_sweep_takes_conform_s_only_names_globs_included():
    """gpu_all.sh passes its ``ONLY`` to both conform and the pre-flight: case-id globs
    must select there as they do in conform (session 31's device call passed
    ``*kv9223372036854775813*,...,errors,long4m``; the pre-flight raised "unknown
    categories" and kept the tier from starting)."""
    from conformance.cases import generate
    names = ["*kv9223372036854775813*", "long4m"]
    part = tl_lower.tier_kernels("full", categories=names)
    theirs = {c.id for c in generate("full", "cuda") if c.category == "long4m"
              or "kv9223372036854775813" in c.id}
    assert part and {c for cases in part.values() for c in cases} <= theirs
    assert any("kv9223372036854775813" in c for cases in part.values() for c in cases)
    assert any(f"k{LONG4M_LK}-" in c for cases in part.values() for c in cases)
    with pytest.raises(ValueError, match="matches no case"):
        tl_lower.tier_kernels("full", categories=["*no-such-case*"])


def test_the_sweep_takes_conform_s_where():
    """gpu_all.sh passes its ``WHERE`` (conform's ``--where``, session 45) to the pre-flight
    too: the kernels of exactly the cases the expression holds for, beside ``--only``'s names;
    the hoisted long calls at D = 96 / 128 among them (the cases session 45 listed by hand)."""
    from conformance.cases import generate
    from conformance.selection import select
    expr = "Lq > 64 and 64 < max(Dqk, Dv) <= 128 and dtype in ('bf16', 'fp16')"
    part = tl_lower.fold_dtypes(tl_lower.tier_kernels("full", categories=["headdim", "flags"],
                                                      where=[expr]))
    theirs = {c.id for c in select(generate("full", "cuda"), ["headdim", "flags"])
              if c.Lq > 64 and 64 < max(c.Dqk, c.Dv) <= 128 and c.dtype != "fp32"}
    assert set(part) == {j for j, cases in WANTED.items() if set(cases) & theirs}
    assert all(set(cases) == set(WANTED[j]) & theirs for j, cases in part.items())
    hl = launch._KNOBS_AT + launch._KNOB["hoist_left"]
    assert any(k == "fwd_tc" and len(a) > hl and a[hl] == 1 for k, a in part)
    with pytest.raises(ValueError, match="leaves none"):
        tl_lower.tier_kernels("full", where=["Lq < 0"])
    with pytest.raises(SystemExit) as e:  # the script: a usage error (2), not "does not lower"
        tl_lower.main(["--where", "Lq < 0"])
    assert e.value.code == 2


def test_the_check_catches_a_kernel_that_does_not_lower(monkeypatch, capsys):
    """With launch.pack_lowers' exclusion undone, the gqa_pack cases ask for the packed
    G = 2 kernel TileLang 0.1.15 refuses (what the GPU tier found at 0e82bb5 as four
    crashed cases): the tool exits 1 and names that kernel, its error and its cases,
    and passes the combine kernel beside it."""
    every = launch.pack_lowers
    monkeypatch.setattr(launch, "pack_lowers", lambda G, *a: G & (G - 1) == 0 or G <= 8)
    wanted = tl_lower.tier_kernels("full", categories=["gqa_pack"])
    monkeypatch.setattr(launch, "pack_lowers", every)
    pack = launch._KNOBS_AT + launch._KNOB["pack"]
    bad = [j for j in wanted if j[0] == "fwd_tc" and len(j[1]) > pack and j[1][pack] == 2
           and not (j[1][3] or j[1][4]) and j[1][0] != j[1][1]]
    assert bad, "the gqa_pack cases no longer reach the packed G = 2 kernel without flags"
    assert not set(tl_lower.fold_dtypes({j: [] for j in bad})) & set(WANTED)  # nor does the launcher
    good = next(j for j in WANTED if j[0] == "combine")
    jobs = {bad[0]: wanted[bad[0]], good: WANTED[good]}
    monkeypatch.setattr(tl_lower, "tier_kernels", lambda *a, **k: dict(jobs))
    assert tl_lower.main(["-j", "1"]) == 1
    out = capsys.readouterr().out
    assert f"FAIL fwd_tc{bad[0][1]}" in out and "ThreadSync" in out
    assert wanted[bad[0]][0] in out and "FAIL combine" not in out
    assert "1/2 lower" in out


def test_build_mode_builds_what_the_launcher_builds(monkeypatch, capsys):
    """``--build`` (tools/gpu_sanitize.sh's prebuild): each kernel built by its factory with
    the launcher's arguments, nvcc included (the combine, for real: about 3 s), a kernel
    that does not build named with its error and cases; fp16 folding, which would build
    kernels no call takes, is refused."""
    from tilelang_impl import kernels
    good = next(j for j in WANTED if j[0] == "combine")
    bad = ("fwd_tc", ("stand-in",))

    def refused(*args):  # stands in for a factory whose lowering fails
        raise RuntimeError("tvm.error.InternalError: ThreadSync [stand-in]")

    monkeypatch.setattr(kernels, "fwd_tc", refused)
    jobs = {bad: ["case-bad"], good: ["case-good"]}
    monkeypatch.setattr(tl_lower, "tier_kernels", lambda *a, **k: dict(jobs))
    assert tl_lower.main(["-j", "1", "--build"]) == 1
    out = capsys.readouterr().out
    assert "building with 1 processes" in out and "1/2 built" in out, out
    assert "FAIL fwd_tc('stand-in',)" in out and "ThreadSync" in out and "case-bad" in out
    assert "FAIL combine" not in out
    assert kernels.combine(*good[1]) is not None  # built, and cached
    with pytest.raises(SystemExit):
        tl_lower.main(["--build", "--fold-dtypes"])
    assert "--fold-dtypes would build" in capsys.readouterr().err


def test_default_workers_follow_the_cpus_this_process_may_use_at_most_16(monkeypatch):
    """``-j``'s default, which gpu_all.sh and gpu_sanitize.sh take: the CPUs of this
    process's affinity mask, capped at 16 (the device host's cores), at least one."""
    for cpus, want in ((1, 1), (2, 2), (16, 16), (128, 16)):
        monkeypatch.setattr(tl_lower.os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)),
                            raising=False)
        assert tl_lower.default_workers() == want


def test_changed_cases_are_those_whose_kernels_differ():
    a, b, c = ("fwd_tc", (1,)), ("fwd_tc", (2,)), ("combine", (3,))
    before = {a: ["x", "y"], c: ["y", "z"]}
    after = {a: ["x"], b: ["y", "w"], c: ["y", "z"]}
    assert tl_lower.by_case(before) == {"x": {a}, "y": {a, c}, "z": {c}}
    assert tl_lower.changed_cases(before, after) == ["y", "w"]
    assert tl_lower.changed_cases(before, before) == []


def test_changed_by_names_the_cases_a_table_patch_changes(monkeypatch, capsys, tmp_path):
    """``--changed-by 'TC_WIDER[80]=96'`` over the headdim category: the changed cases are
    exactly the bf16 / fp16 ones whose kernels read 80 columns (fp32 reads padded copies and
    keeps its kernel), written to ``--ids-out``; only the kernels the patch adds are lowered
    (D = 96 kernels reading 65..80 columns, the combines of the calls that now split), and
    the shipped table is left as it was."""
    from conformance.cases import generate
    lowered = []
    monkeypatch.setattr(tl_lower, "lower_all",
                        lambda jobs, workers, build=False: lowered.extend(jobs) or {})
    before = dict(launch.TC_WIDER)
    out = tmp_path / "ids.txt"
    assert tl_lower.main(["--only", "headdim", "--changed-by", "TC_WIDER[80]=96",
                          "--ids-out", str(out), "-j", "1"]) == 0
    assert launch.TC_WIDER == before
    ids = out.read_text().split(",")
    want = [c.id for c in generate("full", "cuda", ["headdim"]) if c.dtype != "fp32"
            and 80 in (-(-c.Dqk // 16) * 16, -(-c.Dv // 16) * 16)]
    assert want and sorted(ids) == sorted(want)
    assert f"{len(ids)} cases of the full tier change kernels" in capsys.readouterr().out
    tc = [a for k, a in lowered if k == "fwd_tc"]
    # each head dim the patch widened is a D = 96 one reading 65..80 columns (D72x56: 72)
    assert tc and all(96 in a[:2] for a in tc)
    assert all(64 < launch.tc_knob(a, knob) <= 80 for a in tc
               for d, knob in zip(a[:2], ("qk_cols", "v_cols")) if d == 96)
    # and the combines of the calls that now split (Dv 96 has a split kernel, 80 had none)
    combines = [a for k, a in lowered if k != "fwd_tc"]
    assert combines and all(a[0] == 96 and a[-1] == 80 for a in combines)
    assert {k for k, _ in lowered} == {"fwd_tc", "combine"}
    with pytest.raises(SystemExit):
        tl_lower.main(["--ids-out", str(out)])
    assert "--ids-out writes the cases --changed-by changes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tl_lower.main(["--changed-by", "NOPE=1"])
    assert "has no NOPE" in capsys.readouterr().err
    # a patch that changes no case: no file, exit status 1 (an empty ONLY runs the whole tier)
    empty = tmp_path / "none.txt"
    assert tl_lower.main(["--only", "headdim", "--changed-by", "TC_WIDER[80]=80",
                          "--ids-out", str(empty), "-j", "1"]) == 1
    assert not empty.exists() and "0 cases" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # a value the planner cannot use: a usage error
        tl_lower.main(["--only", "headdim", "--changed-by", "SPLIT_MIN_TILES='x'"])
    assert "the planner refuses" in capsys.readouterr().err
