// die: an executable's fatal error, the one place besides a signal's stop where ctune
// exits. The library returns its errors (ct_set_error); an executable that cannot go on
// prints them here, as "<prog>: [what: ]<ct_last_error()>", and stops every rank.
#pragma once

// The name a fatal error starts with ("sft", "sampler"): set once, before the first
// ct_die (ct_train_start sets the trainer's). "ctune" until then.
void ct_die_name(const char *prog);
// Prints "<prog>: what: <ct_last_error()>" (what may be NULL: "<prog>: <ct_last_error()>"),
// stops every other rank (MPI_Abort, when there are any), finalizes MPI and exits with
// `code`: 2 for a bad configuration or command line, 1 for anything else.
__attribute__((noreturn)) void ct_die(int code, const char *what);
