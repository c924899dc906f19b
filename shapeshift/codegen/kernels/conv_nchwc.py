"""Convolutions over the blocked channel layout NCHWc (see nchwc.py for the layout).

Exported C (L = 8 or 16, the block; one set per width)::

    /* Dense or grouped 2-D conv (1-D is H = 1) into y [N, ceil(M/L), OH, OW, L].
       x: blocked [N, ceil(C/L), H, W, L] when xblk == L, or plain [N, C, H, W] when
       xblk == 1 (group 1 only: a network's first conv reads its image as it comes, with no
       reorder and no padding of its 3 channels to a block).
       w: packed by pack_dense() as [ceil(M/L), IB, KH, KW, xblk, L], IB = input blocks per
       group (ceil(C/group/L)) or, plain, C channels; lanes past M (and past C) zero.
       bias: NULL or [ceil(M/L) * L], zero past M. Grouped convs need C/group and M/group
       to be multiples of L (the caller checks), so that no block straddles two groups.
       Begin pads ph, pw (end pads implied by OH, OW); strides sh, sw; dilations dh, dw.
       Epilogue: v = act(acc + bias; a0, a1); when res (y's layout) is not NULL
       v = act2(v + res; b0, b1); lanes past M stored as zero (nchwc.py's codes). */
    void ss_conv_nchwc_L(const float* x, const float* w, const float* bias, float* y,
                         int64_t N, int64_t C, int64_t H, int64_t W, int64_t M,
                         int64_t KH, int64_t KW, int64_t OH, int64_t OW, int64_t sh, int64_t sw,
                         int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t group, int64_t xblk,
                         const float* res, int act, float a0, float a1, int act2, float b0, float b1);

    /* Depthwise conv (group == C == M), channels in lanes: x [N, ceil(C/L), H, W, L],
       w packed by pack_depthwise() as [ceil(C/L), KH, KW, L], the same epilogue. */
    void ss_dwconv_nchwc_L(const float* x, const float* w, const float* bias, float* y,
                           int64_t N, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,
                           int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                           int64_t dh, int64_t dw,
                           const float* res, int act, float a0, float a1, int act2, float b0, float b1);

How: the dense conv computes register tiles of RX output pixels along a row x 2 output
blocks (RX from the register file: 6 for 16 registers, 12 for 32, so that 2 * RX
accumulators, 2 weight vectors and a broadcast fit), accumulating over input blocks, taps
and the L lanes of each input block: every step is one broadcast of an input value and
two vector loads of weights, the weights being in the order the loop reads them. No
image is copied or padded: tiles whose taps all fall inside the row (nearly all of them)
take a path with no bounds checks, the few at the borders one that checks each pixel. A
1x1 stride-1 unpadded conv is called with the plane as one row (H = 1, W = H * W), which
makes it a GEMM [pixels x C] x [C x M] that reads the activations in place: no packing,
no transposes; 1x1 unpadded convs (any stride) take a kernel of their own blocked for the
caches (``ss_cnc_pointwise_L``: input channels in chunks whose weights stay in L1, output
pixels in ranges whose input stays in L2). The depthwise conv keeps the channels in the
lanes: for 3x3, 5x5 and 7x7 taps (7-wide rows) at stride 1 or 2, tiles of 8 output
pixels and the rest in one of 7, 6, 4, 2 or 1 (moved left over done pixels where wider),
each input vector loaded once for all the tile's taps that read it, the tiles at a row's
ends skipping the input columns in the padding; other taps through a tile with a load per
tap and pixel, its border tiles checked or its rows staged with their padding.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...target import Target, registers_of_width
from ..cwriter import CWriter, Fragment, Function, Private, fill
from .nchwc import block_width

DEPENDS = ("nchwc",)
#: Depthwise tile: output pixels per register tile (one accumulator each).
DW_PIXELS = 8
#: The entry points: ss_conv_nchwc_L (dense and grouped) and ss_dwconv_nchwc_L.
ENTRIES = ("dense", "depthwise")


def dense_pixels(lanes: int, registers: int) -> int:
    """Output pixels per dense register tile: 2 blocks x RX accumulators, 2 weight vectors
    and one broadcast within the register file (16 ymm with AVX2, 32 with AVX-512)."""
    return max(1, min(12, (registers - 4) // 2))


def dw_widths(dw_pixels: int) -> list[int]:
    """The depthwise fixed tile's widths, widest first: DW_PIXELS (or the tuned width), 7 and 6
    (MobileNet's rows of 7 and 14 output pixels: 7, 8 + 6), 4, 2 and 1. Without 7 a row of 7
    took a tile of 6 and one of 1, whose single FMA chain waits on each FMA: 480 channels 5x5
    stride 2 on 14x14 1.3x the time (AMD Zen 4)."""
    return sorted({dw_pixels, *(w for w in (7, 6, 4, 2, 1) if w < dw_pixels)}, reverse=True)


def default_pixels(lanes: int) -> int:
    """The untuned dense tile's pixels for blocks of ``lanes`` floats."""
    return dense_pixels(lanes, registers_of_width(lanes))


# How the dense and depthwise kernels walk a row (both widths: emitted once per fragment).
_NEXT_TILE = r"""
/* The next tile of a row walked from rs0 to re whose inside (no tap in the pad) is [lo, hi):
   the borders in checked tiles of 4 (1 where fewer are left), the last one on the right
   overlapping the one before; the inside in tiles of `full`, the rest as one such tile
   overlapping the last (the same values again) where the inside has `full` pixels and at
   least `full_overlap` are left, else in tiles of `mid` (one overlapping the last too where
   mid_overlap and the inside has `mid` pixels) and 1. No tile leaves [rs0, re). Moves *ox
   back where a tile overlaps the last; returns the tile's width and sets *edge where its
   taps must be checked.
   The dense kernel overlaps a full tile only for more than half a tile: a 1x1 conv on 7x7
   is a row of 49 pixels, and its last pixel in a 12-pixel tile computed 11 again (60 pixels
   for 49); in a 4-tile and a 1 it took 9% less time for MobileNetV3's 96->576->96 block at
   batch 4 (Zen 4). From 8 pixels left on, the overlapping tile was as fast or faster. */
static inline int ss_cnc_next_tile(int64_t* ox, int64_t rs0, int64_t lo, int64_t hi, int64_t re,
                                   const int full, const int full_overlap, const int mid, const int mid_overlap,
                                   int* edge)
{
    const int64_t o = *ox;
    *edge = 1;
    if (o < lo) return o + 4 <= re ? 4 : 1;
    if (o < hi) {
        *edge = 0;
        if (o + full <= hi) return full;
        if (hi - lo >= full && hi - o >= full_overlap) { *ox = hi - full; return full; }
        if (o + mid <= hi) return mid;
        if (mid_overlap && hi - lo >= mid) { *ox = hi - mid; return mid; }
        return 1;
    }
    if (o + 4 <= re) return 4;
    if (re - rs0 >= 4) { *ox = re - 4; return 4; }
    return 1;
}
"""

_FMA = r"""
/* a * b + c in one rounding: the fragment is compiled as ISO C, where gcc does not
   contract a * b + c on its own. */
static inline ss_vf@L@ ss_cnc_fma_@L@(ss_vf@L@ a, ss_vf@L@ b, ss_vf@L@ c)
{
#if @L@ == 16 && defined(__AVX512F__)
    return (ss_vf@L@)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
    union { ss_vf@L@ v; __m256 h[@L@ / 8]; } x = {a}, y = {b}, z = {c};
    for (int k = 0; k < @L@ / 8; k++) z.h[k] = _mm256_fmadd_ps(x.h[k], y.h[k], z.h[k]);
    return z.v;
#else
    return a * b + c;
#endif
}

/* A broadcast two blocks' FMAs share, made once into a register: left alone, gcc folds it
   into each FMA as an embedded broadcast, one load per FMA where one per pixel does. */
#if (@L@ == 8 && defined(__AVX__)) || (@L@ == 16 && defined(__AVX512F__))
#define SS_CNC_IN_REGISTER_@L@(v, nb) do { if ((nb) > 1) __asm__("" : "+v"(v)); } while (0)
#else  /* a vector wider than the registers: nothing to pin */
#define SS_CNC_IN_REGISTER_@L@(v, nb) do { (void)(nb); } while (0)
#endif

/* s in every lane (one vbroadcastss; 0 + s would be a scalar add first). */
static inline ss_vf@L@ ss_cnc_splat_@L@(float s)
{
#if @L@ == 16 && defined(__AVX512F__)
    return (ss_vf@L@)_mm512_set1_ps(s);
#elif defined(__AVX__)
    union { ss_vf@L@ v; __m256 h[@L@ / 8]; } x;
    for (int k = 0; k < @L@ / 8; k++) x.h[k] = _mm256_set1_ps(s);
    return x.v;
#else
    ss_vf@L@ v;
    for (int l = 0; l < @L@; l++) v[l] = s;
    return v;
#endif
}
"""

_DENSE_TILE = r"""
/* What a tap in the zero padding reads (a whole block: a plain input reads lane 0 only). */
static const float ss_cnc_zeros_@L@[@L@] __attribute__((aligned(64))) = {0};
/* One tile: acc[j][b] += sum over input blocks, taps and lanes, for j < RX pixels of the
   row and b < nb output blocks. nb, xblk and edge are constants at each call site. */
static inline __attribute__((always_inline)) void ss_cnc_tile_@L@(
    const float* xg, const float* wo, int64_t wob, const int nb, const int xblk, const int edge, const int rx,
    int64_t IB, int64_t KH, int64_t KW, int64_t bs, int64_t rs, int64_t H, int64_t W,
    int64_t iy0, int64_t dh, int64_t ix0, int64_t sw, int64_t dw, ss_vf@L@ acc[@RX@][2])
{
    for (int64_t ib = 0; ib < IB; ib++) {
        const float* xb = xg + ib * bs;
        const float* wb = wo + ib * KH * KW * xblk * @L@;
        for (int64_t ky = 0; ky < KH; ky++) {
            const int64_t iy = iy0 + ky * dh;
            if (iy < 0 || iy >= H) continue;
            const float* xr = xb + iy * rs;
            for (int64_t kx = 0; kx < KW; kx++) {
                const int64_t ixk = ix0 + kx * dw;
                const float* wp = wb + (ky * KW + kx) * xblk * @L@;
                /* A pixel of a border tile whose tap falls in the pad reads a block of zeros. */
                const float* px[@RX@];
                for (int j = 0; j < rx; j++) {
                    const int64_t ix = ixk + j * sw;
                    px[j] = edge && (ix < 0 || ix >= W) ? ss_cnc_zeros_@L@ : xr + ix * xblk;
                }
                #pragma GCC unroll 16
                for (int cl = 0; cl < xblk; cl++) {
                    const ss_vf@L@ w0 = *(const ss_vfu@L@*)(wp + cl * @L@);
                    ss_vf@L@ w1 = {0};
                    if (nb > 1) w1 = *(const ss_vfu@L@*)(wp + wob + cl * @L@);
                    #pragma GCC unroll 16
                    for (int j = 0; j < rx; j++) {
                        const float xs = px[j][cl];
                        ss_vf@L@ xv = ss_cnc_splat_@L@(xs);
                        SS_CNC_IN_REGISTER_@L@(xv, nb);
                        acc[j][0] = ss_cnc_fma_@L@(xv, w0, acc[j][0]);
                        if (nb > 1) acc[j][1] = ss_cnc_fma_@L@(xv, w1, acc[j][1]);
                    }
                }
            }
        }
    }
}

static __attribute__((noinline)) void ss_cnc_tile_any_@L@(
    const float* xg, const float* wo, int64_t wob, int nb, int xblk, int edge, int rx,
    int64_t IB, int64_t KH, int64_t KW, int64_t bs, int64_t rs, int64_t H, int64_t W,
    int64_t iy0, int64_t dh, int64_t ix0, int64_t sw, int64_t dw, ss_vf@L@ acc[@RX@][2])
{
    ss_cnc_tile_@L@(xg, wo, wob, nb, xblk, edge, rx, IB, KH, KW, bs, rs, H, W, iy0, dh, ix0, sw, dw, acc);
}

/* A tile of rx pixels taken in row-major order over the whole output plane (planes narrower
   than 2 RX: row tiles would be mostly borders and short tails there): each pixel's
   address per tap, or the zero block where the tap falls in the pad. */
static inline __attribute__((always_inline)) void ss_cnc_flat_@L@(
    const float* xg, const float* wo, int64_t wob, const int nb, const int xblk, const int rx,
    int64_t IB, int64_t KH, int64_t KW, int64_t bs, int64_t rs, int64_t H, int64_t W,
    const int64_t* iy0, const int64_t* ix0, int64_t dh, int64_t dw, ss_vf@L@ acc[@RX@][2])
{
    for (int64_t ib = 0; ib < IB; ib++) {
        const float* xb = xg + ib * bs;
        const float* wb = wo + ib * KH * KW * xblk * @L@;
        for (int64_t ky = 0; ky < KH; ky++)
            for (int64_t kx = 0; kx < KW; kx++) {
                const float* wp = wb + (ky * KW + kx) * xblk * @L@;
                const float* px[@RX@];
                for (int j = 0; j < rx; j++) {
                    const int64_t iy = iy0[j] + ky * dh, ix = ix0[j] + kx * dw;
                    px[j] = iy < 0 || iy >= H || ix < 0 || ix >= W ? ss_cnc_zeros_@L@ : xb + iy * rs + ix * xblk;
                }
                #pragma GCC unroll 16
                for (int cl = 0; cl < xblk; cl++) {
                    const ss_vf@L@ w0 = *(const ss_vfu@L@*)(wp + cl * @L@);
                    ss_vf@L@ w1 = {0};
                    if (nb > 1) w1 = *(const ss_vfu@L@*)(wp + wob + cl * @L@);
                    #pragma GCC unroll 16
                    for (int j = 0; j < rx; j++) {
                        ss_vf@L@ xv = ss_cnc_splat_@L@(px[j][cl]);
                        SS_CNC_IN_REGISTER_@L@(xv, nb);
                        acc[j][0] = ss_cnc_fma_@L@(xv, w0, acc[j][0]);
                        if (nb > 1) acc[j][1] = ss_cnc_fma_@L@(xv, w1, acc[j][1]);
                    }
                }
            }
    }
}

/* Any activation, out of line: what the rarer codes and border tiles call. */
static __attribute__((noinline)) ss_vf@L@ ss_cnc_act_any_@L@(ss_vf@L@ v, int act, float a0, float a1)
{
    return ss_nchwc_act_@L@(v, act, a0, a1);
}

/* bias, act, residual, act2 and the zeroed lanes past M, then the store. act is a constant
   where the caller made it one (inlined then); act2 after a residual is none or Relu inline,
   anything else a call. */
static inline __attribute__((always_inline)) ss_vf@L@ ss_cnc_epilogue_@L@(
    ss_vf@L@ v, const float* res, const int act, float a0, float a1, int act2, float b0, float b1, int last,
    ss_vi@L@ keep)
{
    v = ss_nchwc_act_@L@(v, act, a0, a1);
    if (res) {
        v += *(const ss_vfu@L@*)res;
        if (act2 == 1) v = ss_nchwc_max_@L@(v, (ss_vf@L@){0});
        else if (act2) v = ss_cnc_act_any_@L@(v, act2, b0, b1);
    }
    if (last) v = (ss_vf@L@)((ss_vi@L@)v & keep);
    return v;
}

/* A tile's accumulators stored as they are: nb blocks (block b at yb + b * bstep) of rx
   pixels (pixel j at + j * pstep floats). nb and rx are constants at the hot tiles' calls:
   unrolled, the accumulators never leave the registers. */
static inline __attribute__((always_inline)) void ss_cnc_store_@L@(
    float* yb, int64_t bstep, int64_t pstep, const int nb, const int rx, ss_vf@L@ acc[][2])
{
    #pragma GCC unroll 2
    for (int b = 0; b < nb; b++)
        #pragma GCC unroll 16
        for (int j = 0; j < rx; j++)
            *(ss_vfu@L@*)(yb + b * bstep + j * pstep) = acc[j][b];
}

/* The epilogue over a tile just stored (still in L1): the activation chosen once per tile,
   then a rolled loop with it as a constant. Picking it per vector (a jump table before every
   store, the accumulators on the stack) made a 1x1 16->72 conv on 56x56 take 1.2x as long,
   and inlining each activation into every tile's store made the fragment's object 1.5x and
   gcc's time on it 2.4x. res: NULL or at the same offsets from rb; block `last` (or -1) has
   its lanes past M zeroed. */
static __attribute__((noinline)) void ss_cnc_post_@L@(
    float* yb, const float* rb, int64_t bstep, int64_t pstep, int nb, int rx, int act,
    float a0, float a1, int act2, float b0, float b1, int last, ss_vi@L@ keep)
{
#define SS_CNC_POST(ACT) \
    for (int b = 0; b < nb; b++) \
        for (int j = 0; j < rx; j++) { \
            const int64_t off = b * bstep + j * pstep; \
            *(ss_vfu@L@*)(yb + off) = ss_cnc_epilogue_@L@(*(const ss_vfu@L@*)(yb + off), rb ? rb + off : NULL, ACT, \
                                                         a0, a1, act2, b0, b1, b == last, keep); \
        }
    switch (act) {
    case 0: SS_CNC_POST(0); break;
    case 1: SS_CNC_POST(1); break;
    case 2: SS_CNC_POST(2); break;
    case 3: SS_CNC_POST(3); break;
    case 6: SS_CNC_POST(6); break;
    default: SS_CNC_POST(act);
    }
#undef SS_CNC_POST
}

/* A tile's accumulators stored as they are; NB (1 or 2) becomes a constant for the store. */
#define SS_CNC_PUT_@L@(YB, BSTEP, PSTEP, NB, RXT, ACC) do { \
    if ((NB) == 2) ss_cnc_store_@L@(YB, BSTEP, PSTEP, 2, RXT, ACC); \
    else ss_cnc_store_@L@(YB, BSTEP, PSTEP, 1, RXT, ACC); \
} while (0)
/* The epilogue over RX stored pixels of NB blocks, skipped where there is none (no
   activation ACT, no residual, no lanes past M: LAST is -1 then): after each tile, or
   once per row or run of them. */
#define SS_CNC_EPILOGUE_@L@(YB, RB, BSTEP, PSTEP, NB, RX, ACT, LAST) do { \
    if ((ACT) || (RB) || ((LAST) >= 0 && (LAST) < (NB))) \
        ss_cnc_post_@L@(YB, RB, BSTEP, PSTEP, NB, RX, ACT, a0, a1, act2, b0, b1, LAST, keep); \
} while (0)
/* A tile's store and its epilogue. */
#define SS_CNC_STORE_@L@(YB, RB, BSTEP, PSTEP, NB, RXT, LAST, ACC) do { \
    SS_CNC_PUT_@L@(YB, BSTEP, PSTEP, NB, RXT, ACC); \
    SS_CNC_EPILOGUE_@L@(YB, RB, BSTEP, PSTEP, NB, RXT, act, LAST); \
} while (0)
"""

_POINTWISE = r"""
/* A 1 x 1 unpadded conv of a blocked input, group 1 (any stride): a GEMM [pixels x C] x
   [C x M] whose operands are read where they lie, blocked for the caches. The input blocks
   are taken in chunks of CB whose weights for two output blocks take a quarter of L1, the
   output pixels in ranges of PR (in raster order over the plane, tiles within its rows)
   whose chunk of input takes a quarter of L2; a work item (image, range, group of
   output-block pairs) runs each chunk over its pairs, each pair over the range's tiles: the
   chunk's input stays in L2 for every pair, the pair's weights in L1 for every tile.
   Chunks after the first add to what y holds; the last applies the epilogue, once per range
   and pair. Through the general row kernel, with neither blocking nor the named tiles,
   every tile read all of C's weights (64 KB for a pair at C = 1024, past L1) and every pair
   all of the row's input (past L2): ResNet-50's 512 -> 128 conv on 28 x 28 took 1.65 ms
   (62 GFLOPS), here 1.06 (97; AMD Zen 2, 1 thread, best of 5 processes). A software
   prefetch of the next input blocks' lines, 1 to 4 blocks ahead, made it no faster. */
static __attribute__((noinline)) void ss_cnc_pointwise_@L@(
    const float* x, const float* w, const float* bias, float* y, int64_t N, int64_t C, int64_t H, int64_t W,
    int64_t M, int64_t OH, int64_t OW, int64_t sh, int64_t sw,
    const float* res, int act, float a0, float a1, int act2, float b0, float b1)
{
    const int64_t MB = (M + @L@ - 1) / @L@, IB = (C + @L@ - 1) / @L@, NP = (MB + 1) / 2;
    const int64_t bs = H * W * @L@, ybs = OH * OW * @L@, wob = IB * @L@ * @L@;
    int64_t CB = SS_CNC_L1_FLOATS / @L1SHARE@ / (2 * @L@ * @L@);
    if (CB < 1) CB = 1;
    const int64_t chunks = (IB + CB - 1) / CB;
    CB = (IB + chunks - 1) / chunks;
    /* A strided conv reads one pixel in sw of each input row it reads: its lines hold sw
       times the floats it uses. */
    int64_t PR = SS_CNC_L2_FLOATS / @L2SHARE@ / (CB * @L@ * sw) / @RX@ * @RX@;
    if (PR < @RX@) PR = @RX@;
    const int64_t P = OH * OW;
    /* A range is a whole number of units: rows of OW pixels where a range holds a row (a
       range that cut rows gave them short tiles at both ends), else tiles of RX pixels.
       Range r takes units [r * count / ranges, (r + 1) * count / ranges): sizes differ by
       one unit at most, so that equal numbers of ranges are equal work. */
    const int whole_rows = OH > 1 && PR >= OW;
    const int64_t unit = whole_rows ? OW : @RX@, count = whole_rows ? OH : (P + @RX@ - 1) / @RX@;
    const int64_t per_range = PR / unit;
    int64_t ranges = (count + per_range - 1) / per_range;
    const int par = N * M * P * C >= SS_CNC_PAR_MIN;
    const int64_t threads = par ? omp_get_max_threads() : 1;
    /* Pairs split into groups where the ranges give the threads too few items. */
    int64_t OG = N * ranges < 4 * threads ? (4 * threads + N * ranges - 1) / (N * ranges) : 1;
    if (OG > NP) OG = NP;
    if (threads > 1 && N * ranges * OG < 4 * threads) {
        /* Too few pairs as well (few output channels: MobileNetV3's 88 -> 24 on 28 x 28 was
           one item, run on one of two threads): cut the plane finer, into a number of items
           that the threads share evenly where the plane has the units for it. */
        int64_t want = (4 * threads + N * OG - 1) / (N * OG);
        while ((N * OG * want) % threads && want < count) want++;
        ranges = want < count ? want : count;
    }
    ss_vi@L@ keep;
    for (int l = 0; l < @L@; l++) keep[l] = (MB - 1) * @L@ + l < M ? -1 : 0;
    const int64_t pad_block = M % @L@ ? MB - 1 : -1;
    #pragma omp parallel for collapse(3) if(par)
    for (int64_t n = 0; n < N; n++)
        for (int64_t r = 0; r < ranges; r++)
            for (int64_t og = 0; og < OG; og++) {
                /* The range: output pixels [p0, p1) of the plane, in rows of OW. */
                const int64_t p0 = r * count / ranges * unit, p1_ = (r + 1) * count / ranges * unit;
                const int64_t p1 = p1_ < P ? p1_ : P;
                const int64_t q0 = og * NP / OG, q1 = (og + 1) * NP / OG;
                for (int64_t ib0 = 0; ib0 < IB; ib0 += CB) {
                    const int64_t nib = IB - ib0 < CB ? IB - ib0 : CB;
                    const int first = ib0 == 0, last = ib0 + nib == IB;
                    const int tail = last ? (int)(C - (IB - 1) * @L@) : @L@;
                    const float* xc = x + (n * IB + ib0) * bs;
                    for (int64_t q = q0; q < q1; q++) {
                        const int64_t ob = 2 * q;
                        const int nb = ob + 1 < MB ? 2 : 1;
                        const float* wo = w + ob * wob + ib0 * @L@ * @L@;
                        float* yb = y + (n * MB + ob) * ybs;
                        const float* bo = bias ? bias + ob * @L@ : NULL;
                        for (int64_t oy = p0 / OW; oy * OW < p1; oy++) {
                            const int64_t ox0 = p0 > oy * OW ? p0 - oy * OW : 0;
                            const int64_t ox1 = p1 < (oy + 1) * OW ? p1 - oy * OW : OW;
                            const float* xg = xc + oy * sh * W * @L@;
                            float* yr = yb + oy * OW * @L@;
/* The tile at ox of RXT pixels, its stride a constant where it is 1 or 2: a stride known
   only at run time costs a register per pixel, and gcc then spilled them (a 256 -> 512
   stride-2 conv on 56 x 56 took 3.65 ms, 2.4 through the NCHW GEMM; AMD Zen 2). */
#define SS_CNC_PW(RXT, NB) do { \
                                if (sw == 1) ss_cnc_pw_@L@_##RXT##x##NB(xg + ox * @L@, @L@, bs, wo, wob, nib, tail, \
                                                                     yr + ox * @L@, ybs, !first, bo); \
                                else if (sw == 2) ss_cnc_pw_@L@_##RXT##x##NB(xg + ox * 2 * @L@, 2 * @L@, bs, wo, wob, nib, \
                                                                          tail, yr + ox * @L@, ybs, !first, bo); \
                                else ss_cnc_pw_@L@_##RXT##x##NB(xg + ox * sw * @L@, sw * @L@, bs, wo, wob, nib, tail, \
                                                              yr + ox * @L@, ybs, !first, bo); \
                            } while (0)
#define SS_CNC_PW_TILE(RXT) do { if (nb == 2) SS_CNC_PW(RXT, 2); else SS_CNC_PW(RXT, 1); } while (0)
                            int64_t ox = ox0;
                            for (; ox + @RX@ <= ox1; ox += @RX@) SS_CNC_PW_TILE(@RX@);
                            if (ox + 4 <= ox1) { SS_CNC_PW_TILE(4); ox += 4; }
                            for (; ox < ox1; ox++) SS_CNC_PW_TILE(1);
#undef SS_CNC_PW_TILE
#undef SS_CNC_PW
                        }
                        if (last) {
                            const int64_t off = (n * MB + ob) * ybs + p0 * @L@;
                            SS_CNC_EPILOGUE_@L@(y + off, res ? res + off : NULL, ybs, @L@, nb, (int)(p1 - p0), act,
                                                (int)(pad_block - ob));
                        }
                    }
                }
            }
}
"""

_DENSE = r"""
if (KH == 1 && KW == 1 && ph == 0 && pw == 0 && xblk == @L@ && group == 1 && OH * OW >= @RX@) {
    ss_cnc_pointwise_@L@(x, w, bias, y, N, C, H, W, M, OH, OW, sh, sw, res, act, a0, a1, act2, b0, b1);
    return;
}
const int64_t MB = (M + @L@ - 1) / @L@;
const int64_t MBg = MB / group;
const int64_t IB = xblk == @L@ ? (C / group + @L@ - 1) / @L@ : C / group;
const int64_t x_img = (xblk == @L@ ? (C + @L@ - 1) / @L@ * @L@ : C) * H * W;
const int64_t bs = H * W * xblk, rs = W * xblk;
const int64_t wob = IB * KH * KW * xblk * @L@;
const int64_t NP = (MBg + 1) / 2;
/* Output pixels whose taps all fall inside the row: ox in [ox_lo, ox_hi]. */
const int64_t ox_lo = (pw + sw - 1) / sw;
const int64_t span = W - 1 - (KW - 1) * dw + pw;
const int64_t ox_hi = span < 0 ? -1 : span / sw;
ss_vi@L@ keep;
for (int l = 0; l < @L@; l++) keep[l] = (MB - 1) * @L@ + l < M ? -1 : 0;
/* The block whose lanes past M the epilogue zeroes, or -1 where M fills its blocks. */
const int64_t pad_block = M % @L@ ? MB - 1 : -1;
if (N > 1 && H * W == 1 && OH * OW == 1 && KH == 1 && KW == 1 && xblk == @L@) {
    /* A 1x1 conv of 1x1 planes (squeeze-excite's, after a global pool) on a batch: the images
       are a tile's pixels (the flat tile with image n as row n, rows x_img apart), so the
       weights are read once per tile of up to RX images, not once per image, and the tile
       has images x blocks FMA chains where one image had 2. */
    const int64_t T = (N + @RX@ - 1) / @RX@;
    #pragma omp parallel for collapse(2) if(N * M * (C / group) >= SS_CNC_PAR_MIN)
    for (int64_t gp = 0; gp < group * NP; gp++)
        for (int64_t t = 0; t < T; t++) {
            const int64_t g = gp / NP, ob = g * MBg + 2 * (gp % NP);
            const int nb = ob + 1 < (g + 1) * MBg ? 2 : 1;
            const int64_t n0 = t * @RX@;
            const int rx = N - n0 < @RX@ ? (int)(N - n0) : @RX@;
            int64_t iy0[@RX@], ix0[@RX@];
            for (int j = 0; j < @RX@; j++) { iy0[j] = n0 + (j < rx ? j : 0); ix0[j] = 0; }
            ss_vf@L@ acc[@RX@][2];
            for (int j = 0; j < @RX@; j++)
                for (int b = 0; b < 2; b++)
                    acc[j][b] = bias && b < nb ? *(const ss_vfu@L@*)(bias + (ob + b) * @L@) : (ss_vf@L@){0};
            const float* xg = x + g * IB * bs;
            if (nb == 2) ss_cnc_flat_@L@(xg, w + ob * wob, wob, 2, @L@, rx, IB, 1, 1, bs, x_img, N, 1, iy0, ix0, 1, 1, acc);
            else ss_cnc_flat_@L@(xg, w + ob * wob, wob, 1, @L@, rx, IB, 1, 1, bs, x_img, N, 1, iy0, ix0, 1, 1, acc);
            const int64_t off = (n0 * MB + ob) * @L@;
            SS_CNC_STORE_@L@(y + off, res ? res + off : NULL, @L@, MB * @L@, nb, rx, (int)(pad_block - ob), acc);
        }
    return;
}
if (OW < 2 * @RX@ && OH * OW >= @RX@ && xblk == @L@) {
    /* Narrow planes: tiles of RX pixels in row-major order over the plane (the last one
       overlapping the one before). */
    const int64_t P = OH * OW, T = (P + @RX@ - 1) / @RX@;
    #pragma omp parallel for collapse(3) if(N * M * P * (C / group) * KH * KW >= SS_CNC_PAR_MIN)
    for (int64_t n = 0; n < N; n++)
        for (int64_t gp = 0; gp < group * NP; gp++)
            for (int64_t t = 0; t < T; t++) {
                const int64_t g = gp / NP, ob = g * MBg + 2 * (gp % NP);
                const int nb = ob + 1 < (g + 1) * MBg ? 2 : 1;
                const float* xg = x + n * x_img + g * IB * bs;
                const float* wo = w + ob * wob;
                const int64_t p0 = t * @RX@ + @RX@ <= P ? t * @RX@ : P - @RX@;
                int64_t iy0[@RX@], ix0[@RX@];
                for (int j = 0; j < @RX@; j++) {
                    const int64_t oy = (p0 + j) / OW, ox = (p0 + j) % OW;
                    iy0[j] = oy * sh - ph;
                    ix0[j] = ox * sw - pw;
                }
                ss_vf@L@ acc[@RX@][2];
                for (int j = 0; j < @RX@; j++)
                    for (int b = 0; b < 2; b++)
                        acc[j][b] = bias && b < nb ? *(const ss_vfu@L@*)(bias + (ob + b) * @L@) : (ss_vf@L@){0};
                if (nb == 2) ss_cnc_flat_@L@(xg, wo, wob, 2, @L@, @RX@, IB, KH, KW, bs, rs, H, W, iy0, ix0, dh, dw, acc);
                else ss_cnc_flat_@L@(xg, wo, wob, 1, @L@, @RX@, IB, KH, KW, bs, rs, H, W, iy0, ix0, dh, dw, acc);
                const int64_t off = ((n * MB + ob) * P + p0) * @L@;
                /* The last tile overlaps the one before: it stores its own pixels only. The
                   others belong to that tile, which may run on another thread: storing them
                   again between its store and its epilogue (which reads y back) applied an
                   out-of-line activation or a residual twice (Sigmoid on 5x5, 2 threads:
                   1 to 4 runs in 6000). */
                const int skip = (int)(t * @RX@ - p0);
                if (skip == 0) {
                    SS_CNC_STORE_@L@(y + off, res ? res + off : NULL, P * @L@, @L@, nb, @RX@, (int)(pad_block - ob),
                                     acc);
                } else {
                    const int64_t o2 = off + skip * @L@;
                    SS_CNC_STORE_@L@(y + o2, res ? res + o2 : NULL, P * @L@, @L@, nb, @RX@ - skip, (int)(pad_block - ob),
                                     acc + skip);
                }
            }
    return;
}
/* Rows split into runs of whole tiles where rows alone give the threads too few items: a
   1x1 conv comes as its plane in one row, and MobileNetV3's 72->24 one on 28x28 was then
   one item, run by one thread while the other waited. */
const int par = N * M * OH * OW * (C / group) * KH * KW >= SS_CNC_PAR_MIN;
const int64_t row_items = N * group * NP * OH, threads = par ? omp_get_max_threads() : 1;
int64_t runs = 1;
if (row_items < 4 * threads) runs = (4 * threads + row_items - 1) / row_items;
if (runs > OW / (2 * @RX@)) runs = OW / (2 * @RX@) > 1 ? OW / (2 * @RX@) : 1;
const int64_t run_w = ((OW + runs - 1) / runs + @RX@ - 1) / @RX@ * @RX@;
runs = (OW + run_w - 1) / run_w;
#pragma omp parallel for collapse(4) if(par)
for (int64_t n = 0; n < N; n++)
    for (int64_t gp = 0; gp < group * NP; gp++)
        for (int64_t oy = 0; oy < OH; oy++)
        for (int64_t run = 0; run < runs; run++) {
            const int64_t g = gp / NP, ob = g * MBg + 2 * (gp % NP);
            const int nb = ob + 1 < (g + 1) * MBg ? 2 : 1;
            const float* xg = x + n * x_img + g * IB * bs;
            const float* wo = w + ob * wob;
            const int64_t iy0 = oy * sh - ph;
            ss_vf@L@ bv[2] = {{0}, {0}};
            for (int b = 0; b < nb; b++)
                if (bias) bv[b] = *(const ss_vfu@L@*)(bias + (ob + b) * @L@);
            /* The run's columns [rs0, re): its part of the inside [lo, hi), the rest border. */
            const int64_t rs0 = run * run_w, re = rs0 + run_w < OW ? rs0 + run_w : OW;
            const int64_t lo = ox_lo < rs0 ? rs0 : (ox_lo < re ? ox_lo : re);
            const int64_t hi = ox_hi + 1 < lo ? lo : (ox_hi + 1 < re ? ox_hi + 1 : re);
            int64_t ox = rs0;
/* The hot tiles are inlined with their shape as constants (the stride too where it is 1
   or 2: the pixels' addresses are then one register plus constant offsets), and so are
   border tiles of 4 pixels of a blocked input, with the pad checks: out of line they took
   39% of a 128->128 3x3 conv on 28x28 (AMD Zen 2), 8 of a row's 28 pixels. Single pixels
   and anything else go through one out-of-line copy that takes every parameter at run
   time, which keeps the object small. */
#define SS_CNC_INLINE(RXT, XB, SW, EDGE) do { \
                if (nb == 2) ss_cnc_tile_@L@(xg, wo, wob, 2, XB, EDGE, RXT, IB, KH, KW, bs, rs, H, W, iy0, dh, ix0, SW, dw, acc); \
                else ss_cnc_tile_@L@(xg, wo, wob, 1, XB, EDGE, RXT, IB, KH, KW, bs, rs, H, W, iy0, dh, ix0, SW, dw, acc); \
            } while (0)
#define SS_CNC_FAST(RXT, XB, SW) SS_CNC_INLINE(RXT, XB, SW, 0)
#define SS_CNC_TILE(RXT, EDGE) do { \
                ss_vf@L@ acc[@RX@][2]; \
                for (int j = 0; j < RXT; j++) { acc[j][0] = bv[0]; acc[j][1] = bv[1]; } \
                const int64_t ix0 = ox * sw - pw; \
                if ((EDGE && (RXT != 4 || xblk != @L@)) || RXT == 1 || (xblk != @L@ && RXT != @RX@)) \
                    ss_cnc_tile_any_@L@(xg, wo, wob, nb, (int)xblk, EDGE, RXT, IB, KH, KW, bs, rs, H, W, iy0, dh, ix0, sw, \
                                        dw, acc); \
                else if (EDGE) SS_CNC_INLINE(4, @L@, sw, 1); \
                else if (xblk != @L@ && sw == 2) SS_CNC_FAST(RXT, 1, 2); \
                else if (xblk != @L@) SS_CNC_FAST(RXT, 1, sw); \
                else if (RXT == @RX@ && sw == 1) SS_CNC_FAST(RXT, @L@, 1); \
                else if (RXT == @RX@ && sw == 2) SS_CNC_FAST(RXT, @L@, 2); \
                else SS_CNC_FAST(RXT, @L@, sw); \
                SS_CNC_PUT_@L@(y + (((n * MB + ob) * OH + oy) * OW + ox) * @L@, OH * OW * @L@, @L@, nb, RXT, acc); \
            } while (0)
            /* The run's tiles, each shape expanded once whatever part of the row takes it
               (expanding it per part took gcc twice the time for the same code). */
            while (ox < re) {
                int edge;
                const int rxt = ss_cnc_next_tile(&ox, rs0, lo, hi, re, @RX@, @RX@ / 2 + 1, 4, 1, &edge);
                if (rxt == @RX@ && !edge) SS_CNC_TILE(@RX@, 0);
                else if (rxt == 4) SS_CNC_TILE(4, edge);
                else SS_CNC_TILE(1, edge);
                ox += rxt;
            }
#undef SS_CNC_TILE
#undef SS_CNC_FAST
#undef SS_CNC_INLINE
            /* The epilogue once per run of the row, its tiles still in L1 (as the
               depthwise kernel's per row). */
            const int64_t off = (((n * MB + ob) * OH + oy) * OW + rs0) * @L@;
            SS_CNC_EPILOGUE_@L@(y + off, res ? res + off : NULL, OH * OW * @L@, @L@, nb, (int)(re - rs0), act,
                                (int)(pad_block - ob));
        }
"""

_DW_TILE = r"""
static inline __attribute__((always_inline)) void ss_dwc_tile_@L@(
    const float* xp, const float* wc, const int edge, const int rx, int64_t KH, int64_t KW, int64_t H, int64_t W,
    int64_t iy0, int64_t dh, int64_t ix0, int64_t sw, int64_t dw, ss_vf@L@ acc[@DWX@])
{
    for (int64_t ky = 0; ky < KH; ky++) {
        const int64_t iy = iy0 + ky * dh;
        if (iy < 0 || iy >= H) continue;
        const float* xr = xp + iy * W * @L@;
        for (int64_t kx = 0; kx < KW; kx++) {
            const ss_vf@L@ wv = *(const ss_vfu@L@*)(wc + (ky * KW + kx) * @L@);
            const int64_t ixk = ix0 + kx * dw;
            #pragma GCC unroll 16
            for (int j = 0; j < rx; j++) {
                const int64_t ix = ixk + j * sw;
                const float* p = edge && (ix < 0 || ix >= W) ? ss_cnc_zeros_@L@ : xr + ix * @L@;
                acc[j] = ss_cnc_fma_@L@(*(const ss_vfu@L@*)p, wv, acc[j]);
            }
        }
    }
}

/* The fixed tile's widths at a row's end, for the r < DWX pixels left: the narrowest that
   holds them (cover) and the widest that they fill (fit). */
static const int ss_dwc_cover_@L@[@DWX@] = {@COVER@};
static const int ss_dwc_fit_@L@[@DWX@] = {@FIT@};
/* A tile of RX pixels with the row's taps (KWC), stride (SC) and RX as constants and
   dilation 1: each input vector of a row is loaded once and feeds every tap that reads it
   (3x3 stride 1: 10 loads for 24 FMAs, where a load per tap and pixel took 24), the weights
   and the input held in registers. A BORDER tile skips the first zl and the last zr of the
   row's input vectors, the columns that fall in the padding (their products are zero): a
   tile at a row's ends needs no copy of the input with its padding and no check per tap. */
static inline __attribute__((always_inline)) void ss_dwc_tile_fixed_@L@(
    const float* xp, const float* wc, int64_t KH, const int KWC, const int SC, const int RX, const int BORDER,
    int zl, int zr, int64_t H, int64_t W, int64_t iy0, int64_t dh, int64_t ix0, ss_vf@L@ acc[@DWX@])
{
    for (int64_t ky = 0; ky < KH; ky++) {
        const int64_t iy = iy0 + ky * dh;
        if (iy < 0 || iy >= H) continue;
        const float* xr = xp + iy * W * @L@;
        const float* wr = wc + ky * KWC * @L@;
        ss_vf@L@ wv[7];
        #pragma GCC unroll 7
        for (int kx = 0; kx < KWC; kx++) {
            wv[kx] = *(const ss_vfu@L@*)(wr + kx * @L@);
            SS_CNC_IN_REGISTER_@L@(wv[kx], 2);
        }
        #pragma GCC unroll 32
        for (int i = 0; i < (RX - 1) * SC + KWC; i++) {
            /* The caller takes this tile only where neither pad reaches a tap's width (zl, zr < KWC),
               so only the first and last KWC - 1 columns are checked, each test a constant once
               unrolled. Checking every column (as the one test i < zl || i >= n - zr did) left
               1735 compares in the kernel against 567 now; gcc took 11.8-12.2 s on the conv
               fragment, now 9.5-10.2, and rows of border tiles ran up to 16% faster (480
               channels 3x3 on 7x7 6.0 -> 5.0 us, 960 stride 2 on 14x14 18.7 -> 17.3; the kernel
               alone, AMD Zen 4), larger planes unchanged within 3%. */
            if (BORDER && i < KWC - 1 && i < zl) continue;
            if (BORDER && i > (RX - 1) * SC && i >= (RX - 1) * SC + KWC - zr) continue;
            ss_vf@L@ v = *(const ss_vfu@L@*)(xr + (ix0 + i) * @L@);
            SS_CNC_IN_REGISTER_@L@(v, 2);
            #pragma GCC unroll 7
            for (int kx = 0; kx < KWC; kx++) {
                const int t = i - kx;
                if (t >= 0 && t % SC == 0 && t / SC < RX) acc[t / SC] = ss_cnc_fma_@L@(v, wv[kx], acc[t / SC]);
            }
        }
    }
}
"""

_DW = r"""
/* 3x3, 5x5 and 7x7 taps (MobileNet's, PP-OCR's, ConvNeXt's) at stride 1 or 2, dilation 1
   along a row: every row in tiles of DWX pixels and the rest (below), each through the
   fixed tile, which loads each input vector once for all of the tile's taps that read it;
   the tiles at a row's ends skip the input columns in the padding. 7x7 through it instead
   of the tiles below, 1 thread, the kernel alone (AMD Zen 4, bench/results/
   depthwise_7x7_zen4.md): 480 channels on 14x14 144 -> 69 us at stride 1, 42 -> 19 at
   stride 2; on 56x56 2018 -> 1310 and 685 -> 366 (onnxruntime's node 105, 42, 1418, 534).
   It costs gcc 2-3 s more on this fragment (10.7-11.2 -> 13.1-14.0 s; 11.8-12.5 with
   stride 1 alone). Others (dilated along a row, ...): where most output columns read
   padding, each (image, channel block, run of output rows) first stages the input rows
   it reads into a per-thread buffer with the zero padding around them, so that every tile
   reads its taps with no bounds check; elsewhere tiles read x itself, only the border
   columns' checked. Runs of rows: enough (image, block, run) items for every thread to have
   4 (a 16-channel conv on a 112x112 plane is one block).
   The fixed tiles at the ends replaced, on an AMD Zen 4 (1 thread, the kernel alone, ReLU):
   for 480 channels 3x3 on 28x28, staging each run's rows (a copy of the input: 28% of
   the time by perf) and tiles of 8, the last one overlapping (32 pixels for 28); at stride
   2 on 28x28 (14 output columns), a checked tile of 4 at the left and two of 8 (20 pixels
   for 14, 4 of them checked). */
const int64_t CB = (C + @L@ - 1) / @L@;
/* The fixed tiles skip at most KW - 1 padded columns at either end (wider pads, rare, take
   the tiles below). */
const int fixed = dw == 1 && (KW == 3 || KW == 5 || KW == 7) && (sw == 1 || sw == 2) && pw < KW
                  && (OW - 1) * sw + KW - pw - W < KW;
const int64_t Wp = (OW - 1) * sw + (KW - 1) * dw + 1;  /* staged columns: ix + pw */
/* Output columns [lo, hi) read no padding; the others take checked tiles. */
const int64_t ox_lo = (pw + sw - 1) / sw;
const int64_t span = W - 1 - (KW - 1) * dw + pw;
const int64_t ox_hi = span < 0 ? -1 : span / sw;
const int64_t lo = ox_lo < OW ? ox_lo : OW;
const int64_t hi = ox_hi + 1 < lo ? lo : (ox_hi + 1 < OW ? ox_hi + 1 : OW);
/* Stage when the checked columns (about 3x an unchecked tile's cost) outweigh the copy:
   2 x their share of the row > input pixels copied per output pixel / taps. */
const int stage = !fixed && 2.0 * (double)(OW - (hi - lo)) / (double)OW > (double)(sh * sw) / (double)(KH * KW);
ss_vi@L@ keep;
for (int l = 0; l < @L@; l++) keep[l] = (CB - 1) * @L@ + l < C ? -1 : 0;
const int par = N * C * OH * OW * KH * KW >= SS_CNC_PAR_MIN;
const int64_t threads = par ? omp_get_max_threads() : 1;
int64_t runs = 1;
if (N * CB < 4 * threads) runs = (4 * threads + N * CB - 1) / (N * CB);
if (runs > OH) runs = OH;
const int64_t run_rows = (OH + runs - 1) / runs;
const int64_t Rmax = (run_rows - 1) * sh + (KH - 1) * dh + 1;
#pragma omp parallel if(par)
{
    float* buf = stage ? (float*)aligned_alloc(64, ((size_t)(Rmax * Wp * @L@) * sizeof(float) + 63) / 64 * 64) : NULL;
    #pragma omp for collapse(3) schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t cb = 0; cb < CB; cb++)
            for (int64_t run = 0; run < runs; run++) {
                const int64_t oy0 = run * run_rows, oy1 = oy0 + run_rows < OH ? oy0 + run_rows : OH;
                if (oy0 >= oy1) continue;
                const float* xp = x + (n * CB + cb) * H * W * @L@;
                const float* wc = w + cb * KH * KW * @L@;
                const ss_vf@L@ bv = bias ? *(const ss_vfu@L@*)(bias + cb * @L@) : (ss_vf@L@){0};
                /* The rows read: staged row r is input row iys + r, column s input column s - pw. */
                const int64_t iys = oy0 * sh - ph, R = (oy1 - oy0 - 1) * sh + (KH - 1) * dh + 1;
                if (buf) {
                    const int64_t s0 = pw < Wp ? pw : Wp, s1 = pw + W < Wp ? pw + W : Wp;
                    for (int64_t r = 0; r < R; r++) {
                        float* d = buf + r * Wp * @L@;
                        const int64_t iy = iys + r;
                        if (iy < 0 || iy >= H || s1 <= s0) {
                            memset(d, 0, (size_t)(Wp * @L@) * sizeof(float));
                            continue;
                        }
                        memset(d, 0, (size_t)(s0 * @L@) * sizeof(float));
                        memcpy(d + s0 * @L@, xp + (iy * W + s0 - pw) * @L@, (size_t)((s1 - s0) * @L@) * sizeof(float));
                        memset(d + s1 * @L@, 0, (size_t)((Wp - s1) * @L@) * sizeof(float));
                    }
                }
                for (int64_t oy = oy0; oy < oy1; oy++) {
                    const int64_t row = ((n * CB + cb) * OH + oy) * OW * @L@;
                    int64_t ox = 0;
/* A tile's accumulators from the bias, Relu and HardSwish (MobileNetV3's) applied before
   the store, the rest of the epilogue after the row. */
#define SS_DWC_STORE(RXT) do { \
                    ss_vf@L@ acc2[RXT][2]; \
                    if (act == 1) for (int j = 0; j < RXT; j++) acc2[j][0] = ss_nchwc_act_@L@(acc[j], 1, 0, 0); \
                    else if (act == 3) for (int j = 0; j < RXT; j++) acc2[j][0] = ss_nchwc_act_@L@(acc[j], 3, 0, 0); \
                    else for (int j = 0; j < RXT; j++) acc2[j][0] = acc[j]; \
                    ss_cnc_store_@L@(y + row + ox * @L@, 0, @L@, 1, RXT, acc2); \
                } while (0)
                    if (fixed) {
/* The fixed tile of RXT pixels at ox, its taps and stride constants; BORDER: it skips the
   zl first and zr last input columns. */
#define SS_DWC_FIXED(RXT, BORDER) do { \
                        ss_vf@L@ acc[@DWX@]; \
                        for (int j = 0; j < RXT; j++) acc[j] = bv; \
                        if (KW == 3 && sw == 1) \
                            ss_dwc_tile_fixed_@L@(xp, wc, KH, 3, 1, RXT, BORDER, zl, zr, H, W, iy0, dh, ix0, acc); \
                        else if (KW == 3) \
                            ss_dwc_tile_fixed_@L@(xp, wc, KH, 3, 2, RXT, BORDER, zl, zr, H, W, iy0, dh, ix0, acc); \
                        else if (KW == 5 && sw == 1) \
                            ss_dwc_tile_fixed_@L@(xp, wc, KH, 5, 1, RXT, BORDER, zl, zr, H, W, iy0, dh, ix0, acc); \
                        else if (KW == 5) \
                            ss_dwc_tile_fixed_@L@(xp, wc, KH, 5, 2, RXT, BORDER, zl, zr, H, W, iy0, dh, ix0, acc); \
                        else if (sw == 1) \
                            ss_dwc_tile_fixed_@L@(xp, wc, KH, 7, 1, RXT, BORDER, zl, zr, H, W, iy0, dh, ix0, acc); \
                        else \
                            ss_dwc_tile_fixed_@L@(xp, wc, KH, 7, 2, RXT, BORDER, zl, zr, H, W, iy0, dh, ix0, acc); \
                        SS_DWC_STORE(RXT); \
                    } while (0)
                        /* Tiles of DWX, then the rest in the narrowest tile width (of
                           dw_widths()) that holds it, moved left over pixels already done where
                           it is wider, or where the row is narrower than it, in the widest
                           that fits. Every width 1..DWX had one expanded tile per taps and
                           stride: gcc took 13-15 s on the fragment (AMD Zen 4), 10-12 with
                           dw_widths() but 7. */
                        while (ox < OW) {
                            const int64_t rest = OW - ox;
                            int rxt = rest >= @DWX@ ? @DWX@ : ss_dwc_cover_@L@[rest];
                            if (rxt > OW) rxt = ss_dwc_fit_@L@[rest];
                            if (rxt > rest) ox = OW - rxt;
                            const int64_t iy0 = oy * sh - ph, ix0 = ox * sw - pw, ni = (int64_t)(rxt - 1) * sw + KW;
                            const int zl = ix0 < 0 ? (int)(-ix0 < ni ? -ix0 : ni) : 0;
                            const int zr = ix0 + ni > W ? (int)(ix0 + ni - W < ni ? ix0 + ni - W : ni) : 0;
                            if (rxt == @DWX@ && !zl && !zr) SS_DWC_FIXED(@DWX@, 0);
                            else switch (rxt) {
@BORDER_CASES@
                            default: break;
                            }
                            ox += rxt;
                        }
#undef SS_DWC_FIXED
                    } else {
#define SS_DWC_TILE(RXT, SRC, EDGE, RH, RW, IY0, IX0) do { \
                        ss_vf@L@ acc[@DWX@]; \
                        for (int j = 0; j < RXT; j++) acc[j] = bv; \
                        ss_dwc_tile_@L@(SRC, wc, EDGE, RXT, KH, KW, RH, RW, IY0, dh, IX0, sw, dw, acc); \
                        SS_DWC_STORE(RXT); \
                    } while (0)
                        /* A staged row narrower than a tile as one tile of its width (tiles of 2
                           and 1 leave one or two FMA chains waiting on each FMA's latency: a 7x7
                           conv on a 7x7 plane). */
                        if (buf && OW < @DWX@) {
                            switch (OW) {
@NARROW_CASES@
                            default: break;
                            }
                            ox = OW;
                        }
                        /* The row's tiles, each shape expanded once, as in the dense conv: from
                           the staged rows (no checks), or from x itself (the border columns'
                           tiles check each tap). */
                        while (ox < OW) {
                            int edge;
                            const int rxt = ss_cnc_next_tile(&ox, 0, buf ? 0 : lo, buf ? OW : hi, OW, @DWX@, 1, 2, 0,
                                                             &edge);
                            if (buf) {
                                /* No border here: tiles of DWX, 2 and 1. */
                                if (rxt == @DWX@) SS_DWC_TILE(@DWX@, buf, 0, R, Wp, (oy - oy0) * sh, ox * sw);
                                else if (rxt == 2) SS_DWC_TILE(2, buf, 0, R, Wp, (oy - oy0) * sh, ox * sw);
                                else SS_DWC_TILE(1, buf, 0, R, Wp, (oy - oy0) * sh, ox * sw);
                            } else {
                                if (rxt == @DWX@ && !edge) SS_DWC_TILE(@DWX@, xp, 0, H, W, oy * sh - ph, ox * sw - pw);
                                else if (rxt == 4) SS_DWC_TILE(4, xp, edge, H, W, oy * sh - ph, ox * sw - pw);
                                else if (rxt == 2) SS_DWC_TILE(2, xp, edge, H, W, oy * sh - ph, ox * sw - pw);
                                else SS_DWC_TILE(1, xp, edge, H, W, oy * sh - ph, ox * sw - pw);
                            }
                            ox += rxt;
                        }
#undef SS_DWC_TILE
                    }
#undef SS_DWC_STORE
                    /* The rest of the epilogue once per row, not per tile: a depthwise tile has
                       few FMAs, and the call per tile was a fifth of a 3x3 stride-2 conv's time
                       (72 channels, 56x56, batch 4). Relu and HardSwish, MobileNetV3's, went
                       into the tiles' stores above (the pass over the row took another tenth). */
                    SS_CNC_EPILOGUE_@L@(y + row, res ? res + row : NULL, 0, @L@, 1, (int)OW,
                                        act == 1 || act == 3 ? 0 : act, cb == CB - 1 && C % @L@ ? 0 : -1);
                }
            }
    free(buf);
}
"""

_EPILOGUE_PARAMS = ("const float* res", "int act", "float a0", "float a1", "int act2", "float b0", "float b1")
#: The entry points' parameters (``ss_conv_nchwc_L``, ``ss_dwconv_nchwc_L``): a tuned
#: dispatcher (tune/dispatch.py) takes the same.
DENSE_PARAMS = ("const float* x", "const float* w", "const float* bias", "float* y", "int64_t N", "int64_t C",
                "int64_t H", "int64_t W", "int64_t M", "int64_t KH", "int64_t KW", "int64_t OH", "int64_t OW",
                "int64_t sh", "int64_t sw", "int64_t ph", "int64_t pw", "int64_t dh", "int64_t dw",
                "int64_t group", "int64_t xblk", *_EPILOGUE_PARAMS)
DEPTHWISE_PARAMS = ("const float* x", "const float* w", "const float* bias", "float* y", "int64_t N", "int64_t C",
                    "int64_t H", "int64_t W", "int64_t KH", "int64_t KW", "int64_t OH", "int64_t OW", "int64_t sh",
                    "int64_t sw", "int64_t ph", "int64_t pw", "int64_t dh", "int64_t dw", *_EPILOGUE_PARAMS)


def pointwise_tile(lanes: int, rx: int, nb: int) -> str:
    """``ss_cnc_pw_L_RXxNB``: one register tile of the pointwise kernel, rx pixels x nb output
    blocks, its accumulators named one by one (arrays of them, as the general tile keeps,
    left gcc copying accumulators between the FMAs). Written with AVX intrinsics instead
    (the GEMM tile's form, which compiles to nothing but broadcasts and FMAs) the stride-1
    512 -> 128 conv on 28 x 28 took 1.22-1.29 ms against 1.06-1.10 this way (AMD Zen 2):
    the loads gcc folds into its FMAs here come earlier. x: the tile's first pixel in the chunk's
    first input block (pixels ps floats apart, blocks bs); wp: the chunk's weights of the
    first output block (the second wob floats on); tail: the input channels of the chunk's
    last block (L but in the conv's last block); y: the tile's first pixel of the first
    output block (the second ybs floats on), read back first where ``from_y``, else the
    tile starts from ``bias`` (NULL: zero)."""
    v = f"ss_vf{lanes}"
    acc = [[f"c{j}_{b}" for b in range(nb)] for j in range(rx)]
    w = CWriter(level=1)
    w.line(f"{v} " + ", ".join(name for row in acc for name in row) + ";")
    with w.block("if (from_y)"):
        w.lines(f"{acc[j][b]} = *(const ss_vfu{lanes}*)(y + {b} * ybs + {j * lanes});"
                for j in range(rx) for b in range(nb))
    with w.block("else"):
        w.lines(f"const {v} b{b} = bias ? *(const ss_vfu{lanes}*)(bias + {b * lanes}) : ({v}){{0}};" for b in range(nb))
        w.lines(f"{acc[j][b]} = b{b};" for j in range(rx) for b in range(nb))
    def lane_step() -> None:
        w.lines(f"const {v} w{b} = *(const ss_vfu{lanes}*)(wp + {b} * wob + cl * {lanes});" for b in range(nb))
        for j in range(rx):
            w.line(f"{{ {v} xv = ss_cnc_splat_{lanes}(x[{j} * ps + cl]); SS_CNC_IN_REGISTER_{lanes}(xv, {nb});")
            w.lines(f"  {acc[j][b]} = ss_cnc_fma_{lanes}(xv, w{b}, {acc[j][b]});" for b in range(nb))
            w.line("}")

    with w.block("for (int64_t ib = 0; ib + 1 < nib; ib++)"):
        w.raw(f"#pragma GCC unroll {lanes}")
        with w.block(f"for (int cl = 0; cl < {lanes}; cl++)"):
            lane_step()
        w.line(f"x += bs; wp += {lanes * lanes};")
    # The last block only to its last input channel: lanes past C are zero in x and in the
    # weights (MobileNetV3's 24 and 40 channels in blocks of 16 spent a quarter and a sixth
    # of their FMAs on them).
    with w.block("for (int cl = 0; cl < tail; cl++)"):
        lane_step()
    w.lines(f"*(ss_vfu{lanes}*)(y + {b} * ybs + {j * lanes}) = {acc[j][b]};" for j in range(rx) for b in range(nb))
    # Inlined at every call: those for strides 1 and 2 make ps a constant.
    return Function("__attribute__((always_inline)) void", f"ss_cnc_pw_{lanes}_{rx}x{nb}",
                    ("const float* restrict x", "int64_t ps", "int64_t bs", "const float* restrict wp", "int64_t wob",
                     "int64_t nib", "int tail", "float* restrict y", "int64_t ybs", "int from_y", "const float* bias"),
                    w.text(), linkage="inline").definition()


def _functions(lanes: int, rx: Optional[int] = None, dw_pixels: int = DW_PIXELS, l1_share: int = 4,
               l2_share: int = 4, entries: tuple[str, ...] = ENTRIES) -> list:
    """One width's kernels; the knobs (kernels/conv_nchwc_tuned.py's schedule) default to what
    every untuned conv runs: the target's dense tile, DW_PIXELS, a quarter of L1 and of L2.
    ``entries``: which of the two entry points (and what only it uses) to emit."""
    rx = rx or default_pixels(lanes)
    dense = Function("void", f"ss_conv_nchwc_{lanes}", DENSE_PARAMS, fill(_DENSE, L=lanes, RX=rx))
    depthwise = Function("void", f"ss_dwconv_nchwc_{lanes}", DEPTHWISE_PARAMS, fill(
        _DW, L=lanes, DWX=dw_pixels,
        BORDER_CASES="\n".join(f"                            case {r}: SS_DWC_FIXED({r}, 1); break;"
                                for r in dw_widths(dw_pixels)),
        NARROW_CASES="\n".join(" " * 28 + f"case {r}: SS_DWC_TILE({r}, buf, 0, R, Wp, (oy - oy0) * sh, 0); break;"
                                for r in range(dw_pixels - 1, 0, -1))))
    # The depthwise kernel stores through the dense tile's store and epilogue helpers.
    parts = [Private(fill(_FMA, L=lanes)), Private(fill(_DENSE_TILE, L=lanes, RX=rx))]
    if "dense" in entries:
        parts += [Private("".join(pointwise_tile(lanes, t, nb) for t in sorted({rx, 4, 1}, reverse=True)
                                  for nb in (1, 2))),
                  Private(fill(_POINTWISE, L=lanes, RX=rx, L1SHARE=l1_share, L2SHARE=l2_share))]
    if "depthwise" in entries:
        widths = dw_widths(dw_pixels)
        cover = [min((w for w in widths if w >= r), default=dw_pixels) for r in range(dw_pixels)]
        fit = [max((w for w in widths if w <= r), default=1) for r in range(dw_pixels)]
        parts.append(Private(fill(_DW_TILE, L=lanes, DWX=dw_pixels, COVER=", ".join(map(str, cover)),
                                  FIT=", ".join(map(str, fit)))))
    return parts + [f for e, f in (("dense", dense), ("depthwise", depthwise)) if e in entries]


def fragment(target: Optional[Target] = None, par_min: int = 1 << 17, widths: Optional[tuple[int, ...]] = None,
             **knobs) -> Fragment:
    """``par_min``: multiply-adds below which a conv runs on one thread; the pointwise
    kernel's blocking follows ``target``'s L1d and L2 (this machine's when None).
    ``widths``: the block widths to emit kernels for; by default only the one the layout
    pass blocks by on ``target`` (nchwc.block_width), as no program calls the other. Both
    took gcc about a minute on an AMD Zen 2 (the 16-lane kernels, as pairs of ymm where the
    build has no AVX-512, were two thirds of a 940 KB object), the first session of a
    model with depthwise convs waiting on it. ``knobs``: ``_functions``' (a tuned schedule's)."""
    from ...target import host_target

    target = target or host_target()
    caches = target.caches
    parts: list = [Private(f"#define SS_CNC_PAR_MIN {int(par_min)}\n"
                           f"#define SS_CNC_L1_FLOATS {caches.l1d // 4}\n#define SS_CNC_L2_FLOATS {caches.l2 // 4}\n"),
                   Private(_NEXT_TILE)]
    for lanes in widths or (block_width(target),):
        parts.extend(_functions(lanes, **knobs))
    return Fragment(parts)


def source(target: Optional[Target] = None, **params) -> str:
    return fragment(target, **params).text()


# -- weight packing (numpy, once at build time) ------------------------------------------------


def pad_channels(vector: np.ndarray, lanes: int) -> np.ndarray:
    """A per-channel vector [C] padded with zeros to whole blocks."""
    blocks = -(-vector.shape[0] // lanes)
    out = np.zeros(blocks * lanes, np.float32)
    out[:vector.shape[0]] = vector
    return out


def blocked(a: np.ndarray, lanes: int) -> np.ndarray:
    """[N, C, H, W] in the blocked layout [N, ceil(C/L), H, W, L], zero in the lanes past C,
    in ``a``'s dtype."""
    n, c, h, w = a.shape
    cb = -(-c // lanes)
    padded = np.zeros((n, cb * lanes, h, w), a.dtype)
    padded[:, :c] = a
    return np.ascontiguousarray(padded.reshape(n, cb, lanes, h, w).transpose(0, 1, 3, 4, 2))


def pack_dense(w: np.ndarray, group: int, lanes: int, xblk: int) -> np.ndarray:
    """ONNX weights [M, C/group, KH, KW] as ss_conv_nchwc_L reads them:
    [ceil(M/L), IB, KH, KW, xblk, L], IB = ceil((C/group)/L) blocked (xblk == L) or C/group
    plain (xblk == 1); zeros in every lane past M or past C/group."""
    m, cg, kh, kw = w.shape
    mb = -(-m // lanes)
    ib = -(-cg // lanes) if xblk == lanes else cg
    out = np.zeros((mb * lanes, ib * xblk, kh, kw), np.float32)
    mg = m // group
    for g in range(group):
        # A group's output channels read its own input channels, at block 0 of its input range.
        out[g * mg:(g + 1) * mg, :cg] = w[g * mg:(g + 1) * mg]
    # [MB, L, IB, xblk, KH, KW] -> [MB, IB, KH, KW, xblk, L]
    out = out.reshape(mb, lanes, ib, xblk, kh, kw).transpose(0, 2, 4, 5, 3, 1)
    return np.ascontiguousarray(out)


def pack_depthwise(w: np.ndarray, lanes: int) -> np.ndarray:
    """ONNX depthwise weights [C, 1, KH, KW] as [ceil(C/L), KH, KW, L], zero past C."""
    c, _, kh, kw = w.shape
    cb = -(-c // lanes)
    out = np.zeros((cb * lanes, kh, kw), np.float32)
    out[:c] = w[:, 0]
    return np.ascontiguousarray(out.reshape(cb, lanes, kh, kw).transpose(0, 2, 3, 1))


__all__ = ["DENSE_PARAMS", "DEPENDS", "DEPTHWISE_PARAMS", "blocked", "default_pixels", "dense_pixels", "fragment", "pack_dense", "pack_depthwise", "pad_channels", "source"]
