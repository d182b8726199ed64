// objective: GRPO's per-token policy objective over one completion, TRL's GRPOTrainer
// _compute_loss term by term (loss_type, importance_sampling_level, delta, SAPO's
// temperatures, use_bias_correction_kl, off_policy_mask_threshold), and the coefficient
// −dL/dlp_t of every completion token that the LM head's backward takes.
//
// Per completion i of n tokens, with lp_t this forward's log-probs, old_t the log-probs
// before the step's first update (= lp_t on the first pass), A the advantage:
//   importance weight  s_t = exp(lp_t − old_t)                         (token)
//                      s_t = exp(Σ_u (lp_u − old_u) / n) for every t   (sequence: GSPO)
//   policy term p_t    clip (grpo, bnpo, dr_grpo, dapo):
//                        −min(s'·A, clamp(s, 1 − ε, 1 + ε_high)·A), s' = min(s, delta) when
//                        delta is set (INTELLECT-2's two-sided clip), else s
//                      cispo: −sg(min(s, ε_high))·A·lp_t   (sg: no gradient through it)
//                      sapo:  −σ(τ·(s − 1))·(4/τ)·A, τ = sapo_temperature_pos when A > 0,
//                        else sapo_temperature_neg
//                      vespo: −sg(φ)·A·lp_t, φ = e^(λ + k·log w − λ·w) (0 where not finite),
//                        log w = clamp(Σ_u clamp(lp_u − old_u, ±20) + Σ_u clamp(log c_u, log 1e-8,
//                        20), log 1e-8, 20) (the c_u of a token_ correction, else none), (k, λ)
//                        = vespo_k_pos/lambda_pos when A ≥ 0, else _neg; the correction is not
//                        applied again; averaged as dapo
//   off-policy mask    m = 1 when A ≥ 0 or Σ_u (q_u − lp_u) / n ≤ off_policy_mask_threshold,
//                      else 0 (q: the sampler's log-probs; DeepSeek-V3.2's sequence mask)
//   entropy mask       e_t = 1 when token t's entropy H_t ≥ the (1 − top_entropy_quantile)
//                      quantile of the micro-batch's completion tokens' entropies (all
//                      ranks' micro-batches at once; torch.quantile's linear interpolation),
//                      else 0; 1 with top_entropy_quantile 1
//   KL term            k_t = e^(ref_t − lp_t) − (ref_t − lp_t) − 1, times s_t with
//                      use_bias_correction_kl
//   token loss         ℓ_t = m·p_t + β·k_t
// and the step's loss L = Σ_i Σ_t w_i·ℓ_t, w_i the loss_type's token weight (advantage.h's
// ct_grpo_token_weight: cispo weighs as dapo, sapo as grpo). Where PyTorch's min meets a tie
// its gradient splits in halves between the two terms, as here.
#pragma once
#include <stdbool.h>

#include "advantage.h"
#include "config.h"

enum { CT_GRPO_POLICY_CLIP, CT_GRPO_POLICY_CISPO, CT_GRPO_POLICY_SAPO, CT_GRPO_POLICY_VESPO };

typedef struct {
  ct_grpo_clip clip;         // ε, ε_high, β (β 0: no KL term)
  int policy;                // CT_GRPO_POLICY_*
  bool sequence;             // importance_sampling_level: sequence
  double delta;              // 0: off
  double tau_pos, tau_neg;   // sapo's temperatures
  bool bias_kl;              // use_bias_correction_kl
  bool opm;                  // off_policy_mask_threshold set
  double opm_threshold;
  int isc;                   // vllm_importance_sampling_mode (CT_ISC_*), or −1: no correction
  double isc_min, isc_max;
  double top_entropy;        // top_entropy_quantile (1: every token)
  double k_pos, lambda_pos, k_neg, lambda_neg;  // vespo's
} ct_grpo_objective;

// GRPO's loss_type names: grpo, bnpo, dr_grpo, dapo, cispo, sapo, vespo, NULL.
extern const char *const ct_grpo_loss_type_names[];

// loss_type's policy term and weighting: grpo, bnpo, dr_grpo, dapo, cispo, sapo. Returns
// 0, or −1 for another name.
int ct_grpo_loss_kind(const char *loss_type, int *policy, int *agg);

// The objective a GRPO config sets (use_ref: a reference is loaded, so β applies) and its
// token weighting (*agg). Fails (CT_ECONFIG, naming the key) for a loss_type of DPO's or
// more than one.
int ct_grpo_objective_of(const ct_config *c, bool use_ref, ct_grpo_objective *o, int *agg);

// Whether a token's coefficient depends on the completion's other tokens (sequence-level
// weights, the off-policy mask, a sequence_ correction) or the micro-batch's (the entropy
// quantile): then every log-prob and entropy of a micro-batch comes before any coefficient
// and ct_grpo_span_loss takes whole completions only.
bool ct_grpo_needs_whole(const ct_grpo_objective *o);

// torch.quantile(x, q) of x (n, sorted in place here), linear interpolation between the
// nearest ranks; −∞ when n is 0.
double ct_grpo_quantile(float *x, long n, double q);

// The entropy mask's threshold over the micro-batch of every rank: ent (n) this rank's
// completion tokens' entropies (masked completions left out). A collective at world size >
// 1 (every rank calls it, once per micro-batch). Returns 0 or an error (memory, MPI).
int ct_grpo_entropy_threshold(const ct_grpo_objective *o, const float *ent, long n, double *threshold);

// Sums over the tokens a call saw (the metrics of TRL's names).
typedef struct {
  double kl;            // Σ k_t (0 without a reference)
  double clipped_low;   // tokens with s < 1 − ε and A < 0
  double clipped_high;  // tokens with s > 1 + ε_high and A > 0
  double cispo_clipped; // cispo: tokens with s > ε_high and A > 0
  double masked;        // tokens the off-policy mask dropped
  double low_entropy;   // tokens the entropy mask dropped
  double lp_diff, lp_diff_n;  // Σ |old − q| over the tokens with a sampler log-prob, their count
  double phi_sum;       // vespo: Σ φ over the tokens
  double is_sum, is_n;  // Σ of the sampler correction's ratios (one per token, or per
                        // completion in sequence_ modes) and their count
} ct_grpo_span_info;

// Extremes over the same tokens (maxima; a minimum is kept negated), −∞ before any.
typedef struct {
  double lp_diff_max, is_max, is_neg_min;
} ct_grpo_span_max;

// One token of the clip policy at token level (loss_type grpo's term, before weighting):
// ℓ_t, and *d = dℓ_t/dlp_t. ref is ignored when beta is 0.
double ct_grpo_token_loss(const ct_grpo_clip *c, double lp, double old, double ref, double A, double *d,
                          ct_grpo_token_info *info);

// How one micro-batch weighs its completion tokens.
typedef struct {
  ct_grpo_objective obj;
  int agg;                       // CT_GRPO_AGG_*
  const ct_grpo_counts *counts;  // of the whole optimizer step
  double micro_tokens;           // this micro-batch's completion tokens, masked ones left out
  int max_completion_length;
  double entropy_threshold;      // ct_grpo_entropy_threshold's, with top_entropy_quantile < 1
} ct_grpo_micro;

// Tokens [0, n) of a completion of seq_len tokens (n = seq_len unless the objective is
// token-local, when any span of it may come): lp, old (n); ent (n) their entropies (read
// with top_entropy_quantile < 1, else may be NULL); ref (n) or NULL when β is 0;
// q (n) the sampler's log-probs, or NULL (the off-policy mask then reads old; no sampler
// correction). Returns the tokens' share of L and sets coef[t] = −dL/dlp_t; info and mx
// (mx may be NULL) accumulate, never reset here.
double ct_grpo_span_loss(const ct_grpo_micro *m, int seq_len, int n, const float *lp, const float *old,
                         const float *ent, const float *ref, const float *q, double A, float *coef,
                         ct_grpo_span_info *info, ct_grpo_span_max *mx);
