"""The GEMM fragment's fixed C (kernels/gemm.py): the call's types, packing, the BLIS loops
of the packed path, the B-streaming path's drivers, the work split between threads, and
the entry points as function descriptors (codegen/cwriter.py), from which the prototypes
other units see are generated.

Not a fragment of its own: gemm.py assembles these with the generated kernels
(gemm_tiles.py) and the schedule's ``#define SS_GEMM_*`` constants.
"""

from __future__ import annotations

from ..cwriter import Function

# Private to the GEMM object: small helpers and the structures the drivers pass around.
HELPERS = r"""
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
    const float* D; /* NULL, or an addend laid out as C (batch strides sc0, sc1, row stride ldc) */
} ss_gemm_problem;

/* The epilogue of one full tile, applied in registers before the store: act(alpha * acc +
   beta * bias + add), bias (NULL: none) at the tile's origin, a row every rs_bias floats, per
   column (bias_cols) or one value per row; add (NULL: none) the addend at the tile's
   origin, its rows ldc apart as the tile's own. */
typedef struct {
    float alpha, beta;
    const float* bias; int64_t rs_bias; int bias_cols;
    const float* add;
    int relu;
} ss_gemm_epi;

/* How the call is cut: items = batches x n_chunks x m_chunks, chunk sizes in elements. */
typedef struct {
    int64_t n_chunk, m_chunk, n_chunks, m_chunks, items;
    int small; /* the B-streaming path (M <= SS_GEMM_SMALL_M) */
} ss_gemm_plan;
"""

# Shared with every unit that uses the GEMM: the convolutions transpose with it too.
TRANSPOSE8 = r"""
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
"""

# Private: packing A and B, the tile epilogue, the local edge tile, buffers.
PACKING = r"""
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

/* c (mv x nv at row stride ldc) = act(alpha * c + beta * bias + d) for the rows m0.. and
   columns n0.. of C; d: NULL, or the addend at c's place (row stride ldc too). */
static void ss_gemm_epilogue(float* c, int64_t ldc, int64_t mv, int64_t nv, const ss_gemm_problem* P,
                             int64_t m0, int64_t n0, const float* d)
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
        if (d)
            for (int64_t j = 0; j < nv; ++j) row[j] += d[i * ldc + j];
        if (P->act == 1)
            for (int64_t j = 0; j < nv; ++j) row[j] = row[j] < 0.0f ? 0.0f : row[j];  /* NaN stays NaN */
    }
}

static inline int ss_gemm_needs_epilogue(const ss_gemm_problem* P)
{
    return P->alpha != 1.0f || P->bias != NULL || P->act != 0 || P->D != NULL;
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

# The scalar forms, for builds without AVX2.
MICRO_KERNEL_SCALAR = """\
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
                if (e->add) v += e->add[i * ldc + j];
                if (e->relu) v = v < 0.0f ? 0.0f : v;  /* NaN stays NaN */
            }
            c[i * ldc + j] = v;
        }
}
"""

EDGE_TILE_SCALAR = """\
static void ss_gemm_edge_tile(int64_t mv, int64_t nv, int64_t kc, const float* a, const float* b, float* t)
{
    (void)mv; (void)nv;
    ss_gemm_ukernel(kc, a, b, t, SS_GEMM_NR, 0, NULL);
}
"""

# Builds without AVX2: no edge-rows kernel (every edge tile panel by panel).
EDGE_ROWS_SCALAR = """\
static int64_t ss_gemm_edge_group(int64_t mv) { (void)mv; return 1; }
static void ss_gemm_edge_rows(int64_t mv, int64_t kc, const float* a, const float* b, float* t)
{
    (void)mv; (void)kc; (void)a; (void)b; (void)t;
}
"""

# The two loops over an mc x nc block's tiles (ss_gemm_macro), by the schedule's a_in_l1.
TILE_LOOPS = {
    0: """    /* jr outside ir: one B micro-panel stays in L1 while the A panels stream from L2. */
    for (int64_t jr = 0; jr < nc; jr += SS_GEMM_NR) {
        for (int64_t ir = 0; ir < mc; ir += SS_GEMM_MR) {
            if (pf_lines && jr + SS_GEMM_NR < nc) {
                const char* next = (const char*)(pb + (jr + SS_GEMM_NR) * kc);
                const int64_t l0 = (ir / SS_GEMM_MR) * pf_lines, l1 = ss_gemm_min(l0 + pf_lines, panel_lines);
                for (int64_t l = l0; l < l1; ++l) __builtin_prefetch(next + l * 64, 0, 2);  /* prefetcht1 */
            }""",
    1: """    /* ir outside jr: one A micro-panel stays in L1 while the B panels stream from L2. */
    for (int64_t ir = 0; ir < mc; ir += SS_GEMM_MR) {
        for (int64_t jr = 0; jr < nc; jr += SS_GEMM_NR) {""",
}

# Private: the block loops, both paths, the plan and the parallel split; @TILE_LOOPS@ is
# one of TILE_LOOPS.
DRIVER = r"""
/* Every tile of an mc x nc block: packed A (mc x kc) times packed B (kc x nc) into c (d:
   the addend at c's place, or NULL). */
static void ss_gemm_macro(int64_t mc, int64_t nc, int64_t kc, const float* pa, const float* pb,
                          float* c, int64_t ldc, int acc, int last, const ss_gemm_problem* P, int64_t m0, int64_t n0,
                          const float* d)
{
    float tile[SS_GEMM_MR * SS_GEMM_NR], rows_tile[SS_GEMM_MR * SS_GEMM_NR * @EDGE_GROUP_MAX@];
    const int epilogue = last && ss_gemm_needs_epilogue(P);
    const int64_t panels = (nc + SS_GEMM_NR - 1) / SS_GEMM_NR;
    /* Full tiles take the epilogue in registers (no reload of a C tile whose store may still
       be waiting for its cache line), unless the bias has a column stride other than 0 or 1. */
    const int in_kernel = epilogue && (!P->bias || P->cs_bias == 0 || P->cs_bias == 1);
    ss_gemm_epi e = {P->alpha, P->beta, NULL, P->rs_bias, P->cs_bias == 1, NULL, P->act == 1};
    /* Prepacked B (constant weights) comes from L3 or DRAM, and its panels lie one after the
       other in the order they are used: the jr-outside loop prefetches the block's next
       panel into L2 a few lines a tile, spread over the current panel's tiles, so that its first
       tile does not wait on a stream the hardware prefetcher restarts at every page. A
       packed-per-call B is in L2 already. AMD Zen 3, 1 thread: ResNet-50's 14x14-stage 1x1
       convs in a chain of 20 (40 MB of weights) 2.5-3.5% faster, MatMul 768x3072 and back
       at M = 128 in a chain of 6 about 2%. */
    const int64_t panel_lines = kc * SS_GEMM_NR / 16;
    const int64_t pf_lines = P->packed_b ? ss_gemm_cdiv(panel_lines, ss_gemm_cdiv(mc, SS_GEMM_MR)) : 0;
    (void)pf_lines;  /* the ir-outside loop (a_in_l1) has no panel to come */
@TILE_LOOPS@
            const int64_t nv = ss_gemm_min(SS_GEMM_NR, nc - jr);
            const int64_t mv = ss_gemm_min(SS_GEMM_MR, mc - ir);
            float* ct = c + ir * ldc + jr;
            const float* dt = d ? d + ir * ldc + jr : NULL;
            if (mv == SS_GEMM_MR && nv == SS_GEMM_NR) {
                if (in_kernel && P->bias) e.bias = P->bias + (m0 + ir) * P->rs_bias + (n0 + jr) * P->cs_bias;
                e.add = dt;
                ss_gemm_ukernel(kc, pa + ir * kc, pb + jr * kc, ct, ldc, acc, in_kernel ? &e : NULL);
                if (epilogue && !in_kernel) ss_gemm_epilogue(ct, ldc, mv, nv, P, m0 + ir, n0 + jr, dt);
            } else {
                /* The last rows of M (fewer than MR): a group of panels at once where the
                   block holds the whole group (gemm_tiles.edge_group), at the group's first
                   panel; else, and for the last columns of whole rows, panel by panel. */
                const int64_t group = mv < SS_GEMM_MR ? ss_gemm_edge_group(mv) : 1, q = jr / SS_GEMM_NR;
                if (group > 1 && q - q % group + group <= panels) {
                    if (q % group == 0) {
                        const int64_t cols = ss_gemm_min(group * SS_GEMM_NR, nc - jr);
                        ss_gemm_edge_rows(mv, kc, pa + ir * kc, pb + jr * kc, rows_tile);
                        ss_gemm_store_tile(rows_tile, group * SS_GEMM_NR, ct, ldc, mv, cols, acc);
                        if (epilogue) ss_gemm_epilogue(ct, ldc, mv, cols, P, m0 + ir, n0 + jr, dt);
                    }
                } else {
                    ss_gemm_edge_tile(mv, nv, kc, pa + ir * kc, pb + jr * kc, tile);
                    ss_gemm_store_tile(tile, SS_GEMM_NR, ct, ldc, mv, nv, acc);
                    if (epilogue) ss_gemm_epilogue(ct, ldc, mv, nv, P, m0 + ir, n0 + jr, dt);
                }
            }
        }
    }
}

/* Rows [m_lo, m_hi) x columns [n_lo, n_hi) of one batch (D: its addend, or NULL), n_lo a multiple of NR. */
static void ss_gemm_block_item(const ss_gemm_problem* P, const float* A, const float* B, float* C, const float* D,
                               int64_t m_lo, int64_t m_hi, int64_t n_lo, int64_t n_hi, float* abuf, float* bbuf)
{
    const int64_t K = P->K, padded_n = ss_gemm_cdiv(P->N, SS_GEMM_NR) * SS_GEMM_NR;
    /* Rows of one block of A read each packed block of B once, right after its packing: a
       block of one_block_nc columns (L2-sized) is read back from L2, one of nc from L3. */
    const int64_t nc_step = m_hi - m_lo <= SS_GEMM_MC ? SS_GEMM_ONE_BLOCK_NC : SS_GEMM_NC;
    for (int64_t jc = n_lo; jc < n_hi; jc += nc_step) {
        const int64_t nc = ss_gemm_min(nc_step, n_hi - jc);
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
                ss_gemm_macro(mc, nc, kc, abuf, pb, C + ic * P->ldc + jc, P->ldc, pc > 0, pc + kc >= K, P, ic, jc,
                              D ? D + ic * P->ldc + jc : NULL);
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

/* All M (<= SS_GEMM_SMALL_M) rows x columns [n_lo, n_hi) of one batch (D: its addend, or
   NULL): B is read once, A in place (no packing: at this M the time goes into reading B). */
static void ss_gemm_small_item(const ss_gemm_problem* P, const float* A, const float* B, float* C, const float* D,
                               int64_t n_lo, int64_t n_hi, float* bbuf)
{
    /* The one partial panel (the last of N) accumulates here across K blocks. */
    float edge[(SS_GEMM_SMALL_M > 0 ? SS_GEMM_SMALL_M : 1) * SS_GEMM_NR];
    if (ss_gemm_small_in_place(P)) ss_gemm_small_rows(P, A, B, C, n_lo, n_hi, bbuf, edge);
    else ss_gemm_small_packed(P, A, B, C, n_lo, n_hi, bbuf, edge);
    const int64_t n_edge = (n_hi - n_lo) % SS_GEMM_NR;
    if (n_edge) ss_gemm_store_tile(edge, SS_GEMM_NR, C + n_hi - n_edge, P->ldc, P->M, n_edge, 0);
    if (ss_gemm_needs_epilogue(P))
        ss_gemm_epilogue(C + n_lo, P->ldc, P->M, n_hi - n_lo, P, 0, n_lo, D ? D + n_lo : NULL);
}

/* Items [lo, hi) of the plan; scratch is allocated once here, per thread. */
static void ss_gemm_items(const ss_gemm_problem* P, const ss_gemm_plan* plan, int64_t lo, int64_t hi)
{
    const int64_t kc = ss_gemm_min(SS_GEMM_KC, P->K);
    /* The in-place B-streaming path packs only a partial last panel, PACK_ROWS rows at a time. */
    const int rows_in_place = plan->small && ss_gemm_small_in_place(P);
    const int need_b = !P->packed_b && (!rows_in_place || P->N % SS_GEMM_NR != 0);
    const int64_t b_floats = rows_in_place ? SS_GEMM_PACK_ROWS * SS_GEMM_NR
                           : kc * ss_gemm_min(plan->small ? SS_GEMM_SMALL_NC : SS_GEMM_NC_MAX, plan->n_chunk);
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
        const float* D = P->D ? P->D + i0 * P->sc0 + i1 * P->sc1 : NULL;
        if (plan->small) ss_gemm_small_item(P, A, B, C, D, n_lo, n_hi, bbuf);
        else ss_gemm_block_item(P, A, B, C, D, m_lo, m_hi, n_lo, n_hi, abuf, bbuf);
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

/* K == 0: C = act(beta * bias + D), or 0 (then D). */
static void ss_gemm_no_k(const ss_gemm_problem* P)
{
    for (int64_t i0 = 0; i0 < P->batch0; ++i0)
        for (int64_t i1 = 0; i1 < P->batch1; ++i1) {
            float* C = P->C + i0 * P->sc0 + i1 * P->sc1;
            for (int64_t m = 0; m < P->M; ++m) memset(C + m * P->ldc, 0, (size_t)P->N * sizeof(float));
            ss_gemm_epilogue(C, P->ldc, P->M, P->N, P, 0, 0, P->D ? P->D + i0 * P->sc0 + i1 * P->sc1 : NULL);
        }
}

static void ss_gemm_run(const ss_gemm_problem* P)
{
    if (P->M <= 0 || P->N <= 0 || P->batch0 <= 0 || P->batch1 <= 0) return;
    if (P->K <= 0) { ss_gemm_no_k(P); return; }
    const double flops = 2.0 * (double)P->M * (double)P->N * (double)P->K * (double)(P->batch0 * P->batch1);
    /* Inside an active parallel region (the fused attention's heads, a conv's column chunks)
       a nested region gets a team of one, though omp_get_max_threads() still says the
       thread count: a plan cut for it only packs A once per part on one thread (2 heads of
       32 at 1500 tokens, 2 threads, AMD Zen 3: the second product's A, the scores, packed
       twice, 5.46 ms where each head alone took 4.78 on its core). */
    /* A call of one or two rows streams B: it takes the time of SS_GEMM_FLOPS_PER_B_FLOAT
       flops a float of B (1 MB of B, 0.5 Mflop at M = 1, took as long to stream from L2 or L3
       as 1 Mflop of a larger call to compute), and on two threads each core streams half. */
    const double b_floats = (double)P->K * (double)P->N * (double)(P->sb0 || P->sb1 ? P->batch0 * P->batch1 : 1);
    const double work = flops > SS_GEMM_FLOPS_PER_B_FLOAT * b_floats ? flops : SS_GEMM_FLOPS_PER_B_FLOAT * b_floats;
    const int64_t threads = work >= SS_GEMM_PAR_MIN_FLOPS && !omp_in_parallel() ? omp_get_max_threads() : 1;
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
"""

_PROBLEM_PARAMS = ("int64_t M", "int64_t N", "int64_t K", "int64_t batch0", "int64_t batch1",
                   "const float* A", "int64_t sa0", "int64_t sa1", "int64_t rsa", "int64_t csa")
_OUTPUT_PARAMS = ("float* C", "int64_t sc0", "int64_t sc1", "int64_t ldc", "float alpha", "const float* bias",
                  "float beta", "int64_t rs_bias", "int64_t cs_bias", "int act")

# The entry points (kernels/gemm.py's docstring says what each computes).
ENTRIES = (
    Function("void", "ss_gemm", (*_PROBLEM_PARAMS, "const float* B", "int64_t sb0", "int64_t sb1", "int64_t rsb",
                                 "int64_t csb", *_OUTPUT_PARAMS), """
    const ss_gemm_problem P = {M, N, K, batch0, batch1, A, sa0, sa1, rsa, csa, B, sb0, sb1, rsb, csb, NULL,
                               C, sc0, sc1, ldc, alpha, bias, beta, rs_bias, cs_bias, act, NULL};
    ss_gemm_run(&P);"""),
    Function("void", "ss_gemm_add", (*_PROBLEM_PARAMS, "const float* B", "int64_t sb0", "int64_t sb1",
                                     "int64_t rsb", "int64_t csb", *_OUTPUT_PARAMS, "const float* D"), """
    const ss_gemm_problem P = {M, N, K, batch0, batch1, A, sa0, sa1, rsa, csa, B, sb0, sb1, rsb, csb, NULL,
                               C, sc0, sc1, ldc, alpha, bias, beta, rs_bias, cs_bias, act, D};
    ss_gemm_run(&P);"""),
    Function("int64_t", "ss_gemm_packed_b_size", ("int64_t K", "int64_t N"), """
    if (K <= 0 || N <= 0) return 0;
    return K * ss_gemm_cdiv(N, SS_GEMM_NR) * SS_GEMM_NR;"""),
    Function("void", "ss_gemm_pack_b", ("int64_t K", "int64_t N", "const float* B", "int64_t rsb", "int64_t csb",
                                        "float* packed"), """
    if (K <= 0 || N <= 0) return;
    const int64_t padded_n = ss_gemm_cdiv(N, SS_GEMM_NR) * SS_GEMM_NR;
    for (int64_t pc = 0; pc < K; pc += SS_GEMM_KC)
        ss_gemm_pack_b_block(ss_gemm_min(SS_GEMM_KC, K - pc), N, B + pc * rsb, rsb, csb, packed + pc * padded_n);"""),
    Function("void", "ss_gemm_prepacked", (*_PROBLEM_PARAMS, "const float* packed_b", *_OUTPUT_PARAMS), """
    const ss_gemm_problem P = {M, N, K, batch0, batch1, A, sa0, sa1, rsa, csa, NULL, 0, 0, 0, 0, packed_b,
                               C, sc0, sc1, ldc, alpha, bias, beta, rs_bias, cs_bias, act, NULL};
    ss_gemm_run(&P);"""),
    Function("void", "ss_gemm_prepacked_add", (*_PROBLEM_PARAMS, "const float* packed_b", *_OUTPUT_PARAMS,
                                               "const float* D"), """
    const ss_gemm_problem P = {M, N, K, batch0, batch1, A, sa0, sa1, rsa, csa, NULL, 0, 0, 0, 0, packed_b,
                               C, sc0, sc1, ldc, alpha, bias, beta, rs_bias, cs_bias, act, D};
    ss_gemm_run(&P);"""),
)
