"""Check every node's input element types against its op's ONNX type constraints.

The validator (validate.py) reads the protos before import and cannot know the type of a
value a node computes; this check runs after type inference, when every tensor's element
type is known. A model that breaks a constraint -- a TopK over bool, a Gemm with an int32
bias beside float inputs, an Add of float and int64 -- is one onnxruntime refuses at load
("Type Error: Type (tensor(bool)) of input parameter ... is invalid"); without this check it
was accepted and ran to some answer on one backend or the other. One InvalidModelError names
the node, the input and the types its op allows.

What is checked, for each node of the default domain that onnx has a schema for (in every
graph and body): a formal input typed by a constraint (``T``) accepts only that constraint's
tensor types, one typed by a fixed type (Expand's shape, ``tensor(int64)``) only that type,
and every input bound to the same constraint has the same element type (but
the items of a heterogeneous variadic input, such as a Scan's states, each have their own).
Inputs whose type inference left unknown, and non-tensor values (sequences, optionals), are
left to the op's own rule.
"""

from __future__ import annotations

import functools
from typing import Optional

from onnx import TensorProto

from ..errors import InvalidModelError
from ..ir.graph import Graph, Node
from ..ir.types import TensorType
from .validate import op_spec


@functools.lru_cache(maxsize=64)
def _tensor_type_str(dtype: int) -> Optional[str]:
    try:
        return f"tensor({TensorProto.DataType.Name(dtype).lower()})"
    except ValueError:
        return None


def check_element_types(graph: Graph, label: str = "model") -> None:
    """Raise InvalidModelError at the first node whose input element types its op refuses."""
    for node in graph.nodes:
        if node.domain in ("", "ai.onnx"):
            _check_node(node, graph.opset.get("", 0), label)
        for body in node.subgraphs():
            check_element_types(body, label)


def _check_node(node: Node, version: int, label: str) -> None:
    spec = op_spec("", node.op_type, version)
    if spec is None:
        return
    formals, allowed = spec.input_types, spec.type_constraints
    bound: dict[str, tuple[str, int]] = {}  # constraint -> (its first type, the input that set it)
    for index, value in enumerate(node.inputs):
        if value is None or not formals:
            continue
        type_str, variadic, homogeneous = formals[index] if index < len(formals) else formals[-1]
        if index >= len(formals) and not variadic:
            continue  # arity is the validator's check
        # A formal typed by a constraint, or by one fixed type (Expand's and Reshape's shape:
        # tensor(int64); a float there was taken as a shape of its values cast).
        fixed = type_str not in allowed and type_str.startswith("tensor(")
        kinds = (type_str,) if fixed else allowed.get(type_str)
        vtype = value.type
        if kinds is None or not isinstance(vtype, TensorType) or not vtype.dtype:
            continue
        got = _tensor_type_str(vtype.dtype)
        if got is None or not any(k.startswith("tensor(") for k in kinds):
            continue
        if got not in kinds and fixed:
            raise InvalidModelError(f"{label}: {node.describe()}: input {index} ({value.name!r}) is {got}, where "
                                    f"{node.op_type} (opset {version}) takes {type_str} only")
        if got not in kinds:
            tensors = sorted(k[7:-1] for k in kinds if k.startswith("tensor("))
            raise InvalidModelError(
                f"{label}: {node.describe()}: input {index} ({value.name!r}) is {got}, which {node.op_type} "
                f"(opset {version}) does not take for {type_str}; allowed: {', '.join(tensors)}")
        if variadic and not homogeneous:
            continue  # a Scan's or Loop's states: each its own type
        first = bound.setdefault(type_str, (got, index))
        if first[0] != got:
            raise InvalidModelError(
                f"{label}: {node.describe()}: inputs {first[1]} and {index} must have the same element type "
                f"({type_str}), but are {first[0]} and {got}")
