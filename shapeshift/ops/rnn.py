"""Recurrent layers: LSTM, GRU and RNN.

The three ops share one shape rule and one driver.  The driver projects the
whole input sequence through ``W`` at once (one matmul), then steps through
time with an op-specific cell function, per direction.  ``sequence_lens`` is
handled by masking: a batch row past its length keeps its state and gets zero
output, which is what onnxruntime produces (and what makes a reverse pass start
at each row's own last element).

Layout 1 (opset 14+) is handled by transposing to layout 0 on the way in and
back on the way out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..symbolic import Dim, floordiv
from .common import tensor
from .context import EvalContext, InferContext
from .registry import define

#: Gate count per op: rows of W are ``gates * hidden_size``.
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
#: Default activations of one direction, in the order the op consumes them.
_DEFAULT_ACTIVATIONS = {
    "LSTM": ("Sigmoid", "Tanh", "Tanh"),
    "GRU": ("Sigmoid", "Tanh"),
    "RNN": ("Tanh",),
}


# -- type rule -------------------------------------------------------------------


def _num_directions(ctx) -> int:
    return 2 if ctx.attr("direction", "forward") == "bidirectional" else 1


def _layout(ctx) -> int:
    return int(ctx.attr("layout", 0)) if ctx.opset >= 14 else 0


def _hidden_size(ctx: InferContext, gates: int) -> Dim:
    """From the attribute, else from R's last dim, else from W's gate rows."""
    if ctx.has_attr("hidden_size"):
        return int(ctx.attr("hidden_size"))
    r_shape = ctx.input_shape(2)
    if r_shape is not None and len(r_shape) == 3:
        return r_shape[2]
    w_shape = ctx.input_shape(1)
    if w_shape is not None and len(w_shape) == 3:
        return floordiv(w_shape[1], gates)
    return ctx.fresh_dim("hidden")


def _seq_and_batch(ctx: InferContext, layout: int) -> tuple[Dim, Dim]:
    x = ctx.input_shape(0)
    if x is not None:
        if len(x) != 3:
            ctx.fail(f"X must have rank 3, got {len(x)}")
        return (x[0], x[1]) if layout == 0 else (x[1], x[0])
    # X of unknown rank: the batch may still be read off sequence_lens.
    lens = ctx.input_shape(4)
    batch = lens[0] if lens is not None and len(lens) == 1 else ctx.fresh_dim("batch")
    return ctx.fresh_dim("seq"), batch


def _recurrent_type(op: str):
    def infer(ctx: InferContext) -> list:
        dtype = ctx.input_dtype(0)
        if dtype is None:
            return [None] * ctx.num_outputs
        layout = _layout(ctx)
        seq, batch = _seq_and_batch(ctx, layout)
        dirs = _num_directions(ctx)
        hidden = _hidden_size(ctx, _GATES[op])
        if layout == 0:
            y = (seq, dirs, batch, hidden)
            state = (dirs, batch, hidden)
        else:
            y = (batch, seq, dirs, hidden)
            state = (batch, dirs, hidden)
        outputs = [tensor(dtype, y), tensor(dtype, state), tensor(dtype, state)]
        return outputs[: ctx.num_outputs]

    return infer


# -- activations -----------------------------------------------------------------


def _sigmoid(x, alpha, beta):
    # Split by sign so that exp never overflows.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _hard_sigmoid(x, alpha, beta):
    return np.clip(alpha * x + beta, 0, 1)


def _elu(x, alpha, beta):
    return np.where(x >= 0, x, alpha * (np.exp(np.minimum(x, 0)) - 1))


def _softplus(x, alpha, beta):
    return np.logaddexp(0, x)


_ACTIVATIONS: dict[str, Callable] = {
    "sigmoid": _sigmoid,
    "tanh": lambda x, a, b: np.tanh(x),
    "relu": lambda x, a, b: np.maximum(x, 0),
    "affine": lambda x, a, b: a * x + b,
    "leakyrelu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "thresholdedrelu": lambda x, a, b: np.where(x > a, x, 0),
    "scaledtanh": lambda x, a, b: a * np.tanh(b * x),
    "hardsigmoid": _hard_sigmoid,
    "elu": _elu,
    "softsign": lambda x, a, b: x / (1 + np.abs(x)),
    "softplus": _softplus,
}

#: (alpha, beta) defaults, the defaults of the ONNX operators of the same name;
#: None means the function takes no such argument (and consumes none).
_ARG_DEFAULTS: dict[str, tuple[Optional[float], Optional[float]]] = {
    "affine": (1.0, 0.0),
    "leakyrelu": (0.01, None),
    "thresholdedrelu": (1.0, None),
    "scaledtanh": (1.0, 1.0),
    "hardsigmoid": (0.2, 0.5),
    "elu": (1.0, None),
}


@dataclass(frozen=True)
class _Activation:
    fn: Callable
    alpha: float
    beta: float

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.fn(x, self.alpha, self.beta).astype(x.dtype, copy=False)


def _take(values: list, default: Optional[float]) -> float:
    """The next listed value for a function that takes the argument, else its default."""
    if default is None:
        return 0.0  # the function takes no such argument: consume nothing
    return float(values.pop(0)) if values else default


def _activations(ctx: EvalContext, op: str, dirs: int) -> list[list[_Activation]]:
    """One list of activations per direction.

    ``activation_alpha``/``activation_beta`` are consumed in order, one value
    per function that takes that argument (as onnxruntime reads them).
    """
    per_dir = len(_DEFAULT_ACTIVATIONS[op])
    names = list(ctx.attr("activations", []) or [])
    if not names:
        names = list(_DEFAULT_ACTIVATIONS[op]) * dirs
    elif len(names) == per_dir and dirs == 2:
        names = names * 2
    if len(names) != per_dir * dirs:
        ctx.fail(f"expected {per_dir * dirs} activations, got {len(names)}")
    alphas = list(ctx.attr("activation_alpha", []) or [])
    betas = list(ctx.attr("activation_beta", []) or [])
    built = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            ctx.fail(f"unsupported activation {name!r}")
        default_alpha, default_beta = _ARG_DEFAULTS.get(key, (None, None))
        alpha, beta = _take(alphas, default_alpha), _take(betas, default_beta)
        built.append(_Activation(_ACTIVATIONS[key], alpha, beta))
    return [built[d * per_dir:(d + 1) * per_dir] for d in range(dirs)]


# -- cells -----------------------------------------------------------------------
# A cell maps (projected input x_t incl. W bias, state) -> new state; the first
# element of the state is the hidden state H that becomes the output.


@dataclass
class _Weights:
    """One direction's parameters, already split for the cell."""

    r: np.ndarray  # [gates*hidden, hidden]
    rb: np.ndarray  # [gates*hidden]
    p: Optional[np.ndarray]  # LSTM peepholes [3*hidden]
    acts: list
    clip: Optional[float]


def _clip(x: np.ndarray, clip: Optional[float]) -> np.ndarray:
    return x if clip is None else np.clip(x, -clip, clip)


def _lstm_cell(ctx: EvalContext, w: _Weights, x_t: np.ndarray, state: tuple) -> tuple:
    h, c = state
    f_act, g_act, h_act = w.acts
    gates = x_t + h @ w.r.T + w.rb
    i, o, f, cand = np.split(gates, 4, axis=-1)
    if w.p is not None:
        p_i, p_o, p_f = np.split(w.p, 3)
        i = i + p_i * c
        f = f + p_f * c
    i = f_act(_clip(i, w.clip))
    if ctx.attr("input_forget", 0):
        f = 1 - i
    else:
        f = f_act(_clip(f, w.clip))
    c_new = f * c + i * g_act(_clip(cand, w.clip))
    if w.p is not None:
        o = o + p_o * c_new
    o = f_act(_clip(o, w.clip))
    return o * h_act(c_new), c_new


def _gru_cell(ctx: EvalContext, w: _Weights, x_t: np.ndarray, state: tuple) -> tuple:
    (h,) = state
    f_act, g_act = w.acts
    r_z, r_r, r_h = np.split(w.r, 3)
    b_z, b_r, b_h = np.split(w.rb, 3)
    x_z, x_r, x_h = np.split(x_t, 3, axis=-1)
    z = f_act(_clip(x_z + h @ r_z.T + b_z, w.clip))
    r = f_act(_clip(x_r + h @ r_r.T + b_r, w.clip))
    if ctx.attr("linear_before_reset", 0):
        pre = x_h + r * (h @ r_h.T + b_h)
    else:
        pre = x_h + (r * h) @ r_h.T + b_h
    h_cand = g_act(_clip(pre, w.clip))
    return ((1 - z) * h_cand + z * h,)


def _rnn_cell(ctx: EvalContext, w: _Weights, x_t: np.ndarray, state: tuple) -> tuple:
    (h,) = state
    (f_act,) = w.acts
    return (f_act(_clip(x_t + h @ w.r.T + w.rb, w.clip)),)


_CELLS = {"LSTM": _lstm_cell, "GRU": _gru_cell, "RNN": _rnn_cell}


# -- driver ----------------------------------------------------------------------


def _run_direction(ctx: EvalContext, op: str, w: _Weights, xw: np.ndarray, state: tuple,
                   lens: Optional[np.ndarray], reverse: bool) -> tuple[np.ndarray, tuple]:
    """Step one direction through time; returns (Y [seq, batch, hidden], final state)."""
    cell = _CELLS[op]
    seq = xw.shape[0]
    ys = np.zeros((seq,) + state[0].shape, dtype=xw.dtype)
    steps = range(seq - 1, -1, -1) if reverse else range(seq)
    for t in steps:
        new_state = cell(ctx, w, xw[t], state)
        if lens is None:
            state = new_state
            ys[t] = state[0]
            continue
        active = (t < lens)[:, None]
        state = tuple(np.where(active, new, old) for new, old in zip(new_state, state))
        ys[t] = np.where(active, new_state[0], 0)
    if lens is not None:
        # onnxruntime reports a zero final state for rows of length 0.
        state = tuple(np.where((lens > 0)[:, None], s, 0) for s in state)
    return ys, state


def _or_zeros(a: Optional[np.ndarray], shape: tuple, dtype) -> np.ndarray:
    return np.zeros(shape, dtype=dtype) if a is None else a.astype(dtype, copy=False)


def _run_directions(ctx: EvalContext, op: str, x, w, r, b, lens, h0, c0, p) -> tuple:
    """All directions in layout 0: (Y [seq, dirs, batch, hidden], Y_h, Y_c)."""
    dirs, gates, hidden = w.shape[0], _GATES[op], r.shape[-1]
    clip = ctx.attr("clip", None)
    acts = _activations(ctx, op, dirs)
    reverse_only = ctx.attr("direction", "forward") == "reverse"
    ys, hs, cs = [], [], []
    for d in range(dirs):
        weights = _Weights(r[d], b[d, gates * hidden:], None if p is None else p[d].astype(x.dtype),
                           acts[d], None if clip is None else float(clip))
        xw = x @ w[d].T + b[d, :gates * hidden]  # the input projection of every step at once
        state = (h0[d], c0[d]) if op == "LSTM" else (h0[d],)
        y, final = _run_direction(ctx, op, weights, xw, state, lens, reverse_only or d == 1)
        ys.append(y)
        hs.append(final[0])
        cs.append(final[-1])
    return np.stack(ys, axis=1), np.stack(hs), np.stack(cs)


def _recurrent_eval(op: str):
    def evaluate(ctx: EvalContext, x, w, r, b=None, lens=None, h0=None, c0=None, p=None) -> list:
        out_dtype = x.dtype
        work = np.result_type(x.dtype, np.float32)
        batchwise = _layout(ctx) == 1
        if batchwise:
            x = x.transpose(1, 0, 2)
            h0 = None if h0 is None else h0.transpose(1, 0, 2)
            c0 = None if c0 is None else c0.transpose(1, 0, 2)
        x, w, r = (a.astype(work, copy=False) for a in (x, w, r))
        dirs, hidden = w.shape[0], r.shape[-1]
        state_shape = (dirs, x.shape[1], hidden)
        b = _or_zeros(b, (dirs, 2 * _GATES[op] * hidden), work)
        h0, c0 = _or_zeros(h0, state_shape, work), _or_zeros(c0, state_shape, work)
        lens = None if lens is None else np.asarray(lens).astype(np.int64).reshape(-1)
        y, y_h, y_c = _run_directions(ctx, op, x, w, r, b, lens, h0, c0, p)
        if batchwise:
            y = y.transpose(2, 0, 1, 3)
            y_h, y_c = y_h.transpose(1, 0, 2), y_c.transpose(1, 0, 2)
        return [o.astype(out_dtype) for o in (y, y_h, y_c)[: ctx.num_outputs]]

    return evaluate


for _op in ("LSTM", "GRU", "RNN"):
    define(_op, infer=_recurrent_type(_op), evaluate=_recurrent_eval(_op))
