// toolcall: the tool calls in a model's turn, in the model family's format, and the
// tokens that hand the tools' results back through the chat template.
//
// Formats:
//   hermes       Qwen2.5, Qwen3, Hermes, and every template that writes
//                <tool_call>{"name": ..., "arguments": {...}}</tool_call>: each such block
//                of the turn is a call (several per turn allowed). Text before a
//                "</think>" is reasoning and is not searched.
//   llama3_json  Llama 3.1 / 3.2: the whole turn (after an optional <|python_tag|>) is
//                {"name": ..., "parameters": {...}} ("arguments" accepted too), or
//                several such objects separated by ";". A turn that does not start with
//                "{" holds no call.
// A call's arguments may also be a string holding a JSON object (some models write them
// so). A block or turn that looks like a call but is not one — bad JSON, no "name",
// arguments that are no object — is a malformed call: an entry {"name"?, "error"} that
// becomes the tool message's error text, as TRL turns a failing call into {"error": ...}.
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "ids.h"
#include "tokenizer.h"

enum { CT_TOOLCALL_HERMES, CT_TOOLCALL_LLAMA3_JSON };
extern const char *const ct_toolcall_format_names[];  // "hermes", "llama3_json", NULL

// The format a chat template writes tool calls in, read from its source: "<tool_call>"
// → hermes; "<|python_tag|>" or an "ipython" role → llama3_json. -1 when neither shows.
int ct_toolcall_format_of(const char *template_src);

// The calls of one turn's text, as a new JSON list of {"name", "arguments"} or
// {"name"?, "error"} (malformed); empty when the turn calls nothing. NULL only when out
// of memory.
json_t *ct_toolcall_parse(int format, const char *text, size_t n);

// The tokens that follow a turn's end — its last token, an end-of-turn stop id — to give
// the tool messages back (`tool_msgs`, a list of {"role": "tool", "name", "content"}; or
// any messages, e.g. an environment's observation as a user message) and open the next
// assistant turn: the chat template renders a short conversation (a user message, an
// assistant turn — calling the first tool, for tool messages) with and without them
// plus the generation prompt, and the suffix is what follows the assistant turn's
// end-of-turn token in the longer one (TRL's _get_tool_suffix_ids; where a template
// renders a turn differently once it is not the last, as Qwen3 drops an empty think
// block, the turn ends at the first end-of-turn token after the two part). `opts`
// carries the row's tools and template variables (e.g. enable_thinking). CT_EFORMAT when
// the template renders no end of the assistant turn before the tool messages.
int ct_toolcall_suffix(const ct_tokenizer *t, const json_t *tool_msgs, const ct_chat_opts *opts, ct_ids *out);
