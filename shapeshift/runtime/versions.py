"""Program versions for Ifs that the input shapes, or small integer inputs, decide.

Exporters write shape tests as control flow: torch's ``x.squeeze(-1)`` under a test of the
last dim becomes ``If(Equal(Gather(Shape(x), -1), 1))`` whose branches return tensors of
different ranks. When the tested dim is a symbol (here a function of the input length),
the simplifier cannot pick a branch, joins the branch types to an unknown rank, and every
node downstream (silero_vad: its Convs and LSTMs) can only run on the reference fallback.

Yet the condition is a function of the input dims only: its producers end in values whose
contents the simplifier knows as symbolic dims (``shape_contents``) or constants. Such an
If is a *guard*. With ``k`` guards the executor builds up to ``2**k``
versions of the program at session creation, each from a fresh import of the model in
which every guard's condition is replaced by the assumed constant, then simplified again
(the If is inlined, ranks become known, the network lowers to C). At run time the guards'
predicates are evaluated on the binding of the input dims (the NumPy evaluators of the few
integer and boolean ops in between, microseconds, cached per binding) and the run goes
to the version whose assumptions hold. Every version is built once, when the session is
created: no shape seen later compiles anything.

A guard may also read the *values* of small integer or boolean inputs (``VALUE_INPUT_MAX``
elements at most): silero_vad's whole network is an If on its scalar input ``sr``, whose
branches are two copies of the model for 16 and 8 kHz. Its run went through the If's
machinery (the outer program, the condition, a second VM for the branch, an output copy):
about 45 us of a 170 us run. A version per value has the If inlined, one flat program.
Such inputs are read from the feed at each run (a few bytes); the choice is cached per
binding and values.

Guards nest: a guard inside a branch of another guard matters only in the versions where
that branch is taken, so silero_vad's three guards (``sr``, and one shape test in each
branch) make four versions, not eight. Versions are capped at ``MAX_VERSIONS``.

A version is used only where it helps: without guards, or when the versions would neither
have fewer fallback steps than the unspecialized program nor inline an If on an input's
value, there is one program as before.
"""

from __future__ import annotations

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

MAX_VERSIONS = 8  # each one compiled library
# Inputs whose values a guard may read: integer or boolean, static shape, at most this many
# elements (flags, modes, a sample rate), read from every feed to choose the version.
VALUE_INPUT_MAX = 8
_VALUE_DTYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})
# Ops a guard's condition may be computed with (cheap, on tiny integer and boolean tensors).
GUARD_OPS = frozenset({"Equal", "Not", "And", "Or", "Xor", "Greater", "Less", "GreaterOrEqual", "LessOrEqual",
                       "Cast", "Squeeze", "Unsqueeze", "Reshape", "Identity", "Gather", "Concat", "Add", "Sub",
                       "Mul", "Div", "Mod", "Max", "Min", "Abs", "Neg", "ReduceProd", "ReduceSum", "Size"})
BINDINGS_KEPT = 256


@dataclass(frozen=True)
class Guard:
    """An If whose condition depends on input dims and small inputs' values only."""

    name: str  # the If node's name (unique in the model; stable across imports)
    # (binding of the input dims, values of the inputs named in ``reads``) -> the condition
    predicate: Callable[[Mapping[str, int], Mapping[str, np.ndarray]], bool]
    reads: tuple[str, ...] = ()  # the inputs whose values the condition reads
    # Where the If lies: (name of an enclosing If, True for its then branch), outermost first.
    within: tuple[tuple[str, bool], ...] = ()


def find_guards(graph: Graph) -> list[Guard]:
    """The Ifs of ``graph`` (simplified; any depth) whose condition the input dims or the
    values of small integer inputs decide; an enclosing guard comes before those inside it."""
    inputs = {s for v in graph.inputs if isinstance(v.type, TensorType) and v.type.shape is not None
              for d in v.type.shape for s in free_symbols(d)}
    value_inputs = {id(v): v.name for v in graph.inputs if _is_value_input(v)}
    guards: list[Guard] = []
    _collect_guards(graph, (), inputs, value_inputs, guards)
    return guards


def _collect_guards(graph: Graph, within: tuple, inputs: set[str], value_inputs: dict[int, str],
                    guards: list[Guard]) -> None:
    for node in graph.nodes:
        if node.op_type == "If" and node.domain in ("", "ai.onnx"):
            if node.name and node.inputs:
                # Subgraphs share the root's opset.
                found = _predicate(node.inputs[0], node.graph.opset, inputs, value_inputs)
                if found is not None:
                    guards.append(Guard(node.name, *found, within))
            for key, branch in node.attrs.items():  # in the model's order, which versions are keyed by
                if key in ("then_branch", "else_branch") and isinstance(branch, Graph):
                    _collect_guards(branch, within + ((node.name, key == "then_branch"),), inputs, value_inputs,
                                    guards)
        elif node.has_subgraphs():
            for sub in node.subgraphs():  # Loop and Scan bodies: no branch taken or not
                _collect_guards(sub, within, inputs, value_inputs, guards)


def _is_value_input(value: Value) -> bool:
    t = value.type
    return (isinstance(t, TensorType) and t.is_static and to_numpy_dtype(t.dtype).name in _VALUE_DTYPES
            and int(np.prod(t.shape, dtype=np.int64)) <= VALUE_INPUT_MAX)


def outcomes(guards: Sequence[Guard]) -> list[tuple[Optional[bool], ...]]:
    """Every combination of the guards' outcomes that picks a distinct version: a guard
    inside a branch of another guard is None (not asked) where that branch is not taken."""
    index = {g.name: i for i, g in enumerate(guards)}
    found: list[tuple[Optional[bool], ...]] = [()]
    for guard in guards:
        grown = []
        for partial in found:
            if _reached(guard, partial, index):
                grown += [partial + (False,), partial + (True,)]
            else:
                grown.append(partial + (None,))
        found = grown
    return found


def _reached(guard: Guard, partial: tuple, index: Mapping[str, int]) -> bool:
    """Whether ``guard``'s If runs under the outcomes ``partial`` of the guards before it."""
    for name, then in guard.within:
        k = index.get(name)
        # An enclosing guard not reached itself (None), or reached with the other outcome.
        if k is not None and k < len(partial) and partial[k] is not then:
            return False
    return True


def assume(graph: Graph, assumptions: Mapping[str, bool]) -> None:
    """Replace the condition of each If named in ``assumptions`` by that constant."""
    for node in list(graph.walk_nodes()):
        if node.op_type == "If" and node.name in assumptions:
            flag = node.graph.add_initializer(f"{node.name}/assumed", np.array(assumptions[node.name]))
            node.set_input(0, flag)


class VersionedExecutor:
    """Runs each feed on the version of the program that its input dims, and the values of
    the inputs the guards read, select."""

    def __init__(self, graph: Graph, guards: Sequence[Guard], versions: Mapping[tuple[Optional[bool], ...], Any]):
        self.graph = graph  # the unspecialized graph: the session's inputs and outputs
        self.guards = list(guards)
        self.versions = dict(versions)
        self._chosen: OrderedDict[tuple, Any] = OrderedDict()
        self._index = {g.name: i for i, g in enumerate(self.guards)}
        # The inputs whose values some guard reads, as the session's input Values.
        read = {name for g in self.guards for name in g.reads}
        self._value_inputs = [(v.name, v) for v in graph.inputs if v.name in read]

    def programs(self) -> list:
        return [p for executor in self.versions.values() for p in executor.program.all_programs()]

    def profile(self, reset: bool = False) -> list:
        """Every version's step times (profile.StepTime), version after version."""
        return [row for executor in self.versions.values() for row in executor.profile(reset)]

    def select(self, binding: Mapping[str, int], values: Optional[Mapping[str, np.ndarray]] = None):
        """The version for this binding of the input dims and these values of the inputs
        the guards read (``values``: by input name)."""
        values = values or {}
        key = (tuple(sorted(binding.items())),
               tuple((name, a.dtype.str, a.shape, a.tobytes()) for name, a in sorted(values.items())))
        executor = self._chosen.get(key)
        if executor is None:
            outcome: tuple[Optional[bool], ...] = ()
            for guard in self.guards:
                if not _reached(guard, outcome, self._index):
                    outcome += (None,)
                    continue
                try:
                    outcome += (bool(guard.predicate(binding, values)),)
                except Exception as exc:  # noqa: BLE001 - reported with the guard's name
                    read = f" and values {({n: values[n].tolist() for n in guard.reads if n in values})}" \
                        if guard.reads else ""
                    raise ExecutionError(f"If {guard.name!r}: its condition cannot be evaluated for "
                                         f"{dict(binding)}{read}: {type(exc).__name__}: {exc}") from None
            executor = self.versions[outcome]
            self._chosen[key] = executor
            if len(self._chosen) > BINDINGS_KEPT:
                self._chosen.popitem(last=False)
        return executor

    def run(self, feeds: dict[Value, Any], binding: Optional[Mapping[str, int]] = None) -> list:
        binding = dict(binding or {})
        values = {name: np.asarray(feeds[v]) for name, v in self._value_inputs if v in feeds}
        executor = self.select(binding, values)
        # Each version is its own import of the model: same inputs, in the same order.
        by_position = {v: feeds[own] for v, own in zip(executor.graph.inputs, self.graph.inputs) if own in feeds}
        return executor.run(by_position, binding)


def build_versions(graph: Graph, fallback_steps: int, reimport: Callable[[], Graph],
                   prepare: Callable[[Graph], Any], make_executors: Callable[[list], list]
                   ) -> Optional[VersionedExecutor]:
    """A VersionedExecutor for ``graph`` (already simplified, its program having
    ``fallback_steps``), or None when it has no guard, or when the versions neither have
    fewer fallback steps nor inline an If on an input's value.

    ``reimport`` gives a fresh, unsimplified import of the same model; ``prepare``
    simplifies one in place and returns its program; ``make_executors([(graph, program)])``
    compiles the versions (all at once, so that it can build them in parallel). Programs
    are built for every version first (cheap), libraries only when the versions are kept.
    """
    found = find_guards(graph)
    guards: list[Guard] = []
    for guard in found:  # outer guards first: an inner one is worth less without them
        if len(outcomes(guards + [guard])) > MAX_VERSIONS:
            log.info("%d input-decided Ifs; specializing %d (at most %d versions)", len(found), len(guards),
                     MAX_VERSIONS)
            break
        # In walk order, a guard comes after those enclosing it: what is kept has its enclosers.
        guards.append(guard)
    if not guards:
        return None
    prepared = {}
    for outcome in outcomes(guards):
        version = reimport()
        assume(version, {g.name: v for g, v in zip(guards, outcome) if v is not None})
        try:
            prepared[outcome] = (version, prepare(version))
        except Exception as exc:  # noqa: BLE001 - a version is an optimization: keep the plain program
            log.warning("no program versions: assuming %s, building the program failed: %s: %s",
                        dict(zip((g.name for g in guards), outcome)), type(exc).__name__, exc)
            return None
    worst = max(_fallback_steps(program) for _, program in prepared.values())
    if worst >= fallback_steps and not any(g.reads for g in guards):
        return None
    log.info("native program in %d versions, one per outcome of the input-decided Ifs %s", len(prepared),
             ", ".join(g.name for g in guards))
    executors = make_executors(list(prepared.values()))
    return VersionedExecutor(graph, guards, dict(zip(prepared, executors)))


def _fallback_steps(program) -> int:
    return sum(n for n in program.fallback_ops().values())


# -- predicates ------------------------------------------------------------------------------

def _predicate(cond: Value, opsets: dict, inputs: set[str], value_inputs: Mapping[int, str]
               ) -> Optional[tuple[Callable[[Mapping[str, int], Mapping[str, np.ndarray]], bool], tuple[str, ...]]]:
    """``(predicate, reads)``: a function of the binding of the input dims and of the values
    of the ``reads`` inputs computing ``cond``, when everything ``cond`` is computed from is
    a constant, has contents known as dims of the ``inputs`` symbols (not symbols bound
    later, such as a joined rank), or is one of the ``value_inputs`` (id -> name); else None."""
    if cond.const is not None or _leaf(cond):
        return None  # a known condition: the simplifier inlines it
    nodes: list[Node] = []
    leaves: dict[int, Value] = {}
    read: dict[int, str] = {}

    def collect(value: Value) -> bool:
        if value.const is not None:
            return True
        if id(value) in value_inputs:
            read[id(value)] = value_inputs[id(value)]
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

    if not collect(cond) or not (leaves or read):
        return None
    steps = []
    for node in nodes:
        opset = opsets.get(node.domain or "", opsets.get("", 1))
        rule = lookup(node.domain, node.op_type, opset)
        if rule is None:
            return None
        steps.append((node, rule, opset))

    def predicate(binding: Mapping[str, int], values: Mapping[str, np.ndarray]) -> bool:
        env: dict[int, Any] = {key: values[name] for key, name in read.items()}
        for value in leaves.values():
            t = value.type
            contents = [evaluate(d, binding) for d in value.shape_contents]
            env[id(value)] = np.array(contents, dtype=to_numpy_dtype(t.dtype)).reshape(t.shape)
        for node, rule, opset in steps:
            args = [None if v is None else (v.const if v.const is not None else env[id(v)]) for v in node.inputs]
            for out, result in zip(node.outputs, rule.evaluate(EvalContext(node, opset), *args)):
                env[id(out)] = result
        return bool(np.asarray(env[id(cond)]).reshape(-1)[0])

    return predicate, tuple(dict.fromkeys(read.values()))


def _leaf(value: Value) -> bool:
    """A value whose contents are known dims (all of its elements), of a static shape."""
    t = value.type
    return (value.shape_contents is not None and isinstance(t, TensorType) and t.is_static
            and len(value.shape_contents) == int(np.prod(t.shape, dtype=np.int64)))
