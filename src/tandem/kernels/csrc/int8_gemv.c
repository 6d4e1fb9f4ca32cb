/* Small-batch int8 Linear, bit-identical to fbgemm's dynamic path on tandem's unit-scaled rows.
 *
 * Int8Linear scales each activation row to max |x| = 1 and pins fbgemm's dynamic range to [-1, 1],
 * so fbgemm quantizes with scale 2/255 and zero point 128: q = nearbyint(fma(x, 1/scale, 128)),
 * then out = float(acc - 128 * col_sum[n]) * (scale * w_scale[n]). This kernel does the same
 * arithmetic (tests check bit-equality), so a row gives the same output whichever path serves
 * it: batching never changes a row. At 1-4 rows fbgemm's GEMM packing and dispatch dominate; here
 * each weight row is streamed once with AVX512-VNNI dot products for all rows.
 *
 * Compiled WITHOUT -ffast-math: the quantization's fma and round-half-even must be exact.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define HAVE_VNNI 1
#else
#define HAVE_VNNI 0
#endif

#define MAX_ROWS 4

int tandem_int8_gemv_fast(void) { return HAVE_VNNI; }

/* cpu_kernels.c: the same per-row scaling the fbgemm path uses, so both paths see identical rows. */
void tandem_rows_to_unit(const float *x, int64_t x_stride, int64_t rows, int64_t width, float *dst, float *scale);
void tandem_scale_rows(float *y, int64_t rows, int64_t width, const float *scale, const float *bias);
int tandem_threads(void);

static int32_t dot_u8s8(const uint8_t *x, const int8_t *w, int64_t k_len) {
    int32_t acc = 0;
    for (int64_t k = 0; k < k_len; k++) acc += (int32_t)x[k] * (int32_t)w[k];
    return acc;
}

/* x: [rows, K] unit-scaled float rows (x_stride floats apart); w: [N, K] int8, row-major;
 * col_sums[n] = sum_k w[n, k]; out: [rows, N] contiguous. rows <= MAX_ROWS. Returns 0 on success. */
int tandem_int8_gemv(const float *x, int64_t x_stride, int64_t rows, int64_t K, const int8_t *w,
                     const int32_t *col_sums, const float *w_scales, float a_scale, float a_inv, int32_t a_zp,
                     float *out, int64_t N) {
    if (rows < 1 || rows > MAX_ROWS) return 1;
    const int64_t k_pad = (K + 63) / 64 * 64;
    uint8_t xq[MAX_ROWS * 16384 + 64];
    if (k_pad > 16384) return 2;
    for (int64_t m = 0; m < rows; m++) {
        uint8_t *q = xq + m * k_pad;
        for (int64_t k = 0; k < K; k++) {
            float t = nearbyintf(fmaf(x[m * x_stride + k], a_inv, (float)a_zp));
            q[k] = (uint8_t)(t < 0.0f ? 0.0f : (t > 255.0f ? 255.0f : t));
        }
        memset(q + K, 0, (size_t)(k_pad - K));
    }
    const int64_t blocks = (N + 3) / 4;
#pragma omp parallel for schedule(static) num_threads(tandem_threads()) if (N * K >= 262144)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t n0 = b * 4, count = N - n0 < 4 ? N - n0 : 4;
        for (int64_t m = 0; m < rows; m++) {
            int32_t acc[4] = {0, 0, 0, 0};
            const uint8_t *q = xq + m * k_pad;
#if HAVE_VNNI
            if (count == 4) {
                const int8_t *w0 = w + n0 * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
                __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
                int64_t k = 0;
                for (; k + 64 <= K; k += 64) {
                    const __m512i xv = _mm512_loadu_si512(q + k);
                    a0 = _mm512_dpbusd_epi32(a0, xv, _mm512_loadu_si512(w0 + k));
                    a1 = _mm512_dpbusd_epi32(a1, xv, _mm512_loadu_si512(w1 + k));
                    a2 = _mm512_dpbusd_epi32(a2, xv, _mm512_loadu_si512(w2 + k));
                    a3 = _mm512_dpbusd_epi32(a3, xv, _mm512_loadu_si512(w3 + k));
                }
                if (k < K) { /* tail: masked loads (q is zero-padded, the mask keeps w in bounds) */
                    const __mmask64 mask = (__mmask64)(~0ULL >> (64 - (K - k)));
                    const __m512i xv = _mm512_loadu_si512(q + k);
                    a0 = _mm512_dpbusd_epi32(a0, xv, _mm512_maskz_loadu_epi8(mask, w0 + k));
                    a1 = _mm512_dpbusd_epi32(a1, xv, _mm512_maskz_loadu_epi8(mask, w1 + k));
                    a2 = _mm512_dpbusd_epi32(a2, xv, _mm512_maskz_loadu_epi8(mask, w2 + k));
                    a3 = _mm512_dpbusd_epi32(a3, xv, _mm512_maskz_loadu_epi8(mask, w3 + k));
                }
                acc[0] = _mm512_reduce_add_epi32(a0);
                acc[1] = _mm512_reduce_add_epi32(a1);
                acc[2] = _mm512_reduce_add_epi32(a2);
                acc[3] = _mm512_reduce_add_epi32(a3);
            } else
#endif
            {
                for (int64_t i = 0; i < count; i++) acc[i] = dot_u8s8(q, w + (n0 + i) * K, K);
            }
            for (int64_t i = 0; i < count; i++) {
                const int64_t n = n0 + i;
                const float combined = a_scale * w_scales[n];
                out[m * N + n] = (float)(acc[i] - a_zp * col_sums[n]) * combined;
            }
        }
    }
    return 0;
}

/* The whole small-batch Int8Linear in one call: x ([rows, K], any row stride) scaled per row to
 * unit range, multiplied as fbgemm would, scaled back (+ bias) into out ([rows, N]). */
int tandem_int8_linear_small(const float *x, int64_t x_stride, int64_t rows, int64_t K, const int8_t *w,
                             const int32_t *col_sums, const float *w_scales, float a_scale, float a_inv,
                             int32_t a_zp, const float *bias, float *out, int64_t N) {
    if (rows < 1 || rows > MAX_ROWS) return 1;
    float scale[MAX_ROWS];
    float *unit = (float *)malloc(sizeof(float) * (size_t)(rows * K));
    if (!unit) return 3;
    tandem_rows_to_unit(x, x_stride, rows, K, unit, scale);
    const int status = tandem_int8_gemv(unit, K, rows, K, w, col_sums, w_scales, a_scale, a_inv, a_zp, out, N);
    free(unit);
    if (status) return status;
    tandem_scale_rows(out, rows, N, scale, bias);
    return 0;
}
