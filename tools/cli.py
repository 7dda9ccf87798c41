"""``hils-swa``: one console script, git-style subcommands.

Each subcommand lives in its own module and is imported only when asked for,
so ``hils-swa --help`` does not import torch, triton or tilelang.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module, one-line help)
SUBCOMMANDS = {
    "conform": ("conformance.cli", "run the conformance suite: every backend against the reference and each other"),
    "bench": ("tools.bench", "time backends on the benchmark shape suite (GPU)"),
    "diff": ("tools.diff", "diagnose which SPEC rule two backends disagree on"),
    "probe": ("tools.probe", "recover a backend's effective visibility mask as a black box"),
}


def _usage() -> str:
    lines = ["usage: hils-swa <command> [options]", "", "commands:"]
    for name, (_, text) in SUBCOMMANDS.items():
        lines.append(f"  {name:<9} {text}")
    lines += ["", "`hils-swa <command> --help` shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"hils-swa: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
