/*
 * offgraph: an LLM inference runtime whose KV cache lives off the model graph.
 *
 * This is the whole public C API. Handles are opaque; every function that
 * can fail returns an og_status; every function that returns a pointer says
 * who owns it. Destroying NULL is a no-op. The library never exits or aborts
 * on bad input: it returns a status and keeps a message naming what was wrong
 * (og_last_error() for calls without a handle, *_last_error() for handles).
 */
#ifndef OFFGRAPH_H
#define OFFGRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OG_VERSION_MAJOR 0
#define OG_VERSION_MINOR 1

/* OG_API marks each function of this API; it is the only thing
 * liboffgraph.so exports. The library is compiled with hidden visibility
 * (-fvisibility=hidden), so everything else it holds stays internal; with
 * GCC and Clang OG_API gives the declarations default visibility, elsewhere
 * it is empty. A program may define OG_API itself before including this
 * header (e.g. to add an import attribute). The rule scripts/check_exports.sh
 * reads this header by: every function declaration here starts on a line
 * that begins with OG_API; it checks that the library exports exactly the
 * functions so declared. */
#ifndef OG_API
#if defined(__GNUC__) || defined(__clang__)
#define OG_API __attribute__((visibility("default")))
#else
#define OG_API
#endif
#endif

/* ---------------------------------------------------------------- core */

/* Status codes. New values are only ever added at the end. */
typedef enum og_status {
    OG_OK = 0,
    OG_ERR_INVALID_ARGUMENT, /* a NULL or out-of-range argument            */
    OG_ERR_OUT_OF_MEMORY,    /* an allocation failed (or was made to fail) */
    OG_ERR_INVALID_CONFIG,   /* a KV-manifest rule is broken (og_kv_rule)  */
    OG_ERR_WRITE_TOO_WIDE,   /* a step of T > max_write tokens             */
    OG_ERR_CAPACITY,         /* a flat write past max_capacity             */
    OG_ERR_POSITION,         /* positions disagree with committed length   */
    OG_ERR_UNBOUND,          /* a step whose runtime tensors are unbound   */
    OG_ERR_IO,               /* a file could not be read or written        */
    OG_ERR_FORMAT,           /* a file is malformed (message names rule)   */
    OG_ERR_UNSUPPORTED,      /* valid input this build cannot handle       */
    OG_ERR_STATE,            /* a call out of order (commit w/o prepare)   */
    OG_ERR_BACKEND,          /* a device/back-end call failed              */
    OG_ERR_NO_DEVICE,        /* the requested device is not present        */
    OG_ERR_BUSY              /* no room now (a full queue): retry later    */
} og_status;

/* Returns a static string naming the status; never NULL. */
OG_API const char *og_status_str(og_status s);

/* The message of the last failure on this thread for calls that take no
 * handle (e.g. og_kv_config_validate). Owned by the library; valid until the
 * next failing call on the same thread. Never NULL. */
OG_API const char *og_last_error(void);

/* Element types of tensors and KV storage. */
typedef enum og_dtype {
    OG_DTYPE_F32 = 0,
    OG_DTYPE_BF16 = 1,
    OG_DTYPE_F16 = 2,
    OG_DTYPE_I32 = 3,
    OG_DTYPE_I64 = 4,
    OG_DTYPE_Q8 = 5,   /* weights: int8 in groups of OG_QUANT_GROUP, f16 scale each   */
    OG_DTYPE_Q4 = 6,   /* weights: 4-bit in groups of OG_QUANT_GROUP, f16 scale each  */
    OG_DTYPE_INT8 = 7, /* KV storage: int8 with a scale per token and head           */
    OG_DTYPE_FP8 = 8,  /* KV storage: fp8 e4m3 with a scale per token and head       */
    /* weights: llama.cpp's k-quant super-blocks of OG_KQUANT_BLOCK elements,
     * each block's bytes exactly as a GGUF file stores them */
    OG_DTYPE_Q2_K = 9,
    OG_DTYPE_Q3_K = 10,
    OG_DTYPE_Q4_K = 11,
    OG_DTYPE_Q5_K = 12,
    OG_DTYPE_Q6_K = 13,
    OG_DTYPE_COUNT
} og_dtype;

/* Quantized weights (q8, q4) are [N, K] matrices quantized in groups of
 * OG_QUANT_GROUP consecutive elements of a row (K a multiple of it), each
 * group with its own f16 scale: element = scale * q. The bytes are two
 * planes: the quants of all rows, row-major (q8: K int8 per row; q4: K/2
 * bytes per row, byte j of a group holding element j in its low nibble and
 * element j + 16 in its high one, each as q + 8 in 0..15), then the scales,
 * [N, K / OG_QUANT_GROUP] f16. A rank-3 quantized tensor [E, N, K] (the
 * experts of a mixture-of-experts layer) is E such matrices one after the
 * other. docs/program-format.md has the details. */
#define OG_QUANT_GROUP 32

/* The k-quants (q2_k, q3_k, q4_k, q5_k, q6_k) are [N, K] matrices, K a
 * multiple of OG_KQUANT_BLOCK, each row a run of super-blocks of 256
 * elements (84, 110, 144, 176 and 210 bytes) laid out as llama.cpp's GGUF
 * files hold them: sub-block scales (and mins) packed in the block, f16
 * super-block scales. docs/program-format.md has the layouts. */
#define OG_KQUANT_BLOCK 256

/* Bytes per element of dtype; 0 for an unknown value and for the quantized
 * dtypes, whose elements are not whole bytes (og_tensor_bytes sizes those). */
OG_API size_t og_dtype_size(og_dtype dt);
/* True for the quantized weight dtypes: q8, q4 and the k-quants. */
OG_API bool og_dtype_is_quantized(og_dtype dt);
/* True for the k-quants (OG_DTYPE_Q2_K .. OG_DTYPE_Q6_K). */
OG_API bool og_dtype_is_kquant(og_dtype dt);
/* Bytes of a tensor of dtype and shape (rank 1..4, dims > 0) into *bytes.
 * Quantized dtypes need rank 2 (q8 and q4 also 3: a stack of matrices)
 * and a last dim that is a multiple of OG_QUANT_GROUP (q8, q4) or
 * OG_KQUANT_BLOCK (k-quants). False, *bytes untouched, when the dtype is unknown, the shape
 * does not suit it or the count overflows int64. */
OG_API bool og_tensor_bytes(og_dtype dt, int32_t rank, const int64_t *shape, int64_t *bytes);
/* Short lower-case name ("f32", "bf16", ...); "unknown" otherwise. */
OG_API const char *og_dtype_name(og_dtype dt);
/* Parses a name as written by og_dtype_name; returns OG_ERR_INVALID_ARGUMENT
 * for an unknown name. */
OG_API og_status og_dtype_parse(const char *name, og_dtype *out);

/* Logging: messages at or above the level go to stderr. Default: WARN. */
typedef enum og_log_level {
    OG_LOG_DEBUG = 0,
    OG_LOG_INFO,
    OG_LOG_WARN,
    OG_LOG_ERROR,
    OG_LOG_NONE
} og_log_level;
OG_API void og_log_set_level(og_log_level level);

/* Host allocator hooks for every long-lived host allocation the library
 * makes. NULL members restore the defaults (malloc/realloc/free). */
typedef struct og_host_allocator {
    void *(*alloc)(size_t bytes, void *user);
    void *(*realloc)(void *ptr, size_t bytes, void *user);
    void (*free)(void *ptr, void *user);
    void *user;
} og_host_allocator;
OG_API void og_set_host_allocator(const og_host_allocator *a);

/* ------------------------------------------------------- KV manifest */

typedef enum og_kv_policy {
    OG_KV_FLAT = 0, /* full causal history, grows geometrically   */
    OG_KV_RING = 1  /* sliding window W, fixed R = W + max_write - 1 */
} og_kv_policy;

/* One attention layer's KV storage declaration. */
typedef struct og_kv_layer_config {
    int32_t layer_id;   /* the model layer this storage belongs to */
    og_kv_policy policy;
    int32_t window;     /* W: > 0 for ring, 0 for flat          */
    int32_t n_kv_heads; /* Hkv                                  */
    int32_t head_dim;   /* D                                    */
} og_kv_layer_config;

#define OG_KV_MANIFEST_VERSION 1

/* One per-session state tensor, the third storage kind beside flat and ring
 * KV (a hybrid model's Gated DeltaNet layers keep a recurrent state and a
 * convolution state): a fixed shape, no rows, never grows, rewritten whole by
 * every step of its layer. A session holds two copies (the committed state
 * and the one a step writes; its commit swaps them), allocated when the
 * session is created. At length 0 a state is zero by definition: kernels do
 * not read it then, so a new or reset session needs no clearing. */
#define OG_KV_STATE_NAME_CAP 16
#define OG_KV_STATE_MAX_RANK 4
typedef struct og_kv_state_config {
    int32_t layer_id;                    /* the model layer that owns it        */
    char name[OG_KV_STATE_NAME_CAP];     /* unique within the layer, e.g. "conv" */
    og_dtype dtype;                      /* OG_DTYPE_F32                        */
    int32_t rank;                        /* 1 .. OG_KV_STATE_MAX_RANK           */
    int64_t shape[OG_KV_STATE_MAX_RANK];
} og_kv_state_config;

/* The KV manifest: what a program declares about the storage it attends over. */
typedef struct og_kv_config {
    int32_t version;          /* OG_KV_MANIFEST_VERSION              */
    og_dtype kv_dtype;        /* OG_DTYPE_BF16, _F32, _INT8 or _FP8  */
    int64_t max_capacity;     /* hard bound on a session's tokens    */
    int64_t initial_capacity; /* rows a flat layer starts with       */
    int32_t max_write;        /* most tokens one step may write      */
    int32_t n_model_layers;   /* layer ids must be < this; 0 = no bound */
    int32_t n_layers;         /* entries in layers                   */
    const og_kv_layer_config *layers; /* borrowed; copied by sessions */
    int32_t n_states;         /* entries in states (0: none)         */
    const og_kv_state_config *states; /* borrowed; copied by sessions */
} og_kv_config;

/* Every manifest rule, so that a refusal can be tested by its name. */
typedef enum og_kv_rule {
    OG_KV_RULE_NONE = 0,
    OG_KV_RULE_VERSION,          /* version == OG_KV_MANIFEST_VERSION        */
    OG_KV_RULE_KV_DTYPE,         /* kv_dtype is bf16, f32, int8 or fp8       */
    OG_KV_RULE_MAX_CAPACITY,     /* max_capacity > 0                         */
    OG_KV_RULE_INITIAL_CAPACITY, /* 0 < initial_capacity <= max_capacity     */
    OG_KV_RULE_MAX_WRITE,        /* 1 <= max_write <= max_capacity           */
    OG_KV_RULE_LAYER_COUNT,      /* n_layers >= 1 and layers != NULL (or n_layers 0 with states) */
    OG_KV_RULE_LAYER_ID_RANGE,   /* 0 <= layer_id (< n_model_layers if set)  */
    OG_KV_RULE_LAYER_ID_UNIQUE,  /* no two entries share a layer_id          */
    OG_KV_RULE_POLICY,           /* policy is flat or ring                   */
    OG_KV_RULE_RING_WINDOW,      /* ring => window > 0                       */
    OG_KV_RULE_FLAT_WINDOW,      /* flat => window == 0                      */
    OG_KV_RULE_KV_HEADS,         /* n_kv_heads > 0                           */
    OG_KV_RULE_HEAD_DIM,         /* head_dim > 0                             */
    OG_KV_RULE_SIZE_OVERFLOW,    /* storage byte counts fit in 64 bits       */
    OG_KV_RULE_STATE_OWNER,      /* a state's layer_id in range              */
    OG_KV_RULE_STATE_NAME,       /* a state's name is 1..15 characters and unique in its layer */
    OG_KV_RULE_STATE_DTYPE,      /* a state's dtype is f32                   */
    OG_KV_RULE_STATE_SHAPE,      /* rank 1..4, dims > 0, bytes fit in 64 bits */
    OG_KV_RULE_COUNT
} og_kv_rule;

/* Static name of a rule, e.g. "ring_window"; never NULL. */
OG_API const char *og_kv_rule_name(og_kv_rule r);

/* Checks every rule in the order of the enum. Returns OG_OK, or
 * OG_ERR_INVALID_CONFIG with *broken (if non-NULL) set to the first broken
 * rule and og_last_error() naming the rule, the layer and the bad value. */
OG_API og_status og_kv_config_validate(const og_kv_config *cfg, og_kv_rule *broken);

/* Ring capacity R = W + max_write - 1 for a ring layer; for a flat layer,
 * max_capacity. */
OG_API int64_t og_kv_layer_slots(const og_kv_config *cfg, const og_kv_layer_config *layer);

/* ------------------------------------------------- storage allocators */

/* Where a session's KV storage comes from. The CPU allocator uses the host
 * heap; the CUDA allocator (cuda builds) uses device memory and orders its
 * copies on a stream. Every call may fail; sessions roll back on failure.
 * An allocator is called from several threads at once (a step of many
 * sessions prepares them in parallel, and steps of one model may run on
 * several threads), so its functions must be safe to call that way. */
typedef struct og_kv_allocator {
    og_status (*alloc)(void *ctx, size_t bytes, void **out);
    /* frees an allocation or a whole reservation */
    void (*free)(void *ctx, void *ptr);
    /* copies bytes between two allocations of this allocator */
    og_status (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    void *ctx;
    /* Optional growth in place: both set, or both NULL (then a session grows
     * a flat layer by alloc + copy + free, and its addresses move).
     * reserve takes address space for max_bytes at an address that never
     * changes and backs its first `bytes` (0 < bytes <= max_bytes) with
     * memory. resize backs the first `bytes` (0 < bytes <= max_bytes) of a
     * reserved block: more to grow, fewer to give a growth back (memory past
     * them is released as far as the allocator's granularity allows); the
     * address and the contents of what stays backed are kept. A failed
     * reserve leaves nothing behind, a failed resize leaves the block backed
     * as it was. */
    og_status (*reserve)(void *ctx, size_t max_bytes, size_t bytes, void **out);
    og_status (*resize)(void *ctx, void *ptr, size_t bytes);
    /* Bytes reserve and resize back at a time: a block asked to back `bytes`
     * holds bytes rounded up to a multiple of it (metrics count that). 0
     * means exact. Meaningful only with reserve/resize. */
    size_t granularity;
    /* Optional sharing, for og_kv_session_fork (NULL: a fork copies rows).
     * share reserves a new block as reserve(max_bytes, bytes) does, except
     * that its first shared_bytes are the very memory of the first
     * shared_bytes of src: a block reserved (or shared) by an allocator with
     * this same share function, whose ctx is src_ctx (it may be ctx).
     * shared_bytes is a multiple of granularity, at most `bytes` and at most
     * what src backs; the rest up to `bytes` is new memory. Nothing is
     * copied. Memory is counted by the blocks that map it and given back
     * when the last of them lets it go (free, or a resize below it). Neither
     * block may ever write the shared bytes (sessions never do: the flat
     * rows below a fork point were written once and stay as they are). A
     * failed share leaves nothing behind. */
    og_status (*share)(void *ctx, void *src_ctx, void *src, size_t shared_bytes, size_t max_bytes,
                       size_t bytes, void **out);
    /* Optional, both or neither, for storage the host cannot address
     * (device memory); NULL means storage is host memory, copied with
     * memcpy. Each copies `rows` rows of `width` bytes, consecutive rows
     * src_pitch bytes apart in src and dst_pitch bytes apart in dst, between
     * the host (dst of to_host, src of from_host) and storage of this
     * allocator, and returns when the copy is complete. */
    og_status (*to_host)(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                         size_t width, size_t rows);
    og_status (*from_host)(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                           size_t width, size_t rows);
} og_kv_allocator;

/* The host-heap allocator. Returned by value; needs no cleanup. Blocks of
 * 64 KiB and more that sessions free are kept for later sessions (up to
 * 256 MiB in all, for the life of the process) rather than given back to
 * the system, whose fresh pages fault at their first write. */
OG_API og_kv_allocator og_kv_allocator_cpu(void);

/* A host allocator that grows in place, in pages: reserve maps address space
 * for max_bytes that nothing may touch, and makes its first bytes (rounded
 * up to whole pages) readable and writable; resize makes more pages of it
 * accessible, or gives the pages wholly past the new size back to the
 * system (their contents are lost). Addresses never change. granularity is
 * the page size. Blocks are backed by anonymous shared-memory files
 * (memfd), so share maps the same pages of one block into another without
 * copying (fork); pages go back to the system when no block maps them. alloc/free/copy of other blocks use the host heap; free
 * tells the two apart. Touching a page past what is backed faults.
 * OG_ERR_UNSUPPORTED where the system cannot reserve address space. On
 * success *out must be released with og_kv_allocator_paged_release after
 * every session using it is destroyed; its calls may come from several
 * threads. */
OG_API og_status og_kv_allocator_paged(og_kv_allocator *out);
/* Releases what og_kv_allocator_paged holds (reservations still live are
 * unmapped, with a warning) and zeroes *a; a no-op for other allocators and
 * NULL. */
OG_API void og_kv_allocator_paged_release(og_kv_allocator *a);

/* Fault injection: an allocator that forwards to `inner` but fails the
 * fail_at-th allocation (1-based, counted since the last arm) with
 * OG_ERR_OUT_OF_MEMORY. When inner grows in place, so does the returned
 * allocator, and every reserve and resize counts as an allocation (a resize
 * that shrinks too, so that rollbacks meet failures as well); so does every
 * share when inner shares (a share's source must be a block of another
 * fault-injecting allocator over the same kind of inner allocator).
 * to_host / from_host are forwarded as they are.
 * fail_at == 0 never fails. `state` is owned by the
 * caller and must outlive every session that uses the returned allocator. */
typedef struct og_kv_fault_state {
    og_kv_allocator inner;
    int64_t fail_at;     /* which allocation fails, 0 = none   */
    int64_t alloc_calls; /* allocations seen since the last arm */
    int64_t failures;    /* allocations refused so far          */
} og_kv_fault_state;
OG_API og_kv_allocator og_kv_allocator_faulty(og_kv_fault_state *state);
/* Re-arms: the fail_at-th allocation from now on fails. */
OG_API void og_kv_fault_arm(og_kv_fault_state *state, int64_t fail_at);

/* ------------------------------------------------------------ sessions */

typedef struct og_kv_session og_kv_session;

/* Creates a session over cfg (validated; copied, so cfg may be freed).
 * alloc NULL means the CPU allocator; a non-NULL allocator is copied by value
 * and its ctx must outlive the session. No storage is allocated until the
 * first prepare. On success *out is owned by the caller: og_kv_session_destroy.
 *
 * Layout. With an allocator that grows in place (reserve/resize) the session
 * packs its flat layers: one block, reserved once for max_capacity rows,
 * whose row p holds position p's k row and v row of every flat layer, in
 * manifest order (k of the first flat layer, its v, k of the next, ...), each
 * starting on a 16-byte boundary of the row. Growth backs more of the same
 * block (resize) to exactly the rows needed rounded up to the allocator's
 * granularity, so nothing ever moves and the block holds at most one
 * granule more than the rows the step needs. Ring layers share one fixed
 * block of their own (alloc, at the first prepare), each layer's k then v
 * dense [R, Hkv, D]. A packed layer's view reports the packed row's width
 * as row_stride. With any other allocator every layer has its own dense k
 * and v blocks (row_stride 0), and a flat layer grows geometrically from
 * initial_capacity by alloc + copy + free. */
OG_API og_status og_kv_session_create(const og_kv_config *cfg, const og_kv_allocator *alloc,
                                      og_kv_session **out);
/* Frees the session and all of its storage. NULL is a no-op. */
OG_API void og_kv_session_destroy(og_kv_session *s);
/* Sets the committed length to 0; keeps (does not free or clear) storage. */
OG_API void og_kv_session_reset(og_kv_session *s);

/* Committed logical length L. */
OG_API int64_t og_kv_session_length(const og_kv_session *s);

/* Step transaction, part 1. Plans every layer for a step of T tokens at the
 * committed length, then allocates or grows storage all-or-nothing and binds
 * it. Refused before anything changes: T < 1 (OG_ERR_INVALID_ARGUMENT),
 * T > max_write (OG_ERR_WRITE_TOO_WIDE), L + T > max_capacity
 * (OG_ERR_CAPACITY), a step already prepared (OG_ERR_STATE). On an
 * allocation failure every layer keeps the storage, rows and length it had. */
OG_API og_status og_kv_session_prepare(og_kv_session *s, int32_t T);
/* Step transaction, part 2: advances L by T. T must equal the prepared width. */
OG_API og_status og_kv_session_commit(og_kv_session *s, int32_t T);
/* Drops a prepared step without advancing L (storage growth is kept: rows
 * past L are never read). No-op when nothing is prepared. */
OG_API void og_kv_session_abort(og_kv_session *s);
/* Drops a prepared step and undoes what its prepare did to the storage:
 * blocks it allocated are freed, layers it moved are back at their old
 * blocks (a dense prepare keeps a replaced block until commit or abort for
 * this), packed blocks are resized back, and the counters are as before.
 * Only memory a failed shrink could not give back may stay backed. This is
 * what a batched step does to every session when any of them fails. No-op
 * when nothing is prepared. */
OG_API void og_kv_session_rollback(og_kv_session *s);

/* Message of the last failure on this session; never NULL. Owned by the
 * session, valid until its next call. */
OG_API const char *og_kv_session_last_error(const og_kv_session *s);

/* The storage a step binds for one manifest layer (index into cfg->layers).
 * Pointers are borrowed from the session and valid until the next prepare,
 * reset or destroy. Sequence-major: row `slot` of k is at
 * k + slot * og_kv_layer_view_row_stride(view) elements (n_kv_heads *
 * head_dim of them belong to the layer; in a packed block the rest of the
 * stride is other layers' rows, which a kernel must never touch). int8 and
 * fp8 elements are bytes, and a row of the layer is its Hkv * D quants, Hkv
 * f32 scales and zero padding to 16 bytes (docs/program-format.md). */
typedef struct og_kv_layer_view {
    int32_t layer_id;
    og_kv_policy policy;
    og_dtype dtype;
    int32_t window;     /* W (ring) or 0                          */
    int32_t n_kv_heads; /* Hkv                                    */
    int32_t head_dim;   /* D                                      */
    int64_t rows;       /* allocated rows: flat capacity, ring R  */
    int64_t length;     /* committed length L                     */
    void *k;            /* [rows, Hkv, D] of dtype, NULL if unbound */
    void *v;            /* [rows, Hkv, D] of dtype, NULL if unbound */
    /* Elements from one row to the next; 0 means dense: Hkv * D, or for
     * int8 / fp8 the row's bytes (quants, scales, padding). A session that
     * packs the rows of several layers into one block (see
     * og_kv_session_create) reports the packed row's width. */
    int64_t row_stride;
} og_kv_layer_view;
OG_API og_status og_kv_session_layer_view(const og_kv_session *s, int32_t index, og_kv_layer_view *out);
/* Elements between consecutive rows of the view: row_stride, or when it is
 * 0 the dense row: Hkv * D, or round_up(Hkv * (D + 4), 16) bytes for int8
 * and fp8. */
OG_API int64_t og_kv_layer_view_row_stride(const og_kv_layer_view *v);

/* The storage a step binds for one state of the manifest (index into
 * cfg->states). `read` holds the committed state (what the session's
 * length L left), `write` the other copy, which a prepared step fills with
 * the state after it; the step's commit makes `write` the committed one, an
 * abort or rollback leaves `read` as it was. Both are [shape] of dtype,
 * row-major, valid until the next prepare, commit, reset or destroy. At
 * length 0 the state is zero by definition and `read` is not to be read. */
typedef struct og_kv_state_view {
    int32_t layer_id;
    const char *name;   /* borrowed from the session */
    og_dtype dtype;
    int32_t rank;
    int64_t shape[OG_KV_STATE_MAX_RANK];
    int64_t bytes;      /* of one copy */
    int64_t length;     /* committed length L */
    void *read;
    void *write;
} og_kv_state_view;
OG_API og_status og_kv_session_state_view(const og_kv_session *s, int32_t index, og_kv_state_view *out);

/* Keeps a copy of the session's committed state (every state of the
 * manifest) at its length L, so that og_kv_session_fork can later start a
 * session there; it replaces the previous checkpoint (a session keeps one).
 * The copy is allocated on first use and counted in the metrics. OG_OK and
 * nothing kept for a manifest without states (any length is a fork point
 * there); OG_ERR_STATE with a step prepared; an allocation or copy failure
 * keeps the previous checkpoint. */
OG_API og_status og_kv_session_checkpoint(og_kv_session *s);
/* The length of the session's checkpoint, -1 when it has none. */
OG_API int64_t og_kv_session_checkpoint_length(const og_kv_session *s);
/* The largest length p <= at_most the session can be forked at (see
 * og_kv_session_fork), or -1 when there is none: without states every p
 * from og_kv_session_fork_floor to L; with states only 0, L and the
 * checkpoint's length (those at or above the floor). */
OG_API int64_t og_kv_session_fork_point(const og_kv_session *s, int64_t at_most);

/* Per-session metrics. */
typedef struct og_kv_metrics {
    int64_t length;          /* committed tokens L                        */
    int32_t n_layers;
    int64_t rows_allocated;  /* sum over layers of allocated rows         */
    /* KV bytes held, as the allocator backs them: per-layer blocks their
     * exact size; a packed block its backed size (rounded up to the
     * allocator's granularity, including row padding and memory a failed
     * rollback could not give back); the ring block its exact size. */
    int64_t bytes_allocated;
    int64_t bytes_live;      /* KV bytes the committed tokens occupy (k and v,
                                Hkv * D elements a row, no padding)       */
    int64_t growth_count;    /* storage growths: one per layer grown (moved or in place) */
    int64_t rebinds;         /* prepares whose bound addresses changed    */
    int64_t graph_captures;  /* CUDA graph captures (exec increments)     */
    int64_t steps;           /* committed steps                           */
    /* Of bytes_allocated, the bytes mapped from the storage of the session
     * this one was forked from (og_kv_session_fork): the same memory, held
     * once; 0 when nothing is shared. */
    int64_t bytes_shared;
    int32_t n_states;        /* states of the manifest                   */
    /* Of bytes_allocated, the states' storage: two copies of every state
     * (allocated when the session is created) and the checkpoint when one
     * was taken. bytes_live counts one copy. */
    int64_t bytes_state;
} og_kv_metrics;
OG_API og_status og_kv_session_metrics(const og_kv_session *s, og_kv_metrics *out);
/* Allocated rows of one manifest layer (index into cfg->layers), -1 if out of range. */
OG_API int64_t og_kv_session_layer_rows(const og_kv_session *s, int32_t index);
/* Counts one graph capture (called by the executor). */
OG_API void og_kv_session_note_capture(og_kv_session *s);

/* Fork: a new session holding the parent's first at_length positions, that
 * diverges from there (its steps and the parent's never see each other's
 * rows). alloc NULL means the parent's allocator (copied by value, its ctx
 * must outlive the child); another allocator must grow in place exactly
 * when the parent's does (same layout). On success *out is owned by the
 * caller: og_kv_session_destroy; parent and child may be destroyed in any
 * order.
 *
 * Storage. Ring layers copy their ring (R rows each, whatever the length).
 * Packed flat rows (see og_kv_session_create) are shared without copying
 * when both allocators have the same share function: the child's block maps
 * the parent's memory for every whole granule below row at_length and gets
 * a copy of the one partial granule, so the host cost does not grow with
 * the length; neither session writes those shared granules again (a reset
 * of either gives its packed block back instead, and its next step reserves
 * a new one). Otherwise the rows below at_length are copied (O(length)).
 *
 * States (see og_kv_state_config) are copied, never shared (every step
 * rewrites all of a state): the parent's committed state when at_length is
 * its length L, its checkpoint's when at_length is the checkpoint's length
 * (og_kv_session_checkpoint), nothing at 0 (zero by definition). A state
 * holds no history, so any other at_length is refused (OG_ERR_UNSUPPORTED,
 * naming the state's layer and the lengths that can be forked).
 *
 * Refused: NULL arguments, at_length outside [0, L] (OG_ERR_INVALID_ARGUMENT),
 * a parent with a step prepared (OG_ERR_STATE), at_length below
 * og_kv_session_fork_floor (OG_ERR_UNSUPPORTED, naming the ring layer), an
 * allocator of the other layout (OG_ERR_INVALID_ARGUMENT); an allocation
 * failure (OG_ERR_OUT_OF_MEMORY) leaves nothing behind. The parent is not
 * changed, except that it remembers which of its bytes are shared. */
OG_API og_status og_kv_session_fork(og_kv_session *parent, int64_t at_length, const og_kv_allocator *alloc,
                                    og_kv_session **out);
/* The smallest length the session can be forked at: 0 without ring layers;
 * a ring layer of window W holds only the last R positions, and a fork at a
 * needs positions a - W + 1 .. a - 1, so once L > R the floor is
 * L - R + W - 1 = L - max_write (0 while L <= R). */
OG_API int64_t og_kv_session_fork_floor(const og_kv_session *s);

/* Capacity estimate against a memory budget in bytes (what the caller has
 * left for KV storage beyond what this session already holds). */
typedef struct og_kv_capacity {
    int64_t tokens_reachable;   /* more tokens this session can still take */
    int64_t fresh_sessions;     /* new sessions whose first step fits      */
    int64_t bytes_per_token;    /* flat-layer bytes one more token costs
                                   (packed: the packed row, padding included) */
    int64_t fresh_session_bytes;/* storage of a new session's first step
                                   (packed: ring block + one row's backing)  */
} og_kv_capacity;
OG_API og_status og_kv_session_capacity(const og_kv_session *s, int64_t budget_bytes,
                                        og_kv_capacity *out);

/* ------------------------------------------------------------ models */

/* A loaded program (weights mapped read-only) ready to run on a back end.
 * One model serves any number of sessions, also from different threads. */
typedef struct og_model og_model;

typedef enum og_backend {
    OG_BACKEND_AUTO = 0, /* CUDA when this build has it and a GPU is present, else CPU */
    OG_BACKEND_CPU,
    OG_BACKEND_CUDA
} og_backend;

/* Most shards (and devices) of a tensor-parallel model. */
#define OG_TENSOR_PARALLEL_MAX 8
typedef struct og_model_params {
    og_backend backend;
    int32_t n_threads; /* CPU threads; <= 0 means every online CPU */
    /* CUDA: decode steps (one token) replay a captured graph, re-captured
     * only when the session's storage moved. 1 (default) on, 0 off. */
    int32_t cuda_graphs;
    /* Tensor parallel: the model cut into this many shards (attention and
     * Gated DeltaNet by heads, MLPs and experts by intermediate columns,
     * the embedding and the head by vocabulary; docs/tensor-parallel.md).
     * 0 or 1 (default): one. The CPU back end runs the shards in one process
     * with an in-memory reduce (a check of the sharding: its logits equal
     * the unsharded model's up to the order of the partial sums); CUDA
     * across GPUs is not built yet (OG_ERR_UNSUPPORTED). Up to
     * OG_TENSOR_PARALLEL_MAX. */
    int32_t tensor_parallel;
    /* CUDA: the device ordinals the model runs on, shard i on devices[i]
     * (as CUDA numbers them under CUDA_VISIBLE_DEVICES). n_devices 0
     * (default): the calling thread's current device. Otherwise one device
     * per shard, each at most once; the cpu back end takes none (an auto
     * back end with devices given is cuda). */
    int32_t n_devices;
    int32_t devices[OG_TENSOR_PARALLEL_MAX];
} og_model_params;
OG_API og_model_params og_model_default_params(void);

/* Loads and validates the program at path. On success *out is owned by the
 * caller: og_model_destroy. On failure og_last_error() says why (a program
 * file error names its rule).
 * The file is mapped, not copied: it must not be truncated or rewritten in
 * place while the model is loaded (pages lost under the mapping read as
 * SIGBUS or other bytes). Replace it by writing a new file and renaming it
 * over the path, as `offgraph export` and the program writer do; the loaded
 * model keeps reading the old file. */
OG_API og_status og_model_load(const char *path, const og_model_params *params, og_model **out);
/* Frees the model. Every session of it must be destroyed first. NULL is a no-op. */
OG_API void og_model_destroy(og_model *m);
/* Vocabulary size (width of a logits row). */
OG_API int64_t og_model_vocab_size(const og_model *m);
/* The KV manifest the model's sessions get: the program's, with the context
 * og_model_set_context chose; borrowed from the model. */
OG_API const og_kv_config *og_model_kv_config(const og_model *m);
/* Bounds the tokens a session of m holds to n_ctx (llama.cpp's n_ctx): its
 * KV storage reserves and grows to n_ctx rows at most, and a write past them
 * is refused (OG_ERR_CAPACITY); the manifest's initial_capacity and
 * max_write are lowered to n_ctx where larger. n_ctx 0 restores the
 * program's max_capacity; more than it is refused (OG_ERR_INVALID_ARGUMENT:
 * the KV storage the program declares holds no more). Call it before
 * creating sessions or an engine over m, from one thread: sessions and
 * engines created before keep the context they had. */
OG_API og_status og_model_set_context(og_model *m, int64_t n_ctx);
/* The embedded tokenizer.json text, or NULL; borrowed from the model. */
OG_API const char *og_model_tokenizer_json(const og_model *m);
/* The embedded tokenizer_config.json text (with the chat template, when the
 * checkpoint had one), or NULL; borrowed from the model. */
OG_API const char *og_model_tokenizer_config(const og_model *m);
/* Without a tokenizer: why, as the export recorded it (e.g. "exported from a
 * GGUF file whose tokenizer.ggml.model is \"no_vocab\""), or NULL when it
 * did not say (or there is a tokenizer); borrowed from the model. */
OG_API const char *og_model_no_tokenizer_reason(const og_model *m);
/* The back end the model runs on (never OG_BACKEND_AUTO). */
OG_API og_backend og_model_backend(const og_model *m);
/* The back end og_model_load picks for params (NULL: the defaults), never
 * OG_BACKEND_AUTO: the one asked for; for AUTO, CUDA when devices are named
 * or this build has CUDA and a GPU is present, else CPU. Whether a model
 * then loads there is og_model_load's to say. */
OG_API og_backend og_model_params_backend(const og_model_params *params);

/* ------------------------------------------------------------ sampling */

/* Picks the next token from a row of logits. Order of the steps: forbidden
 * tokens out (their logit counts as -infinity); repetition penalty over the
 * recent tokens (a token seen twice is penalized once); then greedy
 * (temperature <= 0: the arg-max, lowest id on ties), or top-k (ties: the
 * lower id first), softmax of the kept logits at the temperature, top-p
 * (nucleus), min-p (relative to the most likely token), and a draw from what
 * is left. The sampler owns its random state: the same seed, parameters and
 * logits give the same tokens. */
/* One token's bias (OpenAI's logit_bias): added to its logit first. */
typedef struct og_logit_bias {
    int32_t token;
    float bias;
} og_logit_bias;

typedef struct og_sampler_params {
    float temperature;    /* <= 0: greedy                                    */
    int32_t top_k;        /* keep the k most likely; <= 0: all               */
    float top_p;          /* keep the smallest set with mass >= p; >= 1: all */
    float min_p;          /* drop p < min_p * p_max; <= 0: none              */
    float repeat_penalty; /* > 1 discourages recent tokens; 1: off           */
    int32_t repeat_last_n;/* how many recent tokens the penalty looks at     */
    uint64_t seed;
    /* OpenAI's penalties over the tokens this sampler has drawn (not the
     * prompt, not og_sampler_accept's): a token drawn n > 0 times has its
     * logit lowered by n * frequency_penalty + presence_penalty. 0: off. */
    float presence_penalty;
    float frequency_penalty;
    /* [n_logit_bias] biases added to the logits before anything else (a
     * token listed twice gets both); copied by og_sampler_create. */
    const og_logit_bias *logit_bias;
    int32_t n_logit_bias;
} og_sampler_params;

/* temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.0
 * (off), repeat_last_n 64, seed 0, no presence or frequency penalty, no
 * logit bias. The chain: forbidden ids, logit bias, repetition penalty,
 * presence and frequency penalties, then the arg-max (temperature <= 0) or
 * top-k, temperature, top-p, min-p and the draw. */
OG_API og_sampler_params og_sampler_default_params(void);

typedef struct og_sampler og_sampler;

/* For rows of vocab logits. On success *out is owned by the caller:
 * og_sampler_destroy. Refuses vocab < 1, a negative top_p/min_p, a
 * penalty or bias that is not finite, a biased id outside [0, vocab). */
OG_API og_status og_sampler_create(const og_sampler_params *p, int64_t vocab, og_sampler **out);
/* NULL is a no-op. */
OG_API void og_sampler_destroy(og_sampler *s);
/* Adds a token to the history the repetition penalty looks at (prompt
 * tokens too; og_sampler_sample adds what it returns). */
OG_API void og_sampler_accept(og_sampler *s, int32_t token);
/* Rules a token out for good (e.g. ids of a padded vocabulary that the
 * tokenizer does not know). Refuses an id outside [0, vocab). */
OG_API og_status og_sampler_forbid(og_sampler *s, int32_t token);
/* Forgets the history (and the counts of the penalties) and reseeds;
 * forbidden tokens stay forbidden. */
OG_API void og_sampler_reset(og_sampler *s);
/* Picks the next token from logits [vocab] (not modified). */
OG_API int32_t og_sampler_sample(og_sampler *s, const float *logits);

/* ------------------------------------------------- sessions of a model */

/* One conversation: its own KV storage (through the KV manager) and its own
 * scratch; shares the model's weights and program. */
typedef struct og_session og_session;

typedef struct og_session_params {
    /* KV storage dtype: OG_DTYPE_COUNT keeps the program's kv_dtype;
     * OG_DTYPE_F32, OG_DTYPE_BF16, OG_DTYPE_INT8 or OG_DTYPE_FP8 override it
     * for this session (int8 / fp8: a scale per token and kv head). */
    og_dtype kv_dtype;
    /* Where the session's KV storage comes from: NULL (default) is the back
     * end's own. On the CPU back end any host-memory allocator (copied by
     * value; its ctx must outlive the session), e.g. og_kv_allocator_faulty
     * to test failures; the CUDA back end refuses one. */
    const og_kv_allocator *kv_allocator;
} og_session_params;
OG_API og_session_params og_session_default_params(void);

/* On success *out is owned by the caller: og_session_destroy. */
OG_API og_status og_session_create(og_model *m, const og_session_params *params, og_session **out);
/* NULL is a no-op. */
OG_API void og_session_destroy(og_session *s);
/* Forgets the conversation (length 0), keeping storage. */
OG_API void og_session_reset(og_session *s);

/* Feeds n tokens, chunk at a time (chunk <= 0: all at once), each step at
 * most max_write tokens: the executor splits longer inputs. Every step is a
 * transaction: prepare (may grow storage), bind, run, commit; a failed step
 * leaves the session at the length it had before that step.
 * logits: NULL, or [n, vocab] f32 for every input position (all_rows), or
 * [vocab] for the last position only (!all_rows; cheaper: the layers after
 * the last attention run on the last row alone). */
OG_API og_status og_session_eval(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk,
                                 float *logits, int all_rows);
/* Like og_session_eval without logits, and then *next = the arg-max token
 * of the last position (torch.argmax rules: first maximum, NaN wins). On CUDA
 * the arg-max runs on the device and only the token is copied back. */
OG_API og_status og_session_eval_next(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk,
                                      int32_t *next);
/* Like og_session_eval without logits, and then *next = a token drawn from
 * the last position's logits by og_sampler_sample (the sampler's vocabulary
 * must be the model's). The sampler advances exactly as og_sampler_sample
 * advances it (its draw, and the token joins its recent history), and not
 * at all when the call fails. On CUDA the sampler runs on the device and only
 * the token is copied back, except where the device sampler does not reach
 * (temperature > 0 keeping more than 1024 candidates: top_k <= 0 or top_k >
 * 1024, over a vocabulary of more than 1024): then the logits come back and
 * the host samples them. */
OG_API og_status og_session_eval_sample(og_session *s, const int32_t *tokens, int64_t n, int32_t chunk,
                                        og_sampler *sampler, int32_t *next);
/* A new session of the parent's model holding the parent's first at_length
 * tokens (0 <= at_length <= og_session_length(parent)), that diverges from
 * there: what either session feeds afterwards is never seen by the other.
 * The child has the parent's KV dtype and storage kind (CPU: the parent's
 * allocator; CUDA: device memory of its own); its KV storage is made by
 * og_kv_session_fork: packed flat rows below the fork point are shared, not
 * copied, and ring layers copy their ring, so the cost does not grow with
 * at_length; storage that cannot share is copied. On success *out is owned
 * by the caller: og_session_destroy (parent and child in any order; every
 * session before the model). Refused, changing nothing: NULL arguments,
 * at_length outside [0, length] (OG_ERR_INVALID_ARGUMENT), a parent in a step
 * on another thread (OG_ERR_STATE), at_length below the ring layers' floor
 * (og_kv_session_fork_floor: OG_ERR_UNSUPPORTED); an allocation failure
 * (OG_ERR_OUT_OF_MEMORY) leaves no child. og_last_error() and the parent's
 * og_session_last_error() say why. */
OG_API og_status og_session_fork(og_session *parent, int64_t at_length, og_session **out);
/* Hybrid models (per-session state: og_kv_state_config) hold their state
 * only at the session's length, so og_session_fork starts a child only at
 * 0, at the parent's length or at its checkpoint. og_session_checkpoint
 * keeps a copy of the state at the current length (replacing the previous
 * one; e.g. when a prompt has been read, so that a later turn can start
 * from there); OG_OK and nothing kept for a model without state. Refused:
 * NULL (OG_ERR_INVALID_ARGUMENT), a session in a step (OG_ERR_STATE); an
 * allocation failure (OG_ERR_OUT_OF_MEMORY) keeps the previous checkpoint.
 * og_session_fork_point: the largest length <= at_most the session can be
 * forked at, -1 when none (og_kv_session_fork_point). */
OG_API og_status og_session_checkpoint(og_session *s);
OG_API int64_t og_session_fork_point(const og_session *s, int64_t at_most);

/* Saves the session's KV rows to a file at path, crash-safe: the rows are
 * written to a temp file <path>.tmp.XXXXXX in the same directory, its
 * header last, then it is fsync'd and renamed onto path and the directory
 * fsync'd, so path is either the old file (or none) or the complete new
 * one, whatever moment the process dies at (a leftover temp file is never
 * accepted by restore unless complete, and may be deleted). Only live rows
 * are written (flat layers: every committed position; ring layers: the last
 * min(length, R)), with a header holding the program's identity (a hash of
 * the program file's bytes before the weights, and a hash of every weight
 * tensor's name, dtype and shape and of its bytes, all of them up to 64 KiB,
 * else 16 windows of 4 KiB), the geometry (kv dtype, layers with policy,
 * window, heads and head dim, max_write, max_capacity), the length and a
 * checksum per layer. Works on every back end (device rows come to the
 * host through the session's storage). Rows in this process's memory are
 * written (and restored) by up to 4 threads, one layer at a time each
 * (environment OG_SAVE_THREADS, 1..64, changes the number); the file's
 * bytes do not depend on it. The session is not changed.
 * Refused: NULL arguments (OG_ERR_INVALID_ARGUMENT), a session in a step on
 * another thread (OG_ERR_STATE); a failure to write, fsync or rename is
 * OG_ERR_IO, and leaves path as it was and no temp file. */
OG_API og_status og_session_save(og_session *s, const char *path);
/* Creates a session of model m (default parameters, the file's kv dtype)
 * holding what the file at path holds: the next steps give what the saved
 * session's would have given, bit for bit. On success *out is owned by the
 * caller: og_session_destroy. Refused, with og_last_error() naming which:
 * a file that cannot be read (OG_ERR_IO); OG_ERR_FORMAT for a file that is
 * not a saved session (magic) or of an unknown version, from another
 * program (manifest hash or weights hash), of another geometry (kv dtype,
 * layer count, a layer's layer_id, policy, window, heads or head dim,
 * max_write, max_capacity), a length out of range, a layer table that
 * disagrees with the length, a header whose checksum fails, a truncated
 * file (or one with trailing bytes), a layer whose rows fail their checksum
 * (naming the layer). */
OG_API og_status og_session_restore(og_model *m, const char *path, og_session **out);
/* The same into an existing session of the file's model, created by the
 * caller with any parameters (e.g. a kv_allocator); its kv dtype must be
 * the file's. The session's conversation is replaced: refused before any
 * change when the header is refused; a failure after that (allocation,
 * a layer's checksum) leaves the session empty (length 0). OG_ERR_STATE
 * for a session in a step. */
OG_API og_status og_session_restore_into(og_session *s, const char *path);

/* ------------------------------------------------------- prefix reuse */

/* A cache of idle sessions keyed by the tokens their KV holds. A new prompt
 * that starts with a cached prefix starts from a fork of the cached session
 * (og_session_fork: shared rows, nothing recomputed) and feeds only the rest.
 * Keys are a hash chain over blocks of block_tokens tokens (a key names a
 * whole prefix of blocks); tokens are compared before anything is reused, so
 * a hash collision never reuses a wrong row. Least recently used entries are
 * evicted while the entries' KV bytes (bytes_allocated of their sessions,
 * shared bytes counted in full) exceed the budget. Safe to call from several
 * threads. */
typedef struct og_prefix_cache og_prefix_cache;

typedef struct og_prefix_cache_params {
    int64_t budget_bytes; /* KV bytes the cached sessions may hold (>= 0)  */
    int32_t block_tokens; /* tokens in a key block (>= 1)                  */
} og_prefix_cache_params;
/* budget 1 GiB, blocks of 64 tokens. */
OG_API og_prefix_cache_params og_prefix_cache_default_params(void);

typedef struct og_prefix_cache_metrics {
    int64_t lookups;       /* og_prefix_cache_lookup calls                     */
    int64_t hits;          /* lookups that returned a fork                     */
    int64_t tokens_reused; /* tokens those forks held: prefill not recomputed  */
    int64_t bytes_shared;  /* KV bytes those forks mapped rather than copied   */
    int64_t puts;          /* og_prefix_cache_put calls that took a session    */
    int64_t evictions;     /* entries evicted for the budget                   */
    int64_t entries;       /* entries held now                                 */
    int64_t bytes_held;    /* their KV bytes                                   */
} og_prefix_cache_metrics;

/* params NULL: the defaults. On success *out is owned by the caller:
 * og_prefix_cache_destroy. Refuses a negative budget or block_tokens < 1. */
OG_API og_status og_prefix_cache_create(const og_prefix_cache_params *params, og_prefix_cache **out);
/* Destroys every cached session and the cache; call it before freeing the
 * models of the sessions it holds. NULL is a no-op. */
OG_API void og_prefix_cache_destroy(og_prefix_cache *c);
/* Destroys every cached session; the cache stays usable. */
OG_API void og_prefix_cache_clear(og_prefix_cache *c);
/* Puts an idle session whose KV holds exactly tokens [n] (n must equal
 * og_session_length(s)). The cache takes ownership of s in every case,
 * also on failure (then s is destroyed): the caller must not use it again
 * (keep a fork of it, og_session_fork, to go on with the conversation).
 * Entries of the same model that this one can stand in for (their tokens a
 * prefix of these and every fork point of theirs reachable from it) are
 * dropped; an entry holding the same tokens stays and s is destroyed. Then
 * least recently used entries are evicted while over the budget (s itself
 * when it alone exceeds it). Refused: NULL arguments or n != the session's
 * length (OG_ERR_INVALID_ARGUMENT), a session in a step (OG_ERR_STATE),
 * no memory (OG_ERR_OUT_OF_MEMORY). */
OG_API og_status og_prefix_cache_put(og_prefix_cache *c, og_session *s, const int32_t *tokens, int64_t n);
/* Finds the cached session of model m sharing the longest prefix with
 * tokens [n] (at least one whole block; at most n - 1 tokens, so that the
 * caller feeds at least the last token and gets its logits; at least the
 * entry's fork floor). On a hit *out is a new session (owned by the caller:
 * og_session_destroy) holding the first *reused tokens of the prompt; the
 * caller feeds tokens [*reused, n). On a miss *out is NULL and *reused 0,
 * and the call still returns OG_OK. Errors (OG_ERR_INVALID_ARGUMENT, or a
 * failed fork: OG_ERR_OUT_OF_MEMORY) leave *out NULL. */
OG_API og_status og_prefix_cache_lookup(og_prefix_cache *c, og_model *m, const int32_t *tokens, int64_t n,
                                        og_session **out, int64_t *reused);
OG_API og_status og_prefix_cache_metrics_get(og_prefix_cache *c, og_prefix_cache_metrics *out);
/* Evicts least recently used entries while the entries' KV bytes exceed
 * max_bytes (a negative max_bytes counts as 0), each counted in
 * metrics.evictions, e.g. when a server needs their memory for a new
 * request. Returns the bytes held afterwards (0 for NULL c). */
OG_API int64_t og_prefix_cache_trim(og_prefix_cache *c, int64_t max_bytes);

/* ------------------------------------------- many sessions in one step */

/* What a session of a batched step gets back from its step. */
typedef enum og_step_output {
    OG_OUTPUT_NONE = 0,   /* nothing: the tokens only advance the session   */
    OG_OUTPUT_LOGITS,     /* logits of the last token: logits [vocab]       */
    OG_OUTPUT_LOGITS_ALL, /* logits of every token: logits [n_tokens, vocab] */
    OG_OUTPUT_ARGMAX,     /* token = arg-max of the last token's logits
                             (torch.argmax rules: first maximum, NaN wins)  */
    OG_OUTPUT_SAMPLE,     /* token = drawn by sampler from the last token's
                             logits, as og_sampler_sample draws it          */
    OG_OUTPUT_COUNT
} og_step_output;

/* One session's part of a batched step. */
typedef struct og_batch_item {
    og_session *session;   /* borrowed; of the stepping model, once per batch */
    const int32_t *tokens; /* [n_tokens], borrowed for the call             */
    int32_t n_tokens;      /* 1 .. max_write of the model's KV manifest     */
    og_step_output output;
    float *logits;         /* LOGITS: [vocab]; LOGITS_ALL: [n_tokens, vocab];
                              written only when the step succeeds; else NULL */
    og_sampler *sampler;   /* SAMPLE: its vocabulary is the model's; advanced
                              (its draw, and the token joins its history)
                              only when the step succeeds; else NULL         */
    int32_t token;         /* out: ARGMAX and SAMPLE, when the step succeeds */
    /* The tokens the output may choose (a grammar's mask): bit i % 32 of word
     * i / 32 set when token i is allowed, ceil(vocab / 32) words; borrowed for
     * the call, only read. NULL: every token is allowed. Every disallowed
     * logit counts as -infinity before the output is made: ARGMAX and SAMPLE
     * choose among the allowed tokens only (as og_sampler_sample does over
     * logits the caller masked so), and LOGITS gets the masked row
     * (-INFINITY where not allowed, the model's logits elsewhere). Refused
     * with the other outputs (NONE, LOGITS_ALL). A mask that allows nothing
     * leaves every logit -infinity (ARGMAX then gives id 0). On CUDA the mask
     * is applied on the device, inside the decode graph, and only the token
     * comes back. */
    const uint32_t *allowed;
} og_batch_item;

/* Advances n_items sessions of model m by their items' tokens in one step:
 * the products of every layer multiply the weights once for the rows of all
 * sessions, and update_and_attend runs for each session over its own storage
 * (sessions at different lengths, flat and ring layers). Decode (every
 * n_tokens = 1) and prompt chunks mix freely.
 *
 * The step is one transaction: every session is prepared (its storage grown
 * as needed) before anything runs, and if any session cannot be (capacity,
 * allocation), or the step fails, no session advances or changes, no logits
 * are written and no sampler moves. Refused before anything changes, with
 * og_last_error() naming the item and the rule: n_items < 1, a NULL session
 * or tokens, n_tokens outside [1, max_write] (OG_ERR_WRITE_TOO_WIDE above),
 * a token id outside the vocabulary, a session of another model, the same
 * session twice, a session already in a step on another thread
 * (OG_ERR_STATE), an output without its logits or sampler, a sampler of
 * another vocabulary, an allowed mask with an output other than ARGMAX,
 * SAMPLE or LOGITS. Items are read and their `token` written; the call
 * keeps no pointer to them. Steps of one model may run on several threads,
 * each with its own sessions. */
OG_API og_status og_model_step(og_model *m, og_batch_item *items, int32_t n_items);

/* Model-wide figures of batched steps. CUDA decode steps replay a graph
 * captured once per batch bucket (1, 2, 4, ..., 256 sessions, padded rows
 * masked); a capture counted here twice for one bucket is a re-capture. */
#define OG_BATCH_BUCKETS 9
typedef struct og_model_metrics {
    int64_t steps;                             /* og_model_step calls that succeeded */
    int64_t rows;                              /* tokens those steps advanced        */
    int64_t graph_captures;                    /* all buckets                        */
    int64_t bucket_captures[OG_BATCH_BUCKETS]; /* bucket b holds 2^b sessions        */
    int64_t bucket_replays[OG_BATCH_BUCKETS];
    /* Where those steps' time went, in seconds, by phase: preparing and
     * binding every session's storage and planning the step (prepare); the
     * back end's own host work (submit: on CUDA the tables, uploads,
     * launches and the samplers' bookkeeping; on the CPU the whole
     * computation); the back end's waits for the device (wait; 0 on the
     * CPU); and the sessions' commits (finish). */
    double prepare_seconds, submit_seconds, wait_seconds, finish_seconds;
} og_model_metrics;
OG_API og_status og_model_metrics_get(const og_model *m, og_model_metrics *out);

/* Committed length. */
OG_API int64_t og_session_length(const og_session *s);
/* KV metrics of the session (see og_kv_metrics). */
OG_API og_status og_session_metrics(const og_session *s, og_kv_metrics *out);
/* The session's KV manager handle, borrowed (for layer views and capacity). */
OG_API const og_kv_session *og_session_kv(const og_session *s);
/* Message of the last failure on this session; never NULL. */
OG_API const char *og_session_last_error(const og_session *s);


/* ----------------------------------------------------------- tokenizer */

/* Text <-> token ids, as Hugging Face `tokenizers` does it for a
 * tokenizer.json with a BPE model, and the special tokens a
 * tokenizer_config.json names. A tokenizer is never changed after it is
 * made: any number of threads may use one at once (each decode stream
 * belongs to one thread at a time). Text in and out is UTF-8; input that is
 * not valid UTF-8 has each maximal ill-formed subpart read as U+FFFD. */
typedef struct og_tokenizer og_tokenizer;

/* Frees an array or a string that a tokenizer call gave the caller (ids,
 * text, pieces), through the host allocator. NULL is a no-op. */
OG_API void og_free(void *ptr);

/* The tokenizer of a model: the tokenizer.json and tokenizer_config.json
 * its program embeds (see og_model_tokenizer_json). The tokenizer copies
 * what it needs: it does not borrow m, which may be freed first. On success
 * *out is owned by the caller: og_tokenizer_destroy. Refused: NULL arguments
 * (OG_ERR_INVALID_ARGUMENT); a program exported without a tokenizer
 * (OG_ERR_UNSUPPORTED); a file that is malformed (OG_ERR_FORMAT) or asks
 * for what this build does not support (OG_ERR_UNSUPPORTED), with
 * og_last_error() naming the file and what in it. *out is NULL on failure. */
OG_API og_status og_tokenizer_from_model(const og_model *m, og_tokenizer **out);
/* The same from files: tokenizer_json_path, and config_path (a
 * tokenizer_config.json; NULL for none: then no bos and no eos). A file
 * that cannot be read is OG_ERR_IO, naming the path. */
OG_API og_status og_tokenizer_from_file(const char *tokenizer_json_path, const char *config_path,
                                        og_tokenizer **out);
/* Frees the tokenizer; every decode stream of it must be destroyed first.
 * NULL is a no-op. */
OG_API void og_tokenizer_destroy(og_tokenizer *t);

/* Flags of og_tokenize. */
#define OG_TOKENIZE_ADD_SPECIAL 1u   /* add the special tokens a model is fed around a text
                                        (e.g. a bos token), by the rule below          */
#define OG_TOKENIZE_PARSE_SPECIAL 2u /* special tokens written in the text ("<|im_end|>")
                                        become their ids; without it they are text    */

/* Encodes len bytes of text (NUL bytes included; text may be NULL when len
 * is 0). flags: OG_TOKENIZE_* or'ed (0: the text alone, special tokens in
 * it encoded as plain text; transformers' tokenizer(text) is ADD_SPECIAL |
 * PARSE_SPECIAL, and a rendered chat template is tokenized with
 * PARSE_SPECIAL alone, as apply_chat_template(tokenize=True) does: the
 * template writes its own BOS).
 * The tokens ADD_SPECIAL adds (the one rule every front end follows, as
 * transformers 5's tokenizer(text) does): what tokenizer.json's
 * post_processor puts around a single sequence (TemplateProcessing,
 * BertProcessing and RobertaProcessing: cls text sep, ByteLevel: nothing,
 * or a Sequence of them, each wrapping what the one before made); nothing
 * without one. tokenizer_config.json's add_bos_token / add_eos_token are
 * not read (transformers 5 does not apply them either).
 * On success *ids is owned by the caller: og_free (NULL when *n is 0).
 * Refused: NULL arguments (OG_ERR_INVALID_ARGUMENT), ADD_SPECIAL with
 * another post_processor (OG_ERR_UNSUPPORTED, naming it). On failure *ids
 * is NULL and *n 0. */
OG_API og_status og_tokenize(const og_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t **ids,
                             int64_t *n);
/* Decodes n ids into NUL-terminated UTF-8, special tokens kept as their
 * text, exactly as Hugging Face's decode(ids) does. On success *text is
 * owned by the caller: og_free; *len (if non-NULL) gets its length in
 * bytes. An id that is not a token is OG_ERR_INVALID_ARGUMENT, naming it
 * and its index; *text is NULL on failure. */
OG_API og_status og_detokenize(const og_tokenizer *t, const int32_t *ids, int64_t n, char **text, size_t *len);

/* One past the largest token id (vocabulary and added tokens); 0 for NULL.
 * Ids below it may still be holes that are no token (og_token_piece says). */
OG_API int32_t og_tokenizer_vocab_size(const og_tokenizer *t);
/* The id of the token whose stored piece is exactly `piece` (added tokens
 * first, then the vocabulary, e.g. "<|im_end|>" or "\u0120the" of a byte-level
 * vocabulary), or -1 when there is none or an argument is NULL. */
OG_API int32_t og_tokenizer_token_id(const og_tokenizer *t, const char *piece);
/* The token's piece as the vocabulary stores it (e.g. "\u0120the"), or NULL
 * for an id that is no token; borrowed from t, valid until og_tokenizer_destroy. */
OG_API const char *og_tokenizer_token_text(const og_tokenizer *t, int32_t id);
/* The text of the token decoded on its own (" the"; a byte of a character
 * cut between tokens comes out as U+FFFD). On success *text is owned by the
 * caller: og_free; *len (if non-NULL) gets its length. OG_ERR_INVALID_ARGUMENT
 * for an id that is no token. */
OG_API og_status og_token_piece(const og_tokenizer *t, int32_t id, char **text, size_t *len);
/* Whether id is an added token marked special (0 for anything else). */
OG_API int og_tokenizer_is_special(const og_tokenizer *t, int32_t id);

/* Special ids, -1 when there is none. bos: tokenizer_config.json's
 * bos_token. eos: its eos_token. End of turn: the token that ends an
 * assistant's reply in the chat format of the config's chat_template
 * ("<|im_end|>", "<|eot_id|>", "</s>", "<end_of_turn>", "<|end|>"); -1
 * without a recognised template. */
OG_API int32_t og_tokenizer_bos(const og_tokenizer *t);
OG_API int32_t og_tokenizer_eos(const og_tokenizer *t);
OG_API int32_t og_tokenizer_eot(const og_tokenizer *t);
/* The ids that end a generation (of text or of a chat reply alike): the
 * config's eos token and the end of turn (og_tokenizer_eot), each once, in
 * that order. Writes the first cap of them to ids (which may be NULL when
 * cap is 0) and returns how many there are; 0 for NULL t. Every front end
 * (run, chat, serve, the Python binding) stops on these. */
OG_API int32_t og_tokenizer_stop_ids(const og_tokenizer *t, int32_t *ids, int32_t cap);

/* Streaming decode, for text generated one token at a time: each push gives
 * out the text that token completes. Bytes that begin a UTF-8 character not
 * yet complete (at most 3) are held back until a later token completes it
 * or og_decode_stream_finish; everything else goes out at once. The pieces
 * of a stream joined equal og_detokenize of all its ids (except a run of
 * byte-fallback tokens that is not valid UTF-8: the stream replaces each
 * maximal ill-formed subpart with one U+FFFD, decode every byte of the run).
 * A push costs the same however long the stream is: a stream is linear in
 * its tokens. */
typedef struct og_decode_stream og_decode_stream;
/* Borrows t, which must outlive the stream. On success *out is owned by the
 * caller: og_decode_stream_destroy. OG_ERR_INVALID_ARGUMENT for NULL
 * arguments, OG_ERR_OUT_OF_MEMORY. */
OG_API og_status og_decode_stream_create(const og_tokenizer *t, og_decode_stream **out);
/* NULL is a no-op. */
OG_API void og_decode_stream_destroy(og_decode_stream *s);
/* Adds token id. *text gets the newly complete text and *len its length
 * (possibly 0); *text is borrowed from s, NUL-terminated, valid until the
 * next call on s. An id that is no token is OG_ERR_INVALID_ARGUMENT and
 * leaves the stream as it was. */
OG_API og_status og_decode_stream_push(og_decode_stream *s, int32_t id, const char **text, size_t *len);
/* Gives out what is held back (an incomplete character as U+FFFD) and
 * starts the stream over; *text as for push. */
OG_API og_status og_decode_stream_finish(og_decode_stream *s, const char **text, size_t *len);

/* ------------------------------------------------------------ tool calls */

/* OpenAI's tool calls over a model's chat template: which format the
 * template teaches its model to write calls in, a parser that takes the
 * calls out of the model's output (whole, or as it streams), and the
 * grammar of an output that is only calls (tool_choice "required" or a
 * named function). The server (offgraph serve) and the Python binding use
 * these; the template renders the tools themselves (og_request_params'
 * tools_json, messages_json).
 *
 * Formats: Hermes' (Qwen 2.5, Qwen 3, Hermes and others), a block a call,
 *   <tool_call>
 *   {"name": "get_weather", "arguments": {"city": "Paris"}}
 *   </tool_call>
 * text around the blocks being the reply's content; Mistral's (Mistral Nemo
 * and others), a JSON array of calls after a marker,
 *   [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]
 * (text before it is content); and Llama 3.1's, where a reply that is one
 * JSON object with a "name" and its "parameters" (or "arguments"), after
 * an optional <|python_tag|>, is a call. A template that reads tools and
 * writes calls another way is OG_TOOL_FORMAT_OTHER: its calls are not
 * parsed, and front ends refuse tools for it. */
typedef enum og_tool_format {
    OG_TOOL_FORMAT_NONE = 0, /* the template does not read tools              */
    OG_TOOL_FORMAT_HERMES,   /* <tool_call>{"name", "arguments"}</tool_call> */
    OG_TOOL_FORMAT_OTHER,    /* reads tools; its calls are not parsed         */
    OG_TOOL_FORMAT_MISTRAL,  /* [TOOL_CALLS][{"name", "arguments"}, ...]      */
    OG_TOOL_FORMAT_LLAMA3    /* the whole reply {"name", "parameters"}, maybe
                                after <|python_tag|> (Llama 3.1)            */
} og_tool_format;

/* The format of t's chat template (NONE: no template, or one that does not
 * read tools). */
OG_API og_tool_format og_tokenizer_tool_format(const og_tokenizer *t);
/* "none", "hermes", "other", "mistral", "llama3". */
OG_API const char *og_tool_format_name(og_tool_format f);

/* One call: the function's name and its arguments as JSON text (the
 * model's own bytes of the arguments object; "{}" when it gave none). */
typedef struct og_tool_call {
    char *name;
    char *arguments;
} og_tool_call;

/* Takes calls out of an output fed to it piece by piece (any split, even
 * inside a marker or a character). Content is the text outside the calls:
 * when the output holds no call it is the output byte for byte; around
 * calls, the whitespace between content and a call is dropped. A block
 * whose body is not a call (not a JSON object with a string "name", or for
 * Mistral an array of them) stays in the content as the model wrote it; an
 * unclosed block at the end is a call when its body is one. A call written
 * as the templates write it ({"name": ..., "arguments": {...}}) is a call
 * from its arguments' opening on, and complete when they close (see
 * og_tool_parser_take_pieces for arguments that stop being JSON). Content is
 * given out as soon as it cannot be the start of a call (a possible
 * marker's first bytes, and whitespace that may precede a call, wait). One
 * thread at a time. */
typedef struct og_tool_parser og_tool_parser;

/* For format f (HERMES, MISTRAL, LLAMA3; any other gives a parser that
 * passes the text through as content). On success *out is owned by the
 * caller: og_tool_parser_destroy. */
OG_API og_status og_tool_parser_create(og_tool_format f, og_tool_parser **out);
/* NULL is a no-op. */
OG_API void og_tool_parser_destroy(og_tool_parser *p);
/* Feeds n bytes of output. OG_ERR_OUT_OF_MEMORY; OG_ERR_INVALID_ARGUMENT
 * for NULL arguments. */
OG_API og_status og_tool_parser_feed(og_tool_parser *p, const char *text, size_t n);
/* The output ended: what was held back is decided. */
OG_API og_status og_tool_parser_finish(og_tool_parser *p);
/* What is ready since the previous take: content (*content NUL-terminated,
 * *n_content bytes) and the calls completed (*calls[0..*n_calls)). Both are
 * borrowed from p until its next call. */
OG_API void og_tool_parser_take(og_tool_parser *p, const char **content, size_t *n_content,
                                const og_tool_call **calls, int *n_calls);
/* Calls completed since the parser was created. */
OG_API int og_tool_parser_total_calls(const og_tool_parser *p);

/* The same output as pieces in the order the model wrote them, for a
 * stream: content, and each call as its arguments arrive. A call written
 * as the templates write it (its "name", then its "arguments" or
 * "parameters" object) is a call from the moment its arguments open: its
 * first piece carries its name (and maybe arguments), the next ones only
 * further bytes of its arguments, its last one is marked. The arguments'
 * pieces put together are the call's arguments as og_tool_parser_take
 * gives them, and no piece is ever taken back: bytes of the arguments are
 * given out once they are JSON that can end by closing what is open, a
 * raw control byte in a string comes out escaped, and arguments that stop
 * being JSON (or a block that ends inside them) end the call there, closed
 * as JSON (what follows in the block, for Hermes, or up to the next call
 * or the end of the array, for Mistral, is dropped; for Llama 3.1 it is
 * content). A call written otherwise (its arguments before its name, or as
 * a string) is one piece when its block ends, as og_tool_parser_take gives
 * it. A piece: */
typedef struct og_tool_piece {
    int call;         /* -1: content; else the call's index in the reply    */
    const char *name; /* the call's first piece: its name; else NULL        */
    const char *text; /* the content, or bytes of the call's arguments
                         (NUL-terminated; "" in a first or last piece that
                         brings no bytes)                                    */
    size_t n;         /* bytes of text                                       */
    bool last;        /* the call's arguments are complete                   */
} og_tool_piece;
/* What is ready since the previous take (of either kind: a parser is read
 * with og_tool_parser_take or with this, and each takes what the other
 * would have given). *pieces[0..*n) are borrowed from p until its next
 * call. OG_ERR_OUT_OF_MEMORY: none given (*n 0); they stay for the next
 * take. */
OG_API og_status og_tool_parser_take_pieces(og_tool_parser *p, const og_tool_piece **pieces, int *n);

/* The grammar (GBNF text, as og_request_params.grammar takes) of an output
 * that is only tool calls in format f (HERMES, MISTRAL, LLAMA3; spaced as
 * the templates write calls): one call (one or more when parallel, except
 * LLAMA3), of the function named only_name when it is not NULL, else of any
 * function of tools_json (OpenAI's tools: a JSON array of {"type":
 * "function", "function": {"name", "parameters"}}), its arguments following
 * the function's parameters schema (an object of any members when it has
 * none). A schema the JSON-schema compiler refuses gives its error
 * (OG_ERR_UNSUPPORTED naming the keyword); an unknown only_name, a name
 * of other characters than letters, digits, '_', '-' and '.', or another
 * format, OG_ERR_INVALID_ARGUMENT. On success *out (NUL-terminated) is
 * owned by the caller: og_free. */
OG_API og_status og_tool_calls_grammar_text(og_tool_format f, const char *tools_json, const char *only_name,
                                            bool parallel, char **out);
/* The id of a call as format f's template takes it back in a later turn,
 * made from unique (a string unique to the call, e.g. "call_<response
 * id><index>"): unique itself, or for MISTRAL, whose template takes only
 * ids of 9 letters and digits, 9 of them derived from it. Writes at most
 * cap bytes with the NUL; OG_ERR_CAPACITY when it does not fit. */
OG_API og_status og_tool_call_id(og_tool_format f, const char *unique, char *out, size_t cap);

/* ------------------------------------------------------------ the engine */

/* One loaded model serving many requests: the one generation path of every
 * front end (offgraph run, chat, serve, bench --sessions, the Python
 * binding). The engine owns the policy around the model:
 *  - the prompt: text is tokenized by the tokenizer's own rule
 *    (og_tokenize with OG_TOKENIZE_ADD_SPECIAL | OG_TOKENIZE_PARSE_SPECIAL:
 *    the post-processor's BOS and the like; without add_special only
 *    PARSE_SPECIAL); chat messages are rendered by the model's chat template
 *    (its BOS written by the template) and tokenized with PARSE_SPECIAL;
 *    token ids are taken as given;
 *  - what ends a generation: og_tokenizer_stop_ids (unless ignore_eos), the
 *    request's stop strings (never part of the text), max_tokens, the
 *    model's context;
 *  - the ids a sampler never draws (those the tokenizer does not know: a
 *    padded vocabulary), the sampler chain of og_sampler_params, and an
 *    optional constraint hook before it;
 *  - the prefix cache (a prompt that starts like an earlier one forks its
 *    cached rows and reads only the rest);
 *  - budgets and admission: max_sessions requests generate at once, their
 *    KV under kv_budget; the others wait in a queue of max_queue;
 *  - the continuous-batching scheduler: one thread per engine steps every
 *    running request together through og_model_step, a decode row for each
 *    generating request and prompt chunks of new ones beside them under a
 *    row budget; a request joins at the next step and leaves when it ends.
 *
 * Thread safety: every og_engine_* call may come from any thread at any
 * time, one engine serving many threads. A request's og_request_next and
 * og_request_destroy come from one thread at a time (its owner);
 * og_request_cancel and og_request_backlog from any thread. Every request
 * must be destroyed before its engine. */
typedef struct og_engine og_engine;
typedef struct og_request og_request;

typedef struct og_engine_params {
    og_session_params session;  /* KV dtype (and allocator) of every session  */
    int32_t max_sessions;       /* requests generating at once (64)           */
    int32_t max_queue;          /* requests waiting to start (256); past it a
                                   submit is refused with OG_ERR_BUSY          */
    int64_t kv_budget;          /* KV bytes all sessions (and the prefix
                                   cache) may hold; 0: no bound               */
    int64_t prefix_cache_bytes; /* KV bytes of finished requests' prompts kept
                                   for prefix reuse (1 GiB; 0: off); counted
                                   in kv_budget and evicted before a request
                                   waits for memory                           */
    int32_t chunk;              /* prompt tokens per step of one request (256) */
    int32_t step_rows;          /* rows (tokens) per batched step, all requests
                                   together (512)                              */
    uint64_t seed;              /* base of the seeds of requests that give
                                   none; 0: from the clock                     */
    double test_step_delay_s;   /* tests only: a pause after every batched
                                   step, as a slower model would take (0)     */
} og_engine_params;
OG_API og_engine_params og_engine_default_params(void);

/* An engine over model m, and tok its tokenizer (NULL: requests of token ids
 * only, no text out, no stop ids or strings). Both are borrowed and must
 * outlive the engine; the model's sessions are the engine's from now on
 * (other threads may still use sessions of their own). Starts the
 * scheduler's thread. On success *out is owned by the caller:
 * og_engine_destroy. Refused: NULL m or out, a parameter out of range
 * (OG_ERR_INVALID_ARGUMENT), no memory; og_last_error() says which. */
OG_API og_status og_engine_create(og_model *m, og_tokenizer *tok, const og_engine_params *p, og_engine **out);
/* Stops it (og_engine_stop with no grace), joins its thread and frees it.
 * NULL is a no-op. */
OG_API void og_engine_destroy(og_engine *e);
/* Takes no new requests (a submit is refused with OG_ERR_STATE from now on),
 * ends the waiting ones (finish ERROR, status OG_ERR_STATE), gives the
 * running ones up to grace_s seconds to finish, then cancels them (finish
 * ERROR, status OG_ERR_STATE), and returns when none is left running. */
OG_API void og_engine_stop(og_engine *e, double grace_s);
/* The largest number of tokens one session holds (the model's context:
 * og_kv_config.max_capacity). */
OG_API int64_t og_engine_context(const og_engine *e);

typedef enum og_prompt_kind {
    OG_PROMPT_TEXT = 0, /* text: tokenized by the tokenizer's rule        */
    OG_PROMPT_TOKENS,   /* token ids, taken as given                      */
    OG_PROMPT_CHAT      /* messages through the model's chat template     */
} og_prompt_kind;

/* A message of a conversation (its strings borrowed for the call). */
typedef struct og_chat_message {
    const char *role;    /* "system", "user", "assistant", ...            */
    const char *content;
} og_chat_message;

/* How a request ended. */
typedef enum og_finish_reason {
    OG_FINISH_NONE = 0, /* it goes on                                        */
    OG_FINISH_STOP,     /* a stop id or a stop string ended it               */
    OG_FINISH_LENGTH,   /* max_tokens tokens, or the model's context is full */
    OG_FINISH_CANCELLED,/* og_request_cancel / og_request_destroy            */
    OG_FINISH_ERROR     /* it failed: og_request_output.status and .error    */
} og_finish_reason;

/* An optional constraint (e.g. a grammar): called on the engine's thread
 * before each token of the request is drawn, with the tokens it generated
 * so far and the logits of the next one, which it may change (set a token's
 * logit to -INFINITY to rule it out). It must not call the engine. */
typedef void (*og_constraint_fn)(void *ctx, const int32_t *generated, int64_t n_generated, float *logits,
                                 int64_t vocab);

#define OG_MAX_TOP_LOGPROBS 20

/* One generated token's log-probabilities (natural log, over the whole
 * vocabulary, from the logits it was drawn from after the constraint) and
 * the n_top most likely tokens' (ties: the lower id first). */
typedef struct og_token_logprob {
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t top[OG_MAX_TOP_LOGPROBS];
    float top_logprob[OG_MAX_TOP_LOGPROBS];
} og_token_logprob;

typedef struct og_request_params {
    og_prompt_kind kind;
    const char *text;              /* TEXT: NUL-terminated UTF-8               */
    bool add_special;              /* TEXT: the special tokens the tokenizer's
                                      rule adds (BOS...); default true         */
    const int32_t *tokens;         /* TOKENS: [n_tokens] ids of the model's vocabulary */
    int64_t n_tokens;
    const og_chat_message *messages; /* CHAT: [n_messages]                    */
    int32_t n_messages;
    bool add_generation_prompt;    /* CHAT: end with what opens the assistant's
                                      reply (default true)                     */
    const char *template_vars_json;/* CHAT: a JSON object of extra template
                                      variables (booleans, e.g.
                                      {"enable_thinking": false}), or NULL     */
    const char *messages_json;     /* CHAT: instead of messages, the
                                      conversation as a JSON array of message
                                      objects given to the template as they
                                      are, as transformers' apply_chat_template
                                      takes them (role, content, tool_calls
                                      with arguments as objects, tool_call_id);
                                      NULL: messages                          */
    const char *tools_json;        /* CHAT: the template's tools, a JSON array
                                      ([{"type": "function", "function":
                                      {name, description, parameters}}]), or
                                      NULL: none                               */
    og_sampler_params sampling;    /* seed 0: the engine picks one            */
    int64_t max_tokens;            /* most tokens to generate; 0: until the
                                      context is full (or as many as one
                                      request may hold under kv_budget). More
                                      than the context leaves is allowed: the
                                      request ends there (finish LENGTH)       */
    const char *const *stop;       /* [n_stop] stop strings ("" ignored)      */
    int32_t n_stop;
    bool ignore_eos;               /* no stop ids: generate max_tokens (bench) */
    int32_t logprobs;              /* -1: none; 0..OG_MAX_TOP_LOGPROBS: each
                                      token's log-probability and that many
                                      alternatives                             */
    const char *grammar;           /* GBNF text (llama.cpp's format, start rule
                                      "root") the output must follow, or NULL  */
    const char *json_schema;       /* a JSON schema (JSON text) the output must
                                      follow, or NULL: compiled to a grammar
                                      (the subset src/text/grammar.h lists;
                                      {"type": "object"} is any JSON object).
                                      At most one of grammar, json_schema and
                                      constraint; a grammar's output ends at a
                                      stop id only where it may end            */
    og_constraint_fn constraint;   /* NULL: none                               */
    void *constraint_ctx;
    og_session *session;           /* NULL: the engine's own session (reset when
                                      the request ends). Else a session of the
                                      engine's model that the caller owns: the
                                      request goes on after the tokens it holds
                                      (the prompt carries only what is new, as a
                                      conversation's next turn) and every token
                                      given out is fed to it, the last one too,
                                      so that once the request has ended the
                                      session holds what it held, the prompt and
                                      the generated tokens (stop ids excluded),
                                      and a hybrid model's checkpoint where the
                                      prompt ended. The context left is the
                                      model's less what the session holds (the
                                      generation ends with finish LENGTH when it
                                      is full). The prefix cache is neither read
                                      nor written for it. From submit until the
                                      request has ended (og_request_next gave the
                                      finish, or og_request_destroy returned) the
                                      session is the engine's: the caller must
                                      not use or destroy it, nor submit another
                                      request on it. After a failed step
                                      (finish ERROR) it holds what the steps
                                      before wrote. */
} og_request_params;
/* TEXT, add_special and add_generation_prompt true, og_sampler_default_params,
 * max_tokens 0, no stops, logprobs -1, no grammar, no constraint, no session. */
OG_API og_request_params og_request_default_params(void);

/* Prepares the prompt (on the calling thread: tokenizing, rendering a chat)
 * and queues the request. Everything p points to is copied. On success *out
 * is owned by the caller: og_request_destroy. Refused before anything is
 * queued, *out NULL, with og_last_error() naming what is wrong:
 *   OG_ERR_BUSY: max_sessions run, the request cannot start now and the
 *     queue holds max_queue already: retry later;
 *   OG_ERR_STATE: the engine is stopping;
 *   OG_ERR_CAPACITY: the prompt is longer than the context, or the prompt
 *     and max_tokens need more KV than the whole kv_budget (the message
 *     names the bytes and the budget); with a session, what it holds
 *     counts against the context;
 *   OG_ERR_INVALID_ARGUMENT: NULL arguments, an empty prompt, an id outside
 *     the vocabulary, text or chat without a tokenizer, a chat the template
 *     refuses (its raise_exception message), bad template variables, a
 *     negative max_tokens, logprobs out of range, a session of another
 *     model or one another request of the engine still runs on;
 *   OG_ERR_FORMAT: the model's chat template does not parse (naming the
 *     line), a grammar or JSON schema that does not parse (naming where);
 *   OG_ERR_UNSUPPORTED: the tokenizer's rule cannot be applied, a JSON
 *     schema keyword or string format the compiler does not support (naming
 *     it), a grammar past its limits;
 *   OG_ERR_OUT_OF_MEMORY. */
OG_API og_status og_engine_submit(og_engine *e, const og_request_params *p, og_request **out);
/* n choices of one prompt (OpenAI's n): as og_engine_submit, into out[0..n)
 * (each owned by the caller: og_request_destroy; all NULL on failure). The
 * prompt is read once: choice 0 reads it and the others continue from a
 * fork of its session at the prompt's end, each drawing its first token
 * from the prompt's last logits with its own sampler. A seed of p's is
 * choice 0's; choice i gets one derived from it (seed 0: each its own). The
 * choices wait and start together (n sessions and n reservations under
 * kv_budget); n above max_sessions is refused (OG_ERR_INVALID_ARGUMENT).
 * constraint_ctx: NULL (every choice gets p's), or [n] contexts, choice i's
 * constraint_ctx[i] (a constraint that follows one sequence, as a grammar
 * matcher, needs one a choice). Once started each choice is a request of
 * its own (next, cancel, destroy). */
OG_API og_status og_engine_submit_n(og_engine *e, const og_request_params *p, int32_t n,
                                    void *const *constraint_ctx, og_request **out);
/* The prompt text a CHAT request p renders (the model's chat template over
 * its messages or messages_json, tools_json, template_vars_json and
 * add_generation_prompt, with the tokenizer's BOS and EOS texts), exactly
 * as og_engine_submit renders it before tokenizing it; nothing is queued.
 * Refused as og_engine_submit refuses the chat: OG_ERR_INVALID_ARGUMENT
 * (NULL arguments, another kind than CHAT, no tokenizer, no messages, a
 * chat the template refuses, bad template variables), OG_ERR_FORMAT (the
 * template does not parse), OG_ERR_OUT_OF_MEMORY. On success *out
 * (NUL-terminated UTF-8) is owned by the caller: og_free. */
OG_API og_status og_engine_render(const og_engine *e, const og_request_params *p, char **out);

/* What a request produced since the previous og_request_next. */
typedef struct og_request_output {
    const char *text;              /* new text (NUL-terminated; final: a stop
                                      string is never in it), valid until the
                                      next call on the request                */
    size_t n_text;
    const int32_t *tokens;         /* new generated ids (stop ids excluded)   */
    int32_t n_tokens;
    const og_token_logprob *logprobs; /* one per new token, when asked       */
    int32_t n_logprobs;
    og_finish_reason finish;       /* NONE while it runs                      */
    og_status status;              /* finish ERROR: why (OG_ERR_OUT_OF_MEMORY:
                                      memory ran out and may come back;
                                      OG_ERR_STATE: the engine stopped)        */
    char error[256];               /* finish ERROR: the message               */
    int64_t prompt_tokens;         /* the prompt's tokens                     */
    int64_t reused_tokens;         /* of them, taken from the prefix cache    */
    int64_t completion_tokens;     /* generated so far (stop ids not counted) */
    double t_submit, t_first_token, t_end; /* seconds of CLOCK_MONOTONIC; 0: not yet */
    double t_last_token;           /* when the latest generated token was
                                      given out (0: none yet); a request in a
                                      caller's session ends a step after its
                                      last token (that token is fed), so
                                      decode rates are timed to here           */
    og_kv_metrics kv;              /* once it has ended: its session's KV figures
                                      as it ended (bytes held and live, growth,
                                      graph captures); zero before             */
} og_request_output;

/* Waits until the request has new output or has ended, or timeout_s seconds
 * (< 0: no limit; 0: only looks), and gives out what is new. Once it has
 * ended, every call returns at once with finish set and nothing new. OG_OK
 * in every case but NULL arguments. */
OG_API og_status og_request_next(og_request *r, og_request_output *out, double timeout_s);
/* Asks the request to end (finish CANCELLED) at the engine's next step,
 * which frees its session; a no-op once it has ended. Any thread. */
OG_API void og_request_cancel(og_request *r);
/* Output not yet taken by og_request_next: its bytes (text, tokens and
 * log-probabilities) and when the oldest of it was produced (0: none).
 * Any thread: e.g. a server that cancels a request whose client stopped
 * reading. */
OG_API void og_request_backlog(og_request *r, size_t *bytes, double *oldest);
/* Cancels it if it still runs and frees the handle; with a session of the
 * caller's, returns once the engine has let go of it (the tokens given out
 * so far fed to it). NULL is a no-op. */
OG_API void og_request_destroy(og_request *r);

/* The engine's figures as Prometheus text (offgraph_requests_running,
 * _waiting, sessions, KV bytes, tokens, prefix cache, steps, requests by
 * outcome). Owned by the caller: og_free; NULL without memory. */
OG_API char *og_engine_metrics_text(og_engine *e);

#ifdef __cplusplus
}
#endif
#endif /* OFFGRAPH_H */
