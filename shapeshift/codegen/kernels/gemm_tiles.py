"""The GEMM fragment's generated register-tile kernels (kernels/gemm.py), written with the C
writer (codegen/cwriter.py): the full mr x nr micro-kernel and its edge tiles in the
schedule's width, the B-streaming kernels of the small-M path and their dispatchers.

Not a fragment of its own: gemm.py assembles these with its driver (gemm_driver.py).
"""

from __future__ import annotations

from typing import Callable, Optional

from ..cwriter import CWriter, Function
from .gemm import FMA_CHAINS, GemmSchedule, max_rows

# Every kernel here is private to the GEMM object: units call the drivers' entry points.
TILE_PARAMS = ("int64_t kc", "const float* restrict a", "const float* restrict b", "float* restrict c",
               "int64_t ldc", "int acc", "const ss_gemm_epi* e")


def vector_names(lanes: int) -> tuple[str, str]:
    """(C vector type, intrinsic prefix) for vectors of ``lanes`` floats (8: ymm, 16: zmm)."""
    return ("__m512", "_mm512") if lanes == 16 else ("__m256", "_mm256")


def accumulators(rows: int, vectors: int) -> list[list[str]]:
    return [[f"c{i}_{v}" for v in range(vectors)] for i in range(rows)]


def in_lanes(s: GemmSchedule, make: Callable[[GemmSchedule, int], str]) -> str:
    """``make(s, lanes)`` in the schedule's width: a zmm schedule's code under
    ``#ifdef __AVX512F__``, with its ymm form (twice the vectors) for other builds."""
    if s.lanes == 8:
        return make(s, 8)
    w = CWriter()
    with w.guard("__AVX512F__"):
        w.raw(make(s, 16))
        w.orelse()
        w.raw(make(s, 8))
    return w.text()


def tile_loop(w: CWriter, s: GemmSchedule, rows: int, vectors: int, lanes: int = 8, panels: int = 1) -> None:
    """Declarations and k loop of a rows x (lanes x vectors) tile over packed panels (whose
    strides stay MR and NR), in ymm (lanes 8) or zmm (16) registers: the accumulators end
    up in ``accumulators(rows, vectors)``. ``panels`` > 1: the vectors span that many
    consecutive B panels (kc x NR floats each, vectors / panels from each), vector v the
    (v % per)-th of panel v // per.

    The k loop is unrolled by ``#pragma GCC unroll`` rather than by writing out copies:
    GCC interleaves hand-written copies and then spills accumulators (measured: about 25%
    slower at unroll 4), while its own unrolling keeps every copy in order."""
    acc = accumulators(rows, vectors)
    v, mm = vector_names(lanes)
    per = vectors // panels
    if panels > 1:
        w.lines(f"const float* restrict b_{p} = b + {p} * kc * {s.nr};" for p in range(panels))
    source = (lambda j: f"b + {lanes * j}") if panels == 1 else (lambda j: f"b_{j // per} + {lanes * (j % per)}")
    w.line(f"{v} av, " + ", ".join(f"b{j}" for j in range(vectors)) + ";")
    w.lines(f"{v} {name} = {mm}_setzero_ps();" for row in acc for name in row)
    w.raw(f"#pragma GCC unroll {s.unroll_k}")
    with w.block("for (int64_t k = 0; k < kc; ++k)"):
        w.lines(f"b{j} = {mm}_loadu_ps({source(j)});" for j in range(vectors))
        for i in range(rows):
            w.line(f"av = _mm512_set1_ps(a[{i}]);" if lanes == 16 else f"av = _mm256_broadcast_ss(a + {i});")
            w.lines(f"{acc[i][j]} = {mm}_fmadd_ps(av, b{j}, {acc[i][j]});" for j in range(vectors))
        pointers = ["b"] if panels == 1 else [f"b_{p}" for p in range(panels)]
        w.line(f"a += {s.mr}; " + " ".join(f"{name} += {s.nr};" for name in pointers))


def full_tile_kernel(s: GemmSchedule, lanes: int) -> str:
    """ss_gemm_ukernel over vectors of ``lanes`` floats (8: ymm, 16: zmm)."""
    vectors = s.nr // lanes
    wide = lanes == 16
    v, mm = vector_names(lanes)
    acc = accumulators(s.mr, vectors)
    cells = [(i, j) for i in range(s.mr) for j in range(vectors)]
    w = CWriter(level=1)
    if s.prefetch_c:
        # The tile's lines of c are fetched while the k loop runs: its stores (and loads
        # when acc) otherwise wait on lines that left the caches since the last K block.
        w.lines(f"_mm_prefetch((const char*)(c + {i} * ldc + {line}), _MM_HINT_T0);"
                for i in range(s.mr) for line in range(0, s.nr, 16))
        # The addend's lines (a conv's residual, rows a plane apart, from L3 or DRAM) of the
        # tile after this one in the block's tile order: they arrive while this tile's k loop
        # runs. Without it a 64->256 1x1 conv on 56x56 with its residual took 1.42-1.91 ms
        # against 1.07 for the conv alone, with it 1.17-1.55 (1 thread, AMD Zen 4, noisy).
        with w.block("if (e && e->add)"):
            ahead = "ldc * SS_GEMM_MR" if s.a_in_l1 == 0 else "SS_GEMM_NR"
            w.lines(f"_mm_prefetch((const char*)(e->add + {ahead} + {i} * ldc + {line}), _MM_HINT_T0);"
                    for i in range(s.mr) for line in range(0, s.nr, 16))
    tile_loop(w, s, s.mr, vectors, lanes)
    with w.block("if (acc)"):
        w.lines(f"{acc[i][j]} = {mm}_add_ps({acc[i][j]}, {mm}_loadu_ps(c + {i} * ldc + {lanes * j}));"
                for i, j in cells)
    with w.block("if (e)"):
        w.line(f"const {v} va = {mm}_set1_ps(e->alpha);")
        w.lines(f"{acc[i][j]} = {mm}_mul_ps({acc[i][j]}, va);" for i, j in cells)
        with w.block("if (e->bias)"):
            w.line(f"const {v} vb = {mm}_set1_ps(e->beta);")
            with w.block("if (e->bias_cols)"):
                w.lines(f"{acc[i][j]} = {mm}_fmadd_ps(vb, {mm}_loadu_ps(e->bias + {i} * e->rs_bias + {lanes * j}), "
                        f"{acc[i][j]});" for i, j in cells)
            with w.block("else"):
                for i in range(s.mr):
                    w.line(f"av = _mm512_set1_ps(e->bias[{i} * e->rs_bias]);" if wide
                           else f"av = _mm256_broadcast_ss(e->bias + {i} * e->rs_bias);")
                    w.lines(f"{acc[i][j]} = {mm}_fmadd_ps(vb, av, {acc[i][j]});" for j in range(vectors))
        with w.block("if (e->add)"):
            # The addend (a conv's residual) laid out as c: read while the tile is in registers.
            w.lines(f"{acc[i][j]} = {mm}_add_ps({acc[i][j]}, {mm}_loadu_ps(e->add + {i} * ldc + {lanes * j}));"
                    for i, j in cells)
        with w.block("if (e->relu)"):
            w.line(f"const {v} zero = {mm}_setzero_ps();")
            # max_ps returns its second operand where either is NaN: NaN stays NaN, as in ONNX's Relu.
            w.lines(f"{acc[i][j]} = {mm}_max_ps(zero, {acc[i][j]});" for i, j in cells)
    w.lines(f"{mm}_storeu_ps(c + {i} * ldc + {lanes * j}, {acc[i][j]});" for i, j in cells)
    return Function("void", "ss_gemm_ukernel", TILE_PARAMS, w.text(), linkage="inline",
                    comment=f"c (mr x nr, row stride ldc) = (acc ? c : 0) + a_panel * b_panel over kc steps"
                            f"{' (zmm)' if wide else ''}. a: packed A micro-panel (a[k*MR + i]); b: packed B "
                            "micro-panel (b[k*NR + j]).").definition()


def edge_shapes(s: GemmSchedule, lanes: int) -> list[tuple[int, int]]:
    """(rows, vectors) of every edge tile smaller than the full mr x nr one."""
    full = s.nr // lanes
    return [(r, v) for r in range(1, s.mr + 1) for v in range(1, full + 1) if (r, v) != (s.mr, full)]


def edge_kernels(s: GemmSchedule, lanes: int) -> str:
    """A kernel per edge tile shape, and ``ss_gemm_edge_tile`` choosing among them.

    An edge tile (the last rows of M or columns of N) used to run the full mr x nr kernel
    on zero padding: with nr = 24 and N = 25 that is 48 columns computed for 25. These
    compute only the valid rows and ceil(nv / lanes) vectors, into a local tile of row
    stride NR.
    """
    _, mm = vector_names(lanes)
    full = s.nr // lanes
    out = []
    for rows, vectors in edge_shapes(s, lanes):
        acc = accumulators(rows, vectors)
        w = CWriter(level=1)
        tile_loop(w, s, rows, vectors, lanes)
        w.lines(f"{mm}_storeu_ps(t + {i} * SS_GEMM_NR + {lanes * v}, {acc[i][v]});"
                for i in range(rows) for v in range(vectors))
        out.append(Function("void", f"ss_gemm_edge_{rows}x{vectors}", ("int64_t kc", "const float* restrict a",
                            "const float* restrict b", "float* restrict t"), w.text(), linkage="static").definition())
    w = CWriter(level=1)
    with w.block(f"switch (mv * {full + 1} + (nv + {lanes - 1}) / {lanes})"):
        w.lines(f"case {rows * (full + 1) + vectors}: ss_gemm_edge_{rows}x{vectors}(kc, a, b, t); break;"
                for rows, vectors in edge_shapes(s, lanes))
        w.line("default: ss_gemm_ukernel(kc, a, b, t, SS_GEMM_NR, 0, NULL); break;")
    out.append(Function("void", "ss_gemm_edge_tile", ("int64_t mv", "int64_t nv", "int64_t kc", "const float* a",
                                                      "const float* b", "float* t"), w.text(), linkage="static",
                        comment=f"t (row stride NR) = the mv x nv corner (mv <= MR, nv <= NR) of a_panel * b_panel; "
                                f"the columns past nv up to a multiple of {lanes} hold products of B's zero "
                                "padding.").definition())
    return "".join(out)


#: The most panels of B one edge-rows kernel covers (ss_gemm_macro's buffer holds them).
MAX_EDGE_GROUP = 8


def edge_group(s: GemmSchedule, rows: int, lanes: int) -> int:
    """Panels of B the kernel of the last ``rows`` rows of M (fewer than mr) covers at once:
    enough that FMA_CHAINS accumulators are independent, as the registers allow. Panel by
    panel, the last 2 rows of 6-row zmm tiles were 2 FMA chains, each FMA waiting on the one
    before: the tile took two thirds of a full one's time, and a 768 x 768 product ran as
    long at M = 31..36 (388 us, 97 GFLOPS at M = 32; AMD Zen 4, 1 thread)."""
    full = s.nr // lanes
    group = 1
    while (rows * full * group < FMA_CHAINS and group < MAX_EDGE_GROUP
           and (rows + 1) * full * (group + 1) + 1 <= s.registers):
        group += 1
    return group


def edge_rows_kernels(s: GemmSchedule, lanes: int) -> str:
    """``ss_gemm_edge_group(mv)``, the panels edge_group gives mv rows, and
    ``ss_gemm_edge_rows(mv, kc, a, b, t)``: t (row stride group x NR) = the mv x (group x NR)
    product of the packed A micro-panel a and the group's consecutive packed B panels from b
    (kc x NR floats each). Every accumulator sums its k steps in order from zero, as the full
    and edge tiles do: equal rows of A give equal rows of C wherever they fall."""
    _, mm = vector_names(lanes)
    full = s.nr // lanes
    groups = {rows: edge_group(s, rows, lanes) for rows in range(1, s.mr)}
    out = []
    for rows, group in groups.items():
        if group == 1:
            continue
        # The group's vectors in a row are consecutive in t: vector v at v * lanes (panel
        # v // full at its multiple of NR).
        acc = accumulators(rows, group * full)
        w = CWriter(level=1)
        tile_loop(w, s, rows, group * full, lanes, panels=group)
        w.lines(f"{mm}_storeu_ps(t + {i * group * s.nr + lanes * j}, {acc[i][j]});"
                for i in range(rows) for j in range(group * full))
        out.append(Function("void", f"ss_gemm_edge_rows_{rows}", ("int64_t kc", "const float* restrict a",
                            "const float* restrict b", "float* restrict t"), w.text(), linkage="static").definition())
    w = CWriter(level=1)
    with w.block("switch (mv)"):
        w.lines(f"case {rows}: return {group};" for rows, group in groups.items() if group > 1)
        w.line("default: return 1;")
    out.append(Function("int64_t", "ss_gemm_edge_group", ("int64_t mv",), w.text(), linkage="static").definition())
    w = CWriter(level=1)
    with w.block("switch (mv)"):
        w.lines(f"case {rows}: ss_gemm_edge_rows_{rows}(kc, a, b, t); break;"
                for rows, group in groups.items() if group > 1)
        w.line("default: (void)kc; (void)a; (void)b; (void)t; break;")
    out.append(Function("void", "ss_gemm_edge_rows", ("int64_t mv", "int64_t kc", "const float* a", "const float* b",
                                                      "float* t"), w.text(), linkage="static").definition())
    return "".join(out)


# ---- the B-streaming path (M <= small_m) ----------------------------------------------
#
# Every function below takes the vector width it is drawn for (``lanes``: 8, ymm; 16, zmm),
# the schedule's own by default: a zmm schedule's path is drawn twice, in zmm for AVX-512
# builds and in ymm for the others (``small_path`` under ``in_lanes``). It ran in ymm on
# every target until the zmm form: on a core with two full-rate 512-bit FMA pipes that held
# M <= 8 to half the peak (768x768 at M = 8: 118 GFLOPS, 47% of the zmm peak, 93% of ymm's).


def _lanes(s: GemmSchedule, lanes: Optional[int]) -> int:
    return lanes or s.lanes


def small_shape(s: GemmSchedule, m: int, lanes: Optional[int] = None) -> tuple[int, int]:
    """(vectors per pass, accumulator sets) of the m-row B-streaming kernel.

    Vectors per pass: the widest divisor of nr/lanes whose accumulators fit; sets: independent
    accumulator copies (alternate k steps) so that at least FMA_CHAINS FMAs are in flight.
    """
    vectors = s.nr // _lanes(s, lanes)
    width = max(w for w in range(1, vectors + 1) if vectors % w == 0 and m * w + w + 1 <= s.registers)
    sets = 1
    while m * width * sets < FMA_CHAINS and m * width * (sets + 1) + width + 1 <= s.registers:
        sets += 1
    return width, sets


def small_name(rows: int, prefetch: bool) -> str:
    return f"ss_gemm_small_{rows}" + ("_pf" if prefetch else "")


SMALL_PARAMS = ("int64_t kc", "const float* restrict a", "int64_t rsa", "int64_t csa", "const float* restrict b",
                "int64_t ldb", "float* restrict c", "int64_t ldc", "int acc", "int64_t nv")


def _broadcast(lanes: int, address: str) -> str:
    """A float at ``address`` in every lane (zmm: a broadcast GCC folds into the FMA's load)."""
    return f"_mm512_set1_ps(*({address}))" if lanes == 16 else f"_mm256_broadcast_ss({address})"


def small_kernel_avx2(s: GemmSchedule, m: int, prefetch: bool, lanes: Optional[int] = None) -> str:
    lanes = _lanes(s, lanes)
    v_type, mm = vector_names(lanes)
    width, sets = small_shape(s, m, lanes)
    acc = [[[f"c{t}_{i}_{v}" for v in range(width)] for i in range(m)] for t in range(sets)]

    def step(w: CWriter, t: int) -> None:
        if prefetch:
            w.line(f"_mm_prefetch((const char*)(bp + ({t} + {s.prefetch_rows}) * ldb), _MM_HINT_T0);")
        w.lines(f"b{v} = {mm}_loadu_ps(bp + {t} * ldb + {lanes * v});" for v in range(width))
        # Pin each B vector in a register: otherwise GCC folds the load into every FMA that
        # uses it (m loads per vector instead of one) and the loop becomes load-bound.
        w.lines(f'__asm__("" : "+v"(b{v}));' for v in range(width))
        for i in range(m):
            w.line(f"av = {_broadcast(lanes, f'ap + {i} * rsa + {t} * csa')};")
            w.lines(f"{acc[t][i][v]} = {mm}_fmadd_ps(av, b{v}, {acc[t][i][v]});" for v in range(width))

    w = CWriter(level=1)
    with w.block(f"for (int j0 = 0; j0 < nv; j0 += {lanes * width})"):
        w.line(f"{v_type} av, " + ", ".join(f"b{v}" for v in range(width)) + ";")
        w.lines(f"{v_type} {name} = {mm}_setzero_ps();" for st in acc for row in st for name in row)
        w.line("const float* ap = a;", "const float* bp = b + j0;", "int64_t k = 0;")
        with w.block(f"for (; k + {sets} <= kc; k += {sets})"):
            for t in range(sets):
                step(w, t)
            w.line(f"ap += {sets} * csa; bp += {sets} * ldb;")
        with w.block("for (; k < kc; ++k)"):
            step(w, 0)
            w.line("ap += csa; bp += ldb;")
        w.lines(f"{acc[0][i][v]} = {mm}_add_ps({acc[0][i][v]}, {acc[t][i][v]});"
                for t in range(1, sets) for i in range(m) for v in range(width))
        with w.block("if (acc)"):
            w.lines(f"{acc[0][i][v]} = {mm}_add_ps({acc[0][i][v]}, {mm}_loadu_ps(c + {i} * ldc + j0 + {lanes * v}));"
                    for i in range(m) for v in range(width))
        w.lines(f"{mm}_storeu_ps(c + {i} * ldc + j0 + {lanes * v}, {acc[0][i][v]});" for i in range(m) for v in range(width))
    return Function("void", small_name(m, prefetch), SMALL_PARAMS, w.text(), linkage="static",
                    comment=f"{m} rows: c (row stride ldc) = (acc ? c : 0) + A(0:{m}, 0:kc) * b, b: kc rows of NR "
                            "floats (row stride ldb); A(i,k) at a[i*rsa + k*csa], read in place. Only the first nv "
                            f"columns are needed: the passes of {lanes * width} columns stop once they are covered."
                    ).definition()


def small_panels(s: GemmSchedule, m: int, prefetch: bool, lanes: Optional[int] = None) -> int:
    """Panels of B the m-row B-streaming kernel reads at once (see ``small_panels``).

    Several panels need full-width passes, m x nr/lanes accumulators per panel, the panels' B
    vectors (for m = 1 each is used once, so it is read straight into the FMA) and one
    broadcast in the registers. A prefetching kernel reads one panel: its prefetches
    already run ahead of a single stream.
    """
    lanes = _lanes(s, lanes)
    if prefetch or small_shape(s, m, lanes)[0] != s.nr // lanes:
        return 1
    return max(p for p in range(1, s.small_panels + 1)
               if p == 1 or multi_registers(s, m, p, 1, lanes) <= s.registers)


def multi_registers(s: GemmSchedule, m: int, panels: int, sets: int, lanes: Optional[int] = None) -> int:
    """Vector registers of the m-row kernel over ``panels`` panels with ``sets`` accumulator
    sets: the accumulators, the panels' B vectors (for m = 1 each is used once and read
    straight into its FMA, so one) and the A broadcast."""
    vectors = s.nr // _lanes(s, lanes)
    return m * vectors * panels * sets + (vectors * panels if m > 1 else 1) + 1


def small_multi_name(rows: int, panels: int) -> str:
    return f"ss_gemm_small_{rows}_x{panels}"


def small_multi_sets(s: GemmSchedule, m: int, panels: int, lanes: Optional[int] = None) -> int:
    """Accumulator sets (alternate k steps) of the m-row kernel over ``panels`` panels at once."""
    lanes = _lanes(s, lanes)
    sets = 1
    while (m * (s.nr // lanes) * panels * sets < FMA_CHAINS
           and multi_registers(s, m, panels, sets + 1, lanes) <= s.registers):
        sets += 1
    return sets


def small_multi_kernel_avx2(s: GemmSchedule, m: int, panels: int, sets: int, lanes: Optional[int] = None) -> str:
    """The m-row B-streaming kernel over ``panels`` full packed panels at once, panel p at
    b + p * bstep, its columns of c at c + p * cstep: as many read streams as panels.

    The span's panels left over run the same kernel with panels = 1 and the same ``sets``:
    every column is summed in one order, however the columns are split between threads.
    """
    lanes = _lanes(s, lanes)
    v_type, mm = vector_names(lanes)
    vectors = s.nr // lanes
    acc = [[[[f"c{t}_{i}_{p}_{v}" for v in range(vectors)] for p in range(panels)] for i in range(m)]
           for t in range(sets)]
    bv = [[f"b{p}_{v}" for v in range(vectors)] for p in range(panels)]
    cells = [(p, v) for p in range(panels) for v in range(vectors)]

    def step(w: CWriter, t: int) -> None:
        if m == 1:  # each B vector is used once: let its load fold into the FMA
            w.line(f"a0 = {_broadcast(lanes, f'a + (k + {t}) * csa')};")
            w.lines(f"{acc[t][0][p][v]} = {mm}_fmadd_ps(a0, {mm}_loadu_ps(b + {p} * bstep + k * SS_GEMM_NR + "
                    f"{t * s.nr + lanes * v}), {acc[t][0][p][v]});" for p, v in cells)
            return
        for p, v in cells:
            w.line(f"{bv[p][v]} = {mm}_loadu_ps(b + {p} * bstep + k * SS_GEMM_NR + {t * s.nr + lanes * v});",
                   f'__asm__("" : "+v"({bv[p][v]}));')
        for i in range(m):
            w.line(f"a0 = {_broadcast(lanes, f'a + {i} * rsa + (k + {t}) * csa')};")
            w.lines(f"{acc[t][i][p][v]} = {mm}_fmadd_ps(a0, {bv[p][v]}, {acc[t][i][p][v]});" for p, v in cells)

    w = CWriter(level=1)
    w.line(f"{v_type} a0" + "".join(f", {name}" for row in (bv if m > 1 else []) for name in row) + ";")
    w.lines(f"{v_type} {name} = {mm}_setzero_ps();" for st in acc for row in st for panel in row for name in panel)
    w.line("int64_t k = 0;")
    with w.block(f"for (; k + {sets} <= kc; k += {sets})"):
        for t in range(sets):
            step(w, t)
    with w.block("for (; k < kc; ++k)"):
        step(w, 0)
    w.lines(f"{acc[0][i][p][v]} = {mm}_add_ps({acc[0][i][p][v]}, {acc[t][i][p][v]});"
            for t in range(1, sets) for i in range(m) for p, v in cells)
    with w.block("if (acc)"):
        w.lines(f"{acc[0][i][p][v]} = {mm}_add_ps({acc[0][i][p][v]}, "
                f"{mm}_loadu_ps(c + {i} * ldc + {p} * cstep + {lanes * v}));" for i in range(m) for p, v in cells)
    w.lines(f"{mm}_storeu_ps(c + {i} * ldc + {p} * cstep + {lanes * v}, {acc[0][i][p][v]});"
            for i in range(m) for p, v in cells)
    return Function("void", small_multi_name(m, panels),
                    ("int64_t kc", "const float* restrict a", "int64_t rsa", "int64_t csa", "const float* restrict b",
                     "int64_t bstep", "float* restrict c", "int64_t cstep", "int64_t ldc", "int acc"),
                    w.text(), linkage="static",
                    comment=f"{m} rows x {panels} full packed panels (kc x NR each), panel p at b + p*bstep and its "
                            "columns of c at c + p*cstep: c = (acc ? c : 0) + A(0:m, 0:kc) * panel.").definition()


def small_multi_kernels(s: GemmSchedule, lanes: Optional[int] = None) -> list[tuple[int, int, int]]:
    """(rows, panels, sets) of every several-panel kernel the span dispatch calls, and of
    its one-panel twin for the panels left over."""
    lanes = _lanes(s, lanes)
    out = set()
    for rows, prefetch in small_kernels(s, lanes):
        panels = small_panels(s, rows, prefetch, lanes)
        if panels > 1:
            sets = small_multi_sets(s, rows, panels, lanes)
            out |= {(rows, panels, sets), (rows, 1, sets)}
    return sorted(out)


# Every panel: `parts` at a time, one from each equal part, by kernel; the panels left over
# one at a time by kernel1, which sums in the same order.
_SPAN_MACRO = """\
#ifdef __AVX2__
#define SS_GEMM_SPAN(kernel, kernel1, parts, a_rows, c_rows) do { \\
        const int64_t q = panels / (parts); \\
        for (; j < q; ++j) kernel(kc, a_rows, rsa, csa, b + j * step, q * step, c_rows + j * SS_GEMM_NR, \\
                                  q * SS_GEMM_NR, ldc, acc); \\
        for (j = (parts) * q; j < panels; ++j) kernel1(kc, a_rows, rsa, csa, b + j * step, 0, \\
                                                       c_rows + j * SS_GEMM_NR, 0, ldc, acc); \\
    } while (0)
#else
#define SS_GEMM_SPAN(kernel, kernel1, parts, a_rows, c_rows) do { } while (0)
#endif
"""


def small_span_dispatch(s: GemmSchedule, lanes: Optional[int] = None) -> str:
    """``ss_gemm_small_span``: m rows over consecutive full packed panels, split into as many
    equal parts as the row group's kernel reads panels at once."""
    lanes = _lanes(s, lanes)
    w = CWriter(level=1)
    w.line("const int64_t step = kc * SS_GEMM_NR;")
    with w.block("switch (m)"):
        for m in range(1, s.small_m + 1):
            w.line(f"case {m}:")
            first = 0
            for rows, prefetch in small_calls(s, m, lanes):
                panels = small_panels(s, rows, prefetch, lanes)
                a, c = f"a + {first} * rsa", f"c + {first} * ldc"
                single = (f"for (; j < panels; ++j) {small_name(rows, prefetch)}(kc, {a}, rsa, csa, b + j * step, "
                          f"SS_GEMM_NR, {c} + j * SS_GEMM_NR, ldc, acc, SS_GEMM_NR);")
                if panels > 1:
                    w.line(f"    {{ int64_t j = 0; SS_GEMM_SPAN({small_multi_name(rows, panels)}, "
                           f"{small_multi_name(rows, 1)}, {panels}, {a}, {c}); {single} }}")
                else:
                    w.line(f"    {{ int64_t j = 0; {single} }}")
                first += rows
            w.line("    break;")
        w.line("default: break;")
    return _SPAN_MACRO + Function(
        "void", "ss_gemm_small_span", ("int64_t m", "int64_t kc", "const float* a", "int64_t rsa", "int64_t csa",
                                       "const float* b", "int64_t panels", "float* c", "int64_t ldc", "int acc"),
        w.text(), linkage="static",
        comment="m (<= SS_GEMM_SMALL_M) rows x `panels` full panels of a packed B, one after another at b (kc x NR "
                "floats each), into the columns of c from its first one on.").definition()


def small_path(s: GemmSchedule, lanes: int) -> str:
    """The B-streaming path drawn for vectors of ``lanes`` floats: its kernels and the two
    dispatchers over them (the row groups and panels read at once depend on the width)."""
    w = CWriter()
    for m, prefetch in small_kernels(s, lanes):
        w.raw(small_kernel_avx2(s, m, prefetch, lanes))
    for m, panels, sets in small_multi_kernels(s, lanes):
        w.raw(small_multi_kernel_avx2(s, m, panels, sets, lanes))
    w.raw(small_dispatch(s, lanes))
    w.raw(small_span_dispatch(s, lanes))
    return w.text()


def small_path_scalar(s: GemmSchedule) -> str:
    """The path without AVX2: scalar kernels under the ymm path's row groups and dispatchers."""
    w = CWriter()
    for m, prefetch in small_kernels(s, 8):
        w.raw(small_kernel_scalar(m, prefetch))
    w.raw(small_dispatch(s, 8))
    w.raw(small_span_dispatch(s, 8))
    return w.text()


def small_kernel_scalar(m: int, prefetch: bool) -> str:
    w = CWriter(level=1)
    w.line("(void)nv; /* all NR columns: the scalar fallback is not tuned for speed */")
    with w.block(f"for (int i = 0; i < {m}; ++i)"):
        w.line("float t[SS_GEMM_NR];", "for (int j = 0; j < SS_GEMM_NR; ++j) t[j] = acc ? c[i * ldc + j] : 0.0f;")
        with w.block("for (int64_t k = 0; k < kc; ++k)"):
            w.line("float x = a[i * rsa + k * csa];", "for (int j = 0; j < SS_GEMM_NR; ++j) t[j] += x * b[k * ldb + j];")
        w.line("for (int j = 0; j < SS_GEMM_NR; ++j) c[i * ldc + j] = t[j];")
    return Function("void", small_name(m, prefetch), SMALL_PARAMS, w.text(), linkage="static").definition()


def small_row_groups(s: GemmSchedule, m: int, lanes: Optional[int] = None) -> list[int]:
    """Row counts the m-row B-streaming call is split into.

    A kernel keeps m x width accumulators plus the width B vectors and one broadcast in
    the registers; past 6 rows (nr = 16, ymm) only one B vector per pass fits, so every FMA
    needs its own broadcast load and the loop becomes load-bound (measured: 8 rows ran at
    about half the FMA rate of 6).  Such m are cut into balanced groups that keep full
    width; each group re-reads the same kc x nr panel of B, which is in L1 by then.
    """
    widest = max_rows(s.nr, _lanes(s, lanes), s.registers)
    if m <= widest or widest < 1:
        return [m]
    count = -(-m // widest)
    return [m // count + (1 if i < m % count else 0) for i in range(count)]


def small_calls(s: GemmSchedule, m: int, lanes: Optional[int] = None) -> list[tuple[int, bool]]:
    """(rows, prefetch) of each kernel call for m rows: only a first group prefetches."""
    prefetch = bool(s.prefetch_rows) and m >= max(1, s.prefetch_min_m)
    return [(rows, prefetch and i == 0) for i, rows in enumerate(small_row_groups(s, m, lanes))]


def small_kernels(s: GemmSchedule, lanes: Optional[int] = None) -> list[tuple[int, bool]]:
    """(rows, prefetch) of every kernel the dispatch calls."""
    return sorted({call for m in range(1, s.small_m + 1) for call in small_calls(s, m, lanes)})


def small_dispatch(s: GemmSchedule, lanes: Optional[int] = None) -> str:
    w = CWriter(level=1)
    with w.block("switch (m)"):
        for m in range(1, s.small_m + 1):
            calls, first = [], 0
            for rows, prefetch in small_calls(s, m, lanes):
                calls.append(f"{small_name(rows, prefetch)}(kc, a + {first} * rsa, rsa, csa, b, ldb, "
                             f"c + {first} * ldc, ldc, acc, nv);")
                first += rows
            w.line(f"case {m}: " + " ".join(calls) + " break;")
        w.line("default: break;")
    return Function("void", "ss_gemm_small", ("int64_t m", "int64_t kc", "const float* a", "int64_t rsa", "int64_t csa",
                                              "const float* b", "int64_t ldb", "float* c", "int64_t ldc", "int acc",
                                              "int64_t nv"), w.text(), linkage="static",
                    comment="The B-streaming kernel for m rows, 1 <= m <= SS_GEMM_SMALL_M (in row groups that keep "
                            "full vector width, see small_row_groups), for the first nv (<= NR) columns of the "
                            "panel.").definition()
