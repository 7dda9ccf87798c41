"""``hils-swa conform``: the conformance suite from the command line.

A thin layer over pytest: it runs ``conformance/test_conformance.py`` (the very
tests ``pytest`` runs) through ``pytest.main`` with the plugin
``conformance.plugin``, which prints a progress bar and the matrix and writes
the JSON report. ``-n N`` is pytest-xdist (each worker pinned to one GPU when
there are several).

Examples::

    hils-swa conform                                   # quick tier, default device and backends
    hils-swa conform --backend triton --only window,chunk --device cpu
    hils-swa conform --device cpu --exclude long4m       # leave out the 4M-key caches
    hils-swa conform --device cuda --tier full --where "Lq > 64 and dtype != 'fp32'"  # by field
    hils-swa conform --device cuda --tier full -n 8 --json conformance/results/h200.json
    hils-swa conform --backend mutant:lse_base2       # watch the suite catch a bug
"""

from __future__ import annotations

import argparse
import os
import sys

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_conformance.py")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hils-swa conform", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--backend", action="append", metavar="SPEC",
                   help="registered name, entry point, package.module:function (NAME=package.module:function "
                        "names it), or mutant:NAME "
                        "(repeatable; default: the registry's default backends)")
    p.add_argument("--only", action="append", metavar="NAMES",
                   help="comma-separated categories, case ids or id globs (repeatable)")
    p.add_argument("--exclude", action="append", metavar="NAMES",
                   help="comma-separated categories, case ids or id globs to leave out (repeatable; "
                        "after --only), e.g. --exclude long4m on a machine short of memory")
    p.add_argument("--where", action="append", metavar="EXPR",
                   help="keep the cases for which EXPR holds, a Python expression over the case's "
                        "fields (Lq, Lk, Dqk, Dv, dtype, layout, window, chunk, ...; max, min, abs): "
                        "e.g. \"Lq > 64 and max(Dqk, Dv) <= 128 and dtype != 'fp32'\" (repeatable: "
                        "all must hold; after --only and --exclude)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="device of the cases (default: cuda when available, else cpu)")
    p.add_argument("--tier", choices=("quick", "full"), default="quick")
    p.add_argument("--json", metavar="PATH", help="write per-check results, matrix and workers as JSON")
    p.add_argument("--commit", metavar="LABEL",
                   help="the commit the JSON report names (default: the checkout's git describe --dirty; "
                        "a copy of the tree whose .git is older passes the commit it holds)")
    p.add_argument("-n", "--workers", default=None, metavar="N",
                   help="pytest-xdist workers (a number or 'auto'); default: min(8, cores / 2) when "
                        "the cases run on CUDA (kernels JIT-compile in parallel), else this process only")
    p.add_argument("--seed", default=None,
                   help="run seed of the inputs: an int, or 'random' (default: $HILS_SWA_SEED, else 0; printed)")
    p.add_argument("--check-timeout", type=float, default=None, metavar="S",
                   help="per-check watchdog under -n: a worker stuck S seconds (hung kernel) dies, "
                        "its check fails, xdist starts a new worker (default 300 on CUDA; 0 = off)")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="pytest's per-test output instead of a progress bar")
    p.add_argument("-x", "--exitfirst", action="store_true", help="stop at the first failing check")
    return p


def pytest_args(a: argparse.Namespace) -> list[str]:
    """The ``pytest.main`` arguments of a parsed command line."""
    args = [TESTS, "-p", "conformance.plugin", "-p", "no:cacheprovider", "-o", "addopts=", "-rN",
            "--tb=no", "--device", a.device, "--tier", a.tier,
            # numpy's notice of NaN arithmetic in the Triton interpreter's emulation of the
            # kernels: the NaN cases' inputs (the verdict judges NaN exactly); 456 lines of
            # warnings summary after a CPU full tier otherwise
            "-W", "ignore::RuntimeWarning:triton.runtime.interpreter"]
    for spec in a.backend or []:
        args += ["--backend", spec]
    for names in a.only or []:
        args += ["--only", names]
    for names in a.exclude or []:
        args += ["--exclude", names]
    for expr in a.where or []:
        args.append(f"--where={expr}")  # one token: an expression may start with '-'
    if a.json:
        args += ["--conform-json", os.path.abspath(a.json)]
    if a.commit:
        args += ["--conform-commit", a.commit]
    if a.seed is not None:
        args += ["--seed", str(a.seed)]
    workers = a.workers if a.workers is not None else default_workers(a.device)
    if str(workers) not in ("0", "1"):
        args += ["-n", str(workers)]
    if a.check_timeout is not None:
        args += ["--check-timeout", str(a.check_timeout)]
    if a.exitfirst:
        args.append("-x")
    args += ["-v"] if a.verbose else ["-q", "--conform-progress"]
    return args


def default_workers(device: str, gpus: list[str] | None = None, cores: int | None = None) -> str:
    """``-n`` when none is given: parallel JIT compiles on a GPU host, serial on CPU."""
    from . import pinning

    gpus = pinning.gpu_list() if gpus is None else gpus
    if device == "cpu" or not gpus:
        return "0"
    cores = (os.cpu_count() or 2) if cores is None else cores
    return str(max(1, min(8, cores // 2)))


def _selected(a: argparse.Namespace, device: str) -> list:
    """The cases of ``a``'s tier on ``device`` that its ``--only`` / ``--exclude`` / ``--where``
    select (``conformance.selection.select``; a ``ValueError`` for a selection it refuses)."""
    from .cases import generate
    from .selection import select, split_names

    return select(generate(a.tier, device), split_names(a.only),
                  f" of the {a.tier} tier on {device}", split_names(a.exclude), a.where)


def _list(a: argparse.Namespace) -> int:
    from .cases import resolve_device

    device = resolve_device(a.device) if a.device == "auto" else a.device  # a CUDA list needs no GPU

    try:
        cases = _selected(a, device)
    except ValueError as e:
        print(f"hils-swa conform: {e}", file=sys.stderr)
        return 2
    for c in cases:
        print(f"{c.category:<11} {c.id}")
    print(f"{len(cases)} cases ({a.tier} tier, {device})")
    from .cases import left_out
    for why in left_out(device):
        print(f"left out on {device}: {why}")
    return 0


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    from . import pinning

    pinning.apply()  # before pytest (or anything) imports torch
    if a.list:
        return _list(a)
    from .cases import resolve_device

    # one line and exit 2, not pytest's collection-error banner (exit 4): the device, the
    # selection (before pytest starts its workers, which select again, alike) and --backend
    try:
        from .runner import resolve_backends
        from .selection import split_names

        _selected(a, resolve_device(a.device))
        resolve_backends(split_names(a.backend))
    except ValueError as e:
        print(f"hils-swa conform: {e}", file=sys.stderr)
        return 2
    import pytest

    return int(pytest.main(pytest_args(a)))


if __name__ == "__main__":
    sys.exit(main())
