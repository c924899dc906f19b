"""The blocked channel layout NCHWc: vector helpers, reorders and pools over it.

A tensor [N, C, H, W] in NCHWc with block c (8 floats for ymm, 16 for zmm: the lowering
takes c from the target description) is stored as [N, ceil(C/c), H, W, c]: channel
``k`` of pixel (h, w) is lane ``k % c`` of block ``k / c``. The lanes past C in the last
block are zero, and every kernel here and in conv_nchwc.py keeps them zero, so that a
channel-wise op (a 1x1 conv reading all lanes, a residual Add, a squeeze-excite Mul)
never reads garbage. One set of functions per block width, suffixed with it (``_8``,
``_16``); both are compiled into every build, the narrower one serving AVX2 targets.

The vectors are GCC vector extensions (``vector_size``), so one template serves both
widths, and a 16-float vector built for an AVX2-only machine is two ymm halves rather
than a compile error. Exported C (L = 8 or 16)::

    /* x [N, C, HW] plain -> y [N, ceil(C/L), HW, L], lanes past C zeroed. */
    void ss_nchwc_block_L(const float* x, float* y, int64_t N, int64_t C, int64_t HW);
    /* x [N, ceil(C/L), HW, L] -> y [N, C, HW] plain. */
    void ss_nchwc_unblock_L(const float* x, float* y, int64_t N, int64_t C, int64_t HW);
    /* Max / average pool over the planes of x [NCB, H, W, L] into y [NCB, OH, OW, L]:
       mode 0 max, 1 average counting the pads, 2 average over the window's pixels only.
       Begin pads ph, pw (end pads implied by OH, OW); strides; dilations. */
    void ss_pool_nchwc_L(const float* x, float* y, int64_t NCB, int64_t H, int64_t W,
                         int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t sh, int64_t sw,
                         int64_t ph, int64_t pw, int64_t dh, int64_t dw, int mode);
    /* Mean of each plane: x [NCB, HW, L] -> y [NCB, L]. */
    void ss_gap_nchwc_L(const float* x, float* y, int64_t NCB, int64_t HW);

The shared part (every unit that calls these sees it; conv_nchwc.py's object inlines it)
also holds the vector types and the activations the conv epilogues apply (``ss_nchwc_act_L``:
0 none, 1 relu, 2 clip(a0, a1), 3 hardswish, 4 hardsigmoid(alpha a0, beta a1), 5 sigmoid,
6 silu, 7 leaky relu(a0)) and the exp they use (Cephes' expf polynomial, as vmath's
ss_exp8).
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Shared, fill

WIDTHS = (8, 16)


def block_width(target) -> int:
    """Floats per block: the widest vector the target has (zmm: 16, ymm: 8)."""
    return 16 if target.avx512 else 8

#: Activation codes of the conv epilogue (ss_nchwc_act_L).
ACT_NONE, ACT_RELU, ACT_CLIP, ACT_HARDSWISH, ACT_HARDSIGMOID, ACT_SIGMOID, ACT_SILU, ACT_LEAKY = range(8)

_HELPERS = r"""
/* ---- nchwc, @L@ lanes ---- */
typedef float ss_vf@L@ __attribute__((vector_size(@L@ * 4)));
typedef int32_t ss_vi@L@ __attribute__((vector_size(@L@ * 4)));
/* The same vector, for unaligned loads and stores through a pointer. */
typedef float ss_vfu@L@ __attribute__((vector_size(@L@ * 4), aligned(4)));

/* max(a, b) and min(a, b) that keep a NaN in a (Relu(NaN) is NaN, as in onnxruntime). */
static inline ss_vf@L@ ss_nchwc_max_@L@(ss_vf@L@ a, ss_vf@L@ b)
{
    const ss_vi@L@ m = a < b;
    return (ss_vf@L@)(((ss_vi@L@)b & m) | ((ss_vi@L@)a & ~m));
}

static inline ss_vf@L@ ss_nchwc_min_@L@(ss_vf@L@ a, ss_vf@L@ b)
{
    const ss_vi@L@ m = a > b;
    return (ss_vf@L@)(((ss_vi@L@)b & m) | ((ss_vi@L@)a & ~m));
}

static inline ss_vf@L@ ss_nchwc_exp_@L@(ss_vf@L@ x)
{
    const ss_vf@L@ zero = {0};
    x = ss_nchwc_min_@L@(ss_nchwc_max_@L@(x, zero - 87.3365f), zero + 88.3762f);
    const ss_vf@L@ t = x * 1.44269504088896341f + 0.5f;
    ss_vi@L@ n = __builtin_convertvector(t, ss_vi@L@);
    ss_vf@L@ nf = __builtin_convertvector(n, ss_vf@L@);
    const ss_vi@L@ over = nf > t;  /* truncation rounded a negative t up: floor it */
    n += over;
    nf = __builtin_convertvector(n, ss_vf@L@);
    const ss_vf@L@ r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
    ss_vf@L@ p = zero + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * (ss_vf@L@)((n + 127) << 23);
}

static inline ss_vf@L@ ss_nchwc_act_@L@(ss_vf@L@ v, int act, float a0, float a1)
{
    const ss_vf@L@ zero = {0};
    switch (act) {
    case 1: return ss_nchwc_max_@L@(v, zero);
    case 2: return ss_nchwc_min_@L@(ss_nchwc_max_@L@(v, zero + a0), zero + a1);
    case 3: return v * ss_nchwc_min_@L@(ss_nchwc_max_@L@(v * (1.0f / 6.0f) + 0.5f, zero), zero + 1.0f);
    case 4: return ss_nchwc_min_@L@(ss_nchwc_max_@L@(v * a0 + a1, zero), zero + 1.0f);
    case 5: return 1.0f / (1.0f + ss_nchwc_exp_@L@(-v));
    case 6: return v / (1.0f + ss_nchwc_exp_@L@(-v));
    case 7: { const ss_vi@L@ m = v < zero; const ss_vf@L@ s = v * a0;
              return (ss_vf@L@)(((ss_vi@L@)s & m) | ((ss_vi@L@)v & ~m)); }
    default: return v;
    }
}
"""

_BLOCK = r"""
const int64_t CB = (C + @L@ - 1) / @L@;
#pragma omp parallel for collapse(2) if(N * CB * HW * @L@ >= 65536)
for (int64_t n = 0; n < N; n++)
    for (int64_t cb = 0; cb < CB; cb++) {
        const int64_t lanes = C - cb * @L@ < @L@ ? C - cb * @L@ : @L@;
        const float* src = x + (n * C + cb * @L@) * HW;
        float* dst = y + (n * CB + cb) * HW * @L@;
        if (lanes < @L@)
            memset(dst, 0, (size_t)(HW * @L@) * sizeof(float));
        for (int64_t p0 = 0; p0 < HW; p0 += 64) {
            const int64_t p1 = p0 + 64 < HW ? p0 + 64 : HW;
            for (int64_t l = 0; l < lanes; l++)
                for (int64_t p = p0; p < p1; p++)
                    dst[p * @L@ + l] = src[l * HW + p];
        }
    }
"""

_UNBLOCK = r"""
const int64_t CB = (C + @L@ - 1) / @L@;
#pragma omp parallel for collapse(2) if(N * CB * HW * @L@ >= 65536)
for (int64_t n = 0; n < N; n++)
    for (int64_t cb = 0; cb < CB; cb++) {
        const int64_t lanes = C - cb * @L@ < @L@ ? C - cb * @L@ : @L@;
        const float* src = x + (n * CB + cb) * HW * @L@;
        float* dst = y + (n * C + cb * @L@) * HW;
        for (int64_t p0 = 0; p0 < HW; p0 += 64) {
            const int64_t p1 = p0 + 64 < HW ? p0 + 64 : HW;
            for (int64_t l = 0; l < lanes; l++)
                for (int64_t p = p0; p < p1; p++)
                    dst[l * HW + p] = src[p * @L@ + l];
        }
    }
"""

_POOL = r"""
const ss_vf@L@ zero = {0};
#pragma omp parallel for collapse(2) if(NCB * OH * OW * KH * KW * @L@ >= 65536)
for (int64_t b = 0; b < NCB; b++)
    for (int64_t oy = 0; oy < OH; oy++) {
        const float* xp = x + b * H * W * @L@;
        float* yp = y + (b * OH + oy) * OW * @L@;
        for (int64_t ox = 0; ox < OW; ox++) {
            ss_vf@L@ acc = mode == 0 ? zero - INFINITY : zero;
            int64_t count = 0;
            for (int64_t ky = 0; ky < KH; ky++) {
                const int64_t iy = oy * sh - ph + ky * dh;
                if (iy < 0 || iy >= H) continue;
                for (int64_t kx = 0; kx < KW; kx++) {
                    const int64_t ix = ox * sw - pw + kx * dw;
                    if (ix < 0 || ix >= W) continue;
                    const ss_vf@L@ v = *(const ss_vfu@L@*)(xp + (iy * W + ix) * @L@);
                    acc = mode == 0 ? ss_nchwc_max_@L@(acc, v) : acc + v;
                    count++;
                }
            }
            if (mode == 1) acc = acc / (float)(KH * KW);
            else if (mode == 2) acc = acc / (float)(count > 0 ? count : 1);
            *(ss_vfu@L@*)(yp + ox * @L@) = acc;
        }
    }
"""

_GAP = r"""
#pragma omp parallel for if(NCB * HW * @L@ >= 65536)
for (int64_t b = 0; b < NCB; b++) {
    const float* xp = x + b * HW * @L@;
    ss_vf@L@ s0 = {0}, s1 = {0};
    int64_t p = 0;
    for (; p + 1 < HW; p += 2) {
        s0 += *(const ss_vfu@L@*)(xp + p * @L@);
        s1 += *(const ss_vfu@L@*)(xp + (p + 1) * @L@);
    }
    if (p < HW) s0 += *(const ss_vfu@L@*)(xp + p * @L@);
    *(ss_vfu@L@*)(y + b * @L@) = (s0 + s1) / (float)(HW > 0 ? HW : 1);
}
"""


def _functions(lanes: int) -> list:
    return [
        Function("void", f"ss_nchwc_block_{lanes}", ("const float* x", "float* y", "int64_t N", "int64_t C",
                                                    "int64_t HW"), fill(_BLOCK, L=lanes)),
        Function("void", f"ss_nchwc_unblock_{lanes}", ("const float* x", "float* y", "int64_t N", "int64_t C",
                                                      "int64_t HW"), fill(_UNBLOCK, L=lanes)),
        Function("void", f"ss_pool_nchwc_{lanes}",
                 ("const float* x", "float* y", "int64_t NCB", "int64_t H", "int64_t W", "int64_t OH", "int64_t OW",
                  "int64_t KH", "int64_t KW", "int64_t sh", "int64_t sw", "int64_t ph", "int64_t pw", "int64_t dh",
                  "int64_t dw", "int mode"), fill(_POOL, L=lanes)),
        Function("void", f"ss_gap_nchwc_{lanes}", ("const float* x", "float* y", "int64_t NCB", "int64_t HW"),
                 fill(_GAP, L=lanes)),
    ]


def helpers(lanes: int) -> str:
    """The vector types and inline helpers of one width (conv_nchwc.py's object uses them),
    guarded: a tuned conv unit (kernels/conv_nchwc_tuned.py) carries its own copy and sits
    after a program's declarations, which may hold them already."""
    return f"#ifndef SS_NCHWC_HELPERS_{lanes}\n#define SS_NCHWC_HELPERS_{lanes}\n" + fill(_HELPERS, L=lanes) + "#endif\n"


def fragment() -> Fragment:
    parts: list = []
    for lanes in WIDTHS:
        parts.append(Shared(helpers(lanes)))
        parts.extend(_functions(lanes))
    return Fragment(parts)


def source() -> str:
    return fragment().text()


__all__ = ["WIDTHS", "block_width", "fragment", "helpers", "source"]
