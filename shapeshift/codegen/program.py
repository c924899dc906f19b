"""Build the native program of a graph: steps, pointer slots, extents, and one C source.

Every node of the root graph becomes one step, in graph order:

- **native**: its lowering rule (codegen/lower/) produced C statements; consecutive
  native steps form a *segment*, one generated C function
  ``int ss_segment_<k>(void* const* v, const int64_t* e)`` that runs them back to back,
  so a model that lowers completely is one ctypes call per run;
- **alias**: a Reshape-like node on contiguous data; its output shares its input's
  buffer and costs nothing;
- **fallback**: anything else, run by the NumPy evaluator between segments.

Kernels address data through ``v[slot]`` (a table of pointers the VM fills per run) and
sizes through ``e[k]`` (a table of extents the VM evaluates once per distinct binding
of the input symbols), so one build serves every shape in the declared ranges.

A node is lowered only when every shape it touches is known from the input symbols or
from *late* symbols: a dim of a fallback step's output that is a symbol of its own (the
count of NonZero, the length of a Range over computed bounds, a dim an If's branches
disagree on) is bound by the VM from the array that step returns. What is sized by late
symbols lives in LATE storage, allocated per run once they are bound, and their extents
are evaluated then too; everything else keeps the plan made once per input binding.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..ir.graph import Graph, Node, Value, values_read
from ..ir.types import TensorType
from ..symbolic import Dim, Expr, free_symbols
from ..target import Target
from .build import CompiledLibrary, compile_library, target_flags
from .emit import OPT_FLAGS, emit_units
from .fragments import dependency_order, object_sources
from .lower import rule_for
from .lower.attention_fusion import fusion_order
from .lower.context import C_TYPES, LowerContext, Lowered, PackRequest, Unsupported
from .lower.contracts import agreements, c_checks
from .lower.layout import VIEW_OPS
from .placement import place
from .slots import (ARENA, CONST, COUNTERS, DEAD, DIMS, DYNAMIC, INPUT, LATE, PACKED, VIEW,  # noqa: F401 - re-exported
                    WORK, Slot, tensor_nbytes)

log = logging.getLogger(__name__)

NATIVE, ALIAS, FALLBACK = "native", "alias", "fallback"


@dataclass
class Step:
    kind: str
    node: Node
    lowered: Optional[Lowered] = None
    segment: int = -1
    reason: str = ""  # why a node falls back, for reports
    work: int = -1  # slot of the step's scratch space, if any
    # The late symbols this step binds, as (output index, axis, symbol): a fallback step's
    # from the arrays it returns; a native *size step* (the first half of a node whose
    # output size depends on data) from the DIMS slot its code fills, in this order.
    binds: list[tuple[int, int, str]] = field(default_factory=list)
    dims: int = -1  # size steps: the DIMS slot


@dataclass
class Program:
    graph: Graph
    steps: list[Step]
    slots: list[Slot]
    slot_of: dict[int, int]  # id(Value) -> slot
    extents: list[Dim]  # e[k] = extents[k] under the binding
    segments: list[list[int]]  # step indices of each segment
    source: str  # the first translation unit (codegen/emit.py), the whole program's when small
    packs: list[PackRequest]
    input_symbols: frozenset[str]
    fragments: tuple[str, ...] = ()
    prefix: str = ""  # segment functions are ss_segment<prefix>_<k>
    # An If's branches as programs of their own: id(node) -> (then, else). Their inputs
    # are the outer values the branch reads; their segments live in the same library.
    branches: dict[int, tuple["Program", "Program"]] = field(default_factory=dict)
    # Constants no generated code, fallback step or output reads (weights only reached
    # through their packed copies): the VM drops them once everything is packed.
    unread_consts: list[Value] = field(default_factory=list)
    # Symbols bound at run time by fallback steps (Step.binds), and the indices of the
    # extents that depend on them (evaluated per run, once they are bound).
    late_symbols: frozenset[str] = frozenset()
    late_extents: list[int] = field(default_factory=list)
    # Prefixes of the tuned batched-GEMM dispatchers its steps call (tune/records.py).
    tuned_calls: list[str] = field(default_factory=list)
    # Built with per-step timers (see codegen/emit.py) when >= 0: its native steps add their
    # seconds and a call to this COUNTERS slot, two doubles per step, that each VM allocates
    # for itself and reads.
    profile_slot: int = -1
    # The target description it is built for (None: this machine): the kernels' default
    # schedules and the compiler's -march.
    target: Optional[Target] = None
    # The other translation units of a large program, compiled in parallel with ``source``.
    parts: list[str] = field(default_factory=list)
    # The kind of each unit, ``source`` first (codegen/emit.py: GLUE, WARM or HOT), which
    # sets the optimization level it is compiled at (none given: the library's, -O3).
    unit_kinds: list[str] = field(default_factory=list)

    def objects(self) -> list[tuple[str, str]]:
        """(name, source) of the objects its library links: the kernel fragments it calls
        (codegen/fragments.py) and its own other units."""
        opts = [OPT_FLAGS[kind] for kind in self.unit_kinds[1:]] or [()] * len(self.parts)
        own = [(f"{self.graph.name} program, unit {u + 2}", text, opt)
               for u, (text, opt) in enumerate(zip(self.parts, opts, strict=True))]
        return object_sources(self.fragments, self.target) + own

    def source_opt(self) -> tuple[str, ...]:
        """The optimization flags ``source`` is compiled with (codegen/emit.py)."""
        return OPT_FLAGS[self.unit_kinds[0]] if self.unit_kinds else ()

    def has_code(self) -> bool:
        """Whether it or a branch program has compiled code (and so a library)."""
        return any(p.segments for p in self.all_programs())

    def full_source(self) -> str:
        """Every unit of its generated C, the library's whole source."""
        return "".join([self.source, *self.parts])

    def tuned_names(self) -> set[str]:
        """Prefixes of every tuned dispatcher this program and its branches use: those of
        its packed weights and those of its batched GEMM calls."""
        return {name for program in self.all_programs()
                for name in [*(p.prefix for p in program.packs), *program.tuned_calls]}

    def fallback_ops(self) -> Counter:
        """Ops run by the reference evaluator, branches of native Ifs included (an If whose
        branches are programs is itself counted only as control flow, not here)."""
        counts = Counter(s.node.op_type for s in self.steps
                         if s.kind == FALLBACK and id(s.node) not in self.branches)
        for then_program, else_program in self.branches.values():
            counts += then_program.fallback_ops() + else_program.fallback_ops()
        return counts

    def segment_name(self, k: int) -> str:
        return f"ss_segment{self.prefix}_{k}"

    @property
    def profiled(self) -> bool:
        """Whether it was built with per-step timers (a COUNTERS slot)."""
        return self.profile_slot >= 0

    def add_profile_counters(self) -> None:
        """Make it a profiled program: a COUNTERS slot (after every other, so that the
        placement of its buffers is not touched) for its steps' timers."""
        self.profile_slot = len(self.slots)
        self.slots.append(Slot(self.profile_slot, COUNTERS, nbytes=16 * max(1, len(self.steps))))

    def all_programs(self) -> list["Program"]:
        """This program and every branch program under it."""
        found = [self]
        for pair in self.branches.values():
            for branch in pair:
                found.extend(branch.all_programs())
        return found


class _Builder:
    def __init__(self, graph: Graph, prefix: str = "", outer_inputs: Sequence[Value] = (),
                 input_symbols: Optional[frozenset] = None, tuning=None, profile: bool = False,
                 target: Optional[Target] = None):
        self.graph = graph
        self.target = target
        self.tuning = tuning
        self.profile = profile
        self.prefix = prefix
        self.inputs = [*graph.inputs, *outer_inputs]
        self.input_symbols = input_symbols if input_symbols is not None else frozenset(
            s for v in graph.inputs if isinstance(v.type, TensorType) and v.type.shape is not None
            for d in v.type.shape for s in free_symbols(d))
        self.branches: dict[int, tuple[Program, Program]] = {}
        self.slots: list[Slot] = []
        self.slot_of: dict[int, int] = {}
        self.extent_index: dict[object, int] = {}
        self.extents: list[Dim] = []
        self.packs: list[PackRequest] = []
        self.tuned_calls: list[str] = []
        self.steps: list[Step] = []
        self.outputs = {id(v) for v in graph.outputs}
        # The graph's order, but for attention chains gathered where they can fuse.
        self.order = fusion_order(graph.nodes, self._escapes)
        self.position = {id(n): i for i, n in enumerate(self.order)}
        self.absorbed: set[int] = set()
        self.current = -1  # position of the node being classified
        self.late_symbols: set[str] = set()  # bound by a fallback step before the current node
        for value in self.inputs:
            self._add_slot(INPUT, value)

    # -- slots and extents -------------------------------------------------------------

    def _add_slot(self, kind: str, value: Optional[Value] = None, **fields) -> int:
        slot = Slot(len(self.slots), kind, value, **fields)
        self.slots.append(slot)
        if value is not None:
            self.slot_of[id(value)] = slot.index
        return slot.index

    def slot(self, value: Value) -> int:
        index = self.slot_of.get(id(value))
        if index is None:
            if value.const is not None:
                return self._add_slot(CONST, value)
            if value.producer is not None and self.position.get(id(value.producer), -1) > self.current:
                # The output of a later node that the current rule absorbs (fuses).
                return self._add_slot(ARENA, value)
            raise Unsupported(f"value {value.name!r} has no storage yet")
        return index

    def new_packed_slot(self) -> int:
        return self._add_slot(PACKED)

    def extent(self, d: Dim) -> str:
        key = d.key if isinstance(d, Expr) else int(d)
        index = self.extent_index.get(key)
        if index is None:
            index = self.extent_index[key] = len(self.extents)
            self.extents.append(d)
        return f"e[{index}]"

    # -- classification ----------------------------------------------------------------

    def plannable(self, value: Optional[Value]) -> bool:
        """A tensor of a native dtype whose shape is known from the input or late symbols."""
        if value is None:
            return True
        t = value.type
        return (isinstance(t, TensorType) and t.shape is not None and t.dtype in C_TYPES
                and all(free_symbols(d) <= self.known_symbols() for d in t.shape))

    def known_symbols(self) -> set[str]:
        return self.input_symbols | self.late_symbols

    def build(self) -> Program:
        for node in self.order:
            if id(node) in self.absorbed:
                continue
            step = self._classify(node)
            if step.kind == NATIVE and step.binds:
                self.steps.append(self._size_step(step))
            self.steps.append(step)
        self._set_lifetimes()
        self._mark_late_storage()
        place([s.node for s in self.steps if s.kind == NATIVE and not s.lowered.absorbed], self.slots, self.slot_of,
              self.graph.outputs, self.input_symbols)
        segments = self._segments()
        program = Program(self.graph, self.steps, self.slots, self.slot_of, self.extents, segments, "",
                          self.packs, self.input_symbols, (), self.prefix, self.branches,
                          late_symbols=frozenset(self.late_symbols),
                          late_extents=[k for k, d in enumerate(self.extents)
                                        if not free_symbols(d) <= self.input_symbols],
                          tuned_calls=self.tuned_calls)
        if not self.prefix:  # the root: its units hold every branch's code too
            programs = program.all_programs()
            program.fragments = dependency_order(
                {f for p in programs for s in p.steps if s.lowered for f in s.lowered.fragments})
            for each in programs:
                if self.profile:
                    each.add_profile_counters()
                each.target = self.target
            units = emit_units(programs, program.fragments, self._tuned_sources(program), self.target)
            program.source, *program.parts = [unit.text for unit in units]
            program.unit_kinds = [unit.kind for unit in units]
            program.unread_consts = _unread_consts(programs)
        return program

    def _build_branches(self, node: Node) -> None:
        """Programs for an If's two branches, so that the taken one runs natively."""
        pair = []
        for k, name in enumerate(("then_branch", "else_branch")):
            body = node.attrs.get(name)
            if not isinstance(body, Graph) or body.type_error is not None:
                # A branch that does not type-check has types its lowering rules cannot
                # trust: the If runs on the reference evaluator, which refuses that branch
                # if it is ever taken.
                return
            prefix = f"{self.prefix}_{self.position[id(node)]}{'te'[k]}"
            # A branch sees the late symbols bound so far as inputs: the VM passes it the
            # whole binding.
            builder = _Builder(body, prefix, _outer_reads(body), frozenset(self.known_symbols()), self.tuning)
            pair.append(builder.build())
        self.branches[id(node)] = (pair[0], pair[1])

    def _classify(self, node: Node) -> Step:
        self.current = self.position[id(node)]
        if node.type_error is not None:
            # Simplify folded its inputs into values its type rule refuses: the types it
            # kept are stale. The reference evaluator runs it and says what is wrong.
            return self._fallback(node, f"types stale ({node.type_error})")
        if node.has_subgraphs():
            step = self._fallback(node, "control flow")
            if node.op_type == "If" and node.domain in ("", "ai.onnx"):
                self._build_branches(node)
            return step
        # An optional output nobody reads may have no known shape: it is simply not written.
        unread = {id(v) for v in node.outputs if v is not None and not v.users and id(v) not in self.outputs
                  and not self.plannable(v)}
        values = [*node.inputs, *(v for v in node.outputs if id(v) not in unread)]
        rule = rule_for(node)
        late_binds: list[tuple[int, int, str]] = []
        if all(self.plannable(v) for v in node.inputs) and rule is not None:
            # Outputs sized by the data: a rule may compute those dims natively (size_code).
            for k, value in enumerate(node.outputs):
                if value is not None and id(value) not in unread and not self.plannable(value):
                    late_binds += self._late_binds(k, value)
        if not all(self.plannable(v) for v in values):
            self._forget(late_binds)
            return self._fallback(node, "shape or dtype not plannable")
        if node.op_type in VIEW_OPS and node.domain in ("", "ai.onnx") and len(node.outputs) == 1 and not late_binds \
                and node.inputs and node.inputs[0] is not None \
                and node.inputs[0].type.dtype == node.outputs[0].type.dtype:
            source = node.inputs[0]
            root = self.slots[self.slot(source)]
            root_index = root.root if root.kind == VIEW else root.index
            self._add_slot(VIEW, node.outputs[0], root=root_index)
            items = agreements(node)
            if not items:
                return Step(ALIAS, node)
            # A view whose sizes the types cannot tie to its source's (a Reshape to a target
            # computed at run time): no copy, but a step that checks them, so that a view of
            # the wrong size never reads past its source.
            ctx = self._lower_context(node, {})
            return Step(NATIVE, node, lowered=Lowered(c_checks(items, ctx.dim), can_fail=True))
        if rule is None:
            return self._fallback(node, "no lowering")
        mark = (len(self.slots), len(self.packs), len(self.tuned_calls), len(self.extents), dict(self.extent_index))
        try:
            for value in node.inputs:
                if value is not None:
                    self.slot(value)
            for value in node.outputs:
                if value is not None and id(value) not in unread:
                    self._add_slot(ARENA, value)
            late: dict[int, list[tuple[int, int]]] = {}
            for j, (k, axis, _) in enumerate(late_binds):
                late.setdefault(id(node.outputs[k]), []).append((axis, j))
            ctx = self._lower_context(node, late)
            lowered = rule(node, ctx, self._opset(node))
            if lowered is None:
                raise Unsupported("rule declined")
            if late_binds and not lowered.size_code:
                raise Unsupported("output size depends on the data")
            _guard_agreements(node, lowered, ctx)
            if lowered.absorbed:
                self._store_fused(node, lowered)
            work = -1
            if lowered.work_bytes != 0:
                work = self._add_slot(WORK, nbytes=lowered.work_bytes)
                lowered.code = lowered.code.replace("WORK", f"v[{work}]")
        except Unsupported as exc:
            self._rollback(mark, node)
            self._forget(late_binds)
            return self._fallback(node, str(exc) or "unsupported case")
        self.absorbed.update(id(n) for n in lowered.absorbed)
        if lowered.cancels:
            cancelled = {id(n) for n in lowered.cancels}
            self.steps[:] = [s for s in self.steps if id(s.node) not in cancelled]  # in place: build() is appending to it
            for dropped in lowered.cancels:
                self.slots[self.slot_of[id(dropped.outputs[0])]].kind = DEAD
        return Step(NATIVE, node, lowered, work=work, binds=late_binds)

    def _size_step(self, step: Step) -> Step:
        """The first half of a node whose output size depends on data: its size code, which
        ends a segment so that the VM can bind the dims before the rest runs."""
        dims = self._add_slot(DIMS, nbytes=8 * len(step.binds))
        code = step.lowered.size_code.replace("DIMS", f"((int64_t*)v[{dims}])")
        size_step = Step(NATIVE, step.node, Lowered(code, can_fail=step.lowered.can_fail), binds=step.binds,
                         dims=dims)
        step.binds = []
        return size_step

    def _lower_context(self, node: Node, late: dict[int, list[tuple[int, int]]]) -> LowerContext:
        """What a lowering rule (or a view's checks) of ``node`` sees of this program."""
        return LowerContext(self.slot, self.extent, self.new_packed_slot, self.packs, self._escapes,
                            self._defined_before(node), self._cancellable, late, self.tuning, self.tuned_calls)

    def _forget(self, binds: list[tuple[int, int, str]]) -> None:
        for _, _, symbol in binds:
            self.late_symbols.discard(symbol)

    def _cancellable(self, node: Node) -> bool:
        """Whether ``node`` already became a native step that a later rule may drop
        (its only output read by that rule alone)."""
        step = next((s for s in reversed(self.steps) if s.node is node), None)
        return (step is not None and step.kind == NATIVE and not step.lowered.absorbed and len(node.outputs) == 1
                and len(node.outputs[0].users) == 1 and id(node.outputs[0]) not in self.outputs)

    def _rollback(self, mark, node: Node) -> None:
        n_slots, n_packs, n_tuned, n_extents, extent_index = mark
        for slot in self.slots[n_slots:]:
            if slot.value is not None:
                self.slot_of.pop(id(slot.value), None)
        del self.slots[n_slots:]
        del self.packs[n_packs:]
        del self.tuned_calls[n_tuned:]
        del self.extents[n_extents:]
        self.extent_index = extent_index

    def _fallback(self, node: Node, reason: str) -> Step:
        step = Step(FALLBACK, node, reason=reason)
        for k, value in enumerate(node.outputs):
            if value is not None and isinstance(value.type, TensorType):
                self._add_slot(DYNAMIC, value)
                step.binds += self._late_binds(k, value)
        return step

    def _late_binds(self, k: int, value: Value) -> list[tuple[int, int, str]]:
        """(output, axis, symbol) for each dim of this fallback output that is a symbol not
        known yet: the VM binds it from the array the step returns."""
        binds = []
        # A value inference could not type (an op given inputs its rule declines, in a
        # branch never taken) binds nothing: the fallback step's array is used as it is.
        if not isinstance(value.type, TensorType) or value.type.shape is None:
            return binds
        for axis, d in enumerate(value.type.shape):
            atom = d.as_symbol() if isinstance(d, Expr) else None
            if atom is None or atom.definition is not None or atom.name in self.known_symbols():
                continue
            self.late_symbols.add(atom.name)
            binds.append((k, axis, atom.name))
        return binds

    def _escapes(self, value: Value) -> bool:
        return id(value) in self.outputs

    def _store_fused(self, node: Node, lowered: Lowered) -> None:
        """Slots for the outputs of the nodes a rule absorbed, and none for the values passed
        only between the fused nodes that the code does not name: those are never stored
        (attention's [heads, T, T] scores would otherwise take 4 arena copies)."""
        fused = {id(node), *(id(n) for n in lowered.absorbed)}

        def internal(value: Value) -> bool:
            return not self._escapes(value) and all(id(user) in fused for user, _ in value.users)

        for extra in lowered.absorbed:
            for value in extra.outputs:
                if id(value) not in self.slot_of:  # the code does not name it, else it would have one
                    self._add_slot(DEAD if internal(value) else ARENA, value)
        # The node's own outputs got storage before the rule ran.
        for value in node.outputs:
            index = self.slot_of.get(id(value)) if value is not None else None
            if index is not None and internal(value) and f"v[{index}]" not in lowered.code:
                self.slots[index].kind = DEAD

    def _defined_before(self, leader: Node):
        position = self.position[id(leader)]

        def check(value: Optional[Value]) -> bool:
            if value is None or value.const is not None or value.producer is None:
                return True
            # A producer outside this graph (an enclosing graph's) ran before it.
            return self.position.get(id(value.producer), -1) < position

        return check

    def _opset(self, node: Node) -> int:
        domain = "" if node.domain == "ai.onnx" else node.domain
        return self.graph.opset.get(domain, 1)

    # -- lifetimes and segments ----------------------------------------------------------

    def _set_lifetimes(self) -> None:
        """First and last step of every arena buffer (views keep their root alive)."""
        end = len(self.steps)
        for i, step in enumerate(self.steps):
            nodes = [step.node, *(step.lowered.absorbed if step.lowered else ())]
            for value in (step.lowered.reads if step.lowered else ()):
                self._touch(value, i)
            for node in nodes:
                for value in values_read(node):
                    self._touch(value, i)
                for value in node.outputs:
                    index = self.slot_of.get(id(value)) if value is not None else None
                    if index is not None and self.slots[index].kind == ARENA:
                        slot = self.slots[index]
                        slot.first, slot.last = i, max(slot.last, i)
                        t = value.type
                        slot.nbytes = tensor_nbytes(t)
            if step.work >= 0:
                self.slots[step.work].first = self.slots[step.work].last = i
        for value in self.graph.outputs:
            self._touch(value, end)

    def _mark_late_storage(self) -> None:
        """Buffers sized by late symbols cannot take part in the per-binding arena plan."""
        for slot in self.slots:
            if slot.kind in (ARENA, WORK) and not free_symbols(slot.nbytes) <= self.input_symbols:
                slot.kind = LATE

    def _touch(self, value: Optional[Value], i: int) -> None:
        if value is None:
            return
        index = self.slot_of.get(id(value))
        if index is None:
            return
        slot = self.slots[index]
        if slot.kind == VIEW:
            slot = self.slots[slot.root]
        if slot.kind == ARENA:
            slot.last = max(slot.last, i)

    def _tuned_sources(self, root: Program) -> list[str]:
        """The C of every tuned dispatcher the program uses, once each."""
        used = root.tuned_names()
        return [t.source() for t in (self.tuning or ()) if t.name in used]

    def _segments(self) -> list[list[int]]:
        segments: list[list[int]] = []
        current: list[int] = []
        for i, step in enumerate(self.steps):
            if step.kind == NATIVE:
                step.segment = len(segments)
                current.append(i)
                if step.binds:  # a size step: the VM binds its dims before going on
                    segments.append(current)
                    current = []
            elif step.kind == FALLBACK and current:
                segments.append(current)
                current = []
        if current:
            segments.append(current)
        return segments


def _guard_agreements(node: Node, lowered: Lowered, ctx: LowerContext) -> None:
    """Put checks of the shape agreements the types could not prove (lower/contracts.py),
    of the node and of those it absorbed, ahead of its code: ahead of its size code too, if
    it has one, since that reads the inputs first."""
    items = [a for n in (node, *lowered.absorbed) for a in agreements(n)]
    if not items:
        return
    checks = c_checks(items, ctx.dim)
    lowered.code = f"{checks}\n{lowered.code}"
    if lowered.size_code:
        lowered.size_code = f"{checks}\n{lowered.size_code}"
    lowered.can_fail = True


def _unread_consts(programs: list[Program]) -> list[Value]:
    """Constant values that no program needs as such once the packed copies exist."""
    consts: dict[int, Value] = {}
    needed: set[int] = set()
    for program in programs:
        code = "\n".join(step.lowered.code for step in program.steps if step.lowered)
        referenced = {int(index) for index in re.findall(r"\bv\[(\d+)\]", code)}
        for slot in program.slots:
            if slot.kind == CONST:
                consts[id(slot.value)] = slot.value
                if slot.index in referenced:
                    needed.add(id(slot.value))
            elif slot.kind == VIEW and slot.index in referenced and program.slots[slot.root].kind == CONST:
                needed.add(id(program.slots[slot.root].value))
        for step in program.steps:
            if step.kind == FALLBACK:
                needed.update(id(v) for v in values_read(step.node))
        needed.update(id(v) for v in program.graph.outputs)
        # A view of a constant (an Identity of a folded Range that is a graph output, a
        # fallback step's input) is read through its root's array.
        for slot in program.slots:
            if slot.kind == VIEW and id(slot.value) in needed and program.slots[slot.root].kind == CONST:
                needed.add(id(program.slots[slot.root].value))
    return [v for key, v in consts.items() if key not in needed]


def _outer_reads(body: Graph) -> list[Value]:
    """Values a subgraph reads from enclosing graphs (not constants: those get their own
    slots), in a stable order."""
    defined = {id(v) for v in body.initializers.values()} | {id(v) for v in body.inputs}
    nodes = list(body.walk_nodes())
    for node in nodes:
        defined.update(id(v) for v in node.outputs if v is not None)
    for node in nodes:
        for sub in node.subgraphs():
            defined.update(id(v) for v in sub.inputs)
            defined.update(id(v) for v in sub.initializers.values())
    outer: dict[int, Value] = {}
    for node in nodes:
        for value in node.inputs:
            if value is not None and id(value) not in defined and value.const is None:
                outer.setdefault(id(value), value)
    for value in body.outputs:
        if id(value) not in defined and value.const is None:
            outer.setdefault(id(value), value)
    return list(outer.values())


def compile_program(program: Program, cache_dir=None) -> CompiledLibrary:
    """The library of ``program`` (a root): its units and the kernel objects they call, built
    or taken from the cache (codegen/build.py)."""
    return compile_library(program.source, name_hint=f"{program.graph.name} program", cache_dir=cache_dir,
                           objects=program.objects(), flags=target_flags(program.target),
                           source_opt=program.source_opt())


def build_program(graph: Graph, tuning=None, profile: bool = False, target: Optional[Target] = None) -> Program:
    """The native program of a simplified, typed graph. ``tuning``: tuned GEMM
    dispatchers by weight shape (shapeshift/tune/records.py ``GemmTuning``), or None.
    ``profile``: time every native step (see ``Program.profiled``). ``target``: the
    target description to build for (None: this machine; shapeshift.target.named_target)."""
    from .lower.layout_assign import assign_layouts

    assign_layouts(graph, target)  # the conv trunk in NCHWc (off with SHAPESHIFT_NCHWC=0)
    program = _Builder(graph, tuning=tuning, profile=profile, target=target).build()
    fallback = program.fallback_ops()
    if fallback:
        log.info("native program for %s: %d steps, fallback ops: %s", graph.name, len(program.steps),
                 ", ".join(f"{op}×{n}" for op, n in sorted(fallback.items())))
    return program
