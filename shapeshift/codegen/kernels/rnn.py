"""Recurrent kernels: LSTM, GRU and RNN (the ONNX ops of those names, float32, every attribute).

Exported C::

    /* X [T, B, I] (layout 0) or [B, T, I] (layout 1); W [D, G, I], R [D, G, H] with
       G = 4H (LSTM, gate order i, o, f, c), 3H (GRU, z, r, h) or H (RNN); Wp NULL or D
       pointers, direction d's W^T [I, G] packed by ss_gemm_pack_b (then W is not read);
       Rp NULL or R packed by ss_rnn_pack (then R is not read; NULL: packed into the workspace at
       each call); bias NULL or [D, 2G] (Wb then Rb); seq_lens NULL or [B] (int32); h0, c0
       NULL (zeros) or [D, B, H] (layout 0) / [B, D, H] (layout 1); P (LSTM peepholes)
       NULL or [D, 3H] (i, o, f). Outputs, each NULL or written: Y [T, D, B, H] /
       [B, T, D, H], Y_h and Y_c [D, B, H] / [B, D, H]. direction: 0 forward, 1 reverse
       (D = 1), 2 bidirectional (D = 2). acts/alphas/betas: NULL for the defaults (LSTM:
       Sigmoid, Tanh, Tanh; GRU: Sigmoid, Tanh; RNN: Tanh), else A activations per direction
       ([D * A]; codes in ACTIVATION_CODES) with their alpha and beta. clip < 0: none, else
       every gate activation's input is clipped to [-clip, clip] (LSTM's h(c) is not, as
       in onnxruntime). input_forget (LSTM): f = 1 - i.
       A row b past its seq_lens[b] keeps its state and gets zero outputs; a row of length
       0 reports zero Y_h / Y_c (as onnxruntime). work: ss_recur_work_size(...) floats. */
    void ss_lstm(const float* X, const float* W, const float* const* Wp, const float* R,
                 const float* Rp, const float* bias, const int32_t* seq_lens, const float* h0,
                 const float* c0, const float* P, float* Y, float* Y_h, float* Y_c, int64_t T,
                 int64_t B, int64_t I, int64_t H, int direction, int layout, int input_forget,
                 const int32_t* acts, const float* alphas, const float* betas, float clip,
                 float* work);
    void ss_gru(const float* X, const float* W, const float* const* Wp, const float* R,
                const float* Rp, const float* bias, const int32_t* seq_lens, const float* h0,
                float* Y, float* Y_h, int64_t T, int64_t B, int64_t I, int64_t H, int direction,
                int layout, int linear_before_reset, const int32_t* acts, const float* alphas,
                const float* betas, float clip, float* work);
    void ss_rnn(const float* X, const float* W, const float* const* Wp, const float* R,
                const float* Rp, const float* bias, const int32_t* seq_lens, const float* h0,
                float* Y, float* Y_h, int64_t T, int64_t B, int64_t I, int64_t H, int direction,
                int layout, const int32_t* acts, const float* alphas, const float* betas,
                float clip, float* work);
    /* kind: 0 RNN, 1 GRU, 2 GRU linear_before_reset, 3 LSTM; prepacked: Rp given. */
    int64_t ss_recur_work_size(int64_t T, int64_t B, int64_t H, int64_t D, int kind, int prepacked);

Per direction, GEMMs project the steps' inputs (X W^T plus the biases that add outside
any product, rows in X's own order, so layout 1 needs no transposition; on W packed at
load when it is a constant) a chunk of steps at a time, in the order the direction takes
them, so that the chunk is still in L2 when its steps read it (SS_RNN_CHUNK_FLOATS, from
the target's L2), but at least W's size, since every chunk's GEMM reads all of W. Each step
is then the packed product of kernels/rnn_step.py, block by block of hidden units, each
block's gates updated as soon as its product is done (GRU without
linear_before_reset: two such passes, since the candidate's product reads r * h). The
state is double-buffered, since every block reads all of the old state. The two
directions of a bidirectional node run on two threads when the session has two.
"""

from __future__ import annotations

from typing import Optional

from ...target import Target
from ..cwriter import Fragment, Function, Private
from . import rnn_gates, rnn_step

DEPENDS = ("gemm", "vmath")

#: ONNX activation name (lowercased) -> the code the kernels take in ``acts``.
ACTIVATION_CODES = {
    "sigmoid": 0, "tanh": 1, "relu": 2, "affine": 3, "leakyrelu": 4, "thresholdedrelu": 5,
    "scaledtanh": 6, "hardsigmoid": 7, "elu": 8, "softsign": 9, "softplus": 10,
}
#: Kernel kinds (rnn_step.KIND_SETS).
KIND_RNN, KIND_GRU, KIND_GRU_LBR, KIND_LSTM = 0, 1, 2, 3

_HELPERS = r"""
/* ---- rnn: drivers ---- */
/* One activation of one direction: a code of ACTIVATION_CODES and its alpha, beta. */
typedef struct { int kind; float alpha, beta; } ss_recur_act;

/* Where each row of H floats (Y, states) lives, in elements, for one layout and D
   directions. */
typedef struct {
    int64_t T, B, H, G;
    int64_t y_t, y_b, y_d;    /* Y row (t, d, b) */
    int64_t s_b, s_d;         /* initial / final state row (d, b) */
} ss_recur_geom;

static ss_recur_geom ss_recur_geometry(int64_t T, int64_t B, int64_t H, int64_t G, int64_t D, int layout) {
    ss_recur_geom g;
    g.T = T; g.B = B; g.H = H; g.G = G;
    if (layout == 0) {   /* X [T, B, I], Y [T, D, B, H], states [D, B, H] */
        g.y_t = D * B * H; g.y_b = H; g.y_d = B * H;
        g.s_b = H; g.s_d = B * H;
    } else {             /* X [B, T, I], Y [B, T, D, H], states [B, D, H] */
        g.y_t = D * H; g.y_b = T * D * H; g.y_d = H;
        g.s_b = D * H; g.s_d = H;
    }
    return g;
}

static inline float ss_recur_softplus(float v) {
    return v > 0.0f ? v + log1pf(expf(-v)) : log1pf(expf(v));
}

/* Clips v[0..n) to [-clip, clip] (clip < 0: no clipping), then applies the activation in
   place. Sigmoid and Tanh, the defaults, run on vmath's vectors (scalar twins for the
   tail); the others are simple loops. Comparisons are ordered so that NaN propagates. */
static void ss_recur_activate(ss_recur_act a, float clip, float* v, int64_t n) {
    const float al = a.alpha, be = a.beta;
    if (clip >= 0.0f)
        for (int64_t j = 0; j < n; ++j) v[j] = v[j] < -clip ? -clip : (v[j] > clip ? clip : v[j]);
    int64_t j0 = 0;
    switch (a.kind) {
    case 0:  /* Sigmoid */
#ifdef __AVX2__
        for (; j0 + 8 <= n; j0 += 8) _mm256_storeu_ps(v + j0, ss_sigmoid8(_mm256_loadu_ps(v + j0)));
#endif
        for (int64_t j = j0; j < n; ++j) v[j] = ss_sigmoidf(v[j]);
        break;
    case 1:  /* Tanh */
#ifdef __AVX2__
        for (; j0 + 8 <= n; j0 += 8) _mm256_storeu_ps(v + j0, ss_tanh8(_mm256_loadu_ps(v + j0)));
#endif
        for (int64_t j = j0; j < n; ++j) v[j] = ss_tanhf(v[j]);
        break;
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

static inline int ss_recur_active(const int32_t* lens, int64_t b, int64_t t) {
    return !lens || t < (int64_t)lens[b];
}

/* s[b] = s0[d, b], zeros without s0. */
static void ss_recur_load_state(const float* s0, float* s, const ss_recur_geom* g, int64_t d) {
    for (int64_t b = 0; b < g->B; ++b) {
        if (s0) memcpy(s + b * g->H, s0 + d * g->s_d + b * g->s_b, (size_t)g->H * sizeof(float));
        else memset(s + b * g->H, 0, (size_t)g->H * sizeof(float));
    }
}

/* out[d, b] = s[b]; a row of length 0 reports zeros (onnxruntime's choice), not s0. */
static void ss_recur_store_state(float* out, const float* s, const int32_t* lens, const ss_recur_geom* g,
                                 int64_t d) {
    if (!out) return;
    for (int64_t b = 0; b < g->B; ++b) {
        float* o = out + d * g->s_d + b * g->s_b;
        if (lens && lens[b] <= 0) memset(o, 0, (size_t)g->H * sizeof(float));
        else memcpy(o, s + b * g->H, (size_t)g->H * sizeof(float));
    }
}

/* Everything one call shares between its directions and steps. */
typedef struct {
    const float *X, *W, *Rp, *bias, *h0, *c0, *peep;
    const float* const* Wp;
    const int32_t* lens;
    float *Y, *Y_h, *Y_c;
    ss_recur_geom g;
    int64_t I, D;
    int direction, layout, kind, flag;   /* flag: linear_before_reset (GRU), input_forget (LSTM) */
    const int32_t* acts;
    const float *alphas, *betas;
    float clip;
    int warm;  /* a call right after another on this thread (ss_recur_run): its team is awake */
} ss_recur_call;

/* One step's view of one direction: its activations, state buffers and inputs. */
typedef struct {
    const ss_recur_call* c;
    int64_t d, t;
    const float* xw;        /* this step's projection rows: row b at xw + b * xw_b */
    int64_t xw_b;
    const float* P;         /* the direction's packed R */
    const float* h;         /* state before the step */
    float* hn;              /* state after it */
    float* cs;              /* LSTM cell state, updated in place */
    float* aux;             /* GRU: z [B, H], then r * h [B, H] */
    const float* rbias;     /* GRU linear_before_reset: Rbh (3H, zeros but the last H), or NULL */
    const float* peep;      /* LSTM peepholes of the direction (i, o, f), or NULL */
    ss_recur_act f, gact, hact;
    int fast;               /* the default activations and no clip: rnn_gates' vector updates */
    int team;               /* run by every thread of a team region over the steps (see
                               ss_recur_direction): the tiles are shared out by an orphaned
                               omp for, whose barrier ends the step */
    int64_t b_lo, b_hi;     /* the batch rows this thread's steps compute (all but in a
                               region of SS_RECUR_ROWS) */
} ss_recur_step;

/* Y[t, d, b, j0 .. j0+n) = v, or zeros for an inactive row. */
static inline void ss_recur_store_y(const ss_recur_step* s, int64_t b, int64_t j0, const float* v, int64_t n,
                                    int active) {
    const ss_recur_call* c = s->c;
    if (!c->Y) return;
    float* y = c->Y + s->t * c->g.y_t + b * c->g.y_b + s->d * c->g.y_d + j0;
    if (active) memcpy(y, v, (size_t)n * sizeof(float));
    else memset(y, 0, (size_t)n * sizeof(float));
}
"""

_DIRECTION = r"""
/* Steps per projection chunk: about SS_RNN_CHUNK_FLOATS of projection, or as many floats as
   W's I x G where that is more, at least one step. Every chunk's GEMM streams all of W:
   sized by L2 alone, the chunks of an LSTM at batch 4, hidden and input 1024 (16 MB of W)
   were 2 steps of 8 rows each, and the projection read W once per 2 steps (a third of
   the run, AMD Zen 2); chunks at least as large as W read it no more than they write. */
static inline int64_t ss_recur_chunk_steps(int64_t T, int64_t B, int64_t G, int64_t I) {
    const int64_t per_step = B * G > 0 ? B * G : 1;
    const int64_t floats = I * G > SS_RNN_CHUNK_FLOATS ? I * G : SS_RNN_CHUNK_FLOATS;
    const int64_t tc = floats / per_step;
    return tc < 1 ? 1 : (tc > T ? T : tc);
}

/* Floats one direction's workspace takes: a projection chunk of up to all T steps, two
   states, the cell, GRU's z and r * h, the summed and the recurrent biases. */
static inline int64_t ss_recur_direction_work(int64_t T, int64_t B, int64_t H, int64_t G) {
    return T * B * G + 5 * B * H + 2 * G;
}

/* The biases of direction d, split by where they add: bsum[G] joins the input
   projection (Wb + Rb, but for GRU with linear_before_reset only Wbh for the candidate,
   whose Rbh is multiplied by r), rbias[G] that Rbh (zeros elsewhere). */
static void ss_recur_biases(const float* bias, int64_t d, int64_t G, int64_t H, int kind, float* bsum,
                            float* rbias) {
    const float* wb = bias + d * 2 * G;
    const float* rb = wb + G;
    for (int64_t j = 0; j < G; ++j) {
        const int recurrent_only = kind == 2 && j >= 2 * H;
        bsum[j] = wb[j] + (recurrent_only ? 0.0f : rb[j]);
        rbias[j] = recurrent_only ? rb[j] : 0.0f;
    }
}

/* xw = the projection of steps [lo, hi) of direction d: [hi - lo, B, G] in layout 0,
   [B, hi - lo, G] in layout 1 (X's row order either way). */
static void ss_recur_project(const ss_recur_call* c, int64_t d, int64_t lo, int64_t hi, const float* bsum,
                             float* xw) {
    const int64_t T = c->g.T, B = c->g.B, G = c->g.G, I = c->I, n = hi - lo;
    const float* bias = c->bias ? bsum : NULL;
    /* Layout 0: one matrix of n * B rows; layout 1: B matrices of n rows (batch0 = B). */
    const int64_t M = c->layout ? n : n * B, batch = c->layout ? B : 1;
    const float* A = c->layout ? c->X + lo * I : c->X + lo * B * I;
    const int64_t sa = T * I, sc = n * G;
    if (c->Wp)
        ss_gemm_prepacked(M, G, I, batch, 1, A, sa, 0, I, 1, c->Wp[d], xw, sc, 0, G, 1.0f, bias, 1.0f, 0, 1, 0);
    else
        ss_gemm(M, G, I, batch, 1, A, sa, 0, I, 1, c->W + d * G * I, 0, 0, 1, I, xw, sc, 0, G,
                1.0f, bias, 1.0f, 0, 1, 0);
}

/* Steps [lo, hi) of a chunk, in the direction's order, from the state in h into hn and back
   (a step's result is the next one's state): the projection rows of step t at xw + (t - lo) *
   xw_t. Run by one thread, or by each thread of a team (s.team) with the same arguments. */
static void ss_recur_chunk(ss_recur_step s, const float* xw, int64_t xw_t, int64_t lo, int64_t hi, int reverse,
                           float* h, float* hn) {
    for (int64_t k = 0; k < hi - lo; ++k) {
        s.t = reverse ? hi - 1 - k : lo + k;
        s.xw = xw + (s.t - lo) * xw_t;
        s.h = h;
        s.hn = hn;
        ss_recur_run_step(&s);
        float* swap = h; h = hn; hn = swap;
    }
}

/* Direction d: its projection chunk by chunk, and its time loop. */
static void ss_recur_direction(const ss_recur_call* c, const float* Rp, int64_t d, float* work) {
    const ss_recur_geom* g = &c->g;
    const int64_t T = g->T, B = g->B, H = g->H, G = g->G;
    const int64_t tc = ss_recur_chunk_steps(T, B, G, c->I);
    const int layout1 = c->layout;
    float* xw = work;
    float* h = xw + tc * B * G;
    float* hn = h + B * H;
    float* cs = hn + B * H;
    float* aux = cs + B * H;
    float* bsum = aux + 2 * B * H;
    float* rbias = bsum + G;
    if (c->bias) ss_recur_biases(c->bias, d, G, H, c->kind, bsum, rbias);
    ss_recur_load_state(c->h0, h, g, d);
    if (c->kind == 3) ss_recur_load_state(c->c0, cs, g, d);
    const int nact = c->kind == 0 ? 1 : (c->kind == 3 ? 3 : 2);
    ss_recur_step s;
    s.c = c; s.d = d; s.cs = cs; s.aux = aux;
    s.P = Rp + d * ss_rnn_set_size(H, (int)(G / H));
    s.rbias = c->bias && c->kind == 2 ? rbias : NULL;
    s.peep = c->peep ? c->peep + d * 3 * H : NULL;
    s.f = ss_recur_act_of(c->acts, c->alphas, c->betas, d, nact, 0, c->kind == 0 ? 1 : 0);
    s.gact = ss_recur_act_of(c->acts, c->alphas, c->betas, d, nact, nact > 1 ? 1 : 0, 1);
    s.hact = ss_recur_act_of(c->acts, c->alphas, c->betas, d, nact, nact > 2 ? 2 : 0, 1);
    s.fast = c->clip < 0.0f && (c->kind == 0 ? s.f.kind == 1
                                : s.f.kind == 0 && s.gact.kind == 1 && (c->kind != 3 || s.hact.kind == 1));
    s.team = 0;
    s.b_lo = 0;
    s.b_hi = B;
    const int reverse = c->direction == 1 || d == 1;
    const int mode = ss_recur_mode(&s);
    for (int64_t step = 0; step < T;) {
        /* The chunk in xw: steps [lo, hi), projected first, then run. */
        const int64_t t0 = reverse ? T - 1 - step : step;
        const int64_t lo = reverse ? (t0 + 1 > tc ? t0 + 1 - tc : 0) : t0;
        const int64_t hi = reverse ? t0 + 1 : (t0 + tc < T ? t0 + tc : T);
        ss_recur_project(c, d, lo, hi, bsum, xw);
        s.xw_b = layout1 ? (hi - lo) * G : G;
        const int64_t xw_t = layout1 ? G : B * G;
        if (mode == SS_RECUR_TEAM) {
            /* One region for the chunk's steps: each thread walks them with its own copy of
               the step, the tiles of each shared out with a barrier at its end. A region
               per step cost about as much as a small step (the other threads are woken
               through the kernel each time): GRU at batch 1, hidden 256, 2 threads took
               2.9 ms for 128 steps, 2.1 on one thread (AMD Zen 2). */
            ss_recur_step ts = s;
            ts.team = 1;
            #pragma omp parallel
            ss_recur_chunk(ts, xw, xw_t, lo, hi, reverse, h, hn);
        } else if (mode == SS_RECUR_ROWS) {
            /* Each thread the chunk's steps for its own rows, start to end: a row's state,
               cell, outputs and projection are its own, so no barrier until the region's. */
            #pragma omp parallel
            {
                ss_recur_step ts = s;
                const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
                ts.b_lo = B * id / threads;
                ts.b_hi = B * (id + 1) / threads;
                if (ts.b_hi > ts.b_lo) ss_recur_chunk(ts, xw, xw_t, lo, hi, reverse, h, hn);
            }
        } else {
            ss_recur_chunk(s, xw, xw_t, lo, hi, reverse, h, hn);
        }
        /* After an odd number of steps the state is in hn. */
        if ((hi - lo) % 2) { float* swap = h; h = hn; hn = swap; }
        step += hi - lo;
    }
    ss_recur_store_state(c->Y_h, h, c->lens, g, d);
    if (c->kind == 3) ss_recur_store_state(c->Y_c, cs, c->lens, g, d);
}

/* When this thread's last recurrent call ended (omp_get_wtime), for the next call's `warm`. */
static _Thread_local double ss_recur_last_end = -1e9;

/* The directions, on two threads when there are two of each and enough work to pay for
   waking the second (SS_RNN_DIR_PAR_MIN FMAs a direction); R packed into the
   workspace first unless the caller packed it. Workspace: each direction's part, then
   the packed R. */
static void ss_recur_run(const ss_recur_call* c, const float* R, float* work) {
    const ss_recur_geom* g = &c->g;
    const int64_t per = ss_recur_direction_work(g->T, g->B, g->H, g->G);
    const float* Rp = c->Rp;
    if (!Rp) {
        float* P = work + c->D * per;
        ss_rnn_pack(R, c->D, g->H, c->kind, P);
        Rp = P;
    }
    if (c->D == 2 && omp_get_max_threads() >= 2 && g->T * g->B * g->G * (c->I + g->H) >= SS_RNN_DIR_PAR_MIN) {
        #pragma omp parallel for num_threads(2) schedule(static, 1)
        for (int64_t d = 0; d < 2; ++d) ss_recur_direction(c, Rp, d, work + d * per);
    } else {
        for (int64_t d = 0; d < c->D; ++d) ss_recur_direction(c, Rp, d, work + d * per);
    }
    ss_recur_last_end = omp_get_wtime();
}

static ss_recur_call ss_recur_setup(const float* X, const float* W, const float* const* Wp, const float* Rp,
                                    const float* bias, const int32_t* seq_lens, const float* h0, float* Y,
                                    float* Y_h, int64_t T, int64_t B, int64_t I, int64_t H, int direction,
                                    int layout, int kind, const int32_t* acts, const float* alphas,
                                    const float* betas, float clip) {
    ss_recur_call c;
    memset(&c, 0, sizeof c);
    c.X = X; c.W = W; c.Wp = Wp; c.Rp = Rp; c.bias = bias; c.lens = seq_lens; c.h0 = h0; c.Y = Y; c.Y_h = Y_h;
    c.D = direction == 2 ? 2 : 1;
    c.g = ss_recur_geometry(T, B, H, (int64_t)ss_rnn_kind_gates(kind) * H, c.D, layout);
    c.I = I; c.direction = direction; c.layout = layout; c.kind = kind;
    c.acts = acts; c.alphas = alphas; c.betas = betas; c.clip = clip;
    c.warm = omp_get_wtime() - ss_recur_last_end < SS_RNN_WARM_S;
    return c;
}
"""

_WORK_SIZE = Function("int64_t", "ss_recur_work_size", ("int64_t T", "int64_t B", "int64_t H", "int64_t D",
                                                        "int kind", "int prepacked"), r"""
    const int64_t G = ss_rnn_kind_gates(kind) * H;
    return D * ss_recur_direction_work(T, B, H, G) + (prepacked ? 0 : ss_rnn_packed_size(D, H, ss_rnn_kind_gates(kind)));""")

_LSTM = Function("void", "ss_lstm", ("const float* X", "const float* W", "const float* const* Wp", "const float* R",
                                     "const float* Rp",
                                     "const float* bias", "const int32_t* seq_lens", "const float* h0",
                                     "const float* c0", "const float* P", "float* Y", "float* Y_h", "float* Y_c",
                                     "int64_t T", "int64_t B", "int64_t I", "int64_t H", "int direction",
                                     "int layout", "int input_forget", "const int32_t* acts",
                                     "const float* alphas", "const float* betas", "float clip", "float* work"), r"""
    if (B <= 0 || H <= 0) return;
    ss_recur_call c = ss_recur_setup(X, W, Wp, Rp, bias, seq_lens, h0, Y, Y_h, T, B, I, H, direction, layout, 3,
                                     acts, alphas, betas, clip);
    c.c0 = c0; c.peep = P; c.Y_c = Y_c; c.flag = input_forget;
    ss_recur_run(&c, R, work);""")

_GRU = Function("void", "ss_gru", ("const float* X", "const float* W", "const float* const* Wp", "const float* R",
                                   "const float* Rp",
                                   "const float* bias", "const int32_t* seq_lens", "const float* h0", "float* Y",
                                   "float* Y_h", "int64_t T", "int64_t B", "int64_t I", "int64_t H",
                                   "int direction", "int layout", "int linear_before_reset", "const int32_t* acts",
                                   "const float* alphas", "const float* betas", "float clip", "float* work"), r"""
    if (B <= 0 || H <= 0) return;
    const ss_recur_call c = ss_recur_setup(X, W, Wp, Rp, bias, seq_lens, h0, Y, Y_h, T, B, I, H, direction, layout,
                                           linear_before_reset ? 2 : 1, acts, alphas, betas, clip);
    ss_recur_run(&c, R, work);""")

_RNN = Function("void", "ss_rnn", ("const float* X", "const float* W", "const float* const* Wp", "const float* R",
                                   "const float* Rp",
                                   "const float* bias", "const int32_t* seq_lens", "const float* h0", "float* Y",
                                   "float* Y_h", "int64_t T", "int64_t B", "int64_t I", "int64_t H",
                                   "int direction", "int layout", "const int32_t* acts", "const float* alphas",
                                   "const float* betas", "float clip", "float* work"), r"""
    if (B <= 0 || H <= 0) return;
    const ss_recur_call c = ss_recur_setup(X, W, Wp, Rp, bias, seq_lens, h0, Y, Y_h, T, B, I, H, direction, layout, 0,
                                           acts, alphas, betas, clip);
    ss_recur_run(&c, R, work);""")


def work_floats(T, B, H: int, directions: int, kind: int, prepacked: bool):
    """Floats the kernel of ``kind`` needs (ss_recur_work_size's, the packed copy sized for
    the widest block: the projection chunk has room for every step); works on symbolic T
    and B."""
    G = rnn_step.KIND_GATES[kind] * H
    packed = 0 if prepacked else rnn_step.packed_floats_bound(directions, H, G // H)
    return directions * (T * B * G + 5 * B * H + 2 * G) + packed  # the chunk is at most all T steps


def fragment(target: Optional[Target] = None, step_par_min: int = rnn_step.STEP_PAR_MIN,
             chunk_floats: Optional[int] = None, seq_par_min: int = rnn_step.SEQ_PAR_MIN,
             dir_par_min: int = rnn_step.DIR_PAR_MIN) -> Fragment:
    """The fragment (LSTM, GRU, RNN) for ``target`` (this machine by default);
    ``step_par_min`` is the rows x gates x H^2 FMAs below which a step stays serial,
    ``seq_par_min`` the same over all steps, ``dir_par_min`` the FMAs of one direction
    below which two run one after the other, ``chunk_floats`` the input projection
    computed ahead (default: a quarter of L2)."""
    return Fragment([
        *rnn_step.parts(target, step_par_min, chunk_floats, seq_par_min=seq_par_min, dir_par_min=dir_par_min),
        Private(_HELPERS),
        Private(rnn_gates.STEPS),
        Private(_DIRECTION),
        _WORK_SIZE,
        _LSTM,
        _GRU,
        _RNN,
    ])


def source(target: Optional[Target] = None, chunk_floats: Optional[int] = None) -> str:
    return fragment(target, chunk_floats=chunk_floats).text()
