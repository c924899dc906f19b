"""Neural-network ops: normalizations, convolution and Resize (pooling: pooling.py; LSTM: recurrent.py).

Each is one kernel call (kernels/normalize.py, conv.py, resize.py);
this module only turns ONNX attributes into the kernels' arguments. Conv absorbs the
activation after it (Relu, Sigmoid, or SiLU written as ``x * Sigmoid(x)``), so YOLO-style
blocks do not take an extra pass over their output, and then a residual ``Add`` of a
tensor of its output's shape with the activation after that (ResNet's Conv -> Add -> Relu,
YOLO's Conv -> SiLU -> Add), which ``ss_conv2d_residual`` adds in its store.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ...ir.graph import Node, Value
from ...ir.types import FLOAT
from ...ops.common import product
from ...symbolic import Dim, prove_eq
from ..kernels.conv import small_plane_ok
from ..kernels.conv_wino import ENTRY_NAMES, winograd_tiles
from . import lowers
from .context import LowerContext, Lowered, Unsupported, attr_axis, float_literal
from .layout import param_values

ACT_RELU, ACT_SIGMOID, ACT_SILU = 1, 2, 3


def _float_only(ctx: LowerContext, node: Node, data_inputs: Optional[int] = None) -> None:
    """Decline unless the node's data inputs (the first ``data_inputs``, default all) are float32."""
    for value in node.inputs[:data_inputs]:
        if value is not None and ctx.dtype(value) != FLOAT:
            raise Unsupported(f"{node.op_type} on a dtype other than float32")


def _optional_ptr(ctx: LowerContext, node: Node, index: int) -> str:
    if index < len(node.inputs) and node.inputs[index] is not None:
        return ctx.ptr(node.inputs[index])
    return "NULL"


def _optional_out(ctx: LowerContext, node: Node, index: int) -> str:
    if index < len(node.outputs) and node.outputs[index] is not None:
        return ctx.ptr(node.outputs[index])
    return "NULL"


@lowers("LayerNormalization")
def lower_layer_norm(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    _float_only(ctx, node)
    x = node.inputs[0]
    shape = ctx.shape(x)
    axis = int(node.attrs.get("axis", -1))
    axis = axis + len(shape) if axis < 0 else axis
    norm = product(list(shape[axis:]))
    for index in (1, 2):
        if index < len(node.inputs) and node.inputs[index] is not None:
            if product(list(ctx.shape(node.inputs[index]))) != norm:
                raise Unsupported("LayerNormalization scale or bias that broadcasts")
    if int(node.attrs.get("stash_type", 1)) != 1:
        raise Unsupported("stash_type other than float")
    eps = float_literal(node.attrs.get("epsilon", 1e-5))
    code = (f"ss_layernorm({ctx.ptr(x)}, {_optional_ptr(ctx, node, 1)}, {_optional_ptr(ctx, node, 2)}, "
            f"{ctx.ptr(node.outputs[0])}, {ctx.dim(product(list(shape[:axis])))}, {ctx.dim(norm)}, {eps}, "
            f"{_optional_out(ctx, node, 1)}, {_optional_out(ctx, node, 2)});")
    return Lowered(code, fragments=("normalize",))


def _nc_inner(ctx: LowerContext, shape: Sequence[Dim]) -> tuple[str, str, str]:
    if len(shape) < 2:
        raise Unsupported("normalization input of rank < 2")
    return ctx.dim(shape[0]), ctx.dim(shape[1]), ctx.dim(product(list(shape[2:])))


@lowers("BatchNormalization")
def lower_batch_norm(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    _float_only(ctx, node)
    if int(node.attrs.get("training_mode", 0)) or len([v for v in node.outputs if v is not None]) > 1:
        return _lower_batch_norm_training(node, ctx, opset)
    x = node.inputs[0]
    n, c, inner = _nc_inner(ctx, ctx.shape(x))
    eps = float_literal(node.attrs.get("epsilon", 1e-5))
    scale, bias, mean, var = (ctx.ptr(v) for v in node.inputs[1:5])
    code = f"ss_batchnorm({ctx.ptr(x)}, {scale}, {bias}, {mean}, {var}, {ctx.ptr(node.outputs[0])}, {n}, {c}, {inner}, {eps});"
    return Lowered(code, fragments=("normalize",))


def _lower_batch_norm_training(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    """Training mode: normalize with the batch's own mean and (population) variance over
    every axis but the channel, and output the running statistics
    ``input * momentum + batch * (1 - momentum)``, as the reference does."""
    if opset < 14:
        # Before opset 14 training outputs also include saved statistics (and "spatial").
        raise Unsupported("BatchNormalization in training mode before opset 14")
    if not int(node.attrs.get("training_mode", 0)):
        raise Unsupported("BatchNormalization running statistics outside training mode")
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    n, c, inner = _nc_inner(ctx, shape)
    eps = float_literal(node.attrs.get("epsilon", 1e-5))
    momentum = float(node.attrs.get("momentum", 0.9))
    scale, bias, mean, var = (ctx.ptr(v) for v in node.inputs[1:5])
    work_bytes = product([2, shape[1], 4])
    lines = [f"float* batch_mean = {_float_work(work_bytes)};", f"float* batch_var = batch_mean + {c};",
             f"ss_channel_moments({ctx.ptr(x)}, {n}, {c}, {inner}, batch_mean, batch_var);",
             f"ss_batchnorm({ctx.ptr(x)}, {scale}, {bias}, batch_mean, batch_var, {ctx.ptr(y)}, {n}, {c}, {inner}, {eps});"]
    # The reference computes the running statistics in float32 (momentum rounded to it).
    for index, running, batch in ((1, mean, "batch_mean"), (2, var, "batch_var")):
        out = node.outputs[index] if index < len(node.outputs) else None
        if out is not None:
            lines.append(f"for (int64_t k = 0; k < {c}; k++) {ctx.ptr(out)}[k] = "
                         f"{running}[k] * {float_literal(momentum)} + {batch}[k] * {float_literal(1 - momentum)};")
    return Lowered("\n".join(lines), fragments=("normalize", "moments"), work_bytes=work_bytes)


def _float_work(work_bytes: Dim) -> str:
    """The scratch space as a float pointer; NULL when its size is known to be 0 (no WORK
    exists then, and the kernels touch nothing)."""
    return "NULL" if isinstance(work_bytes, int) and work_bytes == 0 else "(float*)WORK"


@lowers("MeanVarianceNormalization")
def lower_mean_variance_norm(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    """(x - mean) / (sqrt(variance) + 1e-9), statistics over ``axes`` (default N, H, W).
    The kept axes must be adjacent: x is then [reduced before, kept, reduced after]."""
    _float_only(ctx, node)
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    axes = {int(a) + rank if int(a) < 0 else int(a) for a in node.attrs.get("axes", [0, 2, 3])}
    kept = [a for a in range(rank) if a not in axes]
    if kept and kept != list(range(kept[0], kept[-1] + 1)):
        raise Unsupported("MeanVarianceNormalization keeping axes that are not adjacent")
    first, last = (kept[0], kept[-1] + 1) if kept else (rank, rank)
    outer, channels, inner = (product(list(shape[a:b])) for a, b in ((0, first), (first, last), (last, rank)))
    work_bytes = product([2, channels, 4])
    code = (f"ss_mvn({ctx.ptr(x)}, {ctx.ptr(y)}, {ctx.dim(outer)}, {ctx.dim(channels)}, {ctx.dim(inner)}, "
            f"{_float_work(work_bytes)});")
    return Lowered(code, fragments=("moments",), work_bytes=work_bytes)


@lowers("InstanceNormalization")
def lower_instance_norm(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    _float_only(ctx, node)
    x = node.inputs[0]
    n, c, inner = _nc_inner(ctx, ctx.shape(x))
    eps = float_literal(node.attrs.get("epsilon", 1e-5))
    code = (f"ss_group_norm({ctx.ptr(x)}, {ctx.ptr(node.inputs[1])}, {ctx.ptr(node.inputs[2])}, "
            f"{ctx.ptr(node.outputs[0])}, {n}, {c}, {c}, {inner}, {eps});")
    return Lowered(code, fragments=("normalize",))


@lowers("GroupNormalization")
def lower_group_norm(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    _float_only(ctx, node)
    if opset < 21:
        raise Unsupported("GroupNormalization-18 scales per group")
    x = node.inputs[0]
    n, c, inner = _nc_inner(ctx, ctx.shape(x))
    groups = int(node.attrs["num_groups"])
    eps = float_literal(node.attrs.get("epsilon", 1e-5))
    code = (f"ss_group_norm({ctx.ptr(x)}, {ctx.ptr(node.inputs[1])}, {ctx.ptr(node.inputs[2])}, "
            f"{ctx.ptr(node.outputs[0])}, {n}, {c}, {groups}, {inner}, {eps});")
    return Lowered(code, fragments=("normalize",))


# -- convolution ----------------------------------------------------------------------------------


def _spatial(node: Node, ctx: LowerContext, x: Value, y: Value, kernel: Sequence[int]):
    """(H, W, OH, OW, KH, KW, strides, dilations) as 2-D, 1-D ops seen as H = 1."""
    in_shape, out_shape = ctx.shape(x), ctx.shape(y)
    spatial = len(in_shape) - 2
    if spatial not in (1, 2):
        raise Unsupported(f"{spatial}-D {node.op_type}")
    strides = list(node.attrs.get("strides", [1] * spatial))
    dilations = list(node.attrs.get("dilations", [1] * spatial))
    hw = list(in_shape[2:])
    ohw = list(out_shape[2:])
    kernel = list(kernel)
    if spatial == 1:
        hw, ohw, kernel, strides, dilations = [1] + hw, [1] + ohw, [1] + kernel, [1] + strides, [1] + dilations
    return hw, ohw, kernel, strides, dilations


def begin_pads(node: Node, ctx: LowerContext, hw, ohw, kernel, strides, dilations, spatial: int) -> list[str]:
    """Begin pads as C expressions (auto_pad SAME_* is computed from the extents)."""
    auto = node.attrs.get("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto in ("NOTSET", "VALID"):
        pads = list(node.attrs.get("pads", [0] * (2 * spatial))) if auto == "NOTSET" else [0] * (2 * spatial)
        begins = pads[:spatial]
        return ["0"] * (2 - spatial) + [str(int(p)) for p in begins]
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad {auto}")
    result = []
    for h, oh, k, s, d in zip(hw, ohw, kernel, strides, dilations):
        total = f"(({ctx.dim(oh)} - 1) * {s} + ({k} - 1) * {d} + 1 - {ctx.dim(h)})"
        total = f"({total} > 0 ? {total} : 0)"
        result.append(f"({total} / 2)" if auto == "SAME_UPPER" else f"({total} - {total} / 2)")
    return result


def _conv_activation(ctx: LowerContext, out: Value) -> tuple[list[Node], int]:
    """Relu, Sigmoid, or x * Sigmoid(x) after a conv, to fold into its store."""
    users = [u for u, _ in out.users]
    if ctx.single_use(out) and users[0].op_type in ("Relu", "Sigmoid") and users[0].domain in ("", "ai.onnx"):
        return [users[0]], ACT_RELU if users[0].op_type == "Relu" else ACT_SIGMOID
    if len(users) == 2 and not ctx.single_use(out) and len(out.users) == 2 and not ctx.escapes(out):
        sig = next((u for u in users if u.op_type == "Sigmoid"), None)
        mul = next((u for u in users if u.op_type == "Mul"), None)
        if sig is not None and mul is not None and ctx.single_use(sig.outputs[0]) \
                and sig.outputs[0].users[0][0] is mul and set(map(id, mul.inputs)) == {id(out), id(sig.outputs[0])}:
            return [sig, mul], ACT_SILU
    return [], 0


def _conv_residual(ctx: LowerContext, y: Value, cur: Value) -> tuple[Optional[Value], list[Node], int]:
    """``Add(cur, other)`` after a conv whose output is ``y`` (``cur``: y, or its absorbed
    activation's output), then the activation after the Add, to fold into the conv's store
    as ``res_act(act(conv) + other)``: (other, the nodes, res_act), or (None, [], 0).

    ``other`` must be a float32 tensor of y's very shape (no broadcast: the kernels read it
    as laid out as y), not ``cur`` itself, and exist before the conv's step runs (the step
    runs where the conv is; an Add of two convs' outputs fuses into the later conv). ``cur``
    must be read by the Add alone and not be a graph output, since it is never stored."""
    none: tuple[Optional[Value], list[Node], int] = (None, [], 0)
    if not ctx.single_use(cur):
        return none
    add = cur.users[0][0]
    if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.inputs) != 2 or add.outputs[0] is None:
        return none
    other = add.inputs[1] if add.inputs[0] is cur else add.inputs[0]
    if other is None or other is cur or not ctx.defined_before(other):
        return none
    try:
        shape = ctx.shape(y)
        if ctx.dtype(other) != FLOAT or not all(_same_shape(ctx.shape(v), shape) for v in (other, add.outputs[0])):
            return none
    except Unsupported:  # an operand of unknown rank: the Add runs on its own
        return none
    nodes, res_act = _conv_activation(ctx, add.outputs[0])
    return other, [add, *nodes], res_act


def _same_shape(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    return len(a) == len(b) and all(prove_eq(x, y) for x, y in zip(a, b))


@lowers("Conv")
def lower_conv(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    _float_only(ctx, node)
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    w_shape = ctx.shape(w)
    if not all(isinstance(d, int) for d in w_shape):
        raise Unsupported("Conv weight of symbolic shape")
    hw, ohw, kernel, strides, dilations = _spatial(node, ctx, x, y, w_shape[2:])
    spatial = len(ctx.shape(x)) - 2
    pads = begin_pads(node, ctx, hw, ohw, kernel, strides, dilations, spatial)
    group = int(node.attrs.get("group", 1))
    in_shape = ctx.shape(x)
    absorbed, act = _conv_activation(ctx, y)
    residual, added, res_act = _conv_residual(ctx, y, absorbed[-1].outputs[0] if absorbed else y)
    absorbed += added
    out = absorbed[-1].outputs[0] if absorbed else y
    n, c, m = ctx.dim(in_shape[0]), ctx.dim(in_shape[1]), str(w_shape[0])
    h, wd, oh, ow = (ctx.dim(d) for d in (*hw, *ohw))
    kh, kw = kernel
    args = (f"{n}, {c}, {h}, {wd}, {m}, {kh}, {kw}, {oh}, {ow}, {strides[0]}, {strides[1]}, {pads[0]}, {pads[1]}, "
            f"{dilations[0]}, {dilations[1]}, {group}")
    weights = ctx.const(w)
    tuned = None
    tiles = (winograd_tiles(kernel, strides, dilations, group, in_shape[1], w_shape[0], ohw, in_shape[0])
             if weights is not None else ())
    fragments: tuple[str, ...] = ("conv",)
    work = _work_bytes(ctx, "ss_conv2d_work_size", in_shape[1], kh, kw, ohw, group)
    if tiles:
        # Winograd (kernels/conv_wino.py, F(4x4) or F(2x2) tiles): its weights transformed
        # and packed once at load, for both tile sizes where the choice waits for the run
        # (ss_conv2d_wino_pick); its entry points take the residual (NULL for none); its
        # scratch holds the batch's staged images, an im2col's size per image. Not a
        # tuning task: no schedule of the direct kernels comes near it where it runs.
        slots = [ctx.packed_constant(weights.reshape(w_shape[0], -1).T, f"ss_conv_{ENTRY_NAMES[t]}_")
                 for t in tiles]
        # A plane the types leave open may turn out too small for the tiles at run time:
        # the direct kernels' packed weights too, for the kernel to fall back on.
        direct = "NULL" if all(isinstance(d, int) for d in ohw) else \
            _packed_conv_weight(ctx, w, w_shape, group, product(list(ohw)))
        fn = f"ss_conv2d_{ENTRY_NAMES[tiles[0]]}" if len(tiles) == 1 else "ss_conv2d_wino_pick"
        packed = ", ".join([*(f"(const float*)v[{slot}]" for slot in slots), direct])
        fragments = ("conv", "conv_wino")
        work = product([in_shape[0], work])
    else:
        if weights is not None and group == 1:
            static_pads = [int(p) if p.isdigit() else p for p in pads]
            tuned = ctx.tuned_conv(kernel, strides, dilations, static_pads,
                                   [in_shape[0], in_shape[1], *hw, w_shape[0]], ohw, act)
        if tuned is not None:
            # A tuned conv dispatcher (tune/records.py): its kernels read the weights in their
            # own packed layout, whatever the plane (each picks its path per call). It has
            # ss_conv2d_residual's twin too (tune/dispatch.py), so a fused residual keeps it:
            # the residual changes no path's choice, only what the store adds.
            slot = ctx.packed_constant(weights.reshape(w_shape[0], -1).T, tuned.name)
            fn, packed = f"{tuned.name}conv2d", f"(const float*)v[{slot}]"
        else:
            fn, packed = "ss_conv2d", _packed_conv_weight(ctx, w, w_shape, group, product(list(ohw)))
    tail = ", NULL, 0" if tiles else ""
    if residual is not None:
        fn, tail = fn if tiles else f"{fn}_residual", f", {ctx.ptr(residual)}, {res_act}"
    code = (f"{fn}({ctx.ptr(x)}, {ctx.ptr(w)}, {_optional_ptr(ctx, node, 2)}, {ctx.ptr(out)}, {args}, {act}, "
            f"(float*)WORK, {packed}{tail});")
    return Lowered(code, fragments=fragments, absorbed=tuple(absorbed), work_bytes=work)


def _packed_conv_weight(ctx: LowerContext, w: Value, w_shape: Sequence[int], group: int, pixels: Dim) -> str:
    """A pointer to the conv's weights packed as a GEMM's B ([C*KH*KW, M]), or NULL. The
    paths of ss_conv2d that read them (kernels/conv.py) are the implicit GEMM of every
    dense k x k conv and the small-plane GEMM, so a grouped conv, a 1 x 1 one whose plane is
    known to be larger, or one of computed weights gets none."""
    weights = ctx.const(w)
    kxk = product(list(w_shape[2:])) > 1
    if weights is None or group != 1 or (
            not kxk and isinstance(pixels, int) and not small_plane_ok(pixels, w_shape[0])):
        return "NULL"
    slot, _ = ctx.packed_weight(weights.reshape(w_shape[0], -1).T, default_layout=True)
    return f"(const float*)v[{slot}]"


def _work_bytes(ctx: LowerContext, fn: str, c: Dim, kh: int, kw: int, ohw, group: int) -> Dim:
    # im2col scratch: one (C/group * KH * KW) x (OH * OW) float matrix at a time.
    if kh == 1 and kw == 1:
        return product([c, ohw[0], ohw[1], 4])  # covers strided or padded 1x1 convs too
    return product([c, kh, kw, ohw[0], ohw[1], 4])


@lowers("ConvTranspose")
def lower_conv_transpose(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    _float_only(ctx, node)
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    w_shape = ctx.shape(w)
    if not all(isinstance(d, int) for d in w_shape) or node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        raise Unsupported("ConvTranspose with symbolic weights or auto_pad")
    group = int(node.attrs.get("group", 1))
    hw, ohw, kernel, strides, dilations = _spatial(node, ctx, x, y, w_shape[2:])
    spatial = len(ctx.shape(x)) - 2
    pads = list(node.attrs.get("pads", [0] * (2 * spatial)))[:spatial]
    pads = [0] * (2 - spatial) + [int(p) for p in pads]
    in_shape = ctx.shape(x)
    m = w_shape[1] * group
    h, wd, oh, ow = (ctx.dim(d) for d in (*hw, *ohw))
    kh, kw = kernel
    code = (f"ss_conv_transpose2d({ctx.ptr(x)}, {ctx.ptr(w)}, {_optional_ptr(ctx, node, 2)}, {ctx.ptr(y)}, "
            f"{ctx.dim(in_shape[0])}, {ctx.dim(in_shape[1])}, {h}, {wd}, {m}, {kh}, {kw}, {oh}, {ow}, "
            f"{strides[0]}, {strides[1]}, {pads[0]}, {pads[1]}, {dilations[0]}, {dilations[1]}, {group}, (float*)WORK);")
    work = product([m, kh, kw, hw[0], hw[1], 4])
    return Lowered(code, fragments=("conv",), work_bytes=work)


# -- Resize ----------------------------------------------------------------------------------

RESIZE_MODES = {"nearest": 0, "linear": 1, "cubic": 2}
COORDINATE_MODES = {"half_pixel": 0, "asymmetric": 1, "align_corners": 2, "pytorch_half_pixel": 3,
                    "tf_half_pixel_for_nn": 4}
NEAREST_MODES = {"round_prefer_floor": 0, "round_prefer_ceil": 1, "floor": 2, "ceil": 3}


def _text(node: Node, name: str, default: str) -> str:
    value = node.attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


@lowers("Resize")
def lower_resize(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    _float_only(ctx, node, data_inputs=1)
    if opset < 11:
        raise Unsupported("Resize-10")
    if int(node.attrs.get("antialias", 0)) or node.attrs.get("axes") is not None \
            or _text(node, "keep_aspect_ratio_policy", "stretch") != "stretch":
        raise Unsupported("Resize with antialias, axes or an aspect-ratio policy")
    mode = RESIZE_MODES.get(_text(node, "mode", "nearest"))
    coord = COORDINATE_MODES.get(_text(node, "coordinate_transformation_mode", "half_pixel"))
    nearest = NEAREST_MODES.get(_text(node, "nearest_mode", "round_prefer_floor"))
    if mode is None or coord is None or nearest is None:
        raise Unsupported("Resize mode")
    x, y = node.inputs[0], node.outputs[0]
    in_shape, out_shape = ctx.shape(x), ctx.shape(y)
    if len(in_shape) not in (3, 4) or not all(_same_dim(a, b) for a, b in zip(in_shape[:-2], out_shape[:-2])):
        raise Unsupported("Resize of other than the last two axes")
    scales = param_values(node, 2, ctx) if len(node.inputs) > 2 else None
    h, w, oh, ow = (ctx.dim(d) for d in (*in_shape[-2:], *out_shape[-2:]))
    if scales:
        sh, sw = (float_literal(s) for s in scales[-2:])
    else:
        sh, sw = f"((float){oh} / (float){h})", f"((float){ow} / (float){w})"
    nc = ctx.dim(product(list(in_shape[:-2])))
    cubic_a = float_literal(node.attrs.get("cubic_coeff_a", -0.75))
    exclude = int(node.attrs.get("exclude_outside", 0))
    code = (f"ss_resize2d({ctx.ptr(x)}, {ctx.ptr(y)}, {nc}, {h}, {w}, {oh}, {ow}, {sh}, {sw}, {mode}, {coord}, "
            f"{nearest}, {cubic_a}, {exclude});")
    return Lowered(code, fragments=("resize",))


def _same_dim(a: Dim, b: Dim) -> bool:
    return prove_eq(a, b)


@lowers("LRN")
def lower_lrn(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    """Local response normalization across channels, as one generated loop: each output
    divides by (bias + alpha/size * sum of squares over its channel window)^beta."""
    _float_only(ctx, node)
    x, y = node.inputs[0], node.outputs[0]
    n, c, inner = _nc_inner(ctx, ctx.shape(x))
    size = int(node.attrs["size"])
    alpha = float(node.attrs.get("alpha", 1e-4)) / size
    beta, bias = float(node.attrs.get("beta", 0.75)), float(node.attrs.get("bias", 1.0))
    below, above = (size - 1) // 2, size - 1 - (size - 1) // 2  # floor and ceil of (size-1)/2
    code = f"""const float* x = {ctx.ptr(x)};
float* y = {ctx.ptr(y)};
const int64_t N = {n}, C = {c}, S = {inner};
#pragma omp parallel for collapse(2) if(N * C * S >= 32768)
for (int64_t b = 0; b < N; b++)
    for (int64_t ch = 0; ch < C; ch++) {{
        const int64_t lo = ch - {below} < 0 ? 0 : ch - {below};
        const int64_t hi = ch + {above} > C - 1 ? C - 1 : ch + {above};
        const float* src = x + (b * C + ch) * S;
        float* dst = y + (b * C + ch) * S;
        for (int64_t s = 0; s < S; s++) {{
            float sum = 0.0f;
            for (int64_t k = lo; k <= hi; k++) {{ const float v = x[(b * C + k) * S + s]; sum += v * v; }}
            dst[s] = src[s] / powf({float_literal(bias)} + {float_literal(alpha)} * sum, {float_literal(beta)});
        }}
    }}"""
    return Lowered(code)


# -- RMSNormalization ----------------------------------------------------------------------------


def _scale_is_suffix(ctx: LowerContext, scale_shape: Sequence[Dim], norm_shape: Sequence[Dim]) -> bool:
    """Whether the scale is exactly the trailing dims of the normalized block, so that it
    repeats every ``numel(scale)`` elements (the only broadcast the loop below does)."""
    if len(scale_shape) > len(norm_shape):
        return False
    tail = norm_shape[len(norm_shape) - len(scale_shape):]
    return all(_same_dim(a, b) for a, b in zip(scale_shape, tail))


@lowers("RMSNormalization")
def lower_rms_norm(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    """Y = X / sqrt(mean(X^2 over axes [axis, rank)) + epsilon) * Scale, as one C loop.

    The mean of squares is accumulated in double, then rounded like the reference's
    float32 ``sqrt`` and ``reciprocal``."""
    x, scale, y = node.inputs[0], node.inputs[1], node.outputs[0]
    if ctx.dtype(x) not in (FLOAT,) or ctx.dtype(scale) != ctx.dtype(x):
        raise Unsupported("RMSNormalization on a dtype other than float32")
    if int(node.attrs.get("stash_type", 1)) != 1:
        raise Unsupported("RMSNormalization stash_type other than float")
    shape = ctx.shape(x)
    axis = attr_axis(node, len(shape), default=-1)
    if not _scale_is_suffix(ctx, ctx.shape(scale), shape[axis:]):
        raise Unsupported("RMSNormalization scale that broadcasts other than as a suffix")
    eps = float_literal(node.attrs.get("epsilon", 1e-5))
    code = "\n".join([
        f"const float* in = {ctx.ptr(x)}; const float* w = {ctx.ptr(scale)}; float* out = {ctx.ptr(y)};",
        f"const int64_t rows = {ctx.numel(shape[:axis])}, n = {ctx.numel(shape[axis:])};",
        f"const int64_t wn = {ctx.numel(ctx.shape(scale))};",
        "#pragma omp parallel for if(rows * n >= 65536)",
        "for (int64_t r = 0; r < rows; r++) {",
        "    const float* xr = in + r * n; float* yr = out + r * n;",
        "    double acc = 0.0;",
        "    for (int64_t k = 0; k < n; k++) acc += (double)xr[k] * (double)xr[k];",
        f"    const float ms = (float)(acc / (double)(n > 0 ? n : 1)) + {eps};",
        "    const float inv = 1.0f / sqrtf(ms);",
        "    for (int64_t k = 0; k < n; k++) yr[k] = (xr[k] * inv) * w[k % wn];",
        "}"])
    return Lowered(code)
