"""Convolutional nets end to end: shapeshift's native backend against onnxruntime (issue 28).

    python bench/cnn.py [--quick] [--models NAME ...] [--threads 1 2] [--batches 1 4]
                        [--sizes HxW ...] [--repeats 7] [--sample-ms 200] [--settle-ms 100]
                        [--out bench/results/cnn.md]
                        [--no-nchwc-off] [--native-variant LABEL SETTING ...]

Models (``--models``; default all but ``resnet50_bn``):

- built here with onnx.helper and seeded random weights (bench/cnn_models.py): ``resnet50``
  (torchvision's layout, BatchNorm folded) and ``mobilenet_v3_small`` (BatchNormalization
  nodes left in) at 224x224, ``yolo_style`` (C2f, SPPF, Resize neck) at 320 and 640;
  ``resnet50_bn`` (only when named: ResNet-50 with its 53 BatchNormalizations left in, as
  some exporters write it; the native backend folds them into the convs, as onnxruntime
  does, since db99189; before, they cost it 2-4% of the net on an AMD Zen 4);
- from ../shared/models (skipped with a printed reason when the folder is absent):
  ``yolov8n_nudenet.320n`` at 320, 640 and 96 (whose last stage's 3x3 convs run on 3x3 planes:
  9-row products, 1.09-1.19x onnxruntime's latency on an AMD Zen 4 until 3c1c1b1),
  ``ppocr_det.det_infer`` at 480x640 and 960x960,
  ``ssdlite320_mobilenet_v3_large.ts`` at 320x320 (it takes one image [3, H, W]: batch 1 only).

Every model runs at each batch (``--batches``, default 1 and 4) and thread count
(``--threads``, default 1 and 2) at each of its sizes (``--sizes`` overrides them for every
model). ``--quick``: 1 thread, batch 1, each model's first size.

Each tool runs in a worker process of its own (one per tool, model and thread count, alive
for all of that model's shapes): native with ``num_threads`` and onnxruntime with
``intra_op_num_threads`` set to the thread count and its default graph optimizations (all
on, its NCHWc layout transformer included), and ``OMP_NUM_THREADS`` set in both. Separate
processes keep one tool's idle thread pool (spinning after a run) off the other's cores.
Per shape both run once (outputs compared: max abs difference from onnxruntime, and that
over onnxruntime's largest magnitude), then the tools are sampled in turn, ``--repeats``
times, the order rotated each repeat: one sample is enough calls to last ``--sample-ms``
(at least one), after a pause of ``--settle-ms`` (100 by default). Without the pause, at 2
threads the tool sampled second shared its cores with the other process's idle pool still
spinning: on an AMD Zen 4, 2 threads, batch 1, ResNet-50 native 51.1 / onnxruntime 50.7 ms
and MobileNetV3-small 3.31 / 2.24 ms without it, 41.8 / 41.9 and 1.45 / 1.33 with 100 ms. Latency is the median sample; ratio is native / onnxruntime (< 1: native
faster); geomeans per model and over all. Also reported: each model's conv + Gemm GFLOP at
the shape (onnx shape inference; blank where it cannot resolve them) and native's GFLOPS
against the measured peak (bench/machine.py).

Columns: native (default: the blocked-layout pass "auto", on for nets with a depthwise
conv), "native NCHWc on" and "native NCHWc off" (the pass forced on or off by its
environment variable, codegen/lower/layout_assign.py's ENV, when this tree has that pass;
``--no-nchwc-off`` leaves both columns out) and onnxruntime. Any other native
configuration switched by an environment variable or a session option becomes one more
column with ``--native-variant LABEL SETTING...`` (a SETTING is ``env:NAME=VALUE`` or
``session:NAME=VALUE``, VALUE read as JSON when it parses, else as a string). The targets are
checked on the default native column. Native with tuning records is a variant like any
other (``--native-variant "native grouped" session:tuning_db=FILE``); the grouped against
per-instance comparison on ResNet-50 (tuning wall time, kernel count, library size and
latency with each set of records) is bench/tune_group.py's, since per-instance records
apply to convs of static sizes and this bench declares no dims.

Writes the table to ``--out`` (default bench/results/cnn.md) and a plot beside it (.png).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

import machine  # noqa: E402
from conv import sampler  # noqa: E402
from e2e import _max_diff as max_diff  # noqa: E402
from machine import geomean  # noqa: E402

MODELS_DIR = ROOT.parent / "shared" / "models"
RESULTS = ROOT / "bench" / "results"
REPLY = "CNN-BENCH "  # a worker's replies start with this (anything else it prints is passed on)
# Issue 28's first "Must show" line: every CNN, every shape, 1 and 2 threads.
TARGET_EACH = 0.9
TARGET_GEOMEAN = 0.8


@dataclass(frozen=True)
class Spec:
    """One model: where it comes from, its input, and the sizes it is measured at."""

    name: str
    sizes: tuple  # (height, width) pairs, the --quick one first
    input: str = "images"
    batched: bool = True  # False: the input is one image [3, H, W]
    pixels: str = "normal"  # "normal" (a normalised image) or "uniform" ([0, 1], the model normalises)
    shared: bool = False  # in ../shared/models (else built by bench/cnn_models.py)
    note: str = ""
    default: bool = True  # measured when --models is not given


SPECS = (
    Spec("resnet50", ((224, 224),)),
    Spec("resnet50_bn", ((224, 224),), default=False,
         note="ResNet-50 with its BatchNormalizations left in (a conv without bias, then the BN), as some exporters "
              "write it: only with --models"),
    Spec("mobilenet_v3_small", ((224, 224),)),
    Spec("yolo_style", ((320, 320), (640, 640)), pixels="uniform"),
    Spec("yolov8n_nudenet.320n", ((320, 320), (640, 640), (96, 96)), pixels="uniform", shared=True),
    # PaddleOCR normalises the image before the detector: its input is a normalised image.
    Spec("ppocr_det.det_infer", ((480, 640), (960, 960)), input="x", shared=True,
         note="on random images its probability map stays near 0 (largest 1e-6 to 1e-3), so its relative "
              "difference is large while the absolute one (~1e-7) is what onnxruntime with and without its graph "
              "optimizations differ by (1.5-1.8e-7 at 96x160 and 480x640)"),
    Spec("ssdlite320_mobilenet_v3_large.ts", ((320, 320),), batched=False, pixels="uniform", shared=True,
         note="takes one image [3, H, W]: batch 1 only. Its weights are random: at 320x320 every one of its 300 "
              "detections scores 1/91 and its boxes are its anchors, so comparing its outputs checks little of "
              "the computation"),
)
SPEC = {s.name: s for s in SPECS}


@dataclass(frozen=True)
class Variant:
    """A native column's configuration: its worker's extra environment and session options."""

    env: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)


def parse_variant(words: list) -> tuple:
    """``[LABEL, SETTING, ...]`` of --native-variant: (label, Variant)."""
    label, settings = words[0], words[1:]
    variant = Variant()
    for setting in settings:
        kind, _, assignment = setting.partition(":")
        name, eq, text = assignment.partition("=")
        if kind not in ("env", "session") or not name or not eq:
            raise argparse.ArgumentTypeError(f"--native-variant {label!r}: a setting is env:NAME=VALUE or "
                                             f"session:NAME=VALUE, got {setting!r}")
        if kind == "env":
            variant.env[name] = text
        else:
            try:
                variant.options[name] = json.loads(text)
            except json.JSONDecodeError:
                variant.options[name] = text
    if label in (NATIVE, NCHWC_ON, NCHWC_OFF, PEER):
        raise argparse.ArgumentTypeError(f"--native-variant: the label {label!r} is taken; choose another")
    return label, variant


NATIVE = "native"  # the native backend as a user gets it (the column the targets are checked on)
NCHWC_ON = "native NCHWc on"  # the blocked layout forced on (the default, "auto", only for depthwise nets)
NCHWC_OFF = "native NCHWc off"
PEER = "onnxruntime"
# Issue 28's other columns, not measured yet (see the module docstring).
NOT_MEASURED = ("native with grouped and with per-instance conv tuning records, and the tuning wall time, kernel "
                "count and library size of each: bench/tune_group.py --model resnet50 measures them (per-instance "
                "records apply to convs of static sizes; this bench declares no dims), and --native-variant "
                "LABEL session:tuning_db=FILE adds a column with any records.")


# -- the worker: one tool, one model, one thread count, driven line by line ----------------------


def feed_for(spec: Spec, batch: int, hw: tuple, seed: int = 0) -> dict:
    """The input at (batch, height, width): the same array in every worker (seeded)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    shape = (batch, 3, *hw) if spec.batched else (3, *hw)
    image = rng.random(shape) if spec.pixels == "uniform" else rng.standard_normal(shape)
    return {spec.input: image.astype(np.float32)}


def _session(tool: str, path: str, threads: int, options: dict):
    if tool == PEER:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    import shapeshift

    return shapeshift.InferenceSession(path, backend="native", num_threads=threads, **options)


def worker(tool: str, threads: int, workdir: str) -> None:
    """Answer the parent's commands, one JSON line each, until stdin closes:
    {"op": "load", "spec": NAME, "path": FILE, "options": {session keyword arguments}};
    {"op": "prepare", "batch": B, "hw": [H, W], "sample_s": S} (one run, its outputs saved; sets
    up the sampler); {"op": "sample"} (one sample's seconds per run)."""
    import numpy as np

    session = spec = sample = None
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "load":
                spec = SPEC[cmd["spec"]]
                start = time.perf_counter()
                session = _session(tool, cmd["path"], threads, cmd.get("options", {}))
                reply = {"load_s": time.perf_counter() - start}
            elif cmd["op"] == "prepare":
                feed = feed_for(spec, cmd["batch"], tuple(cmd["hw"]))
                outputs = session.run(None, feed)
                out = Path(workdir) / f"out-{tool}-{spec.name}-{time.time_ns()}.npz"
                np.savez(out, *[np.asarray(o) for o in outputs])
                sample = sampler(lambda: session.run(None, feed), cmd["sample_s"])  # its first call warms up
                reply = {"outputs": str(out)}
            elif cmd["op"] == "sample":
                reply = {"s": sample()}
            else:
                reply = {"error": f"unknown command {cmd['op']!r}"}
        except Exception as exc:  # reported to the parent, which records it for this model
            reply = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
        print(REPLY + json.dumps(reply), flush=True)


class Worker:
    """The parent's handle on one worker process."""

    def __init__(self, column: str, tool: str, threads: int, workdir: str, env: dict):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                   MKL_NUM_THREADS=str(threads), **env)
        self.column = column
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", tool, "--threads", str(threads),
                                      "--workdir", workdir], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                reply = json.loads(line[len(REPLY):])
                if "error" in reply:
                    raise RuntimeError(f"{self.column}: {reply['error']}")
                return reply
            sys.stdout.write(line)  # something the tool printed
        raise RuntimeError(f"{self.column}: the worker exited (code {self.proc.wait()})")

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -- the parent ------------------------------------------------------------------------------------


@dataclass
class Row:
    """One measured configuration."""

    model: str
    hw: tuple
    batch: int
    threads: int
    latency: dict = field(default_factory=dict)  # column -> median seconds
    samples: dict = field(default_factory=dict)  # column -> every sample's seconds
    diff: dict = field(default_factory=dict)  # column -> max abs difference from onnxruntime
    scale: float = math.nan  # onnxruntime's largest output magnitude
    gflop: Optional[float] = None
    # At 2 threads or more: the core-to-core round trip (ns, bench/machine.py) before each
    # round of samples and after the last, so that round k's state is that of probes k and
    # k + 1 where they agree.
    probes: list = field(default_factory=list)

    def round_states(self) -> list[Optional[str]]:
        """"near", "far" or None (the state changed, or was not probed) per round."""
        states = [machine.core_state(ns) for ns in self.probes]
        return [a if a == b else None for a, b in zip(states, states[1:])]

    def ratio_in(self, state: str, column: str = NATIVE) -> tuple[float, int]:
        """(native / onnxruntime over the rounds in ``state``, how many rounds that is)."""
        rounds = [k for k, s in enumerate(self.round_states()) if s == state]
        if not rounds or column not in self.samples or PEER not in self.samples:
            return math.nan, 0
        mine = statistics.median(self.samples[column][k] for k in rounds)
        theirs = statistics.median(self.samples[PEER][k] for k in rounds)
        return mine / theirs, len(rounds)

    def ratio(self, column: str = NATIVE) -> float:
        if column not in self.latency or PEER not in self.latency:
            return math.nan
        return self.latency[column] / self.latency[PEER]


def nchwc_switch() -> Optional[str]:
    """The environment variable that turns the native backend's blocked NCHWc layout off
    (set to 0), or None where this tree has no such pass."""
    try:
        from shapeshift.codegen.lower.layout_assign import ENV
    except ImportError:
        return None
    return ENV


def configurations(args) -> list[tuple]:
    """(spec, threads, [(batch, hw), ...]) per model and thread count, as the options ask."""
    out = []
    for name in args.models:
        spec = SPEC[name]
        sizes = args.sizes or (spec.sizes[:1] if args.quick else spec.sizes)
        batches = [b for b in args.batches if spec.batched or b == 1]
        for threads in args.threads:
            out.append((spec, threads, [(b, tuple(hw)) for b in batches for hw in sizes]))
    return out


def model_path(spec: Spec, workdir: Path) -> Optional[Path]:
    """The model's file: ../shared/models' (None when absent) or built into workdir."""
    if spec.shared:
        path = MODELS_DIR / f"{spec.name}.onnx"
        return path if path.exists() else None
    path = workdir / f"{spec.name}.onnx"
    if not path.exists():
        import onnx

        from cnn_models import BUILDERS, activation_stats

        model = BUILDERS[spec.name]()
        stats = activation_stats(model, feed_for(spec, 1, spec.sizes[0]))
        if not stats["finite"] or stats["std"] < 1e-3:
            raise RuntimeError(f"{spec.name}: its random weights give a degenerate output {stats}")
        onnx.save(model, str(path))
    return path


def conv_gflop(path: Path, spec: Spec, batch: int, hw: tuple) -> Optional[float]:
    """GFLOP of the model's Conv, Gemm and MatMul nodes at this input (2 per multiply-add),
    from onnx shape inference with the input fixed; None when a conv's shape stays unknown."""
    import numpy as np
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for dim, value in zip(dims, (batch, 3, *hw) if spec.batched else (3, *hw)):
        dim.Clear()
        dim.dim_value = value
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:
        return None
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input)}
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    total = 0
    for node in inferred.graph.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        out = shapes.get(node.output[0])
        if node.op_type == "Conv":
            w = weights.get(node.input[1]) or shapes.get(node.input[1])  # an initializer or a Constant's output
            if not out or None in out or not w or None in w:
                return None
            total += int(np.prod(out)) * int(np.prod(w[1:]))
        else:
            a = shapes.get(node.input[0])
            if not out or None in out or not a or a[-1] is None:
                return None
            k = a[-2] if node.op_type == "Gemm" and any(x.name == "transA" and x.i for x in node.attribute) else a[-1]
            total += int(np.prod(out)) * k
    return 2 * total / 1e9


def measure(spec: Spec, path: Path, threads: int, shapes: list, args, workdir: str,
            variants: dict) -> list[Row]:
    """Every (batch, size) of one model at one thread count; each column in its own worker."""
    columns = {**{label: ("native", v) for label, v in variants.items()}, PEER: (PEER, Variant())}
    workers = [Worker(c, tool, threads, workdir, v.env) for c, (tool, v) in columns.items()]
    rows = []
    try:
        for w in workers:
            load = w.ask(op="load", spec=spec.name, path=str(path), options=columns[w.column][1].options)["load_s"]
            print(f"  {spec.name} {threads}t: {w.column} session in {load:.1f} s", flush=True)
        for batch, hw in shapes:
            row = Row(spec.name, hw, batch, threads, gflop=conv_gflop(path, spec, batch, hw))
            outputs = {w.column: w.ask(op="prepare", batch=batch, hw=list(hw), sample_s=args.sample_ms / 1e3)["outputs"]
                       for w in workers}
            row.diff = {c: max_diff(p, outputs[PEER]) for c, p in outputs.items() if c != PEER}
            row.scale = _largest(outputs[PEER])
            row.samples = {w.column: [] for w in workers}
            for repeat in range(args.repeats):
                if threads > 1:
                    row.probes.append(machine.core_to_core_ns())
                turn = repeat % len(workers)
                for w in workers[turn:] + workers[:turn]:
                    time.sleep(args.settle_ms / 1e3)  # the tool before it has stopped spinning
                    row.samples[w.column].append(w.ask(op="sample")["s"])
            if threads > 1:
                row.probes.append(machine.core_to_core_ns())
            row.latency = {c: statistics.median(s) for c, s in row.samples.items()}
            print(format_row(row), flush=True)
            rows.append(row)
    finally:
        for w in workers:
            w.close()
    return rows


def _largest(npz: str) -> float:
    import numpy as np

    with np.load(npz) as data:
        return max((float(np.abs(data[k]).max()) for k in data.files if data[k].size and data[k].dtype.kind == "f"),
                   default=0.0)


def _label(row: Row) -> str:
    return f"{row.hw[0]}x{row.hw[1]} b{row.batch} {row.threads}t"


def format_row(row: Row) -> str:
    cols = "  ".join(f"{c} {row.latency[c] * 1e3:8.2f} ms" for c in row.latency)
    diff = row.diff.get(NATIVE, math.nan)
    return f"{row.model:34s} {_label(row):18s} {cols}  ratio {row.ratio():.2f}  diff {diff:.1e}"


def table(rows: list[Row], peak: float) -> str:
    """The markdown table: one line per configuration, a geomean line per model and over all."""
    variants = list(dict.fromkeys(c for r in rows for c in r.latency if c != PEER))
    head = (["model", "input", "batch", "threads", "GFLOP"] + [f"{c} ms" for c in variants] + [f"{PEER} ms"]
            + [f"{c} / {PEER}" for c in variants]
            + ["native GFLOPS (% peak)", "max abs diff (rel.)" + (" per native column" if len(variants) > 1 else "")])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        for r in mine:
            rate = ""
            if r.gflop and NATIVE in r.latency:
                gflops = r.gflop / r.latency[NATIVE]
                rate = f"{gflops:.0f} ({100 * gflops / (peak * r.threads):.0f}%)"
            cells = ([model, f"{r.hw[0]}x{r.hw[1]}", str(r.batch), str(r.threads),
                      f"{r.gflop:.2f}" if r.gflop else ""]
                     + [f"{r.latency[c] * 1e3:.2f}" if c in r.latency else "" for c in (*variants, PEER)]
                     + [f"{r.ratio(c):.2f}" for c in variants]
                     + [rate, " / ".join(_diff(r.diff.get(c, math.nan), r.scale) for c in variants)])
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("| " + " | ".join([f"**{model} geomean**", "", "", "", ""] + [""] * (len(variants) + 1)
                                       + [f"**{geomean(r.ratio(c) for r in mine):.2f}**" for c in variants]
                                       + ["", ""]) + " |")
    lines.append("| " + " | ".join(["**all geomean**", "", "", "", ""] + [""] * (len(variants) + 1)
                                   + [f"**{geomean(r.ratio(c) for r in rows):.2f}**" for c in variants]
                                   + ["", ""]) + " |")
    return "\n".join(lines)


def by_state(rows: list[Row]) -> list[str]:
    """The rows at 2 threads or more again, split by the cores' state in each round of
    samples (bench/machine.py ``core_state``): on a VM whose two vCPUs are sometimes near and
    sometimes far apart, a ratio over all rounds mixes two machines. Empty when no row was
    probed."""
    probed = [r for r in rows if r.probes and any(p is not None for p in r.probes)]
    if not probed:
        return []
    lines = [f"The same rows by the state of the cores in each round of samples (a round: one sample of each "
             f"tool; its state, where the core-to-core round trips before and after it agree: near up to "
             f"{machine.FAR_NS:g} ns, far above; 'changed': they disagree):", "",
             "| model | input | batch | threads | round trips ns | rounds near / far / changed "
             f"| {NATIVE} / {PEER} near | {NATIVE} / {PEER} far |", "|" + "---|" * 8]
    for r in probed:
        states = r.round_states()
        counts = [states.count("near"), states.count("far"), states.count(None)]
        trips = [p for p in r.probes if p is not None]
        cells = [r.model, f"{r.hw[0]}x{r.hw[1]}", str(r.batch), str(r.threads),
                 f"{min(trips):.0f}-{max(trips):.0f}", " / ".join(map(str, counts))]
        for state in ("near", "far"):
            ratio, n = r.ratio_in(state)
            cells.append(f"{ratio:.2f}" if n else "")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for state in ("near", "far"):
        measured = [(r, r.ratio_in(state)[0]) for r in probed if r.ratio_in(state)[1]]
        over = [f"{r.model} {_label(r)} ({ratio:.2f})" for r, ratio in measured if ratio > TARGET_EACH]
        lines.append(f"- {state} state, {len(measured)} of {len(probed)} rows measured in it: "
                     + (f"every one <= {TARGET_EACH}" if measured and not over else
                        f"{len(over)} above {TARGET_EACH}: {', '.join(over)}" if over else "none"))
    return [*lines, ""]


def _diff(diff: float, scale: float) -> str:
    return f"{diff:.1e} ({diff / scale:.0e})" if scale else f"{diff:.1e}"


def verdict(rows: list[Row]) -> list[str]:
    """Issue 28's first Must-show line, over what was measured."""
    ratios = [r.ratio() for r in rows if math.isfinite(r.ratio())]
    over = [f"{r.model} {_label(r)} ({r.ratio():.2f})" for r in rows if r.ratio() > TARGET_EACH]
    geo = geomean(ratios)
    return [f"- every configuration native / onnxruntime <= {TARGET_EACH}: "
            + ("met" if ratios and not over else f"NOT met ({len(over)} of {len(ratios)} above: {', '.join(over)})"),
            f"- geomean over all: {geo:.2f} (target <= {TARGET_GEOMEAN}) "
            + ("met" if geo <= TARGET_GEOMEAN else "NOT met")]


def plot(rows: list[Row], path: Path) -> None:
    plt = machine.pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(rows) + 2) + 3, 4.5))
    models = list(dict.fromkeys(r.model for r in rows))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(rows):
        ax.bar(i, r.ratio(), color=colors[models.index(r.model) % len(colors)],
               label=r.model if r is next(x for x in rows if x.model == r.model) else None)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(TARGET_EACH, color="red", linestyle="--", linewidth=0.8, label=f"target each {TARGET_EACH}")
    ax.axhline(TARGET_GEOMEAN, color="red", linestyle=":", linewidth=0.8, label=f"target geomean {TARGET_GEOMEAN}")
    ax.set_xticks(range(len(rows)), [_label(r) for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("native / onnxruntime latency")
    ax.set_title("CNNs: native / onnxruntime latency (< 1: native faster)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, not over them
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def _size(text: str) -> tuple:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is HxW (e.g. 224x224), got {text!r}") from None
    return h, w


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 thread, batch 1, each model's first size")
    parser.add_argument("--models", nargs="+", default=[s.name for s in SPECS if s.default],
                        choices=[s.name for s in SPECS])
    parser.add_argument("--threads", type=int, nargs="+", default=None, help="default 1 2 (--quick: 1)")
    parser.add_argument("--batches", type=int, nargs="+", default=None, help="default 1 4 (--quick: 1)")
    parser.add_argument("--sizes", type=_size, nargs="+", default=None,
                        help="HxW for every model (default: each model's own)")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved samples per tool and shape")
    parser.add_argument("--sample-ms", type=float, default=200.0, help="one sample lasts about this long")
    parser.add_argument("--settle-ms", type=float, default=100.0,
                        help="pause before each sample, so that the idle thread pool of the tool sampled before it "
                             "no longer spins on a core this one's threads need")
    parser.add_argument("--no-nchwc-off", action="store_true",
                        help=f"leave out the columns {NCHWC_ON!r} and {NCHWC_OFF!r}")
    parser.add_argument("--native-variant", nargs="+", action="append", default=[], metavar="LABEL SETTING",
                        help="one more native column: LABEL then env:NAME=VALUE or session:NAME=VALUE settings")
    parser.add_argument("--out", type=Path, default=RESULTS / "cnn.md")
    parser.add_argument("--worker", choices=("native", PEER), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.threads = args.threads or ([1] if args.quick else [1, 2])
    args.batches = args.batches or ([1] if args.quick else [1, 4])
    args.variants = {NATIVE: Variant()}
    switch = nchwc_switch()
    if switch and not args.no_nchwc_off and not args.worker:
        args.variants[NCHWC_ON] = Variant(env={switch: "1"})
        args.variants[NCHWC_OFF] = Variant(env={switch: "0"})
    try:
        args.variants.update(parse_variant(words) for words in args.native_variant)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker, args.threads[0], args.workdir)
        return 0
    import onnxruntime as ort

    command = "python bench/cnn.py " + " ".join(argv if argv is not None else sys.argv[1:])
    load_before = os.getloadavg()
    rows: list[Row] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="shapeshift-cnn-") as workdir:
        for spec, threads, shapes in configurations(args):
            try:
                path = model_path(spec, Path(workdir))
            except RuntimeError as exc:  # degenerate random weights: nothing worth timing
                print(f"failed: {exc}")
                skipped.append(str(exc))
                continue
            if path is None:
                reason = f"{spec.name}: {MODELS_DIR} has no {spec.name}.onnx (../shared/models is absent)"
                print("skipped:", reason)
                skipped.append(reason)
                continue
            if not shapes:
                skipped.append(f"{spec.name} at {threads} thread(s): no batch asked for applies ({spec.note})")
                continue
            try:
                rows += measure(spec, path, threads, shapes, args, workdir, args.variants)
            except RuntimeError as exc:
                print(f"failed: {spec.name} at {threads} thread(s): {exc}")
                skipped.append(f"{spec.name} at {threads} thread(s) failed: {exc}")
    load_after = os.getloadavg()
    peak = machine.peak_gflops()
    notes = [f"- {SPEC[m].name}: {SPEC[m].note}" for m in dict.fromkeys(r.model for r in rows) if SPEC[m].note]
    not_measured = [] if NCHWC_OFF in args.variants else [
        "- native with the NCHWc layout turned off: left out (`--no-nchwc-off`)." if nchwc_switch() else
        "- native with the NCHWc layout turned off: this tree has no switch for it (no "
        "shapeshift/codegen/lower/layout_assign.py)."]
    report = "\n".join([
        "# CNNs end to end: shapeshift native vs onnxruntime (issue 28)", "",
        f"`{command}`", "",
        machine.describe(), "",
        f"Python {platform.python_version()}, onnxruntime {ort.__version__}. Threads {args.threads}, batches "
        f"{args.batches}. Each tool in its own worker process (native: num_threads; onnxruntime: "
        f"intra_op_num_threads, default graph optimizations); per shape, {args.repeats} samples of each of about "
        f"{args.sample_ms:g} ms (at least one run), interleaved, the order rotated each time; latency is the median "
        f"sample of whole session.run calls. Ratio < 1: native faster. GFLOP: the Conv/Gemm/MatMul work at the shape "
        f"(blank where shape inference cannot resolve it). max abs diff: native's largest difference from "
        f"onnxruntime's outputs (in brackets, over onnxruntime's largest magnitude). Load average (1, 5, 15 min) "
        f"before {', '.join(f'{v:.2f}' for v in load_before)}, after {', '.join(f'{v:.2f}' for v in load_after)}.",
        "", table(rows, peak), "",
        *by_state(rows),
        "Issue 28's first Must-show line (default schedules):", "", *verdict(rows), "",
        "Not measured:", "", f"- {NOT_MEASURED}", *not_measured, *[f"- {s}" for s in skipped], "",
        *(["Notes:", "", *notes, ""] if notes else [])])
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    if rows:
        plot(rows, args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
