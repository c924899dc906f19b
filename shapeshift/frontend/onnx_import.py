"""Import ONNX models into the graph IR.

Accepts a path, serialized bytes or a ModelProto.  Named dynamic dims
(``dim_param``) become symbols (a dim_param that reads as an expression, such
as ``past_seq+seq``, becomes that expression); unnamed dynamic dims get fresh
symbols, and so do the placeholders exporters write for "unknown" (``?``: see
PLACEHOLDER_DIMS), each a symbol of its own.  Model-local functions are inlined.
The model is validated first (validate.py): a malformed one is refused before
anything is built from it.  Every op of every (sub)graph is checked against the
registry first, so an unsupported model fails with one error naming all of its
unsupported ops.
"""

from __future__ import annotations

import functools
import mmap
import os
import re
from pathlib import Path
from typing import Iterator, Mapping, Optional, Union

import numpy as np
import onnx
import onnx.inliner  # noqa: F401 - a submodule plain `import onnx` does not load
import onnx.serialization  # noqa: F401 - likewise
from onnx import external_data_helper, numpy_helper

from ..errors import ExpressionError, InputError, InvalidModelError, ModelLoadError, UnsupportedModelError
from ..ir.graph import Graph, SymbolTable, Value
from ..ir.types import TensorType
from ..ops import lookup
from ..passes.infer_types import infer_types
from ..symbolic import Dim, free_symbols, parse_dim, substitute
from .attributes import attribute_value, raw_array, raw_dtype, tensor_array
from .type_protos import type_from_proto
from .element_types import check_element_types
from .validate import validate_model

ModelSource = Union[str, os.PathLike, bytes, onnx.ModelProto]

#: The oldest default-domain opset we accept (the ONNX backend tests go back to 1).
MIN_OPSET = 1
#: What _sanitize replaces: ``\W`` is exactly "neither isalnum() nor '_'".
_NON_WORD = re.compile(r"\W")
#: dim_param texts exporters write for "unknown", not names: paddle2onnx writes "?" on every
#: unknown dim, and converters that print a shape write Python's None or -1. Read as names,
#: all the unknown dims of a model were one symbol (an image fed 48x192 was a SymbolConflictError);
#: each is a fresh symbol of its own, as a dim with no dim_param is. (onnx's own "unk__N" names
#: are unique already, and kept.)
PLACEHOLDER_DIMS = frozenset({"?", "-1", "None", "none", "null", "unknown", "*"})
#: Attribute types whose ``graphs`` field may be filled (an untyped attribute may hold anything).
_MAY_HOLD_GRAPHS = (onnx.AttributeProto.GRAPHS, onnx.AttributeProto.UNDEFINED)
#: Element type codes a declared tensor type may hold (UNDEFINED: not said).
_ELEMENT_TYPES = frozenset(onnx.TensorProto.DataType.values())
_EXTERNAL = onnx.TensorProto.EXTERNAL


def source_label(source: ModelSource) -> str:
    """How errors name a model: its path, or "model"."""
    return str(source) if isinstance(source, (str, os.PathLike)) else "model"


def read_model(source: ModelSource) -> onnx.ModelProto:
    """Load a ModelProto with its external data; errors name the file."""
    if isinstance(source, onnx.ModelProto):
        return source  # not read_model_sized: it would serialize the model to size it
    return read_model_sized(source)[0]


def read_model_sized(source: ModelSource, load_external: bool = True) -> tuple[onnx.ModelProto, int]:
    """read_model, and the model's size in bytes as stored: its file and the external data
    files it reads, the bytes given, or a ModelProto's serialized size (the one costly
    case: serializing is the only way protobuf tells it).

    ``load_external=False`` leaves tensors stored in external files there (import them
    with ``external_dir``): loading one copies it twice over, the file's bytes and then
    protobuf's copy of them, so a model of 2 GB peaked at 4.4 GB just being read."""
    if isinstance(source, onnx.ModelProto):
        return source, source.ByteSize()
    if isinstance(source, (bytes, bytearray)):
        model = onnx.ModelProto()
        try:
            model.ParseFromString(bytes(source))
        except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError and others
            raise ModelLoadError(f"the given bytes are not an ONNX model ({type(exc).__name__}: {exc})") from None
        if not model.graph.node and not model.graph.output and not model.opset_import:
            raise ModelLoadError("the given bytes are not an ONNX model (no graph, no opset)")
        return model, len(source)
    path = Path(source)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    if path.is_dir():
        raise ModelLoadError(f"{path}: is a directory, not an ONNX model")
    try:
        # What onnx.load(path) does, in two steps so that the external files are known.
        model = _parse_file(path)
        external = {external_data_helper.ExternalDataInfo(t).location for t in _external_tensors(model.graph)}
        if external and load_external:
            external_data_helper.load_external_data_for_model(model, str(path.parent))
        size = path.stat().st_size + sum((path.parent / location).stat().st_size for location in external)
    except FileNotFoundError as exc:
        raise ModelLoadError(f"{path}: external data file missing ({exc.filename or exc})") from None
    except Exception as exc:  # noqa: BLE001
        if _is_artifact(path):
            raise ModelLoadError(f"{path}: a compiled artifact (shapeshift compile), not an ONNX model; give the "
                                 "model it was compiled from, or run the artifact itself") from None
        raise ModelLoadError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not model.graph.node and not model.graph.output and not model.opset_import:
        raise ModelLoadError(f"{path}: not an ONNX model (no graph, no opset)")
    return model, size


def _is_artifact(path: Path) -> bool:
    from ..runtime.artifact import is_artifact  # only on this error path: the runtime is not import's

    return is_artifact(path)


def _parse_file(path: Path) -> onnx.ModelProto:
    """The ModelProto stored in ``path`` (its external data not loaded).

    A binary model is parsed straight from a read-only mapping of the file, its pages
    mapped in one call (MAP_POPULATE), not read into a buffer first: that buffer is as
    large as the file, and each of its pages was a fault of its own, about half of
    the time of a small model's read. Text formats, and files that cannot be mapped
    (empty, or on a file system without mmap), go through onnx.load.
    """
    if onnx.serialization.registry.get_format_from_file_extension(path.suffix) not in (None, "protobuf"):
        return onnx.load(str(path), load_external_data=False)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            mapping = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0),
                                prot=mmap.PROT_READ)
        finally:
            os.close(fd)
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        return onnx.load(str(path), load_external_data=False)
    model = onnx.ModelProto()
    try:
        with memoryview(mapping) as view:
            model.ParseFromString(view)  # copies what it keeps: the mapping can go
    finally:
        mapping.close()
    return model


def _external_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of ``graph`` and its bodies (initializers and tensor attributes)
    whose data lies in an external file.

    Asked of every model read from a path, most of which have none: the attribute type
    says where a tensor or body can be, so most attributes are passed over unread
    (onnx's own walk asks each one for all four kinds, a third of a small model's read).
    """
    for tensor in graph.initializer:
        if tensor.data_location == _EXTERNAL:
            yield tensor
    for node in graph.node:
        if not len(node.attribute):
            continue
        for attr in node.attribute:
            kind = attr.type
            if kind == onnx.AttributeProto.TENSOR or kind == onnx.AttributeProto.UNDEFINED and attr.HasField("t"):
                if attr.t.data_location == _EXTERNAL:
                    yield attr.t
            if kind == onnx.AttributeProto.TENSORS or kind == onnx.AttributeProto.UNDEFINED:
                yield from (t for t in attr.tensors if t.data_location == _EXTERNAL)
            if kind == onnx.AttributeProto.GRAPH or kind == onnx.AttributeProto.UNDEFINED and attr.HasField("g"):
                yield from _external_tensors(attr.g)
            if kind in _MAY_HOLD_GRAPHS:
                for body in attr.graphs:
                    yield from _external_tensors(body)


def _default_opset(model: onnx.ModelProto) -> dict[str, int]:
    opsets = {}
    for entry in model.opset_import:
        opsets["" if entry.domain == "ai.onnx" else entry.domain] = int(entry.version)
    if not opsets:
        opsets[""] = 1  # IR versions before opset_import existed default to opset 1
    return opsets


def check_opset(model: onnx.ModelProto, source_label: str = "model") -> None:
    """Refuse default-domain opsets the installed onnx does not define."""
    opsets = _default_opset(model)
    latest = onnx.defs.onnx_opset_version()
    default = opsets.get("")
    if default is not None and not MIN_OPSET <= default <= latest:
        raise UnsupportedModelError(
            f"{source_label}: default-domain opset {default} is not supported (supported: {MIN_OPSET} to {latest})")


def check_supported(model: onnx.ModelProto, source_label: str = "model") -> None:
    """Raise one UnsupportedModelError listing every unsupported op or domain."""
    support = _SupportCheck(_default_opset(model))
    support.walk(model.graph)
    support.raise_if_missing(source_label)


def unsupported_ops(model: onnx.ModelProto) -> dict[str, int]:
    """Every op (with its count) that neither our tables nor onnx.reference can run."""
    support = _SupportCheck(_default_opset(model))
    support.walk(model.graph)
    return support.missing


class _SupportCheck:
    """Counts the ops of one model that neither our tables nor onnx.reference can run.

    Import notes each node as it reads it (a walk of its own would read every
    node's fields again); ``walk`` serves those who only ask.  A model repeats a
    few dozen op kinds: each is looked up once, and only a missing one gets a label.
    """

    def __init__(self, opsets: dict[str, int]):
        self.opsets = opsets
        self.missing: dict[str, int] = {}
        # (domain as written, op) -> None if supported, else the op's label in the error.
        self._known: dict[tuple[str, str], Optional[str]] = {}

    def note(self, raw_domain: str, op_type: str) -> None:
        key = (raw_domain, op_type)
        if key not in self._known:
            self._known[key] = self._label_if_missing(raw_domain, op_type)
        label = self._known[key]
        if label is not None:
            self.missing[label] = self.missing.get(label, 0) + 1

    def _label_if_missing(self, raw_domain: str, op_type: str) -> Optional[str]:
        domain = "" if raw_domain == "ai.onnx" else raw_domain
        version = self.opsets.get(domain)
        if version is not None and lookup(domain, op_type, version) is not None:
            return None
        if not isinstance(op_type, str):  # not valid UTF-8: protobuf hands the bytes over
            op_type = f"{op_type!r} (not UTF-8)"
        label = f"{domain}::{op_type}" if domain else op_type
        return label if domain in self.opsets else f"{label} (domain {domain!r} not imported)"

    def walk(self, graph: onnx.GraphProto) -> None:
        for node in graph.node:
            self.note(node.domain, node.op_type)
            if len(node.attribute):  # most nodes have none: skip making the iterator
                for attr in node.attribute:
                    kind = attr.type
                    if kind == onnx.AttributeProto.GRAPH:
                        self.walk(attr.g)
                    elif kind in _MAY_HOLD_GRAPHS:
                        for sub in attr.graphs:
                            self.walk(sub)

    def raise_if_missing(self, source_label: str) -> None:
        if self.missing:
            listed = ", ".join(f"{op} x{count}" for op, count in sorted(self.missing.items()))
            raise UnsupportedModelError(f"{source_label}: unsupported ops: {listed}")


class _Importer:
    def __init__(self, model: onnx.ModelProto, symbols: SymbolTable, keep_tensors: bool = False,
                 support: Optional[_SupportCheck] = None, constants_as_initializers: bool = False,
                 external_dir: Optional[str] = None):
        self.model = model
        self.external_dir = external_dir
        self.support = support
        self.symbols = symbols
        self.keep_tensors = keep_tensors
        self.constants_as_initializers = constants_as_initializers
        self.opsets = _default_opset(model)
        # dim_param text -> Dim.  A model repeats the same few dim_params on
        # hundreds of values, and reading one that is not an expression we know
        # (``floor(height/2 - 1/2) + 1``) costs a Python parse and a failed walk.
        self._named_dims: dict[str, Dim] = {}
        # Values whose declared type (value_info) is built only when needed (Value.declared).
        self.deferred: list[Value] = []

    def settle_declared(self) -> None:
        """Type the values inference did not reach (or did not run on) as the model declared."""
        for value in self.deferred:
            if value.declared is not None:
                if value.type is None:
                    value.type = value.declared()
                value.declared = None
        self.deferred.clear()

    # -- dims and types ------------------------------------------------------
    def dim(self, d: onnx.TensorShapeProto.Dimension, owner: str, axis: int) -> Dim:
        if d.HasField("dim_value") and d.dim_value >= 0:
            return int(d.dim_value)  # a negative one (some converters write -1) is unknown, below
        name = d.dim_param
        if name and not is_placeholder(name):
            if not isinstance(name, str):  # not valid UTF-8: protobuf hands the bytes over
                raise ModelLoadError(f"{owner!r}: dim_param {name!r} of axis {axis} is not valid UTF-8")
            return self.named_dim(name)
        return self.symbols.fresh(f"{_sanitize(owner)}_dim{axis}", 1)

    def named_dim(self, name: str) -> Dim:
        """A dim_param: a symbol, or an expression when it reads as one (``past_seq+seq``)."""
        dim = self._named_dims.get(name)
        if dim is None:
            dim = self._named_dims[name] = self._read_named_dim(name)
        return dim

    def _read_named_dim(self, name: str) -> Dim:
        if name in self.symbols.ranges or name.isidentifier():
            return self.symbols.get(name)
        try:
            return substitute_symbols(parse_dim(name), self.symbols)
        except ExpressionError:
            return self.symbols.get(name)

    def value_type(self, proto: onnx.TypeProto, owner: str):
        counter = iter(range(10**6))
        value_type = type_from_proto(proto, lambda d: self.dim(d, owner, next(counter)))
        if isinstance(value_type, TensorType) and value_type.dtype not in _ELEMENT_TYPES:
            raise ModelLoadError(f"{owner!r}: element type {value_type.dtype} is not an ONNX type")
        return value_type

    # -- graphs ----------------------------------------------------------------
    def graph(self, proto: onnx.GraphProto, parent: Optional[Graph], scope: dict[str, Value]) -> Graph:
        graph = Graph(proto.name or "graph", parent=parent, opset=self.opsets, symbols=self.symbols)
        graph.doc = proto.doc_string
        scope = dict(scope)
        value_info = {vi.name: vi for vi in proto.value_info}
        output_info = {vi.name: vi for vi in proto.output}
        for tensor in proto.initializer:
            tensor_name = tensor.name
            dtype = raw_dtype(tensor) if self.keep_tensors else None
            if dtype is not None:
                # Export writes the tensor back unless something changed it: its array is
                # made only if something reads it (most weights: never).
                value = graph.add_lazy_initializer(
                    tensor_name, TensorType(tensor.data_type, tuple(tensor.dims[:])), tensor,
                    functools.partial(_initializer_array, tensor, dtype))
            elif self.keep_tensors and self.external_dir is not None and _is_external(tensor):
                # Left in its file (read_model_sized(load_external=False)): read from there
                # only if something reads it; export writes the reference back.
                value = graph.add_lazy_initializer(
                    tensor_name, TensorType(tensor.data_type, tuple(tensor.dims[:])), tensor,
                    functools.partial(_external_array, tensor, self.external_dir))
            else:
                array = _initializer_array(tensor)
                value = graph.add_initializer(tensor_name, array)
                if self.keep_tensors:
                    value.const_source = (array, tensor)
            _expect_name(value, tensor_name)
            scope[tensor_name] = value
        for sparse in proto.sparse_initializer:
            dense = numpy_helper.to_array(onnx.helper.make_tensor(
                sparse.values.name, sparse.values.data_type, list(sparse.dims),
                _densify(sparse).reshape(-1).tolist()))
            scope[sparse.values.name] = graph.add_initializer(sparse.values.name, dense)
        sparse_names = {t.values.name for t in proto.sparse_initializer}
        for vi in proto.input:
            if vi.name in graph.initializers or vi.name in sparse_names:
                continue  # old IR versions list initializers among inputs too
            value = graph.add_input(vi.name, self.value_type(vi.type, vi.name))
            _expect_name(value, vi.name)
            scope[vi.name] = value
        constants = self.constants_as_initializers
        for node_proto in proto.node:
            if constants and node_proto.op_type == "Constant":
                value = self.constant(node_proto, graph, output_info)
                if value is not None:
                    scope[value.name] = value
                    continue
            for out_name, value in self.node(node_proto, graph, scope):
                scope[out_name] = value
                if out_name in output_info:
                    value.type = self.value_type(output_info[out_name].type, out_name)
                elif out_name in value_info:
                    # Built only if inference needs it: most are replaced by inferred types,
                    # and building one costs a fresh symbol per unnamed dim.
                    value.declared = functools.partial(self.value_type, value_info[out_name].type, out_name)
                    self.deferred.append(value)
        for vi in proto.output:
            value = scope.get(vi.name)
            if value is None:
                raise ModelLoadError(f"graph {graph.name!r}: output {vi.name!r} is never produced")
            if value.type is None or value.producer is None:
                value.type = value.type or self.value_type(vi.type, vi.name)
            graph.outputs.append(value)
        return graph

    def constant(self, proto: onnx.NodeProto, graph: Graph, output_info) -> Optional[Value]:
        """A Constant node holding a tensor (``value``) as an initializer of ``graph``, or None
        (another attribute, another domain, or a graph output: left a node).

        The TorchScript exporter writes every axis, index and scalar as one: 417 of the 1,375
        nodes of ../shared/models/bert.ts.onnx. Read as nodes, simplify typed, folded and
        removed each (13 of its 47 ms); read here, each is a weight from the start."""
        if proto.domain not in ("", "ai.onnx") or len(proto.attribute) != 1 or len(proto.output) != 1:
            return None
        attr = proto.attribute[0]
        name = proto.output[0]
        if attr.name != "value" or attr.type != onnx.AttributeProto.TENSOR or not name or name in output_info:
            return None
        tensor = attr.t
        dtype = raw_dtype(tensor) if self.keep_tensors else None
        if dtype is not None:
            value = graph.add_lazy_initializer(
                name, TensorType(tensor.data_type, tuple(tensor.dims[:])), tensor,
                functools.partial(_initializer_array, tensor, dtype, name))
        else:
            array = _initializer_array(tensor, label=name)
            value = graph.add_initializer(name, array)
            if self.keep_tensors:
                value.const_source = (array, tensor)
        _expect_name(value, name)
        return value

    def node(self, proto: onnx.NodeProto, graph: Graph, scope: dict[str, Value]) -> list[tuple[str, Value]]:
        """Add the node of ``proto`` to ``graph``; returns its named outputs as (name, value)."""
        # Each read of a proto field builds new Python objects: read each field
        # once, repeated ones by slicing (one call, where iterating makes one per item).
        op_type, name, output_names = proto.op_type, proto.name, proto.output[:]
        domain = proto.domain
        if self.support is not None:
            self.support.note(domain, op_type)
        input_names = proto.input[:]
        inputs = [scope.get(n) if n else None for n in input_names]
        if None in inputs:  # an omitted optional input, or a name not defined before
            for input_name, value in zip(input_names, inputs):
                if value is None and input_name:
                    raise ModelLoadError(f"node {name or op_type!r} ({op_type}) reads {input_name!r}, "
                                         f"which is not defined before it")
        names = output_names if all(output_names) else [
            n if n else graph.fresh_name(f"{name or op_type}_unused") for n in output_names]
        node = graph.add_node(op_type, inputs, len(output_names), domain=domain, name=name, output_names=names)
        named = [(n, value) for n, value in zip(output_names, node.outputs) if n]
        for out_name, value in named:
            _expect_name(value, out_name)
        node.doc = proto.doc_string
        if len(proto.attribute):
            for attr in proto.attribute:
                try:
                    node.attrs[attr.name] = attribute_value(attr, lambda g: self.graph(g, graph, scope))
                except (ValueError, TypeError, KeyError) as exc:  # a tensor whose data does not fit its shape...
                    raise ModelLoadError(f"node {name or op_type!r} ({op_type}): attribute {attr.name!r} "
                                         f"cannot be read ({exc})") from None
                node.attr_types[attr.name] = attr.type
        return named


def is_placeholder(dim_param) -> bool:
    """Whether a dim_param says "unknown" rather than naming a dim (see PLACEHOLDER_DIMS);
    blank text says so too."""
    if not isinstance(dim_param, str):
        return False  # bytes that are not UTF-8: the caller names them in an error
    text = dim_param.strip()
    return not text or text in PLACEHOLDER_DIMS


def _initializer_array(tensor: onnx.TensorProto, dtype=None, label: Optional[str] = None):
    """The array of an initializer (``dtype``: its raw_dtype, if known); a ModelLoadError
    naming it (``label``, else the tensor's name) when its data does not make a tensor of
    its type and shape."""
    try:
        return tensor_array(tensor) if dtype is None else raw_array(tensor, dtype)
    except (ValueError, TypeError, KeyError) as exc:  # KeyError: a data type onnx does not know
        shape = "x".join(map(str, tensor.dims)) or "scalar"
        raise ModelLoadError(f"initializer {label or tensor.name!r} ({shape}): its data does not make a tensor of "
                             f"its type and shape ({exc})") from None


def _is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _external_array(tensor: onnx.TensorProto, directory: str):
    """The array of a tensor stored in an external file under ``directory``; a
    ModelLoadError naming the tensor and the file when it cannot be read."""
    info = external_data_helper.ExternalDataInfo(tensor)
    path = Path(directory) / info.location
    shape = tuple(tensor.dims[:])
    count = int(np.prod(shape, dtype=np.int64))
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
        if Path(info.location).is_absolute() or ".." in Path(info.location).parts:
            raise ValueError("its location must be a relative path inside the model's folder")
        if dtype.kind in "OUS" or dtype.itemsize * count != (info.length or dtype.itemsize * count):
            raise ValueError(f"{info.length} bytes for {count} elements of {dtype}")
        array = np.fromfile(path, dtype=dtype.newbyteorder("<"), count=count, offset=info.offset or 0)
        if array.size != count:
            raise ValueError(f"the file ends after {array.size} of {count} elements")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ModelLoadError(f"initializer {tensor.name!r}: cannot read its external data from {path} "
                             f"({exc})") from None
    return array.astype(dtype, copy=False).reshape(shape)


def _densify(sparse: onnx.SparseTensorProto):
    import numpy as np

    values = numpy_helper.to_array(sparse.values)
    dense = np.zeros(tuple(sparse.dims), dtype=values.dtype)
    indices = numpy_helper.to_array(sparse.indices)
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense


def _expect_name(value: Value, name: str) -> None:
    if value.name != name:
        raise ModelLoadError(f"the name {name!r} is defined twice in the model (SSA violated)")


def _sanitize(name: str) -> str:
    # Every non-alphanumeric character becomes "_", in one regex call (a
    # per-character join was a hot spot on models with many unnamed dims).
    return _NON_WORD.sub("_", name).strip("_") or "dim"


def substitute_symbols(dim: Dim, symbols: SymbolTable) -> Dim:
    """Rebuild a parsed expression over the table's symbols (with their ranges)."""
    return substitute(dim, {name: symbols.get(name) for name in free_symbols(dim)})


def import_model(source: ModelSource, dynamic: Optional[dict[str, tuple[int, int]]] = None,
                 infer: bool = True, check: bool = True, keep_tensors: bool = False,
                 label: Optional[str] = None, constants_as_initializers: bool = False,
                 external_dir: Optional[str] = None) -> Graph:
    """Read and import a model; types are inferred unless ``infer`` is False.

    With ``check=False`` a model with unsupported ops still imports (for
    ``shapeshift info``); those nodes are left untyped.  With ``keep_tensors``
    each initializer keeps the TensorProto it was read from (``const_source``),
    so that export writes an unchanged one back by copying it rather than
    re-encoding its array; the graph then holds on to the model's protos.
    ``label`` names the model in errors (default: its path, or "model").  With
    ``constants_as_initializers`` a Constant node holding a tensor is read as the
    initializer it stands for (what simplification would make of it), unless it
    is a graph output; without, the graph has the model's nodes, as ``info`` shows.
    ``external_dir``: the folder of a model read with its external data left in place
    (``read_model_sized(path, load_external=False)``); with ``keep_tensors`` such a
    tensor is read from its file only if something reads it.
    """
    label = label or source_label(source)
    model = read_model(source)
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"{label}: cannot inline model-local functions ({exc})") from None
    check_opset(model, label)
    # Before anything is built from it: a malformed model is refused here, naming the
    # node at fault, never later inside a pass or a kernel.
    try:
        validate_model(model, _default_opset(model), label)
    except InvalidModelError:
        # A node may read what an op we could not have read anyway defines, or have the
        # arity of another version of it: unsupported ops are named first, as below.
        if check:
            check_supported(model, label)
        raise
    ranges = symbol_ranges(dynamic)
    symbols = SymbolTable(ranges)
    support = _SupportCheck(_default_opset(model)) if check else None
    importer = _Importer(model, symbols, keep_tensors, support, constants_as_initializers, external_dir)
    try:
        graph = importer.graph(model.graph, None, {})
    except RecursionError:
        raise ModelLoadError(f"{label}: graph nesting too deep") from None
    except ModelLoadError:
        # A node reading a name nothing defines may be the output of an op we could
        # not have read anyway: name every unsupported op first, as a walk would have.
        if support is not None:
            check_supported(model, label)
        raise
    if support is not None:
        support.raise_if_missing(label)
    graph.metadata.update(
        ir_version=model.ir_version,
        producer_name=model.producer_name,
        producer_version=model.producer_version,
        model_version=model.model_version,
        doc_string=model.doc_string,
        metadata_props={p.key: p.value for p in model.metadata_props},
        opset_imports=dict(graph.opset),
        source=label,
        output_names=[v.name for v in graph.outputs],
    )
    _check_ranges_name_input_dims(ranges, graph, label)
    if infer:
        infer_types(graph)
        check_element_types(graph, label)
    importer.settle_declared()
    return graph


#: The largest dim a range or a given shape may name: extents are int64, and products of
#: a few dims must still fit.
MAX_DIM = 2 ** 40


def symbol_ranges(dynamic) -> dict[str, tuple[int, int]]:
    """``dynamic`` as {symbol: (lo, hi)}: a range is a (lo, hi) pair, or an int that fixes
    the symbol (as ``--dynamic seq=8`` does); 0 <= lo <= hi <= MAX_DIM. InputError naming
    the symbol otherwise (a raw TypeError or ValueError from unpacking it, before)."""
    ranges: dict[str, tuple[int, int]] = {}
    for name, spec in (dynamic or {}).items():
        try:
            lo, hi = (spec, spec) if isinstance(spec, (int, np.integer)) else spec
            if isinstance(lo, bool) or isinstance(hi, bool) or lo != int(lo) or hi != int(hi):
                raise ValueError
            lo, hi = int(lo), int(hi)
        except (TypeError, ValueError):
            raise InputError(f"dynamic range of {name!r}: expected (lo, hi) integers or one integer, "
                             f"got {spec!r}") from None
        if not 0 <= lo <= hi <= MAX_DIM:
            raise InputError(f"dynamic range of {name!r}: expected 0 <= lo <= hi <= {MAX_DIM}, got ({lo}, {hi})")
        ranges[str(name)] = (lo, hi)
    return ranges


def _check_ranges_name_input_dims(ranges: Mapping[str, tuple[int, int]], graph: Graph, label: str) -> None:
    """A range for a symbol no input dim uses would be dropped without a word (a typo:
    ``btach=1:4``): refused, with the symbols the inputs do use."""
    if not ranges:
        return
    used = graph.input_symbols()
    unknown = sorted(name for name in ranges if name not in used)
    if unknown:
        known = ", ".join(sorted(used)) or "none (every input dim is static)"
        raise InputError(f"{label}: no input dim is named {', '.join(map(repr, unknown))}; "
                         f"the inputs' symbols are: {known}")
