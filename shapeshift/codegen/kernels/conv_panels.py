"""Dense convs of small output planes straight from the GEMM's prepacked weights, in the
GEMM's own register tile: ss_conv2d's path for planes of a few dozen pixels.

A conv is the product y^T [pixels, M] = im2col(x)^T [pixels, K] x w^T [K, M], K = C*KH*KW.
The lowering packs w^T once at load in the GEMM's prepacked-B layout (kernels/gemm.py:
k blocks of SS_GEMM_KC rows, each holding every panel of SS_GEMM_NR columns). This kernel
computes tiles of R output pixels x one panel, R and the panel the target's GEMM tile
(codegen/defaults.py: 8 x 48 in zmm on a core with two 512-bit FMA pipes, 6 x 16 in ymm on
an AVX2 one), all of K in registers: per tap, one broadcast of each pixel's input value,
read in place from a zero-padded copy of the image at ``base_i + koff[k]`` (as
conv_igemm.py does), and the panel's vectors of weights. No im2col matrix is written, A is
not packed, and the output leaves the registers once, transposed into the planes with the
bias and activation applied.

Why not the paths before it, on an AMD Zen 5 (two 512-bit FMA pipes, 252 GFLOPS a core), 1
thread, yolov8n's late convs (64->64 3x3 on a 4x6 plane, 128->128 on 2x3):
- the small-plane GEMM (kernels/conv.py: im2col, then ss_gemm_prepacked over the im2col
  matrix read transposed, then the result transposed back) spent a third of its time
  writing the im2col matrix (one branch and a scalar store a tap and pixel) and the GEMM's
  A packing read it once more: 56-65 GFLOPS;
- the implicit GEMM (conv_igemm.py) uses 16-channel panels of 6 pixels, so with a 48-wide
  GEMM panel it repacks all the weights at every call.
Against them (the conv step's own time from the profiler, single-conv models, 1 thread,
bias and SiLU, median of 7 samples of 200 runs; the paths they replaced in brackets):
64->64 3x3 on 4x6 11.5 us (14.1), 128->64 on 4x6 22.1 (27.2), 256->64 on 2x3 15.6 (17.3),
128->128 on 2x3 12.1 (12.1), 1x1 512->256 on 2x3 10.2 (9.4, the B-streaming GEMM), and on
planes the implicit GEMM took: 64->64 on 8x12 44.9 (47.6), 256->256 on 14x14 1033 (1207),
128->128 on 20x20 529 (570), but 64->64 on 40x40 630 (573), hence ``MAX_PLANE``. yolov8n
at 1x3x64x96: 1.07-1.13 -> 0.96-0.99 ms a run (onnxruntime 0.80).

ss_conv2d does not send 1 x 1 convs here. Their taps are input channels a whole plane
apart, and with all of K in registers a tile reads its panel's K x nr weights from L2
(past L1 once K passes a few hundred), where the small-plane GEMM takes K in L1-sized
blocks over a packed A. On an AMD Zen 4 (6x16 zmm tile), 1 thread, with ReLU, against
onnxruntime interleaved in one process, here -> the small-plane GEMM: 512->2048 on 7x7
1.64x -> 1.21x onnxruntime's time, 2048->512 on 7x7 1.75x -> 1.19x, 256->1024 on 14x14
1.38x -> 1.06x, 1024->256 on 14x14 1.26x -> 1.15x, 64->256 on 7x7 1.87x -> 1.40x (and on
Zen 5, above, 512->256 on 2x3 already ran faster there).

Tiles are generated for every (rows, live vectors) up to the full tile, so that a 2x3
plane runs 6 rows and a 64-channel conv's second panel one vector, not the whole tile;
lanes past M in a panel's last vector are the packed weights' zero padding (computed, not
stored).

One entry point, an object of its own (the tiles stay out of every model's unit)::

    int ss_conv_panels(x, wpacked, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw,
                       dh, dw, act, work, work_floats, res, res_act);

``res``: NULL, or a residual laid out as y, added in the transposed store (conv_igemm.py's
ss_conv_store_tile): y = res_act(act(conv + bias) + res).

It returns 0, having written nothing, when it cannot run: a build without AVX2 or without
the GEMM fragment, scratch that cannot be allocated, tap offsets past 32 bits.
``SS_CONV_PANELS_MAX_PLANE`` is the largest output plane ss_conv2d hands it.
"""

from __future__ import annotations

from typing import Optional

from ...target import Target, registers_of_width
from ..cwriter import CWriter, Fragment, Function, Private, Shared, fill
from .gemm import GemmSchedule
from .gemm_tiles import accumulators, vector_names

DEPENDS = ("gemm", "vmath", "conv_igemm")

#: Output planes (pixels) up to which ss_conv2d runs a dense conv with prepacked weights
#: here when the GEMM tile is wide (defaults.conv_panels_max_plane; none with a narrow one):
#: on larger ones the implicit GEMM's 48-pixel blocks over L1-sized slices of taps win,
#: since a tile here reads its panel's weights for all K from L2 (measured above).
MAX_PLANE = 400
#: At most this many pixel pointers a tile: more spill the general registers (conv_igemm.py's
#: 12-pixel tile did) and the tile runs no faster.
MAX_ROWS = 8
#: Multiply-adds below which a conv runs on one thread (a parallel region costs ~1.5 us).
PAR_MIN_MACS = 1 << 18

_PARAMS = ("const float* x", "const float* wpacked", "const float* bias", "float* y", "int64_t N", "int64_t C",
           "int64_t H", "int64_t W", "int64_t M", "int64_t KH", "int64_t KW", "int64_t OH", "int64_t OW",
           "int64_t sh", "int64_t sw", "int64_t ph", "int64_t pw", "int64_t dh", "int64_t dw", "int act",
           "float* work", "int64_t work_floats", "const float* res", "int res_act")
_TILE_PARAMS = ("const float* const* base", "const int32_t* koff", "const float* wpacked", "int64_t q", "int64_t K",
                "int64_t padded_n", "const float* bias", "float* t")


def tile_rows(s: GemmSchedule, lanes: int) -> int:
    """Pixels a full tile in vectors of ``lanes``: the GEMM tile's rows, as many as leave
    registers for the panel's weights and a broadcast (a zmm schedule's ymm form, in a build
    without AVX-512, takes fewer), and no more than MAX_ROWS."""
    vectors = s.nr // lanes
    registers = registers_of_width(lanes)
    return max(1, min(s.mr, MAX_ROWS, (registers - vectors - 1) // vectors))


def tile_name(rows: int, vectors: int) -> str:
    return f"ss_conv_panel_tile_{rows}x{vectors}"


def tile_kernel(s: GemmSchedule, lanes: int, rows: int, vectors: int) -> str:
    """rows pixels x ``vectors`` vectors of one panel over all K taps, the sums left in t
    (pixel i's channels at t + i * NR)."""
    v, mm = vector_names(lanes)
    acc = accumulators(rows, vectors)
    w = CWriter(level=1)
    w.line("const float " + ", ".join(f"*p{i} = base[{i}]" for i in range(rows)) + ";")
    w.line(f"{v} av, " + ", ".join(f"b{j}" for j in range(vectors)) + ";")
    w.lines(f"{v} {acc[i][j]} = {mm}_loadu_ps(bias + {lanes * j});" for i in range(rows) for j in range(vectors))
    with w.block("for (int64_t k0 = 0; k0 < K; k0 += SS_GEMM_KC)"):
        w.line("const int64_t kn = K - k0 < SS_GEMM_KC ? K - k0 : SS_GEMM_KC;")
        w.line("const int32_t* ko = koff + k0;")
        # Block k0 holds every panel, kn rows each; panel q's follow the q before it.
        w.line("const float* wk = wpacked + k0 * padded_n + q * SS_GEMM_NR * kn;")
        w.raw(f"#pragma GCC unroll {s.unroll_k}")
        with w.block("for (int64_t k = 0; k < kn; ++k)"):
            w.line("const int64_t o = ko[k];")
            w.lines(f"b{j} = {mm}_loadu_ps(wk + {lanes * j});" for j in range(vectors))
            for i in range(rows):
                w.line(f"av = _mm512_set1_ps(p{i}[o]);" if lanes == 16 else f"av = _mm256_broadcast_ss(p{i} + o);")
                w.lines(f"{acc[i][j]} = {mm}_fmadd_ps(av, b{j}, {acc[i][j]});" for j in range(vectors))
            w.line("wk += SS_GEMM_NR;")
    w.lines(f"{mm}_storeu_ps(t + {i} * SS_GEMM_NR + {lanes * j}, {acc[i][j]});"
            for i in range(rows) for j in range(vectors))
    return Function("void", tile_name(rows, vectors), _TILE_PARAMS, w.text(), linkage="static").definition()


def tile_dispatch(s: GemmSchedule, lanes: int) -> str:
    """Every tile of up to tile_rows x the panel's vectors, and the switch that picks one."""
    rows, vectors = tile_rows(s, lanes), s.nr // lanes
    w = CWriter()
    w.line(f"#define SS_CONV_PANEL_ROWS {rows}")
    w.line(f"#define SS_CONV_PANEL_LANES {lanes}")
    for r in range(1, rows + 1):
        for v in range(1, vectors + 1):
            w.raw(tile_kernel(s, lanes, r, v))
    body = CWriter(level=1)
    with body.block("switch (rows * 64 + vectors)"):
        for r in range(1, rows + 1):
            for v in range(1, vectors + 1):
                body.line(f"case {r * 64 + v}: {tile_name(r, v)}(base, koff, wpacked, q, K, padded_n, bias, t); "
                          "return;")
    w.raw(Function("void", "ss_conv_panel_tile", ("int64_t rows", "int64_t vectors", *_TILE_PARAMS), body.text(),
                   linkage="static").definition())
    return w.text()


_DRIVER = r"""
/* Tile `tile` (pixels p0 .. p0 + np) of panel q of one image: img its staged planes (row
   stride Wp, plane apart), yn its output [M, P], rn its residual (or NULL). */
static void ss_conv_panel_item(const float* img, const int32_t* koff, const float* wpacked, const float* bias,
                               float* yn, int64_t q, int64_t tile, int64_t M, int64_t K, int64_t P, int64_t OW,
                               int64_t sh, int64_t sw, int64_t Wp, int act, const float* rn, int res_act) {
    const int64_t padded_n = (M + SS_GEMM_NR - 1) / SS_GEMM_NR * SS_GEMM_NR;
    const int64_t p0 = tile * SS_CONV_PANEL_ROWS;
    const int64_t np = P - p0 < SS_CONV_PANEL_ROWS ? P - p0 : SS_CONV_PANEL_ROWS;
    const int64_t mv = M - q * SS_GEMM_NR < SS_GEMM_NR ? M - q * SS_GEMM_NR : SS_GEMM_NR;
    const float* base[SS_CONV_PANEL_ROWS];
    for (int64_t i = 0, oh = p0 / OW, ow = p0 % OW; i < np; ++i) {
        base[i] = img + oh * sh * Wp + ow * sw;
        if (++ow == OW) {
            ow = 0;
            ++oh;
        }
    }
    float bb[SS_GEMM_NR];
    for (int64_t j = 0; j < mv; ++j) bb[j] = bias ? bias[q * SS_GEMM_NR + j] : 0.0f;
    for (int64_t j = mv; j < SS_GEMM_NR; ++j) bb[j] = 0.0f;
    float t[SS_CONV_PANEL_ROWS * SS_GEMM_NR] __attribute__((aligned(64)));
    ss_conv_panel_tile(np, (mv + SS_CONV_PANEL_LANES - 1) / SS_CONV_PANEL_LANES, base, koff, wpacked, q, K, padded_n,
                       bb, t);
    ss_conv_store_tile(t, SS_GEMM_NR, np, mv, yn + q * SS_GEMM_NR * P + p0, P, act,
                       rn ? rn + q * SS_GEMM_NR * P + p0 : NULL, res_act);
}

static int ss_conv_panels_run(const float* x, const float* wpacked, const float* bias, float* y, int64_t N, int64_t C,
                              int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW, int64_t OH, int64_t OW,
                              int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int act,
                              float* work, int64_t work_floats, const float* res, int res_act) {
    const int64_t K = C * KH * KW, P = OH * OW, panels = (M + SS_GEMM_NR - 1) / SS_GEMM_NR;
    const int64_t tiles = (P + SS_CONV_PANEL_ROWS - 1) / SS_CONV_PANEL_ROWS;
    /* The image as its windows read it: in place when no window leaves it (a 1 x 1 conv),
       else a zero-padded copy. */
    int64_t Hp = (OH - 1) * sh + (KH - 1) * dh + 1, Wp = (OW - 1) * sw + (KW - 1) * dw + 1;
    const int in_place = ph == 0 && pw == 0 && Hp <= H && Wp <= W;
    if (in_place) {
        Hp = H;
        Wp = W;
    } else {
        if (Hp < ph + H) Hp = ph + H;
        if (Wp < pw + W) Wp = pw + W;
    }
    const int64_t plane = Hp * Wp;
    if (C * plane >= INT32_MAX) return 0;  /* the tap offsets are 32-bit */
    float* own = NULL;
    work = ss_conv_scratch(work, work_floats, K + (in_place ? 0 : N * C * plane), &own);
    if (!work) return 0;
    int32_t* koff = (int32_t*)work;
    float* stage = work + K;
    ss_conv_igemm_offsets(koff, C, KH, KW, plane, Wp, dh, dw);
    const int64_t items = N * panels * tiles;
    const int par = items > 1 && (double)N * M * P * K >= @PAR_MIN@;
    #pragma omp parallel if(par)
    {
        if (!in_place) {
            #pragma omp for schedule(static)
            for (int64_t nc = 0; nc < N * C; ++nc) ss_conv_igemm_stage(x + nc * H * W, stage + nc * plane, H, W, ph, pw, Hp, Wp);
        }
        /* Tiles of one panel run together: its weights stay in L1/L2 while every tile reads
           them. Each thread takes a contiguous run of items of about equal work (vectors x
           pixels), not of equal count: a 64-channel conv's second panel holds one vector of
           the first's three, and an even split of a 4x6 plane's six items gave one thread
           three times the other's work. */
        const int nt = omp_get_num_threads(), it = omp_get_thread_num();
        const int64_t full = SS_GEMM_NR / SS_CONV_PANEL_LANES;
        const int64_t last = (M - (panels - 1) * SS_GEMM_NR + SS_CONV_PANEL_LANES - 1) / SS_CONV_PANEL_LANES;
        const int64_t per_image = (full * (panels - 1) + last) * P;
        int64_t done = 0;
        for (int64_t item = 0; item < items; ++item) {
            const int64_t n = item / (panels * tiles), r = item % (panels * tiles), q = r / tiles, tile = r % tiles;
            const int64_t rows = P - tile * SS_CONV_PANEL_ROWS < SS_CONV_PANEL_ROWS ? P - tile * SS_CONV_PANEL_ROWS
                                                                                   : SS_CONV_PANEL_ROWS;
            const int64_t work = (q == panels - 1 ? last : full) * rows;
            /* The item is this thread's when the middle of its work falls in the thread's share. */
            const int64_t middle = 2 * done + work, share = 2 * N * per_image;
            done += work;
            if (middle * nt < share * it || middle * nt >= share * (it + 1)) continue;
            ss_conv_panel_item((in_place ? x : stage) + n * C * plane, koff, wpacked, bias, y + n * M * P, q, tile,
                               M, K, P, OW, sh, sw, Wp, act, res ? res + n * M * P : NULL, res_act);
        }
    }
    free(own);
    return 1;
}
"""


def fragment(target: Optional[Target] = None, max_plane: Optional[int] = None,
             par_min: int = PAR_MIN_MACS, schedule=None) -> Fragment:
    """The fragment for ``target`` (this machine's when None): tiles of its default GEMM
    schedule (codegen/defaults.py), whose prepacked layout the lowering gives the weights,
    or of ``schedule`` (a tuned conv kernel's GEMM schedule: kernels/conv_tuned.py).
    ``max_plane``: SS_CONV_PANELS_MAX_PLANE, by default the target's
    (defaults.conv_panels_max_plane: 0 with a narrow GEMM tile, where ss_conv2d never calls
    it; tests pass MAX_PLANE to run it anyway)."""
    from ..defaults import conv_panels_max_plane, default_schedule  # defaults imports the kernels package
    from .gemm_tiles import in_lanes

    s = schedule or default_schedule(target)
    max_plane = conv_panels_max_plane(target) if max_plane is None else max_plane
    body = CWriter()
    with body.guard("defined(__AVX2__) && defined(SS_GEMM_NR)"):
        body.line("#define SS_CONV_PANELS_RUN 1")
        body.raw(in_lanes(s, tile_dispatch))
        body.raw(fill(_DRIVER, PAR_MIN=float(par_min)))
    entry = Function("int", "ss_conv_panels", _PARAMS, """
#ifdef SS_CONV_PANELS_RUN
    if (N <= 0 || M <= 0 || OH <= 0 || OW <= 0) return 1;
    return ss_conv_panels_run(x, wpacked, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, act,
                              work, work_floats, res, res_act);
#else
    (void)x; (void)wpacked; (void)bias; (void)y; (void)N; (void)C; (void)H; (void)W; (void)M; (void)KH; (void)KW;
    (void)OH; (void)OW; (void)sh; (void)sw; (void)ph; (void)pw; (void)dh; (void)dw; (void)act; (void)work;
    (void)work_floats; (void)res; (void)res_act;
    return 0;
#endif""")
    return Fragment([Shared(f"#define SS_CONV_PANELS_MAX_PLANE {int(max_plane)}\n"), Private(body.text()), entry])


def source(target: Optional[Target] = None, **parameters) -> str:
    return fragment(target, **parameters).text()
