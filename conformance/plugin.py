"""The pytest plugin behind the conformance suite and ``hils-swa conform``.

Loaded by the repo-root ``conftest.py`` (``pytest_plugins``) and by the CLI
(``-p conformance.plugin``). It

- registers the options ``--backend``, ``--only``, ``--device``, ``--tier``,
  ``--seed``, ``--conform-json``;
- parametrizes ``conformance/test_conformance.py`` with one check per
  (case, backend) and per (case, pair of backends), ids ``<case id>-<backend>``
  and ``<case id>-<a>~<b>``;
- schedules all checks of a case on one xdist worker, in order, so the pair
  checks reuse the worker's cached outputs (``CaseScheduling``);
- collects every check's result (also from xdist workers, through
  ``report.user_properties``), prints the matrix (categories x backends and
  pairs), and writes the JSON report.
"""

from __future__ import annotations

from . import pinning

pinning.apply()  # before anything below imports torch

import contextlib  # noqa: E402
import faulthandler  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import secrets  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from itertools import combinations  # noqa: E402
from typing import Callable  # noqa: E402

import pytest  # noqa: E402

SEED_VAR = "HILS_SWA_SEED"
RUN_DIR_VAR = "HILS_SWA_RUN_DIR"
PROP = "hils_swa"
_KEY = pytest.StashKey[dict]()


# ------------------------------------------------------------------ options

def pytest_addoption(parser):
    g = parser.getgroup("hils-swa", "hils-swa conformance suite")
    g.addoption("--backend", action="append", dest="conform_backends", default=None, metavar="SPEC",
                help="backend to check (registered name, entry point, package.module:function or "
                     "mutant:NAME); repeatable; default: the registry's defaults")
    g.addoption("--only", action="append", dest="conform_only", default=None, metavar="NAMES",
                help="comma-separated categories, case ids or id globs to run (repeatable)")
    g.addoption("--exclude", action="append", dest="conform_exclude", default=None, metavar="NAMES",
                help="comma-separated categories, case ids or id globs to leave out (repeatable; "
                     "applied after --only)")
    g.addoption("--where", action="append", dest="conform_where", default=None, metavar="EXPR",
                help="keep the cases for which EXPR holds, over the case's fields (Lq, Dqk, dtype, "
                     "layout, ...), e.g. \"Lq > 64 and max(Dqk, Dv) <= 128\" (repeatable: all must "
                     "hold; after --only and --exclude)")
    g.addoption("--device", dest="conform_device", default="auto", choices=("auto", "cpu", "cuda"),
                help="device of the cases: cuda when available, else cpu (default auto)")
    g.addoption("--tier", dest="conform_tier", default="quick", choices=("quick", "full"),
                help="quick: pairwise covering subset (default); full: the full product")
    g.addoption("--seed", dest="conform_seed", default=None,
                help=f"run seed of the inputs: an int or 'random' (default: ${SEED_VAR}, else 0; "
                     f"printed in the report)")
    g.addoption("--conform-json", dest="conform_json", default=None, metavar="PATH",
                help="write the per-check results and the matrix as JSON")
    g.addoption("--conform-commit", dest="conform_commit", default=None, metavar="LABEL",
                help="the commit the JSON report names (default: git describe --always --dirty "
                     "of the checkout, tools._common.commit_label)")
    g.addoption("--check-timeout", dest="conform_check_timeout", default=None, type=float, metavar="S",
                help="watchdog per check: an xdist worker stuck longer than S seconds (a hung kernel) "
                     "dumps its stack and exits, xdist reports the check failed and starts a new worker "
                     "(default: 300 for CUDA cases under xdist, else off; 0 = off)")
    g.addoption("--conform-progress", dest="conform_progress", action="store_true", default=False,
                help="progress bar instead of pytest's per-test output (used by hils-swa conform)")


def _device(config) -> str:
    from .cases import resolve_device

    try:
        return resolve_device(config.getoption("conform_device"))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): group tests on one xdist worker")
    seed = config.getoption("conform_seed")
    if seed is None:
        seed = os.environ.get(SEED_VAR) or "0"
    if seed == "random":
        seed = str(secrets.randbelow(2**31))
    try:
        seed = int(seed)
    except ValueError:
        raise pytest.UsageError(f"--seed must be an int or 'random', got {seed!r}") from None
    os.environ[SEED_VAR] = str(seed)  # inherited by the xdist workers spawned later
    if not _is_worker(config):  # each run (controller) gets its own in-flight marker directory
        import tempfile

        os.environ[RUN_DIR_VAR] = tempfile.mkdtemp(prefix="hils-swa-run-")
    want = config.getoption("conform_device")
    if want == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        if "triton_impl" in sys.modules:
            raise pytest.UsageError("--device cpu: triton_impl was imported before TRITON_INTERPRET=1 could be set")
        os.environ["TRITON_INTERPRET"] = "1"
    state = dict(seed=seed, device=None, tier=config.getoption("conform_tier"))
    config.stash[_KEY] = state
    if not _is_worker(config):
        config.pluginmanager.register(Collector(config), "hils_swa_collector")


def _state(config) -> dict:
    st = config.stash[_KEY]
    if st["device"] is None:
        st["device"] = _device(config)
    return st


def backends(config) -> dict:
    """name -> Backend of the run."""
    st = config.stash[_KEY]
    if "backends" not in st:
        specs = config.getoption("conform_backends")
        from .runner import resolve_backends

        try:
            st["backends"] = resolve_backends(split_names(specs))
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
    return st["backends"]


# the case selection (--only / --exclude / --where) lives in conformance.selection, which the
# CLI imports before pytest starts: a plugin module imported that early warns that its
# asserts cannot be rewritten (PytestAssertRewriteWarning)
from .selection import select, split_names  # noqa: E402


def names_of(config, dest: str) -> list[str]:
    """:func:`split_names` of a pytest option."""
    return split_names(config.getoption(dest))


#: what a case is, axis by axis, to tell a backend's failing cases from its passing ones
_AXES: tuple[tuple[str, Callable], ...] = (
    ("category", lambda c: c.category),
    ("dtype", lambda c: c.dtype),
    ("Hq/Hkv", lambda c: c.Hq // c.Hkv if c.Hkv else "-"),
    ("Dqk x Dv", lambda c: f"{c.Dqk}x{c.Dv}"),
    ("Lq", lambda c: "1" if c.Lq == 1 else "Lk" if c.Lq == c.Lk else "< Lk"),
    ("window", lambda c: c.window),
    ("chunk", lambda c: c.chunk),
    ("mask_lmk, expand", lambda c: f"{int(c.mask_lmk)}{int(c.expand)}"),
    ("kv_start % chunk", lambda c: "0" if c.kv_start % c.chunk == 0 else "not 0"),
    ("kv_start", lambda c: c.kv_start),
    ("layout", lambda c: c.layout),
    ("sm_scale", lambda c: "default" if c.sm_scale is None else "given"),
    ("non-finite inputs", lambda c: "+".join(n for n in ("nan_slots", "nan_seen", "inf_seen", "nan_v")
                                             if getattr(c, n)) or "none"),
    ("kv_start, window or chunk past 2^62", lambda c: max(c.kv_start, c.window, c.chunk) >= 2**62),
)


def _calls(cases: list) -> list:
    """The cases that are calls (error cases left out: they have no axes to compare)."""
    return [c for c in cases if c.error is None]


def separating_axes(failing: list, passing: list, most: int = 3) -> list[str]:
    """The axes on which no failing case shares a value with a passing one (cases of one
    backend; error cases left out), fewest failing values first: "which inputs exactly"."""
    failing, passing = _calls(failing), _calls(passing)
    found = []
    for name, f in _AXES:
        vf, vp = {f(c) for c in failing}, {f(c) for c in passing}
        if vf and vp and not vf & vp:
            shown = ", ".join(sorted(map(str, vf))[:6]) + (", ..." if len(vf) > 6 else "")
            found.append((len(vf), f"{name} {shown}"))
    return [text for _, text in sorted(found, key=lambda t: t[0])[:most]]


def shared_values(failing: list, passing: list, most: int = 3) -> list[str]:
    """Where no axis separates (:func:`separating_axes`): the axes on which every failing
    case has one value, with how many passing cases have it too, rarest first."""
    failing, passing = _calls(failing), _calls(passing)
    found = []
    for name, f in _AXES:
        vf = {f(c) for c in failing}
        if len(vf) == 1 and failing:
            (val,) = vf
            n = sum(f(c) == val for c in passing)
            if n < len(passing):  # a value every case has says nothing
                found.append((n, f"{name} {val} (as have {n} of the {len(passing)} passing)"))
    return [text for _, text in sorted(found, key=lambda t: t[0])[:most]]


def diff_hints(fails: list[dict], device: str, most: int = 4, specs: dict | None = None) -> list[str]:
    """What to run next on failures: ``hils-swa diff`` names the SPEC rule a backend breaks.
    Each backend that fails alone is diffed against the reference; where only pairs fail
    (every backend conforms alone, two disagree within tolerance of the truth), the pair.
    ``specs``: backend name -> what ``--backend`` resolves (``registry.spec_of``)."""
    def spec(name: str) -> str:
        s = (specs or {}).get(name, name)
        return shlex.quote(s)

    alone = {r["who"] for r in fails if not r["pair"]}
    singles = sorted(alone - {"reference"})
    if alone and not singles:
        return []  # the reference alone fails: the yardstick's problem, not a rule diff can name
    pairs = sorted({r["who"] for r in fails if r["pair"]})
    cmds = ([f"hils-swa diff reference {spec(who)} --device {device}" for who in singles] if singles else
            [f"hils-swa diff {' '.join(spec(w) for w in who.split('~'))} --device {device}" for who in pairs])
    if not cmds:
        return []
    more = f" (and {len(cmds) - most} more)" if len(cmds) > most else ""
    return ["which SPEC rule differs:"] + [f"  {c}" for c in cmds[:most]] + ([f"  ...{more}"] if more else [])


def plan(config) -> list:
    """Every check of the run, grouped by case: singles, then pairs."""
    from .cases import generate
    from .runner import Check

    st = _state(config)
    try:
        cases = select(generate(st["tier"], st["device"]), names_of(config, "conform_only"),
                       f" of the {st['tier']} tier on {st['device']}", names_of(config, "conform_exclude"),
                       config.getoption("conform_where"))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    names = list(backends(config))
    out = []
    for case in cases:
        out += [Check(case, (n,)) for n in names]
        out += [Check(case, pair) for pair in combinations(names, 2)]
    return out


def _whos(config) -> list[str]:
    names = list(backends(config))
    return names + ["~".join(p) for p in combinations(names, 2)]


def pytest_generate_tests(metafunc):
    if "conform_check" in metafunc.fixturenames:
        checks = plan(metafunc.config)
        metafunc.parametrize("conform_check", checks, ids=[c.id for c in checks])


_RUNNER = pytest.StashKey()  # this process's conformance Runner, once the fixture made it


@pytest.fixture(scope="session")
def conform_runner(request):
    from .runner import Runner

    runner = Runner(backends(request.config), _state(request.config)["seed"])
    request.config.stash[_RUNNER] = runner
    return runner


def pytest_runtest_teardown(item, nextitem):
    """After a heavy case's last check on this process (the next test is not a check of the
    same case, or there is none), its state goes and its GPU memory slot with it
    (``runner.Runner.release``). Otherwise a worker whose last check was that case would
    keep the slot until the whole run ends (xdist keeps a finished worker's process) and a
    worker waiting for it would wait as long (session 36's review found that deadlock)."""
    runner = item.config.stash.get(_RUNNER, None)
    if runner is None or runner.slot_case is None:
        return
    spec = getattr(nextitem, "callspec", None)
    check = spec.params.get("conform_check") if spec is not None else None
    if check is None or check.case.id != runner.slot_case:
        runner.release()


_WORKER_INFO: dict | None = None


def worker_info() -> dict:
    """Where this process runs: xdist worker id, CUDA_VISIBLE_DEVICES, GPU name and PCI bus id."""
    global _WORKER_INFO
    if _WORKER_INFO is None:
        import torch

        info = dict(worker=os.environ.get("PYTEST_XDIST_WORKER", "main"),
                    cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                    triton_interpret=os.environ.get("TRITON_INTERPRET"), device="cpu")
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info.update(device=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                        uuid=str(getattr(p, "uuid", "")) or None, pci_bus_id=_pci_bus_id(p))
        _WORKER_INFO = info
    return _WORKER_INFO


def _pci_bus_id(props) -> str | None:
    """PCI bus id of visible GPU 0, from torch when it has it, else nvidia-smi."""
    if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    import subprocess

    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", first],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out or None
    except (OSError, subprocess.SubprocessError):
        return None


@contextlib.contextmanager
def watchdog(config):
    """Exit this xdist worker if one check runs longer than ``--check-timeout``."""
    t = config.getoption("conform_check_timeout")
    if t is None:
        t = 300.0 if (_is_worker(config) and _state(config)["device"].startswith("cuda")) else 0.0
    if t <= 0:
        yield
        return
    faulthandler.dump_traceback_later(t, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _report_worker(report) -> str:
    """The xdist worker (``gw3``) a report came from on the controller, else ``main``."""
    gateway = getattr(getattr(report, "node", None), "gateway", None)
    return getattr(gateway, "id", None) or "main"


def _result_worker(r: dict) -> str:
    """The worker of a recorded result (``record`` stores :func:`worker_info`, a dict)."""
    return (r.get("worker") or {}).get("worker") or "main"


def record(request, result) -> None:
    payload = result.payload()
    payload["worker"] = worker_info()
    request.node.user_properties.append((PROP, payload))


# --------------------------------------------------------------- scheduling

def kernel_group(case_id: str) -> str:
    """Checks that most likely share compiled kernels: same dtype, head dims,
    flags, layout and decode-or-not (parsed from the case id)."""
    parts = case_id.split("-")
    if case_id.startswith("err-") or len(parts) < 9:
        return case_id
    dtype, qk, dims, flags, layout = parts[0], parts[3], parts[4], parts[6], parts[8]
    return "-".join([dtype, dims, flags, layout, "dec" if qk.startswith("q1k") else "pre"])


@pytest.hookimpl(optionalhook=True)  # xdist's hook: pytest runs without it under -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    """All checks of one case go to one worker, in collection order (the pair
    checks then reuse its outputs), and all cases of one kernel configuration
    (:func:`kernel_group`) go to one worker, so each kernel is compiled once."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    suffixes = sorted(("-" + w for w in _whos(config)), key=len, reverse=True)
    # by kernel on CUDA and on the CPU alike (TileLang's C kernels compile 2.5-4.5 s each:
    # the CPU quick tier cold took 242 s on 2 workers by case and 219 s by kernel, session 34)

    class CaseScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if "test_conformance.py::" in nodeid and nodeid.endswith("]") and "[" in nodeid:
                param = nodeid[nodeid.index("[") + 1:-1]
                for s in suffixes:
                    if param.endswith(s):
                        cid = param[: -len(s)]
                        return "case:" + kernel_group(cid)
            return nodeid

        def _assign_work_unit(self, node) -> None:
            # a worker that replaces a crashed one (watchdog) may be asked for
            # work before its collection is registered: it gets work when it is
            if node in self.registered_collections:
                super()._assign_work_unit(node)

    return CaseScheduling(config, log)


# ---------------------------------------------------------------- reporting

class Collector:
    """Controller-side: gathers results, draws progress, prints the matrix, writes JSON."""

    def __init__(self, config):
        self.config = config
        self.results: list[dict] = []
        self._seen: set[tuple[str, str]] = set()
        self.total = 0
        self.done = 0
        self.failed = 0
        self.errors: list[str] = []  # non-conformance failures (setup errors etc.)
        self.error_workers: list[str] = []  # the xdist worker of each error ("main" without)
        self.t0 = time.time()
        self.progress = config.getoption("conform_progress")
        self._last_pct = -1

    # totals ---------------------------------------------------------------
    def _count(self, ids) -> int:
        return sum(1 for i in ids if "test_conformance.py::" in i)

    def pytest_collection_finish(self, session):
        if not self.total:
            self.total = self._count(i.nodeid for i in session.items)

    @pytest.hookimpl(optionalhook=True)  # xdist's hook, as above
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.total = max(self.total, self._count(ids))

    # results --------------------------------------------------------------
    def pytest_collectreport(self, report):
        if report.failed:
            text = getattr(report, "longreprtext", "") or str(report.longrepr)
            self.errors.append(f"collection error in {report.nodeid or '.'}: {text.strip()[-1500:]}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report, config):
        if self.progress and "test_conformance.py::" in report.nodeid and report.when == "call":
            if hasattr(report, "wasxfail"):  # a documented deviation (registry.Deviation)
                return "xfailed", "", "XFAIL"
            return report.outcome, "", report.outcome.upper()
        return None

    def pytest_runtest_logreport(self, report):
        if "test_conformance.py::" not in report.nodeid:
            return
        got = [p for k, p in report.user_properties if k == PROP]
        if report.when == "???":  # xdist: the worker died (watchdog, abort, segfault) during this check
            got = [self._crashed(report)]
        if report.when in ("call", "???") or (report.when == "setup" and not report.passed):
            if got:
                key = (got[-1]["case"], got[-1]["who"])
                if key in self._seen:  # xdist reran a crashed check: the crash report stands
                    return
                self._seen.add(key)
            self.done += 1
            if got:
                self.results.append(got[-1])
                self.failed += got[-1]["status"] == "fail"
                self._stream(got[-1])
            elif not report.passed:
                self.failed += 1
                text = str(report.longrepr)
                wid = _report_worker(report)
                self.error_workers.append(wid)
                self.errors.append(f"{report.nodeid} [{wid}]: {report.when} {report.outcome}: "
                                   f"{text[-800:]}")
            self._draw()

    def _crashed(self, report) -> dict:
        """A failed result for a check whose worker died, placed by its id."""
        if not hasattr(self, "_ids"):
            self._ids = {c.id: c for c in plan(self.config)}
        param = report.nodeid[report.nodeid.find("[") + 1:-1] if report.nodeid.endswith("]") else report.nodeid
        chk = self._ids.get(param)
        case, cat, who = (chk.case.id, chk.case.category, chk.who) if chk else (param, "?", "?")
        msg = (f"{case} [{who}]: FAIL (crash)\n  - crash: the worker died during this check "
               f"(watchdog --check-timeout, abort or segfault): {str(report.longrepr)[:300]}")
        return dict(case=case, category=cat, who=who, pair="~" in who, status="fail", kinds=["crash"],
                    ratio="inf", message=msg, seconds=None, details={},
                    worker=dict(worker=_report_worker(report)))

    def _stream(self, payload: dict) -> None:
        """Append each result to ``<json>.partial.jsonl`` as it arrives, so a run
        killed by a time limit still leaves its results."""
        path = self.config.getoption("conform_json")
        if not path:
            return
        if not hasattr(self, "_jsonl"):
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._jsonl = open(path + ".partial.jsonl", "w")
        self._jsonl.write(json.dumps(payload, default=str) + "\n")
        self._jsonl.flush()

    def _draw(self, final: bool = False) -> None:
        if not self.progress or not self.total or (final and self._last_pct == 100):
            return
        tw = self.config.get_terminal_writer()
        frac = min(1.0, self.done / self.total)
        pct = int(frac * 100)
        el = time.time() - self.t0
        eta = el / frac - el if frac > 0 else 0
        bar = "#" * int(frac * 30) + "." * (30 - int(frac * 30))
        line = f"[{bar}] {self.done}/{self.total} {pct:3d}%  failed {self.failed}  {el:5.0f}s  eta {eta:4.0f}s"
        tty = getattr(getattr(tw, "_file", None), "isatty", lambda: False)()
        if tty:
            tw.write("\r" + line + ("\n" if final else ""), flush=True)
        elif final or pct // 10 != self._last_pct // 10:
            tw.write(line + "\n", flush=True)
        self._last_pct = pct

    # matrix ---------------------------------------------------------------
    #: a check's status -> the count it adds to in a matrix cell
    _COUNT = {"pass": "passed", "fail": "failed", "unsupported": "unsupported", "deviates": "deviates"}

    @classmethod
    def _new_cell(cls) -> dict:
        return dict.fromkeys(cls._COUNT.values(), 0) | dict(worst_ratio=None)

    def matrix(self) -> dict:
        cells: dict = defaultdict(self._new_cell)
        cats: list[str] = []
        whos: list[str] = []
        for r in self.results:
            if r["category"] not in cats:
                cats.append(r["category"])
            if r["who"] not in whos:
                whos.append(r["who"])
            c = cells[(r["category"], r["who"])]
            c[self._COUNT[r["status"]]] += 1
            ratio = r["ratio"]
            if ratio is not None and r["status"] in ("pass", "fail"):
                ratio = math.inf if ratio == "inf" else float(ratio)
                c["worst_ratio"] = ratio if c["worst_ratio"] is None else max(c["worst_ratio"], ratio)
        from .cases import CATEGORIES

        order = [c.name for c in CATEGORIES]
        cats.sort(key=lambda n: order.index(n) if n in order else len(order))
        singles = [w for w in whos if "~" not in w]
        pairs = [w for w in whos if "~" in w]
        return dict(categories=cats, columns=singles + pairs,
                    cells={f"{k[0]}|{k[1]}": v for k, v in cells.items()})

    @classmethod
    def _cell(cls, c: dict | None) -> str:
        if not c:
            return "-"
        n = sum(c[f] for f in cls._COUNT.values())
        s = f"{c['passed']}/{n}"
        if c["failed"]:
            s += f" F{c['failed']}"
        if c["unsupported"]:
            s += f" U{c['unsupported']}"
        if c["deviates"]:
            s += f" D{c['deviates']}"
        r = c["worst_ratio"]
        if r is not None:
            s += " r" + ("inf" if math.isinf(r) else f"{r:.2g}")
        return s

    def render(self) -> list[str]:
        m = self.matrix()
        if not m["columns"]:
            return []
        cols = m["columns"]
        rows = [[cat] + [self._cell(m["cells"].get(f"{cat}|{w}")) for w in cols] for cat in m["categories"]]
        tot = defaultdict(self._new_cell)
        for key, c in m["cells"].items():
            t = tot[key.split("|", 1)[1]]
            for f in self._COUNT.values():
                t[f] += c[f]
            if c["worst_ratio"] is not None:
                t["worst_ratio"] = c["worst_ratio"] if t["worst_ratio"] is None else max(t["worst_ratio"], c["worst_ratio"])
        rows.append(["ALL"] + [self._cell(tot.get(w)) for w in cols])
        head = ["category"] + cols
        width = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
        fmt = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, width))  # noqa: E731
        lines = [fmt(head), fmt(["-" * w for w in width])] + [fmt(r) for r in rows]
        lines.append("cell: passed/total, F failed, U unsupported, D deviates as documented (a known bug, "
                     "conformance.registry), r worst error/bound ratio (<= 1 passes; in a pair column with F, "
                     "the measured |a - b| over twice the bound)")
        return lines

    def idle_backends(self) -> dict[str, int]:
        """``{backend: cases}`` of the backends that served none of their cases (every one
        ``unsupported``): a run that checked nothing of them must not pass."""
        seen: dict[str, list[str]] = defaultdict(list)
        for r in self.results:
            if not r["pair"]:
                seen[r["who"]].append(r["status"])
        return {who: len(s) for who, s in seen.items() if s and all(x == "unsupported" for x in s)}

    def pytest_terminal_summary(self, terminalreporter):
        if not self.results and not self.errors:
            return
        self._draw(final=True)
        tr = terminalreporter
        st = _state(self.config)
        tr.section("hils-swa conformance")
        tr.write_line(f"tier {st['tier']}  device {st['device']}  run seed {st['seed']}  "
                      f"(reproduce: --seed {st['seed']})  {len(self.results)} checks in {time.time() - self.t0:.0f}s")
        from .cases import left_out
        for why in left_out(st["device"]):
            tr.write_line(f"left out on {st['device']}: {why}")
        for line in self.render():
            tr.write_line(line)
        fails = [r for r in self.results if r["status"] == "fail"]
        unsup = defaultdict(int)
        for r in self.results:
            if r["status"] == "unsupported" and not r["pair"]:
                unsup[(r["who"], r["message"].split("unsupported: ", 1)[-1])] += 1
        if unsup:
            tr.write_line("unsupported:")
            for (who, why), n in sorted(unsup.items()):
                tr.write_line(f"  {who}: {n} cases: {why}")
        devs = defaultdict(int)
        for r in self.results:
            if r["status"] == "deviates" and not r["pair"]:
                devs[(r["who"], r["details"]["deviation"])] += 1
        if devs:
            tr.write_line("known deviations (documented bugs; they fail as documented):")
            for (who, why), n in sorted(devs.items()):
                tr.write_line(f"  {who}: {n} cases: {why}")
        singles = [r for r in fails if not r["pair"]]
        shown = singles or fails
        if shown:
            tr.write_line(f"failures ({len(fails)}, first {min(len(shown), 40)} shown"
                          f"{' singles' if singles else ''}):")
            for r in shown[:40]:
                tr.write_line(r["message"])
        if fails:
            self._failure_pointers(tr, fails, st["device"])
        if self.errors:
            tr.write_line(f"errors outside the checks ({len(self.errors)}):")
            for e in self.errors[:20]:
                tr.write_line(e)
        note = self.one_worker_note()
        if note:
            tr.write_line(note)
        for who, n in sorted(self.idle_backends().items()):
            tr.write_line(f"FAILED: {who} served none of its {n} cases (all unsupported): nothing "
                          "of it was checked")

    def by_worker(self) -> tuple[dict[str, int], set[str]]:
        """Failed single checks and errors outside the checks per worker, and every worker
        that reported a result."""
        bad: dict[str, int] = defaultdict(int)
        ran = {_result_worker(r) for r in self.results} | set(self.error_workers)
        for r in self.results:
            if r["status"] == "fail" and not r["pair"]:
                bad[_result_worker(r)] += 1
        for w in self.error_workers:
            bad[w] += 1
        return dict(bad), ran

    def one_worker_note(self) -> str | None:
        """A line when every failure and error of a run of several workers came from one of
        them and some of them are not a kernel's wrong answer: an error outside the checks
        (a call that failed before its check, inputs that could not be made) or a failed
        check of the reference. The cause may then be that process's state, not its cases.
        Check failures alone say nothing of the kind: the scheduler gives all cases of one
        kernel to one worker (``kernel_group``), so a broken kernel fails in one worker too.
        Session 43: one worker's fp32 kernel could not get the stack its launch needed (CUDA
        out of memory), and the fp32 calls after it failed too, the reference's included;
        session 41 had put the same failures down to the machine."""
        bad, ran = self.by_worker()
        if len(bad) != 1 or len(ran) < 2:
            return None
        (w, n), = bad.items()
        harness = self.error_workers.count(w) + sum(
            r["status"] == "fail" and not r["pair"] and r["who"] == "reference" for r in self.results)
        if n < 2 or not harness:
            return None
        return (f"all {n} failures and errors above came from one worker, {w}, of the {len(ran)} "
                f"that ran: suspect that process's state (a CUDA error that outlives its call, "
                f"memory it holds), not only its cases; rerun the cases in a fresh process "
                f"(hils-swa conform --only <case ids>)")

    def _failure_pointers(self, tr, fails: list[dict], device: str) -> None:
        """After the failures: what each failing backend's failing cases share (axes no
        passing case of it has), then the ``hils-swa diff`` command that names the rule."""
        singles = [r for r in fails if not r["pair"]]
        by_id = {(c.case.category, c.case.id): c.case for c in plan(self.config) if not c.is_pair}
        for who in sorted({r["who"] for r in singles}):
            split = {"fail": [], "pass": []}
            for r in self.results:
                key = (r["category"], r["case"])
                if r["who"] == who and r["status"] in split and key in by_id:
                    split[r["status"]].append(by_id[key])
            bad, good = split["fail"], split["pass"]
            axes = separating_axes(bad, good)
            if bad and good and axes:
                tr.write_line(f"what {who}'s {len(bad)} failing cases share, that none of its {len(good)} "
                              f"passing cases has: " + "; ".join(axes))
            elif bad and good:
                common = shared_values(bad, good)
                tr.write_line(f"no single parameter separates {who}'s {len(bad)} failing cases from its "
                              f"{len(good)} passing ones" + (f"; every failing case has {'; '.join(common)}"
                                                             if common else ""))
        from .registry import spec_of
        specs = {name: spec_of(b) for name, b in backends(self.config).items()}
        for line in diff_hints(fails, device, specs=specs):
            tr.write_line(line)

    def pytest_sessionfinish(self, session, exitstatus):
        import shutil

        if self.idle_backends() and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

        shutil.rmtree(os.environ.get(RUN_DIR_VAR, ""), ignore_errors=True)
        path = self.config.getoption("conform_json")
        if not path:
            return
        st = _state(self.config)
        workers = {}
        for r in self.results:
            w = r.get("worker") or {}
            workers.setdefault(w.get("worker", "main"), w)
        out = dict(tier=st["tier"], device=st["device"], run_seed=st["seed"],
                   commit=self.config.getoption("conform_commit") or _commit_label(),
                   versions=_versions(), only=names_of(self.config, "conform_only"),
                   exclude=names_of(self.config, "conform_exclude"),
                   where=self.config.getoption("conform_where") or [],
                   backends=list(backends(self.config)), exitstatus=int(session.exitstatus),
                   duration_s=round(time.time() - self.t0, 2), checks=len(self.results),
                   failed=sum(r["status"] == "fail" for r in self.results),
                   unsupported=sum(r["status"] == "unsupported" for r in self.results),
                   deviates=sum(r["status"] == "deviates" for r in self.results),
                   workers=workers, matrix=self.matrix(), other_errors=self.errors,
                   results=[{k: v for k, v in r.items() if k != "worker"} | {"worker": (r.get("worker") or {}).get("worker")}
                            for r in self.results])
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(out, f, indent=1, default=str)
        if hasattr(self, "_jsonl"):
            self._jsonl.close()
            os.remove(path + ".partial.jsonl")  # the full report supersedes it


def _commit_label() -> str:
    """The checkout's ``git describe --dirty`` (``tools._common.commit_label``); ``unknown``
    where the tools are not importable."""
    try:
        from tools._common import commit_label
    except ImportError:
        return "unknown"
    return commit_label()


def _versions() -> dict:
    """Python and the installed versions of the packages a backend may run on (package
    metadata only: nothing is imported); None for one that is not installed."""
    import platform
    from importlib import metadata
    out = {"python": platform.python_version()}
    for name in ("torch", "triton", "tilelang"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def pytest_report_header(config):
    if _is_worker(config):
        return None
    st = config.stash[_KEY]
    return (f"hils-swa conformance: tier {st['tier']}, device {config.getoption('conform_device')}, "
            f"run seed {st['seed']}, GPUs [{os.environ.get(pinning.GPUS_VAR, '')}]")
