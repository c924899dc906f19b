"""Data-movement kernels: one strided copy that serves every layout op, and a fill.

Exported C functions (see docs/native-kernels.md for the conventions):

``void ss_copy(int64_t elem_size, int64_t rank, const int64_t* shape, const void* src,
const int64_t* src_strides, void* dst, const int64_t* dst_strides);``
    ``dst[i] = src[i]`` over the index space ``shape`` (``0 <= rank <= 8``; rank 0 copies
    one element, and ``shape`` / the strides may then be NULL). The element at index
    ``(i0..ir-1)`` is read from ``src + sum(i_d * src_strides[d])`` and written to
    ``dst + sum(i_d * dst_strides[d])``, strides in elements of ``elem_size`` bytes (1, 2,
    4 or 8; other sizes work through memcpy). Strides may be 0 (broadcast) or negative
    (``src`` then already points at the first element read). ``src`` and ``dst`` must not
    overlap, and ``dst`` must not repeat an element (no 0 dst stride on an extent > 1).
    Serves Transpose, Slice, Expand, Tile (a rank-doubled view with 0 strides), Concat
    and Split (one call per piece, at an offset of the big tensor) and Pad (after a fill).

``void ss_fill(int64_t elem_size, void* dst, int64_t n, const void* value);``
    ``dst[0..n) = *value``, each element ``elem_size`` bytes.

How ``ss_copy`` stays fast whatever view it is given: it first canonicalises the view
(drops extent-1 dims, orders dims by decreasing |dst stride| so the innermost dim is the
one written contiguously, merges neighbours that are contiguous in both tensors), then
picks one of three loops over the innermost dim: memcpy of whole rows (both strides 1),
a blocked transpose (dst stride 1, and another dim reads src with a smaller stride, so
square tiles reuse each fetched cache line; 4- and 8-byte elements use AVX2
in-register transposes), or a typed strided loop. Rows (or tiles) are split across
OpenMP threads when the copy is large.
"""

from __future__ import annotations

from ..cwriter import CWriter, Fragment, Function, Private, fill

# Element types the copy loops are specialised for: (suffix, C type).
_ELEM_TYPES = ((1, "uint8_t"), (2, "uint16_t"), (4, "uint32_t"), (8, "uint64_t"))

DEPENDS: tuple[str, ...] = ()

_DEFINES = r"""
#define SS_COPY_MAX_RANK 8
/* Edge, in elements, of the square tiles of the blocked transpose. */
#define SS_COPY_TILE @TILE@
/* Copies moving at least this many bytes are split across threads. */
#define SS_COPY_PAR_BYTES @PARALLEL_BYTES@
/* A long contiguous copy is shared among threads in pieces of this many bytes. */
#define SS_COPY_CHUNK_BYTES @CHUNK_BYTES@
"""

_PLAN = r"""
/* A canonical view: extents > 1, dims ordered by decreasing |dst stride|, merged where
   contiguous in both tensors. rank >= 1 (a single element is shape [1]). */
typedef struct {
    int64_t rank;
    int64_t shape[SS_COPY_MAX_RANK];
    int64_t src[SS_COPY_MAX_RANK];
    int64_t dst[SS_COPY_MAX_RANK];
    /* blocked transpose only: the dim read with the smallest src stride, tiled together
       with the innermost one. -1 when the plan is not a transpose. */
    int64_t tdim;
} ss_copy_plan;

static inline int64_t ss_copy_abs(int64_t v) { return v < 0 ? -v : v; }
"""

_PAD_FOLD = Function("int64_t", "ss_pad_fold", ("int64_t i", "int64_t n"), "    return i >= n ? 2 * n - 2 - i : i;",
                     linkage="inline", shared=True,
                     comment="Pad's reflect mode: a position in one period [0, 2n - 2) of the mirrored axis -> [0, n).")

_HELPERS = r"""
/* Returns 0 when the index space is empty (nothing to copy). */
static int ss_copy_canon(ss_copy_plan* p, int64_t rank, const int64_t* shape,
                         const int64_t* ss, const int64_t* ds)
{
    int64_t r = 0;
    for (int64_t d = 0; d < rank; ++d) {
        if (shape[d] == 0) return 0;
        if (shape[d] == 1) continue;
        p->shape[r] = shape[d]; p->src[r] = ss[d]; p->dst[r] = ds[d]; ++r;
    }
    /* Insertion sort (rank <= 8, stable): the dim written with the smallest stride goes
       innermost, whatever order the caller listed the dims in. */
    for (int64_t i = 1; i < r; ++i) {
        int64_t sh = p->shape[i], s = p->src[i], t = p->dst[i], j = i;
        while (j > 0 && (ss_copy_abs(p->dst[j - 1]) < ss_copy_abs(t) ||
                         (ss_copy_abs(p->dst[j - 1]) == ss_copy_abs(t) &&
                          ss_copy_abs(p->src[j - 1]) < ss_copy_abs(s)))) {
            p->shape[j] = p->shape[j - 1]; p->src[j] = p->src[j - 1]; p->dst[j] = p->dst[j - 1];
            --j;
        }
        p->shape[j] = sh; p->src[j] = s; p->dst[j] = t;
    }
    /* Merge each dim into its inner neighbour when both tensors step over it exactly. */
    int64_t m = 0;
    for (int64_t d = 0; d < r; ++d) {
        if (m > 0 && p->src[m - 1] == p->src[d] * p->shape[d] && p->dst[m - 1] == p->dst[d] * p->shape[d]) {
            p->shape[m - 1] *= p->shape[d];
            p->src[m - 1] = p->src[d]; p->dst[m - 1] = p->dst[d];
        } else {
            p->shape[m] = p->shape[d]; p->src[m] = p->src[d]; p->dst[m] = p->dst[d]; ++m;
        }
    }
    if (m == 0) { p->shape[0] = 1; p->src[0] = 1; p->dst[0] = 1; m = 1; }
    p->rank = m;
    p->tdim = -1;
    int64_t in = m - 1, is = ss_copy_abs(p->src[in]);
    if (p->dst[in] == 1 && is > 1) {
        int64_t best = is;
        for (int64_t d = 0; d < in; ++d) {
            int64_t a = ss_copy_abs(p->src[d]);
            if (a > 0 && a < best) { best = a; p->tdim = d; }
        }
    }
    return 1;
}

/* Sets idx (over the dims listed in dims[0..nd)) to the multi-index of linear position
   pos, and returns the matching src and dst offsets in elements. */
static void ss_copy_decode(const ss_copy_plan* p, const int64_t* dims, int64_t nd, int64_t pos,
                           int64_t* idx, int64_t* so, int64_t* dof)
{
    int64_t s = 0, t = 0;
    for (int64_t k = nd - 1; k >= 0; --k) {
        int64_t d = dims[k], n = p->shape[d];
        idx[k] = pos % n; pos /= n;
        s += idx[k] * p->src[d]; t += idx[k] * p->dst[d];
    }
    *so = s; *dof = t;
}

/* Odometer step over dims[0..nd), keeping the offsets in step. */
static inline void ss_copy_next(const ss_copy_plan* p, const int64_t* dims, int64_t nd,
                                int64_t* idx, int64_t* so, int64_t* dof)
{
    for (int64_t k = nd - 1; k >= 0; --k) {
        int64_t d = dims[k];
        if (++idx[k] < p->shape[d]) { *so += p->src[d]; *dof += p->dst[d]; return; }
        idx[k] = 0;
        *so -= (p->shape[d] - 1) * p->src[d]; *dof -= (p->shape[d] - 1) * p->dst[d];
    }
}
"""

# Per element type: the row loop and the tile loop. @T@ is the C type, @E@ its size.
_TYPED = r"""
/* Rows [r0, r1) of the plan's outer dims; each row is the innermost dim. */
static void ss_copy_rows_@E@(const ss_copy_plan* p, const char* src, char* dst, int64_t r0, int64_t r1)
{
    int64_t dims[SS_COPY_MAX_RANK], idx[SS_COPY_MAX_RANK], nd = p->rank - 1, so, dof;
    for (int64_t k = 0; k < nd; ++k) dims[k] = k;
    ss_copy_decode(p, dims, nd, r0, idx, &so, &dof);
    const int64_t n = p->shape[nd], ss = p->src[nd], ds = p->dst[nd];
    for (int64_t r = r0; r < r1; ++r) {
        const @T@* s = (const @T@*)src + so;
        @T@* d = (@T@*)dst + dof;
        if (ss == 1 && ds == 1) {
            memcpy(d, s, (size_t)n * @E@);
        } else if (ss == 0) {
            const @T@ v = *s;
            for (int64_t i = 0; i < n; ++i) d[i * ds] = v;
        } else if (ds == 1) {
            for (int64_t i = 0; i < n; ++i) d[i] = s[i * ss];
        } else {
            for (int64_t i = 0; i < n; ++i) d[i * ds] = s[i * ss];
        }
        ss_copy_next(p, dims, nd, idx, &so, &dof);
    }
}

/* One tile: element (a, b) read at s[a*sa + b*sb], written at d[a*da + b]. */
static void ss_copy_tile_@E@(const @T@* s, int64_t sa, int64_t sb, @T@* d, int64_t da,
                             int64_t na, int64_t nb)
{
    int64_t a0 = 0;
@SIMD_TILE@
    for (int64_t a = a0; a < na; ++a) {
        const @T@* sr = s + a * sa;
        @T@* dr = d + a * da;
        for (int64_t b = 0; b < nb; ++b) dr[b] = sr[b * sb];
    }
}

/* Work units [u0, u1) of the blocked transpose: each unit is one tile-row (SS_COPY_TILE
   values of the transposed dim) at one position of the remaining outer dims. */
static void ss_copy_tiles_@E@(const ss_copy_plan* p, const char* src, char* dst, int64_t u0, int64_t u1)
{
    const int64_t in = p->rank - 1, td = p->tdim;
    const int64_t na = p->shape[td], nb = p->shape[in];
    const int64_t tiles_a = (na + SS_COPY_TILE - 1) / SS_COPY_TILE;
    int64_t dims[SS_COPY_MAX_RANK], idx[SS_COPY_MAX_RANK], nd = 0, so, dof;
    for (int64_t k = 0; k < in; ++k) if (k != td) dims[nd++] = k;
    ss_copy_decode(p, dims, nd, u0 / tiles_a, idx, &so, &dof);
    int64_t ta = u0 % tiles_a;
    for (int64_t u = u0; u < u1; ++u) {
        const int64_t a0 = ta * SS_COPY_TILE;
        const int64_t ea = na - a0 < SS_COPY_TILE ? na - a0 : SS_COPY_TILE;
        const @T@* s = (const @T@*)src + so + a0 * p->src[td];
        @T@* d = (@T@*)dst + dof + a0 * p->dst[td];
        for (int64_t b0 = 0; b0 < nb; b0 += SS_COPY_TILE) {
            const int64_t eb = nb - b0 < SS_COPY_TILE ? nb - b0 : SS_COPY_TILE;
            ss_copy_tile_@E@(s + b0 * p->src[in], p->src[td], p->src[in], d + b0, p->dst[td], ea, eb);
        }
        if (++ta == tiles_a) { ta = 0; ss_copy_next(p, dims, nd, idx, &so, &dof); }
    }
}
"""

_FILL_TYPED = r"""
static void ss_fill_@E@(void* dst, int64_t n, const void* value)
{
    @T@ v;
    memcpy(&v, value, sizeof v);
    @T@* restrict d = (@T@*)dst;
    #pragma omp parallel for schedule(static) if(n * @E@ >= SS_COPY_PAR_BYTES)
    for (int64_t i = 0; i < n; ++i) d[i] = v;
}
"""

# AVX2 8x8 transposes for 4-byte elements when the tile reads src contiguously along a.
_SIMD_TILE_4 = r"""#ifdef __AVX2__
    if (sa == 1) {
        for (; a0 + 8 <= na; a0 += 8) {
            int64_t b = 0;
            for (; b + 8 <= nb; b += 8) {
                const float* q = (const float*)(s + a0 + b * sb);
                __m256 r0 = _mm256_loadu_ps(q), r1 = _mm256_loadu_ps(q + sb);
                __m256 r2 = _mm256_loadu_ps(q + 2 * sb), r3 = _mm256_loadu_ps(q + 3 * sb);
                __m256 r4 = _mm256_loadu_ps(q + 4 * sb), r5 = _mm256_loadu_ps(q + 5 * sb);
                __m256 r6 = _mm256_loadu_ps(q + 6 * sb), r7 = _mm256_loadu_ps(q + 7 * sb);
                __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
                __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
                __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
                __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
                __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
                __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
                __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
                __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
                float* o = (float*)(d + a0 * da + b);
                _mm256_storeu_ps(o,          _mm256_permute2f128_ps(u0, u4, 0x20));
                _mm256_storeu_ps(o + da,     _mm256_permute2f128_ps(u1, u5, 0x20));
                _mm256_storeu_ps(o + 2 * da, _mm256_permute2f128_ps(u2, u6, 0x20));
                _mm256_storeu_ps(o + 3 * da, _mm256_permute2f128_ps(u3, u7, 0x20));
                _mm256_storeu_ps(o + 4 * da, _mm256_permute2f128_ps(u0, u4, 0x31));
                _mm256_storeu_ps(o + 5 * da, _mm256_permute2f128_ps(u1, u5, 0x31));
                _mm256_storeu_ps(o + 6 * da, _mm256_permute2f128_ps(u2, u6, 0x31));
                _mm256_storeu_ps(o + 7 * da, _mm256_permute2f128_ps(u3, u7, 0x31));
            }
            for (int64_t a = a0; a < a0 + 8; ++a)
                for (int64_t bb = b; bb < nb; ++bb) d[a * da + bb] = s[a + bb * sb];
        }
    }
#endif"""

# AVX2 for 8-byte elements: 8 (a) x 4 (b) blocks, so each src row load takes a whole
# 64-byte line at once; that keeps power-of-two strides (4 KiB aliasing) from evicting
# half-used lines between blocks.
_SIMD_TILE_8 = r"""#ifdef __AVX2__
    if (sa == 1) {
        for (; a0 + 8 <= na; a0 += 8) {
            int64_t b = 0;
            for (; b + 4 <= nb; b += 4) {
                const double* q = (const double*)(s + a0 + b * sb);
                for (int64_t h = 0; h < 8; h += 4) {
                    __m256d r0 = _mm256_loadu_pd(q + h), r1 = _mm256_loadu_pd(q + h + sb);
                    __m256d r2 = _mm256_loadu_pd(q + h + 2 * sb), r3 = _mm256_loadu_pd(q + h + 3 * sb);
                    __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1);
                    __m256d t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
                    double* o = (double*)(d + (a0 + h) * da + b);
                    _mm256_storeu_pd(o,          _mm256_permute2f128_pd(t0, t2, 0x20));
                    _mm256_storeu_pd(o + da,     _mm256_permute2f128_pd(t1, t3, 0x20));
                    _mm256_storeu_pd(o + 2 * da, _mm256_permute2f128_pd(t0, t2, 0x31));
                    _mm256_storeu_pd(o + 3 * da, _mm256_permute2f128_pd(t1, t3, 0x31));
                }
            }
            for (int64_t a = a0; a < a0 + 8; ++a)
                for (int64_t bb = b; bb < nb; ++bb) d[a * da + bb] = s[a + bb * sb];
        }
    }
#endif"""

_RUN = r"""
typedef void (*ss_copy_body)(const ss_copy_plan*, const char*, char*, int64_t, int64_t);

/* Runs body over units [0, units), one contiguous range per thread when the copy is big. */
static void ss_copy_run(ss_copy_body body, const ss_copy_plan* p, const char* src, char* dst,
                        int64_t units, int64_t bytes)
{
    #pragma omp parallel if(bytes >= SS_COPY_PAR_BYTES && units > 1)
    {
        const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t u0 = units / nt * t + (t < units % nt ? t : units % nt);
        const int64_t u1 = u0 + units / nt + (t < units % nt ? 1 : 0);
        if (u0 < u1) body(p, src, dst, u0, u1);
    }
}

/* Elements of another size: bytewise, one memcpy per element unless rows are contiguous. */
static void ss_copy_rows_any(const ss_copy_plan* p, int64_t es, const char* src, char* dst)
{
    int64_t dims[SS_COPY_MAX_RANK], idx[SS_COPY_MAX_RANK], nd = p->rank - 1, so, dof, rows = 1;
    for (int64_t k = 0; k < nd; ++k) { dims[k] = k; rows *= p->shape[k]; }
    ss_copy_decode(p, dims, nd, 0, idx, &so, &dof);
    const int64_t n = p->shape[nd], ss = p->src[nd], ds = p->dst[nd];
    for (int64_t r = 0; r < rows; ++r) {
        if (ss == 1 && ds == 1) memcpy(dst + dof * es, src + so * es, (size_t)(n * es));
        else for (int64_t i = 0; i < n; ++i) memcpy(dst + (dof + i * ds) * es, src + (so + i * ss) * es, (size_t)es);
        ss_copy_next(p, dims, nd, idx, &so, &dof);
    }
}

"""

# ss_copy's and ss_fill's bodies; @CASES@ and @FILL_CASES@ are their switches' cases per element size.
_COPY_BODY = r"""
    ss_copy_plan p;
    if (!ss_copy_canon(&p, rank, shape, src_strides, dst_strides)) return;
    int64_t total = 1;
    for (int64_t d = 0; d < p.rank; ++d) total *= p.shape[d];
    const int64_t bytes = total * elem_size;
    ss_copy_body rows = 0, tiles = 0;
    switch (elem_size) {
@CASES@
    default: ss_copy_rows_any(&p, elem_size, (const char*)src, (char*)dst); return;
    }
    if (p.rank == 1 && p.src[0] == 1 && p.dst[0] == 1 && bytes >= SS_COPY_PAR_BYTES) {
        /* One long contiguous run: threads share it as rows of SS_COPY_CHUNK_BYTES, and
           the tail that does not fill a row is copied after them. */
        const int64_t chunk = SS_COPY_CHUNK_BYTES / elem_size > 0 ? SS_COPY_CHUNK_BYTES / elem_size : 1;
        p.rank = 2; p.shape[0] = total / chunk; p.shape[1] = chunk;
        p.src[0] = p.dst[0] = chunk; p.src[1] = p.dst[1] = 1;
        if (p.shape[0] > 0) ss_copy_run(rows, &p, (const char*)src, (char*)dst, p.shape[0], bytes);
        const int64_t done = p.shape[0] * chunk * elem_size;
        memcpy((char*)dst + done, (const char*)src + done, (size_t)(bytes - done));
        return;
    }
    const int64_t in = p.rank - 1;
    if (p.tdim >= 0) {
        const int64_t tiles_a = (p.shape[p.tdim] + SS_COPY_TILE - 1) / SS_COPY_TILE;
        ss_copy_run(tiles, &p, (const char*)src, (char*)dst, total / p.shape[p.tdim] / p.shape[in] * tiles_a, bytes);
    } else {
        ss_copy_run(rows, &p, (const char*)src, (char*)dst, total / p.shape[in], bytes);
    }"""

_FILL_BODY = r"""
    if (n <= 0) return;
    switch (elem_size) {
@FILL_CASES@
    default:
        for (int64_t i = 0; i < n; ++i) memcpy((char*)dst + i * elem_size, value, (size_t)elem_size);
    }"""


def fragment(tile: int = 32, parallel_bytes: int = 1 << 20, chunk_bytes: int = 1 << 16) -> Fragment:
    """The C fragment defining ``ss_copy`` and ``ss_fill`` (and ``ss_pad_fold``, which units
    that pad in reflect mode inline).

    ``tile``: edge (elements) of the square tiles of the blocked transpose; a multiple of 8
    keeps the 4-byte AVX2 path on full 8x8 blocks. ``parallel_bytes``: copies and fills
    moving at least this many bytes run on all OpenMP threads (below about 1 MiB a copy
    is over before a parallel region pays for itself, and on a loaded machine a region
    waits for its slowest thread). ``chunk_bytes``: the pieces in which threads share one
    long contiguous copy.
    """
    if tile < 1 or parallel_bytes < 1 or chunk_bytes < 1:
        raise ValueError(f"bad layout parameters: tile={tile}, parallel_bytes={parallel_bytes}, "
                         f"chunk_bytes={chunk_bytes}")
    parts = [Private(fill(_DEFINES, TILE=tile, PARALLEL_BYTES=parallel_bytes, CHUNK_BYTES=chunk_bytes)),
             Private(_PLAN), _PAD_FOLD, Private(_HELPERS)]
    cases, fill_cases = CWriter(level=1), CWriter(level=1)
    for size, ctype in _ELEM_TYPES:
        simd = {4: _SIMD_TILE_4, 8: _SIMD_TILE_8}.get(size, "")
        parts.append(Private(fill(_TYPED, E=size, T=ctype, SIMD_TILE=simd)))
        parts.append(Private(fill(_FILL_TYPED, E=size, T=ctype)))
        cases.line(f"case {size}: rows = ss_copy_rows_{size}; tiles = ss_copy_tiles_{size}; break;")
        fill_cases.line(f"case {size}: ss_fill_{size}(dst, n, value); return;")
    parts += [
        Private(_RUN),
        Function("void", "ss_copy", ("int64_t elem_size", "int64_t rank", "const int64_t* shape", "const void* src",
                                     "const int64_t* src_strides", "void* dst", "const int64_t* dst_strides"),
                 fill(_COPY_BODY, CASES=cases.text().rstrip("\n"))),
        Function("void", "ss_fill", ("int64_t elem_size", "void* dst", "int64_t n", "const void* value"),
                 fill(_FILL_BODY, FILL_CASES=fill_cases.text().rstrip("\n"))),
    ]
    return Fragment(parts)


def source(tile: int = 32, parallel_bytes: int = 1 << 20, chunk_bytes: int = 1 << 16) -> str:
    return fragment(tile, parallel_bytes, chunk_bytes).text()
