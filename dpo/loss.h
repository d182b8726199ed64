// dpo/loss: the preference losses of one pair, from summed completion log-probs, and
// their derivatives with respect to the policy's log-probs (the reference is constant).
//
//   ρ_c = logπ(c) − logπ_ref(c), ρ_r likewise, Δ = ρ_c − ρ_r, β = beta, ε = label_smoothing
//   sigmoid  −(1−ε)·logσ(βΔ) − ε·logσ(−βΔ)                 (ε > 0: cDPO)
//   hinge    max(0, 1 − βΔ)
//   ipo      (ρ_c/|c| − ρ_r/|r| − 1/(2β))²                 (length-averaged)
//   robust   [−(1−ε)·logσ(βΔ) + ε·logσ(−βΔ)] / (1 − 2ε)
//   simpo    −(1−ε)·logσ(z) − ε·logσ(−z), z = β·(logπ(c)/|c| − logπ(r)/|r|) − γ  (no reference)
//   sft      cross-entropy over the chosen tokens: not per pair (it is averaged over
//            the step's chosen tokens by the trainer), so 0 here.
// TRL's other per-pair losses (dpo_trainer.py's names), x_c = β·ρ_c, x_r = β·ρ_r, z = βΔ:
//   exo_pair      σ(z)·(logσ(z) − log(1−ε)) + σ(−z)·(logσ(−z) − log ε)   (ε > 0)
//   nca_pair      −logσ(x_c) − ½·logσ(−x_c) − ½·logσ(−x_r)
//   bco_pair      −logσ(x_c) − logσ(−x_r)
//   sppo_hard     (ρ_c − 1/(2β))² + (ρ_r + 1/(2β))²
//   apo_zero      1 − σ(x_c) + σ(x_r)
//   apo_down      σ(x_c) + 1 − σ(z)
//   discopop      −logσ(z)·(1 − m) + e^(−z)·m, m = σ(z/τ), τ = discopop_tau (gradient through m too)
//   sigmoid_norm  −logσ(β·(ρ_c/|c| − ρ_r/|r|))
// Reference-free (TRL's experimental trainers), each with its NLL term on the chosen tokens
// (the sft term, which the trainer adds: weight 1 for orpo, cpo_alpha for cpo):
//   orpo  −β·logσ(log_odds), log_odds = (a_c − a_r) − (log(1 − e^a_c) − log(1 − e^a_r)),
//         a = logπ(y)/|y| (ORPOTrainer: λ = beta)
//   cpo   −(1−ε)·logσ(β·(logπ(c) − logπ(r))) − ε·logσ(−β·(logπ(c) − logπ(r)))  (CPOTrainer's sigmoid)
// and CPOTrainer's other loss types, on u = logπ (hinge) or u = logπ/|y| (ipo, simpo), or
// with alpha ≠ 0 (AlphaPO) on r(u) = (1 − e^(−α·u))/α; x = r(u_c) − r(u_r):
//   cpo_hinge  max(0, 1 − β·x)               cpo_ipo  (x − 1/(2β))²
//   cpo_simpo  −(1−ε)·logσ(β·x − γ) − ε·logσ(−(β·x − γ)), γ = simpo_gamma
//   alphapo    cpo_simpo without the NLL term (TRL's loss_type alphapo: simpo, cpo_alpha 0)
#pragma once
#include <stdbool.h>

enum {
  CT_DPO_SIGMOID, CT_DPO_HINGE, CT_DPO_IPO, CT_DPO_ROBUST, CT_DPO_SFT, CT_DPO_SIMPO, CT_DPO_EXO_PAIR,
  CT_DPO_NCA_PAIR, CT_DPO_BCO_PAIR, CT_DPO_SPPO_HARD, CT_DPO_APO_ZERO, CT_DPO_APO_DOWN, CT_DPO_DISCOPOP,
  CT_DPO_SIGMOID_NORM, CT_DPO_ORPO, CT_DPO_CPO, CT_DPO_AOT, CT_DPO_AOT_UNPAIRED, CT_DPO_KTO,
  CT_DPO_APO_ZERO_UNPAIRED, CT_DPO_CPO_HINGE, CT_DPO_CPO_IPO, CT_DPO_CPO_SIMPO, CT_DPO_ALPHAPO, CT_DPO_COUNT
};
// "sigmoid", ..., NULL: the loss_type name of each CT_DPO_* value.
extern const char *const ct_dpo_loss_type_names[];

typedef struct {
  int n;
  int type[8];       // CT_DPO_*
  double weight[8];
  double beta, label_smoothing, simpo_gamma, discopop_tau, cpo_alpha;
  double desirable_weight, undesirable_weight;  // kto, apo_zero_unpaired
  double alpha;  // the cpo family's AlphaPO reward shape (0: the log-probs themselves)
} ct_dpo_loss;

// KTO's losses (TRL's KTOTrainer), over unpaired examples (prompt, completion, label) and
// not pairs: loss_type kto or apo_zero_unpaired, alone. ρ = logπ(y) − logπ_ref(y), w_d =
// desirable_weight, w_u = undesirable_weight, KL = the batch's estimate (a constant here):
//   kto                desirable w_d·(1 − σ(β(ρ − KL))), undesirable w_u·(1 − σ(β(KL − ρ)))
//   apo_zero_unpaired  desirable w_d·(1 − σ(βρ)),        undesirable w_u·σ(βρ)
// The trainer averages them over the step's examples. True when loss_type is one of these.
int ct_dpo_unpaired(const ct_dpo_loss *o);
// True when the loss reads KL (kto): the batch then holds its mismatched rows.
int ct_dpo_kto_kl(const ct_dpo_loss *o);
// One example's loss (its weight included) and, in *d, d(loss)/d logπ(y).
double ct_dpo_kto_loss(const ct_dpo_loss *o, bool desirable, double lp, double ref, double kl, double *d);

// AOT (TRL's aot, and aot_unpaired; aot_pair is TRL's older name of aot): not per pair but
// over the micro-batch's m pairs, sorted — aot: δ_i = sort(logπ(c) − logπ(r))_i −
// sort(logπ_ref(c) − logπ_ref(r))_i; aot_unpaired: δ_i = sort(ρ_c)_i − sort(ρ_r)_i; each
// −(1−ε)·logσ(βδ_i) − ε·logσ(−βδ_i), summed over i. ct_dpo_pair_loss leaves them out;
// ct_dpo_batch_terms adds them to each pair's L, d_c, d_r (position i's loss goes to the pair
// whose value sits there; the gradient follows each value through the sort).
void ct_dpo_batch_terms(const ct_dpo_loss *o, int m, const double *lp_c, const double *lp_r, const double *ref_c,
                        const double *ref_r, double *L, double *d_c, double *d_r);

// Weighted sum of the pair losses; *d_c and *d_r get d(loss)/d logπ(c) and d logπ(r).
// lens > 0. ref_c/ref_r are ignored by simpo.
double ct_dpo_pair_loss(const ct_dpo_loss *o, double lp_c, double lp_r, double ref_c, double ref_r,
                        int len_c, int len_r, double *d_c, double *d_r);

// ORPO's log odds of the chosen over the rejected completion, from the mean log-probs
// (its metric log_odds_chosen; log_odds_ratio is its log σ).
double ct_dpo_log_odds(double lp_c, double lp_r, int len_c, int len_r);
// log σ(x), stable for large |x|.
double ct_dpo_log_sigmoid(double x);

// True for CPOTrainer's loss types (cpo, cpo_hinge, cpo_ipo, cpo_simpo, alphapo).
int ct_dpo_is_cpo(int type);
// CPOTrainer's logged reward of a completion under cpo loss `type`: β·u (u the summed
// log-prob, or the mean for ipo, simpo and alphapo), or with alpha ≠ 0 β·r(u).
double ct_dpo_cpo_reward(const ct_dpo_loss *o, int type, double lp, int len);
// True when some loss needs the reference model (all but simpo, orpo, the cpo family and sft).
int ct_dpo_needs_reference(const ct_dpo_loss *o);
// The weight of the NLL term on the chosen tokens: sft's, orpo's and cpo_alpha times the cpo
// family's but alphapo's (0 when none).
double ct_dpo_sft_weight(const ct_dpo_loss *o);
