/*
 * bf16 linear layers on AMX tiles, with every row's result independent of the call.
 *
 * oneDNN's AMX matmul picks its blocking from the number of rows, and its sums for a
 * row change with it (tests/inference/test_cpu_kernels.py); a prompt's last rows would
 * then differ between a cold pass over the whole prompt and a warm pass over its tail.
 * Here every output element is one tile-unit dot product per 32-wide slice of K, in
 * order, added into the same float32 accumulator: nothing depends on M, on the other
 * rows, or on how the work is split between threads.
 *
 * The weight is packed once (kvgate_amx_linear_pack) into B tiles: for each block of 16
 * outputs and 32 inputs, 16 rows of input pairs x 16 outputs (the VNNI layout). A call
 * takes 32 rows x 32 outputs at a time in four accumulator tiles, the weight in panels
 * of PANEL outputs that each thread keeps in its cache while it walks down the rows.
 *
 * A fused gate|up projection (outputs [gate; up], N/2 each) may be packed in pairs: each
 * 32 packed outputs are 16 of gate and the same 16 of up, so one block holds both halves
 * of 16 outputs of SiLU(gate) * up, which the call can then write directly (MODE_SILU_MUL),
 * rounding as fused_ops' silu_mul does after a bf16 gate|up: bit for bit the two-step result,
 * without the gate|up intermediate going through memory.
 */
#define _GNU_SOURCE /* syscall() */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_simd.h"

enum { MODE_PLAIN = 0, MODE_PAIRS = 1 /* pairs-packed, gate|up written apart */, MODE_SILU_MUL = 2 };

int kvgate_amx_linear_available(void);
int64_t kvgate_amx_linear_packed_size(int64_t N, int64_t K);
void kvgate_amx_linear_pack(const uint16_t *w, int64_t N, int64_t K, int pairs, uint16_t *packed);
int kvgate_amx_linear(const uint16_t *x, int64_t x_stride, int64_t M, int64_t K, const uint16_t *packed, int64_t N,
                      const uint16_t *bias, uint16_t *out, int mode, int num_threads);

/* The packed layout: N rounded up to 32 (pairs of 16-output blocks), K to 32. */
int64_t kvgate_amx_linear_packed_size(int64_t N, int64_t K) { return ((N + 31) / 32 * 32) * ((K + 31) / 32 * 32); }

/* packed[nb][kb] is a 16 x 32 tile (512 bf16): row kp, column n holds W[row(nb, n)][32kb + 2kp + {0,1}], where
 * row(nb, n) is 16nb + n, or with pairs (N/2 a multiple of 16) 16(nb/2) + n of gate or of up as nb is even or odd. */
void kvgate_amx_linear_pack(const uint16_t *w, int64_t N, int64_t K, int pairs, uint16_t *packed) {
    const int64_t NB = (N + 31) / 32 * 2, KB = (K + 31) / 32;
    for (int64_t nb = 0; nb < NB; nb++)
        for (int64_t kb = 0; kb < KB; kb++) {
            uint16_t *tile = packed + (nb * KB + kb) * 512;
            for (int kp = 0; kp < 16; kp++)
                for (int n = 0; n < 16; n++)
                    for (int e = 0; e < 2; e++) {
                        const int64_t row = pairs ? (nb % 2) * (N / 2) + 16 * (nb / 2) + n : 16 * nb + n;
                        const int64_t col = 32 * kb + 2 * kp + e;
                        tile[(kp * 16 + n) * 2 + e] = row < N && col < K ? w[row * K + col] : 0;
                    }
        }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include "amx_tiles.h"

/* Outputs per work item: 256 when there are rows to walk down, fewer for a step's few rows so
   that both threads get a share of the outputs. */
enum { PANEL = 256, SMALL_PANEL = 64, PREFETCH = 4 /* k-steps */ };

int kvgate_amx_linear_available(void) {
    static int state;
    return amx_request(&state);
}

/* Rows [0, 32) of a: x's rows from m0 (stride in bytes), or a zero-padded copy where fewer remain or K is ragged. */
typedef struct {
    const uint16_t *rows;
    int64_t stride;
} RowsView;

static inline __m512 tile_row(const float *c, int r, int t, const uint16_t *bias, __mmask16 mask) {
    /* c: 32 x 32 float32 (two 16-row halves of two 16-column tiles, laid out as [half][tile][16][16]) */
    __m512 v = _mm512_loadu_ps(c + (((r / 16) * 2 + t) * 16 + r % 16) * 16);
    if (bias) v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, bias)), 16)));
    return v;
}

/* Rows [0, nrows) of a block at packed columns [n0, n0 + ncols) into out (row stride ldo). */
static inline void store_block(const float *c, int nrows, int ncols, const uint16_t *bias, int64_t n0, uint16_t *out,
                               int64_t N, int64_t ldo, int mode) {
    if (mode == MODE_SILU_MUL) { /* n0 = 32j: gate and up of outputs 16j .. 16j+15 */
        const int64_t j16 = n0 / 2;
        for (int r = 0; r < nrows; r++) {
            const __m512 g = round_bf16x16(tile_row(c, r, 0, bias ? bias + j16 : NULL, 0xffff));
            const __m512 u = round_bf16x16(tile_row(c, r, 1, bias ? bias + N / 2 + j16 : NULL, 0xffff));
            _mm256_storeu_si256((__m256i *)(out + r * ldo + j16), silu_mul_bf16x16(g, u));
        }
        return;
    }
    for (int r = 0; r < nrows; r++)
        for (int t = 0; t < 2; t++) {
            const int cols = ncols - 16 * t;
            if (cols <= 0) break;
            const __mmask16 mask = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
            const int64_t col = mode == MODE_PAIRS ? t * (N / 2) + n0 / 2 : n0 + 16 * t;
            const __m512 v = tile_row(c, r, t, bias ? bias + col : NULL, mask);
            _mm256_mask_storeu_epi16(out + r * ldo + col, mask, (__m256i)_mm512_cvtneps_pbh(v)); /* RNE */
        }
}

/* out[m0 .. m0+nrows) x [n0 .. n0+ncols): ncols <= 32, nrows <= 32. */
static inline void block_32x32(RowsView a, int nrows, int64_t KB, const uint16_t *packed, int64_t nb, const uint16_t *bias,
                               int64_t n0, int ncols, uint16_t *out, int64_t N, int64_t ldo, int mode, int stream,
                               float *c) {
    const uint16_t *b0 = packed + nb * KB * 512, *b1 = b0 + KB * 512;
    _tile_zero(0);
    _tile_zero(1);
    if (nrows > 16) {
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t kb = 0; kb < KB; kb++) {
        if (stream) {
            /* The weight streams from memory when a step's few rows read it all: ask for the tiles
               PREFETCH steps ahead (past this pair's end that is the next pair's, which follows it). */
            const char *ahead0 = (const char *)(b0 + (kb + PREFETCH) * 512);
            const char *ahead1 = (const char *)(b1 + (kb + PREFETCH) * 512);
            for (int line = 0; line < 1024; line += 64) {
                _mm_prefetch(ahead0 + line, _MM_HINT_T0);
                _mm_prefetch(ahead1 + line, _MM_HINT_T0);
            }
        }
        _tile_loadd(4, a.rows + 32 * kb, a.stride);
        _tile_loadd(6, b0 + kb * 512, 64);
        _tile_loadd(7, b1 + kb * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (nrows > 16) {
            _tile_loadd(5, (const uint8_t *)(a.rows + 32 * kb) + 16 * a.stride, a.stride);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, c, 64);
    _tile_stored(1, c + 256, 64);
    if (nrows > 16) {
        _tile_stored(2, c + 512, 64);
        _tile_stored(3, c + 768, 64);
    }
    store_block(c, nrows, ncols, bias, n0, out, N, ldo, mode);
}

/* out = x @ W^T + bias, [M, N] (MODE_PLAIN, MODE_PAIRS), or SiLU(gate) * up, [M, N/2] (MODE_SILU_MUL). */
int kvgate_amx_linear(const uint16_t *x, int64_t x_stride, int64_t M, int64_t K, const uint16_t *packed, int64_t N,
                      const uint16_t *bias, uint16_t *out, int mode, int num_threads) {
    if (!kvgate_amx_linear_available()) return -1;
    if (mode != MODE_PLAIN && N % 32) return -3; /* pairs need N/2 in whole 16-output blocks */
    const int64_t ldo = mode == MODE_SILU_MUL ? N / 2 : N;
    const int64_t KB = (K + 31) / 32, Kp = KB * 32;
    const int64_t MB = (M + 31) / 32, panel = MB >= 4 ? PANEL : SMALL_PANEL, NP = (N + panel - 1) / panel;
    /* Rows are read in place where a 32-row block is whole and K a multiple of 32; else copied, zero-padded. */
    const int ragged_k = Kp != K;
    int failed = 0;
#pragma omp parallel num_threads(num_threads)
    {
        float *c = aligned_alloc(64, sizeof(float) * 32 * 32);
        uint16_t *pad = aligned_alloc(64, sizeof(uint16_t) * 32 * Kp);
        if (!c || !pad) {
#pragma omp atomic write
            failed = 1;
        } else {
            amx_configure();
            /* Panel-major: a thread walks down the rows with one panel of the weight in its cache. */
#pragma omp for schedule(dynamic, 1)
            for (int64_t item = 0; item < NP * MB; item++) {
                const int64_t np = item / MB, mb = item % MB, m0 = 32 * mb;
                const int nrows = M - m0 < 32 ? (int)(M - m0) : 32;
                RowsView a = {x + m0 * x_stride, x_stride * 2};
                if (ragged_k || nrows < 32) {
                    memset(pad, 0, sizeof(uint16_t) * 32 * Kp);
                    for (int r = 0; r < nrows; r++) memcpy(pad + r * Kp, x + (m0 + r) * x_stride, sizeof(uint16_t) * K);
                    a = (RowsView){pad, Kp * 2};
                }
                for (int64_t n0 = np * panel; n0 < N && n0 < (np + 1) * panel; n0 += 32) {
                    const int ncols = N - n0 < 32 ? (int)(N - n0) : 32;
                    block_32x32(a, nrows, KB, packed, n0 / 16, bias, n0, ncols, out + m0 * ldo, N, ldo, mode, MB < 4, c);
                }
            }
            _tile_release();
        }
        free(c);
        free(pad);
    }
    return failed ? -2 : 0;
}
#else
int kvgate_amx_linear_available(void) { return 0; }
int kvgate_amx_linear(const uint16_t *x, int64_t x_stride, int64_t M, int64_t K, const uint16_t *packed, int64_t N,
                      const uint16_t *bias, uint16_t *out, int mode, int num_threads) {
    (void)x, (void)x_stride, (void)M, (void)K, (void)packed, (void)N, (void)bias, (void)out, (void)mode;
    (void)num_threads;
    return -1;
}
#endif
