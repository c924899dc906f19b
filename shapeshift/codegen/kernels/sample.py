"""GridSample: sample an [N, C, *spatial] tensor at the points of a normalized grid
(ONNX GridSample 16/20/22, float32, 1 to 3 spatial axes).

Exported C::

    /* y [N, C, *out_dims] = x [N, C, *in_dims] sampled at grid [N, *out_dims, rank], whose
       last axis holds normalized coordinates in -1..1, innermost spatial axis first (grid[..., 0]
       addresses the last axis of x, as in ONNX and PyTorch). rank (1..3) is the number of
       spatial axes. mode: 0 nearest, 1 linear, 2 cubic (Keys, a = -0.75). padding: 0 zeros,
       1 border, 2 reflection. align_corners: 1 maps -1 and 1 to the centres of the corner
       pixels, 0 to their outer edges. When an input spatial extent is 0 there is nothing to
       sample from and y is filled with zeros. */
    void ss_grid_sample(const float* x, const float* grid, float* y, int64_t N, int64_t C,
                        int64_t rank, const int64_t* in_dims, const int64_t* out_dims,
                        int mode, int padding, int align_corners);

The arithmetic is the ONNX reference evaluator's (onnx.reference GridSample): the
coordinate is unnormalized in float, nearest rounds it half to even (rintf) before the
padding rule applies, the padding rule moves a coordinate outside [lo, hi] (the pixel
centres with align_corners, else the outer pixel edges) into the image (border clamps to
[0, L - 1], reflection folds it back at lo and hi), and every tap is then read through the
padding rule again (zeros: outside taps read 0; border: clamped; reflection: folded).
onnxruntime 1.32 (like PyTorch) differs in one case: with cubic mode and border padding it
clamps only the taps, not the coordinate, so points outside the image get other values;
this kernel keeps the reference's, which the reference backend computes too.

Interpolation is separable, so each output point is a weighted sum over the product of its
per-axis taps (1, 2 or 4 per axis); taps that read the zero padding are left out rather
than weighted by 0, so an inf or NaN next to the image does not leak in.

A NaN or huge coordinate is kept finite before it becomes an index (the reference fails on
NaN): with zeros padding it reads zeros, as any point that far outside does.

Work is split in blocks of output points: the taps of a block are computed once and then
applied to all C channels, one contiguous run of outputs per channel. OpenMP shares the
(batch, block) pairs.
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Private, fill

DEPENDS: tuple[str, ...] = ()

MODES = {"nearest": 0, "linear": 1, "cubic": 2}
PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
MAX_RANK = 3

_DEFINES = r"""
/* ---- sample ---- */
#define SS_GRID_MAX_RANK 3
/* At most 4 taps per axis: 4^3 tap combinations per output point. */
#define SS_GRID_MAX_COMBOS 64
/* Output points whose taps are computed together, then applied to every channel. */
#define SS_GRID_BLOCK @BLOCK@
/* Outputs times taps below which the loop stays serial. */
#define SS_GRID_PAR_MIN @PAR_MIN@
"""

_HELPERS = r"""
/* The normalized coordinate g (-1..1) as a pixel coordinate along an axis of L pixels. */
static inline float ss_grid_unnormalize(float g, int64_t L, int align_corners) {
    if (align_corners) return (g + 1.0f) / 2.0f * (float)(L - 1);
    return ((g + 1.0f) * (float)L - 1.0f) / 2.0f;
}

/* Folds v back into [lo, hi] by reflecting at the bounds as often as needed (in double,
   as the reference does). A degenerate range (one pixel, align_corners) is the point lo. */
static float ss_grid_reflect(float v, float lo, float hi) {
    double x = v, range = (double)hi - (double)lo;
    if (x >= lo && x <= hi) return v;
    if (!(range > 0.0) || !isfinite(x)) return lo;
    double dx = x < lo ? (double)lo - x : x - (double)hi;
    double folds = floor(dx / range), rest = dx - folds * range;
    int even = fmod(folds, 2.0) == 0.0;
    if (x < lo) return (float)(even ? (double)lo + rest : (double)hi - rest);
    return (float)(even ? (double)hi - rest : (double)lo + rest);
}

static inline int64_t ss_grid_clamp(int64_t i, int64_t L) {
    return i < 0 ? 0 : (i >= L ? L - 1 : i);
}

/* The pixel tap i reads under the padding rule, or -1 for the zero padding. */
static inline int64_t ss_grid_pixel(int64_t i, int64_t L, int padding, float lo, float hi) {
    if (padding == 0) return i >= 0 && i < L ? i : -1;
    if (padding == 1) return ss_grid_clamp(i, L);
    return ss_grid_clamp((int64_t)ss_grid_reflect((float)i, lo, hi), L);
}

/* Keys' cubic convolution weights of the taps at -1, 0, 1, 2 for a fraction t in [0, 1). */
static inline void ss_grid_cubic_weights(float t, float* w) {
    const float a = -0.75f;
    float t1 = t + 1.0f, u = 1.0f - t, u1 = 2.0f - t;
    w[0] = ((a * t1 - 5.0f * a) * t1 + 8.0f * a) * t1 - 4.0f * a;
    w[1] = ((a + 2.0f) * t - (a + 3.0f)) * t * t + 1.0f;
    w[2] = ((a + 2.0f) * u - (a + 3.0f)) * u * u + 1.0f;
    w[3] = ((a * u1 - 5.0f * a) * u1 + 8.0f * a) * u1 - 4.0f * a;
}

/* The taps (pixel index or -1, weight) of one axis of L pixels for normalized coordinate g;
   returns how many (1, 2 or 4 by mode). */
static int ss_grid_axis_taps(float g, int64_t L, int mode, int padding, int align_corners,
                             int64_t* idx, float* wt) {
    float lo = align_corners ? 0.0f : -0.5f;
    float hi = align_corners ? (float)(L - 1) : (float)L - 0.5f;
    float x = ss_grid_unnormalize(g, L, align_corners);
    if (mode == 0) x = rintf(x);
    if (x < lo || x > hi) {
        if (padding == 1) x = x < 0.0f ? 0.0f : (float)(L - 1);
        else if (padding == 2) x = ss_grid_reflect(x, lo, hi);
    }
    /* Far outside (or NaN): every tap misses the image by the same margin, so the
       point's result does not change, and the index conversions below stay defined. */
    float margin = (float)L + 8.0f;
    if (!(x > -margin)) x = -margin;
    if (x > margin) x = margin;
    if (mode == 0) {
        idx[0] = ss_grid_pixel((int64_t)x, L, padding, lo, hi);
        wt[0] = 1.0f;
        return 1;
    }
    float f = floorf(x), t = x - f;
    int64_t base = (int64_t)f;
    if (mode == 1) {
        wt[0] = 1.0f - t;
        wt[1] = t;
        for (int k = 0; k < 2; ++k) idx[k] = ss_grid_pixel(base + k, L, padding, lo, hi);
        return 2;
    }
    ss_grid_cubic_weights(t, wt);
    for (int k = 0; k < 4; ++k) idx[k] = ss_grid_pixel(base + k - 1, L, padding, lo, hi);
    return 4;
}

/* The (plane offset, weight) pairs of one output point: the product of its axes' taps,
   taps reading the zero padding left out. Returns how many. */
static int ss_grid_point_combos(const float* g, int64_t rank, const int64_t* in_dims,
                                const int64_t* plane_strides, int mode, int padding, int align_corners,
                                int64_t* off, float* wt) {
    int64_t idx[SS_GRID_MAX_RANK][4];
    float w[SS_GRID_MAX_RANK][4];
    int taps[SS_GRID_MAX_RANK];
    for (int64_t a = 0; a < rank; ++a)
        taps[a] = ss_grid_axis_taps(g[rank - 1 - a], in_dims[a], mode, padding, align_corners, idx[a], w[a]);
    int count = 0, k[SS_GRID_MAX_RANK] = {0, 0, 0};
    for (;;) {
        int64_t o = 0;
        float weight = 1.0f;
        int inside = 1;
        for (int64_t a = 0; a < rank; ++a) {
            int64_t i = idx[a][k[a]];
            if (i < 0) { inside = 0; break; }
            o += i * plane_strides[a];
            weight *= w[a][k[a]];
        }
        if (inside) { off[count] = o; wt[count] = weight; ++count; }
        int64_t a = rank - 1;  /* odometer over the taps, last axis fastest */
        while (a >= 0 && ++k[a] == taps[a]) k[a--] = 0;
        if (a < 0) break;
    }
    return count;
}

"""

_GRID_SAMPLE = Function("void", "ss_grid_sample", ("const float* x", "const float* grid", "float* y", "int64_t N",
                                                   "int64_t C", "int64_t rank", "const int64_t* in_dims",
                                                   "const int64_t* out_dims", "int mode", "int padding",
                                                   "int align_corners"), r"""
    if (rank < 1 || rank > SS_GRID_MAX_RANK) return;
    int64_t plane = 1, points = 1, plane_strides[SS_GRID_MAX_RANK];
    for (int64_t a = rank - 1; a >= 0; --a) {
        plane_strides[a] = plane;
        plane *= in_dims[a];
        points *= out_dims[a];
    }
    if (N <= 0 || C <= 0 || points <= 0) return;
    if (plane <= 0) {
        memset(y, 0, sizeof(float) * (size_t)(N * C * points));
        return;
    }
    int64_t taps = mode == 0 ? 1 : (mode == 1 ? 2 : 4), combos = 1;
    for (int64_t a = 0; a < rank; ++a) combos *= taps;
    int64_t blocks = (points + SS_GRID_BLOCK - 1) / SS_GRID_BLOCK;
    #pragma omp parallel for if(N * C * points * combos >= SS_GRID_PAR_MIN)
    for (int64_t job = 0; job < N * blocks; ++job) {
        int64_t n = job / blocks, first = (job % blocks) * SS_GRID_BLOCK;
        int64_t count = points - first < SS_GRID_BLOCK ? points - first : SS_GRID_BLOCK;
        int64_t off[SS_GRID_BLOCK * SS_GRID_MAX_COMBOS];
        float wt[SS_GRID_BLOCK * SS_GRID_MAX_COMBOS];
        int used[SS_GRID_BLOCK];
        for (int64_t p = 0; p < count; ++p) {
            const float* g = grid + (n * points + first + p) * rank;
            used[p] = ss_grid_point_combos(g, rank, in_dims, plane_strides, mode, padding, align_corners,
                                           off + p * SS_GRID_MAX_COMBOS, wt + p * SS_GRID_MAX_COMBOS);
        }
        for (int64_t c = 0; c < C; ++c) {
            const float* xp = x + (n * C + c) * plane;
            float* yp = y + (n * C + c) * points + first;
            for (int64_t p = 0; p < count; ++p) {
                const int64_t* o = off + p * SS_GRID_MAX_COMBOS;
                const float* w = wt + p * SS_GRID_MAX_COMBOS;
                float acc = 0.0f;
                for (int j = 0; j < used[p]; ++j) acc += w[j] * xp[o[j]];
                yp[p] = acc;
            }
        }
    }""")


def fragment(block: int = 32, par_min: int = 32768) -> Fragment:
    """The GridSample fragment; ``block`` output points share one tap table, ``par_min`` is
    the work (outputs times taps) below which the loop stays serial."""
    return Fragment([
        Private(fill(_DEFINES, BLOCK=int(block), PAR_MIN=int(par_min))),
        Private(_HELPERS),
        _GRID_SAMPLE,
    ])


def source(block: int = 32, par_min: int = 32768) -> str:
    return fragment(block, par_min).text()
