// hfjson: the JSON files a Hugging Face directory holds (config.json, adapter_config.json)
// written as Python's json.dumps(indent=2) writes them — keys in their order, a float as
// the shortest decimal that reads back as the same double (Python's repr: 0.05, 1e-06,
// 10000.0; not jansson's 0.050000000000000003), an integer as an integer — and a config
// written again from the one it was read from, keeping what it does not change.
#pragma once
#include <stddef.h>

#include <jansson.h>

// dir/name read into *j (a new reference), its path into path (n bytes, for the caller's
// messages). CT_EFORMAT "<path>: <jansson's message>" when it cannot be read or parsed.
int ct_hfjson_read(const char *dir, const char *name, char *path, size_t n, json_t **j);

// j to path, indented by 2, ending in a newline. CT_EIO naming path on failure.
int ct_hfjson_write(const json_t *j, const char *path);

// The shortest decimal of d that reads back as d, as Python's repr(float) writes it
// ("0.05", "1e-06", "10000.0", "1.5e+16"); buf holds 32 bytes.
void ct_hfjson_real(double d, char *buf);

// The source config (read from a file, owned by the caller) with what ctune would write
// for it (fresh) merged in: every key of source stays, in its order and JSON type; a key of
// both whose values differ (numbers compared as the float32 ctune read: only what
// training changed differs) takes fresh's value, in source's number type where it is an
// integer or a float; keys of fresh that source lacks are added only when named in `add`
// (NULL-terminated) and not null. Returns a new reference.
json_t *ct_hfjson_merge(const json_t *source, const json_t *fresh, const char *const *add);
