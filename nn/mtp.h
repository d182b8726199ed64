// mtp: multi-token prediction, DeepSeek-V3's layout (MaxText's mtp_num_layers). Depth
// k = 1..D at position i predicts token i+k+1 from
//   h_k = Block_k(eh_proj_k · [enorm_k(emb(token i+k)); hnorm_k(h_{k-1})])
// where h_0 is the main model's last layer output before the final norm (as MaxText,
// whose MTP block takes the decoder's hidden state ahead of its output head), Block_k one
// decoder layer of the model's own kind (forward.h's ct_layer_forward: the attention of
// the model's last layer), and the shared final norm and LM head give the logits. The
// concatenation puts the embedding first, as MaxText and DeepSeek-V3's released eh_proj.
// The loss adds λ · mean_k CE_k, CE_k the mean over depth k's targets (the token i+k+1
// exists in the same document and is labeled). Its weights live in the model's layout
// after the Hugging Face tensors (model.h: mtp.layers.<k>.*) and are saved apart, in
// mtp.safetensors, so model.safetensors stays a plain Hugging Face model.
#pragma once
#include <stdbool.h>

#include "forward.h"
#include "head.h"
#include "model.h"
#include "safetensors.h"

#define CT_MTP_MAX 16  // most depths (the key mtp_num_layers' range)

// Sums over tokens, per depth k (index k - 1): plain doubles, so a stats struct holding
// it still sums across ranks as one array.
typedef struct {
  double loss[CT_MTP_MAX];      // Σ cross-entropy over depth k's targets (nats)
  double targets[CT_MTP_MAX];   // depth k's targets
  double accepted[CT_MTP_MAX];  // targets whose depth-k argmax equals the main model's argmax
                                // for the same token (its greedy prediction at position i+k)
} ct_mtp_stats;

// The D depths' work space for batches of up to B x T tokens.
typedef struct ct_mtp {
  int D, B, T;
  bool train;           // keeps every depth's activations for backward
  float coef[CT_MTP_MAX];  // each depth-k target's weight in the loss (ct_mtp_set_scale)
  ct_acts *acts;        // (train ? D : 1) one decoder layer's activations each
  float *en, *hn;       // (train ? D : 1, N, C) enorm(emb), hnorm(h_{k-1}): eh_proj's input
  float *rstd_e, *rstd_h;  // (train ? D : 1, N)
  int *ids;             // (train ? D : 1, N) token i+k at position i (0 past its document)
  int *target;          // (N) depth k's targets, -1 where none
  int *main_argmax;     // (N) the main model's argmax at each token with a target, else -1
  float *w1, *w2, *w3;  // (N, C) work: embeddings, gradients
  float *dh0;           // (N, C) the gradient of h_0: the main backward's dx_top
  float *wn;            // (C) a Gemma norm's 1 + w
} ct_mtp;

// Bytes ct_mtp_init allocates (the memory plan).
double ct_mtp_bytes(const ct_model *m, int B, int T, bool train);
// For m (cfg.mtp_layers > 0, float32 or bf16-compute weights, no adapters).
int ct_mtp_init(ct_mtp *t, const ct_model *m, int B, int T, bool train);
void ct_mtp_free(ct_mtp *t);

// Depth k's targets (k >= 1) of a batch (B rows of T): out[i] = target[i + k] when token
// i + k lies in the same row and document (seg) as i, else -1.
void ct_mtp_targets(const int *target, const int *seg, int B, int T, int k, int *out);
// Adds each depth's target count (k = 1..D into n[k - 1]).
void ct_mtp_count(const int *target, const int *seg, int B, int T, int D, double *n);
// coef[k] = λ / (D · n[k]) (0 when n[k] is 0): n holds the targets of the whole optimizer
// step, so the step's gradient is that of λ · mean_k CE_k.
void ct_mtp_set_scale(ct_mtp *t, float lambda, const double *n);

// After ct_forward through a and the LM head's forward over the main targets (h's rows,
// argmax; its backward into a->dln may have run too): runs the D depths over the same
// tokens (a->ids, pos, seg; target (N) the main targets), adds their statistics to st,
// and with g != NULL their gradient (coef-weighted CE) into g — MTP weights, embedding,
// final norm, head — and points a->dx_top at the gradient of h_0 for ct_backward (else
// sets it NULL). Reuses h. Fails when h cannot hold N rows.
int ct_mtp_step(ct_mtp *t, const ct_model *m, ct_acts *a, ct_head *h, const int *target, int B, int T,
                const ct_weights *g, ct_mtp_stats *st);

// mean_k (loss_k / targets_k) over the depths with targets, and the acceptance rate over
// all depths' targets (or depth k's alone, k >= 1); 0 without targets.
double ct_mtp_mean_loss(const ct_mtp_stats *s, int D);
double ct_mtp_acceptance(const ct_mtp_stats *s, int D, int k);

// dir/mtp.safetensors into buf (m's layout): every MTP tensor, checking names and shapes,
// and nothing else (a file with more depths than m is an error). *found = false, nothing
// read, when the file does not exist.
int ct_mtp_load(const ct_model *m, float *buf, const char *dir, bool *found);
// buf's MTP tensors to dir/mtp.safetensors as dtype.
int ct_mtp_save(const ct_model *m, const float *buf, const char *dir, ct_dtype dtype);
