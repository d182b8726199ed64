// ids: the two small value types the text modules pass around — a growable array of
// token ids, and a byte range of a rendered text. Their own header so that jinja, the
// tokenizer and the data readers share them without including each other.
#pragma once
#include <stddef.h>

// A growable array of token ids.
typedef struct {
  int *v;
  int n, cap;
} ct_ids;
int ct_ids_push(ct_ids *ids, int id);
void ct_ids_free(ct_ids *ids);

// A byte range [start, end) of a rendered conversation.
typedef struct {
  size_t start, end;
} ct_span;
