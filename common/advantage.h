// advantage: group-relative advantages and the token weights of each loss_type.
//
//   r = Σ_k w_k·R_k (a NaN reward counts 0, as TRL's nansum; r is NaN when every R_k is:
//   unscorable, left out of group_norm's statistics with A = 0), per group of G completions:
//   A = (r − mean_group) / (std + 1e-4), std Bessel-corrected, of the group
//   (scale group) or of the whole batch (scale batch); scale none: A = r − mean_group.
//   A group whose rewards are all equal gets A = 0 exactly.
//   That is advantage_estimator group_norm; the critic-free alternatives (OpenRLHF's names):
//   rloo                A_i = r_i − (Σ_group r − r_i)/(G − 1)   (TRL's RLOO; optionally
//                       whitened over the batch's completions, normalize_advantages)
//   reinforce_baseline  A_i = r_i − mean_group, then whitened over every completion token
//                       of the batch (REINFORCE++-baseline, OpenRLHF's experience maker)
//
//   The per-token objective these advantages enter is objective.h's.
#pragma once

// Weighted sums of per-function rewards R (n, K) into r (n).
void ct_grpo_total_rewards(const double *R, int n, int K, const double *w, double *r);

// Mean (*mean) and Bessel-corrected std of one group's G rewards.
double ct_grpo_group_std(const double *x, int G, double *mean);

// Advantages for n = groups·G rewards in group order. batch_std is the std of every
// reward of the step (all ranks), used when scale == batch. A NaN reward is an unscorable
// completion (every reward function gave NaN), as TRL's sum_then_normalize marks it: it is
// left out of its group's mean and std (Bessel-corrected, NaN below two values) and gets
// A = 0, as does an advantage that comes out NaN. Returns the number of groups whose
// rewards (two or more, not NaN) are all equal.
int ct_grpo_advantages(const double *r, int groups, int G, int scale, double batch_std, double *adv);

// multi_objective_aggregation normalize_then_sum (GDPO, as TRL computes it): each reward
// function's scores R (n = groups·G rows, K columns) normalized within each group,
// z = (R − nanmean) / (nanstd + 1e-4) (NaN scores left out of both; a group holding a
// function's score once gets NaN: TRL's nanstd of one value), summed with the weights w
// over the non-NaN z into r; a row whose every R is NaN (unscorable) gets r = NaN. Then
// advantages A = (r − mean) / (std + 1e-4) over every rank's non-NaN r (Bessel std; a
// collective), and 0 for the unscorable. Returns 0, or the error of the cross-rank sum.
int ct_grpo_normalize_then_sum(const double *R, int groups, int G, int K, const double *w, double *r, double *adv);

// rloo's leave-one-out advantages (n = groups·G rewards in group order); a group whose
// rewards are all equal gets 0 exactly. Returns the number of such groups.
int ct_grpo_rloo(const double *r, int groups, int G, double *adv);

// reinforce_baseline's first half: A = r − mean_group (0 exactly where all are equal).
// Returns the number of groups whose rewards are all equal.
int ct_grpo_group_baseline(const double *r, int groups, int G, double *adv);

// How ct_grpo_whiten weighs and divides:
//   completions (TRL's normalize_advantages): every completion once;
//     A ← (A − mean) / (std + 1e-4), std Bessel-corrected (0 for a single completion)
//   tokens (OpenRLHF's masked whitening): completion i weighs w_i = its token count;
//     A ← (A − μ) / sqrt(max(σ², 1e-8)), μ = Σ w·A / Σ w, σ² = Σ w·(A − μ)² / Σ w
//     (nothing changes when there are no tokens at all)
enum { CT_WHITEN_COMPLETIONS, CT_WHITEN_TOKENS };
// Whitens this rank's n advantages in place with statistics over every rank's (a
// collective: every rank calls it). w (n) is read only by CT_WHITEN_TOKENS. Returns 0, or
// the error of the cross-rank sum.
int ct_grpo_whiten(double *adv, const double *w, int n, int kind);

typedef struct {
  double eps_low, eps_high, beta;
} ct_grpo_clip;

typedef struct {
  double kl;            // kl_t (0 when beta is 0 and no reference is given)
  int clipped_low;      // ρ < 1 − ε_low with A < 0: the clip holds the ratio
  int clipped_high;     // ρ > 1 + ε_high with A > 0
} ct_grpo_token_info;

// How token losses are averaged into the step's loss (loss_type), as a weight per token:
//   grpo     mean over sequences of each sequence's token mean: 1 / (sequences · its length)
//   bnpo     token mean of each micro-batch, averaged over micro-batches:
//            1 / (micro-batches · tokens in this micro-batch)
//   dr_grpo  token sum / (sequences · max_completion_length)
//   dapo     token sum / tokens of the whole step
// Counts are of the whole optimizer step (all micro-batches, all ranks). Tokens leave out
// masked completions (mask_truncated_completions: their tokens get no weight); sequences
// count every completion, masked ones too, as TRL's mean over the batch's rows does (grpo,
// sapo) and its division by the batch's row count (dr_grpo).
enum { CT_GRPO_AGG_GRPO, CT_GRPO_AGG_BNPO, CT_GRPO_AGG_DR_GRPO, CT_GRPO_AGG_DAPO, CT_GRPO_AGG_COUNT };
typedef struct {
  double tokens, sequences, micro_batches;
} ct_grpo_counts;
double ct_grpo_token_weight(int agg, const ct_grpo_counts *c, int seq_len, double micro_tokens,
                            int max_completion_length);
