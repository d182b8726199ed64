// train_memory: the train state's buffers. The memory plan's rows for the policy and its
// optimizer, then (ct_train_memory) the parameters filled (model_path, the checkpoint, or the
// seeded initialization), LoRA's adapters and base, the gradients, moments, Muon's scratch,
// DiLoCo's outer state and the overlap's buckets; the activations' size and rows, and
// ct_train_free. The optimizer's files are read in train_moments.c.
#include "train_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "fs.h"
#include "hf.h"
#include "mem.h"
#include "mtp.h"
#include "muon.h"

// The adapters: the checkpoint's (resuming), adapter_path's, or new ones from the keys.
static int lora_setup(ct_train *tr) {
  const ct_config *c = tr->cfg;
  const char *from = tr->resumed_from[0] ? tr->resumed_from : c->adapter_path;
  if (from[0]) return ct_lora_load(&tr->lora, from, &tr->model.cfg);
  ct_lora_config lc = ct_train_lora_config(c);
  int rc = ct_lora_init(&tr->lora, &lc, &tr->model.cfg);
  if (rc) return ct_wrap_error(CT_ECONFIG, "%s: key 'use_peft'", ct_config_origin(c, "use_peft"));
  ct_lora_init_weights(&tr->lora, &tr->model, (uint64_t)c->seed);
  return 0;
}

// The optimizer's rows of the plan for `trained_bytes` of trained float32 weights: the
// moments (this rank's shard with optimizer_sharding; a checkpoint passes the other
// shards through the gradient buffer), DiLoCo's outer state.
static int plan_optimizer(const ct_train *tr, ct_plan *p, double trained_bytes) {
  const ct_config *c = tr->cfg;
  if (c->optimizer_sharding) {
    ct_shard s;
    int rc = ct_dist_shard_init(&s, (long)(trained_bytes / sizeof(float)));
    if (rc) return rc;
    double frac = s.n ? (double)(s.hi - s.lo) / (double)s.n : 0;
    ct_plan_addf(p, 2 * trained_bytes * frac, "AdamW moments (2 x float32), shard %d of %d", tr->rank + 1,
                 tr->world);
    ct_dist_shard_free(&s);
  } else if (c->optimizer == CT_OPT_MUON) {  // the matrices' second moment: allocated, unused
    ct_plan_add(p, "Muon momentum + AdamW moments (2 x float32)", 2 * trained_bytes);
    ct_layout L = {tr->model.n_tensors, tr->model.tensors, 0};
    ct_plan_add(p, "Muon Newton-Schulz scratch (largest matrix)", sizeof(float) * (double)ct_muon_work_floats(&L));
  } else {
    ct_plan_add(p, "AdamW moments (2 x float32)", 2 * trained_bytes);
  }
  if (c->diloco_inner_steps > 0) ct_plan_add(p, "DiLoCo: weights at the last sync, outer momentum", 2 * trained_bytes);
  return 0;
}

// Multi-token prediction's weights beside a model read from dir: its mtp.safetensors, or
// (a model trained without MTP) new ones from the seeded initialization, as a model built
// from scratch gets them; a checkpoint must have them (its moments do).
static int mtp_weights(ct_train *tr, const char *dir) {
  ct_model *m = &tr->model;
  bool found;
  int rc = ct_mtp_load(m, m->params, dir, &found);
  if (rc || found) return rc;
  if (tr->resumed_from[0])
    return ct_set_error(CT_ECONFIG, "%s has no mtp.safetensors: it was saved by a run without multi-token "
                        "prediction; resume it with mtp_num_layers: 0", dir);
  ct_model_init_random_from(m, m->n_hf_tensors, (uint64_t)tr->cfg->seed, (float)tr->cfg->model.initializer_range);
  ct_log_info(&tr->log, "multi-token prediction: %s has no mtp.safetensors; %d new depth%s initialized", dir,
              m->cfg.mtp_layers, m->cfg.mtp_layers > 1 ? "s" : "");
  return 0;
}

int ct_train_plan_policy(const ct_train *tr, ct_plan *p) {
  const ct_config *cfg = tr->cfg;
  const ct_model *m = &tr->model;
  bool peft = cfg->use_peft, bf16 = peft && tr->base_dtype == CT_STORE_BF16, i8 = peft && tr->base_dtype == CT_STORE_INT8;
  double trained_bytes;
  if (peft) {
    ct_lora_config lc = ct_train_lora_config(cfg);
    if (cfg->adapter_path[0] && ct_lora_read_config(&lc, cfg->adapter_path)) return CT_EFORMAT;
    trained_bytes = ct_lora_bytes(&lc, &m->cfg);
    ct_plan_addf(p, bf16 ? ct_model_bf16_bytes(m, true) : i8 ? ct_model_int8_bytes(m) : ct_model_param_bytes(m, false),
                 "base model (%s, frozen)", bf16 ? "bfloat16, embeddings float32" : i8 ? "int8, embeddings float32" : "float32");
    ct_plan_addf(p, trained_bytes, "LoRA adapters, rank %d", lc.r);
  } else {
    trained_bytes = ct_model_param_bytes(m, false);
    ct_plan_add(p, "policy parameters (float32)", trained_bytes);
  }
  ct_plan_add(p, "gradients (float32)", trained_bytes);
  int rc = plan_optimizer(tr, p, trained_bytes);
  if (rc) return rc;
  if (tr->bf16 && !bf16) ct_plan_add(p, "bf16 weight copy for the matmuls", ct_model_param_bytes(m, true));
  ct_plan_add_resident(p);
  return 0;
}

// gradient_checkpointing: true — every layer's activations in place of the recomputation's
// when the whole plan then still fits (with a tenth of the room to spare): the same gradients,
// bit for bit, one forward fewer per micro-batch. Else the top layers' activations, as many
// as fit: those layers' backward runs without recomputing.
static void keep_if_room(ct_train *tr, ct_plan *p) {
  if (tr->cfg->gradient_checkpointing != CT_GC_TRUE || tr->acts_row < 0 || tr->acts_mode != CT_ACTS_RECOMPUTE) return;
  const double MiB = 1048576.0;
  int L = tr->model.cfg.num_layers;
  double was = p->row[tr->acts_row].bytes, others = ct_plan_total(p) - was, room = ct_plan_room(ct_dist_local_size(), NULL);
  if (room <= 0) return;
  double keep = ct_train_acts_bytes(tr, tr->acts_B, tr->acts_T, CT_ACTS_KEEP);
  if (others + keep <= 0.9 * room) {
    p->row[tr->acts_row].bytes = keep;
    snprintf(p->row[tr->acts_row].what, sizeof p->row[0].what, "activations, %d x %d tokens (every layer)", tr->acts_B,
             tr->acts_T);
    tr->acts_mode = CT_ACTS_KEEP;
    ct_log_info(&tr->log, "gradient_checkpointing: every layer's activations fit (%.0f MiB, the plan %.0f of %.0f MiB): "
                "kept, no recomputation (gradient_checkpointing: always recomputes anyway)", keep / MiB,
                (others + keep) / MiB, room / MiB);
    return;
  }
  int lo = 0, hi = L - 1;  // the most top layers kept that fit (bytes grow with them)
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    tr->acts_kept = mid;
    if (others + ct_train_acts_bytes(tr, tr->acts_B, tr->acts_T, CT_ACTS_RECOMPUTE) <= 0.9 * room) lo = mid;
    else hi = mid - 1;
  }
  tr->acts_kept = lo;
  if (!lo) return;
  double b = ct_train_acts_bytes(tr, tr->acts_B, tr->acts_T, CT_ACTS_RECOMPUTE);
  p->row[tr->acts_row].bytes = b;
  snprintf(p->row[tr->acts_row].what, sizeof p->row[0].what, "activations, %d x %d tokens (inputs, top %d layers)",
           tr->acts_B, tr->acts_T, lo);
  ct_log_info(&tr->log, "gradient_checkpointing: the top %d of %d layers' activations fit (%.0f MiB, the plan %.0f of "
              "%.0f MiB): kept, the other %d recomputed", lo, L, b / MiB, (others + b) / MiB, room / MiB, L - lo);
}

int ct_train_memory(ct_train *tr, ct_plan *p, const char *knobs, bool *dry) {
  const ct_config *cfg = tr->cfg;
  ct_model *m = &tr->model;
  bool peft = cfg->use_peft, bf16 = peft && tr->base_dtype == CT_STORE_BF16, i8 = peft && tr->base_dtype == CT_STORE_INT8;
  int rc = ct_train_plan_policy(tr, p);
  if (rc) return rc;
  keep_if_room(tr, p);
  *dry = cfg->dry_run;
  bool over_memory;
  rc = ct_plan_check(p, &tr->log, ct_dist_local_size(), knobs, &over_memory);
  const char *from = tr->resumed_from[0] && !peft ? tr->resumed_from : cfg->model_path;
  if (rc == CT_ENOMEM && over_memory) {  // name what made it big (not for an address-space limit)
    char size[320];
    ct_model_size_text(&m->cfg, size, sizeof size);
    return ct_wrap_error(rc, "%s%s: %s", from, from[0] ? "/config.json" : "the `model:` keys", size);
  }
  if (rc || *dry) {
    if (!rc) ct_log_info(&tr->log, "dry run: nothing allocated");
    return rc;
  }
  double t0 = ct_now();
  if ((rc = ct_model_alloc(m, ct_train_rope_positions(cfg)))) return rc;
  // with LoRA a checkpoint holds the adapters only: the base always comes from model_path
  const char *dir = from;
  if (dir[0]) rc = ct_model_load_weights(m, m->params, dir);
  else ct_model_init_random(m, (uint64_t)cfg->seed, (float)cfg->model.initializer_range);
  if (!rc && dir[0] && m->cfg.mtp_layers) rc = mtp_weights(tr, dir);
  if (!rc && dir[0] && !m->cfg.mtp_layers && ct_path_has_file(dir, "mtp.safetensors"))
    ct_log_info(&tr->log, "%s has multi-token prediction depths (mtp.safetensors); mtp_num_layers is 0, so "
                "they are neither trained nor saved", dir);
  if (rc) return rc;
  if (dir[0])
    ct_log_info(&tr->log, "weights read from %s in %.2f s", dir, ct_now() - t0);
  if (peft) {
    if ((rc = lora_setup(tr))) return rc;
    if (bf16 && (rc = ct_model_to_bf16(m, true))) return rc;
    if (i8 && (rc = ct_model_to_int8(m))) return rc;
    ct_ident base;  // (as stored: after the narrowing to base_dtype)
    ct_ident_set(&base, "base", "model_path", cfg->model_path, "base_dtype", ct_store_names[tr->base_dtype],
                 ct_model_checksum(m));
    if ((rc = ct_train_frozen_record(tr, &base))) return rc;
    tr->trained = ct_lora_tensors(&tr->lora);
    tr->params = tr->lora.params;
  } else {
    tr->trained = ct_model_tensors(m);
    tr->params = m->params;
  }
  // from the weights just read; a bfloat16 LoRA base is its own bf16 copy
  if (tr->bf16 && (rc = ct_model_bf16_compute(m))) return rc;
  size_t bytes = sizeof(float) * tr->trained.n_floats;
  if (cfg->optimizer_sharding && (rc = ct_dist_shard_init(&tr->shard, tr->trained.n_floats))) return rc;
  size_t mbytes = cfg->optimizer_sharding ? sizeof(float) * (size_t)(tr->shard.hi - tr->shard.lo) : bytes;
  tr->grads = ct_big_alloc(bytes);  // zeroed
  tr->mom1 = ct_big_alloc(mbytes ? mbytes : 1);
  tr->mom2 = ct_big_alloc(mbytes ? mbytes : 1);
  if (!tr->grads || !tr->mom1 || !tr->mom2)
    return ct_set_error(CT_ENOMEM, "cannot allocate %.1f MB for gradients and optimizer moments",
                        (bytes + 2.0 * mbytes) / 1e6);
  if (cfg->qk_clip_threshold > 0 && (rc = ct_qkclip_init(&tr->qkclip, &m->cfg, (float)cfg->qk_clip_threshold)))
    return rc;
  if (cfg->optimizer == CT_OPT_MUON) {
    size_t wb = sizeof(float) * (size_t)ct_muon_work_floats(&tr->trained);
    if (!(tr->muon_work = ct_big_alloc(wb ? wb : 1)))
      return ct_set_error(CT_ENOMEM, "cannot allocate %.1f MB for Muon's scratch", wb / 1e6);
  }
  if (cfg->diloco_inner_steps > 0) {
    tr->outer_start = ct_big_alloc(bytes);
    tr->outer_mom = ct_big_alloc(bytes);  // zeroed
    if (!tr->outer_start || !tr->outer_mom)
      return ct_set_error(CT_ENOMEM, "cannot allocate %.1f MB for DiLoCo's outer state", 2.0 * bytes / 1e6);
    memcpy(tr->outer_start, tr->params, bytes);
    ct_log_info(&tr->log, "DiLoCo: %ld local %s steps between syncs of %d ranks, outer Nesterov lr %g, "
                "momentum %g", (long)cfg->diloco_inner_steps, cfg->optimizer == CT_OPT_MUON ? "Muon" : "AdamW",
                tr->world, cfg->diloco_outer_lr,
                cfg->diloco_outer_momentum);
  }
  if (peft) {  // every base weight frozen: gradient views all NULL
    tr->g.layers = calloc(m->cfg.num_layers, sizeof *tr->g.layers);
    if (!tr->g.layers) return ct_set_error(CT_ENOMEM, "out of memory");
    ct_lora_bind_grads(&tr->lora, tr->grads);
  } else if ((rc = ct_weights_bind(&tr->g, m, tr->grads))) {
    return rc;
  }
  long cap = (long)(cfg->ddp_bucket_cap_mb * (1 << 20) / sizeof(float));
  if (cap > 0 && tr->world > 1 && !cfg->optimizer_sharding && cfg->diloco_inner_steps == 0 &&
      (rc = ct_train_overlap_setup(tr, cap)))
    return rc;
  return tr->resumed_from[0] ? ct_train_moments_load(tr) : 0;
}

int ct_train_attach(const ct_train *tr, ct_acts *a) {
  a->qk_max = a->mode != CT_ACTS_FORWARD ? tr->qkclip.max : NULL;
  return ct_acts_attach_lora(a, tr->cfg->use_peft ? &tr->lora : NULL);
}

int ct_train_acts(const ct_train *tr, ct_acts *a, int B, int T) {
  int rc = ct_acts_init_kept(a, &tr->model, B, T, tr->acts_mode, tr->acts_kept);
  return rc ? rc : ct_train_attach(tr, a);
}

double ct_train_acts_bytes(const ct_train *tr, int B, int T, int mode) {
  const ct_config *c = tr->cfg;
  int kept = mode == CT_ACTS_RECOMPUTE ? tr->acts_kept : 0;
  double b = tr->bf16 ? ct_acts_kept_bytes_bf16(&tr->model.cfg, B, T, mode, kept)
                      : ct_acts_kept_bytes(&tr->model.cfg, B, T, mode, kept);
  if (c->use_peft) {
    ct_lora_config lc = ct_train_lora_config(c);
    if (c->adapter_path[0]) ct_lora_read_config(&lc, c->adapter_path);
    b += ct_lora_acts_bytes(&lc, &tr->model.cfg, B, T, mode);
  }
  return b;
}

void ct_train_plan_acts(ct_train *tr, ct_plan *plan, int rows, int eval_rows, int T) {
  bool ckpt = tr->cfg->gradient_checkpointing != CT_GC_FALSE;
  tr->acts_mode = ckpt ? CT_ACTS_RECOMPUTE : CT_ACTS_KEEP;
  tr->acts_kept = 0;
  tr->acts_B = rows;
  tr->acts_T = T;
  int n = plan->n;
  ct_plan_addf(plan, ct_train_acts_bytes(tr, rows, T, tr->acts_mode),
               "activations, %d x %d tokens (%s)", rows, T, ckpt ? "layer inputs + one layer" : "every layer");
  tr->acts_row = plan->n > n && n < CT_PLAN_ROWS - 1 ? n : -1;
  if (eval_rows > 0)
    ct_plan_addf(plan, ct_train_acts_bytes(tr, eval_rows, T, CT_ACTS_FORWARD), "evaluation activations, %d x %d tokens",
                 eval_rows, T);
}

void ct_train_dropout_key(ct_train *tr, int micro) {
  tr->lora.dropout_key = ((uint64_t)tr->cfg->seed * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)tr->step << 20) ^
                         ((uint64_t)micro << 4) ^ (uint64_t)tr->rank;
}

void ct_train_free(ct_train *tr) {
  ct_log_close(&tr->log);
  ct_lora_free(&tr->lora);
  ct_weights_free(&tr->g);
  ct_model_free(&tr->model);
  ct_big_free(tr->grads);
  ct_big_free(tr->mom1);
  ct_big_free(tr->mom2);
  ct_big_free(tr->muon_work);
  ct_qkclip_free(&tr->qkclip);
  ct_big_free(tr->outer_start);
  ct_big_free(tr->outer_mom);
  ct_dist_shard_free(&tr->shard);
  ct_train_overlap_free(tr);
  free(tr->order);
  if (tr->tok) ct_tokenizer_free(tr->tok);
  if (tr->lock_fd1) close(tr->lock_fd1 - 1);  // (the lock goes with it)
  memset(tr, 0, sizeof *tr);
}
