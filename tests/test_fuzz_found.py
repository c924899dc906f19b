"""Defects the fuzz campaign found (shapeshift/fuzz, bench/results/fuzz.md), each reduced
to a small model; every test here failed before its fix. The reproducer of the mutant
that found it is in each docstring (``python -m shapeshift.fuzz --reproduce SEED:INDEX``).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.errors import (ExecutionError, InvalidModelError, ShapeInferenceError, ShapeshiftError,
                               UnsupportedModelError)


F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "found", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _ort(model, feed):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


def test_native_output_that_is_a_view_of_a_folded_constant():
    """Found on the fuzzer's own indexing seed: Range(0, 3, 1) folds to a constant, the
    output is an Identity (a view) of it, and the VM had released the constant as unread:
    ``ValueError: cannot reshape array of size 1 into shape (3,)``."""
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("z", 0), ("three", 3), ("one", 1))]
    model = _model([helper.make_node("Range", ["z", "three", "one"], ["ramp"]),
                    helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", F, ["n"])],
                   [helper.make_tensor_value_info("ramp", TensorProto.INT64, None),
                    helper.make_tensor_value_info("y", F, ["n"])], consts)
    ramp, _ = shapeshift.InferenceSession(model, backend="native").run(None, {"x": np.ones(3, np.float32)})
    np.testing.assert_array_equal(ramp, [0, 1, 2])


@pytest.mark.parametrize("n", [3, 37])  # the scalar loop, and the AVX2 body with its tail
def test_native_relu_keeps_nan(n):
    """--reproduce 0:6 (control_flow, a NaN fed): Relu(NaN) was 0 natively (``x > 0 ? x : 0``
    and ``max_ps(x, 0)`` both drop a NaN), NaN in onnxruntime and the reference backend."""
    model = _model([helper.make_node("Sub", ["x", "one"], ["d"]), helper.make_node("Relu", ["d"], ["y"])],
                   [helper.make_tensor_value_info("x", F, ["n"])], [helper.make_tensor_value_info("y", F, ["n"])],
                   [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    x = np.linspace(-2, 2, n).astype(np.float32)
    x[[0, n // 2, n - 1]] = np.nan
    (got,) = shapeshift.InferenceSession(model, backend="native").run(None, {"x": x})
    (want,) = _ort(model, {"x": x})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want)


@pytest.mark.parametrize("largest", [1, 0])
def test_native_topk_orders_nan_as_onnxruntime(largest):
    """--reproduce 0:71 (indexing, a NaN fed): native TopK skipped NaNs (every comparison
    with one is false); onnxruntime and NumPy rank NaN above every number."""
    model = _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest)],
                   [helper.make_tensor_value_info("x", F, [4, 6])],
                   [helper.make_tensor_value_info("v", F, [4, 3]), helper.make_tensor_value_info("i", TensorProto.INT64, [4, 3])],
                   [numpy_helper.from_array(np.array([3], np.int64), "k")])
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    x[0, 2] = x[1, 0] = x[1, 5] = x[3, :] = np.nan
    got = shapeshift.InferenceSession(model, backend="native").run(None, {"x": x})
    want = _ort(model, {"x": x})
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


def _control_flow(body_outputs: int):
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "s"], ["s2"]), helper.make_node("ReduceSum", ["s2"], ["total"], keepdims=0),
         helper.make_node("Identity", ["c"], ["c2"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("s", F, [2])],
        [helper.make_tensor_value_info("c2", TensorProto.BOOL, []), helper.make_tensor_value_info("s2", F, [2]),
         helper.make_tensor_value_info("total", F, [])][:body_outputs])
    consts = [numpy_helper.from_array(np.array(2, np.int64), "trips"), numpy_helper.from_array(np.array(True), "go")]
    return _model([helper.make_node("Loop", ["trips", "go", "x"], ["final", "totals"], body=body)],
                  [helper.make_tensor_value_info("x", F, [2])],
                  [helper.make_tensor_value_info("final", F, [2]), helper.make_tensor_value_info("totals", F, [2])],
                  consts)


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_loop_body_outputs_must_match_the_node(backend):
    """--reproduce 0:45 (control_flow, the Loop body's scan output dropped): the session was
    made and its run raised KeyError (native) for the node output no body output fed."""
    x = np.array([1.0, 2.0], np.float32)
    final, totals = shapeshift.InferenceSession(_control_flow(3), backend=backend).run(None, {"x": x})
    np.testing.assert_allclose(totals, [6.0, 12.0])
    with pytest.raises(InvalidModelError, match=r"node #0 \(Loop\): its body has 3 inputs and 2 outputs; "
                                                r"expected 3 and 3"):
        shapeshift.InferenceSession(_control_flow(2), backend=backend)


@pytest.mark.parametrize("op", ["Gemm", "Pad"])
def test_native_if_branch_that_does_not_type_check(op):
    """--reproduce 0:283 and 0:155 (control_flow, an else branch's Sub made a Gemm, or a Pad,
    of a matrix and a float scalar): the If rule types the other branch, but the native
    builder lowered this one on its stale types (AttributeError on a missing type,
    IndexError in the Gemm and Pad lowerings; Pad's type rule also took float pads). The
    branch not taken must not matter; taken, it is a clear error on both backends. Pad's
    float pads are a type its schema refuses (tensor(int64) only): refused at load, in a
    branch too, as onnxruntime refuses both models (it shape-checks the Gemm too)."""
    then_body = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                                  [helper.make_tensor_value_info("t", F, [3, 4])])
    else_body = helper.make_graph([helper.make_node(op, ["x", "two"], ["e"])], "else", [],
                                  [helper.make_tensor_value_info("e", F, [3, 4])])
    model = _model([helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
                    helper.make_node("Greater", ["total", "zero"], ["positive"]),
                    helper.make_node("If", ["positive"], ["y"], then_branch=then_body, else_branch=else_body)],
                   [helper.make_tensor_value_info("x", F, [3, 4])], [helper.make_tensor_value_info("y", F, [3, 4])],
                   [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
                    numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    x = np.ones((3, 4), np.float32)
    for backend in ("reference", "native"):
        if op == "Pad":
            with pytest.raises(InvalidModelError, match=r"\(Pad\): input 1 \('two'\) is tensor\(float\)"):
                shapeshift.InferenceSession(model, backend=backend)
            continue
        session = shapeshift.InferenceSession(model, backend=backend)
        (got,) = session.run(None, {"x": x})
        np.testing.assert_allclose(got, 2 * x)
        with pytest.raises(ShapeshiftError, match=rf"\({op}\)"):
            session.run(None, {"x": -x})


@pytest.mark.parametrize("start, shape", [(-2 ** 63, [2]), (0, [2 ** 63 - 1])])
def test_a_dim_past_int64_is_refused_at_load(start, shape):
    """--reproduce 0:1594 (a Range from INT64_MIN: simplify's export raised ValueError, native
    numpy's "Maximum allowed dimension exceeded") and 0:1747 (a Reshape to INT64_MAX: native
    OverflowError while planning): a static dim past 2**31-1 is a ShapeInferenceError."""
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("s", start), ("l", 3), ("d", 1))]
    consts.append(numpy_helper.from_array(np.array(shape, np.int64), "shape"))
    model = _model([helper.make_node("Range", ["s", "l", "d"], ["r"]),
                    helper.make_node("Reshape", ["x", "shape"], ["y"])],
                   [helper.make_tensor_value_info("x", F, ["n"])],
                   [helper.make_tensor_value_info("r", TensorProto.INT64, None),
                    helper.make_tensor_value_info("y", F, None)], consts)
    for backend in ("reference", "native"):
        with pytest.raises(ShapeInferenceError, match="a dimension must be from 0 to 2147483647"):
            shapeshift.InferenceSession(model, backend=backend)
    with pytest.raises(ShapeInferenceError):
        shapeshift.simplify(model)


@pytest.mark.parametrize("late", [False, True])
def test_native_buffers_larger_than_memory_are_an_error(late):
    """--reproduce 0:312 (a Range of 2**31-1 int64, 16 GiB): the native arena's allocation
    raised a bare MemoryError under the fuzzer's 4 GiB limit, and without one could take
    the machine's memory. More than physical memory is refused before allocating, for the
    arena (sized by the input symbols) and for a buffer sized by the data (late)."""
    big = 2 ** 31 - 1  # x [n] tiled big times: n * 8 GiB, past any machine's memory for n = 2 ** 10
    if late:  # the repeats are read at run time: the output is sized by the data
        model = _model([helper.make_node("ConstantOfShape", ["shape"], ["z"]), helper.make_node("Add", ["z", "x"], ["y"])],
                       [helper.make_tensor_value_info("x", F, ["n"]),
                        helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                       [helper.make_tensor_value_info("y", F, None)])
        feed = {"shape": np.array([big, 2 ** 10], np.int64)}
    else:
        model = _model([helper.make_node("Tile", ["x", "reps"], ["y"])],
                       [helper.make_tensor_value_info("x", F, ["n"])], [helper.make_tensor_value_info("y", F, None)],
                       [numpy_helper.from_array(np.array([big], np.int64), "reps")])
        feed = {}
    session = shapeshift.InferenceSession(model, backend="native")
    with pytest.raises(ExecutionError, match="more than this machine's memory"):
        session.run(None, {"x": np.ones(2 ** 10, np.float32), **feed})


def test_negative_tile_repeats_are_refused_at_load():
    """--reproduce 2026:478 --no-shared (indexing, Tile repeats [-2**31, 2] over x [k, 8]): the
    output dim k * -2**31 was symbolic, so nothing refused it; natively the buffers it sized
    overlapped and a kernel wrote gigabytes (different garbage at every run, or the process
    killed for memory)."""
    model = _model([helper.make_node("Tile", ["x", "reps"], ["y"])],
                   [helper.make_tensor_value_info("x", F, ["k", 8])], [helper.make_tensor_value_info("y", F, None)],
                   [numpy_helper.from_array(np.array([-2 ** 31, 2], np.int64), "reps")])
    for backend in ("reference", "native"):
        with pytest.raises(ShapeInferenceError, match="Tile repeats must be >= 0"):
            shapeshift.InferenceSession(model, backend=backend)


def test_native_refuses_a_negative_dim_before_any_kernel_runs():
    """The same class reached through a rule that allows it: Pad's negative pads crop, and
    x [n] cropped by 5 is [n - 5], negative for n < 5. Natively that was a negative extent
    handed to the kernels; now it is an error naming the value before anything runs."""
    model = _model([helper.make_node("Pad", ["x", "pads"], ["p"]), helper.make_node("Relu", ["p"], ["y"])],
                   [helper.make_tensor_value_info("x", F, ["n"])], [helper.make_tensor_value_info("y", F, None)],
                   [numpy_helper.from_array(np.array([-5, 0], np.int64), "pads")])
    session = shapeshift.InferenceSession(model, backend="native")
    np.testing.assert_array_equal(session.run(None, {"x": np.arange(8, dtype=np.float32)})[0], [5, 6, 7])
    with pytest.raises(ExecutionError, match=r"'y' would have shape \[-2\] for n=3: a dimension is negative"):
        session.run(None, {"x": np.arange(3, dtype=np.float32)})


@pytest.mark.parametrize("backend", ("reference", "native"))
def test_an_attribute_with_no_type_and_no_value_is_refused_at_load(backend):
    """``--reproduce 0:7147`` (distilbert.dynamo): a Transpose whose ``perm`` had neither a
    type nor a value; every reader took it as None, and the native lowering raised a
    TypeError iterating it."""
    node = helper.make_node("Transpose", ["x"], ["y"], name="t")
    node.attribute.add(name="perm")  # no type, no value
    model = _model([node], [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(InvalidModelError, match=r"node 't' \(Transpose\): attribute 'perm' has no type and no value"):
        shapeshift.InferenceSession(model, backend=backend)


@pytest.mark.parametrize("act", ("Relu", "SiLU"))
def test_native_conv_output_that_is_also_a_graph_output_keeps_its_value(act):
    """``--reproduce 0:5353`` (yolov8n with a Conv's output added to the graph's outputs):
    the Conv absorbed the x * Sigmoid(x) after it and stored the activated value in the one
    buffer both outputs read, so the Conv's own output came back activated (max error 5.3)."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    else:
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [1, 3, 6, 7])],
                   [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("c", F, None)],
                   [weight])
    feed = {"x": rng.standard_normal((1, 3, 6, 7)).astype(np.float32)}
    got = shapeshift.InferenceSession(model, backend="native").run(None, feed)
    for g, e in zip(got, _ort(model, feed)):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ("AveragePool", "MaxPool", "LpPool"))
@pytest.mark.parametrize("pads", ([0, 0, 64, 1], [3, 0, 1, 1], [0, 2, 0, 0]))
def test_a_pool_pad_not_smaller_than_its_kernel_is_refused_at_load(op, pads):
    """``--reproduce 0:5872`` (conv_net, AveragePool pads [0, 0, 64, 1] over a 2x2 kernel):
    windows wholly in the padding averaged nothing, NaN on the reference backend and 0
    natively; onnxruntime refuses such pads at load, and so do both backends now."""
    node = helper.make_node(op, ["x"], ["y"], name="pool", kernel_shape=[2, 2], pads=pads)
    model = _model([node], [helper.make_tensor_value_info("x", F, [1, 2, 5, 6])],
                   [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(Exception):
        _ort(model, {"x": np.zeros((1, 2, 5, 6), np.float32)})
    for backend in ("reference", "native"):
        with pytest.raises(InvalidModelError, match=r"node 'pool'.*'pads'.*not smaller than its kernel size 2"):
            shapeshift.InferenceSession(model, backend=backend)


# Found by the fuzz campaign of 2026-12-05 (generated graphs and mutated shared models, run
# natively and on onnxruntime in child processes; reproducers reduced by hand).


def test_conv_whose_output_channels_do_not_split_into_its_groups_is_refused_at_load():
    """M = 1 output channel with group 2 divided by zero in the depthwise kernel (SIGFPE);
    M = 4 with group 3 read past a staging buffer. onnxruntime refuses both."""
    for m, group, c in ((1, 2, 2), (4, 3, 3)):
        model = _model([helper.make_node("Conv", ["x", "w"], ["y"], group=group)],
                       [helper.make_tensor_value_info("x", F, [1, c, 3, 3])], [helper.make_tensor_value_info("y", F, None)],
                       [numpy_helper.from_array(np.ones([m, c // group, 1, 1], np.float32), "w")])
        with pytest.raises(ShapeInferenceError, match=f"output channels do not split into group {group}"):
            shapeshift.InferenceSession(model, backend="native")


@pytest.mark.parametrize("case", ["dilated-then-1x1", "kernel-past-input", "dense"])
def test_conv_output_plane_below_one_pixel_at_run_time_is_an_error(case):
    """Symbolic input sizes whose values leave a conv no output column: ppocr_det with a
    dilation mutated to [1, 2] ran its depthwise conv to an empty plane and the next conv
    divided by zero (SIGFPE); a 7 x 5 stride-3 depthwise conv fed 6 x 7 crashed the same
    way. onnxruntime refuses both inputs ("Invalid input shape"); a fitting input runs."""
    if case == "dilated-then-1x1":
        c = 8
        nodes = [helper.make_node("Conv", ["x", "w"], ["a"], group=c, kernel_shape=[5, 5], pads=[2, 2, 2, 2],
                                  dilations=[1, 2]),
                 helper.make_node("Conv", ["a", "w2"], ["y"], kernel_shape=[1, 1])]
        inits = [numpy_helper.from_array(np.ones([c, 1, 5, 5], np.float32), "w"),
                 numpy_helper.from_array(np.ones([c, c, 1, 1], np.float32), "w2")]
        bad, good = (1, c, 5, 4), (1, c, 5, 9)
    elif case == "dense":  # NCHW (no depthwise conv: the blocked layout stays off)
        c = 3
        nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[5, 5])]
        inits = [numpy_helper.from_array(np.ones([4, c, 5, 5], np.float32), "w")]
        bad, good = (1, c, 4, 9), (1, c, 5, 9)
    else:
        c = 3
        nodes = [helper.make_node("Conv", ["x", "w"], ["y"], group=c, kernel_shape=[7, 5], strides=[3, 3])]
        inits = [numpy_helper.from_array(np.ones([c, 1, 7, 5], np.float32), "w")]
        bad, good = (1, c, 6, 7), (1, c, 9, 7)
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [1, c, "H", "W"])],
                   [helper.make_tensor_value_info("y", F, None)], inits)
    session = shapeshift.InferenceSession(model, backend="native")
    with pytest.raises(ExecutionError, match="must be at least 1: the \\(dilated\\) kernel must fit"):
        session.run(None, {"x": np.ones(bad, np.float32)})
    x = np.random.default_rng(0).standard_normal(good).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], _ort(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_gather_elements_indices_longer_than_data_off_the_axis_is_refused():
    """Indices [2, 8] into data [2, 2] along axis 0: the kernel read past data (ASan:
    heap-buffer-overflow), where onnxruntime refuses it. Static sizes at load; symbolic ones
    when they are known; indices no longer than data everywhere but the axis still run."""
    def model(data, indices):
        return _model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=0)],
                      [helper.make_tensor_value_info("x", F, data),
                       helper.make_tensor_value_info("i", TensorProto.INT64, indices)],
                      [helper.make_tensor_value_info("y", F, None)])

    with pytest.raises(ShapeInferenceError, match="indices dimension 1 \\(8\\) exceeds data dimension 1"):
        shapeshift.InferenceSession(model([2, 2], [2, 8]), backend="native")
    session = shapeshift.InferenceSession(model(["a", "b"], ["c", "d"]), backend="native")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with pytest.raises(ExecutionError, match="dimension 1 of 'x' must be at least dimension 1 of 'i'"):
        session.run(None, {"x": x, "i": np.ones([2, 8], np.int64)})
    i = np.array([[1, 0], [0, 1], [1, 1]], np.int64)  # longer along the axis, narrower elsewhere
    np.testing.assert_array_equal(session.run(None, {"x": x, "i": i})[0], _ort(model(["a", "b"], ["c", "d"]),
                                                                                 {"x": x, "i": i})[0])


@pytest.mark.parametrize("case", ["from-shape", "from-shape-then-relu", "empty-to-scalar"])
def test_reshape_to_a_target_of_another_element_count_is_an_error(case):
    """A Reshape target made at run time whose element count differs from the input's:
    [N, 3] -> [N, 5] (the target from Shape, Gather, Concat with a constant) was a view
    reading past its source (ASan: heap-buffer-overflow), or a raw numpy ValueError where the
    view was a graph output; [5, 0, 5] -> [] (the target a graph input) read one element of an
    empty buffer (here [5, 0, 5] -> [2]). onnxruntime refuses them; a target of the right count
    still runs."""
    if case == "empty-to-scalar":
        model = _model([helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"])],
                       [helper.make_tensor_value_info("x", F, [5, 0, 5]),
                        helper.make_tensor_value_info("s", TensorProto.INT64, [None])],
                       [helper.make_tensor_value_info("y", F, None)])
        # (A target of length 0, [], is refused before the run: the declared dim's range
        # starts at 1.)
        bad = {"x": np.zeros([5, 0, 5], np.float32), "s": np.array([2], np.int64)}
        good = {"x": np.zeros([5, 0, 5], np.float32), "s": np.array([3, 0, 7], np.int64)}  # 0: dim 1 copied
        message = "node 'r' \\(Reshape\\)"
    else:
        relu = case.endswith("relu")
        nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
                 helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
                 helper.make_node("Concat", ["n1", "five"], ["tgt"], axis=0),
                 helper.make_node("Reshape", ["x", "tgt"], ["r" if relu else "y"])]
        nodes += [helper.make_node("Relu", ["r"], ["y"])] if relu else []
        model = _model(nodes, [helper.make_tensor_value_info("x", F, ["N", "M"])],
                       [helper.make_tensor_value_info("y", F, None)],
                       [numpy_helper.from_array(np.array(0, np.int64), "zero"),
                        numpy_helper.from_array(np.array([0], np.int64), "ax0"),
                        numpy_helper.from_array(np.array([5], np.int64), "five")])
        rng = np.random.default_rng(0)
        bad = {"x": rng.standard_normal((7, 3)).astype(np.float32)}
        good = {"x": rng.standard_normal((7, 5)).astype(np.float32)}
        message = "target shape's element count must equal the input's \\('x'\\) \\(got 35 and 21\\)"
    session = shapeshift.InferenceSession(model, backend="native")
    with pytest.raises(ExecutionError, match=message):
        session.run(None, bad)
    np.testing.assert_array_equal(session.run(None, good)[0], _ort(model, good)[0])


def test_nonzero_of_a_scalar_writes_its_coordinate(monkeypatch):
    """NonZero of a non-zero scalar: [1, 1] (onnxruntime's shape), whose one coordinate the
    kernel never wrote (no axis to unravel): about one fresh process in four returned
    whatever its buffer held. Here every run-time buffer starts as 0xA5 bytes."""
    from shapeshift.runtime import vm

    allocate = vm._allocate

    def dirty(nbytes, what, *rest):
        buffer = allocate(nbytes, what, *rest)
        buffer.view(np.uint8)[:] = 0xA5
        return buffer

    monkeypatch.setattr(vm, "_allocate", dirty)
    model = _model([helper.make_node("NonZero", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [])],
                   [helper.make_tensor_value_info("y", TensorProto.INT64, None)], opset=13)
    session = shapeshift.InferenceSession(model, backend="native")
    for value, want in ((0.5, [[0]]), (0.0, np.zeros((1, 0), np.int64)), (-2.0, [[0]])):
        feed = {"x": np.array(value, np.float32)}
        got = session.run(None, feed)[0]
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, _ort(model, feed)[0])


def test_invalid_attributes_and_inputs_are_clear_errors_not_raw_exceptions():
    """LRN with size 0 raised ZeroDivisionError in the lowering; Concat of scalars an
    IndexError; ConstantOfShape fed [2^62, 2^62] an OverflowError in the VM. Now the first
    two are refused at load naming the node and attribute, the third at run time."""
    x4 = helper.make_tensor_value_info("x", F, [1, 2, 3, 3])
    lrn = _model([helper.make_node("LRN", ["x"], ["y"], size=0)], [x4], [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(ShapeInferenceError, match="LRN\\): attribute size must be at least 1, got 0"):
        shapeshift.InferenceSession(lrn, backend="native")
    concat = _model([helper.make_node("Concat", ["x", "x"], ["y"], axis=0)], [helper.make_tensor_value_info("x", F, [])],
                    [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(ShapeInferenceError, match="Concat\\): inputs are scalars"):
        shapeshift.InferenceSession(concat, backend="native")
    fill = _model([helper.make_node("ConstantOfShape", ["s"], ["y"])],
                  [helper.make_tensor_value_info("s", TensorProto.INT64, [2])], [helper.make_tensor_value_info("y", F, None)])
    session = shapeshift.InferenceSession(fill, backend="native")
    with pytest.raises(ExecutionError, match="ConstantOfShape\\): its output would hold .* more than any machine"):
        session.run(None, {"s": np.array([2**62, 2**62], np.int64)})
    np.testing.assert_array_equal(session.run(None, {"s": np.array([2, 3], np.int64)})[0], np.zeros((2, 3)))


@pytest.mark.parametrize("location", ["missing.bin", "/etc/passwd", "../outside.bin"])
def test_external_data_that_cannot_be_read_is_an_invalid_model(location):
    """onnx's own ValidationError came out raw; no file outside the model's folder is read."""
    tensor = numpy_helper.from_array(np.ones([3], np.float32), "w")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "12")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", F, [3])],
                   [helper.make_tensor_value_info("y", F, None)], [tensor])
    with pytest.raises(InvalidModelError, match="tensor 'w': its data cannot be read"):
        shapeshift.InferenceSession(model, backend="native")


@pytest.mark.parametrize("n, pads", [(n, p) for n in (1, 4) for p in ((-2, 1), (1, -2), (-3, 2), (2, -1), (-1, 3),
                                                                       (-1, -1), (0, -2)) if n + sum(p) >= 0])
def test_constant_pad_that_crops_past_an_axis_has_the_typed_length(n, pads):
    """A length-1 axis with pads [-2, 1] came out [0.] (cropped to nothing, then padded by
    one), where the type rule and onnxruntime say length 0: the crop applies after the
    padding. Negative pads run on the NumPy evaluator (the native kernel takes none)."""
    model = _model([helper.make_node("Pad", ["x", "p"], ["y"], mode="constant")],
                   [helper.make_tensor_value_info("x", F, [n])], [helper.make_tensor_value_info("y", F, None)],
                   [numpy_helper.from_array(np.array(pads, np.int64), "p")])
    feed = {"x": np.arange(1, n + 1, dtype=np.float32)}
    got = shapeshift.InferenceSession(model, backend="native").run(None, feed)[0]
    want = _ort(model, feed)[0]
    assert got.shape == want.shape == (n + sum(pads),)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode, shape, scales", [
    ("pytorch_half_pixel", [1, 1, 1, 3, 7], [1, 1, 1.7, 0.5, 0.5]),  # 5-D: the NumPy evaluator
    ("tf_crop_and_resize", [1, 1, 3], [1, 1, 0.5]),
    ("tf_crop_and_resize", [1, 2, 5, 3], [1, 1, 0.3, 0.5]),
])
def test_resize_to_one_position_samples_as_onnxruntime(mode, shape, scales):
    """An axis resized to one output from a fractional length in (1, 2): 3 pixels at scale
    0.5 sampled (0 + 0.5) / 0.5 - 0.5 = 0.5 (pytorch_half_pixel) and the crop's start
    (tf_crop_and_resize), where onnxruntime tests the output size and samples 0 and the
    crop's middle."""
    rank = len(shape)
    model = _model([helper.make_node("Resize", ["x", "roi", "s"], ["y"], mode="linear",
                                     coordinate_transformation_mode=mode)],
                   [helper.make_tensor_value_info("x", F, shape)], [helper.make_tensor_value_info("y", F, None)],
                   [numpy_helper.from_array(np.array([0.0] * rank + [1.0] * rank, np.float32), "roi"),
                    numpy_helper.from_array(np.array(scales, np.float32), "s")], opset=13)
    feed = {"x": np.arange(np.prod(shape), dtype=np.float32).reshape(shape)}
    np.testing.assert_allclose(shapeshift.InferenceSession(model, backend="native").run(None, feed)[0],
                               _ort(model, feed)[0], rtol=1e-6, atol=1e-6)


def test_split_sizes_given_at_run_time_must_cut_the_axis():
    """Split sizes [2, 2] fed for an axis of 5: the last part took the rest ([2, 3, 4]), where
    onnxruntime refuses them; negative sizes the same. Sizes that add up still split."""
    model = _model([helper.make_node("Split", ["x", "s"], ["a", "b"], axis=0)],
                   [helper.make_tensor_value_info("x", F, ["n"]), helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                   [helper.make_tensor_value_info("a", F, None), helper.make_tensor_value_info("b", F, None)], opset=13)
    session = shapeshift.InferenceSession(model, backend="native")
    x = np.arange(5, dtype=np.float32)
    for sizes in ([2, 2], [6, -1], [1, 5]):
        with pytest.raises(ExecutionError, match=f"split sizes \\[{sizes[0]}, {sizes[1]}\\] do not cut axis 0 of size 5"):
            session.run(None, {"x": x, "s": np.array(sizes, np.int64)})
    feed = {"x": x, "s": np.array([2, 3], np.int64)}
    for got, want in zip(session.run(None, feed), _ort(model, feed)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("scale", [0.0, -1.0])
def test_resize_scales_that_are_not_positive_are_refused(scale):
    """A scale of 0 gave an empty output, and a negative one fed at run time too; onnxruntime
    refuses both. Constant scales at load, fed ones at run time."""
    scales = np.array([1, 1, scale, 2], np.float32)
    x = helper.make_tensor_value_info("x", F, [1, 1, 4, 4])
    y = helper.make_tensor_value_info("y", F, None)
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest")
    constant = _model([node], [x], [y], [numpy_helper.from_array(scales, "s")], opset=13)
    with pytest.raises(ShapeInferenceError, match="scales must be positive"):
        shapeshift.InferenceSession(constant, backend="native")
    fed = _model([node], [x, helper.make_tensor_value_info("s", F, [4])], [y], opset=13)
    session = shapeshift.InferenceSession(fed, backend="native")
    with pytest.raises(ExecutionError, match="scales must be positive"):
        session.run(None, {"x": np.ones((1, 1, 4, 4), np.float32), "s": scales})
    assert session.run(None, {"x": np.ones((1, 1, 4, 4), np.float32),
                              "s": np.array([1, 1, 0.5, 2], np.float32)})[0].shape == (1, 1, 2, 8)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_sequence_lens_past_the_sequence_are_refused(op):
    """sequence_lens of 6 for 5 steps (or -1) ran, each kernel clamping it, where onnxruntime
    refuses it; lengths within [0, T] still match onnxruntime."""
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    hidden, size, batch = 4, 3, 2
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((1, gates * hidden, size)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((1, gates * hidden, hidden)).astype(np.float32), "R")]
    model = _model([helper.make_node(op, ["x", "W", "R", "", "lens"], ["y"], hidden_size=hidden)],
                   [helper.make_tensor_value_info("x", F, ["t", batch, size]),
                    helper.make_tensor_value_info("lens", TensorProto.INT32, [batch])],
                   [helper.make_tensor_value_info("y", F, None)], inits, opset=14)
    session = shapeshift.InferenceSession(model, backend="native")
    x = rng.standard_normal((5, batch, size)).astype(np.float32)
    for lens in ([6, 3], [-1, 2]):
        with pytest.raises(ExecutionError, match=f"\\({op}\\): every sequence_lens value must be from 0 to the "
                                                 "sequence length \\(t\\)"):
            session.run(None, {"x": x, "lens": np.array(lens, np.int32)})
    feed = {"x": x, "lens": np.array([5, 3], np.int32)}
    np.testing.assert_allclose(session.run(None, feed)[0], _ort(model, feed)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize("op, attrs", [("Div", {}), ("Mod", {}), ("Mod", {"fmod": 1})])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_integer_division_by_zero_is_refused_as_onnxruntime_refuses_it(backend, op, attrs, dtype):
    """An integer Div or Mod by zero ran (each backend giving its own value: 0 natively, 1
    for -7 / 0 by the reference) where onnxruntime refuses the run; now both refuse it,
    naming the node, in a fused chain and over many elements (the loop on two threads) too,
    and divisors without a zero still match onnxruntime; MIN / -1 (which takes onnxruntime
    down with SIGFPE) gives the wrapped quotient and a remainder of 0."""
    t = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node(op, ["a", "b"], ["q"], **attrs), helper.make_node("Add", ["q", "a"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("a", t, ["n"]), helper.make_tensor_value_info("b", t, ["n"])],
                   [helper.make_tensor_value_info("y", t, ["n"])])
    session = shapeshift.InferenceSession(model, {"n": (1, 1 << 20)}, backend=backend, num_threads=2)
    info = np.iinfo(dtype)
    rng = np.random.default_rng(0)
    for n in (4, 1 << 18):
        a = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        b = rng.integers(1, 9, n, dtype=dtype)
        if info.min < 0:
            b[: n // 2] *= -1
        np.testing.assert_array_equal(session.run(None, {"a": a, "b": b})[0], _ort(model, {"a": a, "b": b})[0])
        if info.min < 0:
            a[0], b[0] = info.min, -1
            first = session.run(None, {"a": a, "b": b})[0][0]
            wrapped = (np.array([info.min], dtype) + np.array([info.min], dtype))[0]  # q + a where q = MIN
            assert first == (wrapped if op == "Div" else info.min)
        b[n - 1 - n // 3] = 0
        with pytest.raises(ExecutionError, match=f"\\({op}\\): integer division by zero"):
            session.run(None, {"a": a, "b": b})


def test_an_op_newer_than_the_models_opset_is_refused_at_load():
    """GatherElements (onnx opset 11) in an opset-7 model with one input reached the native
    lowering, which indexed its missing second input (IndexError); now the load refuses it,
    naming the node, the opset and the op's first one. (``--reproduce 1206:2932``)"""
    nodes = [helper.make_node("GatherElements", ["x"], ["y"], name="total")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [3])], [helper.make_tensor_value_info("y", F, [3])],
                   opset=7)
    for backend in ("native", "reference"):
        with pytest.raises(InvalidModelError, match=r"node 'total' \(GatherElements\).*opset 7 does not have "
                                                    r"GatherElements \(onnx added it in opset 11\)"):
            shapeshift.InferenceSession(model, backend=backend)
    # The same op at its own opset loads.
    nodes = [helper.make_node("GatherElements", ["x", "i"], ["y"], name="total")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [3]),
                           helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
                   [helper.make_tensor_value_info("y", F, [3])], opset=11)
    x, i = np.arange(3, dtype=np.float32), np.array([2, 0, 1], np.int64)
    np.testing.assert_array_equal(shapeshift.InferenceSession(model).run(None, {"x": x, "i": i})[0], x[i])


def test_an_extent_past_64_bits_is_refused_by_the_native_run():
    """A Pad by 2**63 - 1 makes an extent that int64 cannot hold: the native plan converted
    it with NumPy and raised OverflowError; now the run refuses it with an ExecutionError,
    as the reference backend does. (``--reproduce 1206:5881``)"""
    pads = numpy_helper.from_array(np.array([0, (1 << 63) - 1], np.int64), "pads")
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"], name="pad")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, ["n"])], [helper.make_tensor_value_info("y", F, None)],
                   [pads])
    for backend in ("native", "reference"):
        session = shapeshift.InferenceSession(model, backend=backend)
        with pytest.raises(ExecutionError):
            session.run(None, {"x": np.ones(5, np.float32)})


def test_a_parameter_no_graph_input_can_give_is_refused_by_the_export():
    """A mutant of yolov8n whose Resize took a float activation as its sizes left a Range's
    limit a static parameter over the Resize's data-dependent output dim; writing it back to
    ONNX raised ValueError. Simplify then refused the model, naming the Range and the dim;
    since c9b0ba9 import refuses it first, as onnxruntime does: Resize's sizes are
    tensor(int64) only. Not reduced: a small model with the same Resize simplified cleanly,
    so this is the campaign's own mutant (``--reproduce 1206:2229``), which needs
    ../shared/models."""
    from shapeshift.fuzz import mutate, runner
    from shapeshift.fuzz.seeds import SHARED_MODELS, SHARED_SEEDS, seeds

    missing = [name for name in SHARED_SEEDS if not (SHARED_MODELS / name).is_file()]
    if missing:
        pytest.skip(f"the mutant is drawn from the shared seed models; absent: {', '.join(missing)}")
    found = mutate.mutant(1206, 2229, seeds(shared=True))
    assert "yolov8n" in found.seed_model and "Resize" in " ".join(found.mutations)
    with pytest.raises(InvalidModelError, match=r"node '/model.13/Resize' \(Resize\): input 3 .* is "
                                                 r"tensor\(float\), where Resize \(opset 17\) takes tensor\(int64\)"):
        runner.run_path("simplify", found.model, found.feed)


def test_a_parameter_past_int64_is_refused_by_the_export_naming_the_node():
    """A Resize by 1e30 along a dynamic axis gives the output dim h * 10**30 (a float32's
    1e30, exactly), and a Range up to it a static parameter over that expression; writing
    the coefficient back to ONNX raised OverflowError inside NumPy. Simplify now refuses the
    model naming the Range and the integer (reduced from the campaign's yolov8n mutant
    ``--reproduce 1333:8447``, scales of 1e30); both sessions refuse it at run time."""
    inits = [numpy_helper.from_array(np.array([1, 1, 1e30, 1], np.float32), "scales")]
    inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("two", 2), ("zero", 0), ("one", 1))]
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest", name="resize"),
             helper.make_node("Shape", ["y"], ["s"]), helper.make_node("Gather", ["s", "two"], ["g"]),
             helper.make_node("Range", ["zero", "g", "one"], ["r"], name="range")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [1, 1, "h", 4])],
                   [helper.make_tensor_value_info("r", TensorProto.INT64, None)], inits)
    with pytest.raises(UnsupportedModelError, match=r"node 'range' \(Range\): its input 1 cannot be written back "
                                                    r"to ONNX: it holds the integer 1000000015047466219876688855040, "
                                                    r"past the 64-bit range"):
        shapeshift.simplify(model)
    for backend in ("reference", "native"):
        session = shapeshift.InferenceSession(model, backend=backend)
        with pytest.raises(ExecutionError):
            session.run(None, {"x": np.ones((1, 1, 2, 4), np.float32)})


@pytest.mark.parametrize("step, start, end", [((1 << 63) - 1, 1, 100), (-(1 << 63) + 1, -1, -100),
                                              ((1 << 63) - 1, 0, 1 << 62), (1 << 40, 2, -1)])
def test_a_slice_step_past_the_axis_keeps_one_element(step, start, end):
    """A Slice by 2**63 - 1 kept no row natively where it keeps one (the count's ceiling
    division added the step to the window and overflowed in C), and the next ops ran on the
    wrong shape; steps past the axis are now capped just past it, in the count and in the
    stride. Against onnxruntime, forward and backward, at several lengths of the sliced
    axis. (``--reproduce 1206:293``, the native path: a mismatch with the reference)"""
    consts = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
              (("starts", [start, 0]), ("ends", [end, 8]), ("axes", [0, 1]), ("steps", [step, 2]))]
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["s"]),
             helper.make_node("Pad", ["s", "pads"], ["y"])]
    consts.append(numpy_helper.from_array(np.array([0, 1, 2, 0], np.int64), "pads"))
    model = _model(nodes, [helper.make_tensor_value_info("x", F, ["n", 8])],
                   [helper.make_tensor_value_info("y", F, None)], consts)
    for backend in ("native", "reference"):
        session = shapeshift.InferenceSession(model, backend=backend)
        for n in (1, 2, 5, 7):
            x = np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)
            expected = _ort(model, {"x": x})[0]
            got = session.run(None, {"x": x})[0]
            assert got.shape == expected.shape, (backend, n)
            np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_a_softmax_row_holding_inf_matches_onnxruntime_on_both_backends(op):
    """A Gemm bias of +inf (fuzz mismatch 1206:9282) gave the reference backend 0 for the
    finite elements of the Softmax row where onnxruntime and the native kernel give NaN for
    all of it; rows with -inf, NaN and only finite values agree with onnxruntime too."""
    nodes = [helper.make_node(op, ["x"], ["y"], axis=1)]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [5, 4])],
                   [helper.make_tensor_value_info("y", F, [5, 4])])
    inf, nan = np.inf, np.nan
    x = np.array([[1, inf, 2, 3], [inf, inf, inf, inf], [-inf, -inf, -inf, -inf], [1, -inf, 2, 3], [1, nan, 2, 3]],
                 np.float32)
    expected = _ort(model, {"x": x})[0]
    for backend in ("native", "reference"):
        np.testing.assert_allclose(shapeshift.InferenceSession(model, backend=backend).run(None, {"x": x})[0], expected,
                                   rtol=1e-6, equal_nan=True)


def test_buffers_past_64_bits_of_bytes_are_refused_by_the_native_run():
    """A Conv padded by 2**31 - 1 on every side makes an output plane whose bytes pass int64:
    the native plan put its offset into an int64 array and raised OverflowError; now the run
    refuses it with an ExecutionError naming the input sizes. (``--reproduce 7:8843``)"""
    w = numpy_helper.from_array(np.ones((2, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[(1 << 31) - 1] * 4)]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [1, 3, "h", "w"])],
                   [helper.make_tensor_value_info("y", F, None)], [w])
    session = shapeshift.InferenceSession(model, backend="native")
    with pytest.raises(ExecutionError, match="h=5, w=4 would pass the 64-bit range of bytes"):
        session.run(None, {"x": np.ones((1, 3, 5, 4), np.float32)})


def test_a_slice_of_a_scalar_is_an_error_not_a_crash():
    """The native lowering indexed the input's shape by each axis unchecked: a Range turned
    Slice, Slice(0, 3, 1) over scalar constants whose output the model declares as int64[3]
    (the mutant of ``--reproduce 1320:7987``, reduced), raised an IndexError out of the
    build. The lowering now declines a Slice whose axes are not those of its input (or are
    computed at run time: the TypeError of ``--reproduce 1320:5515``), and the run is a clear
    error naming the node, as the reference backend's is."""
    consts = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
              (("zero_i", 0), ("three_i", 3), ("one_i", 1))]
    model = _model([helper.make_node("Slice", ["zero_i", "three_i", "one_i"], ["ramp"], name="range")], [],
                   [helper.make_tensor_value_info("ramp", TensorProto.INT64, [3])], consts)
    for backend in ("native", "reference"):
        with pytest.raises(ShapeshiftError, match="range"):
            shapeshift.InferenceSession(model, backend=backend).run(None, {})


def test_an_output_declared_with_the_wrong_shape_is_an_error_not_a_crash():
    """A Squeeze by axes known only at run time is a view of its input, planned with the
    shape the model declares for the output; declared [n, 3] over an [n, 8] input, the
    native run raised numpy's ValueError (cannot reshape) out of InferenceSession.run (the
    mutant of ``--reproduce 1320:9538``, GatherElements turned Squeeze, reduced). Now a clear
    error naming the node: a view op's element count is checked at run time where the types
    cannot prove it (codegen/lower/contracts.py)."""
    nodes = [helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1),
             helper.make_node("Squeeze", ["x", "indices"], ["y"], name="squeeze")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, ["n", 8])],
                   [helper.make_tensor_value_info("y", F, ["n", 3])],
                   [numpy_helper.from_array(np.array([3], np.int64), "k")])
    session = shapeshift.InferenceSession(model, backend="native")
    for n in (1, 5):
        with pytest.raises(ShapeshiftError, match="'squeeze'.*element count"):
            session.run(None, {"x": np.ones((n, 8), np.float32)})


def test_a_squeeze_declared_with_another_element_count_is_an_error_not_a_truncation():
    """Squeeze without axes over a dim the model leaves unknown ('?') has a rank inference
    cannot tell, so its output keeps the type the model declares; declared [batch, seq] over
    a [batch, seq, 16] input, the native backend made it a view of that shape and returned
    the first batch * seq elements, silently (the mutant of ``--reproduce 1320:3028``,
    reduced). A view op's element count is now checked at run time wherever the types
    cannot prove it, as Reshape's was; the reference backend (as onnxruntime) squeezes
    nothing and returns the [batch, seq, 16] values."""
    nodes = [helper.make_node("Add", ["x", "x"], ["res2"]), helper.make_node("Squeeze", ["res2"], ["pooled"],
                                                                          name="pool")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, ["batch", "seq", 16])],
                   [helper.make_tensor_value_info("res2", F, ["?", "seq", 16]),
                    helper.make_tensor_value_info("pooled", F, ["batch", "seq"])])
    native = shapeshift.InferenceSession(model, backend="native")
    reference = shapeshift.InferenceSession(model, backend="reference")
    for batch, seq in ((2, 5), (1, 3)):
        x = np.random.default_rng(batch).standard_normal((batch, seq, 16)).astype(np.float32)
        with pytest.raises(ShapeshiftError, match="'pool'.*element count"):
            native.run(None, {"x": x})
        np.testing.assert_array_equal(reference.run(None, {"x": x})[1], _ort(model, {"x": x})[1])


def test_a_slice_whose_axes_are_computed_at_run_time_is_an_error_not_a_crash():
    """Slice axes from a Shape hold symbols (the mutant of ``--reproduce 1320:5515`` gave a
    distilbert Slice the Shape of a [batch, 2, seq, 32] tensor as its axes; reduced here to
    the Shape of a [k] input): the native lowering took int() of a symbol and raised a
    TypeError out of the build. It now declines the Slice, and the run (an axis k >= 1 of a
    rank-1 tensor) is a clear error naming the node."""
    consts = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in (("starts", [0]), ("ends", [1]))]
    nodes = [helper.make_node("Shape", ["x"], ["dims"]), helper.make_node("Shape", ["z"], ["axes"]),
             helper.make_node("Slice", ["dims", "starts", "ends", "axes"], ["y"], name="the_slice")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 2, "seq"]),
                           helper.make_tensor_value_info("z", F, ["k"])],
                   [helper.make_tensor_value_info("y", TensorProto.INT64, None)], consts)
    session = shapeshift.InferenceSession(model, backend="native")
    x = np.zeros((3, 2, 5), np.float32)
    for k in (1, 4):
        with pytest.raises(ShapeshiftError, match="the_slice"):
            session.run(None, {"x": x, "z": np.zeros(k, np.float32)})



# Inputs the spec gives one element, each op with such an input fed [2, 3] (a scalar where
# it is fine), its node named "n": (op, inputs, outputs, consts, feed, output dtype[, attributes]).
_I64, _F32 = TensorProto.INT64, TensorProto.FLOAT
_BRANCHES = {"then_branch": helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [],
                                              [helper.make_tensor_value_info("t", F, [3])]),
             "else_branch": helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                                              [helper.make_tensor_value_info("e", F, [3])])}
_DOUBLING_BODY = {"body": helper.make_graph(
    [helper.make_node("Identity", ["c"], ["c2"]), helper.make_node("Add", ["s", "s"], ["s2"])], "body",
    [helper.make_tensor_value_info("i", _I64, []), helper.make_tensor_value_info("c", TensorProto.BOOL, []),
     helper.make_tensor_value_info("s", F, [3])],
    [helper.make_tensor_value_info("c2", TensorProto.BOOL, []), helper.make_tensor_value_info("s2", F, [3])])}
_ONE_ELEMENT_CASES = {
    "Clip": (["x", "lo"], {}, {"x": np.arange(3, dtype=np.float32), "lo": np.array([1, 2], np.float32)}, _F32),
    "If": (["c"], {}, {"x": np.arange(3, dtype=np.float32), "c": np.array([True, False])}, _F32, _BRANCHES),
    "Loop": (["M", "", "x"], {}, {"x": np.arange(3, dtype=np.float32), "M": np.array([2, 3], np.int64)}, _F32,
             _DOUBLING_BODY),
    "Range": (["a", "b", "c"], {"b": np.array(9, np.int64), "c": np.array(1, np.int64)},
              {"a": np.array([0, 1], np.int64)}, _I64),
    "TopK": (["x", "k"], {}, {"x": np.arange(5, dtype=np.float32), "k": np.array([2, 3], np.int64)}, _F32),
    "OneHot": (["x", "d", "v"], {"v": np.array([0, 1], np.float32)},
               {"x": np.array([0, 1, 2], np.int64), "d": np.array([4, 5], np.int64)}, _F32),
    "Trilu": (["x", "k"], {}, {"x": np.ones((3, 3), np.float32), "k": np.array([1, 2], np.int64)}, _F32),
    "Pad": (["x", "p", "c"], {"p": np.array([1, 1], np.int64)},
            {"x": np.ones(3, np.float32), "c": np.array([5, 6], np.float32)}, _F32),
    "CumSum": (["x", "axis"], {}, {"x": np.ones((2, 3), np.float32), "axis": np.array([0, 1], np.int64)}, _F32),
}


def _one_element_model(op, fed=True):
    """The case's model; with ``fed`` False its [2]-element input is a constant instead."""
    inputs, consts, feed, out_dtype, *attrs = _ONE_ELEMENT_CASES[op]
    outputs = ["y", "i"] if op == "TopK" else ["y"]
    graph_inputs, initializers = [], [numpy_helper.from_array(v, k) for k, v in consts.items()]
    for name in feed:  # the graph inputs (If's branches read x, which the node does not name)
        value = feed[name]
        if fed or value.shape != (2,):
            dims = ["two"] if value.shape == (2,) else list(value.shape)
            graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), dims))
        else:
            initializers.append(numpy_helper.from_array(value, name))
    outs = [helper.make_tensor_value_info(o, out_dtype if o == "y" else _I64, None) for o in outputs]
    node = helper.make_node(op, inputs, outputs, name="n", **(attrs[0] if attrs else {}))
    model = _model([node], graph_inputs, outs, initializers)
    return model, {k: v for k, v in feed.items() if fed or v.shape != (2,)}


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("op", sorted(_ONE_ELEMENT_CASES))
def test_an_input_of_one_element_given_two_is_an_error_naming_the_node(op, backend):
    """Range's start, TopK's k, OneHot's depth, Trilu's k, Pad's constant_value, CumSum's
    axis, Clip's min, If's condition and Loop's trip count hold one element; onnxruntime
    refuses two. Both backends took the first and ran
    (the fuzz campaign, seed 1330: a CumSum given a Slice's 2-element ends as its axis, the
    native build raising an IndexError). Now: refused at load when it is a constant, and
    an error naming the node and the input when it is fed."""
    model, feed = _one_element_model(op)
    with pytest.raises(Exception):
        _ort(model, feed)
    session = shapeshift.InferenceSession(model, backend=backend)
    with pytest.raises(ShapeshiftError, match="'n'.*input [0-9] .* must hold one element"):
        session.run(None, feed)
    model, feed = _one_element_model(op, fed=False)
    with pytest.raises(ShapeInferenceError, match="'n'.*must hold one element, got 2"):
        shapeshift.InferenceSession(model, backend=backend)


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("op", sorted(_ONE_ELEMENT_CASES))
def test_an_input_of_one_element_fed_one_runs_as_onnxruntime(op, backend):
    """The same models fed one element where they had two: the checks pass what is right."""
    model, feed = _one_element_model(op)
    feed = {k: (v[:1] if v.shape == (2,) else v) for k, v in feed.items()}
    session = shapeshift.InferenceSession(model, backend=backend)
    for got, want in zip(session.run(None, feed), _ort(model, feed)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_a_cumsum_axis_fed_at_run_time_past_the_rank_is_an_error_naming_the_node(backend):
    """CumSum's axis fed at run time: in range, onnxruntime's result; past the rank, an
    error naming the node (the native lowering leaves such an axis to the evaluator)."""
    model, _ = _one_element_model("CumSum")
    session = shapeshift.InferenceSession(model, backend=backend)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    for axis in ([0], [-1], [1]):
        feed = {"x": x, "axis": np.array(axis, np.int64)}
        np.testing.assert_allclose(session.run(None, feed)[0], _ort(model, feed)[0], rtol=1e-6)
    with pytest.raises(ShapeshiftError, match="'n'.*out of range"):
        session.run(None, {"x": x, "axis": np.array([2], np.int64)})


def _pads_folded_empty_model() -> onnx.ModelProto:
    """A reflect Pad whose pads come out of a chain that import's type rules cannot evaluate
    (a Slice from -1 to -2**63 + 1 with step 1: empty) but simplify folds: to no pads at all,
    for a rank-2 input."""
    def const(name, values):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64)))

    nodes = [const("two", [2]), const("p2", [0, 64]),
             helper.make_node("ConstantOfShape", ["two"], ["zeros"],
                              value=numpy_helper.from_array(np.array([0], np.int64))),
             helper.make_node("Concat", ["p2", "zeros"], ["p4"], axis=0), const("pairs", [-1, 2]),
             helper.make_node("Reshape", ["p4", "pairs"], ["by_axis"]),
             const("start", [-1]), const("end", [-(1 << 63) + 1]), const("axis", [0]), const("step", [1]),
             helper.make_node("Slice", ["by_axis", "start", "end", "axis", "step"], ["none"]),
             helper.make_node("Transpose", ["none"], ["flipped"]), const("flat", [-1]),
             helper.make_node("Reshape", ["flipped", "flat"], ["pads"]),
             helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect", name="pad")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, "n"])],
                  [helper.make_tensor_value_info("y", F, None)])


def test_pads_that_fold_to_the_wrong_count_are_a_clear_error_on_both_backends():
    """silero_vad's STFT padding with its flip's step mutated from -1 to 1 (and a Constant of
    the If's branch retyped): the pads fold to an empty tensor for a rank-2 input. Simplify's
    re-typing refused the Pad but left it its earlier types, and the native lowering indexed
    the missing pads: IndexError out of InferenceSession (the reference backend: an
    ExecutionError naming only the IndexError). Now the native builder leaves a node whose
    re-typing failed to the reference evaluator, which says what is wrong, on both backends.
    (``--reproduce 1335:3725``)"""
    model = _pads_folded_empty_model()
    for backend in ("native", "reference"):
        session = shapeshift.InferenceSession(model, backend=backend)
        with pytest.raises(ExecutionError, match=r"node 'pad' \(Pad\): 0 pads for 2 axes"):
            session.run(None, {"x": np.ones((1, 70), np.float32)})
    reasons = [step.reason for program in shapeshift.InferenceSession(model, backend="native")._executor.programs()
               for step in program.steps if step.node.op_type == "Pad"]
    assert reasons == ["types stale (node 'pad' (Pad): 0 pads for 2 axes)"], reasons
    # The chain unmutated (step -1: pads [0, 0, 0, 64]) still lowers and pads as onnxruntime does.
    valid = _pads_folded_empty_model()
    step = next(n for n in valid.graph.node if n.output == ["step"])
    step.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array([-1], np.int64)))
    x = np.random.default_rng(0).standard_normal((1, 70)).astype(np.float32)
    session = shapeshift.InferenceSession(valid, backend="native")
    assert not session._executor.program.fallback_ops()
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], _ort(valid, {"x": x})[0])


_HUGE = 2147483648  # 2**31 entries declared for a 1-D shape or axes input


@pytest.mark.parametrize("op,inputs,param,x_shape", [
    ("Unsqueeze", ["x", "p"], 1, [2, 3]), ("Squeeze", ["x", "p"], 1, [2, 3]), ("Reshape", ["x", "p"], 1, [2, 3]),
    ("Expand", ["x", "p"], 1, [2, 3]), ("Tile", ["x", "p"], 1, None), ("ConstantOfShape", ["p"], 0, None),
    ("Slice", ["x", "p", "p"], 1, [2, 3]),
])
@pytest.mark.parametrize("path", ["simplify", "reference", "native"])
def test_a_shape_input_declared_past_the_largest_rank_is_refused_at_once(op, inputs, param, x_shape, path):
    """--reproduce 1351:5196 (distilbert.dynamo, an Unsqueeze's axes declared
    int64[2147483648]): type inference made one fresh dim per declared entry, 2**31 of them,
    and ran for minutes towards gigabytes (4 GiB in 45 s, when the fuzz worker's address
    space ran out). A shape, axes or starts input has one entry per dimension, so a
    declared length past MAX_RANK (64) is refused, naming the node and the input. (Tile
    reads the length only where the data's rank is unknown, ConstantOfShape always.)"""
    from shapeshift.passes.simplify import simplify_model

    declared = [helper.make_tensor_value_info("p", TensorProto.INT64, [_HUGE])]
    if "x" in inputs:
        declared.insert(0, helper.make_tensor_value_info("x", F, x_shape))
    model = _model([helper.make_node(op, inputs, ["y"], name="n")], declared,
                   [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(ShapeInferenceError, match=rf"'n' \({op}\): input {param} is declared with {_HUGE} entries"):
        if path == "simplify":
            simplify_model(model)
        else:
            shapeshift.InferenceSession(model, backend=path)


def test_a_squeeze_of_more_axes_than_the_rank_is_refused():
    """The same bound the other way: Squeeze axes declared int64[5] on a rank-2 input would
    leave rank -3 (fresh_shape made an empty shape of it)."""
    model = _model([helper.make_node("Squeeze", ["x", "p"], ["y"], name="n")],
                   [helper.make_tensor_value_info("x", F, [2, 3]),
                    helper.make_tensor_value_info("p", TensorProto.INT64, [5])],
                   [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(ShapeInferenceError, match=r"'n' \(Squeeze\): its output would have rank -3"):
        shapeshift.InferenceSession(model, backend="reference")


@pytest.mark.parametrize("raised,kept", [(MemoryError, False), (ValueError, True)])
def test_a_type_rule_out_of_memory_is_not_taken_for_a_failed_rule(monkeypatch, raised, kept):
    """--reproduce 1351:5196 again: under the fuzz worker's address-space limit the runaway
    rule ended in a MemoryError, which inference took for a rule's bug (kept the declared
    types, recorded a warning) and went on; the memory stayed spent and a later mutant
    reported it. A rule's other exceptions still keep the declared types."""
    from shapeshift.passes import infer_types
    from shapeshift.passes.simplify import simplify_model

    real = infer_types.lookup

    class Failing:
        def infer(self, ctx):
            raise raised("from the rule")

    monkeypatch.setattr(infer_types, "lookup", lambda domain, op, opset: Failing() if op == "Relu"
                        else real(domain, op, opset))
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="n")], [helper.make_tensor_value_info("x", F, [2])],
                   [helper.make_tensor_value_info("y", F, [2])])
    if kept:
        simplify_model(model)
    else:
        with pytest.raises(MemoryError, match="from the rule"):
            simplify_model(model)


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_a_transpose_perm_with_a_negative_entry_is_refused_naming_the_node(backend):
    """--reproduce 1352:8387 (attention_block, a Transpose's perm = [0, -2, 1, 3]): inference
    read -2 as axis 2 and took the perm, then the native lowering of the attention's
    transposed views looked the raw -2 up: ``ValueError: 2 is not in list``. ONNX defines
    perm entries as 0 .. rank-1 (onnx's inference and onnxruntime refuse this one)."""
    model = _model([helper.make_node("Transpose", ["x"], ["y"], name="t", perm=[0, -2, 1, 3])],
                   [helper.make_tensor_value_info("x", F, [1, 2, 3, 4])], [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(ShapeInferenceError, match=r"'t' \(Transpose\): perm \[0, -2, 1, 3\] is not a permutation"):
        shapeshift.InferenceSession(model, backend=backend)


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_a_gather_nd_with_negative_batch_dims_is_refused_naming_the_node(backend):
    """--reproduce 1352:6551 (distilbert.dynamo, GatherND batch_dims = -1): the native
    lowering indexed the data's shape from -1 (``IndexError: tuple index out of range``);
    onnxruntime fails at run time with an integer overflow."""
    model = _model([helper.make_node("GatherND", ["d", "i"], ["y"], name="g", batch_dims=-1)],
                   [helper.make_tensor_value_info("d", F, [2, 3]),
                    helper.make_tensor_value_info("i", TensorProto.INT64, [2, 1])],
                   [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(ShapeInferenceError, match=r"'g' \(GatherND\): batch_dims=-1"):
        shapeshift.InferenceSession(model, backend=backend)
