/* Internal declarations of the KV manager, for the executor and kernels. */
#ifndef OG_KV_KV_H
#define OG_KV_KV_H

#include "core/core.h"
#include "kv/plan.h"

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

#endif /* OG_KV_KV_H */
