"""The graph IR: Values, Nodes and Graphs with def-use lists.

One generic ``Node`` type serves every op: ``op_type``/``domain`` name the op and
``attrs`` holds its attributes as plain Python values (ints, floats, strings,
lists, NumPy arrays, nested ``Graph`` objects).  Every ``Value`` knows its
producer and its users, so a rewrite can find exactly what it affects.

Subgraphs (the bodies of If, Loop and Scan) are ``Graph`` objects whose
``parent`` is the enclosing graph; a node inside may read a Value of an
enclosing graph directly, and that Value lists the inner node among its users.
Names are unique across a whole graph tree, which keeps export to ONNX (where
subgraphs capture outer names implicitly) unambiguous.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np

from ..symbolic import DEFAULT_HI, DEFAULT_LO, Expr, free_symbols, symbol
from .types import TensorType, ValueType, tensor_type_of


class Value:
    """A tensor (or sequence/optional) flowing between nodes.

    ``const`` holds the contents of an initializer or folded constant.
    ``shape_contents`` may hold what is known of a small integer tensor's
    contents as dimensions (what ``Shape(x)`` yields for a symbolic ``x``).
    ``const_source`` is, for an initializer read from a model, the pair
    (array, serialized tensor) it was read from: while ``const`` is still that
    array, export can write the tensor back as it was instead of re-encoding it.
    ``declared``, during import only, makes the type the model declared for the
    value (its value_info): inference needs it only where it infers less, so it
    is built then (see infer_types.py); import settles the rest before returning.
    """

    __slots__ = ("name", "type", "producer", "users", "const", "shape_contents", "graph", "doc", "const_source",
                 "declared")

    def __init__(self, name: str, type: Optional[ValueType] = None, graph: Optional["Graph"] = None):
        self.name = name
        self.type = type
        self.producer: Optional[Node] = None
        self.users: list[tuple[Node, int]] = []
        self.const: Optional[np.ndarray] = None
        self.shape_contents: Optional[tuple] = None
        self.graph = graph
        self.doc = ""
        self.const_source: Optional[tuple[np.ndarray, Any]] = None
        self.declared: Optional[Callable[[], Optional[ValueType]]] = None

    @property
    def is_initializer(self) -> bool:
        return self.producer is None and self.const is not None

    def const_is_source(self) -> bool:
        """Whether ``const`` is still the array read from ``const_source`` (unchanged)."""
        return self.const_source is not None and self.const_source[0] is self.const

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class LazyConstant(Value):
    """An initializer whose array is made from its TensorProto when ``const`` is first read.

    Simplification reads the few small constants that feed shape computations;
    export writes every weight it left alone back from its TensorProto.  Made
    eagerly, the arrays of a BERT-base copied 340 MB out of the model for nothing:
    most of the time of its import and a third of the peak memory.  ``const_source``
    is (None, tensor) until the array is made, then (array, tensor).
    """

    __slots__ = ("_array", "_make")

    def __init__(self, name: str, type: Optional[ValueType], graph: "Graph", tensor: Any,
                 make: Callable[[], np.ndarray]):
        super().__init__(name, type, graph)
        self.const_source = (None, tensor)
        self._make: Optional[Callable[[], np.ndarray]] = make

    @property
    def const(self) -> Optional[np.ndarray]:
        make = self._make
        if make is not None:
            self._make = None
            self._array = make()
            self.const_source = (self._array, self.const_source[1])
        return self._array

    @const.setter
    def const(self, array: Optional[np.ndarray]) -> None:
        self._make = None
        self._array = array

    @property
    def is_initializer(self) -> bool:
        return self.producer is None and (self._make is not None or self._array is not None)

    def const_is_source(self) -> bool:
        return self._make is not None or super().const_is_source()


@dataclass(frozen=True)
class StaticParam:
    """An op parameter (a Reshape's shape, a Slice's starts...) known as dimensions.

    Simplification replaces a parameter input computed at run time (typically
    from ``Shape(x)``) by this: its contents as dims, which may be symbolic, plus
    the tensor's own shape and dtype so it can be materialized again.
    """

    dims: tuple
    shape: tuple
    dtype: int

    def __str__(self) -> str:
        from ..symbolic import to_string

        return "[" + ", ".join(to_string(d) for d in self.dims) + "]"


class Node:
    """One op application. ``inputs`` may contain None for omitted optional inputs.

    ``params`` maps an input position to a StaticParam that stands in for that
    input (whose slot is then None): the op is static, with symbolic parameters.
    """

    __slots__ = ("op_type", "domain", "name", "inputs", "outputs", "attrs", "attr_types", "graph", "doc", "params",
                 "type_error")

    def __init__(self, op_type: str, domain: str = "", name: str = ""):
        self.op_type = op_type
        self.domain = domain
        self.name = name
        self.inputs: list[Optional[Value]] = []
        self.outputs: list[Value] = []
        self.attrs: dict[str, Any] = {}
        # ONNX attribute type codes as read from a model, so that export writes
        # back exactly what was read (an empty list has no type of its own).
        self.attr_types: dict[str, int] = {}
        self.graph: Optional[Graph] = None
        self.doc = ""
        self.params: dict[int, StaticParam] = {}
        # Why re-typing this node failed after its inputs changed (simplify folded them):
        # its outputs keep their earlier types, which a lowering rule must not trust.
        self.type_error: Optional[str] = None

    # An attribute list holds one kind of item (ONNX's GRAPHS, INTS...), so its
    # first item tells whether it is a list of bodies.

    def subgraphs(self) -> Iterator["Graph"]:
        for value in self.attrs.values():
            if isinstance(value, Graph):
                yield value
            elif isinstance(value, list) and value and isinstance(value[0], Graph):
                yield from (item for item in value if isinstance(item, Graph))

    def has_subgraphs(self) -> bool:
        """Whether any attribute is a body; cheaper than starting ``subgraphs()``,
        which passes ask of nearly every node."""
        attrs = self.attrs
        if not attrs:
            return False  # most nodes
        for value in attrs.values():
            if isinstance(value, Graph) or (isinstance(value, list) and value and isinstance(value[0], Graph)):
                return True
        return False

    def set_input(self, index: int, value: Optional[Value]) -> None:
        old = self.inputs[index]
        if old is not None:
            old.users.remove((self, index))
        self.inputs[index] = value
        if value is not None:
            value.users.append((self, index))

    def describe(self) -> str:
        """A short label for error messages: ``node 'name' (OpType)``."""
        label = self.name or (self.outputs[0].name if self.outputs else "?")
        return f"node {label!r} ({self.op_type})"

    def __repr__(self) -> str:
        return f"Node({self.describe()})"


class SymbolTable:
    """The symbols of one model: declared ranges and a source of fresh names."""

    def __init__(self, ranges: Optional[dict[str, tuple[int, int]]] = None):
        self.ranges: dict[str, tuple[int, int]] = dict(ranges or {})
        self._counter = itertools.count()
        self.created: dict[str, Expr] = {}

    def get(self, name: str) -> Expr:
        """The symbol ``name`` with its declared range (default range otherwise)."""
        existing = self.created.get(name)
        if existing is not None:
            return existing
        lo, hi = self.ranges.get(name, (DEFAULT_LO, DEFAULT_HI))
        made = symbol(name, lo, hi)
        self.created[name] = made
        return made

    def fresh(self, prefix: str = "unk", lo: int = 0, hi: int = DEFAULT_HI) -> Expr:
        """A new symbol nobody else uses (for unknown or data-dependent dims)."""
        while True:
            name = f"{prefix}_{next(self._counter)}"
            if name not in self.created and name not in self.ranges:
                break
        self.ranges[name] = (lo, hi)
        return self.get(name)


class Graph:
    """A list of nodes in topological order, with inputs, outputs and initializers."""

    def __init__(self, name: str = "graph", parent: Optional["Graph"] = None,
                 opset: Optional[dict[str, int]] = None, symbols: Optional[SymbolTable] = None):
        self.name = name
        self.parent = parent
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.nodes: list[Node] = []
        self.initializers: dict[str, Value] = {}
        self.doc = ""
        # Why this If branch does not type-check (set by the If rule, ops/control.py): it
        # cannot be the branch that runs, and the native backend builds no code for it.
        self.type_error: Optional[str] = None
        if parent is None:
            self.opset: dict[str, int] = dict(opset or {"": 17})
            self.symbols = symbols or SymbolTable()
            self._names: set[str] = set()
            self._name_counter = itertools.count()
            self.metadata: dict[str, Any] = {}
        else:
            self.opset = parent.opset
            self.symbols = parent.symbols
            self._names = parent.root._names
            self._name_counter = parent.root._name_counter
            self.metadata = parent.root.metadata

    # -- structure ---------------------------------------------------------
    @property
    def root(self) -> "Graph":
        graph = self
        while graph.parent is not None:
            graph = graph.parent
        return graph

    def fresh_name(self, hint: str = "v") -> str:
        if hint not in self._names:
            return hint
        while True:
            name = f"{hint}_{next(self._name_counter)}"
            if name not in self._names:
                return name

    def _claim(self, name: str) -> str:
        name = self.fresh_name(name)
        self._names.add(name)
        return name

    def new_value(self, name: str = "v", type: Optional[ValueType] = None) -> Value:
        # _claim spelled out: import and every rewrite make values through here.
        names = self._names
        if name in names:
            name = self.fresh_name(name)
        names.add(name)
        return Value(name, type, self)

    def add_input(self, name: str, type: Optional[ValueType] = None) -> Value:
        value = self.new_value(name, type)
        self.inputs.append(value)
        return value

    def add_initializer(self, name: str, array: np.ndarray) -> Value:
        value = self.new_value(name, tensor_type_of(array))
        value.const = array
        self.initializers[value.name] = value
        return value

    def add_lazy_initializer(self, name: str, type: ValueType, tensor: Any,
                             make: Callable[[], np.ndarray]) -> LazyConstant:
        """An initializer of type ``type`` read from ``tensor``, its array made by ``make``
        when first asked for (see LazyConstant)."""
        value = LazyConstant(self._claim(name), type, self, tensor, make)
        self.initializers[value.name] = value
        return value

    def add_node(self, op_type: str, inputs: Sequence[Optional[Value]], num_outputs: int = 1,
                 attrs: Optional[dict[str, Any]] = None, domain: str = "", name: str = "",
                 output_names: Optional[Sequence[str]] = None, index: Optional[int] = None) -> Node:
        """Create a node reading ``inputs``; appended, or inserted at ``index``."""
        node = Node(op_type, domain, name)
        node.graph = self
        if attrs:
            node.attrs = dict(attrs)
        node.inputs = list(inputs)
        for i, value in enumerate(node.inputs):
            if value is not None:
                value.users.append((node, i))
        names = output_names or [f"{(name or op_type.lower())}_out{i}" if num_outputs > 1 else (name or op_type.lower())
                                 for i in range(num_outputs)]
        outputs = node.outputs
        for out_name in names:
            out = self.new_value(out_name)
            out.producer = node
            outputs.append(out)
        if index is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(index, node)
        return node

    def remove_node(self, node: Node) -> None:
        """Detach ``node``; its outputs must have no users left."""
        for out in node.outputs:
            if out.users:
                raise ValueError(f"cannot remove {node.describe()}: output {out.name!r} still used")
        for i, value in enumerate(node.inputs):
            if value is not None:
                value.users.remove((node, i))
        self.nodes.remove(node)
        node.graph = None

    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Make every reader of ``old`` (graph outputs included) read ``new``."""
        for node, index in list(old.users):
            node.set_input(index, new)
        for graph in self.root._graph_tree():
            graph.outputs = [new if v is old else v for v in graph.outputs]

    def _graph_tree(self) -> Iterator["Graph"]:
        yield self
        for node in self.nodes:
            for sub in node.subgraphs():
                yield from sub._graph_tree()

    def release(self) -> None:
        """Break the reference cycles of this graph tree (def-use links, node <-> graph),
        leaving it empty: dropped, it is then freed by reference counting at once rather
        than left to Python's cyclic collector, whose pass over a large IR costs as much
        as a small simplification."""
        for node in self.nodes:
            if node.has_subgraphs():
                for sub in node.subgraphs():
                    sub.release()
            node.graph = None
            node.inputs = []
            node.outputs = []
            node.attrs = {}
        self.nodes = []
        self.inputs = []
        self.outputs = []
        self.initializers = {}
        self.parent = None

    # -- traversal -----------------------------------------------------------
    def walk_nodes(self) -> Iterator[Node]:
        """Every node of this graph and of all nested subgraphs."""
        for node in self.nodes:
            yield node
            if node.has_subgraphs():
                for sub in node.subgraphs():
                    yield from sub.walk_nodes()

    def input_symbols(self) -> set[str]:
        """The names of the symbols the dims of this graph's inputs use."""
        names: set[str] = set()
        for value in self.inputs:
            t = value.type
            if isinstance(t, TensorType) and t.shape is not None:
                for d in t.shape:
                    names |= free_symbols(d)
        return names

    def values(self) -> Iterable[Value]:
        yield from self.inputs
        yield from self.initializers.values()
        for node in self.nodes:
            yield from node.outputs

    def __str__(self) -> str:
        from .printer import format_graph

        return format_graph(self)


def values_read(node: Node) -> list[Value]:
    """Values a node reads, including outer values read inside its subgraphs (what must
    still exist when it runs)."""
    values = [v for v in node.inputs if v is not None]
    for sub in node.subgraphs():
        for inner in sub.walk_nodes():
            values.extend(v for v in inner.inputs if v is not None)
        values.extend(sub.outputs)
    return values
