"""C sources and compiled libraries for candidates and for the tuned dispatcher.

A measurement library holds one schedule (default ``ss_`` names) plus C loops that time it
(``tune_bench`` and ``tune_bench_cold`` call ``ss_gemm_prepacked``, ``tune_bench_batched``
calls ``ss_gemm``): through ctypes a call costs microseconds, more than the smallest GEMMs.
Libraries are built with ``compile_library`` into the tuning's cache directory, a few at a
time (the compiler is a separate process, so threads suffice).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..codegen.build import compile_library
from ..codegen.kernels import gemm
from ..codegen.kernels.gemm import GemmSchedule
from ..codegen.kernels.prelude import PRELUDE
from ..errors import ShapeshiftError

# Makes the fragment of one schedule; tests swap in broken ones.
SourceFn = Callable[[GemmSchedule], str]

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


@dataclass(frozen=True)
class Built:
    schedule: GemmSchedule
    library: Optional[Path]  # the .so, None when the build failed
    error: Optional[str] = None


def measurement_source(schedule: GemmSchedule, source_fn: SourceFn = gemm.source) -> str:
    return PRELUDE + source_fn(schedule) + BENCH_SOURCE + batched_bench_c("tune_bench_batched", "ss_gemm")


def build_one(schedule: GemmSchedule, cache_dir: Path, source_fn: SourceFn = gemm.source) -> Built:
    try:
        lib = compile_library(measurement_source(schedule, source_fn), name_hint="tune_candidate", cache_dir=cache_dir)
    except ShapeshiftError as exc:  # a compile error fails this candidate only
        return Built(schedule, None, f"build failed: {str(exc).splitlines()[0]}")
    return Built(schedule, lib.path)


def build_many(schedules: Sequence[GemmSchedule], cache_dir: Path, jobs: int = 2,
               source_fn: SourceFn = gemm.source) -> list[Built]:
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(lambda s: build_one(s, cache_dir, source_fn), schedules))
