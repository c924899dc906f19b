"""Microarchitecture classes: what the target description cannot derive by a rule.

A rule picks the vector width (the widest the ISA has), the register file (32 vector
registers with AVX-512, 16 without) and the cache blocking (from the cache sizes). Which
register tile of those that fit runs fastest depends on how the core issues FMAs and
loads, which no CPUID flag says; each class below names its GEMM tile and the
measurement that chose it. A CPU matching no class takes the AVX2 entry.

The class follows the CPU's identity (vendor and family), so that a recorded target gives
the same schedules wherever it is read. What a class assumes of the FMA units (a 512-bit
FMA at twice the 256-bit rate, or at the same rate) is checked against the measured
calibration by ``width_rate_mismatch``, which ``shapeshift info --machine`` reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .cpu import CpuIdentity

if TYPE_CHECKING:
    from .calibrate import FmaCalibration

# AMD's family numbers: 25 (19h) is Zen 3 and Zen 4 (only Zen 4 has AVX-512), 26 (1Ah) Zen 5.
AMD_ZEN5_FAMILY = 26
# A measured zmm / ymm peak ratio above this is a full-rate 512-bit FMA (ideal 2.0 against 1.0).
FULL_RATE_RATIO = 1.5


@dataclass(frozen=True)
class MicroarchClass:
    """A family of cores that share an FMA and load organisation."""

    name: str
    summary: str
    lanes: int  # floats per vector of the GEMM tile: 8 (ymm) or 16 (zmm)
    tile: tuple[int, int]  # (mr, nr) of the dense GEMM's register tile
    chosen_by: str  # the measurement that chose the tile
    # Whether a 512-bit FMA issues at the 256-bit rate (two full-width ports) or half of it
    # (issued as two halves); None where the class has no 512-bit kernels.
    zmm_full_rate: Optional[bool] = None
    # (kc, mc) where measurement beat the cache rule of codegen/defaults.py; None: the rule.
    blocking: Optional[tuple[int, int]] = None
    # The fewest rows a product by a constant weight takes the GEMV kernel for
    # (kernels/gemv.py); fewer go to the GEMM's small-M path. 5 (past its 4 rows): none.
    gemv_min_m: int = 1
    # The most rows the GEMM's B-streaming path takes (GemmSchedule.small_m) with the class's
    # own tile, where measured; None: the schedule's default (8).
    small_m: Optional[int] = None


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
              "6x16 0.89x (OpenBLAS there most likely ran the Haswell kernel that these machines' "
              "OPENBLAS_CORETYPE forced, numpy at 44-65% of peak: the ranking of the tiles "
              "stands, the ratios against OpenBLAS overstate)",
    zmm_full_rate=True)
ZEN5 = MicroarchClass(
    name="amd-zen5",
    summary="AMD Zen 5 (family 26) with AVX-512 on a full 512-bit datapath: two 512-bit FMA "
            "pipes, zmm peak twice ymm (~250 GFLOPS a core), 32 zmm registers",
    lanes=16, tile=(8, 48),
    chosen_by="an AMD EPYC of family 26 model 2 (measured FMA peak: zmm 252 GFLOPS a core, ymm 127, "
              "latency ~1.0 ns), 1 thread, the dense GEMM on BERT-base weights at M = 16, 128, 512, "
              "best of 9 interleaved samples against OpenBLAS 0.3.31's SkylakeX kernel: 8x48 216-231 "
              "GFLOPS at M >= 128 (86-92% of peak), 1.36x geomean (min 1.02x); 6x64 1.35x; 14x32 "
              "1.28x; the Zen 4 tile 6x16 159-167 GFLOPS, 0.97x. Blocking: kc 384, mc 96 over the "
              "cache rule's kc 160, mc 192 in two more such sweeps, at or above it in 23 of 24 rows "
              "(+0.3-6%; 235-248 GFLOPS at M >= 128 in the second, 93-99% of peak)",
    zmm_full_rate=True, blocking=(384, 96))
ZEN4 = MicroarchClass(
    name="amd-zen4",
    summary="AMD Zen 4 and later with AVX-512: a 512-bit FMA issues as two 256-bit halves, "
            "ymm and zmm peak alike (~112 GFLOPS a core)",
    lanes=16, tile=(8, 16),
    chosen_by="an AMD EPYC of family 25 model 17 (measured FMA peak 118 GFLOPS a core at either "
              "width), 1 thread, bench/gemm_tiles.py (the dense GEMM on BERT-base weights at M = 16, "
              "128, 512, best of 9 interleaved samples against OpenBLAS): zmm 8x16 (kc 256, mc 192, "
              "the cache rule's) 1.30x and 1.31x OpenBLAS geomean in two sweeps (min 1.09x), 112-115 "
              "GFLOPS at M >= 128 (95-97% of peak) where the earlier 6x16 reached 107-113 (1.27x, "
              "1.29x), 10x16 and 12x16 1.27-1.28x, 7x16 1.26-1.27x, 6x32 1.28x, 8x32 1.25-1.26x "
              "(bench/results/gemm_tiles_amd-zen4.md); in a sweep of 2026-12-05 "
              "6x16 led 6x32, 8x32, 4x64, 14x32, 8x48, 12x32 and 6x64 (1.30-1.36x). Eight "
              "rows divide M = 128 and 32 (6x16 left an edge panel of 2 rows): the BERT-base-size "
              "encoder at 1 thread, seq 32 64 -> 59 ms, seq 128 216 -> 208 (alternating processes); "
              "ResNet-50 and MobileNetV3-small unchanged",
    zmm_full_rate=False,
    # The GEMM's small-M path: on an AMD EPYC of family 25 model 17, bench/gemv.py at 1 and 2
    # threads, M = 1, 2, 4, weights in L1 to DRAM, it read the packed weight faster than the
    # GEMV kernel in 22 of the 24 rows on 2026-12-06 (bench/results/gemv_zen4.md's history) and
    # in 23 on 2026-12-07 (at 1 thread every row, 3-31%: M = 1 in L3 83.3 against 78.1 GB/s,
    # from DRAM 35.7 against 27.2); a one-step LSTM at hidden 1024 streaming its 16 MB input weight
    # from DRAM ran 0.92-1.0 ms through it against 1.25-1.37 through the GEMV.
    gemv_min_m=5,
    # 9 and 10 rows on the B-streaming path: the 8x16 tile's packed path ran them as a full
    # panel and an edge of 1 or 2 rows. On an AMD EPYC of family 25 model 17 (the dense GEMM,
    # BERT-base weights, prepacked, best of 7 interleaved samples, /tmp drivers on
    # bench/gemm.py's harness) 1 thread, weights hot: M = 9-10 +17-34%; from DRAM +11-44%;
    # 2 threads +9-35%. Not 11, though that row count gained too (+13% hot with K = 768, a tie
    # with K = 3072): a build whose bound was 11 ran M = 8 from DRAM 5-16% slower (8 x 3072
    # x 768: 62.7-68.7 against 70.4-76.1 GFLOPS in five runs), its 8-row code unchanged in
    # the source, and BERT's seq 8 with it (17.4-19.1 -> 19.2-21.9 ms); with 10, M = 8 as with
    # 8. Not 12 and up: with K = 3072 the path lost at 12 (83 against 96 GFLOPS) and more at
    # 13-14. yolov8n at 96x96, 1 thread (its last stage's 3x3 convs on 3x3 planes are 9-row
    # products, kernels/conv.py's small-plane path): 2.76 -> 2.11 ms, onnxruntime 2.25-2.31.
    small_m=10)
AVX2 = MicroarchClass(
    name="avx2",
    summary="x86-64 with AVX2 and FMA, 16 ymm registers (and any CPU no other class matches)",
    lanes=8, tile=(6, 16),
    chosen_by="the hand-tuned tile of the AVX2 GEMM (issue 4): 12 accumulators + 2 B vectors + 1 "
              "broadcast of the 16 ymm registers, 2 FMA ports x latency 4-5 covered",
    # The GEMM's small-M path: on an AMD Zen 2 (family 23 model 49), bench/gemv.py at 1 and 2
    # threads, M = 1, 2, 4, weights in L1 to DRAM (bench/results/gemv_zen2.md at 9b543ef), it
    # read the packed weight faster than the GEMV kernel in 21 of the 24 rows (1-31%; M = 1 at
    # 1 thread 67 against 53 GB/s in L1, 80 against 74 in L2, 45 against 44.5 in L3) and at most
    # 3% slower in two more (2 threads, DRAM, M = 1 and 2); at 2 threads with M = 4 in L3 both
    # read 10-12 GB/s. Not measured on an Intel CPU without AVX-512, which takes this class too.
    gemv_min_m=5)

CLASSES = (INTEL_AVX512, ZEN5, ZEN4, AVX2)


def classify(cpu: CpuIdentity | None, flags: frozenset[str]) -> MicroarchClass:
    """The class of a CPU with these instruction-set ``flags`` (``cpu`` None: a named target)."""
    if "avx512f" not in flags:
        return AVX2
    if cpu is not None and cpu.vendor == "AuthenticAMD":
        return ZEN5 if cpu.family >= AMD_ZEN5_FAMILY else ZEN4
    return INTEL_AVX512


def width_rate_mismatch(klass: MicroarchClass, calibration: "FmaCalibration") -> Optional[str]:
    """A sentence when the measured zmm / ymm FMA rate contradicts what ``klass`` assumes
    (a Zen 5 laptop core issues 512-bit FMAs as two halves, as Zen 4 does), else None."""
    zmm, ymm = calibration.width(512), calibration.width(256)
    if klass.zmm_full_rate is None or zmm is None or ymm is None:
        return None
    ratio = zmm.peak_gflops / ymm.peak_gflops
    full = ratio > FULL_RATE_RATIO
    if full == klass.zmm_full_rate:
        return None
    measured = "a full-rate 512-bit FMA" if full else "a 512-bit FMA issued as two halves"
    return (f"measured zmm / ymm peak {ratio:.2f}: {measured}, which class {klass.name} does not assume; "
            "its untuned tile may not be this CPU's best (`shapeshift tune` searches the tiles that fit)")
