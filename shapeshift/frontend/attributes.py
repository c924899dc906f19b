"""Conversion between ONNX AttributeProto and the IR's plain attribute values.

In the IR an attribute is a plain Python value: ``int``, ``float``, ``str``
(decoded UTF-8), ``np.ndarray`` (tensor), a nested ``Graph``, or a list of
these.  Sparse tensors and type protos are rare and kept as their protos.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from ..errors import InvalidModelError
from ..ir.types import PLAIN_TYPES, STRING, to_numpy_dtype

A = AttributeProto

#: ONNX types whose raw_data holds exactly the bytes of the NumPy array (on a
#: little-endian host): these are read without numpy_helper's generic checks.
_RAW_DTYPES = {t: to_numpy_dtype(t) for t in PLAIN_TYPES - {STRING}}


def raw_dtype(tensor: onnx.TensorProto) -> Optional[np.dtype]:
    """The NumPy dtype whose bytes ``tensor``'s raw data holds exactly, when it holds its
    contents that way (raw data of a native NumPy type, in the proto itself): the
    common case, which ``raw_array`` reads without numpy_helper's generic checks."""
    dtype = _RAW_DTYPES.get(tensor.data_type)
    if (dtype is None or sys.byteorder != "little" or not tensor.HasField("raw_data")
            or tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.HasField("segment")):
        return None
    return dtype


def raw_array(tensor: onnx.TensorProto, dtype: np.dtype) -> np.ndarray:
    """The array of a tensor ``raw_dtype`` accepted (read-only, over a copy of its bytes)."""
    # dims[:] is a list: NumPy reads it several times faster than the proto's container.
    dims = tensor.dims[:]
    array = np.frombuffer(tensor.raw_data, dtype=dtype)
    # A 1-D tensor is read as it is (most small constants: axes, shape pieces); a
    # reshape costs as much again as the read.
    return array if len(dims) == 1 and dims[0] == array.size else array.reshape(dims)


def tensor_array(tensor: onnx.TensorProto) -> np.ndarray:
    """numpy_helper.to_array, with a short path for the common case (see raw_dtype)."""
    dtype = raw_dtype(tensor)
    if dtype is None:
        try:
            return numpy_helper.to_array(tensor)
        except (onnx.checker.ValidationError, OSError) as exc:
            # External data that is missing, or whose location leaves the model's folder.
            raise InvalidModelError(f"tensor {tensor.name!r}: its data cannot be read: {exc}") from exc
    return raw_array(tensor, dtype)


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def attribute_value(attr: AttributeProto, load_graph: Optional[Callable[[onnx.GraphProto], Any]] = None) -> Any:
    """The IR value of ``attr``; ``load_graph`` turns a GraphProto into a Graph."""
    kind = attr.type
    if kind == A.INT:
        return int(attr.i)
    if kind == A.FLOAT:
        return float(attr.f)
    if kind == A.STRING:
        return _decode(attr.s)
    if kind == A.TENSOR:
        return tensor_array(attr.t)
    if kind == A.GRAPH:
        return load_graph(attr.g) if load_graph else attr.g
    if kind == A.INTS:
        return [int(v) for v in attr.ints]
    if kind == A.FLOATS:
        return [float(v) for v in attr.floats]
    if kind == A.STRINGS:
        return [_decode(v) for v in attr.strings]
    if kind == A.TENSORS:
        return [tensor_array(t) for t in attr.tensors]
    if kind == A.GRAPHS:
        return [load_graph(g) if load_graph else g for g in attr.graphs]
    if kind == A.SPARSE_TENSOR:
        return attr.sparse_tensor
    if kind == A.SPARSE_TENSORS:
        return list(attr.sparse_tensors)
    if kind == A.TYPE_PROTO:
        return attr.tp
    if kind == A.TYPE_PROTOS:
        return list(attr.type_protos)
    # An attribute with no type set: fall back on whichever field is filled.
    return helper.get_attribute_value(attr)


def node_attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """All attributes of a NodeProto as IR values (subgraphs left as protos)."""
    return {a.name: attribute_value(a) for a in node.attribute}


def _infer_type(value: Any) -> int:
    if isinstance(value, bool) or isinstance(value, (int, np.integer)):
        return A.INT
    if isinstance(value, (float, np.floating)):
        return A.FLOAT
    if isinstance(value, (str, bytes)):
        return A.STRING
    if isinstance(value, np.ndarray):
        return A.TENSOR
    if isinstance(value, onnx.GraphProto) or hasattr(value, "nodes"):
        return A.GRAPH
    if isinstance(value, onnx.SparseTensorProto):
        return A.SPARSE_TENSOR
    if isinstance(value, onnx.TypeProto):
        return A.TYPE_PROTO
    if isinstance(value, (list, tuple)):
        if not value:
            return A.INTS
        single = _infer_type(value[0])
        return {A.INT: A.INTS, A.FLOAT: A.FLOATS, A.STRING: A.STRINGS, A.TENSOR: A.TENSORS,
                A.GRAPH: A.GRAPHS, A.SPARSE_TENSOR: A.SPARSE_TENSORS, A.TYPE_PROTO: A.TYPE_PROTOS}[single]
    raise TypeError(f"cannot store {type(value).__name__} as an ONNX attribute")


def make_attribute(name: str, value: Any, attr_type: Optional[int] = None,
                   save_graph: Optional[Callable[[Any], onnx.GraphProto]] = None) -> AttributeProto:
    """The AttributeProto for an IR value; ``save_graph`` turns a Graph into a GraphProto."""
    write_graph = None if save_graph is None else (lambda proto, graph: proto.CopyFrom(save_graph(graph)))
    attr = AttributeProto()
    fill_attribute(attr, name, value, attr_type, write_graph)
    return attr


def fill_attribute(attr: AttributeProto, name: str, value: Any, attr_type: Optional[int] = None,
                   write_graph: Optional[Callable[[onnx.GraphProto, Any], None]] = None) -> None:
    """Write an IR value into the empty ``attr``; ``write_graph(proto, graph)`` writes a
    Graph into an empty GraphProto (in place: a body's weights are not copied again)."""
    kind = attr_type if attr_type is not None else _infer_type(value)
    if kind == A.INTS and value and isinstance(value[0], (float, np.floating)):
        kind = A.FLOATS
    attr.name = name
    attr.type = kind
    if kind == A.INT:
        attr.i = int(value)
    elif kind == A.FLOAT:
        attr.f = float(value)
    elif kind == A.STRING:
        attr.s = value if isinstance(value, bytes) else str(value).encode("utf-8")
    elif kind == A.TENSOR:
        attr.t.CopyFrom(numpy_helper.from_array(np.asarray(value)))
    elif kind == A.GRAPH:
        if write_graph is not None and not isinstance(value, onnx.GraphProto):
            write_graph(attr.g, value)
        else:
            attr.g.CopyFrom(value)
    elif kind == A.INTS:
        attr.ints.extend(int(v) for v in value)
    elif kind == A.FLOATS:
        attr.floats.extend(float(v) for v in value)
    elif kind == A.STRINGS:
        attr.strings.extend(v if isinstance(v, bytes) else str(v).encode("utf-8") for v in value)
    elif kind == A.TENSORS:
        attr.tensors.extend(numpy_helper.from_array(np.asarray(v)) for v in value)
    elif kind == A.GRAPHS:
        for graph in value:
            if write_graph is not None and not isinstance(graph, onnx.GraphProto):
                write_graph(attr.graphs.add(), graph)
            else:
                attr.graphs.append(graph)
    elif kind == A.SPARSE_TENSOR:
        attr.sparse_tensor.CopyFrom(value)
    elif kind == A.SPARSE_TENSORS:
        attr.sparse_tensors.extend(value)
    elif kind == A.TYPE_PROTO:
        attr.tp.CopyFrom(value)
    elif kind == A.TYPE_PROTOS:
        attr.type_protos.extend(value)
