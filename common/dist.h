// dist: MPI across processes. Every trainer runs the same code at world size 1 (a
// plain `bin/sft ...` is an MPI singleton) and under `mpirun -np N bin/sft ...`.
// Each rank holds the whole model; gradients are summed across ranks before the
// optimizer step, so every rank takes the same step. With optimizer_sharding (ZeRO-1)
// each rank owns one contiguous shard of the flat parameter buffer (ct_shard): the
// gradient sum is reduce-scattered, each rank updates its shard, the shards all-gather.
#pragma once
#include <stddef.h>

int ct_dist_init(int *argc, char ***argv);
// The address space MPI_Init maps, for the check before it (under `ulimit -v` a short
// MPI_Init crashes or prints pages of errors): Open MPI 4.1's plug-ins, ICU data and
// PMIx segments, 80 MiB measured under a limit (glibc reserves 64 MiB arenas for its
// threads besides when there is room, and none when there is not).
#define CT_MPI_INIT_BYTES (96.0 * 1048576)
void ct_dist_finalize(void);
int ct_dist_rank(void);
int ct_dist_world(void);
// Ranks of this job on this machine (to divide the cores between them).
int ct_dist_local_size(void);

// In-place sums across ranks (no-ops at world size 1).
int ct_dist_sum_f32(float *buf, long n);
int ct_dist_sum_f64(double *buf, int n);
// A struct made only of doubles (a trainer's step statistics): summed across ranks in
// place, and added into another of its kind (a logging window).
#define ct_dist_sum_stats(s) ct_dist_sum_f64((double *)(s), (int)(sizeof *(s) / sizeof(double)))
#define ct_stats_add(dst, src) ct_f64_add((double *)(dst), (const double *)(src), (int)(sizeof *(src) / sizeof(double)))
static inline void ct_f64_add(double *dst, const double *src, int n) {
  for (int i = 0; i < n; i++) dst[i] += src[i];
}
// The largest value across ranks: error codes agree before anyone stops.
int ct_dist_max_int(int v);
// In-place element-wise maxima across ranks (a minimum is the max of the negated values).
int ct_dist_max_f32(float *buf, int n);
int ct_dist_max_f64(double *buf, int n);
// Every rank's n bytes of text, concatenated in rank order, into *out on rank 0 (malloc'd,
// NUL-terminated, *len bytes without the NUL); *out is NULL on the other ranks. At world
// size 1 it is a copy of s.
int ct_dist_gather_text(const char *s, size_t n, char **out, size_t *len);
// ZeRO-1's split of a flat buffer of n floats: rank r owns [displs[r], displs[r] +
// counts[r]), contiguous shards in rank order whose boundaries fall on multiples of 16
// floats (no cache line shared by two owners); lo, hi are this rank's. n must fit an int
// (MPI counts): a larger buffer is refused naming optimizer_sharding.
typedef struct {
  long n, lo, hi;
  int *counts, *displs;  // (world)
} ct_shard;
int ct_dist_shard_init(ct_shard *s, long n);
void ct_dist_shard_free(ct_shard *s);
// buf (n floats) summed across ranks, this rank's shard of the sum left in place at
// buf[lo .. hi) (the rest of buf is then scratch). A reduce-scatter made of MPI_Reduce's
// to each owner in 16 MiB pieces: no temporary of the whole buffer.
int ct_dist_reduce_scatter_f32(float *buf, const ct_shard *s);
// Every rank's buf[lo .. hi) into every rank's buf (MPI_Allgatherv in place).
int ct_dist_allgather_f32(float *buf, const ct_shard *s);
// Each rank's shard (hi-lo floats) into full (n floats) on rank 0 (full unused elsewhere).
int ct_dist_gather_f32(const float *shard, float *full, const ct_shard *s);
// Rank `from`'s buf (n floats) into rank 0's buf; the other ranks do nothing.
int ct_dist_fetch_f32(float *buf, long n, int from);

// Non-blocking in-place sums (MPI_Iallreduce), for overlapping the gradient sum with
// backward. They run on a communicator of their own (made by ct_dist_init), so the
// blocking collectives above may run while they are pending; every rank must start the
// same sums in the same order. ct_dist_isum_f32 starts one (n floats, at most INT_MAX;
// counted as ct_dist_sum_f32); ct_dist_progress lets MPI advance the pending ones (Open
// MPI moves them only inside MPI calls); ct_dist_wait_all waits for them all. Each
// element is the same sum as ct_dist_sum_f32's (bit for bit at 2 ranks, where a sum of
// two has one order; at more ranks MPI's choice of algorithm may order it differently).
int ct_dist_isum_f32(float *buf, long n);
int ct_dist_progress(void);
int ct_dist_wait_all(void);

// Bytes this rank has sent in the float collectives above and in ct_dist_sum_f32 /
// ct_dist_sum_f64, counted as a ring algorithm sends them (what the network must carry
// whatever algorithm MPI picks): all-reduce 2(N-1)/N of the buffer, reduce-scatter and
// all-gather (N-1)/N, a gather to rank 0 each rank's own shard. 0 at world size 1.
double ct_dist_bytes_sent(void);

// Stops every other rank after a fatal error on this one (returns at world size 1); the
// executable's ct_die (app/die.h) prints, finalizes and exits.
void ct_dist_abort(int code);
