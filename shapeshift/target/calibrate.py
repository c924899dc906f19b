"""Measured facts of the host: FMA throughput and latency per vector width.

A short calibration (well under a second of timing, plus one small build) runs C loops of
fused multiply-adds: one dependent chain (latency), and as many independent chains as the
register file holds (throughput). From the two come the per-core peak in GFLOPS and the
FMAs that must be in flight to reach it (throughput x latency, frequency-free: 8 on a core
with two 512-bit FMA ports of latency 4, 4 for zmm on AMD Zen 4 where a 512-bit FMA
issues as two halves). Results are cached as JSON under ``$SHAPESHIFT_CACHE_DIR/target/``,
keyed by the CPU model and flags (``Target.key``): a new CPU or a changed flag set
measures again, and an unreadable file is measured again and replaced.

The benchmarks report GFLOPS as a share of ``peak_gflops``; ``shapeshift info --machine``
prints all of it.
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from ..files import discard_if_not_regular
from .description import Target, host_target

# Bump when the measurement changes, so that older cached results are measured again.
CALIBRATION_VERSION = 2
# Iterations per sample: about a millisecond, well inside a scheduler time slice, so that
# on a busy machine some samples still run undisturbed; the fastest of REPEATS is kept.
ITERATIONS = 250_000
REPEATS = 60


@dataclass(frozen=True)
class WidthFacts:
    """What one vector width measured on one core."""

    bits: int
    lanes: int  # float32 per vector
    fma_per_ns: float  # vector FMAs issued per nanosecond, all chains together
    latency_ns: float  # one FMA's latency
    peak_gflops: float  # fma_per_ns x lanes x 2

    @property
    def chains(self) -> int:
        """Independent FMAs that must be in flight to reach the peak (ports x latency)."""
        # A quarter up: a measured 7.3 (ports x latency of 8, throughput read a little low) is 8.
        return max(1, round(self.fma_per_ns * self.latency_ns + 0.25))


@dataclass(frozen=True)
class FmaCalibration:
    """FMA facts per width measured on the host."""

    target_key: str
    cpu_model: str
    widths: tuple[WidthFacts, ...]

    def width(self, bits: int) -> Optional[WidthFacts]:
        return next((w for w in self.widths if w.bits == bits), None)

    @property
    def peak_gflops(self) -> float:
        """The best per-core float32 peak over the widths."""
        return max(w.peak_gflops for w in self.widths)

    def to_json(self) -> dict:
        return {"version": CALIBRATION_VERSION, "target_key": self.target_key, "cpu_model": self.cpu_model,
                "widths": [asdict(w) for w in self.widths]}

    @staticmethod
    def from_json(data: dict) -> "FmaCalibration":
        if data.get("version") != CALIBRATION_VERSION:
            raise ValueError("calibration of another version")
        return FmaCalibration(target_key=str(data["target_key"]), cpu_model=str(data["cpu_model"]),
                              widths=tuple(WidthFacts(**w) for w in data["widths"]))


def measure_fma(target: Optional[Target] = None, cache_dir: Optional[Path] = None,
                refresh: bool = False) -> FmaCalibration:
    """The host's FMA facts: from the cache when a valid entry for this CPU exists (unless
    ``refresh``), else measured now and cached. ``target`` must describe this machine."""
    from ..codegen.build import default_cache_dir

    target = target or host_target()
    if target.name != "native":
        raise ValueError(f"only the host can be measured, not the named target {target.name}")
    path = (cache_dir or default_cache_dir()) / "target" / f"fma-{target.key}.json"
    if not refresh:
        cached = _read_cached(path, target)
        if cached is not None:
            return cached
    result = _measure(target, cache_dir)
    _write(path, result)
    return result


def _read_cached(path: Path, target: Target) -> Optional[FmaCalibration]:
    if path.is_symlink() or (path.exists() and not path.is_file()):
        return None  # a directory fails the read, a fifo blocks it: measured again, and replaced
    try:
        result = FmaCalibration.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or damaged: measure again
    return result if result.target_key == target.key else None


def _write(path: Path, result: FmaCalibration) -> None:
    """Write atomically; a cache that cannot be written only costs a measurement next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        discard_if_not_regular(path)  # a directory there would refuse the rename, every time
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".fma-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(result.to_json(), f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass


def _measure(target: Target, cache_dir: Optional[Path]) -> FmaCalibration:
    from ..codegen.build import compile_library
    from ..codegen.kernels.prelude import PRELUDE

    plans = [(bits, _throughput_chains(target)) for bits in target.widths]
    lib = compile_library(PRELUDE + calibration_source(plans), name_hint="fma_calibration",
                          cache_dir=cache_dir).cdll
    facts = []
    for bits, chains in plans:
        lanes = bits // 32
        latency = _best(lib, f"ss_fma_{bits}_1", 1)
        throughput = _best(lib, f"ss_fma_{bits}_{chains}", chains)
        fma_per_ns = chains / throughput
        facts.append(WidthFacts(bits=bits, lanes=lanes, fma_per_ns=round(fma_per_ns, 4),
                                latency_ns=round(latency, 4), peak_gflops=round(fma_per_ns * lanes * 2, 1)))
    return FmaCalibration(target_key=target.key, cpu_model=target.cpu_model, widths=tuple(facts))


def _throughput_chains(target: Target) -> int:
    """Chains for the throughput loop: the register file less the two FMA operands and a spare."""
    return target.vector_registers - 4


def _best(lib, name: str, chains: int) -> float:
    """Nanoseconds per loop iteration (``chains`` FMAs), the fastest of REPEATS runs: a
    shared machine only ever adds time."""
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_int64]
    fn.restype = ctypes.c_double
    for _ in range(10):  # warm up: the clock and the vector unit's power state
        fn(ITERATIONS)
    return min(fn(ITERATIONS) for _ in range(REPEATS)) / ITERATIONS * 1e9


def calibration_source(plans: list[tuple[int, int]]) -> str:
    """C loops ``double ss_fma_<bits>_<chains>(int64_t n)``: seconds for n iterations of
    ``chains`` independent FMAs on vectors of ``bits``, for each plan and for one chain."""
    out = ["#include <time.h>",
           "static double ss_fma_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);"
           " return t.tv_sec + 1e-9 * t.tv_nsec; }",
           "volatile float ss_fma_sink;"]
    for bits, chains in plans:
        for count in sorted({1, chains}):
            out.append(_loop(bits, count))
    return "\n".join(out) + "\n"


def _loop(bits: int, chains: int) -> str:
    vec, mm, guard = {256: ("__m256", "_mm256", "__AVX2__"), 512: ("__m512", "_mm512", "__AVX512F__")}[bits]
    names = [f"a{i}" for i in range(chains)]
    # x slightly above 1 and y slightly below 0 keep every value finite over any n.
    body = [f"double ss_fma_{bits}_{chains}(int64_t n)", "{",
            f"#ifdef {guard}",
            f"    const {vec} x = {mm}_set1_ps(0.99999994f), y = {mm}_set1_ps(1e-7f);",
            *(f"    {vec} {a} = {mm}_set1_ps({i + 1}.0f);" for i, a in enumerate(names)),
            "    const double start = ss_fma_now();",
            "    for (int64_t k = 0; k < n; ++k) {",
            *(f"        {a} = {mm}_fmadd_ps({a}, x, y);" for a in names),
            # Keep every chain in a register and the loop from being folded away.
            *(f'        __asm__("" : "+v"({a}));' for a in names),
            "    }",
            "    const double seconds = ss_fma_now() - start;",
            f"    {vec} s = {names[0]};",
            *(f"    s = {mm}_add_ps(s, {a});" for a in names[1:]),
            "    float out[16];",
            f"    {mm}_storeu_ps(out, s);",
            "    ss_fma_sink = out[0];",
            "    return seconds;",
            "#else",
            "    (void)n;",
            "    return 1e30; /* not built for this width */",
            "#endif",
            "}"]
    return "\n".join(body)
