"""The pointer table's entries: what stands behind each ``v[k]`` of a native program."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ..ir.graph import Value
from ..ir.types import TensorType, to_numpy_dtype
from ..ops.common import product
from ..symbolic import Dim

if TYPE_CHECKING:
    from .placement import Placement

# Storage kinds of a slot.
CONST, INPUT, ARENA, DYNAMIC, PACKED, VIEW, WORK = "const", "input", "arena", "dynamic", "packed", "view", "work"
LATE = "late"  # an ARENA or WORK buffer sized by late symbols: allocated per run once they are bound
DIMS = "dims"  # int64 dims that a size step computes, for the VM to bind as late symbols
# A profiled program's (seconds, calls) doubles per step, which its native steps add to:
# each VM allocates its own, so two sessions of one library keep apart.
COUNTERS = "counters"
DEAD = "dead"  # the output of a step a later rule dropped: never written, never read


@dataclass
class Slot:
    """One entry of the pointer table and what stands behind it."""

    index: int
    kind: str
    value: Optional[Value] = None  # None for packed weights and workspaces
    root: int = -1  # VIEW: the slot whose buffer it shares
    nbytes: Dim = 0  # ARENA, WORK and LATE: size as a dim expression
    # ARENA: the buffer it lives inside where the binding allows (codegen/placement.py).
    within: Optional[Placement] = None
    first: int = 0  # ARENA and WORK: live from this step...
    last: int = 0  # ...through this one


def tensor_nbytes(t: TensorType) -> Dim:
    """The bytes of a tensor of type ``t`` (its shape known), as a dim expression."""
    return product([*t.shape, to_numpy_dtype(t.dtype).itemsize])
