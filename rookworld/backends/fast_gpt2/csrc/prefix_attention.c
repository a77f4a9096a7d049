/* rw_prefix_attention(_backward): teacher-forced attention over distinct prompts and
 * their groups' completions (kernels.c).
 * Tokens are rows of qkv [M, 3C] ([q | k | v], heads of 64): first the U distinct
 * prompts' P tokens each (prompt u's token i at row u P + i, real from start[u]), then
 * N = B G completion rows of s tokens (row n = b G + g of block b, whose prompt is
 * order[b]; its token j at row U P + (time_major ? j N + n : n s + j)). A real prompt
 * token attends causally over its prompt's real tokens, a padding one to itself only; a
 * completion token over its prompt's real tokens and its own row's tokens 0..j.
 * One task per (prompt, head) owns every query that reads that prompt's keys, so the
 * backward's key and value gradients need no atomics. */
#include "simd.h"

#if RW_SIMD

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

#else

int rw_prefix_attention(const float *qkv, long ldq, float *out, long ldo, float *lse, int U,
                        int P, const int *start, int B, int G, const int *order, int s,
                        int time_major, int H, float scale) { return -1; }
int rw_prefix_attention_backward(const float *qkv, long ldq, const float *out, long ldo,
                                 const float *lse, const float *dout, long ldd, float *dqkv,
                                 long ldg, int U, int P, const int *start, int B, int G,
                                 const int *order, int s, int time_major, int H, float scale)
{ return -1; }

#endif
