/* Levelled logging to stderr, and the monotonic clock. */
#define _POSIX_C_SOURCE 200809L
#include "core.h"

#include <stdio.h>
#include <time.h>

static og_log_level g_level = OG_LOG_WARN;

void og_log_set_level(og_log_level level) { g_level = level; }

void og_log(og_log_level level, const char *fmt, ...) {
    static const char *names[] = {"debug", "info", "warning", "error"};
    if (level < g_level || level >= OG_LOG_NONE) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "offgraph %s: ", names[level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

double og_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
