/* NCCL loaded at run time (nccl_cuda.h). */
#include "exec/nccl_cuda.h"

#include <dlfcn.h>
#include <nccl.h>
#include <stdint.h>
#include <string.h>

typedef struct nccl_api {
    ncclResult_t (*init_all)(ncclComm_t *comms, int n, const int *devices);
    ncclResult_t (*destroy)(ncclComm_t comm);
    ncclResult_t (*all_reduce)(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream);
    const char *(*error)(ncclResult_t r);
} nccl_api;

struct og_nccl {
    void *lib;
    nccl_api api;
    int n;
    ncclComm_t *comms; /* [n] */
};

void og_nccl_close(og_nccl *c) {
    if (!c) return;
    for (int i = 0; c->comms && i < c->n; i++)
        if (c->comms[i]) c->api.destroy(c->comms[i]);
    og_free(c->comms);
    if (c->lib) dlclose(c->lib);
    og_free(c);
}

og_status og_nccl_open(int n_devices, const int *devices, og_nccl **out) {
    *out = NULL;
    if (n_devices < 1 || !devices) return og_set_error(OG_ERR_INVALID_ARGUMENT, "NCCL: %d devices", n_devices);
    og_nccl *c = og_calloc(1, sizeof *c);
    if (!c) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
    c->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!c->lib) {
        og_nccl_close(c);
        return og_set_error(OG_ERR_UNSUPPORTED, "tensor parallel on CUDA needs NCCL: cannot load libnccl.so.2 (%s)",
                            dlerror());
    }
    /* dlsym gives a void *; its bits are the function's address (POSIX) */
    static const char *const names[4] = {"ncclCommInitAll", "ncclCommDestroy", "ncclAllReduce", "ncclGetErrorString"};
    void *f[4];
    for (int i = 0; i < 4; i++)
        if (!(f[i] = dlsym(c->lib, names[i]))) {
            og_nccl_close(c);
            return og_set_error(OG_ERR_UNSUPPORTED, "libnccl.so.2 lacks %s, which this build calls", names[i]);
        }
    memcpy(&c->api.init_all, &f[0], sizeof f[0]);
    memcpy(&c->api.destroy, &f[1], sizeof f[1]);
    memcpy(&c->api.all_reduce, &f[2], sizeof f[2]);
    memcpy(&c->api.error, &f[3], sizeof f[3]);
    c->n = n_devices;
    c->comms = og_calloc((size_t)n_devices, sizeof *c->comms);
    if (!c->comms) {
        og_nccl_close(c);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
    }
    const ncclResult_t r = c->api.init_all(c->comms, n_devices, devices);
    if (r != ncclSuccess) {
        const char *why = c->api.error(r);
        for (int i = 0; i < n_devices; i++) c->comms[i] = NULL;
        og_nccl_close(c);
        return og_set_error(OG_ERR_BACKEND, "ncclCommInitAll over %d devices: %s", n_devices, why);
    }
    *out = c;
    return OG_OK;
}

og_status og_nccl_all_reduce_sum(og_nccl *c, int rank, float *buf, size_t count, cudaStream_t stream) {
    const ncclResult_t r = c->api.all_reduce(buf, buf, count, ncclFloat, ncclSum, c->comms[rank], stream);
    return r == ncclSuccess ? OG_OK : og_set_error(OG_ERR_BACKEND, "ncclAllReduce of %zu floats: %s", count, c->api.error(r));
}
