"""Microarchitecture classes: what the target description cannot derive by a rule.

A rule picks the vector width (the widest the ISA has), the register file (32 vector
registers with AVX-512, 16 without) and the cache blocking (from the cache sizes). Which
register tile of those that fit runs fastest depends on how the core issues FMAs and
loads, which no CPUID flag says; each class below names its GEMM tile and the
measurement that chose it. A CPU matching no class takes the AVX2 entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cpu import CpuIdentity


@dataclass(frozen=True)
class MicroarchClass:
    """A family of cores that share an FMA and load organisation."""

    name: str
    summary: str
    lanes: int  # floats per vector of the GEMM tile: 8 (ymm) or 16 (zmm)
    tile: tuple[int, int]  # (mr, nr) of the dense GEMM's register tile
    chosen_by: str  # the measurement that chose the tile


INTEL_AVX512 = MicroarchClass(
    name="intel-avx512",
    summary="Intel Xeon with AVX-512 (Skylake-SP to Sapphire/Emerald Rapids): up to two 512-bit FMA "
            "ports, 32 zmm registers",
    lanes=16, tile=(8, 48),
    chosen_by="bench/results/gemm_tiles.md: on a Xeon with AVX-512 and AMX (family 6 model 167, "
              "two 512-bit FMA ports: 201-232 GFLOPS zmm, 106-116 ymm), 1 thread, the dense GEMM "
              "on BERT-base weights at M = 16, 128, 512, best of 15 interleaved samples against "
              "OpenBLAS: 8x48 1.23x and 1.48x geomean in two sweeps (kc 192 / mc 144 in the "
              "second), 14x32 1.21x and 1.40x, 6x64 1.21x and 1.43x, 12x32 1.15-1.16x, the old "
              "6x16 0.89x")
ZEN4 = MicroarchClass(
    name="amd-zen4",
    summary="AMD Zen 4 and later with AVX-512: a 512-bit FMA issues as two 256-bit halves, "
            "ymm and zmm peak alike (~112 GFLOPS a core)",
    lanes=16, tile=(6, 16),
    chosen_by="Zen 4, 1 thread: the zmm 6x16 tile ran 768x3072 at M = 512 at 95-102 GFLOPS like "
              "OpenBLAS's AVX-512 kernel, where the ymm 6x16 tile reached 84-92 (the commit that "
              "added the zmm micro-kernel)")
AVX2 = MicroarchClass(
    name="avx2",
    summary="x86-64 with AVX2 and FMA, 16 ymm registers (and any CPU no other class matches)",
    lanes=8, tile=(6, 16),
    chosen_by="the hand-tuned tile of the AVX2 GEMM (issue 4): 12 accumulators + 2 B vectors + 1 "
              "broadcast of the 16 ymm registers, 2 FMA ports x latency 4-5 covered")

CLASSES = (INTEL_AVX512, ZEN4, AVX2)


def classify(cpu: CpuIdentity | None, flags: frozenset[str]) -> MicroarchClass:
    """The class of a CPU with these instruction-set ``flags`` (``cpu`` None: a named target)."""
    if "avx512f" not in flags:
        return AVX2
    if cpu is not None and cpu.vendor == "AuthenticAMD":
        return ZEN4
    return INTEL_AVX512
