"""The GPU memory lock that GPU tests rely on (``conformance.gpu_lock``, loaded by the repo-root
``conftest.py``), checked on the CPU. The inner pytest sessions below run with a copy of the
root ``conftest.py``, so they check the wiring the suite itself has."""

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
    pytester.makeconftest((request.config.rootpath / "conftest.py").read_text())
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

TRY = ("import fcntl, sys; f = open(sys.argv[1], 'a'); "
       "fcntl.flock(f, getattr(fcntl, sys.argv[2]) | fcntl.LOCK_NB)")


def can_lock(mode):
    return subprocess.run([sys.executable, "-c", TRY, memory_lock_path(), mode]).returncode == 0


def test_first_plain():
    import torch  # noqa: F401  (the lock's fixture imports it: loaded here, so the gpu
    # test below would start within the outer test's wait if nothing held it back)
    assert can_lock("LOCK_EX")
    pathlib.Path("started").write_text("")


@pytest.mark.gpu
def test_then_gpu():
    pathlib.Path("gpu_ran").write_text("")
    assert not can_lock("LOCK_EX") and can_lock("LOCK_SH")


@pytest.mark.gpu
def test_then_heavy(gpu_memory_lock):
    assert gpu_memory_lock == memory_lock_path()
    assert not can_lock("LOCK_SH")


def test_last_plain():
    assert can_lock("LOCK_EX")
'''


def test_gpu_tests_hold_the_memory_lock_shared_behind_a_waiting_heavy_test(pytester, request,
                                                                           monkeypatch):
    """A test marked ``gpu`` without ``gpu_memory_lock`` holds the lock shared: another
    process can share it but not take it exclusively (a heavy test waits); a heavy test holds
    it alone; tests without the mark hold nothing. While a heavy test waits for the lock (it
    holds the gate file), a ``gpu`` test does not start: two seconds after the test before it,
    the inner session is still running, its gpu test has not run and nothing holds the lock;
    the test runs once the gate is let go. The inner session's lock files are its own
    (``TMPDIR``), so other workers' locks cannot touch it, nor it theirs."""
    import fcntl
    import time

    from conformance.pinning import memory_lock_path

    pytester.makeconftest((request.config.rootpath / "conftest.py").read_text())
    pytester.makepyfile(test_inner=_SHARED)
    monkeypatch.setenv("TMPDIR", str(pytester.path))  # the inner session's tempfile dir
    lock = str(pytester.path / os.path.basename(memory_lock_path()))
    gate = os.open(lock + ".gate", os.O_RDONLY | os.O_CREAT, 0o666)
    proc = None
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        # -p no:xdist: the root conftest loads without xdist too (conformance.plugin's xdist
        # hooks are optional)
        proc = pytester.popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                               "-p", "no:randomly", "-p", "no:xdist", "test_inner.py"],
                              stdin=subprocess.DEVNULL)
        started, ran = pytester.path / "started", pytester.path / "gpu_ran"
        for _ in range(1200):
            if started.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert started.exists(), "the inner session did not reach its first test"
        time.sleep(2.0)
        assert proc.poll() is None, "the inner session ended while the gate was held"
        assert not ran.exists(), "a gpu test started while a heavy test held the gate"
        probe = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o666)
        try:  # nobody holds the lock: the gpu test waits at the gate, not after it
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(probe)
        fcntl.flock(gate, fcntl.LOCK_UN)
        out, err = proc.communicate(timeout=300)
    finally:
        os.close(gate)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert ran.exists()
    assert proc.returncode == 0, (out or b"").decode()[-3000:] + (err or b"").decode()[-2000:]
    assert re.search(rb"\b4 passed\b", out), out.decode()[-3000:]
