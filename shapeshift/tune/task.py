"""The tuning-task protocol: what the search, the kernel-set cover, the decision tree, the
runner and the database need from a kind of kernel, so that they work for any kind.

Two parts, after TVM MetaSchedule's split of a search space from a workload:

- a **family** (``KernelFamily``) owns one schedule type: its space as drawn for a target
  (``random``, ``mutate``), its untuned ``default`` for a target, its canonical JSON (a
  candidate's identity in the database), its C (``source(schedule, prefix)``, several
  schedules living in one library under different prefixes), the C loops that time it
  (``bench_source``) and the cost model's view of it (``features``, ``prior``);
- a **task** (``TuningTask``) is one computation of a family whose size depends on one
  dynamic variable (``variable`` in [``lo``, ``hi``]): a structural ``key`` that names the
  computation but not the range (measurements made for one range serve another), its work
  (``flops``), what the measuring worker must set up (``request``: a dict whose ``kind``
  picks the worker's measurement routine) and a ``describe`` line for logs.

A task may also be *unordered* (``ordered = False``): its values 1..N name N instances of
the computation rather than a range (tune/gemm_group.py's group of a model's dense GEMMs);
it then gives ``point(value)`` (the instance's dims by name) and ``tree_args`` (the names,
in the dispatcher's argument order), and the tree is trained on those dims.

The dense GEMM over a prepacked constant weight and the strided batched GEMM
(tune/workload.py) are the first two tasks, a group of dense GEMMs the third, both of the ``gemm`` family
(tune/gemm_family.py). Another kind of kernel adds a family, its tasks and a measurement
routine in tune/worker.py; search.py, dispatch.py and database.py stay as they are.
"""

from __future__ import annotations

import random
from typing import Any, Hashable, Protocol, Sequence, Sized

from ..target import Target

Schedule = Any  # a family's frozen dataclass of schedule fields


class KernelFamily(Protocol):
    name: str  # recorded with every candidate in the database

    def default(self, target: Target) -> Schedule: ...

    def random(self, rng: random.Random, target: Target) -> Schedule: ...

    def mutate(self, schedule: Schedule, rng: random.Random, target: Target) -> Schedule: ...

    def to_json(self, schedule: Schedule) -> str: ...

    def from_json(self, text: str) -> Schedule: ...

    def source(self, schedule: Schedule, prefix: str = "ss_") -> str: ...

    def bench_source(self) -> str: ...

    def layout(self, schedule: Schedule) -> Hashable:
        """What a constant operand's packed layout depends on: kernels of one set with equal
        layouts share one packed copy (see ``TuningTask.shares_layout``)."""
        ...

    def features(self, schedule: Schedule, task: "TuningTask", value: int, threads: int
                 ) -> tuple[list[float], float]:
        """The cost model's feature row at ``value`` of the task's dynamic variable, and the
        work ratio there (work computed over useful work, >= 1: padding and edge vectors).
        The regressor learns the rate of the work done, so that a saw-tooth of padding
        against the variable is not left for it to learn."""
        ...

    def prior(self, schedule: Schedule, task: "TuningTask", value: int) -> float:
        """A ranking of schedules (log GFLOPS up to a constant) before any measurement."""
        ...


class TuningTask(Protocol):
    family: KernelFamily
    variable: str  # the dynamic variable's name in logs ("M", "T")
    lo: int
    hi: int
    cold: bool  # measured with operands streamed from DRAM (a different task from the warm one)
    shares_layout: bool  # the chosen kernels must agree on a constant operand's packed layout

    @property
    def key(self) -> str: ...

    @property
    def hash(self) -> str: ...

    def flops(self, value: int) -> float: ...

    def range_flops(self) -> float: ...

    def request(self) -> dict: ...

    def describe(self) -> str: ...

    def sampled_ms(self, count: int = ...) -> list[int]: ...

    def weighted_samples(self, weights: dict[int, float], count: int = ...
                         ) -> tuple[list[int], list[float]]: ...


class InstanceRange:
    """Values 1..N over N ``instances`` (a tuple, or a dict keyed by instance): value i is
    instance i. The workloads' InstanceValues and the model tasks over them (tune/extract.py)."""

    instances: Sized

    @property
    def lo(self) -> int:
        return 1

    @property
    def hi(self) -> int:
        return len(self.instances)


class InstanceValues(InstanceRange):
    """The values 1..N of an unordered task naming its N ``instances`` (tune/gemm_group.py's
    group, tune/conv_workload.py's conv class): every instance is a sample."""

    instances: tuple
    variable = "instance"
    ordered = False

    def sampled_ms(self, count: int = 0) -> list[int]:
        return list(range(1, self.hi + 1))

    def weighted_samples(self, weights: dict[int, float], count: int = 0) -> tuple[list[int], list[float]]:
        values = self.sampled_ms()
        return values, [float(weights.get(v, 1.0)) for v in values]


_FAMILIES: dict[str, KernelFamily] = {}


def register(family: KernelFamily) -> KernelFamily:
    _FAMILIES[family.name] = family
    return family


def family_named(name: str) -> KernelFamily:
    """The family a database row names; an unknown one (a database written by a newer
    shapeshift) is a clear error."""
    # Importing the built-in families registers them.
    from . import conv_family, conv_nchwc_family, gemm_family  # noqa: F401

    try:
        return _FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown kernel family {name!r} (known: {', '.join(sorted(_FAMILIES))}); "
                         f"a database written by a newer shapeshift?") from None


def families() -> Sequence[str]:
    from . import conv_family, conv_nchwc_family, gemm_family  # noqa: F401

    return sorted(_FAMILIES)
