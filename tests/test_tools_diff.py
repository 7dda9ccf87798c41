"""hils-swa diff: the right rule for every mutant, equivalence, and a two-bug backend."""

from __future__ import annotations

import math

import pytest
import torch

from conformance.mutants import MUTANTS
from tools import diff
from tools._common import resolve_backend

# mutant -> the rule key diff must name (tools.diff.RULES)
EXPECTED = {
    "lse_base2": "lse_base",
    "reshaped_output": "layout",
    "window_off_by_one": "window_left",
    "no_chunk_expansion": "chunk_expansion",
    "landmark_shifted": "landmark_shifted",
    "landmark_from_index": "landmark_index",
    "kv_start_ignored": "kv_start",
    "positions_int64": "positions",
    "query_offset_ignored": "query_offset",
    "gqa_modulo": "gqa",
    "scale_from_dv": "default_scale",
    "sm_scale_ignored": "explicit_scale",
    "empty_rows_nan": "empty_rows",
    "nan_leak": "nan_leak",
    "nan_v_spread": "nan_v_spread",
    "nan_rows_emptied": "nan_propagation",
    "strides_ignored": "strides",
    "low_precision_accumulation": "low_precision",
    "fp16_probabilities": "low_precision",
    "output_dtype_fp32": "output_dtype",
    "tail_unwritten": "unwritten_rows",
    "no_validation": "validation",
    "inputs_modified": "inputs",
}
REF = resolve_backend("reference")


def test_every_mutant_has_an_expected_rule():
    assert set(EXPECTED) == set(MUTANTS), "a mutant was added or renamed: map it to the rule diff must name"
    assert set(EXPECTED.values()) <= set(diff.RULES)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_diff_names_the_mutants_rule(name):
    cmp = diff.compare_backends(REF, MUTANTS[name][0], "cpu")
    assert not cmp.equivalent
    assert cmp.a.conforms
    found = cmp.b.explained_by
    assert found is not None, diff.format_report(cmp, "cpu")
    assert found.rule == EXPECTED[name], diff.format_report(cmp, "cpu")
    report = diff.format_report(cmp, "cpu")
    assert f"[{EXPECTED[name]}]" in report.splitlines()[-1]


def test_diff_reference_reference_exits_0(capsys):
    assert diff.main(["reference", "reference", "--device", "cpu"]) == 0
    assert "result: EQUIVALENT" in capsys.readouterr().out


def test_diff_cli_mutant_exits_1_and_draws(tmp_path, capsys):
    png = tmp_path / "d.png"
    assert diff.main(["reference", "mutant:kv_start_ignored", "--device", "cpu", "--png", str(png)]) == 1
    out = capsys.readouterr().out
    assert "[kv_start]" in out and "masks differ" in out
    assert png.stat().st_size > 10_000


def test_same_bug_on_both_sides_is_equivalent():
    m = MUTANTS["lse_base2"][0]
    cmp = diff.compare_backends(m, m, "cpu")
    assert cmp.equivalent and not cmp.a.conforms


def _two_bugs(q, k, v, *, window_size, **kw):
    import reference

    o, lse = reference.sliding_window_attention(q, k, v, window_size=window_size + 1, **kw)
    return o, lse / math.log(2.0)


def test_two_bugs_are_not_explained_by_one_rule(capsys):
    cmp = diff.compare_backends(REF, _two_bugs, "cpu")
    assert not cmp.equivalent
    assert cmp.b.explained_by is None
    report = diff.format_report(cmp, "cpu")
    assert "no single rule explains" in report


def test_documented_deviation_is_undone_and_other_bugs_still_named():
    """A backend's registry Deviation (the kernels' NaN-in-v spread) is undone before
    ``diff`` judges, as in the suite: triton conforms with the case marked documented,
    and a second bug on top of the spread is still named by its own rule."""
    from conformance import mutants
    from conformance.registry import Backend, load_backend

    dev = load_backend("triton").deviation
    spread = Backend(name="spread", fn=mutants.nan_v_spread, deviation=dev)
    d = diff.diagnose(spread, probe_masks=False)
    assert d.conforms and set(d.documented) == {"nan_v"}

    def spread_and_lse_base2(q, k, v, **kw):
        o, lse = mutants.nan_v_spread(q, k, v, **kw)
        return o, lse / math.log(2)

    d = diff.diagnose(Backend(name="spread+lse2", fn=spread_and_lse_base2, deviation=dev), probe_masks=False)
    assert d.explained_by is not None and d.explained_by.rule == "lse_base", d.explained_by
    assert "nan_v" in d.unsupported and "nan_v" in d.documented  # left out of the evidence, listed
    d = diff.diagnose(Backend(name="spread, undocumented", fn=mutants.nan_v_spread), probe_masks=False)
    assert d.explained_by is not None and d.explained_by.rule == "nan_v_spread"


def test_deviation_gets_the_suites_case_type_in_diff_too():
    """``deviation(case)`` receives a ``conformance.cases.Case`` from diff as from conform,
    so a deviation that reads the suite's fields (here ``category`` and ``nan_v``) works in
    both; the spread deviation keyed on them is undone as before."""
    from conformance import mutants
    from conformance.cases import Case
    from conformance.registry import Backend, load_backend

    seen = []
    triton_dev = load_backend("triton").deviation

    def dev(case):
        assert isinstance(case, Case) and case.category == "diff"
        seen.append(case.nan_v)
        return triton_dev(case)
    d = diff.diagnose(Backend(name="spread", fn=mutants.nan_v_spread, deviation=dev), probe_masks=False)
    assert d.conforms and set(d.documented) == {"nan_v"} and True in seen


def test_unwritten_tail_of_zeros_is_still_named_and_small_errors_are_not():
    """The unwritten-rows signature wants wild rows (NaN, fresh zeros, large errors): a tail
    left as zeros is named ``unwritten_rows``; small errors on every row but the exact
    first (``fp16_probabilities``) are not (they are ``low_precision``)."""
    import reference
    from conformance.mutants import mutant
    from conformance.registry import Backend

    def zero_tail(q, k, v, **kw):
        o, lse = reference.sliding_window_attention(q, k, v, **kw)
        full = (o.shape[2] // 64) * 64
        o, lse = o.clone(), lse.clone()
        o[:, :, full:] = 0
        lse[:, :, full:] = 0.0
        return o, lse

    cmp = diff.compare_backends(REF, Backend(name="zero_tail", fn=zero_tail, origin="test"), "cpu")
    assert cmp.b.explained_by is not None and cmp.b.explained_by.rule == "unwritten_rows"
    cmp = diff.compare_backends(REF, mutant("fp16_probabilities"), "cpu")
    assert cmp.b.explained_by is not None and cmp.b.explained_by.rule == "low_precision"


def test_a_backend_that_serves_no_case_is_reported_as_such(capsys):
    """B refusing every case (TileLang's forced split-KV on CPU tensors) is not 'conforms on
    all 0 cases' nor a rule difference: the result says nothing was compared (exit 1)."""
    assert diff.main(["reference", "tilelang-split", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert last.startswith("result: NOTHING COMPARED: tilelang-split served none of the"), last
    assert "conforms to SPEC.md on all 0 cases" not in out


# --------------------------------------------- bugs outside the mutants (a reviewer's exercise)

def _capped_key_loop(q, k, v, **kw):
    """A mask bug a precision signature could mistake: keys 256 or more positions back are
    dropped (a key loop capped at 256), so only rows past 255 of the 300-key 'long' case
    differ, by a small-looking amount."""
    import reference
    from conformance.mutants import _attend, _true_mask
    from reference.mask import key_positions, query_positions

    p = reference.check_inputs(q, k, v, **kw)

    def capped(p, i0, i1):
        f = p.int64_framed()
        qpos = query_positions(f.Lq, f.Lk, f.kv_start)[i0:i1]
        return _true_mask(p, i0, i1) & ((qpos[:, None] - key_positions(f.Lk, f.kv_start)[None, :]) < 256)

    return _attend(q, k, v, p, capped)


def test_a_capped_key_loop_is_a_mask_bug_not_low_precision():
    """The failing case's own configuration is probed: its mask differs on rows 256-299,
    so the precision signature does not claim it, and the report says where and how to
    see it."""
    d = diff.diagnose(_capped_key_loop)
    assert d.explained_by is None or d.explained_by.rule != "low_precision", d.explained_by
    assert d.failing() == ["long"]
    assert int(d.case_probes["long"].any(dim=1).nonzero().min()) == 256
    lines = "\n".join(diff._diag_lines(d))
    assert "probe of case long" in lines and "rows 256-299" in lines
    assert "hils-swa probe _capped_key_loop --lq 300 --lk 300 --window 256 --chunk 64" in lines


def _gqa_modulo_above_two(q, k, v, **kw):
    """GQA mapped h % Hkv, but only where the group is larger than 2."""
    import reference
    from conformance.mutants import gqa_modulo

    G = q.shape[1] // max(k.shape[1], 1)
    return (gqa_modulo if G > 2 else reference.sliding_window_attention)(q, k, v, **kw)


def _fp16_accumulation(q, k, v, **kw):
    """Accumulated in the input dtype, but only for fp16 inputs."""
    import reference
    from conformance.mutants import low_precision_accumulation

    fn = low_precision_accumulation if q.dtype == torch.float16 else reference.sliding_window_attention
    return fn(q, k, v, **kw)


def test_bugs_past_a_group_of_two_or_in_fp16_only_are_not_equivalent():
    """diff's cases include a group of four and an fp16 call: a GQA bug that needs G > 2 is
    seen (its one failing case consistent with [gqa]), and an fp16-only accumulator bug is
    named low_precision with the 16-bit evidence."""
    d = diff.diagnose(_gqa_modulo_above_two)
    assert not d.conforms and d.failing() == ["gqa4"] and "gqa" in d.per_case["gqa4"]
    d = diff.diagnose(_fp16_accumulation)
    assert d.failing() == ["fp16"]
    assert d.explained_by is not None and d.explained_by.rule == "low_precision", d.explained_by
    assert "only 16-bit cases fail" in d.explained_by.evidence


def test_equivalent_says_what_it_covered(capsys):
    assert diff.main(["reference", "reference", "--device", "cpu"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("result: EQUIVALENT") and "hils-swa conform" in last


def _raises_bare(q, k, v, **kw):
    raise RuntimeError()


def test_an_exception_without_a_message_is_reported_not_a_crash():
    """A backend that raises with an empty message (a bare ``assert`` in a kernel wrapper)
    gets a report, not an IndexError from diff itself."""
    cmp = diff.compare_backends(REF, _raises_bare, "cpu")
    report = diff.format_report(cmp, "cpu")
    assert "every case raised the same error" in report and "RuntimeError" in report
