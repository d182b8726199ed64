// mem: the library's memory helpers. Big buffers (parameters, gradients, optimizer
// moments, activations, logits, KV caches) come from ct_big_alloc: mapped directly
// (zeroed by the kernel, so never memset), 2 MiB aligned and advised for transparent
// huge pages — on these VMs a first touch of 4 KiB pages costs ~3.3 s per GiB, of huge
// pages ~0.1 s. Debian runs THP in `madvise` mode, so the advice is what turns them on.
#pragma once
#include <stddef.h>
#include <stdlib.h>

// Zeroed, 64-byte (in practice 2 MiB) aligned memory of `bytes`; NULL on failure.
// Free with ct_big_free (NULL is allowed).
void *ct_big_alloc(size_t bytes);
void ct_big_free(void *p);
// Bytes mapped by ct_big_alloc and not yet freed, and the most ever mapped at once.
size_t ct_big_bytes(void);
size_t ct_big_peak(void);

// This process's resident memory now (bytes), and the machine's MemAvailable (bytes;
// 0 when /proc/meminfo cannot be read).
size_t ct_rss_now(void);
size_t ct_mem_available(void);  // (CT_MEM_AVAILABLE_MB overrides it: tests)

// The other bounds on this process's memory. The address-space limit (RLIMIT_AS, `ulimit
// -v`; SIZE_MAX when none) and the address space mapped now (VmSize: libraries, thread
// stacks and reserved arenas count, resident or not).
size_t ct_mem_as_limit(void);
size_t ct_mem_as_used(void);
// A cgroup memory limit (v2 memory.max, v1 memory.limit_in_bytes) of this process's cgroup
// or an ancestor: *room the bytes the tightest one still allows (its limit less its usage,
// reclaimable file cache not counted as used), *limit that limit; both SIZE_MAX when none.
// Files are read under fsroot ("" for the machine's /proc and /sys; tests give a tree).
void ct_mem_cgroup_room(const char *fsroot, size_t *room, size_t *limit);

// free() of every pointer given: ct_free_all(a->x, a->y, a->z).
static inline void ct_free_each(void *const *p, size_t n) {
  for (size_t i = 0; i < n; i++) free(p[i]);
}
#define ct_free_all(...) \
  ct_free_each((void *const[]){__VA_ARGS__}, sizeof((void *const[]){__VA_ARGS__}) / sizeof(void *))
