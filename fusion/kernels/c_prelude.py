"""The C helpers every rendered kernel starts with (``fusion.kernels.c_render``): float16/bfloat16 bit conversions
rounding to nearest even, vectorizable float32 exp/erf/tanh, integer and floating division and remainder with torch's
signs. Plain C99, no libm call in the float32 paths the loops vectorize."""

from __future__ import annotations

# glibc's vector sinf and cosf (libmvec): declared "simd", gcc calls their 8-lane versions from a vectorized loop.
# Only where the compiler probe found them (fusion.kernels.c_probes.VECTOR_LIBM defines FUSION_LIBMVEC).
VECTOR_LIBM_DECLARATIONS = """float sinf(float) __attribute__((simd("notinbranch")));
float cosf(float) __attribute__((simd("notinbranch")));
"""

PRELUDE = (
    r"""#include <stdint.h>
#include <stdbool.h>
#include <math.h>
#ifdef FUSION_LIBMVEC
"""
    + VECTOR_LIBM_DECLARATIONS
    + r"""#endif

typedef union { uint32_t u; float f; } fusion_bits;

/* float16 <-> float32, exact (F. Giesen's conversions): subnormals, inf and NaN included, ties to even. */
static inline float fusion_h2f(uint16_t h) {
    fusion_bits o, magic = {.u = 113u << 23};
    const uint32_t shifted = 0x7c00u << 13;
    o.u = (uint32_t)(h & 0x7fff) << 13;
    uint32_t exp = shifted & o.u;
    o.u += (uint32_t)(127 - 15) << 23;
    if (exp == shifted) o.u += (uint32_t)(128 - 16) << 23;
    else if (exp == 0) { o.u += 1u << 23; o.f -= magic.f; }
    o.u |= (uint32_t)(h & 0x8000) << 16;
    return o.f;
}
static inline uint16_t fusion_f2h(float f) {
    fusion_bits in = {.f = f}, infty = {.u = 255u << 23}, f16max = {.u = (127u + 16u) << 23};
    fusion_bits denorm = {.u = ((127u - 15u) + (23u - 10u) + 1u) << 23};
    uint32_t sign = in.u & 0x80000000u;
    uint16_t o;
    in.u ^= sign;
    if (in.u >= f16max.u) o = in.u > infty.u ? 0x7e00 : 0x7c00;
    else if (in.u < (113u << 23)) { in.f += denorm.f; o = (uint16_t)(in.u - denorm.u); }
    else { uint32_t odd = (in.u >> 13) & 1u; in.u += ((uint32_t)(15 - 127) << 23) + 0xfffu; in.u += odd; o = (uint16_t)(in.u >> 13); }
    return (uint16_t)(o | (sign >> 16));
}
/* bfloat16 <-> float32: the upper half of the bits, rounded to nearest even; NaN is 0x7FC0 (c10's). */
static inline float fusion_bf2f(uint16_t b) { fusion_bits o = {.u = (uint32_t)b << 16}; return o.f; }
static inline uint16_t fusion_f2bf(float f) {
    fusion_bits in = {.f = f};
    if (f != f) return 0x7fc0;
    return (uint16_t)((in.u + 0x7fffu + ((in.u >> 16) & 1u)) >> 16);
}
static inline float fusion_round_f16(float f) { return fusion_h2f(fusion_f2h(f)); }
static inline float fusion_round_bf16(float f) { return fusion_bf2f(fusion_f2bf(f)); }

/* exp for float32, vectorizable (within 1 ulp): n = round(x / ln 2) by the 1.5 * 2^23 trick (no float -> int
   conversion, NaN included), Cody-Waite reduction, Cephes' polynomial, 2^n applied in two halves (subnormal results
   rounded once); NaN in, NaN out; +-inf and overflow as expf. n's rounding, the reduction and the polynomial's
   steps are fused multiply-adds where the CPU has them (-march=native: __FMA__; 10% of a BatchNorm+SiLU kernel, n's
   13 % of an exp on AVX-512, the reduction's and p r^2 + r's another 16 %), two roundings each elsewhere: within 1
   ulp either way over every float (checked exhaustively, subnormal results included). */
#ifdef __FMA__
#define FUSION_HORNER(p, r, c) __builtin_fmaf(p, r, c)  /* one rounding a step: the polynomial in half the ops */
#else
#define FUSION_HORNER(p, r, c) ((p) * (r) + (c))
#endif
static inline float fusion_expf(float x) {
    /* Below -104 the result rounds to 0: those lanes compute exp(0) and are replaced by 0 at the end. Computed from
       -104 they made a subnormal 2^-150 * y, and a subnormal result costs a microcode assist per lane on x86 (a
       softmax over -inf masked scores pays one for every masked entry). Each bound tests x itself (nested, gcc
       vectorized them as seven mask ops instead of four). */
    float xx = x > 89.0f ? 89.0f : x;
    xx = x < -104.0f ? 0.0f : xx;
    fusion_bits m = {.f = FUSION_HORNER(xx, 1.44269504088896341f, 12582912.0f)};  /* n = round(x / ln 2) */
    float n = m.f - 12582912.0f;
    float r = FUSION_HORNER(n, -0.693359375f, xx);  /* n * ln2's high part is exact (n < 2^8, 9 bits): one rounding */
    r = FUSION_HORNER(n, 2.12194440e-4f, r);
    float p = 1.9875691500E-4f;
    p = FUSION_HORNER(p, r, 1.3981999507E-3f);
    p = FUSION_HORNER(p, r, 8.3334519073E-3f);
    p = FUSION_HORNER(p, r, 4.1665795894E-2f);
    p = FUSION_HORNER(p, r, 1.6666665459E-1f);
    p = FUSION_HORNER(p, r, 5.0000001201E-1f);
    float y = FUSION_HORNER(p, r * r, r) + 1.0f;
    int32_t ni = (int32_t)(m.u - 0x4B400000u), n1 = ni >> 1, n2 = ni - n1;
    fusion_bits s1 = {.u = (uint32_t)(n1 + 127) << 23}, s2 = {.u = (uint32_t)(n2 + 127) << 23};
    return x < -104.0f ? 0.0f : y * s1.f * s2.f;
}
/* erf for float32, vectorizable, within 1.5 ulp of the float64 value (eager's is within 1). Below |x| = 1:
   x + x * q(x^2), q a least-squares fit of erf(x) / x - 1 (relative error 1.2e-9). Above: 1 - erfc(a), a = |x|,
   with erfc(a) = exp(-a^2) t g(t), t = 1 / (1 + a / 2), g a fit of degree 6 (relative error 6.3e-9; both fits:
   scripts/fit_erf.py). exp(-a^2) is exp(-s) (1 - r) where the CPU has fused multiply-adds (s = a * a rounded, r
   its rounding error, exact by one fma), else exp(-h^2) exp(-l (a + h)) with h = a rounded down to 1/1024 (h^2
   exact in float32), l = a - h, the small second factor a cubic. So the square's rounding does not become exp's
   error, which 1 - erfc would keep as an error of erf near 1: GELU at -3 is x (1 + erf) / 2 with 1 + erf = 0.0027,
   and A&S 7.1.26, used before, was 5 ulp off there (4e-5 of GELU). Past |x| = 4 it computes at 4, where erf
   rounds to +-1 (no subnormal exp). NaN passes; the polynomials' steps are fused multiply-adds where the CPU has
   them. */
static inline float fusion_erff(float x) {
    float a = fabsf(x), z = x * x;
    float q = 7.847262424e-05f;
    q = FUSION_HORNER(q, z, -8.008193334e-04f);
    q = FUSION_HORNER(q, z, 5.188099769e-03f);
    q = FUSION_HORNER(q, z, -2.685369186e-02f);
    q = FUSION_HORNER(q, z, 1.128358228e-01f);
    q = FUSION_HORNER(q, z, -3.761262557e-01f);
    q = FUSION_HORNER(q, z, 1.283791657e-01f);
    float small = FUSION_HORNER(x, q, x);  /* -0 stays -0 */
    float b = a > 4.0f ? 4.0f : a;
#ifdef __FMA__
    float bb = b * b, e = fusion_expf(-bb) * (1.0f - __builtin_fmaf(b, b, -bb));  /* b * b's rounding, exactly */
#else
    float h = floorf(b * 1024.0f) * (1.0f / 1024.0f), d = (b - h) * (b + h);
    float e = fusion_expf(-(h * h)) * (1.0f - d * (1.0f - d * (0.5f - d * (1.0f / 6.0f))));
#endif
    float t = 1.0f / FUSION_HORNER(0.5f, b, 1.0f);
    float g = 9.255158917e-02f;
    g = FUSION_HORNER(g, t, -3.787587290e-01f);
    g = FUSION_HORNER(g, t, 4.278956801e-01f);
    g = FUSION_HORNER(g, t, 5.460418868e-03f);
    g = FUSION_HORNER(g, t, 2.955901296e-01f);
    g = FUSION_HORNER(g, t, 2.745361988e-01f);
    g = FUSION_HORNER(g, t, 2.825897817e-01f);
    float big = 1.0f - e * (t * g);
    big = x < 0 ? -big : big;
    return a < 1.0f ? small : big;
}
/* tanh for float32, vectorizable: 1 - 2e / (1 + e) with e = exp(-2|x|), and below 0.55 its Taylor series. Not
   (1 - e) / (1 + e): near saturation 1 - e rounds to 1 and the quotient is 1.0 where tanh is 1 - 2e, one ulp below
   (tanh(8.9866) = 0.99999997: 0.99999994 as float32, which an int cast truncates to 0 and 1.0 to 1; a fuzzer find). */
static inline float fusion_tanhf(float x) {
    float a = fabsf(x), z = x * x;
    float s = -929569.0f / 638512875.0f;
    s = s * z + 21844.0f / 6081075.0f;
    s = s * z - 1382.0f / 155925.0f;
    s = s * z + 62.0f / 2835.0f;
    s = s * z - 17.0f / 315.0f;
    s = s * z + 2.0f / 15.0f;
    s = s * z - 1.0f / 3.0f;
    float small = x * (1.0f + z * s);  /* -0 stays -0 */
    float e = fusion_expf(-2.0f * (a > 20.0f ? 20.0f : a));  /* tanh rounds to +-1 past 20; no subnormal e; NaN passes */
    float big = 1.0f - 2.0f * e / (1.0f + e);
    big = x < 0 ? -big : big;
    return a < 0.55f ? small : big;
}
/* Integer division with torch's (Python's) signs; a zero divisor gives 0 (torch raises; a kernel cannot). */
static inline int64_t fusion_floordiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return (int64_t)(0 - (uint64_t)a);
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t fusion_truncdiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return (int64_t)(0 - (uint64_t)a);
    return a / b;
}
static inline int64_t fusion_remainder(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
/* Floating floor division and remainder as c10's div_floor_floating / remainder. */
static inline double fusion_floordiv_d(double a, double b) {
    if (b == 0) return a / b;
    double m = fmod(a, b), d = (a - m) / b;
    if (m != 0 && ((b < 0) != (m < 0))) d -= 1;
    if (d != 0) { double f = floor(d); if (d - f > 0.5) f += 1.0; return f; }
    return copysign(0.0, a / b);
}
static inline float fusion_floordiv_f(float a, float b) {
    if (b == 0) return a / b;
    float m = fmodf(a, b), d = (a - m) / b;
    if (m != 0 && ((b < 0) != (m < 0))) d -= 1;
    if (d != 0) { float f = floorf(d); if (d - f > 0.5f) f += 1.0f; return f; }
    return copysignf(0.0f, a / b);
}
static inline double fusion_remainder_d(double a, double b) {
    double m = fmod(a, b);
    return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
}
static inline float fusion_remainder_f(float a, float b) {
    float m = fmodf(a, b);
    return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
}
/* Philox4x32-10 keyed by seed (low word, high word), counter (offset, 0, 0, 0); the first word as Triton's
   uint_to_uniform_float: bit for bit tl.rand(seed, offset) (fusion.compiler.random_ops has the same in torch). */
static inline uint32_t fusion_mulhi32(uint32_t a, uint32_t b) { return (uint32_t)(((uint64_t)a * b) >> 32); }
static inline float fusion_rand(int64_t seed, int64_t offset) {
    uint32_t c0 = (uint32_t)offset, c1 = (uint32_t)((uint64_t)offset >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)((uint64_t)seed >> 32);
    for (int i = 0; i < 10; i++) {
        const uint32_t hb = fusion_mulhi32(0xCD9E8D57u, c2), ha = fusion_mulhi32(0xD2511F53u, c0);
        const uint32_t lb = 0xCD9E8D57u * c2, la = 0xD2511F53u * c0;
        c0 = hb ^ c1 ^ k0; c2 = ha ^ c3 ^ k1; c1 = lb; c3 = la;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    int32_t x = (int32_t)c0;
    x = x < 0 ? ~x : x;
    return (float)x * 4.6566127342e-10f;
}
"""
)
