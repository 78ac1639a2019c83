/* exp variants A, B, C (exp_ulps.c) timed over 4096 floats in L1, 20000 times, one thread. */
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <stdlib.h>
typedef union { float f; uint32_t u; } fusion_bits;
#define H(p, r, c) __builtin_fmaf(p, r, c)
static inline float expA(float x) {
    float xx = x < -104.0f ? 0.0f : x;
    xx = xx > 89.0f ? 89.0f : xx;
    fusion_bits m = {.f = H(xx, 1.44269504088896341f, 12582912.0f)};
    float n = m.f - 12582912.0f;
    float r = xx - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500E-4f;
    p = H(p, r, 1.3981999507E-3f); p = H(p, r, 8.3334519073E-3f); p = H(p, r, 4.1665795894E-2f);
    p = H(p, r, 1.6666665459E-1f); p = H(p, r, 5.0000001201E-1f);
    float y = p * r * r + r + 1.0f;
    int32_t ni = (int32_t)(m.u - 0x4B400000u), n1 = ni >> 1, n2 = ni - n1;
    fusion_bits s1 = {.u = (uint32_t)(n1 + 127) << 23}, s2 = {.u = (uint32_t)(n2 + 127) << 23};
    return x < -104.0f ? 0.0f : y * s1.f * s2.f;
}
static inline float expB(float x) {
    float xx = x > 89.0f ? 89.0f : x;
    xx = x < -104.0f ? 0.0f : xx;
    fusion_bits m = {.f = H(xx, 1.44269504088896341f, 12582912.0f)};
    float n = m.f - 12582912.0f;
    float r = H(n, -0.693359375f, xx);
    r = H(n, 2.12194440e-4f, r);
    float p = 1.9875691500E-4f;
    p = H(p, r, 1.3981999507E-3f); p = H(p, r, 8.3334519073E-3f); p = H(p, r, 4.1665795894E-2f);
    p = H(p, r, 1.6666665459E-1f); p = H(p, r, 5.0000001201E-1f);
    float y = p * r * r + r + 1.0f;
    int32_t ni = (int32_t)(m.u - 0x4B400000u), n1 = ni >> 1, n2 = ni - n1;
    fusion_bits s1 = {.u = (uint32_t)(n1 + 127) << 23}, s2 = {.u = (uint32_t)(n2 + 127) << 23};
    return x < -104.0f ? 0.0f : y * s1.f * s2.f;
}
static inline float expC(float x) {
    float xx = x > 89.0f ? 89.0f : x;
    xx = x < -104.0f ? 0.0f : xx;
    fusion_bits m = {.f = H(xx, 1.44269504088896341f, 12582912.0f)};
    float n = m.f - 12582912.0f;
    float r = H(n, -0.693359375f, xx);
    r = H(n, 2.12194440e-4f, r);
    float p = 1.9875691500E-4f;
    p = H(p, r, 1.3981999507E-3f); p = H(p, r, 8.3334519073E-3f); p = H(p, r, 4.1665795894E-2f);
    p = H(p, r, 1.6666665459E-1f); p = H(p, r, 5.0000001201E-1f);
    float y = H(p, r * r, r) + 1.0f;
    int32_t ni = (int32_t)(m.u - 0x4B400000u), n1 = ni >> 1, n2 = ni - n1;
    fusion_bits s1 = {.u = (uint32_t)(n1 + 127) << 23}, s2 = {.u = (uint32_t)(n2 + 127) << 23};
    return x < -104.0f ? 0.0f : y * s1.f * s2.f;
}
#define KERN(NAME, FN) void NAME(const float *restrict a, float *restrict o, long n) { for (long i = 0; i < n; i++) o[i] = FN(a[i]); }
KERN(kA, expA) KERN(kB, expB) KERN(kC, expC)
typedef void (*kern)(const float *restrict, float *restrict, long);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static long bitdist(float got, double want) {
    float w = (float)want;
    if (isnan(w)) return isnan(got) ? 0 : 1000000;
    fusion_bits a = {.f = got}, b = {.f = w};
    long d = (long)a.u - (long)b.u; return d < 0 ? -d : d;
}

int main(void) {
    kern ks[3] = {kA, kB, kC}; const char *names[3] = {"A", "B", "C"};
    long N = 4096; float *a = aligned_alloc(64, N * 4), *o = aligned_alloc(64, N * 4);
    for (long i = 0; i < N; i++) a[i] = (float)((i * 2654435761u) % 2000) / 100.0f - 10.0f;
    for (int rep = 0; rep < 3; rep++)
    for (int k = 0; k < 3; k++) {
        ks[k](a, o, N);
        double t0 = now();
        for (int r = 0; r < 20000; r++) { ks[k](a, o, N); __asm__ volatile("" ::: "memory"); }
        double t = (now() - t0) / 20000 / N * 1e9;
        printf("%s: %.4f ns/elem\n", names[k], t);
    }
}
