// reward/loss: the reward model's pairwise loss (TRL's RewardTrainer), per pair, and the
// metrics it logs, summed over pairs.
//
//   z = r_c − r_r − margin (margin 0 when the row has none)
//   ℓ = −log σ(z) + c·(r_c + r_r)²      c = center_rewards_coefficient (0: no term)
//   dℓ/dr_c = −σ(−z) + 2c·(r_c + r_r),  dℓ/dr_r = σ(−z) + 2c·(r_c + r_r)
// The step's loss is the mean of ℓ over its pairs (TRL: mean of each term over the batch).
#pragma once

// ℓ of one pair; *d_c, *d_r get its derivatives with respect to r_c and r_r.
double ct_rm_pair_loss(double r_c, double r_r, double margin, double center, double *d_c, double *d_r);

// Sums over pairs for the metrics (all doubles: summed across ranks with ct_dist_sum_stats;
// the extremes are kept apart, as maxima).
typedef struct {
  double loss;     // Σ ℓ
  double correct;  // pairs with r_c > r_r (accuracy = correct / pairs)
  double margin;   // Σ (r_c − r_r)
  double reward;   // Σ r_c + r_r (mean_reward = reward / (2·pairs))
  double pairs;
} ct_rm_sums;
typedef struct {
  double max, neg_min;  // max_reward and −min_reward (-inf before any pair)
} ct_rm_range;

// Adds one pair to s and e (e must start at {-inf, -inf}).
void ct_rm_add_pair(ct_rm_sums *s, ct_rm_range *e, double r_c, double r_r, double loss);
