"""Run checks: one backend on one case, or a pair of backends on one case.

A worker keeps the last few cases' inputs, golden results and backend outputs
(``CaseState``), so the pair checks of a case reuse the single-backend runs
(the plugin's scheduler sends all checks of a case to one worker, in order).
A check that finds nothing cached computes what it needs.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import math
import os
import threading
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from reference.errors import UnsupportedConfig

from .cases import ERROR_RULES, Case, make_inputs
from .registry import Backend
from .verdict import DEVIATES, FAIL, UNSUPPORTED, Expected, Verdict, expected, judge, judge_error, judge_pair

__all__ = ["Check", "Result", "Runner", "resolve_backends"]


def resolve_backends(specs: list[str]) -> dict:
    """name -> Backend for command-line specs (registry specs, plus ``mutant:NAME``);
    the registry's defaults when there are none. Raises ``ValueError``."""
    from .registry import resolve

    return {b.name: b for b in resolve(list(specs) or None)}


@dataclass(frozen=True)
class Check:
    """A test item: ``case`` run by one backend, or by two (a pair)."""

    case: Case
    backends: tuple[str, ...]

    @property
    def who(self) -> str:
        return "~".join(self.backends)

    @property
    def id(self) -> str:
        return f"{self.case.id}-{self.who}"

    @property
    def is_pair(self) -> bool:
        return len(self.backends) == 2


@dataclass
class Result:
    check: Check
    verdict: Verdict
    seconds: float = 0.0

    @property
    def message(self) -> str:
        return self.verdict.message(self.check.case.id, self.check.who)

    def payload(self) -> dict[str, Any]:
        """JSON-able summary (travels from xdist workers in ``user_properties``)."""
        r = self.verdict.ratio
        return dict(case=self.check.case.id, category=self.check.case.category, who=self.check.who,
                    pair=self.check.is_pair, status=self.verdict.status, kinds=list(self.verdict.kinds),
                    ratio=None if r is None else (r if math.isfinite(r) else "inf"),
                    message=self.message, seconds=round(self.seconds, 4), details=self.verdict.details)


@dataclass
class _Out:
    value: tuple | None = None  # (o, lse)
    exc: BaseException | None = None
    where: str = ""  # file:line of the exception
    verdict: Verdict | None = None


@dataclass
class CaseState:
    case: Case
    q: Any = None
    k: Any = None
    v: Any = None
    kw: dict = field(default_factory=dict)
    exp: Expected | None = None
    snap: tuple | None = None  # bit patterns of q, k, v before any backend ran
    outs: dict[str, _Out] = field(default_factory=dict)


_INT_OF = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as integers: compares NaN payloads exactly."""
    return t.view(_INT_OF[t.element_size()])


def input_snapshot(q, k, v) -> tuple[torch.Tensor, ...]:
    """The bits of ``q``, ``k`` and ``v`` before a backend runs (:func:`restore_modified`)."""
    return tuple(_bits(t).clone() for t in (q, k, v))


def restore_modified(q, k, v, snap) -> list[str]:
    """Names of the inputs a backend changed in place since :func:`input_snapshot`, bit for
    bit (NaN payloads too); each is restored, so the next backend sees the case's inputs."""
    bad = []
    for name, t, saved in zip("qkv", (q, k, v), snap):
        if not torch.equal(_bits(t), saved):
            bad.append(name)
            _bits(t).copy_(saved)
    return bad


def _poison_allocator(case: Case, device: torch.device) -> None:
    """Leave NaN-filled blocks of the output sizes in the CUDA caching allocator,
    so a backend's ``torch.empty`` outputs start as NaN: an element its kernel
    never writes then fails the NaN check. Best effort (CUDA only)."""
    if device.type != "cuda":
        return
    sizes = [case.B * case.Hq * case.Lq * case.Dv, case.B * case.Hq * case.Lq]
    for n in sizes:
        if n:  # filled, then freed at once: the allocator keeps the NaN block cached
            torch.full((n,), float("nan"), dtype=torch.float32, device=device)
    if case.dtype != "fp32" and sizes[0]:
        torch.full((sizes[0],), float("nan"), dtype=case.torch_dtype, device=device)


#: The torch allocators whose floating results :func:`poisoned_empty` fills with NaN.
_EMPTY_FNS = ("empty", "empty_like", "empty_strided")
_POISON = dict(depth=0, saved=None)  # nesting depth, the real functions while patched
_POISON_LOCK = threading.Lock()


def _poisoning(fn):
    def call(*args, **kwargs):
        t = fn(*args, **kwargs)
        if t.is_floating_point() and t.layout == torch.strided and t.device.type != "meta":
            with torch.no_grad():  # a leaf made with requires_grad=True may be filled too
                t.fill_(float("nan"))
        return t
    return call


@contextlib.contextmanager
def poisoned_empty():
    """While a backend runs: ``torch.empty``, ``empty_like``, ``empty_strided`` and
    ``Tensor.new_empty`` return floating (strided) tensors filled with NaN, on any device,
    so an output element the backend allocates that way and never writes fails the NaN
    check for certain (uninitialised memory is often zeros on the CPU; on CUDA
    :func:`_poison_allocator` only makes it likely). Integer and sparse tensors are left
    alone. Names bound before the call (``from torch import empty``) escape it. Uses may
    nest or overlap (threads): the functions are patched by the first and restored by the
    last."""
    with _POISON_LOCK:
        if _POISON["depth"] == 0:
            saved = {n: getattr(torch, n) for n in _EMPTY_FNS}
            saved["new_empty"] = torch.Tensor.new_empty
            _POISON["saved"] = saved
            for n in _EMPTY_FNS:
                setattr(torch, n, _poisoning(saved[n]))
            torch.Tensor.new_empty = _poisoning(saved["new_empty"])
        _POISON["depth"] += 1
    try:
        yield
    finally:
        with _POISON_LOCK:
            _POISON["depth"] -= 1
            if _POISON["depth"] == 0:
                saved, _POISON["saved"] = _POISON["saved"], None
                for n in _EMPTY_FNS:
                    setattr(torch, n, saved[n])
                torch.Tensor.new_empty = saved["new_empty"]


def ships_for(device: torch.device) -> bool:
    """Whether a complete backend (``registry.Backend.complete``) must serve every case on
    this device: the CPU, or a CUDA device of compute capability 9 (Hopper), the machines
    the built-in kernels are made and tested for."""
    return device.type == "cpu" or (device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9)


def _unsupported(be: Backend, device: torch.device, reason: str) -> Verdict:
    """The verdict of a case the backend says it cannot serve: ``unsupported``, or a failure
    for a complete backend on a machine it ships for (a regression that refuses, say,
    BLHD views must not pass as 'unsupported')."""
    if be.complete and ships_for(device):
        v = Verdict(FAIL, ratio=math.inf)
        v.add("unsupported", f"unsupported: {reason} (a default backend must serve every case on "
              "the CPU and on Hopper GPUs)")
        return v
    return Verdict(UNSUPPORTED, problems=[reason])


def _marker(case: Case, backend: str) -> str | None:
    """In-flight marker of one backend call, in the run's directory (set by the
    plugin's controller). A marker that exists when the call is due means a
    worker died inside that call before: the call is not repeated."""
    run_dir = os.environ.get("HILS_SWA_RUN_DIR")
    if not run_dir or not os.path.isdir(run_dir):
        return None
    h = hashlib.sha1(f"{case.id}|{backend}".encode()).hexdigest()[:20]
    return os.path.join(run_dir, h)


def _documented(v: Verdict, dev, value, st: "CaseState") -> Verdict:
    """A failed verdict in the light of the backend's documented deviation ``dev``
    (``registry.Deviation`` or None): ``deviates`` (reason and the original failure
    kept) when the failure is exactly that deviation (``Deviation.undo``); otherwise
    the verdict stands. A pass stays a pass (whether a deviation shows can depend on
    where the backend's tiles fall)."""
    if dev is None or dev.undo(v, value[0], value[1], st.q, st.k, st.v, dict(st.kw), st.exp) is None:
        return v
    return Verdict(DEVIATES, problems=[f"documented: {dev.why}", *v.problems], kinds=v.kinds, ratio=v.ratio,
                   details=dict(deviation=dev.why))


def _storage_bytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s storage (a view's whole buffer); 0 for tensors without one that
    can be read (the error cases' sparse and nested inputs, a few bytes each)."""
    try:
        return t.untyped_storage().nbytes()
    except (NotImplementedError, RuntimeError):
        return 0


def state_bytes(st: CaseState) -> int:
    """Bytes a cached case state holds in its inputs and their snapshot (the outputs and
    the ground truth are of the outputs' size, small beside a long cache)."""
    ts = [t for t in (st.q, st.k, st.v) if isinstance(t, torch.Tensor)]
    ts += [t for t in (st.snap or ()) if isinstance(t, torch.Tensor)]
    return sum(_storage_bytes(t) for t in ts)


#: The most bytes of inputs (with their snapshots) a runner keeps for case states other
#: than the current one (:meth:`Runner._state`). Session 31: the ``long4m`` cases hold
#: 4-9 GB each (a cache of 4M keys at D = 128, and the snapshot); three of them kept per
#: worker, 14 workers on one H200 ran it out of memory (9eae254).
KEEP_BYTES = 1 << 30

#: A CUDA case whose inputs reach this many bytes (:func:`case_bytes`) is *heavy*: its state
#: lives only while its worker holds one of the GPU's memory slots
#: (``conformance.pinning.MemorySlot``), :data:`SLOT_GPU_BYTES` of device memory each.
#: Session 36: the full tier's ``long4m`` cases (2.2 GB of inputs, 3.4-9.5 GB a worker with
#: the snapshot, the float64 truth's window and the allocator's cached temporaries) on 14
#: workers of one 80 GB H100 ran the card out of memory: 140 checks of ``long4m`` and three
#: of ``reach`` (TileLang's launches) failed, all with CUDA out-of-memory errors (166b7f5).
HEAVY_BYTES = KEEP_BYTES
SLOT_GPU_BYTES = 32 << 30
#: The longest a heavy case waits for a slot before its check fails with a TimeoutError
#: (a backstop: the plugin gives a slot back after its case's last check on a worker).
SLOT_WAIT_S = 900.0


def case_bytes(case: Case) -> int:
    """Bytes of a case's q, k and v in its dtype, before layout padding (which at most
    doubles a tensor's storage: ``cases._store``)."""
    es = case.torch_dtype.itemsize
    return case.B * (case.Hq * case.Lq * case.Dqk + case.Hkv * case.Lk * (case.Dqk + case.Dv)) * es


def _drop(st: "CaseState") -> None:
    """Let an evicted state's tensors go now: inputs, truth, snapshot, outputs, and the
    frames of its stored exceptions (a traceback's frames hold the tensors of the call that
    raised, in a reference cycle that ``del`` does not free)."""
    for out in st.outs.values():
        if out.exc is not None:
            traceback.clear_frames(out.exc.__traceback__)
    st.outs.clear()
    st.q = st.k = st.v = st.exp = st.snap = None


def heavy(case: Case) -> bool:
    """Whether a case needs a memory slot (:data:`HEAVY_BYTES`): CUDA cases only."""
    return case.device.startswith("cuda") and case.error is None and case_bytes(case) >= HEAVY_BYTES


def memory_slots(device: str) -> int:
    """Slots of a GPU: one per :data:`SLOT_GPU_BYTES` of its memory, at least one (an 80 GB
    H100: 2, an H200: 4)."""
    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    return max(1, total // SLOT_GPU_BYTES)


class Runner:
    """Per-process executor with a small LRU of case states: at most ``keep`` of them, and
    past the current one at most :data:`KEEP_BYTES` of inputs (a state evicted for its size
    returns its CUDA memory to the device, where other workers allocate). A heavy case
    (:func:`heavy`) first takes a memory slot of its GPU (:meth:`reserve`), which goes back
    when its state is evicted."""

    def __init__(self, backends: dict[str, Backend], run_seed: int, keep: int = 3):
        self.backends = backends
        self.run_seed = run_seed
        self.keep = keep
        self._cache: OrderedDict[str, CaseState] = OrderedDict()
        self._slot = None  # conformance.pinning.MemorySlot of this process, made on first use
        self._slot_case: str | None = None  # the id of the heavy case whose state holds it

    @property
    def slot_case(self) -> str | None:
        """The id of the heavy case whose state holds this process's memory slot, or None."""
        return self._slot_case

    def _evict(self, keep_one: bool = True) -> None:
        sizes = {cid: state_bytes(s) for cid, s in self._cache.items()}
        freed_cuda = False
        while len(self._cache) > int(keep_one) and (
                not keep_one or len(self._cache) > self.keep
                or sum(sizes.values()) - sizes[next(reversed(self._cache))] > KEEP_BYTES):
            cid, old = self._cache.popitem(last=False)
            big = sizes.pop(cid) > KEEP_BYTES and isinstance(old.q, torch.Tensor) and old.q.is_cuda
            if big or cid == self._slot_case:
                _drop(old)
                freed_cuda = True
            del old
        if freed_cuda:
            gc.collect()  # what a stored exception's frames still reached (_drop cleared them)
            torch.cuda.empty_cache()
        if self._slot_case is not None and self._slot_case not in self._cache:
            self._release_slot()

    def _release_slot(self) -> None:
        """Give the memory slot back, after the cache is emptied: the memory is the device's
        again when another worker takes it."""
        self._slot.release()
        self._slot_case = None

    def release(self) -> None:
        """Drop every cached state and give back this process's memory slot, if it holds one
        (the plugin calls it after a heavy case's last check on this worker: a worker keeps
        its process, and with it an unreleased slot, until the whole run ends)."""
        if self._slot_case is not None:
            self._evict(keep_one=False)

    def reserve(self, case: Case) -> None:
        """Before a check of ``case`` (outside its watchdog: the wait is not a hang): for a
        heavy case whose state (or slot) this runner does not hold, let every cached state go (the
        slot this process may hold with them) and wait for one of the GPU's memory slots."""
        from .pinning import MemorySlot

        if not heavy(case) or case.id in self._cache or self._slot_case == case.id:
            return
        self._evict(keep_one=False)
        if self._slot is None:
            self._slot = MemorySlot(memory_slots(case.device))
        self._slot.acquire(timeout=SLOT_WAIT_S)
        self._slot_case = case.id

    def _state(self, case: Case) -> CaseState:
        st = self._cache.get(case.id)
        if st is None:
            self.reserve(case)  # a heavy case whose caller skipped reserve(): wait here
            st = CaseState(case)
            try:
                st.q, st.k, st.v, st.kw = make_inputs(case, self.run_seed)
                if case.error is None:
                    st.exp = expected(st.q, st.k, st.v, st.kw)
                    st.snap = input_snapshot(st.q, st.k, st.v)
            except BaseException as e:
                if self._slot_case == case.id:  # a heavy build that failed: its slot goes back
                    _drop(st)
                    traceback.clear_frames(e.__traceback__)  # the partial tensors of its frames
                    del st
                    gc.collect()
                    torch.cuda.empty_cache()
                    self._release_slot()
                raise
            if self._slot_case == case.id:  # heavy: the temporaries of its inputs and truth, GBs
                torch.cuda.empty_cache()
            self._cache[case.id] = st
            self._evict()
        else:
            self._cache.move_to_end(case.id)
        return st

    def _run_one(self, st: CaseState, name: str) -> _Out:
        if name in st.outs:
            return st.outs[name]
        be = self.backends[name]
        case = st.case
        out = _Out()
        ok, reason = be.supports(case)
        if not ok:
            out.verdict = _unsupported(be, st.q.device, reason or "not supported")
            st.outs[name] = out
            return out
        if case.error is None:
            _poison_allocator(case, st.q.device)
        marker = _marker(case, name)
        if marker is not None and os.path.exists(marker):
            v = Verdict(FAIL, ratio=math.inf)
            v.add("crash", "crash: a worker died (hang past --check-timeout, abort or segfault) during "
                  "this very call earlier in the run; not called again")
            out.verdict = v
            st.outs[name] = out
            return out
        if marker is not None:
            open(marker, "w").close()  # left behind only if this process dies in the call
        try:
            with poisoned_empty():
                out.value = be.fn(st.q, st.k, st.v, **dict(st.kw))
            if isinstance(out.value, (tuple, list)) and len(out.value) == 2:
                out.value = tuple(out.value)
                if st.q.device.type == "cuda":
                    torch.cuda.synchronize(st.q.device)
        except UnsupportedConfig as e:
            if case.error is None:
                out.verdict = _unsupported(be, st.q.device, f"{type(e).__name__}: {e}")
            else:
                out.exc = e
        except Exception as e:  # noqa: BLE001 - every failure is a verdict
            out.exc = e
            tb = traceback.extract_tb(e.__traceback__)
            out.where = f"{tb[-1].filename}:{tb[-1].lineno}" if tb else ""
        if marker is not None:
            os.remove(marker)
        if out.verdict is None:
            if case.error is not None:
                desc, tokens = ERROR_RULES[case.error]
                out.verdict = judge_error(out.exc, f"{case.error}: {desc}", tokens)
            elif out.exc is not None:
                v = Verdict(FAIL, ratio=math.inf)
                v.add("crash", f"crash: {type(out.exc).__name__}: {str(out.exc)[:300]}"
                      f" (at {out.where or '?'})")
                out.verdict = v
            elif not isinstance(out.value, tuple):
                v = Verdict(FAIL, ratio=math.inf)
                v.add("return", f"return: expected a tuple (o, lse), got {type(out.value).__name__}")
                out.verdict = v
            else:
                out.verdict = judge(out.value[0], out.value[1], st.exp)
            out.verdict = _documented(out.verdict, be.deviation(case) if be.deviation else None,
                                      out.value, st)
        if st.snap is not None:
            changed = restore_modified(st.q, st.k, st.v, st.snap)
            if changed:
                if out.verdict.status != FAIL:
                    out.verdict = Verdict(FAIL, ratio=math.inf)
                out.verdict.add("input", f"input: the backend modified {', '.join(changed)} in place "
                                f"(restored for the next backend)")
        st.outs[name] = out
        return out

    def run(self, check: Check) -> Result:
        import time

        t0 = time.perf_counter()
        st = self._state(check.case)
        if not check.is_pair:
            out = self._run_one(st, check.backends[0])
            return Result(check, out.verdict, time.perf_counter() - t0)
        a, b = check.backends
        oa, ob = self._run_one(st, a), self._run_one(st, b)
        va, vb = oa.verdict, ob.verdict
        # outputs to compare wherever both calls returned (a failing member's pair still
        # measures |a - b|); an error case's value is the exception
        both = (isinstance(oa.value, tuple) and isinstance(ob.value, tuple) and st.exp is not None)
        v = judge_pair(va, vb, oa.value if both else None, ob.value if both else None,
                       st.exp if both else None, a, b)
        return Result(check, v, time.perf_counter() - t0)
