/* rookworld's native CPU kernels, float32, x86-64 with AVX2 and FMA. Built at first use
 * by ../native.py (-O3 -march=native -fopenmp) and run on torch's OpenMP threads;
 * without a compiler, or on other CPUs, callers keep torch's operations.
 *
 * rw_decode_attention: the decoding step's attention over the sampler's grouped KV cache
 * (../decode.py, KVCache), heads of 64. torch's attention for the group layout
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
 * the update (../attention.py, prompt_completion_attention) on the qkv product itself,
 * without the per-row copies of each prompt's keys and the mask torch's path builds.
 *
 * rw_gelu_*: GPT-2's tanh GELU in its sigmoid form, a * sigmoid(a (C1 + C3 a^2)), in one
 * pass over memory (torch's takes six and a temporary; ../gelu.py, gelu_tanh
 * and Gelu). */
#include "simd.h"

/* 1 where the kernels were built with AVX2 and FMA (decode_attention.c, gelu.c,
 * prefix_attention.c); 0 where those files hold stubs, which native.py then never calls */
int rw_available(void) { return RW_SIMD; }
