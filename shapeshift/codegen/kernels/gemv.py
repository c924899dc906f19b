"""Matrix-vector and skinny products (M = 1..max_m rows) on a weight prepacked by the GEMM.

A product of a few rows by a constant weight does 2*M flops per weight float it reads, so
its speed is the speed at which the weight streams in from wherever it lives (L1, L2, L3
or DRAM). This kernel reads the weight as ``ss_gemm_pack_b`` laid it out at load (K blocks
of ``SS_GEMM_KC`` rows, column panels of ``SS_GEMM_NR`` floats in each, see kernels/gemm.py),
so one packed copy serves both this path and the GEMM for larger M, and:

- keeps the sums in registers across all of K (the GEMM's small-M path stores and reloads
  C after every K block);
- runs in the widest vectors the build has (zmm on AVX-512 builds, ymm on AVX2 ones), with
  enough independent accumulators to hide the FMA latency;
- reads ``panels`` panels at once, one from each equal part of the columns: that many
  sequential read streams, which one core needs to draw its share of DRAM bandwidth
  (the GEMM's measurement, see GemmSchedule.small_panels);
- splits the columns between threads when the weight is large enough to pay for waking
  them (each thread then streams its own part of the weight);
- applies alpha, the bias (with beta, any strides) and Relu while storing.

Exported C function:

``void ss_gemv_prepacked(int64_t M, int64_t N, int64_t K, int64_t batch0, int64_t batch1,
const float* A, int64_t sa0, int64_t sa1, int64_t rsa, int64_t csa, const float* packed_b,
float* C, int64_t sc0, int64_t sc1, int64_t ldc,
float alpha, const float* bias, float beta, int64_t rs_bias, int64_t cs_bias, int act)``
    Exactly ``ss_gemm_prepacked`` (same arguments, same result, B packed by
    ``ss_gemm_pack_b``). Calls with min_m <= M <= max_m and one batch run the streaming path
    here; every other call, and every call of a build whose GEMM panel width is not the
    one this fragment was generated for, is passed on to ``ss_gemm_prepacked``.

Every column is summed by kernels of one summation order (the panels left over after the
groups of ``panels`` run a one-panel twin with the same accumulator sets), so a thread
count changes no result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...target import registers_of_width
from ..cwriter import CWriter, Fragment, Function, Private
from .gemm import FMA_CHAINS, GemmSchedule

DEPENDS: tuple[str, ...] = ("gemm",)

#: Rows the register blocking is drawn for: past 4 the GEMM's own small-M path (which
#: splits rows into groups) and its packed path take over.
MAX_ROWS = 4
#: Panels read at once at most (read streams): past four gained nothing on one core
#: (kernels/gemm.py, MAX_SMALL_PANELS note).
MAX_PANELS = 4

_PARAMS = ("int64_t M", "int64_t N", "int64_t K", "int64_t batch0", "int64_t batch1", "const float* A", "int64_t sa0",
           "int64_t sa1", "int64_t rsa", "int64_t csa", "const float* packed_b", "float* C", "int64_t sc0",
           "int64_t sc1", "int64_t ldc", "float alpha", "const float* bias", "float beta", "int64_t rs_bias",
           "int64_t cs_bias", "int act")
_ARGS = ("M, N, K, batch0, batch1, A, sa0, sa1, rsa, csa, packed_b, C, sc0, sc1, ldc, alpha, bias, beta, rs_bias, "
         "cs_bias, act")


@dataclass(frozen=True)
class GemvSchedule:
    """Parameters of the GEMV fragment.

    nr: the GEMM's panel width (its schedule's ``nr``): the packed layout this reads;
    lanes, registers: the vector width (16 zmm, 8 ymm) and register file (32, 16) of the
    widest build (a build without AVX-512 runs a ymm form drawn for 16 registers);
    min_m: the fewest rows this path takes (1..MAX_ROWS + 1, the last: none); calls with
    fewer go to the GEMM, whose small-M path read some targets' weights faster (the
    target's microarchitecture class says, target/microarch.py ``gemv_min_m``);
    max_m: the most rows this path takes (1..MAX_ROWS);
    panels: the most panels read at once (1..MAX_PANELS), as the registers allow;
    prefetch_rows: software prefetch of each panel's vectors this many rows ahead (0: none).
    Off: it did not measurably help. On the Xeon (family 6 model 167), a 1 MB weight in L2,
    best of 25-61 interleaved samples on a loaded machine, 8 or 16 rows ahead ran from 10%
    faster to 10% slower than none depending on the run (M = 1: 136-105 GB/s against
    100-151), and with the weight in L3 (16 MB) every setting ran at 29-30 GB/s, the read
    loop's speed: the hardware prefetchers keep up with four sequential streams;
    parallel_min_floats: weights of fewer floats run on one thread. A parallel region costs
    a few microseconds to wake (kernels/gemm.py's parallel_min_flops note); 2**18 floats
    (1 MB) take about 10 us to stream from L2 on one core.
    """

    nr: int = 16
    lanes: int = 8
    registers: int = 16
    min_m: int = 1
    max_m: int = MAX_ROWS
    panels: int = MAX_PANELS
    prefetch_rows: int = 0
    parallel_min_floats: int = 1 << 18

    def __post_init__(self) -> None:
        if self.lanes not in (8, 16) or self.registers not in (16, 32) or (self.lanes == 16 and self.registers != 32):
            raise ValueError(f"GemvSchedule: lanes {self.lanes} with {self.registers} registers is not a vector ISA")
        if self.nr < 8 or self.nr % 8:
            raise ValueError(f"GemvSchedule.nr must be a positive multiple of 8, got {self.nr}")
        if not 1 <= self.max_m <= MAX_ROWS:
            raise ValueError(f"GemvSchedule.max_m must be in 1..{MAX_ROWS}, got {self.max_m}")
        if not 1 <= self.min_m <= MAX_ROWS + 1:
            raise ValueError(f"GemvSchedule.min_m must be in 1..{MAX_ROWS + 1}, got {self.min_m}")
        if not 1 <= self.panels <= MAX_PANELS:
            raise ValueError(f"GemvSchedule.panels must be in 1..{MAX_PANELS}, got {self.panels}")
        if self.prefetch_rows < 0 or self.parallel_min_floats < 0:
            raise ValueError("GemvSchedule.prefetch_rows and parallel_min_floats must be >= 0")


def schedule_for(gemm: GemmSchedule, target=None) -> GemvSchedule:
    """The GEMV schedule that reads what ``gemm`` packs, in its vector width and registers
    (which codegen/defaults.py took from the target description), taking the rows its
    target's (this machine's when None) microarchitecture class gives it."""
    from ...target import host_target

    min_m = (target or host_target()).microarch.gemv_min_m
    return GemvSchedule(nr=gemm.nr, lanes=gemm.lanes, registers=gemm.registers, min_m=min(min_m, MAX_ROWS + 1))


def default_schedule(target=None) -> GemvSchedule:
    """This target's (this machine's when None) GEMV schedule: the one matching its
    default GEMM schedule."""
    from ..defaults import default_schedule as gemm_default

    return schedule_for(gemm_default(target), target)


@dataclass(frozen=True)
class Blocking:
    """How the m-row kernel of one vector width covers a panel: ``width`` vectors of it per
    pass (a divisor of the panel's vectors), ``panels`` panels at once, ``sets`` accumulator
    copies over alternate k steps."""

    width: int
    panels: int
    sets: int


def _registers(m: int, width: int, panels: int, sets: int) -> int:
    """Vector registers live in the m-row kernel: the accumulators, the B vectors of a k step
    (for one row each is used once and read straight into its FMA) and one broadcast."""
    return m * width * panels * sets + (width * panels if m > 1 else 0) + 1


def blocking(m: int, vectors: int, registers: int, max_panels: int) -> Blocking:
    """The widest pass whose accumulators fit, then as many panels at once (full-width passes
    only) and accumulator sets as fit, the sets only until FMA_CHAINS FMAs are independent."""
    width = max(w for w in range(1, vectors + 1) if vectors % w == 0 and _registers(m, w, 1, 1) <= registers)
    panels = 1
    if width == vectors:
        panels = max(p for p in range(1, max_panels + 1) if p == 1 or _registers(m, width, p, 1) <= registers)
    sets = 1
    while m * width * panels * sets < FMA_CHAINS and _registers(m, width, panels, sets + 1) <= registers:
        sets += 1
    return Blocking(width, panels, sets)


@dataclass(frozen=True)
class _Isa:
    """The intrinsics of one vector width."""

    lanes: int
    registers: int

    @property
    def vec(self) -> str:
        return "__m512" if self.lanes == 16 else "__m256"

    def op(self, name: str) -> str:
        return ("_mm512_" if self.lanes == 16 else "_mm256_") + name

    def broadcast(self, address: str) -> str:
        return f"_mm512_set1_ps(*({address}))" if self.lanes == 16 else f"_mm256_broadcast_ss({address})"


def _kernel_name(m: int, panels: int, b: Blocking) -> str:
    return f"ss_gemv_k{m}_p{panels}_w{b.width}_s{b.sets}"


def _kernel(isa: _Isa, s: GemvSchedule, m: int, panels: int, b: Blocking) -> str:
    """Sums of m rows of A times ``panels`` packed panels (panel i is j0 + i*gap), over all K,
    for the ``width`` vectors of each panel from float ``voff`` on: written to the tile t
    (m rows of panels*NR floats, panel i's columns from t + i*NR)."""
    L, sets, width = isa.lanes, b.sets, b.width
    acc = [[[[f"c{t}_{i}_{p}_{v}" for v in range(width)] for p in range(panels)] for i in range(m)]
           for t in range(sets)]
    bv = [[f"b{p}_{v}" for v in range(width)] for p in range(panels)]
    cells = [(p, v) for p in range(panels) for v in range(width)]

    def step(w: CWriter, t: int) -> None:
        row = f"(k + {t}) * SS_GEMM_NR" if t else "k * SS_GEMM_NR"
        if s.prefetch_rows:
            w.lines(f"_mm_prefetch((const char*)(q{p} + (k + {t + s.prefetch_rows}) * SS_GEMM_NR + {L * v}), "
                    "_MM_HINT_T0);" for p, v in cells)
        if m == 1:  # each B vector is used once: its load folds into the FMA
            w.line(f"av = {isa.broadcast(f'ak + (k + {t}) * csa')};")
            w.lines(f"{acc[t][0][p][v]} = {isa.op('fmadd_ps')}(av, {isa.op('loadu_ps')}(q{p} + {row} + {L * v}), "
                    f"{acc[t][0][p][v]});" for p, v in cells)
            return
        for p, v in cells:
            # Pinned in a register: otherwise GCC folds the load into every row's FMA (m loads
            # of each vector instead of one) and the loop becomes load-bound.
            w.line(f"{bv[p][v]} = {isa.op('loadu_ps')}(q{p} + {row} + {L * v});", f'__asm__("" : "+x"({bv[p][v]}));')
        for i in range(m):
            w.line(f"av = {isa.broadcast(f'ak + {i} * rsa + (k + {t}) * csa')};")
            w.lines(f"{acc[t][i][p][v]} = {isa.op('fmadd_ps')}(av, {bv[p][v]}, {acc[t][i][p][v]});" for p, v in cells)

    w = CWriter(level=1)
    w.line(f"{isa.vec} av" + "".join(f", {n}" for row in (bv if m > 1 else []) for n in row) + ";")
    w.lines(f"{isa.vec} {n} = {isa.op('setzero_ps')}();" for st in acc for row in st for panel in row for n in panel)
    with w.block("for (int64_t k0 = 0; k0 < K; k0 += SS_GEMM_KC)"):
        w.line("const int64_t kb = K - k0 < SS_GEMM_KC ? K - k0 : SS_GEMM_KC;",
               "const float* ak = a + k0 * csa;")
        w.lines(f"const float* restrict q{p} = b + k0 * np + (j0 + {p} * gap) * kb * SS_GEMM_NR + voff;"
                for p in range(panels))
        w.line("int64_t k = 0;")
        with w.block(f"for (; k + {sets} <= kb; k += {sets})"):
            for t in range(sets):
                step(w, t)
        with w.block("for (; k < kb; ++k)"):
            step(w, 0)
    w.lines(f"{acc[0][i][p][v]} = {isa.op('add_ps')}({acc[0][i][p][v]}, {acc[t][i][p][v]});"
            for t in range(1, sets) for i in range(m) for p, v in cells)
    w.lines(f"{isa.op('storeu_ps')}(t + {i} * {panels} * SS_GEMM_NR + {p} * SS_GEMM_NR + voff + {L * v}, "
            f"{acc[0][i][p][v]});" for i in range(m) for p, v in cells)
    return Function("void", _kernel_name(m, panels, b),
                    ("int64_t K", "const float* restrict a", "int64_t rsa", "int64_t csa", "const float* restrict b",
                     "int64_t np", "int64_t j0", "int64_t gap", "int64_t voff", "float* restrict t"),
                    w.text(), linkage="static").definition()


def _variant(isa: _Isa, s: GemvSchedule) -> str:
    """The kernels of one vector width and ``ss_gemv_tile``, which runs them for m rows and
    one group of panels (``count``: the group's size, or 1 for a panel left over)."""
    vectors = s.nr // isa.lanes
    out = CWriter()
    plans = {m: blocking(m, vectors, isa.registers, s.panels) for m in range(s.min_m, s.max_m + 1)}
    for m, b in plans.items():
        for panels in sorted({1, b.panels}):
            out.raw(_kernel(isa, s, m, panels, b))
    w = CWriter(level=1)
    with w.block("switch (m)"):
        for m, b in plans.items():
            passes = [f"{v * isa.lanes}" for v in range(0, vectors, b.width)]
            many = " ".join(f"{_kernel_name(m, b.panels, b)}(K, a, rsa, csa, b, np, j0, gap, {o}, t);" for o in passes)
            one = " ".join(f"{_kernel_name(m, 1, b)}(K, a, rsa, csa, b, np, j0, gap, {o}, t);" for o in passes)
            w.line(f"case {m}: if (count == 1) {{ {one} }} else {{ {many} }} return;")
        w.line("default: return;")
    out.raw(Function("void", "ss_gemv_tile", ("int64_t m", "int64_t count", "int64_t K", "const float* a",
                                              "int64_t rsa", "int64_t csa", "const float* b", "int64_t np",
                                              "int64_t j0", "int64_t gap", "float* t"), w.text(),
                     linkage="static").definition())
    w = CWriter(level=1)
    with w.block("switch (m)"):
        w.lines(f"case {m}: return {b.panels};" for m, b in plans.items())
        w.line("default: return 1;")
    out.raw(Function("int64_t", "ss_gemv_group", ("int64_t m",), w.text(), linkage="static",
                     comment="Panels the m-row kernel reads at once.").definition())
    return out.text()


_ITEM = Function("void", "ss_gemv_item", (
    "int64_t it", "int64_t q", "int64_t group", "int64_t M", "int64_t N", "int64_t K", "const float* A", "int64_t rsa",
    "int64_t csa", "const float* packed", "int64_t np", "float* C", "int64_t ldc", "float alpha", "const float* bias",
    "float beta", "int64_t rs_bias", "int64_t cs_bias", "int act"), """
    float t[SS_GEMV_MAX_M * SS_GEMV_PANELS * SS_GEMM_NR];
    const int64_t count = it < q ? group : 1;
    const int64_t j0 = it < q ? it : group * q + (it - q), gap = it < q ? q : 0;
    ss_gemv_tile(M, count, K, A, rsa, csa, packed, np, j0, gap, t);
    for (int64_t c = 0; c < count; ++c) {
        const int64_t n0 = (j0 + c * gap) * SS_GEMM_NR;
        const int64_t nv = N - n0 < SS_GEMM_NR ? N - n0 : SS_GEMM_NR;
        for (int64_t i = 0; i < M; ++i) {
            const float* restrict ti = t + i * count * SS_GEMM_NR + c * SS_GEMM_NR;
            float* restrict ci = C + i * ldc + n0;
            /* One simple loop per part of the epilogue, each vectorized; the order of
               operations is the GEMM's: alpha * sum, + beta * bias, then Relu. */
            for (int64_t j = 0; j < nv; ++j) ci[j] = alpha * ti[j];
            if (bias) {
                const float* bi = bias + i * rs_bias + n0 * cs_bias;
                if (cs_bias == 1) for (int64_t j = 0; j < nv; ++j) ci[j] += beta * bi[j];
                else for (int64_t j = 0; j < nv; ++j) ci[j] += beta * bi[j * cs_bias];
            }
            /* NaN stays NaN, as in the GEMM */
            if (act) for (int64_t j = 0; j < nv; ++j) ci[j] = ci[j] < 0.0f ? 0.0f : ci[j];
        }
    }""", linkage="static", comment="Item `it` of ss_gemv_run: a group of panels (or one left over), all M rows.")

_RUN = Function("void", "ss_gemv_run", (
    "int64_t M", "int64_t N", "int64_t K", "const float* A", "int64_t rsa", "int64_t csa", "const float* packed",
    "float* C", "int64_t ldc", "float alpha", "const float* bias", "float beta", "int64_t rs_bias",
    "int64_t cs_bias", "int act"), """
    const int64_t panels = (N + SS_GEMM_NR - 1) / SS_GEMM_NR, np = panels * SS_GEMM_NR;
    const int64_t group = ss_gemv_group(M);
    /* Items: q groups of `group` panels, one from each of `group` equal parts of the columns
       (that many read streams), then the panels left over one by one. */
    const int64_t q = panels / group, items = q + (panels - group * q);
    if (items > 1 && K * np >= SS_GEMV_PAR_MIN_FLOATS) {
        #pragma omp parallel for schedule(static)
        for (int64_t it = 0; it < items; ++it)
            ss_gemv_item(it, q, group, M, N, K, A, rsa, csa, packed, np, C, ldc, alpha, bias, beta, rs_bias,
                         cs_bias, act);
    } else {
        /* No parallel region at all: entering one costs about a microsecond even on one thread. */
        for (int64_t it = 0; it < items; ++it)
            ss_gemv_item(it, q, group, M, N, K, A, rsa, csa, packed, np, C, ldc, alpha, bias, beta, rs_bias,
                         cs_bias, act);
    }""", linkage="static", comment="M (1..SS_GEMV_MAX_M) rows by a packed weight, one batch.")


def fragment(schedule: Optional[GemvSchedule] = None) -> Fragment:
    """The fragment: the kernels of the schedule's width (AVX-512 builds) and of ymm (AVX2
    builds), the driver, and ``ss_gemv_prepacked``, which falls back to the GEMM wherever
    the streaming path does not apply or was not compiled."""
    s = schedule or default_schedule()
    fast = f"defined(__AVX2__) && SS_GEMM_NR == {s.nr}"
    streams = s.min_m <= s.max_m  # else the target's class hands every row count to the GEMM
    w = CWriter()
    w.comment("---- gemv (shapeshift/codegen/kernels/gemv.py) ----")
    w.line(f"#define SS_GEMV_MIN_M {s.min_m}", f"#define SS_GEMV_MAX_M {s.max_m}", f"#define SS_GEMV_PANELS {s.panels}",
           f"#define SS_GEMV_PAR_MIN_FLOATS {s.parallel_min_floats}")
    body = CWriter(level=1)
    if streams:
        with w.guard(fast):
            if s.lanes == 16 and s.nr % 16 == 0:
                with w.guard("__AVX512F__"):
                    w.raw(_variant(_Isa(16, s.registers), s))
                    w.orelse()
                    w.raw(_variant(_Isa(8, registers_of_width(8)), s))
            else:
                w.raw(_variant(_Isa(8, registers_of_width(8)), s))
            w.raw(_ITEM.definition())
            w.raw(_RUN.definition())
        with body.guard(fast):
            with body.block("if (M >= SS_GEMV_MIN_M && M <= SS_GEMV_MAX_M && N > 0 && batch0 == 1 && batch1 == 1)"):
                body.line("ss_gemv_run(M, N, K < 0 ? 0 : K, A, rsa, csa, packed_b, C, ldc, alpha, bias, beta, "
                          "rs_bias, cs_bias, act);", "return;")
    body.line(f"ss_gemm_prepacked({_ARGS});")
    return Fragment([Private(w.text()), Function("void", "ss_gemv_prepacked", _PARAMS, body.text())])


def source(schedule: Optional[GemvSchedule] = None) -> str:
    """The fragment's text (it calls the GEMM fragment's ``ss_gemm_prepacked``: build it
    after ``gemm.source()`` of the schedule whose ``nr`` this one has)."""
    return fragment(schedule).text()
