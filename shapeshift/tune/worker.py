"""Measures one built candidate; run as ``python -m shapeshift.tune.worker`` by the runner.

Reads a JSON request on stdin ({"library", "k", "n", "ms", "threads", "repeats",
"sample_s", "cold_bytes"}), writes one JSON object on stdout: {"seconds": {M: s}} or
{"error": "..."}. With ``cold_bytes`` > 0 the packed B is copied until the copies fill that
many bytes and call i reads copy i % copies (``tune_bench_cold``).
A separate process so that a crashing or hanging kernel takes only itself down.
"""

from __future__ import annotations

import ctypes
import json
import statistics
import sys

import numpy as np


def _load(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.tune_bench.argtypes = [i64, i64, i64, i64, ptr, ptr, ptr]
    lib.tune_bench.restype = ctypes.c_double
    lib.tune_bench_cold.argtypes = [i64, i64, i64, i64, ptr, ptr, i64, i64, ptr]
    lib.tune_bench_cold.restype = ctypes.c_double
    lib.ss_gemm_pack_b.argtypes = [i64, i64, ptr, i64, i64, ptr]
    lib.ss_gemm_packed_b_size.argtypes = [i64, i64]
    lib.ss_gemm_packed_b_size.restype = i64
    lib.ss_set_num_threads.argtypes = [ctypes.c_int]
    return lib


def measure(req: dict) -> dict:
    lib = _load(req["library"])
    lib.ss_set_num_threads(int(req.get("threads", 1)))
    k, n = int(req["k"]), int(req["n"])
    rng = np.random.default_rng(0)
    b = rng.standard_normal((k, n)).astype(np.float32)
    packed = np.empty(max(1, lib.ss_gemm_packed_b_size(k, n)), dtype=np.float32)
    lib.ss_gemm_pack_b(k, n, b.ctypes.data, n, 1, packed.ctypes.data)
    copies = -(-int(req.get("cold_bytes", 0)) // packed.nbytes)
    if copies > 1:
        packed = np.ascontiguousarray(np.broadcast_to(packed, (copies, packed.size)))

        def bench(calls, m, n, k, a, p, c):
            return lib.tune_bench_cold(calls, m, n, k, a, p, packed.shape[1], copies, c)
    else:
        bench = lib.tune_bench
    seconds = {}
    for m in req["ms"]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        c = np.full((m, n), np.nan, dtype=np.float32)
        args = (m, n, k, a.ctypes.data, packed.ctypes.data, c.ctypes.data)
        first = bench(1, *args)  # also the warm-up: page faults, thread start
        ref = a.astype(np.float64) @ b
        if not np.allclose(c, ref, rtol=1e-3, atol=1e-3 * k ** 0.5):
            err = float(np.nanmax(np.abs(c - ref))) if not np.isnan(c).all() else float("nan")
            return {"error": f"wrong result at M={m} (max abs error {err:.3g})"}
        calls = max(1, int(req["sample_s"] / max(first, 1e-7)))
        samples = [bench(calls, *args) for _ in range(int(req["repeats"]))]
        seconds[m] = statistics.median(samples)
    return {"seconds": seconds}


def main() -> None:
    req = json.loads(sys.stdin.read())
    try:
        out = measure(req)
    except Exception as exc:  # reported, not raised: the runner records it as a failure
        out = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
