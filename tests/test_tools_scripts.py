"""The device scripts (``tools/gpu_all.sh``, ``tools/gpu_sanitize.sh``) on the CPU:
they parse, and the sanitizer's case selection names every category it means to."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["tools/gpu_all.sh", "tools/gpu_sanitize.sh"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("script", SCRIPTS)
def test_script_parses(script):
    res = subprocess.run(["bash", "-n", str(ROOT / script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _var(name: str) -> list[str]:
    text = (ROOT / "tools/gpu_sanitize.sh").read_text()
    m = re.search(rf'^{name}="([^"]*)"', text, flags=re.M)
    assert m, f"{name} not found in tools/gpu_sanitize.sh"
    return m.group(1).split(",")


def test_sanitizer_runs_every_category_but_long():
    """A category added to the suite is sanitized too unless this list says why not:
    only ``long`` (caches up to 128K keys) is left out."""
    from conformance.cases import CATEGORIES

    assert sorted(_var("ALL_CATS")) == sorted(c.name for c in CATEGORIES if c.name != "long")
    names = {c.name for c in CATEGORIES}
    assert set(_var("SMALL_CATS")) <= names
