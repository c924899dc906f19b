"""Every op the project must cover has its own rule (type rule + NumPy evaluator).

The required list is the foundation issue's, plus every op used by the models in
../shared/models and by the ONNX light models; none of them may fall back on
onnx.reference or onnx's shape inference.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from shapeshift.ops.registry import REGISTRY

REQUIRED = """
Abs Acos Add And ArgMax ArgMin AveragePool BatchNormalization Cast CastLike Ceil Clip Concat Constant
ConstantOfShape Conv ConvTranspose Cos CumSum DepthToSpace Div Dropout Einsum Elu Equal Erf Exp Expand
Flatten Floor Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalMaxPool Greater
GreaterOrEqual GroupNormalization HardSigmoid HardSwish Identity If InstanceNormalization IsInf IsNaN
LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax Loop LRN LSTM MatMul Max MaxPool Mean Min
Mod Mul Neg NonMaxSuppression NonZero Not OneHot Or Pad Pow PRelu Range Reciprocal ReduceL2
ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize
Round ScatterElements ScatterND Shape Sigmoid Sign Sin Size Slice Softmax Softplus SpaceToDepth Split
Sqrt Squeeze Sub Sum Tanh Tile TopK Transpose Trilu Unsqueeze Upsample Where Xor Scan
""".split()

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "models"


def _ops_of(path: Path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    found: set[str] = set()

    def walk(graph):
        for node in graph.node:
            found.add(node.op_type)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)

    walk(model.graph)
    return found


@pytest.mark.parametrize("op", REQUIRED)
def test_required_op_has_its_own_rule(op):
    for opset in (7, 13, 17, 23):
        rule = REGISTRY.lookup("", op, opset)
        if rule is not None:
            break
    assert rule is not None and not rule.delegated, f"{op} has no rule of its own"


def test_ops_of_light_models_have_rules():
    ops = set().union(*(_ops_of(p) for p in LIGHT_DIR.glob("light_*.onnx")))
    missing = sorted(op for op in ops if ("", op) not in REGISTRY)
    assert ops and not missing, missing


def test_ops_of_shared_models_have_rules():
    if not SHARED.exists():
        pytest.skip(f"{SHARED} is absent")
    ops = set().union(*(_ops_of(p) for p in SHARED.glob("*.onnx")))
    missing = sorted(op for op in ops if ("", op) not in REGISTRY)
    assert ops and not missing, missing
