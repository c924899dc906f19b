"""The target description as text: what ``shapeshift info --machine`` prints."""

from __future__ import annotations

import os
from typing import Optional

from .calibrate import FmaCalibration
from .description import DESCRIBE_CPU_ENV, Target
from .microarch import width_rate_mismatch


def describe(target: Target, calibration: Optional[FmaCalibration] = None) -> list[str]:
    """Lines describing ``target``; with ``calibration``, its measured FMA facts too."""
    from ..codegen.defaults import default_schedule  # codegen reads the target, not the reverse

    cpu = target.cpu
    caches = target.caches
    lines = [f"target:     {target.name} (-march={target.march}), key {target.key}",
             f"cpu:        {target.cpu_model}" + (f" ({cpu.vendor}, family {cpu.family} model {cpu.model}, "
                                                  f"{cpu.logical_cpus} logical CPUs)" if cpu else ""),
             f"isa:        {', '.join(target.isa) or 'none of AVX2/FMA/AVX-512'}",
             f"vectors:    {', '.join(f'{w}-bit' for w in target.widths)}; {target.vector_registers} registers",
             f"caches:     L1d {_kib(caches.l1d)}, L2 {_kib(caches.l2)} (per core), L3 {_kib(caches.l3)}",
             f"class:      {target.microarch.name}: {target.microarch.summary}"]
    described = os.environ.get(DESCRIBE_CPU_ENV)
    if described and target.name == "native":
        lines.append(f"warning:    the CPU above is described by {DESCRIBE_CPU_ENV}={described}, "
                     "not this machine's own")
    if calibration is not None:
        for w in calibration.widths:
            lines.append(f"fma {w.bits}:    {w.peak_gflops:.1f} GFLOPS a core (float32), {w.fma_per_ns:.2f} FMAs/ns, "
                         f"latency {w.latency_ns:.2f} ns, {w.chains} independent FMAs to reach it")
        mismatch = width_rate_mismatch(target.microarch, calibration)
        if mismatch:
            lines.append(f"warning:    {mismatch}")
    s = default_schedule(target)
    width = "zmm" if s.lanes == 16 else "ymm"
    lines.append(f"gemm:       untuned tile {s.mr}x{s.nr} in {width} ({s.registers} registers), kc {s.kc}, "
                 f"mc {s.mc}, nc {s.nc} ({s.one_block_columns} for one block of A); products of up to "
                 f"{s.small_m} rows stream B (the small-M path)")
    lines.append(f"            tile chosen by: {target.microarch.chosen_by}")
    return lines


def _kib(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 8 << 20 else f"{size >> 10} KiB"
