"""Measures one built candidate; run as ``python -m shapeshift.tune.worker`` by the runner.

Reads a JSON request on stdin: {"library", "workload", "ms", "threads", "repeats",
"sample_s", "cold_bytes"}, where "workload" is the workload's ``request()`` (a prepacked
GEMM's K and N, or a batched GEMM's key); writes one JSON object on stdout: {"seconds": {M:
s}} or {"error": "..."}. For a prepacked GEMM with ``cold_bytes`` > 0 the packed B is copied
until the copies fill that many bytes and call i reads copy i % copies (``tune_bench_cold``).
Every result is checked once against NumPy in float64 before it is timed.
A separate process so that a crashing or hanging kernel takes only itself down.

Timing: ``repeats`` rounds, each taking one sample (enough calls to last about
``sample_s``) at every M in turn; an M keeps its fastest sample. On a shared machine the
noise is other work taking the core, which only ever adds time, and it comes in bursts
longer than a sample: the median of back-to-back samples at one M moved by 20% between
two measurements of the same kernel, which is what the search then ranks candidates by.
Rounds spread each M's samples over the whole measurement, and the minimum drops the
slowed ones.
"""

from __future__ import annotations

import ctypes
import json
import math
import sys
from typing import Callable

import numpy as np

from .workload import BatchedGemmWorkload


def _load(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.tune_bench.argtypes = [i64, i64, i64, i64, ptr, ptr, ptr]
    lib.tune_bench.restype = ctypes.c_double
    lib.tune_bench_cold.argtypes = [i64, i64, i64, i64, ptr, ptr, i64, i64, ptr]
    lib.tune_bench_cold.restype = ctypes.c_double
    lib.tune_bench_batched.argtypes = [i64] * 5 + [ptr, i64, i64, i64] * 2 + [ptr, i64, i64]
    lib.tune_bench_batched.restype = ctypes.c_double
    lib.ss_gemm_pack_b.argtypes = [i64, i64, ptr, i64, i64, ptr]
    lib.ss_gemm_packed_b_size.argtypes = [i64, i64]
    lib.ss_gemm_packed_b_size.restype = i64
    lib.ss_set_num_threads.argtypes = [ctypes.c_int]
    return lib


def _close(got: np.ndarray, ref: np.ndarray, k: int, where: str) -> dict | None:
    """None if ``got`` matches the float64 reference, else the failure to report."""
    if np.allclose(got, ref, rtol=1e-3, atol=1e-3 * max(k, 1) ** 0.5):
        return None
    err = float(np.nanmax(np.abs(got - ref))) if not np.isnan(got).all() else float("nan")
    return {"error": f"wrong result at {where} (max abs error {err:.3g})"}


def _time(benches: dict[int, Callable[[int], float]], req: dict) -> dict[int, float]:
    """Seconds per call at each M: the fastest of ``repeats`` samples, taken in rounds over
    the Ms (see the module docstring); ``benches[m](calls)`` returns seconds per call."""
    calls = {m: max(1, int(req["sample_s"] / max(bench(1), 1e-7))) for m, bench in benches.items()}
    best = {m: math.inf for m in benches}
    for _ in range(max(1, int(req["repeats"]))):
        for m, bench in benches.items():
            best[m] = min(best[m], bench(calls[m]))
    return best


def measure_prepacked(lib: ctypes.CDLL, req: dict) -> dict:
    k, n = int(req["workload"]["k"]), int(req["workload"]["n"])
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
    benches, buffers = {}, []
    for m in req["ms"]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        c = np.full((m, n), np.nan, dtype=np.float32)
        args = (m, n, k, a.ctypes.data, packed.ctypes.data, c.ctypes.data)
        bench(1, *args)  # the call checked below; also the warm-up (page faults, thread start)
        failure = _close(c, a.astype(np.float64) @ b, k, f"M={m}")
        if failure:
            return failure
        buffers.append((a, c))
        benches[m] = lambda calls, args=args: bench(calls, *args)
    return {"seconds": _time(benches, req)}


def _strided(rng: np.random.Generator, shape: tuple[int, ...], strides: list[int], fill: float | None):
    """A float32 buffer just large enough for ``shape`` at element ``strides``, and that view."""
    size = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
    buf = rng.standard_normal(size).astype(np.float32) if fill is None else np.full(size, fill, np.float32)
    view = np.lib.stride_tricks.as_strided(buf, shape, [4 * s for s in strides])
    return buf, view


def measure_batched(lib: ctypes.CDLL, req: dict) -> dict:
    workload = BatchedGemmWorkload.from_key(req["workload"]["key"], 1, max(req["ms"]))
    rng = np.random.default_rng(0)
    benches, buffers = {}, []
    for t in req["ms"]:
        m, k, n, batch = workload.shape(t)
        st = workload.strides(t)
        a_buf, a = _strided(rng, (batch, m, k), st["a"], None)
        b_buf, b = _strided(rng, (batch, k, n), st["b"], None)
        c_buf, c = _strided(rng, (batch, m, n), [*st["c"], 1], np.nan)
        args = (m, n, k, batch, a_buf.ctypes.data, *st["a"], b_buf.ctypes.data, *st["b"], c_buf.ctypes.data, *st["c"])
        lib.tune_bench_batched(1, *args)
        failure = _close(c, np.matmul(a.astype(np.float64), b.astype(np.float64)), k, f"T={t}")
        if failure:
            return failure
        buffers.append((a_buf, b_buf, c_buf))  # alive while the rounds run
        benches[t] = lambda calls, args=args: lib.tune_bench_batched(calls, *args)
    return {"seconds": _time(benches, req)}


def measure(req: dict) -> dict:
    lib = _load(req["library"])
    lib.ss_set_num_threads(int(req.get("threads", 1)))
    kind = req["workload"]["kind"]
    if kind == "batched":
        return measure_batched(lib, req)
    return measure_prepacked(lib, req)


def main() -> None:
    req = json.loads(sys.stdin.read())
    try:
        out = measure(req)
    except Exception as exc:  # reported, not raised: the runner records it as a failure
        out = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
