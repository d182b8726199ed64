// die: an executable's fatal error (die.h). The library's part, stopping the other ranks,
// is ct_dist_abort; this prints, finalizes and exits.
#include "die.h"

#include <stdio.h>
#include <stdlib.h>

#include "dist.h"
#include "error.h"

static const char *prog_ = "ctune";

void ct_die_name(const char *prog) { prog_ = prog; }

void ct_die(int code, const char *what) {
  fprintf(stderr, "%s: %s%s%s\n", prog_, what ? what : "", what ? ": " : "", ct_last_error());
  ct_dist_abort(code);
  ct_dist_finalize();
  exit(code);
}
