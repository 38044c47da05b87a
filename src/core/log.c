/* Levelled logging to stderr, the monotonic clock, and waits bounded by it. */
#define _POSIX_C_SOURCE 200809L
#include "core.h"

#include <errno.h>
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

int og_cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, double until) {
    double left = until - og_time_now();
    if (!(left > 0)) return ETIMEDOUT;
    if (left > 1e9) left = 1e9; /* about 31 years: no time_t overflow */
    /* the condition's clock is the default one, CLOCK_REALTIME */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const double whole = (double)(time_t)left;
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec += (long)((left - whole) * 1e9);
    while (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    return pthread_cond_timedwait(c, m, &ts);
}
