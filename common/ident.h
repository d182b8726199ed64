// ident: the identity of a run's frozen input — a LoRA base, a reference model, a
// distillation teacher or its top-k logits file: the config keys that chose it, their
// values, and a checksum of what was loaded (the weights as stored: ct_model_checksum,
// ct_frozen_checksum; a file's contents: ct_st_check_content).
//
// A checkpoint records its run's identities (trainer_state.json, ctune.frozen; see
// ct_train_frozen_record) and a resume refuses others; DPO's cache of reference log-probs is
// keyed by its reference's. The path is shown, never compared: a copy of the same
// weights elsewhere is the same input, other weights under the same path are not.
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  char role[16];       // "base", "reference", "teacher": its name in trainer_state.json
  char path_key[24];   // the config key naming where it came from ("model_path", "ref_model_path",
                       // "teacher_path", "teacher_logits_path")
  char path[512];      // that key's value ("" : built from the seed), for messages
  char dtype_key[24];  // the config key of how it is stored ("base_dtype", ...); "" for a file
  char dtype[16];      // its value ("float32", "bfloat16", "int8")
  uint64_t sum;        // the checksum
} ct_ident;

// Fills id (dtype_key and dtype may be NULL: a file).
void ct_ident_set(ct_ident *id, const char *role, const char *path_key, const char *path, const char *dtype_key,
                  const char *dtype, uint64_t sum);
// {"<path_key>": path, "<dtype_key>": dtype, "xxh64": "16 hex digits"} (a new reference).
json_t *ct_ident_json(const ct_ident *id);
// The inverse for role's object j; CT_EFORMAT (naming `where` and the role) when malformed.
int ct_ident_parse(ct_ident *id, const char *role, const json_t *j, const char *where);
// Whether `was` and `now` (the same role) are different inputs; if so, msg (n bytes) says
// how in one phrase naming the config key, the old value and the new:
//   "key 'ref_dtype': the reference model was int8, now float32"
//   "key 'model_path': the LoRA base's weights differ (xxh64 0123… from /a, now 4567… from /b)"
bool ct_ident_differs(const ct_ident *was, const ct_ident *now, char *msg, size_t n);
