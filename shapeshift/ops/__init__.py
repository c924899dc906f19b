"""Op rules, one module per op family; importing this package fills the registry."""

from . import (  # noqa: F401  (imported for their registrations)
    activations,
    conv_pool,
    constant_ops,
    control,
    detection,
    elementwise,
    indexing,
    layout_ops,
    linalg,
    normalization,
    quantize,
    reduce,
    resize,
    rnn,
    shape_ops,
    symbolic_tensor,
)
from .context import EvalContext, InferContext
from .registry import REGISTRY, OpRule, define, lookup

__all__ = ["EvalContext", "InferContext", "OpRule", "REGISTRY", "define", "lookup"]
