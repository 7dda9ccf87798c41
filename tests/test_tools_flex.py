"""The FlexAttention backend against reference.golden under the conformance verdict (CPU, eager)."""

from __future__ import annotations

import math

import pytest
import torch

import reference
from conformance import verdict
from conformance.cases import poison_unseen
from reference import visibility_mask
from tools import flex_backend as flex

CONFIGS = [
    # (B, Hq, Hkv, Lq, Lk, Dqk, Dv, dtype, rule)
    (1, 2, 2, 16, 16, 16, 16, torch.float32, dict(window_size=3, chunk_size=4)),
    (2, 4, 2, 5, 20, 16, 16, torch.float32, dict(window_size=3, chunk_size=4, kv_start=5)),          # Lq<Lk, GQA
    (1, 4, 1, 7, 30, 32, 16, torch.bfloat16, dict(window_size=5, chunk_size=4, kv_start=3)),         # Dqk != Dv
    (1, 2, 2, 8, 8, 16, 16, torch.float32, dict(window_size=3, chunk_size=1)),                       # all rows empty
    (1, 2, 1, 10, 10, 16, 16, torch.float16, dict(window_size=1, chunk_size=2, expand_to_chunk=False,
                                                  sm_scale=0.3)),                                   # half empty
    (1, 2, 2, 9, 40, 16, 16, torch.float32, dict(window_size=6, chunk_size=4, kv_start=2, mask_lmk=False)),
]


def _inputs(B, Hq, Hkv, Lq, Lk, Dqk, Dv, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, Lq, Dqk, generator=g).to(dtype), torch.randn(B, Hkv, Lk, Dqk, generator=g).to(dtype),
            torch.randn(B, Hkv, Lk, Dv, generator=g).to(dtype))


@pytest.mark.parametrize("cfg", CONFIGS, ids=[f"cfg{i}" for i in range(len(CONFIGS))])
def test_flex_matches_golden(cfg):
    *shape, dtype, rule = cfg
    q, k, v = _inputs(*shape, dtype)
    o, lse = flex.sliding_window_attention(q, k, v, **rule)
    v_ = verdict.judge(o, lse, verdict.expected(q, k, v, dict(rule)))
    assert v_.status == "pass", v_.message("flex", str(cfg))


def test_flex_strided_inputs_and_nan_in_unseen_slots():
    rule = dict(window_size=4, chunk_size=4, kv_start=1)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 6, 2, 16, generator=g).transpose(1, 2)
    k = torch.randn(1, 24, 1, 16, generator=g).transpose(1, 2)
    v = torch.randn(1, 24, 1, 24, generator=g)[..., :16].transpose(1, 2)
    exp = verdict.expected(q, k, v, dict(rule))
    k2, v2 = k.clone(), v.clone()
    dead = poison_unseen(k2, v2, 6, rule)
    assert dead.sum() >= 10 and k2[:, :, dead].isnan().all()  # the left prefix and the landmarks
    o, lse = flex.sliding_window_attention(q, k2, v2, **rule)
    res = verdict.judge(o, lse, exp)
    assert res.status == "pass", res.message("flex", "nan")
    assert o.is_contiguous()


def test_flex_lse_is_natural_log():
    q = torch.zeros(1, 1, 8, 16)
    k = torch.randn(1, 1, 8, 16)
    v = torch.randn(1, 1, 8, 16)
    _, lse = flex.sliding_window_attention(q, k, v, window_size=3, chunk_size=4)
    n = visibility_mask(8, 8, window_size=3, chunk_size=4).sum(dim=1)
    assert torch.allclose(lse[0, 0].double(), n.double().log(), atol=1e-6)


def test_flex_mask_mod_is_the_reference_rule_on_index_tensors():
    rule = dict(window_size=5, chunk_size=4, mask_lmk=True, expand_to_chunk=True)
    Lq, Lk, kv = 7, 19, 6
    mm = flex.make_mask_mod(**rule, q_pos0=torch.tensor(kv + Lk - Lq), k_pos0=torch.tensor(kv))
    qi = torch.arange(Lq)[:, None]
    kj = torch.arange(Lk)[None, :]
    got = mm(torch.tensor(0), torch.tensor(0), qi, kj)
    assert torch.equal(got, visibility_mask(Lq, Lk, kv_start=kv, **rule))


def test_flex_validates_before_running():
    q, k, v = _inputs(1, 3, 2, 4, 8, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="Hq % Hkv"):
        flex.sliding_window_attention(q, k, v, window_size=3, chunk_size=4)
    q, k, v = _inputs(1, 2, 2, 4, 8, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="kv_start"):
        flex.sliding_window_attention(q, k, v, window_size=3, chunk_size=4, kv_start=-1)
    with pytest.raises(ValueError, match="sm_scale"):
        flex.sliding_window_attention(q, k, v, window_size=3, chunk_size=4, sm_scale=math.inf)


def test_flex_empty_dims():
    q, k, v = _inputs(1, 2, 2, 0, 8, 16, 16, torch.float32)
    o, lse = flex.sliding_window_attention(q, k, v, window_size=3, chunk_size=4)
    assert o.shape == (1, 2, 0, 16) and lse.shape == (1, 2, 0) and lse.dtype == torch.float32


def test_flex_is_registered():
    from conformance.registry import load_backend

    b = load_backend("flex")
    q, k, v = _inputs(1, 2, 1, 4, 8, 16, 16, torch.float32)
    o, lse = b.fn(q, k, v, window_size=3, chunk_size=4)
    go, gl = reference.golden(q, k, v, window_size=3, chunk_size=4)
    assert (o.double() - go).abs().max() < 1e-5
