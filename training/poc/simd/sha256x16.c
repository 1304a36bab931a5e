/* SHA-256 of sixteen messages at once, one per 32-bit lane of the AVX-512 registers.
 *
 * Checking a synthetic result costs O(n^2), and at n = 2048 most of that is SHA-256 over C's
 * rows (16 MiB): hashlib runs one row at a time on the CPU's SHA instructions, about 2 GB/s a
 * core, with a Python call per row. The "multi-buffer" layout hashes sixteen rows together,
 * twice that, with no Python in the loop. FIPS 180-4; the tests compare every function here
 * with hashlib and protocol.merkle.
 */
#include <string.h>

#include "simd.h"

#if PW_SIMD

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

#define LANES 16
#define PREFETCH 512 /* bytes ahead in each row */
#define XOR3(a, b, c) _mm512_ternarylogic_epi32((a), (b), (c), 0x96)
#define ROR(x, n) _mm512_ror_epi32((x), (n))
#define ADD(a, b) _mm512_add_epi32((a), (b))

/* SHA-256 words are big-endian: swap the bytes of each 32-bit lane. */
PW_TARGET static inline __m512i bswap32(__m512i x) {
    const __m512i order = _mm512_broadcast_i32x4(_mm_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12));
    return _mm512_shuffle_epi8(x, order);
}

/* One SHA-256 compression of a 64-byte block in each lane (FIPS 180-4, 6.2.2). */
PW_TARGET static inline void compress(__m512i s[8], __m512i w[16]) {
    __m512i a = s[0], b = s[1], c = s[2], d = s[3], e = s[4], f = s[5], g = s[6], h = s[7];
#pragma GCC unroll 64
    for (int t = 0; t < 64; t++) {
        if (t >= 16) {
            __m512i x15 = w[(t - 15) & 15], x2 = w[(t - 2) & 15];
            __m512i s0 = XOR3(ROR(x15, 7), ROR(x15, 18), _mm512_srli_epi32(x15, 3));
            __m512i s1 = XOR3(ROR(x2, 17), ROR(x2, 19), _mm512_srli_epi32(x2, 10));
            w[t & 15] = ADD(ADD(w[t & 15], s0), ADD(w[(t - 7) & 15], s1));
        }
        __m512i big_s1 = XOR3(ROR(e, 6), ROR(e, 11), ROR(e, 25));
        __m512i ch = _mm512_ternarylogic_epi32(e, f, g, 0xCA);  /* e ? f : g */
        __m512i t1 = ADD(ADD(h, big_s1), ADD(ch, ADD(_mm512_set1_epi32((int)K256[t]), w[t & 15])));
        __m512i big_s0 = XOR3(ROR(a, 2), ROR(a, 13), ROR(a, 22));
        __m512i maj = _mm512_ternarylogic_epi32(a, b, c, 0xE8);  /* majority */
        h = g;
        g = f;
        f = e;
        e = ADD(d, t1);
        d = c;
        c = b;
        b = a;
        a = ADD(t1, ADD(big_s0, maj));
    }
    s[0] = ADD(s[0], a);
    s[1] = ADD(s[1], b);
    s[2] = ADD(s[2], c);
    s[3] = ADD(s[3], d);
    s[4] = ADD(s[4], e);
    s[5] = ADD(s[5], f);
    s[6] = ADD(s[6], g);
    s[7] = ADD(s[7], h);
}

/* w[t] = big-endian word t of the 64 bytes at p + off[lane], for each lane: sixteen loads and a
 * 16x16 transpose of 32-bit words (unpack 32, unpack 64, then two rounds of 128-bit shuffles). */
PW_TARGET static inline void load_words(const uint8_t *p, const int64_t off[LANES], __m512i w[16]) {
    __m512i r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512((const void *)(p + off[i]));
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* r[4i + k] now holds, in its 128-bit lane j, word 4j + k of rows 4i .. 4i + 3. */
    for (int k = 0; k < 4; k++) {
        __m512i ae = _mm512_shuffle_i32x4(r[k], r[4 + k], 0x88), ao = _mm512_shuffle_i32x4(r[k], r[4 + k], 0xDD);
        __m512i be = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0x88), bo = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0xDD);
        w[k] = bswap32(_mm512_shuffle_i32x4(ae, be, 0x88));
        w[8 + k] = bswap32(_mm512_shuffle_i32x4(ae, be, 0xDD));
        w[4 + k] = bswap32(_mm512_shuffle_i32x4(ao, bo, 0x88));
        w[12 + k] = bswap32(_mm512_shuffle_i32x4(ao, bo, 0xDD));
    }
}

/* SHA-256 of sixteen messages at once: message l is prefix[l] (plen bytes) then dlen bytes at
 * base + off[l]. Blocks that lie wholly inside the data are read in place; the first and the
 * last (prefix, 0x80, zeros, bit length) are assembled in a small staging area. The digest of
 * lane l goes to out[l] unless that is NULL (lanes that only repeat another message). */
PW_TARGET static void sha256_x16(const uint8_t *prefix, size_t plen, const uint8_t *base, const int64_t off[LANES],
                                 size_t dlen, uint8_t *out[LANES]) {
    static const int64_t stage_off[LANES] = {0, 64, 128, 192, 256, 320, 384, 448,
                                             512, 576, 640, 704, 768, 832, 896, 960};
    _Alignas(64) uint8_t stage[LANES][64];
    __m512i s[8], w[16];
    for (int i = 0; i < 8; i++) s[i] = _mm512_set1_epi32((int)H0[i]);
    const size_t total = plen + dlen;
    const size_t blocks = (total + 8) / 64 + 1;
    const uint64_t bits = (uint64_t)total * 8;
    for (size_t k = 0; k < blocks; k++) {
        const size_t start = 64 * k, end = start + 64;
        if (start >= plen && end <= total) {
            const uint8_t *p = base + (start - plen);
            if (end + PREFETCH <= total)
                for (int l = 0; l < LANES; l++) _mm_prefetch((const char *)(p + off[l] + PREFETCH), _MM_HINT_T0);
            load_words(p, off, w);
        } else {
            for (int l = 0; l < LANES; l++) {
                uint8_t *dst = stage[l];
                memset(dst, 0, 64);
                if (start < plen) memcpy(dst, prefix + l * plen + start, (end < plen ? end : plen) - start);
                size_t lo = start > plen ? start : plen, hi = end < total ? end : total;
                if (lo < hi) memcpy(dst + (lo - start), base + off[l] + (lo - plen), hi - lo);
                if (total >= start && total < end) dst[total - start] = 0x80;
                if (k == blocks - 1)
                    for (int j = 0; j < 8; j++) dst[56 + j] = (uint8_t)(bits >> (56 - 8 * j));
            }
            load_words(&stage[0][0], stage_off, w);
        }
        compress(s, w);
    }
    _Alignas(64) uint32_t words[8][LANES];
    for (int i = 0; i < 8; i++) _mm512_store_si512((void *)words[i], bswap32(s[i]));
    for (int l = 0; l < LANES; l++) {
        if (out[l] == NULL) continue;
        for (int i = 0; i < 8; i++) memcpy(out[l] + 4 * i, &words[i][l], 4);
    }
}

/* Leaf hashes of `rows` consecutive rows of `row_bytes` bytes at `c`, the first being row
 * `first` of product `pair`. A last group of fewer than sixteen rows repeats its last row in
 * the spare lanes and discards their digests. */
PW_TARGET void pw_leaf_hashes(const uint8_t *c, size_t row_bytes, uint32_t pair, uint32_t first, size_t rows,
                                 uint8_t *out) {
    for (size_t r0 = 0; r0 < rows; r0 += LANES) {
        uint8_t prefix[LANES * 9];
        int64_t off[LANES];
        uint8_t *outs[LANES];
        for (int l = 0; l < LANES; l++) {
            size_t r = r0 + l < rows ? r0 + l : rows - 1;
            uint32_t index = first + (uint32_t)r;
            prefix[l * 9] = 0x00;
            memcpy(prefix + l * 9 + 1, &pair, 4); /* little-endian host: u32le */
            memcpy(prefix + l * 9 + 5, &index, 4);
            off[l] = (int64_t)((r - r0) * row_bytes);
            outs[l] = r0 + l < rows ? out + 32 * (r0 + l) : NULL;
        }
        sha256_x16(prefix, 9, c + r0 * row_bytes, off, row_bytes, outs);
    }
}

/* RFC 6962 root of count >= 1 leaf hashes, level by level: pairs left to right, an odd last
 * node carried up unchanged (the same tree as splitting at the largest power of two). `level`
 * holds count * 32 bytes of scratch. */
PW_TARGET void pw_merkle_root(const uint8_t *leaves, size_t count, uint8_t *level, uint8_t out[32]) {
    static const uint8_t node_prefix[LANES] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    memcpy(level, leaves, count * 32);
    while (count > 1) {
        size_t pairs = count / 2;
        for (size_t p0 = 0; p0 < pairs; p0 += LANES) {
            int64_t off[LANES];
            uint8_t digests[LANES][32];
            uint8_t *outs[LANES];
            for (int l = 0; l < LANES; l++) {
                size_t p = p0 + l < pairs ? p0 + l : pairs - 1;
                off[l] = (int64_t)((p - p0) * 64);
                outs[l] = p0 + l < pairs ? digests[l] : NULL;
            }
            /* Node p reads level[2p], level[2p + 1]: all digests are taken before any is written. */
            sha256_x16(node_prefix, 1, level + p0 * 64, off, 64, outs);
            for (int l = 0; l < LANES && p0 + l < pairs; l++) memcpy(level + (p0 + l) * 32, digests[l], 32);
        }
        if (count % 2) memmove(level + pairs * 32, level + (count - 1) * 32, 32);
        count = pairs + count % 2;
    }
    memcpy(out, level, 32);
}

#endif
