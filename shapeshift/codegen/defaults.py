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
- nc and the small-M path: as hand-tuned (nc 3072 columns, rounded to whole panels).
"""

from __future__ import annotations

from typing import Optional

from ..target import Target, host_target
from ..target.microarch import AVX2
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
    floats_l1 = target.caches.l1d // 4
    kc = max(KC_RANGE[0], min(KC_RANGE[1], (floats_l1 * 3 // 4) // (mr + nr) // 32 * 32))
    panels = (target.caches.l2 // 4 // 4) // (kc * mr)
    mc = mr * max(MC_PANELS[0], min(MC_PANELS[1], panels))
    nc = -(-3072 // nr) * nr
    small_nc = -(-256 // nr) * nr
    return GemmSchedule(mr=mr, nr=nr, kc=kc, mc=mc, nc=nc, small_nc=small_nc, lanes=lanes,
                        registers=target.vector_registers)
