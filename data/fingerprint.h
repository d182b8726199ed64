// fingerprint: a 64-bit hash of a training set as the trainer sees it (token ids, labels,
// how rows form sequences; for prompts, each row as read, so answers count too). A
// checkpoint records it, and resuming on different data is an error, not a silent change
// of the promised data order.
#pragma once
#include <stdint.h>

#include "data.h"
#include "prefs.h"
#include "prompts.h"

uint64_t ct_dataset_fingerprint(const ct_dataset *ds);
uint64_t ct_pref_fingerprint(const ct_pref_dataset *ds);
uint64_t ct_prompt_set_fingerprint(const ct_prompt_set *s);
