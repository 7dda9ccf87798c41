"""Fixtures for the tests under ``tests/`` (the repo-root ``conftest.py`` pins devices
and loads the conformance plugin and the GPU memory lock, ``conformance.gpu_lock``, first)."""

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
