"""GPU tier of the tools: compiled FlexAttention and the bench's CUDA-graph path."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CONFIGS = [
    # (B, Hq, Hkv, Lq, Lk, D, dtype, rule)
    (2, 8, 2, 200, 1000, 64, torch.bfloat16, dict(window_size=256, chunk_size=64, kv_start=37)),
    (1, 4, 4, 300, 300, 128, torch.float16, dict(window_size=100, chunk_size=32)),
    (1, 4, 1, 1, 5000, 64, torch.bfloat16, dict(window_size=512, chunk_size=64, kv_start=3)),   # decode
    (1, 2, 2, 64, 64, 64, torch.float32, dict(window_size=1, chunk_size=2, expand_to_chunk=False)),  # empty rows
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=[f"cfg{i}" for i in range(len(CONFIGS))])
def test_compiled_flex_matches_golden(cfg):
    from conformance import verdict
    from conformance.cases import poison_unseen
    from tools import flex_backend as flex

    B, Hq, Hkv, Lq, Lk, D, dtype, rule = cfg
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dtype, generator=g)
    exp = verdict.expected(q, k, v, dict(rule))
    poison_unseen(k, v, Lq, rule)  # slots no query sees: must not matter
    o, lse = flex.sliding_window_attention(q, k, v, **rule)
    res = verdict.judge(o, lse, exp)
    assert res.status == "pass", res.message("flex-cuda", str(cfg))


def test_compiled_flex_new_kv_start_does_not_recompile():
    import torch._dynamo.utils as du

    from tools import flex_backend as flex

    q = torch.randn(1, 4, 128, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 4, 2048, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    flex.sliding_window_attention(q, k, v, window_size=512, chunk_size=64, kv_start=0)
    before = du.counters["stats"]["unique_graphs"]
    for kv in (64, 128, 640):  # same sliced length (multiples of C): only the offsets change
        flex.sliding_window_attention(q, k, v, window_size=512, chunk_size=64, kv_start=kv)
    assert du.counters["stats"]["unique_graphs"] == before


def test_bench_times_flex_and_sdpa_under_cuda_graphs(tmp_path, capsys):
    from tools import bench

    js = tmp_path / "b.json"
    # one shape: "decode-8k" names two (--shapes takes substrings)
    rc = bench.main(["--shapes", "decode-8k-32/32/128", "--backend", "flex,sdpa", "--reps", "3",
                     "--json", str(js)])
    out = capsys.readouterr().out
    assert rc == 0, out
    res = json.loads(js.read_text())["results"]
    assert [r["status"] for r in res] == ["ok", "ok"], out
    assert all(r["kernel_us"] is not None and r["kernel_us"] > 0 for r in res), out
