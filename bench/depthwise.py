"""The blocked depthwise conv kernel alone against onnxruntime running the same conv (issue 28).

    python bench/depthwise.py [--channels 16 40 ...] [--planes 7 14 ...] [--repeats 5]
                              [--sample-ms 20] [--out bench/results/depthwise.md]

Issue 28 asks of the depthwise kernel alone, k3 and k5, stride 1 and 2, 16..960 channels,
planes 7..112: <= 1.0x onnxruntime's time for that one conv. The grid is every (channels,
plane, kernel, stride) of the given lists; the default channel counts include ones that are
not a multiple of the block (40, 72, 120), where the last block is part padding. Each conv
is Conv (pads k // 2, bias) -> Relu, batch 1, one thread.

Three figures per conv:

- kernel: ``ss_dwconv_nchwc_L`` (kernels/conv_nchwc.py, L the target's block) on an input
  already in blocks, weights packed, ReLU in its epilogue, called in a C loop (one ctypes
  call a sample: a ctypes call with the kernel's 25 arguments takes about 4 us here, more
  than the whole of a small conv): what the conv costs inside a blocked trunk;
- onnxruntime node: the mean of onnxruntime's own profiler over the conv node (its NCHWc
  conv where its layout transformer made one, with the ReLU fused) in a profiled session's
  runs: the same thing measured on onnxruntime's side, without the reorders around it.
  onnxruntime records whole microseconds, truncated: below a few microseconds the figure is
  coarse (and low, which counts against us);
- onnxruntime run: its whole session.run of the one-node model (reorders and per-call
  overhead included), in a session without the profiler: the figure a user timing "that one
  conv" sees.

The three are sampled in rounds, --repeats rounds of a sample of about --sample-ms each
(the node's: the mean over that sample's profiled runs); the table gives each one's median,
and the ratios the median of the rounds' ratios, each round's kernel sample over the samples
taken beside it. The ratio the issue's line reads is kernel / onnxruntime node. (Until
2026-12-07 the profiled runs came after all the rounds, so a slow minute on either side
moved the ratio: the memory-bound rows on 112x112 planes read 0.97-1.12 from one run to the
next.) Outputs are checked against onnxruntime's. Prints the table and writes it (and a plot
where matplotlib is installed) to --out.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from conv import Case, build_model, sampler  # noqa: E402
from conv_blocked import kernel_call  # noqa: E402
import machine  # noqa: E402
from machine import geomean  # noqa: E402

from shapeshift.codegen.build import compile_library  # noqa: E402
from shapeshift.codegen.kernels import conv_nchwc, nchwc  # noqa: E402
from shapeshift.codegen.kernels.nchwc import block_width  # noqa: E402
from shapeshift.codegen.kernels.prelude import PRELUDE  # noqa: E402
from shapeshift.target import host_target  # noqa: E402

CHANNELS = (16, 40, 72, 120, 240, 480, 960)
PLANES = (7, 14, 28, 56, 112)
KERNELS = (3, 5)
STRIDES = (1, 2)
#: Profiled onnxruntime runs before the sampled ones, left out of the node's figure.
WARMUP = 5


_I64, _F32P, _INT, _F32 = ctypes.c_int64, ctypes.POINTER(ctypes.c_float), ctypes.c_int, ctypes.c_float
_PARAMS = ", ".join(conv_nchwc.DEPTHWISE_PARAMS)


def load_repeat(lanes: int):
    """``ss_bench_dw_repeat(reps, <ss_dwconv_nchwc_L's arguments>)``: the kernel reps times in C."""
    names = ", ".join(p.split()[-1].lstrip("*") for p in conv_nchwc.DEPTHWISE_PARAMS)
    harness = (f"\nvoid ss_bench_dw_repeat(int64_t reps, {_PARAMS})\n"
               f"{{\n    for (int64_t r = 0; r < reps; r++) ss_dwconv_nchwc_{lanes}({names});\n}}\n")
    lib = compile_library(PRELUDE + nchwc.source() + conv_nchwc.source() + harness, "bench depthwise").cdll
    fn = lib.ss_bench_dw_repeat
    fn.restype = None
    fn.argtypes = [_I64] + [_F32P] * 4 + [_I64] * 14 + [_F32P, _INT, _F32, _F32, _INT, _F32, _F32]
    return fn


def kernel_runner(case: Case, x: np.ndarray, w: np.ndarray, b: np.ndarray, lanes: int, repeat):
    """run(reps): the case's kernel reps times, with conv_blocked.kernel_call's arguments;
    and its output [1, ceil(C/L), OH, OW, L]."""
    reps = [1]
    once, y, keep = kernel_call(case, x, w, b, lanes, None, lambda *args: repeat(reps[0], *args))

    def run(count: int) -> None:
        reps[0] = count
        once()
    run.keep = keep
    return run, y


def repeat_sampler(run, sample_s: float):
    """Seconds per kernel call, from one C loop of enough calls to last about sample_s."""
    run(3)
    start = time.perf_counter()
    run(10)
    reps = max(10, int(sample_s / max((time.perf_counter() - start) / 10, 1e-9)))

    def sample() -> float:
        t0 = time.perf_counter()
        run(reps)
        return (time.perf_counter() - t0) / reps
    return sample


def cases(channels, planes, kernels=KERNELS, strides=STRIDES) -> list[Case]:
    return [Case(f"dw {c} k{k}s{s} @{p}", c, c, p, p, k, s, group=c, act="relu")
            for k in kernels for s in strides for p in planes for c in channels]


def ort_session(model_bytes: bytes, profile_prefix: str = ""):
    """onnxruntime on one thread, profiling into files named from ``profile_prefix`` if given."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    if profile_prefix:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])


class NodeSampler:
    """Samples of onnxruntime's conv node: each call runs a profiled session for about
    sample_s and records how many runs it made; means() reads the profile once at the end and
    gives each sample's mean node time (and the node's op type: Conv or FusedConv)."""

    def __init__(self, model_bytes: bytes, feed: dict, sample_s: float, workdir: str):
        self.session = ort_session(model_bytes, str(Path(workdir) / f"ort-dw-{os.getpid()}"))
        self.feed = feed
        for _ in range(WARMUP):
            self.session.run(None, feed)
        start = time.perf_counter()
        self.session.run(None, feed)
        self.runs = max(10, int(sample_s / max(time.perf_counter() - start, 1e-7)))
        self.counts = [WARMUP + 1]

    def __call__(self) -> float:
        for _ in range(self.runs):
            self.session.run(None, self.feed)
        self.counts.append(self.runs)
        return 0.0  # the figure comes from the profile, in means()

    def means(self) -> tuple[list[float], str]:
        path = Path(self.session.end_profiling())
        events = json.loads(path.read_text())
        path.unlink()
        durations: dict[str, list[float]] = {}
        ops: dict[str, str] = {}
        for event in events:
            args = event.get("args", {})
            if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
                continue
            if args.get("op_name") not in ("Conv", "FusedConv"):
                continue
            durations.setdefault(event["name"], []).append(event["dur"] * 1e-6)
            ops[event["name"]] = args["op_name"]
        if len(durations) != 1:
            raise RuntimeError(f"expected one conv node in onnxruntime's profile, found {sorted(durations)}")
        (name, values), = durations.items()
        if len(values) != sum(self.counts):
            raise RuntimeError(f"onnxruntime's profile holds {len(values)} runs of its conv, {sum(self.counts)} made")
        means, at = [], self.counts[0]
        for count in self.counts[1:]:
            means.append(float(np.mean(values[at:at + count])))
            at += count
        return means, ops[name]


def bench_case(case: Case, repeats: int, sample_s: float, lanes: int, repeat, workdir: str) -> dict:
    from onnx import numpy_helper

    model = build_model(case)
    model_bytes = model.SerializeToString()
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    ref = ort_session(model_bytes)
    x = np.random.default_rng(1).standard_normal((1, case.c, case.h, case.w)).astype(np.float32)
    feed = {"x": x}
    run, y = kernel_runner(case, x, inits["w"], inits["b"], lanes, repeat)
    run(1)
    expected = ref.run(None, feed)[0]
    got = y.transpose(0, 1, 4, 2, 3).reshape(1, -1, *y.shape[2:4])[:, :case.m]
    diff = float(np.max(np.abs(got - expected)))
    scale = float(np.max(np.abs(expected))) or 1.0
    if diff > 1e-4 * scale:
        raise AssertionError(f"{case.name}: the kernel's output differs from onnxruntime's by {diff:.3g}")
    node = NodeSampler(model_bytes, feed, sample_s, workdir)
    samplers = {"kernel": repeat_sampler(run, sample_s), "ort_run": sampler(lambda: ref.run(None, feed), sample_s),
                "ort_node": node}
    times: dict[str, list[float]] = {k: [] for k in samplers}
    for _ in range(repeats):
        for name, sample in samplers.items():
            times[name].append(sample())
    times["ort_node"], op = node.means()
    row = {"case": case, **{k: statistics.median(v) for k, v in times.items()}, "diff": diff, "ort_op": op,
           "ratio": statistics.median(k / n for k, n in zip(times["kernel"], times["ort_node"])),
           "run_ratio": statistics.median(k / r for k, r in zip(times["kernel"], times["ort_run"]))}
    return row


def table(rows: list[dict], lanes: int) -> str:
    lines = [f"| conv | MMAC | NCHWc{lanes} kernel us | onnxruntime node us | onnxruntime run us | "
             "kernel / node | kernel / run | kernel GFLOPS | onnxruntime op | max abs diff |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        case, ours = r["case"], r["kernel"]
        mmac = case.macs() / 1e6
        lines.append(f"| {case.name} | {mmac:.2f} | {ours * 1e6:.1f} | {r['ort_node'] * 1e6:.1f} | "
                     f"{r['ort_run'] * 1e6:.1f} | {r['ratio']:.2f} | {r['run_ratio']:.2f} | "
                     f"{2 * mmac / 1e3 / ours:.1f} | {r['ort_op']} | {r['diff']:.1e} |")
    lines.append(f"| **geomean** | | | | | **{geomean(r['ratio'] for r in rows):.2f}** | "
                 f"**{geomean(r['run_ratio'] for r in rows):.2f}** | | | |")
    return "\n".join(lines)


def verdict(rows: list[dict]) -> str:
    above = [r for r in rows if r["ratio"] > 1.0]
    worst = max(rows, key=lambda r: r["ratio"])
    head = (f"Issue 28's depthwise line (kernel <= 1.0x onnxruntime's node, every conv): "
            f"{'met' if not above else 'NOT met'}; {len(rows) - len(above)} of {len(rows)} at or under 1.0, "
            f"worst {worst['case'].name} at {worst['ratio']:.2f}.")
    if above:
        head += " Above 1.0: " + ", ".join(f"{r['case'].name} ({r['ratio']:.2f})"
                                           for r in sorted(above, key=lambda r: -r["ratio"]))
    return head


def plot(rows: list[dict], path: Path) -> None:
    plt = machine.pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(9, 5))
    for k in KERNELS:
        for s in STRIDES:
            sel = [r for r in rows if r["case"].k == k and r["case"].stride == s]
            if sel:
                ax.scatter([r["case"].macs() for r in sel], [r["ratio"] for r in sel],
                           label=f"k{k} s{s}", s=18)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("multiply-adds of the conv")
    ax.set_ylabel("kernel / onnxruntime node time")
    ax.set_title("Depthwise conv alone, 1 thread")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, nargs="+", default=list(CHANNELS))
    parser.add_argument("--planes", type=int, nargs="+", default=list(PLANES))
    parser.add_argument("--kernels", type=int, nargs="+", default=list(KERNELS))
    parser.add_argument("--strides", type=int, nargs="+", default=list(STRIDES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sample-ms", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "depthwise.md")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    from machine import describe

    lanes = block_width(host_target())
    repeat = load_repeat(lanes)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for case in cases(args.channels, args.planes, args.kernels, args.strides):
            row = bench_case(case, args.repeats, args.sample_ms / 1e3, lanes, repeat, workdir)
            rows.append(row)
            print(f"{case.name:22s} kernel {row['kernel'] * 1e6:9.1f} us  ort node {row['ort_node'] * 1e6:9.1f} us  "
                  f"run {row['ort_run'] * 1e6:9.1f} us  ratio {row['ratio']:.2f}", flush=True)
    text = table(rows, lanes)
    print(text)
    print(verdict(rows))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python bench/depthwise.py " + " ".join(argv if argv is not None else sys.argv[1:])
    header = (f"<!-- configuration: `{command.strip()}` at {commit}, {now}, {host_target().cpu_model} -->\n"
              "# The depthwise conv kernel alone vs onnxruntime (one conv, 1 thread; issue 28)\n\n"
              f"{describe()}\n\n"
              f"Python {platform.python_version()}, onnxruntime {ort.__version__}. Block {lanes}. Conv (pads k // 2, "
              "bias) -> Relu, batch 1. kernel: ss_dwconv_nchwc on input already in blocks, called in a C loop; "
              "onnxruntime node: the mean of its profiler over its conv node (whole microseconds, truncated); "
              "onnxruntime run: whole session.run calls (its reorders included). Each: the median of "
              f"{args.repeats} rounds of a sample of about {args.sample_ms:g} ms, the three sampled in turn; ratios: "
              "the median of the rounds' ratios. Ratio > 1: the kernel slower. "
              "See bench/depthwise.py's docstring.\n\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".md.tmp")
    tmp.write_text(header + text + "\n\n" + verdict(rows) + "\n")
    tmp.replace(args.out)
    plot(rows, args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
