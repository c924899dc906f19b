"""The implicit-GEMM convolution: ss_conv2d's path for dense (group 1) k x k convs.

A conv is the GEMM y^T [pixels, M] = im2col(x)^T [pixels, C*KH*KW] x w^T [C*KH*KW, M].
This kernel runs that product with the GEMM micro-kernel's shape, SS_CONV_IGEMM_MR (6)
output pixels x 16 output channels in 12 ymm accumulators, without making the im2col
matrix: for tap k = (c, kh, kw), pixel i's input is one float at ``base_i + koff[k]``,
where ``base_i`` is the pixel's window corner in a zero-padded copy of the image (made
once per image) and ``koff`` a table of tap offsets. Each tap costs one broadcast per
pixel and two weight loads, as a GEMM k step does; the weights are w^T in 16-channel
panels, the GEMM's own prepacked layout when the caller has it (``wpacked``: the lowering
packs constant weights once at load), else packed here at every call.

Strides, dilations and padding only change ``base_i`` and ``koff``, so every conv runs the
same loop: no stride phases, no output columns computed and dropped (the direct kernel's
16-pixel tiles run over staged rows of ``OW + KW - 1`` columns), no masked stores.

Where the compiler targets AVX-512 (-march=native on such a host), the tile holds its 6
pixels x 16 channels in zmm registers instead, one FMA a pixel and tap, and a unit of work
takes two panels (6 x 32, 12 accumulators) when there are two: the ymm tile's two FMAs
per pixel and tap were the limit on a core that runs either width at the same peak (AMD
Zen 4). One thread, yolov8n's 3 x 3 convs at batch 3 against onnxruntime in one process:
64->64 on 16x16 1.30x -> 1.13x its time, 128->128 on 8x8 1.37x -> 1.19x, 16->32 stride 2
on 64x64 1.20x -> 1.06x.

Work is split into blocks of SS_CONV_IGEMM_BLOCK (48) pixels x one panel (two on AVX-512),
in parallel, in the order that reads the larger of image and weights once, over as many
images at once as the caller's scratch holds the padded copies of.
A block takes the taps SS_CONV_IGEMM_KC (the GEMM's kc) at a time, all its tiles over one
slice before the next, so the slice's weights stay in L1 while every tile reads them; the
sums wait in a per-thread scratch of 48 x 16 floats a panel. After the last slice the
scratch is transposed 8 x 8 (the GEMM's ss_gemm_transpose8) into the output planes, with the bias
(added first) and the activation applied on whole vectors.

Measured against ss_conv2d's other paths on one thread (yolov8n's shapes at batch 3, SiLU,
weights prepacked; a C harness in one process): 64->64 3x3 on 8x8 1.44x and on 16x16
1.29x faster, 128->64 on 8x8 1.45x, 16->32 3x3 stride 2 on 64x64 1.35x. On planes of a few
pixels the small-plane path's single GEMM does better: with prepacked weights at batch 3,
2x3 and 3x3 planes ran 5-10% faster there, 4x4 ones 1.11-1.26x slower (64 and 128
channels; even with 256), so ss_conv2d kept it up to SS_CONV_IGEMM_MIN_PLANE (9) pixels
there; with the 8x48 GEMM tile of a full-rate AVX-512 core that path won up to 64 pixels
(codegen/defaults.py's conv_igemm_min_plane: the fragment's default for its target). A
third 16-channel panel in the zmm tile (18 accumulators, one GEMM panel of 48, so its
prepacked weights serve unpacked) ran ResNet-50's 3x3 convs at 157-178 GFLOPS on that
core against two panels' 199-223 (1 thread), prepacked or not: not taken.
1x1 convs keep the GEMM on the NCHW data (0.5x here without an activation).

A header-only fragment: ``ss_conv_scratch`` (the caller's scratch, or a malloc; the direct
conv kernel uses it too), and under AVX2, with the real gemm fragment (whose kc and 8 x 8
transpose it uses), ``SS_CONV_IGEMM`` and the ``static inline`` function below, which
ss_conv2d (kernels/conv.py, which depends on this fragment) calls::

    int ss_conv_igemm(x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw,
                      act, work, work_floats, wpacked, res, res_act);

It returns 0, having written nothing, when its scratch cannot be allocated or its tap
offsets would overflow 32 bits. ``act`` is vmath's activation code (ss_act8). ``res``
(NULL: none) is a residual laid out as y, fused into the store: y = res_act(act(conv +
bias) + res), each transposed vector of 8 pixels adding its residual vector before the
store (ResNet's and YOLO's shortcut Adds, which otherwise ran as a pass of their own over
the conv's output).
"""

from __future__ import annotations

from typing import Optional

from ...target import Target
from ..cwriter import Fragment, Shared, fill

DEPENDS = ("gemm", "vmath")

#: Output pixels per block of work (a multiple of the 12-pixel pair tile).
BLOCK = 48

# Markers: @BLOCK@, @MIN_PLANE@, @PAR_MIN@ (fragment's parameters).
_TEMPLATE = r"""
/* `work` when it holds `floats` floats (the caller's arena scratch), else a malloc the
   caller frees through *own (NULL when out of memory). The direct conv kernel uses it too. */
static inline float* ss_conv_scratch(float* work, int64_t work_floats, int64_t floats, float** own) {
    *own = NULL;
    if (work && floats <= work_floats) return work;
    *own = (float*)malloc((size_t)floats * sizeof(float));
    return *own;
}

#if defined(__AVX2__) && defined(SS_GEMM_NR)
#define SS_CONV_IGEMM 1
#define SS_CONV_IGEMM_MR 6
#define SS_CONV_IGEMM_BLOCK @BLOCK@
#define SS_CONV_IGEMM_MIN_PLANE @MIN_PLANE@
/* Convs of fewer multiply-adds run on one thread. */
#define SS_CONV_IGEMM_PAR_MIN @PAR_MIN@
/* Taps per slice: the GEMM's kc, so that a slice of its prepacked B is one run of memory. */
#define SS_CONV_IGEMM_KC SS_GEMM_KC
#if SS_GEMM_NR == 16
#define SS_CONV_IGEMM_PREPACKED 1
#endif

/* One tile: 6 pixels (window corners base[0..5]) x 16 channels over taps koff[0, kn), with
   wk the slice's weights (16 floats a tap). Starts from the bias (b0, b1) when `first`,
   else from the sums in t; leaves the sums in t (pixel i's 16 channels at t + 16 i).
   Named accumulators and a loop as plain as the GEMM's keep them all in registers. */
static inline __attribute__((always_inline)) void ss_conv_igemm_tile(
        const float* const* base, const int32_t* koff, const float* wk, int64_t kn,
        __m256 b0, __m256 b1, float* t, int first) {
    __m256 c00 = b0, c01 = b1, c10 = b0, c11 = b1, c20 = b0, c21 = b1;
    __m256 c30 = b0, c31 = b1, c40 = b0, c41 = b1, c50 = b0, c51 = b1;
    if (!first) {
        c00 = _mm256_loadu_ps(t + 0); c01 = _mm256_loadu_ps(t + 8);
        c10 = _mm256_loadu_ps(t + 16); c11 = _mm256_loadu_ps(t + 24);
        c20 = _mm256_loadu_ps(t + 32); c21 = _mm256_loadu_ps(t + 40);
        c30 = _mm256_loadu_ps(t + 48); c31 = _mm256_loadu_ps(t + 56);
        c40 = _mm256_loadu_ps(t + 64); c41 = _mm256_loadu_ps(t + 72);
        c50 = _mm256_loadu_ps(t + 80); c51 = _mm256_loadu_ps(t + 88);
    }
    const float *p0 = base[0], *p1 = base[1], *p2 = base[2], *p3 = base[3], *p4 = base[4], *p5 = base[5];
    #pragma GCC unroll 4
    for (int64_t k = 0; k < kn; ++k) {
        int64_t o = koff[k];
        __m256 w0 = _mm256_loadu_ps(wk), w1 = _mm256_loadu_ps(wk + 8), a;
        a = _mm256_broadcast_ss(p0 + o); c00 = ss_fmadd8(a, w0, c00); c01 = ss_fmadd8(a, w1, c01);
        a = _mm256_broadcast_ss(p1 + o); c10 = ss_fmadd8(a, w0, c10); c11 = ss_fmadd8(a, w1, c11);
        a = _mm256_broadcast_ss(p2 + o); c20 = ss_fmadd8(a, w0, c20); c21 = ss_fmadd8(a, w1, c21);
        a = _mm256_broadcast_ss(p3 + o); c30 = ss_fmadd8(a, w0, c30); c31 = ss_fmadd8(a, w1, c31);
        a = _mm256_broadcast_ss(p4 + o); c40 = ss_fmadd8(a, w0, c40); c41 = ss_fmadd8(a, w1, c41);
        a = _mm256_broadcast_ss(p5 + o); c50 = ss_fmadd8(a, w0, c50); c51 = ss_fmadd8(a, w1, c51);
        wk += 16;
    }
    _mm256_storeu_ps(t + 0, c00); _mm256_storeu_ps(t + 8, c01);
    _mm256_storeu_ps(t + 16, c10); _mm256_storeu_ps(t + 24, c11);
    _mm256_storeu_ps(t + 32, c20); _mm256_storeu_ps(t + 40, c21);
    _mm256_storeu_ps(t + 48, c30); _mm256_storeu_ps(t + 56, c31);
    _mm256_storeu_ps(t + 64, c40); _mm256_storeu_ps(t + 72, c41);
    _mm256_storeu_ps(t + 80, c50); _mm256_storeu_ps(t + 88, c51);
}

#ifdef __AVX512F__
/* Panels of 16 channels a unit of work takes: two, in the zmm tile below. */
#define SS_CONV_IGEMM_NP 2
/* The tile on AVX-512 hardware: 6 pixels x nq panels of 16 channels (nq = 1 or 2, a
   constant where it is inlined; panel j's weights at wk0 + j * pstride) in zmm
   accumulators. A zmm FMA does two ymm FMAs' work in one instruction, which is what the
   ymm tile runs short of: in a hot loop (64 channels, 3 x 3) 91 GFLOPS of a core's 112
   for the ymm 6 x 16 tile, 96-115 for this one with one panel, 101-109 with two. (A 12 x
   32 tile of 24 accumulators needs 12 pixel pointers, more than the general registers
   left: it spilled them and ran no faster.) Sums as ss_conv_igemm_tile, pixel i's 16 * nq
   at t + 16 * nq * i. */
static inline __attribute__((always_inline)) void ss_conv_igemm_tile_zmm(
        const float* const* base, const int32_t* koff, const float* wk0, int64_t pstride, int64_t kn,
        const float* bias, float* t, int first, const int nq) {
    __m512 c[6 * SS_CONV_IGEMM_NP];
    const float *p0 = base[0], *p1 = base[1], *p2 = base[2], *p3 = base[3], *p4 = base[4], *p5 = base[5];
    #pragma GCC unroll 12
    for (int i = 0; i < 6 * nq; ++i) c[i] = first ? _mm512_loadu_ps(bias + 16 * (i % nq)) : _mm512_loadu_ps(t + 16 * i);
    for (int64_t k = 0; k < kn; ++k) {
        int64_t o = koff[k];
        __m512 w[SS_CONV_IGEMM_NP], a;
        #pragma GCC unroll 2
        for (int j = 0; j < nq; ++j) w[j] = _mm512_loadu_ps(wk0 + j * pstride + 16 * k);
#define SS_CONV_IGEMM_ZMM_ROW(i, p) a = _mm512_set1_ps(p[o]); \
        for (int j = 0; j < nq; ++j) c[(i) * nq + j] = _mm512_fmadd_ps(a, w[j], c[(i) * nq + j]);
        SS_CONV_IGEMM_ZMM_ROW(0, p0) SS_CONV_IGEMM_ZMM_ROW(1, p1) SS_CONV_IGEMM_ZMM_ROW(2, p2)
        SS_CONV_IGEMM_ZMM_ROW(3, p3) SS_CONV_IGEMM_ZMM_ROW(4, p4) SS_CONV_IGEMM_ZMM_ROW(5, p5)
#undef SS_CONV_IGEMM_ZMM_ROW
    }
    #pragma GCC unroll 12
    for (int i = 0; i < 6 * nq; ++i) _mm512_storeu_ps(t + 16 * i, c[i]);
}
#else
#define SS_CONV_IGEMM_NP 1
#endif

/* Copies the image's C planes into stage [C][Hp][Wp] with zeros around them: input row
   ih, column iw at stage row ph + ih, column pw + iw. */
static inline void ss_conv_igemm_stage(const float* xc, float* d, int64_t H, int64_t W, int64_t ph, int64_t pw,
                                int64_t Hp, int64_t Wp) {
    for (int64_t r = 0; r < Hp; ++r, d += Wp) {
        int64_t ih = r - ph;
        if (Wp < 64) {
            /* Rows of a few floats (late stages; silero_vad's 1-row planes of 6 floats, 387 of
               them a call): plain loops, where three libc calls a row cost more than the copy. */
            const int inside = ih >= 0 && ih < H;
            for (int64_t c = 0; c < Wp; ++c) d[c] = inside && c >= pw && c < pw + W ? xc[ih * W + c - pw] : 0.0f;
            continue;
        }
        if (ih < 0 || ih >= H) {
            memset(d, 0, (size_t)Wp * sizeof(float));
            continue;
        }
        memset(d, 0, (size_t)pw * sizeof(float));
        memcpy(d + pw, xc + ih * W, (size_t)W * sizeof(float));
        memset(d + pw + W, 0, (size_t)(Wp - pw - W) * sizeof(float));
    }
}

/* koff[(c * KH + kh) * KW + kw]: tap (c, kh, kw)'s offset from a window's corner in planes
   of `plane` floats and rows of Wp. */
static inline void ss_conv_igemm_offsets(int32_t* koff, int64_t C, int64_t KH, int64_t KW, int64_t plane, int64_t Wp,
                                         int64_t dh, int64_t dw) {
    for (int64_t c = 0; c < C; ++c)
        for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw)
                koff[(c * KH + kh) * KW + kw] = (int32_t)(c * plane + kh * dh * Wp + kw * dw);
}

/* Sums of np pixels x mv channels, pixel g's channel j at t[g * ld + j] (ld a multiple of
   8), activated in place on whole vectors, then stored transposed into planes: channel j's
   pixels at yq[j * P], in 8 x 8 blocks, a ragged last one through a masked store. (A scalar
   activation per element of the ragged part, SiLU's exp among them, took most of a
   6-pixel tile's time, and its scalar stores most of a 4-pixel one's.) rq: NULL, or the
   residual laid out as yq (channel j's pixels at rq[j * P]), added to each transposed
   vector of 8 pixels before its store, then res_act applied: the residual is read once,
   while the output's lines are being written, instead of in a pass of its own. */
static inline void ss_conv_store_tile(float* t, int64_t ld, int64_t np, int64_t mv, float* yq, int64_t P, int act,
                                      const float* rq, int res_act) {
    if (act)
        for (int64_t g = 0; g < np; ++g) {
            int64_t h = 0;
#ifdef __AVX512F__
            for (; h < mv && h + 16 <= ld; h += 16)
                _mm512_storeu_ps(t + g * ld + h, ss_act16(_mm512_loadu_ps(t + g * ld + h), act));
#endif
            for (; h < mv; h += 8) _mm256_storeu_ps(t + g * ld + h, ss_act8(_mm256_loadu_ps(t + g * ld + h), act));
        }
    float r[64];
    for (int64_t g = 0; g < np; g += 8) {
        const int64_t n = np - g < 8 ? np - g : 8;
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int64_t h = 0; h < mv; h += 8) {
            ss_gemm_transpose8(t + g * ld + h, ld, (int)n, r, 8);  /* r[j * 8 + i]: channel h + j, pixel g + i */
            for (int64_t j = 0; j < 8 && h + j < mv; ++j) {
                __m256 v = _mm256_loadu_ps(r + j * 8);
                if (rq) {
                    const float* rr = rq + (h + j) * P + g;
                    v = ss_act8(_mm256_add_ps(v, n == 8 ? _mm256_loadu_ps(rr) : _mm256_maskload_ps(rr, mask)), res_act);
                }
                if (n == 8) _mm256_storeu_ps(yq + (h + j) * P + g, v);
                else _mm256_maskstore_ps(yq + (h + j) * P + g, mask, v);
            }
        }
    }
}

/* Block `blk` (pixels p0 .. p0 + np) of panels q .. q + nq (nq = 1, or 2 for the pair tile;
   16 channels each): tiles over every slice of taps, then the transposed, biased, activated
   store into y [M, P] (with the residual res [M, P] added and res_act applied, when res is
   not NULL). The block's sums are pixel-major in t, 16 * nq floats a pixel (the bias, bb,
   likewise: panel j's 16 channels at bb + 16 j). */
static inline void ss_conv_igemm_block(const float* stage, const int32_t* koff, const float* wp, int prepacked,
                                const float* bias, float* y, float* t, int64_t q, int64_t nq, int64_t blk,
                                int64_t M, int64_t K, int64_t P, int64_t OW, int64_t sh, int64_t sw,
                                int64_t Wp, int act, const float* res, int res_act) {
    int64_t panels = (M + 15) / 16, p0 = blk * SS_CONV_IGEMM_BLOCK, ld = 16 * nq;
    int64_t np = P - p0 < SS_CONV_IGEMM_BLOCK ? P - p0 : SS_CONV_IGEMM_BLOCK;
    float bb[32];
    for (int64_t j = 0; j < 32; ++j) bb[j] = bias && j < ld && q * 16 + j < M ? bias[q * 16 + j] : 0.0f;
    if (res) {
        /* The block's residual, a run of np pixels in each of its channels' planes, fetched
           while the taps run: read only at the store, a run per channel, it missed there
           (yolo_style's six C2f 3x3 convs at 320x320, 1 thread: 4.8% over their convs and
           Adds apart without this, even with it). */
        const int64_t mv = M - q * 16 < ld ? M - q * 16 : ld;
        for (int64_t j = 0; j < mv; ++j)
            for (int64_t i = 0; i < np + 15; i += 16)  /* every line, the run's ends unaligned */
                _mm_prefetch((const char*)(res + (q * 16 + j) * P + p0 + i), _MM_HINT_T0);
    }
    /* Window corners; the last tile's missing pixels repeat the last one (computed, not stored). */
    const float* base[SS_CONV_IGEMM_BLOCK];
    int64_t tiles = (np + SS_CONV_IGEMM_MR - 1) / SS_CONV_IGEMM_MR;
    for (int64_t i = 0, oh = p0 / OW, ow = p0 % OW; i < tiles * SS_CONV_IGEMM_MR; ++i) {
        base[i] = stage + oh * sh * Wp + ow * sw;
        if (i + 1 < np && ++ow == OW) {
            ow = 0;
            ++oh;
        }
    }
    for (int64_t k0 = 0; k0 < K; k0 += SS_CONV_IGEMM_KC) {
        int64_t kn = K - k0 < SS_CONV_IGEMM_KC ? K - k0 : SS_CONV_IGEMM_KC;
        /* The slice's weights: in the GEMM's layout, k block k0 holds panels * 16 columns of
           kn rows each; packed here, each panel holds all K rows. Panel q + 1 follows q. */
        const float* wk = prepacked ? wp + k0 * panels * 16 + q * 16 * kn : wp + (q * K + k0) * 16;
#ifdef __AVX512F__
        int64_t pstride = prepacked ? 16 * kn : 16 * K;
        for (int64_t i = 0; i < tiles; ++i) {
            const float* const* bi = base + i * SS_CONV_IGEMM_MR;
            float* ti = t + i * SS_CONV_IGEMM_MR * ld;
            if (nq == 2)
                ss_conv_igemm_tile_zmm(bi, koff + k0, wk, pstride, kn, bb, ti, k0 == 0, 2);
            else
                ss_conv_igemm_tile_zmm(bi, koff + k0, wk, pstride, kn, bb, ti, k0 == 0, 1);
        }
#else
        for (int64_t i = 0; i < tiles; ++i)
            ss_conv_igemm_tile(base + i * SS_CONV_IGEMM_MR, koff + k0, wk, kn, _mm256_loadu_ps(bb),
                               _mm256_loadu_ps(bb + 8), t + i * SS_CONV_IGEMM_MR * 16, k0 == 0);
#endif
    }
    for (int64_t j0 = 0; j0 < nq; ++j0) {
        int64_t mv = M - (q + j0) * 16 < 16 ? M - (q + j0) * 16 : 16;
        ss_conv_store_tile(t + j0 * 16, ld, np, mv, y + (q + j0) * 16 * P + p0, P, act,
                           res ? res + (q + j0) * 16 * P + p0 : NULL, res_act);
    }
}

/* Dense (group 1) conv as an implicit GEMM (see conv_igemm.py). x [N, C, H, W], w [M, C,
   KH, KW], y [N, M, OH, OW] = res_act(act(conv + bias) + res), res NULL (none) or [N, M, OH,
   OW]; wpacked: NULL or w^T packed by ss_gemm_pack_b (used when SS_CONV_IGEMM_PREPACKED).
   work: the caller's scratch of work_floats floats (else one malloc). Returns 0, having
   written nothing, when it cannot run. */
static inline int ss_conv_igemm(const float* x, const float* w, const float* bias, float* y,
                         int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW,
                         int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                         int64_t dh, int64_t dw, int act, float* work, int64_t work_floats,
                         const float* wpacked, const float* res, int res_act) {
    int64_t K = C * KH * KW, P = OH * OW, panels = (M + 15) / 16;
    /* The padded image: every window of every output pixel, and all of the input. */
    int64_t Hp = (OH - 1) * sh + (KH - 1) * dh + 1, Wp = (OW - 1) * sw + (KW - 1) * dw + 1;
    if (Hp < ph + H) Hp = ph + H;
    if (Wp < pw + W) Wp = pw + W;
    int64_t plane = Hp * Wp, blocks = (P + SS_CONV_IGEMM_BLOCK - 1) / SS_CONV_IGEMM_BLOCK;
    if (C * plane >= INT32_MAX) return 0;  /* the tap offsets are 32-bit */
#ifdef SS_CONV_IGEMM_PREPACKED
    int prepacked = wpacked != NULL;
#else
    int prepacked = 0;
    (void)wpacked;
#endif
    int threads = omp_get_max_threads();
    /* Scratch, in floats: tap offsets (int32), packed weights unless prepacked, each thread's
       block sums, the padded images. As many images as the caller's scratch holds are
       staged at once (at least one) and run in one parallel region whose items span them:
       image by image, a batch of small planes left threads idle at every image's last
       block and barrier. */
    int64_t wfloats = prepacked ? 0 : panels * K * 16;
    int64_t fixed = K + wfloats + (int64_t)threads * SS_CONV_IGEMM_BLOCK * 16 * SS_CONV_IGEMM_NP;
    int64_t group = work && work_floats > fixed ? (work_floats - fixed) / (C * plane) : 1;
    if (group > N) group = N;
    if (group < 1) group = 1;
    float* own = NULL;
    work = ss_conv_scratch(work, work_floats, fixed + group * C * plane, &own);
    if (!work) return 0;
    int32_t* koff = (int32_t*)work;
    float* wp = prepacked ? (float*)wpacked : work + K;
    float* sums = work + K + wfloats;
    float* stage = sums + (int64_t)threads * SS_CONV_IGEMM_BLOCK * 16 * SS_CONV_IGEMM_NP;
    ss_conv_igemm_offsets(koff, C, KH, KW, plane, Wp, dh, dw);
    int par = M * P * K >= SS_CONV_IGEMM_PAR_MIN;
    /* Whichever is larger, the padded image or all the weights, is read once: a block's
       input serves every panel before the next block (whisper's 80->384 1-D conv over 3000
       columns: 0.81x the direct kernel panel by panel, which read the 1 MB image 24 times),
       or a panel's weights every block (yolov8n's small planes, deep weights). */
    int pixels_outer = C * plane > panels * K * 16;
    /* Units of SS_CONV_IGEMM_NP panels (the last one may hold fewer). */
    int64_t units = (panels + SS_CONV_IGEMM_NP - 1) / SS_CONV_IGEMM_NP;
    if (!prepacked) {
        #pragma omp parallel for schedule(static) if(par)
        for (int64_t q = 0; q < panels; ++q)
            for (int64_t k = 0; k < K; ++k)
                for (int64_t j = 0; j < 16; ++j)
                    wp[(q * K + k) * 16 + j] = q * 16 + j < M ? w[(q * 16 + j) * K + k] : 0.0f;
    }
    for (int64_t n0 = 0; n0 < N; n0 += group) {
        int64_t ni = N - n0 < group ? N - n0 : group, per_image = units * blocks;
        #pragma omp parallel if(par)
        {
            float* t = sums + (int64_t)omp_get_thread_num() * SS_CONV_IGEMM_BLOCK * 16 * SS_CONV_IGEMM_NP;
            #pragma omp for schedule(static)
            for (int64_t ic = 0; ic < ni * C; ++ic)
                ss_conv_igemm_stage(x + (n0 * C + ic) * H * W, stage + ic * plane, H, W, ph, pw, Hp, Wp);
            #pragma omp for schedule(static)
            for (int64_t item = 0; item < ni * per_image; ++item) {
                int64_t n = item / per_image, r = item % per_image;
                int64_t u = pixels_outer ? r % units : r / blocks;
                int64_t blk = pixels_outer ? r / units : r % blocks;
                int64_t q = u * SS_CONV_IGEMM_NP, nq = panels - q < SS_CONV_IGEMM_NP ? panels - q : SS_CONV_IGEMM_NP;
                ss_conv_igemm_block(stage + n * C * plane, koff, wp, prepacked, bias, y + (n0 + n) * M * P, t,
                                    q, nq, blk, M, K, P, OW, sh, sw, Wp, act,
                                    res ? res + (n0 + n) * M * P : NULL, res_act);
            }
        }
    }
    free(own);
    return 1;
}
#endif
"""


def fragment(target: Optional[Target] = None, block: int = BLOCK, min_plane: Optional[int] = None,
             par_min: int = 32768) -> Fragment:
    """The fragment, header-only: ss_conv2d's unit (kernels/conv.py) inlines all of it.

    ``target``: the CPU (this machine's when None), whose GEMM tile gives the default of
    ``min_plane`` (codegen/defaults.py's conv_igemm_min_plane). ``block``: output pixels per
    unit of work (a positive multiple of 12, the pair tile's pixels, itself a multiple of
    the ymm tile's 6); ``min_plane``: output planes of at most this many pixels keep
    ss_conv2d's small-plane path when the caller has prepacked weights; ``par_min``: the
    multiply-adds below which a conv runs on one thread.
    """
    from ..defaults import conv_igemm_min_plane  # defaults imports the kernels package

    min_plane = conv_igemm_min_plane(target) if min_plane is None else min_plane
    if int(block) < 12 or int(block) % 12:
        raise ValueError(f"block must be a positive multiple of 12, got {block}")
    return Fragment([Shared(fill(_TEMPLATE, BLOCK=int(block), MIN_PLANE=int(min_plane), PAR_MIN=int(par_min)))])


def source(target: Optional[Target] = None, **parameters) -> str:
    return fragment(target, **parameters).text()
