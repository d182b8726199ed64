// tools_template: the byte tokenizer with a chat template that shows what reaches it (the
// first tool's name and a kwarg), for the tests that data rows pass their tools and
// chat_template_kwargs to the template.
#pragma once
#include <string.h>

#include "test.h"
#include "tokenizer.h"

static const char TOOLS_TEMPLATE[] =
    "{% if tools %}[{{ tools[0].name }}]{% endif %}{% if flag %}<flag>{% endif %}"
    "{% for m in messages %}{{ m.content }};{% endfor %}";

// A byte tokenizer whose chat template is TOOLS_TEMPLATE: "[tool]<flag>" when the row
// carries them, then each message's content and ";".
static inline ct_tokenizer *tools_tokenizer(void) {
  ct_tokenizer *t;
  CHECK_OK(ct_tokenizer_bytes(&t));
  CHECK_OK(ct_tokenizer_set_chat_template(t, TOOLS_TEMPLATE, strlen(TOOLS_TEMPLATE), "test"));
  return t;
}
