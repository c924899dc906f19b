"""Lowering of the recurrent ops RNN and GRU to one kernel call each (kernels/rnn.py).

The kernels take every ONNX attribute as an argument (direction, layout,
linear_before_reset, activation list, clip), so this module only checks dtypes, turns
attributes into those arguments, and sizes the workspace. LSTM's rule is still in
nn.py.
"""

from __future__ import annotations

from typing import Optional

from ...ir.graph import Node, Value
from ...ir.types import FLOAT, INT32
from ..kernels.rnn import ACTIVATION_CODES, gru_work_floats, rnn_work_floats
from . import lowers
from .context import LowerContext, Lowered, Unsupported, c_array, float_literal

DIRECTIONS = {"forward": 0, "reverse": 1, "bidirectional": 2}
# Inputs by position, as ONNX numbers them for both ops.
X, W, R, BIAS, SEQUENCE_LENS, INITIAL_H = range(6)
DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh")}
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


def _lower_recurrent(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    """``ss_rnn(...)`` or ``ss_gru(...)`` for the node; both share every argument but GRU's
    linear_before_reset."""
    _check_dtypes(node, ctx)
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

    args = [ptr(_input(node, i)) for i in (X, W, R, BIAS, SEQUENCE_LENS, INITIAL_H)]
    args += [ptr(_output(node, 0, ctx)), ptr(_output(node, 1, ctx))]
    args += [ctx.dim(seq), ctx.dim(batch), ctx.dim(size), str(hidden), str(direction), str(layout)]
    if node.op_type == "GRU":
        args.append(str(1 if int(node.attrs.get("linear_before_reset", 0)) else 0))
    args += ["acts", "alphas", "betas"] if arrays else ["NULL", "NULL", "NULL"]
    args += [float_literal(clip) if clip is not None else "-1.0f", "(float*)WORK"]
    kernel = "ss_rnn" if node.op_type == "RNN" else "ss_gru"
    code = "\n".join([*(arrays or []), f"{kernel}({', '.join(args)});"])
    floats = (rnn_work_floats if node.op_type == "RNN" else gru_work_floats)(seq, batch, hidden)
    return Lowered(code, fragments=("rnn",), work_bytes=floats * 4)


@lowers("RNN")
def lower_rnn(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    return _lower_recurrent(node, ctx, opset)


@lowers("GRU")
def lower_gru(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    return _lower_recurrent(node, ctx, opset)
