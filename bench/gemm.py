"""GFLOPS of ss_gemm / ss_gemm_prepacked against NumPy matmul (OpenBLAS) on BERT-base shapes.

    python bench/gemm.py [--ts 1 8 32 128 512] [--threads 1 2] [--repeats 5] [--sample-ms 5] [--cold]

Shapes, at sequence length T (batch 1): the four dense layers (M = T; K x N = 768x768,
768x3072, 3072x768, 768x2304; B a constant weight: ours prepacked, and ours plain for
reference) and the two attention matmuls over 12 heads on strided views of [T, 12, 64]
tensors: scores = Q K^T ([12,T,64] x [12,64,T], B transposed through its strides) and
context = P V ([12,T,T] x [12,T,64], written straight into a [T, 12, 64] output).

Our kernels' arrays start on cache lines, as the native runtime's buffers do
(runtime/huge_pages.py); NumPy's are its own. Each thread count runs in its own process with OPENBLAS_NUM_THREADS set, so NumPy uses
the same number of threads as ours (ss_set_num_threads) without needing threadpoolctl.
Per shape, the candidates run interleaved: one sample (enough calls for --sample-ms) of
each in turn, --repeats times; the table gives the median sample. Prints the table and
writes bench/results/gemm.md.

``--cold``: the dense shapes only, with every call's weight streamed from DRAM (each call
takes the next of 160 MB of distinct weights, ours and NumPy's alike), as in a model whose
weights do not fit in cache; writes bench/results/gemm_cold.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402
from sampling import python_loop  # noqa: E402

# The per-core float32 peak the table's '% peak' columns are against (measured, cached).
PEAK = machine.peak_gflops()

DENSE = ((768, 768), (768, 3072), (3072, 768), (768, 2304))
HEADS, HEAD_DIM = 12, 64

# Our kernels are timed by a loop in C, as the generated program calls them: through
# ctypes, 25 arguments cost several microseconds a call, more than the smallest GEMMs.
_ARGS = """int64_t M, int64_t N, int64_t K, int64_t batch0, int64_t batch1,
    const float* A, int64_t sa0, int64_t sa1, int64_t rsa, int64_t csa, %s
    float* C, int64_t sc0, int64_t sc1, int64_t ldc,
    float alpha, const float* bias, float beta, int64_t rs_bias, int64_t cs_bias, int act"""
_CALL = "M, N, K, batch0, batch1, A, sa0, sa1, rsa, csa, %s C, sc0, sc1, ldc, alpha, bias, beta, rs_bias, cs_bias, act"
TIMING_SOURCE = "".join(f"""
double bench_{name}(int64_t calls, {_ARGS % b_args})
{{
    double start = omp_get_wtime();
    for (int64_t i = 0; i < calls; ++i) {name}({_CALL % b_call});
    return (omp_get_wtime() - start) / (double)calls;
}}
""" for name, b_args, b_call in (
    ("ss_gemm", "const float* B, int64_t sb0, int64_t sb1, int64_t rsb, int64_t csb,", "B, sb0, sb1, rsb, csb,"),
    ("ss_gemm_prepacked", "const float* packed_b,", "packed_b,"))) + """
double bench_ss_gemm_prepacked_cold(int64_t calls, int64_t first, int64_t count, const float* const* packed,
                                    int64_t M, int64_t N, int64_t K, const float* A, float* C, const float* bias)
{
    double start = omp_get_wtime();
    for (int64_t i = 0; i < calls; ++i)
        ss_gemm_prepacked(M, N, K, 1, 1, A, 0, 0, K, 1, packed[(first + i) % count], C, 0, 0, N,
                          1.0f, bias, 1.0f, 0, 1, 0);
    return (omp_get_wtime() - start) / (double)calls;
}
"""
# --cold: this many bytes of weights per candidate, several times the last-level cache, so
# every call streams its weight from DRAM as a model's layers do.
COLD_BYTES = 160e6


def _load_library(cache_dir: Path, schedule=None):
    """The GEMM fragment (``schedule``'s; None: the target's default) with the timing loops."""
    from shapeshift.codegen.build import compile_library
    from shapeshift.codegen.kernels import gemm
    from shapeshift.codegen.kernels.prelude import PRELUDE

    cdll = compile_library(PRELUDE + gemm.source(schedule) + TIMING_SOURCE, name_hint="bench_gemm", cache_dir=cache_dir).cdll
    i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    head = [i64] * 5 + [ptr, i64, i64, i64, i64]
    tail = [ptr, i64, i64, i64, f32, ptr, f32, i64, i64, ctypes.c_int]
    cdll.bench_ss_gemm.argtypes = [i64] + head + [ptr, i64, i64, i64, i64] + tail
    cdll.bench_ss_gemm_prepacked.argtypes = [i64] + head + [ptr] + tail
    cdll.bench_ss_gemm.restype = cdll.bench_ss_gemm_prepacked.restype = ctypes.c_double
    cdll.bench_ss_gemm_prepacked_cold.argtypes = [i64, i64, i64, ptr, i64, i64, i64, ptr, ptr, ptr]
    cdll.bench_ss_gemm_prepacked_cold.restype = ctypes.c_double
    cdll.ss_gemm_pack_b.argtypes = [i64, i64, ptr, i64, i64, ptr]
    cdll.ss_gemm_packed_b_size.argtypes = [i64, i64]
    cdll.ss_gemm_packed_b_size.restype = i64
    cdll.ss_set_num_threads.argtypes = [ctypes.c_int]
    return cdll


def _time_interleaved(samplers: dict[str, Callable[[int], float]], repeats: int, sample_s: float) -> dict[str, float]:
    """Median seconds per call of each candidate, sampled in turn."""
    calls = {}
    for name, sample in samplers.items():
        sample(1)  # warm up: page faults, first touch, thread start
        calls[name] = max(1, int(sample_s / max(sample(1), 1e-7)))
    times: dict[str, list[float]] = {name: [] for name in samplers}
    for _ in range(repeats):
        for name, sample in samplers.items():
            times[name].append(sample(calls[name]))
    return {name: statistics.median(t) for name, t in times.items()}


def _dense_candidates(lib, np, t: int, k: int, n: int):
    from shapeshift.runtime.huge_pages import aligned, empty

    rng = np.random.default_rng(0)
    a = aligned(rng.standard_normal((t, k)).astype(np.float32))
    w = aligned(rng.standard_normal((k, n)).astype(np.float32))
    bias = aligned(rng.standard_normal(n).astype(np.float32))
    packed = empty(lib.ss_gemm_packed_b_size(k, n), np.float32)
    lib.ss_gemm_pack_b(k, n, w.ctypes.data, n, 1, packed.ctypes.data)
    c_pre = empty(t * n, np.float32).reshape(t, n)
    c_plain = empty(t * n, np.float32).reshape(t, n)

    def prepacked(calls):
        return lib.bench_ss_gemm_prepacked(calls, t, n, k, 1, 1, a.ctypes.data, 0, 0, k, 1, packed.ctypes.data,
                                           c_pre.ctypes.data, 0, 0, n, 1.0, bias.ctypes.data, 1.0, 0, 1, 0)

    def plain(calls):
        return lib.bench_ss_gemm(calls, t, n, k, 1, 1, a.ctypes.data, 0, 0, k, 1, w.ctypes.data, 0, 0, n, 1,
                                 c_plain.ctypes.data, 0, 0, n, 1.0, bias.ctypes.data, 1.0, 0, 1, 0)

    c_numpy = np.empty((t, n), dtype=np.float32)

    def numpy_matmul():
        # At its best: into a buffer it reuses, the bias added in place.
        np.matmul(a, w, out=c_numpy)
        np.add(c_numpy, bias, out=c_numpy)

    def check():
        ref = a.astype(np.float64) @ w.astype(np.float64) + bias
        for c in (c_pre, c_plain):
            assert np.allclose(c, ref, rtol=1e-3, atol=1e-2), "ss_gemm disagrees with numpy"

    flops = 2.0 * t * k * n
    return {"ss_gemm_prepacked": prepacked, "ss_gemm": plain, "numpy": python_loop(numpy_matmul)}, flops, check


def _dense_cold_candidates(lib, np, t: int, k: int, n: int):
    """Dense GEMMs whose weight comes from DRAM: each call takes the next of enough
    distinct weights (COLD_BYTES in all) that none is still cached; numpy rotates alike."""
    from shapeshift.runtime.huge_pages import aligned, empty

    rng = np.random.default_rng(2)
    count = max(2, int(COLD_BYTES // (k * n * 4)))
    a = aligned(rng.standard_normal((t, k)).astype(np.float32))
    bias = aligned(rng.standard_normal(n).astype(np.float32))
    weights = [rng.standard_normal((k, n)).astype(np.float32) for _ in range(count)]
    packed = [empty(lib.ss_gemm_packed_b_size(k, n), np.float32) for _ in range(count)]
    for w, p in zip(weights, packed):
        lib.ss_gemm_pack_b(k, n, w.ctypes.data, n, 1, p.ctypes.data)
    table = (ctypes.c_void_p * count)(*[p.ctypes.data for p in packed])
    c = empty(t * n, np.float32).reshape(t, n)
    position = {"ours": 0, "numpy": 0}

    def prepacked(calls, _keep_alive=packed):  # the table points into these arrays
        first = position["ours"]
        position["ours"] = (first + calls) % count
        return lib.bench_ss_gemm_prepacked_cold(calls, first, count, ctypes.addressof(table), t, n, k,
                                                a.ctypes.data, c.ctypes.data, bias.ctypes.data)

    c_numpy = np.empty((t, n), dtype=np.float32)

    def numpy_matmul(calls):
        first = position["numpy"]
        position["numpy"] = (first + calls) % count
        start = time.perf_counter()
        for i in range(calls):
            np.matmul(a, weights[(first + i) % count], out=c_numpy)
            np.add(c_numpy, bias, out=c_numpy)
        return (time.perf_counter() - start) / calls

    def check():
        last = (position["ours"] - 1) % count
        ref = a.astype(np.float64) @ weights[last].astype(np.float64) + bias
        assert np.allclose(c, ref, rtol=1e-3, atol=1e-2), "ss_gemm_prepacked disagrees with numpy"

    return {"ss_gemm_prepacked": prepacked, "numpy": numpy_matmul}, 2.0 * t * k * n, check


def _attention_candidates(lib, np, t: int, which: str):
    from shapeshift.runtime.huge_pages import aligned

    rng = np.random.default_rng(1)
    hd = HEADS * HEAD_DIM
    q = aligned(rng.standard_normal((t, HEADS, HEAD_DIM)).astype(np.float32))
    kv = aligned(rng.standard_normal((t, HEADS, HEAD_DIM)).astype(np.float32))
    if which == "scores":
        out = aligned(np.zeros((HEADS, t, t), dtype=np.float32))

        def ours(calls):
            # A(m,k) = q[m,h,k]; B(k,n) = kv[n,h,k]
            return lib.bench_ss_gemm(calls, t, t, HEAD_DIM, HEADS, 1, q.ctypes.data, HEAD_DIM, 0, hd, 1,
                                     kv.ctypes.data, HEAD_DIM, 0, 1, hd, out.ctypes.data, t * t, 0, t,
                                     0.125, None, 0.0, 0, 0, 0)

        def numpy_matmul():
            return np.matmul(q.transpose(1, 0, 2), kv.transpose(1, 2, 0)) * np.float32(0.125)

        def check():
            ref = np.einsum("mhk,nhk->hmn", q.astype(np.float64), kv.astype(np.float64)) * 0.125
            assert np.allclose(out, ref, rtol=1e-3, atol=1e-3), "ss_gemm disagrees with numpy"

        return {"ss_gemm": ours, "numpy": python_loop(numpy_matmul)}, 2.0 * HEADS * t * t * HEAD_DIM, check
    p = aligned(rng.random((HEADS, t, t)).astype(np.float32))
    out = aligned(np.zeros((t, HEADS, HEAD_DIM), dtype=np.float32))

    def ours_ctx(calls):
        # B(k,n) = kv[k,h,n]; C(m,n) = out[m,h,n]
        return lib.bench_ss_gemm(calls, t, HEAD_DIM, t, HEADS, 1, p.ctypes.data, t * t, 0, t, 1,
                                 kv.ctypes.data, HEAD_DIM, 0, hd, 1, out.ctypes.data, HEAD_DIM, 0, hd,
                                 1.0, None, 0.0, 0, 0, 0)

    def numpy_ctx():
        return np.matmul(p, kv.transpose(1, 0, 2)).transpose(1, 0, 2)

    def check_ctx():
        ref = np.einsum("hmk,khn->mhn", p.astype(np.float64), kv.astype(np.float64))
        assert np.allclose(out, ref, rtol=1e-3, atol=1e-3), "ss_gemm disagrees with numpy"

    return {"ss_gemm": ours_ctx, "numpy": python_loop(numpy_ctx)}, 2.0 * HEADS * t * t * HEAD_DIM, check_ctx


def run_child(threads: int, ts: list[int], repeats: int, sample_s: float, cache_dir: Path,
              cold: bool = False) -> list[dict]:
    """One thread count, in this process (OPENBLAS_NUM_THREADS was set before numpy loaded)."""
    import numpy as np

    lib = _load_library(cache_dir)
    lib.ss_set_num_threads(threads)
    rows = []
    for t in ts:
        if cold:
            shapes = [(f"dense {k}x{n} cold", lambda k=k, n=n: _dense_cold_candidates(lib, np, t, k, n))
                      for k, n in DENSE]
        else:
            shapes = [(f"dense {k}x{n}", lambda k=k, n=n: _dense_candidates(lib, np, t, k, n)) for k, n in DENSE]
            shapes += [("attn QK^T", lambda: _attention_candidates(lib, np, t, "scores")),
                       ("attn PV", lambda: _attention_candidates(lib, np, t, "context"))]
        for label, make in shapes:
            candidates, flops, check = make()
            seconds = _time_interleaved(candidates, repeats, sample_s)
            check()
            rows.append({"threads": threads, "T": t, "shape": label,
                         "gflops": {name: flops / s / 1e9 for name, s in seconds.items()},
                         "us": {name: s * 1e6 for name, s in seconds.items()}})
            print(_format_row(rows[-1], PEAK), flush=True, file=sys.stderr)
    return rows


def _format_row(row: dict, peak: float) -> str:
    g = row["gflops"]
    ours = [g.get("ss_gemm", 0.0), g.get("ss_gemm_prepacked", 0.0)]
    ratio = max(ours) / g["numpy"]
    pre = f"{g['ss_gemm_prepacked']:.1f}" if "ss_gemm_prepacked" in g else "-"
    plain = f"{g['ss_gemm']:.1f}" if "ss_gemm" in g else "-"
    share = 100 * max(ours) / (peak * row["threads"])
    return (f"| {row['threads']} | {row['T']} | {row['shape']} | {pre} | {plain} | {g['numpy']:.1f} "
            f"| {ratio:.2f} | {share:.0f}% | {100 * g['numpy'] / (peak * row['threads']):.0f}% "
            f"| {row['us']['numpy']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ts", type=int, nargs="+", default=[1, 8, 32, 128, 512])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sample-ms", type=float, default=5.0)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cold", action="store_true",
                        help="dense shapes only, each call's weight streamed from DRAM (as in a model)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(run_child(args.child, args.ts, args.repeats, args.sample_ms / 1e3, args.cache_dir,
                                   args.cold)))
        return
    if args.output is None:
        args.output = ROOT / "bench" / "results" / ("gemm_cold.md" if args.cold else "gemm.md")

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as cache:
        rows = []
        for threads in args.threads:
            # Both thread pools live in one process: short spin-waits, so that one library's
            # idle threads do not hold the cores the other one's threads need.
            env = dict(os.environ, **machine.peer_env(threads), OPENBLAS_THREAD_TIMEOUT="4", GOMP_SPINCOUNT="10000")
            cmd = [sys.executable, __file__, "--child", str(threads), "--ts", *map(str, args.ts),
                   "--repeats", str(args.repeats), "--sample-ms", str(args.sample_ms), "--cache-dir", cache,
                   *(["--cold"] if args.cold else [])]
            proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
            rows += json.loads(proc.stdout)

    import numpy as np

    header = ["| threads | T | shape | ss_gemm_prepacked GFLOPS | ss_gemm GFLOPS | numpy GFLOPS | best ours / numpy "
              "| ours % peak | numpy % peak | numpy µs/call |", "|---|---|---|---|---|---|---|---|---|---|"]
    table = "\n".join(header + [_format_row(r, PEAK) for r in rows])
    text = (
        "# GEMM benchmark\n\n" + machine.describe() + " " + machine.describe_peer() + "\n\n"
        f"`python bench/gemm.py{' --cold' if args.cold else ''}` on {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"numpy {np.__version__} (OpenBLAS). Each thread count ran in its own process with OPENBLAS_NUM_THREADS "
        "equal to it, so numpy used the same number of threads as ours. Median of "
        f"{args.repeats} interleaved samples of about {args.sample_ms:g} ms each. Dense: M = T, B a constant "
        "weight, plus a [N] bias (numpy: `np.matmul(a, w, out=c)` then `np.add(c, bias, out=c)`); ss_gemm_prepacked uses the weight packed at load. "
        + ("With --cold, each call takes the next of enough distinct weights (160 MB in all, ours and numpy's "
           "each) that it streams from DRAM, as a model's layers do. " if args.cold else "") +
        "Attention: 12 heads of 64 on strided [T, 12, 64] views (numpy: `np.matmul` on the transposed views). "
        f"The machine is shared: the 1-minute load average was {load_before:.1f} before the run and "
        f"{os.getloadavg()[0]:.1f} after it, on {os.cpu_count()} CPUs; with other work on the cores, a parallel "
        "region waits for a core to come free, so 2-thread figures (ours and numpy's) can be far below "
        "1-thread ones, and any figure may be off by 20% or more between runs.\n\n" + table + "\n")
    print(table)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)


if __name__ == "__main__":
    main()
