"""InferenceSession on the bundled encoder: numerics vs onnxruntime, metadata, feed errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import shapeshift
from shapeshift import errors


def _feed(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[0, seq // 2:] = 0  # a padded row exercises the mask path
    return {"input_ids": rng.integers(0, 100, (batch, seq)).astype(np.int64), "attention_mask": mask}


@pytest.fixture(scope="module", params=["native", "reference"])
def session(encoder_path, request):
    return shapeshift.InferenceSession(encoder_path, dynamic={"batch": (1, 4), "seq": (1, 64)}, backend=request.param)


def test_a_model_runs_on_the_native_backend_by_default(encoder_path):
    import onnxruntime as ort

    session = shapeshift.InferenceSession(encoder_path, dynamic={"batch": (1, 4), "seq": (1, 64)})
    assert session.backend == "native"
    reference = ort.InferenceSession(str(encoder_path), providers=["CPUExecutionProvider"])
    for batch, seq in ((1, 1), (3, 17), (4, 64)):
        feed = _feed(batch, seq)
        np.testing.assert_allclose(session.run(None, feed)[0], reference.run(None, feed)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch,seq", [(1, 1), (2, 7), (3, 64), (4, 33)])
def test_matches_onnxruntime_at_many_shapes(session, encoder_path, batch, seq):
    import onnxruntime as ort

    feed = _feed(batch, seq)
    want = ort.InferenceSession(str(encoder_path), providers=["CPUExecutionProvider"]).run(None, feed)
    got = session.run(None, feed)
    assert got[0].shape == (batch, seq, 32) and got[0].dtype == np.float32
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def test_inputs_and_outputs_are_described_like_onnxruntime(session):
    inputs = session.get_inputs()
    assert [(i.name, i.shape, i.type) for i in inputs] == [
        ("input_ids", ["batch", "seq"], "tensor(int64)"),
        ("attention_mask", ["batch", "seq"], "tensor(int64)"),
    ]
    (out,) = session.get_outputs()
    assert (out.name, out.shape, out.type) == ("last_hidden_state", ["batch", "seq", 32], "tensor(float)")


def test_output_names_select_outputs(session):
    (only,) = session.run(["last_hidden_state"], _feed(1, 3))
    assert only.shape == (1, 3, 32)
    with pytest.raises(errors.UnknownOutputError, match="'nope'"):
        session.run(["nope"], _feed(1, 3))


def test_symbol_binding(session):
    assert session.bind(_feed(2, 9)) == {"batch": 2, "seq": 9}


@pytest.mark.parametrize("mutate,error,pattern", [
    (lambda f: f.pop("attention_mask"), errors.MissingInputError, "'attention_mask'"),
    (lambda f: f.update(extra=np.zeros(1)), errors.UnknownInputError, "'extra'"),
    (lambda f: f.update(input_ids=f["input_ids"].astype(np.int32)), errors.InputDtypeError, "'input_ids'.*int64"),
    (lambda f: f.update(input_ids=f["input_ids"][0]), errors.InputRankError, "'input_ids'.*rank 2"),
    (lambda f: f.update(attention_mask=np.ones((2, 6), np.int64)), errors.SymbolConflictError, "'seq' is 5"),
    (lambda f: f.update(input_ids=np.zeros((2, 65), np.int64), attention_mask=np.ones((2, 65), np.int64)),
     errors.SymbolRangeError, r"'seq' = 65 .*\[1, 64\]"),
    (lambda f: f.update(input_ids=np.zeros((5, 5), np.int64), attention_mask=np.ones((5, 5), np.int64)),
     errors.SymbolRangeError, r"'batch' = 5"),
    (lambda f: f.update(input_ids=[[1.5, 2.0]]), errors.InputDtypeError, "'input_ids'.*float64"),
    # Arrays the native kernels would read as other numbers: Python objects (a mixed pandas
    # frame's .values) and big-endian bytes.
    (lambda f: f.update(input_ids=f["input_ids"].astype(object)), errors.InputDtypeError,
     "'input_ids'.*Python objects.*astype\\(np.int64\\)"),
    (lambda f: f.update(attention_mask=f["attention_mask"].astype(">i8")), errors.InputDtypeError,
     "'attention_mask'.*opposite byte order.*astype\\(np.int64\\)"),
    (lambda f: f.update(input_ids=[[1, 2], [3]]), errors.InputError, "'input_ids': not a rectangular array"),
])
def test_bad_feeds_raise_clear_errors(session, mutate, error, pattern):
    feed = _feed(2, 5)
    mutate(feed)
    with pytest.raises(error, match=pattern):
        session.run(None, feed)
    assert issubclass(error, errors.ShapeshiftError)


def _static_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_static_dim_mismatch_names_the_dimension():
    session = shapeshift.InferenceSession(_static_model(), backend="reference")
    with pytest.raises(errors.InputShapeError, match="'x': dimension 1 must be 3, got 4"):
        session.run(None, {"x": np.zeros((2, 4), np.float32)})


def test_expression_dims_are_solved_and_checked():
    """A dim declared as `past+seq` binds `past` from it and checks it."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["seq"])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["past+seq"])
    out = helper.make_tensor_value_info("c", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Concat", ["a", "b"], ["c"], axis=0)], "g", [a, b], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = shapeshift.InferenceSession(model, backend="reference")
    assert session.bind({"a": np.zeros(3, np.float32), "b": np.zeros(5, np.float32)}) == {"seq": 3, "past": 2}
    got = session.run(None, {"a": np.ones(3, np.float32), "b": np.zeros(5, np.float32)})[0]
    assert got.shape == (8,)


def test_sources_path_bytes_and_proto_agree(encoder_path):
    feed = _feed(1, 4)
    results = [shapeshift.InferenceSession(src).run(None, feed)[0]
               for src in (encoder_path, str(encoder_path), encoder_path.read_bytes(), onnx.load(encoder_path))]
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_unknown_backend_is_refused(encoder_path):
    with pytest.raises(errors.ShapeshiftError, match="unknown backend 'gpu'"):
        shapeshift.InferenceSession(encoder_path, backend="gpu")


def test_native_runs_read_only_feeds_and_return_outputs_of_their_own(encoder_path):
    # A read-only feed takes the VM's slow way to its address; outputs are fresh copies of
    # arena views the VM keeps per shape, so a result must survive later runs (of the same
    # shape, and larger ones, which reallocate the arena) and a caller's edits must not leak.
    import onnxruntime as ort

    session = shapeshift.InferenceSession(encoder_path, dynamic={"batch": (1, 4), "seq": (1, 64)}, backend="native")
    reference = ort.InferenceSession(str(encoder_path), providers=["CPUExecutionProvider"])
    kept = []
    for batch, seq in ((1, 3), (4, 64), (1, 3), (2, 9), (1, 3)):
        feed = _feed(batch, seq, seed=seq + len(kept))
        read_only = {k: np.frombuffer(v.tobytes(), v.dtype).reshape(v.shape) for k, v in feed.items()}
        assert not read_only["input_ids"].flags.writeable
        got = session.run(None, read_only)[0]
        kept.append((got, got.copy(), reference.run(None, feed)[0]))
        got[...] = np.nan if len(kept) % 2 else got  # some callers write into what they got
    for got, at_return, want in kept[1::2]:
        np.testing.assert_array_equal(got, at_return)
    for _, at_return, want in kept:
        np.testing.assert_allclose(at_return, want, rtol=1e-4, atol=1e-4)


def test_a_feed_that_is_no_mapping_is_refused(session):
    with pytest.raises(errors.InputError, match="must map input names to arrays .* got a list"):
        session.run(None, [np.zeros((1, 3), np.int64)])


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_an_if_whose_taken_branch_does_not_type_check_is_refused(backend):
    """The condition comes from data, so both branches stay; the else branch multiplies
    [N, 4] by [3, 2] and cannot type-check, so the If's types are the then branch's. Taking
    it is an error that names the If, the branch and why, on both backends."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    weights = [onnx.numpy_helper.from_array(np.ones((4, 2), np.float32), "w_ok"),
               onnx.numpy_helper.from_array(np.ones((3, 2), np.float32), "w_bad"),
               onnx.numpy_helper.from_array(np.array(0, np.float32), "zero")]
    then = helper.make_graph([helper.make_node("MatMul", ["x", "w_ok"], ["t"], name="mm_ok")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("MatMul", ["x", "w_bad"], ["e"], name="mm_bad")], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["r"], name="the_if", then_branch=then, else_branch=other),
             helper.make_node("Relu", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                              weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = shapeshift.InferenceSession(model, backend=backend)
    for n in (1, 5):
        feed = np.random.default_rng(n).uniform(0.5, 1.5, (n, 4)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": feed})[0], feed @ np.ones((4, 2), np.float32), rtol=1e-6)
        with pytest.raises(errors.ExecutionError, match=r"'the_if' \(If\): the condition chose the else_branch, "
                                                        r"which does not type-check: node 'mm_bad'.*4 != 3"):
            sess.run(None, {"x": -feed})
