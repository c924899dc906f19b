"""Memory bandwidth of each cache level and DRAM, and GEMV by a constant weight against it.

    python bench/gemv.py [--threads 1 2] [--ms 1 2 4] [--repeats 5] [--sample-ms 10] [--dram-mb 1024]
                          [--stat median|best] [--settle-ms 100]

A product of M = 1..4 rows by a constant K x N weight reads the weight once and does
2*M flops per float of it: its speed is the speed at which the weight streams in. So each
weight size is placed in one level of this machine's memory (from the target
description's cache sizes: L1d, L2, L3, and DRAM past the last level) and two things are
measured on the same footprint:

- the level's read bandwidth: a read loop in C (each thread reads its part as four
  sequential streams at once, as the GEMV reads four panels, in the widest vectors the
  build has, into eight accumulators), built the project's way
  (codegen/build.compile_library of a C-writer fragment), best of the samples; numpy's
  ``np.dot`` of the buffer's two halves (a BLAS dot, one pass over the buffer) as a
  cross-check (numpy's float32 ``sum`` is pairwise and far from bandwidth, so it is not used);
- the GEMV: ``ss_gemv_prepacked`` (kernels/gemv.py; what MatMul/Gemm by a constant weight
  call for M <= 4; below the row count the target's class gives it, ``gemv_min_m``, it runs
  the GEMM behind it), ``ss_gemm_prepacked`` (the GEMM's own small-M path),
  both on the weight packed once, timed by a loop in C as the generated program calls
  them; numpy ``np.dot(x, W, out=c)``; onnxruntime's one-node MatMul model (the weight an
  initializer, default graph optimizations, intra_op_num_threads = threads). GB/s is the
  weight's bytes over the time of one call. numpy and onnxruntime are called from
  Python, so their per-call overhead (about 1 us and 5-10 us) counts: it dominates the L1
  sizes.

Every buffer of 4 MiB or more (the read loop's, the packed and numpy's weights) is on
memory advised for huge pages, as a session's packed weights are (runtime/huge_pages.py):
streaming megabytes through 4 KiB pages cost up to a quarter of the bandwidth in TLB
misses, and the levels' figures should be the best the machine gives.

The DRAM rows cycle through enough distinct weights (``--dram-mb`` in all, at least twice
the last-level cache unless capped) that every call streams its weight from DRAM, for
every candidate (onnxruntime: one model of that many MatMul nodes, its time divided by
their count). The 1024 x 4096 weight (16 MB, the issue's target shape) sits in L3 when
L2 is smaller. Each thread count runs in its own process with OPENBLAS_NUM_THREADS set
before numpy loads. Per shape and M the candidates run interleaved, --repeats samples
each; the table gives the median (or, with --stat best, the fastest: on a shared machine
most samples lose the core part of the time). At 2 or more threads each candidate's samples
come after a pause of ``--settle-ms`` (100 by default), as in bench/cnn.py: onnxruntime's
idle pool keeps spinning for 5 to 50 ms after a run, and the candidate sampled next shared
a core with it (AMD Zen 4, 2 threads, the 1024 x 4096 weight at M = 1, ss_gemv alternating
with onnxruntime in one process: 53 GB/s right after it, 148 after 50 ms, 120 with its
spinning turned off; onnxruntime 128-133 either way). Prints the tables and writes
bench/results/gemv.md.
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

# (label, K, N): the weight of each level; K x N floats fit the level with room to spare
# for A, C and the code (checked against the caches in _level).
SHAPES = (("L1", 64, 96), ("L2", 256, 1000), ("L3", 1024, 4096), ("DRAM", 4096, 4096))
# Sequential streams the read loop reads at once per thread (as many as the GEMV's panels).
STREAMS = 4


def _bench_source() -> str:
    """The read loop and the GEMV timing loops, written with the C writer."""
    from shapeshift.codegen.cwriter import CWriter, Function

    read = CWriter(level=1)
    # Threads placed as a session places them (the prelude's ss_segment_enter, which every
    # segment function runs first): unplaced, the GEMV's 2-thread rows on an AMD Zen 3 ran at
    # about one thread's speed (58-60 GB/s where a session's MatMul streamed 94).
    read.line("ss_segment_enter();")
    read.line("double best = 1e30, sink = 0.0;")
    with read.block("for (int64_t c = 0; c < calls; ++c)"):
        read.line("double start = omp_get_wtime(), total = 0.0;")
        # All the passes of a sample in one parallel region: entering one costs about a
        # microsecond, more than a pass over an L1-sized buffer.
        read.line("#pragma omp parallel reduction(+:total)")
        with read.block("for (int64_t pass = 0; pass < passes; ++pass)"):
            # A pass reads one chunk (one weight's bytes), the chunks in turn as the GEMV's
            # calls take the weights in turn: samples of the same length as the GEMV's.
            # Each thread reads its part as STREAMS sequential streams at once, as the GEMV
            # reads its panels: one stream alone draws less from DRAM than one core can.
            read.line("const float* x = all + ((c * passes + pass) % (total_n / n)) * n;",
                      "const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();",
                      "const int64_t per = (n / nt) / 1024 * 1024, lo = t * per, hi = t == nt - 1 ? n : lo + per;",
                      f"const int64_t part = (hi - lo) / {STREAMS} / 64 * 64;",
                      *(f"const float* x{j} = x + lo + {j} * part;" for j in range(STREAMS)))
            for lanes, guard in ((16, "defined(__AVX512F__)"), (8, "defined(__AVX2__)")):
                mm, vec = ("_mm512_", "__m512") if lanes == 16 else ("_mm256_", "__m256")
                read.line(f"#{'if' if lanes == 16 else 'elif'} {guard}")
                acc = [f"s{j}_{v}" for j in range(STREAMS) for v in range(2)]
                read.lines(f"{vec} {a} = {mm}setzero_ps();" for a in acc)
                with read.block(f"for (int64_t i = 0; i < part; i += {2 * lanes})"):
                    read.lines(f"s{j}_{v} = {mm}add_ps(s{j}_{v}, {mm}loadu_ps(x{j} + i + {v * lanes}));"
                               for j in range(STREAMS) for v in range(2))
                read.line(f"float lanes[{lanes}];")
                read.lines(f"{mm}storeu_ps(lanes, {a}); for (int j = 0; j < {lanes}; ++j) total += lanes[j];"
                           for a in acc)
            read.line("#else")
            read.line("for (int64_t i = 0; i < part; ++i) total += " + " + ".join(f"x{j}[i]" for j in range(STREAMS))
                      + ";")
            read.line("#endif")
            read.line(f"for (int64_t i = lo + {STREAMS} * part; i < hi; ++i) total += x[i];")
        read.line("double took = (omp_get_wtime() - start) / (double)passes;", "if (took < best) best = took;",
                  "sink += total;")
    read.line("*out = sink;", "return best;")
    parts = [Function("double", "bench_read", ("int64_t calls", "int64_t passes", "const float* all", "int64_t total_n",
                                               "int64_t n", "double* out"), read.text(),
                      comment="Seconds per pass over n floats (the work split between threads), pass i reading "
                              "chunk i of all[0:total_n]: the fastest of `calls` samples of `passes` passes.")]
    for fn in ("ss_gemv_prepacked", "ss_gemm_prepacked"):
        loop = CWriter(level=1)
        loop.line("ss_segment_enter();  /* placed as in a session, as the read loop */")
        loop.line("double start = omp_get_wtime();")
        with loop.block("for (int64_t i = 0; i < calls; ++i)"):
            loop.line(f"{fn}(M, N, K, 1, 1, A, 0, 0, K, 1, packed[i % copies], C, 0, 0, N, 1.0f, NULL, 0.0f, 0, 0, 0);")
        loop.line("return (omp_get_wtime() - start) / (double)calls;")
        parts.append(Function("double", f"bench_{fn}", ("int64_t calls", "int64_t copies", "const float* const* packed",
                                                        "int64_t M", "int64_t N", "int64_t K", "const float* A",
                                                        "float* C"), loop.text()))
    return "".join(p.definition() for p in parts)


def _load(cache_dir: Path):
    from shapeshift.codegen.build import compile_library
    from shapeshift.codegen.kernels import gemm, gemv
    from shapeshift.codegen.kernels.prelude import PRELUDE

    lib = compile_library(PRELUDE + gemm.source() + gemv.source() + _bench_source(), name_hint="bench_gemv",
                          cache_dir=cache_dir).cdll
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.bench_read.argtypes = [i64, i64, ptr, i64, i64, ptr]
    lib.bench_read.restype = ctypes.c_double
    for fn in (lib.bench_ss_gemv_prepacked, lib.bench_ss_gemm_prepacked):
        fn.argtypes = [i64, i64, ptr, i64, i64, i64, ptr, ptr]
        fn.restype = ctypes.c_double
    lib.ss_gemm_pack_b.argtypes = [i64, i64, ptr, i64, i64, ptr]
    lib.ss_gemm_packed_b_size.argtypes = [i64, i64]
    lib.ss_gemm_packed_b_size.restype = i64
    lib.ss_set_num_threads.argtypes = [ctypes.c_int]
    return lib


def _level(nbytes: int, caches) -> str:
    """The level a working set of ``nbytes`` stays in (with room for the rest of the call)."""
    if nbytes <= caches.l1d * 3 // 4:
        return "L1"
    if nbytes <= caches.l2 * 3 // 4:
        return "L2"
    if nbytes <= caches.l3 // 2:
        return "L3"
    return "DRAM"


def _copies(label: str, weight_bytes: int, dram_bytes: int) -> int:
    return max(1, -(-dram_bytes // weight_bytes)) if label == "DRAM" else 1


def _interleaved(samplers: dict[str, Callable[[int], float]], repeats: int, sample_s: float,
                 stat: str, settle_s: float = 0.0) -> dict[str, float]:
    """Seconds per call of each candidate (the median or the fastest of its samples), one
    sample of each in turn, each after a pause of settle_s (the other candidates' idle
    threads stop spinning) and an untimed sample of its own.

    The untimed sample puts the candidate's own weight where its level says before the clock
    starts (one call was not enough for a weight as large as L3): the candidates read
    different copies (numpy and onnxruntime their own), so each one's first call otherwise
    streams from wherever the one before it left the caches. A
    16 MiB weight on a 16 MiB L3 made that a bias of a third: ss_gemv, sampled after
    onnxruntime, read 32 GB/s, and the GEMM's small-M path, sampled after ss_gemv on the
    same packed copy, 42; alternating the two alone, both read 42-43."""
    calls = {}
    for name, sample in samplers.items():
        sample(1)  # warm up: page faults, thread start, the weight into its level
        calls[name] = max(1, int(sample_s / max(sample(1), 1e-7)))
    times: dict[str, list[float]] = {name: [] for name in samplers}
    for _ in range(repeats):
        for name, sample in samplers.items():
            time.sleep(settle_s)
            sample(calls[name])
            times[name].append(sample(calls[name]))
    pick = statistics.median if stat == "median" else min
    return {name: pick(t) for name, t in times.items()}


def _python_loop(fn: Callable[[int], object]) -> Callable[[int], float]:
    def sample(calls: int) -> float:
        start = time.perf_counter()
        for i in range(calls):
            fn(i)
        return (time.perf_counter() - start) / calls
    return sample


def _ort_session(np, weights: list, m: int, threads: int):
    """onnxruntime on one model of len(weights) MatMul nodes x @ W_i (one per weight)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    k = weights[0].shape[0]
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]) for i in range(len(weights))]
    graph = helper.make_graph(nodes, "gemv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None)
                               for i in range(len(weights))],
                              [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _on_huge_pages(array):
    """A copy of ``array`` where a session keeps its packed weights (runtime/huge_pages.py),
    so that the read loop and numpy's weights stream from the same kind of pages as ours
    (imported here: numpy loads after the child has set OPENBLAS_NUM_THREADS)."""
    from shapeshift.runtime import huge_pages

    copy = huge_pages.empty(array.size, array.dtype).reshape(array.shape)
    copy[...] = array
    return copy


def run_child(threads: int, ms: list[int], repeats: int, sample_s: float, dram_bytes: int, cache_dir: Path,
              stat: str, settle_s: float = 0.0) -> dict:
    import numpy as np

    from shapeshift.runtime import huge_pages
    from shapeshift.target import host_target

    caches = host_target().caches
    lib = _load(cache_dir)
    lib.ss_set_num_threads(threads)
    rng = np.random.default_rng(0)
    bandwidth, rows = [], []
    for label, k, n in SHAPES:
        weight_bytes = 4 * k * n
        copies = _copies(label, weight_bytes, dram_bytes)
        footprint = weight_bytes * copies
        # The read loop over the same footprint; numpy's dot of its two halves beside it.
        buf = _on_huge_pages(rng.standard_normal(footprint // 4).astype(np.float32))
        sink = ctypes.c_double()
        chunk = k * n

        def read(calls: int, passes: int) -> float:
            return lib.bench_read(calls, passes, buf.ctypes.data, buf.size, chunk, ctypes.byref(sink))

        read(2, copies)
        passes = max(1, int(sample_s / max(read(1, 1), 1e-7)))
        read_s = read(5 * repeats, passes)
        half = buf.size // 2
        np.dot(buf[:half], buf[half:2 * half])
        dot_s = min(_python_loop(lambda i: np.dot(buf[:half], buf[half:2 * half]))(passes) for _ in range(repeats))
        bandwidth.append({"level": label, "where": _level(footprint, caches), "bytes": footprint,
                          "read_gbs": weight_bytes / read_s / 1e9, "dot_gbs": 8 * half / dot_s / 1e9})
        print(f"bandwidth {label}: {bandwidth[-1]}", file=sys.stderr, flush=True)
        buf = None  # released before the weights are made
        weights = [_on_huge_pages(rng.standard_normal((k, n)).astype(np.float32)) for _ in range(copies)]
        packed = []
        for w in weights:
            packed.append(huge_pages.empty(lib.ss_gemm_packed_b_size(k, n), np.float32))
            lib.ss_gemm_pack_b(k, n, w.ctypes.data, n, 1, packed[-1].ctypes.data)
        table = (ctypes.c_void_p * copies)(*[p.ctypes.data for p in packed])
        for m in ms:
            x = rng.standard_normal((m, k)).astype(np.float32)
            c_gemv, c_gemm, c_np = (np.empty((m, n), dtype=np.float32) for _ in range(3))
            session = _ort_session(np, weights, m, threads)
            feed = {"x": x}
            samplers = {
                "gemv": lambda calls: lib.bench_ss_gemv_prepacked(calls, copies, table, m, n, k, x.ctypes.data,
                                                                  c_gemv.ctypes.data),
                "gemm_small_m": lambda calls: lib.bench_ss_gemm_prepacked(calls, copies, table, m, n, k,
                                                                          x.ctypes.data, c_gemm.ctypes.data),
                "numpy": _python_loop(lambda i: np.dot(x, weights[i % copies], out=c_np)),
                "onnxruntime": lambda calls: _python_loop(lambda i: session.run(None, feed))(calls) / copies,
            }
            seconds = _interleaved(samplers, repeats, sample_s, stat, settle_s if threads > 1 else 0.0)
            want = x.astype(np.float64) @ weights[-1].astype(np.float64)
            lib.bench_ss_gemv_prepacked(1, 1, (ctypes.c_void_p * 1)(packed[-1].ctypes.data), m, n, k,
                                        x.ctypes.data, c_gemv.ctypes.data)
            assert np.allclose(c_gemv, want, rtol=1e-3, atol=1e-3 * np.sqrt(k)), "ss_gemv_prepacked disagrees"
            rows.append({"threads": threads, "level": label, "where": _level(footprint, caches), "k": k, "n": n,
                         "copies": copies, "m": m, "read_gbs": bandwidth[-1]["read_gbs"],
                         "gbs": {name: weight_bytes / s / 1e9 for name, s in seconds.items()},
                         "us": {name: s * 1e6 for name, s in seconds.items()}})
            print(_row(rows[-1]), file=sys.stderr, flush=True)
            session = None
        weights = packed = None
    return {"bandwidth": [dict(b, threads=threads) for b in bandwidth], "rows": rows}


def _row(r: dict) -> str:
    g, us = r["gbs"], r["us"]
    share = 100 * g["gemv"] / r["read_gbs"]
    weight = f"{r['k']}x{r['n']}" + (f" x{r['copies']}" if r["copies"] > 1 else "")
    return (f"| {r['threads']} | {r['level']} ({r['where']}) | {weight} | {r['m']} | {r['read_gbs']:.1f} "
            f"| {g['gemv']:.1f} | {share:.0f}% | {g['gemm_small_m']:.1f} | {g['numpy']:.1f} | {g['onnxruntime']:.1f} "
            f"| {us['gemv']:.2f} | {us['numpy'] / us['gemv']:.2f} | {us['onnxruntime'] / us['gemv']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--ms", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sample-ms", type=float, default=10.0)
    parser.add_argument("--stat", choices=("median", "best"), default="median",
                        help="per candidate, the median sample (a quiet machine) or the fastest (a shared one, "
                             "where most samples lose the core part of the time)")
    parser.add_argument("--dram-mb", type=float, default=None,
                        help="bytes of distinct weights the DRAM rows cycle through (default: twice the last-level "
                             "cache, at most 1024 MB)")
    parser.add_argument("--settle-ms", type=float, default=100.0,
                        help="pause before each candidate's samples at 2 or more threads")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "gemv.md")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dram_mb is None:
        from shapeshift.target import host_target

        args.dram_mb = min(1024.0, 2 * host_target().caches.l3 / 2**20)
    dram_bytes = int(args.dram_mb * 2**20)
    if args.child is not None:
        print(json.dumps(run_child(args.child, args.ms, args.repeats, args.sample_ms / 1e3, dram_bytes,
                                   args.cache_dir, args.stat, args.settle_ms / 1e3)))
        return
    load_before = os.getloadavg()
    bandwidth, rows = [], []
    with tempfile.TemporaryDirectory() as cache:
        for threads in args.threads:
            env = dict(os.environ, **machine.peer_env(threads))
            cmd = [sys.executable, __file__, "--child", str(threads), "--ms", *map(str, args.ms), "--repeats",
                   str(args.repeats), "--sample-ms", str(args.sample_ms), "--dram-mb", str(args.dram_mb),
                   "--stat", args.stat, "--settle-ms", str(args.settle_ms),
                   "--cache-dir", cache]
            out = json.loads(subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout)
            bandwidth += out["bandwidth"]
            rows += out["rows"]
    load_after = os.getloadavg()

    import numpy as np
    import onnxruntime as ort

    from shapeshift.target import host_target

    caches = host_target().caches
    bw = ["| threads | level | working set | C read loop GB/s | numpy dot GB/s |", "|---|---|---|---|---|"]
    bw += [f"| {b['threads']} | {b['level']} ({b['where']}) | {b['bytes'] / 2**20:.2f} MiB | {b['read_gbs']:.1f} "
           f"| {b['dot_gbs']:.1f} |" for b in bandwidth]
    gv = ["| threads | level | weight K x N | M | read loop GB/s | ss_gemv GB/s | % of read loop "
          "| ss_gemm small-M GB/s | numpy GB/s | onnxruntime GB/s | ss_gemv µs | numpy / ours | onnxruntime / ours |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    gv += [_row(r) for r in rows]
    text = (
        # The shared description's closing sentence is about '% peak' columns this table has not.
        "# GEMV benchmark\n\n" + machine.describe().split(" '% peak' below")[0] + f" L3 {caches.l3 >> 20} MiB. "
        + machine.describe_peer() + "\n\n"
        f"`python bench/gemv.py {' '.join(sys.argv[1:])}`".replace(" `", "`") + f" on {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, numpy {np.__version__}, onnxruntime "
        f"{ort.__version__}. Levels from the target description's caches; a level's label says where the "
        "weight was meant to sit and the parenthesis where its working set falls by those sizes. The DRAM rows "
        f"cycle through {args.dram_mb:.0f} MiB of distinct weights. {'Median' if args.stat == 'median' else 'Fastest'} "
        f"of {args.repeats} interleaved samples of about {args.sample_ms:g} ms each (read loop: the fastest of "
        f"{5 * args.repeats} samples); at 2 or more threads each candidate's samples after a {args.settle_ms:g} ms "
        "pause, so that no other candidate's idle threads still spin. GB/s = weight bytes / time per call; "
        "numpy and onnxruntime include their Python call overhead. The machine is shared: the load average "
        f"(1, 5, 15 min) was {', '.join(f'{x:.1f}' for x in load_before)} before the run and "
        f"{', '.join(f'{x:.1f}' for x in load_after)} after it, on {os.cpu_count()} CPUs: under load a figure "
        "can be off by far more than the differences it shows.\n\n"
        "## Read bandwidth\n\n" + "\n".join(bw) + "\n\n## GEMV by a constant weight\n\n" + "\n".join(gv) + "\n")
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)


if __name__ == "__main__":
    main()
