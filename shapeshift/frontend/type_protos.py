"""Conversion between ONNX TypeProtos and the IR's value types.

Symbolic dims are written as ``dim_param`` text; reading maps each symbolic
dim through a caller-supplied function (the importer's symbol table, or the
delegated rules' mapping back to the input dims).
"""

from __future__ import annotations

from typing import Optional

import onnx

from ..ir.types import OptionalType, SequenceType, TensorType, ValueType
from ..symbolic import Expr, to_string


def type_proto(t: Optional[ValueType]) -> onnx.TypeProto:
    proto = onnx.TypeProto()
    if isinstance(t, TensorType):
        proto.tensor_type.elem_type = t.dtype
        if t.shape is not None:
            proto.tensor_type.shape.SetInParent()
            for d in t.shape:
                dim = proto.tensor_type.shape.dim.add()
                if isinstance(d, Expr):
                    dim.dim_param = to_string(d)
                else:
                    dim.dim_value = int(d)
    elif isinstance(t, SequenceType):
        proto.sequence_type.elem_type.CopyFrom(type_proto(t.elem))
    elif isinstance(t, OptionalType):
        proto.optional_type.elem_type.CopyFrom(type_proto(t.elem))
    return proto


def type_from_proto(proto: onnx.TypeProto, dim_of=None) -> Optional[ValueType]:
    """Convert a TypeProto; ``dim_of(dim_proto)`` maps a symbolic dim to a Dim."""
    kind = proto.WhichOneof("value")
    if kind == "tensor_type":
        tt = proto.tensor_type
        if not tt.HasField("shape"):
            return TensorType(tt.elem_type, None)
        dims = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:  # some converters write -1 for "unknown"
                dims.append(int(d.dim_value))
            elif dim_of is not None:
                dims.append(dim_of(d))
            else:
                return TensorType(tt.elem_type, None)
        return TensorType(tt.elem_type, tuple(dims))
    if kind == "sequence_type":
        return SequenceType(type_from_proto(proto.sequence_type.elem_type, dim_of))
    if kind == "optional_type":
        return OptionalType(type_from_proto(proto.optional_type.elem_type, dim_of))
    return None
