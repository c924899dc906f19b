"""A model's dense GEMMs as one shape-generic tuning task: DietCode's answer for a static
model whose many products have different shapes.

Tuned one weight shape at a time (workload.GemmWorkload), a model with N distinct
(M, K, N) products gets N searches and up to 8 kernels each, every kernel compiled once per
weight shape. But a kernel of the ``gemm`` family takes M, N and K at run time: one
compiled kernel serves every shape. ``GemmGroupWorkload`` is one task whose sampled shapes
are the model's instances (each (M, K, N) with the calls per run as its weight); one search
measures candidates across all of them, the greedy cover keeps at most ``max_kernels`` for
the whole model, and a decision tree on (M, K, N) picks one per call
(``dispatch.tuned_gemm_c`` with ``tree_args``). The kernels share one packed-B layout, as a
per-shape selection does, so every weight is packed once.

The search sees a group's instances as the values 1..N of an *unordered* dynamic variable
(``ordered = False``): value i is instance i, so the database, the runner and the search keep
their integer keys, while what depends on neighbouring values having neighbouring shapes
(the measurement cap, the probed powers of two, the dense grid) is skipped. The structural
key lists the instances, so a measurement at value i always means the same shape.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .gemm_family import GEMM
from .task import InstanceValues

# The tree's variables: the arguments of the dispatcher's choice function, in this order.
DIMS = ("M", "N", "K")


@dataclass(frozen=True)
class GemmGroupWorkload(InstanceValues):
    """Dense GEMMs C[M,N] = A[M,K] x B[K,N] with a constant B, one per instance (M, K, N)."""

    instances: tuple[tuple[int, int, int], ...]  # (M, K, N), sorted, distinct
    cold: bool = False

    family = GEMM
    shares_layout = True  # every weight of the group is packed once, in the kernels' one layout
    tree_args = DIMS
    instance_fields = "(M, K, N)"  # what ``instance(value)`` holds, for printing

    def __post_init__(self) -> None:
        if not self.instances:
            raise ValueError("a GEMM group needs at least one instance")
        if list(self.instances) != sorted(set(self.instances)):
            raise ValueError("a GEMM group's instances must be sorted and distinct")
        for m, k, n in self.instances:
            if min(m, k, n) < 1:
                raise ValueError(f"GEMM instance (M, K, N) = ({m}, {k}, {n}) has an empty dim")

    @classmethod
    def of(cls, instances, cold: bool = False) -> "GemmGroupWorkload":
        return cls(tuple(sorted({(int(m), int(k), int(n)) for m, k, n in instances})), cold)

    @property
    def key(self) -> str:
        body = ";".join(f"{m},{k},{n}" for m, k, n in self.instances)
        return f"gemm-group{'-cold' if self.cold else ''}:{body}"

    @classmethod
    def from_key(cls, key: str) -> "GemmGroupWorkload":
        kind, _, body = key.partition(":")
        if kind not in ("gemm-group", "gemm-group-cold") or not body:
            raise ValueError(f"not a GEMM group workload key: {key!r}")
        instances = tuple(tuple(int(x) for x in part.split(",")) for part in body.split(";"))
        if any(len(i) != 3 for i in instances):
            raise ValueError(f"malformed GEMM group workload key: {key!r}")
        return cls(instances, cold=kind.endswith("-cold"))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.key.encode()).hexdigest()

    def instance(self, value: int) -> tuple[int, int, int]:
        return self.instances[value - 1]

    def shape(self, value: int) -> tuple[int, int, int, int]:
        """(M, K, N, batch) of instance ``value``."""
        m, k, n = self.instance(value)
        return m, k, n, 1

    def point(self, value: int) -> dict[str, int]:
        """The tree's variables at instance ``value``."""
        m, k, n = self.instance(value)
        return {"M": m, "N": n, "K": k}

    def value_of(self, m: int, k: int, n: int) -> int:
        return self.instances.index((m, k, n)) + 1

    def weights(self) -> set[tuple[int, int]]:
        """The (K, N) weight shapes of the group."""
        return {(k, n) for _, k, n in self.instances}

    def request(self) -> dict:
        return {"kind": "prepacked", "shapes": {str(v): list(self.instance(v)) for v in range(1, self.hi + 1)}}

    def flops(self, value: int) -> float:
        m, k, n = self.instance(value)
        return 2.0 * m * k * n

    def range_flops(self) -> float:
        return float(sum(self.flops(v) for v in range(1, self.hi + 1)))

    def describe(self) -> str:
        weights = "B constant, prepacked" + (", read from DRAM (cold)" if self.cold else "")
        return (f"{len(self.instances)} dense GEMM instance(s) as one task ({weights}), (M, K, N) in "
                f"{', '.join(f'({m}, {k}, {n})' for m, k, n in self.instances[:4])}"
                + (", ..." if len(self.instances) > 4 else ""))
