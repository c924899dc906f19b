"""The native executor: the reference executor with compiled C kernels for the nodes they cover.

So far only float32 elementwise nodes of the root graph run natively (see
codegen/native_elementwise.py); every other node, and any call whose actual inputs the
kernels do not take, goes through the reference evaluator. The C library is built when
the executor is created, so a missing compiler fails at session creation.
"""

from __future__ import annotations

from typing import Any

from ..codegen.native_elementwise import NativeElementwise
from ..ir.graph import Graph, Node
from ..ops.context import EvalContext
from .reference import ReferenceExecutor


class NativeExecutor(ReferenceExecutor):
    def __init__(self, graph: Graph):
        super().__init__(graph)
        self.elementwise = NativeElementwise(graph)
        self.native_calls = 0  # nodes run by compiled kernels, for tests and reports
        self.fallback_calls = 0

    def _evaluate(self, node: Node, rule: Any, ctx: EvalContext, args: list) -> list:
        if self.elementwise.accepts(node, args):
            self.native_calls += 1
            return self.elementwise.run_node(node, args)
        self.fallback_calls += 1
        return super()._evaluate(node, rule, ctx, args)
