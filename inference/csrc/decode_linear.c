/*
 * Linear layers for the rows of generated (decode) tokens, bf16 on CPUs with avx512_bf16.
 *
 * A decode step multiplies a few rows by every weight of the model once: it is a pass
 * over the weights, bound by memory bandwidth. oneDNN spends ~180 us per call on such
 * small matmuls (121 calls a step for SmolLM2-135M), well above the time to read the
 * weights. Here each weight is packed once, at load, into the order this loop reads it:
 * groups of 64 outputs, and within a group, for each pair of inputs k, the 64 outputs'
 * (W[n][2k], W[n][2k+1]) pairs side by side (256 contiguous bytes, four vdpbf16ps
 * operands). A row's 64 float accumulators then run over k in order, one vdpbf16ps per
 * pair of inputs, the same sequence whatever the number of rows or their neighbours:
 * every row's result depends on that row alone (tests/inference/test_decode_linear.py).
 *
 * Threads: a call splits its output groups into chunks that the calling thread and the
 * pool's workers claim one at a time. The caller never waits for a worker to start (a
 * worker asleep or descheduled by a busy neighbour just claims nothing, and the caller
 * does its share); it waits only for chunks a worker already claimed. Within a forward
 * pass a worker spins a short while after each call (the next one comes within ~100 us);
 * the caller sets the spin to 0 between passes, and the worker sleeps on a futex, so an
 * idle engine leaves its cores alone.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

int kvgate_decode_linear_available(void);
int64_t kvgate_decode_linear_packed_size(int64_t N, int64_t K);

#define GROUP 64 /* outputs per group: four 16-lane vectors */

/* uint32 words of a packed [N, K] weight: N rounded up to groups, K up to pairs. */
int64_t kvgate_decode_linear_packed_size(int64_t N, int64_t K) {
    return (N + GROUP - 1) / GROUP * GROUP * ((K + 1) / 2);
}

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__linux__)
#include <immintrin.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int kvgate_decode_linear_available(void) { return 1; }

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

typedef struct {
    const uint16_t *x; /* [M, K] bf16, row stride x_stride */
    int64_t x_stride, M, K, N;
    const uint32_t *w;  /* packed */
    const uint16_t *bias; /* [N] bf16 or NULL */
    void *out;         /* [M, N], row stride out_stride; bf16, or float32 when out_f32 */
    int64_t out_stride;
    int out_f32;
    int64_t groups_per_chunk, chunks;
} Job;

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
        const __m256i b = _mm256_maskz_loadu_epi16(mask, job->bias + n0);
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
    const uint32_t *w = job->w + g * K2 * GROUP;
    __m512 acc[4][4];
    for (int m = 0; m < MT; m++)
        for (int j = 0; j < 4; j++) acc[m][j] = _mm512_setzero_ps();
    for (int64_t k2 = 0; k2 < K2; k2++) {
        const uint32_t *wk = w + k2 * GROUP;
        __m512bh b[4];
        for (int j = 0; j < 4; j++) b[j] = (__m512bh)_mm512_loadu_si512(wk + 16 * j);
        for (int m = 0; m < MT; m++) {
            const __m512bh a = pair(job->x + (m0 + m) * job->x_stride, k2, K);
            for (int j = 0; j < 4; j++) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], a, b[j]);
        }
    }
    for (int m = 0; m < MT; m++)
        for (int j = 0; j < 4; j++) store(job, m0 + m, g * GROUP + 16 * j, acc[m][j]);
}

static void run_chunk(const Job *job, int64_t chunk) {
    const int64_t groups = (job->N + GROUP - 1) / GROUP;
    const int64_t g0 = chunk * job->groups_per_chunk;
    const int64_t g1 = g0 + job->groups_per_chunk < groups ? g0 + job->groups_per_chunk : groups;
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

/* Claim and run chunks of the current job until none is left; returns how many ran. */
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
               then sleeps at once rather than spinning out its time between passes. */
            if (++spins % 64 == 0 && now_ns() - since >= atomic_load(&pool.spin_ns)) {
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

/*
 * out[m] = x[m] @ W^T (+ bias) for m < M, W packed by kvgate_decode_linear_pack; bf16 out
 * rounded to nearest even, or float32. threads: the caller plus threads - 1 pool workers.
 */
void kvgate_decode_linear(const uint16_t *x, int64_t x_stride, int64_t M, int64_t K, const uint32_t *packed,
                          int64_t N, const uint16_t *bias, void *out, int64_t out_stride, int out_f32, int threads) {
    if (M <= 0 || N <= 0) return;
    const int64_t groups = (N + GROUP - 1) / GROUP;
    /* Chunks of at least ~32 KB of weights, so a claim's cost stays small beside its work. */
    int64_t per = (32768 / (GROUP * 4)) / ((K + 1) / 2);
    per = per < 1 ? 1 : per;
    Job job = {x, x_stride, M, K, N, packed, bias, out, out_stride, out_f32, per, (groups + per - 1) / per};
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

#else /* no avx512_bf16: the callers keep oneDNN */

int kvgate_decode_linear_available(void) { return 0; }
void kvgate_decode_linear_pack(const uint16_t *w, int64_t N, int64_t K, uint32_t *packed) {
    (void)w, (void)N, (void)K, (void)packed;
}
void kvgate_decode_linear_set_spin(int64_t ns) { (void)ns; }
void kvgate_decode_linear(const uint16_t *x, int64_t x_stride, int64_t M, int64_t K, const uint32_t *packed,
                          int64_t N, const uint16_t *bias, void *out, int64_t out_stride, int out_f32, int threads) {
    (void)x, (void)x_stride, (void)M, (void)K, (void)packed, (void)N, (void)bias, (void)out, (void)out_stride;
    (void)out_f32, (void)threads;
}
#endif
