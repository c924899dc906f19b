"""The ``gemm`` kernel family: ``GemmSchedule`` as a tuning task's schedule type.

Its space is tune/space.py's, its default codegen/defaults.py's, its C codegen/kernels/gemm.py's.
Here are the parts only the tuner needs: the C loops that time a candidate, and how the cost
model sees a schedule meet one call's (M, K, N, batch) (padding of M to mr and of N to nr,
block counts, whether the B-streaming path runs, how evenly the threads are loaded) as well
as the schedule's own fields. Both GEMM tasks (tune/workload.py) belong to this family.

As in DietCode (cost = f_k x padding ratio x occupancy), the padding is not left to the
regressor: ``work_ratio`` is the work the kernel actually does (the last panel of N
computed in whole vectors) over the useful work, and the cost model learns the rate of the
work done. Uniform samples rarely land just past a multiple of nr, so a regressor left to
learn the padding itself predicted a smooth curve through a saw-tooth.
"""

from __future__ import annotations

import math
import random
from typing import Optional

from ..codegen.defaults import default_schedule
from ..codegen.kernels import gemm, gemm_tiles
from ..codegen.kernels.gemm import GemmSchedule
from ..target import Target
from . import space
from .task import register

BENCH_SOURCE = """
/* Seconds per call of `calls` back-to-back C = A x B calls, B prepacked. */
double tune_bench(int64_t calls, int64_t M, int64_t N, int64_t K, const float* A, const float* packed, float* C)
{
    double start = omp_get_wtime();
    for (int64_t i = 0; i < calls; ++i)
        ss_gemm_prepacked(M, N, K, 1, 1, A, 0, 0, K, 1, packed, C, 0, 0, N, 1.0f, NULL, 0.0f, 0, 0, 0);
    return (omp_get_wtime() - start) / (double)calls;
}

/* The same, call i reading copy (first + i) % copies of the packed B (copies `stride` floats
   apart): with more copies than the caches hold, every call streams its B from DRAM. */
double tune_bench_cold(int64_t calls, int64_t M, int64_t N, int64_t K, const float* A, const float* packed,
                       int64_t stride, int64_t copies, int64_t first, float* C)
{
    double start = omp_get_wtime();
    for (int64_t i = 0; i < calls; ++i)
        ss_gemm_prepacked(M, N, K, 1, 1, A, 0, 0, K, 1, packed + ((first + i) % copies) * stride, C, 0, 0, N,
                          1.0f, NULL, 0.0f, 0, 0, 0);
    return (omp_get_wtime() - start) / (double)calls;
}

"""


def batched_bench_c(name: str, gemm_fn: str) -> str:
    """C function ``name``: seconds per call of `calls` back-to-back strided batched
    products C[b] = A[b] x B[b], b < batch, by ``gemm_fn`` (``ss_gemm``'s arguments)."""
    return f"""
double {name}(int64_t calls, int64_t M, int64_t N, int64_t K, int64_t batch,
              const float* A, int64_t sa, int64_t rsa, int64_t csa,
              const float* B, int64_t sb, int64_t rsb, int64_t csb, float* C, int64_t sc, int64_t ldc)
{{
    double start = omp_get_wtime();
    for (int64_t i = 0; i < calls; ++i)
        {gemm_fn}(M, N, K, 1, batch, A, 0, sa, rsa, csa, B, 0, sb, rsb, csb, C, 0, sc, ldc,
                  1.0f, NULL, 0.0f, 0, 0, 0);
    return (omp_get_wtime() - start) / (double)calls;
}}
"""


def layout(schedule: GemmSchedule) -> tuple[int, int]:
    """What the prepacked B layout depends on (kernels/gemm.py): kernels with equal
    layouts read one packed copy of a weight."""
    return schedule.nr, schedule.kc


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def work_ratio(s: GemmSchedule, m: int, n: int) -> float:
    """Multiply-adds the kernels compute over the useful ones: the last partial panel of N
    runs whole vectors of the tile's width (packed path: edge kernels) or whole passes of
    lanes x width (the B-streaming path, per row group); rows are never padded."""
    def columns(step: int) -> int:
        return (n // s.nr) * s.nr + _cdiv(n % s.nr, step) * step

    if m > s.small_m:
        return columns(s.lanes) / n
    groups = gemm_tiles.small_row_groups(s, m)
    return sum(rows * columns(s.lanes * gemm_tiles.small_shape(s, rows)[0]) for rows in groups) / (m * n)


def features(s: GemmSchedule, m: int, k: int, n: int, threads: int, batch: int = 1,
             work: Optional[float] = None) -> list[float]:
    """``work``: ``work_ratio(s, m, n)``, when the caller has it already."""
    small = m <= s.small_m
    pad_m = _cdiv(m, s.mr) * s.mr / m
    pad_n = _cdiv(n, s.nr) * s.nr / n  # how much of N falls in a partial (edge) panel
    work = work_ratio(s, m, n) if work is None else work
    # The driver's work split (ss_gemm_make_plan): batches first; where they cannot feed
    # every thread, N panels, then M panels if too few.
    used = threads if 2.0 * m * n * k * batch >= s.parallel_min_flops else 1
    n_panels, m_panels = _cdiv(n, s.nr), _cdiv(m, s.mr)
    n_split = m_split = 1
    if used > 1 and batch < 8 * used:
        need = used // math.gcd(batch, used)
        n_split = min(need, n_panels)
        if n_split < need and not small:
            m_split = min(_cdiv(need, n_split), m_panels)
    items = batch * _cdiv(n_panels, _cdiv(n_panels, n_split)) * _cdiv(m_panels, _cdiv(m_panels, m_split))
    parts = min(used, items)
    balance = items / (parts * _cdiv(items, parts))
    prefetching = float(small and s.prefetch_rows > 0 and m >= s.prefetch_min_m)
    # Packed panels of B the first row group reads at once (read streams), 0 off the B-streaming path.
    in_flight = gemm_tiles.small_panels(s, *gemm_tiles.small_calls(s, m)[0]) if small else 0
    return [s.mr, s.nr, s.kc, s.mc, s.nc, s.one_block_columns, s.unroll_k, s.small_m, s.small_nc, s.pack_rows,
            s.prefetch_rows, prefetching, math.log2(s.parallel_min_flops), m, math.log2(m), math.log2(n), math.log2(k),
            float(small), pad_m, pad_n, work, n % s.nr, m % s.mr, _cdiv(m, s.mc), _cdiv(n, s.nc), _cdiv(k, s.kc),
            m_panels * n_panels, balance, parts, s.small_panels, in_flight, s.lanes, s.prefetch_c, s.a_in_l1]


def prior_log_gflops(s: GemmSchedule, m: int, n: int) -> float:
    """Before any data: bigger tiles are faster; rows of a partial tile (a slower edge
    kernel) and columns past N in the last vector cost as if wasted."""
    pad = (_cdiv(m, s.mr) * s.mr / m) * work_ratio(s, m, n)
    # FMAs per load of a k step (broadcasts of A plus vectors of B), in vectors of the width.
    tile = min(s.mr, m) * s.nr / (s.mr + s.nr / s.lanes)
    return math.log(tile) - math.log(pad)


class GemmFamily:
    """Dense and batched GEMM schedules (``GemmSchedule``); tasks give ``shape(value)`` =
    (M, K, N, batch) of one call."""

    name = "gemm"

    def default(self, target: Target) -> GemmSchedule:
        return default_schedule(target)

    def random(self, rng: random.Random, target: Target) -> GemmSchedule:
        return space.random_schedule(rng, target)

    def mutate(self, schedule: GemmSchedule, rng: random.Random, target: Target) -> GemmSchedule:
        return space.mutate(schedule, rng, target)

    def to_json(self, schedule: GemmSchedule) -> str:
        return space.to_json(schedule)

    def from_json(self, text: str) -> GemmSchedule:
        return space.from_json(text)

    def source(self, schedule: GemmSchedule, prefix: str = gemm.DEFAULT_PREFIX) -> str:
        return gemm.source(schedule, prefix)

    def layout(self, schedule: GemmSchedule) -> tuple[int, int]:
        return layout(schedule)

    def bench_source(self) -> str:
        return BENCH_SOURCE + batched_bench_c("tune_bench_batched", "ss_gemm")

    def features(self, schedule: GemmSchedule, task, value: int, threads: int) -> tuple[list[float], float]:
        m, k, n, batch = task.shape(value)
        work = work_ratio(schedule, m, n)
        return features(schedule, m, k, n, threads, batch, work), work

    def prior(self, schedule: GemmSchedule, task, value: int) -> float:
        m, _, n, _ = task.shape(value)
        return prior_log_gflops(schedule, m, n)


GEMM = register(GemmFamily())
