/* tandem's CPU kernels: plain C + OpenMP, loaded through ctypes (tandem/kernels/build.py).
 *
 * No torch headers: tensors arrive as data pointers with their strides, so this file compiles in
 * about a second and links against the OpenMP runtime torch already loaded (same soname, same
 * thread pool: no second set of spinning threads).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_AVX512 1
#else
#define HAVE_AVX512 0
#endif
#if !HAVE_AVX512 && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_AVX2 1 /* AVX2 + FMA without AVX-512 (e.g. AMD Zen 1/2): 8-lane attention */
#else
#define HAVE_AVX2 0
#endif

#define TILE 64    /* keys per online-softmax tile: scores and converted keys stay in L1/L2 */
#define QMAX 64    /* queries per (row, kv head) block; more are processed in blocks */
#define DMAX 256   /* largest head_dim supported */
/* Masked scores: finite, so -ffast-math (which assumes no infinities) stays correct. */
#define MASKED (-1e30f)

/* Threads for every parallel region: torch's intra-op count, set from Python (tandem_set_threads).
 * A bare `omp parallel` would use the calling thread's OpenMP default instead, and an engine
 * stepping in a Python thread (AsyncEngine) would then ignore --threads and oversubscribe cores
 * shared with other replicas. */
static int g_threads = 1;

void tandem_set_threads(int n) { g_threads = n > 0 ? n : 1; }

int tandem_threads(void) { return g_threads; }

/* How many threads a parallel region gets now (for tests). */
int tandem_parallel_width(void) {
    int width = 1;
#pragma omp parallel num_threads(g_threads)
    {
#pragma omp single
        width = omp_get_num_threads();
    }
    return width;
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Keys or values j0.. of one kv head as a float tile [nk][d]: the cache itself (fp32), or a copy
 * converted once per tile (bf16), so every query of the item reads plain floats. */
static inline const float *tile_rows(const void *base, int bf16, int64_t index, int64_t n, float *buf) {
    if (!bf16) return (const float *)base + index;
    const uint16_t *src = (const uint16_t *)base + index;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) buf[i] = bf16_to_float(src[i]);
    return buf;
}

/* Per-thread scratch of one attention work item. */
typedef struct {
    float qs[QMAX * DMAX], acc[QMAX * DMAX], scores[QMAX][TILE];
    float ktile[TILE * DMAX], vtile[TILE * DMAX];
    float row_max[QMAX], row_sum[QMAX], lane_sum[QMAX][16];
    int64_t qpos[QMAX], qlo[QMAX];
} AttendScratch;

/* Each OpenMP pool thread's scratch, allocated once (the pool lives as long as the process): no
 * allocation (and no page faults on fresh pages) per call. */
static __thread AttendScratch *tls_attend = NULL;

AttendScratch *tandem_attend_scratch(void) {
    if (!tls_attend) tls_attend = (AttendScratch *)aligned_alloc(64, sizeof(AttendScratch));
    return tls_attend;
}

/* Where key j of a row sits in a paged cache, head-major ([kv_heads, num_blocks, block_size, d]):
 * kv head kvh's copy of block row_table[j / block_size], at offset j % block_size. Head-major, so a
 * sequence's blocks taken in order from the pool are one stream per kv head (4 KB runs 48 KB apart
 * with the blocks outermost: 26% slower on a 1536-key decode row, fp32, AVX2). */
static inline int64_t block_base(const int64_t *row_table, int64_t j, int64_t block_size, int64_t num_blocks, int kvh,
                                 int d) {
    return (((int64_t)kvh * num_blocks + row_table[j / block_size]) * block_size + j % block_size) * d;
}

/* A block of nq queries of one (row, kv head) item, from query q0 on, ordered token-major (t, g):
 * scaled into w->qs, with their positions, window starts and zeroed softmax state; the keys they
 * read together are [*key_lo, *key_hi). Shared by every attend_item variant. */
static inline __attribute__((always_inline)) void load_queries(const int d, AttendScratch *w, const float *q,
                                                               int64_t q_token_stride, int64_t row_offset,
                                                               int64_t row_start, int kvh, int group, int64_t q0,
                                                               int nq, int64_t window, float scale, int64_t *key_lo,
                                                               int64_t *key_hi) {
    *key_hi = 0;
    *key_lo = INT64_MAX;
    for (int i = 0; i < nq; i++) {
        const int64_t t = (q0 + i) / group, g = (q0 + i) % group;
        const float *src = q + (row_offset + t) * q_token_stride + (kvh * group + g) * d;
        float *qi = w->qs + i * d;
#pragma omp simd
        for (int k = 0; k < d; k++) qi[k] = src[k] * scale;
        w->qpos[i] = row_start + t;
        w->qlo[i] = window > 0 && w->qpos[i] - window + 1 > 0 ? w->qpos[i] - window + 1 : 0;
        if (w->qpos[i] + 1 > *key_hi) *key_hi = w->qpos[i] + 1;
        if (w->qlo[i] < *key_lo) *key_lo = w->qlo[i];
        w->row_max[i] = MASKED;
        w->row_sum[i] = 0.0f;
        memset(w->lane_sum[i], 0, sizeof w->lane_sum[i]);
        memset(w->acc + i * d, 0, sizeof(float) * d);
    }
}

/* One (row, kv head) item. Inlined into callers with a constant head_dim, so the per-query
 * accumulators (head_dim floats) stay in vector registers across a tile's keys. */
static inline __attribute__((always_inline)) void attend_item(
    const int d, AttendScratch *w, const float *q, int64_t q_token_stride, float *out, const void *k_cache,
    const void *v_cache, int cache_bf16, int64_t row_offset, int64_t row_len, const int64_t *row_table,
    int64_t row_start, int kvh, int heads, int kv_heads, int64_t block_size, int64_t num_blocks, int64_t window,
    float scale) {
    const int group = heads / kv_heads;
    const int64_t num_queries = row_len * group;
    for (int64_t q0 = 0; q0 < num_queries; q0 += QMAX) {
        const int nq = (int)(num_queries - q0 < QMAX ? num_queries - q0 : QMAX);
        int64_t key_hi, key_lo;
        load_queries(d, w, q, q_token_stride, row_offset, row_start, kvh, group, q0, nq, window, scale, &key_lo, &key_hi);
        for (int64_t j0 = key_lo, nk; j0 < key_hi; j0 += nk) {
            /* a tile never crosses a block: its keys are contiguous in the cache */
            const int64_t in_block = block_size - j0 % block_size;
            nk = key_hi - j0 < TILE ? key_hi - j0 : TILE;
            nk = nk < in_block ? nk : in_block;
            const int64_t base = block_base(row_table, j0, block_size, num_blocks, kvh, d);
            const float *kt = tile_rows(k_cache, cache_bf16, base, nk * d, w->ktile);
            for (int i = 0; i < nq; i++) {
                const float *qi = w->qs + i * d;
                for (int j = 0; j < nk; j++) {
                    const float *kr = kt + j * d;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int k = 0; k < d; k++) dot += qi[k] * kr[k];
                    const int64_t key = j0 + j;
                    w->scores[i][j] = (key > w->qpos[i] || key < w->qlo[i]) ? MASKED : dot;
                }
            }
            for (int i = 0; i < nq; i++) {
                float *sc = w->scores[i];
                float tile_max = MASKED;
                for (int j = 0; j < nk; j++) tile_max = sc[j] > tile_max ? sc[j] : tile_max;
                if (tile_max <= MASKED) { /* every key of this tile masked for query i */
                    memset(sc, 0, sizeof(float) * nk);
                    continue;
                }
                const float new_max = tile_max > w->row_max[i] ? tile_max : w->row_max[i];
                const float correction = expf(w->row_max[i] - new_max);
                float tile_sum = 0.0f;
#pragma omp simd reduction(+ : tile_sum)
                for (int j = 0; j < nk; j++) {
                    const float p = expf(sc[j] - new_max);
                    sc[j] = p;
                    tile_sum += p;
                }
                w->row_sum[i] = w->row_sum[i] * correction + tile_sum;
                w->row_max[i] = new_max;
                if (correction != 1.0f) {
                    float *ai = w->acc + i * d;
#pragma omp simd
                    for (int k = 0; k < d; k++) ai[k] *= correction;
                }
            }
            const float *vt = tile_rows(v_cache, cache_bf16, base, nk * d, w->vtile);
            for (int i = 0; i < nq; i++) {
                float a[DMAX];
                float *ai = w->acc + i * d;
                const float *sc = w->scores[i];
#pragma omp simd
                for (int k = 0; k < d; k++) a[k] = ai[k];
                for (int j = 0; j < nk; j++) {
                    const float p = sc[j];
                    const float *vr = vt + j * d;
#pragma omp simd
                    for (int k = 0; k < d; k++) a[k] += p * vr[k];
                }
#pragma omp simd
                for (int k = 0; k < d; k++) ai[k] = a[k];
            }
        }
        for (int i = 0; i < nq; i++) {
            const int64_t t = (q0 + i) / group, g = (q0 + i) % group;
            float *dst = out + ((row_offset + t) * heads + kvh * group + g) * d;
            const float inv = w->row_sum[i] > 0.0f ? 1.0f / w->row_sum[i] : 0.0f;
            const float *ai = w->acc + i * d;
#pragma omp simd
            for (int k = 0; k < d; k++) dst[k] = ai[k] * inv;
        }
    }
}

#if HAVE_AVX512
/* 16 keys' dot products at once: v[j] holds key j's 16 partial sums; returns the 16 totals, key j
 * in lane j. A transpose folded into the additions (45 shuffles and adds for 16 keys, instead of a
 * horizontal sum per key). */
static inline __attribute__((always_inline)) __m512 sum16x16(const __m512 *v) {
    __m512 s[8], t[4];
    for (int i = 0; i < 8; i++) /* per 128-bit lane: a0+a2, b0+b2, a1+a3, b1+b3 */
        s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* per lane: the lane's sums of keys 4i .. 4i + 3 */
        t[i] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * i], s[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(s[2 * i], s[2 * i + 1], 0xEE));
    const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(t[0], t[1], 0x88), _mm512_shuffle_f32x4(t[0], t[1], 0xDD));
    const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(t[2], t[3], 0x88), _mm512_shuffle_f32x4(t[2], t[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
}

/* 16 cached values as floats: fp32 as is, bf16 widened (exact: a shift). */
static inline __attribute__((always_inline)) __m512 load16(const void *base, const int bf16, int64_t index) {
    if (!bf16) return _mm512_loadu_ps((const float *)base + index);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + index));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* attend_item, register-blocked: keys in blocks of 16, their 16 scores in one vector (no
 * horizontal sum per q.k), the softmax on that vector, and each query's output accumulator
 * (head_dim floats) in registers across the block. bf16 caches are widened as they load, so a
 * bf16 cache reads half the bytes and costs no extra pass. d: a multiple of 16. */
static inline __attribute__((always_inline)) void attend_item_v(
    const int d, const int bf16, AttendScratch *w, const float *q, int64_t q_token_stride, float *out,
    const void *k_cache, const void *v_cache, int64_t row_offset, int64_t row_len, const int64_t *row_table,
    int64_t row_start, int kvh, int heads, int kv_heads, int64_t block_size, int64_t num_blocks, int64_t window,
    float scale) {
    const int group = heads / kv_heads, dv = d / 16;
    const int64_t num_queries = row_len * group;
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t q0 = 0; q0 < num_queries; q0 += QMAX) {
        const int nq = (int)(num_queries - q0 < QMAX ? num_queries - q0 : QMAX);
        int64_t key_hi, key_lo;
        load_queries(d, w, q, q_token_stride, row_offset, row_start, kvh, group, q0, nq, window, scale, &key_lo, &key_hi);
        /* blocks of 16 keys from a multiple of 16: each lies in one cache block (block_size is a
         * multiple of 16); keys before the window's start are masked like those past the query */
        for (int64_t j0 = key_lo - key_lo % 16; j0 < key_hi; j0 += 16) {
            const int nk = (int)(key_hi - j0 < 16 ? key_hi - j0 : 16);
            const int64_t kbase = block_base(row_table, j0, block_size, num_blocks, kvh, d);
            const __m512i keys = _mm512_add_epi32(_mm512_set1_epi32((int)j0), iota);
            for (int i = 0; i < nq; i++) {
                if (j0 > w->qpos[i] || j0 + nk <= w->qlo[i]) continue; /* no key of the block for it */
                const float *qi = w->qs + i * d;
                __m512 prod[16];
                for (int j = 0; j < 16; j++) {
                    __m512 acc = _mm512_setzero_ps();
                    if (j < nk)
                        for (int c = 0; c < dv; c++)
                            acc = _mm512_fmadd_ps(_mm512_loadu_ps(qi + 16 * c), load16(k_cache, bf16, kbase + j * d + 16 * c), acc);
                    prod[j] = acc;
                }
                const __mmask16 valid = _mm512_cmple_epi32_mask(keys, _mm512_set1_epi32((int)w->qpos[i])) &
                                        _mm512_cmpge_epi32_mask(keys, _mm512_set1_epi32((int)w->qlo[i])) &
                                        (__mmask16)((1u << nk) - 1u);
                const __m512 sc = _mm512_mask_blend_ps(valid, _mm512_set1_ps(MASKED), sum16x16(prod));
                const float block_max = _mm512_reduce_max_ps(sc);
                const float new_max = block_max > w->row_max[i] ? block_max : w->row_max[i];
                const float correction = expf(w->row_max[i] - new_max);
                float p[16];
                _mm512_storeu_ps(p, _mm512_sub_ps(sc, _mm512_set1_ps(new_max)));
#pragma omp simd
                for (int j = 0; j < 16; j++) p[j] = expf(p[j]);
                const __m512 pv = _mm512_maskz_mov_ps(valid, _mm512_loadu_ps(p));
                _mm512_storeu_ps(p, pv);
                const __m512 corr = _mm512_set1_ps(correction);
                _mm512_storeu_ps(w->lane_sum[i], _mm512_fmadd_ps(_mm512_loadu_ps(w->lane_sum[i]), corr, pv));
                w->row_max[i] = new_max;
                float *ai = w->acc + i * d;
                __m512 a[DMAX / 16];
                for (int c = 0; c < dv; c++) a[c] = _mm512_mul_ps(_mm512_loadu_ps(ai + 16 * c), corr);
                for (int j = 0; j < nk; j++) {
                    const __m512 pj = _mm512_set1_ps(p[j]);
                    for (int c = 0; c < dv; c++)
                        a[c] = _mm512_fmadd_ps(pj, load16(v_cache, bf16, kbase + j * d + 16 * c), a[c]);
                }
                for (int c = 0; c < dv; c++) _mm512_storeu_ps(ai + 16 * c, a[c]);
            }
        }
        for (int i = 0; i < nq; i++) {
            const int64_t t = (q0 + i) / group, g = (q0 + i) % group;
            float *dst = out + ((row_offset + t) * heads + kvh * group + g) * d;
            const float sum = _mm512_reduce_add_ps(_mm512_loadu_ps(w->lane_sum[i]));
            const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
            const float *ai = w->acc + i * d;
            for (int k = 0; k < d; k++) dst[k] = ai[k] * inv;
        }
    }
}
#endif

#if HAVE_AVX2
/* 8 keys' dot products at once: v[j] holds key j's 8 partial sums; returns the 8 totals, key j in
 * lane j (two rounds of pairwise horizontal adds, then the two 128-bit halves added). */
static inline __attribute__((always_inline)) __m256 sum8x8(const __m256 *v) {
    const __m256 s0 = _mm256_hadd_ps(v[0], v[1]), s1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 s2 = _mm256_hadd_ps(v[4], v[5]), s3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 t0 = _mm256_hadd_ps(s0, s1), t1 = _mm256_hadd_ps(s2, s3);
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

/* 8 cached values as floats: fp32 as is, bf16 widened (exact: a shift). */
static inline __attribute__((always_inline)) __m256 load8(const void *base, const int bf16, int64_t index) {
    if (!bf16) return _mm256_loadu_ps((const float *)base + index);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + index));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline float hsum8(__m256 v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* attend_item_v on 8-lane AVX2 + FMA: blocks of 16 keys (two halves of 8, so a block lies in one
 * cache block as on AVX-512), each half's 8 scores in one vector (no horizontal sum per q.k), the
 * softmax once per block, each query's output accumulator (head_dim floats) in registers across
 * the block. bf16 caches are widened as they load. d: a multiple of 8. */
static inline __attribute__((always_inline)) void attend_item_v8(
    const int d, const int bf16, AttendScratch *w, const float *q, int64_t q_token_stride, float *out,
    const void *k_cache, const void *v_cache, int64_t row_offset, int64_t row_len, const int64_t *row_table,
    int64_t row_start, int kvh, int heads, int kv_heads, int64_t block_size, int64_t num_blocks, int64_t window,
    float scale) {
    const int group = heads / kv_heads, dv = d / 8;
    const int64_t num_queries = row_len * group;
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t q0 = 0; q0 < num_queries; q0 += QMAX) {
        const int nq = (int)(num_queries - q0 < QMAX ? num_queries - q0 : QMAX);
        int64_t key_hi, key_lo;
        load_queries(d, w, q, q_token_stride, row_offset, row_start, kvh, group, q0, nq, window, scale, &key_lo, &key_hi);
        for (int64_t j0 = key_lo - key_lo % 16; j0 < key_hi; j0 += 16) {
            const int nk = (int)(key_hi - j0 < 16 ? key_hi - j0 : 16);
            const int64_t kbase = block_base(row_table, j0, block_size, num_blocks, kvh, d);
            if (j0 + 16 < key_hi) {
                /* the next 16 keys: where a sequence's blocks are not adjacent in the pool, fetch them
                 * now (the hardware prefetcher follows one stream, not a jump to another block) */
                const int64_t next = block_base(row_table, j0 + 16, block_size, num_blocks, kvh, d);
                if (next != kbase + 16 * d) {
                    const int64_t bytes = 16 * d * (bf16 ? 2 : 4);
                    const char *kn = (const char *)k_cache + next * (bf16 ? 2 : 4);
                    const char *vn = (const char *)v_cache + next * (bf16 ? 2 : 4);
                    for (int64_t b = 0; b < bytes; b += 64) {
                        _mm_prefetch(kn + b, _MM_HINT_T0);
                        _mm_prefetch(vn + b, _MM_HINT_T0);
                    }
                }
            }
            for (int i = 0; i < nq; i++) {
                if (j0 > w->qpos[i] || j0 + nk <= w->qlo[i]) continue; /* no key of the block for it */
                const float *qi = w->qs + i * d;
                const __m256i hi_ok = _mm256_set1_epi32((int)(w->qpos[i] - j0)); /* key offsets <= this */
                const __m256i lo_ok = _mm256_set1_epi32((int)(w->qlo[i] - j0)); /* and >= this */
                const __m256i n_ok = _mm256_set1_epi32(nk);                      /* and < this */
                __m256 sc[2];
                for (int half = 0; half < 2; half++) {
                    __m256 prod[8];
                    for (int j = 0; j < 8; j++) {
                        __m256 acc = _mm256_setzero_ps();
                        if (8 * half + j < nk)
                            for (int c = 0; c < dv; c++)
                                acc = _mm256_fmadd_ps(_mm256_loadu_ps(qi + 8 * c),
                                                      load8(k_cache, bf16, kbase + (8 * half + j) * d + 8 * c), acc);
                        prod[j] = acc;
                    }
                    const __m256i at = _mm256_add_epi32(iota, _mm256_set1_epi32(8 * half));
                    const __m256i bad = _mm256_or_si256(
                        _mm256_or_si256(_mm256_cmpgt_epi32(at, hi_ok), _mm256_cmpgt_epi32(lo_ok, at)),
                        _mm256_cmpgt_epi32(_mm256_add_epi32(at, _mm256_set1_epi32(1)), n_ok));
                    sc[half] = _mm256_blendv_ps(sum8x8(prod), _mm256_set1_ps(MASKED), _mm256_castsi256_ps(bad));
                }
                const float block_max = hmax8(_mm256_max_ps(sc[0], sc[1]));
                const float new_max = block_max > w->row_max[i] ? block_max : w->row_max[i];
                const float correction = expf(w->row_max[i] - new_max);
                float p[16];
                _mm256_storeu_ps(p, _mm256_sub_ps(sc[0], _mm256_set1_ps(new_max)));
                _mm256_storeu_ps(p + 8, _mm256_sub_ps(sc[1], _mm256_set1_ps(new_max)));
#pragma omp simd
                for (int j = 0; j < 16; j++) p[j] = p[j] < -80.0f ? 0.0f : expf(p[j]); /* masked: exactly 0 */
                const __m256 corr = _mm256_set1_ps(correction);
                const __m256 p0 = _mm256_loadu_ps(p), p1 = _mm256_loadu_ps(p + 8);
                _mm256_storeu_ps(w->lane_sum[i], _mm256_fmadd_ps(_mm256_loadu_ps(w->lane_sum[i]), corr, p0));
                _mm256_storeu_ps(w->lane_sum[i] + 8, _mm256_fmadd_ps(_mm256_loadu_ps(w->lane_sum[i] + 8), corr, p1));
                w->row_max[i] = new_max;
                float *ai = w->acc + i * d;
                __m256 a[DMAX / 8];
                for (int c = 0; c < dv; c++) a[c] = _mm256_mul_ps(_mm256_loadu_ps(ai + 8 * c), corr);
                for (int j = 0; j < nk; j++) {
                    const __m256 pj = _mm256_set1_ps(p[j]);
                    for (int c = 0; c < dv; c++) a[c] = _mm256_fmadd_ps(pj, load8(v_cache, bf16, kbase + j * d + 8 * c), a[c]);
                }
                for (int c = 0; c < dv; c++) _mm256_storeu_ps(ai + 8 * c, a[c]);
            }
        }
        for (int i = 0; i < nq; i++) {
            const int64_t t = (q0 + i) / group, g = (q0 + i) % group;
            float *dst = out + ((row_offset + t) * heads + kvh * group + g) * d;
            const float sum = hsum8(_mm256_add_ps(_mm256_loadu_ps(w->lane_sum[i]), _mm256_loadu_ps(w->lane_sum[i] + 8)));
            const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
            const float *ai = w->acc + i * d;
            for (int k = 0; k < d; k++) dst[k] = ai[k] * inv;
        }
    }
}
#endif

/* One (row, kv head) work item of tandem_varlen_attention, on the fastest code for its shape. */
__attribute__((noinline)) void tandem_attend(AttendScratch *w, const float *q, int64_t q_token_stride, float *out, const void *k_cache,
                   const void *v_cache, int cache_bf16, int64_t row_offset, int64_t row_len, const int64_t *row_table,
                   int64_t row_start, int kvh, int heads, int kv_heads, int head_dim, int64_t block_size,
                   int64_t num_blocks, int64_t window, float scale) {
#define ARGS q, q_token_stride, out, k_cache, v_cache, row_offset, row_len, row_table, row_start, kvh, heads, kv_heads, \
             block_size, num_blocks, window, scale
/* A vector variant, with head_dim (and the cache's dtype) constant where it is common, so the
 * per-query accumulators stay in registers. */
#define VECTOR_ITEM(fn)                                                                      \
    do {                                                                                     \
        if (head_dim == 64)                                                                  \
            cache_bf16 ? fn(64, 1, w, ARGS) : fn(64, 0, w, ARGS);                            \
        else if (head_dim == 128)                                                            \
            cache_bf16 ? fn(128, 1, w, ARGS) : fn(128, 0, w, ARGS);                          \
        else                                                                                 \
            cache_bf16 ? fn(head_dim, 1, w, ARGS) : fn(head_dim, 0, w, ARGS);                \
        return;                                                                              \
    } while (0)
#if HAVE_AVX512
    if (head_dim % 16 == 0 && block_size % 16 == 0) VECTOR_ITEM(attend_item_v);
#endif
#if HAVE_AVX2
    if (head_dim % 8 == 0 && block_size % 16 == 0) VECTOR_ITEM(attend_item_v8);
#endif
#undef VECTOR_ITEM
#undef ARGS
    attend_item(head_dim, w, q, q_token_stride, out, k_cache, v_cache, cache_bf16, row_offset, row_len, row_table,
                row_start, kvh, heads, kv_heads, block_size, num_blocks, window, scale);
}

/* Attention of new query tokens over a paged KV cache, each row reading only its own keys (varlen).
 *
 * Row r has row_lens[r] new tokens at flat indices row_offsets[r].. (queries q[n, h, :] with
 * q_token_stride floats between tokens and head_dim between heads), sitting at positions
 * row_starts[r].. of its sequence; its keys and values are already in the cache ([kv_heads,
 * num_blocks, block_size, head_dim], fp32 or bf16), position p in block tables[r * table_stride +
 * p / block_size] at offset p % block_size. Token t attends causally to keys
 * [lo, row_starts[r] + t], lo = 0 or the sliding window's start. Query head h reads kv head
 * h / (heads / kv_heads). Output: out[n, h, :] contiguous, fp32.
 *
 * One work item per (row, kv head): its keys are read once for all of its query heads and
 * tokens (GQA without expanding keys), with an online softmax over tiles of keys. Returns 0,
 * or 1 when a thread's scratch could not be allocated.
 */
int tandem_varlen_attention(const float *q, int64_t q_token_stride, float *out, const void *k_cache,
                            const void *v_cache, int cache_bf16, int64_t num_rows, const int64_t *row_offsets,
                            const int64_t *row_lens, const int64_t *row_starts, const int64_t *tables,
                            int64_t table_stride, int heads, int kv_heads, int head_dim, int64_t block_size,
                            int64_t num_blocks, int64_t window, float scale) {
    int failed = 0;
#pragma omp parallel num_threads(g_threads)
    {
        AttendScratch *w = tandem_attend_scratch();
        if (!w) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_rows * kv_heads; item++) {
            if (!w) continue;
            const int64_t r = item / kv_heads;
            tandem_attend(w, q, q_token_stride, out, k_cache, v_cache, cache_bf16, row_offsets[r], row_lens[r],
                          tables + r * table_stride, row_starts[r], (int)(item % kv_heads), heads, kv_heads, head_dim,
                          block_size, num_blocks, window, scale);
        }
    }
    return failed;
}

/* The per-row bodies below are shared by the exported wrappers and the fused decoder (decode.c),
 * and never inlined: with -ffast-math a copy inlined elsewhere could be vectorised differently and
 * round differently, and a row must give the same bits whichever path serves it. */
#define ROW_FN __attribute__((noinline))

/* One row divided by its max |x| into o; returns the max (at least 1e-30). */
ROW_FN float tandem_row_to_unit(const float *src, int64_t width, float *o) {
    float m = 0.0f;
#pragma omp simd reduction(max : m)
    for (int64_t k = 0; k < width; k++) m = fabsf(src[k]) > m ? fabsf(src[k]) : m;
    m = m > 1e-30f ? m : 1e-30f;
    const float inv = 1.0f / m;
#pragma omp simd
    for (int64_t k = 0; k < width; k++) o[k] = src[k] * inv;
    return m;
}

/* o[k] = o[k] * s (+ bias[k]) for k in [lo, hi). */
ROW_FN void tandem_scale_row(float *o, int64_t lo, int64_t hi, float s, const float *bias) {
    if (bias) {
#pragma omp simd
        for (int64_t k = lo; k < hi; k++) o[k] = o[k] * s + bias[k];
    } else {
#pragma omp simd
        for (int64_t k = lo; k < hi; k++) o[k] *= s;
    }
}

/* int8 activation prep: each row of x ([rows, width], x_stride floats apart) divided by its
 * max |x| into dst ([rows, width], contiguous); the max goes to scale[r] (at least 1e-30). */
void tandem_rows_to_unit(const float *x, int64_t x_stride, int64_t rows, int64_t width, float *dst, float *scale) {
#pragma omp parallel for schedule(static) num_threads(g_threads) if (rows * width >= 65536)
    for (int64_t r = 0; r < rows; r++) scale[r] = tandem_row_to_unit(x + r * x_stride, width, dst + r * width);
}

/* y[r, :] = y[r, :] * scale[r] (+ bias), in place; y is [rows, width] contiguous. */
void tandem_scale_rows(float *y, int64_t rows, int64_t width, const float *scale, const float *bias) {
#pragma omp parallel for schedule(static) num_threads(g_threads) if (rows * width >= 65536)
    for (int64_t r = 0; r < rows; r++) tandem_scale_row(y + r * width, 0, width, scale[r], bias);
}

/* float -> bfloat16, round to nearest even (as torch's .to(torch.bfloat16)); NaN stays NaN. */
static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* One token of tandem_rope_and_cache: rotate its q and k heads in place, store k and v. */
ROW_FN void tandem_rope_cache_token(float *row, const float *c, const float *s, int64_t position, int64_t slot,
                                    void *k_cache, void *v_cache, int cache_bf16, int heads, int kv_heads,
                                    int head_dim, int64_t max_len, int64_t num_blocks) {
    const int half = head_dim / 2;
    for (int h = 0; h < heads + kv_heads; h++) {
        float *x = row + h * head_dim;
#pragma omp simd
        for (int i = 0; i < half; i++) {
            const float x1 = x[i], x2 = x[i + half];
            x[i] = x1 * c[i] - x2 * s[i];
            x[i + half] = x2 * c[i + half] + x1 * s[i + half];
        }
    }
    for (int h = 0; h < kv_heads; h++) {
        const int64_t at = (((int64_t)h * num_blocks + slot) * max_len + position) * head_dim;
        const float *k = row + (heads + h) * head_dim, *v = row + (heads + kv_heads + h) * head_dim;
        if (cache_bf16) {
            uint16_t *kd = (uint16_t *)k_cache + at, *vd = (uint16_t *)v_cache + at;
            for (int i = 0; i < head_dim; i++) {
                kd[i] = float_to_bf16(k[i]);
                vd[i] = float_to_bf16(v[i]);
            }
        } else {
            memcpy((float *)k_cache + at, k, sizeof(float) * head_dim);
            memcpy((float *)v_cache + at, v, sizeof(float) * head_dim);
        }
    }
}

/* One pass over a fused q|k|v projection ([n, (heads + 2 kv_heads) * head_dim], qkv_stride floats
 * between tokens): rotate q and k in place (rotate-half RoPE with this token's cos/sin rows,
 * [n, head_dim] each), then store k and v in the head-major paged cache ([kv_heads, num_blocks,
 * max_len = block_size, head_dim]) at (kv head, block slots[t], offset positions[t]).
 * Replaces torch's cat/neg/mul/mul/add and two index_put calls per layer. */
void tandem_rope_and_cache(float *qkv, int64_t qkv_stride, int64_t n, const float *cos, const float *sin,
                           const int64_t *positions, const int64_t *slots, void *k_cache, void *v_cache,
                           int cache_bf16, int heads, int kv_heads, int head_dim, int64_t max_len, int64_t num_blocks) {
#pragma omp parallel for schedule(static) num_threads(g_threads) if (n >= 64)
    for (int64_t t = 0; t < n; t++)
        tandem_rope_cache_token(qkv + t * qkv_stride, cos + t * head_dim, sin + t * head_dim, positions[t], slots[t],
                                k_cache, v_cache, cache_bf16, heads, kv_heads, head_dim, max_len, num_blocks);
}

/* One row of tandem_rms_norm. */
ROW_FN void tandem_rms_norm_row(float *xr, const float *res, const float *weight, float *o, int64_t width,
                                float eps) {
    if (res) {
#pragma omp simd
        for (int64_t k = 0; k < width; k++) xr[k] += res[k];
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t k = 0; k < width; k++) sum += xr[k] * xr[k];
    const float inv = 1.0f / sqrtf(sum / (float)width + eps);
#pragma omp simd
    for (int64_t k = 0; k < width; k++) o[k] = xr[k] * inv * weight[k];
}

/* RMSNorm of each row of x ([rows, width], contiguous) into out; with residual != NULL, first
 * x += residual in place (the residual stream's add, fused: vLLM's fused_add_rms_norm). Sums in
 * float32 like torch. */
void tandem_rms_norm(float *x, const float *residual, const float *weight, float *out, int64_t rows, int64_t width,
                     float eps) {
#pragma omp parallel for schedule(static) num_threads(g_threads) if (rows * width >= 65536)
    for (int64_t r = 0; r < rows; r++)
        tandem_rms_norm_row(x + r * width, residual ? residual + r * width : NULL, weight, out + r * width, width, eps);
}

/* One row of tandem_silu_mul. */
ROW_FN void tandem_silu_mul_row(const float *g, float *o, int64_t inter) {
    const float *u = g + inter;
    /* 8 lanes: gcc's tuning for AMD Zen 1 would pick 4 (SSE expf), at twice the calls */
#pragma omp simd simdlen(8)
    for (int64_t k = 0; k < inter; k++) o[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
}

/* SwiGLU's middle: out[r, k] = silu(gate_up[r, k]) * gate_up[r, inter + k]; gate_up [rows, 2 inter]. */
void tandem_silu_mul(const float *gate_up, float *out, int64_t rows, int64_t inter) {
#pragma omp parallel for schedule(static) num_threads(g_threads) if (rows * inter >= 65536)
    for (int64_t r = 0; r < rows; r++) tandem_silu_mul_row(gate_up + r * 2 * inter, out + r * inter, inter);
}
