// config: every run setting in one typed struct, resolved MaxText style.
//
//   bin/sft configs/sft.yml learning_rate=1e-5 model.hidden_size=64
//
// Resolution order, later wins: built-in defaults -> the trainer's own defaults ->
// the yml file (after the chain of files named by its `base_config:`, each path
// relative to the directory of the file that names it) -> command-line key=value.
// Keys, types, defaults, ranges and comments live in one table in config_keys.c; adding
// a key is one field of ct_config (config_types.h) plus one row in that table.
// configs/base.yml is generated from the table (`ctune-config base`) and a test keeps the
// two in sync.
//
// Every value remembers where it came from ("configs/sft.yml:12", "command line" or
// "default") so that any later check can name the line to fix.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config_types.h"

// "sft", "dpo", "grpo", "distill", "sampler", "reward" (NULL for anything else).
const char *ct_trainer_name(ct_trainer_kind t);
// Inverse of ct_trainer_name; returns 0, or CT_EINVAL for an unknown name.
int ct_trainer_from_name(const char *name, ct_trainer_kind *out);

// Built-in defaults, then the trainer's own (e.g. learning_rate 2e-5 for sft).
int ct_config_init(ct_config *c, ct_trainer_kind trainer);

// Applies a yml file on top of c: first the chain of base_config files, then this
// file's keys. On error c is left partly updated (still safe to free).
int ct_config_load_file(ct_config *c, const char *path);

// One override, `value` taken as typed (a plain scalar: ~ and null are null, lists are
// comma-separated items) and parsed as the key's type; `origin` names where it came
// from in messages and ct_config_origin ("command line"). TRL names (max_seq_length,
// eval_strategy, optim, ...) are renamed, mapped or rejected with what to use instead.
int ct_config_set(ct_config *c, const char *key, const char *value, const char *origin);

// ct_config_init(c, t), then argv[1] as a yml file unless it contains '=', then every
// remaining argv as key=value. A value is YAML where it is quoted ("my out", "\n"
// escapes) or, for a list key, a flow sequence (["a,b", c]); anything else is a plain
// scalar taken as typed (as ct_config_set). Every bad key of the file and the command
// line is reported, one line each, in one CT_ECONFIG message. On error c is freed
// (ct_config_free is still safe).
int ct_config_from_args(ct_config *c, ct_trainer_kind t, int argc, char **argv);

// The keys a yml file gave that do not apply to c->trainer and were skipped, as
// "dataset_path, output_dir" ("" when none). Only bin/sampler skips them: it takes the
// keys it uses from a trainer's yml or a run's config.yml; trainers reject them.
const char *ct_config_ignored(const ct_config *c);

// The resolved config as yml, re-loadable by ct_config_load_file into an identical
// struct: every key that applies to c->trainer, each followed by a comment naming its
// origin. model.* keys the user did not set are written commented out, so that
// reloading leaves them unset.
int ct_config_dump(const ct_config *c, FILE *f);
int ct_config_write_yaml(const ct_config *c, const char *path);

// The text of configs/base.yml: every key with its built-in default and comment,
// grouped in sections. Keys with a per-trainer default, keys that only some trainers
// accept, and the model.* keys are written commented out, so that any trainer can use
// base.yml as its base_config without changing its own defaults.
int ct_config_write_base_yaml(FILE *f);

// The keys c->trainer cannot run without (a column of the key table): an error naming
// the first one left empty, with its description.
int ct_config_check_required(const ct_config *c);

// Where key's value came from: "configs/sft.yml:12", "command line", "default";
// NULL for an unknown key.
const char *ct_config_origin(const ct_config *c, const char *key);
// Whether a yml file or the command line gave key (its origin is not "default").
bool ct_config_is_set(const ct_config *c, const char *key);

// The first key whose value differs between a and b (including the trainer and the
// model set_mask), or NULL when they are identical. Origins are not compared.
const char *ct_config_diff(const ct_config *a, const ct_config *b);

// The table of keys, in base.yml order: "seed", ..., "model.hidden_size", ...
int ct_config_num_keys(void);
const char *ct_config_key_name(int i);

// What `bin/<t> --help` prints: the usage, the keys specific to t (required first) with
// their default and the first sentence of their comment, and where every other key is
// listed (configs/base.yml, `bin/ctune-config base`).
int ct_config_write_help(FILE *f, ct_trainer_kind t);

// 1 when --help or -h is one of argv[1..argc-1], else 0.
int ct_config_help_asked(int argc, char **argv);

// For a main: --help or -h anywhere writes the help to stdout and returns 0; no
// arguments at all (argc < 2) writes it to stderr and returns 2; otherwise writes nothing
// and returns -1 (run). A result >= 0 is the exit status (1 if writing failed).
int ct_config_usage(ct_trainer_kind t, int argc, char **argv);

// Frees what c owns and zeroes it; calling it twice is safe.
void ct_config_free(ct_config *c);
