"""NonMaxSuppression: greedy per (batch, class), as the reference evaluator does it.

    int64_t ss_nms(const float* boxes, const float* scores, int64_t B, int64_t C, int64_t N,
                   int64_t max_out, float iou_threshold, int has_score_threshold,
                   float score_threshold, int center_point_box, int64_t* out);

boxes [B, N, 4] (y1, x1, y2, x2 corners in any order, or x_center, y_center, w, h when
center_point_box), scores [B, C, N]. For each batch and class: candidates above the score
threshold (strictly) in descending score order, ties to the lower box index; a candidate is
kept when its IoU with every box kept so far is at most iou_threshold, until max_out are
kept. Writes the (batch, class, box) triples in that order to ``out`` when it is not NULL
and returns how many there are (-1 when out of memory). The IoU is computed in float32
with the evaluator's formula (shapeshift/ops/detection.py), so boundary cases agree.
The program calls it twice, once to size the output and once to fill it.

A candidate is tested only against the kept boxes that overlap it along x: the class's
x extent is cut into buckets about two mean candidate widths wide, each kept box is listed
in the buckets its x interval covers, and a candidate reads the lists of its own buckets
(a box listed in two of them is tested once). A kept box outside those buckets does not
overlap it in x, where the formula gives no suppression anyway: the selection is the one
testing every kept box gives, which the greedy loop did before. torchvision's batched NMS,
as SSDlite exports it, offsets each class's boxes along x and runs one NMS over all of
them: 27,000 candidates and 5,760 kept boxes took 33 ms a call testing every kept box (80
million IoUs). Boxes that cover most of the extent make few buckets, and the test
degrades to that scan.
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Private

DEPENDS: tuple[str, ...] = ()

_HELPERS = r"""
/* ---- nms ---- */
typedef struct { float score; int64_t index; } ss_nms_candidate;

/* Descending score, ties (and NaNs, which sort last) by ascending index: NumPy's stable
   argsort of -scores. */
static int ss_nms_order(const void* pa, const void* pb) {
    const ss_nms_candidate* a = (const ss_nms_candidate*)pa;
    const ss_nms_candidate* b = (const ss_nms_candidate*)pb;
    const int na = isnan(a->score), nb = isnan(b->score);
    if (na != nb) return na ? 1 : -1;
    if (!na && a->score != b->score) return a->score > b->score ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

/* Does kept box q (corners kx0.., area karea) suppress box c (corners c[0..3], area ac)?
   The IoU test of shapeshift/ops/detection.py in float32 (union = kept area + candidate
   area - intersection, in that order). */
static inline int ss_nms_suppresses(const float* kx0, const float* ky0, const float* kx1, const float* ky1,
                                    const float* karea, int64_t q, const float* c, float ac, float threshold) {
    const float ix = (kx1[q] < c[2] ? kx1[q] : c[2]) - (kx0[q] > c[0] ? kx0[q] : c[0]);
    const float iy = (ky1[q] < c[3] ? ky1[q] : c[3]) - (ky0[q] > c[1] ? ky0[q] : c[1]);
    const float inter = ix * iy;
    const float uni = karea[q] + ac - inter;
    return (ix > 0.0f) & (iy > 0.0f) & (inter > 0.0f) & (karea[q] > 0.0f) & (ac > 0.0f) & (uni > 0.0f)
           & (inter / uni > threshold);
}

/* Kept boxes listed by x bucket: bucket i covers [x0 + i / inv_width, x0 + (i + 1) / inv_width). */
typedef struct {
    int64_t nb;
    float x0, inv_width;
    int64_t* len;
    int64_t* cap;
    int32_t** items;
} ss_nms_grid;

/* The bucket of coordinate x, clamped into [0, nb); -inf and NaN go to 0, +inf to nb - 1. */
static inline int64_t ss_nms_bucket(const ss_nms_grid* g, float x) {
    const float t = (x - g->x0) * g->inv_width;
    if (!(t > 0.0f)) return 0;
    return t >= (float)(g->nb - 1) ? g->nb - 1 : (int64_t)t;
}

static int ss_nms_grid_add(ss_nms_grid* g, int64_t bucket, int32_t q) {
    if (g->len[bucket] == g->cap[bucket]) {
        int64_t cap = g->cap[bucket] ? 2 * g->cap[bucket] : 16;
        int32_t* grown = (int32_t*)realloc(g->items[bucket], sizeof(int32_t) * (size_t)cap);
        if (!grown) return 0;
        g->items[bucket] = grown;
        g->cap[bucket] = cap;
    }
    g->items[bucket][g->len[bucket]++] = q;
    return 1;
}

/* Empty buckets for one class's n candidates: about two mean widths each over the finite
   x extent of their boxes, at most max_nb and one per 8 candidates. */
static void ss_nms_grid_reset(ss_nms_grid* g, int64_t max_nb, const float* corners,
                              const ss_nms_candidate* cand, int64_t n) {
    float lo = INFINITY, hi = -INFINITY;
    double width = 0.0;
    int64_t finite = 0;
    for (int64_t t = 0; t < n; ++t) {
        const float* c = corners + 4 * cand[t].index;
        if (!isfinite(c[0]) || !isfinite(c[2])) continue;
        lo = c[0] < lo ? c[0] : lo;
        hi = c[2] > hi ? c[2] : hi;
        width += (double)c[2] - (double)c[0];
        ++finite;
    }
    int64_t nb = 1;
    if (finite > 0 && hi > lo) {
        const double mean = width / (double)finite, span = (double)hi - (double)lo;
        const double want = mean > 0.0 ? span / (2.0 * mean) : (double)max_nb;
        const int64_t per8 = n / 8 > 1 ? n / 8 : 1;
        nb = want < 1.0 ? 1 : (want > (double)max_nb ? max_nb : (int64_t)want);
        nb = nb > per8 ? per8 : nb;
    }
    g->nb = nb;
    g->x0 = nb > 1 ? lo : 0.0f;
    g->inv_width = nb > 1 ? (float)((double)nb / ((double)hi - (double)lo)) : 0.0f;
    for (int64_t i = 0; i < nb; ++i) g->len[i] = 0;
}

"""

_NMS = Function("int64_t", "ss_nms", ("const float* boxes", "const float* scores", "int64_t B", "int64_t C",
                                      "int64_t N", "int64_t max_out", "float iou_threshold", "int has_score_threshold",
                                      "float score_threshold", "int center_point_box", "int64_t* out"), r"""
    if (max_out <= 0 || B <= 0 || C <= 0 || N <= 0) return 0;
    const int64_t max_nb = N / 8 < 1 ? 1 : (N / 8 > 4096 ? 4096 : N / 8);
    float* corners = (float*)malloc(sizeof(float) * 5 * N);
    ss_nms_candidate* cand = (ss_nms_candidate*)malloc(sizeof(ss_nms_candidate) * N);
    /* The kept boxes' corners and areas, one array each, and the candidate each was last
       tested against. */
    float* kept = (float*)malloc(sizeof(float) * 5 * N);
    int64_t* tested = (int64_t*)malloc(sizeof(int64_t) * N);
    ss_nms_grid grid = {0, 0.0f, 0.0f, (int64_t*)calloc((size_t)max_nb, sizeof(int64_t)),
                        (int64_t*)calloc((size_t)max_nb, sizeof(int64_t)),
                        (int32_t**)calloc((size_t)max_nb, sizeof(int32_t*))};
    int64_t count = -1;
    if (!corners || !cand || !kept || !tested || !grid.len || !grid.cap || !grid.items) goto done;
    float* area = corners + 4 * N;
    float *kx0 = kept, *ky0 = kept + N, *kx1 = kept + 2 * N, *ky1 = kept + 3 * N, *karea = kept + 4 * N;
    count = 0;
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t i = 0; i < N; ++i) {
            const float* r = boxes + (b * N + i) * 4;
            float* c = corners + 4 * i;
            if (center_point_box) {
                const float hw = r[2] / 2.0f, hh = r[3] / 2.0f;
                c[0] = r[0] - hw; c[1] = r[1] - hh; c[2] = r[0] + hw; c[3] = r[1] + hh;
            } else {
                c[0] = r[1] < r[3] ? r[1] : r[3]; c[1] = r[0] < r[2] ? r[0] : r[2];
                c[2] = r[1] > r[3] ? r[1] : r[3]; c[3] = r[0] > r[2] ? r[0] : r[2];
            }
            area[i] = (c[2] - c[0]) * (c[3] - c[1]);
        }
        for (int64_t k = 0; k < C; ++k) {
            const float* s = scores + (b * C + k) * N;
            int64_t n = 0;
            for (int64_t i = 0; i < N; ++i)
                if (!has_score_threshold || s[i] > score_threshold) { cand[n].score = s[i]; cand[n].index = i; ++n; }
            qsort(cand, (size_t)n, sizeof(ss_nms_candidate), ss_nms_order);
            ss_nms_grid_reset(&grid, max_nb, corners, cand, n);
            int64_t nkept = 0;
            for (int64_t t = 0; t < n && nkept < max_out; ++t) {
                const int64_t j = cand[t].index;
                const float* c = corners + 4 * j;
                const int64_t first = ss_nms_bucket(&grid, c[0]), last = ss_nms_bucket(&grid, c[2]);
                int hit = 0;
                for (int64_t u = first; u <= last && !hit; ++u)
                    for (int64_t e = 0; e < grid.len[u]; ++e) {
                        const int32_t q = grid.items[u][e];
                        if (tested[q] == t) continue;
                        tested[q] = t;
                        if (ss_nms_suppresses(kx0, ky0, kx1, ky1, karea, q, c, area[j], iou_threshold)) {
                            hit = 1;
                            break;
                        }
                    }
                if (hit) continue;
                kx0[nkept] = c[0]; ky0[nkept] = c[1]; kx1[nkept] = c[2]; ky1[nkept] = c[3];
                karea[nkept] = area[j];
                tested[nkept] = -1;
                /* A box with a NaN corner suppresses nothing (its IoU is NaN): not listed. */
                if (c[0] == c[0] && c[1] == c[1] && c[2] == c[2] && c[3] == c[3])
                    for (int64_t u = first; u <= last; ++u)
                        if (!ss_nms_grid_add(&grid, u, (int32_t)nkept)) {
                            count = -1;
                            goto done;
                        }
                ++nkept;
                if (out) { out[3 * count] = b; out[3 * count + 1] = k; out[3 * count + 2] = j; }
                ++count;
            }
        }
    }
done:
    for (int64_t i = 0; grid.items && i < max_nb; ++i) free(grid.items[i]);
    free(grid.items); free(grid.len); free(grid.cap);
    free(corners); free(cand); free(kept); free(tested);
    return count;""")


def fragment() -> Fragment:
    return Fragment([
        Private(_HELPERS),
        _NMS,
    ])


def source() -> str:
    return fragment().text()
