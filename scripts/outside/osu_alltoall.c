/*
 * An outside harness: OSU's osu_alltoall timing loop written against each library's own
 * API, as a user measuring HALO and MPI with their own program would (issue 30). Built
 * twice by scripts/outside/run.sh:
 *
 *   -DUSE_MPI   MPI_Alltoall between MPI_Barriers (launched with mpirun)
 *   (default)   haloAllToAll between haloBarriers, the communicator from the
 *               launcher's environment (haloCommInitFromEnv; `halo launch`, torchrun)
 *
 * Per size (bytes per peer, powers of two from MIN to MAX): SKIP untimed calls, then
 * ITERS calls, each after a barrier, timed alone (OSU's timing); the figure is the
 * mean over ranks of each rank's mean, in microseconds. The received bytes are
 * checked after the last call of every size.
 *
 *   osu_alltoall MIN MAX ITERS SKIP
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef USE_MPI
#include <mpi.h>
#else
#include "halo.h"
#endif

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

#define DIE(...)                                                                         \
    do {                                                                                 \
        fprintf(stderr, __VA_ARGS__);                                                    \
        fputc('\n', stderr);                                                             \
        exit(1);                                                                         \
    } while (0)

#ifdef USE_MPI
#define NAME "MPI_Alltoall"
static int rank, size;
static void setup(int *argc, char ***argv) {
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
}
static void barrier(void) { MPI_Barrier(MPI_COMM_WORLD); }
static void alltoall(const void *s, void *r, size_t n) {
    if (MPI_Alltoall(s, (int)n, MPI_BYTE, r, (int)n, MPI_BYTE, MPI_COMM_WORLD) != MPI_SUCCESS)
        DIE("MPI_Alltoall failed");
}
static double mean_over_ranks(double v) {
    double sum = 0;
    MPI_Allreduce(&v, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return sum / size;
}
static void finish(void) { MPI_Finalize(); }
#else
#define NAME "haloAllToAll"
static int rank, size;
static haloComm_t comm;
#define CHECK(call)                                                                      \
    do {                                                                                 \
        haloResult_t r_ = (call);                                                        \
        if (r_ != haloSuccess)                                                           \
            DIE("%s: %s (%s)", #call, haloGetErrorString(r_), haloGetLastError(comm));   \
    } while (0)
static void setup(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    CHECK(haloCommInitFromEnv(&comm));
    CHECK(haloCommUserRank(comm, &rank));
    CHECK(haloCommCount(comm, &size));
}
static void barrier(void) { CHECK(haloBarrier(comm)); }
static void alltoall(const void *s, void *r, size_t n) {
    CHECK(haloAllToAll(s, r, n, haloUint8, comm, NULL));
}
static double mean_over_ranks(double v) {
    double sum = 0;
    CHECK(haloAllReduce(&v, &sum, 1, haloFloat64, haloSum, comm, NULL));
    return sum / size;
}
static void finish(void) { CHECK(haloCommDestroy(comm)); }
#endif

static uint8_t pattern(int src, int dst, size_t i) {
    return (uint8_t)(src * 31 + dst * 7 + i * 13);
}

int main(int argc, char **argv) {
    setup(&argc, &argv);
    if (argc != 5)
        DIE("usage: %s MIN MAX ITERS SKIP", argv[0]);
    size_t min = strtoull(argv[1], NULL, 10), max = strtoull(argv[2], NULL, 10);
    int iters = atoi(argv[3]), skip = atoi(argv[4]);
    if (min < 1 || max < min || iters < 1 || skip < 0)
        DIE("bad arguments");
    uint8_t *send = malloc(max * (size_t)size), *recv = malloc(max * (size_t)size);
    if (!send || !recv)
        DIE("out of memory");
    if (rank == 0)
        printf("# %s, %d ranks, OSU timing (barrier outside the timer)\n# Size  Avg Latency(us)\n",
               NAME, size);
    for (size_t n = min; n <= max; n *= 2) {
        for (int q = 0; q < size; q++)
            for (size_t i = 0; i < n; i++)
                send[(size_t)q * n + i] = pattern(rank, q, i);
        double total = 0;
        for (int it = 0; it < skip + iters; it++) {
            barrier();
            double t = now_us();
            alltoall(send, recv, n);
            if (it >= skip)
                total += now_us() - t;
        }
        for (int q = 0; q < size; q++)
            for (size_t i = 0; i < n; i++)
                if (recv[(size_t)q * n + i] != pattern(q, rank, i))
                    DIE("rank %d: %zu bytes per peer: byte %zu from rank %d is wrong", rank, n, i,
                        q);
        double avg = mean_over_ranks(total / iters);
        if (rank == 0)
            printf("%-8zu %12.2f\n", n, avg);
        fflush(stdout);
    }
    free(send);
    free(recv);
    finish();
    return 0;
}
