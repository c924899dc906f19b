"""Program versions for Ifs that the input shapes decide.

Exporters write shape tests as control flow: torch's ``x.squeeze(-1)`` under a test of the
last dim becomes ``If(Equal(Gather(Shape(x), -1), 1))`` whose branches return tensors of
different ranks. When the tested dim is a symbol (here a function of the input length),
the simplifier cannot pick a branch, joins the branch types to an unknown rank, and every
node downstream (silero_vad: its Convs and LSTMs) can only run on the reference fallback.

Yet the condition is a function of the input dims only: its producers end in values whose
contents the simplifier knows as symbolic dims (``shape_contents``) or constants. Such an
If is a *guard*. With ``k`` guards (at most ``MAX_GUARDS``) the executor builds ``2**k``
versions of the program at session creation, each from a fresh import of the model in
which every guard's condition is replaced by the assumed constant, then simplified again
(the If is inlined, ranks become known, the network lowers to C). At run time the guards'
predicates are evaluated on the binding of the input dims (the NumPy evaluators of the few
integer and boolean ops in between, microseconds, cached per binding) and the run goes
to the version whose assumptions hold. Every version is built once, when the session is
created: no shape seen later compiles anything.

A version is used only where it helps: without guards, or when the unspecialized program
has no fallback step, there is one program as before.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from ..errors import ExecutionError
from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType, to_numpy_dtype
from ..ops.context import EvalContext
from ..ops.registry import lookup
from ..symbolic import evaluate, free_symbols

log = logging.getLogger(__name__)

MAX_GUARDS = 3  # 2**3 versions at most, each one compiled library
# Ops a guard's condition may be computed with (cheap, on tiny integer and boolean tensors).
GUARD_OPS = frozenset({"Equal", "Not", "And", "Or", "Xor", "Greater", "Less", "GreaterOrEqual", "LessOrEqual",
                       "Cast", "Squeeze", "Unsqueeze", "Reshape", "Identity", "Gather", "Concat", "Add", "Sub",
                       "Mul", "Div", "Mod", "Max", "Min", "Abs", "Neg", "ReduceProd", "ReduceSum", "Size"})
BINDINGS_KEPT = 256


@dataclass(frozen=True)
class Guard:
    """An If whose condition depends on input dims only."""

    name: str  # the If node's name (unique in the model; stable across imports)
    predicate: Callable[[Mapping[str, int]], bool]


def find_guards(graph: Graph) -> list[Guard]:
    """The Ifs of ``graph`` (simplified; any depth) whose condition the input dims decide."""
    guards = []
    inputs = {s for v in graph.inputs if isinstance(v.type, TensorType) and v.type.shape is not None
              for d in v.type.shape for s in free_symbols(d)}
    for node in graph.walk_nodes():
        if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.name or not node.inputs:
            continue
        predicate = _predicate(node.inputs[0], node.graph.opset, inputs)  # subgraphs share the root's opset
        if predicate is not None:
            guards.append(Guard(node.name, predicate))
    return guards


def assume(graph: Graph, assumptions: Mapping[str, bool]) -> None:
    """Replace the condition of each If named in ``assumptions`` by that constant."""
    for node in list(graph.walk_nodes()):
        if node.op_type == "If" and node.name in assumptions:
            flag = node.graph.add_initializer(f"{node.name}/assumed", np.array(assumptions[node.name]))
            node.set_input(0, flag)


class VersionedExecutor:
    """Runs each feed on the version of the program its input dims select."""

    def __init__(self, graph: Graph, guards: Sequence[Guard], versions: Mapping[tuple[bool, ...], Any]):
        self.graph = graph  # the unspecialized graph: the session's inputs and outputs
        self.guards = list(guards)
        self.versions = dict(versions)
        self._chosen: OrderedDict[tuple, Any] = OrderedDict()

    def programs(self) -> list:
        return [p for executor in self.versions.values() for p in executor.program.all_programs()]

    def profile(self, reset: bool = False) -> list:
        """Every version's step times (profile.StepTime), version after version."""
        return [row for executor in self.versions.values() for row in executor.profile(reset)]

    def select(self, binding: Mapping[str, int]):
        key = tuple(sorted(binding.items()))
        executor = self._chosen.get(key)
        if executor is None:
            outcome = []
            for guard in self.guards:
                try:
                    outcome.append(guard.predicate(binding))
                except Exception as exc:  # noqa: BLE001 - reported with the guard's name
                    raise ExecutionError(f"If {guard.name!r}: its shape condition cannot be evaluated for "
                                         f"{dict(binding)}: {type(exc).__name__}: {exc}") from None
            executor = self.versions[tuple(outcome)]
            self._chosen[key] = executor
            if len(self._chosen) > BINDINGS_KEPT:
                self._chosen.popitem(last=False)
        return executor

    def run(self, feeds: dict[Value, Any], binding: Optional[Mapping[str, int]] = None) -> list:
        binding = dict(binding or {})
        executor = self.select(binding)
        # Each version is its own import of the model: same inputs, in the same order.
        by_position = {v: feeds[own] for v, own in zip(executor.graph.inputs, self.graph.inputs) if own in feeds}
        return executor.run(by_position, binding)


def build_versions(graph: Graph, fallback_steps: int, reimport: Callable[[], Graph],
                   prepare: Callable[[Graph], Any], make_executors: Callable[[list], list]
                   ) -> Optional[VersionedExecutor]:
    """A VersionedExecutor for ``graph`` (already simplified, its program having
    ``fallback_steps``), or None when it has no guard or no version has fewer fallback steps.

    ``reimport`` gives a fresh, unsimplified import of the same model; ``prepare``
    simplifies one in place and returns its program; ``make_executors([(graph, program)])``
    compiles the versions (all at once, so that it can build them in parallel). Programs
    are built for every version first (cheap), libraries only when the versions are kept.
    """
    guards = find_guards(graph)
    if not guards:
        return None
    if len(guards) > MAX_GUARDS:
        log.info("%d shape-decided Ifs; specializing the first %d", len(guards), MAX_GUARDS)
        guards = guards[:MAX_GUARDS]
    prepared = {}
    for values in itertools.product((False, True), repeat=len(guards)):
        version = reimport()
        assume(version, {g.name: v for g, v in zip(guards, values)})
        try:
            prepared[values] = (version, prepare(version))
        except Exception as exc:  # noqa: BLE001 - a version is an optimization: keep the plain program
            log.warning("no program versions: assuming %s, building the program failed: %s: %s",
                        dict(zip((g.name for g in guards), values)), type(exc).__name__, exc)
            return None
    worst = max(_fallback_steps(program) for _, program in prepared.values())
    if worst >= fallback_steps:
        return None
    log.info("native program in %d versions, one per outcome of the shape-decided Ifs %s", len(prepared),
             ", ".join(g.name for g in guards))
    executors = make_executors(list(prepared.values()))
    return VersionedExecutor(graph, guards, dict(zip(prepared, executors)))


def _fallback_steps(program) -> int:
    return sum(n for n in program.fallback_ops().values())


# -- predicates ------------------------------------------------------------------------------

def _predicate(cond: Value, opsets: dict, inputs: set[str]) -> Optional[Callable[[Mapping[str, int]], bool]]:
    """A function of the input binding computing ``cond``, when everything ``cond`` is
    computed from is a constant or has contents known as dims of the ``inputs`` symbols
    (not symbols bound later, such as a joined rank); else None."""
    if cond.const is not None or _leaf(cond):
        return None  # a known condition: the simplifier inlines it
    nodes: list[Node] = []
    leaves: dict[int, Value] = {}

    def collect(value: Value) -> bool:
        if value.const is not None:
            return True
        if _leaf(value):
            leaves[id(value)] = value
            return all(free_symbols(d) <= inputs for d in value.shape_contents)
        node = value.producer
        if (node is None or node.op_type not in GUARD_OPS or node.domain not in ("", "ai.onnx")
                or node.has_subgraphs() or node.params):
            return False
        if not all(i is None or collect(i) for i in node.inputs):
            return False
        if node not in nodes:
            nodes.append(node)
        return True

    if not collect(cond) or not leaves:
        return None
    steps = []
    for node in nodes:
        opset = opsets.get(node.domain or "", opsets.get("", 1))
        rule = lookup(node.domain, node.op_type, opset)
        if rule is None:
            return None
        steps.append((node, rule, opset))

    def predicate(binding: Mapping[str, int]) -> bool:
        env: dict[int, Any] = {}
        for value in leaves.values():
            t = value.type
            contents = [evaluate(d, binding) for d in value.shape_contents]
            env[id(value)] = np.array(contents, dtype=to_numpy_dtype(t.dtype)).reshape(t.shape)
        for node, rule, opset in steps:
            args = [None if v is None else (v.const if v.const is not None else env[id(v)]) for v in node.inputs]
            for out, result in zip(node.outputs, rule.evaluate(EvalContext(node, opset), *args)):
                env[id(out)] = result
        return bool(np.asarray(env[id(cond)]).reshape(-1)[0])

    return predicate


def _leaf(value: Value) -> bool:
    """A value whose contents are known dims (all of its elements), of a static shape."""
    t = value.type
    return (value.shape_contents is not None and isinstance(t, TensorType) and t.is_static
            and len(value.shape_contents) == int(np.prod(t.shape, dtype=np.int64)))
