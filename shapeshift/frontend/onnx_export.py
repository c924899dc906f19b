"""Export the graph IR back to an ONNX ModelProto.

Symbolic dims are written as ``dim_param`` text (``seq``, ``past_seq + seq``);
unknown dims and ranks are left out.  Inputs, outputs, initializers, node
attributes and nested subgraphs are written as the importer read them; the
opset imports, IR version and producer of the imported model are kept.
Outputs of a node that nothing reads and that are not graph outputs keep the
empty name ONNX uses for "not requested".
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..ir.graph import Graph, Value
from .attributes import make_attribute
from .param_export import ParamEmitter
from ..ops.symbolic_tensor import DOMAIN as SYMBOLIC_DOMAIN
from ..ops.symbolic_tensor import OP_TYPE as SYMBOLIC_OP
from .type_protos import type_proto

#: The IR version written when the graph was not imported from a model.
DEFAULT_IR_VERSION = 10


def _value_info(value: Value) -> onnx.ValueInfoProto:
    info = onnx.ValueInfoProto(name=value.name)
    if value.type is not None:
        info.type.CopyFrom(type_proto(value.type))
    if value.doc:
        info.doc_string = value.doc
    return info


def _tensor(value: Value) -> onnx.TensorProto:
    array = value.const
    if array.dtype == object:
        tensor = helper.make_tensor(value.name, onnx.TensorProto.STRING, array.shape,
                                    [s if isinstance(s, bytes) else str(s).encode() for s in array.reshape(-1)])
    else:
        tensor = numpy_helper.from_array(np.asarray(array), value.name)
    return tensor


def graph_to_proto(graph: Graph, emitter: Optional[ParamEmitter] = None) -> onnx.GraphProto:
    """The GraphProto of ``graph``; static parameters are written through ``emitter``."""
    if emitter is None:
        # The emitted computations go at the top of the graph being written (the
        # root, or a body written on its own, e.g. for onnx.reference).
        emitter = ParamEmitter(graph.root)
        proto = graph_to_proto(graph, emitter)
        if emitter.nodes or emitter.initializers:
            nodes = emitter.nodes + list(proto.node)
            del proto.node[:]
            proto.node.extend(nodes)
            proto.initializer.extend(emitter.initializers)
        return proto
    proto = onnx.GraphProto(name=graph.name, doc_string=graph.doc)
    outputs = {id(v) for v in graph.outputs}
    for value in graph.inputs:
        proto.input.append(_value_info(value))
    for value in graph.initializers.values():
        proto.initializer.append(_tensor(value))
    for node in graph.nodes:
        if (node.domain, node.op_type) == (SYMBOLIC_DOMAIN, SYMBOLIC_OP):
            # Our own op: its readers read the computation of its contents from the
            # inputs directly; only a graph output keeps its name through an Identity.
            out = node.outputs[0]
            source = emitter.param(node, 0, node.params[0])
            if id(out) in outputs or _read_by_outer_output(out, graph):
                proto.node.append(helper.make_node("Identity", [source], [out.name]))
            else:
                emitter.alias[out.name] = source
            continue
        node_proto = onnx.NodeProto(op_type=node.op_type, domain=node.domain, name=node.name, doc_string=node.doc)
        node_proto.input.extend("" if v is None else emitter.alias.get(v.name, v.name) for v in node.inputs)
        for index, param in sorted(node.params.items()):
            node_proto.input[index] = emitter.param(node, index, param)
        node_proto.output.extend(
            v.name if (v.users or id(v) in outputs or _read_by_outer_output(v, graph)
                       or not _output_optional(node.domain, node.op_type, graph.opset.get(node.domain, 1), i))
            else "" for i, v in enumerate(node.outputs))
        for name, value in node.attrs.items():
            node_proto.attribute.append(make_attribute(name, value, node.attr_types.get(name),
                                                       lambda g: graph_to_proto(g, emitter)))
        proto.node.append(node_proto)
    for value in graph.outputs:
        proto.output.append(_value_info(value))
    return proto


@lru_cache(maxsize=None)
def _output_optional(domain: str, op_type: str, opset: int, index: int) -> bool:
    """True when the op's schema lets output ``index`` be left unnamed."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # noqa: BLE001 - unknown schema: keep every name
        return False
    formal = schema.outputs[min(index, len(schema.outputs) - 1)] if schema.outputs else None
    return formal is not None and formal.option == onnx.defs.OpSchema.FormalParameterOption.Optional


def _read_by_outer_output(value: Value, graph: Graph) -> bool:
    return any(value is out for g in _ancestors(graph) for out in g.outputs)


def _ancestors(graph: Graph):
    while graph is not None:
        yield graph
        graph = graph.parent


def _list_initializers_as_inputs(graph: onnx.GraphProto) -> None:
    """IR versions before 4 require every initializer to be a graph input too."""
    names = {vi.name for vi in graph.input}
    for tensor in graph.initializer:
        if tensor.name not in names:
            graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))


def export_model(graph: Graph) -> onnx.ModelProto:
    """A ModelProto for ``graph`` (a root graph)."""
    meta = graph.metadata
    opsets = meta.get("opset_imports") or graph.opset
    model = helper.make_model(
        graph_to_proto(graph),
        opset_imports=[helper.make_opsetid(domain, version) for domain, version in opsets.items()],
        producer_name=meta.get("producer_name") or "shapeshift",
        producer_version=meta.get("producer_version") or "",
    )
    model.ir_version = meta.get("ir_version") or DEFAULT_IR_VERSION
    if model.ir_version < 4:
        _list_initializers_as_inputs(model.graph)
    if meta.get("doc_string"):
        model.doc_string = meta["doc_string"]
    if meta.get("model_version"):
        model.model_version = meta["model_version"]
    for key, value in (meta.get("metadata_props") or {}).items():
        model.metadata_props.add(key=key, value=value)
    return model
