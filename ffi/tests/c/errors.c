/*
 * Every invalid call returns its documented code, haloGetLastError names the
 * problem, nothing is written on failure, and the communicator still works
 * afterwards (a rejected call leaves no partial state).
 *
 * Every rank makes the same calls, except in the all-to-all-v cases that show a
 * problem on one rank failing every rank instead of hanging.
 */
#include "halo_test.h"

#include <limits.h>

#define N_MAX 64

static uint8_t sendb[N_MAX * 64], recvb[N_MAX * 64];

/* The receive buffer still holds the sentinel: a rejected call wrote nothing. */
static void untouched(const char *after) {
    for (size_t i = 0; i < sizeof(recvb); i++)
        if (recvb[i] != 0xEE)
            FAIL("receive buffer byte %zu was written by a rejected %s", i, after);
}

static void results_and_version(void) {
    for (int r = 0; r <= 9; r++)
        if (haloGetErrorString(r) == NULL || strlen(haloGetErrorString(r)) == 0)
            FAIL("no text for result %d", r);
    if (strcmp(haloGetErrorString(haloSuccess), "no error") != 0)
        FAIL("haloSuccess is \"%s\"", haloGetErrorString(haloSuccess));
    if (strcmp(haloGetErrorString(42), "unknown result code") != 0 ||
        strcmp(haloGetErrorString(-1), "unknown result code") != 0)
        FAIL("unknown codes are not reported as such");
    /* The numbers are NCCL's, plus haloAborted. */
    if (haloSuccess != 0 || haloUnhandledDeviceError != 1 || haloSystemError != 2 ||
        haloInternalError != 3 || haloInvalidArgument != 4 || haloInvalidUsage != 5 ||
        haloRemoteError != 6 || haloInProgress != 7 || haloTimeout != 8 || haloAborted != 9)
        FAIL("result codes changed");
    if (haloInt8 != 0 || haloUint8 != 1 || haloInt32 != 2 || haloUint32 != 3 ||
        haloInt64 != 4 || haloUint64 != 5 || haloFloat16 != 6 || haloFloat32 != 7 ||
        haloFloat64 != 8 || haloBfloat16 != 9 || haloFloat != haloFloat32)
        FAIL("data type numbers changed");

    int version = -1;
    CHECK(haloGetVersion(&version));
    if (version != HALO_VERSION_CODE || version != HALO_VERSION(HALO_MAJOR, HALO_MINOR, HALO_PATCH))
        FAIL("haloGetVersion says %d, the header %d", version, HALO_VERSION_CODE);
    EXPECT_ERR(NULL, haloGetVersion(NULL), haloInvalidArgument, "version (an output) is NULL");
    EXPECT_ERR(NULL, haloGetUniqueId(NULL), haloInvalidArgument, "uniqueId (an output) is NULL");
}

static void init_errors(void) {
    haloUniqueId zero;
    memset(&zero, 0, sizeof(zero));
    haloComm_t untouched_comm = (haloComm_t)&zero; /* any non-NULL value */
    haloComm_t c = untouched_comm;

    EXPECT_ERR(NULL, haloCommInitRank(NULL, 2, zero, 0), haloInvalidArgument,
               "haloCommInitRank: comm (an output) is NULL");
    EXPECT_ERR(NULL, haloCommInitRank(&c, 0, zero, 0), haloInvalidArgument, "nranks is 0");
    EXPECT_ERR(NULL, haloCommInitRank(&c, 4, zero, 4), haloInvalidArgument,
               "rank 4 is out of range for 4 ranks");
    EXPECT_ERR(NULL, haloCommInitRank(&c, 4, zero, -1), haloInvalidArgument,
               "rank -1 is out of range");
    EXPECT_ERR(NULL, haloCommInitRank(&c, 2, zero, 1), haloInvalidArgument,
               "not a HALO unique id");
    /* A world too large to allocate for: refused up front, with the limit, even with a
     * valid unique id (this rank would otherwise serve the rendezvous for it). */
    haloUniqueId real;
    CHECK(haloGetUniqueId(&real));
    EXPECT_ERR(NULL, haloCommInitRankConfig(&c, INT_MAX, real, 0, NULL), haloInvalidArgument,
               "nranks is 2147483647: at most 1048576 ranks");
    EXPECT_ERR(NULL, haloCommInitRank(&c, (1 << 20) + 1, real, 0), haloInvalidArgument,
               "at most 1048576 ranks");

    /* An uninitialised config: stack garbage, here made explicit. Its pointers
     * must not be followed. */
    haloConfig_t garbage;
    memset(&garbage, 0xA5, sizeof(garbage));
    EXPECT_ERR(NULL, haloCommInitRankConfig(&c, 2, zero, 0, &garbage), haloInvalidArgument,
               "config is not initialised");
    haloConfig_t config = HALO_CONFIG_INITIALIZER;
    config.size = 8;
    EXPECT_ERR(NULL, haloCommInitRankConfig(&c, 2, zero, 0, &config), haloInvalidArgument,
               "config->size is 8");
    haloConfig_t config2 = HALO_CONFIG_INITIALIZER;
    config2.algorithm = 42;
    EXPECT_ERR(NULL, haloCommInitRankConfig(&c, 2, zero, 0, &config2), haloInvalidArgument,
               "config->algorithm 42 is not a haloAlgorithm_t");
    haloConfig_t config3 = HALO_CONFIG_INITIALIZER;
    config3.timeoutMs = 0;
    EXPECT_ERR(NULL, haloCommInitRankConfig(&c, 2, zero, 0, &config3), haloInvalidArgument,
               "timeoutMs is 0");
    haloConfig_t config4 = HALO_CONFIG_INITIALIZER;
    config4.provider = "";
    EXPECT_ERR(NULL, haloCommInitRankConfig(&c, 2, zero, 0, &config4), haloInvalidArgument,
               "provider is empty");
    EXPECT_ERR(NULL, haloCommInitFromEnv(NULL), haloInvalidArgument,
               "haloCommInitFromEnv: comm (an output) is NULL");
    if (c != untouched_comm)
        FAIL("a failed init wrote its output");
}

static void null_comm(void) {
    int x = 0;
    haloResult_t async = haloSuccess;
    size_t counts[N_MAX] = {0};
    EXPECT_ERR(NULL, haloAllToAll(sendb, recvb, 1, haloInt8, NULL, NULL), haloInvalidArgument,
               "haloAllToAll: comm is NULL");
    EXPECT_ERR(NULL, haloAllToAllv(sendb, counts, counts, recvb, counts, counts, haloInt8, NULL, NULL),
               haloInvalidArgument, "haloAllToAllv: comm is NULL");
    EXPECT_ERR(NULL, haloBarrier(NULL), haloInvalidArgument, "haloBarrier: comm is NULL");
    EXPECT_ERR(NULL, haloCommCount(NULL, &x), haloInvalidArgument, "haloCommCount: comm is NULL");
    EXPECT_ERR(NULL, haloCommUserRank(NULL, &x), haloInvalidArgument, "comm is NULL");
    EXPECT_ERR(NULL, haloCommGetAsyncError(NULL, &async), haloInvalidArgument, "comm is NULL");
    EXPECT_ERR(NULL, haloTopologyJson(NULL, NULL, 0, NULL), haloInvalidArgument, "comm is NULL");
    CHECK(haloCommDestroy(NULL));
    CHECK(haloCommAbort(NULL));
}

static void uniform_errors(haloComm_t comm, int n) {
    int stream_dummy = 0;
    EXPECT_ERR(comm, haloAllToAll(NULL, recvb, 4, haloInt8, comm, NULL), haloInvalidArgument,
               "haloAllToAll: sendbuff is NULL but count is 4");
    EXPECT_ERR(comm, haloAllToAll(sendb, NULL, 4, haloInt8, comm, NULL), haloInvalidArgument,
               "recvbuff is NULL but count is 4");
    EXPECT_ERR(comm, haloAllToAll(sendb, recvb, SIZE_MAX / 2, haloFloat32, comm, NULL),
               haloInvalidArgument, "overflows");
    EXPECT_ERR(comm, haloAllToAll(sendb, recvb, SIZE_MAX / (size_t)n + 1, haloInt8, comm, NULL),
               haloInvalidArgument, "overflows");
    EXPECT_ERR(comm, haloAllToAll(sendb, recvb, 1, 42, comm, NULL), haloInvalidArgument,
               "datatype 42 is not a haloDataType_t");
    EXPECT_ERR(comm, haloAllToAll(sendb, recvb, 1, -1, comm, NULL), haloInvalidArgument,
               "datatype -1 is not a haloDataType_t");
    EXPECT_ERR(comm, haloAllToAll(recvb, recvb, 4, haloInt8, comm, NULL), haloInvalidArgument,
               "in-place");
    untouched("haloAllToAll"); /* (checked before the in-place case wrote nothing either) */
    EXPECT_ERR(comm, haloAllToAll(sendb + 1, sendb, 4, haloInt8, comm, NULL),
               haloInvalidArgument, "overlap");
    /* A stream means device buffers (the device path): without a CUDA / HIP runtime
     * (these machines) that is haloUnhandledDeviceError (ffi/tests/c/device.c). */
    EXPECT_ERR(comm, haloAllToAll(sendb, recvb, 4, haloInt8, comm, &stream_dummy),
               haloUnhandledDeviceError, "no CUDA/HIP runtime library could be loaded");
    untouched("haloAllToAll");
}

static void v_errors(haloComm_t comm, int n, int me) {
    size_t sc[N_MAX], sd[N_MAX], rc[N_MAX], rd[N_MAX];
    /* 2 elements for each pair, blocks 4 elements apart (room to grow one). */
    for (int q = 0; q < n; q++) {
        sc[q] = rc[q] = 2;
        sd[q] = rd[q] = 4 * (size_t)q;
    }
    EXPECT_ERR(comm, haloAllToAllv(sendb, NULL, sd, recvb, rc, rd, haloInt8, comm, NULL),
               haloInvalidArgument, "haloAllToAllv: sendcounts is NULL");
    EXPECT_ERR(comm, haloAllToAllv(sendb, sc, sd, recvb, rc, NULL, haloInt8, comm, NULL),
               haloInvalidArgument, "rdispls is NULL");
    EXPECT_ERR(comm, haloAllToAllv(sendb, sc, sd, recvb, rc, rd, 10, comm, NULL),
               haloInvalidArgument, "datatype 10 is not a haloDataType_t");
    EXPECT_ERR(comm, haloAllToAllv(sendb, sc, sd, recvb, rc, rd, haloInt8, comm, (haloStream_t)sc),
               haloUnhandledDeviceError, "no CUDA/HIP runtime library could be loaded");
    untouched("haloAllToAllv (local checks)");

    /* Checked after the count exchange, on every rank: each rank's own error. */
    EXPECT_ERR(comm, haloAllToAllv(NULL, sc, sd, recvb, rc, rd, haloInt8, comm, NULL),
               haloInvalidArgument, "send buffer is NULL");
    sd[n - 1] = SIZE_MAX;
    EXPECT_ERR(comm, haloAllToAllv(sendb, sc, sd, recvb, rc, rd, haloInt8, comm, NULL),
               haloInvalidArgument, "overflows");
    sd[n - 1] = 4 * (size_t)(n - 1);
    EXPECT_ERR(comm, haloAllToAllv(recvb, sc, sd, recvb, rc, rd, haloInt8, comm, NULL),
               haloInvalidArgument, "overlap");
    untouched("haloAllToAllv (after the exchange)");

    if (n > 1) {
        /* Rank 0 expects 3 elements from rank 1, which sends 2: both of them, and
         * everyone else, fail with haloInvalidUsage - nobody hangs. */
        if (me == 0)
            rc[1] = 3;
        EXPECT_ERR(comm, haloAllToAllv(sendb, sc, sd, recvb, rc, rd, haloInt8, comm, NULL),
                   haloInvalidUsage,
                   me <= 1 ? "rank 1 sends 2 bytes to rank 0, but rank 0 expects 3"
                           : "ranks 0 and 1 disagree");
        rc[1] = 2;
        /* Only rank 1 passes a NULL send buffer: it gets haloInvalidArgument, the
         * others haloInvalidUsage naming it. */
        if (me == 1)
            EXPECT_ERR(comm, haloAllToAllv(NULL, sc, sd, recvb, rc, rd, haloInt8, comm, NULL),
                       haloInvalidArgument, "send buffer is NULL");
        else
            EXPECT_ERR(comm, haloAllToAllv(sendb, sc, sd, recvb, rc, rd, haloInt8, comm, NULL),
                       haloInvalidUsage, "rank 1 passed invalid arguments");
        untouched("haloAllToAllv (disagreeing ranks)");
    }
}

static void other_errors(haloComm_t comm) {
    char small[4];
    size_t needed = 0;
    EXPECT_ERR(comm, haloCommCount(comm, NULL), haloInvalidArgument, "count (an output) is NULL");
    EXPECT_ERR(comm, haloCommUserRank(comm, NULL), haloInvalidArgument, "rank (an output) is NULL");
    EXPECT_ERR(comm, haloCommGetAsyncError(comm, NULL), haloInvalidArgument,
               "asyncError (an output) is NULL");
    EXPECT_ERR(comm, haloTopologyJson(comm, NULL, 10, &needed), haloInvalidArgument,
               "buf is NULL but len is 10");
    EXPECT_ERR(comm, haloTopologyJson(comm, small, sizeof(small), &needed), haloInvalidArgument,
               "buf holds 4 bytes but the topology JSON needs");
    if (needed != 0)
        FAIL("haloTopologyJson wrote needed on failure");
}

/* After all the rejected calls, a real all-to-all works and is byte-exact. */
static void still_works(haloComm_t comm, int n, int me) {
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < 16; i++)
            sendb[(size_t)q * 16 + i] = pattern(7, me, q, i);
    CHECK(haloAllToAll(sendb, recvb, 16, haloUint8, comm, NULL));
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < 16; i++)
            if (recvb[(size_t)q * 16 + i] != pattern(7, q, me, i))
                FAIL("all-to-all after the errors: byte %zu from rank %d is wrong", i, q);
    /* A success leaves the last error in place. */
    if (strlen(haloGetLastError(comm)) == 0)
        FAIL("the last error was cleared by a successful call");
    haloResult_t async = haloInternalError;
    CHECK(haloCommGetAsyncError(comm, &async));
    if (async != haloSuccess)
        FAIL("argument errors set the async error to %d", (int)async);
}

int main(void) {
    test_rank = env_int("RANK", -1);
    results_and_version();
    init_errors();
    null_comm();

    haloComm_t comm = NULL;
    CHECK(haloCommInitFromEnv(&comm));
    int n = 0, me = -1;
    CHECK(haloCommCount(comm, &n));
    CHECK(haloCommUserRank(comm, &me));
    if (n > N_MAX)
        FAIL("at most %d ranks", N_MAX);
    if (strlen(haloGetLastError(comm)) != 0)
        FAIL("a new communicator has a last error: %s", haloGetLastError(comm));
    memset(recvb, 0xEE, sizeof(recvb));

    uniform_errors(comm, n);
    v_errors(comm, n, me);
    other_errors(comm);
    still_works(comm, n, me);

    CHECK(haloCommDestroy(comm));
    /* A destroyed handle is detected (HALO's table of live handles), not undefined
     * behaviour. No communicator is created in between, so no new one can have taken
     * its address. */
    EXPECT_ERR(NULL, haloCommDestroy(comm), haloInvalidArgument,
               "haloCommDestroy: comm is not a live communicator (destroyed or aborted already");
    EXPECT_ERR(NULL, haloCommCount(comm, &n), haloInvalidArgument,
               "haloCommCount: comm is not a live communicator");
    EXPECT_ERR(NULL, haloAllToAll(sendb, recvb, 1, haloInt8, comm, NULL), haloInvalidArgument,
               "haloAllToAll: comm is not a live communicator");
    EXPECT_ERR(NULL, haloCommAbort(comm), haloInvalidArgument,
               "haloCommAbort: comm is not a live communicator");
    /* A pointer HALO never made is not followed either. */
    EXPECT_ERR(NULL, haloBarrier((haloComm_t)(void *)sendb), haloInvalidArgument,
               "haloBarrier: comm is not a live communicator");
    printf("errors ok (rank %d of %d, %d invalid calls checked)\n", me, n, checked_errors);
    return 0;
}
