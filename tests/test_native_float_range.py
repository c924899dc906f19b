"""A float Range over a cast dim (``torch.arange(w).float()``, as detection heads build their
anchors) runs natively in one segment once its dims' ranges are declared, and matches
onnxruntime at every width, ragged ones included (passes/simplify/rules.py,
``range_of_cast_integer``)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift


def _anchor_model(start: float, delta: float):
    consts = [numpy_helper.from_array(np.array(v, np.float32), name)
              for name, v in (("start", start), ("delta", delta), ("half", 0.5))]
    consts.append(numpy_helper.from_array(np.array(3, np.int64), "axis3"))
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "axis3"], ["w"], axis=0),
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


@pytest.mark.parametrize("start, delta", [(0.0, 1.0), (-2.0, 1.0), (1.0, 3.0)])
def test_anchor_range_runs_in_one_native_segment_like_onnxruntime(start, delta, tmp_path, monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "cache"))
    model = _anchor_model(start, delta)
    session = shapeshift.InferenceSession(model, {"h": (1, 64), "w": (1, 300)}, backend="native")
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
