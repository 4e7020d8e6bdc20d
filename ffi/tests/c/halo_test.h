/*
 * Helpers shared by the C tests of libhalo (the programs in ffi/tests/c).
 *
 * The programs are built with gcc -std=c11 -Wall -Wextra -Werror against
 * ffi/include/halo.h and run as several processes by ffi/tests/c_programs.rs
 * (RANK / WORLD_SIZE / HALO_BOOTSTRAP_ADDR in the environment, as `halo launch`
 * sets them). A program prints one "<name> ok" line per rank and exits 0, or
 * prints what failed and exits 1.
 */
#ifndef HALO_TEST_H
#define HALO_TEST_H

/* nanosleep, clock_gettime, pthreads under -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include <halo.h>

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Fails the program: the rank, the line, the message. */
#define FAIL(...)                                                            \
    do {                                                                     \
        fprintf(stderr, "FAIL (rank %d, %s:%d): ", test_rank, __FILE__,      \
                __LINE__);                                                   \
        fprintf(stderr, __VA_ARGS__);                                        \
        fprintf(stderr, "\n");                                               \
        exit(1);                                                             \
    } while (0)

/* A call that must succeed. */
#define CHECK(call)                                                          \
    do {                                                                     \
        haloResult_t r_ = (call);                                            \
        if (r_ != haloSuccess)                                               \
            FAIL("%s returned %d (%s): %s", #call, (int)r_,                  \
                 haloGetErrorString(r_), haloGetLastError(NULL));            \
    } while (0)

/* A call that must fail with `code`, and whose last-error message (on `comm`,
 * and on this thread) contains `needle`. */
#define EXPECT_ERR(comm, call, code, needle)                                 \
    do {                                                                     \
        haloResult_t r_ = (call);                                            \
        if (r_ != (code))                                                    \
            FAIL("%s returned %d (%s), expected %d (%s); last error: %s",    \
                 #call, (int)r_, haloGetErrorString(r_), (int)(code),        \
                 haloGetErrorString(code), haloGetLastError(NULL));          \
        expect_message(__LINE__, #call, haloGetLastError(comm), (needle));   \
        expect_message(__LINE__, #call, haloGetLastError(NULL), (needle));   \
        checked_errors++;                                                    \
    } while (0)

int test_rank = -1; /* (one program per translation unit) */
int checked_errors = 0;

static inline void expect_message(int line, const char *call, const char *message,
                           const char *needle) {
    if (message == NULL) {
        fprintf(stderr, "FAIL (rank %d, line %d): haloGetLastError returned NULL after %s\n",
                test_rank, line, call);
        exit(1);
    }
    if (strstr(message, needle) == NULL) {
        fprintf(stderr, "FAIL (rank %d, line %d): after %s the last error is \"%s\", "
                        "which does not mention \"%s\"\n",
                test_rank, line, call, message, needle);
        exit(1);
    }
}

/* splitmix64: the same stream on every rank for the same seed. */
static inline uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The byte at `index` of what rank `src` sends to rank `dst` in round `round`. */
static inline uint8_t pattern(int round, int src, int dst, size_t index) {
    return (uint8_t)mix64(((uint64_t)round << 48) ^ ((uint64_t)src << 32) ^
                          ((uint64_t)dst << 16) ^ (uint64_t)index);
}

/* Sleeps `ms` milliseconds. */
static inline void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&t, NULL);
}

/* An integer from the environment, or `fallback`. */
static inline int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v ? atoi(v) : fallback;
}

#endif
