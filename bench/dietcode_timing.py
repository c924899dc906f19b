"""The timing half of bench/dietcode.py: one child process per (task, thread count).

    python bench/dietcode_timing.py SPEC.json OUT.json     (started by bench/dietcode.py)

Why a child process: numpy's OpenBLAS reads its thread count when it loads, so the parent
starts this script with OPENBLAS_NUM_THREADS / OMP_NUM_THREADS set; our kernels get
``ss_set_num_threads`` and onnxruntime ``intra_op_num_threads`` with the same count. Idle
thread pools spin only briefly (GOMP_SPINCOUNT, OPENBLAS_THREAD_TIMEOUT set by the parent,
onnxruntime's allow_spinning off) so one library's idle threads do not hold the cores that
the next one, timed right after it, needs.

At every point each method runs once (warm-up), every output is checked against numpy's
(a wrong result raises, naming the method and the shape), then the methods are sampled in
turn, ``repeats`` times: interleaved, so that load from other work on this shared machine
hits them alike. The whole grid is timed in ``passes`` passes, alternately forwards and
backwards, so that a point's samples lie minutes apart: load from other work comes in
bursts of seconds (in one run every method at M = 384..400 of one task ran 25-45% slow,
its neighbours did not). Each method's fastest sample over all passes is its time (load
only ever adds time); the median sample is reported alongside. Our kernels are timed by
loops in C (through ctypes a call costs microseconds, more than the smallest GEMMs); numpy
(``np.matmul(..., out=)``) and onnxruntime (``run_with_iobinding`` into a bound output) in
Python loops, so those two pay their call overhead, as they would in a Python program.

SPEC: {"kind": "dense", "k", "n", "threads", "repeats", "passes", "sample_s", "cache_dir",
"libraries": {name: {"kernels": [GemmSchedule fields], "tree": {...}}},
"points": [{"m": M, "ours": {column: library name}}]}
or {"kind": "attention", "op": "qk" | "pv", "batch", ... the same, with "m" of a point being T}.
OUT: {"rows": [...], "blas": threadpoolctl's view of numpy's BLAS}.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sampling import Sampler, python_loop  # noqa: E402
from shapeshift.codegen.build import compile_library  # noqa: E402
from shapeshift.codegen.kernels.gemm import GemmSchedule  # noqa: E402
from shapeshift.tune import dispatch  # noqa: E402

from dietcode_report import HEAD_DIM, HEADS  # noqa: E402
# A call longer than this is sampled fewer times: at M = 16 x 512 one call takes ~0.5 s.
LONG_CALL_S = 0.05



@dataclass
class Method:
    sample: Sampler
    out: np.ndarray  # what the method wrote, checked after the warm-up


def check_close(got: np.ndarray, ref: np.ndarray, k: int, what: str) -> None:
    """Inputs are O(1), so sums of k products are O(sqrt k): scale the absolute tolerance."""
    if not np.allclose(got, ref, rtol=1e-3, atol=1e-3 * k ** 0.5):
        err = float(np.nanmax(np.abs(got - ref)))
        raise AssertionError(f"wrong result: {what} differs from numpy (max abs error {err:.3g})")


def sample_point(methods: dict[str, Method], k: int, repeats: int, sample_s: float, what: str
                 ) -> dict[str, list[float]]:
    """Samples of seconds per call of each method, taken in turn; checked against numpy first."""
    for m in methods.values():
        m.sample(1)  # warm-up: page faults, thread start; also writes m.out
    for name, m in methods.items():
        if name != "numpy":
            check_close(m.out, methods["numpy"].out, k, f"{name} at {what}")
    once = {name: m.sample(1) for name, m in methods.items()}
    calls = {name: max(1, int(sample_s / max(s, 1e-7))) for name, s in once.items()}
    reps = repeats if max(once.values()) < LONG_CALL_S else min(repeats, 3)
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(reps):
        for name, m in methods.items():
            times[name].append(m.sample(calls[name]))
    return times


def summarize(samples: dict[str, list[float]]) -> tuple[dict[str, float], dict[str, float]]:
    """(fastest, median) sample of each method."""
    return ({name: min(t) for name, t in samples.items()}, {name: statistics.median(t) for name, t in samples.items()})


def run_passes(points: list[dict], sample_at: Callable[[int, dict], dict[str, list[float]]], passes: int,
               label: Callable[[dict], str]) -> list[dict[str, list[float]]]:
    """Every point's samples over ``passes`` passes, forwards then backwards;
    ``sample_at(i, point)`` sets the point up afresh and samples it."""
    samples: list[dict[str, list[float]]] = [{} for _ in points]
    for p in range(max(1, passes)):
        order = range(len(points)) if p % 2 == 0 else range(len(points) - 1, -1, -1)
        print(f"      pass {p + 1} of {max(1, passes)}", flush=True)
        for i in order:
            for name, t in sample_at(i, points[i]).items():
                samples[i].setdefault(name, []).extend(t)
    for point, got in zip(points, samples):
        fastest = summarize(got)[0]
        print(f"      {label(point)}: " + " ".join(f"{c} {s * 1e6:.1f} us" for c, s in fastest.items()), flush=True)
    return samples


# ---- peers ------------------------------------------------------------------------------

def ort_session(model, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle workers must not spin on the cores the next method (timed right after) needs.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def matmul_model(a_shape: list, b_shape: list, c_shape: list, b_const: np.ndarray | None = None):
    """One MatMul node; B an initializer (a weight, prepacked by onnxruntime) when given."""
    from onnx import TensorProto, helper, numpy_helper

    f32 = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("A", f32, a_shape)]
    inits = []
    if b_const is None:
        inputs.append(helper.make_tensor_value_info("B", f32, b_shape))
    else:
        inits.append(numpy_helper.from_array(b_const, "B"))
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["C"])], "matmul", inputs,
                              [helper.make_tensor_value_info("C", f32, c_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # one that every onnxruntime of the last years reads
    return model


def ort_method(sess, inputs: dict[str, np.ndarray], out: np.ndarray) -> Method:
    io = sess.io_binding()
    for name, value in inputs.items():
        io.bind_cpu_input(name, value)
    io.bind_output("C", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
    return Method(python_loop(lambda: sess.run_with_iobinding(io)), out)


# ---- dense: the tuned dispatchers against numpy and onnxruntime -------------------------

def load_tuned(entry: dict, b: np.ndarray, threads: int, cache: Path):
    """A dispatcher library (dispatch.library_source) and B packed for it."""
    k, n = b.shape
    kernels = [GemmSchedule(**s) for s in entry["kernels"]]
    source = dispatch.library_source(kernels, entry["tree"])
    lib = dispatch.load(compile_library(source, name_hint="bench_dietcode", cache_dir=cache).cdll)
    lib.ss_set_num_threads(threads)
    packed = np.empty(max(1, lib.ss_gemm_tuned_packed_b_size(k, n)), dtype=np.float32)
    lib.ss_gemm_tuned_pack_b(k, n, b.ctypes.data, n, 1, packed.ctypes.data)
    return lib, packed


def time_dense(spec: dict) -> list[dict]:
    k, n, threads = spec["k"], spec["n"], spec["threads"]
    b = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    cache = Path(spec["cache_dir"])
    libs = {name: load_tuned(entry, b, threads, cache) for name, entry in spec["libraries"].items()}
    sess = ort_session(matmul_model(["M", k], [k, n], ["M", n], b), threads)

    def sample_at(i: int, point: dict) -> dict[str, list[float]]:
        m = point["m"]
        rng = np.random.default_rng((0, i))
        a = rng.standard_normal((m, k)).astype(np.float32)
        methods = {}
        for column, name in point["ours"].items():
            lib, packed = libs[name]
            c = np.full((m, n), np.nan, dtype=np.float32)
            methods[column] = Method(
                lambda calls, lib=lib, packed=packed, c=c: lib.ss_gemm_tuned_bench(
                    calls, m, n, k, a.ctypes.data, packed.ctypes.data, c.ctypes.data), c)
        c_np = np.empty((m, n), dtype=np.float32)
        methods["numpy"] = Method(python_loop(lambda: np.matmul(a, b, out=c_np)), c_np)
        methods["onnxruntime"] = ort_method(sess, {"A": a}, np.full((m, n), np.nan, dtype=np.float32))
        return sample_point(methods, k, spec["repeats"], spec["sample_s"], f"M={m}, K={k}, N={n}")

    def kernel(point: dict) -> int | None:
        lib = libs[point["ours"]["dispatcher"]][0] if "dispatcher" in point["ours"] else None
        return lib.ss_gemm_tuned_choice(point["m"]) if lib else None

    return timed_rows(spec, sample_at, "M", lambda m: 2.0 * m * n * k, kernel)


def timed_rows(spec: dict, sample_at: Callable[[int, dict], dict[str, list[float]]], name: str,
               flops: Callable[[int], float], kernel: Callable[[dict], int | None]) -> list[dict]:
    """A row per point of the spec: its dispatcher's kernel, every method's GFLOPS from its
    fastest and from its median sample over all passes."""
    points = spec["points"]
    samples = run_passes(points, sample_at, spec.get("passes", 1), lambda p: f"{name}={p['m']}")
    rows = []
    for point, got in zip(points, samples):
        fastest, median = summarize(got)
        f = flops(point["m"])
        rows.append({"m": point["m"], "kernel": kernel(point),
                     "gflops": {c: f / s / 1e9 for c, s in fastest.items()},
                     "gflops_median": {c: f / s / 1e9 for c, s in median.items()}})
    return rows


# ---- attention: the tuned batched dispatchers against numpy and onnxruntime -------------

def load_batched(entry: dict, threads: int, cache: Path):
    kernels = [GemmSchedule(**s) for s in entry["kernels"]]
    source = dispatch.batched_library_source(kernels, entry["tree"], "M")  # M = T in both matmuls
    lib = dispatch.load_batched(compile_library(source, name_hint="bench_dietcode_bmm", cache_dir=cache).cdll)
    lib.ss_set_num_threads(threads)
    return lib


def time_attention(spec: dict) -> list[dict]:
    """Q K^T ([h,T,64] x [h,64,T]) or P V ([h,T,T] x [h,T,64]) over h = 12 x batch contiguous heads."""
    op, heads, threads = spec["op"], HEADS * spec["batch"], spec["threads"]
    cache = Path(spec["cache_dir"])
    libs = {name: load_batched(entry, threads, cache) for name, entry in spec["libraries"].items()}
    dims = [heads]
    if op == "qk":
        sess = ort_session(matmul_model([*dims, "T", HEAD_DIM], [*dims, HEAD_DIM, "T"], [*dims, "T", "T"]), threads)
    else:
        sess = ort_session(matmul_model([*dims, "T", "T"], [*dims, "T", HEAD_DIM], [*dims, "T", HEAD_DIM]), threads)

    def shape(t: int) -> tuple[int, int, int]:
        return (t, HEAD_DIM, t) if op == "qk" else (t, t, HEAD_DIM)

    def sample_at(i: int, point: dict) -> dict[str, list[float]]:
        t = point["m"]
        m, k, n = shape(t)
        rng = np.random.default_rng((1, i))
        x = rng.standard_normal((heads, m, k)).astype(np.float32)
        y = rng.standard_normal((heads, k, n)).astype(np.float32)
        methods = {}
        for column, name in point["ours"].items():
            c = np.full((heads, m, n), np.nan, dtype=np.float32)
            methods[column] = Method(
                lambda calls, lib=libs[name], c=c: lib.ss_bmm_tuned_bench(
                    calls, m, n, k, heads, x.ctypes.data, m * k, k, 1, y.ctypes.data, k * n, n, 1, c.ctypes.data,
                    m * n, n), c)
        ref = np.empty((heads, m, n), dtype=np.float32)
        methods["numpy"] = Method(python_loop(lambda: np.matmul(x, y, out=ref)), ref)
        methods["onnxruntime"] = ort_method(sess, {"A": x, "B": y}, np.full((heads, m, n), np.nan, dtype=np.float32))
        return sample_point(methods, k, spec["repeats"], spec["sample_s"], f"attention {op}, {heads} heads, T={t}")

    def kernel(point: dict) -> int | None:
        lib = libs[point["ours"]["dispatcher"]] if "dispatcher" in point["ours"] else None
        return lib.ss_bmm_tuned_choice(point["m"]) if lib else None

    return timed_rows(spec, sample_at, "T", lambda t: 2.0 * heads * math.prod(shape(t)), kernel)


def blas_info() -> list[dict]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [{k: d.get(k) for k in ("internal_api", "version", "num_threads")} for d in threadpool_info()]


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    rows = time_dense(spec) if spec["kind"] == "dense" else time_attention(spec)
    blas = blas_info()
    # The comparison is only fair at equal thread counts: refuse to report anything else.
    for pool in blas:
        if pool["internal_api"] == "openblas" and pool["num_threads"] != spec["threads"]:
            raise RuntimeError(f"numpy's OpenBLAS runs {pool['num_threads']} threads, not {spec['threads']}")
    Path(out_path).write_text(json.dumps({"rows": rows, "blas": blas}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
