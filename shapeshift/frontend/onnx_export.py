"""Export the graph IR back to an ONNX ModelProto.

Symbolic dims are written as ``dim_param`` text (``seq``, ``past_seq + seq``);
unknown dims and ranks are left out.  Inputs, outputs, initializers, node
attributes and nested subgraphs are written as the importer read them; the
opset imports, IR version and producer of the imported model are kept.
Outputs of a node that nothing reads and that are not graph outputs keep the
empty name ONNX uses for "not requested".

Weights dominate the cost: an initializer still holding the array it was
imported with (``Value.const_source``) is copied from its original TensorProto
rather than re-encoded, and the ModelProto is filled in place, so each weight
is copied once.  A caller that owns the imported ModelProto and has no further
use for it (``simplify`` of a path) can pass it as ``reuse``: the unchanged
weights then stay where they are and are not copied at all.
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import Optional

import numpy as np
import onnx
from google.protobuf.unknown_fields import UnknownFieldSet
from onnx import helper, numpy_helper

from ..errors import ModelLoadError
from ..ir.graph import Graph, Value
from .attributes import fill_attribute
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


#: numpy_helper.from_array fills only name, dims, data_type and raw_data: a tensor
#: read from a model with none of these other fields set is exactly what
#: re-encoding its array would give, so it is copied as it is.
_OTHER_TENSOR_FIELDS = [f for f in onnx.TensorProto.DESCRIPTOR.fields
                        if f.name not in ("name", "dims", "data_type", "raw_data")]
_OTHER_SINGULAR = tuple(f.name for f in _OTHER_TENSOR_FIELDS if f.has_presence)
_OTHER_REPEATED = tuple(f.name for f in _OTHER_TENSOR_FIELDS if not f.has_presence)


def _is_plain(tensor: onnx.TensorProto) -> bool:
    """Raw data and nothing else, or a reference to external data (a model read with its
    external data left in place): either is written back as it is.  A data_location set
    to DEFAULT (onnx.load writes it when it loads external data) changes nothing."""
    # Field by field: ListFields() would copy raw_data out just to look at it.
    external = tensor.data_location == onnx.TensorProto.EXTERNAL
    if not external and not tensor.HasField("raw_data"):
        return False
    for name in _OTHER_SINGULAR:
        if tensor.HasField(name) and name != "data_location":
            return False
    for name in _OTHER_REPEATED:
        if getattr(tensor, name) and not (external and name == "external_data"):
            return False
    return True


def _unchanged_source(value: Value) -> Optional[onnx.TensorProto]:
    """The TensorProto ``value`` was imported from, if its contents and name are unchanged."""
    if not value.const_is_source():  # asked without making a lazy constant's array
        return None
    tensor = value.const_source[1]
    return tensor if tensor.name == value.name and _is_plain(tensor) else None


def _tensor(value: Value) -> onnx.TensorProto:
    source = _unchanged_source(value)
    if source is not None:
        return source
    array = value.const
    if array.dtype == object:
        tensor = helper.make_tensor(value.name, onnx.TensorProto.STRING, array.shape,
                                    [s if isinstance(s, bytes) else str(s).encode() for s in array.reshape(-1)])
    else:
        tensor = numpy_helper.from_array(np.asarray(array), value.name)
    return tensor


def graph_to_proto(graph: Graph, emitter: Optional[ParamEmitter] = None) -> onnx.GraphProto:
    """The GraphProto of ``graph``; static parameters are written through ``emitter``."""
    proto = onnx.GraphProto()
    write_graph(proto, graph, emitter)
    return proto


def write_graph(proto: onnx.GraphProto, graph: Graph, emitter: Optional[ParamEmitter] = None,
                kept: int = 0) -> None:
    """Fill ``proto`` (written in place: a weight is copied once, not again into its
    model); static parameters are written through ``emitter``.  ``proto`` is empty but
    for its first ``kept`` initializers, which are those ``graph`` writes first."""
    if emitter is None:
        # The emitted computations go at the top of the graph being written (the
        # root, or a body written on its own, e.g. for onnx.reference); they are
        # known once the nodes are written, so they are inserted in front after: the
        # nodes (and the bodies and weights they hold) are not copied to a new list.
        emitter = ParamEmitter(graph.root)
        _write_parts(proto, graph, emitter, kept)
        for index, node in enumerate(emitter.nodes):
            proto.node.insert(index, node)
        proto.initializer.extend(emitter.initializers)
    else:
        _write_parts(proto, graph, emitter)


def _write_parts(proto: onnx.GraphProto, graph: Graph, emitter: ParamEmitter, kept: int = 0) -> None:
    """Write ``graph`` into ``proto``, each node and body built in place, not built and
    then copied; the first ``kept`` initializers are in ``proto`` already."""
    proto.name = graph.name
    proto.doc_string = graph.doc
    outputs = {id(v) for v in graph.outputs}
    for value in graph.inputs:
        proto.input.append(_value_info(value))
    for value in itertools.islice(graph.initializers.values(), kept, None):
        proto.initializer.add().CopyFrom(_tensor(value))
    alias = emitter.alias
    opset = graph.opset

    def write_body(body_proto: onnx.GraphProto, body: Graph) -> None:
        write_graph(body_proto, body, emitter)

    nodes = proto.node
    for node in graph.nodes:
        domain, op_type = node.domain, node.op_type
        if domain == SYMBOLIC_DOMAIN and op_type == SYMBOLIC_OP:
            # Our own op: its readers read the computation of its contents from the
            # inputs directly; only a graph output keeps its name through an Identity.
            out = node.outputs[0]
            source = emitter.param(node, 0, node.params[0])
            if id(out) in outputs or _read_by_outer_output(out, graph):
                nodes.add(op_type="Identity", input=[source], output=[out.name])
            else:
                alias[out.name] = source
            continue
        inputs = ["" if v is None else alias.get(v.name, v.name) for v in node.inputs]
        if node.params:
            for index, param in sorted(node.params.items()):
                inputs[index] = emitter.param(node, index, param)
        output_names = [
            v.name if (v.users or id(v) in outputs or _read_by_outer_output(v, graph)
                       or not _output_optional(domain, op_type, opset.get(domain, 1), i))
            else "" for i, v in enumerate(node.outputs)]
        node_proto = nodes.add(op_type=op_type, domain=domain, name=node.name, doc_string=node.doc,
                               input=inputs, output=output_names)
        if node.attrs:
            for name, value in node.attrs.items():
                fill_attribute(node_proto.attribute.add(), name, value, node.attr_types.get(name), write_body)
    for value in graph.outputs:
        proto.output.append(_value_info(value))


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


def _keep_weights(graph: Graph, model: onnx.ModelProto) -> int:
    """Empty ``model`` but for the initializers ``graph`` would write unchanged, in the
    order it writes them, ahead of any it writes otherwise; returns how many stayed.
    Returns -1, touching nothing, when the model holds what a fresh one would not
    (fields this version of onnx does not know) or the order does not allow it."""
    if UnknownFieldSet(model) or UnknownFieldSet(model.graph):
        return -1
    originals = model.graph.initializer
    position = {id(tensor): index for index, tensor in enumerate(originals)}
    keep: list[int] = []
    for value in graph.initializers.values():
        index = position.get(id(_unchanged_source(value)), -1)
        if index < 0:
            break
        if keep and index <= keep[-1]:
            return -1
        keep.append(index)
    wanted = set(keep)
    for index in reversed(range(len(originals))):
        if index not in wanted:
            del originals[index]
    for field in _MODEL_FIELDS:
        model.ClearField(field)
    for field in _GRAPH_FIELDS:
        model.graph.ClearField(field)
    return len(keep)


_MODEL_FIELDS = tuple(f.name for f in onnx.ModelProto.DESCRIPTOR.fields if f.name != "graph")
_GRAPH_FIELDS = tuple(f.name for f in onnx.GraphProto.DESCRIPTOR.fields if f.name != "initializer")


def export_model(graph: Graph, reuse: Optional[onnx.ModelProto] = None) -> onnx.ModelProto:
    """A ModelProto for ``graph`` (a root graph).  ``reuse``: the ModelProto ``graph``
    was imported from, given up by its owner; it becomes the result, keeping the
    weights that did not change where they are instead of copying them."""
    try:
        return _export_model(graph, reuse)
    except UnicodeDecodeError as exc:
        # protobuf reads a string field that is not UTF-8 as bytes, and refuses to write it.
        source = graph.metadata.get("source") or "model"
        raise ModelLoadError(f"{source}: text that is not valid UTF-8 ({exc.object[:40]!r}) cannot be "
                             "written back to ONNX") from None


def _export_model(graph: Graph, reuse: Optional[onnx.ModelProto]) -> onnx.ModelProto:
    meta = graph.metadata
    opsets = meta.get("opset_imports") or graph.opset
    kept = -1 if reuse is None else _keep_weights(graph, reuse)
    # Built in place rather than by helper.make_model, which would copy the whole graph.
    model = onnx.ModelProto() if kept < 0 else reuse
    model.ir_version = meta.get("ir_version") or DEFAULT_IR_VERSION
    write_graph(model.graph, graph, kept=max(kept, 0))
    model.opset_import.extend(helper.make_opsetid(domain, version) for domain, version in opsets.items())
    model.producer_name = meta.get("producer_name") or "shapeshift"
    model.producer_version = meta.get("producer_version") or ""
    if model.ir_version < 4:
        _list_initializers_as_inputs(model.graph)
    if meta.get("doc_string"):
        model.doc_string = meta["doc_string"]
    if meta.get("model_version"):
        model.model_version = meta["model_version"]
    for key, value in (meta.get("metadata_props") or {}).items():
        model.metadata_props.add(key=key, value=value)
    return model
