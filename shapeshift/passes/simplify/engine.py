"""The simplify engine: type inference, constant folding, dynamic-to-static and
rewrite rules in one worklist, run to a fixpoint.

Each node popped from the worklist goes through the same steps:

1. re-infer its types; if an output's type or known contents changed, its users
   are enqueued (and the owner of its subgraph, when it is a subgraph output);
2. drop it if nothing reads its outputs;
3. inline it if it is an If whose condition is known;
4. fold it if its inputs are constants, or if its outputs' contents are fully
   known integers (``Shape`` of a static tensor, arithmetic on those);
5. turn each parameter input whose contents are known into a node parameter
   (a constant, or a StaticParam over the model's input symbols): the op becomes
   static, and the Shape chain that computed the parameter becomes dead;
6. run the clean-up rules registered for its op type (rules.py), and the fusions
   (fusions.py) when the options ask for them;
7. merge it with an earlier identical node (common subexpressions).

The strategies differ only in scheduling (see :func:`simplify_graph`):
"incremental" is the worklist above; "fixpoint" reruns whole-graph passes
until nothing changes (TVM before its refactor); "per-op" re-infers and
re-folds the whole graph before each dynamic op (TVM after it).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ...errors import ShapeshiftError
from ...ir.graph import Graph, Node, StaticParam, Value
from ...ir.types import INT_TYPES, TensorType, to_numpy_dtype
from ...ops import lookup
from ...ops.context import EvalContext
from ...symbolic import Expr, free_symbols
from ..infer_types import infer_node
from ...ops.symbolic_tensor import DOMAIN as SYMBOLIC_DOMAIN
from ...ops.symbolic_tensor import OP_TYPE as SYMBOLIC_OP
from .control_flow import inline_if, known_condition
from . import fusions  # noqa: F401 - registers the fusion rules in the same table
from . import shared_weight  # noqa: F401 - registers the shared-weight batching rule
from .rewriter import Rewriter
from .rules import rules_for

STRATEGIES = ("incremental", "per-op", "fixpoint")
#: Ops never folded: their outputs are random or their bodies run subgraphs.
UNFOLDABLE = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
                        "Multinomial", "If", "Loop", "Scan", "SequenceMap"})


@dataclass
class SimplifyOptions:
    strategy: str = "incremental"
    #: Largest folded output, in elements; bigger results (Tile, Expand...) stay computed.
    fold_limit: int = 1 << 16
    #: Ops folded whatever their output's size: the native backend folds DequantizeLinear
    #: of a weight, so that its GEMMs read float weights (prepacked once) instead of
    #: dequantizing at every run. (Not by default: `shapeshift simplify` would turn a
    #: quantized model back into a float one, four times the bytes.)
    fold_any_size: frozenset = frozenset()
    #: The worklist stops after this many visits per node of the input (with a warning).
    max_visits_per_node: int = 40
    #: Graph fusions (fusions.py: BatchNormalization into Conv/MatMul, MatMul+Add into Gemm,
    #: Pad into Conv, constant chains...). `shapeshift simplify` turns them on; off here so
    #: that the compiler's own callers (native lowering, tuning) see the graph they were
    #: written against until they opt in.
    fusions: bool = False
    #: BatchNormalization folded into the Conv, ConvTranspose, Gemm or MatMul before it, the
    #: one fusion the native backend takes (its NCHW convs have no BatchNormalization
    #: epilogue: left in, each one was a pass of its own and kept the conv's activation and
    #: residual Add out of its kernel too). ``fusions`` runs it as well (``folds_batch_norm``).
    fold_batch_norm: bool = False
    #: With ``fusions``: MatMuls of one input and constant weights merged into one MatMul
    #: and a Split (fewer, wider GEMMs; a deployment may want the separate ones).
    merge_matmuls: bool = True
    #: MatMul/Gemm nodes of independent inputs and one constant weight stacked into one
    #: product (shared_weight.py). The native backend sets it; off by default.
    shared_weights: bool = False

    @property
    def folds_batch_norm(self) -> bool:
        """Whether the BatchNormalization fold runs: asked for alone or with the fusions."""
        return self.fold_batch_norm or self.fusions


@dataclass
class SimplifyStats:
    visits: int = 0
    folded: int = 0
    params_made: int = 0
    rules_fired: int = 0
    inlined: int = 0
    merged: int = 0
    symbolized: int = 0
    removed_dead: int = 0
    rounds: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)


class _Simplifier:
    def __init__(self, graph: Graph, options: SimplifyOptions):
        self.graph = graph
        self.options = options
        self.stats = SimplifyStats()
        self.nodes = list(graph.walk_nodes())  # the walk the rewriter, owners and worklist start from
        self.rw = Rewriter(graph, self.nodes)
        self.input_symbols = graph.input_symbols()
        # Expr -> whether all its symbols are input symbols (Exprs are interned, so
        # identity is equality); asked of every dim of every candidate parameter.
        self._bindable: dict[Expr, bool] = {}
        self.cse: dict[tuple, Node] = {}
        self.rules = rules_for(options)

    # -- the per-node steps ------------------------------------------------------------
    def visit(self, node: Node, rules: bool = True) -> None:
        """All steps for one node (the incremental strategy)."""
        self.stats.visits += 1
        if not self.rw.take_full(node) and len(node.outputs) == 1:
            # Only a reader went away: nothing but liveness can have changed. (With more
            # outputs, a rule may wait for one to go unread, as Dropout's for its mask.)
            self.drop_if_dead(node)
            return
        if self.rw.take_stale(node) and not self.retype(node):
            return
        if self.drop_if_dead(node) or self.inline(node) or self.fold(node) or self.symbolize(node):
            return
        self.make_static(node)
        if rules and (self.apply_rules(node) or self.merge(node)):
            return

    def retype(self, node: Node) -> bool:
        before = [(o.type, o.shape_contents) for o in node.outputs]
        try:
            infer_node(node, retype_bodies=False)
        except ShapeshiftError as exc:
            self.stats.warnings.append(str(exc))
            node.type_error = str(exc)
            return False
        node.type_error = None
        for out, (old_type, old_contents) in zip(node.outputs, before):
            if out.type != old_type or out.shape_contents != old_contents:
                self.rw.enqueue_users(out)
                self._enqueue_owner_if_output(out)
        return True

    def _enqueue_owner_if_output(self, value: Value) -> None:
        graph = value.graph
        if graph is not None and graph.parent is not None and any(v is value for v in graph.outputs):
            self.rw.enqueue(self.rw.owners.get(id(graph)))

    def drop_if_dead(self, node: Node) -> bool:
        for out in node.outputs:
            if self.rw.is_used(out):
                return False
        self.rw.remove_node(node)
        self.stats.removed_dead += 1
        return True

    def inline(self, node: Node) -> bool:
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            return False
        condition = known_condition(node)
        if condition is None:
            return False
        moved = inline_if(node, condition, self.rw)
        for inner in moved:
            for sub in inner.subgraphs():
                self.rw.owners[id(sub)] = inner
        self.stats.inlined += 1
        return True

    def fold(self, node: Node) -> bool:
        if node.op_type in UNFOLDABLE:
            return False
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx"):
            # Its rule forwards the input itself: folded, a weight the exporter shared through
            # an Identity (120 in ../shared/models/bert.ts.onnx) came out as a copy of its own.
            return False
        arrays = self._contents_as_arrays(node)
        if arrays is None:
            arrays = self._evaluate_constant(node)
        # Asked last: most nodes are refused sooner, and asking costs a scan of the attributes.
        if arrays is None or node.has_subgraphs():
            return False
        graph = node.graph
        for out, array in zip(node.outputs, arrays):
            if self.rw.is_used(out):
                self.rw.replace_value(out, self.rw.constant(graph, array, out.name))
        self.rw.remove_node(node)
        self.stats.folded += 1
        return True

    def symbolize(self, node: Node) -> bool:
        """Replace a computation whose result is known as input dims by a SymbolicTensor."""
        if len(node.outputs) != 1 or node.outputs[0].shape_contents is None:
            return False  # most nodes: nothing known of their contents
        out = node.outputs[0]
        if Expr not in map(type, out.shape_contents):
            return False  # all known: folding's job (Expr has no subclasses)
        if (node.domain, node.op_type) == (SYMBOLIC_DOMAIN, SYMBOLIC_OP) or node.has_subgraphs():
            return False
        # Asked before building the parameter: in a Shape chain nearly every node is
        # taken downstream, and each is asked again whenever it gains a reader.
        if not self._has_param(out) or self._taken_downstream(out):
            return False
        param = self._param_of(out)
        graph = node.graph
        replacement = self.rw.add_node(graph, SYMBOLIC_OP, [None], before=node, name=out.name, at_start=True)
        replacement.domain = SYMBOLIC_DOMAIN
        replacement.params[0] = param
        self.retype(replacement)
        self.rw.replace_value(out, replacement.outputs[0])
        self.rw.remove_node(node)
        self.stats.symbolized += 1
        return True

    def _taken_downstream(self, value: Value) -> bool:
        """True when every reader takes ``value`` as a parameter or carries its contents on.

        Then the readers absorb it (or get symbolized themselves), and making a
        SymbolicTensor here would only create a node for the next step to drop:
        a Shape -> Gather -> Unsqueeze -> Concat -> Reshape chain would make four.
        """
        if not value.users or self.rw.is_returned(value):
            return False
        for user, index in value.users:
            if user.graph is None:
                continue
            rule = lookup(user.domain, user.op_type, user.graph.opset.get(user.domain or "", 1))
            if rule is not None and index in rule.params:
                continue
            if len(user.outputs) == 1 and self._has_param(user.outputs[0]):
                continue
            return False
        return True

    def _contents_as_arrays(self, node: Node) -> Optional[list[np.ndarray]]:
        """Outputs whose contents are fully known integers, as arrays (all or nothing)."""
        arrays = []
        for out in node.outputs:
            t, contents = out.type, out.shape_contents
            if (contents is None or not isinstance(t, TensorType) or t.dtype not in INT_TYPES
                    or not t.is_static or Expr in map(type, contents)):
                return None
            arrays.append(np.array(contents, dtype=to_numpy_dtype(t.dtype)).reshape(t.shape))
        return arrays

    def _evaluate_constant(self, node: Node) -> Optional[list]:
        if node.params:
            return None
        for v in node.inputs:  # a loop, not all(): asked of every node, most fail at once
            # is_initializer, not const: asking const of a weight read lazily would make its
            # array, the embedding table of a Gather whose indices come at run time too.
            if v is not None and not v.is_initializer:
                return None
        if node.has_subgraphs():
            return None
        limit = math.inf if node.op_type in self.options.fold_any_size else self.options.fold_limit
        for out in node.outputs:
            if isinstance(out.type, TensorType) and out.type.is_static:
                if math.prod(out.type.shape) > limit:  # ints: no NumPy call
                    return None
        opset = node.graph.opset.get(node.domain or "", 1)
        rule = lookup(node.domain, node.op_type, opset)
        if rule is None:
            return None
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results = rule.evaluate(EvalContext(node, opset), *[None if v is None else v.const for v in node.inputs])
        except Exception as exc:  # noqa: BLE001 - a node that cannot run is left as it is
            self.stats.warnings.append(f"{node.describe()}: not folded ({type(exc).__name__}: {exc})")
            return None
        if any(not isinstance(r, np.ndarray) or r.size > limit for r in results):
            return None
        return list(results)

    def make_static(self, node: Node) -> bool:
        opset = node.graph.opset.get(node.domain or "", 1)
        rule = lookup(node.domain, node.op_type, opset)
        if rule is None or not rule.params:
            return False
        changed = False
        for index in rule.params:
            if index >= len(node.inputs) or node.inputs[index] is None:
                continue
            value = node.inputs[index]
            if value.const is not None:
                continue
            param = self._param_of(value)
            if param is None:
                continue
            if all(not isinstance(d, Expr) for d in param.dims):
                array = np.array(param.dims, dtype=to_numpy_dtype(param.dtype)).reshape(param.shape)
                self.rw.set_input(node, index, self.rw.constant(node.graph, array, value.name))
            else:
                # The type rule reads the same type and dims from the parameter as it did
                # from the input (and no constant either way): no new inference.
                node.params[index] = param
                self.rw.set_input(node, index, None, stale=False)
            self.stats.params_made += 1
            changed = True
        if changed:
            # Rules on the readers may depend on this node being static (Reshape of Reshape).
            # Their types need no new inference: the node itself was enqueued stale
            # by set_input, and its visit enqueues them stale if its types change.
            for out in node.outputs:
                self.rw.enqueue_users(out, stale=False)
        return changed

    def _param_of(self, value: Value) -> Optional[StaticParam]:
        if not self._has_param(value):
            return None
        t = value.type
        return StaticParam(tuple(value.shape_contents), tuple(t.shape), t.dtype)

    def _has_param(self, value: Value) -> bool:
        """Whether ``_param_of(value)`` is a parameter (asked without building it)."""
        t, dims = value.type, value.shape_contents
        if dims is None or not isinstance(t, TensorType) or t.dtype not in INT_TYPES or not t.is_static:
            return False
        for d in dims:
            if isinstance(d, Expr) and not self._is_bindable(d):
                return False  # data-dependent symbols cannot be bound from the inputs
        return True

    def _is_bindable(self, dim: Expr) -> bool:
        """Whether every symbol of ``dim`` is a dim of a model input."""
        known = self._bindable.get(dim)
        if known is None:
            known = self._bindable[dim] = free_symbols(dim) <= self.input_symbols
        return known

    def apply_rules(self, node: Node) -> bool:
        for rule in self.rules.get(node.op_type, ()):
            if node.graph is not None and rule(node, self.rw):
                self.stats.rules_fired += 1
                return True
        return False

    def merge(self, node: Node) -> bool:
        # A duplicate reads the same values, so each has another reader: most nodes (a
        # MatMul of its own weight, the next step of a chain) cannot have one, and are
        # neither keyed nor recorded.
        anchor = None
        for value in node.inputs:
            if value is not None:
                if len(value.users) < 2:
                    return False
                if anchor is None:
                    anchor = value
        key = _cse_key(node)
        if key is None:
            return False
        earlier = self.cse.get(key)
        # Re-check: the earlier node's inputs may have changed since it was recorded.
        if earlier is None or earlier.graph is None or earlier is node or _cse_key(earlier) != key:
            earlier = self._unrecorded_duplicate(node, anchor, key)
        if earlier is None:
            self.cse[key] = node
            return False
        if earlier.graph is not node.graph or self.rw.order(earlier) > self.rw.order(node):
            self.cse[key] = node
            return False
        for mine, theirs in zip(node.outputs, earlier.outputs):
            self.rw.replace_value(mine, theirs)
        self.rw.remove_node(node)
        self.stats.merged += 1
        return True

    def _unrecorded_duplicate(self, node: Node, anchor: Optional[Value], key: tuple) -> Optional[Node]:
        """The first node before ``node`` that reads ``anchor`` (its first input) and is
        its duplicate: one that was not recorded, its inputs having had one reader then."""
        found = None
        if anchor is not None:
            for user, _ in anchor.users:
                if (user is not node and user.graph is node.graph and user.op_type == node.op_type
                        and self.rw.order(user) < self.rw.order(node) and _cse_key(user) == key
                        and (found is None or self.rw.order(user) < self.rw.order(found))):
                    found = user
        return found

    # -- strategies ----------------------------------------------------------------------
    def run_incremental(self) -> None:
        # Import typed every node with the same rules: first visits need not re-infer.
        nodes = self.nodes
        self.rw.enqueue_all(nodes, stale=False)
        budget = self.options.max_visits_per_node * max(1, len(nodes))
        while self.rw:
            node = self.rw.pop()
            if node is None:
                break
            if self.stats.visits >= budget:
                self.stats.warnings.append(f"simplify stopped after {budget} node visits without a fixpoint")
                break
            self.visit(node)
        self.stats.rounds = 1

    def _whole_graph_round(self, steps) -> bool:
        """One pass of the given steps over every live node; True if anything changed."""
        before = self.rw.changes
        for node in list(self.graph.walk_nodes()):
            if node.graph is not None:
                for step in steps:
                    if node.graph is None:
                        break
                    self.stats.visits += 1
                    step(node)
        self.rw.compact()
        self.rw.renumber()
        return self.rw.changes != before

    def run_fixpoint(self) -> None:
        """Infer everything, fold everything, rewrite everything; repeat."""
        rounds = 0
        while True:
            rounds += 1
            self.stats.rounds += 1
            self._whole_graph_round([self.retype])
            changed = self._whole_graph_round(
                [lambda n: self.drop_if_dead(n) or self.inline(n) or self.fold(n) or self.symbolize(n)])
            changed |= self._whole_graph_round([self.make_static])
            changed |= self._whole_graph_round([lambda n: self.apply_rules(n) or self.merge(n)])
            if not changed:
                break
            if rounds >= self.options.max_visits_per_node:
                self.stats.warnings.append(f"fixpoint strategy stopped after {rounds} rounds without converging")
                break

    def run_per_op(self) -> None:
        """For each dynamic op: re-infer and re-fold the whole graph, then make it static."""
        for node in list(self.graph.walk_nodes()):
            if node.graph is None or not _has_dynamic_params(node):
                continue
            self.stats.rounds += 1
            self._whole_graph_round([self.retype])
            self._whole_graph_round([lambda n: self.inline(n) or self.fold(n)])
            if node.graph is not None:
                self.retype(node)
                self.make_static(node)
        self.run_fixpoint()


def _has_dynamic_params(node: Node) -> bool:
    if node.graph is None:
        return False
    rule = lookup(node.domain, node.op_type, node.graph.opset.get(node.domain or "", 1))
    return rule is not None and any(
        i < len(node.inputs) and node.inputs[i] is not None and node.inputs[i].const is None for i in rule.params)


def _freeze(value):
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, list):
        return tuple([_freeze(v) for v in value])
    if isinstance(value, (int, float, str, bytes, tuple)):
        return value
    raise TypeError


def _cse_key(node: Node) -> Optional[tuple]:
    if node.op_type in UNFOLDABLE:
        return None
    attrs: tuple = ()
    if node.attrs:  # most nodes have none: skip the sorting and freezing
        try:
            # A body (Graph) is no value _freeze knows: a node with one is never merged.
            attrs = tuple(sorted([(k, _freeze(v)) for k, v in node.attrs.items()]))
        except TypeError:
            return None
    params = tuple(sorted((i, p.dims, p.shape, p.dtype) for i, p in node.params.items())) if node.params else ()
    # The input Values themselves, not their ids: Values compare and hash by identity,
    # and a key that holds them cannot match a later value that reuses a dead one's id.
    return (node.domain, node.op_type, tuple(node.inputs), attrs, params, len(node.outputs), node.graph)


def simplify_graph(graph: Graph, options: Optional[SimplifyOptions] = None) -> SimplifyStats:
    """Simplify ``graph`` in place (it must be typed, as import leaves it)."""
    options = options or SimplifyOptions()
    if options.strategy not in STRATEGIES:
        raise ShapeshiftError(f"unknown strategy {options.strategy!r}; choose one of {', '.join(STRATEGIES)}")
    start = time.perf_counter()
    simplifier = _Simplifier(graph, options)
    {"incremental": simplifier.run_incremental, "fixpoint": simplifier.run_fixpoint,
     "per-op": simplifier.run_per_op}[options.strategy]()
    simplifier.rw.compact()
    simplifier.rw.release_removed()
    simplifier.stats.removed_dead += simplifier.rw.removed_dead
    simplifier.stats.seconds = time.perf_counter() - start
    return simplifier.stats
