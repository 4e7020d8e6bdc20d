/*
 * The device path without a GPU stack (issue 17): haloAllToAll and haloAllToAllv
 * with a non-NULL stream look up the buffers' memory with the CUDA / HIP runtime,
 * which these machines do not have. Every such call must return
 * haloUnhandledDeviceError, and haloGetLastError must name every place HALO looked
 * (the override variable, the sonames, the install prefixes); nothing is written,
 * and the communicator keeps working on host memory (NULL stream) afterwards.
 *
 * With HALO_TEST_DEVICE_RUNTIME=1 (a machine with a CUDA runtime, as in
 * scripts/gpu-check.sh) the same host buffers with a stream must instead be
 * haloInvalidArgument ("host memory").
 */
#include "halo_test.h"

#define N_MAX 64

static uint8_t sendb[N_MAX * 4], recvb[N_MAX * 4];

int main(void) {
    haloComm_t comm = NULL;
    test_rank = env_int("RANK", -1);
    CHECK(haloCommInitFromEnv(&comm));
    int n = -1, me = -1;
    CHECK(haloCommCount(comm, &n));
    CHECK(haloCommUserRank(comm, &me));
    if (n > N_MAX)
        FAIL("at most %d ranks", N_MAX);
    for (int i = 0; i < n * 4; i++) {
        sendb[i] = (uint8_t)(me * 16 + i);
        recvb[i] = 0xEE;
    }
    int stream_dummy = 0;
    haloStream_t stream = &stream_dummy;
    size_t counts[N_MAX], displs[N_MAX];
    for (int q = 0; q < n; q++) {
        counts[q] = 4;
        displs[q] = 4 * (size_t)q;
    }
    const char *have = getenv("HALO_TEST_DEVICE_RUNTIME");
    if (have != NULL && strcmp(have, "1") == 0) {
        EXPECT_ERR(comm, haloAllToAll(sendb, recvb, 4, haloUint8, comm, stream),
                   haloInvalidArgument, "host memory");
        EXPECT_ERR(comm,
                   haloAllToAllv(sendb, counts, displs, recvb, counts, displs, haloUint8, comm,
                                 stream),
                   haloInvalidArgument, "host memory");
    } else {
        const char *places[] = {"no CUDA/HIP runtime library could be loaded",
                                "HALO_CUDART_LIBRARY (not set)",
                                "libamdhip64.so.6",
                                "libcudart.so.12",
                                "/usr/local/cuda/lib64/libcudart.so",
                                "/opt/rocm/lib/libamdhip64.so"};
        for (size_t i = 0; i < sizeof(places) / sizeof(places[0]); i++) {
            EXPECT_ERR(comm, haloAllToAll(sendb, recvb, 4, haloUint8, comm, stream),
                       haloUnhandledDeviceError, places[i]);
            EXPECT_ERR(comm,
                       haloAllToAllv(sendb, counts, displs, recvb, counts, displs, haloUint8,
                                     comm, stream),
                       haloUnhandledDeviceError, places[i]);
        }
        /* The description of the code itself. */
        if (strstr(haloGetErrorString(haloUnhandledDeviceError), "device") == NULL)
            FAIL("haloGetErrorString(1) is \"%s\"", haloGetErrorString(haloUnhandledDeviceError));
    }
    for (int i = 0; i < n * 4; i++)
        if (recvb[i] != 0xEE)
            FAIL("receive byte %d was written by a rejected device call", i);
    /* Other calls still refuse a stream. */
    EXPECT_ERR(comm, haloSend(sendb, 1, haloUint8, (me + 1) % n, comm, stream),
               haloInvalidArgument, "only haloAllToAll and haloAllToAllv take device buffers");

    /* The host path on the same communicator. */
    CHECK(haloAllToAll(sendb, recvb, 4, haloUint8, comm, NULL));
    for (int q = 0; q < n; q++)
        for (int i = 0; i < 4; i++)
            if (recvb[q * 4 + i] != (uint8_t)(q * 16 + me * 4 + i))
                FAIL("after the device errors: byte %d from rank %d is %u", i, q,
                     (unsigned)recvb[q * 4 + i]);
    haloResult_t async = haloInternalError;
    CHECK(haloCommGetAsyncError(comm, &async));
    if (async != haloSuccess)
        FAIL("async error %d after rejected device calls", (int)async);
    CHECK(haloCommDestroy(comm));
    printf("device ok (rank %d of %d, %d errors checked)\n", me, n, checked_errors);
    return 0;
}
