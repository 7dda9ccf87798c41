"""The fixtures of ``tests/conftest.py`` that GPU tests rely on, checked on the CPU."""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("fcntl", reason="the lock is a POSIX flock")

_TRY = "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)"


def test_gpu_memory_lock_excludes_other_processes(gpu_memory_lock):
    """While a test holds ``gpu_memory_lock``, another process (another xdist worker on the
    same GPU) cannot take it; the lock file is named by the worker's visible GPUs."""
    held = subprocess.run([sys.executable, "-c", _TRY, gpu_memory_lock], capture_output=True)
    assert held.returncode != 0 and b"BlockingIOError" in held.stderr
    gpus = re.sub(r"[^\w.-]", "_", os.environ.get("CUDA_VISIBLE_DEVICES", "all")) or "none"
    assert os.path.basename(gpu_memory_lock) == f"hils-swa-gpu-memory-{gpus}.lock"


pytest_plugins = ["pytester"]

_INNER = '''
import weakref

REFS = []


class Held:
    pass


def test_fails_holding_memory(gpu_memory_lock):
    held = Held()  # stands in for a failed test's CUDA tensors
    REFS.append(weakref.ref(held))
    assert held is None


def test_its_memory_was_let_go():
    assert REFS[0]() is None, "the failed test's objects outlived its lock"
'''


def test_gpu_memory_lock_lets_a_failed_test_s_objects_go(pytester, request):
    """A failed test's locals stay reachable from ``sys.last_traceback`` after it; the
    fixture drops them before it empties the CUDA cache and releases the lock, so the next
    memory-heavy test does not meet the failed one's tensors (with that step taken out of
    the fixture, the inner session's second test fails)."""
    pytester.makeconftest((request.config.rootpath / "tests" / "conftest.py").read_text())
    pytester.makepyfile(test_inner=_INNER)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    res.assert_outcomes(failed=1, passed=1)
