"""Kernel selection and dispatch: greedy cover, a decision tree over M, and its C code.

``greedy_cover`` picks at most K schedules so that every sampled M has a near-best one
(``layout_cover``: by default among schedules that share one packed-B layout);
``fit_tree`` learns which of them to call at each M of the whole range (sklearn's
DecisionTreeClassifier on the single feature M) and keeps it as nested JSON; the tree is
emitted as nested ``if (M <= t)`` in ``<name>choice`` (``tuned_gemm_c``), which the
dispatcher ``<name>prepacked`` calls to pick among the kernels compiled side by side under
the prefixes ``<name>k0_``, ``<name>k1_``, ... A kernel's packed B depends on its (nr, kc),
so ``<name>pack_b`` packs one copy per distinct layout into one buffer. The native backend
emits one such dispatcher per tuned weight shape (codegen/lower/linalg.py); the standalone
library (``library_source``) is what the tuner's checks and bench/dietcode.py time.
A batched GEMM has no constant operand to pack: ``tuned_batched_c`` emits ``<name>gemm``
with ``ss_gemm``'s arguments, its tree on T (``batched_library_source``: standalone).
A group of dense GEMMs (tune/gemm_group.py) has a tree on several variables: each split
names its own (``"var"``), and ``<name>choice(M, N, K)`` takes them all (``tree_args``).
"""

from __future__ import annotations

import hashlib
from typing import Mapping, Optional, Sequence

import numpy as np

from ..codegen.cwriter import Function
from ..codegen.kernels import gemm
from ..codegen.kernels.gemm import GemmSchedule
from ..codegen.kernels.prelude import PRELUDE
from .gemm_family import batched_bench_c, layout

# Stop adding kernels when one more saves less than this fraction of the summed time.
MIN_GAIN = 0.005


def greedy_cover(times: np.ndarray, max_kernels: int, weights: Optional[np.ndarray] = None) -> list[int]:
    """Rows of ``times`` (candidates x sampled Ms, seconds; inf = unusable) to keep: each
    step adds the row that most lowers the sum over M of weight x (best kept time / best
    time); ``weights`` per sampled M (how often that shape occurs), default all 1."""
    best = times.min(axis=0)
    w = np.ones(times.shape[1]) if weights is None else np.asarray(weights, dtype=float)
    chosen: list[int] = []
    current = np.full(times.shape[1], np.inf)
    while len(chosen) < max_kernels:
        costs = [float(np.sum(w * np.minimum(current, row) / best)) for row in times]
        i = int(np.argmin(costs))
        now = float(np.sum(w * current / best)) if chosen else np.inf
        if chosen and (i in chosen or now - costs[i] < MIN_GAIN * now):
            break
        chosen.append(i)
        current = np.minimum(current, times[i])
    return chosen


def layout_cover(times: np.ndarray, layouts: Sequence[tuple[int, int]], max_kernels: int,
                 one_layout: bool = True, weights: Optional[np.ndarray] = None) -> list[int]:
    """``greedy_cover``, with ``one_layout`` restricted to kernels that read one packed B
    layout (so a model's weights are packed once, as untuned): the cover is made within
    each layout's candidates and the cheapest one kept."""
    if not one_layout:
        return greedy_cover(times, max_kernels, weights)
    best = times.min(axis=0)
    w = np.ones(times.shape[1]) if weights is None else np.asarray(weights, dtype=float)
    options = []
    for key in dict.fromkeys(layouts):
        rows = [i for i, lay in enumerate(layouts) if lay == key]
        chosen = [rows[j] for j in greedy_cover(times[rows], max_kernels, w)]
        options.append((float(np.sum(w * times[chosen].min(axis=0) / best)), chosen))
    return min(options, key=lambda o: o[0])[1]


def fit_tree(points: Sequence, labels: Sequence[int], max_leaves: int, names: Sequence[str] = ("M",)) -> dict:
    """A decision tree from a point to a label, as nested JSON: {"leaf": i} or {"le": t,
    "left": ..., "right": ...} (left for M <= t, t an integer). ``points``: ints (the one
    variable M), or tuples of ints named by ``names`` (a group's (M, N, K)), in which case
    each split also names its variable ({"var": "K", "le": ...})."""
    labels = list(labels)
    if len(set(labels)) == 1:
        return {"leaf": int(labels[0])}
    from sklearn.tree import DecisionTreeClassifier

    named = len(names) > 1
    x = np.asarray(points, dtype=float).reshape(len(labels), len(names))
    clf = DecisionTreeClassifier(max_leaf_nodes=max(2, max_leaves), random_state=0)
    clf.fit(x, labels)
    t = clf.tree_

    def node(i: int) -> dict:
        if t.children_left[i] == -1:
            return {"leaf": int(clf.classes_[int(np.argmax(t.value[i][0]))])}
        # sklearn splits at midpoints (x <= 8.5); the variables are integers, so x <= floor(8.5) is the same.
        split = {"var": names[int(t.feature[i])]} if named else {}
        return {**split, "le": int(np.floor(t.threshold[i])), "left": node(t.children_left[i]),
                "right": node(t.children_right[i])}

    return _merge(node(0))


def _merge(tree: dict) -> dict:
    """Fold splits whose two sides end in the same leaf."""
    if "leaf" in tree:
        return tree
    left, right = _merge(tree["left"]), _merge(tree["right"])
    if "leaf" in left and left == right:
        return left
    return {**{k: v for k, v in tree.items() if k not in ("left", "right")}, "left": left, "right": right}


def choose(tree: dict, point) -> int:
    """The tree's label at ``point``: an int (M) or a mapping from variable name to value."""
    while "leaf" not in tree:
        value = point[tree.get("var", "M")] if isinstance(point, Mapping) else point
        tree = tree["left"] if value <= tree["le"] else tree["right"]
    return tree["leaf"]


def tree_c(tree: dict, indent: str = "    ", var: str = "M") -> str:
    """The tree as nested ifs returning the kernel index (``ss_gemm_tuned_choice``'s body);
    a split tests its own variable (``"var"``), else ``var``."""
    if "leaf" in tree:
        return f"{indent}return {tree['leaf']};"
    test = tree.get("var", var)
    return (f"{indent}if ({test} <= {tree['le']}) {{\n{tree_c(tree['left'], indent + '    ', var)}\n{indent}}} "
            f"else {{\n{tree_c(tree['right'], indent + '    ', var)}\n{indent}}}")


def prefix(i: int) -> str:
    return f"k{i}_"


def _layouts(layouts: Sequence) -> list[int]:
    """For each kernel's packed-B layout, the index of the first kernel with it (the copy it reads)."""
    first: dict = {}
    return [first.setdefault(lay, i) for i, lay in enumerate(layouts)]


def _choice_c(name: str, tree: dict, tree_args: Sequence[str]) -> str:
    """``int <name>choice(tree_args)``: the tree, the kernel index for those dims."""
    params = ", ".join(f"int64_t {a}" for a in tree_args)
    unused = " ".join(f"(void){a};" for a in tree_args)
    return f"""int {name}choice({params})
{{
    {unused}
{tree_c(tree)}
}}
"""


def _choice_and_packing_c(name: str, tree: dict, tree_args: Sequence[str], kname: Sequence[str],
                          owners: Sequence[int]) -> str:
    """``<name>choice(tree_args)``, and the packing of the constant B shared by kernels of
    one layout (``owners``: ``_layouts``): ``<name>offset``, ``<name>packed_b_size`` and
    ``<name>pack_b``, through each layout's first kernel's ``gemm_pack_b``."""
    copies = sorted(set(owners))
    sizes = " + ".join(f"{kname[i]}gemm_packed_b_size(K, N)" for i in copies)
    offsets = "\n".join(f"    if (i == {i}) return off;\n    off += {kname[i]}gemm_packed_b_size(K, N);" for i in copies)
    packs = "\n".join(f"    {kname[i]}gemm_pack_b(K, N, B, rsb, csb, packed + {name}offset({i}, K, N));"
                      for i in copies)
    return f"""{_choice_c(name, tree, tree_args)}
static int64_t {name}offset(int i, int64_t K, int64_t N)
{{
    int64_t off = 0;
    (void)K; (void)N;
{offsets}
    return off;
}}

int64_t {name}packed_b_size(int64_t K, int64_t N) {{ return {sizes}; }}

void {name}pack_b(int64_t K, int64_t N, const float* B, int64_t rsb, int64_t csb, float* packed)
{{
{packs}
}}
"""


def tuned_gemm_c(kernels: Sequence[GemmSchedule], tree: dict, name: str, tree_args: Sequence[str] = ("M",)) -> str:
    """The kernels under the prefixes ``<name>k0_``, ``<name>k1_``, ... and the dispatcher:

    - ``int <name>choice(int64_t M)``: the tree, the kernel index for M (with ``tree_args``
      ("M", "N", "K"), a group's tree: ``<name>choice(M, N, K)``);
    - ``int64_t <name>packed_b_size(int64_t K, int64_t N)`` and
      ``void <name>pack_b(K, N, B, rsb, csb, packed)``: one packed copy per distinct
      layout, one after another (kernels of one layout share theirs);
    - ``void <name>prepacked(...)``: ``ss_gemm_prepacked``'s signature and meaning, run
      by the kernel the tree picks for M.
    """
    owners = _layouts([layout(s) for s in kernels])
    kname = [f"{name}{prefix(i)}" for i in range(len(kernels))]
    calls = "\n".join(f"    case {i}: {kname[i]}gemm_prepacked(M, N, K, batch0, batch1, A, sa0, sa1, rsa, csa, "
                      f"packed_b + {name}offset({owners[i]}, K, N), C, sc0, sc1, ldc, alpha, bias, beta, rs_bias, "
                      f"cs_bias, act); break;" for i in range(len(kernels)))
    kernel_source = "".join(gemm.source(s, prefix=kname[i]) for i, s in enumerate(kernels))
    return kernel_source + f"""
/* ---- tuned dispatch {name} (shapeshift/tune/dispatch.py): {len(kernels)} kernel(s), {len(set(owners))} B layout(s) ---- */
{_choice_and_packing_c(name, tree, tree_args, kname, owners)}
void {name}prepacked(int64_t M, int64_t N, int64_t K, int64_t batch0, int64_t batch1,
                     const float* A, int64_t sa0, int64_t sa1, int64_t rsa, int64_t csa, const float* packed_b,
                     float* C, int64_t sc0, int64_t sc1, int64_t ldc,
                     float alpha, const float* bias, float beta, int64_t rs_bias, int64_t cs_bias, int act)
{{
    switch ({name}choice({", ".join(tree_args)})) {{
{calls}
    default: break;
    }}
}}
"""


CONV_ARGS = ("x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, group, act, work")


def tuned_conv_c(kernels: Sequence, tree: dict, name: str, tree_args: Sequence[str]) -> str:
    """Conv kernels (kernels/conv_tuned.py) under the prefixes ``<name>k0_``, ... and their
    dispatcher: ``<name>choice(tree_args)`` (the tree on N, C, M, H, W), the packing of the
    weights as a GEMM's B [C KH KW, M] (``<name>packed_b_size``, ``<name>pack_b``: one copy
    per layout, as ``tuned_gemm_c``'s), ``<name>conv2d_residual(...)``: ``ss_conv2d_residual``'s
    arguments and meaning (the lowering calls it for a conv with a fused residual Add), its
    ``wpacked`` packed by ``<name>pack_b`` (never NULL), and ``<name>conv2d(...)``:
    ``ss_conv2d``'s, the same with no residual."""
    from ..codegen.kernels.conv_tuned import unit_source

    owners = _layouts([layout(s.gemm) for s in kernels])
    kname = [f"{name}{prefix(i)}" for i in range(len(kernels))]
    calls = "\n".join(f"    case {i}: {kname[i]}conv2d_residual({CONV_ARGS}, "
                      f"wpacked + {name}offset({owners[i]}, K, M), res, res_act); break;" for i in range(len(kernels)))
    kernel_source = "".join(unit_source(s, prefix=kname[i]) for i, s in enumerate(kernels))
    return kernel_source + f"""
/* ---- tuned conv dispatch {name} (shapeshift/tune/dispatch.py): {len(kernels)} kernel(s), {len(set(owners))} weight layout(s) ---- */
{_choice_and_packing_c(name, tree, tree_args, kname, owners)}
void {name}conv2d_residual(const float* x, const float* w, const float* bias, float* y,
               int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW,
               int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
               int64_t dh, int64_t dw, int64_t group, int act, float* work, const float* wpacked,
               const float* res, int res_act)
{{
    int64_t K = C * KH * KW;
    switch ({name}choice({", ".join(tree_args)})) {{
{calls}
    default: break;
    }}
}}

void {name}conv2d(const float* x, const float* w, const float* bias, float* y,
               int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW,
               int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
               int64_t dh, int64_t dw, int64_t group, int act, float* work, const float* wpacked)
{{
    {name}conv2d_residual({CONV_ARGS}, wpacked, NULL, 0);
}}
"""


def tuned_conv_nchwc_c(kernels: Sequence, tree: dict, name: str, tree_args: Sequence[str], lanes: int,
                       depthwise: bool) -> str:
    """Blocked conv kernels (kernels/conv_nchwc_tuned.py) and their dispatcher:
    ``<name>choice(tree_args)`` (the tree on N, C, M, H, W, as the call passes them: a
    pointwise conv's plane as one row) and ``<name>conv_nchwc_L(...)`` (``ss_conv_nchwc_L``'s
    arguments and meaning) or, ``depthwise``, ``<name>dwconv_nchwc_L(...)``
    (``ss_dwconv_nchwc_L``'s). The weights are packed as the untuned kernels read them,
    whatever the kernel: no packing of their own.

    A kernel is named by its schedule and entry (``ss_cnck_<hash>_``), not by the
    dispatcher, and its C is guarded: a model whose dispatchers share a schedule compiles
    it once. The default schedule is the untuned kernel itself (``ss_conv_nchwc_L``, which
    the program links anyway): no copy."""
    from ..codegen.defaults import default_nchwc_schedule
    from ..codegen.kernels.conv_nchwc import DENSE_PARAMS, DEPTHWISE_PARAMS
    from ..codegen.kernels.conv_nchwc_tuned import unit_source
    from .conv_nchwc_family import CONV_NCHWC, CONV_NCHWC_DW

    kind = "depthwise" if depthwise else "dense"
    entry = f"dwconv_nchwc_{lanes}" if depthwise else f"conv_nchwc_{lanes}"
    family = CONV_NCHWC_DW if depthwise else CONV_NCHWC
    default = family.to_json(default_nchwc_schedule())
    kernel_source, kname = [], []
    for s in kernels:
        text = family.to_json(s)  # the fields the entry reads: schedules that differ elsewhere run alike
        if text == default:
            kname.append("ss_")
            continue
        digest = hashlib.sha256(f"{lanes}:{text}".encode()).hexdigest()[:12]
        kname.append(f"ss_cnck_{digest}_")
        guard = f"SS_CNCK_{digest.upper()}"
        kernel_source.append(f"#ifndef {guard}\n#define {guard}\n"
                             f"{unit_source(s, prefix=kname[-1], entries=(kind,))}#endif\n")
    # The untuned entry's parameters, passed on as they came (their names: each one's last word).
    params = DEPTHWISE_PARAMS if depthwise else DENSE_PARAMS
    args = ", ".join(p.split()[-1] for p in params)
    calls = "\n".join(f"    case {i}: {kname[i]}{entry}({args}); break;" for i in range(len(kernels)))
    choice_args = ", ".join("C" if a == "M" and depthwise else a for a in tree_args)
    body = f"""    switch ({name}choice({choice_args})) {{
{calls}
    default: break;
    }}"""
    return "".join(kernel_source) + f"""
/* ---- tuned blocked conv dispatch {name} (shapeshift/tune/dispatch.py): {len(kernels)} kernel(s) ---- */
{_choice_c(name, tree, tree_args)}
{Function("void", f"{name}{entry}", params, body).definition()}"""


def tuned_batched_c(kernels: Sequence[GemmSchedule], tree: dict, name: str, t_arg: str) -> str:
    """The kernels under the prefixes ``<name>k0_``, ... and, for a batched GEMM whose
    dynamic dim T is the ``t_arg`` argument ("M", "N" or "K"):

    - ``int <name>choice(int64_t T)``: the tree, the kernel index for T;
    - ``void <name>gemm(...)``: ``ss_gemm``'s signature and meaning, run by the kernel the
      tree picks for the call's T.
    """
    kname = [f"{name}{prefix(i)}" for i in range(len(kernels))]
    calls = "\n".join(f"    case {i}: {kname[i]}gemm(M, N, K, batch0, batch1, A, sa0, sa1, rsa, csa, B, sb0, sb1, rsb, "
                      f"csb, C, sc0, sc1, ldc, alpha, bias, beta, rs_bias, cs_bias, act); break;"
                      for i in range(len(kernels)))
    kernel_source = "".join(gemm.source(s, prefix=kname[i]) for i, s in enumerate(kernels))
    return kernel_source + f"""
/* ---- tuned batched dispatch {name} (shapeshift/tune/dispatch.py): {len(kernels)} kernel(s), T = {t_arg} ---- */
int {name}choice(int64_t T)
{{
    (void)T;
{tree_c(tree, var="T")}
}}

void {name}gemm(int64_t M, int64_t N, int64_t K, int64_t batch0, int64_t batch1,
                const float* A, int64_t sa0, int64_t sa1, int64_t rsa, int64_t csa,
                const float* B, int64_t sb0, int64_t sb1, int64_t rsb, int64_t csb,
                float* C, int64_t sc0, int64_t sc1, int64_t ldc,
                float alpha, const float* bias, float beta, int64_t rs_bias, int64_t cs_bias, int act)
{{
    switch ({name}choice({t_arg})) {{
{calls}
    default: break;
    }}
}}
"""


# The standalone dispatcher library's names (the tuner's checks and bench/dietcode.py).
STANDALONE = "ss_gemm_tuned_"


def dispatcher_c(kernels: Sequence[GemmSchedule], tree: dict) -> str:
    """The kernels and ``ss_gemm_tuned_choice``, ``ss_gemm_tuned_packed_b_size``,
    ``ss_gemm_tuned_pack_b``, ``ss_gemm_tuned`` (plain row-major C = A x B) and
    ``ss_gemm_tuned_bench`` (a timing loop)."""
    return tuned_gemm_c(kernels, tree, STANDALONE) + """
/* C[M,N] (row stride ldc) = A[M,K] (row stride lda) x B, B packed by ss_gemm_tuned_pack_b. */
void ss_gemm_tuned(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* packed,
                   float* C, int64_t ldc)
{
    ss_gemm_tuned_prepacked(M, N, K, 1, 1, A, 0, 0, lda, 1, packed, C, 0, 0, ldc, 1.0f, NULL, 0.0f, 0, 0, 0);
}

double ss_gemm_tuned_bench(int64_t calls, int64_t M, int64_t N, int64_t K, const float* A, const float* packed, float* C)
{
    double start = omp_get_wtime();
    for (int64_t i = 0; i < calls; ++i) ss_gemm_tuned(M, N, K, A, K, packed, C, N);
    return (omp_get_wtime() - start) / (double)calls;
}
"""


def library_source(kernels: Sequence[GemmSchedule], tree: dict) -> str:
    """A complete C library: the prelude, every kernel under its prefix, the dispatcher."""
    return PRELUDE + dispatcher_c(kernels, tree)


# The standalone batched dispatcher's names.
STANDALONE_BATCHED = "ss_bmm_tuned_"


def batched_library_source(kernels: Sequence[GemmSchedule], tree: dict, t_arg: str) -> str:
    """A complete C library: the prelude, every kernel, ``ss_bmm_tuned_choice(T)`` and
    ``ss_bmm_tuned_gemm`` (``ss_gemm``'s arguments), plus ``ss_bmm_tuned_bench``, which
    times ``calls`` calls of it the way the tuner's ``tune_bench_batched`` does."""
    return (PRELUDE + tuned_batched_c(kernels, tree, STANDALONE_BATCHED, t_arg)
            + batched_bench_c("ss_bmm_tuned_bench", f"{STANDALONE_BATCHED}gemm"))


def load_batched(lib):
    """Set the ctypes signatures on a compiled batched dispatcher library's ``cdll``."""
    import ctypes

    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.ss_bmm_tuned_choice.argtypes = [i64]
    lib.ss_bmm_tuned_choice.restype = ctypes.c_int
    lib.ss_bmm_tuned_bench.argtypes = [i64] * 5 + [ptr, i64, i64, i64] * 2 + [ptr, i64, i64]
    lib.ss_bmm_tuned_bench.restype = ctypes.c_double
    lib.ss_set_num_threads.argtypes = [ctypes.c_int]
    return lib


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
