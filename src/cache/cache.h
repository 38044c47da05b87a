/* Internals of saved sessions (save.c) for tools that work on KV sessions
 * without a model (benchmarks): the file format of og_session_save over a
 * KV session, the program's identity given as its two hashes. */
#ifndef OG_CACHE_CACHE_H
#define OG_CACHE_CACHE_H

#include "offgraph.h"

/* Where a save's time went: hashing and writing every byte (to the page
 * cache), then fsync, rename and the directory's fsync. */
typedef struct og_kv_save_times {
    double write_s, sync_s;
} og_kv_save_times;

/* og_session_save of kv's live rows, with these identity hashes; times
 * (NULL: not wanted) gets where the time went. */
og_status og_kv_save_file(const og_kv_session *kv, uint64_t manifest_hash, uint64_t weights_hash, const char *path,
                          og_kv_save_times *times);
/* og_session_restore_into kv: its geometry (kv dtype included) and these
 * hashes must be the file's. */
og_status og_kv_restore_file(og_kv_session *kv, uint64_t manifest_hash, uint64_t weights_hash, const char *path);

#endif
