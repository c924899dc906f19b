"""Indexing kernels: Gather, Where, Cast and TopK.

Exported C functions (see docs/native-kernels.md for the conventions):

``int ss_gather(int64_t elem_size, const void* data, int64_t outer, int64_t axis_dim,
int64_t inner, const int64_t* indices, int64_t n_indices, void* out);``
``int ss_gather_i32(... same ..., const int32_t* indices, int64_t n_indices, void* out);``
    Gather along an axis: ``data`` viewed as ``[outer, axis_dim, inner]``, ``out`` as
    ``[outer, n_indices, inner]``, ``out[o, i, :] = data[o, indices[i], :]``; a negative
    index counts from the end. Returns 0, or 1 when an index lies outside
    ``[-axis_dim, axis_dim)``; every index is checked before anything is written, so
    ``out`` is then left untouched. ``elem_size`` is any byte count (1, 2, 4, 8 are fast).

``void ss_where(int64_t elem_size, int64_t rank, const int64_t* shape, const uint8_t* cond,
const int64_t* cond_strides, const void* a, const int64_t* a_strides, const void* b,
const int64_t* b_strides, void* out);``
    ``out[i] = cond[i] ? a[i] : b[i]`` over the index space ``shape`` (``rank <= 8``, rank
    0 is one element); ``out`` is contiguous, each input is read through its own strides
    (in elements; 0 on broadcast axes). ``cond`` is uint8, nonzero meaning true.
    ``elem_size`` is 1, 2, 4 or 8.

``void ss_cast_<from>_<to>(const void* x, void* y, int64_t n);``
    ``y[i] = (to) x[i]`` for ``n`` contiguous elements, for every pair in ``CAST_PAIRS``
    (``from``, ``to`` among f32, f64, i64, i32, i8, u8, bool; bool is uint8 0/1), with
    numpy ``astype`` semantics: float -> integer truncates toward zero (through int64, so
    narrower integers wrap like numpy on x86; values beyond int64 are undefined), integer
    -> narrower integer wraps, anything -> bool is ``x != 0``. ``cast_function_name``
    maps numpy dtypes to the name.

``void ss_topk(const float* x, float* values, int64_t* indices, int64_t outer, int64_t n,
int64_t inner, int64_t k, int largest);``
    TopK along the middle axis of ``x [outer, n, inner]``: ``values [outer, k, inner]``
    and their int64 positions ``indices``, the k largest (``largest != 0``, descending) or
    smallest (ascending); equal values come in increasing index order (as onnxruntime).
    ``0 <= k <= n``. A bounded heap of k candidates per column keeps the cost
    O(n log k); the order of NaNs is unspecified.
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Private, fill

import numpy as np

DEPENDS: tuple[str, ...] = ()

# Cast type codes, their C types and numpy dtypes.
_CAST_TYPES = {
    "f32": ("float", np.dtype(np.float32)),
    "f64": ("double", np.dtype(np.float64)),
    "i64": ("int64_t", np.dtype(np.int64)),
    "i32": ("int32_t", np.dtype(np.int32)),
    "i8": ("int8_t", np.dtype(np.int8)),
    "u8": ("uint8_t", np.dtype(np.uint8)),
    "bool": ("uint8_t", np.dtype(np.bool_)),
}
_FLOATS = ("f32", "f64")

CAST_PAIRS: tuple[tuple[str, str], ...] = tuple((f, t) for f in _CAST_TYPES for t in _CAST_TYPES)
"""Every (from, to) type-code pair with an ``ss_cast_<from>_<to>`` function."""

_ELEM_TYPES = ((1, "uint8_t"), (2, "uint16_t"), (4, "uint32_t"), (8, "uint64_t"))


def cast_type_code(dtype) -> str:
    """The cast type code (``f32``, ``bool``, ...) of a numpy dtype; ValueError if none."""
    dt = np.dtype(dtype)
    for code, (_, np_dtype) in _CAST_TYPES.items():
        if np_dtype == dt:
            return code
    raise ValueError(f"no native cast for dtype {dt}")


def cast_function_name(from_dtype, to_dtype) -> str:
    """``ss_cast_<from>_<to>`` for two numpy dtypes, e.g. (float32, int64) -> ss_cast_f32_i64."""
    return f"ss_cast_{cast_type_code(from_dtype)}_{cast_type_code(to_dtype)}"


def _cast_expr(src: str, dst: str) -> str:
    """C expression converting ``xs[i]`` (type of src) to the type of dst, as numpy does."""
    if dst == "bool":
        return "(uint8_t)(xs[i] != 0)"
    value = "(xs[i] != 0)" if src == "bool" else "xs[i]"
    if src in _FLOATS and dst not in _FLOATS and dst != "i64":
        # numpy's float -> narrow int wraps the truncated value; C leaves it undefined.
        value = "(int64_t)xs[i]"
    return f"({_CAST_TYPES[dst][0]}){value}"


def _casts(parallel_elems: int) -> list[Function]:
    out = []
    for src, dst in CAST_PAIRS:
        cs, cd = _CAST_TYPES[src][0], _CAST_TYPES[dst][0]
        body = ("memcpy(y, x, (size_t)n * sizeof(" + cs + "));" if src == dst else
                f"""const {cs}* restrict xs = (const {cs}*)x;
    {cd}* restrict ys = ({cd}*)y;
    #pragma omp parallel for schedule(static) if(n >= {parallel_elems})
    for (int64_t i = 0; i < n; ++i) ys[i] = {_cast_expr(src, dst)};""")
        out.append(Function("void", f"ss_cast_{src}_{dst}", ("const void* x", "void* y", "int64_t n"),
                            f"    if (n <= 0) return;\n    {body}"))
    return out


_GATHER = r"""
/* 0 when every index is in [-axis_dim, axis_dim). */
static int ss_gather_check_@IDX@(const @IT@* indices, int64_t n, int64_t axis_dim)
{
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad |= (int64_t)indices[i] < -axis_dim || (int64_t)indices[i] >= axis_dim;
    return bad;
}
"""

_GATHER_BODY = r"""
    if (ss_gather_check_@IDX@(indices, n_indices, axis_dim)) return 1;
    const int64_t rows = outer * n_indices, row_bytes = inner * elem_size;
    if (rows == 0 || row_bytes == 0) return 0;
    const char* src = (const char*)data;
    char* dst = (char*)out;
    if (inner == 1 && (elem_size == 1 || elem_size == 2 || elem_size == 4 || elem_size == 8)) {
        /* One element per row: a typed loop, not a memcpy call per element. */
        switch (elem_size) {
@ELEM_CASES@
        }
        return 0;
    }
    #pragma omp parallel for schedule(static) if(rows * row_bytes >= SS_INDEXING_PAR_BYTES)
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = r / n_indices;
        int64_t idx = (int64_t)indices[r % n_indices];
        if (idx < 0) idx += axis_dim;
        memcpy(dst + r * row_bytes, src + (o * axis_dim + idx) * row_bytes, (size_t)row_bytes);
    }
    return 0;
"""

_GATHER_ELEM_CASE = r"""        case @E@: {
            const @T@* s = (const @T@*)src;
            @T@* d = (@T@*)dst;
            #pragma omp parallel for schedule(static) if(rows * @E@ >= SS_INDEXING_PAR_BYTES)
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t o = r / n_indices;
                int64_t idx = (int64_t)indices[r % n_indices];
                if (idx < 0) idx += axis_dim;
                d[r] = s[o * axis_dim + idx];
            }
            break;
        }"""

_WHERE_COMMON = r"""
#define SS_WHERE_MAX_RANK 8

/* Where's view after dropping extent-1 dims and merging dims every input steps over
   uniformly; rank >= 1. */
typedef struct {
    int64_t rank;
    int64_t shape[SS_WHERE_MAX_RANK];
    int64_t st[3][SS_WHERE_MAX_RANK];  /* cond, a, b */
} ss_where_plan;

static void ss_where_canon(ss_where_plan* p, int64_t rank, const int64_t* shape, const int64_t* const* strides)
{
    int64_t m = 0;
    for (int64_t d = 0; d < rank; ++d) {
        if (shape[d] == 1) continue;
        int merge = m > 0;
        for (int t = 0; t < 3 && merge; ++t) merge = p->st[t][m - 1] == strides[t][d] * shape[d];
        if (merge) {
            p->shape[m - 1] *= shape[d];
            for (int t = 0; t < 3; ++t) p->st[t][m - 1] = strides[t][d];
        } else {
            p->shape[m] = shape[d];
            for (int t = 0; t < 3; ++t) p->st[t][m] = strides[t][d];
            ++m;
        }
    }
    if (m == 0) { p->shape[0] = 1; p->st[0][0] = p->st[1][0] = p->st[2][0] = 0; m = 1; }
    p->rank = m;
}
"""

_WHERE_TYPED = r"""
/* Rows [r0, r1) of the outer dims of the plan; out is contiguous. */
static void ss_where_rows_@E@(const ss_where_plan* p, const uint8_t* cond, const @T@* a, const @T@* b,
                              @T@* out, int64_t r0, int64_t r1)
{
    const int64_t in = p->rank - 1, n = p->shape[in];
    const int64_t cs = p->st[0][in], as = p->st[1][in], bs = p->st[2][in];
    int64_t idx[SS_WHERE_MAX_RANK], off[3] = {0, 0, 0}, pos = r0;
    for (int64_t d = in - 1; d >= 0; --d) {
        idx[d] = pos % p->shape[d]; pos /= p->shape[d];
        for (int t = 0; t < 3; ++t) off[t] += idx[d] * p->st[t][d];
    }
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* c = cond + off[0];
        const @T@* x = a + off[1];
        const @T@* y = b + off[2];
        @T@* restrict o = out + r * n;
        if (cs == 1 && as == 1 && bs == 1) {
            for (int64_t i = 0; i < n; ++i) o[i] = c[i] ? x[i] : y[i];
        } else if (cs == 1 && as == 1 && bs == 0) {
            const @T@ yv = *y;
            for (int64_t i = 0; i < n; ++i) o[i] = c[i] ? x[i] : yv;
        } else if (cs == 1 && as == 0 && bs == 1) {
            const @T@ xv = *x;
            for (int64_t i = 0; i < n; ++i) o[i] = c[i] ? xv : y[i];
        } else {
            for (int64_t i = 0; i < n; ++i) o[i] = c[i * cs] ? x[i * as] : y[i * bs];
        }
        for (int64_t d = in - 1; d >= 0; --d) {
            if (++idx[d] < p->shape[d]) {
                for (int t = 0; t < 3; ++t) off[t] += p->st[t][d];
                break;
            }
            idx[d] = 0;
            for (int t = 0; t < 3; ++t) off[t] -= (p->shape[d] - 1) * p->st[t][d];
        }
    }
}
"""

_WHERE_BODY = r"""
    for (int64_t d = 0; d < rank; ++d) if (shape[d] == 0) return;
    const int64_t* strides[3] = {cond_strides, a_strides, b_strides};
    ss_where_plan p;
    ss_where_canon(&p, rank, shape, strides);
    int64_t rows = 1;
    for (int64_t d = 0; d + 1 < p.rank; ++d) rows *= p.shape[d];
    const int64_t bytes = rows * p.shape[p.rank - 1] * elem_size;
    #pragma omp parallel if(bytes >= SS_INDEXING_PAR_BYTES && rows > 1)
    {
        const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t r0 = rows / nt * t + (t < rows % nt ? t : rows % nt);
        const int64_t r1 = r0 + rows / nt + (t < rows % nt ? 1 : 0);
        if (r0 < r1) {
            switch (elem_size) {
@CASES@
            }
        }
    }
"""

_TOPK = r"""
/* Heap entries ordered so that the root is the worst kept candidate. */
typedef struct { float v; int64_t i; } ss_topk_item;

/* 1 when a is above b in TopK's order of values, where NaN is above every number (as
   onnxruntime and NumPy order them: the largest k start with the NaNs, the smallest skip them). */
static inline int ss_topk_above(float a, float b)
{
    return a > b || (a != a && b == b);
}

/* 1 when p ranks after q in the output order (q is kept before p). */
static inline int ss_topk_worse(ss_topk_item p, ss_topk_item q, int largest)
{
    if (ss_topk_above(p.v, q.v)) return !largest;
    if (ss_topk_above(q.v, p.v)) return largest;
    return p.i > q.i;
}

static void ss_topk_sift(ss_topk_item* h, int64_t size, int64_t pos, int largest)
{
    const ss_topk_item item = h[pos];
    for (;;) {
        int64_t c = 2 * pos + 1;
        if (c >= size) break;
        if (c + 1 < size && ss_topk_worse(h[c + 1], h[c], largest)) ++c;
        if (!ss_topk_worse(h[c], item, largest)) break;
        h[pos] = h[c];
        pos = c;
    }
    h[pos] = item;
}

/* One column: x[j * stride] for j < n, k winners into values/indices (stride apart). */
static void ss_topk_column(const float* x, int64_t stride, int64_t n, int64_t k, int largest,
                           ss_topk_item* heap, float* values, int64_t* indices)
{
    for (int64_t j = 0; j < k; ++j) { heap[j].v = x[j * stride]; heap[j].i = j; }
    for (int64_t j = k / 2 - 1; j >= 0; --j) ss_topk_sift(heap, k, j, largest);
    for (int64_t j = k; j < n; ++j) {
        const float v = x[j * stride];
        /* A later index loses every tie, so only a strictly better value enters. */
        if (largest ? ss_topk_above(v, heap[0].v) : ss_topk_above(heap[0].v, v)) {
            heap[0].v = v; heap[0].i = j;
            ss_topk_sift(heap, k, 0, largest);
        }
    }
    for (int64_t size = k; size > 0; --size) {
        values[(size - 1) * stride] = heap[0].v;
        indices[(size - 1) * stride] = heap[0].i;
        heap[0] = heap[size - 1];
        ss_topk_sift(heap, size - 1, 0, largest);
    }
}
"""

_TOPK_BODY = r"""
    const int64_t columns = outer * inner;
    if (columns == 0 || k <= 0) return;
    #pragma omp parallel if(columns > 1 && columns * n >= SS_TOPK_PAR_ELEMS)
    {
        ss_topk_item* heap = (ss_topk_item*)malloc((size_t)k * sizeof(ss_topk_item));
        /* A strided column is copied out first, so the scan reads contiguous memory. */
        float* col = inner > 1 ? (float*)malloc((size_t)n * sizeof(float)) : NULL;
        float* vcol = inner > 1 ? (float*)malloc((size_t)k * sizeof(float)) : NULL;
        int64_t* icol = inner > 1 ? (int64_t*)malloc((size_t)k * sizeof(int64_t)) : NULL;
        #pragma omp for schedule(static)
        for (int64_t c = 0; c < columns; ++c) {
            const int64_t o = c / inner, q = c % inner;
            const float* xc = x + o * n * inner + q;
            float* vc = values + o * k * inner + q;
            int64_t* ic = indices + o * k * inner + q;
            if (inner == 1) {
                ss_topk_column(xc, 1, n, k, largest, heap, vc, ic);
            } else {
                for (int64_t j = 0; j < n; ++j) col[j] = xc[j * inner];
                ss_topk_column(col, 1, n, k, largest, heap, vcol, icol);
                for (int64_t j = 0; j < k; ++j) { vc[j * inner] = vcol[j]; ic[j * inner] = icol[j]; }
            }
        }
        free(heap); free(col); free(vcol); free(icol);
    }
"""


_GATHER_PARAMS = ("int64_t elem_size", "const void* data", "int64_t outer", "int64_t axis_dim", "int64_t inner")


def source(parallel_bytes: int = 1 << 20, parallel_cast_elems: int = 1 << 18,
           topk_parallel_elems: int = 1 << 15) -> str:
    """The C fragment's text (``fragment``)."""
    return fragment(parallel_bytes, parallel_cast_elems, topk_parallel_elems).text()


def fragment(parallel_bytes: int = 1 << 20, parallel_cast_elems: int = 1 << 18,
             topk_parallel_elems: int = 1 << 15) -> Fragment:
    """The C fragment defining the gather, where, cast and topk kernels (codegen/cwriter.py):
    everything private but the entry points, which are descriptors.

    ``parallel_bytes``: gathers and wheres writing at least this many bytes use every
    OpenMP thread; ``parallel_cast_elems``: the same for casts, in elements;
    ``topk_parallel_elems``: TopK scanning at least this many elements (over all columns)
    splits its columns across threads.
    """
    parts: list = [Private(f"""
#define SS_INDEXING_PAR_BYTES {int(parallel_bytes)}
#define SS_TOPK_PAR_ELEMS {int(topk_parallel_elems)}
""")]
    elem_cases = "\n".join(fill(_GATHER_ELEM_CASE, E=e, T=t) for e, t in _ELEM_TYPES)
    for idx, it, suffix in (("i64", "int64_t", ""), ("i32", "int32_t", "_i32")):
        parts += [Private(fill(_GATHER, IDX=idx, IT=it)),
                  Function("int", f"ss_gather{suffix}", (*_GATHER_PARAMS, f"const {it}* indices", "int64_t n_indices",
                                                           "void* out"),
                           fill(_GATHER_BODY, IDX=idx, ELEM_CASES=elem_cases))]
    parts.append(Private(_WHERE_COMMON))
    parts += [Private(fill(_WHERE_TYPED, E=e, T=t)) for e, t in _ELEM_TYPES]
    cases = "\n".join(
        f"            case {e}: ss_where_rows_{e}(&p, cond, (const {t}*)a, (const {t}*)b, ({t}*)out, r0, r1); break;"
        for e, t in _ELEM_TYPES)
    parts.append(Function("void", "ss_where", ("int64_t elem_size", "int64_t rank", "const int64_t* shape",
                                               "const uint8_t* cond", "const int64_t* cond_strides", "const void* a",
                                               "const int64_t* a_strides", "const void* b",
                                               "const int64_t* b_strides", "void* out"), fill(_WHERE_BODY, CASES=cases)))
    parts += _casts(int(parallel_cast_elems))
    parts += [Private(_TOPK), Function("void", "ss_topk", ("const float* x", "float* values", "int64_t* indices",
                                                           "int64_t outer", "int64_t n", "int64_t inner", "int64_t k",
                                                           "int largest"), _TOPK_BODY)]
    return Fragment(parts)
