"""Repo-root pytest configuration.

FIRST, before anything imports torch or triton: pin each pytest-xdist worker to
one GPU and choose the Triton interpreter when there is no GPU
(``conformance.pinning``, which imports neither). Then load the conformance
plugin (options ``--backend/--only/--device/--tier/--seed/--conform-json``).
"""

from conformance import pinning

pinning.apply()

pytest_plugins = ["conformance.plugin"]


import sys  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_tilelang_plans():
    """TileLang's launch plans are cached by problem (``tilelang_impl.launch._plan``),
    not by the planning tables and functions a test may patch: every test starts and
    ends without any."""
    mod = sys.modules.get("tilelang_impl.launch")
    if mod is not None:
        mod.clear_plans()
    yield
    mod = sys.modules.get("tilelang_impl.launch")
    if mod is not None:
        mod.clear_plans()
