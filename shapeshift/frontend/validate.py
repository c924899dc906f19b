"""Check an ONNX model against the ONNX spec before anything is built from it.

Import, simplification, the reference evaluator and the C kernels all assume a
well-formed model: a Reshape has its two inputs, ``perm`` is a list of ints, pads
are not negative, a Conv's ``kernel_shape`` is the size of its weight. A model
that breaks one of these used to fail far from its cause (an IndexError inside a
pass, a ValueError from ``int()``), hang, or -- natively -- read past a buffer.
Like onnxruntime, we refuse it at load instead, with one InvalidModelError that
names the node, the attribute or input at fault, and what was expected.

What is checked, in every graph and subgraph (If, Loop, Scan bodies):

* each node against its op's onnx schema, where onnx has one (ops of other
  domains, such as shapeshift's own, are left to their rules): the number of
  inputs and outputs, required inputs and outputs not left empty, required
  attributes present, no attribute the schema does not name, and each attribute of
  the type the schema declares;
* names: every value is defined once in its graph and the graphs around it (SSA),
  and read only after it is defined -- a read of a value defined later is told
  apart as a cycle or as nodes out of topological order;
* element types: the model's inputs and outputs, and every initializer, say theirs
  (UNDEFINED is refused: nothing can be fed to, or allocated for, an input of no type;
  a body's inputs and outputs may leave theirs to inference, as onnx's checker allows;
  each node's input types against its op's type constraints are checked after type
  inference, in element_types.py);
* convolution and pooling windows: pads >= 0 (and, for a pool, smaller than its kernel),
  strides, dilations and kernel sizes >= 1, none past the largest extent a tensor may have, and a
  ``kernel_shape`` equal to the spatial dims of a weight whose shape is known
  here (an initializer or Constant).

One walk over the protos, with each op's schema read once per process: it costs
about as much as reading the nodes' fields once (6 ms for ../shared/models/bert.ts.onnx,
20 ms for the 3,552 nodes of ssdlite320).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple, NoReturn, Optional

import onnx
from onnx import AttributeProto, defs

from ..errors import InvalidModelError
from ..symbolic.expr import DEFAULT_HI

A = AttributeProto
_SINGLE = defs.OpSchema.FormalParameterOption.Single
_VARIADIC = defs.OpSchema.FormalParameterOption.Variadic

#: Pools whose pads must each be smaller than the kernel along their axis (onnxruntime's rule).
POOLS_PADDED_LESS_THAN_KERNEL = ("MaxPool", "AveragePool", "LpPool")

#: The largest pad, stride, dilation or kernel size accepted: the largest extent a
#: symbolic dim may take. A pad of 2**40 asked numpy for exbibytes; one this large
#: can only be a corrupt or hostile model.
MAX_WINDOW = DEFAULT_HI

#: Convolution and pooling ops of the default domain, with the input holding the
#: weight whose spatial dims ``kernel_shape`` names (None: the op has no weight).
WINDOW_OPS = {
    "Conv": 1, "ConvInteger": 1, "ConvTranspose": 1, "DeformConv": 1, "QLinearConv": 3,
    "AveragePool": None, "MaxPool": None, "LpPool": None, "MaxUnpool": None,
}

_KIND_NAMES = {value: name for name, value in A.AttributeType.items()}

#: Where an attribute stored without a type keeps its value (IR versions before 2).
_SCALAR_FIELDS = (("f", A.FLOAT), ("i", A.INT), ("s", A.STRING), ("t", A.TENSOR), ("g", A.GRAPH),
                  ("sparse_tensor", A.SPARSE_TENSOR), ("tp", A.TYPE_PROTO))
_LIST_FIELDS = (("floats", A.FLOATS), ("ints", A.INTS), ("strings", A.STRINGS), ("tensors", A.TENSORS),
                ("graphs", A.GRAPHS), ("sparse_tensors", A.SPARSE_TENSORS), ("type_protos", A.TYPE_PROTOS))


def validate_model(model: onnx.ModelProto, opsets: dict[str, int], label: str = "model") -> None:
    """Raise InvalidModelError at the first thing in ``model`` that breaks the ONNX spec.

    ``opsets``: the model's opset per domain ("" for the default domain).
    """
    _Validator(opsets, label).graph(model.graph, outer={}, shapes={}, where="")


@dataclass(frozen=True)
class OpSpec:
    """What the checks need of one op's schema, read once: onnx builds new Python
    objects at every read of a schema's parameters and attributes."""

    inputs: tuple  # (name, option) of each formal input
    outputs: tuple
    min_inputs: int
    max_inputs: int
    min_outputs: int
    max_outputs: int
    attr_types: dict  # attribute name -> AttributeProto type
    required_attrs: tuple
    input_types: tuple  # (type string, variadic, homogeneous) of each formal input
    type_constraints: dict  # type string ("T") -> frozenset of the type strings it allows

    @classmethod
    def of(cls, schema: defs.OpSchema) -> "OpSpec":
        attributes = schema.attributes
        return cls(tuple((f.name, f.option) for f in schema.inputs), tuple((f.name, f.option) for f in schema.outputs),
                   schema.min_input, schema.max_input, schema.min_output, schema.max_output,
                   {name: int(a.type) for name, a in attributes.items()},
                   tuple(name for name, a in attributes.items() if a.required),
                   tuple((f.type_str, f.option == _VARIADIC, f.is_homogeneous) for f in schema.inputs),
                   {c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints})


class NodeAt(NamedTuple):
    """Where a node is (formatted only when a message needs it)."""

    node: onnx.NodeProto
    index: int
    where: str

    def __str__(self) -> str:
        name = self.node.name if isinstance(self.node.name, str) else repr(self.node.name)
        label = f"node {name!r}" if name else f"node #{self.index}"
        return f"{label} ({self.node.op_type}){self.where}"


class _Validator:
    def __init__(self, opsets: dict[str, int], label: str):
        self.opsets = opsets
        self.label = label
        # (domain, op_type) -> its spec at the model's opset, or None where onnx has no schema.
        self._specs: dict[tuple[str, str], Optional[OpSpec]] = {}

    def fail(self, message: str) -> NoReturn:
        raise InvalidModelError(f"{self.label}: {message}")

    # -- graphs ------------------------------------------------------------------
    def graph(self, proto: onnx.GraphProto, outer: dict[str, object], shapes: dict[str, tuple],
              where: str) -> None:
        """Check ``proto``; ``outer``: the names its enclosing graphs define at this point
        (a body may read them), ``shapes``: the known shapes of constant tensors among them."""
        scope = dict(outer)
        shapes = dict(shapes)
        initializers = self.initializers(proto, scope, shapes, where)
        self.graph_inputs(proto, scope, initializers, where)
        for index, node in enumerate(proto.node):
            self.node(proto, NodeAt(node, index, where), scope, shapes)
        if not where:  # a body's inputs and outputs may leave their types to inference, as onnx allows
            for vi in proto.output:
                self.element_type(vi, f"graph output {vi.name!r}")

    def define(self, name: str, by: object, scope: dict[str, object]) -> None:
        """``scope`` holds what this graph and, at this point, its enclosing ones define: a
        name may not be defined twice there (sibling bodies, as an If's two branches, may
        each use a name, as onnx's checker allows)."""
        previous = scope.get(name)
        if previous is not None:
            self.fail(f"{by} defines {name!r}, already defined by {previous} (ONNX names each value once)")
        scope[name] = by

    def initializers(self, proto: onnx.GraphProto, scope: dict[str, object], shapes: dict[str, tuple],
                     where: str) -> set[str]:
        names = set()
        for tensor in proto.initializer:
            what = f"initializer {tensor.name!r}{where}"
            if tensor.data_type == onnx.TensorProto.UNDEFINED:
                self.fail(f"{what} has element type UNDEFINED (0); expected a tensor element type")
            self.define(tensor.name, what, scope)
            shapes[tensor.name] = tuple(tensor.dims)
            names.add(tensor.name)
        for sparse in proto.sparse_initializer:
            self.define(sparse.values.name, f"sparse initializer {sparse.values.name!r}{where}", scope)
            shapes[sparse.values.name] = tuple(sparse.dims)
            names.add(sparse.values.name)
        return names

    def graph_inputs(self, proto: onnx.GraphProto, scope: dict[str, object], initializers: set[str],
                     where: str) -> None:
        for vi in proto.input:
            if vi.name in initializers:
                continue  # IR versions before 4 list the initializers among the inputs too
            what = f"graph input {vi.name!r}{where}"
            if not where:
                self.element_type(vi, what)
            self.define(vi.name, what, scope)

    def element_type(self, vi: onnx.ValueInfoProto, what: str) -> None:
        """A tensor type that says it is a tensor of UNDEFINED elements is refused (a value
        with no type at all is allowed: inference types it)."""
        t = vi.type
        if t.WhichOneof("value") == "tensor_type" and t.tensor_type.elem_type == onnx.TensorProto.UNDEFINED:
            self.fail(f"{what} has element type UNDEFINED (0); expected a tensor element type")

    # -- nodes -------------------------------------------------------------------
    def node(self, proto: onnx.GraphProto, at: NodeAt, scope: dict[str, object], shapes: dict[str, tuple]) -> None:
        # Each read of a proto field builds new Python objects: read each once.
        node = at.node
        inputs, outputs, attrs = node.input[:], node.output[:], node.attribute
        domain, op_type = node.domain, node.op_type
        for name in inputs:
            if name and name not in scope:
                self.undefined_input(proto, at, name)
        spec = self.spec(domain, op_type)
        if spec is None:
            self.not_yet_defined(domain, op_type, at)
        else:
            self.arity(inputs, spec.inputs, spec.min_inputs, spec.max_inputs, "input", at)
            self.arity(outputs, spec.outputs, spec.min_outputs, spec.max_outputs, "output", at)
        if len(attrs):  # most nodes have none
            self.attributes(attrs, spec, at, scope, shapes)
        if spec is not None and spec.required_attrs:
            self.required_attributes(attrs, spec, at)
        default_domain = domain == "" or domain == "ai.onnx"
        if default_domain and op_type in WINDOW_OPS:
            self.window(at, shapes)
        if default_domain and op_type in ("If", "Loop", "Scan"):
            self.body_arity(at, len(inputs), len(outputs))
        for name in outputs:
            if name:
                self.define(name, at, scope)
        if default_domain and op_type == "Constant" and len(outputs) == 1:
            _note_constant_shape(node, shapes)

    def undefined_input(self, proto: onnx.GraphProto, at: NodeAt, name: str) -> None:
        """A node reads ``name`` before anything defines it: say why, as precisely as we can."""
        nodes = proto.node
        producer = next((i for i in range(at.index, len(nodes)) if name in nodes[i].output), None)
        if producer is None:
            self.fail(f"{at} reads {name!r}, which is not defined before it")
        if _reaches(proto, at.index, producer):  # the producer reads what this node computes
            self.fail(f"{at} reads {name!r}, which it helps compute: the graph has a cycle")
        self.fail(f"{at} reads {name!r}, defined only by a later node ({NodeAt(nodes[producer], producer, '')}): "
                  "ONNX nodes must be in topological order")

    def arity(self, names: list[str], formals: tuple, least: int, most: int, kind: str, at: NodeAt) -> None:
        """The count of inputs (or outputs) and, position by position, that a required one
        is not left empty. Variadic parameters repeat the last formal parameter."""
        if not least <= len(names) <= most:
            self.fail(f"{at} has {_count(len(names), kind)}; expected {_range_text(least, most)} "
                      f"({_formal_text(formals)})")
        if "" in names:
            for position, name in enumerate(names):
                formal, option = formals[min(position, len(formals) - 1)]
                if not name and option == _SINGLE:
                    self.fail(f"{at}: {kind} {position} ({formal}) is required but given as empty")

    def attributes(self, attrs, spec: Optional[OpSpec], at: NodeAt, scope: dict[str, object],
                   shapes: dict[str, tuple]) -> None:
        """Each attribute one the schema names, of the type it declares; subgraphs checked in
        turn. An attribute the schema does not name is refused, as onnxruntime and onnx's
        checker refuse it: every rule ignored it, so a Squeeze given ``axes`` as an attribute
        at opset 13 or later squeezed nothing here where the model meant an axis (none of the
        onnx node test cases or ../shared/models has such an attribute)."""
        for attr in attrs:
            kind = attr.type or _kind(attr)
            if spec is not None:
                if attr.name not in spec.attr_types:
                    known = ", ".join(sorted(spec.attr_types)) or "none"
                    self.fail(f"{at}: attribute {attr.name!r} is not one of this op's at the model's opset "
                              f"(its attributes: {known})")
                expected = spec.attr_types[attr.name]
                if kind != expected and kind and not attr.ref_attr_name:
                    self.fail(f"{at}: attribute {attr.name!r} is {_kind_name(kind)}, expected {_kind_name(expected)}")
                if not kind and not attr.ref_attr_name:
                    # Neither a type nor a value: every reader took it as None, where a
                    # rule expected the attribute's default or a list.
                    self.fail(f"{at}: attribute {attr.name!r} has no type and no value, expected "
                              f"{_kind_name(expected)}")
            if kind == A.GRAPH or kind == A.GRAPHS:
                inner = f" in attribute {attr.name!r} of {at}"
                for body in ([attr.g] if kind == A.GRAPH else attr.graphs):
                    self.graph(body, scope, shapes, inner)

    def required_attributes(self, attrs, spec: OpSpec, at: NodeAt) -> None:
        given = {attr.name for attr in attrs}
        for name in spec.required_attrs:
            if name not in given:
                self.fail(f"{at}: required attribute {name!r} ({_kind_name(spec.attr_types[name])}) is missing")

    def not_yet_defined(self, domain: str, op_type: str, at: NodeAt) -> None:
        """Refuse an onnx op the model's opset is older than: our rules run an op by its
        latest definition, so GatherElements in an opset 7 model reached the lowering with
        whatever inputs it had and failed there."""
        canonical = "" if domain == "ai.onnx" else domain
        version = self.opsets.get(canonical)
        if version is None or not isinstance(op_type, str):
            return
        first = first_version(canonical, op_type, version)
        if first is not None:
            self.fail(f"{at}: opset {version} does not have {op_type} (onnx added it in opset {first})")

    def spec(self, domain: str, op_type: str) -> Optional[OpSpec]:
        key = (domain, op_type)
        if key not in self._specs:
            canonical = "" if domain == "ai.onnx" else domain
            version = self.opsets.get(canonical)
            # A domain the model does not import, or an op name that is not UTF-8: the support check names it.
            ok = version is not None and isinstance(op_type, str)
            self._specs[key] = op_spec(canonical, op_type, version) if ok else None
        return self._specs[key]

    # -- control flow ------------------------------------------------------------
    def body_arity(self, at: NodeAt, inputs: int, outputs: int) -> None:
        """A body's inputs and outputs against its node's: the executors pair them by
        position, and a Loop whose body had lost a scan output had no value for the
        node's last output."""
        node = at.node
        bodies = {a.name: a.g for a in node.attribute if _kind(a) == A.GRAPH}
        if node.op_type == "If":
            # then: its outputs are the node's; none of its own inputs (onnx's checker agrees).
            wanted = {name: (0, outputs) for name in ("then_branch", "else_branch")}
        elif node.op_type == "Loop":
            # (iteration, condition, N carried) in; (condition, N carried, K scanned) out,
            # where the node has the N carried after its trip count and condition.
            wanted = {"body": (inputs, 1 + outputs)}
            if outputs < inputs - 2:
                self.fail(f"{at} carries {inputs - 2} values (its inputs after the trip count and condition) "
                          f"but has {_count(outputs, 'output')}; expected at least {inputs - 2}")
        elif self.opsets.get("", 1) >= 9:  # Scan: the body's inputs and outputs are the node's, one for one
            wanted = {"body": (inputs, outputs)}
        else:  # Scan-8 reads sequence_lens first, which its body does not see
            wanted = {"body": (inputs - 1, outputs)}
        for name, (n_in, n_out) in wanted.items():
            body = bodies.get(name)
            if body is None:
                continue  # a missing body is a missing required attribute, checked apart
            got_in, got_out = len(body.input), len(body.output)
            if got_in != n_in or got_out != n_out:
                self.fail(f"{at}: its {name} has {_count(got_in, 'input')} and {_count(got_out, 'output')}; "
                          f"expected {n_in} and {n_out} for a {node.op_type} with {_count(inputs, 'input')} "
                          f"and {_count(outputs, 'output')}")

    # -- convolution and pooling windows -----------------------------------------
    def window(self, at: NodeAt, shapes: dict[str, tuple]) -> None:
        """Window attributes the kernels index with: a negative pad or a kernel larger than
        its weight made native code read out of bounds, a huge pad ask for exbibytes."""
        attrs = {a.name: list(a.ints) for a in at.node.attribute if _kind(a) == A.INTS}
        for name, least in (("kernel_shape", 1), ("strides", 1), ("dilations", 1), ("pads", 0)):
            for value in attrs.get(name, ()):
                if not least <= value <= MAX_WINDOW:
                    self.fail(f"{at}: attribute {name!r} is {attrs[name]}; expected values from {least} "
                              f"to {MAX_WINDOW}")
        self.window_lengths(attrs, at)
        weight = WINDOW_OPS[at.node.op_type]
        kernel = attrs.get("kernel_shape")
        inputs = at.node.input
        if weight is not None and kernel is not None and weight < len(inputs):
            self.kernel_matches_weight(kernel, inputs[weight], shapes.get(inputs[weight]), at)
        if at.node.op_type in POOLS_PADDED_LESS_THAN_KERNEL and kernel is not None and "pads" in attrs:
            self.pads_within_kernel(attrs["pads"], kernel, at)

    def pads_within_kernel(self, pads: list[int], kernel: list[int], at: NodeAt) -> None:
        """A pool's window must reach into the input: one that lies wholly in the padding
        has no value (an average of nothing came out NaN on one backend and 0 on the other);
        onnxruntime refuses such pads at load ("Pad should be smaller than kernel")."""
        axes = len(kernel)
        for axis in range(min(axes, len(pads) // 2)):
            if pads[axis] >= kernel[axis] or pads[axis + axes] >= kernel[axis]:
                self.fail(f"{at}: attribute 'pads' is {pads}: a pad of axis {axis} is not smaller than its "
                          f"kernel size {kernel[axis]}, so a window would lie wholly in the padding")

    def window_lengths(self, attrs: dict[str, list[int]], at: NodeAt) -> None:
        """strides, dilations and kernel_shape have one value per spatial axis, pads two."""
        axes = {name: len(attrs[name]) for name in ("kernel_shape", "strides", "dilations") if name in attrs}
        if "pads" in attrs:
            if len(attrs["pads"]) % 2:
                self.fail(f"{at}: attribute 'pads' has {len(attrs['pads'])} values; expected two per "
                          "spatial axis (all begins, then all ends)")
            axes["pads"] = len(attrs["pads"]) // 2
        if len(set(axes.values())) > 1:
            told = ", ".join(f"{name} {count}" for name, count in axes.items())
            self.fail(f"{at}: its window attributes disagree on the number of spatial axes ({told})")

    def kernel_matches_weight(self, kernel: list[int], weight: str, shape: Optional[tuple], at: NodeAt) -> None:
        if shape is None:
            return  # a weight known only at run time: the type rule checks what its type says
        if len(shape) != len(kernel) + 2 or list(shape[2:]) != kernel:
            self.fail(f"{at}: attribute 'kernel_shape' is {kernel}, but weight {weight!r} has shape "
                      f"{list(shape)}; expected kernel_shape {list(shape[2:])}")


def first_version(domain: str, op_type: str, version: int) -> Optional[int]:
    """The opset, after ``version``, in which onnx first defines ``op_type``; None where onnx
    defines it by ``version`` already, or not at all (a custom op). Asked only of nodes with
    no spec, and it walks the opsets only for an op that is missing at ``version``."""
    if not defs.has(op_type, domain):
        return None
    try:
        defs.get_schema(op_type, version, domain)
        return None  # defined by then (a deprecated op has no spec either)
    except defs.SchemaError:
        pass
    for later in range(version + 1, defs.onnx_opset_version() + 1):
        try:
            return defs.get_schema(op_type, later, domain).since_version
        except defs.SchemaError:
            continue
    return None


@functools.lru_cache(maxsize=1024)
def op_spec(domain: str, op_type: str, version: int) -> Optional[OpSpec]:
    """The spec of an op at an opset, or None where onnx has no schema for it: not an onnx
    op (a custom domain, or newer than the installed onnx), whose rules judge it, or a
    deprecated one (Upsample after opset 9), which the support check judges."""
    try:
        schema = defs.get_schema(op_type, version, domain)
    except defs.SchemaError:
        return None
    return None if schema.deprecated else OpSpec.of(schema)


def _kind(attr: AttributeProto) -> int:
    """The attribute's type, or for one stored without a type, the field that holds its value."""
    if attr.type != A.UNDEFINED:
        return attr.type
    for field, kind in _SCALAR_FIELDS:
        if attr.HasField(field):
            return kind
    for field, kind in _LIST_FIELDS:
        if len(getattr(attr, field)):
            return kind
    return A.UNDEFINED


def _kind_name(kind: int) -> str:
    return _KIND_NAMES.get(kind, f"type {kind}")


def _count(n: int, kind: str) -> str:
    return f"{n} {kind}{'' if n == 1 else 's'}"


def _range_text(least: int, most: int) -> str:
    if least == most:
        return str(least)
    if most >= 2**31 - 1:  # onnx's "any number" for a variadic parameter
        return f"at least {least}"
    return f"{least} to {most}"


def _formal_text(formals) -> str:
    words = {_SINGLE: "", defs.OpSchema.FormalParameterOption.Optional: " optional", _VARIADIC: "..."}
    return ", ".join(f"{name}{words[option]}" for name, option in formals) or "none"


def _reaches(proto: onnx.GraphProto, start: int, target: int) -> bool:
    """Whether node ``target`` is reachable from node ``start`` along data edges (so that
    ``start`` reading ``target``'s output closes a cycle)."""
    readers: dict[str, list[int]] = {}
    for index, node in enumerate(proto.node):
        for name in node.input:
            readers.setdefault(name, []).append(index)
    seen, stack = {start}, [start]
    while stack:
        for out in proto.node[stack.pop()].output:
            for reader in readers.get(out, ()):
                if reader == target:
                    return True
                if reader not in seen:
                    seen.add(reader)
                    stack.append(reader)
    return False


def _note_constant_shape(node: onnx.NodeProto, shapes: dict[str, tuple]) -> None:
    """The shape of a Constant's tensor, so that a Conv weight held in one is checked too."""
    for attr in node.attribute:
        if attr.name == "value" and _kind(attr) == A.TENSOR:
            shapes[node.output[0]] = tuple(attr.t.dims)
