/* Shared by the PoC verifier's kernels (training/poc/_simd.c binds them to Python).
 *
 * Built on every platform; the AVX-512 code exists only on x86-64 with GCC or Clang
 * (PW_SIMD), and runs only where pw_simd_available() says the CPU has it. Little-endian
 * only: leaf data and generator output are byte strings read in place.
 */
#ifndef PW_SIMD_H
#define PW_SIMD_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__) && !(defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__)
#define PW_SIMD 1
#include <immintrin.h>
#define PW_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define PW_TARGET_AES __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,aes,vaes")))
#else
#define PW_SIMD 0
#endif

/* Whether this CPU runs the kernels below (AVX-512 F, BW, VL, DQ), and also VAES and AES-NI. */
int pw_simd_available(void);
int pw_aes_available(void);

#if PW_SIMD
/* RFC 6962 leaf hashes of `rows` rows of `row_bytes` bytes at c, the first being row `first`
 * of product `pair` (leaf data: u32le pair | u32le row | the row's bytes), 32 bytes each. */
void pw_leaf_hashes(const uint8_t *c, size_t row_bytes, uint32_t pair, uint32_t first, size_t rows, uint8_t *out);
/* RFC 6962 root of count >= 1 leaf hashes; `scratch` holds count * 32 bytes. */
void pw_merkle_root(const uint8_t *leaves, size_t count, uint8_t *scratch, uint8_t out[32]);
/* products[r*k + q] = sum_j c[r][j] * cols[q*n + j] over `rows` int32 rows of n entries, in
 * float64; *lo and *hi fold in the smallest and largest entry. k <= 8. */
void pw_int32_rows_dot(const int32_t *c, size_t rows, size_t n, const double *cols, size_t k, double *products,
                       int32_t *lo, int32_t *hi);
/* The same for rows of generator bytes x: entry ((x*m) >> 8) - bound, or x as int8 when m == 0. */
void pw_byte_rows_dot(const uint8_t *x, size_t rows, size_t n, int32_t m, int32_t bound, const double *cols,
                      size_t k, double *out);
/* V.R for rows [start, stop) of an aes256ctr matrix with this 32-byte key: each row's keystream
 * is made, mapped and multiplied in L1-sized pieces, never stored. Returns 0, or -1 when it
 * cannot allocate its buffer. Needs pw_aes_available(). */
int pw_aes_rows_dot(const uint8_t key[32], size_t n, size_t start, size_t stop, int32_t m, int32_t bound,
                    const double *cols, size_t k, double *out);
#endif

#endif
