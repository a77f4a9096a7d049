/* rw_gelu_*: GPT-2's tanh GELU in one pass, in place or keeping its gate, and its
 * backward (kernels.c). */
#include "simd.h"

#if RW_SIMD

#define GELU_C1 1.5957691216057308f  /* 2 sqrt(2 / pi) */
#define GELU_C3 0.0713548162726009f  /* C1 * 0.044715 */

static inline __m256 sigmoid8(__m256 z)
{ /* 1 / (1 + exp(-z)) through e = exp(-|z|) <= 1: no overflow */
    __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 e = exp_nonpos(_mm256_or_ps(z, sign));  /* -|z| */
    __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f)));
    __m256 neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_blendv_ps(inv, _mm256_mul_ps(e, inv), neg);
}

static inline float sigmoid1(float z)
{
    float e = expf(-fabsf(z));
    return z < 0 ? e / (1.0f + e) : 1.0f / (1.0f + e);
}

static inline __m256 gate8(__m256 a)
{
    __m256 a2 = _mm256_mul_ps(a, a);
    return sigmoid8(_mm256_mul_ps(a, _mm256_fmadd_ps(a2, _mm256_set1_ps(GELU_C3),
                                                     _mm256_set1_ps(GELU_C1))));
}

static inline float gate1(float a) { return sigmoid1(a * (GELU_C1 + GELU_C3 * a * a)); }

#define PAR_MIN 32768L  /* below this many elements, one thread */

/* a = gelu(a), in place */
void rw_gelu_(float *a, long n)
{
    long blocks = n / 8;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (long b = 0; b < blocks; b++) {
        __m256 x = LD(a + 8 * b);
        _mm256_storeu_ps(a + 8 * b, _mm256_mul_ps(x, gate8(x)));
    }
    for (long i = 8 * blocks; i < n; i++) a[i] *= gate1(a[i]);
}

/* y = gelu(a), s = its gate (for rw_gelu_backward) */
void rw_gelu_gate(const float *a, float *y, float *s, long n)
{
    long blocks = n / 8;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (long b = 0; b < blocks; b++) {
        __m256 x = LD(a + 8 * b), g = gate8(x);
        _mm256_storeu_ps(s + 8 * b, g);
        _mm256_storeu_ps(y + 8 * b, _mm256_mul_ps(x, g));
    }
    for (long i = 8 * blocks; i < n; i++) {
        s[i] = gate1(a[i]);
        y[i] = a[i] * s[i];
    }
}

/* dx = gy * s * (1 + a (1 - s) (C1 + 3 C3 a^2)); dx may be gy */
void rw_gelu_backward(const float *gy, const float *a, const float *s, float *dx, long n)
{
    long blocks = n / 8;
    const __m256 one = _mm256_set1_ps(1.0f), c1 = _mm256_set1_ps(GELU_C1),
                 c3 = _mm256_set1_ps(3.0f * GELU_C3);
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (long b = 0; b < blocks; b++) {
        __m256 x = LD(a + 8 * b), g = LD(s + 8 * b);
        __m256 d = _mm256_mul_ps(x, _mm256_fmadd_ps(_mm256_mul_ps(x, x), c3, c1));
        d = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_sub_ps(one, g)), g, g);
        _mm256_storeu_ps(dx + 8 * b, _mm256_mul_ps(d, LD(gy + 8 * b)));
    }
    for (long i = 8 * blocks; i < n; i++) {
        float x = a[i], g = s[i];
        float d = x * (GELU_C1 + 3.0f * GELU_C3 * x * x);
        dx[i] = (g + d * (1.0f - g) * g) * gy[i];
    }
}

#else

void rw_gelu_(float *a, long n) {}
void rw_gelu_gate(const float *a, float *y, float *s, long n) {}
void rw_gelu_backward(const float *gy, const float *a, const float *s, float *dx, long n) {}

#endif
