"""Lowering rules: one function per op type that turns a node into C kernel calls.

Rules register with ``@lowers("OpType", ...)`` in the family modules below, the way op
type rules register with ``define``; ``rule_for(op_type)`` finds them. A rule takes the
node, a ``LowerContext`` and the opset, and returns ``Lowered`` or ``None`` (fallback).
"""

from __future__ import annotations

from typing import Callable, Optional

from ...ir.graph import Node
from .context import LowerContext, Lowered, Unsupported

LowerFn = Callable[[Node, LowerContext, int], Optional[Lowered]]

_RULES: dict[tuple[str, str], LowerFn] = {}


def lowers(*op_types: str, domain: str = "") -> Callable[[LowerFn], LowerFn]:
    """Register the decorated function as the lowering of ``op_types`` in ``domain``."""

    def register(fn: LowerFn) -> LowerFn:
        for op in op_types:
            _RULES[(domain, op)] = fn
        return fn

    return register


def rule_for(node: Node) -> Optional[LowerFn]:
    _load_families()
    domain = "" if node.domain == "ai.onnx" else node.domain
    return _RULES.get((domain, node.op_type))



def _load_families() -> None:
    # Imported for their registrations; deferred so that the package imports cheaply.
    from . import (attention, elementwise, layout, linalg, losses, lp, misc, nchwc, nn, pooling,  # noqa: F401
                   recurrent, reduce, sampling, selection)


__all__ = ["LowerContext", "Lowered", "Unsupported", "lowers", "rule_for"]
