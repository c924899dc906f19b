"""Latency of one-node Conv models: shapeshift's native backend against onnxruntime.

    python bench/conv.py [--repeats 7] [--sample-ms 30] [--only SUBSTRING ...] [--no-write]

The shapes are the convs that make the conv-heavy models of bench/e2e.py slow (batch 1):
YOLOv8n at a 320x320 input (3x3 stride-1 and stride-2 convs with 16-256 channels at 160..10
pixels, 1x1 convs, each followed by SiLU written as x * Sigmoid(x), which the lowering fuses
into the conv), MobileNetV3 / PP-OCR-style depthwise 3x3 and 5x5 convs at stride 1 and 2
with 16-480 channels (ReLU), a strided 1x1 conv, and whisper's Conv1d stem (80 -> 384,
k3, over 3000 frames; 384 -> 384, k3, stride 2).

Both run on one thread (native: num_threads=1; onnxruntime: intra_op_num_threads=1). The
native backend runs each model twice: with the blocked layout (NCHWc, codegen/lower/
layout_assign.py; the default) and without it (SHAPESHIFT_NCHWC=0: the NCHW kernels of
kernels/conv.py). A one-node model in NCHWc pays for its layout conversions (the output back
to NCHW; the input to blocks unless the conv reads it plain), which a conv inside a trunk
does not. Per shape, the three run interleaved: one sample (enough runs for --sample-ms) of
each in turn, --repeats times; the table gives the median sample. Prints the table and
writes bench/results/conv.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import machine  # noqa: E402


@dataclass(frozen=True)
class Case:
    """One Conv: input [1, c, h, w] (h = 0 for a Conv1d over w), m outputs, k x k kernel."""

    name: str
    c: int
    m: int
    h: int
    w: int
    k: int
    stride: int
    group: int = 1
    act: str = "silu"  # "silu", "relu" or "none"

    @property
    def one_d(self) -> bool:
        return self.h == 0

    def macs(self) -> int:
        """Multiply-adds of the conv (to report GFLOP/s)."""
        pad = self.k // 2
        oh = 1 if self.one_d else (self.h + 2 * pad - self.k) // self.stride + 1
        ow = (self.w + 2 * pad - self.k) // self.stride + 1
        kk = self.k if self.one_d else self.k * self.k
        return self.m * oh * ow * (self.c // self.group) * kk


def _yolo(c, m, hw, k, s):
    return Case(f"yolo {c}->{m} k{k}s{s} @{hw}", c, m, hw, hw, k, s)


def _dw(c, hw, k, s):
    return Case(f"dw {c} k{k}s{s} @{hw}", c, c, hw, hw, k, s, group=c, act="relu")


CASES = (
    # YOLOv8n at 320x320: backbone downsampling convs, C2f bottlenecks, 1x1 C2f/SPPF convs, head.
    _yolo(3, 16, 320, 3, 2),
    _yolo(16, 32, 160, 3, 2),
    _yolo(16, 16, 80, 3, 1),
    _yolo(32, 32, 80, 1, 1),
    _yolo(48, 32, 80, 1, 1),
    _yolo(32, 64, 80, 3, 2),
    _yolo(32, 32, 40, 3, 1),
    _yolo(64, 64, 40, 3, 1),
    _yolo(128, 64, 40, 1, 1),
    _yolo(64, 128, 40, 3, 2),
    _yolo(64, 64, 20, 3, 1),
    _yolo(128, 256, 20, 3, 2),
    _yolo(128, 128, 10, 3, 1),
    _yolo(512, 256, 10, 1, 1),
    _yolo(64, 64, 10, 3, 1),
    Case("1x1 s2 64->128 @40", 64, 128, 40, 40, 1, 2, act="none"),
    # MobileNetV3 / PP-OCR det backbone depthwise convs.
    _dw(16, 160, 3, 1),
    _dw(64, 160, 3, 2),
    _dw(72, 80, 3, 1),
    _dw(72, 80, 5, 2),
    _dw(120, 40, 5, 1),
    _dw(240, 40, 3, 2),
    _dw(200, 20, 3, 1),
    _dw(480, 20, 3, 1),
    _dw(480, 20, 5, 1),
    _dw(672, 20, 5, 2),
    # whisper encoder stem (Conv1d, GELU follows outside the conv).
    Case("whisper conv1 80->384 k3 @3000", 80, 384, 0, 3000, 3, 1, act="none"),
    Case("whisper conv2 384->384 k3s2 @3000", 384, 384, 0, 3000, 3, 2, act="none"),
)


def build_model(case: Case, seed: int = 0) -> onnx.ModelProto:
    """Conv (+ Relu or x * Sigmoid(x)) with constant weight and bias."""
    rng = np.random.default_rng(seed)
    spatial = [case.w] if case.one_d else [case.h, case.w]
    kernel = [case.k] * len(spatial)
    pad = case.k // 2
    w = (rng.standard_normal((case.m, case.c // case.group, *kernel)) / np.sqrt(case.c // case.group * case.k))
    b = rng.standard_normal(case.m) * 0.1
    inits = [numpy_helper.from_array(w.astype(np.float32), "w"), numpy_helper.from_array(b.astype(np.float32), "b")]
    conv_out = "y" if case.act == "none" else "conv"
    nodes = [helper.make_node("Conv", ["x", "w", "b"], [conv_out], kernel_shape=kernel, strides=[case.stride] * len(kernel),
                              pads=[pad] * (2 * len(kernel)), group=case.group)]
    if case.act == "relu":
        nodes.append(helper.make_node("Relu", ["conv"], ["y"]))
    elif case.act == "silu":
        nodes += [helper.make_node("Sigmoid", ["conv"], ["sig"]), helper.make_node("Mul", ["conv", "sig"], ["y"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, case.c, *spatial])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def sampler(fn: Callable[[], object], sample_s: float) -> Callable[[], float]:
    """A function returning seconds per call, over enough calls to last about sample_s."""
    start = time.perf_counter()
    fn()
    calls = max(1, int(sample_s / max(time.perf_counter() - start, 1e-6)))

    def sample() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls

    return sample


def bench_case(case: Case, repeats: int, sample_s: float) -> dict:
    import onnxruntime as ort

    model = build_model(case)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    ref = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ours = {"native": _native_session(model, nchwc=True), "native NCHW": _native_session(model, nchwc=False)}
    spatial = [case.w] if case.one_d else [case.h, case.w]
    feed = {"x": np.random.default_rng(1).standard_normal((1, case.c, *spatial)).astype(np.float32)}
    expected = ref.run(None, feed)[0]
    diff = max(float(np.max(np.abs(s.run(None, feed)[0] - expected))) if expected.size else 0.0 for s in ours.values())
    samplers = {name: sampler(lambda s=s: s.run(None, feed), sample_s) for name, s in ours.items()}
    samplers["onnxruntime"] = sampler(lambda: ref.run(None, feed), sample_s)
    times: dict[str, list[float]] = {k: [] for k in samplers}
    for _ in range(repeats):
        for name, sample in samplers.items():
            times[name].append(sample())
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"case": case, **med, "diff": diff}


def _native_session(model, nchwc: bool):
    """A one-thread native session with the NCHWc layout pass on or off (it reads
    SHAPESHIFT_NCHWC when the program is built)."""
    import os

    import shapeshift

    saved = os.environ.get("SHAPESHIFT_NCHWC")
    os.environ["SHAPESHIFT_NCHWC"] = "1" if nchwc else "0"
    try:
        return shapeshift.InferenceSession(model, backend="native", num_threads=1)
    finally:
        if saved is None:
            del os.environ["SHAPESHIFT_NCHWC"]
        else:
            os.environ["SHAPESHIFT_NCHWC"] = saved


def table(rows: list[dict]) -> str:
    lines = ["| conv | GMAC | native ms (NCHWc) | native ms (NCHW) | onnxruntime ms | ratio NCHWc | ratio NCHW | "
             "native GFLOP/s (NCHWc) | max abs diff |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        case, nat, plain, ref = r["case"], r["native"], r["native NCHW"], r["onnxruntime"]
        gmac = case.macs() / 1e9
        lines.append(f"| {case.name} | {gmac:.3f} | {nat * 1e3:.3f} | {plain * 1e3:.3f} | {ref * 1e3:.3f} | "
                     f"{nat / ref:.2f} | {plain / ref:.2f} | {2 * gmac / nat:.1f} | {r['diff']:.1e} |")

    def geo(key: str) -> float:
        return machine.geomean(r[key] / r["onnxruntime"] for r in rows)

    lines.append(f"| **geomean** | | | | | **{geo('native'):.2f}** | **{geo('native NCHW'):.2f}** | | |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sample-ms", type=float, default=30.0)
    parser.add_argument("--only", nargs="*", default=None, help="run the cases whose name contains one of these")
    parser.add_argument("--no-write", action="store_true", help="do not write the results file")
    parser.add_argument("--out", default="conv.md", help="results file name under bench/results (default conv.md)")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    cases = [c for c in CASES if not args.only or any(s in c.name for s in args.only)]
    rows = []
    for case in cases:
        row = bench_case(case, args.repeats, args.sample_ms / 1e3)
        rows.append(row)
        print(f"{case.name:40s} native {row['native'] * 1e3:8.3f} ms  NCHW {row['native NCHW'] * 1e3:8.3f} ms  "
              f"ort {row['onnxruntime'] * 1e3:8.3f} ms  ratio {row['native'] / row['onnxruntime']:.2f} "
              f"(NCHW {row['native NCHW'] / row['onnxruntime']:.2f})", flush=True)
    text = table(rows)
    print(text)
    if not args.no_write:
        import os

        from machine import describe

        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        header = ("# Conv latency: shapeshift native vs onnxruntime (one-node models, 1 thread)\n\n"
                  f"{describe()}\n\n"
                  f"Python {platform.python_version()}, onnxruntime {ort.__version__}; load average at the end "
                  f"{load}. Median of {args.repeats} interleaved samples of about {args.sample_ms:g} ms each, whole "
                  "session.run calls (feed checks included). Ratio > 1: native slower. NCHWc: the default "
                  "(blocked layout, conversions of the one-node model's input and output included); NCHW: "
                  "SHAPESHIFT_NCHWC=0. Generated by `python bench/conv.py`.\n\n")
        (ROOT / "bench" / "results" / args.out).write_text(header + text + "\n")


if __name__ == "__main__":
    main()
