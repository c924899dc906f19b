"""Attention written as MatMul, scale, mask, Softmax, MatMul runs as one fused step
(codegen/lower/attention_fusion.py, kernels/attention.py), against onnxruntime."""

from __future__ import annotations

import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.codegen.program import ARENA, DEAD

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

F = TensorProto.FLOAT


def _attention_model(scale=None, mask=None, guard=False, heads=2, dh=8, kv_len="t", opset=17,
                     softmax_axis=-1, extra_output=None, scale_after_mask=False, prescale=None) -> onnx.ModelProto:
    """q [b, heads, t, dh], k and v [b, heads, kv_len, dh]; the keys are transposed by a
    Transpose, the output goes through Transpose to [b, t, heads, dh]. ``scale``: None,
    ("Mul", c) or ("Div", c); ``mask``: None or the mask input's dims."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    inits = []
    if prescale is None:
        nodes.append(helper.make_node("MatMul", ["q", "kt"], ["scores"]))
    else:  # as PyTorch's exporter writes scaled_dot_product_attention: q and k^T scaled apart
        inits.append(numpy_helper.from_array(np.array(prescale, np.float32), "root_scale"))
        nodes += [helper.make_node("Mul", ["q", "root_scale"], ["qs"]),
                  helper.make_node("Mul", ["root_scale", "kt"], ["ks"]),
                  helper.make_node("MatMul", ["qs", "ks"], ["scores"])]
    last = "scores"

    def add_scale():
        nonlocal last
        op, c = scale
        inits.append(numpy_helper.from_array(np.array(c, np.float32), "c"))
        nodes.append(helper.make_node(op, [last, "c"], ["scaled"]))
        last = "scaled"

    if scale and not scale_after_mask:
        add_scale()
    if mask is not None:
        nodes.append(helper.make_node("Add", [last, "mask"], ["masked"]))
        last = "masked"
    if scale and scale_after_mask:
        add_scale()
    nodes.append(helper.make_node("Softmax", [last], ["probs"], axis=softmax_axis))
    last = "probs"
    if guard:
        inits.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero"))
        nodes += [helper.make_node("IsNaN", ["probs"], ["isnan"]),
                  helper.make_node("Where", ["isnan", "zero", "probs"], ["guarded"])]
        last = "guarded"
    nodes += [helper.make_node("MatMul", [last, "v"], ["context"]),
              helper.make_node("Transpose", ["context"], ["y"], perm=[0, 2, 1, 3])]
    inputs = [helper.make_tensor_value_info("q", F, ["b", heads, "t", dh]),
              helper.make_tensor_value_info("k", F, ["b", heads, kv_len, dh]),
              helper.make_tensor_value_info("v", F, ["b", heads, kv_len, dh])]
    if mask is not None:
        inputs.append(helper.make_tensor_value_info("mask", F, mask))
    outputs = [helper.make_tensor_value_info("y", F, None)]
    if extra_output:
        outputs.append(helper.make_tensor_value_info(extra_output, F, None))
    graph = helper.make_graph(nodes, "attention", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _feed(rng, model, b, t, kv=None, masked_fraction=0.3, masked_rows=()):
    """Inputs for batch ``b``, ``t`` queries and ``kv`` keys (default ``t``)."""
    heads, dh = (model.graph.input[0].type.tensor_type.shape.dim[i].dim_value for i in (1, 3))
    kv = t if kv is None else kv
    feed = {"q": rng.standard_normal((b, heads, t, dh)).astype(np.float32),
            "k": rng.standard_normal((b, heads, kv, dh)).astype(np.float32),
            "v": rng.standard_normal((b, heads, kv, dh)).astype(np.float32)}
    mask_info = next((i for i in model.graph.input if i.name == "mask"), None)
    if mask_info is not None:
        dims = [{"b": b, "t": t, "kv": kv}.get(d.dim_param, d.dim_value) for d in mask_info.type.tensor_type.shape.dim]
        mask = np.where(rng.random(dims) < masked_fraction, -np.inf, 0.0).astype(np.float32)
        mask += rng.standard_normal(dims).astype(np.float32) * np.isfinite(mask)
        for index in masked_rows:
            mask[index] = -np.inf
        feed["mask"] = mask
    return feed


def _compare(model, feeds, num_threads=None, dynamic=None):
    import onnxruntime as ort

    session = shapeshift.InferenceSession(model, dynamic=dynamic, backend="native", num_threads=num_threads)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        for got, want in zip(session.run(None, feed), reference.run(None, feed)):
            assert got.shape == want.shape
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
    return session._executor.program


def _fused_step(program):
    steps = [s for s in program.steps if s.lowered is not None and "attention" in s.lowered.fragments]
    return steps[0] if len(steps) == 1 else None


CASES = {
    # the bench's BERT (TorchScript style): scale by Div, additive padding mask [b, 1, 1, t]
    "div-mask": dict(scale=("Div", 2.8284271), mask=["b", 1, 1, "t"]),
    # PyTorch's scaled_dot_product_attention export: mask [b, 1, t, t], NaN guard
    "mul-mask-guard": dict(scale=("Mul", 0.35), mask=["b", 1, "t", "t"], guard=True),
    # Whisper (dynamo): the scale is applied to q and k before, nothing between
    "plain": dict(),
    # one head, a mask shared by the batch
    "one-head": dict(heads=1, mask=[1, 1, 1, "t"], dh=16),
    "opset-11": dict(opset=11, softmax_axis=3, scale=("Mul", 0.5)),
    # q and k^T each scaled by sqrt(scale) before the product, both Muls become alpha
    "prescaled": dict(prescale=0.59, mask=["b", 1, "t", "t"], guard=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_fuses_into_one_step_and_matches_onnxruntime(case):
    model = _attention_model(**CASES[case])
    rng = np.random.default_rng(0)
    # t up to 100 rows: several row blocks and both the packed (>= 16 rows) and in-place paths.
    program = _compare(model, [_feed(rng, model, b, t) for b, t in ((1, 1), (2, 5), (1, 17), (3, 100))])
    step = _fused_step(program)
    assert step is not None, [s.node.op_type for s in program.steps]
    assert not program.fallback_ops()
    # The whole chain is this one step: the keys' Transpose is read through strides and the
    # output Transpose is written through them.
    assert [s.node.op_type for s in program.steps] == ["MatMul"]
    absorbed = {n.op_type for n in step.lowered.absorbed}
    assert {"Softmax", "MatMul", "Transpose"} <= absorbed


def test_scores_get_no_storage():
    model = _attention_model(**CASES["mul-mask-guard"])
    session = shapeshift.InferenceSession(model, backend="native")
    program = session._executor.program
    kinds = {s.value.name: s.kind for s in program.slots if s.value is not None}
    for name in ("scores", "scaled", "masked", "probs", "isnan", "guarded"):
        assert kinds[name] == DEAD, (name, kinds[name])
    assert kinds["y"] == ARENA


def test_fully_masked_rows_follow_the_guard():
    rng = np.random.default_rng(1)
    # Row 0 of image 0 masked everywhere: NaN from Softmax, zeros once guarded.
    guarded = _attention_model(scale=("Mul", 0.35), mask=["b", 1, "t", "t"], guard=True)
    feeds = [_feed(rng, guarded, 2, t, masked_rows=[(0, 0, 0)]) for t in (3, 40)]
    _compare(guarded, feeds)
    got = shapeshift.InferenceSession(guarded, backend="native").run(None, feeds[1])[0]
    assert np.all(got[0, 0] == 0) and np.isfinite(got).all()
    plain = _attention_model(scale=("Mul", 0.35), mask=["b", 1, "t", "t"])
    _compare(plain, feeds)
    got = shapeshift.InferenceSession(plain, backend="native").run(None, feeds[1])[0]
    assert np.isnan(got[0, 0]).all() and not np.isnan(got[1]).any()


def test_mask_and_values_computed_after_the_scores():
    # As the TorchScript exporter orders BERT: the mask is made from the input mask after
    # Q K^T, and V after the Softmax. The builder gathers the chain before its second
    # MatMul (fusion_order), so the fused step finds both computed.
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Sub", ["one", "keep"], ["dropped"]),
             helper.make_node("Mul", ["dropped", "big"], ["mask"]),
             helper.make_node("Add", ["scores", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
             helper.make_node("Relu", ["vsrc"], ["v"]),
             helper.make_node("MatMul", ["probs", "v"], ["y"])]
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(-10000.0, np.float32), "big")]
    inputs = [helper.make_tensor_value_info(name, F, ["b", 2, "t", 8]) for name in ("q", "k", "vsrc")]
    inputs.append(helper.make_tensor_value_info("keep", F, ["b", 1, 1, "t"]))
    graph = helper.make_graph(nodes, "late", inputs, [helper.make_tensor_value_info("y", F, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(5)
    feeds = [{**{name: rng.standard_normal((b, 2, t, 8)).astype(np.float32) for name in ("q", "k", "vsrc")},
              "keep": (rng.random((b, 1, 1, t)) < 0.8).astype(np.float32)} for b, t in ((1, 3), (2, 30))]
    program = _compare(model, feeds)
    assert _fused_step(program) is not None
    assert [s.node.op_type for s in program.steps] == ["Sub", "Relu", "MatMul"]


def test_other_key_counts_and_decoding_one_token():
    # gpt2 with past: t query rows against past + t keys (one row reads K and V in place);
    # cross-attention without keys: O is 0.
    model = _attention_model(scale=("Div", 4.0), mask=["b", 1, "t", "kv"], kv_len="kv", heads=3, dh=16)
    rng = np.random.default_rng(2)
    feeds = [_feed(rng, model, b, t, kv) for b, t, kv in ((1, 1, 1), (1, 1, 301), (2, 3, 53), (1, 24, 32), (2, 5, 0))]
    program = _compare(model, feeds, dynamic={"kv": (0, 512)})
    assert _fused_step(program) is not None


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_split_across_threads_when_heads_are_few(threads):
    model = _attention_model(heads=1, mask=["b", 1, 1, "t"], scale=("Div", 3.0), dh=32)
    rng = np.random.default_rng(3)
    program = _compare(model, [_feed(rng, model, 1, t) for t in (200, 513)], num_threads=threads)
    assert _fused_step(program) is not None


@pytest.mark.parametrize("variant", ["probs-is-output", "softmax-not-last-axis", "scale-after-mask"])
def test_other_chains_are_not_fused_and_still_match(variant):
    kwargs = {"probs-is-output": dict(mask=["b", 1, 1, "t"], extra_output="probs"),
              "softmax-not-last-axis": dict(softmax_axis=2),
              "scale-after-mask": dict(mask=["b", 1, 1, "t"], scale=("Mul", 0.5), scale_after_mask=True)}[variant]
    model = _attention_model(**kwargs)
    rng = np.random.default_rng(4)
    program = _compare(model, [_feed(rng, model, b, t) for b, t in ((1, 4), (2, 33))])
    assert _fused_step(program) is None
    assert not program.fallback_ops()
