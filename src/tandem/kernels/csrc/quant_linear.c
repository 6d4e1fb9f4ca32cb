/* Quantized Linear layers for small batches: int8 (bit-identical to fbgemm's dynamic path) and
 * group-wise int4, on weights packed once for AVX512-VNNI.
 *
 * Packed layout (both formats): blocks of 16 output channels; inside a block, 64 bytes per step
 * of K, holding 4 consecutive k of each of the 16 channels ([N/16][K/4][16][4] for int8). One
 * vpdpbusd multiplies such a vector by 4 activation bytes broadcast to every lane and adds into
 * 16 int32 accumulators, one per channel: no horizontal sums, and every block is one contiguous
 * stream of weights. A weight vector, once loaded, serves every row of the batch (register
 * blocking: rows x blocks accumulators), so 1-8 rows cost about one pass over the weights.
 *
 * int8: each activation row arrives scaled to max |x| = 1 (tandem_rows_to_unit, the same pass the
 * fbgemm path uses) and is quantized as fbgemm quantizes a [-1, 1] range: q = nearbyint(fma(x,
 * 1/scale, 128)), u8. out = float(acc - 128 * col_sum[n]) * (scale * w_scale[n]), then scaled
 * back per row (tandem_scale_rows). Same integers, same float operations: bit for bit fbgemm.
 *
 * int4: weights q in [-8, 7] per group of `group` k with an fp16 scale per (channel, group),
 * stored as q + 8 in nibbles (low nibble: k-steps 2j, high: 2j + 1), so they are vpdpbusd's
 * unsigned operand; activations are quantized symmetrically to s8 (127 / max |x|). Per group:
 * sum (q + 8) x = sum q x + 8 sum x, so the group's activation sum corrects it.
 *
 * Compiled WITHOUT -ffast-math: int8's quantization (fma, round half to even) must be exact.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_VNNI 1
#else
#define HAVE_VNNI 0
#endif
/* AVX2 without VNNI (AMD Zen 1/2, older Xeons): vpdpbusd emulated as vpmaddubsw (pairs of u8 x s8
 * products summed into int16, saturating) + vpmaddwd by ones. Exact for int4 (15 x 127 x 2 fits
 * int16) and for int8 with weights in [-63, 63] (255 x 63 x 2 = 32130), the 7-bit weights int8
 * takes on such CPUs (tandem.optimize.int8.weight_levels); pack_int8 refuses wider weights here. */
#if !HAVE_VNNI && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_AVX2Q 1
#else
#define HAVE_AVX2Q 0
#endif

#define KMAX 16384 /* widest K served (activation bytes per row on the stack) */
#define RB 8       /* rows per register block (VNNI: 32 vector registers) */
#define RB2 4      /* rows per register block (AVX2: 16 vector registers) */

/* 1: the VNNI kernels; 2: the AVX2 kernels (int8 weights limited to [-63, 63]); 0: none fast. */
int tandem_quant_linear_fast(void) { return HAVE_VNNI ? 1 : (HAVE_AVX2Q ? 2 : 0); }

#if HAVE_AVX2Q
/* acc + the four u8 x s8 products of each 32-bit lane (vpdpbusd on 8 lanes); see above for when
 * the int16 pair sums are exact. */
static inline __attribute__((always_inline)) __m256i dpbusd8(__m256i acc, __m256i u8, __m256i s8) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1)));
}
#endif

/* cpu_kernels.c: the per-row scaling the fbgemm path uses too, so both paths see identical rows. */
void tandem_rows_to_unit(const float *x, int64_t x_stride, int64_t rows, int64_t width, float *dst, float *scale);
void tandem_scale_rows(float *y, int64_t rows, int64_t width, const float *scale, const float *bias);
int tandem_threads(void);

/* ---- activation quantization (per row, into a caller's buffer) ---- */

/* int8: unit rows -> u8 with zero point 128, K padded with zeros to k_pad (a multiple of 4). */
static void quantize_u8(const float *unit, int64_t rows, int64_t K, int64_t k_pad, float a_inv, int32_t zp,
                        uint8_t *xq) {
    for (int64_t m = 0; m < rows; m++) {
        uint8_t *q = xq + m * k_pad;
        const float *x = unit + m * K;
        for (int64_t k = 0; k < K; k++) {
            float t = nearbyintf(fmaf(x[k], a_inv, (float)zp));
            q[k] = (uint8_t)(t < 0.0f ? 0.0f : (t > 255.0f ? 255.0f : t));
        }
        memset(q + K, 0, (size_t)(k_pad - K));
    }
}

/* int4: unit rows -> s8 (x * 127, round half to even), K padded to k_pad (a multiple of the
 * group); gsum[m][g] = sum of row m's quantized values in group g. */
static void quantize_s8(const float *unit, int64_t rows, int64_t K, int64_t k_pad, int64_t group, int8_t *xq,
                        int32_t *gsum) {
    const int64_t groups = k_pad / group;
    for (int64_t m = 0; m < rows; m++) {
        int8_t *q = xq + m * k_pad;
        const float *x = unit + m * K;
        for (int64_t k = 0; k < K; k++) q[k] = (int8_t)nearbyintf(x[k] * 127.0f);
        memset(q + K, 0, (size_t)(k_pad - K));
        for (int64_t g = 0; g < groups; g++) {
            int32_t s = 0;
            for (int64_t k = g * group; k < (g + 1) * group; k++) s += q[k];
            gsum[m * groups + g] = s;
        }
    }
}

/* ---- int8 ---- */

#if HAVE_VNNI
/* Blocks nb .. nb + NB - 1, rows r0 .. r0 + R - 1: raw int32 dot products into raw ([rows][n_pad]). */
static inline __attribute__((always_inline)) void int8_tile(const int R, const int NB, const uint8_t *xq,
                                                            int64_t k_pad, const int8_t *w, int64_t k4s,
                                                            int64_t nb, int32_t *raw, int64_t n_pad) {
    __m512i acc[RB][4];
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NB; b++) acc[r][b] = _mm512_setzero_si512();
    const int8_t *wb = w + nb * k4s * 64;
    for (int64_t s = 0; s < k4s; s++) {
        __m512i wv[4];
        for (int b = 0; b < NB; b++) wv[b] = _mm512_loadu_si512(wb + (b * k4s + s) * 64);
        for (int r = 0; r < R; r++) {
            const __m512i xb = _mm512_set1_epi32(*(const int32_t *)(xq + r * k_pad + 4 * s));
            for (int b = 0; b < NB; b++) acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], xb, wv[b]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NB; b++) _mm512_storeu_si512(raw + r * n_pad + (nb + b) * 16, acc[r][b]);
}

/* Blocks a register tile holds for R rows (accumulators: R x NB of the 32 vector registers). */
static inline int int8_cap(int64_t R) { return R <= 4 ? 4 : 2; }

#define INT8_CASE(R)                                                                    \
    case R:                                                                             \
        if (nbs == 4)                                                                   \
            int8_tile(R, 4, xq + r0 * k_pad, k_pad, w, k4s, nb + b, raw + r0 * n_pad, n_pad); \
        else if (nbs == 2)                                                              \
            int8_tile(R, 2, xq + r0 * k_pad, k_pad, w, k4s, nb + b, raw + r0 * n_pad, n_pad); \
        else                                                                            \
            int8_tile(R, 1, xq + r0 * k_pad, k_pad, w, k4s, nb + b, raw + r0 * n_pad, n_pad); \
        break;
/* NB (1, 2 or 4) blocks from nb, every row, in register tiles of up to RB rows. */
static void int8_tiles(int64_t rows, const uint8_t *xq, int64_t k_pad, const int8_t *w, int64_t k4s, int64_t nb,
                       int NB, int32_t *raw, int64_t n_pad) {
    for (int64_t r0 = 0; r0 < rows; r0 += RB) {
        const int64_t R = rows - r0 < RB ? rows - r0 : RB;
        const int nbs = NB < int8_cap(R) ? NB : int8_cap(R);
        for (int b = 0; b < NB; b += nbs) {
            switch (R) {
                INT8_CASE(1) INT8_CASE(2) INT8_CASE(3) INT8_CASE(4)
                INT8_CASE(5) INT8_CASE(6) INT8_CASE(7) INT8_CASE(8)
            }
        }
    }
}
#undef INT8_TILE
#endif

#if HAVE_AVX2Q
/* int8_tile on AVX2: a 64-byte block vector is two 32-byte halves (channels 0-7, 8-15). */
static inline __attribute__((always_inline)) void int8_tile2(const int R, const int NB, const uint8_t *xq,
                                                             int64_t k_pad, const int8_t *w, int64_t k4s,
                                                             int64_t nb, int32_t *raw, int64_t n_pad) {
    __m256i acc[RB2][2][2];
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NB; b++) acc[r][b][0] = acc[r][b][1] = _mm256_setzero_si256();
    const int8_t *wb = w + nb * k4s * 64;
    for (int64_t s = 0; s < k4s; s++) {
        __m256i wv[2][2];
        for (int b = 0; b < NB; b++)
            for (int h = 0; h < 2; h++) wv[b][h] = _mm256_loadu_si256((const __m256i *)(wb + (b * k4s + s) * 64 + 32 * h));
        for (int r = 0; r < R; r++) {
            const __m256i xb = _mm256_set1_epi32(*(const int32_t *)(xq + r * k_pad + 4 * s));
            for (int b = 0; b < NB; b++)
                for (int h = 0; h < 2; h++) acc[r][b][h] = dpbusd8(acc[r][b][h], xb, wv[b][h]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NB; b++)
            for (int h = 0; h < 2; h++)
                _mm256_storeu_si256((__m256i *)(raw + r * n_pad + (nb + b) * 16 + 8 * h), acc[r][b][h]);
}

static void int8_tiles2(int64_t rows, const uint8_t *xq, int64_t k_pad, const int8_t *w, int64_t k4s, int64_t nb,
                        int NB, int32_t *raw, int64_t n_pad) {
    for (int64_t r0 = 0; r0 < rows; r0 += RB2) {
        const int64_t R = rows - r0 < RB2 ? rows - r0 : RB2;
        const int nbs = R <= 2 ? NB : 1; /* accumulators: R x nbs x 2 of the 16 registers */
        for (int b = 0; b < NB; b += nbs) {
            const uint8_t *x = xq + r0 * k_pad;
            int32_t *o = raw + r0 * n_pad;
            if (nbs == 2) {
                if (R == 1) int8_tile2(1, 2, x, k_pad, w, k4s, nb + b, o, n_pad);
                else int8_tile2(2, 2, x, k_pad, w, k4s, nb + b, o, n_pad);
            } else {
                switch (R) {
                case 1: int8_tile2(1, 1, x, k_pad, w, k4s, nb + b, o, n_pad); break;
                case 2: int8_tile2(2, 1, x, k_pad, w, k4s, nb + b, o, n_pad); break;
                case 3: int8_tile2(3, 1, x, k_pad, w, k4s, nb + b, o, n_pad); break;
                default: int8_tile2(4, 1, x, k_pad, w, k4s, nb + b, o, n_pad); break;
                }
            }
        }
    }
}
#endif

/* Output blocks [blk_lo, blk_hi) of an int8 layer, rows already quantized: raw int32 sums, then
 * out[m][n] = float(raw - zp_col[n]) * combined[n] for n < N. */
static void int8_blocks(int64_t rows, const uint8_t *xq, int64_t k_pad, const int8_t *w, const int32_t *zp_col,
                        const float *combined, float *out, int64_t N, int64_t blk_lo, int64_t blk_hi, int32_t *raw,
                        int64_t n_pad) {
    const int64_t k4s = k_pad / 4;
    int64_t nb = blk_lo;
#if HAVE_VNNI
    const int NB = 4;
    for (; nb + NB <= blk_hi; nb += NB) int8_tiles(rows, xq, k_pad, w, k4s, nb, NB, raw, n_pad);
    for (; nb < blk_hi; nb++) int8_tiles(rows, xq, k_pad, w, k4s, nb, 1, raw, n_pad);
#elif HAVE_AVX2Q
    for (; nb + 2 <= blk_hi; nb += 2) int8_tiles2(rows, xq, k_pad, w, k4s, nb, 2, raw, n_pad);
    for (; nb < blk_hi; nb++) int8_tiles2(rows, xq, k_pad, w, k4s, nb, 1, raw, n_pad);
#else
    for (; nb < blk_hi; nb++)
        for (int64_t m = 0; m < rows; m++)
            for (int c = 0; c < 16; c++) {
                int32_t acc = 0;
                for (int64_t s = 0; s < k4s; s++)
                    for (int i = 0; i < 4; i++)
                        acc += (int32_t)xq[m * k_pad + 4 * s + i] * (int32_t)w[((nb * k4s + s) * 16 + c) * 4 + i];
                raw[m * n_pad + nb * 16 + c] = acc;
            }
#endif
    const int64_t n_lo = blk_lo * 16, n_hi = blk_hi * 16 < N ? blk_hi * 16 : N;
    for (int64_t m = 0; m < rows; m++)
        for (int64_t n = n_lo; n < n_hi; n++) out[m * N + n] = (float)(raw[m * n_pad + n] - zp_col[n]) * combined[n];
}

/* Thread t of `threads`: its share [lo, hi) of `blocks` output blocks. */
void tandem_share(int64_t blocks, int t, int threads, int64_t *lo, int64_t *hi) {
    *lo = blocks * t / threads;
    *hi = blocks * (t + 1) / threads;
}
#define share tandem_share

/* The int8 layer for `rows` rows of x ([rows, K], x_stride floats apart) into out ([rows, N]):
 * unit scaling, quantization, VNNI products, fbgemm's epilogue, row scales (+ bias). Work buffers
 * come from the caller (unit [rows * K], xq [rows * k_pad], raw [rows * n_pad]); with threads > 1
 * it opens its own parallel region, else runs in the calling thread (inside a caller's region). */
typedef struct {
    int64_t N, K, k_pad, n_pad;
    const int8_t *w;
    const int32_t *zp_col;
    const float *combined;
    const float *bias;
    float a_inv;
    int32_t zp;
} Int8Layer;

typedef struct {
    int64_t N, K, k_pad, n_pad, group;
    const uint8_t *w;
    const uint16_t *scales; /* fp16, [N/16][groups][16] */
    const float *bias;
} Int4Layer;

/* ---- int4 ---- */

#if HAVE_VNNI
static inline __attribute__((always_inline)) void int4_tile(const int R, const int NB, const int8_t *xq,
                                                            int64_t k_pad, const int32_t *gsum, int64_t groups,
                                                            const Int4Layer *L, int64_t nb, float *acc_out,
                                                            int64_t n_pad) {
    const int64_t k8s = k_pad / 8, steps = L->group / 8;
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 accf[RB][4];
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NB; b++) accf[r][b] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m512i lo_acc[RB][4], hi_acc[RB][4];
        for (int r = 0; r < R; r++)
            for (int b = 0; b < NB; b++) lo_acc[r][b] = hi_acc[r][b] = _mm512_setzero_si512();
        for (int64_t j = g * steps; j < (g + 1) * steps; j++) {
            __m512i wl[4], wh[4];
            for (int b = 0; b < NB; b++) {
                const __m512i v = _mm512_loadu_si512(L->w + ((nb + b) * k8s + j) * 64);
                wl[b] = _mm512_and_si512(v, low);
                wh[b] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            }
            for (int r = 0; r < R; r++) {
                const int32_t *x32 = (const int32_t *)(xq + r * k_pad);
                const __m512i xl = _mm512_set1_epi32(x32[2 * j]), xh = _mm512_set1_epi32(x32[2 * j + 1]);
                for (int b = 0; b < NB; b++) {
                    lo_acc[r][b] = _mm512_dpbusd_epi32(lo_acc[r][b], wl[b], xl);
                    hi_acc[r][b] = _mm512_dpbusd_epi32(hi_acc[r][b], wh[b], xh);
                }
            }
        }
        for (int b = 0; b < NB; b++) {
            const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(L->scales + ((nb + b) * groups + g) * 16)));
            for (int r = 0; r < R; r++) {
                const __m512i corr = _mm512_set1_epi32(8 * gsum[r * groups + g]);
                const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(lo_acc[r][b], hi_acc[r][b]), corr);
                accf[r][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, accf[r][b]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NB; b++) _mm512_storeu_ps(acc_out + r * n_pad + (nb + b) * 16, accf[r][b]);
}

static inline int int4_cap(int64_t R) { return R <= 2 ? 4 : (R <= 4 ? 2 : 1); }

#define INT4_CASE(R)                                                                                             \
    case R:                                                                                                      \
        if (nbs == 4)                                                                                            \
            int4_tile(R, 4, xq + r0 * k_pad, k_pad, gsum + r0 * groups, groups, L, nb + b, acc + r0 * n_pad, n_pad); \
        else if (nbs == 2)                                                                                       \
            int4_tile(R, 2, xq + r0 * k_pad, k_pad, gsum + r0 * groups, groups, L, nb + b, acc + r0 * n_pad, n_pad); \
        else                                                                                                     \
            int4_tile(R, 1, xq + r0 * k_pad, k_pad, gsum + r0 * groups, groups, L, nb + b, acc + r0 * n_pad, n_pad); \
        break;
static void int4_tiles(int64_t rows, const int8_t *xq, int64_t k_pad, const int32_t *gsum, int64_t groups,
                       const Int4Layer *L, int64_t nb, int NB, float *acc, int64_t n_pad) {
    for (int64_t r0 = 0; r0 < rows; r0 += RB) {
        const int64_t R = rows - r0 < RB ? rows - r0 : RB;
        const int nbs = NB < int4_cap(R) ? NB : int4_cap(R);
        for (int b = 0; b < NB; b += nbs) {
            switch (R) {
                INT4_CASE(1) INT4_CASE(2) INT4_CASE(3) INT4_CASE(4)
                INT4_CASE(5) INT4_CASE(6) INT4_CASE(7) INT4_CASE(8)
            }
        }
    }
}
#undef INT4_TILE
#endif

#if HAVE_AVX2Q
/* int4_tile on AVX2. Per 8 k a channel's low and high nibbles each meet their 4 activation bytes
 * (vpmaddubsw: int16 sums of two u4 x s8 products, at most 2 x 15 x 127 = 3810). Eight of those
 * sums, 32 k, fit int16 (30480), so they add as int16 and widen to int32 (vpmaddwd by ones) once
 * per 32 k instead of once per 8: on CPUs whose one vector-multiply port runs both (AMD Zen 1/2)
 * that is 18 port cycles per 256 products instead of 24. Exact: the same integer dot products. */
#define INT4_STEPS_PER_WIDEN 4 /* 8-k steps whose int16 sums cannot overflow (8 x 3810 <= 32767) */
/* One row against NB blocks (batch-1 decode). STEPS: 8-k steps per group, a constant for the common
 * group of 32 (4: one widening per group, no int32 accumulator kept across steps), else 0 (read from
 * the layer). The float accumulators live in acc_out (touched once per group). */
static inline __attribute__((always_inline)) void int4_tile2(const int NB, const int64_t STEPS, const int8_t *xq,
                                                             const int32_t *gsum, int64_t groups, const Int4Layer *L,
                                                             int64_t nb, float *acc_out) {
    const int64_t k8s = L->k_pad / 8, steps = STEPS ? STEPS : L->group / 8;
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const int32_t *x32 = (const int32_t *)xq;
    for (int b = 0; b < NB; b++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(acc_out + (nb + b) * 16 + 8 * h, _mm256_setzero_ps());
    for (int64_t g = 0; g < groups; g++) {
        __m256i dot[2][2];
        for (int64_t j0 = g * steps; j0 < (g + 1) * steps; j0 += INT4_STEPS_PER_WIDEN) {
            const int64_t j1 = j0 + INT4_STEPS_PER_WIDEN < (g + 1) * steps ? j0 + INT4_STEPS_PER_WIDEN : (g + 1) * steps;
            __m256i sum16[2][2];
            for (int b = 0; b < NB; b++) sum16[b][0] = sum16[b][1] = _mm256_setzero_si256();
            for (int64_t j = j0; j < j1; j++) {
                const __m256i xl = _mm256_set1_epi32(x32[2 * j]), xh = _mm256_set1_epi32(x32[2 * j + 1]);
                for (int b = 0; b < NB; b++)
                    for (int h = 0; h < 2; h++) {
                        const __m256i v =
                            _mm256_loadu_si256((const __m256i *)(L->w + ((nb + b) * k8s + j) * 64 + 32 * h));
                        const __m256i wl = _mm256_and_si256(v, low), wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                        sum16[b][h] = _mm256_add_epi16(
                            sum16[b][h], _mm256_add_epi16(_mm256_maddubs_epi16(wl, xl), _mm256_maddubs_epi16(wh, xh)));
                    }
            }
            for (int b = 0; b < NB; b++)
                for (int h = 0; h < 2; h++) {
                    const __m256i wide = _mm256_madd_epi16(sum16[b][h], ones);
                    dot[b][h] = j0 == g * steps ? wide : _mm256_add_epi32(dot[b][h], wide);
                }
        }
        const __m256i corr = _mm256_set1_epi32(8 * gsum[g]);
        for (int b = 0; b < NB; b++)
            for (int h = 0; h < 2; h++) {
                const __m256 s = _mm256_cvtph_ps(
                    _mm_loadu_si128((const __m128i *)(L->scales + ((nb + b) * groups + g) * 16 + 8 * h)));
                float *o = acc_out + (nb + b) * 16 + 8 * h;
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dot[b][h], corr)), s,
                                                    _mm256_loadu_ps(o)));
            }
    }
}

#define INT4_TILE2(NB) \
    (steps32 ? int4_tile2(NB, 4, xq, gsum, groups, L, nb, acc) : int4_tile2(NB, 0, xq, gsum, groups, L, nb, acc))

/* int4 on AVX2 for 2 or more rows (batched decode steps). Three things the tile above does not do,
 * which took this path from 39-40 to 43-45 GMAC/s on 2 Zen 1 cores at 8-32 rows (side by side):
 * - K in chunks of INT4_KCHUNK for every row tile before the next chunk, so a chunk of all rows'
 *   activations (32 rows x 256 bytes) and of the block's weights stay in L1 (32 rows of 768 k and
 *   two blocks of weights did not fit: every broadcast came from L2).
 * - The low nibbles against all R rows, then the high ones: two unpacked weight vectors live at a
 *   time, so the 8 int16 sums of 4 rows fit the 16 registers with room to spare.
 * - The broadcasts in program order (broadcast_ordered) and each add done when written: gcc hoisted
 *   a tile's broadcasts and reassociated the adds into temporaries, and spilled the sums to the
 *   stack on every step.
 * Same integer sums (exact, int16 within a widening step as above), the same float epilogue per
 * group and channel in the same order as int4_tile2: the same bits. */
#define INT4_KCHUNK 256 /* k per chunk */
#define INT4_RB 4        /* rows per tile */

/* 4 activation bytes broadcast to every lane, in program order (a volatile asm: not hoisted). */
static inline __attribute__((always_inline)) __m256i broadcast_ordered(const int32_t *p) {
    __m256i v;
    __asm__ volatile("vpbroadcastd %1, %0" : "=x"(v) : "m"(*p));
    return v;
}

/* Block nb (both halves: channels 0-7 and 8-15), rows 0 .. R - 1 (R <= INT4_RB), groups [g_lo,
 * g_hi): float accumulators in acc_out, zeroed at g_lo == 0. STEPS as for int4_tile2. */
static inline __attribute__((always_inline)) void int4_rows_tile(const int R, const int64_t STEPS, const int8_t *xq,
                                                                 int64_t k_pad, const int32_t *gsum, int64_t groups,
                                                                 int64_t g_lo, int64_t g_hi, const Int4Layer *L,
                                                                 int64_t nb, float *acc_out, int64_t n_pad) {
    const int64_t k8s = k_pad / 8, steps = STEPS ? STEPS : L->group / 8;
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const uint8_t *wb = L->w + nb * k8s * 64;
    float *o = acc_out + nb * 16;
    if (g_lo == 0)
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(o + r * n_pad, _mm256_setzero_ps());
            _mm256_storeu_ps(o + r * n_pad + 8, _mm256_setzero_ps());
        }
    for (int64_t g = g_lo; g < g_hi; g++) {
        __m256i dot0[INT4_RB], dot1[INT4_RB];
        for (int64_t j0 = g * steps; j0 < (g + 1) * steps; j0 += INT4_STEPS_PER_WIDEN) {
            const int64_t j1 = j0 + INT4_STEPS_PER_WIDEN < (g + 1) * steps ? j0 + INT4_STEPS_PER_WIDEN : (g + 1) * steps;
            __m256i s0[INT4_RB], s1[INT4_RB];
            for (int r = 0; r < R; r++) s0[r] = s1[r] = _mm256_setzero_si256();
            for (int64_t j = j0; j < j1; j++)
                for (int nib = 0; nib < 2; nib++) {
                    const __m256i v0 = _mm256_loadu_si256((const __m256i *)(wb + j * 64));
                    const __m256i v1 = _mm256_loadu_si256((const __m256i *)(wb + j * 64 + 32));
                    const __m256i w0 = _mm256_and_si256(nib ? _mm256_srli_epi16(v0, 4) : v0, low);
                    const __m256i w1 = _mm256_and_si256(nib ? _mm256_srli_epi16(v1, 4) : v1, low);
                    for (int r = 0; r < R; r++) {
                        const __m256i xb = broadcast_ordered((const int32_t *)(xq + r * k_pad) + 2 * j + nib);
                        s0[r] = _mm256_add_epi16(s0[r], _mm256_maddubs_epi16(w0, xb));
                        s1[r] = _mm256_add_epi16(s1[r], _mm256_maddubs_epi16(w1, xb));
                        __asm__("" : "+x"(s0[r]), "+x"(s1[r])); /* added now, not reassociated */
                    }
                }
            for (int r = 0; r < R; r++) {
                const __m256i wide0 = _mm256_madd_epi16(s0[r], ones), wide1 = _mm256_madd_epi16(s1[r], ones);
                dot0[r] = j0 == g * steps ? wide0 : _mm256_add_epi32(dot0[r], wide0);
                dot1[r] = j0 == g * steps ? wide1 : _mm256_add_epi32(dot1[r], wide1);
            }
        }
        const uint16_t *sg = L->scales + (nb * groups + g) * 16;
        const __m256 sc0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sg));
        const __m256 sc1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sg + 8)));
        for (int r = 0; r < R; r++) {
            const __m256i corr = _mm256_set1_epi32(8 * gsum[r * groups + g]);
            float *orow = o + r * n_pad;
            _mm256_storeu_ps(orow, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dot0[r], corr)), sc0,
                                                   _mm256_loadu_ps(orow)));
            _mm256_storeu_ps(orow + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dot1[r], corr)), sc1,
                                                       _mm256_loadu_ps(orow + 8)));
        }
    }
}

#define INT4_ROWS(R) \
    (steps32 ? int4_rows_tile(R, 4, x, k_pad, gs, groups, g_lo, g_hi, L, nb, o, n_pad) \
             : int4_rows_tile(R, 0, x, k_pad, gs, groups, g_lo, g_hi, L, nb, o, n_pad))

/* Rows 0 .. R - 1 (1 <= R <= INT4_RB) of block nb, groups [g_lo, g_hi). */
static void int4_rows_tiles(int64_t R, const int8_t *x, int64_t k_pad, const int32_t *gs, int64_t groups,
                            int64_t g_lo, int64_t g_hi, const Int4Layer *L, int64_t nb, float *o, int64_t n_pad) {
    const int steps32 = L->group == 32;
    switch (R) {
    case 1: INT4_ROWS(1); break;
    case 2: INT4_ROWS(2); break;
    case 3: INT4_ROWS(3); break;
    default: INT4_ROWS(4); break;
    }
}
#undef INT4_ROWS

static void int4_tiles2(int64_t rows, const int8_t *xq, int64_t k_pad, const int32_t *gsum, int64_t groups,
                        const Int4Layer *L, int64_t nb, int NB, float *acc, int64_t n_pad) {
    const int steps32 = L->group == 32;
    if (rows >= 2) { /* the batched path above: every row, K chunk by chunk */
        const int64_t chunk = INT4_KCHUNK / L->group > 0 ? INT4_KCHUNK / L->group : 1;
        for (int64_t g_lo = 0; g_lo < groups; g_lo += chunk) {
            const int64_t g_hi = g_lo + chunk < groups ? g_lo + chunk : groups;
            for (int b = 0; b < NB; b++)
                for (int64_t r = 0; r < rows; r += INT4_RB)
                    int4_rows_tiles(rows - r < INT4_RB ? rows - r : INT4_RB, xq + r * k_pad, k_pad, gsum + r * groups,
                                    groups, g_lo, g_hi, L, nb + b, acc + r * n_pad, n_pad);
        }
        return;
    }
    /* 1 row (batch-1 decode, bound by reading the weights): both blocks of NB at once, ~9% faster
     * there than the chunked tile; from 2 rows on the two are even */
    if (NB == 2) INT4_TILE2(2);
    else INT4_TILE2(1);
}
#undef INT4_TILE2
#endif

#if !HAVE_VNNI && !HAVE_AVX2Q
static float fp16_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float f;
    if (exp == 0) {
        f = ldexpf((float)man, -24);
    } else if (exp == 31) {
        f = man ? NAN : INFINITY;
    } else {
        const uint32_t bits = ((exp + 112) << 23) | (man << 13);
        memcpy(&f, &bits, sizeof f);
    }
    return sign ? -f : f;
}
#endif

/* Output blocks [blk_lo, blk_hi) of an int4 layer; out[m][n] = row_factor[m] * acc (+ bias). */
static void int4_blocks(int64_t rows, const int8_t *xq, const int32_t *gsum, const Int4Layer *L,
                        const float *row_factor, float *out, int64_t blk_lo, int64_t blk_hi, float *acc) {
    const int64_t k_pad = L->k_pad, n_pad = L->n_pad, groups = k_pad / L->group;
    int64_t nb = blk_lo;
#if HAVE_VNNI
    const int NB = 4;
    for (; nb + NB <= blk_hi; nb += NB) int4_tiles(rows, xq, k_pad, gsum, groups, L, nb, NB, acc, n_pad);
    for (; nb < blk_hi; nb++) int4_tiles(rows, xq, k_pad, gsum, groups, L, nb, 1, acc, n_pad);
#elif HAVE_AVX2Q
    for (; nb + 2 <= blk_hi; nb += 2) int4_tiles2(rows, xq, k_pad, gsum, groups, L, nb, 2, acc, n_pad);
    for (; nb < blk_hi; nb++) int4_tiles2(rows, xq, k_pad, gsum, groups, L, nb, 1, acc, n_pad);
#else
    const int64_t k8s = k_pad / 8;
    for (; nb < blk_hi; nb++)
        for (int64_t m = 0; m < rows; m++)
            for (int c = 0; c < 16; c++) {
                float total = 0.0f;
                for (int64_t g = 0; g < groups; g++) {
                    int32_t dot = 0;
                    for (int64_t j = g * (L->group / 8); j < (g + 1) * (L->group / 8); j++)
                        for (int i = 0; i < 4; i++) {
                            const uint8_t byte = L->w[((nb * k8s + j) * 16 + c) * 4 + i];
                            dot += ((byte & 0x0F) - 8) * xq[m * k_pad + 8 * j + i];
                            dot += ((byte >> 4) - 8) * xq[m * k_pad + 8 * j + 4 + i];
                        }
                    total = fmaf((float)dot, fp16_to_float(L->scales[(nb * groups + g) * 16 + c]), total);
                }
                acc[m * n_pad + nb * 16 + c] = total;
            }
#endif
    const int64_t n_lo = blk_lo * 16, n_hi = blk_hi * 16 < L->N ? blk_hi * 16 : L->N;
    for (int64_t m = 0; m < rows; m++) {
        const float f = row_factor[m];
        for (int64_t n = n_lo; n < n_hi; n++) {
            const float v = acc[m * n_pad + n] * f;
            out[m * L->N + n] = L->bias ? v + L->bias[n] : v;
        }
    }
}

/* ---- pieces for the fused decoder (decode.c): each thread quantizes the rows itself and computes
 * its share of the output blocks ---- */

/* Rows of x -> unit rows (scale[m] = max |x[m]|) -> u8 activations, as tandem_int8_linear does. */
void tandem_int8_quantize(const float *x, int64_t x_stride, int64_t rows, int64_t K, int64_t k_pad, float a_inv,
                          int32_t zp, float *unit, float *scale, uint8_t *xq) {
    tandem_rows_to_unit(x, x_stride, rows, K, unit, scale);
    quantize_u8(unit, rows, K, k_pad, a_inv, zp, xq);
}

void tandem_int8_part(int64_t rows, const uint8_t *xq, int64_t k_pad, const int8_t *w, const int32_t *zp_col,
                      const float *combined, float *out, int64_t N, int64_t blk_lo, int64_t blk_hi, int32_t *raw) {
    int8_blocks(rows, xq, k_pad, w, zp_col, combined, out, N, blk_lo, blk_hi, raw, (N + 15) / 16 * 16);
}

/* Rows of x -> s8 activations, group sums and per-row output factors, as tandem_int4_linear does. */
void tandem_int4_quantize(const float *x, int64_t x_stride, int64_t rows, int64_t K, int64_t k_pad, int64_t group,
                          float *unit, float *scale, int8_t *xq, int32_t *gsum, float *factor) {
    tandem_rows_to_unit(x, x_stride, rows, K, unit, scale);
    quantize_s8(unit, rows, K, k_pad, group, xq, gsum);
    for (int64_t m = 0; m < rows; m++) factor[m] = scale[m] / 127.0f;
}

void tandem_int4_part(int64_t rows, const int8_t *xq, const int32_t *gsum, const uint8_t *w, const uint16_t *scales,
                      const float *bias, int64_t N, int64_t K, int64_t k_pad, int64_t group, const float *factor,
                      float *out, int64_t blk_lo, int64_t blk_hi, float *acc) {
    const Int4Layer L = {N, K, k_pad, (N + 15) / 16 * 16, group, w, scales, bias};
    int4_blocks(rows, xq, gsum, &L, factor, out, blk_lo, blk_hi, acc);
}

/* ---- entry points ---- */

/* Per-thread work buffers, grown on demand and kept (OpenMP's pool threads live as long as the
 * process): no allocation per call. */
static __thread void *tls_buf = NULL;
static __thread size_t tls_size = 0;

static void *thread_buffer(size_t bytes) {
    if (bytes > tls_size) {
        free(tls_buf);
        tls_size = bytes + (bytes >> 1);
        tls_buf = aligned_alloc(64, (tls_size + 63) / 64 * 64);
        if (!tls_buf) tls_size = 0;
    }
    return tls_buf;
}

/* One int8 layer on `rows` rows, all threads of the current team (or a new team of `threads`
 * when called outside a parallel region). The caller's x may alias nothing it writes. */
int tandem_int8_linear(const float *x, int64_t x_stride, int64_t rows, const int8_t *w, const int32_t *zp_col,
                       const float *combined, const float *bias, float a_inv, int32_t zp, int64_t N, int64_t K,
                       int64_t k_pad, float *out) {
    if (rows < 1 || k_pad > KMAX || k_pad % 4) return 1;
    const int64_t n_pad = (N + 15) / 16 * 16, blocks = n_pad / 16;
    float *unit = (float *)malloc(sizeof(float) * (size_t)(rows * K) + sizeof(float) * (size_t)rows);
    uint8_t *xq = (uint8_t *)malloc((size_t)(rows * k_pad));
    if (!unit || !xq) {
        free(unit);
        free(xq);
        return 3;
    }
    float *scale = unit + rows * K;
    tandem_int8_quantize(x, x_stride, rows, K, k_pad, a_inv, zp, unit, scale, xq);
    const int threads = N * K * (rows < 8 ? rows : 8) >= 262144 ? tandem_threads() : 1;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        int64_t lo, hi;
        share(blocks, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        int32_t *raw = (int32_t *)thread_buffer(sizeof(int32_t) * (size_t)(rows * n_pad));
        if (!raw) {
#pragma omp atomic write
            failed = 1;
        } else if (lo < hi) {
            int8_blocks(rows, xq, k_pad, w, zp_col, combined, out, N, lo, hi, raw, n_pad);
        }
    }
    if (!failed) tandem_scale_rows(out, rows, N, scale, bias);
    free(unit);
    free(xq);
    return failed ? 3 : 0;
}

int tandem_int4_linear(const float *x, int64_t x_stride, int64_t rows, const uint8_t *w, const uint16_t *scales,
                       const float *bias, int64_t N, int64_t K, int64_t k_pad, int64_t group, float *out) {
    if (rows < 1 || k_pad > KMAX || group % 8 || k_pad % group) return 1;
    const Int4Layer L = {N, K, k_pad, (N + 15) / 16 * 16, group, w, scales, bias};
    const int64_t groups = k_pad / group, blocks = L.n_pad / 16;
    float *unit = (float *)malloc(sizeof(float) * (size_t)(rows * K + 2 * rows));
    int8_t *xq = (int8_t *)malloc((size_t)(rows * k_pad));
    int32_t *gsum = (int32_t *)malloc(sizeof(int32_t) * (size_t)(rows * groups));
    if (!unit || !xq || !gsum) {
        free(unit);
        free(xq);
        free(gsum);
        return 3;
    }
    float *scale = unit + rows * K, *factor = scale + rows;
    tandem_int4_quantize(x, x_stride, rows, K, k_pad, group, unit, scale, xq, gsum, factor);
    const int threads = N * K * (rows < 8 ? rows : 8) >= 262144 ? tandem_threads() : 1;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        int64_t lo, hi;
        share(blocks, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        float *acc = (float *)thread_buffer(sizeof(float) * (size_t)(rows * L.n_pad));
        if (!acc) {
#pragma omp atomic write
            failed = 1;
        } else if (lo < hi) {
            int4_blocks(rows, xq, gsum, &L, factor, out, lo, hi, acc);
        }
    }
    free(unit);
    free(xq);
    free(gsum);
    return failed ? 3 : 0;
}
