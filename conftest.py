"""Repo-root pytest configuration.

FIRST, before anything imports torch or triton: pin each pytest-xdist worker to
one GPU and choose the Triton interpreter when there is no GPU
(``conformance.pinning``, which imports neither). Then load the conformance
plugin (options ``--backend/--only/--device/--tier/--seed/--conform-json``) and the GPU
memory lock of the tests marked ``gpu`` (``conformance.gpu_lock``).
"""

from conformance import pinning

pinning.apply()

pytest_plugins = ["conformance.plugin", "conformance.gpu_lock"]
