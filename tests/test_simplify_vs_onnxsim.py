"""``shapeshift simplify`` leaves no more nodes and no more Shape ops than onnx-simplifier.

Counted on every model in ../shared/models and on the models bench/simplify.py
builds for the fusions (a dynamo-style encoder, a conv net with BatchNormalization),
subgraph nodes included for both tools, with bench/simplify.py's own counting.
onnx-simplifier runs with its defaults (about 3 s for all of them on this machine).

SSDlite320 once kept two Shape ops of its image (height and width, each sliced and
reshaped to a scalar) where onnx-simplifier keeps one Shape and two Gathers: its
Shape count is checked on its own, with its outputs against onnxruntime's on the
original at three image sizes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest

from shapeshift.passes.simplify import simplify_model

from .conftest import SHARED_MODELS, shared_model
from .shared_models import assert_same_outputs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import simplify as bench  # noqa: E402

onnxsim = pytest.importorskip("onnxsim")

SHARED = sorted(p.name for p in SHARED_MODELS.glob("*.onnx")) if SHARED_MODELS.is_dir() else []
SSDLITE = "ssdlite320_mobilenet_v3_large.ts.onnx"


def _counts(model: onnx.ModelProto) -> tuple[int, int]:
    stats = bench.model_stats(model)
    return stats["nodes"], stats["shape_ops"]


def _onnxsim(model: onnx.ModelProto) -> onnx.ModelProto:
    simplified, ok = onnxsim.simplify(model)
    assert ok, "onnx-simplifier's own check failed"
    return simplified


def _compare(model: onnx.ModelProto) -> None:
    ours = _counts(simplify_model(model)[0])
    theirs = _counts(_onnxsim(model))
    assert ours[0] <= theirs[0] and ours[1] <= theirs[1], f"nodes / Shape ops: ours {ours}, onnxsim {theirs}"


@pytest.mark.models
@pytest.mark.parametrize("name", SHARED or [pytest.param(SSDLITE, marks=pytest.mark.skip(
    reason=f"{SHARED_MODELS} is absent"))])
def test_no_more_nodes_or_shape_ops_than_onnxsim_on_shared_models(name):
    _compare(onnx.load(str(shared_model(name))))


@pytest.mark.parametrize("name", bench.BUILT_MODELS)
def test_no_more_nodes_or_shape_ops_than_onnxsim_on_built_models(name):
    _compare(bench.BUILDERS[name]())


@pytest.mark.models
def test_ssdlite_keeps_one_shape_of_its_image_and_its_outputs():
    import onnxruntime as ort

    path = shared_model(SSDLITE)
    simplified = simplify_model(path)[0]
    assert _counts(simplified)[1] <= 182  # onnx-simplifier 0.8.1: 182; shapeshift before: 183
    image_shapes = [n for n in simplified.graph.node if n.op_type == "Shape" and n.input[0] == "images"]
    assert len(image_shapes) == 1 and not image_shapes[0].attribute
    original = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    candidate = ort.InferenceSession(simplified.SerializeToString(), providers=["CPUExecutionProvider"])
    assert_same_outputs(original, candidate, SSDLITE)
