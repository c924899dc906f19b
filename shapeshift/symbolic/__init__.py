"""Symbolic dimensions: interned integer expressions over ranged symbols."""

from .expr import (
    DEFAULT_HI,
    DEFAULT_LO,
    Dim,
    Expr,
    add,
    add_all,
    bounds,
    ceildiv,
    evaluate,
    floordiv,
    free_symbols,
    is_dim,
    is_static,
    maximum,
    minimum,
    mod,
    mul,
    prove_eq,
    prove_le,
    sub,
    substitute,
    symbol,
    to_string,
)
from .parse import parse_dim

__all__ = [
    "DEFAULT_HI", "DEFAULT_LO", "Dim", "Expr", "add", "add_all", "bounds", "ceildiv", "evaluate",
    "floordiv", "free_symbols", "is_dim", "is_static", "maximum", "minimum", "mod", "mul",
    "parse_dim", "prove_eq", "prove_le", "sub", "substitute", "symbol", "to_string",
]
