// dist: the MPI calls — init as a singleton or under mpirun, sums and max across ranks,
// abort. No sharding yet: every rank holds the whole model and optimizer state.
#include "dist.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static int rank_ = 0, world_ = 1, local_ = 1, inited_ = 0;

int ct_dist_init(int *argc, char ***argv) {
  if (inited_) return 0;
  if (MPI_Init(argc, argv) != MPI_SUCCESS) return ct_set_error(CT_EMPI, "MPI_Init failed");
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  MPI_Comm_size(local, &local_);
  MPI_Comm_free(&local);
  inited_ = 1;
  return 0;
}

void ct_dist_finalize(void) {
  if (inited_) MPI_Finalize();
  inited_ = 0;
}

int ct_dist_rank(void) { return rank_; }
int ct_dist_world(void) { return world_; }
int ct_dist_local_size(void) { return local_; }

int ct_dist_sum_f32(float *buf, long n) {
  if (world_ == 1) return 0;
  for (long off = 0; off < n; off += INT_MAX / 2) {  // MPI counts are int
    int cnt = (int)(n - off < INT_MAX / 2 ? n - off : INT_MAX / 2);
    if (MPI_Allreduce(MPI_IN_PLACE, buf + off, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
      return ct_set_error(CT_EMPI, "MPI_Allreduce failed");
  }
  return 0;
}

int ct_dist_sum_f64(double *buf, int n) {
  if (world_ == 1) return 0;
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

void ct_dist_abort(int code) {
  if (world_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

void ct_dist_die(const char *prog, int code, const char *what) {
  fprintf(stderr, "%s: %s%s%s\n", prog, what ? what : "", what ? ": " : "", ct_last_error());
  ct_dist_abort(code);
  ct_dist_finalize();
  exit(code);
}
