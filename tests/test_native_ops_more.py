"""Native lowerings of RMSNormalization (lower/nn.py), NegativeLogLikelihoodLoss and
SoftmaxCrossEntropyLoss (lower/losses.py) and Attention (lower/attention.py), at three
values of each symbolic dim.

RMSNormalization and the losses are compared with onnxruntime (through
tests/test_native_ops_extra.py's ``_run_both``); Attention with onnx's reference
evaluator, whose semantics (bottom-right causal mask, fully masked rows) the rule follows.
Every case asserts that no node fell back to the reference evaluator.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import shapeshift

from . import test_native_ops_extra
from .test_native_ops_extra import _const, _input, _model, _output, _run_both

pytestmark = test_native_ops_extra.pytestmark  # skipped without a C compiler

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
SIZES = (1, 3, 7)


def _rand(rng, shape, low=-2.0, high=2.0):
    return np.asarray(rng.uniform(low, high, shape), dtype=np.float32)


# -- RMSNormalization ----------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_normalization_constant_scale(axis):
    rng = np.random.default_rng(0)
    w = _rand(rng, (3, 4) if axis == 1 else (4,))
    node = helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=axis)
    model = _model([node], [_input("x", ["n", 3, 4])], [_output("y")], [_const("w", w)], opset=23)
    _run_both(model, [{"x": _rand(rng, (n, 3, 4))} for n in SIZES], rtol=1e-5, atol=1e-5)


def test_rms_normalization_over_a_symbolic_dim():
    # The normalized block includes the symbolic dim: the scale is an input of the same shape.
    node = helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=0, epsilon=0.1)
    model = _model([node], [_input("x", [2, 3, "n"]), _input("w", [2, 3, "n"])], [_output("y")], opset=23)
    rng = np.random.default_rng(1)
    _run_both(model, [{"x": _rand(rng, (2, 3, n)), "w": _rand(rng, (2, 3, n))} for n in SIZES], rtol=1e-5, atol=1e-5)


# -- losses ------------------------------------------------------------------------------------


def _targets(rng, shape, classes, ignore=None):
    t = rng.integers(0, classes, shape).astype(np.int64)
    if ignore is not None and t.size:
        t.reshape(-1)[::3] = ignore  # some positions ignored
    return t


LOSS_CASES = [  # (reduction, weighted, ignore_index, rank of the input)
    ("none", False, None, 3), ("sum", False, None, 3), ("mean", False, None, 3), ("mean", True, None, 3),
    ("mean", True, 1, 4), ("sum", True, 2, 2), ("mean", False, 4, 2), ("none", True, -1, 4),
]


def _loss_model(op, reduction, weighted, ignore, rank, log_prob=False):
    dims = ["n", 5, "d", 2][:rank]
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    inputs = ["x", "t", "w"] if weighted else ["x", "t"]
    outputs = ["loss", "log_prob"] if log_prob else ["loss"]
    node = helper.make_node(op, inputs, outputs, **attrs)
    graph_inputs = [_input("x", dims), _input("t", [dims[0], *dims[2:]], I64)]
    if weighted:
        graph_inputs.append(_input("w", [5]))
    return _model([node], graph_inputs, [_output(o) for o in outputs], opset=13), dims


def _loss_feeds(rng, dims, weighted, ignore):
    feeds = []
    for n in SIZES:
        shape = [n if d == "n" else (n + 1 if d == "d" else d) for d in dims]
        feed = {"x": _rand(rng, shape), "t": _targets(rng, [shape[0], *shape[2:]], 5, ignore)}
        if weighted:
            feed["w"] = _rand(rng, (5,), 0.1, 2.0)
        feeds.append(feed)
    return feeds


@pytest.mark.parametrize("reduction,weighted,ignore,rank", LOSS_CASES)
def test_negative_log_likelihood_loss(reduction, weighted, ignore, rank):
    model, dims = _loss_model("NegativeLogLikelihoodLoss", reduction, weighted, ignore, rank)
    _run_both(model, _loss_feeds(np.random.default_rng(1), dims, weighted, ignore), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction,weighted,ignore,rank", LOSS_CASES)
@pytest.mark.parametrize("log_prob", [False, True], ids=["loss", "log_prob"])
def test_softmax_cross_entropy_loss(reduction, weighted, ignore, rank, log_prob):
    model, dims = _loss_model("SoftmaxCrossEntropyLoss", reduction, weighted, ignore, rank, log_prob)
    _run_both(model, _loss_feeds(np.random.default_rng(2), dims, weighted, ignore), rtol=1e-5, atol=1e-5)


def test_loss_target_out_of_range_fails():
    model, _ = _loss_model("NegativeLogLikelihoodLoss", "sum", False, None, 2)
    session = shapeshift.InferenceSession(model, backend="native")
    assert not session._executor.program.fallback_ops()
    with pytest.raises(Exception):
        session.run(None, {"x": np.zeros((2, 5), np.float32), "t": np.array([0, 5], np.int64)})


def test_nll_mean_with_ignore_index_minus_one_and_no_weight_declines():
    # onnx.reference and the spec disagree on this case: the rule leaves it to the fallback.
    model, _ = _loss_model("NegativeLogLikelihoodLoss", "mean", False, -1, 2)
    session = shapeshift.InferenceSession(model, backend="native")
    assert session._executor.program.fallback_ops()


# -- Attention ---------------------------------------------------------------------------------


def _run_reference(model, feeds_list, rtol=1e-5, atol=1e-5):
    """Like ``_run_both``, against onnx's reference evaluator (the semantics followed)."""
    from onnx.reference import ReferenceEvaluator

    session = shapeshift.InferenceSession(model, backend="native")
    program = session._executor.program
    assert not program.fallback_ops(), "; ".join(f"{s.node.op_type}: {s.reason}" for s in program.steps if s.reason)
    reference = ReferenceEvaluator(model)
    for feed in feeds_list:
        for got, want in zip(session.run(None, feed), reference.run(None, feed)):
            assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# (name, attributes, Q/K/V rank, with past, mask: None, "bool" or "float", mask rank, outputs)
ATTENTION_CASES = [
    ("plain", {}, 4, False, None, 0, 1),
    ("causal", {"is_causal": 1}, 4, False, None, 0, 1),
    ("scale_softcap", {"scale": 0.3, "softcap": 2.0}, 4, False, None, 0, 1),
    ("bool_mask", {}, 4, False, "bool", 2, 1),
    ("float_mask_4d_causal", {"is_causal": 1}, 4, False, "float", 4, 1),
    ("past_present", {}, 4, True, "float", 2, 3),
    ("past_causal_qk", {"is_causal": 1}, 4, True, "bool", 3, 4),
    ("qk_bias", {"qk_matmul_output_mode": 2}, 4, True, "float", 4, 4),
    ("qk_softcap", {"qk_matmul_output_mode": 1, "softcap": 1.5}, 4, True, None, 0, 4),
    ("qk_softmax", {"qk_matmul_output_mode": 3, "is_causal": 1}, 4, True, "bool", 2, 4),
    ("3d", {"q_num_heads": 4, "kv_num_heads": 2}, 3, False, None, 0, 1),
    ("3d_causal_past", {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1}, 3, True, "float", 2, 3),
]

HQ, HKV, DH, DV = 4, 2, 8, 6


def _seq_dims(n_out):
    """Key, past and total key lengths. onnx's shape inference (which types Attention)
    sizes present_key/present_value and qk_matmul_output only from static key lengths, so
    the cases with those outputs keep batch and query length symbolic, the keys static."""
    return ("k", "p", "t") if n_out == 1 else (3, 4, 7)


def _attention_model(attrs, rank, past, mask, mask_rank, n_out):
    k, p, t = _seq_dims(n_out)
    if rank == 4:
        dims = {"Q": ["b", HQ, "q", DH], "K": ["b", HKV, k, DH], "V": ["b", HKV, k, DV]}
    else:
        dims = {"Q": ["b", "q", HQ * DH], "K": ["b", k, HKV * DH], "V": ["b", k, HKV * DV]}
    inputs = [_input(n, d) for n, d in dims.items()]
    names = ["Q", "K", "V", "", "", ""]
    if mask is not None:
        # The mask spans the whole key axis, past and current (t = p + k).
        # Mask "rank" 3 stands for a 4-D mask that broadcasts over the heads.
        mask_dims = {2: ["q", t], 3: ["b", 1, "q", t], 4: ["b", HQ, "q", t]}[mask_rank]
        inputs.append(_input("mask", mask_dims, B if mask == "bool" else F))
        names[3] = "mask"
    if past:
        inputs += [_input("past_key", ["b", HKV, p, DH]), _input("past_value", ["b", HKV, p, DV])]
        names[4:6] = ["past_key", "past_value"]
    while names and names[-1] == "":
        names.pop()
    outputs = ["Y", "present_key", "present_value", "qk"][:n_out]
    node = helper.make_node("Attention", names, outputs, **attrs)
    return _model([node], inputs, [_output(o) for o in outputs], opset=23)


def _attention_feeds(rng, rank, past, mask, mask_rank, n_out=1):
    feeds = []
    for b, q, k in [(1, 1, 1), (2, 3, 2), (3, 5, 7)]:
        if n_out > 1:
            k = 3
        p = (k + 1 if n_out == 1 else 4) if past else 0
        t = p + k
        if rank == 4:
            feed = {"Q": _rand(rng, (b, HQ, q, DH)), "K": _rand(rng, (b, HKV, k, DH)), "V": _rand(rng, (b, HKV, k, DV))}
        else:
            feed = {"Q": _rand(rng, (b, q, HQ * DH)), "K": _rand(rng, (b, k, HKV * DH)), "V": _rand(rng, (b, k, HKV * DV))}
        if mask is not None:
            shape = {2: (q, t), 3: (b, 1, q, t), 4: (b, HQ, q, t)}[mask_rank]
            feed["mask"] = rng.random(shape) < 0.7 if mask == "bool" else _rand(rng, shape, -3, 1)
        if past:
            feed["past_key"], feed["past_value"] = _rand(rng, (b, HKV, p, DH)), _rand(rng, (b, HKV, p, DV))
        feeds.append(feed)
    return feeds


@pytest.mark.parametrize("name,attrs,rank,past,mask,mask_rank,n_out", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_attention(name, attrs, rank, past, mask, mask_rank, n_out):
    model = _attention_model(attrs, rank, past, mask, mask_rank, n_out)
    _run_reference(model, _attention_feeds(np.random.default_rng(3), rank, past, mask, mask_rank, n_out))


def test_attention_fully_masked_rows_are_zero():
    model = _attention_model({"qk_matmul_output_mode": 3}, 4, True, "bool", 2, 4)
    rng = np.random.default_rng(4)
    feeds = _attention_feeds(rng, 4, True, "bool", 2, 4)
    for feed in feeds:
        feed["mask"][0, :] = False  # the first query row attends nothing
    _run_reference(model, feeds)


def test_attention_float16_declines():
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"])
    model = _model([node], [_input(n, ["b", 2, "s", 4], TensorProto.FLOAT16) for n in "QKV"], [_output("Y", TensorProto.FLOAT16)],
                   opset=23)
    session = shapeshift.InferenceSession(model, backend="native")
    assert session._executor.program.fallback_ops()
