/*
 * Fused element-wise ops of a decoder layer, for bfloat16 tensors on CPU: RMSNorm,
 * rotary embeddings and SiLU(gate) * up. Each replaces a handful of torch ops (and
 * their passes over memory, and float32 temporaries) with one pass.
 *
 * Every output row depends only on its own input row, in a fixed order of operations,
 * so results never depend on how rows are batched or chunked. Where torch rounds to
 * bf16 between ops, these round at the same points (rotary is bit-identical to the
 * torch expression; RMSNorm's sum of squares and SiLU's exp differ from torch's in the
 * last float bits).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef union {
    uint32_t u;
    float f;
} Bits; /* type punning through a union, which the vectorizer follows (memcpy it does not) */

static inline float bf16_to_f32(uint16_t x) { return (Bits){.u = (uint32_t)x << 16}.f; }

static inline uint16_t f32_to_bf16(float f) {
    const uint32_t u = (Bits){.f = f}.u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16; /* round to nearest even, as torch does */
    const uint32_t nan = (u >> 16) | 0x40u;                            /* NaN stays NaN */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded); /* a select, so loops vectorize */
}

static inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

/* Rows are split between threads only when there is enough work to pay for waking them. */
static inline int threads_for(int64_t elems, int threads) { return elems >= 32768 ? threads : 1; }

/* o = w * bf16(x / sqrt(mean(x^2) + eps)) for one row, as transformers' RMSNorm rounds. */
static inline void rmsnorm_row(const uint16_t *xr, const uint16_t *w, uint16_t *o, int64_t C, float eps) {
    float lanes[16] = {0};
    int64_t c = 0;
    for (; c + 16 <= C; c += 16)
        for (int l = 0; l < 16; l++) {
            const float v = bf16_to_f32(xr[c + l]);
            lanes[l] += v * v;
        }
    for (; c < C; c++) {
        const float v = bf16_to_f32(xr[c]);
        lanes[c % 16] += v * v;
    }
    for (int step = 8; step > 0; step /= 2)
        for (int l = 0; l < step; l++) lanes[l] += lanes[l + step];
    const float inv = 1.0f / sqrtf(lanes[0] / (float)C + eps);
    for (int64_t i = 0; i < C; i++) o[i] = f32_to_bf16(bf16_to_f32(w[i]) * round_bf16(bf16_to_f32(xr[i]) * inv));
}

/* out[t] = RMSNorm(x[t]) with weight w. */
void kvgate_rmsnorm_bf16(const uint16_t *x, int64_t x_stride, const uint16_t *w, uint16_t *out, int64_t T,
                         int64_t C, float eps, int threads) {
#pragma omp parallel for num_threads(threads_for(T * C, threads)) schedule(static)
    for (int64_t t = 0; t < T; t++) rmsnorm_row(x + t * x_stride, w, out + t * C, C, eps);
}

/* The residual add and the next norm of a decoder layer in one pass: sum[t] = bf16(h[t] + d[t]) (torch's
 * bf16 add), out[t] = RMSNorm(sum[t]). h, d, sum and out are contiguous [T, C]; sum may be h. */
void kvgate_add_rmsnorm_bf16(const uint16_t *h, const uint16_t *d, const uint16_t *w, uint16_t *sum, uint16_t *out,
                             int64_t T, int64_t C, float eps, int threads) {
#pragma omp parallel for num_threads(threads_for(T * C, threads)) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        uint16_t *sr = sum + t * C;
        for (int64_t i = 0; i < C; i++) sr[i] = f32_to_bf16(bf16_to_f32(h[t * C + i]) + bf16_to_f32(d[t * C + i]));
        rmsnorm_row(sr, w, out + t * C, C, eps);
    }
}

/* exp(x) for float, written so the compiler vectorizes it: 2^n * p(r), |r| <= ln2/2. */
static inline float exp_poly(float x) {
    x = fminf(fmaxf(x, -87.0f), 88.0f);
    const float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + (r + 1.0f);
    return p * (Bits){.u = (uint32_t)((int32_t)n + 127) << 23}.f;
}

static inline float silu_mul1(float g, float u) { return round_bf16(g / (1.0f + exp_poly(-g))) * u; }

#include "bf16_simd.h"

static void silu_mul_row(const uint16_t *g, const uint16_t *u, uint16_t *o, int64_t n) {
    int64_t i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_si256((__m256i *)(o + i), silu_mul_bf16x16(bf16x16_to_f32(g + i), bf16x16_to_f32(u + i)));
    }
#endif
    for (; i < n; i++) o[i] = f32_to_bf16(silu_mul1(bf16_to_f32(g[i]), bf16_to_f32(u[i])));
}

/* out[t, i] = bf16(bf16(silu(g)) * u) with g = gu[t, i], u = gu[t, N + i]: SiLU(gate) * up, rounded as torch does. */
void kvgate_silu_mul_bf16(const uint16_t *gu, int64_t gu_stride, uint16_t *out, int64_t T, int64_t N, int threads) {
#pragma omp parallel for num_threads(threads_for(T * N, threads)) schedule(static)
    for (int64_t t = 0; t < T; t++) silu_mul_row(gu + t * gu_stride, gu + t * gu_stride + N, out + t * N, N);
}

/*
 * Rotary embeddings of the query and key heads of a fused q|k|v projection row:
 * x * cos + rotate_half(x) * sin, each product and the sum rounded to bf16 (torch's
 * expression in bf16 exactly). q_out [T, H, D] is contiguous. The keys go to k_out
 * [T, KVH, D] (contiguous), or, with k_pool, straight into the KV pool: row t's rotated
 * keys and its values (the projection's last KVH heads) to slot slots[t] of k_pool and
 * v_pool ([slots, KVH, D] each), for t < written (a padded pass writes its real rows only).
 */
static inline void rotate_head(const uint16_t *x, const uint16_t *c, const uint16_t *s, uint16_t *o, int64_t D) {
    const int64_t half = D / 2;
    for (int64_t i = 0; i < D; i++) {
        const float rot = i < half ? -bf16_to_f32(x[i + half]) : bf16_to_f32(x[i - half]);
        const float a = round_bf16(bf16_to_f32(x[i]) * bf16_to_f32(c[i]));
        const float b = round_bf16(rot * bf16_to_f32(s[i]));
        o[i] = f32_to_bf16(a + b);
    }
}

void kvgate_rotary_bf16(const uint16_t *qkv, int64_t qkv_stride, const uint16_t *cos, const uint16_t *sin,
                        int64_t cs_stride, uint16_t *q_out, uint16_t *k_out, int64_t T, int64_t H, int64_t KVH,
                        int64_t D, int threads) {
#pragma omp parallel for num_threads(threads_for(T * (H + KVH) * D, threads)) schedule(static)
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H + KVH; h++)
            rotate_head(qkv + t * qkv_stride + h * D, cos + t * cs_stride, sin + t * cs_stride,
                        h < H ? q_out + (t * H + h) * D : k_out + (t * KVH + h - H) * D, D);
}

void kvgate_rotary_to_pool_bf16(const uint16_t *qkv, int64_t qkv_stride, const uint16_t *cos, const uint16_t *sin,
                                int64_t cs_stride, uint16_t *q_out, uint16_t *k_pool, uint16_t *v_pool,
                                const int64_t *slots, int64_t written, int64_t T, int64_t H, int64_t KVH, int64_t D,
                                int threads) {
#pragma omp parallel for num_threads(threads_for(T * (H + KVH) * D, threads)) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *row = qkv + t * qkv_stride, *c = cos + t * cs_stride, *s = sin + t * cs_stride;
        for (int64_t h = 0; h < H; h++) rotate_head(row + h * D, c, s, q_out + (t * H + h) * D, D);
        if (t >= written) continue;
        for (int64_t h = 0; h < KVH; h++) rotate_head(row + (H + h) * D, c, s, k_pool + (slots[t] * KVH + h) * D, D);
        memcpy(v_pool + slots[t] * KVH * D, row + (H + KVH) * D, sizeof(uint16_t) * KVH * D);
    }
}
