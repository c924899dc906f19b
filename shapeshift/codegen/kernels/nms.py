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
"""

from __future__ import annotations

DEPENDS: tuple[str, ...] = ()

_SOURCE = r"""
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

/* Does any of the n kept boxes suppress box c (corners x0, y0, x1, y1; area ac)? The IoU
   test of shapeshift/ops/detection.py in float32 (union = kept area + candidate area -
   intersection, in that order), with no early exit so that it vectorizes. */
static int ss_nms_suppressed(const float* restrict kx0, const float* restrict ky0, const float* restrict kx1,
                             const float* restrict ky1, const float* restrict karea, int64_t n,
                             const float* c, float ac, float threshold) {
    int hit = 0;
    for (int64_t q = 0; q < n; ++q) {
        const float ix = (kx1[q] < c[2] ? kx1[q] : c[2]) - (kx0[q] > c[0] ? kx0[q] : c[0]);
        const float iy = (ky1[q] < c[3] ? ky1[q] : c[3]) - (ky0[q] > c[1] ? ky0[q] : c[1]);
        const float inter = ix * iy;
        const float uni = karea[q] + ac - inter;
        hit |= (ix > 0.0f) & (iy > 0.0f) & (inter > 0.0f) & (karea[q] > 0.0f) & (ac > 0.0f) & (uni > 0.0f)
               & (inter / uni > threshold);
    }
    return hit;
}

int64_t ss_nms(const float* boxes, const float* scores, int64_t B, int64_t C, int64_t N,
               int64_t max_out, float iou_threshold, int has_score_threshold,
               float score_threshold, int center_point_box, int64_t* out) {
    if (max_out <= 0 || B <= 0 || C <= 0 || N <= 0) return 0;
    float* corners = (float*)malloc(sizeof(float) * 5 * N);
    ss_nms_candidate* cand = (ss_nms_candidate*)malloc(sizeof(ss_nms_candidate) * N);
    /* The kept boxes' corners and areas, one array each: the test of a candidate against
       all of them is then one branch-free loop that GCC vectorizes. */
    float* kept = (float*)malloc(sizeof(float) * 5 * N);
    if (!corners || !cand || !kept) { free(corners); free(cand); free(kept); return -1; }
    float* area = corners + 4 * N;
    float *kx0 = kept, *ky0 = kept + N, *kx1 = kept + 2 * N, *ky1 = kept + 3 * N, *karea = kept + 4 * N;
    int64_t count = 0;
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
            int64_t nkept = 0;
            for (int64_t t = 0; t < n && nkept < max_out; ++t) {
                const int64_t j = cand[t].index;
                if (ss_nms_suppressed(kx0, ky0, kx1, ky1, karea, nkept, corners + 4 * j, area[j], iou_threshold))
                    continue;
                kx0[nkept] = corners[4 * j]; ky0[nkept] = corners[4 * j + 1];
                kx1[nkept] = corners[4 * j + 2]; ky1[nkept] = corners[4 * j + 3];
                karea[nkept] = area[j];
                ++nkept;
                if (out) { out[3 * count] = b; out[3 * count + 1] = k; out[3 * count + 2] = j; }
                ++count;
            }
        }
    }
    free(corners); free(cand); free(kept);
    return count;
}
"""


def source() -> str:
    return _SOURCE
