"""Hardware counters of the shipped kernels on the benchmark shapes (Nsight Compute).

    python -m tools.gpu_ncu --out $OUT [--shapes a,b] [--backends triton,tilelang,sdpa]
    python -m tools.gpu_ncu --out $OUT --shapes train-8k-32/4/64 \
        --backends tilelang,tilelang:nohkeys
    python -m tools.gpu_ncu --summarize DIR|NAME-summary.json   (CPU: a run's tables)

A backend is a registered one (``conformance.registry``), ``sdpa`` (the dense contrast),
or ``tilelang:VARIANT``: TileLang's prefill grid with the config of ``VARIANT`` of
``tools/lab_tilelang.py``'s ``VARIANTS`` at the shape's head dim (``launch.run_cuda`` with
that config, as the lab times it, into outputs poisoned once before the warm-up calls, so
the profiled call launches the variant's kernel alone), prefill shapes only: a lab knob's
counters beside the shipped kernel's (``tilelang``) in one run. Its files are named
``tilelang_lab-VARIANT__SHAPE``. The command refuses unknown shapes, backends and variants,
a variant on a decode shape, and two backends whose files would share a name, before any
profile starts.

Where the kernel time goes, measured instead of inferred: for each (backend, shape)
one child process builds the bench's inputs (``tools.bench``: same shapes, bf16,
fresh random data), warms the call up (compiles, sizes the split-KV scratch),
checks batch element 0 against the float64 reference under the suite's verdict
(``bench.Gate``: a profile of a wrong kernel is worthless), then runs the public call
once between ``cudaProfilerStart`` / ``cudaProfilerStop``. ``ncu --profile-from-start
off --clock-control none --set full`` records every kernel of that call (the split-KV
decode: the split kernel and the combine), replaying each kernel with its memory
restored, so the counters of one launch come from many passes. Clocks are left
alone (METHOD.md); the profiled kernel runs with a warm L2 only as far as the
replays leave it (ncu's default cache control flushes caches before each pass).

Per kernel the run keeps, in ``ncu_raw.csv`` files and the summary: duration, SM
clock, issue-slot and tensor-pipe utilisation, achieved occupancy, DRAM throughput,
and the warp-stall breakdown (cycles per issued instruction by reason); from the
source page, the sampled stalls per SASS opcode, the most-stalled instructions, the
warp instructions issued grouped by how often each instruction ran (:func:`by_count`: a
loop's body is one group) and the mbarrier waits (:func:`barrier_waits`: each try-wait
with the branch that tests it, where the samples of a wait land, and how often its retry
path ran).
Everything goes into ``$OUT/ncu.tar.xz`` (reports and CSVs) and ``$OUT/ncu_summary.json``;
``--summarize`` prints the tables again from those files on any machine, or from a run
stored in ``bench_results/`` as ``NAME-summary.json`` and ``NAME-csv.tar.xz``, reading the
source pages again from the tar where it is there (so a run profiled before a summary
field existed gets it).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time

DEFAULT_SHAPES = ("train-8k-32/32/128", "train-8k-32/4/64", "chunk512of8k-32/32/128",
                  "decode-8k-32/32/128", "decode-b8-32k-32/4/64")
DEFAULT_BACKENDS = ("triton", "tilelang")
#: (backend, shape) pairs profiled besides the grid above: a dense kernel for contrast
EXTRA = (("sdpa", "train-8k-32/32/128"),)

#: Raw-page metrics kept in the summary (regular expressions on the metric name)
KEEP = (r"^gpu__time_duration\.sum$", r"^sm__cycles_elapsed\.avg\.per_second$",
        r"^smsp__issue_active\.avg\.pct_of_peak_sustained_active$",
        r"^sm__inst_executed\.avg\.per_cycle_active$",
        r"^sm__pipe_tensor_op_(hmma|gmma)_cycles_active\.avg\.pct_of_peak_sustained_active$",
        r"^sm__inst_executed_pipe_(alu|fma|xu)\.avg\.pct_of_peak_sustained_active$",
        r"^dram__bytes_read\.sum\.pct_of_peak_sustained_elapsed$",
        r"^sm__warps_active\.avg\.pct_of_peak_sustained_active$",
        r"^launch__(grid_size|block_size|registers_per_thread|occupancy_limit_.*|shared_mem_per_block.*)$",
        r"^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$")
#: Microseconds per unit of a duration, in ncu's long and short unit names
TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(.*)_per_issue_active\.ratio$")


def _tag(backend: str, shape: str) -> str:
    """The file name of a profile (no ``/`` or ``:``; a lab variant ``tilelang:X`` is
    ``tilelang_lab-X``, apart from registered names such as ``tilelang-split``)."""
    name = lab_variant(backend)
    b = backend if name is None else f"tilelang_lab-{name}"
    return f"{b.replace(':', '-')}__{shape.replace('/', '-')}"


def lab_variant(backend: str) -> str | None:
    """``VARIANT`` of a ``tilelang:VARIANT`` backend, else None."""
    head, sep, name = backend.partition(":")
    return name if (head == "tilelang" and sep) else None


def check_backends(backends, shapes) -> list[str]:
    """What is wrong with profiling ``backends`` on the bench ``shapes`` (an empty list:
    nothing): unknown backends, unknown lab variants, a lab variant on a shape that is not a
    prefill, two backends whose profiles would share a file name."""
    from conformance.registry import load_backend

    from . import bench, lab_tilelang

    kinds = {s.name: s.kind for s in bench.SHAPES}
    bad = []
    for b in backends:
        name = lab_variant(b)
        if name is None:
            if b != "sdpa":
                try:
                    load_backend(b)
                except ValueError as e:
                    bad.append(f"{e} (here also: sdpa, tilelang:VARIANT)")
        elif name not in lab_tilelang.VARIANTS:
            bad.append(f"unknown lab variant {name!r} in {b!r} (tools/lab_tilelang.py VARIANTS: "
                       f"{sorted(lab_tilelang.VARIANTS)})")
        else:
            bad += [f"{b} runs the prefill grid: {s} is not a prefill shape ({kinds.get(s)})"
                    for s in shapes if kinds.get(s) != "prefill"]
    tags = {}
    for b in backends:
        tags.setdefault(_tag(b, ""), []).append(b)
    bad += [f"backends {same} would write the same files ({tag[:-2]}__SHAPE)"
            for tag, same in tags.items() if len(same) > 1]
    return bad


def _lab_runner(name: str, shape):
    """A :class:`tools.bench.Runner` of lab variant ``name`` on ``shape``: TileLang's prefill
    grid with the variant's config, into outputs poisoned once by ``prepare`` (so the gate
    still sees an element never written, and the profiled call launches no fill kernel)."""
    from reference.validation import check_inputs
    from tilelang_impl import launch

    from . import bench, lab_tilelang

    cfg = lab_tilelang.VARIANTS[name][0](shape.D)
    rule = dict(shape.rule)

    def prepare(q, k, v):
        p = check_inputs(q, k, v, **rule)
        return (p, q, k, v, *p.new_outputs(poison=True))

    def call(p, q, k, v, o, lse):
        launch.run_cuda(p, q, k, v, False, False, o, lse, force_split=1, config=cfg)
        return o, lse
    return bench.Runner(f"tilelang:{name}", call, True, prepare=prepare)


# ------------------------------------------------------------------ child (profiled)

def _child(backend: str, shape_name: str) -> int:
    import torch

    from . import bench

    shape = next(s for s in bench.SHAPES if s.name == shape_name)
    if backend == "sdpa":
        runner = bench._sdpa_runner(shape, "cuda")
        if shape.Hq != shape.Hkv:
            runner = bench._sdpa_expanded(shape, "cuda")
    elif lab_variant(backend) is not None:
        runner = _lab_runner(lab_variant(backend), shape)
    else:
        runner = bench._canonical_runner(backend, shape)
    (q, k, v), = bench._inputs(shape, "cuda", torch.bfloat16, 1, seed=7)
    args = runner.prepare(q, k, v) if runner.prepare else (q, k, v)
    for _ in range(2):
        out = runner.call(*args)
    torch.cuda.synchronize()
    if runner.canonical:
        ok, text = bench.Gate(shape, q, k, v).check(out)
        print(f"gate {backend} {shape_name}: {text}", flush=True)
        if not ok:
            return 3
    del out
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    runner.call(*args)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


# ------------------------------------------------------------------ parsing (CPU-testable)

def parse_raw(text: str) -> list[dict]:
    """Rows of ``ncu --page raw --csv``: one dict per kernel, metric -> value (a float
    where the cell is a number, else the string), plus ``"_units"`` (metric -> unit)."""
    rows = list(csv.reader(io.StringIO(text)))
    rows = [r for r in rows if r and not r[0].startswith("==")]
    if len(rows) < 2:
        return []
    head, units, body = rows[0], rows[1], rows[2:]
    out = []
    for r in body:
        d = {"_units": dict(zip(head, units))}
        for name, cell in zip(head, r):
            c = cell.replace(",", "")
            try:
                d[name] = float(c)
            except ValueError:
                d[name] = cell
        out.append(d)
    return out


def summarize_kernel(row: dict) -> dict:
    """The kept metrics of one kernel (:data:`KEEP`) and its stall breakdown, sorted."""
    keep = {k: v for k, v in row.items() if k != "_units" and any(re.search(p, k) for p in KEEP)}
    stalls = {STALL.match(k).group(1): v for k, v in keep.items()
              if STALL.match(k) and isinstance(v, float) and v > 0}
    keep = {k: v for k, v in keep.items() if not STALL.match(k)}
    units = row.get("_units", {})
    dur = row.get("gpu__time_duration.sum")
    scale = TO_US.get(units.get("gpu__time_duration.sum", ""))
    return {"kernel": row.get("Kernel Name", row.get("kernel_name", "?")),
            "duration_us": dur * scale if isinstance(dur, float) and scale else None,
            "metrics": keep,
            "units": {k: units[k] for k in keep if units.get(k)},
            "stalls": dict(sorted(stalls.items(), key=lambda kv: -kv[1]))}


def _is_head(r) -> bool:
    return "Source" in r and any("Samples" in c for c in r)


_TRYWAIT = re.compile(r"^SYNCS\.PHASECHK\.TRANS64\.TRYWAIT\s+(U?P\d+)\s*,\s*(\[[^\]]*\])")
_PRED = re.compile(r"^@(!?)(U?P\w+)\s+(.*)$")
_BRA = re.compile(r"^BRA\s+(\S+)")
_PREDICATE = re.compile(r"^!?U?P(\d+|T)$")
#: Unguarded instructions after which the next instruction in the listing is not the next one run
_LEAVES = ("BRA", "EXIT", "RET", "JMP", "BRX", "JMX")
#: Instructions after a retry path's branch target searched for its try-wait
RETRY_REACH = 4


def _unguarded(text: str) -> str:
    """An instruction without its guard predicate (``@P0``, ``@!UP1``)."""
    m = _PRED.match(text)
    return m.group(3) if m else text


def _writes(text: str, pred: str) -> bool:
    """Whether an instruction may write predicate ``pred``: it is among the leading
    operands that are predicates, after the first (``ISETP.NE.AND P1, P0, ...``,
    ``IADD3 R4, P0, PT, ...``), or the instruction sets predicates from a register
    (``R2P``). Conservative: a source predicate among those leading operands (``PLOP3``'s)
    counts as written too, which only ends a search early."""
    body = _unguarded(text)
    parts = body.split(None, 1)
    if not parts:
        return False
    if parts[0].split(".")[0] == "R2P":
        return True
    if len(parts) < 2:
        return False
    ops = [o.strip() for o in parts[1].split(",")]
    lead = ops[:1]
    for o in ops[1:]:
        if not _PREDICATE.match(o):
            break
        lead.append(o)
    return pred in lead


def _target(text: str, base: int, where: dict) -> int | None:
    """The index in the listing of a ``BRA``'s target: an absolute address as ncu's source
    page prints it, else an offset from the kernel's first instruction; None for a label or
    an address outside the listing."""
    m = _BRA.match(_unguarded(text))
    if not m:
        return None
    try:
        t = int(m.group(1).strip("`()"), 16)
    except ValueError:
        return None
    return where.get(t, where.get(base + t))


def _retry_wait(instrs: list[tuple], k: int | None) -> int | None:
    """The index of the first try-wait within :data:`RETRY_REACH` instructions from ``k``."""
    if k is None:
        return None
    for j in range(k, min(k + RETRY_REACH, len(instrs))):
        if _TRYWAIT.match(_unguarded(instrs[j][1])):
            return j
    return None


def barrier_waits(instrs: list[tuple]) -> list[dict]:
    """The mbarrier waits of one kernel's SASS, from ``(address, text, samples,
    executed)`` rows in program order (``executed`` None where the page has no
    ``Instructions Executed`` column).

    A wait is a ``SYNCS.PHASECHK.TRANS64.TRYWAIT P, [bar]``: the try-wait returns after
    a bounded time with ``P`` telling whether the phase completed, and the first later
    ``@!P BRA`` takes the retry path when it did not. The search for that branch stops at
    an instruction that may write ``P`` (:func:`_writes`) and at an unguarded ``BRA``,
    ``EXIT`` or return (the listing's next instruction is not the next run). A warp stalled
    on the barrier is sampled on that branch, which waits for ``P``, more than on the
    try-wait itself, so a wait's ``samples`` are both instructions' (the by-opcode table
    counts them as ``BRA`` and ``SYNCS...``). A warp asleep in a retry path's
    ``NANOSLEEP`` was not sampled in session 50's profiles (their retry paths hold no
    samples), so ``samples`` count the first try only. ``retries``: the executions of the
    first try-wait within :data:`RETRY_REACH` instructions of the branch's target, the
    retry path's: one a round of its loop, so a count of rounds, not of the waits that
    missed; None where the target is a label or outside the listing, no try-wait is that
    near it, or the page has no counts. Two waits that branch to one retry path both
    report all its rounds. Branch targets are the absolute addresses ncu's source page
    prints (an offset from the kernel's first instruction is taken too).

    A retry path's own try-wait is not a wait of its own: a try-wait that some wait's
    branch reaches is left out, a self-loop's (``TRYWAIT P; @!P BRA`` back to it, Triton's
    retry paths) included, as its branch reaches it.
    """
    if not instrs:
        return []
    base = instrs[0][0]
    where = {a: i for i, (a, *_rest) in enumerate(instrs)}
    found = []  # (try-wait index, its match, branch index, retry-path try-wait index)
    for i, (_addr, text, _n, _ex) in enumerate(instrs):
        m = _TRYWAIT.match(_unguarded(text))
        if not m:
            continue
        pred = m.group(1)
        branch = None
        for j in range(i + 1, len(instrs)):
            t = instrs[j][1]
            pm = _PRED.match(t)
            if pm and pm.group(1) == "!" and pm.group(2) == pred and _BRA.match(pm.group(3)):
                branch = j
                break
            if _writes(t, pred) or (not pm and t.split(" ")[0].split(".")[0] in _LEAVES):
                break
        if branch is None:
            continue  # a try-wait whose result no branch tests
        found.append((i, m, branch,
                      _retry_wait(instrs, _target(instrs[branch][1], base, where))))
    in_retry = {r for *_rest, r in found if r is not None}
    waits = []
    for i, m, branch, r in found:
        if i in in_retry:
            continue
        addr, _text, n, ex = instrs[i]
        waits.append({"at": hex(addr - base), "barrier": m.group(2), "pred": m.group(1),
                      "branch_at": hex(instrs[branch][0] - base),
                      "samples": n + instrs[branch][2], "executed": ex,
                      "retries": None if r is None else instrs[r][3]})
    return waits


def parse_sources(text: str, top: int = 25) -> list[dict]:
    """Sampled warp stalls per SASS opcode and the ``top`` most-sampled instructions,
    one dict per kernel table of ``ncu --page source --csv --print-source sass`` (a
    report of several kernels prints one table each, a header row opening each; the
    columns are found by name: ``Source`` and the all-samples count; ``Address`` and
    ``Instructions Executed`` where present), and its mbarrier waits
    (:func:`barrier_waits`, where the table has addresses)."""
    rows = [r for r in csv.reader(io.StringIO(text)) if r]
    heads = [i for i, r in enumerate(rows) if _is_head(r)]
    out = []
    for n_, hi in enumerate(heads):
        end = heads[n_ + 1] if n_ + 1 < len(heads) else len(rows)
        head = rows[hi]
        # ncu opens each kernel's table with a "Kernel Name",<name> row
        name = rows[hi - 1][1] if hi > 0 and rows[hi - 1][:1] == ["Kernel Name"] and len(rows[hi - 1]) > 1 else None
        src = head.index("Source")
        smp = next(i for i, c in enumerate(head) if "Samples" in c and "Not" not in c)
        adr = head.index("Address") if "Address" in head else None
        exe = head.index("Instructions Executed") if "Instructions Executed" in head else None
        by_op: dict[str, float] = {}
        instrs = []
        prog = []  # (address, text, samples, executed) in program order, for the waits
        total = 0.0
        for r in rows[hi + 1:end]:
            if len(r) <= max(src, smp) or r[0] == "Kernel Name":
                continue
            try:
                n = float(r[smp].replace(",", "") or 0)
            except ValueError:
                continue
            text_ = r[src].strip()
            op = _unguarded(text_).split(" ")[0] if text_ else "?"
            by_op[op] = by_op.get(op, 0.0) + n
            total += n
            instrs.append((n, text_))
            if adr is not None and len(r) > adr:
                try:
                    a = int(r[adr], 16)
                except ValueError:
                    continue
                x = None
                if exe is not None and len(r) > exe:
                    try:
                        x = int(float(r[exe].replace(",", "")))
                    except ValueError:
                        pass
                prog.append((a, text_, n, x))
        instrs.sort(key=lambda t: -t[0])
        out.append({"kernel": name, "samples": total,
                    "by_opcode": dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:20]),
                    "top": [[n, t] for n, t in instrs[:top]],
                    "waits": barrier_waits(prog), "by_count": by_count(prog)})
    return out


def by_count(instrs: list[tuple], keep: int = 12) -> dict:
    """Where the issued instructions go: the kernel's instructions grouped by how often each
    ran (``Instructions Executed``, warp instructions; a loop body's instructions share a
    count, as do a block's run once a warp or once a CTA), the ``keep`` groups that issued
    most, each ``[count, instructions, warp instructions, samples]``, and ``total`` warp
    instructions. Empty where the page has no counts."""
    groups: dict[int, list] = {}
    for _a, _t, n, x in instrs:
        if x is None:
            return {}
        g = groups.setdefault(x, [x, 0, 0, 0.0])
        g[1] += 1
        g[2] += x
        g[3] += n
    if not groups:
        return {}
    ranked = sorted(groups.values(), key=lambda g: -g[2])
    return {"total": sum(g[2] for g in ranked), "groups": ranked[:keep]}


def attach_sources(kernels: list[dict], sources: list[dict]) -> None:
    """Give each kernel summary its source table: by kernel name where the page names
    its tables, else in order (one table per profiled kernel, in launch order)."""
    named = {}
    for src in sources:
        if src.get("kernel"):
            named.setdefault(src["kernel"], []).append(src)
    for i, k in enumerate(kernels):
        if named:
            if named.get(k["kernel"]):
                k["source"] = named[k["kernel"]].pop(0)
        elif i < len(sources):
            k["source"] = sources[i]


def _pct(v) -> str:
    return f"{v:.1f} %" if isinstance(v, float) else "n/a"


#: Waits a table shows per kernel, most sampled first
WAITS_SHOWN = 8
#: Execution-count groups a table shows per kernel, most issued first
COUNT_GROUPS_SHOWN = 6


def table(summary: dict) -> str:
    """A compact text table of a summary (``ncu_summary.json``)."""
    lines = []
    for tag, ent in summary.items():
        lines.append(f"== {tag}: {ent.get('status')} {ent.get('note', '')}".rstrip())
        for k in ent.get("kernels", []):
            m = k["metrics"]
            tens = {n: v for n, v in m.items() if "tensor_op" in n}
            dram = m.get("dram__bytes_read.sum.pct_of_peak_sustained_elapsed")
            pipes = {p: m.get(f"sm__inst_executed_pipe_{p}.avg.pct_of_peak_sustained_active")
                     for p in ("alu", "fma", "xu")}
            lines.append(f"  {k['kernel'][:60]}: {k['duration_us'] and round(k['duration_us'], 1)} us, "
                         f"issue {_pct(m.get('smsp__issue_active.avg.pct_of_peak_sustained_active'))}, "
                         f"warps {_pct(m.get('sm__warps_active.avg.pct_of_peak_sustained_active'))}, "
                         f"dram read {_pct(dram)}, "
                         + ", ".join(f"{p} pipe {_pct(v)}" for p, v in pipes.items()))
            for n, v in sorted(tens.items()):
                lines.append(f"    {n} = {_pct(v)}")
            st = list(k["stalls"].items())[:8]
            lines.append("    stalls (cycles / issue): " + ", ".join(f"{n} {v:.2f}" for n, v in st))
            src = k.get("source") or {}
            if src:
                ops = list(src["by_opcode"].items())[:8]
                tot = src["samples"] or 1
                lines.append("    samples by opcode: " + ", ".join(f"{o} {100 * n / tot:.0f}%" for o, n in ops))
                bc = src.get("by_count") or {}
                if bc.get("total"):
                    lines.append(f"    warp instructions issued: {bc['total']:,}; by how often "
                                 "each instruction ran (runs x instructions: share):")
                    lines.append("      " + ", ".join(
                        f"{x:,} x {k}: {100 * w / bc['total']:.1f}%"
                        for x, k, w, _n in bc["groups"][:COUNT_GROUPS_SHOWN]))
                waits = src.get("waits") or []
                if waits:
                    w_tot = sum(w["samples"] for w in waits)
                    lines.append(f"    mbarrier waits (try-wait + its branch): "
                                 f"{100 * w_tot / tot:.1f}% of samples in {len(waits)} waits")
                    for w in sorted(waits, key=lambda w: -w["samples"])[:WAITS_SHOWN]:
                        runs = "" if w["executed"] is None else f", {w['executed']} runs"
                        if w["executed"] is not None and w["retries"] is not None:
                            runs += f", {w['retries']} retry rounds"
                        lines.append(f"      {w['at']} {w['barrier']}: "
                                     f"{100 * w['samples'] / tot:.1f}%{runs}")
    return "\n".join(lines)


def load_summary(path: str) -> dict:
    """A run's summary: ``path`` a run's folder (``ncu_summary.json`` and ``ncu.tar.xz``, as
    the device writes them) or a stored ``NAME-summary.json`` beside ``NAME-csv.tar.xz``
    (``bench_results/``). Each kernel's source table is parsed again from the tar's
    ``ncu/TAG.source.csv`` where it has one (a run profiled before a field of
    :func:`parse_sources` existed gains it); a kernel whose table finds no match keeps the
    stored one."""
    if os.path.isdir(path):
        js, tar = os.path.join(path, "ncu_summary.json"), os.path.join(path, "ncu.tar.xz")
    elif path.endswith("-summary.json"):
        js, tar = path, path[:-len("-summary.json")] + "-csv.tar.xz"
    else:
        raise ValueError(f"{path}: a run's folder or a NAME-summary.json file")
    with open(js) as f:
        summary = json.load(f)
    if not os.path.exists(tar):
        return summary
    with tarfile.open(tar) as tf:
        names = set(tf.getnames())
        for tag, ent in summary.items():
            name = f"ncu/{tag}.source.csv"
            if name not in names or not ent.get("kernels"):
                continue
            fresh = [dict(k, source=None) for k in ent["kernels"]]
            attach_sources(fresh, parse_sources(tf.extractfile(name).read().decode()))
            for k, f_ in zip(ent["kernels"], fresh):
                if f_.get("source") is not None:
                    k["source"] = f_["source"]
    return summary


# ------------------------------------------------------------------ parent (on the device)

def _dump(out: str, summary: dict) -> None:
    """Write the summary so far (after every profile: a later crash keeps the rest)."""
    with open(os.path.join(out, "ncu_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


def _run(cmd, log, timeout):
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        log.write("timeout\n")
        return None
    log.write(p.stdout[-20000:] + p.stderr[-20000:] + f"\n[rc {p.returncode}]\n")
    log.flush()
    return p


def _profile(out: str, pairs, budget_s: float, ncu: str) -> dict:
    wd = os.path.join(out, "ncu")
    os.makedirs(wd, exist_ok=True)
    summary = {}
    t0 = time.time()
    with open(os.path.join(out, "ncu.log"), "w") as log:
        for backend, shape in pairs:
            tag = _tag(backend, shape)
            left = budget_s - (time.time() - t0)
            if left < 30:
                summary[tag] = {"status": "no-time"}
                _dump(out, summary)
                continue
            rep = os.path.join(wd, tag)
            p = _run([ncu, "--clock-control", "none", "--profile-from-start", "off", "--set", "full",
                      "-f", "-o", rep, sys.executable, "-m", "tools.gpu_ncu", "--child", backend, shape],
                     log, min(left, 240))
            if p is None or p.returncode != 0 or not os.path.exists(rep + ".ncu-rep"):
                summary[tag] = {"status": "failed", "note": "" if p is None else f"rc {p.returncode}"}
                _dump(out, summary)
                continue
            gate = [ln for ln in p.stdout.splitlines() if ln.startswith("gate ")]
            raw = _run([ncu, "-i", rep + ".ncu-rep", "--page", "raw", "--csv", "--print-units", "base"],
                       log, 120)
            rows = parse_raw(raw.stdout) if raw is not None and raw.returncode == 0 else []
            with open(os.path.join(wd, tag + ".raw.csv"), "w") as f:
                f.write(raw.stdout if raw is not None else "")
            if not rows:
                summary[tag] = {"status": "failed", "note": "raw page: " + (
                    "timeout" if raw is None else f"rc {raw.returncode}, no kernel row")}
                _dump(out, summary)
                continue
            kernels = [summarize_kernel(r) for r in rows]
            s = _run([ncu, "-i", rep + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                     log, 180)
            if s is not None and s.returncode == 0:
                with open(os.path.join(wd, tag + ".source.csv"), "w") as f:
                    f.write(s.stdout)
                attach_sources(kernels, parse_sources(s.stdout))
            summary[tag] = {"status": "ok", "note": gate[0] if gate else "", "kernels": kernels}
            _dump(out, summary)
    _dump(out, summary)
    with tarfile.open(os.path.join(out, "ncu.tar.xz"), "w:xz") as tf:
        tf.add(wd, arcname="ncu")
        # a second copy inside: the device tool returns at most 8 files from $OUT
        if os.path.exists(os.path.join(out, "ncu_summary.json")):
            tf.add(os.path.join(out, "ncu_summary.json"), arcname="ncu/ncu_summary.json")
    for name in os.listdir(wd):
        os.remove(os.path.join(wd, name))
    os.rmdir(wd)
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.gpu_ncu", description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="output folder ($OUT on the device)")
    ap.add_argument("--shapes", help="comma-separated bench shape names (default: %s)" % ",".join(DEFAULT_SHAPES))
    ap.add_argument("--backends", help="comma-separated backends (default: %s)" % ",".join(DEFAULT_BACKENDS))
    ap.add_argument("--no-extra", action="store_true", help="skip the dense SDPA contrast profile")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting profiles after this")
    ap.add_argument("--ncu", default=os.environ.get("NCU", "ncu"))
    ap.add_argument("--summarize", metavar="PATH",
                    help="print the tables of a run: its folder (ncu_summary.json, ncu.tar.xz) or "
                         "a stored NAME-summary.json beside NAME-csv.tar.xz; source pages read "
                         "again from the tar where there")
    ap.add_argument("--child", nargs=2, metavar=("BACKEND", "SHAPE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return _child(*a.child)
    if a.summarize:
        try:
            summary = load_summary(a.summarize)
        except (OSError, ValueError) as e:
            ap.error(str(e))
        print(table(summary))
        return 0
    if not a.out:
        ap.error("--out is required (or --summarize PATH)")
    from . import bench

    names = {s.name for s in bench.SHAPES}
    shapes = a.shapes.split(",") if a.shapes else list(DEFAULT_SHAPES)
    bad = [s for s in shapes if s not in names]
    if bad:
        ap.error(f"unknown shape(s) {bad}; bench shapes: {sorted(names)}")
    backends = a.backends.split(",") if a.backends else list(DEFAULT_BACKENDS)
    bad = check_backends(backends, shapes)
    if bad:
        ap.error("; ".join(bad))
    pairs = [(b, s) for s in shapes for b in backends] + ([] if a.no_extra else list(EXTRA))
    summary = _profile(a.out, pairs, a.budget_s, a.ncu)
    print(table(summary))
    return 0 if all(e["status"] == "ok" for e in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
