// test_topk: the teacher's top-k logits file (distill/topk.h): a written file reads back
// with its checksum; every bad index (10^9, -5, V, a repeat), a non-finite logit, k past
// the vocabulary, a flipped byte and a truncated file are refused with one line naming
// the file (and the row and position of a bad value), never read past the student's head.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "distill/topk.h"
#include "error.h"
#include "safetensors.h"
#include "scratch.h"
#include "test.h"

enum { V = 260, N = 5, K = 4 };
// A good (N, K) file's values: row r holds ids r, r+1, .. with logits 3, 2, 1, 0.
static void good_values(int *idx, float *logit) {
  for (int r = 0; r < N; r++)
    for (int j = 0; j < K; j++) idx[r * K + j] = r + j, logit[r * K + j] = (float)(3 - j);
}

// Writes name with the good values and idx[at] = id (at < 0: none changed).
static const char *write_with(const char *name, int at, int id, float logit_at_0) {
  int idx[N * K];
  float logit[N * K];
  good_values(idx, logit);
  if (at >= 0) idx[at] = id;
  logit[0] = logit_at_0;
  ct_topk t = {.k = K, .n = N, .idx = idx, .logit = logit, .data_hash = 0x1234abcdULL};
  const char *p = scratch_path(name);
  CHECK_OK(ct_topk_write(p, &t, "/teacher"));
  return p;
}

// ct_topk_load(path, V) fails with CT_EFORMAT and a one-line message holding each of parts.
static void expect_refused(const char *path, const char *const *parts) {
  ct_topk t;
  int rc = ct_topk_load(&t, path, V);
  CHECK(rc != 0);
  CHECK(t.idx == NULL && t.logit == NULL);
  const char *msg = ct_last_error();
  CHECK(strchr(msg, '\n') == NULL);
  CHECK(strstr(msg, path) != NULL);
  for (; *parts; parts++)
    if (!strstr(msg, *parts)) {
      CHECK(strstr(msg, *parts) != NULL);
      fprintf(stderr, "    message: %s\n    lacks: %s\n", msg, *parts);
    }
}

static void test_written_file_reads_back_with_its_hash_and_checksum(void) {
  const char *p = write_with("good.safetensors", -1, 0, 3);
  ct_topk t;
  CHECK_OK(ct_topk_load(&t, p, V));
  int idx[N * K];
  float logit[N * K];
  good_values(idx, logit);
  CHECK(t.n == N && t.k == K && t.data_hash == 0x1234abcdULL && t.sum != 0);
  CHECK(t.idx && !memcmp(t.idx, idx, sizeof idx) && t.logit && !memcmp(t.logit, logit, sizeof logit));
  ct_topk_free(&t);
}

static void test_indices_1e9_minus_5_and_V_are_refused_naming_row_and_position(void) {
  struct {
    int at, id;
    const char *row, *id_text;
  } c[] = {{2 * K + 1, 1000000000, "indices row 2, position 1", "token id 1000000000"},
           {3 * K + 0, -5, "indices row 3, position 0", "token id -5"},
           {4 * K + 3, V, "indices row 4, position 3", "token id 260"}};
  for (int i = 0; i < 3; i++) {
    const char *p = write_with("bad-index.safetensors", c[i].at, c[i].id, 3);
    const char *parts[] = {c[i].row, c[i].id_text, "outside the student's vocabulary [0, 260)", NULL};
    expect_refused(p, parts);
  }
}

static void test_an_id_twice_in_a_row_and_a_non_finite_logit_are_refused(void) {
  const char *twice[] = {"indices row 1, position 2", "appears twice", NULL};
  expect_refused(write_with("twice.safetensors", K + 2, 1, 3), twice);  // row 1 is 1, 2, 3, 4
  const char *nan[] = {"logits row 0, position 0", "not a finite logit", NULL};
  expect_refused(write_with("nan.safetensors", -1, 0, NAN), nan);
  expect_refused(write_with("inf.safetensors", -1, 0, INFINITY), nan);
}

static void test_k_larger_than_the_vocabulary_is_refused(void) {
  const char *p = write_with("good.safetensors", -1, 0, 3);
  ct_topk t;
  CHECK(ct_topk_load(&t, p, K - 1) != 0);  // a student of 3 tokens: 4 ids per row cannot be
  CHECK(strstr(ct_last_error(), "k = 4 ids per row") != NULL);
}

// Flips one bit of byte `at` counted from the end of the file.
static void flip_from_end(const char *p, long at) {
  FILE *f = fopen(p, "r+b");
  CHECK(f != NULL);
  if (!f) return;
  fseek(f, -at, SEEK_END);
  int c = fgetc(f);
  fseek(f, -at, SEEK_END);
  fputc(c ^ 0x10, f);
  fclose(f);
}

static void test_a_flipped_byte_in_an_index_or_a_logit_is_refused_by_the_checksum(void) {
  const char *parts[] = {"contents changed since it was written", NULL};
  // the data section: indices (N·K·4 bytes), then logits; flip the lowest byte of the
  // last logit (a finite value still) and of an index (still in range: 0x10 added to a small id)
  const char *p = write_with("flip.safetensors", -1, 0, 3);
  flip_from_end(p, 4);
  expect_refused(p, parts);
  p = write_with("flip.safetensors", -1, 0, 3);
  flip_from_end(p, 4 * N * K + 4);
  expect_refused(p, parts);
}

static void test_a_truncated_file_is_refused(void) {
  const char *p = write_with("cut.safetensors", -1, 0, 3);
  FILE *f = fopen(p, "rb");
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  CHECK(truncate(p, size - 6) == 0);
  const char *parts[] = {"data section", NULL};
  expect_refused(p, parts);
}

static void test_a_file_without_checksum_or_not_top_k_is_refused(void) {
  int idx[N * K];
  float logit[N * K];
  good_values(idx, logit);
  ct_st_entry e[2] = {{.name = "indices", .dtype = CT_DT_I32, .ndim = 2, .shape = {N, K}, .data = idx},
                      {.name = "logits", .dtype = CT_DT_F32, .ndim = 2, .shape = {N, K}, .data = logit}};
  const char *mk[] = {"dataset_hash"}, *mv[] = {"000000001234abcd"};
  const char *p = scratch_path("plain.safetensors");
  CHECK_OK(ct_st_write(p, e, 2, mk, mv, 1));  // what ctune wrote before files were checksummed
  const char *no_sum[] = {"no checksum of its contents", NULL};
  expect_refused(p, no_sum);
  e[1].shape[1] = K - 1;  // (n, k) shapes that disagree
  CHECK_OK(ct_st_write_checked(p, e, 2, mk, mv, 1));
  const char *shapes[] = {"must have one (n, k) shape", NULL};
  expect_refused(p, shapes);
}

int main(void) {
  if (scratch_make("/tmp/ct-test-topk-XXXXXX")) return 1;
  RUN(test_written_file_reads_back_with_its_hash_and_checksum);
  RUN(test_indices_1e9_minus_5_and_V_are_refused_naming_row_and_position);
  RUN(test_an_id_twice_in_a_row_and_a_non_finite_logit_are_refused);
  RUN(test_k_larger_than_the_vocabulary_is_refused);
  RUN(test_a_flipped_byte_in_an_index_or_a_logit_is_refused_by_the_checksum);
  RUN(test_a_truncated_file_is_refused);
  RUN(test_a_file_without_checksum_or_not_top_k_is_refused);
  scratch_remove();
  return test_summary();
}
