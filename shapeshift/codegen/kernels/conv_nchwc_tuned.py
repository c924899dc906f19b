"""The blocked-layout convs (kernels/conv_nchwc.py) as tunable kernels: a schedule of their
knobs, and the kernels written for it under a prefix, so that several live in one library.

What a schedule holds (``NchwcSchedule``): the dense register tile's output pixels ``rx``
(each tile is rx pixels x 2 output blocks; the target's default fills the register file,
fewer leave registers for the addresses, more spill), the depthwise tile's pixels
``dw_pixels``, and the pointwise kernel's cache blocking: its chunk of input blocks takes
weights of 1/``l1_share`` of L1, its range of pixels input of 1/``l2_share`` of L2; and
``par_min``, the multiply-adds below which a conv runs on one thread.
``codegen/defaults.py``'s ``default_nchwc_schedule`` is what every untuned blocked conv runs.

``unit_source(schedule, target, prefix)`` is the whole unit for the target's block width L:
the layout's vector helpers (guarded, as a program's declarations may hold them) and
conv_nchwc.py's fragment with every ``ss_cnc``/``ss_dwc`` helper and macro and both entry
points renamed to the prefix. It defines ``<prefix>conv_nchwc_L`` and ``<prefix>dwconv_nchwc_L``
(``ss_conv_nchwc_L``'s and ``ss_dwconv_nchwc_L``'s arguments and meaning). The weights'
packing (``pack_dense``, ``pack_depthwise``) does not depend on the schedule: one packed copy
serves every kernel of a set.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ...target import Target
from . import conv_nchwc, nchwc

DEFAULT_PREFIX = "ss_"
_PREFIX_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*_")
# The dense tile's accumulators are an array of 2 x rx vectors, its narrow planes' offsets
# arrays of rx: at most 14 pixels (28 accumulators and 2 weights in 32 registers).
MAX_RX = 14
MAX_DW_PIXELS = 16


@dataclass(frozen=True)
class NchwcSchedule:
    rx: int  # dense and pointwise tile: output pixels (x 2 output blocks)
    dw_pixels: int = conv_nchwc.DW_PIXELS  # depthwise tile: output pixels
    l1_share: int = 4  # pointwise: a chunk's weights for two output blocks take L1 / l1_share
    l2_share: int = 4  # pointwise: a range's input chunk takes L2 / l2_share
    par_min: int = 1 << 17  # multiply-adds below which a conv runs on one thread

    def __post_init__(self) -> None:
        # The border tiles are 4 pixels wide: a full tile narrower than that has no path.
        if not 4 <= self.rx <= MAX_RX:
            raise ValueError(f"rx must be in [4, {MAX_RX}], got {self.rx}")
        if not 4 <= self.dw_pixels <= MAX_DW_PIXELS:
            raise ValueError(f"dw_pixels must be in [4, {MAX_DW_PIXELS}], got {self.dw_pixels}")
        if min(self.l1_share, self.l2_share) < 1 or self.par_min < 0:
            raise ValueError("l1_share and l2_share must be >= 1, par_min >= 0")


def default_rx(target: Target) -> int:
    """The untuned dense tile of the target's block width."""
    return conv_nchwc.default_pixels(nchwc.block_width(target))


def unit_source(schedule: NchwcSchedule, target: Optional[Target] = None, prefix: str = DEFAULT_PREFIX,
                entries: tuple[str, ...] = conv_nchwc.ENTRIES) -> str:
    """The blocked conv unit of ``schedule`` for ``target``'s block width (module docstring);
    the default prefix keeps the ``ss_`` names (a measurement library holds one schedule).
    ``entries``: "dense", "depthwise" or both (a dispatcher serves one: each entry is about
    half the unit's build time)."""
    from ...target import host_target

    target = target or host_target()
    lanes = nchwc.block_width(target)
    text = nchwc.helpers(lanes) + conv_nchwc.fragment(
        target, par_min=schedule.par_min, widths=(lanes,), rx=schedule.rx, dw_pixels=schedule.dw_pixels,
        l1_share=schedule.l1_share, l2_share=schedule.l2_share, entries=entries).text()
    if prefix == DEFAULT_PREFIX:
        return text
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"conv prefix {prefix!r} must be a C identifier prefix ending in '_'")
    # Every name the fragment defines starts with ss_cnc / ss_dwc (SS_CNC_ / SS_DWC_ for its
    # macros) or is an entry point; the layout's helpers (ss_nchwc_*, ss_vf*) are shared.
    upper = prefix.upper()
    for name in ("cnc_", "dwc_", "conv_nchwc_", "dwconv_nchwc_"):
        text = text.replace(f"ss_{name}", f"{prefix}{name}")
    for macro in ("CNC_", "DWC_"):
        text = text.replace(f"SS_{macro}", f"{upper}{macro}")
    return text
