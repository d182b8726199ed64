// dist: the MPI calls — init as a singleton or under mpirun, sums and max across ranks,
// abort. No sharding yet: every rank holds the whole model and optimizer state.
#include "dist.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

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

void ct_dist_abort(int code) {
  if (world_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

void ct_dist_die(const char *prog, int code, const char *what) {
  fprintf(stderr, "%s: %s%s%s\n", prog, what ? what : "", what ? ": " : "", ct_last_error());
  ct_dist_abort(code);
  ct_dist_finalize();
  exit(code);
}
