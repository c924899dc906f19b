"""C source for float32 elementwise kernels over runtime shapes (first step of the native backend).

One C function per op type, shared by every node of that op. Extents and strides are
runtime ``int64_t`` arguments, so a symbolic dimension stays symbolic until a run binds it
and one build serves every shape. Broadcasting is a zero stride. Two paths per kernel:

- contiguous: every input already has the output's shape, one flat loop;
- strided: the output is walked row by row (the last axis); each row's input offsets come
  from the outer index, the inner loop steps by the inputs' last-axis strides.

Both loops are OpenMP-parallel once the work is large enough to pay for the threads.

Signatures (strides in elements, one per output axis, 0 where an input is broadcast)::

    void ew_<Op>(const float* a, const float* b, float* out, int64_t rank,
                 const int64_t* shape, const int64_t* strides_a, const int64_t* strides_b,
                 int64_t contiguous)

Unary kernels take the same arguments and ignore ``b`` and ``strides_b`` so that the
runtime calls every kernel the same way.
"""

from __future__ import annotations

from typing import Iterable

# op -> C expression over ``x`` (unary) or ``x``, ``y`` (binary), all float.
UNARY: dict[str, str] = {
    "Relu": "x > 0.0f ? x : 0.0f",
    "Sigmoid": "1.0f / (1.0f + expf(-x))",
    "Tanh": "tanhf(x)",
    "Exp": "expf(x)",
    "Log": "logf(x)",
    "Sqrt": "sqrtf(x)",
    "Neg": "-x",
    "Abs": "fabsf(x)",
    "Erf": "erff(x)",
}
BINARY: dict[str, str] = {
    "Add": "x + y",
    "Sub": "x - y",
    "Mul": "x * y",
    "Div": "x / y",
}
ELEMENTWISE_OPS = frozenset(UNARY) | frozenset(BINARY)

# Below this many elements a parallel region costs more than it saves.
PARALLEL_THRESHOLD = 1 << 15

PRELUDE = f"""\
#include <math.h>
#include <stdint.h>

#define PARALLEL_THRESHOLD {PARALLEL_THRESHOLD}
"""

# {name}: function name; {read_b}: how the strided loop reads y (nothing for unary ops).
TEMPLATE = """
void {name}(const float* a, const float* b, float* out, int64_t rank, const int64_t* shape,
            const int64_t* strides_a, const int64_t* strides_b, int64_t contiguous) {{
    (void)b; (void)strides_b;
    int64_t total = 1;
    for (int64_t d = 0; d < rank; d++) total *= shape[d];
    if (total == 0) return;
    if (contiguous) {{
        #pragma omp parallel for if(total >= PARALLEL_THRESHOLD)
        for (int64_t i = 0; i < total; i++) {{
            const float x = a[i];{read_b_flat}
            out[i] = {expr};
        }}
        return;
    }}
    const int64_t inner = rank > 0 ? shape[rank - 1] : 1;
    const int64_t sa_inner = rank > 0 ? strides_a[rank - 1] : 0;
    const int64_t sb_inner = rank > 0 ? strides_b[rank - 1] : 0;
    (void)sb_inner;
    const int64_t rows = total / inner;
    #pragma omp parallel for if(total >= PARALLEL_THRESHOLD)
    for (int64_t r = 0; r < rows; r++) {{
        int64_t rest = r, oa = 0, ob = 0;
        for (int64_t d = rank - 2; d >= 0; d--) {{
            const int64_t i = rest % shape[d];
            rest /= shape[d];
            oa += i * strides_a[d];
            ob += i * strides_b[d];
        }}
        (void)ob;
        float* o = out + r * inner;
        for (int64_t j = 0; j < inner; j++) {{
            const float x = a[oa + j * sa_inner];{read_b_strided}
            o[j] = {expr};
        }}
    }}
}}
"""


def kernel_name(op_type: str) -> str:
    return f"ew_{op_type}"


def emit_kernel(op_type: str) -> str:
    """The C function computing ``op_type`` for any shape (see the module docstring)."""
    if op_type in UNARY:
        return TEMPLATE.format(name=kernel_name(op_type), expr=UNARY[op_type], read_b_flat="", read_b_strided="")
    if op_type in BINARY:
        return TEMPLATE.format(name=kernel_name(op_type), expr=BINARY[op_type],
                               read_b_flat="\n            const float y = b[i];",
                               read_b_strided="\n            const float y = b[ob + j * sb_inner];")
    raise KeyError(f"{op_type} is not a native elementwise op")


def emit_source(op_types: Iterable[str]) -> str:
    """One translation unit with a kernel per distinct op type, in a stable order."""
    return PRELUDE + "".join(emit_kernel(op) for op in sorted(set(op_types)))
