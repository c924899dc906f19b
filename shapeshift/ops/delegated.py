"""Rules for ops outside our own tables, delegated to the onnx package.

Evaluation goes to onnx's reference implementation (``onnx.reference``) and
static type inference to ``onnx.shape_inference.infer_node_outputs``.  Only ops
that shapeshift does not define itself land here; every op of the project's
required list has its own rule (see docs/ops.md).  Delegated type inference
sees only static information, so symbolic dims become fresh symbols.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

import numpy as np
import onnx
from onnx import helper

from ..frontend.attributes import make_attribute
from ..frontend.type_protos import type_from_proto, type_proto
from ..ir.types import TensorType
from ..symbolic import Expr
from .registry import OpRule


@lru_cache(maxsize=None)
def _reference_class(domain: str, op_type: str, opset: int):
    """onnx.reference's class for the op; each domain has its own loader."""
    try:
        if domain == "ai.onnx.ml":
            from onnx.reference.ops.aionnxml import load_op as load_ml_op

            return load_ml_op(domain, op_type, opset)
        if domain == "ai.onnx.preview.training":
            from onnx.reference.ops.aionnx_preview_training import load_op as load_training_op

            return load_training_op(domain, op_type, opset)
        from onnx.reference import ReferenceEvaluator
        from onnx.reference.ops import load_op

        # evaluator_cls lets ops with bodies (SequenceMap) run them.
        return load_op(domain, op_type, opset, evaluator_cls=ReferenceEvaluator)
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return None


def delegated_rule(domain: str, op_type: str, opset: int) -> Optional[OpRule]:
    """A rule backed by the onnx package, or None when onnx does not know the op."""
    if domain == "ai.onnx":
        domain = ""
    if _reference_class(domain, op_type, opset) is None:
        return None
    return OpRule(op_type, _infer, _evaluate, domain, 1, (), delegated=True)


def _node_proto(node, opset: int) -> onnx.NodeProto:
    inputs = [v.name if v is not None else "" for v in node.inputs]
    outputs = [v.name for v in node.outputs]
    proto = helper.make_node(node.op_type, inputs, outputs, domain=node.domain, name=node.name)
    for name, value in node.attrs.items():
        if any(hasattr(v, "nodes") for v in (value if isinstance(value, list) else [value])):
            from ..frontend.onnx_export import graph_to_proto

            proto.attribute.append(make_attribute(name, value, node.attr_types.get(name), graph_to_proto))
        else:
            proto.attribute.append(make_attribute(name, value, node.attr_types.get(name)))
    return proto


def _evaluate(ctx, *inputs):
    node = ctx.node
    cls = _reference_class(node.domain, node.op_type, ctx.opset)
    proto = _node_proto(node, ctx.opset)
    from onnx.reference import ReferenceEvaluator

    run_params = {"log": lambda *a: None, "opsets": {node.domain: ctx.opset}, "verbose": 0, "new_ops": None,
                  "evaluator_cls": ReferenceEvaluator}
    op = cls(proto, run_params)
    results = op.run(*inputs)
    if not isinstance(results, (tuple, list)):
        results = (results,)
    return [_normalize(r) for r in results]


def _normalize(result):
    """NumPy scalars become arrays; text arrays use object dtype like ONNX strings."""
    if isinstance(result, np.generic):
        result = np.asarray(result)
    if isinstance(result, np.ndarray) and result.dtype.kind in "US":
        result = result.astype(object)
    if isinstance(result, list):
        return [_normalize(r) for r in result]
    return result


# -- type inference through onnx.shape_inference ----------------------------------


def _infer(ctx):
    node = ctx.node
    proto = _node_proto(node, ctx.opset)
    input_types = {}
    initializers = {}
    for i, value in enumerate(node.inputs):
        if value is None:
            continue
        input_types[value.name] = type_proto(ctx.input_type(i))
        if value.const is not None and value.const.size <= 4096:
            try:
                initializers[value.name] = onnx.numpy_helper.from_array(value.const, value.name)
            except Exception:  # noqa: BLE001 - exotic contents: infer without them
                pass
    try:
        inferred = onnx.shape_inference.infer_node_outputs(
            onnx.defs.get_schema(node.op_type, ctx.opset, node.domain), proto, input_types,
            initializers, opset_imports=[helper.make_opsetid(node.domain, ctx.opset)])
    except Exception:  # noqa: BLE001 - delegated inference failing means "unknown"
        return [None] * ctx.num_outputs
    # Symbolic input dims travel as dim_param text; map the text back to them.
    named: dict[str, object] = {}
    for i in range(ctx.num_inputs):
        t = ctx.input_type(i)
        if isinstance(t, TensorType) and t.shape is not None:
            named.update((str(d), d) for d in t.shape if isinstance(d, Expr))

    def dim_of(d):
        # A dim_param names one unknown shared by several dims; an empty one is its own.
        if not d.dim_param:
            return ctx.fresh_dim()
        if d.dim_param not in named:
            named[d.dim_param] = ctx.fresh_dim()
        return named[d.dim_param]

    return [type_from_proto(inferred[v.name], dim_of) if v.name in inferred else None for v in node.outputs]
