// mem: ct_big_alloc over anonymous mmap with a small header in front of the aligned
// block (the mapping's start and length), THP advice, and byte counters; /proc readings
// of resident and available memory. No pooling: big buffers live for a whole run.
#include "mem.h"

#include <stdbool.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define HUGE_PAGE ((size_t)2 << 20)

typedef struct {
  void *base;
  size_t len;   // of the whole mapping
  size_t bytes; // asked for
} big_header;

static size_t big_now, big_max;  // atomics would be needed for threads; allocation is serial

void *ct_big_alloc(size_t bytes) {
  if (bytes == 0) bytes = 1;
  size_t len = bytes + HUGE_PAGE + sizeof(big_header);
  void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return NULL;
  uintptr_t p = ((uintptr_t)base + sizeof(big_header) + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
  big_header *h = (big_header *)p - 1;
  *h = (big_header){base, len, bytes};
  if (bytes >= HUGE_PAGE) madvise((void *)p, bytes, MADV_HUGEPAGE);  // advice: failure is harmless
  big_now += bytes;
  if (big_now > big_max) big_max = big_now;
  return (void *)p;
}

void ct_big_free(void *p) {
  if (!p) return;
  big_header *h = (big_header *)p - 1;
  big_now -= h->bytes;
  munmap(h->base, h->len);
}

size_t ct_big_bytes(void) { return big_now; }
size_t ct_big_peak(void) { return big_max; }

size_t ct_rss_now(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long size = 0, rss = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &size, &rss) != 2) rss = 0;
    fclose(f);
  }
  return (size_t)rss * (size_t)sysconf(_SC_PAGESIZE);
}

size_t ct_mem_available(void) {
  const char *fake = getenv("CT_MEM_AVAILABLE_MB");  // (tests: a machine of that much free memory)
  if (fake && *fake) return (size_t)(atof(fake) * 1048576.0);
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  size_t kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb * 1024;
}

size_t ct_mem_as_limit(void) {
  struct rlimit r;
  if (getrlimit(RLIMIT_AS, &r) || r.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  return (size_t)r.rlim_cur;
}

size_t ct_mem_as_used(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long size = 0;
  if (f) {
    if (fscanf(f, "%ld", &size) != 1) size = 0;
    fclose(f);
  }
  return (size_t)size * (size_t)sysconf(_SC_PAGESIZE);
}

// The number in a cgroup file (dir/name); SIZE_MAX for "max", a missing file or v1's
// "no limit" (a huge page-rounded number).
static size_t cg_number(const char *dir, const char *name) {
  char p[8500], buf[64] = "";
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "r");
  if (!f) return SIZE_MAX;
  if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
  fclose(f);
  char *end;
  unsigned long long v = strtoull(buf, &end, 10);
  return end == buf || v >= (1ULL << 62) ? SIZE_MAX : (size_t)v;
}

// The value of `key` in dir/memory.stat (0 when absent).
static size_t cg_stat(const char *dir, const char *key) {
  char p[8500], line[256];
  snprintf(p, sizeof p, "%s/memory.stat", dir);
  FILE *f = fopen(p, "r");
  size_t n = strlen(key), v = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, key, n) && line[n] == ' ') {
      v = (size_t)strtoull(line + n + 1, NULL, 10);
      break;
    }
  if (f) fclose(f);
  return v;
}

void ct_mem_cgroup_room(const char *fsroot, size_t *room, size_t *limit) {
  *room = *limit = SIZE_MAX;
  char p[4200], line[4200], path[4096] = "", base[4200];
  snprintf(p, sizeof p, "%s/proc/self/cgroup", fsroot);
  FILE *f = fopen(p, "r");
  bool v1 = false;
  // "0::/path" (v2), or "N:memory:/path" or "N:cpu,memory:/path" (v1, preferred: a v1
  // memory controller means v2's has none)
  while (f && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = 0;
    const char *ctl = c1 + 1;
    bool mem = false;
    for (const char *t = ctl; (t = strstr(t, "memory")); t += 6)
      mem |= (t == ctl || t[-1] == ',') && (t[6] == 0 || t[6] == ',');
    if (mem) v1 = true;
    if (mem || (!v1 && !*ctl)) snprintf(path, sizeof path, "%s", c2 + 1);
  }
  if (f) fclose(f);
  snprintf(base, sizeof base, "%s/sys/fs/cgroup%s", fsroot, v1 ? "/memory" : "");
  const char *lim = v1 ? "memory.limit_in_bytes" : "memory.max";
  const char *use = v1 ? "memory.usage_in_bytes" : "memory.current";
  const char *cache = v1 ? "total_inactive_file" : "inactive_file";
  // this cgroup and its ancestors up to the hierarchy's root (inside a cgroup namespace
  // the path may not exist under base: its ancestors, and base itself, are still read)
  for (;;) {
    char dir[8400];
    snprintf(dir, sizeof dir, "%s%s", base, path);
    size_t l = cg_number(dir, lim);
    if (l != SIZE_MAX) {
      size_t used = cg_number(dir, use), reclaim = cg_stat(dir, cache);
      used = used == SIZE_MAX ? 0 : used > reclaim ? used - reclaim : 0;
      size_t r = l > used ? l - used : 0;
      if (r < *room) *room = r, *limit = l;
    }
    char *slash = strrchr(path, '/');
    if (!slash || !path[0]) break;
    *slash = 0;  // "/a/b" -> "/a" -> "" (base itself)
  }
}
