"""Lp normalization along one axis (ONNX LpNormalization, p = 1 or 2, float32).

Exported C::

    /* y = x / ||x||_p along the middle axis of x viewed as [outer, n, inner] (y of the same
       shape); p is 1 (sum of |x|) or 2 (sqrt of the sum of squares). A zero norm gives 0,
       as the spec says, not NaN. */
    void ss_lp_normalize(const float* x, float* y, int64_t outer, int64_t n, int64_t inner, int p);

Norms are accumulated in double and rounded to float once; each output is then the float
quotient x / norm, the reference's division. The columns of one outer index are normalized
a block at a time (one double accumulator per column), so the passes over n read rows of
the block contiguously whatever the axis; OpenMP shares the (outer, block) pairs.
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Private, fill

DEPENDS: tuple[str, ...] = ()

_DEFINES = r"""
/* ---- lpnorm ---- */
/* Columns normalized together (one accumulator each). */
#define SS_LPNORM_BLOCK @BLOCK@
/* Elements below which the loop stays serial. */
#define SS_LPNORM_PAR_MIN @PAR_MIN@
"""

_LP_NORMALIZE = Function("void", "ss_lp_normalize", ("const float* x", "float* y", "int64_t outer", "int64_t n",
                                                     "int64_t inner", "int p"), r"""
    int64_t blocks = (inner + SS_LPNORM_BLOCK - 1) / SS_LPNORM_BLOCK;
    #pragma omp parallel for if(outer * n * inner >= SS_LPNORM_PAR_MIN)
    for (int64_t job = 0; job < outer * blocks; ++job) {
        int64_t o = job / blocks, first = (job % blocks) * SS_LPNORM_BLOCK;
        int64_t width = inner - first < SS_LPNORM_BLOCK ? inner - first : SS_LPNORM_BLOCK;
        const float* xb = x + o * n * inner + first;
        float* yb = y + o * n * inner + first;
        double acc[SS_LPNORM_BLOCK];
        float norm[SS_LPNORM_BLOCK];
        for (int64_t j = 0; j < width; ++j) acc[j] = 0.0;
        for (int64_t k = 0; k < n; ++k) {
            const float* row = xb + k * inner;
            if (p == 1) {
                for (int64_t j = 0; j < width; ++j) acc[j] += fabs((double)row[j]);
            } else {
                for (int64_t j = 0; j < width; ++j) acc[j] += (double)row[j] * (double)row[j];
            }
        }
        for (int64_t j = 0; j < width; ++j) norm[j] = (float)(p == 1 ? acc[j] : sqrt(acc[j]));
        for (int64_t k = 0; k < n; ++k) {
            const float* row = xb + k * inner;
            float* out = yb + k * inner;
            for (int64_t j = 0; j < width; ++j) out[j] = norm[j] == 0.0f ? 0.0f : row[j] / norm[j];
        }
    }""")


def fragment(block: int = 64, par_min: int = 32768) -> Fragment:
    """The Lp normalization fragment; ``block`` columns share a pass over the axis,
    ``par_min`` is the element count below which the loop stays serial."""
    return Fragment([
        Private(fill(_DEFINES, BLOCK=int(block), PAR_MIN=int(par_min))),
        _LP_NORMALIZE,
    ])


def source(block: int = 64, par_min: int = 32768) -> str:
    return fragment(block, par_min).text()
