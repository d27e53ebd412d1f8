/*
 * The cost of libselsig's batch calls per work request, the C side of
 * crates/selsig/benches/tracker.rs `post_and_retire`: the same stream (a send queue of 256,
 * 4096 work requests per round, every 1st, 16th or 64th signaled, the clock read once per
 * post call), posted with selsig_tracker_post_batch until the queue is full, its
 * completions handed over with one selsig_tracker_handle_wcs, the retired work requests
 * collected with selsig_tracker_poll_retired (their cookies, outcomes and sequence numbers)
 * or with selsig_tracker_poll_completed (the cookies of those that completed: all of them
 * here). Prints nanoseconds per work request, the median of 15 runs of 200 rounds. Run by
 * scripts/bench-capi.sh.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "selsig.h"

enum { DEPTH = 256, BATCH = 4096, ROUNDS = 200, RUNS = 15 };

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void fail(const char *what, selsig_result rc)
{
    fprintf(stderr, "post_retire: %s: %s\n", what, selsig_strerror(rc));
    exit(1);
}

int main(void)
{
    static uint64_t cookies[BATCH];
    static selsig_posted posted[DEPTH];
    static struct ibv_wc wcs[DEPTH];
    static selsig_retired retired[DEPTH];
    static uint64_t completed[DEPTH];
    for (int i = 0; i < BATCH; i++)
        cookies[i] = (uint64_t)i;
    const uint32_t intervals[] = {1, 16, 64};
    for (int fast = 0; fast < 2; fast++)
    for (size_t e = 0; e < sizeof intervals / sizeof intervals[0]; e++) {
        selsig_config config;
        selsig_tracker *t;
        selsig_config_init(&config, DEPTH, DEPTH);
        config.interval = intervals[e];
        selsig_result rc = selsig_tracker_create(&config, &t);
        if (rc != SELSIG_OK)
            fail("selsig_tracker_create", rc);
        double runs[RUNS];
        uint64_t sum = 0;
        for (int run = 0; run < RUNS; run++) {
            double start = now_ns();
            for (int round = 0; round < ROUNDS; round++) {
                size_t done = 0;
                while (done < BATCH) {
                    size_t want = BATCH - done < DEPTH ? BATCH - done : DEPTH, n = 0;
                    rc = selsig_tracker_post_batch(t, cookies + done, want, 0, posted, &n);
                    if (rc != SELSIG_OK && rc != SELSIG_ERR_SQ_FULL && rc != SELSIG_ERR_CQ_FULL)
                        fail("selsig_tracker_post_batch", rc);
                    done += n;
                    size_t k = 0;
                    for (size_t i = 0; i < n; i++)
                        if (posted[i].send_flags) {
                            memset(&wcs[k], 0, sizeof wcs[k]);
                            wcs[k++].wr_id = posted[i].wr_id;
                        }
                    size_t handled = 0;
                    rc = selsig_tracker_handle_wcs(t, wcs, k, &handled);
                    if (rc != SELSIG_OK)
                        fail("selsig_tracker_handle_wcs", rc);
                    if (fast) {
                        do {
                            rc = selsig_tracker_poll_completed(t, completed, DEPTH, &n);
                            if (rc != SELSIG_OK)
                                fail("selsig_tracker_poll_completed", rc);
                            for (size_t i = 0; i < n; i++)
                                sum += completed[i];
                        } while (n == DEPTH);
                    }
                    do {
                        rc = selsig_tracker_poll_retired(t, retired, DEPTH, &n);
                        if (rc != SELSIG_OK)
                            fail("selsig_tracker_poll_retired", rc);
                        for (size_t i = 0; i < n; i++)
                            sum += retired[i].cookie;
                    } while (n > 0);
                }
            }
            runs[run] = (now_ns() - start) / ((double)ROUNDS * BATCH);
        }
        qsort(runs, RUNS, sizeof runs[0], cmp);
        printf("c_api post_and_retire %-14s every %-3u %6.2f ns/WR (min %.2f, max %.2f; checksum %llu)\n",
               fast ? "poll_completed" : "poll_retired", intervals[e], runs[RUNS / 2], runs[0],
               runs[RUNS - 1], (unsigned long long)sum);
        selsig_tracker_destroy(t);
    }
    return 0;
}
