"""Pin pytest-xdist workers to GPUs, and choose the Triton interpreter without one.

Imported by the repo-root ``conftest.py`` (and ``conformance.plugin``) before
anything imports ``torch``: this module imports neither torch nor triton and
never initialises CUDA.

- The controller (no ``PYTEST_XDIST_WORKER``) decides the GPU list once, from
  ``CUDA_VISIBLE_DEVICES`` when set, else from ``nvidia-smi -L``, and hands it
  to the workers it spawns through the environment variable ``HILS_SWA_GPUS``
  (comma-separated; ``""`` = no GPU).
- A worker ``gwN`` sets ``CUDA_VISIBLE_DEVICES`` to entry ``N % len(gpus)``, so
  each worker sees exactly one GPU as ``cuda:0``.
- With no GPU, ``TRITON_INTERPRET=1`` is set (Triton reads it when a kernel is
  decorated, i.e. at ``import triton_impl``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Mapping, MutableMapping

GPUS_VAR = "HILS_SWA_GPUS"
PINNED_VAR = "HILS_SWA_PINNED"

__all__ = ["gpu_list", "worker_index", "pin", "apply", "GPUS_VAR", "memory_lock_path", "MemorySlot"]


def _nvidia_smi_indices() -> list[str]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [m.group(1) for m in re.finditer(r"^GPU (\d+):", out, flags=re.M)]


def gpu_list(env: Mapping[str, str] | None = None, query=_nvidia_smi_indices) -> list[str]:
    """The GPUs this run may use, as ``CUDA_VISIBLE_DEVICES`` entries.

    ``HILS_SWA_GPUS`` (set by the controller) wins; then ``CUDA_VISIBLE_DEVICES``
    (indices or UUIDs; an empty value or ``-1`` means none); then ``query()``
    (``nvidia-smi -L`` indices).
    """
    env = os.environ if env is None else env
    for var in (GPUS_VAR, "CUDA_VISIBLE_DEVICES"):
        if var in env:
            items = [x.strip() for x in env[var].split(",") if x.strip()]
            if var == "CUDA_VISIBLE_DEVICES" and items and items[0].startswith("-"):
                return []  # "-1": CUDA hidden
            return items
    return list(query())


def worker_index(env: Mapping[str, str] | None = None) -> int | None:
    """``N`` of the xdist worker ``gwN``; ``None`` in the controller or without xdist."""
    env = os.environ if env is None else env
    m = re.fullmatch(r"gw(\d+)", env.get("PYTEST_XDIST_WORKER", ""))
    return int(m.group(1)) if m else None


def pin(env: MutableMapping[str, str], query=_nvidia_smi_indices) -> list[str]:
    """Apply the policy to ``env`` (``os.environ`` or a dict in tests).

    Returns the GPU list. Idempotent. In a worker, ``CUDA_VISIBLE_DEVICES``
    becomes one entry of the list; in the controller the list is recorded in
    ``HILS_SWA_GPUS`` for the workers. Without GPUs ``TRITON_INTERPRET=1``.
    """
    if PINNED_VAR in env and GPUS_VAR in env and worker_index(env) is None:
        gpus = [x for x in env[GPUS_VAR].split(",") if x]
    else:
        gpus = gpu_list(env, query)
    idx = worker_index(env)
    if idx is not None and gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[idx % len(gpus)]
    else:
        env[GPUS_VAR] = ",".join(gpus)
    if not gpus:
        env.setdefault("TRITON_INTERPRET", "1")
    env[PINNED_VAR] = "1"
    return gpus


def apply() -> list[str]:
    """``pin(os.environ)``; call before anything imports torch."""
    return pin(os.environ)


def memory_lock_path(slot: int | None = None, env: Mapping[str, str] | None = None) -> str:
    """A lock file shared by the processes of one GPU (named by ``CUDA_VISIBLE_DEVICES``:
    :func:`pin` gives each worker of a multi-GPU host its own GPU; on one GPU every worker
    shares the file). ``slot=None``: the exclusive lock of the tests' ``gpu_memory_lock``
    fixture; ``slot=i``: the ``i``-th of the conformance runner's memory slots
    (:class:`MemorySlot`). Named by the variable's text, not the device: a run without xdist
    and with the variable unset (``all``) and xdist workers (``0``) on the same GPU name
    different files, and the fixture's lock and the slots are separate files, so two such
    runs at once on one GPU do not wait for each other."""
    import tempfile

    env = os.environ if env is None else env
    gpus = re.sub(r"[^\w.-]", "_", env.get("CUDA_VISIBLE_DEVICES", "all")) or "none"
    tail = "" if slot is None else f".slot{slot}"
    return os.path.join(tempfile.gettempdir(), f"hils-swa-gpu-memory-{gpus}{tail}.lock")


class MemorySlot:
    """One of ``slots`` per-GPU memory slots, held by at most one process at a time (an
    exclusive ``flock`` on :func:`memory_lock_path` ``(i)``): at most ``slots`` memory-heavy
    cases are alive on one GPU however many xdist workers share it. :meth:`acquire` blocks,
    polling every ``poll`` seconds, until a slot is free; :meth:`release` gives it back (so
    does the process's exit). Not reentrant: a process holds at most one slot."""

    def __init__(self, slots: int, poll: float = 0.2, env: Mapping[str, str] | None = None):
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.slots, self.poll, self._env = slots, poll, env
        self._fd: int | None = None
        self.index: int | None = None  # the slot held, None when none

    def acquire(self, timeout: float | None = None) -> int:
        """Take a free slot (waiting for one, at most ``timeout`` seconds when given: then
        ``TimeoutError``); returns its index."""
        import fcntl
        import time

        if self._fd is not None:
            raise RuntimeError(f"this process holds slot {self.index} already")
        t0 = time.monotonic()
        while True:
            for i in range(self.slots):
                fd = os.open(memory_lock_path(i, self._env), os.O_RDONLY | os.O_CREAT, 0o666)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._fd, self.index = fd, i
                return i
            if timeout is not None and time.monotonic() - t0 >= timeout:
                raise TimeoutError(
                    f"waited {timeout:g} s for one of {self.slots} GPU memory slots "
                    f"({memory_lock_path(0, self._env)} ...): each is held by another process")
            time.sleep(self.poll)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops its flock
            self._fd = self.index = None
