// Tests for common/safetensors: conversions, write -> open -> read round trips, the exact
// bytes of written headers, sharded directories, malformed files and a header fuzz.
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "scratch.h"
#include "test.h"

// ------------------------------------------------------------------------- helpers

static void write_bytes(const char *path, const void *buf, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  if (!f) return;
  CHECK(fwrite(buf, 1, n, f) == n);
  fclose(f);
}

static uint8_t *read_bytes(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(len > 0 ? (size_t)len : 1);
  *n = fread(b, 1, (size_t)len, f);
  fclose(f);
  return b;
}

// A file with the 8-byte length `hn`, the header text and `data_len` bytes of data.
static void write_raw_n(const char *path, uint64_t hn, const char *header, size_t hlen,
                        size_t data_len) {
  size_t n = 8 + hlen + data_len;
  uint8_t *b = malloc(n);
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hn >> (8 * i));
  memcpy(b + 8, header, hlen);
  for (size_t i = 0; i < data_len; i++) b[8 + hlen + i] = (uint8_t)(i * 7 + 1);
  write_bytes(path, b, n);
  free(b);
}

static void write_raw(const char *path, const char *header, size_t data_len) {
  write_raw_n(path, strlen(header), header, strlen(header), data_len);
}

static int has(const char *needle) { return strstr(ct_last_error(), needle) != NULL; }

// Clears ct_last_error() (never cleared by the library), so that a has() check after a
// failing call can only be satisfied by that call's own message.
static void clear_error(void) { ct_set_error(CT_OK, "%s", ""); }
#define FRESH(expr) (clear_error(), (expr))

// Opening `path` fails with `code`, the message names the file and both needles (if
// given), and the struct is left closed.
static void expect_open_fails(const char *path, int code, const char *n1, const char *n2) {
  ct_safetensors st;
  int rc = FRESH(ct_st_open(&st, path));
  CHECK(rc == code);
  CHECK(has(path));
  if (n1) CHECK(has(n1));
  if (n2) CHECK(has(n2));
  if (rc != code || !has(path) || (n1 && !has(n1)) || (n2 && !has(n2)))
    fprintf(stderr, "    rc %d, message: %s\n", rc, ct_last_error());
  CHECK(st.map == NULL && st.tensors == NULL && st.n == 0 && st.path == NULL);
  ct_st_close(&st);
}

static void expect_bad_header(const char *header, size_t data_len, const char *n1,
                              const char *n2) {
  const char *p = scratch_path("bad.safetensors");
  write_raw(p, header, data_len);
  expect_open_fails(p, CT_EFORMAT, n1, n2);
}

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static int same_bits(float a, float b) { return fbits(a) == fbits(b); }

// How many of the 65536 16-bit values do not come back from float32 as they were (a NaN
// must come back a NaN).
static int round_trip_failures(float (*to_f32)(uint16_t), uint16_t (*from_f32)(float)) {
  int bad = 0;
  for (uint32_t i = 0; i < 65536; i++) {
    float f = to_f32((uint16_t)i);
    if (isnan(f) ? !isnan(to_f32(from_f32(f))) : from_f32(f) != i) bad++;
  }
  return bad;
}

// ----------------------------------------------------------------- dtypes, scalars

static void test_dtype_names_sizes_and_parse_round_trip(void) {
  const ct_dtype all[] = {CT_DT_F32, CT_DT_F16, CT_DT_BF16, CT_DT_F64, CT_DT_I8,
                          CT_DT_U8,  CT_DT_I16, CT_DT_I32,  CT_DT_I64, CT_DT_BOOL};
  const size_t sizes[] = {4, 2, 2, 8, 1, 1, 2, 4, 8, 1};
  for (int i = 0; i < 10; i++) {
    ct_dtype d;
    CHECK(ct_dtype_size(all[i]) == sizes[i]);
    CHECK_OK(ct_dtype_parse(ct_dtype_name(all[i]), &d));
    CHECK(d == all[i]);
  }
  CHECK(strcmp(ct_dtype_name(CT_DT_BF16), "BF16") == 0);
  ct_dtype d;
  CHECK(FRESH(ct_dtype_parse("bf16", &d)) == CT_EFORMAT && has("bf16"));
  CHECK(ct_dtype_parse("U64", &d) == CT_EFORMAT);
  CHECK(ct_dtype_size((ct_dtype)99) == 0);
  CHECK(strcmp(ct_dtype_name((ct_dtype)99), "?") == 0);
}

static void test_bf16_rounds_ties_to_even_and_keeps_inf_nan_subnormals(void) {
  CHECK(ct_f32_to_bf16(1.0f) == 0x3f80);
  CHECK(ct_f32_to_bf16(-0.0f) == 0x8000);
  CHECK(ct_f32_to_bf16(bitsf(0x3f808000u)) == 0x3f80);  // tie, 0x3f80 even: down
  CHECK(ct_f32_to_bf16(bitsf(0x3f818000u)) == 0x3f82);  // tie, 0x3f81 odd: up
  CHECK(ct_f32_to_bf16(bitsf(0x3f808001u)) == 0x3f81);  // above half
  CHECK(ct_f32_to_bf16(bitsf(0x3f807fffu)) == 0x3f80);  // below half
  CHECK(ct_f32_to_bf16(INFINITY) == 0x7f80);
  CHECK(ct_f32_to_bf16(-INFINITY) == 0xff80);
  CHECK(ct_f32_to_bf16(bitsf(0x7f7fffffu)) == 0x7f80);  // FLT_MAX rounds up to inf
  CHECK(ct_f32_to_bf16(bitsf(0x7f7f7fffu)) == 0x7f7f);  // just below: max finite bf16
  CHECK(ct_f32_to_bf16(bitsf(0x00010000u)) == 0x0001);  // subnormal kept exactly
  CHECK(ct_f32_to_bf16(bitsf(0x00008000u)) == 0x0000);  // half the smallest: tie to 0
  CHECK(ct_f32_to_bf16(NAN) == 0x7fc0);
  uint16_t h = ct_f32_to_bf16(bitsf(0x7f800001u));  // payload only in the dropped bits
  CHECK(isnan(ct_bf16_to_f32(h)));
  CHECK(ct_f32_to_bf16(bitsf(0xffc00000u)) == 0xffc0);  // negative NaN keeps its sign
  CHECK(same_bits(ct_bf16_to_f32(0x0001), bitsf(0x00010000u)));
  CHECK(ct_bf16_to_f32(0xc020) == -2.5f);
  CHECK(round_trip_failures(ct_bf16_to_f32, ct_f32_to_bf16) == 0);
}

static void test_f16_rounds_ties_to_even_and_keeps_inf_nan_subnormals(void) {
  CHECK(ct_f32_to_f16(1.0f) == 0x3c00);
  CHECK(ct_f32_to_f16(-2.0f) == 0xc000);
  CHECK(ct_f32_to_f16(-0.0f) == 0x8000);
  CHECK(ct_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);         // tie, even mantissa: down
  CHECK(ct_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02);     // tie, odd mantissa: up
  CHECK(ct_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);
  CHECK(ct_f32_to_f16(65504.0f) == 0x7bff);                // max finite
  CHECK(ct_f32_to_f16(65519.0f) == 0x7bff);                // below max + half ulp
  CHECK(ct_f32_to_f16(65520.0f) == 0x7c00);                // the tie rounds to inf
  CHECK(ct_f32_to_f16(1e6f) == 0x7c00);
  CHECK(ct_f32_to_f16(-INFINITY) == 0xfc00);
  CHECK(ct_f32_to_f16(0x1p-14f) == 0x0400);                // smallest normal
  CHECK(ct_f32_to_f16(0x1p-24f) == 0x0001);                // smallest subnormal
  CHECK(ct_f32_to_f16(-0x1p-24f) == 0x8001);
  CHECK(ct_f32_to_f16(0x1p-25f) == 0x0000);                // tie between 0 and 1 unit: 0
  CHECK(ct_f32_to_f16(0x1p-25f * 1.0000001f) == 0x0001);
  CHECK(ct_f32_to_f16(3 * 0x1p-25f) == 0x0002);            // 1.5 units: tie to 2
  CHECK(ct_f32_to_f16(5 * 0x1p-25f) == 0x0002);            // 2.5 units: tie to 2
  CHECK(ct_f32_to_f16(1023 * 0x1p-24f) == 0x03ff);         // largest subnormal
  CHECK(ct_f32_to_f16(1023.5f * 0x1p-24f) == 0x0400);      // tie carries into normal
  CHECK(ct_f32_to_f16(1e-40f) == 0x0000);                  // f32 subnormal
  CHECK(ct_f32_to_f16(1e-8f) == 0x0000);
  uint16_t h = ct_f32_to_f16(NAN);
  CHECK((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0);
  h = ct_f32_to_f16(bitsf(0x7f800001u));
  CHECK((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0);
  CHECK(ct_f32_to_f16(bitsf(0xffc00000u)) & 0x8000);
  CHECK(ct_f16_to_f32(0x0001) == 0x1p-24f);
  CHECK(ct_f16_to_f32(0x8001) == -0x1p-24f);
  CHECK(ct_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
  CHECK(ct_f16_to_f32(0x7bff) == 65504.0f);
  CHECK(ct_f16_to_f32(0x7c00) == INFINITY);
  CHECK(ct_f16_to_f32(0xfc00) == -INFINITY);
  CHECK(isnan(ct_f16_to_f32(0x7e00)) && isnan(ct_f16_to_f32(0x7c01)));
  CHECK(same_bits(ct_f16_to_f32(0x8000), -0.0f));
  CHECK(round_trip_failures(ct_f16_to_f32, ct_f32_to_f16) == 0);
}

// ---------------------------------------------------------------------- round trips

static void test_roundtrip_f32_bf16_f16_preserves_values(void) {
  const float f32[6] = {0.1f, -2.5f, 3e38f, -1e-40f, 0.0f, 123456.789f};
  const float bf[5] = {1.0f, -2.5f, 0.15625f, 256.0f, 1.0f + 0x1p-8f /* tie: 1.0 */};
  const float f16[4] = {0.5f, -65504.0f, 0x1p-24f, 1.0f + 0x1p-11f /* tie: 1.0 */};
  const float scalar = 42.0f;
  const int32_t ints[2] = {-7, 1 << 30};
  const double f64[3] = {1.5, -1e300, 0.1};
  ct_st_entry e[] = {
      {.name = "f32", .dtype = CT_DT_F32, .ndim = 2, .shape = {2, 3}, .data_f32 = f32},
      {.name = "bf16", .dtype = CT_DT_BF16, .ndim = 1, .shape = {5}, .data_f32 = bf},
      {.name = "f16", .dtype = CT_DT_F16, .ndim = 2, .shape = {2, 2}, .data_f32 = f16},
      {.name = "scalar", .dtype = CT_DT_F32, .ndim = 0, .data_f32 = &scalar},
      {.name = "empty", .dtype = CT_DT_BF16, .ndim = 2, .shape = {0, 5}, .data_f32 = NULL},
      {.name = "ints", .dtype = CT_DT_I32, .ndim = 1, .shape = {2}, .data = ints},
      {.name = "f64", .dtype = CT_DT_F64, .ndim = 1, .shape = {3}, .data = f64},
  };
  const int n = (int)(sizeof e / sizeof e[0]);
  const char *p = scratch_path("rt.safetensors");
  CHECK_OK(ct_st_write(p, e, n, NULL, NULL, 0));
  ct_safetensors st;
  CHECK_OK(ct_st_open(&st, p));
  CHECK(st.n == n && st.n_meta == 0 && st.fd == -1);
  CHECK(st.data_size == 24 + 10 + 8 + 4 + 0 + 8 + 24);
  CHECK((st.data - st.map) % 8 == 0);
  uint64_t off = 0;
  for (int i = 0; i < n && i < st.n; i++) {  // written order is data order
    const ct_st_tensor *t = &st.tensors[i];
    CHECK(strcmp(t->name, e[i].name) == 0);
    CHECK(ct_st_find(&st, e[i].name) == t);
    CHECK(t->dtype == e[i].dtype && t->ndim == e[i].ndim);
    CHECK(memcmp(t->shape, e[i].shape, sizeof t->shape) == 0);
    CHECK(t->begin == off);
    off = t->end;
  }
  float out[8];
  const ct_st_tensor *t = ct_st_find(&st, "f32");
  CHECK(t && t->numel == 6);
  CHECK_OK(ct_st_read_f32(&st, t, out, 6));
  for (int i = 0; i < 6; i++) CHECK(same_bits(out[i], f32[i]));

  t = ct_st_find(&st, "bf16");
  CHECK_OK(ct_st_read_f32(&st, t, out, 5));
  const float bf_want[5] = {1.0f, -2.5f, 0.15625f, 256.0f, 1.0f};
  for (int i = 0; i < 5; i++) CHECK(out[i] == bf_want[i]);
  const uint16_t bf_bytes[5] = {0x3f80, 0xc020, 0x3e20, 0x4380, 0x3f80};
  CHECK(memcmp(ct_st_data(&st, t), bf_bytes, 10) == 0);

  t = ct_st_find(&st, "f16");
  CHECK(t && t->numel == 4);
  CHECK_OK(ct_st_read_f32(&st, t, out, 4));
  const float f16_want[4] = {0.5f, -65504.0f, 0x1p-24f, 1.0f};
  for (int i = 0; i < 4; i++) CHECK(out[i] == f16_want[i]);

  t = ct_st_find(&st, "scalar");
  CHECK(t && t->ndim == 0 && t->numel == 1 && t->end - t->begin == 4);
  out[0] = 0;
  CHECK_OK(ct_st_read_f32(&st, t, out, 1));
  CHECK(out[0] == 42.0f);

  t = ct_st_find(&st, "empty");
  CHECK(t && t->numel == 0 && t->begin == t->end);
  CHECK_OK(ct_st_read_f32(&st, t, NULL, 0));

  t = ct_st_find(&st, "f64");
  CHECK_OK(ct_st_read_f32(&st, t, out, 3));
  CHECK(out[0] == 1.5f && out[1] == -INFINITY && out[2] == 0.1f);

  t = ct_st_find(&st, "ints");
  CHECK(memcmp(ct_st_data(&st, t), ints, 8) == 0);
  CHECK(FRESH(ct_st_read_f32(&st, t, out, 2)) == CT_EFORMAT);
  CHECK(has(p) && has("'ints'") && has("I32"));

  t = ct_st_find(&st, "f32");
  CHECK(FRESH(ct_st_read_f32(&st, t, out, 5)) < 0);
  CHECK(has(p) && has("'f32'") && has("[2, 3]"));
  CHECK(ct_st_find(&st, "F32") == NULL && ct_st_find(&st, "") == NULL);
  ct_st_close(&st);
  ct_st_close(&st);  // twice is harmless
}

static void test_metadata_round_trips_and_absent_keys_are_null(void) {
  const float x[2] = {1, 2};
  ct_st_entry e = {.name = "x", .dtype = CT_DT_F32, .ndim = 1, .shape = {2}, .data_f32 = x};
  const char *keys[] = {"format", "note"};
  const char *vals[] = {"pt", "a \"quoted\" caf\xc3\xa9\nline"};
  const char *p = scratch_path("meta.safetensors");
  CHECK_OK(ct_st_write(p, &e, 1, keys, vals, 2));
  ct_safetensors st;
  CHECK_OK(ct_st_open(&st, p));
  CHECK(st.n == 1 && st.n_meta == 2);
  CHECK(ct_st_meta(&st, "format") && strcmp(ct_st_meta(&st, "format"), "pt") == 0);
  CHECK(ct_st_meta(&st, "note") && strcmp(ct_st_meta(&st, "note"), vals[1]) == 0);
  CHECK(ct_st_meta(&st, "x") == NULL && ct_st_meta(&st, "missing") == NULL);
  ct_st_close(&st);

  CHECK_OK(ct_st_write(p, &e, 1, NULL, NULL, 0));
  CHECK_OK(ct_st_open(&st, p));
  CHECK(st.n_meta == 0 && ct_st_meta(&st, "format") == NULL);
  ct_st_close(&st);

  // "__metadata__": null is read as no metadata, as the reference does.
  write_raw(p, "{\"__metadata__\":null}", 0);
  CHECK_OK(ct_st_open(&st, p));
  CHECK(st.n == 0 && st.n_meta == 0);
  ct_st_close(&st);
}

// The expected bytes are those the reference serializer (huggingface/safetensors,
// tensor.rs tests) produces for the same tensors: compact JSON, space padding to 8.
static void expect_file(const char *path, const char *header, size_t header_len,
                        const void *data, size_t data_len) {
  size_t n = 0;
  uint8_t *got = read_bytes(path, &n);
  CHECK(got != NULL && n == 8 + header_len + data_len);
  if (!got || n != 8 + header_len + data_len) {
    free(got);
    return;
  }
  uint8_t len8[8] = {(uint8_t)header_len, (uint8_t)(header_len >> 8)};
  CHECK(memcmp(got, len8, 8) == 0);
  CHECK(memcmp(got + 8, header, header_len) == 0);
  if (memcmp(got + 8, header, header_len) != 0)
    fprintf(stderr, "    got header: %.*s\n", (int)header_len, (const char *)got + 8);
  CHECK(data_len == 0 || memcmp(got + 8 + header_len, data, data_len) == 0);
  free(got);
}

static void test_written_header_bytes_match_reference_serializer(void) {
  const float v[6] = {0, 1, 2, 3, 4, 5};
  const char *p = scratch_path("exact.safetensors");
  ct_st_entry e = {.name = "attn.0", .dtype = CT_DT_F32, .ndim = 3, .shape = {1, 2, 3}, .data_f32 = v};
  CHECK_OK(ct_st_write(p, &e, 1, NULL, NULL, 0));
  const char *h1 = "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}";
  CHECK(strlen(h1) == 64);  // a multiple of 8 already: no padding
  expect_file(p, h1, strlen(h1), v, 24);

  e = (ct_st_entry){.name = "attn0", .dtype = CT_DT_F32, .ndim = 4, .shape = {1, 1, 2, 3}, .data = v};
  CHECK_OK(ct_st_write(p, &e, 1, NULL, NULL, 0));
  const char *h2 = "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       ";
  CHECK(strlen(h2) == 72);  // 65 bytes of JSON + 7 spaces
  expect_file(p, h2, strlen(h2), v, 24);

  CHECK_OK(ct_st_write(p, NULL, 0, NULL, NULL, 0));
  expect_file(p, "{}      ", strlen("{}      "), NULL, 0);

  const char *k[] = {"framework"}, *val[] = {"pt"};
  CHECK_OK(ct_st_write(p, NULL, 0, k, val, 1));
  const char *h4 = "{\"__metadata__\":{\"framework\":\"pt\"}}     ";
  CHECK(strlen(h4) == 40);
  expect_file(p, h4, strlen(h4), NULL, 0);

  const uint16_t bf[2] = {0x3f80, 0xc000};  // 1, -2
  e = (ct_st_entry){.name = "w", .dtype = CT_DT_BF16, .ndim = 1, .shape = {2}, .data_f32 = (const float[]){1, -2}};
  CHECK_OK(ct_st_write(p, &e, 1, k, val, 1));
  const char *h5 =
      "{\"__metadata__\":{\"framework\":\"pt\"},\"w\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}       ";
  CHECK(strlen(h5) == 96);
  expect_file(p, h5, strlen(h5), bf, 4);
}

static void test_write_rejects_bad_entries_naming_the_tensor(void) {
  const float x[2] = {1, 2};
  const char *p = scratch_path("reject.safetensors");
  unlink(p);
  ct_st_entry two[2] = {
      {.name = "w", .dtype = CT_DT_F32, .ndim = 1, .shape = {2}, .data_f32 = x},
      {.name = "w", .dtype = CT_DT_F32, .ndim = 1, .shape = {2}, .data_f32 = x},
  };
  CHECK(FRESH(ct_st_write(p, two, 2, NULL, NULL, 0)) == CT_EINVAL && has(p) && has("'w'") && has("twice"));
  ct_st_entry e = {.name = "__metadata__", .dtype = CT_DT_F32, .ndim = 1, .shape = {2}, .data_f32 = x};
  CHECK(FRESH(ct_st_write(p, &e, 1, NULL, NULL, 0)) == CT_EINVAL && has("__metadata__"));
  e = (ct_st_entry){.name = "neg", .dtype = CT_DT_F32, .ndim = 2, .shape = {2, -1}, .data_f32 = x};
  CHECK(FRESH(ct_st_write(p, &e, 1, NULL, NULL, 0)) == CT_EINVAL && has("'neg'") && has("shape[1]"));
  e = (ct_st_entry){.name = "deep", .dtype = CT_DT_F32, .ndim = 9, .data_f32 = x};
  CHECK(FRESH(ct_st_write(p, &e, 1, NULL, NULL, 0)) == CT_EINVAL && has("'deep'") && has("ndim 9"));
  e = (ct_st_entry){.name = "int", .dtype = CT_DT_I32, .ndim = 1, .shape = {2}, .data_f32 = x};
  CHECK(FRESH(ct_st_write(p, &e, 1, NULL, NULL, 0)) == CT_EINVAL && has("'int'") && has("I32"));
  e = (ct_st_entry){.name = "nodata", .dtype = CT_DT_F32, .ndim = 1, .shape = {2}};
  CHECK(FRESH(ct_st_write(p, &e, 1, NULL, NULL, 0)) == CT_EINVAL && has("'nodata'"));
  e = (ct_st_entry){.name = "bad\xff", .dtype = CT_DT_F32, .ndim = 1, .shape = {2}, .data_f32 = x};
  CHECK(FRESH(ct_st_write(p, &e, 1, NULL, NULL, 0)) == CT_EINVAL && has("UTF-8"));
  e = (ct_st_entry){.name = "huge", .dtype = CT_DT_F32, .ndim = 2, .shape = {INT64_MAX, 2}, .data_f32 = x};
  CHECK(FRESH(ct_st_write(p, &e, 1, NULL, NULL, 0)) == CT_EINVAL && has("'huge'"));
  const char *k2[] = {"a", "a"}, *v2[] = {"1", "2"};
  CHECK(FRESH(ct_st_write(p, NULL, 0, k2, v2, 2)) == CT_EINVAL && has("'a'"));
  CHECK(access(p, F_OK) != 0);  // nothing was created
}

static void test_write_reports_io_errors_with_the_path(void) {
  const float x[4] = {1, 2, 3, 4};
  ct_st_entry e = {.name = "w", .dtype = CT_DT_F32, .ndim = 1, .shape = {4}, .data_f32 = x};
  const char *p = scratch_path("no/such/dir/model.safetensors");
  CHECK(FRESH(ct_st_write(p, &e, 1, NULL, NULL, 0)) == CT_EIO && has(p));
  if (access("/dev/full", W_OK) == 0) {  // every write fails with ENOSPC
    CHECK(FRESH(ct_st_write("/dev/full", &e, 1, NULL, NULL, 0)) == CT_EIO);
    CHECK(has("/dev/full") && has(strerror(ENOSPC)));
    CHECK(access("/dev/full", F_OK) == 0);  // a device is never unlinked
  }
}

// 1000 tensors written in a scrambled order are all found by name.
static void test_find_locates_each_of_1000_tensors(void) {
  enum { N = 1000 };
  static char names[N][48];
  static ct_st_entry e[N];
  static float vals[N];
  for (int i = 0; i < N; i++) {
    int k = (i * 617) % N;  // 617 is prime to 1000: a permutation
    snprintf(names[i], sizeof names[i], "model.layers.%d.mlp.up_proj.weight", k);
    vals[i] = (float)k;
    e[i] = (ct_st_entry){.name = names[i], .dtype = CT_DT_F32, .ndim = 1, .shape = {1}, .data_f32 = &vals[i]};
  }
  const char *p = scratch_path("many.safetensors");
  CHECK_OK(ct_st_write(p, e, N, NULL, NULL, 0));
  ct_safetensors st;
  CHECK_OK(ct_st_open(&st, p));
  CHECK(st.n == N);
  int bad = 0;
  for (int k = 0; k < N; k++) {
    char name[48];
    snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", k);
    const ct_st_tensor *t = ct_st_find(&st, name);
    float v = -1;
    if (!t || strcmp(t->name, name) != 0 || ct_st_read_f32(&st, t, &v, 1) != 0 || v != (float)k) bad++;
  }
  CHECK(bad == 0);
  CHECK(ct_st_find(&st, "model.layers.1000.mlp.up_proj.weight") == NULL);
  ct_st_close(&st);
}

// A header whose length is odd puts the data at an odd address; reads must not care.
static void test_reads_unaligned_data_section(void) {
  char h[200];
  snprintf(h, sizeof h,
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[8,16]},"
           "\"c\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[16,18]}}");
  if (strlen(h) % 2 == 0) strcat(h, " ");
  size_t hl = strlen(h);
  uint8_t buf[256];
  for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
  memcpy(buf + 8, h, hl);
  const float a[2] = {1.25f, -3};
  const double b = 0.5;
  const uint16_t c = 0x4040;  // 3.0
  memcpy(buf + 8 + hl, a, 8);
  memcpy(buf + 16 + hl, &b, 8);
  memcpy(buf + 24 + hl, &c, 2);
  const char *p = scratch_path("unaligned.safetensors");
  write_bytes(p, buf, 26 + hl);
  ct_safetensors st;
  CHECK_OK(ct_st_open(&st, p));
  float out[2];
  CHECK(((uintptr_t)st.data & 1) == 1);
  CHECK_OK(ct_st_read_f32(&st, ct_st_find(&st, "a"), out, 2));
  CHECK(out[0] == 1.25f && out[1] == -3);
  CHECK_OK(ct_st_read_f32(&st, ct_st_find(&st, "b"), out, 1));
  CHECK(out[0] == 0.5f);
  CHECK_OK(ct_st_read_f32(&st, ct_st_find(&st, "c"), out, 1));
  CHECK(out[0] == 3.0f);
  ct_st_close(&st);
}

// Zero-size tensors may share an offset with each other and the start of the next.
static void test_zero_size_tensors_at_shared_offsets_are_accepted(void) {
  const char *p = scratch_path("zeros.safetensors");
  write_raw(p,
            "{\"z1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
            "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
            "\"z0\":{\"dtype\":\"I64\",\"shape\":[3,0],\"data_offsets\":[0,0]},"
            "\"z2\":{\"dtype\":\"BOOL\",\"shape\":[0,7],\"data_offsets\":[4,4]}}",
            4);
  ct_safetensors st;
  CHECK_OK(ct_st_open(&st, p));
  CHECK(st.n == 4);
  CHECK(ct_st_find(&st, "z0") && ct_st_find(&st, "z0")->numel == 0);
  CHECK(ct_st_find(&st, "a") && ct_st_find(&st, "a")->begin == 0);
  ct_st_close(&st);
}

// ------------------------------------------------------------------- malformed files

static void test_open_rejects_truncated_and_oversized_length_prefixes(void) {
  const char *p = scratch_path("short.safetensors");
  write_bytes(p, "\x08\0\0\0\0", 5);
  expect_open_fails(p, CT_EFORMAT, "too short", NULL);
  write_bytes(p, "", 0);
  expect_open_fails(p, CT_EFORMAT, "0 bytes", NULL);
  write_raw_n(p, 1000, "{}", 2, 10);
  expect_open_fails(p, CT_EFORMAT, "header length 1000", "past the end");
  write_raw_n(p, 200000000, "{}", 2, 10);
  expect_open_fails(p, CT_EFORMAT, "16777216", NULL);
  write_raw_n(p, UINT64_MAX, "{}", 2, 10);
  expect_open_fails(p, CT_EFORMAT, "limit", NULL);
  write_raw_n(p, 0, "", 0, 0);
  expect_open_fails(p, CT_EFORMAT, "'{'", NULL);
}

// The header's size, its entries and its values are bounded before it is parsed: each
// of these files is valid (the reference reads them) but would make the parser take
// ~15 bytes of memory per header byte. Each is refused at once, naming the file.
static void test_open_bounds_header_bytes_tensors_and_values_before_parsing(void) {
  const char *p = scratch_path("huge-header.safetensors");
  size_t n = CT_ST_MAX_HEADER + 8;  // an empty header padded with spaces past the bound
  char *h = malloc(n + 1);
  memset(h, ' ', n);
  h[0] = '{';
  h[n - 1] = '}';
  write_raw_n(p, n, h, n, 0);
  expect_open_fails(p, CT_EFORMAT, "16777216-byte limit", NULL);
  // CT_ST_MAX_TENSORS + 2 zero-size tensors (~4 MB of header; + 1 could be __metadata__)
  size_t k = 0;
  n = (size_t)(CT_ST_MAX_TENSORS + 2) * 64 + 2;
  h = realloc(h, n);
  k += (size_t)sprintf(h + k, "{");
  for (int i = 0; i <= CT_ST_MAX_TENSORS + 1; i++)
    k += (size_t)sprintf(h + k, "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                         i ? "," : "", i);
  k += (size_t)sprintf(h + k, "}");
  p = scratch_path("many-tensors.safetensors");
  write_raw_n(p, k, h, k, 0);
  expect_open_fails(p, CT_EFORMAT, "65538 entries", "65536 tensors");
  // one tensor whose shape lists 1.1 million zeros
  n = 1100000 * 2 + 100;
  h = realloc(h, n);
  k = (size_t)sprintf(h, "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,0],\"shape\":[0");
  for (int i = 1; i < 1100000; i++) k += (size_t)sprintf(h + k, ",0");
  k += (size_t)sprintf(h + k, "]}}");
  p = scratch_path("many-values.safetensors");
  write_raw_n(p, k, h, k, 0);
  expect_open_fails(p, CT_EFORMAT, "1100003 list and object items", NULL);
  free(h);
}

static void test_open_rejects_headers_that_are_not_json_objects(void) {
  expect_bad_header("{\"a\":", 0, "not valid JSON", NULL);
  expect_bad_header("[1,2]", 0, "does not start with '{'", NULL);
  expect_bad_header(" {}", 0, "does not start with '{'", NULL);
  expect_bad_header("{} x", 0, "not valid JSON", NULL);
  expect_bad_header("{\"w\xff\":1}", 0, "not valid JSON", NULL);  // invalid UTF-8
  const char *p = scratch_path("nul.safetensors");
  write_raw_n(p, 8, "{}\0\0\0\0\0\0", 8, 0);  // NUL padding is not JSON whitespace
  expect_open_fails(p, CT_EFORMAT, "not valid JSON", NULL);
  // Deep nesting ends in a parse error, not a stack overflow.
  enum { DEPTH = 20000 };
  char *deep = malloc(DEPTH + 8);
  strcpy(deep, "{\"a\":");
  memset(deep + 5, '[', DEPTH);
  deep[DEPTH + 5] = 0;
  expect_bad_header(deep, 0, "not valid JSON", NULL);
  free(deep);
}

static void test_open_rejects_bad_entries_naming_the_tensor(void) {
  expect_bad_header("{\"w\":5}", 0, "'w'", "not a JSON object");
  expect_bad_header("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'", "no dtype");
  expect_bad_header("{\"w\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'", "Q4");
  expect_bad_header("{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'", "unknown dtype");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "'w'", "no shape");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}", 4, "'w'", "not a list");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,4]}}", 4, "'w'", "shape[1]");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "'w'", "shape[0]");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                    "'w'", "9 dimensions");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,4]}}", 4,
                    "'w'", "overflow");
  expect_bad_header("{\"w\":{\"dtype\":\"I64\",\"shape\":[3037000500,3037000500],\"data_offsets\":[0,4]}}", 4,
                    "'w'", "overflow");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "'w'", "no data_offsets");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "'w'", "two non-negative");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, "'w'", "two non-negative");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, "'w'", "two non-negative");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", 4, "'w'", "two non-negative");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}}}", 4, "'w'", "two non-negative");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, "'w'", "end before");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "'w'", "4-byte data section");
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,99999999999999999]}}", 4,
                    "'w'", "data section");
  expect_bad_header("{\"model.norm.weight\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,12]}}", 12,
                    "tensor 'model.norm.weight': data_offsets [0, 12] hold 12 bytes but shape [4] of F16 needs 8",
                    NULL);
  // A newline in a name is shown as '?', keeping the message on one line.
  expect_bad_header("{\"bad\\nname\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "'bad?name'", NULL);
  CHECK(strchr(ct_last_error(), '\n') == NULL);
}

static void test_open_rejects_overlaps_holes_and_trailing_bytes(void) {
  expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                    12, "'b'", "overlap tensor 'a'");
  expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                    8, "overlap", NULL);
  expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
                    8, "'z'", "overlap tensor 'a'");
  expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                    12, "'b'", "hole");
  expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "'a'", "hole");
  expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "4 trailing bytes", NULL);
  expect_bad_header("{}", 3, "3 trailing bytes", NULL);
}

static void test_open_rejects_duplicate_names_and_bad_metadata(void) {
  expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                    8, "twice", "\"w\"");
  expect_bad_header("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__", "'k'");
  expect_bad_header("{\"__metadata__\":[\"k\"]}", 0, "__metadata__", "not an object");
  expect_bad_header("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "twice", NULL);
}

static void test_open_missing_file_or_directory_is_io_error(void) {
  expect_open_fails(scratch_path("does-not-exist.safetensors"), CT_EIO, "cannot open", NULL);
  expect_open_fails(scratch_dir, CT_EIO, "not a regular file", NULL);
  ct_safetensors st;
  CHECK(ct_st_open(&st, NULL) == CT_EINVAL);
  ct_st_close(&st);
}

static void test_close_is_safe_on_zeroed_structs(void) {
  ct_safetensors st = {0};
  ct_st_close(&st);
  ct_st_close(NULL);
  CHECK(st.fd == -1 && st.map == NULL);
  ct_st_dir d = {0};
  ct_st_dir_close(&d);
  ct_st_dir_close(&d);
  ct_st_dir_close(NULL);
  CHECK(d.files == NULL);
}

// ------------------------------------------------------------------- directories

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

static void test_sharded_dir_opens_each_shard_once_and_finds_every_tensor(void) {
  const char *dir = scratch_path("sharded");
  CHECK(mkdir(dir, 0755) == 0);
  char s1[600], s2[600], idx[600];
  snprintf(s1, sizeof s1, "%s/model-00001-of-00002.safetensors", dir);
  snprintf(s2, sizeof s2, "%s/model-00002-of-00002.safetensors", dir);
  snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
  const float a[2] = {1, 2}, b[1] = {3}, c[2] = {4, 5};
  ct_st_entry e1[2] = {
      {.name = "a", .dtype = CT_DT_F32, .ndim = 1, .shape = {2}, .data_f32 = a},
      {.name = "b", .dtype = CT_DT_BF16, .ndim = 1, .shape = {1}, .data_f32 = b},
  };
  ct_st_entry e2[2] = {
      {.name = "c", .dtype = CT_DT_F16, .ndim = 2, .shape = {1, 2}, .data_f32 = c},
      {.name = "unlisted", .dtype = CT_DT_F32, .ndim = 1, .shape = {1}, .data_f32 = b},
  };
  CHECK_OK(ct_st_write(s1, e1, 2, NULL, NULL, 0));
  CHECK_OK(ct_st_write(s2, e2, 2, NULL, NULL, 0));
  write_text(idx,
             "{\"metadata\": {\"total_size\": 18},\n \"weight_map\": {\n"
             "  \"c\": \"model-00002-of-00002.safetensors\",\n"
             "  \"a\": \"model-00001-of-00002.safetensors\",\n"
             "  \"b\": \"model-00001-of-00002.safetensors\"}}\n");
  ct_st_dir d;
  CHECK_OK(ct_st_dir_open(&d, dir));
  CHECK(d.n_files == 2 && d.n == 3);
  const char *want_file[3] = {s1, s1, s2};
  const char *names[3] = {"a", "b", "c"};
  const float want[3][2] = {{1, 2}, {3, 0}, {4, 5}};
  for (int i = 0; i < 3; i++) {
    const ct_safetensors *st = NULL;
    const ct_st_tensor *t = NULL;
    CHECK_OK(ct_st_dir_find(&d, names[i], &st, &t));
    if (!st || !t) continue;
    CHECK(strcmp(st->path, want_file[i]) == 0);
    CHECK(st >= d.files && st < d.files + d.n_files);
    CHECK(strcmp(t->name, names[i]) == 0);
    float out[2] = {0, 0};
    CHECK_OK(ct_st_read_f32(st, t, out, t->numel));
    CHECK(out[0] == want[i][0] && out[1] == want[i][1]);
  }
  CHECK(ct_st_dir_find(&d, "a", NULL, NULL) == 0);
  CHECK(ct_st_dir_find(&d, "unlisted", NULL, NULL) == CT_EFORMAT);
  CHECK(FRESH(ct_st_dir_find(&d, "lm_head.weight", NULL, NULL)) == CT_EFORMAT);
  CHECK(has("'lm_head.weight'") && has(dir));
  ct_st_dir_close(&d);
  ct_st_dir_close(&d);

  // A tensor mapped to a shard that lacks it: the message names tensor, shard and index.
  write_text(idx, "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\","
                  " \"d\": \"model-00002-of-00002.safetensors\"}}");
  CHECK(FRESH(ct_st_dir_open(&d, dir)) == CT_EFORMAT);
  CHECK(has("'d'") && has(s2) && has(idx));
  CHECK(d.files == NULL && d.n_files == 0);
  ct_st_dir_close(&d);
  // A shard that does not exist.
  write_text(idx, "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\","
                  " \"e\": \"model-00003-of-00003.safetensors\"}}");
  CHECK(FRESH(ct_st_dir_open(&d, dir)) == CT_EIO);
  CHECK(has("model-00003-of-00003.safetensors") && has(idx));
  // A shard outside the directory, a non-string shard, no weight_map, bad JSON.
  write_text(idx, "{\"weight_map\": {\"a\": \"../model-00001-of-00002.safetensors\"}}");
  CHECK(FRESH(ct_st_dir_open(&d, dir)) == CT_EFORMAT && has("'a'") && has(idx));
  write_text(idx, "{\"weight_map\": {\"a\": 1}}");
  CHECK(FRESH(ct_st_dir_open(&d, dir)) == CT_EFORMAT && has("'a'") && has(idx));
  write_text(idx, "{\"metadata\": {}}");
  CHECK(FRESH(ct_st_dir_open(&d, dir)) == CT_EFORMAT && has("weight_map") && has(idx));
  write_text(idx, "{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}");
  CHECK(FRESH(ct_st_dir_open(&d, dir)) == CT_EFORMAT && has(idx));
  write_text(idx, "{\"weight_map\": ");
  CHECK(FRESH(ct_st_dir_open(&d, dir)) == CT_EFORMAT && has(idx));
  // A corrupt shard: the message names the shard and the index.
  write_text(idx, "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\"}}");
  write_raw(s1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6);
  CHECK(FRESH(ct_st_dir_open(&d, dir)) == CT_EFORMAT && has(s1) && has(idx) && has("trailing"));
  ct_st_dir_close(&d);
}

static void test_single_file_dir_and_missing_weights(void) {
  const char *dir = scratch_path("single");
  CHECK(mkdir(dir, 0755) == 0);
  ct_st_dir d;
  CHECK(FRESH(ct_st_dir_open(&d, dir)) == CT_EIO && has(dir) && has("model.safetensors"));
  char file[600];
  snprintf(file, sizeof file, "%s/model.safetensors", dir);
  const float x[3] = {7, 8, 9};
  ct_st_entry e[2] = {
      {.name = "model.embed_tokens.weight", .dtype = CT_DT_F32, .ndim = 2, .shape = {3, 1}, .data_f32 = x},
      {.name = "model.norm.weight", .dtype = CT_DT_BF16, .ndim = 1, .shape = {1}, .data_f32 = x},
  };
  CHECK_OK(ct_st_write(file, e, 2, NULL, NULL, 0));
  char slash[600];
  snprintf(slash, sizeof slash, "%s/", dir);  // a trailing slash is fine
  CHECK_OK(ct_st_dir_open(&d, slash));
  CHECK(d.n_files == 1 && d.n == 2);
  const ct_safetensors *st;
  const ct_st_tensor *t;
  CHECK_OK(ct_st_dir_find(&d, "model.norm.weight", &st, &t));
  float v = 0;
  CHECK_OK(ct_st_read_f32(st, t, &v, 1));
  CHECK(v == 7);
  CHECK(strcmp(st->path, file) == 0);
  ct_st_dir_close(&d);
  write_bytes(file, "abc", 3);
  CHECK(FRESH(ct_st_dir_open(&d, dir)) == CT_EFORMAT && has(file));
  ct_st_dir_close(&d);
}

// ------------------------------------------------------------------------- fuzzing

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) {  // xorshift64*
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

// Mutated headers (bit flips, JSON-ish bytes, changed lengths, truncation) must give 0
// or an error; a file that opens must be fully readable.
static void test_fuzzed_headers_open_or_fail_but_never_crash(void) {
  const float v[6] = {1, 2, 3, 4, 5, 6};
  const int32_t ints[2] = {1, 2};
  ct_st_entry e[] = {
      {.name = "model.layers.0.w", .dtype = CT_DT_BF16, .ndim = 2, .shape = {2, 3}, .data_f32 = v},
      {.name = "b", .dtype = CT_DT_F16, .ndim = 1, .shape = {2}, .data_f32 = v},
      {.name = "s", .dtype = CT_DT_F32, .ndim = 0, .data_f32 = v},
      {.name = "i", .dtype = CT_DT_I32, .ndim = 1, .shape = {2}, .data = ints},
      {.name = "z", .dtype = CT_DT_F32, .ndim = 1, .shape = {0}},
  };
  const char *k[] = {"format"}, *mv[] = {"pt"};
  const char *p = scratch_path("fuzz.safetensors");
  CHECK_OK(ct_st_write(p, e, 5, k, mv, 1));
  size_t len = 0;
  uint8_t *orig = read_bytes(p, &len);
  CHECK(orig && len > 16);
  if (!orig) return;
  size_t hn = 0;
  for (int i = 7; i >= 0; i--) hn = hn << 8 | orig[i];
  static const char alphabet[] = "{}[]\",:0123456789-+.eE \\uFBIx_\x7f\xc3\xff\n";
  uint8_t *buf = malloc(len + 16);
  int n_ok = 0, n_err = 0, bad = 0;
  clock_t t0 = clock();
  for (int it = 0; it < 3000; it++) {
    memcpy(buf, orig, len);
    size_t n = len;
    int muts = 1 + (int)(rng() % 3);
    for (int m = 0; m < muts; m++) {
      size_t at = 8 + rng() % hn;
      switch (rng() % 6) {
        case 0: buf[at] ^= (uint8_t)(1u << (rng() % 8)); break;
        case 1: buf[at] = (uint8_t)alphabet[rng() % (sizeof alphabet - 1)]; break;
        case 2: buf[at] = (uint8_t)rng(); break;
        case 3: n = rng() % (n + 1); break;  // truncate anywhere
        case 4: {  // a length prefix near the true one, or anything
          uint64_t nl = rng() % 4 ? hn + rng() % 17 - 8 : rng();
          for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(nl >> (8 * i));
          break;
        }
        case 5:  // a digit in the header becomes another
          for (size_t j = at; j < 8 + hn; j++)
            if (buf[j] >= '0' && buf[j] <= '9') {
              buf[j] = (uint8_t)('0' + rng() % 10);
              break;
            }
          break;
      }
    }
    write_bytes(p, buf, n);
    ct_safetensors st;
    int rc = FRESH(ct_st_open(&st, p));
    if (rc == 0) {
      n_ok++;
      for (int i = 0; i < st.n; i++) {
        const ct_st_tensor *t = &st.tensors[i];
        if (ct_st_find(&st, t->name) != t) bad++;
        if (t->end > st.data_size || t->end - t->begin != (uint64_t)t->numel * ct_dtype_size(t->dtype)) bad++;
        float *out = malloc((size_t)t->numel * sizeof(float) + 1);
        int r = ct_st_read_f32(&st, t, out, t->numel);
        int is_float = t->dtype == CT_DT_F32 || t->dtype == CT_DT_F16 || t->dtype == CT_DT_BF16 ||
                       t->dtype == CT_DT_F64;
        if (is_float ? r != 0 : r != CT_EFORMAT) bad++;
        free(out);
      }
    } else {
      n_err++;
      if (rc >= 0 || !has(p)) bad++;
    }
    ct_st_close(&st);
  }
  double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
  fprintf(stderr, "    fuzz: %d opened, %d rejected, %.2fs cpu\n", n_ok, n_err, secs);
  CHECK(bad == 0);
  CHECK(n_ok > 0 && n_err > 0);
  free(buf);
  free(orig);
}

int main(void) {
  if (scratch_make("/tmp/ct-test-safetensors-XXXXXX")) return 1;
  RUN(test_dtype_names_sizes_and_parse_round_trip);
  RUN(test_bf16_rounds_ties_to_even_and_keeps_inf_nan_subnormals);
  RUN(test_f16_rounds_ties_to_even_and_keeps_inf_nan_subnormals);
  RUN(test_roundtrip_f32_bf16_f16_preserves_values);
  RUN(test_metadata_round_trips_and_absent_keys_are_null);
  RUN(test_written_header_bytes_match_reference_serializer);
  RUN(test_write_rejects_bad_entries_naming_the_tensor);
  RUN(test_write_reports_io_errors_with_the_path);
  RUN(test_find_locates_each_of_1000_tensors);
  RUN(test_reads_unaligned_data_section);
  RUN(test_zero_size_tensors_at_shared_offsets_are_accepted);
  RUN(test_open_rejects_truncated_and_oversized_length_prefixes);
  RUN(test_open_bounds_header_bytes_tensors_and_values_before_parsing);
  RUN(test_open_rejects_headers_that_are_not_json_objects);
  RUN(test_open_rejects_bad_entries_naming_the_tensor);
  RUN(test_open_rejects_overlaps_holes_and_trailing_bytes);
  RUN(test_open_rejects_duplicate_names_and_bad_metadata);
  RUN(test_open_missing_file_or_directory_is_io_error);
  RUN(test_close_is_safe_on_zeroed_structs);
  RUN(test_sharded_dir_opens_each_shard_once_and_finds_every_tensor);
  RUN(test_single_file_dir_and_missing_weights);
  RUN(test_fuzzed_headers_open_or_fail_but_never_crash);
  scratch_remove();
  return test_summary();
}
