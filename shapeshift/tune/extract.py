"""The tuning tasks of a whole model: its GEMMs with a constant weight, grouped by shape.

The native backend runs a MatMul whose right operand is a constant 2-D float32 matrix, and a
Gemm with a constant B, as one prepacked GEMM whose M is the product of the left operand's
other dims (codegen/lower/linalg.py); those are the calls a tuning record replaces. Each
distinct weight shape [K, N] is one task: its M range is the union of the ranges of every
call's M under the declared dims (``bounds`` of the symbolic product), and its weight in the
model is how many calls it makes per run. The model is simplified first, exactly as the
native backend does, so the shapes are those the lowering sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

import numpy as np

from ..frontend.onnx_import import ModelSource, import_model
from ..ir.graph import Graph, Node, Value
from ..ir.types import FLOAT, TensorType
from ..ops.common import product
from ..passes.simplify import simplify_graph
from ..symbolic import Dim, bounds, evaluate, free_symbols
from .workload import GemmWorkload


@dataclass
class ModelTask:
    """One weight shape of the model, and every call of it."""

    k: int
    n: int
    lo: int  # the range of M over all its calls
    hi: int
    calls: int = 0  # per model run
    nodes: list[str] = field(default_factory=list)
    symbols: set[str] = field(default_factory=set)  # the dims M is made of
    rows: list = field(default_factory=list)  # M of each call, as a symbolic Dim

    def weighted_ms(self, symbol: str, histogram: Mapping[int, float],
                    fixed: Optional[Mapping[str, int]] = None) -> dict[int, float]:
        """M -> summed weight over the calls whose M depends on ``symbol`` alone (besides
        the dims in ``fixed``, declared with one value), for a histogram of that symbol's
        values (Ms outside the range dropped)."""
        fixed = dict(fixed or {})
        out: dict[int, float] = {}
        for m in self.rows:
            if free_symbols(m) - set(fixed) != {symbol}:
                continue
            for value, weight in histogram.items():
                rows = evaluate(m, {**fixed, symbol: value})
                if self.lo <= rows <= self.hi:
                    out[rows] = out.get(rows, 0.0) + weight
        return out

    def workload(self, cold: bool = True) -> GemmWorkload:
        """Cold by default: a model's weights stream from DRAM, call after call."""
        return GemmWorkload(self.k, self.n, self.lo, self.hi, cold)

    def range_flops(self) -> float:
        """FLOPs of the calls at every M of the range, summed: the task's share of the work."""
        return self.calls * self.workload().range_flops()


def model_tasks(model: ModelSource, dynamic: Optional[Mapping[str, tuple[int, int]]] = None) -> list[ModelTask]:
    """The model's tuning tasks, the most work first."""
    graph = import_model(model, dict(dynamic or {}))
    simplify_graph(graph)
    return graph_tasks(graph)


def graph_tasks(graph: Graph) -> list[ModelTask]:
    tasks: dict[tuple[int, int], ModelTask] = {}
    for node in graph.nodes:
        call = _weight_gemm(node)
        if call is None:
            continue
        k, n, m = call
        lo, hi = bounds(m)
        if hi < 1:
            continue  # an empty product: nothing to tune
        lo = max(lo, 1)
        task = tasks.get((k, n))
        if task is None:
            task = tasks[(k, n)] = ModelTask(k, n, lo, hi)
        task.lo, task.hi = min(task.lo, lo), max(task.hi, hi)
        task.calls += 1
        task.nodes.append(node.name or node.op_type)
        task.symbols |= free_symbols(m)
        task.rows.append(m)
    return sorted(tasks.values(), key=lambda t: -t.range_flops())


def _weight_gemm(node: Node) -> Optional[tuple[int, int, Dim]]:
    """(K, N, M) of a MatMul/Gemm with a constant float32 weight, else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm") or len(node.inputs) < 2:
        return None
    a, b = node.inputs[0], node.inputs[1]
    weight = b.const if b is not None else None
    if weight is None or np.asarray(weight).ndim != 2 or not _float_tensor(a):
        return None
    shape = list(a.type.shape)
    if node.op_type == "MatMul":
        if len(shape) < 2:
            return None
        k, n = weight.shape
        m = product(shape[:-1])
    else:
        if len(shape) != 2:
            return None
        n, k = weight.shape if node.attrs.get("transB", 0) else weight.shape[::-1]
        m = shape[1] if node.attrs.get("transA", 0) else shape[0]
    return int(k), int(n), m


def _float_tensor(value: Value) -> bool:
    t = value.type
    return isinstance(t, TensorType) and t.dtype == FLOAT and t.shape is not None
