"""Batched, strided float32 GEMM for the native backend (BLIS-style, AVX2/FMA; the full-tile
micro-kernel in zmm registers on AVX-512 builds, see _micro_kernel).

``source(schedule)`` emits the C fragment; ``GemmSchedule`` holds every tuning parameter,
which the fragment receives as ``#define SS_GEMM_*`` constants and as the shape of the
generated micro-kernels.

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
loops: nc columns of B at a time, kc rows of B packed into nr-column micro-panels (or
read from the prepacked B), mc rows of A packed into mr-row micro-panels, both
zero-padded to full panels so the mr x nr micro-kernel never checks bounds; edge tiles go
through a local tile of which only the valid part is stored, computed by a kernel of their
own size (valid rows, columns rounded up to a vector), not the full mr x nr one. Full tiles apply the
epilogue (alpha, bias, relu) in registers after their last K block; edge tiles, and a
bias whose column stride is neither 0 nor 1, get it from a separate pass over the tile
while it is in L1. Row-major A and column-major B are packed through 8x8 transposes.

Calls with M <= ``small_m`` are bound by reading B, so A is not packed: a generated kernel
per row count broadcasts A straight from its strides and streams B once, from the
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
from typing import Callable, Optional

import numpy as np

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


@dataclass(frozen=True)
class GemmSchedule:
    """Tuning parameters of the GEMM fragment.

    mr x nr: the register tile of the micro-kernel (nr floats = nr/lanes vectors per row);
    kc: rows of B (columns of A) per packed block; mc: rows of A per packed block
    (multiple of mr); nc: columns of B per packed block (multiple of nr);
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
    parallel_min_flops: calls with fewer flops (2*M*N*K*batch) run on one thread. 2 Mflop is
    about 20 us on one core with the zmm micro-kernel, still well above the cost of waking
    a second thread (a few us while it spins between regions). Against 4 Mflop, on 2
    threads (alternating processes, best of 4): yolov8n 1.50 -> 1.36 and 1.31 -> 1.17 x
    onnxruntime's time at 2x3x96x64 and 3x3x128x128 (its late convs are 2-4 Mflop
    products), GPT-2 decoding 0.76 -> 0.72 at batch 4; 1 Mflop lost that back on GPT-2;
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
    unroll_k: int = 4
    small_m: int = 8
    small_nc: int = 256
    pack_rows: int = 8
    prefetch_rows: int = 32
    prefetch_min_m: int = 6
    parallel_min_flops: int = 1 << 21
    small_panels: int = 4
    lanes: int = 8
    registers: int = 16
    prefetch_c: int = 1
    a_in_l1: int = 0

    def __post_init__(self) -> None:
        for name in ("mr", "nr", "kc", "mc", "nc", "unroll_k", "small_m", "small_nc", "pack_rows", "prefetch_rows",
                     "prefetch_min_m", "parallel_min_flops", "small_panels", "lanes", "registers", "prefetch_c", "a_in_l1"):
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
        for name in ("nc", "small_nc"):
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
    """The C fragment: ``#define``s of the schedule (this machine's default when None),
    generated kernels, then the drivers.

    ``prefix`` replaces the ``ss_`` of every function and type name (``ss_gemm`` becomes
    ``<prefix>gemm``) and, upper-cased, the ``SS_`` of every ``SS_GEMM_*`` macro, so that
    several schedules can live in one library (the tuner's dispatcher, shapeshift/tune).
    The default prefix returns the text unchanged, byte for byte, so existing
    callers and their build-cache keys are unaffected.
    """
    text = _source(schedule or _default())
    if prefix == DEFAULT_PREFIX:
        return text
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"gemm prefix {prefix!r} must be a C identifier prefix ending in '_'")
    # Every name the fragment defines starts with ss_gemm / SS_GEMM_ (the prelude's own ss_*
    # names are not used here), so a textual rename is complete.
    return text.replace("ss_gemm", f"{prefix}gemm").replace("SS_GEMM_", f"{prefix.upper()}GEMM_")


def _source(s: GemmSchedule) -> str:
    parts = [
        "/* ---- gemm (shapeshift/codegen/kernels/gemm.py) ---- */",
        f"#define SS_GEMM_MR {s.mr}",
        f"#define SS_GEMM_NR {s.nr}",
        f"#define SS_GEMM_KC {s.kc}",
        f"#define SS_GEMM_MC {s.mc}",
        f"#define SS_GEMM_NC {s.nc}",
        f"#define SS_GEMM_SMALL_M {s.small_m}",
        f"#define SS_GEMM_SMALL_NC {s.small_nc}",
        f"#define SS_GEMM_PACK_ROWS {s.pack_rows}",
        f"#define SS_GEMM_PAR_MIN_FLOPS {float(s.parallel_min_flops)!r}",
        _COMMON,
        "#ifdef __AVX2__",
        *_micro_kernel(s),
        *_in_lanes(s, _edge_kernels),
        *(_small_kernel_avx2(s, m, prefetch) for m, prefetch in _small_kernels(s)),
        *(_small_multi_kernel_avx2(s, m, panels, sets) for m, panels, sets in _small_multi_kernels(s)),
        "#else",
        _MICRO_KERNEL_SCALAR,
        _EDGE_TILE_SCALAR,
        *(_small_kernel_scalar(m, prefetch) for m, prefetch in _small_kernels(s)),
        "#endif",
        _small_dispatch(s),
        _small_span_dispatch(s),
        _DRIVER.replace("@TILE_LOOPS@", _TILE_LOOPS[s.a_in_l1]),
    ]
    return "\n".join(parts) + "\n"


def _micro_kernel(s: GemmSchedule) -> list[str]:
    """The full-tile micro-kernel in vectors of the schedule's ``lanes``: zmm (16) where the
    compiler targets AVX-512, else ymm (a build without AVX-512 of a zmm schedule runs the
    same tile in twice as many ymm vectors: correct, but the tile was not drawn for it).

    On AMD Zen 4 (both widths peak at 112 GFLOPS a core, a zmm FMA issued as two halves)
    the ymm 6 x 16 tile ran at 84-92 GFLOPS on large products, held back by issuing two FMAs
    per row and k step; in zmm it issues one. On a core with two 512-bit FMA ports a zmm
    tile needs ports x latency (8) accumulators at least; codegen/defaults.py draws the
    tile from the target description.
    """
    return _in_lanes(s, _full_tile_kernel)


def _in_lanes(s: GemmSchedule, make: Callable[[GemmSchedule, int], str]) -> list[str]:
    """``make(s, lanes)`` in the schedule's width: a zmm schedule's code under
    ``#ifdef __AVX512F__``, with its ymm form (twice the vectors) for other builds."""
    if s.lanes == 8:
        return [make(s, 8)]
    return ["#ifdef __AVX512F__", make(s, 16), "#else", make(s, 8), "#endif"]


def _full_tile_kernel(s: GemmSchedule, lanes: int) -> str:
    """ss_gemm_ukernel over vectors of ``lanes`` floats (8: ymm, 16: zmm)."""
    vectors = s.nr // lanes
    wide = lanes == 16
    v, mm = _vector_names(lanes)
    acc = _accumulators(s.mr, vectors)
    cells = [(i, j) for i in range(s.mr) for j in range(vectors)]
    row_bias = ("av = _mm512_set1_ps(e->bias[{i} * e->rs_bias]);" if wide
                else "av = _mm256_broadcast_ss(e->bias + {i} * e->rs_bias);")
    out = [
        "/* c (mr x nr, row stride ldc) = (acc ? c : 0) + a_panel * b_panel over kc steps"
        + (" (zmm)." if wide else "."),
        "   a: packed A micro-panel (a[k*MR + i]); b: packed B micro-panel (b[k*NR + j]). */",
        "static inline void ss_gemm_ukernel(int64_t kc, const float* restrict a, const float* restrict b,",
        "                                   float* restrict c, int64_t ldc, int acc, const ss_gemm_epi* e)",
        "{",
        # The tile's lines of c are fetched while the k loop runs: its stores (and loads
        # when acc) otherwise wait on lines that left the caches since the last K block.
        *(f"    _mm_prefetch((const char*)(c + {i} * ldc + {line}), _MM_HINT_T0);"
          for i in range(s.mr) for line in range(0, s.nr, 16) if s.prefetch_c),
        *_tile_loop(s, s.mr, vectors, lanes),
        "    if (acc) {",
        *(f"        {acc[i][j]} = {mm}_add_ps({acc[i][j]}, {mm}_loadu_ps(c + {i} * ldc + {lanes * j}));"
          for i, j in cells),
        "    }",
        "    if (e) {",
        f"        const {v} va = {mm}_set1_ps(e->alpha);",
        *(f"        {acc[i][j]} = {mm}_mul_ps({acc[i][j]}, va);" for i, j in cells),
        "        if (e->bias) {",
        f"            const {v} vb = {mm}_set1_ps(e->beta);",
        "            if (e->bias_cols) {",
        *(f"                {acc[i][j]} = {mm}_fmadd_ps(vb, {mm}_loadu_ps(e->bias + {i} * e->rs_bias + {lanes * j}), "
          f"{acc[i][j]});" for i, j in cells),
        "            } else {",
        *(line for i in range(s.mr) for line in (
            "                " + row_bias.format(i=i),
            *(f"                {acc[i][j]} = {mm}_fmadd_ps(vb, av, {acc[i][j]});" for j in range(vectors)))),
        "            }",
        "        }",
        "        if (e->relu) {",
        f"            const {v} zero = {mm}_setzero_ps();",
        *(f"            {acc[i][j]} = {mm}_max_ps({acc[i][j]}, zero);" for i, j in cells),
        "        }",
        "    }",
        *(f"    {mm}_storeu_ps(c + {i} * ldc + {lanes * j}, {acc[i][j]});" for i, j in cells),
        "}",
    ]
    return "\n".join(out)


def _vector_names(lanes: int) -> tuple[str, str]:
    """(C vector type, intrinsic prefix) for vectors of ``lanes`` floats (8: ymm, 16: zmm)."""
    return ("__m512", "_mm512") if lanes == 16 else ("__m256", "_mm256")


def _accumulators(rows: int, vectors: int) -> list[list[str]]:
    return [[f"c{i}_{v}" for v in range(vectors)] for i in range(rows)]


def _tile_loop(s: GemmSchedule, rows: int, vectors: int, lanes: int = 8) -> list[str]:
    """Declarations and k loop of a rows x (lanes x vectors) tile over packed panels (whose
    strides stay MR and NR), in ymm (lanes 8) or zmm (16) registers: the accumulators end
    up in ``_accumulators(rows, vectors)``.

    The k loop is unrolled by ``#pragma GCC unroll`` rather than by writing out copies:
    GCC interleaves hand-written copies and then spills accumulators (measured: about 25%
    slower at unroll 4), while its own unrolling keeps every copy in order."""
    acc = _accumulators(rows, vectors)
    v, mm = _vector_names(lanes)
    step = [f"        b{j} = {mm}_loadu_ps(b + {lanes * j});" for j in range(vectors)]
    for i in range(rows):
        broadcast = f"_mm512_set1_ps(a[{i}])" if lanes == 16 else f"_mm256_broadcast_ss(a + {i})"
        step.append(f"        av = {broadcast};")
        step += [f"        {acc[i][j]} = {mm}_fmadd_ps(av, b{j}, {acc[i][j]});" for j in range(vectors)]
    return [
        f"    {v} av, " + ", ".join(f"b{j}" for j in range(vectors)) + ";",
        *(f"    {v} {name} = {mm}_setzero_ps();" for row in acc for name in row),
        f"#pragma GCC unroll {s.unroll_k}",
        "    for (int64_t k = 0; k < kc; ++k) {",
        *step,
        f"        a += {s.mr}; b += {s.nr};",
        "    }",
    ]


def _edge_shapes(s: GemmSchedule, lanes: int) -> list[tuple[int, int]]:
    """(rows, vectors) of every edge tile smaller than the full mr x nr one."""
    full = s.nr // lanes
    return [(r, v) for r in range(1, s.mr + 1) for v in range(1, full + 1) if (r, v) != (s.mr, full)]


def _edge_kernels(s: GemmSchedule, lanes: int) -> str:
    """A kernel per edge tile shape, and ``ss_gemm_edge_tile`` choosing among them.

    An edge tile (the last rows of M or columns of N) used to run the full mr x nr kernel
    on zero padding: with nr = 24 and N = 25 that is 48 columns computed for 25. These
    compute only the valid rows and ceil(nv / lanes) vectors, into a local tile of row
    stride NR.
    """
    _, mm = _vector_names(lanes)
    full = s.nr // lanes
    out = []
    for rows, vectors in _edge_shapes(s, lanes):
        acc = _accumulators(rows, vectors)
        out += [
            f"static void ss_gemm_edge_{rows}x{vectors}(int64_t kc, const float* restrict a, const float* restrict b,",
            "                               float* restrict t)",
            "{",
            *_tile_loop(s, rows, vectors, lanes),
            *(f"    {mm}_storeu_ps(t + {i} * SS_GEMM_NR + {lanes * v}, {acc[i][v]});"
              for i in range(rows) for v in range(vectors)),
            "}",
        ]
    cases = [f"    case {rows * (full + 1) + vectors}: ss_gemm_edge_{rows}x{vectors}(kc, a, b, t); break;"
             for rows, vectors in _edge_shapes(s, lanes)]
    out += [
        "/* t (row stride NR) = the mv x nv corner (mv <= MR, nv <= NR) of a_panel * b_panel; the",
        f"   columns past nv up to a multiple of {lanes} hold products of B's zero padding. */",
        "static void ss_gemm_edge_tile(int64_t mv, int64_t nv, int64_t kc, const float* a, const float* b, float* t)",
        "{",
        f"    switch (mv * {full + 1} + (nv + {lanes - 1}) / {lanes}) {{",
        *cases,
        "    default: ss_gemm_ukernel(kc, a, b, t, SS_GEMM_NR, 0, NULL); break;",
        "    }",
        "}",
    ]
    return "\n".join(out)


def _small_shape(s: GemmSchedule, m: int) -> tuple[int, int]:
    """(vectors per pass, accumulator sets) of the m-row B-streaming kernel.

    Vectors per pass: the widest divisor of nr/8 whose accumulators fit; sets: independent
    accumulator copies (alternate k steps) so that at least FMA_CHAINS FMAs are in flight.
    """
    vectors = s.nr // 8
    width = max(w for w in range(1, vectors + 1) if vectors % w == 0 and m * w + w + 1 <= s.registers)
    sets = 1
    while m * width * sets < FMA_CHAINS and m * width * (sets + 1) + width + 1 <= s.registers:
        sets += 1
    return width, sets


def _small_name(rows: int, prefetch: bool) -> str:
    return f"ss_gemm_small_{rows}" + ("_pf" if prefetch else "")


def _small_kernel_avx2(s: GemmSchedule, m: int, prefetch: bool) -> str:
    width, sets = _small_shape(s, m)
    acc = [[[f"c{t}_{i}_{v}" for v in range(width)] for i in range(m)] for t in range(sets)]

    def step(t: int) -> list[str]:
        lines = [f"            b{v} = _mm256_loadu_ps(bp + {t} * ldb + {8 * v});" for v in range(width)]
        # Pin each B vector in a register: otherwise GCC folds the load into every FMA that
        # uses it (m loads per vector instead of one) and the loop becomes load-bound.
        lines += [f'            __asm__("" : "+x"(b{v}));' for v in range(width)]
        if prefetch:
            lines.insert(0, f"            _mm_prefetch((const char*)(bp + ({t} + {s.prefetch_rows}) * ldb), _MM_HINT_T0);")
        for i in range(m):
            lines.append(f"            av = _mm256_broadcast_ss(ap + {i} * rsa + {t} * csa);")
            lines += [f"            {acc[t][i][v]} = _mm256_fmadd_ps(av, b{v}, {acc[t][i][v]});"
                      for v in range(width)]
        return lines

    out = [
        f"/* {m} rows: c (row stride ldc) = (acc ? c : 0) + A(0:{m}, 0:kc) * b, b: kc rows of NR floats",
        "   (row stride ldb); A(i,k) at a[i*rsa + k*csa], read in place. Only the first nv columns",
        f"   are needed: the passes of {8 * width} columns stop once they are covered. */",
        f"static void {_small_name(m, prefetch)}(int64_t kc, const float* restrict a, int64_t rsa, int64_t csa,",
        "                              const float* restrict b, int64_t ldb, float* restrict c, int64_t ldc, int acc,",
        "                              int64_t nv)",
        "{",
        f"    for (int j0 = 0; j0 < nv; j0 += {8 * width}) {{",
        "        __m256 av, " + ", ".join(f"b{v}" for v in range(width)) + ";",
        *(f"        __m256 {name} = _mm256_setzero_ps();" for st in acc for row in st for name in row),
        "        const float* ap = a;",
        "        const float* bp = b + j0;",
        "        int64_t k = 0;",
        f"        for (; k + {sets} <= kc; k += {sets}) {{",
        *(line for t in range(sets) for line in step(t)),
        f"            ap += {sets} * csa; bp += {sets} * ldb;",
        "        }",
        "        for (; k < kc; ++k) {",
        *step(0),
        "            ap += csa; bp += ldb;",
        "        }",
        *(f"        {acc[0][i][v]} = _mm256_add_ps({acc[0][i][v]}, {acc[t][i][v]});"
          for t in range(1, sets) for i in range(m) for v in range(width)),
        "        if (acc) {",
        *(f"            {acc[0][i][v]} = _mm256_add_ps({acc[0][i][v]}, _mm256_loadu_ps(c + {i} * ldc + j0 + {8 * v}));"
          for i in range(m) for v in range(width)),
        "        }",
        *(f"        _mm256_storeu_ps(c + {i} * ldc + j0 + {8 * v}, {acc[0][i][v]});"
          for i in range(m) for v in range(width)),
        "    }",
        "}",
    ]
    return "\n".join(out)


def _small_panels(s: GemmSchedule, m: int, prefetch: bool) -> int:
    """Panels of B the m-row B-streaming kernel reads at once (see ``small_panels``).

    Several panels need full-width passes, m x nr/8 accumulators per panel, the panels' B
    vectors (for m = 1 each is used once, so it is read straight into the FMA) and one
    broadcast in the registers. A prefetching kernel reads one panel: its prefetches
    already run ahead of a single stream.
    """
    if prefetch or _small_shape(s, m)[0] != s.nr // 8:
        return 1
    return max(p for p in range(1, s.small_panels + 1) if p == 1 or _multi_registers(s, m, p, 1) <= s.registers)


def _multi_registers(s: GemmSchedule, m: int, panels: int, sets: int) -> int:
    """ymm registers of the m-row kernel over ``panels`` panels with ``sets`` accumulator
    sets: the accumulators, the panels' B vectors (for m = 1 each is used once and read
    straight into its FMA, so one) and the A broadcast."""
    vectors = s.nr // 8
    return m * vectors * panels * sets + (vectors * panels if m > 1 else 1) + 1


def _small_multi_name(rows: int, panels: int) -> str:
    return f"ss_gemm_small_{rows}_x{panels}"


def _small_multi_sets(s: GemmSchedule, m: int, panels: int) -> int:
    """Accumulator sets (alternate k steps) of the m-row kernel over ``panels`` panels at once."""
    sets = 1
    while (m * (s.nr // 8) * panels * sets < FMA_CHAINS
           and _multi_registers(s, m, panels, sets + 1) <= s.registers):
        sets += 1
    return sets


def _small_multi_kernel_avx2(s: GemmSchedule, m: int, panels: int, sets: int) -> str:
    """The m-row B-streaming kernel over ``panels`` full packed panels at once, panel p at
    b + p * bstep, its columns of c at c + p * cstep: as many read streams as panels.

    The span's panels left over run the same kernel with panels = 1 and the same ``sets``:
    every column is summed in one order, however the columns are split between threads.
    """
    vectors = s.nr // 8
    acc = [[[[f"c{t}_{i}_{p}_{v}" for v in range(vectors)] for p in range(panels)] for i in range(m)]
           for t in range(sets)]
    bv = [[f"b{p}_{v}" for v in range(vectors)] for p in range(panels)]

    def step(t: int) -> list[str]:
        lines = []
        for p in range(panels):
            for v in range(vectors):
                load = f"_mm256_loadu_ps(b + {p} * bstep + k * SS_GEMM_NR + {t * s.nr + 8 * v})"
                if m == 1:  # used once: let the load fold into the FMA
                    lines.append(f"            {acc[t][0][p][v]} = _mm256_fmadd_ps(a0, {load}, {acc[t][0][p][v]});")
                else:
                    lines += [f"            {bv[p][v]} = {load};", f'            __asm__("" : "+x"({bv[p][v]}));']
        if m == 1:
            lines.insert(0, f"            a0 = _mm256_broadcast_ss(a + (k + {t}) * csa);")
            return lines
        for i in range(m):
            lines.append(f"            a0 = _mm256_broadcast_ss(a + {i} * rsa + (k + {t}) * csa);")
            lines += [f"            {acc[t][i][p][v]} = _mm256_fmadd_ps(a0, {bv[p][v]}, {acc[t][i][p][v]});"
                      for p in range(panels) for v in range(vectors)]
        return lines

    out = [
        f"/* {m} rows x {panels} full packed panels (kc x NR each), panel p at b + p*bstep and its",
        "   columns of c at c + p*cstep: c = (acc ? c : 0) + A(0:m, 0:kc) * panel. */",
        f"static void {_small_multi_name(m, panels)}(int64_t kc, const float* restrict a, int64_t rsa, int64_t csa,",
        "                              const float* restrict b, int64_t bstep, float* restrict c, int64_t cstep,",
        "                              int64_t ldc, int acc)",
        "{",
        "    __m256 a0" + "".join(f", {name}" for row in (bv if m > 1 else []) for name in row) + ";",
        *(f"    __m256 {name} = _mm256_setzero_ps();" for st in acc for row in st for panel in row for name in panel),
        "    int64_t k = 0;",
        f"    for (; k + {sets} <= kc; k += {sets}) {{",
        *(line for t in range(sets) for line in step(t)),
        "    }",
        "    for (; k < kc; ++k) {",
        *step(0),
        "    }",
        *(f"    {acc[0][i][p][v]} = _mm256_add_ps({acc[0][i][p][v]}, {acc[t][i][p][v]});"
          for t in range(1, sets) for i in range(m) for p in range(panels) for v in range(vectors)),
        "    if (acc) {",
        *(f"        {acc[0][i][p][v]} = _mm256_add_ps({acc[0][i][p][v]}, "
          f"_mm256_loadu_ps(c + {i} * ldc + {p} * cstep + {8 * v}));"
          for i in range(m) for p in range(panels) for v in range(vectors)),
        "    }",
        *(f"    _mm256_storeu_ps(c + {i} * ldc + {p} * cstep + {8 * v}, {acc[0][i][p][v]});"
          for i in range(m) for p in range(panels) for v in range(vectors)),
        "}",
    ]
    return "\n".join(out)


def _small_multi_kernels(s: GemmSchedule) -> list[tuple[int, int, int]]:
    """(rows, panels, sets) of every several-panel kernel the span dispatch calls, and of
    its one-panel twin for the panels left over."""
    out = set()
    for rows, prefetch in _small_kernels(s):
        panels = _small_panels(s, rows, prefetch)
        if panels > 1:
            sets = _small_multi_sets(s, rows, panels)
            out |= {(rows, panels, sets), (rows, 1, sets)}
    return sorted(out)


def _small_span_dispatch(s: GemmSchedule) -> str:
    """``ss_gemm_small_span``: m rows over consecutive full packed panels, split into as many
    equal parts as the row group's kernel reads panels at once."""
    cases = []
    for m in range(1, s.small_m + 1):
        calls, first = [], 0
        for rows, prefetch in _small_calls(s, m):
            panels = _small_panels(s, rows, prefetch)
            a, c = f"a + {first} * rsa", f"c + {first} * ldc"
            single = (f"for (; j < panels; ++j) {_small_name(rows, prefetch)}(kc, {a}, rsa, csa, b + j * step, "
                      f"SS_GEMM_NR, {c} + j * SS_GEMM_NR, ldc, acc, SS_GEMM_NR);")
            if panels > 1:
                calls.append(f"{{ int64_t j = 0; SS_GEMM_SPAN({_small_multi_name(rows, panels)}, "
                             f"{_small_multi_name(rows, 1)}, {panels}, {a}, {c}); {single} }}")
            else:
                calls.append(f"{{ int64_t j = 0; {single} }}")
            first += rows
        cases.append(f"    case {m}:\n        " + "\n        ".join(calls) + "\n        break;")
    cases = "\n".join(cases)
    return f"""\
#ifdef __AVX2__
/* Every panel: `parts` at a time, one from each equal part, by kernel; the panels left over
   one at a time by kernel1, which sums in the same order. */
#define SS_GEMM_SPAN(kernel, kernel1, parts, a_rows, c_rows) do {{ \\
        const int64_t q = panels / (parts); \\
        for (; j < q; ++j) kernel(kc, a_rows, rsa, csa, b + j * step, q * step, c_rows + j * SS_GEMM_NR, \\
                                  q * SS_GEMM_NR, ldc, acc); \\
        for (j = (parts) * q; j < panels; ++j) kernel1(kc, a_rows, rsa, csa, b + j * step, 0, \\
                                                       c_rows + j * SS_GEMM_NR, 0, ldc, acc); \\
    }} while (0)
#else
#define SS_GEMM_SPAN(kernel, kernel1, parts, a_rows, c_rows) do {{ }} while (0)
#endif

/* m (<= SS_GEMM_SMALL_M) rows x `panels` full panels of a packed B, one after another at
   b (kc x NR floats each), into the columns of c from its first one on. */
static void ss_gemm_small_span(int64_t m, int64_t kc, const float* a, int64_t rsa, int64_t csa,
                               const float* b, int64_t panels, float* c, int64_t ldc, int acc)
{{
    const int64_t step = kc * SS_GEMM_NR;
    switch (m) {{
{cases}
    default: break;
    }}
}}"""


def _small_kernel_scalar(m: int, prefetch: bool) -> str:
    return f"""\
static void {_small_name(m, prefetch)}(int64_t kc, const float* restrict a, int64_t rsa, int64_t csa,
                              const float* restrict b, int64_t ldb, float* restrict c, int64_t ldc, int acc,
                              int64_t nv)
{{
    (void)nv; /* all NR columns: the scalar fallback is not tuned for speed */
    for (int i = 0; i < {m}; ++i) {{
        float t[SS_GEMM_NR];
        for (int j = 0; j < SS_GEMM_NR; ++j) t[j] = acc ? c[i * ldc + j] : 0.0f;
        for (int64_t k = 0; k < kc; ++k) {{
            float x = a[i * rsa + k * csa];
            for (int j = 0; j < SS_GEMM_NR; ++j) t[j] += x * b[k * ldb + j];
        }}
        for (int j = 0; j < SS_GEMM_NR; ++j) c[i * ldc + j] = t[j];
    }}
}}"""


def _small_row_groups(s: GemmSchedule, m: int) -> list[int]:
    """Row counts the m-row B-streaming call is split into.

    A kernel keeps m x width accumulators plus the width B vectors and one broadcast in
    16 registers; past 6 rows (nr = 16) only one B vector per pass fits, so every FMA needs
    its own broadcast load and the loop becomes load-bound (measured: 8 rows ran at about
    half the FMA rate of 6).  Such m are cut into balanced groups that keep full width; each
    group re-reads the same kc x nr panel of B, which is in L1 by then.
    """
    widest = max_rows(s.nr, 8, s.registers)
    if m <= widest or widest < 1:
        return [m]
    count = -(-m // widest)
    return [m // count + (1 if i < m % count else 0) for i in range(count)]


def _small_calls(s: GemmSchedule, m: int) -> list[tuple[int, bool]]:
    """(rows, prefetch) of each kernel call for m rows: only a first group prefetches."""
    prefetch = bool(s.prefetch_rows) and m >= max(1, s.prefetch_min_m)
    return [(rows, prefetch and i == 0) for i, rows in enumerate(_small_row_groups(s, m))]


def _small_kernels(s: GemmSchedule) -> list[tuple[int, bool]]:
    """(rows, prefetch) of every kernel the dispatch calls."""
    return sorted({call for m in range(1, s.small_m + 1) for call in _small_calls(s, m)})


def _small_dispatch(s: GemmSchedule) -> str:
    cases = []
    for m in range(1, s.small_m + 1):
        calls, first = [], 0
        for rows, prefetch in _small_calls(s, m):
            calls.append(f"{_small_name(rows, prefetch)}(kc, a + {first} * rsa, rsa, csa, b, ldb, c + {first} * ldc, ldc, "
                         "acc, nv);")
            first += rows
        cases.append(f"    case {m}: " + " ".join(calls) + " break;")
    cases = "\n".join(cases)
    return f"""\
/* The B-streaming kernel for m rows, 1 <= m <= SS_GEMM_SMALL_M (in row groups that keep
   full vector width, see _small_row_groups), for the first nv (<= NR) columns of the panel. */
static void ss_gemm_small(int64_t m, int64_t kc, const float* a, int64_t rsa, int64_t csa,
                          const float* b, int64_t ldb, float* c, int64_t ldc, int acc, int64_t nv)
{{
    switch (m) {{
{cases}
    default: break;
    }}
}}"""


_MICRO_KERNEL_SCALAR = """\
static inline void ss_gemm_ukernel(int64_t kc, const float* restrict a, const float* restrict b,
                                   float* restrict c, int64_t ldc, int acc, const ss_gemm_epi* e)
{
    float t[SS_GEMM_MR][SS_GEMM_NR] = {{0}};
    for (int64_t k = 0; k < kc; ++k)
        for (int i = 0; i < SS_GEMM_MR; ++i)
            for (int j = 0; j < SS_GEMM_NR; ++j) t[i][j] += a[k * SS_GEMM_MR + i] * b[k * SS_GEMM_NR + j];
    for (int i = 0; i < SS_GEMM_MR; ++i)
        for (int j = 0; j < SS_GEMM_NR; ++j) {
            float v = (acc ? c[i * ldc + j] : 0.0f) + t[i][j];
            if (e) {
                v *= e->alpha;
                if (e->bias) v += e->beta * e->bias[i * e->rs_bias + (e->bias_cols ? j : 0)];
                if (e->relu) v = v > 0.0f ? v : 0.0f;
            }
            c[i * ldc + j] = v;
        }
}"""


_EDGE_TILE_SCALAR = """\
static void ss_gemm_edge_tile(int64_t mv, int64_t nv, int64_t kc, const float* a, const float* b, float* t)
{
    (void)mv; (void)nv;
    ss_gemm_ukernel(kc, a, b, t, SS_GEMM_NR, 0, NULL);
}"""


_COMMON = r"""
static inline int64_t ss_gemm_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t ss_gemm_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t ss_gemm_gcd(int64_t a, int64_t b) { while (b) { int64_t t = a % b; a = b; b = t; } return a; }

/* One call's arguments, passed by pointer to every helper instead of 25 parameters. */
typedef struct {
    int64_t M, N, K, batch0, batch1;
    const float* A; int64_t sa0, sa1, rsa, csa;
    const float* B; int64_t sb0, sb1, rsb, csb;
    const float* packed_b; /* NULL unless B is prepacked */
    float* C; int64_t sc0, sc1, ldc;
    float alpha; const float* bias; float beta; int64_t rs_bias, cs_bias; int act;
} ss_gemm_problem;

/* The epilogue of one full tile, applied in registers before the store: act(alpha * acc +
   beta * bias), bias (NULL: none) at the tile's origin, a row every rs_bias floats, per
   column (bias_cols) or one value per row. */
typedef struct {
    float alpha, beta;
    const float* bias; int64_t rs_bias; int bias_cols;
    int relu;
} ss_gemm_epi;

/* How the call is cut: items = batches x n_chunks x m_chunks, chunk sizes in elements. */
typedef struct {
    int64_t n_chunk, m_chunk, n_chunks, m_chunks, items;
    int small; /* the B-streaming path (M <= SS_GEMM_SMALL_M) */
} ss_gemm_plan;

#ifdef __AVX2__
/* dst[i*ldd + j] = src[j*lds + i] for i < 8, j < rows (0 for rows <= j < 8): rows runs of 8
   floats, transposed. Always stores 8 floats per output row. */
static inline void ss_gemm_transpose8(const float* src, int64_t lds, int rows, float* dst, int64_t ldd)
{
    __m256 r[8], t[8], u[8];
    for (int j = 0; j < 8; ++j) r[j] = j < rows ? _mm256_loadu_ps(src + j * lds) : _mm256_setzero_ps();
    for (int j = 0; j < 8; j += 2) {
        t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int j = 0; j < 8; j += 4) {
        u[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
        u[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
        u[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
        u[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
    }
    /* In row order: with ldd < 8 a row's extra lanes are overwritten by the rows after it. */
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
}
#endif

/* Spare floats after a packed A buffer: the 8x8 transposes store 8 floats per k even when MR < 8. */
#define SS_GEMM_A_SLACK 8

/* Zero-padded MR-row micro-panels of an mc x kc block of A: dst[p*MR*kc + k*MR + i]. */
static void ss_gemm_pack_a(int64_t mc, int64_t kc, const float* a, int64_t rsa, int64_t csa, float* restrict dst)
{
    for (int64_t p = 0; p < mc; p += SS_GEMM_MR) {
        int64_t mv = ss_gemm_min(SS_GEMM_MR, mc - p);
        const float* ap = a + p * rsa;
        if (mv == SS_GEMM_MR && rsa == 1) {
            for (int64_t k = 0; k < kc; ++k)
                for (int i = 0; i < SS_GEMM_MR; ++i) dst[k * SS_GEMM_MR + i] = ap[k * csa + i];
        } else if (mv == SS_GEMM_MR) {
            int64_t k = 0;
#ifdef __AVX2__
            /* Rows of A contiguous: 8 k at a time through transposes of up to 8 rows each. A
               store's lanes past its rows land on the next rows' entries (or the next k's, or
               the slack), so the groups go from the last to the first: every entry is
               written last by the group it belongs to. */
            if (csa == 1)
                for (; k + 8 <= kc; k += 8)
                    for (int g = (SS_GEMM_MR - 1) / 8 * 8; g >= 0; g -= 8)
                        ss_gemm_transpose8(ap + g * rsa + k, rsa, (int)ss_gemm_min(8, SS_GEMM_MR - g),
                                           dst + k * SS_GEMM_MR + g, SS_GEMM_MR);
#endif
            for (; k < kc; ++k)
                for (int i = 0; i < SS_GEMM_MR; ++i) dst[k * SS_GEMM_MR + i] = ap[i * rsa + k * csa];
        } else {
            for (int64_t k = 0; k < kc; ++k)
                for (int i = 0; i < SS_GEMM_MR; ++i) dst[k * SS_GEMM_MR + i] = i < mv ? ap[i * rsa + k * csa] : 0.0f;
        }
        dst += SS_GEMM_MR * kc;
    }
}

/* rows x nv (< NR) floats of B, unit column stride, as rows of an NR-wide panel, zero-padded:
   a masked load reads only the valid columns (nothing past them) and zero-fills the rest. */
static inline void ss_gemm_pack_partial_rows(int64_t rows, int64_t nv, const float* b, int64_t rsb, float* restrict d)
{
#ifdef __AVX2__
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int j0 = 0; j0 < SS_GEMM_NR; j0 += 8) {
        if (j0 >= nv) {
            for (int64_t k = 0; k < rows; ++k) _mm256_storeu_ps(d + k * SS_GEMM_NR + j0, _mm256_setzero_ps());
            continue;
        }
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(nv - j0)), lane);
        for (int64_t k = 0; k < rows; ++k)
            _mm256_storeu_ps(d + k * SS_GEMM_NR + j0, _mm256_maskload_ps(b + k * rsb + j0, mask));
    }
#else
    for (int64_t k = 0; k < rows; ++k)
        for (int j = 0; j < SS_GEMM_NR; ++j) d[k * SS_GEMM_NR + j] = j < nv ? b[k * rsb + j] : 0.0f;
#endif
}

/* Zero-padded NR-column micro-panels of a kc x nc block of B: dst[q*NR*kc + k*NR + j].
   Rows of B contiguous (csb == 1): read SS_GEMM_PACK_ROWS rows across the whole block, then
   the next rows; reading one panel's 64 bytes from every row of the block instead touches
   a new page per row, where no prefetcher helps. */
static void ss_gemm_pack_b_block(int64_t kc, int64_t nc, const float* b, int64_t rsb, int64_t csb, float* restrict dst)
{
    if (csb == 1) {
        /* A few rows at a time: every row is one sequential read stream, and each panel
           gets a contiguous run of stores (all rows at once would put every store of a row
           a panel apart, 4 KB-aliasing the loads). */
        for (int64_t k0 = 0; k0 < kc; k0 += SS_GEMM_PACK_ROWS) {
            const int64_t kn = ss_gemm_min(SS_GEMM_PACK_ROWS, kc - k0);
            float* d = dst + k0 * SS_GEMM_NR;
            int64_t q = 0;
            for (; q + SS_GEMM_NR <= nc; q += SS_GEMM_NR, d += SS_GEMM_NR * kc)
                for (int64_t k = 0; k < kn; ++k)
                    for (int j = 0; j < SS_GEMM_NR; ++j) d[k * SS_GEMM_NR + j] = b[(k0 + k) * rsb + q + j];
            if (q < nc) ss_gemm_pack_partial_rows(kn, nc - q, b + k0 * rsb + q, rsb, d);
        }
        return;
    }
    for (int64_t q = 0; q < nc; q += SS_GEMM_NR) {
        const int64_t nv = ss_gemm_min(SS_GEMM_NR, nc - q);
        const float* bq = b + q * csb;
        if (nv < SS_GEMM_NR) {
            /* A partial panel (small or odd N): zero it whole, then copy the valid columns,
               along k where k is contiguous. A per-element "inside?" test cost more than
               the attention matmuls of short sequences compute. */
            memset(dst, 0, sizeof(float) * (size_t)(kc * SS_GEMM_NR));
            if (rsb == 1) {
                for (int64_t j = 0; j < nv; ++j)
                    for (int64_t k = 0; k < kc; ++k) dst[k * SS_GEMM_NR + j] = bq[j * csb + k];
            } else {
                for (int64_t k = 0; k < kc; ++k)
                    for (int64_t j = 0; j < nv; ++j) dst[k * SS_GEMM_NR + j] = bq[k * rsb + j * csb];
            }
        } else if (rsb == 1) {
            /* B transposed in memory: read each column's k run contiguously. */
            for (int j0 = 0; j0 < SS_GEMM_NR; j0 += 8) {
                int64_t k = 0;
#ifdef __AVX2__
                for (; k + 8 <= kc; k += 8)
                    ss_gemm_transpose8(bq + j0 * csb + k, csb, 8, dst + k * SS_GEMM_NR + j0, SS_GEMM_NR);
#endif
                for (; k < kc; ++k)
                    for (int j = j0; j < j0 + 8; ++j) dst[k * SS_GEMM_NR + j] = bq[j * csb + k];
            }
        } else {
            for (int64_t k = 0; k < kc; ++k)
                for (int j = 0; j < SS_GEMM_NR; ++j) dst[k * SS_GEMM_NR + j] = j < nv ? bq[k * rsb + j * csb] : 0.0f;
        }
        dst += SS_GEMM_NR * kc;
    }
}

/* c (mv x nv at row stride ldc) = act(alpha * c + beta * bias) for the rows m0.. and columns n0.. of C. */
static void ss_gemm_epilogue(float* c, int64_t ldc, int64_t mv, int64_t nv, const ss_gemm_problem* P,
                             int64_t m0, int64_t n0)
{
    const float alpha = P->alpha, beta = P->beta;
    for (int64_t i = 0; i < mv; ++i) {
        float* restrict row = c + i * ldc;
        if (!P->bias) {
            for (int64_t j = 0; j < nv; ++j) row[j] *= alpha;
        } else {
            const float* br = P->bias + (m0 + i) * P->rs_bias + n0 * P->cs_bias;
            if (P->cs_bias == 1) {
                for (int64_t j = 0; j < nv; ++j) row[j] = alpha * row[j] + beta * br[j];
            } else if (P->cs_bias == 0) {
                const float bv = beta * br[0];
                for (int64_t j = 0; j < nv; ++j) row[j] = alpha * row[j] + bv;
            } else {
                for (int64_t j = 0; j < nv; ++j) row[j] = alpha * row[j] + beta * br[j * P->cs_bias];
            }
        }
        if (P->act == 1)
            for (int64_t j = 0; j < nv; ++j) row[j] = row[j] > 0.0f ? row[j] : 0.0f;
    }
}

static inline int ss_gemm_needs_epilogue(const ss_gemm_problem* P)
{
    return P->alpha != 1.0f || P->bias != NULL || P->act != 0;
}

/* Copy (or add, when acc) the mv x nv valid part of a local tile into c. */
static void ss_gemm_store_tile(const float* t, int64_t ldt, float* c, int64_t ldc, int64_t mv, int64_t nv, int acc)
{
    for (int64_t i = 0; i < mv; ++i)
        for (int64_t j = 0; j < nv; ++j) c[i * ldc + j] = (acc ? c[i * ldc + j] : 0.0f) + t[i * ldt + j];
}

static void* ss_gemm_alloc(int64_t floats)
{
    size_t bytes = ((size_t)(floats > 0 ? floats : 1) * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes);
}
"""


# The two loops over an mc x nc block's tiles (ss_gemm_macro), by the schedule's a_in_l1.
_TILE_LOOPS = {
    0: """    /* jr outside ir: one B micro-panel stays in L1 while the A panels stream from L2. */
    for (int64_t jr = 0; jr < nc; jr += SS_GEMM_NR) {
        for (int64_t ir = 0; ir < mc; ir += SS_GEMM_MR) {""",
    1: """    /* ir outside jr: one A micro-panel stays in L1 while the B panels stream from L2. */
    for (int64_t ir = 0; ir < mc; ir += SS_GEMM_MR) {
        for (int64_t jr = 0; jr < nc; jr += SS_GEMM_NR) {""",
}

_DRIVER = r"""
/* Every tile of an mc x nc block: packed A (mc x kc) times packed B (kc x nc) into c. */
static void ss_gemm_macro(int64_t mc, int64_t nc, int64_t kc, const float* pa, const float* pb,
                          float* c, int64_t ldc, int acc, int last, const ss_gemm_problem* P, int64_t m0, int64_t n0)
{
    float tile[SS_GEMM_MR * SS_GEMM_NR];
    const int epilogue = last && ss_gemm_needs_epilogue(P);
    /* Full tiles take the epilogue in registers (no reload of a C tile whose store may still
       be waiting for its cache line), unless the bias has a column stride other than 0 or 1. */
    const int in_kernel = epilogue && (!P->bias || P->cs_bias == 0 || P->cs_bias == 1);
    ss_gemm_epi e = {P->alpha, P->beta, NULL, P->rs_bias, P->cs_bias == 1, P->act == 1};
@TILE_LOOPS@
            const int64_t nv = ss_gemm_min(SS_GEMM_NR, nc - jr);
            const int64_t mv = ss_gemm_min(SS_GEMM_MR, mc - ir);
            float* ct = c + ir * ldc + jr;
            if (mv == SS_GEMM_MR && nv == SS_GEMM_NR) {
                if (in_kernel && P->bias) e.bias = P->bias + (m0 + ir) * P->rs_bias + (n0 + jr) * P->cs_bias;
                ss_gemm_ukernel(kc, pa + ir * kc, pb + jr * kc, ct, ldc, acc, in_kernel ? &e : NULL);
                if (epilogue && !in_kernel) ss_gemm_epilogue(ct, ldc, mv, nv, P, m0 + ir, n0 + jr);
            } else {
                ss_gemm_edge_tile(mv, nv, kc, pa + ir * kc, pb + jr * kc, tile);
                ss_gemm_store_tile(tile, SS_GEMM_NR, ct, ldc, mv, nv, acc);
                if (epilogue) ss_gemm_epilogue(ct, ldc, mv, nv, P, m0 + ir, n0 + jr);
            }
        }
    }
}

/* Rows [m_lo, m_hi) x columns [n_lo, n_hi) of one batch, n_lo a multiple of NR. */
static void ss_gemm_block_item(const ss_gemm_problem* P, const float* A, const float* B, float* C,
                               int64_t m_lo, int64_t m_hi, int64_t n_lo, int64_t n_hi, float* abuf, float* bbuf)
{
    const int64_t K = P->K, padded_n = ss_gemm_cdiv(P->N, SS_GEMM_NR) * SS_GEMM_NR;
    for (int64_t jc = n_lo; jc < n_hi; jc += SS_GEMM_NC) {
        const int64_t nc = ss_gemm_min(SS_GEMM_NC, n_hi - jc);
        for (int64_t pc = 0; pc < K; pc += SS_GEMM_KC) {
            const int64_t kc = ss_gemm_min(SS_GEMM_KC, K - pc);
            const float* pb;
            if (P->packed_b) {
                pb = P->packed_b + pc * padded_n + jc * kc;
            } else {
                ss_gemm_pack_b_block(kc, nc, B + pc * P->rsb + jc * P->csb, P->rsb, P->csb, bbuf);
                pb = bbuf;
            }
            for (int64_t ic = m_lo; ic < m_hi; ic += SS_GEMM_MC) {
                const int64_t mc = ss_gemm_min(SS_GEMM_MC, m_hi - ic);
                ss_gemm_pack_a(mc, kc, A + ic * P->rsa + pc * P->csa, P->rsa, P->csa, abuf);
                ss_gemm_macro(mc, nc, kc, abuf, pb, C + ic * P->ldc + jc, P->ldc, pc > 0, pc + kc >= K, P, ic, jc);
            }
        }
    }
}

/* Plain row-major B (csb == 1), rows [n_lo, n_hi): read in place, SS_GEMM_PACK_ROWS rows at a
   time across all panels, so that every row is one sequential read stream. */
static void ss_gemm_small_rows(const ss_gemm_problem* P, const float* A, const float* B, float* C,
                               int64_t n_lo, int64_t n_hi, float* bbuf, float* edge)
{
    for (int64_t pc = 0; pc < P->K; pc += SS_GEMM_PACK_ROWS) {
        const int64_t kc = ss_gemm_min(SS_GEMM_PACK_ROWS, P->K - pc);
        const float* a = A + pc * P->csa;
        for (int64_t n0 = n_lo; n0 < n_hi; n0 += SS_GEMM_NR) {
            if (n0 + SS_GEMM_NR <= n_hi) {
                ss_gemm_small(P->M, kc, a, P->rsa, P->csa, B + pc * P->rsb + n0, P->rsb, C + n0, P->ldc, pc > 0,
                              SS_GEMM_NR);
            } else {
                ss_gemm_pack_b_block(kc, n_hi - n0, B + pc * P->rsb + n0, P->rsb, 1, bbuf);
                ss_gemm_small(P->M, kc, a, P->rsa, P->csa, bbuf, SS_GEMM_NR, edge, SS_GEMM_NR, pc > 0, n_hi - n0);
            }
        }
    }
}

/* Prepacked B, or B with other strides, packed SS_GEMM_SMALL_NC columns at a time into L2.
   K blocks outside panels, so that prepacked B is read front to back. A prepacked block's
   columns are one span: its panels read at once (small_panels) lie far apart in memory,
   separate streams for the prefetchers. */
static void ss_gemm_small_packed(const ss_gemm_problem* P, const float* A, const float* B, float* C,
                                 int64_t n_lo, int64_t n_hi, float* bbuf, float* edge)
{
    const int64_t K = P->K, padded_n = ss_gemm_cdiv(P->N, SS_GEMM_NR) * SS_GEMM_NR;
    const int64_t group = P->packed_b ? n_hi - n_lo : SS_GEMM_SMALL_NC;
    for (int64_t pc = 0; pc < K; pc += SS_GEMM_KC) {
        const int64_t kc = ss_gemm_min(SS_GEMM_KC, K - pc);
        const float* a = A + pc * P->csa;
        for (int64_t g = n_lo; g < n_hi; g += group) {
            const int64_t g_hi = ss_gemm_min(n_hi, g + group), full = (g_hi - g) / SS_GEMM_NR;
            const float* pb = P->packed_b ? P->packed_b + pc * padded_n + g * kc : bbuf;
            if (!P->packed_b) ss_gemm_pack_b_block(kc, g_hi - g, B + pc * P->rsb + g * P->csb, P->rsb, P->csb, bbuf);
            ss_gemm_small_span(P->M, kc, a, P->rsa, P->csa, pb, full, C + g, P->ldc, pc > 0);
            /* The partial panel by the span's own kernels too (all NR columns, over B's zero
               padding): a column sums in the same order wherever it lies, so equal columns of
               B give equal results (a Softmax over huge, equal logits depends on that). */
            if (g + full * SS_GEMM_NR < g_hi)
                ss_gemm_small_span(P->M, kc, a, P->rsa, P->csa, pb + full * SS_GEMM_NR * kc, 1, edge, SS_GEMM_NR,
                                   pc > 0);
        }
    }
}

/* Whether the B-streaming path reads B in place: a plain row-major B with at least one full
   panel. When all of B is one partial panel it is packed anyway, and packing it whole K
   blocks at a time beats PACK_ROWS rows per pack and kernel call (12 heads of T = 1 took
   about 2.8 us, nearly all call overhead). */
static inline int ss_gemm_small_in_place(const ss_gemm_problem* P)
{
    return !P->packed_b && P->csb == 1 && P->N >= SS_GEMM_NR;
}

/* All M (<= SS_GEMM_SMALL_M) rows x columns [n_lo, n_hi) of one batch: B is read once, A in
   place (no packing: at this M the time goes into reading B). */
static void ss_gemm_small_item(const ss_gemm_problem* P, const float* A, const float* B, float* C,
                               int64_t n_lo, int64_t n_hi, float* bbuf)
{
    /* The one partial panel (the last of N) accumulates here across K blocks. */
    float edge[(SS_GEMM_SMALL_M > 0 ? SS_GEMM_SMALL_M : 1) * SS_GEMM_NR];
    if (ss_gemm_small_in_place(P)) ss_gemm_small_rows(P, A, B, C, n_lo, n_hi, bbuf, edge);
    else ss_gemm_small_packed(P, A, B, C, n_lo, n_hi, bbuf, edge);
    const int64_t n_edge = (n_hi - n_lo) % SS_GEMM_NR;
    if (n_edge) ss_gemm_store_tile(edge, SS_GEMM_NR, C + n_hi - n_edge, P->ldc, P->M, n_edge, 0);
    if (ss_gemm_needs_epilogue(P)) ss_gemm_epilogue(C + n_lo, P->ldc, P->M, n_hi - n_lo, P, 0, n_lo);
}

/* Items [lo, hi) of the plan; scratch is allocated once here, per thread. */
static void ss_gemm_items(const ss_gemm_problem* P, const ss_gemm_plan* plan, int64_t lo, int64_t hi)
{
    const int64_t kc = ss_gemm_min(SS_GEMM_KC, P->K);
    /* The in-place B-streaming path packs only a partial last panel, PACK_ROWS rows at a time. */
    const int rows_in_place = plan->small && ss_gemm_small_in_place(P);
    const int need_b = !P->packed_b && (!rows_in_place || P->N % SS_GEMM_NR != 0);
    const int64_t b_floats = rows_in_place ? SS_GEMM_PACK_ROWS * SS_GEMM_NR
                           : kc * ss_gemm_min(plan->small ? SS_GEMM_SMALL_NC : SS_GEMM_NC, plan->n_chunk);
    const int64_t a_floats = plan->small ? 0 : kc * ss_gemm_min(SS_GEMM_MC, ss_gemm_cdiv(plan->m_chunk, SS_GEMM_MR) * SS_GEMM_MR);
    float* abuf = a_floats ? (float*)ss_gemm_alloc(a_floats + SS_GEMM_A_SLACK) : NULL;
    float* bbuf = need_b ? (float*)ss_gemm_alloc(b_floats) : NULL;
    if ((a_floats && !abuf) || (need_b && !bbuf)) {
        /* Out of memory: nothing sensible to compute with; leave C as it is. */
        free(abuf); free(bbuf);
        return;
    }
    const int64_t per_batch = plan->n_chunks * plan->m_chunks;
    for (int64_t it = lo; it < hi; ++it) {
        const int64_t b = it / per_batch, r = it % per_batch;
        const int64_t i0 = b / P->batch1, i1 = b % P->batch1;
        const int64_t n_lo = (r / plan->m_chunks) * plan->n_chunk, m_lo = (r % plan->m_chunks) * plan->m_chunk;
        const int64_t n_hi = ss_gemm_min(P->N, n_lo + plan->n_chunk), m_hi = ss_gemm_min(P->M, m_lo + plan->m_chunk);
        const float* A = P->A + i0 * P->sa0 + i1 * P->sa1;
        const float* B = P->B ? P->B + i0 * P->sb0 + i1 * P->sb1 : NULL;
        float* C = P->C + i0 * P->sc0 + i1 * P->sc1;
        if (plan->small) ss_gemm_small_item(P, A, B, C, n_lo, n_hi, bbuf);
        else ss_gemm_block_item(P, A, B, C, m_lo, m_hi, n_lo, n_hi, abuf, bbuf);
    }
    free(abuf);
    free(bbuf);
}

/* Cut the call so that the item count is a multiple of the thread count where the batch
   alone does not give each thread several items: split N (each thread reads its own part
   of B), and M only where N has too few panels. */
static ss_gemm_plan ss_gemm_make_plan(const ss_gemm_problem* P, int64_t threads)
{
    ss_gemm_plan plan;
    const int64_t batches = P->batch0 * P->batch1;
    const int64_t n_panels = ss_gemm_cdiv(P->N, SS_GEMM_NR), m_panels = ss_gemm_cdiv(P->M, SS_GEMM_MR);
    int64_t n_split = 1, m_split = 1;
    plan.small = P->M <= SS_GEMM_SMALL_M;
    if (threads > 1 && batches < 8 * threads) {
        const int64_t need = threads / ss_gemm_gcd(batches, threads);
        n_split = ss_gemm_min(need, n_panels);
        if (n_split < need && !plan.small) m_split = ss_gemm_min(ss_gemm_cdiv(need, n_split), m_panels);
    }
    plan.n_chunk = ss_gemm_cdiv(n_panels, n_split) * SS_GEMM_NR;
    plan.m_chunk = ss_gemm_cdiv(m_panels, m_split) * SS_GEMM_MR;
    plan.n_chunks = ss_gemm_cdiv(P->N, plan.n_chunk);
    plan.m_chunks = ss_gemm_cdiv(P->M, plan.m_chunk);
    plan.items = batches * plan.n_chunks * plan.m_chunks;
    return plan;
}

/* K == 0: C = act(beta * bias), or 0. */
static void ss_gemm_no_k(const ss_gemm_problem* P)
{
    for (int64_t i0 = 0; i0 < P->batch0; ++i0)
        for (int64_t i1 = 0; i1 < P->batch1; ++i1) {
            float* C = P->C + i0 * P->sc0 + i1 * P->sc1;
            for (int64_t m = 0; m < P->M; ++m) memset(C + m * P->ldc, 0, (size_t)P->N * sizeof(float));
            ss_gemm_epilogue(C, P->ldc, P->M, P->N, P, 0, 0);
        }
}

static void ss_gemm_run(const ss_gemm_problem* P)
{
    if (P->M <= 0 || P->N <= 0 || P->batch0 <= 0 || P->batch1 <= 0) return;
    if (P->K <= 0) { ss_gemm_no_k(P); return; }
    const double flops = 2.0 * (double)P->M * (double)P->N * (double)P->K * (double)(P->batch0 * P->batch1);
    const int64_t threads = flops >= SS_GEMM_PAR_MIN_FLOPS ? omp_get_max_threads() : 1;
    const ss_gemm_plan plan = ss_gemm_make_plan(P, threads);
    const int64_t parts = ss_gemm_min(threads, plan.items);
    if (parts <= 1) {
        /* Not even an inactive OpenMP region: entering one costs about as much as a small call. */
        ss_gemm_items(P, &plan, 0, plan.items);
        return;
    }
    #pragma omp parallel for schedule(static) num_threads(parts)
    for (int64_t t = 0; t < parts; ++t)
        ss_gemm_items(P, &plan, plan.items * t / parts, plan.items * (t + 1) / parts);
}

void ss_gemm(int64_t M, int64_t N, int64_t K, int64_t batch0, int64_t batch1,
             const float* A, int64_t sa0, int64_t sa1, int64_t rsa, int64_t csa,
             const float* B, int64_t sb0, int64_t sb1, int64_t rsb, int64_t csb,
             float* C, int64_t sc0, int64_t sc1, int64_t ldc,
             float alpha, const float* bias, float beta, int64_t rs_bias, int64_t cs_bias, int act)
{
    const ss_gemm_problem P = {M, N, K, batch0, batch1, A, sa0, sa1, rsa, csa, B, sb0, sb1, rsb, csb, NULL,
                               C, sc0, sc1, ldc, alpha, bias, beta, rs_bias, cs_bias, act};
    ss_gemm_run(&P);
}

int64_t ss_gemm_packed_b_size(int64_t K, int64_t N)
{
    if (K <= 0 || N <= 0) return 0;
    return K * ss_gemm_cdiv(N, SS_GEMM_NR) * SS_GEMM_NR;
}

void ss_gemm_pack_b(int64_t K, int64_t N, const float* B, int64_t rsb, int64_t csb, float* packed)
{
    if (K <= 0 || N <= 0) return;
    const int64_t padded_n = ss_gemm_cdiv(N, SS_GEMM_NR) * SS_GEMM_NR;
    for (int64_t pc = 0; pc < K; pc += SS_GEMM_KC)
        ss_gemm_pack_b_block(ss_gemm_min(SS_GEMM_KC, K - pc), N, B + pc * rsb, rsb, csb, packed + pc * padded_n);
}

void ss_gemm_prepacked(int64_t M, int64_t N, int64_t K, int64_t batch0, int64_t batch1,
                       const float* A, int64_t sa0, int64_t sa1, int64_t rsa, int64_t csa,
                       const float* packed_b,
                       float* C, int64_t sc0, int64_t sc1, int64_t ldc,
                       float alpha, const float* bias, float beta, int64_t rs_bias, int64_t cs_bias, int act)
{
    const ss_gemm_problem P = {M, N, K, batch0, batch1, A, sa0, sa1, rsa, csa, NULL, 0, 0, 0, 0, packed_b,
                               C, sc0, sc1, ldc, alpha, bias, beta, rs_bias, cs_bias, act};
    ss_gemm_run(&P);
}
"""
