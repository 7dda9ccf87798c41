"""GPU pinning of xdist workers (issue 7), tested on CPU with fake GPU lists."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import pinning

ROOT = Path(__file__).resolve().parents[1]


def _none():
    return []


def test_controller_records_the_list_for_workers():
    env = {}
    gpus = pinning.pin(env, query=lambda: ["0", "1", "2", "3"])
    assert gpus == ["0", "1", "2", "3"]
    assert env[pinning.GPUS_VAR] == "0,1,2,3"
    assert "CUDA_VISIBLE_DEVICES" not in env and "TRITON_INTERPRET" not in env


def test_workers_get_one_gpu_each_round_robin():
    seen = []
    for w in range(6):
        env = {pinning.GPUS_VAR: "0,1,2,3", "PYTEST_XDIST_WORKER": f"gw{w}"}
        pinning.pin(env, query=_none)
        seen.append(env["CUDA_VISIBLE_DEVICES"])
    assert seen == ["0", "1", "2", "3", "0", "1"]


def test_cuda_visible_devices_restricts_the_list():
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}
    assert pinning.pin(env, query=lambda: ["0", "1", "2"]) == ["GPU-aaaa", "GPU-bbbb"]
    worker = dict(env, PYTEST_XDIST_WORKER="gw1")
    pinning.pin(worker, query=_none)
    assert worker["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb"


def test_no_gpu_means_triton_interpreter():
    for env in ({}, {"CUDA_VISIBLE_DEVICES": ""}, {"CUDA_VISIBLE_DEVICES": "-1"}):
        assert pinning.pin(env, query=_none) == []
        assert env["TRITON_INTERPRET"] == "1" and env[pinning.GPUS_VAR] == ""
    worker = {pinning.GPUS_VAR: "", "PYTEST_XDIST_WORKER": "gw3"}
    pinning.pin(worker, query=lambda: ["0"])  # the controller's empty list wins
    assert "CUDA_VISIBLE_DEVICES" not in worker and worker["TRITON_INTERPRET"] == "1"


def test_idempotent_and_controller_queries_once():
    calls = []

    def query():
        calls.append(1)
        return ["0", "1"]

    env = {}
    pinning.pin(env, query=query)
    pinning.pin(env, query=query)
    assert len(calls) == 1 and env[pinning.GPUS_VAR] == "0,1"


def test_worker_index():
    assert pinning.worker_index({"PYTEST_XDIST_WORKER": "gw12"}) == 12
    assert pinning.worker_index({}) is None
    assert pinning.worker_index({"PYTEST_XDIST_WORKER": "master"}) is None


def test_xdist_workers_pinned_end_to_end(tmp_path):
    """Two real xdist workers with a fake two-GPU list: each records its own
    CUDA_VISIBLE_DEVICES in the JSON report (torch never sees a GPU here)."""
    out = tmp_path / "r.json"
    env = dict(os.environ)
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", pinning.PINNED_VAR, "CUDA_VISIBLE_DEVICES"):
        env.pop(var, None)
    env[pinning.GPUS_VAR] = "7,9"
    env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "conformance" / "test_conformance.py"), "-q",
           "-p", "no:cacheprovider", "-n", "2", "--device", "cpu", "--backend", "reference",
           "--only", "basic,errors", "--seed", "11", "--conform-json", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads(out.read_text())
    workers = data["workers"]
    assert data["run_seed"] == 11 and data["failed"] == 0
    assert {w["cuda_visible_devices"] for w in workers.values()} <= {"7", "9"}
    for name, w in workers.items():
        assert w["cuda_visible_devices"] == ["7", "9"][int(name[2:]) % 2]


def test_gpu_tests_here_share_the_memory_lock(request):
    """The memory lock's autouse fixture reaches the tests under ``conformance/`` too (the
    repo-root ``conftest.py`` loads ``conformance.gpu_lock``): its ``gpu`` tests hold the lock
    shared, so a memory-heavy test of ``tests/`` never runs beside them."""
    assert "_gpu_tests_share_the_memory_lock" in request.fixturenames
    assert request.config.pluginmanager.has_plugin("conformance.gpu_lock")


@pytest.mark.gpu
def test_worker_info_names_the_gpu():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from conformance.plugin import worker_info

    info = worker_info()
    assert info["device"] != "cpu" and info["pci_bus_id"], info


def test_watchdog_turns_a_hang_into_one_failed_check(tmp_path):
    """A backend that hangs: its worker dies after --check-timeout, the check
    fails as a crash, the pair checks of that case do not call it again, and
    the run completes."""
    out = tmp_path / "r.json"
    env = dict(os.environ)
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", pinning.PINNED_VAR, "HILS_SWA_RUN_DIR"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "tools.cli", "conform", "--device", "cpu", "--backend", "reference",
           "--backend", "conformance._testing:hangs_on_63", "--only", "bf16-B1-H2x1-q63k129-D64x64-W32C16-lmk1exp1-kv0-bhld", "-n", "2",
           "--check-timeout", "4", "--json", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads(out.read_text())
    by = {r["who"]: r for r in data["results"]}
    assert by["reference"]["status"] == "pass"
    hang = by["conformance._testing:hangs_on_63"]
    assert hang["status"] == "fail" and hang["kinds"] == ["crash"]
    assert by["reference~conformance._testing:hangs_on_63"]["status"] == "fail"
    assert data["checks"] == 3


_TAKE = """
import os, sys, time
from conformance.pinning import MemorySlot
s = MemorySlot(int(sys.argv[1]), poll=0.05)
t = time.monotonic()
print(s.acquire(), round(time.monotonic() - t, 2), flush=True)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="the slots are POSIX flocks")
def test_memory_slots_admit_as_many_processes_as_there_are_slots(monkeypatch, tmp_path):
    """``MemorySlot``: with this process holding slot 0 of two, another process gets slot 1
    at once; with one slot it waits until the holder lets go (the runner's heavy cases,
    ``runner.Runner.reserve``), or fails after its time limit. Slots are per GPU: another
    ``CUDA_VISIBLE_DEVICES`` has its own."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the lock files: here, not in /tmp
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"slot-test-{os.getpid()}")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    mine = pinning.MemorySlot(2)
    assert mine.acquire() == 0 and mine.index == 0
    with pytest.raises(RuntimeError, match="holds slot 0"):
        mine.acquire()
    other = subprocess.run([sys.executable, "-c", _TAKE, "2"], env=env, capture_output=True,
                           text=True, timeout=60)
    assert other.returncode == 0 and other.stdout.split()[0] == "1", other.stderr
    waiter = subprocess.Popen([sys.executable, "-c", _TAKE, "1"], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            waiter.wait(timeout=1.5)  # slot 0 of one is ours: it waits
        mine.release()
        out, _ = waiter.communicate(timeout=60)
    finally:
        waiter.kill()
    idx, waited = out.split()
    assert idx == "0" and float(waited) >= 1.0
    assert mine.acquire() == 0
    late = subprocess.run([sys.executable, "-c", _TAKE.replace("s.acquire()", "s.acquire(timeout=0.5)"), "1"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert late.returncode != 0 and "TimeoutError: waited 0.5 s for one of 1 GPU memory slots" in late.stderr
    mine.release()
    elsewhere = dict(env, CUDA_VISIBLE_DEVICES=f"slot-test-other-{os.getpid()}")
    assert mine.acquire() == 0
    try:
        free = subprocess.run([sys.executable, "-c", _TAKE, "1"], env=elsewhere,
                              capture_output=True, text=True, timeout=60)
        assert free.returncode == 0 and free.stdout.split()[0] == "0"
    finally:
        mine.release()
    with pytest.raises(ValueError, match="at least 1"):
        pinning.MemorySlot(0)


_SLOTPLUG = '''
def pytest_configure(config):  # after the repo's conftest has pinned the devices
    import conformance.runner as R

    R.heavy = lambda case: case.error is None  # every case holds the one slot while it lives
    R.memory_slots = lambda device: 1
    R.SLOT_WAIT_S = 20.0  # a regression fails in seconds instead of hanging the run
'''


@pytest.mark.skipif(sys.platform == "win32", reason="the slots are POSIX flocks")
def test_a_worker_gives_its_slot_back_after_its_heavy_case_s_last_check(tmp_path):
    """xdist keeps a worker's process until the whole run ends, so a worker whose last check
    was a heavy case would keep its memory slot, and a worker waiting for it would wait until
    the run's end (session 36's review: a deadlock on the GPU tier). The plugin gives the slot
    back after a heavy case's last check on its worker. Here every case is heavy and there is
    one slot, two workers, three kernel groups (without that hook the run fails on the wait's
    time limit)."""
    (tmp_path / "slotplug.py").write_text(_SLOTPLUG)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", TMPDIR=str(tmp_path))
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", pinning.PINNED_VAR, "HILS_SWA_RUN_DIR"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "pytest", "conformance/test_conformance.py", "-p", "slotplug", "-n", "2",
           "--device", "cpu", "--backend", "reference", "--only", "basic", "-q", "-p", "no:cacheprovider",
           "-p", "no:randomly"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "6 passed" in p.stdout, p.stdout[-3000:] + p.stderr[-2000:]
