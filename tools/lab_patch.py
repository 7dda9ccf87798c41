"""Lab: a backend's launcher as shipped against the same launcher with tables patched, one
device call, decided by a rule written before the run.

    PYTHONUNBUFFERED=1 python -m tools.lab_patch --out $OUT/lab.json --backend tilelang \\
        --dims 96,128 --shapes decode1,decode1-128k \\
        --variant grid SPLIT_MIN_TILES=1000000 --rule '*=0.97'
    python -m tools.lab_patch ... --variant w96 'TC_WIDER[80]=96' --variant w128 'TC_WIDER[80]=128'

Every earlier tuning lab of this repository patched a table of ``launch`` for a variant and
timed it against the shipped table (``tools/lab_head_dims.py``'s ``TC_WIDER``, the device
scripts of sessions 56-58). This one takes the patches from the command line.

A variant is a name and patches of the backend's launch module (``triton_impl.launch`` or
``tilelang_impl.launch``): ``ATTR=VALUE`` sets an UPPERCASE module attribute to a value;
``ATTR[KEY]=VALUE`` sets an entry of a dict attribute, ``ATTR[KEY]=-`` removes one. Values
and keys are Python literals, or calls of a class of the module with such arguments
(``'PREFILL[("16", 128)]=Config(64, 32, 4, 3)'``: :func:`value_of`). An attribute the
module lacks, any other expression, an entry of a non-dict are refused before anything
runs. The patches hold around every call of the variant (plans cleared on entry and on
exit: the plan caches are keyed by the problem, not the tables), so CUDA-graph capture plans
the variant and replays it.

What runs. For every shape (:data:`SHAPES`; ``--shape NAME=B,Hq,Hkv,Lq,Lk`` adds one),
head dim and variant (``shipped`` first), bf16, W = 512, C = 64, both flags, fresh random
inputs per (shape, head dim), the public call of the backend:

1. TileLang: every kernel the calls build (planned on ``meta`` tensors through the real
   adapter and launcher, ``tools.tl_lower.recording``) is built first in parallel processes
   (``tools.tl_lower.lower_all``); an item whose kernel does not build is reported and not
   run. Triton compiles on its first call.
2. The screen: each variant's outputs against ``shipped``'s on the same inputs (no NaN, the
   same ``-inf`` LSE rows, ``o`` and ``lse`` within ``tools.lab_head_dims``' bounds, and
   whether the bits agree), and what ``describe_call`` says each ran (a variant that runs
   what ``shipped`` runs is flagged ``same_plan``: its patch does not reach that call).
   The conformance tier, not this screen, judges what ships. A call that raises (a config
   the launcher or the compiler refuses) is reported under ``failed`` and not timed.
3. Timing: kernel only (``tools.bench.Timer.graph``: CUDA-graph replay, L2 flushed before each
   replay), ``--rounds`` interleaved rounds alternating the order. The JSON is written after
   the checks and after every round.
4. The rule (``--rule SHAPE=BOUND``, ``*`` for every shape not named; none: no decision):
   a variant passes where it built and ran everywhere, every screen passed, its patch changed
   the plan of some call, and at every head dim each ruled shape's median is at most
   ``BOUND`` times ``shipped``'s. The JSON's ``decision`` lists
   the variants that pass; exit status 0 where every check, build and capture went through
   (the rule's verdict is data, not an error).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import importlib
import json
import re
import sys
import time

import torch

from tools import lab_head_dims as _hd

#: name -> (B, Hq, Hkv, Lq, Lk): ``tools.lab_head_dims``' three and the bench's decode and
#: chunked rows.
SHAPES = {
    **_hd.SHAPES,
    "decode1-128k": (1, 32, 32, 1, 131072),
    "decode8-32k": (8, 32, 4, 1, 32768),
    "chunked": (1, 32, 32, 512, 8192),
    "gqa8k": (1, 32, 4, 8192, 8192),
}
RULE = _hd.RULE
inputs = _hd.shape_inputs
BACKENDS = ("triton", "tilelang")
SHIPPED = "shipped"
_PATCH = re.compile(r"^([A-Z][A-Z0-9_]*)(?:\[(.+)\])?=(.*)$")


def launch_module(backend: str):
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: one of {', '.join(BACKENDS)}")
    return importlib.import_module(f"{backend}_impl.launch")


def value_of(mod, text: str):
    """The value ``text`` writes: literals (numbers, strings, ``None``, booleans, tuples,
    lists, dicts, sets, a unary minus or plus on a number) and calls of a class that ``mod``
    defines or imports under a public name (``Config(64, 64, 4, 3, maxnreg=128)``) with such
    arguments; a ValueError for anything else (``...`` included: it marks an entry to remove).
    Nothing is evaluated but those calls."""
    def ev(n):
        if isinstance(n, ast.Constant):
            if n.value is None or isinstance(n.value, (bool, int, float, str)):
                return n.value
        elif isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            items = [ev(e) for e in n.elts]
            return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(n)](items)
        elif isinstance(n, ast.Dict) and None not in n.keys:
            return {ev(k): ev(v) for k, v in zip(n.keys, n.values)}
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            x = ev(n.operand)
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                return -x if isinstance(n.op, ast.USub) else x
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                and not n.func.id.startswith("_")):
            cls = getattr(mod, n.func.id, None)
            if isinstance(cls, type) and all(k.arg for k in n.keywords):
                return cls(*[ev(a) for a in n.args], **{k.arg: ev(k.value) for k in n.keywords})
        raise ValueError(f"{ast.unparse(n)!r} is not a literal or a call of a class of "
                         f"{mod.__name__}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"{text!r} is not a Python expression") from None
    try:
        return ev(tree.body)
    except TypeError as e:  # an unhashable key or member, a class called with wrong arguments
        raise ValueError(f"{text!r}: {e}") from None


def parse_patch(mod, text: str) -> tuple:
    """``(attr, key, value)`` of one patch (``key`` None for a whole attribute; ``value``
    :data:`Ellipsis` for an entry to remove), checked against ``mod``."""
    m = _PATCH.match(text.strip())
    if not m:
        raise ValueError(f"patch {text!r}: ATTR=VALUE or ATTR[KEY]=VALUE (ATTR in UPPERCASE)")
    attr, key, value = m.groups()
    if not hasattr(mod, attr):
        raise ValueError(f"patch {text!r}: {mod.__name__} has no {attr}")

    def literal(s, what):
        try:
            return value_of(mod, s)
        except ValueError as e:
            raise ValueError(f"patch {text!r}: the {what}: {e}") from None
    if key is not None:
        if not isinstance(getattr(mod, attr), dict):
            raise ValueError(f"patch {text!r}: {attr} is a {type(getattr(mod, attr)).__name__}, "
                             "not a dict")
        key = literal(key, "key")
        try:
            hash(key)
        except TypeError:
            raise ValueError(f"patch {text!r}: the key {key!r} is not hashable") from None
    if value.strip() == "-":
        if key is None:
            raise ValueError(f"patch {text!r}: '-' removes a dict entry, not an attribute")
        return attr, key, ...
    return attr, key, literal(value, "value")


def _clear(mod) -> None:
    """Forget the launcher's cached plans (TileLang's memoised configs too)."""
    clear = getattr(mod, "clear_plans", None)
    if clear is not None:
        clear()
    else:
        mod._PLANS.clear()


@contextlib.contextmanager
def patched(mod, patches: list[tuple]):
    """``mod`` with ``patches`` (:func:`parse_patch`) applied, restored after. A dict
    attribute is changed and restored in place (other modules may hold it). Each entry gets
    a copy of its patch's value: what one call does to it, the next does not see."""
    saved = []
    try:
        for attr, key, value in patches:
            value = copy.deepcopy(value)
            if key is None:
                old = getattr(mod, attr)
                if isinstance(old, dict) and isinstance(value, dict):
                    saved.append((attr, None, dict(old)))
                    old.clear()
                    old.update(value)
                else:
                    saved.append((attr, None, old))
                    setattr(mod, attr, value)
            else:
                d = getattr(mod, attr)
                saved.append((attr, key, d.get(key, ...)))
                if value is ...:
                    d.pop(key, None)
                else:
                    d[key] = value
        _clear(mod)
        yield
    finally:
        for attr, key, old in reversed(saved):
            if key is None and isinstance(old, dict) and isinstance(getattr(mod, attr), dict):
                getattr(mod, attr).clear()
                getattr(mod, attr).update(old)
            elif key is None:
                setattr(mod, attr, old)
            elif old is ...:
                getattr(mod, attr).pop(key, None)
            else:
                getattr(mod, attr)[key] = old
        _clear(mod)


def parse_rule(texts: list[str], shapes: list[str]) -> dict[str, float]:
    """``{shape: bound}`` from ``SHAPE=BOUND`` entries (``*``: every shape not named)."""
    rule, default = {}, None
    for t in texts:
        name, _, bound = t.partition("=")
        try:
            b = float(bound)
        except ValueError:
            raise ValueError(f"rule {t!r}: SHAPE=BOUND with a number") from None
        if not b > 0:
            raise ValueError(f"rule {t!r}: the bound must be positive")
        if name == "*":
            default = b
        elif name in shapes:
            rule[name] = b
        else:
            raise ValueError(f"rule {t!r}: {name!r} is not a shape of this run ({shapes})")
    if default is not None:
        rule = {s: rule.get(s, default) for s in shapes}
    return rule


def tilelang_jobs(mod, patches: list[tuple], dims: tuple, D: int) -> set[tuple]:
    """The ``(kind, args)`` kernels TileLang's call builds under ``patches``, planned on
    ``meta`` tensors (``tools.lab_head_dims.meta_jobs``: nothing built)."""
    with patched(mod, patches):
        return _hd.meta_jobs(dims, D)


def _why(e: Exception) -> str:
    """An exception in one line for the JSON's ``failed``."""
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"  # '' has no lines


def decide(res: dict, rule: dict[str, float]) -> dict:
    """Per variant: whether it passes the rule (the module's docstring, 4), why not, and its
    ratios to ``shipped``, ``{shape: {D: ratio}}``. Empty without a rule. A variant whose
    every checked call plans what ``shipped`` plans (``same_plan``) does not pass: its patch
    reaches none of the calls, and its ratios are noise."""
    us = {(r["shape"], r["D"], r["variant"]): r["us"] for r in res["rows"]}
    out = {}
    if not rule:
        return out
    for v in res["variants"]:
        if v == SHIPPED:
            continue
        ratios, ok, why = {}, True, []
        if any(c["variant"] == v and not c["ok"] for c in res["checks"]):
            ok = False
            why.append("a screen failed")
        if any(n[2] == v for n in res["not_run"]) or any(f[2] == v for f in res["failed"]):
            ok = False
            why.append("not run everywhere")
        mine = [c for c in res["checks"] if c["variant"] == v]
        if mine and all(c.get("same_plan") for c in mine):
            ok = False
            why.append("the patch changes no call's plan")
        for (s, D, var), t in us.items():
            if var != v:
                continue
            base = us.get((s, D, SHIPPED))
            r = t / base if t and base else None
            ratios.setdefault(s, {})[D] = r
            if s in rule and (r is None or r > rule[s]):
                ok = False
                what = ("untimed" if not t else "shipped untimed") if r is None else f"{r:.3f}"
                why.append(f"{s} D={D}: {what} > {rule[s]}")
        out[v] = dict(passes=ok, ratios=ratios, why=why)
    return out


def run(backend: str, variants: dict[str, list[tuple]], shapes: dict[str, tuple],
        dims_list: list[int], reps: int, rounds: int, workers: int, rule: dict[str, float],
        out: str | None = None, log=print, device: str = "cuda") -> dict:
    """The lab (the module's docstring, 1-4); ``device="cpu"`` runs the checks only (the
    tests' dry run: Triton under its interpreter, TileLang's CPU kernel, nothing timed)."""
    mod = launch_module(backend)
    t0 = time.time()
    items = [(s, D, v) for s in shapes for D in dims_list for v in variants]
    errs, per_item = {}, {}
    cuda = device.startswith("cuda")
    failed = []
    if backend == "tilelang" and cuda:
        from tools import tl_lower
        for i in items:
            try:  # a patch the planner refuses: reported with the item, the others go on
                per_item[i] = tilelang_jobs(mod, variants[i[2]], shapes[i[0]], i[1])
            except Exception as e:
                failed.append([*i, _why(e)])
        items = [i for i in items if i in per_item]
        need = sorted(set().union(*per_item.values()), key=repr)
        errs = tl_lower.lower_all(need, workers, build=True)  # before CUDA: workers fork
        log(f"built {len(need) - len(errs)} of {len(need)} kernels in {time.time() - t0:.0f} s")
    pkg = importlib.import_module(f"{backend}_impl")
    from tools.bench import Timer
    from tools.lab_head_dims import _compare
    from tools._common import run_commit
    res = dict(device=torch.cuda.get_device_name() if cuda else device, backend=backend,
               commit=run_commit(), rule_args=RULE,
               shapes=shapes, dims=dims_list, rule=rule,
               variants={v: [list(p) if p[2] is not ... else [p[0], p[1], "-"] for p in ps]
                         for v, ps in variants.items()},
               build_errors=[f"{kind}{args}: {e}" for (kind, args), e in errs.items()],
               not_run=[list(i) for i in items if per_item.get(i, set()) & set(errs)],
               rows=[], checks=[], failed=failed)

    def dump():
        res["seconds"] = time.time() - t0
        if out:
            with open(out, "w") as f:
                json.dump(res, f, indent=1, default=repr)
    items = [i for i in items if not per_item.get(i, set()) & set(errs)]
    data = {(s, D): inputs(shapes[s], D, device, seed=n)
            for n, (s, D) in enumerate(dict.fromkeys(i[:2] for i in items))}
    calls, plans, outs = {}, {}, {}
    for s, D, v in items:
        def call(q, k, vv, v=v):
            with patched(mod, variants[v]):
                return pkg.sliding_window_attention(q, k, vv, **RULE)
        try:  # a variant the launcher refuses (a Python error) is reported, the others run
            with patched(mod, variants[v]):
                plans[(s, D, v)] = pkg.describe_call(*data[(s, D)], **RULE)
            outs[(s, D, v)] = call(*data[(s, D)])
            if cuda:
                torch.cuda.synchronize()
            calls[(s, D, v)] = call
        except Exception as e:
            res["failed"].append([s, D, v, _why(e)])
            log(f"{(s, D, v)}: failed: {res['failed'][-1][3]}")
    for (s, D, v) in calls:
        if v != SHIPPED and (s, D, SHIPPED) in outs:
            same = plans[(s, D, v)] == plans[(s, D, SHIPPED)]
            chk = dict(shape=s, D=D, variant=v, same_plan=same,
                       **_compare(outs[(s, D, v)], outs[(s, D, SHIPPED)]))
            res["checks"].append(chk)
            log(json.dumps(chk))
    del outs
    dump()
    timed = {key: (c, [data[key[:2]]]) for key, c in calls.items()}
    for times, why in _hd.interleaved(Timer(device, reps), timed, rounds, log):
        res["rows"] = _hd.rows(times, why, shapes, plans)
        res["decision"] = decide(res, rule)
        dump()
    log(summary(res))
    return res


def summary(res: dict) -> str:
    """One line per (shape, D, variant): its median, ``shipped``'s and the ratio; then each
    variant's verdict under the rule."""
    us = {(r["shape"], r["D"], r["variant"]): r["us"] for r in res["rows"]}

    def f(x, n, spec):
        return format(x, f"{n}{spec}") if x is not None else "-".rjust(n)
    lines = ["shape           D  variant          us  shipped us   ratio"]
    for (s, D, v), t in us.items():
        if v != SHIPPED:
            base = us.get((s, D, SHIPPED))
            lines.append(f"{s:14s} {D:3d}  {v:12s} {f(t, 9, '.1f')} {f(base, 11, '.1f')} "
                         f"{f(t / base if t and base else None, 7, '.3f')}")
    for v, d in res.get("decision", {}).items():
        lines.append(f"{v}: {'passes' if d['passes'] else 'does not pass'}"
                     + (f" ({'; '.join(d['why'])})" if d["why"] else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    from tools.tl_lower import default_workers
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", choices=BACKENDS, default="tilelang")
    ap.add_argument("--variant", nargs="+", action="append", default=[], metavar="NAME PATCH",
                    help="a name, then patches ATTR=VALUE / ATTR[KEY]=VALUE / ATTR[KEY]=-")
    ap.add_argument("--dims", default="128", help="head dims, comma-separated")
    ap.add_argument("--shapes", default="prefill,decode1,decode8", help=f"of {', '.join(SHAPES)}")
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=B,Hq,Hkv,Lq,Lk")
    ap.add_argument("--rule", action="append", default=[], metavar="SHAPE=BOUND")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("-j", "--workers", type=int, default=default_workers())
    a = ap.parse_args(argv)
    try:
        mod = launch_module(a.backend)
        shapes = dict(SHAPES)
        for t in a.shape:
            name, _, spec = t.partition("=")
            vals = tuple(int(x) for x in spec.split(",")) if spec else ()
            if not name or len(vals) != 5 or min(vals) < 1 or vals[3] > vals[4]:
                raise ValueError(f"--shape {t!r}: NAME=B,Hq,Hkv,Lq,Lk, positive, Lq <= Lk")
            shapes[name] = vals
        names = [s for s in a.shapes.split(",") if s] + [t.partition("=")[0] for t in a.shape]
        bad = [s for s in names if s not in shapes]
        if bad:
            raise ValueError(f"unknown shapes {bad}: of {', '.join(shapes)}")
        shapes = {s: shapes[s] for s in dict.fromkeys(names)}
        if not a.variant:
            raise ValueError("name at least one --variant NAME PATCH...")
        variants = {SHIPPED: []}
        for name, *texts in a.variant:
            if name in variants or not texts:
                raise ValueError(f"--variant {name!r}: a new name, then at least one patch")
            variants[name] = [parse_patch(mod, t) for t in texts]
        dims = [int(x) for x in a.dims.split(",") if x]
        rule = parse_rule(a.rule, list(shapes))
    except ValueError as e:
        ap.error(str(e))
    res = run(a.backend, variants, shapes, dims, a.reps, a.rounds, a.workers, rule, a.out)
    ok = (not res["build_errors"] and not res["failed"] and all(c["ok"] for c in res["checks"])
          and not any(r["why"] for r in res["rows"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
