"""Batched, strided float32 GEMM for the native backend (BLIS-style, AVX2/FMA; the full-tile
micro-kernel in zmm registers on AVX-512 builds, see _micro_kernel).

``fragment(schedule)`` assembles the C fragment (``source`` its text); ``GemmSchedule``
holds every tuning parameter, which the fragment receives as ``#define SS_GEMM_*``
constants and as the shape of the generated micro-kernels (gemm_tiles.py); the fixed C
(driver loops, packing, entry points) is gemm_driver.py's.

Exported C functions (strides in elements, a 0 stride broadcasts):

``void ss_gemm(int64_t M, int64_t N, int64_t K, int64_t batch0, int64_t batch1,
const float* A, int64_t sa0, int64_t sa1, int64_t rsa, int64_t csa,
const float* B, int64_t sb0, int64_t sb1, int64_t rsb, int64_t csb,
float* C, int64_t sc0, int64_t sc1, int64_t ldc,
float alpha, const float* bias, float beta, int64_t rs_bias, int64_t cs_bias, int act)``
    For every batch index (i0, i1), i0 < batch0, i1 < batch1:
    ``C[m,n] = act(alpha * sum_k A[m,k] * B[k,n] + beta * bias[m,n])`` with
    A(m,k) at ``A[i0*sa0 + i1*sa1 + m*rsa + k*csa]``, B(k,n) at
    ``B[i0*sb0 + i1*sb1 + k*rsb + n*csb]``, C(m,n) at ``C[i0*sc0 + i1*sc1 + m*ldc + n]``
    (written, not accumulated). ``bias`` is NULL for none, else bias(m,n) is
    ``bias[m*rs_bias + n*cs_bias]`` for every batch. ``act``: 0 none, 1 relu.
    K == 0 gives ``act(beta * bias)`` (0 without bias).

``int64_t ss_gemm_packed_b_size(int64_t K, int64_t N)``
    Floats needed by ``ss_gemm_pack_b``: ``K * ceil(N / nr) * nr``.

``void ss_gemm_pack_b(int64_t K, int64_t N, const float* B, int64_t rsb, int64_t csb, float* packed)``
    Packs B(k,n) = ``B[k*rsb + n*csb]`` (a constant weight, once at model load) into the
    layout the micro-kernels read (see below).

``void ss_gemm_prepacked(int64_t M, int64_t N, int64_t K, int64_t batch0, int64_t batch1,
const float* A, int64_t sa0, int64_t sa1, int64_t rsa, int64_t csa, const float* packed_b,
float* C, int64_t sc0, int64_t sc1, int64_t ldc,
float alpha, const float* bias, float beta, int64_t rs_bias, int64_t cs_bias, int act)``
    ``ss_gemm`` with B given by ``ss_gemm_pack_b(K, N, ...)`` of the same schedule, the
    same B for every batch.

``void ss_gemm_add(<ss_gemm's arguments>, const float* D)`` and
``void ss_gemm_prepacked_add(<ss_gemm_prepacked's arguments>, const float* D)``
    The same with an addend: ``C[m,n] = act(alpha * sum_k A[m,k] * B[k,n] + beta * bias[m,n]
    + D[m,n])``, D(m,n) at ``D[i0*sc0 + i1*sc1 + m*ldc + n]`` (laid out as C, which it must
    not overlap; NULL: none). A convolution's residual (kernels/conv.py): added in the
    epilogue, in registers for full tiles, while the tile is in cache.

Prepacked layout (a function of the schedule's ``nr`` and ``kc``): let
``Np = ceil(N / nr) * nr``. K is cut into blocks of ``kc`` rows; block ``k0`` (a multiple
of kc) holds ``kb = min(kc, K - k0)`` rows and starts at ``k0 * Np``. Inside it, column
panel ``q`` (columns ``q*nr .. q*nr + nr - 1``) starts at ``q * nr * kb`` and stores its
rows one after another, ``nr`` floats each::

    packed[k0*Np + q*nr*kb + k*nr + j] = B(k0 + k, q*nr + j)   (0 where q*nr + j >= N)

``pack_b_reference`` computes the same layout with NumPy.

How it runs: items of work are (batch, N-chunk, M-chunk) triples, split so that every
thread gets the same number (chunks only where the batch alone cannot feed the threads;
N first, so each thread reads its own part of B) and run under
``#pragma omp parallel for ... if(...)`` when the call has at least ``parallel_min_flops``
flops. Each thread mallocs its packing buffers once per call. Inside an item, the BLIS
loops: nc columns of B at a time (one_block_nc where the item's rows are one block of A),
kc rows of B packed into nr-column micro-panels (or read from the prepacked B), mc rows of
A packed into mr-row micro-panels, both zero-padded to full panels so the mr x nr
micro-kernel never checks bounds; edge tiles go
through a local tile of which only the valid part is stored, computed by a kernel of their
own size (valid rows, columns rounded up to a vector), not the full mr x nr one; the last
rows of M (fewer than mr) over a group of consecutive B panels at once where the block holds
the group, so that enough FMA chains are independent (gemm_tiles.edge_group). All sum in the
full tile's order: equal rows of A give equal rows of C wherever they fall. Full tiles apply the
epilogue (alpha, bias, addend, relu) in registers after their last K block; edge tiles, and a
bias whose column stride is neither 0 nor 1, get it from a separate pass over the tile
while it is in L1. Row-major A and column-major B are packed through 8x8 transposes.

Calls with M <= ``small_m`` are bound by reading B, so A is not packed: a generated kernel
per row count, in the schedule's width (zmm ones, on AVX-512 builds, with their own row
groups and panel counts), broadcasts A straight from its strides and streams B once, from the
prepacked panels, from a row-major B in place (``pack_rows`` rows at a time across all
its columns, so every row is one sequential stream), or from ``small_nc``-column blocks
of any other B packed into L2. Packed panels are read ``small_panels`` at a time where
the registers allow, one from each equal part of the columns: that many read streams,
which one core needs to draw its share of DRAM bandwidth. Every column of a call, the
partial last panel included, is summed by kernels of one summation order, so equal
columns of B give bitwise equal columns of C, and a thread count changes no result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..cwriter import CWriter, Fragment, Private, Shared, fill

DEPENDS: tuple[str, ...] = ()

# The register names of a vector of this many floats (the schedule's ``lanes``).
VECTOR_REGISTERS = {8: "ymm", 16: "zmm"}
# Independent FMA chains needed to hide FMA latency (latency 4-5 cycles x 2 ports).
FMA_CHAINS = 8
# Above this many rows the B-streaming kernel would need more than 16 registers.
# The B-streaming path splits larger m into row groups (see _small_row_groups); past this
# the packed path, which reuses each packed B panel across mc rows, is the better one.
MAX_SMALL_M = 32
# Read streams past four gained nothing in a read loop on one core (24 GB/s at 4, 8 and 16).
MAX_SMALL_PANELS = 8

#: What the threads threshold (GemmSchedule.parallel_min_flops) counts a float of B as: a
#: call of one or two rows is as long as B takes to stream in, not its flops. 1 MB of B (an
#: LSTM's input weight at hidden 256, one step, batch 1: 0.5 Mflop) took as long from L2 or
#: L3 as 1 Mflop of a larger call in the registers. With that product on one thread, the
#: one-step LSTM ran 40 us at 2 threads against onnxruntime's 30; on both, 32 (AMD Zen 4).
FLOPS_PER_B_FLOAT = 4


@dataclass(frozen=True)
class GemmSchedule:
    """Tuning parameters of the GEMM fragment.

    mr x nr: the register tile of the micro-kernel (nr floats = nr/lanes vectors per row);
    kc: rows of B (columns of A) per packed block; mc: rows of A per packed block
    (multiple of mr); nc: columns of B per packed block (multiple of nr);
    one_block_nc: ... where an item's rows are one block of A (at most mc), 0 for nc. A
    packed block is then read once, right after its packing, so it need not wait in L3:
    blocks that stay in L2 ran ResNet-50's 1 x 1 convs of 64 and 128 output channels on
    56 x 56 (the GEMM's M = 64 or 128, N = 3136 pixels, B the activations, packed at every
    call) 5-13% faster on an AMD Zen 4 (1 MB L2; one_block_nc 512 against nc 3072, 1
    thread, bench/conv_profile.py with the two variants in turn); 256 columns gained less;
    unroll_k: k steps per iteration of the micro-kernel loop (``#pragma GCC unroll``);
    small_m: calls with M <= small_m use the B-streaming path (0 disables it);
    small_nc: columns of a plain B the B-streaming path packs at a time (multiple of nr;
    kc x small_nc floats should fit in L2);
    pack_rows: rows of a row-major B read together, across the whole block (one read stream
    each), when packing it and when the B-streaming path reads it in place;
    prefetch_rows: how many rows of B ahead the B-streaming path prefetches (0: none);
    prefetch_min_m: ... in calls of at least this many rows, and only in their first row
    group. With weights streamed from DRAM, 32 rows ahead made M = 6..8 about 30% faster
    (the hardware prefetcher falls behind once the loop has that much work per row), while
    at M <= 5 it measured neutral to slightly slower;
    parallel_min_flops: calls with fewer flops (2*M*N*K*batch) run on one thread. 1 Mflop is
    10-20 us on one core: small-plane convs stream their weights from L2 or L3 at 60-80
    GFLOPS, and a region with the worker spinning costs a microsecond or two. Against 2
    Mflop, on 2 threads, AMD Zen 4, median of 10 alternating processes: yolov8n 1x3x64x96
    1.225 -> 1.089 ms (its 1x1 convs of 1-2 Mflop on 2x3..16x24 planes, 19-25 us each, had
    run on one thread), ppocr_det 1x3x32x64 0.441 -> 0.372, ssdlite 3x96x128 24.2 -> 22.5;
    the small GPT-2 on a 128-token prompt 2.34 -> 2.26 (noise). 1 Mflop had lost on that GPT-2
    before the worker was kept off the caller's CPU (prelude.py), and 512 Kflop gained less
    on yolov8n (1.165);
    small_panels: at most this many packed panels of B the B-streaming path reads at once,
    one from each of as many equal parts of the columns, so that B arrives in that many
    sequential streams (1: panel after panel, one stream). A read loop on one core drew
    about 15 GB/s from DRAM in one stream and 24 in four; M = 1 on a cold 768x3072 B ran
    16-47% faster with four panels than with one (same process, this default schedule
    against small_panels = 1). Only row groups whose accumulators for that many panels fit
    the registers use it (with nr = 16: M = 1 four panels, M = 2 two);
    lanes: floats per vector of the full-tile and edge kernels, 8 (ymm) or 16 (zmm, on
    AVX-512 builds; others run the tile in ymm vectors);
    registers: the vector register file the tile and the B-streaming kernels are drawn for,
    16 (AVX2) or 32 (AVX-512, ymm16-31 included): the target's, see codegen/defaults.py;
    prefetch_c: 1 to prefetch a full tile's lines of C as its k loop starts;
    a_in_l1: the order of the tile loops in a block: 0 keeps a kc x nr micro-panel of B in
    L1 while A's micro-panels stream past (kc bounded by L1 / nr), 1 keeps a kc x mr one of
    A there while B's stream from L2 (kc bounded by L1 / mr, nc by L2 / kc: fewer K blocks,
    so fewer passes over C).
    """

    mr: int = 6
    nr: int = 16
    kc: int = 256
    mc: int = 72
    nc: int = 3072
    one_block_nc: int = 0
    unroll_k: int = 4
    small_m: int = 8
    small_nc: int = 256
    pack_rows: int = 8
    prefetch_rows: int = 32
    prefetch_min_m: int = 6
    parallel_min_flops: int = 1 << 20
    small_panels: int = 4
    lanes: int = 8
    registers: int = 16
    prefetch_c: int = 1
    a_in_l1: int = 0

    @property
    def one_block_columns(self) -> int:
        """The columns of B's packed blocks where the rows are one block of A: one_block_nc,
        or nc where that is 0."""
        return self.one_block_nc or self.nc

    def __post_init__(self) -> None:
        for name in ("mr", "nr", "kc", "mc", "nc", "one_block_nc", "unroll_k", "small_m", "small_nc", "pack_rows",
                     "prefetch_rows", "prefetch_min_m", "parallel_min_flops", "small_panels", "lanes", "registers",
                     "prefetch_c", "a_in_l1"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"GemmSchedule.{name} must be an int, got {value!r}")
        for name in ("mr", "nr", "kc", "mc", "nc", "unroll_k", "small_nc", "pack_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"GemmSchedule.{name} must be >= 1, got {getattr(self, name)}")
        if self.lanes not in VECTOR_REGISTERS:
            raise ValueError(f"GemmSchedule.lanes must be 8 (ymm) or 16 (zmm), got {self.lanes}")
        if self.registers not in (16, 32):
            raise ValueError(f"GemmSchedule.registers must be 16 (AVX2) or 32 (AVX-512), got {self.registers}")
        if self.lanes == 16 and self.registers != 32:
            raise ValueError("GemmSchedule.lanes=16 (zmm) needs registers=32: AVX-512 has 32 vector registers")
        if self.nr % self.lanes:
            raise ValueError(f"GemmSchedule.nr must be a multiple of lanes={self.lanes} (one vector), got {self.nr}")
        needed = tile_registers(self.mr, self.nr, self.lanes)
        if needed > self.registers:
            raise ValueError(f"GemmSchedule mr={self.mr}, nr={self.nr} needs {needed} {VECTOR_REGISTERS[self.lanes]} "
                             f"registers ({self.mr * (self.nr // self.lanes)} accumulators + {self.nr // self.lanes} "
                             f"B loads + 1 A broadcast), more than the {self.registers} there are")
        if self.mc % self.mr:
            raise ValueError(f"GemmSchedule.mc={self.mc} must be a multiple of mr={self.mr}")
        if self.one_block_nc < 0:
            raise ValueError(f"GemmSchedule.one_block_nc must be >= 0 (0: nc), got {self.one_block_nc}")
        for name in ("nc", "one_block_nc", "small_nc"):
            if getattr(self, name) % self.nr:
                raise ValueError(f"GemmSchedule.{name}={getattr(self, name)} must be a multiple of nr={self.nr}")
        if self.unroll_k > 16:
            raise ValueError(f"GemmSchedule.unroll_k={self.unroll_k} is over 16: code size for nothing")
        if not 0 <= self.small_m <= MAX_SMALL_M:
            raise ValueError(f"GemmSchedule.small_m must be in 0..{MAX_SMALL_M}, got {self.small_m}")
        for name in ("prefetch_rows", "prefetch_min_m"):
            if getattr(self, name) < 0:
                raise ValueError(f"GemmSchedule.{name} must be >= 0, got {getattr(self, name)}")
        if not 1 <= self.small_panels <= MAX_SMALL_PANELS:
            raise ValueError(f"GemmSchedule.small_panels must be in 1..{MAX_SMALL_PANELS}, got {self.small_panels}")
        for name in ("prefetch_c", "a_in_l1"):
            if getattr(self, name) not in (0, 1):
                raise ValueError(f"GemmSchedule.{name} must be 0 or 1, got {getattr(self, name)}")
        if self.parallel_min_flops < 0:
            raise ValueError(f"GemmSchedule.parallel_min_flops must be >= 0, got {self.parallel_min_flops}")


def tile_registers(mr: int, nr: int, lanes: int) -> int:
    """Vector registers an mr x nr tile in vectors of ``lanes`` floats holds: the
    accumulators, one per B vector of a k step, and one A broadcast."""
    vectors = nr // lanes
    return mr * vectors + vectors + 1


def max_rows(nr: int, lanes: int, registers: int) -> int:
    """The tallest tile of nr columns whose registers (``tile_registers``) fit ``registers``."""
    vectors = nr // lanes
    return (registers - vectors - 1) // vectors


# Names in the default fragment start with this; ``source(prefix=...)`` swaps it.
DEFAULT_PREFIX = "ss_"
_PREFIX_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*_")


def packed_b_size(k: int, n: int, schedule: Optional[GemmSchedule] = None) -> int:
    """Floats in the prepacked B of a K x N matrix (what ``ss_gemm_packed_b_size`` returns)."""
    schedule = schedule or _default()
    return k * (-(-n // schedule.nr)) * schedule.nr


def pack_b_reference(b: np.ndarray, schedule: Optional[GemmSchedule] = None) -> np.ndarray:
    """The prepacked layout of a K x N matrix, computed with NumPy (the layout's specification)."""
    schedule = schedule or _default()
    k, n = b.shape
    nr, kc = schedule.nr, schedule.kc
    padded_n = -(-n // nr) * nr
    padded = np.zeros((k, padded_n), dtype=np.float32)
    padded[:, :n] = b
    blocks = []
    for k0 in range(0, k, kc):
        block = padded[k0:k0 + kc]  # kb x Np
        # (kb, panels, nr) -> (panels, kb, nr): each panel's rows one after another.
        blocks.append(block.reshape(block.shape[0], padded_n // nr, nr).transpose(1, 0, 2).ravel())
    return np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.float32)


def _default() -> GemmSchedule:
    """This machine's untuned schedule (codegen/defaults.py: from the target description)."""
    from ..defaults import default_schedule  # it imports GemmSchedule from here

    return default_schedule()


def source(schedule: Optional[GemmSchedule] = None, prefix: str = DEFAULT_PREFIX) -> str:
    """The C fragment's text (``fragment(schedule).text()``; this machine's default schedule
    when None).

    ``prefix`` replaces the ``ss_`` of every function and type name (``ss_gemm`` becomes
    ``<prefix>gemm``) and, upper-cased, the ``SS_`` of every ``SS_GEMM_*`` macro, so that
    several schedules can live in one library (the tuner's dispatcher, shapeshift/tune).
    The default prefix returns the text unchanged, byte for byte, so existing
    callers and their build-cache keys are unaffected.
    """
    text = fragment(schedule).text()
    if prefix == DEFAULT_PREFIX:
        return text
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"gemm prefix {prefix!r} must be a C identifier prefix ending in '_'")
    # Every name the fragment defines starts with ss_gemm / SS_GEMM_ (the prelude's own ss_*
    # names are not used here), so a textual rename is complete.
    return text.replace("ss_gemm", f"{prefix}gemm").replace("SS_GEMM_", f"{prefix.upper()}GEMM_")


def fragment(schedule: Optional[GemmSchedule] = None) -> Fragment:
    """The fragment's parts (codegen/cwriter.py): the schedule's ``#define``s and the 8x8
    transpose, which other units use too, then the private kernels and drivers, then the
    entry points.

    The full-tile micro-kernel runs in vectors of the schedule's ``lanes``: zmm (16) where
    the compiler targets AVX-512, else ymm (a build without AVX-512 of a zmm schedule runs
    the same tile in twice as many ymm vectors: correct, but the tile was not drawn for
    it). On AMD Zen 4 (both widths peak at 112 GFLOPS a core, a zmm FMA issued as two
    halves) the ymm 6 x 16 tile ran at 84-92 GFLOPS on large products, held back by issuing
    two FMAs per row and k step; in zmm it issues one. On a core with two 512-bit FMA ports
    a zmm tile needs ports x latency (8) accumulators at least; codegen/defaults.py draws
    the tile from the target description.
    """
    from . import gemm_driver as driver
    from . import gemm_tiles as tiles

    s = schedule or _default()
    defines = CWriter()
    defines.comment("---- gemm (shapeshift/codegen/kernels/gemm.py) ----")
    defines.lines(f"#define SS_GEMM_{name.upper()} {value}" for name, value in (
        ("mr", s.mr), ("nr", s.nr), ("kc", s.kc), ("mc", s.mc), ("nc", s.nc),
        ("one_block_nc", s.one_block_columns), ("nc_max", max(s.nc, s.one_block_columns)), ("small_m", s.small_m),
        ("small_nc", s.small_nc), ("pack_rows", s.pack_rows)))
    defines.line(f"#define SS_GEMM_PAR_MIN_FLOPS {float(s.parallel_min_flops)!r}",
                 f"#define SS_GEMM_FLOPS_PER_B_FLOAT {float(FLOPS_PER_B_FLOAT)!r}")
    kernels = CWriter()
    with kernels.guard("__AVX2__"):
        kernels.raw(tiles.in_lanes(s, tiles.full_tile_kernel))
        kernels.raw(tiles.in_lanes(s, tiles.edge_kernels))
        kernels.raw(tiles.in_lanes(s, tiles.edge_rows_kernels))
        kernels.raw(tiles.in_lanes(s, tiles.small_path))
        kernels.orelse()
        kernels.raw(driver.MICRO_KERNEL_SCALAR)
        kernels.raw(driver.EDGE_TILE_SCALAR)
        kernels.raw(driver.EDGE_ROWS_SCALAR)
        kernels.raw(tiles.small_path_scalar(s))
    return Fragment([
        Shared(defines.text()),
        Private(driver.HELPERS),
        Shared(driver.TRANSPOSE8),
        Private(driver.PACKING),
        Private(kernels.text()),
        Private(fill(driver.DRIVER, TILE_LOOPS=driver.TILE_LOOPS[s.a_in_l1], EDGE_GROUP_MAX=tiles.MAX_EDGE_GROUP)),
        *driver.ENTRIES,
    ])
