// Runs a GGUF file in the real llama.cpp (node-llama-cpp's prebuilt CPU build) and prints
// one JSON line: llama.cpp's tokens of each prompt text and its greedy continuation of
// given prompt ids, with the file's metadata that the test compares.
//
//   node tests/gguf_llama.mjs CACHE_DIR FILE.gguf REQUESTS.json
//   REQUESTS.json: {"tokenize": ["text", ...], "generate": [{"ids": [...], "n": 32}, ...]}
//   -> {"tokens": [[...], ...], "generated": [{"ids", "probs", "second"}, ...], "meta": {...}}
//   probs: each generated token's probability; second: the runner-up's (the margin)
// CACHE_DIR is what scripts/llama-cpp-ref.sh prints.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [cache, file, reqFile] = process.argv.slice(2);
const mod = (p) => import(pathToFileURL(path.join(cache, "node_modules", p)).href);
const { getLlama } = await mod("node-llama-cpp/dist/index.js");
const req = JSON.parse(fs.readFileSync(reqFile, "utf8"));

const llama = await getLlama({ gpu: false, logLevel: "error" });
const model = await llama.loadModel({ modelPath: file });
const out = { tokens: [], generated: [], meta: {} };
for (const text of req.tokenize ?? []) out.tokens.push(Array.from(model.tokenize(text, true)));
const ctx = await model.createContext({ contextSize: 256, threads: 2 });
for (const g of req.generate ?? []) {
  const seq = ctx.getSequence();
  const ids = [], probs = [], second = [];
  for await (const o of seq.evaluateWithMetadata(g.ids, { probabilities: true }, { temperature: 0 })) {
    const top = o.probabilities.entries();
    const [t1, p1] = top.next().value, [, p2] = top.next().value ?? [0, 0];
    ids.push(o.token);
    probs.push(o.token === t1 ? p1 : o.probabilities.get(o.token) ?? 0);
    second.push(p2);
    if (ids.length >= g.n) break;
  }
  out.generated.push({ ids, probs, second });
  seq.dispose();
}
const md = model.fileInfo.metadata;
out.meta = {
  architecture: md.general?.architecture,
  bos: model.tokens.bos, eos: model.tokens.eos, add_bos: model.tokens.shouldPrependBosToken,
  chat_template: md.tokenizer?.chat_template ?? null,
  n_vocab: model.fileInfo.metadata.tokenizer?.ggml?.tokens?.length,
};
console.log(JSON.stringify(out));
await ctx.dispose();
await model.dispose();
await llama.dispose();
