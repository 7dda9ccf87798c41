"""The conformance cases: one generator for the CLI and for pytest.

A :class:`Case` is a frozen description of one call (sizes, dtype, rule
parameters, input form); :func:`make_inputs` turns it into tensors, seeded
from the case id and a run seed so any failure reproduces from its id.

Cases come in *categories* (rule groups: the columns of the matrix). Each
category is a small set of *axes* (the parameters that group is about, each
with the values that sit on or around the interesting boundaries) applied to a
base case. The **full** tier is the full product of every category's axes
(minus invalid combinations); the **quick** tier is a greedy pairwise covering
array of the same product: every pair of values of any two axes of a category
appears in at least one quick case, deterministically, with no random thinning.

Devices: the CPU value lists keep lengths small (the Triton interpreter costs
~0.3 s per small call); CUDA adds lengths 1000 and 2080, longer decode caches
and the ``long`` category (keys up to 128K).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

import torch

from reference.mask import rule_kwargs, seen_keys
from reference.validation import default_scale

__all__ = ["Case", "CATEGORIES", "ERROR_RULES", "generate", "make_inputs", "case_seed",
           "invisible_slots", "poison_unseen", "pairwise", "DTYPES"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
LAYOUTS = ("bhld", "bthd", "pad", "padt", "pad16", "mix", "cache")


@dataclass(frozen=True)
class Case:
    """One call of the operator. ``id`` names it completely (bar the device)."""

    category: str = field(compare=False)
    dtype: str = "bf16"
    B: int = 2
    Hq: int = 4
    Hkv: int = 2
    Lq: int = 129
    Lk: int = 129
    Dqk: int = 64
    Dv: int = 64
    window: int = 32
    chunk: int = 16
    mask_lmk: bool = True
    expand: bool = True
    kv_start: int = 0
    sm_scale: float | None = None
    layout: str = "bhld"  # bhld | bthd (BLHD storage, transposed view) | pad | padt | pad16 | mix | cache
    nan_slots: bool = False  # NaN in every key slot no query can see
    nan_seen: bool = False  # NaN in the k row of one key that some queries see (see seen_slot)
    inf_seen: bool = False  # +inf in column 0 of that k row: scores +inf or -inf by q's sign
    #                         (with nan_seen too: the NaN goes to another key those rows see)
    nan_v: bool = False  # NaN, +inf, -inf in the v row of one key that some queries see (seen_slot)
    error: str | None = None  # the SPEC error rule this case breaks (see ERROR_RULES)
    device: str = field(default="cpu", compare=False)

    @property
    def id(self) -> str:
        if self.error is not None:
            return f"err-{self.error}-{self.dtype}"
        s = (f"{self.dtype}-B{self.B}-H{self.Hq}x{self.Hkv}-q{self.Lq}k{self.Lk}"
             f"-D{self.Dqk}x{self.Dv}-W{self.window}C{self.chunk}"
             f"-lmk{int(self.mask_lmk)}exp{int(self.expand)}-kv{self.kv_start}-{self.layout}")
        if self.sm_scale is not None:
            s += f"-s{self.sm_scale:g}"
        if self.nan_slots:
            s += "-nan"
        if self.nan_seen:
            s += "-nanseen"
        if self.inf_seen:
            s += "-infseen"
        if self.nan_v:
            s += "-nanv"
        return s

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the canonical call."""
        return dict(window_size=self.window, chunk_size=self.chunk, mask_lmk=self.mask_lmk,
                    expand_to_chunk=self.expand, kv_start=self.kv_start, sm_scale=self.sm_scale)

    def rule(self) -> dict[str, Any]:
        """The visibility rule's keyword arguments (:meth:`kwargs` without ``sm_scale``)."""
        return rule_kwargs(self.kwargs())

    def __str__(self) -> str:
        return self.id


# ------------------------------------------------------------------ pairwise

def _key(v: Any) -> str:
    return repr(v)


def pairwise(axes: dict[str, list], valid: Callable[[dict], bool] = lambda r: True) -> list[dict]:
    """A deterministic covering array: every value of every axis and every pair
    of values of any two axes that occurs in a valid row appears in at least one
    chosen row (greedy set cover over the valid product; ties go to the row that
    comes first in product order)."""
    names = list(axes)
    rows = [dict(zip(names, combo)) for combo in itertools.product(*axes.values())]
    rows = [r for r in rows if valid(r)]

    def cover(r: dict) -> set:
        singles = {(a, _key(r[a])) for a in names}
        pairs = {(a, _key(r[a]), b, _key(r[b])) for a, b in itertools.combinations(names, 2)}
        return singles | pairs

    covers = [cover(r) for r in rows]
    todo = set().union(*covers) if covers else set()
    chosen = []
    while todo:
        best = max(range(len(rows)), key=lambda n: len(covers[n] & todo))
        chosen.append(rows[best])
        todo -= covers[best]
    return chosen


def _product(axes: dict[str, list], valid: Callable[[dict], bool] = lambda r: True) -> list[dict]:
    names = list(axes)
    rows = [dict(zip(names, combo)) for combo in itertools.product(*axes.values())]
    return [r for r in rows if valid(r)]


# --------------------------------------------------------------- categories

@dataclass(frozen=True)
class Category:
    """A rule group: axes over a base case, and how a row becomes a case."""

    name: str
    doc: str
    axes: Callable[[bool], dict[str, list]]  # cuda -> axes
    build: Callable[[Case, dict], Case | None]
    valid: Callable[[dict], bool] = lambda r: True
    cuda_only: bool = False


def _set(**fixed):
    """A builder that copies axis values with the same names onto the base case."""
    def build(base: Case, row: dict) -> Case:
        return replace(base, **fixed, **row)
    return build


def _shape_build(base: Case, row: dict) -> Case:
    """Rows with a ``shape`` axis ('train' Lq == Lk, 'infer' Lq < Lk, 'decode')."""
    row = dict(row)
    shape = row.pop("shape", "train")
    L = base.Lk
    Lq = {"train": L, "infer": max(1, L // 2 - 1), "decode": 1}[shape]
    return replace(base, Lq=Lq, Lk=L, **row)


def _lengths_build(base: Case, row: dict) -> Case | None:
    Lk, mode = row["Lk"], row["mode"]
    Lq = {"train": Lk, "half": (Lk + 1) // 2, "tile": min(Lk, 64), "decode": 1}[mode]
    W, C = row["wc"]
    return replace(base, Lq=Lq, Lk=Lk, window=W, chunk=C, Hq=2, Hkv=1)


def _lengths_valid(row: dict) -> bool:
    Lk, mode = row["Lk"], row["mode"]
    if mode == "tile" and Lk <= 64:
        return False  # same as train
    if mode in ("half", "decode") and Lk == 1:
        return False  # same as train
    return True


def _nan_half(build: Callable[[Case, dict], Case | None], when: Callable[[dict], bool]):
    """``build`` with NaN in every unseen key slot (``nan_slots``) on the rows where
    ``when(row)``: half a category's rows, chosen by an axis it already has (the full tier
    multiplies axes, a new one would double it), so a visibility leak there is NaN, an
    exact failure, not a small excess over the bound (a bf16 leak of one landmark
    measured 1.1-1.5x the bound on clean inputs), and the other half stays clean."""
    def wrapped(base: Case, row: dict) -> Case | None:
        case = build(base, row)
        return replace(case, nan_slots=True) if case is not None and when(row) else case
    return wrapped


def _window_build(base: Case, row: dict) -> Case:
    W = row["W"]
    Lk = base.Lk
    W = {"Lk": Lk, "Lk+kv": Lk + row["kv_start"], "huge": 10**9, "2^64+3": 2**64 + 3}.get(W, W)
    return replace(base, window=W, expand=row["expand"], kv_start=row["kv_start"],
                   Lq=row.get("Lq", base.Lq))


def _kv_build(base: Case, row: dict) -> Case:
    C = base.chunk
    kv = {"0": 0, "1": 1, "C-1": C - 1, "C": C, "1e6+3": 10**6 + 3, "2^31-120": 2**31 - 120,
          "2^63+5": 2**63 + 5}[row["kv"]]
    lmk, exp = row["flags"]
    return _shape_build(base, dict(shape=row["shape"], kv_start=kv, mask_lmk=lmk, expand=exp))


#: The chunk category's chunks longer than its cache (129 keys) whose boundary falls inside
#: it, at key 60 (``kv_start = chunk - 60``): without the boundary shift
#: (``Problem.kernel_frame(True)``, a chunk of Lk + 1) TileLang's frame would pass its 2**22
#: positions with both, Triton's int64 with 2^63+5 (it takes 2^22-2 unshifted).
_BOUNDARY_AT_60 = {"2^22-2@60": 2**22 - 2, "2^63+5@60": 2**63 + 5}


def _chunk_build(base: Case, row: dict) -> Case:
    row = dict(row)
    C = row.pop("chunk")
    kv = 0
    if C in _BOUNDARY_AT_60:
        C = _BOUNDARY_AT_60[C]
        kv = C - 60
    return replace(base, window=40, Lk=129, chunk=C, kv_start=kv, **row)


def _tile_chunk_build(base: Case, row: dict) -> Case:
    """Chunk sizes at the kernels' key-block widths: the landmark column of a key
    block is found from the block's phase ``(kv_start + n0) mod C``; at
    ``C == BLOCK_N`` the phase wraps to exactly 0 after every block and at
    ``C == BLOCK_N / 2`` a block holds two landmarks (off-by-ones live there)."""
    C = row["chunk"]
    kv = {"0": 0, "half": C // 2, "C-1": C - 1}[row["kv"]]
    D = row["D"]
    # Long enough that the blocks of a program loop over several key blocks. On the
    # GPU, grid "prefill" has enough programs (2 x 12 heads x 8 blocks of 128 queries)
    # that both backends take their prefill grid (TileLang's D = 96 prefill kernel at
    # C < 64 failed to compile at 7e93d56 and no case reached it), grid "split" few
    # enough (1 x 4 heads: 64 programs of TileLang's 64-row split tile) for split-KV;
    # TileLang's default path runs them on the prefill grid since session 14 (C + 5 keys
    # reach under launch.SPLIT_MIN_TILES key tiles) and the optional backend
    # tilelang-split on split-KV (Dv 96 and 128). On CPU (180 queries, 1 x 2/1 heads)
    # the path is whatever the launchers choose for that size.
    cuda = base.device.startswith("cuda")
    if cuda:
        base = replace(base, B=2, Hq=12, Hkv=4) if row["grid"] == "prefill" else replace(base, B=1)
    L = 1024 if cuda else 180
    return replace(base, chunk=C, window=C + 5, kv_start=kv, Dqk=D, Dv=D, dtype=row["dtype"],
                   Lq=L, Lk=L, mask_lmk=True, expand=True, nan_slots=True)


#: The flags category's head dims on the GPU: name -> (D, Lq or None for the base's).
#: TileLang picks its kernel per flag pair on split-KV (D = 96 / 128 on small grids; with
#: these short windows through the optional backend tilelang-split since session 14)
#: (and, until session 12, on its short prefill tile at D <= 64, Lq <= 64).
_FLAGS_D = {"D64": (64, None), "D64q3": (64, 3), "D96": (96, None), "D128": (128, None)}


def _flags_build(base: Case, row: dict) -> Case:
    lmk, exp = row["flags"]
    W, C = row["wc"]
    D, Lq = _FLAGS_D[row.get("D", "D64")]
    return replace(base, mask_lmk=lmk, expand=exp, window=W, chunk=C, kv_start=row["kv_start"],
                   Dqk=D, Dv=D, Lq=Lq or base.Lq)


def _empty_rows_build(base: Case, row: dict) -> Case:
    # every config has rows with no visible key (checked by test_cases.py)
    cfg = {
        "C1": dict(chunk=1, window=7, mask_lmk=True, expand=True),  # every key is a landmark
        "W1": dict(chunk=4, window=1, mask_lmk=True, expand=False),  # row at a landmark sees only itself
        "W1kv": dict(chunk=2, window=1, mask_lmk=True, expand=False, kv_start=3),
    }[row["cfg"]]
    return replace(base, dtype=row["dtype"], Lq=row.get("Lq", 65), Lk=65, **cfg)


def _scale_build(base: Case, row: dict) -> Case:
    return replace(base, sm_scale=row["sm_scale"], dtype=row["dtype"], Dqk=row["D"][0], Dv=row["D"][1])


def _nan_build(base: Case, row: dict) -> Case:
    lmk, exp = row["flags"]
    return _shape_build(base, dict(shape=row["shape"], kv_start=row["kv_start"], mask_lmk=lmk,
                                   expand=exp, window=row["W"], nan_slots=True, layout=row["layout"]))


def _nan_valid(row: dict) -> bool:
    """A row whose queries see every key (a training shape without landmark masking) has no
    slot to poison: not a row of ``nan_slots``. A ``valid`` predicate, so the quick tier's
    covering array is built from the rows that remain (the sizes are the CPU base case's,
    the GPU's differ only in B and heads, which visibility does not read)."""
    case = _nan_build(_base("cpu"), row)
    return not bool(seen_keys(case.Lq, case.Lk, **case.rule()).all())


def _head_dims(row: dict) -> dict:
    """``Dqk = Dv = row["D"]`` where the row has a ``D`` axis (the GPU tier's); else nothing,
    so the base case's head dims stay."""
    D = row.get("D")
    return {} if D is None else dict(Dqk=D, Dv=D)


def _nan_seen_build(base: Case, row: dict) -> Case:
    lmk, exp = row["flags"]
    return _shape_build(base, dict(shape=row["shape"], kv_start=row["kv_start"], mask_lmk=lmk,
                                   expand=exp, window=row["W"], nan_seen=True, layout=row["layout"],
                                   **_head_dims(row)))


def _inf_seen_build(base: Case, row: dict) -> Case:
    lmk, exp = row["flags"]
    # at kv_start 21 a NaN k row beside it too (second_seen_slot): a row seeing both must be NaN
    return _shape_build(base, dict(shape=row["shape"], kv_start=row["kv_start"], mask_lmk=lmk,
                                   expand=exp, window=row["W"], inf_seen=True, layout=row["layout"],
                                   nan_seen=row["kv_start"] == 21, dtype=row["dtype"], **_head_dims(row)))


def _nan_v_build(base: Case, row: dict) -> Case:
    lmk, exp = row["flags"]
    return _shape_build(base, dict(shape=row["shape"], kv_start=row["kv_start"], mask_lmk=lmk,
                                   expand=exp, window=row["W"], nan_v=True, nan_slots=row["nan"],
                                   layout=row["layout"], dtype=row["dtype"], **_head_dims(row)))


def _decode_build(base: Case, row: dict) -> Case:
    Hq, Hkv = row["heads"]
    # the layout follows kv_start (no axis of its own: the full tier multiplies axes): the
    # cache far into the sequence is a NaN-padded BLHD view, heads strided
    return replace(base, Lq=1, Lk=row["Lk"], Hq=Hq, Hkv=Hkv, kv_start=row["kv_start"],
                   window=row["W"], chunk=64, nan_slots=row["nan"], dtype=row["dtype"],
                   layout="padt" if row["kv_start"] else "bhld", **_head_dims(row))


#: gqa_pack: flag pair and chunk per group size G (every pair once, C = 16 and 64;
#: mask_lmk with C = 64 at G = 3 and 8, where TileLang zeroes V's landmark rows from
#: the tile's landmark column, ``lmk_rows_j0``, on both its tiles).
_PACK_RULE = {2: ((False, False), 16), 3: ((True, False), 64), 4: ((False, True), 64),
              8: ((True, True), 64)}


def _pack_build(base: Case, row: dict) -> Case:
    """Short query blocks of GQA heads: ``G * Lq`` around 64 and 128 rows (the tile
    heights a kernel may pack the G query heads of one key/value head into), one
    query, and a batch large enough (``B * Hq >= 72`` programs per query block)
    that TileLang keeps its prefill grid on a 132-SM H200 (Triton, which counts
    GQA-packed tiles, still takes split-KV for some). NaN in every unseen slot;
    BHLD in bf16, NaN-padded BLHD views in fp16."""
    Hq, Hkv = row["heads"]
    G = Hq // Hkv
    Lq = {"1": 1, "64/G": 64 // G, "64/G+1": 64 // G + 1, "128/G": 128 // G,
          "128/G+1": 128 // G + 1}[row["Lq"]]
    (lmk, exp), C = _PACK_RULE[G]
    dtype = "bf16" if row["layout"] == "bhld" else "fp16"
    return replace(base, B=-(-72 // Hq), Hq=Hq, Hkv=Hkv, Lq=Lq, Lk=300, Dqk=row["D"][0],
                   Dv=row["D"][1], window=100, chunk=C, kv_start=5, mask_lmk=lmk, expand=exp,
                   layout=row["layout"], dtype=dtype, nan_slots=True)


def _chunk_view_build(base: Case, row: dict) -> Case:
    """Calls whose every key tile lies inside one chunk, so both backends' chunk views of
    ``v`` serve them (a view that leaves each chunk's landmark row out; the copy engine
    writes it as zeros): ``kv_start`` and ``Lk`` multiples of C, both flags, C = 64 / 128
    (TileLang: a multiple of its prefill tile's 64 or 128 keys; Triton's TMA kernel, at
    D <= 64 and since session 28 D = 128: of its key block), grids of at least 96 programs per 64-query block (both
    backends keep their prefill grids; Triton's TMA kernel needs a long enough grid and
    takes the longer shape), NaN in every unseen slot, the landmark rows included."""
    C = row["chunk"]
    Hq, Hkv = row["heads"]
    Lq, Lk = {"train": (2048, 2048), "infer": (640, 2048)}[row["shape"]]
    dtype = "bf16" if row["layout"] == "bhld" else "fp16"
    return replace(base, B=-(-96 // Hq), Hq=Hq, Hkv=Hkv, Lq=Lq, Lk=Lk, Dqk=row["D"], Dv=row["D"],
                   window=row["W"], chunk=C, kv_start={"0": 0, "2C": 2 * C}[row["kv"]],
                   mask_lmk=True, expand=True, layout=row["layout"], dtype=dtype,
                   nan_slots=True)


def _long_build(base: Case, row: dict) -> Case:
    Lq, Lk = row["L"]
    return replace(base, B=1, Hq=8, Hkv=2, Lq=Lq, Lk=Lk, Dqk=128, Dv=128, window=row["W"], chunk=64,
                   kv_start=row["kv_start"], dtype=row["dtype"], nan_slots=True)


#: ``long4m``: a cache past 2**22 keys (Lk + C passes TileLang's ``launch.MAX_POSITIONS``).
LONG4M_LK = (1 << 22) + 1003


def _long4m_build(base: Case, row: dict) -> Case:
    cuda = base.device.startswith("cuda")
    Lq = {"decode": 1, "chunk": 200 if cuda else 40}[row["shape"]]
    D = 128 if cuda else 32
    return replace(base, B=1, Hq=4 if cuda else 2, Hkv=1, Lq=Lq, Lk=LONG4M_LK, Dqk=D, Dv=D,
                   window=512, chunk=row["chunk"],
                   expand=row["expand"], kv_start=row["kv_start"], dtype=row["dtype"],
                   nan_slots=True)


def _gqa_build(base: Case, row: dict) -> Case:
    Hq, Hkv = row["heads"]
    if not base.device.startswith("cuda"):
        base = replace(base, Lq=65, Lk=65)
    return _shape_build(base, dict(shape=row["shape"], Hq=Hq, Hkv=Hkv, B=row["B"], layout=row["layout"]))


def _empty_dims_build(base: Case, row: dict) -> Case:
    dims = {"B0": dict(B=0), "H0": dict(Hq=0, Hkv=0), "Lq0": dict(Lq=0, Lk=65),
            "L0": dict(Lq=0, Lk=0)}[row["dims"]]
    return replace(base, **{"Lq": 65, "Lk": 65, "dtype": row["dtype"], **dims})


#: error rule -> (what it breaks, regexes that must all match the ValueError message)
ERROR_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "q_3d": ("q is 3-D", (r"\bq\b", r"4-?D")),
    "k_5d": ("k is 5-D", (r"\bk\b", r"4-?D")),
    "k_sparse": ("k is a sparse COO tensor", (r"\bk\b", r"dense|strided")),
    "v_nested": ("v is a nested tensor of its batch rows", (r"\bv\b", r"dense|strided|nested")),
    "int_dtype": ("q, k, v are int32", (r"dtype",)),
    "mixed_dtype": ("k has another floating dtype than q", (r"dtype",)),
    "mixed_device": ("k on the CPU, q and v on CUDA", (r"device",)),
    "heads_not_multiple": ("Hq=3, Hkv=2", (r"\bHq\b", r"\bHkv\b")),
    "lq_gt_lk": ("Lq=64 > Lk=63", (r"\bLq\b", r"\bLk\b")),
    "batch_mismatch": ("k, v have B+1", (r"\bB\b|batch",)),
    "dqk_mismatch": ("k has Dqk+8", (r"\bDqk\b",)),
    "lk_mismatch": ("v has Lk-1 keys", (r"\bLk\b",)),
    "hkv_mismatch": ("v has Hkv*2 heads", (r"\bHkv\b",)),
    "window_zero": ("window_size=0", (r"\bwindow_size\b",)),
    "window_negative": ("window_size=-5", (r"\bwindow_size\b",)),
    "chunk_zero": ("chunk_size=0", (r"\bchunk_size\b",)),
    "kv_start_negative": ("kv_start=-1", (r"\bkv_start\b",)),
    "sm_scale_nan": ("sm_scale=nan", (r"\bsm_scale\b",)),
    "sm_scale_inf": ("sm_scale=inf", (r"\bsm_scale\b",)),
}


def _errors_build(base: Case, row: dict) -> Case | None:
    if row["rule"] == "mixed_device" and not base.device.startswith("cuda"):
        return None  # needs two devices
    return replace(base, error=row["rule"], dtype=row["dtype"], Lq=64, Lk=64, B=1, Hq=4, Hkv=2)


_F4 = [(True, True), (True, False), (False, True), (False, False)]


#: ``reach``: calls that take a kernel branch no other category takes on the GPU. Session
#: 33's coverage audit planned every full-tier CUDA case with both launchers (a 132-SM
#: Hopper device, no kernel run) and listed what the launchers can plan for valid calls but
#: no case reached; each row is the smallest call found for one such branch, with the branch
#: it is for (``conformance/test_cases.py`` checks each still plans it). Fields override the
#: CUDA base case (2 x 4/2 heads, 129 x 129, D 64, W 32, C 16, bf16).
REACH: dict[str, tuple[dict, str]] = {
    # q BHLD, k / v a BLHD cache read in place: TileLang bakes q's and k/v's orders apart
    "cache-decode-G4": (dict(B=1, Hq=8, Lq=1, Lk=300, window=256, chunk=64, layout="cache",
                             nan_slots=True), "TileLang's packed decode tile (G = 4) on a BLHD cache"),
    "cache-decode-G3": (dict(B=1, Hq=6, Lq=1, Lk=300, window=256, chunk=64, layout="cache",
                             dtype="fp16"), "the same at G = 3, fp16"),
    "cache-pack-G8": (dict(B=9, Hq=16, Lq=8, Lk=300, window=100, chunk=64, kv_start=5,
                           layout="cache", nan_slots=True),
                      "TileLang's G = 8 packed tile on its prefill grid, BLHD cache"),
    "cache-chunk-D128": (dict(B=1, Hq=8, Lq=129, Lk=1000, Dqk=128, Dv=128, window=256, chunk=64,
                              kv_start=64, layout="cache", nan_slots=True),
                         "a 129-query chunk at D = 128 against a BLHD cache"),
    # Triton's kernel frames past 2**31: int64 positions, no register cap
    "int64-split": (dict(window=40, chunk=2**40, kv_start=2**40 - 60, nan_slots=True),
                    "Triton's split-KV kernel on an int64 frame"),
    "int64-decode": (dict(Lq=1, Lk=2048, window=512, chunk=2**40, kv_start=2**40 - 60),
                     "Triton's split-KV decode on an int64 frame (the chunk expands the window "
                     "to key 60)"),
    "int64-prefill": (dict(Lq=70, window=40, chunk=2**40, kv_start=2**40 - 60, nan_slots=True),
                      "Triton's pointer prefill kernel on an int64 frame"),
    "int64-moved": (dict(Lq=70, window=40, chunk=2**30, kv_start=2**30 - 60),
                    "Triton's frame moved past 2**31 (launch._frame's shift branch)"),
    "int64-tma": (dict(B=1, Hq=32, Hkv=32, Lq=2048, Lk=2048, Dqk=128, Dv=128, window=512,
                       chunk=2**40, kv_start=2**40 - 1000),
                  "Triton's TMA prefill kernel on an int64 frame"),
    # Triton's 16-bit split-KV tiles the other categories leave out
    "split-D32": (dict(B=1, Lq=1, Lk=300, Dqk=32, Dv=32, window=256, chunk=64),
                  "Triton's D = 32 split tile (16 x 32)"),
    "split-D32-B8": (dict(B=8, Hq=32, Hkv=4, Lq=1, Lk=4096, Dqk=32, Dv=32, window=512, chunk=64),
                     "Triton's D = 32 narrow split tile (16 x 128)"),
    "split-D64-B8": (dict(B=8, Hq=32, Hkv=4, Lq=1, Lk=4096, window=512, chunk=64, nan_slots=True),
                     "Triton's D = 64 narrow split tile (16 x 128): the bench's GQA decode"),
    # head dims 33..63 that are not powers of two: padded tiles
    "D48-prefill": (dict(Dqk=48, Dv=48), "Triton's pointer prefill with phases and padded head dims"),
    "D48-tma": (dict(B=1, Hq=32, Hkv=32, Lq=2048, Lk=2048, Dqk=48, Dv=48, window=512, chunk=64,
                     nan_slots=True), "Triton's TMA kernel at D = 48 (register cap, chunk view of v)"),
    # fp32 prefill rows
    "fp32-D96-prefill": (dict(dtype="fp32", Hq=32, Hkv=32, Dqk=96, Dv=96),
                         "Triton's fp32 prefill with padded head dims"),
    "fp32-D256-prefill": (dict(dtype="fp32", Hq=32, Hkv=32, Dqk=256, Dv=256),
                          "Triton's fp32 D = 256 prefill row (32 x 16 w8 s2)"),
    "fp32-scale-prefill": (dict(dtype="fp32", Hq=32, Hkv=32, sm_scale=0.3),
                           "an explicit scale on Triton's fp32 prefill"),
    # flag pairs other than (True, True) at head dims past 128 and at 32
    "D256-lmk-one": (dict(B=1, Hq=8, Hkv=8, Lq=1024, Lk=1024, Dqk=256, Dv=256, window=512,
                          chunk=64), "Triton's D = 256 pointer prefill with the one-landmark test"),
    "D256-no-lmk": (dict(B=1, Lq=65, Lk=65, Dqk=256, Dv=256, mask_lmk=False),
                    "D = 256 kernels without the landmark mask"),
    "D192-no-expand": (dict(B=1, Lq=65, Lk=65, Dqk=192, Dv=192, expand=False),
                       "D = 192 kernels without the chunk expansion"),
    "D32-no-flags": (dict(Dqk=32, Dv=32, mask_lmk=False, expand=False, kv_start=7),
                     "D = 32 kernels with neither flag"),
    # TileLang's 128 x 64 split tile (mask_lmk without expansion) beyond lmk_cols 0 / 1
    "noexp-split-C32": (dict(B=1, Lq=1, Lk=300, Dqk=128, Dv=128, window=100, chunk=32, expand=False,
                             nan_slots=True), "TileLang's 128 x 64 split tile with two landmark columns"),
    "noexp-split-DqkDv": (dict(B=1, Lq=1, Lk=300, Dqk=64, Dv=128, window=100, chunk=64,
                               expand=False, layout="bthd"),
                          "that tile with Dqk != Dv on BLHD views"),
    # explicit scales on the split-KV kernels
    "scale-split-neg": (dict(B=1, Lq=1, Lk=1024, Dqk=128, Dv=128, window=512, chunk=64, sm_scale=-0.3),
                        "a negative scale on both split-KV paths (TileLang's kernel without scale_fold)"),
    "scale-split-zero": (dict(B=1, Lq=1, Lk=1024, window=512, chunk=64, sm_scale=0.0),
                         "a zero scale on a split-KV decode"),
    # session 40: a cache of 2**22 keys, a whole number of chunks: TileLang's wide kernels with
    # the chunk view of v and constant landmark columns (long4m's 2**22 + 1003 keys admit no
    # view), on both its paths
    "wide-view-decode": (dict(B=1, Hq=4, Hkv=1, Lq=1, Lk=1 << 22, Dqk=128, Dv=128, window=512,
                              chunk=64, nan_slots=True),
                         "TileLang's split-KV kernel built wide with the view and lmk_const"),
    "wide-view-prefill": (dict(B=1, Hq=32, Hkv=1, Lq=512, Lk=1 << 22, Dqk=128, Dv=128,
                               window=512, chunk=64, nan_slots=True),
                          "TileLang's prefill grid built wide with the view and lmk_const"),
}


def _reach_build(base: Case, row: dict) -> Case:
    return replace(base, **REACH[row["call"]][0])


def _categories() -> list[Category]:
    C = []
    C.append(Category(
        "basic", "the default call in every dtype, training and inference",
        lambda cuda: {"dtype": list(DTYPES), "shape": ["train", "infer"]},
        _shape_build))
    C.append(Category(
        "dtype", "dtypes across head dims, flags and windows",
        lambda cuda: {"dtype": list(DTYPES), "D": [(64, 64), (128, 128)], "flags": [(True, True), (False, False)],
                      "window": [32, 100]},
        lambda b, r: replace(b, dtype=r["dtype"], Dqk=r["D"][0], Dv=r["D"][1], mask_lmk=r["flags"][0],
                             expand=r["flags"][1], window=r["window"])))
    C.append(Category(
        "headdim", "head dims 32..256 and Dqk != Dv (default scale 1/sqrt(Dqk)), multiples of "
        "16 and between them (40, 72 / 56, 33 / 200, 120 / 90, 120, 200, 64 / 56: TileLang builds "
        "its kernels for the next multiples, 120 / 90 for 128 / 96, which its split-KV kernels "
        "serve; on the GPU it reads bf16 / fp16 rows of a multiple of 16 bytes as they are, 40, "
        "72 / 56, 120, 200 and 64 / 56, and pads the others); on the GPU "
        "also C = 64, where the kernels test the tile's landmark columns by integer compares, "
        "and 3 queries (decode-sized: TileLang's split-KV at 96 / 128 through --backend tilelang-split; "
        "its D <= 64 decode tile until session 12)",
        lambda cuda: {"D": [(32, 32), (64, 64), (80, 80), (96, 96), (112, 112), (128, 128),
                            (192, 192), (256, 256), (64, 128), (128, 64), (192, 128), (96, 64),
                            (64, 32), (40, 40), (72, 56), (33, 200), (120, 90), (120, 120),
                            (200, 200), (64, 56)],
                      "dtype": list(DTYPES), "chunk": [16, 64] if cuda else [16],
                      "layout": ["bhld", "bthd", "padt"], **({"Lq": [65, 3]} if cuda else {})},
        lambda b, r: replace(b, Dqk=r["D"][0], Dv=r["D"][1], dtype=r["dtype"], Lq=r.get("Lq", 65),
                             Lk=65, B=1, chunk=r["chunk"], layout=r["layout"])))
    C.append(Category(
        "gqa", "Hq/Hkv = 1, 2, 4, 8 and MQA; batch 1..3",
        lambda cuda: {"heads": [(4, 4), (4, 2), (8, 2), (8, 1), (3, 1)] + ([(16, 2)] if cuda else []),
                      "B": [1, 2, 3], "shape": ["train", "infer"], "layout": ["bhld", "bthd"]},
        _gqa_build))
    C.append(Category(
        "lengths", "Lq == Lk and Lq < Lk on and around tile / chunk boundaries",
        lambda cuda: {"Lk": [1, 63, 64, 65, 127, 128, 129, 333] + ([1000, 2080] if cuda else []),
                      "mode": ["train", "half", "tile", "decode"],
                      "wc": [(32, 16), (64, 64)]},
        _nan_half(_lengths_build, lambda r: r["wc"] == (64, 64)), _lengths_valid))
    C.append(Category(
        "window", "window below / equal / above / not a multiple of the chunk, >= the key range "
        "(10^9, and 2^64+3 past int64)",
        lambda cuda: {"W": [1, 8, 16, 32, 37, "Lk", "Lk+kv", "huge", "2^64+3"], "expand": [True, False],
                      "kv_start": [0, 5], "Lq": [129, 60]},
        _nan_half(_window_build, lambda r: r["kv_start"] == 5)))
    C.append(Category(
        "chunk", "chunk sizes 1, 2, 63, 64, 65, 128 and 2^63+5 (past int64) with both flags; "
        "2^22-2 and 2^63+5 with their boundary at key 60 (the kernels' frames shift them into a chunk "
        "of Lk+1 where their positions would not fit: TileLang both, Triton 2^63+5)",
        lambda cuda: {"chunk": [1, 2, 63, 64, 65, 128, 2**63 + 5] + list(_BOUNDARY_AT_60),
                      "mask_lmk": [True, False], "expand": [True, False], "Lq": [129, 70]},
        _nan_half(_chunk_build, lambda r: r["Lq"] == 70)))
    C.append(Category(
        "tile_chunk", "chunk sizes equal to the kernels' key-block widths (16..128), every "
        "alignment of blocks to chunks, NaN in every unseen slot",
        lambda cuda: {"chunk": [16, 32, 64, 128], "kv": ["0", "half", "C-1"], "D": [64, 96, 128],
                      "dtype": ["bf16", "fp16"], "grid": ["prefill", "split"] if cuda else ["prefill"]},
        _tile_chunk_build))
    C.append(Category(
        "kv_start", "kv_start 0, 1, C-1, C, 10^6+3, 2^31-120, 2^63+5 (landmarks and chunk starts by "
        "position; positions crossing 2^31 inside the call, and past int64)",
        lambda cuda: {"kv": ["0", "1", "C-1", "C", "1e6+3", "2^31-120", "2^63+5"],
                      "shape": ["train", "infer", "decode"],
                      "flags": [(True, True), (True, False), (False, True)]},
        _nan_half(_kv_build, lambda r: r["shape"] != "train")))
    C.append(Category(
        "flags", "all four (mask_lmk, expand_to_chunk) combinations; on the GPU also at D = 96 "
        "and 128 and with 3 queries at D = 64 (TileLang's split-KV kernels "
        "differ per flag pair: --backend tilelang-split)",
        lambda cuda: {"flags": _F4, "wc": [(32, 16), (20, 16), (5, 8), (70, 64)], "kv_start": [0, 7],
                      **({"D": list(_FLAGS_D)} if cuda else {})},
        _nan_half(_flags_build, lambda r: r["kv_start"] == 7)))
    C.append(Category(
        "scale", "explicit sm_scale, zero and negative included (inputs rescaled so the softmax "
        "stays informative)",
        lambda cuda: {"sm_scale": [0.05, 0.3, 1.0, 0.0, -0.3], "dtype": list(DTYPES), "D": [(64, 64), (64, 32)]},
        _scale_build))
    C.append(Category(
        "empty_rows", "rows with no visible key: o == 0 exactly, lse == -inf",
        lambda cuda: {"cfg": ["C1", "W1", "W1kv"], "dtype": list(DTYPES), "Lq": [65, 20]},
        _empty_rows_build))
    C.append(Category(
        "layout", "contiguous, BLHD transposed views, offset views in NaN-filled buffers, mixed; "
        "on the GPU at D = 64 and 128 (TileLang's split-KV path at 128: --backend tilelang-split)",
        lambda cuda: {"layout": list(LAYOUTS), "dtype": list(DTYPES), "heads": [(4, 2), (2, 2)],
                      "shape": ["train", "infer"], **({"D": [64, 128]} if cuda else {})},
        lambda b, r: _shape_build(replace(b, Dqk=r.get("D", b.Dqk), Dv=r.get("D", b.Dv)),
                                  dict(shape=r["shape"], layout=r["layout"], dtype=r["dtype"],
                                       Hq=r["heads"][0], Hkv=r["heads"][1]))))
    C.append(Category(
        "nan_slots", "NaN in every key slot no query can see (from reference.mask)",
        lambda cuda: {"kv_start": [0, 21], "shape": ["train", "infer", "decode"],
                      "flags": [(True, True), (False, True), (True, False)], "W": [8, 40],
                      "layout": ["bhld", "padt"]},
        _nan_build, _nan_valid))
    C.append(Category(
        "nan_seen", "NaN in the k row of one key that some queries see and others do not "
        "(seen_slot): SPEC's propagation rule, NaN in exactly the rows that see it; on the GPU "
        "at D = 64, 96 and 128 (TileLang's split-KV kernels at 96 / 128: --backend tilelang-split)",
        lambda cuda: {"kv_start": [0, 21], "shape": ["train", "infer", "decode"],
                      "flags": [(True, True), (False, False)], "W": [8, 40], "layout": ["bhld", "padt"],
                      **({"D": [64, 96, 128]} if cuda else {})},
        _nan_seen_build))
    C.append(Category(
        "inf_seen", "+inf in one element of the k row of the nan_seen key (seen_slot): the rows that "
        "see it score it +inf or -inf by the sign of q; SPEC's formula gives lse = +inf and NaN o "
        "for +inf, and -inf adds nothing (a row left with no finite score is an empty row); at "
        "kv_start 21 also NaN in a neighbouring key some of those rows see: NaN wins there",
        lambda cuda: {"kv_start": [0, 21], "shape": ["train", "infer", "decode"],
                      "flags": [(True, True), (False, False)], "W": [8, 40], "layout": ["bhld", "padt"],
                      "dtype": ["bf16", "fp16", "fp32"], **({"D": [64, 128]} if cuda else {})},
        _inf_seen_build))
    C.append(Category(
        "nan_v_seen", "NaN, +inf and -inf in the v row of one key that some queries see and others do "
        "not (seen_slot): exactly the rows that see it get them (a flash kernel's P @ V spreads them "
        "over the tile: 0 * NaN); on the GPU also at D = 128 (split-KV kernels)",
        lambda cuda: {"kv_start": [0, 21], "shape": ["train", "infer", "decode"],
                      "flags": [(True, True), (False, False)], "W": [8, 40], "layout": ["bhld", "padt"],
                      "dtype": ["bf16", "fp16", "fp32"], "nan": [False, True],
                      **({"D": [64, 128]} if cuda else {})},
        _nan_v_build))
    C.append(Category(
        "errors", "every SPEC error rule raises ValueError naming the argument",
        lambda cuda: {"rule": list(ERROR_RULES), "dtype": ["bf16"]},
        _errors_build))
    C.append(Category(
        "empty_dims", "B == 0, H == 0, Lq == 0, Lq == Lk == 0 return empty outputs",
        lambda cuda: {"dims": ["B0", "H0", "Lq0", "L0"], "dtype": ["bf16", "fp32"]},
        _empty_dims_build))
    C.append(Category(
        "decode", "single-token decode against short and long caches, the caches far into the "
        "sequence (kv_start 10^6+3) as NaN-padded BLHD views; on the GPU also at D = 128 "
        "(split-KV kernels)",
        lambda cuda: {"Lk": [1, 17, 64, 65, 129, 333] + ([1000, 2080, 8191, 32768] if cuda else []),
                      "heads": [(8, 1), (8, 2), (4, 4)], "kv_start": [0, 10**6 + 3], "W": [48, 256],
                      "nan": [False, True], "dtype": ["bf16", "fp32"], **({"D": [64, 128]} if cuda else {})},
        _decode_build))
    C.append(Category(
        "gqa_pack", "GQA with short query blocks on the GPU: G = 2, 3, 4, 8 query heads per "
        "key/value head times 1 query or G * Lq at and just past 64 and 128 rows (TileLang packs "
        "them into one tile where they fit, on its prefill grid), D 64 / 128 and 96 x 64, BHLD "
        "and padded BLHD views, NaN in every unseen slot",
        lambda cuda: {"heads": [(4, 2), (6, 2), (8, 2), (16, 2)],
                      "Lq": ["1", "64/G", "64/G+1", "128/G", "128/G+1"],
                      "D": [(64, 64), (128, 128), (96, 64)], "layout": ["bhld", "padt"]},
        _pack_build, cuda_only=True))
    C.append(Category(
        "chunk_view", "calls the chunk views of v serve on the GPU (kv_start and Lk multiples "
        "of C = 64 / 128, both flags): D 64, 96, 128 and 120 (TileLang: its D = 128 kernels "
        "reading the call's own 120 columns), GQA, Lq < Lk, BHLD bf16 and BLHD views in fp16, "
        "NaN in every unseen slot",
        lambda cuda: {"chunk": [64, 128], "kv": ["0", "2C"], "D": [64, 96, 128, 120],
                      "layout": ["bhld", "bthd", "padt"], "shape": ["train", "infer"],
                      "heads": [(8, 8), (12, 4)], "W": [200, 512]},
        _chunk_view_build, cuda_only=True))
    C.append(Category(
        "long4m", "a cache of 2^22 + 1003 keys, where TileLang's kernels test landmarks with "
        "two float quotients (built wide): decode and a 200-query chunk (40 on the CPU) at "
        "kv_start 0 and 10^6+3, chunks 7 (the per-element float test) and 64 (landmark "
        "columns, V's landmark rows), both expand_to_chunk, window 512, bf16 / fp16 (fp16 / "
        "fp32 on the CPU), NaN in every unseen slot; 4 query heads on one key/value head at "
        "D = 128 on the GPU (16 programs or fewer: TileLang's split-KV kernel), 2 at D = 32 "
        "on the CPU",
        lambda cuda: {"shape": ["decode", "chunk"], "chunk": [7, 64], "expand": [True, False],
                      "kv_start": [0, 10**6 + 3],
                      "dtype": ["bf16", "fp16"] if cuda else ["fp16", "fp32"]},
        _long4m_build))
    C.append(Category(
        "reach", "CUDA only (session 33): calls that take a kernel branch no other category "
        "takes on the GPU (a coverage audit: REACH names each call's branch): BLHD caches beside "
        "a BHLD q, Triton's int64 frames, split tiles at D = 32 and the narrow 16 x 128, D = 48, "
        "fp32 prefill rows, flag pairs at D = 32 / 192 / 256, TileLang's 128 x 64 split tile, "
        "explicit scales on split-KV, TileLang's wide kernels with the view of v",
        lambda cuda: {"call": list(REACH)},
        _reach_build, cuda_only=True))
    C.append(Category(
        "long", "long keys on the GPU: decode and prefill against caches up to 128K",
        lambda cuda: {"L": [(1, 131072), (64, 131072), (2048, 131072), (16384, 16384), (4096, 65536)],
                      "W": [512, 4096], "dtype": ["bf16", "fp16"], "kv_start": [0, 1000]},
        _long_build, cuda_only=True))
    return C


CATEGORIES: list[Category] = _categories()
_CAT = {c.name: c for c in CATEGORIES}


def _base(device: str) -> Case:
    if device.startswith("cuda"):
        return Case(category="", device=device)  # B=2, Hq=4, Hkv=2
    # CPU: the Triton interpreter's cost grows with B * Hq * query tiles
    return Case(category="", device=device, B=1, Hq=2, Hkv=1)


def generate(tier: str = "quick", device: str | torch.device = "cpu",
             categories: Iterable[str] | None = None) -> list[Case]:
    """Every case of a tier on a device, in a fixed order, ids unique.

    ``quick``: a pairwise covering array of each category's axes.
    ``full``: the full product of each category's axes.
    """
    if tier not in ("quick", "full"):
        raise ValueError(f"tier must be 'quick' or 'full', got {tier!r}")
    device = str(device)
    cuda = device.startswith("cuda")
    wanted = list(categories) if categories is not None else [c.name for c in CATEGORIES]
    unknown = [n for n in wanted if n not in _CAT]
    if unknown:
        raise ValueError(f"unknown categories {unknown}; known: {', '.join(_CAT)}")
    out: list[Case] = []
    seen: set[str] = set()
    for name in wanted:
        cat = _CAT[name]
        if cat.cuda_only and not cuda:
            continue
        axes = cat.axes(cuda)
        rows = pairwise(axes, cat.valid) if tier == "quick" else _product(axes, cat.valid)
        for row in rows:
            case = cat.build(replace(_base(device), category=name), row)
            if case is None or case.id in seen:
                continue
            seen.add(case.id)
            out.append(case)
    return out


def resolve_device(want: str) -> str:
    """``--device`` as the run uses it: ``auto`` is CUDA where available, else the CPU;
    ``ValueError`` for ``cuda`` without a CUDA device (the CLI's exit 2, pytest's usage
    error). Here, not in ``conformance.plugin``: the CLI asks before ``pytest.main``, and a
    plugin module imported before pytest loads it warns that its asserts cannot be
    rewritten (``PytestAssertRewriteWarning`` at the end of every ``hils-swa conform``)."""
    if want == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available (--device cpu runs the CPU tier)")
    return want


def left_out(device: str | torch.device = "cpu") -> list[str]:
    """What :func:`generate` leaves out on ``device``, with the reason: the CUDA-only
    categories and the error rules that need a second device (printed by ``hils-swa
    conform``, so nothing is dropped without a word)."""
    cuda = str(device).startswith("cuda")
    out = [] if cuda else [f"categories {', '.join(c.name for c in CATEGORIES if c.cuda_only)}: CUDA only"]
    if not cuda:
        out.append("error rule mixed_device: needs a CUDA device beside the CPU")
    return out


# ------------------------------------------------------------------- inputs

def case_seed(case: Case | str, run_seed: int) -> int:
    """The seed of a case's inputs: a hash of the run seed and the case id."""
    cid = case if isinstance(case, str) else case.id
    h = hashlib.sha256(f"{int(run_seed)}:{cid}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def invisible_slots(case: Case, device=None, block: int = 4096) -> torch.Tensor:
    """``(Lk,)`` bool: key slots no query of the call can see (``reference.seen_keys``,
    linear in memory for long caches)."""
    return ~seen_keys(case.Lq, case.Lk, device=device, block=block, **case.rule())


def seen_tail(k: torch.Tensor, v: torch.Tensor, Lq: int, kw: dict, n: int):
    """``(k_tail, v_tail, kw_tail)``: the last ``n`` keys of a call's cache and its
    arguments with ``kv_start`` moved by the keys left out, the same visibility for a call
    whose every seen key lies in that tail (checked with ``reference.mask.seen_keys``;
    ``ValueError`` otherwise). The reference of a call on a long cache of which only the tail
    is written (tests of TileLang's wide kernels)."""
    Lk = k.shape[2]
    if bool(seen_keys(Lq, Lk, **rule_kwargs(kw))[:Lk - n].any()):
        raise ValueError(f"a query of the call sees a key left of the last {n} of {Lk}")
    return k[:, :, Lk - n:], v[:, :, Lk - n:], dict(kw, kv_start=kw.get("kv_start", 0) + Lk - n)


def poison_unseen(k: torch.Tensor, v: torch.Tensor, Lq: int, kw: dict) -> torch.Tensor:
    """NaN into the ``k`` and ``v`` rows of every key slot no query of the call sees,
    **in place** (clone first to keep the clean inputs). ``k`` and ``v`` are the call's
    canonical ``(B, H, Lk, D)`` tensors; views are written through (a ``transpose(1, 2)``
    of BLHD storage, a column slice). SPEC.md lets such a slot hold anything, so no
    output may change. ``kw``: the call's keyword arguments (``sm_scale`` is ignored,
    any other unknown key refused: ``reference.mask.rule_kwargs``). Returns the
    ``(Lk,)`` mask of those slots. ``ValueError`` when ``k`` and ``v`` disagree on
    ``Lk`` (raw BLHD storage passed instead of its canonical view, for instance)."""
    if k.dim() != 4 or v.dim() != 4 or k.shape[2] != v.shape[2]:
        raise ValueError(f"poison_unseen: k {tuple(k.shape)} and v {tuple(v.shape)} must be 4-D (B, H, Lk, D) "
                         "with the same Lk")
    dead = ~seen_keys(Lq, k.shape[2], device=k.device, **rule_kwargs(kw))
    k[:, :, dead] = float("nan")
    v[:, :, dead] = float("nan")
    return dead


def seen_slot(Lq: int, Lk: int, **rule) -> int:
    """The key of a ``nan_seen`` case (``rule``: window_size, chunk_size, mask_lmk,
    expand_to_chunk, kv_start), also ``hils-swa diff``'s: of the keys some query sees
    but not all, the one nearest the middle of the key range (so queries on both sides
    of it are tested); for one query, its visible key nearest the middle.
    NaN in its k row must reach exactly those queries' rows (SPEC: NaN in a key row i
    sees propagates to row i) and no other: every kernel masks the score, not the load.
    ``nan_v_seen`` puts NaN and infinities in its v row: there a flash kernel's ``p = 0``
    times NaN reaches the other rows of the tile (docs/conformance.md, "Known deviations")."""
    from reference.mask import visibility_mask

    seen = visibility_mask(Lq, Lk, **rule).sum(0)
    keys = torch.nonzero(seen > 0).flatten()
    if keys.numel() == 0:
        raise ValueError(f"no key is visible (Lq={Lq}, Lk={Lk}, {rule}): a NaN in a seen key has nothing to test")
    partial = keys[seen[keys] < Lq] if Lq > 1 else keys
    pool = partial if partial.numel() else keys
    return int(pool[torch.argmin((pool - Lk // 2).abs())])


def second_seen_slot(Lq: int, Lk: int, j: int, **rule) -> int:
    """The key nearest ``j`` (not ``j``) that some query seeing key ``j`` also sees: where an
    ``inf_seen`` case with ``nan_seen`` puts its NaN, so rows see both (``j`` itself when no
    such key exists)."""
    from reference.mask import visibility_mask

    vis = visibility_mask(Lq, Lk, **rule)
    both = (vis & vis[:, j:j + 1]).any(0)
    both[j] = False
    keys = torch.nonzero(both).flatten()
    return int(keys[torch.argmin((keys - j).abs())]) if keys.numel() else j


def put_nan_v(v: torch.Tensor, j: int) -> None:
    """NaN, +inf, -inf into columns 0, 1, 2 of the ``v`` row of key ``j`` (as many as
    ``v`` has), in place: the ``nan_v_seen`` cases, also ``hils-swa diff``'s ``nan_v``."""
    for d, x in zip(range(v.shape[-1]), (float("nan"), float("inf"), float("-inf"))):
        v[:, :, j, d] = x


def _store(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``x`` (B, H, L, D) contiguous -> the same values in the given input form."""
    B, H, L, D = x.shape
    if layout == "bhld":
        return x
    if layout == "bthd":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "pad":  # offset view inside a larger NaN-filled (B, H, L, D) buffer
        buf = torch.full((B + 1, H + 2, L + 5, D + 8), float("nan"), dtype=x.dtype, device=x.device)
        view = buf[1:1 + B, 1:1 + H, 3:3 + L, 4:4 + D]
    elif layout in ("padt", "pad16"):
        # offset view inside a larger NaN-filled (B, L, H, D) buffer, transposed; pad16
        # offsets D by 8 elements of 16 padded, so base and strides are 16-byte
        # aligned (TMA-eligible) when D % 8 == 0
        d_off, d_pad = (4, 8) if layout == "padt" else (8, 16)
        buf = torch.full((B + 1, L + 5, H + 2, D + d_pad), float("nan"), dtype=x.dtype, device=x.device)
        view = buf[1:1 + B, 3:3 + L, 1:1 + H, d_off:d_off + D].transpose(1, 2)
    else:
        raise ValueError(f"unknown layout {layout!r}")
    view.copy_(x)
    return view


def _randn(gen: torch.Generator, shape, std: float) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def make_inputs(case: Case, run_seed: int, device=None):
    """``(q, k, v, kwargs)`` of a case: fresh random inputs, never zeros.

    q and k are scaled so the logits ``sm_scale * <q, k>`` have a standard
    deviation of about 1.5 whatever ``sm_scale`` and ``Dqk`` are (softmax neither
    uniform nor one-hot); v is standard normal. Error cases return the broken
    inputs / arguments of their rule.
    """
    device = torch.device(device if device is not None else case.device)
    gen = torch.Generator().manual_seed(case_seed(case, run_seed))
    dt = case.torch_dtype
    # None or 0 (every logit is 0 anyway): the default scale; negative: its magnitude
    scale = abs(case.sm_scale or 0.0) or default_scale(case.Dqk)
    q_std = 1.5 / (scale * math.sqrt(max(case.Dqk, 1)))
    q = _randn(gen, (case.B, case.Hq, case.Lq, case.Dqk), q_std)
    k = _randn(gen, (case.B, case.Hkv, case.Lk, case.Dqk), 1.0)
    v = _randn(gen, (case.B, case.Hkv, case.Lk, case.Dv), 1.0)
    kw = case.kwargs()
    if case.error is not None:
        return _break(case, q.to(device, dt), k.to(device, dt), v.to(device, dt), kw)
    q, k, v = (t.to(device=device, dtype=dt) for t in (q, k, v))
    if case.nan_slots and case.Lk:
        poison_unseen(k, v, case.Lq, kw)
    if case.nan_seen and case.Lk:
        j = seen_slot(case.Lq, case.Lk, **case.rule())
        if case.inf_seen:  # +inf in j's k row, NaN in a neighbour that rows seeing j see too
            j = second_seen_slot(case.Lq, case.Lk, j, **case.rule())
        k[:, :, j] = float("nan")
    if case.inf_seen and case.Lk:
        k[:, :, seen_slot(case.Lq, case.Lk, **case.rule()), 0] = float("inf")
    if case.nan_v and case.Lk:
        put_nan_v(v, seen_slot(case.Lq, case.Lk, **case.rule()))
    q, k, v = (_store(t, lay) for t, lay in zip((q, k, v), input_layouts(case)))
    return q, k, v, kw


def input_layouts(case: Case) -> tuple[str, str, str]:
    """The input forms (:func:`_store`) of a case's q, k and v: its layout for all three,
    or for ``"mix"`` one form each, and for ``"cache"`` a contiguous BHLD ``q`` beside
    ``k`` and ``v`` stored BLHD and passed transposed (a decode step's fresh queries against
    a BLHD key/value cache, read in place: each order is baked into TileLang's kernels on
    its own)."""
    return {"mix": ("bthd", "padt", "bhld"),
            "cache": ("bhld", "bthd", "bthd")}.get(case.layout, (case.layout,) * 3)


def _break(case: Case, q, k, v, kw):
    rule = case.error
    if rule == "q_3d":
        q = q[0]
    elif rule == "k_5d":
        k = k.unsqueeze(0)
    elif rule == "k_sparse":
        k = k.to_sparse()
    elif rule == "v_nested":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the nested API's prototype warning
            v = torch.nested.nested_tensor(list(v))
    elif rule == "int_dtype":
        q, k, v = (torch.ones(t.shape, dtype=torch.int32, device=t.device) for t in (q, k, v))
    elif rule == "mixed_dtype":
        k = k.to(torch.float16 if q.dtype != torch.float16 else torch.bfloat16)
    elif rule == "mixed_device":
        k = k.cpu()
    elif rule == "heads_not_multiple":
        q = q[:, :3]  # Hq=3 over Hkv=2
    elif rule == "lq_gt_lk":
        k, v = k[:, :, :-1], v[:, :, :-1]  # Lq=64 > Lk=63
    elif rule == "batch_mismatch":
        k, v = torch.cat([k, k], 0), torch.cat([v, v], 0)
    elif rule == "dqk_mismatch":
        k = torch.cat([k, k[..., :8]], -1)
    elif rule == "lk_mismatch":
        v = v[:, :, :-1]
    elif rule == "hkv_mismatch":
        v = torch.cat([v, v], 1)
    elif rule == "window_zero":
        kw["window_size"] = 0
    elif rule == "window_negative":
        kw["window_size"] = -5
    elif rule == "chunk_zero":
        kw["chunk_size"] = 0
    elif rule == "kv_start_negative":
        kw["kv_start"] = -1
    elif rule == "sm_scale_nan":
        kw["sm_scale"] = float("nan")
    elif rule == "sm_scale_inf":
        kw["sm_scale"] = float("inf")
    else:
        raise ValueError(f"unknown error rule {rule!r}")
    return q, k, v, kw
