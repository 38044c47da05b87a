/* Internal declarations of the KV manager, for the executor and kernels. */
#ifndef OG_KV_KV_H
#define OG_KV_KV_H

#include "core/core.h"
#include "kv/plan.h"

/* Bytes of one copy of a state (of a validated config). */
int64_t og_kv_state_bytes(const og_kv_state_config *st);

/* Bytes of one row (one position) of one of a layer's k or v: Hkv * D * dtype size. */
int64_t og_kv_row_bytes(const og_kv_config *cfg, const og_kv_layer_config *layer);

/* The plan of the prepared step for one manifest layer (index into
 * cfg->layers). OG_ERR_STATE when no step is prepared, OG_ERR_INVALID_ARGUMENT
 * for a bad index. The plan's slots refer to the storage of
 * og_kv_session_layer_view. */
og_status og_kv_session_plan(const og_kv_session *s, int32_t index, og_kv_plan *out);

/* The session's config (its own copy; layers owned by the session). Borrowed;
 * valid until og_kv_session_destroy. */
const og_kv_config *og_kv_session_config(const og_kv_session *s);

/* The session's allocator (its own copy). Borrowed; valid until destroy. */
const og_kv_allocator *og_kv_session_allocator(const og_kv_session *s);

/* Copies positions [pos0, pos0 + n) of manifest layer `index`'s k (part 0)
 * or v (part 1) between the storage and host memory [n, Hkv, D] (through
 * the allocator's to_host / from_host when it has them). Refuses positions
 * the storage does not hold (flat: rows; ring: n > R). For save/restore;
 * nothing else of the session changes. */
og_status og_kv_session_rows_to_host(const og_kv_session *s, int32_t index, int part, int64_t pos0, int64_t n,
                                     void *dst);
og_status og_kv_session_rows_from_host(og_kv_session *s, int32_t index, int part, int64_t pos0, int64_t n,
                                       const void *src);
/* Where positions [pos0, pos0 + n) of layer `index`'s k (part 0) or v
 * (part 1) live in this process's memory, when they do: *rows points at
 * the first, *pitch is the bytes from one row to the next (the row's own
 * bytes when they are contiguous). False, changing nothing, when the
 * storage is reached only through the allocator's to_host / from_host
 * (device memory), when the positions are not held, or when they wrap
 * around a ring; then og_kv_session_rows_to_host / _from_host copy them.
 * For save/restore, which read and write the rows in place. */
bool og_kv_session_rows_in_host(const og_kv_session *s, int32_t index, int part, int64_t pos0, int64_t n,
                                unsigned char **rows, size_t *pitch);

/* Restore, part 1: storage for `length` positions in an empty session with
 * nothing prepared (flat layers: length rows; ring layers: R), all or
 * nothing; the length stays 0. Then the rows are written
 * (og_kv_session_rows_from_host) and og_kv_session_restore_end sets the
 * length. */
og_status og_kv_session_restore_begin(og_kv_session *s, int64_t length);
/* Copies the committed copy of state `index` to host memory [bytes], or
 * host memory into it (restore, between restore_begin and restore_end). */
og_status og_kv_session_state_to_host(const og_kv_session *s, int32_t index, void *dst);
og_status og_kv_session_state_from_host(og_kv_session *s, int32_t index, const void *src);
void og_kv_session_restore_end(og_kv_session *s, int64_t length);

#endif /* OG_KV_KV_H */
