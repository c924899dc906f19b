"""A float Range over a cast dim (``torch.arange(w).float()``, as detection heads build their
anchors) runs natively in one segment, its length a dim of the input's, and matches
onnxruntime at every width, ragged ones included (passes/simplify/rules.py,
``range_of_cast_integer``). Where the dims' ranges do not prove every value a whole number
the float type holds, a run-time check ahead of the Range's kernel refuses a limit past
that, naming it (codegen/lower/contracts.py)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.errors import ExecutionError


def _anchor_model(start: float, delta: float, scale: int = 1):
    consts = [numpy_helper.from_array(np.array(v, np.float32), name)
              for name, v in (("start", start), ("delta", delta), ("half", 0.5))]
    consts += [numpy_helper.from_array(np.array(3, np.int64), "axis3"),
               numpy_helper.from_array(np.array(scale, np.int64), "scale")]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "axis3"], ["w1"], axis=0),
             helper.make_node("Mul", ["w1", "scale"], ["w"]),
             helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Range", ["start", "wf", "delta"], ["r"]),
             helper.make_node("Add", ["r", "half"], ["centres"]),
             # Scaled by the last centre: the Range's values and length both reach an output.
             helper.make_node("ReduceMax", ["centres"], ["last"], keepdims=0),
             helper.make_node("Mul", ["x", "last"], ["y"])]
    graph = helper.make_graph(nodes, "anchors", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                               [1, 2, "h", "w"])],
                              [helper.make_tensor_value_info("centres", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "undeclared"])
@pytest.mark.parametrize("start, delta", [(0.0, 1.0), (-2.0, 1.0), (1.0, 3.0)])
def test_anchor_range_runs_in_one_native_segment_like_onnxruntime(start, delta, declared, tmp_path, monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "cache"))
    model = _anchor_model(start, delta)
    session = shapeshift.InferenceSession(model, {"h": (1, 64), "w": (1, 300)} if declared else None,
                                          backend="native")
    program = session._executor.programs()[0]
    assert not program.late_symbols and len(program.segments) == 1 and not program.fallback_ops()
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for h, w in [(1, 1), (5, 7), (3, 33), (64, 100), (2, 300)]:
        if w - start <= 0:
            continue
        x = rng.standard_normal((1, 2, h, w)).astype(np.float32)
        got, expected = session.run(None, {"x": x}), reference.run(None, {"x": x})
        assert got[0].shape == expected[0].shape == (len(range(int(start), w, int(delta))),)
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g, e, err_msg=f"h={h} w={w}")


def test_limit_past_the_floats_whole_numbers_is_refused_by_name(tmp_path, monkeypatch):
    """Undeclared dims prove nothing: w * 2^22 passes 2^24 at w = 4, where a float32 limit
    is no longer every whole number, and the run is refused there (not run with a length
    the float Range would not have); w = 3 runs, 12288 values like onnxruntime's."""
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "cache"))
    model = _anchor_model(0.0, 1024.0, scale=1 << 22)
    session = shapeshift.InferenceSession(model, backend="native")
    program = session._executor.programs()[0]
    assert not program.late_symbols and len(program.segments) == 1
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.ones((1, 2, 1, 3), np.float32)
    got, expected = session.run(None, {"x": x}), reference.run(None, {"x": x})
    assert got[0].shape == expected[0].shape == (12288,)
    np.testing.assert_array_equal(got[0], expected[0])
    with pytest.raises(ExecutionError, match="Range.*limit.*whole numbers.*got 16776191 and 16777216"):
        session.run(None, {"x": np.ones((1, 2, 1, 4), np.float32)})
