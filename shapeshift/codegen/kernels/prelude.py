"""The includes and shared helpers that every kernel fragment may rely on.

Kept small: anything here is compiled into every model's library.
"""

#: The includes: what a kernel fragment compiled as an object of its own starts with.
HEADER = """\
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
"""

#: A model's translation unit starts with this: the includes and the one function every
#: model library exports (in one unit only: objects linked beside it must not define it).
PRELUDE = HEADER + """
/* Exported so that the VM sets the thread count of every parallel region it runs. */
void ss_set_num_threads(int n) { omp_set_num_threads(n); }
"""
