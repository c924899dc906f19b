"""The target description (what the machine has) and its measured facts; see description.py."""

from .calibrate import FmaCalibration, measure_fma
from .cpu import Caches, CpuIdentity
from .description import Target, host_target, named_target, registers_of_width
from .microarch import MicroarchClass

__all__ = ["Caches", "CpuIdentity", "FmaCalibration", "MicroarchClass", "Target", "host_target", "measure_fma",
           "named_target", "registers_of_width"]
