/* AES-256 in counter mode with VAES, and V.R straight from the keystream.
 *
 * The aes256ctr generator (generate.py) is AES-256-CTR from a zero counter: entry (i, j) of
 * an n x n matrix comes from keystream byte i*n + j. The verifier needs V.R, not V, so each
 * block of rows is encrypted into an L1-sized buffer, multiplied and dropped. cryptography
 * (OpenSSL) makes the same bytes, but holds the GIL and allocates the output; the tests
 * compare the two for many keys, sizes and offsets.
 *
 * Key expansion: FIPS 197 5.2 with AESKEYGENASSIST (Intel's AES-NI white paper, figure 26).
 * Counter blocks are 128-bit big-endian; matrices have at most 2^28 bytes (2^24 blocks), so
 * only the low 32 bits of a counter are ever non-zero.
 */
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#if PW_SIMD

int pw_simd_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

int pw_aes_available(void) {
    __builtin_cpu_init();
    return pw_simd_available() && __builtin_cpu_supports("aes") && __builtin_cpu_supports("vaes");
}

PW_TARGET_AES static inline __m128i expand_even(__m128i previous, __m128i assist) {
    assist = _mm_shuffle_epi32(assist, 0xff);
    previous = _mm_xor_si128(previous, _mm_slli_si128(previous, 4));
    previous = _mm_xor_si128(previous, _mm_slli_si128(previous, 4));
    previous = _mm_xor_si128(previous, _mm_slli_si128(previous, 4));
    return _mm_xor_si128(previous, assist);
}

PW_TARGET_AES static inline __m128i expand_odd(__m128i even, __m128i previous) {
    __m128i assist = _mm_shuffle_epi32(_mm_aeskeygenassist_si128(even, 0x00), 0xaa);
    previous = _mm_xor_si128(previous, _mm_slli_si128(previous, 4));
    previous = _mm_xor_si128(previous, _mm_slli_si128(previous, 4));
    previous = _mm_xor_si128(previous, _mm_slli_si128(previous, 4));
    return _mm_xor_si128(previous, assist);
}

/* The 15 round keys of AES-256, each broadcast to the four 128-bit lanes of a register. */
PW_TARGET_AES static void expand_key(const uint8_t key[32], __m512i rk[15]) {
    __m128i k[15];
    k[0] = _mm_loadu_si128((const __m128i *)key);
    k[1] = _mm_loadu_si128((const __m128i *)(key + 16));
#define PW_EXPAND(i, rcon)                                                        \
    k[i] = expand_even(k[i - 2], _mm_aeskeygenassist_si128(k[i - 1], (rcon))); \
    if ((i) + 1 < 15) k[(i) + 1] = expand_odd(k[i], k[i - 1]);
    PW_EXPAND(2, 0x01)
    PW_EXPAND(4, 0x02)
    PW_EXPAND(6, 0x04)
    PW_EXPAND(8, 0x08)
    PW_EXPAND(10, 0x10)
    PW_EXPAND(12, 0x20)
    PW_EXPAND(14, 0x40)
#undef PW_EXPAND
    for (int i = 0; i < 15; i++) rk[i] = _mm512_broadcast_i32x4(k[i]);
}

/* Keystream blocks first .. first + count - 1 into out (16 * count bytes); first + count <= 2^32. */
PW_TARGET_AES static void ctr_blocks(const __m512i rk[15], uint32_t first, size_t count, uint8_t *out) {
    /* 32-bit lane 4b + 3 of a register holds block b's counter; bswap puts it big-endian in
     * bytes 12..15 of the block, the other lanes stay zero. */
    const __m512i order = _mm512_broadcast_i32x4(_mm_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12));
    const __m512i step = _mm512_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4);
    __m512i counter = _mm512_add_epi32(_mm512_set1_epi32(0), _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2,
                                                                                0, 0, 0, 3));
    counter = _mm512_add_epi32(counter, _mm512_maskz_set1_epi32(0x8888, (int)first));
    size_t b = 0;
    for (; b + 16 <= count; b += 16) { /* four registers in flight hide the rounds' latency */
        __m512i x[4];
        for (int i = 0; i < 4; i++) {
            x[i] = _mm512_xor_si512(_mm512_shuffle_epi8(counter, order), rk[0]);
            counter = _mm512_add_epi32(counter, step);
        }
        for (int r = 1; r < 14; r++)
            for (int i = 0; i < 4; i++) x[i] = _mm512_aesenc_epi128(x[i], rk[r]);
        for (int i = 0; i < 4; i++) _mm512_storeu_si512((void *)(out + 16 * (b + 4 * i)), _mm512_aesenclast_epi128(x[i], rk[14]));
    }
    for (; b < count; b += 4) {
        __m512i x = _mm512_xor_si512(_mm512_shuffle_epi8(counter, order), rk[0]);
        counter = _mm512_add_epi32(counter, step);
        for (int r = 1; r < 14; r++) x = _mm512_aesenc_epi128(x, rk[r]);
        x = _mm512_aesenclast_epi128(x, rk[14]);
        size_t left = count - b < 4 ? count - b : 4;
        _mm512_mask_storeu_epi8((void *)(out + 16 * b), left == 4 ? ~(__mmask64)0 : (((__mmask64)1 << (16 * left)) - 1),
                                x);
    }
}

#define PIECE_ROWS 4 /* rows of keystream made at a time: 8 KiB at n = 2048 */

PW_TARGET_AES int pw_aes_rows_dot(const uint8_t key[32], size_t n, size_t start, size_t stop, int32_t m,
                                  int32_t bound, const double *cols, size_t k, double *out) {
    __m512i rk[15];
    expand_key(key, rk);
    uint8_t *buffer = malloc(PIECE_ROWS * n + 64);
    if (buffer == NULL) return -1;
    for (size_t lo = start; lo < stop; lo += PIECE_ROWS) {
        size_t hi = stop - lo < PIECE_ROWS ? stop : lo + PIECE_ROWS;
        size_t first = lo * n, last = hi * n; /* keystream bytes [first, last) */
        size_t block = first / 16, skip = first % 16;
        ctr_blocks(rk, (uint32_t)block, (last - 16 * block + 15) / 16, buffer);
        pw_byte_rows_dot(buffer + skip, hi - lo, n, m, bound, cols, k, out + (lo - start) * k);
    }
    free(buffer);
    return 0;
}

#else /* !PW_SIMD */

int pw_simd_available(void) { return 0; }
int pw_aes_available(void) { return 0; }

#endif
