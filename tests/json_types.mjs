// JSON files compared by their keys, key order and JSON types, as Python reads them (24
// and 24.0 differ: an int and a float). JSON.parse cannot tell them apart, so this reads
// the text itself.
//   node tests/json_types.mjs same SOURCE SAVED [KEY=CHANGE ...]
//     every key of SOURCE is in SAVED, in SOURCE's order, with SOURCE's JSON type and value;
//     KEY=value: its value may differ (same type); KEY=added: SAVED may add it; KEY=any: both
//   node tests/json_types.mjs types FILE KEY=TYPE ...
//     each KEY (top level, when present and not null: an optional key's None) has TYPE (int,
//     float, string, bool, object, array)
//   node tests/json_types.mjs text FILE KEY TEXT
//     KEY's value is written exactly as TEXT (0.05, not 0.050000000000000003)
// Prints each difference and exits 1 when there is one.
import fs from "node:fs";

// A value: {type, text, keys?: [[key, value]...], items?: [...]}.
function parse(s) {
  let i = 0;
  const ws = () => { while (/\s/.test(s[i])) i++; };
  const str = () => {
    const start = i++;
    while (s[i] !== '"') i += s[i] === "\\" ? 2 : 1;
    i++;
    return JSON.parse(s.slice(start, i));
  };
  const value = () => {
    ws();
    const start = i;
    if (s[i] === "{") {
      i++;
      const keys = [];
      for (ws(); s[i] !== "}"; ws()) {
        if (s[i] === ",") { i++; ws(); }
        const k = str();
        ws(); i++;  // ':'
        keys.push([k, value()]);
      }
      i++;
      return { type: "object", keys, text: s.slice(start, i) };
    }
    if (s[i] === "[") {
      i++;
      const items = [];
      for (ws(); s[i] !== "]"; ws()) {
        if (s[i] === ",") { i++; ws(); }
        items.push(value());
      }
      i++;
      return { type: "array", items, text: s.slice(start, i) };
    }
    if (s[i] === '"') return { type: "string", text: JSON.stringify(str()) };
    const m = /^(true|false|null|-?[0-9][0-9.eE+-]*)/.exec(s.slice(i));
    i += m[0].length;
    const t = m[0] === "true" || m[0] === "false" ? "bool" : m[0] === "null" ? "null" : /[.eE]/.test(m[0]) ? "float" : "int";
    return { type: t, text: m[0] };
  };
  return value();
}

const read = (p) => parse(fs.readFileSync(p, "utf8"));
const get = (o, k) => (o.keys.find(([key]) => key === k) || [])[1];
const bad = [];

// Same structure and types; values too unless `values` is false.
function same(a, b, where, values) {
  if (a.type !== b.type) return bad.push(`${where}: ${a.type} ${a.text} became ${b.type} ${b.text}`);
  if (a.type === "object") {
    const kb = b.keys.map(([k]) => k).filter((k) => a.keys.some(([ka]) => ka === k));
    const ka = a.keys.map(([k]) => k);
    if (ka.join() !== kb.join()) bad.push(`${where}: keys ${ka.join(",")} became ${kb.join(",")}`);
    for (const [k, v] of a.keys) {
      const w = get(b, k);
      if (!w) bad.push(`${where}.${k}: missing`);
      else same(v, w, `${where}.${k}`, values);
    }
  } else if (a.type === "array") {
    if (a.items.length !== b.items.length) bad.push(`${where}: ${a.text} became ${b.text}`);
    else a.items.forEach((v, n) => same(v, b.items[n], `${where}[${n}]`, values));
  } else if (values && (a.type === "float" ? Number(a.text) !== Number(b.text) : a.text !== b.text)) {
    bad.push(`${where}: ${a.text} became ${b.text}`);
  }
}

const [mode, file, ...rest] = process.argv.slice(2);
if (mode === "same") {
  const src = read(file), saved = read(rest[0]);
  const change = Object.fromEntries(rest.slice(1).map((a) => a.split("=")));
  const kept = src;
  same(kept, { type: "object", keys: saved.keys }, "", false);
  for (const [k, v] of kept.keys) if (change[k] !== "value" && change[k] !== "any" && get(saved, k)) same(v, get(saved, k), k, true);
  for (const [k] of saved.keys)
    if (!get(src, k) && change[k] !== "added" && change[k] !== "any") bad.push(`${k}: added`);
} else if (mode === "types") {
  const j = read(file);
  for (const a of rest) {
    const [k, t] = a.split("=");
    const v = get(j, k);
    if (v && v.type !== "null" && v.type !== t) bad.push(`${k}: ${v.type} ${v.text}, want ${t}`);
  }
} else if (mode === "text") {
  const v = get(read(file), rest[0]);
  if (!v || v.text !== rest[1]) bad.push(`${rest[0]}: ${v ? v.text : "missing"}, want ${rest[1]}`);
}
for (const b of bad) console.log(`${file}: ${b}`);
process.exit(bad.length ? 1 : 0);
