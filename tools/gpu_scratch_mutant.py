"""The split-KV scratch's concurrency tests against one buffer per device (GPU).

    python tools/gpu_scratch_mutant.py

Runs the concurrency tests of ``tests/test_split_scratch_gpu.py`` (two streams released
together; two graphs replayed together; two threads on one stream; the scratch helper's
own) twice in one process: as shipped, where every one must pass, then with
``reference.device`` keying its cache by device alone (``_stream_key``: one key per
device, never "capturing"; ``_thread``: one thread), the scheme of Triton's workspace
before session 22, where every one must fail by an assertion (a wrong result, a shared
buffer), not by an error or a failed premise of the harness (those go through
``pytest.fail``). Exit status 0 when both hold, 1 otherwise, 2 without CUDA. The thread
part of the key alone (``_thread`` only, the code before e7ba038) is caught on the CPU
tier: ``tests/test_device_scratch.py``, ``tests/test_triton_swa.py``.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from reference import device as D  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SELECT = "concurrent or per_stream or threads"
ARGS = ["-q", "-p", "no:cacheprovider", "-n", "0", os.path.join(ROOT, "tests", "test_split_scratch_gpu.py"),
        "-k", SELECT]


class _Outcomes:
    """Per test id: ``"passed"``, ``"assert: <message>"`` (failed by an assertion) or
    ``"<phase> <outcome>: <message>"`` (anything else: an error, a skip)."""

    def __init__(self):
        self.seen: dict[str, str] = {}

    def pytest_runtest_logreport(self, report):
        crash = getattr(report.longrepr, "reprcrash", None)
        msg = (getattr(crash, "message", "") or str(report.longrepr or "")).splitlines()[:1]
        msg = msg[0][:160] if msg else ""
        if report.when == "call" and report.passed:
            self.seen.setdefault(report.nodeid, "passed")
        elif report.when == "call" and report.failed and msg.startswith(("AssertionError", "assert ")):
            self.seen[report.nodeid] = f"assert: {msg}"
        elif report.failed or report.skipped:
            self.seen[report.nodeid] = f"{report.when} {report.outcome}: {msg}"


def _run() -> dict[str, str]:
    out = _Outcomes()
    pytest.main(ARGS, plugins=[out])
    return out.seen


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_scratch_mutant: needs a CUDA device", file=sys.stderr)
        return 2
    shipped = _run()
    D._stream_key = lambda device, stream=None: ("cuda", device.index)
    D._thread = lambda: 0
    mutant = _run()
    ok_shipped = bool(shipped) and all(v == "passed" for v in shipped.values())
    ok_mutant = mutant.keys() == shipped.keys() and all(v.startswith("assert: ") for v in mutant.values())
    for name in shipped:
        print(f"{name}\n    shipped: {shipped[name]}\n    one buffer per device: {mutant.get(name, 'not run')}")
    print(f"gpu_scratch_mutant: {len(shipped)} tests; shipped {'all pass' if ok_shipped else 'NOT ALL PASS'}; "
          f"one buffer per device {'all fail by assertion' if ok_mutant else 'NOT ALL FAIL BY ASSERTION'}")
    return 0 if ok_shipped and ok_mutant else 1


if __name__ == "__main__":
    sys.exit(main())
