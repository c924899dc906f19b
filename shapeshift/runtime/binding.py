"""Check a feed against the graph's inputs and bind symbols from the input shapes.

Every way a feed can be wrong raises its own subclass of InputError naming the
input: a missing or unknown name, the wrong dtype, rank or static dim, one
symbol given two values, a value outside a symbol's declared range.  Dims
declared as expressions (``past_seq+seq``) are solved for their one unknown
symbol when the others are bound, then checked.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import (
    InputDtypeError,
    InputRankError,
    InputShapeError,
    MissingInputError,
    SymbolConflictError,
    SymbolRangeError,
    UnknownInputError,
)
from ..ir.graph import Graph, Value
from ..ir.types import STRING, TensorType, dtype_name, from_numpy_dtype
from ..symbolic import Expr, evaluate, free_symbols, to_string


def check_feed(graph: Graph, feed: Mapping[str, Any]) -> tuple[dict[Value, Any], dict[str, int]]:
    """Validate ``feed``; return it keyed by input Value, and the symbol binding."""
    by_name = {v.name: v for v in graph.inputs}
    unknown = [name for name in feed if name not in by_name]
    if unknown:
        raise UnknownInputError(
            f"unknown input name(s) {', '.join(map(repr, unknown))}; the model's inputs are "
            f"{', '.join(map(repr, by_name))}")
    missing = [name for name in by_name if name not in feed]
    if missing:
        raise MissingInputError(f"missing input(s) {', '.join(map(repr, missing))}")
    binding: dict[str, int] = {}
    where: dict[str, str] = {}
    pending: list[tuple[str, int, Expr, int]] = []
    values: dict[Value, Any] = {}
    for name, value in by_name.items():
        data = feed[name]
        values[value] = data
        expected = value.type
        if not isinstance(expected, TensorType):
            continue
        if not isinstance(data, np.ndarray):
            raise InputDtypeError(f"input {name!r}: expected a numpy array of {expected}, got {type(data).__name__}")
        _check_representation(name, data, expected.dtype)
        got = from_numpy_dtype(data.dtype) if data.dtype.kind != "O" else expected.dtype
        if got != expected.dtype:
            raise InputDtypeError(
                f"input {name!r}: expected dtype {dtype_name(expected.dtype)}, got {data.dtype} "
                f"(cast with .astype({_dtype_expr(expected.dtype)}))")
        if expected.shape is None:
            continue
        if data.ndim != len(expected.shape):
            raise InputRankError(
                f"input {name!r}: expected rank {len(expected.shape)} {_shape_text(expected.shape)}, "
                f"got rank {data.ndim} {list(data.shape)}")
        for axis, (dim, actual) in enumerate(zip(expected.shape, data.shape)):
            if not isinstance(dim, Expr):
                if int(dim) != actual:
                    raise InputShapeError(
                        f"input {name!r}: dimension {axis} must be {dim}, got {actual} "
                        f"(expected shape {_shape_text(expected.shape)}, got {list(data.shape)})")
                continue
            atom = dim.as_symbol()
            if atom is None:
                pending.append((name, axis, dim, actual))
                continue
            _bind(binding, where, atom.name, actual, (atom.lo, atom.hi), f"input {name!r} dimension {axis}")
    _solve_expressions(pending, binding, where)
    return values, binding


def _check_representation(name: str, data: np.ndarray, expected: int) -> None:
    """Refuse what the kernels would read as other values: an object array (Python objects,
    as pandas hands over a mixed frame) for anything but strings, and bytes in the other
    order (big-endian), where the native backend reads the array's memory as it is."""
    kind = data.dtype.kind
    if kind == "O" and expected != STRING:
        raise InputDtypeError(
            f"input {name!r}: expected dtype {dtype_name(expected)}, got an array of Python objects "
            f"(convert with .astype({_dtype_expr(expected)}))")
    if data.dtype.byteorder not in ("=", "|"):  # NumPy writes this machine's order as "="
        raise InputDtypeError(
            f"input {name!r}: its data ({data.dtype.str}) has the opposite byte order to this machine's "
            f"(convert with .astype(np.{data.dtype.newbyteorder('=').name}))")


def _dtype_expr(elem_type: int) -> str:
    """How the user names the element type's NumPy dtype: ``np.float32``, or
    ``ml_dtypes.bfloat16`` for the types NumPy itself lacks."""
    name = np.dtype(_np_name(elem_type)).name
    return f"np.{name}" if hasattr(np, name) else f"ml_dtypes.{name}"


def _np_name(elem_type: int) -> str:
    from ..ir.types import to_numpy_dtype

    return str(to_numpy_dtype(elem_type))


def _shape_text(shape) -> str:
    return "[" + ", ".join(to_string(d) for d in shape) + "]"


def _bind(binding: dict, where: dict, symbol: str, actual: int, rng: tuple[int, int], place: str) -> None:
    lo, hi = rng
    previous = binding.get(symbol)
    if previous is not None and previous != actual:
        raise SymbolConflictError(
            f"symbol {symbol!r} is {previous} from {where[symbol]} but {actual} from {place}")
    if not lo <= actual <= hi:
        raise SymbolRangeError(f"{place}: symbol {symbol!r} = {actual} is outside its declared range [{lo}, {hi}]")
    binding[symbol] = actual
    where.setdefault(symbol, place)


def _solve_expressions(pending: list, binding: dict, where: dict) -> None:
    """Bind the last unknown symbol of each expression dim, then check them all."""
    progress = True
    while pending and progress:
        progress = False
        for item in list(pending):
            name, axis, dim, actual = item
            unknown = [s for s in free_symbols(dim) if s not in binding]
            place = f"input {name!r} dimension {axis}"
            if not unknown:
                value = evaluate(dim, binding)
                if value != actual:
                    raise SymbolConflictError(
                        f"{place}: expected {to_string(dim)} = {value} from the other inputs, got {actual}")
                pending.remove(item)
                progress = True
            elif len(unknown) == 1:
                solved = _solve_linear(dim, unknown[0], actual, binding)
                if solved is not None:
                    atom = next(a for a in dim.atoms() if a.kind == "sym" and a.name == unknown[0])
                    _bind(binding, where, unknown[0], solved, (atom.lo, atom.hi), place)
                    progress = True
    for name, axis, dim, actual in pending:
        missing = sorted(s for s in free_symbols(dim) if s not in binding)
        raise InputShapeError(
            f"input {name!r} dimension {axis}: cannot determine {', '.join(missing)} from {to_string(dim)} = {actual}")


def _solve_linear(dim: Expr, symbol: str, actual: int, binding: dict) -> int | None:
    """Solve dim == actual for ``symbol`` when dim is linear in it (a*s + b)."""
    probe = dict(binding)
    probe[symbol] = 0
    try:
        b = evaluate(dim, probe)
        probe[symbol] = 1
        a = evaluate(dim, probe) - b
        probe[symbol] = 2
        if evaluate(dim, probe) != 2 * a + b or a == 0 or (actual - b) % a:
            return None
    except Exception:  # noqa: BLE001 - not solvable this way
        return None
    return (actual - b) // a

