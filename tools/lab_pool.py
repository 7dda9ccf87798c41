"""Pool repeated lab runs into one table: per row, the spread across runs and the decision.

    python -m tools.lab_pool bench_results/tilelang-lab49-h100-*.json [--base shipped] [--md]
    python -m tools.lab_pool bench_results/ab-triton-edge-shift-s49-h100-*.json [--md]

A lab run times each variant once per row (best of five replays); the rows of the D = 64
shapes move by up to 10% from run to run on the same machine, so one run cannot tell a
2% change from noise. This reads several runs of the same comparison and prints, per row:

- ``lab_tilelang.json`` files (``tools/lab_tilelang.py``): for each variant against
  ``--base`` (default ``shipped``), the base's TFLOP/s min / median / max over the runs, the
  median of the per-run speed ratio (the variant's speed over the base's) with its range,
  and how many runs had the variant at or above the base. A run where either variant is not
  ``timed`` (a failed correctness case, a hang, a compile failure) or where any of its
  checks failed is left out of that variant's rows and named, and so is a row whose timing
  failed in a run (the lab records the error instead of a time); the runs in which the
  variant was at or above the base on every row are counted (session 48's decision rule).
- ``ab_triton.json`` files (``tools/ab_triton.py``): every pass of every file, per shape:
  the base's and the new kernel's median and best microseconds, the median of the per-pass
  speed ratio (the new kernel's speed over the base's, ``base_us / new_us``) with its range,
  the same ratio of the two bests, and the largest difference of ``o`` and ``lse`` between
  base and new: 0 only where every pass recorded 0, NaN where any pass recorded NaN or none
  (a NaN in either output, or two ``-inf`` LSE rows, leaves the difference unknown). The
  files' correctness lines (``checks_passed``) are printed as they are.

Ratios are speed ratios: above 1 the variant (the new kernel) is faster. The files of one
call must all be of one kind; a file of neither kind, a base missing from every run, or no
file at all is refused with a message (exit 2).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys


def kind_of(doc: dict) -> str | None:
    """``"lab"`` (lab_tilelang), ``"ab"`` (ab_triton) or None."""
    if isinstance(doc.get("variants"), dict) and "shapes" in doc:
        return "lab"
    if isinstance(doc.get("timings"), list) and "checks" in doc:
        return "ab"
    return None


def load(paths) -> tuple[str, list[dict]]:
    """``(kind, documents)`` of ``paths``; ValueError when they are not one kind."""
    if not paths:
        raise ValueError("no file given")
    docs, kinds = [], set()
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        k = kind_of(doc)
        if k is None:
            raise ValueError(f"{p}: neither a lab_tilelang.json nor an ab_triton.json")
        doc["_path"] = p
        docs.append(doc)
        kinds.add(k)
    if len(kinds) > 1:
        raise ValueError("the files mix lab_tilelang and ab_triton results: "
                         "pool one kind at a time")
    return kinds.pop(), docs


def _spread(xs) -> dict:
    return dict(min=min(xs), median=statistics.median(xs), max=max(xs), n=len(xs))


def _us(t) -> float | None:
    """The best time of a timing entry, None where the timing failed."""
    us = t.get("us") if isinstance(t, dict) else None
    return us if isinstance(us, (int, float)) and us > 0 else None


def _usable(v: dict | None) -> str | None:
    """Why a run's variant cannot be pooled (None: it can)."""
    if v is None:
        return "not in the run"
    if v.get("status") != "timed":
        return f"status {v.get('status')!r}"
    bad = [c for c, r in (v.get("checks") or {}).items() if not r.get("ok")]
    return f"failed checks {bad}" if bad else None


def pool_lab(docs, base: str = "shipped") -> dict:
    """Per variant other than ``base``: its rows' statistics over the usable runs, the runs
    left out and why, and the runs with a gain on every row."""
    if not any(base in d["variants"] for d in docs):
        names = sorted({n for d in docs for n in d["variants"]})
        raise ValueError(f"base {base!r} is in none of the runs (variants: {names})")
    names = []
    for d in docs:
        names += [n for n in d["variants"] if n != base and n not in names]
    out = {}
    for name in names:
        rows, left_out, gaps, whole = {}, [], [], 0
        for d in docs:
            b, v = d["variants"].get(base), d["variants"].get(name)
            whys = [f"{n}: {w}" for n, w in ((base, _usable(b)), (name, _usable(v))) if w]
            if whys:
                left_out.append(f"{d['_path']}: {'; '.join(whys)}")
                continue
            common = [r for r in d["shapes"] if r in b["times"] and r in v["times"]]
            failed = [r for r in common if _us(b["times"][r]) is None or _us(v["times"][r]) is None]
            if failed:
                gaps.append(f"{d['_path']}: {failed} (the timing failed)")
            ratios = {r: _us(b["times"][r]) / _us(v["times"][r]) for r in common if r not in failed}
            for r in ratios:
                e = rows.setdefault(r, dict(base=[], ratio=[]))
                e["base"].append(b["times"][r]["tflops"])
                e["ratio"].append(ratios[r])
            whole += bool(common) and not failed and all(x >= 1 for x in ratios.values())
        out[name] = dict(
            rows={r: dict(base_tflops=_spread(e["base"]), ratio=_spread(e["ratio"]),
                          at_or_above=sum(x >= 1 for x in e["ratio"])) for r, e in rows.items()},
            runs=len(docs) - len(left_out), left_out=left_out, rows_left_out=gaps,
            every_row_runs=whole)
    return out


def pool_ab(docs) -> dict:
    """Per shape over every pass of every file: base / new microseconds, the speed ratio,
    the largest output difference; and each file's correctness line."""
    shapes = {}
    for d in docs:
        for t in d["timings"]:
            e = shapes.setdefault(t["shape"], dict(base=[], new=[], ratio=[], diff=0.0))
            e["base"].append(t["base_us"])
            e["new"].append(t["new_us"])
            e["ratio"].append(t["base_us"] / t["new_us"])
            for key in ("max_diff_o", "max_diff_lse"):
                x = t.get(key)
                x = float("nan") if not isinstance(x, (int, float)) else float(x)
                unknown = math.isnan(x) or math.isnan(e["diff"])
                e["diff"] = math.nan if unknown else max(e["diff"], x)
    return dict(
        shapes={s: dict(base_us=_spread(e["base"]), new_us=_spread(e["new"]),
                        ratio=_spread(e["ratio"]), best_ratio=min(e["base"]) / min(e["new"]),
                        max_diff=e["diff"])
                for s, e in shapes.items()},
        checks=[(d["_path"], d.get("checks_passed", "no checks")) for d in docs])


def _table(head, rows, md: bool) -> list[str]:
    if md:
        return ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"] + [
            "| " + " | ".join(r) + " |" for r in rows]
    w = [max(len(x) for x in col) for col in zip(head, *rows)]
    return ["  ".join(x.ljust(n) for x, n in zip(r, w)).rstrip() for r in [head] + rows]


def render_lab(pool: dict, base: str, md: bool = False) -> str:
    lines = []
    for name, p in pool.items():
        lines.append(f"{name} against {base}: {p['runs']} usable run(s); a gain on every row in "
                     f"{p['every_row_runs']} of them")
        lines += [f"  left out: {x}" for x in p["left_out"]]
        lines += [f"  rows left out: {x}" for x in p["rows_left_out"]]
        rows = [[r, "%.1f / %.1f / %.1f" % (s["base_tflops"]["min"], s["base_tflops"]["median"],
                                            s["base_tflops"]["max"]),
                 "%.3f [%.3f, %.3f]" % (s["ratio"]["median"], s["ratio"]["min"], s["ratio"]["max"]),
                 f"{s['at_or_above']} of {s['ratio']['n']}"] for r, s in p["rows"].items()]
        lines += _table(["row", f"{base} TFLOP/s min / median / max",
                         f"{name} speed / {base}, median [range]", "runs at or above 1"], rows, md)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_ab(pool: dict, md: bool = False) -> str:
    lines = [f"checks: {path}: {c}" for path, c in pool["checks"]]
    rows = [[s, str(e["ratio"]["n"]),
             "%.2f / %.2f" % (e["base_us"]["median"], e["base_us"]["min"]),
             "%.2f / %.2f" % (e["new_us"]["median"], e["new_us"]["min"]),
             "%.3f [%.3f, %.3f]" % (e["ratio"]["median"], e["ratio"]["min"], e["ratio"]["max"]),
             "%.3f" % e["best_ratio"], "%.3g" % e["max_diff"]] for s, e in pool["shapes"].items()]
    lines += _table(["shape", "passes", "base us median / best", "new us median / best",
                     "new speed / base, median [range]", "best over best", "max |diff|"], rows, md)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.lab_pool",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*",
                    help="lab_tilelang.json or ab_triton.json files of one comparison")
    ap.add_argument("--base", default="shipped",
                    help="lab_tilelang: the variant the others are compared with")
    ap.add_argument("--md", action="store_true", help="Markdown tables")
    a = ap.parse_args(argv)
    try:
        kind, docs = load(a.files)
        text = (render_lab(pool_lab(docs, a.base), a.base, a.md) if kind == "lab"
                else render_ab(pool_ab(docs), a.md))
    except (ValueError, OSError, KeyError, TypeError, ZeroDivisionError) as e:
        print(f"lab_pool: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
