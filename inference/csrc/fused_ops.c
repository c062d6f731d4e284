/*
 * Fused element-wise ops of a decoder layer on CPU, for bfloat16 and float32 tensors:
 * RMSNorm, rotary embeddings and SiLU(gate) * up. Each replaces a handful of torch ops
 * (and their passes over memory, and float32 temporaries) with one pass.
 *
 * Every output row depends only on its own input row, in a fixed order of operations,
 * so results never depend on how rows are batched or chunked. Where torch rounds to
 * bf16 between ops, these round at the same points (rotary is bit-identical to the
 * torch expression; RMSNorm's sum of squares and SiLU's exp differ from torch's in the
 * last float bits). The row loops are written once, in fused_ops_rows.h, and included
 * once per element type.
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

static inline float silu1(float g) { return g / (1.0f + exp_poly(-g)); }

#include "bf16_simd.h"

static void silu_mul_row_bf16(const uint16_t *g, const uint16_t *u, uint16_t *o, int64_t n) {
    int64_t i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_si256((__m256i *)(o + i), silu_mul_bf16x16(bf16x16_to_f32(g + i), bf16x16_to_f32(u + i)));
    }
#endif
    for (; i < n; i++) o[i] = f32_to_bf16(round_bf16(silu1(bf16_to_f32(g[i]))) * bf16_to_f32(u[i]));
}

static void silu_mul_row_f32(const float *g, const float *u, float *o, int64_t n) {
    for (int64_t i = 0; i < n; i++) o[i] = silu1(g[i]) * u[i];
}

/* Element access per type: load as float32, store (rounding to nearest even for bf16), and the
   rounding torch applies where it stores an intermediate result in the type. */
static inline float load_bf16(const uint16_t *p) { return bf16_to_f32(*p); }
static inline void store_bf16(uint16_t *p, float f) { *p = f32_to_bf16(f); }
static inline float round_to_bf16(float f) { return round_bf16(f); }
static inline float load_f32(const float *p) { return *p; }
static inline void store_f32(float *p, float f) { *p = f; }
static inline float round_to_f32(float f) { return f; }

#define ELEM uint16_t
#define SUFFIX bf16
#include "fused_ops_rows.h"
#undef ELEM
#undef SUFFIX

#define ELEM float
#define SUFFIX f32
#include "fused_ops_rows.h"
#undef ELEM
#undef SUFFIX

