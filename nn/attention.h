// attention: causal grouped-query attention over a fused qkv matrix, forward and
// backward. Memory stays O(T) per head: the forward keeps only the log-sum-exp of each
// query row, and the backward recomputes the probabilities block by block.
//
// Layout (N = B*T rows, ld = (H + 2*KV) * hd):
//   qkv  (N, ld): row n = [q_0 .. q_{H-1} | k_0 .. k_{KV-1} | v_0 .. v_{KV-1}], each hd wide
//   out  (N, H*hd): head h at columns h*hd
//   lse  (N, H)
//   seg  (N): index (within its row of T) of the first key the query may see; 0 for an
//        ordinary causal row, the document start for packed rows (block-diagonal mask).
// Options (zero = off, so {B, T, H, KV, hd} is plain causal attention): scale (scores
// q·k · scale; 0 = hd^-0.5), window (query t sees keys t - window < j <= t as well),
// softcap (scores c·tanh(s/c) before the softmax, Gemma 2's attn_logit_softcapping),
// pre (N ints, or NULL): query t also sees keys [0, pre[t]) of its row, a prefix shared by
// several documents (GRPO's one forward of a group's prompt); pre[t] <= seg[t], and the
// document at seg[t] continues the prefix: its first token sits at position pre[t], so a
// window counts (t − seg[t]) + pre[t] − j positions back to prefix key j.
#pragma once
#include <stdbool.h>

typedef struct {
  int B, T, H, KV, hd;
  float scale;
  int window;
  float softcap;
  const int *pre;
} ct_attn_dims;

// Floats of scratch the attention needs per thread for rows up to T of heads of hd
// (softcapped scores keep their tanh for the backward: a third block; the backward's
// partial dK | dV of a row: T x 2·hd).
long ct_attention_scratch_floats(int T, int hd, bool softcap);

// head_max (H), or NULL: max-accumulated (atomically; = max(itself, ...)) with each head's
// largest pre-softmax logit (scaled by 1/sqrt(hd), over the keys each query sees) — QK-Clip's
// statistic (qkclip.h).
void ct_attention_forward(float *out, float *lse, const float *qkv, const int *seg,
                          ct_attn_dims d, float *scratch, float *head_max);

// dqkv (N, ld) is written (=) in full; dout is the gradient of out.
void ct_attention_backward(float *dqkv, const float *dout, const float *out, const float *lse,
                           const float *qkv, const int *seg, ct_attn_dims d, float *scratch);
