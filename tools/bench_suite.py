"""One pytest test per benchmark shape: what ``hils-swa bench -n N`` hands to pytest-xdist.

Not part of the repo's test suite (outside ``testpaths``, and not named
``test_*.py``); without the plugin ``tools.bench_xdist`` and its option it skips.
The timing itself is ``tools.bench.bench_shape``; see ``tools.bench_xdist``.
"""

import pytest

from tools import bench_xdist

if not bench_xdist.ACTIVE:
    pytest.skip("runs through `hils-swa bench -n N` only", allow_module_level=True)


def test_shape(request, bench_shape, bench_worker):
    bench_xdist.run_shape(request, bench_shape, bench_worker)
