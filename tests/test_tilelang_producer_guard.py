"""tilelang_impl.producer_guard: the producer warp group's warps 1-3 leave before its key
loop (session 41: the fix of a hang cuda-gdb pinned to a producer warp a round behind on a
parity wait). The text transform on sources written here, then on kernels TileLang lowers
for sm_90a on the CPU (no nvcc), then the check the launcher makes on every built kernel."""
from __future__ import annotations

import re

import pytest

from tilelang_impl import producer_guard as PG

ENTRY = f'extern "C" __global__ void __launch_bounds__(256, 2) {PG.KERNEL}_kernel(int n) {{\n'
PRE = "  __syncthreads();\n"
PRODUCER = """  if (((int)threadIdx.x) < 128) {
    tl::warpgroup_reg_dealloc<24>();
    int rmod = (n % 3);
    for (int kb = 0; kb < n; ++kb) {
      mbarrier[((kb & 1) + 4)].wait((((kb & 3) >> 1) ^ 1));
      if (tl::tl_shuffle_elect<128>()) {
        mbarrier[(kb & 1)].arrive_and_expect_tx(8192);
        #pragma unroll
        for (int i_1 = 0; i_1 < 2; ++i_1) {
          int rdiv_1 = (n / 3);
          tl::tma_load(K_desc, mbarrier[(kb & 1)], K_s, i_1, rdiv_1);
        }
      }
    }
"""
CONSUMER = """  } else {
    tl::warpgroup_reg_alloc<232>();
    mbarrier[4].arrive();
  }
"""
END = "}\n"


def source(producer=PRODUCER, consumer=CONSUMER, end=END, entry=ENTRY):
    return entry + PRE + producer + consumer + end


def test_warps_1_to_3_leave_right_before_the_key_loop():
    out = PG.guard(source())
    assert PG.guarded(out) and out.count(PG.MARK) == 1
    leave = out.index("if (((int)threadIdx.x) >= 32) {")
    assert out.index("tl::warpgroup_reg_dealloc<24>();") < out.index("int rmod") < leave
    assert out[leave:].index("return;") < out[leave:].index("for (int kb = 0; ")
    # nothing else changed, and a second pass changes nothing
    assert re.sub(r"\n *if \(\(\(int\)threadIdx\.x\) >= 32\) \{[^\n]*\n *return;\n *\}", "",
                  out) == source()
    assert PG.guard(out) == out


def test_a_kernel_without_setmaxnreg_is_guarded_too():
    """TileLang leaves ``setmaxnreg`` out of some warp-specialised kernels (session 58: the
    D = 256 tile with the D <= 128 knobs, 203 registers a thread): no instruction then needs
    the whole producer group, and warps 1-3 leave before the loop as elsewhere."""
    bare = source(PRODUCER.replace("    tl::warpgroup_reg_dealloc<24>();\n", ""),
                  CONSUMER.replace("    tl::warpgroup_reg_alloc<232>();\n", ""))
    out = PG.guard(bare)
    assert PG.guarded(out) and "warpgroup_reg" not in out
    leave = out.index("if (((int)threadIdx.x) >= 32) {")
    assert out.index("int rmod") < leave < out.index("for (int kb = 0; ")
    # a consumer's setmaxnreg without the producer's is refused, as before
    with pytest.raises(PG.GuardError, match="setmaxnreg"):
        PG.guard(source(PRODUCER.replace("    tl::warpgroup_reg_dealloc<24>();\n", "")))


@pytest.mark.parametrize("entry", [
    'extern "C" __global__ void main_kernel(int n) {\n',  # another TileLang kernel
    f'extern "C" __global__ void {PG.KERNEL_ALL_WARPS}_kernel(int n) {{\n',  # the lab's control
])
def test_other_kernels_pass_through(entry):
    assert PG.guard(source(entry=entry)) == source(entry=entry)


def test_a_kernel_of_ours_without_warp_specialisation_passes_through():
    flat = ENTRY + "  for (int kb = 0; kb < n; ++kb) {\n    acc += 1;\n  }\n" + END
    assert PG.guard(flat) == flat


@pytest.mark.parametrize("producer, consumer, end, what", [
    # the producer's warps 1-3 write shared memory in the loop: they must stay
    (PRODUCER.replace("      if (tl::tl_shuffle_elect<128>()) {",
                      "      ((float*)V_s)[threadIdx.x] = 0.f;\n"
                      "      if (tl::tl_shuffle_elect<128>()) {"), CONSUMER, END, "do more than wait"),
    # or arrive on a barrier
    (PRODUCER.replace("      if (tl::tl_shuffle_elect<128>()) {",
                      "      mbarrier[3].arrive();\n      if (tl::tl_shuffle_elect<128>()) {"),
     CONSUMER, END, "do more than wait"),
    # work after the producer's loop
    (PRODUCER + "    tl::fence_proxy_async();\n", CONSUMER, END, "after its key loop"),
    # two key loops
    (PRODUCER.replace("    int rmod = (n % 3);\n",
                      "    int rmod = (n % 3);\n    for (int kb = 0; kb < n; ++kb) {\n    }\n"),
     CONSUMER, END, "2 producer key loops"),
    # the kernel goes on after the branches (warps 1-3 would skip it)
    (PRODUCER, CONSUMER, "  __syncthreads();\n}\n", "goes on after"),
    # setmaxnreg after the loop starts (warps 1-3 would leave without it)
    (PRODUCER.replace("    tl::warpgroup_reg_dealloc<24>();\n", "").replace(
        "      mbarrier[((kb & 1) + 4)]", "      tl::warpgroup_reg_dealloc<24>();\n"
        "      mbarrier[((kb & 1) + 4)]"), CONSUMER, END, "setmaxnreg"),
    # no consumer branch
    (PRODUCER, "  }\n", END, "no consumer"),
    # side effects hidden in what looks like an integer, a wait or a loop header
    (PRODUCER.replace("    int rmod = (n % 3);\n    for (int kb = 0; kb < n; ++kb) {\n",
                      "    for (int kb = 0; kb < n; ++kb) {\n      int x = atomicAdd((int*)K_s, 1);\n"),
     CONSUMER, END, "do more than wait"),
    (PRODUCER.replace("    for (int kb = 0; kb < n; ++kb) {\n",
                      "    for (int kb = 0; kb < n; ++kb) {\n      int x = ((int*)K_s)[kb] = 0;\n"),
     CONSUMER, END, "do more than wait"),
    (PRODUCER.replace("    for (int kb = 0; kb < n; ++kb) {\n",
                      "    for (int kb = 0; kb < n; ++kb) {\n      int x = *((int*)K_s);\n"),
     CONSUMER, END, "do more than wait"),
    (PRODUCER.replace("      mbarrier[((kb & 1) + 4)].wait((((kb & 3) >> 1) ^ 1));",
                      "      mbarrier[4].wait(0), mbarrier[2].arrive();"), CONSUMER, END,
     "do more than wait"),
    (PRODUCER.replace("        for (int i_1 = 0; i_1 < 2; ++i_1) {",
                      "        for (int i_1 = 0; i_1 < 2; ++i_1) {").replace(
        "      mbarrier[((kb & 1) + 4)]", "      for (int j = 0; j < __shfl_sync(~0u, n, 0); ++j) {\n"
        "      }\n      mbarrier[((kb & 1) + 4)]"), CONSUMER, END, "do more than wait"),
])
def test_a_producer_of_another_shape_is_refused(producer, consumer, end, what):
    with pytest.raises(PG.GuardError, match=what):
        PG.guard(source(producer, consumer, end))


def test_branches_nested_in_a_block_the_kernel_goes_on_after_are_refused():
    nested = (ENTRY + PRE + "  if (n > 0) {\n" + PRODUCER + CONSUMER + "  }\n"
              + "  __syncthreads();\n" + END)
    with pytest.raises(PG.GuardError, match="goes on after"):
        PG.guard(nested)


def test_a_warp_specialised_kernel_without_the_known_branch_is_refused():
    odd = source(PRODUCER.replace("threadIdx.x) < 128)", "threadIdx.x) >= 128)"))
    with pytest.raises(PG.GuardError, match="without the producer branch"):
        PG.guard(odd)


class _Built:
    def __init__(self, src):
        self.src = src

    def get_kernel_source(self):
        return self.src


def test_check_refuses_a_built_kernel_without_the_guard():
    PG.check(_Built(PG.guard(source())))
    PG.check(_Built(source(entry=f'extern "C" __global__ void {PG.KERNEL_ALL_WARPS}_kernel(int n) {{\n')))
    PG.check(_Built(ENTRY + "  acc += 1;\n" + END))  # not warp-specialised
    with pytest.raises(PG.GuardError, match="post-processor"):
        PG.check(_Built(source()))


# --- kernels TileLang lowers (sm_90a, no nvcc) ----------------------------------------


def _lower(args):
    import tilelang

    from tilelang_impl import kernels
    func = kernels.fwd_tc.get_tir(*args)
    with tilelang.transform.PassContext(config=kernels.fwd_tc.pass_configs or {}), kernels.HOPPER:
        return tilelang.lower(func, target=kernels.HOPPER).kernel_source


def _args(D, split=False, short=False, **knobs):
    from tilelang_impl import launch
    from tools.sass_loops import kernel_args
    cfg = (launch.split_config(D, D) if split else
           launch.short_config(D, D) if short else launch.shipped_config(D, D))
    args = kernel_args(launch.with_knobs(cfg, **knobs) if knobs else cfg, D, 64, split)
    return args


@pytest.mark.parametrize("D, split, short", [(64, False, False), (64, False, True), (128, True, False)],
                         ids=["prefill-D64", "short-D64", "split-D128"])
def test_lowered_kernels_carry_the_guard(D, split, short):
    """The shipped prefill kernels (D = 64: the long calls' four-CTA 64x64 tile (three until session 44) and the
    one-block calls' 64x128 tile, launch.grid_config) and the split-KV kernel as TileLang
    writes them for sm_90a: the entry point is ours, the guard is in, once, before the
    producer's loop, and after the producer's setmaxnreg. (The full tier's 200 fwd_tc kernels,
    lowered the same way in session 41, all took it without a GuardError.)"""
    src = _lower(_args(D, split, short))
    assert f"{PG.KERNEL}_kernel(" in src and src.count(PG.MARK) == 1
    producer = src[src.index("if (((int)threadIdx.x) < 128) {"):]
    assert (producer.index("warpgroup_reg_dealloc") < producer.index("if (((int)threadIdx.x) >= 32)")
            < producer.index(PG.MARK) < producer.index("return;") < producer.index("for (int kb = 0; "))


def test_producer_warps_4_is_the_kernel_as_tilelang_writes_it():
    """The lab's control (``producer_warps=4``): another entry point, no guard, and
    otherwise the source of the guarded kernel."""
    guarded = _lower(_args(64))
    allwarps = _lower(_args(64, producer_warps=4))
    assert f"{PG.KERNEL_ALL_WARPS}_kernel(" in allwarps and not PG.guarded(allwarps)
    assert PG.guard(allwarps.replace(PG.KERNEL_ALL_WARPS, PG.KERNEL)) == guarded


def test_a_post_processor_registered_since_is_chained_before_a_build():
    """Another CUDA post-processor registered after ours replaces it (TileLang keeps one):
    ``active`` says so, a kernel built then lacks the guard and ``check`` refuses it;
    ``ensure`` (what ``launch._kernel`` calls before a build) chains it, so both edits land."""
    import tvm_ffi
    from tilelang.engine import register_cuda_postproc

    from tilelang_impl import kernels  # noqa: F401 (installs the guard)
    ours = tvm_ffi.get_global_func("tilelang_callback_cuda_postproc", allow_missing=True)
    assert ours is not None and PG.active()
    try:
        register_cuda_postproc(lambda code, target: str(code) + "\n// theirs\n")
        assert not PG.active()
        src = _lower(_args(64))
        assert src.endswith("// theirs\n") and not PG.guarded(src)
        with pytest.raises(PG.GuardError):
            PG.check(_Built(src))
        PG.ensure()
        assert PG.active()
        src = _lower(_args(64))
        assert "// theirs" in src and PG.guarded(src)
    finally:
        register_cuda_postproc(ours)
    assert PG.active()


def test_the_launcher_refuses_a_kernel_built_without_the_guard(monkeypatch):
    """``launch._kernel`` checks every ``fwd_tc`` kernel it builds (``producer_guard.check``)."""
    from tilelang_impl import kernels, launch
    monkeypatch.setattr(kernels, "fwd_tc", lambda *args: _Built(source()))
    monkeypatch.setattr(launch, "_cache", {})
    with pytest.raises(PG.GuardError, match="without hils-swa's producer guard"):
        launch._kernel("fwd_tc", 64, 64, 3)
    monkeypatch.setattr(kernels, "fwd_tc", lambda *args: _Built(PG.guard(source())))
    assert PG.guarded(launch._kernel("fwd_tc", 64, 64, 3).get_kernel_source())
