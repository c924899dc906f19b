"""LayerNormalization, Group/InstanceNormalization and BatchNormalization (inference).

``fragment(...)`` returns the C fragment; it needs vmath (``ss_hsum8``). Exported C signatures::

    /* LayerNormalization over the last n elements of each of `rows` rows:
       y = (x - mean) * inv_std * scale + bias, inv_std = 1 / sqrt(var + eps) (population
       variance). scale, bias: NULL or n floats. mean, inv_std: NULL or `rows` floats that
       receive the statistics (ONNX outputs 2 and 3). */
    void ss_layernorm(const float* x, const float* scale, const float* bias, float* y,
                      int64_t rows, int64_t n, float eps, float* mean, float* inv_std);

    /* GroupNormalization / InstanceNormalization on x [N, C, inner]: mean and variance over
       each (batch, group of C / G consecutive channels x inner), then
       y = (x - mean) * inv_std * scale[c] + bias[c] per channel (NULL: 1 / 0).
       G = C is InstanceNormalization. C must be a multiple of G (G >= 1); otherwise y is
       filled with NaN. */
    void ss_group_norm(const float* x, const float* scale, const float* bias, float* y,
                       int64_t N, int64_t C, int64_t G, int64_t inner, float eps);

    /* BatchNormalization inference on x [N, C, inner]:
       y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c] (scale, bias NULL: 1 / 0). */
    void ss_batchnorm(const float* x, const float* scale, const float* bias, const float* mean,
                      const float* var, float* y, int64_t N, int64_t C, int64_t inner, float eps);

Statistics take two passes over the data (the mean, then the squared deviations from it),
so a large mean does not cancel the variance away. Each pass sums in float vectors over
chunks and folds the chunk totals into a double, so rounding error stays small for long
rows at full vector speed. The output is written as (x - mean) * a + b, never x * a + b',
which would cancel when |mean| >> std. An empty row (n == 0) writes mean 0 and
inv_std 1 / sqrt(eps).
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Private, fill

DEPENDS = ("vmath",)

_DEFINES = """
#define SS_NORM_PAR_WORK @PAR_WORK@
#define SS_NORM_CHUNK @CHUNK@
"""

_HELPERS = r"""
/* ---- normalize: statistics ---- */
/* sum(x[i] - shift) (square = 0) or sum((x[i] - shift)^2) (square = 1), i < n, in double. */
static double ss_norm_sum(const float* x, int64_t n, float shift, int square) {
    double total = 0.0;
    int64_t i = 0;
#ifdef __AVX2__
    __m256 sv = _mm256_set1_ps(shift);
    int64_t n16 = n & ~(int64_t)15;
    for (int64_t c0 = 0; c0 < n16; c0 += SS_NORM_CHUNK) {
        int64_t c1 = c0 + SS_NORM_CHUNK < n16 ? c0 + SS_NORM_CHUNK : n16;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        for (i = c0; i < c1; i += 16) {
            __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + i), sv);
            __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), sv);
            if (square) {
                a0 = ss_fmadd8(d0, d0, a0);
                a1 = ss_fmadd8(d1, d1, a1);
            } else {
                a0 = _mm256_add_ps(a0, d0);
                a1 = _mm256_add_ps(a1, d1);
            }
        }
        total += (double)ss_hsum8(_mm256_add_ps(a0, a1));
    }
    i = n16;
#endif
    float tail = 0.0f;
    for (; i < n; i++) {
        float d = x[i] - shift;
        tail += square ? d * d : d;
    }
    return total + (double)tail;
}

/* Mean and 1 / sqrt(var + eps) of x[0, n). */
static void ss_norm_stats(const float* x, int64_t n, float eps, float* mean, float* inv_std) {
    double m = n > 0 ? ss_norm_sum(x, n, 0.0f, 0) / (double)n : 0.0;
    double v = n > 0 ? ss_norm_sum(x, n, (float)m, 1) / (double)n : 0.0;
    *mean = (float)m;
    *inv_std = (float)(1.0 / sqrt(v + (double)eps));
}

/* y[i] = (x[i] - m) * a * (scale ? scale[i] : 1) + (bias ? bias[i] : 0), i < n. */
static void ss_norm_apply_vec(const float* x, float* y, int64_t n, float m, float a,
                              const float* scale, const float* bias) {
    int64_t i = 0;
#ifdef __AVX2__
    __m256 mv = _mm256_set1_ps(m), av = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv), av);
        if (scale) v = _mm256_mul_ps(v, _mm256_loadu_ps(scale + i));
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + i));
        _mm256_storeu_ps(y + i, v);
    }
#endif
    for (; i < n; i++) {
        float v = (x[i] - m) * a;
        if (scale) v *= scale[i];
        if (bias) v += bias[i];
        y[i] = v;
    }
}

/* y[i] = (x[i] - m) * a + b, i < n. */
static void ss_norm_apply_affine(const float* x, float* y, int64_t n, float m, float a, float b) {
    int64_t i = 0;
#ifdef __AVX2__
    __m256 mv = _mm256_set1_ps(m), av = _mm256_set1_ps(a), bv = _mm256_set1_ps(b);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, ss_fmadd8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv), av, bv));
#endif
    for (; i < n; i++) y[i] = ss_fmaf(x[i] - m, a, b);
}

"""

_LAYERNORM = Function("void", "ss_layernorm", ("const float* x", "const float* scale", "const float* bias", "float* y",
                                               "int64_t rows", "int64_t n", "float eps", "float* mean",
                                               "float* inv_std"), r"""
    #pragma omp parallel for schedule(static) if(rows * n >= SS_NORM_PAR_WORK && rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        float m, is;
        ss_norm_stats(x + r * n, n, eps, &m, &is);
        ss_norm_apply_vec(x + r * n, y + r * n, n, m, is, scale, bias);
        if (mean) mean[r] = m;
        if (inv_std) inv_std[r] = is;
    }""", comment='---- normalize: exported kernels ----')

_GROUP_NORM = Function("void", "ss_group_norm", ("const float* x", "const float* scale", "const float* bias",
                                                 "float* y", "int64_t N", "int64_t C", "int64_t G", "int64_t inner",
                                                 "float eps"), r"""
    if (G <= 0 || C % G != 0) {
        for (int64_t i = 0; i < N * C * inner; i++) y[i] = NAN;
        return;
    }
    int64_t cpg = C / G;
    #pragma omp parallel for schedule(static) if(N * C * inner >= SS_NORM_PAR_WORK && N * G > 1)
    for (int64_t t = 0; t < N * G; t++) {
        int64_t c0 = (t % G) * cpg;
        const float* xs = x + t * cpg * inner;
        float* ys = y + t * cpg * inner;
        float m, is;
        ss_norm_stats(xs, cpg * inner, eps, &m, &is);
        for (int64_t k = 0; k < cpg; k++) {
            int64_t c = c0 + k;
            float a = scale ? is * scale[c] : is;
            ss_norm_apply_affine(xs + k * inner, ys + k * inner, inner, m, a, bias ? bias[c] : 0.0f);
        }
    }""")

_BATCHNORM = Function("void", "ss_batchnorm", ("const float* x", "const float* scale", "const float* bias",
                                               "const float* mean", "const float* var", "float* y", "int64_t N",
                                               "int64_t C", "int64_t inner", "float eps"), r"""
    #pragma omp parallel for schedule(static) if(N * C * inner >= SS_NORM_PAR_WORK && N * C > 1)
    for (int64_t t = 0; t < N * C; t++) {
        int64_t c = t % C;
        float a = (float)(1.0 / sqrt((double)var[c] + (double)eps));
        if (scale) a *= scale[c];
        ss_norm_apply_affine(x + t * inner, y + t * inner, inner, mean[c], a, bias ? bias[c] : 0.0f);
    }""")


def fragment(par_work: int = 1 << 15, chunk: int = 1024) -> Fragment:
    """The C fragment.

    par_work: elements of work from which a call runs in parallel; chunk: elements summed
    in float before folding into the double total (a multiple of 16).
    """
    if chunk <= 0 or chunk % 16:
        raise ValueError(f"chunk must be a positive multiple of 16, got {chunk}")
    if par_work < 0:
        raise ValueError("par_work must be non-negative")
    return Fragment([
        Private(fill(_DEFINES, PAR_WORK=int(par_work), CHUNK=int(chunk))),
        Private(_HELPERS),
        _LAYERNORM,
        _GROUP_NORM,
        _BATCHNORM,
    ])


def source(par_work: int = 1 << 15, chunk: int = 1024) -> str:
    return fragment(par_work, chunk).text()
