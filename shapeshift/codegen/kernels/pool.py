"""Max and average pooling kernels (ONNX MaxPool / AveragePool, NCHW float32, 1-D and 2-D).

Exported C::

    /* y [NC, OH, OW] = max over each window of x [NC, H, W] (1-D: H = 1, KH = 1);
       begin pads ph, pw; strides sh, sw; dilations dh, dw. Padding never wins: a window
       holds at least one element of x in every valid ONNX configuration. */
    void ss_maxpool2d(const float* x, float* y, int64_t NC, int64_t H, int64_t W,
                      int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t sh, int64_t sw,
                      int64_t ph, int64_t pw, int64_t dh, int64_t dw);

    /* y = mean over each window; begin pads ph, pw, declared end pads ph_end, pw_end.
       count_include_pad 1 divides by the window's extent clipped to the padded input
       (so with ceil_mode a window running past the end padding counts only up to it);
       0 divides by the number of elements of x in the window. */
    void ss_avgpool2d(const float* x, float* y, int64_t NC, int64_t H, int64_t W,
                      int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t sh, int64_t sw,
                      int64_t ph, int64_t pw, int64_t ph_end, int64_t pw_end, int count_include_pad);

The divisor with count_include_pad = 1 is what onnxruntime 1.32 computes (checked in
tests/codegen/test_kernels_pool.py): a window [start, start + K) is cut at H + ph_end,
never at the begin side, whose start is at least -ph anyway.

Both kernels work one output row at a time, parallel over the NC * OH rows; within a row
each kernel tap is one pass over the output columns it reaches, which the compiler
vectorizes for stride 1.
"""

from __future__ import annotations

_TEMPLATE = r"""
/* ---- pool ---- */
/* Output rows * taps below which the loops stay serial. */
#define SS_POOL_PAR_MIN {par_min}

/* ceil(a / b) for b > 0 and any sign of a. */
static inline int64_t ss_pool_ceil_div(int64_t a, int64_t b) {{
    return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}}

/* The outputs o in [*lo, *hi) within [0, O) whose input o * s - p + off lies in [0, L). */
static inline void ss_pool_valid(int64_t L, int64_t O, int64_t s, int64_t p, int64_t off,
                                 int64_t* lo, int64_t* hi) {{
    int64_t a = ss_pool_ceil_div(p - off, s), b = ss_pool_ceil_div(L + p - off, s);
    if (a < 0) a = 0;
    if (b > O) b = O;
    if (b < a) b = a;
    *lo = a;
    *hi = b;
}}

void ss_maxpool2d(const float* x, float* y, int64_t NC, int64_t H, int64_t W,
                  int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t sh, int64_t sw,
                  int64_t ph, int64_t pw, int64_t dh, int64_t dw) {{
    int64_t rows = NC * OH;
    #pragma omp parallel for if(rows * OW * KH * KW >= SS_POOL_PAR_MIN)
    for (int64_t r = 0; r < rows; ++r) {{
        int64_t nc = r / OH, oh = r % OH;
        float* yr = y + r * OW;
        for (int64_t ow = 0; ow < OW; ++ow) yr[ow] = -FLT_MAX;
        for (int64_t kh = 0; kh < KH; ++kh) {{
            int64_t ih = oh * sh - ph + kh * dh;
            if (ih < 0 || ih >= H) continue;
            const float* xr = x + (nc * H + ih) * W;
            for (int64_t kw = 0; kw < KW; ++kw) {{
                int64_t lo, hi;
                ss_pool_valid(W, OW, sw, pw, kw * dw, &lo, &hi);
                const float* xs = xr + (lo * sw - pw + kw * dw);
                float* yo = yr + lo;
                if (sw == 1) {{
                    for (int64_t j = 0; j < hi - lo; ++j) yo[j] = yo[j] > xs[j] ? yo[j] : xs[j];
                }} else {{
                    for (int64_t j = 0; j < hi - lo; ++j) yo[j] = yo[j] > xs[j * sw] ? yo[j] : xs[j * sw];
                }}
            }}
        }}
    }}
}}

/* The window [start, start + K) along one axis, cut at the end padding: its extent with
   padding (count_include_pad) and the number of input elements it covers. */
static inline void ss_pool_extent(int64_t o, int64_t s, int64_t p, int64_t p_end, int64_t K, int64_t L,
                                  int64_t* padded, int64_t* inside) {{
    int64_t start = o * s - p, end = start + K;
    if (end > L + p_end) end = L + p_end;
    *padded = end - start;
    int64_t a = start > 0 ? start : 0, b = end < L ? end : L;
    *inside = b > a ? b - a : 0;
}}

void ss_avgpool2d(const float* x, float* y, int64_t NC, int64_t H, int64_t W,
                  int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t sh, int64_t sw,
                  int64_t ph, int64_t pw, int64_t ph_end, int64_t pw_end, int count_include_pad) {{
    int64_t rows = NC * OH;
    #pragma omp parallel for if(rows * OW * KH * KW >= SS_POOL_PAR_MIN)
    for (int64_t r = 0; r < rows; ++r) {{
        int64_t nc = r / OH, oh = r % OH;
        float* yr = y + r * OW;
        for (int64_t ow = 0; ow < OW; ++ow) yr[ow] = 0.0f;
        for (int64_t kh = 0; kh < KH; ++kh) {{
            int64_t ih = oh * sh - ph + kh;
            if (ih < 0 || ih >= H) continue;
            const float* xr = x + (nc * H + ih) * W;
            for (int64_t kw = 0; kw < KW; ++kw) {{
                int64_t lo, hi;
                ss_pool_valid(W, OW, sw, pw, kw, &lo, &hi);
                const float* xs = xr + (lo * sw - pw + kw);
                float* yo = yr + lo;
                if (sw == 1) {{
                    for (int64_t j = 0; j < hi - lo; ++j) yo[j] += xs[j];
                }} else {{
                    for (int64_t j = 0; j < hi - lo; ++j) yo[j] += xs[j * sw];
                }}
            }}
        }}
        int64_t hpad, hin;
        ss_pool_extent(oh, sh, ph, ph_end, KH, H, &hpad, &hin);
        for (int64_t ow = 0; ow < OW; ++ow) {{
            int64_t wpad, win;
            ss_pool_extent(ow, sw, pw, pw_end, KW, W, &wpad, &win);
            int64_t count = count_include_pad ? hpad * wpad : hin * win;
            yr[ow] = count > 0 ? yr[ow] / (float)count : 0.0f;
        }}
    }}
}}
"""


def source(par_min: int = 32768) -> str:
    """The pool fragment; ``par_min`` is the work (outputs times taps) below which loops stay serial."""
    return _TEMPLATE.format(par_min=int(par_min))
