/*
 * All-to-all and all-to-all-v through the C API, byte-exact.
 *
 *   alltoall                        communicator from the launcher's environment
 *                                   (haloCommInitFromEnv)
 *   alltoall ID_FILE ALGO TOPOLOGY  rank 0 makes a haloUniqueId and writes it to
 *                                   ID_FILE, the others read it; every rank calls
 *                                   haloCommInitRankConfig with algorithm ALGO (a
 *                                   haloAlgorithm_t number) and topology TOPOLOGY
 *                                   (RANK and WORLD_SIZE from the environment)
 *
 * - haloAllToAll for every data type and counts 0 (NULL buffers), 1, 7, 1000;
 * - haloAllToAllv over several rounds with random per-pair counts (many zeros,
 *   a whole row and a whole column of zeros), gaps between the send blocks and
 *   the receive blocks placed in reverse rank order; the gaps must stay untouched;
 * - haloBarrier, haloCommCount / haloCommUserRank against RANK / WORLD_SIZE,
 *   haloTopologyJson.
 */
#include "halo_test.h"

static const haloDataType_t TYPES[] = {haloInt8,   haloUint8,   haloInt32, haloUint32,
                                       haloInt64,  haloUint64,  haloFloat16, haloFloat32,
                                       haloFloat64, haloBfloat16};
static const size_t SIZES[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

#define SENTINEL 0xEE

static void uniform(haloComm_t comm, int n, int me) {
    const size_t counts[] = {0, 1, 7, 1000};
    int round = 0;
    for (size_t t = 0; t < sizeof(TYPES) / sizeof(TYPES[0]); t++) {
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++, round++) {
            size_t count = counts[c], block = count * SIZES[t], bytes = block * (size_t)n;
            uint8_t *send = bytes ? malloc(bytes) : NULL;
            uint8_t *recv = bytes ? malloc(bytes) : NULL;
            if (bytes && (!send || !recv))
                FAIL("out of memory");
            for (int q = 0; q < n; q++)
                for (size_t i = 0; i < block; i++)
                    send[(size_t)q * block + i] = pattern(round, me, q, i);
            if (bytes)
                memset(recv, SENTINEL, bytes);
            CHECK(haloAllToAll(send, recv, count, TYPES[t], comm, NULL));
            for (int q = 0; q < n; q++)
                for (size_t i = 0; i < block; i++)
                    if (recv[(size_t)q * block + i] != pattern(round, q, me, i))
                        FAIL("all-to-all type %d count %zu: byte %zu from rank %d is %d, "
                             "expected %d",
                             (int)TYPES[t], count, i, q, recv[(size_t)q * block + i],
                             pattern(round, q, me, i));
            free(send);
            free(recv);
        }
    }
}

/* Elements rank `src` sends to rank `dst` in `round`: 0 for a third of the pairs,
 * for everything rank 1 sends in round 1 and everything rank 0 receives in round 2. */
static size_t vcount(int round, int src, int dst) {
    if ((round == 1 && src == 1) || (round == 2 && dst == 0))
        return 0;
    uint64_t h = mix64(0x5eed0000ULL + ((uint64_t)round << 40) + ((uint64_t)src << 20) +
                       (uint64_t)dst);
    return h % 3 == 0 ? 0 : (size_t)(h % 97);
}

static void varying(haloComm_t comm, int n, int me) {
    size_t *sc = calloc((size_t)n, sizeof(size_t)), *sd = calloc((size_t)n, sizeof(size_t));
    size_t *rc = calloc((size_t)n, sizeof(size_t)), *rd = calloc((size_t)n, sizeof(size_t));
    if (!sc || !sd || !rc || !rd)
        FAIL("out of memory");
    for (int round = 0; round < 6; round++) {
        size_t t = (size_t)round * 3 % (sizeof(TYPES) / sizeof(TYPES[0]));
        size_t elem = SIZES[t];
        /* Send blocks in rank order with a one-element gap after each. */
        size_t send_len = 0;
        for (int q = 0; q < n; q++) {
            sc[q] = vcount(round, me, q);
            sd[q] = send_len;
            send_len += sc[q] + 1;
        }
        /* Receive blocks in reverse rank order, each followed by a gap. */
        size_t recv_len = 0;
        for (int q = n - 1; q >= 0; q--) {
            rc[q] = vcount(round, q, me);
            rd[q] = recv_len;
            recv_len += rc[q] + 1;
        }
        uint8_t *send = malloc(send_len * elem), *recv = malloc(recv_len * elem);
        if (!send || !recv)
            FAIL("out of memory");
        memset(send, 0x11, send_len * elem);
        memset(recv, SENTINEL, recv_len * elem);
        for (int q = 0; q < n; q++)
            for (size_t b = 0; b < sc[q] * elem; b++)
                send[sd[q] * elem + b] = pattern(100 + round, me, q, b);
        CHECK(haloAllToAllv(send, sc, sd, recv, rc, rd, TYPES[t], comm, NULL));
        for (int q = 0; q < n; q++) {
            for (size_t b = 0; b < rc[q] * elem; b++)
                if (recv[rd[q] * elem + b] != pattern(100 + round, q, me, b))
                    FAIL("all-to-all-v round %d: byte %zu from rank %d is %d, expected %d",
                         round, b, q, recv[rd[q] * elem + b], pattern(100 + round, q, me, b));
            for (size_t b = 0; b < elem; b++)
                if (recv[(rd[q] + rc[q]) * elem + b] != SENTINEL)
                    FAIL("all-to-all-v round %d: the gap after rank %d's block was written",
                         round, q);
        }
        free(send);
        free(recv);
    }
    free(sc);
    free(sd);
    free(rc);
    free(rd);
}

static void topology(haloComm_t comm, int n) {
    size_t needed = 0;
    CHECK(haloTopologyJson(comm, NULL, 0, &needed));
    if (needed < 3)
        FAIL("haloTopologyJson needs %zu bytes", needed);
    char *json = malloc(needed);
    if (!json)
        FAIL("out of memory");
    size_t again = 0;
    CHECK(haloTopologyJson(comm, json, needed, &again));
    if (again != needed || strlen(json) + 1 != needed || json[0] != '{')
        FAIL("haloTopologyJson: %zu / %zu bytes, \"%.40s\"", again, needed, json);
    /* Every rank appears in the topology: its "rank" entries number n. */
    int ranks = 0;
    for (const char *p = json; (p = strstr(p, "\"rank\"")) != NULL; p++)
        ranks++;
    if (ranks != n)
        FAIL("the topology names %d ranks, expected %d:\n%s", ranks, n, json);
    free(json);
}

/* The unique id: made by rank 0 and written to `path` (atomically: a temporary
 * file, then rename), read by the others once it appears. */
static haloUniqueId shared_id(const char *path, int rank) {
    haloUniqueId id;
    if (rank == 0) {
        CHECK(haloGetUniqueId(&id));
        char tmp[4096];
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(&id, sizeof(id), 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0)
            FAIL("cannot write the unique id to %s", path);
        return id;
    }
    for (int tries = 0; tries < 6000; tries++) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t got = fread(&id, sizeof(id), 1, f);
            fclose(f);
            if (got == 1)
                return id;
        }
        sleep_ms(10);
    }
    FAIL("no unique id in %s after 60 s", path);
}

int main(int argc, char **argv) {
    haloComm_t comm = NULL;
    test_rank = env_int("RANK", -1);
    if (argc == 4) {
        haloUniqueId id = shared_id(argv[1], test_rank);
        haloConfig_t config = HALO_CONFIG_INITIALIZER;
        config.algorithm = atoi(argv[2]);
        config.topology = argv[3];
        config.timeoutMs = 30000;
        CHECK(haloCommInitRankConfig(&comm, env_int("WORLD_SIZE", -1), id, test_rank, &config));
    } else if (argc == 1) {
        CHECK(haloCommInitFromEnv(&comm));
    } else {
        FAIL("usage: alltoall [ID_FILE ALGO TOPOLOGY]");
    }
    int n = -1, me = -1;
    CHECK(haloCommCount(comm, &n));
    CHECK(haloCommUserRank(comm, &me));
    test_rank = me;
    if (n != env_int("WORLD_SIZE", -2) || me != env_int("RANK", -2))
        FAIL("rank %d of %d, but RANK=%s WORLD_SIZE=%s", me, n, getenv("RANK"),
             getenv("WORLD_SIZE"));

    uniform(comm, n, me);
    varying(comm, n, me);
    CHECK(haloBarrier(comm));
    topology(comm, n);

    haloResult_t async = haloInternalError;
    CHECK(haloCommGetAsyncError(comm, &async));
    if (async != haloSuccess)
        FAIL("async error %d after successful collectives", (int)async);
    CHECK(haloCommDestroy(comm));
    printf("alltoall ok (rank %d of %d)\n", me, n);
    return 0;
}
