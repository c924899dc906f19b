"""Control flow: If, Loop and Scan, whose bodies are nested graphs.

Type rules type the bodies through ``ctx.infer_subgraph``; where two types
meet (the two branches of an If, a loop-carried value before and after an
iteration) they are joined: equal dims are kept, different dims become a fresh
symbol, different ranks become unknown rank.  Evaluators run the bodies with
``ctx.run_subgraph``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import ShapeInferenceError
from ..ir.types import BOOL, INT64, OptionalType, SequenceType, TensorType, ValueType
from ..symbolic import Expr
from .context import EvalContext, InferContext
from .registry import define

#: How many times a loop body is re-typed while its carried types widen.
MAX_WIDENING_ROUNDS = 4


def join_types(a: Optional[ValueType], b: Optional[ValueType], ctx: InferContext) -> Optional[ValueType]:
    """The least precise type covering both ``a`` and ``b``."""
    if a is None or b is None:
        return None
    if a == b:
        return a
    if isinstance(a, TensorType) and isinstance(b, TensorType):
        if a.dtype != b.dtype:
            return None
        if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
            return TensorType(a.dtype, None)
        dims = [da if (da is db or (not isinstance(da, Expr) and not isinstance(db, Expr) and da == db))
                else ctx.fresh_dim("join") for da, db in zip(a.shape, b.shape)]
        return TensorType(a.dtype, tuple(dims))
    if isinstance(a, SequenceType) and isinstance(b, SequenceType):
        return SequenceType(join_types(a.elem, b.elem, ctx))
    if isinstance(a, OptionalType) and isinstance(b, OptionalType):
        return OptionalType(join_types(a.elem, b.elem, ctx))
    return None


# -- If -------------------------------------------------------------------------------


def _if_infer(ctx: InferContext) -> list:
    cond = ctx.input_dims(0)
    if cond is not None and len(cond) == 1 and not isinstance(cond[0], Expr):
        # Only the branch taken is typed: the other may be invalid for these shapes
        # (exporters emit both a 2-D and a 3-D path and choose on the rank).
        return list(ctx.infer_subgraph(ctx.attr("then_branch" if cond[0] else "else_branch"), []))
    then_types = _branch_types(ctx, "then_branch")
    else_types = _branch_types(ctx, "else_branch")
    if then_types is None or else_types is None:
        # A branch that cannot type-check cannot be the one that runs.
        chosen = then_types if else_types is None else else_types
        if chosen is None:
            ctx.fail("neither branch type-checks")
        return list(chosen)
    return [join_types(a, b, ctx) for a, b in zip(then_types, else_types)]


def _branch_types(ctx: InferContext, name: str) -> Optional[list]:
    branch = ctx.attr(name)
    try:
        return ctx.infer_subgraph(branch, [])
    except ShapeInferenceError as exc:
        # Kept for good: later visits may answer from the types stored, without re-typing.
        branch.type_error = str(exc)
        return None


def _if_eval(ctx: EvalContext, cond) -> list:
    name = "then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch"
    branch = ctx.attr(name)
    if branch.type_error is not None:
        # The If's output types are the other branch's: whatever this one would compute
        # (where an evaluator is laxer than the type rule), it is not what the graph says.
        ctx.fail(f"the condition chose the {name}, which does not type-check: {branch.type_error}")
    return ctx.run_subgraph(branch, [])


define("If", infer=_if_infer, evaluate=_if_eval, single=(0,))


# -- Loop -----------------------------------------------------------------------------


def _loop_infer(ctx: InferContext) -> list:
    body = ctx.attr("body")
    carried = [ctx.input_type(i) for i in range(2, ctx.num_inputs)]
    scalar_int = TensorType(INT64, ())
    scalar_bool = TensorType(BOOL, ())
    outputs: list = []
    for _ in range(MAX_WIDENING_ROUNDS):
        outputs = ctx.infer_subgraph(body, [scalar_int, scalar_bool, *carried])
        after = outputs[1:1 + len(carried)]
        widened = [join_types(before, now, ctx) for before, now in zip(carried, after)]
        if widened == carried:
            break
        carried = widened
    trip_dim = ctx.fresh_dim("loop_iters", 0)
    max_trip = ctx.input_dims(0)
    if max_trip is not None and not ctx.has_input(1) and not isinstance(max_trip[0], Expr):
        trip_dim = int(max_trip[0])  # no condition: the loop runs exactly M times
    scans = []
    for t in outputs[1 + len(carried):]:
        if isinstance(t, TensorType):
            scans.append(TensorType(t.dtype, None if t.shape is None else (trip_dim, *t.shape)))
        else:
            scans.append(None)
    return carried + scans


def _loop_eval(ctx: EvalContext, max_trip=None, cond=None, *initial) -> list:
    body = ctx.attr("body")
    carried = list(initial)
    n_carried = len(carried)
    scans: list[list] = []
    keep_going = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    limit = None if max_trip is None else int(np.asarray(max_trip).reshape(-1)[0])
    i = 0
    while keep_going and (limit is None or i < limit):
        results = ctx.run_subgraph(body, [np.array(i, dtype=np.int64), np.array(keep_going), *carried])
        keep_going = bool(np.asarray(results[0]).reshape(-1)[0])
        carried = list(results[1:1 + n_carried])
        step_scans = results[1 + n_carried:]
        if not scans:
            scans = [[] for _ in step_scans]
        for store, value in zip(scans, step_scans):
            store.append(value)
        i += 1
    n_scan = len(body.outputs) - 1 - n_carried
    stacked = []
    for k in range(n_scan):
        values = scans[k] if scans else []
        if values:
            stacked.append(np.stack([np.asarray(v) for v in values]))
        else:
            stacked.append(_empty_scan_output(body.outputs[1 + n_carried + k].type))
    return carried + stacked


def _empty_scan_output(t) -> np.ndarray:
    from ..ir.types import to_numpy_dtype

    if isinstance(t, TensorType) and t.shape is not None and all(not isinstance(d, Expr) for d in t.shape):
        return np.zeros((0, *t.shape), dtype=to_numpy_dtype(t.dtype))
    dtype = to_numpy_dtype(t.dtype) if isinstance(t, TensorType) else np.float32
    return np.zeros((0,), dtype=dtype)


define("Loop", infer=_loop_infer, evaluate=_loop_eval, single=(0, 1))


# -- Scan -----------------------------------------------------------------------------


def _scan_layout(ctx, num_inputs: int):
    """(number of state inputs, scan axes, directions) for opset >= 9."""
    num_scan = ctx.attr("num_scan_inputs")
    first = 1 if ctx.opset < 9 else 0  # opset 8 starts with sequence_lens
    n_state = num_inputs - first - num_scan
    axes = list(ctx.attr("scan_input_axes", [0] * num_scan))
    directions = list(ctx.attr("scan_input_directions", ctx.attr("directions", [0] * num_scan)))
    return first, n_state, num_scan, axes, directions


def _scan_infer(ctx: InferContext) -> list:
    body = ctx.attr("body")
    first, n_state, num_scan, axes, _ = _scan_layout(ctx, ctx.num_inputs)
    batch = 1 if ctx.opset < 9 else 0  # opset 8 has a leading batch axis on everything
    states = [ctx.input_type(first + i) for i in range(n_state)]
    slices = []
    seq_dim = None
    for k in range(num_scan):
        t = ctx.input_type(first + n_state + k)
        if isinstance(t, TensorType) and t.shape is not None:
            axis = (axes[k] % len(t.shape)) if ctx.opset >= 9 else 1
            seq_dim = t.shape[axis] if seq_dim is None else seq_dim
            slices.append(TensorType(t.dtype, t.shape[:axis] + t.shape[axis + 1:]))
        else:
            slices.append(None)
    body_states = [_drop_batch(t) if batch else t for t in states]
    outputs = ctx.infer_subgraph(body, body_states + [(_drop_batch(s) if batch else s) for s in slices])
    out_states = [join_types(a, b, ctx) for a, b in zip(body_states, outputs[:n_state])]
    if batch:
        out_states = [_add_batch(t, states[i]) for i, t in enumerate(out_states)]
    seq_dim = seq_dim if seq_dim is not None else ctx.fresh_dim("scan_len")
    out_axes = list(ctx.attr("scan_output_axes", [0] * (len(outputs) - n_state)))
    scans = []
    for k, t in enumerate(outputs[n_state:]):
        if isinstance(t, TensorType) and t.shape is not None:
            if batch:
                lead = states[0].shape[0] if states and isinstance(states[0], TensorType) and states[0].shape else ctx.fresh_dim()
                scans.append(TensorType(t.dtype, (lead, seq_dim, *t.shape)))
            else:
                rank = len(t.shape) + 1
                axis = out_axes[k] % rank if k < len(out_axes) else 0
                shape = list(t.shape)
                shape.insert(axis, seq_dim)
                scans.append(TensorType(t.dtype, tuple(shape)))
        else:
            scans.append(None)
    return out_states + scans


def _drop_batch(t):
    if isinstance(t, TensorType) and t.shape:
        return TensorType(t.dtype, t.shape[1:])
    return t


def _add_batch(t, original):
    if isinstance(t, TensorType) and t.shape is not None and isinstance(original, TensorType) and original.shape:
        return TensorType(t.dtype, (original.shape[0], *t.shape))
    return t


def _scan_eval(ctx: EvalContext, *inputs) -> list:
    body = ctx.attr("body")
    first, n_state, num_scan, axes, directions = _scan_layout(ctx, len(inputs))
    if ctx.opset < 9:
        return _scan8_eval(ctx, body, inputs, n_state, num_scan, directions)
    states = list(inputs[first:first + n_state])
    scan_inputs = [np.moveaxis(np.asarray(x), axes[k] % np.ndim(x), 0)
                   for k, x in enumerate(inputs[first + n_state:])]
    length = scan_inputs[0].shape[0] if scan_inputs else 0
    n_out = len(body.outputs) - n_state
    collected: list[list] = [[] for _ in range(n_out)]
    for step in range(length):
        slices = [x[length - 1 - step] if (k < len(directions) and directions[k]) else x[step]
                  for k, x in enumerate(scan_inputs)]
        results = ctx.run_subgraph(body, states + slices)
        states = list(results[:n_state])
        for store, value in zip(collected, results[n_state:]):
            store.append(np.asarray(value))
    out_axes = list(ctx.attr("scan_output_axes", [0] * n_out))
    out_dirs = list(ctx.attr("scan_output_directions", [0] * n_out))
    outputs = []
    for k, values in enumerate(collected):
        if k < len(out_dirs) and out_dirs[k]:
            values = values[::-1]
        stacked = np.stack(values) if values else np.zeros((0,), np.float32)
        axis = out_axes[k] % stacked.ndim if k < len(out_axes) else 0
        outputs.append(np.moveaxis(stacked, 0, axis))
    return states + outputs


def _scan8_eval(ctx, body, inputs, n_state, num_scan, directions) -> list:
    """Opset 8 Scan: a leading batch axis and optional sequence_lens."""
    seq_lens = inputs[0]
    states_b = [np.asarray(x) for x in inputs[1:1 + n_state]]
    scans_b = [np.asarray(x) for x in inputs[1 + n_state:]]
    batch = states_b[0].shape[0] if states_b else scans_b[0].shape[0]
    final_states: list[list] = [[] for _ in range(n_state)]
    n_out = len(body.outputs) - n_state
    outputs_b: list[list] = [[] for _ in range(n_out)]
    for b in range(batch):
        states = [s[b] for s in states_b]
        length = scans_b[0].shape[1] if seq_lens is None else int(np.asarray(seq_lens)[b])
        collected: list[list] = [[] for _ in range(n_out)]
        for step in range(length):
            slices = [x[b, length - 1 - step] if (k < len(directions) and directions[k]) else x[b, step]
                      for k, x in enumerate(scans_b)]
            results = ctx.run_subgraph(body, states + slices)
            states = list(results[:n_state])
            for store, value in zip(collected, results[n_state:]):
                store.append(np.asarray(value))
        for store, s in zip(final_states, states):
            store.append(np.asarray(s))
        for store, values in zip(outputs_b, collected):
            store.append(np.stack(values))
    return [np.stack(s) for s in final_states] + [np.stack(v) for v in outputs_b]


define("Scan", infer=_scan_infer, evaluate=_scan_eval)
