"""The models the fuzzer mutates, each with a feed it runs on.

Small models built here with onnx.helper, each exercising a family of rules: a conv
net (Conv, BatchNormalization, pooling, Gemm), an attention block (MatMul, Softmax,
LayerNormalization, a Reshape computed from Shape), control flow (If and Loop with
bodies reading outer values), and indexing (Gather, Slice, Pad, TopK, Scatter, CumSum,
Expand, Tile, ConstantOfShape, Range, NonZero). And, where ../shared/models is present,
some of the real models of tests/shared_models.py, with their feeds.

A seed is a name, a ModelProto and a function from a numpy Generator to a feed, so that a
mutant's feed is reproduced from its seed too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
#: Real models small enough to build natively in a few seconds per mutant.
SHARED_SEEDS = ("distilbert.dynamo.onnx", "silero_vad.onnx", "yolov8n_nudenet.320n.onnx")
SHARED_MODELS = Path(__file__).resolve().parents[2].parent / "shared" / "models"


@dataclass(frozen=True)
class Seed:
    name: str
    model: onnx.ModelProto
    feed: Callable[[np.random.Generator], dict[str, np.ndarray]]


def _weight(rng: np.random.Generator, name: str, shape, scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _model(nodes, name, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="shapeshift-fuzz")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def conv_net() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    mk = helper.make_node
    nodes = [
        mk("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv1"),
        mk("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["n1"], epsilon=1e-5, name="bn1"),
        mk("Relu", ["n1"], ["r1"], name="relu1"),
        mk("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        mk("Conv", ["p1", "w2"], ["c2"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], group=1,
           dilations=[1, 1], name="conv2"),
        mk("AveragePool", ["c2"], ["p2"], kernel_shape=[2, 2], pads=[0, 0, 1, 1], name="pool2"),
        mk("GlobalAveragePool", ["p2"], ["g"], name="gap"),
        mk("Flatten", ["g"], ["f"], axis=1, name="flatten"),
        mk("Gemm", ["f", "wf", "bf"], ["logits"], transB=1, name="fc"),
        mk("Softmax", ["logits"], ["probs"], axis=1, name="softmax"),
    ]
    inits = [_weight(rng, "w1", (8, 3, 3, 3)), _weight(rng, "b1", (8,)), _weight(rng, "bn_s", (8,)),
             _weight(rng, "bn_b", (8,)), _weight(rng, "bn_m", (8,)),
             numpy_helper.from_array(np.abs(rng.standard_normal(8)).astype(np.float32) + 0.5, "bn_v"),
             _weight(rng, "w2", (16, 8, 3, 3)), _weight(rng, "wf", (10, 16)), _weight(rng, "bf", (10,))]
    return _model(nodes, "conv_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "h", "w"])],
                  [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])], inits)


def attention_block() -> onnx.ModelProto:
    """One self-attention layer and its MLP over x[batch, seq, 16], 2 heads of 8."""
    rng = np.random.default_rng(2)
    mk = helper.make_node
    nodes = [mk("Shape", ["x"], ["x_shape"], name="shape"),
             mk("Slice", ["x_shape", "zero1", "two1"], ["bt"], name="bt")]
    for part in "qkv":
        nodes += [
            mk("MatMul", ["x", f"w{part}"], [f"{part}_mm"], name=f"{part}_proj"),
            mk("Add", [f"{part}_mm", f"b{part}"], [f"{part}_lin"], name=f"{part}_bias"),
            mk("Concat", ["bt", "heads"], [f"{part}_shape"], axis=0, name=f"{part}_shape"),
            mk("Reshape", [f"{part}_lin", f"{part}_shape"], [f"{part}_r"], name=f"{part}_reshape"),
            mk("Transpose", [f"{part}_r"], [f"{part}_t"], perm=[0, 2, 1, 3] if part != "k" else [0, 2, 3, 1],
               name=f"{part}_transpose"),
        ]
    nodes += [
        mk("MatMul", ["q_t", "k_t"], ["scores"], name="qk"),
        mk("Mul", ["scores", "scale"], ["scaled"], name="scale"),
        mk("Softmax", ["scaled"], ["attn"], axis=-1, name="softmax"),
        mk("MatMul", ["attn", "v_t"], ["ctx"], name="av"),
        mk("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3], name="ctx_transpose"),
        mk("Concat", ["bt", "hidden"], ["out_shape"], axis=0, name="out_shape"),
        mk("Reshape", ["ctx_t", "out_shape"], ["ctx_r"], name="ctx_reshape"),
        mk("Add", ["x", "ctx_r"], ["res1"], name="residual1"),
        mk("LayerNormalization", ["res1", "ln_s", "ln_b"], ["ln1"], axis=-1, epsilon=1e-5, name="ln1"),
        mk("MatMul", ["ln1", "w_in"], ["h1"], name="ffn_in"),
        mk("Add", ["h1", "b_in"], ["h2"], name="ffn_in_bias"),
        mk("Div", ["h2", "sqrt2"], ["h3"], name="gelu_div"),
        mk("Erf", ["h3"], ["h4"], name="gelu_erf"),
        mk("Add", ["h4", "one"], ["h5"], name="gelu_add"),
        mk("Mul", ["h2", "h5"], ["h6"], name="gelu_mul"),
        mk("Mul", ["h6", "half"], ["h7"], name="gelu_half"),
        mk("MatMul", ["h7", "w_out"], ["h8"], name="ffn_out"),
        mk("Add", ["ln1", "h8"], ["res2"], name="residual2"),
        mk("ReduceMean", ["res2"], ["pooled"], axes=[-1], keepdims=0, name="pool"),
    ]
    inits = [_const("zero1", np.array([0], np.int64)), _const("two1", np.array([2], np.int64)),
             _const("heads", np.array([2, 8], np.int64)), _const("hidden", np.array([16], np.int64)),
             _const("scale", np.array(8 ** -0.5, np.float32)), _weight(rng, "ln_s", (16,)), _weight(rng, "ln_b", (16,)),
             _weight(rng, "w_in", (16, 32)), _weight(rng, "b_in", (32,)), _weight(rng, "w_out", (32, 16)),
             _const("sqrt2", np.array(2 ** 0.5, np.float32)), _const("one", np.array(1.0, np.float32)),
             _const("half", np.array(0.5, np.float32))]
    for part in "qkv":
        inits += [_weight(rng, f"w{part}", (16, 16)), _weight(rng, f"b{part}", (16,))]
    return _model(nodes, "attention_block",
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
                  [helper.make_tensor_value_info("res2", TensorProto.FLOAT, ["batch", "seq", 16]),
                   helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", "seq"])], inits)


def control_flow() -> onnx.ModelProto:
    """An If choosing on the data and a Loop carrying a state with a scan output, both
    with bodies that read outer values."""
    mk = helper.make_node
    f = TensorProto.FLOAT
    then_body = helper.make_graph(
        [mk("Mul", ["x", "two"], ["then_out"], name="then_mul")], "then_body", [],
        [helper.make_tensor_value_info("then_out", f, ["n", 4])])
    else_body = helper.make_graph(
        [mk("Sub", ["x", "one"], ["else_out"], name="else_sub"),
         mk("Relu", ["else_out"], ["else_relu"], name="else_relu")], "else_body", [],
        [helper.make_tensor_value_info("else_relu", f, ["n", 4])])
    loop_body = helper.make_graph(
        [mk("Add", ["state_in", "chosen"], ["state_sum"], name="body_add"),
         mk("Tanh", ["state_sum"], ["state_out"], name="body_tanh"),
         mk("ReduceSum", ["state_out"], ["row_sum"], keepdims=0, name="body_sum"),
         mk("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "loop_body",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("state_in", f, ["n", 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("state_out", f, ["n", 4]),
         helper.make_tensor_value_info("row_sum", f, [])])
    nodes = [
        mk("ReduceSum", ["x"], ["total"], keepdims=0, name="total"),
        mk("Greater", ["total", "zero"], ["positive"], name="positive"),
        mk("If", ["positive"], ["chosen"], then_branch=then_body, else_branch=else_body, name="if"),
        mk("Loop", ["trips", "true", "x"], ["final", "sums"], body=loop_body, name="loop"),
        mk("Concat", ["final", "chosen"], ["both"], axis=0, name="concat"),
    ]
    inits = [_const("two", np.array(2.0, np.float32)), _const("one", np.array(1.0, np.float32)),
             _const("zero", np.array(0.0, np.float32)), _const("trips", np.array(3, np.int64)),
             _const("true", np.array(True))]
    return _model(nodes, "control_flow", [helper.make_tensor_value_info("x", f, ["n", 4])],
                  [helper.make_tensor_value_info("both", f, ["m", 4]), helper.make_tensor_value_info("sums", f, [3])],
                  inits)


def indexing() -> onnx.ModelProto:
    """Ops whose kernels index by data or by parameters: x[n, 8] float, idx[k] int64."""
    mk = helper.make_node
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [
        mk("Gather", ["x", "idx"], ["gathered"], axis=0, name="gather"),
        mk("Slice", ["x", "starts", "ends", "axes", "steps"], ["sliced"], name="slice"),
        mk("Pad", ["sliced", "pads", "pad_value"], ["padded"], mode="constant", name="pad"),
        mk("TopK", ["x", "k"], ["top_values", "top_indices"], axis=1, largest=1, sorted=1, name="topk"),
        mk("GatherElements", ["x", "top_indices"], ["top_again"], axis=1, name="gather_elements"),
        mk("ScatterElements", ["x", "top_indices", "top_values"], ["scattered"], axis=1, name="scatter"),
        mk("CumSum", ["scattered", "axis1"], ["cumsum"], name="cumsum"),
        mk("Shape", ["x"], ["x_shape"], name="shape"),
        mk("ConstantOfShape", ["x_shape"], ["zeros"], value=numpy_helper.from_array(np.array([0.5], np.float32)),
           name="constant_of_shape"),
        mk("Add", ["cumsum", "zeros"], ["summed"], name="add"),
        mk("Tile", ["gathered", "reps"], ["tiled"], name="tile"),
        mk("Expand", ["bias_row", "x_shape"], ["expanded"], name="expand"),
        mk("Mul", ["summed", "expanded"], ["product"], name="mul"),
        mk("Greater", ["x", "zero"], ["mask"], name="greater"),
        mk("NonZero", ["mask"], ["nonzero"], name="nonzero"),
        mk("Range", ["zero_i", "three_i", "one_i"], ["ramp"], name="range"),
        mk("Transpose", ["padded"], ["padded_t"], perm=[1, 0], name="transpose"),
    ]
    inits = [_const("starts", np.array([1, 0], np.int64)), _const("ends", np.array([100, 8], np.int64)),
             _const("axes", np.array([0, 1], np.int64)), _const("steps", np.array([1, 2], np.int64)),
             _const("pads", np.array([0, 1, 2, 0], np.int64)), _const("pad_value", np.array(0.25, np.float32)),
             _const("k", np.array([3], np.int64)), _const("axis1", np.array(1, np.int64)),
             _const("reps", np.array([1, 2], np.int64)),
             _const("bias_row", np.linspace(-1, 1, 8, dtype=np.float32)), _const("zero", np.array(0.0, np.float32)),
             _const("zero_i", np.array(0, np.int64)), _const("one_i", np.array(1, np.int64)),
             _const("three_i", np.array(3, np.int64))]
    outputs = [helper.make_tensor_value_info(name, dtype, shape) for name, dtype, shape in
               (("product", f, ["n", 8]), ("tiled", f, ["k", 16]), ("top_again", f, ["n", 3]),
                ("padded_t", f, [5, "n_padded"]), ("nonzero", i64, [2, "nonzero_count"]), ("ramp", i64, [3]))]
    return _model(nodes, "indexing", [helper.make_tensor_value_info("x", f, ["n", 8]),
                                      helper.make_tensor_value_info("idx", i64, ["k"])], outputs, inits)


def _conv_feed(rng):
    return {"x": rng.standard_normal((2, 3, 12, 10)).astype(np.float32)}


def _attention_feed(rng):
    return {"x": rng.standard_normal((2, 5, 16)).astype(np.float32)}


def _control_feed(rng):
    return {"x": rng.standard_normal((3, 4)).astype(np.float32)}


def _indexing_feed(rng):
    return {"x": rng.standard_normal((5, 8)).astype(np.float32), "idx": rng.integers(-5, 5, (4,)).astype(np.int64)}


def _shared_feed(name: str, index: int):
    """The feed tests/shared_models.py gives the model (the fuzz workers run with the
    repository on their path)."""
    def feed(rng: np.random.Generator) -> dict[str, np.ndarray]:
        from tests.shared_models import feeds

        return feeds(name, index, seed=int(rng.integers(1000)))
    return feed


@functools.lru_cache(maxsize=None)
def seeds(shared: bool = True) -> tuple[Seed, ...]:
    """Every seed, the built ones first; the shared models only where present (``shared``)."""
    found = [Seed("conv_net", conv_net(), _conv_feed), Seed("attention_block", attention_block(), _attention_feed),
             Seed("control_flow", control_flow(), _control_feed), Seed("indexing", indexing(), _indexing_feed)]
    if shared:
        for name in SHARED_SEEDS:
            path = SHARED_MODELS / name
            if path.exists():
                found.append(Seed(name, onnx.load(path), _shared_feed(name, 0)))
    return tuple(found)


def seed_named(name: str) -> Optional[Seed]:
    return next((s for s in seeds() if s.name == name), None)
