// train_overlap: ddp_bucket_cap_mb's overlap of data parallel's gradient sum with backward.
// The gradient buffer is cut into buckets, each handed to MPI (a non-blocking sum) as soon
// as backward is done with the layers it holds; ct_train_update waits for them all.
#include "train_internal.h"

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

// A bucket: grads[lo, hi), final once backward is done with layer `ready` (the lowest
// layer it holds; -1: it holds a tensor outside the layers, final only at the end).
typedef struct {
  long lo, hi;
  int ready;
} ov_bucket;

struct ct_overlap {
  int n, next;     // buckets; the next one to start
  ov_bucket *b;    // (n) in the order their sums start: by ready, top layer first
  ct_acts *armed;  // the activations whose backward starts them (NULL: none)
  int rc;          // the hook's first failure, returned by ct_train_update
  bool told;       // the first step's count of sums started during backward is logged
};

// The decoder layer a tensor belongs to ("...layers.<l>...."), or -1.
static int tensor_layer(const char *name) {
  const char *p = strstr(name, "layers.");
  return p ? atoi(p + 7) : -1;
}

static int by_offset(const void *a, const void *b) {
  long x = (*(const ct_tensor_info *const *)a)->offset, y = (*(const ct_tensor_info *const *)b)->offset;
  return (x > y) - (x < y);
}

// Start order: the bucket final first (higher `ready`), then the higher offsets.
static int by_start(const void *a, const void *b) {
  const ov_bucket *x = a, *y = b;
  if (x->ready != y->ready) return y->ready - x->ready;
  return (y->lo > x->lo) - (y->lo < x->lo);
}

// Cuts the whole gradient buffer into buckets of at most cap floats, each ending at a
// tensor's end or at the cap (a tensor larger than cap spans several); the gaps between
// tensors go with the tensor after them.
int ct_train_overlap_setup(ct_train *tr, long cap) {
  const ct_layout *t = &tr->trained;
  const ct_tensor_info **ts = malloc(sizeof *ts * (size_t)(t->n_tensors ? t->n_tensors : 1));
  struct ct_overlap *o = calloc(1, sizeof *o);
  long most = t->n_floats / cap + t->n_tensors + 2;
  if (o) o->b = malloc(sizeof *o->b * (size_t)most);
  if (!ts || !o || !o->b) {
    free(ts);
    if (o) free(o->b);
    free(o);
    return ct_set_error(CT_ENOMEM, "out of memory");
  }
  for (int i = 0; i < t->n_tensors; i++) ts[i] = &t->tensors[i];
  qsort(ts, (size_t)t->n_tensors, sizeof *ts, by_offset);
  ov_bucket cur = {0, 0, INT_MAX};
  for (int i = 0; i <= t->n_tensors; i++) {
    long end = i < t->n_tensors ? ts[i]->offset + ts[i]->numel : t->n_floats;
    int layer = i < t->n_tensors ? tensor_layer(ts[i]->name) : INT_MAX;
    while (cur.hi < end) {
      long take = end - cur.hi < cap - (cur.hi - cur.lo) ? end - cur.hi : cap - (cur.hi - cur.lo);
      cur.hi += take;
      if (layer < cur.ready) cur.ready = layer;
      if (cur.hi - cur.lo == cap || (cur.hi == end && i == t->n_tensors)) {
        if (cur.ready == INT_MAX) cur.ready = -1;
        o->b[o->n++] = cur;
        cur = (ov_bucket){cur.hi, cur.hi, INT_MAX};
      }
    }
  }
  if (cur.hi > cur.lo) o->b[o->n++] = (ov_bucket){cur.lo, cur.hi, cur.ready == INT_MAX ? -1 : cur.ready};
  free(ts);
  qsort(o->b, (size_t)o->n, sizeof *o->b, by_start);
  tr->overlap = o;
  ct_log_info(&tr->log, "overlap: the gradient sum in %d buckets of at most %.1f MB, each handed to MPI as "
              "backward finishes its layers", o->n, cap * 4.0 / (1 << 20));
  return 0;
}

void ct_train_overlap_free(ct_train *tr) {
  if (tr->overlap) free(tr->overlap->b);
  free(tr->overlap);
  tr->overlap = NULL;
}

// Starts every bucket not yet started that is final once layer l is done.
static void overlap_start(ct_train *tr, int l) {
  struct ct_overlap *o = tr->overlap;
  while (!o->rc && o->next < o->n && o->b[o->next].ready >= l) {
    const ov_bucket *b = &o->b[o->next++];
    o->rc = ct_dist_isum_f32(tr->grads + b->lo, b->hi - b->lo);
  }
}

// The backward hook (ct_acts.grad_ready): starts what layer l completed, and lets MPI
// move the sums already under way.
static void overlap_ready(void *ctx, int l) {
  ct_train *tr = ctx;
  struct ct_overlap *o = tr->overlap;
  overlap_start(tr, l);
  if (!o->rc) o->rc = ct_dist_progress();
  if (l < 0 && o->armed) o->armed->grad_ready = NULL, o->armed = NULL;
}

void ct_train_overlap_arm(ct_train *tr, ct_acts *a) {
  if (!tr->overlap) return;
  a->grad_ready = overlap_ready;
  a->grad_ready_ctx = tr;
  tr->overlap->armed = a;
}

// The rest of the buckets started, all of them waited for.
int ct_train_overlap_finish(ct_train *tr) {
  struct ct_overlap *o = tr->overlap;
  if (!o->told) {
    ct_log_info(&tr->log, "overlap: step %ld handed %d of %d bucket sums to MPI during backward", tr->step + 1,
                o->next, o->n);
    o->told = true;
  }
  overlap_start(tr, INT_MIN);
  int rc = o->rc, w = ct_dist_wait_all();
  if (o->armed) o->armed->grad_ready = NULL, o->armed = NULL;  // armed, but no backward ran
  o->next = 0, o->rc = 0;
  return rc ? rc : w;
}
