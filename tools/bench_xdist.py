"""``hils-swa bench -n N``: the shape suite spread over pytest-xdist workers, one GPU each.

No scheduler of our own: the controller (:func:`run`) calls ``pytest.main`` on
``tools/bench_suite.py`` (one test per shape) with ``-n N -p tools.bench_xdist``,
the way ``hils-swa conform -n`` runs the conformance suite.

- This module is the pytest plugin of that run. Imported first thing in every
  xdist worker (``-p``), it calls ``conformance.pinning.apply()`` before
  anything imports torch: worker ``gwK`` gets ``CUDA_VISIBLE_DEVICES`` = GPU
  ``K % len(gpus)`` of the list the controller put in ``HILS_SWA_GPUS``.
- A worker (session fixture ``bench_worker``) measures its own ceilings once,
  then times each shape xdist hands it with ``tools.bench.bench_shape`` (gate
  and ``--budget-s`` included; the budget runs from the worker's start).
- Its rows, log lines, device name, PCI bus id and ceilings travel back in
  ``report.user_properties``; :class:`Collector` (controller side) prints the
  log lines as they arrive and keeps the rows; :func:`run` merges them in the
  suite's shape order and writes the same table / JSON / markdown / plot as the
  single-process run, plus ``workers`` in the JSON. A shape whose worker died
  (or whose test failed outside the timings) gets ``error`` rows.
"""

from __future__ import annotations

import sys

from conformance import pinning

_TORCH_BEFORE_PINNING = "torch" in sys.modules
pinning.apply()  # before anything below imports torch: a worker sees its one GPU from here on

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict  # noqa: E402

import pytest  # noqa: E402

OPTION = "--hils-swa-bench"
PROP = "hils_swa_bench"
SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_suite.py")
ACTIVE = False  # set in the run's processes; bench_suite.py skips itself without it

__all__ = ["run", "resolve_workers", "main_args", "Collector", "SUITE"]


def resolve_workers(value: str | int, device: str, gpus: list[str] | None = None,
                    cores: int | None = None) -> int:
    """Number of workers for ``-n value``: ``auto`` = one per GPU (2 on CPU);
    on CUDA never more than the GPUs (two workers would share one and time each
    other) and never without a GPU list (every worker would use the same one)."""
    gpus = pinning.gpu_list() if gpus is None else gpus
    cuda = device.startswith("cuda")
    if str(value) == "auto":
        n = len(gpus) if cuda else min(2, cores or os.cpu_count() or 1)
    else:
        try:
            n = int(value)
        except ValueError:
            raise ValueError(f"-n {value!r}: a number or 'auto'") from None
        if n < 0:
            raise ValueError(f"-n {n}: a number >= 0 or 'auto'")
    if cuda and n > 1:
        if device != "cuda":
            raise ValueError(f"--device {device} with -n: each worker sees its own GPU as 'cuda'; pass --device cuda")
        if not gpus:
            raise ValueError("-n on CUDA needs the GPU list (CUDA_VISIBLE_DEVICES, HILS_SWA_GPUS or nvidia-smi -L) "
                             "to pin one GPU per worker; none found")
        if n > len(gpus):
            raise ValueError(f"-n {n} but {len(gpus)} GPU(s) [{','.join(gpus)}]: more workers than GPUs would time "
                             "two shapes on one GPU at once; use -n auto or at most -n " + str(len(gpus)))
    return n


def shape_ids(names: list[str]) -> list[str]:
    """pytest ids of the shape tests: suite position + name (``/`` -> ``_``)."""
    return [f"{i:02d}-{n.replace('/', '_')}" for i, n in enumerate(names)]


def main_args(cfg: dict, n: int) -> list[str]:
    """The ``pytest.main`` arguments of a run (``cfg``: see :func:`run`)."""
    return [SUITE, "-p", "tools.bench_xdist", "--noconftest", "-p", "no:cacheprovider", "-p", "no:benchmark",
            "-o", "addopts=",
            "-q", "--no-header", "--assert=plain", "--tb=short", "-n", str(n), "--dist", "load", OPTION, json.dumps(cfg)]


# ------------------------------------------------------------------ plugin

def pytest_addoption(parser):
    parser.addoption(OPTION, dest="hils_swa_bench", default=None, metavar="JSON",
                     help="(set by hils-swa bench -n) shapes, backends, device, reps, budget of the run")


def _cfg(config) -> dict | None:
    raw = config.getoption("hils_swa_bench", default=None)
    return json.loads(raw) if raw else None


def pytest_configure(config):
    global ACTIVE
    ACTIVE = _cfg(config) is not None


def pytest_generate_tests(metafunc):
    # Without the option tools/bench_suite.py skips at import: cfg is set here.
    # Scheduling is xdist's own ``--dist load`` (main_args): shapes go to whichever
    # worker is free.
    if "bench_shape" in metafunc.fixturenames:
        cfg = _cfg(metafunc.config)
        metafunc.parametrize("bench_shape", cfg["shapes"], ids=shape_ids(cfg["shapes"]))


@pytest.fixture(scope="session")
def bench_worker(request) -> dict:
    """This worker's device, timer and ceilings (measured once)."""
    cfg = _cfg(request.config)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        t_start = time.perf_counter()
        import torch

        from conformance.plugin import worker_info

        from . import bench
        from ._common import pick_device

        device = pick_device(cfg["device"])
        if cfg.get("flex_static"):
            from . import flex_backend

            flex_backend.DYNAMIC = False
        timer = bench.Timer(device, cfg["reps"])
        info = dict(worker_info())
        idx, count = pinning.worker_index(), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
        info.update(device_name=bench.describe_device(device),
                    torch_imported_before_pinning=_TORCH_BEFORE_PINNING,
                    # xdist replaces a crashed worker with gw<count+k>: pinned by index, it may share a GPU
                    replacement=idx is not None and idx >= count > 0)
        wid = info["worker"]
        bench._log(f"[{wid}] {info['device_name']} (CUDA_VISIBLE_DEVICES={info['cuda_visible_devices']}, "
                   f"pci {info.get('pci_bus_id') or '-'})")
        ceilings = bench.measure_ceilings(timer, torch.bfloat16, t_start)
    return dict(cfg=cfg, device=device, timer=timer, t_start=t_start, info=info, ceilings=ceilings,
                log=buf.getvalue(), shapes=[])


def run_shape(request, name: str, w: dict) -> None:
    """Time every backend on shape ``name`` in this worker; the result goes to
    the controller through ``user_properties``."""
    import torch

    from . import bench

    cfg = w["cfg"]
    shape = next(s for s in bench.shape_pool(cfg["smoke"]) if s.name == name)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rows = bench.bench_shape(shape, cfg["backends"], w["device"], torch.bfloat16, w["timer"], w["ceilings"],
                                 w["t_start"], cfg["budget_s"])
    for r in rows:
        r.extra["worker"] = w["info"]["worker"]
    log, w["log"] = w["log"] + buf.getvalue(), ""  # the first shape also carries the ceiling lines
    w["shapes"].append(name)
    worker = dict(w["info"], ceilings=w["ceilings"], shapes=list(w["shapes"]),
                  wall_s=round(time.perf_counter() - w["t_start"], 1))
    payload = dict(shape=name, rows=[asdict(r) for r in rows], log=log, worker=worker)
    request.node.user_properties.append((PROP, json.dumps(payload, default=str)))


# -------------------------------------------------------------- controller

class Collector:
    """Controller side: rows and worker info from the reports, progress lines."""

    def __init__(self, names: list[str]):
        self.ids = dict(zip(shape_ids(names), names))
        self.rows: dict[str, list[dict]] = {}
        self.failed: dict[str, str] = {}
        self.workers: dict[str, dict] = {}
        self.tr = None

    def pytest_configure(self, config):
        self.tr = config.pluginmanager.get_plugin("terminalreporter")

    def _write(self, text: str, wid: str) -> None:
        for line in text.rstrip("\n").splitlines():
            line = line if line.startswith("[") else f"[{wid}] {line}"
            if self.tr is not None:
                self.tr.write_line(line)
            else:
                print(line, flush=True)

    def _name(self, nodeid: str) -> str | None:
        if not nodeid.endswith("]") or "[" not in nodeid:
            return None
        return self.ids.get(nodeid[nodeid.index("[") + 1:-1])

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report, config):
        if self._name(report.nodeid) and report.when in ("call", "???"):  # no progress dots among the log lines
            return report.outcome, "", report.outcome.upper()
        return None

    def pytest_runtest_logreport(self, report):
        name = self._name(report.nodeid)
        if name is None or name in self.rows or name in self.failed:
            return
        gw = getattr(getattr(report, "node", None), "gateway", None)
        wid = getattr(gw, "id", None) or "main"
        got = [p for k, p in report.user_properties if k == PROP]
        if got and report.when == "call":
            p = json.loads(got[-1])
            self.rows[name] = p["rows"]
            self.workers[p["worker"]["worker"]] = p["worker"]
            self._write(p["log"], p["worker"]["worker"])
        elif report.when == "???" or report.failed:
            what = "died (crash, abort or killed)" if report.when == "???" else f"{report.when} failed"
            last = [ln for ln in str(report.longrepr).strip().splitlines() if ln.strip()]
            self.failed[name] = f"worker {wid} {what}: {last[-1][:200] if last else ''}"
            self._write(f"{name}: error ({self.failed[name]})", wid)

    def merged(self, shapes, backends: list[str], pytest_rc: int) -> list:
        """Rows in suite order; a shape without a result gets one row per backend."""
        from .bench import Result

        out = []
        for s in shapes:
            if s.name in self.rows:
                out += [Result(**r) for r in self.rows[s.name]]
                continue
            if s.name in self.failed:
                status, reason = "error", self.failed[s.name]
            elif pytest_rc == 2:
                status, reason = "skipped", "run interrupted before this shape finished"
            else:
                status, reason = "error", f"no result from any worker (pytest exit status {pytest_rc})"
            out += [Result(s.name, s.kind, b, status, reason) for b in backends]
        return out

    def ceilings(self) -> dict:
        """Median of the workers' ceilings (each row's percentages use its own worker's)."""
        out = dict(matmul_dtype="bf16")
        for key in ("matmul_tflops", "copy_gbps"):
            vals = [w["ceilings"][key] for w in self.workers.values() if w.get("ceilings", {}).get(key)]
            if vals:
                out[key] = statistics.median(vals)
        return out


def run(args, device: str, shapes: list, backends: list[str], reps: int, n: int) -> int:
    """The ``-n`` path of ``hils-swa bench``: pytest.main over the shapes, then
    the single-process run's outputs from the merged rows."""
    from . import bench

    t_start = time.perf_counter()
    cfg = dict(shapes=[s.name for s in shapes], smoke=bool(args.smoke), backends=backends, device=device,
               reps=reps, budget_s=args.budget_s, flex_static=bool(args.flex_static))
    gpus = os.environ.get(pinning.GPUS_VAR, "")
    bench._log(f"hils-swa bench -n {n} on {device} (pytest-xdist, one worker per GPU; GPUs [{gpus}]): "
               f"{len(shapes)} shapes x {len(backends)} backends ({', '.join(backends)}), {reps} reps, "
               f"budget {args.budget_s:.0f} s per worker")
    collector = Collector(cfg["shapes"])
    rc = int(pytest.main(main_args(cfg, n), plugins=[collector]))
    results = collector.merged(shapes, backends, rc)
    workers = dict(sorted(collector.workers.items(), key=lambda kv: (len(kv[0]), kv[0])))
    names = [w["device_name"] for w in workers.values()]
    name = (f"{len(names)} x {names[0]}" if len(set(names)) == 1 else " + ".join(names)) if names else "no worker"
    info = bench.run_info(device, reps, args.commit, device_name=name)
    info.update(workers=len(workers), pytest_exit_status=rc,
                workers_note=f"Run with `hils-swa bench -n {n}`: shapes spread over {len(workers)} pytest-xdist "
                             "workers, one GPU each (" + ", ".join(
                                 f"{wid}: {w.get('pci_bus_id') or w.get('cuda_visible_devices') or '-'}"
                                 for wid, w in workers.items()) + "); each row's percentages are of its own "
                             "worker's ceilings, the ceilings quoted here are the workers' median; time budget "
                             "per worker.")
    info["wall_s"] = round(time.perf_counter() - t_start, 1)
    bench.write_outputs(args, results, info, collector.ceilings(), shapes, workers=workers)
    if rc not in (0, 1):
        bench._log(f"pytest exit status {rc}")
    return bench.exit_status(results)
