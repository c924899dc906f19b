"""The native backend end to end: one-node models of every lowered op family, fused
chains, the bundled encoder, and the runtime's errors, all against onnxruntime at
several values of each symbolic dimension from one build.

Each op case asserts that the node really ran as generated C (no fallback step), so a
lowering that silently declines shows up as a failure, not as a pass of the reference.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.errors import CompilerNotFoundError, ExecutionError, SymbolConflictError, SymbolRangeError

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "case", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _input(name, dims, dtype=F):
    return helper.make_tensor_value_info(name, dtype, dims)


def _output(name, dtype=F):
    return helper.make_tensor_value_info(name, dtype, None)


def _const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _run_both(model, feeds_list, fully_native=True, rtol=1e-4, atol=1e-5):
    import onnxruntime as ort

    session = shapeshift.InferenceSession(model, backend="native")
    executor = session._executor
    if fully_native:
        fallback = executor.program.fallback_ops()
        assert not fallback, f"left to the reference fallback: {dict(fallback)}"
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds_list:
        got = session.run(None, feed)
        want = reference.run(None, feed)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return session


def _rand(rng, shape, dtype=np.float32, positive=False):
    x = np.asarray(rng.standard_normal(shape), dtype=dtype)  # an array even for shape ()
    return np.asarray(np.abs(x) + dtype(0.5)) if positive else x


# -- elementwise and fusion -------------------------------------------------------------------

UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Erf", "Floor", "Ceil", "Softplus", "Sin", "Cos",
         "Reciprocal", "HardSwish", "Sign"]
BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"]


@pytest.mark.parametrize("op", UNARY + ["Log", "Sqrt"])
def test_unary_ops(op):
    rng = np.random.default_rng(0)
    model = _model([helper.make_node(op, ["x"], ["y"])], [_input("x", ["n", 5])], [_output("y")])
    positive = op in ("Log", "Sqrt", "Reciprocal")
    _run_both(model, [{"x": _rand(rng, (n, 5), positive=positive)} for n in (1, 3, 70)])


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("shapes", [(["n", 4], [4]), (["n", 1], [1, 4]), (["n", 4], ["n", 4]), ([], ["n"])], ids=str)
def test_binary_ops_broadcast(op, shapes):
    rng = np.random.default_rng(1)
    model = _model([helper.make_node(op, ["a", "b"], ["y"])], [_input("a", shapes[0]), _input("b", shapes[1])],
                   [_output("y")])
    feeds = []
    for n in (1, 2, 9):
        concrete = [[n if d == "n" else d for d in s] for s in shapes]
        feeds.append({"a": _rand(rng, concrete[0], positive=op == "Pow"), "b": _rand(rng, concrete[1], positive=op == "Div")})
    _run_both(model, feeds)


def test_gelu_chain_fuses_into_one_step():
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    inits = [_const("sqrt2", np.float32(1.4142135)), _const("one", np.float32(1)), _const("half", np.float32(0.5))]
    model = _model(nodes, [_input("x", ["b", "s", 8])], [_output("y")], inits)
    session = _run_both(model, [{"x": _rand(rng, (b, s, 8))} for b, s in ((1, 1), (2, 5), (1, 40))])
    program = session._executor.program
    assert [s.kind for s in program.steps] == ["native"]
    assert len(program.steps[0].lowered.absorbed) == 4


def test_gpt2_gelu_with_pow_3_vectorizes():
    # GPT-2's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Pow by a constant 2, 3
    # or 4 is a product, so the chain has an AVX2 form (libm's powf per element had none).
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("Pow", ["x", "three"], ["p"]), helper.make_node("Mul", ["p", "c"], ["pc"]),
             helper.make_node("Add", ["x", "pc"], ["s"]), helper.make_node("Mul", ["s", "k"], ["sk"]),
             helper.make_node("Tanh", ["sk"], ["t"]), helper.make_node("Add", ["t", "one"], ["t1"]),
             helper.make_node("Mul", ["x", "half"], ["xh"]), helper.make_node("Mul", ["xh", "t1"], ["y"])]
    inits = [_const("three", np.float32(3)), _const("c", np.float32(0.044715)), _const("k", np.float32(0.7978846)),
             _const("one", np.float32(1)), _const("half", np.float32(0.5))]
    model = _model(nodes, [_input("x", ["b", 37])], [_output("y")], inits)
    session = _run_both(model, [{"x": _rand(rng, (b, 37)) * 3} for b in (1, 4, 9)])
    steps = session._executor.program.steps
    assert all(s.kind == "native" for s in steps)
    pow_step = next(s for s in steps if s.node.op_type == "Pow")
    assert "ss_tanh8" in pow_step.lowered.code and "_mm256_mul_ps" in pow_step.lowered.code
    assert not any("powf" in s.lowered.code for s in steps)


@pytest.mark.parametrize("exponent", [np.float32(2), np.float32(4), np.int64(3), np.float32(2.5), np.float32(-2)])
def test_pow_by_a_constant(exponent):
    rng = np.random.default_rng(8)
    model = _model([helper.make_node("Pow", ["x", "e"], ["y"])], [_input("x", ["n", 19])], [_output("y")],
                   [_const("e", exponent)])
    x = _rand(rng, (5, 19), positive=float(exponent) != int(exponent))
    x[0, :4] = [np.inf, -np.inf, 0.0, -0.0] if float(exponent) == int(exponent) else [np.inf, 0.0, 1.0, 2.0]
    _run_both(model, [{"x": x}, {"x": x[:2]}])


PIECEWISE = [("HardSwish", {}, ()), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, ()), ("LeakyRelu", {"alpha": 0.2}, ()),
             ("Softsign", {}, ()), ("Floor", {}, ()), ("Ceil", {}, ()), ("Round", {}, ()),
             ("Clip", {}, ("lo", "hi")), ("Clip", {}, ("lo",)), ("Max", {}, ("b",)), ("Min", {}, ("b", "c"))]


@pytest.mark.parametrize("op,attrs,extra", PIECEWISE, ids=lambda p: str(p) if isinstance(p, str) else "")
def test_piecewise_activations_vectorize_and_keep_nan(op, attrs, extra):
    # MobileNetV3's HardSwish / HardSigmoid and ReLU6's Clip had no AVX2 form: every chain holding
    # one ran a scalar loop (SSDlite's 20 HardSwish took 17 ms of a 120 ms run). A chain after an
    # Add, 37 floats a row (a vector tail), NaN, infinities and signed zeros among the inputs.
    rng = np.random.default_rng(9)
    consts = {"lo": np.float32(-0.5), "hi": np.float32(6.0), "c": np.float32(0.25)}
    inputs = [_input("x", ["n", 37])] + [_input(name, [37]) for name in extra if name not in consts]
    nodes = [helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node(op, ["s", *extra], ["y"], **attrs)]
    model = _model(nodes, inputs, [_output("y")], [_const(k, v) for k, v in consts.items() if k in extra])
    feeds = []
    for n in (1, 3):
        x = _rand(rng, (n, 37)) * 4
        x[0, :8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 2.5, -2.5, 3.0]
        feed = {"x": x}
        if "b" in extra:
            b = _rand(rng, (37,))
            b[8:10] = [np.nan, 0.0]
            feed["b"] = b
        feeds.append(feed)
    session = _run_both(model, feeds)
    steps = session._executor.program.steps
    assert len(steps) == 1 and steps[0].kind == "native" and "_mm256" in steps[0].lowered.code


def test_compare_where_and_cast():
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Greater", ["a", "b"], ["g"]), helper.make_node("Where", ["g", "a", "b"], ["w"]),
             helper.make_node("Cast", ["g"], ["c"], to=I64), helper.make_node("Not", ["g"], ["n"])]
    model = _model(nodes, [_input("a", ["n", 3]), _input("b", [3])],
                   [_output("w"), _output("c", I64), _output("n", TensorProto.BOOL)])
    _run_both(model, [{"a": _rand(rng, (n, 3)), "b": _rand(rng, (3,))} for n in (1, 4, 11)])


def test_integer_arithmetic_and_python_style_mod():
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Mod", ["m", "k"], ["y"])]
    model = _model(nodes, [_input("a", ["n"], I64), _input("b", ["n"], I64)], [_output("y", I64)],
                   [_const("k", np.int64(-7))])
    _run_both(model, [{"a": rng.integers(-50, 50, n), "b": rng.integers(-50, 50, n)} for n in (1, 6, 100)])


# -- linear algebra ---------------------------------------------------------------------------


def test_matmul_with_weight_bias_and_relu_fuses():
    rng = np.random.default_rng(5)
    w = _rand(rng, (24, 40))
    bias = _rand(rng, (40,))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    model = _model(nodes, [_input("x", ["b", "s", 24])], [_output("y")], [_const("w", w), _const("bias", bias)])
    session = _run_both(model, [{"x": _rand(rng, (b, s, 24))} for b, s in ((1, 1), (2, 7), (3, 65))])
    assert [s.kind for s in session._executor.program.steps] == ["native"]


@pytest.mark.parametrize("a_dims,b_dims", [
    (["h", "t", 8], ["h", 8, "t"]),  # attention scores, batched on both sides
    ([2, "h", "t", 8], [8, 5]),  # a weight that is an input (not constant)
    (["t", 8], [3, 8, 6]),  # the left operand broadcast over the right's batch
    ([8], ["h", 8, 4]),  # 1-D left operand
    (["h", "t", 8], [8]),  # 1-D right operand
], ids=str)
def test_matmul_batched_and_broadcast(a_dims, b_dims):
    rng = np.random.default_rng(6)
    model = _model([helper.make_node("MatMul", ["a", "b"], ["y"])], [_input("a", a_dims), _input("b", b_dims)],
                   [_output("y")])
    feeds = []
    for h, t in ((1, 1), (2, 3), (3, 17)):
        sub = {"h": h, "t": t}
        feeds.append({"a": _rand(rng, [sub.get(d, d) for d in a_dims]),
                      "b": _rand(rng, [sub.get(d, d) for d in b_dims])})
    _run_both(model, feeds)


@pytest.mark.parametrize("trans_a,trans_b,c_shape", [(0, 0, [7]), (1, 0, [1, 7]), (0, 1, ["m", 1]), (1, 1, None),
                                                     (0, 0, [])], ids=str)
def test_gemm(trans_a, trans_b, c_shape):
    rng = np.random.default_rng(7)
    b = _rand(rng, (7, 5) if trans_b else (5, 7))
    inputs = ["a", "b"] + (["c"] if c_shape is not None else [])
    node = helper.make_node("Gemm", inputs, ["y"], transA=trans_a, transB=trans_b, alpha=0.5, beta=2.0)
    graph_inputs = [_input("a", [5, "m"] if trans_a else ["m", 5])]
    if c_shape is not None:
        graph_inputs.append(_input("c", c_shape))
    model = _model([node], graph_inputs, [_output("y")], [_const("b", b)])
    feeds = []
    for m in (1, 4, 33):
        feed = {"a": _rand(rng, (5, m) if trans_a else (m, 5))}
        if c_shape is not None:
            feed["c"] = _rand(rng, [m if d == "m" else d for d in c_shape])
        feeds.append(feed)
    _run_both(model, feeds)


# -- reductions and normalizations ------------------------------------------------------------


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp"])
@pytest.mark.parametrize("axes", [[-1], [1], [1, 2]], ids=str)
def test_reductions(op, axes):
    rng = np.random.default_rng(8)
    opset = 18
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)
    model = _model([node], [_input("x", [2, "n", 6])], [_output("y")], [_const("axes", np.array(axes, np.int64))],
                   opset=opset)
    _run_both(model, [{"x": _rand(rng, (2, n, 6)) * 0.5} for n in (1, 3, 8)])


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax_and_log_softmax(axis):
    rng = np.random.default_rng(9)
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=axis), helper.make_node("LogSoftmax", ["x"], ["l"], axis=axis)]
    model = _model(nodes, [_input("x", [3, "n", 5])], [_output("s"), _output("l")])
    _run_both(model, [{"x": _rand(rng, (3, n, 5)) * 10} for n in (1, 4, 9)])


def test_layer_norm_with_statistics():
    rng = np.random.default_rng(10)
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv"], axis=-1, epsilon=1e-5)
    model = _model([node], [_input("x", ["b", "s", 16])], [_output("y"), _output("mean"), _output("inv")],
                   [_const("g", _rand(rng, (16,))), _const("b", _rand(rng, (16,)))])
    _run_both(model, [{"x": _rand(rng, (b, s, 16))} for b, s in ((1, 1), (2, 3), (1, 50))])


def test_argmax():
    rng = np.random.default_rng(11)
    node = helper.make_node("ArgMax", ["x"], ["y"], axis=1, keepdims=0)
    model = _model([node], [_input("x", [2, "n", 4])], [_output("y", I64)])
    _run_both(model, [{"x": _rand(rng, (2, n, 4))} for n in (1, 5, 12)])


# -- layout ---------------------------------------------------------------------------------


def test_transpose_reshape_concat_split_slice():
    rng = np.random.default_rng(12)
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("Concat", ["r", "r"], ["c"], axis=1),
        helper.make_node("Split", ["c"], ["s0", "s1"], axis=1),
        helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["sl"]),
    ]
    inits = [_const("shape", np.array([0, 3, -1], np.int64)), _const("starts", np.array([-1, 0], np.int64)),
             _const("ends", np.array([-100, 5], np.int64)), _const("axes", np.array([1, 3], np.int64)),
             _const("steps", np.array([-2, 2], np.int64))]
    model = _model(nodes, [_input("x", ["b", "s", 3, 5])],
                   [_output("s0"), _output("s1"), _output("sl")], inits)
    _run_both(model, [{"x": _rand(rng, (b, s, 3, 5))} for b, s in ((1, 1), (2, 4), (1, 9))])


def test_expand_tile_pad_gather():
    rng = np.random.default_rng(13)
    nodes = [
        helper.make_node("Expand", ["x", "eshape"], ["e"]),
        helper.make_node("Tile", ["x", "reps"], ["t"]),
        helper.make_node("Pad", ["x", "pads", "value"], ["p"]),
        helper.make_node("Gather", ["table", "ids"], ["g"], axis=0),
    ]
    inits = [_const("eshape", np.array([2, 1, 1], np.int64)), _const("reps", np.array([2, 3], np.int64)),
             _const("pads", np.array([1, 0, 2, 3], np.int64)), _const("value", np.float32(-1.5)),
             _const("table", _rand(rng, (10, 4)))]
    model = _model(nodes, [_input("x", ["n", 4]), _input("ids", ["b", "n"], I64)],
                   [_output("e"), _output("t"), _output("p"), _output("g")], inits)
    _run_both(model, [{"x": _rand(rng, (n, 4)), "ids": rng.integers(-10, 10, (2, n))} for n in (1, 3, 6)])


def test_conv_on_small_planes_reads_prepacked_weights(monkeypatch):
    # Below conv.SMALL_PLANE output pixels ss_conv2d multiplies by the weights packed once at
    # load; above, by the per-call path. One session serves both, and a grouped conv gets none.
    # (The NCHW kernels: with the blocked layout on, these convs run in NCHWc instead; and
    # ss_conv2d's own paths: with Winograd on, the 3 x 3 conv runs kernels/conv_wino.py.)
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "0")
    monkeypatch.setenv("SHAPESHIFT_WINOGRAD", "off")
    rng = np.random.default_rng(21)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"]),
             helper.make_node("Conv", ["y", "wg"], ["z"], group=2, kernel_shape=[1, 1])]
    inits = [_const("w", _rand(rng, (24, 16, 3, 3))), _const("b", _rand(rng, (24,))),
             _const("wg", _rand(rng, (8, 12, 1, 1)))]
    model = _model(nodes, [_input("x", ["n", 16, "h", "w"])], [_output("z")], inits)
    feeds = [{"x": _rand(rng, shape)} for shape in ((1, 16, 2, 3), (2, 16, 8, 8), (1, 16, 12, 11), (1, 16, 1, 1))]
    session = _run_both(model, feeds)
    program = session._executor.program
    assert [p.source.shape for p in program.packs] == [(16 * 9, 24)]
    assert sum("(const float*)v[" in s.lowered.code for s in program.steps if s.lowered) == 1


def test_dense_convs_get_prepacked_weights_where_a_path_reads_them(monkeypatch):
    # Every dense k x k conv's weights are packed at load (the implicit GEMM reads them); a
    # 1x1 conv's only where its static plane takes the small-plane path: 90 pixels with 96
    # output channels, not with 8. A grouped conv gets none. (The NCHW kernels and
    # ss_conv2d's paths, as above.)
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "0")
    monkeypatch.setenv("SHAPESHIFT_WINOGRAD", "off")
    from shapeshift.codegen.kernels.conv import small_plane_ok

    assert small_plane_ok(90, 96) and not small_plane_ok(90, 8) and not small_plane_ok(300, 512)
    rng = np.random.default_rng(22)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c", "w1"], ["d"]),
             helper.make_node("Conv", ["d", "w2", "b2"], ["e"]),
             helper.make_node("Conv", ["e", "w3"], ["y"], pads=[1, 1, 1, 1], group=2)]
    inits = [_const("w", _rand(rng, (12, 4, 3, 3))), _const("w1", _rand(rng, (96, 12, 1, 1))),
             _const("w2", _rand(rng, (8, 96, 1, 1))), _const("b2", _rand(rng, (8,))),
             _const("w3", _rand(rng, (6, 4, 3, 3)))]
    model = _model(nodes, [_input("x", [1, 4, 10, 9])], [_output("y")], inits)
    session = _run_both(model, [{"x": _rand(rng, (1, 4, 10, 9))}], rtol=1e-4, atol=1e-4)
    assert [p.source.shape for p in session._executor.program.packs] == [(4 * 9, 12), (12, 96)]


def test_dense_convs_either_side_of_the_implicit_gemm_switch(monkeypatch):
    # Planes of at most conv_igemm_min_plane(target) pixels (64 with the 8x48 zmm GEMM tile,
    # 9 with 6x16) take the small-plane GEMM over prepacked weights, larger ones the
    # implicit GEMM: both, at ragged channel counts (neither a multiple of 8 or 16), stride
    # 2 with dilation 2 and uneven pads, batch 1 and 3, at planes just under, at and over the
    # switch, agree with onnxruntime. (The NCHW kernels, as above.)
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "0")
    from shapeshift.codegen.defaults import conv_igemm_min_plane

    switch = conv_igemm_min_plane()
    rng = np.random.default_rng(23)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], strides=[2, 2], dilations=[2, 2], pads=[2, 1, 1, 2])]
    inits = [_const("w", _rand(rng, (70, 13, 3, 3))), _const("b", _rand(rng, (70,))),
             _const("w2", _rand(rng, (37, 70, 3, 3)))]
    model = _model(nodes, [_input("x", ["n", 13, "h", "w"])], [_output("y")], inits)
    sides = {(h * w <= switch) for h, w in ((2, 3), (7, 9), (8, 8), (5, 13), (11, 9), (16, 19))}
    assert sides == {True, False}
    feeds = [{"x": _rand(rng, (n, 13, h, w))} for n, (h, w) in
             zip((1, 3, 1, 3, 1, 1), ((2, 3), (7, 9), (8, 8), (5, 13), (11, 9), (16, 19)))]
    _run_both(model, feeds, rtol=1e-4, atol=1e-4)


def test_gather_index_out_of_range_names_the_node():
    model = _model([helper.make_node("Gather", ["table", "ids"], ["g"], axis=0, name="lookup")],
                   [_input("ids", ["n"], I64)], [_output("g")], [_const("table", np.ones((4, 2), np.float32))])
    session = shapeshift.InferenceSession(model, backend="native")
    assert not session._executor.program.fallback_ops()
    with pytest.raises(ExecutionError, match="lookup"):
        session.run(None, {"ids": np.array([0, 4], np.int64)})


# -- convolution and pooling ------------------------------------------------------------------


@pytest.mark.parametrize("group,stride,pads,act", [(1, 1, [1, 1, 1, 1], None), (2, 2, [0, 1, 1, 0], "Relu"),
                                                   (4, 1, [1, 1, 1, 1], "silu")], ids=str)
def test_conv_with_activation(group, stride, pads, act):
    rng = np.random.default_rng(14)
    w = _rand(rng, (4, 4 // group, 3, 3))
    nodes = [helper.make_node("Conv", ["x", "w", "bias"], ["c"], group=group, strides=[stride, stride], pads=pads)]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif act == "silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    else:
        nodes.append(helper.make_node("Identity", ["c"], ["y"]))
    model = _model(nodes, [_input("x", ["n", 4, "h", "w"])], [_output("y")], [_const("w", w), _const("bias", _rand(rng, (4,)))])
    _run_both(model, [{"x": _rand(rng, (n, 4, h, h + 1))} for n, h in ((1, 5), (2, 8), (1, 13))])


@pytest.mark.parametrize("op,attrs", [("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
                                      ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2])),
                                      ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1))],
                         ids=str)
def test_pooling(op, attrs):
    rng = np.random.default_rng(15)
    model = _model([helper.make_node(op, ["x"], ["y"], **attrs)], [_input("x", [1, 3, "h", "w"])], [_output("y")])
    _run_both(model, [{"x": _rand(rng, (1, 3, h, h + 2))} for h in (4, 7, 16)])


def test_global_pool_and_batch_norm():
    rng = np.random.default_rng(16)
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("GlobalAveragePool", ["bn"], ["y"])]
    inits = [_const(n, _rand(rng, (3,), positive=n == "v")) for n in ("s", "b", "m", "v")]
    model = _model(nodes, [_input("x", ["n", 3, "h", 5])], [_output("y")], inits)
    _run_both(model, [{"x": _rand(rng, (n, 3, h, 5))} for n, h in ((1, 1), (2, 4), (1, 9))])


@pytest.mark.parametrize("mode,coord", [("nearest", "asymmetric"), ("linear", "half_pixel"),
                                        ("linear", "align_corners"), ("nearest", "half_pixel")], ids=str)
def test_resize_by_scales(mode, coord):
    rng = np.random.default_rng(17)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, coordinate_transformation_mode=coord)
    model = _model([node], [_input("x", [1, 2, "h", "w"])], [_output("y")],
                   [_const("scales", np.array([1, 1, 2, 2], np.float32))])
    _run_both(model, [{"x": _rand(rng, (1, 2, h, h + 1))} for h in (1, 3, 8)])


# -- the bundled encoder, one build for every shape -----------------------------------------------


def _encoder_feed(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seq)
    return {"input_ids": rng.integers(0, 100, size=(batch, seq), dtype=np.int64),
            "attention_mask": np.ones((batch, seq), dtype=np.int64)}


def test_encoder_runs_fully_native_with_one_build(encoder_path, compiler_calls):
    import onnxruntime as ort

    calls = compiler_calls  # libraries built, from an empty cache
    session = shapeshift.InferenceSession(encoder_path, backend="native")
    assert len(calls) == 1
    program = session._executor.program
    assert not program.fallback_ops() and len(program.segments) == 1
    # Attention's head transposes are read or written through GEMM strides, never copied.
    assert not [s.node.op_type for s in program.steps if s.node.op_type == "Transpose"]
    reference = ort.InferenceSession(str(encoder_path), providers=["CPUExecutionProvider"])
    for batch, seq in ((2, 1), (1, 7), (2, 33), (1, 7)):
        feed = _encoder_feed(batch, seq)
        np.testing.assert_allclose(session.run(None, feed)[0], reference.run(None, feed)[0], rtol=1e-4, atol=1e-5)
    assert len(calls) == 1  # new sequence lengths, no new build
    shapeshift.InferenceSession(encoder_path, backend="native")  # a second session hits the cache
    assert len(calls) == 1


# -- runtime errors ---------------------------------------------------------------------------------


def _relu_model():
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_input("x", ["n", "n"])], [_output("y")])


def test_out_of_range_shape_and_inconsistent_symbols():
    session = shapeshift.InferenceSession(_relu_model(), dynamic={"n": (1, 8)}, backend="native")
    with pytest.raises(SymbolRangeError, match="'n'"):
        session.run(None, {"x": np.zeros((9, 9), np.float32)})
    with pytest.raises(SymbolConflictError, match="'n'"):
        session.run(None, {"x": np.zeros((2, 3), np.float32)})


def test_missing_compiler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("SHAPESHIFT_CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(CompilerNotFoundError):
        shapeshift.InferenceSession(_relu_model(), backend="native")


def test_fallback_nodes_run_between_segments():
    # Unique has no native rule: it falls back, and the rest, its consumers included (they
    # read its output length as a late symbol), runs natively around it.
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Unique", ["r"], ["u"]),
             helper.make_node("ReduceSum", ["u"], ["s"], keepdims=0), helper.make_node("Mul", ["r", "r"], ["y"])]
    model = _model(nodes, [_input("x", ["n"])], [_output("s"), _output("y")], opset=13)
    rng = np.random.default_rng(18)
    feeds = [{"x": np.round(_rand(rng, (n,)))} for n in (1, 5, 12)]
    session = _run_both(model, feeds, fully_native=False)
    kinds = {s.node.op_type: s.kind for s in session._executor.program.steps}
    assert kinds == {"Relu": "native", "Unique": "fallback", "ReduceSum": "native", "Mul": "native"}


def test_arena_always_holds_the_plan_and_starts_aligned():
    # Regression: the arena grew only when smaller than the plan, forgetting the bytes
    # then lost to aligning its base, so a slightly larger binding wrote past its end. The
    # arena now starts on a cache line itself (huge_pages.empty), and must still hold the plan.
    from shapeshift.runtime.vm import ALIGNMENT

    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_input("x", ["m", 5])], [_output("y")])
    session = shapeshift.InferenceSession(model, backend="native")
    vm = session._executor.vm
    for m in range(1, 40):
        x = np.random.default_rng(m).standard_normal((m, 5)).astype(np.float32)
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.maximum(x, 0))
        plan = vm._plan({"m": m})
        assert plan.arena_bytes <= vm._arena.nbytes
        assert vm._arena.ctypes.data == vm._arena_base and vm._arena_base % ALIGNMENT == 0


def test_broadcast_decided_at_run_time():
    # BERT's position embeddings: [1, min(seq, 512), H] + [batch, seq, H]. Whether the
    # min() broadcasts is only known per run; the loop takes the stride from the extents.
    rng = np.random.default_rng(19)
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "one"], ["seq"], axis=0),
             helper.make_node("Min", ["seq", "cap"], ["m"]), helper.make_node("Unsqueeze", ["m", "zero"], ["m1"]),
             helper.make_node("Slice", ["table", "zero", "m1", "axis1"], ["pos"]),
             helper.make_node("Add", ["x", "pos"], ["y"])]
    inits = [_const("one", np.array(1, np.int64)), _const("zero", np.array([0], np.int64)),
             _const("axis1", np.array([1], np.int64)), _const("cap", np.array(6, np.int64)),
             _const("table", _rand(rng, (1, 6, 4)))]
    model = _model(nodes, [_input("x", ["b", "t", 4])], [_output("y")], inits)
    session = _run_both(model, [{"x": _rand(rng, (b, t, 4))} for b, t in ((1, 1), (2, 6), (3, 2))])
    kinds = {s.node.op_type: s.kind for s in session._executor.program.steps}
    assert kinds["Add"] == "native"
    with pytest.raises(ExecutionError, match="do not broadcast"):
        session.run(None, {"x": _rand(rng, (1, 7, 4))})  # min(7, 6) = 6 against 7


@pytest.mark.parametrize("size", [3, 5])  # onnxruntime takes odd sizes only
def test_lrn(size):
    rng = np.random.default_rng(20)
    node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=2e-3, beta=0.6, bias=1.5)
    model = _model([node], [_input("x", ["n", 7, "h", 3])], [_output("y")])
    _run_both(model, [{"x": _rand(rng, (n, 7, h, 3)) * 3} for n, h in ((1, 1), (2, 4), (1, 9))])


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin"])
def test_integer_reductions(op):
    rng = np.random.default_rng(21)
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)
    model = _model([node], [_input("x", [2, "n", 3], I64)], [_output("y", I64)],
                   [_const("axes", np.array([1], np.int64))], opset=18)
    _run_both(model, [{"x": rng.integers(-5, 5, (2, n, 3))} for n in (1, 4, 9)])
