"""What is tuned: float32 GEMMs whose size depends on one dynamic dim.

``GemmWorkload``: a dense C[M,N] = A[M,K] x B[K,N] with a constant B. B is a weight, packed
once at load (``ss_gemm_prepacked``), so only the multiply is timed. K and N are static; M
is dynamic in [lo, hi].

``BatchedGemmWorkload``: ``batch`` strided products C[b] = A[b] x B[b] with no constant
operand (``ss_gemm``), such as attention's Q K^T ([H,T,64] x [H,64,T]) and P V ([H,T,T] x
[H,T,64]): M, N, K and every stride are polynomials of degree <= 2 in one dynamic dim T in
[lo, hi] (a [H,T,T] tensor's batch stride is T^2), and one of M, N, K is T itself.

Both are tuning tasks of the ``gemm`` family (tune/task.py, tune/gemm_family.py). The
structural key names the computation, not the range, so measurements made for one range
serve every other range. The search calls the dynamic value M (it is T for a batched
workload); ``shape(M)`` is the (M, K, N, batch) of one call, which the family's cost-model
features read.

``cold``: measured as in a model whose weights do not fit the caches, every call reading
its B from DRAM (the runner rotates over enough packed copies). At small M that is a
different problem (bound by memory, not FMAs) with different best schedules, so it is a
different workload: its measurements are kept apart.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..symbolic import Expr, bounds, evaluate, free_symbols
from .gemm_family import GEMM

# Sampled M values: this many uniformly spaced points of [lo, hi], both ends included.
DEFAULT_SAMPLES = 10


def uniform_samples(lo: int, hi: int, count: int = DEFAULT_SAMPLES) -> list[int]:
    """``count`` uniformly spaced values in [lo, hi] with both ends, deduplicated."""
    return sorted({int(round(x)) for x in np.linspace(lo, hi, count)})


def weighted_samples(lo: int, hi: int, weights: dict[int, float], count: int = DEFAULT_SAMPLES
                     ) -> tuple[list[int], list[float]]:
    """Sampled values and their weights from a histogram of the dynamic dim (how often each
    occurs): the ``count`` heaviest values of [lo, hi], plus both ends (with the smallest
    chosen weight) so that the kernel set is checked across the whole range."""
    inside = {m: w for m, w in weights.items() if lo <= m <= hi and w > 0}
    if not inside:
        raise ValueError(f"no weighted M inside [{lo}, {hi}]")
    heaviest = sorted(inside, key=lambda m: (-inside[m], m))[:count]
    chosen = {m: inside[m] for m in heaviest}
    floor = min(chosen.values())
    for end in (lo, hi):
        chosen.setdefault(end, floor)
    ms = sorted(chosen)
    return ms, [chosen[m] for m in ms]


class _Sampled:
    """The samples of the dynamic dim over the workload's [lo, hi] (both kinds)."""

    lo: int
    hi: int

    def sampled_ms(self, count: int = DEFAULT_SAMPLES) -> list[int]:
        return uniform_samples(self.lo, self.hi, count)

    def weighted_samples(self, weights: dict[int, float], count: int = DEFAULT_SAMPLES
                         ) -> tuple[list[int], list[float]]:
        return weighted_samples(self.lo, self.hi, weights, count)


@dataclass(frozen=True)
class GemmWorkload(_Sampled):
    k: int
    n: int
    lo: int
    hi: int
    cold: bool = False

    def __post_init__(self) -> None:
        if self.k < 1 or self.n < 1:
            raise ValueError(f"GEMM K and N must be >= 1, got K={self.k}, N={self.n}")
        if not 1 <= self.lo <= self.hi:
            raise ValueError(f"dynamic M range must satisfy 1 <= LO <= HI, got {self.lo}:{self.hi}")

    family = GEMM
    variable = "M"
    # The B operand is a constant, packed once: kernels of one set should share its layout.
    shares_layout = True

    @property
    def key(self) -> str:
        """The computation's structure, independent of the M range."""
        return f"gemm-prepacked{'-cold' if self.cold else ''}:{self.k}:{self.n}"

    @classmethod
    def from_key(cls, key: str, lo: int, hi: int) -> "GemmWorkload":
        kind, k, n = key.split(":")
        if kind not in ("gemm-prepacked", "gemm-prepacked-cold"):
            raise ValueError(f"not a dense GEMM workload key: {key!r}")
        return cls(int(k), int(n), lo, hi, cold=kind.endswith("-cold"))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.key.encode()).hexdigest()

    def shape(self, m: int) -> tuple[int, int, int, int]:
        """(M, K, N, batch) of one call."""
        return m, self.k, self.n, 1

    def request(self) -> dict:
        """What the measuring worker needs to know of the workload."""
        return {"kind": "prepacked", "k": self.k, "n": self.n}

    def flops(self, m: int) -> float:
        return 2.0 * m * self.n * self.k

    def range_flops(self) -> float:
        """FLOPs of one call at every M of the range, summed (the task's total work)."""
        lo, hi = self.lo, self.hi
        return 2.0 * self.n * self.k * (hi * (hi + 1) - (lo - 1) * lo) / 2

    def describe(self) -> str:
        weights = "B constant, prepacked" + (", read from DRAM (cold)" if self.cold else "")
        return f"GEMM C[M,{self.n}] = A[M,{self.k}] x B[{self.k},{self.n}] ({weights}), M in [{self.lo}, {self.hi}]"


# c0 + c1 * T + c2 * T^2, integer coefficients.
Poly = tuple[int, int, int]
T_POLY: Poly = (0, 1, 0)


def poly_at(p: Poly, t: int) -> int:
    return p[0] + p[1] * t + p[2] * t * t


def poly_str(p: Poly) -> str:
    terms = [(p[2], "T^2"), (p[1], "T"), (p[0], "")]
    text = " + ".join(f"{c}{'*' if s and c != 1 else ''}{s}" if s and c != 1 else (s or str(c))
                      for c, s in terms if c)
    return text or "0"


def fit_poly(value_at) -> Optional[Poly]:
    """The polynomial of degree <= 2 through ``value_at(t)`` (an int function of T), if its
    values at 1..3 fix one with integer coefficients that also holds at T = 4, 7 and 64."""
    v1, v2, v3 = (value_at(t) for t in (1, 2, 3))
    second = v3 - 2 * v2 + v1
    if second % 2:
        return None
    c2 = second // 2
    c1 = v2 - v1 - 3 * c2
    p = (v1 - c1 - c2, c1, c2)
    return p if all(value_at(t) == poly_at(p, t) for t in (4, 7, 64)) else None


@dataclass(frozen=True)
class BatchedGemmWorkload(_Sampled):
    """``batch`` products C[b] = A[b] x B[b] (no constant operand), everything a function of T.

    A(b, m, k) is at ``A[b*a[0] + m*a[1] + k*a[2]]``, B(b, k, n) at ``B[b*b[0] + k*b[1] +
    n*b[2]]``, C(b, m, n) at ``C[b*c[0] + m*c[1] + n]``: the strides the native backend's
    lowering passes to ``ss_gemm``, views (Transposes) included, so a record applies to
    exactly the calls that were measured."""

    batch: int
    m: Poly
    n: Poly
    k: Poly
    a: tuple[Poly, Poly, Poly]
    b: tuple[Poly, Poly, Poly]
    c: tuple[Poly, Poly]
    lo: int
    hi: int

    family = GEMM
    variable = "T"
    cold = False  # nothing is constant: every operand was just computed, warm in cache
    shares_layout = False  # packs both operands per call

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"batched GEMM needs batch >= 1, got {self.batch}")
        if not 1 <= self.lo <= self.hi:
            raise ValueError(f"dynamic T range must satisfy 1 <= LO <= HI, got {self.lo}:{self.hi}")
        if self.t_arg is None:
            raise ValueError(f"one of M, N, K must be T itself, got M={poly_str(self.m)}, N={poly_str(self.n)}, "
                             f"K={poly_str(self.k)}")
        for t in (self.lo, self.hi):
            if min(self.shape(t)) < 1:
                raise ValueError(f"batched GEMM has an empty dim at T={t}: (M, K, N) = {self.shape(t)[:3]}")

    @property
    def t_arg(self) -> Optional[str]:
        """The ss_gemm argument that equals T, which the dispatcher reads T from."""
        return next((name for name, p in (("M", self.m), ("N", self.n), ("K", self.k)) if p == T_POLY), None)

    @property
    def key(self) -> str:
        polys = (self.m, self.n, self.k, *self.a, *self.b, *self.c)
        return f"bmm:{self.batch}:" + ";".join(",".join(str(c) for c in p) for p in polys)

    @classmethod
    def from_key(cls, key: str, lo: int, hi: int) -> "BatchedGemmWorkload":
        kind, batch, body = key.split(":")
        if kind != "bmm":
            raise ValueError(f"not a batched GEMM workload key: {key!r}")
        polys = [tuple(int(c) for c in p.split(",")) for p in body.split(";")]
        if len(polys) != 11 or any(len(p) != 3 for p in polys):
            raise ValueError(f"malformed batched GEMM workload key: {key!r}")
        return cls(int(batch), polys[0], polys[1], polys[2], tuple(polys[3:6]), tuple(polys[6:9]),
                   tuple(polys[9:11]), lo, hi)

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.key.encode()).hexdigest()

    def shape(self, t: int) -> tuple[int, int, int, int]:
        return poly_at(self.m, t), poly_at(self.k, t), poly_at(self.n, t), self.batch

    def strides(self, t: int) -> dict[str, list[int]]:
        return {name: [poly_at(p, t) for p in getattr(self, name)] for name in ("a", "b", "c")}

    def request(self) -> dict:
        return {"kind": "batched", "key": self.key}

    def flops(self, t: int) -> float:
        m, k, n, batch = self.shape(t)
        return 2.0 * batch * m * n * k

    def range_flops(self) -> float:
        return float(sum(self.flops(t) for t in range(self.lo, self.hi + 1)))

    def describe(self) -> str:
        m, n, k = (poly_str(p) for p in (self.m, self.n, self.k))
        return (f"batched GEMM {self.batch} x C[{m},{n}] = A[{m},{k}] x B[{k},{n}] (strides A "
                f"{', '.join(map(poly_str, self.a))}; B {', '.join(map(poly_str, self.b))}; C "
                f"{', '.join(map(poly_str, self.c))}), T in [{self.lo}, {self.hi}]")


def _fixed_symbols(dims) -> dict[str, int]:
    """The symbols of ``dims`` declared with a single value (a batch dim of 1:1), and it."""
    fixed: dict[str, int] = {}
    for d in dims:
        if isinstance(d, Expr):
            for atom in d.atoms():
                if atom.kind == "sym" and atom.definition is None and atom.lo == atom.hi:
                    fixed[atom.name] = atom.lo
    return fixed


def batched_workload(m, n, k, batch, a_strides, b_strides, c_strides) -> Optional[BatchedGemmWorkload]:
    """The workload of one ``ss_gemm`` call as the lowering emits it (symbolic Dims: sizes,
    then per operand its batch strides, row stride, column stride; C's columns contiguous),
    or None when it is not one. Symbols declared with one value count as that constant;
    batch dims of extent 1 are dropped. Then its sizes and strides must depend on exactly
    one symbol, T, as polynomials of degree <= 2, with at most one batch dim, of static
    extent, and M, N or K must be T. T's range is the symbol's declared range."""
    nb = len(batch)
    everything = [m, n, k, *batch, *a_strides, *b_strides, *c_strides]
    fixed = _fixed_symbols(everything)

    def value_at(d, binding):
        return evaluate(d, {**fixed, **binding})

    keep = []
    for i, extent in enumerate(batch):
        if not free_symbols(extent) <= set(fixed):
            return None  # a dynamic batch: a second dynamic dim
        if value_at(extent, {}) != 1:
            keep.append(i)
    if len(keep) > 1:
        return None
    symbols = set().union(*(free_symbols(d) for d in everything)) - set(fixed)
    if len(symbols) != 1:
        return None
    (name,) = symbols

    def pick(strides):  # the kept batch dim's stride (0 without one), then rows and columns
        return [strides[keep[0]] if keep else 0, *strides[nb:]]

    polys = []
    for d in [m, n, k, *pick(a_strides), *pick(b_strides), *pick(c_strides)]:
        p = fit_poly(lambda t, d=d: value_at(d, {name: t}))
        if p is None:
            return None
        polys.append(p)
    t_dim = next((d for d, p in zip((m, n, k), polys[:3]) if p == T_POLY), None)
    if t_dim is None:
        return None
    lo, hi = bounds(t_dim)
    try:
        return BatchedGemmWorkload(value_at(batch[keep[0]], {}) if keep else 1, polys[0], polys[1], polys[2],
                                   tuple(polys[3:6]), tuple(polys[6:9]), tuple(polys[9:11]), max(1, lo), max(1, hi))
    except ValueError:
        return None
