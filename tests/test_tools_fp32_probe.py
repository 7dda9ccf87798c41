"""tools.fp32_probe on the CPU: Triton's interpreter and TileLang's C kernel, one seed."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tools import fp32_probe

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU form (the GPU one is a device run)")


def test_probe_records_every_backend_with_and_without_nan_v(tmp_path, capsys):
    rc = fp32_probe.main(["--out", str(tmp_path), "--device", "cpu", "--seeds", "1",
                          "--only", "dec B2 H4x2 k129 D64 W8C16"])
    assert rc == 0
    data = json.loads((tmp_path / "fp32_probe.json").read_text())
    rows = data["rows"]
    assert [r["nan_v"] for r in rows] == [False, True]
    for r in rows:
        assert 0 < r["same"] < 1e-5 and r["bound"] > 2 * r["same"] and 0 < r["same_in_3"] < 1e-5
        assert r["same_on"] == "cpu" and r["same_here"] == r["same"]  # on the CPU: the same run
        for who in fp32_probe.WHO:
            # fp32 computed to fp32 accuracy: within a few ulps of 1, not bf16's 1e-2
            assert isinstance(r[who], float) and 0 <= r[who] < 1e-5, (who, r[who])
            assert math.isclose(r[who + "_ratio"], r[who] / r["bound"])
            assert r[who + "_spread"] == 0  # one query: every row of the tile sees the key
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 * len(fp32_probe.WHO) and all("ratio max" in x for x in lines)
