"""Value types: tensors with symbolic shapes, sequences and optionals.

Element types are ONNX ``TensorProto`` data-type codes (ints), which name every
type ONNX has, bfloat16 and the float8s included; :func:`to_numpy_dtype` maps
them to NumPy.  A shape is a tuple of dimensions (``int`` or symbolic
``Expr``), or ``None`` when even the rank is unknown.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np
from onnx import TensorProto, helper

from ..symbolic import Dim, Expr, to_string

FLOAT = TensorProto.FLOAT
DOUBLE = TensorProto.DOUBLE
FLOAT16 = TensorProto.FLOAT16
BFLOAT16 = TensorProto.BFLOAT16
INT8 = TensorProto.INT8
INT16 = TensorProto.INT16
INT32 = TensorProto.INT32
INT64 = TensorProto.INT64
UINT8 = TensorProto.UINT8
UINT16 = TensorProto.UINT16
UINT32 = TensorProto.UINT32
UINT64 = TensorProto.UINT64
BOOL = TensorProto.BOOL
STRING = TensorProto.STRING
COMPLEX64 = TensorProto.COMPLEX64
COMPLEX128 = TensorProto.COMPLEX128
UNDEFINED = TensorProto.UNDEFINED

FLOAT_TYPES = frozenset({FLOAT, DOUBLE, FLOAT16, BFLOAT16})
INT_TYPES = frozenset({INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64})
#: Types whose NumPy representation is exact and native (no ml_dtypes involved).
PLAIN_TYPES = FLOAT_TYPES - {BFLOAT16} | INT_TYPES | {BOOL, STRING, COMPLEX64, COMPLEX128}


@functools.lru_cache(maxsize=None)  # asked per value by passes and per run by the VM
def to_numpy_dtype(elem_type: int) -> np.dtype:
    if elem_type == STRING:
        return np.dtype(object)
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


@functools.lru_cache(maxsize=256)  # asked for every initializer and folded constant
def from_numpy_dtype(dtype: np.dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype.kind in ("U", "S", "O"):
        return STRING
    return helper.np_dtype_to_tensor_dtype(dtype)


def dtype_name(elem_type: int) -> str:
    if elem_type == UNDEFINED:
        return "undefined"
    try:
        return helper.tensor_dtype_to_string(elem_type).replace("TensorProto.", "").lower()
    except KeyError:
        return f"unknown element type {elem_type}"


def ort_type_name(elem_type: int) -> str:
    """The type string onnxruntime's NodeArg.type reports, e.g. ``tensor(float)``."""
    names = {FLOAT: "float", DOUBLE: "double", FLOAT16: "float16", BOOL: "bool", STRING: "string"}
    return f"tensor({names.get(elem_type, dtype_name(elem_type))})"


@dataclass(frozen=True)
class TensorType:
    """A tensor of ``dtype`` (an ONNX data-type code) and ``shape`` (None: unknown rank)."""

    dtype: int
    shape: Optional[tuple[Dim, ...]] = None

    @property
    def rank(self) -> Optional[int]:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        # Expr has no subclasses: comparing types runs in C, with no generator.
        return self.shape is not None and Expr not in map(type, self.shape)

    def with_shape(self, shape) -> "TensorType":
        return TensorType(self.dtype, None if shape is None else tuple(shape))

    def with_dtype(self, dtype: int) -> "TensorType":
        return TensorType(dtype, self.shape)

    def __str__(self) -> str:
        if self.shape is None:
            return f"{dtype_name(self.dtype)}[?]"
        return f"{dtype_name(self.dtype)}[{', '.join(to_string(d) for d in self.shape)}]"


@dataclass(frozen=True)
class SequenceType:
    """An ONNX sequence of tensors (or of other types)."""

    elem: Optional["ValueType"]

    def __str__(self) -> str:
        return f"seq({self.elem if self.elem is not None else '?'})"


@dataclass(frozen=True)
class OptionalType:
    """An ONNX optional value."""

    elem: Optional["ValueType"]

    def __str__(self) -> str:
        return f"optional({self.elem if self.elem is not None else '?'})"


ValueType = Union[TensorType, SequenceType, OptionalType]


def tensor_type_of(array: np.ndarray) -> TensorType:
    """The static type of a concrete NumPy array."""
    return TensorType(from_numpy_dtype(array.dtype), array.shape)  # a tuple of Python ints
