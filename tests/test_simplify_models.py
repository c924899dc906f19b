"""Simplify on the real models of ../shared/models: same outputs, Shape chains gone.

Every simplified model gives onnxruntime's outputs of the original at three
values of each dynamic dim.  On the TorchScript BERT and GPT-2 and the dynamo
DistilBERT, no Shape op is left inside shapeshift's graph, and every Shape op
of the exported model reads a graph input directly (the shared computation of
symbolic parameters).
"""

from __future__ import annotations

import onnx
import pytest

from shapeshift.passes.simplify import simplify_model

from .conftest import shared_model
from .shared_models import FEEDS, assert_same_outputs

pytestmark = pytest.mark.models
TRANSFORMERS = ["bert.ts.onnx", "distilbert.dynamo.onnx", "gpt2_past.ts.onnx"]


def _ort(model):
    import onnxruntime as ort

    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", sorted(FEEDS))
def test_simplified_model_matches_original(name):
    path = shared_model(name)
    simplified, graph, stats = simplify_model(path, check=True)
    onnx.checker.check_model(simplified, full_check=True)
    original, candidate = _ort(path), _ort(simplified)
    assert [o.name for o in simplified.graph.output] == [o.name for o in onnx.load(str(path)).graph.output]
    assert_same_outputs(original, candidate, name)


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_no_shape_chain_left(name):
    path = shared_model(name)
    simplified, graph, _ = simplify_model(path)
    assert not [n for n in graph.walk_nodes() if n.op_type == "Shape"]
    inputs = {i.name for i in simplified.graph.input}
    shape_ops = [n for n in simplified.graph.node if n.op_type == "Shape"]
    assert all(n.input[0] in inputs for n in shape_ops), [n.input[0] for n in shape_ops]
    assert len(shape_ops) <= 3


def _dims(value_info, model) -> list:
    """Output dims, with symbols made up during inference (numbered per run) shown as '?'."""
    named = {d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param if d.dim_param in named else "?")
            for d in value_info.type.tensor_type.shape.dim]


@pytest.mark.parametrize("name", ["bert.ts.onnx", "vit_interp.ts.onnx", "silero_vad.onnx", "yolov8n_nudenet.320n.onnx"])
def test_strategies_reach_the_same_model(name):
    """incremental, fixpoint and per-op differ in scheduling only: same ops, same outputs."""
    import collections

    path = shared_model(name)
    results = {}
    for strategy in ("incremental", "fixpoint", "per-op"):
        model = simplify_model(path, strategy=strategy)[0]
        ops = collections.Counter(n.op_type for n in model.graph.node)
        results[strategy] = (ops, [(o.name, _dims(o, model)) for o in model.graph.output])
    assert results["incremental"] == results["fixpoint"] == results["per-op"]
