"""Convolution and transposed convolution kernels (ONNX Conv / ConvTranspose, NCHW float32).

Exported C::

    /* 2-D convolution (1-D is H = 1, KH = 1): x [N, C, H, W], w [M, C/group, KH, KW],
       bias NULL or [M], y [N, M, OH, OW]. Begin pads ph, pw (the end pads are implied by
       OH, OW, which the caller computes); strides sh, sw; dilations dh, dw; group >= 1.
       act: 0 none, 1 relu, 2 sigmoid, 3 silu (x * sigmoid(x)), applied after the bias.
       work: scratch of at least ss_conv2d_work_size(...) floats (NULL when that is 0). */
    int64_t ss_conv2d_work_size(int64_t C, int64_t KH, int64_t KW, int64_t OH, int64_t OW, int64_t group);
    void ss_conv2d(const float* x, const float* w, const float* bias, float* y,
                   int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW,
                   int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                   int64_t dh, int64_t dw, int64_t group, int act, float* work);

    /* Transposed 2-D convolution: x [N, C, H, W], w [C, M/group, KH, KW], bias NULL or [M],
       y [N, M, OH, OW]; begin pads ph, pw; strides; dilations; group >= 1. output_padding
       and the end pads are implied by OH, OW. work: at least
       ss_conv_transpose2d_work_size(...) floats. */
    int64_t ss_conv_transpose2d_work_size(int64_t C, int64_t M, int64_t KH, int64_t KW,
                                          int64_t H, int64_t W, int64_t group);
    void ss_conv_transpose2d(const float* x, const float* w, const float* bias, float* y,
                             int64_t N, int64_t C, int64_t H, int64_t W, int64_t M,
                             int64_t KH, int64_t KW, int64_t OH, int64_t OW,
                             int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                             int64_t dh, int64_t dw, int64_t group, float* work);

Strategy of ss_conv2d: a 1x1, stride-1, unpadded conv is one ss_gemm per group straight on
the NCHW data (the image batch is ss_gemm's batch); a depthwise conv (group == C, any
channel multiplier M / C) is a direct loop, parallel over output planes; every other conv
is im2col of one (image, group) into `work` (parallel over im2col rows) and one ss_gemm.
The bias and relu ride in ss_gemm's epilogue; sigmoid and silu are a pass over y after.

ss_conv_transpose2d: per (image, group), ss_gemm computes col[(m, kh, kw), (h, w)] =
sum_c w[c, m, kh, kw] * x[c, h, w] into `work`, then col2im scatters it into the output
planes, parallel over output channels (each thread owns its planes, so no races).
"""

from __future__ import annotations

DEPENDS = ("gemm",)

_TEMPLATE = r"""
/* ---- conv ---- */
/* Loops with fewer multiply-adds (or copied elements) than this stay serial. */
#define SS_CONV_PAR_MIN {par_min}

/* ceil(a / b) for b > 0 and any sign of a. */
static inline int64_t ss_conv_ceil_div(int64_t a, int64_t b) {{
    return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}}

/* The outputs o in [*lo, *hi) within [0, O) whose input o * s - p + off lies in [0, L). */
static inline void ss_conv_valid(int64_t L, int64_t O, int64_t s, int64_t p, int64_t off,
                                 int64_t* lo, int64_t* hi) {{
    int64_t a = ss_conv_ceil_div(p - off, s), b = ss_conv_ceil_div(L + p - off, s);
    if (a < 0) a = 0;
    if (b > O) b = O;
    if (b < a) b = a;
    *lo = a;
    *hi = b;
}}

static inline float ss_conv_act(float v, int act) {{
    switch (act) {{
    case 1: return v > 0.0f ? v : 0.0f;
    case 2: return 1.0f / (1.0f + expf(-v));
    case 3: return v / (1.0f + expf(-v));
    default: return v;
    }}
}}

static void ss_conv_act_inplace(float* y, int64_t n, int act) {{
    #pragma omp parallel for if(n >= SS_CONV_PAR_MIN / 8)
    for (int64_t i = 0; i < n; ++i) y[i] = ss_conv_act(y[i], act);
}}

/* col [C * KH * KW, OH * OW] from one image's C channels x [C, H, W]; padding reads as 0. */
static void ss_conv_im2col(const float* x, float* col, int64_t C, int64_t H, int64_t W,
                           int64_t KH, int64_t KW, int64_t OH, int64_t OW, int64_t sh, int64_t sw,
                           int64_t ph, int64_t pw, int64_t dh, int64_t dw) {{
    int64_t rows = C * KH * KW, P = OH * OW;
    #pragma omp parallel for if(rows * P >= SS_CONV_PAR_MIN)
    for (int64_t r = 0; r < rows; ++r) {{
        int64_t c = r / (KH * KW), kh = (r / KW) % KH, kw = r % KW;
        const float* src = x + c * H * W;
        float* dst = col + r * P;
        int64_t lo, hi;
        ss_conv_valid(W, OW, sw, pw, kw * dw, &lo, &hi);
        for (int64_t oh = 0; oh < OH; ++oh) {{
            float* d = dst + oh * OW;
            int64_t ih = oh * sh - ph + kh * dh;
            if (ih < 0 || ih >= H) {{
                memset(d, 0, (size_t)OW * sizeof(float));
                continue;
            }}
            const float* s = src + ih * W + (lo * sw - pw + kw * dw);
            for (int64_t ow = 0; ow < lo; ++ow) d[ow] = 0.0f;
            if (sw == 1) {{
                memcpy(d + lo, s, (size_t)(hi - lo) * sizeof(float));
            }} else {{
                for (int64_t j = 0; j < hi - lo; ++j) d[lo + j] = s[j * sw];
            }}
            for (int64_t ow = hi; ow < OW; ++ow) d[ow] = 0.0f;
        }}
    }}
}}

/* group == C: output channel m reads input channel m / (M / C) only. */
static void ss_conv_depthwise(const float* x, const float* w, const float* bias, float* y,
                              int64_t N, int64_t C, int64_t H, int64_t W, int64_t M,
                              int64_t KH, int64_t KW, int64_t OH, int64_t OW, int64_t sh, int64_t sw,
                              int64_t ph, int64_t pw, int64_t dh, int64_t dw, int act) {{
    int64_t mult = M / C, P = OH * OW;
    #pragma omp parallel for if(N * M * P * KH * KW >= SS_CONV_PAR_MIN)
    for (int64_t nm = 0; nm < N * M; ++nm) {{
        int64_t n = nm / M, m = nm % M;
        const float* xp = x + (n * C + m / mult) * H * W;
        const float* wp = w + m * KH * KW;
        float b = bias ? bias[m] : 0.0f;
        for (int64_t oh = 0; oh < OH; ++oh) {{
            float* yr = y + nm * P + oh * OW;
            for (int64_t ow = 0; ow < OW; ++ow) yr[ow] = b;
            for (int64_t kh = 0; kh < KH; ++kh) {{
                int64_t ih = oh * sh - ph + kh * dh;
                if (ih < 0 || ih >= H) continue;
                const float* xr = xp + ih * W;
                for (int64_t kw = 0; kw < KW; ++kw) {{
                    int64_t lo, hi;
                    ss_conv_valid(W, OW, sw, pw, kw * dw, &lo, &hi);
                    float wv = wp[kh * KW + kw];
                    const float* xs = xr + (lo * sw - pw + kw * dw);
                    float* yo = yr + lo;
                    if (sw == 1) {{
                        for (int64_t j = 0; j < hi - lo; ++j) yo[j] += wv * xs[j];
                    }} else {{
                        for (int64_t j = 0; j < hi - lo; ++j) yo[j] += wv * xs[j * sw];
                    }}
                }}
            }}
            if (act) for (int64_t ow = 0; ow < OW; ++ow) yr[ow] = ss_conv_act(yr[ow], act);
        }}
    }}
}}

int64_t ss_conv2d_work_size(int64_t C, int64_t KH, int64_t KW, int64_t OH, int64_t OW, int64_t group) {{
    if (group < 1) return 0;
    return (C / group) * KH * KW * OH * OW;
}}

void ss_conv2d(const float* x, const float* w, const float* bias, float* y,
               int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW,
               int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
               int64_t dh, int64_t dw, int64_t group, int act, float* work) {{
    if (N <= 0 || M <= 0 || OH <= 0 || OW <= 0 || group < 1) return;
    int64_t Cg = C / group, Mg = M / group, P = OH * OW, Kc = Cg * KH * KW;
    if (group == C && Cg == 1) {{
        ss_conv_depthwise(x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, act);
        return;
    }}
    int gemm_act = act == 1 ? 1 : 0;
    if (KH == 1 && KW == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && OH == H && OW == W) {{
        for (int64_t g = 0; g < group; ++g)
            ss_gemm(Mg, P, Cg, N, 1,
                    w + g * Mg * Cg, 0, 0, Cg, 1,
                    x + g * Cg * P, C * P, 0, P, 1,
                    y + g * Mg * P, M * P, 0, P,
                    1.0f, bias ? bias + g * Mg : NULL, 1.0f, 1, 0, gemm_act);
    }} else {{
        for (int64_t n = 0; n < N; ++n)
            for (int64_t g = 0; g < group; ++g) {{
                ss_conv_im2col(x + (n * C + g * Cg) * H * W, work, Cg, H, W, KH, KW, OH, OW,
                               sh, sw, ph, pw, dh, dw);
                ss_gemm(Mg, P, Kc, 1, 1,
                        w + g * Mg * Kc, 0, 0, Kc, 1,
                        work, 0, 0, P, 1,
                        y + (n * M + g * Mg) * P, 0, 0, P,
                        1.0f, bias ? bias + g * Mg : NULL, 1.0f, 1, 0, gemm_act);
            }}
    }}
    if (act >= 2) ss_conv_act_inplace(y, N * M * P, act);
}}

/* Adds col [Mg * KH * KW, H * W] into y [Mg, OH, OW], which it first fills with the bias. */
static void ss_conv_col2im(const float* col, const float* bias, float* y, int64_t Mg,
                           int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t OH, int64_t OW,
                           int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw) {{
    int64_t HW = H * W, P = OH * OW;
    #pragma omp parallel for if(Mg * KH * KW * HW >= SS_CONV_PAR_MIN)
    for (int64_t m = 0; m < Mg; ++m) {{
        float* plane = y + m * P;
        float b = bias ? bias[m] : 0.0f;
        for (int64_t i = 0; i < P; ++i) plane[i] = b;
        for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw) {{
                const float* row = col + ((m * KH + kh) * KW + kw) * HW;
                int64_t lo, hi;
                ss_conv_valid(OW, W, sw, pw, kw * dw, &lo, &hi);
                for (int64_t ih = 0; ih < H; ++ih) {{
                    int64_t oh = ih * sh - ph + kh * dh;
                    if (oh < 0 || oh >= OH) continue;
                    const float* s = row + ih * W + lo;
                    float* d = plane + oh * OW + (lo * sw - pw + kw * dw);
                    if (sw == 1) {{
                        for (int64_t j = 0; j < hi - lo; ++j) d[j] += s[j];
                    }} else {{
                        for (int64_t j = 0; j < hi - lo; ++j) d[j * sw] += s[j];
                    }}
                }}
            }}
    }}
}}

int64_t ss_conv_transpose2d_work_size(int64_t C, int64_t M, int64_t KH, int64_t KW,
                                      int64_t H, int64_t W, int64_t group) {{
    (void)C;
    if (group < 1) return 0;
    return (M / group) * KH * KW * H * W;
}}

void ss_conv_transpose2d(const float* x, const float* w, const float* bias, float* y,
                         int64_t N, int64_t C, int64_t H, int64_t W, int64_t M,
                         int64_t KH, int64_t KW, int64_t OH, int64_t OW,
                         int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                         int64_t dh, int64_t dw, int64_t group, float* work) {{
    if (N <= 0 || M <= 0 || OH <= 0 || OW <= 0 || group < 1) return;
    int64_t Cg = C / group, Mg = M / group, HW = H * W, R = Mg * KH * KW;
    for (int64_t n = 0; n < N; ++n)
        for (int64_t g = 0; g < group; ++g) {{
            /* A = w[g]^T: element (r, c) of the [R, Cg] matrix sits at w[g][c][r]. */
            ss_gemm(R, HW, Cg, 1, 1,
                    w + g * Cg * R, 0, 0, 1, R,
                    x + (n * C + g * Cg) * HW, 0, 0, HW, 1,
                    work, 0, 0, HW,
                    1.0f, NULL, 0.0f, 0, 0, 0);
            ss_conv_col2im(work, bias ? bias + g * Mg : NULL, y + (n * M + g * Mg) * OH * OW, Mg,
                           H, W, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw);
        }}
}}
"""


def source(par_min: int = 32768) -> str:
    """The conv fragment; ``par_min`` is the work (multiply-adds or copies) below which loops stay serial."""
    return _TEMPLATE.format(par_min=int(par_min))
