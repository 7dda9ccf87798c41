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
