// panel: a weight matrix W (N, K) = [out, in] repacked for the engine's batched products,
// and the register-blocked kernels that multiply by it.
//
// Layout: W's rows in panels of CT_PANEL = 32 output rows, each panel stored k-major, so
// one k step loads the 32 weights of a panel with two vector loads. Panel p holds rows
// [32p, 32p + w), w = min(32, N − 32p) (only the last panel is narrower): element (n, k)
// sits at 32pK + k·w + (n − 32p). bfloat16 panels pair consecutive k (the dot-product
// instruction's operand): element (n, k) at 32pK2·2 + ((k/2)·w + n − 32p)·2 + k%2, with
// K2 = ⌈K/2⌉ pairs (an odd K's last pair is padded with 0). Either way the panels take
// exactly N·K values (N·2K2 for bf16): W can be repacked in place.
//
// The kernels compute each output y[s, n] = Σ_k x[s, k]·W[n, k] as one chain of fused
// multiply-adds in k order starting from 0 (bf16: one dot-product step per k pair), in one
// vector lane. Which other tokens share the pass, how many there are, and which thread
// runs the panel change nothing: a token's result is bit-identical alone or in a batch.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#define CT_PANEL 32
#define CT_PANEL_MR 12  // tokens per register tile

// uint16 values of a bf16-packed (N, K) matrix: N · 2⌈K/2⌉.
long ct_panel16_size(int N, int K);

// P (N·K) = W (N, K) packed; P may not alias W (ct_panel_pack_inplace does that).
void ct_panel_pack(const float *W, int N, int K, float *P);
// Packs W (N, K) in place, through scratch (32·K floats: one panel).
void ct_panel_pack_inplace(float *W, int N, int K, float *scratch);
// P (ct_panel16_size) = W (N, K) rounded to bf16 (nearest, ties to even) and packed.
void ct_panel_pack16(const float *W, int N, int K, uint16_t *P);
// The same from a bf16 matrix (a model stored in bf16): no rounding.
void ct_panel_pack16_from16(const uint16_t *W, int N, int K, uint16_t *P);
// Both packing W (N, K) as the first K columns of an (N, K + ext) matrix whose last ext
// columns are 0 (P: ct_panel16_size(N, K + ext)): room for values written later
// (ct_panel16_at), such as the engine's LoRA adapters (linear.h).
void ct_panel_pack16_ext(const float *W, int N, int K, int ext, uint16_t *P);
void ct_panel_pack16_from16_ext(const uint16_t *W, int N, int K, int ext, uint16_t *P);
// The index in bf16 panels of an (N, K) matrix of its element (n, k).
long ct_panel16_at(int N, int K, int n, int k);

// int8 panels group four consecutive k (the u8 x s8 dot-product instruction's operand):
// element (n, k) at 32pK + ((k/4)·w + n − 32p)·4 + k%4, for K a multiple of 4 — the same
// bytes as the row-major matrix, so it packs in place (scratch: one panel, 32·K bytes).
void ct_panel8_pack_inplace(int8_t *W, int N, int K, int8_t *scratch);
void ct_panel8_row(const int8_t *P, int N, int K, int n, int8_t *out);
// int8 products: y[s, n] = sx[s] · scale[n] · (Σ_k xu[s, k]·W[n, k] − 128·rowsum[n]) with
// xu = x + 128 as unsigned bytes (the sampler's quantized activations, row stride ldx):
// exact integer sums (AVX-512 VNNI or plain C: the same), so equal to the row-major
// kernel's results bit for bit.
void ct_panel8_gemm(const int8_t *P, int N, int K, const uint8_t *xu, int ldx, const float *sx,
                    const float *scale, const int32_t *rowsum, int S, float *y, int ldy, int acc, int p0, int p1);

// Row n of a packed matrix as floats (the embedding lookup of a packed table).
void ct_panel_row(const float *P, int N, int K, int n, float *out);
void ct_panel16_row(const uint16_t *P, int N, int K, int n, float *out);

// y[s, 32p + j] for s < S and panels p in [p0, p1): x (S, K; row stride ldx) times the
// packed P's rows; acc != 0 adds the product to y instead of overwriting it. (Packs x
// through a buffer it allocates: the tests' entry; the engine packs x once per product.)
// CT_ENOMEM when that buffer cannot be had.
int ct_panel_gemm(const float *P, int N, int K, const float *x, int ldx, int S, float *y, int ldy,
                   int acc, int p0, int p1);
// x (S, K; row stride ldx) packed for the fp32 kernel: tiles of CT_PANEL_MR tokens, the tile
// of tokens [s, s + mr) (mr = min(CT_PANEL_MR, S − s)) at xp + s·K, k-major: x[s + m, k] at
// k·mr + m, so one k step of a register tile reads its mr values from one place. Packs
// the tiles of tokens [s0, s1) (s0 a multiple of CT_PANEL_MR) of xp (S·K floats).
void ct_panel_pack_x(const float *x, int ldx, int S, int K, int s0, int s1, float *xp);
// ct_panel_pack_x of h = swiglu(gu) (S, K) without storing h: h[s, k] = g / (1 + exp(−g)) · u,
// g = gu[s, k], u = gu[s, K + k] (gu row stride ldgu), ct_swiglu_forward's values bit for bit.
void ct_panel_pack_x_swiglu(const float *gu, int ldgu, int S, int K, int s0, int s1, float *xp);
// ct_panel_gemm from x packed by ct_panel_pack_x (the same bits).
void ct_panel_gemm_px(const float *P, int N, int K, const float *xp, int S, float *y, int ldy, int acc, int p0,
                      int p1);
// The same with bf16 panels and x16 (S, 2K2; row stride ldx16) = x rounded to bf16, padded
// with a 0 column when K is odd; products summed in fp32.
void ct_panel16_gemm(const uint16_t *P, int N, int K, const uint16_t *x16, int ldx16, int S, float *y,
                     int ldy, int acc, int p0, int p1);

// True when the bf16 kernel runs on the CPU's dot-product instruction (AVX512_BF16)
// rather than its plain C emulation.
bool ct_panel16_native(void);
