// mem: ct_big_alloc over anonymous mmap with a small header in front of the aligned
// block (the mapping's start and length), THP advice, and byte counters; /proc readings
// of resident and available memory. No pooling: big buffers live for a whole run.
#include "mem.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
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
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  size_t kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb * 1024;
}
