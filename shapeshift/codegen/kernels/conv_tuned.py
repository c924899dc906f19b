"""``ss_conv2d`` as a tunable kernel: a schedule of the conv paths' knobs, and the conv unit
written for it, under a prefix so that several live in one library.

What decides a dense conv's speed here is the GEMM schedule its paths share (the
small-plane GEMM and the 1 x 1 GEMM run it; the implicit GEMM takes its kc and, with 16
columns, its prepacked panels; conv_panels runs its register tile), and the switches between
the paths: the planes up to which the small-plane GEMM and conv_panels take over from the
implicit GEMM, the implicit GEMM's block of pixels, and the planes up to which a 1 x 1 conv
runs the small-plane GEMM. ``ConvSchedule`` holds them; ``codegen/defaults.py``'s
``default_conv_schedule`` is what every untuned conv runs.

``unit_source(schedule, target, prefix)`` is the whole unit: vmath (guarded, so a unit that
declares it already may hold copies), the GEMM fragment of the schedule's GEMM schedule, the
implicit GEMM, conv_panels and the conv fragment, every ``ss_gemm``/``ss_conv`` name and
``SS_GEMM_``/``SS_CONV_`` macro renamed to the prefix (as ``gemm.source`` renames its own).
It defines ``<prefix>conv2d`` (``ss_conv2d``'s arguments and meaning), ``<prefix>conv2d_residual``
(``ss_conv2d_residual``'s: a fused residual Add), ``<prefix>conv2d_work_size``,
``<prefix>gemm_pack_b`` and ``<prefix>gemm_packed_b_size`` (the packed weights it reads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from ...target import Target
from . import conv, conv_igemm, conv_panels, gemm, vmath
from .gemm import GemmSchedule

DEFAULT_PREFIX = "ss_"
_PREFIX_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*_")


@dataclass(frozen=True)
class ConvSchedule:
    gemm: GemmSchedule = field(default_factory=GemmSchedule)
    igemm_block: int = conv_igemm.BLOCK  # output pixels per unit of the implicit GEMM's work
    igemm_min_plane: int = 9  # planes of at most this many pixels take the small-plane GEMM (k x k)
    panels_max_plane: int = 0  # planes of at most this many pixels take conv_panels (0: never)
    small_plane: int = conv.SMALL_PLANE  # 1 x 1 convs: the small-plane GEMM up to this many pixels,
    small_plane_max: int = conv.SMALL_PLANE_MAX  # and up to this many with as many output channels

    def __post_init__(self) -> None:
        if self.igemm_block < 12 or self.igemm_block % 12:
            raise ValueError(f"igemm_block must be a positive multiple of 12, got {self.igemm_block}")
        if min(self.igemm_min_plane, self.panels_max_plane, self.small_plane, self.small_plane_max) < 0:
            raise ValueError("conv schedule planes must be >= 0")


def unit_source(schedule: ConvSchedule, target: Optional[Target] = None, prefix: str = DEFAULT_PREFIX) -> str:
    """The conv unit of ``schedule`` (module docstring); the default prefix keeps the ``ss_``
    names (a measurement library holds one schedule)."""
    text = (vmath.fragment().text() + gemm.fragment(schedule.gemm).text()
            + conv_igemm.fragment(target, block=schedule.igemm_block, min_plane=schedule.igemm_min_plane).text()
            + conv_panels.fragment(target, max_plane=schedule.panels_max_plane, schedule=schedule.gemm).text()
            + conv.fragment(small_plane=schedule.small_plane, small_plane_max=schedule.small_plane_max).text())
    if prefix == DEFAULT_PREFIX:
        return text
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"conv prefix {prefix!r} must be a C identifier prefix ending in '_'")
    # Every name these fragments define starts with ss_gemm / ss_conv (or SS_GEMM_ /
    # SS_CONV_ for macros); the prelude's and vmath's are shared, not renamed.
    upper = prefix.upper()
    for name, macro in (("gemm", "GEMM_"), ("conv", "CONV_")):
        text = text.replace(f"ss_{name}", f"{prefix}{name}").replace(f"SS_{macro}", f"{upper}{macro}")
    return text
