"""TileLang's chunk view of ``v`` on the GPU (session 25: ``launch.v_chunk_call`` /
``v_chunk_view``, knob ``v_chunk`` of ``kernels.fwd_tc``).

A call with ``kv_start`` and ``Lk`` multiples of the chunk (landmarks masked, edges expanded)
reads V tiles through a 5-D view that leaves every chunk's landmark row out, so the copy
engine writes those rows as zeros instead of the consumer. Here, with NaN in every key slot
no query sees (landmark rows included) and the outputs poisoned, the view kernel must pass
the suite's verdict and give the bits of the same call on the kernel that zeroes the rows
(``v_chunk`` off), for both layouts, Lq < Lk, GQA-packed rows and the chunk sizes the view
serves on each tile (one chunk; since session 26 two or four whole chunks of D <= 64's
128-key tile, which since session 42 serves calls of one query block only, long ones running
the 64-key tile of ``launch.shipped_config``; the view permitted up to four here whatever
the shipped config permits); and
nothing behind the tensor may be read (NaN placed right after it). The split-KV kernel,
which ships with the view since session 28 (session 26's lab variant ``dec-vchunk``), is held
to the bits of its zeroing form.
"""

from __future__ import annotations

import pytest
import torch

from conformance import verdict
from conformance.cases import poison_unseen

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
pytest.importorskip("tilelang", reason="tilelang is not installed")

from reference import check_inputs  # noqa: E402
from tilelang_impl import describe_call, launch, sliding_window_attention as swa  # noqa: E402
from tilelang_impl.api import _views  # noqa: E402

# (B, Hq, Hkv, Lq, Lk, D, rule)
CASES = [
    (1, 8, 8, 2048, 2048, 128, dict(window_size=512, chunk_size=64)),        # a tile is a chunk
    (2, 8, 2, 300, 1024, 128, dict(window_size=200, chunk_size=64, kv_start=128)),  # GQA, Lq < Lk
    (1, 16, 4, 700, 1536, 128, dict(window_size=300, chunk_size=128, kv_start=256)),  # half a chunk
    (1, 4, 1, 1500, 2048, 64, dict(window_size=512, chunk_size=128)),         # D = 64, long: half a chunk
    (2, 32, 4, 1, 4096, 128, dict(window_size=100, chunk_size=64)),           # decode, packed rows
    (1, 4, 4, 257, 512, 96, dict(window_size=90, chunk_size=64)),             # Dv = 96
    # session 26: D <= 64's 128-key tile of whole chunks (kernels.V_CHUNK), the last tile
    # past Lk where Lk is not a multiple of 128; since session 42 the long calls among them
    # run the 64-key tile (a chunk a tile at C = 64; two at C = 32, past the shipped
    # permission of one: zeroing, the view here only), one-block calls the 128-key tile
    (1, 8, 2, 2048, 2048, 64, dict(window_size=512, chunk_size=64)),          # long: one chunk
    (2, 4, 1, 333, 1088, 64, dict(window_size=300, chunk_size=32, kv_start=64)),  # long: two
    (1, 4, 4, 500, 960, 32, dict(window_size=130, chunk_size=64)),            # D = 32, long
    (2, 32, 4, 1, 4032, 64, dict(window_size=100, chunk_size=64)),            # packed, two chunks
    (1, 8, 2, 48, 2048, 64, dict(window_size=512, chunk_size=64)),            # one block: two
    (2, 4, 1, 64, 1088, 64, dict(window_size=300, chunk_size=32, kv_start=64)),  # one block: four
]
#: The view's permission the tests run (launch.v_chunk_span: up to four chunks a tile);
#: the public call runs the shipped config's (launch.prefill_config).
CAP = max(launch.V_CHUNK_SPANS)


def _ids(c):
    B, Hq, Hkv, Lq, Lk, D, kw = c
    return f"B{B}-{Hq}/{Hkv}-Lq{Lq}-Lk{Lk}-D{D}-C{kw['chunk_size']}"


def _inputs(B, Hq, Hkv, Lq, Lk, D, blhd, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(H, L):
        shape = (B, L, H, D) if blhd else (B, H, L, D)
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
        return x.transpose(1, 2) if blhd else x
    return rnd(Hq, Lq), rnd(Hkv, Lk), rnd(Hkv, Lk)


def _run(p, q, k, v, v_chunk, split=None):
    """run_cuda (on the tensors as the adapter hands them over, storage order) into
    poisoned outputs with the shipped config, the view allowed or not; ``split``: the
    shipped split-KV config with that many splits instead."""
    (q_, k_, v_), q_blhd, kv_blhd = _views(q, k, v)
    base = launch.split_config(p.Dqk, p.Dv) if split else launch.prefill_config(p)
    cfg = launch.with_knobs(base, v_chunk=v_chunk)
    o, lse = p.new_outputs(poison=True)
    launch.run_cuda(p, q_, k_, v_, q_blhd, kv_blhd, o, lse, force_split=split, config=cfg)
    return o, lse


@pytest.mark.parametrize("blhd", [False, True], ids=["BHLD", "BLHD"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_view_kernel_matches_the_zeroing_kernel_bit_for_bit(case, blhd):
    B, Hq, Hkv, Lq, Lk, D, kw = case
    q, k, v = _inputs(B, Hq, Hkv, Lq, Lk, D, blhd, seed=Lk + D)
    p = check_inputs(q, k, v, **kw)
    if not launch.v_chunk_call(p):
        pytest.fail(f"premise: the case must admit the view ({kw}, Lk={Lk})")
    cfg, C = launch.prefill_config(p), kw["chunk_size"]
    block_N = cfg[1]
    if not launch.v_chunk_span(CAP, C, block_N, D):
        pytest.fail(f"premise: the tile must be served by the view ({kw}, D={D})")
    shipped = bool(launch.v_chunk_span(cfg[4 + launch._KNOB["v_chunk"]], C, block_N, D))
    assert ("v_chunk" in describe_call(q, k, v, **kw)) is shipped, describe_call(q, k, v, **kw)
    clean = (k.clone(), v.clone())
    dead = poison_unseen(k, v, Lq, kw)
    if not dead.any():
        pytest.fail("premise: the case must have unseen key slots to poison")
    o, lse = _run(p, q, k, v, CAP)
    o0, lse0 = _run(p, q, k, v, False)
    assert torch.equal(o, o0) and torch.equal(lse, lse0), "view and zeroing kernels differ"
    verdict.assert_pass(o, lse, q, *clean, kw, _ids(case))
    o_pub, lse_pub = swa(q, k, v, **kw)  # the public call, the view as shipped (or none)
    assert torch.equal(o_pub, o) and torch.equal(lse_pub, lse)


@pytest.mark.parametrize("D, C, Lk, Lq", [(64, 128, 1024, 300), (128, 64, 1024, 300),
                                          (64, 64, 1088, 300), (64, 64, 1088, 48)])
def test_nothing_past_lk_is_read(D, C, Lk, Lq):
    """``v`` a slice of a longer buffer whose rows past ``Lk`` hold NaN: the view ends at
    ``Lk`` (a tile of one chunk ends there too; the last tile of two chunks, at Lk = 1088 on
    the 128-key tile of a one-block call at D = 64, reaches past it, into chunks the view
    does not have, which the copy engine fills with zeros), so nothing behind the tensor
    reaches an output (the kernel takes the view's strides; the public call would copy such
    a ``v`` first, and the plain kernel could not take it at all)."""
    B, Hq, Hkv = 1, 4, 2
    kw = dict(window_size=200, chunk_size=C)
    g = torch.Generator(device="cuda").manual_seed(D)
    q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=torch.bfloat16, generator=g)
    big = torch.full((B, Hkv, Lk + 256, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    big[:, :, :Lk] = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = big[:, :, :Lk]
    p = check_inputs(q, k, v, **kw)
    assert launch.v_chunk_span(CAP, C, launch.prefill_config(p)[1], D)
    o, lse = _run(p, q, k, v, CAP)
    assert not o.isnan().any()
    o0, lse0 = _run(p, q, k, v.contiguous(), CAP)
    assert torch.equal(o, o0) and torch.equal(lse, lse0)
    verdict.assert_pass(o, lse, q, k, v.contiguous(), kw, f"D{D}")


@pytest.mark.parametrize("blhd", [False, True], ids=["BHLD", "BLHD"])
def test_split_kernel_with_the_view_matches_its_zeroing_kernel(blhd):
    """The split-KV kernel reading v through the view (shipped since session 28,
    ``launch.split_config``; session 26's lab variant ``dec-vchunk``): a decode call split
    four ways, NaN in every unseen slot, gives the bits of the split kernel that zeroes V's
    landmark rows itself (the one shipped before)."""
    B, Hq, Hkv, Lq, Lk, D = 1, 8, 8, 1, 4096, 128
    kw = dict(window_size=512, chunk_size=64, kv_start=64)
    q, k, v = _inputs(B, Hq, Hkv, Lq, Lk, D, blhd, seed=7)
    p = check_inputs(q, k, v, **kw)
    assert launch.v_chunk_call(p)
    clean = (k.clone(), v.clone())
    poison_unseen(k, v, Lq, kw)
    o, lse = _run(p, q, k, v, CAP, split=4)
    o0, lse0 = _run(p, q, k, v, False, split=4)
    assert torch.equal(o, o0) and torch.equal(lse, lse0), "view and zeroing split kernels differ"
    verdict.assert_pass(o, lse, q, *clean, kw, "split-view")


def test_view_batch_stride_past_2_to_32_elements():
    """A long context whose ``v`` batch stride ``Hkv * Lk * Dv`` is exactly 2**32 elements
    (B = 2, 32 heads, Lk = 2**20, D = 128; 16 GiB each for k and v): the public call takes
    the view, and batch 1 reads its own ``v`` (the view's strides were int32 until
    2026-12-05: this one wrapped to 0, and batch 1 read batch 0's rows). Every visible key
    is in the tail, where the reference runs."""
    B, H, Lq, Lk, D = 2, 32, 512, 1 << 20, 128
    kw = dict(window_size=512, chunk_size=64)
    free, _ = torch.cuda.mem_get_info()
    if free < 40 * 2 ** 30:
        pytest.skip(f"needs 40 GiB of free device memory, {free / 2 ** 30:.0f} GiB free")
    g = torch.Generator(device="cuda").manual_seed(31)
    q = torch.randn(B, H, Lq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, H, Lk, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, H, Lk, D, device="cuda", dtype=torch.bfloat16, generator=g)
    assert v.stride(0) == 2 ** 32
    assert "v_chunk" in describe_call(q, k, v, **kw), describe_call(q, k, v, **kw)
    o, lse = swa(q, k, v, **kw)
    tail = Lk - 2048  # a multiple of the chunk: the rule is the same on the slice
    ks, vs = k[:, :, tail:].clone(), v[:, :, tail:].clone()
    del k, v
    verdict.assert_pass(o, lse, q, ks, vs, dict(kw, kv_start=tail), "2**32 batch stride")
