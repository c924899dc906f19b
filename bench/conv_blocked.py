"""The NCHWc conv kernels alone against onnxruntime running the same one-node Conv.

    python bench/conv_blocked.py [--repeats 7] [--sample-ms 30] [--only SUBSTRING ...] [--no-write]

The 2-D cases of bench/conv.py (YOLOv8n's convs with SiLU, the depthwise convs with ReLU).
``ss_conv_nchwc_L`` / ``ss_dwconv_nchwc_L`` (kernels/conv_nchwc.py, L from the target
description: 16 with AVX-512, else 8) run on an input already in blocks, with the weights
packed, through ctypes, one thread (OMP_NUM_THREADS=1 is set before the library loads):
what a conv inside an NCHWc trunk costs, with no layout conversion. A first conv with
fewer channels than a block reads its image plain, as the lowering has it do.
onnxruntime runs the one-node model (intra_op_num_threads=1), whole session.run calls,
so its figure includes its per-call overhead (a few microseconds); bench/conv.py has the
whole-session comparison. The kernel's arrays start on 64-byte boundaries, as the native
runtime's buffers do (numpy's start 16 bytes past one as often as not: then every vector of
a zmm kernel spans two cache lines, and the depthwise kernel took 1.2-1.25x its time on
3-12 MB planes, AMD Zen 4). The two run interleaved, --repeats samples of about
--sample-ms each; the table gives the medians. Writes bench/results/conv_blocked.md.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import machine  # noqa: E402
from conv import CASES, Case, build_model, sampler  # noqa: E402

from shapeshift.codegen.build import compile_library  # noqa: E402
from shapeshift.codegen.kernels import conv_nchwc, nchwc  # noqa: E402
from shapeshift.codegen.kernels.nchwc import ACT_RELU, ACT_SILU  # noqa: E402
from shapeshift.codegen.kernels.prelude import PRELUDE  # noqa: E402
from shapeshift.runtime.huge_pages import aligned  # noqa: E402
from shapeshift.codegen.kernels.nchwc import block_width  # noqa: E402
from shapeshift.target import host_target  # noqa: E402

I64, F32P, INT, F32 = ctypes.c_int64, ctypes.POINTER(ctypes.c_float), ctypes.c_int, ctypes.c_float


def load_library(lanes: int):
    lib = compile_library(PRELUDE + nchwc.source() + conv_nchwc.source(), "bench conv_blocked").cdll
    epi = [F32P, INT, F32, F32, INT, F32, F32]
    dense, depthwise = getattr(lib, f"ss_conv_nchwc_{lanes}"), getattr(lib, f"ss_dwconv_nchwc_{lanes}")
    dense.restype, dense.argtypes = None, [F32P] * 4 + [I64] * 17 + epi
    depthwise.restype, depthwise.argtypes = None, [F32P] * 4 + [I64] * 14 + epi
    return dense, depthwise


def _ptr(a):
    return a.ctypes.data_as(F32P)


def blocked(x: np.ndarray, lanes: int) -> np.ndarray:
    n, c = x.shape[:2]
    cb = -(-c // lanes)
    out = np.zeros((n, cb * lanes, *x.shape[2:]), np.float32)
    out[:, :c] = x
    return np.ascontiguousarray(out.reshape(n, cb, lanes, *x.shape[2:]).transpose(0, 1, 3, 4, 2))


def kernel_call(case: Case, x: np.ndarray, w: np.ndarray, b: np.ndarray, lanes: int, dense, depthwise):
    """A no-argument function running the case's kernel once, and its output [N, C/L, OH, OW, L]."""
    k, s, pad = case.k, case.stride, case.k // 2
    oh = (case.h + 2 * pad - k) // s + 1
    ow = (case.w + 2 * pad - k) // s + 1
    act = ACT_SILU if case.act == "silu" else (ACT_RELU if case.act == "relu" else 0)
    y = aligned(np.zeros((1, -(-case.m // lanes), oh, ow, lanes), np.float32))
    bias = aligned(conv_nchwc.pad_channels(b, lanes))
    keep = [y, bias]
    if case.group == case.c == case.m and case.group > 1:
        xb, wp = aligned(blocked(x, lanes)), aligned(conv_nchwc.pack_depthwise(w, lanes))
        keep += [xb, wp]
        args = (_ptr(xb), _ptr(wp), _ptr(bias), _ptr(y), 1, case.c, case.h, case.w, k, k, oh, ow, s, s, pad, pad, 1, 1,
                None, act, 0.0, 0.0, 0, 0.0, 0.0)
        return (lambda: depthwise(*args)), y, keep
    xblk = 1 if case.c < lanes else lanes
    xin = aligned(x if xblk == 1 else blocked(x, lanes))
    wp = aligned(conv_nchwc.pack_dense(w, 1, lanes, xblk))
    keep += [xin, wp]
    h, wd, oh2, ow2 = case.h, case.w, oh, ow
    if k == 1 and s == 1:  # the plane as one row, as the lowering calls it
        h, wd, oh2, ow2 = 1, case.h * case.w, 1, oh * ow
    args = (_ptr(xin), _ptr(wp), _ptr(bias), _ptr(y), 1, case.c, h, wd, case.m, k, k, oh2, ow2, s, s,
            0 if k == 1 and s == 1 else pad, 0 if k == 1 and s == 1 else pad, 1, 1, 1, xblk, None, act, 0.0, 0.0, 0,
            0.0, 0.0)
    return (lambda: dense(*args)), y, keep


def bench_case(case: Case, repeats: int, sample_s: float, lanes: int, dense, depthwise) -> dict:
    import onnxruntime as ort
    from onnx import numpy_helper

    model = build_model(case)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    ref = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((1, case.c, case.h, case.w)).astype(np.float32)
    run, y, _keep = kernel_call(case, x, inits["w"], inits["b"], lanes, dense, depthwise)
    run()
    expected = ref.run(None, {"x": x})[0]
    got = y.transpose(0, 1, 4, 2, 3).reshape(1, -1, *y.shape[2:4])[:, :case.m]
    diff = float(np.max(np.abs(got - expected)))
    samplers = {"kernel": sampler(run, sample_s), "onnxruntime": sampler(lambda: ref.run(None, {"x": x}), sample_s)}
    times: dict[str, list[float]] = {k: [] for k in samplers}
    for _ in range(repeats):
        for name, sample in samplers.items():
            times[name].append(sample())
    return {"case": case, **{k: statistics.median(v) for k, v in times.items()}, "diff": diff}


def table(rows: list[dict], lanes: int) -> str:
    lines = [f"| conv | GMAC | NCHWc{lanes} kernel ms | onnxruntime ms | ratio | kernel GFLOP/s | max abs diff |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        case, ours, ref = r["case"], r["kernel"], r["onnxruntime"]
        gmac = case.macs() / 1e9
        lines.append(f"| {case.name} | {gmac:.3f} | {ours * 1e3:.3f} | {ref * 1e3:.3f} | {ours / ref:.2f} | "
                     f"{2 * gmac / ours:.1f} | {r['diff']:.1e} |")
    ratios = [r["kernel"] / r["onnxruntime"] for r in rows]
    geo = machine.geomean(ratios)
    lines.append(f"| **geomean** | | | | **{geo:.2f}** | | |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sample-ms", type=float, default=30.0)
    parser.add_argument("--only", nargs="*", default=None, help="run the cases whose name contains one of these")
    parser.add_argument("--no-write", action="store_true", help="do not write bench/results/conv_blocked.md")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    from machine import describe

    lanes = block_width(host_target())
    dense, depthwise = load_library(lanes)
    cases = [c for c in CASES if not c.one_d and (not args.only or any(s in c.name for s in args.only))]
    rows = []
    for case in cases:
        row = bench_case(case, args.repeats, args.sample_ms / 1e3, lanes, dense, depthwise)
        rows.append(row)
        print(f"{case.name:32s} kernel {row['kernel'] * 1e3:8.3f} ms  ort {row['onnxruntime'] * 1e3:8.3f} ms  "
              f"ratio {row['kernel'] / row['onnxruntime']:.2f}  diff {row['diff']:.1e}", flush=True)
    text = table(rows, lanes)
    print(text)
    if not args.no_write:
        load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
        header = ("# NCHWc conv kernels alone vs onnxruntime (one conv, 1 thread)\n\n"
                  f"{describe()}\n\n"
                  f"Python {platform.python_version()}, onnxruntime {ort.__version__}; load average at the end "
                  f"{load}. Block {lanes}. Median of {args.repeats} interleaved samples of about {args.sample_ms:g} ms "
                  "each. The kernel runs on input already in blocks (no layout conversion), through ctypes; "
                  "onnxruntime's figure is whole session.run calls. Ratio > 1: the kernel slower. "
                  "Generated by `python bench/conv_blocked.py`.\n\n")
        (ROOT / "bench" / "results" / "conv_blocked.md").write_text(header + text + "\n")


if __name__ == "__main__":
    main()
