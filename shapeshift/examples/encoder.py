"""Build a BERT-like encoder ONNX model the way PyTorch's TorchScript exporter writes it.

The model has dynamic ``batch`` and ``seq`` dims and the exporter's habits:
head reshapes computed from ``Shape -> Gather -> Unsqueeze -> Concat`` chains,
positions from ``Range`` over the sequence length, GELU spelled with ``Erf``,
an attention mask turned into an additive bias.  Weights are random (seeded),
so any size can be built without downloading anything.

Not its habits: small constants (Unsqueeze axes, Gather indices, Concat parts,
scalars) are initializers here, where the exporter writes ``Constant`` nodes,
and no ``Identity`` aliases weights.  A real 12-layer export
(../shared/models/bert.ts.onnx) has 417 Constant and 120 Identity nodes of its
1,375; this builder's 12 layers have 768 nodes in all.

    python -m shapeshift.examples.encoder OUT.onnx [--layers 2 --hidden 64 --heads 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Writer:
    """Accumulates nodes and initializers with unique, readable names."""

    def __init__(self, seed: int):
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, array: np.ndarray, hint: str = "const") -> str:
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, shape: tuple[int, ...], hint: str, scale: float = 0.05) -> str:
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32), hint)

    def op(self, op_type: str, inputs: list[str], hint: str = "", outputs: int = 1, **attrs) -> str | list[str]:
        names = [self.name(hint or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, **attrs))
        return names[0] if outputs == 1 else names

    def dim(self, tensor: str, axis: int) -> str:
        """Shape(x)[axis] as a 1-element int64 tensor (the exporter's idiom)."""
        shape = self.op("Shape", [tensor])
        scalar = self.op("Gather", [shape, self.const(np.array(axis, np.int64))], axis=0)
        return self.op("Unsqueeze", [scalar, self.const(np.array([0], np.int64))])


def _layer_norm(w: _Writer, x: str, hidden: int) -> str:
    gamma = w.const(np.ones(hidden, np.float32), "ln_gamma")
    beta = w.const(np.zeros(hidden, np.float32), "ln_beta")
    return w.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-12)


def _linear(w: _Writer, x: str, n_in: int, n_out: int, hint: str) -> str:
    y = w.op("MatMul", [x, w.weight((n_in, n_out), f"{hint}_w")])
    return w.op("Add", [y, w.const(np.zeros(n_out, np.float32), f"{hint}_b")])


def _split_heads(w: _Writer, x: str, heads: int, head_dim: int) -> str:
    """(B, T, H*D) -> (B, H, T, D) with the reshape target built from Shape(x)."""
    target = w.op("Concat", [w.dim(x, 0), w.dim(x, 1), w.const(np.array([heads, head_dim], np.int64))], axis=0)
    return w.op("Transpose", [w.op("Reshape", [x, target])], perm=[0, 2, 1, 3])


def _attention(w: _Writer, x: str, mask_bias: str, hidden: int, heads: int) -> str:
    head_dim = hidden // heads
    q = _split_heads(w, _linear(w, x, hidden, hidden, "q"), heads, head_dim)
    k = _split_heads(w, _linear(w, x, hidden, hidden, "k"), heads, head_dim)
    v = _split_heads(w, _linear(w, x, hidden, hidden, "v"), heads, head_dim)
    scores = w.op("MatMul", [q, w.op("Transpose", [k], perm=[0, 1, 3, 2])])
    scores = w.op("Div", [scores, w.const(np.array(np.sqrt(head_dim), np.float32))])
    probs = w.op("Softmax", [w.op("Add", [scores, mask_bias])], axis=-1)
    context = w.op("Transpose", [w.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    merged_shape = w.op("Concat", [w.dim(context, 0), w.dim(context, 1), w.const(np.array([hidden], np.int64))], axis=0)
    merged = w.op("Reshape", [context, merged_shape])
    return _linear(w, merged, hidden, hidden, "attn_out")


def _gelu(w: _Writer, x: str) -> str:
    scaled = w.op("Div", [x, w.const(np.array(np.sqrt(2.0), np.float32))])
    erf = w.op("Add", [w.op("Erf", [scaled]), w.const(np.array(1.0, np.float32))])
    return w.op("Mul", [w.op("Mul", [x, erf]), w.const(np.array(0.5, np.float32))])


def build_encoder(layers: int = 2, hidden: int = 64, heads: int = 2, vocab: int = 1000,
                  max_positions: int = 512, ffn: int | None = None, seed: int = 0) -> onnx.ModelProto:
    """A BERT-like encoder: inputs input_ids/attention_mask [batch, seq], output [batch, seq, hidden]."""
    ffn = ffn or 4 * hidden
    w = _Writer(seed)
    positions = w.op("Range", [w.const(np.array(0, np.int64)),
                               w.op("Gather", [w.op("Shape", ["input_ids"]), w.const(np.array(1, np.int64))], axis=0),
                               w.const(np.array(1, np.int64))])
    x = w.op("Add", [w.op("Gather", [w.weight((vocab, hidden), "word_embeddings"), "input_ids"]),
                     w.op("Gather", [w.weight((max_positions, hidden), "position_embeddings"), positions])])
    x = _layer_norm(w, x, hidden)
    # (B, T) mask of ones/zeros -> (B, 1, 1, T) additive bias of 0 / -10000.
    mask = w.op("Unsqueeze", ["attention_mask", w.const(np.array([1, 2], np.int64))])
    inverted = w.op("Sub", [w.const(np.array(1.0, np.float32)), w.op("Cast", [mask], to=TensorProto.FLOAT)])
    mask_bias = w.op("Mul", [inverted, w.const(np.array(-10000.0, np.float32))])
    for _ in range(layers):
        x = _layer_norm(w, w.op("Add", [x, _attention(w, x, mask_bias, hidden, heads)]), hidden)
        hidden_ffn = _gelu(w, _linear(w, x, hidden, ffn, "ffn_in"))
        x = _layer_norm(w, w.op("Add", [x, _linear(w, hidden_ffn, ffn, hidden, "ffn_out")]), hidden)
    w.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    graph = helper.make_graph(
        w.nodes, "encoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hidden])],
        w.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="shapeshift-examples")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = build_encoder(args.layers, args.hidden, args.heads, seed=args.seed)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, args.output)
    print(f"wrote {args.output}: {len(model.graph.node)} nodes, inputs input_ids/attention_mask [batch, seq]")


if __name__ == "__main__":
    main()
