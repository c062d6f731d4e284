/*
 * Paged causal attention for CPU, batch-invariant by construction.
 *
 * Every query row attends to the keys at positions [0, pos] of its sequence, read
 * block by block from the paged KV pool, in a fixed order (block 0, 1, 2, ...) with
 * an online softmax. Nothing a row computes depends on which other rows share the
 * call, how a prompt was chunked, or how many sequences run together; so a prefix
 * read from the cache gives bit-identical attention to one computed in the same pass.
 *
 * Implementations of the same order of blocks:
 *  - generic: any head_dim, float32 or bfloat16 pools, plain C;
 *  - avx2: CPUs with AVX2 + FMA but not avx512_bf16, float32 or bfloat16 pools, head_dim
 *    a multiple of 8, 8 query vectors at a time, one per vector lane (see tile_avx2);
 *  - avx512bf16: bfloat16 pools with head_dim 64 or 128, dot products with vdpbf16ps,
 *    16 query vectors at a time, one per vector lane (see tile_bf16_d);
 *  - amx: on AMX CPUs, the avx512bf16 cases on tiles (see tile_amx).
 * Each is deterministic on its own; a process uses one of them for a given pool. Which
 * one is decided by the build: inference/platform.py builds this file once per ISA variant
 * (generic, avx2, avx512bf16, amx; explicit -march flags) and its kernel plan picks the build.
 * Decode rows (generated tokens' queries, the call's leading num_decode rows) have loops of
 * their own on avx512bf16 without AMX (tile_decode_row) and on avx2 with float32 pools
 * (tile_decode_row_avx2): always those for a decode row, never for a prompt row.
 */
#define _GNU_SOURCE /* syscall() */
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
    int64_t num_decode; /* rows [0, num_decode) are decode rows: the bf16 kernel gives them tile_decode_row */
} AttnArgs;

/* Query vectors (rows x heads of one KV head) per tile: the generic kernel takes TILE_ROWS rows;
 * the bf16 kernel about FAST_TILE_VECS vectors, since it lays each KV block out once per tile
 * (96 measured a little faster than 48, and twice as fast as 24, at 4k tokens). */
/* Decode-only calls below this many (key, query head) pairs run single-threaded (~0.1 ms; waking the
   passive team costs ~20-40 us: 8 rows at 300 keys ran in 202 us alone and 147 us on 2 threads, AMX Xeon). */
#define DECODE_SERIAL_WORK (int64_t)16384
/* The decode-row kernel keeps a row's query heads of one KV head in registers: up to this many. */
#define DECODE_MAX_G 16
enum { TILE_ROWS = 8, MAX_D = 256, MAX_BS = 64, MAX_VECS = TILE_ROWS * 16, FAST_TILE_VECS = 96 };

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
    float acc[MAX_D]; /* first, for aligned loads */
    float m, l;       /* the generic kernel's; the bf16 kernel keeps them per lane in FastTile */
} __attribute__((aligned(64))) RowState;

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

/* Declared for every build: kvgate_paged_attention sizes tiles by it whichever kernels were built. */
enum { AVX2_TILE_VECS = 48, AVX2_GROUPS = AVX2_TILE_VECS / 8, AVX2_BS = 16 };

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512BF16__)
#include <immintrin.h>
#define KVGATE_AVX2 1

/*
 * AVX2 + FMA, float32 or bfloat16 pools, head_dim a multiple of 8, blocks of up to 16 keys:
 * the kernel of CPUs without avx512_bf16, where the engine computes in float32.
 *
 * As in the bf16 kernel, a tile's query vectors go in groups of 8, one vector per lane
 * (qT[d] holds dim d of the group's 8 vectors), so the scores of key i for the group
 * accumulate in one register over d in order, and the online softmax runs lane by lane
 * with no horizontal reductions. p.v then runs per vector: its accumulator row gains
 * p[i] * v[i] for the block's keys in order. Masked keys get p = 0 and add exact zeros;
 * a block past all of a lane's keys rescales it by exp(0) = 1. So every lane's result is
 * the same whatever shares its group or tile, and whichever rows the call holds.
 */

typedef struct {
    float qT[AVX2_GROUPS][MAX_D][8]; /* query dims, transposed per group of 8 vectors */
    float m[AVX2_GROUPS][8];         /* running max per vector */
    float l[AVX2_GROUPS][8];         /* running denominator per vector */
    int32_t pos[AVX2_GROUPS][8];     /* position of each vector's row */
    float s[AVX2_BS][8];             /* one group's scores, then p, for this block */
    float corr[8];                   /* one group's rescaling for this block */
    float kf[AVX2_BS][MAX_D];        /* this block's keys and values in float32 */
    float vf[AVX2_BS][MAX_D];
    float acc[AVX2_TILE_VECS * MAX_D]; /* [vector][D] */
} __attribute__((aligned(32))) Avx2Tile;

/* exp for 8 floats: 2^n * exp(r), |r| <= ln2/2, degree-6 polynomial; x clamped to [-87, 88]. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* Scores of one group over the block's keys, then its online softmax: s[i] becomes p[i]. */
static inline void avx2_softmax(Avx2Tile *t, int g, int64_t key0, int64_t nkeys, int64_t D, float scale) {
    const __m256i pos = _mm256_load_si256((const __m256i *)t->pos[g]);
    for (int64_t i0 = 0; i0 < nkeys; i0 += 8) {
        __m256 acc[8];
        for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d++) {
            const __m256 q = _mm256_load_ps(t->qT[g][d]);
            for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(q, _mm256_broadcast_ss(&t->kf[i0 + j][d]), acc[j]);
        }
        for (int j = 0; j < 8 && i0 + j < nkeys; j++) {
            const __m256i masked = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(key0 + i0 + j)), pos);
            const __m256 s = _mm256_mul_ps(acc[j], _mm256_set1_ps(scale));
            _mm256_store_ps(t->s[i0 + j], _mm256_blendv_ps(s, _mm256_set1_ps(-INFINITY), _mm256_castsi256_ps(masked)));
        }
    }
    const __m256 m = _mm256_load_ps(t->m[g]);
    __m256 m_new = m;
    for (int64_t i = 0; i < nkeys; i++) m_new = _mm256_max_ps(m_new, _mm256_load_ps(t->s[i]));
    const __m256 corr = exp8(_mm256_sub_ps(m, m_new));
    __m256 l = _mm256_mul_ps(_mm256_load_ps(t->l[g]), corr);
    for (int64_t i = 0; i < nkeys; i++) {
        const __m256 s = _mm256_load_ps(t->s[i]);
        const __m256 live = _mm256_cmp_ps(s, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        const __m256 p = _mm256_and_ps(exp8(_mm256_sub_ps(s, m_new)), live);
        l = _mm256_add_ps(l, p);
        _mm256_store_ps(t->s[i], p);
    }
    _mm256_store_ps(t->m[g], m_new);
    _mm256_store_ps(t->l[g], l);
    _mm256_store_ps(t->corr, corr);
}

/* acc[v] = acc[v] * corr + sum over the block's keys, in order, of p[i] * v[i], 64 dims at a time. */
static inline void avx2_values(Avx2Tile *t, int lane, float *acc, int64_t nkeys, int64_t D) {
    const __m256 corr = _mm256_set1_ps(t->corr[lane]);
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
        const int nd = (int)((D - d0) < 64 ? (D - d0) / 8 : 8);
        __m256 a[8];
        for (int j = 0; j < nd; j++) a[j] = _mm256_mul_ps(_mm256_load_ps(acc + d0 + 8 * j), corr);
        for (int64_t i = 0; i < nkeys; i++) {
            const __m256 p = _mm256_broadcast_ss(&t->s[i][lane]);
            for (int j = 0; j < nd; j++) a[j] = _mm256_fmadd_ps(p, _mm256_load_ps(&t->vf[i][d0 + 8 * j]), a[j]);
        }
        for (int j = 0; j < nd; j++) _mm256_store_ps(acc + d0 + 8 * j, a[j]);
    }
}

/* One key or value row of the pool (D a multiple of 8) into float32. */
static inline void avx2_row(const void *base, int64_t off, int64_t D, int is_bf16, float *dst) {
    if (!is_bf16) {
        memcpy(dst, (const float *)base + off, sizeof(float) * (size_t)D);
        return;
    }
    const uint16_t *src = (const uint16_t *)base + off;
    for (int64_t d = 0; d < D; d += 8) {
        const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + d)));
        _mm256_store_ps(dst + d, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
    }
}

static void tile_avx2(const AttnArgs *a, WorkItem w, Avx2Tile *t) {
    const int64_t D = a->D, bs = a->block_size, KVH = a->KVH, G = a->H / a->KVH;
    const int is_bf16 = a->is_bf16;
    const int32_t *table = a->block_tables + (int64_t)a->row_seq[w.r0] * a->table_stride;
    const int64_t nrows = w.r1 - w.r0, nvec = nrows * G, ngroups = (nvec + 7) / 8;
    const int32_t last_pos = a->row_pos[w.r1 - 1];

    for (int64_t v = 0; v < ngroups * 8; v++) {
        const int64_t g = v / 8, u = v % 8;
        /* A dummy lane repeats the last row's position with a zero query: it only fills the register. */
        t->pos[g][u] = v < nvec ? a->row_pos[w.r0 + v / G] : last_pos;
        t->m[g][u] = -INFINITY;
        t->l[g][u] = 0.0f;
        const int64_t h = w.kvh * G + v % G;
        const int64_t base = (w.r0 + v / G) * a->q_stride_t + h * a->q_stride_h;
        for (int64_t d = 0; d < D; d++) t->qT[g][d][u] = v < nvec ? load_elem(a->q, base + d, is_bf16) : 0.0f;
    }
    memset(t->acc, 0, sizeof(float) * (size_t)(nvec * D));

    for (int64_t b = 0; b * bs <= last_pos; b++) {
        const int64_t block = table[b];
        const int64_t nkeys = (b + 1) * bs <= last_pos + 1 ? bs : last_pos + 1 - b * bs;
        for (int64_t i = 0; i < nkeys; i++) {
            const int64_t off = ((block * bs + i) * KVH + w.kvh) * D;
            avx2_row(a->k_cache, off, D, is_bf16, t->kf[i]);
            avx2_row(a->v_cache, off, D, is_bf16, t->vf[i]);
        }
        for (int64_t g = 0; g < ngroups; g++) {
            avx2_softmax(t, (int)g, b * bs, nkeys, D, a->scale);
            for (int u = 0; u < 8 && g * 8 + u < nvec; u++) avx2_values(t, u, t->acc + (g * 8 + u) * D, nkeys, D);
        }
    }

    for (int64_t v = 0; v < nvec; v++) {
        const int64_t h = w.kvh * G + v % G;
        const float inv = 1.0f / t->l[v / 8][v % 8];
        for (int64_t d = 0; d < D; d++)
            store_elem(a->out, ((w.r0 + v / G) * a->H + h) * D + d, t->acc[v * D + d] * inv, is_bf16);
    }
}
#endif

#ifdef KVGATE_AVX2
/*
 * One decode row (a generated token's query) and one KV head, float32 pool, block_size 16,
 * D a multiple of 8 up to 128: the AVX2 counterpart of tile_decode_row below. tile_avx2 fills
 * 8 lanes with query vectors, and a lone row has only G of them (3 for SmolLM2), and it copies
 * every key and value row into the tile first; here key rows are read straight from the pool:
 * each score sums q * k over D in 8 lanes, then the lanes in a fixed tree (avx2_sums8), the
 * online softmax runs over a block's 16 scores, and p.v in float32 FMAs over its keys in order.
 * A row's result depends only on its q, its keys and this order: decode rows always come here
 * (whatever else is in the call), prompt rows never do.
 */
enum { AVX2_DECODE_MAX_D = 128 };

/* r[i] = the sum of t[i]'s 8 lanes, by a fixed tree of pairwise adds. */
static inline __m256 avx2_sums8(const __m256 *t) {
    const __m256 a0 = _mm256_hadd_ps(t[0], t[1]), a1 = _mm256_hadd_ps(t[2], t[3]);
    const __m256 a2 = _mm256_hadd_ps(t[4], t[5]), a3 = _mm256_hadd_ps(t[6], t[7]);
    const __m256 b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3);
    return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}

static inline float avx2_hmax(__m256 x) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
}

static inline float avx2_hsum(__m256 x) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

static inline __attribute__((always_inline)) void tile_decode_row_avx2_d(const AttnArgs *a, int64_t row,
                                                                           int64_t kvh, const int D) {
    const int NF = D / 8;
    const int64_t KVH = a->KVH, G = a->H / a->KVH, stride = KVH * D;
    const int32_t *table = a->block_tables + (int64_t)a->row_seq[row] * a->table_stride;
    const int32_t pos = a->row_pos[row];
    const float *kc = (const float *)a->k_cache, *vc = (const float *)a->v_cache;
    float acc[DECODE_MAX_G][AVX2_DECODE_MAX_D] __attribute__((aligned(32)));
    float m[DECODE_MAX_G], l[DECODE_MAX_G];
    for (int64_t g = 0; g < G; g++) {
        memset(acc[g], 0, sizeof(float) * (size_t)D);
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    const __m256 scale = _mm256_set1_ps(a->scale), neg_inf = _mm256_set1_ps(-INFINITY);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t b = 0; b * 16 <= pos; b++) {
        const int64_t block = table[b];
        const float *kb = kc + (block * 16 * KVH + kvh) * D, *vb = vc + (block * 16 * KVH + kvh) * D;
        const int nkeys = (b + 1) * 16 <= pos + 1 ? 16 : (int)(pos + 1 - b * 16);
        /* Lanes of keys past the row's last one (stale slots of the pool) are masked out. */
        const __m256 live[2] = {
            _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(nkeys), lane)),
            _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(nkeys - 8), lane)),
        };
        for (int64_t g = 0; g < G; g++) {
            const float *qr = (const float *)a->q + row * a->q_stride_t + (kvh * G + g) * a->q_stride_h;
            __m256 S[2];
            for (int h = 0; h < 2; h++) {
                __m256 t[8];
                for (int i = 0; i < 8; i++) {
                    const float *kr = kb + (8 * h + i) * stride;
                    t[i] = _mm256_mul_ps(_mm256_loadu_ps(qr), _mm256_loadu_ps(kr));
                    for (int j = 1; j < NF; j++)
                        t[i] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 8 * j), _mm256_loadu_ps(kr + 8 * j), t[i]);
                }
                S[h] = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(avx2_sums8(t), scale), live[h]);
            }
            const float bmax = avx2_hmax(_mm256_max_ps(S[0], S[1]));
            const float m_new = m[g] > bmax ? m[g] : bmax;
            const __m256 mv = _mm256_set1_ps(m_new);
            const float c = _mm256_cvtss_f32(exp8(_mm256_set1_ps(m[g] - m_new)));
            float p[16] __attribute__((aligned(32)));
            __m256 psum = _mm256_setzero_ps();
            for (int h = 0; h < 2; h++) {
                const __m256 ph = _mm256_and_ps(exp8(_mm256_sub_ps(S[h], mv)), live[h]);
                psum = _mm256_add_ps(psum, ph);
                _mm256_store_ps(p + 8 * h, ph);
            }
            l[g] = l[g] * c + avx2_hsum(psum);
            m[g] = m_new;
            const __m256 cv = _mm256_set1_ps(c);
            __m256 o[AVX2_DECODE_MAX_D / 8];
            for (int j = 0; j < NF; j++) o[j] = _mm256_mul_ps(_mm256_load_ps(acc[g] + 8 * j), cv);
            for (int i = 0; i < nkeys; i++) {
                const __m256 pi = _mm256_set1_ps(p[i]);
                for (int j = 0; j < NF; j++) o[j] = _mm256_fmadd_ps(pi, _mm256_loadu_ps(vb + i * stride + 8 * j), o[j]);
            }
            for (int j = 0; j < NF; j++) _mm256_store_ps(acc[g] + 8 * j, o[j]);
        }
    }
    for (int64_t g = 0; g < G; g++) {
        float *o = (float *)a->out + (row * a->H + kvh * G + g) * D;
        const __m256 inv = _mm256_set1_ps(1.0f / l[g]);
        for (int j = 0; j < NF; j++) _mm256_storeu_ps(o + 8 * j, _mm256_mul_ps(_mm256_load_ps(acc[g] + 8 * j), inv));
    }
}

static void tile_decode_row_avx2(const AttnArgs *a, int64_t row, int64_t kvh) {
    if (a->D == 64)
        tile_decode_row_avx2_d(a, row, kvh, 64);
    else
        tile_decode_row_avx2_d(a, row, kvh, (int)a->D);
}

/* Whether decode rows take tile_decode_row_avx2 in this call. */
static int avx2_decode_rows(const AttnArgs *a) {
    return !a->is_bf16 && a->block_size == 16 && a->D % 8 == 0 && a->D <= AVX2_DECODE_MAX_D &&
           a->H / a->KVH <= DECODE_MAX_G;
}
#endif

int kvgate_uses_avx2(const AttnArgs *a) {
#ifdef KVGATE_AVX2
    return a->D % 8 == 0 && a->block_size <= AVX2_BS && a->H / a->KVH <= AVX2_TILE_VECS;
#else
    (void)a;
    return 0;
#endif
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
 * bf16 pool, head_dim D (64 or 128), block_size 16, vdpbf16ps for both q.k and p.v.
 *
 * A tile's query vectors (rows x heads of one KV head) are handled in groups of 16, one
 * vector per lane: a group's queries are laid out transposed into bf16 pairs (lane u of
 * qT[dp] holds vector u's dims 2dp, 2dp+1), so the scores of key i for all 16 vectors
 * accumulate in one register, S[i], straight from the pool's key row. The online
 * softmax then runs across registers, lane by lane, with no horizontal reductions: the
 * block max, the rescaling factor, exp and the denominator are computed for 16 vectors
 * at once. p is rounded to bf16 (as in torch's flash kernel) and laid out in key pairs
 * for the p.v product, against the block's values interleaved by key pairs (lane l of
 * vp[kp][j] holds dim 16j+l of keys 2kp and 2kp+1), built once per block for the tile.
 *
 * Every lane's arithmetic is the same whatever shares its group or tile: masked keys
 * get p = 0, which adds exact zeros; a dummy lane only fills a register.
 */
enum { FAST_GROUPS = (FAST_TILE_VECS + 15) / 16 };

typedef struct {
    uint32_t qT[FAST_GROUPS][64][16]; /* query pairs, transposed per group of 16 vectors */
    float m[FAST_GROUPS][16];         /* running max per vector */
    float lv[FAST_GROUPS][16];        /* running denominator per vector */
    float corr[FAST_GROUPS][16];      /* this block's rescaling per vector */
    uint32_t pT[FAST_GROUPS][8][16];  /* this block's p in bf16 key pairs, per vector */
    int32_t pos[FAST_GROUPS][16];     /* position of each vector's row */
    uint32_t kl[16][64];              /* this block's keys, as bf16 pairs */
    __m512i vp[8][8];                 /* this block's values interleaved by key pairs */
} __attribute__((aligned(64))) FastTile;

static inline __m512 max_tree16(const __m512 *x) {
    __m512 a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm512_max_ps(x[i], x[i + 8]);
    for (int i = 0; i < 4; i++) a[i] = _mm512_max_ps(a[i], a[i + 4]);
    for (int i = 0; i < 2; i++) a[i] = _mm512_max_ps(a[i], a[i + 2]);
    return _mm512_max_ps(a[0], a[1]);
}

static inline __m512 sum_tree16(const __m512 *x) {
    __m512 a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm512_add_ps(x[i], x[i + 8]);
    for (int i = 0; i < 4; i++) a[i] = _mm512_add_ps(a[i], a[i + 4]);
    for (int i = 0; i < 2; i++) a[i] = _mm512_add_ps(a[i], a[i + 2]);
    return _mm512_add_ps(a[0], a[1]);
}

/* Scores and online softmax of one group of 16 vectors over one block of keys. */
static inline __attribute__((always_inline)) void group_softmax(FastTile *t, int g, int NP, int64_t kbase,
                                                                  int all_valid, float scale_f) {
    const __m512 scale = _mm512_set1_ps(scale_f), neg_inf = _mm512_set1_ps(-INFINITY);
    const __m512i P = _mm512_load_si512(t->pos[g]);
    __m512 S[16];
    for (int i = 0; i < 16; i++) S[i] = _mm512_setzero_ps();
    for (int dp = 0; dp < NP; dp++) {
        const __m512bh q = (__m512bh)_mm512_load_si512(t->qT[g][dp]);
        for (int i = 0; i < 16; i++) S[i] = _mm512_dpbf16_ps(S[i], q, (__m512bh)_mm512_set1_epi32((int)t->kl[i][dp]));
    }
    __mmask16 live[16];
    for (int i = 0; i < 16; i++) {
        live[i] = all_valid ? (__mmask16)0xffff : _mm512_cmple_epi32_mask(_mm512_set1_epi32((int)(kbase + i)), P);
        S[i] = _mm512_mask_mov_ps(neg_inf, live[i], S[i]);
    }
    const __m512 m_old = _mm512_load_ps(t->m[g]);
    const __m512 m_new = _mm512_max_ps(m_old, _mm512_mul_ps(max_tree16(S), scale));
    const __m512 c = exp16(_mm512_sub_ps(m_old, m_new));
    __m512 p[16];
    for (int i = 0; i < 16; i++) p[i] = _mm512_maskz_mov_ps(live[i], exp16(_mm512_fmsub_ps(S[i], scale, m_new)));
    _mm512_store_ps(t->lv[g], _mm512_fmadd_ps(_mm512_load_ps(t->lv[g]), c, sum_tree16(p)));
    _mm512_store_ps(t->m[g], m_new);
    _mm512_store_ps(t->corr[g], c);
    /* lane u of pT[kp]: vector u's p for keys 2kp (low half) and 2kp+1 (high half) */
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int kp = 0; kp < 8; kp++)
        _mm512_store_si512(t->pT[g][kp],
                           _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(p[2 * kp + 1], p[2 * kp])));
}

/* acc = acc * corr + p.v for NV consecutive vectors (lanes u0.. of group g), NF registers each. */
static inline __attribute__((always_inline)) void pv_vectors(FastTile *t, RowState *st, int64_t v0, int g, int u0,
                                                               int NV, int NF) {
    __m512 acc[4][8];
    for (int n = 0; n < NV; n++) {
        const __m512 c = _mm512_set1_ps(t->corr[g][u0 + n]);
        for (int j = 0; j < NF; j++) acc[n][j] = _mm512_mul_ps(_mm512_load_ps(st[v0 + n].acc + 16 * j), c);
    }
    for (int kp = 0; kp < 8; kp++)
        for (int n = 0; n < NV; n++) {
            const __m512bh pk = (__m512bh)_mm512_set1_epi32((int)t->pT[g][kp][u0 + n]);
            for (int j = 0; j < NF; j++) acc[n][j] = _mm512_dpbf16_ps(acc[n][j], pk, (__m512bh)t->vp[kp][j]);
        }
    for (int n = 0; n < NV; n++)
        for (int j = 0; j < NF; j++) _mm512_store_ps(st[v0 + n].acc + 16 * j, acc[n][j]);
}

/* A tile's query vectors (rows x heads of one KV head), one per lane in groups of 16: qT as bf16 pairs
 * transposed (lane u of qT[g][dp] holds vector u's dims 2dp, 2dp+1), the running max and denominator
 * reset, and each lane's position (a dummy lane past nvec gets the last one: it sees every key). */
static inline void query_lanes(const AttnArgs *a, WorkItem w, int64_t nvec, int NP, uint32_t (*qT)[64][16],
                               float (*m)[16], float (*lv)[16], int32_t (*pos)[16]) {
    const int64_t G = a->H / a->KVH, ngroups = (nvec + 15) / 16;
    const int32_t last_pos = a->row_pos[w.r1 - 1];
    memset(qT, 0, sizeof(uint32_t) * 64 * 16 * ngroups);
    for (int64_t v = 0; v < ngroups * 16; v++) {
        const int64_t g = v / 16, u = v % 16;
        m[g][u] = -INFINITY;
        lv[g][u] = 0.0f;
        pos[g][u] = v < nvec ? a->row_pos[w.r0 + v / G] : last_pos;
        if (v >= nvec) continue;
        const uint32_t *row =
            (const uint32_t *)((const uint16_t *)a->q + (w.r0 + v / G) * a->q_stride_t + (w.kvh * G + v % G) * a->q_stride_h);
        for (int dp = 0; dp < NP; dp++) qT[g][dp][u] = row[dp];
    }
}

static inline __attribute__((always_inline)) void tile_bf16_d(const AttnArgs *a, WorkItem w, RowState *st,
                                                                FastTile *t, const int D) {
    const int NP = D / 2, NF = D / 16, NV = D == 64 ? 4 : 2;
    const int64_t KVH = a->KVH, G = a->H / a->KVH;
    const int32_t *table = a->block_tables + (int64_t)a->row_seq[w.r0] * a->table_stride;
    const int64_t nvec = (w.r1 - w.r0) * G, ngroups = (nvec + 15) / 16;
    const int32_t first_pos = a->row_pos[w.r0], last_pos = a->row_pos[w.r1 - 1];
    const uint16_t *kc = (const uint16_t *)a->k_cache, *vc = (const uint16_t *)a->v_cache;
    const int64_t stride = KVH * D;
    const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                            37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));

    query_lanes(a, w, nvec, NP, t->qT, t->m, t->lv, t->pos);
    for (int64_t v = 0; v < nvec; v++) memset(st[v].acc, 0, sizeof(float) * D);

    for (int64_t b = 0; b * 16 <= last_pos; b++) {
        const int64_t block = table[b];
        const uint16_t *kb = kc + (block * 16 * KVH + w.kvh) * D, *vb = vc + (block * 16 * KVH + w.kvh) * D;
        const int64_t nkeys = (b + 1) * 16 <= last_pos + 1 ? 16 : last_pos + 1 - b * 16;
        for (int64_t i = 0; i < 16; i++) {
            if (i < nkeys)
                memcpy(t->kl[i], kb + i * stride, sizeof(uint16_t) * D);
            else
                memset(t->kl[i], 0, sizeof(uint16_t) * D);
        }
        for (int kp = 0; kp < 8; kp++) {
            for (int c = 0; c < D / 32; c++) {
                const __m512i x = 2 * kp < nkeys ? _mm512_loadu_si512(vb + 2 * kp * stride + 32 * c) : _mm512_setzero_si512();
                const __m512i y =
                    2 * kp + 1 < nkeys ? _mm512_loadu_si512(vb + (2 * kp + 1) * stride + 32 * c) : _mm512_setzero_si512();
                t->vp[kp][2 * c] = _mm512_permutex2var_epi16(x, lo_idx, y);
                t->vp[kp][2 * c + 1] = _mm512_permutex2var_epi16(x, hi_idx, y);
            }
        }
        const int all_valid = b * 16 + 15 <= first_pos;
        for (int g = 0; g < ngroups; g++) group_softmax(t, g, NP, b * 16, all_valid, a->scale);
        int64_t v = 0;
        for (; v + NV <= nvec && (v % 16) + NV <= 16; v += NV) pv_vectors(t, st, v, (int)(v / 16), (int)(v % 16), NV, NF);
        for (; v < nvec; v++) pv_vectors(t, st, v, (int)(v / 16), (int)(v % 16), 1, NF);
    }

    for (int64_t v = 0; v < nvec; v++) {
        const int64_t r = v / G, h = w.kvh * G + v % G;
        uint16_t *o = (uint16_t *)a->out + ((w.r0 + r) * a->H + h) * D;
        const __m512 inv = _mm512_set1_ps(1.0f / t->lv[v / 16][v % 16]);
        for (int j = 0; j < NF; j++)
            _mm256_storeu_si256((__m256i *)(o + 16 * j),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_load_ps(st[v].acc + 16 * j), inv)));
    }
}

/*
 * One decode row (a generated token's query) and one KV head, bf16 pool, D 64 or 128,
 * block_size 16. The tile kernel above spends a 16-lane group and a per-block layout of
 * keys and values on every tile, which for the G (= H / KVH) query vectors of a lone row
 * is mostly waste; here each key row is read straight from the pool instead: scores by
 * vdpbf16ps then a fixed-order horizontal sum, the online softmax over each block's 16
 * scores in one register, and p.v in float32 FMAs over the block's keys in order.
 * A row's result depends only on its q, its keys and this order: decode rows always come
 * here (whatever else is in the call), prompt rows never do.
 */
/* r[i] = the sum of t[i]'s 16 lanes, by a fixed tree of in-lane and cross-lane shuffles. */
static inline __m512 lane_sums16(const __m512 *t) {
    __m512 a[8], b[4], c[2];
    for (int k = 0; k < 8; k++) /* per 128-bit chunk: t2k[0]+t2k[2], t2k+1[0]+t2k+1[2], t2k[1]+t2k[3], ... */
        a[k] = _mm512_add_ps(_mm512_unpacklo_ps(t[2 * k], t[2 * k + 1]), _mm512_unpackhi_ps(t[2 * k], t[2 * k + 1]));
    for (int k = 0; k < 4; k++) /* per chunk: the chunk sums of t4k .. t4k+3 */
        b[k] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int k = 0; k < 2; k++) /* chunks: t8k..+3 (chunks 0+1), (2+3), t8k+4..+7 (0+1), (2+3) */
        c[k] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

static inline __attribute__((always_inline)) void tile_decode_row_d(const AttnArgs *a, int64_t row, int64_t kvh,
                                                                      const int D) {
    const int NZ = D / 32, NF = D / 16; /* q/k registers (bf16 pairs), accumulator registers */
    const int64_t KVH = a->KVH, G = a->H / a->KVH, stride = KVH * D;
    const int32_t *table = a->block_tables + (int64_t)a->row_seq[row] * a->table_stride;
    const int32_t pos = a->row_pos[row];
    const uint16_t *kc = (const uint16_t *)a->k_cache, *vc = (const uint16_t *)a->v_cache;
    __m512bh q[DECODE_MAX_G][4];
    __m512 acc[DECODE_MAX_G][8];
    float m[DECODE_MAX_G], l[DECODE_MAX_G];
    for (int64_t g = 0; g < G; g++) {
        const uint16_t *qr = (const uint16_t *)a->q + row * a->q_stride_t + (kvh * G + g) * a->q_stride_h;
        for (int z = 0; z < NZ; z++) q[g][z] = (__m512bh)_mm512_loadu_si512(qr + 32 * z);
        for (int j = 0; j < NF; j++) acc[g][j] = _mm512_setzero_ps();
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    const __m512 scale = _mm512_set1_ps(a->scale);
    for (int64_t b = 0; b * 16 <= pos; b++) {
        const int64_t block = table[b];
        const uint16_t *kb = kc + (block * 16 * KVH + kvh) * D, *vb = vc + (block * 16 * KVH + kvh) * D;
        const int nkeys = (b + 1) * 16 <= pos + 1 ? 16 : (int)(pos + 1 - b * 16);
        const __mmask16 live = nkeys == 16 ? (__mmask16)0xffff : (__mmask16)((1u << nkeys) - 1);
        float s[DECODE_MAX_G][16] __attribute__((aligned(64))); /* each vector's p for the block's keys */
        for (int64_t g = 0; g < G; g++) {
            /* All 16 key slots of the block are read (the pool holds them; past the row's last
               key they are stale), and each slot's score lands in its own lane only: the lanes
               past the last key are masked out below. */
            __m512 t[16];
            for (int i = 0; i < 16; i++) {
                t[i] = _mm512_dpbf16_ps(_mm512_setzero_ps(), q[g][0], (__m512bh)_mm512_loadu_si512(kb + i * stride));
                for (int z = 1; z < NZ; z++)
                    t[i] = _mm512_dpbf16_ps(t[i], q[g][z], (__m512bh)_mm512_loadu_si512(kb + i * stride + 32 * z));
            }
            const __m512 S = _mm512_mul_ps(lane_sums16(t), scale);
            const float bmax = _mm512_mask_reduce_max_ps(live, S);
            const float m_new = m[g] > bmax ? m[g] : bmax;
            const float c = _mm512_cvtss_f32(exp16(_mm512_set1_ps(m[g] - m_new)));
            const __m512 p = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(S, _mm512_set1_ps(m_new))));
            l[g] = l[g] * c + _mm512_reduce_add_ps(p);
            m[g] = m_new;
            const __m512 cv = _mm512_set1_ps(c);
            for (int j = 0; j < NF; j++) acc[g][j] = _mm512_mul_ps(acc[g][j], cv);
            _mm512_store_ps(s[g], p);
        }
        /* The block's values in float32 once, then each vector's p.v with its accumulators in registers. */
        __m512 vf[16][8];
        for (int i = 0; i < nkeys; i++)
            for (int j = 0; j < NF; j++)
                vf[i][j] = _mm512_castsi512_ps(_mm512_slli_epi32(
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(vb + i * stride + 16 * j))), 16));
        for (int64_t g = 0; g < G; g++) {
            __m512 o[8];
            for (int j = 0; j < NF; j++) o[j] = acc[g][j];
            for (int i = 0; i < nkeys; i++) {
                const __m512 pi = _mm512_set1_ps(s[g][i]);
                for (int j = 0; j < NF; j++) o[j] = _mm512_fmadd_ps(pi, vf[i][j], o[j]);
            }
            for (int j = 0; j < NF; j++) acc[g][j] = o[j];
        }
    }
    for (int64_t g = 0; g < G; g++) {
        uint16_t *o = (uint16_t *)a->out + (row * a->H + kvh * G + g) * D;
        const __m512 inv = _mm512_set1_ps(1.0f / l[g]);
        for (int j = 0; j < NF; j++)
            _mm256_storeu_si256((__m256i *)(o + 16 * j), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc[g][j], inv)));
    }
}

static void tile_decode_row(const AttnArgs *a, int64_t row, int64_t kvh) {
    if (a->D == 64)
        tile_decode_row_d(a, row, kvh, 64);
    else
        tile_decode_row_d(a, row, kvh, 128);
}

static void tile_bf16(const AttnArgs *a, WorkItem w, RowState *st, FastTile *t) {
    if (a->D == 64)
        tile_bf16_d(a, w, st, t, 64);
    else
        tile_bf16_d(a, w, st, t, 128);
}
#endif

#if defined(__AVX512BF16__) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define KVGATE_AMX 1
#include "amx_tiles.h"
/*
 * Prompt rows with AMX tiles (bf16 pool, D 64 or 128, block_size 16): the tiles of query
 * vectors of tile_bf16_d, with the dot products of q.k and p.v on the tile unit, and the
 * online softmax stepping over chunks of AMX_KEYS keys (4 pool blocks) that start at
 * multiples of AMX_KEYS, so its order depends only on a vector's own position.
 *
 *  - scores: S^T = K . Q^T, a key per tile row and a query vector per column, so row i of
 *    the result is tile_bf16_d's register S[i]; A is the pool's key rows read in place,
 *    B the tile's queries transposed once (qT).
 *  - softmax: per vector lane, as in group_softmax; p rounded to bf16 in key pairs (pT).
 *  - values: O^T += V^T . P^T, a dimension per row and a vector per column, accumulated in
 *    the tile unit from accT; accT is rescaled first when some lane's max moved, and a
 *    factor of exactly 1 changes nothing, so a lane's sums never depend on its neighbours.
 * Keys past the tile's last position are never read: their p is 0 and their values are 0.
 */
enum { AMX_KEYS = 64, AMX_BLOCKS = AMX_KEYS / 16, AMX_KP = AMX_KEYS / 2 };

typedef struct {
    uint32_t qT[FAST_GROUPS][64][16]; /* lane u of qT[g][dp]: vector u's dims 2dp, 2dp+1 */
    float accT[FAST_GROUPS][128][16]; /* accT[g][d][u]: vector u's running sum for dim d */
    float m[FAST_GROUPS][16], lv[FAST_GROUPS][16];
    int32_t pos[FAST_GROUPS][16];
    float s[AMX_KEYS][16];    /* one group's scores for the chunk: key x vector */
    uint32_t pT[AMX_KP][16];  /* lane u of pT[kp]: vector u's p for keys 2kp, 2kp+1 */
    uint32_t w[AMX_KP][128];  /* the chunk's values in key pairs: w[kp][d] */
    uint32_t vT[128][AMX_KP]; /* the same transposed: vT[d][kp] */
} __attribute__((aligned(64))) AmxTile;

/* Whether this process may use the tile registers. (Whether to use them at all is the kernel plan's
   call: with attention_amx off it loads the avx512bf16 build, which keeps the vdpbf16ps tiles.) */
static int amx_permitted(void) {
    static int state;
    return amx_request(&state);
}

/* dst[i][j] = src[j][i] for a 16 x 16 block of 32-bit words. */
static inline void transpose16(const uint32_t *src, int64_t ss, uint32_t *dst, int64_t ds) {
    __m512i r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(src + i * ss);
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) {
            t[8 * h + i] = _mm512_shuffle_i32x4(r[8 * h + i], r[8 * h + i + 4], 0x88);
            t[8 * h + i + 4] = _mm512_shuffle_i32x4(r[8 * h + i], r[8 * h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
    for (int i = 0; i < 16; i++) _mm512_storeu_si512(dst + i * ds, r[i]);
}

/* vT for the chunk: the values of its first nkeys keys, from the blocks table[b0..], 0 past them. */
static inline void amx_values(AmxTile *t, const AttnArgs *a, const int32_t *table, int64_t b0, int nkeys,
                              int64_t kvh, const int D) {
    const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                            37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
    const int64_t stride = a->KVH * D;
    const uint16_t *vc = (const uint16_t *)a->v_cache;
    for (int kp = 0; kp < AMX_KP; kp++) {
        const int key = 2 * kp;
        const uint16_t *vb = key < nkeys ? vc + ((int64_t)table[b0 + key / 16] * 16 * a->KVH + kvh) * D : NULL;
        const uint16_t *x_row = key < nkeys ? vb + (key % 16) * stride : NULL;
        const uint16_t *y_row = key + 1 < nkeys ? vb + (key % 16 + 1) * stride : NULL;
        for (int c = 0; c < D / 32; c++) {
            const __m512i x = x_row ? _mm512_loadu_si512(x_row + 32 * c) : _mm512_setzero_si512();
            const __m512i y = y_row ? _mm512_loadu_si512(y_row + 32 * c) : _mm512_setzero_si512();
            _mm512_store_si512(t->w[kp] + 32 * c, _mm512_permutex2var_epi16(x, lo_idx, y));
            _mm512_store_si512(t->w[kp] + 32 * c + 16, _mm512_permutex2var_epi16(x, hi_idx, y));
        }
    }
    for (int h = 0; h < AMX_KP / 16; h++)
        for (int j = 0; j < D / 16; j++) transpose16(&t->w[16 * h][16 * j], 128, &t->vT[16 * j][16 * h], AMX_KP);
}

/* One group's scores for the chunk's keys [0, nkeys) (rounded up to whole blocks) into t->s. */
static inline void amx_scores(AmxTile *t, const AttnArgs *a, const int32_t *table, int64_t b0, int nblocks, int g,
                              int64_t kvh, const int D) {
    const int64_t stride_bytes = a->KVH * D * 2;
    const uint16_t *kc = (const uint16_t *)a->k_cache;
    for (int bi = 0; bi < nblocks; bi++) {
        const uint16_t *kb = kc + ((int64_t)table[b0 + bi] * 16 * a->KVH + kvh) * D;
        _tile_zero(0);
        for (int c = 0; c < D / 32; c++) {
            _tile_loadd(1, kb + 32 * c, stride_bytes);
            _tile_loadd(2, t->qT[g][16 * c], 64);
            _tile_dpbf16ps(0, 1, 2);
        }
        _tile_stored(0, t->s[16 * bi], 64);
    }
}

/* 2^x for x <= 0 and finite, to well under bf16's precision (p is rounded to bf16): 2^n * 2^f with
 * |f| <= 1/2 and 2^f = e^(f ln2) by its Taylor series to the 4th power (relative error below 5e-5).
 * Far below the range the result is 0 or denormal, which is what those keys weigh. */
static inline __m512 exp2_16_bf16(__m512 x) {
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_fmadd_ps(f, _mm512_set1_ps(9.6181291076e-3f), _mm512_set1_ps(5.5504108665e-2f)); /* ln2^4/24, ln2^3/6 */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));                                        /* ln2^2/2 */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));                                        /* ln2 */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* The online softmax of group g over the chunk at key k0: m, lv, corr and pT. Returns whether any lane's max moved.
 * all_valid: every vector sees every key of the chunk (no masks, no -inf scores). The running max m is kept
 * in base-2 units (scores times scale * log2 e), so each p is one 2^x. */
static inline int amx_softmax(AmxTile *t, int g, int64_t k0, int nkeys, int all_valid, float scale_f, __m512 *corr) {
    const __m512 scale = _mm512_set1_ps(scale_f * 1.44269504088896341f), neg_inf = _mm512_set1_ps(-INFINITY);
    const __m512i P = _mm512_load_si512(t->pos[g]);
    const int nk = (nkeys + 15) & ~15; /* whole blocks were scored; past them p is 0 */
    __mmask16 live[AMX_KEYS];
    __m512 mx = neg_inf;
    for (int i = 0; i < nk; i++) {
        live[i] = all_valid ? (__mmask16)0xffff : _mm512_cmple_epi32_mask(_mm512_set1_epi32((int)(k0 + i)), P);
        mx = _mm512_mask_max_ps(mx, live[i], mx, _mm512_load_ps(t->s[i]));
    }
    const __m512 m_old = _mm512_load_ps(t->m[g]);
    const __m512 m_new = _mm512_max_ps(m_old, _mm512_mul_ps(mx, scale));
    /* exp16 clamps: m_old is -inf before the first chunk */
    *corr = exp16(_mm512_mul_ps(_mm512_sub_ps(m_old, m_new), _mm512_set1_ps(0.69314718055994531f)));
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 sum = _mm512_setzero_ps();
    for (int kp = 0; kp < AMX_KP; kp++) {
        __m512 p0 = _mm512_setzero_ps(), p1 = _mm512_setzero_ps();
        if (2 * kp < nk) {
            p0 = exp2_16_bf16(_mm512_fmsub_ps(_mm512_load_ps(t->s[2 * kp]), scale, m_new));
            p1 = exp2_16_bf16(_mm512_fmsub_ps(_mm512_load_ps(t->s[2 * kp + 1]), scale, m_new));
            if (!all_valid) {
                p0 = _mm512_maskz_mov_ps(live[2 * kp], p0);
                p1 = _mm512_maskz_mov_ps(live[2 * kp + 1], p1);
            }
        }
        sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
        _mm512_store_si512(t->pT[kp], _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(p1, p0)));
    }
    _mm512_store_ps(t->lv[g], _mm512_fmadd_ps(_mm512_load_ps(t->lv[g]), *corr, sum));
    _mm512_store_ps(t->m[g], m_new);
    return _mm512_cmp_ps_mask(m_new, m_old, _CMP_NEQ_OQ) != 0;
}

/* accT[g] = accT[g] * corr + V^T . P^T for the chunk. */
static inline void amx_accumulate(AmxTile *t, int g, int moved, __m512 corr, const int D) {
    float(*acc)[16] = t->accT[g];
    if (moved)
        for (int d = 0; d < D; d++) _mm512_store_ps(acc[d], _mm512_mul_ps(_mm512_load_ps(acc[d]), corr));
    _tile_loadd(5, t->pT[0], 64);
    _tile_loadd(6, t->pT[16], 64);
    for (int j = 0; j < D / 16; j++) {
        _tile_loadd(3, acc[16 * j], 64);
        _tile_loadd(4, &t->vT[16 * j][0], AMX_KP * 4);
        _tile_dpbf16ps(3, 4, 5);
        _tile_loadd(4, &t->vT[16 * j][16], AMX_KP * 4);
        _tile_dpbf16ps(3, 4, 6);
        _tile_stored(3, acc[16 * j], 64);
    }
}

static inline __attribute__((always_inline)) void tile_amx_d(const AttnArgs *a, WorkItem w, AmxTile *t, const int D) {
    const int NP = D / 2;
    const int64_t G = a->H / a->KVH;
    const int32_t *table = a->block_tables + (int64_t)a->row_seq[w.r0] * a->table_stride;
    const int64_t nvec = (w.r1 - w.r0) * G, ngroups = (nvec + 15) / 16;
    const int32_t first_pos = a->row_pos[w.r0], last_pos = a->row_pos[w.r1 - 1];

    for (int64_t g = 0; g < ngroups; g++) memset(t->accT[g], 0, sizeof(float) * 16 * D);
    query_lanes(a, w, nvec, NP, t->qT, t->m, t->lv, t->pos);

    for (int64_t k0 = 0; k0 <= last_pos; k0 += AMX_KEYS) {
        const int nkeys = last_pos + 1 - k0 < AMX_KEYS ? (int)(last_pos + 1 - k0) : AMX_KEYS;
        const int64_t b0 = k0 / 16;
        amx_values(t, a, table, b0, nkeys, w.kvh, D);
        const int all_valid = k0 + AMX_KEYS - 1 <= first_pos;
        for (int g = 0; g < ngroups; g++) {
            amx_scores(t, a, table, b0, (nkeys + 15) / 16, g, w.kvh, D);
            __m512 corr;
            const int moved = amx_softmax(t, g, k0, nkeys, all_valid, a->scale, &corr);
            amx_accumulate(t, g, moved, corr, D);
        }
    }

    for (int64_t v = 0; v < nvec; v++) {
        const int64_t g = v / 16, u = v % 16, r = v / G, h = w.kvh * G + v % G;
        uint16_t *o = (uint16_t *)a->out + ((w.r0 + r) * a->H + h) * D;
        const float inv = 1.0f / t->lv[g][u];
        for (int d = 0; d < D; d++) o[d] = f32_to_bf16(t->accT[g][d][u] * inv);
    }
}

static void tile_amx(const AttnArgs *a, WorkItem w, AmxTile *t) {
    if (a->D == 64)
        tile_amx_d(a, w, t, 64);
    else
        tile_amx_d(a, w, t, 128);
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

/* Whether prompt rows run on AMX tiles (tile_amx) in this process. */
int kvgate_uses_amx(const AttnArgs *a) {
#ifdef KVGATE_AMX
    return kvgate_uses_avx512bf16(a) && amx_permitted();
#else
    (void)a;
    return 0;
#endif
}

int kvgate_paged_attention(const AttnArgs *a) {
    const int64_t G = a->H / a->KVH;
    if (a->D > MAX_D || a->block_size > MAX_BS || G * TILE_ROWS > MAX_VECS || a->H % a->KVH) return -1;
    if (kvgate_uses_avx512bf16(a) && G > FAST_TILE_VECS) return -1;
    /* Cut rows into tiles: consecutive rows of one sequence at consecutive positions. */
    WorkItem *items = malloc(sizeof(WorkItem) * (size_t)(a->T * a->KVH + 1));
    if (!items) return -2;
    const int fast = kvgate_uses_avx512bf16(a), amx = kvgate_uses_amx(a), avx2 = kvgate_uses_avx2(a);
    /* The SIMD kernels lay out each KV block once per tile: bigger tiles share that work. */
    const int64_t tile_rows = fast ? FAST_TILE_VECS / G : avx2 ? AVX2_TILE_VECS / G : TILE_ROWS;
    /* Decode rows (the leading num_decode) get one item per row and KV head (r1 = -1 marks them). */
    /* With AMX every row takes the tiles (faster for decode rows too, 8 rows at 300 keys: 98 vs 114 us). */
#ifdef KVGATE_AVX2
    const int decode_rows = avx2_decode_rows(a);
#else
    const int decode_rows = !amx && fast && G <= DECODE_MAX_G;
#endif
    const int64_t num_decode = decode_rows ? (a->num_decode < a->T ? a->num_decode : a->T) : 0;
    int64_t n = 0, r0 = num_decode, keys = 0;
    for (int64_t r = 0; r < num_decode; r++)
        for (int64_t h = 0; h < a->KVH; h++) items[n++] = (WorkItem){r, -1, h};
    const int decode_only = a->num_decode >= a->T;
    for (int64_t r = 0; decode_only && r < a->T; r++) keys += a->row_pos[r] + 1;
    /* Decode-only calls with little work run on the calling thread: waking a sleeping
       (passive) OpenMP team costs more than they take. */
    const int threads = decode_only && keys * a->H < DECODE_SERIAL_WORK ? 1 : a->num_threads;
    for (int64_t r = r0 + 1; r <= a->T; r++) {
        int cut = r == a->T || r - r0 == tile_rows || a->row_seq[r] != a->row_seq[r0] ||
                  a->row_pos[r] != a->row_pos[r - 1] + 1;
        if (!cut) continue;
        for (int64_t h = 0; h < a->KVH; h++) items[n++] = (WorkItem){r0, r, h};
        r0 = r;
    }
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        RowState *st = aligned_alloc(64, sizeof(RowState) * (MAX_VECS > FAST_TILE_VECS ? MAX_VECS : FAST_TILE_VECS));
#ifdef __AVX512BF16__
        FastTile *ft = aligned_alloc(64, sizeof(FastTile));
#elif defined(KVGATE_AVX2)
        Avx2Tile *ft = avx2 ? aligned_alloc(32, sizeof(Avx2Tile)) : malloc(1);
#else
        void *ft = malloc(1); /* unused: keeps the checks below the same */
#endif
        float *kf = aligned_alloc(64, sizeof(float) * MAX_BS * MAX_D);
        float *vf = aligned_alloc(64, sizeof(float) * MAX_BS * MAX_D);
#ifdef KVGATE_AMX
        AmxTile *at = amx ? aligned_alloc(64, sizeof(AmxTile)) : NULL;
        if (at) amx_configure();
#else
        void *at = NULL;
#endif
        if (!st || !kf || !vf || !ft || (amx && !at)) {
#pragma omp atomic write
            failed = 1;
        } else {
            /* Largest items first (the last rows of a causal prompt see the most keys), so
               the threads finish together; each item's result is its own, whatever the order. */
#pragma omp for schedule(dynamic, 1)
            for (int64_t j = 0; j < n; j++) {
                const int64_t i = n - 1 - j;
#ifdef __AVX512BF16__
                if (items[i].r1 < 0) {
                    tile_decode_row(a, items[i].r0, items[i].kvh);
                    continue;
                }
#ifdef KVGATE_AMX
                if (amx) {
                    tile_amx(a, items[i], at);
                    continue;
                }
#endif
                if (fast) {
                    tile_bf16(a, items[i], st, ft);
                    continue;
                }
#endif
#ifdef KVGATE_AVX2
                if (items[i].r1 < 0) {
                    tile_decode_row_avx2(a, items[i].r0, items[i].kvh);
                    continue;
                }
                if (avx2) {
                    tile_avx2(a, items[i], ft);
                    continue;
                }
#endif
                tile_generic(a, items[i], st, kf, vf);
            }
        }
        free(st);
        free(ft);
        free(kf);
        free(vf);
#ifdef KVGATE_AMX
        if (at) _tile_release();
#endif
        free(at);
    }
    free(items);
    (void)fast;
    (void)amx;
    (void)avx2;
    return failed ? -2 : 0;
}
