"""The native VM: runs a built Program on any input shapes in the declared ranges.

Per run: look up the plan of this binding of the input symbols (made once per distinct
binding: the extents table ``e[]``, the size and arena offset of every buffer), fill the
pointer table ``v[]`` with the inputs and the arena, then run the steps: each segment of
native steps is one call into the compiled library; fallback steps run their NumPy
evaluator on views of the same buffers.

Memory: every buffer a native step writes lives in one arena, reused across runs and
grown when a larger binding needs more. Offsets come from a linear scan over the steps
(a buffer is freed after its last reader; views keep their root alive). Runs of one VM
are serialized by a lock, since they share the arena.

Under the sanitizers (shapeshift/sanitize.py) the arena is fenced: every buffer gets
bytes of its own, followed by a poisoned gap, so that a kernel reading or writing past
its buffer is an AddressSanitizer report rather than a silent access to its neighbour.

Late symbols (program.py): after a fallback step that binds some, the VM reads them off
the arrays it returned, evaluates the extents that depend on them into ``e[]`` and
allocates the LATE buffers they size, before the next segment runs.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Mapping, Optional

import numpy as np

from ..codegen.build import CompiledLibrary
from ..codegen.placement import resolve as resolve_placements
from ..codegen.program import (ARENA, CONST, COUNTERS, DIMS, DYNAMIC, FALLBACK, INPUT, LATE, NATIVE, VIEW, WORK,
                               Program, compile_program)
from ..errors import ExecutionError, ShapeshiftError
from ..ir.graph import Node, Value, values_read
from ..ir.types import TensorType, to_numpy_dtype
from ..ops.context import EvalContext
from ..ops.registry import one_element_message
from ..symbolic import evaluate, free_symbols
from . import huge_pages
from .output_buffers import MIN_BYTES, OutputBuffers
from .profile import BRANCH, StepTime
from .reference import ReferenceExecutor, materialize

ALIGNMENT = huge_pages.ALIGNMENT
PLAN_CACHE_SIZE = 64
# Late sizes kept per plan (Plan.late_sizes): enough for a few hundred distinct late values.
LATE_SIZES_KEPT = 1024
#: Poisoned bytes after each buffer of a fenced arena (a multiple of ALIGNMENT): an access
#: that far past a buffer's end is caught; ASan's own heap redzones are of this order.
REDZONE = 256


@dataclass
class Plan:
    """What a run needs for one binding of the input symbols."""

    extents: np.ndarray  # int64, the e[] table
    offsets: np.ndarray  # int64 per slot: arena offset, or -1
    shapes: dict[int, tuple[int, ...]]  # slot -> concrete shape (tensor slots)
    arena_bytes: int
    extents_address: int  # of ``extents``, which lives as long as the plan
    # The pointer table a run starts from (the fixed pointers, the arena buffers and their
    # views placed at ``table_base``), made by the first run on an arena at that address.
    table: Optional[np.ndarray] = None
    table_base: int = -1
    # Arena slot -> its array view (what ``_array`` returns), made by the first run that reads
    # it on the arena ``views_arena``: an output's view costs a frombuffer and a reshape.
    views: dict = field(default_factory=dict)
    views_arena: Optional[np.ndarray] = None
    # Per graph output, what makes the copy of its arena view that run() returns, or None
    # where ``_output`` decides (made with ``views``, for programs of native steps only):
    # the lookups that find the view cost more than a small output's copy.
    output_copies: Optional[list] = None
    # Output buffers written in place (see NativeVM._direct_roots): root slot -> bytes.
    direct_bytes: dict = field(default_factory=dict)
    # A fenced arena's (offset, size) of every gap between its buffers (see _fenced_offsets).
    gaps: tuple = ()
    # (binding step, late symbols' values) -> the late extents and buffer sizes it makes
    # computable: a size step's results are the same run after run for the same input
    # shapes, and evaluating those expressions each time was most of a small model's
    # Python time (yolov8n: 11 binding steps, about 54 evaluations a run).
    late_sizes: dict = field(default_factory=dict)


class NativeVM:
    """Runs one Program; ``run(feeds, binding)`` returns the graph outputs."""

    def __init__(self, program: Program, cache_dir=None, num_threads: Optional[int] = None,
                 library: Optional[CompiledLibrary] = None):
        self.program = program
        self.library = library  # given for an If branch: it lives in its root's library
        self._segments: list = []
        self._reads: dict[int, list[Value]] = {}  # id(node) -> what its fallback step reads
        if self.library is None and program.has_code():
            self.library = compile_program(program, cache_dir)
        # Every segment call passes it: sessions of one model share its library.
        self.threads = num_threads or (openmp_default_threads(self.library.cdll) if self.library is not None else 1)
        for k in range(len(program.segments)):
            fn = getattr(self.library.cdll, program.segment_name(k))
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
            fn.restype = ctypes.c_int
            self._segments.append(fn)
        self._branches = {key: (NativeVM(then_program, library=self.library, num_threads=self.threads),
                                NativeVM(else_program, library=self.library, num_threads=self.threads))
                          for key, (then_program, else_program) in program.branches.items()}
        self._fixed = np.zeros(len(program.slots), dtype=np.uint64)  # constants and packed weights
        self._keep_alive: list[np.ndarray] = []
        self._dims: dict[int, np.ndarray] = {}  # DIMS slot -> its array
        self._load_constants()
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()
        self._symbols = sorted(program.input_symbols)
        # The binding (a copy) and plan of the last run: runs mostly repeat the last shapes,
        # and comparing the binding costs a fifth of making the plans' key.
        self._last_plan: tuple[dict, Optional[Plan]] = ({}, None)
        self._fenced = _sanitized()
        self._fenced_for: tuple = ()  # (arena, plan) whose gaps are poisoned now
        # huge_pages buffers start on a cache line (ALIGNMENT), so buffer offsets that are
        # multiples of it are aligned too. The address is kept: asking numpy costs microseconds.
        self._arena = huge_pages.empty(0)
        self._arena_base = self._arena.ctypes.data
        # The pointer table, reused by every run (runs are serialized): its address is fixed.
        self._ptrs = self._fixed.copy()
        self._ptrs_address = self._ptrs.ctypes.data
        self._lock = threading.Lock()
        self._outputs = OutputBuffers()  # where run() copies its results (recycled)
        # Outputs the kernels write straight into buffers of that pool, handed to the caller
        # as they are; this run's, root slot -> its bytes (runs hold the lock).
        self._direct_roots = _direct_output_roots(program)
        self._direct: dict[int, np.ndarray] = {}
        self._reference = ReferenceExecutor(program.graph)
        self._arena_kinds = np.array([s.kind in (ARENA, WORK) for s in program.slots], dtype=bool)
        self._view_children = _view_children(program)
        # Views of arena buffers: their pointers follow the plan's, set per run in one step.
        arena_views = [s for s in program.slots if s.kind == VIEW and program.slots[s.root].kind in (ARENA, WORK)]
        self._arena_views = np.array([s.index for s in arena_views], dtype=np.int64)
        self._arena_view_roots = np.array([s.root for s in arena_views], dtype=np.int64)
        self._node_positions = {id(n): i for i, n in enumerate(program.graph.nodes)}
        # Only native steps and no late symbol (then there is at most one segment): a run is
        # one call per segment, and the outputs are the arena's or the inputs', never env's.
        self._native_only = not program.late_symbols and all(s.kind != FALLBACK and not s.binds
                                                             for s in program.steps)
        # What a run must be fed (as an If branch: what the If's VM hands over).
        self.input_values = [s.value for s in program.slots if s.kind == INPUT]
        # What each binding step makes computable: (late extent indices, LATE slots, the
        # late symbols they read), keyed by id(step), so that a run with many late symbols
        # evaluates each thing once.
        self._late_ready = _late_ready(program)
        # Slot -> (buffer, its address, its aligned address): each LATE slot's last buffer,
        # taken again by the next run when nothing else holds it and it is large enough (so,
        # like the arena, it keeps the largest size a run needed).
        self._late_buffers: dict[int, tuple[np.ndarray, int, int]] = {}
        self._release_unread_constants()
        # Profiled programs: native steps count into this VM's COUNTERS slot (_counters), fallback steps here.
        self._fallback_times = np.zeros((len(program.steps), 2)) if program.profiled else None

    # -- load time -------------------------------------------------------------------------

    def _load_constants(self) -> None:
        self._counters: Optional[np.ndarray] = None
        for slot in self.program.slots:
            # This VM's own buffers: the dims a size step fills and the VM binds (DIMS), the
            # profiled steps' (seconds, calls) timers (COUNTERS).
            if slot.kind in (DIMS, COUNTERS):
                own = np.zeros(max(int(slot.nbytes) // 8, 1), dtype=np.int64 if slot.kind == DIMS else np.float64)
                self._keep_alive.append(own)
                self._fixed[slot.index] = own.ctypes.data
                if slot.kind == DIMS:
                    self._dims[slot.index] = own
                else:
                    self._counters = own.reshape(-1, 2)
        unread = {id(v) for v in self.program.unread_consts}
        for slot in self.program.slots:
            if slot.kind == CONST and id(slot.value) not in unread:
                # Read where it lies, on a cache line or not: an aligned copy of the constants
                # off a line (huge_pages.aligned) made no model measurably faster and raised the
                # process's peak memory by about their size (ResNet-50: max RSS 611 -> 683 MB
                # with ordinary pages, 694 with huge pages; the originals freed, not returned).
                array = np.asarray(slot.value.const, order="C")
                self._keep_alive.append(array)
                self._fixed[slot.index] = array.ctypes.data
        for view in self.program.slots:
            if view.kind == VIEW and self.program.slots[view.root].kind == CONST:
                self._fixed[view.index] = self._fixed[view.root]
        if self.program.packs:
            lib = self.library.cdll
            for pack in self.program.packs:
                if pack.source is None:
                    raise ShapeshiftError("this program's weights were released by the VM that loaded it; "
                                          "build the program again for another VM")
                size_of, pack_b = _packing_functions(lib, pack.prefix)
                k, n = pack.source.shape
                packed = huge_pages.empty(max(int(size_of(k, n)), 1), np.float32)
                pack_b(k, n, pack.source.ctypes.data, n, 1, packed.ctypes.data)
                self._keep_alive.append(packed)
                self._fixed[pack.slot] = packed.ctypes.data

    def _release_unread_constants(self) -> None:
        """Drop the weights that only packed copies are read through (about half the
        memory of a transformer's session): the pack requests' sources and the graph's
        own reference. The program is then good for this VM only."""
        if not self.program.unread_consts:
            return
        for program in self.program.all_programs():
            for pack in program.packs:
                pack.source = pack.origin = None
        for value in self.program.unread_consts:
            value.const = None

    # -- plans -----------------------------------------------------------------------------

    def _plan(self, binding: Mapping[str, int]) -> Plan:
        last_binding, plan = self._last_plan
        if plan is not None and binding == last_binding:  # already the most recent in _plans
            return plan
        key = tuple(binding.get(s, 0) for s in self._symbols)
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
        else:
            plan = self._make_plan(binding)
            self._plans[key] = plan
            if len(self._plans) > PLAN_CACHE_SIZE:
                self._plans.popitem(last=False)
        self._last_plan = (dict(binding), plan)
        return plan

    def _make_plan(self, binding: Mapping[str, int]) -> Plan:
        program = self.program
        late = set(program.late_extents)  # evaluated per run, once their symbols are bound
        try:
            values = [0 if k in late else evaluate(d, binding) for k, d in enumerate(program.extents)]
        except ShapeshiftError as exc:
            raise ExecutionError(f"cannot evaluate the program's extents: {exc}") from None
        try:
            extents = np.array(values or [0], dtype=np.int64)
        except OverflowError:
            # A constant parameter near int64's limit (a Pad of 2**63 - 1) sums past it: no
            # buffer could have that extent, and the kernels' int64 arguments cannot hold it.
            huge = next(v for v in values if not -(1 << 63) <= v < 1 << 63)
            raise ExecutionError(f"an extent of the program would be {huge} for {_binding_text(binding)}: "
                                 "past the 64-bit range") from None
        shapes: dict[int, tuple[int, ...]] = {}
        for slot in program.slots:
            if slot.value is not None and isinstance(slot.value.type, TensorType) \
                    and slot.value.type.shape is not None and slot.kind != DYNAMIC:
                try:
                    shape = tuple(evaluate(d, binding) for d in slot.value.type.shape)
                except ShapeshiftError:
                    continue
                if any(d < 0 for d in shape):
                    # A type rule let a dim go negative for these inputs: no kernel may see
                    # a negative extent (it sized buffers that overlapped, and wrote far).
                    raise ExecutionError(f"{slot.value.name!r} would have shape {list(shape)} for "
                                         f"{_binding_text(binding)}: a dimension is negative")
                shapes[slot.index] = shape
        gaps: tuple = ()
        try:
            if self._fenced:
                offsets, total, gaps = _fenced_offsets(program, binding)
            else:
                offsets, total = _assign_offsets(program, binding)
        except OverflowError:
            # Buffers whose bytes pass int64 (a Conv padded by 2**31 - 1 on each side): no
            # arena could hold them, and the offsets' int64 array cannot say where they go.
            raise ExecutionError(f"the buffers of a run for {_binding_text(binding)} would pass the 64-bit range "
                                 "of bytes") from None
        direct = {}
        for index in self._direct_roots:
            try:
                nbytes = evaluate(program.slots[index].nbytes, binding)
            except ShapeshiftError:  # sized by a late symbol: copied out as before
                continue
            if nbytes >= MIN_BYTES:
                direct[index] = nbytes
        return Plan(extents, offsets, shapes, total, extents.ctypes.data, direct_bytes=direct, gaps=gaps)

    # -- runs ------------------------------------------------------------------------------

    def run(self, feeds: dict[Value, Any], binding: Mapping[str, int]) -> list:
        with self._lock:
            return self._run(feeds, binding)

    def _run(self, feeds: dict[Value, Any], binding: Mapping[str, int]) -> list:
        program = self.program
        plan = self._plan(binding)
        self._outputs.start_run()
        if program.late_symbols:
            binding = dict(binding)  # grows with the late symbols as they are bound
        if self._arena.nbytes < plan.arena_bytes:
            self._arena = _allocate(plan.arena_bytes, f"this run ({_binding_text(binding)}) needs", "of buffers")
            self._arena_base = self._arena.ctypes.data
        base = self._arena_base
        if self._fenced and not (self._fenced_for and self._fenced_for[0] is self._arena
                                 and self._fenced_for[1] is plan):
            self._fence(plan)
        if plan.table_base != base:
            table = self._fixed.copy()
            table[self._arena_kinds] = (plan.offsets[self._arena_kinds] + base).astype(np.uint64)
            table[self._arena_views] = table[self._arena_view_roots]
            plan.table, plan.table_base = table, base
        ptrs = self._ptrs
        # One copy (a slice assignment: np.copyto's call costs more): a small model's run is
        # mostly such fixed costs.
        ptrs[:] = plan.table
        self._direct = {}
        for index, nbytes in plan.direct_bytes.items():
            buffer = self._outputs.aligned(nbytes, ALIGNMENT)
            self._direct[index] = buffer
            address = _address(buffer)
            ptrs[index] = address
            self._set_views(ptrs, index, address)
        arrays: dict[int, Any] = {}  # slot -> array, for inputs and fallback results
        slot_of, view_children = program.slot_of, self._view_children
        for value, data in feeds.items():
            index = slot_of.get(id(value))
            if index is None or not isinstance(data, np.ndarray):
                continue
            data = np.asarray(data, order="C")
            arrays[index] = data
            address = _address(data)  # asked once: each .ctypes builds an object (~1.5 us)
            ptrs[index] = address
            if index in view_children:
                self._set_views(ptrs, index, address)
        ptr_address, threads = self._ptrs_address, self.threads
        extents_address = plan.extents_address
        steps = program.steps
        if self._native_only:
            for segment in self._segments:
                code = segment(ptr_address, extents_address, threads)
                if code:
                    raise ExecutionError(_rejection(steps[code - 1], binding))
            return [self._output(value, feeds, arrays, plan, binding) if copy is None else copy()
                    for value, copy in zip(program.graph.outputs, self._output_copies(plan))]
        env: dict[Value, Any] = dict(feeds)
        i = 0
        while i < len(steps):
            step = steps[i]
            if step.kind == NATIVE:
                indices = program.segments[step.segment]
                code = self._segments[step.segment](ptr_address, extents_address, threads)
                if code:
                    raise ExecutionError(_rejection(steps[code - 1], binding))
                last = steps[indices[-1]]
                if last.binds:  # a size step: bind what it computed before going on
                    dims = self._dims[last.dims]
                    self._bind_late(last, [int(dims[j]) for j in range(len(last.binds))], binding, plan,
                                    arrays, ptrs)
                i = indices[-1] + 1
                continue
            if step.kind == FALLBACK:
                if self._fallback_times is None:
                    self._run_fallback(step, env, arrays, ptrs, plan, binding)
                else:
                    started = time.perf_counter()
                    self._run_fallback(step, env, arrays, ptrs, plan, binding)
                    self._fallback_times[i] += (time.perf_counter() - started, 1)
            i += 1
        return [self._output(v, env, arrays, plan, binding) for v in program.graph.outputs]

    def _output_copies(self, plan: Plan) -> list:
        """``plan.output_copies``, made on the first run of the plan on this arena: what
        ``_output`` would do with each output kept in the arena and not written in place."""
        if plan.views_arena is not self._arena:  # a new arena: the views made on the last one are stale
            plan.views, plan.views_arena, plan.output_copies = {}, self._arena, None
        if plan.output_copies is None:
            program = self.program
            copies = []
            for value in program.graph.outputs:
                index = program.slot_of.get(id(value))
                slot = program.slots[index] if index is not None else None
                root = slot.root if slot is not None and slot.kind == VIEW else index
                if slot is None or program.slots[root].kind not in (ARENA, WORK) or root in plan.direct_bytes \
                        or index not in plan.shapes:
                    copies.append(None)
                    continue
                view = self._array(value, {}, {}, plan, {})
                # OutputBuffers.copy, less its call: a small output is a plain copy.
                copies.append(view.copy if view.nbytes < MIN_BYTES else partial(self._outputs.copy, view))
            plan.output_copies = copies
        return plan.output_copies

    def _fence(self, plan: Plan) -> None:
        """Poison the gaps of ``plan`` in the arena, and the arena's slack around them, after
        lifting the last plan's (its gaps may be this plan's buffers)."""
        from ..sanitize import poison, unpoison

        base = self._arena_base
        if not (self._fenced_for and self._fenced_for[0] is self._arena):
            # Lifted before numpy frees the arena (an array's weak references are cleared
            # before its data goes): numpy keeps small blocks in a cache of its own and
            # hands them to later arrays without malloc, which would find them poisoned.
            weakref.finalize(self._arena, unpoison, base, self._arena.nbytes)
        unpoison(base, self._arena.nbytes)
        for offset, size in plan.gaps:
            poison(base + offset, size)
        poison(base + plan.arena_bytes, self._arena.nbytes - plan.arena_bytes)
        self._fenced_for = (self._arena, plan)

    # -- profiling ---------------------------------------------------------------------------

    def profile(self, reset: bool = False) -> list[StepTime]:
        """Time and calls of every step run so far (this program's, then each If's
        branches' after the If), when the program was built with ``profile=True``."""
        if not self.program.profiled:
            raise ShapeshiftError("this program was built without profile=True: it has no step timers")
        with self._lock:
            rows = []
            for i, step in enumerate(self.program.steps):
                node = step.node
                kind = BRANCH if id(node) in self._branches else step.kind
                table = self._counters if step.kind == NATIVE else self._fallback_times
                seconds, calls = table[i] if table is not None else (0.0, 0)
                label = node.name or next((v.name for v in node.outputs if v is not None), "")
                rows.append(StepTime(self.program.prefix, i, node.op_type, label, kind, int(calls), float(seconds)))
                for branch in self._branches.get(id(node), ()):
                    rows.extend(branch.profile(reset))
            if reset:
                if self._counters is not None:
                    self._counters[:] = 0
                self._fallback_times[:] = 0
        return rows

    def _set_views(self, ptrs: np.ndarray, root: int, address: int) -> None:
        for child in self._view_children.get(root, ()):
            ptrs[child] = address

    def _array(self, value: Value, env: dict, arrays: dict, plan: Plan, binding: Mapping[str, int]) -> Any:
        """The value's contents as an array (a view of the arena where it lives there)."""
        if value in env:
            return env[value]
        program = self.program
        index = program.slot_of.get(id(value))
        if index is None:
            return value.const
        slot = program.slots[index]
        root = program.slots[slot.root] if slot.kind == VIEW else slot
        shape = plan.shapes.get(index)
        if shape is None and program.late_symbols and value.type.shape is not None:
            shape = tuple(evaluate(d, binding) for d in value.type.shape)
        dtype = to_numpy_dtype(value.type.dtype)
        if root.kind == LATE:
            return np.frombuffer(arrays[root.index], dtype=dtype, count=math.prod(shape)).reshape(shape)
        direct = self._direct.get(root.index)
        if direct is not None:
            return np.frombuffer(direct, dtype=dtype, count=math.prod(shape)).reshape(shape)
        if root.kind in (CONST, INPUT, DYNAMIC):
            data = np.asarray(root.value.const) if root.kind == CONST else arrays[root.index]
            return data if shape is None else data.reshape(shape)
        if plan.views_arena is not self._arena:  # a new arena: the views made on the last one are stale
            plan.views, plan.views_arena, plan.output_copies = {}, self._arena, None
        view = plan.views.get(index)
        if view is None:
            offset = int(plan.offsets[root.index])
            view = np.frombuffer(self._arena, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)
            if not program.late_symbols:  # a late symbol's value may differ from run to run
                plan.views[index] = view
        return view

    def _run_fallback(self, step, env: dict, arrays: dict, ptrs: np.ndarray, plan: Plan,
                      binding: Mapping[str, int]) -> None:
        node = step.node
        branches = self._branches.get(id(node))
        for value in self._reads_of(node, branches):
            if value not in env:
                env[value] = self._array(value, env, arrays, plan, binding)
        if branches is not None:
            results = self._run_branch(node, branches, env, binding)
        else:
            results = self._evaluate(node, env, binding)
        if step.binds:
            self._bind_late(step, self._result_dims(step, results), binding, plan, arrays, ptrs)
        for value, result in zip(node.outputs, results):
            if value is None:
                continue
            if isinstance(result, np.ndarray) and np.may_share_memory(result, self._arena):
                # A view of an input's buffer in the arena (NumPy's Reshape, Transpose, Slice
                # and the like return views): the plan frees that buffer after its last
                # reader, this step, and a later step's output may then be written over it
                # while this result is still read. A copy is this step's own.
                result = result.copy()
            index = self.program.slot_of.get(id(value))
            if index is not None and isinstance(result, np.ndarray):
                expected = plan.shapes.get(index)
                if expected is None and self.program.late_symbols and value.type.shape is not None:
                    expected = tuple(evaluate(d, binding) for d in value.type.shape)
                result = self._checked(node, value, result, expected)
                arrays[index] = result
                address = _address(result)
                ptrs[index] = address
                self._set_views(ptrs, index, address)
            env[value] = result

    @staticmethod
    def _result_dims(step, results: list) -> list[int]:
        """The late dims a fallback step binds, read off the arrays it returned."""
        dims = []
        for k, axis, symbol in step.binds:
            result = results[k] if k < len(results) else None
            if not isinstance(result, np.ndarray) or result.ndim <= axis:
                raise ExecutionError(f"{step.node.describe()}: output {k} has no axis {axis} to give {symbol!r} "
                                     "its value")
            dims.append(int(result.shape[axis]))
        return dims

    def _bind_late(self, step, dims: list[int], binding: dict, plan: Plan, arrays: dict, ptrs: np.ndarray) -> None:
        """Bind the step's late symbols to ``dims``, then evaluate the extents and allocate
        the LATE buffers that have become computable."""
        for (k, axis, symbol), value in zip(step.binds, dims):
            if value < 0:
                raise ExecutionError(f"{step.node.describe()}: computed a negative size {value} for output {k}")
            binding[symbol] = value
        program = self.program
        extents, slots, names = self._late_ready.get(id(step), ((), (), ()))
        key = (id(step), *[binding[name] for name in names])
        sizes = plan.late_sizes.get(key)
        if sizes is None:
            sizes = ([evaluate(program.extents[index], binding) for index in extents],
                     [max(evaluate(slot.nbytes, binding), 1) for slot in slots])
            if len(plan.late_sizes) < LATE_SIZES_KEPT:  # late values that vary every run fill it once
                plan.late_sizes[key] = sizes
        if any(n >= 1 << 62 for n in (*sizes[0], *sizes[1])):  # past int64 (and any memory)
            raise ExecutionError(f"{step.node.describe()}: its output would hold {max((*sizes[0], *sizes[1]))} "
                                 "elements or bytes, more than any machine can address")
        for index, extent in zip(extents, sizes[0]):
            plan.extents[index] = extent
        for slot, nbytes in zip(slots, sizes[1]):
            entry = self._late_buffers.get(slot.index)
            # (buffer, its address): reused when large enough and held by nothing but this
            # entry (getrefcount counts the tuple and its own argument):
            # a returned output, or any view of one, holds it, and then it is left to its
            # holder. Never under the sanitizer, whose runs must each see fresh memory. The
            # addresses are kept because asking numpy for one costs microseconds.
            if entry is None or entry[0].nbytes < nbytes or sys.getrefcount(entry[0]) > 2 or self._fenced:
                buffer = _allocate(nbytes, f"{step.node.describe()}: its output needs")
                entry = (buffer, buffer.ctypes.data)
                self._late_buffers[slot.index] = entry
            buffer, address = entry
            arrays[slot.index] = buffer
            ptrs[slot.index] = address
            self._set_views(ptrs, slot.index, address)

    def _evaluate(self, node: Node, env: dict, binding: Mapping[str, int]) -> list:
        """The node's outputs from its NumPy evaluator (subgraphs run by the reference executor)."""
        args = [None if v is None else env[v] for v in node.inputs]
        for index, param in node.params.items():
            args[index] = materialize(param, binding, node)
        reference = self._reference
        reference._binding = dict(binding)
        opset = self.program.graph.opset.get("" if node.domain == "ai.onnx" else node.domain, 1)
        ctx = EvalContext(node, opset, lambda g, ins: reference._run_subgraph(env, g, ins))
        rule = reference._plan(self.program.graph).steps[self._node_positions[id(node)]][1]
        try:
            return rule.evaluate(ctx, *args)
        except ShapeshiftError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported with the node's name
            raise ExecutionError(f"{node.describe()} failed: {type(exc).__name__}: {exc}") from exc

    def _reads_of(self, node: Node, branches: Optional[tuple]) -> list[Value]:
        """What a fallback step needs in ``env``, once per node: everything it reads, or,
        for an If whose branches are programs, its condition and the branch programs'
        inputs (not every value inside the branches: for silero_vad that walk cost more
        than the branch's native compute)."""
        reads = self._reads.get(id(node))
        if reads is None:
            if branches is None:
                reads = values_read(node)
            else:
                inputs = {id(s.value): s.value for vm in branches for s in vm.program.slots if s.kind == INPUT}
                reads = [node.inputs[0], *inputs.values()]
            self._reads[id(node)] = reads
        return reads

    def _run_branch(self, node: Node, branches: tuple, env: dict, binding: Mapping[str, int]) -> list:
        """An If whose branches are programs: run the taken one natively."""
        cond = np.asarray(env[node.inputs[0]])
        if cond.size != 1:
            raise ExecutionError(f"{node.describe()}: {one_element_message(0, node.inputs[0].name)}, got {cond.size}")
        branch = branches[0] if bool(cond.reshape(-1)[0]) else branches[1]
        return branch.run({value: env[value] for value in branch.input_values}, binding)

    def _checked(self, node: Node, value: Value, result: np.ndarray, expected) -> np.ndarray:
        """The fallback result as native kernels may read it: contiguous, of the declared
        dtype and shape (a mismatch would make a kernel read out of bounds)."""
        dtype = to_numpy_dtype(value.type.dtype)
        if result.dtype != dtype:
            raise ExecutionError(f"{node.describe()}: output {value.name!r} has dtype {result.dtype}, "
                                 f"expected {dtype}")
        if expected is not None and tuple(result.shape) != expected:
            raise ExecutionError(f"{node.describe()}: output {value.name!r} has shape {list(result.shape)}, "
                                 f"expected {list(expected)}")
        return np.asarray(result, order="C")  # not ascontiguousarray: it makes a 0-d array 1-d

    def _output(self, value: Value, env: dict, arrays: dict, plan: Plan, binding: Mapping[str, int]) -> Any:
        result = self._array(value, env, arrays, plan, binding)
        if not isinstance(result, np.ndarray):
            return result
        index = self.program.slot_of.get(id(value))
        slot = self.program.slots[index] if index is not None else None
        if slot is not None and value not in env and (slot.root if slot.kind == VIEW else index) in self._direct:
            return result  # written in place into a buffer of the pool: the caller's now
        return self._outputs.copy(result)


_DEFAULT_THREADS: list[int] = []  # OpenMP's default team size, once asked


def openmp_default_threads(cdll) -> int:
    """The team OpenMP gives a region when no count is set: the count a new thread starts with
    (OMP_NUM_THREADS as the runtime read it when it loaded, else every CPU the process may
    use), asked of ``cdll``'s OpenMP in a new thread, since a thread keeps the count last set
    in it. A session made without num_threads passes it to its segments rather than run on
    whatever count another session left in the calling thread. Asked once per process: the
    runtime reads its environment once."""
    if not _DEFAULT_THREADS:
        got: list[int] = []
        thread = threading.Thread(target=lambda: got.append(int(cdll.omp_get_max_threads())))
        thread.start()
        thread.join()
        _DEFAULT_THREADS.append(max(1, got[0]) if got else 1)
    return _DEFAULT_THREADS[0]


def _rejection(step, binding: Mapping[str, int]) -> str:
    """Why a step's code failed: the first of its shape agreements (codegen/lower/contracts.py)
    that the bound dims break, with their values; else what its kernel checks itself."""
    from ..codegen.lower.contracts import agreements

    nodes = (step.node, *(step.lowered.absorbed if step.lowered is not None else ()))
    for node in nodes:
        for agreement in agreements(node):
            try:
                lhs, rhs = evaluate(agreement.lhs, binding), evaluate(agreement.rhs, binding)
            except Exception:  # noqa: BLE001 - a dim not bound yet: this one cannot be told
                continue
            if not agreement.holds(lhs, rhs):
                return f"{node.describe()}: {agreement.what} (got {lhs} and {rhs})"
    if step.lowered is not None and step.lowered.rejects:
        return f"{step.node.describe()}: {step.lowered.rejects}"
    return (f"{step.node.describe()}: its kernel rejected the inputs "
            "(an index out of range, a size that is negative or not a number, or shapes that do not broadcast)")


def _packing_functions(lib, prefix: str):
    """``<prefix>packed_b_size`` and ``<prefix>pack_b`` of the library, typed: the default
    GEMM's (``ss_gemm_``) or a tuned dispatcher's."""
    size_of = getattr(lib, f"{prefix}packed_b_size")
    size_of.restype = ctypes.c_int64
    size_of.argtypes = [ctypes.c_int64, ctypes.c_int64]
    pack_b = getattr(lib, f"{prefix}pack_b")
    pack_b.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                       ctypes.c_void_p]
    return size_of, pack_b


def _late_ready(program: Program) -> dict[int, tuple[list[int], list, tuple[str, ...]]]:
    """For each step that binds late symbols: the late extents and LATE slots whose last
    late symbol it binds (so they can be evaluated right after it), and the late symbols
    those sizes read (what Plan.late_sizes keys them by: a key over every late symbol of
    the program cost SSDlite's 181 bindings a run 181 lookups each)."""
    bound_by: dict[str, int] = {}
    steps = {}
    for position, step in enumerate(program.steps):
        for _, _, symbol in step.binds:
            bound_by.setdefault(symbol, position)
            steps[position] = step
    ready: dict[int, tuple[list[int], list, set]] = {}

    def add(dim, item, which: int) -> None:
        late = {s for s in free_symbols(dim) if s in bound_by}
        if late:
            entry = ready.setdefault(id(steps[max(bound_by[s] for s in late)]), ([], [], set()))
            entry[which].append(item)
            entry[2].update(late)

    for index in program.late_extents:
        add(program.extents[index], index, 0)
    for slot in program.slots:
        if slot.kind == LATE:
            add(slot.nbytes, slot, 1)
    return {key: (extents, slots, tuple(sorted(names))) for key, (extents, slots, names) in ready.items()}


_from_buffer, _addressof = ctypes.c_char.from_buffer, ctypes.addressof


def _address(array: np.ndarray) -> int:
    """The data address of a C-contiguous array. ``ndarray.ctypes`` builds an object per
    call (about 2 us, paid per input and per fallback result at every run); a ctypes view
    of the buffer costs a third of that. Read-only and empty arrays, which it refuses,
    take the slow way."""
    try:
        return _addressof(_from_buffer(array))
    except (TypeError, ValueError, BufferError):
        return array.ctypes.data


def _direct_output_roots(program: Program) -> list[int]:
    """The arena buffers that native kernels can write straight into the memory run()
    returns: each graph output's own buffer (or the one it views), when a native step
    makes it and no other output shares it. The copy out of the arena was most of a GPT-2
    decoding step at batch 4: 24 key/value outputs of 0.5 MB each. (The buffer keeps its
    arena block, unused, so the plan does not depend on which outputs are taken.)"""
    from_fallback = {id(v) for step in program.steps if step.kind == FALLBACK for v in step.node.outputs if v}
    outputs: dict[int, int] = {}  # root slot -> outputs read from it
    unfit: set[int] = set()
    for value in program.graph.outputs:
        index = program.slot_of.get(id(value))
        if index is None:
            continue
        slot = program.slots[index]
        root = program.slots[slot.root] if slot.kind == VIEW else slot
        outputs[root.index] = outputs.get(root.index, 0) + 1
        if root.kind != ARENA or root.value is None or id(root.value) in from_fallback \
                or not isinstance(value.type, TensorType) or to_numpy_dtype(value.type.dtype).hasobject:
            unfit.add(root.index)
    return [index for index, count in outputs.items() if count == 1 and index not in unfit]


def _view_children(program: Program) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for slot in program.slots:
        if slot.kind == VIEW:
            children.setdefault(slot.root, []).append(slot.index)
    return children


def _assign_offsets(program: Program, binding: Mapping[str, int]) -> tuple[np.ndarray, int]:
    """Arena offsets by a linear scan in step order: a buffer takes the best-fitting free
    block (or the end of the arena) at its first step and returns it after its last. A
    buffer placed inside another under this binding (codegen/placement.py) takes none: its
    host lives from the first step either is written to the last either is read."""
    offsets = np.full(len(program.slots), -1, dtype=np.int64)
    placed = resolve_placements(program.slots, binding)
    lifetime = {s.index: (s.first, s.last) for s in program.slots if s.kind in (ARENA, WORK)}
    for index, (host, _) in placed.items():
        (first, last), (host_first, host_last) = lifetime[index], lifetime[host]
        lifetime[host] = (min(first, host_first), max(last, host_last))
    buffers = [s for s in program.slots if s.kind in (ARENA, WORK) and s.index not in placed]
    starts: dict[int, list] = {}
    ends: dict[int, list] = {}
    for slot in buffers:
        size = evaluate(slot.nbytes, binding)
        size = max((size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT, ALIGNMENT)
        first, last = lifetime[slot.index]
        starts.setdefault(first, []).append((slot, size))
        ends.setdefault(last, []).append(slot)
    free: list[tuple[int, int]] = []  # (offset, size), kept sorted by offset
    total = 0
    sizes: dict[int, int] = {}
    for step in range(len(program.steps) + 1):
        for slot, size in starts.get(step, ()):
            best = None
            for j, (offset, block) in enumerate(free):
                if block >= size and (best is None or block < free[best][1]):
                    best = j
            if best is None:
                offsets[slot.index] = total
                total += size
            else:
                offset, block = free.pop(best)
                offsets[slot.index] = offset
                if block > size:
                    free.append((offset + size, block - size))
            sizes[slot.index] = size
        for slot in ends.get(step, ()):
            free.append((int(offsets[slot.index]), sizes[slot.index]))
            free = _merge(free)
    for index, (host, offset) in placed.items():
        offsets[index] = offsets[host] + offset
    return offsets, total


def _binding_text(binding: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(binding.items())) or "these inputs"


def _allocate(nbytes: int, what: str, kind: str = "") -> np.ndarray:
    """``nbytes`` bytes, or an ExecutionError "<what> <nbytes> bytes <kind>, more than ...":
    more than the machine's memory is refused before numpy is asked (with overcommit the
    pages are handed out, and the process is killed for memory when it touches them), and a
    MemoryError is told as such."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # nothing to compare with
        physical = None
    told = f"{what} {nbytes} bytes{' ' + kind if kind else ''}"
    if physical is not None and nbytes > physical:
        raise ExecutionError(f"{told}, more than this machine's memory ({physical} bytes)")
    try:
        return huge_pages.empty(nbytes)
    except MemoryError:
        raise ExecutionError(f"{told}, more than this machine can allocate") from None


def _fenced_offsets(program: Program, binding: Mapping[str, int]) -> tuple[np.ndarray, int, tuple]:
    """Arena offsets for a sanitized run: no buffer reuses another's bytes, and each is
    followed by a gap of at least REDZONE bytes (from its exact end to the next aligned
    buffer) that the VM poisons; returns the offsets, the arena size and the gaps."""
    offsets = np.full(len(program.slots), -1, dtype=np.int64)
    placed = resolve_placements(program.slots, binding)
    gaps = []
    total = 0
    for slot in program.slots:
        if slot.kind in (ARENA, WORK) and slot.index not in placed:
            size = evaluate(slot.nbytes, binding)
            offsets[slot.index] = total
            end = total + size
            total = (end + REDZONE + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
            gaps.append((end, total - end))
    for index, (host, offset) in placed.items():
        offsets[index] = offsets[host] + offset
    return offsets, total, tuple(gaps)


def _sanitized() -> bool:
    """Whether this process runs sanitized libraries (codegen/build.py ``sanitizing``) with
    the ASan runtime loaded, so that the arena can be fenced."""
    from ..codegen.build import sanitizing
    from ..sanitize import runtime_loaded

    return sanitizing() and runtime_loaded()


def _merge(blocks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    blocks.sort()
    merged: list[tuple[int, int]] = []
    for offset, size in blocks:
        if merged and merged[-1][0] + merged[-1][1] == offset:
            merged[-1] = (merged[-1][0], merged[-1][1] + size)
        else:
            merged.append((offset, size))
    return merged
