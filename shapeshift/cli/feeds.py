"""Random feeds for `shapeshift run --random` and for checks on sampled shapes."""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from ..ir.graph import Graph, Value
from ..ir.types import TensorType, to_numpy_dtype
from ..symbolic import Expr, evaluate, free_symbols

#: Value given to a symbol with no declared range (small, so runs are quick).
DEFAULT_SYMBOL_VALUE = 4


def pick_binding(graph: Graph, values: list[Value], dynamic: Mapping[str, tuple[int, int]],
                 rng: np.random.Generator, given: Optional[Mapping[str, np.ndarray]] = None) -> dict[str, int]:
    """A value for every symbol in the inputs' shapes, inside declared ranges."""
    binding: dict[str, int] = {}
    for value in graph.inputs:
        if given and value.name in given and isinstance(value.type, TensorType) and value.type.shape:
            for dim, actual in zip(value.type.shape, given[value.name].shape):
                atom = dim.as_symbol() if isinstance(dim, Expr) else None
                if atom is not None:
                    binding[atom.name] = int(actual)
    for value in values:
        if not isinstance(value.type, TensorType) or value.type.shape is None:
            continue
        for dim in value.type.shape:
            for name in sorted(free_symbols(dim)):
                if name in binding:
                    continue
                if name in dynamic:
                    lo, hi = dynamic[name]
                    binding[name] = int(rng.integers(lo, hi + 1))
                else:
                    lo, hi = graph.symbols.ranges.get(name, (1, DEFAULT_SYMBOL_VALUE))
                    binding[name] = max(lo, min(hi, DEFAULT_SYMBOL_VALUE))
    return binding


def random_array(t: TensorType, binding: Mapping[str, int], rng: np.random.Generator) -> np.ndarray:
    shape = tuple(evaluate(d, binding) for d in (t.shape or ()))
    dtype = to_numpy_dtype(t.dtype)
    if dtype.kind == "f" or dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):  # ml_dtypes' floats
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        # 0 and 1 only: integer inputs are mostly ids, masks and types, which index
        # tables of unknown size; any table has rows 0 and 1.
        return rng.integers(0, 2, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return np.full(shape, "x", dtype=object)


def random_feed(graph: Graph, values: list[Value], dynamic: Mapping[str, tuple[int, int]],
                rng: np.random.Generator, given: Optional[Mapping[str, np.ndarray]] = None) -> dict[str, np.ndarray]:
    binding = pick_binding(graph, values, dynamic, rng, given)
    return {v.name: random_array(v.type, binding, rng) for v in values if isinstance(v.type, TensorType)}
