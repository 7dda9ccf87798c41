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


_SHARED = '''
import fcntl
import pathlib
import subprocess
import sys

import pytest

from conformance.pinning import memory_lock_path

TRY = ("import fcntl, sys; f = open(sys.argv[1]); "
       "fcntl.flock(f, getattr(fcntl, sys.argv[2]) | fcntl.LOCK_NB)")


def can_lock(mode):
    return subprocess.run([sys.executable, "-c", TRY, memory_lock_path(), mode]).returncode == 0


def test_first_plain():
    pathlib.Path("started").write_text("")
    assert can_lock("LOCK_EX")


@pytest.mark.gpu
def test_then_gpu():
    pathlib.Path("gpu_ran").write_text("")
    assert not can_lock("LOCK_EX") and can_lock("LOCK_SH")


def test_last_plain():
    assert can_lock("LOCK_EX")
'''


def test_gpu_tests_hold_the_memory_lock_shared_behind_a_waiting_heavy_test(pytester, request):
    """A test marked ``gpu`` without ``gpu_memory_lock`` holds the lock shared: another
    process can share it but not take it exclusively (a heavy test waits), and tests without
    the mark hold nothing. While a heavy test waits for the lock (it holds the gate file),
    a ``gpu`` test does not start: the inner session's gpu test has not run a second after
    the test before it, and runs once the gate is let go."""
    import fcntl
    import time

    from conformance.pinning import memory_lock_path

    pytester.makeconftest((request.config.rootpath / "tests" / "conftest.py").read_text())
    pytester.makepyfile(test_inner=_SHARED)
    gate = os.open(memory_lock_path() + ".gate", os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        proc = pytester.popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                               "-p", "no:randomly", "-p", "no:xdist", "test_inner.py"],
                              stdin=subprocess.DEVNULL)
        started, ran = pytester.path / "started", pytester.path / "gpu_ran"
        for _ in range(1200):
            if started.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert started.exists(), "the inner session did not reach its first test"
        time.sleep(1.0)
        assert not ran.exists(), "a gpu test started while a heavy test held the gate"
        fcntl.flock(gate, fcntl.LOCK_UN)
        out, err = proc.communicate(timeout=300)
    finally:
        os.close(gate)
    assert ran.exists()
    assert proc.returncode == 0, (out or b"").decode()[-3000:] + (err or b"").decode()[-2000:]
    assert re.search(rb"\b3 passed\b", out), out.decode()[-3000:]
