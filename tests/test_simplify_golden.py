"""Golden tests of simplify: TVM's DynamicToStatic test cases rebuilt as ONNX graphs.

TVM's ``tests/python/relay/test_pass_dynamic_to_static.py`` checks that a
dynamic op whose parameter is computed from shapes (``reshape(x, shape_of(y))``)
turns into the static op with the expected output type.  Each case here is the
same graph written with ONNX ops (opset 17): parameter vectors are built from
``Shape`` of helper inputs whose shapes encode the numbers, or from Constant
nodes passed through Identity/Concat.  For every case the simplified graph must
hold the static op (its parameter input a constant initializer, or a node
parameter), no Shape op, and the expected output type; the exported model must
pass the ONNX checker and compute what onnxruntime computes on the original.

Then the cases again with symbolic dims (declared as dim_params, with ranges):
the ops end static with symbolic parameters (``node.params``) and symbolic
output shapes, checked numerically at three values of each symbol.  Last, the
PyTorch reshape idiom, and the three strategies giving the same exported graph.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from shapeshift.ir.graph import Graph, Node, StaticParam
from shapeshift.ir.types import TensorType
from shapeshift.passes.simplify import simplify_model
from shapeshift.symbolic import Expr, evaluate, parse_dim, to_string

F32, F64, I64, I32, I8, BOOL = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32,
                                TensorProto.INT8, TensorProto.BOOL)
OPSET = 17


# -- building ONNX graphs ------------------------------------------------------------------


class G:
    """A small ONNX graph writer: inputs, initializers, nodes, then a model."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.count = 0

    def _name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def input(self, name: str, dtype: int, shape: Sequence) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        return name

    def init(self, array, dtype=np.int64, hint: str = "c") -> str:
        name = self._name(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array, dtype=dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, outputs: int = 1, name: Optional[str] = None,
           names: Optional[Sequence[str]] = None, **attrs):
        """Add a node; its outputs are ``name`` (one output), ``names``, or fresh names."""
        if names is None:
            names = [name] if name and outputs == 1 else [self._name(op_type.lower()) for _ in range(outputs)]
        names = list(names)
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if len(names) == 1 else names

    def constant(self, array, dtype=np.int64) -> str:
        """A Constant node read through an Identity (as TVM's tests pass constants)."""
        value = numpy_helper.from_array(np.asarray(array, dtype=dtype), self._name("value"))
        return self.op("Identity", self.op("Constant", value=value))

    def shape(self, x: str, start: Optional[int] = None, end: Optional[int] = None) -> str:
        """Shape(x)[start:end], written as Shape then Slice (the pre-opset-15 idiom)."""
        shape = self.op("Shape", x)
        if start is None and end is None:
            return shape
        return self.op("Slice", shape, self.init([start or 0]), self.init([end if end is not None else 1 << 62]))

    def dim(self, x: str, axis: int) -> str:
        """Shape(x)[axis] as a [1] tensor, the PyTorch way: Unsqueeze(Gather(Shape(x), axis))."""
        scalar = self.op("Gather", self.op("Shape", x), self.init(axis), axis=0)
        return self.op("Unsqueeze", scalar, self.init([0]))

    def vector(self, values: Sequence[int], dtype: int = I64) -> str:
        """A 1-D int tensor holding ``values``: runs of non-negative numbers are the Shape of a
        helper input of that shape, negative ones Constant nodes through Identity; joined by Concat."""
        parts: list[str] = []
        run: list[int] = []

        def flush():
            if run:
                parts.append(self.op("Shape", self.input(self._name("enc"), F32, list(run))))
                run.clear()

        for v in values:
            if v >= 0:
                run.append(v)
            else:
                flush()
                parts.append(self.constant([v]))
        flush()
        out = parts[0] if len(parts) == 1 else self.op("Concat", *parts, axis=0)
        return out if dtype == I64 else self.op("Cast", out, to=dtype)

    def model(self, outputs: Sequence[tuple[str, int]], opset: int = OPSET,
              ranks: Optional[dict] = None) -> onnx.ModelProto:
        """The model; outputs are declared with their rank only (the checker wants a shape,
        and the dims are for simplify to find), the rank taken from ONNX's shape inference
        unless given."""
        def build(ranks):
            graph = helper.make_graph(
                self.nodes, "golden", self.inputs,
                [helper.make_tensor_value_info(name, dtype, None if ranks is None else [None] * ranks[name])
                 for name, dtype in outputs],
                self.initializers)
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
            model.ir_version = 8
            return model

        inferred = onnx.shape_inference.infer_shapes(build(None), data_prop=True)
        inferred_ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in inferred.graph.output
                          if vi.type.tensor_type.HasField("shape")}
        ranks = {**inferred_ranks, **(ranks or {})}
        missing = [name for name, _ in outputs if name not in ranks]
        assert not missing, f"ONNX cannot infer the rank of {missing}: pass ranks="
        model = build(ranks)
        onnx.checker.check_model(model, full_check=True)
        return model


# -- running and checking ------------------------------------------------------------------


def _dims(value_info: onnx.ValueInfoProto) -> list:
    return [d.dim_param if d.dim_param else d.dim_value for d in value_info.type.tensor_type.shape.dim]


def _random_feeds(model: onnx.ModelProto, binding: dict, rng: np.random.Generator,
                  int_ranges: Optional[dict] = None) -> dict:
    feeds = {}
    for vi in model.graph.input:
        shape = tuple(evaluate(parse_dim(d), binding) if isinstance(d, str) else d for d in _dims(vi))
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        if dtype == np.bool_:
            feeds[vi.name] = np.asarray(rng.random(shape) < 0.5)
        elif dtype.kind in "iu":
            lo, hi = (int_ranges or {}).get(vi.name, (-100, 100))
            feeds[vi.name] = rng.integers(lo, hi, shape).astype(dtype)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})


def ops(graph: Graph) -> list[str]:
    return [n.op_type for n in graph.walk_nodes()]


def proto_ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _expected_dim(graph: Graph, d):
    return d if isinstance(d, int) else parse_dim(d, graph.symbols.ranges)


def assert_output_shape(graph: Graph, expected: Sequence, index: int = 0) -> None:
    t = graph.outputs[index].type
    assert isinstance(t, TensorType) and t.shape is not None, f"output {index}: {t}"
    want = tuple(_expected_dim(graph, d) for d in expected)
    assert len(t.shape) == len(want) and all(a == b for a, b in zip(t.shape, want)), \
        f"output {index} is {t}, expected {want}\n{graph}"


def simplify_and_check(model: onnx.ModelProto, dynamic: Optional[dict] = None,
                       bindings: Sequence[dict] = ({},), int_ranges: Optional[dict] = None,
                       strategy: str = "incremental", fold_limit: Optional[int] = None,
                       seed: int = 0) -> tuple[onnx.ModelProto, Graph]:
    """Simplify; check no Shape op is left, the checker accepts the export, and the export
    computes what onnxruntime computes on the original (values and, for every output,
    the shape the simplified graph's type gives under the binding)."""
    # The cases share their ranges: each model gets those of its inputs' symbols (a range
    # for a symbol no input has is refused, as a user's typo would be).
    named = {d.dim_param for vi in model.graph.input for d in vi.type.tensor_type.shape.dim}
    dynamic = {name: r for name, r in (dynamic or {}).items() if name in named} or None
    exported, graph, _ = simplify_model(model, dynamic=dynamic, strategy=strategy, fold_limit=fold_limit,
                                        check=True)
    assert all(n.op_type != "Shape" for n in graph.walk_nodes()), str(graph)
    onnx.checker.check_model(exported, full_check=True)
    assert [vi.name for vi in exported.graph.output] == [vi.name for vi in model.graph.output]
    # The export keeps the inputs, and writes the outputs with the simplified graph's dims.
    assert [(vi.name, _dims(vi)) for vi in exported.graph.input] == [(vi.name, _dims(vi)) for vi in model.graph.input]
    for vi, value in zip(exported.graph.output, graph.outputs):
        assert _dims(vi) == [to_string(d) if isinstance(d, Expr) else d for d in value.type.shape], (vi, value.type)
    # A Shape op left in the export is the minimal computation of a symbolic parameter:
    # it reads a graph input directly.
    inputs = {vi.name for vi in model.graph.input}
    assert all(n.input[0] in inputs for n in exported.graph.node if n.op_type == "Shape"), \
        onnx.printer.to_text(exported.graph)
    rng = np.random.default_rng(seed)
    for binding in bindings:
        feeds = _random_feeds(model, binding, rng, int_ranges)
        want = _ort(model, feeds)
        got = _ort(exported, feeds)
        assert len(got) == len(want)
        for index, (a, b, out) in enumerate(zip(want, got, graph.outputs)):
            assert a.dtype == b.dtype and a.shape == b.shape, (binding, index, a.shape, b.shape)
            if a.dtype.kind == "f":
                np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
            else:
                np.testing.assert_array_equal(b, a)
            if isinstance(out.type, TensorType) and out.type.shape is not None:
                inferred = tuple(evaluate(d, binding) if isinstance(d, Expr) else d for d in out.type.shape)
                assert inferred == a.shape, (binding, index, out.type, a.shape)
    return exported, graph


def the_node(graph: Graph, op_type: str) -> Node:
    nodes = [n for n in graph.walk_nodes() if n.op_type == op_type]
    assert len(nodes) == 1, f"expected one {op_type}, got {ops(graph)}\n{graph}"
    return nodes[0]


def assert_static(graph: Graph, op_type: str, indices: Sequence[int], symbolic: Sequence[int] = ()) -> Node:
    """The one ``op_type`` node reads each parameter input in ``indices`` as a constant
    initializer or a node parameter; those in ``symbolic`` must be node parameters
    with at least one symbolic dim."""
    node = the_node(graph, op_type)
    for i in indices:
        if i in node.params:
            assert isinstance(node.params[i], StaticParam)
            continue
        assert i < len(node.inputs) and node.inputs[i] is not None and node.inputs[i].const is not None, \
            f"input {i} of {node.describe()} is not static\n{graph}"
        assert node.inputs[i].producer is None
    for i in symbolic:
        assert i in node.params, f"input {i} of {node.describe()} is not a node parameter\n{graph}"
        assert any(isinstance(d, Expr) for d in node.params[i].dims), node.params[i]
    return node


def param_values(node: Node, index: int) -> list:
    if index in node.params:
        return list(node.params[index].dims)
    return node.inputs[index].const.reshape(-1).tolist()


def output_is_input(graph: Graph, index: int = 0, input_index: int = 0) -> bool:
    value = graph.outputs[index]
    while value.producer is not None and value.producer.op_type == "Identity":
        value = value.producer.inputs[0]
    return value is graph.inputs[input_index]


# =========================================================================================
# The static cases (TVM's shapes)
# =========================================================================================


@pytest.mark.parametrize("shape, newshape", [((2, 3, 4), (8, 3)), ((4, 7), (2, 7, 2))])
def test_reshape(shape, newshape):
    g = G()
    g.op("Reshape", g.input("x", F32, shape), g.op("Shape", g.input("y", F32, newshape)), name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]))
    node = assert_static(graph, "Reshape", [1])
    assert param_values(node, 1) == list(newshape)
    assert_output_shape(graph, newshape)
    assert ops(graph) == ["Reshape"] and proto_ops(exported) == ["Reshape"]


@pytest.mark.parametrize("axes_shape, oshape", [((0,), (3, 4, 1)), ((3,), (1, 3, 4)), ((0, 3), (3, 4))])
def test_squeeze(axes_shape, oshape):
    g = G()
    g.op("Squeeze", g.input("x", F32, (1, 3, 4, 1)), g.op("Shape", g.input("y", F32, axes_shape)), name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)], ranks={"z": len(oshape)}))
    node = assert_static(graph, "Squeeze", [1])
    assert param_values(node, 1) == list(axes_shape)
    assert_output_shape(graph, oshape)
    assert proto_ops(exported) == ["Squeeze"]


@pytest.mark.parametrize("shape, newshape", [((2, 3, 4), (8, 3)), ((4, 7), (2, 7, 2))])
def test_double_reshape_is_the_input(shape, newshape):
    g = G()
    x = g.input("x", F32, shape)
    z = g.op("Reshape", x, g.op("Shape", g.input("y", F32, newshape)))
    g.op("Reshape", z, g.op("Shape", x), name="out")
    exported, graph = simplify_and_check(g.model([("out", F32)]))
    assert "Reshape" not in ops(graph) and output_is_input(graph), str(graph)
    assert set(proto_ops(exported)) <= {"Identity"}
    assert_output_shape(graph, shape)


@pytest.mark.parametrize("shape, newshape", [((2, 3, 4), (8, 3)), ((4, 7), (2, 7, 2))])
def test_quad_reshape_is_the_input(shape, newshape):
    g = G()
    x = g.input("x", F32, shape)
    z1 = g.op("Reshape", x, g.op("Shape", g.input("y", F32, newshape)))
    z2 = g.op("Reshape", z1, g.op("Shape", x))
    z3 = g.op("Reshape", z2, g.op("Shape", z1))
    g.op("Reshape", z3, g.op("Shape", z2), name="z4")
    exported, graph = simplify_and_check(g.model([("z4", F32)]))
    assert "Reshape" not in ops(graph) and output_is_input(graph), str(graph)
    assert set(proto_ops(exported)) <= {"Identity"}
    assert_output_shape(graph, shape)


@pytest.mark.parametrize("shape, reps, oshape", [((2, 3, 4), (2, 1, 5), (4, 3, 20)), ((4, 7), (4, 2), (16, 14))])
def test_tile(shape, reps, oshape):
    g = G()
    g.op("Tile", g.input("x", F32, shape), g.op("Shape", g.input("y", F32, reps)), name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]))
    node = assert_static(graph, "Tile", [1])
    assert param_values(node, 1) == list(reps)
    assert_output_shape(graph, oshape)
    assert proto_ops(exported) == ["Tile"]


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("k", [1, 5])
def test_topk(k, axis, largest):
    g = G()
    x = g.input("x", F32, (20, 100))
    kk = g.shape(g.input("y", F32, (3, k, 2)), 1, 2)  # k = Shape(y)[1:2]
    g.op("TopK", x, kk, names=["values", "indices"], axis=axis, largest=largest)
    exported, graph = simplify_and_check(g.model([("values", F32), ("indices", I64)]))
    node = assert_static(graph, "TopK", [1])
    assert param_values(node, 1) == [k]
    oshape = (k, 100) if axis == 0 else (20, k)
    assert_output_shape(graph, oshape, 0)
    assert_output_shape(graph, oshape, 1)
    assert proto_ops(exported) == ["TopK"]


def test_expand():
    g = G()
    g.op("Expand", g.input("x", F32, (3, 1)), g.op("Shape", g.input("y", F32, (3, 3))), name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]))
    node = assert_static(graph, "Expand", [1])
    assert param_values(node, 1) == [3, 3]
    assert_output_shape(graph, (3, 3))
    assert proto_ops(exported) == ["Expand"]


@pytest.mark.parametrize("fill", [0, 1])
@pytest.mark.parametrize("shape, dtype", [((1, 2, 3), I64), ((9, 8, 3, 4), F32)])
def test_constant_of_shape(shape, dtype, fill):
    """zeros/ones(shape_of(x)): the output is a constant, so by default it is folded away;
    with folding of big results off, ConstantOfShape stays, static."""
    value = numpy_helper.from_array(np.array([fill], dtype=helper.tensor_dtype_to_np_dtype(dtype)), "value")

    def build():
        g = G()
        g.op("ConstantOfShape", g.op("Shape", g.input("x", dtype, shape)), value=value, name="z")
        return g.model([("z", dtype)])

    exported, graph = simplify_and_check(build())
    assert "ConstantOfShape" not in ops(graph)
    assert set(proto_ops(exported)) <= {"Identity"}
    assert_output_shape(graph, shape)

    exported, graph = simplify_and_check(build(), fold_limit=0)
    node = assert_static(graph, "ConstantOfShape", [0])
    assert param_values(node, 0) == list(shape)
    assert_output_shape(graph, shape)
    assert proto_ops(exported) == ["ConstantOfShape"]


@pytest.mark.parametrize("shape, dtype", [((1, 2, 3, 4), I32), ((1, 2, 8, 10), F32)])
def test_full(shape, dtype):
    """full(fill_value, shape_of(y)): Expand of a scalar input to Shape(y)."""
    g = G()
    g.op("Expand", g.input("fill", dtype, ()), g.op("Shape", g.input("y", I64, shape)), name="z")
    exported, graph = simplify_and_check(g.model([("z", dtype)]))
    node = assert_static(graph, "Expand", [1])
    assert param_values(node, 1) == list(shape)
    assert_output_shape(graph, shape)
    assert proto_ops(exported) == ["Expand"]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_resize_computed_sizes(mode, layout):
    g = G()
    x = g.input("x", F32, (1, 4, 4, 4))
    target = g.op("Shape", g.input("y", F32, (8, 8)))
    if layout == "NCHW":
        sizes = g.op("Concat", g.shape(x, 0, 2), target, axis=0)
        oshape = (1, 4, 8, 8)
    else:
        sizes = g.op("Concat", g.shape(x, 0, 1), target, g.shape(x, 3, 4), axis=0)
        oshape = (1, 8, 8, 4)
    coord = "asymmetric" if mode == "nearest" else "align_corners"
    g.op("Resize", x, "", "", sizes, mode=mode, coordinate_transformation_mode=coord, name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]))
    node = assert_static(graph, "Resize", [3])
    assert param_values(node, 3) == list(oshape)
    assert_output_shape(graph, oshape)
    assert proto_ops(exported) == ["Resize"]


@pytest.mark.parametrize("indices_shape, depth, on, off, axis, dtype", [
    ((3,), 3, 1, 0, -1, I64),
    ((3,), 3, 1.0, 0.0, -1, F32),
    ((2, 2), 5, 2, -2, 0, I64),
    ((2, 2), 5, 0.5, -0.5, 1, F32),
    ((3, 2, 4, 5), 6, 1, 0, 1, I64),
    ((3, 2, 4, 5), 6, 1.0, 0.0, 0, F32),
])
def test_one_hot(indices_shape, depth, on, off, axis, dtype):
    g = G()
    indices = g.input("indices", I64, indices_shape)
    d = g.op("Gather", g.op("Shape", g.input("d", F32, (depth,))), g.init(0), axis=0)  # a scalar depth
    values = g.constant([off, on], helper.tensor_dtype_to_np_dtype(dtype))
    g.op("OneHot", indices, d, values, axis=axis, name="z")
    exported, graph = simplify_and_check(g.model([("z", dtype)]), int_ranges={"indices": (0, depth)})
    node = assert_static(graph, "OneHot", [1])
    assert param_values(node, 1) == [depth]
    oshape = list(indices_shape)
    oshape.insert(axis if axis >= 0 else len(oshape) + 1 + axis, depth)
    assert_output_shape(graph, oshape)
    assert proto_ops(exported) == ["OneHot"]


@pytest.mark.parametrize("scale, dtype, from_shape", [(2, I8, True), (4, I32, False), (2, F32, False)])
def test_upsample_scales(scale, dtype, from_shape):
    """nn.upsampling: Resize with scales (1, 1, s, s), nearest, asymmetric; the scales are
    Cast(Shape(s)) of a helper input or Constants through Identity/Concat."""
    g = G()
    x = g.input("x", dtype, (1, 16, 32, 32))
    if from_shape:
        # (Divided by 1: onnxruntime's own data propagation carries Cast(Shape) as int64 data
        # and then rejects it as Resize scales.)
        scales = g.op("Div", g.op("Cast", g.op("Shape", g.input("s", F32, (1, 1, scale, scale))), to=F32),
                      g.init(1.0, np.float32))
    else:
        scales = g.op("Concat", g.constant([1.0, 1.0], np.float32), g.constant([scale, scale], np.float32), axis=0)
    g.op("Resize", x, "", scales, mode="nearest", coordinate_transformation_mode="asymmetric",
         nearest_mode="floor", name="z")
    exported, graph = simplify_and_check(g.model([("z", dtype)]))
    node = assert_static(graph, "Resize", [2])
    assert param_values(node, 2) == [1, 1, scale, scale]
    assert_output_shape(graph, (1, 16, 32 * scale, 32 * scale))
    assert proto_ops(exported) == ["Resize"]


@pytest.mark.parametrize("shape, scales, dtype", [
    ((1, 1, 1, 1, 1), (2, 3, 4), I8),
    ((5, 7, 8, 10, 32), (3, 2, 2), I8),
    ((1, 4, 2, 5, 3), (5, 4, 3), I32),
])
def test_upsample3d(shape, scales, dtype):
    g = G()
    x = g.input("x", dtype, shape)
    s = g.op("Concat", g.constant([1.0, 1.0], np.float32),
             g.op("Cast", g.op("Shape", g.input("s", F32, scales)), to=F32), axis=0)
    g.op("Resize", x, "", s, mode="nearest", coordinate_transformation_mode="asymmetric",
         nearest_mode="floor", name="z")
    exported, graph = simplify_and_check(g.model([("z", dtype)]))
    node = assert_static(graph, "Resize", [2])
    assert param_values(node, 2) == [1, 1, *scales]
    assert_output_shape(graph, (*shape[:2], *(d * s for d, s in zip(shape[2:], scales))))
    assert proto_ops(exported) == ["Resize"]


@pytest.mark.parametrize("shape, oshape, dynamic", [
    ((1, 16, 32, 32), (1, 16, 64, 64), None),
    (("B", 16, "H", "W"), ("B", 16, "2*H", "2*W"), {"B": (1, 4), "H": (1, 32), "W": (1, 32)}),
])
def test_upsample_opset9(shape, oshape, dynamic):
    """The Upsample op itself (opset 9, scales as an input), scales through Identity/Concat."""
    g = G()
    x = g.input("x", F32, shape)
    scales = g.op("Concat", g.constant([1.0, 1.0], np.float32), g.constant([2.0, 2.0], np.float32), axis=0)
    g.op("Upsample", x, scales, mode="nearest", name="z")
    bindings = bindings_for(B=[1, 2, 3], H=[32, 1, 7], W=[32, 5, 2]) if dynamic else ({},)
    exported, graph = simplify_and_check(g.model([("z", F32)], opset=9), dynamic, bindings)
    node = assert_static(graph, "Upsample", [1])
    assert param_values(node, 1) == [1, 1, 2, 2]
    assert_output_shape(graph, oshape)
    assert proto_ops(exported) == ["Upsample"]


@pytest.mark.parametrize("shape, pad_width, pad_value, dtype, oshape", [
    ((4, 10, 7, 7), ((1, 1), (2, 2), (3, 3), (4, 4)), 2, I32, (6, 14, 13, 15)),
    ((2, 7), ((1, 4), (2, 2)), 4.0, F64, (7, 11)),
])
def test_pad(shape, pad_width, pad_value, dtype, oshape):
    g = G()
    x = g.input("x", dtype, shape)
    begins = g.op("Shape", g.input("pb", F32, [p[0] for p in pad_width]))
    ends = g.op("Shape", g.input("pe", F32, [p[1] for p in pad_width]))
    pads = g.op("Concat", begins, ends, axis=0)
    value = g.constant(pad_value, helper.tensor_dtype_to_np_dtype(dtype))
    g.op("Pad", x, pads, value, mode="constant", name="z")
    exported, graph = simplify_and_check(g.model([("z", dtype)]))
    node = assert_static(graph, "Pad", [1, 2])
    assert param_values(node, 1) == [p[0] for p in pad_width] + [p[1] for p in pad_width]
    assert_output_shape(graph, oshape)
    assert proto_ops(exported) == ["Pad"]


SLICE_CASES = [
    ((1, 3, 10, 10), [0, 0, 0, 0], [1, 3, 10, 10], [1, 1, 1, 1], (1, 3, 10, 10), I64),
    ((1, 224, 224, 3), [0, 20, 20, 0], [1, 140, 140, 3], [1, 1, 1, 1], (1, 120, 120, 3), I64),
    ((3, 4, 3), [1, 1, 0], [4, 4, 3], [2, 1, 1], (1, 3, 3), I32),
    ((3, 4, 3), [0, 0, 0], [4, -5, 4], [1, -1, 2], (3, 1, 2), I64),
    ((3, 4, 3), [1, 1, 0], [4, 4, 3], None, (2, 3, 3), I32),
    ((3, 4, 3), [1, 1, 0], [4, 1000, 3], None, (2, 3, 3), I64),
    ((3, 4, 3), [1, 1, 0], [4, 4, 4], None, (2, 3, 3), I64),
    ((3, 4, 3), [1, -1, 0], [4, -5, 3], [2, -1, 1], (1, 4, 3), I64),
    ((3, 4, 3), [1, -1, 0], [2, -3, 3], [1, -1, 1], (1, 2, 3), I64),
]


@pytest.mark.parametrize("shape, starts, ends, steps, oshape, dtype", SLICE_CASES)
def test_strided_slice(shape, starts, ends, steps, oshape, dtype):
    g = G()
    x = g.input("x", F32, shape)
    inputs = [x, g.vector(starts, dtype), g.vector(ends, dtype)]
    if steps is not None:
        inputs += [g.vector(list(range(len(shape))), dtype), g.vector(steps, dtype)]  # axes, steps
    g.op("Slice", *inputs, name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]))
    node = assert_static(graph, "Slice", range(1, len(inputs)))
    assert param_values(node, 1) == starts and param_values(node, 2) == ends
    if steps is not None:
        assert param_values(node, 4) == steps
    assert_output_shape(graph, oshape)
    assert proto_ops(exported) == ["Slice"]


@pytest.mark.parametrize("shape", [(1, 2, 3, 4), (1, 2, 8, 10)])
def test_dynamic_rank(shape):
    """ConstantOfShape(Slice(Shape(y), [0], Shape(Shape(y)))): the rank of the shape is itself
    computed; with folding of big results off the op stays, static."""
    value = numpy_helper.from_array(np.array([4], np.int32), "value")

    def build():
        g = G()
        s = g.op("Shape", g.input("y", I64, shape))
        sliced = g.op("Slice", s, g.init([0]), g.op("Shape", s))
        g.op("ConstantOfShape", sliced, value=value, name="z")
        return g.model([("z", I32)])

    exported, graph = simplify_and_check(build(), fold_limit=0)
    node = assert_static(graph, "ConstantOfShape", [0])
    assert param_values(node, 0) == list(shape)
    assert_output_shape(graph, shape)
    assert proto_ops(exported) == ["ConstantOfShape"]
    exported, graph = simplify_and_check(build())
    assert set(ops(graph)) <= {"Identity"} and set(proto_ops(exported)) <= {"Identity"}


def _if_branch(x: str, target: Sequence[int], name: str) -> onnx.GraphProto:
    const = helper.make_node("Constant", [], [f"{name}_shape"],
                             value=numpy_helper.from_array(np.array(target, np.int64), f"{name}_value"))
    reshape = helper.make_node("Reshape", [x, f"{name}_shape"], [f"{name}_out"])
    return helper.make_graph([const, reshape], name, [], [helper.make_tensor_value_info(f"{name}_out", I64, None)])


def _if_model(x_shape: Sequence, condition: str, g: Optional[G] = None) -> onnx.ModelProto:
    """If(cond, Reshape(x, [1, -1]), Reshape(x, [-1, 1])) with Constant targets in the branches."""
    g = g or G()
    x = g.input("x", I64, x_shape)
    g.op("If", condition, then_branch=_if_branch(x, [1, -1], "then"), else_branch=_if_branch(x, [-1, 1], "else"),
         name="z")
    return g.model([("z", I64)])


def test_if_with_constant_condition_is_inlined():
    g = G()
    cond = g.op("Constant", value=numpy_helper.from_array(np.array(True), "cond_value"))
    exported, graph = simplify_and_check(_if_model((2, 2), cond, g))
    assert "If" not in ops(graph) and "If" not in proto_ops(exported)
    node = assert_static(graph, "Reshape", [1])
    assert param_values(node, 1) == [1, -1]
    assert_output_shape(graph, (1, 4))
    assert proto_ops(exported) == ["Reshape"]


@pytest.mark.parametrize("x_shape, oshape, dynamic", [((2, 2), (1, 4), None),
                                                    (("B", 2), (1, "2*B"), {"B": (1, 8)})])
def test_if_of_different_ranks_then_static(x_shape, oshape, dynamic):
    """The branches differ in rank (rank 2 and rank 1), so the If's output has unknown rank
    until the If is inlined; then ConstantOfShape(Shape(if)) turns static."""
    g = G()
    x = g.input("x", I64, x_shape)
    cond = g.op("Constant", value=numpy_helper.from_array(np.array(True), "cond_value"))
    r = g.op("If", cond, then_branch=_if_branch(x, [1, -1], "then"), else_branch=_if_branch(x, [-1], "else"))
    value = numpy_helper.from_array(np.array([3], np.int64), "value")
    g.op("ConstantOfShape", g.op("Shape", r), value=value, name="z")
    exported, graph = simplify_and_check(g.model([("z", I64)], ranks={"z": 2}), dynamic,
                                         B3 if dynamic else ({},), fold_limit=0)
    assert "If" not in ops(graph)
    node = assert_static(graph, "ConstantOfShape", [0], symbolic=[0] if dynamic else [])
    assert param_values(node, 0) == [_expected_dim(graph, d) for d in oshape]
    assert_output_shape(graph, oshape)
    assert ops(graph) == ["ConstantOfShape"]


def test_dead_if_after_its_body_was_simplified():
    """An If found dead only after its body was simplified (the Shape in the branch folded,
    removed lazily): removing the If must skip the body nodes already removed. (It raised
    ValueError: list.remove(x): x not in list, in Rewriter.remove_node.)"""
    g = G()
    x = g.input("x", F32, (2, 3))
    a = g.op("Relu", x)
    then_branch = helper.make_graph(
        [helper.make_node("Shape", [a], ["sa"]), helper.make_node("Reshape", [a, "sa"], ["same"])],
        "then", [], [helper.make_tensor_value_info("same", F32, None)])
    else_branch = helper.make_graph([helper.make_node("Neg", [a], ["neg"])], "else", [],
                                    [helper.make_tensor_value_info("neg", F32, None)])
    g.op("Neg", g.op("If", g.input("c", BOOL, ()), then_branch=then_branch, else_branch=else_branch))
    g.op("Sigmoid", x, name="z")
    for strategy in ("incremental", "per-op", "fixpoint"):
        exported, graph = simplify_and_check(g.model([("z", F32)]), strategy=strategy)
        assert ops(graph) == ["Sigmoid"], (strategy, str(graph))


# =========================================================================================
# The same cases with symbolic dims: static ops with symbolic parameters
# =========================================================================================


def bindings_for(**values) -> list[dict]:
    """Three bindings: the i-th value of each symbol's list."""
    return [{name: vals[i] for name, vals in values.items()} for i in range(3)]


B3 = bindings_for(B=[1, 2, 5])


@pytest.mark.parametrize("shape, newshape, oshape, symbols", [
    (("B", 3, 4), ("B", 12), ("B", 12), dict(B=[1, 2, 5])),
    (("B", 3, 4), ("2*B", 6), ("2*B", 6), dict(B=[1, 2, 5])),
    ((4, "N"), (2, "N", 2), (2, "N", 2), dict(N=[1, 3, 7])),
    (("B", "T", 8), ("T", "B", 2, 4), ("T", "B", 2, 4), dict(B=[1, 2, 5], T=[3, 1, 4])),
])
def test_reshape_symbolic(shape, newshape, oshape, symbols):
    g = G()
    g.op("Reshape", g.input("x", F32, shape), g.op("Shape", g.input("y", F32, newshape)), name="z")
    dynamic = {name: (1, 16) for name in symbols}
    exported, graph = simplify_and_check(g.model([("z", F32)]), dynamic, bindings_for(**symbols))
    node = assert_static(graph, "Reshape", [], symbolic=[1])
    assert node.params[1].dims == tuple(_expected_dim(graph, d) for d in newshape)
    assert_output_shape(graph, oshape)
    assert ops(graph) == ["Reshape"]


@pytest.mark.parametrize("axes_shape, oshape", [((0,), ("N", "M", 1)), ((3,), (1, "N", "M")),
                                                ((0, 3), ("N", "M"))])
def test_squeeze_symbolic(axes_shape, oshape):
    """The axes are y's (static) dims; x's dims are symbolic."""
    g = G()
    g.op("Squeeze", g.input("x", F32, (1, "N", "M", 1)), g.op("Shape", g.input("y", F32, axes_shape)), name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)], ranks={"z": len(oshape)}), {"N": (1, 8), "M": (1, 8)},
                                         bindings_for(N=[1, 2, 5], M=[3, 1, 4]))
    node = assert_static(graph, "Squeeze", [1])
    assert param_values(node, 1) == list(axes_shape)
    assert_output_shape(graph, oshape)
    assert proto_ops(exported) == ["Squeeze"]


@pytest.mark.parametrize("shape, newshape, symbols", [
    (("B", 3, 4), ("B", 12), dict(B=[1, 2, 5])),
    ((4, "N"), (2, "N", 2), dict(N=[1, 3, 7])),
])
@pytest.mark.parametrize("depth", [2, 4])
def test_reshape_chain_symbolic_is_the_input(shape, newshape, symbols, depth):
    g = G()
    x = g.input("x", F32, shape)
    z1 = g.op("Reshape", x, g.op("Shape", g.input("y", F32, newshape)))
    z2 = g.op("Reshape", z1, g.op("Shape", x), name="out" if depth == 2 else None)
    if depth == 4:
        z3 = g.op("Reshape", z2, g.op("Shape", z1))
        g.op("Reshape", z3, g.op("Shape", z2), name="out")
    dynamic = {name: (1, 16) for name in symbols}
    exported, graph = simplify_and_check(g.model([("out", F32)]), dynamic, bindings_for(**symbols))
    assert "Reshape" not in ops(graph) and output_is_input(graph), str(graph)
    assert set(proto_ops(exported)) <= {"Identity"}
    assert_output_shape(graph, shape)


@pytest.mark.parametrize("shape, reps, oshape, symbolic", [
    (("B", 3, 4), (2, 1, 5), ("2*B", 3, 20), False),
    ((2, 3, 4), ("R", 1, 5), ("2*R", 3, 20), True),
    ((4, "N"), ("R", 2), ("4*R", "2*N"), True),
])
def test_tile_symbolic(shape, reps, oshape, symbolic):
    g = G()
    g.op("Tile", g.input("x", F32, shape), g.op("Shape", g.input("y", F32, reps)), name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]), {"B": (1, 8), "R": (1, 8), "N": (1, 8)},
                                         bindings_for(B=[1, 2, 5], R=[1, 3, 2], N=[2, 1, 6]))
    assert_static(graph, "Tile", [1], symbolic=[1] if symbolic else [])
    assert_output_shape(graph, oshape)
    assert ops(graph) == ["Tile"]


@pytest.mark.parametrize("x_shape, axis, oshape", [
    ((20, 100), 0, ("K", 100)),
    ((20, 100), 1, (20, "K")),
    ((20, 100), -1, (20, "K")),
    (("N", 100), 1, ("N", "K")),
])
def test_topk_symbolic(x_shape, axis, oshape):
    g = G()
    x = g.input("x", F32, x_shape)
    kk = g.shape(g.input("y", F32, (3, "K")), 1, 2)
    g.op("TopK", x, kk, names=["values", "indices"], axis=axis)
    exported, graph = simplify_and_check(g.model([("values", F32), ("indices", I64)]),
                                         {"K": (1, 20), "N": (1, 30)}, bindings_for(K=[1, 5, 20], N=[1, 7, 30]))
    node = assert_static(graph, "TopK", [], symbolic=[1])
    assert node.params[1].dims == (_expected_dim(graph, "K"),)
    assert_output_shape(graph, oshape, 0)
    assert_output_shape(graph, oshape, 1)
    assert ops(graph) == ["TopK"]


@pytest.mark.parametrize("shape, target", [((3, 1), (3, "N")), (("B", 1), ("B", "N")), ((1,), ("B", "N"))])
def test_expand_symbolic(shape, target):
    g = G()
    g.op("Expand", g.input("x", F32, shape), g.op("Shape", g.input("y", F32, target)), name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]), {"B": (1, 8), "N": (1, 8)},
                                         bindings_for(B=[1, 2, 5], N=[3, 1, 4]))
    assert_static(graph, "Expand", [], symbolic=[1])
    assert_output_shape(graph, target)
    assert ops(graph) == ["Expand"]


@pytest.mark.parametrize("shape, dtype", [(("B", 2, 3), I64), ((9, "H", "W", 4), F32)])
def test_constant_of_shape_symbolic(shape, dtype):
    value = numpy_helper.from_array(np.array([1], dtype=helper.tensor_dtype_to_np_dtype(dtype)), "value")
    g = G()
    g.op("ConstantOfShape", g.op("Shape", g.input("x", dtype, shape)), value=value, name="z")
    exported, graph = simplify_and_check(g.model([("z", dtype)]), {"B": (1, 8), "H": (1, 8), "W": (1, 8)},
                                         bindings_for(B=[1, 2, 5], H=[3, 1, 4], W=[1, 6, 2]))
    node = assert_static(graph, "ConstantOfShape", [], symbolic=[0])
    assert node.params[0].dims == tuple(_expected_dim(graph, d) for d in shape)
    assert_output_shape(graph, shape)
    assert ops(graph) == ["ConstantOfShape"]


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_resize_computed_sizes_symbolic(mode):
    """sizes = Concat(Shape(x)[0:2], Shape(x)[2:4] * 2): the usual 2x upsampling idiom."""
    g = G()
    x = g.input("x", F32, ("B", 4, "H", "W"))
    sizes = g.op("Concat", g.shape(x, 0, 2), g.op("Mul", g.shape(x, 2, 4), g.init([2])), axis=0)
    coord = "asymmetric" if mode == "nearest" else "align_corners"
    g.op("Resize", x, "", "", sizes, mode=mode, coordinate_transformation_mode=coord, name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]), {"B": (1, 4), "H": (1, 16), "W": (1, 16)},
                                         bindings_for(B=[1, 2, 3], H=[4, 1, 7], W=[4, 5, 2]))
    node = assert_static(graph, "Resize", [3], symbolic=[3])
    assert node.params[3].dims == tuple(_expected_dim(graph, d) for d in ("B", 4, "2*H", "2*W"))
    assert_output_shape(graph, ("B", 4, "2*H", "2*W"))
    assert ops(graph) == ["Resize"]


def test_resize_sizes_from_symbolic_helper():
    g = G()
    x = g.input("x", F32, ("B", 4, 4, 4))
    sizes = g.op("Concat", g.shape(x, 0, 2), g.op("Shape", g.input("y", F32, ("S", "S"))), axis=0)
    g.op("Resize", x, "", "", sizes, mode="nearest", coordinate_transformation_mode="asymmetric", name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]), {"B": (1, 4), "S": (1, 16)},
                                         bindings_for(B=[1, 2, 3], S=[8, 3, 16]))
    assert_static(graph, "Resize", [3], symbolic=[3])
    assert_output_shape(graph, ("B", 4, "S", "S"))
    assert ops(graph) == ["Resize"]


@pytest.mark.parametrize("indices_shape, axis, oshape", [((3,), -1, (3, "D")), ((2, 2), 0, ("D", 2, 2)),
                                                         (("N", 2), 1, ("N", "D", 2))])
def test_one_hot_symbolic(indices_shape, axis, oshape):
    g = G()
    indices = g.input("indices", I64, indices_shape)
    d = g.op("Gather", g.op("Shape", g.input("d", F32, ("D",))), g.init(0), axis=0)
    g.op("OneHot", indices, d, g.constant([0.0, 1.0], np.float32), axis=axis, name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]), {"D": (3, 12), "N": (1, 8)},
                                         bindings_for(D=[3, 6, 12], N=[1, 4, 2]), int_ranges={"indices": (0, 3)})
    node = assert_static(graph, "OneHot", [], symbolic=[1])
    assert node.params[1].dims == (_expected_dim(graph, "D"),)
    assert_output_shape(graph, oshape)
    assert ops(graph) == ["OneHot"]


def test_upsample_scales_symbolic():
    g = G()
    x = g.input("x", F32, ("B", 16, "H", "W"))
    scales = g.op("Concat", g.constant([1.0, 1.0], np.float32), g.constant([2.0, 2.0], np.float32), axis=0)
    g.op("Resize", x, "", scales, mode="nearest", coordinate_transformation_mode="asymmetric",
         nearest_mode="floor", name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]), {"B": (1, 4), "H": (1, 32), "W": (1, 32)},
                                         bindings_for(B=[1, 2, 3], H=[32, 1, 7], W=[32, 5, 2]))
    node = assert_static(graph, "Resize", [2])
    assert param_values(node, 2) == [1, 1, 2, 2]
    assert_output_shape(graph, ("B", 16, "2*H", "2*W"))
    assert proto_ops(exported) == ["Resize"]


def test_upsample3d_symbolic():
    g = G()
    x = g.input("x", I8, ("N", 7, "D", 10, 32))
    s = g.op("Concat", g.constant([1.0, 1.0], np.float32),
             g.op("Cast", g.op("Shape", g.input("s", F32, (3, 2, 2))), to=F32), axis=0)
    g.op("Resize", x, "", s, mode="nearest", coordinate_transformation_mode="asymmetric",
         nearest_mode="floor", name="z")
    exported, graph = simplify_and_check(g.model([("z", I8)]), {"N": (1, 8), "D": (1, 8)},
                                         bindings_for(N=[1, 2, 5], D=[8, 1, 3]))
    node = assert_static(graph, "Resize", [2])
    assert param_values(node, 2) == [1, 1, 3, 2, 2]
    assert_output_shape(graph, ("N", 7, "3*D", 20, 64))
    assert proto_ops(exported) == ["Resize"]


@pytest.mark.parametrize("x_shape, begins, ends, oshape, symbolic", [
    (("B", 10, 7, 7), (1, 2, 3, 4), (1, 2, 3, 4), ("B + 2", 14, 13, 15), False),
    ((4, 10, 7, 7), ("P", 2, 3, 4), (1, 2, 3, 4), ("P + 5", 14, 13, 15), True),
    (("B", 10, 7, 7), ("P", 2, 3, 4), (1, 2, "P", 4), ("B + P + 1", 14, "P + 10", 15), True),
])
def test_pad_symbolic(x_shape, begins, ends, oshape, symbolic):
    g = G()
    x = g.input("x", I32, x_shape)
    pads = g.op("Concat", g.op("Shape", g.input("pb", F32, begins)), g.op("Shape", g.input("pe", F32, ends)), axis=0)
    g.op("Pad", x, pads, g.constant(2, np.int32), mode="constant", name="z")
    exported, graph = simplify_and_check(g.model([("z", I32)]), {"B": (1, 8), "P": (0, 4)},
                                         bindings_for(B=[1, 2, 5], P=[0, 3, 1]))
    node = assert_static(graph, "Pad", [1, 2], symbolic=[1] if symbolic else [])
    assert param_values(node, 1) == [_expected_dim(graph, d) for d in (*begins, *ends)]
    assert_output_shape(graph, oshape)
    assert ops(graph) == ["Pad"]


def test_slice_ends_from_symbolic_shape():
    """x (N, 4, 3)[1:N:2, 1:4, 0:3], the ends being Shape(x)."""
    g = G()
    x = g.input("x", F32, ("N", 4, 3))
    g.op("Slice", x, g.vector([1, 1, 0]), g.op("Shape", x), g.vector([0, 1, 2]), g.vector([2, 1, 1]), name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]), {"N": (1, 16)}, bindings_for(N=[1, 4, 7]))
    node = assert_static(graph, "Slice", [1, 2, 3, 4], symbolic=[2])
    assert param_values(node, 2) == [_expected_dim(graph, "N"), 4, 3]
    assert_output_shape(graph, ("N // 2", 3, 3))
    assert ops(graph) == ["Slice"]


def test_slice_negative_steps_symbolic():
    """x (N, 4, 3) with starts (0, 0, 0), ends (N, -5, 4), steps (1, -1, 2)."""
    g = G()
    x = g.input("x", F32, ("N", 4, 3))
    ends = g.op("Concat", g.shape(x, 0, 1), g.constant([-5]), g.vector([4]), axis=0)
    g.op("Slice", x, g.vector([0, 0, 0]), ends, g.vector([0, 1, 2]), g.op("Concat", g.vector([1]), g.constant([-1]),
                                                                           g.vector([2]), axis=0), name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]), {"N": (1, 16)}, bindings_for(N=[1, 3, 9]))
    assert_static(graph, "Slice", [1, 2, 3, 4], symbolic=[2])
    assert_output_shape(graph, ("N", 1, 2))
    assert ops(graph) == ["Slice"]


def test_slice_int32_symbolic():
    """int32 parameters: ends = Cast(Shape(x), int32) stays an int32 symbolic parameter."""
    g = G()
    x = g.input("x", F32, ("N", 4, 3))
    ends = g.op("Cast", g.op("Shape", x), to=I32)
    g.op("Slice", x, g.vector([1, 1, 0], I32), ends, g.vector([0, 1, 2], I32), g.vector([2, 1, 1], I32), name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]), {"N": (1, 16)}, bindings_for(N=[1, 4, 7]))
    node = assert_static(graph, "Slice", [1, 2, 3, 4], symbolic=[2])
    assert node.params[2].dtype == I32
    assert_output_shape(graph, ("N // 2", 3, 3))
    assert ops(graph) == ["Slice"]


def test_slice_symbolic_starts():
    """Starts from a symbolic helper shape: the output dim is whatever the clamping gives,
    checked against onnxruntime at each binding."""
    g = G()
    x = g.input("x", F32, ("N", 4, 3))
    starts = g.op("Concat", g.op("Shape", g.input("s", F32, ("S",))), g.vector([1, 0]), axis=0)
    g.op("Slice", x, starts, g.op("Shape", x), name="z")
    exported, graph = simplify_and_check(g.model([("z", F32)]), {"N": (1, 16), "S": (0, 20)},
                                         bindings_for(N=[1, 4, 9], S=[0, 2, 12]))
    assert_static(graph, "Slice", [1, 2], symbolic=[1, 2])
    assert ops(graph) == ["Slice"]


@pytest.mark.parametrize("shape", [("B", 2, "T"), ("B", "T")])
def test_dynamic_rank_symbolic(shape):
    value = numpy_helper.from_array(np.array([4], np.int32), "value")
    g = G()
    s = g.op("Shape", g.input("y", I64, shape))
    g.op("ConstantOfShape", g.op("Slice", s, g.init([0]), g.op("Shape", s)), value=value, name="z")
    exported, graph = simplify_and_check(g.model([("z", I32)]), {"B": (1, 8), "T": (1, 8)},
                                         bindings_for(B=[1, 2, 5], T=[3, 1, 8]))
    node = assert_static(graph, "ConstantOfShape", [], symbolic=[0])
    assert node.params[0].dims == tuple(_expected_dim(graph, d) for d in shape)
    assert_output_shape(graph, shape)
    assert ops(graph) == ["ConstantOfShape"]


@pytest.mark.parametrize("computed", [False, True])
def test_if_symbolic(computed):
    """The condition is a Constant, or Equal(Shape(x)[1], 2), known from x's static dim."""
    g = G()
    if computed:
        cond_vec = g.op("Equal", g.dim("x", 1), g.init([2]))
        cond = g.op("Squeeze", cond_vec, g.init([0]))
    else:
        cond = g.op("Constant", value=numpy_helper.from_array(np.array(True), "cond_value"))
    exported, graph = simplify_and_check(_if_model(("B", 2), cond, g), {"B": (1, 8)}, B3)
    assert "If" not in ops(graph) and "If" not in proto_ops(exported)
    node = assert_static(graph, "Reshape", [1])
    assert param_values(node, 1) == [1, -1]
    assert_output_shape(graph, (1, "2*B"))
    assert ops(graph) == ["Reshape"]


# =========================================================================================
# The PyTorch reshape idiom
# =========================================================================================


def _pytorch_reshape_model() -> onnx.ModelProto:
    g = G()
    x = g.input("x", F32, ("B", "T", 768))
    target = g.op("Concat", g.dim(x, 0), g.dim(x, 1), g.init([12]), g.init([64]), axis=0)
    g.op("Reshape", x, target, name="z")
    return g.model([("z", F32)])


def test_pytorch_reshape_idiom():
    exported, graph = simplify_and_check(_pytorch_reshape_model(), {"B": (1, 8), "T": (1, 128)},
                                         bindings_for(B=[1, 2, 3], T=[1, 17, 128]))
    node = assert_static(graph, "Reshape", [], symbolic=[1])
    assert node.params[1].dims == tuple(_expected_dim(graph, d) for d in ("B", "T", 12, 64))
    assert ops(graph) == ["Reshape"]
    assert_output_shape(graph, ("B", "T", 12, 64))
    assert proto_ops(exported) == ["Reshape"]
    (reshape,) = exported.graph.node
    initializers = {t.name: numpy_helper.to_array(t) for t in exported.graph.initializer}
    assert reshape.input[0] == "x" and reshape.input[1] in initializers
    assert initializers[reshape.input[1]].tolist() == [0, 0, 12, 64]
    assert initializers[reshape.input[1]].dtype == np.int64
    assert [_dims(vi) for vi in exported.graph.output] == [["B", "T", 12, 64]]


# =========================================================================================
# The three strategies agree
# =========================================================================================


def _strategy_cases():
    def reshape_chain():
        g = G()
        x = g.input("x", F32, ("B", 3, 4))
        z1 = g.op("Reshape", x, g.op("Shape", g.input("y", F32, ("B", 12))))
        z2 = g.op("Reshape", z1, g.op("Shape", x))
        z3 = g.op("Reshape", z2, g.op("Shape", z1))
        g.op("Reshape", z3, g.op("Shape", z2), name="out")
        return g.model([("out", F32)]), {"B": (1, 8)}, B3, None

    def pad():
        g = G()
        pads = g.op("Concat", g.op("Shape", g.input("pb", F32, ("B", 2, 3, 4))),
                    g.op("Shape", g.input("pe", F32, (1, 2, 3, 4))), axis=0)
        g.op("Pad", g.input("x", F32, ("B", 10, 7, 7)), pads, name="z")
        return g.model([("z", F32)]), {"B": (1, 8)}, B3, None

    def slice_():
        g = G()
        x = g.input("x", F32, ("N", 4, 3))
        ends = g.op("Concat", g.shape(x, 0, 1), g.constant([-5]), g.vector([4]), axis=0)
        g.op("Slice", x, g.vector([0, 0, 0]), ends, g.vector([0, 1, 2]),
             g.op("Concat", g.vector([1]), g.constant([-1]), g.vector([2]), axis=0), name="z")
        return g.model([("z", F32)]), {"N": (1, 16)}, bindings_for(N=[1, 3, 9]), None

    def if_():
        g = G()
        cond = g.op("Squeeze", g.op("Equal", g.dim("x", 1), g.init([2])), g.init([0]))
        return _if_model(("B", 2), cond, g), {"B": (1, 8)}, B3, None

    def resize():
        g = G()
        x = g.input("x", F32, ("B", 4, "H", "W"))
        sizes = g.op("Concat", g.shape(x, 0, 2), g.op("Mul", g.shape(x, 2, 4), g.init([2])), axis=0)
        g.op("Resize", x, "", "", sizes, mode="nearest", name="z")
        return (g.model([("z", F32)]), {"B": (1, 4), "H": (1, 16), "W": (1, 16)},
                bindings_for(B=[1, 2, 3], H=[4, 1, 7], W=[4, 5, 2]), None)

    def pytorch():
        return _pytorch_reshape_model(), {"B": (1, 8), "T": (1, 128)}, bindings_for(B=[1, 2, 3], T=[1, 17, 128]), None

    def encoder():
        from shapeshift.examples.encoder import build_encoder

        return (build_encoder(layers=2, hidden=32, heads=2, vocab=100), {"batch": (1, 8), "seq": (1, 64)},
                bindings_for(batch=[1, 2, 3], seq=[1, 7, 16]),
                {"input_ids": (0, 100), "attention_mask": (0, 2)})

    return {"reshape_chain": reshape_chain, "pad": pad, "slice": slice_, "if": if_, "resize": resize,
            "pytorch": pytorch, "encoder": encoder}


_STRATEGY_CASES = _strategy_cases()


@pytest.mark.parametrize("case", list(_STRATEGY_CASES))
def test_strategies_agree(case):
    model, dynamic, bindings, int_ranges = _STRATEGY_CASES[case]()
    sequences = {}
    for strategy in ("incremental", "per-op", "fixpoint"):
        exported, graph = simplify_and_check(model, dynamic, bindings, int_ranges=int_ranges, strategy=strategy)
        sequences[strategy] = (proto_ops(exported), [_dims(vi) for vi in exported.graph.output],
                               sorted(tuple(t.dims) for t in exported.graph.initializer))
    assert sequences["per-op"] == sequences["incremental"], sequences
    assert sequences["fixpoint"] == sequences["incremental"], sequences
