"""tools/lab_patch.py on the CPU: its patches (parsed, applied, restored), the kernels a
patched TileLang call would build (planned on meta tensors through the real adapter and
launcher), its rule and its refusals."""

import json

import pytest

from tilelang_impl import launch as tl
from tools import lab_patch as lab
from triton_impl import launch as tr


def test_patches_parse_literals_and_the_modules_classes():
    assert lab.parse_patch(tl, "SPLIT_MIN_TILES=1000000") == ("SPLIT_MIN_TILES", None, 1000000)
    assert lab.parse_patch(tl, "TC_WIDER[80]=96") == ("TC_WIDER", 80, 96)
    assert lab.parse_patch(tl, "TC_WIDER[112]=-") == ("TC_WIDER", 112, ...)
    attr, key, value = lab.parse_patch(tr, 'PREFILL[("16", 128)]=Config(64, 32, 4, 3, maxnreg=128)')
    assert (attr, key) == ("PREFILL", ("16", 128))
    assert value == tr.Config(64, 32, 4, 3, maxnreg=128)
    assert lab.parse_patch(tr, "SPLIT_BLOCK_M=(16, -32)")[2] == (16, -32)
    assert lab.value_of(tr, "{('16', 64): True}") == {("16", 64): True}


@pytest.mark.parametrize("text, why", [
    ("NO_SUCH_TABLE=1", "has no NO_SUCH_TABLE"),
    ("split_min_tiles=1", "ATTR in UPPERCASE"),
    ("SPLIT_MIN_TILES", "ATTR=VALUE"),
    ("SPLIT_MIN_TILES=__import__('os')", "not a literal or a call of a class"),
    ("SPLIT_MIN_TILES=open('x')", "not a literal or a call of a class"),
    ("SPLIT_MIN_TILES=1 +", "not a Python expression"),
    ("SPLIT_MIN_TILES[1]=2", "is a int, not a dict"),
    ("SPLIT_MIN_TILES=-", "removes a dict entry"),
    ("SPLIT_MIN_TILES=-True", "not a literal"),
    ("SPLIT_MIN_TILES=__class__('x')", "not a literal or a call of a class"),  # a dunder
    ("TC_WIDER[80]=...", "not a literal"),  # Ellipsis marks removal: '-' says that
    ("SPLIT_MIN_TILES={[1]}", "unhashable"),
    ("TC_WIDER[[1]]=2", "not hashable"),
    ("SPLIT_MIN_TILES=b'x'", "not a literal"),
])
def test_bad_patches_are_refused(text, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(")):
        lab.parse_patch(tl, text)


def test_a_class_called_wrongly_is_a_value_error():
    with pytest.raises(ValueError, match="Config"):
        lab.parse_patch(tr, 'PREFILL[("16", 32)]=Config(1)')
    with pytest.raises(ValueError, match="not a literal or a call of a class"):
        lab.parse_patch(tr, 'PREFILL[("16", 32)]=_Plan()')  # private names are refused


def test_patched_restores_every_kind_of_patch_in_place():
    wider, tiles = tl.TC_WIDER, tl.SPLIT_MIN_TILES
    before = dict(wider)
    patches = [lab.parse_patch(tl, t) for t in
               ("TC_WIDER[80]=96", "TC_WIDER[112]=-", "SPLIT_MIN_TILES=99")]
    with lab.patched(tl, patches):
        assert tl.TC_WIDER is wider and tl.TC_WIDER == {48: 64, 80: 96}
        assert tl.SPLIT_MIN_TILES == 99
    assert tl.TC_WIDER is wider and wider == before and tl.SPLIT_MIN_TILES == tiles
    with lab.patched(tl, [lab.parse_patch(tl, "TC_WIDER={80: 96}")]):
        assert tl.TC_WIDER is wider and wider == {80: 96}  # the same dict, changed in place
    assert wider == before
    with pytest.raises(RuntimeError), lab.patched(tl, patches):
        raise RuntimeError  # restored on the way out of an error too
    assert wider == before and tl.SPLIT_MIN_TILES == tiles
    twice = [("TC_WIDER", 80, 96), ("TC_WIDER", 80, 128), ("SPLIT_MIN_TILES", None, 5),
             ("SPLIT_MIN_TILES", None, 6)]
    with lab.patched(tl, twice):
        assert wider[80] == 128 and tl.SPLIT_MIN_TILES == 6
    assert wider == before and tl.SPLIT_MIN_TILES == tiles
    with pytest.raises(TypeError), lab.patched(tl, [("TC_WIDER", 80, 96),
                                                    ("TC_WIDER", [1], 2)]):
        pass  # the second patch fails while being applied: the first is undone
    assert wider == before


def test_each_entry_gets_its_own_copy_of_a_patch_value():
    patch = [("TC_WIDER", 80, [96]), ("SPLIT_MIN_TILES", None, [8])]
    with lab.patched(tl, patch):
        tl.TC_WIDER[80].append(0)  # what a call might do to them
        tl.SPLIT_MIN_TILES.append(0)
    with lab.patched(tl, patch):
        assert tl.TC_WIDER[80] == [96] and tl.SPLIT_MIN_TILES == [8]
    assert patch == [("TC_WIDER", 80, [96]), ("SPLIT_MIN_TILES", None, [8])]


def test_patched_clears_the_plans_it_changes():
    """A plan cached before the patch is not served under it, nor after it: the B = 1 decode
    at D = 128 (10 key tiles) takes the split kernel as shipped and the prefill grid where
    SPLIT_MIN_TILES passes its key tiles."""
    grid = [lab.parse_patch(tl, "SPLIT_MIN_TILES=1000000")]
    shipped = lab.tilelang_jobs(tl, [], lab.SHAPES["decode1"], 128)
    patched = lab.tilelang_jobs(tl, grid, lab.SHAPES["decode1"], 128)
    assert {k for k, _ in shipped} == {"fwd_tc", "combine"}
    assert [a[11] for k, a in shipped if k == "fwd_tc"] == [True]  # the split kernel
    assert {k for k, _ in patched} == {"fwd_tc"}
    assert [a[11] for k, a in patched if k == "fwd_tc"] == [False]
    from tilelang_impl import api
    from tools.tl_lower import recording
    with lab.patched(tl, grid):  # a plan cached under the patch ...
        lab.tilelang_jobs(tl, [], lab.SHAPES["decode1"], 128)
    q, k, v = lab.inputs(lab.SHAPES["decode1"], 128, "meta")
    with recording() as got:  # ... is not served after it (no patched() here to clear it)
        api._run_cuda(api._problem(q, k, v, devices=("meta",), sm_scale=None, **lab.RULE),
                      q, k, v)
    assert set(got) == shipped


def test_a_widening_patch_plans_the_wider_kernel():
    (kind, args), = [j for j in lab.tilelang_jobs(tl, [("TC_WIDER", 80, 96)],
                                                  lab.SHAPES["prefill"], 80) if j[0] == "fwd_tc"]
    assert args[:2] == (96, 96) and tl.tc_knob(args, "qk_cols") == 80


def test_rule_parsing():
    shapes = ["prefill", "decode1"]
    assert lab.parse_rule([], shapes) == {}
    assert lab.parse_rule(["*=1.03", "prefill=0.97"], shapes) == {"prefill": 0.97,
                                                                 "decode1": 1.03}
    assert lab.parse_rule(["decode1=1"], shapes) == {"decode1": 1.0}
    for bad, why in (("chunked=1", "not a shape of this run"), ("prefill=x", "with a number"),
                     ("prefill=0", "positive")):
        with pytest.raises(ValueError, match=why):
            lab.parse_rule([bad], shapes)


def _res(times: dict, checks_ok=True, not_run=(), failed=()):
    rows = [dict(shape=s, D=D, variant=v, us=t) for (s, D, v), t in times.items()]
    checks = [dict(shape=s, D=D, variant=v, ok=checks_ok) for (s, D, v) in times
              if v != lab.SHIPPED]
    return dict(rows=rows, checks=checks, not_run=[list(i) for i in not_run],
                failed=[list(i) + ["Error"] for i in failed], variants={v: [] for *_, v in times})


def test_the_rule_decides_by_every_ruled_shape_and_head_dim():
    t = {("prefill", 96, "shipped"): 100.0, ("prefill", 96, "a"): 90.0,
         ("prefill", 128, "shipped"): 100.0, ("prefill", 128, "a"): 98.0,
         ("decode1", 96, "shipped"): 10.0, ("decode1", 96, "a"): 10.5,
         ("decode1", 128, "shipped"): 10.0, ("decode1", 128, "a"): 10.0}
    rule = {"prefill": 0.97, "decode1": 1.03}
    d = lab.decide(_res(t), rule)["a"]
    assert not d["passes"] and d["why"] == ["prefill D=128: 0.980 > 0.97",
                                            "decode1 D=96: 1.050 > 1.03"]
    assert d["ratios"]["prefill"] == {96: 0.9, 128: 0.98}
    assert lab.decide(_res(t), {"prefill": 0.99, "decode1": 1.06})["a"]["passes"]
    assert lab.decide(_res(t), {"prefill": 0.99})["a"]["passes"]  # decode1 not ruled
    assert lab.decide(_res(t), {}) == {}  # no rule, no decision
    assert not lab.decide(_res(t, checks_ok=False), {"prefill": 2})["a"]["passes"]
    assert not lab.decide(_res(t, not_run=[("decode1", 96, "a")]), {"prefill": 2})["a"]["passes"]
    assert not lab.decide(_res(t, failed=[("decode1", 96, "a")]), {"prefill": 2})["a"]["passes"]
    untimed = dict(t)
    untimed[("prefill", 96, "a")] = None
    assert lab.decide(_res(untimed), {"prefill": 2})["a"]["why"] == ["prefill D=96: untimed > 2"]
    untimed = dict(t)
    untimed[("prefill", 96, "shipped")] = None
    assert lab.decide(_res(untimed), {"prefill": 2})["a"]["why"] == [
        "prefill D=96: shipped untimed > 2"]
    same = _res(t)
    for c in same["checks"]:
        c["same_plan"] = True
    assert lab.decide(same, {"prefill": 2})["a"]["why"] == ["the patch changes no call's plan"]


def test_summary_names_each_ratio_and_verdict():
    t = {("decode1", 128, "shipped"): 14.0, ("decode1", 128, "grid"): 12.6}
    res = _res(t)
    res["decision"] = lab.decide(res, {"decode1": 0.97})
    lines = lab.summary(res).splitlines()
    assert lines[1].split() == ["decode1", "128", "grid", "12.6", "14.0", "0.900"]
    assert lines[2] == "grid: passes"


@pytest.mark.parametrize("argv, why", [
    ([], "at least one --variant"),
    (["--variant", "grid"], "at least one patch"),
    (["--variant", "shipped", "SPLIT_MIN_TILES=1"], "a new name"),
    (["--variant", "g", "NOPE=1"], "has no NOPE"),
    (["--variant", "g", "SPLIT_MIN_TILES=1", "--shapes", "train"], "unknown shapes"),
    (["--variant", "g", "SPLIT_MIN_TILES=1", "--shape", "x=1,2,3"], "NAME=B,Hq,Hkv,Lq,Lk"),
    (["--variant", "g", "SPLIT_MIN_TILES=1", "--shape", "x=1,1,1,9,8"], "Lq <= Lk"),
    (["--variant", "g", "SPLIT_MIN_TILES=1", "--rule", "chunked=1"], "not a shape of this run"),
    (["--backend", "triton", "--variant", "g", "SPLIT_MIN_TILES=1"], "has no SPLIT_MIN_TILES"),
])
def test_cli_refuses_before_anything_runs(argv, why, capsys):
    with pytest.raises(SystemExit):
        lab.main(["--out", "x.json"] + argv)
    assert why in capsys.readouterr().err


def test_a_dry_run_on_the_cpu_checks_each_variant_against_shipped(tmp_path):
    """run() end to end through Triton's interpreter on a small shape: a variant whose patch
    changes the plan (64 x 32 prefill tiles instead of 128 x 64) and one whose patch no call
    reads, and one whose calls raise; outputs screened against shipped's, plans compared, the
    JSON written, nothing timed on a CPU (the rule then passes no variant)."""
    tile = 'PREFILL[("16", 32)]=Config(64, 32, 4, 3)'
    variants = {lab.SHIPPED: [], "rows64": [lab.parse_patch(tr, tile)],
                "unread": [lab.parse_patch(tr, "PACK_MIN_GROUP=None")],
                "rows48": [lab.parse_patch(tr, tile.replace("64, 32", "48, 32"))]}
    shapes = {"tiny": (1, 4, 2, 1, 200)}
    out = tmp_path / "lab.json"
    res = lab.run("triton", variants, shapes, [32], reps=1, rounds=1, workers=1,
                  rule={"tiny": 1.0}, out=str(out), log=lambda *a: None, device="cpu")
    checks = {c["variant"]: c for c in res["checks"]}
    assert set(checks) == {"rows64", "unread"} and all(c["ok"] for c in checks.values())
    assert checks["unread"]["same_plan"] and checks["unread"]["bits_equal"]
    assert not checks["rows64"]["same_plan"]
    assert [r["plan"] for r in res["rows"]][:2] == ["prefill 128x64 w4 s3", "prefill 64x32 w4 s3"]
    assert [r["us"] for r in res["rows"]] == [None] * 3 and all(r["why"] for r in res["rows"])
    # 48-row tiles: the kernel refuses them (tl.arange needs a power of two): reported, not run
    (failed,) = res["failed"]
    assert failed[:3] == ["tiny", 32, "rows48"] and "power of 2" in failed[3]
    assert res["decision"]["rows48"]["why"] == ["not run everywhere"]
    assert not any(d["passes"] for d in res["decision"].values())
    saved = json.loads(out.read_text())
    assert saved["variants"]["unread"] == [["PACK_MIN_GROUP", None, None]]
    assert saved["variants"]["rows64"][0][:2] == ["PREFILL", ["16", 32]]


def test_a_failure_without_text_is_reported_not_raised():
    assert lab._why(RuntimeError()) == "RuntimeError: "
    assert lab._why(ValueError("bad tile\nmore")) == "ValueError: bad tile"
