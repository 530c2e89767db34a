/*
 * consume: reads every batch of a Granary session, checks every sample and
 * prints a one-line summary.
 *
 *   consume [-f] SOCKET DATASET [BATCH_SIZE [EPOCHS [SEED [RANK WORLD_SIZE]]]]
 *
 * Every sample's CRC-32C is recomputed and compared with the one the agent
 * recorded. With -f (the agent is the test fixture of client-c/tests), the
 * content itself is checked too: the fixture fills sample `id` of dataset
 * `name` with `id` as 8 little-endian bytes followed by a splitmix64 stream
 * seeded from FNV-1a(name) and `id`, and labels it `id % 1000`.
 *
 * Exit status: 0 when every batch was read and every check passed, 1 on a
 * mismatch or a per-batch error, 2 on a usage or session error.
 *
 * Build: see the Makefile next to this file, or
 *   cc -O2 -I../include consume.c ../../target/release/libgranary.a -lpthread -ldl -lm
 */
#include <errno.h>
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
            "usage: consume [-f] SOCKET DATASET [BATCH_SIZE [EPOCHS [SEED [RANK WORLD_SIZE]]]]\n");
}

int main(int argc, char **argv) {
    int fixture = 0;
    int argi = 1;
    if (argi < argc && strcmp(argv[argi], "-f") == 0) {
        fixture = 1;
        argi++;
    }
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
    rc = granary_session_open(client, &opts, &session);
    if (rc != GRANARY_OK) {
        fprintf(stderr, "consume: open session: %s (%s)\n", granary_strerror(rc),
                granary_last_error_message());
        granary_client_free(client);
        return 2;
    }

    uint64_t batches = 0, samples = 0, bytes = 0, errors = 0, mismatches = 0;
    int failed = 0;
    for (;;) {
        granary_batch *batch = NULL;
        rc = granary_next_batch(session, 30000, &batch);
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
                    errors++;
                    continue;
                }
                samples++;
                bytes += s.length;
                int ok = crc32c(s.data, s.length) == s.crc32c;
                if (ok && fixture) {
                    ok = fixture_content_ok(dataset_hash, &s);
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
        rc = granary_batch_release(session, batch);
        if (rc != GRANARY_OK) {
            fprintf(stderr, "consume: release: %s (%s)\n", granary_strerror(rc),
                    granary_last_error_message());
            failed = 1;
            break;
        }
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
