/* rookworld's native CPU kernels, float32, x86-64 with AVX2 and FMA. Built at first use
 * by rookworld/native.py (-O3 -march=native -fopenmp) and run on torch's OpenMP threads;
 * without a compiler, or on other CPUs, callers keep torch's operations.
 *
 * rw_decode_attention: the decoding step's attention over the sampler's grouped KV cache
 * (rookworld/sampling.py, KVCache), heads of 64. torch's attention for the group layout
 * runs each group's G queries over the whole group block (the G - 1 other rows'
 * completion keys masked), and at decoding sizes its per-call overhead and that G-fold
 * work dominate; here each row reads only its own keys, and the rows of a group walk
 * their block together in memory order (the step is bound by reading the cache, ~20 MB
 * a layer at 8 x 8 x 160).
 *
 * Layout (one layer): kv [2, U, H, S, 64]; slots 0..P-1 hold group u's prompt, valid
 * from start[u] (left padding before it); completion token s of the group's row g sits
 * at slot P + s * G + g. qkv: row n = u * G + g at qkv + n * qs, [q | k | v] each H * 64
 * floats. The step's keys and values (token t) are written into their slots, then each
 * row attends over its prompt and its completion tokens 0..t: out [N, H * 64].
 *
 * rw_prefix_attention(_backward): the teacher-forced attention of the reference pass and
 * the update (rookworld/forward_attention.py, prompt_completion_attention) on the qkv product itself,
 * without the per-row copies of each prompt's keys and the mask torch's path builds.
 *
 * rw_gelu_*: GPT-2's tanh GELU in its sigmoid form, a * sigmoid(a (C1 + C3 a^2)), in one
 * pass over memory (torch's takes six and a temporary; rookworld/forward_gelu.py, gelu_tanh
 * and Gelu). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#if defined(__AVX2__) && defined(__FMA__)
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
static float exp_shifted(float *x, int L, float shift)
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


/* ---- GELU ---- */
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

/* ---- teacher-forced attention over distinct prompts and their groups' completions ----
 * Tokens are rows of qkv [M, 3C] ([q | k | v], heads of 64): first the U distinct
 * prompts' P tokens each (prompt u's token i at row u P + i, real from start[u]), then
 * N = B G completion rows of s tokens (row n = b G + g of block b, whose prompt is
 * order[b]; its token j at row U P + (time_major ? j N + n : n s + j)). A real prompt
 * token attends causally over its prompt's real tokens, a padding one to itself only; a
 * completion token over its prompt's real tokens and its own row's tokens 0..j.
 * One task per (prompt, head) owns every query that reads that prompt's keys, so the
 * backward's key and value gradients need no atomics. */

typedef struct {
    const float *qkv;
    long ldq;
    int U, P, B, G, s, H, tm;
    const int *start, *order;
    float scale;
} prefix_t;

static inline long comp_row(const prefix_t *a, int n, int j)
{
    long mp = (long)a->U * a->P, N = (long)a->B * a->G;
    return mp + (a->tm ? (long)j * N + n : (long)n * a->s + j);
}

/* The query sets of task (prompt u, head h), both directions walk them alike: the
   prompt's real tokens (keys = queries, rows start..P-1, query i sees the first i + 1),
   then each completion row n of the prompt's blocks (keys: the prompt's np real tokens,
   then the row's s tokens; its token j sees the first np + j + 1). */
static int prompt_set(const prefix_t *a, int u, long *qrows, int *len, long *krows)
{
    const int st = a->start[u], np = a->P - st;
    for (int i = 0; i < np; i++) {
        krows[i] = qrows[i] = (long)u * a->P + st + i;
        len[i] = i + 1;
    }
    return np;
}

static void row_set(const prefix_t *a, int n, int np, long *qrows, int *len, long *krows)
{
    for (int j = 0; j < a->s; j++) {
        krows[np + j] = qrows[j] = comp_row(a, n, j);
        len[j] = np + j + 1;
    }
}

typedef struct {
    float *out;  /* [M, C] (row stride ldo): written forward, read backward */
    long ldo;
    float *lse;  /* [M, H] */
    const float *dout;  /* backward: [M, C] (row stride ldd) */
    long ldd;
    float *dqkv;  /* backward: [M, 3C] (row stride ldg), zeroed by the caller */
    long ldg;
} prefix_io;

/* w[j] = scale * q . (base + rows[j] * ld)[0..64) for j < L, four keys at a time (eight
   independent accumulator chains, one horizontal reduction per four) */
static void dots64(const float *q, const float *base, const long *rows, long ld, int L,
                   float scale, float *w)
{
    __m256 qv[8];
    for (int c = 0; c < 8; c++) qv[c] = LD(q + 8 * c);
    int j = 0;
    for (; j + 4 <= L; j += 4) {
        const float *k0 = base + rows[j] * ld, *k1 = base + rows[j + 1] * ld,
                    *k2 = base + rows[j + 2] * ld, *k3 = base + rows[j + 3] * ld;
        __m256 a0 = _mm256_mul_ps(qv[0], LD(k0)), b0 = _mm256_mul_ps(qv[1], LD(k0 + 8));
        __m256 a1 = _mm256_mul_ps(qv[0], LD(k1)), b1 = _mm256_mul_ps(qv[1], LD(k1 + 8));
        __m256 a2 = _mm256_mul_ps(qv[0], LD(k2)), b2 = _mm256_mul_ps(qv[1], LD(k2 + 8));
        __m256 a3 = _mm256_mul_ps(qv[0], LD(k3)), b3 = _mm256_mul_ps(qv[1], LD(k3 + 8));
        for (int c = 2; c < 8; c += 2) {
            a0 = _mm256_fmadd_ps(qv[c], LD(k0 + 8 * c), a0);
            b0 = _mm256_fmadd_ps(qv[c + 1], LD(k0 + 8 * c + 8), b0);
            a1 = _mm256_fmadd_ps(qv[c], LD(k1 + 8 * c), a1);
            b1 = _mm256_fmadd_ps(qv[c + 1], LD(k1 + 8 * c + 8), b1);
            a2 = _mm256_fmadd_ps(qv[c], LD(k2 + 8 * c), a2);
            b2 = _mm256_fmadd_ps(qv[c + 1], LD(k2 + 8 * c + 8), b2);
            a3 = _mm256_fmadd_ps(qv[c], LD(k3 + 8 * c), a3);
            b3 = _mm256_fmadd_ps(qv[c + 1], LD(k3 + 8 * c + 8), b3);
        }
        __m256 s01 = _mm256_hadd_ps(_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1));
        __m256 s23 = _mm256_hadd_ps(_mm256_add_ps(a2, b2), _mm256_add_ps(a3, b3));
        __m256 s4 = _mm256_hadd_ps(s01, s23);
        __m128 r = _mm_add_ps(_mm256_castps256_ps128(s4), _mm256_extractf128_ps(s4, 1));
        _mm_storeu_ps(w + j, _mm_mul_ps(r, _mm_set1_ps(scale)));
    }
    for (; j < L; j++) w[j] = dot64(q, base + rows[j] * ld) * scale;
}

/* The forward of one query set (see prompt_set): each query's weights in w, its output
   and log-sum-exp into io. */
static void forward_set(const prefix_t *a, const prefix_io *io, int h, const long *qrows,
                        const int *len, int nq, const long *krows, float *w)
{
    const long C = (long)a->H * 64, hd = (long)h * 64;
    for (int i = 0; i < nq; i++) {
        const long row = qrows[i];
        const int L = len[i];
        dots64(a->qkv + row * a->ldq + hd, a->qkv + C + hd, krows, a->ldq, L, a->scale, w);
        const float mx = max_of(w, L), sum = exp_shifted(w, L, mx), inv = 1.0f / sum;
        io->lse[row * a->H + h] = mx + logf(sum);
        __m256 o[8];
        for (int c = 0; c < 8; c++) o[c] = _mm256_setzero_ps();
        for (int j = 0; j < L; j++) {
            const float *v = a->qkv + krows[j] * a->ldq + 2 * C + hd;
            __m256 wj = _mm256_set1_ps(w[j] * inv);
            for (int c = 0; c < 8; c++) o[c] = _mm256_fmadd_ps(wj, LD(v + 8 * c), o[c]);
        }
        float *dst = io->out + row * io->ldo + hd;
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(dst + 8 * c, o[c]);
    }
}

/* The backward of one query set: queries qrows[0..nq) of head h, query i attending over
   the first len[i] of the keys krows[0..nk) (len non-decreasing). Pass 1, query by query:
   the weights P and dS into pw, ps ([nq, nk]) and dq; pass 2, key by key: dk and dv summed
   in registers over the queries that see the key, added to dqkv once. */
static void backward_set(const prefix_t *a, const prefix_io *io, int h, const long *qrows,
                         const int *len, int nq, const long *krows, int nk, float *pw,
                         float *ps)
{
    const long C = (long)a->H * 64, hd = (long)h * 64, ldo = io->ldo, ldd = io->ldd,
               ldg = io->ldg;
    const float *qkv = a->qkv, *out = io->out, *lse = io->lse, *dout = io->dout;
    float *dqkv = io->dqkv;
    for (int i = 0; i < nq; i++) {
        const long row = qrows[i];
        const int L = len[i];
        const float *q = qkv + row * a->ldq + hd, *dO = dout + row * ldd + hd;
        const float D = dot64(dO, out + row * ldo + hd), l = lse[row * a->H + h];
        float *w = pw + (long)i * nk, *d = ps + (long)i * nk;
        dots64(q, qkv + C + hd, krows, a->ldq, L, a->scale, w);
        exp_shifted(w, L, l);  /* the weights: exp(score - lse) */
        __m256 dq[8];
        for (int c = 0; c < 8; c++) dq[c] = _mm256_setzero_ps();
        dots64(dO, qkv + 2 * C + hd, krows, a->ldq, L, 1.0f, d);  /* dO . v */
        for (int j = 0; j < L; j++) {
            const float *k = qkv + krows[j] * a->ldq + C + hd;
            d[j] = w[j] * (d[j] - D) * a->scale;
            __m256 d8 = _mm256_set1_ps(d[j]);
            for (int c = 0; c < 8; c++) dq[c] = _mm256_fmadd_ps(d8, LD(k + 8 * c), dq[c]);
        }
        float *g = dqkv + row * ldg + hd;
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(g + 8 * c, _mm256_add_ps(LD(g + 8 * c), dq[c]));
    }
    int i0 = 0;
    for (int j = 0; j < nk; j++) {
        while (i0 < nq && len[i0] <= j) i0++;
        if (i0 == nq) break;
        __m256 dk[8], dv[8];
        for (int c = 0; c < 8; c++) dk[c] = dv[c] = _mm256_setzero_ps();
        for (int i = i0; i < nq; i++) {
            const long row = qrows[i];
            const float *q = qkv + row * a->ldq + hd, *dO = dout + row * ldd + hd;
            __m256 p8 = _mm256_set1_ps(pw[(long)i * nk + j]), s8 = _mm256_set1_ps(ps[(long)i * nk + j]);
            for (int c = 0; c < 8; c++) {
                dv[c] = _mm256_fmadd_ps(p8, LD(dO + 8 * c), dv[c]);
                dk[c] = _mm256_fmadd_ps(s8, LD(q + 8 * c), dk[c]);
            }
        }
        float *gk = dqkv + krows[j] * ldg + C + hd, *gv = gk + C;
        for (int c = 0; c < 8; c++) {
            _mm256_storeu_ps(gk + 8 * c, _mm256_add_ps(LD(gk + 8 * c), dk[c]));
            _mm256_storeu_ps(gv + 8 * c, _mm256_add_ps(LD(gv + 8 * c), dv[c]));
        }
    }
}

/* Every task (prompt, head), forward or backward; -1 when work space ran out. */
static int prefix_tasks(const prefix_t *a, const prefix_io *io, int backward)
{
    const long C = (long)a->H * 64, most = a->P > a->s ? a->P : a->s, nk = a->P + a->s;
    int failed = 0;
#pragma omp parallel
    {
        long *qrows = malloc(sizeof(long) * most), *krows = malloc(sizeof(long) * nk);
        int *len = malloc(sizeof(int) * most);
        /* weights: one query's forward, a whole set's backward (with dS) */
        float *pw = malloc(sizeof(float) * (backward ? most * nk : nk));
        float *ps = backward ? malloc(sizeof(float) * most * nk) : NULL;
        const int ok = qrows && krows && len && pw && (ps || !backward);
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for collapse(2) schedule(dynamic)
        for (int u = 0; u < a->U; u++)
            for (int h = 0; h < a->H; h++) {
                if (!ok) continue;
                const long hd = (long)h * 64;
                for (int i = 0; i < a->start[u]; i++) {  /* padding attends to itself */
                    const long row = (long)u * a->P + i;
                    const float *q = a->qkv + row * a->ldq + hd;
                    if (backward)  /* weight 1, dS 0: only v's gradient */
                        axpy64(1.0f, io->dout + row * io->ldd + hd,
                               io->dqkv + row * io->ldg + 2 * C + hd);
                    else {
                        io->lse[row * a->H + h] = dot64(q, q + C) * a->scale;
                        copy64(q + 2 * C, io->out + row * io->ldo + hd);
                    }
                }
                const int np = prompt_set(a, u, qrows, len, krows);
                if (backward)
                    backward_set(a, io, h, qrows, len, np, krows, np, pw, ps);
                else
                    forward_set(a, io, h, qrows, len, np, krows, pw);
                for (int b = 0; b < a->B; b++) {
                    if (a->order[b] != u) continue;
                    for (int g = 0; g < a->G; g++) {
                        row_set(a, b * a->G + g, np, qrows, len, krows);
                        if (backward)
                            backward_set(a, io, h, qrows, len, a->s, krows, np + a->s, pw, ps);
                        else
                            forward_set(a, io, h, qrows, len, a->s, krows, pw);
                    }
                }
            }
        free(qrows);
        free(krows);
        free(len);
        free(pw);
        free(ps);
    }
    return failed ? -1 : 0;
}

/* out [M, C] (row stride ldo), lse [M, H] */
int rw_prefix_attention(const float *qkv, long ldq, float *out, long ldo, float *lse, int U,
                        int P, const int *start, int B, int G, const int *order, int s,
                        int time_major, int H, float scale)
{
    prefix_t a = {qkv, ldq, U, P, B, G, s, H, time_major, start, order, scale};
    prefix_io io = {out, ldo, lse, NULL, 0, NULL, 0};
    return prefix_tasks(&a, &io, 0);
}

/* dqkv [M, 3C] (row stride ldg, zeroed by the caller) from dout [M, C] (row stride ldd),
   the forward's out and lse */
int rw_prefix_attention_backward(const float *qkv, long ldq, const float *out, long ldo,
                                 const float *lse, const float *dout, long ldd, float *dqkv,
                                 long ldg, int U, int P, const int *start, int B, int G,
                                 const int *order, int s, int time_major, int H, float scale)
{
    prefix_t a = {qkv, ldq, U, P, B, G, s, H, time_major, start, order, scale};
    prefix_io io = {(float *)out, ldo, (float *)lse, dout, ldd, dqkv, ldg};
    return prefix_tasks(&a, &io, 1);
}

int rw_available(void) { return 1; }

#else

int rw_decode_attention(const float *qkv, long qs, float *kv, const int *start, float *out,
                        int U, int G, int H, int S, int P, int t, float scale)
{
    return -1;
}

void rw_gelu_(float *a, long n) {}
int rw_prefix_attention(const float *qkv, long ldq, float *out, long ldo, float *lse, int U,
                        int P, const int *start, int B, int G, const int *order, int s,
                        int time_major, int H, float scale) { return -1; }
int rw_prefix_attention_backward(const float *qkv, long ldq, const float *out, long ldo,
                                 const float *lse, const float *dout, long ldd, float *dqkv,
                                 long ldg, int U, int P, const int *start, int B, int G,
                                 const int *order, int s, int time_major, int H, float scale)
{ return -1; }
void rw_gelu_gate(const float *a, float *y, float *s, long n) {}
void rw_gelu_backward(const float *gy, const float *a, const float *s, float *dx, long n) {}

int rw_available(void) { return 0; }

#endif
