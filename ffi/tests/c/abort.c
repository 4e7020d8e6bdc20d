/*
 * haloCommAbort from a watchdog thread while the main thread is blocked in a
 * collective that its peer never joins (2 ranks):
 * - rank 0's all-to-all blocks (rank 1 does not call it); meanwhile the watchdog
 *   finds the communicator busy (haloInvalidUsage), reads its async error
 *   (none), then aborts it;
 * - the all-to-all returns haloAborted promptly, long before the timeout, and
 *   haloGetLastError(NULL) says so; the communicator is gone afterwards.
 * - rank 1 waits for rank 0 to finish and destroys its communicator.
 */
#include "halo_test.h"

#include <pthread.h>

static haloComm_t comm;
static haloResult_t busy, async_before, aborted;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void *watchdog(void *arg) {
    (void)arg;
    sleep_ms(500);
    busy = haloBarrier(comm); /* the main thread holds the communicator */
    async_before = haloInternalError;
    if (haloCommGetAsyncError(comm, &async_before) != haloSuccess)
        async_before = -1;
    aborted = haloCommAbort(comm);
    return NULL;
}

int main(void) {
    test_rank = env_int("RANK", -1);
    CHECK(haloCommInitFromEnv(&comm));
    int n = 0;
    CHECK(haloCommCount(comm, &n));
    if (n != 2)
        FAIL("run with 2 ranks");
    if (test_rank == 1) {
        /* Never joins the all-to-all; gives rank 0 time to abort. */
        sleep_ms(3000);
        CHECK(haloCommDestroy(comm));
        printf("abort ok (rank 1)\n");
        return 0;
    }

    pthread_t t;
    if (pthread_create(&t, NULL, watchdog, NULL) != 0)
        FAIL("pthread_create");
    uint8_t send[2 * 64] = {0}, recv[2 * 64];
    double start = now();
    haloResult_t r = haloAllToAll(send, recv, 64, haloUint8, comm, NULL);
    double waited = now() - start;
    pthread_join(t, NULL);

    if (busy != haloInvalidUsage)
        FAIL("haloBarrier on a busy communicator returned %d, expected haloInvalidUsage", (int)busy);
    if (async_before != haloSuccess)
        FAIL("haloCommGetAsyncError during the collective gave %d", (int)async_before);
    if (aborted != haloSuccess)
        FAIL("haloCommAbort returned %d", (int)aborted);
    if (r != haloAborted)
        FAIL("the blocked all-to-all returned %d (%s), expected haloAborted: %s", (int)r,
             haloGetErrorString(r), haloGetLastError(NULL));
    expect_message(__LINE__, "haloAllToAll", haloGetLastError(NULL), "abort");
    if (waited > 10.0)
        FAIL("the aborted all-to-all took %.1f s to return", waited);
    printf("abort ok (rank 0: haloAborted after %.2f s)\n", waited);
    return 0;
}
