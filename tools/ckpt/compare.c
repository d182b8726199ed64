// ctune-ckpt compare: two models' (or files') tensors, each one's largest absolute and
// relative difference and the elements past atol + rtol·|b| (numpy.allclose's rule).
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "error.h"

typedef struct {
  double max_abs, max_rel;
  int64_t bad;  // elements past atol + rtol·|b| (or NaN in one only)
} diff_stats;

static void diff_chunk(const float *a, const float *b, size_t n, double rtol, double atol, diff_stats *s) {
  for (size_t i = 0; i < n; i++) {
    double x = a[i], y = b[i];
    if (isnan(x) || isnan(y)) {
      if (isnan(x) != isnan(y)) s->bad++, s->max_abs = INFINITY, s->max_rel = INFINITY;
      continue;
    }
    if (x == y) continue;  // (equal infinities too)
    double d = fabs(x - y), r = y != 0 ? d / fabs(y) : INFINITY;
    if (isnan(d)) d = r = INFINITY;  // inf vs -inf
    s->max_abs = d > s->max_abs ? d : s->max_abs;
    s->max_rel = r > s->max_rel ? r : s->max_rel;
    if (!(d <= atol + rtol * fabs(y))) s->bad++;
  }
}

// Integer and boolean tensors: equal bytes, or every element counts as differing.
static void compare_bytes(const ct_safetensors *sa, const ct_st_tensor *ta, const ct_safetensors *sb,
                          const ct_st_tensor *tb, size_t per, diff_stats *s) {
  const uint8_t *a = ct_st_data(sa, ta), *b = ct_st_data(sb, tb);
  uint64_t n = ta->end - ta->begin;
  bool same = ta->dtype == tb->dtype;
  for (uint64_t i = 0; i < n && same; i += per) {
    size_t k = n - i < per ? (size_t)(n - i) : per;
    same = !memcmp(a + i, b + i, k);
    ct_st_drop(a + i, k), ct_st_drop(b + i, k);
  }
  if (!same) s->bad = ta->numel, s->max_abs = s->max_rel = NAN;
}

static int compare_tensor(const ct_safetensors *sa, const ct_st_tensor *ta, const ct_safetensors *sb,
                          const ct_st_tensor *tb, float *fa, float *fb, size_t per, double rtol, double atol,
                          diff_stats *s) {
  if (!ckpt_is_float(ta->dtype) || !ckpt_is_float(tb->dtype)) return compare_bytes(sa, ta, sb, tb, 4 * per, s), 0;
  for (int64_t i = 0; i < ta->numel; i += (int64_t)per) {
    size_t k = ta->numel - i < (int64_t)per ? (size_t)(ta->numel - i) : per;
    int rc = ct_st_read_f32_range(sa, ta, i, (int64_t)k, fa);
    if (!rc) rc = ct_st_read_f32_range(sb, tb, i, (int64_t)k, fb);
    if (rc) return rc;
    diff_chunk(fa, fb, k, rtol, atol, s);
  }
  return 0;
}

static bool parse_tol(const char *s, double *v) {
  char *end;
  if (!s) return true;
  *v = strtod(s, &end);
  return *s && !*end && *v >= 0 && isfinite(*v);
}

// Tensors of a missing from b and the other way: printed; their count
static int compare_names(const ct_st_dir *a, const ct_st_dir *b, const char *na, const char *nb) {
  int missing = 0;
  for (int i = 0; i < a->n; i++)
    if (ct_st_dir_find(b, a->entries[i].name, NULL, NULL)) printf("%-48s only in %s\n", a->entries[i].name, na), missing++;
  for (int i = 0; i < b->n; i++)
    if (ct_st_dir_find(a, b->entries[i].name, NULL, NULL)) printf("%-48s only in %s\n", b->entries[i].name, nb), missing++;
  return missing;
}

static bool same_shape(const ct_st_tensor *a, const ct_st_tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

int ckpt_compare(int argc, char **argv) {
  static const char *const known[] = {"a=", "b=", "rtol=", "atol=", NULL};
  const char *v[4];
  if (ckpt_args(argc, argv, known, 2, v)) return 2;
  const char *pa = v[0], *pb = v[1];
  double rtol = 1e-5, atol = 1e-8;  // numpy.allclose's
  if (!parse_tol(v[2], &rtol) || !parse_tol(v[3], &atol)) {
    fprintf(stderr, "ctune-ckpt: compare: rtol and atol must be finite numbers >= 0\n");
    return 2;
  }
  ct_st_dir a, b;
  if (ckpt_open_tensors(&a, pa, true) || ckpt_open_tensors(&b, pb, true)) ckpt_die(2);
  size_t per = ckpt_buffer_bytes() / 8;
  float *fa = malloc(per * 4), *fb = malloc(per * 4);
  if (!fa || !fb) ckpt_die((ct_set_error(CT_ENOMEM, "cannot allocate the buffers (CT_CKPT_BUFFER)"), 2));
  int failed = compare_names(&a, &b, pa, pb), compared = 0;
  printf("%-48s %-11s %12s %12s %s\n", "tensor", "dtypes", "max_abs", "max_rel", "");
  for (int i = 0; i < a.n; i++) {
    const ct_safetensors *sa, *sb;
    const ct_st_tensor *ta, *tb;
    if (ct_st_dir_find(&b, a.entries[i].name, &sb, &tb)) continue;
    ct_st_dir_find(&a, a.entries[i].name, &sa, &ta);
    char dt[16];
    snprintf(dt, sizeof dt, "%s/%s", ct_dtype_name(ta->dtype), ct_dtype_name(tb->dtype));
    if (!same_shape(ta, tb)) {
      char da[160], db[160];
      ckpt_fmt_dims(da, sizeof da, ta), ckpt_fmt_dims(db, sizeof db, tb);
      printf("%-48s %-11s shapes differ: %s vs %s\n", ta->name, dt, da, db);
      failed++;
      continue;
    }
    diff_stats s = {0};
    if (compare_tensor(sa, ta, sb, tb, fa, fb, per, rtol, atol, &s)) ckpt_die(2);
    printf("%-48s %-11s %12.4g %12.4g %s\n", ta->name, dt, s.max_abs, s.max_rel, s.bad ? "DIFFERS" : "ok");
    if (s.bad && isnan(s.max_abs)) printf("%-48s not floating-point: their bytes differ\n", "");
    else if (s.bad) printf("%-48s %lld of %lld elements past atol + rtol * |b|\n", "", (long long)s.bad, (long long)ta->numel);
    failed += s.bad > 0;
    compared++;
  }
  printf("%s: %d tensors compared, %d differ or are missing (rtol %g, atol %g)\n", failed ? "DIFFERENT" : "SAME",
         compared, failed, rtol, atol);
  fprintf(stderr, "ctune-ckpt: compare: peak memory %.1f MiB\n", ckpt_peak_mib());
  free(fa);
  free(fb);
  ct_st_dir_close(&a);
  ct_st_dir_close(&b);
  return failed ? 1 : 0;
}
