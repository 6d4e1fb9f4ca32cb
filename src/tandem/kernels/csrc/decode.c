/* The fused decoder: every transformer layer of a decode step in one call and one parallel region.
 *
 * At decode sizes (1-16 tokens) a layer's arithmetic takes tens of microseconds; run as separate
 * Python-dispatched ops (norm, 4 matmuls, RoPE, attention, SiLU, adds) each step paid more in
 * dispatch and thread wake-ups than in work. Here the threads stay in one OpenMP region for all
 * layers and meet at barriers: each quantized Linear's output blocks are split between them, each
 * thread quantizes the (few) input rows itself instead of waiting for one thread to do it, and
 * the residual adds ride on the matmuls' epilogues.
 *
 * Every piece is the function the unfused path calls (cpu_kernels.c's per-row bodies, the
 * attention work item, quant_linear.c's quantization and blocks), so a token gets the same bits
 * whichever path served its step (tests check this).
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* cpu_kernels.c */
int tandem_threads(void);
void tandem_scale_row(float *o, int64_t lo, int64_t hi, float s, const float *bias);
void tandem_rope_cache_token(float *row, const float *c, const float *s, int64_t position, int64_t slot, void *k_cache,
                             void *v_cache, int cache_bf16, int heads, int kv_heads, int head_dim, int64_t max_len,
                             int64_t num_blocks);
void tandem_rms_norm_row(float *xr, const float *res, const float *weight, float *o, int64_t width, float eps);
void tandem_silu_mul_row(const float *g, float *o, int64_t inter);
void *tandem_attend_scratch(void);
void tandem_attend(void *w, const float *q, int64_t q_token_stride, float *out, const void *k_cache,
                   const void *v_cache, int cache_bf16, int64_t row_offset, int64_t row_len, const int64_t *row_table,
                   int64_t row_start, int kvh, int heads, int kv_heads, int head_dim, int64_t block_size,
                   int64_t num_blocks, int64_t window, float scale);
/* quant_linear.c */
void tandem_int8_quantize(const float *x, int64_t x_stride, int64_t rows, int64_t K, int64_t k_pad, float a_inv,
                          int32_t zp, float *unit, float *scale, uint8_t *xq);
void tandem_int8_part(int64_t rows, const uint8_t *xq, int64_t k_pad, const int8_t *w, const int32_t *zp_col,
                      const float *combined, float *out, int64_t N, int64_t blk_lo, int64_t blk_hi, int32_t *raw);
void tandem_int4_quantize(const float *x, int64_t x_stride, int64_t rows, int64_t K, int64_t k_pad, int64_t group,
                          float *unit, float *scale, int8_t *xq, int32_t *gsum, float *factor);
void tandem_int4_part(int64_t rows, const int8_t *xq, const int32_t *gsum, const uint8_t *w, const uint16_t *scales,
                      const float *bias, int64_t N, int64_t K, int64_t k_pad, int64_t group, const float *factor,
                      float *out, int64_t blk_lo, int64_t blk_hi, float *acc);

enum { LINEAR_INT8 = 1, LINEAR_INT4 = 2 };

/* A quantized Linear as packed by tandem.kernels.quant_linear (ctypes mirror: kernels/decode.py). */
typedef struct {
    int64_t kind, n, k, k_pad, group;
    const void *weight;
    const void *scales;     /* int4: fp16 [N/16][K_pad/group][16] */
    const int32_t *zp_col;  /* int8: 128 * column sums */
    const float *combined;  /* int8: fbgemm's activation scale * w_scale */
    const float *bias;      /* or NULL */
} QLinear;

typedef struct {
    QLinear qkv, o, gate_up, down;
    const float *in_norm, *post_norm;
    void *k_cache, *v_cache;
} DecodeLayer;

typedef struct {
    int64_t n_layers, hidden, heads, kv_heads, head_dim, inter, block_size, num_blocks, window, cache_bf16, zp;
    double eps, a_inv, attn_scale;
    const DecodeLayer *layers;
} DecodeModel;

/* A thread's private buffers for `rows` rows (kept per thread, grown on demand). */
typedef struct {
    float *h, *r, *unit, *scale, *factor, *acc;
    uint8_t *xq;
    int32_t *gsum;
} Private;

static __thread void *tls_arena = NULL;
static __thread size_t tls_arena_size = 0;

static int private_buffers(Private *p, int64_t rows, int64_t hidden, int64_t widest, int64_t n_pad) {
    const int64_t k_max = widest + 256; /* K padded to a group or to 4 */
    const size_t floats = (size_t)(rows * (2 * hidden + k_max + n_pad) + 2 * rows);
    const size_t bytes = sizeof(float) * floats + (size_t)(rows * k_max) + sizeof(int32_t) * (size_t)(rows * k_max / 8) + 256;
    if (bytes > tls_arena_size) {
        free(tls_arena);
        tls_arena_size = bytes + bytes / 2;
        tls_arena = aligned_alloc(64, (tls_arena_size + 63) / 64 * 64);
        if (!tls_arena) {
            tls_arena_size = 0;
            return 1;
        }
    }
    float *f = (float *)tls_arena;
    p->h = f, f += rows * hidden;
    p->r = f, f += rows * hidden;
    p->unit = f, f += rows * k_max;
    p->acc = f, f += rows * n_pad;
    p->scale = f, f += rows;
    p->factor = f, f += rows;
    p->xq = (uint8_t *)f;
    p->gsum = (int32_t *)(p->xq + (rows * k_max + 63) / 64 * 64);
    return 0;
}

/* Output blocks (16 channels each) per work chunk of linear_share, of `blocks`: threads take chunks
 * as they free up (a thread slowed by a neighbour on the host, or by its share of attention, no
 * longer holds the other at the barrier), each chunk a run of the weights long enough for the
 * hardware prefetcher (about 8 chunks a thread), an even count (the pairs the kernels compute
 * together). */
static int64_t chunk_blocks(int64_t blocks) {
    const int64_t c = blocks / (8 * omp_get_num_threads()) / 2 * 2;
    return c > 4 ? c : 4;
}

/* This thread's part of out = x @ W^T (+ bias) for `rows` rows of x (contiguous, L->k wide); out
 * has L->n columns. With residual, out += residual on the same columns (the stream's add). Every
 * thread of the team calls it (a worksharing loop inside, no barrier at its end). A chunk's
 * columns get the same bits whichever thread computes them. */
static void linear_share(const DecodeModel *m, const QLinear *L, const float *x, int64_t rows, float *out,
                         const float *residual, Private *p) {
    if (L->kind == LINEAR_INT8)
        tandem_int8_quantize(x, L->k, rows, L->k, L->k_pad, (float)m->a_inv, (int32_t)m->zp, p->unit, p->scale, p->xq);
    else
        tandem_int4_quantize(x, L->k, rows, L->k, L->k_pad, L->group, p->unit, p->scale, (int8_t *)p->xq, p->gsum,
                             p->factor);
    const int64_t blocks = (L->n + 15) / 16, chunk = chunk_blocks(blocks);
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t lo = 0; lo < blocks; lo += chunk) {
        const int64_t hi = lo + chunk < blocks ? lo + chunk : blocks;
        if (L->kind == LINEAR_INT8)
            tandem_int8_part(rows, p->xq, L->k_pad, (const int8_t *)L->weight, L->zp_col, L->combined, out, L->n, lo,
                             hi, (int32_t *)p->acc);
        else
            tandem_int4_part(rows, (const int8_t *)p->xq, p->gsum, (const uint8_t *)L->weight,
                             (const uint16_t *)L->scales, L->bias, L->n, L->k, L->k_pad, L->group, p->factor, out, lo,
                             hi, p->acc);
        const int64_t c_lo = lo * 16, c_hi = hi * 16 < L->n ? hi * 16 : L->n;
        for (int64_t r = 0; r < rows; r++) {
            float *o = out + r * L->n;
            if (L->kind == LINEAR_INT8) tandem_scale_row(o, c_lo, c_hi, p->scale[r], L->bias);
            if (residual)
                for (int64_t c = c_lo; c < c_hi; c++) o[c] = o[c] + residual[r * L->n + c];
        }
    }
}

/* x: [n, hidden] float32 hidden states of the step's n new tokens, updated in place through every
 * layer. cos/sin: [n, head_dim] rotary rows; blocks/offsets: [n] each token's place in the paged
 * cache. Rows (attention): num_rows rows, row r's row_lens[r] tokens at x[row_offsets[r]..],
 * positions row_starts[r].. of the sequence whose block table is tables[r * table_stride..].
 * Returns 0, or 1 when a buffer could not be allocated. */
int tandem_decode_layers(const DecodeModel *m, float *x, int64_t n, const float *cos, const float *sin,
                         const int64_t *offsets, const int64_t *blocks, int64_t num_rows, const int64_t *row_offsets,
                         const int64_t *row_lens, const int64_t *row_starts, const int64_t *tables,
                         int64_t table_stride) {
    const int64_t H = m->hidden, I = m->inter, hd = m->head_dim, Q = m->heads * hd, KV = m->kv_heads * hd;
    const int64_t QKV = Q + 2 * KV;
    int64_t widest = H > Q ? H : Q, n_pad = QKV > 2 * I ? QKV : 2 * I;
    widest = widest > I ? widest : I;
    n_pad = (n_pad > H ? n_pad : H) + 16;
    /* Shared: the q|k|v projection, attention output, o projection, gate|up projection, its SwiGLU. */
    float *shared = (float *)malloc(sizeof(float) * (size_t)(n * (QKV + Q + H + 3 * I)));
    if (!shared) return 1;
    float *qkv = shared, *att = qkv + n * QKV, *o = att + n * Q, *gu = o + n * H, *act = gu + n * 2 * I;
    int failed = 0;
#pragma omp parallel num_threads(tandem_threads())
    {
        Private p;
        void *scratch = tandem_attend_scratch();
        const int mine_failed = private_buffers(&p, n, H, widest, n_pad) || !scratch;
        if (mine_failed) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        for (int64_t l = 0; l < m->n_layers && !failed; l++) {
            const DecodeLayer *L = m->layers + l;
            /* input norm (each thread its own copy: no wait), then q|k|v */
            for (int64_t r = 0; r < n; r++)
                tandem_rms_norm_row(x + r * H, NULL, L->in_norm, p.h + r * H, H, (float)m->eps);
            linear_share(m, &L->qkv, p.h, n, qkv, NULL, &p);
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t i = 0; i < n; i++)
                tandem_rope_cache_token(qkv + i * QKV, cos + i * hd, sin + i * hd, offsets[i], blocks[i], L->k_cache,
                                        L->v_cache, (int)m->cache_bf16, (int)m->heads, (int)m->kv_heads, (int)hd,
                                        m->block_size, m->num_blocks);
#pragma omp for schedule(dynamic, 1)
            for (int64_t item = 0; item < num_rows * m->kv_heads; item++) {
                const int64_t r = item / m->kv_heads;
                tandem_attend(scratch, qkv, QKV, att, L->k_cache, L->v_cache, (int)m->cache_bf16, row_offsets[r],
                              row_lens[r], tables + r * table_stride, row_starts[r], (int)(item % m->kv_heads),
                              (int)m->heads, (int)m->kv_heads, (int)hd, m->block_size, m->num_blocks, m->window,
                              (float)m->attn_scale);
            }
            linear_share(m, &L->o, att, n, o, NULL, &p);
#pragma omp barrier
            /* r = o + x (the residual stream), h = norm(r): each thread its own copy */
            memcpy(p.r, o, sizeof(float) * (size_t)(n * H));
            for (int64_t r = 0; r < n; r++)
                tandem_rms_norm_row(p.r + r * H, x + r * H, L->post_norm, p.h + r * H, H, (float)m->eps);
            linear_share(m, &L->gate_up, p.h, n, gu, NULL, &p);
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t r = 0; r < n; r++) tandem_silu_mul_row(gu + r * 2 * I, act + r * I, I);
            /* x = down(act) + r: every reader of x in this layer is past the barriers above */
            linear_share(m, &L->down, act, n, x, p.r, &p);
#pragma omp barrier
        }
    }
    free(shared);
    return failed;
}
