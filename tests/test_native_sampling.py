"""Native lowerings of GridSample, RotaryEmbedding, CenterCropPad (lower/sampling.py) and
LpPool, GlobalLpPool, LpNormalization (lower/lp.py), at three values of the symbolic dims.

Outputs are compared with onnxruntime where it runs the op, else with onnx's reference
evaluator: GridSample with one spatial axis, cubic with three, and cubic with border padding
(where onnxruntime clamps only the taps, see kernels/sample.py). Every case asserts that the
node was compiled, not left to the reference fallback.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper

import shapeshift
from shapeshift.errors import ShapeshiftError

from . import test_native_ops_extra
from .test_native_backend import _const, _input, _output
from .test_native_ops_extra import _model

pytestmark = test_native_ops_extra.pytestmark  # skipped without a C compiler

F, D, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64
SIZES = (1, 3, 7)


def _native(model):
    session = shapeshift.InferenceSession(model, backend="native")
    program = session._executor.program
    fallback = program.fallback_ops()
    assert not fallback, f"left to the reference fallback: {dict(fallback)} " + "; ".join(
        f"{s.node.op_type}: {s.reason}" for s in program.steps if s.reason)
    return session


def _reference_session(model, use_onnxruntime: bool):
    if use_onnxruntime:
        import onnxruntime as ort

        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model)


def _check(model, feeds_list, use_onnxruntime=True, rtol=1e-5, atol=1e-5, reference_model=None):
    """Runs ``model`` natively (asserting nothing fell back) and compares every output with
    onnxruntime or onnx's evaluator running ``reference_model`` (default: the same model).
    Tests put several cases in one model, as outputs of their own, so that it builds once."""
    session = _native(model)
    reference = _reference_session(reference_model or model, use_onnxruntime)
    names = [o.name for o in model.graph.output]
    for feed in feeds_list:
        got, want = session.run(None, feed), reference.run(None, feed)
        for name, g, w in zip(names, got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"output {name}")
    return session


def _rand(rng, shape, low=-2.0, high=2.0):
    return np.asarray(rng.uniform(low, high, shape), dtype=np.float32)


# -- GridSample -----------------------------------------------------------------------------

MODE_NAMES = {16: ("nearest", "bilinear", "bicubic"), 20: ("nearest", "linear", "cubic"),
              22: ("nearest", "linear", "cubic")}
PADDINGS = ("zeros", "border", "reflection")
GRID_VARIANTS = list(itertools.product(PADDINGS, (0, 1)))  # (padding_mode, align_corners)
GRID_SIZES = {1: SIZES, 2: SIZES, 3: (1, 2, 4)}  # the reference evaluator is slow in 3-D


def _grid_model(opset, mode, spatial=2, dtype=F, variants=GRID_VARIANTS):
    """One GridSample node per (padding, align) variant, all reading the same x and grid."""
    x_dims = ["n", 2, "h", 5, 4][:2 + spatial]
    grid_dims = ["n", "oh", 3, 2][:1 + spatial] + [spatial]
    nodes = [helper.make_node("GridSample", ["x", "g"], [f"y_{padding}_{align}"], mode=mode, padding_mode=padding,
                              align_corners=align) for padding, align in variants]
    outputs = [_output(node.output[0], dtype) for node in nodes]
    return _model(nodes, [_input("x", x_dims, dtype), _input("g", grid_dims, dtype)], outputs, opset=opset)


def _grid_feeds(rng, spatial, dtype=np.float32):
    feeds = []
    for k in GRID_SIZES[spatial]:
        x_shape = [k, 2, k + 2, 5, 4][:2 + spatial]
        grid_shape = [k, k, 3, 2][:1 + spatial] + [spatial]
        feeds.append({"x": rng.standard_normal(x_shape).astype(dtype),
                      "g": rng.uniform(-1.3, 1.3, grid_shape).astype(dtype)})
    return feeds


GRID_CASES = [(opset, mode, spatial) for opset in (16, 20, 22) for mode in MODE_NAMES[opset]
              for spatial in ((2,) if opset == 16 else (1, 2, 3))]


@pytest.mark.parametrize("opset,mode,spatial", GRID_CASES, ids=[f"opset{o}-{m}-{s}d" for o, m, s in GRID_CASES])
def test_grid_sample(opset, mode, spatial):
    # onnxruntime runs 2 and 3 spatial axes, cubic in 2 only, and clamps a cubic coordinate
    # outside the image only tap by tap with border padding (see kernels/sample.py): cubic is
    # compared with the reference evaluator, which knows only opset 20's names of the modes
    # (GridSample-20 renamed them and added N-D inputs, nothing else).
    by_onnxruntime = spatial > 1 and "cubic" not in mode
    renamed = _grid_model(20, {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode), spatial)
    _check(_grid_model(opset, mode, spatial), _grid_feeds(np.random.default_rng(opset + spatial), spatial),
           use_onnxruntime=by_onnxruntime, reference_model=renamed)


def test_grid_sample_of_doubles_falls_back():
    model = _grid_model(20, "linear", dtype=D, variants=[("zeros", 0)])
    session = shapeshift.InferenceSession(model, backend="native")
    reasons = [s.reason for s in session._executor.program.steps if s.reason]
    assert reasons == ["GridSample on a dtype other than float32"]
    feed = _grid_feeds(np.random.default_rng(0), 2, np.float64)[1]
    want = _reference_session(model, True).run(None, feed)[0]
    # The fallback (onnx's evaluator) unnormalizes coordinates in float32, onnxruntime in double.
    np.testing.assert_allclose(session.run(None, feed)[0], want, rtol=1e-5, atol=1e-6)


# -- RotaryEmbedding ------------------------------------------------------------------------

MAX_POS = 40
HEADS, HEAD_SIZE = 2, 8
ROTARY_VARIANTS = list(itertools.product((0, 1), (0, 4)))  # (interleaved, rotary_embedding_dim)


def _caches(rng, shape):
    angles = rng.uniform(0, 2 * np.pi, shape)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _rotary_node(k, interleaved, rot, rank, with_ids):
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot}
    if rank == 3:
        attrs["num_heads"] = HEADS
    caches = [f"cos{rot}", f"sin{rot}"]
    return helper.make_node("RotaryEmbedding", ["x", *caches] + (["ids"] if with_ids else []), [f"y{k}"], **attrs)


@pytest.mark.parametrize("with_ids", [True, False], ids=["position-ids", "no-position-ids"])
@pytest.mark.parametrize("rank", [4, 3])
def test_rotary_embedding(rank, with_ids):
    """Interleaved or not, full or partial rotation: one node each, on the same input."""
    rng = np.random.default_rng(rank + with_ids)
    x_dims = ["b", HEADS, "s", HEAD_SIZE] if rank == 4 else ["b", "s", HEADS * HEAD_SIZE]
    nodes = [_rotary_node(k, il, rot, rank, with_ids) for k, (il, rot) in enumerate(ROTARY_VARIANTS)]
    inputs, inits = [_input("x", x_dims)], []
    halves = {rot: (rot or HEAD_SIZE) // 2 for _, rot in ROTARY_VARIANTS}
    for rot, half in halves.items():
        if with_ids:
            cos, sin = _caches(rng, (MAX_POS, half))
            inits += [_const(f"cos{rot}", cos), _const(f"sin{rot}", sin)]
        else:
            inputs += [_input(f"cos{rot}", ["b", "s", half]), _input(f"sin{rot}", ["b", "s", half])]
    if with_ids:
        inputs.append(_input("ids", ["b", "s"], I64))
    model = _model(nodes, inputs, [_output(n.output[0]) for n in nodes], inits, opset=23)
    feeds = []
    for b, s in zip(SIZES, (5, 2, 9)):
        shape = (b, HEADS, s, HEAD_SIZE) if rank == 4 else (b, s, HEADS * HEAD_SIZE)
        feed = {"x": _rand(rng, shape)}
        if with_ids:
            feed["ids"] = rng.integers(0, MAX_POS, (b, s)).astype(np.int64)
        else:
            for rot, half in halves.items():
                feed[f"cos{rot}"], feed[f"sin{rot}"] = _caches(rng, (b, s, half))
        feeds.append(feed)
    _check(model, feeds)


def test_rotary_embedding_position_out_of_range_fails():
    rng = np.random.default_rng(0)
    cos, sin = _caches(rng, (MAX_POS, 4))
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "ids"], ["y"])
    model = _model([node], [_input("x", ["b", 2, "s", 8]), _input("ids", ["b", "s"], I64)], [_output("y")],
                   [_const("cos", cos), _const("sin", sin)], opset=23)
    session = _native(model)
    ids = np.array([[0, MAX_POS]], np.int64)
    with pytest.raises(ShapeshiftError):
        session.run(None, {"x": _rand(rng, (1, 2, 2, 8)), "ids": ids})


# -- CenterCropPad --------------------------------------------------------------------------

CROP_CASES = [  # (input dims, target sizes, axes, dtype)
    (["n", 7, 5], [4, 8], [1, 2], F),  # crop one axis, pad the other (odd differences)
    (["n", 6, 6], [3, 6, 9], None, F),  # every axis, the symbolic one too: padded, kept, cropped by n
    (["n", 5, 6], [2, 9], [-1, -2], I64),  # negative axes, int64
    (["n", 4], [4], [1], F),  # nothing to do
]


def test_center_crop_pad():
    nodes, inputs, outputs, inits = [], [], [], []
    for k, (dims, sizes, axes, dtype) in enumerate(CROP_CASES):
        attrs = {} if axes is None else {"axes": axes}
        nodes.append(helper.make_node("CenterCropPad", [f"x{k}", f"shape{k}"], [f"y{k}"], **attrs))
        inputs.append(_input(f"x{k}", dims, dtype))
        outputs.append(_output(f"y{k}", dtype))
        inits.append(_const(f"shape{k}", np.array(sizes, np.int64)))
    model = _model(nodes, inputs, outputs, inits, opset=18)
    rng = np.random.default_rng(0)
    feeds = [{f"x{k}": (rng.standard_normal([n] + dims[1:]) * 100).astype(np.float32 if dtype == F else np.int64)
              for k, (dims, _, _, dtype) in enumerate(CROP_CASES)} for n in SIZES]
    _check(model, feeds, rtol=0, atol=0)


# -- LpPool, GlobalLpPool ---------------------------------------------------------------------

LP_POOL = [  # (input dims, attributes), at opset 18
    (["n", 3, "h", "w"], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2], "p": 2}),
    (["n", 3, "h", "w"], {"kernel_shape": [2, 3], "dilations": [2, 1], "p": 3}),
    (["n", 3, "h", "w"], {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1, "p": 1}),
    (["n", 3, "h", "w"], {"kernel_shape": [3, 3], "strides": [2, 1], "auto_pad": "SAME_UPPER"}),
    (["n", 3, "h", "w"], {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER", "p": 1}),
    (["n", 3, "h", "w"], {"kernel_shape": [2, 2], "auto_pad": "VALID", "strides": [2, 2]}),
    (["n", 2, "h"], {"kernel_shape": [3], "pads": [0, 2], "strides": [2], "p": 2}),
    (["n", 2, "h", "w", 4], {"kernel_shape": [2, 2, 2], "pads": [1, 0, 0, 0, 1, 1]}),
]


def _pool_input(rng, dims, n):
    return _rand(rng, [n if d == "n" else (n + 4 if isinstance(d, str) else d) for d in dims])


@pytest.mark.parametrize("opset", [11, 18])
def test_lp_pool(opset):
    cases = LP_POOL if opset >= 18 else [c for c in LP_POOL if "dilations" not in c[1] and "ceil_mode" not in c[1]]
    nodes = [helper.make_node("LpPool", [f"x{k}"], [f"y{k}"], **attrs) for k, (_, attrs) in enumerate(cases)]
    inputs = [_input(f"x{k}", dims) for k, (dims, _) in enumerate(cases)]
    model = _model(nodes, inputs, [_output(f"y{k}") for k in range(len(cases))], opset=opset)
    rng = np.random.default_rng(opset)
    _check(model, [{f"x{k}": _pool_input(rng, dims, n) for k, (dims, _) in enumerate(cases)} for n in SIZES])


GLOBAL_LP = list(itertools.product((["n", 3, "h"], ["n", 3, "h", 5], ["n", 2, "h", 3, 4]), (1, 2, 3)))


def test_global_lp_pool():
    nodes = [helper.make_node("GlobalLpPool", [f"x{k}"], [f"y{k}"], p=p) for k, (_, p) in enumerate(GLOBAL_LP)]
    inputs = [_input(f"x{k}", dims) for k, (dims, _) in enumerate(GLOBAL_LP)]
    model = _model(nodes, inputs, [_output(f"y{k}") for k in range(len(GLOBAL_LP))])
    rng = np.random.default_rng(1)
    _check(model, [{f"x{k}": _pool_input(rng, dims, n) for k, (dims, _) in enumerate(GLOBAL_LP)} for n in SIZES])


# -- LpNormalization ------------------------------------------------------------------------

LP_NORM = list(itertools.product((0, 1, -1), (1, 2)))  # (axis, p)


def test_lp_normalization():
    nodes = [helper.make_node("LpNormalization", ["x"], [f"y{k}"], axis=axis, p=p)
             for k, (axis, p) in enumerate(LP_NORM)]
    model = _model(nodes, [_input("x", ["n", 4, "m"])], [_output(f"y{k}") for k in range(len(LP_NORM))])
    rng = np.random.default_rng(2)
    feeds = []
    for n in SIZES:
        x = _rand(rng, (n, 4, n + 2))
        x[0, :, 0] = 0.0  # a zero norm along axis 1 (0 in the output, not NaN)
        feeds.append({"x": x})
    _check(model, feeds)


# -- extents the types do not tie together ---------------------------------------------------


def test_extents_that_must_agree_are_checked_at_run_time():
    """Batch and sequence extents under different symbols: natively computed when they agree,
    a run-time error (never an out-of-bounds read) when they do not."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("GridSample", ["x", "g"], ["y"]),
             helper.make_node("RotaryEmbedding", ["q", "cos", "sin"], ["r"])]
    inputs = [_input("x", ["n", 2, 4, 5]), _input("g", ["m", 3, 3, 2]), _input("q", ["b", 2, "s", 8]),
              _input("cos", ["b2", "s2", 4]), _input("sin", ["b2", "s2", 4])]
    model = _model(nodes, inputs, [_output("y"), _output("r")], opset=23)

    def feed(n, m, b, b2):
        cos, sin = _caches(rng, (b2, 3, 4))
        return {"x": _rand(rng, (n, 2, 4, 5)), "g": _rand(rng, (m, 3, 3, 2), -1, 1), "q": _rand(rng, (b, 2, 3, 8)),
                "cos": cos, "sin": sin}

    _check(model, [feed(k, k, k, k) for k in SIZES])
    session = _native(model)
    for bad in (feed(2, 1, 1, 1), feed(1, 1, 2, 1)):
        with pytest.raises(ShapeshiftError):
            session.run(None, bad)
