/*
 * stall_consume: the C contender of `bench/run stall`. A training loop whose
 * GPU step is a sleep, fed by one libgranary session, timed batch by batch.
 *
 *   stall_consume SOCKET DATASET BATCH STEP_MS WARMUP_BATCHES BATCHES WINDOW_S SEED
 *
 * WARMUP_BATCHES batches are consumed unmeasured; then batches are measured
 * until BATCHES or WINDOW_S seconds, whichever comes first. The time spent in
 * granary_next_batch is the GPU's wait; each sample's header magic is
 * checked (libgranary checks its CRC-32C) and the batch is released right
 * before the GPU step, which sleeps STEP_MS. `mark window-start` and
 * `mark window-end` lines let the caller read CPU counters at the window's
 * edges; the last line is one JSON object.
 *
 * Built by `bench/run stall` against libgranary.so:
 *   cc -O2 -Iclient-c/include bench/stall_consume.c -Ltarget/release \
 *      -Wl,-rpath,target/release -lgranary
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "granary.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
    struct timespec t;
    t.tv_sec = (time_t)s;
    t.tv_nsec = (long)((s - (double)t.tv_sec) * 1e9);
    while (nanosleep(&t, &t) != 0) {
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest rank, as report::percentile on the Rust side. */
static double percentile(const double *sorted, size_t n, double p) {
    if (n == 0) {
        return 0.0;
    }
    size_t rank = (size_t)(p / 100.0 * (double)n + 0.999999999);
    if (rank < 1) {
        rank = 1;
    }
    if (rank > n) {
        rank = n;
    }
    return sorted[rank - 1];
}

/* Takes the next batch, checks it, releases it; returns its sample count,
   or -1 when the stream ended, or -2 on an error. */
static long one_batch(granary_session *session, double *waited) {
    granary_batch *batch = NULL;
    double t = now_s();
    int rc = granary_next_batch(session, 120000, &batch);
    *waited = now_s() - t;
    if (rc == GRANARY_E_END_OF_STREAM) {
        return -1;
    }
    if (batch == NULL || rc != GRANARY_OK) {
        fprintf(stderr, "stall_consume: next batch: %s (%s)\n", granary_strerror(rc),
                granary_last_error_message());
        if (batch != NULL) {
            granary_batch_release(session, batch);
        }
        return -2;
    }
    size_t n = granary_batch_len(batch);
    long good = 0;
    for (size_t i = 0; i < n; i++) {
        granary_sample s;
        if (granary_batch_sample(batch, i, &s) != GRANARY_OK || s.status != GRANARY_OK ||
            s.length < 8 || memcmp(s.data, "GRNSYNTH", 8) != 0) {
            fprintf(stderr, "stall_consume: a sample failed or lacks the synthetic header\n");
            granary_batch_release(session, batch);
            return -2;
        }
        good++;
    }
    granary_batch_release(session, batch);
    return good;
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr,
                "usage: stall_consume SOCKET DATASET BATCH STEP_MS WARMUP_BATCHES BATCHES WINDOW_S SEED\n");
        return 2;
    }
    double step = atof(argv[4]) / 1e3, window = atof(argv[7]);
    /* Never hang the benchmark: SIGALRM ends the process. */
    alarm((unsigned)(window + 300.0));
    long warmup = atol(argv[5]), want = atol(argv[6]);
    granary_session_options opts;
    granary_session_options_init(&opts);
    opts.dataset = argv[2];
    opts.batch_size = (uint32_t)atol(argv[3]);
    opts.epoch_count = 1;
    opts.seed = (uint64_t)strtoull(argv[8], NULL, 10);
    if (opts.batch_size == 0 || want <= 0 || window <= 0.0 || step < 0.0) {
        fprintf(stderr, "stall_consume: bad arguments\n");
        return 2;
    }
    granary_client *client = NULL;
    granary_session *session = NULL;
    double t_start = now_s();
    int rc = granary_connect(argv[1], &client);
    if (rc == GRANARY_OK) {
        rc = granary_session_open(client, &opts, &session);
    }
    if (rc != GRANARY_OK) {
        fprintf(stderr, "stall_consume: %s (%s)\n", granary_strerror(rc),
                granary_last_error_message());
        return 2;
    }
    double waited = 0.0, first_batch = -1.0;
    for (long i = 0; i < warmup; i++) {
        if (one_batch(session, &waited) < 0) {
            return 1;
        }
        if (first_batch < 0.0) {
            first_batch = now_s() - t_start;
        }
        sleep_s(step);
    }
    double *waits = calloc((size_t)want, sizeof(double));
    if (waits == NULL) {
        return 2;
    }
    long batches = 0, samples = 0;
    printf("mark window-start\n");
    fflush(stdout);
    double t0 = now_s();
    while (batches < want && now_s() - t0 < window) {
        long n = one_batch(session, &waits[batches]);
        if (n == -1) {
            break;
        }
        if (n < 0) {
            return 1;
        }
        if (first_batch < 0.0) {
            first_batch = now_s() - t_start;
        }
        batches++;
        samples += n;
        sleep_s(step);
    }
    double wall = now_s() - t0;
    printf("mark window-end\n");
    double sum = 0.0;
    for (long i = 0; i < batches; i++) {
        sum += waits[i];
    }
    qsort(waits, (size_t)batches, sizeof(double), cmp_double);
    printf("{\"contender\":\"granary_c\",\"workers\":0,\"batch\":%u,\"step_ms\":%.3f,\"batches\":%ld,"
           "\"samples\":%ld,\"wall_s\":%.4f,\"idle\":%.5f,\"img_per_s\":%.2f,\"wait_p50_ms\":%.3f,"
           "\"wait_p99_ms\":%.3f,\"first_batch_s\":%.3f,\"busy_s\":%.4f,\"run_s\":%.4f}\n",
           opts.batch_size, step * 1e3, batches, samples, wall, wall > 0 ? sum / wall : 0.0,
           wall > 0 ? (double)samples / wall : 0.0, percentile(waits, (size_t)batches, 50) * 1e3,
           percentile(waits, (size_t)batches, 99) * 1e3, first_batch,
           (double)(warmup + batches) * step, t0 + wall - t_start);
    fflush(stdout);
    free(waits);
    granary_session_close(session);
    granary_client_free(client);
    return 0;
}
