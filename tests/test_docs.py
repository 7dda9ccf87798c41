"""Documents that must stay true."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_spec_copy_matches_the_contract():
    """docs/SPEC.md is the contract as shipped; it must not drift from shared/SPEC.md."""
    shared = ROOT.parent / "shared" / "SPEC.md"
    if not shared.exists():
        pytest.skip("no shared/SPEC.md beside the checkout: docs/SPEC.md is the contract here")
    assert (ROOT / "docs" / "SPEC.md").read_text() == shared.read_text()


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    cmd = 'pip install torch==2.13.0 -e ".[test]" && pytest -n 2'
    assert cmd in readme and cmd in ci
    assert "hils-swa conform" in readme


def test_cli_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "tools.cli", "--help"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    for name in ("conform", "bench", "diff", "probe"):
        assert name in out


def test_readme_counts_the_mutants():
    """README's count of deliberately broken backends follows conformance.mutants."""
    import re

    from conformance.mutants import EXTRA_MUTANTS, MUTANTS
    text = " ".join((ROOT / "README.md").read_text().split())
    m = re.search(r"one of (\d+) deliberately broken backends .*? for the (\d+) in `MUTANTS`", text)
    assert m, "README no longer counts the mutants"
    assert (int(m.group(1)), int(m.group(2))) == (len(MUTANTS) + len(EXTRA_MUTANTS), len(MUTANTS))
