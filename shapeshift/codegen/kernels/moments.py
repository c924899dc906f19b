"""Per-channel statistics over the axes around the channel, and MeanVarianceNormalization.

x is viewed as [outer, channels, inner]; a channel's statistics run over outer and inner
(BatchNormalization in training mode: [N, C, spatial]; MeanVarianceNormalization: the
reduced axes before and after the kept ones). Exported C signatures::

    /* mean[c] and the population variance var[c] of channel c, over outer and inner.
       Two passes in double (the mean, then squared deviations from it), so a large mean
       does not cancel the variance. An empty channel (outer * inner == 0) gives NaN. */
    void ss_channel_moments(const float* x, int64_t outer, int64_t channels, int64_t inner,
                            float* mean, float* var);

    /* MeanVarianceNormalization: y = (x - mean[c]) / (sqrt(var[c]) + 1e-9), the ONNX
       function body's formula; stats is scratch space of 2 * channels floats. */
    void ss_mvn(const float* x, float* y, int64_t outer, int64_t channels, int64_t inner, float* stats);

OpenMP splits channels when the work is large.
"""

from __future__ import annotations

from ..cwriter import Fragment, Function, Private, fill

DEPENDS: tuple[str, ...] = ()

_DEFINES = r"""
#define SS_MOM_PAR_WORK @PAR_WORK@
"""

_CHANNEL_MOMENTS = Function("void", "ss_channel_moments", ("const float* x", "int64_t outer", "int64_t channels",
                                                           "int64_t inner", "float* mean", "float* var"), r"""
    const double count = (double)outer * (double)inner;
    #pragma omp parallel for schedule(static) if(outer * channels * inner >= SS_MOM_PAR_WORK && channels > 1)
    for (int64_t c = 0; c < channels; c++) {
        double sum = 0.0;
        for (int64_t o = 0; o < outer; o++) {
            const float* row = x + (o * channels + c) * inner;
            for (int64_t i = 0; i < inner; i++) sum += row[i];
        }
        const double m = sum / count;
        double squares = 0.0;
        for (int64_t o = 0; o < outer; o++) {
            const float* row = x + (o * channels + c) * inner;
            for (int64_t i = 0; i < inner; i++) { const double d = row[i] - m; squares += d * d; }
        }
        mean[c] = (float)m;
        var[c] = (float)(squares / count);
    }""")

_MVN = Function("void", "ss_mvn", ("const float* x", "float* y", "int64_t outer", "int64_t channels", "int64_t inner",
                                   "float* stats"), r"""
    float* mean = stats;
    float* var = stats + channels;
    ss_channel_moments(x, outer, channels, inner, mean, var);
    #pragma omp parallel for schedule(static) if(outer * channels * inner >= SS_MOM_PAR_WORK && outer * channels > 1)
    for (int64_t t = 0; t < outer * channels; t++) {
        const int64_t c = t % channels;
        const float m = mean[c], d = sqrtf(var[c]) + 1e-9f;
        const float* xr = x + t * inner;
        float* yr = y + t * inner;
        for (int64_t i = 0; i < inner; i++) yr[i] = (xr[i] - m) / d;
    }""")


def fragment(par_work: int = 1 << 15) -> Fragment:
    """The C fragment; par_work: elements of work from which a call runs in parallel."""
    if par_work < 0:
        raise ValueError("par_work must be non-negative")
    return Fragment([
        Private(fill(_DEFINES, PAR_WORK=int(par_work))),
        _CHANNEL_MOMENTS,
        _MVN,
    ])


def source(par_work: int = 1 << 15) -> str:
    return fragment(par_work).text()
