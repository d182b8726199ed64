// tokenizer: text <-> token ids. Two kinds behind one interface: the built-in byte
// tokenizer (ids 0-255 are bytes, then a few special tokens; used by models trained
// from scratch) and Hugging Face BPE tokenizers loaded from tokenizer.json: byte-level
// (GPT-2 style: Qwen, Llama 3) or SentencePiece-style (no ByteLevel in the file: Llama 2,
// Mistral, Gemma; symbols are characters, spaces are ▁, a character missing from the
// vocabulary becomes its <0xNN> byte tokens). All are the same machinery: the byte
// tokenizer is a byte-level BPE without merges.
//
// Encoding follows Hugging Face tokenizers: added tokens are cut out first (leftmost,
// longest), the rest is normalized (NFC, Prepend, Replace), pre-tokenized (Split regexes,
// ByteLevel, Metaspace, Digits) and merged by rank. Decoding concatenates the tokens'
// bytes (▁ read as a space, <0xNN> as its byte; no clean-up of spaces; the Strip decoder
// cuts Llama 2's leading space), so decode(encode(x)) == x for NFC text with byte-level
// tokenizers. Invalid UTF-8 from byte tokens is kept as bytes (Hugging Face shows U+FFFD).
//
// A tokenizer is read-only after loading; encode and decode may run on several threads
// at once (a shared word cache and scratch buffers serve whichever thread holds them;
// the others encode without the cache, in buffers of their own).
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "ids.h"

typedef struct ct_tokenizer ct_tokenizer;


// The byte tokenizer: 256 bytes, then <|endoftext|> (256, bos/eos), <|im_start|> (257),
// <|im_end|> (258), <|pad|> (259); chat template ChatML.
int ct_tokenizer_bytes(ct_tokenizer **out);

// Loads tokenizer.json (and tokenizer_config.json, generation_config.json when present)
// from `dir`. Any Hugging Face byte-level or SentencePiece-style BPE tokenizer.json loads;
// anything else (a WordPiece or Unigram model, an unsupported normalizer, pre-tokenizer or
// decoder) fails naming the file and the field.
int ct_tokenizer_load(ct_tokenizer **out, const char *dir);
void ct_tokenizer_free(ct_tokenizer *t);

// Writes tokenizer.json and tokenizer_config.json into `dir` so that ct_tokenizer_load
// (and Hugging Face) read back the same tokenizer: a loaded tokenizer writes back the
// files it was loaded from, byte for byte (with the chat template replaced when
// ct_tokenizer_set_chat_template was called).
int ct_tokenizer_save(const ct_tokenizer *t, const char *dir);

int ct_tokenizer_vocab_size(const ct_tokenizer *t);  // largest id + 1
// Fits t to a model of V rows: added tokens with ids >= V are dropped (*dropped of them)
// and are plain text from then on, as Hugging Face's convert scripts leave them out
// (Gemma 3's tokenizer.json has <image_soft_token> at 262144; gemma-3-270m and 1b have
// 262,144 rows). A vocabulary (model.vocab) id or a special token id >= V is an error.
// The saved tokenizer.json stays the file that was loaded.
int ct_tokenizer_fit(ct_tokenizer *t, int V, int *dropped);
int ct_tokenizer_bos(const ct_tokenizer *t);         // -1 when none
int ct_tokenizer_eos(const ct_tokenizer *t);
int ct_tokenizer_pad(const ct_tokenizer *t);         // falls back to eos
bool ct_tokenizer_add_bos(const ct_tokenizer *t);    // prepend bos when encoding a document
bool ct_tokenizer_add_eos(const ct_tokenizer *t);    // append eos (tokenizer_config add_eos_token)
int ct_tokenizer_token_id(const ct_tokenizer *t, const char *token);  // -1 when absent

// Every id that ends a generation: eos, generation_config.json's eos_token_id(s), and the
// special tokens that end a turn or a document in common chat formats (<|im_end|>,
// <|endoftext|>, <|eot_id|>, <|eom_id|>, <|end_of_text|>, </s>, <end_of_turn>, ...)
// that this vocabulary has. Sorted, no duplicates; points into the tokenizer.
int ct_tokenizer_stop_ids(const ct_tokenizer *t, const int **ids);
bool ct_tokenizer_is_stop(const ct_tokenizer *t, int id);

// The bytes of one token (not NUL-terminated), or NULL with *len = 0 for an unused id.
const char *ct_tokenizer_token_bytes(const ct_tokenizer *t, int id, size_t *len);
bool ct_tokenizer_is_special(const ct_tokenizer *t, int id);

// Appends the ids of text[0, len) to out. With `special`, special-token strings in the
// text become their ids; without, they are encoded as plain text (non-special added
// tokens such as Qwen's <think> are always matched, as in Hugging Face).
int ct_tokenizer_encode(const ct_tokenizer *t, const char *text, size_t len, bool special,
                        ct_ids *out);

// A document's tokens (special strings matched): BOS first when the tokenizer adds one,
// and only one BOS when the text (e.g. a rendered chat template) already starts with it.
int ct_tokenizer_encode_doc(const ct_tokenizer *t, const char *text, size_t len, ct_ids *out);

// As ct_tokenizer_encode, and also appends to `offsets` the byte offset in text where
// each token starts (text must be shorter than 2 GiB).
int ct_tokenizer_encode_offsets(const ct_tokenizer *t, const char *text, size_t len, bool special,
                                ct_ids *out, ct_ids *offsets);

// Decodes ids into a malloc'd NUL-terminated string (*len bytes before the NUL).
int ct_tokenizer_decode(const ct_tokenizer *t, const int *ids, int n, char **out, size_t *len);
// Bytes ct_tokenizer_save writes (tokenizer.json and tokenizer_config.json, about).
double ct_tokenizer_saved_bytes(const ct_tokenizer *t);

// Bytes at the start of a decoded text (s[0, n), token bytes back to back) that the
// tokenizer's Strip decoder removes: 1 space for Llama 2-style tokenizers, else 0. A text
// built token by token (the sampler's) starts after them, as decode's does.
size_t ct_tokenizer_decode_lead(const ct_tokenizer *t, const char *s, size_t n);

// Renders a conversation (a JSON array of {"role","content"}) with the tokenizer's chat
// template into a malloc'd string.
int ct_tokenizer_chat(const ct_tokenizer *t, const json_t *messages, bool add_generation_prompt,
                      char **out);


typedef struct {
  bool add_generation_prompt;
  const json_t *tools;  // a JSON list of tool schemas, or NULL
  const json_t *extra;  // a JSON object of further template variables (e.g. enable_thinking), or NULL
} ct_chat_opts;

// The full form of ct_tokenizer_chat: *out (malloc'd, NUL-terminated, *len bytes) and,
// when gen is not NULL, the byte ranges the template marked with {% generation %} ...
// {% endgeneration %} (malloc'd; *ngen of them, in order; none when the template has no
// markers). Those are the assistant tokens for assistant_only_loss.
int ct_tokenizer_chat_render(const ct_tokenizer *t, const json_t *messages, const ct_chat_opts *opts,
                             char **out, size_t *len, ct_span **gen, int *ngen);

// Replaces the chat template (e.g. from a user's .jinja file); `where` names it in
// messages. A template that does not parse is an error here (CT_EFORMAT, with line:col).
// ct_tokenizer_save then writes it into tokenizer_config.json.
int ct_tokenizer_set_chat_template(ct_tokenizer *t, const char *src, size_t len, const char *where);
// Replaces t's chat template with the one at path (TRL's chat_template_path: a Jinja file
// or a tokenizer directory, as ct_chat_template_read takes it; a template that does not
// parse is CT_EFORMAT with line:col).
int ct_tokenizer_load_chat_template(ct_tokenizer *t, const char *path);

// The chat template's source, or NULL when there is none.
const char *ct_tokenizer_chat_template_src(const ct_tokenizer *t);

// True when the chat template has {% generation %} markers.
bool ct_tokenizer_chat_has_generation(const ct_tokenizer *t);

// Encodes a rendered conversation (special tokens as ids) and sets mask->v[i] to 1 for
// each token that overlaps one of the spans (ordered and disjoint, as from
// ct_tokenizer_chat_render), else 0. ids and mask grow in step.
int ct_tokenizer_encode_masked(const ct_tokenizer *t, const char *text, size_t len,
                               const ct_span *spans, int nspans, ct_ids *ids, ct_ids *mask);
