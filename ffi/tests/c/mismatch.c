/*
 * A uniform all-to-all with different counts on different ranks (issue 11): rank 0
 * calls haloAllToAll with 4 int32 per peer, the others with 8. No rank may return
 * haloSuccess (before the fix, ranks did, with part of the receive buffer never
 * written). A rank that received a message of the other size returns
 * haloInvalidUsage naming the size mismatch; a rank that only waited for what a failed
 * rank would have forwarded returns haloRemoteError or haloTimeout.
 *
 * Prints "mismatch ok (rank R: CODE NAME: MESSAGE)" and exits 0 when the call failed
 * that way, FAIL and exit 1 otherwise.
 */
#include "halo_test.h"

#define N_MAX 64

static int32_t sendb[N_MAX * 8], recvb[N_MAX * 8];

int main(void) {
    test_rank = env_int("RANK", -1);
    haloComm_t comm = NULL;
    CHECK(haloCommInitFromEnv(&comm));
    int n = 0, me = -1;
    CHECK(haloCommCount(comm, &n));
    CHECK(haloCommUserRank(comm, &me));
    if (n > N_MAX)
        FAIL("at most %d ranks", N_MAX);
    size_t count = me == 0 ? 4 : 8;
    for (size_t i = 0; i < (size_t)n * count; i++)
        sendb[i] = (int32_t)(me * 1000 + (int)i);
    for (size_t i = 0; i < N_MAX * 8; i++)
        recvb[i] = -1;

    haloResult_t r = haloAllToAll(sendb, recvb, count, haloInt32, comm, NULL);
    if (r == haloSuccess) {
        size_t unwritten = 0;
        for (size_t i = 0; i < (size_t)n * count; i++)
            unwritten += recvb[i] == -1;
        FAIL("haloAllToAll with count %zu returned haloSuccess although rank 0 passed 4 and "
             "the others 8 (%zu receive elements never written)",
             count, unwritten);
    }
    if (r != haloInvalidUsage && r != haloRemoteError && r != haloTimeout)
        FAIL("haloAllToAll returned %d (%s): %s", (int)r, haloGetErrorString(r),
             haloGetLastError(comm));
    if (r == haloInvalidUsage && strstr(haloGetLastError(comm), "size mismatch") == NULL)
        FAIL("haloInvalidUsage without a size mismatch: %s", haloGetLastError(comm));
    printf("mismatch ok (rank %d: %d %s: %s)\n", me, (int)r, haloGetErrorString(r),
           haloGetLastError(comm));
    haloCommDestroy(comm);
    return 0;
}
