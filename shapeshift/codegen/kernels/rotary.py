"""Rotary position embedding (ONNX RotaryEmbedding-23, float32).

Exported C::

    /* y = x with the first `rot` features of every head rotated by the angle of its token's
       position. x and y hold B * S * H rows of D features (one head of one token); the row
       (b, s, h) starts at b * stride_b + s * stride_s + h * stride_h, in both tensors (a 4-D
       [B, H, S, D] input and a 3-D [B, S, H * D] one differ only in strides). The cos and sin
       caches are rows of `half` values: row position_ids[b * S + s] (negative ids count from
       max_pos, as Gather's) when position_ids is not NULL, else row b * S + s.
       Pairs (x1, x2) -> (cos * x1 - sin * x2, sin * x1 + cos * x2) are features (2k, 2k + 1)
       when interleaved, else (k, k + half); features rot..D are copied unchanged.
       Returns 0, or 1 when a position id is outside [-max_pos, max_pos), 2 when the shapes
       disagree (rot odd or above D, or half != rot / 2); y is then not written. */
    int ss_rotary_embedding(const float* x, const float* cos_cache, const float* sin_cache,
                            const int64_t* position_ids, float* y, int64_t B, int64_t S, int64_t H,
                            int64_t D, int64_t rot, int64_t half, int64_t max_pos,
                            int64_t stride_b, int64_t stride_s, int64_t stride_h, int interleaved);

The rotation is computed as written above in float, two products and one sum each, the
way the reference evaluator and the ONNX function body do (GCC does not contract them into
FMAs under -std=c11). Position ids are checked in one serial pass before the parallel loop,
which is over the B * S * H rows.
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Private, fill

DEPENDS: tuple[str, ...] = ()

_DEFINES = r"""
/* ---- rotary ---- */
/* Rows times features below which the loop stays serial. */
#define SS_ROTARY_PAR_MIN @PAR_MIN@
"""

_HELPERS = r"""
/* The cache row of token (b, s), or -1 when its position id is out of range. */
static inline int64_t ss_rotary_row(const int64_t* position_ids, int64_t token, int64_t max_pos) {
    if (!position_ids) return token;
    int64_t p = position_ids[token];
    if (p < 0) p += max_pos;
    return p >= 0 && p < max_pos ? p : -1;
}

"""

_ROTARY_EMBEDDING = Function("int", "ss_rotary_embedding", ("const float* x", "const float* cos_cache",
                                                            "const float* sin_cache", "const int64_t* position_ids",
                                                            "float* y", "int64_t B", "int64_t S", "int64_t H",
                                                            "int64_t D", "int64_t rot", "int64_t half",
                                                            "int64_t max_pos", "int64_t stride_b", "int64_t stride_s",
                                                            "int64_t stride_h", "int interleaved"), r"""
    if (rot < 0 || rot % 2 != 0 || rot > D || half * 2 != rot) return 2;
    for (int64_t t = 0; t < B * S; ++t)
        if (ss_rotary_row(position_ids, t, max_pos) < 0) return 1;
    int64_t rows = B * S * H;
    #pragma omp parallel for if(rows * D >= SS_ROTARY_PAR_MIN)
    for (int64_t r = 0; r < rows; ++r) {
        int64_t token = r / H, h = r % H, b = token / S, s = token % S;
        int64_t at = b * stride_b + s * stride_s + h * stride_h;
        const float* xr = x + at;
        float* yr = y + at;
        int64_t row = ss_rotary_row(position_ids, token, max_pos);
        const float* c = cos_cache + row * half;
        const float* sn = sin_cache + row * half;
        /* Where the two halves of each rotated pair are: (2k, 2k + 1) or (k, k + half). */
        int64_t step = interleaved ? 2 : 1, partner = interleaved ? 1 : half;
        for (int64_t k = 0; k < half; ++k) {
            float x1 = xr[k * step], x2 = xr[k * step + partner];
            yr[k * step] = c[k] * x1 - sn[k] * x2;
            yr[k * step + partner] = sn[k] * x1 + c[k] * x2;
        }
        for (int64_t d = rot; d < D; ++d) yr[d] = xr[d];
    }
    return 0;""")


def fragment(par_min: int = 32768) -> Fragment:
    """The rotary fragment; ``par_min`` is the work (rows times features) below which the loop stays serial."""
    return Fragment([
        Private(fill(_DEFINES, PAR_MIN=int(par_min))),
        Private(_HELPERS),
        _ROTARY_EMBEDDING,
    ])


def source(par_min: int = 32768) -> str:
    return fragment(par_min).text()
