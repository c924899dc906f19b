"""Convolutions as tuning tasks: one task per conv class, its instances the sampled shapes.

A conv *class* is what a kernel's code depends on beyond its sizes: kernel (KH, KW),
strides and dilations (dense, group 1, constant weights: the convs ``ss_conv2d`` runs with
prepacked weights). Its *instances* are the convs of that class in a model, each (N, C, H,
W, M, ph, pw, act): batch, input channels, input plane, output channels, begin pads and the
fused activation. DietCode's grouping of a static model: every instance of a class is a
sampled shape of one task, weighted by its calls per run; the kernels (kernels/conv_tuned.py)
take every size at run time, so at most ``max_kernels`` of them serve the whole class, and
the tree picks one per call by (N, C, M, H, W). Tuned one instance at a time (``--no-group``)
a task has one instance.

As a group of GEMMs (tune/gemm_group.py) the task is *unordered*: value i is instance i,
the key lists the instances. The end pads follow from the output size, which the class's
formula gives with end pads equal to the begin pads (``output``): ``conv_instance`` takes a
conv as an instance only when its output size is that one, so that what was measured is
what runs. (Any conv of the class runs a tuned kernel correctly: they take every size.)

``cold`` (the default for a model's tasks, as for its GEMMs): each timed call follows a
flush of the caches. Measured on an AMD Zen 4, 1 thread, ResNet-50's convs ran 5-40% slower
inside the model than alone and warm (1x1 256->64 on 56x56: 1.49 ms against 0.99; 3x3
512->512 on 7x7: 3.16 against 2.62), and after a 48 MB flush 1.23-1.30 and 2.89-2.99 ms:
the model's conditions are the flushed ones, and what is fastest warm need not be there.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional

from ..symbolic import bounds, is_dim
from .conv_family import CONV
from .conv_nchwc_family import CONV_NCHWC, CONV_NCHWC_DW
from .task import InstanceValues

# The tree's variables: the arguments of the conv dispatcher's choice function, in order.
DIMS = ("N", "C", "M", "H", "W")
# Activations ss_conv2d fuses (codes of its ``act`` argument).
ACTS = (0, 1, 2, 3)

Class = tuple[int, int, int, int, int, int]  # KH, KW, sh, sw, dh, dw
Instance = tuple[int, int, int, int, int, int, int, int]  # N, C, H, W, M, ph, pw, act


def output(cls: Class, inst: Instance) -> tuple[int, int]:
    """(OH, OW) with end pads equal to the begin pads."""
    kh, kw, sh, sw, dh, dw = cls
    _, _, h, w, _, ph, pw, _ = inst
    return (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1


@dataclass(frozen=True)
class ConvWorkload(InstanceValues):
    conv_class: Class
    instances: tuple[Instance, ...]  # sorted, distinct
    # Measured as in a model, caches flushed before every call (the worker's
    # tune_conv_bench_cold): a model's conv reads its input from the layer before, out of
    # L2 or L3, and its weights from DRAM. ResNet-50's convs ran 5-40% slower in the model
    # than warm, alone, about as much as after a flush (module docstring).
    cold: bool = False

    family = CONV
    shares_layout = True  # the weights are packed once, in the kernels' one layout
    tree_args = DIMS
    instance_fields = "(N, C, H, W, M, ph, pw, act)"  # what ``instance(value)`` holds

    def __post_init__(self) -> None:
        if len(self.conv_class) != 6 or min(self.conv_class) < 1:
            raise ValueError(f"conv class (KH, KW, sh, sw, dh, dw) must be 6 positive ints, got {self.conv_class}")
        if not self.instances:
            raise ValueError("a conv task needs at least one instance")
        if list(self.instances) != sorted(set(self.instances)):
            raise ValueError("a conv task's instances must be sorted and distinct")
        for inst in self.instances:
            n, c, h, w, m, ph, pw, act = inst
            if min(n, c, h, w, m) < 1 or min(ph, pw) < 0 or act not in ACTS:
                raise ValueError(f"conv instance {inst} is not (N, C, H, W, M >= 1, pads >= 0, act in {ACTS})")
            if min(output(self.conv_class, inst)) < 1:
                raise ValueError(f"conv instance {inst} has an empty output")

    @classmethod
    def of(cls, conv_class, instances, cold: bool = False) -> "ConvWorkload":
        return cls(tuple(int(v) for v in conv_class), tuple(sorted({tuple(int(v) for v in i) for i in instances})),
                   cold)

    @property
    def class_key(self) -> str:
        """The class, cold or warm alike (what a record is looked up by)."""
        return self.class_key_of(self.conv_class)

    @staticmethod
    def class_key_of(conv_class) -> str:
        return "conv:" + ",".join(map(str, conv_class))

    @property
    def key(self) -> str:
        """The class (cold measurements a workload of their own, as the GEMM's), then the instances."""
        kind = "conv-cold" if self.cold else "conv"
        return kind + self.class_key[len("conv"):] + ":" + ";".join(",".join(map(str, i)) for i in self.instances)

    @classmethod
    def from_key(cls, key: str) -> "ConvWorkload":
        try:
            kind, klass, body = key.split(":")
            if kind not in ("conv", "conv-cold"):
                raise ValueError
            return cls.of([int(v) for v in klass.split(",")],
                          [[int(v) for v in part.split(",")] for part in body.split(";")], kind == "conv-cold")
        except (ValueError, TypeError):
            raise ValueError(f"not a conv workload key: {key!r}") from None

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.key.encode()).hexdigest()

    def instance(self, value: int) -> Instance:
        return self.instances[value - 1]

    def point(self, value: int) -> dict[str, int]:
        n, c, h, w, m, _, _, _ = self.instance(value)
        return {"N": n, "C": c, "M": m, "H": h, "W": w}

    def shape(self, value: int) -> tuple[int, int, int, int]:
        """The conv as a GEMM: (pixels, taps, output channels, batch)."""
        n, c, _, _, m, _, _, _ = inst = self.instance(value)
        oh, ow = output(self.conv_class, inst)
        kh, kw = self.conv_class[:2]
        return oh * ow, c * kh * kw, m, n

    def request(self) -> dict:
        return {"kind": "conv", "class": list(self.conv_class), "cold": self.cold,
                "shapes": {str(v): list(self.instance(v)) for v in range(1, self.hi + 1)}}

    def flops(self, value: int) -> float:
        p, k, m, n = self.shape(value)
        return 2.0 * p * k * m * n

    def range_flops(self) -> float:
        return float(sum(self.flops(v) for v in range(1, self.hi + 1)))

    def describe(self) -> str:
        kh, kw, sh, sw, dh, dw = self.conv_class
        shapes = ", ".join(f"{c}->{m} on {h}x{w}" for _, c, h, w, m, _, _, _ in self.instances[:4])
        return (f"conv {kh}x{kw} stride {sh}x{sw} dilation {dh}x{dw}, {len(self.instances)} instance(s): {shapes}"
                + (", ..." if len(self.instances) > 4 else ""))


@dataclass(frozen=True)
class NchwcConvWorkload(ConvWorkload):
    """A class of blocked-layout convs (kernels/conv_nchwc.py, ``NCHWcConv`` nodes): dense
    (group 1, a blocked input) or ``depthwise`` (group = C = M), ``lanes`` floats a block.
    An instance is the call's (N, C, H, W, M, ph, pw, 0) as the kernel takes it: a pointwise
    conv's plane comes as one row (H = 1, W = H x W), as the lowering passes it; a depthwise
    one has M = C; the activation is not part of it (the epilogue runs after the tiles, the
    same for every schedule). Measured with the channels blocked as in a model."""

    depthwise: bool = False
    lanes: int = 8

    kinds = ("conv-nchwc", "conv-nchwc-dw")

    @property
    def family(self):
        return CONV_NCHWC_DW if self.depthwise else CONV_NCHWC

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lanes not in (8, 16):
            raise ValueError(f"a blocked conv's block must be 8 or 16 floats, got {self.lanes}")
        if self.depthwise and any(c != m for _, c, _, _, m, _, _, _ in self.instances):
            raise ValueError("a depthwise conv instance has as many output channels as input channels")

    @classmethod
    def of(cls, conv_class, instances, cold: bool = False, depthwise: bool = False, lanes: int = 8
           ) -> "NchwcConvWorkload":
        return cls(tuple(int(v) for v in conv_class), tuple(sorted({tuple(int(v) for v in i) for i in instances})),
                   cold, bool(depthwise), int(lanes))

    @property
    def class_key(self) -> str:
        return self.class_key_of(self.conv_class, self.depthwise, self.lanes)

    @staticmethod
    def class_key_of(conv_class, depthwise: bool = False, lanes: int = 8) -> str:
        kind = NchwcConvWorkload.kinds[int(bool(depthwise))]
        return f"{kind}:{lanes}:" + ",".join(map(str, conv_class))

    @property
    def key(self) -> str:
        klass = self.class_key
        if self.cold:
            kind, rest = klass.split(":", 1)
            klass = f"{kind}-cold:{rest}"
        return klass + ":" + ";".join(",".join(map(str, i)) for i in self.instances)

    @classmethod
    def from_key(cls, key: str) -> "NchwcConvWorkload":
        try:
            kind, lanes, klass, body = key.split(":")
            cold = kind.endswith("-cold")
            kind = kind[:-len("-cold")] if cold else kind
            if kind not in cls.kinds:
                raise ValueError
            return cls.of([int(v) for v in klass.split(",")],
                          [[int(v) for v in part.split(",")] for part in body.split(";")], cold,
                          kind == cls.kinds[1], int(lanes))
        except (ValueError, TypeError):
            raise ValueError(f"not a blocked conv workload key: {key!r}") from None

    def request(self) -> dict:
        return {**super().request(), "kind": "conv-nchwc", "depthwise": self.depthwise, "lanes": self.lanes}

    def flops(self, value: int) -> float:
        if not self.depthwise:
            return super().flops(value)
        n, c, _, _, _, _, _, _ = inst = self.instance(value)
        oh, ow = output(self.conv_class, inst)
        return 2.0 * n * c * oh * ow * self.conv_class[0] * self.conv_class[1]

    def describe(self) -> str:
        kh, kw, sh, sw, dh, dw = self.conv_class
        shapes = ", ".join((f"{c} on {h}x{w}" if self.depthwise else f"{c}->{m} on {h}x{w}")
                           for _, c, h, w, m, _, _, _ in self.instances[:4])
        return (f"blocked {'depthwise ' if self.depthwise else ''}conv {kh}x{kw} stride {sh}x{sw} dilation "
                f"{dh}x{dw} (NCHW{self.lanes}c), {len(self.instances)} instance(s): {shapes}"
                + (", ..." if len(self.instances) > 4 else ""))


def workload_from_key(key: str) -> ConvWorkload:
    """A conv workload, plain or blocked, from its key."""
    if key.startswith(NchwcConvWorkload.kinds):
        return NchwcConvWorkload.from_key(key)
    return ConvWorkload.from_key(key)


def _static(d):
    """``d`` as an int when its bounds pin it (a dim declared 224:224), else itself."""
    if isinstance(d, int) or not is_dim(d):
        return d
    lo, hi = bounds(d)
    return lo if lo == hi else d


def conv_instance(kernel, strides, dilations, pads_begin, dims, out_hw, act: int
                  ) -> Optional[tuple[Class, Instance]]:
    """The (class, instance) of a dense 2-D conv with static sizes (a symbol declared with
    one value counts as that value) whose output is what equal end pads give (see the
    module docstring), or None."""
    dims, out_hw = [_static(d) for d in dims], [_static(d) for d in out_hw]
    values = [*kernel, *strides, *dilations, *pads_begin, *dims, *out_hw]
    if not all(isinstance(v, int) for v in values):
        return None
    n, c, h, w, m = dims
    cls = tuple(kernel) + tuple(strides) + tuple(dilations)
    inst = (n, c, h, w, m, pads_begin[0], pads_begin[1], act)
    if act not in ACTS or min(dims) < 1 or min(pads_begin) < 0 or output(cls, inst) != tuple(out_hw):
        return None
    return cls, inst
