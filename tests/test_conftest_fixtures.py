"""The fixtures of ``tests/conftest.py`` that GPU tests rely on, checked on the CPU."""

import os
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
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "-") or "none"
    assert os.path.basename(gpu_memory_lock) == f"hils-swa-gpu-memory-{gpus}.lock"
