/* rw_decode_attention: the decoding step's attention over the sampler's grouped KV
 * cache (layout: kernels.c). */
#include "simd.h"

#if RW_SIMD

/* One (group, head): G rows. work: G * 64 (scaled queries) + G * 64 (sums) + G * W. */
static void group_head(const float *qkv, long qs, float *kv, const int *start, float *out,
                       int u, int h, int U, int G, int H, int S, int P, int t, float scale,
                       float *work)
{
    const size_t C = (size_t)H * 64, plane = (size_t)U * H * S * 64;
    float *kb = kv + ((size_t)u * H + h) * (size_t)S * 64, *vb = kb + plane;
    const int p0 = start[u], np = P - p0, L = np + t + 1, W = L + 8;
    float *qv = work, *acc = work + (size_t)G * 64, *sc = acc + (size_t)G * 64;
    __m256 s8 = _mm256_set1_ps(scale);
    for (int g = 0; g < G; g++) {
        const float *row = qkv + (size_t)(u * G + g) * qs + (size_t)h * 64;
        for (int c = 0; c < 64; c += 8)
            _mm256_storeu_ps(qv + g * 64 + c, _mm256_mul_ps(LD(row + c), s8));
        size_t slot = (size_t)(P + t * G + g) * 64;  /* this step's key and value */
        copy64(row + C, kb + slot);
        copy64(row + 2 * C, vb + slot);
    }
    for (int j = 0; j < np; j++) {  /* the group's prompt keys, shared by its rows */
        const float *k = kb + (size_t)(p0 + j) * 64;
        for (int g = 0; g < G; g++) sc[(size_t)g * W + j] = dot64(qv + g * 64, k);
    }
    for (int s = 0; s <= t; s++) {  /* completion slots in memory order */
        const float *k = kb + (size_t)(P + s * G) * 64;
        for (int g = 0; g < G; g++)
            sc[(size_t)g * W + np + s] = dot64(qv + g * 64, k + (size_t)g * 64);
    }
    for (int g = 0; g < G; g++) {  /* softmax numerators; 1 / sum into qv[g * 64] */
        float *x = sc + (size_t)g * W;
        qv[g * 64] = 1.0f / exp_shifted(x, L, max_of(x, L));
    }
    for (size_t c = 0; c < (size_t)G * 64; c++) acc[c] = 0.0f;
    for (int j = 0; j < np; j++) {
        const float *v = vb + (size_t)(p0 + j) * 64;
        for (int g = 0; g < G; g++) axpy64(sc[(size_t)g * W + j], v, acc + g * 64);
    }
    for (int s = 0; s <= t; s++) {
        const float *v = vb + (size_t)(P + s * G) * 64;
        for (int g = 0; g < G; g++)
            axpy64(sc[(size_t)g * W + np + s], v + (size_t)g * 64, acc + g * 64);
    }
    for (int g = 0; g < G; g++) {
        float *o = out + (size_t)(u * G + g) * C + (size_t)h * 64;
        __m256 inv = _mm256_set1_ps(qv[g * 64]);
        for (int c = 0; c < 64; c += 8)
            _mm256_storeu_ps(o + c, _mm256_mul_ps(LD(acc + g * 64 + c), inv));
    }
}

int rw_decode_attention(const float *qkv, long qs, float *kv, const int *start, float *out,
                        int U, int G, int H, int S, int P, int t, float scale)
{
    const size_t per = (size_t)G * 128 + (size_t)G * (P + t + 1 + 8);
    int failed = 0;
#pragma omp parallel
    {
        float *work = malloc(per * sizeof(float));
        if (!work) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for collapse(2) schedule(static)
        for (int u = 0; u < U; u++)
            for (int h = 0; h < H; h++)
                if (work)
                    group_head(qkv, qs, kv, start, out, u, h, U, G, H, S, P, t, scale, work);
        free(work);
    }
    return failed ? -1 : 0;
}

#else

int rw_decode_attention(const float *qkv, long qs, float *kv, const int *start, float *out,
                        int U, int G, int H, int S, int P, int t, float scale)
{
    return -1;
}

#endif
