"""The conformance suite as pytest tests: one test per (case, backend) and per
(case, pair of backends), ids ``<case id>-<backend>`` / ``<case id>-<a>~<b>``.

Parametrized by ``conformance.plugin`` from ``conformance.cases.generate`` (the
same cases ``hils-swa conform`` runs). Options: ``--backend``, ``--only``,
``--device``, ``--tier``, ``--seed``, ``--conform-json``. Defaults: quick tier
on CUDA when available else CPU, the registry's default backends.

A case a backend cannot serve (``supports`` says no, or it raises its
``UnsupportedConfig``) is skipped here with its reason and reported ``unsupported``
in the matrix; for a default built-in backend on the CPU or a Hopper GPU it fails
(``registry.Backend.complete``). Everything else passes or fails with the verdict;
``hils-swa conform`` fails a named backend that served none of the cases.
"""

import pytest

from conformance.plugin import record, watchdog


def test_conformance(conform_check, conform_runner, request):
    conform_runner.reserve(conform_check.case)  # a heavy CUDA case waits for a memory slot
    with watchdog(request.config):  # a hung kernel fails its check instead of the run
        result = conform_runner.run(conform_check)
    record(request, result)
    if result.verdict.status == "fail":
        pytest.fail(result.message, pytrace=False)
    if result.verdict.status == "deviates":  # a documented bug (conformance.registry): never a pass
        pytest.xfail(result.message)
    if result.verdict.status == "unsupported":
        pytest.skip(result.message)
