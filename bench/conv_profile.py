"""Where a CNN's time goes, conv class by conv class: shapeshift's native backend against
onnxruntime inside the whole net (issue 28).

    python bench/conv_profile.py [--models resnet50] [--size 224x224] [--batch 1] [--threads 1]
        [--runs 30] [--rounds 2] [--native-variant LABEL env:NAME=VALUE ...] [--out FILE.md]

bench/cnn.py says how much slower or faster a net runs; this says where. Each tool runs the
net in a fresh process with its own per-node profiler on (onnxruntime's ``enable_profiling``,
the native session's ``profile=True``), and every Conv's kernel time is summed by its class:
input and output channels, kernel, stride, groups and output plane, from the model's logical
shapes (onnxruntime's blocked convs, whose profile gives padded shapes, by the name of the
output their node is named after). A conv's time is what its node took with what each tool fused
into it (a bias, an activation, a residual Add); what neither fused stays in "other ops".
The convs of one class inside a net run with the weights, activations and caches the net
leaves them, which a conv measured alone does not show: on ResNet-50 the 1x1 convs of the
14x14 stage ran 1.28 ms each alone and 1.64 inside the net, after the 3x3 convs' Winograd
weights (4 MiB each) had passed through the caches (see bench/results/conv_profile_zen2.md).

Per class, the fastest round of ``--rounds`` (each round runs every tool once, the order
reversed each round); a native variant (``--native-variant``, as in bench/cnn.py) adds a
column run with its environment, e.g. ``winograd-off env:SHAPESHIFT_WINOGRAD=0``. The table,
with the CPU named, goes to ``--out`` and a plot of native - onnxruntime per class beside it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cnn  # noqa: E402
import machine  # noqa: E402

REPLY = "CONV-PROFILE "
OTHER = "other ops"
WARMUP = 5


#: Ops onnxruntime fuses into the conv before them: its node takes the name of the last
#: fused one's output.
FUSED_AFTER = ("BatchNormalization", "Relu", "Clip", "HardSwish", "HardSigmoid", "Sigmoid", "LeakyRelu", "Add")


def conv_classes(path: Path, spec: cnn.Spec, batch: int, hw: tuple, by_output: bool = False) -> dict[str, str]:
    """{Conv node name: class} from onnx shape inference with the input fixed. ``by_output``:
    keyed instead by the output names of the conv and of the ops after it that onnxruntime
    may fuse into it (FUSED_AFTER, each the only reader of the one before): its blocked
    (NCHWc) convs are named after that output, and their profile gives the padded shapes
    (40 channels as 48 on AVX-512), not the logical ones."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for dim, value in zip(dims, (batch, 3, *hw) if spec.batched else (3, *hw)):
        dim.Clear()
        dim.dim_value = value
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input)}
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    classes = {}
    for node in inferred.graph.node:
        if node.op_type != "Conv":
            continue
        x, w, y = shapes.get(node.input[0]), weights.get(node.input[1]), shapes.get(node.output[0])
        if x and w and y and None not in x + y:
            classes[node.name] = conv_class(x, w, y)
    if not by_output:
        return classes
    readers: dict = {}
    for node in inferred.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {}
    for node in inferred.graph.node:
        if node.name not in classes:
            continue
        out = node.output[0]
        outputs[out] = classes[node.name]
        while len(readers.get(out, ())) == 1 and readers[out][0].op_type in FUSED_AFTER:
            out = readers[out][0].output[0]
            outputs[out] = classes[node.name]
    return outputs


def conv_class(x: list, w: list, y: list) -> str:
    """'C->M kHxW sS [gG|dw] OHxOW' from the logical input, weight and output shapes."""
    c, m, group = x[1], w[0], x[1] // max(1, w[1])
    stride = max(1, round(x[2] / y[2])) if y[2] else 1
    kind = " dw" if group == c and group > 1 else f" g{group}" if group > 1 else ""
    return f"{c}->{m} k{w[2]}x{w[3]} s{stride}{kind} {y[2]}x{y[3]}"


def class_flops(key: str, batch: int) -> float:
    """Multiply-adds x 2 of one conv of class ``key``."""
    channels, kernel, *rest = key.split()
    c, m = (int(v) for v in channels.split("->"))
    kh, kw = (int(v) for v in kernel[1:].split("x"))
    group = c if "dw" in rest else int(next((r[1:] for r in rest if r.startswith("g")), 1))
    oh, ow = (int(v) for v in rest[-1].split("x"))
    return 2.0 * batch * m * oh * ow * (c // group) * kh * kw


def worker(tool: str, model: str, batch: int, hw: tuple, threads: int, runs: int, workdir: str,
           options: dict) -> dict:
    """{class: [microseconds a run, count], OTHER: [...], "total": [...]} from the tool's profile."""
    spec = cnn.SPEC[model]
    path = cnn.model_path(spec, Path(workdir))
    feed = cnn.feed_for(spec, batch, hw)
    times: dict = collections.defaultdict(lambda: [0.0, 0])
    if tool == cnn.PEER:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(workdir) / f"ort-profile-{os.getpid()}")
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        for _ in range(WARMUP + runs):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
        seen: collections.Counter = collections.Counter()
        by_output = conv_classes(path, spec, batch, hw, by_output=True)
        for event in events:
            if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
                continue
            seen[event["name"]] += 1
            if seen[event["name"]] <= WARMUP:  # the warm-up runs' events come first
                continue
            args = event["args"]
            ins, outs = args.get("input_type_shape", []), args.get("output_type_shape", [])
            key = OTHER
            if args.get("op_name") in ("Conv", "FusedConv") and len(ins) >= 2 and outs:
                node = event["name"][:-len("_kernel_time")]
                key = by_output.get(node.removesuffix("_nchwc")) or conv_class(
                    *(next(iter(s.values())) for s in (ins[0], ins[1], outs[0])))
            times[key][0] += event["dur"] / runs
            times[key][1] += 1
        counts = {k: v[1] / runs for k, v in times.items()}
    else:
        import shapeshift

        classes = conv_classes(path, spec, batch, hw)
        session = shapeshift.InferenceSession(str(path), backend="native", num_threads=threads, profile=True,
                                              **options)
        for _ in range(WARMUP):
            session.run(None, feed)
        session.profile(reset=True)
        for _ in range(runs):
            session.run(None, feed)
        counts = collections.Counter()
        for row in session.profile():
            if not row.calls:
                continue
            key = classes.get(row.node, OTHER) if row.op_type in ("Conv", "NCHWcConv") else OTHER
            times[key][0] += row.seconds / row.calls * 1e6
            counts[key] += 1
    result = {k: [v[0], counts[k]] for k, v in times.items()}
    result["total"] = [sum(v[0] for v in times.values()), 0]
    return result


def _run_worker(tool: str, args, variant: cnn.Variant, workdir: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS="1", **variant.env)
    cmd = [sys.executable, __file__, "--worker", tool, "--models", args.models[0], "--size", args.size,
           "--batch", str(args.batch), "--threads", str(args.threads), "--runs", str(args.runs),
           "--workdir", workdir, "--options", json.dumps(variant.options)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    replies = [line for line in proc.stdout.splitlines() if line.startswith(REPLY)]
    if proc.returncode != 0 or not replies:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{tool} worker failed: {' / '.join(tail)}")
    return json.loads(replies[-1][len(REPLY):])


def measure(args, variants: dict, workdir: str) -> dict:
    """{column: {class: [us, count]}}: per class the fastest of the rounds."""
    columns = [cnn.NATIVE, *variants, cnn.PEER]
    best: dict = {}
    for index in range(max(1, args.rounds)):
        for column in (columns if index % 2 == 0 else columns[::-1]):
            print(f"round {index + 1}: {column} ...", flush=True)
            result = _run_worker(cnn.PEER if column == cnn.PEER else cnn.NATIVE, args,
                                 variants.get(column, cnn.Variant()), workdir)
            mine = best.setdefault(column, {})
            for key, (us, count) in result.items():
                mine[key] = [min(us, mine[key][0]), count] if key in mine else [us, count]
    return best


def report(results: dict, args, variants: dict) -> str:
    native, peer = results[cnn.NATIVE], results[cnn.PEER]
    keys = sorted((k for k in set(native) | set(peer) if k not in (OTHER, "total")),
                  key=lambda k: -(native.get(k, [0])[0] - peer.get(k, [0])[0]))
    extra = list(variants)
    command = "python bench/conv_profile.py " + " ".join(sys.argv[1:])
    lines = [f"# Conv classes inside {args.models[0]} at {args.batch}x3x{args.size}, {args.threads} thread(s): "
             "native vs onnxruntime", "", machine.describe(), "",
             f"Generated by `{command}`. Each tool's own per-node profiler, {args.runs} runs after {WARMUP} of "
             f"warm-up, the fastest of {args.rounds} round(s) per class, each tool in a fresh process. A conv's "
             "time includes what its tool fused into it; 'n' is the class's convs (native / onnxruntime). Rows "
             "sorted by native - onnxruntime.", "",
             "| conv class | n | native us | " + "".join(f"{v} us | " for v in extra) +
             "onnxruntime us | native - onnxruntime us | native / onnxruntime | native GFLOPS | onnxruntime GFLOPS |",
             "|---|---|---|" + "---|" * len(extra) + "---|---|---|---|---|"]

    def cell(column: dict, key: str) -> str:
        return f"{column[key][0]:.0f}" if key in column else ""

    for key in keys + [OTHER, "total"]:
        a, b = native.get(key, [float("nan"), 0]), peer.get(key, [float("nan"), 0])
        count = f"{a[1]:.0f} / {b[1]:.0f}" if key not in (OTHER, "total") else ""
        flops = class_flops(key, args.batch) * a[1] if key not in (OTHER, "total") else None
        gf = (f"{flops / a[0] / 1e3:.0f} | {flops / b[0] / 1e3:.0f} |" if flops and a[0] and b[0] else " | |")
        label = f"**{key}**" if key == "total" else key
        lines.append(f"| {label} | {count} | {cell(native, key)} | " +
                     "".join(f"{cell(results[v], key)} | " for v in extra) +
                     f"{cell(peer, key)} | {a[0] - b[0]:+.0f} | {a[0] / b[0]:.2f} | {gf}")
    return "\n".join(lines) + "\n"


def plot(results: dict, variants: dict, path: Path) -> None:
    plt = machine.pyplot()
    if plt is None:
        return

    peer = results[cnn.PEER]
    keys = [k for k in peer if k not in ("total",)]
    keys.sort(key=lambda k: results[cnn.NATIVE].get(k, [0])[0] - peer[k][0])
    columns = [cnn.NATIVE, *variants]
    fig, ax = plt.subplots(figsize=(9, 0.3 * len(keys) + 1.5))
    height = 0.8 / len(columns)
    for i, column in enumerate(columns):
        diffs = [(results[column].get(k, [0])[0] - peer[k][0]) / 1e3 for k in keys]
        ax.barh([j + i * height for j in range(len(keys))], diffs, height=height, label=column)
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(keys))], keys, fontsize=7)
    ax.axvline(0, color="black", linewidth=0.5)
    ax.set_xlabel("ms a run: native - onnxruntime (< 0: native faster)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs=1, default=["resnet50"], choices=[s.name for s in cnn.SPECS])
    parser.add_argument("--size", default=None, help="HxW (default: the model's first size in bench/cnn.py)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--native-variant", nargs="+", action="append", default=[], metavar="LABEL SETTING")
    parser.add_argument("--out", default=None, help="markdown table (its plot beside it, .png)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    spec = cnn.SPEC[args.models[0]]
    args.size = args.size or "x".join(map(str, spec.sizes[0]))
    hw = tuple(int(v) for v in args.size.lower().split("x"))
    if args.worker:
        result = worker(args.worker, args.models[0], args.batch, hw, args.threads, args.runs, args.workdir,
                        json.loads(args.options))
        print(REPLY + json.dumps(result), flush=True)
        return 0
    if spec.shared and cnn.model_path(spec, Path(".")) is None:
        print(f"{spec.name}: {cnn.MODELS_DIR} does not hold it", file=sys.stderr)
        return 2
    variants = dict(cnn.parse_variant(words) for words in args.native_variant)
    with tempfile.TemporaryDirectory(prefix="conv-profile-") as workdir:
        results = measure(args, variants, workdir)
    text = report(results, args, variants)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".md.tmp")
        tmp.write_text(text)
        tmp.replace(out)
        plot(results, variants, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
