/*
 * Paged causal attention for CPU, batch-invariant by construction.
 *
 * Every query row attends to the keys at positions [0, pos] of its sequence, read
 * block by block from the paged KV pool, in a fixed order (block 0, 1, 2, ...) with
 * an online softmax. Nothing a row computes depends on which other rows share the
 * call, how a prompt was chunked, or how many sequences run together; so a prefix
 * read from the cache gives bit-identical attention to one computed in the same pass.
 *
 * Two implementations with the same structure:
 *  - generic: any head_dim, float32 or bfloat16 pools, plain C the compiler vectorizes;
 *  - avx512bf16: bfloat16 pools with head_dim 64 or 128, dot products with vdpbf16ps.
 * Each is deterministic on its own; a process uses one of them for a given pool.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

typedef struct {
    const void *q;          /* [T, H, D] with strides below, elements of the pool dtype */
    int64_t q_stride_t;
    int64_t q_stride_h;
    const void *k_cache;    /* [num_blocks, block_size, KVH, D] contiguous */
    const void *v_cache;
    const int32_t *block_tables; /* [num_seqs, table_stride] */
    int64_t table_stride;
    const int32_t *row_seq; /* [T] sequence of each row */
    const int32_t *row_pos; /* [T] absolute position of each row */
    void *out;              /* [T, H, D] contiguous */
    int64_t T, H, KVH, D, block_size;
    float scale;
    int32_t is_bf16;
    int32_t num_threads;
} AttnArgs;

enum { TILE_ROWS = 8, MAX_D = 256, MAX_BS = 64, MAX_VECS = TILE_ROWS * 16 };

static inline float bf16_to_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even, as torch does */
    return (uint16_t)(u >> 16);
}

static inline float load_elem(const void *base, int64_t i, int is_bf16) {
    return is_bf16 ? bf16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

static inline void store_elem(void *base, int64_t i, float v, int is_bf16) {
    if (is_bf16)
        ((uint16_t *)base)[i] = f32_to_bf16(v);
    else
        ((float *)base)[i] = v;
}

/* Rows [r0, r1) of one sequence at consecutive positions, one KV head. */
typedef struct {
    int64_t r0, r1, kvh;
} WorkItem;

/* One query vector's running softmax state. */
typedef struct {
    float m, l;
    float acc[MAX_D];
} RowState;

static void tile_generic(const AttnArgs *a, WorkItem w, RowState *st, float *kf, float *vf) {
    const int64_t D = a->D, bs = a->block_size, KVH = a->KVH, G = a->H / a->KVH;
    const int is_bf16 = a->is_bf16;
    const int32_t seq = a->row_seq[w.r0];
    const int32_t *table = a->block_tables + (int64_t)seq * a->table_stride;
    const int64_t nrows = w.r1 - w.r0, nvec = nrows * G;
    const int32_t last_pos = a->row_pos[w.r1 - 1];
    float qf[MAX_VECS][MAX_D];
    float s[MAX_BS];

    for (int64_t r = 0; r < nrows; r++)
        for (int64_t g = 0; g < G; g++) {
            int64_t h = w.kvh * G + g, v = r * G + g;
            for (int64_t d = 0; d < D; d++)
                qf[v][d] = load_elem(a->q, (w.r0 + r) * a->q_stride_t + h * a->q_stride_h + d, is_bf16);
            st[v].m = -INFINITY;
            st[v].l = 0.0f;
            memset(st[v].acc, 0, sizeof(float) * D);
        }

    for (int64_t b = 0; b * bs <= last_pos; b++) {
        const int64_t block = table[b];
        const int64_t nkeys = (b + 1) * bs <= last_pos + 1 ? bs : last_pos + 1 - b * bs;
        for (int64_t i = 0; i < nkeys; i++) {
            int64_t off = ((block * bs + i) * KVH + w.kvh) * D;
            for (int64_t d = 0; d < D; d++) {
                kf[i * D + d] = load_elem(a->k_cache, off + d, is_bf16);
                vf[i * D + d] = load_elem(a->v_cache, off + d, is_bf16);
            }
        }
        for (int64_t v = 0; v < nvec; v++) {
            const int64_t pos = a->row_pos[w.r0 + v / G];
            if (b * bs > pos) continue; /* this row's keys end before the block */
            const int64_t valid = (b + 1) * bs <= pos + 1 ? bs : pos + 1 - b * bs;
            float bmax = -INFINITY;
            for (int64_t i = 0; i < valid; i++) {
                float dot = 0.0f;
                for (int64_t d = 0; d < D; d++) dot += qf[v][d] * kf[i * D + d];
                s[i] = dot * a->scale;
                if (s[i] > bmax) bmax = s[i];
            }
            RowState *rs = &st[v];
            const float m_new = rs->m > bmax ? rs->m : bmax;
            const float corr = expf(rs->m - m_new);
            rs->l *= corr;
            for (int64_t d = 0; d < D; d++) rs->acc[d] *= corr;
            for (int64_t i = 0; i < valid; i++) {
                const float p = expf(s[i] - m_new);
                rs->l += p;
                for (int64_t d = 0; d < D; d++) rs->acc[d] += p * vf[i * D + d];
            }
            rs->m = m_new;
        }
    }

    for (int64_t v = 0; v < nvec; v++) {
        int64_t r = v / G, g = v % G, h = w.kvh * G + g;
        const float inv = 1.0f / st[v].l;
        for (int64_t d = 0; d < D; d++)
            store_elem(a->out, ((w.r0 + r) * a->H + h) * D + d, st[v].acc[d] * inv, is_bf16);
    }
}

#ifdef __AVX512BF16__

/* exp for 16 floats: range reduction to 2^n * exp(r), |r| <= ln2/2, degree-6 polynomial. */
static inline __m512 exp16(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
    r = _mm512_fnmadd_ps(n, ln2_lo, r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/*
 * bf16 pool, head_dim D (64 or 128), block_size 16. Per block, the tile first lays out
 * the keys transposed into bf16 pairs (lane i of kt[dp] holds key i's dims 2dp, 2dp+1)
 * and the values interleaved by key pairs (lane l of vp[kp][j] holds dim 16j+l of keys
 * 2kp and 2kp+1); then every query vector of the tile needs only vdpbf16ps for both
 * q.k and p.v. As in torch's flash kernel, p is rounded to bf16 for the p.v product.
 */
static void tile_bf16(const AttnArgs *a, WorkItem w, RowState *st) {
    const int64_t D = a->D, KVH = a->KVH, G = a->H / a->KVH;
    const int64_t NP = D / 2;  /* bf16 pairs per key */
    const int64_t NF = D / 16; /* 16 floats per accumulator register */
    const int32_t seq = a->row_seq[w.r0];
    const int32_t *table = a->block_tables + (int64_t)seq * a->table_stride;
    const int64_t nrows = w.r1 - w.r0, nvec = nrows * G;
    const int32_t last_pos = a->row_pos[w.r1 - 1];
    const uint16_t *kc = (const uint16_t *)a->k_cache, *vc = (const uint16_t *)a->v_cache;
    const int64_t stride = KVH * D;
    const __m512 scale = _mm512_set1_ps(a->scale);
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    uint32_t qp[MAX_VECS][64]; /* query pairs, broadcast one at a time */
    float scores[MAX_VECS][16] __attribute__((aligned(64)));
    uint32_t kt[64][16] __attribute__((aligned(64)));
    __m512i vp[8][8];

    for (int64_t v = 0; v < nvec; v++) {
        int64_t r = v / G, h = w.kvh * G + v % G;
        memcpy(qp[v], (const uint16_t *)a->q + (w.r0 + r) * a->q_stride_t + h * a->q_stride_h, sizeof(uint16_t) * D);
        st[v].m = -INFINITY;
        st[v].l = 0.0f;
        memset(st[v].acc, 0, sizeof(float) * D);
    }

    for (int64_t b = 0; b * 16 <= last_pos; b++) {
        const int64_t block = table[b];
        const uint16_t *kb = kc + (block * 16 * KVH + w.kvh) * D, *vb = vc + (block * 16 * KVH + w.kvh) * D;
        const int64_t nkeys = (b + 1) * 16 <= last_pos + 1 ? 16 : last_pos + 1 - b * 16;
        for (int64_t i = 0; i < 16; i++) {
            const uint32_t *row = (const uint32_t *)(kb + i * stride);
            for (int64_t dp = 0; dp < NP; dp++) kt[dp][i] = i < nkeys ? row[dp] : 0u;
        }
        for (int64_t kp = 0; kp < 8; kp++) {
            const int64_t i0 = 2 * kp, i1 = 2 * kp + 1;
            for (int64_t j = 0; j < NF; j++) {
                __m512i lo = i0 < nkeys ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(vb + i0 * stride + 16 * j)))
                                        : _mm512_setzero_si512();
                __m512i hi = i1 < nkeys ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(vb + i1 * stride + 16 * j)))
                                        : _mm512_setzero_si512();
                vp[kp][j] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
            }
        }
        /* q.k for 8 vectors at a time: each k pair is loaded once for all 8, and 8 independent
         * accumulators hide the instruction's latency. Each vector's sum runs over dp in order. */
        int64_t v0 = 0;
        for (; v0 + 8 <= nvec; v0 += 8) {
            __m512 acc8[8];
            for (int u = 0; u < 8; u++) acc8[u] = _mm512_setzero_ps();
            for (int64_t dp = 0; dp < NP; dp++) {
                const __m512bh k2 = (__m512bh)_mm512_load_si512(kt[dp]);
                for (int u = 0; u < 8; u++)
                    acc8[u] = _mm512_dpbf16_ps(acc8[u], (__m512bh)_mm512_set1_epi32((int)qp[v0 + u][dp]), k2);
            }
            for (int u = 0; u < 8; u++) _mm512_store_ps(scores[v0 + u], acc8[u]);
        }
        for (; v0 < nvec; v0++) { /* the same sums, one vector at a time */
            __m512 acc1 = _mm512_setzero_ps();
            for (int64_t dp = 0; dp < NP; dp++)
                acc1 = _mm512_dpbf16_ps(acc1, (__m512bh)_mm512_set1_epi32((int)qp[v0][dp]),
                                        (__m512bh)_mm512_load_si512(kt[dp]));
            _mm512_store_ps(scores[v0], acc1);
        }
        for (int64_t v = 0; v < nvec; v++) {
            const int64_t pos = a->row_pos[w.r0 + v / G];
            if (b * 16 > pos) continue;
            const int64_t valid = (b + 1) * 16 <= pos + 1 ? 16 : pos + 1 - b * 16;
            const __m512 dots = _mm512_load_ps(scores[v]);
            const __mmask16 live = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32((int)valid));
            const __m512 s = _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY), _mm512_mul_ps(dots, scale));
            RowState *rs = &st[v];
            const float bmax = _mm512_reduce_max_ps(s);
            const float m_new = rs->m > bmax ? rs->m : bmax;
            const float corr = _mm512_cvtss_f32(exp16(_mm512_set1_ps(rs->m - m_new)));
            const __m512 p = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
            rs->l = rs->l * corr + _mm512_reduce_add_ps(p);
            uint32_t pp[8];
            _mm256_storeu_si256((__m256i *)pp, (__m256i)_mm512_cvtneps_pbh(p));
            __m512 acc[8];
            const __m512 c = _mm512_set1_ps(corr);
            for (int64_t j = 0; j < NF; j++) acc[j] = _mm512_mul_ps(_mm512_loadu_ps(rs->acc + 16 * j), c);
            for (int64_t kp = 0; kp < (valid + 1) / 2; kp++) {
                const __m512bh pk = (__m512bh)_mm512_set1_epi32((int)pp[kp]);
                for (int64_t j = 0; j < NF; j++) acc[j] = _mm512_dpbf16_ps(acc[j], pk, (__m512bh)vp[kp][j]);
            }
            for (int64_t j = 0; j < NF; j++) _mm512_storeu_ps(rs->acc + 16 * j, acc[j]);
            rs->m = m_new;
        }
    }

    for (int64_t v = 0; v < nvec; v++) {
        int64_t r = v / G, h = w.kvh * G + v % G;
        uint16_t *o = (uint16_t *)a->out + ((w.r0 + r) * a->H + h) * D;
        const __m512 inv = _mm512_set1_ps(1.0f / st[v].l);
        for (int64_t j = 0; j < NF; j++)
            _mm256_storeu_si256((__m256i *)(o + 16 * j),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(st[v].acc + 16 * j), inv)));
    }
}
#endif

int kvgate_uses_avx512bf16(const AttnArgs *a) {
#ifdef __AVX512BF16__
    return a->is_bf16 && (a->D == 64 || a->D == 128) && a->block_size == 16;
#else
    (void)a;
    return 0;
#endif
}

int kvgate_paged_attention(const AttnArgs *a) {
    const int64_t G = a->H / a->KVH;
    if (a->D > MAX_D || a->block_size > MAX_BS || G * TILE_ROWS > MAX_VECS || a->H % a->KVH) return -1;
    /* Cut rows into tiles: consecutive rows of one sequence at consecutive positions. */
    WorkItem *items = malloc(sizeof(WorkItem) * (size_t)(a->T * a->KVH + 1));
    if (!items) return -2;
    int64_t n = 0, r0 = 0;
    for (int64_t r = 1; r <= a->T; r++) {
        int cut = r == a->T || r - r0 == TILE_ROWS || a->row_seq[r] != a->row_seq[r0] ||
                  a->row_pos[r] != a->row_pos[r - 1] + 1;
        if (!cut) continue;
        for (int64_t h = 0; h < a->KVH; h++) items[n++] = (WorkItem){r0, r, h};
        r0 = r;
    }
    const int fast = kvgate_uses_avx512bf16(a);
    int failed = 0;
#pragma omp parallel num_threads(a->num_threads)
    {
        RowState *st = aligned_alloc(64, sizeof(RowState) * MAX_VECS);
        float *kf = aligned_alloc(64, sizeof(float) * MAX_BS * MAX_D);
        float *vf = aligned_alloc(64, sizeof(float) * MAX_BS * MAX_D);
        if (!st || !kf || !vf) {
#pragma omp atomic write
            failed = 1;
        } else {
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < n; i++) {
#ifdef __AVX512BF16__
                if (fast) {
                    tile_bf16(a, items[i], st);
                    continue;
                }
#endif
                tile_generic(a, items[i], st, kf, vf);
            }
        }
        free(st);
        free(kf);
        free(vf);
    }
    free(items);
    (void)fast;
    return failed ? -2 : 0;
}
