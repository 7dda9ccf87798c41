"""The windowed reference against independent dense computations, invariants,
errors and empty dimensions."""

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference
from reference import attention as ref_attention
from reference import golden, same_dtype, sliding_window_attention, visibility_mask

ARGS = dict(window_size=37, chunk_size=16, kv_start=5)


def rand(*shape, dtype=torch.float64, gen=None):
    return torch.randn(*shape, dtype=dtype, generator=gen)


def dense(q, k, v, mask, scale):
    """Dense masked softmax in float64 from a given (Lq, Lk) mask."""
    G = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(G, 1)
    v = v.double().repeat_interleave(G, 1)
    s = (q.double() @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0)[..., None])
    return p @ v, lse


@st.composite
def configs(draw):
    Hkv = draw(st.integers(1, 3))
    G = draw(st.sampled_from([1, 2, 3]))
    Lk = draw(st.integers(1, 90))
    Lq = draw(st.integers(1, Lk))
    return dict(
        B=draw(st.integers(1, 2)), Hkv=Hkv, Hq=Hkv * G, Lq=Lq, Lk=Lk,
        Dqk=draw(st.sampled_from([1, 4, 8])), Dv=draw(st.sampled_from([1, 3, 8])),
        window_size=draw(st.integers(1, 100)), chunk_size=draw(st.integers(1, 20)),
        mask_lmk=draw(st.booleans()), expand_to_chunk=draw(st.booleans()),
        kv_start=draw(st.sampled_from([0, 1, 7, 15, 16, 1_000_003])),
        sm_scale=draw(st.sampled_from([None, 0.3, 2.0])),
        tile=draw(st.sampled_from([1 << 22, 64, 7])),  # exercise query/key blocking
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_golden_matches_dense_masked_softmax(cfg):
    g = torch.Generator().manual_seed(cfg["seed"])
    q = rand(cfg["B"], cfg["Hq"], cfg["Lq"], cfg["Dqk"], gen=g)
    k = rand(cfg["B"], cfg["Hkv"], cfg["Lk"], cfg["Dqk"], gen=g)
    v = rand(cfg["B"], cfg["Hkv"], cfg["Lk"], cfg["Dv"], gen=g)
    rule = {n: cfg[n] for n in ("window_size", "chunk_size", "mask_lmk", "expand_to_chunk", "kv_start")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ref_attention, "_TILE_ELEMS", cfg["tile"])
        o, lse = golden(q, k, v, sm_scale=cfg["sm_scale"], **rule)
    mask = visibility_mask(cfg["Lq"], cfg["Lk"], **rule)
    scale = cfg["sm_scale"] if cfg["sm_scale"] is not None else 1 / math.sqrt(cfg["Dqk"])
    od, ld = dense(q, k, v, mask, scale)
    assert o.dtype == lse.dtype == torch.float64
    empty = ~mask.any(1)
    assert torch.equal(torch.isneginf(lse), empty.expand_as(lse))
    assert bool((o[..., empty, :] == 0).all())
    torch.testing.assert_close(o, od, rtol=1e-12, atol=1e-12)
    fin = torch.isfinite(ld)
    torch.testing.assert_close(lse[fin], ld[fin], rtol=1e-12, atol=1e-12)


def test_canonical_dtypes_and_layout():
    q, k, v = (rand(2, 4, 50, 16, dtype=torch.bfloat16) for _ in range(3))
    o, lse = sliding_window_attention(q, k, v, **ARGS)
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert o.shape == (2, 4, 50, 16) and lse.shape == (2, 4, 50) and o.is_contiguous()
    og, lg = golden(q, k, v, **ARGS)
    assert torch.equal(o, og.to(torch.bfloat16)) and torch.equal(lse, lg.float())


def test_gqa_equals_repeated_kv_heads():
    q, k, v = rand(2, 8, 40, 8), rand(2, 2, 60, 8), rand(2, 2, 60, 4)
    o, lse = golden(q, k, v, **ARGS)
    o2, lse2 = golden(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), **ARGS)
    torch.testing.assert_close(o, o2, rtol=0, atol=1e-14)
    torch.testing.assert_close(lse, lse2, rtol=0, atol=1e-14)
    # head h reads kv head h // G: perturbing kv head 1 changes query heads 4..7 only
    k3 = k.clone()
    k3[:, 1] = rand(2, 60, 8)  # (adding a constant would not change the softmax)
    o3, _ = golden(q, k3, v, **ARGS)
    assert torch.equal(o3[:, :4], o[:, :4]) and not torch.allclose(o3[:, 4:], o[:, 4:])


@pytest.mark.parametrize("Lq,Lk,W,ks", [(64, 64, 9, 0), (20, 70, 16, 3), (1, 33, 5, 1000)])
def test_plain_window_equals_sdpa(Lq, Lk, W, ks):
    q, k, v = rand(1, 3, Lq, 8), rand(1, 3, Lk, 8), rand(1, 3, Lk, 8)
    o, _ = golden(q, k, v, window_size=W, chunk_size=7, mask_lmk=False,
                  expand_to_chunk=False, kv_start=ks)
    i = torch.arange(Lq)[:, None] + (Lk - Lq)  # query index in key coordinates
    j = torch.arange(Lk)[None, :]
    band = (j <= i) & (j > i - W)  # written independently of reference.mask
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=band)
    torch.testing.assert_close(o, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mask_lmk", [True, False])
def test_invisible_slots_change_nothing(mask_lmk):
    kw = dict(window_size=20, chunk_size=8, mask_lmk=mask_lmk, kv_start=3)
    q, k, v = rand(1, 2, 30, 8), rand(1, 2, 90, 8), rand(1, 2, 90, 8)
    o, lse = golden(q, k, v, **kw)
    seen = visibility_mask(30, 90, **kw).any(0)
    assert not bool(seen.all()), "the case must have invisible slots"
    k2, v2 = k.clone(), v.clone()
    k2[:, :, ~seen] = float("nan")
    v2[:, :, ~seen] = float("inf")
    v2[:, :, ~seen, 0] = float("nan")
    o2, lse2 = golden(q, k2, v2, **kw)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def test_nan_in_a_visible_key_reaches_exactly_its_rows():
    kw = dict(window_size=4, chunk_size=64, mask_lmk=False, expand_to_chunk=False)
    q, k, v = rand(1, 1, 16, 4), rand(1, 1, 16, 4), rand(1, 1, 16, 4)
    v[0, 0, 5, 2] = float("nan")
    o, _ = golden(q, k, v, **kw)
    rows_seeing_5 = visibility_mask(16, 16, **kw)[:, 5]
    assert torch.equal(torch.isnan(o[0, 0]).any(1), rows_seeing_5)
    assert torch.equal(torch.isnan(o[0, 0, :, 2]), rows_seeing_5)


def test_blhd_views_equal_contiguous():
    B, L, H, D = 2, 45, 4, 8
    qs, ks, vs = rand(B, L, H, D), rand(B, L, 2, D), rand(B, L, 2, D)
    views = [t.transpose(1, 2) for t in (qs, ks, vs)]
    assert not views[0].is_contiguous()
    o1, l1 = golden(*views, **ARGS)
    o2, l2 = golden(*(t.contiguous() for t in views), **ARGS)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


def test_same_dtype_is_low_precision_but_close():
    q, k, v = (torch.randn(1, 2, 128, 64).bfloat16() for _ in range(3))
    og, lg = golden(q, k, v, **ARGS)
    os_, ls = same_dtype(q, k, v, **ARGS)
    assert os_.dtype == torch.bfloat16 and ls.dtype == torch.float32
    err = (os_.double() - og).abs().max().item()
    assert 0 < err < 5e-2
    q32, k32, v32 = (t.float() for t in (q, k, v))
    o32, _ = same_dtype(q32, k32, v32, **ARGS)
    assert (o32.double() - og).abs().max().item() < 1e-5


def test_key_blocks_merge_exactly(monkeypatch):
    """A long window split across key blocks equals the single-block result."""
    q, k, v = rand(1, 2, 100, 8), rand(1, 2, 400, 8), rand(1, 2, 400, 8)
    kw = dict(window_size=380, chunk_size=16, kv_start=11)
    o1, l1 = golden(q, k, v, **kw)
    monkeypatch.setattr(ref_attention, "_TILE_ELEMS", 300)
    o2, l2 = golden(q, k, v, **kw)
    torch.testing.assert_close(o1, o2, rtol=0, atol=1e-14)
    torch.testing.assert_close(l1, l2, rtol=0, atol=1e-14)


def _good():
    return rand(1, 4, 8, 16, dtype=torch.float32), rand(1, 2, 10, 16, dtype=torch.float32), \
        rand(1, 2, 10, 8, dtype=torch.float32)


BAD = {
    "q-not-4d": (lambda q, k, v: (q[0], k, v), {}, "q"),
    "k-not-tensor": (lambda q, k, v: (q, k.tolist(), v), {}, "k"),
    "int-dtype": (lambda q, k, v: (q.int(), k, v), {}, "q.dtype"),
    "mixed-dtype": (lambda q, k, v: (q, k.half(), v), {}, "dtype"),
    "fp64-not-canonical": (lambda q, k, v: (q.double(), k.double(), v.double()), {}, "q.dtype"),
    "batch-mismatch": (lambda q, k, v: (q, torch.cat([k, k]), v), {}, "B"),
    "dqk-mismatch": (lambda q, k, v: (q, k[..., :8], v), {}, "Dqk"),
    "lk-mismatch": (lambda q, k, v: (q, k, v[:, :, :9]), {}, "Lk"),
    "hkv-mismatch": (lambda q, k, v: (q, k, v[:, :1]), {}, "Hkv"),
    "heads-not-divisible": (lambda q, k, v: (q[:, :3], k, v), {}, "Hq % Hkv"),
    "lq-above-lk": (lambda q, k, v: (torch.cat([q, q], 2), k, v), {}, "Lq"),
    "window-0": (lambda q, k, v: (q, k, v), {"window_size": 0}, "window_size"),
    "window-float": (lambda q, k, v: (q, k, v), {"window_size": 4.0}, "window_size"),
    "chunk-0": (lambda q, k, v: (q, k, v), {"chunk_size": 0}, "chunk_size"),
    "kv-start-negative": (lambda q, k, v: (q, k, v), {"kv_start": -1}, "kv_start"),
    "scale-nan": (lambda q, k, v: (q, k, v), {"sm_scale": float("nan")}, "sm_scale"),
    "scale-inf": (lambda q, k, v: (q, k, v), {"sm_scale": float("inf")}, "sm_scale"),
    "flag-not-bool": (lambda q, k, v: (q, k, v), {"mask_lmk": 1}, "mask_lmk"),
    # numpy's bool is not a bool, and the message says which type it got
    "flag-numpy-bool": (lambda q, k, v: (q, k, v), {"expand_to_chunk": np.True_}, "numpy.bool"),
    # float() parses text and overflows on large ints: neither may pass or escape as another error
    "scale-text": (lambda q, k, v: (q, k, v), {"sm_scale": "0.5"}, "sm_scale"),
    "scale-bytes": (lambda q, k, v: (q, k, v), {"sm_scale": b"0.5"}, "sm_scale"),
    "scale-huge-int": (lambda q, k, v: (q, k, v), {"sm_scale": 10 ** 400}, "sm_scale"),
    # layouts SPEC's strided tensors exclude (sparse, nested): one clear error, not torch's
    "k-sparse-coo": (lambda q, k, v: (q, k.to_sparse(), v), {}, "k must be a dense"),
    "q-sparse-csr": (lambda q, k, v: (_quiet(q.to_sparse, layout=torch.sparse_csr, dense_dim=2), k, v),
                     {}, "q must be a dense"),
    "v-nested": (lambda q, k, v: (q, k, _nested(v)), {}, "v must be a dense"),
    "k-nested-jagged": (lambda q, k, v: (q, _nested(k, torch.jagged), v), {}, "k must be a dense"),
    "q-nested-3d": (lambda q, k, v: (_nested(q[0]), k, v), {}, "q must be a dense"),
    "q-nested-5d": (lambda q, k, v: (_nested(q[None]), k, v), {}, "q must be a dense"),
}


def _quiet(f, *args, **kwargs):
    """``f(...)`` without its warnings (the sparse CSR and nested APIs' beta notices)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f(*args, **kwargs)


def _nested(x, layout=torch.strided):
    """``x`` as a nested tensor of its batch rows (4-D, same dtype and device)."""
    return _quiet(torch.nested.nested_tensor, list(x), layout=layout)


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_raises_value_error_naming_the_argument(name):
    make, extra, needle = BAD[name]
    args = dict(window_size=4, chunk_size=4) | extra
    with pytest.raises(ValueError, match=None) as e:
        sliding_window_attention(*make(*_good()), **args)
    assert needle in str(e.value), str(e.value)


def test_meta_device_mix_is_rejected():
    q, k, v = _good()
    with pytest.raises(ValueError, match="device"):
        sliding_window_attention(q, k.to("meta"), v, window_size=4, chunk_size=4)


@pytest.mark.parametrize("shapes", [
    ((0, 2, 5, 8), (0, 1, 5, 8), (0, 1, 5, 4)),
    ((1, 2, 0, 8), (1, 1, 5, 8), (1, 1, 5, 4)),
    ((1, 2, 0, 8), (1, 1, 0, 8), (1, 1, 0, 4)),
    ((1, 0, 5, 8), (1, 0, 5, 8), (1, 0, 5, 4)),
    ((1, 2, 5, 8), (1, 1, 5, 8), (1, 1, 5, 0)),
])
def test_empty_dimensions_return_empty_outputs(shapes):
    q, k, v = (torch.randn(*s) for s in shapes)
    o, lse = sliding_window_attention(q, k, v, window_size=4, chunk_size=4)
    B, Hq, Lq, _ = shapes[0]
    assert o.shape == (B, Hq, Lq, shapes[2][3]) and lse.shape == (B, Hq, Lq)
    assert lse.dtype == torch.float32 and o.dtype == q.dtype
    if 0 not in (B, Hq, Lq):  # Dv == 0: o is empty but lse is defined
        torch.testing.assert_close(lse, golden(q, k, v, window_size=4, chunk_size=4)[1].float())
        assert bool(torch.isfinite(lse).all())


def test_zero_dqk_is_uniform_attention():
    q, k, v = torch.randn(1, 1, 6, 0), torch.randn(1, 1, 6, 0), torch.randn(1, 1, 6, 3)
    o, lse = golden(q, k, v, window_size=2, chunk_size=100, expand_to_chunk=False)
    torch.testing.assert_close(lse[0, 0, 1:], torch.full((5,), math.log(2), dtype=torch.float64))


def test_public_names():
    for name in reference.__all__:
        assert hasattr(reference, name)


def test_check_inputs_problem_is_a_plain_problem():
    """check_inputs builds its Problem without the dataclass __init__ (host time):
    the result must be indistinguishable from one the constructor builds (equal,
    same hash, frozen, every field set), and a missing field is refused."""
    import dataclasses

    from reference.validation import Problem, check_inputs

    q, k, v = (torch.randn(1, 2, 5, 8), torch.randn(1, 1, 7, 8), torch.randn(1, 1, 7, 4))
    p = check_inputs(q, k, v, window_size=3, chunk_size=2, kv_start=4, sm_scale=0.5)
    built = Problem(**{f.name: getattr(p, f.name) for f in dataclasses.fields(Problem)})
    assert p == built and hash(p) == hash(built) and repr(p) == repr(built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.Lq = 3
    with pytest.raises(TypeError):
        Problem._fast(B=1)


@pytest.mark.parametrize("tile", [1 << 22, 7], ids=["one-block", "blocks-merged"])
@pytest.mark.parametrize("scale", [1.0, 1e8, 1e150])  # max scores 4, 4e16, 4e300
def test_golden_is_exact_at_huge_scores(monkeypatch, tile, scale):
    """Scores far past 1e16, where log(l) vanishes next to the max score in float64:
    golden's weights still sum to 1 (each block divides by its sum; blocks merge by their
    maxima), so tied keys average exactly and lse = max + log(count), whether the key range
    is one block or many (``_TILE_ELEMS`` 7: 64-key blocks of one query each)."""
    monkeypatch.setattr(ref_attention, "_TILE_ELEMS", tile)
    Lk = 200
    q = torch.full((1, 1, 1, 4), scale, dtype=torch.float64)
    k = torch.zeros(1, 1, Lk, 4, dtype=torch.float64)
    tied = [3, 70, 150, 199]  # in different 64-key blocks
    k[0, 0, tied] = scale
    v = torch.randn(1, 1, Lk, 3, dtype=torch.float64)
    o, lse = golden(q, k, v, window_size=Lk, chunk_size=1000, sm_scale=1.0)
    if scale == 1.0:  # small scores: the other keys (score 0) weigh in; dense softmax
        s = (q[0, 0] @ k[0, 0].T).flatten()
        assert torch.allclose(o[0, 0, 0], torch.softmax(s, 0) @ v[0, 0], rtol=1e-12, atol=1e-14)
        assert lse.item() == pytest.approx(torch.logsumexp(s, 0).item(), rel=1e-14)
        return
    assert torch.allclose(o[0, 0, 0], v[0, 0, tied].mean(0), rtol=1e-12, atol=0)
    assert lse.item() == pytest.approx(4 * scale * scale + math.log(len(tied)), rel=1e-15)


@pytest.mark.parametrize("tile", [1 << 22, 7], ids=["one-block", "blocks-merged"])
def test_infinite_score_gives_spec_formula_values(monkeypatch, tile):
    """A visible key with score +inf: SPEC's formula gives lse = log(inf) = +inf and
    o = exp(inf - inf) * v = NaN (the whole row), whatever the blocking; a -inf score adds
    nothing (a row whose visible scores are all -inf is an empty row: o = 0, lse = -inf)."""
    monkeypatch.setattr(ref_attention, "_TILE_ELEMS", tile)
    q = torch.ones(1, 1, 2, 4, dtype=torch.float64)
    q[0, 0, 1] = -1.0  # row 1 scores the same key -inf
    k = torch.randn(1, 1, 130, 4, dtype=torch.float64)
    k[0, 0, 100] = float("inf")
    v = torch.randn(1, 1, 130, 3, dtype=torch.float64)
    o, lse = golden(q, k, v, window_size=130, chunk_size=1000)
    assert lse[0, 0, 0] == float("inf") and o[0, 0, 0].isnan().all()
    ref1 = golden(q[:, :, 1:], torch.cat([k[:, :, :100], k[:, :, 101:]], 2),
                  torch.cat([v[:, :, :100], v[:, :, 101:]], 2), window_size=129, chunk_size=1000)
    assert torch.allclose(o[0, 0, 1], ref1[0][0, 0, 0]) and torch.isclose(lse[0, 0, 1], ref1[1][0, 0, 0])
    k2 = torch.full((1, 1, 3, 4), float("-inf"), dtype=torch.float64)
    o2, lse2 = golden(q[:, :, :1], k2, v[:, :, :3], window_size=3, chunk_size=1000)
    assert (o2 == 0).all() and lse2.item() == float("-inf")


def test_meta_tensors_are_unsupported_not_a_crash():
    """A valid call on the meta device has no values: UnsupportedConfig (SPEC's class for a
    valid input a backend cannot serve), as the kernels' packages raise, not the RuntimeError
    of ``Tensor.item()`` deep inside; empty calls still return their empty outputs."""
    from reference import UnsupportedConfig

    q = torch.empty(1, 1, 4, 32, device="meta")
    k = torch.empty(1, 1, 6, 32, device="meta")
    with pytest.raises(UnsupportedConfig, match="meta"):
        reference.sliding_window_attention(q, k, k, window_size=3, chunk_size=4)
    o, lse = reference.sliding_window_attention(q[:, :, :0], k, k, window_size=3, chunk_size=4)
    assert o.shape == (1, 1, 0, 32) and lse.shape == (1, 1, 0)
