"""LSTM kernel (ONNX LSTM, default activations, no peepholes, layout 0, float32).

Exported C::

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
"""

from __future__ import annotations

DEPENDS = ("gemm",)

_TEMPLATE = r"""
/* ---- rnn ---- */
/* Gate elements (B * H) below which the pointwise update stays serial. */
#define SS_LSTM_PAR_MIN {par_min}

static inline float ss_lstm_sigmoid(float v) {{ return 1.0f / (1.0f + expf(-v)); }}

int64_t ss_lstm_work_size(int64_t T, int64_t B, int64_t I, int64_t H) {{
    (void)I;
    return T * B * 4 * H + B * 4 * H + 4 * H + 2 * B * H;
}}

/* One direction d: reads W, R, bias of d, writes Y[:, d], Y_h[d], Y_c[d]. */
static void ss_lstm_direction(const float* X, const float* W, const float* R, const float* bias,
                              const float* h0, const float* c0, float* Y, float* Y_h, float* Y_c,
                              int64_t T, int64_t B, int64_t I, int64_t H, int64_t D, int64_t d,
                              int reverse, float* work) {{
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
    for (int64_t i = 0; i < B * H; ++i) {{
        h[i] = h0 ? h0[d * B * H + i] : 0.0f;
        c[i] = c0 ? c0[d * B * H + i] : 0.0f;
    }}
    for (int64_t s = 0; s < T; ++s) {{
        int64_t t = reverse ? T - 1 - s : s;
        ss_gemm(B, G, H, 1, 1, h, 0, 0, H, 1, R + d * G * H, 0, 0, 1, H, gates, 0, 0, G,
                1.0f, xw + t * B * G, 1.0f, G, 1, 0);
        #pragma omp parallel for if(B * H >= SS_LSTM_PAR_MIN)
        for (int64_t b = 0; b < B; ++b) {{
            const float* gr = gates + b * G;
            for (int64_t j = 0; j < H; ++j) {{
                float gi = ss_lstm_sigmoid(gr[j]), go = ss_lstm_sigmoid(gr[H + j]);
                float gf = ss_lstm_sigmoid(gr[2 * H + j]), gc = tanhf(gr[3 * H + j]);
                float cn = gf * c[b * H + j] + gi * gc;
                c[b * H + j] = cn;
                h[b * H + j] = go * tanhf(cn);
            }}
        }}
        if (Y) memcpy(Y + ((t * D + d) * B) * H, h, (size_t)(B * H) * sizeof(float));
    }}
    if (Y_h) memcpy(Y_h + d * B * H, h, (size_t)(B * H) * sizeof(float));
    if (Y_c) memcpy(Y_c + d * B * H, c, (size_t)(B * H) * sizeof(float));
}}

void ss_lstm(const float* X, const float* W, const float* R, const float* bias,
             const float* h0, const float* c0, float* Y, float* Y_h, float* Y_c,
             int64_t T, int64_t B, int64_t I, int64_t H, int direction, float* work) {{
    if (B <= 0 || H <= 0) return;
    int64_t D = direction == 2 ? 2 : 1;
    for (int64_t d = 0; d < D; ++d)
        ss_lstm_direction(X, W, R, bias, h0, c0, Y, Y_h, Y_c, T, B, I, H, D, d,
                          direction == 1 || d == 1, work);
}}
"""


def source(par_min: int = 4096) -> str:
    """The LSTM fragment; ``par_min`` is the gate count (B * H) below which the update stays serial."""
    return _TEMPLATE.format(par_min=int(par_min))
