"""Measures one built candidate; run as ``python -m shapeshift.tune.worker`` by the runner.

Reads a JSON request on stdin: {"library" (or "libraries", a list), "workload", "ms",
"threads", "repeats", "sample_s", "cold_bytes"}, where "workload" is the workload's
``request()`` (a prepacked GEMM's K and N, a GEMM group's (M, K, N) per value, or a batched
GEMM's key); writes one JSON object
on stdout: {"seconds": {M: s}} (with "libraries": a list of those, one per library) or
{"error": "..."}. For a prepacked GEMM with ``cold_bytes`` > 0 the packed B is copied
until the copies fill that many bytes and each call reads the next copy (``tune_bench_cold``);
libraries with the same packed B share the copies (``cold_copies``); a group's weights
share ``cold_bytes`` (at least MIN_COLD_BYTES_PER_WEIGHT each).
Every result is checked once against NumPy in float64 before it is timed.
A separate process so that a crashing or hanging kernel takes only itself down.

Timing: ``repeats`` rounds, each taking one sample (enough calls to last about
``sample_s``) at every M in turn; an M keeps its fastest sample. On a shared machine the
noise is other work taking the core, which only ever adds time, and it comes in bursts
longer than a sample: the median of back-to-back samples at one M moved by 20% between
two measurements of the same kernel, which is what the search then ranks candidates by.
Rounds spread each M's samples over the whole measurement, and the minimum drops the
slowed ones.

Several libraries in one request are timed in one process on the same buffers, their
samples interleaved (each round takes one sample of every library at every M): a process
has a speed of its own, at 2 threads up to 15% off another's for the same kernel (its
buffers' placement, its threads' cores), and in one tuning a whole measurement of a kernel
ran at one core's speed. Kernels compared in one process see the same conditions; the
tuner times the kernel set it dispatches among this way (search.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import sys

import numpy as np

from ..codegen.build import use_openmp_defaults
from .workload import BatchedGemmWorkload


def _load(path: str, kind: str) -> ctypes.CDLL:
    """A measurement library, with the signatures of the timing loops of its family."""
    use_openmp_defaults()  # measured under the wait policy sessions run with
    lib = ctypes.CDLL(path)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.ss_set_num_threads.argtypes = [ctypes.c_int]
    if kind == "conv-nchwc":
        lib.tune_cnc_bench.argtypes = [i64, i64] + [ptr] * 4 + [i64] * 15
        lib.tune_cnc_bench.restype = ctypes.c_double
        lib.tune_cnc_bench_cold.argtypes = [i64, i64] + [ptr] * 4 + [i64] * 15 + [ptr, i64]
        lib.tune_cnc_bench_cold.restype = ctypes.c_double
        lib.tune_cnc_depthwise_entry.restype = ctypes.c_int
        return lib  # no GEMM in its library: the weights' packing does not depend on the schedule
    if kind == "conv":
        lib.tune_conv_bench.argtypes = [i64] + [ptr] * 4 + [i64] * 16 + [ptr, ptr]
        lib.tune_conv_bench.restype = ctypes.c_double
        lib.tune_conv_bench_cold.argtypes = [i64] + [ptr] * 4 + [i64] * 16 + [ptr, ptr, ptr, i64]
        lib.tune_conv_bench_cold.restype = ctypes.c_double
    else:
        lib.tune_bench.argtypes = [i64, i64, i64, i64, ptr, ptr, ptr]
        lib.tune_bench.restype = ctypes.c_double
        lib.tune_bench_cold.argtypes = [i64, i64, i64, i64, ptr, ptr, i64, i64, i64, ptr]
        lib.tune_bench_cold.restype = ctypes.c_double
        lib.tune_bench_batched.argtypes = [i64] * 5 + [ptr, i64, i64, i64] * 2 + [ptr, i64, i64]
        lib.tune_bench_batched.restype = ctypes.c_double
    lib.ss_gemm_pack_b.argtypes = [i64, i64, ptr, i64, i64, ptr]
    lib.ss_gemm_packed_b_size.argtypes = [i64, i64]
    lib.ss_gemm_packed_b_size.restype = i64
    return lib


def _close(got: np.ndarray, ref: np.ndarray, k: int, where: str) -> dict | None:
    """None if ``got`` matches the float64 reference, else the failure to report."""
    if np.allclose(got, ref, rtol=1e-3, atol=1e-3 * max(k, 1) ** 0.5):
        return None
    err = float(np.nanmax(np.abs(got - ref))) if not np.isnan(got).all() else float("nan")
    return {"error": f"wrong result at {where} (max abs error {err:.3g})"}


def _time(benches: dict, req: dict) -> dict:
    """Seconds per call for each key of ``benches`` (a library's M): the fastest of
    ``repeats`` samples, taken in rounds over the keys (see the module docstring);
    ``benches[key](calls)`` returns seconds per call."""
    calls = {key: max(1, int(req["sample_s"] / max(bench(1), 1e-7))) for key, bench in benches.items()}
    best = {key: math.inf for key in benches}
    for _ in range(max(1, int(req["repeats"]))):
        for key, bench in benches.items():
            best[key] = min(best[key], bench(calls[key]))
    return best


def _where(dim: str, value: int, library: int, count: int) -> str:
    """Where a check failed, naming the library when several are timed together."""
    return f"{dim}={value}" + (f" (library {library})" if count > 1 else "")


def _results(best: dict, count: int, ms: list[int], req: dict) -> dict:
    """The reply: one library's {"seconds"}, or several libraries' {"libraries": [...]}."""
    per_lib = [{"seconds": {m: best[(i, m)] for m in ms}} for i in range(count)]
    return per_lib[0] if "libraries" not in req else {"libraries": per_lib}


class ColdCopies:
    """Copies of one packed B that cold calls cycle through, and the copy the next call reads.

    The rotation goes on from one sample to the next (and from one library to the next,
    when libraries share the copies): a sample reads the copies read longest ago, not
    the first few again, which a short sample of a large B would find still in cache.
    """

    def __init__(self, packed: np.ndarray, count: int):
        self.count = count
        self.array = np.ascontiguousarray(np.broadcast_to(packed, (self.count, packed.size)))
        self.next = 0

    def take(self, calls: int) -> int:
        """The copy the first of ``calls`` calls reads; the rotation moves past them."""
        first = self.next
        self.next = (first + calls) % self.count
        return first


def cold_copies(packed: list[np.ndarray], cold_bytes: int) -> list[ColdCopies | None]:
    """Per library, the copies of its packed B its calls cycle through (None: one copy fills
    ``cold_bytes``, the calls read it in place). Libraries whose packed B is the same bytes
    (one layout) share one set: they are sampled in turn, never at once, so each still reads
    B from DRAM, and a shortlist of a dozen kernels holds a few sets of copies, not a dozen."""
    shared: dict[tuple[int, bytes], ColdCopies] = {}
    out: list[ColdCopies | None] = []
    for p in packed:
        count = -(-cold_bytes // p.nbytes)
        if count <= 1:
            out.append(None)
            continue
        key = (p.nbytes, hashlib.blake2b(p.data, digest_size=16).digest())
        if key not in shared:
            shared[key] = ColdCopies(p, count)
        out.append(shared[key])
    return out


# A group's weights each get at least this many bytes of cold copies (more than the L3 of
# the machines we run on), within ``cold_bytes`` in all where that allows.
MIN_COLD_BYTES_PER_WEIGHT = 64 << 20


def prepacked_shapes(req: dict) -> dict[int, tuple[int, int, int]]:
    """(M, K, N) at each value of the request: a dense task's M with its one weight, or a
    group's instances (tune/gemm_group.py)."""
    w = req["workload"]
    if "shapes" in w:
        return {int(v): tuple(int(x) for x in shape) for v, shape in w["shapes"].items()}
    k, n = int(w["k"]), int(w["n"])
    return {int(m): (int(m), k, n) for m in req["ms"]}


def measure_prepacked(libs: list[ctypes.CDLL], req: dict) -> dict:
    shapes = prepacked_shapes(req)
    todo = [int(v) for v in req["ms"]]
    weights = list(dict.fromkeys(shapes[v][1:] for v in todo))
    cold_bytes = int(req.get("cold_bytes", 0))
    if cold_bytes and len(weights) > 1:
        cold_bytes = max(cold_bytes // len(weights), MIN_COLD_BYTES_PER_WEIGHT)
    rng = np.random.default_rng(0)
    per_weight = {}  # (K, N) -> (B, per library: its bench function and the packed B it reads)

    def kernels_for(k: int, n: int):
        if (k, n) in per_weight:
            return per_weight[(k, n)]
        b = rng.standard_normal((k, n)).astype(np.float32)
        packed = []
        for lib in libs:
            packed.append(np.empty(max(1, lib.ss_gemm_packed_b_size(k, n)), dtype=np.float32))
            lib.ss_gemm_pack_b(k, n, b.ctypes.data, n, 1, packed[-1].ctypes.data)
        kernels = []
        for lib, own, copies in zip(libs, packed, cold_copies(packed, cold_bytes)):
            if copies is not None:
                def bench(calls, m, n, k, a, p, c, lib=lib, copies=copies):
                    return lib.tune_bench_cold(calls, m, n, k, a, p, copies.array.shape[1], copies.count,
                                               copies.take(calls), c)
                kernels.append((bench, copies.array))
            else:
                kernels.append((lib.tune_bench, own))
        per_weight[(k, n)] = (b, kernels)
        return per_weight[(k, n)]

    timed, buffers = {}, []
    for v in todo:
        m, k, n = shapes[v]
        b, kernels = kernels_for(k, n)
        a = rng.standard_normal((m, k)).astype(np.float32)
        ref = a.astype(np.float64) @ b
        c = np.empty((m, n), dtype=np.float32)  # shared: every library writes the same C
        buffers.append((a, c))
        label = ("M", m) if "shapes" not in req["workload"] else (f"(M, K, N) = ({m}, {k}, {n}), instance", v)
        for i, (bench, packed_b) in enumerate(kernels):
            c.fill(np.nan)
            args = (m, n, k, a.ctypes.data, packed_b.ctypes.data, c.ctypes.data)
            bench(1, *args)  # the call checked below; also the warm-up (page faults, thread start)
            failure = _close(c, ref, k, _where(*label, i, len(libs)))
            if failure:
                return failure
            timed[(i, v)] = lambda calls, bench=bench, args=args: bench(calls, *args)
    return _results(_time(timed, req), len(libs), todo, req)


def _strided(rng: np.random.Generator, shape: tuple[int, ...], strides: list[int], fill: float | None):
    """A float32 buffer just large enough for ``shape`` at element ``strides``, and that view."""
    size = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
    buf = rng.standard_normal(size).astype(np.float32) if fill is None else np.full(size, fill, np.float32)
    view = np.lib.stride_tricks.as_strided(buf, shape, [4 * s for s in strides])
    return buf, view


def measure_batched(libs: list[ctypes.CDLL], req: dict) -> dict:
    workload = BatchedGemmWorkload.from_key(req["workload"]["key"], 1, max(req["ms"]))
    rng = np.random.default_rng(0)
    timed, buffers = {}, []
    for t in req["ms"]:
        m, k, n, batch = workload.shape(t)
        st = workload.strides(t)
        a_buf, a = _strided(rng, (batch, m, k), st["a"], None)
        b_buf, b = _strided(rng, (batch, k, n), st["b"], None)
        c_buf, c = _strided(rng, (batch, m, n), [*st["c"], 1], np.nan)
        buffers.append((a_buf, b_buf, c_buf))  # alive while the rounds run
        ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
        args = (m, n, k, batch, a_buf.ctypes.data, *st["a"], b_buf.ctypes.data, *st["b"], c_buf.ctypes.data, *st["c"])
        for i, lib in enumerate(libs):
            c_buf.fill(np.nan)
            lib.tune_bench_batched(1, *args)
            failure = _close(c, ref, k, _where("T", t, i, len(libs)))
            if failure:
                return failure
            timed[(i, t)] = lambda calls, lib=lib, args=args: lib.tune_bench_batched(calls, *args)
    return _results(_time(timed, req), len(libs), req["ms"], req)


def conv_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray, conv_class, pads, act: int,
                   pixels: list[tuple[int, int]]) -> np.ndarray:
    """float64 conv outputs [N, M, len(pixels)] at the given (oh, ow), zero padded as ONNX."""
    kh, kw, sh, sw, dh, dw = conv_class
    ph, pw = pads
    n, c, h, wd = x.shape
    xp = np.zeros((n, c, h + 2 * ph + dh * kh, wd + 2 * pw + dw * kw))
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    rows = np.array([oh * sh for oh, _ in pixels])[:, None] + dh * np.arange(kh)[None, :]  # [P, KH]
    cols = np.array([ow * sw for _, ow in pixels])[:, None] + dw * np.arange(kw)[None, :]  # [P, KW]
    windows = xp[:, :, rows[:, :, None], cols[:, None, :]]  # [N, C, P, KH, KW]
    out = np.einsum("ncpij,mcij->nmp", windows, w.astype(np.float64)) + bias[None, :, None]
    if act == 1:
        out = np.maximum(out, 0)
    elif act == 2:
        out = 1 / (1 + np.exp(-out))
    elif act == 3:
        out = out / (1 + np.exp(-out))
    return out


def _checked_pixels(oh: int, ow: int, rng: np.random.Generator, count: int = 24) -> list[tuple[int, int]]:
    """The four corners and random output pixels: edges see the padding, the rest the tiles."""
    corners = {(0, 0), (0, ow - 1), (oh - 1, 0), (oh - 1, ow - 1)}
    picks = {(int(rng.integers(oh)), int(rng.integers(ow))) for _ in range(count)}
    return sorted(corners | picks)


# A cold conv measurement (tune/conv_workload.py) flushes this many bytes, or twice the L3,
# before each call, and takes at most COLD_CALLS calls a sample (a flush costs milliseconds).
FLUSH_BYTES = 64 << 20
COLD_CALLS = 4


def _flush_buffer() -> np.ndarray:
    from ..target import host_target

    return np.zeros(max(FLUSH_BYTES, 2 * host_target().caches.l3) // 4, dtype=np.float32)


def measure_conv(libs: list[ctypes.CDLL], req: dict) -> dict:
    """Each value's conv instance (tune/conv_workload.py) by ``ss_conv2d`` with the weights
    packed by the library's own ``ss_gemm_pack_b``, checked at sampled pixels against a
    float64 reference, then timed (``cold``: each call after a flush of the caches)."""
    flush = _flush_buffer() if req["workload"].get("cold") else None
    conv_class = tuple(int(v) for v in req["workload"]["class"])
    kh, kw, sh, sw, dh, dw = conv_class
    timed, buffers = {}, []
    for v, inst, (oh, ow), k, x, w, bias, pixels in _conv_cases(req, conv_class):
        n, c, h, wd, m, ph, pw, act = inst
        y = np.empty((n, m, oh, ow), dtype=np.float32)
        work = np.empty(max(1, c * kh * kw * oh * ow), dtype=np.float32)
        ref = conv_reference(x, w, bias.astype(np.float64), conv_class, (ph, pw), act, pixels)
        sel = (np.array([p for p, _ in pixels]), np.array([q for _, q in pixels]))
        for i, lib in enumerate(libs):
            packed = np.empty(max(1, lib.ss_gemm_packed_b_size(k, m)), dtype=np.float32)
            lib.ss_gemm_pack_b(k, m, w.ctypes.data, 1, k, packed.ctypes.data)  # B = w as [K, M]: (k, j) at w[j K + k]
            buffers.append((x, w, bias, y, work, packed))  # alive while the rounds run
            args = (x.ctypes.data, w.ctypes.data, bias.ctypes.data, y.ctypes.data, n, c, h, wd, m, kh, kw, oh, ow,
                    sh, sw, ph, pw, dh, dw, act, work.ctypes.data, packed.ctypes.data)
            y.fill(np.nan)
            lib.tune_conv_bench(1, *args)
            failure = _close(y[:, :, sel[0], sel[1]], ref, k, _where(f"conv {inst}, instance", v, i, len(libs)))
            if failure:
                return failure
            timed[(i, v)] = _conv_timer(lib.tune_conv_bench, lib.tune_conv_bench_cold, args, flush)
    return _results(_time(timed, req), len(libs), [int(v) for v in req["ms"]], req)


def _conv_timer(warm, cold, args: tuple, flush: "np.ndarray | None"):
    """Seconds per call of ``calls`` calls of a conv's timing loop: back to back (``warm``),
    or with ``flush`` each after a write to every line of it (``cold``, at most COLD_CALLS
    a sample)."""
    if flush is None:
        return lambda calls: warm(calls, *args)
    return lambda calls: cold(min(calls, COLD_CALLS), *args, flush.ctypes.data, flush.size)


def _conv_cases(req: dict, conv_class, depthwise: bool = False):
    """Per value of a conv request: (value, instance, (OH, OW), taps summed per output, x,
    w, bias, the output pixels checked), its data random from one seed."""
    from .conv_workload import output

    kh, kw = conv_class[:2]
    rng = np.random.default_rng(0)
    for v in [int(v) for v in req["ms"]]:
        inst = tuple(int(x) for x in req["workload"]["shapes"][str(v)])
        n, c, h, wd, m = inst[:5]
        oh, ow = output(conv_class, inst)
        k = (1 if depthwise else c) * kh * kw
        x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
        w = (rng.standard_normal((m, 1 if depthwise else c, kh, kw)) / math.sqrt(k)).astype(np.float32)
        bias = rng.standard_normal(m).astype(np.float32)
        yield v, inst, (oh, ow), k, x, w, bias, _checked_pixels(oh, ow, rng)


def measure_conv_nchwc(libs: list[ctypes.CDLL], req: dict) -> dict:
    """Each value's blocked conv instance (tune/conv_workload.py's NchwcConvWorkload) on a
    blocked input with weights packed as the lowering packs them, checked at sampled pixels
    (every channel, the lanes past M zero) against a float64 reference, then timed
    (``cold``: each call after a flush of the caches)."""
    from ..codegen.kernels.conv_nchwc import blocked, pack_dense, pack_depthwise, pad_channels

    flush = _flush_buffer() if req["workload"].get("cold") else None
    conv_class = tuple(int(v) for v in req["workload"]["class"])
    depthwise, lanes = bool(req["workload"]["depthwise"]), int(req["workload"]["lanes"])
    kh, kw, sh, sw, dh, dw = conv_class
    # A library holds one entry point (its family's, tune/conv_nchwc_family.py).
    wrong = [i for i, lib in enumerate(libs) if bool(lib.tune_cnc_depthwise_entry()) != depthwise]
    if wrong:
        built = "dense" if depthwise else "depthwise"
        return {"error": f"library {wrong[0]} was built for the {built} conv entry, the task is "
                         f"{'depthwise' if depthwise else 'dense'}"}
    timed, buffers = {}, []
    for v, inst, (oh, ow), k, x, w, bias, pixels in _conv_cases(req, conv_class, depthwise):
        n, c, h, wd, m, ph, pw, _ = inst
        xb = blocked(x, lanes)
        wp = pack_depthwise(w, lanes) if depthwise else pack_dense(w, 1, lanes, lanes)
        bp = pad_channels(bias, lanes)
        y = np.empty((n, -(-m // lanes), oh, ow, lanes), dtype=np.float32)
        if depthwise:  # each channel its own 1-channel conv
            ref = np.concatenate([conv_reference(x[:, j:j + 1], w[j:j + 1], bias[j:j + 1].astype(np.float64),
                                                 conv_class, (ph, pw), 0, pixels) for j in range(c)], axis=1)
        else:
            ref = conv_reference(x, w, bias.astype(np.float64), conv_class, (ph, pw), 0, pixels)
        sel = (np.array([p for p, _ in pixels]), np.array([q for _, q in pixels]))
        buffers.append((xb, wp, bp, y))  # alive while the rounds run
        args = (int(depthwise), xb.ctypes.data, wp.ctypes.data, bp.ctypes.data, y.ctypes.data, n, c, h, wd, m, kh, kw,
                oh, ow, sh, sw, ph, pw, dh, dw)
        for i, lib in enumerate(libs):
            y.fill(np.nan)
            lib.tune_cnc_bench(1, *args)
            got = y[:, :, sel[0], sel[1], :].transpose(0, 1, 3, 2).reshape(n, -1, len(pixels))  # [N, MB*L, P]
            where = _where(f"blocked conv {inst}, instance", v, i, len(libs))
            failure = _close(got[:, :m], ref, k, where)
            if failure is None and np.any(got[:, m:] != 0):
                failure = {"error": f"wrong result at {where} (lanes past M not zero)"}
            if failure:
                return failure
            timed[(i, v)] = _conv_timer(lib.tune_cnc_bench, lib.tune_cnc_bench_cold, args, flush)
    return _results(_time(timed, req), len(libs), [int(v) for v in req["ms"]], req)


# The measurement routine of each kind of request (a task's ``request()["kind"]``, tune/task.py).
MEASURES = {"prepacked": measure_prepacked, "batched": measure_batched, "conv": measure_conv,
            "conv-nchwc": measure_conv_nchwc}


def measure(req: dict) -> dict:
    kind = req["workload"]["kind"]
    if kind not in MEASURES:
        return {"error": f"the worker cannot measure a {kind!r} task (known: {', '.join(sorted(MEASURES))})"}
    libs = [_load(path, kind) for path in req.get("libraries") or [req["library"]]]
    for lib in libs:
        lib.ss_set_num_threads(int(req.get("threads", 1)))
    return MEASURES[kind](libs, req)


def main() -> None:
    req = json.loads(sys.stdin.read())
    try:
        out = measure(req)
    except Exception as exc:  # reported, not raised: the runner records it as a failure
        out = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
