"""``shapeshift tune``: a DietCode-style auto-scheduler for dense GEMMs with a dynamic M.

One tuning run covers a whole range of M: shape-generic GEMM schedules are measured at a
few sampled M values, a learned cost model fills in the rest, a small kernel set is chosen
by greedy cover, and a decision tree over M dispatches each call to one of them.

Modules, one job each (after TVM MetaSchedule): ``task`` (the protocol every kernel family
and task follows), ``gemm_family`` (the GEMM family), ``workload`` (the GEMM tasks), ``space``
(the schedules), ``builder`` (C sources and compiled libraries), ``runner`` (measurement in
worker processes), ``database`` (SQLite), ``cost_model`` (and ``background_fit``, its fit in
a child process on a cluster), ``search`` (the strategies) and
``dispatch`` (kernel set, decision tree, the dispatcher's C), plus ``extract`` (a model's
tasks: one per constant weight shape) and ``records`` (what the native backend reads back
from the database: a tuned dispatcher per weight shape). See docs/tune.md.
"""

from .workload import GemmWorkload

__all__ = ["GemmWorkload"]
