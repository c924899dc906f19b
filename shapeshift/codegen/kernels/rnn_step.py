"""The recurrent step of kernels/rnn.py: R packed once, and the per-step product h R^T as
register-tiled matrix-vector (small-matrix) blocks whose results feed the gate update
directly. Part of the ``rnn`` fragment (this module has no ``source()`` of its own).

Packed R. The gates of one product ("a set": LSTM's i, o, f, c; GRU's z, r, h with
linear_before_reset, or z, r then h without it; RNN's one gate) are packed so that one
block of VW hidden units holds, for every k of the state, the VW weights of each gate
side by side: ``P[jb][k][g][v] = R[g*H + jb*VW + v, k]`` (zero past H). A step then
reads each block once per group of batch rows, keeps the gates' accumulators of up to MR
rows in registers (MR from the target's register file; with few rows, several sets over
alternate k, so that enough FMA chains hide the FMA latency; an LSTM's four gates in two
passes of two where the register file is small, ``split_rows``), and hands the VW x gates results
of each row to the gate update through a small L1 buffer, never through a [B, G] array.
Where an LSTM runs in two passes, its block is two panels, gates 0-1 then 2-3, each
``[k][2][VW]`` (``lstm_panels``), so that each pass streams a run of memory of its own.

Exported C (besides the kernels of rnn.py)::

    /* Floats of R packed for D directions of hidden size H and `gates` gates. */
    int64_t ss_rnn_packed_size(int64_t D, int64_t H, int gates);
    /* R [D, gates*H, H] -> P; kind: 0 RNN, 1 GRU, 2 GRU linear_before_reset, 3 LSTM. */
    void ss_rnn_pack(const float* R, int64_t D, int64_t H, int kind, float* P);
    /* The VM's load-time packing interface (runtime/vm.py, LowerContext.packed_constant):
       the source is R as a [D*gates*H, H] matrix (rsb = N, csb = 1). */
    int64_t ss_rnn_k<kind>_packed_b_size(int64_t K, int64_t N);
    void ss_rnn_k<kind>_pack_b(int64_t K, int64_t N, const float* B, int64_t rsb, int64_t csb, float* packed);

Internal: ``ss_rnn_dot(P, h, ldh, H, ng, rows, out)``: out[r][g][0..VW) = sum_k h[r*ldh + k]
P[k][g][..] for one block, ``ss_rnn_mr(ng)`` the most rows one call takes.
"""

from __future__ import annotations

from typing import Optional

from ...target import Target
from ...target.description import host_target, named_target
from ..cwriter import CWriter, Function, Private, fill

#: kind code -> the gate sets of one direction's R, in row order.
KIND_SETS = {0: (1,), 1: (2, 1), 2: (3,), 3: (4,)}
KIND_GATES = {kind: sum(sets) for kind, sets in KIND_SETS.items()}
#: Rows per register tile at most (the dispatch table's size).
MR_CAP = 8
#: Widest block the kernel may use (floats): what the lowering sizes a workspace with.
MAX_VW = 16


def rows_per_tile(registers: int, ng: int) -> int:
    """Batch rows whose ``ng`` accumulators fit the register file beside ng weight vectors
    and one broadcast."""
    return max(1, min(MR_CAP, (registers - ng - 1) // ng))


#: Independent FMA chains a tile keeps in flight: two FMA ports x a 4-cycle latency, the
#: most any class of target/microarch.py needs (the AVX2 entry; the Xeon's two zmm ports).
FMA_CHAINS = 8


def k_splits(registers: int, ng: int, rows: int) -> int:
    """Independent accumulator sets over alternate k: only as many as it takes for rows x
    gates x sets to reach FMA_CHAINS (one row of one gate is one chain), at most 4 and within
    the register file beside the weights. More sets than that cost loads: with 3 rows of 3
    gates, 3 sets filled 27 of the 32 zmm registers, gcc read each weight vector from memory
    in every FMA (9 loads a k where 3 do), and the step ran load-bound at about half the
    FMA peak."""
    chains = rows * ng
    return max(1, min(4, -(-FMA_CHAINS // chains), (registers - ng - 1) // chains))


def split_rows(registers: int) -> int:
    """Rows of the half tiles an LSTM's four gates run as, two gates at a time, or 0 where
    its whole tile holds enough rows. In 16 ymm registers a tile of all four gates holds 2
    rows, 8 FMA chains, short of the 10 a 5-cycle FMA latency on two ports takes (AMD Zen
    2); two passes of 6 rows x 2 gates keep 12 in flight, with 8 loads a k for 12 FMAs (the
    GEMM's 6 x 16 tile), and read each line of the block once, since a k's gates 0-1 and
    2-3 are lines of their own. LSTM at hidden 256 over 128 steps, 1 thread, Zen 2: batch 16
    33.0-33.5 -> 30.6-31.2 ms, batch 8 17.2-17.7 -> 15.1-15.5; batch 1 and 3 as before."""
    return rows_per_tile(registers, 2) if rows_per_tile(registers, 4) <= 2 else 0


def lstm_rows(registers: int) -> int:
    """Batch rows one LSTM tile takes: the half tiles' where it runs them."""
    return split_rows(registers) or rows_per_tile(registers, 4)


def lstm_panels(registers: int) -> int:
    """Panels an LSTM block of R is packed in: 2 where its tiles run as two passes of two
    gates (split_rows), each pass then streaming a panel of its own (gates 0-1, then 2-3,
    for every k) rather than every other cache line of the whole block; else 1."""
    return 2 if split_rows(registers) else 1


def _dot_name(ng: int, rows: int, per_panel: int, out_stride: int) -> str:
    """``ss_rnn_dot_g<ng>[p<panels>][o<out_stride>]_r<rows>``."""
    panels = f"p{ng // per_panel}" if per_panel != ng else ""
    out = f"o{out_stride}" if out_stride != ng else ""
    return f"ss_rnn_dot_g{ng}{panels}{out}_r{rows}"


def _dot_function(ng: int, rows: int, registers: int, lanes: int, per_panel: int = 0, out_stride: int = 0) -> str:
    """One block's product for ``rows`` rows, accumulators named so that they stay in
    registers, ``k_splits`` sets of them over alternate k, summed at the end; blocks of
    ``lanes`` floats (SS_RNN_VW of the branch it is compiled in). The block's gates lie in
    panels of ``per_panel`` gates (default: one panel of all ``ng``), panel q at P + q * H *
    per_panel * VW, holding [k][per_panel][VW]; the results go to out[r][g] rows of
    ``out_stride`` gates (default ng), so that a pass over one panel of an LSTM block writes
    its gates' places among all four."""
    per_panel = per_panel or ng
    out_stride = out_stride or ng
    name = _dot_name(ng, rows, per_panel, out_stride)
    ks = k_splits(registers, ng, rows)
    panels = ng // per_panel
    w = CWriter()
    acc = [[[f"a{s}_{r}_{g}" for g in range(ng)] for r in range(rows)] for s in range(ks)]

    def step(w: CWriter, s: int, k: str) -> None:
        w.line(f"const float* p{s} = P + ({k}) * {per_panel} * SS_RNN_VW;")
        # R streams once per step: fetch SS_RNN_PREFETCH_K values of k ahead, one prefetch per
        # cache line of each panel's per_panel x lanes floats of the k (the rows of k are
        # contiguous in a panel, so a line one k leaves out is the next k's first). One per
        # gate issued two per line with ymm blocks: with the loads and broadcasts, 10
        # load-port operations a k against 8 FMAs for an LSTM tile of 2 rows, which then
        # ran on the load ports.
        w.lines(f"_mm_prefetch((const char*)(p{s} + {f'{q} * pstride + ' if q else ''}"
                f"SS_RNN_PREFETCH_K * {per_panel} * SS_RNN_VW + {line * 16}), _MM_HINT_T0);"
                for q in range(panels) for line in range(-(-per_panel * lanes // 16)))
        w.line("ss_rnn_v " + ", ".join(
            f"w{s}_{g} = ss_rnn_vload(p{s} + {f'{g // per_panel} * pstride + ' if g >= per_panel else ''}"
            f"{g % per_panel} * SS_RNN_VW)" for g in range(ng)) + ";")
        # Each weight vector in a register, loaded once for all rows: left alone, gcc folds
        # the load into every row's FMA, and the step runs on the load ports, not the FMAs.
        w.lines(f'__asm__("" : "+v"(w{s}_{g}));' for g in range(ng))
        for r in range(rows):
            w.line(f"const ss_rnn_v x{s}_{r} = ss_rnn_vset1(h[{r} * ldh + {k}]);")
            w.lines(f"{acc[s][r][g]} = ss_rnn_vfma(x{s}_{r}, w{s}_{g}, {acc[s][r][g]});" for g in range(ng))

    with w.block(f"static inline void {name}(const float* P, const float* h, int64_t ldh, int64_t H, float* out)"):
        if panels > 1:
            w.line(f"const int64_t pstride = H * {per_panel} * SS_RNN_VW;")
        w.line("ss_rnn_v " + ", ".join(f"{a} = ss_rnn_vzero()" for split in acc for row in split for a in row) + ";")
        w.line("int64_t k = 0;")
        if ks > 1:
            with w.block(f"for (; k + {ks} <= H; k += {ks})"):
                for s in range(ks):
                    step(w, s, f"k + {s}")
        with w.block("for (; k < H; ++k)"):
            step(w, 0, "k")
        for s in range(1, ks):
            w.lines(f"{acc[0][r][g]} = ss_rnn_vadd({acc[0][r][g]}, {acc[s][r][g]});"
                    for r in range(rows) for g in range(ng))
        for r in range(rows):
            w.lines(f"ss_rnn_vstore(out + {r * out_stride + g} * SS_RNN_VW, {acc[0][r][g]});" for g in range(ng))
    return w.text()


def _vector_branch(registers: int, lanes: int) -> str:
    """The specialized dots and their dispatch for one register file of ``lanes``-float vectors."""
    w = CWriter()
    halves = split_rows(registers)
    # An LSTM set in two panels of two gates (lstm_panels): its whole tiles read both.
    lstm_panel = 2 if halves else 4
    w.line(f"#define SS_RNN_LSTM_PANELS {4 // lstm_panel}")
    for ng in (1, 2, 3, 4):
        for rows in range(1, rows_per_tile(registers, ng) + 1):
            w.raw(_dot_function(ng, rows, registers, lanes, per_panel=lstm_panel if ng == 4 else ng))
    for rows in range(rows_per_tile(registers, 4) + 1, halves + 1):
        w.raw(_dot_function(2, rows, registers, lanes, out_stride=4))
    mr = [rows_per_tile(registers, 1), rows_per_tile(registers, 2), rows_per_tile(registers, 3), lstm_rows(registers)]
    with w.block("static inline int ss_rnn_mr(int ng)"):
        w.line(f"static const int mr[5] = {{1, {', '.join(map(str, mr))}}};")
        w.line("return mr[ng];")
    with w.block("static void ss_rnn_dot(const float* P, const float* h, int64_t ldh, int64_t H, int ng, int rows, "
                 "float* out)"):
        with w.block("switch (ng * 16 + rows)"):
            for ng in (1, 2, 3, 4):
                for rows in range(1, rows_per_tile(registers, ng) + 1):
                    name = _dot_name(ng, rows, lstm_panel if ng == 4 else ng, ng)
                    w.line(f"case {ng * 16 + rows}: {name}(P, h, ldh, H, out); return;")
            # Past the whole tile's rows, an LSTM block in two passes, a panel each (split_rows).
            for rows in range(rows_per_tile(registers, 4) + 1, halves + 1):
                name = _dot_name(2, rows, 2, 4)
                w.line(f"case {4 * 16 + rows}: {name}(P, h, ldh, H, out); "
                       f"{name}(P + 2 * H * SS_RNN_VW, h, ldh, H, out + 2 * SS_RNN_VW); return;")
            w.line("default: return;")
    return w.text()


_SCALAR_DOT = r"""
#define SS_RNN_LSTM_PANELS 1
static inline int ss_rnn_mr(int ng) { (void)ng; return 1; }

static void ss_rnn_dot(const float* P, const float* h, int64_t ldh, int64_t H, int ng, int rows, float* out) {
    for (int r = 0; r < rows; ++r) {
        float* o = out + r * ng * SS_RNN_VW;
        for (int i = 0; i < ng * SS_RNN_VW; ++i) o[i] = 0.0f;
        for (int64_t k = 0; k < H; ++k) {
            const float x = h[r * ldh + k];
            const float* p = P + k * ng * SS_RNN_VW;
            for (int i = 0; i < ng * SS_RNN_VW; ++i) o[i] += x * p[i];
        }
    }
}
"""

# When a direction's steps run on a team of threads (the SS_RNN_*_PAR_MIN macros below say
# what each counts). The team is one region over a chunk of steps, a barrier ending each step
# (rnn.py's ss_recur_direction); starting it costs tens to hundreds of microseconds when the
# threads have gone to sleep between runs (0.4 ms measured in a VM, bench/results/tail.md),
# a barrier about a microsecond. With a region per step (before the team), the step had to
# be 1 << 18 FMAs and the sequence 1 << 22; with the team, GRU at batch 1, hidden 256 (196608
# FMAs a step), 2 threads, AMD Zen 2, bench/rnn.py: 128 steps 2.9 -> 1.3 ms (onnxruntime 1.9-
# 2.7), 16 steps 0.33-0.41 -> 0.19-0.23 (0.35); hidden 1024, one step (3.1M FMAs) 1.17-1.75
# -> 0.51 ms (0.67). Below 1 << 17 (LSTM at batch 4, hidden 64) the team measured no faster.
STEP_PAR_MIN = 1 << 17
SEQ_PAR_MIN = 1 << 20
# A direction of bench/tail.py's GRU encoder (hidden 256, input 128, batch 1, 5 steps) has
# 1.5M FMAs, about 50 us: at 1 << 21 both ran on one thread and 2 threads took 0.13-0.16 ms
# against onnxruntime's 0.10-0.14; on a thread each, 0.08-0.14 (Zen 4, back-to-back runs).
DIR_PAR_MIN = 1 << 20

_VECTOR_MACROS = r"""
/* ---- rnn: packed recurrent step ---- */
#if @WIDE@ && defined(__AVX512F__)
#define SS_RNN_VW 16
typedef __m512 ss_rnn_v;
#define ss_rnn_vzero _mm512_setzero_ps
#define ss_rnn_vload _mm512_loadu_ps
#define ss_rnn_vstore _mm512_storeu_ps
#define ss_rnn_vset1 _mm512_set1_ps
#define ss_rnn_vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define ss_rnn_vadd _mm512_add_ps
#elif defined(__AVX2__) && defined(__FMA__)
#define SS_RNN_VW 8
typedef __m256 ss_rnn_v;
#define ss_rnn_vzero _mm256_setzero_ps
#define ss_rnn_vload _mm256_loadu_ps
#define ss_rnn_vstore _mm256_storeu_ps
#define ss_rnn_vset1 _mm256_set1_ps
#define ss_rnn_vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define ss_rnn_vadd _mm256_add_ps
#else
#define SS_RNN_VW 8
#endif
/* Batch rows x gates x hidden^2 FMAs of a step below which it stays on one thread; the
   same summed over the steps of a call (the threads sleep between runs, and waking them
   costs tens to hundreds of microseconds); and the FMAs of one direction (input
   projection and steps) below which the two directions run on one thread. */
#define SS_RNN_STEP_PAR_MIN @STEP_PAR_MIN@
#define SS_RNN_SEQ_PAR_MIN @SEQ_PAR_MIN@
#define SS_RNN_DIR_PAR_MIN @DIR_PAR_MIN@
/* A call that starts within this many seconds of the thread's last one ended is `warm`: the
   threads of that call's region still spin (libgomp's GOMP_SPINCOUNT, about 250 us as
   codegen/build.py sets it), and a team costs a barrier a step, not a wake-up. */
#define SS_RNN_WARM_S 1e-4
/* Floats of a direction's R up to which its steps run on the threads by batch rows rather
   than on a team (half of L2: every thread then keeps all of R in its own cache). */
#define SS_RNN_ROWS_R_MAX @ROWS_R_MAX@
/* How many values of k ahead the product prefetches the packed R. */
#define SS_RNN_PREFETCH_K @PREFETCH_K@
/* Floats of input projection computed ahead of the steps that read it (a quarter of L2). */
#define SS_RNN_CHUNK_FLOATS @CHUNK_FLOATS@
/* Floats of L1d (the steps' block order, rnn_gates.py's ss_recur_tiles). */
#define SS_RNN_L1_FLOATS @L1_FLOATS@
"""

_PACK = r"""
/* One set of ng gates (rows Rset[0 .. ng*H) of H) into blocks of VW hidden units, each
   block in panels of gpp gates: P[jb][q][k][g][VW] holds gate q * gpp + g. */
static void ss_rnn_pack_set(const float* Rset, int64_t H, int ng, int gpp, float* P) {
    const int64_t nb = (H + SS_RNN_VW - 1) / SS_RNN_VW;
    for (int64_t jb = 0; jb < nb; ++jb)
        for (int q = 0; q < ng / gpp; ++q)
            for (int64_t k = 0; k < H; ++k)
                for (int g = 0; g < gpp; ++g) {
                    float* p = P + jb * H * ng * SS_RNN_VW + ((q * H + k) * gpp + g) * SS_RNN_VW;
                    const int64_t row = (int64_t)(q * gpp + g) * H;
                    for (int v = 0; v < SS_RNN_VW; ++v) {
                        const int64_t j = jb * SS_RNN_VW + v;
                        p[v] = j < H ? Rset[(row + j) * H + k] : 0.0f;
                    }
                }
}

/* Floats of one direction's packed set of ng gates. */
static inline int64_t ss_rnn_set_size(int64_t H, int ng) {
    return (H + SS_RNN_VW - 1) / SS_RNN_VW * SS_RNN_VW * H * ng;
}

static inline int ss_rnn_kind_gates(int kind) { return kind == 0 ? 1 : (kind == 3 ? 4 : 3); }
"""

_PACKED_SIZE = Function("int64_t", "ss_rnn_packed_size", ("int64_t D", "int64_t H", "int gates"), r"""
    return D * ss_rnn_set_size(H, gates);""")

_PACK_ALL = Function("void", "ss_rnn_pack", ("const float* R", "int64_t D", "int64_t H", "int kind", "float* P"), r"""
    const int gates = ss_rnn_kind_gates(kind);
    for (int64_t d = 0; d < D; ++d) {
        const float* Rd = R + d * gates * H * H;
        float* Pd = P + d * ss_rnn_set_size(H, gates);
        if (kind == 1) {   /* z, r; then h, which multiplies r * h */
            ss_rnn_pack_set(Rd, H, 2, 2, Pd);
            ss_rnn_pack_set(Rd + 2 * H * H, H, 1, 1, Pd + ss_rnn_set_size(H, 2));
        } else {
            ss_rnn_pack_set(Rd, H, gates, kind == 3 ? 4 / SS_RNN_LSTM_PANELS : gates, Pd);
        }
    }""")


def _vm_interface(kind: int) -> list[Function]:
    """``ss_rnn_k<kind>_packed_b_size`` / ``_pack_b``: the signatures runtime/vm.py calls at
    load for a PackRequest of prefix ``ss_rnn_k<kind>_``."""
    gates = KIND_GATES[kind]
    size = Function("int64_t", f"ss_rnn_k{kind}_packed_b_size", ("int64_t K", "int64_t N"), fill(r"""
    return N > 0 ? ss_rnn_packed_size(K / (@GATES@ * N), N, @GATES@) : 0;""", GATES=gates))
    pack = Function("void", f"ss_rnn_k{kind}_pack_b", ("int64_t K", "int64_t N", "const float* B", "int64_t rsb",
                                                        "int64_t csb", "float* packed"), fill(r"""
    (void)rsb; (void)csb;   /* the VM passes R contiguous: rsb = N, csb = 1 */
    if (N > 0) ss_rnn_pack(B, K / (@GATES@ * N), N, @KIND@, packed);""", GATES=gates, KIND=kind))
    return [size, pack]


def parts(target: Optional[Target] = None, step_par_min: int = STEP_PAR_MIN, chunk_floats: Optional[int] = None,
          prefetch_k: int = 16, seq_par_min: int = SEQ_PAR_MIN, dir_par_min: int = DIR_PAR_MIN) -> list:
    """The fragment parts of the packed step, for ``target`` (this machine by default):
    zmm blocks where it has AVX-512 (and the unit is built with it), else ymm; rows per
    tile from each branch's register file; the projection chunk (``chunk_floats``) from
    its L2 unless given."""
    target = target or host_target()
    wide = 512 in target.widths
    ymm_registers = target.vector_registers if not target.has("avx512f") else \
        named_target("x86-64-v3").vector_registers
    w = CWriter()
    w.raw(fill(_VECTOR_MACROS, WIDE=int(wide), STEP_PAR_MIN=int(step_par_min), SEQ_PAR_MIN=int(seq_par_min),
               DIR_PAR_MIN=int(dir_par_min),
               CHUNK_FLOATS=chunk_floats or max(1024, target.caches.l2 // 4 // 4), PREFETCH_K=prefetch_k,
               ROWS_R_MAX=target.caches.l2 // 2 // 4, L1_FLOATS=target.caches.l1d // 4))
    with w.guard(f"{int(wide)} && defined(__AVX512F__)"):
        w.raw(_vector_branch(target.vector_registers, 16))
        w.raw("#elif defined(__AVX2__) && defined(__FMA__)")
        w.raw(_vector_branch(ymm_registers, 8))
        w.orelse()
        w.raw(_SCALAR_DOT)
    w.raw(_PACK)
    out = [Private(w.text()), _PACKED_SIZE, _PACK_ALL]
    for kind in KIND_SETS:
        out += _vm_interface(kind)
    return out


def packed_floats_bound(directions: int, hidden: int, gates: int) -> int:
    """An upper bound of ss_rnn_packed_size (the block width is at most MAX_VW)."""
    return directions * -(-hidden // MAX_VW) * MAX_VW * hidden * gates
