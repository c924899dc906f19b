"""The model validator (frontend/validate.py) and dim placeholders: malformed models are
refused at load, by every entry point, with a message naming the node and what is wrong;
valid ones, and exporters' "?" dims, load and run.

Each defect here was found by trying models a service would be handed (issue 30): before
the validator, these built and crashed natively (SIGSEGV, reads past a weight), hung or
asked for exbibytes on the reference backend, or failed with an IndexError, ValueError or
KeyError deep inside a pass.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.cli.main import main
from shapeshift.errors import InvalidModelError, ShapeInferenceError, ShapeshiftError

from .conftest import SHARED_MODELS

BACKENDS = ("reference", "native")


def _model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _conv_model(**attrs) -> onnx.ModelProto:
    """x[N, 3, H, W] -> Conv 'conv' (a 3x3 weight, ``attrs``) -> y."""
    weight = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)
    return _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])


def _unary_model(op_type: str, name: str = "op", **attrs) -> onnx.ModelProto:
    node = helper.make_node(op_type, ["x"], ["y"], name=name, **attrs)
    return _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


def _inputless(op_type: str) -> onnx.ModelProto:
    """A Constant node whose op type became ``op_type``: it keeps its ``value`` and has no inputs."""
    value = numpy_helper.from_array(np.ones((2, 3), np.float32))
    node = helper.make_node("Constant", [], ["c"], name="made", value=value)
    node.op_type = op_type
    add = helper.make_node("Add", ["x", "c"], ["y"], name="add")
    return _model([node, add], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


def _string_attribute(op_type: str, attr: str, extra_inputs=()) -> onnx.ModelProto:
    """``op_type`` with attribute ``attr`` given as a string ("1"), where an int or ints is declared."""
    inputs = ["x", *extra_inputs]
    node = helper.make_node(op_type, inputs, ["y"], name="bad")
    node.attribute.append(helper.make_attribute(attr, "1"))
    initializers = [numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")] if "w" in inputs else []
    initializers += [numpy_helper.from_array(np.zeros(2, np.int64), "i")] if "i" in inputs else []
    return _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2, 2])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)


def _undefined_input_type() -> onnx.ModelProto:
    model = _unary_model("Relu")
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.UNDEFINED
    return model


#: (id, malformed model, what its error must say)
MALFORMED = [
    ("negative pads", lambda: _conv_model(pads=[-1, -1, -1, -1]), r"node 'conv' \(Conv\): attribute 'pads'"),
    ("kernel over weight", lambda: _conv_model(kernel_shape=[5, 5]),
     r"node 'conv' \(Conv\): attribute 'kernel_shape' is \[5, 5\], but weight 'w' has shape \[4, 3, 3, 3\]"),
    ("exbibyte pads", lambda: _conv_model(pads=[2**40, 0, -5, 99]), r"node 'conv' \(Conv\): attribute 'pads'"),
    ("hanging pads", lambda: _conv_model(pads=[-5, -5, 1000000, -5]), r"node 'conv' \(Conv\): attribute 'pads'"),
    ("zero stride", lambda: _conv_model(strides=[0, 1]), r"node 'conv' \(Conv\): attribute 'strides'"),
    ("Reshape without inputs", lambda: _inputless("Reshape"),
     r"node 'made' \(Reshape\) has 0 inputs; expected 2 \(data, shape\)"),
    ("Transpose without inputs", lambda: _inputless("Transpose"), r"node 'made' \(Transpose\) has 0 inputs"),
    ("MatMul without inputs", lambda: _inputless("MatMul"), r"node 'made' \(MatMul\) has 0 inputs; expected 2"),
    ("perm as string", lambda: _string_attribute("Transpose", "perm"),
     r"node 'bad' \(Transpose\): attribute 'perm' is STRING, expected INTS"),
    ("to as string", lambda: _string_attribute("Cast", "to"),
     r"node 'bad' \(Cast\): attribute 'to' is STRING, expected INT"),
    ("group as string", lambda: _string_attribute("Conv", "group", ["w"]),
     r"node 'bad' \(Conv\): attribute 'group' is STRING, expected INT"),
    ("axis as string", lambda: _string_attribute("Gather", "axis", ["i"]),
     r"node 'bad' \(Gather\): attribute 'axis' is STRING, expected INT"),
    ("input of no element type", _undefined_input_type, r"graph input 'x' has element type UNDEFINED"),
    # Squeeze's axes became an input at opset 13: as an attribute every rule ignored it (the
    # fuzz campaign's --reproduce 1320:3028), and onnxruntime refuses the model.
    ("axes attribute of Squeeze at opset 17", lambda: _unary_model("Squeeze", name="squeeze", axes=[0]),
     r"node 'squeeze' \(Squeeze\): attribute 'axes' is not one of this op's at the model's opset \(its attributes: "
     r"none\)"),
    ("misspelt attribute", lambda: _unary_model("Softmax", name="sm", axs=1),
     r"node 'sm' \(Softmax\): attribute 'axs' is not one of this op's at the model's opset \(its attributes: axis\)"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make,pattern", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_models_are_refused_at_load(make, pattern, backend):
    with pytest.raises(InvalidModelError, match=pattern):
        shapeshift.InferenceSession(make(), backend=backend)


@pytest.mark.parametrize("make,pattern", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_models_are_refused_by_simplify(make, pattern):
    with pytest.raises(InvalidModelError, match=pattern):
        shapeshift.simplify(make())


def test_cli_simplify_of_a_malformed_model_prints_one_line_and_writes_nothing(tmp_path, capsys):
    bad, out = tmp_path / "bad.onnx", tmp_path / "out.onnx"
    onnx.save(_conv_model(pads=[-1, -1, -1, -1]), bad)
    assert main(["simplify", str(bad), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "node 'conv' (Conv): attribute 'pads'" in err, err
    assert not out.exists()


def test_required_inputs_and_attributes_and_output_counts():
    # An empty name where a required input goes.
    node = helper.make_node("Add", ["x", ""], ["y"], name="add")
    model = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(InvalidModelError, match=r"node 'add' \(Add\): input 1 \(B\) is required but given as empty"):
        shapeshift.load(model)
    # A required attribute missing.
    with pytest.raises(InvalidModelError, match=r"node 'op' \(Cast\): required attribute 'to' \(INT\) is missing"):
        shapeshift.load(_unary_model("Cast"))
    # Too many outputs.
    model = _unary_model("Relu")
    model.graph.node[0].output.append("z")
    with pytest.raises(InvalidModelError, match=r"node 'op' \(Relu\) has 2 outputs; expected 1"):
        shapeshift.load(model)


def test_cycles_and_order_and_ssa_are_named():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    cycle = [helper.make_node("Add", ["x", "b"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="second"),
             helper.make_node("Relu", ["b"], ["y"], name="third")]
    with pytest.raises(InvalidModelError, match=r"node 'first' \(Add\) reads 'b', which it helps compute: "
                                                r"the graph has a cycle"):
        shapeshift.load(_model(cycle, [x], [y]))
    unsorted = [helper.make_node("Relu", ["a"], ["y"], name="late"),
                helper.make_node("Relu", ["x"], ["a"], name="early")]
    with pytest.raises(InvalidModelError, match=r"node 'late' \(Relu\) reads 'a', defined only by a later node "
                                                r"\(node 'early' \(Relu\)\)"):
        shapeshift.load(_model(unsorted, [x], [y]))
    twice = [helper.make_node("Relu", ["x"], ["a"], name="one"), helper.make_node("Relu", ["x"], ["a"], name="two"),
             helper.make_node("Relu", ["a"], ["y"], name="three")]
    with pytest.raises(InvalidModelError, match=r"node 'two' \(Relu\) defines 'a', already defined by node 'one'"):
        shapeshift.load(_model(twice, [x], [y]))


def test_subgraphs_are_validated():
    """A malformed node inside an If branch is named with where it is."""
    def branch(name, pads):
        weight = numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), f"w_{name}")
        conv = helper.make_node("Conv", ["x", f"w_{name}"], [f"y_{name}"], name=f"conv_{name}", pads=pads)
        out = helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT, None)
        return helper.make_graph([conv], name, [], [out], [weight])

    node = helper.make_node("If", ["c"], ["y"], name="choose", then_branch=branch("then", [0, 0, 0, 0]),
                            else_branch=branch("else", [0, -2, 0, 0]))
    model = _model([node], [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(InvalidModelError, match=r"node 'conv_else' \(Conv\) in attribute 'else_branch' of "
                                                r"node 'choose' \(If\): attribute 'pads'"):
        shapeshift.load(model)


def test_a_kernel_shape_against_a_weight_fed_at_run_time_is_refused_when_typed():
    """The weight's shape comes from its declared type, not an initializer: the Conv type rule checks it."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[5, 5])
    model = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                            helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 3, 3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(ShapeInferenceError, match=r"kernel_shape \[5, 5\] differs from the weight's spatial dims"):
        shapeshift.load(model)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kernel_shape_against_a_weight_of_symbolic_shape_is_checked_at_run_time(backend):
    """Neither import nor typing can tell: the evaluator checks the weight it is given (the
    native backend runs a Conv over a weight fed at run time on the same evaluator)."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[5, 5])
    model = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                            helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, "k", "k"])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    session = shapeshift.InferenceSession(model, backend=backend)
    feed = {"x": np.ones((1, 3, 8, 8), np.float32), "w": np.ones((4, 3, 3, 3), np.float32)}
    with pytest.raises(ShapeshiftError, match=r"node 'conv' \(Conv\): kernel_shape \[5, 5\] differs from the "
                                              r"weight's spatial dims \[3, 3\]"):
        session.run(None, feed)


def test_valid_window_attributes_still_load():
    graph = shapeshift.load(_conv_model(pads=[1, 1, 1, 1], kernel_shape=[3, 3], strides=[2, 2], dilations=[1, 1]))
    assert graph.nodes[0].attrs["pads"] == [1, 1, 1, 1]


@pytest.fixture(scope="module")
def yolo() -> onnx.ModelProto:
    path = SHARED_MODELS / "yolov8n_nudenet.320n.onnx"
    if not path.exists():
        pytest.skip(f"{path} is absent (see ../shared/models/MANIFEST.md)")
    return onnx.load(str(path))


def _first_conv(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "Conv")


def _set_ints(node: onnx.NodeProto, name: str, values: list[int]) -> None:
    for attr in node.attribute:
        if attr.name == name:
            del attr.ints[:]
            attr.ints.extend(values)
            return
    node.attribute.append(helper.make_attribute(name, values))


@pytest.mark.models
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("attr,values", [("pads", [-1, -1, -1, -1]), ("kernel_shape", [5, 5]),
                                         ("pads", [2**40, 0, -5, 99]), ("pads", [-5, -5, 1000000, -5])])
def test_yolov8n_with_one_bad_conv_is_refused(yolo, attr, values, backend):
    """The issue's reproduction: yolov8n with one Conv changed."""
    model = onnx.ModelProto()
    model.CopyFrom(yolo)
    conv = _first_conv(model)
    _set_ints(conv, attr, values)
    with pytest.raises(InvalidModelError, match=rf"node '{conv.name}' \(Conv\): attribute '{attr}'"):
        shapeshift.InferenceSession(model, backend=backend)


# -- dim placeholders ---------------------------------------------------------------


@pytest.mark.parametrize("placeholder", ["?", "-1", "None", " "])
def test_placeholder_dims_are_independent_symbols(placeholder):
    """paddle2onnx writes "?" for every unknown dim: read as one symbol, an image fed 48x192
    was a SymbolConflictError."""
    model = _unary_model("Relu")
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for d in dims:
        d.dim_param = placeholder
    session = shapeshift.InferenceSession(model, backend="reference")
    h, w = session.graph.inputs[0].type.shape
    assert h is not w
    x = np.arange(48 * 192, dtype=np.float32).reshape(48, 192) - 100
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.maximum(x, 0))


def test_a_named_dim_is_still_one_symbol():
    model = _unary_model("Relu")
    for d in model.graph.input[0].type.tensor_type.shape.dim:
        d.dim_param = "n"
    session = shapeshift.InferenceSession(model, backend="reference")
    h, w = session.graph.inputs[0].type.shape
    assert h is w
    with pytest.raises(ShapeshiftError, match="symbol 'n'"):
        session.run(None, {"x": np.zeros((2, 3), np.float32)})


@pytest.mark.models
def test_a_paddle2onnx_model_with_question_mark_dims_runs_at_non_square_sizes():
    """ppocr_det as older paddle2onnx versions write it: "?" on every unknown dim."""
    ort = pytest.importorskip("onnxruntime")
    path = SHARED_MODELS / "ppocr_det.det_infer.onnx"
    if not path.exists():
        pytest.skip(f"{path} is absent (see ../shared/models/MANIFEST.md)")
    model = onnx.load(str(path))
    for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                d.dim_param = "?"
    session = shapeshift.InferenceSession(model, backend="reference")
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for height, width in [(64, 96), (96, 160)]:
        x = rng.random((1, 3, height, width), dtype=np.float32)
        got, = session.run(None, {"x": x})
        want, = expected.run(None, {"x": x})
        assert got.shape == want.shape == (1, 1, height, width)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
