// amx: the engine's bf16 products on Intel AMX tiles, reading the bf16 panels (panel.h)
// as they are packed: a full panel's k pairs [16i, 16i + 16) are two B tiles (its columns
// 0–15 and 16–31, rows 128 bytes apart), so no second copy of the weights is made.
//
// A block of 16 tokens is one A tile (16 rows × 16 k pairs); each output y[s, n] is one
// chain of tile dot products over k in order from 0, every row of a tile computed alike.
// Which tokens share the pass, how many there are, and which thread runs the panel
// change nothing: a token's result is bit-identical alone or in a batch of 128, as with
// the panels' AVX-512 kernel. The two kernels round differently (bf16 rounding of the
// products' sums, not of the inputs: both read the same bf16 values), so the engine picks
// one per machine (ct_amx_ready), never per batch.
#pragma once
#include <stdbool.h>
#include <stdint.h>

// True when AMX-BF16 is compiled in (any AVX-512 build by GCC 11+), the CPU has it, the
// kernel granted this process the tile state, and CT_AMX is not "0" (the tests' and
// benchmarks' switch back to the panels). Decided once per process.
bool ct_amx_ready(void);

// True when W (N, K) can go through AMX: K a multiple of 32. Only full panels (32 rows)
// do; the narrow last panel of N % 32 rows stays on the panel kernel.
bool ct_amx_fits(int K);

// y[s, 32p + j] for s < S and full panels p in [p0, p1): x16 (S, ldx16 ≥ K bf16; row
// stride ldx16) times the bf16 panels P of W (N, K); acc != 0 adds to y. Reads x16's rows
// up to the next multiple of 16 past S: they must exist (any values; their outputs are
// dropped). Only when ct_amx_ready() and ct_amx_fits(K).
void ct_amx_gemm16(const uint16_t *P, int N, int K, const uint16_t *x16, int ldx16, int S, float *y, int ldy,
                   int acc, int p0, int p1);
