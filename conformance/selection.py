"""The conformance suite's case selection: ``--only`` / ``--exclude`` (categories, case ids, id
globs) and ``--where`` (an expression over a case's fields). Its own module, not
``conformance.plugin``, so that ``hils-swa conform`` can check a selection before pytest
starts (importing the plugin that early would keep pytest from rewriting its asserts)."""

from __future__ import annotations

import ast
import fnmatch
from typing import Callable


def _matches(case, name: str) -> bool:
    return name == case.category or name == case.id or fnmatch.fnmatchcase(case.id, name)


def _selected(case, only: list[str] | None) -> bool:
    return not only or any(_matches(case, name) for name in only)


#: What a ``--where`` expression may use besides the case's fields (:func:`case_filter`).
_WHERE_CALLS = {"max": max, "min": min, "abs": abs}
_WHERE_NODES = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub,
                ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn,
                ast.Is, ast.IsNot, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod,
                ast.Name, ast.Load, ast.Constant, ast.Tuple, ast.List, ast.Call)


def case_filter(expr: str) -> Callable:
    """A predicate over cases from ``--where``'s ``expr``: a Python expression over a case's
    fields (``conformance.cases.Case``: ``category``, ``dtype``, ``B``, ``Hq``, ``Hkv``,
    ``Lq``, ``Lk``, ``Dqk``, ``Dv``, ``window``, ``chunk``, ``mask_lmk``, ``expand``,
    ``kv_start``, ``sm_scale``, ``layout``, the NaN / inf flags, ``error``) and ``id``, with
    comparisons, ``and`` / ``or`` / ``not``, integer arithmetic, ``in`` over literal tuples and
    ``max`` / ``min`` / ``abs``; e.g. ``Lq > 64 and max(Dqk, Dv) <= 128 and dtype != 'fp32'``.
    Raises ``ValueError`` for anything else (a name that is no field, an attribute, another
    call, ``is`` but against ``None``), and the predicate raises it for an expression that
    fails on a case (``sm_scale > 0.1`` where ``sm_scale`` is None): a typo must not change a
    run silently."""
    import dataclasses

    from .cases import Case

    names = {f.name for f in dataclasses.fields(Case)} | {"id"}
    assert not names & set(_WHERE_CALLS), "a case field would shadow a --where function"
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"--where {expr!r}: not an expression ({e.msg})") from None
    for node in ast.walk(tree):
        if not isinstance(node, _WHERE_NODES):
            raise ValueError(f"--where {expr!r}: {type(node).__name__} is not allowed (comparisons, "
                             f"and / or / not, + - * // %, in, max / min / abs over the case's fields)")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name)
                                               and node.func.id in _WHERE_CALLS and not node.keywords):
            raise ValueError(f"--where {expr!r}: calls only max, min and abs")
        if (isinstance(node, ast.Name) and node.id not in names and node.id not in _WHERE_CALLS):
            raise ValueError(f"--where {expr!r}: {node.id!r} is no case field; fields: "
                             f"{', '.join(sorted(names))}")
        if isinstance(node, ast.Compare) and any(
                isinstance(op, (ast.Is, ast.IsNot))
                and not (isinstance(right, ast.Constant) and right.value is None)
                for op, right in zip(node.ops, node.comparators)):
            raise ValueError(f"--where {expr!r}: 'is' / 'is not' only against None (sm_scale is None)")
    code = compile(tree, "<--where>", "eval")

    def holds(case) -> bool:
        env = {n: getattr(case, n) for n in names}
        try:
            return bool(eval(code, {"__builtins__": {}, **_WHERE_CALLS}, env))
        except Exception as e:  # e.g. sm_scale > 0.1 on a case whose sm_scale is None
            raise ValueError(f"--where {expr!r} on {case.id}: {type(e).__name__}: {e}") from None
    return holds


def select(cases: list, only: list[str] | None, where: str = "", exclude: list[str] | None = None,
           exprs: list[str] | None = None) -> list:
    """The cases that ``--only``'s names (categories, case ids, id globs) select, less those
    ``--exclude``'s names match, that every ``--where`` expression of ``exprs`` holds for
    (:func:`case_filter`). Raises ``ValueError`` naming every name of either that matches
    nothing (a typo must not change a run silently), for an expression it refuses, and where
    the expressions leave no case; ``where`` says which tier and device were searched."""
    cases = list(cases)
    for flag, names in (("--only", only), ("--exclude", exclude)):
        dead = [n for n in names or [] if not any(_matches(c, n) for c in cases)]
        if dead:
            cats = sorted({c.category for c in cases})
            raise ValueError(f"{flag}: {', '.join(dead)} matches no case{where}; categories: {', '.join(cats)}")
    kept = [c for c in cases if _selected(c, only) and not any(_matches(c, n) for n in exclude or [])]
    if not kept and exclude:  # a run that checks nothing must not pass
        raise ValueError(f"--exclude: {', '.join(exclude)} leaves none of the cases --only selects{where}")
    for expr in exprs or []:
        holds = case_filter(expr)
        kept = [c for c in kept if holds(c)]
        if not kept:  # a run that checks nothing must not pass
            raise ValueError(f"--where {expr!r} leaves none of the cases selected before it{where}")
    return kept


def split_names(specs: list[str] | None) -> list[str]:
    """The names of a repeatable comma-separated option (``--backend``, ``--only``, ``--exclude``)."""
    return [n for spec in (specs or []) for n in spec.split(",") if n]
