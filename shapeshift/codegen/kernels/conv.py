"""Convolution and transposed convolution kernels (ONNX Conv / ConvTranspose, NCHW float32).

Exported C::

    /* 2-D convolution (1-D is H = 1, KH = 1): x [N, C, H, W], w [M, C/group, KH, KW],
       bias NULL or [M], y [N, M, OH, OW]. Begin pads ph, pw (the end pads are implied by
       OH, OW, which the caller computes); strides sh, sw; dilations dh, dw; group >= 1.
       act: 0 none, 1 relu, 2 sigmoid, 3 silu (x * sigmoid(x)), applied after the bias.
       work: scratch of at least ss_conv2d_work_size(...) floats (NULL when that is 0).
       wpacked: NULL, or (group 1 only) w as a [C*KH*KW, M] matrix packed once by
       ss_gemm_pack_b(C*KH*KW, M, w, 1, C*KH*KW, wpacked). */
    int64_t ss_conv2d_work_size(int64_t C, int64_t KH, int64_t KW, int64_t OH, int64_t OW, int64_t group);
    void ss_conv2d(const float* x, const float* w, const float* bias, float* y,
                   int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW,
                   int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                   int64_t dh, int64_t dw, int64_t group, int act, float* work, const float* wpacked);

    /* ss_conv2d with a residual fused: y = res_act(act(conv(x, w) + bias) + res), res NULL
       (none: ss_conv2d itself) or [N, M, OH, OW], not overlapping y; res_act an act code. */
    void ss_conv2d_residual(<ss_conv2d's arguments>, const float* res, int res_act);

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

Strategy of ss_conv2d:

- Dense (group 1) k x k, with AVX2: the implicit GEMM of conv_igemm.py, 6 output pixels x
  16 output channels per register tile, the input read in place from a zero-padded copy
  (no im2col matrix, no stride phases), the weights from the prepacked B when the caller
  has it; except on planes of at most SS_CONV_IGEMM_MIN_PLANE pixels with prepacked
  weights, which take the small-plane GEMM below. On yolov8n's 3x3 convs it ran 1.2-1.45x
  faster than the direct kernel that had served them.
- 1x1, stride-1, unpadded: one ss_gemm per group straight on the NCHW data (the image
  batch is ss_gemm's batch), then a vectorized activation pass. Tried and not kept: a
  kernel with the pixels in the lanes, reading x's rows in place and broadcasting the
  prepacked weights (8 channels x 3 zmm vectors a tile, no packing at all). Alone it ran
  ResNet-50's 1x1 shapes at 107-114 GFLOPS against these paths' 99-110 (AMD Zen 4, 1
  thread), but inside ResNet-50 (bench/conv_profile.py, the two builds alternating) it
  gained nothing at 1 thread and lost 13% of the whole net at 2: splitting the output
  channels between the threads, it left each pixel's channels half in the other core's
  cache, and the next conv, whose staging splits the image rows, read them from there (the
  unchanged Winograd 3x3 convs after it ran 11-36% slower). A parallel kernel here keeps a
  thread on the pixels it wrote, as ss_gemm's split of N (the pixels) does.
- Depthwise (group == C, any channel multiplier M / C): parallel over output planes. Each
  input plane is first staged into a per-thread buffer with its zero padding, split into
  `sw` column phases (stride 2 by an AVX2 deinterleave), so every tap of a run of output
  columns is one contiguous unaligned load whatever the stride and padding. Output planes
  are computed in register tiles of dw_rows rows x dw_vecs vectors (independent FMA
  chains, so 10- or 20-pixel-wide late-stage planes still hide the FMA latency; 3x3 and
  5x5 unrolled), with the bias and activation applied before the one store.
- Small output planes (OH * OW <= SS_CONV_SMALL_PLANE, or <= SS_CONV_SMALL_PLANE_MAX with
  at least as many output channels) with the weights prepacked (wpacked): the GEMM is
  turned around, y^T [OH*OW, M] = col^T x w^T, so that the weights are the GEMM's
  prepacked B, read in place, instead of its A, which ss_gemm packs at every call: on
  late-stage planes of a few pixels (yolov8n at 64x96: 2x3 pixels, 256 channels x 2304
  taps) that packing was most of the conv, and the few pixels filled a fraction of each
  register tile's columns. col is the im2col matrix (or x itself for a stride-1 unpadded
  1x1), read through the GEMM's A strides, and made through a table of input offsets
  computed once per call; the result goes through a per-call scratch, gets the activation
  there and is transposed into y.
- Other k x k (grouped; dense ones too when built with igemm=False), with AVX2: the
  direct kernel, with no im2col matrix. Per
  (image, group) the input planes are staged once, zero-padded and split into row and
  column stride phases, so that for every tap the output pixels, taken row after row over
  a staged row's width (its few columns past OW are computed and dropped), are one run of
  memory; the weights are packed into blocks of 6 output channels, once per call. A tile
  of 16 such pixels then accumulates 6 channels in 12 registers over all C * KH * KW taps
  (the GEMM micro-kernel's shape, the input read straight from the staged planes where the
  GEMM reads a packed panel), the taps taken direct_taps at a time so that their input
  rows and a block's weights share L1 while every block of direct_block floats of
  weights passes over them; bias, activation and the store through the tile's row runs
  come last. The im2col below writes and rereads KH * KW copies of the input instead: on
  yolov8n's 3x3 convs at one thread the direct kernel ran 1.2-2x faster at stride 1 and
  from even to 1.4x faster at stride 2.
- Everything else (strided or padded 1x1; k x k without AVX2): per (image, group), tiled
  over output columns. Each chunk of columns (Kc * chunk about chunk_floats, so it stays
  in L2) is im2col'ed straight into ss_gemm_prepacked's packed-B layout (no second copy
  by the GEMM's packing) in its own part of `work` and multiplied, then the activation
  runs on that chunk of y while it is in cache. Chunks run in parallel when there are
  enough of them for every thread (else each GEMM is parallel inside). Without the real
  gemm fragment (SS_GEMM_NR undefined), a plain im2col of the whole matrix and ss_gemm.

The residual of ss_conv2d_residual (ResNet's Conv -> Add -> Relu, YOLO's Conv -> SiLU ->
Add, fused by the lowering: codegen/lower/nn.py) is added where each path stores its
output, so that it is read while the output's lines are being written rather than in an
elementwise pass of its own over a tensor that has left L2 (ResNet-50's Adds: 2.2 ms of
87 at 224x224, 1 thread, AMD Zen 4): the implicit GEMM and conv_panels add it to each
transposed vector of 8 pixels before the store (conv_igemm.py's ss_conv_store_tile), the
small-plane GEMM in its transpose back to planes, the 1 x 1 GEMM and the im2col GEMM in
the GEMM's epilogue (ss_gemm_add: in registers for full tiles) when no activation comes
before it, else in the pass that activation takes anyway. The depthwise and direct
kernels (grouped convs) add it in a pass after the conv.

The bias and relu ride in ss_gemm's epilogue; sigmoid and silu use vmath's ss_sigmoid8
(and its scalar twin for tails; its 16-lane twin, bit for bit the same, on AVX-512 builds),
so every path gives the same values. The separate pass after a GEMM takes 16 lanes where
it can: on an AMD Zen 4, 1 x 1 convs with SiLU on 80x80 and 40x40 planes (32->32, 64->64)
ran 1.56x and 1.34x onnxruntime's time with 8 lanes, 1.02x and 1.14x with 16.

ss_conv_transpose2d: per (image, group), ss_gemm computes col[(m, kh, kw), (h, w)] =
sum_c w[c, m, kh, kw] * x[c, h, w] into `work`, then col2im scatters it into the output
planes, parallel over output channels (each thread owns its planes, so no races).
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Private, fill

DEPENDS = ("gemm", "vmath", "conv_igemm", "conv_panels")
#: Output planes of at most this many pixels take the prepacked-weights path by default.
SMALL_PLANE = 64
# Planes of up to this many pixels take that path too when the conv has at least as many
# output channels as pixels (small_plane_ok, the test ss_conv2d makes). There the direct
# kernel's packing of all the weights at every call outweighs what it saves: at 1 thread 128->128 3x3 on
# 10x10 ran 432 us that way against 542 direct, 256->256 on 16x16 4520 against 4996; at 2
# threads even to 1.4x faster. With fewer channels than pixels direct stays ahead (32->32
# on 12x12: 64 us direct, 75 the other way).
SMALL_PLANE_MAX = 256


def small_plane_ok(pixels: int, channels: int, small_plane: int = SMALL_PLANE,
                   small_plane_max: int = SMALL_PLANE_MAX) -> bool:
    """Whether a group-1 conv of ``pixels`` output pixels and ``channels`` output channels
    takes the prepacked-weights path when it has them (ss_conv2d makes the same test)."""
    return pixels <= small_plane or (pixels <= small_plane_max and pixels <= channels)

_DEFINES = r"""
/* ---- conv ---- */
/* Loops with fewer multiply-adds (or copied elements) than this stay serial. */
#define SS_CONV_PAR_MIN @PAR_MIN@
/* Elements per chunk of the parallel activation pass. */
#define SS_CONV_ACT_CHUNK @ACT_CHUNK@
/* The depthwise register tile: SS_CONV_DW_ROWS output rows x SS_CONV_DW_VECS ymm vectors. */
#define SS_CONV_DW_VECS @DW_VECS@
/* Floats of packed im2col columns per GEMM call (L2-sized: the GEMM rereads them per row block). */
#define SS_CONV_CHUNK_FLOATS @CHUNK_FLOATS@
#define SS_CONV_DW_ROWS @DW_ROWS@
/* Output planes of at most this many pixels use prepacked weights when the caller has them,
   and planes of at most SS_CONV_SMALL_PLANE_MAX pixels when there are as many output channels. */
#define SS_CONV_SMALL_PLANE @SMALL_PLANE@
#define SS_CONV_SMALL_PLANE_MAX @SMALL_PLANE_MAX@
/* 1: k x k convs (not 1 x 1 ones) run the direct kernel (0: im2col and the GEMM). */
#define SS_CONV_USE_DIRECT @DIRECT@
/* 1: dense k x k convs run the implicit GEMM of conv_igemm.py (0: as grouped ones). */
#define SS_CONV_USE_IGEMM @IGEMM@
/* Floats of packed weights the direct kernel's tiles take at a time (kept in L2). */
#define SS_CONV_DIRECT_BLOCK_FLOATS @DIRECT_BLOCK@
/* Taps (input channels x KH x KW) the direct kernel takes at a time per tile (in L1). */
#define SS_CONV_DIRECT_TAPS @DIRECT_TAPS@
"""

_COMMON = r"""
/* ceil(a / b) for b > 0 and any sign of a. */
static inline int64_t ss_conv_ceil_div(int64_t a, int64_t b) {
    return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

/* The outputs o in [*lo, *hi) within [0, O) whose input o * s - p + off lies in [0, L). */
static inline void ss_conv_valid(int64_t L, int64_t O, int64_t s, int64_t p, int64_t off,
                                 int64_t* lo, int64_t* hi) {
    int64_t a = ss_conv_ceil_div(p - off, s), b = ss_conv_ceil_div(L + p - off, s);
    if (a < 0) a = 0;
    if (b > O) b = O;
    if (b < a) b = a;
    *lo = a;
    *hi = b;
}

#ifdef __AVX2__
/* Lanes [0, n) of a maskload / maskstore mask: the partial last vector of a row. */
static inline __m256i ss_conv_lane_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Lanes [lo, hi) (either end may lie outside 0..8). */
static inline __m256i ss_conv_lanes(int64_t lo, int64_t hi) {
    return _mm256_andnot_si256(ss_conv_lane_mask(lo), ss_conv_lane_mask(hi));
}

/* The even and odd elements of 16 consecutive floats a | b, each in order: a stride-2
   row split into its two column phases. */
static inline void ss_conv_deinterleave(__m256 a, __m256 b, __m256* even, __m256* odd) {
    /* [a0 a2 b0 b2 | a4 a6 b4 b6] -> a0 a2 a4 a6 b0 b2 b4 b6 (and the odd lanes). */
    __m256 ev = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    __m256 od = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xD8));
    *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), 0xD8));
}
#endif

/* y[0..n) = act(y), vectorized: the separate pass after a GEMM block, while it is in cache. */
static void ss_conv_act_run(float* y, int64_t n, int act) {
    if (act == 0) return;
    int64_t i = 0;
#ifdef __AVX512F__
    /* ss_act16 gives ss_act8's results bit for bit (vmath.py), 16 lanes an instruction. */
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, ss_act16(_mm512_loadu_ps(y + i), act));
#endif
#ifdef __AVX2__
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, ss_act8(_mm256_loadu_ps(y + i), act));
#endif
    for (; i < n; ++i) y[i] = ss_actf(y[i], act);
}

/* y[0..n) = post(pre(y) + res), vectorized (res NULL: pre(y)): what a path's store left
   undone of res_act(act(conv + bias) + res), while that block of y is in cache. */
static void ss_conv_finish_run(float* y, const float* res, int64_t n, int pre, int post) {
    if (!res) {
        ss_conv_act_run(y, n, pre);
        return;
    }
    int64_t i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, ss_act16(_mm512_add_ps(ss_act16(_mm512_loadu_ps(y + i), pre), _mm512_loadu_ps(res + i)),
                                         post));
#endif
#ifdef __AVX2__
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, ss_act8(_mm256_add_ps(ss_act8(_mm256_loadu_ps(y + i), pre), _mm256_loadu_ps(res + i)),
                                        post));
#endif
    for (; i < n; ++i) y[i] = ss_actf(ss_actf(y[i], pre) + res[i], post);
}

/* ss_conv_finish_run over a large y, parallel over SS_CONV_ACT_CHUNK-element chunks; nothing
   to do without a residual or an activation. */
static void ss_conv_finish(float* y, const float* res, int64_t n, int pre, int post) {
    if (!res && pre == 0) return;
    int64_t chunks = (n + SS_CONV_ACT_CHUNK - 1) / SS_CONV_ACT_CHUNK;
    #pragma omp parallel for if(n >= SS_CONV_PAR_MIN / 8)
    for (int64_t c = 0; c < chunks; ++c) {
        int64_t lo = c * SS_CONV_ACT_CHUNK, hi = lo + SS_CONV_ACT_CHUNK < n ? lo + SS_CONV_ACT_CHUNK : n;
        ss_conv_finish_run(y + lo, res ? res + lo : NULL, hi - lo, pre, post);
    }
}

/* How a GEMM path splits y = res_act(act(conv + bias) + res) between the GEMM's epilogue
   (bias, the addend d, relu when gemm_act) and the pass after it (finish: pre, then the
   residual r, then post). The residual rides in the epilogue, read while the tile is in
   registers, when no activation comes before it (ResNet's Conv -> Add -> Relu); after one
   (YOLO's Conv -> SiLU -> Add) it joins the pass that activation needs anyway. Only the
   real gemm fragment (SS_GEMM_NR) has the epilogue's addend (ss_gemm_add). */
typedef struct {
    const float* d;
    int gemm_act, pre, post;
    const float* r;
} ss_conv_epi;

static inline ss_conv_epi ss_conv_gemm_epi(int act, const float* res, int res_act) {
    ss_conv_epi e;
#ifdef SS_GEMM_NR
    if (res && act == 0) {
        e.d = res;
        e.gemm_act = res_act == 1;
        e.pre = res_act >= 2 ? res_act : 0;
        e.r = NULL;
        e.post = 0;
        return e;
    }
#endif
    e.d = NULL;
    e.gemm_act = act == 1;
    e.pre = act >= 2 ? act : 0;
    e.r = res;
    e.post = res_act;
    return e;
}

"""

_IM2COL = r"""
#if !defined(SS_GEMM_NR) || !defined(SS_GEMM_KC)
/* col [C * KH * KW, OH * OW] from one image's C channels x [C, H, W]; padding reads as 0.
   Only without the real gemm fragment (below: SS_CONV_PACKED builds its columns packed). */
static void ss_conv_im2col(const float* x, float* col, int64_t C, int64_t H, int64_t W,
                           int64_t KH, int64_t KW, int64_t OH, int64_t OW, int64_t sh, int64_t sw,
                           int64_t ph, int64_t pw, int64_t dh, int64_t dw) {
    int64_t rows = C * KH * KW, P = OH * OW;
    #pragma omp parallel for if(rows * P >= SS_CONV_PAR_MIN)
    for (int64_t r = 0; r < rows; ++r) {
        int64_t c = r / (KH * KW), kh = (r / KW) % KH, kw = r % KW;
        const float* src = x + c * H * W;
        float* dst = col + r * P;
        int64_t lo, hi;
        ss_conv_valid(W, OW, sw, pw, kw * dw, &lo, &hi);
        for (int64_t oh = 0; oh < OH; ++oh) {
            float* d = dst + oh * OW;
            int64_t ih = oh * sh - ph + kh * dh;
            if (ih < 0 || ih >= H) {
                memset(d, 0, (size_t)OW * sizeof(float));
                continue;
            }
            const float* s = src + ih * W + (lo * sw - pw + kw * dw);
            for (int64_t ow = 0; ow < lo; ++ow) d[ow] = 0.0f;
            if (sw == 1) {
                memcpy(d + lo, s, (size_t)(hi - lo) * sizeof(float));
            } else {
                for (int64_t j = 0; j < hi - lo; ++j) d[lo + j] = s[j * sw];
            }
            for (int64_t ow = hi; ow < OW; ++ow) d[ow] = 0.0f;
        }
    }
}
#endif

"""

_IM2COL_PACKED = r"""
#if defined(SS_GEMM_NR) && defined(SS_GEMM_KC)
#define SS_CONV_PACKED 1
/* Columns [p0, p0 + w) (w a multiple of SS_GEMM_NR) of one image's im2col matrix
   [C * KH * KW, OH * OW], written straight in ss_gemm_prepacked's packed-B layout (see
   gemm.py: K blocks of SS_GEMM_KC rows, each a run of NR-column panels, each panel's rows
   one after another), so the GEMM does not copy it again. Each row's columns go in runs
   that stay inside one output row and one panel: zeros for the padding, a copy for the rest. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
static void ss_conv_im2col_packed(const float* x, float* dst, int64_t C, int64_t H, int64_t W,
                                  int64_t KH, int64_t KW, int64_t OW, int64_t sh, int64_t sw,
                                  int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t p0, int64_t w) {
    int64_t Kc = C * KH * KW;
    for (int64_t r = 0; r < Kc; ++r) {
        int64_t c = r / (KH * KW), kh = (r / KW) % KH, kw = r % KW;
        int64_t k0 = r / SS_GEMM_KC * SS_GEMM_KC, kb = Kc - k0 < SS_GEMM_KC ? Kc - k0 : SS_GEMM_KC;
        float* row = dst + k0 * w + (r - k0) * SS_GEMM_NR;  /* column t sits at row[(t / NR) * NR * kb + t % NR] */
        int64_t lo, hi;
        ss_conv_valid(W, OW, sw, pw, kw * dw, &lo, &hi);
        const float* plane = x + c * H * W + (kw * dw - pw);
        int64_t t = 0, oh = p0 / OW, ow = p0 % OW;
        while (t < w) {
            /* One run: up to the end of the output row or of the panel, whichever is first. */
            int64_t n = OW - ow, left = SS_GEMM_NR - t % SS_GEMM_NR;
            if (n > left) n = left;
            if (n > w - t) n = w - t;
            float* d = row + (t / SS_GEMM_NR) * SS_GEMM_NR * kb + t % SS_GEMM_NR;
            int64_t ih = oh * sh - ph + kh * dh;
            if (ih < 0 || ih >= H) {
                for (int64_t j = 0; j < n; ++j) d[j] = 0.0f;
            } else {
                const float* src = plane + ih * W;  /* output column o reads src[o * sw] */
                int64_t a = lo > ow ? lo : ow, b = hi < ow + n ? hi : ow + n, j = ow;
                for (; j < a && j < ow + n; ++j) d[j - ow] = 0.0f;
                if (sw == 1) {
#ifdef __AVX2__
                    for (; j + 8 <= b; j += 8) _mm256_storeu_ps(d + (j - ow), _mm256_loadu_ps(src + j));
#endif
                    for (; j < b; ++j) d[j - ow] = src[j];
                } else {
#ifdef __AVX2__
                    /* The even lanes of 16 consecutive floats; the 16th, odd one must still
                       lie inside the row (src[k] is inside for k < W + pw - kw * dw). */
                    if (sw == 2)
                        for (; j + 8 <= b && 2 * j + 16 <= W + pw - kw * dw; j += 8) {
                            __m256 ev, od;
                            ss_conv_deinterleave(_mm256_loadu_ps(src + 2 * j), _mm256_loadu_ps(src + 2 * j + 8),
                                                 &ev, &od);
                            _mm256_storeu_ps(d + (j - ow), ev);
                        }
#endif
                    for (; j < b; ++j) d[j - ow] = src[j * sw];
                }
                for (; j < ow + n; ++j) d[j - ow] = 0.0f;
            }
            t += n;
            ow += n;
            if (ow == OW) {
                ow = 0;
                ++oh;
            }
        }
    }
}

/* Columns [p0, p0 + w) of the im2col matrix, row-major [Kc, w] (images of fewer than NR pixels). */
static void ss_conv_im2col_cols(const float* x, float* dst, int64_t C, int64_t H, int64_t W,
                                int64_t KH, int64_t KW, int64_t OW, int64_t sh, int64_t sw,
                                int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t p0, int64_t w) {
    for (int64_t r = 0; r < C * KH * KW; ++r) {
        int64_t c = r / (KH * KW), kh = (r / KW) % KH, kw = r % KW;
        for (int64_t t = 0; t < w; ++t) {
            int64_t oh = (p0 + t) / OW, ow = (p0 + t) % OW;
            int64_t ih = oh * sh - ph + kh * dh, iw = ow * sw - pw + kw * dw;
            dst[r * w + t] = ih >= 0 && ih < H && iw >= 0 && iw < W ? x[(c * H + ih) * W + iw] : 0.0f;
        }
    }
}

/* One (image, group) of an im2col conv, tiled over output columns: chunks of cw columns
   (a multiple of NR, Kc * cw about SS_CONV_CHUNK_FLOATS, so the packed chunk stays in L2
   while the GEMM reads it) are packed-im2col'ed into their own part of `work` (column p0
   at work + Kc * p0: the chunks never overlap, so they can run in parallel) and multiplied
   by ss_gemm_prepacked, the activation (and the residual rg, NULL for none: ss_conv_gemm_epi)
   applied to the chunk's output while it is in cache. The last P % NR columns are one more
   packed panel that ends at column P (below), so `work` of Kc * P floats always suffices. */
static void ss_conv_gemm_tiled(const float* x, const float* wg, const float* bias, float* yg, float* work,
                               int64_t Cg, int64_t H, int64_t W, int64_t Mg, int64_t KH, int64_t KW,
                               int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                               int64_t dh, int64_t dw, int act, const float* rg, int res_act) {
    int64_t P = OH * OW, Kc = Cg * KH * KW, Pfull = P / SS_GEMM_NR * SS_GEMM_NR;
    int64_t cw = SS_CONV_CHUNK_FLOATS / (Kc > 0 ? Kc : 1) / SS_GEMM_NR * SS_GEMM_NR;
    if (cw < SS_GEMM_NR) cw = SS_GEMM_NR;
    const ss_conv_epi e = ss_conv_gemm_epi(act, rg, res_act);
    const int finish = e.pre || e.r;
    int64_t chunks = (Pfull + cw - 1) / cw;
    /* Chunks in parallel only when there are enough for every thread; else one at a time,
       each GEMM parallel inside. In parallel, as many chunks as a multiple of the threads,
       of equal width: ResNet-50's 256 -> 512 stride-2 1x1 on 28 x 28 was a chunk of 512
       columns and one of 272, and scaled 1.31x on 2 threads (AMD Zen 2). */
    const int64_t threads = omp_get_max_threads();
    int par = chunks >= threads && Mg * P * Kc >= SS_CONV_PAR_MIN * 64;
    if (par) {
        chunks = (chunks + threads - 1) / threads * threads;
        cw = ((Pfull + chunks - 1) / chunks + SS_GEMM_NR - 1) / SS_GEMM_NR * SS_GEMM_NR;
        chunks = (Pfull + cw - 1) / cw;
    }
    #pragma omp parallel for schedule(dynamic) if(par)
    for (int64_t ci = 0; ci < chunks; ++ci) {
        int64_t p0 = ci * cw, w = Pfull - p0 < cw ? Pfull - p0 : cw;
        float* packed = work + Kc * p0;
        ss_conv_im2col_packed(x, packed, Cg, H, W, KH, KW, OW, sh, sw, ph, pw, dh, dw, p0, w);
        ss_gemm_prepacked_add(Mg, w, Kc, 1, 1, wg, 0, 0, Kc, 1, packed, yg + p0, 0, 0, P,
                              1.0f, bias, 1.0f, 1, 0, e.gemm_act, e.d ? e.d + p0 : NULL);
        if (finish)
            for (int64_t m = 0; m < Mg; ++m)
                ss_conv_finish_run(yg + m * P + p0, e.r ? e.r + m * P + p0 : NULL, w, e.pre, e.post);
    }
    if (Pfull == P) return;
    if (P >= SS_GEMM_NR) {
        /* The last, partial panel: one more packed panel over the last NR columns,
           overlapping columns already done (rewritten with the same values, not
           accumulated). Its scratch overlaps the last chunk's, free now the loop is over. */
        int64_t p0 = P - SS_GEMM_NR;
        float* packed = work + Kc * p0;
        ss_conv_im2col_packed(x, packed, Cg, H, W, KH, KW, OW, sh, sw, ph, pw, dh, dw, p0, SS_GEMM_NR);
        ss_gemm_prepacked_add(Mg, SS_GEMM_NR, Kc, 1, 1, wg, 0, 0, Kc, 1, packed, yg + p0, 0, 0, P,
                              1.0f, bias, 1.0f, 1, 0, e.gemm_act, e.d ? e.d + p0 : NULL);
        if (finish)
            for (int64_t m = 0; m < Mg; ++m)
                ss_conv_finish_run(yg + m * P + p0, e.r ? e.r + m * P + p0 : NULL, SS_GEMM_NR, e.pre, e.post);
        return;
    }
    /* Fewer than NR columns in all: a plain [Kc, P] im2col and ss_gemm. */
    ss_conv_im2col_cols(x, work, Cg, H, W, KH, KW, OW, sh, sw, ph, pw, dh, dw, 0, P);
    ss_gemm_add(Mg, P, Kc, 1, 1, wg, 0, 0, Kc, 1, work, 0, 0, P, 1, yg, 0, 0, P, 1.0f, bias, 1.0f, 1, 0, e.gemm_act,
                e.d);
    if (finish) ss_conv_finish_run(yg, e.r, Mg * P, e.pre, e.post);
}
#endif

"""

_DEPTHWISE = r"""
/* Stages one input plane xp [H, W] for the depthwise kernel: buf [sw][Hs][Wq] with
   buf[(q * Hs + i) * Wq + j] = x[i - ph][j * sw + q - pw] (0 outside the image). Both
   paddings are then plain zeros in buf, so every output row runs the same loop, and output
   column ow's tap kw, input column ow * sw - pw + kw * dw, is buf phase (kw * dw) % sw at
   column ow + (kw * dw) / sw: every tap of a run of output columns is one contiguous load,
   at any stride. The loops are written out (and kept from becoming memcpy / memset calls):
   late-stage rows are a few dozen floats, where a library call costs more than the copy. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
static void ss_conv_dw_stage(const float* xp, float* buf, float* padrow, int64_t H, int64_t W, int64_t sw,
                             int64_t ph, int64_t pw, int64_t Hs, int64_t Wq) {
    /* padrow [sw * Wq]: one input row with its zero padding, pr[t] = x[ih][t - pw]. */
    int64_t L = sw * Wq, lo = pw < L ? pw : L, hi = W + pw < L ? W + pw : L;
    for (int64_t i = 0; i < Hs; ++i) {
        int64_t ih = i - ph;
        int inside = ih >= 0 && ih < H;
        /* Stride 1: the padded row is phase 0's row itself. */
        float* pr = sw == 1 ? buf + i * Wq : padrow;
        int64_t t = 0;
#ifdef __AVX2__
        /* Whole vectors (L is a multiple of 8): a masked load reads the image part and
           zero-fills the padding lanes, without touching memory outside the row. */
        if (inside) {
            const float* src = xp + ih * W - pw;
            for (; t < L; t += 8) {
                if (t >= lo && t + 8 <= hi) {
                    _mm256_storeu_ps(pr + t, _mm256_loadu_ps(src + t));
                    continue;
                }
                _mm256_storeu_ps(pr + t, _mm256_maskload_ps(src + t, ss_conv_lanes(lo - t, hi - t)));
            }
        } else {
            for (; t < L; t += 8) _mm256_storeu_ps(pr + t, _mm256_setzero_ps());
        }
#else
        for (; t < L; ++t) pr[t] = inside && t >= lo && t < hi ? xp[ih * W + t - pw] : 0.0f;
#endif
        if (sw == 1) continue;
        float* d0 = buf + i * Wq;  /* phase q's row i: d0 + q * Hs * Wq */
        int64_t j = 0;
#ifdef __AVX2__
        if (sw == 2) {
            float* d1 = d0 + Hs * Wq;
            for (; j + 8 <= Wq; j += 8) {
                __m256 ev, od;
                ss_conv_deinterleave(_mm256_loadu_ps(pr + 2 * j), _mm256_loadu_ps(pr + 2 * j + 8), &ev, &od);
                _mm256_storeu_ps(d0 + j, ev);
                _mm256_storeu_ps(d1 + j, od);
            }
        }
#endif
        for (; j < Wq; ++j)
            for (int64_t q = 0; q < sw; ++q) d0[q * Hs * Wq + j] = pr[j * sw + q];
    }
}

#ifdef __AVX2__
/* A tile of R output rows (oh0..) x V vectors of columns (ow..) of a depthwise plane from
   its staged input: R * V independent accumulators (FMA chains), bias and activation in
   registers, one store each; `last` valid lanes in the tile's last vector (8: all).
   Always inlined with literal R, V (and KH, KW where common), so the loops unroll. */
static inline __attribute__((always_inline)) void ss_conv_dw_tile(
        const float* buf, const float* wp, float b, float* yp, const int64_t* toff,
        int64_t oh0, int64_t ow, int R, int V, int64_t last, int64_t KH, int64_t KW, int64_t OW,
        int64_t sh, int64_t dh, int64_t Wq, int act) {
    __m256 acc[SS_CONV_DW_ROWS][SS_CONV_DW_VECS];
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
        #pragma GCC unroll 8
        for (int v = 0; v < V; ++v) acc[r][v] = _mm256_set1_ps(b);
    const float* base = buf + oh0 * sh * Wq + ow;
    for (int64_t kh = 0; kh < KH; ++kh) {
        const float* row = base + kh * dh * Wq;
        for (int64_t kw = 0; kw < KW; ++kw) {
            const float* src = row + toff[kw];
            __m256 wv = _mm256_set1_ps(wp[kh * KW + kw]);
            #pragma GCC unroll 8
            for (int r = 0; r < R; ++r)
                #pragma GCC unroll 8
                for (int v = 0; v < V; ++v)
                    acc[r][v] = ss_fmadd8(wv, _mm256_loadu_ps(src + r * sh * Wq + 8 * v), acc[r][v]);
        }
    }
    float* y0 = yp + oh0 * OW + ow;
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
        #pragma GCC unroll 8
        for (int v = 0; v < V; ++v) {
            __m256 out = ss_act8(acc[r][v], act);
            if (v < V - 1 || last == 8) _mm256_storeu_ps(y0 + r * OW + 8 * v, out);
            else _mm256_maskstore_ps(y0 + r * OW + 8 * v, ss_conv_lane_mask(last), out);
        }
}

/* R output rows from oh0: SS_CONV_DW_VECS vectors at a time, then single vectors. */
static inline __attribute__((always_inline)) void ss_conv_dw_rows(
        const float* buf, const float* wp, float b, float* yp, const int64_t* toff, int64_t oh0, int R,
        int64_t KH, int64_t KW, int64_t OW, int64_t sh, int64_t dh, int64_t Wq, int act) {
    int64_t ow = 0;
    for (; ow + 8 * SS_CONV_DW_VECS <= OW; ow += 8 * SS_CONV_DW_VECS)
        ss_conv_dw_tile(buf, wp, b, yp, toff, oh0, ow, R, SS_CONV_DW_VECS, 8, KH, KW, OW, sh, dh, Wq, act);
    for (; ow < OW; ow += 8)
        ss_conv_dw_tile(buf, wp, b, yp, toff, oh0, ow, R, 1, OW - ow < 8 ? OW - ow : 8, KH, KW, OW, sh, dh, Wq,
                        act);
}

/* The whole plane in blocks of SS_CONV_DW_ROWS rows; a last partial block is recomputed
   overlapping the one before (the same values rewritten) rather than run with fewer
   chains; planes with fewer rows go one row at a time. */
static inline __attribute__((always_inline)) void ss_conv_dw_plane_k(
        const float* buf, const float* wp, float b, float* yp, const int64_t* toff,
        int64_t KH, int64_t KW, int64_t OH, int64_t OW, int64_t sh, int64_t dh, int64_t Wq, int act) {
    if (OH < SS_CONV_DW_ROWS) {
        for (int64_t oh = 0; oh < OH; ++oh) ss_conv_dw_rows(buf, wp, b, yp, toff, oh, 1, KH, KW, OW, sh, dh, Wq, act);
        return;
    }
    for (int64_t oh = 0; oh < OH; oh += SS_CONV_DW_ROWS) {
        int64_t oh0 = oh + SS_CONV_DW_ROWS <= OH ? oh : OH - SS_CONV_DW_ROWS;
        ss_conv_dw_rows(buf, wp, b, yp, toff, oh0, SS_CONV_DW_ROWS, KH, KW, OW, sh, dh, Wq, act);
    }
}
#endif

/* One output plane yp [OH, OW] from its staged input plane and KH x KW filter wp. */
static void ss_conv_dw_plane(const float* buf, const float* wp, float b, float* yp, const int64_t* toff,
                             int64_t KH, int64_t KW, int64_t OH, int64_t OW, int64_t sh, int64_t dh, int64_t Wq,
                             int act) {
#ifdef __AVX2__
    /* Literal 3x3 and 5x5 (inlined): the tap loops unroll completely. */
    if (KH == 3 && KW == 3) ss_conv_dw_plane_k(buf, wp, b, yp, toff, 3, 3, OH, OW, sh, dh, Wq, act);
    else if (KH == 5 && KW == 5) ss_conv_dw_plane_k(buf, wp, b, yp, toff, 5, 5, OH, OW, sh, dh, Wq, act);
    else ss_conv_dw_plane_k(buf, wp, b, yp, toff, KH, KW, OH, OW, sh, dh, Wq, act);
#else
    for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
            float acc = b;
            for (int64_t kh = 0; kh < KH; ++kh) {
                const float* row = buf + (oh * sh + kh * dh) * Wq + ow;
                for (int64_t kw = 0; kw < KW; ++kw) acc = ss_fmaf(wp[kh * KW + kw], row[toff[kw]], acc);
            }
            yp[oh * OW + ow] = ss_actf(acc, act);
        }
#endif
}

/* group == C: output channel m reads input channel m / (M / C) only. Parallel over output
   planes; each thread stages its planes in its own buffer, malloc'd once per call. */
static void ss_conv_depthwise(const float* x, const float* w, const float* bias, float* y,
                              int64_t N, int64_t C, int64_t H, int64_t W, int64_t M,
                              int64_t KH, int64_t KW, int64_t OH, int64_t OW, int64_t sh, int64_t sw,
                              int64_t ph, int64_t pw, int64_t dh, int64_t dw, int act) {
    int64_t mult = M / C, P = OH * OW;
    /* Staged rows: every input row a tap of some output row reads, padding included.
       Columns per phase row: OW rounded up to whole vectors, plus the furthest tap, rounded
       up to whole vectors (so staging runs in whole vectors). */
    int64_t Hs = (OH - 1) * sh + (KH - 1) * dh + 1;
    int64_t Wq = ((OW + 7) / 8 * 8 + ((KW - 1) * dw) / sw + 1 + 7) / 8 * 8;
    int64_t* toff = (int64_t*)malloc((size_t)KW * sizeof(int64_t));
    if (!toff) return;
    for (int64_t kw = 0; kw < KW; ++kw) toff[kw] = ((kw * dw) % sw) * Hs * Wq + (kw * dw) / sw;
    #pragma omp parallel if(N * M * P * KH * KW >= SS_CONV_PAR_MIN)
    {
        /* The staged plane, then one padded input row (stride > 1 only). */
        float* buf = (float*)malloc((size_t)(sw * Hs * Wq + sw * Wq) * sizeof(float));
        int64_t staged = -1;  /* the input plane now in buf (a channel multiplier reuses it) */
        #pragma omp for schedule(static)
        for (int64_t nm = 0; nm < N * M; ++nm) {
            int64_t n = nm / M, m = nm % M, plane = n * C + m / mult;
            if (!buf) continue;
            if (plane != staged) {
                ss_conv_dw_stage(x + plane * H * W, buf, buf + sw * Hs * Wq, H, W, sw, ph, pw, Hs, Wq);
                staged = plane;
            }
            ss_conv_dw_plane(buf, w + m * KH * KW, bias ? bias[m] : 0.0f, y + nm * P, toff,
                             KH, KW, OH, OW, sh, dh, Wq, act);
        }
        free(buf);
    }
    free(toff);
}

"""

_DIRECT = r"""
#ifdef __AVX2__
#define SS_CONV_DIRECT 1
/* The direct kernel's register tile: SS_CONV_MR output channels x 16 output pixels. */
#define SS_CONV_MR 6

/* Stages one input plane xc [H, W] for the direct kernel: buf [sh][sw][Hq][Wq] with
   buf[((rp * sw + cp) * Hq + i) * Wq + j] = x[i * sh + rp - ph][j * sw + cp - pw] (0 outside
   the image). Output pixel (oh, ow)'s tap (kh, kw) then sits at offset (oh * Wq + ow) from
   the tap's own base (row phase kh * dh % sh, row kh * dh / sh, column phase kw * dw % sw,
   column kw * dw / sw), whatever the strides: a run of pixels is a run of memory, across
   output rows too (Wq - OW columns per row are computed and thrown away). */
static void ss_conv_direct_stage(const float* xc, float* buf, int64_t H, int64_t W, int64_t sh, int64_t sw,
                                 int64_t ph, int64_t pw, int64_t Hq, int64_t Wq) {
    for (int64_t rp = 0; rp < sh; ++rp)
        for (int64_t i = 0; i < Hq; ++i) {
            int64_t ih = i * sh + rp - ph;
            float* d = buf + (rp * sw * Hq + i) * Wq;  /* column phase cp's row: d + cp * Hq * Wq */
            if (ih < 0 || ih >= H) {
                for (int64_t cp = 0; cp < sw; ++cp) memset(d + cp * Hq * Wq, 0, (size_t)Wq * sizeof(float));
                continue;
            }
            const float* r = xc + ih * W - pw;  /* staged column j of phase cp reads r[j * sw + cp] */
            if (sw == 2) {
                /* Both phases of 8 columns from 16 consecutive floats by a deinterleave; masked
                   loads read only the row's own floats and zero the padding lanes. */
                float* d1 = d + Hq * Wq;
                for (int64_t j = 0; j < Wq; j += 8) {
                    /* Float 2j + t of r is inside the row for pw <= 2j + t < W + pw. */
                    int64_t lo = pw - 2 * j, hi = W + pw - 2 * j;
                    __m256 ev, od;
                    ss_conv_deinterleave(_mm256_maskload_ps(r + 2 * j, ss_conv_lanes(lo, hi)),
                                         _mm256_maskload_ps(r + 2 * j + 8, ss_conv_lanes(lo - 8, hi - 8)), &ev, &od);
                    if (j + 8 <= Wq) {
                        _mm256_storeu_ps(d + j, ev);
                        _mm256_storeu_ps(d1 + j, od);
                    } else {  /* the row's last columns: nothing past them is written */
                        __m256i keep = ss_conv_lane_mask(Wq - j);
                        _mm256_maskstore_ps(d + j, keep, ev);
                        _mm256_maskstore_ps(d1 + j, keep, od);
                    }
                }
                continue;
            }
            for (int64_t cp = 0; cp < sw; ++cp) {
                float* dc = d + cp * Hq * Wq;
                int64_t lo, hi;
                ss_conv_valid(W, Wq, sw, pw, cp, &lo, &hi);
                if (sw == 1) {
                    for (int64_t j = 0; j < lo; ++j) dc[j] = 0.0f;
                    memcpy(dc + lo, r + lo, (size_t)(hi - lo) * sizeof(float));
                    for (int64_t j = hi; j < Wq; ++j) dc[j] = 0.0f;
                } else {
                    for (int64_t j = 0; j < Wq; ++j) dc[j] = j >= lo && j < hi ? r[j * sw + cp] : 0.0f;
                }
            }
        }
}

/* The weights of up to SS_CONV_MR output channels, w [rows, K] (K = Cg * KH * KW), as K
   rows of SS_CONV_MR floats, channels past `rows` zero. */
static void ss_conv_direct_pack(const float* w, float* wp, int64_t rows, int64_t K) {
    for (int64_t k = 0; k < K; ++k)
        for (int64_t i = 0; i < SS_CONV_MR; ++i) wp[k * SS_CONV_MR + i] = i < rows ? w[i * K + k] : 0.0f;
}

/* Where a tile's lanes [lo, hi) go: y + off + lane (one output row's run of pixels). */
typedef struct {
    int64_t off;
    __m256i m0, m1;
    int full;
} ss_conv_seg;

/* The runs of a tile of 16 virtual pixels from q0 (pixel q is output (q / Wq, q % Wq),
   real when q % Wq < OW and q < Q); returns how many. */
static int ss_conv_direct_segs(int64_t q0, int64_t Q, int64_t Wq, int64_t OW, ss_conv_seg* seg) {
    int n = 0;
    int64_t q = q0, end = q0 + 16 < Q ? q0 + 16 : Q;
    while (q < end) {
        int64_t oh = q / Wq, ow = q % Wq;
        if (ow >= OW) {
            q = (oh + 1) * Wq;
            continue;
        }
        int64_t run = OW - ow < end - q ? OW - ow : end - q;
        int64_t lo = q - q0, hi = lo + run;
        seg[n].off = oh * OW + ow - (q - q0);
        seg[n].m0 = ss_conv_lanes(lo, hi);
        seg[n].m1 = ss_conv_lanes(lo - 8, hi - 8);
        seg[n].full = lo == 0 && hi == 16;
        ++n;
        q += run;
    }
    return n;
}

/* Stores one channel's 16 pixels through the tile's runs, activated. */
static inline __attribute__((always_inline)) void ss_conv_direct_store(
        float* yo, __m256 v0, __m256 v1, const ss_conv_seg* seg, int nseg, int act) {
    __m256 o0 = ss_act8(v0, act), o1 = ss_act8(v1, act);
    for (int s = 0; s < nseg; ++s) {
        if (seg[s].full) {
            _mm256_storeu_ps(yo + seg[s].off, o0);
            _mm256_storeu_ps(yo + seg[s].off + 8, o1);
        } else {
            _mm256_maskstore_ps(yo + seg[s].off, seg[s].m0, o0);
            _mm256_maskstore_ps(yo + seg[s].off + 8, seg[s].m1, o1);
        }
    }
}

/* One tile: SS_CONV_MR channels (the first mr stored) x 16 virtual pixels, over taps
   [k0, k1) of the C * KH * KW. src: the staged input at the tile's first pixel, tap k at
   src + koff[k]; wb: the channel block's packed weights. The accumulators start from the
   bias when k0 == 0, else from `part` (the sums of the taps before); when k1 == K the
   result is activated and stored into y through the tile's runs, else its sums go back to
   `part`. 12 accumulators, as the GEMM's 6 x 16 tile: each input vector feeds SS_CONV_MR
   FMAs, each weight broadcast two; named, and the tap loop kept as simple as the GEMM's k
   loop, so that they all stay in registers. */
static inline __attribute__((always_inline)) void ss_conv_direct_tile(
        const float* src, const float* wb, const float* bias, float* part, float* yb, int64_t P, int64_t mr,
        int64_t k0, int64_t k1, int64_t K, const int32_t* koff, const ss_conv_seg* seg, int nseg, int act) {
    __m256 a, b0, b1, c0_0, c0_1, c1_0, c1_1, c2_0, c2_1, c3_0, c3_1, c4_0, c4_1, c5_0, c5_1;
    if (k0 == 0) {
        c0_0 = c0_1 = _mm256_set1_ps(bias && 0 < mr ? bias[0] : 0.0f);
        c1_0 = c1_1 = _mm256_set1_ps(bias && 1 < mr ? bias[1] : 0.0f);
        c2_0 = c2_1 = _mm256_set1_ps(bias && 2 < mr ? bias[2] : 0.0f);
        c3_0 = c3_1 = _mm256_set1_ps(bias && 3 < mr ? bias[3] : 0.0f);
        c4_0 = c4_1 = _mm256_set1_ps(bias && 4 < mr ? bias[4] : 0.0f);
        c5_0 = c5_1 = _mm256_set1_ps(bias && 5 < mr ? bias[5] : 0.0f);
    } else {
        c0_0 = _mm256_loadu_ps(part + 0); c0_1 = _mm256_loadu_ps(part + 8);
        c1_0 = _mm256_loadu_ps(part + 16); c1_1 = _mm256_loadu_ps(part + 24);
        c2_0 = _mm256_loadu_ps(part + 32); c2_1 = _mm256_loadu_ps(part + 40);
        c3_0 = _mm256_loadu_ps(part + 48); c3_1 = _mm256_loadu_ps(part + 56);
        c4_0 = _mm256_loadu_ps(part + 64); c4_1 = _mm256_loadu_ps(part + 72);
        c5_0 = _mm256_loadu_ps(part + 80); c5_1 = _mm256_loadu_ps(part + 88);
    }
    const float* wk = wb + k0 * SS_CONV_MR;
    #pragma GCC unroll 4
    for (int64_t k = k0; k < k1; ++k) {
        const float* s = src + koff[k];
        b0 = _mm256_loadu_ps(s);
        b1 = _mm256_loadu_ps(s + 8);
        a = _mm256_broadcast_ss(wk + 0); c0_0 = ss_fmadd8(a, b0, c0_0); c0_1 = ss_fmadd8(a, b1, c0_1);
        a = _mm256_broadcast_ss(wk + 1); c1_0 = ss_fmadd8(a, b0, c1_0); c1_1 = ss_fmadd8(a, b1, c1_1);
        a = _mm256_broadcast_ss(wk + 2); c2_0 = ss_fmadd8(a, b0, c2_0); c2_1 = ss_fmadd8(a, b1, c2_1);
        a = _mm256_broadcast_ss(wk + 3); c3_0 = ss_fmadd8(a, b0, c3_0); c3_1 = ss_fmadd8(a, b1, c3_1);
        a = _mm256_broadcast_ss(wk + 4); c4_0 = ss_fmadd8(a, b0, c4_0); c4_1 = ss_fmadd8(a, b1, c4_1);
        a = _mm256_broadcast_ss(wk + 5); c5_0 = ss_fmadd8(a, b0, c5_0); c5_1 = ss_fmadd8(a, b1, c5_1);
        wk += SS_CONV_MR;
    }
    if (k1 < K) {
        _mm256_storeu_ps(part + 0, c0_0); _mm256_storeu_ps(part + 8, c0_1);
        _mm256_storeu_ps(part + 16, c1_0); _mm256_storeu_ps(part + 24, c1_1);
        _mm256_storeu_ps(part + 32, c2_0); _mm256_storeu_ps(part + 40, c2_1);
        _mm256_storeu_ps(part + 48, c3_0); _mm256_storeu_ps(part + 56, c3_1);
        _mm256_storeu_ps(part + 64, c4_0); _mm256_storeu_ps(part + 72, c4_1);
        _mm256_storeu_ps(part + 80, c5_0); _mm256_storeu_ps(part + 88, c5_1);
        return;
    }
    if (mr > 0) ss_conv_direct_store(yb + 0 * P, c0_0, c0_1, seg, nseg, act);
    if (mr > 1) ss_conv_direct_store(yb + 1 * P, c1_0, c1_1, seg, nseg, act);
    if (mr > 2) ss_conv_direct_store(yb + 2 * P, c2_0, c2_1, seg, nseg, act);
    if (mr > 3) ss_conv_direct_store(yb + 3 * P, c3_0, c3_1, seg, nseg, act);
    if (mr > 4) ss_conv_direct_store(yb + 4 * P, c4_0, c4_1, seg, nseg, act);
    if (mr > 5) ss_conv_direct_store(yb + 5 * P, c5_0, c5_1, seg, nseg, act);
}

/* Tile t x channel blocks [b0, b1) of one (image, group). The tile takes the taps kc at a
   time (their input rows and one block's weights fit in L1 together), and within a slice
   of taps runs every block, so the slice's input is read from L1 by all of them; the
   blocks' partial sums wait in `part` (SS_CONV_MR x 16 floats per block). */
static void ss_conv_direct_tiles(
        const float* stage, const float* wp, const float* bias, float* yg, float* part, int64_t t,
        int64_t b0, int64_t b1, int64_t Mg, int64_t K, int64_t kc, int64_t Q, int64_t Wq,
        int64_t OW, int64_t P, const int32_t* koff, int act) {
    ss_conv_seg seg[18];
    int64_t q0 = t * 16;
    int nseg = ss_conv_direct_segs(q0, Q, Wq, OW, seg);
    for (int64_t k0 = 0; nseg > 0 && k0 < K; k0 += kc) {
        int64_t k1 = k0 + kc < K ? k0 + kc : K;
        for (int64_t b = b0; b < b1; ++b) {
            int64_t m0 = b * SS_CONV_MR, mr = Mg - m0 < SS_CONV_MR ? Mg - m0 : SS_CONV_MR;
            ss_conv_direct_tile(stage + q0, wp + m0 * K, bias ? bias + m0 : NULL, part + (b - b0) * SS_CONV_MR * 16,
                                yg + m0 * P, P, mr, k0, k1, K, koff, seg, nseg, act);
        }
    }
}

/* A dense (or grouped) conv computed straight from its input, with no im2col matrix: each
   group's input planes are staged once, zero-padded and split into stride phases
   (ss_conv_direct_stage), so that the pixels of any tap are a run of memory; the weights
   are packed into SS_CONV_MR-channel blocks; each tile of 16 pixels then accumulates
   SS_CONV_MR channels at once over all C * KH * KW taps, and stores the bias-added,
   activated result. Channel blocks are taken SS_CONV_DIRECT_BLOCK_FLOATS of packed weights
   at a time (they stay in L2 while every tile reads them); tiles run in parallel. Returns
   0, having written nothing, when out of memory. */
static int ss_conv_direct(const float* x, const float* w, const float* bias, float* y,
                          int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW,
                          int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                          int64_t dh, int64_t dw, int64_t group, int act, float* work, int64_t work_floats) {
    int64_t Cg = C / group, Mg = M / group, T = KH * KW, K = Cg * T, P = OH * OW;
    int64_t Hq = OH + ((KH - 1) * dh) / sh, Wq = OW + ((KW - 1) * dw) / sw, Q = OH * Wq;
    int64_t tiles = (Q + 15) / 16, nb = (Mg + SS_CONV_MR - 1) / SS_CONV_MR;
    /* Tap (kh, kw)'s offset in a channel's staged planes (see ss_conv_direct_stage). */
    #define SS_CONV_TAP(kh, kw) ((((kh) * dh % sh) * sw + (kw) * dw % sw) * Hq * Wq \
                                 + ((kh) * dh / sh) * Wq + (kw) * dw / sw)
    int64_t reach = 0;  /* past the furthest float a tile loads: the last tile's lanes run past Q */
    for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw)
            if (SS_CONV_TAP(kh, kw) + tiles * 16 > reach) reach = SS_CONV_TAP(kh, kw) + tiles * 16;
    /* Each channel's staged planes, then zeros up to the furthest load. */
    int64_t planes = sh * sw * Hq * Wq, cstride = reach > planes ? reach : planes;
    if ((Cg - 1) * cstride + reach >= INT32_MAX) return 0;  /* the tap offsets are 32-bit */
    int64_t bstep = SS_CONV_DIRECT_BLOCK_FLOATS / (SS_CONV_MR * K);
    if (bstep < 1) bstep = 1;
    if (bstep > nb) bstep = nb;
    /* Taps per slice: whole channels (a slice's input rows are then whole). */
    int64_t kc = SS_CONV_DIRECT_TAPS / T * T;
    if (kc < T) kc = T;
    int threads = omp_get_max_threads();
    /* Scratch, in floats: the tap offsets (int32), the staged input, the packed weights,
       each thread's partial sums. `work` when it is large enough (the caller's arena),
       else one malloc. */
    int64_t floats = K + Cg * cstride + group * nb * SS_CONV_MR * K + (int64_t)threads * bstep * SS_CONV_MR * 16;
    float* own = NULL;
    work = ss_conv_scratch(work, work_floats, floats, &own);
    if (!work) return 0;
    int32_t* koff = (int32_t*)work;
    float* stage = work + K;
    float* wp = stage + Cg * cstride;
    float* parts = wp + group * nb * SS_CONV_MR * K;
    for (int64_t c = 0; c < Cg; ++c)
        for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw)
                koff[(c * KH + kh) * KW + kw] = (int32_t)(c * cstride + SS_CONV_TAP(kh, kw));
    #undef SS_CONV_TAP
    int par = Mg * P * K >= SS_CONV_PAR_MIN;
    /* Every group's weights packed once for all the images (the batch of a 3x3x128x128
       yolov8n call packed them three times). */
    #pragma omp parallel for schedule(static) if(par)
    for (int64_t gb = 0; gb < group * nb; ++gb) {
        int64_t g = gb / nb, b = gb % nb;
        int64_t rows = Mg - b * SS_CONV_MR < SS_CONV_MR ? Mg - b * SS_CONV_MR : SS_CONV_MR;
        ss_conv_direct_pack(w + g * Mg * K + b * SS_CONV_MR * K, wp + gb * SS_CONV_MR * K, rows, K);
    }
    for (int64_t n = 0; n < N; ++n)
        for (int64_t g = 0; g < group; ++g) {
            const float* xg = x + (n * C + g * Cg) * H * W;
            const float* wg = wp + g * nb * SS_CONV_MR * K;
            const float* bg = bias ? bias + g * Mg : NULL;
            float* yg = y + (n * M + g * Mg) * P;
            #pragma omp parallel if(par)
            {
                float* part = parts + (int64_t)omp_get_thread_num() * bstep * SS_CONV_MR * 16;
                #pragma omp for schedule(static) nowait
                for (int64_t c = 0; c < Cg; ++c) {
                    float* cb = stage + c * cstride;
                    ss_conv_direct_stage(xg + c * H * W, cb, H, W, sh, sw, ph, pw, Hq, Wq);
                    for (int64_t j = planes; j < cstride; ++j) cb[j] = 0.0f;
                }
                #pragma omp barrier
                for (int64_t b0 = 0; b0 < nb; b0 += bstep) {
                    int64_t b1 = b0 + bstep < nb ? b0 + bstep : nb;
                    #pragma omp for schedule(static)
                    for (int64_t t = 0; t < tiles; ++t)
                        ss_conv_direct_tiles(stage, wg, bg, yg, part, t, b0, b1, Mg, K, kc, Q, Wq, OW, P, koff, act);
                }
            }
        }
    free(own);
    return 1;
}
#endif

"""

_CONV2D_WORK_SIZE = Function("int64_t", "ss_conv2d_work_size", ("int64_t C", "int64_t KH", "int64_t KW", "int64_t OH",
                                                                "int64_t OW", "int64_t group"), r"""
    if (group < 1) return 0;
    return (C / group) * KH * KW * OH * OW;""")

_SMALL_PLANE = r"""
#ifdef SS_CONV_PACKED
/* im2col of a small output plane (ss_conv_im2col's layout, col[(c * KH * KW + t) * P + p])
   through a table of input offsets, off[t * P + p] (-1: padding), made once for all channels
   and images. ss_conv_im2col spends its time per row of taps (index divisions, a libc call
   per run of a few floats): on a 2x3 plane, 2304 rows of 6 floats took 48 us of a 78 us conv. */
static void ss_conv_small_offsets(int64_t* off, int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t OH, int64_t OW,
                                  int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw) {
    for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw)
            for (int64_t oh = 0; oh < OH; ++oh)
                for (int64_t ow = 0; ow < OW; ++ow) {
                    int64_t ih = oh * sh - ph + kh * dh, iw = ow * sw - pw + kw * dw;
                    off[((kh * KW + kw) * OH + oh) * OW + ow] =
                        ih >= 0 && ih < H && iw >= 0 && iw < W ? ih * W + iw : -1;
                }
}

/* One input plane's T rows of col (its taps x pixels). */
static void ss_conv_small_im2col(const float* src, float* dst, const int64_t* off, int64_t T) {
    for (int64_t i = 0; i < T; ++i) dst[i] = off[i] >= 0 ? src[off[i]] : 0.0f;
}

/* The element of the output at o from its conv value v: res_act(v + res[o]), or v without a residual. */
static inline float ss_conv_resf(float v, const float* res, int64_t o, int res_act) {
    return res ? ss_actf(v + res[o], res_act) : v;
}

/* out[m * P + p] = yt[p * M + m] for the pixels p in [p_lo, p_hi) (p_lo a multiple of 8): the
   GEMM's y^T back to planes, 8 x 8 blocks where they fit; res (NULL: none), laid out as out,
   added to each block as it is stored, then res_act. */
static void ss_conv_small_untranspose(const float* yt, float* out, int64_t P, int64_t M, const float* res,
                                      int res_act, int64_t p_lo, int64_t p_hi) {
    int64_t p0 = p_lo;
#ifdef __AVX2__
    for (; p0 + 8 <= p_hi; p0 += 8) {
        int64_t m0 = 0;
        for (; m0 + 8 <= M; m0 += 8) {
            if (!res) {
                ss_gemm_transpose8(yt + p0 * M + m0, M, 8, out + m0 * P + p0, P);
                continue;
            }
            float r[64];
            ss_gemm_transpose8(yt + p0 * M + m0, M, 8, r, 8);  /* r[j * 8 + i]: channel m0 + j, pixel p0 + i */
            for (int64_t j = 0; j < 8; ++j) {
                int64_t o = (m0 + j) * P + p0;
                _mm256_storeu_ps(out + o, ss_act8(_mm256_add_ps(_mm256_loadu_ps(r + j * 8), _mm256_loadu_ps(res + o)),
                                                  res_act));
            }
        }
        for (; m0 < M; ++m0)
            for (int64_t p = p0; p < p0 + 8; ++p)
                out[m0 * P + p] = ss_conv_resf(yt[p * M + m0], res, m0 * P + p, res_act);
    }
#endif
    for (; p0 < p_hi; ++p0)
        for (int64_t m = 0; m < M; ++m) out[m * P + p0] = ss_conv_resf(yt[p0 * M + m], res, m * P + p0, res_act);
}

/* Group-1 conv of a small output plane as y^T = col^T x w^T, w^T prepacked (see the
   docstring); the residual res (NULL: none) joins in the transpose back to planes. */
static void ss_conv_small_plane(const float* x, const float* wpacked, const float* bias, float* y,
                                int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW,
                                int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                                int64_t dh, int64_t dw, int act, const float* res, int res_act) {
    const int64_t P = OH * OW, Kc = C * KH * KW, T = KH * KW * P;
    const int direct = KH == 1 && KW == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && OH == H && OW == W;
    /* Every image's y^T, then (unless x is read in place) every image's im2col matrix and the
       offset table. All images go through one batched GEMM call: a plane of a few pixels is
       a product of a few MFLOP per image, below the GEMM's threshold for a second thread,
       which a batch of them passes (yolov8n's P5 convs at batch 2 ran no faster on two). */
    /* The floats before the offset table rounded up to an even count: an int64_t there must
       be 8-byte aligned (UBSan: a misaligned store, where N * P * M + N * Kc * P was odd). */
    const int64_t floats = (N * P * M + (direct ? 0 : N * Kc * P) + 1) / 2 * 2;
    float* yt = (float*)malloc((size_t)floats * sizeof(float) + (direct ? 0 : (size_t)T * sizeof(int64_t)));
    if (!yt) return;
    float* col = yt + N * P * M;
    int64_t* off = (int64_t*)(yt + floats);
    const float* a = x;
    int64_t sa = C * H * W;
    if (!direct) {
        ss_conv_small_offsets(off, H, W, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw);
        /* Split over (image, input channel) pairs, not images: at batch 1 the copy ran on one
           thread while the other waited for the GEMM. A 256 -> 256 3 x 3 conv on a 2 x 3
           plane (yolov8n's last stages at 64x96), 2 threads, AMD Zen 2: 79 -> 62 us a run
           (1 thread: 93). A copied element costs about a ns, so SS_CONV_PAR_MIN / 8 of them
           are several parallel regions' worth (about 1 us each with the worker spinning). */
        #pragma omp parallel for schedule(static) if(N * C > 1 && N * Kc * P >= SS_CONV_PAR_MIN / 8)
        for (int64_t nc = 0; nc < N * C; ++nc)
            ss_conv_small_im2col(x + nc * H * W, col + (nc / C) * Kc * P + (nc % C) * T, off, T);
        a = col;
        sa = Kc * P;
    }
    /* A(p, k) = a[k * P + p]: the im2col matrix read transposed. */
    ss_gemm_prepacked(P, M, Kc, N, 1, a, sa, 0, 1, P, wpacked, yt, P * M, 0, M,
                      1.0f, bias, 1.0f, 0, 1, act == 1 ? 1 : 0);
    /* The activation on y^T, where its runs are contiguous, then back to planes: by images,
       and by ranges of pixels where there are fewer images than threads (at batch 1 it ran on
       one thread: ResNet-50's 256 -> 1024 convs on 14 x 14 scaled 1.53x at 2 threads where
       onnxruntime's did 1.70x, AMD Zen 2). */
    const int64_t threads = omp_get_max_threads(), pieces = N >= threads ? 1 : (threads + N - 1) / N;
    const int64_t span = ((P + pieces - 1) / pieces + 7) / 8 * 8, spans = (P + span - 1) / span;
    #pragma omp parallel for collapse(2) if(N * spans > 1 && N * M * P >= SS_CONV_PAR_MIN / 8)
    for (int64_t n = 0; n < N; ++n)
        for (int64_t q = 0; q < spans; ++q) {
            const int64_t p_lo = q * span, p_hi = p_lo + span < P ? p_lo + span : P;
            if (act >= 2) ss_conv_act_run(yt + (n * P + p_lo) * M, (p_hi - p_lo) * M, act);
            ss_conv_small_untranspose(yt + n * P * M, y + n * M * P, P, M, res ? res + n * M * P : NULL, res_act,
                                      p_lo, p_hi);
        }
    free(yt);
}
#endif

"""

_CONV2D_PARAMS = ("const float* x", "const float* w", "const float* bias", "float* y", "int64_t N", "int64_t C",
                  "int64_t H", "int64_t W", "int64_t M", "int64_t KH", "int64_t KW", "int64_t OH", "int64_t OW",
                  "int64_t sh", "int64_t sw", "int64_t ph", "int64_t pw", "int64_t dh", "int64_t dw", "int64_t group",
                  "int act", "float* work", "const float* wpacked")

_CONV2D_RESIDUAL = Function("void", "ss_conv2d_residual", (*_CONV2D_PARAMS, "const float* res", "int res_act"), r"""
    if (N <= 0 || M <= 0 || OH <= 0 || OW <= 0 || group < 1) return;
    int64_t Cg = C / group, Mg = M / group, P = OH * OW, Kc = Cg * KH * KW;
    /* Dense k x k convs of small planes with prepacked weights: the GEMM's own tile over the
       image (conv_panels.py). Not 1 x 1 ones: their taps are channels a plane apart, all of
       K in registers reads each panel's weights from L2 for every tile, and the small-plane
       GEMM below (kc blocks, A packed) ran them 1.1-1.5x faster (conv_panels.py). */
    if (wpacked && group == 1 && KH * KW > 1 && P <= SS_CONV_PANELS_MAX_PLANE &&
        ss_conv_panels(x, wpacked, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, act,
                       work, ss_conv2d_work_size(C, KH, KW, OH, OW, group), res, res_act))
        return;
#ifdef SS_CONV_IGEMM
    /* Dense k x k convs: the implicit GEMM (conv_igemm.py), but on planes of a few pixels,
       where the small-plane path's one GEMM does as well from the prepacked weights. */
    if (SS_CONV_USE_IGEMM && group == 1 && KH * KW > 1 && !(wpacked && P <= SS_CONV_IGEMM_MIN_PLANE) &&
        ss_conv_igemm(x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, act,
                      work, ss_conv2d_work_size(C, KH, KW, OH, OW, group), wpacked, res, res_act))
        return;
#endif
#ifdef SS_CONV_PACKED
    /* Before the depthwise path: a one-channel conv (an STFT as a Conv) is group == C too. */
    if (wpacked && group == 1 && (P <= SS_CONV_SMALL_PLANE || (P <= SS_CONV_SMALL_PLANE_MAX && P <= M))) {
        ss_conv_small_plane(x, wpacked, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, act,
                            res, res_act);
        return;
    }
#else
    (void)wpacked;
#endif
    if (group == C && Cg == 1) {
        ss_conv_depthwise(x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, act);
        /* The residual in a pass of its own: nets with depthwise convs run them blocked
           (codegen/lower/layout_assign.py), whose kernel takes the residual itself. */
        ss_conv_finish(y, res, N * M * P, 0, res_act);
        return;
    }
    if (KH == 1 && KW == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && OH == H && OW == W) {
        const ss_conv_epi e = ss_conv_gemm_epi(act, res, res_act);
        for (int64_t g = 0; g < group; ++g) {
#ifdef SS_GEMM_NR
            ss_gemm_add(Mg, P, Cg, N, 1,
                        w + g * Mg * Cg, 0, 0, Cg, 1,
                        x + g * Cg * P, C * P, 0, P, 1,
                        y + g * Mg * P, M * P, 0, P,
                        1.0f, bias ? bias + g * Mg : NULL, 1.0f, 1, 0, e.gemm_act, e.d ? e.d + g * Mg * P : NULL);
#else
            ss_gemm(Mg, P, Cg, N, 1,
                    w + g * Mg * Cg, 0, 0, Cg, 1,
                    x + g * Cg * P, C * P, 0, P, 1,
                    y + g * Mg * P, M * P, 0, P,
                    1.0f, bias ? bias + g * Mg : NULL, 1.0f, 1, 0, e.gemm_act);
#endif
        }
        ss_conv_finish(y, e.r, N * M * P, e.pre, e.post);
        return;
    }
#ifdef SS_CONV_DIRECT
    /* k x k (not 1 x 1: strided or padded, the GEMM on its small im2col does better). */
    if (SS_CONV_USE_DIRECT && KH * KW > 1 &&
        ss_conv_direct(x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, group, act,
                       work, ss_conv2d_work_size(C, KH, KW, OH, OW, group))) {
        ss_conv_finish(y, res, N * M * P, 0, res_act);  /* grouped convs: a pass of its own */
        return;
    }
#endif
    for (int64_t n = 0; n < N; ++n)
        for (int64_t g = 0; g < group; ++g) {
            const float* rg = res ? res + (n * M + g * Mg) * P : NULL;
#ifdef SS_CONV_PACKED
            ss_conv_gemm_tiled(x + (n * C + g * Cg) * H * W, w + g * Mg * Kc, bias ? bias + g * Mg : NULL,
                               y + (n * M + g * Mg) * P, work, Cg, H, W, Mg, KH, KW, OH, OW,
                               sh, sw, ph, pw, dh, dw, act, rg, res_act);
#else
            ss_conv_im2col(x + (n * C + g * Cg) * H * W, work, Cg, H, W, KH, KW, OH, OW,
                           sh, sw, ph, pw, dh, dw);
            ss_gemm(Mg, P, Kc, 1, 1,
                    w + g * Mg * Kc, 0, 0, Kc, 1,
                    work, 0, 0, P, 1,
                    y + (n * M + g * Mg) * P, 0, 0, P,
                    1.0f, bias ? bias + g * Mg : NULL, 1.0f, 1, 0, act == 1);
            /* Right after its GEMM, while this block of y is still in cache. */
            ss_conv_finish(y + (n * M + g * Mg) * P, rg, Mg * P, act >= 2 ? act : 0, res_act);
#endif
        }""")

_CONV2D = Function("void", "ss_conv2d", _CONV2D_PARAMS, """
    ss_conv2d_residual(x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, group, act, work, wpacked,
                       NULL, 0);""")

_COL2IM = r"""
/* Adds col [Mg * KH * KW, H * W] into y [Mg, OH, OW], which it first fills with the bias. */
static void ss_conv_col2im(const float* col, const float* bias, float* y, int64_t Mg,
                           int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t OH, int64_t OW,
                           int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw) {
    int64_t HW = H * W, P = OH * OW;
    #pragma omp parallel for if(Mg * KH * KW * HW >= SS_CONV_PAR_MIN)
    for (int64_t m = 0; m < Mg; ++m) {
        float* plane = y + m * P;
        float b = bias ? bias[m] : 0.0f;
        for (int64_t i = 0; i < P; ++i) plane[i] = b;
        for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw) {
                const float* row = col + ((m * KH + kh) * KW + kw) * HW;
                int64_t lo, hi;
                ss_conv_valid(OW, W, sw, pw, kw * dw, &lo, &hi);
                for (int64_t ih = 0; ih < H; ++ih) {
                    int64_t oh = ih * sh - ph + kh * dh;
                    if (oh < 0 || oh >= OH) continue;
                    const float* s = row + ih * W + lo;
                    float* d = plane + oh * OW + (lo * sw - pw + kw * dw);
                    if (sw == 1) {
                        for (int64_t j = 0; j < hi - lo; ++j) d[j] += s[j];
                    } else {
                        for (int64_t j = 0; j < hi - lo; ++j) d[j * sw] += s[j];
                    }
                }
            }
    }
}

"""

_CONV_TRANSPOSE2D_WORK_SIZE = Function("int64_t", "ss_conv_transpose2d_work_size", ("int64_t C", "int64_t M",
                                                                                    "int64_t KH", "int64_t KW",
                                                                                    "int64_t H", "int64_t W",
                                                                                    "int64_t group"), r"""
    (void)C;
    if (group < 1) return 0;
    return (M / group) * KH * KW * H * W;""")

_CONV_TRANSPOSE2D = Function("void", "ss_conv_transpose2d", ("const float* x", "const float* w", "const float* bias",
                                                             "float* y", "int64_t N", "int64_t C", "int64_t H",
                                                             "int64_t W", "int64_t M", "int64_t KH", "int64_t KW",
                                                             "int64_t OH", "int64_t OW", "int64_t sh", "int64_t sw",
                                                             "int64_t ph", "int64_t pw", "int64_t dh", "int64_t dw",
                                                             "int64_t group", "float* work"), r"""
    if (N <= 0 || M <= 0 || OH <= 0 || OW <= 0 || group < 1) return;
    int64_t Cg = C / group, Mg = M / group, HW = H * W, R = Mg * KH * KW;
    for (int64_t n = 0; n < N; ++n)
        for (int64_t g = 0; g < group; ++g) {
            /* A = w[g]^T: element (r, c) of the [R, Cg] matrix sits at w[g][c][r]. */
            ss_gemm(R, HW, Cg, 1, 1,
                    w + g * Cg * R, 0, 0, 1, R,
                    x + (n * C + g * Cg) * HW, 0, 0, HW, 1,
                    work, 0, 0, HW,
                    1.0f, NULL, 0.0f, 0, 0, 0);
            ss_conv_col2im(work, bias ? bias + g * Mg : NULL, y + (n * M + g * Mg) * OH * OW, Mg,
                           H, W, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw);
        }""")


def fragment(par_min: int = 32768, act_chunk: int = 4096, dw_rows: int = 4, dw_vecs: int = 2,
             chunk_floats: int = 1 << 17, small_plane: int = SMALL_PLANE, small_plane_max: int = SMALL_PLANE_MAX,
             direct: bool = True, direct_block: int = 1 << 16, direct_taps: int = 256, igemm: bool = True) -> Fragment:
    """The conv fragment.

    ``par_min``: the work (multiply-adds or copies) below which loops stay serial;
    ``act_chunk``: elements per chunk of the parallel activation pass after a GEMM;
    ``dw_rows`` x ``dw_vecs``: the depthwise register tile, output rows x ymm vectors (8
    columns each) accumulated together as independent FMA chains; rows first, since the
    planes of late stages are only one or two vectors wide. At most 12 accumulators, so the
    weight broadcast and the loads still have registers of the 16;
    ``chunk_floats``: the im2col conv's column chunk, in floats of packed im2col matrix
    (128K floats = 512 KB, half of this machine's 1 MB L2, leaving room for the weights);
    ``small_plane``: output planes of at most this many pixels take the prepacked-weights
    path when the caller passes ``wpacked``; ``small_plane_max``: planes of at most this
    many pixels take it too when there are at least as many output channels (small_plane_ok);
    ``direct``: k x k convs run the direct kernel (False: im2col and the GEMM, as 1x1 ones);
    ``direct_block``: floats of packed weights (blocks of 6 channels) the direct kernel's
    tiles take at a time, sized to stay in L2; ``direct_taps``: taps it takes at a time per
    tile, sized so that their input rows and one block's weights stay in L1; ``igemm``: dense
    k x k convs run the implicit GEMM (conv_igemm.py; False: the paths grouped ones take).
    """
    if int(dw_rows) < 1 or int(dw_vecs) < 1 or int(dw_rows) * int(dw_vecs) > 12:
        raise ValueError(f"dw_rows x dw_vecs must be 1..12 accumulators, got {dw_rows} x {dw_vecs}")
    if int(chunk_floats) < 1:
        raise ValueError(f"chunk_floats must be >= 1, got {chunk_floats}")
    if int(act_chunk) < 8:
        raise ValueError(f"act_chunk must be >= 8, got {act_chunk}")
    if int(direct_block) < 1 or int(direct_taps) < 1:
        raise ValueError(f"direct_block and direct_taps must be >= 1, got {direct_block}, {direct_taps}")
    return Fragment([
        Private(fill(_DEFINES, PAR_MIN=int(par_min), ACT_CHUNK=int(act_chunk), DW_VECS=int(dw_vecs),
                     DW_ROWS=int(dw_rows), CHUNK_FLOATS=int(chunk_floats), SMALL_PLANE=int(small_plane),
                     SMALL_PLANE_MAX=int(small_plane_max), DIRECT=int(bool(direct)),
                     DIRECT_BLOCK=int(direct_block), DIRECT_TAPS=int(direct_taps), IGEMM=int(bool(igemm)))),
        Private(_COMMON),
        Private(_IM2COL),
        Private(_IM2COL_PACKED),
        Private(_DEPTHWISE),
        Private(_DIRECT),
        _CONV2D_WORK_SIZE,
        Private(_SMALL_PLANE),
        _CONV2D_RESIDUAL,
        _CONV2D,
        Private(_COL2IM),
        _CONV_TRANSPOSE2D_WORK_SIZE,
        _CONV_TRANSPOSE2D,
    ])


def source(**params) -> str:
    """``fragment(**params)``'s text."""
    return fragment(**params).text()
