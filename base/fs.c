// fs: files and paths every layer needs — whole-file reads, path joins that never cut
// a path short, mkdir -p, recursive removal, fsync and atomic publication of a file —
// and the monotonic clock. Nothing here knows about models or runs.
#include "fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "hash.h"

double ct_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

int ct_read_file(const char *path, char **out, size_t *len, bool *missing) {
  *out = NULL;
  *len = 0;
  if (missing) *missing = false;
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (missing && errno == ENOENT) {
      *missing = true;
      return 0;
    }
    return ct_set_error(CT_EIO, "%s: cannot open: %s", path, strerror(errno));
  }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (n + 1 < cap) break;
    char *b = realloc(buf, cap * 2);
    if (!b) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = b;
    cap *= 2;
  }
  bool err = ferror(f);
  fclose(f);
  if (!buf) return ct_set_error(CT_ENOMEM, "%s: out of memory", path);
  if (err) {
    free(buf);
    return ct_set_error(CT_EIO, "%s: read error", path);
  }
  buf[n] = 0;
  *out = buf;
  *len = n;
  return 0;
}

int ct_path_join(char *out, size_t size, const char *dir, const char *name) {
  int n = snprintf(out, size, "%s/%s", dir, name);
  if (n < 0 || (size_t)n >= size) return ct_set_error(CT_EINVAL, "path too long: %s/%s", dir, name);
  return 0;
}

bool ct_path_has_file(const char *dir, const char *name) {
  char p[CT_PATH_MAX];
  return ct_path_join(p, sizeof p, dir, name) == 0 && access(p, R_OK) == 0;
}

static int mkdir_one(const char *p) {
  struct stat st;
  if (mkdir(p, 0755) == 0) return 0;
  if (errno == EEXIST && stat(p, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
  return ct_set_error(CT_EIO, "%s: cannot create a directory: %s", p,
                      errno == EEXIST ? "a file is in the way" : strerror(errno));
}

int ct_mkdirs(const char *path) {
  char p[CT_PATH_MAX];
  if (strlen(path) >= sizeof p) return ct_set_error(CT_EINVAL, "path too long: %s", path);
  strcpy(p, path);
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = 0;
      int rc = mkdir_one(p);
      if (rc) return rc;
      *s = '/';
    }
  return mkdir_one(p);
}

int ct_remove_tree(const char *path) {
  DIR *d = opendir(path);
  if (!d) {
    if (errno == ENOENT) return 0;
    if (unlink(path) == 0) return 0;
    return ct_set_error(CT_EIO, "%s: cannot remove: %s", path, strerror(errno));
  }
  struct dirent *e;
  int rc = 0;
  char child[CT_PATH_MAX];
  while ((e = readdir(d)) && !rc) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if ((rc = ct_path_join(child, sizeof child, path, e->d_name))) break;  // never a cut path
    struct stat s;
    if (lstat(child, &s) == 0 && S_ISDIR(s.st_mode))
      rc = ct_remove_tree(child);
    else if (unlink(child))
      rc = ct_set_error(CT_EIO, "%s: cannot remove: %s", child, strerror(errno));
  }
  closedir(d);
  if (!rc && rmdir(path)) rc = ct_set_error(CT_EIO, "%s: cannot remove: %s", path, strerror(errno));
  return rc;
}

int ct_fsync_path(const char *path, bool dir) {
  int fd = open(path, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return ct_set_error(CT_EIO, "%s: cannot open: %s", path, strerror(errno));
  int rc = fsync(fd);
  close(fd);
  return rc ? ct_set_error(CT_EIO, "%s: fsync failed: %s", path, strerror(errno)) : 0;
}

int ct_publish_file(const char *tmp_path, const char *dir, const char *name) {
  char final[CT_PATH_MAX];
  int rc = ct_path_join(final, sizeof final, dir, name);
  if (!rc) rc = ct_fsync_path(tmp_path, false);
  if (rc) return rc;
  if (rename(tmp_path, final)) return ct_set_error(CT_EIO, "%s: cannot rename to %s: %s", tmp_path, final, strerror(errno));
  return ct_fsync_path(dir, true);
}

int ct_disk_room(const char *dir, double bytes, const char *what) {
  struct statvfs v;
  const char *fake = getenv("CT_DISK_FREE_MB");
  double free_b;
  if (fake && *fake) free_b = atof(fake) * 1e6;
  else if (statvfs(dir, &v) == 0) free_b = (double)v.f_bavail * (double)v.f_frsize;
  else return 0;  // (nothing to tell: the writes report what goes wrong)
  if (bytes <= free_b) return 0;
  double f = free_b / 1e6, b = bytes / 1e6;  // (one decimal below 10 MB: "0 MB" would say nothing)
  return ct_set_error(CT_EIO, "%s: %s (%.*f MB free, %s needs %.*f MB)", dir, strerror(ENOSPC), f < 10 ? 1 : 0, f,
                      what, b < 10 ? 1 : 0, b);
}

int ct_file_checksum(const char *path, uint64_t *hash, long *size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ct_set_error(CT_EIO, "%s: cannot open: %s", path, strerror(errno));
  const size_t BLOCK = CT_XXH_BLOCK;  // (the blocks of ct_xxh64_blocks)
  unsigned char *b = malloc(BLOCK);
  if (!b) {
    close(fd);
    return ct_set_error(CT_ENOMEM, "out of memory");
  }
  uint64_t h = 0;
  long total = 0;
  int rc = 0;
  for (;;) {
    size_t got = 0;  // a whole block (short reads refilled), so blocks do not depend on read()
    while (got < BLOCK) {
      ssize_t n = read(fd, b + got, BLOCK - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) rc = ct_set_error(CT_EIO, "%s: cannot read: %s", path, strerror(errno));
      if (n <= 0) break;
      got += (size_t)n;
    }
    if (rc || !got) break;
    h = ct_xxh64(b, got, h);
    total += (long)got;
    if (got < BLOCK) break;
  }
  free(b);
  close(fd);
  *hash = h;
  *size = total;
  return rc;
}
