"""Time import + simplify + export: shapeshift's three strategies against onnx-simplifier.

    python bench/simplify.py [--runs 3] [--models NAME ...] [--layers 12 24 48]
                             [--built dynamo-encoder conv-bn]
                             [--tools incremental per-op fixpoint onnxsim] [--timeout 1800]
    python bench/simplify.py --large [--workdir DIR]

Models: every ``*.onnx`` in ../shared/models (skipped with a message when the
folder is missing), BERT-like encoders of 12, 24 and 48 layers built with
``shapeshift.examples.encoder.build_encoder`` (hidden 64, 2 heads: small files,
the node structure of the full-size model) and rewritten as the TorchScript
exporter writes them (``torchscript_style``: small constants as Constant nodes,
one per reader; weights of equal contents as Identity aliases of one), and two models built here for the
graph fusions (``--built``): a 2-layer encoder written the way PyTorch's dynamo
exporter writes one (separate Q, K, V MatMuls with bias Adds) and a
MobileNetV3-style conv net with a BatchNormalization after every Conv.  Only
the built models, quickly: ``--models --layers --runs 1``.

Each run happens in a fresh process (multiprocessing "spawn"), so the peak
memory of both tools is measured the same way: the process's peak resident
set during one timed run minus its resident set just before (Linux: VmHWM
reset through /proc/self/clear_refs; elsewhere ru_maxrss growth), C++
allocations included (onnx-simplifier's are invisible to tracemalloc).  Before the timed run each
process imports everything and warms the tool up on a 1-layer encoder.  The
time covers the tool reading the file (both take a path) through returning a
ModelProto.

Node counts, Shape ops and "dynamic ops" (ops whose parameter input — Reshape
shape, Slice starts, Unsqueeze axes, ... — is not an initializer or Constant)
are counted on the output ModelProto, subgraphs included; a table per model puts
shapeshift's counts (incremental) beside onnx-simplifier's, with the ops whose
counts differ.  Prints the tables and writes bench/results/simplify.md with
derived ratios.

``--large`` measures only ``shapeshift simplify`` (the command) on a model over
2 GB: the encoder with a 716,800-word embedding, written with external data
(2.26 GB, about 5 GB of disk with the output; deleted afterwards), in a fresh
process whose peak resident set os.wait4 reports; then onnxruntime loads the
output and compares it with the original at three input sizes.  Writes
bench/results/simplify_2gb.md.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

MODELS_DIR = ROOT.parent / "shared" / "models"
RESULTS = ROOT / "bench" / "results" / "simplify.md"
STRATEGIES = ("incremental", "per-op", "fixpoint")
TOOLS = STRATEGIES + ("onnxsim",)
ENCODER_LAYERS = (12, 24, 48)
ENCODER_SIZE = {"hidden": 64, "heads": 2}
BUILT_MODELS = ("dynamo-encoder", "conv-bn")
# Measurements run once whatever --runs says (known to be slow by design).
SINGLE_RUN = frozenset({("per-op", "encoder-48")})
# A measurement whose first run takes longer than this is not repeated.
LONG_RUN_S = 120.0
# Targets from issue 3.
TARGET_PER_OP_SPEEDUP = 20.0
TARGET_LINEARITY = 4.5

METHOD = (
    "Time: the tool given the file's path, through returning a ModelProto (each tool reads the file itself: "
    "onnx-simplifier with `onnx.load`, shapeshift by parsing a read-only mapping of it; shapeshift then "
    "imports, simplifies and exports), after a warm-up on a "
    "1-layer encoder file in the same process; min–max is the spread over the runs. "
    "Peak RSS: the process's peak resident set during the timed run minus its resident set just before it, "
    "so C++ allocations (onnx-simplifier, protobuf) count too; tracemalloc would not see them. Counts "
    "(before → after) include subgraphs; dynamic ops are ops whose parameter input (Reshape shape, Slice "
    "starts, Unsqueeze axes, Range bounds, ...) is not an initializer or Constant. onnx-simplifier runs with "
    "its defaults: it keeps dynamic dims, does not enter If/Loop bodies (`include_subgraph=False`) and fuses "
    "MatMul+Add into Gemm, which on 3-D activations adds Reshape(x, Concat(Shape ...)) pairs."
)
# Input positions that are op parameters ("dynamic" when not a constant).
DYNAMIC_OP_PARAMS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3),
    "Resize": (1, 2, 3), "Upsample": (1,), "TopK": (1,), "OneHot": (1,), "ConstantOfShape": (0,),
    "Range": (0, 1, 2), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "CumSum": (1,),
}
REDUCE_PARAMS = (1,)


# --------------------------------------------------------------------------- counting
def _param_positions(node: onnx.NodeProto) -> tuple[int, ...]:
    if node.domain not in ("", "ai.onnx"):
        return ()
    if node.op_type.startswith("Reduce"):
        return REDUCE_PARAMS
    return DYNAMIC_OP_PARAMS.get(node.op_type, ())


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _is_dynamic(node: onnx.NodeProto, constants: set[str]) -> bool:
    inputs = node.input
    return any(i < len(inputs) and inputs[i] and inputs[i] not in constants for i in _param_positions(node))


def _graph_stats(graph: onnx.GraphProto, outer_constants: frozenset[str], stats: dict[str, int]) -> None:
    constants = set(outer_constants)
    constants.update(t.name for t in graph.initializer)
    constants.update(t.values.name for t in graph.sparse_initializer)
    for node in graph.node:
        stats["nodes"] += 1
        stats["ops"][node.op_type] = stats["ops"].get(node.op_type, 0) + 1
        stats["shape_ops"] += node.op_type == "Shape" and node.domain in ("", "ai.onnx")
        stats["dynamic_ops"] += _is_dynamic(node, constants)
        for sub in _subgraphs(node):
            _graph_stats(sub, frozenset(constants), stats)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            constants.update(node.output)


def model_stats(model: onnx.ModelProto) -> dict[str, int]:
    """Nodes, Shape ops, dynamic ops and nodes per op type ("ops") of a model, subgraphs included."""
    stats = {"nodes": 0, "shape_ops": 0, "dynamic_ops": 0, "ops": {}}
    _graph_stats(model.graph, frozenset(), stats)
    return stats


# --------------------------------------------------------------------------- one run, in a fresh process
def _simplify(tool: str, model) -> onnx.ModelProto:
    """``model``: a path (each tool reads it itself) or a ModelProto."""
    if tool == "onnxsim":
        import onnxsim

        simplified, check_ok = onnxsim.simplify(model)
        if not check_ok:
            raise RuntimeError("onnxsim reports its output check failed")
        return simplified
    import shapeshift

    return shapeshift.simplify(model, strategy=tool)


def _warm_up(tool: str) -> None:
    """One run on a 1-layer encoder read from a file, as the timed run reads its model."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "encoder-1.onnx")
        onnx.save(build_torchscript_encoder(1), path)
        _simplify(tool, path)


def _proc_status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _start_peak() -> tuple[bool, int]:
    """Start a peak-memory measurement: (VmHWM was reset, baseline in kB).

    On Linux the peak resident set (VmHWM) is reset to the current one, so the
    measurement is not hidden by import-time peaks; elsewhere ru_maxrss is used.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True, _proc_status_kb("VmRSS")
    except (OSError, KeyError):
        return False, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _peak_since(start: tuple[bool, int]) -> int:
    reset, baseline = start
    if reset:
        return _proc_status_kb("VmHWM") - baseline
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline


def _timed_run(tool: str, path: str, want_stats: bool) -> dict:
    _warm_up(tool)
    peak = _start_peak()
    start = time.perf_counter()
    simplified = _simplify(tool, path)
    seconds = time.perf_counter() - start
    result = {"seconds": seconds, "rss_kb": _peak_since(peak)}
    if want_stats:
        result["stats"] = model_stats(simplified)
    return result


@contextlib.contextmanager
def _output_to(log_path: str) -> Iterator[None]:
    """Send this process's stdout/stderr (C++ writes included) to a file."""
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log_path, "ab") as log:
        saved = [os.dup(1), os.dup(2)]
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def _describe(exc: BaseException) -> str:
    """One line: the exception and the innermost frame that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}{where}"


def _child(conn, tool: str, path: str, want_stats: bool, log_path: str) -> None:
    with _output_to(log_path):
        try:
            result = _timed_run(tool, path, want_stats)
        except BaseException as exc:  # reported in the table, not raised
            result = {"error": _describe(exc)}
    conn.send(result)
    conn.close()


def _log_tail(log_path: str, lines: int = 3) -> str:
    text = Path(log_path).read_text(encoding="utf-8", errors="replace").strip().splitlines()
    return " / ".join(text[-lines:])


def run_once(tool: str, path: Path, want_stats: bool, timeout: float) -> dict:
    """One timed run in a fresh spawned process: {seconds, rss_kb[, stats]} or {error}."""
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    with tempfile.NamedTemporaryFile(suffix=".log", delete=False) as log:
        log_path = log.name
    proc = ctx.Process(target=_child, args=(sender, tool, str(path), want_stats, log_path))
    proc.start()
    sender.close()
    try:
        if not receiver.poll(timeout):
            proc.kill()
            return {"error": f"timed out after {timeout:.0f} s"}
        return receiver.recv()
    except EOFError:
        proc.join()
        return {"error": f"process died (exit code {proc.exitcode}): {_log_tail(log_path)}"}
    finally:
        proc.join()
        receiver.close()
        os.unlink(log_path)


# --------------------------------------------------------------------------- measurements
@dataclass(frozen=True)
class Case:
    name: str
    path: Path
    group: str  # "shared" or "encoder"
    before: dict[str, int]


@dataclass
class Measurement:
    case: Case
    tool: str
    seconds: list[float] = field(default_factory=list)
    rss_kb: list[int] = field(default_factory=list)
    after: Optional[dict[str, int]] = None
    error: Optional[str] = None

    @property
    def time(self) -> Optional[float]:
        return statistics.median(self.seconds) if self.seconds else None

    @property
    def rss_mb(self) -> Optional[float]:
        return statistics.median(self.rss_kb) / 1024 if self.rss_kb else None


def runs_for(case: Case, tool: str, runs: int) -> int:
    return 1 if (tool, case.name) in SINGLE_RUN else runs


def _rotated(items: list, by: int) -> list:
    by %= max(1, len(items))
    return items[by:] + items[:by]


def measure_cases(cases: list[Case], tools: list[str], runs: int, timeout: float,
                  run=run_once) -> list[Measurement]:
    """Every tool's runs on every case of ``cases``, interleaved: round r runs each
    (case, tool) once, starting with a different one each round.  The machine's speed
    drifts by tens of percent within minutes, so a ratio between tools (per-op /
    incremental) or between cases (encoder-48 / encoder-12) must come from runs made
    side by side, not from one's runs and then the other's."""
    units = [(case, tool) for case in cases for tool in tools]
    measurements = {(case.name, tool): Measurement(case, tool) for case, tool in units}
    done: set[tuple[str, str]] = set()
    for index in range(max(runs_for(case, tool, runs) for case, tool in units)):
        for case, tool in _rotated(units, index):
            key = (case.name, tool)
            m = measurements[key]
            if key in done or index >= runs_for(case, tool, runs):
                continue
            result = run(tool, case.path, want_stats=index == 0, timeout=timeout)
            if "error" in result:
                m.error = result["error"]
                done.add(key)
                continue
            m.seconds.append(result["seconds"])
            m.rss_kb.append(result["rss_kb"])
            m.after = result.get("stats", m.after)
            if result["seconds"] > LONG_RUN_S:
                done.add(key)
    return [measurements[(case.name, tool)] for case, tool in units]


def _case(name: str, path: Path, group: str) -> Case:
    return Case(name, path, group, model_stats(onnx.load(str(path), load_external_data=False)))


def shared_cases(models_dir: Path, names: Optional[list[str]]) -> list[Case]:
    if not models_dir.is_dir():
        print(f"skipping shared models: {models_dir} does not exist", file=sys.stderr)
        return []
    paths = sorted(models_dir.glob("*.onnx"))
    return [_case(p.stem, p, "shared") for p in paths if names is None or p.stem in names or p.name in names]


# Initializers of at most this many elements are written as Constant nodes by torchscript_style.
SMALL_CONSTANT = 8


def torchscript_style(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` rewritten with two habits of PyTorch's TorchScript exporter (``dynamo=False``)
    that ``build_encoder`` lacks (../shared/models/bert.ts.onnx: 417 Constant and 120 Identity
    nodes of its 1,375):

    - every small constant (an Unsqueeze axis, a Gather index, a Concat part, a scalar: at
      most SMALL_CONSTANT elements) is a ``Constant`` node, one per reader, written just
      before it, not an initializer;
    - weights of equal contents (the zero biases, the LayerNorm ones and zeros of every
      layer) are one initializer; the others are ``Identity`` aliases of it, at the top of
      the graph (the exporter's deduplication of initializers).

    Returns a new model; ``model`` is not modified."""
    graph = model.graph
    small = {t.name: t for t in graph.initializer if np.prod(t.dims, dtype=np.int64) <= SMALL_CONSTANT}
    first_of: dict[tuple, str] = {}
    aliases: list[onnx.NodeProto] = []
    kept: list[onnx.TensorProto] = []
    for tensor in graph.initializer:
        if tensor.name in small:
            continue
        key = (tensor.data_type, tuple(tensor.dims), numpy_helper.to_array(tensor).tobytes())
        if key in first_of:
            aliases.append(helper.make_node("Identity", [first_of[key]], [tensor.name]))
        else:
            first_of[key] = tensor.name
            kept.append(tensor)
    nodes, count = list(aliases), 0
    for node in graph.node:
        node = onnx.NodeProto.FromString(node.SerializeToString())
        for index, name in enumerate(node.input):
            if name in small:
                count += 1
                out = f"{name}_constant_{count}"
                nodes.append(helper.make_node("Constant", [], [out], value=small[name]))
                node.input[index] = out
        nodes.append(node)
    styled = onnx.ModelProto.FromString(model.SerializeToString())
    del styled.graph.node[:]
    styled.graph.node.extend(nodes)
    del styled.graph.initializer[:]
    styled.graph.initializer.extend(kept)
    return styled


def build_torchscript_encoder(layers: int) -> onnx.ModelProto:
    """``build_encoder`` (BERT-like, ENCODER_SIZE) in ``torchscript_style``: Constant nodes, Identity aliases."""
    from shapeshift.examples.encoder import build_encoder

    return torchscript_style(build_encoder(layers=layers, **ENCODER_SIZE))


def encoder_cases(layers: list[int], workdir: Path) -> list[Case]:
    cases = []
    for n in layers:
        path = workdir / f"encoder-{n}.onnx"
        onnx.save(build_torchscript_encoder(n), str(path))
        cases.append(_case(f"encoder-{n}", path, "encoder"))
    return cases


class _Builder:
    """Nodes and initializers of a model under construction, with unique names."""

    def __init__(self, seed: int):
        self.nodes: list = []
        self.initializers: list = []
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, array, hint: str = "const") -> str:
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, *shape: int, hint: str = "w", scale: float = 0.1) -> str:
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32), hint)

    def op(self, op_type: str, inputs: list, hint: str = "", **attrs) -> str:
        out = self.name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def model(self, name: str, input_shape: list, output: str, output_shape: list, opset: int = 18) -> onnx.ModelProto:
        float32 = onnx.TensorProto.FLOAT
        graph = helper.make_graph(self.nodes, name, [helper.make_tensor_value_info("x", float32, input_shape)],
                                  [helper.make_tensor_value_info(output, float32, output_shape)], self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="bench")
        model.ir_version = 8
        return model


def build_dynamo_encoder(layers: int = 2, hidden: int = 64, heads: int = 2, seed: int = 0) -> onnx.ModelProto:
    """Encoder layers as PyTorch's dynamo exporter writes them (ViT, Whisper, BERT with
    dynamo=True): Q, K and V each a MatMul by a transposed weight and an Add of its bias,
    heads split by Reshape(x, Concat(Shape(x, start, end)..., [heads, dim])), the attention
    scale applied to q and to k apart (scaled_dot_product_attention's decomposition).
    Input x [batch, seq, hidden]."""
    b = _Builder(seed)
    head_dim = hidden // heads
    x = "x"

    def linear(v: str, n_in: int, n_out: int) -> str:
        return b.op("Add", [b.op("MatMul", [v, b.weight(n_in, n_out)]), b.weight(n_out, hint="bias")])

    def norm(v: str) -> str:
        return b.op("LayerNormalization", [v, b.const(np.ones(hidden, np.float32)),
                                           b.const(np.zeros(hidden, np.float32))], axis=-1, epsilon=1e-5)

    root_scale = b.const(np.array(head_dim ** -0.25, np.float32), "scale")
    for _ in range(layers):
        h = norm(x)
        batch = b.op("Shape", [h], start=0, end=1)
        seq = b.op("Shape", [h], start=1, end=2)
        target = b.op("Concat", [batch, seq, b.const(np.array([heads, head_dim], np.int64))], axis=0)
        q, k, v = [b.op("Transpose", [b.op("Reshape", [linear(h, hidden, hidden), target])], perm=[0, 2, 1, 3])
                   for _ in range(3)]
        q = b.op("Mul", [q, root_scale])
        k = b.op("Mul", [b.op("Transpose", [k], perm=[0, 1, 3, 2]), root_scale])
        probs = b.op("Softmax", [b.op("MatMul", [q, k])], axis=-1)
        context = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        merged = b.op("Reshape", [context, b.op("Concat", [batch, seq, b.const(np.array([hidden], np.int64))], axis=0)])
        x = b.op("Add", [x, linear(merged, hidden, hidden)])
        ffn = b.op("Relu", [linear(norm(x), hidden, 2 * hidden)])
        x = b.op("Add", [x, linear(ffn, 2 * hidden, hidden)])
    return b.model("dynamo_encoder", ["batch", "seq", hidden], x, ["batch", "seq", hidden])


def build_conv_bn_net(seed: int = 0) -> onnx.ModelProto:
    """A MobileNetV3-style net as exported from eval mode without fusing: a BatchNormalization
    after every Conv, depthwise convolutions, HardSwish, squeeze-excite, a zero Pad before
    each strided conv (TF-converted nets write one), residual Adds, and a GlobalAveragePool,
    Flatten, Gemm head. Input [batch, 3, h, w]."""
    b = _Builder(seed)

    def conv_bn(v: str, c_in: int, c_out: int, kernel: int = 1, stride: int = 1, group: int = 1,
                act: Optional[str] = "HardSwish") -> str:
        if stride > 1:  # explicit padding, then a conv with none
            v = b.op("Pad", [v, b.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], mode="constant")
            pads = [0, 0, 0, 0]
        else:
            pads = [kernel // 2] * 4
        y = b.op("Conv", [v, b.weight(c_out, c_in // group, kernel, kernel)], kernel_shape=[kernel, kernel],
                 strides=[stride, stride], pads=pads, group=group)
        y = b.op("BatchNormalization", [y, b.const(b.rng.uniform(0.5, 1.5, c_out).astype(np.float32)),
                                        b.weight(c_out, hint="bn_bias"), b.weight(c_out, hint="bn_mean"),
                                        b.const(b.rng.uniform(0.5, 1.5, c_out).astype(np.float32))], epsilon=1e-3)
        return y if act is None else b.op(act, [y])

    def squeeze_excite(v: str, c: int) -> str:
        s = b.op("GlobalAveragePool", [v])
        s = b.op("Relu", [b.op("Conv", [s, b.weight(c // 4, c, 1, 1), b.weight(c // 4, hint="se_bias")])])
        s = b.op("HardSigmoid", [b.op("Conv", [s, b.weight(c, c // 4, 1, 1), b.weight(c, hint="se_bias")])])
        return b.op("Mul", [v, s])

    x = conv_bn("x", 3, 16, 3, stride=2)
    channels = 16
    for expand, c_out, stride in [(32, 16, 1), (48, 24, 2), (72, 24, 1), (96, 40, 2), (120, 40, 1)]:
        y = conv_bn(x, channels, expand)
        y = conv_bn(y, expand, expand, 3, stride, group=expand)
        y = conv_bn(squeeze_excite(y, expand), expand, c_out, act=None)
        x = b.op("Add", [x, y]) if stride == 1 and c_out == channels else y
        channels = c_out
    x = conv_bn(x, channels, 96)
    pooled = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    logits = b.op("Gemm", [pooled, b.weight(10, 96), b.weight(10, hint="fc_bias")], transB=1)
    return b.model("conv_bn_net", ["batch", 3, "h", "w"], logits, ["batch", 10])


BUILDERS = {"dynamo-encoder": build_dynamo_encoder, "conv-bn": build_conv_bn_net}


def built_cases(names: list[str], workdir: Path) -> list[Case]:
    cases = []
    for name in names:
        path = workdir / f"{name}.onnx"
        onnx.save(BUILDERS[name](), str(path))
        cases.append(_case(name, path, "built"))
    return cases


def shapeshift_available() -> bool:
    try:
        import shapeshift
    except ImportError:
        return False
    return callable(getattr(shapeshift, "simplify", None))


# --------------------------------------------------------------------------- report
def _fmt_time(seconds: Optional[float]) -> str:
    if seconds is None:
        return "—"
    return f"{seconds:.3f}" if seconds < 10 else f"{seconds:.1f}"


def _arrow(before: int, after: Optional[dict[str, int]], key: str) -> str:
    return f"{before} → {after[key]}" if after else f"{before} → ?"


def _failed_row(m: Measurement) -> str:
    b = m.case.before
    status = (m.error or "not available")[:300].replace("|", "\\|")
    return (f"| {m.case.name} | {m.tool} | — | — | — | — | {b['nodes']} → — | {b['shape_ops']} → — | "
            f"{b['dynamic_ops']} → — | {status} |")


def _row(m: Measurement) -> str:
    if m.error or not m.seconds:
        return _failed_row(m)
    b = m.case.before
    spread = f"{_fmt_time(min(m.seconds))}–{_fmt_time(max(m.seconds))}"
    return (f"| {m.case.name} | {m.tool} | {_fmt_time(m.time)} | {spread} | {len(m.seconds)} | {m.rss_mb:.1f} | "
            f"{_arrow(b['nodes'], m.after, 'nodes')} | {_arrow(b['shape_ops'], m.after, 'shape_ops')} | "
            f"{_arrow(b['dynamic_ops'], m.after, 'dynamic_ops')} | |")


TABLE_HEADER = ("| model | tool | time s (median) | min–max | runs | peak RSS MB | nodes | Shape ops | dynamic ops "
                "| note |")


def results_table(measurements: list[Measurement]) -> list[str]:
    return [TABLE_HEADER, "|---|---|---|---|---|---|---|---|---|---|"] + [_row(m) for m in measurements]


def _op_differences(ours: dict[str, int], theirs: dict[str, int]) -> str:
    ops = sorted(op for op in set(ours) | set(theirs) if ours.get(op, 0) != theirs.get(op, 0))
    return ", ".join(f"{op} {ours.get(op, 0)}/{theirs.get(op, 0)}" for op in ops) or "same"


def against_onnxsim_lines(measurements: list[Measurement], cases: list[Case]) -> list[str]:
    """Per model: shapeshift's (incremental) node and Shape-op counts beside onnx-simplifier's,
    and the ops whose counts differ (ours/theirs), subgraphs included in both."""
    after = {(m.case.name, m.tool): m.after for m in measurements if m.after}
    lines = ["| model | nodes: shapeshift | nodes: onnxsim | Shape ops: shapeshift | Shape ops: onnxsim "
             "| no more of either? | ops that differ (shapeshift/onnxsim) |", "|---|---|---|---|---|---|---|"]
    for case in cases:
        ours, theirs = after.get((case.name, "incremental")), after.get((case.name, "onnxsim"))
        if ours is None or theirs is None:
            lines.append(f"| {case.name} | {ours['nodes'] if ours else '—'} | {theirs['nodes'] if theirs else '—'} "
                         f"| {ours['shape_ops'] if ours else '—'} | {theirs['shape_ops'] if theirs else '—'} | — | — |")
            continue
        verdict = "yes" if ours["nodes"] <= theirs["nodes"] and ours["shape_ops"] <= theirs["shape_ops"] else "**no**"
        differences = _op_differences(ours.get("ops", {}), theirs.get("ops", {}))
        lines.append(f"| {case.name} | {ours['nodes']} | {theirs['nodes']} | {ours['shape_ops']} | "
                     f"{theirs['shape_ops']} | {verdict} | {differences} |")
    return lines


def _lookup(measurements: list[Measurement]) -> dict[tuple[str, str], float]:
    return {(m.case.name, m.tool): m.time for m in measurements if m.time is not None}


def _ratio(num: Optional[float], den: Optional[float]) -> str:
    return f"{num / den:.2f}" if num is not None and den else "—"


def speedup_lines(measurements: list[Measurement], cases: list[Case]) -> list[str]:
    t = _lookup(measurements)
    lines = ["| model | onnxsim time / incremental time | incremental faster? |", "|---|---|---|"]
    for case in cases:
        inc, sim = t.get((case.name, "incremental")), t.get((case.name, "onnxsim"))
        verdict = "—" if inc is None or sim is None else ("yes" if inc < sim else "**no**")
        lines.append(f"| {case.name} | {_ratio(sim, inc)} | {verdict} |")
    return lines


def scaling_lines(measurements: list[Measurement], tools: list[str]) -> list[str]:
    t = _lookup(measurements)
    sizes = [n for n in ENCODER_LAYERS if (f"encoder-{n}", "incremental") in t]
    lines = [f"per-op time / incremental time (target at 48 layers: >= {TARGET_PER_OP_SPEEDUP:g}):", "",
             "| layers | incremental s | per-op s | per-op / incremental |", "|---|---|---|---|"]
    for n in sizes:
        inc, per_op = t.get((f"encoder-{n}", "incremental")), t.get((f"encoder-{n}", "per-op"))
        lines.append(f"| {n} | {_fmt_time(inc)} | {_fmt_time(per_op)} | **{_ratio(per_op, inc)}** |")
    # The fastest run too: the work is deterministic, so interference from the machine only
    # adds time, and on a shared machine the median of a few runs moves by 10-20% from one
    # set of runs to the next (the ratio of two medians by more).
    fastest = {(m.case.name, m.tool): min(m.seconds) for m in measurements if m.seconds}
    lines += ["", f"Linearity, encoder-48 time / encoder-12 time (4.0 is linear; target for incremental "
              f"<= {TARGET_LINEARITY}), of the median runs and of the fastest runs:", "",
              "| tool | 24 / 12 median | 48 / 12 median | 24 / 12 fastest | 48 / 12 fastest |", "|---|---|---|---|---|"]
    for tool in tools:
        base, quick = t.get(("encoder-12", tool)), fastest.get(("encoder-12", tool))
        lines.append(f"| {tool} | {_ratio(t.get(('encoder-24', tool)), base)} | "
                     f"{_ratio(t.get(('encoder-48', tool)), base)} | "
                     f"{_ratio(fastest.get(('encoder-24', tool)), quick)} | "
                     f"{_ratio(fastest.get(('encoder-48', tool)), quick)} |")
    return lines


def _versions() -> str:
    parts = [f"Python {platform.python_version()}", f"onnx {onnx.__version__}"]
    for module in ("onnxsim", "onnxruntime"):
        try:
            parts.append(f"{module} {__import__(module).__version__}")
        except ImportError:
            parts.append(f"{module} not installed")
    return ", ".join(parts) + f"; {platform.machine()}, {os.cpu_count()} CPUs ({cpu_name()})"


def report(measurements: list[Measurement], cases: list[Case], tools: list[str], runs: int,
           notes: list[str]) -> str:
    shared = [m for m in measurements if m.case.group == "shared"]
    encoders = [m for m in measurements if m.case.group == "encoder"]
    built = [m for m in measurements if m.case.group == "built"]
    lines = ["# Simplify benchmark", "", f"{_versions()}. Median of {runs} runs, each in a fresh process "
             f"(per-op on encoder-48 and any run over {LONG_RUN_S:g} s: 1 run); on each model the tools' runs "
             "alternate (round r starts with the r-th tool), so a drift of the machine's speed falls on all "
             "of them alike.", "", METHOD, ""]
    lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    if shared:
        lines += ["## Models in ../shared/models", ""] + results_table(shared) + [""]
    if encoders:
        lines += [f"## BERT-like encoders (build_encoder, hidden {ENCODER_SIZE['hidden']}, "
                  f"{ENCODER_SIZE['heads']} heads)", ""] + results_table(encoders) + [""]
    if built:
        lines += ["## Built models (the fusion patterns: Q/K/V MatMuls with biases, Conv + BatchNormalization)", ""]
        lines += results_table(built) + [""]
    lines += ["## Nodes and Shape ops against onnx-simplifier", ""] + against_onnxsim_lines(measurements, cases) + [""]
    lines += ["## Ratios", "", "Incremental against onnx-simplifier (> 1: incremental is faster):", ""]
    lines += speedup_lines(measurements, cases) + [""] + scaling_lines(measurements, tools)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- a model over 2 GB
LARGE_RESULTS = ROOT / "bench" / "results" / "simplify_2gb.md"
# A BERT-like encoder (2 TorchScript-style layers of hidden 768) whose word embedding has a
# vocabulary large enough for the model to pass protobuf's 2 GiB: 716,800 x 768 floats = 2.2 GB.
LARGE_VOCAB, LARGE_HIDDEN, LARGE_LAYERS, LARGE_HEADS = 716_800, 768, 2, 12
TARGET_PEAK_OVER_SIZE = 1.5
_CLI = "import sys; from shapeshift.cli.main import main; sys.exit(main())"


def build_large_vocab_model(path: Path, vocab: int = LARGE_VOCAB, seed: int = 0) -> int:
    """Write the large-vocabulary encoder to ``path``, its word embedding in ``path``.data
    (external data, written in 64 MB chunks: never held whole in memory); returns the
    bytes written (model file and data file)."""
    from shapeshift.examples.encoder import build_encoder

    model = torchscript_style(build_encoder(layers=LARGE_LAYERS, hidden=LARGE_HIDDEN, heads=LARGE_HEADS, vocab=8))
    embedding = next(t for t in model.graph.initializer if t.name.startswith("word_embeddings"))
    data_name = f"{path.name}.data"
    rng = np.random.default_rng(seed)
    rows = max(1, (64 << 20) // (4 * LARGE_HIDDEN))
    with open(path.parent / data_name, "wb") as data:
        for start in range(0, vocab, rows):
            count = min(rows, vocab - start)
            data.write((rng.standard_normal((count, LARGE_HIDDEN), np.float32) * 0.05).tobytes())
    embedding.ClearField("raw_data")
    del embedding.dims[:]
    embedding.dims.extend([vocab, LARGE_HIDDEN])
    embedding.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", data_name), ("offset", "0"), ("length", str(vocab * LARGE_HIDDEN * 4))):
        embedding.external_data.add(key=key, value=value)
    onnx.save(model, str(path))
    return path.stat().st_size + (path.parent / data_name).stat().st_size


def _stored_bytes(path: Path) -> int:
    """A model file and the external data files next to it that it names."""
    model = onnx.load(str(path), load_external_data=False)
    files = {onnx.external_data_helper.ExternalDataInfo(t).location
             for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    return path.stat().st_size + sum((path.parent / name).stat().st_size for name in files)


def peak_rss_of(command: list[str], timeout: float) -> dict:
    """Run ``command``; its wall time, exit code, output and peak resident set (os.wait4's
    ru_maxrss: this process alone, not the largest of all children so far)."""
    import subprocess

    start = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    kb = usage.ru_maxrss if sys.platform != "darwin" else usage.ru_maxrss // 1024
    return {"seconds": time.perf_counter() - start, "rc": proc.returncode, "output": text, "rss_kb": kb}


_ORT_CHECK = """
import sys, numpy as np, onnxruntime as ort
original, simplified, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(0)
feeds = [{"input_ids": rng.integers(0, vocab, (b, t)).astype(np.int64), "attention_mask": np.ones((b, t), np.int64)}
         for b, t in ((1, 5), (2, 17), (3, 64))]
feeds[1]["input_ids"][0, :2] = (0, vocab - 1)
want = []
session = ort.InferenceSession(original, providers=["CPUExecutionProvider"])
want = [session.run(None, f)[0] for f in feeds]
del session
session = ort.InferenceSession(simplified, providers=["CPUExecutionProvider"])
for f, w in zip(feeds, want):
    g = session.run(None, f)[0]
    assert g.shape == w.shape, (g.shape, w.shape)
    print(f"{list(f['input_ids'].shape)}: max abs diff {float(np.abs(g - w).max()):.2g}")
"""


def measure_large(workdir: Path, timeout: float) -> list[str]:
    """Build the model over 2 GB, run ``shapeshift simplify`` on it in a fresh process
    (peak RSS of that process), check the output loads in onnxruntime and computes the
    original's outputs at three input sizes; the report's lines."""
    source, target = workdir / "large-vocab.onnx", workdir / "large-vocab.simplified.onnx"
    started = time.perf_counter()
    size = build_large_vocab_model(source)
    print(f"built {source} ({size / 1e9:.2f} GB) in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    run = peak_rss_of([sys.executable, "-c", _CLI, "simplify", str(source), str(target)], timeout)
    lines = ["# `shapeshift simplify` on a model over 2 GB", "", f"{_versions()}.", "",
             f"Model: a BERT-like encoder ({LARGE_LAYERS} TorchScript-style layers, hidden {LARGE_HIDDEN}) with a "
             f"word embedding of {LARGE_VOCAB:,} x {LARGE_HIDDEN} floats, written with external data "
             f"(`{source.name}` + `{source.name}.data`): **{size / 1e9:.3f} GB** ({size / 2**30:.3f} GiB).", "",
             f"Command: `shapeshift simplify {source.name} {target.name}` in a fresh process; peak RSS from "
             "os.wait4 (the process's ru_maxrss, interpreter and imports included).", ""]
    if run["rc"] != 0:
        return lines + [f"**Failed** (exit {run['rc']}):", "", "```", run["output"].strip()[-3000:], "```"]
    out_size = _stored_bytes(target)
    peak = run["rss_kb"] * 1024
    ratio = peak / size
    verdict = "yes" if ratio < TARGET_PEAK_OVER_SIZE else "**no**"
    check = peak_rss_of([sys.executable, "-c", _ORT_CHECK, str(source), str(target), str(LARGE_VOCAB)], timeout)
    loads = "yes" if check["rc"] == 0 else f"**no** (exit {check['rc']})"
    lines += ["| input | output (external data) | wall s | peak RSS GB | peak / model size | "
              f"under {TARGET_PEAK_OVER_SIZE:g}x? | output loads and runs in onnxruntime, equal outputs? |",
              "|---|---|---|---|---|---|---|",
              f"| {size / 1e9:.3f} GB | {out_size / 1e9:.3f} GB | {run['seconds']:.1f} | {peak / 1e9:.2f} | "
              f"{ratio:.2f} | {verdict} | {loads} |", "", "shapeshift's table:", "", "```",
              run["output"].strip(), "```", "", "onnxruntime on the original and the simplified file (input_ids "
              "shapes; last hidden state compared):", "", "```", check["output"].strip()[-3000:], "```"]
    return lines


def cpu_name() -> str:
    """The CPU's model name, as lscpu or /proc/cpuinfo gives it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# --------------------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement (median reported)")
    parser.add_argument("--models", nargs="*",
                        help="names of models in the models folder (default: all; no names: none)")
    parser.add_argument("--models-dir", type=Path, default=MODELS_DIR)
    parser.add_argument("--layers", type=int, nargs="*", default=list(ENCODER_LAYERS),
                        help="encoder sizes to build (none: skip the encoders)")
    parser.add_argument("--built", nargs="*", choices=BUILT_MODELS, default=list(BUILT_MODELS),
                        help="models built here for the fusions (none: skip them)")
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run before it is killed")
    parser.add_argument("--output", type=Path, default=None,
                        help=f"default {RESULTS.relative_to(ROOT)} ({LARGE_RESULTS.relative_to(ROOT)} with --large)")
    parser.add_argument("--workdir", type=Path, default=None, help="where --large writes its files (default: TMPDIR)")
    parser.add_argument("--large", action="store_true",
                        help="only the model over 2 GB (needs about 5 GB of disk and 4 GB of memory; deleted after)")
    return parser.parse_args()


def case_groups(cases: list[Case]) -> list[list[Case]]:
    """The cases measured together: each shared model alone, the encoders all at once
    (their times are compared with each other for the linearity ratio)."""
    encoders = [case for case in cases if case.group == "encoder"]
    return [[case] for case in cases if case.group != "encoder"] + ([encoders] if encoders else [])


def run_all(cases: list[Case], tools: list[str], runs: int, timeout: float, available: bool) -> list[Measurement]:
    measured: dict[tuple[str, str], Measurement] = {}
    runnable = [tool for tool in tools if available or tool not in STRATEGIES]
    for group in case_groups(cases) if runnable else []:
        for m in measure_cases(group, runnable, runs, timeout):
            measured[(m.case.name, m.tool)] = m
            status = m.error or f"{_fmt_time(m.time)} s"
            print(f"{m.case.name:40s} {m.tool:12s} {status}", file=sys.stderr, flush=True)
    return [measured.get((case.name, tool)) or Measurement(case, tool) for case in cases for tool in tools]


def main() -> None:
    args = parse_args()
    if args.large:
        output = args.output or LARGE_RESULTS
        with tempfile.TemporaryDirectory(prefix="shapeshift-bench-large-", dir=args.workdir) as workdir:
            text = "\n".join(measure_large(Path(workdir), args.timeout)) + "\n"
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
        print(text)
        print(f"wrote {output}")
        return
    args.output = args.output or RESULTS
    available = shapeshift_available()
    notes = [] if available else ["`shapeshift.simplify` is not available in this checkout: only onnx-simplifier "
                                  "was measured."]
    with tempfile.TemporaryDirectory(prefix="shapeshift-bench-") as workdir:
        cases = (shared_cases(args.models_dir, args.models) + encoder_cases(args.layers, Path(workdir))
                 + built_cases(args.built, Path(workdir)))
        if not args.models_dir.is_dir():
            notes.append(f"{args.models_dir} does not exist: shared models skipped.")
        load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        measurements = run_all(cases, args.tools, args.runs, args.timeout, available)
        if load_before is not None:
            notes.append(f"Run {started} to {time.strftime('%H:%M UTC', time.gmtime())}; load average (1 min) "
                         f"{load_before[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on "
                         f"{os.cpu_count()} CPUs: the machine is shared, so compare tools within this run.")
    text = report(measurements, cases, args.tools, args.runs, notes)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(text)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
