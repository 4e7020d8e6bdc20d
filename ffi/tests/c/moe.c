/*
 * The MoE calls of the C API (issue 29) on 4 ranks (nodes:2x2 from HALO_TOPOLOGY):
 * - haloMoeHandleCreate for every mode, top-k 1, 2 and 3, a shuffled expert table
 *   (experts on ranks other than e % n), some ranks without tokens; every rank
 *   computes every rank's routing from the same seed, so it knows the reference;
 * - haloMoeHandleGetInfo / GetLayout against the reference layout (rows by local
 *   expert, source rank, token);
 * - haloMoeDispatch byte-exact (float and int32 rows), an "expert" (y = x * (1 + e))
 *   and haloMoeCombine exact (small integers in double: any summation order gives
 *   the same bits), haloMoeDispatchPairs (each row's gate) and haloMoeCombinePairs
 *   back to the slots;
 * - bad input on every rank with its code: a freed handle, a double free, an expert
 *   id out of range on one rank (haloInvalidArgument there naming the token and slot,
 *   haloInvalidUsage naming it elsewhere), a masked slot (-1), a different hidden on
 *   one rank, a NULL buffer on one rank, an integer combine, a stream.
 */
#include "halo_test.h"

#define NEXP 8
#define HIDDEN 5
#define MAXT 8

static int32_t expert_rank[NEXP];

/* Rank `r`'s routing in round `round`: tokens, ids (tokens x k). */
static size_t routing(int round, int r, int k, int64_t *ids) {
    size_t t = (size_t)((r + round) % 4 == 3 ? 0 : 2 + (r + round) % 5);
    for (size_t i = 0; i < t; i++) {
        int64_t pool[NEXP];
        for (int e = 0; e < NEXP; e++)
            pool[e] = e;
        int left = NEXP;
        for (int j = 0; j < k; j++) {
            int p = (int)(mix64((uint64_t)round * 1000 + (uint64_t)r * 100 + i * 10 + (uint64_t)j) %
                          (uint64_t)left);
            ids[i * (size_t)k + (size_t)j] = pool[p];
            pool[p] = pool[--left];
        }
    }
    return t;
}

static double token_value(int r, size_t t, size_t i) {
    return (double)(r * 1000 + (int)t * 10 + (int)i);
}

static double gate_value(int r, size_t t, int j) {
    return (double)(r * 100 + (int)t * 4 + j) / 8.0;
}

static int has(const int64_t *ids, int k, int64_t e) {
    for (int j = 0; j < k; j++)
        if (ids[j] == e)
            return j;
    return -1;
}

static void round_trip(haloComm_t comm, int n, int me, int round, int k, haloMoeMode_t mode) {
    int64_t ids[4][MAXT * 3];
    size_t tokens[4];
    for (int r = 0; r < n; r++)
        tokens[r] = routing(round, r, k, ids[r]);
    size_t t = tokens[me];
    haloMoeHandle_t h = 0;
    CHECK(haloMoeHandleCreate(ids[me], t, k, expert_rank, NEXP, mode, comm, NULL, &h));

    /* The reference layout. */
    int32_t want_local[NEXP], want_expert[96], want_src[96];
    int64_t want_per[NEXP], want_tok[96];
    int nlocal = 0;
    size_t rows = 0;
    for (int e = 0; e < NEXP; e++) {
        if (expert_rank[e] != me)
            continue;
        want_local[nlocal] = e;
        want_per[nlocal] = 0;
        for (int s = 0; s < n; s++)
            for (size_t i = 0; i < tokens[s]; i++)
                if (has(&ids[s][i * (size_t)k], k, e) >= 0) {
                    want_expert[rows] = e;
                    want_src[rows] = s;
                    want_tok[rows] = (int64_t)i;
                    want_per[nlocal]++;
                    rows++;
                }
        nlocal++;
    }
    size_t got_rows = 999, got_t = 999;
    int got_local = -1, got_k = -1;
    CHECK(haloMoeHandleGetInfo(h, comm, &got_rows, &got_local, &got_t, &got_k));
    if (got_rows != rows || got_local != nlocal || got_t != t || got_k != k)
        FAIL("round %d: info %zu rows %d experts %zu tokens k %d, want %zu %d %zu %d", round,
             got_rows, got_local, got_t, got_k, rows, nlocal, t, k);
    int32_t local[NEXP], rexp[96], rsrc[96];
    int64_t per[NEXP], rtok[96];
    CHECK(haloMoeHandleGetLayout(h, comm, local, per, rexp, rsrc, rtok));
    CHECK(haloMoeHandleGetLayout(h, comm, NULL, NULL, NULL, NULL, NULL));
    if (memcmp(local, want_local, (size_t)nlocal * 4) || memcmp(per, want_per, (size_t)nlocal * 8) ||
        memcmp(rexp, want_expert, rows * 4) || memcmp(rsrc, want_src, rows * 4) ||
        memcmp(rtok, want_tok, rows * 8))
        FAIL("round %d mode %d: the layout differs from the reference", round, (int)mode);

    /* Rows, as doubles and as int32. */
    double x[MAXT * HIDDEN], recv[96 * HIDDEN], y[96 * HIDDEN], out[MAXT * HIDDEN];
    int32_t xi[MAXT * HIDDEN], recvi[96 * HIDDEN];
    for (size_t i = 0; i < t; i++)
        for (size_t c = 0; c < HIDDEN; c++) {
            x[i * HIDDEN + c] = token_value(me, i, c);
            xi[i * HIDDEN + c] = (int32_t)token_value(me, i, c) ^ 0x5a5a;
        }
    CHECK(haloMoeDispatch(x, recv, HIDDEN, haloFloat64, h, comm, NULL));
    CHECK(haloMoeDispatch(xi, recvi, HIDDEN, haloInt32, h, comm, NULL));
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < HIDDEN; c++) {
            double want = token_value(want_src[r], (size_t)want_tok[r], c);
            if (recv[r * HIDDEN + c] != want || recvi[r * HIDDEN + c] != ((int32_t)want ^ 0x5a5a))
                FAIL("round %d mode %d: row %zu element %zu is %g, want %g", round, (int)mode, r,
                     c, recv[r * HIDDEN + c], want);
            y[r * HIDDEN + c] = recv[r * HIDDEN + c] * (1.0 + want_expert[r]);
        }
    CHECK(haloMoeCombine(y, out, HIDDEN, haloFloat64, h, comm, NULL));
    for (size_t i = 0; i < t; i++)
        for (size_t c = 0; c < HIDDEN; c++) {
            double want = 0;
            for (int j = 0; j < k; j++)
                want += token_value(me, i, c) * (1.0 + (double)ids[me][i * (size_t)k + (size_t)j]);
            if (out[i * HIDDEN + c] != want)
                FAIL("round %d mode %d: combined token %zu element %zu is %g, want %g", round,
                     (int)mode, i, c, out[i * HIDDEN + c], want);
        }

    /* Gates to the rows and back. */
    float gates[MAXT * 3], row_gate[96], back[MAXT * 3];
    for (size_t i = 0; i < t; i++)
        for (int j = 0; j < k; j++)
            gates[i * (size_t)k + (size_t)j] = (float)gate_value(me, i, j);
    CHECK(haloMoeDispatchPairs(gates, row_gate, haloFloat32, h, comm, NULL));
    for (size_t r = 0; r < rows; r++) {
        int j = has(&ids[want_src[r]][(size_t)want_tok[r] * (size_t)k], k, want_expert[r]);
        if (row_gate[r] != (float)gate_value(want_src[r], (size_t)want_tok[r], j))
            FAIL("round %d: row %zu's gate is %g", round, r, (double)row_gate[r]);
    }
    memset(back, 0, sizeof(back));
    CHECK(haloMoeCombinePairs(row_gate, back, haloFloat32, h, comm, NULL));
    if (t > 0 && memcmp(back, gates, t * (size_t)k * sizeof(float)) != 0)
        FAIL("round %d: haloMoeCombinePairs did not return the gates to their slots", round);
    CHECK(haloMoeHandleFree(h));
}

static void bad_input(haloComm_t comm, int n, int me) {
    int64_t ids[2] = {me % NEXP, (me + 1) % NEXP};
    float x[2 * HIDDEN] = {0}, recv[96 * HIDDEN], y[96 * HIDDEN] = {0};
    haloMoeHandle_t h = 0;
    CHECK(haloMoeHandleCreate(ids, 1, 2, expert_rank, NEXP, haloMoeDedup, comm, NULL, &h));
    size_t rows = 0;
    CHECK(haloMoeHandleGetInfo(h, comm, &rows, NULL, NULL, NULL));

    /* A different hidden on rank 1: every rank fails, naming both calls. */
    EXPECT_ERR(comm, haloMoeDispatch(x, recv, me == 1 ? 4 : HIDDEN, haloFloat32, h, comm, NULL),
               haloInvalidUsage, "MoE calls differ");
    /* A NULL buffer on rank 2: named there, haloInvalidUsage naming rank 2 elsewhere. */
    if (me == 2)
        EXPECT_ERR(comm, haloMoeDispatch(NULL, recv, HIDDEN, haloFloat32, h, comm, NULL),
                   haloInvalidArgument, "x is NULL");
    else
        EXPECT_ERR(comm, haloMoeDispatch(x, recv, HIDDEN, haloFloat32, h, comm, NULL),
                   haloInvalidUsage, "rank 2");
    /* An integer combine, a stream: refused on every rank. */
    EXPECT_ERR(comm, haloMoeCombine(y, x, HIDDEN, haloInt32, h, comm, NULL), haloInvalidArgument,
               "not a floating-point type");
    EXPECT_ERR(comm, haloMoeDispatch(x, recv, HIDDEN, haloFloat32, h, comm, (haloStream_t)x),
               haloInvalidArgument, "stream must be NULL");
    /* Still usable after all that. */
    CHECK(haloMoeDispatch(x, recv, HIDDEN, haloFloat32, h, comm, NULL));
    CHECK(haloMoeHandleFree(h));
    char needle[96];
    snprintf(needle, sizeof(needle), "MoE handle %" PRIu64 " is not live", (uint64_t)h);
    EXPECT_ERR(NULL, haloMoeHandleFree(h), haloInvalidArgument, needle);
    EXPECT_ERR(comm, haloMoeDispatch(x, recv, HIDDEN, haloFloat32, h, comm, NULL),
               haloInvalidArgument, needle);
    EXPECT_ERR(comm, haloMoeHandleGetInfo(h, comm, &rows, NULL, NULL, NULL), haloInvalidArgument,
               needle);

    /* An expert id out of range on rank 3, a masked slot on rank 0. */
    int64_t bad[2] = {ids[0], me == 3 ? NEXP : (me == 0 ? -1 : ids[1])};
    haloMoeHandle_t unused = 12345;
    if (me == 3)
        EXPECT_ERR(comm, haloMoeHandleCreate(bad, 1, 2, expert_rank, NEXP, haloMoeAuto, comm, NULL, &unused),
                   haloInvalidArgument, "topkIdx of token 0 slot 1 is 8, not an expert 0..8");
    else if (me == 0)
        EXPECT_ERR(comm, haloMoeHandleCreate(bad, 1, 2, expert_rank, NEXP, haloMoeAuto, comm, NULL, &unused),
                   haloInvalidArgument, "masked slot");
    else
        EXPECT_ERR(comm, haloMoeHandleCreate(bad, 1, 2, expert_rank, NEXP, haloMoeAuto, comm, NULL, &unused),
                   haloInvalidUsage, "rank 0");
    if (unused != 12345)
        FAIL("a failed haloMoeHandleCreate wrote the handle");
    /* A table naming a rank that does not exist (every rank), an unknown mode. */
    int32_t table[NEXP];
    memcpy(table, expert_rank, sizeof(table));
    table[5] = n;
    snprintf(needle, sizeof(needle), "expertRank[5] is %d, not a rank", n);
    EXPECT_ERR(comm, haloMoeHandleCreate(ids, 1, 2, table, NEXP, haloMoeAuto, comm, NULL, &unused),
               haloInvalidArgument, needle);
    EXPECT_ERR(comm, haloMoeHandleCreate(ids, 1, 2, expert_rank, NEXP, (haloMoeMode_t)7, comm, NULL, &unused),
               haloInvalidArgument, "7");
    CHECK(haloBarrier(comm));
}

/* The non-blocking forms: two requests in flight, the handle freed before they
 * complete, results equal to the blocking calls' bits; a NULL buffer on rank 1 returned
 * at the start there and failing the other ranks' requests naming rank 1. */
static void nonblocking(haloComm_t comm, int me) {
    int64_t ids[2 * 2] = {me % NEXP, (me + 3) % NEXP, (me + 5) % NEXP, (me + 6) % NEXP};
    haloMoeHandle_t h = 0;
    CHECK(haloMoeHandleCreate(ids, 2, 2, expert_rank, NEXP, haloMoeDedup, comm, NULL, &h));
    size_t rows = 0;
    CHECK(haloMoeHandleGetInfo(h, comm, &rows, NULL, NULL, NULL));
    double x[2 * HIDDEN], want[96 * HIDDEN], recv[96 * HIDDEN], y[96 * HIDDEN];
    double out[2 * HIDDEN], out_want[2 * HIDDEN];
    float gates[4] = {0.5f, 0.25f, 0.125f, 2.0f}, row_gate[96], row_gate_want[96];
    for (size_t i = 0; i < 2 * HIDDEN; i++)
        x[i] = token_value(me, i / HIDDEN, i % HIDDEN);
    CHECK(haloMoeDispatch(x, want, HIDDEN, haloFloat64, h, comm, NULL));
    CHECK(haloMoeDispatchPairs(gates, row_gate_want, haloFloat32, h, comm, NULL));
    for (size_t i = 0; i < rows * HIDDEN; i++)
        y[i] = want[i] * 3.0;
    CHECK(haloMoeCombine(y, out_want, HIDDEN, haloFloat64, h, comm, NULL));

    haloRequest_t req[3] = {NULL, NULL, NULL};
    memset(recv, 0, sizeof(recv));
    CHECK(haloIMoeDispatch(x, recv, HIDDEN, haloFloat64, h, comm, &req[0]));
    CHECK(haloIMoeDispatchPairs(gates, row_gate, haloFloat32, h, comm, &req[1]));
    CHECK(haloIMoeCombine(y, out, HIDDEN, haloFloat64, h, comm, &req[2]));
    CHECK(haloMoeHandleFree(h)); /* the requests keep the routing */
    CHECK(haloWaitAll(3, req));
    if (memcmp(recv, want, rows * HIDDEN * sizeof(double)) != 0)
        FAIL("haloIMoeDispatch's rows differ from haloMoeDispatch's");
    if (memcmp(row_gate, row_gate_want, rows * sizeof(float)) != 0)
        FAIL("haloIMoeDispatchPairs's values differ from haloMoeDispatchPairs's");
    if (memcmp(out, out_want, sizeof(out)) != 0)
        FAIL("haloIMoeCombine's tokens differ from haloMoeCombine's");

    CHECK(haloMoeHandleCreate(ids, 2, 2, expert_rank, NEXP, haloMoeAuto, comm, NULL, &h));
    haloRequest_t r = NULL;
    if (me == 1) {
        EXPECT_ERR(comm, haloIMoeDispatch(NULL, recv, HIDDEN, haloFloat64, h, comm, &r),
                   haloInvalidArgument, "x is NULL");
        if (r != NULL)
            FAIL("a refused haloIMoeDispatch wrote the request");
    } else {
        CHECK(haloIMoeDispatch(x, recv, HIDDEN, haloFloat64, h, comm, &r));
        EXPECT_ERR(comm, haloWait(r), haloInvalidUsage, "rank 1");
    }
    EXPECT_ERR(comm, haloIMoeDispatch(x, recv, HIDDEN, haloFloat64, h, comm, NULL),
               haloInvalidArgument, "request is NULL");
    /* Still usable: a blocking call after the refused ones. */
    CHECK(haloMoeDispatch(x, recv, HIDDEN, haloFloat64, h, comm, NULL));
    CHECK(haloMoeHandleFree(h));
}

int main(void) {
    test_rank = env_int("RANK", -1);
    haloComm_t comm = NULL;
    CHECK(haloCommInitFromEnv(&comm));
    int n = 0, me = -1;
    CHECK(haloCommCount(comm, &n));
    CHECK(haloCommUserRank(comm, &me));
    if (n != 4)
        FAIL("run with 4 ranks");
    /* A shuffled table: expert e on rank (3e + 1) mod 4. */
    for (int e = 0; e < NEXP; e++)
        expert_rank[e] = (3 * e + 1) % n;
    int round = 0;
    for (int k = 1; k <= 3; k++) {
        round_trip(comm, n, me, round++, k, haloMoeAuto);
        round_trip(comm, n, me, round++, k, haloMoeDedup);
        round_trip(comm, n, me, round++, k, haloMoeDirect);
    }
    bad_input(comm, n, me);
    nonblocking(comm, me);
    CHECK(haloCommDestroy(comm));
    printf("moe ok (rank %d of %d, %d invalid calls checked)\n", me, n, checked_errors);
    return 0;
}
