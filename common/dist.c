// dist: the MPI calls — init as a singleton or under mpirun, sums and max across ranks,
// ZeRO-1's shards (reduce-scatter, all-gather, gather), a count of the bytes sent, abort.
// No transport of its own: Open MPI picks the algorithms.
#include "dist.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static int rank_ = 0, world_ = 1, local_ = 1, inited_ = 0;
// Floats per collective call: Open MPI's reductions allocate temporaries the size of the
// message (its ring reduce-scatter one of the whole buffer, even in place; a 2-rank
// all-reduce of 135M floats peaked 250 MB above the plan), so big buffers go in 16 MiB
// pieces. Each element is still summed the same way.
#define CHUNK (1L << 22)
static double sent_;  // bytes, ring-algorithm count (ct_dist_bytes_sent)
// The non-blocking sums' communicator (a copy of the world's: their order is their own)
// and their queue: one MPI_Iallreduce in flight at a time (req_), the others waiting in
// start order (q_[head_ .. n_)). Open MPI's schedule-based Iallreduce (libnbc) moves only
// inside MPI calls, and with many in flight each call walks them all: 21 sums of 25 MB
// between 2 ranks took 30 s started together, 4.8 s one after another (3.7 s blocking).
typedef struct {
  float *buf;
  int n;
} isum;
static MPI_Comm isum_comm_ = MPI_COMM_NULL;
static MPI_Request req_ = MPI_REQUEST_NULL;
static isum *q_;
static int head_, n_, cap_;

// What a ring sends of `bytes` in `passes` passes over the buffer (N-1)/N each.
static void count_ring(double bytes, int passes) {
  sent_ += passes * bytes * (world_ - 1) / world_;
}

double ct_dist_bytes_sent(void) { return sent_; }

int ct_dist_init(int *argc, char ***argv) {
  if (inited_) return 0;
  if (MPI_Init(argc, argv) != MPI_SUCCESS) return ct_set_error(CT_EMPI, "MPI_Init failed");
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  MPI_Comm_size(local, &local_);
  MPI_Comm_free(&local);
  // made here, where every rank is, since MPI_Comm_dup is itself a collective
  if (world_ > 1 && MPI_Comm_dup(MPI_COMM_WORLD, &isum_comm_) != MPI_SUCCESS)
    return ct_set_error(CT_EMPI, "MPI_Comm_dup failed");
  inited_ = 1;
  return 0;
}

void ct_dist_finalize(void) {
  free(q_);
  q_ = NULL;
  head_ = n_ = cap_ = 0;
  if (inited_ && isum_comm_ != MPI_COMM_NULL) MPI_Comm_free(&isum_comm_);
  if (inited_) MPI_Finalize();
  inited_ = 0;
}

int ct_dist_rank(void) { return rank_; }
int ct_dist_world(void) { return world_; }
int ct_dist_local_size(void) { return local_; }

int ct_dist_sum_f32(float *buf, long n) {
  if (world_ == 1) return 0;
  count_ring(4.0 * n, 2);
  for (long off = 0; off < n; off += CHUNK) {
    int cnt = (int)(n - off < CHUNK ? n - off : CHUNK);
    if (MPI_Allreduce(MPI_IN_PLACE, buf + off, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
      return ct_set_error(CT_EMPI, "MPI_Allreduce failed");
  }
  return 0;
}

// Starts the next queued sum when none is in flight.
static int isum_next(void) {
  if (req_ != MPI_REQUEST_NULL || head_ == n_) return 0;
  isum *x = &q_[head_++];
  if (MPI_Iallreduce(MPI_IN_PLACE, x->buf, x->n, MPI_FLOAT, MPI_SUM, isum_comm_, &req_) != MPI_SUCCESS)
    return ct_set_error(CT_EMPI, "MPI_Iallreduce failed");
  return 0;
}

int ct_dist_isum_f32(float *buf, long n) {
  if (world_ == 1 || n == 0) return 0;
  if (n > INT_MAX) return ct_set_error(CT_EINVAL, "ct_dist_isum_f32: %ld floats in one sum", n);
  if (n_ == cap_) {
    int cap = cap_ ? 2 * cap_ : 64;
    isum *q = realloc(q_, sizeof *q * (size_t)cap);
    if (!q) return ct_set_error(CT_ENOMEM, "out of memory");
    q_ = q, cap_ = cap;
  }
  count_ring(4.0 * n, 2);
  q_[n_++] = (isum){buf, (int)n};
  return isum_next();
}

int ct_dist_progress(void) {
  int done = 0;
  if (req_ != MPI_REQUEST_NULL && MPI_Test(&req_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
    return ct_set_error(CT_EMPI, "MPI_Test failed");
  return isum_next();
}

int ct_dist_wait_all(void) {
  int rc = 0;
  while (!rc && (req_ != MPI_REQUEST_NULL || head_ < n_)) {
    if (req_ != MPI_REQUEST_NULL && MPI_Wait(&req_, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      rc = ct_set_error(CT_EMPI, "MPI_Wait failed");
    if (!rc) rc = isum_next();
  }
  head_ = n_ = 0;
  return rc;
}

int ct_dist_sum_f64(double *buf, int n) {
  if (world_ == 1) return 0;
  count_ring(8.0 * n, 2);
  if (MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
    return ct_set_error(CT_EMPI, "MPI_Allreduce failed");
  return 0;
}

int ct_dist_max_int(int v) {
  if (world_ == 1) return v;
  int out = v;
  MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

int ct_dist_max_f64(double *buf, int n) {
  if (world_ == 1) return 0;
  if (MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
    return ct_set_error(CT_EMPI, "MPI_Allreduce failed");
  return 0;
}

int ct_dist_max_f32(float *buf, int n) {
  if (world_ == 1) return 0;
  if (MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
    return ct_set_error(CT_EMPI, "MPI_Allreduce failed");
  return 0;
}

int ct_dist_gather_text(const char *s, size_t n, char **out, size_t *len) {
  *out = NULL;
  *len = 0;
  if (n > INT_MAX) return ct_set_error(CT_EINVAL, "gather: %zu bytes of text on one rank", n);
  int cnt = (int)n, *counts = NULL, *displs = NULL;
  if (rank_ == 0) {
    counts = calloc(world_, sizeof(int));
    displs = calloc(world_, sizeof(int));
    if (!counts || !displs) return free(counts), free(displs), ct_set_error(CT_ENOMEM, "out of memory");
  }
  if (world_ > 1 && MPI_Gather(&cnt, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
    return free(counts), free(displs), ct_set_error(CT_EMPI, "MPI_Gather failed");
  if (world_ == 1) counts[0] = cnt;
  long total = 0;
  for (int r = 0; rank_ == 0 && r < world_; r++) {
    if (total + counts[r] > INT_MAX) return free(counts), free(displs), ct_set_error(CT_EINVAL, "gather: too much text");
    displs[r] = (int)total;
    total += counts[r];
  }
  char *buf = rank_ == 0 ? malloc((size_t)total + 1) : NULL;
  if (rank_ == 0 && !buf) return free(counts), free(displs), ct_set_error(CT_ENOMEM, "out of memory");
  int rc = 0;
  if (world_ == 1) memcpy(buf, s, n);
  else if (MPI_Gatherv(s, cnt, MPI_CHAR, buf, counts, displs, MPI_CHAR, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
    rc = ct_set_error(CT_EMPI, "MPI_Gatherv failed");
  free(counts);
  free(displs);
  if (rc) return free(buf), rc;
  if (buf) buf[total] = 0, *out = buf, *len = (size_t)total;
  return 0;
}

int ct_dist_shard_init(ct_shard *s, long n) {
  memset(s, 0, sizeof *s);
  if (n > INT_MAX)
    return ct_set_error(CT_EINVAL, "optimizer_sharding: %ld trained floats do not fit MPI's int counts "
                        "(at most %d); set optimizer_sharding: false", n, INT_MAX);
  s->counts = calloc(world_, sizeof(int));
  s->displs = calloc(world_, sizeof(int));
  if (!s->counts || !s->displs) return ct_dist_shard_free(s), ct_set_error(CT_ENOMEM, "out of memory");
  for (int r = 0; r < world_; r++) {
    long lo = n * r / world_ / 16 * 16, hi = r == world_ - 1 ? n : n * (r + 1) / world_ / 16 * 16;
    s->displs[r] = (int)lo;
    s->counts[r] = (int)(hi - lo);
  }
  s->n = n;
  s->lo = s->displs[rank_];
  s->hi = s->lo + s->counts[rank_];
  return 0;
}

void ct_dist_shard_free(ct_shard *s) {
  free(s->counts);
  free(s->displs);
  memset(s, 0, sizeof *s);
}

int ct_dist_reduce_scatter_f32(float *buf, const ct_shard *s) {
  if (world_ == 1) return 0;
  count_ring(4.0 * s->n, 1);
  // MPI_Reduce of each shard to its owner, in pieces: MPI_Reduce_scatter would hold a
  // temporary copy of the whole buffer (see CHUNK), which is the memory sharding saves
  for (int r = 0; r < world_; r++)
    for (long off = s->displs[r], end = off + s->counts[r]; off < end; off += CHUNK) {
      int cnt = (int)(end - off < CHUNK ? end - off : CHUNK);
      const void *send = rank_ == r ? MPI_IN_PLACE : (const void *)(buf + off);
      if (MPI_Reduce(send, buf + off, cnt, MPI_FLOAT, MPI_SUM, r, MPI_COMM_WORLD) != MPI_SUCCESS)
        return ct_set_error(CT_EMPI, "MPI_Reduce of rank %d's shard failed", r);
    }
  return 0;
}

int ct_dist_allgather_f32(float *buf, const ct_shard *s) {
  if (world_ == 1) return 0;
  count_ring(4.0 * s->n, 1);
  if (MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, s->counts, s->displs, MPI_FLOAT,
                     MPI_COMM_WORLD) != MPI_SUCCESS)
    return ct_set_error(CT_EMPI, "MPI_Allgatherv failed");
  return 0;
}

int ct_dist_gather_f32(const float *shard, float *full, const ct_shard *s) {
  int cnt = (int)(s->hi - s->lo);
  if (world_ == 1) {
    if (full != shard) memcpy(full, shard, sizeof(float) * (size_t)cnt);
    return 0;
  }
  if (rank_ != 0) sent_ += 4.0 * cnt;
  if (MPI_Gatherv(shard, cnt, MPI_FLOAT, full, s->counts, s->displs, MPI_FLOAT, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
    return ct_set_error(CT_EMPI, "MPI_Gatherv failed");
  return 0;
}

int ct_dist_fetch_f32(float *buf, long n, int from) {
  if (world_ == 1 || from == 0 || (rank_ != 0 && rank_ != from)) return 0;
  if (rank_ == from) sent_ += 4.0 * n;
  for (long off = 0; off < n; off += INT_MAX / 2) {
    int cnt = (int)(n - off < INT_MAX / 2 ? n - off : INT_MAX / 2), rc;
    if (rank_ == from) rc = MPI_Send(buf + off, cnt, MPI_FLOAT, 0, 0, MPI_COMM_WORLD);
    else rc = MPI_Recv(buf + off, cnt, MPI_FLOAT, from, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return ct_set_error(CT_EMPI, "MPI_Send/MPI_Recv of rank %d's state failed", from);
  }
  return 0;
}

void ct_dist_abort(int code) {
  if (world_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
}
