"""A naive C ``ss_gemm`` for kernel tests, and the gemm fragment those tests build with.

Kernels that call ``ss_gemm`` (conv, rnn) are tested against the real fragment from
``shapeshift.codegen.kernels.gemm`` when that module imports and its source builds; else
against ``NAIVE_GEMM``, a plain triple loop with the same signature and semantics, so
that a conv or LSTM failure is never hidden behind (or blamed on) an unfinished gemm.

Exported C (both fragments)::

    void ss_gemm(int64_t M, int64_t N, int64_t K, int64_t batch0, int64_t batch1,
                 const float* A, int64_t sa0, int64_t sa1, int64_t rsa, int64_t csa,
                 const float* B, int64_t sb0, int64_t sb1, int64_t rsb, int64_t csb,
                 float* C, int64_t sc0, int64_t sc1, int64_t ldc,
                 float alpha, const float* bias, float beta, int64_t rs_bias, int64_t cs_bias, int act);

    C[b][m,n] = act(alpha * sum_k A[b][m,k] * B[b][k,n] + beta * bias[m,n]), act 0 none, 1 relu.
"""

from __future__ import annotations

from pathlib import Path

from shapeshift.codegen.build import CompiledLibrary, compile_library
from shapeshift.codegen.kernels.prelude import PRELUDE
from shapeshift.errors import CompileError

NAIVE_GEMM = r"""
void ss_gemm(int64_t M, int64_t N, int64_t K, int64_t batch0, int64_t batch1,
             const float* A, int64_t sa0, int64_t sa1, int64_t rsa, int64_t csa,
             const float* B, int64_t sb0, int64_t sb1, int64_t rsb, int64_t csb,
             float* C, int64_t sc0, int64_t sc1, int64_t ldc,
             float alpha, const float* bias, float beta, int64_t rs_bias, int64_t cs_bias, int act) {
    for (int64_t i0 = 0; i0 < batch0; ++i0)
    for (int64_t i1 = 0; i1 < batch1; ++i1) {
        const float* a = A + i0 * sa0 + i1 * sa1;
        const float* b = B + i0 * sb0 + i1 * sb1;
        float* c = C + i0 * sc0 + i1 * sc1;
        #pragma omp parallel for if(M * N * K >= 32768)
        for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            float s = 0.0f;
            for (int64_t k = 0; k < K; ++k) s += a[m * rsa + k * csa] * b[k * rsb + n * csb];
            float v = alpha * s;
            if (bias) v += beta * bias[m * rs_bias + n * cs_bias];
            if (act == 1 && v < 0.0f) v = 0.0f;
            c[m * ldc + n] = v;
        }
    }
}
"""


def gemm_fragment() -> str:
    """The real gemm fragment if ``shapeshift.codegen.kernels.gemm`` provides one, else ``NAIVE_GEMM``."""
    try:
        from shapeshift.codegen.kernels import gemm
        text = gemm.source()
    except Exception:  # the module is missing or unfinished: test the caller against the naive one
        return NAIVE_GEMM
    return text if "ss_gemm(" in text else NAIVE_GEMM


def build_with_gemm(fragment: str, cache_dir: Path, name_hint: str, flags=None) -> CompiledLibrary:
    """Compile PRELUDE + a gemm fragment + ``fragment``: the real gemm, or the naive one if it
    does not build (``flags``: compile_library's, default its own)."""
    real = gemm_fragment()
    try:
        return compile_library(PRELUDE + real + fragment, name_hint=name_hint, cache_dir=cache_dir, flags=flags)
    except CompileError:
        if real is NAIVE_GEMM:
            raise
    return compile_library(PRELUDE + NAIVE_GEMM + fragment, name_hint=name_hint, cache_dir=cache_dir, flags=flags)
