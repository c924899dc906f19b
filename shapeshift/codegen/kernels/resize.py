"""Resize of the last two axes (ONNX Resize, opset 11-19 semantics, float32).

Exported C::

    /* y [NC, OH, OW] = x [NC, H, W] resized. mode: 0 nearest, 1 linear (bilinear),
       2 cubic (coefficient cubic_a, exclude_outside 0/1). coord (coordinate_transformation_mode):
       0 half_pixel, 1 asymmetric, 2 align_corners, 3 pytorch_half_pixel, 4 tf_half_pixel_for_nn.
       nearest (nearest_mode): 0 round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil.
       scale_h, scale_w: the scales (output / input) of the spec's coordinate transform: the
       given scales, or OH / H and OW / W when sizes were given. Does nothing when an extent
       is 0 (or if its small per-call tables cannot be allocated). */
    void ss_resize2d(const float* x, float* y, int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW,
                     float scale_h, float scale_w, int mode, int coord, int nearest,
                     float cubic_a, int exclude_outside);

Arithmetic follows onnxruntime 1.32 where the spec leaves room (checked by
tests/codegen/test_kernels_resize.py): the source coordinate is the output coordinate times
the inverse scale, that is the exact H / OH when sizes were given and the float 1 / scale
when scales were. The kernel tells the two apart by scale == (float)OH / H. Caveat: with
given scales, where a nearest source coordinate is an exact integer or half-integer in
real arithmetic (17 / 1.7), onnxruntime's float evaluation sometimes lands on the other
side of it than this kernel does, so the two may pick neighbouring pixels there; with
sizes, the exact ratio reproduces onnxruntime on every case probed (several hundred).
Linear clamps the source coordinate into [0, L - 1] before taking its two
neighbours; cubic does not clamp the coordinate but clamps each tap's index to the edge
(or, with exclude_outside, drops out-of-range taps and renormalizes the rest).

Each axis is first reduced to a table of (source index, weight) taps per output index (1
for nearest, 2 for linear, 4 for cubic), so the per-pixel loop is only gathers and
multiply-adds, parallel over the NC * OH output rows.
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Private, fill

_DEFINES = r"""
/* ---- resize ---- */
/* Output elements * taps below which the loop stays serial. */
#define SS_RESIZE_PAR_MIN @PAR_MIN@
"""

_HELPERS = r"""
/* The source coordinate of output o, as onnxruntime computes it: through the inverse scale,
   which is the exact L / O when the output size was given (seen here as scale == O / L in
   float) and the float 1 / scale otherwise, in double, rounded to float. That decides which
   way nearest rounds at exact half-way points. */
static float ss_resize_coord(int64_t o, float scale, int64_t out_len, int64_t in_len, int coord) {
    double inv = scale == (float)out_len / (float)in_len ? (double)in_len / (double)out_len
                                                         : (double)(1.0f / scale);
    double xo = (double)o;
    switch (coord) {
    case 1: return (float)(xo * inv);
    case 2: return out_len == 1 ? 0.0f : (float)(xo * (double)(in_len - 1) / (double)(out_len - 1));
    case 3: return out_len > 1 ? (float)((xo + 0.5) * inv - 0.5) : 0.0f;
    case 4: return (float)((xo + 0.5) * inv);
    default: return (float)((xo + 0.5) * inv - 0.5);
    }
}

static int64_t ss_resize_nearest(float v, int nearest) {
    int is_half = v == (float)(int64_t)v + 0.5f;
    switch (nearest) {
    case 1: return (int64_t)(is_half ? ceilf(v) : roundf(v));
    case 2: return (int64_t)floorf(v);
    case 3: return (int64_t)ceilf(v);
    default: return (int64_t)(is_half ? floorf(v) : roundf(v));
    }
}

static inline int64_t ss_resize_clamp(int64_t i, int64_t L) {
    return i < 0 ? 0 : (i >= L ? L - 1 : i);
}

/* The cubic convolution kernel of coefficient a at distance d (Keys). */
static inline float ss_resize_cubic(float d, float a) {
    d = fabsf(d);
    if (d <= 1.0f) return ((a + 2.0f) * d - (a + 3.0f)) * d * d + 1.0f;
    if (d < 2.0f) return ((a * d - 5.0f * a) * d + 8.0f * a) * d - 4.0f * a;
    return 0.0f;
}

/* Fills taps idx[o * taps + t], wt[o * taps + t] of one axis (taps = 1, 2 or 4 by mode). */
static void ss_resize_axis(int64_t O, int64_t L, float scale, int mode, int coord, int nearest,
                           float a, int exclude_outside, int64_t* idx, float* wt) {
    for (int64_t o = 0; o < O; ++o) {
        float v = ss_resize_coord(o, scale, O, L, coord);
        if (mode == 0) {
            idx[o] = ss_resize_clamp(ss_resize_nearest(v, nearest), L);
            wt[o] = 1.0f;
        } else if (mode == 1) {
            v = v < 0.0f ? 0.0f : (v > (float)(L - 1) ? (float)(L - 1) : v);
            int64_t i0 = ss_resize_clamp((int64_t)v, L), i1 = ss_resize_clamp(i0 + 1, L);
            idx[2 * o] = i0;
            idx[2 * o + 1] = i1;
            wt[2 * o] = i0 == i1 ? 0.5f : fabsf(v - (float)i1);
            wt[2 * o + 1] = i0 == i1 ? 0.5f : fabsf(v - (float)i0);
        } else {
            float base = floorf(v), s = v - base, sum = 0.0f;
            for (int t = 0; t < 4; ++t) {
                int64_t i = (int64_t)base + t - 1;
                float c = ss_resize_cubic(s - (float)(t - 1), a);
                if (exclude_outside && (i < 0 || i >= L)) c = 0.0f;
                idx[4 * o + t] = ss_resize_clamp(i, L);
                wt[4 * o + t] = c;
                sum += c;
            }
            if (exclude_outside && sum != 0.0f)
                for (int t = 0; t < 4; ++t) wt[4 * o + t] /= sum;
        }
    }
}

"""

_RESIZE2D = Function("void", "ss_resize2d", ("const float* x", "float* y", "int64_t NC", "int64_t H", "int64_t W",
                                             "int64_t OH", "int64_t OW", "float scale_h", "float scale_w", "int mode",
                                             "int coord", "int nearest", "float cubic_a", "int exclude_outside"), r"""
    if (NC <= 0 || H <= 0 || W <= 0 || OH <= 0 || OW <= 0) return;
    int taps = mode == 0 ? 1 : (mode == 1 ? 2 : 4);
    int64_t* ih = (int64_t*)malloc(sizeof(int64_t) * (size_t)(taps * (OH + OW)));
    float* wh = (float*)malloc(sizeof(float) * (size_t)(taps * (OH + OW)));
    if (!ih || !wh) {
        free(ih);
        free(wh);
        return;
    }
    int64_t* iw = ih + taps * OH;
    float* ww = wh + taps * OH;
    ss_resize_axis(OH, H, scale_h, mode, coord, nearest, cubic_a, exclude_outside, ih, wh);
    ss_resize_axis(OW, W, scale_w, mode, coord, nearest, cubic_a, exclude_outside, iw, ww);
    if (taps == 1) {
        /* Nearest: an output row that reads the input row the one before it read is a copy of
           that row, and a row whose columns read input column ow / 2 (an upscale by 2) is each
           input value twice, not a gather. Threads take contiguous runs of rows, so that the
           row copied is one the same thread wrote. yolov8n's two 2x upsamples at 640x640 took
           0.28 + 0.53 ms gathering every value (1 thread, AMD Zen 2), and more at 2 threads. */
        int doubled = OW == 2 * W;
        for (int64_t ow = 0; doubled && ow < OW; ++ow) doubled = iw[ow] == ow / 2;
        #pragma omp parallel if(NC * OH * OW >= SS_RESIZE_PAR_MIN)
        {
            const int64_t R = NC * OH, nt = omp_get_num_threads(), t = omp_get_thread_num();
            const int64_t r0 = R * t / nt, r1 = R * (t + 1) / nt;
            for (int64_t r = r0; r < r1; ++r) {
                const int64_t oh = r % OH;
                float* yr = y + r * OW;
                if (r > r0 && oh > 0 && ih[oh] == ih[oh - 1]) {
                    memcpy(yr, yr - OW, (size_t)OW * sizeof(float));
                    continue;
                }
                const float* row = x + r / OH * H * W + ih[oh] * W;
                if (doubled)
                    for (int64_t w = 0; w < W; ++w) yr[2 * w] = yr[2 * w + 1] = row[w];
                else
                    for (int64_t ow = 0; ow < OW; ++ow) yr[ow] = row[iw[ow]];
            }
        }
        free(ih);
        free(wh);
        return;
    }
    #pragma omp parallel for if(NC * OH * OW * taps * taps >= SS_RESIZE_PAR_MIN)
    for (int64_t r = 0; r < NC * OH; ++r) {
        int64_t nc = r / OH, oh = r % OH;
        const float* xp = x + nc * H * W;
        float* yr = y + r * OW;
        for (int64_t ow = 0; ow < OW; ++ow) {
            float acc = 0.0f;
            for (int i = 0; i < taps; ++i) {
                const float* row = xp + ih[oh * taps + i] * W;
                float t = 0.0f;
                for (int j = 0; j < taps; ++j) t += ww[ow * taps + j] * row[iw[ow * taps + j]];
                acc += wh[oh * taps + i] * t;
            }
            yr[ow] = acc;
        }
    }
    free(ih);
    free(wh);""")


def fragment(par_min: int = 32768) -> Fragment:
    """The resize fragment; ``par_min`` is the work (outputs times taps) below which the loop stays serial."""
    return Fragment([
        Private(fill(_DEFINES, PAR_MIN=int(par_min))),
        Private(_HELPERS),
        _RESIZE2D,
    ])


def source(par_min: int = 32768) -> str:
    return fragment(par_min).text()
