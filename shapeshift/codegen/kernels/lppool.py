"""Lp pooling (ONNX LpPool and GlobalLpPool, NC + up to 3 spatial axes, float32).

Exported C::

    /* y [NC, OD, OH, OW] = (sum over each window of |x|^p)^(1/p), x [NC, D, H, W];
       1-D and 2-D pools pass D = OD = KD = 1 (and H = OH = KH = 1 for 1-D). Window
       (od, oh, ow) covers x[od * sd - pd + kd * dd, oh * sh - ph + kh * dh, ow * sw - pw + kw * dw]
       for kd < KD, kh < KH, kw < KW; positions outside x (the padding, or ceil_mode's
       overhang) add nothing. p == 1 and p == 2 take exact paths (|x|, x * x and sqrtf);
       other p use powf. A GlobalLpPool is the window of the whole input: K = the input
       extents, O = 1, strides 1, no padding. */
    void ss_lppool3d(const float* x, float* y, int64_t NC, int64_t D, int64_t H, int64_t W,
                     int64_t OD, int64_t OH, int64_t OW, int64_t KD, int64_t KH, int64_t KW,
                     int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw,
                     int64_t dd, int64_t dh, int64_t dw, float p);

The sum is accumulated in float, in window order, as the reference evaluator and
onnxruntime do. Work is one output row (fixed nc, od, oh) at a time, parallel over the
NC * OD * OH rows; the window's rows outside the input are skipped up front, its columns
per output.
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Private, fill

DEPENDS: tuple[str, ...] = ()

_DEFINES = r"""
/* ---- lppool ---- */
/* Outputs times taps below which the loop stays serial. */
#define SS_LPPOOL_PAR_MIN @PAR_MIN@
"""

_HELPERS = r"""
/* |v|^p, with the common p exact. */
static inline float ss_lppool_power(float v, float p) {
    if (p == 1.0f) return fabsf(v);
    if (p == 2.0f) return v * v;
    return powf(fabsf(v), p);
}

static inline float ss_lppool_root(float sum, float p) {
    if (p == 1.0f) return sum;
    if (p == 2.0f) return sqrtf(sum);
    return powf(sum, 1.0f / p);
}

"""

_LPPOOL3D = Function("void", "ss_lppool3d", ("const float* x", "float* y", "int64_t NC", "int64_t D", "int64_t H",
                                             "int64_t W", "int64_t OD", "int64_t OH", "int64_t OW", "int64_t KD",
                                             "int64_t KH", "int64_t KW", "int64_t sd", "int64_t sh", "int64_t sw",
                                             "int64_t pd", "int64_t ph", "int64_t pw", "int64_t dd", "int64_t dh",
                                             "int64_t dw", "float p"), r"""
    int64_t rows = NC * OD * OH;
    #pragma omp parallel for if(rows * OW * KD * KH * KW >= SS_LPPOOL_PAR_MIN)
    for (int64_t r = 0; r < rows; ++r) {
        int64_t nc = r / (OD * OH), od = (r / OH) % OD, oh = r % OH;
        const float* xp = x + nc * D * H * W;
        float* yr = y + r * OW;
        for (int64_t ow = 0; ow < OW; ++ow) {
            float sum = 0.0f;
            for (int64_t kd = 0; kd < KD; ++kd) {
                int64_t id = od * sd - pd + kd * dd;
                if (id < 0 || id >= D) continue;
                for (int64_t kh = 0; kh < KH; ++kh) {
                    int64_t ih = oh * sh - ph + kh * dh;
                    if (ih < 0 || ih >= H) continue;
                    const float* xr = xp + (id * H + ih) * W;
                    for (int64_t kw = 0; kw < KW; ++kw) {
                        int64_t iw = ow * sw - pw + kw * dw;
                        if (iw >= 0 && iw < W) sum += ss_lppool_power(xr[iw], p);
                    }
                }
            }
            yr[ow] = ss_lppool_root(sum, p);
        }
    }""")


def fragment(par_min: int = 32768) -> Fragment:
    """The Lp pooling fragment; ``par_min`` is the work (outputs times taps) below which the loop stays serial."""
    return Fragment([
        Private(fill(_DEFINES, PAR_MIN=int(par_min))),
        Private(_HELPERS),
        _LPPOOL3D,
    ])


def source(par_min: int = 32768) -> str:
    return fragment(par_min).text()
