/*
 * Linear layers for the rows of generated (decode) tokens: a pass over every weight for a
 * few rows, bound by memory bandwidth. Two weight formats, one thread pool:
 *
 * bf16 pairs (CPUs with avx512_bf16). oneDNN spends ~180 us per call on such small
 * matmuls (121 calls a step for SmolLM2-135M), well above the time to read the weights.
 * Here each weight is packed once, at load, into the order this loop reads it: groups of
 * 64 outputs, and within a group, for each pair of inputs k, the 64 outputs'
 * (W[n][2k], W[n][2k+1]) pairs side by side (256 contiguous bytes, four vdpbf16ps
 * operands). A row's 64 float accumulators then run over k in order, one vdpbf16ps per
 * pair of inputs, the same sequence whatever the number of rows or their neighbours.
 *
 * Exact blocks (float32 models on AVX2 + FMA CPUs). A float32 weight dequantized from a
 * GGUF file holds, per 32 inputs of an output, values d*q + m (Q4_1: 4-bit q, float16 d
 * and m) or d*q (Q8_0: int8 q). decode_linear.py finds such blocks and proves them exact;
 * this loop then reads 24 or 36 bytes per 32 weights instead of 128, rebuilds each weight
 * with the same float32 operations the loader used (a multiply, then a separate add: the
 * same bits, checked by tests/inference/test_decode_linear.py), and sums x * w into two
 * 8-lane accumulators per row in one fixed order, then adds their lanes in a fixed order.
 *
 * Either way, every row's result depends on that row alone (tests/inference/test_decode_linear.py).
 *
 * Threads: a call splits its outputs into chunks that the calling thread and the
 * pool's workers claim one at a time. The caller never waits for a worker to start (a
 * worker asleep or descheduled by a busy neighbour just claims nothing, and the caller
 * does its share); it waits only for chunks a worker already claimed. Within a forward
 * pass a worker spins a short while after each call (the next one comes within ~100 us);
 * the caller sets the spin to 0 between passes, and the worker sleeps on a futex, so an
 * idle engine leaves its cores alone.
 */
/* A multiply then an add must stay two roundings (the loader's); GCC keeps them apart under
   -std=c11 (native.py's CFLAGS), clang under this pragma. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

int kvgate_decode_linear_available(void);
int64_t kvgate_decode_linear_packed_size(int64_t N, int64_t K);

#define GROUP 64 /* bf16: outputs per group, four 16-lane vectors */
#define QBLOCK 32 /* exact blocks: inputs per block */
enum { AVAILABLE_BF16 = 1, AVAILABLE_BLOCKS = 2 };
enum { BF16_PAIRS = 0, Q4_1 = 1, Q8_0 = 2 };

/* uint32 words of a packed [N, K] bf16 weight: N rounded up to groups, K up to pairs. */
int64_t kvgate_decode_linear_packed_size(int64_t N, int64_t K) {
    return (N + GROUP - 1) / GROUP * GROUP * ((K + 1) / 2);
}

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__linux__)
#define KVGATE_BF16 1
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__linux__)
#define KVGATE_BLOCKS 1
#endif

int kvgate_decode_linear_available(void) {
    int bits = 0;
#ifdef KVGATE_BF16
    bits |= AVAILABLE_BF16;
#endif
#ifdef KVGATE_BLOCKS
    bits |= AVAILABLE_BLOCKS;
#endif
    return bits;
}

#if defined(KVGATE_BF16) || defined(KVGATE_BLOCKS)
#include <immintrin.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int format;        /* BF16_PAIRS, Q4_1 or Q8_0 */
    const void *x;     /* [M, K], row stride x_stride: bf16 for BF16_PAIRS, else float32 */
    int64_t x_stride, M, K, N;
    const void *w;     /* packed */
    const void *bias;  /* [N] (the type of x) or NULL */
    void *out;         /* [M, N], row stride out_stride; bf16, or float32 when out_f32 */
    int64_t out_stride;
    int out_f32;
    int64_t units_per_chunk, chunks; /* units: bf16 output groups, or block outputs */
} Job;

#endif

#ifdef KVGATE_BF16
/* w [N, K] bf16 row-major -> packed [N/64][K/2][64] pairs (zeros past N and K). */
void kvgate_decode_linear_pack(const uint16_t *w, int64_t N, int64_t K, uint32_t *packed) {
    const int64_t K2 = (K + 1) / 2, groups = (N + GROUP - 1) / GROUP;
    for (int64_t g = 0; g < groups; g++)
        for (int64_t k2 = 0; k2 < K2; k2++) {
            uint32_t *dst = packed + (g * K2 + k2) * GROUP;
            for (int64_t j = 0; j < GROUP; j++) {
                const int64_t n = g * GROUP + j, k = 2 * k2;
                const uint32_t lo = n < N ? w[n * K + k] : 0;
                const uint32_t hi = n < N && k + 1 < K ? w[n * K + k + 1] : 0;
                dst[j] = lo | hi << 16;
            }
        }
}

/* The pair x[2k], x[2k+1] of a row in all 16 lanes (the last one of an odd K pairs with zero). */
static inline __m512bh pair(const uint16_t *x, int64_t k2, int64_t K) {
    uint32_t v;
    if (2 * k2 + 1 < K)
        memcpy(&v, x + 2 * k2, 4);
    else
        v = x[2 * k2];
    return (__m512bh)_mm512_set1_epi32((int)v);
}

static inline void store(const Job *job, int64_t m, int64_t n0, __m512 acc) {
    const int64_t left = job->N - n0;
    if (left <= 0) return;
    const __mmask16 mask = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
    if (job->bias) {
        const __m256i b = _mm256_maskz_loadu_epi16(mask, (const uint16_t *)job->bias + n0);
        acc = _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
    }
    if (job->out_f32)
        _mm512_mask_storeu_ps((float *)job->out + m * job->out_stride + n0, mask, acc);
    else
        _mm256_mask_storeu_epi16((uint16_t *)job->out + m * job->out_stride + n0, mask,
                                 (__m256i)_mm512_cvtneps_pbh(acc));
}

/* Rows [m0, m0 + MT) of one output group: MT x 64 accumulators over k in order. */
static inline __attribute__((always_inline)) void tile(const Job *job, int64_t g, int64_t m0, const int MT) {
    const int64_t K = job->K, K2 = (K + 1) / 2;
    const uint32_t *w = (const uint32_t *)job->w + g * K2 * GROUP;
    const uint16_t *x = job->x;
    __m512 acc[4][4];
    for (int m = 0; m < MT; m++)
        for (int j = 0; j < 4; j++) acc[m][j] = _mm512_setzero_ps();
    for (int64_t k2 = 0; k2 < K2; k2++) {
        const uint32_t *wk = w + k2 * GROUP;
        __m512bh b[4];
        for (int j = 0; j < 4; j++) b[j] = (__m512bh)_mm512_loadu_si512(wk + 16 * j);
        for (int m = 0; m < MT; m++) {
            const __m512bh a = pair(x + (m0 + m) * job->x_stride, k2, K);
            for (int j = 0; j < 4; j++) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], a, b[j]);
        }
    }
    for (int m = 0; m < MT; m++)
        for (int j = 0; j < 4; j++) store(job, m0 + m, g * GROUP + 16 * j, acc[m][j]);
}

static void run_bf16(const Job *job, int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++) {
        int64_t m = 0;
        for (; m + 4 <= job->M; m += 4) tile(job, g, m, 4);
        switch (job->M - m) {
        case 3: tile(job, g, m, 3); break;
        case 2: tile(job, g, m, 2); break;
        case 1: tile(job, g, m, 1); break;
        default: break;
        }
    }
}
#else
void kvgate_decode_linear_pack(const uint16_t *w, int64_t N, int64_t K, uint32_t *packed) {
    (void)w, (void)N, (void)K, (void)packed;
}
#endif

#ifdef KVGATE_BLOCKS
/* Bytes of one packed block: Q4_1 float32 d, float32 m, 16 bytes of nibbles (byte j holds
   q[j] low and q[j + 16] high, as in GGUF); Q8_0 float32 d, 32 int8 q. */
static inline int64_t block_bytes(int format) { return format == Q4_1 ? 24 : 36; }

/* The 32 weights of a block as four 8-lane vectors: float32 d * q, then + m (Q4_1). */
static inline __attribute__((always_inline)) void weights(const uint8_t *blk, int format, __m256 w[4]) {
    const __m256 d = _mm256_broadcast_ss((const float *)blk);
    if (format == Q4_1) {
        const __m256 m = _mm256_broadcast_ss((const float *)(blk + 4));
        const __m128i bytes = _mm_loadu_si128((const __m128i *)(blk + 8));
        const __m128i nib = _mm_set1_epi8(0x0f);
        const __m128i lo = _mm_and_si128(bytes, nib), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), nib);
        const __m128i q[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int s = 0; s < 4; s++)
            w[s] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q[s])), d), m);
    } else {
        for (int s = 0; s < 4; s++) {
            const __m128i q = _mm_loadl_epi64((const __m128i *)(blk + 4 + 8 * s));
            w[s] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
        }
    }
}

/* The weights of n packed rows of K inputs, as float32 (for tests: the bits the kernel multiplies by). */
void kvgate_decode_blocks_unpack(const uint8_t *packed, int format, int64_t N, int64_t K, float *out) {
    const int64_t blocks = K / QBLOCK, bb = block_bytes(format);
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < blocks; b++) {
            __m256 w[4];
            weights(packed + (n * blocks + b) * bb, format, w);
            for (int s = 0; s < 4; s++) _mm256_storeu_ps(out + n * K + b * QBLOCK + 8 * s, w[s]);
        }
}

/* out[m][n] = the lanes of a row's four accumulators, added in one fixed order, + bias. */
static inline void store_sum(const Job *job, int64_t n, int64_t m, const __m256 *acc) {
    const __m256 s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    float v = _mm_cvtss_f32(h);
    if (job->bias) v += ((const float *)job->bias)[n];
    ((float *)job->out)[m * job->out_stride + n] = v;
}

/* Output n for rows [m0, m0 + MT): per row, the lanes of four accumulators (one per 8 inputs
   of a block) over the blocks in order, then one fixed reduction. */
static inline __attribute__((always_inline)) void block_tile(const Job *job, int64_t n, int64_t m0, const int MT) {
    const int64_t blocks = job->K / QBLOCK, bb = block_bytes(job->format);
    const uint8_t *wn = (const uint8_t *)job->w + n * blocks * bb;
    const float *x = (const float *)job->x + m0 * job->x_stride;
    __m256 acc[2][4];
    for (int m = 0; m < MT; m++)
        for (int s = 0; s < 4; s++) acc[m][s] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        __m256 w[4];
        weights(wn + b * bb, job->format, w);
        for (int m = 0; m < MT; m++) {
            const float *xb = x + m * job->x_stride + b * QBLOCK;
            for (int s = 0; s < 4; s++) acc[m][s] = _mm256_fmadd_ps(w[s], _mm256_loadu_ps(xb + 8 * s), acc[m][s]);
        }
    }
    for (int m = 0; m < MT; m++) store_sum(job, n, m0 + m, acc[m]);
}

/* Rows [m0, m0 + MT) of output n with its weights already rebuilt in w: the same sums as block_tile. */
static inline __attribute__((always_inline)) void rebuilt_tile(const Job *job, const float *w, int64_t n, int64_t m0,
                                                               const int MT) {
    const int64_t blocks = job->K / QBLOCK;
    const float *x = (const float *)job->x + m0 * job->x_stride;
    __m256 acc[2][4];
    for (int m = 0; m < MT; m++)
        for (int s = 0; s < 4; s++) acc[m][s] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++)
        for (int m = 0; m < MT; m++) {
            const float *xb = x + m * job->x_stride + b * QBLOCK;
            for (int s = 0; s < 4; s++)
                acc[m][s] = _mm256_fmadd_ps(_mm256_load_ps(w + b * QBLOCK + 8 * s), _mm256_loadu_ps(xb + 8 * s), acc[m][s]);
        }
    for (int m = 0; m < MT; m++) store_sum(job, n, m0 + m, acc[m]);
}

enum { REBUILD_MAX_K = 8192 };

static void run_blocks(const Job *job, int64_t n0, int64_t n1) {
    /* Past two rows, an output's weights are rebuilt once into this buffer and every row
       pair reads them from L1, rather than each pair rebuilding them again. */
    float w[REBUILD_MAX_K] __attribute__((aligned(32)));
    const int rebuild = job->M > 2 && job->K <= REBUILD_MAX_K;
    const int64_t blocks = job->K / QBLOCK, bb = block_bytes(job->format);
    for (int64_t n = n0; n < n1; n++) {
        int64_t m = 0;
        if (rebuild) {
            const uint8_t *wn = (const uint8_t *)job->w + n * blocks * bb;
            for (int64_t b = 0; b < blocks; b++) {
                __m256 v[4];
                weights(wn + b * bb, job->format, v);
                for (int s = 0; s < 4; s++) _mm256_store_ps(w + b * QBLOCK + 8 * s, v[s]);
            }
            for (; m + 2 <= job->M; m += 2) rebuilt_tile(job, w, n, m, 2);
            if (m < job->M) rebuilt_tile(job, w, n, m, 1);
            continue;
        }
        for (; m + 2 <= job->M; m += 2) block_tile(job, n, m, 2);
        if (m < job->M) block_tile(job, n, m, 1);
    }
}
#endif

#if defined(KVGATE_BF16) || defined(KVGATE_BLOCKS)
static void run_chunk(const Job *job, int64_t chunk) {
    const int64_t units = job->format == BF16_PAIRS ? (job->N + GROUP - 1) / GROUP : job->N;
    const int64_t u0 = chunk * job->units_per_chunk;
    const int64_t u1 = u0 + job->units_per_chunk < units ? u0 + job->units_per_chunk : units;
#ifdef KVGATE_BF16
    if (job->format == BF16_PAIRS) run_bf16(job, u0, u1);
#endif
#ifdef KVGATE_BLOCKS
    if (job->format != BF16_PAIRS) run_blocks(job, u0, u1);
#endif
}

/* ---- the thread pool ---------------------------------------------------------------- */

#define MAX_WORKERS 63

static struct {
    pthread_mutex_t lock; /* serializes callers (and pool start-up) */
    int workers;
    Job job;
    /* (generation << 32) | next chunk: a claim succeeds only within the job it was made for. */
    _Atomic uint64_t ticket;
    _Atomic int64_t done;
    _Atomic uint32_t wake; /* futex word: bumped at every call */
    _Atomic int sleepers;
    _Atomic int64_t spin_ns;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .spin_ns = 0};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Claim and run chunks of the current job until none is left. */
static void work(void) {
    for (;;) {
        uint64_t t = atomic_load(&pool.ticket);
        const uint32_t index = (uint32_t)t;
        /* The job is read before the claim; a successful claim proves it was current throughout
           (the caller only replaces it once every chunk is done, this one included). */
        const Job job = pool.job;
        if (index >= (uint64_t)job.chunks) return;
        if (!atomic_compare_exchange_weak(&pool.ticket, &t, t + 1)) continue;
        run_chunk(&job, index);
        atomic_fetch_add(&pool.done, 1);
    }
}

static void *worker_main(void *arg) {
    (void)arg;
    uint32_t seen = atomic_load(&pool.wake);
    for (;;) {
        const int64_t since = now_ns();
        int spins = 0;
        while (atomic_load(&pool.wake) == seen) {
            _mm_pause();
            /* spin_ns is re-read: the caller sets it to 0 at the end of a pass, and the worker
               then sleeps at once rather than spinning out its time between passes. Spinning
               yields now and then: on a core another process keeps busy, that one runs. */
            if (++spins % 64 != 0) continue;
            sched_yield();
            if (now_ns() - since >= atomic_load(&pool.spin_ns)) {
                atomic_fetch_add(&pool.sleepers, 1);
                if (atomic_load(&pool.wake) == seen)
                    syscall(SYS_futex, &pool.wake, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
                atomic_fetch_sub(&pool.sleepers, 1);
                spins = 0;
            }
        }
        seen = atomic_load(&pool.wake);
        work();
    }
    return NULL;
}

/* How long (ns) a worker keeps spinning after a call before it sleeps; 0: it sleeps at once. */
void kvgate_decode_linear_set_spin(int64_t ns) { atomic_store(&pool.spin_ns, ns < 0 ? 0 : ns); }

static void run_job(Job job, int threads) {
    if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
    if (threads <= 1 || job.chunks == 1) {
        for (int64_t c = 0; c < job.chunks; c++) run_chunk(&job, c);
        return;
    }
    pthread_mutex_lock(&pool.lock);
    while (pool.workers < threads - 1) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker_main, NULL) != 0) break;
        pthread_detach(t);
        pool.workers++;
    }
    const uint64_t generation = (atomic_load(&pool.ticket) >> 32) + 1;
    atomic_store(&pool.ticket, generation << 32 | 0xffffffffu); /* no claims while the job is written */
    pool.job = job;
    atomic_store(&pool.done, 0);
    atomic_store(&pool.ticket, generation << 32);
    atomic_fetch_add(&pool.wake, 1);
    if (atomic_load(&pool.sleepers) > 0) syscall(SYS_futex, &pool.wake, FUTEX_WAKE_PRIVATE, MAX_WORKERS, NULL, NULL, 0);
    work();
    while (atomic_load(&pool.done) < job.chunks) _mm_pause();
    pthread_mutex_unlock(&pool.lock);
}

/* A job whose chunks hold at least ~32 KB of weights each, so a claim's cost stays small beside its work. */
static Job chunked(Job job, int64_t units, int64_t unit_bytes) {
    int64_t per = 32768 / (unit_bytes > 0 ? unit_bytes : 1);
    job.units_per_chunk = per < 1 ? 1 : per;
    job.chunks = (units + job.units_per_chunk - 1) / job.units_per_chunk;
    return job;
}
#else
void kvgate_decode_linear_set_spin(int64_t ns) { (void)ns; }
#endif

/*
 * out[m] = x[m] @ W^T (+ bias) for m < M, W packed by kvgate_decode_linear_pack; bf16 out
 * rounded to nearest even, or float32. threads: the caller plus threads - 1 pool workers.
 */
void kvgate_decode_linear(const uint16_t *x, int64_t x_stride, int64_t M, int64_t K, const uint32_t *packed,
                          int64_t N, const uint16_t *bias, void *out, int64_t out_stride, int out_f32, int threads) {
#ifdef KVGATE_BF16
    if (M <= 0 || N <= 0) return;
    const Job job = {BF16_PAIRS, x, x_stride, M, K, N, packed, bias, out, out_stride, out_f32, 0, 0};
    run_job(chunked(job, (N + GROUP - 1) / GROUP, GROUP * 4 * ((K + 1) / 2)), threads);
#else
    (void)x, (void)x_stride, (void)M, (void)K, (void)packed, (void)N, (void)bias, (void)out, (void)out_stride;
    (void)out_f32, (void)threads;
#endif
}

/*
 * out[m] = x[m] @ W^T (+ bias), all float32, for W of N outputs packed in exact blocks
 * (format Q4_1 or Q8_0, K a multiple of 32). threads as above.
 */
void kvgate_decode_blocks_linear(const float *x, int64_t x_stride, int64_t M, int64_t K, const uint8_t *packed,
                                 int format, int64_t N, const float *bias, float *out, int64_t out_stride,
                                 int threads) {
#ifdef KVGATE_BLOCKS
    if (M <= 0 || N <= 0) return;
    const Job job = {format, x, x_stride, M, K, N, packed, bias, out, out_stride, 1, 0, 0};
    /* A sleeping worker wakes tens of microseconds late, and the caller then waits for the
       chunk it claimed: worth it only for calls of more than about 0.5 ms of work. A spinning
       one starts at once: worth it from about 15 us of work. */
    const int64_t least = atomic_load(&pool.spin_ns) > 0 ? 4096 : (int64_t)1 << 17;
    if (M * N * (K / QBLOCK) < least) threads = 1;
    run_job(chunked(job, N, K / QBLOCK * block_bytes(format)), threads);
#else
    (void)x, (void)x_stride, (void)M, (void)K, (void)packed, (void)format, (void)N, (void)bias, (void)out;
    (void)out_stride, (void)threads;
#endif
}
