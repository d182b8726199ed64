// train_state: trainer_state.json, the part of the train state that is neither weights nor
// moments (step, epoch and data position, rng, data hash, global batch, optimizer, frozen
// inputs, DiLoCo's ranks) and the checksum of every other file of the checkpoint: written
// last into a checkpoint, read back (and the files checked) when a run resumes.
#include "train_internal.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "fs.h"
#include "hfjson.h"

// A checkpoint's files against the checksums its trainer_state.json recorded ("files":
// {name: {"bytes", "xxh64"}}; older checkpoints have none and are not checked).
static int verify_files(const char *dir, json_t *files) {
  const char *name;
  json_t *f;
  json_object_foreach(files, name, f) {
    char p[CT_PATH_MAX];
    uint64_t h;
    long size;
    const char *want = json_string_value(json_object_get(f, "xxh64"));
    json_int_t bytes = json_integer_value(json_object_get(f, "bytes"));
    int rc = ct_path_join(p, sizeof p, dir, name);
    if (rc) return rc;
    if (access(p, R_OK))
      return ct_set_error(CT_EFORMAT, "%s: missing (trainer_state.json lists it): the checkpoint is "
                          "incomplete; resume from another one", p);
    if ((rc = ct_file_checksum(p, &h, &size))) return rc;
    char got[20];
    snprintf(got, sizeof got, "%016llx", (unsigned long long)h);
    if (!want || size != bytes || strcmp(got, want))
      return ct_set_error(CT_EFORMAT, "%s: changed since it was saved (%ld bytes, xxh64 %s; saved: %lld "
                          "bytes, xxh64 %s): the checkpoint is damaged; resume from another one", p,
                          size, got, (long long)bytes, want ? want : "?");
  }
  return 0;
}

// A hex string of 1 to 16 digits -> *v.
static bool parse_hex64(const char *s, uint64_t *v) {
  if (!s || !*s || strlen(s) > 16 || strspn(s, "0123456789abcdefABCDEF") != strlen(s)) return false;
  *v = strtoull(s, NULL, 16);
  return true;
}

int ct_train_state_read(ct_train *tr, const char *dir) {
  char path[CT_PATH_MAX];
  json_t *j;
  int rc = ct_hfjson_read(dir, "trainer_state.json", path, sizeof path, &j);
  if (rc) return rc;
  json_t *ct = json_object_get(j, "ctune");
  json_t *rng = json_object_get(ct, "rng"), *files = json_object_get(ct, "files");
  json_t *frozen = json_object_get(ct, "frozen");  // NULL: saved before identities were recorded
  const char *bad = NULL;
  if (!json_is_integer(json_object_get(j, "global_step")) || !json_is_array(rng) || json_array_size(rng) != 4) {
    rc = ct_set_error(CT_EFORMAT, "%s: not a ctune trainer state (global_step, ctune.rng missing)", path);
    goto done;
  }
  tr->step = (long)json_integer_value(json_object_get(j, "global_step"));
  tr->epoch = (long)json_integer_value(json_object_get(ct, "epoch"));
  tr->epoch_pos = (long)json_integer_value(json_object_get(ct, "epoch_pos"));
  tr->n_seq = (int)json_integer_value(json_object_get(ct, "n_seq"));
  tr->num_tokens = json_number_value(json_object_get(ct, "num_tokens"));
  tr->global_batch = (int)json_integer_value(json_object_get(ct, "global_batch"));  // 0: older state
  tr->saved_diloco_ranks = (int)json_integer_value(json_object_get(ct, "diloco_ranks"));  // 0: none
  const char *opt = json_string_value(json_object_get(ct, "optimizer"));  // NULL: older state, AdamW
  const char *want = ct_optimizer_names[tr->cfg->optimizer];
  if (strcmp(opt ? opt : "adamw", want)) {
    rc = ct_set_error(CT_ECONFIG, "%s: the checkpoint's optimizer state is %s's, and optimizer is %s; resume "
                      "with optimizer: %s", path, opt ? opt : "adamw", want, opt ? opt : "adamw");
    goto done;
  }
  bool zero = true;
  for (int i = 0; i < 4 && !bad; i++) {
    if (!parse_hex64(json_string_value(json_array_get(rng, i)), &tr->rng.s[i])) bad = "ctune.rng (16 hex digits each)";
    zero = zero && tr->rng.s[i] == 0;
  }
  const char *hash = json_string_value(json_object_get(ct, "data_hash"));
  if (!bad && hash && !parse_hex64(hash, &tr->data_hash)) bad = "ctune.data_hash";
  bad = bad                                          ? bad
        : zero                                       ? "ctune.rng (all zero)"
        : tr->step < 0                               ? "global_step"
        : tr->epoch < 0                              ? "ctune.epoch"
        : tr->n_seq < 0                              ? "ctune.n_seq"
        : tr->epoch_pos < 0 || tr->epoch_pos > tr->n_seq ? "ctune.epoch_pos (past the end of the data)"
        : !(tr->num_tokens >= 0)                     ? "ctune.num_tokens"
        : tr->global_batch < 0                       ? "ctune.global_batch"
        : tr->saved_diloco_ranks < 0                 ? "ctune.diloco_ranks"
        : files && !json_is_object(files)            ? "ctune.files"
        : frozen && (!json_is_object(frozen) || json_object_size(frozen) > CT_TRAIN_FROZEN_MAX) ? "ctune.frozen"
                                                     : NULL;
  if (bad) rc = ct_set_error(CT_EFORMAT, "%s: %s is out of range or unreadable: the trainer state is damaged; "
                             "resume from another checkpoint", path, bad);
  else if (files) rc = verify_files(dir, files);
  const char *role;
  json_t *id;
  tr->n_saved_frozen = 0;
  json_object_foreach(frozen, role, id) {
    if (rc) break;
    rc = ct_ident_parse(&tr->saved_frozen[tr->n_saved_frozen++], role, id, path);
  }
done:
  json_decref(j);
  return rc;
}

// Every file already in dir -> {name: {"bytes", "xxh64"}}, or NULL on failure.
static json_t *file_checksums(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return ct_set_error(CT_EIO, "%s: cannot list: %s", dir, strerror(errno)), NULL;
  json_t *files = json_object();
  struct dirent *e;
  while ((e = readdir(d))) {
    char p[CT_PATH_MAX], hex[20];
    struct stat st;
    uint64_t h;
    long size;
    if (ct_path_join(p, sizeof p, dir, e->d_name) || stat(p, &st) || !S_ISREG(st.st_mode)) continue;
    if (ct_file_checksum(p, &h, &size)) {
      json_decref(files);
      files = NULL;
      break;
    }
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    json_object_set_new(files, e->d_name, json_pack("{s:I,s:s}", "bytes", (json_int_t)size, "xxh64", hex));
  }
  closedir(d);
  return files;
}

// trainer_state.json, written last: it lists the checksum of every other file of dir.
int ct_train_state_write(const ct_train *tr, const char *dir) {
  json_t *files = file_checksums(dir);
  if (!files) return CT_EIO;
  json_t *rng = json_array();
  char hex[32], data_hash[20];
  for (int i = 0; i < 4; i++) {
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)tr->rng.s[i]);
    json_array_append_new(rng, json_string(hex));
  }
  snprintf(data_hash, sizeof data_hash, "%016llx", (unsigned long long)tr->data_hash);
  double epoch = tr->epoch + (tr->n_seq ? (double)tr->epoch_pos / tr->n_seq : 0);
  json_t *j = json_pack("{s:I,s:f,s:I,s:{s:I,s:I,s:i,s:i,s:s,s:f,s:o,s:o}}", "global_step",
                        (json_int_t)tr->step, "epoch", epoch, "max_steps",
                        (json_int_t)tr->total_steps, "ctune", "epoch", (json_int_t)tr->epoch,
                        "epoch_pos", (json_int_t)tr->epoch_pos, "n_seq", tr->n_seq,
                        "global_batch", tr->global_batch, "data_hash", data_hash,
                        "num_tokens", tr->num_tokens, "rng", rng, "files", files);
  if (j)  // what the moments are: optimizer.safetensors is the same file for either
    json_object_set_new(json_object_get(j, "ctune"), "optimizer", json_string(ct_optimizer_names[tr->cfg->optimizer]));
  json_t *frozen = tr->n_frozen ? json_object() : NULL;  // what the run read and never trained
  for (int i = 0; i < tr->n_frozen; i++) json_object_set_new(frozen, tr->frozen[i].role, ct_ident_json(&tr->frozen[i]));
  if (j && frozen) json_object_set_new(json_object_get(j, "ctune"), "frozen", frozen);
  else json_decref(frozen);
  if (j && tr->cfg->diloco_inner_steps > 0)  // whose moments the optimizer-rank<r> files hold
    json_object_set_new(json_object_get(j, "ctune"), "diloco_ranks", json_integer(tr->world));
  char p[CT_PATH_MAX];
  int rc = ct_path_join(p, sizeof p, dir, "trainer_state.json");
  if (rc) {
    json_decref(j);
    return rc;
  }
  rc = json_dump_file(j, p, JSON_INDENT(2));
  json_decref(j);
  return rc ? ct_set_error(CT_EIO, "%s: cannot write: %s", p, strerror(errno)) : 0;
}
