"""The split-KV scratch's concurrency tests against one buffer per device (GPU).

    python tools/gpu_scratch_mutant.py

Runs the concurrency tests of ``tests/test_split_scratch_gpu.py`` (two streams released
together; two graphs replayed together; the scratch helper's own) with
``reference.device._stream_key`` returning one key per device: no buffer per stream and
none of its own for a graph, the scheme of Triton's workspace before session 22. Each of
them must fail, by a wrong result or a shared buffer, not by an error of the harness.
Exit status 0 when every one fails so, 1 otherwise, 2 without CUDA.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reference import device as D  # noqa: E402

SELECT = "concurrent or per_stream"


class _Outcomes:
    def __init__(self):
        self.failed, self.other = {}, []

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            self.failed[report.nodeid] = getattr(crash, "message", "") or report.longreprtext
        elif report.when == "call" or report.outcome != "passed":
            self.other.append((report.nodeid, report.when, report.outcome))


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_scratch_mutant: needs a CUDA device", file=sys.stderr)
        return 2
    D._stream_key = lambda device: ("cuda", device.index)
    out = _Outcomes()
    pytest.main(["-q", "-p", "no:cacheprovider", "-n", "0", "tests/test_split_scratch_gpu.py", "-k", SELECT],
                plugins=[out])
    # a harness error (AttributeError, a CUDA fault) is not the failure this run looks for
    by_assert = {n: msg.startswith(("AssertionError", "assert ")) for n, msg in out.failed.items()}
    for n, ok in by_assert.items():
        print(f"{'fails as it must' if ok else 'FAILS BY AN ERROR'}: {n}: {out.failed[n].splitlines()[0][:160]}")
    for n, when, outcome in out.other:
        print(f"NOT FAILED ({when}: {outcome}): {n}")
    good = len(by_assert) >= 5 and all(by_assert.values()) and not out.other
    print(f"gpu_scratch_mutant: {sum(by_assert.values())} of {len(by_assert) + len(out.other)} tests fail "
          f"against one buffer per device: {'as they must' if good else 'NOT ALL'}")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
