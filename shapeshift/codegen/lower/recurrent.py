"""Lowering of the recurrent ops LSTM, GRU and RNN to one kernel call each (kernels/rnn.py).

The kernels take every ONNX attribute as an argument (direction, layout,
linear_before_reset, input_forget, activation list, clip), so this module only checks
dtypes, turns attributes into those arguments, sizes the workspace, and has constant
weights packed once at load instead of at every call: W, per direction, for the GEMMs that
project the steps' inputs, R into the layout the step reads (kernels/rnn_step.py).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...ir.graph import Node, Value
from ...ir.types import FLOAT, INT32
from ..kernels.rnn import ACTIVATION_CODES, KIND_GRU, KIND_GRU_LBR, KIND_LSTM, KIND_RNN, work_floats
from ..kernels.rnn_step import KIND_GATES
from . import lowers
from .context import LowerContext, Lowered, Unsupported, c_array, float_literal

DIRECTIONS = {"forward": 0, "reverse": 1, "bidirectional": 2}
# Inputs by position, as ONNX numbers them for the three ops (the last two: LSTM only).
X, W, R, BIAS, SEQUENCE_LENS, INITIAL_H, INITIAL_C, PEEPHOLES = range(8)
DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
# (alpha, beta) defaults of the activations that take them, those of the ONNX operators of
# the same name; a function without an entry (or with None) consumes no value of that list.
ARG_DEFAULTS = {
    "affine": (1.0, 0.0), "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None),
    "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, None),
}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _input(node: Node, index: int) -> Optional[Value]:
    return node.inputs[index] if index < len(node.inputs) else None


def _output(node: Node, index: int, ctx: LowerContext) -> Optional[Value]:
    """An output the kernel must write: present and read by someone (else NULL)."""
    value = node.outputs[index] if index < len(node.outputs) else None
    return None if ctx.unused(value) else value


def _check_dtypes(node: Node, ctx: LowerContext) -> None:
    for index, value in enumerate(node.inputs):
        if value is None:
            continue
        want = INT32 if index == SEQUENCE_LENS else FLOAT
        if ctx.dtype(value) != want:
            raise Unsupported(f"{node.op_type} on a dtype other than float32 (int32 sequence_lens)")


def _hidden_size(node: Node, ctx: LowerContext) -> int:
    hidden = node.attrs.get("hidden_size")
    if hidden is None:
        hidden = ctx.shape(node.inputs[R])[-1]  # R is [D, G*H, H]
    if not isinstance(hidden, int):
        raise Unsupported(f"{node.op_type} with a symbolic hidden size")
    return int(hidden)


def _activation_arrays(node: Node, directions: int) -> Optional[list[str]]:
    """C declarations of ``acts``, ``alphas``, ``betas`` for the kernel, or None for the
    defaults. alpha and beta values are consumed in list order, one per function that
    takes the argument (as onnxruntime and the reference evaluator read them)."""
    names = [_text(n) for n in node.attrs.get("activations") or []]
    defaults = [d.lower() for d in DEFAULT_ACTIVATIONS[node.op_type]]
    if len(names) == len(defaults) and directions == 2:
        names = names * 2  # one list given for both directions
    if not names or [n.lower() for n in names] == defaults * directions:
        return None  # the defaults, which take no alpha or beta: the kernel's own
    if len(names) != len(defaults) * directions:
        raise Unsupported(f"{node.op_type} activation list of length {len(names)}")
    alphas, betas = list(node.attrs.get("activation_alpha") or []), list(node.attrs.get("activation_beta") or [])
    codes, alpha_out, beta_out = [], [], []
    for name in names:
        key = name.lower()
        if key not in ACTIVATION_CODES:
            raise Unsupported(f"{node.op_type} activation {name}")
        default_alpha, default_beta = ARG_DEFAULTS.get(key, (None, None))
        codes.append(str(ACTIVATION_CODES[key]))
        alpha_out.append(float_literal(_consume(alphas, default_alpha)))
        beta_out.append(float_literal(_consume(betas, default_beta)))
    return [c_array("acts", codes, "int32_t"), c_array("alphas", alpha_out, "float"),
            c_array("betas", beta_out, "float")]


def _consume(values: list, default: Optional[float]) -> float:
    """The next listed value for a function that takes the argument, else its default."""
    if default is None:
        return 0.0  # the function takes no such argument: it consumes nothing
    return float(values.pop(0)) if values else default


def _kind(node: Node) -> int:
    if node.op_type == "LSTM":
        return KIND_LSTM
    if node.op_type == "GRU":
        return KIND_GRU_LBR if int(node.attrs.get("linear_before_reset", 0)) else KIND_GRU
    return KIND_RNN


def _recurrent_weights(node: Node, ctx: LowerContext, kind: int, directions: int, hidden: int,
                       ptr) -> tuple[str, str]:
    """The kernel's ``R`` and ``Rp`` arguments: a constant R is packed once at load (and
    R itself no longer read), any other is packed by the kernel at each call."""
    r = node.inputs[R]
    want = (directions, KIND_GATES[kind] * hidden, hidden)
    shape = ctx.shape(r)
    if all(isinstance(d, int) for d in shape) and tuple(shape) != want:
        raise Unsupported(f"{node.op_type} {node.name!r}: R of shape {tuple(shape)}, expected {want}")
    weights = ctx.const(r)
    if weights is None:
        return ptr(r), "NULL"
    matrix = np.asarray(weights, dtype=np.float32).reshape(want[0] * want[1], hidden)
    slot = ctx.packed_constant(matrix, f"ss_rnn_k{kind}_")
    return "NULL", f"(const float*)v[{slot}]"


def _input_weights(node: Node, ctx: LowerContext, ptr) -> tuple[list[str], str, str]:
    """C declarations and the kernel's ``W`` and ``Wp`` arguments: a constant W [D, G, I] is
    packed once at load per direction, as the GEMM operand W_d^T [I, G]."""
    weights = ctx.const(node.inputs[W])
    if weights is None or weights.ndim != 3:
        return [], ptr(node.inputs[W]), "NULL"
    weights = np.asarray(weights, dtype=np.float32)
    slots = [ctx.packed_weight(weights[d].T, default_layout=True)[0] for d in range(weights.shape[0])]
    return [c_array("wp", [f"(const float*)v[{slot}]" for slot in slots], "float*")], "NULL", "wp"


def _lower_recurrent(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    """``ss_rnn(...)``, ``ss_gru(...)`` or ``ss_lstm(...)`` for the node; they share every
    argument but GRU's linear_before_reset and LSTM's cell state, peepholes and
    input_forget."""
    _check_dtypes(node, ctx)
    kind = _kind(node)
    layout = int(node.attrs.get("layout", 0)) if opset >= 14 else 0
    direction = DIRECTIONS.get(_text(node.attrs.get("direction", "forward")))
    if direction is None:
        raise Unsupported(f"{node.op_type} direction {node.attrs.get('direction')}")
    directions = 2 if direction == 2 else 1
    hidden = _hidden_size(node, ctx)
    x_shape = ctx.shape(node.inputs[X])
    if len(x_shape) != 3:
        raise Unsupported(f"{node.op_type} input of rank other than 3")
    seq, batch, size = (x_shape[0], x_shape[1], x_shape[2]) if layout == 0 else (x_shape[1], x_shape[0], x_shape[2])
    clip = node.attrs.get("clip")
    if clip is not None and not float(clip) >= 0.0:
        raise Unsupported(f"{node.op_type} clip {clip} (a threshold must not be negative)")
    arrays = _activation_arrays(node, directions)

    def ptr(value: Optional[Value]) -> str:
        return "NULL" if value is None else ctx.ptr(value)

    r_arg, packed_arg = _recurrent_weights(node, ctx, kind, directions, hidden, ptr)
    w_decls, w_arg, w_packed = _input_weights(node, ctx, ptr)
    args = [ptr(_input(node, X)), w_arg, w_packed, r_arg, packed_arg]
    args += [ptr(_input(node, i)) for i in (BIAS, SEQUENCE_LENS, INITIAL_H)]
    if kind == KIND_LSTM:
        args += [ptr(_input(node, INITIAL_C)), ptr(_input(node, PEEPHOLES))]
    args += [ptr(_output(node, k, ctx)) for k in range(3 if kind == KIND_LSTM else 2)]
    args += [ctx.dim(seq), ctx.dim(batch), ctx.dim(size), str(hidden), str(direction), str(layout)]
    if kind == KIND_LSTM:
        args.append(str(1 if int(node.attrs.get("input_forget", 0)) else 0))
    elif node.op_type == "GRU":
        args.append(str(1 if kind == KIND_GRU_LBR else 0))
    args += ["acts", "alphas", "betas"] if arrays else ["NULL", "NULL", "NULL"]
    args += [float_literal(clip) if clip is not None else "-1.0f", "(float*)WORK"]
    kernel = {"RNN": "ss_rnn", "GRU": "ss_gru", "LSTM": "ss_lstm"}[node.op_type]
    lens = _input(node, SEQUENCE_LENS)
    check, rejects = [], ""
    if lens is not None:
        # Lengths past the sequence (or negative) are refused, as onnxruntime refuses them: the
        # kernels would clamp them to the steps there are.
        check = [f"{{ const int32_t* lens = {ctx.ptr(lens)};",
                 f"  for (int64_t b = 0; b < {ctx.dim(batch)}; ++b)",
                 f"    if (lens[b] < 0 || lens[b] > {ctx.dim(seq)}) return STEP_ERROR; }}"]
        rejects = f"every sequence_lens value must be from 0 to the sequence length ({seq})"
    code = "\n".join([*check, *w_decls, *(arrays or []), f"{kernel}({', '.join(args)});"])
    floats = work_floats(seq, batch, hidden, directions, kind, prepacked=packed_arg != "NULL")
    return Lowered(code, fragments=("rnn",), work_bytes=floats * 4, can_fail=bool(check), rejects=rejects)


@lowers("RNN")
def lower_rnn(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    return _lower_recurrent(node, ctx, opset)


@lowers("GRU")
def lower_gru(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    return _lower_recurrent(node, ctx, opset)


@lowers("LSTM")
def lower_lstm(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    return _lower_recurrent(node, ctx, opset)
