#!/bin/sh
# config.json as ctune writes it is the config.json it read, with only what training
# changed: for each family (llama, qwen2, qwen3, mistral, gemma3_text), a tiny model whose
# config.json is written as transformers writes one (sorted keys, its types: Gemma 3's
# query_pre_attn_scalar an int, floats like 1e-05, keys ctune does not read, transformers
# 5's dtype and rope_parameters) is saved full (sft), merged (LoRA + merge-lora), as a
# reward model and as an int8 model, and every saved config.json keeps every key of the
# source, in order, with its JSON type and value; only the dtype, a reward model's
# architecture and labels (and pad_token_id) change. transformers 5.17 refused ctune's
# Gemma 3 saves, whose "query_pre_attn_scalar": 24.0 is no int. adapter_config.json has
# PEFT's types, its floats written the shortest way (0.05, not 0.050000000000000003). A
# model from scratch writes the types transformers' config classes declare.
. tests/lib/common.sh
start_test types
command -v node >/dev/null || fail "node is missing (scripts/install-deps.sh installs it)"
J="node tests/json_types.mjs"

"$BIN/ctune-demo-data" reverse "$T/train.jsonl" "$T/eval.jsonl" 200 20 7 6 >/dev/null
awk -F'"' '{w=$4; sub(/^reverse /,"",w); sub(/:$/,"",w); if (w != $8)
  printf "{\"prompt\": \"%s\", \"chosen\": \"%s\", \"rejected\": \"%s\"}\n", $4, $8, w}' "$T/train.jsonl" >"$T/pairs.jsonl"
dims="model.hidden_size=64 model.intermediate_size=128 model.num_hidden_layers=2 model.num_attention_heads=4
      model.num_key_value_heads=2"
run() { name=$1; shift; "$@" >"$T/$name.log" 2>&1 || { cat "$T/$name.log"; fail "$name"; }; }

# source FAMILY: the config.json transformers would write for the tiny model of FAMILY.
source_config() {
  common='"attention_dropout": 0.0, "bos_token_id": 256, "ctune_test_extra": {"a": [1, 2.5], "b": null},
  "head_dim": 16, "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
  "max_position_embeddings": 4096, "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
  "tie_word_embeddings": true, "transformers_version": "4.57.1", "use_cache": true, "vocab_size": 260'
  case $1 in
  llama) echo '{"architectures": ["LlamaForCausalLM"], '"$common"', "dtype": "bfloat16", "eos_token_id": [256, 257],
  "hidden_act": "silu", "mlp_bias": false, "model_type": "llama", "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}' ;;
  qwen2) echo '{"architectures": ["Qwen2ForCausalLM"], '"$common"', "eos_token_id": 256, "hidden_act": "silu",
  "max_window_layers": 2, "model_type": "qwen2", "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
  "sliding_window": 4096, "torch_dtype": "bfloat16", "use_sliding_window": false}' ;;
  qwen3) echo '{"architectures": ["Qwen3ForCausalLM"], '"$common"', "attention_bias": false, "eos_token_id": 256,
  "hidden_act": "silu", "model_type": "qwen3", "pad_token_id": 259, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000.0, "torch_dtype": "float32"}' ;;
  mistral) echo '{"architectures": ["MistralForCausalLM"], '"$common"', "eos_token_id": 256, "hidden_act": "silu",
  "model_type": "mistral", "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "torch_dtype": "bfloat16"}' ;;
  gemma3_text) echo '{"architectures": ["Gemma3ForCausalLM"], '"$common"', "attn_logit_softcapping": null,
  "cache_implementation": "hybrid", "eos_token_id": [256, 258], "final_logit_softcapping": null,
  "hidden_activation": "gelu_pytorch_tanh", "layer_types": ["sliding_attention", "full_attention"],
  "model_type": "gemma3_text", "pad_token_id": 259, "query_pre_attn_scalar": 16, "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000.0, "rope_scaling": null, "rope_theta": 1000000.0, "sliding_window": 8,
  "sliding_window_pattern": 2, "torch_dtype": "bfloat16", "use_bidirectional_attention": false}' ;;
  esac
}

for f in llama qwen2 qwen3 mistral gemma3_text; do
  echo "== $f"
  extra=""
  [ $f = gemma3_text ] && extra="model.sliding_window=8 model.sliding_window_pattern=2"
  # shellcheck disable=SC2086
  run "new_$f" "$BIN/sft" configs/sft.yml dataset_path="$T/train.jsonl" output_dir="$T/new_$f" max_steps=1 \
    save_steps=0 eval_steps=0 model.model_type=$f $dims $extra
  # from scratch: the types transformers' config classes declare
  $J types "$T/new_$f/config.json" vocab_size=int hidden_size=int intermediate_size=int num_hidden_layers=int \
    num_attention_heads=int num_key_value_heads=int head_dim=int max_position_embeddings=int \
    query_pre_attn_scalar=int sliding_window=int sliding_window_pattern=int bos_token_id=int eos_token_id=int \
    pad_token_id=int rms_norm_eps=float rope_theta=float rope_local_base_freq=float attention_dropout=float \
    tie_word_embeddings=bool || fail "$f from scratch: types"
  src="$T/src_$f"
  mkdir -p "$src" && cp "$T/new_$f/model.safetensors" "$T/new_$f/tokenizer.json" "$T/new_$f/tokenizer_config.json" "$src/"
  source_config $f >"$src/config.json"
  dt=torch_dtype
  [ $f = llama ] && dt=dtype
  common="dataset_path=$T/train.jsonl model_path=$src max_steps=1 save_steps=0 eval_steps=0 max_length=24"
  run "full_$f" "$BIN/sft" configs/sft.yml $common output_dir="$T/full_$f"
  $J same "$src/config.json" "$T/full_$f/config.json" $dt=value || fail "$f: the full model's config.json"
  run "lora_$f" "$BIN/sft" configs/sft.yml $common output_dir="$T/lora_$f" use_peft=true lora_r=4 lora_alpha=16 \
    lora_dropout=0.05
  a="$T/lora_$f/adapter_config.json"
  $J text "$a" lora_dropout 0.05 && $J types "$a" r=int lora_alpha=int lora_dropout=float use_rslora=bool \
    || fail "$f: adapter_config.json"
  run "merge_$f" "$BIN/ctune-ckpt" merge-lora base="$src" adapter="$T/lora_$f" out="$T/merged_$f"
  $J same "$src/config.json" "$T/merged_$f/config.json" $dt=value || fail "$f: the merged model's config.json"
  run "rm_$f" "$BIN/reward" configs/reward.yml $common dataset_path="$T/pairs.jsonl" output_dir="$T/rm_$f"
  $J same "$src/config.json" "$T/rm_$f/config.json" $dt=value architectures=value id2label=added label2id=added \
    pad_token_id=added || fail "$f: the reward model's config.json"
  run "q8_$f" "$BIN/sampler" generate model_path="$src" prompt="reverse abc:" max_new_tokens=1 quantization=int8 \
    save_quantized="$T/q8_$f"
  $J same "$src/config.json" "$T/q8_$f/config.json" $dt=value quantization_config=added \
    || fail "$f: the int8 model's config.json"
done
echo "config types: all checks passed"
