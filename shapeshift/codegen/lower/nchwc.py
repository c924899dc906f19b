"""Lowering of the blocked-layout nodes that layout_assign.py puts in a graph.

``NCHWcConv``, ``NCHWcPool``, ``NCHWcGlobalAveragePool``, ``NCHWcBlock`` and
``NCHWcUnblock`` (domain com.shapeshift) are each one call of kernels/conv_nchwc.py or
kernels/nchwc.py; their blocked values have the physical shape [N, ceil(C/c), H, W, c]
and the logical channel count is an attribute.
"""

from __future__ import annotations

from ...ir.graph import Node
from ...ops.common import product
from . import lowers
from .context import LowerContext, Lowered, Unsupported, float_literal
from .layout_assign import BLOCK, CONV, DOMAIN, GAP, POOL, UNBLOCK
from .nn import begin_pads


def _null(ctx: LowerContext, node: Node, index: int) -> str:
    value = node.inputs[index] if index < len(node.inputs) else None
    return "NULL" if value is None else ctx.ptr(value)


@lowers(BLOCK, UNBLOCK, domain=DOMAIN)
def lower_reorder(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    plain = node.inputs[0] if node.op_type == BLOCK else node.outputs[0]
    n, c, h, w = ctx.shape(plain)
    fn = "ss_nchwc_block" if node.op_type == BLOCK else "ss_nchwc_unblock"
    code = (f"{fn}_{int(node.attrs['lanes'])}({ctx.ptr(node.inputs[0])}, {ctx.ptr(node.outputs[0])}, {ctx.dim(n)}, "
            f"{int(node.attrs['channels'])}, {ctx.numel([h, w])});")
    return Lowered(code, fragments=("nchwc",))


def _window(node: Node, ctx: LowerContext, kernel) -> tuple[list, list, list, list, list]:
    """(hw, ohw, strides, dilations, begin pads) of a blocked conv or pool."""
    x, y = node.inputs[0], node.outputs[0]
    hw, ohw = list(ctx.shape(x)[2:4]), list(ctx.shape(y)[2:4])
    strides = [int(s) for s in node.attrs.get("strides", [1, 1])]
    dilations = [int(d) for d in node.attrs.get("dilations", [1, 1])]
    if len(strides) != 2 or len(dilations) != 2:
        raise Unsupported(f"{node.op_type}: not 2-D")
    pads = begin_pads(node, ctx, hw, ohw, list(kernel), strides, dilations, 2)
    return hw, ohw, strides, dilations, pads


@lowers(CONV, domain=DOMAIN)
def lower_conv_nchwc(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    a = node.attrs
    lanes, kind = int(a["lanes"]), a["kind"]
    x, y = node.inputs[0], node.outputs[0]
    kh, kw = (int(k) for k in a["kernel"])
    hw, ohw, strides, dilations, pads = _window(node, ctx, (kh, kw))
    n = ctx.dim(ctx.shape(x)[0])
    c, m = int(a["channels"]), int(a["out_channels"])
    h, wd, oh, ow = (ctx.dim(d) for d in (*hw, *ohw))
    epilogue = (f"{_null(ctx, node, 3)}, {int(a['act'])}, {float_literal(a['a0'])}, {float_literal(a['a1'])}, "
                f"{int(a['act2'])}, {float_literal(a['b0'])}, {float_literal(a['b1'])}")
    xyw = f"{ctx.ptr(x)}, {ctx.ptr(node.inputs[1])}, {ctx.ptr(node.inputs[2])}, {ctx.ptr(y)}"
    pointwise = (kh, kw) == (1, 1) and strides == [1, 1] and dilations == [1, 1] and pads == ["0", "0"]
    # The plane as the kernel takes it: a pointwise conv's as one row (below).
    plane, out_plane = ([1, product(hw)], [1, product(ohw)]) if pointwise else (hw, ohw)
    fn = f"ss_dwconv_nchwc_{lanes}" if kind == "depthwise" else f"ss_conv_nchwc_{lanes}"
    if kind == "depthwise" or (int(a["group"]) == 1 and int(a["xblk"]) == lanes):
        # A tuned dispatcher where the records have one for this class (tune/records.py).
        tuned = ctx.tuned_conv_nchwc(kind == "depthwise", lanes, (kh, kw), strides, dilations,
                                     [int(p) if p.isdigit() else p for p in pads],
                                     [ctx.shape(x)[0], c, *plane, c if kind == "depthwise" else m], out_plane)
        if tuned is not None:
            fn = tuned + fn[len("ss_"):]
    if kind == "depthwise":
        code = (f"{fn}({xyw}, {n}, {c}, {h}, {wd}, {kh}, {kw}, {oh}, {ow}, {strides[0]}, "
                f"{strides[1]}, {pads[0]}, {pads[1]}, {dilations[0]}, {dilations[1]}, {epilogue});")
        return Lowered(code, fragments=("conv_nchwc",))
    if pointwise:
        # The plane as one row: a GEMM over all pixels, with no row ends to tile around.
        h, wd, oh, ow = "1", ctx.dim(product(hw)), "1", ctx.dim(product(ohw))
    code = (f"{fn}({xyw}, {n}, {c}, {h}, {wd}, {m}, {kh}, {kw}, {oh}, {ow}, {strides[0]}, "
            f"{strides[1]}, {pads[0]}, {pads[1]}, {dilations[0]}, {dilations[1]}, {int(a['group'])}, "
            f"{int(a['xblk'])}, {epilogue});")
    return Lowered(code, fragments=("conv_nchwc",))


@lowers(POOL, domain=DOMAIN)
def lower_pool_nchwc(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    a = node.attrs
    kh, kw = (int(k) for k in a["kernel_shape"])
    hw, ohw, strides, dilations, pads = _window(node, ctx, (kh, kw))
    n, cb = ctx.shape(node.inputs[0])[:2]
    mode = 0 if a["mode"] == "max" else (1 if int(a.get("count_include_pad", 0)) else 2)
    h, wd, oh, ow = (ctx.dim(d) for d in (*hw, *ohw))
    code = (f"ss_pool_nchwc_{int(a['lanes'])}({ctx.ptr(node.inputs[0])}, {ctx.ptr(node.outputs[0])}, "
            f"{ctx.dim(product([n, cb]))}, {h}, {wd}, {oh}, {ow}, {kh}, {kw}, {strides[0]}, {strides[1]}, "
            f"{pads[0]}, {pads[1]}, {dilations[0]}, {dilations[1]}, {mode});")
    return Lowered(code, fragments=("nchwc",))


@lowers(GAP, domain=DOMAIN)
def lower_gap_nchwc(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    n, cb, h, w, _ = ctx.shape(node.inputs[0])
    code = (f"ss_gap_nchwc_{int(node.attrs['lanes'])}({ctx.ptr(node.inputs[0])}, {ctx.ptr(node.outputs[0])}, "
            f"{ctx.dim(product([n, cb]))}, {ctx.dim(product([h, w]))});")
    return Lowered(code, fragments=("nchwc",))
