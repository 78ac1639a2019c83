"""What the C renderer's compiler is probed with before its first kernel (``c_runtime``'s flags): small sources a
flag must build (and load), and a miscompile that only running the code shows.

* :data:`PROBE` — a parallel loop of ``expf``: each flag (``-march=native``, ``-mno-red-zone``, OpenMP) is kept where it
  builds; :data:`VECTOR_PROBE` — libmvec's ``sinf`` and ``cosf`` in a SIMD loop (kept where it also loads).
* :data:`ROUND_TRIP_PROBE` with :func:`round_trip_kept` — the float32 round trip of float64 values, run: gcc 12.2 with
  AVX-512VL (``-march=native`` on an Intel Xeon) folds ``(double)(float)x`` into ``x`` where its SLP vectorizer packs a
  few elements (a loop of 2 to 40, a long loop's tail): ``x.abs().to(torch.float32) == x`` gave True for a float64 x
  that float32 cannot hold (the fuzzer's long run, 2026-11-28). ``c_runtime`` turns that vectorizer off where the
  loaded probe loses the rounding.
"""

from __future__ import annotations

import ctypes

PROBE = (
    "#include <math.h>\nvoid f(float *restrict x, int n) {\n#pragma omp parallel for\n"
    "for (int i = 0; i < n; i++) x[i] = expf(x[i]);\n}\n"
)
VECTOR_PROBE = (
    "void f(float *restrict x, int n) {\n#pragma omp simd\n"
    "for (int i = 0; i < n; i++) x[i] = sinf(x[i]) + cosf(x[i]);\n}\n"
)

# k<n>: the float32 round trip over n elements, for each n of a few lanes (as the kernels' loops have them)
ROUND_TRIP_PROBE = """#include <stdint.h>
#define K(n) void k##n(const double *restrict x, uint8_t *restrict same, double *restrict diff) { \\
    for (int64_t i = 0; i < n; i++) { const float r = (float)x[i]; same[i] = (double)r == x[i]; \\
                                       diff[i] = (double)r - x[i]; } }
K(2) K(3) K(4) K(5) K(8) K(13)
"""
ROUND_TRIP_LANES = (2, 3, 4, 5, 8, 13)


def round_trip_kept(lib: ctypes.CDLL) -> bool:
    """Does :data:`ROUND_TRIP_PROBE`, built and loaded as ``lib``, keep (double)(float)x's rounding for every loop
    length? 1 + 2**-40 is not a float32, so each element must compare unequal and differ by -2**-40."""
    n = max(ROUND_TRIP_LANES)
    x = (ctypes.c_double * n)(*([1.0 + 2.0**-40] * n))
    for lanes in ROUND_TRIP_LANES:
        same, diff = (ctypes.c_uint8 * n)(*([7] * n)), (ctypes.c_double * n)(*([7.0] * n))
        getattr(lib, f"k{lanes}")(x, same, diff)
        if any(same[i] != 0 or diff[i] != -(2.0**-40) for i in range(lanes)):
            return False
    return True
