/*
 * bf16 <-> float32 and exp on 16 AVX-512 lanes, shared by fused_ops.c and amx_linear.c so that
 * SiLU(gate) * up fused into the AMX linear's output rounds exactly as the separate op does.
 * (native.py rebuilds a kernel when a header it may include changes.)
 */
#ifndef KVGATE_BF16_SIMD_H
#define KVGATE_BF16_SIMD_H
#include <stdint.h>
#ifdef __AVX512F__
#include <immintrin.h>

static inline __m512 bf16x16_to_f32(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* f32_to_bf16 on 16 lanes, with the same integer steps. */
static inline __m256i f32x16_to_bf16(__m512 f) {
    const __m512i u = _mm512_castps_si512(f);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

static inline __m512 round_bf16x16(__m512 f) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(f32x16_to_bf16(f)), 16));
}

/* exp_poly on 16 lanes: the same operations in the same order (no fused multiply-adds). */
static inline __m512 exp_poly16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                                        _mm512_set1_ps(0.5f)),
                                          _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
    r = _mm512_add_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(2.12194440e-4f)));
    static const float c[5] = {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                               5.0000001201e-1f};
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    for (int i = 0; i < 5; i++) p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c[i]));
    p = _mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
#endif

#ifdef __AVX512F__
/* bf16(bf16(silu(g)) * u) on 16 lanes of float32 g and u already rounded to bf16: fused_ops' silu_mul. */
static inline __m256i silu_mul_bf16x16(__m512 g, __m512 u) {
    const __m512 e = exp_poly16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 s = round_bf16x16(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
    return f32x16_to_bf16(_mm512_mul_ps(s, u));
}
#endif
#endif
