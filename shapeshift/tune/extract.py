"""The tuning tasks of a whole model: its GEMMs with a constant weight, grouped by shape
(or all of them as one group: ``group_task``, tune/gemm_group.py), and its batched GEMMs
(attention's Q K^T and P V), grouped by structure.

The native backend runs a MatMul whose right operand is a constant 2-D float32 matrix, and a
Gemm with a constant B, as one prepacked GEMM whose M is the product of the left operand's
other dims (codegen/lower/linalg.py); those are the calls a tuning record replaces. Each
distinct weight shape [K, N] is one task: its M range is the union of the ranges of every
call's M under the declared dims (``bounds`` of the symbolic product), and its weight in the
model is how many calls it makes per run. The model is simplified first, exactly as the
native backend does, so the shapes are those the lowering sees.

Batched GEMMs (no constant operand) are found by lowering the model once with a recorder in
place of tuning records: the lowering asks it about every ``ss_gemm`` call it emits, with
the call's symbolic sizes and strides, so a task's key is exactly what a record is later
looked up by. Those whose sizes depend on one dim T (workload.batched_workload) are tasks.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Mapping, Optional

import numpy as np

from ..frontend.onnx_import import ModelSource, import_model
from ..ir.graph import Graph, Node, Value
from ..ir.types import FLOAT, TensorType
from ..ops.common import product
from ..passes.simplify import simplify_graph
from ..symbolic import Dim, Expr, bounds, evaluate, free_symbols
from .conv_workload import ConvWorkload, NchwcConvWorkload, conv_instance
from .gemm_group import GemmGroupWorkload
from .task import InstanceRange
from .workload import DEFAULT_SAMPLES, BatchedGemmWorkload, GemmWorkload, batched_workload, poly_str, uniform_samples

log = logging.getLogger(__name__)


@dataclass
class ModelTask:
    """One weight shape of the model, and every call of it."""

    k: int
    n: int
    lo: int  # the range of M over all its calls
    hi: int
    calls: int = 0  # per model run
    nodes: list[str] = field(default_factory=list)
    symbols: set[str] = field(default_factory=set)  # the dims M is made of
    rows: list = field(default_factory=list)  # M of each call, as a symbolic Dim

    def weighted_ms(self, symbol: str, histogram: Mapping[int, float],
                    fixed: Optional[Mapping[str, int]] = None) -> dict[int, float]:
        """M -> summed weight over the calls whose M depends on ``symbol`` alone (besides
        the dims in ``fixed``, declared with one value), for a histogram of that symbol's
        values (Ms outside the range dropped)."""
        fixed = dict(fixed or {})
        out: dict[int, float] = {}
        for m in self.rows:
            if free_symbols(m) - set(fixed) != {symbol}:
                continue
            for value, weight in histogram.items():
                rows = evaluate(m, {**fixed, symbol: value})
                if self.lo <= rows <= self.hi:
                    out[rows] = out.get(rows, 0.0) + weight
        return out

    @property
    def label(self) -> str:
        return f"[{self.k}, {self.n}]"

    def workload(self, cold: bool = True) -> GemmWorkload:
        """Cold by default: a model's weights stream from DRAM, call after call."""
        return GemmWorkload(self.k, self.n, self.lo, self.hi, cold)

    def range_flops(self) -> float:
        """FLOPs of the calls at every M of the range, summed: the task's share of the work."""
        return self.calls * self.workload().range_flops()


@dataclass
class BatchedTask:
    """One batched GEMM structure of the model, and every call of it (a task like ModelTask)."""

    workload_: BatchedGemmWorkload
    symbol: str  # T
    calls: int = 0

    @property
    def lo(self) -> int:
        return self.workload_.lo

    @property
    def hi(self) -> int:
        return self.workload_.hi

    @property
    def symbols(self) -> set[str]:
        return {self.symbol}

    @property
    def label(self) -> str:
        w = self.workload_
        return f"{w.batch} x [{poly_str(w.m)}, {poly_str(w.k)}] x [{poly_str(w.k)}, {poly_str(w.n)}]"

    def weighted_ms(self, symbol: str, histogram: Mapping[int, float],
                    fixed: Optional[Mapping[str, int]] = None) -> dict[int, float]:
        """T -> weight, when T is ``symbol``; else empty (uniform samples)."""
        if symbol != self.symbol:
            return {}
        return {t: w * self.calls for t, w in histogram.items() if self.lo <= t <= self.hi}

    def workload(self, cold: bool = True) -> BatchedGemmWorkload:
        """Whatever ``cold`` says: both operands were just computed, so they are in cache."""
        return self.workload_

    def range_flops(self) -> float:
        return self.calls * self.workload_.range_flops()


class _InstanceTask(InstanceRange):
    """A model's task over instances (its workload's values 1..N, tune/task.py's
    InstanceValues), each weighing its calls per run: ``instances`` maps instance -> calls,
    ``workload(cold)`` makes the task."""

    instances: dict

    def sample_weights(self) -> tuple[list[int], list[float]]:
        """Every instance and its calls per run (what the kernel set is chosen by)."""
        w = self.workload()
        return w.sampled_ms(), [self.instances[w.instance(v)] for v in w.sampled_ms()]

    def weighted_ms(self, symbol: str, histogram: Mapping[int, float],
                    fixed: Optional[Mapping[str, int]] = None) -> dict[int, float]:
        return {}  # the instances' own weights (``sample_weights``) serve

    def range_flops(self) -> float:
        w = self.workload()
        return float(sum(w.flops(v) * self.instances[w.instance(v)] for v in w.sampled_ms()))


@dataclass
class GroupTask(_InstanceTask):
    """Every dense GEMM of the model as one task (tune/gemm_group.py): an instance per
    (M, K, N) a call makes, weighted by its calls per run; a call whose M is dynamic gives an
    instance at each of ``samples`` values of its range."""

    instances: dict[tuple[int, int, int], float]  # (M, K, N) -> calls per run
    nodes: list[str] = field(default_factory=list)
    symbols: set[str] = field(default_factory=set)

    @property
    def calls(self) -> int:
        return len(self.nodes)

    @property
    def label(self) -> str:
        weights = {(k, n) for _, k, n in self.instances}
        return f"group: {len(weights)} weight shape(s), {len(self.instances)} instance(s)"

    def workload(self, cold: bool = True) -> GemmGroupWorkload:
        """Cold by default, as a weight shape's task."""
        return GemmGroupWorkload.of(self.instances, cold)



def group_task(tasks: list[ModelTask], samples: int = DEFAULT_SAMPLES) -> Optional[GroupTask]:
    """The weight shapes' tasks as one group (None without any): a static call's M is one
    instance; a dynamic one's range gives ``samples`` uniform instances, each weighing its
    share of the call."""
    group = GroupTask({})
    for task in tasks:
        for m in task.rows:
            values = _sampled_rows(m, samples)
            for value in values:
                key = (value, task.k, task.n)
                group.instances[key] = group.instances.get(key, 0.0) + 1.0 / len(values)
        group.nodes += task.nodes
        group.symbols |= task.symbols
    return group if group.instances else None


def _sampled_rows(m: Dim, samples: int) -> list[int]:
    """Values of a call's M: itself when static; at ``samples`` uniform values of its one
    symbol (M = 24 B takes multiples of 24 only); else uniform over its range."""
    lo, hi = bounds(m)
    lo = max(1, lo)
    if hi < 1:
        return []
    if hi == lo:
        return [lo]
    atoms = [a for a in m.atoms() if a.kind == "sym" and a.definition is None] if isinstance(m, Expr) else []
    if len(free_symbols(m)) == 1 and len(atoms) == 1:
        rows = {evaluate(m, {atoms[0].name: v}) for v in uniform_samples(max(1, atoms[0].lo), atoms[0].hi, samples)}
        return sorted(r for r in rows if r >= 1)
    return uniform_samples(lo, hi, samples)


@dataclass
class ConvTask(_InstanceTask):
    """Convs of one class (tune/conv_workload.py) as one task: every instance of the class
    in the model (grouped), or one instance alone; the calls per run of each. ``blocked``:
    None for plain convs (``ss_conv2d``), else (depthwise, lanes) of blocked ones
    (``NCHWcConv`` nodes)."""

    conv_class: tuple
    instances: dict[tuple, float]  # instance -> calls per run
    blocked: Optional[tuple[bool, int]] = None

    @property
    def calls(self) -> int:
        return int(round(sum(self.instances.values())))

    @property
    def symbols(self) -> set[str]:
        return set()

    @property
    def nodes(self) -> list[str]:
        return [self.label]

    @property
    def label(self) -> str:
        kh, kw, sh, sw, dh, dw = self.conv_class
        what = f"conv {kh}x{kw}/{sh}" + (f" dil {dh}" if dh > 1 else "")
        if self.blocked is not None:
            what = ("depthwise " if self.blocked[0] else "") + f"NCHW{self.blocked[1]}c {what}"
        if len(self.instances) == 1:
            n, c, h, w, m, _, _, _ = next(iter(self.instances))
            return f"{what} {c}->{m} on {h}x{w}" + (f" x{n}" if n > 1 else "")
        return f"{what}: {len(self.instances)} instance(s)"

    def workload(self, cold: bool = True) -> ConvWorkload:
        """Cold by default: each call after a flush of the caches, as in a model."""
        if self.blocked is not None:
            return NchwcConvWorkload.of(self.conv_class, self.instances, cold, *self.blocked)
        return ConvWorkload.of(self.conv_class, self.instances, cold)



def conv_tasks(calls: list[tuple], group: bool = True) -> list[ConvTask]:
    """Tasks of the recorded conv calls ((class, instance) or (class, instance, weight)
    each; a blocked conv's class is (blocked, class): ``ConvTask.blocked``): one per class,
    or with ``group`` False one per distinct instance (the per-instance baseline)."""
    tasks: dict = {}
    for klass, inst, *weight in calls:
        blocked, conv_class = klass if len(klass) == 2 else (None, klass)
        task = tasks.setdefault(klass if group else (klass, inst), ConvTask(conv_class, {}, blocked))
        task.instances[inst] = task.instances.get(inst, 0.0) + (weight[0] if weight else 1.0)
    return list(tasks.values())


# Values of each dynamic dim at which a conv of symbolic sizes is sampled (``sampled_bindings``).
DIM_SAMPLES = 6


def sampled_bindings(dynamic: Mapping[str, tuple[int, int]], count: int = DIM_SAMPLES) -> list[dict[str, int]]:
    """Values of the model's dynamic dims at which its convs of symbolic sizes become
    instances: ``count`` values of each dim (uniform over its range; on multiples of 32 when
    both ends are, as a detector's image sizes are), paired Latin-hypercube style (the i-th
    value of the first dim with a fixed shuffle of each other's), so that every dim takes
    each of its values in ``count`` bindings, not ``count`` to the power of the dims."""
    ranges = {name: (lo, hi) for name, (lo, hi) in sorted(dynamic.items()) if hi > lo}
    fixed = {name: lo for name, (lo, hi) in dynamic.items() if hi == lo}
    if not ranges:
        return []
    columns = []
    for i, (lo, hi) in enumerate(ranges.values()):
        step = 32 if lo % 32 == 0 and hi % 32 == 0 else 1
        values = sorted({step * round(v / step) for v in np.linspace(lo, hi, count)})
        values = (values * count)[:count]  # a short range repeats its values
        if i:
            random.Random(i).shuffle(values)
        columns.append(values)
    rows = list(dict.fromkeys(zip(*columns)))  # a short range's repeats pair up alike: once each
    return [{**fixed, **dict(zip(ranges, row))} for row in rows]


def _evaluated(call, binding: Mapping[str, int]) -> Optional[tuple[tuple, tuple]]:
    """A recorded conv of symbolic sizes at ``binding``, if it is an instance there (a
    blocked one's class as (blocked, class))."""
    blocked, (kernel, strides, dilations, pads, dims, out_hw, act) = call
    try:
        dims = [evaluate(d, binding) for d in dims]
        out_hw = [evaluate(d, binding) for d in out_hw]
    except (KeyError, ValueError):
        return None  # a dim it depends on was not declared
    found = conv_instance(kernel, strides, dilations, pads, dims, out_hw, act)
    return found if found is None or blocked is None else ((blocked, found[0]), found[1])


class _Recorder:
    """Stands in for tuning records while a model is lowered: notes the workload of every
    batched call and every dense conv the lowering asks about, and answers that none is tuned."""

    def __init__(self) -> None:
        self.calls: list[tuple[BatchedGemmWorkload, str]] = []
        self.convs: list[tuple[tuple, tuple]] = []
        # (None, or a blocked conv's (depthwise, lanes); the find_conv arguments) of convs of symbolic sizes
        self.symbolic_convs: list[tuple] = []

    def get(self, k: int, n: int) -> None:
        return None

    def find_batched(self, m, n, k, batch, a_strides, b_strides, c_strides) -> None:
        workload = batched_workload(m, n, k, batch, a_strides, b_strides, c_strides)
        if workload is not None:
            symbol = next(iter(set().union(*(free_symbols(d) for d in (m, n, k)))))
            self.calls.append((workload, symbol))
        return None

    def find_conv(self, kernel, strides, dilations, pads, dims, out_hw, act: int, blocked=None) -> None:
        found = conv_instance(kernel, strides, dilations, pads, dims, out_hw, act)
        if found is not None:
            self.convs.append(found if blocked is None else ((blocked, found[0]), found[1]))
        elif all(isinstance(v, int) for v in (*kernel, *strides, *dilations, *pads)):
            self.symbolic_convs.append((blocked, (kernel, strides, dilations, pads, dims, out_hw, act)))
        return None

    def find_conv_nchwc(self, depthwise: bool, lanes: int, kernel, strides, dilations, pads, dims, out_hw) -> None:
        return self.find_conv(kernel, strides, dilations, pads, dims, out_hw, 0, (bool(depthwise), int(lanes)))

    def __iter__(self):
        return iter(())


def model_tasks(model: ModelSource, dynamic: Optional[Mapping[str, tuple[int, int]]] = None,
                batched: bool = True, convs: bool = True, group_convs: bool = True) -> list:
    """The model's tuning tasks (ModelTask; BatchedTask unless ``batched`` is False;
    ConvTask unless ``convs`` is False, one per class with ``group_convs``, else one per
    instance; convs of dynamic sizes at ``sampled_bindings`` of the declared ranges), the
    most work first."""
    from ..runtime.native import simplify_options

    graph = import_model(model, dict(dynamic or {}))
    simplify_graph(graph, simplify_options())  # the graph a native session lowers
    tasks: list = graph_tasks(graph)
    if batched or convs:
        recorder = _lowering_calls(graph)
        if batched:
            tasks += batched_tasks(recorder)
        if convs:
            # A conv of symbolic sizes (a dynamic image size or batch) weighs one call over
            # its instances at the sampled values of the dims.
            bindings = sampled_bindings(dynamic or {})
            sampled = [(*found, 1.0 / len(bindings)) for call in recorder.symbolic_convs for b in bindings
                       if (found := _evaluated(call, b)) is not None]
            tasks += conv_tasks(recorder.convs + sampled, group_convs)
            _warn_undeclared(recorder.symbolic_convs, dynamic or {})
    return sorted(tasks, key=lambda t: -t.range_flops())


def _warn_undeclared(calls: list[tuple], dynamic: Mapping[str, tuple[int, int]]) -> None:
    """Says how many of the recorded convs of symbolic sizes depend on a dim ``dynamic`` does
    not declare, and which dims: no instance is sampled for them, so they are not tuned. Left
    unsaid, a MobileNet tuned with only its batch declared came back with its squeeze-excite
    convs tuned and nothing to show that its trunk was not."""
    count, missing = 0, set()
    for _, (_kernel, _strides, _dilations, _pads, dims, out_hw, _act) in calls:
        names = set().union(*(free_symbols(d) for d in (*dims, *out_hw))) - set(dynamic)
        count += bool(names)
        missing |= names
    if count:
        log.warning("%d conv call(s) have sizes in dims not declared (%s) and are not tuned: declare their "
                    "ranges with --dynamic SYM=LO:HI", count, ", ".join(sorted(missing)))


def _lowering_calls(graph: Graph) -> _Recorder:
    """The calls the native lowering of ``graph`` (simplified) asks tuning records about."""
    from ..codegen.program import build_program
    from ..passes.simplify.outputs import restore_output_names

    recorder = _Recorder()
    restore_output_names(graph)
    build_program(graph, recorder)
    return recorder


def batched_tasks(recorder: _Recorder) -> list[BatchedTask]:
    """The batched GEMM calls the lowering emits, by structure."""
    tasks: dict[str, BatchedTask] = {}
    for workload, symbol in recorder.calls:
        task = tasks.setdefault(workload.key, BatchedTask(workload, symbol))
        task.calls += 1
    return list(tasks.values())


def graph_tasks(graph: Graph) -> list[ModelTask]:
    tasks: dict[tuple[int, int], ModelTask] = {}
    for node in graph.nodes:
        call = _weight_gemm(node)
        if call is None:
            continue
        k, n, m = call
        lo, hi = bounds(m)
        if hi < 1:
            continue  # an empty product: nothing to tune
        lo = max(lo, 1)
        task = tasks.get((k, n))
        if task is None:
            task = tasks[(k, n)] = ModelTask(k, n, lo, hi)
        task.lo, task.hi = min(task.lo, lo), max(task.hi, hi)
        task.calls += 1
        task.nodes.append(node.name or node.op_type)
        task.symbols |= free_symbols(m)
        task.rows.append(m)
    return sorted(tasks.values(), key=lambda t: -t.range_flops())


def _weight_gemm(node: Node) -> Optional[tuple[int, int, Dim]]:
    """(K, N, M) of a MatMul/Gemm with a constant float32 weight, else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm") or len(node.inputs) < 2:
        return None
    a, b = node.inputs[0], node.inputs[1]
    weight = b.const if b is not None else None
    if weight is None or np.asarray(weight).ndim != 2 or not _float_tensor(a):
        return None
    shape = list(a.type.shape)
    if node.op_type == "MatMul":
        if len(shape) < 2:
            return None
        k, n = weight.shape
        m = product(shape[:-1])
    else:
        if len(shape) != 2:
            return None
        n, k = weight.shape if node.attrs.get("transB", 0) else weight.shape[::-1]
        m = shape[1] if node.attrs.get("transA", 0) else shape[0]
    return int(k), int(n), m


def _float_tensor(value: Value) -> bool:
    t = value.type
    return isinstance(t, TensorType) and t.dtype == FLOAT and t.shape is not None
