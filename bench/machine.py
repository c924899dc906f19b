"""The machine a benchmark ran on, for every results file: CPU model, its flags, and the
measured FMA peak per width (shapeshift.target: measured once per CPU, cached).

``describe()`` is the paragraph results files start with; ``peak_gflops()`` the per-core
float32 peak that GFLOPS are reported against (the widest width's); ``peer_env()`` the
environment a NumPy peer runs in, at its best on this CPU.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shapeshift.target import host_target, measure_fma  # noqa: E402


def peak_gflops() -> float:
    """The measured per-core float32 FMA peak of this machine (its widest vector width)."""
    return measure_fma(host_target()).peak_gflops


# OpenBLAS kernel families narrower than its AVX-512 ones. An inherited OPENBLAS_CORETYPE
# naming one of them on an AVX-512 CPU hobbles the peer: these machines' environment sets
# OPENBLAS_CORETYPE=Haswell, and on an AMD Zen 5 that ran NumPy at 112-116 GFLOPS on
# 768x3072 at M = 512, 1 thread, where OpenBLAS's own choice (SkylakeX) ran 190-207.
NARROW_OPENBLAS_KERNELS = frozenset({"haswell", "zen", "sandybridge", "nehalem", "core2", "prescott", "atom"})


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
    return (f"Machine: {ident}, {os.cpu_count()} CPUs; ISA {', '.join(target.isa)}; caches L1d "
            f"{target.caches.l1d >> 10} KiB, L2 {target.caches.l2 >> 10} KiB; measured FMA peak a core "
            f"(`shapeshift info --machine`, best of short samples): {widths}. '% peak' below is against "
            f"{facts.peak_gflops:.0f} GFLOPS x threads.")
