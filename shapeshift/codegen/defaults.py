"""Untuned schedules of the GEMM-like kernels, derived from the target description.

The dense and batched GEMM (kernels/gemm.py), and the fused attention that calls it, run
``default_schedule(target)`` unless a tuning record says otherwise:

- width: the widest vector the target has (zmm with AVX-512, else ymm), and the register
  file that goes with it (32 or 16);
- register tile (mr x nr): from the target's microarchitecture class (target/microarch.py),
  which names the measurement that chose it; a rule cannot tell tiles that fit the
  registers apart;
- kc: the largest multiple of 32 whose A and B micro-panels (kc x (mr + nr) floats) take at
  most 3/4 of L1d, so that the B micro-panel stays in L1 while A micro-panels stream past;
- mc: A blocks of at most a quarter of L2 (2 to 24 micro-panels);
- kc and mc from the class instead where it names them (``blocking``, with the measurement);
- nc and the small-M path: as hand-tuned (nc 3072 columns, rounded to whole panels); the
  most rows the small-M path takes from the class where it names them (``small_m``);
- one_block_nc (the packed blocks of B of calls whose rows are one block of A): the whole
  panels of kc rows in half of L2, at most nc, so that each block is read back from L2
  right after its packing.

``conv_panels_max_plane(target)``: the output planes up to which a dense k x k conv with
prepacked weights runs the GEMM's own register tile over the image (kernels/conv_panels.py):
the wide tiles' 400 pixels, none with a narrow tile, where it lost to the paths below.

``conv_igemm_min_plane(target)``: the output planes (in pixels) up to which a dense k x k
conv with prepacked weights runs as one GEMM over its im2col matrix with the weights as
the GEMM's prepacked B (kernels/conv.py's small-plane path) rather than the implicit GEMM
(kernels/conv_igemm.py), whose 48-pixel blocks of 6-pixel tiles a plane of a few dozen
pixels fills badly. Which wins depends on the GEMM tile the target gets.
"""

from __future__ import annotations

from typing import Optional

from ..target import Target, host_target
from ..target.microarch import AVX2
from .kernels import conv_panels
from .kernels.gemm import GemmSchedule

MC_PANELS = (2, 24)
KC_RANGE = (64, 512)


def default_schedule(target: Optional[Target] = None) -> GemmSchedule:
    """The untuned GEMM schedule for ``target`` (this machine by default)."""
    target = target or host_target()
    klass = target.microarch
    lanes = 16 if target.avx512 and klass.lanes == 16 else 8
    # A class whose tile is zmm, on a target without the full AVX-512 set: the AVX2 tile.
    mr, nr = klass.tile if lanes == klass.lanes else AVX2.tile
    return tile_schedule(target, mr, nr, lanes)


def tile_schedule(target: Target, mr: int, nr: int, lanes: int) -> GemmSchedule:
    """The untuned schedule of register tile mr x nr in vectors of ``lanes`` floats: the
    class's measured blocking and small-M bound for its own tile, else the cache rule and the
    schedule's default (bench/gemm_tiles.py times other tiles this way)."""
    klass = target.microarch
    own = (mr, nr, lanes) == (*klass.tile, klass.lanes)
    if own and klass.blocking is not None:
        kc, mc = klass.blocking  # measured where the cache rule below lost
    else:
        floats_l1 = target.caches.l1d // 4
        kc = max(KC_RANGE[0], min(KC_RANGE[1], (floats_l1 * 3 // 4) // (mr + nr) // 32 * 32))
        panels = (target.caches.l2 // 4 // 4) // (kc * mr)
        mc = mr * max(MC_PANELS[0], min(MC_PANELS[1], panels))
    nc = -(-3072 // nr) * nr
    one_block_nc = min(nc, max(nr, (target.caches.l2 // 4 // 2) // kc // nr * nr))
    small_nc = -(-256 // nr) * nr
    extra = {"small_m": klass.small_m} if own and klass.small_m is not None else {}
    return GemmSchedule(mr=mr, nr=nr, kc=kc, mc=mc, nc=nc, one_block_nc=one_block_nc, small_nc=small_nc, lanes=lanes,
                        registers=target.vector_registers, **extra)


# Planes up to which the small-plane GEMM beats the implicit GEMM. Measured at 1 thread,
# 3x3 convs with bias and ReLU, C = M in 64..512, against onnxruntime in the same process:
# - 6x16 tiles (Zen 4, issue 28's first conv work): 4x4 planes ran 1.11-1.26x slower on
#   the small-plane path with 64 and 128 channels, so it kept only planes of 9 pixels;
# - 8x48 zmm tiles (an AMD Zen 5): the small-plane path ran 4x4 to 8x8 planes 1.05-2.8x
#   faster with 128-512 channels (512 on 7x7: 1977 -> 1179 us, onnxruntime 1081) and alike
#   with 64; on 10x10 and 14x14 planes it was within 10% either way, and 2.5x slower with
#   64 channels, so the switch stays at the small-plane path's own 64 pixels. ResNet-50 at
#   224x224, 1 thread: 49.7 -> 43.4 ms. The Xeon class's 8x48 tile takes the same switch,
#   not measured there.
# - 8x16 zmm tiles (Zen 4 since c975fdd), remeasured 2026-12-07 (3x3 + SiLU, alternating
#   sessions in one process, best of 3 x 7 samples): the small-plane path (the switch at 64)
#   ran 3x5, 4x4 and 5x5 planes 1.00-1.21x the implicit GEMM's time (64-256 channels), 6x10
#   stride 2 1.09-1.18x, 512->512 stride 2 on 7x7 0.97x: the switch stays at 9.
IGEMM_MIN_PLANE_NARROW = 9
IGEMM_MIN_PLANE_WIDE = 64
WIDE_TILE_COLUMNS = 32


# Output planes up to which a dense k x k conv with prepacked weights runs the GEMM's own
# tile over the image (kernels/conv_panels.py). With 8x48 zmm tiles (an AMD Zen 5) it beat
# the implicit GEMM up to 20x20 planes (see conv_panels.py). With the 6x16 tile of a Zen 4
# (one vector of channels, 6 accumulators) it lost everywhere, 1 thread, SiLU, against
# onnxruntime interleaved, it -> the implicit GEMM or the small-plane GEMM: 64->64 on 20x20
# 1.38x -> 1.12x onnxruntime's time, 128->128 on 20x20 1.11x -> 1.07x, 128->128 on 10x10
# 1.28x -> 1.16x, 64->64 on 14x14 1.34x -> 1.26x, and alike on 5x5 to 7x7 planes; so
# narrow tiles do not take it. (Zen 4's tile has been 8x16 since, 8 accumulators of one
# vector of channels: this switch is not remeasured for it.)


def conv_panels_max_plane(target: Optional[Target] = None) -> int:
    """Output planes of at most this many pixels take conv_panels (0: none; see above)."""
    schedule = default_schedule(target)
    return conv_panels.MAX_PLANE if schedule.nr >= WIDE_TILE_COLUMNS else 0


def default_conv_schedule(target: Optional[Target] = None):
    """The untuned conv kernel's schedule (kernels/conv_tuned.py): the default GEMM schedule
    and the conv paths' switches above, as every untuned ``ss_conv2d`` runs them."""
    from .kernels.conv_tuned import ConvSchedule

    return ConvSchedule(gemm=default_schedule(target), igemm_min_plane=conv_igemm_min_plane(target),
                        panels_max_plane=conv_panels_max_plane(target))


def default_nchwc_schedule(target: Optional[Target] = None):
    """The untuned blocked conv kernels' schedule (kernels/conv_nchwc_tuned.py), as every
    untuned ``ss_conv_nchwc_L`` and ``ss_dwconv_nchwc_L`` runs them."""
    from ..target import host_target
    from .kernels.conv_nchwc_tuned import NchwcSchedule, default_rx

    return NchwcSchedule(rx=default_rx(target or host_target()))


def conv_igemm_min_plane(target: Optional[Target] = None) -> int:
    """Output planes of at most this many pixels take the small-plane GEMM (see above)."""
    schedule = default_schedule(target)
    return IGEMM_MIN_PLANE_WIDE if schedule.nr >= WIDE_TILE_COLUMNS else IGEMM_MIN_PLANE_NARROW
