"""The conformance suite as pytest tests: one test per (case, backend) and per
(case, pair of backends), ids ``<case id>-<backend>`` / ``<case id>-<a>~<b>``.

Parametrized by ``conformance.plugin`` from ``conformance.cases.generate`` (the
same cases ``hils-swa conform`` runs). Options: ``--backend``, ``--only``,
``--device``, ``--tier``, ``--seed``, ``--conform-json``. Defaults: quick tier
on CUDA when available else CPU, the registry's default backends.

A case a backend cannot serve (``supports`` says no, or it raises its
``UnsupportedConfig``) passes here and is reported ``unsupported`` with its
reason in the matrix; everything else either passes or fails with the verdict.
"""

import pytest

from conformance.plugin import record, watchdog


def test_conformance(conform_check, conform_runner, request):
    with watchdog(request.config):  # a hung kernel fails its check instead of the run
        result = conform_runner.run(conform_check)
    record(request, result)
    if result.verdict.status == "fail":
        pytest.fail(result.message, pytrace=False)
    if result.verdict.status == "deviates":  # a documented bug (conformance.registry): never a pass
        pytest.xfail(result.message)
