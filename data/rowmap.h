// rowmap: rows in the shapes other tools take, mapped to TRL's before tokenizing.
//   ShareGPT (Axolotl, LLaMA-Factory): {"conversations": [{"from", "value"}, ...],
//     "system"?} -> messages; from human -> user, gpt -> assistant, system, tool as named;
//     entries already holding role/content pass as they are; a top-level "system" string
//     (LLaMA-Factory's column) becomes a first system message when there is none.
//   Alpaca: {"instruction", "input"?, "output", "system"?} -> a conversational
//     prompt/completion, as LLaMA-Factory builds it: the user turn is the instruction,
//     followed by "\n" and the input when the input is not empty; the assistant turn is
//     the output. The model's chat template renders it (completion_only_loss applies).
// Errors name the key (callers add file:line).
#pragma once
#include <jansson.h>

// The row's message list into *msgs (a new reference): "messages" as given, or
// "conversations" mapped; *key names which. *msgs is NULL when the row has neither.
int ct_rowmap_messages(const json_t *row, json_t **msgs, const char **key);

// An Alpaca row's prompt (a message list) and, when completion is not NULL, its completion
// (one assistant message) as new references; both NULL when the row has no "instruction".
int ct_rowmap_alpaca(const json_t *row, json_t **prompt, json_t **completion);
