"""How often a TileLang lab variant hangs: one timed shape of ``tools/lab_tilelang.py``,
launched many times, eager and under CUDA-graph replay, each mode in a child process that
a watchdog kills when it stops making progress (GPU).

    python -m tools.lab_hang --variant shipped --shape "B4 GQA32/4 D64 L4K" \\
        --launches 20000 --every 500 [--stall-s 20] [--out DIR]
    python -m tools.lab_hang --variant occ3-64x64v --dims 1,32,4,512,512,64   (any shape)

Written in session 40 for ``occ3-64x64v`` (D = 64 on 64x64 tiles at three CTAs per SM):
+8..+15% on the D = 64 GQA rows in every lab run that finished them, and one of six hung
while timing ``B4 GQA32/4 D64 L4K``. Since session 41's producer guard three CTAs
(``occ3-64x64v``) and four (``occ4-64x64v``, the shipped long-call build at D <= 64 in
session 44) ran 100,000 launches of that shape without a hang, and so did ``hoist`` eager
(session 45), the kernel that ``shipped`` (the default) was in session 46 until ``hkeys``
shipped: 20,000 launches of that shape and 10,000 at 32/32/128 L=8K, eager and under graph
replay, on the H200. The child synchronises every ``--every`` launches and prints the count;
the parent reports the last count it saw when the child stalls for ``--stall-s`` (the hang
lies in the next ``--every`` launches) or the child's exit. Prints one line per mode and
writes ``lab_hang.json`` under ``--out``. ``--dims B,Hq,Hkv,Lq,Lk,D`` runs a shape of one's
own (bf16, the lab's window and chunk): a prefill grid of at most two programs an SM
(``launch.grid_programs`` against the SM count, which the child reports as ``programs``)
cannot put three CTAs on one SM, so a three- or four-CTA build that hangs there hangs for
its code, not for its occupancy. ``--gdb`` attaches cuda-gdb to a hung child before the kill
and records where the warps of two SMs wait (their PCs and the instructions there: an
``USETMAXREG`` that never returns, or a barrier wait).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time

from tools._common import run_commit


def parse_dims(text: str) -> tuple:
    """``B,Hq,Hkv,Lq,Lk,D`` -> six positive ints, ``Hq`` a multiple of ``Hkv`` and ``Lq <=
    Lk`` (a ValueError otherwise)."""
    try:
        dims = tuple(int(x) for x in text.split(","))
    except ValueError:
        dims = ()
    if len(dims) != 6 or min(dims) < 1:
        raise ValueError(f"--dims {text!r}: six positive integers B,Hq,Hkv,Lq,Lk,D")
    B, Hq, Hkv, Lq, Lk, D = dims
    if Hq % Hkv or Lq > Lk:
        raise ValueError(f"--dims {text!r}: Hq a multiple of Hkv and Lq <= Lk")
    return dims


def child(variant: str, shape: str, launches: int, every: int, mode: str,
          dims: tuple | None = None) -> int:
    import torch
    from tilelang_impl import launch
    from tools import lab_tilelang as lab
    plan, _, shapes = lab._tables(variant)
    if dims is not None:
        B, Hq, Hkv, Lq, Lk, D = dims
    else:
        (_, B, Hq, Hkv, Lq, Lk, D), = [s for s in shapes if s[0] == shape]
    q, k, v, p = lab.timed_inputs(B, Hq, Hkv, Lq, Lk, D)
    o, lse = p.new_outputs()
    cfg, split = plan(D)
    S = lab._splits(p, cfg, split)

    def one():
        launch.run_cuda(p, q, k, v, False, False, o, lse, force_split=S, config=cfg)
    one()
    torch.cuda.synchronize()
    print(f"programs {launch.grid_programs(p, cfg[0]) if S == 1 else None} "
          f"SMs {launch.sm_count(p.device)} splits {S}", flush=True)
    print("ready", flush=True)
    step = one
    if mode == "graph":  # one graph of ``every`` launches, replayed
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            one()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(every):
                one()
        step = graph.replay
        print("captured", flush=True)
    done = 0
    while done < launches:
        if mode == "graph":
            step()
        else:
            for _ in range(every):
                step()
        torch.cuda.synchronize()
        done += every
        print(f"launches {done}", flush=True)
    return 0


def child_cmd(args, mode: str) -> list:
    """The command line of one mode's child process."""
    return ([sys.executable, "-m", "tools.lab_hang", "--child", mode, "--variant", args.variant,
             "--shape", args.shape, "--launches", str(args.launches), "--every", str(args.every)]
            + (["--dims", args.dims] if args.dims else []))


def gdb_commands(sms: int = 2, warps: int = 64) -> list[str]:
    """cuda-gdb batch commands that say where a hung kernel's warps wait: the kernels, then on
    SMs ``0 .. sms - 1`` of device 0 every warp's PC and block (``info cuda warps``), then for
    each warp slot ``0 .. warps - 1`` (Hopper has 64 an SM; resident warps need not sit in the
    first ones) the slot it focuses and the instructions at its lane 0's PC. A slot with no
    warp is an error line, the commands after it still run (gdb's ``-ex``), and ``cuda
    device sm warp lane`` echoes the focus before each ``x/3i``, so an instruction listing is
    read against the focus printed above it."""
    cmds = ["set pagination off", "set cuda break_on_launch none", "info cuda kernels"]
    for sm in range(sms):
        cmds += [f"cuda device 0 sm {sm}", "info cuda warps"]
    for sm in range(sms):
        for w in range(warps):
            cmds += [f"cuda device 0 sm {sm} warp {w} lane 0", "cuda device sm warp lane",
                     "x/3i $pc"]
    return cmds + ["detach"]


def gdb_dump(pid: int, timeout_s: float = 120.0, sms: int = 2) -> str:
    """Attach cuda-gdb to ``pid`` (a hung child) and run :func:`gdb_commands`; its output,
    or why there is none."""
    exe = shutil.which("cuda-gdb")
    if exe is None:
        return "cuda-gdb is not on the PATH"
    argv = [exe, "-nx", "-batch", "-p", str(pid)]
    for c in gdb_commands(sms):
        argv += ["-ex", c]
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        return cp.stdout + cp.stderr
    except subprocess.TimeoutExpired as e:
        out = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                      for x in (e.stdout, e.stderr))
        return f"cuda-gdb timed out after {timeout_s} s\n" + out


def report_head(text: str, n: int = 3000) -> str:
    """The first ``n`` characters of a cuda-gdb dump from its first warp table on (the attach
    banner and the host threads before it say nothing of the kernel)."""
    start = text.find(" Wp ")  # the header of `info cuda warps`
    return (text[start:] if start >= 0 else text)[:n]


def watch(cmd: list, mode: str, launches: int, every: int, stall_s: float,
          build_s: float, on_hang=None) -> dict:
    """Run ``cmd`` (a child: prints ``ready`` after its first launch, then ``launches N``
    every ``every`` launches) and report how far it got: ``ok`` (all ``launches`` done,
    exit 0), ``stopped short`` (exit 0 before them), ``hung`` (no line for ``stall_s`` after ``ready``: killed, the hang lies in the
    ``every`` launches after ``launches_done``; under graph replay the warm-up launch and the
    capture come first, ``captured`` in ``tail`` says they ended), ``stalled before the first
    launch`` (no line for ``build_s`` before ``ready``: the build and the first launch; the
    child's stderr, TileLang's build log among it, counts as lines) or ``rc N`` (the child
    failed). ``tail`` holds the last lines seen where the status is not ``ok``. ``on_hang``
    (``pid -> str``, e.g. :func:`gdb_dump`) runs on a hung child before it is killed; its
    text is the report's ``on_hang``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()

    def pump():
        for x in proc.stdout:
            lines.put(x)
        lines.put(None)
    threading.Thread(target=pump, daemon=True).start()
    last, ready, t0, tail, grid = 0, False, time.time(), [], None
    limit = build_s
    while True:
        try:
            line = lines.get(timeout=limit)
        except queue.Empty:
            if proc.poll() is not None:  # exited; its output still open elsewhere
                lines.put(None)
                continue
            seen = None
            try:
                if ready and on_hang is not None:
                    seen = on_hang(proc.pid)
            except Exception as e:  # noqa: BLE001 (the child is killed whatever the probe did)
                seen = f"on_hang failed: {e!r}"
            proc.kill()
            try:
                proc.wait(timeout=60)
                killed = True
            except subprocess.TimeoutExpired:  # stuck in the driver: reported, not waited for
                killed = False
            return dict(mode=mode, status="hung" if ready else "stalled before the first launch",
                        launches_done=last, hang_within=every if ready else None,
                        seconds=round(time.time() - t0, 1), grid=grid, killed=killed,
                        tail=tail[-8:], **({} if seen is None else {"on_hang": seen}))
        if line is None:
            rc = proc.wait()
            status = f"rc {rc}" if rc else ("ok" if last >= launches else "stopped short")
            return dict(mode=mode, status=status, launches_done=last, grid=grid,
                        seconds=round(time.time() - t0, 1), tail=tail[-8:] if status != "ok" else [])
        line = line.rstrip()
        tail.append(line)
        if line.startswith("programs "):
            grid = line
        elif line == "ready":
            ready, limit = True, stall_s
        elif line.startswith("launches "):
            last = int(line.split()[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="shipped")
    ap.add_argument("--shape", default="B4 GQA32/4 D64 L4K",
                    help="one of the lab's timed shapes (tools/lab_tilelang.py SHAPES)")
    ap.add_argument("--dims", default=None, help="B,Hq,Hkv,Lq,Lk,D instead of --shape")
    ap.add_argument("--launches", type=int, default=20000)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--stall-s", type=float, default=20.0)
    ap.add_argument("--build-s", type=float, default=120.0)
    ap.add_argument("--modes", default="eager,graph")
    ap.add_argument("--gdb", action="store_true",
                    help="on a hang, attach cuda-gdb first: where each warp of SMs 0-1 waits "
                         "(gdb-MODE.txt under --out; its head in the report)")
    ap.add_argument("--gdb-s", type=float, default=180.0,
                    help="how long cuda-gdb may take to attach and answer")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", choices=("eager", "graph"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.every < 1 or args.launches < args.every:
        ap.error("--every must be at least 1 and at most --launches")
    if args.stall_s <= 0 or args.build_s <= 0 or args.gdb_s <= 0:
        ap.error("--stall-s, --build-s and --gdb-s must be positive")
    dims = None
    if args.dims:
        try:
            dims = parse_dims(args.dims)
        except ValueError as e:
            ap.error(str(e))
    if args.child:
        return child(args.variant, args.shape, args.launches, args.every, args.child, dims)
    from tools import lab_tilelang as lab
    try:
        _, _, shapes = lab._tables(args.variant)
    except KeyError:
        ap.error(f"--variant {args.variant}: not a lab variant (tools/lab_tilelang.py)")
    if dims is None and args.shape not in [s[0] for s in shapes]:
        ap.error(f"--shape {args.shape!r}: one of {[s[0] for s in shapes]}, or --dims")
    results = []
    modes = args.modes.split(",")
    if not set(modes) <= {"eager", "graph"}:
        ap.error(f"--modes {args.modes}: eager and / or graph")
    if args.gdb and shutil.which("cuda-gdb") is None:
        ap.error("--gdb: cuda-gdb is not on the PATH")
    for mode in modes:
        r = watch(child_cmd(args, mode), mode, args.launches, args.every, args.stall_s,
                  args.build_s,
                  on_hang=(lambda pid: gdb_dump(pid, args.gdb_s)) if args.gdb else None)
        if "on_hang" in r:
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                with open(os.path.join(args.out, f"gdb-{mode}.txt"), "w") as f:
                    f.write(r["on_hang"])
            r["on_hang"] = report_head(r["on_hang"])
        results.append(r)
        print(json.dumps(r), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "lab_hang.json"), "w") as f:
            json.dump(dict(variant=args.variant, shape=args.dims or args.shape, every=args.every,
                           commit=run_commit(), results=results), f, indent=1)
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
