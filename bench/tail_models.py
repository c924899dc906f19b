"""The models of bench/tail.py, built with onnx.helper and seeded random weights (no torch).

Each builder returns an ``onnx.ModelProto`` with symbolic batch (and sequence) dims, in the
form the exporters of such models write:

- ``gru_encoder``: a seq2seq transliteration encoder: token embedding (Gather), one
  bidirectional GRU (``linear_before_reset=1``, as PyTorch exports it), outputs the sequence
  and the final states;
- ``gru_decoder_step``: its decoder run one token at a time: embedding, a forward GRU of one
  step from the previous state, a projection to the vocabulary and a LogSoftmax;
- ``lstm_ctc``: a CRNN text recognizer as the TorchScript exporter writes one whose LSTM it
  unrolled: a conv front end over a [batch, 1, 32, 160] line image, 40 steps of
  ``Gemm(x_t, W_ih, transB=1)`` + ``Gemm(h, W_hh, transB=1)``, Add, Split into four gates,
  Sigmoid/Tanh, the cell update, the states stacked, a classifier and LogSoftmax (the CTC
  head); input 400, hidden 1024 (the 400x4096 input weight of the model issue 32 measured);
- ``lstm_seq``: one LSTM layer over a [seq, batch, 80] feature sequence (hidden 256), the
  shape of a speech model's recurrent layer;
- ``byte_classifier``: byte embedding, two Conv1d + Relu, MaxPool, a global max, two dense
  layers.

``feeds(name)`` gives the (label, feed) pairs tail.py measures each model at.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
GRU_VOCAB, GRU_EMBED, GRU_HIDDEN = 64, 128, 256
LSTM_STEPS, LSTM_INPUT, LSTM_HIDDEN, CTC_CLASSES = 40, 400, 1024, 97
SEQ_FEATURES, SEQ_HIDDEN = 80, 256
BYTE_EMBED, BYTE_CLASSES = 32, 10


class _Graph:
    """Nodes and initializers being collected for one model, with fresh names."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def weight(self, shape, fan_in: int) -> str:
        # Scaled by 1/sqrt(fan_in): activations stay O(1) through the depth.
        data = (self.rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
        return self.const(data)

    def const(self, data: np.ndarray) -> str:
        name = f"w{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(data), name))
        return name

    def op(self, op_type: str, inputs, outputs: int = 1, **attrs):
        names = [f"t{self.count}_{i}" for i in range(outputs)]
        self.count += 1
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names

    def model(self, name: str, inputs, outputs) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        onnx.checker.check_model(model)
        return model


def _float(name: str, dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def _int64(name: str, dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.INT64, dims)


def _gru_weights(g: _Graph, directions: int, inputs: int, hidden: int) -> list[str]:
    return [g.weight((directions, 3 * hidden, inputs), inputs), g.weight((directions, 3 * hidden, hidden), hidden),
            g.weight((directions, 6 * hidden), hidden)]


def gru_encoder(seed: int = 0) -> onnx.ModelProto:
    g = _Graph(seed)
    embedded = g.op("Gather", [g.weight((GRU_VOCAB, GRU_EMBED), 1), "tokens"], axis=0)  # [seq, batch, E]
    outs = g.op("GRU", [embedded, *_gru_weights(g, 2, GRU_EMBED, GRU_HIDDEN)], outputs=2,
                hidden_size=GRU_HIDDEN, direction="bidirectional", linear_before_reset=1)
    g.nodes[-1].output[:] = ["states", "final"]
    return g.model("gru_encoder", [_int64("tokens", ["seq", "batch"])],
                   [_float("states", ["seq", 2, "batch", GRU_HIDDEN]), _float("final", [2, "batch", GRU_HIDDEN])])


def gru_decoder_step(seed: int = 1) -> onnx.ModelProto:
    g = _Graph(seed)
    embedded = g.op("Gather", [g.weight((GRU_VOCAB, GRU_EMBED), 1), "token"], axis=0)  # [1, batch, E]
    _, h = g.op("GRU", [embedded, *_gru_weights(g, 1, GRU_EMBED, GRU_HIDDEN), "", "state"], outputs=2,
                hidden_size=GRU_HIDDEN, linear_before_reset=1)
    g.nodes[-1].output[1] = "next_state"
    flat = g.op("Squeeze", ["next_state", g.const(np.array([0], np.int64))])  # [batch, H]
    logits = g.op("Gemm", [flat, g.weight((GRU_VOCAB, GRU_HIDDEN), GRU_HIDDEN), g.weight((GRU_VOCAB,), 1)], transB=1)
    g.nodes.append(helper.make_node("LogSoftmax", [logits], ["log_probs"], axis=-1))
    return g.model("gru_decoder_step", [_int64("token", [1, "batch"]), _float("state", [1, "batch", GRU_HIDDEN])],
                   [_float("log_probs", ["batch", GRU_VOCAB]), _float("next_state", [1, "batch", GRU_HIDDEN])])


def _conv_front(g: _Graph) -> str:
    """[batch, 1, 32, 160] -> [40, batch, 400]: three conv stages, then width as time."""
    x, channels = "image", 1
    for out, pool in ((32, [2, 2]), (64, [2, 2]), (100, [2, 1])):
        x = g.op("Conv", [x, g.weight((out, channels, 3, 3), 9 * channels / 2), g.weight((out,), 1)], pads=[1, 1, 1, 1])
        x = g.op("MaxPool", [g.op("Relu", [x])], kernel_shape=pool, strides=pool)
        channels = out
    # [batch, 100, 4, 40] -> [40, batch, 100, 4] -> [40, batch, 400]
    x = g.op("Transpose", [x], perm=[3, 0, 1, 2])
    return g.op("Reshape", [x, g.const(np.array([LSTM_STEPS, -1, LSTM_INPUT], np.int64))])


def lstm_ctc(seed: int = 2) -> onnx.ModelProto:
    g = _Graph(seed)
    seq = _conv_front(g)
    w_ih = g.weight((4 * LSTM_HIDDEN, LSTM_INPUT), LSTM_INPUT)
    w_hh = g.weight((4 * LSTM_HIDDEN, LSTM_HIDDEN), LSTM_HIDDEN)
    b_ih, b_hh = g.weight((4 * LSTM_HIDDEN,), 1), g.weight((4 * LSTM_HIDDEN,), 1)
    # h0 and c0: zeros [batch, H] made from the input's batch, as the exporter writes them.
    batch = g.op("Gather", [g.op("Shape", ["image"]), g.const(np.array([0], np.int64))], axis=0)
    zeros_shape = g.op("Concat", [batch, g.const(np.array([LSTM_HIDDEN], np.int64))], axis=0)
    h = c = g.op("ConstantOfShape", [zeros_shape], value=helper.make_tensor("z", TensorProto.FLOAT, [1], [0.0]))
    split = g.const(np.array([LSTM_HIDDEN] * 4, np.int64))
    steps = []
    for t in range(LSTM_STEPS):
        x_t = g.op("Gather", [seq, g.const(np.array(t, np.int64))], axis=0)  # [batch, I]
        gates = g.op("Add", [g.op("Gemm", [x_t, w_ih, b_ih], transB=1), g.op("Gemm", [h, w_hh, b_hh], transB=1)])
        i, f, cell, o = g.op("Split", [gates, split], outputs=4, axis=1)
        c = g.op("Add", [g.op("Mul", [g.op("Sigmoid", [f]), c]),
                         g.op("Mul", [g.op("Sigmoid", [i]), g.op("Tanh", [cell])])])
        h = g.op("Mul", [g.op("Sigmoid", [o]), g.op("Tanh", [c])])
        steps.append(g.op("Unsqueeze", [h, g.const(np.array([0], np.int64))]))
    states = g.op("Concat", steps, axis=0)  # [T, batch, H]
    logits = g.op("MatMul", [states, g.weight((LSTM_HIDDEN, CTC_CLASSES), LSTM_HIDDEN)])
    g.nodes.append(helper.make_node("LogSoftmax", [logits], ["log_probs"], axis=-1))
    return g.model("lstm_ctc", [_float("image", ["batch", 1, 32, 160])],
                   [_float("log_probs", [LSTM_STEPS, "batch", CTC_CLASSES])])


def lstm_seq(seed: int = 3) -> onnx.ModelProto:
    g = _Graph(seed)
    w = g.weight((1, 4 * SEQ_HIDDEN, SEQ_FEATURES), SEQ_FEATURES)
    r = g.weight((1, 4 * SEQ_HIDDEN, SEQ_HIDDEN), SEQ_HIDDEN)
    b = g.weight((1, 8 * SEQ_HIDDEN), 1)
    g.nodes.append(helper.make_node("LSTM", ["features", w, r, b], ["states", "final_h", "final_c"],
                                    hidden_size=SEQ_HIDDEN))
    return g.model("lstm_seq", [_float("features", ["seq", "batch", SEQ_FEATURES])],
                   [_float("states", ["seq", 1, "batch", SEQ_HIDDEN]), _float("final_h", [1, "batch", SEQ_HIDDEN]),
                    _float("final_c", [1, "batch", SEQ_HIDDEN])])


def byte_classifier(seed: int = 4) -> onnx.ModelProto:
    g = _Graph(seed)
    x = g.op("Gather", [g.weight((256, BYTE_EMBED), 1), "bytes"], axis=0)  # [batch, len, E]
    x = g.op("Transpose", [x], perm=[0, 2, 1])  # [batch, E, len]
    channels = BYTE_EMBED
    for out, kernel in ((128, 5), (128, 3)):
        x = g.op("Relu", [g.op("Conv", [x, g.weight((out, channels, kernel), kernel * channels / 2),
                                        g.weight((out,), 1)], pads=[kernel // 2] * 2)])
        channels = out
        x = g.op("MaxPool", [x], kernel_shape=[2], strides=[2])
    x = g.op("ReduceMax", [x], axes=[2], keepdims=0)  # [batch, 128]
    x = g.op("Relu", [g.op("Gemm", [x, g.weight((64, channels), channels / 2), g.weight((64,), 1)], transB=1)])
    g.nodes.append(helper.make_node("Gemm", [x, g.weight((BYTE_CLASSES, 64), 64), g.weight((BYTE_CLASSES,), 1)],
                                    ["logits"], transB=1))
    return g.model("byte_classifier", [_int64("bytes", ["batch", "len"])], [_float("logits", ["batch", BYTE_CLASSES])])


BUILDERS = {"gru_encoder": gru_encoder, "gru_decoder_step": gru_decoder_step, "lstm_ctc": lstm_ctc,
            "lstm_seq": lstm_seq, "byte_classifier": byte_classifier}


def feeds(name: str, quick: bool = False) -> list[tuple[str, dict]]:
    """The (label, feed) pairs a model is measured at; ``quick``: the first and last only."""
    rng = np.random.default_rng(0)
    if name == "gru_encoder":
        out = [(f"b{b} seq {s}", {"tokens": rng.integers(0, GRU_VOCAB, (s, b)).astype(np.int64)})
               for b, s in ((1, 5), (1, 17), (3, 31))]
    elif name == "gru_decoder_step":
        out = [(f"b{b}", {"token": rng.integers(0, GRU_VOCAB, (1, b)).astype(np.int64),
                          "state": rng.standard_normal((1, b, GRU_HIDDEN)).astype(np.float32)}) for b in (1, 3)]
    elif name == "lstm_ctc":
        out = [(f"b{b}", {"image": rng.random((b, 1, 32, 160)).astype(np.float32)}) for b in (1, 4)]
    elif name == "lstm_seq":
        out = [(f"seq {s}", {"features": rng.standard_normal((s, 1, SEQ_FEATURES)).astype(np.float32)})
               for s in (1, 16, 128, 512)]
    elif name == "byte_classifier":
        out = [(f"b{b} len {n}", {"bytes": rng.integers(0, 256, (b, n)).astype(np.int64)})
               for b, n in ((1, 64), (1, 257), (8, 1000))]
    else:
        raise KeyError(name)
    return [out[0], out[-1]] if quick and len(out) > 2 else out
