"""Structure-aware mutations of ONNX models, reproducible from (seed, index).

``mutant(seed, index, seeds)`` picks a seed model and applies one to three mutations,
each chosen and parameterized by ``random.Random(f"{seed}:{index}")``, and makes the feed
to run it on: the same (seed, index) always gives the same model and feed.

The mutations work on the protos, as a broken exporter or a hostile user would write
them, at every level the importer reads:

* ``dim``, ``rank``, ``elem_type``: the type of a graph input, output or value_info
  (a dim set to 0, -1, 2**31, a placeholder name, cleared; a dim added or dropped; an
  element type of 0, 100, a string or float8 type);
* ``attr_value``, ``attr_type``, ``attr_drop``, ``attr_add``: a node attribute's value
  (the interesting ints and floats below, lists shortened or lengthened), its type (an
  int given as a float, a string, a list), dropped, or one added;
* ``init_shape``, ``init_dtype``, ``init_values``, ``init_truncate``: an initializer's
  dims (with or without its data), its element type (data kept or cast), its values
  (huge, negative, NaN; indices out of range), its data cut short;
* ``rewire``, ``drop_input``, ``add_input``, ``rename_output``: a node's edges (another
  value, one defined later, an undefined one; an input removed or left empty; an output
  renamed or given a name already defined);
* ``op_type``, ``drop_node``, ``dup_node``, ``opset``: the op of a node, the node itself,
  the model's opset;
* ``subgraph``: an If's branches swapped, a body's output or input dropped or added,
  or any other mutation applied inside a body;
* ``graph_io``: a graph output removed or added, a graph input removed;
* ``feed``: the feed rather than the model (values out of range, another dtype or shape).
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

INTERESTING_INTS = (0, 1, -1, 2, 3, 5, 7, 64, -2, 1000000, 2 ** 31 - 1, 2 ** 31, -2 ** 31, 2 ** 40, -2 ** 40,
                    2 ** 63 - 1, -2 ** 63)
INTERESTING_FLOATS = (0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, 1e30, 3.4e38, math.inf, -math.inf, math.nan)
INTERESTING_STRINGS = (b"", b"NOTSET", b"SAME_UPPER", b"SAME_LOWER", b"VALID", b"nearest", b"linear", b"cubic",
                       b"constant", b"reflect", b"edge", b"DCR", b"CRD", b"xx", b"\xff\xfe")
PLACEHOLDER_DIMS = ("?", "", "batch", "-1", "None", "unk__0", "fuzz_dim")
ELEM_TYPES = (0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 100)
#: Ops a node's op_type may become: the same arity classes as most seeds' nodes, and some
#: whose kernels index by their inputs.
OP_TYPES = ("Relu", "Sigmoid", "Abs", "Neg", "Exp", "Log", "Sqrt", "Identity", "Softmax", "Add", "Sub", "Mul", "Div",
            "MatMul", "Pow", "Max", "Min", "Equal", "Where", "Concat", "Reshape", "Transpose", "Gather", "Expand",
            "Tile", "Slice", "Pad", "Squeeze", "Unsqueeze", "ReduceSum", "ReduceMean", "Conv", "MaxPool",
            "AveragePool", "Gemm", "LayerNormalization", "Cast", "Shape", "Size", "TopK", "CumSum", "NonZero",
            "ScatterElements", "GatherElements", "OneHot", "Resize", "Range", "ConstantOfShape", "Split")
#: Names of attributes ops read, for ``attr_add``.
ATTR_NAMES = ("axis", "axes", "perm", "pads", "strides", "kernel_shape", "dilations", "group", "keepdims", "to",
              "mode", "auto_pad", "transA", "transB", "alpha", "beta", "epsilon", "value", "k", "largest",
              "ceil_mode", "count_include_pad", "exclusive", "reverse", "split", "num_outputs", "batch_dims")


@dataclass
class Mutant:
    seed: int
    index: int
    seed_model: str
    model: onnx.ModelProto
    feed: dict
    mutations: list[str] = field(default_factory=list)

    @property
    def reproducer(self) -> str:
        return f"python -m shapeshift.fuzz --reproduce {self.seed}:{self.index}"


# -- walking the protos ---------------------------------------------------------------------------


def graphs(graph: onnx.GraphProto, path: str = "") -> list[tuple[str, onnx.GraphProto]]:
    """``graph`` and every body in it, each with a path naming it."""
    found = [(path or "main", graph)]
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                found += graphs(attr.g, f"{path}/{node.name or node.op_type}.{attr.name}")
            elif attr.type == AttributeProto.GRAPHS:
                for k, g in enumerate(attr.graphs):
                    found += graphs(g, f"{path}/{node.name or node.op_type}.{attr.name}[{k}]")
    return found


def _node_label(node: onnx.NodeProto) -> str:
    return f"{node.name or '?'}({node.op_type})"


def _names_defined(graph: onnx.GraphProto) -> list[str]:
    names = [vi.name for vi in graph.input] + [t.name for t in graph.initializer]
    for node in graph.node:
        names += [o for o in node.output if o]
    return names


def _pick_graph(model: onnx.ModelProto, rng: random.Random) -> tuple[str, onnx.GraphProto]:
    found = graphs(model.graph)
    if len(found) > 1 and rng.random() < 0.3:
        return rng.choice(found[1:])
    return found[0]


# -- mutations: each returns a description, or None where it does not apply ------------------------


def m_dim(model, rng, graph_path, graph):
    infos = list(graph.input) + list(graph.output) + list(graph.value_info)
    infos = [vi for vi in infos if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")
             and len(vi.type.tensor_type.shape.dim)]
    if not infos:
        return None
    vi = rng.choice(infos)
    dims = vi.type.tensor_type.shape.dim
    k = rng.randrange(len(dims))
    dim = dims[k]
    choice = rng.random()
    if choice < 0.45:
        value = rng.choice((0, 1, 2, 3, 5, 16, -1, 2 ** 31, 2 ** 40))
        dim.dim_value = value
        what = str(value)
    elif choice < 0.85:
        name = rng.choice(PLACEHOLDER_DIMS)
        dim.dim_param = name
        what = repr(name)
    else:
        dim.Clear()
        what = "cleared"
    return f"dim {graph_path}:{vi.name}[{k}] = {what}"


def m_rank(model, rng, graph_path, graph):
    infos = [vi for vi in list(graph.input) + list(graph.output) if vi.type.HasField("tensor_type")]
    if not infos:
        return None
    vi = rng.choice(infos)
    shape = vi.type.tensor_type.shape
    if shape.dim and rng.random() < 0.5:
        k = rng.randrange(len(shape.dim))
        del shape.dim[k]
        return f"rank {graph_path}:{vi.name} drop dim {k}"
    d = shape.dim.add()
    d.dim_value = rng.choice((1, 2, 3))
    return f"rank {graph_path}:{vi.name} add dim {d.dim_value}"


def m_elem_type(model, rng, graph_path, graph):
    infos = [vi for vi in list(graph.input) + list(graph.output) + list(graph.value_info)
             if vi.type.HasField("tensor_type")]
    casts = [n for n in graph.node if n.op_type == "Cast"]
    if casts and rng.random() < 0.25:
        node = rng.choice(casts)
        to = rng.choice(ELEM_TYPES)
        for attr in node.attribute:
            if attr.name == "to":
                attr.i = to
        return f"elem_type {graph_path}:{_node_label(node)}.to = {to}"
    if not infos:
        return None
    vi = rng.choice(infos)
    to = rng.choice(ELEM_TYPES)
    vi.type.tensor_type.elem_type = to
    return f"elem_type {graph_path}:{vi.name} = {to}"


def _nodes_with_attrs(graph):
    return [n for n in graph.node if any(a.type not in (AttributeProto.GRAPH, AttributeProto.GRAPHS)
                                         for a in n.attribute)]


def m_attr_value(model, rng, graph_path, graph):
    nodes = _nodes_with_attrs(graph)
    if not nodes:
        return None
    node = rng.choice(nodes)
    attr = rng.choice([a for a in node.attribute if a.type not in (AttributeProto.GRAPH, AttributeProto.GRAPHS)])
    where = f"{graph_path}:{_node_label(node)}.{attr.name}"
    if attr.type == AttributeProto.INT:
        attr.i = rng.choice(INTERESTING_INTS)
        return f"attr {where} = {attr.i}"
    if attr.type == AttributeProto.INTS:
        values = list(attr.ints)
        choice = rng.random()
        if values and choice < 0.5:
            values[rng.randrange(len(values))] = rng.choice(INTERESTING_INTS)
        elif values and choice < 0.7:
            values.pop(rng.randrange(len(values)))
        elif choice < 0.9:
            values.append(rng.choice(INTERESTING_INTS))
        else:
            values = [rng.choice(INTERESTING_INTS)] * len(values)
        del attr.ints[:]
        attr.ints.extend(values)
        return f"attr {where} = {values}"
    if attr.type == AttributeProto.FLOAT:
        attr.f = rng.choice(INTERESTING_FLOATS)
        return f"attr {where} = {attr.f}"
    if attr.type == AttributeProto.FLOATS:
        values = list(attr.floats) or [0.0]
        values[rng.randrange(len(values))] = rng.choice(INTERESTING_FLOATS)
        del attr.floats[:]
        attr.floats.extend(values)
        return f"attr {where} = {values}"
    if attr.type == AttributeProto.STRING:
        attr.s = rng.choice(INTERESTING_STRINGS)
        return f"attr {where} = {attr.s!r}"
    if attr.type == AttributeProto.TENSOR:
        return f"attr {where}: " + _mutate_tensor(attr.t, rng)
    return None


def m_attr_type(model, rng, graph_path, graph):
    nodes = _nodes_with_attrs(graph)
    if not nodes:
        return None
    node = rng.choice(nodes)
    attrs = [a for a in node.attribute if a.type not in (AttributeProto.GRAPH, AttributeProto.GRAPHS)]
    attr = rng.choice(attrs)
    name = attr.name
    scalar = _scalar_of(attr)
    kind = rng.choice(("int", "ints", "float", "floats", "string", "strings", "tensor", "untyped"))
    if kind == "int":
        new = helper.make_attribute(name, int(_clamp_int(scalar)))
    elif kind == "ints":
        count = rng.choice((0, 1, 3))
        new = AttributeProto(name=name, type=AttributeProto.INTS)
        new.ints.extend([int(_clamp_int(scalar))] * count)
    elif kind == "float":
        new = helper.make_attribute(name, float(scalar) if _finite(scalar) else 0.5)
    elif kind == "floats":
        new = helper.make_attribute(name, [float(scalar) if _finite(scalar) else 0.5, 1.5])
    elif kind == "string":
        new = helper.make_attribute(name, str(scalar))
    elif kind == "strings":
        new = helper.make_attribute(name, [str(scalar), "x"])
    elif kind == "tensor":
        new = helper.make_attribute(name, numpy_helper.from_array(np.array([_clamp_int(scalar)], np.int64)))
    else:  # a type field that does not match the value set
        new = AttributeProto(name=name, type=rng.choice((AttributeProto.INT, AttributeProto.FLOATS,
                                                          AttributeProto.STRING, AttributeProto.UNDEFINED)))
    attr.CopyFrom(new)
    return f"attr_type {graph_path}:{_node_label(node)}.{name} -> {kind}"


def _scalar_of(attr: AttributeProto):
    if attr.type == AttributeProto.INT:
        return attr.i
    if attr.type == AttributeProto.INTS and attr.ints:
        return attr.ints[0]
    if attr.type == AttributeProto.FLOAT:
        return attr.f
    if attr.type == AttributeProto.FLOATS and attr.floats:
        return attr.floats[0]
    if attr.type == AttributeProto.STRING:
        return attr.s.decode("utf-8", "replace")
    return 1


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _clamp_int(x) -> int:
    if isinstance(x, (int, float)) and math.isfinite(x):
        return max(min(int(x), 2 ** 63 - 1), -2 ** 63)
    return 1


def m_attr_drop(model, rng, graph_path, graph):
    nodes = _nodes_with_attrs(graph)
    if not nodes:
        return None
    node = rng.choice(nodes)
    k = rng.randrange(len(node.attribute))
    if node.attribute[k].type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
        return None
    name = node.attribute[k].name
    del node.attribute[k]
    return f"attr_drop {graph_path}:{_node_label(node)}.{name}"


def m_attr_add(model, rng, graph_path, graph):
    if not graph.node:
        return None
    node = rng.choice(graph.node)
    name = rng.choice(ATTR_NAMES)
    value = rng.choice((rng.choice(INTERESTING_INTS), [rng.choice(INTERESTING_INTS) for _ in range(rng.randrange(1, 5))],
                        rng.choice(INTERESTING_FLOATS), "SAME_UPPER"))
    existing = [a for a in node.attribute if a.name == name]
    new = helper.make_attribute(name, value)
    if existing and rng.random() < 0.5:
        existing[0].CopyFrom(new)
        return f"attr_set {graph_path}:{_node_label(node)}.{name} = {value!r}"
    node.attribute.append(new)  # a second attribute of that name where one exists
    return f"attr_add {graph_path}:{_node_label(node)}.{name} = {value!r}"


def _initializers(model, graph):
    found = list(graph.initializer)
    for node in graph.node:
        if node.op_type == "Constant":
            found += [a.t for a in node.attribute if a.type == AttributeProto.TENSOR]
    return found


def m_init_shape(model, rng, graph_path, graph):
    inits = _initializers(model, graph)
    if not inits:
        return None
    t = rng.choice(inits)
    dims = list(t.dims)
    size = math.prod(dims)
    choice = rng.random()
    if choice < 0.3 and len(dims) >= 2:
        rng.shuffle(dims)
        if dims == list(t.dims):
            dims = dims[::-1]
    elif choice < 0.45:
        dims = [size]
    elif choice < 0.6:
        dims = [1, *dims] if rng.random() < 0.5 else dims[:-1] + ([1, dims[-1]] if dims else [1])
    elif choice < 0.8 and dims:  # the data no longer fills the shape
        k = rng.randrange(len(dims))
        dims[k] = rng.choice((0, dims[k] + 1, max(dims[k] - 1, 0), 2 ** 31))
    else:
        dims = [] if dims else [1]
    del t.dims[:]
    t.dims.extend(dims)
    return f"init_shape {graph_path}:{t.name or 'Constant'} dims = {dims}"


def m_init_dtype(model, rng, graph_path, graph):
    inits = _initializers(model, graph)
    if not inits:
        return None
    t = rng.choice(inits)
    to = rng.choice(ELEM_TYPES)
    if rng.random() < 0.5:  # cast the values: a consistent tensor of another type
        try:
            array = numpy_helper.to_array(t)
            target = helper.tensor_dtype_to_np_dtype(to)
            new = numpy_helper.from_array(array.astype(target), t.name)
            t.CopyFrom(new)
            return f"init_dtype {graph_path}:{t.name or 'Constant'} cast to {to}"
        except Exception:  # noqa: BLE001 - no such cast: fall through to the raw change
            pass
    t.data_type = to
    return f"init_dtype {graph_path}:{t.name or 'Constant'} data_type = {to} (data kept)"


def m_init_values(model, rng, graph_path, graph):
    inits = _initializers(model, graph)
    if not inits:
        return None
    t = rng.choice(inits)
    return f"init_values {graph_path}:{t.name or 'Constant'}: " + _mutate_tensor(t, rng)


def _mutate_tensor(t: onnx.TensorProto, rng: random.Random) -> str:
    try:
        array = numpy_helper.to_array(t).copy()
    except Exception:  # noqa: BLE001 - already broken by another mutation
        return "unreadable, left"
    if array.size == 0 or array.dtype.kind not in "biuf":
        return "empty or not numeric, left"
    flat = array.reshape(-1)
    count = 1 if rng.random() < 0.7 else flat.size
    positions = [rng.randrange(flat.size) for _ in range(count)]
    if array.dtype.kind == "f":
        value = rng.choice(INTERESTING_FLOATS)
    elif array.dtype.kind == "b":
        value = not bool(flat[positions[0]])
    else:
        info = np.iinfo(array.dtype)
        value = max(min(rng.choice(INTERESTING_INTS), int(info.max)), int(info.min))
    with np.errstate(all="ignore"):
        flat[positions] = value
    t.CopyFrom(numpy_helper.from_array(array, t.name))
    return f"{count} value(s) = {value!r}"


def m_init_truncate(model, rng, graph_path, graph):
    inits = [t for t in _initializers(model, graph) if t.raw_data or t.float_data or t.int64_data or t.int32_data]
    if not inits:
        return None
    t = rng.choice(inits)
    for name in ("raw_data", "float_data", "int64_data", "int32_data"):
        data = getattr(t, name)
        if len(data):
            keep = rng.randrange(len(data))
            if name == "raw_data":
                t.raw_data = data[:keep]
            else:
                del data[keep:]
            return f"init_truncate {t.name or 'Constant'}.{name} to {keep}"
    return None


def m_rewire(model, rng, graph_path, graph):
    nodes = [n for n in graph.node if n.input]
    if not nodes:
        return None
    node = rng.choice(nodes)
    k = rng.randrange(len(node.input))
    defined = _names_defined(graph)
    choice = rng.random()
    if choice < 0.8 and defined:
        name = rng.choice(defined)  # maybe defined later: out of order, or a cycle
    elif choice < 0.9:
        name = "fuzz_undefined"
    else:
        name = node.output[0] if node.output else "fuzz_undefined"  # the node reads itself
    old = node.input[k]
    node.input[k] = name
    return f"rewire {graph_path}:{_node_label(node)}.input[{k}] {old!r} -> {name!r}"


def m_drop_input(model, rng, graph_path, graph):
    nodes = [n for n in graph.node if n.input]
    if not nodes:
        return None
    node = rng.choice(nodes)
    k = rng.randrange(len(node.input))
    if rng.random() < 0.5 or k == len(node.input) - 1:
        del node.input[k]
        return f"drop_input {graph_path}:{_node_label(node)}.input[{k}] removed"
    node.input[k] = ""
    return f"drop_input {graph_path}:{_node_label(node)}.input[{k}] = ''"


def m_add_input(model, rng, graph_path, graph):
    if not graph.node:
        return None
    node = rng.choice(graph.node)
    defined = _names_defined(graph)
    name = rng.choice(defined) if defined else ""
    node.input.append(name)
    return f"add_input {graph_path}:{_node_label(node)} += {name!r}"


def m_rename_output(model, rng, graph_path, graph):
    nodes = [n for n in graph.node if n.output]
    if not nodes:
        return None
    node = rng.choice(nodes)
    k = rng.randrange(len(node.output))
    defined = _names_defined(graph)
    name = rng.choice(defined) if rng.random() < 0.5 and defined else f"fuzz_renamed_{k}"
    old = node.output[k]
    node.output[k] = name
    return f"rename_output {graph_path}:{_node_label(node)}.output[{k}] {old!r} -> {name!r}"


def m_op_type(model, rng, graph_path, graph):
    nodes = [n for n in graph.node if n.op_type not in ("If", "Loop", "Scan")]
    if not nodes:
        return None
    node = rng.choice(nodes)
    old = node.op_type
    node.op_type = rng.choice(OP_TYPES)
    return f"op_type {graph_path}:{node.name or '?'} {old} -> {node.op_type}"


def m_drop_node(model, rng, graph_path, graph):
    if not graph.node:
        return None
    k = rng.randrange(len(graph.node))
    label = _node_label(graph.node[k])
    del graph.node[k]
    return f"drop_node {graph_path}:{label}"


def m_dup_node(model, rng, graph_path, graph):
    if not graph.node:
        return None
    k = rng.randrange(len(graph.node))
    graph.node.insert(k + 1, copy.deepcopy(graph.node[k]))
    return f"dup_node {graph_path}:{_node_label(graph.node[k])}"


def m_opset(model, rng, graph_path, graph):
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            old = opset.version
            opset.version = rng.choice((1, 6, 7, 9, 10, 11, 12, 13, 14, 16, 18, 19, 21, 22, 23, 24, 30))
            return f"opset {old} -> {opset.version}"
    return None


def m_subgraph(model, rng, graph_path, graph):
    owners = [(n, a) for _, g in graphs(model.graph) for n in g.node for a in n.attribute
              if a.type == AttributeProto.GRAPH]
    if not owners:
        return None
    node, attr = rng.choice(owners)
    body = attr.g
    choice = rng.random()
    where = f"{_node_label(node)}.{attr.name}"
    if choice < 0.2 and node.op_type == "If":
        branches = {a.name: a for a in node.attribute if a.type == AttributeProto.GRAPH}
        if len(branches) == 2:
            a, b = branches.values()
            ga, gb = copy.deepcopy(a.g), copy.deepcopy(b.g)
            a.g.CopyFrom(gb)
            b.g.CopyFrom(ga)
            return f"subgraph {where}: branches swapped"
    if choice < 0.4 and len(body.output):
        k = rng.randrange(len(body.output))
        name = body.output[k].name
        del body.output[k]
        return f"subgraph {where}: output {name!r} dropped"
    if choice < 0.5 and len(body.input):
        k = rng.randrange(len(body.input))
        name = body.input[k].name
        del body.input[k]
        return f"subgraph {where}: input {name!r} dropped"
    if choice < 0.6:
        body.output.add().CopyFrom(helper.make_tensor_value_info(
            rng.choice(_names_defined(body) or ["fuzz_extra"]), TensorProto.FLOAT, None))
        return f"subgraph {where}: output {body.output[-1].name!r} added"
    mutation = rng.choice(GRAPH_MUTATIONS)
    text = mutation(model, rng, f"{where}", body)
    return f"subgraph: {text}" if text else None


def m_graph_io(model, rng, graph_path, graph):
    graph = model.graph
    choice = rng.random()
    if choice < 0.35 and len(graph.output) > 1:
        k = rng.randrange(len(graph.output))
        name = graph.output[k].name
        del graph.output[k]
        return f"graph_io output {name!r} removed"
    if choice < 0.7:
        names = [o for n in graph.node for o in n.output if o] + [t.name for t in graph.initializer]
        if not names:
            return None
        name = rng.choice(names)
        graph.output.append(helper.make_tensor_value_info(name, rng.choice((TensorProto.FLOAT, TensorProto.INT64)),
                                                          None))
        return f"graph_io output {name!r} added"
    inputs = [vi for vi in graph.input if vi.name not in {t.name for t in graph.initializer}]
    if not inputs:
        return None
    vi = rng.choice(inputs)
    graph.input.remove(vi)
    return f"graph_io input {vi.name!r} removed"


GRAPH_MUTATIONS: tuple[Callable, ...] = (
    m_dim, m_rank, m_elem_type, m_attr_value, m_attr_value, m_attr_type, m_attr_drop, m_attr_add,
    m_init_shape, m_init_dtype, m_init_values, m_init_values, m_init_truncate, m_rewire, m_drop_input,
    m_add_input, m_rename_output, m_op_type, m_drop_node, m_dup_node)
MODEL_MUTATIONS: tuple[Callable, ...] = (m_opset, m_subgraph, m_graph_io)


# -- feeds ----------------------------------------------------------------------------------------


def _np_dtype(elem_type: int):
    try:
        dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    except Exception:  # noqa: BLE001 - an undefined or unknown element type
        return np.dtype(np.float32)
    return np.dtype(dtype)


def make_feed(model: onnx.ModelProto, base: dict, rng: random.Random, np_rng: np.random.Generator) -> dict:
    """A feed for ``model``'s inputs: the seed's arrays where they still fit the declared
    type, else arrays of the declared dtype and static dims (the seed's where symbolic)."""
    initializers = {t.name for t in model.graph.initializer}
    feed = {}
    for vi in model.graph.input:
        if vi.name in initializers or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        dtype = _np_dtype(tt.elem_type)
        known = base.get(vi.name)
        if not tt.HasField("shape"):
            shape = known.shape if known is not None else (2,)
        else:
            shape = []
            for k, dim in enumerate(tt.shape.dim):
                seed_dim = known.shape[k] if known is not None and k < known.ndim else None
                if dim.HasField("dim_value") and 0 <= dim.dim_value <= 64:
                    shape.append(dim.dim_value)
                else:
                    shape.append(seed_dim if seed_dim is not None else rng.choice((1, 2, 3)))
            shape = tuple(shape)
        if known is not None and known.shape == shape and known.dtype == dtype:
            feed[vi.name] = known
        else:
            feed[vi.name] = _random_array(shape, dtype, np_rng)
    return feed


def _random_array(shape, dtype: np.dtype, np_rng: np.random.Generator) -> np.ndarray:
    if math.prod(shape) > 1 << 22:
        shape = tuple(min(d, 4) for d in shape)
    if dtype.kind == "f":
        return np_rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return np_rng.integers(0, 4, shape).astype(dtype)
    if dtype.kind == "b":
        return np_rng.random(shape) < 0.5
    if dtype.kind == "c":
        return (np_rng.standard_normal(shape) + 1j * np_rng.standard_normal(shape)).astype(dtype)
    return np.full(shape, "a", dtype=object)


def m_feed(feed: dict, rng: random.Random, np_rng: np.random.Generator) -> Optional[str]:
    if not feed:
        return None
    name = rng.choice(sorted(feed))
    array = feed[name]
    choice = rng.random()
    if choice < 0.5 and array.dtype.kind in "iu" and array.size:
        value = rng.choice((-1, -5, 2 ** 31 - 1, -2 ** 31, 1000, 2 ** 40, -2 ** 40))
        array = array.copy()
        info = np.iinfo(array.dtype)
        array.reshape(-1)[rng.randrange(array.size)] = max(min(value, int(info.max)), int(info.min))
        feed[name] = array
        return f"feed {name}: a value = {value}"
    if choice < 0.65 and array.dtype.kind == "f" and array.size:
        array = array.copy()
        array.reshape(-1)[rng.randrange(array.size)] = rng.choice((math.nan, math.inf, -math.inf, 3e38))
        feed[name] = array
        return f"feed {name}: a value non-finite or huge"
    if choice < 0.8:
        dtype = rng.choice((np.float64, np.int32, np.int64, np.float16, np.bool_))
        feed[name] = array.astype(dtype) if array.dtype.kind != "O" else np.zeros(array.shape, dtype)
        return f"feed {name}: dtype {np.dtype(dtype).name}"
    if array.ndim and rng.random() < 0.5:
        shape = list(array.shape)
        k = rng.randrange(len(shape))
        shape[k] = rng.choice((0, 1, shape[k] + 1, shape[k] * 2))
        feed[name] = _random_array(tuple(shape), array.dtype, np_rng)
        return f"feed {name}: shape {tuple(shape)}"
    feed[name] = array.reshape(array.shape + (1,))
    return f"feed {name}: rank + 1"


# -- the mutant -----------------------------------------------------------------------------------


#: The share of mutants taken from the real models (when present): a real model's native
#: build takes seconds where a built seed's takes a fraction of one.
SHARED_SHARE = 0.25


def seed_weight(seed, seeds: Sequence) -> float:
    shared = [s for s in seeds if s.name.endswith(".onnx")]
    if not shared or len(shared) == len(seeds):
        return 1.0
    built = len(seeds) - len(shared)
    return SHARED_SHARE / len(shared) if seed.name.endswith(".onnx") else (1 - SHARED_SHARE) / built


def mutant(seed: int, index: int, seeds: Sequence) -> Mutant:
    """Mutant ``index`` of campaign ``seed`` over ``seeds`` (shapeshift.fuzz.seeds.Seed)."""
    rng = random.Random(f"{seed}:{index}")
    np_rng = np.random.default_rng([seed, index])
    chosen = rng.choices(seeds, weights=[seed_weight(s, seeds) for s in seeds])[0]
    model = onnx.ModelProto()
    model.CopyFrom(chosen.model)
    base = chosen.feed(np_rng)
    mutations: list[str] = []
    feed_mutation = rng.random() < 0.1
    wanted = 0 if feed_mutation and rng.random() < 0.5 else rng.choice((1, 1, 1, 2, 2, 3))
    attempts = 0
    while len(mutations) < wanted and attempts < 20:
        attempts += 1
        if rng.random() < 0.12:
            fn = rng.choice(MODEL_MUTATIONS)
            graph_path, graph = "main", model.graph
        else:
            fn = rng.choice(GRAPH_MUTATIONS)
            graph_path, graph = _pick_graph(model, rng)
        try:
            text = fn(model, rng, graph_path, graph)
        except (ValueError, TypeError, OverflowError):  # protobuf refused the value: another try
            text = None
        if text:
            mutations.append(text)
    feed = make_feed(model, base, rng, np_rng)
    if feed_mutation:
        text = m_feed(feed, rng, np_rng)
        if text:
            mutations.append(text)
    return Mutant(seed, index, chosen.name, model, feed, mutations)
