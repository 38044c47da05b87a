/* Whole-file reads of small text files. */
#include "core/textfile.h"

#include "core/core.h"

#include <errno.h>
#include <stdio.h>

og_status og_read_text_file(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return og_set_error(OG_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *g = og_realloc(buf, cap);
            if (!g) {
                og_free(buf);
                fclose(f);
                return og_set_error(OG_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
            }
            buf = g;
        }
        size_t r = fread(buf + n, 1, 4096, f);
        n += r;
        if (r < 4096) break;
    }
    bool err = ferror(f);
    fclose(f);
    if (err) {
        og_free(buf);
        return og_set_error(OG_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return OG_OK;
}
