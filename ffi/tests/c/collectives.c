/*
 * Point-to-point, all-gather, all-reduce and split through the C API, on any
 * number of ranks >= 2 (communicator from the environment):
 * - haloSend / haloRecv around a ring (sizes differ per pair), zero-length
 *   messages with NULL buffers, a message to this rank itself;
 * - haloAllGather out of place and in place (NCCL's layout);
 * - haloAllReduce: sum, max, min over int32, int64, float, double (in place) and
 *   bfloat16, prod over int8, avg over int32 and uint8, with exact expected values;
 * - haloReduceScatter (in place too), haloBroadcast from every root (the chain
 *   too), haloGather / haloScatter out of place and in place, haloSendTagged /
 *   haloRecvTagged with interleaved tags;
 * - haloCommSplit by parity with reversed keys (and, from 3 ranks, the last rank
 *   joining none), an all-to-all on the new communicator, then the parent again;
 * - the invalid calls of each, with their codes and messages.
 */
#include "halo_test.h"

static void p2p(haloComm_t comm, int n, int me) {
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    size_t scount = 10 + 3 * (size_t)me, rcount = 10 + 3 * (size_t)prev;
    int32_t *s = malloc(scount * sizeof(int32_t)), *r = malloc(rcount * sizeof(int32_t));
    if (!s || !r)
        FAIL("out of memory");
    for (size_t i = 0; i < scount; i++)
        s[i] = me * 100000 + (int32_t)i;
    /* Even ranks send first and odd ranks receive first: no cycle of waiting senders. */
    if (me % 2 == 0) {
        CHECK(haloSend(s, scount, haloInt32, next, comm, NULL));
        CHECK(haloRecv(r, rcount, haloInt32, prev, comm, NULL));
        CHECK(haloSend(NULL, 0, haloInt32, next, comm, NULL));
        CHECK(haloRecv(NULL, 0, haloInt32, prev, comm, NULL));
    } else {
        CHECK(haloRecv(r, rcount, haloInt32, prev, comm, NULL));
        CHECK(haloSend(s, scount, haloInt32, next, comm, NULL));
        CHECK(haloRecv(NULL, 0, haloInt32, prev, comm, NULL));
        CHECK(haloSend(NULL, 0, haloInt32, next, comm, NULL));
    }
    for (size_t i = 0; i < rcount; i++)
        if (r[i] != prev * 100000 + (int32_t)i)
            FAIL("haloRecv from rank %d: element %zu is %d", prev, i, (int)r[i]);
    /* To this rank itself: buffered until received. */
    int32_t self_in[3] = {7, 8, 9}, self_out[3] = {0, 0, 0};
    CHECK(haloSend(self_in, 3, haloInt32, me, comm, NULL));
    CHECK(haloRecv(self_out, 3, haloInt32, me, comm, NULL));
    if (memcmp(self_in, self_out, sizeof(self_in)) != 0)
        FAIL("a message to this rank itself came back changed");

    char needle[64];
    snprintf(needle, sizeof(needle), "peer %d is out of range for %d ranks", n, n);
    EXPECT_ERR(comm, haloSend(s, 1, haloInt32, n, comm, NULL), haloInvalidArgument, needle);
    EXPECT_ERR(comm, haloRecv(r, 1, haloInt32, -1, comm, NULL), haloInvalidArgument,
               "peer -1 is out of range");
    EXPECT_ERR(comm, haloRecv(NULL, 3, haloInt32, prev, comm, NULL), haloInvalidArgument,
               "haloRecv: recvbuff is NULL but count is 3");
    EXPECT_ERR(comm, haloSend(s, 1, 77, next, comm, NULL), haloInvalidArgument,
               "datatype 77 is not a haloDataType_t");
    EXPECT_ERR(comm, haloSend(s, SIZE_MAX / 2, haloInt32, next, comm, NULL), haloInvalidArgument,
               "overflows");
    EXPECT_ERR(comm, haloSend(s, 1, haloInt32, next, comm, (haloStream_t)s), haloInvalidArgument,
               "stream must be NULL");
    free(s);
    free(r);
}

static void gather(haloComm_t comm, int n, int me) {
    const size_t cnt = 7;
    uint8_t send[7], *recv = malloc(cnt * (size_t)n), *buf = malloc(cnt * (size_t)n);
    if (!recv || !buf)
        FAIL("out of memory");
    for (size_t i = 0; i < cnt; i++)
        send[i] = pattern(300, me, 0, i);
    CHECK(haloAllGather(send, recv, cnt, haloUint8, comm, NULL));
    /* In place: this rank's block already sits at block `me` of the buffer. */
    memset(buf, 0xEE, cnt * (size_t)n);
    memcpy(buf + (size_t)me * cnt, send, cnt);
    CHECK(haloAllGather(buf + (size_t)me * cnt, buf, cnt, haloUint8, comm, NULL));
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++) {
            if (recv[(size_t)q * cnt + i] != pattern(300, q, 0, i))
                FAIL("all-gather: byte %zu of rank %d's block is wrong", i, q);
            if (buf[(size_t)q * cnt + i] != pattern(300, q, 0, i))
                FAIL("in-place all-gather: byte %zu of rank %d's block is wrong", i, q);
        }
    EXPECT_ERR(comm, haloAllGather(buf + 1, buf, cnt, haloUint8, comm, NULL), haloInvalidArgument,
               "sendbuff overlaps recvbuff");
    EXPECT_ERR(comm, haloAllGather(NULL, buf, cnt, haloUint8, comm, NULL), haloInvalidArgument,
               "sendbuff is NULL but count is 7");
    free(recv);
    free(buf);
}

/* bfloat16 <-> float by the top 16 bits (exact for the small integers used here). */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void reduce(haloComm_t comm, int n, int me) {
    enum { C = 33 };
    int32_t si[C], ri[C];
    int64_t sl[C], rl[C];
    float sf[C], rf[C];
    double d[C];
    uint16_t sb[C], rb[C];
    for (int i = 0; i < C; i++) {
        si[i] = me + i;
        sl[i] = (int64_t)me * i * 1000000007LL;
        sf[i] = (float)(me - i);
        d[i] = me * 0.5 + i;
        sb[i] = to_bf16((float)(me + 1));
    }
    CHECK(haloAllReduce(si, ri, C, haloInt32, haloSum, comm, NULL));
    CHECK(haloAllReduce(sl, rl, C, haloInt64, haloMax, comm, NULL));
    CHECK(haloAllReduce(sf, rf, C, haloFloat32, haloMin, comm, NULL));
    CHECK(haloAllReduce(d, d, C, haloFloat64, haloSum, comm, NULL)); /* in place */
    CHECK(haloAllReduce(sb, rb, C, haloBfloat16, haloSum, comm, NULL));
    CHECK(haloAllReduce(NULL, NULL, 0, haloFloat32, haloSum, comm, NULL));
    for (int i = 0; i < C; i++) {
        if (ri[i] != n * (n - 1) / 2 + n * i)
            FAIL("int32 sum [%d] = %d", i, (int)ri[i]);
        if (rl[i] != (int64_t)(n - 1) * i * 1000000007LL)
            FAIL("int64 max [%d] = %" PRId64, i, rl[i]);
        if (rf[i] != (float)-i)
            FAIL("float min [%d] = %g", i, (double)rf[i]);
        if (d[i] != 0.5 * n * (n - 1) / 2 + (double)n * i)
            FAIL("double in-place sum [%d] = %g", i, d[i]);
        if (from_bf16(rb[i]) != (float)(n * (n + 1) / 2))
            FAIL("bfloat16 sum [%d] = %g", i, (double)from_bf16(rb[i]));
    }

    /* int8 product (wraps as int8 does) and int32 / uint8 averages (truncating). */
    int8_t s8[C], r8[C];
    uint8_t su8[C], ru8[C];
    for (int i = 0; i < C; i++) {
        s8[i] = (int8_t)(i % 3 - 1 + (me == 0 ? 2 : 0)); /* rank 0: i%3+1, others i%3-1 */
        su8[i] = (uint8_t)(10 * me + i);
    }
    CHECK(haloAllReduce(s8, r8, C, haloInt8, haloProd, comm, NULL));
    CHECK(haloAllReduce(si, ri, C, haloInt32, haloAvg, comm, NULL));
    CHECK(haloAllReduce(su8, ru8, C, haloUint8, haloAvg, comm, NULL));
    for (int i = 0; i < C; i++) {
        int p = i % 3 + 1;
        for (int q = 1; q < n; q++)
            p *= i % 3 - 1;
        if (r8[i] != (int8_t)p)
            FAIL("int8 prod [%d] = %d, want %d", i, (int)r8[i], (int)(int8_t)p);
        if (ri[i] != (n * (n - 1) / 2 + n * i) / n)
            FAIL("int32 avg [%d] = %d", i, (int)ri[i]);
        int sum8 = 0;
        for (int q = 0; q < n; q++)
            sum8 += (uint8_t)(10 * q + i);
        if (ru8[i] != (uint8_t)((uint8_t)sum8 / n))
            FAIL("uint8 avg [%d] = %d", i, (int)ru8[i]);
    }
    EXPECT_ERR(comm, haloAllReduce(si, ri, C, haloInt32, 5, comm, NULL), haloInvalidArgument,
               "op 5 is not a haloRedOp_t");
    EXPECT_ERR(comm, haloAllReduce(si, ri, C, haloInt32, 9, comm, NULL), haloInvalidArgument,
               "op 9 is not a haloRedOp_t");
    EXPECT_ERR(comm, haloAllReduce((char *)sf + 1, rf, 4, haloFloat32, haloSum, comm, NULL),
               haloInvalidArgument, "sendbuff is not aligned to 4 bytes");
    EXPECT_ERR(comm, haloAllReduce(si, si + 1, 4, haloInt32, haloSum, comm, NULL),
               haloInvalidArgument, "overlap");
    EXPECT_ERR(comm, haloAllReduce(si, NULL, 4, haloInt32, haloSum, comm, NULL),
               haloInvalidArgument, "recvbuff is NULL but count is 4");
}

/* A byte that names its origin rank, a block and a position. */
static uint8_t mark(int rank, int block, size_t i) {
    return (uint8_t)(rank * 37 + block * 11 + (int)i * 3 + 1);
}

static void rooted(haloComm_t comm, int n, int me) {
    enum { C = 21 };
    /* Reduce-scatter: int32 sum out of place, float avg in place (NCCL's layout). */
    int32_t *rs = malloc((size_t)n * C * sizeof(int32_t));
    float *rf = malloc((size_t)n * C * sizeof(float));
    int32_t rr[C];
    if (!rs || !rf)
        FAIL("out of memory");
    for (int i = 0; i < n * C; i++) {
        rs[i] = me * 1000 + i;
        rf[i] = (float)(me + i);
    }
    CHECK(haloReduceScatter(rs, rr, C, haloInt32, haloSum, comm, NULL));
    CHECK(haloReduceScatter(rf, rf + (size_t)me * C, C, haloFloat32, haloAvg, comm, NULL));
    for (int i = 0; i < C; i++) {
        int at = me * C + i;
        if (rr[i] != 1000 * n * (n - 1) / 2 + n * at)
            FAIL("reduce-scatter int32 sum [%d] = %d", i, (int)rr[i]);
        float want = (float)(n * (n - 1) / 2 + n * at) / (float)n;
        if (rf[at] != want)
            FAIL("reduce-scatter float avg in place [%d] = %g, want %g", i, (double)rf[at],
                 (double)want);
    }
    CHECK(haloReduceScatter(NULL, NULL, 0, haloInt8, haloProd, comm, NULL));
    EXPECT_ERR(comm, haloReduceScatter(rs, rs + 1, C, haloInt32, haloSum, comm, NULL),
               haloInvalidArgument, "recvbuff overlaps sendbuff");
    EXPECT_ERR(comm, haloReduceScatter(rs, rr, C, haloInt32, 7, comm, NULL), haloInvalidArgument,
               "op 7 is not a haloRedOp_t");

    /* Broadcast from every root: out of place, in place, and a NULL sendbuff off root. */
    uint8_t *b = malloc(70000), *bs = malloc(70000);
    if (!b || !bs)
        FAIL("out of memory");
    for (int root = 0; root < n; root++) {
        size_t len = root == 1 ? 70000 : 13; /* 70000: the chain, in two chunks */
        for (size_t i = 0; i < len; i++) {
            bs[i] = mark(me, root, i);
            b[i] = 0xA5;
        }
        CHECK(haloBroadcast(me == root ? bs : NULL, b, len, haloUint8, root, comm, NULL));
        for (size_t i = 0; i < len; i++)
            if (b[i] != mark(root, root, i))
                FAIL("broadcast root %d [%zu] = %d", root, i, (int)b[i]);
        CHECK(haloBroadcast(bs, bs, len, haloUint8, root, comm, NULL)); /* in place */
        for (size_t i = 0; i < len; i++)
            if (bs[i] != mark(root, root, i))
                FAIL("in-place broadcast root %d [%zu] = %d", root, i, (int)bs[i]);
    }
    EXPECT_ERR(comm, haloBroadcast(b, b, 4, haloUint8, n, comm, NULL), haloInvalidArgument,
               "is out of range for");

    /* Gather and scatter to / from the last rank, out of place and in place. */
    int root = n - 1;
    uint16_t gs[C], *g = malloc((size_t)n * C * sizeof(uint16_t));
    if (!g)
        FAIL("out of memory");
    for (int i = 0; i < C; i++)
        gs[i] = (uint16_t)(me * 100 + i);
    CHECK(haloGather(gs, me == root ? g : NULL, C, haloFloat16, root, comm, NULL));
    if (me == root)
        for (int i = 0; i < n * C; i++)
            if (g[i] != (uint16_t)((i / C) * 100 + i % C))
                FAIL("gather [%d] = %d", i, (int)g[i]);
    if (me == root) {
        memset(g, 0, (size_t)n * C * sizeof(uint16_t));
        memcpy(g + (size_t)root * C, gs, sizeof gs);
        CHECK(haloGather(g + (size_t)root * C, g, C, haloFloat16, root, comm, NULL));
        for (int i = 0; i < n * C; i++)
            if (g[i] != (uint16_t)((i / C) * 100 + i % C))
                FAIL("in-place gather [%d] = %d", i, (int)g[i]);
    } else {
        CHECK(haloGather(gs, NULL, C, haloFloat16, root, comm, NULL));
    }
    uint16_t sr[C];
    if (me == root)
        for (int i = 0; i < n * C; i++)
            g[i] = (uint16_t)(7 + i);
    CHECK(haloScatter(me == root ? g : NULL, sr, C, haloBfloat16, root, comm, NULL));
    for (int i = 0; i < C; i++)
        if (sr[i] != (uint16_t)(7 + me * C + i))
            FAIL("scatter [%d] = %d", i, (int)sr[i]);
    CHECK(haloScatter(g, me == root ? g + (size_t)root * C : sr, C, haloBfloat16, root, comm,
                      NULL)); /* in place at the root */
    if (me != root)
        for (int i = 0; i < C; i++)
            if (sr[i] != (uint16_t)(7 + me * C + i))
                FAIL("scatter (root in place) [%d] = %d", i, (int)sr[i]);
    EXPECT_ERR(comm, haloGather(gs, g, C, haloFloat16, -1, comm, NULL), haloInvalidArgument,
               "root -1 is out of range");
    if (me == root)
        EXPECT_ERR(comm, haloScatter(NULL, sr, C, haloBfloat16, root, comm, NULL),
                   haloInvalidArgument, "sendbuff is NULL but count is 21");

    /* Tagged messages around the ring: two tags interleaved, each in its own order. */
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    int32_t out[3], in[3];
    for (int k = 0; k < 4; k++) {
        int tag = k % 2 ? HALO_MAX_TAG : 5;
        for (int i = 0; i < 3; i++)
            out[i] = me * 100 + k * 10 + i;
        if (me % 2 == 0) {
            CHECK(haloSendTagged(out, 3, haloInt32, next, tag, comm, NULL));
            CHECK(haloRecvTagged(in, 3, haloInt32, prev, tag, comm, NULL));
        } else {
            CHECK(haloRecvTagged(in, 3, haloInt32, prev, tag, comm, NULL));
            CHECK(haloSendTagged(out, 3, haloInt32, next, tag, comm, NULL));
        }
        for (int i = 0; i < 3; i++)
            if (in[i] != prev * 100 + k * 10 + i)
                FAIL("tagged message %d [%d] = %d", k, i, (int)in[i]);
    }
    EXPECT_ERR(comm, haloSendTagged(out, 3, haloInt32, next, HALO_MAX_TAG + 1, comm, NULL),
               haloInvalidArgument, "tag 16777216 is out of range");
    EXPECT_ERR(comm, haloRecvTagged(in, 3, haloInt32, prev, -2, comm, NULL), haloInvalidArgument,
               "tag -2 is out of range");
    free(rs);
    free(rf);
    free(b);
    free(bs);
    free(g);
}

static void split(haloComm_t comm, int n, int me) {
    int none = n >= 3 && me == n - 1;
    int color = none ? HALO_SPLIT_NOCOLOR : me % 2;
    haloComm_t sub = (haloComm_t)&color; /* must become NULL or a new communicator */

    haloConfig_t bad = HALO_CONFIG_INITIALIZER;
    bad.provider = "tcp";
    EXPECT_ERR(comm, haloCommSplit(comm, color, -me, &sub, &bad), haloInvalidArgument,
               "config->provider cannot change in a split");
    EXPECT_ERR(comm, haloCommSplit(comm, color, -me, NULL, NULL), haloInvalidArgument,
               "newcomm (an output) is NULL");
    if (sub != (haloComm_t)&color)
        FAIL("a failed split wrote its output");

    haloConfig_t config = HALO_CONFIG_INITIALIZER;
    config.algorithm = haloAlgoPairwise;
    config.timeoutMs = 30000;
    CHECK(haloCommSplit(comm, color, -me, &sub, &config));
    if (none) {
        if (sub != NULL)
            FAIL("HALO_SPLIT_NOCOLOR gave a communicator");
    } else {
        /* Members: the ranks of my parity, except the one that joined none; keys
         * -rank order them by descending rank. */
        int size = 0, index = 0;
        for (int q = 0; q < n; q++) {
            if (q % 2 != me % 2 || (n >= 3 && q == n - 1))
                continue;
            size++;
            if (q > me)
                index++;
        }
        int got_n = -1, got_me = -1;
        CHECK(haloCommCount(sub, &got_n));
        CHECK(haloCommUserRank(sub, &got_me));
        if (got_n != size || got_me != index)
            FAIL("split: rank %d of %d, expected %d of %d", got_me, got_n, index, size);
        uint8_t s[64 * 4], r[64 * 4];
        for (int q = 0; q < size; q++)
            for (size_t i = 0; i < 4; i++)
                s[(size_t)q * 4 + i] = pattern(400, index, q, i);
        CHECK(haloAllToAll(s, r, 4, haloUint8, sub, NULL));
        for (int q = 0; q < size; q++)
            for (size_t i = 0; i < 4; i++)
                if (r[(size_t)q * 4 + i] != pattern(400, q, index, i))
                    FAIL("all-to-all on the split communicator: byte %zu from %d", i, q);
        CHECK(haloCommDestroy(sub));
    }
    CHECK(haloBarrier(comm)); /* the parent still works */
}

int main(void) {
    test_rank = env_int("RANK", -1);
    haloComm_t comm = NULL;
    CHECK(haloCommInitFromEnv(&comm));
    int n = 0, me = -1;
    CHECK(haloCommCount(comm, &n));
    CHECK(haloCommUserRank(comm, &me));
    if (n < 2 || n > 64)
        FAIL("run with 2 to 64 ranks");
    p2p(comm, n, me);
    gather(comm, n, me);
    reduce(comm, n, me);
    rooted(comm, n, me);
    split(comm, n, me);
    CHECK(haloCommDestroy(comm));
    printf("collectives ok (rank %d of %d, %d invalid calls checked)\n", me, n, checked_errors);
    return 0;
}
