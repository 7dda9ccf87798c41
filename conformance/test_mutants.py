"""The suite catches real bugs: every mutant FAILS the quick tier, and the
failure message names the right thing.

For each mutant the quick-tier cases are tried category by category, starting
with the category that targets its rule, until one fails with the expected
kind; the test fails if the whole quick tier passes the mutant, or fails it
only for other reasons.
"""

import sys

import pytest
import torch

from conformance.cases import generate
from conformance.mutants import EXTRA_MUTANTS, MUTANTS

ALL = {**MUTANTS, **EXTRA_MUTANTS}
from conformance.runner import Check, Runner

# mutant -> (a kind its failure must name, the category that targets its rule)
EXPECT = {
    "lse_base2": ("lse", "basic"),
    "reshaped_output": ("output", "basic"),
    "window_off_by_one": ("output", "window"),
    "no_chunk_expansion": ("output", "window"),
    "landmark_shifted": ("output", "flags"),
    "landmark_from_index": ("output", "kv_start"),
    "kv_start_ignored": ("output", "kv_start"),
    "positions_int64": ("output", "kv_start"),
    "query_offset_ignored": ("output", "lengths"),
    "gqa_modulo": ("output", "gqa"),
    "scale_from_dv": ("output", "headdim"),
    "sm_scale_ignored": ("output", "scale"),
    "empty_rows_nan": ("empty row", "empty_rows"),
    "nan_leak": ("nan", "nan_slots"),
    "nan_v_spread": ("nan", "nan_v_seen"),
    "strides_ignored": ("output", "layout"),
    "low_precision_accumulation": ("output", "lengths"),
    "fp16_probabilities": ("output", "dtype"),
    "output_dtype_fp32": ("dtype", "basic"),
    "tail_unwritten": ("nan", "basic"),
    "inputs_modified": ("input", "basic"),
    "nan_rows_emptied": ("nan", "nan_seen"),
    "no_validation": ("error", "errors"),
}

QUICK = generate("quick", "cpu")


def test_every_mutant_has_an_expectation():
    assert set(EXPECT) == set(ALL)


def test_mutants_table_shape():
    for name, (backend, text) in ALL.items():
        assert backend.name == f"mutant:{name}" and callable(backend.fn) and text


@pytest.mark.parametrize("name", list(ALL))
def test_suite_fails_mutant(name):
    backend = ALL[name][0]
    kind, first = EXPECT[name]
    runner = Runner({backend.name: backend}, run_seed=0, keep=1)
    order = [c for c in QUICK if c.category == first] + [c for c in QUICK if c.category != first]
    other = []
    for case in order:
        res = runner.run(Check(case, (backend.name,)))
        if res.verdict.status == "fail":
            if kind in res.verdict.kinds:
                assert case.id in res.message and backend.name in res.message
                assert any(p.lower().startswith(kind) for p in res.verdict.problems), res.message
                return
            other.append(res.message)
    pytest.fail(f"the quick tier never failed {name} with '{kind}'"
                + (f"; other failures: {other[:3]}" if other else ": it passed every case"))


def test_reference_is_not_a_mutant():
    """Control: the same search finds no failure for the reference itself (basic + errors)."""
    from conformance.registry import load_backend

    ref = load_backend("reference")
    runner = Runner({"reference": ref}, run_seed=0, keep=1)
    for case in (c for c in QUICK if c.category in ("basic", "errors", "empty_rows", "nan_slots")):
        res = runner.run(Check(case, ("reference",)))
        assert res.verdict.status == "pass", res.message


def test_poisoned_empty_fills_floating_allocations_and_restores():
    """runner.poisoned_empty: inside, torch.empty / empty_like / empty_strided and
    Tensor.new_empty give NaN-filled floating tensors (integer ones untouched); after it,
    even after an exception, the real functions are back."""
    from conformance.runner import poisoned_empty

    real = (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty)
    base = torch.zeros(3)
    with pytest.raises(RuntimeError, match="inside"):
        with poisoned_empty():
            made = [torch.empty(4, 5), torch.empty_like(base, dtype=torch.bfloat16),
                    torch.empty_strided((2, 3), (3, 1), dtype=torch.float16), base.new_empty(6)]
            assert all(t.isnan().all() for t in made)
            assert torch.empty(7, dtype=torch.int32).dtype == torch.int32
            raise RuntimeError("inside")
    assert (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty) == real
    # overlapping uses (threads) restore the real functions when the last one ends; sparse
    # tensors are left as made
    a, b = poisoned_empty(), poisoned_empty()
    a.__enter__()
    b.__enter__()
    assert torch.empty((2, 2), layout=torch.sparse_coo).layout == torch.sparse_coo
    a.__exit__(None, None, None)
    assert torch.empty(3).isnan().all()
    b.__exit__(None, None, None)
    assert (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty) == real


def test_unwritten_rows_fail_on_every_case_that_has_them():
    """tail_unwritten leaves the rows past the last full 64-row tile of its torch.empty
    outputs unwritten: with the outputs poisoned, every quick-tier case with such rows
    fails with 'nan', deterministically (on the CPU too, where fresh memory is often 0)."""
    backend = ALL["tail_unwritten"][0]
    runner = Runner({backend.name: backend}, run_seed=0, keep=1)
    cases = [c for c in QUICK if c.category in ("basic", "lengths") and c.Lq % 64 and c.B * c.Hq * c.Dv]
    assert cases
    for case in cases:
        v = runner.run(Check(case, (backend.name,))).verdict
        assert v.status == "fail" and "nan" in v.kinds, (case.id, v.status, v.kinds)


def test_unsupported_from_a_default_backend_is_a_failure_on_the_cpu():
    """registry.Backend.complete (the default built-ins): a case such a backend refuses on
    the CPU (or a Hopper GPU) fails with 'unsupported'; another backend's refusal is
    reported unsupported."""
    from conformance.registry import Backend
    from reference import UnsupportedConfig

    def refuses(q, k, v, **kw):
        raise UnsupportedConfig("cannot serve BLHD views")
    from conformance.registry import DEFAULT_BACKENDS, load_backend
    assert all(load_backend(n).complete for n in DEFAULT_BACKENDS)
    assert not any(load_backend(n).complete for n in ("triton-tma", "tilelang-split", "flex"))
    case = next(c for c in QUICK if c.category == "basic")
    for complete, status in ((True, "fail"), (False, "unsupported")):
        be = Backend(name="refuser", fn=refuses, complete=complete)
        v = Runner({"refuser": be}, run_seed=0, keep=1).run(Check(case, ("refuser",))).verdict
        assert v.status == status, (complete, v.status)
        assert (v.kinds == ["unsupported"]) is complete


def test_runner_keeps_case_states_within_a_byte_budget(monkeypatch):
    """The runner's LRU keeps up to ``keep`` case states, and past the current one at most
    ``runner.KEEP_BYTES`` of inputs and snapshots (session 31: three ``long4m`` states of
    4-9 GB per worker ran an H200 shared by 14 workers out of memory): a state over the
    budget is dropped as soon as another case starts; small ones stay."""
    from conformance import runner as R
    from conformance.cases import Case

    small = [Case(category="x", Lq=8 + i, Lk=16, dtype="fp32", B=1, Hq=2, Hkv=1) for i in range(4)]
    run = Runner({}, run_seed=0, keep=3)
    for c in small:
        run._state(c)
    assert list(run._cache) == [c.id for c in small[1:]]  # keep = 3, oldest out
    one = R.state_bytes(run._cache[small[-1].id])
    assert one > 0
    monkeypatch.setattr(R, "KEEP_BYTES", one + 1)  # room for one state beside the current
    big = Case(category="x", Lq=8, Lk=4096, dtype="fp32", B=1, Hq=2, Hkv=1)
    run._state(big)
    assert list(run._cache) == [small[-1].id, big.id]
    run._state(small[0])  # the big state is over the budget: dropped, with the oldest small
    assert list(run._cache) == [small[0].id]
    run._state(small[1])
    assert list(run._cache) == [small[0].id, small[1].id]
    # error cases' inputs may have no readable storage (a sparse k, a nested v): counted as
    # 0 bytes, never an exception (the first version raised for every later case)
    for rule in ("k_sparse", "v_nested"):
        run._state(Case(category="errors", error=rule, Lq=8, Lk=16, B=1, Hq=2, Hkv=1))
    run._state(small[2])
    assert list(run._cache)[-1] == small[2].id


def _slot_held_elsewhere(path: str) -> bool:
    """Whether another process holds the flock on ``path`` (checked from a child process)."""
    import subprocess

    probe = "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT); " \
            "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)"
    return subprocess.run([sys.executable, "-c", probe, path], capture_output=True).returncode != 0


@pytest.mark.skipif(sys.platform == "win32", reason="the slots are POSIX flocks")
def test_heavy_cases_live_only_while_their_worker_holds_a_memory_slot(monkeypatch, tmp_path):
    """A heavy case (``runner.heavy``: CUDA inputs of a GB or more, the full tier's ``long4m``)
    takes one of its GPU's memory slots before its state is built, and gives it back when that
    state is evicted; a second heavy case lets the first one's state go before it waits
    (session 36: 14 workers' ``long4m`` states ran an 80 GB H100 out of memory). Here on the CPU
    with a stand-in for ``heavy`` and one slot per GPU."""
    import os
    import tempfile

    from conformance import pinning
    from conformance import runner as R
    from conformance.cases import Case

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the lock files: here, not in /tmp
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"runner-slot-test-{os.getpid()}")
    monkeypatch.setattr(R, "heavy", lambda c: c.Lk >= 4096)
    monkeypatch.setattr(R, "memory_slots", lambda device: 1)
    path = pinning.memory_lock_path(0)
    small = Case(category="x", Lq=8, Lk=16, dtype="fp32", B=1, Hq=2, Hkv=1)
    heavy = [Case(category="x", Lq=8 + i, Lk=4096, dtype="fp32", B=1, Hq=2, Hkv=1) for i in range(2)]
    run = Runner({}, run_seed=0, keep=3)
    run._state(small)
    assert not _slot_held_elsewhere(path)
    run.reserve(heavy[0])
    assert _slot_held_elsewhere(path) and list(run._cache) == []  # the small state went first
    run._state(heavy[0])
    run.reserve(heavy[0])  # its state is cached: nothing to wait for, the slot stays
    assert list(run._cache) == [heavy[0].id] and _slot_held_elsewhere(path)
    run._state(heavy[1])  # without reserve(): waits in _state, after letting heavy[0] go
    assert list(run._cache) == [heavy[1].id] and _slot_held_elsewhere(path)
    monkeypatch.setattr(R, "KEEP_BYTES", 1)  # a real heavy state is over it by definition
    run._state(small)  # heavy[1] is over KEEP_BYTES beside the current state: evicted
    assert list(run._cache) == [small.id] and not _slot_held_elsewhere(path)
    run._state(heavy[0])
    run.release()  # the plugin, after a heavy case's last check: every state and the slot go
    assert list(run._cache) == [] and run.slot_case is None and not _slot_held_elsewhere(path)


@pytest.mark.skipif(sys.platform == "win32", reason="the slots are POSIX flocks")
def test_a_heavy_state_s_memory_is_gone_before_its_slot_is(monkeypatch, tmp_path):
    """A backend that raised leaves its exception, and through its traceback's frames its
    tensors, in the state; a build that raised leaves its partial tensors in the traceback.
    Either way the tensors must be gone when the slot goes back, and a failed build gives the
    slot back at once (session 36's review: the exception's reference cycle outlived the
    eviction, and a failed build kept the slot until the next case)."""
    import os
    import tempfile
    import weakref

    from conformance import pinning
    from conformance import runner as R
    from conformance.cases import Case
    from conformance.registry import Backend

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"runner-drop-test-{os.getpid()}")
    monkeypatch.setattr(R, "heavy", lambda c: c.Lk >= 4096)
    monkeypatch.setattr(R, "memory_slots", lambda device: 1)
    monkeypatch.setattr(R, "KEEP_BYTES", 1)
    path = pinning.memory_lock_path(0)
    seen = []

    def raises(q, k, v, **kw):
        scratch = k * 2  # a backend temporary the traceback's frame holds
        seen.append(weakref.ref(scratch))
        raise RuntimeError("out of memory (stand-in)")

    run = Runner({"raises": Backend(name="raises", fn=raises)}, run_seed=0, keep=3)
    big = Case(category="x", Lq=8, Lk=4096, dtype="fp32", B=1, Hq=2, Hkv=1)
    run.reserve(big)
    v = run.run(Check(big, ("raises",))).verdict
    assert v.status == "fail" and v.kinds == ["crash"]
    k_ref = weakref.ref(run._cache[big.id].k)
    release = run._release_slot

    def checked_release():  # at the moment the slot goes back: nothing of the state is left
        assert k_ref() is None and seen[0]() is None, "a heavy state's tensors outlived its slot"
        release()
    monkeypatch.setattr(run, "_release_slot", checked_release)
    run._state(Case(category="x", Lq=8, Lk=16, dtype="fp32", B=1, Hq=2, Hkv=1))
    assert not _slot_held_elsewhere(path) and run.slot_case is None

    def broken(*a, **kw):
        raise ValueError("truth failed (stand-in)")
    monkeypatch.setattr(R, "expected", broken)
    with pytest.raises(ValueError, match="truth failed"):
        run._state(Case(category="x", Lq=9, Lk=4096, dtype="fp32", B=1, Hq=2, Hkv=1))
    assert run.slot_case is None and not _slot_held_elsewhere(path)
