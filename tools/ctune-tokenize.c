// ctune-tokenize: shows what the trainers see — token ids of text, text of ids, and
// conversations rendered with the model's chat template. Reads JSONL on stdin, writes
// JSONL on stdout, one output row per input row, in order.
//
//   ctune-tokenize encode tokenizer_path=DIR [add_special_tokens=true] [special=true]
//       {"text": "..."}         -> {"input_ids": [...]}
//   ctune-tokenize decode tokenizer_path=DIR
//       {"input_ids": [...]}    -> {"text": "..."}
//   ctune-tokenize chat tokenizer_path=DIR [add_generation_prompt=false] [tokenize=false]
//                       [template=FILE.jinja]
//       {"messages": [...], "tools"?: [...], "chat_template_kwargs"?: {...},
//        "add_generation_prompt"?: bool (overrides the option for that row)}
//       -> {"text": "..."} (+ "input_ids" and "assistant_masks" with tokenize=true;
//       + "generation_spans" when the template marks assistant text with {% generation %})
//   ctune-tokenize toolcall tokenizer_path=DIR [template=FILE.jinja]
//       {"text": "<a model turn>", "tool_messages"?: [...], "tools"?, "chat_template_kwargs"?}
//       -> {"format": "hermes"|"llama3_json", "calls": [...]} (+ "suffix_ids" and "suffix":
//       the tokens GRPO feeds after the turn's end-of-turn token to give tool_messages back)
//   ctune-tokenize info tokenizer_path=DIR
//       one row: vocab size, special ids, stop ids, chat template facts
//   Every command but info and bench: on_error=stop (default: stop at the first bad row,
//   exit 1) or on_error=row (write {"error": "..."} for that row and go on).
//   ctune-tokenize export [tokenizer_path=DIR] out=DIR
//       writes tokenizer.json and tokenizer_config.json as checkpoints carry them
//   ctune-tokenize bench tokenizer_path=DIR input=FILE [reps=3]
//       encoding speed of FILE's text in MB/s (best of reps, loading excluded)
//
// tokenizer_path holds tokenizer.json (and tokenizer_config.json when present); without
// it the built-in byte tokenizer is used. Exit status: 0 ok, 1 bad input or files
// (one line on stderr naming the row), 2 usage.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "error.h"
#include "fs.h"
#include "log.h"
#include "tokenizer.h"
#include "toolcall.h"

static int usage(FILE *f) {
  fputs("usage: ctune-tokenize encode|decode|chat|toolcall|info tokenizer_path=DIR [key=value ...]\n"
        "  encode: rows {\"text\"} -> {\"input_ids\"}; add_special_tokens=true|false (bos/eos as\n"
        "          the tokenizer adds them, default true), special=true|false (special-token\n"
        "          strings in the text become their ids, default true)\n"
        "  decode: rows {\"input_ids\"} -> {\"text\"}\n"
        "  chat:   rows {\"messages\", \"tools\"?} -> {\"text\"}; add_generation_prompt=true|false\n"
        "          (default false), tokenize=true|false (also input_ids and assistant_masks)\n"
        "          template=FILE uses that chat template instead of tokenizer_config.json's;\n"
        "          a row's chat_template_kwargs object adds template variables\n"
        "  on_error=stop|row: stop at the first bad row (default) or write {\"error\"} rows\n"
        "  toolcall: rows {\"text\", \"tool_messages\"?} -> {\"format\", \"calls\", \"suffix_ids\"?}:\n"
        "          the tool calls GRPO reads from a turn, and the tokens that give results back\n"
        "  info:   vocabulary size, special and stop ids, chat template facts\n"
        "  export: out=DIR writes tokenizer.json + tokenizer_config.json (checkpoint form)\n"
        "  bench:  input=FILE [reps=3]: encoding speed in MB/s\n",
        f);
  return f == stdout ? 0 : 2;  // --help: exit 0
}

static int parse_bool(const char *key, const char *v, bool *out) {
  if (!strcmp(v, "true") || !strcmp(v, "1")) *out = true;
  else if (!strcmp(v, "false") || !strcmp(v, "0")) *out = false;
  else {
    fprintf(stderr, "ctune-tokenize: %s: expected true or false, got '%s'\n", key, v);
    return 2;
  }
  return 0;
}

// Output buffer: ids are formatted by hand, a row can hold millions of them.
typedef struct {
  char *p;
  size_t n, cap;
} obuf;

static void ob_put(obuf *b, const char *s, size_t n) {
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->n + n) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      fputs("ctune-tokenize: out of memory\n", stderr);
      exit(1);
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
}
static void ob_puts(obuf *b, const char *s) { ob_put(b, s, strlen(s)); }

static void ob_ids(obuf *b, const int *v, int n) {
  char tmp[16];
  ob_put(b, "[", 1);
  for (int i = 0; i < n; i++) ob_put(b, tmp, (size_t)snprintf(tmp, sizeof tmp, i ? ", %d" : "%d", v[i]));
  ob_put(b, "]", 1);
}

static void ob_json(obuf *b, const json_t *j) {
  char *s = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
  if (!s) {
    fputs("ctune-tokenize: out of memory\n", stderr);
    exit(1);
  }
  ob_puts(b, s);
  free(s);
}

static void ob_string(obuf *b, const char *s, size_t n) {
  json_t *j = json_stringn_nocheck(s, n);
  ob_json(b, j);
  json_decref(j);
}

static void flush(obuf *b) {
  if (b->n && fwrite(b->p, 1, b->n, stdout) != b->n) {
    fputs("ctune-tokenize: write error\n", stderr);
    exit(1);
  }
  b->n = 0;
}

// A whole file, or NULL after saying why on stderr.
static char *read_all(const char *path, size_t *len) {
  char *text;
  if (ct_read_file(path, &text, len, NULL)) {
    fprintf(stderr, "ctune-tokenize: %s\n", ct_last_error());
    return NULL;
  }
  return text;
}

// The command line: the command and its key=value options.
typedef struct {
  const char *cmd, *dir, *template_file, *input, *out_dir;
  int reps;
  bool add_special, special, gen_prompt, tokenize, row_errors;
} opts;

// Encoding speed over a file: the first pass starts with an empty word cache.
static int bench(const ct_tokenizer *t, const opts *o) {
  const char *input = o->input;
  int reps = o->reps;
  if (!input) {
    fputs("ctune-tokenize: bench needs input=FILE\n", stderr);
    return 2;
  }
  size_t len;
  char *text = read_all(input, &len);
  if (!text) return 1;
  ct_ids ids = {0};
  double best = 1e30, first = 0;
  for (int r = 0; r < reps; r++) {
    ids.n = 0;
    double t0 = ct_now();
    if (ct_tokenizer_encode(t, text, len, true, &ids)) {
      fprintf(stderr, "ctune-tokenize: %s\n", ct_last_error());
      free(text);
      ct_ids_free(&ids);
      return 1;
    }
    double dt = ct_now() - t0;
    if (r == 0) first = dt;
    if (dt < best) best = dt;
  }
  printf("%.2f MB/s (%d tokens, %zu bytes, best of %d: %.3f s; first pass %.2f MB/s)\n", (double)len / 1e6 / best,
         ids.n, len, reps, best, (double)len / 1e6 / first);
  free(text);
  ct_ids_free(&ids);
  return 0;
}

// export: tokenizer.json and tokenizer_config.json into out=DIR.
static int export_files(const ct_tokenizer *t, const opts *o) {
  int rc = o->out_dir ? ct_tokenizer_save(t, o->out_dir) : -1;
  if (!o->out_dir) fputs("ctune-tokenize: export needs out=DIR\n", stderr);
  else if (rc) fprintf(stderr, "ctune-tokenize: %s\n", ct_last_error());
  return rc ? 1 : 0;
}

// info: one row of the tokenizer's facts.
static int info(const ct_tokenizer *t, const opts *o) {
  (void)o;
  obuf ob = {0};
  const int *stops;
  int nstops = ct_tokenizer_stop_ids(t, &stops);
  json_t *st = json_array();
  for (int i = 0; i < nstops; i++) json_array_append_new(st, json_integer(stops[i]));
  json_t *info = json_pack("{s:i,s:i,s:i,s:i,s:b,s:b,s:o,s:b}", "vocab_size", ct_tokenizer_vocab_size(t),
                           "bos_token_id", ct_tokenizer_bos(t), "eos_token_id", ct_tokenizer_eos(t),
                           "pad_token_id", ct_tokenizer_pad(t), "add_bos_token", ct_tokenizer_add_bos(t),
                           "add_eos_token", ct_tokenizer_add_eos(t), "stop_token_ids", st,
                           "chat_template_has_generation", ct_tokenizer_chat_has_generation(t));
  ob_json(&ob, info);
  ob_puts(&ob, "\n");
  json_decref(info);
  flush(&ob);
  free(ob.p);
  return 0;
}

// One row of each JSONL command: its output appended to ob, or why it failed (ob may
// then hold part of the row, which the caller cuts).

static const char *encode_row(const ct_tokenizer *t, const opts *o, const json_t *j, ct_ids *ids, obuf *ob) {
  const json_t *text = json_object_get(j, "text");
  if (!json_is_string(text)) return "key 'text': expected a string";
  if (o->add_special && ct_tokenizer_add_bos(t)) ct_ids_push(ids, ct_tokenizer_bos(t));
  if (ct_tokenizer_encode(t, json_string_value(text), json_string_length(text), o->special, ids))
    return ct_last_error();
  if (o->add_special && ct_tokenizer_add_eos(t)) ct_ids_push(ids, ct_tokenizer_eos(t));
  ob_puts(ob, "{\"input_ids\": ");
  ob_ids(ob, ids->v, ids->n);
  ob_puts(ob, "}\n");
  return NULL;
}

static const char *decode_row(const ct_tokenizer *t, const json_t *j, ct_ids *ids, obuf *ob) {
  const json_t *in = json_object_get(j, "input_ids");
  if (!json_is_array(in)) return "key 'input_ids': expected a list of integers";
  for (size_t i = 0; i < json_array_size(in); i++) {
    const json_t *x = json_array_get(in, i);
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 0x7fffffff)
      return "key 'input_ids': expected a list of non-negative integers";
    ct_ids_push(ids, (int)json_integer_value(x));
  }
  char *s;
  size_t len;
  if (ct_tokenizer_decode(t, ids->v, ids->n, &s, &len)) return ct_last_error();
  ob_puts(ob, "{\"text\": ");
  ob_string(ob, s, len);
  ob_puts(ob, "}\n");
  free(s);
  return NULL;
}

static const char *chat_row(const ct_tokenizer *t, const opts *o, const json_t *j, ct_ids *ids, ct_ids *mask,
                            obuf *ob) {
  const json_t *messages = json_object_get(j, "messages");
  const json_t *agp = json_object_get(j, "add_generation_prompt");
  ct_chat_opts co = {.add_generation_prompt = json_is_boolean(agp) ? json_is_true(agp) : o->gen_prompt,
                     .tools = json_object_get(j, "tools"), .extra = json_object_get(j, "chat_template_kwargs")};
  char *s;
  size_t len;
  ct_span *gen;
  int ngen;
  if (!messages) return "key 'messages': missing";
  if (ct_tokenizer_chat_render(t, messages, &co, &s, &len, &gen, &ngen)) return ct_last_error();
  const char *msg = NULL;
  ob_puts(ob, "{\"text\": ");
  ob_string(ob, s, len);
  if (ngen) {
    char buf[256];
    ob_puts(ob, ", \"generation_spans\": [");
    for (int i = 0; i < ngen; i++) {
      snprintf(buf, sizeof buf, "%s[%zu, %zu]", i ? ", " : "", gen[i].start, gen[i].end);
      ob_puts(ob, buf);
    }
    ob_puts(ob, "]");
  }
  if (o->tokenize) {
    if (ct_tokenizer_encode_masked(t, s, len, gen, ngen, ids, mask)) {
      msg = ct_last_error();
    } else {
      ob_puts(ob, ", \"input_ids\": ");
      ob_ids(ob, ids->v, ids->n);
      ob_puts(ob, ", \"assistant_masks\": ");
      ob_ids(ob, mask->v, mask->n);
    }
  }
  ob_puts(ob, "}\n");
  free(s);
  free(gen);
  return msg;
}

static const char *toolcall_row(const ct_tokenizer *t, const json_t *j, ct_ids *ids, obuf *ob) {
  const json_t *text = json_object_get(j, "text"), *msgs = json_object_get(j, "tool_messages");
  if (!json_is_string(text)) return "key 'text': expected a string";
  if (msgs && (!json_is_array(msgs) || !json_array_size(msgs))) return "key 'tool_messages': expected a non-empty list";
  int fmt = ct_toolcall_format_of(ct_tokenizer_chat_template_src(t));
  if (fmt < 0) return "the chat template shows no tool-call format ctune reads (<tool_call> blocks, Llama 3 JSON)";
  json_t *calls = ct_toolcall_parse(fmt, json_string_value(text), json_string_length(text));
  if (!calls) return "out of memory";
  ct_chat_opts co = {.tools = json_object_get(j, "tools"), .extra = json_object_get(j, "chat_template_kwargs")};
  if (msgs && ct_toolcall_suffix(t, msgs, &co, ids)) {
    json_decref(calls);
    return ct_last_error();
  }
  ob_puts(ob, "{\"format\": ");
  ob_string(ob, ct_toolcall_format_names[fmt], strlen(ct_toolcall_format_names[fmt]));
  ob_puts(ob, ", \"calls\": ");
  ob_json(ob, calls);
  json_decref(calls);
  if (msgs) {
    char *s;
    size_t len;
    if (ct_tokenizer_decode(t, ids->v, ids->n, &s, &len)) return ct_last_error();
    ob_puts(ob, ", \"suffix_ids\": ");
    ob_ids(ob, ids->v, ids->n);
    ob_puts(ob, ", \"suffix\": ");
    ob_string(ob, s, len);
    free(s);
  }
  ob_puts(ob, "}\n");
  return NULL;
}

// on_error=row: the row's output is {"error": "<stdin>:ROW: why"}.
static void error_row(obuf *ob, long row, const char *msg) {
  char where[64];
  snprintf(where, sizeof where, "<stdin>:%ld: ", row);
  size_t ml = strlen(where) + strlen(msg);
  char *full = malloc(ml + 1);
  if (full) {
    snprintf(full, ml + 1, "%s%s", where, msg);
    ob_puts(ob, "{\"error\": ");
    ob_string(ob, full, ml);
    ob_puts(ob, "}\n");
    free(full);
  }
}

// encode, decode, chat: JSONL rows from stdin, one output row each, in order. A row that
// fails leaves no partial output; it stops the run (exit 1) or, with on_error=row,
// becomes an error row.
static int rows(const ct_tokenizer *t, const opts *o) {
  obuf ob = {0};
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  long row = 0;
  ct_ids ids = {0}, mask = {0};
  int status = 0;
  while ((got = getline(&line, &cap, stdin)) > 0) {
    row++;
    size_t n = (size_t)got;
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
    if (n == 0) continue;
    json_error_t err;
    json_t *j = json_loadb(line, n, 0, &err);
    const char *msg = NULL;
    char buf[256];
    if (!j) {
      snprintf(buf, sizeof buf, "not JSON: %s (column %d)", err.text, err.column);
      msg = buf;
    } else if (!json_is_object(j)) {
      msg = "expected a JSON object";
    }
    ids.n = 0;
    mask.n = 0;
    size_t mark = ob.n;
    if (!msg && !strcmp(o->cmd, "encode")) msg = encode_row(t, o, j, &ids, &ob);
    else if (!msg && !strcmp(o->cmd, "decode")) msg = decode_row(t, j, &ids, &ob);
    else if (!msg && !strcmp(o->cmd, "toolcall")) msg = toolcall_row(t, j, &ids, &ob);
    else if (!msg) msg = chat_row(t, o, j, &ids, &mask, &ob);
    if (msg) ob.n = mark;
    if (msg && o->row_errors) {
      error_row(&ob, row, msg);
      msg = NULL;
    }
    json_decref(j);
    if (msg) {
      flush(&ob);
      fprintf(stderr, "ctune-tokenize: <stdin>:%ld: %s\n", row, msg);
      status = 1;
      break;
    }
    if (ob.n > (1 << 20)) flush(&ob);
  }
  flush(&ob);
  if (fflush(stdout)) {
    fputs("ctune-tokenize: write error\n", stderr);
    status = 1;
  }
  free(line);
  free(ob.p);
  ct_ids_free(&ids);
  ct_ids_free(&mask);
  return status;
}

static const struct {
  const char *name;
  int (*run)(const ct_tokenizer *t, const opts *o);
} commands[] = {
    {"encode", rows}, {"decode", rows}, {"chat", rows}, {"toolcall", rows}, {"info", info}, {"bench", bench}, {"export", export_files},
};

// The options after the command (argv[2..]); 0, or the exit status of a usage error.
static int parse_args(int argc, char **argv, opts *o) {
  *o = (opts){.cmd = argv[1], .reps = 3, .add_special = true, .special = true};
  for (int i = 2; i < argc; i++) {
    char *eq = strchr(argv[i], '=');
    if (!eq) return usage(stderr);
    *eq = 0;
    const char *k = argv[i], *v = eq + 1;
    int rc = 0;
    if (!strcmp(k, "tokenizer_path")) o->dir = v;
    else if (!strcmp(k, "add_special_tokens")) rc = parse_bool(k, v, &o->add_special);
    else if (!strcmp(k, "special")) rc = parse_bool(k, v, &o->special);
    else if (!strcmp(k, "add_generation_prompt")) rc = parse_bool(k, v, &o->gen_prompt);
    else if (!strcmp(k, "tokenize")) rc = parse_bool(k, v, &o->tokenize);
    else if (!strcmp(k, "template")) o->template_file = v;
    else if (!strcmp(k, "on_error")) {
      if (strcmp(v, "stop") && strcmp(v, "row")) {
        fprintf(stderr, "ctune-tokenize: on_error: expected stop or row, got '%s'\n", v);
        return 2;
      }
      o->row_errors = !strcmp(v, "row");
    }
    else if (!strcmp(k, "input")) o->input = v;
    else if (!strcmp(k, "out")) o->out_dir = v;
    else if (!strcmp(k, "reps")) o->reps = atoi(v) > 0 ? atoi(v) : 1;
    else {
      fprintf(stderr, "ctune-tokenize: unknown key '%s'\n", k);
      return 2;
    }
    if (rc) return rc;
  }
  return 0;
}

// tokenizer_path's tokenizer (or the byte tokenizer), with template= as its chat
// template; 0, or 1 after saying why on stderr.
static int load_tokenizer(const opts *o, ct_tokenizer **out) {
  ct_tokenizer *t;
  int rc = o->dir ? ct_tokenizer_load(&t, o->dir) : ct_tokenizer_bytes(&t);
  if (rc) {
    fprintf(stderr, "ctune-tokenize: %s\n", ct_last_error());
    return 1;
  }
  if (o->template_file) {
    size_t len;
    char *src = read_all(o->template_file, &len);
    rc = src ? ct_tokenizer_set_chat_template(t, src, len, o->template_file) : 1;
    free(src);
    if (rc) {
      if (src) fprintf(stderr, "ctune-tokenize: %s\n", ct_last_error());
      ct_tokenizer_free(t);
      return 1;
    }
  }
  *out = t;
  return 0;
}

int main(int argc, char **argv) {
  if (ct_config_help_asked(argc, argv)) return usage(stdout);
  if (argc < 2) return usage(stderr);
  opts o;
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc;
  int (*run)(const ct_tokenizer *t, const opts *o) = NULL;
  for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
    if (!strcmp(o.cmd, commands[k].name)) run = commands[k].run;
  if (!run) return usage(stderr);
  ct_tokenizer *t;
  if (load_tokenizer(&o, &t)) return 1;
  rc = run(t, &o);
  ct_tokenizer_free(t);
  return rc;
}
