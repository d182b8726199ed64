// rope: the RoPE tables a model holds, without and with Llama 3.1's "llama3"
// rope_scaling, against inverse frequencies worked out in double from the published
// formula (transformers' _compute_llama3_parameters):
//   inv = theta^(-2i/hd); wavelen = 2π / inv
//   wavelen < original_max / high_freq_factor: kept
//   wavelen > original_max / low_freq_factor:  inv / factor
//   otherwise smooth = (original_max / wavelen − low) / (high − low),
//             inv = (1 − smooth) · inv / factor + smooth · inv
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "test.h"

enum { HD = 64, HALF = HD / 2, MAXPOS = 8200 };

// Llama 3.1 8B's rope settings (theta 500000, factor 8, low 1, high 4, 8192) on a
// tiny model. hd = 64 makes 2i/hd exact in float32 too, as transformers computes it.
static ct_model_config cfg(int rope_type) {
  ct_model_config c = {.model_type = "llama", .vocab_size = 11, .hidden_size = 128,
                       .intermediate_size = 16, .num_layers = 1, .num_heads = 2,
                       .num_kv_heads = 1, .head_dim = HD, .max_position_embeddings = 131072,
                       .rope_theta = 500000, .rms_norm_eps = 1e-5f, .tie_word_embeddings = true,
                       .bos_token_id = -1, .eos_token_id = -1, .pad_token_id = -1};
  if (rope_type) {
    c.rope_type = 1;
    c.rope_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4;
    c.rope_original_max_pos = 8192;
  }
  return c;
}

// The reference inverse frequencies; counts how many fall in each regime.
static void ref_inv_freq(const ct_model_config *c, double *inv, int regimes[3]) {
  for (int i = 0; i < HALF; i++) inv[i] = 1.0 / pow(c->rope_theta, 2.0 * i / HD);
  if (!c->rope_type) return;
  double factor = c->rope_factor, low = c->rope_low_freq_factor, high = c->rope_high_freq_factor;
  double orig = c->rope_original_max_pos;
  double low_freq_wavelen = orig / low, high_freq_wavelen = orig / high;
  for (int i = 0; i < HALF; i++) {
    double wavelen = 2 * M_PI / inv[i];
    if (wavelen < high_freq_wavelen) {
      regimes[0]++;
    } else if (wavelen > low_freq_wavelen) {
      inv[i] /= factor;
      regimes[1]++;
    } else {
      double smooth = (orig / wavelen - low) / (high - low);
      inv[i] = (1 - smooth) * inv[i] / factor + smooth * inv[i];
      regimes[2]++;
    }
  }
}

// Every entry of the model's table at a few positions, and the inverse frequencies
// themselves (read back from position 1: atan2(sin, cos) = inv there, as inv < π).
static void check_table(int rope_type) {
  ct_model_config c = cfg(rope_type);
  ct_model m;
  CHECK_OK(ct_model_init(&m, &c, MAXPOS));
  CHECK(m.rope_max_pos >= MAXPOS);
  double inv[HALF];
  int regimes[3] = {0, 0, 0};
  ref_inv_freq(&c, inv, regimes);
  if (rope_type) {  // the config exercises all three branches of the formula
    fprintf(stderr, "    kept %d, divided %d, smoothed %d\n", regimes[0], regimes[1], regimes[2]);
    CHECK(regimes[0] > 0 && regimes[1] > 0 && regimes[2] > 0);
  }
  double worst_inv = 0, worst = 0;
  int bad = 0;
  for (int i = 0; i < HALF; i++) {
    double got = atan2(m.rope_sin[HALF + i], m.rope_cos[HALF + i]);
    double rel = fabs(got - inv[i]) / inv[i];
    worst_inv = fmax(worst_inv, rel);
    if (!(rel < 1e-6)) {
      if (bad++ < 5) fprintf(stderr, "    inv_freq[%d]: table %.9g, formula %.9g\n", i, got, inv[i]);
    }
  }
  const int pos[] = {0, 1, 2, 17, 100, 1000, 2048, 4095, 8191, MAXPOS - 1};
  for (size_t k = 0; k < sizeof pos / sizeof pos[0]; k++)
    for (int i = 0; i < HALF; i++) {
      double angle = pos[k] * inv[i];
      // float inv_freq and float p·inv_freq: relative rounding of the angle, ~1e-7
      double tol = 1e-6 + 3e-7 * angle;
      long at = (long)pos[k] * HALF + i;
      double dc = fabs(m.rope_cos[at] - cos(angle)), ds = fabs(m.rope_sin[at] - sin(angle));
      worst = fmax(worst, fmax(dc, ds));
      if (!(dc <= tol && ds <= tol)) {
        if (bad++ < 10)
          fprintf(stderr, "    pos %d, i %d: cos %.9g vs %.9g, sin %.9g vs %.9g\n", pos[k], i,
                  m.rope_cos[at], cos(angle), m.rope_sin[at], sin(angle));
      }
    }
  fprintf(stderr, "    worst inv_freq rel diff %.3g, worst cos/sin diff %.3g\n", worst_inv, worst);
  CHECK(bad == 0);
  // ct_rope_fill, the function the table comes from, gives the very same bits
  float *cs = malloc(sizeof(float) * MAXPOS * HALF), *sn = malloc(sizeof(float) * MAXPOS * HALF);
  ct_rope_fill(&c, MAXPOS, cs, sn);
  CHECK(memcmp(cs, m.rope_cos, sizeof(float) * MAXPOS * HALF) == 0);
  CHECK(memcmp(sn, m.rope_sin, sizeof(float) * MAXPOS * HALF) == 0);
  free(cs);
  free(sn);
  ct_model_free(&m);
}

static void test_default_rope_table_matches_the_formula(void) { check_table(0); }

static void test_llama3_scaled_rope_table_matches_the_formula(void) { check_table(1); }

// Scaling changes the low frequencies only: high-frequency dims are bit-identical to the
// unscaled table, the lowest ones rotate exactly `factor` times slower.
static void test_llama3_scaling_keeps_high_and_divides_low_frequencies(void) {
  ct_model_config c0 = cfg(0), c1 = cfg(1);
  static float cos0[MAXPOS * HALF], sin0[MAXPOS * HALF], cos1[MAXPOS * HALF], sin1[MAXPOS * HALF];
  ct_rope_fill(&c0, MAXPOS, cos0, sin0);
  ct_rope_fill(&c1, MAXPOS, cos1, sin1);
  int p = 1000;
  for (int i = 0; i < 4; i++) {  // wavelengths 2π .. 2π·500000^(6/64): far below 2048
    CHECK(cos0[p * HALF + i] == cos1[p * HALF + i]);
    CHECK(sin0[p * HALF + i] == sin1[p * HALF + i]);
  }
  // the lowest frequency: angle at position 8p scaled == angle at position p unscaled
  int i = HALF - 1;
  double a0 = atan2(sin0[p * HALF + i], cos0[p * HALF + i]);
  double a1 = atan2(sin1[8 * p * HALF + i], cos1[8 * p * HALF + i]);
  CHECK_NEAR(a1, a0, 1e-6 * a0);
  CHECK(fabs(cos0[(8 * p) * HALF + i] - cos1[(8 * p) * HALF + i]) > 1e-3 ||
        fabs(sin0[(8 * p) * HALF + i] - sin1[(8 * p) * HALF + i]) > 1e-3);
}

int main(void) {
  RUN(test_default_rope_table_matches_the_formula);
  RUN(test_llama3_scaled_rope_table_matches_the_formula);
  RUN(test_llama3_scaling_keeps_high_and_divides_low_frequencies);
  return test_summary();
}
