"""What the C renderer's compiler is probed with before its first kernel (``c_runtime``'s flags): small sources a
flag must build (and load), and a miscompile that only running the code shows.

* :data:`PROBE` — a parallel loop of ``expf``: each flag (``-march=native``, ``-mno-red-zone``, OpenMP) is kept where it
  builds; :data:`VECTOR_PROBE` — libmvec's ``sinf`` and ``cosf`` in a SIMD loop (:data:`VECTOR_LIBM` kept where it
  also loads).
* :data:`ROUND_TRIP_PROBE` with :func:`round_trip_kept` — the float32 round trip of float64 values, run: gcc 12.2 with
  AVX-512VL (``-march=native`` on an Intel Xeon) folds ``(double)(float)x`` into ``x`` where its SLP vectorizer packs a
  few elements (a loop of 2 to 40, a long loop's tail): ``x.abs().to(torch.float32) == x`` gave True for a float64 x
  that float32 cannot hold (the fuzzer's long run, 2026-11-28). ``c_runtime`` turns that vectorizer off where the
  loaded probe loses the rounding.
* :data:`SUNK_SELECT_PROBE` with :func:`sunk_select_kept` — a select of a loaded value by a compare of another, in a
  loop nest whose inner loop has 3 to 7 steps, run: gcc 12.2 (``-march=native``, AVX or AVX-512) sinks the load
  into the select's taken branch (tree-sink), unrolls the inner loop, vectorizes the outer one with the loads as one
  interleaved group of masked loads, and picks the wrong lanes' masks (a gradient through ``clamp_min`` came out 0
  where eager gives 0.40; the fuzzer's long run, 2026-11-28). ``c_runtime`` turns tree sinking off where the probe
  gets a wrong value: the loads stay unconditional, and the select a blend.
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


# glibc's vector math library (libmvec, x86-64 Linux): with the prelude's simd declarations (FUSION_LIBMVEC) gcc
# calls its 8-lane sinf/cosf from a vectorized loop. Not folded into one scalar sincosf: gcc does that to a sinf and
# a cosf of one value (a rotary embedding has both), and the scalar call stops the loop's vectorization. Measured on
# the course's CPU (8192 of each, 2026-11-27): 32.1 us scalar, 8.7 us vector; within 1.52 ulp of float64 (scalar
# glibc 0.56, eager's Sleef <= 1.0).
VECTOR_LIBM = ["-DFUSION_LIBMVEC", "-fno-builtin-sinf", "-fno-builtin-cosf"]


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


# s<k>: the kernel the fuzzer found (a where's mask m over the inner loop, a clamp's backward), 64 rows of k elements;
# every load unconditional, as the renderer writes them
SUNK_SELECT_PROBE = """#include <stdint.h>
#define S(k) void s##k(const uint8_t *restrict m, const float *restrict a, const float *restrict c, \\
                       const float *restrict z, float *restrict out) { \\
    for (int64_t x1 = 0; x1 < 64; x1++) { const float t9 = z[0]; for (int64_t x2 = 0; x2 < k; x2++) { \\
        const int32_t t0 = (m[x2] != 0); const float t2 = a[x2 + k*x1]; const float t4 = (t0 ? t2 : 0.0f); \\
        const int32_t t7 = ((t4 + 0.1f) > 0.1f); const float t8 = c[x2 + k*x1]; const float t10 = (t7 ? t8 : t9); \\
        out[x2 + k*x1] = (t0 ? t10 : t9); } } }
S(3) S(5) S(6) S(7)
"""
SUNK_SELECT_STEPS = (3, 5, 6, 7)


def sunk_select_kept(lib: ctypes.CDLL) -> bool:
    """Does :data:`SUNK_SELECT_PROBE`, built and loaded as ``lib``, select the right value at every element, for
    every inner loop length? Values of pseudo-random signs (a fixed sequence), so a lane that takes another
    element's compare is wrong somewhere."""
    for k in SUNK_SELECT_STEPS:
        n = 64 * k
        a = (ctypes.c_float * n)(*[((i * 2654435761) % 1000) / 1000.0 - 0.5 for i in range(n)])
        c = (ctypes.c_float * n)(*[float(i + 1) for i in range(n)])
        m, z, out = (ctypes.c_uint8 * k)(*([1] * k)), (ctypes.c_float * 1)(0.0), (ctypes.c_float * n)(*([7.0] * n))
        getattr(lib, f"s{k}")(m, a, c, z, out)
        if any(out[i] != (c[i] if a[i] + 0.1 > 0.1 else 0.0) for i in range(n)):
            return False
    return True


# The miscompiles above as c_runtime checks them when it sets the compiler up, in order: (probe, its check, the flag
# that avoids the miscompile where the check fails, what goes wrong). Read at each setup (a test may change it).
MISCOMPILES = (
    (ROUND_TRIP_PROBE, round_trip_kept, "-fno-tree-slp-vectorize", "folds a float32 rounding away"),
    (SUNK_SELECT_PROBE, sunk_select_kept, "-fno-tree-sink", "selects a loaded value by another element's compare"),
)
