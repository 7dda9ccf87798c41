"""Small helpers shared by ``hils-swa probe``, ``diff``, ``bench`` and the GPU labs."""

from __future__ import annotations

import os

import torch

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def pick_device(requested: str | None) -> str:
    """``requested`` or cuda when present, else cpu. On CPU the Triton backend
    needs its interpreter, which must be chosen before triton is imported."""
    device = requested or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device {device!r}: expected cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif dev.type != "cuda":
        raise ValueError(f"device {device!r}: expected cpu, cuda or cuda:N")
    elif not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but torch {torch.__version__} sees no CUDA device")
    elif dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return device


def resolve_backend(spec: str):
    """A :class:`conformance.registry.Backend` from a registered name, an
    entry-point name, ``package.module:function``, or ``mutant:NAME`` (one of
    ``conformance.mutants``, the deliberately broken backends)."""
    from conformance.registry import load_backend

    return load_backend(spec)


def visible_pairs(Lq: int, Lk: int, **rule) -> int:
    """Visible (query, key) pairs of one head of one batch element, closed form
    (``reference.visible_counts``; ``rule``: window_size, chunk_size, ...)."""
    from reference import visible_counts

    return int(visible_counts(Lq, Lk, **rule).sum())


def attention_flops(B: int, Hq: int, Lq: int, Lk: int, D: int, **rule) -> float:
    """The flops the benchmarks count: ``4 * D * visible pairs * B * Hq`` (two
    matrix products over visible pairs only)."""
    return 4.0 * D * visible_pairs(Lq, Lk, **rule) * B * Hq



def capture_graph(capture, warmup=None):
    """``(graph, result)``: a CUDA graph of ``capture()`` and what the captured
    call returned (tensors the graph writes on each replay). ``warmup()``
    (default: ``capture``) runs once first on a side stream, as CUDA-graph
    capture of code that allocates or compiles needs; the caller synchronises
    or replays after."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (warmup or capture)()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = capture()
    return graph, result


def commit_label() -> str:
    """The checkout's commit for a report, ``-dirty`` appended when tracked files differ from
    it (``git describe --always --dirty``; untracked files do not count; tags excluded, so the
    label is the abbreviated hash). The device tool's copy of the tree can carry a ``.git``
    older than the tree (session 38: a tree at 8a91ade read HEAD as 6dbab1c); the label then
    ends in ``-dirty`` instead of naming the older commit as the tree. Scripts pass the commit
    they ran (``tools/gpu_all.sh``'s ``--commit``; the labs take ``COMMIT`` from the
    environment before this: :func:`run_commit`). ``unknown`` outside a git checkout."""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7", "--exclude=*"],
                             capture_output=True, text=True, cwd=root, timeout=30)
        return out.stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def run_commit() -> str:
    """The commit a lab names in its results: ``COMMIT`` from the environment (the device
    tool's copy of ``.git`` can be older than the tree it runs, :func:`commit_label`), else
    :func:`commit_label`."""
    return os.environ.get("COMMIT") or commit_label()
