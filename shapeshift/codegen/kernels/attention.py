"""Fused attention: ``softmax(alpha * Q K + mask) V`` without the score matrix in memory.

Exported C function (strides in elements; a 0 stride broadcasts)::

    int ss_attention(int64_t batch0, int64_t batch1, int64_t M, int64_t N, int64_t D, int64_t E,
                     const float* Q, int64_t sq0, int64_t sq1, int64_t rsq, int64_t csq,
                     const float* K, int64_t sk0, int64_t sk1, int64_t rsk, int64_t csk,
                     const float* V, int64_t sv0, int64_t sv1, int64_t rsv, int64_t csv,
                     const float* mask, int64_t sm0, int64_t sm1, int64_t rsm, int64_t csm,
                     float alpha, int nan_to_zero,
                     float* O, int64_t so0, int64_t so1, int64_t ldo);

For every batch index (i0, i1): S = alpha * Q K (+ mask), Q(m, d) at
``Q[i0*sq0 + i1*sq1 + m*rsq + d*csq]`` ([M, D]), K(d, n) likewise ([D, N]: the
transposed keys, as the first MatMul of an exported attention reads them), mask(m, n)
likewise or NULL; P = softmax of each row of S (the max subtracted first; a row holding
a NaN, or only -inf, gives NaN, as ONNX's Softmax); with ``nan_to_zero`` each NaN of P
becomes 0 (the ``Where(IsNaN(P), 0, P)`` guard PyTorch's exporter writes, so a fully
masked row gives zeros); O(m, e) = sum_n P(m, n) V(n, e) at ``O[i0*so0 + i1*so1 +
m*ldo + e]``. Returns 0, or -1 when a thread could not get its scratch memory (its
rows are then not written).

Why: a model's attention written as MatMul, Softmax, MatMul writes the [M, N] scores of
every head to memory and reads them back three times (scale and mask, softmax, the
second product): at N = 1500 that is 9 MB per head, far past the caches, and the time
goes to memory, not arithmetic. Here the scores of ``block`` query rows at a time
(``score_floats`` floats, sized to stay in L2) are made by the GEMM kernel, whose
epilogue applies alpha and the mask, exponentiated in place and multiplied by V at once;
each row of that product is then divided by its row's sum (E floats a row, not N).

Work items are (head, row chunk) pairs: heads first; rows are split only where there are
fewer heads than threads. An item with at least ``pack_min_rows`` rows packs its head's
K and V once into the GEMM's prepacked layout and reuses them for every row block; a
smaller one (decoding a token against a long past) reads them in place, as ss_gemm's
B-streaming path does. Scratch is malloc'd per thread per call. Needs the gemm fragment
(``ss_gemm``, ``ss_gemm_prepacked``, ``ss_gemm_pack_b``) and reduce's row helpers
(``ss_red_row_max``, ``ss_sm_row_sumexp``, the ones its Softmax uses).
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Private, fill

DEPENDS = ("gemm", "reduce", "vmath")

_DEFINES = r"""
/* ---- attention (shapeshift/codegen/kernels/attention.py) ---- */
#define SS_ATT_SCORE_FLOATS @SCORE_FLOATS@
#define SS_ATT_PACK_MIN_ROWS @PACK_MIN_ROWS@
#define SS_ATT_PAR_MIN_FLOPS @PAR_MIN_FLOPS@
"""

_HELPERS = r"""
/* The exponentials of softmax, in place, for each of ``rows`` rows of ``n`` floats:
   x - max(x) exponentiated, not yet divided by their sum; ``inv_sum[r]`` gets 1 / sum, which
   the caller applies to the row's product with V (E floats, not N). A row whose max is not
   finite (a NaN in it, only -inf, or +inf) is all NaN in ONNX's Softmax: left to give NaN
   here, or, with ``nan_to_zero``, zeroed, so its product is 0. */
static void ss_att_exp_rows(float* s, int64_t rows, int64_t n, int nan_to_zero, float* inv_sum)
{
    for (int64_t r = 0; r < rows; ++r) {
        float* x = s + r * n;
        const float m = ss_red_row_max(x, n);  /* NaN if the row holds one */
        if (nan_to_zero && !isfinite(m)) {
            memset(x, 0, sizeof(float) * (size_t)n);
            inv_sum[r] = 0.0f;
            continue;
        }
        inv_sum[r] = 1.0f / ss_sm_row_sumexp(x, x, n, m);
    }
}

/* Row r of o (e floats, rows ldo apart) times inv_sum[r]. */
static void ss_att_scale_rows(float* o, int64_t rows, int64_t e, int64_t ldo, const float* inv_sum)
{
    for (int64_t r = 0; r < rows; ++r) {
        float* y = o + r * ldo;
        const float c = inv_sum[r];
        int64_t j = 0;
#ifdef __AVX2__
        const __m256 cv = _mm256_set1_ps(c);
        for (; j + 8 <= e; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(y + j), cv));
#endif
        for (; j < e; ++j) y[j] *= c;
    }
}

"""

_ATTENTION = Function("int", "ss_attention", ("int64_t batch0", "int64_t batch1", "int64_t M", "int64_t N",
                                              "int64_t D", "int64_t E", "const float* Q", "int64_t sq0", "int64_t sq1",
                                              "int64_t rsq", "int64_t csq", "const float* K", "int64_t sk0",
                                              "int64_t sk1", "int64_t rsk", "int64_t csk", "const float* V",
                                              "int64_t sv0", "int64_t sv1", "int64_t rsv", "int64_t csv",
                                              "const float* mask", "int64_t sm0", "int64_t sm1", "int64_t rsm",
                                              "int64_t csm", "float alpha", "int nan_to_zero", "float* O",
                                              "int64_t so0", "int64_t so1", "int64_t ldo"), r"""
    if (batch0 <= 0 || batch1 <= 0 || M <= 0 || E <= 0) return 0;
    if (N <= 0) {  /* no keys: each row of P is empty, so O is 0 */
        for (int64_t i0 = 0; i0 < batch0; ++i0)
            for (int64_t i1 = 0; i1 < batch1; ++i1)
                for (int64_t m = 0; m < M; ++m) memset(O + i0 * so0 + i1 * so1 + m * ldo, 0, sizeof(float) * (size_t)E);
        return 0;
    }
    const int64_t heads = batch0 * batch1;
    /* Query rows per block: the scores fit SS_ATT_SCORE_FLOATS, in whole register tiles
       of the GEMM where there is room for one (an edge tile computes a full one). */
    int64_t block = SS_ATT_SCORE_FLOATS / N;
    if (block >= SS_GEMM_MR) block -= block % SS_GEMM_MR;
    if (block < 1) block = 1;
    if (block > M) block = M;
    const double flops = 2.0 * (double)heads * (double)M * (double)N * (double)(D + E);
    const int64_t threads = flops >= SS_ATT_PAR_MIN_FLOPS ? omp_get_max_threads() : 1;
    /* Row chunks per head: only as many as the threads need, none smaller than a block. */
    int64_t chunks = heads >= threads ? 1 : (threads + heads - 1) / heads;
    const int64_t max_chunks = (M + block - 1) / block;
    if (chunks > max_chunks) chunks = max_chunks;
    const int64_t items = heads * chunks;
    const int64_t packed_k = ss_gemm_packed_b_size(D, N), packed_v = ss_gemm_packed_b_size(N, E);
    int failed = 0;
    #pragma omp parallel num_threads(threads < items ? threads : items) if(threads > 1 && items > 1)
    {
        /* The scores of a block, then the inverse sums of its rows. */
        float* scores = (float*)malloc(sizeof(float) * (size_t)(block * N + block));
        float* pk = NULL;
        float* pv = NULL;
        if (!scores) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t item = 0; item < items; ++item) {
            if (!scores) continue;
            const int64_t head = item / chunks, part = item % chunks;
            const int64_t i0 = head / batch1, i1 = head % batch1;
            const int64_t r_lo = M * part / chunks, r_hi = M * (part + 1) / chunks;
            const float* q = Q + i0 * sq0 + i1 * sq1;
            const float* k = K + i0 * sk0 + i1 * sk1;
            const float* v = V + i0 * sv0 + i1 * sv1;
            const float* mk = mask ? mask + i0 * sm0 + i1 * sm1 : NULL;
            float* o = O + i0 * so0 + i1 * so1;
            int packed = r_hi - r_lo >= SS_ATT_PACK_MIN_ROWS && D > 0;
            if (packed && !pk) {
                pk = (float*)malloc(sizeof(float) * (size_t)(packed_k + packed_v));
                pv = pk ? pk + packed_k : NULL;
            }
            if (packed && !pk) packed = 0;  /* no room: read K and V in place */
            if (packed) {
                ss_gemm_pack_b(D, N, k, rsk, csk, pk);
                ss_gemm_pack_b(N, E, v, rsv, csv, pv);
            }
            for (int64_t r0 = r_lo; r0 < r_hi; r0 += block) {
                const int64_t rows = r_hi - r0 < block ? r_hi - r0 : block;
                const float* mrow = mk ? mk + r0 * rsm : NULL;
                const float beta = mk ? 1.0f : 0.0f;
                if (packed)
                    ss_gemm_prepacked(rows, N, D, 1, 1, q + r0 * rsq, 0, 0, rsq, csq, pk,
                                      scores, 0, 0, N, alpha, mrow, beta, rsm, csm, 0);
                else
                    ss_gemm(rows, N, D, 1, 1, q + r0 * rsq, 0, 0, rsq, csq, k, 0, 0, rsk, csk,
                            scores, 0, 0, N, alpha, mrow, beta, rsm, csm, 0);
                float* inv_sum = scores + block * N;
                ss_att_exp_rows(scores, rows, N, nan_to_zero, inv_sum);
                if (packed)
                    ss_gemm_prepacked(rows, E, N, 1, 1, scores, 0, 0, N, 1, pv,
                                      o + r0 * ldo, 0, 0, ldo, 1.0f, NULL, 0.0f, 0, 0, 0);
                else
                    ss_gemm(rows, E, N, 1, 1, scores, 0, 0, N, 1, v, 0, 0, rsv, csv,
                            o + r0 * ldo, 0, 0, ldo, 1.0f, NULL, 0.0f, 0, 0, 0);
                ss_att_scale_rows(o + r0 * ldo, rows, E, ldo, inv_sum);
            }
        }
        free(pk);
        free(scores);
    }
    return failed ? -1 : 0;""")


def fragment(score_floats: int = 1 << 15, pack_min_rows: int = 16, par_min_flops: int = 1 << 22) -> Fragment:
    """The attention fragment.

    ``score_floats``: the scores of one row block, in floats (32K floats = 128 KB, with the
    packed K and V of a head of 64 dims at N = 512 another 256 KB: within a 1 MB L2);
    ``pack_min_rows``: items with fewer query rows read K and V in place instead of packing
    them; ``par_min_flops``: calls with fewer flops run on one thread.
    """
    if int(score_floats) < 1 or int(pack_min_rows) < 1 or int(par_min_flops) < 0:
        raise ValueError(f"bad attention parameters: {score_floats}, {pack_min_rows}, {par_min_flops}")
    return Fragment([
        Private(fill(_DEFINES, SCORE_FLOATS=int(score_floats), PACK_MIN_ROWS=int(pack_min_rows),
                             PAR_MIN_FLOPS=f"{float(par_min_flops)!r}")),
        Private(_HELPERS),
        _ATTENTION,
    ])


def source(score_floats: int = 1 << 15, pack_min_rows: int = 16, par_min_flops: int = 1 << 22) -> str:
    return fragment(score_floats, pack_min_rows, par_min_flops).text()
