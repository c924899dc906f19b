"""Import and export: round trips, symbols, external data, and every kind of bad model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import shapeshift
from shapeshift import errors
from shapeshift.ir.types import TensorType
from shapeshift.symbolic import Expr


def _model(nodes, inputs, outputs, opset=17, initializers=(), domains=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    return model


def test_dim_params_become_symbols_and_unnamed_dims_fresh_ones():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", None, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = shapeshift.load(_model([helper.make_node("Relu", ["x"], ["y"])], [x], [y]), dynamic={"batch": (1, 8)})
    batch, fresh, four = graph.inputs[0].type.shape
    assert isinstance(batch, Expr) and batch.as_symbol().name == "batch" and (batch.lo, batch.hi) == (1, 8)
    assert isinstance(fresh, Expr) and fresh is not batch and four == 4
    assert graph.outputs[0].type == graph.inputs[0].type


def _reshape_to_unknown_rank(value_info):
    """Reshape(x, s) with s of unknown length: inference cannot tell the output's rank."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [None])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    model = _model(nodes, [x, s], [y])
    model.graph.value_info.append(value_info)
    return model


def test_a_declared_intermediate_type_is_kept_where_inference_knows_less():
    # value_info says r is [a, 4]; inference alone gives r an unknown rank, and the
    # declared shape flows on to y.
    graph = shapeshift.load(_reshape_to_unknown_rank(
        helper.make_tensor_value_info("r", TensorProto.FLOAT, ["a", 4])))
    r = graph.nodes[0].outputs[0]
    assert r.type.shape[1] == 4 and r.type.shape[0].as_symbol().name == "a"
    assert graph.outputs[0].type == r.type
    # Where inference knows as much, it wins over what was declared (here a wrong shape).
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
    model = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])], [x],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model.graph.value_info.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [7, 7]))
    graph = shapeshift.load(model)
    assert graph.nodes[0].outputs[0].type == graph.inputs[0].type
    # No deferred type is left behind on any value.
    assert all(v.declared is None for node in graph.nodes for v in node.outputs)


def test_declared_types_type_what_inference_does_not_reach():
    from shapeshift.frontend.onnx_import import import_model

    declared = helper.make_tensor_value_info("r", TensorProto.FLOAT, ["a", 4])
    untyped = import_model(_reshape_to_unknown_rank(declared), infer=False)
    r = untyped.nodes[0].outputs[0]
    assert r.type.shape[1] == 4 and r.declared is None
    # An op no rule knows (imported for `shapeshift info`) keeps its declared output type.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    model = _model([helper.make_node("Mystery", ["x"], ["r"], domain="acme"), helper.make_node("Relu", ["r"], ["y"])],
                   [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], domains=["acme"])
    model.graph.value_info.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [5, 2]))
    graph = import_model(model, check=False)
    assert graph.nodes[0].outputs[0].type.shape == (5, 2) and graph.outputs[0].type.shape == (5, 2)


def test_export_keeps_names_symbolic_dims_and_passes_the_checker(encoder_path):
    original = onnx.load(encoder_path)
    exported = shapeshift.to_onnx(shapeshift.load(encoder_path))
    onnx.checker.check_model(exported, full_check=True)
    assert [i.name for i in exported.graph.input] == [i.name for i in original.graph.input]
    dims = [d.dim_param or d.dim_value for d in exported.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq"]
    out_dims = [d.dim_param or d.dim_value for d in exported.graph.output[0].type.tensor_type.shape.dim]
    assert out_dims == ["batch", "seq", 32]
    assert len(exported.graph.node) == len(original.graph.node)


def test_roundtrip_of_control_flow_reads_outer_values():
    """An If whose branches read an outer value survives export and runs in onnxruntime."""
    import onnxruntime as ort

    then_graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [],
                                   [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])])
    else_graph = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                                   [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)
    model = _model([node], [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    exported = shapeshift.to_onnx(shapeshift.load(model))
    onnx.checker.check_model(exported, full_check=True)
    x = np.array([1, -2, 3], np.float32)
    for cond in (True, False):
        feed = {"c": np.array(cond), "x": x}
        want = x + x if cond else -x
        got_ort = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
        got_ref = shapeshift.InferenceSession(model, backend="reference").run(None, feed)
        np.testing.assert_array_equal(got_ort[0], want)
        np.testing.assert_array_equal(got_ref[0], want)


def test_external_data_loads(tmp_path):
    weight = np.arange(4096, dtype=np.float32).reshape(64, 64)
    init = onnx.numpy_helper.from_array(weight, "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])], initializers=[init])
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="ext.bin",
              size_threshold=0)
    assert (tmp_path / "ext.bin").exists()
    x = np.ones((2, 64), np.float32)
    got = shapeshift.InferenceSession(path, backend="reference").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ weight, rtol=1e-5)
    (tmp_path / "ext.bin").unlink()
    with pytest.raises(errors.ModelLoadError, match="ext.onnx"):
        shapeshift.load(path)




@pytest.mark.parametrize("inside_if", [False, True], ids=["top level", "If branch"])
def test_external_data_of_a_tensor_attribute_loads(tmp_path, inside_if):
    """A Constant's value tensor can be stored outside the model too, also in a body:
    the read finds it there (it scans attributes by their type)."""
    weight = np.arange(64, dtype=np.float32)
    constant = helper.make_node("Constant", [], ["w"], value=onnx.numpy_helper.from_array(weight, "w_value"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])
    if inside_if:
        branch = helper.make_graph([constant, helper.make_node("Add", ["x", "w"], ["b"])], "then", [],
                                   [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
        other = helper.make_graph([helper.make_node("Identity", ["x"], ["c"])], "else", [],
                                  [helper.make_tensor_value_info("c", TensorProto.FLOAT, None)])
        nodes = [helper.make_node("If", ["flag"], ["y"], then_branch=branch, else_branch=other)]
        inputs = [x, helper.make_tensor_value_info("flag", TensorProto.BOOL, [])]
    else:
        nodes, inputs = [constant, helper.make_node("Add", ["x", "w"], ["y"])], [x]
    model = _model(nodes, inputs, [y])
    onnx.external_data_helper.convert_model_to_external_data(
        model, all_tensors_to_one_file=True, location="attr.bin", size_threshold=0, convert_attribute=True)
    path = tmp_path / "attr.onnx"
    onnx.save(model, path)
    assert (tmp_path / "attr.bin").stat().st_size == weight.nbytes  # the value is stored outside
    feed = {"x": np.ones((2, 64), np.float32)} | ({"flag": np.array(True)} if inside_if else {})
    got = shapeshift.InferenceSession(path, backend="reference").run(None, feed)[0]
    np.testing.assert_array_equal(got, feed["x"] + weight)
    (tmp_path / "attr.bin").unlink()
    with pytest.raises(errors.ModelLoadError, match="attr.onnx"):
        shapeshift.load(path)
@pytest.mark.parametrize("source,pattern", [
    (b"\x08\x07garbage-not-a-model\xff\xff", "not an ONNX model"),
    (b"", "not an ONNX model"),
])
def test_garbage_bytes(source, pattern):
    with pytest.raises(errors.ModelLoadError, match=pattern):
        shapeshift.load(source)


def test_truncated_model_file(tmp_path, encoder_path):
    data = encoder_path.read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(errors.ModelLoadError, match="truncated.onnx"):
        shapeshift.load(path)


def test_empty_model_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")  # a file of no bytes cannot be mapped: read the plain way, then refused
    with pytest.raises(errors.ModelLoadError, match="empty.onnx"):
        shapeshift.load(path)


def test_mapped_read_equals_onnx_load_and_text_formats_still_load(tmp_path, encoder_path):
    from shapeshift.frontend.onnx_import import read_model

    expected = onnx.load(str(encoder_path))
    assert read_model(encoder_path) == expected
    text_path = tmp_path / "encoder.onnxtxt"  # the extension onnx.load reads as text
    with pytest.warns(UserWarning, match="experimental"):
        onnx.save(expected, str(text_path), format="onnxtxt")
        from_text = read_model(text_path)
    # The text format does not round-trip every float bit for bit: compare the structure.
    assert [n.op_type for n in from_text.graph.node] == [n.op_type for n in expected.graph.node]
    assert [t.name for t in from_text.graph.initializer] == [t.name for t in expected.graph.initializer]


def test_missing_file(tmp_path):
    with pytest.raises(errors.ModelLoadError, match="no such file"):
        shapeshift.load(tmp_path / "absent.onnx")


def test_unknown_ops_are_all_named_in_one_error():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("FrobnicateA", ["x"], ["a"]), helper.make_node("FrobnicateB", ["a"], ["b"]),
             helper.make_node("Custom", ["b"], ["y"], domain="com.example")]
    with pytest.raises(errors.UnsupportedModelError) as info:
        shapeshift.load(_model(nodes, [x], [y], domains=["com.example"]))
    message = str(info.value)
    assert "FrobnicateA" in message and "FrobnicateB" in message and "com.example::Custom" in message


def test_unsupported_ops_are_counted_inside_bodies_and_in_unimported_domains():
    """Import notes each op as it reads it: a body's ops count, repeats are counted
    (also for a domain the model does not import), and the error still comes first
    when a later node cannot be read at all."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    branch_out = helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])
    then_branch = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["t"])], "then", [], [branch_out])
    else_branch = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "else", [], [branch_out])
    nodes = [helper.make_node("Frobnicate", ["x"], ["a"]),
             helper.make_node("Odd", ["a"], ["b"], domain="org.absent"),
             helper.make_node("Odd", ["b"], ["d"], domain="org.absent"),
             helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)]
    with pytest.raises(errors.UnsupportedModelError) as info:
        shapeshift.load(_model(nodes, [x, cond], [y]))
    assert "Frobnicate x2" in str(info.value)
    assert "org.absent::Odd (domain 'org.absent' not imported) x2" in str(info.value)
    unreadable = nodes[:1] + [helper.make_node("Add", ["a", "ghost"], ["y"])]
    with pytest.raises(errors.UnsupportedModelError, match="Frobnicate x1"):
        shapeshift.load(_model(unreadable, [x], [y]))


def _bad_constant_model() -> onnx.ModelProto:
    """Add(x, c) with c a Constant whose tensor is 4 bytes short of its 2 x 3 shape."""
    value = onnx.numpy_helper.from_array(np.ones((2, 3), np.float32), "v")
    value.raw_data = value.raw_data[:-4]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Constant", [], ["c"], value=value, name="bad_constant"),
             helper.make_node("Add", ["x", "c"], ["y"])]
    return _model(nodes, [x], [y])


def test_a_constant_whose_tensor_does_not_fit_its_shape_is_named():
    with pytest.raises(errors.ModelLoadError, match="node 'bad_constant' \\(Constant\\): attribute 'value'"):
        shapeshift.load(_bad_constant_model())


def _constants_model():
    """Constants of every kind simplify meets: a tensor read by an Add, a value_float, one that
    is a graph output, and a tensor inside an If branch."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "k")]
    branch_constant = helper.make_node("Constant", [], ["bc"], value=onnx.numpy_helper.from_array(
        np.full(3, 2.0, np.float32), "bc_value"))
    then = helper.make_graph([branch_constant, helper.make_node("Mul", ["s", "bc"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["s"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(
            np.array([1.0, 2.0, 3.0], np.float32), "c_value"), name="c_node"),
        helper.make_node("Constant", [], ["half"], value_float=0.5),
        helper.make_node("Constant", [], ["k"], value=onnx.numpy_helper.from_array(np.ones(2, np.float32), "k")),
        helper.make_node("Add", ["x", "c"], ["a"]),
        helper.make_node("Mul", ["a", "half"], ["s"]),
        helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other),
    ]
    return _model(nodes, [x, flag], outputs)


def test_simplify_reads_constant_nodes_as_initializers():
    from shapeshift.frontend.onnx_import import import_model

    model = _constants_model()
    graph = import_model(model, constants_as_initializers=True)
    constants = [n for n in graph.walk_nodes() if n.op_type == "Constant"]
    # The value_float one and the graph output stay nodes; the tensors are weights now.
    assert sorted(n.outputs[0].name for n in constants) == ["half", "k"]
    assert np.array_equal(graph.initializers["c"].const, [1.0, 2.0, 3.0])
    branch = graph.nodes[-1].attrs["then_branch"]
    assert np.array_equal(branch.initializers["bc"].const, [2.0, 2.0, 2.0]) and len(branch.nodes) == 1
    # Without the option the graph has the model's nodes, as `shapeshift info` shows them.
    assert sum(n.op_type == "Constant" for n in import_model(model).walk_nodes()) == 4
    simplified = shapeshift.simplify(model.SerializeToString())
    onnx.checker.check_model(simplified, full_check=True)
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    for n, flag in ((1, True), (4, False), (7, True)):
        feed = {"x": rng.standard_normal((n, 3)).astype(np.float32), "flag": np.array(flag)}
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
        got = ort.InferenceSession(simplified.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def test_simplify_keeps_a_weight_shared_through_identity_as_one_tensor():
    """The TorchScript exporter shares a weight between layers through Identity nodes; the
    simplified model reads the one weight, not copies of it (folding the Identity made one)."""
    weight = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "z", "w2")]
    nodes = [helper.make_node("Identity", ["w"], ["w1"]), helper.make_node("Identity", ["w"], ["w2"]),
             helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("MatMul", ["x", "w1"], ["z"])]
    model = _model(nodes, [x], outputs, initializers=[onnx.numpy_helper.from_array(weight, "w")])
    simplified = shapeshift.simplify(model.SerializeToString())
    copies = [t for t in simplified.graph.initializer if t.raw_data == weight.tobytes() or
              (t.float_data and list(t.float_data) == weight.ravel().tolist())]
    assert [t.name for t in copies] == ["w"]
    # Both products read w (and are one now); w2, a graph output, keeps its name through an Identity.
    assert [(n.op_type, list(n.input)) for n in simplified.graph.node] == [
        ("MatMul", ["x", "w"]), ("Identity", ["y"]), ("Identity", ["w"])]
    assert [o.name for o in simplified.graph.output] == ["y", "z", "w2"]
    import onnxruntime as ort

    feed = {"x": np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)}
    got = ort.InferenceSession(simplified.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    for g, w in zip(got, (feed["x"] @ weight, feed["x"] @ weight, weight)):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_simplify_names_a_constant_whose_tensor_does_not_fit_its_shape():
    with pytest.raises(errors.ModelLoadError, match="initializer 'c' \\(2x3\\): its data does not make"):
        shapeshift.simplify(_bad_constant_model().SerializeToString())


def test_opset_99_is_refused():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    with pytest.raises(errors.UnsupportedModelError, match="opset 99"):
        shapeshift.load(_model([helper.make_node("Relu", ["x"], ["y"])], [x],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], opset=99))


def test_undefined_input_name_is_named():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    with pytest.raises(errors.ModelLoadError, match="'ghost'"):
        shapeshift.load(_model([helper.make_node("Add", ["x", "ghost"], ["y"])], [x], [y]))


def test_types_are_inferred_symbolically(encoder_path):
    graph = shapeshift.load(encoder_path)
    reshapes = [n for n in graph.walk_nodes() if n.op_type == "Reshape"]
    shapes = {tuple(str(d) for d in n.outputs[0].type.shape) for n in reshapes}
    assert ("batch", "seq", "2", "16") in shapes
    assert isinstance(graph.outputs[0].type, TensorType)


def _weights_model(weight_tensor):
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])], initializers=[weight_tensor])


def test_export_writes_an_unchanged_weight_back_as_it_was_read():
    """Copied from the model's own TensorProto, or re-encoded: the same bytes either way."""
    from shapeshift.frontend.onnx_export import export_model
    from shapeshift.frontend.onnx_import import import_model

    plain = onnx.numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(2, 2), "w")
    reencoded = import_model(_weights_model(plain))
    kept = import_model(_weights_model(plain), keep_tensors=True)
    read = import_model(_weights_model(plain), keep_tensors=True)
    assert reencoded.initializers["w"].const_source is None
    assert read.initializers["w"].const.tolist() == [[0, 1], [2, 3]]
    assert read.initializers["w"].const_source[0] is read.initializers["w"].const
    for graph in (reencoded, kept, read):
        assert export_model(graph).graph.initializer[0].SerializeToString() == plain.SerializeToString()
    # Kept, never read: written back without its array ever being made (LazyConstant).
    assert kept.initializers["w"].const_source[0] is None and kept.initializers["w"].is_initializer


def test_simplify_makes_no_array_of_a_weight_it_does_not_read():
    """The weights of an encoder's MatMuls are never read: their arrays are never made,
    and one whose data does not even fit its shape goes through as it came; import
    for a session (which reads everything) names it."""
    from shapeshift.examples.encoder import build_encoder
    from shapeshift.passes.simplify import simplify_model

    model = build_encoder(layers=1, hidden=16, heads=2, vocab=50, max_positions=64)
    weight = next(t for t in model.graph.initializer if t.name.startswith("ffn_in_w"))
    weight.raw_data = weight.raw_data[:-4]
    simplified, graph, _ = simplify_model(model)
    assert graph.initializers[weight.name].const_source[0] is None
    # Nor the embedding tables: a Gather's type rule asks whether its data has contents
    # known as dims, which a float tensor never has (a BERT-base's word table: 94 MB).
    embeddings = [v for name, v in graph.initializers.items() if "embeddings" in name]
    assert len(embeddings) == 2 and all(v.const_source[0] is None for v in embeddings)
    written = next(t for t in simplified.graph.initializer if t.name == weight.name)
    assert written.SerializeToString() == weight.SerializeToString()
    with pytest.raises(errors.ModelLoadError, match=f"initializer '{weight.name}' \\(16x64\\)"):
        shapeshift.load(model)


def test_export_reencodes_a_weight_whose_contents_or_encoding_differ():
    from shapeshift.frontend.onnx_export import export_model
    from shapeshift.frontend.onnx_import import import_model

    with_doc = onnx.numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    with_doc.doc_string = "not written by from_array"
    graph = import_model(_weights_model(with_doc), keep_tensors=True)
    written = export_model(graph).graph.initializer[0]
    assert written.doc_string == "" and onnx.numpy_helper.to_array(written).tolist() == [[1, 1], [1, 1]]

    typed = helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0])  # float_data, not raw
    written = export_model(import_model(_weights_model(typed), keep_tensors=True)).graph.initializer[0]
    assert not written.float_data and onnx.numpy_helper.to_array(written).tolist() == [[1, 2], [3, 4]]

    plain = onnx.numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    graph = import_model(_weights_model(plain), keep_tensors=True)
    graph.initializers["w"].const = np.zeros((2, 2), np.float32)  # new contents: the old proto is stale
    assert not onnx.numpy_helper.to_array(export_model(graph).graph.initializer[0]).any()


@pytest.mark.parametrize("name", ["a.b/c:0", "_x__", "été-1", "...", "Ω_2"])
def test_unnamed_dims_are_named_after_their_value(name):
    from shapeshift.frontend.onnx_import import _sanitize

    expected = "".join(c if c.isalnum() else "_" for c in name).strip("_") or "dim"
    assert _sanitize(name) == expected


def _three_weights_model() -> onnx.ModelProto:
    """y = (x + a) * b + c with three [2] weights."""
    weights = [onnx.numpy_helper.from_array(np.full(2, k, np.float32), name)
               for k, name in ((1, "a"), (2, "b"), (3, "c"))]
    nodes = [helper.make_node("Add", ["x", "a"], ["s"]), helper.make_node("Mul", ["s", "b"], ["p"]),
             helper.make_node("Add", ["p", "c"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], weights),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_export_into_the_imported_model_keeps_its_weights_in_place():
    """Given the model it was imported from, export leaves the unchanged weights where they
    are (the same protos, not copies) and writes the same bytes a fresh export writes."""
    from shapeshift.frontend.onnx_export import export_model
    from shapeshift.frontend.onnx_import import import_model

    model = _three_weights_model()
    expected = export_model(import_model(model, keep_tensors=True)).SerializeToString()
    originals = list(model.graph.initializer)
    exported = export_model(import_model(model, keep_tensors=True), reuse=model)
    assert exported is model
    assert all(a is b for a, b in zip(exported.graph.initializer, originals))
    assert exported.SerializeToString() == expected


def test_export_into_the_imported_model_copies_what_follows_a_changed_weight():
    """A changed weight is re-encoded, and so that the order stays that of a fresh
    export, every weight after it is copied: same bytes as a fresh export."""
    from shapeshift.frontend.onnx_export import export_model
    from shapeshift.frontend.onnx_import import import_model

    def changed(model):
        graph = import_model(model, keep_tensors=True)
        graph.initializers["b"].const = np.full(2, 7, np.float32)
        return graph

    model = _three_weights_model()
    expected = export_model(changed(model)).SerializeToString()
    first = model.graph.initializer[0]
    exported = export_model(changed(model), reuse=model)
    assert exported.graph.initializer[0] is first
    assert [onnx.numpy_helper.to_array(t)[0] for t in exported.graph.initializer] == [1, 7, 3]
    assert exported.SerializeToString() == expected


def test_export_does_not_reuse_a_model_holding_fields_onnx_does_not_know():
    """Fields this onnx cannot read would survive in a reused model and not in a fresh
    one: such a model is left alone and a fresh one written."""
    from shapeshift.frontend.onnx_export import export_model
    from shapeshift.frontend.onnx_import import import_model

    # Field 999 as a varint (tag 999 << 3 = 7992 = 0xb8 0x3e): unknown to every onnx.
    data = _three_weights_model().SerializeToString() + b"\xb8\x3e\x01"
    model = onnx.ModelProto.FromString(data)
    expected = export_model(import_model(model, keep_tensors=True)).SerializeToString()
    exported = export_model(import_model(model, keep_tensors=True), reuse=model)
    assert exported is not model and model.SerializeToString() == data
    assert exported.SerializeToString() == expected


def test_simplify_reuses_only_a_model_it_read_itself(tmp_path):
    """simplify(path) and simplify(bytes) own what they read; a ModelProto passed in is
    the caller's and comes back unmodified.  All three give the same model."""
    from shapeshift.examples.encoder import build_encoder

    model = build_encoder(layers=2, hidden=16, heads=2, vocab=50, max_positions=64)
    data = model.SerializeToString()
    path = tmp_path / "encoder.onnx"
    path.write_bytes(data)
    from_proto = shapeshift.simplify(model).SerializeToString()
    assert model.SerializeToString() == data
    assert shapeshift.simplify(path).SerializeToString() == from_proto
    assert shapeshift.simplify(str(path)).SerializeToString() == from_proto
    assert shapeshift.simplify(data).SerializeToString() == from_proto


def _model_with_a_local_function() -> onnx.ModelProto:
    """y = AddW(x, w) * w2, AddW a model-local function (as the dynamo exporter writes them)."""
    add_w = helper.make_function("local", "AddW", ["x", "w"], ["y"], [helper.make_node("Add", ["x", "w"], ["y"])],
                                 [helper.make_opsetid("", 17)])
    weights = [onnx.numpy_helper.from_array(np.arange(4, dtype=np.float32), "w"),
               onnx.numpy_helper.from_array(np.full(4, 2, np.float32), "w2")]
    nodes = [helper.make_node("AddW", ["x", "w"], ["t"], domain="local"), helper.make_node("Mul", ["t", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], weights)
    return helper.make_model(graph, functions=[add_w],
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_model_local_functions_are_inlined(backend, tmp_path):
    """Import inlines them (onnx.inliner, a submodule plain `import onnx` does not load:
    every such model failed to import); simplify of the file or of the proto agree."""
    import onnxruntime as ort

    model = _model_with_a_local_function()
    path = tmp_path / "local_function.onnx"
    onnx.save(model, path)
    want_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session = shapeshift.InferenceSession(path, backend=backend)
    for n in (1, 3, 8):
        x = np.random.default_rng(n).random((n, 4)).astype(np.float32)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], want_session.run(None, {"x": x})[0], rtol=1e-6)
    simplified = shapeshift.simplify(model)
    assert [n.op_type for n in simplified.graph.node] == ["Add", "Mul"] and not simplified.functions
    assert shapeshift.simplify(path).SerializeToString() == simplified.SerializeToString()


@pytest.mark.parametrize("dynamic,pattern", [
    ({"btach": (1, 4)}, "no input dim is named 'btach'; the inputs' symbols are: batch, seq"),
    ({"batch": "1:4"}, "dynamic range of 'batch': expected \\(lo, hi\\) integers or one integer, got '1:4'"),
    ({"batch": (1, 2, 3)}, "expected \\(lo, hi\\) integers"),
    ({"batch": (1.5, 2)}, "expected \\(lo, hi\\) integers"),
    ({"batch": (4, 1)}, "expected 0 <= lo <= hi <= [0-9]+, got \\(4, 1\\)"),
], ids=["typo", "text", "three", "float", "reversed"])
def test_a_dynamic_range_that_cannot_apply_is_refused(encoder_path, dynamic, pattern):
    """A range for a symbol no input has (a typo) was dropped without a word, and a range
    that was not two integers failed with a raw TypeError or ValueError."""
    with pytest.raises(errors.InputError, match=pattern):
        shapeshift.load(encoder_path, dynamic=dynamic)
    with pytest.raises(errors.InputError, match=pattern):
        shapeshift.simplify(str(encoder_path), dynamic=dynamic)


def test_one_integer_fixes_a_symbol(encoder_path):
    graph = shapeshift.load(encoder_path, dynamic={"batch": 3, "seq": (1, 64)})
    batch, seq = graph.inputs[0].type.shape
    assert (batch.lo, batch.hi) == (3, 3) and (seq.lo, seq.hi) == (1, 64)


def test_a_negative_dim_value_reads_as_an_unknown_dim():
    """Some converters write -1 for "unknown": it became a dim of -1 that random feeds and
    buffer sizes could not use."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 8])
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y])
    graph = shapeshift.load(model)
    first, eight = graph.inputs[0].type.shape
    assert isinstance(first, Expr) and eight == 8
    feed = {"x": np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)}
    for backend in ("native", "reference"):
        got = shapeshift.InferenceSession(model, backend=backend).run(None, feed)[0]
        np.testing.assert_array_equal(got, np.maximum(feed["x"], 0))
