"""Kernel selection and dispatch: greedy cover, a decision tree over M, and its C code.

``greedy_cover`` picks at most K schedules so that every sampled M has a near-best one;
``fit_tree`` learns which of them to call at each M of the whole range (sklearn's
DecisionTreeClassifier on the single feature M) and keeps it as nested JSON; the tree is
emitted as nested ``if (M <= t)`` in ``ss_gemm_tuned``, which calls the kernels compiled
side by side under the prefixes ``k0_``, ``k1_``, ... Each kernel packs B its own way, so
``ss_gemm_tuned_pack_b`` packs B once per kernel into one buffer, the kernels' parts one
after another.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..codegen.kernels import gemm
from ..codegen.kernels.gemm import GemmSchedule
from ..codegen.kernels.prelude import PRELUDE

# Stop adding kernels when one more saves less than this fraction of the summed time.
MIN_GAIN = 0.005


def greedy_cover(times: np.ndarray, max_kernels: int) -> list[int]:
    """Rows of ``times`` (candidates x sampled Ms, seconds; inf = unusable) to keep: each
    step adds the row that most lowers the sum over M of (best kept time / best time)."""
    best = times.min(axis=0)
    chosen: list[int] = []
    current = np.full(times.shape[1], np.inf)
    while len(chosen) < max_kernels:
        costs = [float(np.sum(np.minimum(current, row) / best)) for row in times]
        i = int(np.argmin(costs))
        now = float(np.sum(current / best)) if chosen else np.inf
        if chosen and (i in chosen or now - costs[i] < MIN_GAIN * now):
            break
        chosen.append(i)
        current = np.minimum(current, times[i])
    return chosen


def fit_tree(ms: Sequence[int], labels: Sequence[int], max_leaves: int) -> dict:
    """A decision tree from M to a label, as nested JSON: {"leaf": i} or
    {"le": t, "left": ..., "right": ...} (left for M <= t, t an integer)."""
    labels = list(labels)
    if len(set(labels)) == 1:
        return {"leaf": int(labels[0])}
    from sklearn.tree import DecisionTreeClassifier

    clf = DecisionTreeClassifier(max_leaf_nodes=max(2, max_leaves), random_state=0)
    clf.fit(np.asarray(ms, dtype=float).reshape(-1, 1), labels)
    t = clf.tree_

    def node(i: int) -> dict:
        if t.children_left[i] == -1:
            return {"leaf": int(clf.classes_[int(np.argmax(t.value[i][0]))])}
        # sklearn splits at midpoints (x <= 8.5); M is an integer, so M <= floor(8.5) is the same.
        return {"le": int(np.floor(t.threshold[i])), "left": node(t.children_left[i]), "right": node(t.children_right[i])}

    return _merge(node(0))


def _merge(tree: dict) -> dict:
    """Fold splits whose two sides end in the same leaf."""
    if "leaf" in tree:
        return tree
    left, right = _merge(tree["left"]), _merge(tree["right"])
    if "leaf" in left and left == right:
        return left
    return {"le": tree["le"], "left": left, "right": right}


def choose(tree: dict, m: int) -> int:
    while "leaf" not in tree:
        tree = tree["left"] if m <= tree["le"] else tree["right"]
    return tree["leaf"]


def tree_c(tree: dict, indent: str = "    ") -> str:
    """The tree as nested ifs returning the kernel index (``ss_gemm_tuned_choice``'s body)."""
    if "leaf" in tree:
        return f"{indent}return {tree['leaf']};"
    return (f"{indent}if (M <= {tree['le']}) {{\n{tree_c(tree['left'], indent + '    ')}\n{indent}}} else {{\n"
            f"{tree_c(tree['right'], indent + '    ')}\n{indent}}}")


def prefix(i: int) -> str:
    return f"k{i}_"


def dispatcher_c(kernels: Sequence[GemmSchedule], tree: dict) -> str:
    """``ss_gemm_tuned_choice``, ``ss_gemm_tuned_packed_b_size``, ``ss_gemm_tuned_pack_b``,
    ``ss_gemm_tuned`` and ``ss_gemm_tuned_bench`` (a timing loop), without the kernels."""
    n = len(kernels)
    sizes = " + ".join(f"{prefix(i)}gemm_packed_b_size(K, N)" for i in range(n))
    offsets = "\n".join(f"    if (i == {i}) return off;\n    off += {prefix(i)}gemm_packed_b_size(K, N);"
                        for i in range(n))
    packs = "\n".join(f"    {prefix(i)}gemm_pack_b(K, N, B, rsb, csb, packed + ss_gemm_tuned_offset({i}, K, N));"
                      for i in range(n))
    calls = "\n".join(f"    case {i}: {prefix(i)}gemm_prepacked(M, N, K, 1, 1, A, 0, 0, lda, 1, p, C, 0, 0, ldc, "
                      f"1.0f, NULL, 0.0f, 0, 0, 0); break;" for i in range(n))
    return f"""
/* ---- tuned dispatch (shapeshift/tune/dispatch.py): {n} kernel(s) ---- */
int ss_gemm_tuned_choice(int64_t M)
{{
{tree_c(tree)}
}}

static int64_t ss_gemm_tuned_offset(int i, int64_t K, int64_t N)
{{
    int64_t off = 0;
{offsets}
    return off;
}}

int64_t ss_gemm_tuned_packed_b_size(int64_t K, int64_t N) {{ return {sizes}; }}

void ss_gemm_tuned_pack_b(int64_t K, int64_t N, const float* B, int64_t rsb, int64_t csb, float* packed)
{{
{packs}
}}

/* C[M,N] (row stride ldc) = A[M,K] (row stride lda) x B, B packed by ss_gemm_tuned_pack_b. */
void ss_gemm_tuned(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* packed,
                   float* C, int64_t ldc)
{{
    const int i = ss_gemm_tuned_choice(M);
    const float* p = packed + ss_gemm_tuned_offset(i, K, N);
    switch (i) {{
{calls}
    default: break;
    }}
}}

double ss_gemm_tuned_bench(int64_t calls, int64_t M, int64_t N, int64_t K, const float* A, const float* packed, float* C)
{{
    double start = omp_get_wtime();
    for (int64_t i = 0; i < calls; ++i) ss_gemm_tuned(M, N, K, A, K, packed, C, N);
    return (omp_get_wtime() - start) / (double)calls;
}}
"""


def library_source(kernels: Sequence[GemmSchedule], tree: dict) -> str:
    """A complete C library: the prelude, every kernel under its prefix, the dispatcher."""
    return PRELUDE + "".join(gemm.source(s, prefix=prefix(i)) for i, s in enumerate(kernels)) + dispatcher_c(kernels, tree)


def load(lib):
    """Set the ctypes signatures on a compiled dispatcher library's ``cdll``; returns it."""
    import ctypes

    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.ss_gemm_tuned_choice.argtypes = [i64]
    lib.ss_gemm_tuned_choice.restype = ctypes.c_int
    lib.ss_gemm_tuned_packed_b_size.argtypes = [i64, i64]
    lib.ss_gemm_tuned_packed_b_size.restype = i64
    lib.ss_gemm_tuned_pack_b.argtypes = [i64, i64, ptr, i64, i64, ptr]
    lib.ss_gemm_tuned.argtypes = [i64, i64, i64, ptr, i64, ptr, ptr, i64]
    lib.ss_gemm_tuned_bench.argtypes = [i64, i64, i64, i64, ptr, ptr, ptr]
    lib.ss_gemm_tuned_bench.restype = ctypes.c_double
    lib.ss_set_num_threads.argtypes = [ctypes.c_int]
    return lib
