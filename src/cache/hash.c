/* The hash of hash.h. Lanes: lane = rotl(lane + word * M2, 31) * M1 per
 * 8-byte word of a stripe; final: the lanes folded with rotations, the
 * length and the tail words mixed in, then the splitmix64 finalizer. */
#include "cache/hash.h"

#include <string.h>

#define M1 0x9E3779B185EBCA87ull
#define M2 0xC2B2AE3D27D4EB4Full
#define M3 0x165667B19E3779F9ull

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t word(const unsigned char *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

static inline uint64_t round64(uint64_t lane, uint64_t w) { return rotl(lane + w * M2, 31) * M1; }

static void stripes(og_hash *h, const unsigned char *p, size_t n_stripes) {
    uint64_t a = h->lane[0], b = h->lane[1], c = h->lane[2], d = h->lane[3];
    for (size_t i = 0; i < n_stripes; i++, p += 32) {
        a = round64(a, word(p));
        b = round64(b, word(p + 8));
        c = round64(c, word(p + 16));
        d = round64(d, word(p + 24));
    }
    h->lane[0] = a, h->lane[1] = b, h->lane[2] = c, h->lane[3] = d;
}

void og_hash_init(og_hash *h, uint64_t seed) {
    memset(h, 0, sizeof *h);
    h->lane[0] = seed + M1 + M2;
    h->lane[1] = seed + M2;
    h->lane[2] = seed;
    h->lane[3] = seed - M1;
}

void og_hash_update(og_hash *h, const void *data, size_t n) {
    const unsigned char *p = data;
    h->total += n;
    if (h->n_buf) {
        size_t take = 32 - h->n_buf < n ? 32 - h->n_buf : n;
        memcpy(h->buf + h->n_buf, p, take);
        h->n_buf += take;
        p += take;
        n -= take;
        if (h->n_buf < 32) return;
        stripes(h, h->buf, 1);
        h->n_buf = 0;
    }
    stripes(h, p, n / 32);
    p += n / 32 * 32;
    n %= 32;
    memcpy(h->buf, p, n);
    h->n_buf = n;
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t og_hash_final(const og_hash *h) {
    uint64_t x = rotl(h->lane[0], 1) + rotl(h->lane[1], 7) + rotl(h->lane[2], 12) + rotl(h->lane[3], 18);
    x = (x ^ h->total) * M3;
    size_t i = 0;
    for (; i + 8 <= h->n_buf; i += 8) x = rotl(x ^ round64(0, word(h->buf + i)), 27) * M1 + M3;
    uint64_t t = 0;
    for (size_t k = 0; i + k < h->n_buf; k++) t |= (uint64_t)h->buf[i + k] << (8 * k);
    x = rotl(x ^ (t * M1), 23) * M2 + (uint64_t)(h->n_buf - i);
    return mix(x);
}

uint64_t og_hash64(const void *data, size_t n, uint64_t seed) {
    og_hash h;
    og_hash_init(&h, seed);
    og_hash_update(&h, data, n);
    return og_hash_final(&h);
}
