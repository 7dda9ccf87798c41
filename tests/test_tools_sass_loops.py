"""tools/sass_loops.py's SASS reading on a hand-written listing (no compiler needed); the
tool on a real kernel: tests/test_tilelang_compile.py (test_constant_landmark_columns_...)."""

from tools import sass_loops

# cuobjdump -sass's shape: /*address*/ instruction ; /* encoding */
LISTING = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_TID.X ;                      /* 0x0000000000007919 */
.L_x_1:
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;   /* 0x0 */
        /*0030*/                   MUFU.EX2 R3, R2 ;                       /* 0x0 */
        /*0040*/               @P2 STL [R1], R3 ;                          /* 0x0 */
        /*0050*/               @P0 BRA 0x20 ;                              /* 0x0 */
.L_x_2:
        /*0060*/                   FADD R4, R4, 1 ;                        /* 0x0 */
        /*0070*/               @P1 BRA 0x60 ;                              /* 0x0 */
        /*0080*/                   BRA 0x90 ;                              /* 0x0 */
        /*0090*/                   EXIT ;                                  /* 0x0 */
"""


def test_loops_are_the_backward_branches_that_issue_hgmma():
    ins = sass_loops.instructions(LISTING)
    assert len(ins) == 10 and ins[2] == (0x20, "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ")
    assert ins[4] == (0x40, "@P2 STL [R1], R3")
    # 0x20..0x50 issues HGMMA; 0x60..0x70 does not (a loop without tensor work); 0x80 branches
    # forward
    assert sass_loops.loops(LISTING) == [dict(instructions=4, hgmma=1, ex2=1, start="0x20",
                                              branch="0x50")]


PRODUCER = """
        /*0000*/                   S2R R0, SR_TID.X ;                      /* 0x0 */
        /*0010*/                   MUFU.RCP R5, R4 ;                       /* 0x0 */
        /*0020*/                   UTMALDG.2D [UR8], [UR4] ;               /* 0x0 */
        /*0030*/               @P0 BRA 0x10 ;                              /* 0x0 */
        /*0040*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;   /* 0x0 */
        /*0050*/                   UTMALDG.2D [UR8], [UR4] ;               /* 0x0 */
        /*0060*/               @P1 BRA 0x40 ;                              /* 0x0 */
        /*0070*/                   EXIT ;                                  /* 0x0 */
"""


def test_producer_loops_are_the_backward_branches_that_load_by_tma_without_hgmma():
    # 0x10..0x30 loads by TMA with a division's reciprocal; 0x40..0x60 issues HGMMA too
    assert sass_loops.producer_loops(PRODUCER) == [dict(instructions=3, tma=1, rcp=1,
                                                        start="0x10", branch="0x30")]
    assert sass_loops.producer_loops(LISTING) == []


def test_summary_reads_registers_spills_and_the_register_split():
    res = "Function main_kernel:\n  REG:80 STACK:0 SHARED:2048 LOCAL:0 CONSTANT[0]:1316\n"
    src = "warpgroup_reg_dealloc<24>(); ... warpgroup_reg_alloc<136>();"
    s = sass_loops.summary(src, LISTING, res)
    assert (s["registers"], s["stack"], s["local"], s["setmaxnreg"]) == (80, 0, 0, [24, 136])
    assert s["spills"] == 1 and s["instructions"] == 10  # the predicated STL counts and len(s["loops"]) == 1


def test_variants_name_their_kernel_kind():
    """``shipped`` and the lab's prefill variants build the prefill grid's kernel; a decode
    variant its plan's kernel (split-KV where it splits); an unknown name is refused with
    the names there are."""
    import pytest
    pytest.importorskip("tilelang", reason="tilelang is not installed")
    from tilelang_impl import launch
    assert sass_loops.config_of("shipped", 64) == (launch.shipped_config(64, 64), False)
    cfg, split = sass_loops.config_of("dec-nolmkconst", 128)
    assert split and cfg[4 + launch._KNOB["lmk_const"]] is False
    assert sass_loops.config_of("dec-shipped", 128) == (launch.split_config(128, 128), True)
    assert sass_loops.config_of("dec-shipped", 64)[1] is False  # D = 64 decode: the prefill grid
    with pytest.raises(SystemExit, match="occ3-64x64v"):
        sass_loops.config_of("no-such-variant", 64)
    args = sass_loops.kernel_args(cfg, 128, 64, split=True)
    assert args[11] is True  # fwd_tc's split argument
