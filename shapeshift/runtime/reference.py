"""The reference executor: interprets the graph node by node with the NumPy evaluators.

It is the ground truth of shapeshift's own semantics (onnxruntime is the
external one) and the fallback for anything not compiled.  Values live in one
flat dict keyed by Value objects: every Value is defined in exactly one place,
so subgraph values simply overwrite themselves on each iteration.  Values are
dropped after their last use in each graph so large models do not hold every
intermediate at once.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from ..errors import ExecutionError, InputError, ShapeshiftError
from ..ir.graph import Graph, Node, StaticParam, Value, values_read
from ..ir.types import to_numpy_dtype
from ..ops import lookup
from ..ops.context import EvalContext
from ..symbolic import evaluate


class _GraphPlan:
    """Per-graph precomputation: each node's rule and the values it frees."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.steps: list[tuple[Node, Any, int, list[Value]]] = []
        position = {id(node): i for i, node in enumerate(graph.nodes)}
        last_use: dict[int, int] = {}
        for i, node in enumerate(graph.nodes):
            for value in values_read(node):
                last_use[id(value)] = i
        keep = {id(v) for v in graph.outputs}
        frees: dict[int, list[Value]] = {}
        owned = [v for n in graph.nodes for v in n.outputs]
        for value in owned:
            if id(value) in keep:
                continue
            frees.setdefault(last_use.get(id(value), position[id(value.producer)]), []).append(value)
        for i, node in enumerate(graph.nodes):
            domain = "" if node.domain == "ai.onnx" else node.domain
            opset = graph.opset.get(domain, 1)
            rule = lookup(domain, node.op_type, opset)
            if rule is None:
                raise ExecutionError(f"{node.describe()}: no evaluator for {node.op_type} at opset {opset}")
            self.steps.append((node, rule, opset, frees.get(i, [])))


class ReferenceExecutor:
    """Runs a Graph on NumPy arrays."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._plans: dict[int, _GraphPlan] = {}
        self._binding: dict[str, int] = {}

    def _plan(self, graph: Graph) -> _GraphPlan:
        plan = self._plans.get(id(graph))
        if plan is None:
            plan = self._plans[id(graph)] = _GraphPlan(graph)
        return plan

    def run(self, feeds: dict[Value, Any], binding: Optional[Mapping[str, int]] = None) -> list:
        """Outputs for ``feeds``; ``binding`` gives the input symbols' values
        (needed when simplification left static parameters over symbolic dims)."""
        env: dict[Value, Any] = {}
        for value in self.graph.initializers.values():
            env[value] = value.const
        env.update(feeds)
        self._binding = dict(binding or {})
        return self._run_graph(self.graph, env)

    def _run_subgraph(self, env: dict, graph: Graph, inputs: list) -> list:
        for value in graph.initializers.values():
            env[value] = value.const
        for value, data in zip(graph.inputs, inputs):
            env[value] = data
        return self._run_graph(graph, env)

    def _run_graph(self, graph: Graph, env: dict) -> list:
        plan = self._plan(graph)
        for node, rule, opset, frees in plan.steps:
            args = [None if v is None else env[v] for v in node.inputs]
            for index, param in node.params.items():
                args[index] = materialize(param, self._binding, node)
            ctx = EvalContext(node, opset, lambda g, ins: self._run_subgraph(env, g, ins))
            try:
                results = self._evaluate(node, rule, ctx, args)
            except ShapeshiftError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported with the node's name
                raise ExecutionError(f"{node.describe()} failed: {type(exc).__name__}: {exc}") from exc
            if len(results) < len(node.outputs):
                raise ExecutionError(
                    f"{node.describe()}: evaluator returned {len(results)} outputs, node has {len(node.outputs)}")
            for value, result in zip(node.outputs, results):
                env[value] = result
            for value in frees:
                env.pop(value, None)
        return [env[v] for v in graph.outputs]

    def _evaluate(self, node: Node, rule: Any, ctx: EvalContext, args: list) -> Any:
        """One node's outputs; the hook a backend overrides to run some nodes its own way."""
        return rule.evaluate(ctx, *args)


def materialize(param: StaticParam, binding: Mapping[str, int], node: Node) -> np.ndarray:
    """The tensor a static parameter stands for, under the current binding."""
    try:
        values = [evaluate(d, binding) for d in param.dims]
    except ShapeshiftError as exc:
        raise ExecutionError(f"{node.describe()}: cannot evaluate parameter {param}: {exc}") from None
    return np.array(values, dtype=to_numpy_dtype(param.dtype)).reshape(param.shape)


def as_feed_array(value: Any, name: str = "") -> Any:
    """Turn Python scalars/lists into arrays; leave arrays, lists of arrays and None
    (``name``: the input's, for the error on a ragged list)."""
    if isinstance(value, np.ndarray) or value is None:
        return value
    if isinstance(value, list) and all(isinstance(v, np.ndarray) for v in value):
        return value
    try:
        return np.asarray(value)
    except ValueError as exc:  # a ragged nested list
        raise InputError(f"input {name!r}: not a rectangular array ({exc})") from None
