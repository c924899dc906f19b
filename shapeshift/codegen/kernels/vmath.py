"""Vector math helpers shared by the kernels and the generated fused elementwise loops.

``fragment()`` returns a header-only C fragment of ``static inline`` functions (nothing is
exported from the library: every unit that uses them sees them whole). Each vector helper
has a scalar twin that runs the same operations in the same order, so a loop's scalar tail
gives what its vector body would have given (bit for bit where the target has FMA), whatever
the length or alignment of the data.

Scalar (always defined)::

    float ss_fmaf(float a, float b, float c);   a*b + c, fused where the target has FMA
    float ss_expf(float x);       exp; overflow -> +inf, underflow -> 0 (subnormals kept)
    float ss_logf(float x);       log; 0 -> -inf, x < 0 -> NaN, +inf -> +inf
    float ss_tanhf(float x);
    float ss_erff(float x);
    float ss_sigmoidf(float x);   1 / (1 + exp(-x)), as e / (1 + e) with e = exp(x) for x < 0
    float ss_expf_times(float x, float m);   m * exp(x) for |m| <= 128, rounded once
    float ss_siluf(float x);      x * sigmoid(x), as x / (1 + exp(-x)) with one 2^n scaling
                                  (below -87.33, where exp(x) leaves the normal range, as
                                  x * exp(x) rounded once)
    float ss_geluf(float x);      x/2 (1 + erf(x / sqrt 2)) (ONNX Gelu)
    float ss_gelu_tanhf(float x); x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (approximate="tanh")
    float ss_maxf(a, b), ss_minf(a, b), ss_clampf(x, lo, hi);   NaN-propagating
    float ss_hard_sigmoidf(x, alpha, beta), ss_hard_swishf(x), ss_leaky_reluf(x, alpha),
          ss_softsignf(x);        ONNX's activations of those names
    float ss_actf(float v, int act);   a kernel epilogue's activation by code: 0 none,
                                       1 relu, 2 sigmoid, 3 silu (x * sigmoid(x))

AVX2 (defined only under ``#ifdef __AVX2__``; callers guard their vector paths the same way)::

    __m256 ss_fmadd8(__m256 a, __m256 b, __m256 c);
    __m256 ss_exp8(__m256 x);   __m256 ss_exp_times8(__m256 x, __m256 m);
    __m256 ss_exp_nonpos8(__m256 x);   ss_exp8 for x <= 0 or NaN (softmax's x - max), bit for
        bit, in two thirds of its operations where no lane is below ln(FLT_MIN)
    __m256 ss_log8(__m256 x);   __m256 ss_tanh8(__m256 x);
    __m256 ss_erf8(__m256 x);   __m256 ss_sigmoid8(__m256 x);   __m256 ss_silu8(__m256 x);
    __m256 ss_gelu8(__m256 x);  __m256 ss_gelu_tanh8(__m256 x);  __m256 ss_act8(__m256 v, int act);
    ss_max8, ss_min8, ss_clamp8, ss_hard_sigmoid8, ss_hard_swish8, ss_leaky_relu8, ss_softsign8
        (twins of the scalar helpers of those names)
    float ss_hsum8(__m256 v);   float ss_hmax8(__m256 v);   float ss_hmin8(__m256 v);
    __m512 ss_sigmoid16(__m512 x);   __m512 ss_silu16(__m512 x);   __m512 ss_act16(__m512 v, int act);
        (under ``#ifdef __AVX512F__`` too: 16-lane twins of ss_sigmoid8, ss_silu8, ss_act8,
        the same operations in the same order, so bit for bit the same results; a kernel
        epilogue's activation on zmm builds: the 8-lane SiLU took a third of a 3->16
        stride-2 conv's time on a 128x128 image, 47.5 us with no activation, 67.3 with it)
        (horizontal sum / max / min of the 8 lanes; hmax/hmin ignore NaN lanes only as
        _mm256_max_ps does, so callers that must propagate NaN track it themselves)

NaN inputs give NaN and +-inf give the limits (exp: +inf, 0; tanh, erf: +-1; sigmoid: 1, 0;
silu: +inf, and NaN for -inf, as -inf * sigmoid(-inf) = -inf * 0).
Accuracy, measured against float64 over dense sweeps (tests/codegen/test_kernels_vmath.py):
within 4e-7 relative (about 3 float32 ulps), or 1e-7 absolute where the result is tiny.

The polynomial coefficients are minimax fits (Lawson's iteratively reweighted least
squares in float64, weighted by the relative error of the final result) over:
exp: exp(r) = 1 + r + r^2 P(r), |r| <= ln2/2;  log: log(1+f) = f - f^2/2 + f^3 P(f),
f = m - 1 with m in [sqrt(1/2), sqrt(2));  tanh: x + x^3 P(x^2) for |x| < 0.625, else
1 - 2 / (exp(2|x|) + 1);  erf: x P(x^2) for |x| < 1, else 1 - exp(-x^2 + G(|x| - 2)) with
G fitted to log(erfc(x)) + x^2 on [1, 3.93] (beyond 3.93 erf rounds to 1 in float32).
"""

from __future__ import annotations

from typing import Sequence

from ..cwriter import CWriter, Fragment, Shared, fill

DEPENDS: tuple[str, ...] = ()

EXP_P = (0.5, 0.166666657, 0.0416662954, 0.00833349675, 0.00139446487, 0.00019790353)
LOG_P = (0.333333313, -0.250008196, 0.200012267, -0.166233569, 0.142017573, -0.131601825,
         0.127615765, -0.0763449669)
TANH_P = (-0.333332807, 0.133314416, -0.0537397154, 0.020639088, -0.00570498733)
ERF_SMALL_P = (1.12837911, -0.37612325, 0.112801805, -0.0267113186, 0.00491755921, -0.000563145091)
ERF_LARGE_P = (-1.364941, -0.418159395, 0.0762465149, -0.0164879039, 0.00354423258, -0.000711107976,
               0.000186379213)
# Where tanh and erf switch from the odd polynomial to the exp-based formula.
TANH_SWITCH = 0.625
ERF_SWITCH = 1.0
ERF_ONE = 3.93


def float_literal(v: float) -> str:
    """A C float literal that reads back as float32(v)."""
    text = f"{v:.9g}"
    return text + ("f" if any(c in text for c in ".en") else ".0f")


def horner(var: str, coeffs: Sequence[float], vector: bool, level: int, lanes: int = 8, out: str = "p") -> str:
    """C statements, ``level`` indents deep, leaving sum(coeffs[k] * var**k) in ``out``
    (declared here): scalar, or in vectors of ``lanes`` floats (8: ymm, 16: zmm). The
    recurrent gate updates (rnn_gates.py) write their polynomials with it too."""
    w = CWriter(level=level)
    if vector and lanes == 16:
        w.line(f"__m512 {out} = _mm512_set1_ps({float_literal(coeffs[-1])});")
        w.lines(f"{out} = _mm512_fmadd_ps({out}, {var}, _mm512_set1_ps({float_literal(c)}));"
                for c in reversed(coeffs[:-1]))
    elif vector:
        w.line(f"__m256 {out} = _mm256_set1_ps({float_literal(coeffs[-1])});")
        w.lines(f"{out} = ss_fmadd8({out}, {var}, _mm256_set1_ps({float_literal(c)}));" for c in reversed(coeffs[:-1]))
    else:
        w.line(f"float {out} = {float_literal(coeffs[-1])};")
        w.lines(f"{out} = ss_fmaf({out}, {var}, {float_literal(c)});" for c in reversed(coeffs[:-1]))
    return w.text().rstrip("\n")


# The scalar helpers; @EXP_P@ ... are the polynomials' Horner steps (_horner), @TANH_SWITCH@ ...
# the float literals of the constants of those names.
_SCALAR = r"""
/* ---- vmath: scalar helpers ---- */
static inline float ss_fmaf(float a, float b, float c) {
#ifdef __FMA__
    return fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

static inline float ss_bits_to_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t ss_float_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* exp(x) = y * 2^n with x = n ln2 + r, |r| <= ln2/2: the part exp and SiLU share. */
static inline float ss_expf_reduced(float x, float* n_out) {
    float n = rintf(x * 1.44269504f);
    float r = ss_fmaf(-n, 0.693145752f, x);
    r = ss_fmaf(-n, 1.42860677e-06f, r);
@EXP_P@
    *n_out = n;
    return ss_fmaf(p, r * r, r) + 1.0f;
}

/* m * exp(x) for |m| <= 128, rounded once at the end: a product in the subnormals keeps
   the bits it would have had (SiLU's x * exp(x) far left); m = 1 is exp. */
static inline float ss_expf_times(float x, float m) {
    if (x != x) return x + x;
    /* Clamped so that both halves of the 2^n scale stay normal floats: the product then
       overflows to inf or rounds once into the subnormals, as exp itself would (below
       -112, m * exp(x) < 128 * 2^-161 rounds to 0 either way). */
    float xc = x < -112.0f ? -112.0f : (x > 89.0f ? 89.0f : x);
    float n;
    float y = ss_expf_reduced(xc, &n);
    int32_t ni = (int32_t)n;
    int32_t n1 = ni >> 1, n2 = ni - n1;
    float s1 = ss_bits_to_float((uint32_t)(n1 + 127) << 23);
    float s2 = ss_bits_to_float((uint32_t)(n2 + 127) << 23);
    return ((y * m) * s1) * s2;
}

static inline float ss_expf(float x) { return ss_expf_times(x, 1.0f); }

static inline float ss_logf(float x) {
    if (x != x) return x + x;
    if (x < 0.0f) return NAN;
    if (x == 0.0f) return -INFINITY;
    if (x == INFINITY) return x;
    float e = 0.0f;
    if (x < FLT_MIN) { x *= 8388608.0f; e = -23.0f; }
    uint32_t u = ss_float_to_bits(x);
    e += (float)((int32_t)(u >> 23) - 127);
    float m = ss_bits_to_float((u & 0x007fffffu) | 0x3f800000u);
    if (m >= 1.41421354f) { m *= 0.5f; e += 1.0f; }
    float f = m - 1.0f;
    float z = f * f;
@LOG_P@
    float y = p * (z * f);
    y = ss_fmaf(e, -2.12194440e-4f, y);
    y = ss_fmaf(-0.5f, z, y);
    float r = f + y;
    return ss_fmaf(e, 0.693359375f, r);
}

static inline float ss_tanhf(float x) {
    float ax = fabsf(x);
    if (ax < @TANH_SWITCH@) {
        float z = x * x;
@TANH_P@
        /* tanh is odd: the sign of x also fixes tanh(-0) = -0, which the fma loses. */
        return copysignf(ss_fmaf(x * z, p, x), x);
    }
    float t = 1.0f - 2.0f / (ss_expf(2.0f * ax) + 1.0f);
    return copysignf(t, x);
}

static inline float ss_erff(float x) {
    if (x != x) return x + x;
    float ax = fabsf(x);
    if (ax < @ERF_SWITCH@) {
        float z = x * x;
@ERF_SMALL_P@
        return x * p;
    }
    float a = ax < @ERF_ONE@ ? ax : @ERF_ONE@;
    float t = a - 2.0f;
@ERF_LARGE_P@
    float y = 1.0f - ss_expf(ss_fmaf(-a, a, p));
    return copysignf(y, x);
}

/* exp(-|x|) never overflows, and e / (1 + e) keeps the tiny results of very negative x. */
static inline float ss_sigmoidf(float x) {
    float e = ss_expf(-fabsf(x));
    return (x < 0.0f ? e : 1.0f) / (1.0f + e);
}

/* SiLU for an activation epilogue, about a quarter cheaper than x * sigmoid(x): exp(-x)
   for x >= -87.33 is p(r) * 2^n with one scaling (n >= -126 stays normal), and
   x / (1 + e) keeps its relative accuracy however large e gets. */
static inline float ss_siluf(float x) {
    /* Far left sigmoid(x) is exp(x) to the last bit, and x * exp(x) is rounded once (into
       the subnormals); -inf gives NaN, as -inf * sigmoid(-inf) = -inf * 0 does. */
    if (x < -87.33f) return x == -INFINITY ? NAN : ss_expf_times(x, x < -128.0f ? -128.0f : x);
    if (x != x) return x + x;
    float u = -x < -87.33f ? -87.33f : -x;
    float n;
    float y = ss_expf_reduced(u, &n);
    return x / (1.0f + y * ss_bits_to_float((uint32_t)((int32_t)n + 127) << 23));
}

/* ONNX Gelu: x/2 (1 + erf(x / sqrt 2)), and its tanh approximation. */
static inline float ss_geluf(float x) {
    return (0.5f * x) * (1.0f + ss_erff(x * 0.7071067811865476f));
}

static inline float ss_gelu_tanhf(float x) {
    float u = ss_fmaf((0.044715f * x) * x, x, x);  /* x + 0.044715 x^3 */
    return (0.5f * x) * (1.0f + ss_tanhf(0.7978845608028654f * u));
}

/* Piecewise activations and NaN-propagating min / max, each the twin of its vector helper:
   a NaN input gives NaN (as onnxruntime's do), never a clamp bound. */
static inline float ss_maxf(float a, float b) { return (a != a || a > b) ? a : b; }
static inline float ss_minf(float a, float b) { return (a != a || a < b) ? a : b; }
static inline float ss_clampf(float x, float lo, float hi) {
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
}
static inline float ss_hard_sigmoidf(float x, float alpha, float beta) {
    return ss_clampf(ss_fmaf(alpha, x, beta), 0.0f, 1.0f);
}
static inline float ss_hard_swishf(float x) { return x * ss_hard_sigmoidf(x, 1.0f / 6.0f, 0.5f); }
static inline float ss_leaky_reluf(float x, float alpha) { return x >= 0.0f ? x : alpha * x; }
static inline float ss_softsignf(float x) { return x / (1.0f + fabsf(x)); }

/* The activation a kernel applies before its store (conv's act codes); twin of ss_act8. */
static inline float ss_actf(float v, int act) {
    switch (act) {
    case 1: return v < 0.0f ? 0.0f : v;  /* NaN stays NaN, as in ONNX's Relu */
    case 2: return ss_sigmoidf(v);
    case 3: return ss_siluf(v);
    default: return v;
    }
}
"""

# The AVX2 helpers, with markers as _SCALAR's.
_VECTOR = r"""
/* ---- vmath: AVX2 helpers (the scalar twins above run the same operations) ---- */
#ifdef __AVX2__
static inline __m256 ss_fmadd8(__m256 a, __m256 b, __m256 c) {
#ifdef __FMA__
    return _mm256_fmadd_ps(a, b, c);
#else
    return _mm256_add_ps(_mm256_mul_ps(a, b), c);
#endif
}

static inline __m256 ss_abs8(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }

static inline __m256 ss_copysign8(__m256 mag, __m256 sign) {
    __m256 s = _mm256_set1_ps(-0.0f);
    return _mm256_or_ps(_mm256_andnot_ps(s, mag), _mm256_and_ps(s, sign));
}

@EXP_CORE8@
static inline __m256 ss_exp8(__m256 x) { return ss_exp_times8(x, _mm256_set1_ps(1.0f)); }

/* ss_exp8 for x <= 0 or NaN, bit for bit. Where no lane lies below ln(FLT_MIN) every
   2^n is a normal float: ss_exp8's own reduction, then one scale, where ss_exp8 clamps both
   ends and splits 2^n in two for the subnormal range. The softmax sums' exponentials
   (ss_sm_row_sumexp: the fused attention's and Softmax's) spent about a third of the
   attention's time there. A lane below the bound takes ss_exp8 whole. */
static inline __m256 ss_exp_nonpos8(__m256 x) {
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.3365479f), _CMP_LT_OQ))) return ss_exp8(x);
    __m256 n;
    __m256 y = ss_exp_reduced8(x, &n);
    __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23)));
}

static inline __m256 ss_log8(__m256 x) {
    __m256 sub = _mm256_cmp_ps(x, _mm256_set1_ps(FLT_MIN), _CMP_LT_OQ);
    __m256 xs = _mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(8388608.0f)), sub);
    __m256 e = _mm256_and_ps(sub, _mm256_set1_ps(-23.0f));
    __m256i u = _mm256_castps_si256(xs);
    __m256i ei = _mm256_sub_epi32(_mm256_srli_epi32(u, 23), _mm256_set1_epi32(127));
    e = _mm256_add_ps(e, _mm256_cvtepi32_ps(ei));
    __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi32(0x007fffff)),
                                                   _mm256_set1_epi32(0x3f800000)));
    __m256 big = _mm256_cmp_ps(m, _mm256_set1_ps(1.41421354f), _CMP_GE_OQ);
    m = _mm256_blendv_ps(m, _mm256_mul_ps(m, _mm256_set1_ps(0.5f)), big);
    e = _mm256_add_ps(e, _mm256_and_ps(big, _mm256_set1_ps(1.0f)));
    __m256 f = _mm256_sub_ps(m, _mm256_set1_ps(1.0f));
    __m256 z = _mm256_mul_ps(f, f);
@LOG_P@
    __m256 y = _mm256_mul_ps(p, _mm256_mul_ps(z, f));
    y = ss_fmadd8(e, _mm256_set1_ps(-2.12194440e-4f), y);
    y = ss_fmadd8(_mm256_set1_ps(-0.5f), z, y);
    __m256 r = _mm256_add_ps(f, y);
    r = ss_fmadd8(e, _mm256_set1_ps(0.693359375f), r);
    /* NaN and x < 0 -> NaN; +-0 -> -inf; +inf -> +inf. */
    r = _mm256_blendv_ps(r, _mm256_set1_ps(NAN), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_NGE_UQ));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(-INFINITY), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_EQ_OQ));
    return _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ));
}

static inline __m256 ss_tanh8(__m256 x) {
    __m256 ax = ss_abs8(x);
    __m256 z = _mm256_mul_ps(x, x);
@TANH_P@
    __m256 small = ss_copysign8(ss_fmadd8(_mm256_mul_ps(x, z), p, x), x);
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = ss_exp8(_mm256_add_ps(ax, ax));
    __m256 large = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    large = ss_copysign8(large, x);
    return _mm256_blendv_ps(large, small, _mm256_cmp_ps(ax, _mm256_set1_ps(@TANH_SWITCH@), _CMP_LT_OQ));
}

static inline __m256 ss_erf8(__m256 x) {
    __m256 ax = ss_abs8(x);
    __m256 small, large;
    {
        __m256 z = _mm256_mul_ps(x, x);
@ERF_SMALL_P@
        small = _mm256_mul_ps(x, p);
    }
    {
        __m256 a = _mm256_min_ps(_mm256_set1_ps(@ERF_ONE@), ax);  /* keeps a NaN ax */
        __m256 t = _mm256_sub_ps(a, _mm256_set1_ps(2.0f));
@ERF_LARGE_P@
        __m256 na = _mm256_sub_ps(_mm256_setzero_ps(), a);
        /* The exponent, log(erfc(a)), is below -1.8 on [1, 3.93], so ss_exp_nonpos8 gives
           ss_exp8's bits in every lane the blend keeps (the others, |x| < 1, may be anything).
           GELU's erf over BERT-base's FFN activations, 128 x 3072, 1 thread, AMD Zen 4: 494 ->
           429 us, outputs bitwise equal. */
        large = _mm256_sub_ps(_mm256_set1_ps(1.0f), ss_exp_nonpos8(ss_fmadd8(na, a, p)));
        large = ss_copysign8(large, x);
    }
    return _mm256_blendv_ps(large, small, _mm256_cmp_ps(ax, _mm256_set1_ps(@ERF_SWITCH@), _CMP_LT_OQ));
}

/* Twins of ss_geluf and ss_gelu_tanhf, operation for operation. */
static inline __m256 ss_gelu8(__m256 x) {
    __m256 e = ss_erf8(_mm256_mul_ps(x, _mm256_set1_ps(0.7071067811865476f)));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

static inline __m256 ss_gelu_tanh8(__m256 x) {
    __m256 u = ss_fmadd8(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x), x), x, x);
    __m256 t = ss_tanh8(_mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f), u));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.0f), t));
}

static inline __m256 ss_sigmoid8(__m256 x) {
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = ss_exp8(_mm256_sub_ps(_mm256_setzero_ps(), ss_abs8(x)));
    __m256 num = _mm256_blendv_ps(one, e, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
    return _mm256_div_ps(num, _mm256_add_ps(one, e));
}

/* Twin of ss_siluf: lanes below -87.33 take its far-left route (computed only when a
   vector has such a lane, which an activation's input seldom does). */
static inline __m256 ss_silu8(__m256 x) {
    __m256 low = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33f), _CMP_LT_OQ);
    /* max returns its second operand when either is NaN: this order keeps a NaN -x. */
    __m256 u = _mm256_max_ps(_mm256_set1_ps(-87.33f), _mm256_sub_ps(_mm256_setzero_ps(), x));
    __m256 n;
    __m256 y = ss_exp_reduced8(u, &n);
    __m256 s = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                                      _mm256_set1_epi32(127)), 23));
    __m256 f = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(y, s)));
    if (!_mm256_movemask_ps(low)) return f;
    __m256 far = ss_exp_times8(x, _mm256_max_ps(x, _mm256_set1_ps(-128.0f)));
    far = _mm256_blendv_ps(far, _mm256_set1_ps(NAN), _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
    return _mm256_blendv_ps(f, far, low);
}

/* Twins of ss_maxf ... ss_softsignf. max_ps / min_ps return their second operand when
   either is NaN or both are zeros, which makes ss_clamp8 the ternaries of ss_clampf. */
static inline __m256 ss_max8(__m256 a, __m256 b) {
    __m256 take_a = _mm256_or_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), _mm256_cmp_ps(a, b, _CMP_GT_OQ));
    return _mm256_blendv_ps(b, a, take_a);
}
static inline __m256 ss_min8(__m256 a, __m256 b) {
    __m256 take_a = _mm256_or_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), _mm256_cmp_ps(a, b, _CMP_LT_OQ));
    return _mm256_blendv_ps(b, a, take_a);
}
static inline __m256 ss_clamp8(__m256 x, __m256 lo, __m256 hi) {
    return _mm256_min_ps(hi, _mm256_max_ps(lo, x));
}
static inline __m256 ss_hard_sigmoid8(__m256 x, float alpha, float beta) {
    return ss_clamp8(ss_fmadd8(_mm256_set1_ps(alpha), x, _mm256_set1_ps(beta)), _mm256_setzero_ps(),
                     _mm256_set1_ps(1.0f));
}
static inline __m256 ss_hard_swish8(__m256 x) { return _mm256_mul_ps(x, ss_hard_sigmoid8(x, 1.0f / 6.0f, 0.5f)); }
static inline __m256 ss_leaky_relu8(__m256 x, float alpha) {
    __m256 keep = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ);
    return _mm256_blendv_ps(_mm256_mul_ps(_mm256_set1_ps(alpha), x), x, keep);
}
static inline __m256 ss_softsign8(__m256 x) {
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), ss_abs8(x)));
}

static inline __m256 ss_act8(__m256 v, int act) {
    switch (act) {
    case 1: return _mm256_max_ps(_mm256_setzero_ps(), v);  /* the second operand where NaN: NaN stays */
    case 2: return ss_sigmoid8(v);
    case 3: return ss_silu8(v);
    default: return v;
    }
}

static inline float ss_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float ss_hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float ss_hmin8(__m256 v) {
    __m128 s = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_min_ps(s, _mm_movehl_ps(s, s));
    s = _mm_min_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
@ZMM@
#endif /* __AVX2__ */
"""

# The zmm twins of the epilogue activations (see the docstring), inside the AVX2 section.
_ZMM = r"""
#ifdef __AVX512F__
@EXP_CORE16@
static inline __m512 ss_sigmoid16(__m512 x) {
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 ax = _mm512_castsi512_ps(_mm512_andnot_si512(_mm512_castps_si512(_mm512_set1_ps(-0.0f)),
                                                        _mm512_castps_si512(x)));
    __m512 e = ss_exp_times16(_mm512_sub_ps(_mm512_setzero_ps(), ax), one);
    __m512 num = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), one, e);
    return _mm512_div_ps(num, _mm512_add_ps(one, e));
}

static inline __m512 ss_silu16(__m512 x) {
    __mmask16 low = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33f), _CMP_LT_OQ);
    /* max returns its second operand when either is NaN: this order keeps a NaN -x. */
    __m512 u = _mm512_max_ps(_mm512_set1_ps(-87.33f), _mm512_sub_ps(_mm512_setzero_ps(), x));
    __m512 n;
    __m512 y = ss_exp_reduced16(u, &n);
    __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n),
                                                                      _mm512_set1_epi32(127)), 23));
    __m512 f = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(y, s)));
    if (!low) return f;
    __m512 far = ss_exp_times16(x, _mm512_max_ps(x, _mm512_set1_ps(-128.0f)));
    far = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), far,
                               _mm512_set1_ps(NAN));
    return _mm512_mask_blend_ps(low, f, far);
}

static inline __m512 ss_act16(__m512 v, int act) {
    switch (act) {
    case 1: return _mm512_max_ps(_mm512_setzero_ps(), v);  /* the second operand where NaN: NaN stays */
    case 2: return ss_sigmoid16(v);
    case 3: return ss_silu16(v);
    default: return v;
    }
}
#endif /* __AVX512F__ */
"""


# exp's shared core in either width (``_exp_core``): the 8-lane functions and their 16-lane
# twins are these same operations in the same order, so they agree bit for bit.
_EXP_CORE = r"""/* exp(x) = y * 2^n, |r| <= ln2/2 (twin of ss_expf_reduced): exp's and SiLU's shared part. */
static inline @V@ ss_exp_reduced@N@(@V@ x, @V@* n_out) {
    @V@ n = @ROUND@(@P@mul_ps(x, @P@set1_ps(1.44269504f)),
                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    @V@ nn = @P@sub_ps(@P@setzero_ps(), n);
    @V@ r = @FMA@(nn, @P@set1_ps(0.693145752f), x);
    r = @FMA@(nn, @P@set1_ps(1.42860677e-06f), r);
@EXP_P@
    *n_out = n;
    return @P@add_ps(@FMA@(p, @P@mul_ps(r, r), r), @P@set1_ps(1.0f));
}

/* exp(x) * m, twin of ss_expf_times (ss_exp8 is m = 1). */
static inline @V@ ss_exp_times@N@(@V@ x, @V@ m) {
    /* max/min return their second operand when either is NaN: this order keeps a NaN x. */
    @V@ xc = @P@min_ps(@P@set1_ps(89.0f), @P@max_ps(@P@set1_ps(-112.0f), x));
    @V@ n;
    @V@ y = ss_exp_reduced@N@(xc, &n);
    @V@i ni = @P@cvtps_epi32(n);
    @V@i n1 = @P@srai_epi32(ni, 1);
    @V@i n2 = @P@sub_epi32(ni, n1);
    @V@i bias = @P@set1_epi32(127);
    @V@ s1 = @CAST@(@P@slli_epi32(@P@add_epi32(n1, bias), 23));
    @V@ s2 = @CAST@(@P@slli_epi32(@P@add_epi32(n2, bias), 23));
    return @P@mul_ps(@P@mul_ps(@P@mul_ps(y, m), s1), s2);
}
"""


def _exp_core(lanes: int) -> str:
    """ss_exp_reduced<lanes> and ss_exp_times<lanes> in ymm (8) or zmm (16) vectors."""
    if lanes == 16:
        return fill(_EXP_CORE, V="__m512", N=16, P="_mm512_", ROUND="_mm512_roundscale_ps", FMA="_mm512_fmadd_ps",
                    CAST="_mm512_castsi512_ps", EXP_P=horner("r", EXP_P, True, 1, lanes=16))
    return fill(_EXP_CORE, V="__m256", N=8, P="_mm256_", ROUND="_mm256_round_ps", FMA="ss_fmadd8",
                CAST="_mm256_castsi256_ps", EXP_P=horner("r", EXP_P, True, 1))


def fragment() -> Fragment:
    """The C fragment, header-only (every unit inlines these): scalar helpers, then the AVX2
    helpers under ``#ifdef __AVX2__``."""
    literals = dict(TANH_SWITCH=float_literal(TANH_SWITCH), ERF_SWITCH=float_literal(ERF_SWITCH), ERF_ONE=float_literal(ERF_ONE))
    scalar = fill(_SCALAR, **literals, EXP_P=horner("r", EXP_P, False, 1), LOG_P=horner("f", LOG_P, False, 1),
                  TANH_P=horner("z", TANH_P, False, 2), ERF_SMALL_P=horner("z", ERF_SMALL_P, False, 2),
                  ERF_LARGE_P=horner("t", ERF_LARGE_P, False, 1))
    vector = fill(_VECTOR, **literals, EXP_CORE8=_exp_core(8), LOG_P=horner("f", LOG_P, True, 1),
                  TANH_P=horner("z", TANH_P, True, 1), ERF_SMALL_P=horner("z", ERF_SMALL_P, True, 2),
                  ERF_LARGE_P=horner("t", ERF_LARGE_P, True, 2),
                  ZMM=fill(_ZMM, EXP_CORE16=_exp_core(16)))
    # Guarded: a unit that has vmath declared may also hold a tuned kernel's copy of a
    # fragment that brings it along (kernels/conv_tuned.py).
    return Fragment([Shared("#ifndef SS_VMATH_INCLUDED\n#define SS_VMATH_INCLUDED\n"), Shared(scalar),
                     Shared(vector), Shared("#endif /* SS_VMATH_INCLUDED */\n")])


def source() -> str:
    return fragment().text()
