// train_moments: the optimizer's state on disk (optimizer.safetensors, and DiLoCo's
// optimizer-rank<r>.safetensors): read when a run resumes, written into a checkpoint. With
// optimizer_sharding or DiLoCo, rank 0 patches the other ranks' moments into the file as
// they arrive through its gradient buffer, so no rank ever holds them all.
#include "train_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "fs.h"
#include "hf.h"
#include "safetensors.h"

// The file of optimizer state rank `r` reads and writes: rank 0 and every rank of a run
// whose ranks share their moments, optimizer.safetensors; a DiLoCo rank r > 0 its own.
static void optimizer_file(char *name, size_t n, int r) {
  if (r == 0) snprintf(name, n, "optimizer.safetensors");
  else snprintf(name, n, "optimizer-rank%d.safetensors", r);
}

// A resumed run's optimizer state: the moments (this rank's shard of them, read through
// the still-zero gradient buffer), and DiLoCo's outer momentum (θ_start is the model read).
int ct_train_moments_load(ct_train *tr) {
  const ct_config *c = tr->cfg;
  char p[CT_PATH_MAX], name[64];
  int diloco_ranks = tr->saved_diloco_ranks, rc;
  bool diloco = c->diloco_inner_steps > 0;
  optimizer_file(name, sizeof name, diloco && diloco_ranks ? tr->rank : 0);
  if ((rc = ct_path_join(p, sizeof p, tr->resumed_from, name))) return rc;
  float *bufs[] = {tr->mom1, tr->mom2};
  const char *suffixes[] = {".exp_avg", ".exp_avg_sq"};
  for (int i = 0; i < 2; i++) {
    if (!tr->shard.n) {
      if ((rc = ct_load_tensors(&tr->trained, bufs[i], p, suffixes[i]))) return rc;
      continue;
    }
    rc = ct_load_tensors(&tr->trained, tr->grads, p, suffixes[i]);
    if (!rc) memcpy(bufs[i], tr->grads + tr->shard.lo, sizeof(float) * (size_t)(tr->shard.hi - tr->shard.lo));
    memset(tr->grads, 0, sizeof(float) * (size_t)tr->trained.n_floats);
    if (rc) return rc;
  }
  if (diloco && diloco_ranks) {
    optimizer_file(name, sizeof name, 0);
    if ((rc = ct_path_join(p, sizeof p, tr->resumed_from, name)) ||
        (rc = ct_load_tensors(&tr->trained, tr->outer_mom, p, ".outer_momentum")))
      return rc;
  }
  return 0;
}

static const char *const moment_suffixes[] = {".exp_avg", ".exp_avg_sq", ".outer_momentum"};

// Rank 0 writes moments m1, m2 (the whole layout) into dir/<optimizer_file(r)>, with
// DiLoCo's outer momentum in rank 0's file.
int ct_train_moments_write(const ct_train *tr, const char *dir, int r, const float *m1, const float *m2) {
  char p[CT_PATH_MAX], name[64];
  const float *bufs[] = {m1, m2, tr->outer_mom};
  optimizer_file(name, sizeof name, r);
  int rc = ct_path_join(p, sizeof p, dir, name);
  return rc ? rc : ct_save_tensors(&tr->trained, r == 0 && tr->outer_mom ? 3 : 2, bufs, moment_suffixes, p,
                                   CT_DT_F32);
}

// An optimizer file rank 0 fills piece by piece, as the pieces arrive from the ranks that
// hold them: written whole first from the zero gradient buffer (its header and size are
// then final), mapped to find each tensor's bytes, patched through fd.
typedef struct {
  ct_safetensors st;
  int fd;
  long data_pos;  // the data section's position in the file
} patch_file;

static int patch_open(const ct_train *tr, patch_file *f, const char *dir, int r) {
  char p[CT_PATH_MAX], name[64];
  memset(f, 0, sizeof *f);
  f->fd = -1;
  optimizer_file(name, sizeof name, r);
  int rc = ct_path_join(p, sizeof p, dir, name);
  if (!rc) rc = ct_train_moments_write(tr, dir, r, tr->grads, tr->grads);
  if (!rc) rc = ct_st_open(&f->st, p);
  if (rc) return rc;
  f->data_pos = (long)(f->st.data - f->st.map);
  f->fd = open(p, O_WRONLY);
  return f->fd < 0 ? ct_set_error(CT_EIO, "%s: cannot open for writing: %s", p, strerror(errno)) : 0;
}

// Elements [lo, hi) of the layout's moment k (suffix moment_suffixes[k]) from src[0 .. hi-lo).
static int patch_range(const ct_train *tr, patch_file *f, int k, long lo, long hi, const float *src) {
  for (int t = 0; t < tr->trained.n_tensors; t++) {
    const ct_tensor_info *ti = &tr->trained.tensors[t];
    long a = ti->offset > lo ? ti->offset : lo, b = ti->offset + ti->numel < hi ? ti->offset + ti->numel : hi;
    if (a >= b) continue;
    char name[160];
    snprintf(name, sizeof name, "%s%s", ti->name, moment_suffixes[k]);
    const ct_st_tensor *st = ct_st_find(&f->st, name);
    if (!st) return ct_set_error(CT_EFORMAT, "%s: tensor '%s' is missing", f->st.path, name);
    off_t pos = f->data_pos + (off_t)st->begin + (off_t)sizeof(float) * (a - ti->offset);
    size_t bytes = sizeof(float) * (size_t)(b - a);
    const char *from = (const char *)(src + (a - lo));
    for (size_t done = 0; done < bytes;) {
      ssize_t w = pwrite(f->fd, from + done, bytes - done, pos + (off_t)done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return ct_set_error(CT_EIO, "%s: cannot write: %s", f->st.path, strerror(errno));
      done += (size_t)w;
    }
  }
  return 0;
}

static int patch_close(patch_file *f, int rc) {
  if (f->fd >= 0) {
    if (!rc && fsync(f->fd)) rc = ct_set_error(CT_EIO, "%s: cannot fsync: %s", f->st.path, strerror(errno));
    close(f->fd);
  }
  ct_st_close(&f->st);
  return rc;
}

// optimizer_sharding: every rank's shard of both moments to rank 0, one shard at a time
// through its gradient buffer (no full-size copy), patched into optimizer.safetensors:
// the file an unsharded run writes. *rc is rank 0's file error (the ranks keep sending).
int ct_train_moments_write_shards(ct_train *tr, const char *dir, int *rc) {
  const ct_shard *sh = &tr->shard;
  patch_file f = {.fd = -1};
  if (tr->rank == 0 && !*rc) *rc = patch_open(tr, &f, dir, 0);
  int mpi = 0;
  for (int k = 0; k < 2 && !mpi; k++) {
    float *mine = k == 0 ? tr->mom1 : tr->mom2;
    for (int r = 0; r < tr->world && !mpi; r++) {
      float *buf = tr->rank == 0 && r != 0 ? tr->grads : mine;
      mpi = ct_dist_fetch_f32(buf, sh->counts[r], r);
      long lo = sh->displs[r], hi = lo + sh->counts[r];
      if (!mpi && tr->rank == 0 && !*rc) *rc = patch_range(tr, &f, k, lo, hi, buf);
    }
  }
  if (tr->rank == 0) {
    *rc = patch_close(&f, *rc);
    memset(tr->grads, 0, sizeof(float) * (size_t)tr->trained.n_floats);  // zero again for the next step
  }
  return mpi;
}

// DiLoCo: rank r > 0's moments to rank 0, one moment at a time through its gradient buffer,
// patched into optimizer-rank<r>.safetensors.
int ct_train_moments_write_ranks(ct_train *tr, const char *dir, int *rc) {
  long n = tr->trained.n_floats;
  int mpi = 0;
  for (int r = 1; r < tr->world && !mpi; r++) {
    patch_file f = {.fd = -1};
    if (tr->rank == 0 && !*rc) *rc = patch_open(tr, &f, dir, r);
    for (int k = 0; k < 2 && !mpi; k++) {
      float *buf = tr->rank == 0 ? tr->grads : k == 0 ? tr->mom1 : tr->mom2;
      mpi = ct_dist_fetch_f32(buf, n, r);
      if (!mpi && tr->rank == 0 && !*rc) *rc = patch_range(tr, &f, k, 0, n, buf);
    }
    if (tr->rank == 0) {
      *rc = patch_close(&f, *rc);
      memset(tr->grads, 0, sizeof(float) * (size_t)n);
    }
  }
  return mpi;
}
