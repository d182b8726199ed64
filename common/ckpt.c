// ckpt: checkpoint directories written aside (.tmp-checkpoint-N), fsync'd and renamed into
// place, found again (latest complete one) and rotated. What goes into them is train.c's.
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

// ---------------------------------------------------------------------------
// Checkpoint directories

// Calls fn(dir/<name>, count) for each entry of dir that `keep` accepts, in readdir's order,
// stopping at the first error; `verb` says what failed when dir cannot be opened.
static int each_entry(const char *dir, const char *verb, bool (*keep)(const char *name),
                      int (*fn)(const char *path, int *count), int *count) {
  DIR *d = opendir(dir);
  if (!d) return ct_set_error(CT_EIO, "%s: %s: %s", dir, verb, strerror(errno));
  struct dirent *e;
  char p[CT_PATH_MAX];
  int rc = 0;
  while ((e = readdir(d)) && !rc) {
    if (!keep(e->d_name)) continue;
    rc = ct_path_join(p, sizeof p, dir, e->d_name);
    if (!rc) rc = fn(p, count);
  }
  closedir(d);
  return rc;
}

static bool not_dots(const char *name) { return strcmp(name, ".") != 0 && strcmp(name, "..") != 0; }

static int fsync_file(const char *path, int *count) {
  (void)count;
  return ct_fsync_path(path, false);
}

int ct_ckpt_begin(const char *output_dir, long step, char *tmp, size_t tmp_size) {
  char name[64];
  snprintf(name, sizeof name, ".tmp-checkpoint-%ld", step);
  int rc = ct_path_join(tmp, tmp_size, output_dir, name);  // never remove a cut-short path
  if (rc) return rc;
  rc = ct_remove_tree(tmp);
  if (!rc) rc = ct_mkdirs(tmp);
  return rc;
}

int ct_ckpt_commit(const char *output_dir, long step, const char *tmp) {
  int rc = each_entry(tmp, "cannot open", not_dots, fsync_file, NULL);
  if (rc || (rc = ct_fsync_path(tmp, true))) return rc;
  char final[CT_PATH_MAX], name[64];
  snprintf(name, sizeof name, "checkpoint-%ld", step);
  if ((rc = ct_path_join(final, sizeof final, output_dir, name))) return rc;
  struct stat st;
  if (stat(final, &st) == 0) {
    // Replacing a checkpoint of the same step: swap the two in one atomic step, so that
    // a crash leaves one or the other in place, then remove the old one (now at tmp).
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE))
      return ct_set_error(CT_EIO, "%s: cannot swap with %s: %s", tmp, final, strerror(errno));
    if ((rc = ct_fsync_path(output_dir, true))) return rc;
    return ct_remove_tree(tmp);
  }
  if (rename(tmp, final)) return ct_set_error(CT_EIO, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
  return ct_fsync_path(output_dir, true);
}

// The step of a directory named exactly "checkpoint-<step>" as ctune writes it (no sign,
// no leading zeros, no overflow), else -1: the name can be rebuilt from the step.
static long checkpoint_step(const char *name) {
  if (strncmp(name, "checkpoint-", 11) != 0) return -1;
  const char *d = name + 11;
  if (!*d || strlen(d) > 18 || (d[0] == '0' && d[1])) return -1;
  long s = 0;
  for (; *d; d++) {
    if (*d < '0' || *d > '9') return -1;
    s = s * 10 + (*d - '0');
  }
  return s;
}

int ct_ckpt_latest(const char *output_dir, char *path, size_t path_size, long *step) {
  DIR *d = opendir(output_dir);
  if (!d) return ct_set_error(CT_EIO, "%s: no checkpoint to resume from (%s)", output_dir, strerror(errno));
  long best = -1;
  struct dirent *e;
  char dirp[CT_PATH_MAX], p[CT_PATH_MAX];
  while ((e = readdir(d))) {
    long s = checkpoint_step(e->d_name);
    if (s <= best) continue;
    if (!ct_path_join(dirp, sizeof dirp, output_dir, e->d_name) &&
        !ct_path_join(p, sizeof p, dirp, "trainer_state.json") && access(p, R_OK) == 0)
      best = s;
  }
  closedir(d);
  if (best < 0) return ct_set_error(CT_EIO, "%s: no checkpoint-* directory to resume from", output_dir);
  char name[64];
  snprintf(name, sizeof name, "checkpoint-%ld", best);
  int rc = ct_path_join(path, path_size, output_dir, name);
  if (rc) return rc;
  *step = best;
  return 0;
}

// Removes output_dir/name by renaming it to .tmp-delete-<name> first (atomic), so that a
// kill during the removal leaves a .tmp-* leftover (cleaned at the next start), never a
// partial checkpoint-N that looks complete.
static int remove_aside(const char *output_dir, const char *name) {
  char p[CT_PATH_MAX], aside[CT_PATH_MAX], tmp_name[96];
  snprintf(tmp_name, sizeof tmp_name, ".tmp-delete-%s", name);
  int rc = ct_path_join(p, sizeof p, output_dir, name);
  if (!rc) rc = ct_path_join(aside, sizeof aside, output_dir, tmp_name);
  if (!rc) rc = ct_remove_tree(aside);
  if (rc) return rc;
  if (rename(p, aside)) return ct_set_error(CT_EIO, "%s: cannot rename to %s: %s", p, aside, strerror(errno));
  if ((rc = ct_fsync_path(output_dir, true))) return rc;
  return ct_remove_tree(aside);
}

// What a run killed while writing leaves behind: a checkpoint or final model written aside,
// or one being removed.
static bool is_leftover(const char *n) {
  return !strncmp(n, ".tmp-checkpoint-", 16) || !strcmp(n, ".tmp-final") || !strncmp(n, ".tmp-delete-", 12);
}

static int remove_counted(const char *path, int *removed) {
  int rc = ct_remove_tree(path);
  if (!rc) ++*removed;
  return rc;
}

int ct_ckpt_clean(const char *output_dir, int *removed) {
  *removed = 0;
  return each_entry(output_dir, "cannot list", is_leftover, remove_counted, removed);
}

int ct_ckpt_lock(const char *output_dir, int *fd_out) {
  char p[CT_PATH_MAX];
  int rc = ct_path_join(p, sizeof p, output_dir, ".lock");
  if (rc) return rc;
  int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ct_set_error(CT_EIO, "%s: cannot open: %s", p, strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB)) {
    int e = errno;
    char pid[32] = "";
    ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
    pid[n > 0 ? n : 0] = 0;
    pid[strcspn(pid, "\n")] = 0;
    close(fd);
    if (e == EWOULDBLOCK)
      return ct_set_error(CT_EIO, "output_dir %s is in use by another run (pid %s, holding %s); "
                          "give each run its own output_dir", output_dir, pid[0] ? pid : "unknown", p);
    return ct_set_error(CT_EIO, "%s: cannot lock: %s", p, strerror(e));
  }
  char pid[32];
  int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) || pwrite(fd, pid, (size_t)n, 0) != n) {
    rc = ct_set_error(CT_EIO, "%s: cannot write: %s", p, strerror(errno));
    close(fd);
    return rc;
  }
  *fd_out = fd;
  return 0;
}

static int cmp_long(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return (x > y) - (x < y);
}

int ct_ckpt_rotate(const char *output_dir, int keep) {
  if (keep <= 0) return 0;
  DIR *d = opendir(output_dir);
  if (!d) return ct_set_error(CT_EIO, "%s: cannot list: %s", output_dir, strerror(errno));
  long *steps = NULL;
  int n = 0, cap = 0, rc = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    long s = checkpoint_step(e->d_name);
    if (s < 0) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      long *g = realloc(steps, sizeof(long) * cap);
      if (!g) {
        rc = ct_set_error(CT_ENOMEM, "out of memory");
        break;
      }
      steps = g;
    }
    steps[n++] = s;
  }
  closedir(d);
  if (!rc) {
    qsort(steps, n, sizeof(long), cmp_long);
    for (int i = 0; i + keep < n && !rc; i++) {
      char name[64];
      snprintf(name, sizeof name, "checkpoint-%ld", steps[i]);
      rc = remove_aside(output_dir, name);
    }
  }
  free(steps);
  return rc;
}
