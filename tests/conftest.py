"""Fixtures for the tests under ``tests/`` (the repo-root ``conftest.py`` pins devices
and loads the conformance plugin first)."""

import sys

import pytest


@pytest.fixture(autouse=True)
def _fresh_tilelang_plans():
    """TileLang's launch plans are cached by problem (``tilelang_impl.launch._plan``), not by
    the planning tables and functions these tests patch: every test starts and ends without
    any (``launch.clear_plans``). The conformance cases patch none of them (only the SM
    count, which is in the key), so they run without this and reuse plans across cases."""
    mod = sys.modules.get("tilelang_impl.launch")
    if mod is not None:
        mod.clear_plans()
    yield
    mod = sys.modules.get("tilelang_impl.launch")
    if mod is not None:
        mod.clear_plans()


@pytest.fixture
def gpu_memory_lock():
    """For GPU tests that hold tens of GB (caches past 2**31 elements or 2**26 keys): at most
    one of them runs at a time per GPU, however many xdist workers share it, and each gives
    its memory back to the device (``torch.cuda.empty_cache``) before the next starts, a
    failed test's too (pytest keeps a failure's traceback, and with it the test's tensors,
    in ``sys.last_traceback``: dropped first). Session 33: ``pytest -m gpu -n 8`` on an 80 GB
    H100 ran three of TileLang's wide tests (32 GB each) and Triton's int64-offset test at
    once and four failed out of memory; run one at a time they passed. An exclusive
    ``flock`` on a file named by the worker's ``CUDA_VISIBLE_DEVICES`` (``conformance.pinning``
    gives each worker of a multi-GPU host its own GPU; on one GPU every worker shares the
    lock; ``conformance.pinning.memory_lock_path``). Yields the lock file's path."""
    import gc
    import os

    import torch

    from conformance.pinning import memory_lock_path

    try:
        import fcntl
    except ImportError:  # not POSIX: no CUDA host this suite runs on
        fcntl = None
    path = memory_lock_path()  # conformance.pinning: the file the GPU's processes share
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)  # flock needs no write access
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        for name in ("last_type", "last_value", "last_traceback", "last_exc"):
            if hasattr(sys, name):
                setattr(sys, name, None)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        os.close(fd)  # releases the flock
