/* Exact dot products in float64 for Freivalds' check: C.R and V.R for generator output V.
 *
 * Every partial sum is an integer below 2^53 in magnitude (the caller picks R's range for
 * that: verifier.freivalds_bits), so float64 is exact and the order of the additions cannot
 * change a result. Four rows share each load of R's columns.
 */
#include <string.h>

#include "simd.h"

#if PW_SIMD

#define ROWS 4 /* rows that share each load of R's columns */

/* acc[i][q] += row i's next 8 entries times column q's, for ROWS rows and k columns. The
 * callers below are instantiated for each k, so the loops unroll and acc stays in registers. */
#define FMA_ROWS(values, cols_v)                                                 \
    for (int i = 0; i < ROWS; i++)                                               \
        for (int q = 0; q < k; q++) acc[i][q] = _mm512_fmadd_pd((values)[i], (cols_v)[q], acc[i][q])

static inline __mmask8 tail8(size_t left) { return left >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << left) - 1); }

/* out[i*k + q] = sum_j rows[i][j] * cols[q*n + j] for ROWS int32 rows; folds the entries into
 * *lo and *hi. A block with fewer than ROWS rows repeats its last row (the caller ignores it). */
PW_TARGET static inline __attribute__((always_inline)) void int32_dot(const int32_t *const rows[ROWS], size_t n,
                                                                     const double *cols, const int k, double *out,
                                                                     __m256i *lo, __m256i *hi) {
    __m512d acc[ROWS][8 + 1]; /* + 1: no zero-length array at k = 0 */
    for (int i = 0; i < ROWS; i++)
        for (int q = 0; q < k; q++) acc[i][q] = _mm512_setzero_pd();
    __m256i vlo = *lo, vhi = *hi;
    for (size_t j = 0; j < n; j += 8) {
        __mmask8 m = tail8(n - j);
        __m512d r[8], x[ROWS];
        for (int q = 0; q < k; q++) r[q] = _mm512_maskz_loadu_pd(m, cols + q * n + j);
        for (int i = 0; i < ROWS; i++) {
            __m256i v = _mm256_maskz_loadu_epi32(m, rows[i] + j);
            vlo = _mm256_mask_min_epi32(vlo, m, vlo, v);
            vhi = _mm256_mask_max_epi32(vhi, m, vhi, v);
            x[i] = _mm512_cvtepi32_pd(v);
        }
        FMA_ROWS(x, r);
    }
    *lo = vlo;
    *hi = vhi;
    for (int i = 0; i < ROWS; i++)
        for (int q = 0; q < k; q++) out[i * k + q] = _mm512_reduce_add_pd(acc[i][q]);
}

/* The same for ROWS rows of generator bytes: value = ((x*m) >> 8) - bound, or x as int8 when
 * m == 0. */
PW_TARGET static inline __attribute__((always_inline)) void byte_dot(const uint8_t *const rows[ROWS], size_t n,
                                                                    int32_t m, int32_t bound, const double *cols,
                                                                    const int k, double *out) {
    const __m256i vm = _mm256_set1_epi32(m), vb = _mm256_set1_epi32(bound);
    __m512d acc[ROWS][8];
    for (int i = 0; i < ROWS; i++)
        for (int q = 0; q < k; q++) acc[i][q] = _mm512_setzero_pd();
    for (size_t j = 0; j < n; j += 8) {
        __mmask8 mask = tail8(n - j);
        __m512d r[8], x[ROWS];
        for (int q = 0; q < k; q++) r[q] = _mm512_maskz_loadu_pd(mask, cols + q * n + j);
        for (int i = 0; i < ROWS; i++) {
            __m128i bytes = _mm_maskz_loadu_epi8((__mmask16)mask, rows[i] + j);
            __m256i v;
            if (m) {
                v = _mm256_cvtepu8_epi32(bytes);
                v = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_mullo_epi32(v, vm), 8), vb);
            } else {
                v = _mm256_cvtepi8_epi32(bytes);
            }
            /* Lanes past the row's end meet zeroed columns, so their value does not matter. */
            x[i] = _mm512_cvtepi32_pd(v);
        }
        FMA_ROWS(x, r);
    }
    for (int i = 0; i < ROWS; i++)
        for (int q = 0; q < k; q++) out[i * k + q] = _mm512_reduce_add_pd(acc[i][q]);
}

/* One instance per k (1 .. 8), so that each has its loops unrolled. */
#define FOR_EACH_K(CASE) CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#define INT32_DOT_K(K)                                                                                            \
    PW_TARGET static void int32_dot_##K(const int32_t *const rows[ROWS], size_t n, const double *cols, double *out, \
                                        __m256i *lo, __m256i *hi) {                                               \
        int32_dot(rows, n, cols, K, out, lo, hi);                                                                 \
    }
#define BYTE_DOT_K(K)                                                                                             \
    PW_TARGET static void byte_dot_##K(const uint8_t *const rows[ROWS], size_t n, int32_t m, int32_t bound,       \
                                       const double *cols, double *out) {                                         \
        byte_dot(rows, n, m, bound, cols, K, out);                                                                \
    }
INT32_DOT_K(0)
FOR_EACH_K(INT32_DOT_K)
FOR_EACH_K(BYTE_DOT_K)
typedef void (*int32_dot_fn)(const int32_t *const[ROWS], size_t, const double *, double *, __m256i *, __m256i *);
typedef void (*byte_dot_fn)(const uint8_t *const[ROWS], size_t, int32_t, int32_t, const double *, double *);
#define INT32_DOT_ENTRY(K) int32_dot_##K,
#define BYTE_DOT_ENTRY(K) byte_dot_##K,
static const int32_dot_fn int32_dots[9] = {int32_dot_0, FOR_EACH_K(INT32_DOT_ENTRY)};
static const byte_dot_fn byte_dots[9] = {NULL, FOR_EACH_K(BYTE_DOT_ENTRY)};

/* products[r*k + q] = sum_j c[r][j] * cols[q][j] for `rows` int32 rows of n entries; returns
 * the smallest and largest entry through *lo and *hi. */
PW_TARGET void pw_int32_rows_dot(const int32_t *c, size_t rows, size_t n, const double *cols, size_t k,
                                     double *products, int32_t *lo, int32_t *hi) {
    __m256i vlo = _mm256_set1_epi32(*lo), vhi = _mm256_set1_epi32(*hi);
    double block[ROWS * 8];
    for (size_t r0 = 0; r0 < rows; r0 += ROWS) {
        const int32_t *ptrs[ROWS];
        for (int i = 0; i < ROWS; i++) ptrs[i] = c + (r0 + i < rows ? r0 + i : rows - 1) * n;
        int32_dots[k](ptrs, n, cols, block, &vlo, &vhi);
        for (size_t i = 0; i < ROWS && r0 + i < rows; i++) memcpy(products + (r0 + i) * k, block + i * k, 8 * k);
    }
    int32_t los[8], his[8];
    _mm256_storeu_si256((__m256i *)los, vlo);
    _mm256_storeu_si256((__m256i *)his, vhi);
    for (int i = 0; i < 8; i++) {
        *lo = los[i] < *lo ? los[i] : *lo;
        *hi = his[i] > *hi ? his[i] : *hi;
    }
}

PW_TARGET void pw_byte_rows_dot(const uint8_t *x, size_t rows, size_t n, int32_t m, int32_t bound,
                                    const double *cols, size_t k, double *out) {
    double block[ROWS * 8];
    for (size_t r0 = 0; r0 < rows; r0 += ROWS) {
        const uint8_t *ptrs[ROWS];
        for (int i = 0; i < ROWS; i++) ptrs[i] = x + (r0 + i < rows ? r0 + i : rows - 1) * n;
        byte_dots[k](ptrs, n, m, bound, cols, block);
        for (size_t i = 0; i < ROWS && r0 + i < rows; i++) memcpy(out + (r0 + i) * k, block + i * k, 8 * k);
    }
}

#endif
