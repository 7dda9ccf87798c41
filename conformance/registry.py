"""The registry of backends: one place that says what implements the operator.

A backend is a function with the canonical signature of SPEC.md plus a
``supports(case) -> (ok, reason)`` check. Built-in backends are registered by
name here; external ones come from ``--backend package.module:function`` (or
``NAME=package.module:function``, the same under a short name) or the entry-point
group ``hils_swa.backends``, and get exactly the same cases.

A backend that cannot serve a case says so (``supports`` returns
``(False, reason)``, or the call raises ``reference.UnsupportedConfig``); the
suite reports ``unsupported`` with that reason and never substitutes another
backend.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable

ENTRY_POINT_GROUP = "hils_swa.backends"


def _always(case: Any) -> tuple[bool, str]:
    return True, ""


@dataclass(frozen=True)
class Backend:
    """A named implementation of the canonical interface."""

    name: str
    fn: Callable[..., Any] = field(repr=False)
    supports: Callable[[Any], tuple[bool, str]] = field(default=_always, repr=False)
    origin: str = ""  # where it came from: "builtin", "entry point", "module:function"
    # (q, k, v, **canonical kwargs) -> one line naming the kernel a call runs (planning
    # only; shown by `hils-swa bench`), or None: the backend does not say
    describe: Callable[..., str] | None = field(default=None, repr=False)
    # case -> Deviation or None: a documented bug (not a missing feature); the suite
    # reports a failure that is exactly that bug as ``deviates`` with the reason
    # (a pass stays a pass; any other difference fails)
    deviation: Callable[[Any], "Deviation | None"] | None = field(default=None, repr=False)
    # a backend that serves every case on the machines it ships for (the CPU, CUDA on
    # Hopper): there ``unsupported`` is a failure, not a pass (the default built-ins)
    complete: bool = False


def _lazy_describe(module: str) -> Callable[..., str]:
    """A built-in's ``describe_call`` (its package names the kernel a call runs),
    imported on first call; "" for a package without one."""

    def call(*args, **kwargs):
        fn = getattr(importlib.import_module(module), "describe_call", None)
        return fn(*args, **kwargs) if fn is not None else ""

    return call


def _lazy(module: str, attr: str = "sliding_window_attention") -> Callable[..., Any]:
    """A function that imports ``module`` on first call (keeps imports cheap)."""

    def call(*args, **kwargs):
        fn = getattr(importlib.import_module(module), attr)
        return fn(*args, **kwargs)

    call.__name__ = f"{module}.{attr}"
    call.__qualname__ = call.__name__
    return call


# Built-ins: name -> module. What a backend cannot serve it says itself, by
# raising UnsupportedConfig (e.g. Triton on CPU without the interpreter);
# ``Backend.supports`` is for external backends that prefer to declare it.
_BUILTIN: dict[str, str] = {
    "reference": "reference",
    "triton": "triton_impl",
    "tilelang": "tilelang_impl",
}
_OPTIONAL: dict[str, str] = {
    "flex": "tools.flex_backend",
    # Triton with its TMA prefill kernel forced (unsupported for fp32, and on CPU
    # except fp16 under the Triton interpreter)
    "triton-tma": "triton_impl.tma_prefill",
    # TileLang with split-KV forced (bf16/fp16 CUDA, Dv 96 / 128; unsupported otherwise)
    "tilelang-split": "tilelang_impl.split_kv",
}
DEFAULT_BACKENDS = ("reference", "triton", "tilelang")


@dataclass(frozen=True)
class Deviation:
    """A documented bug of a backend on some cases (``Backend.deviation``).

    ``why``: the reason, printed with every case it covers. ``forgive(o, lse, q, k, v,
    kwargs, expected) -> (o, lse)``: the backend's outputs with exactly the documented
    effect undone (nothing else); the suite judges those again, and only when they
    pass is the failure reported as ``deviates``. Any other difference fails."""

    why: str
    forgive: Callable[..., tuple[Any, Any]]

    def undo(self, first, o, lse, q, k, v, kw, exp) -> tuple[Any, Any] | None:
        """``(o, lse)`` with the documented effect undone when the failure ``first``
        (the verdict of ``o``, ``lse`` against ``exp``) is exactly this deviation: NaN
        differences only, and the undone outputs pass. ``None`` otherwise. The one rule
        the suite (``runner``) and ``hils-swa diff`` both apply."""
        from .verdict import FAIL, PASS, judge

        if first.status != FAIL or set(first.kinds) != {"nan"}:
            return None
        o2, l2 = self.forgive(o, lse, q, k, v, kw, exp)
        return (o2, l2) if judge(o2, l2, exp).status == PASS else None


def forgive_nan_v_spread(o, lse, q, k, v, kw, exp):
    """Undo a NaN spread by ``P @ V``: an element of ``o`` that is NaN where golden is
    finite, in a column ``d`` where a key that some query of the call sees holds a
    non-finite ``v[b, kv_head, key, d]`` and in a head reading that key/value head,
    takes golden's value. Missing NaN, other columns, ``lse``, empty rows and the
    tolerance are judged as usual."""
    import torch

    from reference.mask import rule_kwargs, seen_keys

    seen = seen_keys(q.shape[2], k.shape[2], device=v.device, **rule_kwargs(kw))
    bad = (~torch.isfinite(v[:, :, seen])).any(2)  # (B, Hkv, Dv)
    bad = bad.repeat_interleave(q.shape[1] // v.shape[1], 1)[:, :, None, :].to(o.device)
    take = bad & torch.isnan(o) & torch.isfinite(exp.o).to(o.device)
    return torch.where(take, exp.o.to(device=o.device, dtype=o.dtype), o), lse


_SPREAD = ("NaN or infinity in the v row of a key that some rows of a query tile see reaches the tile's "
           "other rows too (p = 0 times NaN in P @ V), docs/conformance.md, 'Known deviations'")


def _spread_deviation(name: str) -> Callable[[Any], "Deviation | None"]:
    def check(case: Any) -> "Deviation | None":
        # one query (decode): every row of its tile is a head of that query and sees the key
        if getattr(case, "nan_v", False) and case.Lq > 1:
            return Deviation(f"{name}: {_SPREAD}", forgive_nan_v_spread)
        return None

    return check


# Documented bugs of built-in backends (Backend.deviation): case -> Deviation or None.
_DEVIATIONS: dict[str, Callable[[Any], "Deviation | None"]] = {
    name: _spread_deviation(name)
    for name in ("triton", "triton-tma", "tilelang", "tilelang-split", "flex")}


def _from_module_spec(spec: str) -> Backend:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"backend spec {spec!r}: expected a registered name or 'package.module:function'")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        hint = ""
        if isinstance(e, ModuleNotFoundError) and e.name == module.split(".")[0]:
            hint = ("; the package must be importable where hils-swa runs: install it "
                    "(pip install -e .) or put its folder on PYTHONPATH (PYTHONPATH=.)")
        raise ValueError(f"backend spec {spec!r}: cannot load it ({e}){hint}") from e
    return _as_backend(obj, name=spec, origin=spec)


def _as_backend(obj: Any, *, name: str, origin: str) -> Backend:
    """Accept a ready ``Backend`` or a bare canonical function (optionally
    carrying ``supports``, ``describe`` and ``deviation`` attributes)."""
    if isinstance(obj, Backend):
        return obj
    if not callable(obj):
        raise ValueError(f"backend {name!r} is not callable")
    return Backend(name=name, fn=obj, supports=getattr(obj, "supports", _always), origin=origin,
                   describe=getattr(obj, "describe", None), deviation=getattr(obj, "deviation", None))


def _entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


_ALIAS = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")


def _aliased(spec: str) -> Backend:
    """``NAME=package.module:function``: that function under a short name of its own."""
    name, _, target = spec.partition("=")
    if not _ALIAS.match(name) or ":" not in target:
        raise ValueError(f"backend spec {spec!r}: expected NAME=package.module:function (NAME of letters, "
                         "digits, '_', '.', '-', starting with a letter or '_')")
    if name in _BUILTIN or name in _OPTIONAL or name in _entry_points():
        raise ValueError(f"backend spec {spec!r}: {name!r} already names a backend; choose another name")
    return dataclasses.replace(_from_module_spec(target), name=name, origin=spec)


def spec_of(backend: Backend) -> str:
    """The spec :func:`load_backend` resolves back to ``backend``: its name, or for a
    ``NAME=package.module:function`` alias the whole spec (the name alone is not registered)."""
    return backend.origin if "=" in backend.origin else backend.name


def load_backend(spec: str) -> Backend:
    """Resolve one backend: a built-in name, an entry-point name,
    ``package.module:function``, ``NAME=package.module:function`` (the same under a short
    name, for matrix columns and pairs), or ``mutant:NAME`` (a one-bug backend of
    :mod:`conformance.mutants`, for seeing the suite and the tools catch it)."""
    if spec.startswith("mutant:"):  # deliberately broken backends (conformance.mutants)
        from .mutants import mutant

        return mutant(spec)
    if "=" in spec:
        return _aliased(spec)
    if spec in _BUILTIN or spec in _OPTIONAL:
        module = _BUILTIN.get(spec) or _OPTIONAL[spec]
        return Backend(name=spec, fn=_lazy(module), origin="builtin", describe=_lazy_describe(module),
                       deviation=_DEVIATIONS.get(spec), complete=spec in DEFAULT_BACKENDS)
    if ":" in spec:
        return _from_module_spec(spec)
    eps = _entry_points()
    if spec in eps:
        try:
            obj = eps[spec].load()
        except Exception as e:  # noqa: BLE001 -- a third-party package: say which one broke
            raise ValueError(f"backend {spec!r} (entry point {eps[spec].value} in group "
                             f"{ENTRY_POINT_GROUP}) cannot be loaded: {type(e).__name__}: {e}; "
                             "name the backends to run with --backend to leave it out") from e
        return _as_backend(obj, name=spec, origin=f"entry point {eps[spec].value}")
    known = sorted(set(_BUILTIN) | set(_OPTIONAL) | set(eps))
    raise ValueError(f"unknown backend {spec!r}; known: {', '.join(known)}; or use 'package.module:function'")


def default_backends() -> list[Backend]:
    """The built-in backends plus every installed entry-point backend."""
    out = [load_backend(name) for name in DEFAULT_BACKENDS]
    for name in sorted(_entry_points()):
        if name not in DEFAULT_BACKENDS:
            out.append(load_backend(name))
    return out


def resolve(specs: list[str] | None) -> list[Backend]:
    """Backends named on a command line, or the defaults when none are."""
    if not specs:
        return default_backends()
    seen, out = {}, []
    for spec in specs:
        b = load_backend(spec)
        if b.name in seen and spec_of(b) != seen[b.name]:
            raise ValueError(f"backend name {b.name!r} given twice, to {seen[b.name]!r} and {spec_of(b)!r}")
        if b.name not in seen:
            seen[b.name] = spec_of(b)
            out.append(b)
    return out
