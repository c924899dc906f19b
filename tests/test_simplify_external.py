"""``shapeshift simplify`` on a model with external data past protobuf's limit.

Such a model is read with its external data left in its file: a tensor simplify does
not read is never loaded, and is copied file to file into OUT's data file; one it
reads (a constant it folds) is read from the file.  The 2 GB threshold is lowered
here so that a small model takes that path (bench/simplify.py --large measures a
real 2.2 GB one: peak RSS, onnxruntime).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from shapeshift.cli import simplify_cmd
from shapeshift.cli.main import main
from shapeshift.frontend import onnx_export, onnx_import
from shapeshift.frontend.external_data import all_tensors, is_external


def _model() -> onnx.ModelProto:
    """x [batch, 4] @ W [4, 300] + (b1 + b2) (one Gemm after simplify), reshaped to [batch, 3, 100]
    through Shape(x)."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("W", (4, 300)), ("b1", (300,)), ("b2", (300,)))]
    weights.append(numpy_helper.from_array(np.array([3, 100], np.int64), "tail"))
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]),
             helper.make_node("Add", ["b1", "b2"], ["b"]),
             helper.make_node("Add", ["xw", "b"], ["y"]),
             helper.make_node("Shape", ["x"], ["s"], start=0, end=1),
             helper.make_node("Concat", ["s", "tail"], ["target"], axis=0),
             helper.make_node("Reshape", ["y", "target"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 3, 100])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def external_model(tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    path = source / "model.onnx"
    onnx.save(_model(), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx.data", size_threshold=1000)
    return path


def _outputs(model_path, batch: int):
    x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
    return ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_a_large_model_keeps_its_data_in_files_and_reads_only_what_it_folds(external_model, tmp_path, monkeypatch):
    monkeypatch.setattr(simplify_cmd, "EXTERNAL_DATA_THRESHOLD", 0)  # every model counts as over 2 GB
    read = []
    real = onnx_import._external_array

    def spy(tensor, directory):
        read.append(tensor.name)
        return real(tensor, directory)

    monkeypatch.setattr(onnx_import, "_external_array", spy)
    out = tmp_path / "out" / "simplified.onnx"
    assert main(["simplify", str(external_model), str(out), "--check", "2"]) == 0
    assert sorted(read) == ["b1", "b2"]  # folded into one bias; W is never loaded
    assert sorted(p.name for p in out.parent.iterdir()) == ["simplified.onnx", "simplified.onnx.data"]
    written = onnx.load(str(out), load_external_data=False)
    assert {t.name for t in all_tensors(written.graph) if is_external(t)} >= {"W"}
    assert all(t.external_data[0].value == "simplified.onnx.data" for t in all_tensors(written.graph)
               if is_external(t))
    assert sorted(n.op_type for n in written.graph.node) == ["Gemm", "Reshape"]  # W still the reference
    for batch in (1, 2, 5):
        np.testing.assert_allclose(_outputs(out, batch), _outputs(external_model, batch), rtol=1e-6, atol=1e-6)


def test_a_small_model_with_external_data_is_still_written_as_one_file(external_model, tmp_path):
    out = tmp_path / "out.onnx"
    assert main(["simplify", str(external_model), str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["out.onnx"]
    np.testing.assert_allclose(_outputs(out, 3), _outputs(external_model, 3), rtol=1e-6, atol=1e-6)


def test_a_truncated_data_file_is_an_error_naming_the_tensor_and_the_file(external_model, tmp_path, monkeypatch,
                                                                           capsys):
    monkeypatch.setattr(simplify_cmd, "EXTERNAL_DATA_THRESHOLD", 0)
    data = external_model.parent / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:100])
    assert main(["simplify", str(external_model), str(tmp_path / "out.onnx")]) != 0
    err = capsys.readouterr().err
    assert "model.onnx.data" in err and ("'b1'" in err or "'b2'" in err or "'W'" in err)
    assert not (tmp_path / "out.onnx").exists()


def test_a_loaded_external_tensor_is_written_back_as_it_is():
    """onnx.load sets data_location to DEFAULT when it loads external data: that tensor is
    still plain raw data (it was re-encoded from its array: two more copies of it)."""
    tensor = numpy_helper.from_array(np.ones(3, np.float32), "w")
    tensor.data_location = TensorProto.DEFAULT
    assert onnx_export._is_plain(tensor)
    tensor.doc_string = "a note"
    assert not onnx_export._is_plain(tensor)
