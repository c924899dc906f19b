"""The machine a benchmark ran on, for every results file: CPU model, its flags, and the
measured FMA peak per width (shapeshift.target: measured once per CPU, cached).

``describe()`` is the paragraph results files start with; ``peak_gflops()`` the per-core
float32 peak that GFLOPS are reported against (the widest width's).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shapeshift.target import host_target, measure_fma  # noqa: E402


def peak_gflops() -> float:
    """The measured per-core float32 FMA peak of this machine (its widest vector width)."""
    return measure_fma(host_target()).peak_gflops


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
