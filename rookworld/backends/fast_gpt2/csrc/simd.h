/* Shared by rookworld's native kernels (x86-64, AVX2 and FMA): a vector exp for
 * non-positive arguments, sums, and 64-wide dot products and updates (heads of 64).
 * RW_SIMD is 1 where the compiler targets AVX2 and FMA; each kernel file then builds its
 * kernels, else stubs that report them unavailable (native.py keeps torch's operations). */
#ifndef RW_SIMD_H
#define RW_SIMD_H

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#if defined(__AVX2__) && defined(__FMA__)
#define RW_SIMD 1
#include <immintrin.h>

#define LD(p) _mm256_loadu_ps(p)

static inline __m256 exp_nonpos(__m256 x)
{ /* exp(x) for x <= 0 (scores minus their maximum): 2^n * p(r), Cephes' expf
     polynomial, within 2 ulp; x below -87.3 gives ~1e-38 (a sum it joins is >= 1) */
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline float hsum(__m256 a)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float max_of(const float *x, int L)
{
    float mx = -INFINITY;
    for (int j = 0; j < L; j++) mx = x[j] > mx ? x[j] : mx;
    return mx;
}

/* x[j] = exp(x[j] - shift) for j < L (every x[j] <= shift); returns their sum */
static inline float exp_shifted(float *x, int L, float shift)
{
    __m256 m8 = _mm256_set1_ps(shift), sum8 = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= L; j += 8) {
        __m256 e = exp_nonpos(_mm256_sub_ps(LD(x + j), m8));
        _mm256_storeu_ps(x + j, e);
        sum8 = _mm256_add_ps(sum8, e);
    }
    float sum = hsum(sum8);
    for (; j < L; j++) {
        x[j] = expf(x[j] - shift);
        sum += x[j];
    }
    return sum;
}

static inline float dot64(const float *q, const float *k)
{
    __m256 a = _mm256_mul_ps(LD(q), LD(k)), b = _mm256_mul_ps(LD(q + 8), LD(k + 8));
    a = _mm256_fmadd_ps(LD(q + 16), LD(k + 16), a);
    b = _mm256_fmadd_ps(LD(q + 24), LD(k + 24), b);
    a = _mm256_fmadd_ps(LD(q + 32), LD(k + 32), a);
    b = _mm256_fmadd_ps(LD(q + 40), LD(k + 40), b);
    a = _mm256_fmadd_ps(LD(q + 48), LD(k + 48), a);
    b = _mm256_fmadd_ps(LD(q + 56), LD(k + 56), b);
    return hsum(_mm256_add_ps(a, b));
}

static inline void axpy64(float w, const float *x, float *y)
{
    __m256 w8 = _mm256_set1_ps(w);
    for (int c = 0; c < 64; c += 8)
        _mm256_storeu_ps(y + c, _mm256_fmadd_ps(w8, LD(x + c), LD(y + c)));
}

static inline void copy64(const float *x, float *y)
{
    for (int c = 0; c < 64; c += 8) _mm256_storeu_ps(y + c, LD(x + c));
}

#else
#define RW_SIMD 0
#endif

#endif
