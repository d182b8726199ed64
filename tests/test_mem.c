// mem: the limits a memory plan is checked against (a cgroup's, from fake /proc and /sys
// trees of either cgroup version; the address-space limit), and the sizes that refused
// allocations name (read before the struct that held them was cleared: not "0.0 MB").
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kd.h"
#include "error.h"
#include "fs.h"
#include "head.h"
#include "lora.h"
#include "mem.h"
#include "model.h"
#include "scratch.h"
#include "test.h"


// scratch_dir/rel holds text (directories made as needed).
static void put(const char *rel, const char *text) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", scratch_dir, rel);
  char *slash = strrchr(p, '/');
  *slash = 0;
  CHECK_OK(ct_mkdirs(p));
  *slash = '/';
  FILE *f = fopen(p, "w");
  CHECK(f != NULL);
  if (f) fputs(text, f), fclose(f);
}

static void test_no_cgroup_files_mean_no_limit(void) {
  size_t room, limit;
  ct_mem_cgroup_room(scratch_dir, &room, &limit);  // (nothing written yet)
  CHECK(room == SIZE_MAX && limit == SIZE_MAX);
}

static void test_cgroup_v2_limit_less_usage_counting_file_cache_as_free(void) {
  put("proc/self/cgroup", "0::/job/step\n");
  put("sys/fs/cgroup/job/step/memory.max", "max\n");
  put("sys/fs/cgroup/job/step/memory.current", "100000000\n");
  // the parent's limit binds: 500 MB, of which 300 MB used, 50 MB of it inactive file cache
  put("sys/fs/cgroup/job/memory.max", "500000000\n");
  put("sys/fs/cgroup/job/memory.current", "300000000\n");
  put("sys/fs/cgroup/job/memory.stat", "anon 250000000\nfile 50000000\ninactive_file 50000000\n");
  size_t room, limit;
  ct_mem_cgroup_room(scratch_dir, &room, &limit);
  CHECK(limit == 500000000);
  CHECK(room == 250000000);
  // a tighter limit deeper down wins
  put("sys/fs/cgroup/job/step/memory.max", "120000000\n");
  ct_mem_cgroup_room(scratch_dir, &room, &limit);
  CHECK(limit == 120000000 && room == 20000000);
}

static void test_cgroup_v1_memory_controller_and_its_no_limit_number(void) {
  put("proc/self/cgroup", "12:pids:/x\n4:cpu,memory:/batch/42\n0::/\n");
  put("sys/fs/cgroup/memory/batch/42/memory.limit_in_bytes", "9223372036854771712\n");  // v1: none
  put("sys/fs/cgroup/memory/batch/memory.limit_in_bytes", "1073741824\n");
  put("sys/fs/cgroup/memory/batch/memory.usage_in_bytes", "73741824\n");
  put("sys/fs/cgroup/memory/batch/memory.stat", "cache 0\ninactive_file 1\ntotal_inactive_file 0\n");
  size_t room, limit;
  ct_mem_cgroup_room(scratch_dir, &room, &limit);
  CHECK(limit == 1073741824 && room == 1000000000);
  // inside a cgroup namespace the named path may not exist: the hierarchy's root is read
  put("proc/self/cgroup", "4:memory:/elsewhere/7\n");
  put("sys/fs/cgroup/memory/memory.limit_in_bytes", "2000000000\n");
  put("sys/fs/cgroup/memory/memory.usage_in_bytes", "2100000000\n");  // over: no room
  ct_mem_cgroup_room(scratch_dir, &room, &limit);
  CHECK(limit == 2000000000 && room == 0);
}

static bool under_a_checker(void);

static void test_address_space_reads(void) {
  if (under_a_checker()) return;  // (ASan maps terabytes of shadow: no limit fits)
  struct rlimit r;
  CHECK(getrlimit(RLIMIT_AS, &r) == 0);
  size_t used = ct_mem_as_used();
  CHECK(used > 1000000);  // libraries alone map megabytes
  r.rlim_cur = used + ((size_t)256 << 20);
  CHECK(setrlimit(RLIMIT_AS, &r) == 0);
  CHECK(ct_mem_as_limit() == used + ((size_t)256 << 20));
  r.rlim_cur = r.rlim_max;
  CHECK(setrlimit(RLIMIT_AS, &r) == 0);
}

// The MB figure in the current error message after `what` (-1 when absent).
static double mb_after(const char *what) {
  const char *p = strstr(ct_last_error(), what);
  return p ? atof(p + strlen(what)) : -1;
}

// Whether this process runs under ASan or valgrind, whose allocators abort (or account
// differently) when an address-space limit refuses memory: the limit tests cannot run there.
static bool under_a_checker(void) {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#endif
#endif
  const char *p = getenv("LD_PRELOAD");
  return p && strstr(p, "vgpreload");
}

// Allocations refused under an address-space limit name what they asked for.
static void test_refused_allocations_name_their_size(void) {
  if (under_a_checker()) {
    printf("  (skipped under ASan or valgrind: their allocators abort at the limit)\n");
    return;
  }
  struct rlimit r;
  CHECK(getrlimit(RLIMIT_AS, &r) == 0);
  rlim_t max = r.rlim_max;
  r.rlim_cur = ct_mem_as_used() + ((size_t)64 << 20);  // 64 MiB more than mapped now
  CHECK(setrlimit(RLIMIT_AS, &r) == 0);
  ct_model_config c = {.vocab_size = 32000, .hidden_size = 2048, .intermediate_size = 4096, .num_layers = 2,
                       .num_heads = 16, .num_kv_heads = 8, .head_dim = 128, .max_position_embeddings = 64,
                       .rope_theta = 10000, .rms_norm_eps = 1e-6f, .tie_word_embeddings = true,
                       .bos_token_id = -1, .eos_token_id = -1, .pad_token_id = -1};
  snprintf(c.model_type, sizeof c.model_type, "llama");
  ct_model m;
  CHECK(ct_model_layout(&m, &c) == 0);
  double want = m.n_floats * 4.0 / 1e6;
  CHECK(ct_model_alloc(&m, 64) == CT_ENOMEM);
  CHECK_NEAR(mb_after("cannot allocate "), want, 0.1);
  ct_head h;
  CHECK(ct_head_init(&h, 8192, 8192, 32000, 2048, 1) == CT_ENOMEM);
  CHECK_NEAR(mb_after("cannot allocate "), ct_head_bytes(8192, 8192, 32000, 2048, 1) / 1e6, 0.1);
  ct_kd k;
  CHECK(ct_kd_init(&k, 8192, 32000, 2048, 1) == CT_ENOMEM);
  CHECK_NEAR(mb_after("cannot allocate "), ct_kd_bytes(8192, 32000, 2048, 1) / 1e6, 0.1);
  ct_lora lo;
  ct_lora_config lc = {.r = 1024, .alpha = 16, .targets = (1u << CT_LORA_TARGETS) - 1};
  CHECK(ct_lora_init(&lo, &lc, &c) == CT_ENOMEM);
  CHECK(mb_after("cannot allocate ") > 50);
  r.rlim_cur = max;
  CHECK(setrlimit(RLIMIT_AS, &r) == 0);
}

int main(void) {
  if (scratch_make("/tmp/ct_test_mem_XXXXXX")) return 1;
  RUN(test_no_cgroup_files_mean_no_limit);
  RUN(test_cgroup_v2_limit_less_usage_counting_file_cache_as_free);
  RUN(test_cgroup_v1_memory_controller_and_its_no_limit_number);
  RUN(test_address_space_reads);
  RUN(test_refused_allocations_name_their_size);
  scratch_remove();
  return test_summary();
}
