"""Every GPU kernel variant the TileLang backend ships compiles for sm_90a
without a GPU (system nvcc), and its SASS is what we claim: the tensor-core
kernels issue HGMMA (wgmma) and load by TMA (UTMALDG); the fp32 kernel stays on
FMA (no HGMMA: tf32 would miss fp32 accuracy).

One compile per variant *class* (tile / pipeline depth / threads / split /
landmark path); flags and layouts only change index arithmetic inside the
same structure. ~5-30 s each on a CI core, cached in ~/.tilelang/cache.
Kernels only the lab builds (tools/lab_tilelang.py: earlier tiles, one CTA per
SM, knob subsets) are built by the lab's own runs, not here (session 16 took
seven of them out of CI's 20-minute budget; session 34 the session-4 base and its
fexp / lmkj0 kernels, whose SASS claims are now held on the shipped kernels with one
knob off, two kernels instead of six: CI with cold kernel caches ran 19-20 minutes).
Per-case lowering of the GPU tier's kernels: tools/tl_lower.py, run by tools/gpu_all.sh
before a GPU run (tests/test_tilelang_lowering.py tests the tool).
"""

import os
import re
import shutil

import pytest

tilelang = pytest.importorskip("tilelang", reason="tilelang is not installed")

from reference.validation import default_scale  # noqa: E402
from tilelang_impl import kernels, launch  # noqa: E402
from tools import sass_loops  # noqa: E402

if shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"):
    pytest.skip("nvcc is not installed (needed to build sm_90a cubins)", allow_module_level=True)


def _sass(kind, args, tmp_path):
    sass_loops.with_disassembler()  # TileLang looks for cuobjdump / nvdisasm on PATH
    jit = getattr(kernels, kind)
    func = jit.get_tir(*args)
    ker = tilelang.compile(func, target=kernels.HOPPER, pass_configs=jit.pass_configs)
    path = tmp_path / f"{kind}.sass"
    ker.export_sass(str(path))
    assert path.exists(), "SASS export failed (cuobjdump / nvdisasm not found?)"
    return path.read_text()


def _tc(Dqk, Dv, lmk=True, q_blhd=False, kv_blhd=False, split=False, cfg=None, knobs=None,
        C=64, scale=True, exp=True, view=False, wide=False, long=False):
    """Factory arguments of fwd_tc; without ``cfg`` / ``knobs``, what launch ships
    for a call with kernel-frame chunk ``C`` (the split config and knobs with
    ``split``; on the prefill grid, launch.short_config for a call of one query block, or
    with ``long`` launch.shipped_config for one of several: two tiles at max(Dqk, Dv) <= 64
    since session 42, one above, where the two configs differ in hoist_left up to 128 since
    session 45 (and hoist_keys since session 46); ``lmk_cols`` resolved by
    launch.lmk_cols_for) and the default
    ``sm_scale`` (``scale=False``: a scale that cannot fold, e.g. ``sm_scale=0``);
    ``view``: the call admits the chunk view of ``v`` (launch.v_chunk_call); ``wide``: its
    positions reach launch.MAX_POSITIONS (launch.wide_positions)."""
    if cfg is None and knobs is None:
        full = (launch.split_config(Dqk, Dv, lmk, exp) if split
                else (launch.shipped_config if long else launch.short_config)(Dqk, Dv))
        sl2 = launch.LOG2E * default_scale(Dqk) if scale else None
        return launch.tc_kernel_key(Dqk, Dv, "bfloat16", lmk, exp, q_blhd, kv_blhd, full, C,
                                    sl2, split=split, view=view, wide=wide)[1]
    if knobs is None:
        knobs = ()
    return ((Dqk, Dv, "bfloat16", lmk, exp, q_blhd, kv_blhd) + (cfg or launch.tc_config(Dqk, Dv))
            + (split,) + tuple(knobs))


def _lmk_cols(args):
    """The ``lmk_cols`` value baked into fwd_tc factory arguments (0 when left at its default)."""
    knobs = args[launch._KNOBS_AT:]
    i = launch._KNOB["lmk_cols"]
    return knobs[i] if i < len(knobs) else 0


def _shipped_knobs(D, pack=0, view=False, C=64, **values):
    """The knobs launch bakes for launch.short_config(D, D) (a call of one query block: the
    packed calls' config; launch.shipped_config above D = 128, and from 65 to 128 but for
    hoist_left and hoist_keys) with ``values`` set by name,
    ``pack`` heads per packed tile (0: not packed), for a call at chunk ``C`` with the
    default scale (launch.call_knobs), admitting the chunk view of v or not (``view``)."""
    cfg = launch.with_knobs(launch.short_config(D, D), pack=pack > 0, **values)
    return launch.call_knobs(cfg[4:], True, C, cfg[1], launch.LOG2E * default_scale(D), pack,
                             view, D)


TC_VARIANTS = {
    # shipped D <= 64 for calls of one query block (every Lq until session 42; decode and
    # short chunks since, launch.short_config): tile 64x128, 2 stages, one consumer warp
    # group, two CTAs per SM (min_blocks); landmark rows of V, split mask, folded softmax;
    # C = 64: two landmark columns per 128-key tile (lmk_cols = 2); fast_exp2, scale_fold
    # (default sm_scale), win_u32, lmk_rows_j0
    "d64": _tc(64, 64),
    # the same for a scale that cannot fold into the exponent (sm_scale <= 0)
    "d64-noscalefold": _tc(64, 64, scale=False),
    # the same for C >= 128 (lmk_cols = 1) and C < 64 (general landmark test, lmk_cols = 0)
    "d64-lmk1": _tc(64, 64, C=128),
    "d64-general": _tc(64, 64, C=16),
    # shipped D = 128 for calls of one query block (of every Lq until session 45, when longer
    # ones took hoist_left: the d128-long entries below): tile 64x64, one consumer warp
    # group, two CTAs per SM, landmark rows, split mask, folded softmax, fast_exp2,
    # scale_fold, win_u32, lmk_rows_j0; BLHD inputs; C = 64 (one landmark column per 64-key
    # tile: lmk_cols = 1)
    "d128-blhd": _tc(128, 128, q_blhd=True, kv_blhd=True),
    "d128": _tc(128, 128),
    "d128-noscalefold": _tc(128, 128, scale=False),
    # D = 96 (D = 128's tile and knobs, Dv not a power of two: other row groups in the
    # landmark-row zeroing) for the three lmk_cols it bakes, and the general test at
    # Dv = 80 and 112: the general form with lmk_rows_j0 failed ThreadSync at these Dv
    # (found on the H200 at 7e93d56; launch.rows_j0_acts now drops the knob there)
    "d96": _tc(96, 96),
    "d96-lmk2": _tc(96, 96, C=32),
    "d96-general": _tc(96, 96, C=16),
    "d80-general": _tc(80, 80, C=16),
    "d112-general": _tc(112, 112, C=16),
    # and with landmark columns (lmk_rows_j0's static rows, padded to 16-row groups; C = 64
    # on the 64-key tiles of D > 64 since session 12: one column)
    "d80": _tc(80, 80),
    "d112": _tc(112, 112),
    # shipped D = 128 for 32 <= C < 64 (lmk_cols = 2) and C < 32 (general test)
    "d128-lmk2": _tc(128, 128, C=32),
    "d128-general": _tc(128, 128, C=16),
    # same without mask_lmk: V straight from TMA, no zeroing
    "d128-nolmk": _tc(128, 128, lmk=False),
    # split-KV partials (decode path, Dv 96 / 128), shipped config (launch.split_config:
    # 64x64 tile, landmark rows, full mask, fast_exp2, scale_fold, win_u32, two CTAs per
    # SM): C = 64 on
    # 64-key tiles (lmk_cols = 1), 32 <= C < 64 (lmk_cols = 2) and C < 32 (general)
    "d128-split": _tc(128, 128, split=True),
    "d96-split": _tc(96, 96, split=True),
    "d128-split-lmk2": _tc(128, 128, split=True, C=32),
    "d128-split-general": _tc(128, 128, split=True, C=16),
    # without expand_to_chunk (with mask_lmk) session 5's split kernel, 128x64 (the
    # split knobs fail ThreadSync there on both tiles: session 6 CPU compile)
    "d128-split-noexp": _tc(128, 128, split=True, exp=False),
    "d128-split-noexp-lmk2": _tc(128, 128, split=True, exp=False, C=32),
    "d128-split-noexp-general": _tc(128, 128, split=True, exp=False, C=16),
    # both flags off: the 64x64 split tile (session 5's 128x64 one does not lower)
    "d128-split-noflags": _tc(128, 128, split=True, lmk=False, exp=False),
    # the other flag pairs: no landmark test at D = 128, session 5's kernel at D = 96
    "d128-split-nolmk": _tc(128, 128, split=True, lmk=False),
    "d96-split-noexp": _tc(96, 96, split=True, exp=False),
    # D <= 64 with Dqk != Dv = 32, D = 32, and both flags off (the 64x128 tile serves
    # decode and short chunks too since session 12; before, launch.SHORT_Q_TILE)
    "d64x32": _tc(64, 32),
    "d32": _tc(32, 32),
    "d64-noflags": _tc(64, 64, lmk=False, exp=False),
    # the knob pack (GQA-packed rows, G = 8 query heads per key/value head baked;
    # tools/lab_tilelang.py dec-pack*): the shipped prefill tile and the D = 64 split
    # tile the lab packs, a G that is not a power of two, and D = 128's prefill tile
    "d64-pack": _tc(64, 64, knobs=_shipped_knobs(64, pack=8)),
    "d64-pack3": _tc(64, 64, knobs=_shipped_knobs(64, pack=3)),
    "d128-pack": _tc(128, 128, knobs=_shipped_knobs(128, pack=4)),
    # G = 8 with lmk_rows_j0 acting (Llama-style 32/4 decode at D = 128), and G = 3 at
    # Dqk = 32 without either flag (failed ThreadSync before the multi-block rewrite of
    # 2f11a45; launch.pack_lowers now packs it)
    "d128-pack8": _tc(128, 128, knobs=_shipped_knobs(128, pack=8)),
    "d32-pack3-noflags": _tc(32, 32, lmk=False, exp=False,
                             knobs=launch.call_knobs(launch.tc_knobs(32, 32), False, 64, 128, 0.2)[:7]
                             + (False, 3, launch.TC_MIN_BLOCKS)),
    "d64-split-pack": _tc(64, 64, split=True, cfg=(128, 64, 2, 256),
                          knobs=("rows", False, False, 1, True, True, True, False, 8)),
    # 64x64 tile, one consumer warp group, TileLang's launch bounds (D > 128), shipped
    "d256": _tc(256, 256),
    # D = 64 shipped without mask_lmk (no landmark test; interior tiles need no mask)
    "d64-nolmk": _tc(64, 64, lmk=False),
    # session 25: v through the chunk view (v_chunk; calls with kv_start and Lk multiples of
    # C, launch.v_chunk_call) where C is a multiple of block_N: D = 128 at C = 64 (a tile
    # is a chunk; C = 128, half a chunk a tile, baked the same kernel until session 39's
    # lmk_const: d128-vchunk-c128 below), BLHD, GQA-packed rows; D = 64 at C = 128
    "d128-vchunk": _tc(128, 128, view=True),
    "d128-vchunk-blhd": _tc(128, 128, q_blhd=True, kv_blhd=True, view=True),
    "d128-vchunk-pack4": _tc(128, 128, knobs=_shipped_knobs(128, pack=4, view=True)),
    "d64-vchunk": _tc(64, 64, C=128, view=True),
    # session 26: the view spanning whole chunks of a 128-key tile (kernels.V_CHUNK):
    # D = 64 at C = 64 (two chunks; what ships since session 28, launch.TC_V_CHUNK = 2),
    # BLHD, and C = 32 (four)
    "d64-vchunk2": _tc(64, 64, view=True),
    "d64-vchunk2-blhd": _tc(64, 64, q_blhd=True, kv_blhd=True,
                            knobs=_shipped_knobs(64, view=True, v_chunk=2)),
    "d64-vchunk4": _tc(64, 64, knobs=_shipped_knobs(64, view=True, v_chunk=4, C=32)),
    # the lab's occ2-128x64 (session 26): D = 64 on a 128x64 tile with two consumer warp
    # groups and two CTAs per SM, v through the chunk view at C = 64
    "d64-128x64-occ2": launch.tc_kernel_key(
        64, 64, "bfloat16", True, True, False, False,
        launch.with_knobs((128, 64, 2, 256) + launch.short_config(64, 64)[4:], min_blocks=2,
                          v_chunk=True), 64, launch.LOG2E * default_scale(64), view=True)[1],
    # session 39: the view kernels above bake lmk_const (the landmark columns as constants,
    # launch.lmk_const_acts: K * C == block_N); the view where a landmark falls in every
    # other tile only keeps the compares against the tile's j0: D = 128 at C = 128 (and 256,
    # the same kernel), D = 64 at C = 256
    "d128-vchunk-c128": _tc(128, 128, C=128, view=True),
    "d64-vchunk-c256": _tc(64, 64, C=256, view=True),
    # the split-KV kernel with the view (shipped since session 28, launch.split_config)
    "d128-split-vchunk": _tc(128, 128, split=True, view=True),
    # session 31: built wide (a cache past 2**22 keys, launch.wide_positions: the landmark
    # test's float quotient taken twice): the general test per score (D = 64, C = 16) and
    # the split-KV kernel, whose V landmark rows take the general test (C = 64)
    "d64-general-wide": _tc(64, 64, C=16, wide=True),
    "d128-split-wide": _tc(128, 128, split=True, wide=True),
    # session 42: D <= 64 calls of several query blocks (launch.shipped_config: the 64x64
    # tile, three CTAs per SM then, four since session 44, the view of v one chunk a tile):
    # C >= 64 one landmark column, 32 <= C < 64 two, C < 32 the general test, an unfoldable
    # scale; the view at C = 64 (lmk_const) and at C = 128 (a landmark in every other tile: no
    # lmk_const); Dqk != Dv, D = 32, BLHD, both flags off, no mask_lmk, and built wide
    "d64-long": _tc(64, 64, long=True),
    "d64-long-lmk2": _tc(64, 64, C=32, long=True),
    "d64-long-general": _tc(64, 64, C=16, long=True),
    "d64-long-noscalefold": _tc(64, 64, scale=False, long=True),
    "d64-long-vchunk": _tc(64, 64, view=True, long=True),
    "d64-long-vchunk-c128": _tc(64, 64, C=128, view=True, long=True),
    "d64x32-long": _tc(64, 32, long=True),
    "d32-long": _tc(32, 32, long=True),
    "d64-long-blhd": _tc(64, 64, q_blhd=True, kv_blhd=True, long=True),
    "d64-long-noflags": _tc(64, 64, lmk=False, exp=False, long=True),
    "d64-long-nolmk": _tc(64, 64, lmk=False, long=True),
    "d64-long-general-wide": _tc(64, 64, C=16, wide=True, long=True),
    # session 45: calls of several query blocks at 64 < max(Dqk, Dv) <= 128 bake hoist_left
    # (launch.TC_HOIST_LEFT; and hoist_keys since session 46, launch.TC_HOIST_KEYS, as the
    # d64-long entries do; calls of one block, the entries above, do neither): D = 128 and 96
    # with one landmark column, two and the general test, an unfoldable scale, and the view
    # at C = 64 (the bench's D = 128 prefill)
    "d128-long": _tc(128, 128, long=True),
    "d128-long-lmk2": _tc(128, 128, C=32, long=True),
    "d128-long-general": _tc(128, 128, C=16, long=True),
    "d128-long-noscalefold": _tc(128, 128, scale=False, long=True),
    "d128-long-vchunk": _tc(128, 128, view=True, long=True),
    "d96-long": _tc(96, 96, long=True),
    "d96-long-lmk2": _tc(96, 96, C=32, long=True),
    "d96-long-general": _tc(96, 96, C=16, long=True),
    # and the long-call twins of the other D = 128 entries: the view where a landmark falls in
    # every other tile (C = 128), BLHD, without mask_lmk, both flags off; D = 96 with an
    # unfoldable scale
    "d128-long-vchunk-c128": _tc(128, 128, C=128, view=True, long=True),
    "d128-long-blhd": _tc(128, 128, q_blhd=True, kv_blhd=True, long=True),
    "d128-long-nolmk": _tc(128, 128, lmk=False, long=True),
    "d128-long-noflags": _tc(128, 128, lmk=False, exp=False, long=True),
    "d96-long-noscalefold": _tc(96, 96, scale=False, long=True),
}
# no two entries compile the same kernel
assert len(set(TC_VARIANTS.values())) == len(TC_VARIANTS), "duplicate TC_VARIANTS entries"


@pytest.mark.parametrize("name", list(TC_VARIANTS))
def test_tensor_core_variant_has_hgmma_and_tma(name, tmp_path):
    sass = _sass("fwd_tc", TC_VARIANTS[name], tmp_path)
    assert "HGMMA" in sass
    assert "UTMALDG" in sass


def test_shipped_variants_cover_every_lmk_cols_the_launcher_bakes():
    """Every kernel run_cuda can pick with mask_lmk for D = 64, 96 and 128 on the
    prefill grid (lmk_cols 0, 1, 2), for D = 128 on split-KV with and without
    expand_to_chunk (0, 1, 2) is among the compiled variants (the prefill tile was the
    same for every ``Lq`` from session 12 to 41; since session 42 D = 64 has two, both here:
    launch.grid_config; since session 45 D = 96 and 128 have two, the long calls' with
    ``hoist_left``, and ``hoist_keys`` since session 46); D = 96 split-KV at C = 64 only,
    other head dims below 128 only with the general landmark test (Dv = 80, 112). Calls whose
    scale cannot fold into the exponent (``sm_scale <= 0``) run kernels without
    ``scale_fold``: compiled here at C = 64 only (the other lmk_cols differ from
    them in the same way as the folded ones do)."""
    have = set(TC_VARIANTS.values())
    for D in (64, 96, 128):
        for C in range(1, 300):
            assert _tc(D, D, C=C) in have and _tc(D, D, C=C, long=True) in have, C
    for D in (64, 128):
        assert _tc(D, D, scale=False) in have and _tc(D, D, scale=False, long=True) in have
    for C in range(1, 300):
        assert _tc(128, 128, split=True, C=C) in have
        assert _tc(128, 128, split=True, exp=False, C=C) in have
    # with the chunk view of v (only C = 64, 128, 256 reach it below 300 at D = 128: one
    # kernel, one landmark column per tile, rows from k0 % C)
    for C in (64, 128, 256):
        assert _tc(128, 128, C=C, view=True) in have, C
        assert _tc(128, 128, C=C, view=True, long=True) in have, C
    for C in (64, 128, 256):
        assert _tc(64, 64, C=C, view=True) in have, C
        assert _tc(64, 64, C=C, view=True, long=True) in have, C
    lc = launch._KNOBS_AT + launch._KNOB["lmk_const"]
    baked = {name: len(a) > lc and a[lc] for name, a in TC_VARIANTS.items() if "vchunk" in name}
    # not baked: a landmark in every other tile, and C = 32 at D = 64 (K = 4 columns, past
    # the lmk_cols cap of 2: the general test); the split kernel bakes it since session 40
    # (split_config's permission; C = 64 on its 64-key tile)
    assert baked == {**{n: True for n in baked}, "d128-vchunk-c128": False,
                     "d64-vchunk-c256": False, "d64-vchunk4": False,
                     "d64-long-vchunk-c128": False, "d128-long-vchunk-c128": False}, baked
    assert baked["d128-split-vchunk"] is True


@pytest.mark.parametrize("plain_name, view_name", [("d128", "d128-vchunk"),
                                                    ("d128-split", "d128-split-vchunk")])
def test_v_chunk_kernel_takes_v_by_one_bulk_copy_and_zeroes_nothing(plain_name, view_name):
    """With v_chunk the V tile comes by TMA through a 5-D tensor map (the chunk view) and
    the consumer writes nothing into V_s: the landmark-row zeroing of the plain kernel
    (its select over V_s rows and the two named barriers around it) is gone, and no
    element load of V is left; on the prefill grid and in the split-KV kernel."""
    plain = kernels.fwd_tc(*TC_VARIANTS[plain_name]).get_kernel_source()
    view = kernels.fwd_tc(*TC_VARIANTS[view_name]).get_kernel_source()
    assert "tma_load(V_desc" in view and "V[" not in view

    def consumer(src):
        return src[src.index("warpgroup_reg_alloc"):]
    # the zeroing reads and writes V_s rows by pointer in the consumer; wgmma descriptors
    # take V_s's address only (``&(((bfloat16_t*)V_s)[0])``)
    row = "((bfloat16_t*)V_s) +"
    assert row in consumer(plain) and row not in consumer(view)
    # the zeroing's two named barriers per tile (the epilogue keeps its own two)
    assert consumer(plain).count("__sync_thread_partial") == \
        consumer(view).count("__sync_thread_partial") + 2


@pytest.mark.parametrize("name, span", [("d64-vchunk2", 2), ("d64-vchunk2-blhd", 2),
                                        ("d64-vchunk4", 4)])
def test_multi_chunk_v_tile_is_one_bulk_copy_per_chunk(name, span):
    """A tile of ``span`` whole chunks takes V by ``span`` TMA loads, each into its own rows
    of V_s (offsets ``i * 128 / span`` rows of 64 elements inside the stage), and the
    consumer writes nothing into V_s: TileLang 0.1.15 would silently fall back to element
    loads for a copy it cannot make a bulk copy (a runtime chunk, session 25)."""
    import re
    args = TC_VARIANTS[name]
    assert args[launch._V_CHUNK_AT] == span
    src = kernels.fwd_tc(*args).get_kernel_source()
    loads = [ln for ln in src.splitlines() if "tma_load(V_desc" in ln]
    assert len(loads) == span and "V[" not in src
    index = [re.search(r"V_s\)\[([^\]]*)\]", ln).group(1) for ln in loads]  # smem index
    assert all("(kb & 1) * 8192" in i for i in index), index  # the stage's tile
    offsets = sorted(int(m.group(1)) if m else 0 for m in
                     (re.search(r"\+ (\d+)\)$", i) for i in index))
    assert offsets == [i * (128 // span) * 64 for i in range(span)], loads
    consumer = src[src.index("warpgroup_reg_alloc"):]
    assert "((bfloat16_t*)V_s) +" not in consumer


def _cubin(args):
    """CUDA source, SASS and ``cuobjdump -res-usage`` text of the fwd_tc kernel with
    factory arguments ``args`` (the cubin built as TileLang builds it: tools.sass_loops)."""
    return sass_loops.build(args)


@pytest.mark.parametrize("name", ["d64", "d128", "d96-general", "d64-pack", "d128-blhd",
                                  "d128-split", "d128-split-noflags", "d64-vchunk2",
                                  "d128-split-vchunk", "d128-long-vchunk"])
def test_two_ctas_per_sm_get_the_registers_setmaxnreg_asks_for(name):
    """min_blocks = 2 (launch.TC_MIN_BLOCKS): ``__launch_bounds__(256, 2)`` makes ptxas
    give each thread kernels.launch_regs(128, 2) = 128 registers at launch; the
    consumers' ``setmaxnreg.inc`` asks for kernels.consumer_regs(128, 2) = 232, which
    the producer's ``setmaxnreg.dec`` to 24 frees inside the CTA: 128 * 24 + 128 * 232
    = 256 * 128. A consumer asking for more than its CTA launched with waits forever
    (three CTAs per SM hung that way on the H200, session 12). No register spills."""
    import re
    args = TC_VARIANTS[name]
    assert args[launch._KNOBS_AT + launch._KNOB["min_blocks"]] == launch.TC_MIN_BLOCKS == 2
    src, sass, res = _cubin(args)
    launch_regs, consumers = kernels.launch_regs(128, 2), kernels.consumer_regs(128, 2)
    assert (launch_regs, consumers) == (128, 232)
    assert "__launch_bounds__(256, 2)" in src
    assert f"warpgroup_reg_alloc<{consumers}>" in src
    assert f"warpgroup_reg_dealloc<{kernels.PRODUCER_REGS}>" in src
    assert kernels.PRODUCER_REGS * 128 + consumers * 128 <= launch_regs * 256
    assert re.findall(r"REG:(\d+)", res) == [str(launch_regs)], res
    assert "STL" not in sass and "LDL" not in sass


def _call_args(D, cfg):
    """Factory arguments of the fwd_tc kernel that a full ``cfg`` (a tile and TC_KNOBS) gives
    a bf16 call at ``Dqk = Dv = D``, both flags, C = 64 and the default scale, the view of v
    admitted (launch.tc_kernel_key)."""
    return launch.tc_kernel_key(D, D, "bfloat16", True, True, False, False, cfg, 64,
                                launch.LOG2E * default_scale(D), view=True)[1]


def _occ3_args(name="occ3-64x64v"):
    """Factory arguments of a lab occ3 variant at D = 64, C = 64, the view admitted."""
    from tools import lab_tilelang as L
    return _call_args(64, L.VARIANTS[name][0](64))


@pytest.mark.parametrize("name, tile, threads, n, want, view", [
    ("d64-128x64-occ2", (128, 64, 2, 256), 256, 2, (80, 104), True),
    ("d64-long-vchunk", (64, 64, 2, 128), 128, 4, (64, 104), True),
    ("d64-long-general", (64, 64, 2, 128), 128, 4, (64, 104), False),
    ("d64-long-general-wide", (64, 64, 2, 128), 128, 4, (64, 104), False),
    ("occ3-64x64v", (64, 64, 2, 128), 128, 3, (80, 136), True),
    ("occ3-64x64v-slack8", (64, 64, 2, 128), 128, 3, (80, 128), True),
])
def test_more_ctas_or_consumers_fit_the_register_file(name, tile, threads, n, want, view):
    """Kernels whose CTAs split the register file finer than the two-CTA ones, with
    ``__launch_bounds__(threads + 128, n)``, kernels.launch_regs registers at launch and
    kernels.consumer_regs after ``setmaxnreg``, where 128 * 24 + threads * consumers <=
    (threads + 128) * launch: nothing asks for more than its CTA launched with (session 12's
    hang at three CTAs: consumers 144 where 136 fit), and no register spills.
    occ2-128x64 (session 26): two consumer warp groups, two CTAs per SM, v through the view;
    D <= 64 calls of several query blocks (launch.TC_LONG, the lab's occ4-64x64v: written in
    session 43, shipped since session 44), d64-long-vchunk, and the general landmark test per
    score without the view, the heaviest of its kernels, plain and built wide: D = 64 on the
    64x64 tile, one consumer warp group, four CTAs per SM, consumers 104 (shared memory about
    40 KB a CTA at two stages, session 12's count: four fit an SM's 228 KB); the lab's
    occ3-64x64v (session 39, shipped in sessions 42-43): the same kernel at three CTAs per SM;
    occ3-64x64v-slack8 (session 40): that, its consumers 8 registers below the pool's exact
    fill (kernels.REG_SLACKS)."""
    import re
    args = TC_VARIANTS[name] if name in TC_VARIANTS else _occ3_args(name)
    assert args[7:11] == tile and bool(len(args) > launch._V_CHUNK_AT and args[launch._V_CHUNK_AT]) is view
    assert args[launch._KNOBS_AT + launch._KNOB["min_blocks"]] == n
    rs = launch._KNOBS_AT + launch._KNOB["reg_slack"]
    slack = args[rs] if len(args) > rs else 0
    assert slack == (8 if name.endswith("slack8") else 0)
    src, sass, res = _cubin(args)
    launch_regs = kernels.launch_regs(threads, n)
    consumers = kernels.consumer_regs(threads, n, slack)
    assert (launch_regs, consumers) == want
    assert f"__launch_bounds__({threads + 128}, {n})" in src
    assert f"warpgroup_reg_alloc<{consumers}>" in src
    assert kernels.PRODUCER_REGS * 128 + consumers * threads <= launch_regs * (threads + 128)
    assert re.findall(r"REG:(\d+)", res) == [str(launch_regs)], res
    assert "STL" not in sass and "LDL" not in sass


@pytest.mark.parametrize("name, most", [("d64-vchunk2", 0.85), ("d128-split-vchunk", 0.93)])
def test_constant_landmark_columns_shorten_the_key_loop(name, most):
    """lmk_const takes the landmark compares against the tile's j0 register out of the
    consumer's key loop (tools.sass_loops: the first loop that issues HGMMA), with the loop's
    tensor work (HGMMA) and exponentials (MUFU.EX2) unchanged. Counted at sm_90a when each
    was written, held here as a fraction ``most`` of the loop without it: the prefill grid
    (shipped since session 39) at D = 64, C = 64, two landmark columns a 128-key tile, 957 ->
    729 instructions (session 38); the split-KV kernel (shipped since session 40) at D =
    128, C = 64, one column a 64-key tile, 514 -> 464 (session 39)."""
    on = TC_VARIANTS[name]
    lc = launch._KNOBS_AT + launch._KNOB["lmk_const"]
    assert on[lc] is True
    off = on[:lc] + (False,) + on[lc + 1:]
    (with_, *_), (without, *_) = (sass_loops.loops(_cubin(a)[1]) for a in (on, off))
    assert with_["instructions"] <= most * without["instructions"], (with_, without)
    assert (with_["hgmma"], with_["ex2"]) == (without["hgmma"], without["ex2"]) != (0, 0)


def test_min_blocks_refuses_what_was_not_run():
    """0 (TileLang's defaults), 2 CTAs per SM (shipped), 3 (session 39's lab occ3-64x64v,
    with the split that counts the launch registers; shipped in sessions 42-43) and 4 (session
    43's lab occ4-64x64v: session 12's four-CTA build, which hung before the producer guard;
    shipped since session 44 for D <= 64 calls of several query blocks) are accepted; 1 means
    nothing TileLang's defaults do not, 5 leaves consumers 72 registers
    (kernels.consumer_regs), below the 64 x 64 tile's two accumulators and its scores."""
    assert kernels.MIN_BLOCKS == (0, 2, 3, 4)
    for bad in (1, 5, True):
        with pytest.raises(ValueError, match="min_blocks"):
            kernels.fwd_tc.get_tir(*_tc(64, 64, knobs=_shipped_knobs(64, min_blocks=bad)))


def test_reg_slack_refuses_what_was_not_written_for():
    """reg_slack (session 40, a lab knob) takes 0 or 8 registers, and 8 only where the
    kernel sets its own register split (min_blocks): TileLang's default split has no pool
    of ours to leave room in."""
    assert kernels.REG_SLACKS == (0, 8)
    assert kernels.consumer_regs(128, 3, 8) == kernels.consumer_regs(128, 3) - 8 == 128
    for mb, bad in ((2, 4), (2, 16), (2, True), (0, 8)):
        with pytest.raises(ValueError, match="reg_slack"):
            kernels.fwd_tc.get_tir(*_tc(64, 64, knobs=_shipped_knobs(64, min_blocks=mb,
                                                                      reg_slack=bad)))


@pytest.mark.parametrize("D", [64, 128])
def test_lmk_cols_drops_the_float_landmark_test(D, tmp_path):
    """lmk_cols (macros.tile_landmark) replaces the per-score float quotient
    (I2F, FMUL, F2I, IMAD, 3 ISETP) by integer compares. Without it lmk_rows_j0 goes too
    (it needs the columns), and its software 64-bit divisions bring F2I of their own, so
    the kernel with columns is held with lmk_rows_j0 off as well: the two differ in
    lmk_cols alone, and the one without is the shipped C = 16 kernel. Measured at sm_90a
    (session 34, D = 128): 18 F2I with columns against 66 without (the shipped C = 64
    kernel, j0 on: 7); on session 4's 128x128 tile 14 against 110."""
    general_args = TC_VARIANTS[f"d{D}-general"]
    cols_args = _tc(D, D, knobs=_shipped_knobs(D, lmk_rows_j0=False))
    at = launch._KNOBS_AT + launch._KNOB["lmk_cols"]
    assert [i for i, (a, b) in enumerate(zip(cols_args, general_args)) if a != b] == [at]
    assert _lmk_cols(cols_args) == (2 if D <= 64 else 1) and _lmk_cols(general_args) == 0
    general = _sass("fwd_tc", general_args, tmp_path).count("F2I")
    cols = _sass("fwd_tc", cols_args, tmp_path).count("F2I")
    assert cols * 3 < general, (cols, general)


def test_fast_exp2_drops_the_exp2f_range_test(tmp_path):
    """fast_exp2 (macros.exp2): exp2f without fast math is MUFU.EX2 wrapped in a
    range test against -126 and two predicated multiplies; with the knob the key
    loop's exponentials are the bare MUFU.EX2 (ex2.approx.ftz). Measured at sm_90a,
    D = 128 on session 4's 128x128 tile: consumer key loop 1418 -> 1220 instructions per
    interior tile; on the shipped 64x64 tile with only this knob off, 34 range tests -> 0
    (session 34: the claim is held on the shipped kernel, not the historic one)."""
    base = _sass("fwd_tc", _tc(128, 128, knobs=_shipped_knobs(128, fast_exp2=False)), tmp_path)
    fast = _sass("fwd_tc", TC_VARIANTS["d128"], tmp_path)
    assert _tc(128, 128, knobs=_shipped_knobs(128)) == TC_VARIANTS["d128"]
    assert base.count("-126") >= 32 and fast.count("-126") < 8, (base.count("-126"),
                                                                  fast.count("-126"))
    assert fast.count("MUFU.EX2") >= 32


@pytest.mark.parametrize("name", ["d128-blhd", "d64"])
def test_finish_divides_once_per_row(name, tmp_path):
    """macros.finalize_output: one IEEE division per row, then a multiply per element.
    A division per element of the output tile was MUFU.RCP + FCHK + a call to the slow
    path each: 64 calls at D = 128 (32 at D = 64) in every prefill program's epilogue,
    1111 instructions and 19% of the D = 128 kernel's sampled warp time under Nsight
    Compute (d4faf39, BENCHMARKS.md session 18). At sm_90a the shipped kernels now keep
    the two divisions of a thread's two rows."""
    sass = _sass("fwd_tc", TC_VARIANTS[name], tmp_path)
    calls = sass.count("CALL.REL")
    assert sass.count("FCHK") <= 4 and calls <= 4, (sass.count("FCHK"), calls)


def test_lmk_rows_j0_drops_the_64_bit_divisions(tmp_path):
    """lmk_rows_j0 (macros.zero_landmark_rows with the tile's j0 register): the shipped
    D = 128 kernel's landmark-row zeroing re-derives the first landmark row in 64-bit
    inside the V_s index (calls to the software 64-bit division / modulo); with the knob
    none is left. Measured at sm_90a, C = 64, on session 4's kernel: consumer key loop
    1250 -> 1070 instructions per interior tile (1778 -> 1595 edge); on the shipped D = 128
    kernel with only this knob off (session 34), 8 -> 6 BAR.SYNC: the knob adds no barrier."""
    def div64(sass):
        return sass.count("div_s64") + sass.count("rem_s64")
    base = _sass("fwd_tc", _tc(128, 128, knobs=_shipped_knobs(128, lmk_rows_j0=False)), tmp_path)
    j0 = _sass("fwd_tc", TC_VARIANTS["d128"], tmp_path)
    assert div64(base) >= 4 and div64(j0) == 0, (div64(base), div64(j0))
    assert j0.count("BAR.SYNC") <= base.count("BAR.SYNC")


@pytest.mark.parametrize("tile", [(64, 64, 2, 128), (128, 64, 2, 256)])
def test_split_knobs_without_expand_still_fail_to_lower(tile):
    """TileLang 0.1.15 cannot lower the split variant with launch.SPLIT_KNOBS for
    mask_lmk without expand_to_chunk on either split tile, so launch.split_config
    gives those calls session 5's split kernel. When this starts to pass, TileLang
    has fixed its ThreadSync pass: measure SPLIT_KNOBS there."""
    args = launch.tc_kernel_key(128, 128, "bfloat16", True, False, False, False,
                                tile + launch.SPLIT_KNOBS, 64,
                                launch.LOG2E * default_scale(128), split=True)[1]
    with pytest.raises(Exception, match="ThreadSync"):
        kernels.fwd_tc(*args)


@pytest.mark.parametrize("dims", [(96, 64), (64, 128)])
def test_pack2_without_flags_at_mixed_dims_still_fails_to_lower(dims):
    """TileLang 0.1.15 cannot lower the packed kernel with G = 2, both flags off and
    Dqk != Dv on the 64x64 tile (ThreadSync, "105 participating threads"), so
    launch.pack_lowers runs those calls unpacked (found by the GPU conformance tier's
    gqa_pack cases at 0e82bb5). When this starts to pass, TileLang has fixed it: pack
    them again."""
    Dqk, Dv = dims
    assert not launch.pack_lowers(2, Dqk, Dv, False, False) and launch.pack_lowers(4, Dqk, Dv, False, False)
    cfg = launch.with_knobs(launch.shipped_config(Dqk, Dv), pack=True)
    args = launch.tc_kernel_key(Dqk, Dv, "bfloat16", False, False, False, False, cfg, 16,
                                launch.LOG2E * default_scale(Dqk), False, 2)[1]
    with pytest.raises(Exception, match="ThreadSync"):
        tilelang.compile(kernels.fwd_tc.get_tir(*args), target=kernels.HOPPER,
                         pass_configs=kernels.fwd_tc.pass_configs)


def test_no_ws_variant_still_fails_to_lower():
    """kernels.fwd_tc_nows (no warp specialisation, no TMA) does not lower in
    TileLang 0.1.15, so nothing ships it. When this starts to pass, the variant
    can be measured again (tools/lab_tilelang.py takes ``ws=False`` configs)."""
    with pytest.raises(Exception, match="Downcast"):
        kernels.fwd_tc_nows(*_tc(128, 128, cfg=(128, 64, 2, 256)))


def test_combine_and_fp32_kernels_compile(tmp_path):
    sass = _sass("combine", (128, "bfloat16"), tmp_path)
    assert "HGMMA" not in sass and len(sass) > 0
    sass = _sass("fwd_fp32", (128, 128, True, True, False, False), tmp_path)
    assert "HGMMA" not in sass and "FFMA" in sass
    # built wide (a cache past 2**22 keys): two float quotients in the landmark test
    wide = _sass("fwd_fp32", (128, 128, True, True, False, False) + launch.FP32_TILE + (True,),
                 tmp_path)
    assert "HGMMA" not in wide and "FFMA" in wide
    assert wide.count("F2I") > sass.count("F2I")


@pytest.mark.parametrize("D, most", [(128, 512), (256, 2048)])
def test_fp32_kernel_keeps_its_key_tiles_in_shared_memory(D, most):
    """The fp32 GPU kernel loads each key tile once a block into shared memory (session 43):
    a thread's stack holds its own row only. The driver backs a kernel's stack for every
    thread the GPU can hold (2048 an SM x 132 SMs on the H100 and the H200) and keeps it for the
    process: with the tiles in each thread's local memory (16.6 KB of stack at D = 128, 34
    KB at D = 256) that was 4.5 / 9.2 GB a process, and conformance workers sharing one GPU
    ran out of memory (sessions 41 and 43). Measured at sm_90a: 240 / 1344 bytes. Each key
    tile's iteration has two barriers: after its loads (every thread reads the whole tile) and
    before the next tile's loads overwrite it."""
    import re
    src, sass, res = sass_loops.build((D, D, True, True, False, False), "fwd_fp32")
    stack = [int(x) for x in re.findall(r"STACK:(\d+)", res)]
    assert stack and max(stack) <= most, res
    assert "__shared__" in src
    loop = src[src.index("for (int kb = 0;"):]
    assert loop.count("__syncthreads()") >= 2, loop[:3000]


def test_landmark_rows_wait_for_the_v_load():
    """``lmk_zero="rows"`` writes only a few rows of ``V_s``; the write must come
    after the consumer waits for the tile's bulk copy (a plain store would not
    depend on it, and the TMA could land after the zeroing). In the CUDA source
    the wait on V's barrier precedes the zeroing loop."""
    ker = kernels.fwd_tc(*_tc(128, 128, knobs=("rows",)))
    src = ker.get_kernel_source()
    consumer = src[src.index("warpgroup_reg_alloc"):]
    loop = consumer.index("for (int p = 0;")
    waits = [i for i in range(len(consumer)) if consumer.startswith(".wait(", i)]
    gemm_rs = consumer.index("wgmma_rs", loop)  # the P@V after the zeroing, not an earlier one
    # the last barrier wait before the zeroing loop exists and no wait sits
    # between the loop and the P@V wgmma (the V wait is not after the write)
    assert any(w < loop for w in waits)
    assert not any(loop < w < gemm_rs for w in waits)


@pytest.mark.parametrize("name", ["d128-vchunk", "d64-vchunk2"])
def test_v_chunk_view_strides_reach_the_descriptor_as_int64(name):
    """The chunk view's four strides are read from the tensor as int64 (the batch stride
    ``Hkv * Lk * Dv`` of a long context passes 2**31: at B = 2, Hkv = 32, Lk = 2**20,
    Dv = 128 it is 2**32, which as the int32 of TileLang's default wrapped to 0, so
    batch 1 read batch 0's ``v``); the innermost, checked to be 1, may stay int32."""
    import re
    src = kernels.fwd_tc(*TC_VARIANTS[name]).get_host_source()
    reads = re.findall(r"(\(int32_t\))?\(\(int64_t\*\)" + kernels.PG.KERNEL
                       + r"_V_strides\)\[(\d)\]", src)  # the prim_func's name (main until session 41)
    assert {int(i) for cast, i in reads if not cast} == {0, 1, 2, 3}, reads
    assert all(int(i) == 4 for cast, i in reads if cast), reads


def test_lazy_rescale_builds_with_a_warp_vote_around_the_output_rescale():
    """The lab knob ``lazy_rescale`` (session 43; ``tools/lab_tilelang.py``'s ``lazy8``) on
    the shipped D = 128 kernel: the output rescale sits in a branch on a warp vote
    (``__any_sync``, VOTE in the SASS), the launch registers are the shipped kernel's and
    nothing spills; off, the kernel source has neither."""
    import re
    src, sass, res = _cubin(_call_args(
        128, launch.with_knobs(launch.shipped_config(128, 128), lazy_rescale=8)))
    assert "__any_sync" in src and "VOTE.ANY" in sass, "no warp vote"
    branch = src[src.index("if (__any_sync("):]
    branch = branch[:branch.index("\n      }\n")]  # the branch's body, to its closing brace
    assert "acc_o" in branch and "alpha" in branch, branch[:600]  # the rescale inside it
    assert re.findall(r"REG:(\d+)", res) == [str(kernels.launch_regs(128, 2))], res
    assert "STL" not in sass and "LDL" not in sass
    off = _call_args(128, launch.shipped_config(128, 128))
    assert "__any_sync" not in kernels.fwd_tc(*off).get_kernel_source()


def _producer_loops(sass):
    """The producer's key loop of a fwd_tc SASS as nvcc laid it out (tools.sass_loops.
    producer_loops: the back branches whose bodies issue TMA loads and no HGMMA), each as
    (instructions, integer divisions: MUFU.RCP) of its body."""
    return [(lp["instructions"], lp["rcp"]) for lp in sass_loops.producer_loops(sass)]


@pytest.mark.parametrize("D", [64, 128])
def test_hoist_keys_takes_divisions_out_of_the_producer_loop(D):
    """The knob ``hoist_keys`` (session 45, ``tools/lab_tilelang.py``'s ``hkeys``; shipped in
    session 46 for calls of several query blocks: ``launch.TC_HOIST_KEYS``) on the shipped
    long-call kernels against the same config without it: the innermost region of the
    producer's key loop (the shortest back branch whose body issues TMA loads and no HGMMA)
    holds 3 integer divisions (the key/value head, the block's first key and the V view's
    chunk index) and 156 (D = 64) / 164
    (D = 128) instructions without it, 1 (the chunk index) and 109 / 117 with it, when written;
    the test asks for fewer divisions and at least 25 instructions fewer, with the launch
    registers, no spills and the consumer's HGMMA and EX2 as shipped. The kernel refuses it
    with ``overlap`` and values other than 0 and 1."""
    ship = launch.shipped_config(D, D)
    assert launch.full_knobs(ship[4:])[launch._KNOB["hoist_keys"]] == 1
    built = []
    for cfg in (launch.with_knobs(ship, hoist_keys=0), ship):
        src, sass, res = _cubin(_call_args(D, cfg))
        assert "STL" not in sass and "LDL" not in sass
        loop = sass_loops.loops(sass)[0]
        built.append((min(_producer_loops(sass)), (loop["hgmma"], loop["ex2"]),
                      sass_loops.summary(src, sass, res)["registers"]))
    (off, off_mma, off_regs), (on, on_mma, on_regs) = built
    assert on[1] < off[1] and on[0] <= off[0] - 25, (off, on)
    assert on_mma == off_mma and on_regs == off_regs
    for bad, knobs in ((2, {}), (True, {}), (1, dict(overlap=1))) if D == 64 else ():
        full = launch.full_knobs(_shipped_knobs(64, **knobs))
        full[launch._KNOB["hoist_keys"]] = bad
        with pytest.raises(ValueError, match="hoist_keys"):
            kernels.fwd_tc.get_tir(*_tc(64, 64, knobs=full))


@pytest.mark.parametrize("D", [64, 128])
def test_vc_shift_takes_the_last_division_out_of_the_producer_loop(D):
    """The lab knob ``vc_shift`` (session 47, ``tools/lab_tilelang.py``'s ``vshift``) on the
    shipped long-call kernel at C = 64 (``lmk_const`` at one chunk a tile: C == block_N): the V
    view's tile coordinates become ``0`` and ``k0 >> 6`` instead of a division by the runtime
    chunk, and the producer's key loop keeps no integer division (MUFU.RCP: one in every
    producer back branch without the knob). When written (tools.sass_loops): the shortest
    producer back branch 109 -> 62 instructions at D = 64 and 117 -> 77 at D = 128, and nvcc
    unrolls the loop four times with the knob (190 / 255 instructions for four tiles). The
    consumer's key loop, the launch registers and the spills are unchanged."""
    ship = launch.shipped_config(D, D)
    built = []
    for cfg in (ship, launch.with_knobs(ship, vc_shift=1)):
        args = _call_args(D, cfg)
        assert args[launch._KNOBS_AT + launch._KNOB["vc_shift"]:][:1] == ((1,) if built else ())
        src, sass, res = _cubin(args)
        assert "STL" not in sass and "LDL" not in sass
        built.append((_producer_loops(sass), sass_loops.loops(sass)[0]["instructions"],
                      sass_loops.summary(src, sass, res)["registers"], src))
    (off, off_loop, off_regs, off_src), (on, on_loop, on_regs, on_src) = built
    assert off and all(rcp >= 1 for _, rcp in off), off
    assert on and all(rcp == 0 for _, rcp in on), on
    assert on_loop == off_loop and on_regs == off_regs
    assert "(k_first >> 6)" in on_src and "(k_first >> 6)" not in off_src
    assert "(k_first / chunk_size)" in off_src and "(k_first / chunk_size)" not in on_src


@pytest.mark.parametrize("D", [64, 128])
def test_hoist_left_takes_the_floor_division_out_of_the_key_loop(D):
    """The knob ``hoist_left`` (session 44, shipped in session 45 for calls of several query
    blocks: ``launch.TC_HOIST_LEFT``) on the long-call kernel (D = 64: the four-CTA tile;
    D = 128) against the same config without it: the consumer's key loop (tools.sass_loops:
    the first loop that issues HGMMA) loses the runtime floor division of ``mask_split``'s
    tile test (I2F.RP / MUFU.RCP, the integer division's reciprocal) and at least 25
    instructions (34 and 33 when written, before ``hoist_keys`` shipped), with its tensor work
    and exponentials, the launch registers and no spills unchanged. The kernel refuses values
    other than 0 and 1, and 1 without ``mask_split`` or with ``overlap`` or ``pack`` (paths
    the knob was not built or run on), past ``launch.call_knobs``, which drops the permission
    there."""
    def key_loop(cfg):
        src, sass, res = _cubin(_call_args(D, cfg))
        loop = sass_loops.loops(sass)[0]
        lo, hi = int(loop["start"], 16), int(loop["branch"], 16)
        body = [t for a, t in sass_loops.instructions(sass) if lo <= a <= hi]
        assert "STL" not in sass and "LDL" not in sass
        return loop, body, sass_loops.summary(src, sass, res)["registers"]
    ship = launch.shipped_config(D, D)
    assert launch.full_knobs(ship[4:])[launch._KNOB["hoist_left"]] == 1
    (off, off_body, off_regs), (on, on_body, on_regs) = (
        key_loop(c) for c in (launch.with_knobs(ship, hoist_left=0), ship))
    assert any("MUFU.RCP" in t for t in off_body) and not any("MUFU.RCP" in t for t in on_body)
    assert on["instructions"] <= off["instructions"] - 25, (on, off)
    assert (on["hgmma"], on["ex2"]) == (off["hgmma"], off["ex2"]) and on_regs == off_regs
    if D == 64:  # the refusals need no build: once
        for bad, knobs in ((2, {}), (True, {}), (1, dict(mask_split=False)), (1, dict(overlap=1)),
                           (1, dict(pack=4))):
            full = launch.full_knobs(_shipped_knobs(64, pack=knobs.pop("pack", 0), **knobs))
            full[launch._KNOB["hoist_left"]] = bad  # as baked, past call_knobs' permission
            with pytest.raises(ValueError, match="hoist_left"):
                kernels.fwd_tc.get_tir(*_tc(64, 64, knobs=full))


def test_lean_overlap_keeps_p_v_in_flight_through_the_softmax():
    """The lab's lean overlapped loop (``overlap`` 3, session 51: ``kernels._overlap_loop``
    with ``lean``) on the shipped D = 128 long-call config: ``launch.call_knobs`` keeps its
    view of v and both hoists, and built for sm_90a its key loop waits for the score product
    with ``P @ V`` still in flight (``WARPGROUP.DEPBAR.LE gsb0, 0x1``). ptxas drops that wait
    when it serialises the kernel's wgmma (C7515: with the repeated key tile's product skipped
    too, every wait was ``0x0``), so the lab would time the serial loop under the overlap's
    name. The serial control (4) waits for both; neither spills, and each issues the shipped
    loop's tensor work and exponentials."""
    from tools import lab_tilelang as L

    cfg = L.VARIANTS["ovl-lean"][0](128)
    def pick(knobs, names):
        full = launch.full_knobs(knobs)
        return [full[launch._KNOB[n]] for n in names]
    assert pick(cfg[4:], ("overlap", "hoist_left", "hoist_keys")) == [3, 1, 1]
    baked = launch.call_knobs(cfg[4:], True, 64, cfg[1], launch.LOG2E * default_scale(128), 1,
                              True, 128)
    assert pick(baked, ("overlap", "hoist_left", "hoist_keys", "v_chunk")) == [3, 1, 1, 1]
    ship = sass_loops.loops(_cubin(_call_args(128, launch.shipped_config(128, 128)))[1])[0]
    for name, in_flight in (("ovl-lean", True), ("ovl-lean-serial", False)):
        src, sass, res = _cubin(_call_args(128, L.VARIANTS[name][0](128)))
        assert "STL" not in sass and "LDL" not in sass, name
        waits = set(re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x\d)", sass))
        assert waits == ({"0x0", "0x1"} if in_flight else {"0x0"}), (name, waits)
        loop = sass_loops.loops(sass)[0]
        assert (loop["hgmma"], loop["ex2"]) == (ship["hgmma"], ship["ex2"]), (name, loop, ship)


#: The key loop's order of turns, products, their waits and the exponentials, per ``pingpong``
#: value (runs of one kind collapsed): 1 hands the turn over after the product's wait, 2 before.
_PP_ORDER = {1: ["take", "qk", "wait", "give", "ex2", "take", "pv", "wait", "give"],
             2: ["take", "qk", "give", "wait", "ex2", "take", "pv", "give", "wait"]}


def _pp_loop(sass):
    """The consumer key loop's barriers and the order of its turns (``take`` / ``give``),
    products (``qk``: shared-memory operands; ``pv``: the register operand ``P``), their waits
    and ``MUFU.EX2``, runs of one kind collapsed."""
    loop = sass_loops.loops(sass)[0]
    body = [t for a, t in sass_loops.instructions(sass)
            if int(loop["start"], 16) <= a <= int(loop["branch"], 16)]
    kinds = []
    for t in body:
        if re.search(r"\bBAR\.SYNC\.DEFER_BLOCKING R\d+, 0x100\b", t):
            kinds.append("take")
        elif re.search(r"\bBAR\.ARV R\d+, 0x100\b", t):
            kinds.append("give")
        elif re.search(r"\bHGMMA\.\S+ R\d+, R\d+, gdesc", t):
            kinds.append("pv")
        elif re.search(r"\bHGMMA\.\S+ R\d+, gdesc", t):
            kinds.append("qk")
        elif "WARPGROUP.DEPBAR" in t:
            kinds.append("wait")
        elif "MUFU.EX2" in t:
            kinds.append("ex2")
    seq = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    return [t for t in body if re.search(r"\bBAR\.", t)], seq


def _named_barriers(src):
    """The ids of TileLang's own named-barrier syncs and arrivals in a CUDA source."""
    return set(re.findall(r"__(?:sync_thread_partial|named_barrier_arrive)\((\d+)", src))


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("variant, pingpong", [("pp", 1), ("pp-async", 2)])
def test_pingpong_turns_bracket_each_product_in_the_key_loop(variant, pingpong, D):
    """The lab's ping-pong (``pingpong`` 1 and 2, session 52: ``kernels.PINGPONG_SRC``) on the
    128 x 64 tile of two consumer warp groups, built for sm_90a: in the consumer's key loop
    each product is bracketed by its turn, a ``BAR.SYNC`` on a register id before it (the key
    tile's mbarrier wait may come either side) and a ``BAR.ARV`` after its wait (1) or between
    its issue and its wait (2: the other group's product queues behind it). The ``P V`` turn's
    wait comes after the softmax step's last ``MUFU.EX2`` (ptxas hoisted it above the whole
    step until its id depended on the row sums), so one group's softmax runs outside its turn.
    No other barrier sits in the loop (a sync of both groups would meet a group waiting for its
    turn): the four turns and group 1's first hand-over (an immediate id, tile 0 only). Named
    barriers 12 and 13 (``PINGPONG_BARRIERS``) appear only in the turns: TileLang's own
    partial syncs name neither, here or in the control ``pp-off``."""
    from tools import lab_tilelang as L

    cfg = L.VARIANTS[variant][0](D)
    assert (cfg[:4], launch.full_knobs(cfg[4:])[launch._KNOB["pingpong"]]) == (
        (128, 64, 2, 256), pingpong)
    src, sass, _ = _cubin(_call_args(D, cfg))
    assert "STL" not in sass and "LDL" not in sass
    bars, seq = _pp_loop(sass)
    assert seq == _PP_ORDER[pingpong], seq
    assert len(bars) == 5 and sum("BAR.ARV 0xc, 0x100" in t for t in bars) == 1, bars
    assert not _named_barriers(src) & {"12", "13"}
    if (pingpong, D) == (1, 128):
        ctl = _cubin(_call_args(128, L.VARIANTS["pp-off"][0](128)))
        assert "hils_pp_turn" not in ctl[0] and not re.search(r"BAR\.(SYNC|ARV)\S* R\d+", ctl[1])
        assert not _named_barriers(ctl[0]) & {"12", "13"}


def test_pingpong_refusals_and_permissions():
    """Where the kernel refuses ``pingpong`` (each refusal by its own message, on the lab's pp
    build with only the one factor changed) and what ``launch.call_knobs`` bakes: it drops the
    knob where the consumers would write ``V_s`` (``mask_lmk`` without the chunk view) and with
    ``pack``, then ``hoist_keys`` only where ``pingpong`` stays."""
    import inspect

    from tools import lab_tilelang as L

    cfg = L.VARIANTS["pp"][0](128)
    names = list(inspect.signature(kernels.fwd_tc.func).parameters)
    args = dict(zip(names, _call_args(128, cfg)))
    assert args["pingpong"] == 1 and args["v_chunk"] == 1 and not args.get("hoist_keys")
    kernels.fwd_tc.get_tir(**args)  # the build the refusals below change one factor of
    for change, message in ((dict(hoist_keys=1), "not with hoist_keys"),
                            (dict(block_M=64, threads=128), "two consumer warp groups"),
                            (dict(pack=2, hoist_left=0), "two consumer warp groups"),
                            (dict(v_chunk=0, lmk_const=False), "chunk view of v")):
        with pytest.raises(ValueError, match=message):
            kernels.fwd_tc.get_tir(**{**args, **change})

    def baked(view, group=1, **knobs):
        full = launch.full_knobs(launch.call_knobs(launch.with_knobs(cfg, **knobs)[4:], True,
                                                   64, 64, None, group, view, 128))
        return [full[launch._KNOB[n]] for n in ("hoist_keys", "pingpong", "v_chunk")]

    assert baked(True, hoist_keys=1) == [0, 1, 1]
    assert baked(False, hoist_keys=1) == [1, 0, 0]  # no view: no pingpong, so hoist_keys stays
    assert baked(True, group=2, pack=True, hoist_keys=1)[:2] == [0, 0]  # pack: neither


def _lowered(kind, args):
    """``(device source, host script)`` of ``kernels.<kind>(*args)`` lowered for sm_90a, as
    tools/tl_lower.py lowers (no nvcc)."""
    jit = getattr(kernels, kind)
    func = jit.get_tir(*args)
    with tilelang.transform.PassContext(config=jit.pass_configs or {}), kernels.HOPPER:
        art = tilelang.lower(func, target=kernels.HOPPER)
    return art.kernel_source, art.host_mod.script()


def _with_cols(args, **cols):
    """fwd_tc factory arguments ``args`` with per-call knobs (``o_cols``, ``qk_cols``,
    ``v_cols``) set."""
    knobs = launch.full_knobs(args[launch._KNOBS_AT:])
    for name, n in cols.items():
        knobs[launch._KNOB[name]] = n
    return args[:launch._KNOBS_AT] + launch.trimmed_knobs(knobs)


def _with_o_cols(args, n):
    """fwd_tc factory arguments ``args`` with the per-call knob ``o_cols`` set to ``n``."""
    return _with_cols(args, o_cols=n)


def test_narrow_o_goes_by_the_copy_engine_where_its_rows_allow():
    """``o_cols`` (a call whose Dv the adapter padded: the kernels write the call's o,
    launch.o_cols): on the shipped D = 64 tile, at 56 columns (112-byte rows) the device
    code is the full-width kernel's and o's tensor map has 56 columns 112 bytes apart (the
    copy engine drops the tile's last 8: nothing else changes); at 36 columns (72-byte rows,
    which no tensor map takes) o is written by a predicated SIMT copy, and no O descriptor
    is made."""
    args = TC_VARIANTS["d64"]
    full, full_host = _lowered("fwd_tc", args)
    src56, host56 = _lowered("fwd_tc", _with_o_cols(args, 56))
    src36, host36 = _lowered("fwd_tc", _with_o_cols(args, 36))
    assert "tma_store(O_desc" in full and src56 == full
    assert re.search(r"O_desc, 9, 4, O, 64, Lq, Hq, B, 2, 128,", full_host)
    assert re.search(r"O_desc, 9, 4, O, 56, Lq, Hq, B, 2, 112,", host56)
    assert "O_desc" not in src36 and "O_desc" not in host36
    assert "bfloat16_t* __restrict__ O" in src36
    assert re.search(r"\* \(int64_t\)36\)", src36)  # o's rows, 36 elements apart


def _tma_map(host, name):
    """``(first dim, first stride in bytes)`` of tensor map ``name`` in a lowered host script."""
    m = re.search(rf"{name}_desc, 9, (\d), {name}, (\d+), (.*)", host)
    assert m, f"no tensor map for {name}"
    rest = m.group(3).split(", ")  # the other dims, the element's bytes, then the strides
    return m.group(2), rest[int(m.group(1))]


@pytest.mark.parametrize("name, qk, vc", [("d64", 56, 40), ("d128-long-vchunk", 120, 104),
                                          ("d128-split-vchunk", 120, 104)])
def test_narrow_inputs_go_by_the_copy_engine(name, qk, vc):
    """``qk_cols`` / ``v_cols`` (the call's own q, k, v where the adapter rounded a head dim up,
    launch.in_cols): the shipped D = 64 tile, the D = 128 long-call tile with the chunk view
    of v and the split kernel with it lower to the full-width kernel's device code byte for
    byte; only the host's tensor maps change, to the inputs' widths and row strides (the copy
    engine fills the tiles' columns past them with zeros). 120 / 104 columns on a 128 x 128
    tile is not a shape the adapter makes (it would build Dv = 112), but the kernel takes it."""
    args = (_tc(128, 128, view=True, long=True) if name == "d128-long-vchunk"
            else TC_VARIANTS[name])
    full, full_host = _lowered("fwd_tc", args)
    src, host = _lowered("fwd_tc", _with_cols(args, qk_cols=qk, v_cols=vc))
    assert src == full
    D = args[0]
    for n in "QKV":
        assert _tma_map(full_host, n)[0] == str(D)
    assert _tma_map(host, "Q")[0] == _tma_map(host, "K")[0] == str(qk)
    assert _tma_map(host, "V")[0] == str(vc)
    if "vchunk" not in name:  # the chunk view's strides are runtime values
        assert _tma_map(host, "K")[1] == str(2 * qk) and _tma_map(host, "V")[1] == str(2 * vc)


def test_packed_rows_read_a_narrow_q_by_column():
    """The GQA-packed rows load q by an element loop (not a tensor map): with ``qk_cols`` = 120
    on the D = 128 packed tile, each row's 16-byte loads stop at column 120 (15 of 16 by a
    thread's column group, zeros in the last), in rows 120 elements apart."""
    args = TC_VARIANTS["d128-pack"]
    full, _ = _lowered("fwd_tc", args)
    src, host = _lowered("fwd_tc", _with_cols(args, qk_cols=120))
    assert src != full and "& 15) < 15)" in src and "& 15) < 15)" not in full
    assert "(int64_t)120))" in src and "(int64_t)120))" not in full
    assert _tma_map(host, "K")[0] == "120" and _tma_map(host, "V")[0] == "128"
