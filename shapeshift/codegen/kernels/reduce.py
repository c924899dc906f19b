"""Reductions, ArgMax/ArgMin and (Log)Softmax along the middle axis of a [outer, n, inner] view.

``fragment(...)`` assembles the C fragment (``source`` its text); it needs vmath (``ss_exp8``, ``ss_expf``).
Exported C signatures::

    /* Reduce the middle axis of x viewed as [outer, n, inner] into y [outer, inner].
       kind: 0 sum, 1 mean, 2 max, 3 min, 4 prod, 5 sum_square, 6 l1, 7 l2, 8 log_sum,
       9 log_sum_exp (any other kind fills y with NaN). n == 0 gives ONNX's empty
       reduction: 0 (sum, sum_square, l1, l2), -inf (max, log_sum, log_sum_exp), +inf
       (min), 1 (prod); and 0 for mean, which ONNX leaves undefined: onnxruntime's value
       (the sum over max(n, 1)), as the reference backend gives, not NumPy's NaN. NaN
       propagates through max/min (like numpy); log_sum_exp of a slice whose max is +-inf
       is that max. */
    void ss_reduce(int kind, const float* x, float* y, int64_t outer, int64_t n, int64_t inner);

    /* Index of the max/min along the middle axis of [outer, n, inner]; the first
       occurrence, or the last if select_last; NaN counts as the extreme (numpy's rule).
       n == 0 (no index exists) writes 0. */
    void ss_argmax(const float* x, int64_t* y, int64_t outer, int64_t n, int64_t inner, int select_last);
    void ss_argmin(const float* x, int64_t* y, int64_t outer, int64_t n, int64_t inner, int select_last);

    /* Softmax (log = 0) or LogSoftmax (log = 1) along the middle axis of [outer, n, inner],
       y of the same shape; the max is subtracted first, so large inputs do not overflow. */
    void ss_softmax(const float* x, float* y, int64_t outer, int64_t n, int64_t inner, int log);

Two paths: inner == 1 reduces contiguous rows with 4 vector accumulators across n; inner > 1
keeps one accumulator per column and walks the rows, 32 columns (4 vectors) per block, with
masked loads for the last columns. Sums are accumulated in two levels (chunks of rows, then
the chunk totals), so rounding error grows with chunk + n / chunk rather than n.
OpenMP splits rows (inner == 1) or (outer, column block) pairs when the work is large.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cwriter import Fragment, Function, Private, Shared, fill

DEPENDS = ("vmath",)

KINDS = ("sum", "mean", "max", "min", "prod", "sum_square", "l1", "l2", "log_sum", "log_sum_exp")


@dataclass(frozen=True)
class _Acc:
    """How one accumulator maps and combines values (kinds share accumulators)."""

    name: str
    init: str
    vmap: str  # vector map of `v`
    smap: str  # scalar map of `v`
    vcomb: str  # vector combine of `a`, `b`
    scomb: str  # scalar combine of `a`, `b`
    track_nan: bool = False  # max/min: _mm256_max_ps drops NaN, so it is tracked aside


_ACCS = (
    _Acc("sum", "0.0f", "v", "v", "_mm256_add_ps(a, b)", "a + b"),
    _Acc("sumsq", "0.0f", "_mm256_mul_ps(v, v)", "v * v", "_mm256_add_ps(a, b)", "a + b"),
    _Acc("sumabs", "0.0f", "ss_abs8(v)", "fabsf(v)", "_mm256_add_ps(a, b)", "a + b"),
    _Acc("prod", "1.0f", "v", "v", "_mm256_mul_ps(a, b)", "a * b"),
    _Acc("max", "-INFINITY", "v", "v", "_mm256_max_ps(a, b)", "(a > b ? a : b)", True),
    _Acc("min", "INFINITY", "v", "v", "_mm256_min_ps(a, b)", "(a < b ? a : b)", True),
)
# kind -> accumulator; the finishing step per kind is in ss_red_finish.
_KIND_ACC = {0: "sum", 1: "sum", 2: "max", 3: "min", 4: "prod", 5: "sumsq", 6: "sumabs", 7: "sumsq", 8: "sum"}


def _expr(pattern: str, **operands: str) -> str:
    """Substitute whole-word operands (v, a, b) in a map/combine pattern."""
    import re

    return re.sub(r"\b(v|a|b)\b", lambda m: operands.get(m.group(1), m.group(1)), pattern)


def _acc_source(acc: _Acc) -> str:
    def vstep(target: str, value: str) -> str:
        return f"{target} = {_expr(acc.vcomb, a=target, b=_expr(acc.vmap, v=value))};"

    def vcomb(a: str, b: str) -> str:
        return _expr(acc.vcomb, a=a, b=b)

    nan4 = ("bad = _mm256_or_ps(bad, _mm256_or_ps(_mm256_cmp_ps(v0, v1, _CMP_UNORD_Q), "
            "_mm256_cmp_ps(v2, v3, _CMP_UNORD_Q)));") if acc.track_nan else ""
    nan1 = "bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));" if acc.track_nan else ""
    nans = "if (v != v) nan = 1;" if acc.track_nan else ""
    cols4_nan = "".join(f"bad{k} = _mm256_or_ps(bad{k}, _mm256_cmp_ps(v{k}, v{k}, _CMP_UNORD_Q)); "
                        for k in range(4)) if acc.track_nan else ""
    cols4_fix = "".join(f"t{k} = _mm256_blendv_ps(t{k}, _mm256_set1_ps(NAN), bad{k}); "
                        for k in range(4)) if acc.track_nan else ""
    cols1_nan = "bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));" if acc.track_nan else ""
    cols1_fix = "t = _mm256_blendv_ps(t, _mm256_set1_ps(NAN), bad);" if acc.track_nan else ""
    return fill(r"""
/* ---- reduce: accumulator @A@ ---- */
/* inline, so that units including this fragment can call it (the fused attention does). */
static inline float ss_red_row_@A@(const float* x, int64_t n) {
    float acc = @INIT@;
    int nan = 0;
    int64_t i = 0;
#ifdef __AVX2__
    if (n >= 8) {
        __m256 tot = _mm256_set1_ps(@INIT@), bad = _mm256_setzero_ps();
        int64_t n32 = n & ~(int64_t)31;
        for (int64_t c0 = 0; c0 < n32; c0 += SS_RED_ROW_CHUNK) {
            int64_t c1 = c0 + SS_RED_ROW_CHUNK < n32 ? c0 + SS_RED_ROW_CHUNK : n32;
            __m256 a0 = _mm256_set1_ps(@INIT@), a1 = a0, a2 = a0, a3 = a0;
            for (i = c0; i < c1; i += 32) {
                __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
                __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
                @NAN4@
                @STEP0@ @STEP1@ @STEP2@ @STEP3@
            }
            tot = @TOTCOMB@;
        }
        for (i = n32; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            @NAN1@
            @STEPV@
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, tot);
        acc = lanes[0];
        for (int k = 1; k < 8; k++) { float a = acc, b = lanes[k]; acc = @SCOMB@; }
        nan = _mm256_movemask_ps(bad) != 0;
    }
#endif
    for (; i < n; i++) {
        float v = x[i];
        @NANS@
        float a = acc, b = @SMAP@;
        acc = @SCOMB@;
    }
    return nan ? NAN : acc;
}

/* Raw accumulators of columns [0, w) of rows x[j * stride], j < n, into out[0, w). */
static void ss_red_cols_@A@(const float* x, float* out, int64_t n, int64_t stride, int64_t w) {
#ifdef __AVX2__
    if (w == 32) {
        __m256 t0 = _mm256_set1_ps(@INIT@), t1 = t0, t2 = t0, t3 = t0;
        __m256 bad0 = _mm256_setzero_ps(), bad1 = bad0, bad2 = bad0, bad3 = bad0;
        for (int64_t j0 = 0; j0 < n; j0 += SS_RED_COL_CHUNK) {
            int64_t j1 = j0 + SS_RED_COL_CHUNK < n ? j0 + SS_RED_COL_CHUNK : n;
            __m256 a0 = _mm256_set1_ps(@INIT@), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t j = j0; j < j1; j++) {
                const float* r = x + j * stride;
                __m256 v0 = _mm256_loadu_ps(r), v1 = _mm256_loadu_ps(r + 8);
                __m256 v2 = _mm256_loadu_ps(r + 16), v3 = _mm256_loadu_ps(r + 24);
                @COLS4NAN@
                @STEP0@ @STEP1@ @STEP2@ @STEP3@
            }
            t0 = @T0@; t1 = @T1@; t2 = @T2@; t3 = @T3@;
        }
        (void)bad0; (void)bad1; (void)bad2; (void)bad3;
        @COLS4FIX@
        _mm256_storeu_ps(out, t0); _mm256_storeu_ps(out + 8, t1);
        _mm256_storeu_ps(out + 16, t2); _mm256_storeu_ps(out + 24, t3);
        return;
    }
    for (int64_t g = 0; g < w; g += 8) {
        __m256i mask = ss_red_lane_mask(w - g);
        __m256 t = _mm256_set1_ps(@INIT@), bad = _mm256_setzero_ps();
        for (int64_t j0 = 0; j0 < n; j0 += SS_RED_COL_CHUNK) {
            int64_t j1 = j0 + SS_RED_COL_CHUNK < n ? j0 + SS_RED_COL_CHUNK : n;
            __m256 a0 = _mm256_set1_ps(@INIT@);
            for (int64_t j = j0; j < j1; j++) {
                __m256 v = _mm256_maskload_ps(x + j * stride + g, mask);
                @COLS1NAN@
                @STEPA0@
            }
            t = @TCOMB@;
        }
        (void)bad;
        @COLS1FIX@
        _mm256_maskstore_ps(out + g, mask, t);
    }
#else
    for (int64_t c = 0; c < w; c++) {
        float acc = @INIT@;
        int nan = 0;
        for (int64_t j = 0; j < n; j++) {
            float v = x[j * stride + c];
            @NANS@
            float a = acc, b = @SMAP@;
            acc = @SCOMB@;
        }
        out[c] = nan ? NAN : acc;
    }
#endif
}

static void ss_reduce_@A@(int kind, const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
    if (inner == 1) {
        #pragma omp parallel for schedule(static) if(outer * n >= SS_RED_PAR_WORK && outer > 1)
        for (int64_t o = 0; o < outer; o++) y[o] = ss_red_finish(kind, ss_red_row_@A@(x + o * n, n), n);
        return;
    }
    int64_t nb = (inner + 31) / 32;
    #pragma omp parallel for schedule(static) if(outer * n * inner >= SS_RED_PAR_WORK && outer * nb > 1)
    for (int64_t t = 0; t < outer * nb; t++) {
        int64_t o = t / nb, c0 = (t % nb) * 32;
        int64_t w = inner - c0 < 32 ? inner - c0 : 32;
        float* ys = y + o * inner + c0;
        ss_red_cols_@A@(x + o * n * inner + c0, ys, n, inner, w);
        for (int64_t c = 0; c < w; c++) ys[c] = ss_red_finish(kind, ys[c], n);
    }
}
""", A=acc.name, INIT=acc.init, NAN4=nan4, NAN1=nan1, NANS=nans, COLS4NAN=cols4_nan, COLS4FIX=cols4_fix,
                COLS1NAN=cols1_nan, COLS1FIX=cols1_fix,
                STEP0=vstep("a0", "v0"), STEP1=vstep("a1", "v1"), STEP2=vstep("a2", "v2"), STEP3=vstep("a3", "v3"),
                STEPV=vstep("tot", "v"), STEPA0=vstep("a0", "v"),
                TOTCOMB=vcomb("tot", vcomb(vcomb("a0", "a1"), vcomb("a2", "a3"))),
                T0=vcomb("t0", "a0"), T1=vcomb("t1", "a1"), T2=vcomb("t2", "a2"), T3=vcomb("t3", "a3"),
                TCOMB=vcomb("t", "a0"), SMAP=_expr(acc.smap, v="v"), SCOMB=acc.scomb)


_COMMON = r"""
/* ---- reduce: shared helpers ---- */
#ifdef __AVX2__
/* Lanes [0, min(count, 8)) on. */
static inline __m256i ss_red_lane_mask(int64_t count) {
    int c = count < 8 ? (int)count : 8;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

/* The kind's value from its raw accumulator over n elements. */
static inline float ss_red_finish(int kind, float acc, int64_t n) {
    switch (kind) {
        case 1: return n > 0 ? acc / (float)n : 0.0f;  /* an empty mean: 0, as onnxruntime */
        case 7: return sqrtf(acc);
        case 8: return logf(acc);
        default: return acc;
    }
}
"""

_SOFTMAX = r"""
/* ---- reduce: exp sums shared by log_sum_exp and softmax ---- */
/* sum(exp(x[i] - m)), i < n; stores each exp into y unless y is NULL. */
/* inline, so that units including this fragment can call it (the fused attention does). */
static inline float ss_sm_row_sumexp(const float* x, float* y, int64_t n, float m) {
    int64_t i = 0;
    float s = 0.0f;
#ifdef __AVX2__
    __m256 mv = _mm256_set1_ps(m), s0 = _mm256_setzero_ps(), s1 = s0;
    for (; i + 16 <= n; i += 16) {
        __m256 e0 = ss_exp_nonpos8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        __m256 e1 = ss_exp_nonpos8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), mv));
        if (y) { _mm256_storeu_ps(y + i, e0); _mm256_storeu_ps(y + i + 8, e1); }
        s0 = _mm256_add_ps(s0, e0);
        s1 = _mm256_add_ps(s1, e1);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 e0 = ss_exp_nonpos8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        if (y) _mm256_storeu_ps(y + i, e0);
        s0 = _mm256_add_ps(s0, e0);
    }
    s = ss_hsum8(_mm256_add_ps(s0, s1));
#endif
    for (; i < n; i++) {
        float e = ss_expf(x[i] - m);
        if (y) y[i] = e;
        s += e;
    }
    return s;
}

"""

# Private: the rest of softmax and log_sum_exp.
_SOFTMAX_PRIVATE = r"""
/* y[i] = (x[i] - m) - c for log = 1, else y[i] *= c (x unused). */
static void ss_sm_row_finish(const float* x, float* y, int64_t n, float m, float c, int log) {
    int64_t i = 0;
#ifdef __AVX2__
    __m256 mv = _mm256_set1_ps(m), cv = _mm256_set1_ps(c);
    if (log) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv), cv));
    } else {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), cv));
    }
#endif
    for (; i < n; i++) y[i] = log ? (x[i] - m) - c : y[i] * c;
}

/* Per column c < w of rows x[j * stride]: s[c] = sum_j exp(x - m[c]); stores the exps into
   y (same layout) unless y is NULL. */
static void ss_sm_cols_sumexp(const float* x, float* y, int64_t n, int64_t stride, int64_t w,
                              const float* m, float* s) {
    int64_t g = 0;
#ifdef __AVX2__
    for (; g < w; g += 8) {
        __m256i mask = ss_red_lane_mask(w - g);
        __m256 mv = _mm256_maskload_ps(m + g, mask), t = _mm256_setzero_ps();
        for (int64_t j = 0; j < n; j++) {
            __m256 e = ss_exp8(_mm256_sub_ps(_mm256_maskload_ps(x + j * stride + g, mask), mv));
            if (y) _mm256_maskstore_ps(y + j * stride + g, mask, e);
            t = _mm256_add_ps(t, e);
        }
        _mm256_maskstore_ps(s + g, mask, t);
    }
#endif
    for (; g < w; g++) {
        float t = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            float e = ss_expf(x[j * stride + g] - m[g]);
            if (y) y[j * stride + g] = e;
            t += e;
        }
        s[g] = t;
    }
}

static inline float ss_lse_finish(float m, float s) { return isfinite(m) ? m + logf(s) : m; }

static void ss_reduce_lse(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
    if (inner == 1) {
        #pragma omp parallel for schedule(static) if(outer * n >= SS_RED_PAR_WORK && outer > 1)
        for (int64_t o = 0; o < outer; o++) {
            float m = ss_red_row_max(x + o * n, n);
            y[o] = isfinite(m) ? ss_lse_finish(m, ss_sm_row_sumexp(x + o * n, NULL, n, m)) : m;
        }
        return;
    }
    int64_t nb = (inner + 31) / 32;
    #pragma omp parallel for schedule(static) if(outer * n * inner >= SS_RED_PAR_WORK && outer * nb > 1)
    for (int64_t t = 0; t < outer * nb; t++) {
        int64_t o = t / nb, c0 = (t % nb) * 32;
        int64_t w = inner - c0 < 32 ? inner - c0 : 32;
        const float* xs = x + o * n * inner + c0;
        float m[32], s[32];
        ss_red_cols_max(xs, m, n, inner, w);
        ss_sm_cols_sumexp(xs, NULL, n, inner, w, m, s);
        for (int64_t c = 0; c < w; c++) y[o * inner + c0 + c] = ss_lse_finish(m[c], s[c]);
    }
}

"""

_SOFTMAX_BODY = r"""
    if (n == 0) return;
    if (inner == 1) {
        #pragma omp parallel for schedule(static) if(outer * n >= SS_RED_PAR_WORK && outer > 1)
        for (int64_t o = 0; o < outer; o++) {
            const float* xr = x + o * n;
            float* yr = y + o * n;
            float m = ss_red_row_max(xr, n);
            float s = ss_sm_row_sumexp(xr, log ? NULL : yr, n, m);
            ss_sm_row_finish(xr, yr, n, m, log ? logf(s) : 1.0f / s, log);
        }
        return;
    }
    int64_t nb = (inner + 31) / 32;
    #pragma omp parallel for schedule(static) if(outer * n * inner >= SS_RED_PAR_WORK && outer * nb > 1)
    for (int64_t t = 0; t < outer * nb; t++) {
        int64_t o = t / nb, c0 = (t % nb) * 32;
        int64_t w = inner - c0 < 32 ? inner - c0 : 32;
        const float* xs = x + o * n * inner + c0;
        float* ys = y + o * n * inner + c0;
        float m[32], s[32], c[32];
        ss_red_cols_max(xs, m, n, inner, w);
        ss_sm_cols_sumexp(xs, log ? NULL : ys, n, inner, w, m, s);
        for (int64_t k = 0; k < w; k++) c[k] = log ? logf(s[k]) : 1.0f / s[k];
        for (int64_t j = 0; j < n; j++) {
            const float* xr = xs + j * inner;
            float* yr = ys + j * inner;
            if (log) for (int64_t k = 0; k < w; k++) yr[k] = (xr[k] - m[k]) - c[k];
            else for (int64_t k = 0; k < w; k++) yr[k] *= c[k];
        }
    }
"""

_REDUCE_BODY = r"""
    switch (kind) {
        case 0: case 1: case 8: ss_reduce_sum(kind, x, y, outer, n, inner); return;
        case 2: ss_reduce_max(kind, x, y, outer, n, inner); return;
        case 3: ss_reduce_min(kind, x, y, outer, n, inner); return;
        case 4: ss_reduce_prod(kind, x, y, outer, n, inner); return;
        case 5: case 7: ss_reduce_sumsq(kind, x, y, outer, n, inner); return;
        case 6: ss_reduce_sumabs(kind, x, y, outer, n, inner); return;
        case 9: ss_reduce_lse(x, y, outer, n, inner); return;
        default:
            for (int64_t i = 0; i < outer * inner; i++) y[i] = NAN;
    }
"""

_ARG = r"""
/* ---- reduce: arg@D@ ---- */
/* Whether v replaces the current best b (NaN is the extreme; ties go to the first or last). */
static inline int ss_arg_better_@D@(float v, float b, int last) {
    int vn = v != v, bn = b != b;
    return last ? (vn || (!bn && v @GE@ b)) : (!bn && (vn || v @GT@ b));
}

static int64_t ss_arg_row_@D@(const float* x, int64_t n, int last) {
    /* The extreme first (NaN if any), then the first or last position holding it. */
    float m = ss_red_row_@D@(x, n);
    int mn = m != m;
    if (!last) {
        int64_t i = 0;
#ifdef __AVX2__
        __m256 mv = _mm256_set1_ps(m);
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            int bits = _mm256_movemask_ps(mn ? _mm256_cmp_ps(v, v, _CMP_UNORD_Q) : _mm256_cmp_ps(v, mv, _CMP_EQ_OQ));
            if (bits) return i + __builtin_ctz((unsigned)bits);
        }
#endif
        for (; i < n; i++) if (mn ? x[i] != x[i] : x[i] == m) return i;
    } else {
        int64_t i = n;
#ifdef __AVX2__
        __m256 mv = _mm256_set1_ps(m);
        for (; i >= 8; i -= 8) {
            __m256 v = _mm256_loadu_ps(x + i - 8);
            int bits = _mm256_movemask_ps(mn ? _mm256_cmp_ps(v, v, _CMP_UNORD_Q) : _mm256_cmp_ps(v, mv, _CMP_EQ_OQ));
            if (bits) return i - 8 + 31 - __builtin_clz((unsigned)bits);
        }
#endif
        for (; i > 0; i--) if (mn ? x[i - 1] != x[i - 1] : x[i - 1] == m) return i - 1;
    }
    return 0;
}

/* Best index per column c < w of rows x[j * stride], j < n (n >= 1), into y[c]. */
static void ss_arg_cols_@D@(const float* x, int64_t* y, int64_t n, int64_t stride, int64_t w, int last) {
    int64_t g = 0;
#ifdef __AVX2__
    if (n <= INT32_MAX) {
        for (; g < w; g += 8) {
            __m256i mask = ss_red_lane_mask(w - g);
            __m256 best = _mm256_maskload_ps(x + g, mask);
            __m256 bnan = _mm256_cmp_ps(best, best, _CMP_UNORD_Q);
            __m256i bi = _mm256_setzero_si256(), idx = bi, one = _mm256_set1_epi32(1);
            for (int64_t j = 1; j < n; j++) {
                __m256 v = _mm256_maskload_ps(x + j * stride + g, mask);
                __m256 vnan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
                __m256 upd = last ? _mm256_or_ps(_mm256_cmp_ps(v, best, @GE_OQ@), vnan)
                                  : _mm256_or_ps(_mm256_cmp_ps(v, best, @GT_OQ@), _mm256_andnot_ps(bnan, vnan));
                idx = _mm256_add_epi32(idx, one);
                best = _mm256_blendv_ps(best, v, upd);
                bi = _mm256_blendv_epi8(bi, idx, _mm256_castps_si256(upd));
                bnan = _mm256_or_ps(bnan, vnan);
            }
            int32_t lanes[8];
            _mm256_storeu_si256((__m256i*)lanes, bi);
            for (int64_t c = 0; c < 8 && g + c < w; c++) y[g + c] = lanes[c];
        }
    }
#endif
    for (; g < w; g++) {
        float b = x[g];
        int64_t bi = 0;
        for (int64_t j = 1; j < n; j++) {
            float v = x[j * stride + g];
            if (ss_arg_better_@D@(v, b, last)) { b = v; bi = j; }
        }
        y[g] = bi;
    }
}

"""

_ARG_BODY = r"""
    if (n == 0) {
        for (int64_t i = 0; i < outer * inner; i++) y[i] = 0;
        return;
    }
    if (inner == 1) {
        #pragma omp parallel for schedule(static) if(outer * n >= SS_RED_PAR_WORK && outer > 1)
        for (int64_t o = 0; o < outer; o++) y[o] = ss_arg_row_@D@(x + o * n, n, select_last);
        return;
    }
    int64_t nb = (inner + 15) / 16;
    #pragma omp parallel for schedule(static) if(outer * n * inner >= SS_RED_PAR_WORK && outer * nb > 1)
    for (int64_t t = 0; t < outer * nb; t++) {
        int64_t o = t / nb, c0 = (t % nb) * 16;
        int64_t w = inner - c0 < 16 ? inner - c0 : 16;
        ss_arg_cols_@D@(x + o * n * inner + c0, y + o * inner + c0, n, inner, w, select_last);
    }
"""


_REDUCE_PARAMS = ("const float* x", "float* y", "int64_t outer", "int64_t n", "int64_t inner")
_DIRECTIONS = (("max", ">=", ">", "_CMP_GE_OQ", "_CMP_GT_OQ"), ("min", "<=", "<", "_CMP_LE_OQ", "_CMP_LT_OQ"))
# Where an accumulator's text turns from the row kernel (shared) to the column kernels (private).
_COLS_START = "/* Raw accumulators of columns"


def source(par_work: int = 1 << 15, row_chunk: int = 1024, col_chunk: int = 128) -> str:
    """The C fragment's text (``fragment``)."""
    return fragment(par_work, row_chunk, col_chunk).text()


def fragment(par_work: int = 1 << 15, row_chunk: int = 1024, col_chunk: int = 128) -> Fragment:
    """The C fragment (codegen/cwriter.py).

    par_work: elements of work from which a call runs in parallel; row_chunk: elements of a
    contiguous row summed before folding into the row total (a multiple of 32); col_chunk:
    rows summed per column before folding into the column total.

    Shared with the units that call it: the row kernels (``ss_red_row_<acc>``) and
    ``ss_sm_row_sumexp``, which the fused attention inlines, with the macros and helpers they
    use; the column kernels and the drivers are private; the entry points are descriptors.
    """
    if row_chunk <= 0 or row_chunk % 32:
        raise ValueError(f"row_chunk must be a positive multiple of 32, got {row_chunk}")
    if col_chunk <= 0 or par_work < 0:
        raise ValueError("col_chunk must be positive and par_work non-negative")
    defines = (f"\n#define SS_RED_PAR_WORK {int(par_work)}\n#define SS_RED_ROW_CHUNK {int(row_chunk)}\n"
               f"#define SS_RED_COL_CHUNK {int(col_chunk)}\n")
    parts: list = [Shared(defines), Shared(_COMMON)]
    for acc in _ACCS:
        text = _acc_source(acc)
        cut = text.index(_COLS_START)
        parts += [Shared(text[:cut]), Private(text[cut:])]
    parts += [Shared(_SOFTMAX), Private(_SOFTMAX_PRIVATE),
              Function("void", "ss_softmax", (*_REDUCE_PARAMS, "int log"), _SOFTMAX_BODY),
              Function("void", "ss_reduce", ("int kind", *_REDUCE_PARAMS), _REDUCE_BODY)]
    for d, ge, gt, geo, gto in _DIRECTIONS:
        parts += [Private(fill(_ARG, D=d, GE=ge, GT=gt, GE_OQ=geo, GT_OQ=gto)),
                  Function("void", f"ss_arg{d}", ("const float* x", "int64_t* y", "int64_t outer", "int64_t n",
                                                  "int64_t inner", "int select_last"), fill(_ARG_BODY, D=d))]
    return Fragment(parts)
