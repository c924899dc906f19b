"""Counting what simplification changed: nodes, ops, Shape ops and dynamic ops left."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Optional

import onnx

from ...frontend.external_data import has_external_data, nbytes
from ...ops import lookup


@dataclass
class ModelCounts:
    nodes: int
    ops: collections.Counter
    shape_ops: int
    dynamic_ops: int
    size_bytes: int


def _walk(graph: onnx.GraphProto):
    for node in graph.node:
        yield graph, node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _walk(attr.g)
            for sub in attr.graphs:
                yield from _walk(sub)


def _constant_names(model: onnx.ModelProto) -> set[str]:
    names = {t.name for t in model.graph.initializer}
    seen = {id(model.graph)}
    for graph, node in _walk(model.graph):
        if id(graph) not in seen:  # each graph's initializers once, not once per node
            seen.add(id(graph))
            names.update(t.name for t in graph.initializer)
        if node.op_type == "Constant":
            names.update(node.output)
    return names


def count_model(model: onnx.ModelProto, size_bytes: Optional[int] = None) -> ModelCounts:
    """Counts for an ONNX model; a dynamic op has a parameter input that is not a constant.
    ``size_bytes``: its size when known (else it is serialized to learn it: a second on a
    BERT-base)."""
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    constants = _constant_names(model)
    ops: collections.Counter = collections.Counter()
    dynamic = 0
    for _, node in _walk(model.graph):
        ops[node.op_type] += 1
        rule = lookup(node.domain, node.op_type, opsets.get(node.domain or "", 1))
        if rule is not None and any(i < len(node.input) and node.input[i] and node.input[i] not in constants
                                    for i in rule.params):
            dynamic += 1
    size = _serialized_size(model) if size_bytes is None else size_bytes
    return ModelCounts(sum(ops.values()), ops, ops["Shape"], dynamic, size)


#: protobuf cannot encode a message of 2 GiB or more (ByteSize raises EncodeError).
PROTOBUF_LIMIT = 2**31 - 1


def _serialized_size(model: onnx.ModelProto) -> int:
    """The model's size as one protobuf or, when its tensors are past protobuf's limit or in
    external files (it is then written with external data), the bytes of its tensors plus
    its nodes' encoding (to within field headers): ModelProto.ByteSize encodes, which fails
    on such a model, and only after it allocated the buffer."""
    # Sized from dims: reading raw_data copies it out of the proto.
    tensors = sum(nbytes(t) for t in model.graph.initializer)
    if tensors < PROTOBUF_LIMIT // 2 and not has_external_data(model):
        return model.ByteSize()
    return tensors + sum(n.ByteSize() for n in model.graph.node)
