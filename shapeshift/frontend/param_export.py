"""Writing static parameters over symbolic dims back to ONNX.

A node parameter such as a Reshape's target ``(B, T, 12, 64)`` has no ONNX
attribute to live in: it must become an input tensor again.  Where ONNX can
say it with constants it is written as a constant (a Reshape copies a dim with
0 and infers one with -1).  Otherwise one minimal computation from the graph's
inputs is emitted at the top of the graph, shared by every parameter that
needs it: the dims of the graph inputs, then the arithmetic of the expression.

Each input's dims are read with the fewest nodes, then the fewest Shape ops
(see ``_SymbolSources``): ``Shape(input, start=axis, end=axis+1)`` per dim when
all are wanted as ``[1]`` tensors, else one ``Shape(input)`` and a Gather per
dim -- with a scalar index where a scalar is wanted (the ``Gather(Shape(x), 2)``
that torchvision writes before a Cast and a Div), which saves the Reshape a
``[1]`` slice would need.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import UnsupportedModelError
from ..ir.graph import Graph, Node, StaticParam
from ..ir.types import TensorType
from ..symbolic import Expr, bounds
from ..symbolic.expr import Atom


class _UnsourcedSymbol(Exception):
    """A parameter's dim reads a symbol that no graph input's dims define."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


class _PastInt64(Exception):
    """A parameter's dim holds an integer (a constant or a coefficient) past int64."""

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value


def _int64(value: int) -> int:
    """``value``, or _PastInt64 where ONNX's int64 cannot hold it."""
    value = int(value)
    if not -2 ** 63 <= value < 2 ** 63:
        raise _PastInt64(value)
    return value


class ParamEmitter:
    """Emits, once per distinct expression, the nodes computing it as a [1] int64 tensor.

    ``nodes`` (read once every parameter is written) are the reads of the inputs'
    dims, then the arithmetic, in topological order."""

    def __init__(self, root: Graph):
        self.root = root
        self._arithmetic: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._cache: dict[object, str] = {}
        #: Names of removed values (SymbolicTensor outputs) -> the tensor standing for them.
        self.alias: dict[str, str] = {}
        self._opset = root.opset.get("", 17)
        self._sources = _symbol_sources(root)
        self._dims = _SymbolSources(self)

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        return self._dims.nodes() + self._arithmetic

    # -- names ---------------------------------------------------------------------
    def _name(self, hint: str) -> str:
        return self.root.fresh_name(f"shapeshift_{hint}")

    def _claim(self, hint: str) -> str:
        name = self._name(hint)
        self.root._names.add(name)
        return name

    def constant(self, values, dtype=np.int64, shape=None) -> str:
        array = np.asarray(values, dtype=dtype)
        if shape is not None:
            array = array.reshape(shape)
        key = ("const", array.dtype.str, array.shape, array.tobytes())
        if key not in self._cache:
            name = self._claim("const")
            self.initializers.append(numpy_helper.from_array(array, name))
            self._cache[key] = name
        return self._cache[key]

    def _node(self, op_type: str, inputs: list[str], hint: str, **attrs) -> str:
        out = self._claim(hint)
        self._arithmetic.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    # -- expressions ------------------------------------------------------------------
    def dim(self, d) -> str:
        """A [1] int64 tensor holding dimension ``d``."""
        if not isinstance(d, Expr):
            return self.constant([_int64(d)])
        cached = self._cache.get(d)
        if cached is not None:
            return cached
        total: Optional[str] = None
        for monomial, coeff in d.terms:
            coeff = _int64(coeff)
            term = self.constant([coeff]) if not monomial else None
            for atom, power in monomial:
                factor = self._atom(atom)
                for _ in range(power):
                    term = factor if term is None else self._node("Mul", [term, factor], "mul")
            if monomial and coeff != 1:
                term = self._node("Mul", [term, self.constant([coeff])], "mul")
            total = term if total is None else self._node("Add", [total, term], "add")
        self._cache[d] = total
        return total

    def _atom(self, atom: Atom) -> str:
        key = ("atom", atom.key)
        if key in self._cache:
            return self._cache[key]
        if atom.kind == "sym":
            if atom.definition is not None:
                name = self.dim(atom.definition)
            else:
                name = self._symbol(atom.name)
        else:
            a, b = (self.dim(arg) for arg in atom.args)
            if atom.kind == "floordiv":
                name = self._floordiv(atom.args[0], a, b)
            elif atom.kind == "mod":
                name = self._node("Mod", [a, b], "mod")
            else:
                name = self._node("Min" if atom.kind == "min" else "Max", [a, b], atom.kind)
        self._cache[key] = name
        return name

    def _floordiv(self, numerator, a: str, b: str) -> str:
        # ONNX integer Div truncates; it is floor division when the numerator is >= 0.
        if bounds(numerator)[0] >= 0:
            return self._node("Div", [a, b], "div")
        exact = self._node("Sub", [a, self._node("Mod", [a, b], "mod")], "sub")
        return self._node("Div", [exact, b], "div")

    def _symbol(self, name: str) -> str:
        source = self._sources.get(name)
        if source is None:
            raise _UnsourcedSymbol(name)
        return self._dims.read(source, scalar=False, hint=f"{name}_dim")

    def _scalar_symbol(self, d) -> Optional[str]:
        """A scalar int64 tensor holding ``d`` when it is a bare dim of a graph input."""
        atom = d.as_symbol() if isinstance(d, Expr) else None
        if atom is None or atom.definition is not None or atom.name not in self._sources:
            return None
        return self._dims.read(self._sources[atom.name], scalar=True, hint=f"{atom.name}_dim")

    # -- whole parameters -------------------------------------------------------------
    def param(self, node: Node, index: int, param: StaticParam) -> str:
        """The name of a tensor holding ``param`` for input ``index`` of ``node``."""
        if node.op_type == "Reshape" and index == 1:
            encoded = _reshape_constant(node, param)
            if encoded is not None:
                return self.constant(encoded)
        key = ("param", param.dims, param.shape, param.dtype)
        if key in self._cache:
            return self._cache[key]
        scalar = self._scalar_symbol(param.dims[0]) if tuple(param.shape) == () and len(param.dims) == 1 else None
        if scalar is not None:
            joined = scalar
        else:
            try:
                parts = [self.dim(d) for d in param.dims]
            except _UnsourcedSymbol as missing:
                # A symbol that inference made for a data-dependent extent (a Resize's
                # output whose sizes it could not read): ONNX can only say it by the
                # computation the parameter replaced, which simplify has dropped.
                raise UnsupportedModelError(
                    f"node {node.name!r} ({node.op_type}): its input {index} cannot be written back to ONNX: it "
                    f"is computed from the dimension {missing.name!r}, which no graph input's shape gives") from None
            except _PastInt64 as past:
                # A Resize whose scales make every output extent astronomical: no runtime
                # can run it either (the sessions refuse it at run time), but simplify must
                # say so clearly rather than fail inside numpy.
                raise UnsupportedModelError(
                    f"node {node.name!r} ({node.op_type}): its input {index} cannot be written back to ONNX: it "
                    f"holds the integer {past.value}, past the 64-bit range") from None
            joined = parts[0] if len(parts) == 1 else self._node("Concat", parts, "params", axis=0)
        if scalar is None and tuple(param.shape) != (len(param.dims),):
            joined = self._node("Reshape", [joined, self.constant(list(param.shape), shape=(len(param.shape),))],
                                "param")
        if param.dtype != TensorProto.INT64:
            joined = self._node("Cast", [joined], "param", to=param.dtype)
        self._cache[key] = joined
        return joined


class _SymbolSources:
    """The reads of the graph inputs' dims, decided once all are known.

    ``read`` names a tensor holding one dim (a ``[1]`` tensor, or a scalar); the
    nodes that fill those names are chosen at the end, per input, by what was
    asked of it.  With A axes read, V of them as ``[1]`` tensors and S scalar
    reads: ``Shape(x, start, end)`` slices cost A + S nodes (one slice per axis,
    a Reshape per scalar), one ``Shape(x)`` and a Gather per read 1 + V + S.  The
    shared Shape is chosen when it costs no more nodes (some axis is read only as
    a scalar), and always before opset 15 (no start/end on Shape): never more
    nodes than the slices, and one Shape op per input instead of one per axis.
    """

    def __init__(self, emitter: ParamEmitter):
        self.emitter = emitter
        #: input name -> {(axis, scalar): output name}, in order of first read.
        self.reads: dict[str, dict[tuple[int, bool], str]] = {}
        #: Names made up when the nodes are written (kept: ``nodes`` may be asked twice).
        self._made: dict[tuple, str] = {}

    def read(self, source: tuple[str, int], scalar: bool, hint: str) -> str:
        input_name, axis = source
        reads = self.reads.setdefault(input_name, {})
        key = (axis, scalar)
        if key not in reads:
            reads[key] = self.emitter._claim(hint)
        return reads[key]

    def _name(self, key: tuple, hint: str) -> str:
        if key not in self._made:
            self._made[key] = self.emitter._claim(hint)
        return self._made[key]

    def nodes(self) -> list[onnx.NodeProto]:
        emitter = self.emitter
        nodes: list[onnx.NodeProto] = []
        for input_name, reads in self.reads.items():
            axes = {axis for axis, _ in reads}
            vectors = {axis for axis, scalar in reads if not scalar}
            if emitter._opset < 15 or 1 + len(vectors) <= len(axes):
                shape = self._name(("shape", input_name), "shape")
                nodes.append(helper.make_node("Shape", [input_name], [shape]))
                for (axis, scalar), out in reads.items():
                    index = emitter.constant(axis, shape=()) if scalar else emitter.constant([axis])
                    nodes.append(helper.make_node("Gather", [shape, index], [out], axis=0))
                continue
            for axis in sorted(axes, key=list(axis for axis, _ in reads).index):
                vector = reads.get((axis, False)) or self._name(("slice", input_name, axis), "dim")
                nodes.append(helper.make_node("Shape", [input_name], [vector], start=axis, end=axis + 1))
                if (axis, True) in reads:
                    scalar_shape = emitter.constant([], shape=(0,))
                    nodes.append(helper.make_node("Reshape", [vector, scalar_shape], [reads[(axis, True)]]))
        return nodes


def _reshape_constant(node: Node, param: StaticParam) -> Optional[list[int]]:
    """The target as constants with 0 (copy that input dim) and at most one -1."""
    if node.attrs.get("allowzero", 0):
        return None
    source = node.inputs[0].type if node.inputs[0] is not None else None
    source_shape = source.shape if isinstance(source, TensorType) and source.shape is not None else ()
    encoded: list[int] = []
    unresolved = sum(1 for d in param.dims if not isinstance(d, Expr) and int(d) == -1)
    for position, d in enumerate(param.dims):
        if not isinstance(d, Expr):
            encoded.append(int(d))
        elif position < len(source_shape) and source_shape[position] is d:
            encoded.append(0)
        else:
            unresolved += 1
            encoded.append(-1)
    return encoded if unresolved <= 1 else None


def _symbol_sources(root: Graph) -> dict[str, tuple[str, int]]:
    """For each symbol that is a bare dim of a graph input: (input name, axis)."""
    sources: dict[str, tuple[str, int]] = {}
    for value in root.inputs:
        t = value.type
        if isinstance(t, TensorType) and t.shape is not None:
            for axis, d in enumerate(t.shape):
                atom = d.as_symbol() if isinstance(d, Expr) else None
                if atom is not None and atom.name not in sources:
                    sources[atom.name] = (value.name, axis)
    return sources

