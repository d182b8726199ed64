// run: a trainer's run from its command line to its exit code (the loop between is the
// trainer's). These exit on failure, so they live with the executables, not in the library.
#pragma once
#include <stdbool.h>

#include "train.h"

// A trainer's start, all of it: OpenBLAS and MPI set-up, the config from the command line
// (bin/<trainer> [file.yml] key=value ...) with its required keys, the trainer's own
// checks of the config (`check`, may be NULL: it runs before anything is loaded, so a bad
// value costs no time), then ct_train_setup, and a line naming the model. Any failure
// prints one line "<trainer>: <message>" and exits: 2 for a configuration error, else 1.
// It names the trainer for ct_die (die.h) first.
void ct_train_start(ct_train *tr, ct_config *cfg, ct_trainer_kind kind, int argc, char **argv,
                    int (*check)(const ct_config *cfg));
// A trainer's end. After a stop (ct_train_after_step said so; its checkpoint is saved)
// it only releases what it holds and returns 128 + the signal (130 SIGINT, 143 SIGTERM).
// Otherwise it saves the final model (exiting 1 if that fails), prints the last line,
// releases the train state, the config, the thread pool and MPI, and returns 0. The
// trainer frees its own buffers first.
int ct_train_finish(ct_train *tr, bool stop);
// What ct_train_finish releases, without saving: for a command that writes something
// else than a model (bin/distill precompute).
void ct_train_release(ct_train *tr);
// A trainer's fatal error: "<trainer>: [what: ]<ct_last_error()>", every rank stopped,
// exit code 2 when rc is CT_ECONFIG, else 1.
__attribute__((noreturn)) void ct_train_die(const ct_train *tr, int rc, const char *what);
