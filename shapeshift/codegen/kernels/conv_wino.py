"""Winograd F(4x4, 3x3) and F(2x2, 3x3): dense 3 x 3, stride-1 convolutions in a quarter
(or, on small planes, 4/9) of the multiply-adds (NCHW float32).

A direct or implicit-GEMM 3 x 3 conv spends 9 * C multiply-adds on each output value.
Winograd's minimal filtering (Lavin and Gray, "Fast Algorithms for Convolutional Neural
Networks", 2015) computes an F x F tile of outputs from an A x A tile of inputs, A = F + 2,
as

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A

(``(.)`` elementwise), so with F = 4 a tile costs 36 * C multiply-adds per output channel
instead of 144 * C: 2.25 * C an output (F = 2: 16 * C for 4 outputs, 4 * C an output).
Summed over the input channels, the elementwise products become XI = A * A independent
GEMMs, one per position xi of the transformed tile:

    Mo[xi] [tiles, M] = V[xi] [tiles, C] x U[xi] [C, M]

with V the transformed input tiles and U the transformed weights. That is why ResNet-style
nets are worth it: at 224 x 224 ResNet-50 has 1.5 of its 4.1 G multiply-adds in stride-1
3 x 3 convs, which the direct kernels already run at 85-90% of the FMA peak.

Layout:

1. The batch is copied once into zero-padded channels-last images ``xp [N, Hp, Wp, Cp]``
   (Cp: C rounded up to the vector), so that a tile's A * A input values of a run of
   channels are contiguous vector loads (8 x 8 transposes on AVX2).
2. Tiles (raster order over each output plane, image after image) are taken in blocks.
   For a block, the input transform writes ``V [XI, tb, Cp]`` (vectorized over channels:
   2 * A one-dimensional transforms of A vectors a tile), the XI GEMMs
   (``ss_gemm_prepacked``, U packed once at load) write ``Mo [XI, tb, Mp]``, and the output
   transform reads it back (vectorized over output channels), adds the bias, applies the
   activation and the residual, and stores each channel's F x F (or edge) tile into y
   (F = 4: whole tiles through 8 x 8 transposes).
3. With enough blocks for every thread, each thread runs whole blocks (no barrier); else,
   or when U does not fit in L2 beside a block, the block's three phases are shared out
   (tiles, then the XI GEMMs, then tiles).

A block holds ``tb`` tiles, chosen so that V and Mo take about half of L2 (the GEMMs reread
V's rows for every panel of U), at least two GEMM row tiles; when U itself passes that, up
to BIG_BLOCK times more, since every block rereads all of U.

Which tile size runs (``winograd_tiles``, the lowering's choice): F(4x4), except where a
batch of small planes would give its GEMMs fewer than SMALL_TILE_ROWS rows and the channels
are wide, where F(2x2)'s 4x the tiles make better GEMMs and its U is 16/36 the size. Where
that depends on sizes known only at run time (a wide conv of a symbolic plane or batch) both
U are packed and ``ss_conv2d_wino_pick`` applies the same rule per call: a net exported with
dynamic image sizes ran its 14x14 and 7x7 stages with F(4x4) before, whose U (9.4 and 38 MB
a conv for ResNet-50's 256- and 512-channel 3x3s, against 4.2 and 17) streamed through the
caches at every call and slowed the 1x1 convs after them (bench/conv_profile.py).

Accuracy: the transforms use the points 0, +-1, +-2 (exact in float32 for B and A; G has
1/6, 1/12, 1/24, computed in double at packing). The result differs from a direct sum in
the last bits, by about 1e-6 of the outputs' scale per hundred channels (tests/test_conv_wino.py).

Exported C (for F(4x4) ``wino``, for F(2x2) ``wino2``)::

    int64_t ss_conv_wino_packed_b_size(int64_t K, int64_t N);
    void ss_conv_wino_pack_b(int64_t K, int64_t N, const float* B, int64_t rsb, int64_t csb, float* packed);
        /* B(k, n) = B[k * rsb + n * csb] is a 3 x 3 conv's weight as the GEMM's B,
           [C * 9, M] (k = c * 9 + kh * 3 + kw): what the lowering packs for ss_conv2d.
           packed: XI of ss_gemm_pack_b's layouts of U[xi] [C, M]. */
    void ss_conv2d_wino(<ss_conv2d's arguments up to wpacked, from ss_conv_wino_pack_b>,
                        const float* direct, const float* res, int res_act);
        /* ss_conv2d_residual's result; a conv that is not 3 x 3, stride 1, dilation 1,
           group 1, whose output plane has fewer than MIN_PLANE pixels (a plane the
           lowering could not see: yolov8n's last stages at 64x96 are 2x3, one mostly
           empty tile each), or whose scratch cannot be allocated, runs ss_conv2d_residual
           with `direct` (NULL, or the weights as ss_conv2d's wpacked). Its staged images and
           blocks go in `work` (NULL, or N times ss_conv2d_work_size floats) when they fit,
           else in memory of its own for the call. */
    void ss_conv2d_wino_pick(<ss_conv2d_wino's arguments, wpacked from ss_conv_wino_pack_b>,
                             const float* wpacked2, const float* direct, const float* res, int res_act);
        /* The same, by ss_conv2d_wino2 with wpacked2 (from ss_conv_wino2_pack_b) where
           F(4x4) would give the batch fewer than SMALL_TILE_ROWS tiles, else by
           ss_conv2d_wino (winograd_tiles: for wide convs whose sizes the types leave open). */
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from ...target import Target
from ..cwriter import Fragment, Function, Private, fill

DEPENDS = ("gemm", "vmath", "conv")

#: Output tile sizes (F x F pixels from (F + 2) x (F + 2) inputs): F(2x2, 3x3) and F(4x4, 3x3).
TILES = (2, 4)
#: With U past L2, blocks this many times the L2-sized ones (fewer rereadings of U).
BIG_BLOCK = 4
#: Multiply-adds below which a conv runs on one thread.
PAR_MIN_MACS = 1 << 18
#: ``$SHAPESHIFT_WINOGRAD``: "off" (0/off/false/no) keeps every conv on the direct kernels.
ENV = "SHAPESHIFT_WINOGRAD"
#: Input and output channels below which the transforms cost more than the GEMMs save.
MIN_CHANNELS = 16
#: Output planes (pixels) below which a conv stays direct: too few tiles for the GEMMs.
MIN_PLANE = 36
#: F(2x2, 3x3) instead of F(4x4, 3x3) when the batch's planes make F(4x4) fewer than
#: SMALL_TILE_ROWS tiles (GEMM rows) and C x M is at least SMALL_TILE_CHANNELS. ResNet-50 at
#: batch 4 ran 0.89-0.95x onnxruntime with F(4x4) on its 7x7 stage and 0.95x with F(2x2)
#: (1 thread; F(2x2) has 1.8x the multiply-adds there). Chains of 4 convs, batch 1, separate
#: processes, AMD Zen 4: 512 -> 512
#: on 7x7 ran F(2x2) 1.05-1.20 ms a conv at 2 threads against F(4x4) 1.28-1.61 (4 tiles a
#: plane: the GEMMs of 4 rows stream 9.4 MB of transformed weights; 16 rows with F(2x2)),
#: at 1 thread 1.81-1.87 against 1.71-1.87 (direct kernels: 1.54-1.61 and 2.84-2.89); 256
#: -> 256 on 7x7 ran F(4x4) as fast or faster (0.22-0.42 ms against 0.25-0.47). Those chains
#: held every U in that CPU's 32 MB L3; in a whole net they do not, and F(4x4)'s 36 x C x M
#: floats of U, read for only 16 multiply-adds each at 16 tiles, also push the next convs'
#: operands out of cache. ResNet-50's 14x14 stage (256 -> 256, 16 tiles) as a chain of its
#: five bottleneck blocks, 1 thread, AMD Zen 2 (16 MB L3): 24.5 -> 22.3 ms with F(2x2) (the
#: 3 x 3 convs 1.97 -> 1.77 ms, the 1 x 1 convs after them 1.71 -> 1.52); 2 threads 15.3
#: both ways. Hence 16 tiles and 256 x 256 channels count as small and wide.
SMALL_TILE_ROWS = 17
SMALL_TILE_CHANNELS = 1 << 16


def enabled() -> bool:
    return os.environ.get(ENV, "on").strip().lower() not in ("0", "off", "false", "no")


def winograd_tiles(kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], group: int,
                   channels, outputs: int, out_hw: Sequence, batch=1) -> tuple[int, ...]:
    """The Winograd tile sizes F a Conv of constant weights is packed for: () for none (not 3
    x 3, stride 1, dilation 1, group 1; too few channels; a known plane under MIN_PLANE
    pixels); (2,) where wide channels (SMALL_TILE_CHANNELS) meet a known batch of known
    planes that gives F(4x4) fewer than SMALL_TILE_ROWS tiles; (4, 2) where that depends on
    a symbolic batch or plane of a wide conv (ss_conv2d_wino_pick decides per call); else (4,)."""
    if not enabled() or list(kernel) != [3, 3] or list(strides) != [1, 1] or list(dilations) != [1, 1] or group != 1:
        return ()
    if isinstance(channels, int) and channels < MIN_CHANNELS or outputs < MIN_CHANNELS:
        return ()
    known = all(isinstance(d, int) for d in out_hw)
    if known and out_hw[0] * out_hw[1] < MIN_PLANE:
        return ()
    if not (isinstance(channels, int) and channels * outputs >= SMALL_TILE_CHANNELS):
        return (4,)
    if not known:
        return (4, 2)
    tiles = -(-out_hw[0] // 4) * -(-out_hw[1] // 4)
    if tiles >= SMALL_TILE_ROWS:
        return (4,)  # a batch only adds tiles
    if not isinstance(batch, int):
        return (4, 2)
    return (2,) if batch * tiles < SMALL_TILE_ROWS else (4,)


_COMMON = r"""
/* ---- Winograd F(2x2, 3x3) and F(4x4, 3x3) ---- */
#if defined(__AVX512F__)
#define SS_WINO_VL 16
#elif defined(__AVX2__)
#define SS_WINO_VL 8
#else
#define SS_WINO_VL 4
#endif
/* Floats of L2 a block's transformed tiles (V and Mo) may take. */
#define SS_WINO_BLOCK_FLOATS @BLOCK_FLOATS@
#define SS_WINO_PAR_MIN @PAR_MIN@
/* Blocks this many times SS_WINO_BLOCK_FLOATS when U does not fit beside one in L2. */
#define SS_WINO_BIG_BLOCK @BIG_BLOCK@

/* GCC's vector types: one source for 4, 8 and 16 lanes (the transforms are adds and
   multiply-adds by constants). */
typedef float ss_wino_v __attribute__((vector_size(SS_WINO_VL * 4), may_alias));
typedef float ss_wino_vu __attribute__((vector_size(SS_WINO_VL * 4), aligned(4), may_alias));
#define SS_WINO_LD(p) (*(const ss_wino_vu*)(p))
#define SS_WINO_ST(p, v) (*(ss_wino_vu*)(p) = (v))

/* a * b + c for a vector a and c and a constant b, as one FMA: the units are built with
   -std=c11, under which GCC does not contract a * b + c by itself. */
#if SS_WINO_VL == 16
#define SS_WINO_FMA(a, b, c) ((ss_wino_v)_mm512_fmadd_ps((__m512)(a), _mm512_set1_ps(b), (__m512)(c)))
#elif SS_WINO_VL == 8 && defined(__FMA__)
#define SS_WINO_FMA(a, b, c) ((ss_wino_v)_mm256_fmadd_ps((__m256)(a), _mm256_set1_ps(b), (__m256)(c)))
#else
#define SS_WINO_FMA(a, b, c) ((a) * (b) + (c))
#endif

static inline ss_wino_v ss_wino_act(ss_wino_v v, int act)
{
    if (act == 0) return v;
#if SS_WINO_VL == 16
    return (ss_wino_v)ss_act16((__m512)v, act);
#elif SS_WINO_VL == 8
    return (ss_wino_v)ss_act8((__m256)v, act);
#else
    for (int l = 0; l < SS_WINO_VL; ++l) v[l] = ss_actf(v[l], act);
    return v;
#endif
}

typedef struct {
    const float* x;      /* [N, C, H, W] */
    float* xp;           /* [N, Hp, Wp, Cp], zero-padded channels-last copy */
    const float* U;      /* XI packed [C, M], XI = (F + 2)^2 for tiles of F x F */
    const float* biasp;  /* [Mp], 0 past M */
    float* y;            /* [N, M, OH, OW] */
    const float* res;    /* NULL or laid out as y */
    int64_t N, C, H, W, M, OH, OW, ph, pw, Cp, Mp, TW, T, Timg, Hp, Wp, tb, part;  /* T: tiles of all N images */
    int act, res_act;
    int shared;          /* the threads share each block's phases (else each runs whole blocks) */
} ss_wino_job;

/* Row r of xp (row r % Hp of image r / Hp) from x: zeros outside the image, channels last. */
static void ss_wino_stage_row(const ss_wino_job* J, int64_t r)
{
    const int64_t Cp = J->Cp, Wp = J->Wp, iy = r % J->Hp - J->ph, HW = J->H * J->W;
    float* row = J->xp + r * Wp * Cp;
    if (iy < 0 || iy >= J->H) {
        memset(row, 0, (size_t)(Wp * Cp) * sizeof(float));
        return;
    }
    /* Columns s whose input s - pw lies in the image: [s0, s1). */
    int64_t s0 = J->pw < 0 ? 0 : J->pw, s1 = J->pw + J->W;
    if (s1 > Wp) s1 = Wp;
    if (s0 > s1) s0 = s1;
    memset(row, 0, (size_t)(s0 * Cp) * sizeof(float));
    memset(row + s1 * Cp, 0, (size_t)((Wp - s1) * Cp) * sizeof(float));
    const float* src = J->x + r / J->Hp * J->C * HW + iy * J->W - J->pw;
    int64_t s = s0;
#ifdef __AVX2__
    /* 8 x 8 transposes write channels up to C8; Cp (a multiple of SS_WINO_VL) may be past it. */
    const int64_t C8 = (J->C + 7) / 8 * 8;
    for (; s + 8 <= s1; s += 8) {
        for (int64_t c = 0; c < J->C; c += 8)
            ss_gemm_transpose8(src + c * HW + s, HW, (int)(J->C - c < 8 ? J->C - c : 8), row + s * Cp + c, Cp);
        if (Cp > C8)
            for (int64_t u = s; u < s + 8; ++u) memset(row + u * Cp + C8, 0, (size_t)(Cp - C8) * sizeof(float));
    }
#endif
    for (; s < s1; ++s) {
        float* d = row + s * Cp;
        for (int64_t c = 0; c < J->C; ++c) d[c] = src[c * HW + s];
        for (int64_t c = J->C; c < Cp; ++c) d[c] = 0.0f;
    }
}

#ifdef __AVX2__
/* A whole 4 x 4 tile of `lanes` channels from ob [16 pixels, SS_WINO_VL channels]: turned
   channel-major through 8 x 8 transposes in L1, then each channel's tile stored as two
   8-float halves (rows 0-1, rows 2-3), the residual added on the way (y and res at the
   tile's first pixel of its first channel). */
static inline void ss_wino_store_tile(const ss_wino_job* J, const float* ob, int64_t lanes, float* y, const float* res)
{
    float tr[SS_WINO_VL * 16] __attribute__((aligned(64)));
    for (int c0 = 0; c0 < SS_WINO_VL; c0 += 8)
        for (int p0 = 0; p0 < 16; p0 += 8) ss_gemm_transpose8(ob + p0 * SS_WINO_VL + c0, SS_WINO_VL, 8, tr + c0 * 16 + p0, 16);
    const int64_t OW = J->OW, P = J->OH * OW;
    for (int64_t l = 0; l < lanes; ++l) {
        float* yp = y + l * P;
        for (int h = 0; h < 2; ++h) {
            __m256 v = _mm256_load_ps(tr + l * 16 + h * 8);
            float* row = yp + 2 * h * OW;
            if (res) {
                const float* rr = res + l * P + 2 * h * OW;
                v = ss_act8(_mm256_add_ps(v, _mm256_set_m128(_mm_loadu_ps(rr + OW), _mm_loadu_ps(rr))), J->res_act);
            }
            _mm_storeu_ps(row, _mm256_castps256_ps128(v));
            _mm_storeu_ps(row + OW, _mm256_extractf128_ps(v, 1));
        }
    }
}
#endif

static void* ss_wino_alloc(int64_t floats)
{
    return aligned_alloc(64, ((size_t)floats * sizeof(float) + 63) / 64 * 64);
}

"""

#: The one-axis transforms of each tile size F (output pixels a side).
_TRANSFORMS = {
    4: r"""
/* B^T d for the 6 values of one axis (the input transform of F(4x4, 3x3)). */
static inline __attribute__((always_inline)) void ss_wino_in_4(const ss_wino_v* d, ss_wino_v* o)
{
    const ss_wino_v s = SS_WINO_FMA(d[2], -4.0f, d[4]), t = SS_WINO_FMA(d[1], -4.0f, d[3]);  /* rows 1, 2 */
    const ss_wino_v p = d[4] - d[2], q = d[3] - d[1];                                          /* rows 3, 4 */
    o[0] = SS_WINO_FMA(d[0], 4.0f, SS_WINO_FMA(d[2], -5.0f, d[4]));
    o[1] = s + t;
    o[2] = s - t;
    o[3] = SS_WINO_FMA(q, 2.0f, p);
    o[4] = SS_WINO_FMA(q, -2.0f, p);
    o[5] = SS_WINO_FMA(d[1], 4.0f, SS_WINO_FMA(d[3], -5.0f, d[5]));
}

/* A^T m for the 6 values of one axis (its output transform): 4 values. */
static inline __attribute__((always_inline)) void ss_wino_out_4(const ss_wino_v* m, ss_wino_v* o)
{
    const ss_wino_v a = m[1] + m[2], b = m[1] - m[2], c = m[3] + m[4], d = m[3] - m[4];
    o[0] = m[0] + a + c;
    o[1] = SS_WINO_FMA(d, 2.0f, b);
    o[2] = SS_WINO_FMA(c, 4.0f, a);
    o[3] = SS_WINO_FMA(d, 8.0f, b) + m[5];
}
""",
    2: r"""
/* B^T d for the 4 values of one axis (the input transform of F(2x2, 3x3)). */
static inline __attribute__((always_inline)) void ss_wino_in_2(const ss_wino_v* d, ss_wino_v* o)
{
    o[0] = d[0] - d[2];
    o[1] = d[1] + d[2];
    o[2] = d[2] - d[1];
    o[3] = d[1] - d[3];
}

/* A^T m for the 4 values of one axis: 2 values. */
static inline __attribute__((always_inline)) void ss_wino_out_2(const ss_wino_v* m, ss_wino_v* o)
{
    o[0] = m[0] + m[1] + m[2];
    o[1] = m[1] - m[2] - m[3];
}
""",
}

_VARIANT = r"""
/* V [XI, tb, Cp] of tiles [t0, t1). */
static void ss_wino_input_@F@(const ss_wino_job* J, int64_t t0, int64_t t1, float* V)
{
    const int64_t Cp = J->Cp, Wp = J->Wp, stride = J->tb * Cp;
    for (int64_t t = t0; t < t1; ++t) {
        const int64_t n = t / J->Timg, ty = t % J->Timg / J->TW, tx = t % J->TW;
        const float* base = J->xp + ((n * J->Hp + @F@ * ty) * Wp + @F@ * tx) * Cp;
        float* vt = V + (t - t0) * Cp;
        for (int64_t c = 0; c < Cp; c += SS_WINO_VL) {
            ss_wino_v w[@A@][@A@], d[@A@], o[@A@];
            for (int i = 0; i < @A@; ++i) {
                const float* p = base + i * Wp * Cp + c;
                for (int j = 0; j < @A@; ++j) d[j] = SS_WINO_LD(p + j * Cp);
                ss_wino_in_@F@(d, w[i]);
            }
            for (int b = 0; b < @A@; ++b) {
                for (int i = 0; i < @A@; ++i) d[i] = w[i][b];
                ss_wino_in_@F@(d, o);
                for (int a = 0; a < @A@; ++a) SS_WINO_ST(vt + (a * @A@ + b) * stride + c, o[a]);
            }
        }
    }
}

/* The XI GEMMs of a block of n tiles, positions [x0, x1). */
static void ss_wino_gemms_@F@(const ss_wino_job* J, int64_t n, const float* V, float* Mo, int x0, int x1)
{
    for (int xi = x0; xi < x1; ++xi)
        ss_gemm_prepacked(n, J->M, J->C, 1, 1, V + xi * J->tb * J->Cp, 0, 0, J->Cp, 1, J->U + xi * J->part,
                          Mo + xi * J->tb * J->Mp, 0, 0, J->Mp, 1.0f, NULL, 0.0f, 0, 0, 0);
}


/* y of tiles [t0, t1) from Mo [XI, tb, Mp] (the block starts at tile b0). */
static void ss_wino_output_@F@(const ss_wino_job* J, int64_t b0, int64_t t0, int64_t t1, const float* Mo)
{
    const int64_t Mp = J->Mp, stride = J->tb * Mp, P = J->OH * J->OW;
    float ob[@F@ * @F@ * SS_WINO_VL] __attribute__((aligned(64)));
    for (int64_t t = t0; t < t1; ++t) {
        const int64_t n = t / J->Timg, ty = t % J->Timg / J->TW, tx = t % J->TW, oy = @F@ * ty, ox = @F@ * tx;
        float* yn = J->y + n * J->M * P;
        const float* rn = J->res ? J->res + n * J->M * P : NULL;
        const int64_t rows = J->OH - oy < @F@ ? J->OH - oy : @F@, cols = J->OW - ox < @F@ ? J->OW - ox : @F@;
        const float* mt = Mo + (t - b0) * Mp;
        for (int64_t m = 0; m < Mp; m += SS_WINO_VL) {
            ss_wino_v p[@A@][@F@], d[@A@], o[@F@];
            for (int a = 0; a < @A@; ++a) {
                const float* q = mt + a * @A@ * stride + m;
                for (int b = 0; b < @A@; ++b) d[b] = SS_WINO_LD(q + b * stride);
                ss_wino_out_@F@(d, p[a]);
            }
            const ss_wino_v bv = SS_WINO_LD(J->biasp + m);
            for (int j = 0; j < @F@; ++j) {
                for (int a = 0; a < @A@; ++a) d[a] = p[a][j];
                ss_wino_out_@F@(d, o);
                for (int i = 0; i < @F@; ++i)
                    SS_WINO_ST(ob + (i * @F@ + j) * SS_WINO_VL, ss_wino_act(o[i] + bv, J->act));
            }
            const int64_t lanes = J->M - m < SS_WINO_VL ? J->M - m : SS_WINO_VL;
#if defined(__AVX2__) && @F@ == 4
            if (rows == 4 && cols == 4) {
                ss_wino_store_tile(J, ob, lanes, yn + m * P + oy * J->OW + ox, rn ? rn + m * P + oy * J->OW + ox : NULL);
                continue;
            }
#endif
            for (int64_t l = 0; l < lanes; ++l) {
                const int64_t off = (m + l) * P + oy * J->OW + ox;
                float* yp = yn + off;
                if (rn) {
                    const float* rp = rn + off;
                    for (int64_t i = 0; i < rows; ++i)
                        for (int64_t j = 0; j < cols; ++j)
                            yp[i * J->OW + j] = ss_actf(ob[(i * @F@ + j) * SS_WINO_VL + l] + rp[i * J->OW + j],
                                                        J->res_act);
                } else {
                    for (int64_t i = 0; i < rows; ++i)
                        for (int64_t j = 0; j < cols; ++j) yp[i * J->OW + j] = ob[(i * @F@ + j) * SS_WINO_VL + l];
                }
            }
        }
    }
}

/* The whole batch (its tiles one sequence over the images: a block may span two, and a
   batch of small planes makes blocks as large as one large plane); scratch: XI * tb *
   (Cp + Mp) floats per thread, or one set when the threads share the phases. Called inside
   a parallel region by all of its threads. */
static void ss_wino_batch_@F@(const ss_wino_job* J, float* scratch)
{
    const int me = omp_get_thread_num();
    /* The GEMMs run on the calling thread: this sets the ICV of this thread's task only. */
    omp_set_num_threads(1);
    #pragma omp for schedule(static)
    for (int64_t r = 0; r < J->N * J->Hp; ++r) ss_wino_stage_row(J, r);
    const int64_t blocks = (J->T + J->tb - 1) / J->tb;
    if (!J->shared) {
        float* V = scratch + (int64_t)me * @XI@ * J->tb * (J->Cp + J->Mp);
        float* Mo = V + @XI@ * J->tb * J->Cp;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t k = 0; k < blocks; ++k) {
            const int64_t t0 = k * J->tb, t1 = t0 + J->tb < J->T ? t0 + J->tb : J->T;
            ss_wino_input_@F@(J, t0, t1, V);
            ss_wino_gemms_@F@(J, t1 - t0, V, Mo, 0, @XI@);
            ss_wino_output_@F@(J, t0, t0, t1, Mo);
        }
        return;
    }
    /* Every thread takes a share of each phase, on one set of buffers. */
    float* V0 = scratch;
    float* Mo0 = V0 + @XI@ * J->tb * J->Cp;
    for (int64_t k = 0; k < blocks; ++k) {
        const int64_t t0 = k * J->tb, t1 = t0 + J->tb < J->T ? t0 + J->tb : J->T, n = t1 - t0;
        #pragma omp for schedule(static)
        for (int64_t t = t0; t < t1; ++t) ss_wino_input_@F@(J, t, t + 1, V0 + (t - t0) * J->Cp);
        #pragma omp for schedule(static)
        for (int xi = 0; xi < @XI@; ++xi) ss_wino_gemms_@F@(J, n, V0, Mo0, xi, xi + 1);
        #pragma omp for schedule(static)
        for (int64_t t = t0; t < t1; ++t) ss_wino_output_@F@(J, t0, t, t + 1, Mo0);
    }
}

static int ss_wino_run_@F@(const float* x, const float* bias, float* y, int64_t N, int64_t C, int64_t H, int64_t W,
                       int64_t M, int64_t OH, int64_t OW, int64_t ph, int64_t pw, int act, const float* U,
                       const float* res, int res_act, float* work, int64_t work_floats)
{
    ss_wino_job J;
    J.C = C; J.H = H; J.W = W; J.M = M; J.OH = OH; J.OW = OW; J.ph = ph; J.pw = pw;
    J.act = act; J.res_act = res_act; J.U = U;
    J.Cp = (C + SS_WINO_VL - 1) / SS_WINO_VL * SS_WINO_VL;
    J.Mp = (M + SS_WINO_VL - 1) / SS_WINO_VL * SS_WINO_VL;
    J.TW = (OW + @F@ - 1) / @F@;
    J.N = N;
    J.Timg = J.TW * ((OH + @F@ - 1) / @F@);
    J.T = N * J.Timg;
    J.Hp = @F@ * ((OH + @F@ - 1) / @F@) + 2;
    J.Wp = @F@ * J.TW + 2;
    J.part = ss_gemm_packed_b_size(C, M);
    const double macs = @XI@.0 * (double)J.T * (double)C * (double)M;
    const int threads = macs >= SS_WINO_PAR_MIN ? omp_get_max_threads() : 1;
    /* Tiles a block. Every block rereads all of U. While U fits beside a block in L2, blocks
       of V and Mo in about SS_WINO_BLOCK_FLOATS (half of L2), whole GEMM row tiles, at least
       two, and each thread runs whole blocks when there is one or more for each. Past
       that, U comes from L3 or DRAM at every reading (ResNet-50's 256-channel 3 x 3 convs:
       9.4 MB each), so blocks up to SS_WINO_BIG_BLOCK times larger, shared by the threads
       phase by phase (the XI GEMMs split between them: U read once a block in all). */
    const int64_t per_tile = @XI@ * (J.Cp + J.Mp);
    int64_t tb = SS_WINO_BLOCK_FLOATS / per_tile / SS_GEMM_MR * SS_GEMM_MR;
    if (tb < 2 * SS_GEMM_MR) tb = 2 * SS_GEMM_MR;
    const int big_u = @XI@.0 * (double)C * (double)M > (double)SS_WINO_BLOCK_FLOATS;
    if (big_u) {
        /* As few blocks as that budget allows, of about equal size: each block reads all of
           U, and rounding the budget down to whole row tiles left a last block of a few
           tiles that read it all again (ResNet-50's 7x7 stage: 16 tiles as 12 + 4, the 4
           on the B-streaming path, 16 MB of U read twice a conv). */
        int64_t budget = SS_WINO_BIG_BLOCK * SS_WINO_BLOCK_FLOATS / per_tile;
        if (budget < 1) budget = 1;  /* tiles wider than the budget (thousands of channels) */
        const int64_t blocks = (J.T + budget - 1) / budget;
        const int64_t big = ((J.T + blocks - 1) / blocks + SS_GEMM_MR - 1) / SS_GEMM_MR * SS_GEMM_MR;
        if (big > tb) tb = big;
    } else if (threads > 1 && J.T > 2 * SS_GEMM_MR * threads) {
        const int64_t share = (J.T + threads - 1) / threads;
        if (tb > share) tb = (share + SS_GEMM_MR - 1) / SS_GEMM_MR * SS_GEMM_MR;
    }
    if (tb > J.T) tb = J.T;
    J.tb = tb;
    /* Shared only with fewer blocks than threads: with one block a thread, a 16 -> 16 conv on
       32 x 48 (96 tiles) ran 55-66 us a call at 2 threads against 79-99 shared (1 thread:
       81), the three phases' barriers and V and Mo crossing between the cores gone. */
    J.shared = threads > 1 && (big_u || (J.T + tb - 1) / tb < threads);
    const int64_t per_thread = tb * per_tile, buffers = J.shared ? 1 : threads;
    /* In the caller's scratch when it is large enough (the VM's arena: its pages stay mapped
       from run to run, where a large malloc may come back as fresh pages to fault in). */
    const int64_t xp_floats = N * J.Hp * J.Wp * J.Cp + SS_WINO_VL, scratch_floats = per_thread * buffers + J.Mp + SS_WINO_VL;
    const int own = !work || xp_floats + scratch_floats > work_floats;
    float* xp = own ? (float*)ss_wino_alloc(xp_floats) : work;
    float* scratch = own ? (float*)ss_wino_alloc(scratch_floats) : work + xp_floats;
    if (!xp || !scratch) {
        free(xp);
        free(scratch);
        return 0;
    }
    float* biasp = scratch + per_thread * buffers;
    for (int64_t m = 0; m < J.Mp; ++m) biasp[m] = bias && m < M ? bias[m] : 0.0f;
    J.xp = xp;
    J.biasp = biasp;
    J.x = x;
    J.y = y;
    J.res = res;
    #pragma omp parallel num_threads(threads) if(threads > 1)
    ss_wino_batch_@F@(&J, scratch);
    if (own) {
        free(xp);
        free(scratch);
    }
    return 1;
}
"""

_CONV2D_PARAMS = ("const float* x", "const float* w", "const float* bias", "float* y", "int64_t N", "int64_t C",
                  "int64_t H", "int64_t W", "int64_t M", "int64_t KH", "int64_t KW", "int64_t OH", "int64_t OW",
                  "int64_t sh", "int64_t sw", "int64_t ph", "int64_t pw", "int64_t dh", "int64_t dw", "int64_t group",
                  "int act", "float* work", "const float* wpacked", "const float* direct", "const float* res",
                  "int res_act")

#: G of each tile size (F + 2 rows): the weight transform U = G g G^T, in double at packing.
_G = {
    4: "{0.25, 0.0, 0.0}, {-1.0 / 6, -1.0 / 6, -1.0 / 6}, {-1.0 / 6, 1.0 / 6, -1.0 / 6}, "
       "{1.0 / 24, 1.0 / 12, 1.0 / 6}, {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0.0, 0.0, 1.0}",
    2: "{1.0, 0.0, 0.0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0.0, 0.0, 1.0}",
}
#: Entry-point names of each tile size: F(4x4) keeps the plain names.
ENTRY_NAMES = {4: "wino", 2: "wino2"}


def _entries(f: int) -> tuple:
    a, name = f + 2, ENTRY_NAMES[f]
    return (
        Function("int64_t", f"ss_conv_{name}_packed_b_size", ("int64_t K", "int64_t N"), f"""
    if (K <= 0 || N <= 0 || K % 9) return 0;
    return {a * a} * ss_gemm_packed_b_size(K / 9, N);"""),
        Function("void", f"ss_conv_{name}_pack_b", ("int64_t K", "int64_t N", "const float* B", "int64_t rsb",
                                                    "int64_t csb", "float* packed"), f"""
    if (K <= 0 || N <= 0 || K % 9) return;
    /* U = G g G^T per (c, n), written straight into ss_gemm_pack_b's layout of each U[xi]
       (kernels/gemm.py): block k0 of SS_GEMM_KC rows at k0 * Np, panel q at q * NR * kb. */
    static const double G[{a}][3] = {{{_G[f]}}};
    const int64_t C = K / 9, Np = (N + SS_GEMM_NR - 1) / SS_GEMM_NR * SS_GEMM_NR, part = ss_gemm_packed_b_size(C, N);
    for (int64_t c = 0; c < C; ++c) {{
        const int64_t k0 = c / SS_GEMM_KC * SS_GEMM_KC, kb = C - k0 < SS_GEMM_KC ? C - k0 : SS_GEMM_KC, k = c - k0;
        for (int64_t n = 0; n < Np; ++n) {{
            double g[3][3], t[{a}][3];
            for (int r = 0; r < 3; ++r)
                for (int s = 0; s < 3; ++s) g[r][s] = n < N ? (double)B[(c * 9 + r * 3 + s) * rsb + n * csb] : 0.0;
            for (int i = 0; i < {a}; ++i)
                for (int s = 0; s < 3; ++s) t[i][s] = G[i][0] * g[0][s] + G[i][1] * g[1][s] + G[i][2] * g[2][s];
            const int64_t at = k0 * Np + (n / SS_GEMM_NR) * SS_GEMM_NR * kb + k * SS_GEMM_NR + n % SS_GEMM_NR;
            for (int i = 0; i < {a}; ++i)
                for (int j = 0; j < {a}; ++j)
                    packed[(i * {a} + j) * part + at] = (float)(t[i][0] * G[j][0] + t[i][1] * G[j][1] + t[i][2] * G[j][2]);
        }}
    }}"""),
        Function("void", f"ss_conv2d_{name}", _CONV2D_PARAMS, f"""
    if (N <= 0 || M <= 0 || OH <= 0 || OW <= 0) return;
    if (wpacked && KH == 3 && KW == 3 && sh == 1 && sw == 1 && dh == 1 && dw == 1 && group == 1 &&
        OH * OW >= {MIN_PLANE} &&
        ss_wino_run_{f}(x, bias, y, N, C, H, W, M, OH, OW, ph, pw, act, wpacked, res, res_act, work,
                      N * ss_conv2d_work_size(C, KH, KW, OH, OW, group)))
        return;
    ss_conv2d_residual(x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, group, act, work,
                       direct, res, res_act);"""),
    )


_PICK = Function("void", "ss_conv2d_wino_pick", (*_CONV2D_PARAMS[:-3], "const float* wpacked2", *_CONV2D_PARAMS[-3:]), f"""
    /* winograd_tiles' rule on the batch's F(4x4) tiles, now that they are known. */
    if (N * ((OH + 3) / 4) * ((OW + 3) / 4) < {SMALL_TILE_ROWS})
        ss_conv2d_wino2(x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, group, act, work,
                        wpacked2, direct, res, res_act);
    else
        ss_conv2d_wino(x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, group, act, work,
                       wpacked, direct, res, res_act);""")


def fragment(target: Optional[Target] = None, par_min: int = PAR_MIN_MACS,
             block_floats: Optional[int] = None) -> Fragment:
    """The fragment for ``target`` (this machine's when None): its blocks sized to half its
    L2 (``block_floats`` instead: tests take many small blocks or one large one)."""
    from ...target import host_target

    if block_floats is None:
        block_floats = (target or host_target()).caches.l2 // 4 // 2
    parts: list = [Private(fill(_COMMON, BLOCK_FLOATS=int(block_floats), PAR_MIN=float(par_min), BIG_BLOCK=BIG_BLOCK))]
    for f in TILES:
        parts += [Private(_TRANSFORMS[f]), Private(fill(_VARIANT, F=f, A=f + 2, XI=(f + 2) ** 2))]
    for f in TILES:
        parts += _entries(f)
    return Fragment([*parts, _PICK])


def source(target: Optional[Target] = None, **parameters) -> str:
    return fragment(target, **parameters).text()
