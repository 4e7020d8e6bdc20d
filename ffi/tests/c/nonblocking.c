/*
 * Non-blocking operations through the C API (request handles), byte-exact.
 *
 * - haloIAllToAll, haloIAllToAllv (zero counts, reversed receive blocks),
 *   haloISend / haloIRecv around a ring (an empty message among them),
 *   haloIAllReduce in place and out of place, all started before any is waited
 *   for; completed by haloWait, haloTest (polled until done) and haloWaitAll;
 * - haloIAllGather, haloIReduceScatter, haloIBroadcast (in place), haloIGather,
 *   haloIScatter, haloIBarrier, haloISendTagged / haloIRecvTagged, all started
 *   before haloWaitAll, and their argument errors at start;
 * - a blocking haloAllToAll called while requests are outstanding runs after them
 *   (stream order) and is byte-exact;
 * - errors: a stale (already waited) request and a double haloWaitAll are
 *   haloInvalidArgument; haloTest with done = NULL; bad arguments at start queue
 *   nothing and leave *request alone; a failed operation (a receive of the wrong
 *   size) returns its code from haloWait and the operation queued after it fails
 *   with the same code naming it;
 * - haloCommDestroy with a request outstanding waits for it (the request then still
 *   reports its result);
 * - `nonblocking abort`: haloCommAbort from a watchdog thread while rank 0 waits for
 *   a receive its peer never sends: haloWait returns haloAborted promptly, and so
 *   does the request queued after it.
 */
#include "halo_test.h"

#include <pthread.h>

static void fill(uint8_t *buf, size_t len, int round, int src, int dst) {
    for (size_t i = 0; i < len; i++)
        buf[i] = pattern(round, src, dst, i);
}

static void expect(const uint8_t *buf, size_t len, int round, int src, int dst, const char *what) {
    for (size_t i = 0; i < len; i++)
        if (buf[i] != pattern(round, src, dst, i))
            FAIL("%s: byte %zu from rank %d is %u, expected %u", what, i, src, buf[i],
                 pattern(round, src, dst, i));
}

static size_t vcount(int src, int dst) { return (size_t)((src * 3 + dst * 5) % 4) * 3; }

static void everything(haloComm_t comm, int n, int me) {
    const size_t block = 1000;
    uint8_t *a_send = malloc(block * n), *a_recv = malloc(block * n);
    uint8_t *b_recv = malloc(block * n);
    /* all-to-all-v: packed send blocks, receive blocks in reverse rank order */
    size_t sc[64], sd[64], rc[64], rd[64], stotal = 0, rtotal = 0;
    for (int q = 0; q < n; q++) {
        sc[q] = vcount(me, q);
        sd[q] = stotal;
        stotal += sc[q];
        rc[q] = vcount(q, me);
    }
    for (int q = n - 1; q >= 0; q--) {
        rd[q] = rtotal;
        rtotal += rc[q];
    }
    uint8_t *v_send = malloc(stotal + 1), *v_recv = malloc(rtotal + 1);
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    uint8_t ring_send[333], ring_recv[333];
    int64_t sum_in[9], sum_out[9];
    double max_io[5];
    if (!a_send || !a_recv || !b_recv || !v_send || !v_recv)
        FAIL("out of memory");
    for (int q = 0; q < n; q++) {
        fill(a_send + (size_t)q * block, block, 1, me, q);
        fill(v_send + sd[q], sc[q], 2, me, q);
    }
    memset(a_recv, 0xEE, block * n);
    memset(v_recv, 0xEE, rtotal + 1);
    fill(ring_send, sizeof ring_send, 3, me, next);
    for (int i = 0; i < 9; i++)
        sum_in[i] = me * 100 + i;
    for (int i = 0; i < 5; i++)
        max_io[i] = me + i;

    haloRequest_t req[8];
    CHECK(haloIAllToAll(a_send, a_recv, block, haloUint8, comm, &req[0]));
    CHECK(haloIAllToAllv(v_send, sc, sd, v_recv, rc, rd, haloUint8, comm, &req[1]));
    /* even ranks send first, odd ranks receive first: the ring matches in order */
    if (me % 2 == 0) {
        CHECK(haloISend(ring_send, sizeof ring_send, haloUint8, next, comm, &req[2]));
        CHECK(haloISend(NULL, 0, haloUint8, next, comm, &req[3]));
        CHECK(haloIRecv(ring_recv, sizeof ring_recv, haloUint8, prev, comm, &req[4]));
        CHECK(haloIRecv(NULL, 0, haloUint8, prev, comm, &req[5]));
    } else {
        CHECK(haloIRecv(ring_recv, sizeof ring_recv, haloUint8, prev, comm, &req[4]));
        CHECK(haloIRecv(NULL, 0, haloUint8, prev, comm, &req[5]));
        CHECK(haloISend(ring_send, sizeof ring_send, haloUint8, next, comm, &req[2]));
        CHECK(haloISend(NULL, 0, haloUint8, next, comm, &req[3]));
    }
    CHECK(haloIAllReduce(sum_in, sum_out, 9, haloInt64, haloSum, comm, &req[6]));
    CHECK(haloIAllReduce(max_io, max_io, 5, haloFloat64, haloMax, comm, &req[7]));

    /* Bad arguments at start: nothing queued, *request untouched. */
    haloRequest_t untouched = req[0];
    EXPECT_ERR(comm, haloISend(ring_send, 1, haloUint8, n, comm, &untouched),
               haloInvalidArgument, "out of range");
    if (untouched != req[0])
        FAIL("a failed haloISend wrote *request");
    EXPECT_ERR(comm, haloIAllToAll(a_send, a_send, block, haloUint8, comm, &untouched),
               haloInvalidArgument, "in-place");
    EXPECT_ERR(comm, haloIRecv(ring_recv, 1, haloUint8, prev, comm, NULL), haloInvalidArgument,
               "request is NULL");
    EXPECT_ERR(comm, haloIAllReduce(sum_in, sum_out, 9, 99, haloSum, comm, &untouched),
               haloInvalidArgument, "datatype");

    /* A blocking call now runs after the outstanding requests. */
    uint8_t *b_send = malloc(block * n);
    if (!b_send)
        FAIL("out of memory");
    for (int q = 0; q < n; q++)
        fill(b_send + (size_t)q * block, block, 4, me, q);
    CHECK(haloAllToAll(b_send, b_recv, block, haloUint8, comm, NULL));

    /* Complete: haloTest (polled), haloWait, haloWaitAll. */
    int done = 0, polls = 0;
    while (!done) {
        CHECK(haloTest(req[0], &done));
        polls++;
    }
    CHECK(haloWait(req[1]));
    CHECK(haloWaitAll(6, &req[2]));
    for (int i = 2; i < 8; i++)
        if (req[i] != NULL)
            FAIL("haloWaitAll left requests[%d] non-NULL", i - 2);

    for (int q = 0; q < n; q++) {
        expect(a_recv + (size_t)q * block, block, 1, q, me, "haloIAllToAll");
        expect(v_recv + rd[q], rc[q], 2, q, me, "haloIAllToAllv");
        expect(b_recv + (size_t)q * block, block, 4, q, me, "haloAllToAll after requests");
    }
    if (v_recv[rtotal] != 0xEE)
        FAIL("haloIAllToAllv wrote past the receive blocks");
    expect(ring_recv, sizeof ring_recv, 3, prev, me, "haloIRecv");
    for (int i = 0; i < 9; i++) {
        int64_t want = 0;
        for (int r = 0; r < n; r++)
            want += r * 100 + i;
        if (sum_out[i] != want)
            FAIL("haloIAllReduce sum[%d] = %" PRId64 ", expected %" PRId64, i, sum_out[i], want);
    }
    for (int i = 0; i < 5; i++)
        if (max_io[i] != (double)(n - 1 + i))
            FAIL("haloIAllReduce in place max[%d] = %g", i, max_io[i]);

    /* Stale requests. */
    EXPECT_ERR(NULL, haloWait(req[1]), haloInvalidArgument, "is not a live request");
    EXPECT_ERR(NULL, haloTest(req[0], &done), haloInvalidArgument, "is not a live request");
    EXPECT_ERR(NULL, haloWaitAll(6, &req[2]), haloInvalidArgument, "requests[0]");
    EXPECT_ERR(NULL, haloTest(req[0], NULL), haloInvalidArgument, "done is NULL");
    printf("rank %d: %d polls of haloTest\n", me, polls);
    free(a_send);
    free(a_recv);
    free(b_send);
    free(b_recv);
    free(v_send);
    free(v_recv);
}

/* Rank 0 receives 8 bytes from rank 1 where rank 1 sends 16: the receive fails
 * (haloInvalidUsage, a size mismatch), and the all-reduce rank 0 queued after it
 * is not run: it fails with the same code, naming the failed receive. */
/* The newer non-blocking collectives, all started before any is waited for. */
static void more(haloComm_t comm, int n, int me) {
    enum { C = 9 };
    int root = n / 2, next = (me + 1) % n, prev = (me + n - 1) % n;
    int32_t ag_send[C], *ag = malloc((size_t)n * C * sizeof(int32_t));
    int64_t *rs = malloc((size_t)n * C * sizeof(int64_t)), rr[C];
    uint8_t bc[C], *ga = malloc((size_t)n * C), sc_src[64 * C], sc[C];
    float out[2] = {(float)me, 0.5f}, in[2] = {0, 0};
    if (!ag || !rs || !ga)
        FAIL("out of memory");
    for (int i = 0; i < C; i++) {
        ag_send[i] = me * 10 + i;
        bc[i] = me == root ? (uint8_t)(200 + i) : 0;
    }
    for (int i = 0; i < n * C; i++) {
        rs[i] = (int64_t)me * i;
        sc_src[i] = (uint8_t)(i * 3);
    }
    haloRequest_t reqs[8];
    CHECK(haloIAllGather(ag_send, ag, C, haloInt32, comm, &reqs[0]));
    CHECK(haloIReduceScatter(rs, rr, C, haloInt64, haloMax, comm, &reqs[1]));
    CHECK(haloIBroadcast(bc, bc, C, haloUint8, root, comm, &reqs[2]));
    CHECK(haloIGather(bc, ga, C, haloUint8, 0, comm, &reqs[3]));
    CHECK(haloIScatter(sc_src, sc, C, haloInt8, root, comm, &reqs[4]));
    CHECK(haloIBarrier(comm, &reqs[5]));
    if (me % 2 == 0) {
        CHECK(haloISendTagged(out, 2, haloFloat32, next, 77, comm, &reqs[6]));
        CHECK(haloIRecvTagged(in, 2, haloFloat32, prev, 77, comm, &reqs[7]));
    } else {
        CHECK(haloIRecvTagged(in, 2, haloFloat32, prev, 77, comm, &reqs[6]));
        CHECK(haloISendTagged(out, 2, haloFloat32, next, 77, comm, &reqs[7]));
    }
    CHECK(haloWaitAll(8, reqs));
    for (int i = 0; i < n * C; i++)
        if (ag[i] != (i / C) * 10 + i % C)
            FAIL("iallgather [%d] = %d", i, (int)ag[i]);
    for (int i = 0; i < C; i++) {
        if (rr[i] != (int64_t)(n - 1) * (me * C + i))
            FAIL("ireduce-scatter max [%d] = %" PRId64, i, rr[i]);
        if (bc[i] != (uint8_t)(200 + i))
            FAIL("ibroadcast [%d] = %d", i, (int)bc[i]);
        if (sc[i] != (uint8_t)((me * C + i) * 3))
            FAIL("iscatter [%d] = %d", i, (int)sc[i]);
    }
    if (me == 0)
        for (int i = 0; i < n * C; i++)
            if (ga[i] != (uint8_t)(200 + i % C))
                FAIL("igather [%d] = %d", i, (int)ga[i]);
    if (in[0] != (float)prev || in[1] != 0.5f)
        FAIL("itagged: %g %g", (double)in[0], (double)in[1]);
    haloRequest_t untouched = (haloRequest_t)&root;
    EXPECT_ERR(comm, haloIBroadcast(bc, bc, C, haloUint8, n, comm, &untouched),
               haloInvalidArgument, "root");
    EXPECT_ERR(comm, haloISendTagged(out, 2, haloFloat32, next, -1, comm, &untouched),
               haloInvalidArgument, "tag -1 is out of range");
    EXPECT_ERR(comm, haloIBarrier(comm, NULL), haloInvalidArgument, "request is NULL");
    if (untouched != (haloRequest_t)&root)
        FAIL("a failed start wrote *request");
    free(ag);
    free(rs);
    free(ga);
}

static void failure(haloComm_t comm, int me) {
    if (me > 1)
        return;
    uint8_t buf[16] = {0};
    haloRequest_t p2p;
    if (me == 1) {
        CHECK(haloISend(buf, 16, haloUint8, 0, comm, &p2p));
        haloResult_t r = haloWait(p2p);
        printf("rank 1: the oversized send returned %d (%s)\n", (int)r, haloGetErrorString(r));
        return;
    }
    int64_t x[2] = {1, 2};
    haloRequest_t after;
    CHECK(haloIRecv(buf, 8, haloUint8, 1, comm, &p2p));
    CHECK(haloIAllReduce(x, x, 2, haloInt64, haloSum, comm, &after));
    haloResult_t r = haloWait(p2p);
    if (r != haloInvalidUsage)
        FAIL("a receive of 8 bytes where 16 were sent returned %d (%s), expected haloInvalidUsage",
             (int)r, haloGetErrorString(r));
    expect_message(__LINE__, "haloWait(p2p)", haloGetLastError(comm), "size mismatch");
    haloResult_t r2 = haloWait(after);
    if (r2 != r)
        FAIL("the queued all-reduce returned %d, expected the failure's code %d", (int)r2, (int)r);
    expect_message(__LINE__, "haloWait(after)", haloGetLastError(comm),
                   "all_reduce (operation 2) was not run because recv (operation 1)");
    if (x[0] != 1 || x[1] != 2)
        FAIL("the all-reduce that was not run wrote its buffer");
    printf("rank 0: failed receive code %d, queued all-reduce too\n", (int)r);
}

static haloComm_t watched;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void *watchdog(void *arg) {
    (void)arg;
    sleep_ms(300);
    if (haloCommAbort(watched) != haloSuccess)
        FAIL("haloCommAbort failed: %s", haloGetLastError(NULL));
    return NULL;
}

static int abort_case(haloComm_t comm, int me) {
    if (me != 0) {
        sleep_ms(3000); /* never sends */
        CHECK(haloCommDestroy(comm));
        printf("nonblocking ok (rank %d, abort case)\n", me);
        return 0;
    }
    uint8_t buf[64], send[2 * 8] = {0}, recv[2 * 8];
    haloRequest_t r1, r2;
    CHECK(haloIRecv(buf, sizeof buf, haloUint8, 1, comm, &r1));
    CHECK(haloIAllToAll(send, recv, 8, haloUint8, comm, &r2));
    watched = comm;
    pthread_t t;
    if (pthread_create(&t, NULL, watchdog, NULL) != 0)
        FAIL("pthread_create");
    double start = now();
    haloResult_t a = haloWait(r1);
    double waited = now() - start;
    haloResult_t b = haloWait(r2);
    pthread_join(t, NULL);
    if (a != haloAborted || b != haloAborted)
        FAIL("after haloCommAbort the requests returned %d and %d, expected haloAborted (9)",
             (int)a, (int)b);
    if (waited > 5.0)
        FAIL("haloWait returned %.1f s after the start, the abort came at 0.3 s", waited);
    printf("nonblocking ok (rank 0, abort case: haloAborted after %.2f s)\n", waited);
    return 0;
}

int main(int argc, char **argv) {
    test_rank = env_int("RANK", -1);
    haloComm_t comm = NULL;
    CHECK(haloCommInitFromEnv(&comm));
    int n = 0, me = -1;
    CHECK(haloCommCount(comm, &n));
    CHECK(haloCommUserRank(comm, &me));
    if (n < 2 || n > 64)
        FAIL("run with 2 to 64 ranks");
    if (argc > 1 && strcmp(argv[1], "abort") == 0)
        return abort_case(comm, me);
    for (int round = 0; round < 3; round++)
        everything(comm, n, me);
    if (argc > 1 && strcmp(argv[1], "failure") == 0) {
        failure(comm, me);
        /* the communicator is left in an unknown state: no more collectives */
        CHECK(haloCommDestroy(comm));
        printf("nonblocking ok (rank %d of %d, failure case)\n", me, n);
        return 0;
    }
    more(comm, n, me);
    /* Destroy with a request outstanding: it completes first. */
    int64_t v[3] = {me, me, me};
    haloRequest_t last;
    CHECK(haloIAllReduce(v, v, 3, haloInt64, haloSum, comm, &last));
    CHECK(haloCommDestroy(comm));
    int done = 0;
    CHECK(haloTest(last, &done));
    if (!done)
        FAIL("haloCommDestroy returned with a request not done");
    for (int i = 0; i < 3; i++)
        if (v[i] != (int64_t)n * (n - 1) / 2)
            FAIL("all-reduce before destroy: %" PRId64, v[i]);
    printf("nonblocking ok (rank %d of %d, %d invalid calls checked)\n", me, n, checked_errors);
    return 0;
}
