// amx: bf16 products on AMX tiles over the engine's bf16 panels (see amx.h).
#include "amx.h"

#include <stdlib.h>
#include <string.h>

#include "panel.h"

// Compiled into any AVX-512 build by GCC 11 or later (the code's own functions get the AMX
// target; nothing else in the build does), and used only where the CPU has AMX
// (ct_amx_ready): a portable x86-64-v4 binary gets the tiles on Sapphire Rapids and runs
// the panels on Zen 4. Clang gets AMX only from -march (-mamx-tile -mamx-bf16).
#if defined(__x86_64__) && defined(__AVX512F__) && !defined(__AMX_TILE__) && defined(__GNUC__) && \
    !defined(__clang__) && __GNUC__ >= 11
#pragma GCC target("amx-tile,amx-bf16")
#define CT_AMX_BUILT 1
#elif defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define CT_AMX_BUILT 1
#endif

#if defined(CT_AMX_BUILT)
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

// Linux hands out the 8 KB tile state only to a process that asks for it (arch_prctl).
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static bool ready;
static pthread_once_t ready_once = PTHREAD_ONCE_INIT;

static void decide(void) {
  const char *env = getenv("CT_AMX");
  if (env && strcmp(env, "0") == 0) return;
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
  if (!(d & (1u << 24)) || !(d & (1u << 22))) return;  // AMX-TILE, AMX-BF16
  ready = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

bool ct_amx_ready(void) {
  pthread_once(&ready_once, decide);
  return ready;
}

// Every tile 16 rows × 64 bytes: C tiles 16 × 16 fp32, A tiles 16 tokens × 16 k pairs,
// B tiles 16 k pairs × 16 columns (each a pair).
typedef struct __attribute__((aligned(64))) {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

static void configure(void) {
  tile_config c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 8; t++) c.colsb[t] = 64, c.rows[t] = 16;
  _tile_loadconfig(&c);
}

// out (rows, 32) += or = c (16·blocks, 32), the first `rows` rows.
static void put(const float *c, int rows, float *y, int ldy, int acc) {
  for (int r = 0; r < rows; r++) {
    float *yr = y + (long)r * ldy;
    const float *cr = c + r * 32;
    if (acc)
      for (int j = 0; j < 32; j++) yr[j] += cr[j];
    else
      memcpy(yr, cr, 32 * sizeof(float));
  }
}

// With more than one block of tokens, the next panel's lines are fetched into L2 while
// this one computes: per_step lines from *next on every k step (the weights stream from
// memory once per decode step; without it the first token block of each panel stalls on
// them: the 0.5B model's LM head at 128 tokens ran ~15% slower).
typedef struct {
  const char *next, *end;
  int per_step;
} prefetch;

static inline __attribute__((always_inline)) void fetch_step(prefetch *f) {
  for (int i = 0; i < f->per_step && f->next < f->end; i++, f->next += 64) _mm_prefetch(f->next, _MM_HINT_T1);
}

// One panel (Pp: K/2 pair rows of 128 bytes) × tokens [0, 32) of x (ldx bytes apart), or
// [0, 16) when !two: C tiles 0–3 = tokens 0–15 / 16–31 × columns 0–15 / 16–31. (Inlined
// with `two` a constant: the two shapes compile to their own loops.)
static inline __attribute__((always_inline)) void block(const uint16_t *Pp, int K2, const uint16_t *x, long ldx,
                                                        float *c, prefetch *f, const bool two) {
  _tile_zero(0);
  _tile_zero(1);
  if (two) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const char *xa = (const char *)x, *xb = xa + 16 * ldx;
  for (int k = 0; k < K2; k += 16) {
    const uint16_t *b = Pp + (long)k * 64;
    _tile_loadd(4, xa + 4L * k, ldx);
    _tile_loadd(6, b, 128);
    _tile_loadd(7, b + 32, 128);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (two) {
      _tile_loadd(5, xb + 4L * k, ldx);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    fetch_step(f);
  }
  _tile_stored(0, c, 128);
  _tile_stored(1, c + 16, 128);
  if (two) {
    _tile_stored(2, c + 16 * 32, 128);
    _tile_stored(3, c + 16 * 32 + 16, 128);
  }
}

void ct_amx_gemm16(const uint16_t *Pk, int N, int K, const uint16_t *x16, int ldx16, int S, float *y, int ldy,
                   int acc, int p0, int p1) {
  if (p1 > N / CT_PANEL) p1 = N / CT_PANEL;  // full panels only
  if (p0 >= p1 || S <= 0) return;
  float c[32 * 32] __attribute__((aligned(64)));
  const long ldx = 2L * ldx16;
  const int K2 = K / 2;
  const long panel_bytes = 64L * K;                   // 32 rows × K bf16
  const int steps = (S + 31) / 32 * (K2 / 16);       // k steps per panel
  const int per_step = (int)((panel_bytes / 64 + steps - 1) / steps);
  configure();
  for (int p = p0; p < p1; p++) {
    const uint16_t *Pp = Pk + (long)p * CT_PANEL * K;
    // (one token block streams the panel once: the hardware's prefetcher keeps up then)
    const char *nx = p + 1 < p1 && S > 32 ? (const char *)(Pp + CT_PANEL * (long)K) : NULL;
    prefetch f = {nx, nx ? nx + panel_bytes : NULL, per_step};
    for (int s = 0; s < S; s += 32) {
      const uint16_t *xs = x16 + (long)s * ldx16;
      int rows = S - s < 32 ? S - s : 32;
      if (rows > 16) block(Pp, K2, xs, ldx, c, &f, true);
      else block(Pp, K2, xs, ldx, c, &f, false);
      put(c, rows, y + (long)s * ldy + (long)p * CT_PANEL, ldy, acc);
    }
  }
  _tile_release();
}

#else
bool ct_amx_ready(void) { return false; }
void ct_amx_gemm16(const uint16_t *Pk, int N, int K, const uint16_t *x16, int ldx16, int S, float *y, int ldy,
                   int acc, int p0, int p1) {
  (void)Pk, (void)N, (void)K, (void)x16, (void)ldx16, (void)S, (void)y, (void)ldy, (void)acc, (void)p0, (void)p1;
}  // never called: ct_amx_ready() is false
#endif

bool ct_amx_fits(int K) { return K > 0 && K % 32 == 0; }
