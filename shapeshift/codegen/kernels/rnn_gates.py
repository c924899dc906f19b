"""The gate updates of the recurrent kernels (kernels/rnn.py): per step, per block of
hidden units and group of batch rows, the packed product of kernels/rnn_step.py, then
that block's gates updated at once from the product's small L1 buffer (no [B, G] array
of pre-activations). Part of the ``rnn`` fragment (no ``source()`` of its own).

Two forms per kind: with the default activations and no clip (``ss_recur_step.fast``),
the whole update runs on registers, 16 lanes at a time where the blocks are zmm (a
sigmoid and tanh of its own from vmath's polynomials, vmath's scalar twins for the tail)
or 8 with one rational tanh and the sigmoid through it (RATIONAL_TANH_*, with scalar twins
of their own for the tail); otherwise each gate goes through ``ss_recur_activate`` (any activation
of the list, clip). Internal C only (static), used by rnn.py's direction loop::

    static void ss_recur_run_step(const ss_recur_step* s);   one step of one direction
"""

from ..cwriter import fill
from .vmath import EXP_P, TANH_P, TANH_SWITCH, float_literal, horner

_STEPS = r"""
/* ---- rnn: gate updates ---- */
/* The default activations without clip, lanes [0, n) of one row of one block, on
   registers: 16 lanes where the blocks are zmm (sigmoid and tanh below, from vmath's
   polynomials, scaled by 2^n with scalef), else vmath's 8-lane ss_sigmoid8 / ss_tanh8;
   vmath's scalar twins for the tail. */
#if SS_RNN_VW == 16
#define SS_RG_W 16
typedef __m512 ss_rg_v;
#define ss_rg_load _mm512_loadu_ps
#define ss_rg_store _mm512_storeu_ps
#define ss_rg_set1 _mm512_set1_ps
#define ss_rg_add _mm512_add_ps
#define ss_rg_sub _mm512_sub_ps
#define ss_rg_mul _mm512_mul_ps
#define ss_rg_fma _mm512_fmadd_ps

static inline __m512 ss_rg_copysign16(__m512 v, __m512 sign) {
    const __m512i m = _mm512_set1_epi32(0x7fffffff);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(v), m),
                                               _mm512_andnot_si512(m, _mm512_castps_si512(sign))));
}

static inline __m512 ss_rg_abs16(__m512 v) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
}

/* exp: vmath's reduction and polynomial; scalef rounds y * 2^n once (inf above, the
   subnormals and 0 below). max/min keep a NaN x (they return their second operand). */
static inline __m512 ss_rg_exp16(__m512 x) {
    const __m512 xc = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-112.0f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-06f), r);
@EXP_P@
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

static inline __m512 ss_rg_sigmoid(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 e = ss_rg_exp16(_mm512_sub_ps(_mm512_setzero_ps(), ss_rg_abs16(x)));
    const __m512 num = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), one, e);
    return _mm512_div_ps(num, _mm512_add_ps(one, e));
}

static inline __m512 ss_rg_tanh(__m512 x) {
    const __m512 ax = ss_rg_abs16(x);
    const __m512 z = _mm512_mul_ps(x, x);
@TANH_P@
    const __m512 small = ss_rg_copysign16(_mm512_fmadd_ps(_mm512_mul_ps(x, z), p, x), x);
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 e = ss_rg_exp16(_mm512_add_ps(ax, ax));
    const __m512 large = ss_rg_copysign16(_mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one))), x);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(@TANH_SWITCH@), _CMP_LT_OQ), large, small);
}
#elif defined(__AVX2__)
#define SS_RG_W 8
typedef __m256 ss_rg_v;
#define ss_rg_load _mm256_loadu_ps
#define ss_rg_store _mm256_storeu_ps
#define ss_rg_set1 _mm256_set1_ps
#define ss_rg_add _mm256_add_ps
#define ss_rg_sub _mm256_sub_ps
#define ss_rg_mul _mm256_mul_ps
#define ss_rg_fma ss_fmadd8
/* tanh as one rational function, x P(x^2) / Q(x^2) on x clamped to [-@RT_LIMIT@, @RT_LIMIT@],
   the result clamped to [-1, 1], and sigmoid(x) = (1 + tanh(x / 2)) / 2 (RATIONAL_TANH_*
   in rnn_gates.py). min/max return their second operand when either is NaN: this order
   keeps a NaN x. ss_rg_tanhf and ss_rg_sigmoidf are their scalar twins, operation for
   operation, for the lanes past the last vector. */
#define SS_RG_RATIONAL 1
static inline __m256 ss_rg_tanh(__m256 x) {
    const __m256 xc = _mm256_min_ps(_mm256_set1_ps(@RT_LIMIT@), _mm256_max_ps(_mm256_set1_ps(-@RT_LIMIT@), x));
    const __m256 t = _mm256_mul_ps(xc, xc);
@RT_P8@
@RT_Q8@
    const __m256 y = _mm256_div_ps(_mm256_mul_ps(xc, p), q);
    return _mm256_min_ps(_mm256_set1_ps(1.0f), _mm256_max_ps(_mm256_set1_ps(-1.0f), y));
}

static inline __m256 ss_rg_sigmoid(__m256 x) {
    const __m256 h = _mm256_set1_ps(0.5f);
    return ss_fmadd8(h, ss_rg_tanh(_mm256_mul_ps(h, x)), h);
}

static inline float ss_rg_tanhf(float x) {
    const float xc = x < -@RT_LIMIT@ ? -@RT_LIMIT@ : (x > @RT_LIMIT@ ? @RT_LIMIT@ : x);
    const float t = xc * xc;
@RT_P1@
@RT_Q1@
    const float y = xc * p / q;
    return y < -1.0f ? -1.0f : (y > 1.0f ? 1.0f : y);
}

static inline float ss_rg_sigmoidf(float x) { return ss_fmaf(0.5f, ss_rg_tanhf(0.5f * x), 0.5f); }
#endif
#ifndef SS_RG_RATIONAL
/* zmm blocks and builds without AVX2: vmath's scalar twins, as their vectors above. */
#define ss_rg_tanhf ss_tanhf
#define ss_rg_sigmoidf ss_sigmoidf
#endif

/* LSTM: i, o, f, c pre-activations (product only) in gi..gc; x the projection row at the
   block; cs the cell (updated); peep NULL or (i, o, f) at the block, pstride apart;
   hn the new state. */
static inline void ss_lstm_update_fast(const float* gi, const float* go, const float* gf, const float* gc,
                                       const float* x, int64_t H, float* cs, const float* peep, int64_t pstride,
                                       int input_forget, float* hn, int64_t n) {
    int64_t v = 0;
#ifdef SS_RG_W
    const ss_rg_v one = ss_rg_set1(1.0f);
    for (; v + SS_RG_W <= n; v += SS_RG_W) {
        ss_rg_v i = ss_rg_add(ss_rg_load(gi + v), ss_rg_load(x + v));
        ss_rg_v o = ss_rg_add(ss_rg_load(go + v), ss_rg_load(x + H + v));
        ss_rg_v f = ss_rg_add(ss_rg_load(gf + v), ss_rg_load(x + 2 * H + v));
        ss_rg_v c = ss_rg_add(ss_rg_load(gc + v), ss_rg_load(x + 3 * H + v));
        const ss_rg_v cp = ss_rg_load(cs + v);
        if (peep) {
            i = ss_rg_fma(ss_rg_load(peep + v), cp, i);
            f = ss_rg_fma(ss_rg_load(peep + 2 * pstride + v), cp, f);
        }
        i = ss_rg_sigmoid(i);
        f = input_forget ? ss_rg_sub(one, i) : ss_rg_sigmoid(f);
        c = ss_rg_tanh(c);
        const ss_rg_v cn = ss_rg_fma(f, cp, ss_rg_mul(i, c));
        ss_rg_store(cs + v, cn);
        if (peep) o = ss_rg_fma(ss_rg_load(peep + pstride + v), cn, o);
        ss_rg_store(hn + v, ss_rg_mul(ss_rg_sigmoid(o), ss_rg_tanh(cn)));
    }
#endif
    for (; v < n; ++v) {
        float i = gi[v] + x[v], o = go[v] + x[H + v], f = gf[v] + x[2 * H + v], c = gc[v] + x[3 * H + v];
        const float cp = cs[v];
        if (peep) {
            i = ss_fmaf(peep[v], cp, i);
            f = ss_fmaf(peep[2 * pstride + v], cp, f);
        }
        i = ss_rg_sigmoidf(i);
        f = input_forget ? 1.0f - i : ss_rg_sigmoidf(f);
        c = ss_rg_tanhf(c);
        const float cn = ss_fmaf(f, cp, i * c);
        cs[v] = cn;
        if (peep) o = ss_fmaf(peep[pstride + v], cn, o);
        hn[v] = ss_rg_sigmoidf(o) * ss_rg_tanhf(cn);
    }
}

/* GRU with linear_before_reset: z, r, and the candidate's product (plus Rbh, rbh NULL:
   none) in z, r, ah; hb the old state. */
static inline void ss_gru_lbr_update_fast(const float* z, const float* r, const float* ah, const float* rbh,
                                          const float* x, int64_t H, const float* hb, float* hn, int64_t n) {
    int64_t v = 0;
#ifdef SS_RG_W
    for (; v + SS_RG_W <= n; v += SS_RG_W) {
        const ss_rg_v zz = ss_rg_sigmoid(ss_rg_add(ss_rg_load(z + v), ss_rg_load(x + v)));
        const ss_rg_v rr = ss_rg_sigmoid(ss_rg_add(ss_rg_load(r + v), ss_rg_load(x + H + v)));
        ss_rg_v a = ss_rg_load(ah + v);
        if (rbh) a = ss_rg_add(a, ss_rg_load(rbh + v));
        const ss_rg_v cand = ss_rg_tanh(ss_rg_fma(rr, a, ss_rg_load(x + 2 * H + v)));
        ss_rg_store(hn + v, ss_rg_fma(zz, ss_rg_sub(ss_rg_load(hb + v), cand), cand));
    }
#endif
    for (; v < n; ++v) {
        const float zz = ss_rg_sigmoidf(z[v] + x[v]), rr = ss_rg_sigmoidf(r[v] + x[H + v]);
        const float a = ah[v] + (rbh ? rbh[v] : 0.0f);
        const float cand = ss_rg_tanhf(ss_fmaf(rr, a, x[2 * H + v]));
        hn[v] = ss_fmaf(zz, hb[v] - cand, cand);
    }
}

/* GRU reset first, pass 1: zo = sigmoid(z + xz), rh = sigmoid(r + xr) * hb. */
static inline void ss_gru_zr_update_fast(const float* z, const float* r, const float* x, int64_t H,
                                         const float* hb, float* zo, float* rh, int64_t n) {
    int64_t v = 0;
#ifdef SS_RG_W
    for (; v + SS_RG_W <= n; v += SS_RG_W) {
        ss_rg_store(zo + v, ss_rg_sigmoid(ss_rg_add(ss_rg_load(z + v), ss_rg_load(x + v))));
        const ss_rg_v rr = ss_rg_sigmoid(ss_rg_add(ss_rg_load(r + v), ss_rg_load(x + H + v)));
        ss_rg_store(rh + v, ss_rg_mul(rr, ss_rg_load(hb + v)));
    }
#endif
    for (; v < n; ++v) {
        zo[v] = ss_rg_sigmoidf(z[v] + x[v]);
        rh[v] = ss_rg_sigmoidf(r[v] + x[H + v]) * hb[v];
    }
}

/* hn = (1 - z) g + z hb with g = tanh(a + xh): GRU's blend (reset first, pass 2). */
static inline void ss_gru_blend_fast(const float* a, const float* xh, const float* z, const float* hb, float* hn,
                                     int64_t n) {
    int64_t v = 0;
#ifdef SS_RG_W
    for (; v + SS_RG_W <= n; v += SS_RG_W) {
        const ss_rg_v cand = ss_rg_tanh(ss_rg_add(ss_rg_load(a + v), ss_rg_load(xh + v)));
        ss_rg_store(hn + v, ss_rg_fma(ss_rg_load(z + v), ss_rg_sub(ss_rg_load(hb + v), cand), cand));
    }
#endif
    for (; v < n; ++v) {
        const float cand = ss_rg_tanhf(a[v] + xh[v]);
        hn[v] = ss_fmaf(z[v], hb[v] - cand, cand);
    }
}

/* RNN: hn = tanh(a + x). */
static inline void ss_rnn_update_fast(const float* a, const float* x, float* hn, int64_t n) {
    int64_t v = 0;
#ifdef SS_RG_W
    for (; v + SS_RG_W <= n; v += SS_RG_W) ss_rg_store(hn + v, ss_rg_tanh(ss_rg_add(ss_rg_load(a + v), ss_rg_load(x + v))));
#endif
    for (; v < n; ++v) hn[v] = ss_rg_tanhf(a[v] + x[v]);
}

/* The block jb of rows b0 .. b0+rows: acc[r][g][VW] = h R^T for its gates. Returns the
   hidden units it covers (VW but at the end). */
static inline int64_t ss_recur_block(const float* P, const float* h, int64_t H, int ng, int64_t jb, int64_t b0,
                                     int rows, float* acc) {
    ss_rnn_dot(P + jb * H * ng * SS_RNN_VW, h + b0 * H, H, H, ng, rows, acc);
    const int64_t j0 = jb * SS_RNN_VW;
    return H - j0 < SS_RNN_VW ? H - j0 : SS_RNN_VW;
}

typedef void (*ss_recur_tile_fn)(const ss_recur_step* s, int64_t jb, int64_t b0, int rows);

/* How a direction's steps share the threads (ss_recur_direction's region over a chunk of
   steps), SS_RECUR_*: on this thread alone; on a team (SS_RECUR_TEAM), every thread taking
   its share of each step's tiles, a barrier ending the step: enough work a step to share
   (SS_RNN_STEP_PAR_MIN FMAs) and at least two tiles; or rows (SS_RECUR_ROWS), each thread
   running every step for its own batch rows, which no other row reads, so with no barrier
   at all: at least two rows, and R small enough (SS_RNN_ROWS_R_MAX floats, half of L2) that
   each thread keeping all of it in its own cache costs nothing, else where the team does
   not pay. Either needs the sequence's work to pay for waking the threads
   (SS_RNN_SEQ_PAR_MIN), or, in a call right after another (`warm`: a decoding loop's
   steps, whose threads are still spinning from the last call's region), a step's worth
   (SS_RNN_STEP_PAR_MIN); every thread, and no enclosing region (the directions' own). LSTM
   at batch 4, hidden 64, 128 steps, 2 threads (AMD Zen 2; 65536 FMAs a step, below the
   team's threshold): 0.65 ms on one thread against onnxruntime's 0.41. */
enum { SS_RECUR_ONE = 0, SS_RECUR_TEAM = 1, SS_RECUR_ROWS = 2 };

static int ss_recur_mode(const ss_recur_step* s) {
    const int64_t B = s->c->g.B, H = s->c->g.H;
    const int64_t step_fmas = B * s->c->g.G * H;
    const int64_t seq_min = s->c->warm ? SS_RNN_STEP_PAR_MIN : SS_RNN_SEQ_PAR_MIN;
    if (s->c->g.T * step_fmas < seq_min || omp_in_parallel() || omp_get_max_threads() < 2)
        return SS_RECUR_ONE;
    if (B >= 2 && s->c->g.G * H <= SS_RNN_ROWS_R_MAX) return SS_RECUR_ROWS;
    /* The gates of the step's (first) tile: GRU without linear_before_reset runs z and r,
       then the candidate. */
    const int ng = s->c->kind == 1 ? 2 : (int)(s->c->g.G / H);
    const int64_t tasks = (H + SS_RNN_VW - 1) / SS_RNN_VW * ((B + ss_rnn_mr(ng) - 1) / ss_rnn_mr(ng));
    if (step_fmas >= SS_RNN_STEP_PAR_MIN && tasks >= 2) return SS_RECUR_TEAM;
    return B >= 2 ? SS_RECUR_ROWS : SS_RECUR_ONE;
}

/* Runs tile(s, jb, b0, rows) over every (block, row group) of the step's rows [s->b_lo,
   s->b_hi), shared out among the team when a team runs the steps (s->team), else on this
   thread. Blocks outer, row groups inner: every row group of a block reads the same packed
   weights (H x ng vectors) while they are in L1 or L2, and each thread of a team reads only
   its blocks' share of R. The other way round, every row group streamed all of R: with 16
   ymm registers an LSTM tile holds 2 rows, so at batch 16 R (1 MB at hidden 256, past a
   512 KiB L2) came from L3 eight times a step. */
static void ss_recur_tiles(const ss_recur_step* s, int ng, ss_recur_tile_fn tile) {
    const int64_t lo = s->b_lo, hi = s->b_hi, H = s->c->g.H;
    const int64_t nb = (H + SS_RNN_VW - 1) / SS_RNN_VW;
    const int mr = ss_rnn_mr(ng);
    const int64_t groups = (hi - lo + mr - 1) / mr, tasks = nb * groups;
    int64_t t_lo = 0, t_hi = tasks;
    if (s->team) {
        /* Orphaned: each thread of the team that ss_recur_direction started takes the same
           run of tasks (and so the same part of R, kept in its cache) every step; the
           barrier below ends the step. */
        const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
        t_lo = tasks * id / threads;
        t_hi = tasks * (id + 1) / threads;
    }
    /* Where the part of R this thread reads takes more than half of L1, odd steps take
       their tasks last to first: a step then starts on the lines the last one read most
       recently, still in L1 or L2 (the other way round, least recently used lines went
       first and each step read all of its part from the next level). LSTM at batch 1, AMD
       Zen 4: hidden 256 (R 1 MB) over 512 steps on 1 thread 7.3-7.6 -> 6.7-6.9 ms (L2);
       hidden 512 over 128 steps on 2 threads (2 MB a thread) 5.1-5.7 -> 4.7-5.4 ms (L2);
       hidden 64 (R 64 KB, 32 KB L1d) over 512 steps, L1: a small gain at best, within this
       machine's spread: 1109 -> 1056 ns a step (medians of 4 alternating processes), 1073
       -> 1057 (5), 1131 -> 1105 (11); GRU 846 -> 813 (4); batch 4 and 16, and 2 threads,
       within 1%. */
    const int back = (s->t & 1) && (double)ng * H * H * (double)(t_hi - t_lo) / (double)tasks > SS_RNN_L1_FLOATS / 2;
    /* Alone, not even an inactive OpenMP region: at a few microseconds a step, entering
       one costs a good part of it. */
    for (int64_t k = t_lo; k < t_hi; ++k) {
        const int64_t task = back ? t_lo + t_hi - 1 - k : k;
        const int64_t b0 = lo + task % groups * mr;
        tile(s, task / groups, b0, (int)(hi - b0 < mr ? hi - b0 : mr));
    }
    if (s->team) {
        #pragma omp barrier
    }
}

/* LSTM: i, o, f, c from one packed product; peepholes, input_forget, the cell update. */
static void ss_lstm_tile(const ss_recur_step* s, int64_t jb, int64_t b0, int rows) {
    const ss_recur_call* c = s->c;
    const int64_t H = c->g.H;
    float acc[SS_RNN_VW * 4 * 8], hc[SS_RNN_VW];
    const int64_t n = ss_recur_block(s->P, s->h, H, 4, jb, b0, rows, acc);
    const int64_t j0 = jb * SS_RNN_VW;
    for (int r = 0; r < rows; ++r) {
        const int64_t b = b0 + r;
        const int active = ss_recur_active(c->lens, b, s->t);
        float* hn = s->hn + b * H + j0;
        if (!active) {
            memcpy(hn, s->h + b * H + j0, (size_t)n * sizeof(float));
            ss_recur_store_y(s, b, j0, hn, n, 0);
            continue;
        }
        float* gi = acc + (r * 4) * SS_RNN_VW;
        float *go = gi + SS_RNN_VW, *gf = gi + 2 * SS_RNN_VW, *gc = gi + 3 * SS_RNN_VW;
        const float* x = s->xw + b * s->xw_b + j0;
        float* cs = s->cs + b * H + j0;
        if (s->fast) {
            ss_lstm_update_fast(gi, go, gf, gc, x, H, cs, s->peep ? s->peep + j0 : NULL, H, c->flag, hn, n);
            ss_recur_store_y(s, b, j0, hn, n, 1);
            continue;
        }
        for (int64_t v = 0; v < n; ++v) {
            gi[v] += x[v];
            go[v] += x[H + v];
            gf[v] += x[2 * H + v];
            gc[v] += x[3 * H + v];
        }
        if (s->peep)
            for (int64_t v = 0; v < n; ++v) {
                gi[v] += s->peep[j0 + v] * cs[v];
                gf[v] += s->peep[2 * H + j0 + v] * cs[v];
            }
        ss_recur_activate(s->f, c->clip, gi, n);
        if (c->flag) for (int64_t v = 0; v < n; ++v) gf[v] = 1.0f - gi[v];
        else ss_recur_activate(s->f, c->clip, gf, n);
        ss_recur_activate(s->gact, c->clip, gc, n);
        for (int64_t v = 0; v < n; ++v) cs[v] = gf[v] * cs[v] + gi[v] * gc[v];
        if (s->peep) for (int64_t v = 0; v < n; ++v) go[v] += s->peep[H + j0 + v] * cs[v];
        ss_recur_activate(s->f, c->clip, go, n);
        memcpy(hc, cs, (size_t)n * sizeof(float));
        ss_recur_activate(s->hact, -1.0f, hc, n);   /* clip bounds the gates' inputs, not the cell's (onnxruntime) */
        for (int64_t v = 0; v < n; ++v) hn[v] = go[v] * hc[v];
        ss_recur_store_y(s, b, j0, hn, n, 1);
    }
}

/* RNN: h = f(x + h R^T). */
static void ss_rnn_tile(const ss_recur_step* s, int64_t jb, int64_t b0, int rows) {
    const ss_recur_call* c = s->c;
    const int64_t H = c->g.H;
    float acc[SS_RNN_VW * 8];
    const int64_t n = ss_recur_block(s->P, s->h, H, 1, jb, b0, rows, acc);
    const int64_t j0 = jb * SS_RNN_VW;
    for (int r = 0; r < rows; ++r) {
        const int64_t b = b0 + r;
        const int active = ss_recur_active(c->lens, b, s->t);
        float* hn = s->hn + b * H + j0;
        if (active) {
            const float* x = s->xw + b * s->xw_b + j0;
            const float* a = acc + r * SS_RNN_VW;
            if (s->fast) {
                ss_rnn_update_fast(a, x, hn, n);
            } else {
                for (int64_t v = 0; v < n; ++v) hn[v] = a[v] + x[v];
                ss_recur_activate(s->f, c->clip, hn, n);
            }
        } else {
            memcpy(hn, s->h + b * H + j0, (size_t)n * sizeof(float));
        }
        ss_recur_store_y(s, b, j0, hn, n, active);
    }
}

/* GRU, linear_before_reset: z, r and the candidate's product from one packed product;
   the candidate is g(xh + r * (h Rh^T + Rbh)). */
static void ss_gru_lbr_tile(const ss_recur_step* s, int64_t jb, int64_t b0, int rows) {
    const ss_recur_call* c = s->c;
    const int64_t H = c->g.H;
    float acc[SS_RNN_VW * 3 * 8];
    const int64_t n = ss_recur_block(s->P, s->h, H, 3, jb, b0, rows, acc);
    const int64_t j0 = jb * SS_RNN_VW;
    for (int r = 0; r < rows; ++r) {
        const int64_t b = b0 + r;
        const int active = ss_recur_active(c->lens, b, s->t);
        float* hn = s->hn + b * H + j0;
        const float* hb = s->h + b * H + j0;
        if (!active) {
            memcpy(hn, hb, (size_t)n * sizeof(float));
            ss_recur_store_y(s, b, j0, hn, n, 0);
            continue;
        }
        float* z = acc + (r * 3) * SS_RNN_VW;
        float *rr = z + SS_RNN_VW, *cand = z + 2 * SS_RNN_VW;
        const float* x = s->xw + b * s->xw_b + j0;
        if (s->fast) {
            ss_gru_lbr_update_fast(z, rr, cand, s->rbias ? s->rbias + 2 * H + j0 : NULL, x, H, hb, hn, n);
            ss_recur_store_y(s, b, j0, hn, n, 1);
            continue;
        }
        for (int64_t v = 0; v < n; ++v) {
            z[v] += x[v];
            rr[v] += x[H + v];
        }
        ss_recur_activate(s->f, c->clip, z, n);
        ss_recur_activate(s->f, c->clip, rr, n);
        const float* rbh = s->rbias ? s->rbias + 2 * H + j0 : NULL;
        for (int64_t v = 0; v < n; ++v) cand[v] = x[2 * H + v] + rr[v] * (cand[v] + (rbh ? rbh[v] : 0.0f));
        ss_recur_activate(s->gact, c->clip, cand, n);
        for (int64_t v = 0; v < n; ++v) hn[v] = (1.0f - z[v]) * cand[v] + z[v] * hb[v];
        ss_recur_store_y(s, b, j0, hn, n, 1);
    }
}

/* GRU, reset first, pass 1: z into aux[0 .. B*H), r * h into aux[B*H ..), every row (the
   second product reads r * h of all of them; rows are independent, so an inactive row's
   values only feed its own, discarded, result). */
static void ss_gru_zr_tile(const ss_recur_step* s, int64_t jb, int64_t b0, int rows) {
    const ss_recur_call* c = s->c;
    const int64_t H = c->g.H, B = c->g.B;
    float acc[SS_RNN_VW * 2 * 8];
    const int64_t n = ss_recur_block(s->P, s->h, H, 2, jb, b0, rows, acc);
    const int64_t j0 = jb * SS_RNN_VW;
    for (int r = 0; r < rows; ++r) {
        const int64_t b = b0 + r;
        float* z = acc + (r * 2) * SS_RNN_VW;
        float* rr = z + SS_RNN_VW;
        const float* x = s->xw + b * s->xw_b + j0;
        if (s->fast) {
            ss_gru_zr_update_fast(z, rr, x, H, s->h + b * H + j0, s->aux + b * H + j0, s->aux + B * H + b * H + j0, n);
            continue;
        }
        for (int64_t v = 0; v < n; ++v) {
            z[v] += x[v];
            rr[v] += x[H + v];
        }
        ss_recur_activate(s->f, c->clip, z, n);
        ss_recur_activate(s->f, c->clip, rr, n);
        const float* hb = s->h + b * H + j0;
        float* zo = s->aux + b * H + j0;
        float* rh = s->aux + B * H + b * H + j0;
        for (int64_t v = 0; v < n; ++v) {
            zo[v] = z[v];
            rh[v] = rr[v] * hb[v];
        }
    }
}

/* GRU, reset first, pass 2: the candidate g(xh + (r * h) Rh^T) and the blend. */
static void ss_gru_h_tile(const ss_recur_step* s, int64_t jb, int64_t b0, int rows) {
    const ss_recur_call* c = s->c;
    const int64_t H = c->g.H, B = c->g.B;
    float acc[SS_RNN_VW * 8];
    const float* Ph = s->P + ss_rnn_set_size(H, 2);
    const int64_t n = ss_recur_block(Ph, s->aux + B * H, H, 1, jb, b0, rows, acc);
    const int64_t j0 = jb * SS_RNN_VW;
    for (int r = 0; r < rows; ++r) {
        const int64_t b = b0 + r;
        const int active = ss_recur_active(c->lens, b, s->t);
        float* hn = s->hn + b * H + j0;
        const float* hb = s->h + b * H + j0;
        if (active) {
            float* cand = acc + r * SS_RNN_VW;
            const float* x = s->xw + b * s->xw_b + 2 * H + j0;
            const float* z = s->aux + b * H + j0;
            if (s->fast) {
                ss_gru_blend_fast(cand, x, z, hb, hn, n);
                ss_recur_store_y(s, b, j0, hn, n, 1);
                continue;
            }
            for (int64_t v = 0; v < n; ++v) cand[v] += x[v];
            ss_recur_activate(s->gact, c->clip, cand, n);
            for (int64_t v = 0; v < n; ++v) hn[v] = (1.0f - z[v]) * cand[v] + z[v] * hb[v];
        } else {
            memcpy(hn, hb, (size_t)n * sizeof(float));
        }
        ss_recur_store_y(s, b, j0, hn, n, active);
    }
}

static void ss_recur_run_step(const ss_recur_step* s) {
    switch (s->c->kind) {
    case 0: ss_recur_tiles(s, 1, ss_rnn_tile); break;
    case 1:
        ss_recur_tiles(s, 2, ss_gru_zr_tile);
        ss_recur_tiles(s, 1, ss_gru_h_tile);
        break;
    case 2: ss_recur_tiles(s, 3, ss_gru_lbr_tile); break;
    default: ss_recur_tiles(s, 4, ss_lstm_tile); break;
    }
}
"""


#: The ymm gate updates' tanh (and through it sigmoid), tanh(x) ~ x P(x^2) / Q(x^2) for |x| <=
#: RATIONAL_TANH_LIMIT (tanh(9) is 1 - 3e-8, 1 in float32). Fitted to tanh in float64 by
#: iteratively reweighted linear least squares of x P - tanh(x) Q on 18,000 points of [0, 9]
#: (relative error; max 5.9e-8 there); evaluated in float32 as the kernels do, over 6 million
#: points of [-30, 30] and 200,000 of [1e-12, 1]: max error 3.5e-7 relative (about 6 ulp) for
#: tanh, 2.0e-7 absolute for sigmoid. vmath's ss_tanh8 and ss_sigmoid8 compute an exp (two for
#: tanh's two branches, blended) and a division each, about 2.5x these operations: with
#: them the activations took 37% of an LSTM at batch 16, hidden 64 (1 thread, AMD Zen 2;
#: 2.78 ms a run, 1.75 with the activations replaced by a multiply), onnxruntime's whole
#: run 2.13 ms. zmm blocks keep their own exp-based forms.
RATIONAL_TANH_P = (0.99999994, 0.1291922, 0.0029207536, 9.2673499e-06, -1.27802426e-08, 1.82547744e-11)
RATIONAL_TANH_Q = (1.0, 0.46252504, 0.023763135, 0.000228099103)
RATIONAL_TANH_LIMIT = 9.0

#: The steps' C (a Private part of the rnn fragment).
STEPS = fill(_STEPS, EXP_P=horner("r", EXP_P, True, 1, lanes=16), TANH_P=horner("z", TANH_P, True, 1, lanes=16),
             TANH_SWITCH=float_literal(TANH_SWITCH), RT_LIMIT=float_literal(RATIONAL_TANH_LIMIT),
             RT_P8=horner("t", RATIONAL_TANH_P, True, 1), RT_Q8=horner("t", RATIONAL_TANH_Q, True, 1, out="q"),
             RT_P1=horner("t", RATIONAL_TANH_P, False, 1), RT_Q1=horner("t", RATIONAL_TANH_Q, False, 1, out="q"))
