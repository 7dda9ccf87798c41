"""The GPU memory lock of the test suite: a pytest plugin, loaded by the repo-root
``conftest.py`` (``pytest_plugins``), so it covers ``tests/`` and ``conformance/`` alike.

- ``gpu_memory_lock``: a fixture for tests that hold tens of GB; each runs alone on its GPU.
- ``_gpu_tests_share_the_memory_lock``: autouse; every other test marked ``gpu`` holds the
  lock shared, so a memory-heavy test never runs beside it. Tests without the mark (the
  conformance cases among them) take nothing.

The lock is a ``flock`` on ``conformance.pinning.memory_lock_path()``, one file per GPU.
"""

import contextlib
import sys

import pytest


#: How many times this process holds the GPU's memory lock (0 or 1: see _memory_lock).
_HELD = [0]


@contextlib.contextmanager
def _memory_lock(shared: bool):
    """Hold the GPU's memory lock (``conformance.pinning.memory_lock_path``), shared or
    exclusive, then give the holder's memory back before releasing it: a failed test's
    traceback (``sys.last_traceback`` keeps its tensors alive) is dropped, the CUDA cache
    emptied. An exclusive request waits at a gate file while it waits for the lock, so
    shared holders arriving after it queue behind it instead of starving it (``flock``
    alone does not order waiters). The files are closed, releasing both, even when the
    clean-up raises (a sticky CUDA error in ``synchronize``): a lock left held would stop
    every GPU test after it. A process asking again while it holds the lock gets an error,
    not a wait that never ends (flock locks belong to an open file, so its own shared hold
    would block its exclusive request): a test that takes ``gpu_memory_lock`` through
    ``request.getfixturevalue`` must name it as an argument instead."""
    import gc
    import os

    import torch

    from conformance.pinning import memory_lock_path

    try:
        import fcntl
    except ImportError:  # not POSIX: no CUDA host this suite runs on
        fcntl = None
    if _HELD[0]:
        raise RuntimeError("this process already holds the GPU memory lock: take "
                           "gpu_memory_lock as a test argument, not through getfixturevalue")
    path = memory_lock_path()  # conformance.pinning: the file the GPU's processes share
    gate = os.open(path + ".gate", os.O_RDONLY | os.O_CREAT, 0o666)  # flock needs no write
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
        try:
            if fcntl is not None:
                fcntl.flock(gate, fcntl.LOCK_EX)
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
                finally:
                    fcntl.flock(gate, fcntl.LOCK_UN)
            _HELD[0] = 1
            try:
                yield path
            finally:
                _HELD[0] = 0
                for name in ("last_type", "last_value", "last_traceback", "last_exc"):
                    if hasattr(sys, name):
                        setattr(sys, name, None)
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
        finally:
            os.close(fd)  # releases the flock
    finally:
        os.close(gate)


@pytest.fixture
def gpu_memory_lock():
    """For GPU tests that hold tens of GB (caches past 2**31 elements or 2**26 keys): each
    runs alone on its GPU, however many xdist workers share it, and gives its memory back to
    the device (``torch.cuda.empty_cache``) before the next test starts, a failed test's
    too (pytest keeps a failure's traceback, and with it the test's tensors, in
    ``sys.last_traceback``: dropped first). An exclusive ``flock`` on a file named by the
    worker's ``CUDA_VISIBLE_DEVICES`` (``conformance.pinning`` gives each worker of a
    multi-GPU host its own GPU; on one GPU every worker shares the lock;
    ``conformance.pinning.memory_lock_path``); every other test marked ``gpu``, under
    ``tests/`` and ``conformance/`` alike, holds it shared
    (``_gpu_tests_share_the_memory_lock``). Session 33: ``pytest -m gpu -n 8`` on an 80 GB
    H100 ran three of TileLang's wide tests (32 GB each) and Triton's int64-offset test at
    once and four failed out of memory: hence the lock. Session 51: with only those tests
    excluding each other, a light test (``test_tma_prefill_path_choice_and_graph_replay``)
    ran out of memory beside the int64-offset test (65 GB) and seven workers' caches:
    hence the shared holders, which empty their caches before they let it go. Session 52
    moved the mechanism from ``tests/conftest.py`` to this plugin, which the repo-root
    ``conftest.py`` loads, so the two ``gpu`` tests of ``conformance/`` hold it too. Yields
    the lock file's path."""
    with _memory_lock(shared=False) as path:
        yield path


@pytest.fixture(autouse=True)
def _gpu_tests_share_the_memory_lock(request):
    """Tests marked ``gpu`` that do not take ``gpu_memory_lock`` hold its lock shared, so a
    memory-heavy test never runs beside them (and they empty their CUDA cache before they
    release it). Other tests take nothing."""
    if request.node.get_closest_marker("gpu") is None or "gpu_memory_lock" in request.fixturenames:
        yield
        return
    with _memory_lock(shared=True):
        yield
