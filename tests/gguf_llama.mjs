// Checks a GGUF file written by bin/ctune-ckpt gguf against the real llama.cpp
// (node-llama-cpp's prebuilt CPU build) and an independent parser (@huggingface/gguf).
//
//   node tests/gguf_llama.mjs CACHE_DIR CASE.json...
//
// CACHE_DIR is what scripts/llama-cpp-ref.sh prints. Each CASE.json:
//   {"label", "file": the .gguf, "strict": bool, "prompt": text, "prompt_ids": ctune's ids of it,
//    "ids": bin/sampler's greedy completion ids, "logprobs": their log-probabilities,
//    "stopped": true when the last id is the stop token sampler ended on,
//    "tensors": names the file must hold, "absent": names it must not, "chat_template",
//    "chat_text", "chat_ids": a conversation rendered with it and ctune's ids of that,
//    "texts", "texts_ids": more texts and ctune's ids of them (no special tokens),
//    "corpus", "corpus_ids": optional texts and ctune's ids of them (special tokens matched,
//    as ctune and transformers match them in any text: llama.cpp's parse_special),
//    "meta": optional {key: value} the header must hold exactly (arrays: their length),
//    "token_types": optional {token: tokenizer.ggml.token_type} (1 normal, 2 unknown,
//    3 control, 4 user-defined, 6 byte)}
// Prints one summary line per case. Exits 1 when the header is wrong (tensors, alignment, chat
// template) or llama.cpp tokenizes the prompt, the texts or the chat text otherwise than ctune; with strict (f32)
// also unless llama.cpp continues it greedily with the same tokens, each token's
// log-probability within 0.05 of ctune's (llama.cpp keeps its KV cache in f16).
// Otherwise (f16, bf16, q8_0) it reports how many tokens agree.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [cache, ...caseFiles] = process.argv.slice(2);
const mod = (p) => import(pathToFileURL(path.join(cache, "node_modules", p)).href);
const { getLlama } = await mod("node-llama-cpp/dist/index.js");
const { gguf } = await mod("@huggingface/gguf/dist/index.mjs");
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const llama = await getLlama({ gpu: false, logLevel: "error" });
let failed = false;
for (const caseFile of caseFiles) failed = !(await check(JSON.parse(fs.readFileSync(caseFile, "utf8")))) || failed;
await llama.dispose();
process.exit(failed ? 1 : 0);

async function check(c) {
  const file = c.file;
  const errors = [];  // fatal whatever the type
  const strictErrors = [];  // fatal for f32

  // 1. the header, read by another implementation
  const hf = await gguf(file, { allowLocalFile: true });
  const size = BigInt(fs.statSync(file).size);
  const names = new Set(hf.tensorInfos.map((t) => t.name));
  for (const n of c.tensors ?? []) if (!names.has(n)) errors.push(`no tensor ${n}`);
  for (const n of c.absent ?? []) if (names.has(n)) errors.push(`unexpected tensor ${n}`);
  if (hf.tensorDataOffset % 32n) errors.push(`data section at ${hf.tensorDataOffset}, not 32-aligned`);
  for (const t of hf.tensorInfos) {
    if (t.offset % 32n) errors.push(`${t.name} at offset ${t.offset}, not 32-aligned`);
    if (hf.tensorDataOffset + t.offset > size) errors.push(`${t.name} starts past the end of the file`);
  }
  for (const [k, want] of Object.entries(c.meta ?? {})) {
    const v = hf.metadata[k], got = Array.isArray(v) ? v.length : typeof v === "bigint" ? Number(v) : v;
    if ((got ?? null) !== want) errors.push(`${k} is ${JSON.stringify(got ?? null)}, expected ${JSON.stringify(want)}`);
  }
  const tokens = hf.metadata["tokenizer.ggml.tokens"] ?? [], types = hf.metadata["tokenizer.ggml.token_type"] ?? [];
  for (const [t, want] of Object.entries(c.token_types ?? {})) {
    const i = tokens.indexOf(t);
    if (i < 0 || types[i] !== want) errors.push(`token ${t} has type ${i < 0 ? "(absent)" : types[i]}, expected ${want}`);
  }
  if (c.chat_template !== undefined && (hf.metadata["tokenizer.chat_template"] ?? null) !== c.chat_template)
    errors.push("tokenizer.chat_template differs from the tokenizer's");

  // 2. llama.cpp: tokenization and greedy continuation with each token's probability
  const model = await llama.loadModel({ modelPath: file });
  const toks = Array.from(model.tokenize(c.prompt, true));
  if (model.tokens.shouldPrependBosToken && model.tokens.bos !== null) toks.unshift(model.tokens.bos);
  if (!same(toks, c.prompt_ids)) errors.push(`llama.cpp tokenizes the prompt as [${toks}], ctune as [${c.prompt_ids}]`);
  (c.texts ?? []).forEach((t, i) => {  // as plain text: no BOS, special strings not matched
    const got = Array.from(model.tokenize(t, false));
    if (!same(got, c.texts_ids[i])) errors.push(`llama.cpp tokenizes ${JSON.stringify(t)} as [${got}], ctune as [${c.texts_ids[i]}]`);
  });
  let corpusBad = 0, corpusTokens = 0;
  (c.corpus ?? []).forEach((t, i) => {
    const got = Array.from(model.tokenize(t, true));
    corpusTokens += got.length;
    if (!same(got, c.corpus_ids[i]) && corpusBad++ < 3) {
      let k = 0;
      while (got[k] === c.corpus_ids[i][k]) k++;
      errors.push(`corpus row ${i}: llama.cpp's token ${k} on is [${got.slice(k, k + 6)}], ctune's [${c.corpus_ids[i].slice(k, k + 6)}]`);
    }
  });
  if (corpusBad) errors.push(`${corpusBad} of ${c.corpus.length} corpus rows tokenize otherwise`);
  if (c.chat_text !== undefined) {  // the rendered template: special tokens are matched
    const ct = Array.from(model.tokenize(c.chat_text, true));
    if (model.tokens.shouldPrependBosToken && model.tokens.bos !== null && ct[0] !== model.tokens.bos) ct.unshift(model.tokens.bos);
    if (!same(ct, c.chat_ids)) errors.push(`llama.cpp tokenizes the chat prompt as [${ct}], ctune as [${c.chat_ids}]`);
  }
  const ctx = await model.createContext({ contextSize: 256, threads: 2 });
  const seq = ctx.getSequence();
  const ids = [], logp = [], margin = [];
  const want = c.stopped ? c.ids.slice(0, -1) : c.ids;  // llama.cpp does not yield the stop token
  for await (const o of seq.evaluateWithMetadata(c.prompt_ids, { confidence: true }, { temperature: 0 })) {
    ids.push(o.token);
    logp.push(Math.log(o.confidence));
    // the runner-up has at most 1 - p: a lower bound on the top-2 log margin
    margin.push(Math.log(o.confidence) - Math.log(Math.max(1 - o.confidence, 1e-30)));
    if (ids.length >= c.ids.length) break;
  }
  let agree = 0;
  while (agree < Math.min(ids.length, want.length) && ids[agree] === want[agree]) agree++;
  let maxd = 0;
  for (let i = 0; i < agree; i++) maxd = Math.max(maxd, Math.abs(logp[i] - c.logprobs[i]));
  const minMargin = Math.min(...margin.slice(0, agree));
  if (c.strict) {
    if (!same(ids, want)) strictErrors.push(`llama.cpp continues with [${ids}], bin/sampler with [${want}]`);
    if (maxd > 0.05) strictErrors.push(`log-probabilities differ by up to ${maxd.toFixed(4)}`);
  }
  console.log(`${c.label}: ${agree}/${want.length} greedy tokens agree${c.stopped ? " (then both stop)" : ""}, ` +
    `max |dlogp| ${maxd.toFixed(4)}, top-2 log margin >= ${minMargin.toFixed(2)}; ` +
    `${hf.tensorInfos.length} tensors, ${Object.keys(hf.metadata).length} keys` +
    (c.corpus?.length ? `; corpus: ${c.corpus.length} rows, ${corpusTokens} tokens` : ""));
  for (const e of [...errors, ...strictErrors]) console.log(`  ${c.label}: ${e}`);
  await ctx.dispose();
  await model.dispose();
  return !errors.length && !strictErrors.length;
}
