/*
 * The row loops of fused_ops.c for one element type. Included once per type, with ELEM (the C
 * type) and SUFFIX (bf16 or f32) defined; load_SUFFIX, store_SUFFIX, round_to_SUFFIX and
 * silu_mul_row_SUFFIX must exist. Defines kvgate_<op>_SUFFIX for every op.
 */
#define KVGATE_CAT_(a, b) a##_##b
#define KVGATE_CAT(a, b) KVGATE_CAT_(a, b)
#define FN(name) KVGATE_CAT(name, SUFFIX)

/* o = w * T(x / sqrt(mean(x^2) + eps)) for one row, as transformers' RMSNorm rounds. */
static inline void FN(rmsnorm_row)(const ELEM *xr, const ELEM *w, ELEM *o, int64_t C, float eps) {
    float lanes[16] = {0};
    int64_t c = 0;
    for (; c + 16 <= C; c += 16)
        for (int l = 0; l < 16; l++) {
            const float v = FN(load)(xr + c + l);
            lanes[l] += v * v;
        }
    for (; c < C; c++) {
        const float v = FN(load)(xr + c);
        lanes[c % 16] += v * v;
    }
    for (int step = 8; step > 0; step /= 2)
        for (int l = 0; l < step; l++) lanes[l] += lanes[l + step];
    const float inv = 1.0f / sqrtf(lanes[0] / (float)C + eps);
    for (int64_t i = 0; i < C; i++) FN(store)(o + i, FN(load)(w + i) * FN(round_to)(FN(load)(xr + i) * inv));
}

/* out[t] = RMSNorm(x[t]) with weight w. */
void FN(kvgate_rmsnorm)(const ELEM *x, int64_t x_stride, const ELEM *w, ELEM *out, int64_t T, int64_t C, float eps,
                        int threads) {
#pragma omp parallel for num_threads(threads_for(T * C, threads)) schedule(static)
    for (int64_t t = 0; t < T; t++) FN(rmsnorm_row)(x + t * x_stride, w, out + t * C, C, eps);
}

/* The residual add and the next norm of a decoder layer in one pass: sum[t] = T(h[t] + d[t]) (torch's
 * add), out[t] = RMSNorm(sum[t]). h, d, sum and out are contiguous [T, C]; sum may be h. */
void FN(kvgate_add_rmsnorm)(const ELEM *h, const ELEM *d, const ELEM *w, ELEM *sum, ELEM *out, int64_t T, int64_t C,
                            float eps, int threads) {
#pragma omp parallel for num_threads(threads_for(T * C, threads)) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        ELEM *sr = sum + t * C;
        for (int64_t i = 0; i < C; i++) FN(store)(sr + i, FN(load)(h + t * C + i) + FN(load)(d + t * C + i));
        FN(rmsnorm_row)(sr, w, out + t * C, C, eps);
    }
}

/* out[t, i] = T(T(silu(g)) * u) with g = gu[t, i], u = gu[t, N + i]: SiLU(gate) * up, rounded as torch does. */
void FN(kvgate_silu_mul)(const ELEM *gu, int64_t gu_stride, ELEM *out, int64_t T, int64_t N, int threads) {
#pragma omp parallel for num_threads(threads_for(T * N, threads)) schedule(static)
    for (int64_t t = 0; t < T; t++) FN(silu_mul_row)(gu + t * gu_stride, gu + t * gu_stride + N, out + t * N, N);
}

/*
 * Rotary embeddings of the query and key heads of a fused q|k|v projection row:
 * x * cos + rotate_half(x) * sin, each product and the sum rounded to the type (torch's
 * expression exactly). q_out [T, H, D] is contiguous. The keys go to k_out [T, KVH, D]
 * (contiguous), or, with k_pool, straight into the KV pool: row t's rotated keys and its
 * values (the projection's last KVH heads) to slot slots[t] of k_pool and v_pool
 * ([slots, KVH, D] each), for t < written (a padded pass writes its real rows only).
 */
static inline void FN(rotate_head)(const ELEM *x, const ELEM *c, const ELEM *s, ELEM *o, int64_t D) {
    const int64_t half = D / 2;
    for (int64_t i = 0; i < D; i++) {
        const float rot = i < half ? -FN(load)(x + i + half) : FN(load)(x + i - half);
        const float a = FN(round_to)(FN(load)(x + i) * FN(load)(c + i));
        const float b = FN(round_to)(rot * FN(load)(s + i));
        FN(store)(o + i, a + b);
    }
}

void FN(kvgate_rotary)(const ELEM *qkv, int64_t qkv_stride, const ELEM *cos, const ELEM *sin, int64_t cs_stride,
                       ELEM *q_out, ELEM *k_out, int64_t T, int64_t H, int64_t KVH, int64_t D, int threads) {
#pragma omp parallel for num_threads(threads_for(T * (H + KVH) * D, threads)) schedule(static)
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H + KVH; h++)
            FN(rotate_head)(qkv + t * qkv_stride + h * D, cos + t * cs_stride, sin + t * cs_stride,
                            h < H ? q_out + (t * H + h) * D : k_out + (t * KVH + h - H) * D, D);
}

void FN(kvgate_rotary_to_pool)(const ELEM *qkv, int64_t qkv_stride, const ELEM *cos, const ELEM *sin,
                               int64_t cs_stride, ELEM *q_out, ELEM *k_pool, ELEM *v_pool, const int64_t *slots,
                               int64_t written, int64_t T, int64_t H, int64_t KVH, int64_t D, int threads) {
#pragma omp parallel for num_threads(threads_for(T * (H + KVH) * D, threads)) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const ELEM *row = qkv + t * qkv_stride, *c = cos + t * cs_stride, *s = sin + t * cs_stride;
        for (int64_t h = 0; h < H; h++) FN(rotate_head)(row + h * D, c, s, q_out + (t * H + h) * D, D);
        if (t >= written) continue;
        for (int64_t h = 0; h < KVH; h++)
            FN(rotate_head)(row + (H + h) * D, c, s, k_pool + (slots[t] * KVH + h) * D, D);
        memcpy(v_pool + slots[t] * KVH * D, row + (H + KVH) * D, sizeof(ELEM) * KVH * D);
    }
}

#undef FN
#undef KVGATE_CAT
#undef KVGATE_CAT_
