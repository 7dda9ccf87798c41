"""tools/lab_head_dims.py on the CPU: what its GPU run would build and call (planning on meta
tensors through the real adapter and launcher), its table patch, and its refusals."""

import pytest
import torch

from tilelang_impl import launch
from tools import lab_head_dims as lab


def test_wider_is_the_next_multiple_of_64_and_refuses_others():
    assert [lab.wider(d) for d in (48, 80, 96, 112, 160, 208, 240)] == [64, 128, 128, 128, 192,
                                                                       256, 256]
    for bad in (64, 128, 120, 16, 272):
        with pytest.raises(ValueError, match="multiple of 16 but not of 64"):
            lab.wider(bad)


def test_table_patch_is_restored():
    before = dict(launch.TC_WIDER)
    with lab.table(112, "wider"):
        assert launch.TC_WIDER[112] == 128
    with lab.table(112, "own"):
        assert 112 not in launch.TC_WIDER
    assert launch.TC_WIDER == before


def test_the_variants_plan_the_kernels_they_name():
    """own: the D = 112 kernel; wider: the D = 128 kernel reading 112 columns (qk_cols / v_cols,
    o_cols), its describe_call says so; at-wider: the D = 128 kernel at full width. The
    decode takes the split kernel widened (Dv 112 has no split kernel of its own). The
    shipped table is left as it was."""
    before = dict(launch.TC_WIDER)
    built = lab.jobs([("prefill", 112, "own")])
    assert [a[:2] for k, a in built if k == "fwd_tc"] == [(112, 112)]
    (kind, args), = [j for j in lab.jobs([("prefill", 112, "wider")]) if j[0] == "fwd_tc"]
    assert args[:2] == (128, 128)
    assert [launch.tc_knob(args, n) for n in ("qk_cols", "v_cols", "o_cols")] == [112] * 3
    (kind, full), = [j for j in lab.jobs([("prefill", 128, "at-wider")]) if j[0] == "fwd_tc"]
    assert full[:2] == (128, 128) and launch.tc_knob(full, "qk_cols") == 0
    text = lab.describe("prefill", 112, "wider")
    assert "Dqk 112 -> 128" in text and "inputs read narrow" in text
    assert "->" not in lab.describe("prefill", 112, "own")
    dec = lab.jobs([("decode1", 112, "wider")])
    assert {k for k, _ in dec} == {"fwd_tc", "combine"}
    assert [a[11] for k, a in dec if k == "fwd_tc"] == [True]  # the split kernel
    assert {k for k, _ in lab.jobs([("decode1", 112, "own")])} == {"fwd_tc"}
    assert launch.TC_WIDER == before


def test_items_time_each_wider_head_dim_once():
    todo = lab.items([80, 96, 112, 160], ["prefill"])
    assert [i for i in todo if i[2] == "at-wider"] == [("prefill", 128, "at-wider"),
                                                      ("prefill", 192, "at-wider")]
    assert len(todo) == 4 * 2 + 2


def test_the_screen_judges_differences_not_only_nans():
    o = torch.randn(1, 2, 8, 16).to(torch.bfloat16)
    lse = torch.randn(1, 2, 8)
    lse[0, 0, 3] = float("-inf")
    assert lab._compare((o, lse), (o.clone(), lse.clone()))["ok"]
    assert not lab._compare((o + 0.25, lse), (o, lse))["ok"]  # an o off by 0.25
    assert not lab._compare((o, lse + 0.01), (o, lse))["ok"]  # an lse off by 0.01
    wrong_inf = lse.clone()
    wrong_inf[0, 1, 0] = float("-inf")
    assert not lab._compare((o, wrong_inf), (o, lse))["ok"]
    nan_lse = lse.clone()
    nan_lse[0, 1, 1] = float("nan")
    assert not lab._compare((o, nan_lse), (o, lse))["ok"]


def test_cli_refuses_a_multiple_of_64_and_an_unknown_shape(capsys):
    with pytest.raises(SystemExit):
        lab.main(["--out", "x.json", "--dims", "128"])
    assert "not of 64" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lab.main(["--out", "x.json", "--shapes", "train"])
    assert "unknown shapes" in capsys.readouterr().err


def test_inputs_are_fresh_values_not_zeros():
    q, k, v = lab.inputs("decode8", 48, "cpu", seed=3)
    assert q.shape == (8, 32, 1, 48) and k.shape == v.shape == (8, 8, 4096, 48)
    assert q.dtype == torch.bfloat16 and bool((k != 0).any()) and not torch.equal(k, v)


def test_a_named_target_is_a_multiple_of_32_above_the_head_dim():
    assert lab.target(80, 96) == 96 and lab.target(48, 256) == 256
    for D, W in ((80, 112), (80, 80), (80, 64), (80, 288)):
        with pytest.raises(ValueError, match="multiple of 32"):
            lab.target(D, W)
    with pytest.raises(ValueError, match="not of 64"):
        lab.target(128, 192)  # D itself as wider() wants it
    assert lab.variant_of(80, 128) == "wider" and lab.variant_of(80, 96) == "wider:96"
    assert lab.width(80, "wider:96") == 96 and lab.width(80, "wider") == 128
    assert lab.width(80, "own") is None and lab.width(128, "at-wider") is None
    assert lab.pairs([80, (80, 96), 112]) == [(80, 128), (80, 96), (112, 128)]


def test_items_with_named_targets_time_own_once_and_each_width():
    todo = lab.items([(80, 96), 80, 96], ["prefill"])
    # D = 96 at full width is timed once, as own (at-wider would be the same call)
    assert todo == [("prefill", 80, "own"), ("prefill", 80, "wider:96"),
                    ("prefill", 80, "wider"), ("prefill", 96, "own"), ("prefill", 96, "wider"),
                    ("prefill", 128, "at-wider")]


def test_a_named_target_plans_its_kernel_reading_narrow():
    """80:96 runs the D = 96 kernel reading 80 columns (32-column boxes instead of 16); the
    B = 1 decode takes the D = 96 split kernel (Dv 80 has none of its own)."""
    before = dict(launch.TC_WIDER)
    with lab.table(80, "wider:96"):
        assert launch.TC_WIDER[80] == 96
    assert launch.TC_WIDER == before
    (kind, args), = [j for j in lab.jobs([("prefill", 80, "wider:96")]) if j[0] == "fwd_tc"]
    assert args[:2] == (96, 96)
    assert [launch.tc_knob(args, n) for n in ("qk_cols", "v_cols", "o_cols")] == [80] * 3
    assert "Dqk 80 -> 96" in lab.describe("prefill", 80, "wider:96")
    dec = lab.jobs([("decode1", 80, "wider:96")])
    assert [a[:2] + (a[11],) for k, a in dec if k == "fwd_tc"] == [(96, 96, True)]
    assert launch.TC_WIDER == before


def test_summary_takes_own_where_at_wider_is_not_timed():
    rows = [dict(shape="prefill", D=D, variant=v, us=t) for D, v, t in
            ((80, "own", 200.0), (80, "wider:96", 150.0), (96, "own", 140.0))]
    assert lab.summary(dict(rows=rows)).splitlines()[1].split() == [
        "prefill", "80", "96", "200.0", "150.0", "140.0", "0.750"]


def test_summary_has_a_line_per_wider_variant():
    rows = [dict(shape="prefill", D=80, variant=v, us=t) for v, t in
            (("own", 200.0), ("wider", 190.0), ("wider:96", 150.0))]
    rows += [dict(shape="prefill", D=W, variant="at-wider", us=t) for W, t in ((96, 140.0),
                                                                           (128, 180.0))]
    lines = lab.summary(dict(rows=rows)).splitlines()
    assert len(lines) == 3
    assert lines[1].split() == ["prefill", "80", "128", "200.0", "190.0", "180.0", "0.950"]
    assert lines[2].split() == ["prefill", "80", "96", "200.0", "150.0", "140.0", "0.750"]


def test_cli_parses_pairs_and_refuses_bad_ones(capsys):
    assert lab._dims("48,80:96") == [48, (80, 96)]
    for bad, why in (("80:100", "multiple of 32"), ("80:96:128", "a pair D:W"),
                     ("80:x", "invalid literal")):
        with pytest.raises(SystemExit):
            lab.main(["--out", "x.json", "--dims", bad])
        assert why in capsys.readouterr().err


def test_interleaved_rounds_alternate_and_drop_what_cannot_be_timed():
    """The timing loop both labs share: each round in the reverse order of the one before, a
    key whose graph fails dropped after its first round, results yielded after every round."""
    seen = []

    class FakeTimer:
        def graph(self, call, sets):
            seen.append(call)
            return (None, "capture failed") if call == "b" else (0.001 * len(seen), "")
    calls = {k: (k, [()]) for k in "abc"}
    got = [(dict((k, list(v)) for k, v in t.items()), dict(w))
           for t, w in lab.interleaved(FakeTimer(), calls, 3, log=lambda *a: None)]
    assert seen == ["a", "b", "c", "c", "a", "a", "c"]
    assert got[-1][0] == {"a": [1.0, 5.0, 6.0], "b": [], "c": [3.0, 4.0, 7.0]}
    assert got[-1][1] == {"b": "capture failed"} and len(got) == 3
    rows = lab.rows({("prefill", 64, "own"): [100.0, 120.0]}, {}, lab.SHAPES,
                    {("prefill", 64, "own"): "fwd_tc"})
    assert rows[0]["us"] == 110.0 and rows[0]["plan"] == "fwd_tc" and rows[0]["tflops"] > 0
