"""What is tuned: a dense float32 GEMM C[M,N] = A[M,K] x B[K,N] with a constant B.

B is a weight, packed once at load (``ss_gemm_prepacked``), so only the multiply is timed.
K and N are static; M is dynamic in [lo, hi]. The structural hash names the computation,
not the range, so measurements made for one range serve every other range of M.

``cold``: measured as in a model whose weights do not fit the caches, every call reading
its B from DRAM (the runner rotates over enough packed copies). At small M that is a
different problem (bound by memory, not FMAs) with different best schedules, so it is a
different workload: its measurements are kept apart.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

# Sampled M values: this many uniformly spaced points of [lo, hi], both ends included.
DEFAULT_SAMPLES = 10


@dataclass(frozen=True)
class GemmWorkload:
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

    @property
    def key(self) -> str:
        """The computation's structure, independent of the M range."""
        return f"gemm-prepacked{'-cold' if self.cold else ''}:{self.k}:{self.n}"

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.key.encode()).hexdigest()

    def flops(self, m: int) -> float:
        return 2.0 * m * self.n * self.k

    def range_flops(self) -> float:
        """FLOPs of one call at every M of the range, summed (the task's total work)."""
        lo, hi = self.lo, self.hi
        return 2.0 * self.n * self.k * (hi * (hi + 1) - (lo - 1) * lo) / 2

    def sampled_ms(self, count: int = DEFAULT_SAMPLES) -> list[int]:
        """``count`` uniformly spaced M values in [lo, hi] with both ends, deduplicated."""
        return sorted({int(round(x)) for x in np.linspace(self.lo, self.hi, count)})

    def weighted_samples(self, weights: dict[int, float], count: int = DEFAULT_SAMPLES
                         ) -> tuple[list[int], list[float]]:
        """Sampled Ms and their weights from a histogram of M (how often each occurs): the
        ``count`` heaviest Ms of the range, plus both ends (with the smallest chosen weight)
        so that the kernel set is checked across the whole range."""
        inside = {m: w for m, w in weights.items() if self.lo <= m <= self.hi and w > 0}
        if not inside:
            raise ValueError(f"no weighted M inside [{self.lo}, {self.hi}]")
        heaviest = sorted(inside, key=lambda m: (-inside[m], m))[:count]
        chosen = {m: inside[m] for m in heaviest}
        floor = min(chosen.values())
        for end in (self.lo, self.hi):
            chosen.setdefault(end, floor)
        ms = sorted(chosen)
        return ms, [chosen[m] for m in ms]

    def describe(self) -> str:
        weights = "B constant, prepacked" + (", read from DRAM (cold)" if self.cold else "")
        return f"GEMM C[M,{self.n}] = A[M,{self.k}] x B[{self.k},{self.n}] ({weights}), M in [{self.lo}, {self.hi}]"
