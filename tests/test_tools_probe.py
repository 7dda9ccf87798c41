"""hils-swa probe: the black-box mask recovery (CPU, reference and mutants)."""

from __future__ import annotations

import pytest
import torch

from conformance.mutants import mutant
from reference import visibility_mask
from tools import probe
from tools._common import resolve_backend

REF = resolve_backend("reference").fn

CONFIGS = [
    dict(Lq=8, Lk=8, window_size=3, chunk_size=4),
    dict(Lq=4, Lk=10, window_size=3, chunk_size=4, kv_start=5),
    dict(Lq=6, Lk=15, window_size=4, chunk_size=3, kv_start=2, expand_to_chunk=False),
    dict(Lq=6, Lk=15, window_size=4, chunk_size=3, kv_start=7, mask_lmk=False),
    dict(Lq=5, Lk=5, window_size=2, chunk_size=1),          # every key a landmark: all rows empty
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_probe_recovers_reference_mask_exactly(cfg):
    c = dict(cfg)
    Lq, Lk = c.pop("Lq"), c.pop("Lk")
    res = probe.probe_mask(REF, Lq, Lk, **c)
    assert torch.equal(res.mask, visibility_mask(Lq, Lk, **c))
    assert res.problems == []


def test_probe_splits_keys_over_heads_when_lk_exceeds_head_dim():
    res = probe.probe_mask(REF, 7, 40, window_size=9, chunk_size=4, kv_start=3, head_dim=16, heads_per_call=2)
    assert res.calls == 2 and res.head_dim == 16  # 3 heads of 16 keys, 2 per call
    assert torch.equal(res.mask, visibility_mask(7, 40, window_size=9, chunk_size=4, kv_start=3))
    assert res.problems == []


def test_probe_flags_landmark_mutant_cells():
    res = probe.probe_mask(mutant("landmark_from_index").fn, 4, 10, window_size=3, chunk_size=4, kv_start=5)
    want = visibility_mask(4, 10, window_size=3, chunk_size=4, kv_start=5)
    diff = res.mask != want
    # true landmarks: positions 7, 11 (j = 2, 6); the mutant hides j = 3, 7 ((j + 1) % 4 == 0)
    # instead, so j = 6 becomes visible and j = 3 hidden (j = 2 lies left of every window)
    assert res.mask[:, 6].any() and not want[:, 6].any()
    assert want[:, 3].any() and not res.mask[:, 3].any()
    assert set(diff.any(dim=0).nonzero().flatten().tolist()) == {3, 6, 7}


def test_probe_draws_l_only_on_the_references_landmarks():
    """A key inside the window that the backend hides but that is no landmark is drawn
    '.', not 'L' (the legend's L is the reference's landmark): landmark_shifted hides
    position 8 (j = 3) and shows the landmark at 11 (j = 6)."""
    kw = dict(Lq=4, Lk=10, window_size=3, chunk_size=4, mask_lmk=True, expand_to_chunk=True, kv_start=5)
    res = probe.probe_mask(mutant("landmark_shifted").fn, kw["Lq"], kw["Lk"],
                           **{k: v for k, v in kw.items() if k not in ("Lq", "Lk")})
    text, ok = probe.format_report("m", res, device="cpu", **kw)
    row0 = next(line for line in text.splitlines() if line.startswith("  0  "))
    got, want = row0.split()[1:3]
    assert not ok and want == "...###L..." and got == "....###...", row0


def test_probe_reports_base2_lse():
    res = probe.probe_mask(mutant("lse_base2").fn, 8, 8, window_size=3, chunk_size=4)
    assert torch.equal(res.mask, visibility_mask(8, 8, window_size=3, chunk_size=4))
    assert any("base-2" in p for p in res.problems)


def test_probe_reports_nan_empty_rows():
    res = probe.probe_mask(mutant("empty_rows_nan").fn, 5, 5, window_size=2, chunk_size=1)
    assert any("NaN" in p for p in res.problems)


def test_probe_cli_exit_codes_and_pictures(capsys):
    assert probe.main(["reference", "--lq", "4", "--lk", "10", "--kv-start", "5", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "...###L..." in out and "result: EQUAL" in out
    assert probe.main(["mutant:window_off_by_one", "--lq", "8", "--lk", "12", "--kv-start", "5",
                       "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "result: DIFFERENT" in out and "+" in out
    assert probe.main(["reference", "--lq", "9", "--lk", "4", "--device", "cpu"]) == 2


def test_porting_guide_probe_sample_is_current(capsys):
    """docs/porting.md shows a probe of a mutant: it must be what the tool prints."""
    import pathlib

    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "porting.md").read_text()
    probe.main(["mutant:landmark_from_index", "--lq", "4", "--lk", "10", "--kv-start", "5", "--device", "cpu"])
    out = capsys.readouterr().out.splitlines()
    shown = out[:out.index("") + 1 + 2 + 4 + 1]  # header, blank, two title lines, four rows
    for line in shown:
        assert line.rstrip() in doc, line


def _broken(q, k, v, **kw):
    raise RuntimeError("kernel launch failed")


def test_probe_cli_reports_a_crashing_backend(capsys):
    assert probe.main(["tests.test_tools_probe:_broken", "--device", "cpu"]) == 1
    assert "raised RuntimeError" in capsys.readouterr().err
