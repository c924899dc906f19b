"""Object-detection ops: NonMaxSuppression and RoiAlign.

NonMaxSuppression's output length depends on the data, so its type rule gives
a fresh dimension bounded by ``batch * classes * min(max_output, boxes)``.
The evaluator follows onnxruntime: IoU in float32 with its exact formula (so
boundary cases at ``iou == iou_threshold`` agree), candidates sorted by score
with ties going to the lower box index, and a box kept when its IoU with every
kept box is at most the threshold.

RoiAlign follows the ONNX reference, including its "max" mode, which takes the
maximum of the *weighted* bilinear corners (as onnxruntime does).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..ir.types import INT64
from ..symbolic import DEFAULT_HI, Dim, Expr, bounds, minimum, mul
from .common import tensor
from .context import EvalContext, InferContext
from .registry import define

# -- NonMaxSuppression -----------------------------------------------------------


def _max_output_bound(ctx: InferContext) -> Optional[int]:
    """max_output_boxes_per_class as a constant (absent means 0), else None."""
    if not ctx.has_input(2):
        return 0
    dims = ctx.input_dims(2)
    if dims is None or len(dims) != 1 or isinstance(dims[0], Expr):
        return None
    return max(int(dims[0]), 0)


def _nms_type(ctx: InferContext) -> list:
    boxes, scores = ctx.input_shape(0), ctx.input_shape(1)
    if boxes is not None and len(boxes) != 3:
        ctx.fail(f"boxes must have rank 3, got {len(boxes)}")
    if scores is not None and len(scores) != 3:
        ctx.fail(f"scores must have rank 3, got {len(scores)}")
    max_out = _max_output_bound(ctx)
    if max_out == 0:
        return [tensor(INT64, (0, 3))]
    if boxes is None or scores is None:
        return [tensor(INT64, (ctx.fresh_dim("nms"), 3))]
    per_class: Dim = boxes[1] if max_out is None else minimum(boxes[1], max_out)
    limit = mul(mul(scores[0], scores[1]), per_class)
    hi = min(bounds(limit)[1], DEFAULT_HI)
    return [tensor(INT64, (ctx.fresh_dim("nms", 0, hi), 3))]


def _corners(boxes: np.ndarray, center_point_box: int) -> tuple[np.ndarray, ...]:
    """(x_min, y_min, x_max, y_max) per box, in float32."""
    if center_point_box:
        x, y, w, h = (boxes[:, i] for i in range(4))
        half_w, half_h = w / np.float32(2), h / np.float32(2)
        return x - half_w, y - half_h, x + half_w, y + half_h
    y1, x1, y2, x2 = (boxes[:, i] for i in range(4))
    return np.minimum(x1, x2), np.minimum(y1, y2), np.maximum(x1, x2), np.maximum(y1, y2)


def _iou_above(corners: tuple[np.ndarray, ...], area: np.ndarray, i: int, candidates: np.ndarray,
               iou_threshold: np.float32) -> np.ndarray:
    """For each box in ``candidates``: does box ``i`` suppress it (IoU above the threshold)?

    One row of the pairwise IoU at a time: a detector feeds tens of thousands of
    boxes, so the full n x n matrix would not fit in memory.
    """
    x_min, y_min, x_max, y_max = corners
    ix = np.minimum(x_max[i], x_max[candidates]) - np.maximum(x_min[i], x_min[candidates])
    iy = np.minimum(y_max[i], y_max[candidates]) - np.maximum(y_min[i], y_min[candidates])
    overlap = (ix > 0) & (iy > 0)
    inter = np.where(overlap, ix * iy, np.float32(0))
    union = area[i] + area[candidates] - inter
    valid = overlap & (inter > 0) & (area[i] > 0) & (area[candidates] > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / np.where(valid, union, np.float32(1))
    return valid & (iou > iou_threshold)


def _select(scores: np.ndarray, corners: tuple[np.ndarray, ...], area: np.ndarray, max_out: int,
            iou_threshold: np.float32, score_threshold: Optional[np.float32]) -> list[int]:
    """Greedy selection for one (batch, class) in descending score order."""
    order = np.argsort(-scores, kind="stable")  # stable: ties keep the lower index first
    if score_threshold is not None:
        order = order[scores[order] > score_threshold]
    kept: list[int] = []
    while order.size and len(kept) < max_out:
        best, order = int(order[0]), order[1:]
        kept.append(best)
        order = order[~_iou_above(corners, area, best, order, iou_threshold)]
    return kept


def _scalar(x, dtype) -> Optional[np.generic]:
    if x is None or np.size(x) == 0:
        return None
    return np.asarray(x).reshape(-1)[0].astype(dtype)


def _nms(ctx: EvalContext, boxes, scores, max_out=None, iou_threshold=None, score_threshold=None) -> list:
    limit = _scalar(max_out, np.int64)
    limit = 0 if limit is None else max(int(limit), 0)
    iou = _scalar(iou_threshold, np.float32)
    iou = np.float32(0) if iou is None else iou
    threshold = _scalar(score_threshold, np.float32)
    center = int(ctx.attr("center_point_box", 0))
    boxes = boxes.astype(np.float32, copy=False)
    scores = scores.astype(np.float32, copy=False)
    rows: list[tuple[int, int, int]] = []
    if limit > 0:
        for b in range(boxes.shape[0]):
            corners = _corners(boxes[b], center)
            area = (corners[2] - corners[0]) * (corners[3] - corners[1])
            for c in range(scores.shape[1]):
                rows.extend((b, c, i) for i in _select(scores[b, c], corners, area, limit, iou, threshold))
    return [np.array(rows, dtype=np.int64).reshape(-1, 3)]


define("NonMaxSuppression", infer=_nms_type, evaluate=_nms, params=(2, 3, 4))


# -- RoiAlign --------------------------------------------------------------------


def _roi_align_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    x, rois, indices = ctx.input_shape(0), ctx.input_shape(1), ctx.input_shape(2)
    if x is not None and len(x) != 4:
        ctx.fail(f"X must have rank 4, got {len(x)}")
    if rois is not None and len(rois) == 2:
        num = rois[0]
    elif indices is not None and len(indices) == 1:
        num = indices[0]
    else:
        num = ctx.fresh_dim("rois")
    channels = x[1] if x is not None else ctx.fresh_dim("channels")
    out = (num, channels, int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1)))
    return [tensor(dtype, out)]


def _sample_axis(start: float, bin_size: float, bins: int, grid: int, size: int):
    """Bilinear taps of the sample points along one axis of one roi.

    Returns (low, high, w_low, w_high), each [bins, grid]; a sample outside
    [-1, size] contributes zero (index 0, weight 0), as in the reference.
    """
    offsets = (np.arange(grid) + 0.5) * bin_size / grid
    coords = start + np.arange(bins)[:, None] * bin_size + offsets[None, :]
    valid = (coords >= -1.0) & (coords <= size)
    coords = np.maximum(coords, 0.0)
    low = coords.astype(np.int64)
    at_edge = low >= size - 1
    low = np.where(at_edge, size - 1, low)
    high = np.where(at_edge, size - 1, low + 1)
    coords = np.where(at_edge, low, coords)
    frac = coords - low
    w_low = np.where(valid, 1.0 - frac, 0.0)
    w_high = np.where(valid, frac, 0.0)
    return np.where(valid, low, 0), np.where(valid, high, 0), w_low, w_high


def _roi_grid(extent: float, bins: int, sampling_ratio: int) -> int:
    return sampling_ratio if sampling_ratio > 0 else int(np.ceil(extent / bins))


def _roi_align_one(ctx: EvalContext, image: np.ndarray, roi: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """[C, out_h, out_w] for one roi over ``image`` [C, H, W] (float64)."""
    half_pixel = ctx.opset >= 16 and ctx.attr("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    scale = float(ctx.attr("spatial_scale", 1.0))
    sampling = int(ctx.attr("sampling_ratio", 0))
    offset = 0.5 if half_pixel else 0.0
    x0, y0, x1, y1 = (float(v) * scale - offset for v in roi)
    roi_w, roi_h = x1 - x0, y1 - y0
    if not half_pixel:
        # Malformed rois are forced to 1x1 in the legacy mode.
        roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
    grid_h, grid_w = _roi_grid(roi_h, out_h, sampling), _roi_grid(roi_w, out_w, sampling)
    height, width = image.shape[1:]
    ys = _sample_axis(y0, roi_h / out_h, out_h, grid_h, height)
    xs = _sample_axis(x0, roi_w / out_w, out_w, grid_w, width)
    # corners[k] = weight * value, each [C, out_h, grid_h, out_w, grid_w]
    corners = [
        ys[2 + a][:, :, None, None] * xs[2 + b][None, None, :, :]
        * image[:, ys[a][:, :, None, None], xs[b][None, None, :, :]]
        for a in (0, 1) for b in (0, 1)
    ]
    if ctx.attr("mode", "avg") == "max":
        return np.max(np.maximum.reduce(corners), axis=(2, 4))
    return np.sum(corners, axis=0).sum(axis=(2, 4)) / max(grid_h * grid_w, 1)


def _roi_align(ctx: EvalContext, x, rois, batch_indices) -> list:
    out_h, out_w = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))
    data = x.astype(np.float64)
    result = np.zeros((rois.shape[0], x.shape[1], out_h, out_w), dtype=np.float64)
    for n in range(rois.shape[0]):
        result[n] = _roi_align_one(ctx, data[int(batch_indices[n])], rois[n], out_h, out_w)
    return [result.astype(x.dtype)]


define("RoiAlign", infer=_roi_align_type, evaluate=_roi_align)
