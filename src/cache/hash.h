/* A 64-bit non-cryptographic hash for checksums and keys: four lanes of
 * multiply-rotate rounds over 32-byte stripes (several GB/s a core), a
 * finalizer that mixes every bit. Streaming: og_hash_update may be called
 * with any split of the bytes and gives what one call over all of them
 * gives. Not for adversarial inputs. */
#ifndef OG_CACHE_HASH_H
#define OG_CACHE_HASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct og_hash {
    uint64_t lane[4];
    uint64_t total;       /* bytes hashed so far          */
    unsigned char buf[32];/* a stripe not yet complete    */
    size_t n_buf;
} og_hash;

void og_hash_init(og_hash *h, uint64_t seed);
void og_hash_update(og_hash *h, const void *data, size_t n);
uint64_t og_hash_final(const og_hash *h);
/* One call: init, update, final. */
uint64_t og_hash64(const void *data, size_t n, uint64_t seed);

#endif
