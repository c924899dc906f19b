"""Training-mode Dropout with a seed, drawing the numbers NumPy's legacy RandomState draws.

ONNX leaves training-mode Dropout's draws to the implementation. The reference
evaluator (and the ONNX test generator) keep element i where
``RandomState(seed).uniform(0, 1, shape).flat[i] >= ratio``; this kernel reproduces
those draws bit for bit, so a seeded Dropout gives the reference's result. The
generator is MT19937 seeded with ``init_genrand`` (NumPy's ``mt19937_seed``), each
uniform being a 53-bit double made of two 32-bit outputs (``mt19937_next_double``).
The draws are sequential, so the kernel runs on one thread.

Exported C signatures::

    /* y[i] = (x[i] * keep[i]) * scale, scale = 1 / (1 - ratio) (0 for ratio >= 1), computed
       in x's type as NumPy computes x * mask * scale; mask[i] = keep[i] unless mask is NULL.
       keep[i] = (i-th uniform draw of RandomState(seed) >= ratio). */
    void ss_dropout_f32(const float* x, float* y, uint8_t* mask, int64_t n, double ratio, uint32_t seed);
    void ss_dropout_f64(const double* x, double* y, uint8_t* mask, int64_t n, double ratio, uint32_t seed);
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Private, fill

DEPENDS: tuple[str, ...] = ()

_MT19937 = r"""
/* ---- dropout: MT19937, as NumPy's legacy RandomState runs it ---- */
#define SS_MT_N 624
#define SS_MT_M 397

typedef struct { uint32_t key[SS_MT_N]; int pos; } ss_mt_state;

static void ss_mt_seed(ss_mt_state* s, uint32_t seed) {
    for (int i = 0; i < SS_MT_N; i++) {
        s->key[i] = seed;
        seed = 1812433253u * (seed ^ (seed >> 30)) + (uint32_t)(i + 1);
    }
    s->pos = SS_MT_N;
}

static inline uint32_t ss_mt_twist(uint32_t upper, uint32_t lower, uint32_t far) {
    uint32_t y = (upper & 0x80000000u) | (lower & 0x7fffffffu);
    return far ^ (y >> 1) ^ ((0u - (y & 1u)) & 0x9908b0dfu);
}

static void ss_mt_refill(ss_mt_state* s) {
    uint32_t* k = s->key;
    int i = 0;
    for (; i < SS_MT_N - SS_MT_M; i++) k[i] = ss_mt_twist(k[i], k[i + 1], k[i + SS_MT_M]);
    for (; i < SS_MT_N - 1; i++) k[i] = ss_mt_twist(k[i], k[i + 1], k[i + SS_MT_M - SS_MT_N]);
    k[SS_MT_N - 1] = ss_mt_twist(k[SS_MT_N - 1], k[0], k[SS_MT_M - 1]);
    s->pos = 0;
}

static inline uint32_t ss_mt_next(ss_mt_state* s) {
    if (s->pos == SS_MT_N) ss_mt_refill(s);
    uint32_t y = s->key[s->pos++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* A uniform double in [0, 1) from 53 random bits. */
static inline double ss_mt_next_double(ss_mt_state* s) {
    uint32_t a = ss_mt_next(s) >> 5, b = ss_mt_next(s) >> 6;
    return ((double)a * 67108864.0 + (double)b) / 9007199254740992.0;
}
"""

# The body of ss_dropout_f32 and _f64; @T@ is the element type.
_DROPOUT_BODY = r"""
    ss_mt_state state;  /* 2.5 KB */
    ss_mt_seed(&state, seed);
    const @T@ scale = (@T@)(ratio < 1.0 ? 1.0 / (1.0 - ratio) : 0.0);
    for (int64_t i = 0; i < n; i++) {
        const uint8_t keep = ss_mt_next_double(&state) >= ratio;
        /* x * 0 rather than 0, as NumPy's product: -0 for negative x, NaN for inf. */
        y[i] = (x[i] * (@T@)keep) * scale;
        if (mask) mask[i] = keep;
    }"""


def _dropout(suffix: str, ctype: str) -> Function:
    return Function("void", f"ss_dropout_{suffix}", (f"const {ctype}* x", f"{ctype}* y", "uint8_t* mask", "int64_t n",
                                                     "double ratio", "uint32_t seed"), fill(_DROPOUT_BODY, T=ctype))


def fragment() -> Fragment:
    """The generator (private: only the two entry points draw from it), then the entry points."""
    return Fragment([Private(_MT19937), _dropout("f32", "float"), _dropout("f64", "double")])


def source() -> str:
    return fragment().text()
