// head: the LM head and everything computed from its logits — per-token log-probs,
// cross-entropy, z-loss, entropy, accuracy, logit sums — with vocabulary tiling: the V logits of a
// token are produced in `ntiles` chunks and reduced online (running max / sum), so peak
// memory holds rows x V/ntiles logits instead of rows x V. Only tokens that have a
// target take part: their hidden rows are gathered first, so masked prompt tokens cost
// nothing in the head.
//
// Usage: ct_head_gather (pick rows) -> ct_head_forward (lse, log-probs, stats) -> set
// coef/zcoef per row -> ct_head_backward (dW, d_hidden).
#pragma once
#include <stdint.h>

typedef struct {
  int cap, V, C, ntiles, tile;  // tile = V columns per chunk (last may be shorter)
  long logit_cap;                // floats of the logits buffer: logit_rows x tile
  int ftile;                     // the chunk width the last forward used (<= tile: narrower
                                 // when more rows than logit_rows were gathered)
  float inv_temp;                // logits are divided by the sampling temperature (GRPO): 1/T
  int n;                         // rows gathered for the current batch
  int *rows;                     // (cap) token index in the batch of each gathered row
  int *target;                   // (cap) target token id
  float *hc;                     // (cap, C) gathered hidden rows
  float *dhc;                    // (cap, C) their gradient
  float *logits;                 // (logit_cap) one chunk of logits (all V when ntiles == 1)
  // per gathered row, filled by ct_head_forward
  float *lse;      // log Σ exp(logits)
  float *logp;     // log-prob of the target
  float *entropy;  // entropy of the predicted distribution (nats)
  int *argmax;     // most likely token
  double *logit_sum;  // Σ over the V logits (DPO's logits/chosen: their mean is this / V)
  float *run_sum, *run_xsum;  // online accumulators (Σ e^(l-m), Σ e^(l-m)·l)
  // per gathered row, set by the caller before ct_head_backward:
  // dlogits = coef·(softmax − onehot(target)) + zcoef·softmax
  float *coef, *zcoef;
  // bf16 (ct_head_forward_bf16): the products take hc and the weights rounded to bf16 and
  // sum in fp32; the backward reuses the bf16 weights when called with the same W
  uint16_t *hc16;          // (cap, C) the gathered rows in bf16
  const float *w16_of;     // the W of the last forward when it ran in bf16, else NULL
  const uint16_t *w16;     // its bf16 copy (V, C)
  long bytes;  // bytes allocated (the logits chunk dominates)
} ct_head;

// A head for forwards of up to cap_rows gathered rows, in chunks of V / ntiles columns
// for up to logit_rows rows (the rows a training backward covers); a forward over more
// rows (evaluation) uses proportionally narrower chunks, so the logits buffer never
// grows past logit_rows x V / ntiles floats. Results do not depend on the chunking.
int ct_head_init(ct_head *h, int cap_rows, int logit_rows, int V, int C, int ntiles);
// The bytes ct_head_init allocates.
double ct_head_bytes(int cap_rows, int logit_rows, int V, int C, int ntiles);
void ct_head_free(ct_head *h);

// Gathers the rows of hidden (N, C) whose target[t] >= 0 (targets must be < V).
// Returns the row count, or CT_EINVAL when N exceeds the capacity.
int ct_head_gather(ct_head *h, const float *hidden, const int *target, int N);

// ct_head_gather for a caller that wrote the n = (number of target[t] >= 0) gathered
// hidden rows into h->hc itself, in token order: fills rows and target, and scales the
// rows by inv_temp as ct_head_gather does. Returns n, or CT_EINVAL past the capacity.
int ct_head_adopt(ct_head *h, const int *target, int N);

// Logits of the gathered rows against W (V, C); fills lse, logp, entropy, argmax, logit_sum.
void ct_head_forward(ct_head *h, const float *W);

// ct_head_forward with W16 (V, C), the bf16 copy of W: logits = bf16(hc) · W16ᵀ summed in
// fp32 (oneDNN, dnnl.h; needs ct_dnnl_init), and a ct_head_backward with the same W
// multiplies in bf16 too: dlogits are rounded to bf16 (in place, in the logits buffer) for
// d_hidden = dlogits · W16 and dW += dlogitsᵀ · bf16(hc). The softmax, lse, log-probs,
// entropy and every sum stay fp32. W16 NULL: ct_head_forward. W may be NULL (no fp32
// copy) for a forward that is not followed by a backward.
void ct_head_forward_bf16(ct_head *h, const float *W, const uint16_t *W16);

// The same with the logits computed by fn: out (n, nv) = logits of vocabulary columns
// [v0, v0 + nv) for hidden rows (n, C) — an LM head that is not an fp32 matrix (int8).
typedef void (*ct_logits_fn)(void *ctx, const float *hidden, int n, int v0, int nv, float *out);
void ct_head_forward_fn(ct_head *h, ct_logits_fn fn, void *ctx);

// Forward and backward together over the gathered rows, a chunk of logit_rows (ct_head_init's)
// at a time: the chunk's logits, then coef(ctx, h, r0, r1) sets coef and zcoef of rows
// [r0, r1) from their forward results (lse, logp, entropy, argmax, logit_sum), then the
// chunk's backward. Only one chunk's logits are ever held, and the backward reuses them
// (vocabulary tiling computes them twice): for losses whose coefficients row r needs only
// row r's results (cross-entropy, GRPO's per-token loss; not DPO's sequence sums). After
// it, every row's forward results are there as after ct_head_forward; d_hidden and dW as
// ct_head_backward's. W16: W's bf16 copy (bf16 products, ct_head_forward_bf16) or NULL.
typedef void (*ct_head_coef_fn)(void *ctx, ct_head *h, int r0, int r1);
void ct_head_fused(ct_head *h, const float *W, const uint16_t *W16, float *dW, float *d_hidden, int N,
                   ct_head_coef_fn coef, void *ctx);

// Cross-entropy's coefficients for ct_head_fused (ctx: a ct_head_ce): every target weighted
// by scale, z-loss (z · lse²) by 2·z·lse·scale.
typedef struct {
  float scale, z_loss;
} ct_head_ce;
void ct_head_ce_rows(void *ctx, ct_head *h, int r0, int r1);

// The logit rows for a head that runs ct_head_fused over up to `rows` rows of a V-word
// vocabulary: as many as keep one chunk of logits within CT_HEAD_CHUNK_FLOATS (a multiple of
// 16), at least min_rows, at most rows. Fewer rows per product cost time: every product
// packs all of W again (fp32, 1 thread, V = 151,936, 1024 rows: 128 rows at a time took
// 1.14-1.39x as long, 256 rows 1.02-1.22x, 384 rows 1.01x; in bf16 the packing weighs
// twice as much against the products).
#define CT_HEAD_CHUNK_FLOATS (16L << 20)  // 64 MiB of logits
#define CT_HEAD_MIN_ROWS 256              // SFT, DPO: memory first
#define CT_HEAD_MIN_ROWS_GRPO 1024        // GRPO's micro-batches of thousands of rows: speed first
int ct_head_chunk_rows(int rows, int V, int min_rows);

// dW (V, C) += dlogitsᵀ · hc (dW NULL: a frozen head, no weight gradient);
// d_hidden (N, C) = dlogits · W on gathered rows, 0 elsewhere.
// In bf16 when the last forward was ct_head_forward_bf16 with this W.
// With ntiles == 1 the logits kept by ct_head_forward are reused and overwritten: call
// it once per ct_head_forward.
void ct_head_backward(ct_head *h, const float *W, float *dW, float *d_hidden, int N);
