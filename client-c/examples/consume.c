/*
 * consume: reads every batch of a Granary session, checks every sample and
 * prints a one-line summary.
 *
 *   consume [-n] [-f|-s] [-i] [-p MS] SOCKET DATASET [BATCH_SIZE [EPOCHS [SEED [RANK WORLD_SIZE]]]]
 *
 * This program turns on libgranary's full check (options.no_crc_check = 0;
 * the library's default is 1): every sample's CRC-32C is checked before a
 * batch is handed out (a mismatch is a CORRUPT failed sample); -n leaves it
 * off, as the library's default does. This
 * program recomputes the CRC itself as well and compares it with the one
 * the agent recorded. With -f (the agent is the test fixture of client-c/tests), the
 * content itself is checked too: the fixture fills sample `id` of dataset
 * `name` with `id` as 8 little-endian bytes followed by a splitmix64 stream
 * seeded from FNV-1a(name) and `id`, and labels it `id % 1000`.
 * With -s (a synthetic dataset made by `granary demo`, see agent/src/synth.rs)
 * every byte is checked against the synthetic format: header magic, header
 * checksum, file id = sample id, class = label, length, and the SplitMix64
 * body; one line per epoch (samples, bytes, seconds) precedes the summary,
 * and a `first_batch_ms=` line the time from session open to the first batch.
 * With -i every delivered sample is printed as `sample EPOCH ID` and a
 * `resumes=N` line (how often libgranary resumed the session after losing
 * its agent) precedes the summary. With -p MS the program pauses MS
 * milliseconds after each batch, like a training step.
 *
 * Exit status: 0 when every batch was read and every check passed, 1 on a
 * mismatch or a per-batch error, 2 on a usage or session error.
 *
 * Build: see the Makefile next to this file, or
 *   cc -O2 -I../include consume.c ../../target/release/libgranary.a -lpthread -ldl -lm
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <time.h>
#include <unistd.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary.h"

/* ---- CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) ------------- */

static uint32_t crc_table[256];

static void crc32c_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        }
        crc_table[i] = c;
    }
}

static uint32_t crc32c(const uint8_t *p, uint64_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n--) {
        c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    }
    return c ^ 0xFFFFFFFFu;
}

/* ---- The fixture's deterministic content -------------------------------- */

static uint64_t fnv1a64(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    }
    return h;
}

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Whether `s` holds what the fixture writes for its id. */
static int fixture_content_ok(uint64_t dataset_hash, const granary_sample *s) {
    uint64_t state = dataset_hash ^ (s->id * 0xD1B54A32D192ED03ull);
    uint64_t word = s->id;
    for (uint64_t pos = 0; pos < s->length; pos += 8) {
        if (pos > 0) {
            word = splitmix64(&state);
        }
        uint64_t n = s->length - pos < 8 ? s->length - pos : 8;
        for (uint64_t k = 0; k < n; k++) {
            if (s->data[pos + k] != (uint8_t)(word >> (8 * k))) {
                return 0;
            }
        }
    }
    return s->label == (int32_t)(s->id % 1000);
}

/* ---- The synthetic dataset's format (agent/src/synth.rs) ----------------- */

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t load_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--) {
        v = (v << 8) | p[k];
    }
    return v;
}

/* Whether `s` is exactly the synthetic file with its id and label. */
static int synth_content_ok(const granary_sample *s) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        return 0; /* big-endian hosts would need byte swaps */
    }
    static const uint8_t magic[8] = {'G', 'R', 'N', 'S', 'Y', 'N', 'T', 'H'};
    if (s->length < 40 || memcmp(s->data, magic, 8) != 0) {
        return 0;
    }
    uint64_t h = 0x47524E53594E5448ull;
    for (int w = 0; w < 3; w++) {
        h = mix64(h ^ load_le64(s->data + 8 * w));
    }
    uint64_t id = load_le64(s->data + 8);
    uint32_t cls = (uint32_t)(load_le64(s->data + 16) & 0xFFFFFFFFu);
    uint32_t len = (uint32_t)(load_le64(s->data + 16) >> 32);
    if (h != load_le64(s->data + 24) || id != s->id || (int32_t)cls != s->label ||
        len != s->length) {
        return 0;
    }
    uint64_t state = mix64(load_le64(s->data + 32) ^ h);
    uint64_t pos = 40;
    for (; pos + 8 <= s->length; pos += 8) {
        uint64_t word = splitmix64(&state), got;
        memcpy(&got, s->data + pos, 8); /* the format is little-endian, like the host */
        if (got != word) {
            return 0;
        }
    }
    uint64_t word = splitmix64(&state);
    for (uint64_t k = 0; pos + k < s->length; k++) {
        if (s->data[pos + k] != (uint8_t)(word >> (8 * k))) {
            return 0;
        }
    }
    return 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- Arguments ----------------------------------------------------------- */

static int parse_u64(const char *text, uint64_t max, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || v > max) {
        return 0;
    }
    *out = (uint64_t)v;
    return 1;
}

static void usage(void) {
    fprintf(stderr,
            "usage: consume [-n] [-f|-s] [-i] [-p MS] SOCKET DATASET "
            "[BATCH_SIZE [EPOCHS [SEED [RANK WORLD_SIZE]]]]\n");
}

int main(int argc, char **argv) {
    int fixture = 0, synth = 0, no_library_crc = 0, print_ids = 0;
    uint64_t pause_ms = 0;
    int opt;
    while ((opt = getopt(argc, argv, "nfsip:")) != -1) {
        switch (opt) {
        case 'n':
            no_library_crc = 1;
            break;
        case 'f':
            fixture = 1;
            break;
        case 's':
            synth = 1;
            break;
        case 'i':
            print_ids = 1;
            break;
        case 'p':
            if (!parse_u64(optarg, 3600 * 1000, &pause_ms)) {
                usage();
                return 2;
            }
            break;
        default:
            usage();
            return 2;
        }
    }
    if (fixture && synth) {
        usage();
        return 2;
    }
    int argi = optind;
    int rest = argc - argi;
    if (rest < 2 || rest > 7 || rest == 6) {
        usage();
        return 2;
    }
    const char *socket_path = argv[argi];
    const char *dataset = argv[argi + 1];

    granary_session_options opts;
    granary_session_options_init(&opts);
    opts.dataset = dataset;
    opts.no_crc_check = no_library_crc;
    uint64_t v = 0;
    uint32_t *u32_fields[] = {&opts.batch_size, &opts.epoch_count};
    for (int k = 0; k < 2 && argi + 2 + k < argc; k++) {
        if (!parse_u64(argv[argi + 2 + k], UINT32_MAX, &v)) {
            usage();
            return 2;
        }
        *u32_fields[k] = (uint32_t)v;
    }
    if (argi + 4 < argc) {
        if (!parse_u64(argv[argi + 4], UINT64_MAX, &opts.seed)) {
            usage();
            return 2;
        }
    }
    if (argi + 6 < argc) {
        uint64_t rank = 0, world = 0;
        if (!parse_u64(argv[argi + 5], UINT32_MAX, &rank) ||
            !parse_u64(argv[argi + 6], UINT32_MAX, &world)) {
            usage();
            return 2;
        }
        opts.rank = (uint32_t)rank;
        opts.world_size = (uint32_t)world;
    }

    if (granary_abi_version() != GRANARY_ABI_VERSION) {
        fprintf(stderr, "consume: libgranary speaks ABI %u, this program was built for %u\n",
                granary_abi_version(), (unsigned)GRANARY_ABI_VERSION);
        return 2;
    }
    crc32c_init();
    uint64_t dataset_hash = fnv1a64(dataset);

    granary_client *client = NULL;
    int rc = granary_connect(socket_path, &client);
    if (rc != GRANARY_OK) {
        fprintf(stderr, "consume: connect: %s (%s)\n", granary_strerror(rc),
                granary_last_error_message());
        return 2;
    }
    granary_session *session = NULL;
    double t_open = now_s();
    rc = granary_session_open(client, &opts, &session);
    if (rc != GRANARY_OK) {
        fprintf(stderr, "consume: open session: %s (%s)\n", granary_strerror(rc),
                granary_last_error_message());
        granary_client_free(client);
        return 2;
    }

    uint64_t batches = 0, samples = 0, bytes = 0, errors = 0, mismatches = 0;
    uint64_t epoch_samples = 0, epoch_bytes = 0;
    double t_epoch = now_s();
    int failed = 0;
    for (;;) {
        granary_batch *batch = NULL;
        rc = granary_next_batch(session, 30000, &batch);
        if (synth && batches == 0 && batch != NULL) {
            printf("first_batch_ms=%.2f\n", (now_s() - t_open) * 1e3);
            t_epoch = now_s();
        }
        if (rc == GRANARY_E_END_OF_STREAM) {
            break;
        }
        if (batch == NULL) {
            /* No batch: the session cannot go on. */
            fprintf(stderr, "consume: next batch: %s (%s)\n", granary_strerror(rc),
                    granary_last_error_message());
            failed = 1;
            break;
        }
        batches++;
        if (rc != GRANARY_OK) {
            /* The agent could not fill this batch; it must still be released. */
            fprintf(stderr, "consume: batch %" PRIu64 " of epoch %u: %s\n",
                    granary_batch_index(batch), granary_batch_epoch(batch), granary_strerror(rc));
            errors++;
        } else {
            size_t n = granary_batch_len(batch);
            for (size_t i = 0; i < n; i++) {
                granary_sample s;
                if (granary_batch_sample(batch, i, &s) != GRANARY_OK) {
                    errors++;
                    continue;
                }
                if (s.status != GRANARY_OK) {
                    /* The sample could not be read; its status says why:
                       NOT_FOUND, IO, TIMEOUT, CORRUPT or SHORT_READ. */
                    fprintf(stderr, "consume: sample %" PRIu64 " failed: %s (%d)\n", s.id,
                            granary_strerror(s.status), s.status);
                    errors++;
                    continue;
                }
                if (print_ids) {
                    printf("sample %u %" PRIu64 "\n", granary_batch_epoch(batch), s.id);
                }
                samples++;
                bytes += s.length;
                epoch_samples++;
                epoch_bytes += s.length;
                /* In -s mode the format check covers every byte, so the
                   (slower, table-driven) CRC is skipped. */
                int ok = synth || crc32c(s.data, s.length) == s.crc32c;
                if (ok && fixture) {
                    ok = fixture_content_ok(dataset_hash, &s);
                }
                if (ok && synth) {
                    ok = synth_content_ok(&s);
                }
                if (!ok) {
                    if (mismatches < 10) {
                        fprintf(stderr, "consume: sample %" PRIu64 " (%" PRIu64
                                        " bytes) fails its check\n",
                                s.id, s.length);
                    }
                    mismatches++;
                }
            }
        }
        if (synth && (granary_batch_flags(batch) & GRANARY_BATCH_END_OF_EPOCH)) {
            double t = now_s();
            printf("epoch=%u samples=%" PRIu64 " bytes=%" PRIu64 " seconds=%.4f\n",
                   granary_batch_epoch(batch), epoch_samples, epoch_bytes, t - t_epoch);
            epoch_samples = 0;
            epoch_bytes = 0;
            t_epoch = t;
        }
        rc = granary_batch_release(session, batch);
        if (pause_ms > 0) {
            struct timespec ts = {(time_t)(pause_ms / 1000), (long)(pause_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (rc != GRANARY_OK) {
            fprintf(stderr, "consume: release: %s (%s)\n", granary_strerror(rc),
                    granary_last_error_message());
            failed = 1;
            break;
        }
    }

    if (print_ids) {
        uint32_t resumes = 0;
        if (granary_session_resumes(session, &resumes) != GRANARY_OK) {
            failed = 1;
        }
        printf("resumes=%u\n", resumes);
    }
    printf("batches=%" PRIu64 " samples=%" PRIu64 " bytes=%" PRIu64 " errors=%" PRIu64
           " mismatches=%" PRIu64 "\n",
           batches, samples, bytes, errors, mismatches);
    granary_session_close(session);
    granary_client_free(client);
    if (failed) {
        return 2;
    }
    return (mismatches || errors) ? 1 : 0;
}
