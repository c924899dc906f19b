"""The includes and shared helpers that every kernel fragment may rely on.

Kept small: anything here is compiled into every model's library.
"""

PRELUDE = """\
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <stdlib.h>
#include <math.h>
#include <float.h>
#include <omp.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

/* Exported so that the VM sets the thread count of every parallel region it runs. */
void ss_set_num_threads(int n) { omp_set_num_threads(n); }
"""
