"""Helpers for tests: run one op's rules in isolation and compare with onnxruntime.

``apply_op`` runs an op's NumPy evaluator, ``infer_op`` its type rule (inputs
given as types, with some inputs optionally known as constants), and
``ort_op`` runs the same single-node model in onnxruntime as the reference.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
import onnx
from onnx import helper

from .ir.graph import Graph
from .ir.types import TensorType, ValueType, from_numpy_dtype, tensor_type_of
from .ops import lookup
from .ops.context import EvalContext, InferContext

Input = Union[np.ndarray, ValueType, None]


def _single_node_graph(op_type: str, input_types: Sequence[Optional[ValueType]], attrs: dict,
                       num_outputs: int, opset: int, domain: str,
                       consts: dict[int, np.ndarray]) -> Graph:
    graph = Graph("single", opset={domain or "": opset})
    values = []
    for i, t in enumerate(input_types):
        if t is None and i not in consts:
            values.append(None)
        elif i in consts:
            values.append(graph.add_initializer(f"in{i}", np.asarray(consts[i])))
        else:
            values.append(graph.add_input(f"in{i}", t))
    graph.add_node(op_type, values, num_outputs, attrs, domain=domain, name="node")
    return graph


def infer_op(op_type: str, inputs: Sequence[Input], attrs: Optional[dict] = None, opset: int = 17,
             num_outputs: int = 1, domain: str = "", const_inputs: Sequence[int] = ()) -> list:
    """Output types from the op's type rule.

    ``inputs`` are types or arrays; an array's type is used, and its contents
    too when its position is in ``const_inputs``.
    """
    types = [tensor_type_of(x) if isinstance(x, np.ndarray) else x for x in inputs]
    consts = {i: inputs[i] for i in const_inputs}
    graph = _single_node_graph(op_type, types, attrs or {}, num_outputs, opset, domain, consts)
    node = graph.nodes[0]
    rule = lookup(domain, op_type, opset)
    assert rule is not None, f"no rule for {op_type}"
    return list(rule.infer(InferContext(node, opset, graph.symbols)))


def apply_op(op_type: str, inputs: Sequence[Optional[np.ndarray]], attrs: Optional[dict] = None,
             opset: int = 17, num_outputs: int = 1, domain: str = "") -> list[np.ndarray]:
    """Outputs of the op's NumPy evaluator on concrete inputs."""
    types = [None if x is None else tensor_type_of(np.asarray(x)) for x in inputs]
    graph = _single_node_graph(op_type, types, attrs or {}, num_outputs, opset, domain, {})
    node = graph.nodes[0]
    rule = lookup(domain, op_type, opset)
    assert rule is not None, f"no rule for {op_type}"
    return list(rule.evaluate(EvalContext(node, opset), *inputs))


def single_node_model(op_type: str, inputs: Sequence[Optional[np.ndarray]], attrs: Optional[dict] = None,
                      opset: int = 17, num_outputs: int = 1, domain: str = "") -> onnx.ModelProto:
    names = [("" if x is None else f"in{i}") for i, x in enumerate(inputs)]
    outputs = [f"out{i}" for i in range(num_outputs)]
    node = helper.make_node(op_type, names, outputs, domain=domain, **(attrs or {}))
    graph_inputs = [
        helper.make_tensor_value_info(n, from_numpy_dtype(np.asarray(x).dtype), np.asarray(x).shape)
        for n, x in zip(names, inputs) if x is not None
    ]
    graph_outputs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    graph = helper.make_graph([node], "single", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)])
    model.ir_version = min(model.ir_version, 10)
    return model


def ort_op(op_type: str, inputs: Sequence[Optional[np.ndarray]], attrs: Optional[dict] = None,
           opset: int = 17, num_outputs: int = 1, domain: str = "") -> list[np.ndarray]:
    """The same op run by onnxruntime, the reference we compare against."""
    import onnxruntime as ort

    model = single_node_model(op_type, inputs, attrs, opset, num_outputs, domain)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {f"in{i}": x for i, x in enumerate(inputs) if x is not None}
    return session.run(None, feed)


def assert_types_match(types: Sequence[Any], arrays: Sequence[np.ndarray]) -> None:
    """Each inferred type equals the concrete array's dtype and shape exactly."""
    assert len(types) == len(arrays), (types, [a.shape for a in arrays])
    for t, a in zip(types, arrays):
        expected = tensor_type_of(np.asarray(a))
        assert isinstance(t, TensorType), f"expected a tensor type, got {t}"
        assert t == expected, f"inferred {t}, actual {expected}"


def check_node_cases(op_type: str, max_opset: int = 23) -> list[tuple[str, str]]:
    """Run the onnx backend node cases of one op through infer_op and apply_op.

    Only single-node cases without subgraphs are checked here (the full
    conformance suite covers the rest).  Returns (case name, problem) pairs;
    an empty list means every checked case passed.
    """
    from onnx.backend.test.case.node import collect_testcases

    from .frontend.attributes import node_attributes

    problems: list[tuple[str, str]] = []
    # collect_testcases(op) only filters on its first call in a process: filter here.
    cases = [c for c in collect_testcases() if [n.op_type for n in c.model.graph.node] == [op_type]]
    for case in cases:
        model = case.model
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        if len(model.graph.node) != 1 or opset > max_opset:
            continue
        node = model.graph.node[0]
        attrs = node_attributes(node)
        if any(isinstance(v, onnx.GraphProto) for v in attrs.values()):
            continue
        for inputs, expected in case.data_sets or []:
            arrays = list(inputs)
            feed: list = []
            it = iter(arrays)
            for name in node.input:
                feed.append(next(it) if name else None)
            named = [i for i, name in enumerate(node.output) if name]  # "" = output not requested
            rule = lookup(node.domain, node.op_type, opset)
            params = [i for i in (rule.params if rule else ()) if i < len(feed) and feed[i] is not None]
            try:
                types = infer_op(node.op_type, feed, attrs, opset, len(node.output), node.domain, params)
                assert_types_match([types[i] for i in named], expected)
            except Exception as exc:  # noqa: BLE001 - reported, not hidden
                problems.append((case.name, f"infer: {type(exc).__name__}: {exc}"))
            try:
                outs = apply_op(node.op_type, feed, attrs, opset, len(node.output), node.domain)
                for got, want in zip([outs[i] for i in named], expected):
                    got = np.asarray(got)
                    if got.dtype != want.dtype or got.shape != want.shape:
                        raise AssertionError(f"got {got.dtype}{got.shape}, want {want.dtype}{want.shape}")
                    if want.dtype.kind in "fc":
                        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5, equal_nan=True)
                    else:
                        np.testing.assert_array_equal(got, want)
            except Exception as exc:  # noqa: BLE001
                problems.append((case.name, f"eval: {type(exc).__name__}: {str(exc)[:200]}"))
    return problems


if __name__ == "__main__":
    import sys

    for op in sys.argv[1:]:
        found = check_node_cases(op)
        print(f"{op}: {len(found)} problems")
        for name, problem in found:
            print(f"  {name}: {problem}")
