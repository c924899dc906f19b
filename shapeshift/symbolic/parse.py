"""Parse dimension expressions written as text, such as ``"2*seq + 1"``.

The grammar is a small subset of Python expressions: integers, symbol names,
``+ - * // %``, ``**`` with a constant exponent, and the calls ``min``,
``max``, ``floordiv``, ``ceildiv``, ``mod``.  Python's own parser reads the text;
we only walk the tree, so nothing is ever evaluated by Python.
"""

from __future__ import annotations

import ast
from typing import Callable, Mapping

from ..errors import ExpressionError
from .expr import Dim, ceildiv, floordiv, maximum, minimum, mod, mul, add, sub, symbol

_CALLS: dict[str, Callable[[Dim, Dim], Dim]] = {
    "min": minimum,
    "max": maximum,
    "floordiv": floordiv,
    "ceildiv": ceildiv,
    "mod": mod,
}
_BINOPS: dict[type, Callable[[Dim, Dim], Dim]] = {
    ast.Add: add,
    ast.Sub: sub,
    ast.Mult: mul,
    ast.FloorDiv: floordiv,
    ast.Mod: mod,
}


def parse_dim(text: str, ranges: Mapping[str, tuple[int, int]] | None = None) -> Dim:
    """Parse ``text`` into a dimension; symbols take their range from ``ranges``."""
    ranges = ranges or {}
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"cannot parse dimension expression {text!r}: {exc.msg}") from None
    return _walk(tree.body, text, ranges)


def _walk(node: ast.AST, text: str, ranges: Mapping[str, tuple[int, int]]) -> Dim:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in ranges:
            lo, hi = ranges[node.id]
            return symbol(node.id, lo, hi)
        return symbol(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _walk(node.operand, text, ranges)
        return mul(value, -1) if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left = _walk(node.left, text, ranges)
        if isinstance(node.op, ast.Pow):
            if not (isinstance(node.right, ast.Constant) and isinstance(node.right.value, int) and node.right.value >= 0):
                raise ExpressionError(f"in {text!r}: exponents must be non-negative integer constants")
            result: Dim = 1
            for _ in range(node.right.value):
                result = mul(result, left)
            return result
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise ExpressionError(f"in {text!r}: operator {type(node.op).__name__} is not allowed in a dimension")
        return op(left, _walk(node.right, text, ranges))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS:
        if len(node.args) != 2 or node.keywords:
            raise ExpressionError(f"in {text!r}: {node.func.id}() takes exactly two arguments")
        a, b = (_walk(arg, text, ranges) for arg in node.args)
        return _CALLS[node.func.id](a, b)
    raise ExpressionError(f"in {text!r}: unsupported syntax {ast.unparse(node)!r}")
