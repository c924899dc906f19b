"""The machine a benchmark ran on, for every results file: CPU model, its flags, and the
measured FMA peak per width (shapeshift.target: measured once per CPU, cached).

``describe()`` is the paragraph results files start with; ``peak_gflops()`` the per-core
float32 peak that GFLOPS are reported against (the widest width's); ``peer_env()`` the
environment a NumPy peer runs in, at its best on this CPU; ``core_to_core_ns()`` the round
trip of a cache line between two threads, which on these VMs says how far apart the two
vCPUs are at the moment (on an AMD Zen 2 VM it was 56-81 ns for a minute and 367-492 ns the
next, and yolov8n at 320x320 on 2 threads ran 12.9 ms in the first state and 17.3-18.9 in the
second, onnxruntime 15.0 and 17.7-19.2: 2-thread results are only comparable within a state).
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shapeshift.target import host_target, measure_fma  # noqa: E402


_PING_PONG = r"""
#include <stdatomic.h>
/* Seconds per round trip of one cache line between two OpenMP threads, over `rounds` or as
   many as `budget` seconds allow (a busy machine may deschedule either spinning thread);
   -1 with fewer than two threads. */
double bench_ping_pong(long rounds, double budget)
{
    static _Atomic long flag;
    double seconds = -1.0;
    atomic_store(&flag, 0);
    #pragma omp parallel num_threads(2)
    if (omp_get_num_threads() == 2) {
        #pragma omp barrier
        if (omp_get_thread_num() == 0) {
            const double start = omp_get_wtime();
            long i = 0;
            for (; i < rounds; ++i) {
                atomic_store_explicit(&flag, 2 * i + 1, memory_order_release);
                while (atomic_load_explicit(&flag, memory_order_acquire) != 2 * i + 2) {}
                if ((i & 15) == 15 && omp_get_wtime() - start > budget) { ++i; break; }
            }
            seconds = (omp_get_wtime() - start) / (double)i;
            atomic_store_explicit(&flag, -1, memory_order_release);  /* stop */
        } else {
            for (long i = 0;; ++i) {
                long seen;
                while ((seen = atomic_load_explicit(&flag, memory_order_acquire)) != 2 * i + 1 && seen != -1) {}
                if (seen == -1) break;
                atomic_store_explicit(&flag, 2 * i + 2, memory_order_release);
            }
        }
    }
    return seconds;
}
"""


@functools.cache
def _ping_pong():
    import ctypes

    from shapeshift.codegen.build import compile_library
    from shapeshift.codegen.kernels.prelude import PRELUDE

    fn = compile_library(PRELUDE + _PING_PONG, name_hint="bench_ping_pong").cdll.bench_ping_pong
    fn.argtypes, fn.restype = [ctypes.c_long, ctypes.c_double], ctypes.c_double
    return fn


def core_to_core_ns(rounds: int = 100_000, budget_s: float = 0.05) -> float | None:
    """Nanoseconds a cache line takes to go to another thread and back, now (the best of 3
    runs of ``rounds`` round trips, or of what ``budget_s`` seconds each allow); None with
    fewer than two CPUs."""
    if (os.cpu_count() or 1) < 2:
        return None
    best = min(_ping_pong()(rounds, budget_s) for _ in range(3))
    return best * 1e9 if best > 0 else None


#: Round trips above this many nanoseconds: the two vCPUs are "far" apart. On the AMD Zen 2
#: VMs the probe read 56-81 ns in one state and 367-492 ns in the other, nothing between.
FAR_NS = 200.0


def core_state(ns: float | None) -> str | None:
    """"near" or "far" for a round trip of ``ns`` nanoseconds (None: not measured)."""
    if ns is None:
        return None
    return "far" if ns > FAR_NS else "near"


def span_state(before: float | None, after: float | None) -> str | None:
    """The cores' state over a span of work probed before and after it: "near" or "far"
    where the two round trips agree, "changed" where they do not, None where not probed."""
    a, b = core_state(before), core_state(after)
    if a is None or b is None:
        return None
    return a if a == b else "changed"


def geomean(values) -> float:
    """The geometric mean of the positive, finite values (NaN when there are none): a ratio
    a bench could not form (a time not above its floor, a failed run) is left out, not
    turned into a NaN or an error for the whole line."""
    kept = [float(v) for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, kept)) / len(kept)) if kept else math.nan


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (having said so) without matplotlib: the
    plots are optional, the bench extra installs it and the test extra does not."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def peak_gflops() -> float:
    """The measured per-core float32 FMA peak of this machine (its widest vector width)."""
    return measure_fma(host_target()).peak_gflops


# OpenBLAS kernel families narrower than its AVX-512 ones. An inherited OPENBLAS_CORETYPE
# naming one of them on an AVX-512 CPU hobbles the peer: these machines' environment sets
# OPENBLAS_CORETYPE=Haswell, and on an AMD Zen 5 that ran NumPy at 112-116 GFLOPS on
# 768x3072 at M = 512, 1 thread, where OpenBLAS's own choice (SkylakeX) ran 190-207.
NARROW_OPENBLAS_KERNELS = frozenset({"haswell", "zen", "sandybridge", "nehalem", "core2", "prescott", "atom"})


def installed_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` for a child process that times session creation, reading the package's
    compiled bytecode as an installed package does (pip compiles it at install; numpy's,
    onnx's and onnxruntime's were): these machines' environment sets PYTHONDONTWRITEBYTECODE=1,
    so this checkout's modules were compiled from source in every process, the ones a
    session imports lazily inside the timed creation (0.36 s of ssdlite320's under
    cProfile, AMD Zen 3). The package is compiled beside its sources (``__pycache__``,
    which git ignores) once per bench process."""
    _compile_package()
    env = dict(base)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


@functools.cache
def _compile_package() -> None:
    package = Path(__file__).resolve().parent.parent / "shapeshift"
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True, capture_output=True)


def peer_env(threads: int) -> dict[str, str]:
    """Environment for a child process whose NumPy peer uses ``threads`` threads, with the
    OpenBLAS kernel OpenBLAS itself picks for this CPU where an inherited OPENBLAS_CORETYPE
    would force a narrower one: the peer is timed at its best."""
    env = {"OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    inherited = os.environ.get("OPENBLAS_CORETYPE")
    if inherited and inherited.lower() in NARROW_OPENBLAS_KERNELS:
        own = openblas_kernel(None)
        if own and own.lower() != inherited.lower():
            env["OPENBLAS_CORETYPE"] = own
    return env


@functools.cache
def openblas_kernel(coretype: str | None) -> str | None:
    """The kernel family NumPy's OpenBLAS runs with OPENBLAS_CORETYPE=``coretype`` (None: its
    own choice for this CPU), as threadpoolctl reports it; None when it cannot be told."""
    script = ("import json, numpy, threadpoolctl; print(json.dumps([i.get('architecture') for i in "
              "threadpoolctl.threadpool_info() if i.get('internal_api') == 'openblas']))")
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    try:
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
        kernels = json.loads(out.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return kernels[0] if kernels else None


def describe_peer() -> str:
    """A sentence naming the OpenBLAS kernel the NumPy peer ran with."""
    inherited = os.environ.get("OPENBLAS_CORETYPE")
    chosen = peer_env(1).get("OPENBLAS_CORETYPE", inherited)
    text = f"NumPy's OpenBLAS ran its {openblas_kernel(chosen)} kernel"
    if chosen != inherited:
        text += (f" (OPENBLAS_CORETYPE={chosen}, OpenBLAS's own choice here, in place of the inherited "
                 f"{inherited}, a narrower kernel)")
    return text + "."


def describe() -> str:
    """One markdown paragraph naming the CPU, the flags that matter here and the measured peak."""
    target = host_target()
    facts = measure_fma(target)
    cpu = target.cpu
    ident = f"{target.cpu_model}" + (f" ({cpu.vendor} family {cpu.family} model {cpu.model})" if cpu else "")
    widths = "; ".join(f"{w.bits}-bit {w.peak_gflops:.0f} GFLOPS, FMA latency {w.latency_ns:.2f} ns"
                       for w in facts.widths)
    trip = core_to_core_ns()
    between = f" Core-to-core round trip when this was written: {trip:.0f} ns." if trip else ""
    return (f"Machine: {ident}, {os.cpu_count()} CPUs; ISA {', '.join(target.isa)}; caches L1d "
            f"{target.caches.l1d >> 10} KiB, L2 {target.caches.l2 >> 10} KiB; measured FMA peak a core "
            f"(`shapeshift info --machine`, best of short samples): {widths}. '% peak' below is against "
            f"{facts.peak_gflops:.0f} GFLOPS x threads.{between}")
