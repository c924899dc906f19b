"""Max and average pooling, and max unpooling (ONNX MaxPool, AveragePool, MaxUnpool).

Pools take NC + up to three spatial axes: a 1-D or 2-D pool is a 3-D one whose leading
spatial axes have extent 1 (input, output and kernel 1, stride and dilation 1, no pads).
The geometry is passed as arrays of three int64, outermost axis first:

    in[3] = {D, H, W}        out[3] = {OD, OH, OW}     k[3] = kernel extents
    s[3]  = strides          p[3]   = begin pads       dil[3] = dilations
    p_end[3] = end pads (AveragePool only)

Output (od, oh, ow) of plane nc reads the taps x[nc, od*s0 - p0 + kd*dil0, oh*s1 - p1 +
kh*dil1, ow*s2 - p2 + kw*dil2] for kd < k0, kh < k1, kw < k2; taps outside x (padding,
ceil_mode's overhang) are skipped.

Exported C (SFX and T: f32 float, f64 double, i8 int8_t, u8 uint8_t; average: f32, f64)::

    /* y [NC, OD, OH, OW] = max over each window (taps outside x never win: the start
       value is -inf, or the type's minimum for integers). An x with an empty spatial axis
       gives zeros (Indices too), as the reference evaluator does. */
    void ss_maxpool3d_SFX(const T* x, T* y, int64_t NC, const int64_t* in, const int64_t* out,
                          const int64_t* k, const int64_t* s, const int64_t* p, const int64_t* dil);

    /* The same and MaxPool's Indices: the flat index into x of each window's first
       maximum in window order (kd, kh, kw), nc * D*H*W plus the spatial offset raveled row
       major (storage_order 0) or column major (1). A window whose taps all miss x keeps
       its first tap's coordinates clipped into x, as the reference evaluator does. */
    void ss_maxpool3d_argmax_SFX(const T* x, T* y, int64_t* indices, int64_t NC, const int64_t* in,
                                 const int64_t* out, const int64_t* k, const int64_t* s,
                                 const int64_t* p, const int64_t* dil, int storage_order);

    /* y = the sum over each window divided by its tap count: taps in the padded input
       [-p, L + p_end) along every axis with count_include_pad, else taps in x; a count of 0
       gives 0 (as onnxruntime). The ceil_mode overhang past the end padding never counts. */
    void ss_avgpool3d_SFX(const T* x, T* y, int64_t NC, const int64_t* in, const int64_t* out,
                          const int64_t* k, const int64_t* s, const int64_t* p, const int64_t* p_end,
                          const int64_t* dil, int count_include_pad);

    /* auto_pad SAME_UPPER (upper = 1) or SAME_LOWER (0): the begin and end pads of each
       axis, total = max(0, (O - 1) * s + (k - 1) * dil + 1 - L), begin = total / 2 (UPPER)
       or total - total / 2 (LOWER). */
    void ss_pool_same_pads(const int64_t* in, const int64_t* out, const int64_t* k, const int64_t* s,
                           const int64_t* dil, int upper, int64_t* p, int64_t* p_end);

    /* MaxUnpool: y (total elements of elem_size bytes) = 0, then y[indices[i]] = x[i] for
       i < n, later i winning a repeated index. Returns 1 (writing nothing after the
       zeroing) if an index is outside [0, total). */
    int ss_maxunpool(int64_t elem_size, const void* x, const int64_t* indices, int64_t n,
                     void* y, int64_t total);

    /* The 2-D float32 forms kept for existing callers (1-D: H = 1, KH = 1). */
    void ss_maxpool2d(const float* x, float* y, int64_t NC, int64_t H, int64_t W,
                      int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t sh, int64_t sw,
                      int64_t ph, int64_t pw, int64_t dh, int64_t dw);
    void ss_avgpool2d(const float* x, float* y, int64_t NC, int64_t H, int64_t W,
                      int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t sh, int64_t sw,
                      int64_t ph, int64_t pw, int64_t ph_end, int64_t pw_end, int count_include_pad);

The divisor with count_include_pad = 1 is what onnxruntime 1.32 computes (checked in
tests/codegen/test_kernels_pool.py): a window is cut at L + p_end, never at the begin
side, whose first tap is at least -p anyway. Sums run in T, in window order, as the
reference evaluator's do.

Every pool works one output row (nc, od, oh) at a time, parallel over the NC * OD * OH
rows; the window's planes and rows outside x are skipped up front, and each remaining
(kd, kh, kw) tap is one pass over the output columns it reaches, which the compiler
vectorizes for stride 1.

Except a 2-D (or 1-D) max pool of stride 1, YOLO's SPPF (5 x 5, pads 2) among them: on its
small planes each of those passes covers a few columns, and their set-up was most of the
time (a [1, 128, 20, 20] pool took 10x onnxruntime's, a [3, 128, 4, 4] one 5x). It runs
separably over planes copied into a scratch with a border of the lowest value: a chunk of
planes laid end to end is one flat array, so the max over a window's columns is KW passes
over the whole chunk (each output reads f + kw * dw), then the max over its rows KH passes
(f + kh * dh * Wp); positions whose window would wrap into the next row or plane are
computed and never read. The max of a window is then the same comparisons in another order.

And a strided 2-D max pool (ResNet's 3 x 3 / 2 after its stem) runs by output rows: the
window's input rows are reduced first, column by column over the row padded with the lowest
value (contiguous: vectorized), then the window's columns at every position up to the last
output's, of which each stride-th is kept. Tap by tap, each pass over the output columns read
x at the stride, which the compiler does not vectorize: ResNet-50's [1, 64, 112, 112] pool
took 653 us that way, 5x onnxruntime's blocked one (AMD Zen 2, 1 thread). At stride 2 a
window of 2 or 3 contiguous columns is reduced straight from the row into the outputs, its
taps loaded as interleaved pairs (permutes), and a single window row whose taps all lie in x
(a 1-D pool without pads) is read in place, with no padded copy: on an AMD Zen 4 a
[1, 128, 64] k2 s2 pool went from 10.8 to 7.1 us a session run (onnxruntime 10.7), the
[1, 64, 112, 112] one from 326 to 233 (onnxruntime 180).
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Part, Private, fill

# (suffix, C type, the value that never wins a max)
MAX_TYPES = (("f32", "float", "(-INFINITY)"), ("f64", "double", "(-INFINITY)"),
             ("i8", "int8_t", "INT8_MIN"), ("u8", "uint8_t", "0"))
AVERAGE_TYPES = (("f32", "float"), ("f64", "double"))

# The window geometry every 3-D pool takes (see the module docstring).
_GEOMETRY = ("const int64_t* in", "const int64_t* out", "const int64_t* k", "const int64_t* s", "const int64_t* p",
             "const int64_t* dil")

_DEFINES = r"""
/* ---- pool ---- */
/* Output rows * taps below which the loops stay serial. */
#define SS_POOL_PAR_MIN @PAR_MIN@
/* Bytes of padded planes a stride-1 max pool takes at a time (at least one plane): its
   scratch, twice that, is on the stack up to there (a malloc'd one was freed back to the
   system and faulted in again at every call: a [3, 128, 4, 4] pool's session run took
   51 us with it, 44 us from the stack). 8 KB keeps both halves in L1: with 32 KB that pool
   took 1.7x as long. */
#define SS_POOL_CHUNK @CHUNK@
/* Kernel widths up to which the per-column output ranges live on the stack. */
#define SS_POOL_STACK_KW 64
/* Padded row lengths up to which a strided 2-D max pool runs by rows (two such rows of
   doubles on the stack: 32 KB). */
#define SS_POOL_ROW_CAP 2048
"""

_HELPERS = r"""
/* ceil(a / b) for b > 0 and any sign of a. */
static inline int64_t ss_pool_ceil_div(int64_t a, int64_t b) {
    return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

/* The outputs o in [*lo, *hi) within [0, O) whose input o * s - p + off lies in [0, L). */
static inline void ss_pool_valid(int64_t L, int64_t O, int64_t s, int64_t p, int64_t off,
                                 int64_t* lo, int64_t* hi) {
    int64_t a = ss_pool_ceil_div(p - off, s), b = ss_pool_ceil_div(L + p - off, s);
    if (a < 0) a = 0;
    if (b > O) b = O;
    if (b < a) b = a;
    *lo = a;
    *hi = b;
}

/* How many taps start + t * dil (t < K) lie in [lo, hi). */
static inline int64_t ss_pool_taps(int64_t start, int64_t K, int64_t dil, int64_t lo, int64_t hi) {
    int64_t a, b;
    if (dil == 1) {  /* the common case, without divisions */
        a = start > lo ? start : lo;
        b = start + K < hi ? start + K : hi;
        return b > a ? b - a : 0;
    }
    a = ss_pool_ceil_div(lo - start, dil);
    b = ss_pool_ceil_div(hi - start, dil);
    if (a < 0) a = 0;
    if (b > K) b = K;
    return b > a ? b - a : 0;
}

/* A max pool over an input with an empty spatial axis (padding alone gives it outputs):
   zeros, values and indices, as the reference evaluator (onnxruntime rejects the input). */
static void ss_pool_no_input(void* y, int64_t* indices, int64_t count, size_t elem_size) {
    if (count <= 0) return;
    memset(y, 0, (size_t)count * elem_size);
    if (indices) memset(indices, 0, (size_t)count * sizeof(int64_t));
}

static inline int64_t ss_pool_clip(int64_t i, int64_t L) {
    return i < 0 ? 0 : (i >= L ? L - 1 : i);
}

"""

_POOL_SAME_PADS = Function("void", "ss_pool_same_pads", ("const int64_t* in", "const int64_t* out", "const int64_t* k",
                                                         "const int64_t* s", "const int64_t* dil", "int upper",
                                                         "int64_t* p", "int64_t* p_end"), r"""
    for (int a = 0; a < 3; ++a) {
        int64_t total = (out[a] - 1) * s[a] + (k[a] - 1) * dil[a] + 1 - in[a];
        if (total < 0) total = 0;
        p[a] = upper ? total / 2 : total - total / 2;
        p_end[a] = total - p[a];
    }""")

_MAXUNPOOL = Function("int", "ss_maxunpool", ("int64_t elem_size", "const void* x", "const int64_t* indices",
                                              "int64_t n", "void* y", "int64_t total"), r"""
    if (total > 0) memset(y, 0, (size_t)(total * elem_size));
    for (int64_t i = 0; i < n; ++i)
        if (indices[i] < 0 || indices[i] >= total) return 1;
    /* A scatter: serial, so that a repeated index keeps its last value, as NumPy does. The
       memcpy of a constant size is one move. */
    char* dst = (char*)y;
    const char* src = (const char*)x;
    switch (elem_size) {
    case 4: for (int64_t i = 0; i < n; ++i) memcpy(dst + indices[i] * 4, src + i * 4, 4); break;
    case 8: for (int64_t i = 0; i < n; ++i) memcpy(dst + indices[i] * 8, src + i * 8, 8); break;
    default:
        for (int64_t i = 0; i < n; ++i)
            memcpy(dst + indices[i] * elem_size, src + i * elem_size, (size_t)elem_size);
    }
    return 0;""")

# The loop nest shared by every pool: one output row (nc, od, oh) per iteration, the
# window's planes and rows outside x skipped, elements of type @CTYPE@. @SETUP@ (before the
# rows), @INIT@, @TAP@ and @FINISH@ (per row) are the per-kernel parts; @TAP@ sees xs (the
# tap's first input), yo (the output columns from lo), j < n and the column stride sw; it
# also has id, ih and the input column iw0 of column lo.
_NEST = r"""
    const int64_t D = in[0], H = in[1], W = in[2], OD = out[0], OH = out[1], OW = out[2];
    const int64_t KD = k[0], KH = k[1], KW = k[2], sd = s[0], sh = s[1], sw = s[2];
    const int64_t pd = p[0], ph = p[1], pw = p[2], dd = dil[0], dh = dil[1], dw = dil[2];
    const int64_t rows = NC * OD * OH;
    /* Each kernel column's output range [lo, hi), the same for every row: computed once
       (its divisions cost more than a small row's taps), on the stack for kernels up to
       SS_POOL_STACK_KW wide; NULL (computed per row) if a wider one's malloc fails. */
    int64_t stack_cols[2 * SS_POOL_STACK_KW];
    int64_t* cols = KW <= SS_POOL_STACK_KW ? stack_cols : (int64_t*)malloc((size_t)(2 * KW) * sizeof(int64_t));
    for (int64_t kw = 0; cols && kw < KW; ++kw) ss_pool_valid(W, OW, sw, pw, kw * dw, &cols[2 * kw], &cols[2 * kw + 1]);
@SETUP@
    #pragma omp parallel for if(rows * OW * KD * KH * KW >= SS_POOL_PAR_MIN)
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t plane_row = r / OH, oh = r - plane_row * OH;  /* r = (nc * OD + od) * OH + oh */
        const int64_t nc = OD == 1 ? plane_row : plane_row / OD, od = plane_row - nc * OD;
        @CTYPE@* yr = y + r * OW;
@INIT@
        for (int64_t kd = 0; kd < KD; ++kd) {
            const int64_t id = od * sd - pd + kd * dd;
            if (id < 0 || id >= D) continue;
            for (int64_t kh = 0; kh < KH; ++kh) {
                const int64_t ih = oh * sh - ph + kh * dh;
                if (ih < 0 || ih >= H) continue;
                const @CTYPE@* xr = x + ((nc * D + id) * H + ih) * W;
                for (int64_t kw = 0; kw < KW; ++kw) {
                    int64_t lo, hi;
                    if (cols) {
                        lo = cols[2 * kw];
                        hi = cols[2 * kw + 1];
                    } else {
                        ss_pool_valid(W, OW, sw, pw, kw * dw, &lo, &hi);
                    }
                    const int64_t iw0 = lo * sw - pw + kw * dw, n = hi - lo;
                    const @CTYPE@* xs = xr + iw0;
                    @CTYPE@* yo = yr + lo;
@TAP@
                }
            }
        }
@FINISH@
    }
    if (cols != stack_cols) free(cols);
"""

_MAX_INIT = "        for (int64_t ow = 0; ow < OW; ++ow) yr[ow] = @LOWEST@;"

_MAX_TAP = r"""
                    if (sw == 1) {
                        for (int64_t j = 0; j < n; ++j) yo[j] = yo[j] > xs[j] ? yo[j] : xs[j];
                    } else {
                        for (int64_t j = 0; j < n; ++j) yo[j] = yo[j] > xs[j * sw] ? yo[j] : xs[j * sw];
                    }"""

# The separable stride-1 max pool (see the module docstring). Returns 0, having written
# nothing, when its scratch cannot be allocated.
_MAX_STRIDE1 = r"""
static int ss_maxpool_s1_@SFX@(const @CTYPE@* x, @CTYPE@* y, int64_t NC, int64_t H, int64_t W, int64_t OH,
                               int64_t OW, int64_t KH, int64_t KW, int64_t ph, int64_t pw, int64_t dh, int64_t dw) {
    enum { CAP = SS_POOL_CHUNK / sizeof(@CTYPE@) };
    const int64_t Hp = OH + (KH - 1) * dh, Wp = OW + (KW - 1) * dw, plane = Hp * Wp;
    int64_t chunk = CAP / plane;
    if (chunk > NC) chunk = NC;
    const int64_t chunks = chunk > 0 ? (NC + chunk - 1) / chunk : NC;
    const int par = chunks > 1 && NC * OH * OW * (KH + KW) >= SS_POOL_PAR_MIN;
    /* Planes larger than the stack scratch: one at a time, each thread's from the heap. */
    @CTYPE@* heap = NULL;
    if (chunk < 1) {
        chunk = 1;
        heap = (@CTYPE@*)malloc((size_t)((par ? omp_get_max_threads() : 1) * 2 * plane) * sizeof(@CTYPE@));
        if (!heap) return 0;
    }
    /* The input columns that land in the padded plane, [0, c1) (pads are not negative here). */
    const int64_t c1 = W < Wp - pw ? W : Wp - pw;
    #pragma omp parallel for schedule(static) if(par)
    for (int64_t c = 0; c < chunks; ++c) {
        @CTYPE@ local[2 * CAP];  /* the padded planes, then their column maxima (unused with heap) */
        @CTYPE@* pad = heap ? heap + (int64_t)(par ? omp_get_thread_num() : 0) * 2 * plane : local;
        @CTYPE@* cols = pad + chunk * plane;
        const int64_t n0 = c * chunk, n = NC - n0 < chunk ? NC - n0 : chunk, len = n * plane;
        for (int64_t i = 0; i < len; ++i) pad[i] = @LOWEST@;
        for (int64_t q = 0; q < n; ++q)
            for (int64_t ih = 0; ih < H; ++ih) {
                const int64_t r = ih + ph;
                if (r >= Hp) break;  /* input rows below every window */
                const @CTYPE@* src = x + ((n0 + q) * H + ih) * W;
                @CTYPE@* dst = pad + q * plane + r * Wp + pw;
                for (int64_t iw = 0; iw < c1; ++iw) dst[iw] = src[iw];
            }
        /* Over the columns of each window, then over its rows (into pad, no longer needed). */
        const int64_t lw = len - (KW - 1) * dw, lh = lw - (KH - 1) * dh * Wp;
        for (int64_t f = 0; f < lw; ++f) cols[f] = pad[f];
        for (int64_t kw = 1; kw < KW; ++kw) {
            const @CTYPE@* src = pad + kw * dw;
            for (int64_t f = 0; f < lw; ++f) cols[f] = cols[f] > src[f] ? cols[f] : src[f];
        }
        for (int64_t f = 0; f < lh; ++f) pad[f] = cols[f];
        for (int64_t kh = 1; kh < KH; ++kh) {
            const @CTYPE@* src = cols + kh * dh * Wp;
            for (int64_t f = 0; f < lh; ++f) pad[f] = pad[f] > src[f] ? pad[f] : src[f];
        }
        for (int64_t q = 0; q < n; ++q)
            for (int64_t oh = 0; oh < OH; ++oh) {
                const @CTYPE@* src = pad + q * plane + oh * Wp;
                @CTYPE@* dst = y + ((n0 + q) * OH + oh) * OW;
                for (int64_t ow = 0; ow < OW; ++ow) dst[ow] = src[ow];
            }
    }
    free(heap);
    return 1;
}
"""

# The strided 2-D max pool by rows (see the module docstring). Returns 0, having written
# nothing, when a padded row passes its stack buffer.
_MAX_ROWS = r"""
static int ss_maxpool_rows_@SFX@(const @CTYPE@* x, @CTYPE@* y, int64_t NC, int64_t H, int64_t W, int64_t OH,
                                 int64_t OW, int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                                 int64_t dh, int64_t dw) {
    /* v: the window rows' maximum over the padded columns [-pw, Wp - pw); h[j]: the maximum
       of v over the columns of a window starting at j, for j up to the last output's. */
    const int64_t span = (OW - 1) * sw + 1, Wp = span + (KW - 1) * dw;
    if (Wp > SS_POOL_ROW_CAP) return 0;
    /* The input columns that land in the padded row, [0, c1) (pads are not negative here). */
    const int64_t c1 = W < Wp - pw ? W : Wp - pw, rows = NC * OH;
    /* One window row whose taps all lie in x (a 1-D pool without pads, as after a text
       classifier's Conv1d): the windows read x's row in place, with no padded copy. */
    const int in_place = KH == 1 && ph == 0 && pw == 0 && (OH - 1) * sh < H && Wp <= W;
    #pragma omp parallel for schedule(static) if(rows * OW * KH * KW >= SS_POOL_PAR_MIN)
    for (int64_t r = 0; r < rows; ++r) {
        @CTYPE@ v[SS_POOL_ROW_CAP], h[SS_POOL_ROW_CAP];
        const int64_t nc = r / OH, oh = r - nc * OH;
        const @CTYPE@* row = v;  /* the window rows' maximum, from padded column -pw on */
        if (in_place) {
            row = x + (nc * H + oh * sh) * W;
        } else {
            for (int64_t i = 0; i < Wp; ++i) v[i] = @LOWEST@;
            for (int64_t kh = 0; kh < KH; ++kh) {
                const int64_t ih = oh * sh - ph + kh * dh;
                if (ih < 0 || ih >= H) continue;
                const @CTYPE@* src = x + (nc * H + ih) * W;
                @CTYPE@* dst = v + pw;
                for (int64_t iw = 0; iw < c1; ++iw) dst[iw] = dst[iw] > src[iw] ? dst[iw] : src[iw];
            }
        }
        @CTYPE@* dst = y + r * OW;
        /* Stride 2, windows of 2 or 3 contiguous taps: each output straight from the row,
           its taps an interleaved pair the compiler loads with permutes (the general path's
           strided gather below stays scalar: a [1, 128, 64] k2 s2 pool took 4.9 us with it,
           AMD Zen 4). The comparisons are the general path's, in its order. */
        if (sw == 2 && dw == 1 && KW == 2) {
            for (int64_t ow = 0; ow < OW; ++ow) {
                const @CTYPE@ a = row[2 * ow], b = row[2 * ow + 1];
                dst[ow] = a > b ? a : b;
            }
            continue;
        }
        if (sw == 2 && dw == 1 && KW == 3) {
            for (int64_t ow = 0; ow < OW; ++ow) {
                const @CTYPE@ a = row[2 * ow], b = row[2 * ow + 1], c = row[2 * ow + 2];
                const @CTYPE@ m = a > b ? a : b;
                dst[ow] = m > c ? m : c;
            }
            continue;
        }
        for (int64_t j = 0; j < span; ++j) h[j] = row[j];
        for (int64_t kw = 1; kw < KW; ++kw) {
            const @CTYPE@* src = row + kw * dw;
            for (int64_t j = 0; j < span; ++j) h[j] = h[j] > src[j] ? h[j] : src[j];
        }
        for (int64_t ow = 0; ow < OW; ++ow) dst[ow] = h[ow * sw];
    }
    return 1;
}
"""

# The bodies of the typed pools; @NEST@ is _NEST filled for each.
_MAX_BODY = r"""
    if (in[0] * in[1] * in[2] == 0) {  /* see ss_pool_no_input */
        ss_pool_no_input(y, NULL, NC * out[0] * out[1] * out[2], sizeof(@CTYPE@));
        return;
    }
    /* A 2-D (or 1-D) pool, pads not negative, something to write: the separable path at
       stride 1, the row path at larger strides. */
    const int plain2d = in[0] == 1 && k[0] == 1 && out[0] == 1 && p[1] >= 0 && p[2] >= 0
                        && NC > 0 && out[1] > 0 && out[2] > 0;
    if (plain2d && s[1] == 1 && s[2] == 1
            && ss_maxpool_s1_@SFX@(x, y, NC, in[1], in[2], out[1], out[2], k[1], k[2], p[1], p[2], dil[1], dil[2]))
        return;
    if (plain2d && (s[1] > 1 || s[2] > 1)
            && ss_maxpool_rows_@SFX@(x, y, NC, in[1], in[2], out[1], out[2], k[1], k[2], s[1], s[2], p[1], p[2],
                                     dil[1], dil[2]))
        return;
@NEST@"""

# Each output starts at the lowest value and at its first tap's coordinates clipped
# into x: what the reference evaluator reports for a window no tap of x beats.
_ARGMAX_INIT = r"""
        int64_t* ir = ir_base + r * OW;
        const int64_t plane = nc * D * H * W;
        const int64_t first = plane + ss_pool_clip(od * sd - pd, D) * cd + ss_pool_clip(oh * sh - ph, H) * ch;
        for (int64_t ow = 0; ow < OW; ++ow) {
            yr[ow] = @LOWEST@;
            ir[ow] = first + ss_pool_clip(ow * sw - pw, W) * cw;
        }"""

# Strict > keeps the first maximum in window order, as the reference evaluator does.
_ARGMAX_TAP = r"""
                    int64_t* io = ir + lo;
                    const int64_t base = plane + id * cd + ih * ch;
                    for (int64_t j = 0; j < n; ++j) {
                        const @CTYPE@ v = xs[j * sw];
                        if (v > yo[j]) {
                            yo[j] = v;
                            io[j] = base + (iw0 + j * sw) * cw;
                        }
                    }"""

_ARGMAX_BODY = r"""
    /* Spatial coefficients of the flat index: row major, or column major (storage_order 1). */
    const int64_t cd = storage_order ? 1 : in[1] * in[2];
    const int64_t ch = storage_order ? in[0] : in[2];
    const int64_t cw = storage_order ? in[0] * in[1] : 1;
    int64_t* ir_base = indices;
    if (in[0] * in[1] * in[2] == 0) {  /* see ss_pool_no_input */
        ss_pool_no_input(y, indices, NC * out[0] * out[1] * out[2], sizeof(@CTYPE@));
        return;
    }
@NEST@"""

_AVERAGE_INIT = "        for (int64_t ow = 0; ow < OW; ++ow) yr[ow] = (@CTYPE@)0;"

_AVERAGE_TAP = r"""
                    if (sw == 1) {
                        for (int64_t j = 0; j < n; ++j) yo[j] += xs[j];
                    } else {
                        for (int64_t j = 0; j < n; ++j) yo[j] += xs[j * sw];
                    }"""

# The divisor is a product of per-axis tap counts within [lo, hi) along each axis. The
# columns [inner_lo, inner_hi) whose window lies wholly inside [lo_w, hi_w) share one
# divisor, so that their divisions vectorize; only the border columns count their taps one
# by one.
_AVERAGE_SETUP = r"""
    const int64_t lo_d = count_include_pad ? -pd : 0, hi_d = count_include_pad ? D + p_end[0] : D;
    const int64_t lo_h = count_include_pad ? -ph : 0, hi_h = count_include_pad ? H + p_end[1] : H;
    const int64_t lo_w = count_include_pad ? -pw : 0, hi_w = count_include_pad ? W + p_end[2] : W;
    int64_t inner_lo, inner_hi;
    ss_pool_valid(hi_w - lo_w - (KW - 1) * dw, OW, sw, pw + lo_w, 0, &inner_lo, &inner_hi);
    if (inner_lo > OW) inner_lo = inner_hi = OW;"""

_AVERAGE_FINISH = r"""
        const int64_t rows_in = ss_pool_taps(od * sd - pd, KD, dd, lo_d, hi_d)
                              * ss_pool_taps(oh * sh - ph, KH, dh, lo_h, hi_h);
        const int64_t full = rows_in * KW;
        if (full > 0) {
            const @CTYPE@ divisor = (@CTYPE@)full;
            for (int64_t ow = inner_lo; ow < inner_hi; ++ow) yr[ow] /= divisor;
        } else {
            for (int64_t ow = inner_lo; ow < inner_hi; ++ow) yr[ow] = (@CTYPE@)0;
        }
        for (int side = 0; side < 2; ++side) {  /* the border columns: [0, inner_lo), [inner_hi, OW) */
            const int64_t from = side ? inner_hi : 0, to = side ? OW : inner_lo;
            for (int64_t ow = from; ow < to; ++ow) {
                const int64_t count = rows_in * ss_pool_taps(ow * sw - pw, KW, dw, lo_w, hi_w);
                yr[ow] = count > 0 ? yr[ow] / (@CTYPE@)count : (@CTYPE@)0;
            }
        }"""

# The 2-D float32 forms kept for existing callers.
_MAXPOOL2D = Function("void", "ss_maxpool2d", ("const float* x", "float* y", "int64_t NC", "int64_t H", "int64_t W",
                                               "int64_t OH", "int64_t OW", "int64_t KH", "int64_t KW", "int64_t sh",
                                               "int64_t sw", "int64_t ph", "int64_t pw", "int64_t dh",
                                               "int64_t dw"), r"""
    const int64_t in[3] = {1, H, W}, out[3] = {1, OH, OW}, k[3] = {1, KH, KW};
    const int64_t s[3] = {1, sh, sw}, p[3] = {0, ph, pw}, dil[3] = {1, dh, dw};
    ss_maxpool3d_f32(x, y, NC, in, out, k, s, p, dil);""")

_AVGPOOL2D = Function("void", "ss_avgpool2d", ("const float* x", "float* y", "int64_t NC", "int64_t H", "int64_t W",
                                               "int64_t OH", "int64_t OW", "int64_t KH", "int64_t KW", "int64_t sh",
                                               "int64_t sw", "int64_t ph", "int64_t pw", "int64_t ph_end",
                                               "int64_t pw_end", "int count_include_pad"), r"""
    const int64_t in[3] = {1, H, W}, out[3] = {1, OH, OW}, k[3] = {1, KH, KW};
    const int64_t s[3] = {1, sh, sw}, p[3] = {0, ph, pw}, p_end[3] = {0, ph_end, pw_end}, dil[3] = {1, 1, 1};
    ss_avgpool3d_f32(x, y, NC, in, out, k, s, p, p_end, dil, count_include_pad);""")


def _max_kernel(sfx: str, ctype: str, lowest: str) -> list[Part]:
    nest = fill(_NEST, CTYPE=ctype, SETUP="", INIT=fill(_MAX_INIT, LOWEST=lowest), TAP=_MAX_TAP.strip("\n"), FINISH="")
    return [Private(fill(_MAX_STRIDE1, SFX=sfx, CTYPE=ctype, LOWEST=lowest)),
            Private(fill(_MAX_ROWS, SFX=sfx, CTYPE=ctype, LOWEST=lowest)),
            Function("void", f"ss_maxpool3d_{sfx}", (f"const {ctype}* x", f"{ctype}* y", "int64_t NC", *_GEOMETRY),
                     fill(_MAX_BODY, SFX=sfx, CTYPE=ctype, NEST=nest))]


def _argmax_kernel(sfx: str, ctype: str, lowest: str) -> Function:
    nest = fill(_NEST, CTYPE=ctype, SETUP="", INIT=fill(_ARGMAX_INIT, LOWEST=lowest).strip("\n"),
                TAP=fill(_ARGMAX_TAP, CTYPE=ctype).strip("\n"), FINISH="")
    return Function("void", f"ss_maxpool3d_argmax_{sfx}",
                    (f"const {ctype}* x", f"{ctype}* y", "int64_t* indices", "int64_t NC", *_GEOMETRY,
                     "int storage_order"), fill(_ARGMAX_BODY, CTYPE=ctype, NEST=nest))


def _average_kernel(sfx: str, ctype: str) -> Function:
    nest = fill(_NEST, CTYPE=ctype, SETUP=_AVERAGE_SETUP.strip("\n"), INIT=fill(_AVERAGE_INIT, CTYPE=ctype),
                TAP=_AVERAGE_TAP.strip("\n"), FINISH=fill(_AVERAGE_FINISH, CTYPE=ctype))
    return Function("void", f"ss_avgpool3d_{sfx}",
                    (f"const {ctype}* x", f"{ctype}* y", "int64_t NC", *_GEOMETRY[:5], "const int64_t* p_end",
                     _GEOMETRY[5], "int count_include_pad"), nest)


def fragment(par_min: int = 32768, chunk: int = 8192) -> Fragment:
    """The pool fragment; ``par_min`` is the work (outputs times taps) below which loops stay
    serial, ``chunk`` the bytes of padded planes a stride-1 max pool takes at a time."""
    parts: list[Part] = [Private(fill(_DEFINES, PAR_MIN=int(par_min), CHUNK=int(chunk))), Private(_HELPERS),
                         _POOL_SAME_PADS, _MAXUNPOOL]
    for sfx, ctype, lowest in MAX_TYPES:
        parts += _max_kernel(sfx, ctype, lowest)
        parts.append(_argmax_kernel(sfx, ctype, lowest))
    for sfx, ctype in AVERAGE_TYPES:
        parts.append(_average_kernel(sfx, ctype))
    parts += [_MAXPOOL2D, _AVGPOOL2D]
    return Fragment(parts)


def source(par_min: int = 32768, chunk: int = 8192) -> str:
    return fragment(par_min, chunk).text()
