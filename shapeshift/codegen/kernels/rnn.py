"""Recurrent kernels: LSTM, and RNN and GRU (the ONNX ops of the same names, float32).

Exported C (LSTM: default activations, no peepholes, layout 0)::

    /* X [T, B, I], W [D, 4H, I], R [D, 4H, H], bias NULL or [D, 8H] (Wb then Rb),
       h0 / c0 NULL (zeros) or [D, B, H]; outputs Y NULL or [T, D, B, H], Y_h NULL or
       [D, B, H], Y_c NULL or [D, B, H]. direction: 0 forward, 1 reverse (D = 1),
       2 bidirectional (D = 2). Gate order i, o, f, c; i, o, f use sigmoid, c and the
       output tanh. sequence_lens is not supported (the caller falls back).
       work: at least ss_lstm_work_size(T, B, I, H) floats. */
    void ss_lstm(const float* X, const float* W, const float* R, const float* bias,
                 const float* h0, const float* c0, float* Y, float* Y_h, float* Y_c,
                 int64_t T, int64_t B, int64_t I, int64_t H, int direction, float* work);
    int64_t ss_lstm_work_size(int64_t T, int64_t B, int64_t I, int64_t H);

Per direction: one ss_gemm computes the input projections of all time steps at once
(X W^T + Wb + Rb, [T * B, 4H]); each step is then one small ss_gemm (h R^T, with that
step's projection as the bias operand) and a pointwise gate update. The directions run
one after the other and reuse the same workspace.

RNN and GRU (every ONNX attribute: layout, sequence_lens, activation lists, clip)::

    /* X [T, B, I] (layout 0) or [B, T, I] (layout 1); W [D, G*H, I], R [D, G*H, H] with
       G = 1 (RNN) or 3 (GRU, gate order z, r, h); bias NULL or [D, 2*G*H] (Wb then Rb);
       seq_lens NULL or [B] (int32); h0 NULL (zeros) or [D, B, H] (layout 0) /
       [B, D, H] (layout 1). Outputs, each NULL or written: Y [T, D, B, H] / [B, T, D, H],
       Y_h [D, B, H] / [B, D, H]. direction: 0 forward, 1 reverse (D = 1),
       2 bidirectional (D = 2). acts/alphas/betas: NULL for the defaults (RNN: Tanh; GRU:
       Sigmoid, Tanh), else A activations per direction ([D * A], A = 1 RNN, 2 GRU; codes in
       ACTIVATION_CODES) and their alpha and beta. clip < 0: no clipping, else every
       activation's input is clipped to [-clip, clip]. A row b past its seq_lens[b] keeps
       its state and gets zero outputs; a row of length 0 reports a zero Y_h (as
       onnxruntime). work: at least ss_rnn_work_size / ss_gru_work_size(T, B, I, H) floats. */
    void ss_rnn(const float* X, const float* W, const float* R, const float* bias,
                const int32_t* seq_lens, const float* h0, float* Y, float* Y_h,
                int64_t T, int64_t B, int64_t I, int64_t H, int direction, int layout,
                const int32_t* acts, const float* alphas, const float* betas, float clip,
                float* work);
    void ss_gru(const float* X, const float* W, const float* R, const float* bias,
                const int32_t* seq_lens, const float* h0, float* Y, float* Y_h,
                int64_t T, int64_t B, int64_t I, int64_t H, int direction, int layout,
                int linear_before_reset, const int32_t* acts, const float* alphas,
                const float* betas, float clip, float* work);
    int64_t ss_rnn_work_size(int64_t T, int64_t B, int64_t I, int64_t H);
    int64_t ss_gru_work_size(int64_t T, int64_t B, int64_t I, int64_t H);

They run like ss_lstm: per direction one ss_gemm projects every step's input
(X W^T + the biases that add outside any product, rows in X's own order, so layout 1
needs no transposition), then each step is one ss_gemm of the state with R (GRU without
linear_before_reset: two, since the candidate's product reads r * h) and a pointwise
update, parallel over batch rows. Activations are scalar libm calls, like ss_lstm's:
the fragment is built without vmath (tests/codegen/test_kernels_rnn.py builds it on gemm
alone).
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Private, fill

DEPENDS = ("gemm",)

_LSTM_DEFINES = r"""
/* ---- rnn ---- */
/* Gate elements (B * H) below which the pointwise update stays serial. */
#define SS_LSTM_PAR_MIN @PAR_MIN@
"""

_LSTM_HELPERS = r"""
static inline float ss_lstm_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

"""

_LSTM_WORK_SIZE = Function("int64_t", "ss_lstm_work_size", ("int64_t T", "int64_t B", "int64_t I", "int64_t H"), r"""
    (void)I;
    return T * B * 4 * H + B * 4 * H + 4 * H + 2 * B * H;""")

_LSTM_DIRECTION = r"""
/* One direction d: reads W, R, bias of d, writes Y[:, d], Y_h[d], Y_c[d]. */
static void ss_lstm_direction(const float* X, const float* W, const float* R, const float* bias,
                              const float* h0, const float* c0, float* Y, float* Y_h, float* Y_c,
                              int64_t T, int64_t B, int64_t I, int64_t H, int64_t D, int64_t d,
                              int reverse, float* work) {
    int64_t G = 4 * H;
    float* xw = work;
    float* gates = xw + T * B * G;
    float* bsum = gates + B * G;
    float* h = bsum + G;
    float* c = h + B * H;
    if (bias)
        for (int64_t g = 0; g < G; ++g) bsum[g] = bias[d * 2 * G + g] + bias[d * 2 * G + G + g];
    ss_gemm(T * B, G, I, 1, 1, X, 0, 0, I, 1, W + d * G * I, 0, 0, 1, I, xw, 0, 0, G,
            1.0f, bias ? bsum : NULL, 1.0f, 0, 1, 0);
    for (int64_t i = 0; i < B * H; ++i) {
        h[i] = h0 ? h0[d * B * H + i] : 0.0f;
        c[i] = c0 ? c0[d * B * H + i] : 0.0f;
    }
    for (int64_t s = 0; s < T; ++s) {
        int64_t t = reverse ? T - 1 - s : s;
        ss_gemm(B, G, H, 1, 1, h, 0, 0, H, 1, R + d * G * H, 0, 0, 1, H, gates, 0, 0, G,
                1.0f, xw + t * B * G, 1.0f, G, 1, 0);
        #pragma omp parallel for if(B * H >= SS_LSTM_PAR_MIN)
        for (int64_t b = 0; b < B; ++b) {
            const float* gr = gates + b * G;
            for (int64_t j = 0; j < H; ++j) {
                float gi = ss_lstm_sigmoid(gr[j]), go = ss_lstm_sigmoid(gr[H + j]);
                float gf = ss_lstm_sigmoid(gr[2 * H + j]), gc = tanhf(gr[3 * H + j]);
                float cn = gf * c[b * H + j] + gi * gc;
                c[b * H + j] = cn;
                h[b * H + j] = go * tanhf(cn);
            }
        }
        if (Y) memcpy(Y + ((t * D + d) * B) * H, h, (size_t)(B * H) * sizeof(float));
    }
    if (Y_h) memcpy(Y_h + d * B * H, h, (size_t)(B * H) * sizeof(float));
    if (Y_c) memcpy(Y_c + d * B * H, c, (size_t)(B * H) * sizeof(float));
}

"""

_LSTM = Function("void", "ss_lstm", ("const float* X", "const float* W", "const float* R", "const float* bias",
                                     "const float* h0", "const float* c0", "float* Y", "float* Y_h", "float* Y_c",
                                     "int64_t T", "int64_t B", "int64_t I", "int64_t H", "int direction",
                                     "float* work"), r"""
    if (B <= 0 || H <= 0) return;
    int64_t D = direction == 2 ? 2 : 1;
    for (int64_t d = 0; d < D; ++d)
        ss_lstm_direction(X, W, R, bias, h0, c0, Y, Y_h, Y_c, T, B, I, H, D, d,
                          direction == 1 || d == 1, work);""")


# -- RNN and GRU ------------------------------------------------------------------------------

#: ONNX activation name (lowercased) -> the code ss_rnn and ss_gru take in ``acts``.
ACTIVATION_CODES = {
    "sigmoid": 0, "tanh": 1, "relu": 2, "affine": 3, "leakyrelu": 4, "thresholdedrelu": 5,
    "scaledtanh": 6, "hardsigmoid": 7, "elu": 8, "softsign": 9, "softplus": 10,
}

_RECUR_DEFINES = """
#define SS_RECUR_PAR_MIN @PAR_MIN@
"""

_RECUR_HELPERS = r"""
/* ---- rnn: RNN and GRU ---- */
/* One activation of one direction: a code of ACTIVATION_CODES and its alpha, beta. */
typedef struct { int kind; float alpha, beta; } ss_recur_act;

/* Where each row lives, in elements, for one layout and D directions; rows are H floats
   (Y, states) or G floats (the input projection, which keeps X's row order). */
typedef struct {
    int64_t T, B, H, G;
    int64_t xw_t, xw_b;       /* projection row (t, b) */
    int64_t y_t, y_b, y_d;    /* Y row (t, d, b) */
    int64_t s_b, s_d;         /* initial_h / Y_h row (d, b) */
} ss_recur_geom;

static ss_recur_geom ss_recur_geometry(int64_t T, int64_t B, int64_t H, int64_t G, int64_t D, int layout) {
    ss_recur_geom g;
    g.T = T; g.B = B; g.H = H; g.G = G;
    if (layout == 0) {   /* X [T, B, I], Y [T, D, B, H], states [D, B, H] */
        g.xw_t = B * G; g.xw_b = G;
        g.y_t = D * B * H; g.y_b = H; g.y_d = B * H;
        g.s_b = H; g.s_d = B * H;
    } else {             /* X [B, T, I], Y [B, T, D, H], states [B, D, H] */
        g.xw_t = G; g.xw_b = T * G;
        g.y_t = D * H; g.y_b = T * D * H; g.y_d = H;
        g.s_b = D * H; g.s_d = H;
    }
    return g;
}

static inline float ss_recur_sigmoid(float v) {
    /* Split by sign so that expf never overflows into inf / inf. */
    if (v >= 0.0f) return 1.0f / (1.0f + expf(-v));
    float e = expf(v);
    return e / (1.0f + e);
}

static inline float ss_recur_softplus(float v) {
    return v > 0.0f ? v + log1pf(expf(-v)) : log1pf(expf(v));
}

/* Clips v[0..n) to [-clip, clip] (clip < 0: no clipping), then applies the activation in
   place. The switch sits outside the loops so that each loop is a simple one. Comparisons
   are ordered so that NaN propagates where the reference evaluator's does. */
static void ss_recur_activate(ss_recur_act a, float clip, float* v, int64_t n) {
    const float al = a.alpha, be = a.beta;
    if (clip >= 0.0f)
        for (int64_t j = 0; j < n; ++j) v[j] = v[j] < -clip ? -clip : (v[j] > clip ? clip : v[j]);
    switch (a.kind) {
    case 0:  /* Sigmoid */ for (int64_t j = 0; j < n; ++j) v[j] = ss_recur_sigmoid(v[j]); break;
    case 1:  /* Tanh */ for (int64_t j = 0; j < n; ++j) v[j] = tanhf(v[j]); break;
    case 2:  /* Relu */ for (int64_t j = 0; j < n; ++j) v[j] = v[j] < 0.0f ? 0.0f : v[j]; break;
    case 3:  /* Affine */ for (int64_t j = 0; j < n; ++j) v[j] = al * v[j] + be; break;
    case 4:  /* LeakyRelu */ for (int64_t j = 0; j < n; ++j) v[j] = v[j] < 0.0f ? al * v[j] : v[j]; break;
    case 5:  /* ThresholdedRelu */ for (int64_t j = 0; j < n; ++j) v[j] = v[j] > al ? v[j] : 0.0f; break;
    case 6:  /* ScaledTanh */ for (int64_t j = 0; j < n; ++j) v[j] = al * tanhf(be * v[j]); break;
    case 7:  /* HardSigmoid */
        for (int64_t j = 0; j < n; ++j) {
            float u = al * v[j] + be;
            v[j] = u < 0.0f ? 0.0f : (u > 1.0f ? 1.0f : u);
        }
        break;
    case 8:  /* Elu */ for (int64_t j = 0; j < n; ++j) v[j] = v[j] < 0.0f ? al * expm1f(v[j]) : v[j]; break;
    case 9:  /* Softsign */ for (int64_t j = 0; j < n; ++j) v[j] = v[j] / (1.0f + fabsf(v[j])); break;
    case 10:  /* Softplus */ for (int64_t j = 0; j < n; ++j) v[j] = ss_recur_softplus(v[j]); break;
    default: break;
    }
}

/* Activation k (of `count` per direction) of direction d, or `fallback` without a list. */
static ss_recur_act ss_recur_act_of(const int32_t* acts, const float* alphas, const float* betas,
                                    int64_t d, int count, int k, int fallback) {
    ss_recur_act a = {fallback, 0.0f, 0.0f};
    if (acts) {
        a.kind = acts[d * count + k];
        a.alpha = alphas ? alphas[d * count + k] : 0.0f;
        a.beta = betas ? betas[d * count + k] : 0.0f;
    }
    return a;
}

/* xw = X W_d^T + bsum (NULL: none): [rows, G], one row per row of X. */
static void ss_recur_project(const float* X, const float* Wd, const float* bsum, float* xw,
                             int64_t rows, int64_t G, int64_t I) {
    ss_gemm(rows, G, I, 1, 1, X, 0, 0, I, 1, Wd, 0, 0, 1, I, xw, 0, 0, G, 1.0f, bsum, 1.0f, 0, 1, 0);
}

/* out[b, 0..n) (row stride ldo) = state[b] Rrows^T + bias (an n-vector for every row, or
   NULL); Rrows is [n, H], rows of R. */
static void ss_recur_step_gemm(const float* state, const float* Rrows, const float* bias, float* out,
                               int64_t B, int64_t n, int64_t H, int64_t ldo) {
    ss_gemm(B, n, H, 1, 1, state, 0, 0, H, 1, Rrows, 0, 0, 1, H, out, 0, 0, ldo, 1.0f, bias, 1.0f, 0, 1, 0);
}

static inline int ss_recur_active(const int32_t* lens, int64_t b, int64_t t) {
    return !lens || t < (int64_t)lens[b];
}

/* h[b] = initial_h[d, b], zeros without one. */
static void ss_recur_load_state(const float* h0, float* h, const ss_recur_geom* g, int64_t d) {
    for (int64_t b = 0; b < g->B; ++b) {
        if (h0) memcpy(h + b * g->H, h0 + d * g->s_d + b * g->s_b, (size_t)g->H * sizeof(float));
        else memset(h + b * g->H, 0, (size_t)g->H * sizeof(float));
    }
}

/* Y[t, d, b] = row b's new state while the row is active, zeros past its length. */
static inline void ss_recur_store_output(float* Y, const float* hb, const ss_recur_geom* g,
                                         int64_t t, int64_t d, int64_t b, int active) {
    if (!Y) return;
    float* yr = Y + t * g->y_t + b * g->y_b + d * g->y_d;
    if (active) memcpy(yr, hb, (size_t)g->H * sizeof(float));
    else memset(yr, 0, (size_t)g->H * sizeof(float));
}

/* Y_h[d, b] = h[b]; a row of length 0 reports zeros (onnxruntime's choice), not h0. */
static void ss_recur_store_state(float* Y_h, const float* h, const int32_t* lens, const ss_recur_geom* g,
                                 int64_t d) {
    if (!Y_h) return;
    for (int64_t b = 0; b < g->B; ++b) {
        float* out = Y_h + d * g->s_d + b * g->s_b;
        if (lens && lens[b] <= 0) memset(out, 0, (size_t)g->H * sizeof(float));
        else memcpy(out, h + b * g->H, (size_t)g->H * sizeof(float));
    }
}

"""

_RNN_WORK_SIZE = Function("int64_t", "ss_rnn_work_size", ("int64_t T", "int64_t B", "int64_t I", "int64_t H"), r"""
    (void)I;
    return T * B * H + 2 * B * H + H;   /* xw, gates, h, bias sum */""")

_RNN_DIRECTION = r"""
/* One RNN direction: h = f(xw[t] + h R_d^T), xw holding X W_d^T + Wb + Rb. */
static void ss_rnn_direction(const float* X, const float* W, const float* R, const float* bias,
                             const int32_t* lens, const float* h0, float* Y, float* Y_h,
                             const ss_recur_geom* g, int64_t I, int64_t d, int reverse,
                             ss_recur_act f, float clip, float* work) {
    const int64_t T = g->T, B = g->B, H = g->H;
    float* xw = work;
    float* gates = xw + T * B * H;
    float* h = gates + B * H;
    float* bsum = h + B * H;
    if (bias)
        for (int64_t j = 0; j < H; ++j) bsum[j] = bias[d * 2 * H + j] + bias[d * 2 * H + H + j];
    ss_recur_project(X, W + d * H * I, bias ? bsum : NULL, xw, T * B, H, I);
    ss_recur_load_state(h0, h, g, d);
    for (int64_t s = 0; s < T; ++s) {
        const int64_t t = reverse ? T - 1 - s : s;
        ss_recur_step_gemm(h, R + d * H * H, NULL, gates, B, H, H, H);
        #pragma omp parallel for if(B * H >= SS_RECUR_PAR_MIN)
        for (int64_t b = 0; b < B; ++b) {
            const int active = ss_recur_active(lens, b, t);
            float* hb = h + b * H;
            if (active) {
                const float* x = xw + t * g->xw_t + b * g->xw_b;
                const float* gr = gates + b * H;
                for (int64_t j = 0; j < H; ++j) hb[j] = x[j] + gr[j];
                ss_recur_activate(f, clip, hb, H);
            }
            ss_recur_store_output(Y, hb, g, t, d, b, active);
        }
    }
    ss_recur_store_state(Y_h, h, lens, g, d);
}

"""

_RNN = Function("void", "ss_rnn", ("const float* X", "const float* W", "const float* R", "const float* bias",
                                   "const int32_t* seq_lens", "const float* h0", "float* Y", "float* Y_h", "int64_t T",
                                   "int64_t B", "int64_t I", "int64_t H", "int direction", "int layout",
                                   "const int32_t* acts", "const float* alphas", "const float* betas", "float clip",
                                   "float* work"), r"""
    if (B <= 0 || H <= 0) return;
    const int64_t D = direction == 2 ? 2 : 1;
    const ss_recur_geom g = ss_recur_geometry(T, B, H, H, D, layout);
    for (int64_t d = 0; d < D; ++d)
        ss_rnn_direction(X, W, R, bias, seq_lens, h0, Y, Y_h, &g, I, d, direction == 1 || d == 1,
                         ss_recur_act_of(acts, alphas, betas, d, 1, 0, 1), clip, work);""")

_GRU_WORK_SIZE = Function("int64_t", "ss_gru_work_size", ("int64_t T", "int64_t B", "int64_t I", "int64_t H"), r"""
    (void)I;
    return 3 * T * B * H + 5 * B * H + 6 * H;   /* xw, gates, h, r * h, bias sum, recurrent bias */""")

_GRU_HELPERS = r"""
/* The biases of direction d, split by where they add: bsum[3H] joins the input
   projection (Wb + Rb, but only Wbh for the candidate under linear_before_reset, whose
   Rbh is multiplied by r), rbias[3H] the recurrent product (zeros but that Rbh). */
static void ss_gru_biases(const float* bias, int64_t d, int64_t H, int linear_before_reset,
                          float* bsum, float* rbias) {
    const float* wb = bias + d * 6 * H;
    const float* rb = wb + 3 * H;
    for (int64_t j = 0; j < 3 * H; ++j) {
        const int recurrent_only = linear_before_reset && j >= 2 * H;
        bsum[j] = wb[j] + (recurrent_only ? 0.0f : rb[j]);
        rbias[j] = recurrent_only ? rb[j] : 0.0f;
    }
}

/* z and r of one row: gr[0..2H) = f(x[0..2H) + gr[0..2H)), in place. */
static inline void ss_gru_update_reset(float* gr, const float* x, int64_t H, ss_recur_act f, float clip) {
    for (int64_t j = 0; j < 2 * H; ++j) gr[j] += x[j];
    ss_recur_activate(f, clip, gr, 2 * H);
}

/* The new state of one row from z (gr[0..H)) and the candidate's pre-activation cand:
   hb = (1 - z) g(cand) + z hb. */
static inline void ss_gru_blend(const float* z, float* cand, float* hb, int64_t H, ss_recur_act gact,
                                float clip) {
    ss_recur_activate(gact, clip, cand, H);
    for (int64_t j = 0; j < H; ++j) hb[j] = (1.0f - z[j]) * cand[j] + z[j] * hb[j];
}

/* One step, linear_before_reset: a single product h R^T (+ Rbh) serves all three gates;
   the candidate is g(xh + r * (h Rh^T + Rbh)). */
static void ss_gru_step_linear_before_reset(const float* xw, const float* R_d, const float* rbias,
                                            float* gates, float* h, float* Y, const int32_t* lens,
                                            const ss_recur_geom* g, int64_t t, int64_t d,
                                            ss_recur_act f, ss_recur_act gact, float clip) {
    const int64_t B = g->B, H = g->H, G = g->G;
    ss_recur_step_gemm(h, R_d, rbias, gates, B, G, H, G);
    #pragma omp parallel for if(B * G >= SS_RECUR_PAR_MIN)
    for (int64_t b = 0; b < B; ++b) {
        const int active = ss_recur_active(lens, b, t);
        float* hb = h + b * H;
        if (active) {
            const float* x = xw + t * g->xw_t + b * g->xw_b;
            float* gr = gates + b * G;
            ss_gru_update_reset(gr, x, H, f, clip);
            for (int64_t j = 0; j < H; ++j) gr[2 * H + j] = x[2 * H + j] + gr[H + j] * gr[2 * H + j];
            ss_gru_blend(gr, gr + 2 * H, hb, H, gact, clip);
        }
        ss_recur_store_output(Y, hb, g, t, d, b, active);
    }
}

/* One step, reset first: z, r from h [Rz; Rr]^T, then the candidate g(xh + (r * h) Rh^T),
   a second product since it reads r. */
static void ss_gru_step_reset_first(const float* xw, const float* R_d, float* gates, float* h, float* rh,
                                    float* Y, const int32_t* lens, const ss_recur_geom* g, int64_t t,
                                    int64_t d, ss_recur_act f, ss_recur_act gact, float clip) {
    const int64_t B = g->B, H = g->H, G = g->G;
    ss_recur_step_gemm(h, R_d, NULL, gates, B, 2 * H, H, G);
    #pragma omp parallel for if(B * G >= SS_RECUR_PAR_MIN)
    for (int64_t b = 0; b < B; ++b) {   /* every row: rh must be defined for the product */
        float* gr = gates + b * G;
        ss_gru_update_reset(gr, xw + t * g->xw_t + b * g->xw_b, H, f, clip);
        for (int64_t j = 0; j < H; ++j) rh[b * H + j] = gr[H + j] * h[b * H + j];
    }
    ss_recur_step_gemm(rh, R_d + 2 * H * H, NULL, gates + 2 * H, B, H, H, G);
    #pragma omp parallel for if(B * G >= SS_RECUR_PAR_MIN)
    for (int64_t b = 0; b < B; ++b) {
        const int active = ss_recur_active(lens, b, t);
        float* hb = h + b * H;
        if (active) {
            const float* x = xw + t * g->xw_t + b * g->xw_b;
            float* gr = gates + b * G;
            for (int64_t j = 0; j < H; ++j) gr[2 * H + j] += x[2 * H + j];
            ss_gru_blend(gr, gr + 2 * H, hb, H, gact, clip);
        }
        ss_recur_store_output(Y, hb, g, t, d, b, active);
    }
}

static void ss_gru_direction(const float* X, const float* W, const float* R, const float* bias,
                             const int32_t* lens, const float* h0, float* Y, float* Y_h,
                             const ss_recur_geom* g, int64_t I, int64_t d, int reverse,
                             int linear_before_reset, ss_recur_act f, ss_recur_act gact, float clip,
                             float* work) {
    const int64_t T = g->T, B = g->B, H = g->H, G = g->G;
    float* xw = work;
    float* gates = xw + T * B * G;
    float* h = gates + B * G;
    float* rh = h + B * H;
    float* bsum = rh + B * H;
    float* rbias = bsum + G;
    const float* R_d = R + d * G * H;
    if (bias) ss_gru_biases(bias, d, H, linear_before_reset, bsum, rbias);
    ss_recur_project(X, W + d * G * I, bias ? bsum : NULL, xw, T * B, G, I);
    ss_recur_load_state(h0, h, g, d);
    for (int64_t s = 0; s < T; ++s) {
        const int64_t t = reverse ? T - 1 - s : s;
        if (linear_before_reset)
            ss_gru_step_linear_before_reset(xw, R_d, bias ? rbias : NULL, gates, h, Y, lens, g, t, d, f, gact, clip);
        else
            ss_gru_step_reset_first(xw, R_d, gates, h, rh, Y, lens, g, t, d, f, gact, clip);
    }
    ss_recur_store_state(Y_h, h, lens, g, d);
}

"""

_GRU = Function("void", "ss_gru", ("const float* X", "const float* W", "const float* R", "const float* bias",
                                   "const int32_t* seq_lens", "const float* h0", "float* Y", "float* Y_h", "int64_t T",
                                   "int64_t B", "int64_t I", "int64_t H", "int direction", "int layout",
                                   "int linear_before_reset", "const int32_t* acts", "const float* alphas",
                                   "const float* betas", "float clip", "float* work"), r"""
    if (B <= 0 || H <= 0) return;
    const int64_t D = direction == 2 ? 2 : 1;
    const ss_recur_geom g = ss_recur_geometry(T, B, H, 3 * H, D, layout);
    for (int64_t d = 0; d < D; ++d)
        ss_gru_direction(X, W, R, bias, seq_lens, h0, Y, Y_h, &g, I, d, direction == 1 || d == 1,
                         linear_before_reset, ss_recur_act_of(acts, alphas, betas, d, 2, 0, 0),
                         ss_recur_act_of(acts, alphas, betas, d, 2, 1, 1), clip, work);""")


def rnn_work_floats(T, B, H):
    """Floats ss_rnn needs (ss_rnn_work_size); works on symbolic dims too."""
    return T * B * H + 2 * B * H + H


def gru_work_floats(T, B, H):
    """Floats ss_gru needs (ss_gru_work_size); works on symbolic dims too."""
    return 3 * T * B * H + 5 * B * H + 6 * H


def fragment(par_min: int = 4096) -> Fragment:
    """The fragment (LSTM, RNN, GRU); ``par_min`` is the gate count (B * H; B * 3H for GRU)
    below which a step's pointwise update stays serial."""
    return Fragment([
        Private(fill(_LSTM_DEFINES, PAR_MIN=int(par_min))),
        Private(_LSTM_HELPERS),
        _LSTM_WORK_SIZE,
        Private(_LSTM_DIRECTION),
        _LSTM,
        Private(fill(_RECUR_DEFINES, PAR_MIN=int(par_min))),
        Private(_RECUR_HELPERS),
        _RNN_WORK_SIZE,
        Private(_RNN_DIRECTION),
        _RNN,
        _GRU_WORK_SIZE,
        Private(_GRU_HELPERS),
        _GRU,
    ])


def source(par_min: int = 4096) -> str:
    return fragment(par_min).text()
