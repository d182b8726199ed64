// ident: frozen inputs' identities (config keys, values, checksum), their JSON form in
// trainer_state.json and caches, and the one-phrase description of a difference.
#include "ident.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

void ct_ident_set(ct_ident *id, const char *role, const char *path_key, const char *path, const char *dtype_key,
                  const char *dtype, uint64_t sum) {
  memset(id, 0, sizeof *id);
  snprintf(id->role, sizeof id->role, "%s", role);
  snprintf(id->path_key, sizeof id->path_key, "%s", path_key);
  snprintf(id->path, sizeof id->path, "%s", path ? path : "");
  snprintf(id->dtype_key, sizeof id->dtype_key, "%s", dtype_key ? dtype_key : "");
  snprintf(id->dtype, sizeof id->dtype, "%s", dtype ? dtype : "");
  id->sum = sum;
}

json_t *ct_ident_json(const ct_ident *id) {
  char hex[20];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)id->sum);
  json_t *j = json_pack("{s:s,s:s}", id->path_key, id->path, "xxh64", hex);
  if (j && id->dtype_key[0]) json_object_set_new(j, id->dtype_key, json_string(id->dtype));
  return j;
}

int ct_ident_parse(ct_ident *id, const char *role, const json_t *j, const char *where) {
  memset(id, 0, sizeof *id);
  snprintf(id->role, sizeof id->role, "%s", role);
  const char *key, *sum = json_string_value(json_object_get(j, "xxh64"));
  char *end = NULL;
  json_t *v;
  int paths = 0;
  if (sum && strlen(sum) == 16) id->sum = strtoull(sum, &end, 16);
  json_object_foreach((json_t *)j, key, v) {
    if (!strcmp(key, "xxh64")) continue;
    bool dtype = strlen(key) > 6 && !strcmp(key + strlen(key) - 6, "_dtype");
    if (!json_is_string(v) || strlen(key) >= sizeof id->path_key) paths = 2;
    else if (dtype) {
      snprintf(id->dtype_key, sizeof id->dtype_key, "%s", key);
      snprintf(id->dtype, sizeof id->dtype, "%s", json_string_value(v));
    } else {
      snprintf(id->path_key, sizeof id->path_key, "%s", key);
      snprintf(id->path, sizeof id->path, "%s", json_string_value(v));
      paths++;
    }
  }
  if (!end || *end || paths != 1)
    return ct_set_error(CT_EFORMAT, "%s: frozen input '%s' is unreadable (a path key, an xxh64 of 16 hex digits)",
                        where, role);
  return 0;
}

// "the LoRA base", ... for a role.
static const char *role_name(const char *role) {
  return !strcmp(role, "base") ? "the LoRA base" : !strcmp(role, "reference") ? "the reference model"
         : !strcmp(role, "teacher") ? "the teacher" : role;
}

// A path for a message: "" is the seeded initialization.
static const char *shown(const char *p) { return p[0] ? p : "(the seeded initialization)"; }

bool ct_ident_differs(const ct_ident *was, const ct_ident *now, char *msg, size_t n) {
  const char *what = role_name(now->role);
  if (strcmp(was->path_key, now->path_key))
    snprintf(msg, n, "key '%s': %s was %s %s, now %s %s", now->path_key, what, was->path_key, shown(was->path),
             now->path_key, shown(now->path));
  else if (strcmp(was->dtype_key, now->dtype_key) || strcmp(was->dtype, now->dtype))
    snprintf(msg, n, "key '%s': %s was %s, now %s", now->dtype_key[0] ? now->dtype_key : was->dtype_key, what,
             was->dtype[0] ? was->dtype : "(none)", now->dtype[0] ? now->dtype : "(none)");
  else if (was->sum != now->sum)
    snprintf(msg, n, "key '%s': %s differs (xxh64 %016llx from %s, now %016llx from %s)", now->path_key, what,
             (unsigned long long)was->sum, shown(was->path), (unsigned long long)now->sum, shown(now->path));
  else
    return false;
  return true;
}
