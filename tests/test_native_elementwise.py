"""The native backend's compiled float32 elementwise kernels, against onnxruntime.

Every op at several shapes (broadcast, scalar, large enough for OpenMP), a model with
symbolic dims at several sequence lengths from one build, and the missing-compiler error.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import shapeshift
from shapeshift.codegen import build
from shapeshift.codegen.elementwise import BINARY, UNARY
from shapeshift.errors import CompilerNotFoundError

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

RTOL, ATOL = 1e-5, 1e-6
UNARY_SHAPES = [(), (7,), (3, 1, 5), (64, 1024)]
BINARY_SHAPES = [
    ((3, 1), (1, 4)),
    ((), (2, 3)),
    ((2, 3), ()),
    ((2, 3, 4), (4,)),
    ((5, 6), (5, 6)),
    ((2, 1, 3), (4, 1)),
    ((64, 1024), (1024,)),  # large: the OpenMP path, strided
    ((128, 512), (128, 512)),  # large: the OpenMP path, contiguous
]


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("shapeshift-cache")


@pytest.fixture(autouse=True)
def _cache_dir(monkeypatch, module_cache):
    # One cache per module: the same op's kernel is built once for all its shape cases.
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(module_cache))


def _model(op: str, ranks: list[int]) -> onnx.ModelProto:
    """One ``op`` node whose inputs have the given ranks and all-symbolic dims."""
    names = "ab"[:len(ranks)]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [f"{n}{d}" for d in range(r)])
              for n, r in zip(names, ranks)]
    node = helper.make_node(op, list(names), ["y"])
    graph = helper.make_graph([node], op.lower(), inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _random(shape, op, rng) -> np.ndarray:
    x = np.asarray(rng.standard_normal(shape), dtype=np.float32)  # an array even for shape ()
    if op in ("Log", "Sqrt", "Div"):
        x = np.asarray(np.abs(x) + np.float32(0.5))  # in the domain; no division by ~0
    return x


def _check(op: str, shapes: list[tuple]) -> None:
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    model = _model(op, [len(s) for s in shapes])
    feed = {n: _random(s, op, rng) for n, s in zip("ab", shapes)}
    session = shapeshift.InferenceSession(model, backend="native")
    got = session.run(None, feed)[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert session._executor.native_calls == 1 and session._executor.fallback_calls == 0


@pytest.mark.parametrize("shape", UNARY_SHAPES, ids=str)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_matches_onnxruntime(op, shape):
    _check(op, [shape])


@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_matches_onnxruntime(op, shapes):
    _check(op, list(shapes))


def test_non_contiguous_and_other_dtypes_fall_back_or_copy():
    from shapeshift.codegen.native_elementwise import NativeElementwise
    from shapeshift.frontend.onnx_import import import_model

    graph = import_model(_model("Sub", [2, 2]), {})
    kernels = NativeElementwise(graph)
    node = graph.nodes[0]
    a = np.arange(12, dtype=np.float32).reshape(3, 4).T  # a transposed view
    b = np.ones((1, 3), np.float32)
    np.testing.assert_array_equal(kernels.run_node(node, [a, b])[0], a - b)
    assert not kernels.accepts(node, [a.astype(np.float64), b])


def _encoder_feed(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seq)
    return {"input_ids": rng.integers(0, 100, size=(batch, seq), dtype=np.int64),
            "attention_mask": np.ones((batch, seq), dtype=np.int64)}


def test_encoder_matches_onnxruntime_with_one_build(encoder_path, tmp_path, monkeypatch):
    import onnxruntime as ort

    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "fresh"))
    calls = []
    real = build._run_compiler
    monkeypatch.setattr(build, "_run_compiler", lambda cmd: calls.append(cmd) or real(cmd))

    session = shapeshift.InferenceSession(encoder_path, backend="native")
    assert len(calls) == 1
    reference = ort.InferenceSession(str(encoder_path), providers=["CPUExecutionProvider"])
    for seq in (1, 7, 33):
        feed = _encoder_feed(2, seq)
        got = session.run(None, feed)[0]
        want = reference.run(None, feed)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert len(calls) == 1  # new sequence lengths, no new build
    assert session._executor.native_calls > 0

    # A second session finds the library in the cache.
    shapeshift.InferenceSession(encoder_path, backend="native")
    assert len(calls) == 1


def test_reference_backend_builds_nothing(encoder_path, monkeypatch):
    monkeypatch.setattr(build, "_run_compiler", lambda cmd: pytest.fail("the reference backend compiled C"))
    session = shapeshift.InferenceSession(encoder_path)
    assert session.run(None, _encoder_feed(1, 4))[0].shape == (1, 4, 32)


def test_missing_compiler_is_a_clear_error_at_session_creation(encoder_path, tmp_path, monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "fresh"))
    monkeypatch.setenv("SHAPESHIFT_CC", "/nonexistent/cc")
    with pytest.raises(CompilerNotFoundError, match="no C compiler found.*SHAPESHIFT_CC=/nonexistent/cc"):
        shapeshift.InferenceSession(encoder_path, backend="native")
