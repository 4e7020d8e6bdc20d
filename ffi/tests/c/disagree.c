/*
 * Ranks that disagree on a call (issue "Security and integrity on a shared machine",
 * item 4): `disagree CASE` makes one call that not every rank makes alike.
 *
 *   op      haloAllReduce of 8 float: haloSum on rank 0, haloMax on the others
 *   dtype   haloAllReduce of 16 elements, haloSum: haloFloat32 on rank 0, haloInt32
 *           on the others (the same bytes)
 *   kind    4096 bytes per peer: haloAllToAll on rank 0, haloAllGather on the others
 *   barrier haloBarrier on rank 1, a 1-byte haloAllToAll on the others
 *   root    haloScatter of 4 int32: root 1 on the last rank, root 0 on the others
 *   bcastself  haloBroadcast of 8 int32: every rank names itself the root
 *   gathercross haloGather of 4 int32: every rank names the next rank the root
 *
 * Prints "disagree ok (rank R: CODE NAME: MESSAGE)" with the call's result and
 * haloGetLastError (also for haloSuccess, whose message is then "-"), and exits 0;
 * ffi/tests/c_programs.rs checks the codes and messages of every rank. A
 * result that is neither haloSuccess nor haloInvalidUsage, haloRemoteError or
 * haloTimeout, or a message on the thread that is not the communicator's, fails.
 */
#include "halo_test.h"

#define N_MAX 16
#define PER 1024

static int32_t sendb[N_MAX * PER], recvb[N_MAX * PER];

int main(int argc, char **argv) {
    test_rank = env_int("RANK", -1);
    if (argc != 2)
        FAIL("usage: disagree op|dtype|kind|barrier|root|bcastself|gathercross");
    const char *c = argv[1];
    haloComm_t comm = NULL;
    CHECK(haloCommInitFromEnv(&comm));
    int n = 0, me = -1;
    CHECK(haloCommCount(comm, &n));
    CHECK(haloCommUserRank(comm, &me));
    if (n > N_MAX)
        FAIL("at most %d ranks", N_MAX);
    for (size_t i = 0; i < (size_t)N_MAX * PER; i++)
        sendb[i] = (int32_t)(me * 1000 + (int)i);

    haloResult_t r;
    if (strcmp(c, "op") == 0) {
        r = haloAllReduce(sendb, recvb, 8, haloFloat32, me == 0 ? haloSum : haloMax, comm,
                          NULL);
    } else if (strcmp(c, "dtype") == 0) {
        r = haloAllReduce(sendb, recvb, 16, me == 0 ? haloFloat32 : haloInt32, haloSum, comm,
                          NULL);
    } else if (strcmp(c, "kind") == 0) {
        r = me == 0 ? haloAllToAll(sendb, recvb, PER, haloInt32, comm, NULL)
                    : haloAllGather(sendb, recvb, PER, haloInt32, comm, NULL);
    } else if (strcmp(c, "barrier") == 0) {
        r = me == 1 ? haloBarrier(comm) : haloAllToAll(sendb, recvb, 1, haloUint8, comm, NULL);
    } else if (strcmp(c, "root") == 0) {
        r = haloScatter(sendb, recvb, 4, haloInt32, me == n - 1 ? 1 : 0, comm, NULL);
    } else if (strcmp(c, "bcastself") == 0) {
        r = haloBroadcast(sendb, recvb, 8, haloInt32, me, comm, NULL);
    } else if (strcmp(c, "gathercross") == 0) {
        r = haloGather(sendb, recvb, 4, haloInt32, (me + 1) % n, comm, NULL);
    } else {
        FAIL("unknown case %s", c);
    }
    if (r != haloSuccess && r != haloInvalidUsage && r != haloRemoteError && r != haloTimeout)
        FAIL("%s returned %d (%s): %s", c, (int)r, haloGetErrorString(r), haloGetLastError(comm));
    const char *message = r == haloSuccess ? "-" : haloGetLastError(comm);
    if (r != haloSuccess)
        expect_message(__LINE__, c, haloGetLastError(NULL), message);
    printf("disagree ok (rank %d: %d %s: %s)\n", me, (int)r, haloGetErrorString(r), message);
    haloCommDestroy(comm);
    return 0;
}
