"""``ai.shapeshift::SymbolicTensor``: a small integer tensor known as symbolic dims.

Simplification puts one in place of any computation whose result is fully
known as dimensions of the model's inputs (``Shape(x)[1]`` is ``seq``), so
the Shape chain that computed it disappears from the graph.  Its contents are
its only (static) parameter; the executor materializes them from the input
symbols' values, and export writes the minimal shared computation from the
graph inputs instead (see frontend/param_export.py).
"""

from __future__ import annotations

from ..ir.types import TensorType
from .context import EvalContext, InferContext
from .registry import define

DOMAIN = "ai.shapeshift"
OP_TYPE = "SymbolicTensor"


def _type(ctx: InferContext) -> list:
    param = ctx.node.params.get(0)
    if param is None:
        ctx.fail("SymbolicTensor has no parameter")
    ctx.set_contents(0, param.dims)
    return [TensorType(param.dtype, tuple(param.shape))]


def _evaluate(ctx: EvalContext, contents) -> list:
    return [contents]


define(OP_TYPE, infer=_type, evaluate=_evaluate, params=(0,), domain=DOMAIN)
