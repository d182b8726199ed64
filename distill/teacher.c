// distill/teacher: the teacher as a frozen model: loaded, run forward over a batch (its
// final hidden states of the target rows), asked for logit chunks by the soft loss; and
// the check that it speaks the student's vocabulary.
#include <stdlib.h>
#include <string.h>

#include "distill/distill.h"
#include "error.h"

int ct_distill_teacher_load(ct_distill_teacher *t, const ct_config *c, int B, int T) {
  int dtype = c->teacher_dtype;
  t->hidden = NULL;
  int rc = ct_frozen_open(&t->f, c->teacher_path, dtype, B, T);
  if (rc) return ct_wrap_error(rc, "teacher");
  t->hidden = malloc(sizeof(float) * (size_t)B * T * t->f.cfg.hidden_size);
  return t->hidden ? 0 : ct_set_error(CT_ENOMEM, "teacher: out of memory");
}

void ct_distill_teacher_free(ct_distill_teacher *t) {
  ct_frozen_free(&t->f);
  free(t->hidden);
}

int ct_distill_teacher_forward(ct_distill_teacher *t, const ct_batch *b) {
  int rc = ct_frozen_hidden(&t->f, b, t->hidden);
  return rc < 0 ? ct_wrap_error(rc, "teacher") : 0;
}

void ct_distill_teacher_chunk(void *ctx, int n, int v0, int nv, float *out) {
  ct_distill_teacher *t = ctx;
  ct_frozen_logits(&t->f, t->hidden, n, v0, nv, out);
}

int ct_distill_check_vocabularies(const ct_config *cfg, const ct_tokenizer *student) {
  ct_tokenizer *tt;
  if (ct_tokenizer_load_said(NULL, &tt, cfg->teacher_path))
    return ct_wrap_error(CT_EIO, "%s: key 'teacher_path'", ct_config_origin(cfg, "teacher_path"));
  int V = ct_tokenizer_vocab_size(student), rc = 0;
  if (ct_tokenizer_vocab_size(tt) != V)
    rc = ct_set_error(CT_EINVAL, "the teacher's tokenizer has %d tokens, the student's %d: "
                      "distillation needs one vocabulary", ct_tokenizer_vocab_size(tt), V);
  for (int id = 0; id < V && !rc; id++) {
    size_t a, b;
    const char *x = ct_tokenizer_token_bytes(student, id, &a), *y = ct_tokenizer_token_bytes(tt, id, &b);
    if (a != b || (a && memcmp(x, y, a)))
      rc = ct_set_error(CT_EINVAL, "the teacher's and the student's tokenizers differ at token "
                        "id %d: distillation needs one vocabulary", id);
  }
  ct_tokenizer_free(tt);
  return rc;
}
